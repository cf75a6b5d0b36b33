/* TagCell, Interceptor (one FX node) and GraphCall (one compiled graph). */
#include "core.h"

#include <structmember.h>

/* ---- TagCell ------------------------------------------------------------- */

static PyObject *tagcell_get_id(dft_TagCell *self, void *c) { return PyLong_FromUnsignedLong(self->id); }

static int tagcell_set_id(dft_TagCell *self, PyObject *v, void *c) {
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete id");
        return -1;
    }
    unsigned long long id = PyLong_AsUnsignedLongLong(v);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (!dft_tags_usable(id)) {
        PyErr_Format(PyExc_ValueError, "unknown tags id %llu", id);
        return -1;
    }
    dft_tags_hold((uint32_t)id);
    dft_tags_release(self->id);
    self->id = (uint32_t)id;
    return 0;
}

static PyObject *tagcell_set(dft_TagCell *self, PyObject *args) {
    int64_t id = dft_tags_own(args, self->id);
    if (id < 0)
        return NULL;
    if ((uint32_t)id != self->id) {
        dft_tags_release(self->id);
        self->id = (uint32_t)id;
    }
    Py_RETURN_NONE;
}

static void tagcell_dealloc(dft_TagCell *self) {
    dft_tags_release(self->id);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef tagcell_methods[] = {
    {"set", (PyCFunction)tagcell_set, METH_O,
     "set(args): later events carry these tags (a dict, or None for none); the previous "
     "ones are freed once written."},
    {NULL},
};

static int tagcell_init(dft_TagCell *self, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"id", NULL};
    PyObject *id = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:TagCell", kwl, &id))
        return -1;
    return id ? tagcell_set_id(self, id, NULL) : 0;
}

static PyGetSetDef tagcell_getset[] = {
    {"id", (getter)tagcell_get_id, (setter)tagcell_set_id, "interned tags id (0: none)", NULL},
    {NULL},
};

PyTypeObject dft_TagCellType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace_dynamo._core.TagCell",
    .tp_basicsize = sizeof(dft_TagCell),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Mutable holder of a tags id, read by interceptors on every event.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tagcell_init,
    .tp_dealloc = (destructor)tagcell_dealloc,
    .tp_getset = tagcell_getset,
    .tp_methods = tagcell_methods,
};

static inline uint32_t cell_id(PyObject *cell) { return cell ? ((dft_TagCell *)cell)->id : 0; }

static int get_cell(PyObject *o, PyObject **cell) {
    if (o == NULL || o == Py_None) {
        *cell = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(o, &dft_TagCellType)) {
        PyErr_SetString(PyExc_TypeError, "cell must be a TagCell or None");
        return -1;
    }
    *cell = Py_NewRef(o);
    return 0;
}

/* ---- Interceptor --------------------------------------------------------- */

/* What every call reads (with the reference count the interpreter writes) is
 * in the first 64 bytes; the rest is read on calls with a boundary (b_sites)
 * or off the hot path. With the GC header the object fills one 128-byte
 * pymalloc block, and those blocks start 48 bytes into a line (pool header),
 * so the object starts on a cache line: one line per call instead of two or
 * three, which matters where the kernels between two calls evict the cache
 * (Inductor's kernels) or the graph's ops outnumber what the caches hold.
 *
 * ahead: the next op's callable as the generated code calls it (an
 * Interceptor's built-in function) and its Interceptor (chain()): each call
 * prefetches both lines, so where a long graph's per-op objects no longer fit
 * in the caches they arrive while this op runs, not when the next one starts.
 * Only prefetched, never read: no reference is held, and a freed one costs
 * nothing (a prefetch never faults). Unchained: self. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* one of the icpt_* vectorcalls below, chosen at construction */
    PyObject *target; /* callable (CALL) or method name (METHOD) */
    const uint32_t *tags; /* the cell's id, or no_tags: read on every event */
    const void *ahead[2];
    uint32_t site;
    uint8_t ctx_keep, ctx_set; /* flags = (graph context & keep) | set: the grad override */
    uint8_t binop;             /* binops[binop - 1]: operator.add & co. called as the C function they wrap */
    /* module-slice boundary before the op (boundary=): slices opened, the number closed, then
     * the sites of those closed (innermost first; PyMem; NULL: no boundary) */
    uint32_t *b_sites;
    PyObject *cell;   /* TagCell or NULL */
    PyObject *name, *qualname, *module;
    PyObject *dict;
} Interceptor;
_Static_assert(sizeof(Interceptor) + 2 * sizeof(void *) == 128 && offsetof(Interceptor, b_sites) == 64,
               "Interceptor: one 128-byte block, the fields of every call in its first line");
_Static_assert(DFT_FLAG_GRAD <= 0xff && DFT_PHASE_MASK <= 0xff, "ctx_keep, ctx_set: one byte");

static const uint32_t no_tags = 0;

/* operator functions FX graphs call for `a + b`, `x[i]`...: calling the C
 * function behind them skips one Python-level call per op. */
static const struct {
    const char *name;
    binaryfunc fn;
} binops[] = {
    {"add", PyNumber_Add}, {"sub", PyNumber_Subtract}, {"mul", PyNumber_Multiply},
    {"truediv", PyNumber_TrueDivide}, {"floordiv", PyNumber_FloorDivide},
    {"mod", PyNumber_Remainder}, {"matmul", PyNumber_MatrixMultiply}, {"and_", PyNumber_And},
    {"or_", PyNumber_Or}, {"xor", PyNumber_Xor}, {"lshift", PyNumber_Lshift},
    {"rshift", PyNumber_Rshift}, {"iadd", PyNumber_InPlaceAdd},
    {"isub", PyNumber_InPlaceSubtract}, {"imul", PyNumber_InPlaceMultiply},
    {"itruediv", PyNumber_InPlaceTrueDivide}, {"getitem", PyObject_GetItem},
};
#define N_BINOPS (sizeof(binops) / sizeof(binops[0]))

/* 1 + the index in binops of target's C function, or 0. */
static uint8_t find_binop(PyObject *target) {
    static PyObject *funcs[N_BINOPS];
    if (!funcs[0]) {
        PyObject *operator = PyImport_ImportModule("operator");
        if (!operator) {
            PyErr_Clear();
            return 0;
        }
        for (size_t i = 0; i < N_BINOPS; i++) {
            funcs[i] = PyObject_GetAttrString(operator, binops[i].name);
            if (!funcs[i])
                PyErr_Clear();
        }
        Py_DECREF(operator);
    }
    for (size_t i = 0; i < N_BINOPS; i++)
        if (funcs[i] == target)
            return (uint8_t)(i + 1);
    return 0;
}

/* The hot path. Outside recording (no file, or outside the step windows) each
 * vectorcall below tests the state word once and calls the target; recording,
 * it reads the clock around the call and pushes one record. Each kind (call,
 * binop, method; with a boundary or not) is its own function, made from
 * icpt_run with constant kind and bound, so the recorded path carries no mode
 * tests and an interceptor without a boundary not even a branch for it. */
static inline uint32_t icpt_flags(Interceptor *self) {
    return (dft_tls.ctx & self->ctx_keep) | self->ctx_set | dft_hot.ticks;
}

/* site, flags, tags: read before the call, whose own memory traffic evicts the lines they are on */
static inline PyObject *icpt_record(uint32_t site, uint32_t flags, uint32_t tags, uint64_t t0, PyObject *r) {
    uint64_t t1 = dft_tick();
    dft_push(site, t0, t1, flags | (r ? 0 : DFT_FLAG_FAILED), tags, NULL);
    return r;
}

/* The module-slice boundary before the op, at the op's start (0: nothing is
 * recorded): what boundary() does, without a call of its own. */
static inline __attribute__((always_inline)) void icpt_boundary(Interceptor *self, uint64_t now) {
    dft_boundary(now, self->b_sites[0], self->b_sites + 2, self->b_sites[1], *self->tags);
}

enum { K_CALL, K_BINOP, K_METHOD };

static PyObject *icpt_call(PyObject *, PyObject *const *, size_t, PyObject *);
static PyObject *icpt_call_b(PyObject *, PyObject *const *, size_t, PyObject *);

__attribute__((noinline)) static PyObject *icpt_no_object(Interceptor *self, int bound) {
    PyErr_SetString(PyExc_TypeError, "method interceptor needs the object as first argument");
    uint64_t t0 = dft_ops_recording() ? dft_tick() : 0;
    if (bound)
        icpt_boundary(self, t0);
    return t0 ? icpt_record(self->site, icpt_flags(self), *self->tags, t0, NULL) : NULL;
}

static inline __attribute__((always_inline)) PyObject *
icpt_target(Interceptor *self, int kind, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return kind == K_METHOD  ? PyObject_VectorcallMethod(self->target, args, nargsf, kwnames)
           : kind == K_BINOP ? binops[self->binop - 1].fn(args[0], args[1])
                             : PyObject_Vectorcall(self->target, args, nargsf, kwnames);
}

static inline __attribute__((always_inline)) PyObject *
icpt_run(PyObject *self_, int kind, int bound, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Interceptor *self = (Interceptor *)self_;
    if (kind == K_BINOP && DFT_UNLIKELY(PyVectorcall_NARGS(nargsf) != 2 || kwnames))
        return (bound ? icpt_call_b : icpt_call)(self_, args, nargsf, kwnames);
    if (kind == K_METHOD && DFT_UNLIKELY(PyVectorcall_NARGS(nargsf) == 0))
        return icpt_no_object(self, bound);
    __builtin_prefetch(self->ahead[0]);
    __builtin_prefetch(self->ahead[1]);
    if (DFT_UNLIKELY(!dft_ops_recording())) {
        if (bound)
            icpt_boundary(self, 0);
        return icpt_target(self, kind, args, nargsf, kwnames);
    }
    uint32_t site = self->site, flags = icpt_flags(self), tags = *self->tags;
    uint64_t t0 = dft_tick();
    if (bound)
        icpt_boundary(self, t0);
    return icpt_record(site, flags, tags, t0, icpt_target(self, kind, args, nargsf, kwnames));
}

#define ICPT_VECTORCALL(fn, kind, bound)                                                        \
    static PyObject *fn(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) { \
        return icpt_run(self, kind, bound, args, nargsf, kwnames);                               \
    }
/* The same as the C function of a METH_FASTCALL | METH_KEYWORDS built-in (Interceptor.builtin). */
#define ICPT_FASTCALL(fn, kind, bound)                                                              \
    static PyObject *fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) { \
        return icpt_run(self, kind, bound, args, (size_t)nargs, kwnames);                             \
    }
#define ICPT_KIND(name, kind, bound)          \
    ICPT_VECTORCALL(icpt_##name, kind, bound) \
    ICPT_FASTCALL(icpt_##name##_fast, kind, bound)
ICPT_KIND(call, K_CALL, 0)
ICPT_KIND(binop, K_BINOP, 0)
ICPT_KIND(method, K_METHOD, 0)
ICPT_KIND(call_b, K_CALL, 1)
ICPT_KIND(binop_b, K_BINOP, 1)
ICPT_KIND(method_b, K_METHOD, 1)

/* Interceptor.builtin: the built-in function of each kind, found by the kind's vectorcall. */
#define ICPT_DEF(name) {#name, (PyCFunction)(void (*)(void))icpt_##name##_fast, METH_FASTCALL | METH_KEYWORDS, NULL}
static PyMethodDef icpt_builtins[] = {ICPT_DEF(call), ICPT_DEF(binop), ICPT_DEF(method),
                                      ICPT_DEF(call_b), ICPT_DEF(binop_b), ICPT_DEF(method_b)};
static const vectorcallfunc icpt_kinds[] = {icpt_call,   icpt_binop,   icpt_method,
                                            icpt_call_b, icpt_binop_b, icpt_method_b};

/* The Interceptor that o is, or whose built-in function o is; NULL otherwise. */
static Interceptor *icpt_of(PyObject *o) {
    if (Py_IS_TYPE(o, &dft_InterceptorType))
        return (Interceptor *)o;
    if (PyCFunction_Check(o)) {
        PyMethodDef *ml = ((PyCFunctionObject *)o)->m_ml;
        if (ml >= icpt_builtins && ml < icpt_builtins + sizeof icpt_builtins / sizeof icpt_builtins[0])
            return (Interceptor *)PyCFunction_GET_SELF(o);
    }
    return NULL;
}

/* chain(callables): each interceptor (or its built-in) prefetches the next one's lines. */
PyObject *dft_py_chain(PyObject *m, PyObject *seq) {
    PyObject *items = PySequence_Fast(seq, "chain() takes a sequence of interceptors");
    if (!items)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject *const *it = PySequence_Fast_ITEMS(items);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!icpt_of(it[i])) {
            PyErr_Format(PyExc_TypeError, "chain() takes interceptors and their built-ins, not %.100s",
                         Py_TYPE(it[i])->tp_name);
            Py_DECREF(items);
            return NULL;
        }
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        Interceptor *self = icpt_of(it[i]);
        self->ahead[0] = it[i + 1];
        self->ahead[1] = icpt_of(it[i + 1]);
    }
    Py_DECREF(items);
    Py_RETURN_NONE;
}

/* boundary=(opened, (site, ...)) into self; -1 with TypeError/ValueError. */
static int icpt_set_boundary(Interceptor *self, PyObject *b) {
    if (!PyTuple_Check(b) || PyTuple_GET_SIZE(b) != 2 || !PyLong_Check(PyTuple_GET_ITEM(b, 0))) {
        PyErr_SetString(PyExc_TypeError, "boundary must be (opened, (site, ...)): the number of module "
                                         "slices opened and the sites of those closed, innermost first");
        return -1;
    }
    int overflow;
    long long opened = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(b, 0), &overflow);
    if (overflow || opened < 0 || opened > DFT_OPEN_MAX) {
        PyErr_Format(PyExc_ValueError, "boundary opens %R slices: must be 0 to %u", PyTuple_GET_ITEM(b, 0),
                     DFT_OPEN_MAX);
        return -1;
    }
    PyObject *seq = PySequence_Fast(PyTuple_GET_ITEM(b, 1), "boundary's closed sites must be a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int rc = -1;
    if (n > DFT_OPEN_MAX) {
        PyErr_Format(PyExc_ValueError, "boundary closes %zd slices: at most %u", n, DFT_OPEN_MAX);
    } else if (n == 0 && opened == 0) {
        PyErr_SetString(PyExc_ValueError, "boundary opens and closes no slice");
    } else if (!(self->b_sites = PyMem_Malloc((2 + n) * sizeof *self->b_sites))) {
        PyErr_NoMemory();
    } else if (dft_parse_sites(PySequence_Fast_ITEMS(seq), (uint32_t)n, self->b_sites + 2) == 0) {
        self->b_sites[0] = (uint32_t)opened;
        self->b_sites[1] = (uint32_t)n;
        rc = 0;
    }
    Py_DECREF(seq);
    return rc;
}

static PyObject *icpt_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"target", "site", "cell", "mode", "grad", "name", "boundary", NULL};
    PyObject *target, *cell, *name = NULL, *boundary = Py_None;
    unsigned long long site;
    int mode = 0, grad = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OKO|iiU$O:Interceptor", kwl, &target, &site, &cell,
                                     &mode, &grad, &name, &boundary))
        return NULL;
    if (dft_check_site(site) < 0)
        return NULL;
    if (mode != 0 && mode != 1) {
        PyErr_Format(PyExc_ValueError, "mode must be CALL (0) or METHOD (1), not %d", mode);
        return NULL;
    }
    if (grad < 0 || grad > 2) {
        PyErr_Format(PyExc_ValueError, "grad must be GRAD_INHERIT, GRAD_ON or GRAD_OFF, not %d", grad);
        return NULL;
    }
    if (mode == 1 && !PyUnicode_Check(target)) {
        PyErr_SetString(PyExc_TypeError, "METHOD mode needs the method name (str) as target");
        return NULL;
    }
    if (mode == 0 && !PyCallable_Check(target)) {
        PyErr_SetString(PyExc_TypeError, "target must be callable");
        return NULL;
    }
    Interceptor *self = (Interceptor *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->target = Py_NewRef(target);
    self->site = (uint32_t)site;
    self->ahead[0] = self->ahead[1] = self;
    self->ctx_keep = grad == 0 ? 0xff : DFT_PHASE_MASK;
    self->ctx_set = grad == 1 ? DFT_FLAG_GRAD : 0;
    self->binop = mode == 0 ? find_binop(target) : 0;
    self->vectorcall = mode == 1 ? icpt_method : self->binop ? icpt_binop : icpt_call;
    self->tags = &no_tags;
    if (boundary != Py_None) {
        if (icpt_set_boundary(self, boundary) < 0)
            goto fail;
        self->vectorcall = mode == 1 ? icpt_method_b : self->binop ? icpt_binop_b : icpt_call_b;
    }
    if (get_cell(cell, &self->cell) < 0)
        goto fail;
    if (self->cell)
        self->tags = &((dft_TagCell *)self->cell)->id;
    if (name) {
        self->name = Py_NewRef(name);
    } else if (mode == 1) {
        self->name = Py_NewRef(target);
    } else {
        self->name = PyObject_GetAttrString(target, "__name__");
        if (!self->name || !PyUnicode_Check(self->name)) {
            PyErr_Clear();
            Py_XSETREF(self->name, PyUnicode_FromString("interceptor"));
            if (!self->name)
                goto fail;
        }
    }
    self->qualname = Py_NewRef(self->name);
    self->module = PyUnicode_FromString("dftrace_dynamo._core");
    if (!self->module)
        goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int icpt_traverse(Interceptor *self, visitproc visit, void *arg) {
    Py_VISIT(self->target);
    Py_VISIT(self->cell);
    Py_VISIT(self->dict);
    return 0;
}

static int icpt_clear(Interceptor *self) {
    Py_CLEAR(self->target);
    self->tags = &no_tags;
    Py_CLEAR(self->cell);
    Py_CLEAR(self->dict);
    return 0;
}

static void icpt_dealloc(Interceptor *self) {
    PyObject_GC_UnTrack(self);
    icpt_clear(self);
    Py_CLEAR(self->name);
    Py_CLEAR(self->qualname);
    Py_CLEAR(self->module);
    PyMem_Free(self->b_sites);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *icpt_repr(Interceptor *self) {
    return PyUnicode_FromFormat("<Interceptor %U site=%u of %R>", self->name, self->site,
                                self->target ? self->target : Py_None);
}

/* __name__/__qualname__/__module__ are writable str attributes. */
static PyObject *get_str(PyObject **slot) { return Py_NewRef(*slot); }
static int set_str(PyObject **slot, PyObject *v) {
    if (!v || !PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "must be set to a str");
        return -1;
    }
    Py_SETREF(*slot, Py_NewRef(v));
    return 0;
}
static PyObject *icpt_get_name(Interceptor *s, void *c) { return get_str(&s->name); }
static int icpt_set_name(Interceptor *s, PyObject *v, void *c) { return set_str(&s->name, v); }
static PyObject *icpt_get_qualname(Interceptor *s, void *c) { return get_str(&s->qualname); }
static int icpt_set_qualname(Interceptor *s, PyObject *v, void *c) { return set_str(&s->qualname, v); }
static PyObject *icpt_get_module(Interceptor *s, void *c) { return get_str(&s->module); }
static int icpt_set_module(Interceptor *s, PyObject *v, void *c) { return set_str(&s->module, v); }
static PyObject *icpt_get_site(Interceptor *s, void *c) { return PyLong_FromUnsignedLong(s->site); }
static PyObject *icpt_get_ahead(Interceptor *s, void *c) {
    if (s->ahead[0] == s)
        Py_RETURN_NONE;
    return PyLong_FromVoidPtr((void *)s->ahead[0]);
}
static PyObject *icpt_get_mode(Interceptor *s, void *c) {
    return PyLong_FromLong(s->vectorcall == icpt_method || s->vectorcall == icpt_method_b);
}
static PyObject *icpt_get_grad(Interceptor *s, void *c) {
    return PyLong_FromLong(s->ctx_keep == 0xff ? 0 : s->ctx_set ? 1 : 2);
}
static PyObject *icpt_get_boundary(Interceptor *s, void *c) {
    if (!s->b_sites)
        Py_RETURN_NONE;
    PyObject *sites = PyTuple_New(s->b_sites[1]);
    for (uint32_t j = 0; sites && j < s->b_sites[1]; j++) {
        PyObject *site = PyLong_FromUnsignedLong(s->b_sites[2 + j]);
        if (!site)
            Py_CLEAR(sites);
        else
            PyTuple_SET_ITEM(sites, j, site);
    }
    return sites ? Py_BuildValue("(IN)", s->b_sites[0], sites) : NULL;
}

/* CPython 3.11+ specialises a call of a METH_FASTCALL | METH_KEYWORDS built-in into a direct call
 * of its C function; an object with tp_vectorcall takes the interpreter's generic call path. */
static PyObject *icpt_get_builtin(Interceptor *s, void *c) {
    for (size_t i = 0; i < sizeof icpt_kinds / sizeof icpt_kinds[0]; i++)
        if (s->vectorcall == icpt_kinds[i])
            return PyCFunction_NewEx(&icpt_builtins[i], (PyObject *)s, s->module);
    PyErr_SetString(PyExc_SystemError, "Interceptor of no known kind");
    return NULL;
}

static PyGetSetDef icpt_getset[] = {
    {"builtin", (getter)icpt_get_builtin, NULL,
     "a new built-in function that calls this interceptor (its __self__): what generated code "
     "calls, as CPython calls a built-in's C function directly (cheaper than calling the object)",
     NULL},
    {"__name__", (getter)icpt_get_name, (setter)icpt_set_name, NULL, NULL},
    {"__qualname__", (getter)icpt_get_qualname, (setter)icpt_set_qualname, NULL, NULL},
    {"__module__", (getter)icpt_get_module, (setter)icpt_set_module, NULL, NULL},
    {"site", (getter)icpt_get_site, NULL, "interned site id", NULL},
    {"mode", (getter)icpt_get_mode, NULL, "CALL or METHOD", NULL},
    {"ahead", (getter)icpt_get_ahead, NULL,
     "id() of the callable chain() put after this one (prefetched by each call), or None", NULL},
    {"grad", (getter)icpt_get_grad, NULL, "GRAD_INHERIT, GRAD_ON or GRAD_OFF", NULL},
    {"boundary", (getter)icpt_get_boundary, NULL,
     "(opened, (site, ...)): the module-slice boundary before the op, or None", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyMemberDef icpt_members[] = {
    {"target", T_OBJECT, offsetof(Interceptor, target), READONLY, "wrapped callable or method name"},
    {"cell", T_OBJECT, offsetof(Interceptor, cell), READONLY, "TagCell or None"},
    {NULL},
};

PyTypeObject dft_InterceptorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace_dynamo._core.Interceptor",
    .tp_basicsize = sizeof(Interceptor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Interceptor(target, site, cell, mode=CALL, grad=GRAD_INHERIT, name=None, *, "
              "boundary=None): calls target and records one event per call. boundary=(opened, "
              "(site, ...)): first does what boundary(cell, opened, site, ...) does, at the op's "
              "start (one clock read for both).",
    .tp_new = icpt_new,
    .tp_dealloc = (destructor)icpt_dealloc,
    .tp_traverse = (traverseproc)icpt_traverse,
    .tp_clear = (inquiry)icpt_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Interceptor, vectorcall),
    .tp_dictoffset = offsetof(Interceptor, dict),
    .tp_repr = (reprfunc)icpt_repr,
    .tp_getset = icpt_getset,
    .tp_members = icpt_members,
};

/* ---- GraphCall ----------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn, *grad_fn, *cell;
    PyObject *dict; /* AOTAutograd marks boxed graphs with a _boxed_call attribute */
    PyObject *plain; /* the graph without interceptors, run when no op is recorded (or NULL) */
    PyObject *probe; /* probe(grad) while dft_probe_on (step tracking's forward probe), or NULL */
    uint32_t site, phase;
    int grad; /* grad_fn given as a bool: its value, no call per graph call; -1: call grad_fn */
} GraphCall;

/* The graph's module slices (span.c) open and close within the call: the
 * depth of the thread's stack of open slices is put back at the end, so the
 * slices a raising graph left open are dropped, never recorded. */
static PyObject *gc_untraced(GraphCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (self->plain)
        return PyObject_Vectorcall(self->plain, args, nargsf, kwnames);
    uint32_t open_n = dft_tls.open_n;
    PyObject *r = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    dft_tls.open_n = open_n;
    return r;
}

static PyObject *gc_run(GraphCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (!dft_ops_recording())
        return gc_untraced(self, args, nargsf, kwnames);
    int grad = self->grad;
    if (grad < 0) {
        PyObject *g = PyObject_CallNoArgs(self->grad_fn);
        if (!g)
            return NULL;
        grad = PyObject_IsTrue(g);
        Py_DECREF(g);
        if (grad < 0)
            return NULL;
    }
    if (self->probe && dft_probe_on) {
        PyObject *p = PyObject_CallOneArg(self->probe, grad ? Py_True : Py_False);
        if (!p)
            return NULL;
        Py_DECREF(p);
    }
    if (!dft_ops_recording()) /* grad_fn or probe ended a step into one outside the step windows */
        return gc_untraced(self, args, nargsf, kwnames);
    uint32_t phase = self->phase;
    if (phase == DFT_PHASE_FORWARD && !grad)
        phase = DFT_PHASE_INFERENCE;
    uint32_t ctx = (grad ? DFT_FLAG_GRAD : 0) | (phase << DFT_PHASE_SHIFT);
    uint32_t saved = dft_tls.ctx, open_n = dft_tls.open_n;
    dft_tls.ctx = ctx;
    uint64_t t0 = dft_tick();
    PyObject *r = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    uint64_t t1 = dft_tick();
    dft_tls.ctx = saved;
    dft_tls.open_n = open_n;
    dft_push(self->site, t0, t1, ctx | dft_hot.ticks | (r ? 0 : DFT_FLAG_FAILED), cell_id(self->cell), NULL);
    return r;
}

static PyObject *gc_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    if (DFT_LIKELY(!dft_tls.eager))
        return gc_run((GraphCall *)self_, args, nargsf, kwnames);
    dft_eager_pause();
    PyObject *r = gc_run((GraphCall *)self_, args, nargsf, kwnames);
    dft_eager_resume();
    return r;
}

static PyObject *gc_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"fn", "site", "cell", "phase", "grad_fn", "plain", "probe", NULL};
    PyObject *fn, *cell, *grad_fn, *plain = Py_None, *probe = Py_None;
    unsigned long long site;
    unsigned int phase;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OKOIO|O$O:GraphCall", kwl, &fn, &site, &cell, &phase,
                                     &grad_fn, &plain, &probe))
        return NULL;
    if (plain != Py_None && !PyCallable_Check(plain)) {
        PyErr_SetString(PyExc_TypeError, "plain must be callable or None");
        return NULL;
    }
    if (probe != Py_None && !PyCallable_Check(probe)) {
        PyErr_SetString(PyExc_TypeError, "probe must be callable or None");
        return NULL;
    }
    if (dft_check_site(site) < 0)
        return NULL;
    if (phase > DFT_PHASE_INFERENCE) {
        PyErr_Format(PyExc_ValueError, "phase must be one of PHASE_*, not %u", phase);
        return NULL;
    }
    if (!PyCallable_Check(fn) || !(PyBool_Check(grad_fn) || PyCallable_Check(grad_fn))) {
        PyErr_SetString(PyExc_TypeError, "fn must be callable, grad_fn callable or a bool");
        return NULL;
    }
    GraphCall *self = (GraphCall *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->vectorcall = gc_vectorcall;
    self->fn = Py_NewRef(fn);
    self->grad_fn = Py_NewRef(grad_fn);
    self->plain = plain == Py_None ? NULL : Py_NewRef(plain);
    self->probe = probe == Py_None ? NULL : Py_NewRef(probe);
    self->grad = PyBool_Check(grad_fn) ? grad_fn == Py_True : -1;
    self->site = (uint32_t)site;
    self->phase = phase;
    if (get_cell(cell, &self->cell) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int gc_traverse(GraphCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn);
    Py_VISIT(self->grad_fn);
    Py_VISIT(self->cell);
    Py_VISIT(self->dict);
    Py_VISIT(self->plain);
    Py_VISIT(self->probe);
    return 0;
}

static int gc_clear(GraphCall *self) {
    Py_CLEAR(self->fn);
    Py_CLEAR(self->grad_fn);
    Py_CLEAR(self->cell);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->plain);
    Py_CLEAR(self->probe);
    return 0;
}

static void gc_dealloc(GraphCall *self) {
    PyObject_GC_UnTrack(self);
    gc_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef gc_members[] = {
    {"fn", T_OBJECT, offsetof(GraphCall, fn), READONLY, "wrapped compiled graph"},
    {"plain", T_OBJECT, offsetof(GraphCall, plain), READONLY, "the graph run when no op is recorded, or None"},
    {NULL},
};

static PyGetSetDef gc_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

PyTypeObject dft_GraphCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dftrace_dynamo._core.GraphCall",
    .tp_basicsize = sizeof(GraphCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "GraphCall(fn, site, cell, phase, grad_fn, plain=None, *, probe=None): calls a compiled "
              "graph under a (grad, phase) context and records the enclosing graph event; plain runs "
              "instead when no op event is recorded. grad_fn: the grad mode's function, or the mode "
              "itself (a bool: no call per graph call). probe(grad) is called first while "
              "set_forward_probe(True) is in effect.",
    .tp_new = gc_new,
    .tp_dealloc = (destructor)gc_dealloc,
    .tp_traverse = (traverseproc)gc_traverse,
    .tp_clear = (inquiry)gc_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(GraphCall, vectorcall),
    .tp_dictoffset = offsetof(GraphCall, dict),
    .tp_members = gc_members,
    .tp_getset = gc_getset,
};
