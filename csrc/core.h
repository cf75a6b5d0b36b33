/* Shared declarations of dftrace_dynamo._core.
 *
 * Layout: module.c (Python API, interning, file lifecycle), callwrap.c
 * (Interceptor, GraphCall), ring.c (per-thread rings, fork), writer.c (writer
 * thread, placement, event lines), json.c (escaping, number formatting),
 * sink.c (plain / gzip members / zstd frames), clock.c (event clock), span.c
 * (module spans), steps.c (current step, step slices, step windows), flight.c
 * (flight recorder: members kept in memory, dumps).
 */
#ifndef DFT_CORE_H
#define DFT_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define DFT_LIKELY(x) __builtin_expect(!!(x), 1)
#define DFT_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Flag bits (module constants). FLAG_NOCTX is internal: log() events carry no
 * graph context, so grad_enabled/phase are not printed for them. */
#define DFT_FLAG_GRAD 1u
#define DFT_PHASE_SHIFT 1
#define DFT_PHASE_MASK (7u << DFT_PHASE_SHIFT)
#define DFT_FLAG_FAILED 1024u
#define DFT_FLAG_NOCTX 16u
#define DFT_FLAG_TIMED 32u /* times given by the caller (log_event): a "logged" track, see writer.c */
/* Internal: STEP marks a step slice (its name is formatted from its step);
 * NOSTEP an event whose own args hold "step" (log() with a step arg). */
#define DFT_FLAG_STEP 64u
#define DFT_FLAG_NOSTEP 128u
#define DFT_FLAG_COUNTER 256u /* a counter sample ("ph":"C", steps.c counter()): not placed */
#define DFT_FLAG_TICKS 512u   /* start and end are TSC ticks (dft_tick): the writer converts them */
/* the bits a caller of record() may set; the others are the writer's own */
#define DFT_FLAGS_PUBLIC (DFT_FLAG_GRAD | DFT_PHASE_MASK | DFT_FLAG_FAILED)
/* OPTIMIZER: eager ops inside an optimizer's step() or an optimizer-side slice (never a graph's) */
enum { DFT_PHASE_NONE, DFT_PHASE_FORWARD, DFT_PHASE_BACKWARD, DFT_PHASE_INFERENCE, DFT_PHASE_OPTIMIZER };

/* ---- growable byte buffer ---------------------------------------------- */
typedef struct {
    char *p;
    size_t len, cap;
} dft_buf;

int dft_buf_grow(dft_buf *b, size_t extra); /* 0 ok, -1 ENOMEM */
static inline int dft_buf_reserve(dft_buf *b, size_t extra) {
    return DFT_LIKELY(b->cap - b->len >= extra) ? 0 : dft_buf_grow(b, extra);
}
static inline void dft_buf_put(dft_buf *b, const char *s, size_t n) { /* after reserve */
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
void dft_buf_free(dft_buf *b);

/* ---- JSON (json.c) ------------------------------------------------------- */
/* Python -> JSON text; need the GIL. Return 0, or -1 with a Python error. */
int dft_json_str(dft_buf *b, PyObject *s);      /* "escaped" */
int dft_json_fields(dft_buf *b, PyObject *d);   /* ,"k":v for each item */
int dft_json_namecat(dft_buf *b, PyObject *name, PyObject *cat); /* ,"name":..,"cat":.. */
/* Arg values written in another form (see json.c), counted per kind. */
#define DFT_ARGS_DEPTH 16 /* nested lists/dicts inside an args dict that are written */
/* Every line must stay under the 16 MiB a reader takes (traces/reader.py MAX_LINE): a name,
 * category, key or string value is cut at DFT_VALUE_MAX bytes of JSON text, and an event's args
 * stop once they pass DFT_ARGS_MAX, each with a marker saying what was cut. */
#define DFT_VALUE_MAX (2u << 20)
#define DFT_ARGS_MAX (6u << 20)
enum { DFT_ARG_DEEP, DFT_ARG_CYCLE, DFT_ARG_UNPRINTABLE, DFT_ARG_CUT, DFT_ARG_KINDS };
extern uint64_t dft_arg_issues[DFT_ARG_KINDS];
/* Plain C, no GIL. Each returns the text's end and may store up to
 * DFT_FMT_MAX bytes from p, past that end too (whole 8-byte words). */
#define DFT_FMT_MAX 24
char *dft_fmt_u64(char *p, uint64_t v);         /* decimal */
char *dft_fmt_i64(char *p, int64_t v);
char *dft_fmt_us(char *p, uint64_t ns);         /* ns as µs with <= 3 decimals */

/* Decimal digits by SWAR: the 8 digits of v < 10^8, one per byte of a 64-bit
 * word, the most significant in the lowest byte (the first in memory: x86-64
 * and AArch64 are little-endian). Two 4-digit halves, each split into two
 * 2-digit quarters, each into two digits, every lane at once; the divisions
 * by 100 and 10 are multiplications by 10486 / 2^20 and 103 / 2^10, exact
 * below 10^4 and 10^2 (~25 instructions for 8 digits; dividing by 100 a
 * pair at a time took ~15 per pair). */
static inline uint64_t dft_digits8(uint32_t v) {
    uint64_t x = v / 10000 | (uint64_t)(v % 10000) << 32;
    uint64_t h = (x * 10486 >> 20) & 0x0000007f0000007full;
    x = (x - h * 100) << 16 | h;
    uint64_t t = (x * 103 >> 10) & 0x000f000f000f000full;
    return (x - t * 10) << 8 | t;
}
#define DFT_ASCII0 0x3030303030303030ull
/* The first n (1..8) digits of d without leading zeros (one digit at least);
 * stores 8 bytes, returns the text's end. */
static inline char *dft_put_digits(char *p, uint64_t d, unsigned n) {
    unsigned lz = (unsigned)__builtin_ctzll(d | 1ull << (8 * n - 8)) >> 3;
    uint64_t a = (d + DFT_ASCII0) >> (8 * lz);
    memcpy(p, &a, 8);
    return p + n - lz;
}
static inline char *dft_put8(char *p, uint64_t d) { /* all 8 digits of d */
    d += DFT_ASCII0;
    memcpy(p, &d, 8);
    return p + 8;
}

/* ---- interned strings (module.c) --------------------------------------- */
typedef struct {
    const char *p;
    uint32_t len;
} dft_str;

typedef struct {
    dft_str namecat; /* ,"name":"..","cat":".." */
    dft_str args;    /* ,"k":v... (may be empty) */
} dft_site;

/* Chunked tables: entries never move, so the writer reads them without the
 * GIL; count is published with release after the entry is complete. */
#define DFT_TAB_BITS 10
#define DFT_TAB_CHUNK (1u << DFT_TAB_BITS)
#define DFT_TAB_MAXCHUNKS 4096
typedef struct {
    _Atomic(void *) chunks[DFT_TAB_MAXCHUNKS];
    _Atomic uint32_t count;
    size_t esize;
} dft_table;

extern dft_table dft_sites, dft_tags;
/* Tags owned by TagCells (module.c, under the GIL): freed once released and
 * written; dft_pass_begun/done count the writer's passes over all rings. */
extern _Atomic uint64_t dft_pass_begun, dft_pass_done;
int64_t dft_tags_own(PyObject *args, uint32_t cur);
void dft_tags_hold(uint32_t id);
void dft_tags_release(uint32_t id);
int dft_tags_usable(uint64_t id);
/* The owned text of a site-0 record (log, step_slice, counter; writer.c
 * emit_event): namecat \0 args \0, namecat empty when name is NULL. NULL:
 * Python error. */
char *dft_extra_text(PyObject *name, PyObject *cat, PyObject *args);
static inline void *dft_tab_get(dft_table *t, uint32_t i) {
    char *c = atomic_load_explicit(&t->chunks[i >> DFT_TAB_BITS], memory_order_acquire);
    return c + (size_t)(i & (DFT_TAB_CHUNK - 1)) * t->esize;
}

/* ---- events and rings (ring.c) ----------------------------------------- */
typedef struct {
    uint64_t start, end; /* ns on the epoch timeline */
    uint32_t site, tags;
    uint32_t flags;
    uint32_t step; /* current step + 1 when recorded, 0: none (steps.c) */
    char *extra; /* owned text of a site-0 record (dft_extra_text), or NULL */
} dft_rec;

/* Placement stack entry: a completed subtree (measured start, display
 * start/end) or, once the stack is at DFT_PLACE_MAX, a run of adjacent old
 * ones merged (ms: measured start of its first). */
#define DFT_PLACE_MAX (1u << 16)
typedef struct {
    uint64_t ms, ds, de;
} dft_place_ent;

typedef struct dft_ring {
    /* producer side (its pushes read the copies in dft_tls) */
    _Atomic uint64_t head;
    dft_rec *buf;
    uint64_t mask, cap, half; /* cap <= RING_MAX */
    char _pad1[64];
    /* writer side */
    _Atomic uint64_t tail;
    _Atomic int dead; /* owning thread exited */
    uint32_t tid;
    char pidtid[64]; /* ,"pid":P,"tid":T of its own track (place_gen; DFT_FMT_MAX room) */
    uint32_t pidtid_len;
    char *name_json; /* "escaped thread name" */
    uint32_t name_len;
    uint64_t named_gen; /* file generation whose thread_name is written */
    uint64_t place_gen;
    dft_place_ent *place; /* circular, grows by doubling up to DFT_PLACE_MAX */
    uint32_t place_cap, place_top, place_n;
    struct dft_lane *lanes; /* tracks of this thread's timed events (place_gen) */
    uint32_t n_lanes;
    size_t bytes;
    struct dft_ring *_Atomic next;
} dft_ring;

/* One cache line per thread: what a push reads (the ring's buffer, head and the producer's
 * view of the tail, copied from the ring so that the push reads no line of the ring's own)
 * and the graph context. Between two pushes the op itself evicts the L1 cache: each line
 * a push reads is a miss on its critical path. */
typedef struct {
    dft_ring *ring;
    dft_rec *buf;              /* ring->buf (NULL: no ring yet) */
    uint64_t head, tail_cache; /* head: == ring->head, which only this thread writes */
    uint32_t mask, half;       /* ring->mask, ring->half (0 with no ring: pushes take the slow path) */
    uint32_t ctx; /* grad/phase bits of the innermost GraphCall */
    uint32_t open_n, open_cap; /* module slices open in graphs (span.c): depth, room */
    uint32_t eager; /* eager.c: 0 torch's ops not observed on this thread, 1 observed, 1 + n inside n GraphCalls */
    uint64_t *open; /* their starts, innermost last (0: opened while nothing was recorded) */
} __attribute__((aligned(64))) dft_tls_t;
extern _Thread_local dft_tls_t dft_tls __attribute__((tls_model("initial-exec")));

/* The event clock's model (clock.c): ns = base + tick * mult / 2^32 (mult: ns per tick, 32.32). */
typedef struct {
    int64_t base;
    uint64_t mult;
} dft_tsc_seg;

/* What every recorded op reads of the process's state, in one cache line (see dft_tls_t).
 *
 * state: DFT_ST_OPEN while a file is open and recording (open() to close() or a write
 * error), DFT_ST_OPS_OFF outside the step windows (steps.c); op-level events are recorded
 * when it is exactly DFT_ST_OPEN, one load and one branch. Bits are set and cleared with
 * atomic or/and (the writer thread clears OPEN).
 * step_tag: current step + 1 (0: none), copied into every record; read and written with
 * the GIL held (every push holds it).
 * seq, seg: the event clock (clock.c). The writer publishes a model into seg[(seq + 1) & 1],
 * then increments seq; a reader takes seg[seq & 1] and reads again if seq moved meanwhile
 * (it never waits for the writer). seq 0: no model yet, events read the monotonic clock.
 * ticks: DFT_FLAG_TICKS where the kernel trusts the TSC (set at import), else 0. */
typedef struct {
    _Atomic int state;
    uint32_t step_tag;
    _Atomic uint64_t seq;
    uint32_t ticks;
    dft_tsc_seg seg[2];
} __attribute__((aligned(64))) dft_hot_t;
_Static_assert(sizeof(dft_hot_t) == 64, "dft_hot_t: one cache line");
extern dft_hot_t dft_hot;

#define DFT_ST_OPEN 1
#define DFT_ST_OPS_OFF 2
static inline int dft_is_open(void) {
    return atomic_load_explicit(&dft_hot.state, memory_order_relaxed) & DFT_ST_OPEN;
}

/* ---- steps (steps.c) ---------------------------------------------------- */
/* Whether op-level events (interceptors, graph calls, spans) are recorded now:
 * a file is open and the current step is inside the step windows. */
static inline int dft_ops_recording(void) {
    return atomic_load_explicit(&dft_hot.state, memory_order_relaxed) == DFT_ST_OPEN;
}
/* GraphCalls call their probe (step tracking outside a training step); GIL held. */
extern int dft_probe_on;
extern PyMethodDef dft_step_methods[];
extern PyMethodDef dft_eager_methods[]; /* eager.c */
/* torch's at::enableRecordFunction (eager.c): a GraphCall turns torch's op observers off on
 * its thread while it runs, so a compiled graph's ops pay nothing for eager-op events. */
extern void (*dft_rf_enable)(_Bool);
static inline void dft_eager_pause(void) {
    if (dft_tls.eager++ == 1)
        dft_rf_enable(0);
}
static inline void dft_eager_resume(void) {
    if (dft_tls.eager > 1 && --dft_tls.eager == 1)
        dft_rf_enable(1);
}

/* Makes the calling thread's ring now if it has none (0; -1: out of memory). */
int dft_ring_attach(void);
int dft_push_slow(uint32_t site, uint64_t s, uint64_t e, uint32_t flags, uint32_t tags,
                  char *extra);

/* Writes the calling thread's next record and publishes it to the writer (room checked). */
static inline int dft_ring_put(uint32_t site, uint64_t s, uint64_t e, uint32_t flags, uint32_t tags, char *extra) {
    uint64_t h = dft_tls.head;
    dft_rec *x = &dft_tls.buf[h & dft_tls.mask];
    x->start = s;
    x->end = e;
    x->site = site;
    x->tags = tags;
    x->flags = flags;
    x->step = dft_hot.step_tag;
    x->extra = extra;
    dft_tls.head = h + 1;
    atomic_store_explicit(&dft_tls.ring->head, h + 1, memory_order_release);
    return 0;
}

/* Append one event to the calling thread's ring. Needs the GIL (which also
 * serialises against close()). Returns 0 when recorded; otherwise the caller
 * still owns extra. */
static inline int dft_push(uint32_t site, uint64_t s, uint64_t e, uint32_t flags, uint32_t tags,
                           char *extra) {
    if (!dft_is_open())
        return -1;
    if (DFT_UNLIKELY(dft_tls.head - dft_tls.tail_cache >= dft_tls.half)) /* half 0: no ring yet */
        return dft_push_slow(site, s, e, flags, tags, extra);
    return dft_ring_put(site, s, e, flags, tags, extra);
}

extern pthread_mutex_t dft_list_mu;
extern dft_ring *_Atomic dft_rings;
void dft_ring_init_once(void);
void dft_ring_set_budget(size_t bytes);
void dft_ring_retire(dft_ring *r); /* count an unlinked ring's records, free it; under dft_list_mu */
void dft_rings_reset(void);
uint64_t dft_rings_counts(uint64_t *pushed, uint64_t *pending);

/* ---- clock (clock.c) --------------------------------------------------- */
extern int64_t dft_epoch_off;
static inline uint64_t dft_mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
void dft_clock_init(void);
/* exact: re-anchor on the monotonic clock (open()); else steer smoothly (writer). */
void dft_clock_update(int exact);
/* re-measure the epoch offset, following a wall clock stepped forward (the writer's wakes and
 * open() do; the TSC model follows at the writer's next wake) */
void dft_clock_follow_wall(void);
void dft_clock_fork_prepare(void); /* ring.c's atfork handlers */
void dft_clock_fork_parent(void);
void dft_clock_fork_child(void);

#if defined(__x86_64__) || defined(__i386__)
#define DFT_HAVE_TSC 1
#include <x86intrin.h>
static inline int64_t dft_tsc_to_ns(int64_t base, uint64_t mult, uint64_t tick) {
    return base + (int64_t)(uint64_t)(((unsigned __int128)tick * mult) >> 32);
}
#else
#define DFT_HAVE_TSC 0
#endif

static inline uint64_t dft_now(void) {
#if DFT_HAVE_TSC
    uint64_t seq = atomic_load_explicit(&dft_hot.seq, memory_order_acquire);
    if (DFT_LIKELY(seq)) {
        uint64_t tick = __rdtsc();
        for (;;) {
            const dft_tsc_seg *g = &dft_hot.seg[seq & 1];
            int64_t base = __atomic_load_n(&g->base, __ATOMIC_RELAXED);
            uint64_t mult = __atomic_load_n(&g->mult, __ATOMIC_RELAXED);
            atomic_thread_fence(memory_order_acquire);
            uint64_t again = atomic_load_explicit(&dft_hot.seq, memory_order_relaxed);
            if (DFT_LIKELY(again == seq))
                return (uint64_t)dft_tsc_to_ns(base, mult, tick);
            seq = again;
        }
    }
#endif
    return dft_mono() + (uint64_t)__atomic_load_n(&dft_epoch_off, __ATOMIC_RELAXED);
}

/* The times of op-level events (interceptors, graph calls, module-slice boundaries): with
 * dft_hot.ticks, raw TSC ticks, which their records carry with DFT_FLAG_TICKS and the writer
 * converts on the model in effect at each tick (dft_clock_ns); else dft_now(). No time is
 * taken while no file is open, and open() makes sure the model exists. */
static inline uint64_t dft_tick(void) {
#if DFT_HAVE_TSC
    if (DFT_LIKELY(dft_hot.ticks))
        return __rdtsc();
#endif
    return dft_now();
}
/* ns on the epoch timeline of an event's start and end ticks, read while a file was open;
 * writer thread only. */
void dft_clock_ns(uint64_t *start, uint64_t *end);
/* The ns dft_clock_ns gives a tick read while a file was open (the model in effect at it), on
 * any thread: what Python compares with the events' times. */
uint64_t dft_clock_tick_ns(uint64_t tick);

/* ---- output sink (sink.c) ---------------------------------------------- */
#include <zlib.h>
typedef struct {
    int fd, mode, err; /* err: errno of the first failed write */
    int cut_err;       /* errno of a failed dft_sink_cut */
    uint64_t good;     /* file size up to the end of the last whole member */
    uint32_t crc;      /* CRC-32 of those good bytes (the aggregate records cite it) */
    size_t kept;       /* after a failed write: bytes of it kept (plain text: whole lines) */
    void *dfl;         /* gzip: the own encoder's state (deflate.c) */
    void *ld;          /* libdeflate compressor, when loaded */
    z_stream z;        /* zlib fallback for gzip */
    int z_init;
    void *zc;          /* ZSTD_CCtx */
    dft_buf out;
} dft_sink;

int dft_sink_init(dft_sink *k, int mode, char *err, size_t errlen);
int dft_sink_write(dft_sink *k, const char *p, size_t n); /* one whole member/frame; -1: k->err, k->kept */
void dft_sink_cut(dft_sink *k);
int dft_sink_compress(dft_sink *k, const char *p, size_t n); /* into k->out (not plain text); -1: ENOMEM */
int dft_sink_deleted(const dft_sink *k); /* the file (or its directory) was deleted */
void dft_sink_free(dft_sink *k);
PyObject *dft_py_gzip_members(PyObject *m, PyObject *args);

/* ---- writer (writer.c) ------------------------------------------------- */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv_wake, cv_space, cv_done;
    _Atomic int kick;    /* a ring passed half full */
    _Atomic int waiters; /* producers waiting for space */
    _Atomic uint64_t ring_waits; /* times a producer found its ring full (stats) */
    _Atomic uint64_t ring_kicks; /* pushes that found their ring past half full and woke the writer (stats) */
    int stop;
    uint64_t flush_req, flush_done;
    int running;
    int closing; /* close() waits for the writer with the GIL released */
    pthread_t thread;
    uint64_t pushed_base; /* records pushed before the current file (stats) */

    dft_sink sink;
    dft_buf fmt;
    size_t hold; /* bytes of fmt not worth a member alone (a lone '[') */
    uint64_t gen;            /* file generation, bumps per open() */
    uint64_t next_id;
    uint64_t written;        /* X events written (end excluded) */
    uint64_t member_events;  /* of them, in the member being built */
    _Atomic uint64_t dropped;
    uint64_t last_member_ns; /* monotonic */
    char pid_s[24];
    uint32_t pid_len;
    uint64_t ts_hi;   /* an event's ts (µs) / 10^8, formatted in ts_hi_s (its first digits) */
    char ts_hi_s[8];
    uint32_t ts_hi_len;
    uint32_t step_tag; /* a record's step + 1 whose step is formatted in step_s (0: none) */
    uint32_t step_len;
    char step_s[DFT_FMT_MAX];
    char *hhash_json; /* "escaped hhash" */
    uint32_t hhash_len;
    uint32_t end_tid;
    uint64_t end_ts;
    int file_open; /* open() to close(), under the GIL; recording may stop earlier (failed) */
    char *path;    /* of the open file, for the write error message */
    int failed;    /* a write failed: the writer only discards from then on */
} dft_writer_t;
extern dft_writer_t dft_w;

int dft_writer_start(void);
void dft_writer_stop(void);  /* drains, writes end and ']', closes; GIL released */
void dft_writer_flush(void); /* GIL released */
void dft_writer_kick(void);
void dft_writer_names(void); /* the thread names of every ring (and its lanes) into fmt */
/* pthread_cond_timedwait on cv with mu held, for at most ns (< 1 s). */
void dft_cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, long ns);

/* ---- aggregates written with the trace (aggregates.c; writer thread) ---- */
void dft_agg_open(const char *header, size_t len); /* a new file: reset, copy the header's events */
void dft_agg_forget(void); /* a forked child: drop (leak) the parent's state without freeing it */
void dft_writer_forget(void); /* the same for the writer thread's own buffers */
void dft_agg_event(const dft_rec *x, const char *line, size_t len, uint64_t start_ns, uint64_t dur_ns); /* its line */
int dft_agg_tick(void);                   /* after a drain pass: 1 when a checkpoint is due */
/* the record line; last: at close. Returns the CRC-32 of b's text before it (its covers); copy
 * (deflate.h): where its copied events lie in b, for the encoder */
struct dft_record_copy;
uint32_t dft_agg_write(dft_buf *b, int last, struct dft_record_copy *copy);

/* ---- flight recorder (flight.c) ------------------------------------------ */
extern int dft_flight_on;       /* this file's members are kept in memory (writer thread) */
extern uint32_t dft_flight_tag; /* step tag of the member being built; a new one starts a member */
void dft_flight_open(const char *header, size_t len); /* open(), before the writer starts */
int dft_flight_keep(dft_sink *k, const char *p, size_t n, uint64_t events); /* instead of writing */
void dft_flight_serve(uint64_t req); /* writer, after the flush numbered req: a dump asked for */
void dft_flight_close(void);         /* writer, at stop: drop what is kept */
extern PyMethodDef dft_flight_methods[];

/* ---- types (callwrap.c) ------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    uint32_t id;
} dft_TagCell;
extern PyTypeObject dft_TagCellType;
extern PyTypeObject dft_InterceptorType;
extern PyTypeObject dft_GraphCallType;
extern PyTypeObject dft_ScannerType; /* reader.c: trace lines to columns (the full scan) */
int dft_check_site(unsigned long long site);
PyObject *dft_py_chain(PyObject *m, PyObject *seq); /* callwrap.c */

/* ---- module spans (span.c) --------------------------------------------- */
PyObject *dft_py_span(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *dft_py_boundary(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

/* A stack of open slices deeper than this keeps no starts above it: those
 * slices are not recorded (only a graph that raised outside any GraphCall,
 * again and again, gets near it). */
#define DFT_OPEN_MAX (1u << 16)
int dft_open_grow(uint32_t n); /* room for n open slices; 0 if there is none */
/* Site ids of slices (Python ints) into sites; -1 with ValueError for an
 * unknown one, or TypeError for a non-int. */
int dft_parse_sites(PyObject *const *items, uint32_t n, uint32_t *sites);

/* One module-slice boundary on the calling thread, at now (0: nothing is
 * recorded): closes the innermost `closed` open slices, innermost first,
 * recording each from its start to now as sites[j] with the thread's graph
 * context and these tags; then opens `opened` slices starting at now. A
 * start of 0 (opened while nothing was recorded, or above DFT_OPEN_MAX) is
 * never recorded. Shared by boundary() and the Interceptors that carry a
 * boundary (callwrap.c), so both keep the stack the same way. */
static inline void dft_boundary(uint64_t now, uint32_t opened, const uint32_t *sites, uint32_t closed,
                                uint32_t tags) {
    uint32_t n = dft_tls.open_n;
    if (now) {
        uint32_t ctx = dft_tls.ctx;
        for (uint32_t j = 0; j < closed; j++) {
            uint32_t i = n - 1 - j; /* wraps when more are closed than open: start 0 */
            uint64_t start = i < n && i < dft_tls.open_cap ? dft_tls.open[i] : 0;
            if (start)
                dft_push(sites[j], start, now, ctx | dft_hot.ticks, tags, NULL);
        }
    }
    n = closed < n ? n - closed : 0;
    if (opened) {
        uint32_t top = n + opened;
        if (DFT_UNLIKELY(top > dft_tls.open_cap) && !dft_open_grow(top)) {
            for (uint32_t i = n; i < dft_tls.open_cap; i++)
                dft_tls.open[i] = 0;
        } else {
            for (uint32_t i = n; i < top; i++)
                dft_tls.open[i] = now;
        }
        n = top;
    }
    dft_tls.open_n = n;
}

#endif
