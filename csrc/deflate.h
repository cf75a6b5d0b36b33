/* The writer's own gzip encoder for trace lines (deflate.c). */
#ifndef DFT_DEFLATE_H
#define DFT_DEFLATE_H

#include <stddef.h>
#include <stdint.h>

#define DFT_DEFLATE_KEYS 4096

/* An encoder's state: one per file, its members in order (each member's
 * codes are made from the previous one's symbols). */
typedef struct dft_deflate dft_deflate;
dft_deflate *dft_deflate_new(void); /* NULL: out of memory */
void dft_deflate_free(dft_deflate *d);

/* Where the writer put the parts of an event line that change from event to
 * event: the id, ts and dur digits, f[] their start and end offsets in the
 * line. The writer vouches that lines of one key are byte for byte the same
 * outside those fields, in every member of the encoder's file (writer.c: one
 * site's tail text, one track). Lines of one fam are alike (one name and
 * category, one track): the encoder compares such a line with the last one
 * of its fam, trusting nothing but the keys. Lines of one cls share their
 * category and track (a module slice: no other line has its name); without a
 * line of its key or fam in reach, a line is compared with the last one of
 * its cls, trusting nothing (the writer's cls: one category, track and args,
 * any name). */
typedef struct {
    uint64_t key, fam, cls;
    uint32_t at, len; /* the line, '\n' included, in the member's text */
    uint16_t f[6];
} dft_line_hint;
/* Hints for the lines of the next dft_gzip_member call on d (h[] in the
 * order of the text; kept, not copied, until that call); NULL: none. Hints
 * out of bounds or order are ignored; the rest are trusted. */
void dft_deflate_hints(dft_deflate *d, const dft_line_hint *h, size_t n);
/* The parts of an aggregate record (aggregates.c), as offsets in the member's text: from keys,
 * nkeys bytes of group keys, text that only grows from record to record; from nums its
 * statistics, numbers that change from record to record; from at, len bytes of copied events,
 * which only grow too, but for their last bytes: their first stable bytes are those of the file's
 * previous record. */
typedef struct dft_record_copy {
    size_t keys, nkeys, nums, at, len, stable;
} dft_record_copy;
/* After dft_deflate_hints: the line at offset at of the next member's text is an aggregate
 * record, encoded apart, and crc the CRC-32 of the text before it (computed for the record's
 * covers), which the member's CRC goes on from. With copy (len > 0): its numbers go out as
 * literals (a match search finds little in them), its keys and copied events as the deflate
 * blocks kept from the file's earlier records for their stable part, only the rest encoded
 * (once, and kept in its turn). */
void dft_deflate_record(dft_deflate *d, size_t at, uint32_t crc, const dft_record_copy *copy);

/* CRC-32 as zlib's crc32(crc, p, n), with carry-less multiplication where the CPU has it
 * (~0.35 instructions a byte against zlib's ~3 here): the sink's running CRC of the file and
 * the aggregate record's covers. */
uint32_t dft_crc32(uint32_t crc, const void *p, size_t n);

/* Bytes of output that dft_gzip_member never exceeds for n bytes of input. */
size_t dft_gzip_bound(size_t n);
/* One complete gzip member (RFC 1952) holding p[0..n), independent of the
 * others; returns its size. */
size_t dft_gzip_member(dft_deflate *d, const char *p, size_t n, unsigned char *out);

#endif
