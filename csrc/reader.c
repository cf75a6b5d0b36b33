/* The full scan's reader (traces/scan.py): trace lines to columns, with no Python
 * object per event.
 *
 * A Scanner takes the text of one trace file (plain chunks, or whole gzip members it
 * inflates itself: libdeflate when the system has it, zlib otherwise) and splits it
 * into lines. A line that is one JSON object whose fields have the plain forms the
 * writers produce (strings, canonical integers, decimals, true/false/null; containers
 * only where no field is read) becomes a row: numeric columns (pid, tid, ts, dur,
 * args.step) and a *site*, the id of its combination of text fields (ph, cat, name and
 * the args fields asked for), kept once. Any other line (a '[' or ']', an escape this
 * reader does not decode, a number it cannot convert exactly, a wrong type, a broken
 * or overlong line) is written as it is to the fallback file, which the general JSON
 * reader reads: a line is never read two ways.
 *
 * Without a fallback file (fallback_fd -1, text mode) nothing is parsed: the file's
 * decoded text is handed back as it is (take_text), for the readers that need every
 * line (validate, merge, convert, split): every command reads a file through the same
 * inflater and the same handling of damaged members.
 *
 * Numbers are converted exactly as a correctly rounded reader does: digits up to 2^53
 * divided by a power of ten (both exact doubles, one rounding), strtod otherwise.
 * A NULL integer is INT64_MIN (no accepted integer has 19 digits), a NULL double NaN
 * (JSON has no NaN). */
#include "core.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define NULL_INT INT64_MIN
#define MAX_ARGS 48        /* args fields a scanner reads */
#define MAX_DEPTH 64       /* containers skipped inside one another */
#define MAX_DIGITS 18      /* digits of an integer, or of a decimal's mantissa, taken here */
#define MEMBER_MAX (64u << 20) /* decompressed bytes of one member inflated in one piece */
#define FALLBACK_FLUSH (1u << 20)

/* ---- inflating whole gzip members ---------------------------------------- */

static struct {
    void *(*alloc)(void);
    int (*gzip)(void *, const void *, size_t, void *, size_t, size_t *, size_t *);
    void (*free)(void *);
} ld;
static pthread_once_t ld_once = PTHREAD_ONCE_INIT;

static void ld_load(void) {
    void *h = dlopen("libdeflate.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    *(void **)&ld.alloc = dlsym(h, "libdeflate_alloc_decompressor");
    *(void **)&ld.gzip = dlsym(h, "libdeflate_gzip_decompress_ex");
    *(void **)&ld.free = dlsym(h, "libdeflate_free_decompressor");
    if (!ld.alloc || !ld.gzip || !ld.free)
        ld.alloc = NULL;
}

/* ---- the scanner ------------------------------------------------------------ */

typedef struct {
    const char *name;
    size_t len;
} key;

typedef struct {
    PyObject_HEAD
    /* configuration */
    key args[MAX_ARGS];
    signed char arg_table[128]; /* ARG_TABLE: index + 1 of the args field of each key hash, 0: none */
    int n_args, present_arg, int_arg, list_arg; /* slot index among args, -1 if none */
    PyObject *names;                             /* keeps the key texts alive */
    char *mark;
    size_t mark_len, mark_limit, max_line;
    int fd;
    void *ldd; /* libdeflate decompressor, NULL: zlib */
    z_stream z;
    int z_ready;
    /* state */
    dft_buf out, carry, fallback;
    /* the text fields of the line being parsed, in the line's order, each as u32 slot index, u32 length
     * and its bytes (absent, JSON null too: not there): the line's site key as it is (why: copying
     * them into a key after the line cost a tenth of the line) */
    dft_buf tmp;
    int skipping; /* inside a line longer than max_line: it goes to the fallback as it streams */
    uint64_t text_bytes, lines, fast_lines, fallback_lines;
    dft_buf mark_line;
    int marked, write_errno;
    /* columns of the rows since the last take() */
    dft_buf c_site, c_pid, c_tid, c_ts, c_dur, c_step;
    size_t rows;
    /* sites: their key bytes one after another, offsets, and a hash table of ids + 1 */
    dft_buf arena, offs;
    uint32_t *table;
    size_t table_cap, n_sites, sent_sites;
    uint64_t seen; /* the slots met in the line being parsed (a field twice goes to the fallback) */
    int step_seen;
} Scanner;

enum { S_PH, S_CAT, S_NAME, S_ARGS }; /* slot indices: args fields from S_ARGS */

static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* ---- JSON pieces: each returns the position after what it read, NULL when the line
 * must go to the fallback ---------------------------------------------------------- */

static inline const char *ws(const char *p, const char *e) {
    /* (one comparison for the usual case: no space, at a byte above it) */
    while (p < e && (unsigned char)*p <= ' ' && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

static int hexv(int c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20; /* lower case */
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int hex4(const char *p, const char *e) {
    if (e - p < 4)
        return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexv((unsigned char)p[i]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/* Length of the valid UTF-8 sequence at p (a byte >= 0x80), 0 when invalid. */
static int utf8_len(const unsigned char *p, const unsigned char *e) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF)
        return e - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (e - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
            return 0;
        if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0)) /* overlong, surrogate */
            return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (e - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90))
            return 0;
        return 4;
    }
    return 0;
}

static void put_utf8(char *o, unsigned cp, int *n) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        *n = 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        *n = 2;
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        *n = 3;
    } else {
        o[0] = (char)(0xF0 | cp >> 18);
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        *n = 4;
    }
}

/* 1 for the bytes a string holds as they are (not '"', '\\', control or non-ASCII) */
static unsigned char plain[256];

static void plain_init(void) {
    for (int c = 0x20; c < 0x80; c++)
        plain[c] = c != '"' && c != '\\';
}

/* A string (p after its opening quote). With out, its decoded bytes are appended
 * (reserved by the caller: a string never decodes longer than its text). Escapes:
 * the JSON ones; \u0000 and lone surrogates go to the fallback. */
static const char *string(const char *p, const char *e, dft_buf *out) {
    char *o = out ? out->p + out->len : NULL;
    for (;;) {
        const char *q = p;
        while (e - q >= 4 && plain[(unsigned char)q[0]] & plain[(unsigned char)q[1]] & plain[(unsigned char)q[2]] &
                                 plain[(unsigned char)q[3]])
            q += 4;
        while (q < e && plain[(unsigned char)*q])
            q++;
        if (o) {
            memcpy(o, p, (size_t)(q - p));
            o += q - p;
        }
        p = q;
        if (p >= e)
            return NULL;
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            if (out)
                out->len = (size_t)(o - out->p);
            return p + 1;
        }
        if (c < 0x20)
            return NULL;
        if (c >= 0x80) {
            int n = utf8_len((const unsigned char *)p, (const unsigned char *)e);
            if (!n)
                return NULL;
            if (o) {
                memcpy(o, p, (size_t)n);
                o += n;
            }
            p += n;
            continue;
        }
        /* backslash */
        if (e - p < 2)
            return NULL;
        char esc = p[1], ch;
        switch (esc) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            int cp = hex4(p + 2, e), n;
            if (cp <= 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                return NULL;
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = e - p >= 6 && p[0] == '\\' && p[1] == 'u' ? hex4(p + 2, e) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return NULL;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            if (o) {
                put_utf8(o, (unsigned)cp, &n);
                o += n;
            }
            continue;
        }
        default:
            return NULL;
        }
        if (o)
            *o++ = ch;
        p += 2;
    }
}

enum { N_FAIL, N_INT, N_DEC };

/* A number in the forms taken here: an integer of up to MAX_DIGITS digits (not -0), or
 * a decimal whose digits are up to MAX_DIGITS; no exponent. N_INT sets *iv, both *dv. */
static const char *number(const char *p, const char *e, int *type, int64_t *iv, double *dv) {
    const char *s = p;
    int neg = p < e && *p == '-';
    p += neg;
    if (p >= e || *p < '0' || *p > '9')
        return NULL;
    uint64_t m = 0;
    unsigned d;
    int digits, frac = 0;
    const char *i = p; /* digits counted from positions: one range test a digit */
    if (*p == '0') {
        p++;
        if (p < e && *p >= '0' && *p <= '9')
            return NULL;
        i = p;
    } else {
        for (; p < e && (d = (unsigned)(unsigned char)*p - '0') < 10; p++)
            m = m * 10 + d;
    }
    digits = (int)(p - i);
    if (p < e && *p == '.') {
        p++;
        const char *f = p;
        for (; p < e && (d = (unsigned)(unsigned char)*p - '0') < 10; p++)
            m = m * 10 + d;
        frac = (int)(p - f);
        digits += frac;
        if (!frac)
            return NULL;
        *type = N_DEC;
    } else {
        *type = N_INT;
    }
    if (digits > MAX_DIGITS || (p < e && (*p == 'e' || *p == 'E')))
        return NULL;
    if (*type == N_INT) {
        if (neg && m == 0)
            return NULL; /* -0: a reader may keep its sign or not */
        *iv = neg ? -(int64_t)m : (int64_t)m;
        *dv = (double)*iv; /* correctly rounded beyond 2^53 too */
    } else if (m <= (1ull << 53)) {
        *dv = (double)m / pow10[frac];
        if (neg)
            *dv = -*dv;
    } else {
        char text[64];
        memcpy(text, s, (size_t)(p - s));
        text[p - s] = 0;
        *dv = strtod(text, NULL);
    }
    return p;
}

static const char *literal(const char *p, const char *e, int *which) {
    if (e - p >= 4 && !memcmp(p, "null", 4)) {
        *which = 0;
        return p + 4;
    }
    if (e - p >= 4 && !memcmp(p, "true", 4)) {
        *which = 1;
        return p + 4;
    }
    if (e - p >= 5 && !memcmp(p, "false", 5)) {
        *which = 2;
        return p + 5;
    }
    return NULL;
}

/* Any value, checked and skipped (containers iteratively, at most MAX_DEPTH deep). */
static const char *skip(const char *p, const char *e) {
    char stack[MAX_DEPTH];
    int depth = 0, t, w;
    int64_t iv;
    double dv;
    for (;;) {
        p = ws(p, e);
        if (p >= e)
            return NULL;
        if (*p == '{' || *p == '[') {
            if (depth == MAX_DEPTH)
                return NULL;
            stack[depth++] = *p;
            p = ws(p + 1, e);
            if (p < e && *p == (stack[depth - 1] == '{' ? '}' : ']')) {
                p++;
                depth--;
                goto after;
            }
            if (stack[depth - 1] == '{')
                goto key;
            continue;
        }
        if (*p == '"')
            p = string(p + 1, e, NULL);
        else if (*p == '-' || (*p >= '0' && *p <= '9'))
            p = number(p, e, &t, &iv, &dv);
        else
            p = literal(p, e, &w);
        if (!p)
            return NULL;
    after:
        for (;;) {
            if (!depth)
                return p;
            p = ws(p, e);
            if (p >= e)
                return NULL;
            if (*p == ',') {
                p++;
                if (stack[depth - 1] == '{')
                    goto key;
                break; /* the next array item */
            }
            if (*p != (stack[depth - 1] == '{' ? '}' : ']'))
                return NULL;
            p++;
            depth--;
        }
        continue;
    key:
        p = ws(p, e);
        if (p >= e || *p != '"' || !(p = string(p + 1, e, NULL)))
            return NULL;
        p = ws(p, e);
        if (p >= e || *p != ':')
            return NULL;
        p++;
    }
}

/* A text field's value: a string, a canonical integer (its text), true/false; null is
 * absent. Sets the slot; NULL for anything else (or a field seen twice). */
enum { T_STRING, T_INT, T_ANY }; /* what a text field may be besides a string: an integer (ph), any scalar */

/* Marks slot i seen in this line and starts its value in s->tmp; 0 when it was seen already. */
static int first(Scanner *s, int i) {
    uint64_t bit = 1ull << i;
    if (s->seen & bit)
        return 0;
    s->seen |= bit;
    uint32_t at = (uint32_t)i;
    memcpy(s->tmp.p + s->tmp.len, &at, 4);
    s->tmp.len += 8; /* the length: by done() */
    return 1;
}

/* Ends the value started at tmp offset h + 8 (its header at h). */
static void done(Scanner *s, size_t h) {
    uint32_t n = (uint32_t)(s->tmp.len - h - 8);
    memcpy(s->tmp.p + h + 4, &n, 4);
}

static const char *text_field(Scanner *s, const char *p, const char *e, int slot, int allow) {
    dft_buf *t = &s->tmp;
    size_t h = t->len;
    if (!first(s, slot))
        return NULL;
    if (*p == '"') {
        p = string(p + 1, e, t);
        if (!p)
            return NULL;
    } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
        int type;
        int64_t iv;
        double dv;
        const char *q = number(p, e, &type, &iv, &dv);
        if (!q || type != N_INT || allow == T_STRING)
            return NULL;
        memcpy(t->p + t->len, p, (size_t)(q - p));
        t->len += (size_t)(q - p);
        p = q;
    } else {
        int w;
        p = literal(p, e, &w);
        if (!p || (w && allow != T_ANY))
            return NULL;
        if (!w) {
            t->len = h; /* null: absent */
            return p;
        }
        memcpy(t->p + t->len, w == 1 ? "true" : "false", w == 1 ? 4 : 5);
        t->len += w == 1 ? 4 : 5;
    }
    done(s, h);
    return p;
}

/* A list of strings (aten_ops), encoded as u32 length + bytes per item; null is absent. */
static const char *list_field(Scanner *s, const char *p, const char *e, int slot) {
    int w;
    dft_buf *t = &s->tmp;
    size_t h = t->len;
    if (!first(s, slot))
        return NULL;
    if (*p != '[') {
        t->len = h; /* null: absent */
        return (p = literal(p, e, &w)) && !w ? p : NULL;
    }
    p = ws(p + 1, e);
    if (p < e && *p == ']') {
        p++;
    } else {
        for (;;) {
            if (p >= e || *p != '"')
                return NULL;
            size_t at = t->len;
            t->len += 4;
            if (!(p = string(p + 1, e, t)))
                return NULL;
            uint32_t n = (uint32_t)(t->len - at - 4);
            memcpy(t->p + at, &n, 4);
            p = ws(p, e);
            if (p < e && *p == ']') {
                p++;
                break;
            }
            if (p >= e || *p != ',')
                return NULL;
            p = ws(p + 1, e);
        }
    }
    done(s, h);
    return p;
}

#define ARG_TABLE 128 /* a power of two above 2 * MAX_ARGS */

static inline unsigned arg_hash(const char *k, size_t n) {
    return n ? ((unsigned)n * 31u + (unsigned char)k[0] * 7u + (unsigned char)k[n - 1]) & (ARG_TABLE - 1) : 0;
}

/* Whether a[0..n) equals b[0..n): inline (why: args keys are a few bytes, a libc call costs more). */
static inline int same(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

static int arg_index(Scanner *s, const char *k, size_t n) {
    for (unsigned at = arg_hash(k, n);; at = (at + 1) & (ARG_TABLE - 1)) {
        int i = s->arg_table[at] - 1;
        if (i < 0 || (s->args[i].len == n && same(s->args[i].name, k, n)))
            return i;
    }
}

/* The args object (p at '{'). */
static const char *args(Scanner *s, const char *p, const char *e, int64_t *step) {
    p = ws(p + 1, e);
    if (p < e && *p == '}')
        return p + 1;
    for (;;) {
        if (p >= e || *p != '"')
            return NULL;
        const char *k = p + 1, *q = k;
        while (q < e && plain[(unsigned char)*q])
            q++;
        if (q >= e || *q != '"') /* an escaped or non-ASCII key: could spell a field read */
            return NULL;
        size_t kn = (size_t)(q - k);
        p = ws(q + 1, e);
        if (p >= e || *p != ':')
            return NULL;
        p = ws(p + 1, e);
        if (p >= e)
            return NULL;
        int i = arg_index(s, k, kn);
        if (i < 0) {
            p = skip(p, e);
        } else if (i == s->int_arg) {
            int type, w;
            double dv;
            if (s->step_seen++)
                return NULL;
            if (*p == 'n') {
                p = literal(p, e, &w);
                if (!p || w)
                    return NULL;
                *step = NULL_INT;
            } else {
                p = number(p, e, &type, step, &dv);
                if (!p || type != N_INT)
                    return NULL;
            }
        } else if (i == s->present_arg) {
            int w;
            const char *v = p;
            size_t h = s->tmp.len;
            if (!first(s, S_ARGS + i) || !(p = skip(p, e)))
                return NULL;
            if (literal(v, e, &w) && w == 0)
                s->tmp.len = h; /* null: absent */
            else
                done(s, h); /* present: its text is not kept */
        } else if (i == s->list_arg) {
            p = list_field(s, p, e, S_ARGS + i);
        } else {
            p = text_field(s, p, e, S_ARGS + i, T_ANY);
        }
        if (!p)
            return NULL;
        p = ws(p, e);
        if (p < e && *p == '}')
            return p + 1;
        if (p >= e || *p != ',')
            return NULL;
        p = ws(p + 1, e);
    }
}

static uint64_t hash(const char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

/* The site id of the text fields just parsed (s->tmp; a new one when unseen), -1 without memory. */
static int64_t site_of(Scanner *s) {
    dft_buf *k = &s->tmp;
    uint64_t h = hash(k->p, k->len);
    size_t mask = s->table_cap - 1, at = (size_t)h & mask;
    const uint64_t *offs = (const uint64_t *)s->offs.p;
    for (uint32_t id; (id = s->table[at]); at = (at + 1) & mask) {
        size_t o = offs[id - 1], len = offs[id] - o;
        if (len == k->len && !memcmp(s->arena.p + o, k->p, len))
            return id - 1;
    }
    if (dft_buf_reserve(&s->arena, k->len) < 0 || dft_buf_reserve(&s->offs, 8) < 0)
        return -1;
    dft_buf_put(&s->arena, k->p, k->len);
    uint64_t end = s->arena.len;
    dft_buf_put(&s->offs, (const char *)&end, 8);
    s->table[at] = (uint32_t)++s->n_sites;
    if (s->n_sites * 2 > s->table_cap) { /* rehash at half full */
        size_t cap = s->table_cap * 2;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t)
            return -1;
        offs = (const uint64_t *)s->offs.p;
        for (size_t id = 1; id <= s->n_sites; id++) {
            size_t a = (size_t)hash(s->arena.p + offs[id - 1], offs[id] - offs[id - 1]) & (cap - 1);
            while (t[a])
                a = (a + 1) & (cap - 1);
            t[a] = (uint32_t)id;
        }
        free(s->table);
        s->table = t;
        s->table_cap = cap;
    }
    return (int64_t)s->n_sites - 1;
}

#define PUSH(col, type, v)                                                                                             \
    do {                                                                                                               \
        type x_ = (v);                                                                                                 \
        memcpy(s->col.p + s->col.len, &x_, sizeof x_);                                                                 \
        s->col.len += sizeof x_;                                                                                       \
    } while (0)

/* One line as a row: 1, 0 when it is not in the forms read here, -1 without memory. */
static int row(Scanner *s, const char *p, const char *e) {
    int64_t pid = NULL_INT, tid = NULL_INT, step = NULL_INT;
    double ts = NAN, dur = NAN;
    int seen = 0, type, w; /* bit per numeric field and args */
    s->tmp.len = 0;
    s->seen = 0;
    s->step_seen = 0;
    /* decoded text is never longer than its JSON, list items take 4 bytes more each, a field 8 */
    if (dft_buf_reserve(&s->tmp, 2 * (size_t)(e - p) + 8 * (size_t)(S_ARGS + s->n_args) + 16) < 0)
        return -1;
    p = ws(p, e);
    if (p >= e || *p != '{')
        return 0;
    p = ws(p + 1, e);
    if (p < e && *p == '}') {
        p++;
        goto end;
    }
    for (;;) {
        if (p >= e || *p != '"')
            return 0;
        const char *k = p + 1, *q = k;
        while (q < e && plain[(unsigned char)*q])
            q++;
        if (q >= e || *q != '"')
            return 0;
        size_t kn = (size_t)(q - k);
        p = ws(q + 1, e);
        if (p >= e || *p != ':')
            return 0;
        p = ws(p + 1, e);
        if (p >= e)
            return 0;
        int field = -1; /* 0 pid 1 tid 2 ts 3 dur 4 args; slots: 10 + slot */
#define IS(lit) (kn == sizeof(lit) - 1 && !memcmp(k, lit, kn))
        if (IS("pid"))
            field = 0;
        else if (IS("tid"))
            field = 1;
        else if (IS("ts"))
            field = 2;
        else if (IS("dur"))
            field = 3;
        else if (IS("args"))
            field = 4;
        else if (IS("ph"))
            field = 10 + S_PH;
        else if (IS("cat"))
            field = 10 + S_CAT;
        else if (IS("name"))
            field = 10 + S_NAME;
#undef IS
        if (field < 0) {
            p = skip(p, e);
        } else if (field >= 10) {
            p = text_field(s, p, e, field - 10, field == 10 + S_PH ? T_INT : T_STRING);
        } else {
            if (seen & (1 << field))
                return 0;
            seen |= 1 << field;
            if (*p == 'n') {
                if (!(p = literal(p, e, &w)) || w)
                    return 0;
            } else if (field == 4) {
                if (*p != '{')
                    return 0;
                p = args(s, p, e, &step);
            } else {
                int64_t iv;
                double dv;
                p = number(p, e, &type, &iv, &dv);
                if (!p || (field < 2 && type != N_INT))
                    return 0;
                if (field == 0)
                    pid = iv;
                else if (field == 1)
                    tid = iv;
                else if (field == 2)
                    ts = dv;
                else
                    dur = dv;
            }
        }
        if (!p)
            return 0;
        p = ws(p, e);
        if (p < e && *p == '}') {
            p++;
            break;
        }
        if (p >= e || *p != ',')
            return 0;
        p = ws(p + 1, e);
    }
end:
    if (ws(p, e) != e)
        return 0;
    int64_t site = site_of(s);
    if (site < 0)
        return -1;
    if (dft_buf_reserve(&s->c_site, 4) < 0 || dft_buf_reserve(&s->c_pid, 8) < 0 || dft_buf_reserve(&s->c_tid, 8) < 0 ||
        dft_buf_reserve(&s->c_ts, 8) < 0 || dft_buf_reserve(&s->c_dur, 8) < 0 || dft_buf_reserve(&s->c_step, 8) < 0)
        return -1;
    PUSH(c_site, int32_t, (int32_t)site);
    PUSH(c_pid, int64_t, pid);
    PUSH(c_tid, int64_t, tid);
    PUSH(c_ts, double, ts);
    PUSH(c_dur, double, dur);
    PUSH(c_step, int64_t, step);
    s->rows++;
    return 1;
}

static int fallback_flush(Scanner *s) {
    if (s->fd < 0) /* text mode: the text waits for take_text() */
        return 0;
    const char *p = s->fallback.p;
    size_t n = s->fallback.len;
    while (n && !s->write_errno) {
        ssize_t w = write(s->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            s->write_errno = errno;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    s->fallback.len = 0;
    return s->write_errno ? -1 : 0;
}

static int fallback_put(Scanner *s, const char *p, size_t n) {
    if (dft_buf_reserve(&s->fallback, n) < 0)
        return -1;
    dft_buf_put(&s->fallback, p, n);
    return s->fallback.len >= FALLBACK_FLUSH ? fallback_flush(s) : 0;
}

/* Whether the caller should take what is held: max_rows rows, or in text mode FALLBACK_FLUSH
 * bytes of text. */
static inline int full(Scanner *s, size_t max_rows) {
    return s->rows >= max_rows || (s->fd < 0 && s->fallback.len >= FALLBACK_FLUSH);
}

/* Whether the mark is still looked for. */
static inline int looking(Scanner *s) { return s->mark && !s->marked && s->text_bytes < s->mark_limit; }

/* Whether the mark is looked for and in p[0..n). */
static inline int holds_mark(Scanner *s, const char *p, size_t n) {
    return looking(s) && memmem(p, n, s->mark, s->mark_len);
}

/* One line (without its newline); marked: it holds the mark. -1 without memory or on a write error. */
static int line(Scanner *s, const char *p, size_t n, int marked) {
    s->lines++;
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r'))
        i++;
    if (i == n) /* a blank line holds no event: nothing for the fallback's reader to skip */
        return 0;
    if (marked && looking(s)) {
        if (dft_buf_reserve(&s->mark_line, n) < 0)
            return -1;
        dft_buf_put(&s->mark_line, p, n);
        s->marked = 1;
    }
    int fast = n <= s->max_line ? row(s, p, p + n) : 0;
    if (fast < 0)
        return -1;
    if (fast) {
        s->fast_lines++;
        return 0;
    }
    s->fallback_lines++;
    return fallback_put(s, p, n) < 0 || fallback_put(s, "\n", 1) < 0 ? -1 : 0;
}

/* Text of the file, in order. */
static int text(Scanner *s, const char *p, size_t n) {
    if (s->fd < 0) { /* text mode: the text as it is, not split (blank lines cost nothing each) */
        s->text_bytes += n;
        return fallback_put(s, p, n);
    }
    const char *e = p + n;
    /* the mark's first place in this text: one search (one per line would cost its set-up each time) */
    const char *hit = looking(s) ? memmem(p, n, s->mark, s->mark_len) : NULL;
    while (p < e) {
        if (*p == '\n' && !s->skipping && !s->carry.len) { /* a run of empty lines, counted at once */
            const char *q = p;
            while (q < e && *q == '\n')
                q++;
            s->lines += (uint64_t)(q - p);
            s->text_bytes += (uint64_t)(q - p);
            p = q;
            continue;
        }
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        if (s->skipping) {
            size_t k = nl ? (size_t)(nl - p) + 1 : (size_t)(e - p);
            if (fallback_put(s, p, k) < 0)
                return -1;
            s->skipping = !nl;
            s->text_bytes += k;
            p += k;
            continue;
        }
        if (!nl) { /* a line that goes on in the next piece */
            size_t k = (size_t)(e - p);
            if (s->carry.len + k > s->max_line) { /* overlong: to the fallback as it streams */
                s->lines++;
                s->fallback_lines++;
                if (fallback_put(s, s->carry.p, s->carry.len) < 0 || fallback_put(s, p, k) < 0)
                    return -1;
                s->carry.len = 0;
                s->skipping = 1;
            } else {
                if (dft_buf_reserve(&s->carry, k) < 0)
                    return -1;
                dft_buf_put(&s->carry, p, k);
            }
            s->text_bytes += k;
            return 0;
        }
        size_t k = (size_t)(nl - p);
        int rc;
        if (s->carry.len) {
            if (dft_buf_reserve(&s->carry, k) < 0)
                return -1;
            dft_buf_put(&s->carry, p, k);
            rc = line(s, s->carry.p, s->carry.len, holds_mark(s, s->carry.p, s->carry.len));
            s->carry.len = 0;
        } else {
            rc = line(s, p, k, hit && hit >= p && hit < nl);
        }
        if (rc < 0)
            return -1;
        s->text_bytes += k + 1;
        p = nl + 1;
    }
    return 0;
}

enum { M_OK, M_STOP, M_NOMEM };

/* Inflates the whole gzip member at in into s->out. */
static int member(Scanner *s, const unsigned char *in, size_t n, size_t *used) {
    if (s->out.cap < (4u << 20) && dft_buf_grow(&s->out, 4u << 20) < 0)
        return M_NOMEM;
    if (s->ldd) {
        for (;;) {
            size_t got = 0;
            int r = ld.gzip(s->ldd, in, n, s->out.p, s->out.cap, used, &got);
            if (r == 0) {
                s->out.len = got;
                return M_OK;
            }
            if (r != 3 || s->out.cap >= MEMBER_MAX) /* 3: insufficient space */
                return M_STOP;
            s->out.len = 0;
            if (dft_buf_grow(&s->out, s->out.cap + 1) < 0)
                return M_NOMEM;
        }
    }
    z_stream *z = &s->z;
    if (!s->z_ready) {
        memset(z, 0, sizeof *z);
        if (inflateInit2(z, 31) != Z_OK)
            return M_NOMEM;
        s->z_ready = 1;
    } else {
        inflateReset(z);
    }
    z->next_in = (unsigned char *)in;
    z->avail_in = n > UINT32_MAX ? UINT32_MAX : (uInt)n;
    s->out.len = 0;
    for (;;) {
        if (s->out.cap - s->out.len < (1u << 16)) {
            if (s->out.cap >= MEMBER_MAX)
                return M_STOP;
            if (dft_buf_grow(&s->out, s->out.cap + 1) < 0)
                return M_NOMEM;
        }
        z->next_out = (unsigned char *)s->out.p + s->out.len;
        z->avail_out = (uInt)(s->out.cap - s->out.len);
        int rc = inflate(z, Z_NO_FLUSH);
        s->out.len = s->out.cap - z->avail_out;
        if (rc == Z_STREAM_END) {
            *used = (size_t)(z->next_in - in);
            return M_OK;
        }
        if (rc != Z_OK && !(rc == Z_BUF_ERROR && z->avail_out == 0))
            return M_STOP;
    }
}

/* ---- Python API -------------------------------------------------------------- */

static int nomem(void) {
    PyErr_NoMemory();
    return -1;
}

static PyObject *written_error(Scanner *s) {
    errno = s->write_errno;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *Scanner_feed(Scanner *s, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = text(s, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    if (rc < 0)
        return s->write_errno ? written_error(s) : (nomem(), NULL);
    Py_RETURN_NONE;
}

static PyObject *Scanner_feed_gzip(Scanner *s, PyObject *args) {
    Py_buffer b;
    Py_ssize_t start, max_rows;
    if (!PyArg_ParseTuple(args, "y*nn", &b, &start, &max_rows))
        return NULL;
    size_t pos = start < 0 ? 0 : (size_t)start, n = (size_t)b.len;
    int rc = M_OK;
    Py_BEGIN_ALLOW_THREADS while (pos < n && !full(s, (size_t)max_rows)) {
        size_t used = 0;
        rc = member(s, (const unsigned char *)b.buf + pos, n - pos, &used);
        if (rc != M_OK)
            break;
        if (text(s, s->out.p, s->out.len) < 0) {
            rc = M_NOMEM;
            break;
        }
        pos += used;
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&b);
    if (rc == M_NOMEM)
        return s->write_errno ? written_error(s) : (nomem(), NULL);
    return Py_BuildValue("nO", (Py_ssize_t)pos, rc == M_STOP ? Py_True : Py_False);
}

static PyObject *Scanner_finish(Scanner *s, PyObject *unused) {
    int rc = 0;
    if (s->carry.len && !s->skipping)
        rc = line(s, s->carry.p, s->carry.len, holds_mark(s, s->carry.p, s->carry.len));
    s->carry.len = 0;
    s->skipping = 0;
    if (rc < 0 || fallback_flush(s) < 0)
        return s->write_errno ? written_error(s) : (nomem(), NULL);
    Py_RETURN_NONE;
}

static PyObject *slot_value(const char *p, int set, uint32_t len) {
    if (set == 1)
        return PyUnicode_DecodeUTF8(p, len, "strict");
    Py_ssize_t count = 0;
    for (const char *q = p, *e = p + len; q < e; count++) {
        uint32_t n;
        memcpy(&n, q, 4);
        q += 4 + n;
    }
    PyObject *items = PyTuple_New(count); /* a tuple: sites are dict keys */
    for (Py_ssize_t i = 0; items && i < count; i++) {
        uint32_t n;
        memcpy(&n, p, 4);
        PyObject *v = PyUnicode_DecodeUTF8(p + 4, n, "strict");
        if (!v)
            Py_CLEAR(items);
        else
            PyTuple_SET_ITEM(items, i, v);
        p += 4 + n;
    }
    return items;
}

/* The sites since the last take(), as tuples (ph, cat, name, args fields...). */
static PyObject *new_sites(Scanner *s) {
    PyObject *out = PyList_New(0);
    const uint64_t *offs = (const uint64_t *)s->offs.p;
    int n = S_ARGS + s->n_args;
    for (size_t id = s->sent_sites; out && id < s->n_sites; id++) {
        const char *p = s->arena.p + offs[id], *e = s->arena.p + offs[id + 1];
        PyObject *t = PyTuple_New(n);
        for (int i = 0; t && i < n; i++) {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(t, i, Py_None);
        }
        while (t && p < e) { /* the fields in their line's order */
            uint32_t i, len;
            memcpy(&i, p, 4);
            memcpy(&len, p + 4, 4);
            PyObject *v = slot_value(p + 8, s->list_arg >= 0 && (int)i == S_ARGS + s->list_arg ? 2 : 1, len);
            p += 8 + len;
            if (!v)
                Py_CLEAR(t);
            else
                Py_SETREF(((PyTupleObject *)t)->ob_item[i], v);
        }
        if (!t || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
    }
    if (out)
        s->sent_sites = s->n_sites;
    return out;
}

static PyObject *column(dft_buf *b) {
    PyObject *o = PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
    b->len = 0;
    return o;
}

static PyObject *Scanner_take(Scanner *s, PyObject *unused) {
    PyObject *sites = new_sites(s);
    if (!sites)
        return NULL;
    PyObject *r = Py_BuildValue("nNNNNNNN", (Py_ssize_t)s->rows, sites, column(&s->c_site), column(&s->c_pid),
                                column(&s->c_tid), column(&s->c_ts), column(&s->c_dur), column(&s->c_step));
    s->rows = 0;
    return r;
}

static PyObject *Scanner_take_text(Scanner *s, PyObject *unused) {
    s->rows = 0;
    return column(&s->fallback);
}

static PyObject *Scanner_get_rows(Scanner *s, void *c) { return PyLong_FromSize_t(s->rows); }
static PyObject *Scanner_get_full(Scanner *s, void *c) { return PyBool_FromLong(full(s, (size_t)-1)); }
static PyObject *Scanner_get_lines(Scanner *s, void *c) {
    return Py_BuildValue("KKK", (unsigned long long)s->lines, (unsigned long long)s->fast_lines,
                         (unsigned long long)s->fallback_lines);
}
static PyObject *Scanner_get_mark(Scanner *s, void *c) {
    if (!s->marked)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(s->mark_line.p ? s->mark_line.p : "", (Py_ssize_t)s->mark_line.len);
}
static PyObject *Scanner_get_inflater(Scanner *s, void *c) {
    return PyUnicode_FromString(s->ldd ? "libdeflate" : "zlib");
}

static int Scanner_init(Scanner *s, PyObject *a, PyObject *kw) {
    static char *kwlist[] = {"fallback_fd", "args", "present", "integer", "listed", "mark", "mark_limit",
                             "max_line", "inflater", NULL};
    PyObject *names, *present = Py_None, *integer = Py_None, *listed = Py_None;
    const char *mark = NULL, *inflater = "auto";
    Py_ssize_t mark_len = 0, mark_limit = PY_SSIZE_T_MAX, max_line = 16 << 20;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "iO!|OOOz#nns", kwlist, &s->fd, &PyTuple_Type, &names, &present,
                                     &integer, &listed, &mark, &mark_len, &mark_limit, &max_line, &inflater))
        return -1;
    if (PyTuple_GET_SIZE(names) > MAX_ARGS) {
        PyErr_SetString(PyExc_ValueError, "too many args fields");
        return -1;
    }
    Py_XSETREF(s->names, Py_NewRef(names));
    memset(s->arg_table, 0, sizeof s->arg_table);
    s->n_args = (int)PyTuple_GET_SIZE(names);
    s->present_arg = s->int_arg = s->list_arg = -1;
    for (int i = 0; i < s->n_args; i++) {
        PyObject *k = PyTuple_GET_ITEM(names, i);
        Py_ssize_t n;
        const char *t = PyUnicode_Check(k) ? PyUnicode_AsUTF8AndSize(k, &n) : NULL;
        if (!t) {
            PyErr_SetString(PyExc_TypeError, "args fields are str");
            return -1;
        }
        s->args[i] = (key){t, (size_t)n};
        unsigned at = arg_hash(t, (size_t)n);
        while (s->arg_table[at])
            at = (at + 1) & (ARG_TABLE - 1);
        s->arg_table[at] = (signed char)(i + 1);
        if (PyObject_RichCompareBool(k, present, Py_EQ) == 1)
            s->present_arg = i;
        if (PyObject_RichCompareBool(k, integer, Py_EQ) == 1)
            s->int_arg = i;
        if (PyObject_RichCompareBool(k, listed, Py_EQ) == 1)
            s->list_arg = i;
    }
    free(s->mark);
    s->mark = NULL;
    if (mark && mark_len) {
        if (!(s->mark = malloc((size_t)mark_len)))
            return nomem();
        memcpy(s->mark, mark, (size_t)mark_len);
    }
    s->mark_len = (size_t)mark_len;
    s->mark_limit = (size_t)mark_limit;
    s->max_line = (size_t)max_line;
    pthread_once(&ld_once, ld_load);
    if (!plain['a'])
        plain_init();
    if (!s->ldd && ld.alloc && strcmp(inflater, "zlib") != 0)
        s->ldd = ld.alloc();
    if (!s->table) {
        s->table_cap = 1024;
        if (!(s->table = calloc(s->table_cap, sizeof *s->table)) || dft_buf_reserve(&s->offs, 8) < 0)
            return nomem();
        uint64_t zero = 0;
        dft_buf_put(&s->offs, (const char *)&zero, 8);
    }
    return 0;
}

static void Scanner_dealloc(Scanner *s) {
    dft_buf *bufs[] = {&s->out, &s->carry, &s->tmp, &s->fallback, &s->c_site, &s->c_pid,
                       &s->c_tid, &s->c_ts, &s->c_dur, &s->c_step, &s->arena, &s->offs, &s->mark_line};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dft_buf_free(bufs[i]);
    if (s->ldd)
        ld.free(s->ldd);
    if (s->z_ready)
        inflateEnd(&s->z);
    free(s->table);
    free(s->mark);
    Py_XDECREF(s->names);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Scanner_methods[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_O, "feed(text): the file's next decompressed bytes."},
    {"feed_gzip", (PyCFunction)Scanner_feed_gzip, METH_VARARGS,
     "feed_gzip(data, start, max_rows) -> (stop, failed): inflates and reads the whole gzip members of data from "
     "start until max_rows rows are held; stop: where it stopped; failed: the member there is incomplete, corrupt "
     "or too large to inflate in one piece."},
    {"finish", (PyCFunction)Scanner_finish, METH_NOARGS,
     "finish(): the last line (without newline); flushes the fallback."},
    {"take", (PyCFunction)Scanner_take, METH_NOARGS,
     "take() -> (rows, new sites, site, pid, tid, ts, dur, step): the rows since the last take, as native columns "
     "(int32, int64, int64, float64, float64, int64; NULL: INT64_MIN or NaN)."},
    {"take_text", (PyCFunction)Scanner_take_text, METH_NOARGS,
     "take_text() -> bytes: in text mode (fallback_fd -1), the decoded text since the last take_text, as it is."},
    {NULL},
};

static PyGetSetDef Scanner_getset[] = {
    {"rows", (getter)Scanner_get_rows, NULL, "rows held since the last take()", NULL},
    {"text_full", (getter)Scanner_get_full, NULL, "text mode: a megabyte of text or more is held", NULL},
    {"lines", (getter)Scanner_get_lines, NULL, "(lines, read here, sent to the fallback)", NULL},
    {"mark_line", (getter)Scanner_get_mark, NULL, "the first line holding the mark, or None", NULL},
    {"inflater", (getter)Scanner_get_inflater, NULL, "libdeflate or zlib", NULL},
    {NULL},
};

PyTypeObject dft_ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace_dynamo._core.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(fallback_fd, args, present=None, integer=None, listed=None, mark=None, mark_limit=-, "
              "max_line=16 MiB, inflater='auto'): one trace file's lines as columns (see csrc/reader.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
    .tp_getset = Scanner_getset,
};
