"""Machine balance: the FLOPs/byte at which an op stops being memory-bound.

Plain Python (no torch), so the command line checks these options before it
builds a model.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["DEFAULT_BALANCE", "machine_balance"]

# Between memory- and compute-bound, in FLOPs/byte: a round figure between
# CPUs (a few FLOPs/byte) and recent GPUs (a few hundred).
DEFAULT_BALANCE = 10.0


def machine_balance(peak_flops: Optional[float] = None, mem_bw: Optional[float] = None,
                    balance: Optional[float] = None) -> float:
    """FLOPs/byte at which a kernel stops being memory-bound."""
    if balance is not None and (peak_flops or mem_bw):
        raise ValueError("give either the balance or --peak-flops with --mem-bw, not both")
    if (peak_flops is None) != (mem_bw is None):
        raise ValueError("--peak-flops and --mem-bw go together")
    for name, value in (("balance", balance), ("peak FLOP/s", peak_flops), ("memory bandwidth", mem_bw)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive")
    if peak_flops is not None:
        return peak_flops / mem_bw
    return DEFAULT_BALANCE if balance is None else balance
