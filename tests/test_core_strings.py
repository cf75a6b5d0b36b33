"""Any string and any number the program gives ends up in a file that the
real Perfetto trace processor and dftracer_validate both read: every event
present, zero error stats, names, categories, arg keys/values and tags as
given (see the escaping rules in docs/format.rst)."""

import json
import math
import sys

from hypothesis import HealthCheck, given, settings, strategies as st

import perfetto_tp
from dftrace_dynamo import _core
from test_core_format import HHASH, closed_core, members, open_trace, read_objects  # noqa: F401 (closed_core: autouse fixture)
from tracefile import dftracer_validate

SPECIAL = ["\\", "\\\\", '"', '\\"', "\x00", "\x01", "\x1f", "\x7f", "\n", "\t", "\ud800", "\udfff", "é", "😀",
           "\u2028", "a", " ", "{", "}", ":", ",", "[", "."]
TEXT = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=12),  # surrogates included
    st.lists(st.sampled_from(SPECIAL), max_size=8).map("".join),  # backslashes, quotes at every position
)
INT = st.one_of(st.integers(), st.sampled_from([2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64 - 1, 2**64, 10**30, -10**30]))
SCALAR = st.one_of(st.none(), st.booleans(), INT, st.floats(allow_nan=True, allow_infinity=True), TEXT)
VALUE = st.recursive(SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=6)
RESERVED = {"hhash", "tag", "grad_enabled", "phase", "failed"}
EVENT = st.tuples(TEXT, TEXT, TEXT.filter(lambda k: clean(k) not in RESERVED), VALUE, SCALAR)


def clean(s):
    """What any reader gets back for a str: unpaired surrogates cannot be encoded."""
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in s)


def expected(v):
    """A value as written (docs/format.rst): ints beyond int64, non-finite and
    subnormal floats become strings, tuples lists, keys strings."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v if -2**63 <= v < 2**63 else str(v)
    if isinstance(v, float):
        return v if math.isfinite(v) and (v == 0 or abs(v) >= sys.float_info.min) else str(v)
    if isinstance(v, str):
        return clean(v)
    if isinstance(v, dict):
        return {clean(str(k)): expected(x) for k, x in v.items()}
    return [expected(x) for x in v]


SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def written(s):
    """The JSON text between the quotes for s (docs/format.rst): short escapes
    for quote, backslash, newline, tab and CR, \\u00XX for other control
    characters and for a backslash that ends the string, the rest as UTF-8."""
    out = [SHORT.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 else ch) for ch in clean(s)]
    if s.endswith("\\"):
        out[-1] = "\\u005c"
    return "".join(out)


def perfetto_text(s):
    """How Perfetto v52 shows a string: it decodes the escapes only in strings
    that hold an escaped quote (and a NUL then ends the text); otherwise it
    shows the text between the quotes as written."""
    return clean(s).split("\x00")[0] if '"' in s else written(s)


def record(tmp, evs, comp=1):
    """Each generated event twice: through a site (with tags) and through log()."""
    path = open_trace(tmp, comp)
    t = 1_763_000_000_000_000_000
    for k, (name, cat, key, value, tag) in enumerate(evs):
        site = _core.intern_site(name, cat, {key: value})
        _core.record(site, t, t + 1000, 0, _core.intern_tags({"tag": tag}))
        _core.log(name, cat, t + 5000, t + 6000, {key: value})
        t += 10_000
    assert _core.close() == {"num_events": 2 * len(evs), "dropped": 0, "path": path}
    return path


def check_json(path, evs):
    objs = [o for o in read_objects(path)[2:-1] if o["ph"] == "X"]  # header, thread_name and end left out
    assert len(objs) == 2 * len(evs)
    for k, (name, cat, key, value, tag) in enumerate(evs):
        for o in objs[2 * k: 2 * k + 2]:
            assert (o["name"], o["cat"]) == (clean(name), clean(cat))
            assert o["args"][clean(key)] == expected(value)
        assert objs[2 * k]["args"]["tag"] == expected(tag)


def check_perfetto(path, evs):
    res = perfetto_tp.query(
        path, perfetto_tp.ERROR_STATS_SQL,
        "select s.ts as ts, s.name as name, s.category as cat, s.arg_set_id as a from slice s order by s.ts",
        "select arg_set_id as a, key, int_value as i, string_value as s, real_value as r from args",
    )
    assert res[0]["rows"] == []
    slices = perfetto_tp.as_dicts(res[1])[1:-1]  # start and end left out
    assert len(slices) == 2 * len(evs)
    args = {}
    for r in perfetto_tp.as_dicts(res[2]):
        args.setdefault(r["a"], {})[r["key"]] = r
    for k, (name, cat, key, value, tag) in enumerate(evs):
        for j, sl in enumerate(slices[2 * k: 2 * k + 2]):
            # Perfetto shows an empty name/cat as these; a text that decodes to "" stays ""
            assert (sl["name"], sl["cat"]) == (perfetto_text(name) if name else "[No name]",
                                               perfetto_text(cat) if cat else None)
            got = args[sl["a"]]
            scalars = [("args." + perfetto_text(key), value)] + ([("args.tag", tag)] if j == 0 else [])
            for akey, v in scalars:
                if isinstance(v, (dict, list)) or v is None:
                    continue
                a = got[akey]
                v = expected(v)
                if isinstance(v, str):
                    assert a["s"] == perfetto_text(v), (akey, v, a)
                elif isinstance(v, float):  # Perfetto reads integral floats as ints, not always exactly
                    assert math.isclose(a["r"] if a["r"] is not None else a["i"], v, rel_tol=1e-12), (akey, v, a)
                else:
                    assert a["i"] == int(v), (akey, v, a)




@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(evs=st.lists(EVENT, min_size=1, max_size=40))
def test_any_string_and_number_loads_everywhere(tmp_path_factory, evs):
    path = record(tmp_path_factory.mktemp("str"), evs)
    check_json(path, evs)
    check_perfetto(path, evs)
    dftracer_validate(path)


def test_megabyte_strings_and_trailing_backslashes(tmp_path):
    big = "x" * (1 << 20)
    evs = [(big + "\\", "cat\\", "k\\", big + '"\\', "t\\"), ("\\", "\\\\", "\\", "\\", "\\\\"),
           ("a\\b", "c", "nested", {"x\\": ["\\", {"y": "\\"}], "n": [2**64, float("nan"), -0.0]}, 2**70),
           ("f", "c", "long", 0.00011926341915623968, -1.2345678901234567e-05),  # >18 digits in full
           ("s", "c", "subnormal", 2.2250738585e-313, -5e-324),  # Perfetto would read 0
           ("n", "c", "smallest normal", 2.2250738585072014e-308, -0.0)]
    path = record(tmp_path, evs)
    check_json(path, evs)
    check_perfetto(path, evs)
    dftracer_validate(path)
    with open(path, "rb") as f:
        raw = b"".join(members(f.read(), 1)).decode()
    assert '"name":"a\\\\b"' in raw and '"cat":"cat\\u005c"' in raw  # only a final backslash as \u005c
