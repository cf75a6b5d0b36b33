"""Readable names for FX / Dynamo nodes and modules.

Two functions, :func:`abbreviate` and :func:`user_path` (Dynamo's internal
components dropped), used by the trace event names, the profile table and the
graph explorer, so the same module gets the same name everywhere.

Dynamo spells module paths in three ways depending on the torch version and on
where the name comes from; all map to the dotted path that FX
``symbolic_trace`` uses as ``call_module`` target (``layer1.0.conv1``):

* source style (``nn_module_stack`` values, guards):
  ``L['self'].layer1[0].conv1``, ``L['self']._modules['layer1']._modules['0']``
* mangled, torch >= 2.3 (placeholder / node names):
  ``l_self_modules_layer1_modules_0_modules_conv1_parameters_weight_``
* mangled, older torch:
  ``L__self___layer1_0_conv1``, ``getattr_getattr_L__m___model_23_cv3_0___0_____0___conv``

Rules: strip the ``getattr_`` / ``L__<root>__`` / ``g__<root>__``
prefixes, ``_<digits>_`` becomes ``.<digits>.``, a number right after a
``___`` separator is a subscript ``[N]``, and names longer than ``max_len``
are cut in the middle (``start...end``). Only the mangling is undone: a real
path with a repeated component (``embedder.embedder.convolution``) is kept.
"""

from __future__ import annotations

import re

__all__ = ["abbreviate", "user_path", "DEFAULT_MAX_LEN", "ELLIPSIS"]

DEFAULT_MAX_LEN = 48
ELLIPSIS = "..."

# Source style: a root such as L['self'] / G['model'], then accessors.
_SOURCE_ROOT = re.compile(r"""^[LG]\[(['"])(?P<root>[^'"]+)\1\]""")
_SOURCE_CONTAINER = re.compile(r"""\._(?:modules|parameters|buffers)\[(['"])(?P<key>[^'"]*)\1\]""")
_SOURCE_KEY = re.compile(r"""\[(['"])(?P<key>[^'"]*)\1\]""")
_SOURCE_INDEX = re.compile(r"\[(?P<idx>-?\d+)\]")

_GETATTR = re.compile(r"^(?:getattr_)+")
# torch >= 2.3: l_<root>_modules_<name>_..._parameters_<name>_
_NEW_STYLE = re.compile(r"^[lLgG]_(?P<root>[A-Za-z0-9_]+?)_(?P<rest>(?:modules|parameters|buffers)_.*)$")
_NEW_SEP = re.compile(r"_(?:modules|parameters|buffers)_")
# older torch: L__<root>__ followed by _<attr>; the root itself may contain '_'.
# A bare input placeholder: l_x_ is L['x'].
_NEW_LEAF = re.compile(r"^[lLgG]_(?P<root>[A-Za-z0-9_]+?)_$")
_OLD_STYLE = re.compile(r"^[lLgG]__(?P<root>[A-Za-z0-9_]+?)__(?P<rest>_.*)?$")
_MULTI_SEP = re.compile(r"_{3,}")
# Dynamo-internal path components: a torch.compile'd submodule's OptimizedModule holds the user's
# module as _orig_mod, a resume function's locals hold modules as ___stack0..., old-style mangled
# roots (L__self__), and a compiled bound method (Lightning's forward) is reached as
# <method>._torchdynamo_inline.__self__
_INTERNAL = re.compile(r"^(?:_orig_mod|_torchdynamo_inline|__self__|_{3}stack\d+|[LG]__\w+__)$")


def abbreviate(name: str, max_len: int | None = DEFAULT_MAX_LEN) -> str:
    """Return the readable form of ``name``, at most ``max_len`` characters.

    ``max_len=None`` never truncates (trace event names keep the full path).
    Names that are already plain (``layer1.0.conv1``, ``add_1``) are kept.
    """
    text = str(name)
    if _SOURCE_ROOT.match(text):
        text = _from_source(text)
    else:
        text = _from_mangled(text)
    return truncate(text, max_len)


def user_path(path: str) -> str:
    """A dotted module ``path`` without Dynamo-internal components
    (``forward._torchdynamo_inline.__self__.head`` is ``head``: the module the method is bound to)."""
    parts: list[str] = []
    for part in path.split("."):
        if part == "__self__" and parts[-1:] == ["_torchdynamo_inline"]:
            del parts[-2:]
        else:
            parts.append(part)
    return ".".join(part for part in parts if part and not _INTERNAL.match(part))


def truncate(text: str, max_len: int | None) -> str:
    """Cut ``text`` in the middle so it fits ``max_len`` (keeps both ends)."""
    if max_len is None or len(text) <= max_len:
        return text
    if max_len <= len(ELLIPSIS):
        return text[:max_len]
    keep = max_len - len(ELLIPSIS)
    # The tail gets the extra character: the leaf (conv1, weight) says most.
    head = keep // 2
    tail = keep - head
    return text[:head] + ELLIPSIS + text[-tail:]


def _from_source(text: str) -> str:
    match = _SOURCE_ROOT.match(text)
    root, rest = match.group("root"), text[match.end():]
    rest = _SOURCE_CONTAINER.sub(lambda m: "." + m.group("key"), rest)
    rest = _SOURCE_KEY.sub(lambda m: "." + m.group("key"), rest)
    # Module containers are indexed with [i] in source but are ".i" in FX paths.
    rest = _SOURCE_INDEX.sub(lambda m: "." + m.group("idx"), rest)
    rest = rest.lstrip(".")
    # The root is the model variable (self, fn, model) unless nothing follows it.
    return rest or root


def _from_mangled(text: str) -> str:
    body = _GETATTR.sub("", text)
    new = _NEW_STYLE.match(body)
    if new:
        rest = new.group("rest").rstrip("_")
        rest = re.sub(r"^(?:modules|parameters|buffers)_", "", rest)
        return _NEW_SEP.sub(".", rest)
    leaf = _NEW_LEAF.match(body)
    if leaf and not body.startswith(("l__", "L__", "g__", "G__")):
        # L['kwargs']['input_ids'] is mangled to l_kwargs_input_ids_
        return re.sub(r"^kwargs_", "", leaf.group("root"))
    old = _OLD_STYLE.match(body)
    if old:
        rest = (old.group("rest") or "").lstrip("_")
        return _dotted(rest) if rest else old.group("root")
    if body != text:
        # getattr_ chain on something that is not an L/G root: still mangled.
        return _dotted(body)
    return text


def _dotted(body: str) -> str:
    """Old mangling: ``___`` separates accesses, ``_N_`` inside a part is ``.N``."""
    out = []
    for i, part in enumerate(_MULTI_SEP.split(body)):
        if not part:
            continue
        if part.isdigit() and i > 0:
            out.append(f"[{part}]")
            continue
        piece = _join_tokens(part.split("_"))
        out.append(piece if not out else "." + piece)
    return "".join(out)


def _join_tokens(tokens: list[str]) -> str:
    """Rejoin ``_``-split tokens; a numeric token is an index (``.N``)."""
    text = tokens[0]
    for prev, token in zip(tokens, tokens[1:]):
        text += ("." if token.isdigit() or prev.isdigit() else "_") + token
    return text

