"""Graph tools: capture, hybrid tracing, FLOPs profile, explorer, drawing, code export.

The public names below are imported on first use, so that importing the
package (the CLI does, for ``--help``) does not import torch.
"""

import importlib

_EXPORTS = {
    "capture_graphs": "capture", "CaptureResult": "capture", "GraphPartition": "capture",
    "GraphBreak": "capture", "InputMeta": "capture",
    "export_partition": "export", "export_capture": "export", "load_exported": "export",
    "partition_source": "export", "ExportError": "export",
    "trace_hybrid": "hybrid", "TracedModel": "hybrid",
    "load_model": "models", "make_inputs": "models", "ModelError": "models",
    "profile_model": "profile", "profile_traced": "profile", "profile_partitions": "profile",
    "machine_balance": "balance", "ModelProfile": "profile", "NodeProfile": "profile",
    "measure_op_times": "timing",
    "render_profile": "report",
    "render_explorer": "explore",
    "write_graph": "draw",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
