/* gzip members made for trace lines, at a few hundred instructions per line.
 *
 * A general deflate searches every position for earlier matches (libdeflate
 * level 1: ~16 instructions per byte). Trace lines need no search: most of a
 * line repeats the previous line of the same event site (name, category, pid,
 * tid, args, field names), and what differs are a few digits (id, ts, dur).
 * The writer says where those are (dft_deflate_hints) in the lines it vouches
 * are the same elsewhere as the last line of their key (one site's copied
 * tail text, one track, writer.c): such a line is one back-reference per
 * constant part, each extended over the field's leading digits that agree,
 * and the remaining digits as literals, two per code. A hinted line whose
 * key's last line is out of the window goes against the last line of its
 * fam or cls the same way, its name part and args compared as below
 * (put_hinted). Any other line is compared with one earlier line, 16 bytes
 * at a time: equal runs become back-references, and at a difference both
 * lines skip to their next JSON delimiter, the bytes skipped in the new line
 * becoming literals. That earlier line is the last one in the member whose
 * first 32 bytes after the id (its name and category) hash alike, or else the
 * previous line; the rest of a long line past it (an aggregate record) is
 * matched against earlier positions by a hash of 4 bytes (put_lz). These
 * back-references are checked against the text, so the output is exact
 * whatever the lines hold.
 *
 * One block per member (RFC 1951) in a standard gzip member (RFC 1952): any
 * gzip reader decodes it alone. Its Huffman codes are made from the symbols
 * of the previous member of the file (fixed codes for the first). The CRC-32
 * uses carry-less multiplication where the CPU has it (~0.35 instructions
 * per byte), zlib's crc32 otherwise. */
#include "deflate.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- CRC-32 ---------------------------------------------------------------- */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 128-bit folding (Intel, "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ"): the accumulator times x^k mod P, constants for the reflected
 * CRC-32 polynomial; what is left is the CRC of the accumulator's 16 bytes. */
#define FOLD(x, k) _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11))
__attribute__((target("pclmul,sse2"))) static uint32_t crc32_clmul(uint32_t crc, const unsigned char *p,
                                                                   size_t n) {
    /* n >= 64 */
    const __m128i k512 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i k128 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)~crc));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x0 = _mm_xor_si128(FOLD(x0, k512), _mm_loadu_si128((const __m128i *)p));
        x1 = _mm_xor_si128(FOLD(x1, k512), _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = _mm_xor_si128(FOLD(x2, k512), _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = _mm_xor_si128(FOLD(x3, k512), _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x0 = _mm_xor_si128(FOLD(x0, k128), x1);
    x0 = _mm_xor_si128(FOLD(x0, k128), x2);
    x0 = _mm_xor_si128(FOLD(x0, k128), x3);
    for (; n >= 16; p += 16, n -= 16)
        x0 = _mm_xor_si128(FOLD(x0, k128), _mm_loadu_si128((const __m128i *)p));
    unsigned char a[16];
    _mm_storeu_si128((__m128i *)a, x0);
    return (uint32_t)crc32(crc32(0xffffffffu, a, 16), p, (uInt)n); /* from raw state 0 */
}

/* Set once (init_tables): the CPU has it, and it agrees with zlib. */
static int clmul_ok;

static void clmul_check(void) {
    unsigned char t[200];
    for (unsigned i = 0; i < sizeof t; i++)
        t[i] = (unsigned char)(i * 131 + 7);
    clmul_ok = __builtin_cpu_supports("pclmul") && crc32_clmul(0, t, sizeof t) == (uint32_t)crc32(0, t, sizeof t) &&
               crc32_clmul(0x12345678, t + 3, 67) == (uint32_t)crc32(0x12345678, t + 3, 67);
}
#endif

/* CRC-32 of gzip/zlib, continuing from crc (0 to start). */
static uint32_t crc32_of(uint32_t crc, const unsigned char *p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (n >= 64 && clmul_ok)
        return crc32_clmul(crc, p, n);
#endif
    while (n) { /* zlib takes at most 4 GiB - 1 at once */
        uInt k = n > (1u << 30) ? 1u << 30 : (uInt)n;
        crc = (uint32_t)crc32(crc, p, k);
        p += k;
        n -= k;
    }
    return crc;
}

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static void init_tables(void);

uint32_t dft_crc32(uint32_t crc, const void *p, size_t n) {
    pthread_once(&tables_once, init_tables); /* clmul_ok */
    return crc32_of(crc, (const unsigned char *)p, n);
}

/* ---- Huffman codes ---------------------------------------------------------- */
#define NLIT 286 /* litlen symbols used: 256 bytes, end of block, 29 lengths */
#define NDIST 30

/* One member's codes: litlen symbol and distance code -> code bits
 * (reversed, as deflate sends them) | length << 16; match length 3..258 ->
 * its length symbol's code with the extra bits, and their count. */
typedef struct {
    uint32_t lit[288], dist[NDIST];
    uint32_t mlen_bits[259];
    uint8_t mlen_n[259];
    uint8_t lit_len[288], dist_len[NDIST]; /* 286, 287: fixed codes only, never sent */
} codes_t;

#define DFT_LZ_BITS 14

/* A run of a span against an earlier one (put_plan): i, j its offsets in the two spans, n bytes,
 * a back-reference or literals. */
typedef struct {
    uint16_t i, j, n, match;
} plan_op;
#define PLAN_OPS 8
typedef struct {
    uint16_t ni, nj, n; /* the spans' lengths it was made for; its runs (0: none made) */
    plan_op op[PLAN_OPS];
} plan_t;

/* What a line of one hint key has in common with a line of another (put_hinted): compared once,
 * it holds for every pair of lines of these keys, which are alike but for their fields. */
typedef struct {
    uint64_t key, ref;
    plan_t plan[2]; /* the name parts' and the args' middles (put_plan) */
    uint16_t p1, q1, p, q; /* the leading and trailing bytes that the name parts and the args share */
    uint8_t same;          /* the text before the id and between the ts and the dur is the same */
} pair_t;

/* Text that only grows from one aggregate record to the next (its group keys, its copied
 * events), as deflate blocks of fixed codes, none the last, matched only within that text: each
 * record starts with the same text, so they are sent again as they are, not encoded again. */
typedef struct {
    uint32_t *w;    /* whole 32-bit words of bits */
    size_t nw, cap; /* their count; room */
    uint64_t bb;    /* and the bits past them */
    unsigned bn;
    size_t text; /* bytes of text they hold */
    struct {
        size_t text, nw;
        uint64_t bb;
        unsigned bn;
    } *end; /* each block's */
    size_t nend, capend;
} kept_t;

struct dft_deflate {
    /* per line key: the start of its last line in the block; per hint key and per hint fam:
     * the index of its last hinted line; each + 1 | the block's pass << PASS_SHIFT (other
     * passes' are stale: no clearing per block) */
    uint64_t last[DFT_DEFLATE_KEYS], hlast[DFT_DEFLATE_KEYS], hfam[DFT_DEFLATE_KEYS], hcls[DFT_DEFLATE_KEYS];
    uint64_t pass;
    /* per hint key (by its hash): a line of that key against one of key ref, which compared
     * once holds for every pair of lines of these keys (put_hinted) */
    pair_t pairs[DFT_DEFLATE_KEYS];
    uint32_t lz[1u << DFT_LZ_BITS]; /* put_lz's last position per hash of 4 bytes */
    const dft_line_hint *h;           /* the next member's hints (dft_deflate_hints) */
    size_t nh;
    size_t rec;                       /* its aggregate record's offset + 1, 0: none (dft_deflate_record) */
    uint32_t rec_crc;                 /* the CRC-32 of the text before it */
    dft_record_copy cp;               /* the record's copied events; len 0: none */
    int ended;                        /* put_record ended the member's last block */
    /* the aggregate records' group keys [0] and copied events [1] so far (kept_t) */
    kept_t kept[2];
    uint32_t xlit[NLIT], xdist[NDIST], xpair[256]; /* symbols of blocks of fixed codes: not counted */
    uint32_t nlit[NLIT], ndist[NDIST]; /* symbols of the member being encoded */
    uint32_t npair[256];               /* of them, the pairs sent at once (put_digits) */
    uint64_t pair[256];                /* the pairs' codes: bits | length << 32 */
    uint32_t acc_lit[NLIT], acc_dist[NDIST]; /* of the members since the codes were last made */
    uint64_t acc_n, made_n;                  /* their count; of all codes made so far */
    codes_t next;                      /* built from the symbols of the members before */
    int have_next;
    /* the dynamic block header of next, made with it: the same for every member until the codes
     * are made again (32 bits a word, hdr_bits in all) */
    uint32_t hdr[73];
    unsigned hdr_bits;
    const codes_t *paired; /* the codes pair[] was made from */
};

static codes_t fixed;
static uint64_t fixed_pair[256]; /* make_pairs of fixed */
/* match length -> its symbol - 257 and extra bits; distance - 1 -> its code:
 * [v] below 256, [256 + (v >> 7)] above (zlib's trick); per code, the first
 * distance - 1 and the count of extra bits */
static uint8_t mlen_sym[259], mlen_extra[259];
static uint16_t mlen_base[29];
static uint8_t dist_of[512];
static uint16_t dist_base[NDIST];
static uint8_t dist_extra[NDIST];
/* where the two lines go on after a difference; '\n' (2) ends a line */
static uint8_t delim[256];

static unsigned reverse(unsigned c, unsigned n) { /* the low n bits of c, reversed */
    c = (c & 0x5555) << 1 | (c >> 1 & 0x5555);
    c = (c & 0x3333) << 2 | (c >> 2 & 0x3333);
    c = (c & 0x0f0f) << 4 | (c >> 4 & 0x0f0f);
    c = (c & 0x00ff) << 8 | (c >> 8 & 0x00ff);
    return c >> (16 - n);
}

/* Canonical codes from code lengths (RFC 1951 3.2.2). */
static void make_codes(const uint8_t *len, unsigned n, uint32_t *out) {
    unsigned count[16] = {0}, next[16];
    for (unsigned i = 0; i < n; i++)
        count[len[i]]++;
    count[0] = 0;
    unsigned c = 0;
    for (unsigned b = 1; b < 16; b++) {
        c = (c + count[b - 1]) << 1;
        next[b] = c;
    }
    for (unsigned i = 0; i < n; i++)
        out[i] = len[i] ? reverse(next[len[i]]++, len[i]) | (unsigned)len[i] << 16 : 0;
}

static void make_all_codes(codes_t *c) {
    make_codes(c->lit_len, 288, c->lit);
    make_codes(c->dist_len, NDIST, c->dist);
    for (unsigned l = 3; l <= 258; l++) {
        uint32_t k = c->lit[257 + mlen_sym[l]];
        c->mlen_bits[l] = (k & 0xffff) | (l - mlen_base[mlen_sym[l]]) << (k >> 16);
        c->mlen_n[l] = (uint8_t)((k >> 16) + mlen_extra[l]);
    }
}

/* Sorts keys by their low 32 bits (radix, 8 bits a pass), n <= 288. */
static void sort_keys(uint64_t *k, unsigned n) {
    uint64_t tmp[288], *a = k, *b = tmp;
    for (unsigned sh = 0; sh < 32; sh += 8) {
        unsigned at[257] = {0};
        for (unsigned i = 0; i < n; i++)
            at[(a[i] >> sh & 0xff) + 1]++;
        for (unsigned i = 1; i < 257; i++)
            at[i] += at[i - 1];
        for (unsigned i = 0; i < n; i++)
            b[at[a[i] >> sh & 0xff]++] = a[i];
        uint64_t *t = a;
        a = b;
        b = t;
    }
}

/* Huffman code lengths of at most limit bits for the symbols of nonzero
 * frequency (at least two): the Huffman tree of the leaves sorted by
 * frequency, its depths clamped to limit and the code made complete again by
 * splitting shorter codes (as miniz does); the longest codes go to the
 * rarest symbols. */
static void huff_lengths(const uint32_t *freq, unsigned n, unsigned limit, uint8_t *len) {
    uint64_t key[NLIT], wt[2 * NLIT]; /* key: symbol << 32 | frequency (below 2^32) */
    unsigned par[2 * NLIT], dep[2 * NLIT], count[16] = {0}, m = 0;
    memset(len, 0, n);
    for (unsigned i = 0; i < n; i++)
        if (freq[i])
            key[m++] = (uint64_t)i << 32 | freq[i];
    sort_keys(key, m);
    for (unsigned k = 0; k < m; k++)
        wt[k] = (uint32_t)key[k];
    /* two queues: the sorted leaves, the inner nodes in the order made (never decreasing) */
    unsigned leaf = 0, inner = m, top = m;
    for (unsigned t = 0; t + 1 < m; t++) {
        unsigned a = leaf < m && (inner == top || wt[leaf] <= wt[inner]) ? leaf++ : inner++;
        unsigned b = leaf < m && (inner == top || wt[leaf] <= wt[inner]) ? leaf++ : inner++;
        wt[top] = wt[a] + wt[b];
        par[a] = par[b] = top++;
    }
    dep[top - 1] = 0;
    for (unsigned k = top - 1; k-- > 0;)
        dep[k] = dep[par[k]] + 1;
    for (unsigned k = 0; k < m; k++)
        count[dep[k] < limit ? dep[k] : limit]++;
    uint32_t total = 0;
    for (unsigned i = 1; i <= limit; i++)
        total += count[i] << (limit - i);
    for (; total > 1u << limit; total--) {
        count[limit]--;
        for (unsigned i = limit - 1; i > 0; i--)
            if (count[i]) {
                count[i]--;
                count[i + 1] += 2;
                break;
            }
    }
    unsigned k = 0;
    for (unsigned l = limit; l > 0; l--)
        for (unsigned c = count[l]; c; c--)
            len[key[k++] >> 32] = (uint8_t)l;
}

static void make_pairs(const codes_t *c, uint64_t *pair);

static void init_tables(void) {
    static const uint16_t base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const uint8_t extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                      2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    for (unsigned s = 0; s < 29; s++) {
        mlen_base[s] = base[s];
        for (unsigned l = base[s]; l <= (s == 28 ? 258 : base[s] + (1u << extra[s]) - 1); l++) {
            mlen_sym[l] = (uint8_t)s;
            mlen_extra[l] = extra[s];
        }
    }
    for (unsigned c = 0, v = 0; c < NDIST; c++) {
        dist_extra[c] = (uint8_t)(c < 4 ? 0 : c / 2 - 1);
        dist_base[c] = (uint16_t)v;
        for (unsigned k = 0; k < 1u << dist_extra[c]; k++, v++)
            dist_of[v < 256 ? v : 256 + (v >> 7)] = (uint8_t)c;
    }
    for (unsigned i = 0; i < 288; i++)
        fixed.lit_len[i] = i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8;
    memset(fixed.dist_len, 5, NDIST);
    make_all_codes(&fixed);
    make_pairs(&fixed, fixed_pair);
    for (const char *d = ",\":}"; *d; d++)
        delim[(unsigned char)*d] = 1;
    delim['\n'] = 2;
#if defined(__x86_64__) && defined(__GNUC__)
    clmul_check();
#endif
}

#define ALWAYS_INLINE __attribute__((always_inline)) inline

/* ---- bit output --------------------------------------------------------------
 * At most 32 bits at once; 4 bytes go out once 32 are held. */
/* Two characters of ",-./", the digits and ":;" (a pair index a << 4 | b)
 * go out as one code, the two literals' codes in a row: most literals of a
 * line are the digits of its id, ts and dur, and of an aggregate record's
 * statistics, between commas. */
#define PAIR_FIRST ','
typedef struct {
    uint64_t bb, bn; /* not 32-bit: the counts' stores cannot change them */
    unsigned char *o;
    const codes_t *c;
    uint32_t *nlit, *ndist; /* symbols counted for the next member's codes */
    uint32_t *npair;
    const uint64_t *pair; /* a pair's code: bits | length << 32 */
    uint32_t *lz;         /* put_lz's positions by hash (dft_deflate's) */
} enc_t;

static ALWAYS_INLINE void put_bits(enc_t *w, uint64_t v, unsigned n) {
    w->bb |= v << w->bn;
    w->bn += n;
    if (w->bn >= 32) {
        uint32_t lo = (uint32_t)w->bb;
        memcpy(w->o, &lo, 4);
        w->o += 4;
        w->bb >>= 32;
        w->bn -= 32;
    }
}

static ALWAYS_INLINE void put_lit(enc_t *w, unsigned char c) {
    w->nlit[c]++;
    put_bits(w, w->c->lit[c] & 0xffff, w->c->lit[c] >> 16);
}

static ALWAYS_INLINE void put_lits(enc_t *w, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        put_lit(w, s[i]);
}

/* Literals, two at a time where both are pair characters. */
static ALWAYS_INLINE void put_digits(enc_t *w, const unsigned char *s, size_t n) {
    while (n >= 2) {
        unsigned a = s[0] - (unsigned)PAIR_FIRST, b = s[1] - (unsigned)PAIR_FIRST;
        if ((a | b) < 16) {
            uint64_t k = w->pair[a << 4 | b];
            w->npair[a << 4 | b]++;
            put_bits(w, (uint32_t)k, (unsigned)(k >> 32));
            s += 2;
            n -= 2;
        } else {
            put_lit(w, *s++);
            n--;
        }
    }
    if (n)
        put_lit(w, *s);
}

static void make_pairs(const codes_t *c, uint64_t *pair) {
    for (unsigned i = 0; i < 256; i++) {
        uint32_t a = c->lit[PAIR_FIRST + (i >> 4)], b = c->lit[PAIR_FIRST + (i & 15)];
        pair[i] = ((a & 0xffff) | (b & 0xffff) << (a >> 16)) | (uint64_t)((a >> 16) + (b >> 16)) << 32;
    }
}

/* A distance's code and extra bits; the matches of one line mostly share one. */
typedef struct {
    unsigned dist, n, code;
    uint64_t bits;
} dist_t;

static ALWAYS_INLINE void put_match(enc_t *w, size_t m, unsigned dist, dist_t *d) {
    if (dist != d->dist) {
        unsigned v = dist - 1, code = dist_of[v < 256 ? v : 256 + (v >> 7)];
        uint32_t dc = w->c->dist[code];
        d->dist = dist;
        d->code = code;
        d->bits = (dc & 0xffff) | (uint64_t)(v - dist_base[code]) << (dc >> 16);
        d->n = (dc >> 16) + dist_extra[code];
    }
    while (m > 258) {
        size_t l = m < 261 ? m - 3 : 258; /* leave no remainder below 3 */
        w->nlit[257 + mlen_sym[l]]++;
        w->ndist[d->code]++;
        put_bits(w, w->c->mlen_bits[l], w->c->mlen_n[l]);
        put_bits(w, d->bits, d->n);
        m -= l;
    }
    w->nlit[257 + mlen_sym[m]]++;
    w->ndist[d->code]++;
    put_bits(w, w->c->mlen_bits[m], w->c->mlen_n[m]);
    put_bits(w, d->bits, d->n);
}

/* Equal leading bytes of a and b, at most max, up to and with a newline
 * (*nl set then). */
#if defined(__SSE2__)
#include <emmintrin.h>
/* bit k: a[k] != b[k]; *eol bit k: a[k] is a newline */
static inline unsigned differ16(const unsigned char *a, const unsigned char *b, unsigned *eol) {
    __m128i x = _mm_loadu_si128((const __m128i *)a), y = _mm_loadu_si128((const __m128i *)b);
    *eol = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('\n')));
    return ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) & 0xffff;
}

static inline size_t stop_at(size_t k, unsigned ne, unsigned eol, int *nl) {
    unsigned at = (unsigned)__builtin_ctz(ne | eol);
    *nl = !(ne >> at & 1);
    return k + at + (size_t)*nl;
}

static inline size_t common(const unsigned char *a, const unsigned char *b, size_t max, int *nl) {
    size_t k = 0;
    unsigned ne, eol;
    *nl = 0;
    for (; k + 16 <= max; k += 16)
        if ((ne = differ16(a + k, b + k, &eol)) | eol)
            return stop_at(k, ne, eol, nl);
    if (max >= 16) { /* the last 16 bytes again, from k on */
        unsigned sh = 16 - (unsigned)(max - k);
        ne = differ16(a + max - 16, b + max - 16, &eol) >> sh;
        eol >>= sh;
        return ne | eol ? stop_at(k, ne, eol, nl) : max;
    }
#else
static inline size_t common(const unsigned char *a, const unsigned char *b, size_t max, int *nl) {
    size_t k = 0;
    *nl = 0;
#endif
    for (; k < max && a[k] == b[k]; k++)
        if (a[k] == '\n') {
            *nl = 1;
            return k + 1;
        }
    return k;
}

#define WINDOW 32768u
#define PASS_SHIFT 40 /* text offsets and hint indices of a member stay below 2^40 */

/* Start of the line to compare the line at s[pos..n) with, or pos: none. */
static size_t pick_ref(dft_deflate *d, const unsigned char *s, size_t pos, size_t n, size_t prev) {
    size_t ref = prev;
    if (n - pos >= 72 && s[pos] == '{') { /* {"id":digits, then name and category */
        const unsigned char *q = s + pos + 6;
        uint64_t a, b, c, x;
        memcpy(&a, q, 8);
        a = ~a & 0x1010101010101010ull; /* bit 4 is set in digits, clear in ',' */
        q += a ? (unsigned)__builtin_ctzll(a) >> 3 : 8;
        while (*q >= '0' && *q <= '9' && q < s + pos + 28)
            q++;
        memcpy(&a, q + 8, 8);
        memcpy(&b, q + 16, 8);
        memcpy(&c, q + 24, 8);
        memcpy(&x, q + 32, 8);
        uint64_t h = a * 0x9E3779B97F4A7C15ull ^ b * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull ^
                     x * 0xD6E8FEB86659FD93ull;
        uint64_t *slot = &d->last[(h ^ h >> 29) & (DFT_DEFLATE_KEYS - 1)];
        if (*slot >> PASS_SHIFT == d->pass && pos - (*slot - (d->pass << PASS_SHIFT) - 1) <= WINDOW)
            ref = *slot - (d->pass << PASS_SHIFT) - 1;
        *slot = (d->pass << PASS_SHIFT) + pos + 1;
    }
    return pos - ref <= WINDOW ? ref : pos;
}

/* Equal leading bytes of a and b, at most n (nothing read past n). */
static ALWAYS_INLINE size_t prefix_upto(const unsigned char *a, const unsigned char *b, size_t n) {
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t x, y;
        memcpy(&x, a + k, 8);
        memcpy(&y, b + k, 8);
        if (x ^ y)
            return k + ((unsigned)__builtin_ctzll(x ^ y) >> 3);
    }
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

/* The rest of a line that no earlier line resembles (an aggregate record: up to megabytes of
 * groups, steps and copied events, alike element by element), as a general deflate sends it:
 * at each position the last earlier one whose 4 bytes hash alike, a match where those agree,
 * else a literal. Positions are those hashed here, in this member or (stale, checked like the
 * rest) an earlier one. */
#define LZ_MIN 64
static ALWAYS_INLINE void lz_run(enc_t *w, const unsigned char *s, size_t lo, size_t i, size_t end) {
    dist_t d = {0, 0, 0, 0};
    size_t lit = i;
    while (i + 4 <= end) {
        uint32_t x, y, *slot;
        memcpy(&x, s + i, 4);
        slot = &w->lz[(x * 2654435761u) >> (32 - DFT_LZ_BITS)];
        size_t c = *slot;
        *slot = (uint32_t)i;
        if (c >= lo && c < i && i - c <= WINDOW && (memcpy(&y, s + c, 4), x == y)) {
            size_t m = 4 + prefix_upto(s + i + 4, s + c + 4, end - i - 4);
            put_digits(w, s + lit, i - lit);
            put_match(w, m, (unsigned)(i - c), &d);
            lit = i += m;
            continue;
        }
        i += 1 + ((i - lit) >> 5); /* past 32 literals in a row, fewer positions tried */
    }
    put_digits(w, s + lit, end - lit);
}

static __attribute__((noinline)) void put_lz(enc_t *w, const unsigned char *s, size_t i, size_t end) {
    lz_run(w, s, 0, i, end);
}

/* Below this many new bytes of copied events a record's rest is not kept (a kept block's header
 * and end cost 10 bits). */
#define KEPT_MIN 4096

/* w on with fixed codes, its symbols not counted (put_record's own blocks) */
static enc_t fixed_enc(dft_deflate *d, const enc_t *w) {
    return (enc_t){w->bb, w->bn, w->o, &fixed, d->xlit, d->xdist, d->xpair, fixed_pair, w->lz};
}

/* s[at + k->text, at + len) added to k, a block of its own */
static void keep(dft_deflate *d, kept_t *k, const enc_t *w, const unsigned char *s, size_t at, size_t len) {
    enc_t t = fixed_enc(d, w);
    t.bb = k->bb;
    t.bn = k->bn;
    t.o = (unsigned char *)(k->w + k->nw);
    put_bits(&t, 1 << 1, 3); /* not the last block, fixed codes */
    lz_run(&t, s, at, at + k->text, at + len);
    put_bits(&t, fixed.lit[256] & 0xffff, fixed.lit[256] >> 16);
    k->nw = (size_t)(t.o - (unsigned char *)k->w) / 4;
    k->bb = t.bb;
    k->bn = (unsigned)t.bn;
    k->text = len;
    k->end[k->nend++] = (__typeof__(k->end[0])){len, k->nw, k->bb, k->bn};
}

/* k holding the first stable bytes of the text at s[at..) (the blocks past them dropped), then up
 * to len, if that adds KEPT_MIN bytes or more (a block of its own, matched within that text only);
 * then sent. */
static void put_kept(dft_deflate *d, kept_t *k, enc_t *w, const unsigned char *s, size_t at, size_t len,
                     size_t stable) {
    stable = stable < len ? stable : len;
    if (k->text > stable) {
        while (k->nend && k->end[k->nend - 1].text > stable)
            k->nend--;
        k->text = k->nend ? k->end[k->nend - 1].text : 0;
        k->nw = k->nend ? k->end[k->nend - 1].nw : 0;
        k->bb = k->nend ? k->end[k->nend - 1].bb : 0;
        k->bn = k->nend ? k->end[k->nend - 1].bn : 0;
    }
    size_t words = k->nw + dft_gzip_bound(len - k->text) / 4 + 2;
    if (len >= k->text + KEPT_MIN && words > k->cap) {
        size_t cap = words + words / 2;
        uint32_t *p = realloc(k->w, cap * sizeof *p);
        k->w = p ? p : k->w;
        k->cap = p ? cap : k->cap;
    }
    if (len >= k->text + KEPT_MIN && k->nend == k->capend) {
        size_t cap = k->capend ? k->capend * 2 : 16;
        __typeof__(k->end) p = realloc(k->end, cap * sizeof *p);
        k->end = p ? p : k->end;
        k->capend = p ? cap : k->capend;
    }
    if (len >= k->text + KEPT_MIN && words <= k->cap && k->nend < k->capend)
        keep(d, k, w, s, at, len);
    for (size_t j = 0; j < k->nw; j++)
        put_bits(w, k->w[j], 32);
    if (k->bn)
        put_bits(w, k->bb, k->bn);
}

/* The header of a block with w's codes (the member's), not the last: put_record's blocks after
 * kept ones. */
static void put_header(const dft_deflate *d, enc_t *w, unsigned last) {
    if (w->c == &fixed) {
        put_bits(w, last | 1 << 1, 3);
        return;
    }
    unsigned k = 0;
    for (; k + 32 <= d->hdr_bits; k += 32)
        put_bits(w, d->hdr[k / 32] & (k || last ? ~0u : ~1u), 32);
    if (k < d->hdr_bits)
        put_bits(w, d->hdr[k / 32], d->hdr_bits - k);
}

/* The aggregate record line at s[i] (dft_deflate_record): no event line resembles it, so it is
 * matched only against earlier positions from its start; a function of its own, whose cost
 * callgrind_costs.py reports apart (a checkpoint's, not an event's). With its parts (d->cp): the
 * member's block ends before its group keys, which go out as kept blocks; the statistics follow
 * in a block of the member's codes, as literals (a match search finds little in them); then the
 * copied events as kept blocks, and a last block of fixed codes with the rest of the member
 * (d->ended). Returns the next line's start. */
static __attribute__((noinline)) size_t put_record(dft_deflate *d, enc_t *w, const unsigned char *s, size_t i,
                                                   size_t n) {
    const unsigned char *nl = memchr(s + i, '\n', n - i);
    size_t end = nl ? (size_t)(nl - s) + 1 : n;
    const dft_record_copy cp = d->cp;
    enc_t e = *w, t; /* locals, in registers: their addresses go to no callee but a copy's */
    if (!cp.len) {
        lz_run(&e, s, 0, i, end);
        *w = e;
        return end;
    }
    lz_run(&e, s, 0, i, cp.keys);
    e.nlit[256]++; /* the member's block ends */
    put_bits(&e, e.c->lit[256] & 0xffff, e.c->lit[256] >> 16);
    t = e;
    put_kept(d, &d->kept[0], &t, s, cp.keys, cp.nkeys, cp.nkeys);
    put_header(d, &t, 0);
    e = t;
    lz_run(&e, s, 0, cp.keys + d->kept[0].text, cp.nums);
    put_digits(&e, s + cp.nums, cp.at - cp.nums);
    e.nlit[256]++;
    put_bits(&e, e.c->lit[256] & 0xffff, e.c->lit[256] >> 16);
    t = e;
    put_kept(d, &d->kept[1], &t, s, cp.at, cp.len, cp.stable);
    d->cp.stable = d->kept[1].text; /* encoded again (fixed codes after all): the same blocks */
    enc_t f = fixed_enc(d, &t);
    put_bits(&f, 1 | 1 << 1, 3); /* the last block, fixed codes */
    lz_run(&f, s, 0, cp.at + d->kept[1].text, n);
    put_bits(&f, fixed.lit[256] & 0xffff, fixed.lit[256] >> 16);
    e.bb = f.bb;
    e.bn = f.bn;
    e.o = f.o;
    *w = e;
    d->ended = 1;
    return n;
}

/* At a difference between s[i] and s[*j]: both go on from their next JSON delimiter (stepping
 * over two different ones), the new bytes up to it as literals (two digits a code); *j stays
 * below je. Returns the new i: ie, or at a delimiter. */
static ALWAYS_INLINE size_t skip_to(const unsigned char *s, size_t i, size_t ie, size_t *j, size_t je) {
    size_t k = *j;
    if (delim[s[i]] && delim[s[k]])
        i++, k++;
    size_t i1 = i;
    while (i < ie && !delim[s[i]])
        i++;
    if (i < ie) {
        if (k + (i - i1) < je && s[k + (i - i1)] == s[i]) /* a field of the same length */
            k += i - i1;
        else
            while (k < je && !delim[s[k]])
                k++;
    }
    *j = k;
    return i;
}

static ALWAYS_INLINE size_t skip_field(enc_t *w, const unsigned char *s, size_t i, size_t ie, size_t *j,
                                       size_t je) {
    size_t i1 = skip_to(s, i, ie, j, je);
    put_digits(w, s + i, i1 - i);
    return i1;
}

/* One line from s[i], back-references into the earlier text at j where
 * they agree, up to the line's own start: past it the rest are literals (a
 * long line compared with itself costs ~40 instructions a byte and saves
 * little); returns the start of the next line. */
static ALWAYS_INLINE size_t put_line(enc_t *w, const unsigned char *s, size_t i, size_t n, size_t j) {
    int nl;
    dist_t d = {0, 0, 0, 0};
    const size_t start = i;
    while (j < start) {
        size_t m = common(s + i, s + j, n - i, &nl);
        if (m >= 3 && i - j <= WINDOW)
            put_match(w, m, (unsigned)(i - j), &d);
        else
            put_lits(w, s + i, m);
        i += m;
        j += m;
        if (nl || i == n)
            return i;
        if (s[i] == '\n' && delim[s[j]]) /* the line ends where the earlier one goes on */
            break;
        i = skip_field(w, s, i, n, &j, start);
        if (i == n || s[i] == '\n')
            break;
    }
    const unsigned char *e = memchr(s + i, '\n', n - i);
    size_t end = e ? (size_t)(e - s) + 1 : n;
    if (end - i >= LZ_MIN) {
        enc_t t = *w; /* a copy: w's address escapes no further, it stays in registers */
        put_lz(&t, s, i, end);
        *w = t;
    } else
        put_lits(w, s + i, end - i);
    return end;
}

/* Equal leading bytes of a and b, at most n; 8 bytes past n are readable in both. */
static ALWAYS_INLINE size_t prefix(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t k = 0;; k += 8) {
        uint64_t x, y;
        memcpy(&x, a + k, 8);
        memcpy(&y, b + k, 8);
        if (x ^ y) {
            k += (unsigned)__builtin_ctzll(x ^ y) >> 3;
            return k < n ? k : n;
        }
        if (k + 8 >= n)
            return n;
    }
}

/* A match of m bytes at distance dist from s + at, or literals below 3 bytes. */
static ALWAYS_INLINE void put_run(enc_t *w, const unsigned char *s, size_t at, size_t m, unsigned dist, dist_t *d) {
    if (m >= 3)
        put_match(w, m, dist, d);
    else
        put_lits(w, s + at, m);
}

/* Equal leading bytes of a and b, at most n. (This and suffix_in run once per
 * pair of keys, pairs[]: no need for speed.) */
static size_t prefix_in(const unsigned char *a, const unsigned char *b, size_t n) {
    size_t k = 0;
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

/* Equal trailing bytes of the n bytes before a and before b. */
static size_t suffix_in(const unsigned char *a, const unsigned char *b, size_t n) {
    size_t k = 0;
    while (k < n && a[-1 - (ptrdiff_t)k] == b[-1 - (ptrdiff_t)k])
        k++;
    return k;
}

static ALWAYS_INLINE int hint_ok(const dft_line_hint *h, size_t end) { /* the line lies before end */
    const uint16_t *f = h->f;
    return (uint64_t)h->at + h->len <= end && f[0] <= f[1] && f[1] <= f[2] && f[2] <= f[3] && f[3] <= f[4] &&
           f[4] <= f[5] && f[5] + 8u <= h->len;
}

#define SPAN_MIN 12
/* The bytes [i, ie) of a line against [j, je) of an earlier one in the window, as put_line
 * compares lines: equal runs as back-references; at a difference both go on from their next
 * delimiter, the new bytes up to it as literals (two digits a code). Two such spans are the same
 * for every pair of lines of two keys (pairs[]), so they are compared once, into a plan of runs
 * at offsets from their starts (past PLAN_OPS runs, the rest as literals), then replayed. */
static int plan_add(plan_t *pl, size_t i, size_t j, size_t n, int match) {
    if (pl->n == PLAN_OPS - 1) /* the last slot: the rest as literals */
        return -1;
    if (n)
        pl->op[pl->n++] = (plan_op){(uint16_t)i, (uint16_t)j, (uint16_t)n, (uint16_t)match};
    return 0;
}

static void plan_make(plan_t *pl, const unsigned char *s, size_t i, size_t ie, size_t j, size_t je) {
    const size_t i0 = i, j0 = j;
    pl->n = 0;
    pl->ni = (uint16_t)(ie - i);
    pl->nj = (uint16_t)(je - j);
    while (i < ie) {
        size_t m = prefix_upto(s + i, s + j, ie - i < je - j ? ie - i : je - j);
        if (plan_add(pl, i - i0, j - j0, m, m >= 3) < 0)
            break;
        i += m;
        j += m;
        if (i == ie || j == je) /* done, or the earlier span is used up */
            break;
        size_t i1 = skip_to(s, i, ie, &j, je);
        if (plan_add(pl, i - i0, 0, i1 - i, 0) < 0)
            break;
        i = i1;
    }
    if (i < ie)
        pl->op[pl->n++] = (plan_op){(uint16_t)(i - i0), 0, (uint16_t)(ie - i), 0};
}

/* s[i, ie) against s[j, je) by the plan, made first where it is not for spans of these lengths. */
static ALWAYS_INLINE void put_plan(enc_t *w, const unsigned char *s, plan_t *pl, size_t i, size_t ie, size_t j,
                                   size_t je, dist_t *d) {
    if (pl->ni != ie - i || pl->nj != je - j || !pl->n)
        plan_make(pl, s, i, ie, j, je);
    for (unsigned k = 0; k < pl->n; k++) {
        const plan_op *o = &pl->op[k];
        if (o->match)
            put_match(w, o->n, (unsigned)((i + o->i) - (j + o->j)), d);
        else
            put_digits(w, s + i + o->i, o->n);
    }
}

/* The line of hint h against the earlier line of hint r: one back-reference per part that is
 * the same in both, the field's digits from the first that differs as literals. Without c
 * (a line of r's key) every part is the same; with it, the name part ([f1, f2): name, category
 * and track) and the args ([f5, len)) are the same but for a middle, which is compared as
 * put_line compares lines (put_plan). */
static ALWAYS_INLINE size_t put_against(enc_t *w, const unsigned char *s, const dft_line_hint *h,
                                        const dft_line_hint *r, pair_t *c) {
    const uint16_t *f = h->f, *g = r->f;
    const unsigned char *a = s + h->at, *b = s + r->at;
    dist_t dd = {0, 0, 0, 0};
    unsigned dist = h->at - r->at;
    size_t at = h->at, m = f[0]; /* the match being extended: from at, m bytes */
#pragma GCC unroll 3
    for (unsigned k = 0; k < 6; k += 2) {
        size_t fa = f[k], fb = f[k + 1], cc = fb - fa == (size_t)(g[k + 1] - g[k]) ? prefix(a + fa, b + g[k], fb - fa) : 0;
        m += cc;
        if (cc < fb - fa) { /* the rest of the field as literals; the next part's distance */
            put_run(w, s, at, m, dist, &dd);
            put_digits(w, a + fa + cc, fb - fa - cc);
            at = h->at + fb;
            m = 0;
            dist = (unsigned)(at - (r->at + g[k + 1]));
        }
        size_t pe = k < 4 ? f[k + 2] : h->len, qe = k < 4 ? g[k + 2] : r->len; /* the part after it */
        size_t p = k == 0 && c ? c->p1 : k == 4 && c ? c->p : pe - fb, q = k == 0 ? c ? c->q1 : 0 : c ? c->q : 0;
        if (k == 2 || (p == pe - fb && pe - fb == qe - g[k + 1])) {
            m += pe - fb;
            continue;
        }
        put_run(w, s, at, m + p, dist, &dd);
        if (pe - q - fb - p <= SPAN_MIN) /* a node name's last digits: literals cost less */
            put_digits(w, a + fb + p, pe - q - fb - p);
        else
            put_plan(w, s, &c->plan[k != 0], h->at + fb + p, h->at + pe - q, r->at + g[k + 1] + p, r->at + qe - q,
                     &dd);
        at = h->at + pe - q;
        m = q;
        dist = (unsigned)(h->at + pe - (r->at + qe));
    }
    put_run(w, s, at, m, dist, &dd);
    return h->at + h->len;
}

/* The last earlier hinted line in slot whose line lies whole in the window of h's, or NULL. */
static ALWAYS_INLINE const dft_line_hint *in_reach(const dft_deflate *d, uint64_t slot, const dft_line_hint *h) {
    const uint64_t tag = d->pass << PASS_SHIFT;
    const dft_line_hint *r = slot >> PASS_SHIFT == d->pass ? d->h + (slot - tag) - 1 : NULL;
    return r && r->at + r->len <= h->at && h->at + h->len - r->at <= WINDOW ? r : NULL;
}

/* The line of hint h against the last earlier line of its key, which the
 * writer vouches is the same outside the id, ts and dur fields
 * (put_against). Without one in the window, against the last line of its
 * fam (one name and track: the name parts are the same), else of its cls (a
 * module slice: its name is its own, its last line a whole graph call back,
 * the line before it an op; the last slice of its type is alike but for the
 * name): where the text before the id and between ts and dur is the same,
 * the name part and the args as the bytes both lines' parts start and end
 * with, and the middles compared as put_line does. Since lines of one key are
 * alike, that comparison is made once per pair of keys (pairs[]). Returns the
 * line's end, or 0 to encode it as any other line. */
static ALWAYS_INLINE size_t put_hinted(dft_deflate *d, enc_t *w, const unsigned char *s, size_t n,
                                       const dft_line_hint *h) {
    const uint16_t *f = h->f;
    if (!hint_ok(h, n))
        return 0;
    uint64_t k = h->key * 0x9e3779b97f4a7c15ull, kf = h->fam * 0x9e3779b97f4a7c15ull;
    uint64_t kc = h->cls * 0x9e3779b97f4a7c15ull;
    uint64_t *slot = &d->hlast[(k >> 40) & (DFT_DEFLATE_KEYS - 1)], tag = d->pass << PASS_SHIFT;
    uint64_t *fslot = &d->hfam[(kf >> 40) & (DFT_DEFLATE_KEYS - 1)], self = tag + (uint64_t)(h - d->h) + 1;
    uint64_t *cslot = &d->hcls[(kc >> 40) & (DFT_DEFLATE_KEYS - 1)];
    const dft_line_hint *r = *slot >> PASS_SHIFT == d->pass ? d->h + (*slot - tag) - 1 : NULL;
    const uint64_t cls_last = *cslot; /* looked at only where neither key nor fam has a line in reach */
    *slot = self;
    *cslot = self;
    size_t la = h->len - f[5];
    if (r && r->key == h->key && r->at + r->len <= h->at && h->at + h->len - r->at <= WINDOW) {
        *fslot = self;
        if (f[0] != r->f[0] || f[2] - f[1] != r->f[2] - r->f[1] || f[4] - f[3] != r->f[4] - r->f[3] ||
            la != r->len - r->f[5])
            return 0;
        return put_against(w, s, h, r, NULL);
    }
    r = in_reach(d, *fslot, h);
    *fslot = self;
    const dft_line_hint *rc = r ? NULL : in_reach(d, cls_last, h);
    if (!r && !(r = rc))
        return 0;
    pair_t *c = &d->pairs[(k >> 40) & (DFT_DEFLATE_KEYS - 1)];
    if (c->key != h->key || c->ref != r->key) { /* the parts' lengths too are the same for every such pair */
        const uint16_t *g = r->f;
        const unsigned char *a = s + h->at, *b = s + r->at;
        size_t lb = r->len - g[5], mn = la < lb ? la : lb;
        size_t l1 = f[2] - f[1], lb1 = g[2] - g[1], mn1 = l1 < lb1 ? l1 : lb1;
        c->key = h->key;
        c->ref = r->key;
        c->plan[0].n = c->plan[1].n = 0;
        c->same = f[0] == g[0] && f[4] - f[3] == g[4] - g[3] && !memcmp(a, b, f[0]) &&
                  !memcmp(a + f[3], b + g[3], f[4] - f[3]);
        c->p1 = (uint16_t)prefix_in(a + f[1], b + g[1], mn1);
        c->q1 = c->p1 == l1 && l1 == lb1 ? 0 : (uint16_t)suffix_in(a + f[2], b + g[2], mn1 - c->p1);
        c->p = (uint16_t)prefix_in(a + f[5], b + g[5], mn);
        c->q = c->p == la && la == lb ? 0 : (uint16_t)suffix_in(a + h->len, b + r->len, mn - c->p);
    }
    if (!c->same) {
        if (!rc)
            rc = in_reach(d, cls_last, h);
        return rc ? put_line(w, s, h->at, n, rc->at) : 0;
    }
    return put_against(w, s, h, r, c);
}

/* The dynamic block header of d->next into d->hdr: BFINAL, dynamic codes, all 286 + 30 lengths,
 * each in the code-length code. */
static void make_header(dft_deflate *d) {
    static const uint8_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    const codes_t *c = &d->next;
    uint32_t nl[19] = {0}, cl[19];
    uint8_t cl_len[19];
    for (unsigned i = 0; i < 16; i++)
        nl[i] = 1;
    for (unsigned i = 0; i < NLIT; i++)
        nl[c->lit_len[i]]++;
    for (unsigned i = 0; i < NDIST; i++)
        nl[c->dist_len[i]]++;
    huff_lengths(nl, 19, 7, cl_len);
    make_codes(cl_len, 19, cl);
    /* at most 17 + 19 * 3 + 316 * 7 bits: 72 words, and the last partial one */
    enc_t w = {0, 0, (unsigned char *)d->hdr, NULL, NULL, NULL, NULL, NULL, NULL};
    put_bits(&w, 1 | 2 << 1 | (NLIT - 257) << 3 | (NDIST - 1) << 8 | (19 - 4) << 13, 17);
    for (unsigned i = 0; i < 19; i++)
        put_bits(&w, cl_len[order[i]], 3);
    for (unsigned i = 0; i < NLIT + NDIST; i++) {
        uint32_t k = cl[i < NLIT ? c->lit_len[i] : c->dist_len[i - NLIT]];
        put_bits(&w, k & 0xffff, k >> 16);
    }
    d->hdr_bits = (unsigned)(w.o - (unsigned char *)d->hdr) * 8 + (unsigned)w.bn;
    uint32_t rest = (uint32_t)w.bb;
    memcpy(w.o, &rest, 4);
}

/* One block of every line of s[0..n) with the codes w->c; its symbols are counted in d. */
static void put_block(dft_deflate *d, enc_t *w, const unsigned char *s, size_t n) {
    if (++d->pass >> (64 - PASS_SHIFT)) { /* after 2^24 blocks */
        memset(d->last, 0, sizeof d->last);
        memset(d->hlast, 0, sizeof d->hlast);
        memset(d->hfam, 0, sizeof d->hfam);
        memset(d->hcls, 0, sizeof d->hcls);
        d->pass = 1;
    }
    memset(d->nlit, 0, sizeof d->nlit);
    memset(d->ndist, 0, sizeof d->ndist);
    memset(d->npair, 0, sizeof d->npair);
    w->nlit = d->nlit;
    w->ndist = d->ndist;
    w->npair = d->npair;
    w->pair = d->pair;
    w->lz = d->lz;
    if (d->paired != w->c) {
        make_pairs(w->c, d->pair);
        d->paired = w->c;
    }
    /* a record whose copied events go out as kept blocks (put_record) ends this block early */
    const dft_record_copy *cp = &d->cp;
    unsigned last = !(d->rec && cp->len && d->rec - 1 <= cp->keys && cp->keys + cp->nkeys <= cp->nums &&
                      cp->nums <= cp->at && cp->at + cp->len <= n);
    if (last)
        d->cp.len = 0;
    d->ended = 0;
    put_header(d, w, last);
    enc_t e = *w; /* a local: the output's bytes cannot alias it, it stays in registers */
    const dft_line_hint *h = d->h, *he = h ? h + d->nh : NULL;
    for (size_t pos = 0, prev = 0, next; pos < n; prev = pos, pos = next) {
        if (pos + 1 == d->rec) {
            enc_t t = e; /* a copy: e's address escapes not, e stays in registers */
            next = put_record(d, &t, s, pos, n);
            e = t;
            continue;
        }
        while (h < he && h->at < pos)
            h++;
        if (h < he && h->at == pos && (next = put_hinted(d, &e, s, n, h++)))
            continue;
        next = put_line(&e, s, pos, n, pick_ref(d, s, pos, n, prev));
    }
    *w = e;
    for (unsigned i = 0; i < 256; i++) {
        d->nlit[PAIR_FIRST + (i >> 4)] += d->npair[i];
        d->nlit[PAIR_FIRST + (i & 15)] += d->npair[i];
    }
    if (d->ended)
        return;
    w->nlit[256]++; /* end of block */
    put_bits(w, w->c->lit[256] & 0xffff, w->c->lit[256] >> 16);
    if (!last) /* the record was not met: an empty last block */
        put_bits(w, 1 | 1 << 1 | (uint64_t)(fixed.lit[256] & 0xffff) << 3, 3 + (fixed.lit[256] >> 16));
}

/* Bits of the symbols counted in d with codes c (extra bits left out). */
static uint64_t cost(const dft_deflate *d, const codes_t *c) {
    uint64_t b = 0;
    for (unsigned i = 0; i < NLIT; i++)
        b += (uint64_t)d->nlit[i] * c->lit_len[i];
    for (unsigned i = 0; i < NDIST; i++)
        b += (uint64_t)d->ndist[i] * c->dist_len[i];
    return b;
}

dft_deflate *dft_deflate_new(void) {
    pthread_once(&tables_once, init_tables);
    return calloc(1, sizeof(dft_deflate));
}

void dft_deflate_hints(dft_deflate *d, const dft_line_hint *h, size_t n) {
    d->h = h;
    d->nh = h ? n : 0;
    d->rec = 0;
    d->cp.len = 0;
}

void dft_deflate_record(dft_deflate *d, size_t at, uint32_t crc, const dft_record_copy *copy) {
    d->rec = at + 1;
    d->rec_crc = crc;
    d->cp = copy ? *copy : (dft_record_copy){0, 0, 0, 0, 0, 0};
}

void dft_deflate_free(dft_deflate *d) {
    for (int k = 0; d && k < 2; k++) {
        free(d->kept[k].w);
        free(d->kept[k].end);
    }
    free(d);
}

size_t dft_gzip_bound(size_t n) {
    return 2 * n + 512; /* codes of at most 15 bits per byte, the dynamic block's header */
}

/* Symbols counted before the codes are made again: making them costs ~80k
 * instructions, much per event where members are small (at least one a
 * second, whatever the event rate). Until codes were made from FIRST_SYMBOLS
 * (the file's first members: its header and compile events, unlike what
 * follows) they are made after every member. */
#define REMAKE_SYMBOLS (1u << 17)
#define FIRST_SYMBOLS (1u << 15)

/* A member is encoded with codes made for the symbols of the members before
 * it (those since the codes were last made; every symbol possible: each
 * counted once more), or fixed codes: for the first member, or where fixed
 * codes come out clearly shorter (the member differs from the ones before:
 * it is encoded again). */
size_t dft_gzip_member(dft_deflate *d, const char *text, size_t n, unsigned char *out) {
    const unsigned char *s = (const unsigned char *)text;
    static const unsigned char head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff};
    memcpy(out, head, sizeof head);
    enc_t w = {0, 0, out + sizeof head, d->have_next ? &d->next : &fixed, NULL, NULL, NULL, NULL, NULL};
    put_block(d, &w, s, n);
    uint64_t fixed_cost = w.c == &fixed ? 0 : cost(d, &fixed);
    if (w.c != &fixed && fixed_cost + fixed_cost / 16 < cost(d, w.c)) {
        w = (enc_t){0, 0, out + sizeof head, &fixed, NULL, NULL, NULL, NULL, NULL};
        put_block(d, &w, s, n);
    }
    unsigned char *o = w.o;
    for (; w.bn > 0; w.bn = w.bn > 8 ? w.bn - 8 : 0, w.bb >>= 8)
        *o++ = (unsigned char)w.bb;
    const size_t r = d->rec && d->rec - 1 <= n ? d->rec - 1 : 0;
    uint32_t t[2] = {crc32_of(r ? d->rec_crc : 0, s + r, n - r), (uint32_t)n};
    for (unsigned k = 0; k < 8; k++)
        *o++ = (unsigned char)(t[k / 4] >> (8 * (k % 4)));
    d->h = NULL; /* hints hold for one member */
    d->nh = 0;
    d->rec = 0;
    d->cp.len = 0;
    for (unsigned i = 0; i < NLIT; i++)
        d->acc_n += d->nlit[i], d->acc_lit[i] += d->nlit[i];
    for (unsigned i = 0; i < NDIST; i++)
        d->acc_dist[i] += d->ndist[i];
    if (d->have_next && d->made_n >= FIRST_SYMBOLS && d->acc_n < REMAKE_SYMBOLS)
        return (size_t)(o - out);
    d->made_n += d->acc_n;
    for (unsigned i = 0; i < NLIT; i++)
        d->acc_lit[i]++;
    for (unsigned i = 0; i < NDIST; i++)
        d->acc_dist[i]++;
    huff_lengths(d->acc_lit, NLIT, 15, d->next.lit_len);
    huff_lengths(d->acc_dist, NDIST, 15, d->next.dist_len);
    make_all_codes(&d->next);
    make_header(d);
    d->paired = NULL;
    d->have_next = 1;
    memset(d->acc_lit, 0, sizeof d->acc_lit);
    memset(d->acc_dist, 0, sizeof d->acc_dist);
    d->acc_n = 0;
    return (size_t)(o - out);
}
