/* Module slices (docs/design.rst, "Module spans"). boundary(): opened and
 * closed by calls the backend inserts into each graph at the boundaries of
 * nn.Module calls, one call per boundary, never per op; the starts of the
 * slices open in graphs stay on a per-thread stack here, so a boundary call
 * passes constant site ids and returns nothing. span(): the same with the
 * starts passed in and out, for the forward hooks around a module's eager
 * code. */
#include "core.h"

#include <pthread.h>

/* Start times (ns since the epoch: three 30-bit digits) and site ids go
 * through Python ints on every boundary call: on CPython 3.11 they are read
 * and made from their digits directly. PyLong_AsUnsignedLongLong goes
 * through _PyLong_AsByteArray for any int of more than one digit, which took
 * a third of a boundary call's instructions. */
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
#define DFT_FAST_LONG 1
#else
#define DFT_FAST_LONG 0
#endif

static inline int get_u64(PyObject *o, unsigned long long *v) {
#if DFT_FAST_LONG
    if (DFT_LIKELY(PyLong_CheckExact(o))) {
        Py_ssize_t n = Py_SIZE(o);
        const digit *d = ((PyLongObject *)o)->ob_digit;
        if (n >= 0 && n <= 3 && (n < 3 || d[2] < (1u << (64 - 2 * PyLong_SHIFT)))) {
            unsigned long long x = 0;
            for (Py_ssize_t i = n; i-- > 0;)
                x = x << PyLong_SHIFT | d[i];
            *v = x;
            return 0;
        }
    }
#endif
    *v = PyLong_AsUnsignedLongLong(o);
    return *v == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

static inline PyObject *new_u64(uint64_t v) {
#if DFT_FAST_LONG
    if (DFT_LIKELY(v >> (2 * PyLong_SHIFT))) { /* any u64 fits in three digits */
        PyLongObject *o = _PyLong_New(3);
        if (o) {
            o->ob_digit[0] = (digit)(v & PyLong_MASK);
            o->ob_digit[1] = (digit)(v >> PyLong_SHIFT & PyLong_MASK);
            o->ob_digit[2] = (digit)(v >> (2 * PyLong_SHIFT));
        }
        return (PyObject *)o;
    }
#endif
    return PyLong_FromUnsignedLongLong(v);
}

/* span(cell) returns now; span(cell, grad, start_ns, site, ...) records the
 * closed (start_ns, site) spans of a module's forward call, with grad mode
 * `grad` (as a graph call's context: forward, or inference without grad), and
 * returns now. */
PyObject *dft_py_span(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (DFT_UNLIKELY(nargs < 1 || nargs == 2 || (nargs > 1 && (nargs & 1)))) {
        PyErr_SetString(PyExc_TypeError, "span() takes a cell, then grad and (start_ns, site) pairs");
        return NULL;
    }
    PyObject *cell = args[0];
    if (DFT_UNLIKELY(cell != Py_None && !PyObject_TypeCheck(cell, &dft_TagCellType))) {
        PyErr_SetString(PyExc_TypeError, "cell must be a TagCell or None");
        return NULL;
    }
    if (DFT_UNLIKELY(!dft_ops_recording()))
        return PyLong_FromLong(0); /* spans opened now are never recorded */
    uint64_t now = dft_now();
    uint32_t tags = cell == Py_None ? 0 : ((dft_TagCell *)cell)->id;
    uint32_t nsites = atomic_load_explicit(&dft_sites.count, memory_order_relaxed);
    uint32_t ctx = 0;
    if (nargs > 1) {
        int grad = PyObject_IsTrue(args[1]);
        if (grad < 0)
            return NULL;
        ctx = grad ? DFT_FLAG_GRAD | DFT_PHASE_FORWARD << DFT_PHASE_SHIFT
                   : DFT_PHASE_INFERENCE << DFT_PHASE_SHIFT;
    }
    for (Py_ssize_t i = 2; i < nargs; i += 2) {
        unsigned long long start, site;
        if (get_u64(args[i], &start) < 0 || get_u64(args[i + 1], &site) < 0)
            return NULL;
        if (DFT_UNLIKELY(site == 0 || site >= nsites)) {
            PyErr_Format(PyExc_ValueError, "unknown site id %llu", site);
            return NULL;
        }
        if (start) /* 0: opened while nothing was recorded */
            dft_push((uint32_t)site, start, now, ctx, tags, NULL);
    }
    return new_u64(now);
}

/* ---- boundary(): the per-thread stack of open slices --------------------- */

static pthread_key_t open_key;
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static void open_key_make(void) { pthread_key_create(&open_key, free); }

__attribute__((noinline)) int dft_open_grow(uint32_t n) {
    if (n > DFT_OPEN_MAX)
        return 0;
    uint32_t cap = dft_tls.open_cap ? dft_tls.open_cap : 32;
    while (cap < n)
        cap *= 2;
    uint64_t *p = realloc(dft_tls.open, cap * sizeof *p);
    if (!p)
        return 0;
    pthread_once(&open_once, open_key_make);
    pthread_setspecific(open_key, p); /* freed when the thread ends */
    dft_tls.open = p;
    dft_tls.open_cap = cap;
    return 1;
}

int dft_parse_sites(PyObject *const *items, uint32_t n, uint32_t *sites) {
    uint32_t nsites = atomic_load_explicit(&dft_sites.count, memory_order_relaxed);
    for (uint32_t j = 0; j < n; j++) {
        unsigned long long site;
        if (DFT_UNLIKELY(!PyLong_Check(items[j]))) {
            PyErr_Format(PyExc_TypeError, "site ids are ints, not %.100s", Py_TYPE(items[j])->tp_name);
            return -1;
        }
        if (get_u64(items[j], &site) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            site = 0; /* a negative or huge int: unknown too */
        }
        if (DFT_UNLIKELY(site == 0 || site >= nsites)) {
            PyErr_Format(PyExc_ValueError, "unknown site id %R", items[j]);
            return -1;
        }
        sites[j] = (uint32_t)site;
    }
    return 0;
}

/* boundary(cell, opened, site, ...): dft_boundary() at now. The GraphCall
 * around the graph puts the depth back when the graph ends, so a graph that
 * raised leaves nothing open. */
PyObject *dft_py_boundary(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    unsigned long long opened;
    if (DFT_UNLIKELY(nargs < 2 || get_u64(args[1], &opened) < 0 || opened > DFT_OPEN_MAX)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "boundary() takes a cell, the number of slices opened "
                                             "and the sites of those closed");
        return NULL;
    }
    PyObject *cell = args[0];
    if (DFT_UNLIKELY(cell != Py_None && !PyObject_TypeCheck(cell, &dft_TagCellType))) {
        PyErr_SetString(PyExc_TypeError, "cell must be a TagCell or None");
        return NULL;
    }
    uint32_t closed = (uint32_t)(nargs - 2), few[32], *sites = few;
    uint64_t now = 0; /* the start of the slices opened: 0 when nothing is recorded */
    if (DFT_LIKELY(dft_ops_recording())) { /* otherwise the sites are not read */
        if (DFT_UNLIKELY(closed > 32) && !(sites = PyMem_Malloc(closed * sizeof *sites)))
            return PyErr_NoMemory();
        if (dft_parse_sites(args + 2, closed, sites) < 0) {
            if (sites != few)
                PyMem_Free(sites);
            return NULL;
        }
        now = dft_tick();
    }
    dft_boundary(now, (uint32_t)opened, sites, closed, cell == Py_None ? 0 : ((dft_TagCell *)cell)->id);
    if (sites != few)
        PyMem_Free(sites);
    Py_RETURN_NONE;
}
