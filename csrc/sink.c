/* Output: plain text, gzip level 1 with every member independent, or zstd
 * level 1 with independent frames. A compressed member is written with one
 * write() when it ends, so a file cut by a crash holds whole members only
 * (up to the one being written). */
#include "core.h"

#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

/* The few libzstd entry points we use; the build has no zstd headers. */
typedef struct {
    const void *src;
    size_t size, pos;
} ZSTD_inBuffer;
typedef struct {
    void *dst;
    size_t size, pos;
} ZSTD_outBuffer;
enum { ZSTD_c_compressionLevel = 100 };
enum { ZSTD_e_continue = 0, ZSTD_e_end = 2 };

static struct {
    void *(*createCCtx)(void);
    size_t (*freeCCtx)(void *);
    size_t (*setParameter)(void *, int, int);
    size_t (*compressStream2)(void *, ZSTD_outBuffer *, ZSTD_inBuffer *, int);
    unsigned (*isError)(size_t);
    const char *(*getErrorName)(size_t);
    size_t (*outSize)(void);
    int loaded;
} zs;

static int zstd_load(char *err, size_t errlen) {
    if (zs.loaded)
        return 0;
    void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "zstd compression needs libzstd.so.1: %s", dlerror());
        return -1;
    }
#define SYM(field, name)                                                                   \
    if (!(*(void **)&zs.field = dlsym(h, name))) {                                         \
        snprintf(err, errlen, "libzstd.so.1 lacks %s (zstd >= 1.4 needed)", name);         \
        return -1;                                                                         \
    }
    SYM(createCCtx, "ZSTD_createCCtx")
    SYM(freeCCtx, "ZSTD_freeCCtx")
    SYM(setParameter, "ZSTD_CCtx_setParameter")
    SYM(compressStream2, "ZSTD_compressStream2")
    SYM(isError, "ZSTD_isError")
    SYM(getErrorName, "ZSTD_getErrorName")
    SYM(outSize, "ZSTD_CStreamOutSize")
#undef SYM
    zs.loaded = 1;
    return 0;
}

int dft_sink_init(dft_sink *k, int mode, char *err, size_t errlen) {
    memset(k, 0, sizeof *k);
    k->fd = -1;
    k->mode = mode;
    if (mode == 1) {
        /* windowBits 16+15: gzip wrapper; deflateReset starts a new member. */
        if (deflateInit2(&k->z, 1, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
            snprintf(err, errlen, "zlib deflateInit2 failed");
            return -1;
        }
    } else if (mode == 2) {
        if (zstd_load(err, errlen) < 0)
            return -1;
        k->zc = zs.createCCtx();
        if (!k->zc) {
            snprintf(err, errlen, "ZSTD_createCCtx failed");
            return -1;
        }
        size_t r = zs.setParameter(k->zc, ZSTD_c_compressionLevel, 1);
        if (zs.isError(r)) {
            snprintf(err, errlen, "zstd: %s", zs.getErrorName(r));
            zs.freeCCtx(k->zc);
            k->zc = NULL;
            return -1;
        }
    }
    return 0;
}

void dft_sink_set_fd(dft_sink *k, int fd) { k->fd = fd; }

static void write_all(dft_sink *k, const char *p, size_t n) {
    while (n && !k->err) {
        ssize_t w = write(k->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            k->err = errno;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Compress input into k->out, growing it as needed. */
static int gz_run(dft_sink *k, const char *p, size_t n, int flush) {
    k->z.next_in = (Bytef *)p;
    k->z.avail_in = (uInt)n;
    for (;;) {
        if (dft_buf_reserve(&k->out, 65536) < 0)
            return -1;
        k->z.next_out = (Bytef *)(k->out.p + k->out.len);
        k->z.avail_out = (uInt)(k->out.cap - k->out.len);
        int rc = deflate(&k->z, flush);
        k->out.len = k->out.cap - k->z.avail_out;
        if (rc == Z_STREAM_END)
            return 0;
        if (rc != Z_OK && rc != Z_BUF_ERROR)
            return -1;
        if (flush == Z_NO_FLUSH && k->z.avail_in == 0)
            return 0;
    }
}

static int zs_run(dft_sink *k, const char *p, size_t n, int end) {
    ZSTD_inBuffer in = {p, n, 0};
    size_t chunk = zs.outSize();
    for (;;) {
        if (dft_buf_reserve(&k->out, chunk) < 0)
            return -1;
        ZSTD_outBuffer out = {k->out.p, k->out.cap, k->out.len};
        size_t r = zs.compressStream2(k->zc, &out, &in, end ? ZSTD_e_end : ZSTD_e_continue);
        k->out.len = out.pos;
        if (zs.isError(r))
            return -1;
        if (end ? r == 0 : in.pos == in.size)
            return 0;
    }
}

int dft_sink_put(dft_sink *k, const char *p, size_t n) {
    if (!n)
        return 0;
    k->in_member += n;
    if (k->mode == 0) {
        write_all(k, p, n);
        return 0;
    }
    return k->mode == 1 ? gz_run(k, p, n, Z_NO_FLUSH) : zs_run(k, p, n, 0);
}

int dft_sink_member(dft_sink *k) {
    if (k->mode == 0 || k->in_member == 0)
        return 0;
    int rc = k->mode == 1 ? gz_run(k, NULL, 0, Z_FINISH) : zs_run(k, NULL, 0, 1);
    if (k->mode == 1)
        deflateReset(&k->z);
    write_all(k, k->out.p, k->out.len);
    k->out.len = 0;
    k->in_member = 0;
    return rc;
}

void dft_sink_free(dft_sink *k) {
    if (k->mode == 1)
        deflateEnd(&k->z);
    else if (k->mode == 2 && k->zc)
        zs.freeCCtx(k->zc);
    k->zc = NULL;
    k->mode = 0;
    dft_buf_free(&k->out);
}
