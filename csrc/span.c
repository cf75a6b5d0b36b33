/* span(): module slices, opened and closed by calls the backend inserts into
 * each graph at the boundaries of nn.Module calls (docs/design.rst, "Module
 * spans"). One call per boundary, never per op. */
#include "core.h"

PyObject *dft_py_span(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || !(nargs & 1)) {
        PyErr_SetString(PyExc_TypeError, "span() takes a cell and (start_ns, site) pairs");
        return NULL;
    }
    PyObject *cell = args[0];
    if (cell != Py_None && !PyObject_TypeCheck(cell, &dft_TagCellType)) {
        PyErr_SetString(PyExc_TypeError, "cell must be a TagCell or None");
        return NULL;
    }
    if (!dft_ops_recording())
        return PyLong_FromLong(0); /* spans opened now are never recorded */
    uint64_t now = dft_now();
    uint32_t tags = cell == Py_None ? 0 : ((dft_TagCell *)cell)->id;
    uint32_t nsites = atomic_load_explicit(&dft_sites.count, memory_order_relaxed);
    for (Py_ssize_t i = 1; i < nargs; i += 2) {
        unsigned long long start = PyLong_AsUnsignedLongLong(args[i]);
        unsigned long long site = PyLong_AsUnsignedLongLong(args[i + 1]);
        if (PyErr_Occurred())
            return NULL;
        if (site == 0 || site >= nsites) {
            PyErr_Format(PyExc_ValueError, "unknown site id %llu", site);
            return NULL;
        }
        if (start) /* 0: opened while nothing was recorded */
            dft_push((uint32_t)site, start, now, dft_tls.ctx, tags, NULL);
    }
    return PyLong_FromUnsignedLongLong(now);
}
