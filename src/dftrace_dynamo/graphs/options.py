"""Command-line options shared by ``profile``, ``explore`` and ``graph``.

Only argparse at import time: the CLI imports this to build ``--help``.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["PICTURE_FORMATS", "add_model_arguments", "add_machine_arguments", "add_depth_argument", "parse_quantity", "check_range",
           "load_from_args", "machine_from_args"]

PICTURE_FORMATS = ("dot", "svg", "png", "pdf")  # what ``graph -o`` writes, by file suffix
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtTpP]?)\s*$")
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_quantity(text: str) -> float:
    """``"312T"`` → 3.12e14; plain numbers and K/M/G/T/P suffixes (powers of 1000)."""
    match = _QUANTITY.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number (suffixes K, M, G, T, P allowed)")
    return float(match.group(1)) * _SCALE[match.group(2).lower()]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="transformers model type (bert, gpt2, vit...), a config .json, package.module:Factory or "
                             "file.py:Factory (the current directory is importable), "
                             "or a torchvision model name (needs torchvision). Weights are random; nothing is "
                             "downloaded.")
    group = parser.add_argument_group("model inputs")
    group.add_argument("--config-set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a transformers config value, repeatable (e.g. num_hidden_layers=2)")
    group.add_argument("--input-shape", nargs="+", type=_positive_int, metavar="N",
                       help="shape of the image / tensor input, batch included (e.g. 1 3 224 224)")
    group.add_argument("--seq-len", type=_positive_int, default=128, help="tokens per sequence (default 128)")
    group.add_argument("--batch-size", type=_positive_int, default=1, help="batch size (default 1)")
    group.add_argument("--image-size", type=_positive_int, default=224,
                       help="image side when the model does not say (default 224)")
    group.add_argument("--method", choices=("auto", "fx", "dynamo"), default="auto",
                       help="auto: FX symbolic_trace, Dynamo when it fails (default); fx or dynamo: only that")


def add_machine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machine balance (compute- vs memory-bound)")
    group.add_argument("--peak-flops", type=parse_quantity, metavar="FLOP/S",
                       help="peak FLOP/s of the machine, e.g. 989T (with --mem-bw)")
    group.add_argument("--mem-bw", type=parse_quantity, metavar="BYTES/S",
                       help="memory bandwidth in bytes/s, e.g. 3.35T (with --peak-flops)")
    group.add_argument("--balance", type=parse_quantity, metavar="FLOPS/BYTE",
                       help="machine balance directly (default 10 FLOPs/byte)")


def add_depth_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--depth", type=_positive_int, metavar="N",
                        help=f"{what}: one entry per module N levels deep (encoder.layer.0 is depth 3), "
                             "the ops inside it collapsed")


def check_range(start=None, end=None, around=None, context: int = 5, max_nodes=None) -> None:
    """ValueError when explore's node options conflict; needs no model, so it runs first."""
    for name, value in (("start", start), ("end", end), ("around", around)):
        if value is not None and value < 0:
            raise ValueError(f"--{name} must be >= 0 (nodes are numbered from 0)")
    if max_nodes is not None and max_nodes < 1:
        raise ValueError("--max-nodes must be >= 1")
    if context < 0:
        raise ValueError("--context must be >= 0")
    if around is not None and (start is not None or end is not None):
        raise ValueError("--around cannot be combined with --start/--end")
    if start is not None and end is not None and end < start:
        raise ValueError(f"--end {end} is before --start {start}")


def machine_from_args(args) -> dict:
    """``peak_flops``/``mem_bw``/``balance`` keyword arguments; ValueError when inconsistent."""
    from .balance import machine_balance

    machine_balance(args.peak_flops, args.mem_bw, args.balance)
    return {"peak_flops": args.peak_flops, "mem_bw": args.mem_bw, "balance": args.balance}


def load_from_args(args):
    """(loaded model, args tuple, kwargs dict) built from the model options."""
    from .models import load_model, make_inputs, parse_overrides

    loaded = load_model(args.model, parse_overrides(args.config_set))
    inputs, kwargs = make_inputs(loaded.model, args.input_shape, seq_len=args.seq_len, batch_size=args.batch_size,
                                 image_size=args.image_size)
    return loaded, inputs, kwargs
