# The C extension lives here because pyproject.toml cannot declare ext_modules.
import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dftrace_dynamo._core",
            sources=sorted(glob.glob("csrc/*.c")),
            include_dirs=["csrc"],
            libraries=["z", "dl", "pthread"],
            # hidden: the hot path reaches the core's globals without a GOT load (PyInit__core is exported)
            extra_compile_args=["-O2", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
