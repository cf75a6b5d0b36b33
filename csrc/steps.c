/* Training steps in the core: the process-global current step written into
 * every event, the step slices themselves, and the step-window switch that
 * turns op-level recording off outside the selected steps. Python's
 * dftrace_dynamo.events.steps decides when steps begin and end. */
#include "core.h"

/* Read and written with the GIL held (every push holds it). */
int dft_probe_on;

static int get_step_arg(PyObject *o, uint32_t *tag) {
    if (o == Py_None) {
        *tag = 0;
        return 0;
    }
    long long n = PyLong_AsLongLong(o);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < 0 || n >= (long long)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "step must be in 0..%u or None, not %lld", UINT32_MAX - 1, n);
        return -1;
    }
    *tag = (uint32_t)n + 1;
    return 0;
}

static PyObject *py_set_step(PyObject *m, PyObject *o) {
    uint32_t tag;
    if (get_step_arg(o, &tag) < 0)
        return NULL;
    dft_hot.step_tag = tag;
    Py_RETURN_NONE;
}

static PyObject *py_get_step(PyObject *m, PyObject *unused) {
    if (!dft_hot.step_tag)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(dft_hot.step_tag - 1);
}

static PyObject *py_set_ops_on(PyObject *m, PyObject *o) {
    int on = PyObject_IsTrue(o);
    if (on < 0)
        return NULL;
    if (on)
        atomic_fetch_and(&dft_hot.state, ~DFT_ST_OPS_OFF);
    else
        atomic_fetch_or(&dft_hot.state, DFT_ST_OPS_OFF);
    Py_RETURN_NONE;
}

static PyObject *py_set_forward_probe(PyObject *m, PyObject *o) {
    int on = PyObject_IsTrue(o);
    if (on < 0)
        return NULL;
    dft_probe_on = on;
    Py_RETURN_NONE;
}

static PyObject *py_ops_on(PyObject *m, PyObject *unused) {
    return PyBool_FromLong(!(atomic_load(&dft_hot.state) & DFT_ST_OPS_OFF));
}

/* step_slice(step, start_ns, end_ns, args=None): the slice "step N" (cat step)
 * on the calling thread, carrying its own number whatever the current step
 * is, and args (the step's peak memory). */
static PyObject *py_step_slice(PyObject *m, PyObject *args) {
    PyObject *n, *extra_args = Py_None;
    unsigned long long s, e;
    uint32_t tag;
    if (!PyArg_ParseTuple(args, "OKK|O:step_slice", &n, &s, &e, &extra_args) || get_step_arg(n, &tag) < 0)
        return NULL;
    if (!tag) {
        PyErr_SetString(PyExc_ValueError, "a step slice needs a step number");
        return NULL;
    }
    char *extra = NULL;
    if (extra_args != Py_None && !(extra = dft_extra_text(NULL, NULL, extra_args)))
        return NULL;
    uint32_t saved = dft_hot.step_tag;
    dft_hot.step_tag = tag;
    if (dft_push(0, s, e, DFT_FLAG_NOCTX | DFT_FLAG_STEP, 0, extra) < 0)
        free(extra);
    dft_hot.step_tag = saved;
    Py_RETURN_NONE;
}

/* counter(name, cat, ts_ns, values): one sample of counter tracks ("ph":"C",
 * one track per key of values), without the current step. */
static PyObject *py_counter(PyObject *m, PyObject *args) {
    PyObject *name, *cat, *values;
    unsigned long long ts;
    if (!PyArg_ParseTuple(args, "UUKO!:counter", &name, &cat, &ts, &PyDict_Type, &values))
        return NULL;
    char *extra = dft_extra_text(name, cat, values); /* dropped by dft_push when no file is open */
    if (!extra)
        return NULL;
    if (dft_push(0, ts, ts, DFT_FLAG_NOCTX | DFT_FLAG_NOSTEP | DFT_FLAG_COUNTER, 0, extra) < 0)
        free(extra);
    Py_RETURN_NONE;
}

PyMethodDef dft_step_methods[] = {
    {"set_step", py_set_step, METH_O,
     "set_step(n): events recorded from now on carry args.step = n (None: no step)."},
    {"get_step", py_get_step, METH_NOARGS, "The current step number, or None."},
    {"set_ops_on", py_set_ops_on, METH_O,
     "set_ops_on(flag): record op-level events (interceptors, graphs) or skip them."},
    {"ops_on", py_ops_on, METH_NOARGS, "Whether op-level events are recorded."},
    {"set_forward_probe", py_set_forward_probe, METH_O,
     "set_forward_probe(flag): graph calls with a probe call it (step tracking: forward work "
     "outside a training step) or not."},
    {"step_slice", py_step_slice, METH_VARARGS,
     "step_slice(n, start_ns, end_ns, args=None): record the slice 'step n' (cat step)."},
    {"counter", py_counter, METH_VARARGS,
     "counter(name, cat, ts_ns, values): one sample of counter tracks (\"ph\":\"C\")."},
    {NULL, NULL, 0, NULL},
};
