project = "dftrace_dynamo"
author = "dftrace_dynamo developers"
extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_mock_imports = ["dftrace_dynamo._core"]
nitpicky = False
