"""Whether this machine's wall clock was stepped (NTP, a VM resumed after a pause) while a test
script took its ``time.time_ns()`` marks: marks taken across a step are no ground truth to the
µs (the trace follows a step at the writer's next wake), and the test skips, saying so."""
import time

STEP_NS = 100_000  # a move of time.time_ns() - time.monotonic_ns() this large is a step


def offset():
    """time.time_ns() - time.monotonic_ns(), from a bracket no preemption widened."""
    while True:
        m0, r, m1 = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
        if m1 - m0 < 20_000:
            return r - (m0 + m1) // 2


class Watch:
    """Called at each mark; ``steps``: the moves (ns) seen since the last call or reset()."""

    def __init__(self):
        self.steps = []
        self.reset()

    def reset(self):
        """After a step the script made on purpose."""
        self.at = offset()

    def __call__(self):
        now = offset()
        if abs(now - self.at) > STEP_NS:
            self.steps.append(now - self.at)
        self.at = now
