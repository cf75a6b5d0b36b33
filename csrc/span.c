/* span(): module slices, opened and closed by calls the backend inserts into
 * each graph at the boundaries of nn.Module calls (docs/design.rst, "Module
 * spans"). One call per boundary, never per op. */
#include "core.h"

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

/* The (start_ns, site) pairs of one boundary: records the closed spans,
 * returns now. */
static PyObject *span_pairs(PyObject *cell, PyObject *const *args, Py_ssize_t n) {
    if (DFT_UNLIKELY(n & 1)) {
        PyErr_SetString(PyExc_TypeError, "span() takes a cell and (start_ns, site) pairs");
        return NULL;
    }
    if (DFT_UNLIKELY(!dft_ops_recording()))
        return PyLong_FromLong(0); /* spans opened now are never recorded */
    uint64_t now = dft_now();
    uint32_t tags = cell == Py_None ? 0 : ((dft_TagCell *)cell)->id;
    uint32_t nsites = atomic_load_explicit(&dft_sites.count, memory_order_relaxed);
    uint32_t ctx = dft_tls.ctx;
    for (Py_ssize_t i = 0; i < n; i += 2) {
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

static int check_cell(PyObject *cell) {
    if (DFT_UNLIKELY(cell != Py_None && !PyObject_TypeCheck(cell, &dft_TagCellType))) {
        PyErr_SetString(PyExc_TypeError, "cell must be a TagCell or None");
        return -1;
    }
    return 0;
}

PyObject *dft_py_span(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (DFT_UNLIKELY(nargs < 1)) {
        PyErr_SetString(PyExc_TypeError, "span() takes a cell and (start_ns, site) pairs");
        return NULL;
    }
    if (check_cell(args[0]) < 0)
        return NULL;
    return span_pairs(args[0], args + 1, nargs - 1);
}

/* ---- SpanCall: span() bound to a cell ---------------------------------------
 * What functools.partial(span, cell) does, called from the generated graph
 * code without the partial's argument copy and the builtin's call wrapper:
 * the interpreter calls its vectorcall directly. `func` is span itself, as a
 * partial's, so code that recognises boundary calls by it keeps working. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *cell; /* TagCell or None */
    PyObject *name, *qualname, *module;
} SpanCall;

static PyObject *spancall_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    if (DFT_UNLIKELY(kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "span() takes no keyword arguments");
        return NULL;
    }
    return span_pairs(((SpanCall *)self)->cell, args, PyVectorcall_NARGS(nargsf));
}

static PyObject *spancall_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"cell", "name", NULL};
    PyObject *cell = Py_None, *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OU:SpanCall", kwl, &cell, &name) || check_cell(cell) < 0)
        return NULL;
    SpanCall *self = (SpanCall *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->vectorcall = spancall_vectorcall;
    self->cell = Py_NewRef(cell);
    self->name = name ? Py_NewRef(name) : PyUnicode_FromString("dft_module_span");
    self->qualname = self->name ? Py_NewRef(self->name) : NULL;
    self->module = PyUnicode_FromString("dftrace_dynamo._core");
    if (!self->name || !self->module) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int spancall_traverse(SpanCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->cell);
    return 0;
}

static void spancall_dealloc(SpanCall *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->cell);
    Py_CLEAR(self->name);
    Py_CLEAR(self->qualname);
    Py_CLEAR(self->module);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* __name__/__qualname__/__module__: writable str attributes (FX binds the
 * call as a global of the generated code under them). */
static int set_str(PyObject **slot, PyObject *v) {
    if (!v || !PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "must be set to a str");
        return -1;
    }
    Py_SETREF(*slot, Py_NewRef(v));
    return 0;
}
static PyObject *sc_get_name(SpanCall *s, void *c) { return Py_NewRef(s->name); }
static int sc_set_name(SpanCall *s, PyObject *v, void *c) { return set_str(&s->name, v); }
static PyObject *sc_get_qualname(SpanCall *s, void *c) { return Py_NewRef(s->qualname); }
static int sc_set_qualname(SpanCall *s, PyObject *v, void *c) { return set_str(&s->qualname, v); }
static PyObject *sc_get_module(SpanCall *s, void *c) { return Py_NewRef(s->module); }
static int sc_set_module(SpanCall *s, PyObject *v, void *c) { return set_str(&s->module, v); }

static PyObject *sc_get_func(SpanCall *s, void *c) {
    PyObject *m = PyImport_ImportModule("dftrace_dynamo._core");
    if (!m)
        return NULL;
    PyObject *f = PyObject_GetAttrString(m, "span");
    Py_DECREF(m);
    return f;
}

static PyObject *sc_get_args(SpanCall *s, void *c) { return PyTuple_Pack(1, s->cell); }

static PyObject *sc_repr(SpanCall *s) { return PyUnicode_FromFormat("<SpanCall %U of %R>", s->name, s->cell); }

static PyGetSetDef spancall_getset[] = {
    {"__name__", (getter)sc_get_name, (setter)sc_set_name, NULL, NULL},
    {"__qualname__", (getter)sc_get_qualname, (setter)sc_set_qualname, NULL, NULL},
    {"__module__", (getter)sc_get_module, (setter)sc_set_module, NULL, NULL},
    {"func", (getter)sc_get_func, NULL, "span, the function this calls (as functools.partial's)", NULL},
    {"args", (getter)sc_get_args, NULL, "(cell,): the argument bound before the pairs", NULL},
    {NULL},
};

PyTypeObject dft_SpanCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace_dynamo._core.SpanCall",
    .tp_basicsize = sizeof(SpanCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "SpanCall(cell=None, name='dft_module_span'): span(cell, ...) as one callable, the "
              "boundary call of module slices: SpanCall(cell)(start_ns, site, ...) -> now.",
    .tp_new = spancall_new,
    .tp_dealloc = (destructor)spancall_dealloc,
    .tp_traverse = (traverseproc)spancall_traverse,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SpanCall, vectorcall),
    .tp_repr = (reprfunc)sc_repr,
    .tp_getset = spancall_getset,
};
