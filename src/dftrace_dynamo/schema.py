"""The event vocabulary: every category, argument name and phase the tracer writes.

Producers (``backend``, ``events``, ``session``) and readers (``traces``) import
these names from here, so a trace written by one is read by the other with the
same words; nothing else declares them. Torch-free, like the readers. The C
core writes a few argument names itself (``ARG_GRAD``, ``ARG_PHASE``,
``ARG_STEP``, ``ARG_FAILED``, ``ARG_HHASH``); they are listed here for readers.
"""

# ---- categories (``cat``) ---------------------------------------------------------
CAT_OP = "dynamo"  # one executed FX node
CAT_GRAPH = "dynamo_graph"  # one call of a compiled graph
CAT_COMPILE = "dynamo_compile"  # compiles, graph breaks, recompiles
CAT_MODULE = "module"  # one nn.Module call (module slices)
CAT_KERNEL = "kernel"  # one Inductor kernel call (level="inductor")
CAT_CUDA = "dynamo_cuda"  # device time of a graph or op, from CUDA events
CAT_STEP = "step"  # ``step N`` slices
CAT_DATA = "data"  # a DataLoader ``next()``
CAT_BACKWARD = "backward"  # an outermost autograd backward/grad call
CAT_OPTIMIZER = "optimizer"  # an optimizer's ``step()`` or ``zero_grad()``, or work for it (gradient clipping)
CAT_DFTRACER = "dftracer"  # the ``start`` and ``end`` records
AGGREGATES_RECORD = "dftrace_aggregates"  # name of the metadata record of per-file aggregates
CAT_EVAL = "eval"  # forward work outside training (grad disabled after a complete step)
CAT_COMM = "comm"  # one collective or point-to-point operation (torch.distributed, DDP buckets)
CAT_MEMORY = "memory"  # memory counter samples ("ph": "C")
CAT_GC = "gc"  # one collection of Python's cyclic garbage collector
CAT_TRAINER = "trainer"  # a call of a trainer's own loop code (Lightning's actions, Trainer methods)

CATEGORIES = (CAT_OP, CAT_GRAPH, CAT_COMPILE, CAT_MODULE, CAT_KERNEL, CAT_CUDA, CAT_STEP, CAT_DATA,
              CAT_BACKWARD, CAT_OPTIMIZER, CAT_DFTRACER, CAT_EVAL, CAT_COMM, CAT_MEMORY, CAT_GC, CAT_TRAINER)
# the step structure: the categories that split a step's wall time
STEP_STRUCTURE = (CAT_STEP, CAT_DATA, CAT_BACKWARD, CAT_OPTIMIZER)

# ---- argument names (``args``) ----------------------------------------------------
ARG_STEP = "step"
ARG_PHASE = "phase"
ARG_GRAD = "grad_enabled"
ARG_FAILED = "failed"
ARG_HHASH = "hhash"
ARG_GRAPH = "graph"
ARG_NODE = "node"
ARG_MODULE = "module"
ARG_MODULE_TYPE = "module_type"
ARG_LEVEL = "level"
ARG_OPTIMIZER = "optimizer"
ARG_KERNEL_TYPE = "kernel_type"
ARG_ATEN_OPS = "aten_ops"
ARG_RUN_ID = "run_id"
ARG_RECOMPUTE = "recompute"  # true on ops that activation checkpointing runs again in backward
# compile events
ARG_KIND = "kind"
ARG_REASON = "reason"
ARG_LOCATION = "location"
ARG_FRAME = "frame"
ARG_COMPILE_ID = "compile_id"
# comm events: the operation, its payload and its process group
ARG_OP = "op"  # all_reduce, broadcast, send, ... (the event name says the same)
ARG_BYTES = "bytes"  # payload of this rank (its input tensors; all_gather: its own part); see also below
ARG_DTYPE = "dtype"
ARG_GROUP = "group"  # the process group's name (same on every member)
ARG_GROUP_SIZE = "group_size"
ARG_RANK = "rank"  # this process's rank in the default group
ARG_PEER = "peer"  # send/recv: the global rank sent to or received from
ARG_ASYNC = "async_op"  # issued with async_op=True: the event ends when the work completed
# the time a rank was blocked in ``wait()`` on an async operation's work: a comm event named
# this prefix + the operation's name, args op (the operation's name), group, rank
COMM_WAIT_PREFIX = "wait "
ARG_BUCKET = "bucket"  # DDP gradient bucket index
# the ``clock`` record (cat ``dftracer``): this process's clock minus rank 0's, measured when the
# process group was set up, and the bound on that measurement's error (both ns)
ARG_CLOCK_OFFSET = "clock_offset_ns"
ARG_CLOCK_ERROR = "clock_error_ns"
# memory: on step slices, and the counter tracks
ARG_PEAK_RSS = "peak_rss"  # bytes: the process's peak resident memory during the step
ARG_CUDA_PEAK = "cuda_max_allocated"  # bytes: torch.cuda.max_memory_allocated during the step
ARG_RSS = "rss"  # bytes: resident memory at the sample (counter track)
# gc slices: the generation collected (0-2), the objects it freed, those it found but could not free
ARG_GENERATION = "generation"
ARG_COLLECTED = "collected"
ARG_UNCOLLECTABLE = "uncollectable"

# DFTRACER_INC_METADATA=1: static facts about an op (and, FLOPs and bytes summed, a kernel)
ARG_OP_TYPE = "op_type"  # the FX node's op (call_function, call_method, call_module)
ARG_TARGET = "target"  # what it calls: the op's overload name, a method or a submodule
ARG_INPUT_SHAPES = "input_shapes"
ARG_INPUT_DTYPES = "input_dtypes"
ARG_OUTPUT_SHAPES = "output_shapes"
ARG_OUTPUT_DTYPES = "output_dtypes"
ARG_SOURCE = "source"  # the user's line that produced the op (file:line)
ARG_FLOPS = "flops"
# ARG_BYTES too: bytes read and written (every input read once, every output written once)
METADATA_ARGS = (ARG_OP_TYPE, ARG_TARGET, ARG_INPUT_SHAPES, ARG_INPUT_DTYPES, ARG_OUTPUT_SHAPES, ARG_OUTPUT_DTYPES,
                 ARG_MODULE_TYPE, ARG_SOURCE, ARG_FLOPS, ARG_BYTES)

# ---- phases (``args.phase``) ------------------------------------------------------
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_INFERENCE = "inference"
PHASE_OPTIMIZER = "optimizer"  # eager ops only: inside an optimizer's step() or optimizer-side slice
PHASES = (PHASE_FORWARD, PHASE_BACKWARD, PHASE_INFERENCE, PHASE_OPTIMIZER)
# not written in args.phase: readers (summary --by phase) give it to the ops with ARG_RECOMPUTE
PHASE_RECOMPUTE = "recompute"

# ---- compile event kinds (``args.kind`` of ``CAT_COMPILE``) -------------------------
COMPILE_KINDS = ("compile", "graph_break", "recompile", "backend", "instrument")

# ---- the parts of a step's wall time (summary's step view) ---------------------------
# gc: garbage collection outside the other four (a collection during an op is that op's phase);
# trainer: a trainer's own loop code outside all of those
STEP_PARTS = ("data", "forward", "backward", "optimizer", "gc", "trainer", "other")
