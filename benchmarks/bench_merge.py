"""The serial part of ``summary`` at scale (issue 20 §1): ``summary.merge`` in the calling process
(the step view and the rank view over every rank's every step), timed inside
``summarize(paths, processes=N)`` on rank files such as stepgen's. Its cost grows with ranks ×
steps, not with the events per step: files with few layers measure it as well as large ones.

    python benchmarks/bench_merge.py FILE... [--repeat 3] [--processes 2]

Prints, per run, the whole call and the merge (wall and CPU seconds of this process), with the
load average and the cost of one ``time.perf_counter_ns()`` call.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scale import timer_cost_ns  # noqa: E402

from dftrace_dynamo.traces import summary  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--processes", type=int, default=2, help="processes reading the aggregate records")
    a = ap.parse_args()
    merges, merge = [], summary.merge

    def timed(*args, **kwargs):
        wall, cpu = time.perf_counter_ns(), time.process_time()
        out = merge(*args, **kwargs)
        merges.append(((time.perf_counter_ns() - wall) / 1e9, time.process_time() - cpu))
        return out

    summary.merge = timed
    print(f"{len(a.files)} files; load average before: {os.getloadavg()}; "
          f"perf_counter_ns() {timer_cost_ns():.0f} ns per call")
    for _ in range(a.repeat):
        wall = time.perf_counter_ns()
        summary.summarize(a.files, processes=a.processes)
        wall = (time.perf_counter_ns() - wall) / 1e9
        print(f"summarize {wall:.2f} s, of which the merge {merges[-1][0]:.2f} s (CPU {merges[-1][1]:.2f} s); "
              f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
