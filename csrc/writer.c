/* The writer thread: drains every ring without the GIL, places events so that
 * Perfetto sees the measured tree, formats one JSON line per event and hands
 * the text to the sink in members of at most ~1 s. */
#include "core.h"
#include "deflate.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

dft_writer_t dft_w = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv_wake = PTHREAD_COND_INITIALIZER,
    .cv_space = PTHREAD_COND_INITIALIZER,
    .cv_done = PTHREAD_COND_INITIALIZER,
    .sink = {.fd = -1},
};

#define WAKE_NS 250000000ull
/* + one wake period: a member every second once it holds MEMBER_MIN of text, and at least every
 * 5 s: a member's fixed cost (its codes, the first line of each kind with nothing to refer to)
 * would outweigh a slow thread's few events */
#define MEMBER_NS 750000000ull
#define MEMBER_MAX_NS 4750000000ull
#define MEMBER_MIN (256u << 10) /* ~1,000 lines: a member's fixed cost is ~60 k instructions */
#define MEMBER_BYTES (1u << 20)
#define DRAIN_BATCH 1024u

void dft_cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, long ns) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ns;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

void dft_writer_kick(void) {
    if (!atomic_exchange(&dft_w.kick, 1)) {
        pthread_mutex_lock(&dft_w.mu);
        pthread_cond_signal(&dft_w.cv_wake);
        pthread_mutex_unlock(&dft_w.mu);
    }
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Makes room on a full placement stack by merging entries into runs (a run keeps its first
 * entry's measured and display start). A parent that arrives later can only begin at a kept
 * boundary, so the boundaries given up are those between short neighbours: among the oldest
 * three quarters, each entry is merged with the one before it (pairs, not chains) when the two
 * span at most the median such pair. A long entry (a step, an evaluation: what a still-open
 * parent begins after) keeps its boundaries, and the newest quarter stays exact. Without
 * memory for the spans, the two oldest entries are merged. */
static void place_compact(dft_ring *r) {
    const uint32_t m = r->place_cap - 1, w = r->place_n - r->place_n / 4;
    uint32_t b = r->place_top - r->place_n;
    uint64_t *span = w > 2 ? malloc((w - 1) * sizeof *span) : NULL;
    uint32_t out = 1;
    if (span) {
        for (uint32_t i = 1; i < w; i++)
            span[i - 1] = r->place[(b + i) & m].de - r->place[(b + i - 1) & m].ds;
        qsort(span, w - 1, sizeof *span, cmp_u64);
        const uint64_t limit = span[(w - 1) / 2];
        free(span);
        uint64_t prev_ds = r->place[b & m].ds;
        int paired = 0; /* the entry at out - 1 is a merged pair already */
        for (uint32_t i = 1; i < r->place_n; i++) {
            const dft_place_ent e = r->place[(b + i) & m];
            if (i < w && !paired && e.de - prev_ds <= limit) {
                r->place[(b + out - 1) & m].de = e.de;
                paired = 1;
            } else {
                r->place[(b + out++) & m] = e;
                paired = 0;
            }
            prev_ds = e.ds;
        }
    }
    if (out == 1 || out == r->place_n) { /* no memory, or nothing merged */
        dft_place_ent *lo = &r->place[b & m], *hi = &r->place[(b + 1) & m];
        hi->ms = lo->ms;
        hi->ds = lo->ds;
        out = r->place_n - 1;
        b++;
    }
    r->place_n = out;
    r->place_top = b + out;
}

/* Pushes a placement entry; at DFT_PLACE_MAX (or out of memory) the stack is compacted
 * instead of growing. */
static void place_push(dft_ring *r, uint64_t s, uint64_t ds, uint64_t de) {
    if (r->place_n == r->place_cap) {
        uint32_t cap = r->place_cap ? r->place_cap * 2 : 64;
        dft_place_ent *p = cap <= DFT_PLACE_MAX ? malloc(cap * sizeof *p) : NULL;
        if (p) {
            for (uint32_t i = 0; i < r->place_n; i++)
                p[i] = r->place[(r->place_top - r->place_n + i) & (r->place_cap - 1)];
            free(r->place);
            r->place = p;
            r->place_cap = cap;
            r->place_top = r->place_n;
        } else if (r->place_cap) {
            place_compact(r);
        } else { /* no memory for a first stack: events are placed alone */
            return;
        }
    }
    dft_place_ent *n = &r->place[r->place_top++ & (r->place_cap - 1)];
    n->ms = s;
    n->ds = ds;
    n->de = de;
    r->place_n++;
}

/* Display interval of one event (see design.rst "Writer thread"): events
 * arrive children first; entries on the stack that started at or after s are
 * its descendants and are replaced by it; the entry below is the latest
 * earlier event. The start is s floored to the µs, or the first whole µs after
 * that earlier event's display end when they would overlap (both ended in the
 * same µs; or the earlier one straddles this start and cannot nest: the start
 * is clipped). The end is the measured duration after that start, trimmed to
 * the µs after the measured end: no event ends later than that, so moving
 * one start never moves the events after it. A merged run that s falls inside
 * counts as earlier as a whole: its later members then show as siblings
 * before the event instead of inside it (never a partial overlap). A parent
 * that would coincide with its first child is made 1 ns longer: Perfetto
 * orders equal-ts slices by duration, so equal intervals could swap parent
 * and child. */
static inline __attribute__((always_inline)) void place(dft_ring *r, uint64_t s, uint64_t e, uint64_t *S,
                                                        uint64_t *E) {
    const uint32_t m = r->place_cap - 1;
    uint64_t desc_de = 0, desc_ds = UINT64_MAX;
    while (r->place_n) {
        dft_place_ent *t = &r->place[(r->place_top - 1) & m];
        if (t->ms < s)
            break;
        if (t->de > desc_de)
            desc_de = t->de;
        if (t->ds < desc_ds)
            desc_ds = t->ds;
        r->place_top--;
        r->place_n--;
    }
    uint64_t st = s - s % 1000;
    if (r->place_n) {
        uint64_t c = (r->place[(r->place_top - 1) & m].de + 999) / 1000 * 1000;
        if (c > st)
            st = c;
    }
    /* the measured duration, trimmed to the µs after the measured end (a start moved by an
     * earlier event never moves what follows); a trimmed one is never empty: a slice of length 0
     * at st would sit inside the next one when that starts at st too (Perfetto puts the longer
     * first) */
    uint64_t en = st + (e - s), lim = (e + 999) / 1000 * 1000;
    if (en > lim)
        en = lim > st ? lim : st + (e > s);
    if (desc_de > en)
        en = desc_de;
    if (desc_ds == st && en == desc_de)
        en++;
    place_push(r, s, st, en);
    *S = st;
    *E = en;
}

#define PUT(lit)                                                                            \
    do {                                                                                    \
        memcpy(p, lit, sizeof(lit) - 1);                                                    \
        p += sizeof(lit) - 1;                                                               \
    } while (0)
#define PUTS(ptr, n) (p = put_str(p, ptr, n))

/* Copies of short strings with fixed-size moves: gcc otherwise emits
 * `rep movs`, whose start-up cost dominated formatting (and must not turn
 * the loop back into memcpy). */
#if defined(__GNUC__) && !defined(__clang__)
#define DFT_NO_MEMCPY_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define DFT_NO_MEMCPY_IDIOM
#endif
DFT_NO_MEMCPY_IDIOM static inline __attribute__((always_inline)) char *put_str(char *p, const char *s, size_t n) {
    if (n >= 16) {
        size_t i = 0;
        for (; i + 32 < n; i += 32) {
            memcpy(p + i, s + i, 16);
            memcpy(p + i + 16, s + i + 16, 16);
        }
        if (i + 16 < n)
            memcpy(p + i, s + i, 16);
        memcpy(p + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(p, s, 8);
        memcpy(p + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        memcpy(p, s, 4);
        memcpy(p + n - 4, s + n - 4, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            p[i] = s[i];
    }
    return p + n;
}

/* ,"pid":P,"tid":T into pt (64 bytes: 35 at most, and DFT_FMT_MAX room); its length */
static uint32_t fmt_pidtid(char *pt, uint32_t tid) {
    char *p = pt;
    PUT(",\"pid\":");
    PUTS(dft_w.pid_s, dft_w.pid_len);
    PUT(",\"tid\":");
    return (uint32_t)(dft_fmt_u64(p, tid) - pt);
}

/* {"id":N,"name":..,"cat":..,"pid":P,"tid":T: the start of every line we write
 * (pidtid: from fmt_pidtid) */
/* The text of the last id written: the next one mostly differs in its last digit. */
static struct {
    uint64_t v;
    uint32_t len;
    char s[32];
} id_txt = {0, 1, "0"};

static inline __attribute__((always_inline)) char *put_id(char *p, uint64_t id) {
    if (DFT_LIKELY(id == id_txt.v + 1 && id_txt.s[id_txt.len - 1] != '9'))
        id_txt.s[id_txt.len - 1]++;
    else
        id_txt.len = (uint32_t)(dft_fmt_u64(id_txt.s, id) - id_txt.s);
    id_txt.v = id;
    memcpy(p, id_txt.s, DFT_FMT_MAX);
    return p + id_txt.len;
}

static inline __attribute__((always_inline)) char *put_head(char *p, const char *namecat, size_t len,
                                                            const char *pidtid, size_t pt_len) {
    PUT("{\"id\":");
    p = put_id(p, dft_w.next_id++);
    PUTS(namecat, len);
    PUTS(pidtid, pt_len);
    return p;
}

static char *put_head_tid(char *p, const char *namecat, size_t len, uint32_t tid) {
    char pt[64];
    return put_head(p, namecat, len, pt, fmt_pidtid(pt, tid));
}

/* A step slice's name is its number: "step N", cat step (steps.c). */
static char *put_step_head(char *p, uint32_t n, const char *pidtid, size_t pt_len) {
    static const char pre[] = ",\"name\":\"step ", post[] = "\",\"cat\":\"step\"";
    char nc[48], *q = nc;
    memcpy(q, pre, sizeof pre - 1);
    q = dft_fmt_u64(q + sizeof pre - 1, n);
    memcpy(q, post, sizeof post - 1);
    q += sizeof post - 1;
    return put_head(p, nc, (size_t)(q - nc), pidtid, pt_len);
}

/* An event's ts in µs: since the epoch its first 8 of 16 digits change every
 * 100 s, so they are formatted once. */
static char *put_ts(char *p, uint64_t us) {
    uint64_t hi = us / 100000000;
    if (hi == 0 || hi >= 100000000)
        return dft_fmt_u64(p, us);
    if (hi != dft_w.ts_hi) {
        char t[8];
        dft_w.ts_hi_len = (uint32_t)(dft_put_digits(t, dft_digits8((uint32_t)hi), 8) - t);
        memcpy(dft_w.ts_hi_s, t, 8);
        dft_w.ts_hi = hi;
    }
    memcpy(p, dft_w.ts_hi_s, 8);
    return dft_put8(p + dft_w.ts_hi_len, dft_digits8((uint32_t)(us - hi * 100000000)));
}

/* ..,"ph":"M","args":{"hhash":..,"name":..}}; lane > 0: the name of the
 * thread's lane-th track of timed events, "<thread> (logged[ lane])". */
static int emit_thread_name(dft_ring *r, uint32_t tid, uint32_t lane) {
    dft_buf *b = &dft_w.fmt;
    if (dft_buf_reserve(b, 256 + r->name_len + dft_w.hhash_len) < 0)
        return -1;
    char *p = b->p + b->len;
    static const char nc[] = ",\"name\":\"thread_name\",\"cat\":\"dftracer\"";
    p = put_head_tid(p, nc, sizeof nc - 1, tid);
    PUT(",\"ph\":\"M\",\"args\":{\"hhash\":");
    PUTS(dft_w.hhash_json, dft_w.hhash_len);
    PUT(",\"name\":");
    if (lane) {
        PUTS(r->name_json, r->name_len - 1); /* without the closing quote */
        PUT(" (logged");
        if (lane > 1) {
            *p++ = ' ';
            p = dft_fmt_u64(p, lane);
        }
        PUT(")\"");
    } else {
        PUTS(r->name_json, r->name_len);
    }
    PUT("}}\n");
    b->len = (size_t)(p - b->p);
    return 0;
}

/* Every thread's names (a flight dump's, whose members hold no earlier ones). */
void dft_writer_names(void) {
    for (dft_ring *r = atomic_load(&dft_rings); r; r = atomic_load(&r->next)) {
        (void)emit_thread_name(r, r->tid, 0);
        for (uint32_t k = 0; k < r->n_lanes && r->place_gen == dft_w.gen; k++)
            (void)emit_thread_name(r, r->tid + ((k + 1) << 22), k + 1);
    }
}

/* ---- events timed by the caller ---------------------------------------------
 * log_event gives its own start and duration, in no particular order with
 * the thread's other events, and spans still open on the thread are unknown
 * here: placing it among them could move them. Such an event keeps its times
 * (start rounded down to the µs, exact duration) on a separate track of its
 * thread, the first "lane" where it overlaps nothing partially. A lane keeps
 * up to LANE_IV disjoint intervals; past that the two closest merge into one
 * (later events then avoid the gap between them: never an overlap). */
#define LANE_IV 64
#define LANE_MAX 256 /* tid + lane << 22 stays below 2^32 (pid_max <= 2^22) */
struct dft_lane {
    uint64_t named_gen;
    uint32_t n;
    uint64_t iv[LANE_IV + 1][2]; /* display [start, end] in ns, sorted, disjoint */
};

/* Disjoint from each interval, or containing it whole (a parent). */
static int lane_fits(const struct dft_lane *l, uint64_t S, uint64_t E) {
    for (uint32_t i = 0; i < l->n; i++) {
        uint64_t a = l->iv[i][0], b = l->iv[i][1];
        if (!(E <= a || S >= b || (S <= a && b <= E)))
            return 0;
    }
    return 1;
}

static void lane_add(struct dft_lane *l, uint64_t S, uint64_t E) {
    uint32_t k = 0, at;
    for (uint32_t i = 0; i < l->n; i++) /* drop the intervals it contains */
        if (!(S <= l->iv[i][0] && l->iv[i][1] <= E)) {
            l->iv[k][0] = l->iv[i][0];
            l->iv[k++][1] = l->iv[i][1];
        }
    for (at = k; at && l->iv[at - 1][0] > S; at--) {
        l->iv[at][0] = l->iv[at - 1][0];
        l->iv[at][1] = l->iv[at - 1][1];
    }
    l->iv[at][0] = S;
    l->iv[at][1] = E;
    l->n = k + 1;
    if (l->n <= LANE_IV)
        return;
    uint32_t best = 0;
    for (uint32_t i = 1; i + 1 < l->n; i++)
        if (l->iv[i + 1][0] - l->iv[i][1] < l->iv[best + 1][0] - l->iv[best][1])
            best = i;
    if (l->iv[best + 1][1] > l->iv[best][1])
        l->iv[best][1] = l->iv[best + 1][1];
    memmove(l->iv[best + 1], l->iv[best + 2], (l->n - best - 2) * sizeof l->iv[0]);
    l->n--;
}

/* Display interval and track (tid) of a timed event; -1: out of memory. */
static int place_timed(dft_ring *r, uint64_t s, uint64_t e, uint64_t *S, uint64_t *E, uint32_t *tid) {
    *S = s - s % 1000;
    *E = *S + (e - s);
    uint32_t k = 0;
    while (k < r->n_lanes && !lane_fits(&r->lanes[k], *S, *E))
        k++;
    if (k == r->n_lanes) {
        if (k == LANE_MAX) { /* never seen in practice: share the last lane */
            k--;
        } else {
            struct dft_lane *n = realloc(r->lanes, (k + 1) * sizeof *n);
            if (!n)
                return -1;
            r->lanes = n;
            memset(&n[k], 0, sizeof n[k]);
            r->n_lanes++;
        }
    }
    struct dft_lane *l = &r->lanes[k];
    *tid = r->tid + ((k + 1) << 22);
    if (l->named_gen != dft_w.gen) {
        if (emit_thread_name(r, *tid, k + 1) < 0)
            return -1;
        l->named_gen = dft_w.gen;
    }
    lane_add(l, *S, *E);
    return 0;
}

/* The step (tag: step + 1) of an event, formatted once per step. */
static char *put_step(char *p, uint32_t tag) {
    if (tag != dft_w.step_tag) {
        dft_w.step_len = (uint32_t)(dft_fmt_u64(dft_w.step_s, tag - 1) - dft_w.step_s);
        dft_w.step_tag = tag;
    }
    memcpy(p, dft_w.step_s, 16); /* 10 digits at most */
    return p + dft_w.step_len;
}

/* Hints for the own gzip encoder: where each event line of the member being
 * built has its id, ts and dur (deflate.h). */
static struct {
    dft_line_hint *h;
    uint32_t n, cap;
} hints;

static void hint_line(uint64_t key, uint64_t fam, uint64_t cls, const char *line, const char *const f[6], const char *end) {
    if (DFT_UNLIKELY(hints.n == hints.cap)) {
        uint32_t cap = hints.cap ? hints.cap * 2 : 1024;
        dft_line_hint *h = realloc(hints.h, cap * sizeof *h);
        if (!h)
            return; /* the line goes without */
        hints.h = h;
        hints.cap = cap;
    }
    if (DFT_UNLIKELY(f[5] - line > 65535))
        return;
    dft_line_hint *h = &hints.h[hints.n++];
    h->key = key;
    h->fam = fam;
    h->cls = cls;
    h->at = (uint32_t)(line - dft_w.fmt.p);
    h->len = (uint32_t)(end - line);
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
        h->f[i] = (uint16_t)(f[i] - line);
}

/* Offset + 1 of the aggregate record in the member being built (the encoder's
 * dft_deflate_record); 0: none. */
static size_t record_at;
static uint32_t record_crc; /* of the text before it */
static dft_record_copy record_copy;

/* The aggregate record: a checkpoint's, or the last one (at close). */
static void write_record(int last) {
    size_t at = dft_w.fmt.len;
    uint32_t crc = dft_agg_write(&dft_w.fmt, last, &record_copy);
    if (dft_w.fmt.len > at) {
        record_at = at + 1;
        record_crc = crc;
    }
}

static const char *const phase_txt[8] = {"", ",\"phase\":\"forward\"", ",\"phase\":\"backward\"",
                                         ",\"phase\":\"inference\"", ",\"phase\":\"optimizer\"",
                                         "", "", ""};
static const uint8_t phase_len[8] = {0, 18, 19, 20, 20, 0, 0, 0};

/* ,"ph":"X","args":{..}}\n: the end of an event's line (not a counter's). */
static char *put_tail(char *p, const dft_rec *x, const dft_site *site, const dft_str *tags, const char *extra,
                      size_t extra_len) {
    PUT(",\"ph\":\"X\",\"args\":{\"hhash\":");
    PUTS(dft_w.hhash_json, dft_w.hhash_len);
    PUTS(site->args.p, site->args.len);
    if (tags)
        PUTS(tags->p, tags->len);
    if (extra_len)
        PUTS(extra, extra_len);
    if (x->step && !(x->flags & DFT_FLAG_NOSTEP)) {
        PUT(",\"step\":");
        p = put_step(p, x->step);
    }
    if (!(x->flags & DFT_FLAG_NOCTX)) {
        PUT(",\"grad_enabled\":");
        *p++ = (x->flags & DFT_FLAG_GRAD) ? '1' : '0';
        unsigned ph = (x->flags & DFT_PHASE_MASK) >> DFT_PHASE_SHIFT;
        PUTS(phase_txt[ph], phase_len[ph]);
    }
    if (x->flags & DFT_FLAG_FAILED)
        PUT(",\"failed\":1");
    PUT("}}\n");
    return p;
}

/* The tail of an interned site's event depends only on the file (hhash), the
 * site, its tags' text, its flags and its step: it is formatted once per
 * combination and copied. Lines that copied one tail text, of one track,
 * differ only in their id, ts and dur (the encoder's hints rely on it). */
#define TAIL_SLOTS 16384u /* by site id */
#define TAIL_TEXT 240u
#define TAIL_TAGS 64u
typedef struct {
    uint64_t gen; /* file generation it was made for; 0: none */
    uint32_t site, tags, flags, step, tlen, len;
    uint32_t serial; /* of this text: a new one each time the entry is made */
    uint64_t fam;    /* of the site's name and category text (the encoder's fam, with the track) */
    uint64_t cls;    /* of its category and this text (the encoder's cls, with the track): lines of one
                      * cls differ in their name, id, ts and dur (module slices of one type) */
    char tcopy[TAIL_TAGS]; /* the tags' text: an owned tags id may be reused with other text */
    char text[TAIL_TEXT];
} tail_t;
static tail_t *tails;
static uint32_t tail_serial;
static dft_buf tail_scratch;

static uint64_t fnv1a(uint64_t h, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

static __attribute__((noinline)) const tail_t *tail_make(const dft_rec *x, const dft_site *site, const dft_str *tags) {
    uint32_t tlen = tags ? tags->len : 0;
    if (!tails && !(tails = calloc(TAIL_SLOTS, sizeof *tails)))
        return NULL;
    tail_t *t = &tails[x->site & (TAIL_SLOTS - 1)];
    t->gen = 0;
    if (tlen > TAIL_TAGS || dft_buf_reserve(&tail_scratch, 256 + dft_w.hhash_len + site->args.len + tlen) < 0)
        return NULL;
    char *p = put_tail(tail_scratch.p, x, site, tags, NULL, 0);
    size_t len = (size_t)(p - tail_scratch.p);
    if (len > TAIL_TEXT)
        return NULL;
    memcpy(t->text, tail_scratch.p, len);
    if (tlen)
        memcpy(t->tcopy, tags->p, tlen);
    t->site = x->site, t->tags = x->tags, t->flags = x->flags, t->step = x->step;
    t->tlen = tlen, t->len = (uint32_t)len, t->serial = ++tail_serial;
    t->fam = fnv1a(0xcbf29ce484222325ull, site->namecat.p, site->namecat.len);
    /* ,"name":"..","cat":"..": a quote inside the name is escaped */
    const char *cat = memmem(site->namecat.p, site->namecat.len, "\",\"cat\":", 8);
    t->cls = cat ? fnv1a(fnv1a(0xcbf29ce484222325ull, cat, site->namecat.len - (size_t)(cat - site->namecat.p)),
                         t->text, len)
                 : t->fam;
    t->gen = dft_w.gen;
    return t;
}

/* tags' text is the tlen bytes at a (no libc call: most tags are short) */
static inline int same_text(const char *a, const dft_str *tags, uint32_t n) {
    const char *b = n ? tags->p : NULL;
    uint64_t x, y;
    for (; n >= 8; n -= 8, a += 8, b += 8) {
        memcpy(&x, a, 8), memcpy(&y, b, 8);
        if (x != y)
            return 0;
    }
    for (; n; n--)
        if (*a++ != *b++)
            return 0;
    return 1;
}

static inline const tail_t *tail_get(const dft_rec *x, const dft_site *site, const dft_str *tags) {
    const tail_t *t = tails ? &tails[x->site & (TAIL_SLOTS - 1)] : NULL;
    uint32_t tlen = tags ? tags->len : 0;
    if (DFT_LIKELY(t && t->gen == dft_w.gen && t->site == x->site && t->tags == x->tags && t->flags == x->flags &&
                   t->step == x->step && t->tlen == tlen && same_text(t->tcopy, tags, tlen)))
        return t;
    return tail_make(x, site, tags);
}

static int emit_event(dft_ring *r, const dft_rec *x) {
    dft_buf *b = &dft_w.fmt;
    const dft_site *site = dft_tab_get(&dft_sites, x->site);
    const dft_str *tags = x->tags ? dft_tab_get(&dft_tags, x->tags) : NULL;
    dft_str namecat = site->namecat;
    const char *extra = x->extra;
    if (!x->site && extra) { /* namecat \0 args \0 (dft_extra_text; a step slice's namecat is empty) */
        namecat.p = extra;
        namecat.len = (uint32_t)strlen(extra);
        extra += namecat.len + 1;
    }
    size_t extra_len = extra ? strlen(extra) : 0;
    size_t need = 256 + namecat.len + site->args.len + dft_w.hhash_len + extra_len +
                  (tags ? tags->len : 0);
    uint64_t s = x->start, e = x->end > x->start ? x->end : x->start, S = 0, E = 0;
    uint32_t tid = r->tid;
    /* place_timed may write a thread name first; place() only once the line fits */
    if (DFT_UNLIKELY(x->flags & DFT_FLAG_TIMED) && place_timed(r, s, e, &S, &E, &tid) < 0)
        return -1;
    if (dft_buf_reserve(b, need) < 0)
        return -1;
    if (DFT_UNLIKELY(x->flags & DFT_FLAG_COUNTER))
        S = E = s; /* a sample, not placed */
    else if (DFT_LIKELY(!(x->flags & DFT_FLAG_TIMED)))
        place(r, s, e, &S, &E);

    char pt_lane[64], *pt = r->pidtid;
    uint32_t pt_len = r->pidtid_len;
    if (DFT_UNLIKELY(tid != r->tid)) /* a lane of timed events */
        pt_len = fmt_pidtid(pt = pt_lane, tid);
    char *p = b->p + b->len, *line = p;
    const char *f[6]; /* id, ts, dur: start and end of each */
    if (DFT_UNLIKELY(x->flags & DFT_FLAG_STEP))
        p = put_step_head(p, x->step - 1, pt, pt_len);
    else
        p = put_head(p, namecat.p, namecat.len, pt, pt_len);
    PUT(",\"ts\":");
    f[0] = line + 6; /* {"id": */
    f[1] = p - 6 - pt_len - namecat.len; /* for a step slice: unused */
    f[2] = p;
    p = put_ts(p, S / 1000);
    f[3] = p;
    PUT(",\"dur\":");
    f[4] = p;
    p = dft_fmt_us(p, E - S);
    f[5] = p;
    const tail_t *t = NULL;
    if (DFT_UNLIKELY(x->flags & DFT_FLAG_COUNTER)) {
        /* Perfetto reads every arg of a counter as a series: numbers only, no hhash/step */
        PUT(",\"ph\":\"C\",\"args\":{");
        if (extra_len)
            PUTS(extra + 1, extra_len - 1); /* its leading comma */
        PUT("}}\n");
    } else if (x->site && !x->extra && !(x->flags & DFT_FLAG_STEP) && (t = tail_get(x, site, tags))) {
        PUTS(t->text, t->len);
    } else {
        p = put_tail(p, x, site, tags, extra, extra_len);
    }
    b->len = (size_t)(p - b->p);
    if (t && dft_w.sink.dfl)
        hint_line((uint64_t)t->serial << 32 | tid, t->fam ^ tid, t->cls ^ tid, line, f, p);
    dft_agg_event(x, line, (size_t)(p - line), S, E - S);
    dft_w.written++;
    dft_w.member_events++;
    return 0;
}

static void emit_end(uint64_t dropped);

/* A member could not be written (disk full, file size limit, I/O error, file
 * deleted): the file is cut back to its last whole member (plain text: its
 * last whole line) and closed with the end record
 * where that still fits; writing stops and one line on stderr says what
 * happened. Events go on being taken, and discarded (counted as dropped), so
 * that close() accounts for every event recorded, before the failure or after. */
static void write_failed(void) {
    dft_sink *k = &dft_w.sink;
    int err = k->err;
    dft_w.failed = 1;
    /* the member's events are lost, but for those in the whole lines kept (plain text: one
     * "ph" each, thread names "M"; a quote inside a string is escaped); a deleted file loses
     * them all */
    uint64_t gone = dft_w.member_events;
    for (const char *q = dft_w.fmt.p, *e = q + k->kept; (q = memmem(q, (size_t)(e - q), "\"ph\":\"", 6));
         q += 6)
        gone -= q[6] != 'M';
    if (err == ENOENT)
        gone = dft_w.written;
    dft_w.written -= gone;
    atomic_fetch_add(&dft_w.dropped, gone);
    dft_w.member_events = 0;
    dft_w.fmt.len = 0;
    hints.n = 0;
    record_at = 0;
    dft_w.hold = 0;
    dft_sink_cut(k);
    uint64_t pushed, pending;
    dft_rings_counts(&pushed, &pending);
    uint64_t lost = pushed - dft_w.pushed_base - dft_w.written; /* all not in the file */
    if (!k->cut_err) {
        k->err = 0;
        if (!dft_w.end_ts)
            dft_w.end_ts = dft_now();
        if (!k->good && dft_buf_reserve(&dft_w.fmt, 2) == 0) /* '[' was in the failed member */
            dft_buf_put(&dft_w.fmt, "[\n", 2);
        emit_end(lost);
        if (dft_sink_write(k, dft_w.fmt.p, dft_w.fmt.len) < 0)
            dft_sink_cut(k);
        dft_w.fmt.len = 0;
    }
    dprintf(2, "dftrace_dynamo: cannot write the trace file %s: %s; tracing stopped, the file keeps "
               "%llu events (%llu lost so far; later events are lost too, finalize() counts them all)%s\n",
            dft_w.path, strerror(err), (unsigned long long)dft_w.written, (unsigned long long)lost,
            k->cut_err ? " but could not be cut back to its last whole part" : "");
}

static void end_member(void) {
    size_t rec = record_at;
    record_at = 0;
    dft_w.last_member_ns = dft_mono();
    if (dft_w.fmt.len <= dft_w.hold)
        return;
    if (dft_w.sink.dfl) {
        dft_deflate_hints(dft_w.sink.dfl, hints.h, hints.n);
        if (rec)
            dft_deflate_record(dft_w.sink.dfl, rec - 1, record_crc, &record_copy);
    }
    int rc = dft_flight_on ? dft_flight_keep(&dft_w.sink, dft_w.fmt.p, dft_w.fmt.len, dft_w.member_events)
                           : dft_sink_write(&dft_w.sink, dft_w.fmt.p, dft_w.fmt.len);
    if (dft_w.sink.dfl)
        dft_deflate_hints(dft_w.sink.dfl, NULL, 0);
    hints.n = 0;
    if (rc < 0) {
        write_failed();
        return;
    }
    dft_w.member_events = 0;
    dft_w.fmt.len = 0;
    dft_w.hold = 0;
}

/* Up to the head seen on entry: a producer as fast as the writer must not
 * keep it on one ring (other rings, member timing and stop wait meanwhile). */
static void drain_ring(dft_ring *r) {
    if (r->place_gen != dft_w.gen) {
        r->place_gen = dft_w.gen;
        r->pidtid_len = fmt_pidtid(r->pidtid, r->tid); /* the file's pid */
        r->place_n = 0;
        free(r->lanes);
        r->lanes = NULL;
        r->n_lanes = 0;
    }
    uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    if (t != h && r->named_gen != dft_w.gen && !dft_w.failed) {
        if (emit_thread_name(r, r->tid, 0) == 0)
            r->named_gen = dft_w.gen;
    }
    while (t != h) {
        uint64_t stop = h - t > DRAIN_BATCH ? t + DRAIN_BATCH : h;
        for (; t != stop; t++) {
            dft_rec *x = &r->buf[t & r->mask];
            if (DFT_UNLIKELY(dft_flight_on) && x->step != dft_flight_tag) { /* a member per step */
                end_member();
                dft_flight_tag = x->step;
            }
            if (x->flags & DFT_FLAG_TICKS) {
                dft_clock_ns(&x->start, &x->end);
                x->flags &= ~DFT_FLAG_TICKS;
            }
            if (dft_w.failed || emit_event(r, x) < 0)
                atomic_fetch_add(&dft_w.dropped, 1);
            if (x->extra)
                free(x->extra);
            if (dft_w.fmt.len >= MEMBER_BYTES)
                end_member();
        }
        /* hand space back early so a waiting producer can go on */
        atomic_store_explicit(&r->tail, t, memory_order_seq_cst);
        if (atomic_load(&dft_w.waiters)) {
            pthread_mutex_lock(&dft_w.mu);
            pthread_cond_broadcast(&dft_w.cv_space);
            pthread_mutex_unlock(&dft_w.mu);
        }
    }
}

_Atomic uint64_t dft_pass_begun, dft_pass_done;

/* Drain every ring; free the rings of exited threads once empty. A pass
 * covers every event pushed before it began: the fence pairs with the one in
 * dft_tags_release, so tags released before the pass are unused after it. */
static void drain_all(void) {
    uint64_t pass = atomic_load_explicit(&dft_pass_begun, memory_order_relaxed) + 1;
    atomic_store(&dft_pass_begun, pass);
    atomic_thread_fence(memory_order_seq_cst);
    dft_ring *prev = NULL;
    dft_ring *r = atomic_load_explicit(&dft_rings, memory_order_acquire);
    while (r) {
        int dead = atomic_load_explicit(&r->dead, memory_order_acquire);
        drain_ring(r);
        dft_ring *next = atomic_load_explicit(&r->next, memory_order_relaxed);
        if (dead) {
            pthread_mutex_lock(&dft_list_mu);
            if (prev)
                atomic_store(&prev->next, next);
            else if (atomic_load(&dft_rings) == r)
                atomic_store(&dft_rings, next);
            else { /* a ring was prepended meanwhile: find our predecessor */
                dft_ring *q = atomic_load(&dft_rings);
                while (atomic_load(&q->next) != r)
                    q = atomic_load(&q->next);
                atomic_store(&q->next, next);
            }
            dft_ring_retire(r);
            pthread_mutex_unlock(&dft_list_mu);
        } else {
            prev = r;
        }
        r = next;
    }
    atomic_store_explicit(&dft_pass_done, pass, memory_order_release);
}

/* The end event sits on the closing thread, placed after its last event. */
static void emit_end(uint64_t dropped) {
    uint64_t S = dft_w.end_ts - dft_w.end_ts % 1000, E;
    for (dft_ring *q = atomic_load(&dft_rings); q; q = atomic_load(&q->next))
        if (q->tid == dft_w.end_tid && q->place_gen == dft_w.gen)
            place(q, dft_w.end_ts, dft_w.end_ts, &S, &E);
    dft_buf *b = &dft_w.fmt;
    if (dft_buf_reserve(b, 512 + dft_w.hhash_len) < 0)
        return;
    char *p = b->p + b->len;
    static const char nc[] = ",\"name\":\"end\",\"cat\":\"dftracer\"";
    p = put_head_tid(p, nc, sizeof nc - 1, dft_w.end_tid);
    PUT(",\"ts\":");
    p = dft_fmt_u64(p, S / 1000);
    PUT(",\"dur\":0,\"ph\":\"X\",\"args\":{\"hhash\":");
    PUTS(dft_w.hhash_json, dft_w.hhash_len);
    PUT(",\"num_events\":");
    p = dft_fmt_u64(p, dft_w.written);
    PUT(",\"dropped\":");
    p = dft_fmt_u64(p, dropped);
    PUT("}}\n]\n");
    b->len = (size_t)(p - b->p);
}

static void *writer_main(void *arg) {
    prctl(PR_SET_NAME, "dftrace-writer");
    for (;;) {
        pthread_mutex_lock(&dft_w.mu);
        if (!atomic_load(&dft_w.kick) && !dft_w.stop && dft_w.flush_req == dft_w.flush_done)
            dft_cond_wait_ns(&dft_w.cv_wake, &dft_w.mu, (long)WAKE_NS);
        int stop = dft_w.stop;
        uint64_t req = dft_w.flush_req;
        pthread_mutex_unlock(&dft_w.mu);
        atomic_store(&dft_w.kick, 0);

        dft_clock_update(0);
        drain_all();
        if (stop) {
            if (dft_flight_on) {
                end_member();
                dft_flight_close();
            } else if (!dft_w.failed) {
                write_record(1);
            }
            if (!dft_w.failed) {
                emit_end(atomic_load(&dft_w.dropped));
                end_member();
            }
            pthread_mutex_lock(&dft_w.mu); /* a flush() racing with close() returns */
            dft_w.flush_done = dft_w.flush_req;
            pthread_cond_broadcast(&dft_w.cv_done);
            pthread_mutex_unlock(&dft_w.mu);
            break;
        }
        if (!dft_w.failed && !dft_flight_on && dft_agg_tick()) { /* a checkpoint ends its member */
            write_record(0);
            end_member();
        }
        uint64_t age = dft_mono() - dft_w.last_member_ns;
        if (req != dft_w.flush_done ||
            (dft_w.fmt.len && age >= MEMBER_NS && (dft_w.fmt.len >= MEMBER_MIN || age >= MEMBER_MAX_NS)))
            end_member();
        if (req != dft_w.flush_done) {
            dft_flight_serve(req);
            pthread_mutex_lock(&dft_w.mu);
            dft_w.flush_done = req;
            pthread_cond_broadcast(&dft_w.cv_done);
            pthread_mutex_unlock(&dft_w.mu);
        }
    }
    return NULL;
}

/* A forked child: the writer thread's own state may have been mid-update at fork(), so it is
 * dropped (leaked), not freed or reused. */
void dft_writer_forget(void) {
    memset(&hints, 0, sizeof hints);
    memset(&tail_scratch, 0, sizeof tail_scratch);
    id_txt.v = 0;
    id_txt.len = 1;
    id_txt.s[0] = '0';
}

/* flush_req/flush_done keep counting across files: a flush() that raced
 * with close() may still be waiting and is served by the next writer. */
int dft_writer_start(void) {
    dft_w.stop = 0;
    hints.n = 0; /* a forked child's file starts without its parent's */
    /* room for a whole member now, not by copying doublings while events flow (untouched
     * pages cost no memory); a failure here only means growing later */
    (void)dft_buf_reserve(&dft_w.fmt, MEMBER_BYTES + (64u << 10));
    if (dft_w.sink.dfl) /* and for its gzip member */
        (void)dft_buf_reserve(&dft_w.sink.out, dft_gzip_bound(MEMBER_BYTES + (64u << 10)));
    dft_w.last_member_ns = dft_mono();
    /* signals belong to Python's main thread: the writer is born with all of them blocked,
     * with no instant (before its first instruction runs) in which it could take one */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &previous);
    int failed = pthread_create(&dft_w.thread, NULL, writer_main, NULL) != 0;
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (failed)
        return -1;
    pthread_mutex_lock(&dft_w.mu);
    dft_w.running = 1;
    pthread_mutex_unlock(&dft_w.mu);
    return 0;
}

void dft_writer_stop(void) {
    pthread_mutex_lock(&dft_w.mu);
    dft_w.stop = 1;
    pthread_cond_signal(&dft_w.cv_wake);
    pthread_mutex_unlock(&dft_w.mu);
    pthread_join(dft_w.thread, NULL);
    pthread_mutex_lock(&dft_w.mu);
    dft_w.running = 0;
    pthread_cond_broadcast(&dft_w.cv_done);
    pthread_mutex_unlock(&dft_w.mu);
}

void dft_writer_flush(void) {
    pthread_mutex_lock(&dft_w.mu);
    uint64_t req = ++dft_w.flush_req;
    pthread_cond_signal(&dft_w.cv_wake);
    while (dft_w.flush_done < req && dft_w.running)
        pthread_cond_wait(&dft_w.cv_done, &dft_w.mu);
    pthread_mutex_unlock(&dft_w.mu);
}
