"""dftrace_dynamo: a torch.compile backend that traces every FX op into DFTracer .pfw files."""

__version__ = "0.1.0"
