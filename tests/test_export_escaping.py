"""User strings that go into exported graph code (model name, graph-break
reason, input names) stay text: running the exported file executes none of them."""

import ast
import dataclasses
import subprocess
import sys

import torch

from dftrace_dynamo.graphs.capture import capture_graphs
from dftrace_dynamo.graphs.export import export_partition

PAYLOAD = 'm""";open("pwned","w").write("x");"""x.json'


class Tiny(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def test_injection_payloads_are_inert_and_read_back_as_written(tmp_path):
    (part,) = capture_graphs(Tiny(), (torch.randn(2, 3),)).partitions
    reason = "break\nopen('pwned', 'w').write('x')  # \x00 \\"
    inputs = [dataclasses.replace(m, name="x\nopen('pwned','w')") for m in part.inputs]
    part = dataclasses.replace(part, compile_reason=reason, inputs=inputs)
    titles = [PAYLOAD, "a'b\"\"\"c\\", "\"\"\"\n__import__('os').system('touch pwned')\n\"\"\""]
    paths = []
    for n, title in enumerate(titles):
        paths.append(str(export_partition(part, tmp_path / f"g{n}.py", title=title)))
        doc = ast.get_docstring(ast.parse(open(paths[-1]).read()))
        assert doc.startswith(f"Graph partition {part.index} of {title}, exported by dftrace_dynamo")
    run_all = "import runpy, sys\nfor path in sys.argv[1:]:\n    runpy.run_path(path, run_name='__main__')"
    p = subprocess.run([sys.executable, "-c", run_all, *paths], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("(2, 3)") == len(titles)
    assert not (tmp_path / "pwned").exists()
