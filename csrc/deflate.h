/* The writer's own gzip encoder for trace lines (deflate.c). */
#ifndef DFT_DEFLATE_H
#define DFT_DEFLATE_H

#include <stddef.h>
#include <stdint.h>

#define DFT_DEFLATE_KEYS 4096

typedef struct {
    size_t last[DFT_DEFLATE_KEYS]; /* per line key: start + 1 of its last line in the member */
} dft_deflate;

/* Bytes of output that dft_gzip_member never exceeds for n bytes of input. */
size_t dft_gzip_bound(size_t n);
/* One complete gzip member (RFC 1952) holding p[0..n); returns its size. */
size_t dft_gzip_member(dft_deflate *d, const char *p, size_t n, unsigned char *out);
/* CRC-32 of gzip/zlib, continuing from crc (0 to start). */
uint32_t dft_crc32(uint32_t crc, const void *p, size_t n);

#endif
