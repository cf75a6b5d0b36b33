/* Eager ops: torch's RecordFunction observers reach us through its ITT profiler
 * (ProfilerState.ITT, events/eager.py enables it per thread). torch calls the ITT
 * API through exported function pointers (__itt_*_ptr__3_0 in libtorch_cpu): we
 * point three of them at the functions below, found with dlsym at run time (the
 * extension is never linked against torch). Each aten op's begin/end reaches
 * task_begin/task_end, usually without the GIL (torch's bindings release it).
 *
 * Recorded: the outermost aten op of a thread (torch.profiler's top-level ATen
 * ops), while op-level events are recorded (a file open, inside the step
 * windows), outside compiled graphs (their ops have events of their own: a
 * GraphCall's context is on the thread) and outside compiles. Autograd's
 * engine records (scope BACKWARD_FUNCTION) are not ops: the ops they run are
 * top-level, in phase backward.
 *
 * Eager modules: global forward pre/post hooks (eager_module_enter/exit, C
 * functions, so Dynamo never makes a frame of them) keep a per-thread stack of
 * the eager module calls; an op carries the innermost one's path (its tags),
 * and each call with a site of its own is a module slice. */
#include "core.h"
#include <dlfcn.h>
#include <string.h>

/* op name -> site, built under the GIL by set_eager_sites and never changed after
 * publication (a new one replaces it; old ones are kept, a reader may hold one). */
typedef struct {
    uint32_t mask;
    const char **names;
    uint32_t *sites;
} name_table;
static name_table *_Atomic names_now;

/* per thread: a direct-mapped cache of name pointer -> site (torch's op names live
 * as long as the operator) and the nesting of records */
#define CACHE 256
typedef struct {
    const char *ptr[CACHE];
    uint32_t site[CACHE];
    const name_table *of; /* the table the cache was filled from */
} name_cache;
typedef struct {
    name_cache *cache;    /* allocated at the thread's first recorded op (static TLS is small) */
    uint32_t depth;       /* records open */
    uint32_t op_depth;    /* depth of the open top-level op (0: none) */
    uint32_t bwd_depth;   /* depth of the open autograd engine record (0: none) */
    uint32_t bwd_node;    /* its first child (the autograd node's own record) began */
    uint32_t site_now;    /* site of the open top-level op, 0: not recorded */
    uint32_t tags_now;    /* its module's tags */
    uint32_t mod_tags;    /* tags of the innermost eager module call (eager_module_enter/exit) */
    uint32_t grad;        /* the open top-level op ran with grad enabled */
    uint64_t start;
    struct held_rec *held; /* records kept back while a step's end is undecided (eager_hold) */
    uint32_t held_n, held_cap, hold;
} eager_tls_t;
static _Thread_local eager_tls_t et __attribute__((tls_model("initial-exec")));

/* Records of the thread's eager ops and module slices. While held (events.steps: a complete
 * step's end is undecided, from the first data or zero_grad slice on), they wait here, then are
 * pushed after the step's slice and the held slices, in the step decided (eager_release): the
 * writer places a thread's events in the order they end. */
struct held_rec {
    uint64_t s, e;
    uint32_t site, flags, tags;
};
#define HELD_MAX (1u << 20) /* 32 MiB; beyond: pushed at once */
static void eager_record(uint32_t site, uint64_t s, uint64_t e, uint32_t flags, uint32_t tags) {
    if (DFT_UNLIKELY(et.hold)) {
        if (et.held_n == et.held_cap && et.held_cap < HELD_MAX) {
            uint32_t cap = et.held_cap ? 2 * et.held_cap : 256;
            struct held_rec *v = realloc(et.held, cap * sizeof *v);
            if (v)
                et.held = v, et.held_cap = cap;
        }
        if (et.held_n < et.held_cap) {
            et.held[et.held_n++] = (struct held_rec){s, e, site, flags, tags};
            return;
        }
    }
    dft_push(site, s, e, flags, tags, NULL);
}

/* this thread's compiles in flight (Dynamo's start/end callbacks run on the compiling thread):
 * another thread's compile leaves this thread's ops and module calls recorded */
static _Thread_local int compiling;
static _Atomic uint64_t seen;  /* top-level ops seen (recorded or not) */
static _Atomic uint64_t missed; /* names with "::" that had no site (first sight per thread and table) */
static pthread_mutex_t miss_mu = PTHREAD_MUTEX_INITIALIZER;
#define MISS_MAX 64
static char *miss_names[MISS_MAX];
static uint32_t miss_n;
/* the phase of top-level ops outside autograd's engine, per thread (set_eager_phase: optimizer
 * inside an optimizer's step or optimizer-side slice, none after a backward, until a module is
 * called or the optimizer's work ends) */
static _Thread_local uint32_t phase_now = 1u << DFT_PHASE_SHIFT;

/* Eager module calls of this thread, innermost last (GIL held: the hooks run with it). */
typedef struct {
    PyObject *module; /* borrowed: only compared (the call holds the module) */
    uint32_t tags;    /* tags of ,"module":path of the ops inside (the outer call's if none) */
    uint32_t site;    /* its module slice's site, 0: no slice of its own */
    uint64_t start;   /* 0: opened while nothing was recorded */
    int ns;           /* start is ns (eager_open_since), not a tick: so is the end */
} mod_call;
typedef struct {
    mod_call *v;
    uint32_t n, cap;
} mod_stack_t;
static _Thread_local mod_stack_t mods;
static PyObject *mod_entries;  /* {id(module): (weakref, tags, site)} (events.eager owns it) */
static PyObject *mod_resolver; /* resolver(module, caller) -> entry or None: a module not in mod_entries */
static PyObject *grad_enabled; /* torch.is_grad_enabled */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static uint32_t table_find(const name_table *t, const char *name) {
    for (uint32_t i = (uint32_t)hash_name(name) & t->mask;; i = (i + 1) & t->mask) {
        if (!t->names[i])
            return 0;
        if (!strcmp(t->names[i], name))
            return t->sites[i];
    }
}

static void note_missed(const char *name) {
    atomic_fetch_add(&missed, 1);
    pthread_mutex_lock(&miss_mu);
    int known = 0;
    for (uint32_t i = 0; i < miss_n && !known; i++)
        known = !strcmp(miss_names[i], name);
    if (!known && miss_n < MISS_MAX)
        miss_names[miss_n++] = strdup(name);
    pthread_mutex_unlock(&miss_mu);
}

/* The site of an op name, 0 for a record that is no registered op (Dynamo's cache lookup,
 * an op registered after set_eager_sites: noted for eager_missed). */
static uint32_t site_of(const char *name) {
    const name_table *t = atomic_load_explicit(&names_now, memory_order_acquire);
    name_cache *c = et.cache;
    if (DFT_UNLIKELY(!c || c->of != t)) {
        if (!c && !(c = et.cache = malloc(sizeof *c)))
            return 0;
        memset(c, 0, sizeof *c);
        c->of = t;
    }
    uint32_t slot = (uint32_t)((uintptr_t)name >> 3) & (CACHE - 1);
    if (DFT_LIKELY(c->ptr[slot] == name))
        return c->site[slot];
    uint32_t site = t ? table_find(t, name) : 0;
    if (!site && strstr(name, "::"))
        note_missed(name);
    c->ptr[slot] = name;
    c->site[slot] = site;
    return site;
}

/* c10::GradMode::is_enabled() (found by eager_install): the thread's grad mode, no GIL needed */
static _Bool (*grad_mode)(void);

/* __itt_string_handle_create: the handle is the name itself */
static void *itt_handle(const char *name) { return (void *)name; }

typedef struct {
    unsigned long long d1, d2, d3;
} itt_id;

static void itt_begin(const void *domain, itt_id id, itt_id parent, void *handle) {
    (void)domain, (void)id, (void)parent;
    const char *name = handle;
    uint32_t d = ++et.depth;
    if (et.op_depth || !name)
        return;
    if (DFT_UNLIKELY(name[0] == 'a' && name[1] == 'u' && !strncmp(name, "autograd::engine::", 18))) {
        if (!et.bwd_depth)
            et.bwd_depth = d, et.bwd_node = 0;
        return;
    }
    if (et.bwd_depth == d - 1 && !et.bwd_node) { /* the autograd node's own record; the engine's */
        et.bwd_node = 1;                         /* ops after it (gradient sums) are ops */
        return;
    }
    uint32_t site = site_of(name);
    if (!site)
        return;
    et.op_depth = d;
    et.site_now = 0;
    atomic_fetch_add_explicit(&seen, 1, memory_order_relaxed);
    /* not in a compiled graph (a GraphCall sets a phase), no compile, a ring to push to */
    if (!dft_ops_recording() || (dft_tls.ctx & DFT_PHASE_MASK) ||
        compiling || !dft_tls.buf)
        return;
    et.site_now = site;
    et.tags_now = et.mod_tags;
    et.grad = grad_mode();
    et.start = dft_tick();
}

static void itt_end(const void *domain) {
    (void)domain;
    uint32_t d = et.depth;
    if (!d)
        return;
    et.depth = d - 1;
    if (d == et.op_depth) {
        et.op_depth = 0;
        if (et.site_now) {
            uint64_t end = dft_tick();
            uint32_t phase = et.bwd_depth ? DFT_PHASE_BACKWARD << DFT_PHASE_SHIFT : phase_now;
            if (!et.grad && phase == DFT_PHASE_FORWARD << DFT_PHASE_SHIFT) /* as a graph's ops */
                phase = DFT_PHASE_INFERENCE << DFT_PHASE_SHIFT;
            eager_record(et.site_now, et.start, end, phase | (et.grad ? DFT_FLAG_GRAD : 0) | dft_hot.ticks,
                         et.tags_now);
            et.site_now = 0;
        }
    } else if (d == et.bwd_depth) {
        et.bwd_depth = 0;
    }
}

/* ---- Python side ------------------------------------------------------------------------ */

void (*dft_rf_enable)(_Bool);

static const char *const itt_names[3] = {"__itt_string_handle_create_ptr__3_0", "__itt_task_begin_ptr__3_0",
                                         "__itt_task_end_ptr__3_0"};

/* eager_install(path): points torch's ITT function pointers in the loaded library at
 * path at ours; False when it is not loaded or lacks them. */
static PyObject *py_eager_install(PyObject *m, PyObject *arg) {
    PyObject *b;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    void *lib = dlopen(PyBytes_AS_STRING(b), RTLD_NOW | RTLD_NOLOAD);
    Py_DECREF(b);
    if (!lib)
        Py_RETURN_FALSE;
    void **ptr[3];
    for (int i = 0; i < 3; i++)
        if (!(ptr[i] = dlsym(lib, itt_names[i]))) {
            dlclose(lib);
            Py_RETURN_FALSE;
        }
    void *rf = dlsym(lib, "_ZN2at20enableRecordFunctionEb"); /* at::enableRecordFunction(bool) */
    void *gm = dlsym(lib, "_ZN3c108GradMode10is_enabledEv"); /* in libc10, a dependency */
    if (!rf || !gm) {
        dlclose(lib);
        Py_RETURN_FALSE;
    }
    *(void **)&dft_rf_enable = rf;
    *(void **)&grad_mode = gm;
    *ptr[0] = (void *)itt_handle;
    *ptr[1] = (void *)itt_begin;
    *ptr[2] = (void *)itt_end;
    dlclose(lib); /* RTLD_NOLOAD: only drops the reference this call took */
    Py_RETURN_TRUE;
}

/* set_eager_sites({name: site}): the op names' sites from now on */
static PyObject *py_set_eager_sites(PyObject *m, PyObject *d) {
    if (!PyDict_Check(d))
        return PyErr_Format(PyExc_TypeError, "set_eager_sites: a dict, not %s", Py_TYPE(d)->tp_name);
    uint32_t size = 16;
    while (size < 2 * (uint32_t)PyDict_GET_SIZE(d) + 2)
        size *= 2;
    name_table *t = calloc(1, sizeof *t);
    const char **names = t ? calloc(size, sizeof *names) : NULL;
    uint32_t *sites = names ? calloc(size, sizeof *sites) : NULL;
    if (!sites) {
        free(t), free(names);
        return PyErr_NoMemory();
    }
    t->mask = size - 1, t->names = names, t->sites = sites;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &k, &v)) {
        const char *name = PyUnicode_AsUTF8(k);
        unsigned long site = PyLong_AsUnsignedLong(v);
        if (!name || PyErr_Occurred() || !site || site >= atomic_load(&dft_sites.count)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "set_eager_sites: unknown site");
            goto fail;
        }
        uint32_t i = (uint32_t)hash_name(name) & t->mask;
        while (names[i])
            i = (i + 1) & t->mask;
        if (!(names[i] = strdup(name))) {
            PyErr_NoMemory();
            goto fail;
        }
        sites[i] = (uint32_t)site;
    }
    atomic_store_explicit(&names_now, t, memory_order_release); /* the old table stays: readers */
    Py_RETURN_NONE;
fail:
    for (uint32_t i = 0; i < size; i++)
        free((void *)names[i]);
    free(names), free(sites), free(t);
    return NULL;
}

/* eager_missed() -> [name, ...]: ops that ran without a site since the last call */
static PyObject *py_eager_missed(PyObject *m, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    pthread_mutex_lock(&miss_mu);
    for (uint32_t i = 0; i < miss_n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(miss_names[i], strlen(miss_names[i]), "replace");
        if (!s || PyList_Append(out, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(s);
    }
    if (out) {
        for (uint32_t i = 0; i < miss_n; i++)
            free(miss_names[i]);
        miss_n = 0;
    }
    pthread_mutex_unlock(&miss_mu);
    return out;
}

/* eager_compiling(delta): this thread's compiles in flight go up (1) or down (-1); 0: none
 * (torch._dynamo.reset() drops the end callbacks of compiles in flight) */
static PyObject *py_eager_compiling(PyObject *m, PyObject *o) {
    long delta = PyLong_AsLong(o);
    if (delta == -1 && PyErr_Occurred())
        return NULL;
    compiling = delta ? compiling + (int)delta : 0;
    if (compiling < 0)
        compiling = 0;
    Py_RETURN_NONE;
}

/* set_eager_phase(phase) -> the phase it replaces: this thread's phase of top-level ops outside
 * autograd's engine */
static PyObject *py_set_eager_phase(PyObject *m, PyObject *o) {
    long p = PyLong_AsLong(o);
    if (p == -1 && PyErr_Occurred())
        return NULL;
    if (p < 0 || p > DFT_PHASE_OPTIMIZER)
        return PyErr_Format(PyExc_ValueError, "set_eager_phase: a PHASE_* constant, not %ld", p);
    uint32_t was = phase_now >> DFT_PHASE_SHIFT;
    phase_now = (uint32_t)p << DFT_PHASE_SHIFT;
    return PyLong_FromUnsignedLong(was);
}

/* set_eager_observing(flag): torch's op observers are on for this thread (its GraphCalls
 * turn them off while they run) */
static PyObject *py_set_eager_observing(PyObject *m, PyObject *o) {
    int on = PyObject_IsTrue(o);
    if (on < 0)
        return NULL;
    if (on && !dft_rf_enable)
        return PyErr_Format(PyExc_RuntimeError, "set_eager_observing: eager_install first");
    /* eager ops are pushed only to a ring that exists (no allocation on the op path): the
     * thread's first ops must not wait for another event to make it */
    if (on && dft_ring_attach() < 0)
        return PyErr_NoMemory();
    dft_tls.eager = (uint32_t)on;
    Py_RETURN_NONE;
}

/* ---- eager module calls ------------------------------------------------------------------ */

/* The entry (tags, site) of module: from mod_entries while its weakref still gives this module
 * (an id is reused once a module dies), else from the resolver. 0: none found (error set or not). */
static int mod_entry(PyObject *module, PyObject *caller, uint32_t *tags, uint32_t *site, int resolve) {
    PyObject *key = PyLong_FromVoidPtr(module);
    if (!key)
        return 0;
    PyObject *e = PyDict_GetItemWithError(mod_entries, key); /* borrowed */
    Py_DECREF(key);
    if (e && !(PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 3 && PyWeakref_Check(PyTuple_GET_ITEM(e, 0)) &&
               PyWeakref_GetObject(PyTuple_GET_ITEM(e, 0)) == module))
        e = NULL;
    PyObject *owned = NULL;
    if (!e && resolve && !PyErr_Occurred()) {
        PyObject *a[2] = {module, caller};
        if (!(owned = e = PyObject_Vectorcall(mod_resolver, a, 2, NULL)))
            return 0;
        if (e == Py_None || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3)
            e = NULL;
    }
    int found = 0;
    if (e) {
        unsigned long t = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(e, 1));
        unsigned long s = PyErr_Occurred() ? 0 : PyLong_AsUnsignedLong(PyTuple_GET_ITEM(e, 2));
        if (!PyErr_Occurred() && dft_tags_usable(t) && (!s || s < atomic_load(&dft_sites.count)))
            *tags = (uint32_t)t, *site = (uint32_t)s, found = 1;
    }
    Py_XDECREF(owned);
    return found;
}

/* eager_module_enter(module, args): a global forward pre-hook. Opens an eager module call: its
 * ops carry its path, and its slice starts (on the observed thread, outside GraphCalls: a graph's
 * modules are its own). */
static PyObject *py_eager_module_enter(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || !mod_entries || !mod_resolver)
        Py_RETURN_NONE;
    /* never an error of the user's module call: a call not pushed is not closed by its exit */
    if (mods.n == mods.cap) {
        uint32_t cap = mods.cap ? 2 * mods.cap : 16;
        mod_call *v = cap <= DFT_OPEN_MAX ? realloc(mods.v, cap * sizeof *v) : NULL;
        if (!v)
            Py_RETURN_NONE;
        mods.v = v, mods.cap = cap;
    }
    PyObject *module = args[0];
    uint32_t tags = 0, site = 0;
    /* an observed thread, outside GraphCalls and compiles (AOTAutograd calls FX GraphModules);
     * no entry: the caller's path */
    if (dft_tls.eager == 1 && !compiling &&
        !mod_entry(module, mods.n ? mods.v[mods.n - 1].module : Py_None, &tags, &site, 1))
        PyErr_Clear();
    /* forward work again after a backward, or an optimizer closure's forward */
    if (phase_now == DFT_PHASE_NONE << DFT_PHASE_SHIFT || phase_now == DFT_PHASE_OPTIMIZER << DFT_PHASE_SHIFT)
        phase_now = DFT_PHASE_FORWARD << DFT_PHASE_SHIFT;
    mod_call *c = &mods.v[mods.n++];
    c->module = module;
    c->tags = tags ? tags : et.mod_tags;
    c->site = site;
    c->start = site && dft_ops_recording() ? dft_tick() : 0;
    c->ns = 0;
    et.mod_tags = c->tags;
    Py_RETURN_NONE;
}

/* eager_module_exit(module, args, output): a global forward hook (always called). Closes the
 * module's call (and calls above it a failed pre-hook left open), recording its slice with the
 * grad mode of the call, unless its slice is no longer its own (its frame got hooks meanwhile). */
static PyObject *py_eager_module_exit(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || !mods.n)
        Py_RETURN_NONE;
    PyObject *module = args[0];
    uint32_t i = mods.n;
    while (i && mods.v[i - 1].module != module)
        i--;
    if (!i)
        Py_RETURN_NONE; /* not opened here (hooks installed during its call) */
    mod_call c = mods.v[i - 1];
    mods.n = i - 1;
    et.mod_tags = mods.n ? mods.v[mods.n - 1].tags : 0;
    uint32_t tags = 0, site = 0;
    if (c.start && dft_ops_recording() && mod_entry(module, Py_None, &tags, &site, 0) && site == c.site) {
        uint64_t end = c.ns ? dft_now() : dft_tick();
        PyObject *g = grad_enabled ? PyObject_CallNoArgs(grad_enabled) : NULL;
        int grad = g ? PyObject_IsTrue(g) : 1;
        Py_XDECREF(g);
        PyErr_Clear();
        uint32_t ctx = grad ? DFT_FLAG_GRAD | DFT_PHASE_FORWARD << DFT_PHASE_SHIFT : DFT_PHASE_INFERENCE << DFT_PHASE_SHIFT;
        eager_record(c.site, c.start, end, ctx | (c.ns ? 0 : dft_hot.ticks), 0);
    }
    PyErr_Clear();
    Py_RETURN_NONE;
}

/* set_eager_modules(entries, resolver, is_grad_enabled): where eager module calls find their
 * path and slice (None: module calls are not followed) */
static PyObject *py_set_eager_modules(PyObject *m, PyObject *args) {
    PyObject *entries, *resolver, *grad;
    if (!PyArg_ParseTuple(args, "OOO:set_eager_modules", &entries, &resolver, &grad))
        return NULL;
    if (entries != Py_None && !PyDict_Check(entries))
        return PyErr_Format(PyExc_TypeError, "set_eager_modules: a dict, not %s", Py_TYPE(entries)->tp_name);
    PyObject *e = entries == Py_None ? NULL : entries, *r = resolver == Py_None ? NULL : resolver,
             *g = grad == Py_None ? NULL : grad;
    Py_XINCREF(e), Py_XINCREF(r), Py_XINCREF(g);
    Py_XSETREF(mod_entries, e);
    Py_XSETREF(mod_resolver, r);
    Py_XSETREF(grad_enabled, g);
    Py_RETURN_NONE;
}

/* eager_hold(): this thread's eager records wait for eager_release() (if it is observed) */
static PyObject *py_eager_hold(PyObject *m, PyObject *unused) {
    if (dft_tls.eager)
        et.hold = 1;
    Py_RETURN_NONE;
}

/* ns of a record's time, as the writer will convert it */
static uint64_t held_ns(uint64_t t, uint32_t flags) {
    return flags & DFT_FLAG_TICKS ? dft_clock_tick_ns(t) : t;
}

/* eager_open_since() -> ns: when the outermost eager module call of this thread that records a
 * slice began (a compiled model's call), 0 if none is open: a step ending inside it ends there.
 * The call's slice keeps that ns as its start (the writer's model for the tick may have left
 * its history by the time the slice is written: the step and the slice begin at one time). */
static PyObject *py_eager_open_since(PyObject *m, PyObject *unused) {
    for (uint32_t i = 0; i < mods.n; i++) {
        mod_call *c = &mods.v[i];
        if (c->start) {
            if (!c->ns)
                c->start = held_ns(c->start, dft_hot.ticks), c->ns = 1;
            return PyLong_FromUnsignedLongLong(c->start);
        }
    }
    return PyLong_FromLong(0);
}

/* eager_release(keep[, until]): the records held on this thread are pushed now, in the current
 * step (keep false: dropped, the step decided is outside the step windows). With until (ns),
 * only those that ended by then, and holding goes on: the writer places a thread's events in
 * the order they end, so a held slice ending at until is recorded after them. */
static PyObject *py_eager_release(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2)
        return PyErr_Format(PyExc_TypeError, "eager_release(keep[, until])");
    int keep = PyObject_IsTrue(args[0]);
    if (keep < 0)
        return NULL;
    uint64_t until = UINT64_MAX;
    if (nargs == 2) {
        until = PyLong_AsUnsignedLongLong(args[1]);
        if (until == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    } else {
        et.hold = 0;
    }
    uint32_t n = 0;
    while (n < et.held_n && (until == UINT64_MAX || held_ns(et.held[n].e, et.held[n].flags) <= until))
        n++;
    for (uint32_t i = 0; keep && i < n; i++) {
        struct held_rec *r = &et.held[i];
        dft_push(r->site, r->s, r->e, r->flags, r->tags, NULL);
    }
    if (n) {
        memmove(et.held, et.held + n, (et.held_n - n) * sizeof *et.held);
        et.held_n -= n;
    }
    if (!et.held_n && et.held_cap > 4096) { /* a long step's buffer is not kept for the rest of the run */
        free(et.held);
        et.held = NULL;
        et.held_cap = 0;
    }
    Py_RETURN_NONE;
}

/* eager_stats() -> {"seen": top-level ops seen, "missed": recorded ops without a site} */
static PyObject *py_eager_stats(PyObject *m, PyObject *unused) {
    return Py_BuildValue("{sKsK}", "seen", (unsigned long long)atomic_load(&seen), "missed",
                         (unsigned long long)atomic_load(&missed));
}

PyMethodDef dft_eager_methods[] = {
    {"eager_install", py_eager_install, METH_O, NULL},
    {"set_eager_sites", py_set_eager_sites, METH_O, NULL},
    {"eager_missed", py_eager_missed, METH_NOARGS, NULL},
    {"eager_compiling", py_eager_compiling, METH_O, NULL},
    {"set_eager_phase", py_set_eager_phase, METH_O, NULL},
    {"set_eager_observing", py_set_eager_observing, METH_O, NULL},
    {"eager_stats", py_eager_stats, METH_NOARGS, NULL},
    {"eager_open_since", py_eager_open_since, METH_NOARGS, NULL},
    {"eager_module_enter", (PyCFunction)(void (*)(void))py_eager_module_enter, METH_FASTCALL, NULL},
    {"eager_module_exit", (PyCFunction)(void (*)(void))py_eager_module_exit, METH_FASTCALL, NULL},
    {"set_eager_modules", py_set_eager_modules, METH_VARARGS, NULL},
    {"eager_hold", py_eager_hold, METH_NOARGS, NULL},
    {"eager_release", (PyCFunction)(void (*)(void))py_eager_release, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};
