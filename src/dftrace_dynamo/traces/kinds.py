"""What every stage of ``summary`` calls things: the kinds of event rows a scan keeps, and the views.

Constants only (no reader, no DuckDB): the lowest stage and the CLI's ``--help`` import it alike.
"""

from ..schema import STEP_STRUCTURE

UNPARSED, OP, GRAPH, COMPILE, PROCESS_NAME, STEP, DATA, BACKWARD, OPTIMIZER, START, EVAL = range(11)
COMM = 11  # collectives (ranks)
# step-structure categories -> kind (the step vocabulary, see docs/design.rst)
STEP_KINDS = dict(zip(STEP_STRUCTURE, (STEP, DATA, BACKWARD, OPTIMIZER)))
# the step parts nested in an optimizer event of their thread (an optimizer closure's forward and
# backward, zero_grad inside it, a compiled optimizer step's graph calls), in parts rows of their own
# kinds, per step of the outermost optimizer event (its nested optimizer events: per their own step)
IN_OPTIMIZER = {GRAPH: 12, BACKWARD: 13, OPTIMIZER: 14}
INFERENCE_IN_OPTIMIZER = 15  # nested graph calls with phase inference (a compiled optimizer step)
MODULE = 16  # eager module slices (module slices outside compiled graphs)
# the time of the eager forward (eager module slices and eager ops of phase forward or
# inference) outside graph calls, data and backward events: outside optimizer events, and inside
EAGER_FORWARD, EAGER_IN_OPTIMIZER = 17, 18
# garbage collection slices; in parts rows: their time outside every other part of the step
GC = 19
# a trainer's loop code slices; in parts rows: their time outside every other part of the step
TRAINER = 20
# The eager forward, as a condition on a scan's table ``ev``: eager module slices and eager ops (no
# graph), of phase forward or inference (the events the C writer's aggregate record copies for it)
EAGER_SQL = (f"(kind = {MODULE} OR (kind = {OP} AND graph = '?' AND extra IS NULL)) "
             "AND phase IN ('forward', 'inference')")
KIND_NAMES = {GRAPH: "graph", DATA: "data", BACKWARD: "backward", OPTIMIZER: "optimizer", OP: "ops",
              IN_OPTIMIZER[GRAPH]: "graph in optimizer", IN_OPTIMIZER[BACKWARD]: "backward in optimizer",
              IN_OPTIMIZER[OPTIMIZER]: "optimizer in optimizer", INFERENCE_IN_OPTIMIZER: "inference in optimizer",
              EAGER_FORWARD: "eager forward", EAGER_IN_OPTIMIZER: "eager forward in optimizer", GC: "gc",
              TRAINER: "trainer"}
# (eager: the eager forward's intervals, kind EAGER_FORWARD in the rank columns of a computed record)
RANK_KINDS = {"step": STEP, "comm": COMM, "op": OP, "data": DATA, "graph": GRAPH, "backward": BACKWARD,
              "optimizer": OPTIMIZER, "eager": EAGER_FORWARD, "gc": GC, "compile": COMPILE, "trainer": TRAINER}
RANK_COLUMNS = ("kind", "file", "name", "pid", "step", "ts", "dur", "extra")  # of ev, in version 1 aggregates

KEYS = ("name", "module", "phase", "graph", "file", "pid")  # all key columns of the op views, in result order
SETS = {  # op view -> the key columns it groups op statistics by
    "op": ("name",),
    "module": ("module",),
    "phase": ("phase",),
    "graph": ("graph", "phase"),
    "process": ("file", "pid"),
}
OP_VIEWS = ("op", "module", "phase", "graph", "process")  # op statistics grouped by a key
ROW_VIEWS = (*OP_VIEWS, "kernel")  # views whose rows are statistics of op (or kernel) events
VIEWS = ("step", *OP_VIEWS, "kernel", "graphs", "rank")
SAMPLE_VIEWS = ("op", "module", "phase")  # views with per-step samples (step_samples=True)
