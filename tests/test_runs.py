"""Telling runs apart (traces.runs): the parts of one process's file are one run, whatever time
lies between them; processes that start after another ended are another run."""

from dftrace_dynamo.traces import runs

SECOND = 1_700_000_000_000_000  # µs: a whole second


def test_the_parts_of_one_file_are_one_run_across_a_gap_and_a_second_boundary():
    # pid 7's file cut in three parts: the first ends just before a second boundary, the next
    # starts after it with a gap (a loaded machine, a checkpoint save); nothing overlaps
    rows = [(0, SECOND - 900, SECOND - 10, {"hhash": "h"}, 7),
            (1, SECOND + 20, SECOND + 500_000, None, 7),
            (2, SECOND + 2_000_000, SECOND + 2_100_000, None, 7),
            (3, SECOND + 9_000_000, SECOND + 9_100_000, {"hhash": "h"}, 8),  # the script run again
            (4, SECOND + 20_000_000, SECOND + 20_100_000, {"hhash": "h"}, 7)]  # again, its pid reused
    found = runs.find_runs(list(range(5)), rows)
    assert [r["files"] for r in found] == [[0, 1, 2], [3], [4]]
    assert found[0]["start_us"] == SECOND - 900

