/* Flight recorder (DFTRACER_FLIGHT=N): the writer formats and compresses
 * events as usual, but keeps each member in memory instead of writing it, cut
 * so that every member holds the events of one step. The kept members are a
 * list in step order, the oldest dropped first, bounded by steps (the step in progress and the N before it) and by
 * bytes; a dump (flight_dump, served by the writer thread) writes a new file:
 * '[', the file's header and the thread names, the kept members of the asked
 * steps as they are (members are independent), the caller's records and the
 * end record. Python (dftrace_dynamo.events.flight) decides when to dump. */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

int dft_flight_on;       /* writer thread: members go to memory (set at open) */
uint32_t dft_flight_tag; /* step tag of the member being built (writer thread) */

typedef struct chunk {
    struct chunk *next;
    uint32_t tag;    /* step + 1; a member without a step counts in the last step seen */
    uint64_t events; /* X events in it */
    size_t len;
    char data[];
} chunk;

static struct {
    uint32_t steps; /* N: set by flight_set, applies from the next open */
    size_t cap;
    chunk *head, *tail; /* writer thread (and flight_stats under dft_w.mu) */
    size_t bytes, peak;
    uint32_t newest, last_tag;
    uint64_t evicted;
    dft_buf header; /* "[\n" and the file's header lines */
    /* a dump request: set by the caller under dft_w.mu, served by the writer on the flush
     * numbered req_flush or a later one */
    int pending;
    uint64_t req_flush;
    const char *path, *lines;
    size_t lines_len;
    uint32_t last; /* last step + 1 to dump (0: the newest) */
    /* its result */
    int err;
    uint64_t events, size, first, final;
} fl;

/* set with the GIL held, before open(): the writer is not running */
void dft_flight_open(const char *header, size_t len) {
    dft_flight_on = fl.steps > 0;
    dft_flight_tag = 0;
    fl.head = fl.tail = NULL; /* freed at close (a forked child leaves its parent's) */
    fl.bytes = fl.peak = 0;
    fl.newest = fl.last_tag = 0;
    fl.evicted = 0;
    fl.header.len = 0;
    if (dft_flight_on && dft_buf_reserve(&fl.header, len + 2) == 0) {
        dft_buf_put(&fl.header, "[\n", 2);
        dft_buf_put(&fl.header, header, len);
    }
}

static void drop_head(void) {
    chunk *c = fl.head;
    fl.head = c->next;
    if (!fl.head)
        fl.tail = NULL;
    fl.bytes -= c->len;
    fl.evicted += c->events;
    free(c);
}

/* Writer thread: one member of formatted lines, kept compressed (as the file would hold it). */
int dft_flight_keep(dft_sink *k, const char *p, size_t n, uint64_t events) {
    if (k->mode && dft_sink_compress(k, p, n) == 0) {
        p = k->out.p;
        n = k->out.len;
    } else if (k->mode) {
        atomic_fetch_add(&dft_w.dropped, events);
        return 0;
    }
    uint32_t tag = dft_flight_tag ? dft_flight_tag : fl.last_tag;
    if (dft_flight_tag) {
        fl.last_tag = dft_flight_tag;
        if (tag > fl.newest)
            fl.newest = tag;
    }
    chunk *c = malloc(sizeof *c + n);
    pthread_mutex_lock(&dft_w.mu);
    if (c) {
        c->next = NULL;
        c->tag = tag;
        c->events = events;
        c->len = n;
        memcpy(c->data, p, n);
        /* in step order: the rings are drained one after the other, so a ring drained first
         * (a sampler thread's) may hold a later step than the next ring's backlog */
        chunk **at = fl.tail && fl.tail->tag > tag ? &fl.head : NULL;
        while (at && *at && (*at)->tag <= tag)
            at = &(*at)->next;
        if (at) {
            c->next = *at;
            *at = c;
        } else {
            if (fl.tail)
                fl.tail->next = c;
            else
                fl.head = c;
            fl.tail = c;
        }
        fl.bytes += n;
    } else {
        fl.evicted += events;
    }
    while (fl.head && (fl.head->tag + fl.steps < fl.newest || fl.bytes > fl.cap))
        drop_head();
    if (fl.bytes > fl.peak)
        fl.peak = fl.bytes;
    pthread_mutex_unlock(&dft_w.mu);
    return 0;
}

/* Writer thread, at close: nothing kept is written to the file itself. */
void dft_flight_close(void) {
    pthread_mutex_lock(&dft_w.mu);
    while (fl.head)
        drop_head();
    pthread_mutex_unlock(&dft_w.mu);
    dft_flight_on = 0;
    dft_w.written = 0; /* the file's end record counts what it holds */
}

static int write_out(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Text as one member of the dump (compressed like the file). */
static int write_member(int fd, const char *p, size_t n) {
    dft_sink *k = &dft_w.sink;
    if (k->mode) {
        if (dft_sink_compress(k, p, n) < 0) {
            errno = ENOMEM;
            return -1;
        }
        p = k->out.p;
        n = k->out.len;
    }
    return write_out(fd, p, n);
}

/* The caller's lines ({"name":..}\n each) with ids, then the end record and ']'. */
static int tail_text(dft_buf *b, uint64_t events) {
    size_t need = fl.lines_len + 512 + dft_w.hhash_len + dft_w.pid_len; /* and the end record */
    for (size_t i = 0; i < fl.lines_len; i++)
        need += fl.lines[i] == '\n' ? 8 + DFT_FMT_MAX : 0; /* an id each */
    if (dft_buf_reserve(b, need) < 0)
        return -1;
    char num[DFT_FMT_MAX + 8];
    for (const char *q = fl.lines, *e = q + fl.lines_len; q < e;) {
        const char *nl = memchr(q, '\n', (size_t)(e - q));
        size_t len = nl ? (size_t)(nl - q) + 1 : (size_t)(e - q);
        if (len > 2 && q[0] == '{') {
            dft_buf_put(b, "{\"id\":", 6);
            dft_buf_put(b, num, (size_t)(dft_fmt_u64(num, dft_w.next_id++) - num));
            dft_buf_put(b, ",", 1);
            dft_buf_put(b, q + 1, len - 1);
            events++;
        }
        q += len;
    }
    int n = snprintf(b->p + b->len, b->cap - b->len,
                     "{\"id\":%llu,\"name\":\"end\",\"cat\":\"dftracer\",\"pid\":%.*s,\"tid\":%u,\"ts\":%llu,"
                     "\"dur\":0,\"ph\":\"X\",\"args\":{\"hhash\":%.*s,\"num_events\":%llu,\"dropped\":0}}\n]\n",
                     (unsigned long long)dft_w.next_id++, (int)dft_w.pid_len, dft_w.pid_s,
                     (unsigned)syscall(SYS_gettid), (unsigned long long)(dft_now() / 1000),
                     (int)dft_w.hhash_len, dft_w.hhash_json, (unsigned long long)events);
    if (n < 0 || (size_t)n >= b->cap - b->len)
        return -1;
    b->len += (size_t)n;
    return 0;
}

/* Writer thread, after a drain and end_member (fmt is empty): serves a dump asked for
 * before the flush numbered req. */
void dft_flight_serve(uint64_t req) {
    pthread_mutex_lock(&dft_w.mu);
    int mine = fl.pending && fl.req_flush <= req;
    pthread_mutex_unlock(&dft_w.mu);
    if (!mine)
        return;
    /* a step given: it and the N-1 before it; else all that is kept (the step in progress too) */
    uint32_t last = fl.last ? fl.last : fl.newest, keep = fl.last ? fl.steps - 1 : fl.steps;
    uint32_t first = last > keep ? last - keep : 0;
    uint64_t events = 0, size = 0, lo = UINT64_MAX, hi = 0;
    int err = 0, fd = open(fl.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    dft_buf *b = &dft_w.fmt;
    size_t at = b->len;
    if (fd < 0) {
        err = errno;
    } else if (dft_buf_reserve(b, fl.header.len) < 0) {
        err = ENOMEM;
    } else {
        dft_buf_put(b, fl.header.p, fl.header.len);
        dft_writer_names();
        if (write_member(fd, b->p + at, b->len - at) < 0)
            err = errno;
        b->len = at;
        /* the list only loses its head meanwhile (under dft_w.mu), and only on this thread */
        for (chunk *c = fl.head; c && !err; c = c->next) {
            if (c->tag < first || c->tag > last || !c->tag)
                continue;
            if (write_out(fd, c->data, c->len) < 0)
                err = errno;
            events += c->events;
            size += c->len;
            lo = c->tag - 1 < lo ? c->tag - 1 : lo;
            hi = c->tag - 1 > hi ? c->tag - 1 : hi;
        }
        if (!err && tail_text(b, events) < 0)
            err = ENOMEM;
        else if (!err && write_member(fd, b->p + at, b->len - at) < 0)
            err = errno;
        b->len = at;
    }
    if (fd >= 0 && close(fd) < 0 && !err)
        err = errno;
    if (err && fd >= 0)
        unlink(fl.path);
    pthread_mutex_lock(&dft_w.mu);
    fl.pending = 0;
    fl.err = err;
    fl.events = events;
    fl.size = size;
    fl.first = lo;
    fl.final = hi;
    pthread_mutex_unlock(&dft_w.mu);
}

/* ---- Python API ---------------------------------------------------------- */

static PyObject *py_flight_set(PyObject *m, PyObject *args) {
    unsigned int steps;
    unsigned long long cap;
    if (!PyArg_ParseTuple(args, "IK:flight_set", &steps, &cap))
        return NULL;
    if (dft_w.file_open) {
        PyErr_SetString(PyExc_RuntimeError, "flight_set() applies to the next trace file: close this one first");
        return NULL;
    }
    fl.steps = steps;
    fl.cap = (size_t)cap;
    Py_RETURN_NONE;
}

/* flight_dump(path, lines, last_step=None) */
static PyObject *py_flight_dump(PyObject *m, PyObject *args) {
    PyObject *path, *last = Py_None, *fsname = NULL;
    Py_buffer lines;
    if (!PyArg_ParseTuple(args, "Uy*|O:flight_dump", &path, &lines, &last))
        return NULL;
    PyObject *ret = NULL;
    long long step = -1;
    if (last != Py_None && (step = PyLong_AsLongLong(last)) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "last_step must be a step number or None");
        goto out;
    }
    if (!dft_w.file_open || !dft_flight_on || !dft_is_open()) {
        PyErr_SetString(PyExc_RuntimeError, "no trace file is open in flight mode");
        goto out;
    }
    if (!PyUnicode_FSConverter(path, &fsname))
        goto out;
    int busy, err;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&dft_w.mu);
    busy = fl.pending;
    if (!busy) {
        fl.pending = 1;
        fl.path = PyBytes_AS_STRING(fsname);
        fl.lines = lines.buf;
        fl.lines_len = (size_t)lines.len;
        fl.last = step < 0 ? 0 : (uint32_t)step + 1;
        fl.req_flush = dft_w.flush_req + 1;
    }
    pthread_mutex_unlock(&dft_w.mu);
    if (!busy)
        dft_writer_flush();
    pthread_mutex_lock(&dft_w.mu);
    if (fl.pending) { /* the writer stopped first */
        fl.pending = 0;
        fl.err = EIO;
    }
    err = fl.err;
    pthread_mutex_unlock(&dft_w.mu);
    Py_END_ALLOW_THREADS
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "another dump is being written");
    } else if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
    } else {
        ret = Py_BuildValue("{sKsKsNsN}", "events", (unsigned long long)fl.events, "bytes",
                            (unsigned long long)fl.size, "first_step",
                            fl.first != UINT64_MAX ? PyLong_FromUnsignedLongLong(fl.first) : Py_NewRef(Py_None),
                            "last_step",
                            fl.first != UINT64_MAX ? PyLong_FromUnsignedLongLong(fl.final) : Py_NewRef(Py_None));
    }
out:
    Py_XDECREF(fsname);
    PyBuffer_Release(&lines);
    return ret;
}

static PyObject *py_flight_stats(PyObject *m, PyObject *unused) {
    pthread_mutex_lock(&dft_w.mu);
    unsigned long long bytes = fl.bytes, peak = fl.peak, evicted = fl.evicted, n = 0;
    uint32_t lo = UINT32_MAX, hi = 0;
    for (chunk *c = fl.head; c; c = c->next, n++)
        if (c->tag) {
            lo = c->tag < lo ? c->tag : lo;
            hi = c->tag > hi ? c->tag : hi;
        }
    pthread_mutex_unlock(&dft_w.mu);
    return Py_BuildValue("{sisKsKsKsKsKsKsN}", "on", dft_w.file_open && dft_flight_on, "steps",
                         (unsigned long long)fl.steps, "cap", (unsigned long long)fl.cap, "bytes", bytes,
                         "peak_bytes", peak, "members", n, "evicted_events", evicted, "kept_steps",
                         hi ? PyLong_FromUnsignedLong(hi - lo + 1) : PyLong_FromLong(0));
}

PyMethodDef dft_flight_methods[] = {
    {"flight_set", py_flight_set, METH_VARARGS,
     "flight_set(steps, max_bytes): the next trace file keeps the last `steps` steps in memory "
     "(at most max_bytes, compressed) instead of writing them (0: off)."},
    {"flight_dump", py_flight_dump, METH_VARARGS,
     "flight_dump(path, lines, last_step=None): write the kept steps (up to last_step; None: the "
     "newest) to a new file at path, with the JSON lines `lines` (ids added) before its end record."},
    {"flight_stats", py_flight_stats, METH_NOARGS, "The flight recorder's memory: bytes kept, peak, steps."},
    {NULL, NULL, 0, NULL},
};
