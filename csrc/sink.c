/* Output: plain text, gzip where every member is independent, or zstd level 1
 * with independent frames. The writer hands over whole members; each
 * is compressed in one call and written with one write(), so a file cut by a
 * crash holds whole members only (up to the one being written), and a failed
 * write is cut back with dft_sink_cut: to the last whole member, or in plain
 * text to the last whole line. A file deleted meanwhile fails the next write.
 *
 * gzip (mode 1) is the writer's own encoder for trace lines (deflate.c).
 * Mode 3, gzip with a general deflate (gzip-general), uses libdeflate level 1
 * when libdeflate.so.0 can be loaded (about 1.8x faster than zlib at level 1
 * on trace lines, slightly smaller output) and zlib otherwise. zstd comes
 * from libzstd.so.1. Both are loaded with dlopen so the build needs neither
 * library's headers. */
#include "core.h"
#include "deflate.h"

#include <dlfcn.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

enum { ZSTD_c_compressionLevel = 100 };

static struct {
    void *(*createCCtx)(void);
    size_t (*freeCCtx)(void *);
    size_t (*setParameter)(void *, int, int);
    size_t (*compress2)(void *, void *, size_t, const void *, size_t);
    size_t (*bound)(size_t);
    unsigned (*isError)(size_t);
    const char *(*getErrorName)(size_t);
    int loaded;
} zs;

static struct {
    void *(*alloc)(int);
    void (*free)(void *);
    size_t (*compress)(void *, const void *, size_t, void *, size_t);
    size_t (*bound)(void *, size_t);
    int tried;
} ld;

#define SYM(lib, h, field, name, fail)                                                     \
    if (!(*(void **)&lib.field = dlsym(h, name))) {                                        \
        fail;                                                                              \
    }

static int zstd_load(char *err, size_t errlen) {
    if (zs.loaded)
        return 0;
    void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "zstd compression needs libzstd.so.1: %s", dlerror());
        return -1;
    }
#define ZSYM(field, name)                                                                  \
    SYM(zs, h, field, name, snprintf(err, errlen, "libzstd.so.1 lacks %s (zstd >= 1.4 needed)", \
                                     name);                                                \
        return -1)
    ZSYM(createCCtx, "ZSTD_createCCtx")
    ZSYM(freeCCtx, "ZSTD_freeCCtx")
    ZSYM(setParameter, "ZSTD_CCtx_setParameter")
    ZSYM(compress2, "ZSTD_compress2")
    ZSYM(bound, "ZSTD_compressBound")
    ZSYM(isError, "ZSTD_isError")
    ZSYM(getErrorName, "ZSTD_getErrorName")
#undef ZSYM
    zs.loaded = 1;
    return 0;
}

/* Optional: a missing or incomplete libdeflate means zlib. */
static void libdeflate_load(void) {
    if (ld.tried)
        return;
    ld.tried = 1;
    void *h = dlopen("libdeflate.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    SYM(ld, h, alloc, "libdeflate_alloc_compressor", goto none)
    SYM(ld, h, free, "libdeflate_free_compressor", goto none)
    SYM(ld, h, compress, "libdeflate_gzip_compress", goto none)
    SYM(ld, h, bound, "libdeflate_gzip_compress_bound", goto none)
    return;
none:
    ld.alloc = NULL;
}

int dft_sink_init(dft_sink *k, int mode, char *err, size_t errlen) {
    memset(k, 0, sizeof *k);
    k->fd = -1;
    k->mode = mode;
    if (mode == 1) {
        if (!(k->dfl = dft_deflate_new())) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    } else if (mode == 3) {
        libdeflate_load();
        if (ld.alloc && (k->ld = ld.alloc(1)))
            return 0;
        /* windowBits 16+15: gzip wrapper; deflateReset starts a new member. */
        if (deflateInit2(&k->z, 1, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
            snprintf(err, errlen, "zlib deflateInit2 failed");
            return -1;
        }
        k->z_init = 1;
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
            return -1;
        }
    }
    return 0;
}

static void write_all(dft_sink *k, const char *p, size_t n) {
    const char *start = p;
    size_t total = n;
    k->kept = 0;
    while (n && !k->err) {
        ssize_t w = write(k->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            k->err = errno;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    if (!k->err) {
        k->good += total;
        k->crc = dft_crc32(k->crc, start, total);
    } else if (k->mode == 0) { /* plain text: the whole lines that fit stay */
        size_t done = (size_t)(p - start);
        while (done && start[done - 1] != '\n')
            done--;
        k->good += done;
        k->crc = dft_crc32(k->crc, start, done);
        k->kept = done;
    }
}

/* After a failed write: the file ends at its last whole member again. */
void dft_sink_cut(dft_sink *k) {
    if (ftruncate(k->fd, (off_t)k->good) < 0 || lseek(k->fd, (off_t)k->good, SEEK_SET) < 0)
        k->cut_err = errno;
}

int dft_sink_compress(dft_sink *k, const char *p, size_t n) {
    k->out.len = 0;
    if (k->dfl) {
        if (dft_buf_reserve(&k->out, dft_gzip_bound(n)) < 0)
            return -1;
        k->out.len = dft_gzip_member(k->dfl, p, n, (unsigned char *)k->out.p);
        return 0;
    }
    if (k->ld) {
        size_t bound = ld.bound(k->ld, n);
        if (dft_buf_reserve(&k->out, bound) < 0)
            return -1;
        k->out.len = ld.compress(k->ld, p, n, k->out.p, k->out.cap);
        return k->out.len ? 0 : -1;
    }
    if (k->mode == 3) {
        if (dft_buf_reserve(&k->out, deflateBound(&k->z, n)) < 0)
            return -1;
        k->z.next_in = (Bytef *)p;
        k->z.avail_in = (uInt)n;
        k->z.next_out = (Bytef *)k->out.p;
        k->z.avail_out = (uInt)k->out.cap;
        int rc = deflate(&k->z, Z_FINISH);
        k->out.len = k->out.cap - k->z.avail_out;
        deflateReset(&k->z);
        return rc == Z_STREAM_END ? 0 : -1;
    }
    if (dft_buf_reserve(&k->out, zs.bound(n)) < 0)
        return -1;
    size_t r = zs.compress2(k->zc, k->out.p, k->out.cap, p, n);
    if (zs.isError(r))
        return -1;
    k->out.len = r;
    return 0;
}

int dft_sink_deleted(const dft_sink *k) {
    struct stat st;
    return fstat(k->fd, &st) == 0 && st.st_nlink == 0;
}

int dft_sink_write(dft_sink *k, const char *p, size_t n) {
    if (!n || k->err)
        return k->err ? -1 : 0;
    if (dft_sink_deleted(k)) { /* writes would go nowhere */
        k->err = ENOENT;
        k->kept = 0;
        return -1;
    }
    if (k->mode == 0) {
        write_all(k, p, n);
    } else if (dft_sink_compress(k, p, n) < 0) {
        k->err = ENOMEM;
    } else {
        write_all(k, k->out.p, k->out.len);
    }
    return k->err ? -1 : 0;
}

void dft_sink_free(dft_sink *k) {
    if (k->ld)
        ld.free(k->ld);
    if (k->z_init)
        deflateEnd(&k->z);
    if (k->zc)
        zs.freeCCtx(k->zc);
    dft_deflate_free(k->dfl);
    k->dfl = NULL;
    k->ld = k->zc = NULL;
    k->z_init = 0;
    dft_buf_free(&k->out);
}

/* One part's hints: a sequence of (key, fam, at, len, f0, .., f5[, cls]) (deflate.h; cls: fam
 * when left out); *h NULL: none.
 * 0, or -1 with an exception set. */
static int hints_of(PyObject *seq, dft_line_hint **h, size_t *n) {
    *h = NULL;
    *n = 0;
    if (seq == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(seq, "gzip_members() hints: a sequence of tuples per part");
    if (!fast)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    *h = malloc((size_t)(k ? k : 1) * sizeof **h);
    if (!*h) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        dft_line_hint *x = &(*h)[i];
        unsigned long long key, fam, cls = 0;
        unsigned at, len;
        unsigned short f[6];
        PyObject *t = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyArg_ParseTuple(t, "KKIIHHHHHH|K", &key, &fam, &at, &len, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5],
                              &cls)) {
            free(*h);
            *h = NULL;
            Py_DECREF(fast);
            return -1;
        }
        x->key = key, x->fam = fam, x->at = at, x->len = len;
        x->cls = PyTuple_Check(t) && PyTuple_GET_SIZE(t) > 10 ? cls : fam;
        memcpy(x->f, f, sizeof f);
    }
    *n = (size_t)k;
    Py_DECREF(fast);
    return 0;
}

/* gzip_members(parts, hints=None) -> list of bytes: the gzip members of parts
 * (bytes-like), in order, as the writer encodes the members of one file;
 * hints: per part, the writer's hints on its lines (None: none). */
PyObject *dft_py_gzip_members(PyObject *m, PyObject *args) {
    PyObject *parts, *hints = Py_None, *hseq = NULL;
    if (!PyArg_ParseTuple(args, "O|O:gzip_members", &parts, &hints))
        return NULL;
    PyObject *seq = PySequence_Fast(parts, "gzip_members() takes a sequence of bytes");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (hints != Py_None) {
        hseq = PySequence_Fast(hints, "gzip_members() hints: one entry per part");
        if (!hseq || PySequence_Fast_GET_SIZE(hseq) != n) {
            if (hseq)
                PyErr_SetString(PyExc_ValueError, "gzip_members() hints: one entry per part");
            Py_XDECREF(hseq);
            Py_DECREF(seq);
            return NULL;
        }
    }
    PyObject *out = PyList_New(n);
    dft_deflate *d = dft_deflate_new();
    if (!d && out) {
        Py_CLEAR(out);
        PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; out && i < n; i++) {
        Py_buffer in;
        dft_line_hint *h;
        size_t nh;
        if (hints_of(hseq ? PySequence_Fast_GET_ITEM(hseq, i) : Py_None, &h, &nh) < 0) {
            Py_CLEAR(out);
            break;
        }
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &in, PyBUF_SIMPLE) < 0) {
            free(h);
            Py_CLEAR(out);
            break;
        }
        unsigned char *o = malloc(dft_gzip_bound((size_t)in.len));
        PyObject *b = NULL;
        if (o) {
            size_t len;
            Py_BEGIN_ALLOW_THREADS
            dft_deflate_hints(d, h, nh);
            len = dft_gzip_member(d, in.buf, (size_t)in.len, o);
            Py_END_ALLOW_THREADS
            b = PyBytes_FromStringAndSize((const char *)o, (Py_ssize_t)len);
            free(o);
        } else {
            PyErr_NoMemory();
        }
        free(h);
        PyBuffer_Release(&in);
        if (!b)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, b);
    }
    dft_deflate_free(d);
    Py_XDECREF(hseq);
    Py_DECREF(seq);
    return out;
}
