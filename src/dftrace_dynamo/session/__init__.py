"""The trace session of one process: configuration (``config``), the trace file and the
user API (``logger``), the hooks the tracer installs into torch and Python (``hooks``),
worker processes (``dataloaders``) and the tracer's own threads (``threads``). Torch-free."""
