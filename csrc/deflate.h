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

/* Bytes of output that dft_gzip_member never exceeds for n bytes of input. */
size_t dft_gzip_bound(size_t n);
/* One complete gzip member (RFC 1952) holding p[0..n), independent of the
 * others; returns its size. */
size_t dft_gzip_member(dft_deflate *d, const char *p, size_t n, unsigned char *out);

#endif
