/* Aggregates written with the trace (docs/format.rst "Aggregate records"), all
 * in the writer thread, from the lines it has just formatted: per group of op
 * and graph events (kind, kernel or not, name, module, phase, graph, kernel
 * type and fused ops) and step, the count, exact sum in ns, min, max, sum of
 * squares and the bucket counts of traces/sketch.py's quantile sketch; per
 * step the op time (backward phase apart) and, bounded, per group; and a
 * verbatim copy of the few events the step, compile, evaluation and rank views
 * read (never the ops). A step is kept apart until settled (its slice was
 * written one drain pass ago, so every event pushed before it is in); then a
 * step in which nothing compiled (the warm-up rule of traces/steps.py) is
 * folded into the steady totals. The record is a metadata line written at a
 * checkpoint (a step ended, CKPT_NS passed and the events written since are
 * CKPT_RATIO times the last record's text, or CKPT_MAX_NS passed) and at close,
 * citing the bytes it stands for (covers) so that a reader can tell an edited
 * file from the one written. The category names are those of schema.py. */
#include "core.h"
#include "deflate.h"

#include <math.h>

#define CKPT_NS 3000000000ull
/* the record is rewritten whole and grows with the run (groups, sketches, steps, copied events):
 * at a slow event rate a record every CKPT_NS would outweigh the events it stands for; at most
 * one record's text per CKPT_RATIO of event text (a record's byte costs the writer ~3 times an
 * event line's, formatted and matched as a general deflate does: ~5 % of its work), and one at
 * least every CKPT_MAX_NS */
#define CKPT_RATIO 64u
#define CKPT_MAX_NS 60000000000ull
#define COPY_MAX (6u << 20) /* bytes of copied events; past it the record cannot answer */
#define SAMPLES_MAX 100000u /* per-step group sums kept (diff's samples) */
#define PENDING_MAX 64u     /* unsettled steps (a trace without step slices) */
#define STEPS_MAX 100000u   /* steps kept (their op time is in the record); past it the record cannot answer */
#define RECORD_MAX (15u << 20) /* below the readers' longest line (traces/reader.py MAX_LINE) */
#define NONE INT64_MIN      /* no step, or the steady totals */
#define LN_GAMMA 0x1.47b0e059d057dp-6 /* sketch.LN_GAMMA, to the last bit */

typedef struct { const char *p; uint32_t n; } val_t; /* raw JSON text in a line */
typedef struct { /* descriptor text in keys; s, x: index + 1 of its last statistics and sample */
    uint64_t h;
    uint32_t off, len, s, x;
} group_t;
typedef struct {
    uint32_t gid, dead;
    int64_t step;
    uint64_t count, ns, min, max, zero, *b;
    unsigned __int128 sq; /* of the durations in ns: exact, and written without printf (fmt_sq) */
    int32_t lo;
    uint32_t nb;
} stat_t;
typedef struct { uint32_t gid; int64_t step; uint64_t ns; } sample_t;
typedef struct { int64_t step; uint64_t count[2], ns[2]; int state, compiled; } step_t;
enum { PENDING, FOLDED, APART };
typedef struct { uint32_t *slot; uint32_t cap, n; } imap; /* index + 1 per slot */

static struct {
    int on, broken;
    dft_buf keys, copy, scratch;
    group_t *g; uint32_t ng, capg; imap gm;
    stat_t *s; uint32_t ns, caps, dead; imap sm;
    sample_t *x; uint32_t nx, capx; imap xm; int x_over;
    step_t *st; uint32_t nst, capst, pending, st_last;
    int64_t settle_upto, slice_max;
    int any_slice, slice_since, dirty;
    uint64_t last_ns, text, text_at, rec_len; /* event text applied: in all, at the last record; its length */
    /* copy's shortest length since the last record; in the record, its offset and those of the
     * keys and the statistics */
    size_t copy_low, copy_at, keys_at, nums_at;
} A;

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static int grow(void **p, uint32_t *cap, uint32_t n, size_t size) {
    if (n < *cap)
        return 0;
    uint32_t c = *cap ? *cap * 2 : 64;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Slot of hash h whose index satisfies eq (or the empty one to fill); NULL: out of memory. */
static uint32_t *map_find(imap *m, uint64_t h, int (*eq)(uint32_t, const void *), const void *k,
                          uint64_t (*hash_of)(uint32_t)) {
    if (m->n * 2 >= m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 256, *slot = calloc(cap, sizeof *slot);
        if (!slot)
            return NULL;
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->slot[i]) {
                uint32_t j = (uint32_t)hash_of(m->slot[i] - 1) & (cap - 1);
                while (slot[j])
                    j = (j + 1) & (cap - 1);
                slot[j] = m->slot[i];
            }
        free(m->slot);
        m->slot = slot;
        m->cap = cap;
    }
    uint32_t j = (uint32_t)h & (m->cap - 1);
    while (m->slot[j] && !eq(m->slot[j] - 1, k))
        j = (j + 1) & (m->cap - 1);
    return &m->slot[j];
}

static uint64_t g_hash(uint32_t i) { return A.g[i].h; }
static int g_eq(uint32_t i, const void *k) {
    const dft_buf *d = k;
    return A.g[i].len == d->len && !memcmp(A.keys.p + A.g[i].off, d->p, d->len);
}
static uint64_t gs_hash(uint32_t gid, int64_t step) { return mix(gid * 0x9e3779b97f4a7c15ull ^ (uint64_t)step); }
static uint64_t s_hash(uint32_t i) { return gs_hash(A.s[i].gid, A.s[i].step); }
static uint64_t x_hash(uint32_t i) { return gs_hash(A.x[i].gid, A.x[i].step); }
typedef struct { uint32_t gid; int64_t step; } gs_t;
static int s_eq(uint32_t i, const void *k) {
    const gs_t *q = k;
    return A.s[i].gid == q->gid && A.s[i].step == q->step;
}
static int x_eq(uint32_t i, const void *k) {
    const gs_t *q = k;
    return A.x[i].gid == q->gid && A.x[i].step == q->step;
}

/* ---- a JSON scanner over the lines we wrote ---- */
static const char *ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

static const char *skip(const char *p, const char *e) { /* end of the value at p, or NULL */
    int depth = 0;
    do {
        if (p >= e)
            return NULL;
        if (*p == '"') {
            for (p++; p < e && *p != '"'; p++)
                p += *p == '\\';
            p++;
        } else if (*p == '{' || *p == '[') {
            depth++, p++;
        } else if (*p == '}' || *p == ']') {
            depth--, p++;
        } else if (depth) {
            p++;
        } else {
            while (p < e && *p != ',' && *p != '}' && *p != ']')
                p++;
        }
        if (depth)
            p = ws(p, e);
    } while (depth > 0);
    return p > e ? NULL : p;
}

/* Each key of the object at p whose raw text is one of names[i] (quoted) gets its value in out[i]
 * (first one wins, as in DuckDB). Returns 0, -1 if not an object. */
static int fields(const char *p, const char *e, const char *const *names, val_t *out, int n) {
    p = ws(p, e);
    if (p >= e || *p++ != '{')
        return -1;
    for (;;) {
        p = ws(p, e);
        if (p < e && *p == '}')
            return 0;
        const char *k = p, *ke = skip(p, e);
        if (!ke || *k != '"')
            return -1;
        p = ws(ke, e);
        if (p >= e || *p++ != ':')
            return -1;
        p = ws(p, e);
        const char *ve = skip(p, e);
        if (!ve)
            return -1;
        for (int i = 0; i < n; i++)
            if (!out[i].p && (size_t)(ke - k) == strlen(names[i]) && !memcmp(k, names[i], (size_t)(ke - k))) {
                out[i].p = p;
                out[i].n = (uint32_t)(ve - p);
            }
        p = ws(ve, e);
        if (p < e && *p == ',')
            p++;
    }
}

#define IS(v, lit) ((v).n == sizeof(lit) - 1 && !memcmp((v).p, lit, sizeof(lit) - 1))
static int present(val_t v) { return v.p && !IS(v, "null"); }

static int64_t step_of(val_t v) { /* TRY_CAST(args.step AS BIGINT) */
    const char *p = v.p, *e = v.p + v.n;
    if (!present(v))
        return NONE;
    if (*p == '"')
        p++, e--;
    int neg = p < e && *p == '-';
    p += neg;
    if (p >= e)
        return NONE;
    int64_t n = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9' || n > (INT64_MAX - 9) / 10)
            return NONE;
        n = n * 10 + (*p - '0');
    }
    return neg ? -n : n;
}

static int put(dft_buf *b, const char *s, size_t n) {
    if (dft_buf_reserve(b, n) < 0)
        return -1;
    dft_buf_put(b, s, n);
    return 0;
}
#define PUTL(b, lit) put(b, lit, sizeof(lit) - 1)
static int put_val(dft_buf *b, val_t v) { return present(v) ? put(b, v.p, v.n) : PUTL(b, "null"); }
static int put_i64(dft_buf *b, int64_t v) {
    char t[24];
    return put(b, t, (size_t)(dft_fmt_i64(t, v) - t));
}

/* The per-event lookups below: an inline check of the entry the event before used (mostly the
 * one), then the search out of line. */
static __attribute__((noinline)) step_t *step_find(int64_t n) {
    uint32_t lo = 0, hi = A.nst;
    if (A.nst && A.st[A.nst - 1].step < n)
        lo = A.nst;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (A.st[mid].step < n)
            lo = mid + 1;
        else
            hi = mid;
    }
    A.st_last = lo;
    if (lo < A.nst && A.st[lo].step == n)
        return &A.st[lo];
    if (A.nst >= STEPS_MAX || grow((void **)&A.st, &A.capst, A.nst, sizeof *A.st) < 0)
        return NULL;
    memmove(&A.st[lo + 1], &A.st[lo], (A.nst - lo) * sizeof *A.st);
    memset(&A.st[lo], 0, sizeof *A.st);
    A.st[lo].step = n;
    A.nst++;
    A.pending++;
    return &A.st[lo];
}

static inline step_t *step_get(int64_t n) {
    if (DFT_LIKELY(A.st_last < A.nst && A.st[A.st_last].step == n))
        return &A.st[A.st_last];
    return step_find(n);
}

static int64_t bucket(uint64_t ns) { /* sketch.key of the written dur (µs); ns 0: the zero bucket */
    return (int64_t)ceil(log((double)ns / 1000.0) / LN_GAMMA);
}

/* bucket() without log() below 2^EDGE_BITS ns: edge[k - KEY_MIN] is the least ns whose bucket is
 * k or more, and start[] the bucket of the first ns of each sixteenth of an octave (a few edges
 * wide); both come from bucket() itself, so they agree with it to the last ns. */
#define EDGE_BITS 52
#define KEY_MIN (-345) /* bucket(1) */
#define NKEYS 1804     /* bucket(2^EDGE_BITS - 1) + 2 - KEY_MIN */
static uint64_t edge[NKEYS];
static int32_t start[EDGE_BITS][16];
static int edges; /* 1: set up; -1: this libm's log disagrees with the constants (bucket() then) */

static void edges_init(void) {
    edges = bucket(1) == KEY_MIN && bucket(((uint64_t)1 << EDGE_BITS) - 1) + 2 - KEY_MIN == NKEYS ? 1 : -1;
    if (edges < 0)
        return;
    for (int64_t k = KEY_MIN + 1; k < KEY_MIN + NKEYS; k++) {
        uint64_t e = (uint64_t)ceil(1000.0 * exp((double)(k - 1) * LN_GAMMA)); /* within a few ns */
        while (bucket(e) < k)
            e++;
        while (e > 1 && bucket(e - 1) >= k)
            e--;
        edge[k - KEY_MIN] = e;
    }
    for (int b = 0; b < EDGE_BITS; b++)
        for (int i = 0; i < 16; i++)
            start[b][i] = (int32_t)bucket(((uint64_t)(16 + i) << b) >> 4);
}

static inline int64_t bucket_fast(uint64_t ns) { /* ns > 0 */
    if (DFT_UNLIKELY(ns >> EDGE_BITS || edges < 0))
        return bucket(ns);
    int b = 63 - __builtin_clzll(ns);
    int64_t k = start[b][(ns << 4 >> b) & 15];
    while (ns >= edge[k + 1 - KEY_MIN])
        k++;
    return k;
}

static __attribute__((noinline)) int sketch_grow(stat_t *s, int64_t k, uint64_t n) {
    if (!s->nb) {
        if (!(s->b = calloc(16, sizeof *s->b)))
            return -1;
        s->lo = (int32_t)k;
        s->nb = 16;
    }
    if (k < s->lo || k >= s->lo + (int64_t)s->nb) {
        /* in int64: lo + nb as int32 + uint32 wraps when every bucket is below zero (sub-µs) */
        /* a margin of half the range: a group's buckets are reallocated O(log range) times */
        int64_t end = (int64_t)s->lo + s->nb, more = s->nb / 2 > 8 ? s->nb / 2 : 8;
        int64_t lo = k < s->lo ? k - more : s->lo, hi = k >= end ? k + more : end;
        uint64_t *b = calloc((size_t)(hi - lo), sizeof *b);
        if (!b)
            return -1;
        memcpy(b + (s->lo - lo), s->b, s->nb * sizeof *b);
        free(s->b);
        s->b = b;
        s->lo = (int32_t)lo;
        s->nb = (uint32_t)(hi - lo);
    }
    s->b[k - s->lo] += n;
    return 0;
}

static inline int sketch_add(stat_t *s, int64_t k, uint64_t n) {
    uint64_t i = (uint64_t)(k - s->lo);
    if (DFT_LIKELY(i < s->nb)) {
        s->b[i] += n;
        return 0;
    }
    return sketch_grow(s, k, n);
}

static __attribute__((noinline)) stat_t *stat_find(uint32_t gid, int64_t step) {
    gs_t k = {gid, step};
    uint32_t *slot = map_find(&A.sm, gs_hash(gid, step), s_eq, &k, s_hash);
    if (!slot)
        return NULL;
    if (!*slot) {
        if (grow((void **)&A.s, &A.caps, A.ns, sizeof *A.s) < 0)
            return NULL;
        memset(&A.s[A.ns], 0, sizeof *A.s);
        A.s[A.ns].gid = gid;
        A.s[A.ns].step = step;
        A.s[A.ns].min = UINT64_MAX;
        *slot = ++A.ns;
        A.sm.n++;
    }
    A.g[gid].s = *slot;
    return &A.s[*slot - 1];
}

static inline stat_t *stat_get(uint32_t gid, int64_t step) {
    uint32_t i = A.g[gid].s - 1;
    if (DFT_LIKELY(i < A.ns && A.s[i].step == step && A.s[i].gid == gid && !A.s[i].dead))
        return &A.s[i];
    return stat_find(gid, step);
}

static int stat_merge(stat_t *to, const stat_t *s) {
    to->count += s->count;
    to->ns += s->ns;
    to->sq += s->sq;
    to->zero += s->zero;
    to->min = s->min < to->min ? s->min : to->min;
    to->max = s->max > to->max ? s->max : to->max;
    for (uint32_t i = 0; i < s->nb; i++)
        if (s->b[i] && sketch_add(to, s->lo + (int64_t)i, s->b[i]) < 0)
            return -1;
    return 0;
}

static __attribute__((noinline)) int sample_find(uint32_t gid, int64_t step, uint64_t ns) {
    gs_t k = {gid, step};
    uint32_t *slot = map_find(&A.xm, gs_hash(gid, step), x_eq, &k, x_hash);
    if (!slot)
        return -1;
    if (!*slot) {
        if (A.nx >= SAMPLES_MAX) {
            A.x_over = 1;
            return 0;
        }
        if (grow((void **)&A.x, &A.capx, A.nx, sizeof *A.x) < 0)
            return -1;
        A.x[A.nx] = (sample_t){gid, step, 0};
        *slot = ++A.nx;
        A.xm.n++;
    }
    A.g[gid].x = *slot;
    A.x[*slot - 1].ns += ns;
    return 0;
}

static inline int sample_add(uint32_t gid, int64_t step, uint64_t ns) {
    uint32_t i = A.g[gid].x - 1;
    if (A.x_over)
        return 0;
    if (DFT_LIKELY(i < A.nx && A.x[i].step == step && A.x[i].gid == gid)) {
        A.x[i].ns += ns;
        return 0;
    }
    return sample_find(gid, step, ns);
}

static const char *const TOP[] = {"\"name\"", "\"cat\"", "\"ph\"", "\"args\""};
static const char *const ARGS[] = {"\"module\"", "\"phase\"", "\"graph\"", "\"node\"", "\"step\"",
                                   "\"kernel_type\"", "\"aten_ops\"", "\"recompute\""};
enum { T_NAME, T_CAT, T_PH, T_ARGS };
enum { A_MODULE, A_PHASE, A_GRAPH, A_NODE, A_STEP, A_KTYPE, A_ATEN, A_RECOMPUTE, A_N };
/* the phase summary reports for activation checkpointing's second run of an op (traces/events.py) */
static const val_t RECOMPUTE_PHASE = {"\"recompute\"", 11};

/* The group of an op or graph event: its descriptor (the JSON text of its key) interned. */
static int64_t group_of(int kind, int kernel, const val_t *t, const val_t *a) {
    dft_buf *d = &A.scratch;
    d->len = 0;
    if (put(d, kind == 1 ? "[1," : "[2,", 3) < 0 || put(d, kernel ? "1," : "0,", 2) < 0 ||
        put_val(d, t[T_NAME]) < 0)
        return -1;
    static const int cols[] = {A_MODULE, A_PHASE, A_GRAPH, A_KTYPE, A_ATEN};
    for (int i = 0; i < 5; i++) {
        val_t v = (i < 3 || kernel) ? a[cols[i]] : (val_t){0, 0};
        if (cols[i] == A_PHASE && IS(a[A_RECOMPUTE], "true"))
            v = RECOMPUTE_PHASE;
        if (PUTL(d, ",") < 0 || put_val(d, v) < 0)
            return -1;
    }
    if (PUTL(d, "]") < 0)
        return -1;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < d->len; i++)
        h = (h ^ (unsigned char)d->p[i]) * 1099511628211ull;
    uint32_t *slot = map_find(&A.gm, h, g_eq, d, g_hash);
    if (!slot)
        return -1;
    if (!*slot) {
        if (grow((void **)&A.g, &A.capg, A.ng, sizeof *A.g) < 0)
            return -1;
        A.g[A.ng] = (group_t){h, (uint32_t)A.keys.len + (A.ng > 0), (uint32_t)d->len, 0, 0};
        if ((A.ng && PUTL(&A.keys, ",") < 0) || put(&A.keys, d->p, d->len) < 0)
            return -1;
        *slot = ++A.ng;
        A.gm.n++;
    }
    return *slot - 1;
}

/* One op or graph event of group gid: its statistics. */
static inline __attribute__((always_inline)) int add_event(int kind, uint32_t gid, int bwd, int64_t step, uint64_t ns) {
    int64_t key = step;
    if (step != NONE) {
        step_t *st = step_get(step);
        if (!st)
            return -1;
        if (kind == 1) {
            st->count[bwd]++;
            st->ns[bwd] += ns;
            if (sample_add(gid, step, ns) < 0)
                return -1;
        }
        key = st->state == FOLDED ? NONE : step;
    }
    stat_t *s = stat_get(gid, key);
    if (!s)
        return -1;
    s->count++;
    s->ns += ns;
    s->sq += (unsigned __int128)ns * ns;
    s->min = ns < s->min ? ns : s->min;
    s->max = ns > s->max ? ns : s->max;
    if (kind == 1) {
        if (!ns)
            s->zero++;
        else if (sketch_add(s, bucket_fast(ns), 1) < 0)
            return -1;
    }
    return 0;
}

static int copy_line(const char *line, size_t len) {
    while (len && (line[len - 1] == '\n' || line[len - 1] == ',' || line[len - 1] == ' '))
        len--;
    if (A.copy.len + len >= COPY_MAX) {
        A.broken = 1;
        return 0;
    }
    return ((A.copy.len && PUTL(&A.copy, ",") < 0) || put(&A.copy, line, len) < 0) ? -1 : 0;
}

/* What an event of one (site, tags, flags) contributes, from its line (cached). */
typedef struct {
    uint32_t tags, flags, tlen;
    char tcopy[64]; /* the tags' text: an owned tags id may be reused with other text */
    int used, kind, kernel, bwd, copy, slice, compile, step_from_line, eager;
    uint32_t gid;
    int64_t step; /* the step the site or tags text gives (step_from_line) */
} cls_t;
/* Per site, the last two (tags, flags) seen: a graph's ops alternate between their sites, never
 * thrashing one slot as a hashed cache does when two sites of one graph share it. */
static struct {
    cls_t **site; /* [site id] -> two entries (NULL until its first event) */
    uint32_t cap;
} cache;

static int classify(const char *line, size_t len, cls_t *k) {
    const char *e = line + len;
    val_t t[4] = {{0}}, a[A_N] = {{0}};
    k->kind = k->copy = k->eager = 0;
    k->step = NONE;
    if (fields(line, e, TOP, t, 4) < 0 || !IS(t[T_PH], "\"X\"") ||
        (t[T_ARGS].p && fields(t[T_ARGS].p, t[T_ARGS].p + t[T_ARGS].n, ARGS, a, A_N) < 0))
        return 0;
    val_t c = t[T_CAT];
    int op = (IS(c, "\"dynamo\"") && (present(a[A_NODE]) || !present(a[A_GRAPH]))) || IS(c, "\"kernel\"");
    k->step = step_of(a[A_STEP]);
    k->kernel = IS(c, "\"kernel\"");
    k->bwd = IS(a[A_PHASE], "\"backward\"");
    k->slice = IS(c, "\"step\"");
    k->compile = IS(c, "\"dynamo_compile\"");
    /* the step view's eager forward (traces/events.py _EAGER): an eager module slice or op of
     * phase forward or inference */
    val_t ph = a[A_PHASE];
    k->eager = !present(a[A_GRAPH]) && (IS(ph, "\"forward\"") || IS(ph, "\"inference\"")) &&
               !IS(a[A_RECOMPUTE], "true") && (IS(c, "\"module\"") || IS(c, "\"dynamo\""));
    /* the events summary's other views read (traces/events.py load, ranks.FUNCTIONAL) */
    k->copy = (!op && (IS(c, "\"dynamo_graph\"") || k->compile || k->slice || IS(c, "\"data\"") ||
                       IS(c, "\"backward\"") || IS(c, "\"optimizer\"") || IS(c, "\"eval\"") ||
                       IS(c, "\"comm\"") || IS(c, "\"gc\"") || IS(c, "\"trainer\"") ||
                       (IS(c, "\"dftracer\"") && (IS(t[T_NAME], "\"start\"") || IS(t[T_NAME], "\"clock\""))))) ||
              (op && t[T_NAME].n > 28 && !memcmp(t[T_NAME].p, "\"function._c10d_functional.", 28));
    if (op || IS(c, "\"dynamo_graph\"")) {
        k->kind = op ? 1 : 2;
        int64_t gid = group_of(k->kind, k->kernel, t, a);
        if (gid < 0)
            return -1;
        k->gid = (uint32_t)gid;
    }
    return 0;
}

/* The eager forward events are copied as few as give the same union of intervals per step: a
 * module slice is written after the ops and slices inside it, and replaces those still at the end
 * of the copied events (their offsets: tail; past TAIL_MAX the older half stays as copied). */
#define TAIL_MAX 1024
static struct { uint32_t n; struct { size_t off, end; int64_t step; uint64_t a, b; } e[TAIL_MAX]; } tail;

static int eager_copy(const char *line, size_t len, int64_t step, uint64_t start, uint64_t ns) {
    uint64_t a = start / 1000 * 1000; /* the line's ts: integer µs */
    if (tail.n && tail.e[tail.n - 1].end != A.copy.len) /* other events were copied since */
        tail.n = 0;
    while (tail.n && tail.e[tail.n - 1].step == step && a <= tail.e[tail.n - 1].a &&
           tail.e[tail.n - 1].b <= a + ns)
        A.copy.len = tail.e[--tail.n].off;
    A.copy_low = A.copy.len < A.copy_low ? A.copy.len : A.copy_low;
    size_t off = A.copy.len;
    if (copy_line(line, len) < 0)
        return -1;
    if (A.copy.len == off) /* past COPY_MAX */
        return 0;
    if (tail.n == TAIL_MAX) {
        memmove(tail.e, tail.e + TAIL_MAX / 2, TAIL_MAX / 2 * sizeof tail.e[0]);
        tail.n = TAIL_MAX / 2;
    }
    tail.e[tail.n++] = (__typeof__(tail.e[0])){off, A.copy.len, step, a, a + ns};
    return 0;
}

static inline __attribute__((always_inline)) int apply(const cls_t *k, const char *line, size_t len, int64_t step,
                                                       uint64_t start, uint64_t ns) {
    if (!k->kind && !k->copy && !k->eager) /* nothing the record holds (a logged region): no checkpoint for it */
        return 0;
    A.dirty = 1;
    if (k->kind && add_event(k->kind, k->gid, k->bwd, step, ns) < 0)
        return -1;
    if (k->eager)
        return eager_copy(line, len, step, start, ns);
    if (!k->copy)
        return 0;
    if (copy_line(line, len) < 0)
        return -1;
    step_t *st = step != NONE ? step_get(step) : NULL;
    if (step != NONE && !st)
        return -1;
    if (st && k->slice) {
        A.any_slice = A.slice_since = 1;
        A.slice_max = step > A.slice_max ? step : A.slice_max;
    } else if (st && k->compile) {
        st->compiled = 1;
    }
    return 0;
}

/* The step a site's or tags' args text (,"k":v...) gives, else NONE. */
static int64_t step_in(const char *frag, uint32_t n) {
    static const char *const key[] = {"\"step\""};
    dft_buf *d = &A.scratch;
    val_t v = {0};
    d->len = 0;
    if (!n || PUTL(d, "{") < 0 || put(d, frag + 1, n - 1) < 0 || PUTL(d, "}") < 0 || fields(d->p, d->p + d->len, key, &v, 1) < 0)
        return NONE;
    return step_of(v);
}

static inline int same(const char *a, const char *b, uint32_t n) { /* memcmp of short text, inline */
    uint64_t x, y;
    for (; n >= 8; n -= 8, a += 8, b += 8) {
        memcpy(&x, a, 8), memcpy(&y, b, 8);
        if (x != y)
            return 0;
    }
    while (n--)
        if (*a++ != *b++)
            return 0;
    return 1;
}

/* The two entries of a site (new ones zeroed); NULL: out of memory. */
static cls_t *cache_slot(uint32_t site) {
    if (DFT_UNLIKELY(site >= cache.cap)) {
        uint32_t cap = cache.cap ? cache.cap : 256;
        while (cap <= site)
            cap *= 2;
        cls_t **p = realloc(cache.site, cap * sizeof *p);
        if (!p)
            return NULL;
        memset(p + cache.cap, 0, (cap - cache.cap) * sizeof *p);
        cache.site = p;
        cache.cap = cap;
    }
    if (DFT_UNLIKELY(!cache.site[site]))
        cache.site[site] = calloc(2, sizeof(cls_t));
    return cache.site[site];
}

static inline int hit(const cls_t *k, uint32_t tags_id, uint32_t flags, const dft_str *tags) {
    uint32_t tlen = tags ? tags->len : 0;
    return k->used && k->tags == tags_id && k->flags == flags && k->tlen == tlen &&
           (!tlen || same(k->tcopy, tags->p, tlen));
}

#define CACHED_FLAGS (DFT_PHASE_MASK | DFT_FLAG_NOCTX | DFT_FLAG_STEP | DFT_FLAG_NOSTEP | DFT_FLAG_TIMED)

void dft_agg_event(const dft_rec *x, const char *line, size_t len, uint64_t start, uint64_t ns) {
    if (!A.on || A.broken || (x->flags & DFT_FLAG_COUNTER))
        return;
    A.text += len;
    int rc;
    if (x->site && !x->extra) { /* an interned site's event: what it adds is known after its first */
        const dft_str *tags = x->tags ? dft_tab_get(&dft_tags, x->tags) : NULL;
        uint32_t tlen = tags ? tags->len : 0, flags = x->flags & CACHED_FLAGS;
        cls_t *k = cache_slot(x->site);
        if (!k) {
            rc = -1;
            goto out;
        }
        if (!hit(k, x->tags, flags, tags) && !hit(++k, x->tags, flags, tags)) {
            k[0] = k[-1]; /* the newer one moves to the second entry */
            k--;
            k->used = 0;
            if (tlen > sizeof k->tcopy || classify(line, len, k) < 0) {
                rc = tlen > sizeof k->tcopy ? 0 : -1;
                goto slow;
            }
            const dft_site *site = dft_tab_get(&dft_sites, x->site);
            int64_t fixed = step_in(site->args.p, site->args.len);
            fixed = fixed != NONE ? fixed : tags ? step_in(tags->p, tlen) : NONE;
            k->step_from_line = fixed != NONE;
            k->step = fixed;
            k->tags = x->tags, k->flags = flags, k->tlen = tlen;
            if (tlen)
                memcpy(k->tcopy, tags->p, tlen);
            k->used = 1;
        }
        rc = apply(k, line, len, k->step_from_line ? k->step : x->step ? (int64_t)x->step - 1 : NONE, start, ns);
        goto out;
    }
slow:;
    cls_t k;
    rc = classify(line, len, &k);
    if (rc == 0)
        rc = apply(&k, line, len, k.step, start, ns);
out:
    if (rc < 0)
        A.broken = 1; /* out of memory or past a bound: the record says it cannot answer */
}

static void free_all(void) {
    tail.n = 0;
    for (uint32_t i = 0; i < cache.cap; i++)
        free(cache.site[i]);
    free(cache.site);
    memset(&cache, 0, sizeof cache);
    for (uint32_t i = 0; i < A.ns; i++)
        free(A.s[i].b);
    free(A.keys.p), free(A.copy.p), free(A.scratch.p), free(A.g), free(A.gm.slot), free(A.s), free(A.sm.slot);
    free(A.x), free(A.xm.slot), free(A.st);
    memset(&A, 0, sizeof A);
}

void dft_agg_forget(void) {
    tail.n = 0;
    memset(&cache, 0, sizeof cache);
    memset(&A, 0, sizeof A);
}

void dft_agg_open(const char *header, size_t len) {
    free_all();
    A.on = 1;
    /* room for every copied line now, not by realloc copies while events flow (untouched pages
     * cost no memory); a failure here only means growing later */
    (void)dft_buf_reserve(&A.copy, COPY_MAX + 16);
    if (!edges)
        edges_init();
    A.settle_upto = A.slice_max = NONE;
    A.last_ns = dft_mono();
    for (const char *p = header, *e = header + len, *nl; p < e; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(e - p));
        nl = nl ? nl : e;
        if (*ws(p, nl) == '{' && copy_line(p, (size_t)(nl - p)) < 0)
            A.broken = 1;
    }
}

/* Folds step n's statistics into the steady totals. */
static int fold(step_t *st) {
    st->state = FOLDED;
    for (uint32_t i = 0; i < A.ns; i++) {
        if (A.s[i].dead || A.s[i].step != st->step)
            continue;
        stat_t s = A.s[i];
        stat_t *to = stat_get(s.gid, NONE); /* may move A.s */
        if (!to || stat_merge(to, &s) < 0)
            return -1;
        free(A.s[i].b);
        A.s[i].b = NULL;
        A.s[i].nb = 0;
        A.s[i].dead = 1;
        A.dead++;
    }
    if (A.dead > 1024 && A.dead * 2 > A.ns) { /* drop the folded entries */
        uint32_t k = 0;
        for (uint32_t i = 0; i < A.ns; i++)
            if (!A.s[i].dead)
                A.s[k++] = A.s[i];
        A.ns = k;
        A.dead = 0;
        memset(A.sm.slot, 0, A.sm.cap * sizeof *A.sm.slot);
        A.sm.n = 0;
        for (uint32_t i = 0; i < A.ns; i++) {
            gs_t q = {A.s[i].gid, A.s[i].step};
            *map_find(&A.sm, s_hash(i), s_eq, &q, s_hash) = i + 1; /* no growth: n stays below */
            A.sm.n++;
        }
    }
    return 0;
}

/* After each drain pass: settles the steps whose slice (or a later one) was written in an
 * earlier pass; says whether a checkpoint is due. */
static void settle(void) {
    for (uint32_t i = 0; i < A.nst && !A.broken; i++) {
        step_t *st = &A.st[i];
        if (st->state != PENDING || (st->step > A.settle_upto && A.pending <= PENDING_MAX))
            continue;
        A.pending--;
        if (st->compiled)
            st->state = APART;
        else if (fold(st) < 0)
            A.broken = 1;
    }
}

int dft_agg_tick(void) {
    if (!A.on)
        return 0;
    settle();
    A.settle_upto = A.slice_max;
    uint64_t now = dft_mono();
    return A.dirty && now - A.last_ns >= CKPT_NS && (A.slice_since || !A.any_slice) &&
           (A.text - A.text_at >= CKPT_RATIO * A.rec_len || now - A.last_ns >= CKPT_MAX_NS);
}

/* A sum of squared ns as µs², exactly: its integer part and up to 6 decimals (at most 46 bytes). */
static char *fmt_sq(char *p, unsigned __int128 v) {
    const uint64_t e19 = 10000000000000000000ull;
    unsigned __int128 q = v / 1000000;
    uint32_t r = (uint32_t)(v % 1000000);
    if (q >> 64) { /* past 2^64 µs²: the digits above the last 19, then those 19 */
        p = dft_fmt_u64(p, (uint64_t)(q / e19));
        uint64_t lo = (uint64_t)(q % e19);
        for (int i = 18; i >= 0; i--, lo /= 10)
            p[i] = (char)('0' + lo % 10);
        p += 19;
    } else {
        p = dft_fmt_u64(p, (uint64_t)q);
    }
    if (r) {
        char f[6];
        int n = 6;
        for (int i = 5; i >= 0; i--, r /= 10)
            f[i] = (char)('0' + r % 10);
        while (f[n - 1] == '0')
            n--;
        *p++ = '.';
        memcpy(p, f, (size_t)n);
        p += n;
    }
    return p;
}

/* Room for n bytes of text at b's end (numbers store whole words past theirs); NULL: out of memory. */
static char *room(dft_buf *b, size_t n) {
    return dft_buf_reserve(b, n + DFT_FMT_MAX) < 0 ? NULL : b->p + b->len;
}
static inline char *put_lit(char *p, const char *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}
#define LIT(p, lit) put_lit(p, lit, sizeof(lit) - 1)

static int record(dft_buf *b) {
    /* gc, trainer: the garbage collection and trainer code slices are among the copied events
       (older records lack them) */
    if (PUTL(b, "\"version\":2,\"writer\":\"c\",\"gc\":true,\"trainer\":true,\"complete\":") < 0 ||
        (A.broken ? PUTL(b, "false") : PUTL(b, "true")) < 0 || PUTL(b, ",\"keys\":[") < 0)
        return -1;
    A.keys_at = b->len;
    if (put(b, A.keys.p, A.keys.len) < 0 || PUTL(b, "],\"apart\":[") < 0)
        return -1;
    int first = 1;
    for (uint32_t i = 0; i < A.nst; i++)
        if (A.st[i].state != FOLDED) {
            if ((!first && PUTL(b, ",") < 0) || put_i64(b, A.st[i].step) < 0)
                return -1;
            first = 0;
        }
    A.nums_at = b->len;
    if (PUTL(b, "],\"groups\":[") < 0)
        return -1;
    first = 1;
    for (uint32_t i = 0; i < A.ns; i++) {
        const stat_t *s = &A.s[i];
        if (s->dead)
            continue;
        char *p = room(b, 240 + (size_t)s->nb * 42); /* 8 numbers, the sum of squares, the buckets */
        if (!p)
            return -1;
        if (!first)
            *p++ = ',';
        first = 0;
        *p++ = '[';
        p = dft_fmt_i64(p, s->gid);
        p = s->step == NONE ? LIT(p, ",null") : dft_fmt_i64(LIT(p, ","), s->step);
        const uint64_t v[] = {s->count, s->ns, s->min, s->max, s->zero};
        for (int j = 0; j < 5; j++)
            p = dft_fmt_i64(LIT(p, ","), (int64_t)v[j]);
        p = LIT(fmt_sq(LIT(p, ","), s->sq), ",[");
        int bf = 1;
        /* the buckets in use lie between those of the shortest and the longest duration (none
         * below a zero one's: it has no bucket); most of the rest are empty, skipped four at a time */
        int64_t j0 = s->nb && s->min && s->min != UINT64_MAX ? bucket_fast(s->min) - s->lo : 0;
        int64_t j1 = s->nb && s->max ? bucket_fast(s->max) - s->lo + 1 : (int64_t)s->nb;
        for (uint32_t j = j0 > 0 ? (uint32_t)j0 : 0, je = j1 < (int64_t)s->nb ? (uint32_t)j1 : s->nb; j < je; j++) {
            if (j + 4 <= je && !(s->b[j] | s->b[j + 1] | s->b[j + 2] | s->b[j + 3])) {
                j += 3;
                continue;
            }
            if (s->b[j]) {
                if (!bf)
                    *p++ = ',';
                p = dft_fmt_i64(LIT(dft_fmt_i64(p, s->lo + (int64_t)j), ","), (int64_t)s->b[j]);
                bf = 0;
            }
        }
        b->len = (size_t)(LIT(p, "]]") - b->p);
    }
    if (PUTL(b, "],\"op_steps\":[") < 0)
        return -1;
    first = 1;
    for (uint32_t i = 0; i < A.nst; i++)
        for (int k = 0; k < 2; k++)
            if (A.st[i].count[k]) {
                char *p = room(b, 80);
                if (!p)
                    return -1;
                if (!first)
                    *p++ = ',';
                first = 0;
                p = dft_fmt_i64(LIT(p, "["), A.st[i].step);
                p = dft_fmt_i64(k ? LIT(p, ",1,") : LIT(p, ",0,"), (int64_t)A.st[i].ns[k]);
                p = dft_fmt_i64(LIT(p, ","), (int64_t)A.st[i].count[k]);
                b->len = (size_t)(LIT(p, "]") - b->p);
            }
    if (PUTL(b, "],\"samples\":") < 0)
        return -1;
    if (A.x_over) {
        if (PUTL(b, "null") < 0)
            return -1;
    } else {
        if (PUTL(b, "[") < 0)
            return -1;
        for (uint32_t i = 0; i < A.nx; i++) {
            char *p = room(b, 80);
            if (!p)
                return -1;
            if (i)
                *p++ = ',';
            p = dft_fmt_i64(LIT(p, "["), A.x[i].gid);
            p = dft_fmt_i64(LIT(p, ","), A.x[i].step);
            p = dft_fmt_i64(LIT(p, ","), (int64_t)A.x[i].ns);
            b->len = (size_t)(LIT(p, "]") - b->p);
        }
        if (PUTL(b, "]") < 0)
            return -1;
    }
    if (PUTL(b, ",\"events\":[") < 0)
        return -1;
    A.copy_at = b->len;
    return (put(b, A.copy.p, A.copy.len) < 0 || PUTL(b, "]") < 0) ? -1 : 0;
}

/* Appends the record line to b (a checkpoint; at close, the last one, then frees everything). */
uint32_t dft_agg_write(dft_buf *b, int last, dft_record_copy *copy) {
    *copy = (dft_record_copy){0, 0, 0, 0, 0, 0};
    if (!A.on)
        return 0;
    size_t at = b->len;
    uint32_t text_crc = 0;
    char head[96];
    if (last) { /* every event is in: each step is settled */
        A.settle_upto = INT64_MAX;
        settle();
    }
    static const char name[] = ",\"name\":\"dftrace_aggregates\",\"cat\":\"dftracer\",\"pid\":";
    char *p = dft_fmt_u64(head + 6, dft_w.next_id);
    memcpy(head, "{\"id\":", 6);
    memcpy(p, name, sizeof name - 1);
    if (put(b, head, (size_t)(p - head) + sizeof name - 1) < 0 || put(b, dft_w.pid_s, dft_w.pid_len) < 0 ||
        PUTL(b, ",\"tid\":0,\"ph\":\"M\",\"args\":{\"hhash\":") < 0 ||
        put(b, dft_w.hhash_json, dft_w.hhash_len) < 0 || PUTL(b, ",") < 0) /* as every event's args */
        goto out;
    /* what the record stands for, checkable without decoding the events: the file's bytes before
     * the member this line ends (CRC-32) and the text of that member before this line */
    char covers[160], *c = covers;
#define COVERS_PUT(lit, v) (memcpy(c, lit, sizeof(lit) - 1), c = dft_fmt_u64(c + sizeof(lit) - 1, v))
    COVERS_PUT("\"covers\":{\"bytes\":", dft_w.sink.good);
    COVERS_PUT(",\"crc32\":", dft_w.sink.crc);
    COVERS_PUT(",\"text_bytes\":", at);
    text_crc = dft_crc32(0, b->p, at);
    COVERS_PUT(",\"text_crc32\":", text_crc);
#undef COVERS_PUT
    memcpy(c, "},", 2);
    if (put(b, covers, (size_t)(c + 2 - covers)) < 0)
        goto out;
    size_t body = b->len;
    if (A.broken || record(b) < 0 || b->len - at > RECORD_MAX) { /* a record that cannot answer */
        A.broken = 1;
        b->len = body;
        if (PUTL(b, "\"version\":2,\"writer\":\"c\",\"complete\":false") < 0)
            goto out;
    } else {
        *copy = (dft_record_copy){A.keys_at, A.keys.len, A.nums_at, A.copy_at, A.copy.len, A.copy_low};
    }
    if (PUTL(b, "}}\n") == 0) {
        A.copy_low = A.copy.len;
        dft_w.next_id++;
        A.dirty = A.slice_since = 0;
        A.last_ns = dft_mono();
        A.rec_len = b->len - at;
        A.text_at = A.text;
        at = b->len;
    }
out:
    b->len = at;
    if (last)
        free_all();
    return text_crc;
}
