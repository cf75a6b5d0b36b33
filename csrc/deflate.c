/* gzip members made for trace lines, at a few hundred instructions per line.
 *
 * A general deflate searches every position for earlier matches (libdeflate
 * level 1: ~16 instructions per byte). Trace lines need no search: most of a
 * line repeats the previous line of the same event site (name, category, pid,
 * tid, args, field names), and what differs are a few digits (id, ts, dur).
 * Each line is compared with one earlier line, 8 bytes at a time: equal runs
 * become back-references, and at a difference both lines skip to their next
 * JSON delimiter, the bytes skipped in the new line becoming literals. The
 * earlier line is the last one in the member whose first 32 bytes after the
 * id (its name and category) hash alike, or else the previous line. Every
 * back-reference is checked byte by byte against the text, so the output is
 * exact whatever the lines hold; unusual lines only compress less.
 *
 * One fixed-Huffman block per member (RFC 1951), in a standard gzip member
 * (RFC 1952): any gzip reader decodes it. The CRC-32 uses carry-less
 * multiplication where the CPU has it (~0.3 instructions per byte), zlib's
 * crc32 otherwise. */
#include "deflate.h"

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

static int clmul_ok = -1;

static int clmul_usable(void) {
    if (clmul_ok < 0) { /* the CPU has it, and it agrees with zlib (never trust one path alone) */
        unsigned char t[200];
        for (unsigned i = 0; i < sizeof t; i++)
            t[i] = (unsigned char)(i * 131 + 7);
        clmul_ok = __builtin_cpu_supports("pclmul") &&
                   crc32_clmul(0, t, sizeof t) == (uint32_t)crc32(0, t, sizeof t) &&
                   crc32_clmul(0x12345678, t + 3, 67) == (uint32_t)crc32(0x12345678, t + 3, 67);
    }
    return clmul_ok;
}
#endif

uint32_t dft_crc32(uint32_t crc, const void *p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (n >= 64 && clmul_usable())
        return crc32_clmul(crc, p, n);
#endif
    const unsigned char *q = p;
    while (n) { /* zlib takes at most 4 GiB - 1 at once */
        uInt k = n > (1u << 30) ? 1u << 30 : (uInt)n;
        crc = (uint32_t)crc32(crc, q, k);
        q += k;
        n -= k;
    }
    return crc;
}

/* ---- Huffman codes ---------------------------------------------------------- */
/* litlen symbol -> code bits (reversed, as deflate sends them) | length << 16;
 * match length 3..258 -> its length symbol's code and extra bits, and their
 * count; distance code -> code | length << 16. */
static uint32_t lit_code[288], dist_code[30];
static uint32_t mlen_bits[259];
static uint8_t mlen_n[259];
/* distance - 1 -> its code: [v] below 256, [256 + (v >> 7)] above (zlib's trick);
 * per code, the first distance - 1 and the count of extra bits */
static uint8_t dist_of[512];
static uint16_t dist_base[30];
static uint8_t dist_extra[30];
/* where the two lines go on after a difference; '\n' (2) ends a line */
static uint8_t delim[256];
static int tables_ready;

static unsigned reverse(unsigned c, unsigned n) {
    unsigned r = 0;
    for (unsigned i = 0; i < n; i++, c >>= 1)
        r = (r << 1) | (c & 1);
    return r;
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

static void init_tables(void) {
    uint8_t len[288];
    for (unsigned i = 0; i < 288; i++)
        len[i] = i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8;
    make_codes(len, 288, lit_code);
    memset(len, 5, 30);
    make_codes(len, 30, dist_code);
    static const uint16_t base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const uint8_t extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                      2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    for (unsigned s = 0; s < 29; s++) {
        uint32_t c = lit_code[257 + s];
        unsigned cn = c >> 16, top = s == 28 ? 258 : base[s] + (1u << extra[s]) - 1;
        for (unsigned l = base[s]; l <= top; l++) {
            mlen_bits[l] = (c & 0xffff) | (l - base[s]) << cn;
            mlen_n[l] = (uint8_t)(cn + extra[s]);
        }
    }
    for (unsigned c = 0, v = 0; c < 30; c++) {
        dist_extra[c] = (uint8_t)(c < 4 ? 0 : c / 2 - 1);
        dist_base[c] = (uint16_t)v;
        for (unsigned k = 0; k < 1u << dist_extra[c]; k++, v++)
            dist_of[v < 256 ? v : 256 + (v >> 7)] = (uint8_t)c;
    }
    for (const char *d = ",\":}"; *d; d++)
        delim[(unsigned char)*d] = 1;
    delim['\n'] = 2;
    tables_ready = 1;
}

/* ---- bit output --------------------------------------------------------------
 * At most 32 bits at once; 4 bytes go out once 32 are held. */
typedef struct {
    uint64_t bb;
    unsigned bn;
    unsigned char *o;
} bits_t;

static inline void put_bits(bits_t *w, uint64_t v, unsigned n) {
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

static inline void put_lit(bits_t *w, unsigned char c) {
    put_bits(w, lit_code[c] & 0xffff, lit_code[c] >> 16);
}

static inline void put_lits(bits_t *w, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        put_lit(w, s[i]);
}

/* A distance's code and extra bits; the matches of one line mostly share one. */
typedef struct {
    unsigned dist, n;
    uint64_t bits;
} dist_t;

static inline void put_match(bits_t *w, size_t m, unsigned dist, dist_t *d) {
    if (dist != d->dist) {
        unsigned v = dist - 1, code = dist_of[v < 256 ? v : 256 + (v >> 7)];
        uint32_t dc = dist_code[code];
        d->dist = dist;
        d->bits = (dc & 0xffff) | (uint64_t)(v - dist_base[code]) << (dc >> 16);
        d->n = (dc >> 16) + dist_extra[code];
    }
    while (m > 258) {
        size_t l = m < 261 ? m - 3 : 258; /* leave no remainder below 3 */
        put_bits(w, mlen_bits[l], mlen_n[l]);
        put_bits(w, d->bits, d->n);
        m -= l;
    }
    put_bits(w, mlen_bits[m], mlen_n[m]);
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
        size_t *slot = &d->last[(h ^ h >> 29) & (DFT_DEFLATE_KEYS - 1)];
        if (*slot && pos - (*slot - 1) <= WINDOW)
            ref = *slot - 1;
        *slot = pos + 1;
    }
    return pos - ref <= WINDOW ? ref : pos;
}

/* One line from s[i], back-references into the earlier text at j where
 * they agree; returns the start of the next line. */
static size_t put_line(bits_t *w, const unsigned char *s, size_t i, size_t n, size_t j) {
    int nl;
    dist_t d = {0, 0, 0};
    while (j < i) {
        size_t m = common(s + i, s + j, n - i, &nl);
        if (m >= 3 && i - j <= WINDOW)
            put_match(w, m, (unsigned)(i - j), &d);
        else
            put_lits(w, s + i, m);
        i += m;
        j += m;
        if (nl || i == n)
            return i;
        /* a difference: both go on from their next delimiter (stepping over
         * two different ones), the new line's bytes up to it as literals */
        if (delim[s[i]] && delim[s[j]]) {
            if (s[i] == '\n')
                break;
            put_lit(w, s[i++]);
            j++;
        }
        size_t i0 = i;
        for (; i < n && !delim[s[i]]; i++)
            put_lit(w, s[i]);
        if (i == n || s[i] == '\n')
            break;
        if (j + (i - i0) < i && s[j + (i - i0)] == s[i]) /* a field of the same length */
            j += i - i0;
        else
            while (j < i && !delim[s[j]])
                j++;
    }
    const unsigned char *e = memchr(s + i, '\n', n - i);
    size_t end = e ? (size_t)(e - s) + 1 : n;
    put_lits(w, s + i, end - i);
    return end;
}

size_t dft_gzip_bound(size_t n) {
    return n + n / 8 + 32; /* fixed codes: at most 9 bits per byte */
}

size_t dft_gzip_member(dft_deflate *d, const char *text, size_t n, unsigned char *out) {
    if (!tables_ready)
        init_tables();
    const unsigned char *s = (const unsigned char *)text;
    static const unsigned char head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff};
    memcpy(out, head, sizeof head);
    bits_t w = {0, 0, out + sizeof head};
    put_bits(&w, 3, 3); /* BFINAL, fixed Huffman codes */
    memset(d->last, 0, sizeof d->last);
    for (size_t pos = 0, prev = 0, next; pos < n; prev = pos, pos = next)
        next = put_line(&w, s, pos, n, pick_ref(d, s, pos, n, prev));
    put_bits(&w, lit_code[256] & 0xffff, lit_code[256] >> 16);
    unsigned char *o = w.o;
    for (; w.bn > 0; w.bn = w.bn > 8 ? w.bn - 8 : 0, w.bb >>= 8)
        *o++ = (unsigned char)w.bb;
    uint32_t t[2] = {dft_crc32(0, s, n), (uint32_t)n};
    for (unsigned k = 0; k < 8; k++)
        *o++ = (unsigned char)(t[k / 4] >> (8 * (k % 4)));
    return (size_t)(o - out);
}
