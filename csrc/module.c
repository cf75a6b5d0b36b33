/* dftrace_dynamo._core: Python API, interning, file lifecycle. The contract
 * is docs/design.rst. */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

dft_table dft_sites = {.esize = sizeof(dft_site)};
dft_table dft_tags = {.esize = sizeof(dft_str)};

static PyObject *site_ids; /* formatted site bytes -> id (dedup) */
static PyObject *tag_ids;  /* formatted tags bytes -> id */
static PyObject *cur_path; /* str while a file is open */

/* Append one entry (under the GIL); returns its id or -1. */
static int64_t tab_add(dft_table *t, const void *entry) {
    uint32_t i = atomic_load_explicit(&t->count, memory_order_relaxed);
    uint32_t c = i >> DFT_TAB_BITS;
    if (c >= DFT_TAB_MAXCHUNKS) {
        PyErr_SetString(PyExc_OverflowError, "too many interned entries");
        return -1;
    }
    char *chunk = atomic_load(&t->chunks[c]);
    if (!chunk) {
        chunk = calloc(DFT_TAB_CHUNK, t->esize);
        if (!chunk) {
            PyErr_NoMemory();
            return -1;
        }
        atomic_store_explicit(&t->chunks[c], chunk, memory_order_release);
    }
    memcpy(chunk + (size_t)(i & (DFT_TAB_CHUNK - 1)) * t->esize, entry, t->esize);
    atomic_store_explicit(&t->count, i + 1, memory_order_release);
    return i;
}

/* Look the formatted text up in `ids`, else copy it into a new entry. */
static PyObject *intern_text(PyObject *ids, dft_table *t, dft_buf *b, size_t split) {
    PyObject *key = PyBytes_FromStringAndSize(b->p, (Py_ssize_t)b->len);
    if (!key)
        return NULL;
    PyObject *id = PyDict_GetItemWithError(ids, key);
    if (id || PyErr_Occurred()) {
        Py_XINCREF(id);
        Py_DECREF(key);
        return id;
    }
    char *copy = malloc(b->len + 1);
    if (!copy) {
        Py_DECREF(key);
        return PyErr_NoMemory();
    }
    memcpy(copy, b->p, b->len);
    copy[b->len] = 0;
    int64_t n;
    if (t == &dft_sites) {
        dft_site s = {{copy, (uint32_t)split}, {copy + split, (uint32_t)(b->len - split)}};
        n = tab_add(t, &s);
    } else {
        dft_str s = {copy, (uint32_t)b->len};
        n = tab_add(t, &s);
    }
    if (n < 0) {
        free(copy);
        Py_DECREF(key);
        return NULL;
    }
    id = PyLong_FromLongLong(n);
    if (id && PyDict_SetItem(ids, key, id) < 0)
        Py_CLEAR(id);
    Py_DECREF(key);
    return id;
}

static PyObject *intern_site_impl(PyObject *name, PyObject *cat, PyObject *args) {
    dft_buf b = {0};
    PyObject *r = NULL;
    if (dft_json_namecat(&b, name, cat) == 0) {
        size_t split = b.len;
        if (dft_json_fields(&b, args) == 0)
            r = intern_text(site_ids, &dft_sites, &b, split);
    }
    dft_buf_free(&b);
    return r;
}

static PyObject *py_intern_site(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"name", "cat", "args", NULL};
    PyObject *name, *cat, *a = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UU|O:intern_site", kwl, &name, &cat, &a))
        return NULL;
    return intern_site_impl(name, cat, a);
}

/* ---- tags owned by a TagCell --------------------------------------------- */
/* Interned tags (intern_tags) live for the whole process. A TagCell's own
 * tags (TagCell.set: a new step on every Dynamo.update) are freed once no
 * cell holds them and the writer has formatted every event that used them:
 * events were pushed before the release, so a drain pass that begins after
 * it (dft_pass_begun) sees them all. Freed ids are reused; entries never
 * move, so the writer still reads them without the GIL. Under the GIL. */
#define TAG_PERMANENT UINT32_MAX
static uint32_t *tag_refs; /* per id: cells holding it, TAG_PERMANENT, or 0 (free) */
static size_t tag_refs_cap;
static uint32_t *tag_free; /* ids ready for reuse */
static size_t tag_free_n, tag_free_cap;
typedef struct {
    uint32_t id;
    uint64_t pass; /* free once dft_pass_done reaches it */
} tag_retired_t;
static tag_retired_t *tag_retired; /* FIFO: passes never decrease */
static size_t tag_ret_head, tag_ret_n, tag_ret_cap;

static int grow(void **p, size_t *cap, size_t need, size_t esize) {
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * esize);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    /* new slots read as 0: a tags id whose state could not be set is never usable */
    memset((char *)q + *cap * esize, 0, (c - *cap) * esize);
    *p = q;
    *cap = c;
    return 0;
}

static int tag_state(uint32_t id, uint32_t refs) {
    if (grow((void **)&tag_refs, &tag_refs_cap, (size_t)id + 1, sizeof *tag_refs) < 0)
        return -1;
    tag_refs[id] = refs;
    return 0;
}

int dft_tags_usable(uint64_t id) {
    return id < atomic_load(&dft_tags.count) && (id == 0 || (id < tag_refs_cap && tag_refs[id]));
}

/* Frees the retired entries whose events are all written (all of them when
 * no writer runs: then no event is buffered). */
static void tags_reclaim(void) {
    int idle = !dft_w.running && !dft_w.closing;
    uint64_t done = atomic_load_explicit(&dft_pass_done, memory_order_acquire);
    while (tag_ret_head < tag_ret_n && (idle || tag_retired[tag_ret_head].pass <= done)) {
        uint32_t id = tag_retired[tag_ret_head++].id;
        if (grow((void **)&tag_free, &tag_free_cap, tag_free_n + 1, sizeof *tag_free) < 0) {
            PyErr_Clear(); /* keep the entry: it stays allocated, never reused */
            continue;
        }
        dft_str *e = dft_tab_get(&dft_tags, id);
        free((void *)e->p);
        e->p = "";
        e->len = 0;
        tag_free[tag_free_n++] = id;
    }
    if (tag_ret_head == tag_ret_n) {
        tag_ret_head = tag_ret_n = 0;
    } else if (tag_ret_head > tag_ret_cap / 2) {
        memmove(tag_retired, tag_retired + tag_ret_head, (tag_ret_n - tag_ret_head) * sizeof *tag_retired);
        tag_ret_n -= tag_ret_head;
        tag_ret_head = 0;
    }
}

void dft_tags_release(uint32_t id) {
    if (!id || tag_refs[id] == TAG_PERMANENT || --tag_refs[id])
        return;
    atomic_thread_fence(memory_order_seq_cst); /* pairs with the writer's, see drain_all */
    uint64_t pass = atomic_load(&dft_pass_begun) + 1;
    if (grow((void **)&tag_retired, &tag_ret_cap, tag_ret_n + 1, sizeof *tag_retired) < 0) {
        PyErr_Clear(); /* the entry is leaked rather than freed too early */
        return;
    }
    tag_retired[tag_ret_n++] = (tag_retired_t){id, pass};
    if (tag_ret_n - tag_ret_head > 65536 && dft_w.running)
        dft_writer_kick(); /* a pass soon rather than at the next wake */
}

void dft_tags_hold(uint32_t id) {
    if (id && tag_refs[id] != TAG_PERMANENT)
        tag_refs[id]++;
}

/* A new entry for a cell, holding the formatted args (id 0 when empty);
 * `cur` is returned again when the text is unchanged. -1: Python error. */
int64_t dft_tags_own(PyObject *args, uint32_t cur) {
    dft_buf b = {0};
    if (dft_json_fields(&b, args) < 0) {
        dft_buf_free(&b);
        return -1;
    }
    if (!b.len) {
        dft_buf_free(&b);
        return 0;
    }
    if (cur) {
        const dft_str *c = dft_tab_get(&dft_tags, cur);
        if (c->len == b.len && memcmp(c->p, b.p, b.len) == 0) {
            dft_buf_free(&b);
            return cur;
        }
    }
    tags_reclaim();
    char *copy = realloc(b.p, b.len);
    copy = copy ? copy : b.p;
    dft_str e = {copy, (uint32_t)b.len};
    int64_t id;
    if (tag_free_n) {
        id = tag_free[--tag_free_n];
        *(dft_str *)dft_tab_get(&dft_tags, (uint32_t)id) = e;
    } else {
        id = tab_add(&dft_tags, &e);
    }
    if (id < 0 || tag_state((uint32_t)id, 1) < 0) {
        free(copy);
        return -1;
    }
    return id;
}

static PyObject *py_intern_tags(PyObject *m, PyObject *a) {
    if (a == Py_None || (PyDict_Check(a) && PyDict_GET_SIZE(a) == 0))
        return PyLong_FromLong(0);
    dft_buf b = {0};
    PyObject *r = NULL;
    if (dft_json_fields(&b, a) == 0)
        r = intern_text(tag_ids, &dft_tags, &b, 0);
    dft_buf_free(&b);
    if (r && tag_state(PyLong_AsUnsignedLong(r), TAG_PERMANENT) < 0)
        Py_CLEAR(r);
    return r;
}

int dft_check_site(unsigned long long site) {
    if (site == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (site == 0 || site >= atomic_load(&dft_sites.count)) {
        PyErr_Format(PyExc_ValueError, "unknown site id %llu", site);
        return -1;
    }
    return 0;
}

static PyObject *py_now_ns(PyObject *m, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(dft_now());
}

static PyObject *py_follow_wall_clock(PyObject *m, PyObject *unused) {
    dft_clock_follow_wall();
    Py_RETURN_NONE;
}

/* Positional-or-keyword parsing for the vectorcall functions below. */
static int parse(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                 const char *const *names, int nreq, PyObject **out) {
    int n = 0;
    while (names[n])
        n++;
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments", fn, n);
        return -1;
    }
    for (int i = 0; i < n; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        for (; i < n; i++)
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0)
                break;
        if (i == n || out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated argument %R", fn,
                         key);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (int i = 0; i < nreq; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing argument '%s'", fn, names[i]);
            return -1;
        }
    return 0;
}

static int get_u64(PyObject *o, uint64_t *v) {
    unsigned long long x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *v = x;
    return 0;
}

static PyObject *py_record(PyObject *m, PyObject *const *args, size_t nargsf, PyObject *kw) {
    static const char *const names[] = {"site", "start_ns", "end_ns", "flags", "tags", NULL};
    PyObject *o[5];
    if (parse("record", args, PyVectorcall_NARGS(nargsf), kw, names, 3, o) < 0)
        return NULL;
    uint64_t site, s, e, flags = 0, tags = 0;
    if (get_u64(o[0], &site) < 0 || get_u64(o[1], &s) < 0 || get_u64(o[2], &e) < 0 ||
        (o[3] && get_u64(o[3], &flags) < 0) || (o[4] && get_u64(o[4], &tags) < 0))
        return NULL;
    if (dft_check_site(site) < 0)
        return NULL;
    if (!dft_tags_usable(tags)) {
        PyErr_Format(PyExc_ValueError, "unknown tags id %llu", (unsigned long long)tags);
        return NULL;
    }
    dft_push((uint32_t)site, s, e, (uint32_t)flags & DFT_FLAGS_PUBLIC, (uint32_t)tags, NULL);
    Py_RETURN_NONE;
}

static uint64_t arg_issue_total(void) {
    uint64_t n = 0;
    for (int i = 0; i < DFT_ARG_KINDS; i++)
        n += dft_arg_issues[i];
    return n;
}

static PyObject *py_arg_issues(PyObject *m, PyObject *unused) {
    return Py_BuildValue("{sKsKsKsK}", "deep", (unsigned long long)dft_arg_issues[DFT_ARG_DEEP],
                         "self_reference", (unsigned long long)dft_arg_issues[DFT_ARG_CYCLE],
                         "unprintable", (unsigned long long)dft_arg_issues[DFT_ARG_UNPRINTABLE],
                         "cut", (unsigned long long)dft_arg_issues[DFT_ARG_CUT]);
}

char *dft_extra_text(PyObject *name, PyObject *cat, PyObject *args) {
    dft_buf b = {0}; /* not static: formatting an arg may run Python code that logs */
    if ((name && dft_json_namecat(&b, name, cat) < 0) || dft_buf_reserve(&b, 1) < 0)
        goto fail;
    dft_buf_put(&b, "", 1);
    if (dft_json_fields(&b, args) < 0 || dft_buf_reserve(&b, 1) < 0)
        goto fail;
    dft_buf_put(&b, "", 1);
    char *text = realloc(b.p, b.len); /* buffered until written: no slack */
    return text ? text : b.p;
fail:
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    dft_buf_free(&b);
    return NULL;
}

static PyObject *py_log(PyObject *m, PyObject *const *args, size_t nargsf, PyObject *kw) {
    static const char *const names[] = {"name", "cat", "start_ns", "end_ns", "args", "timed", NULL};
    PyObject *o[6];
    if (parse("log", args, PyVectorcall_NARGS(nargsf), kw, names, 4, o) < 0)
        return NULL;
    int timed = o[5] ? PyObject_IsTrue(o[5]) : 0;
    if (timed < 0)
        return NULL;
    uint64_t s, e;
    if (get_u64(o[2], &s) < 0 || get_u64(o[3], &e) < 0)
        return NULL;
    if (!dft_is_open())
        return PyLong_FromLong(0);
    uint64_t issues = arg_issue_total();
    /* Name, category and args travel with the event (site 0): nothing is
     * kept once it is written, however many distinct names a program logs. */
    char *text = dft_extra_text(o[0], o[1], o[4]);
    if (!text)
        return NULL;
    uint32_t flags = DFT_FLAG_NOCTX | (timed ? DFT_FLAG_TIMED : 0);
    if (o[4] && PyDict_Check(o[4]) && PyDict_GetItemString(o[4], "step"))
        flags |= DFT_FLAG_NOSTEP; /* its own step arg, not the current step */
    if (dft_push(0, s, e, flags, 0, text) < 0)
        free(text);
    return PyLong_FromUnsignedLongLong(arg_issue_total() - issues);
}

/* ---- file lifecycle ------------------------------------------------------ */

static PyObject *py_open(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwl[] = {"path", "compression", "buffer_size", "header", "pid", "hhash", NULL};
    PyObject *path, *hhash;
    int comp;
    Py_ssize_t bufsize;
    Py_buffer header;
    long long pid;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Uiny*LU:open", kwl, &path, &comp, &bufsize, &header,
                                     &pid, &hhash))
        return NULL;
    PyObject *ret = NULL, *fsname = NULL;
    dft_buf hh = {0};
    if (dft_w.file_open || dft_w.closing) {
        PyErr_SetString(PyExc_RuntimeError, dft_w.closing ? "the trace file is being closed"
                                                    : "a trace file is already open");
        goto out;
    }
    if (comp < 0 || comp > 3) {
        PyErr_Format(PyExc_ValueError, "compression must be 0, 1, 2 or 3, not %d", comp);
        goto out;
    }
    if (bufsize <= 0) {
        PyErr_SetString(PyExc_ValueError, "buffer_size must be positive");
        goto out;
    }
    if (dft_json_str(&hh, hhash) < 0)
        goto out;
    /* the file system's bytes (os.fsencode): a name that is not UTF-8 still works */
    if (!PyUnicode_FSConverter(path, &fsname)) /* ValueError for an embedded null byte */
        goto out;
    const char *cpath = PyBytes_AS_STRING(fsname);
    char *path_copy = strdup(cpath);
    if (!path_copy) {
        PyErr_NoMemory();
        goto out;
    }
    free(dft_w.path);
    dft_w.path = path_copy;
    /* The writer is not running: its state is ours until it starts. The sink
     * is initialised in place (a z_stream must not be copied). */
    char err[256];
    dft_sink *sink = &dft_w.sink;
    if (dft_sink_init(sink, comp, err, sizeof err) < 0) {
        dft_sink_free(sink);
        PyErr_SetString(PyExc_RuntimeError, err);
        goto out;
    }
    int fd = open(cpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        dft_sink_free(sink);
        goto out;
    }
    sink->fd = fd;
    dft_rings_reset();
    dft_w.fmt.len = 0;
    dft_w.gen++;
    uint64_t lines = 0;
    for (Py_ssize_t i = 0; i < header.len; i++)
        lines += ((const char *)header.buf)[i] == '\n';
    dft_w.next_id = lines + 1;
    dft_w.written = dft_w.member_events = 0;
    atomic_store(&dft_w.dropped, 0);
    dft_w.failed = 0;
    dft_w.end_tid = (uint32_t)syscall(SYS_gettid);
    dft_w.end_ts = 0;
    dft_w.pid_len = (uint32_t)(dft_fmt_i64(dft_w.pid_s, pid) - dft_w.pid_s);
    free(dft_w.hhash_json);
    dft_w.hhash_json = hh.p;
    dft_w.hhash_len = (uint32_t)hh.len;
    hh.p = NULL;
    if (dft_buf_reserve(&dft_w.fmt, 2 + (size_t)header.len) < 0) {
        PyErr_NoMemory();
        goto undo;
    }
    /* '[' and the header make the first member, so the file loads from now
     * on. Perfetto needs an object within the first bytes ('[' alone is an
     * unknown format): without a header, '[' waits for the first events. */
    dft_buf_put(&dft_w.fmt, "[\n", 2);
    dft_buf_put(&dft_w.fmt, header.buf, (size_t)header.len);
    dft_agg_open(header.buf, (size_t)header.len);
    dft_flight_open(header.buf, (size_t)header.len);
    dft_w.hold = 2;
    if (header.len || dft_flight_on) { /* flight mode: the file holds no events to carry '[' */
        if (dft_sink_write(sink, dft_w.fmt.p, dft_w.fmt.len) < 0) {
            errno = sink->err;
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
            goto undo;
        }
        dft_w.fmt.len = 0;
        dft_w.hold = 0;
    }
    dft_ring_set_budget((size_t)bufsize);
    dft_clock_update(1);
    uint64_t pending;
    dft_rings_counts(&dft_w.pushed_base, &pending);
    atomic_fetch_or(&dft_hot.state, DFT_ST_OPEN); /* before the writer starts: a write error clears it */
    if (dft_writer_start() < 0) {
        atomic_fetch_and(&dft_hot.state, ~DFT_ST_OPEN);
        PyErr_SetString(PyExc_RuntimeError, "cannot start the trace writer thread");
        goto undo;
    }
    Py_INCREF(path);
    Py_XSETREF(cur_path, path);
    dft_w.file_open = 1;
    ret = Py_NewRef(Py_None);
    goto out;
undo: /* the file is ours (O_EXCL): leave nothing half-made behind */
    close(fd);
    unlink(cpath);
    dft_sink_free(sink);
    dft_w.sink.fd = -1;
out:
    Py_XDECREF(fsname);
    dft_buf_free(&hh);
    PyBuffer_Release(&header);
    return ret;
}

static PyObject *py_close(PyObject *m, PyObject *unused) {
    if (!dft_w.file_open)
        Py_RETURN_NONE;
    /* Pushes happen under the GIL, so none is in progress once this is 0. */
    atomic_fetch_and(&dft_hot.state, ~DFT_ST_OPEN);
    dft_w.file_open = 0;
    dft_w.end_tid = (uint32_t)syscall(SYS_gettid);
    dft_w.end_ts = dft_now();
    dft_w.closing = 1; /* other threads run meanwhile; open() must wait for the writer */
    Py_BEGIN_ALLOW_THREADS
    dft_writer_stop();
    Py_END_ALLOW_THREADS
    dft_w.closing = 0;
    int deleted = dft_sink_deleted(&dft_w.sink);
    close(dft_w.sink.fd);
    dft_sink_free(&dft_w.sink);
    dft_w.sink.fd = -1;
    dft_rings_reset();
    PyObject *path = cur_path;
    cur_path = NULL;
    if (deleted) /* no file to look for (its loss was reported when writing failed) */
        Py_SETREF(path, Py_NewRef(Py_None));
    unsigned long long dropped = atomic_load(&dft_w.dropped);
    /* A write error was reported when it happened; any other loss is reported
     * here, on stderr and never as a warning (which -W error would raise). */
    if (dropped && !dft_w.failed)
        dprintf(2, "dftrace_dynamo: the trace file %s misses %llu events that could not be buffered "
                   "(out of memory)\n", dft_w.path, dropped);
    return Py_BuildValue("{sKsKsN}", "num_events", (unsigned long long)dft_w.written, "dropped",
                         dropped, "path", path);
}

static PyObject *py_flush(PyObject *m, PyObject *unused) {
    if (dft_w.file_open) {
        Py_BEGIN_ALLOW_THREADS
        dft_writer_flush();
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *py_is_open(PyObject *m, PyObject *unused) {
    return PyBool_FromLong(dft_w.file_open);
}

static PyObject *py_path(PyObject *m, PyObject *unused) {
    if (!dft_w.file_open || !cur_path)
        Py_RETURN_NONE;
    return Py_NewRef(cur_path);
}

static PyObject *py_stats(PyObject *m, PyObject *unused) {
    uint64_t pushed, pending, rings = dft_rings_counts(&pushed, &pending);
    return Py_BuildValue("{sKsKsKsKsKsKsKss}", "recorded", (unsigned long long)(pushed - dft_w.pushed_base),
                         "written",
                         (unsigned long long)__atomic_load_n(&dft_w.written, __ATOMIC_RELAXED),
                         "dropped", (unsigned long long)atomic_load(&dft_w.dropped), "pending",
                         (unsigned long long)pending, "rings", (unsigned long long)rings, "ring_waits",
                         (unsigned long long)atomic_load(&dft_w.ring_waits), "ring_kicks",
                         (unsigned long long)atomic_load(&dft_w.ring_kicks), "clock",
                         atomic_load(&dft_hot.seq) ? "tsc" : "monotonic");
}

static PyMethodDef methods[] = {
    {"open", (PyCFunction)(void (*)(void))py_open, METH_VARARGS | METH_KEYWORDS,
     "open(path, compression, buffer_size, header, pid, hhash): start a trace file."},
    {"close", py_close, METH_NOARGS, "Write everything, the end event and ']'; close."},
    {"flush", py_flush, METH_NOARGS, "Write all buffered events as one member now."},
    {"is_open", py_is_open, METH_NOARGS, "Whether a trace file is open."},
    {"path", py_path, METH_NOARGS, "Path of the open trace file, or None."},
    {"intern_site", (PyCFunction)(void (*)(void))py_intern_site, METH_VARARGS | METH_KEYWORDS,
     "intern_site(name, cat, args=None) -> site id."},
    {"intern_tags", py_intern_tags, METH_O, "intern_tags(args) -> tags id (0: none)."},
    {"now_ns", py_now_ns, METH_NOARGS, "Event clock: monotonic, mapped onto the epoch."},
    {"follow_wall_clock", py_follow_wall_clock, METH_NOARGS,
     "Follow a wall clock stepped forward now, not at the writer's next wake (with no file open)."},
    {"record", (PyCFunction)(void (*)(void))py_record, METH_FASTCALL | METH_KEYWORDS,
     "record(site, start_ns, end_ns, flags=0, tags=0)"},
    {"log", (PyCFunction)(void (*)(void))py_log, METH_FASTCALL | METH_KEYWORDS,
     "log(name, cat, start_ns, end_ns, args=None, timed=False) -> n: one-off event; timed: the "
     "caller's own times, kept on the thread's \"(logged)\" track; n: arg values written in "
     "another form (see arg_issues)."},
    {"arg_issues", py_arg_issues, METH_NOARGS,
     "Counts of arg values written in another form since start: deep (nested deeper than the "
     "limit), self_reference, unprintable (str() raised)."},
    {"chain", dft_py_chain, METH_O,
     "chain(callables): interceptors (or their built-ins) in the order a graph calls them; each call "
     "prefetches the next one's memory, so a long graph's ops do not wait for it."},
    {"span", (PyCFunction)(void (*)(void))dft_py_span, METH_FASTCALL, "span(cell, grad, start_ns, site, ...) -> now: records the closed (start_ns, site) spans of a forward call with grad mode grad; 0 when nothing is recorded"},
    {"boundary", (PyCFunction)(void (*)(void))dft_py_boundary, METH_FASTCALL,
     "boundary(cell, opened, site, ...): closes this thread's innermost len(sites) open module "
     "slices (recorded as these sites, innermost first) and opens `opened` new ones"},
    {"stats", py_stats, METH_NOARGS, "Counters: recorded, written, dropped, pending events; live thread rings; ring_waits: times a thread found its ring full; ring_kicks: pushes that found their ring past half full and woke the writer."},
    {"gzip_members", dft_py_gzip_members, METH_VARARGS,
     "gzip_members(parts, hints=None) -> the gzip members of parts (bytes), encoded as the trace writer "
     "encodes the members of one file (compression 1); hints: per part, None or the writer's hints on its "
     "lines, (key, fam, at, len, f0, .., f5) each (offsets of the id, ts and dur digits in the line)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dftrace_dynamo._core",
    .m_doc = "Event recording, interceptors and the trace writer (see docs/design.rst).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    static const dft_site empty_site = {{"", 0}, {"", 0}};
    static const dft_str empty_tags = {"", 0};
    if (PyType_Ready(&dft_TagCellType) < 0 || PyType_Ready(&dft_InterceptorType) < 0 ||
        PyType_Ready(&dft_GraphCallType) < 0 || PyType_Ready(&dft_ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (!site_ids) { /* id 0 is never a valid site and means "no tags" */
        dft_clock_init();
        dft_ring_init_once();
        site_ids = PyDict_New();
        tag_ids = PyDict_New();
        if (!site_ids || !tag_ids || tab_add(&dft_sites, &empty_site) < 0 ||
            tab_add(&dft_tags, &empty_tags) < 0)
            goto fail;
    }
    struct {
        const char *name;
        long v;
    } consts[] = {
        {"FLAG_GRAD", DFT_FLAG_GRAD},
        {"FLAG_FAILED", DFT_FLAG_FAILED},
        {"PHASE_SHIFT", DFT_PHASE_SHIFT},
        {"PHASE_NONE", DFT_PHASE_NONE},
        {"PHASE_FORWARD", DFT_PHASE_FORWARD},
        {"PHASE_BACKWARD", DFT_PHASE_BACKWARD},
        {"PHASE_INFERENCE", DFT_PHASE_INFERENCE},
        {"PHASE_OPTIMIZER", DFT_PHASE_OPTIMIZER},
        {"CALL", 0},
        {"METHOD", 1},
        {"GRAD_INHERIT", 0},
        {"GRAD_ON", 1},
        {"GRAD_OFF", 2},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0)
            goto fail;
    if (PyModule_AddFunctions(m, dft_step_methods) < 0 || PyModule_AddFunctions(m, dft_flight_methods) < 0 ||
        PyModule_AddFunctions(m, dft_eager_methods) < 0)
        goto fail;
    if (PyModule_AddObjectRef(m, "TagCell", (PyObject *)&dft_TagCellType) < 0 ||
        PyModule_AddObjectRef(m, "Interceptor", (PyObject *)&dft_InterceptorType) < 0 ||
        PyModule_AddObjectRef(m, "GraphCall", (PyObject *)&dft_GraphCallType) < 0 ||
        PyModule_AddObjectRef(m, "Scanner", (PyObject *)&dft_ScannerType) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
