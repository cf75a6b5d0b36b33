/* Per-thread single-producer rings, their registry, and fork handling. */
#include "core.h"

#include <sys/syscall.h>
#include <unistd.h>

_Thread_local dft_tls_t dft_tls __attribute__((tls_model("initial-exec")));
dft_hot_t dft_hot;

pthread_mutex_t dft_list_mu = PTHREAD_MUTEX_INITIALIZER;
dft_ring *_Atomic dft_rings;

static pthread_key_t ring_key;
static size_t budget_total, budget_used; /* under dft_list_mu */
static uint64_t retired;                 /* records of freed rings, under dft_list_mu */

/* The key destructor runs when the owning thread exits: only then may the
 * writer free the ring (after draining it). */
static void ring_thread_exit(void *p) {
    dft_ring *r = p;
    atomic_store_explicit(&r->dead, 1, memory_order_release);
}

/* The calling thread's copy of what its pushes read of ring r (NULL: none). */
static void tls_bind(dft_ring *r) {
    dft_tls.ring = r;
    dft_tls.buf = r ? r->buf : NULL;
    dft_tls.head = r ? atomic_load_explicit(&r->head, memory_order_relaxed) : 0;
    dft_tls.tail_cache = r ? atomic_load_explicit(&r->tail, memory_order_acquire) : 0;
    dft_tls.mask = r ? (uint32_t)r->mask : 0;
    dft_tls.half = r ? (uint32_t)r->half : 0;
}

/* Every lock of the core, taken in one order (no thread holds clock_mu while it takes another),
 * so the child starts with each free and what it guards whole. */
static void atfork_prepare(void) {
    pthread_mutex_lock(&dft_w.mu);
    pthread_mutex_lock(&dft_list_mu);
    dft_clock_fork_prepare();
}

static void atfork_parent(void) {
    dft_clock_fork_parent();
    pthread_mutex_unlock(&dft_list_mu);
    pthread_mutex_unlock(&dft_w.mu);
}

/* The child has no writer thread and must never write the parent's file: it
 * forgets every ring (their events are the parent's to write) and the open
 * file. The memory is deliberately leaked: the writer may have been inside
 * zlib/zstd, a ring or the aggregates when fork() happened, so it cannot be
 * freed safely. */
static void atfork_child(void) {
    dft_clock_fork_child();
    dft_agg_forget();
    dft_writer_forget();
    pthread_mutex_init(&dft_list_mu, NULL);
    pthread_mutex_init(&dft_w.mu, NULL);
    pthread_cond_init(&dft_w.cv_wake, NULL);
    pthread_cond_init(&dft_w.cv_space, NULL);
    pthread_cond_init(&dft_w.cv_done, NULL);
    atomic_fetch_and(&dft_hot.state, ~DFT_ST_OPEN);
    atomic_store(&dft_rings, NULL);
    tls_bind(NULL);
    pthread_setspecific(ring_key, NULL);
    budget_used = 0;
    retired = 0;
    if (dft_w.running && dft_w.sink.fd >= 0)
        close(dft_w.sink.fd);
    memset(&dft_w.sink, 0, sizeof dft_w.sink);
    dft_w.sink.fd = -1;
    memset(&dft_w.fmt, 0, sizeof dft_w.fmt);
    dft_w.running = dft_w.closing = dft_w.file_open = 0;
    dft_w.pushed_base = 0;
    dft_w.stop = 0;
    dft_w.flush_req = dft_w.flush_done = 0;
    atomic_store(&dft_w.kick, 0);
    atomic_store(&dft_w.waiters, 0);
}

void dft_ring_init_once(void) {
    pthread_key_create(&ring_key, ring_thread_exit);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

void dft_ring_set_budget(size_t bytes) {
    pthread_mutex_lock(&dft_list_mu);
    budget_total = bytes;
    pthread_mutex_unlock(&dft_list_mu);
}

/* Ring capacity: a quarter of the remaining budget, so a few threads share
 * buffer_size; a thread beyond that still gets a small ring rather than
 * losing events. */
#define RING_MIN 256u
#define RING_MAX (1ull << 31) /* dft_tls holds the mask in 32 bits */
static uint64_t ring_cap_locked(void) {
    size_t left = budget_total > budget_used ? budget_total - budget_used : 0;
    uint64_t want = left / 4 / sizeof(dft_rec), cap = RING_MIN;
    while (cap * 2 <= want && cap < RING_MAX)
        cap *= 2;
    return cap;
}

/* threading.current_thread().name, escaped; called once per thread. */
static void ring_name(dft_ring *r) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    dft_buf b = {0};
    PyObject *th = NULL, *name = NULL, *mod = PyImport_ImportModule("threading");
    if (mod)
        th = PyObject_CallMethod(mod, "current_thread", NULL);
    if (th)
        name = PyObject_GetAttrString(th, "name");
    if (!name || !PyUnicode_Check(name) || dft_json_str(&b, name) < 0) {
        PyErr_Clear();
        b.len = 0;
        char tmp[40], *p = tmp;
        memcpy(p, "\"Thread-", 8);
        p = dft_fmt_u64(p + 8, r->tid);
        *p++ = '"';
        if (dft_buf_reserve(&b, (size_t)(p - tmp)) == 0)
            dft_buf_put(&b, tmp, (size_t)(p - tmp));
    }
    Py_XDECREF(name);
    Py_XDECREF(th);
    Py_XDECREF(mod);
    PyErr_Restore(et, ev, tb);
    r->name_json = b.p;
    r->name_len = (uint32_t)b.len;
}

/* r->bytes was taken from the budget even if buf could not be allocated. */
static void ring_free_locked(dft_ring *r) {
    budget_used -= r->bytes;
    free(r->buf);
    free(r->name_json);
    free(r->place);
    free(r->lanes);
    free(r);
}

static dft_ring *ring_new(void) {
    dft_ring *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->tid = (uint32_t)syscall(SYS_gettid);
    ring_name(r); /* may run Python code and release the GIL */
    pthread_mutex_lock(&dft_list_mu);
    uint64_t cap = ring_cap_locked();
    budget_used += cap * sizeof(dft_rec);
    pthread_mutex_unlock(&dft_list_mu);
    r->bytes = cap * sizeof(dft_rec);
    r->buf = malloc(r->bytes); /* untouched pages cost no RSS */
    if (!r->buf || !r->name_json) {
        pthread_mutex_lock(&dft_list_mu);
        ring_free_locked(r);
        pthread_mutex_unlock(&dft_list_mu);
        return NULL;
    }
    r->cap = cap;
    r->mask = cap - 1;
    r->half = cap / 2;
    pthread_setspecific(ring_key, r);
    pthread_mutex_lock(&dft_list_mu);
    atomic_store_explicit(&r->next, atomic_load(&dft_rings), memory_order_relaxed);
    atomic_store_explicit(&dft_rings, r, memory_order_release);
    pthread_mutex_unlock(&dft_list_mu);
    return r;
}

/* Counts the records of a ring unlinked from the list, then frees it. */
void dft_ring_retire(dft_ring *r) {
    retired += atomic_load(&r->head);
    ring_free_locked(r);
}

/* Drops pending records (freeing their one-off args). */
static void ring_discard(dft_ring *r) {
    uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    for (uint64_t t = atomic_load(&r->tail); t < h; t++)
        free(r->buf[t & r->mask].extra);
    atomic_store_explicit(&r->tail, h, memory_order_release);
}

int dft_ring_attach(void) {
    if (dft_tls.ring)
        return 0;
    dft_ring *r = ring_new();
    if (!r)
        return -1;
    tls_bind(r);
    return 0;
}

/* Ring missing, or past half full: refresh our view of the writer's tail,
 * wake the writer, and wait while the ring is full (never drop). */
int dft_push_slow(uint32_t site, uint64_t s, uint64_t e, uint32_t flags, uint32_t tags,
                  char *extra) {
    dft_ring *r = dft_tls.ring;
    if (!r) {
        r = ring_new();
        if (!r) {
            atomic_fetch_add(&dft_w.dropped, 1);
            return -1;
        }
        tls_bind(r);
        if (!dft_is_open()) /* closed while ring_new ran Python */
            return -1;
    }
    uint64_t h = dft_tls.head;
    dft_tls.tail_cache = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (h - dft_tls.tail_cache >= r->half) {
        atomic_fetch_add_explicit(&dft_w.ring_kicks, 1, memory_order_relaxed);
        dft_writer_kick();
        if (h - dft_tls.tail_cache >= r->cap) {
            atomic_fetch_add_explicit(&dft_w.ring_waits, 1, memory_order_relaxed);
            pthread_mutex_lock(&dft_w.mu);
            atomic_fetch_add(&dft_w.waiters, 1);
            while ((dft_tls.tail_cache = atomic_load(&r->tail), h - dft_tls.tail_cache >= r->cap) &&
                   dft_w.running)
                dft_cond_wait_ns(&dft_w.cv_space, &dft_w.mu, 50000000);
            atomic_fetch_sub(&dft_w.waiters, 1);
            pthread_mutex_unlock(&dft_w.mu);
            if (h - dft_tls.tail_cache >= r->cap) { /* writer gone */
                atomic_fetch_add(&dft_w.dropped, 1);
                return -1;
            }
        }
    }
    return dft_ring_put(site, s, e, flags, tags, extra);
}

/* Before a new file starts (writer not running): events left from a previous
 * file are dropped and rings of exited threads freed. */
void dft_rings_reset(void) {
    pthread_mutex_lock(&dft_list_mu);
    dft_ring *_Atomic *link = &dft_rings;
    dft_ring *r;
    while ((r = atomic_load(link))) {
        ring_discard(r);
        if (atomic_load(&r->dead)) {
            atomic_store(link, atomic_load(&r->next));
            dft_ring_retire(r);
        } else {
            link = &r->next;
        }
    }
    pthread_mutex_unlock(&dft_list_mu);
}

/* Records pushed so far and still unwritten, over live and freed rings;
 * returns the number of live rings. */
uint64_t dft_rings_counts(uint64_t *pushed, uint64_t *pending) {
    pthread_mutex_lock(&dft_list_mu);
    uint64_t p = retired, q = 0, n = 0;
    for (dft_ring *r = atomic_load(&dft_rings); r; r = atomic_load(&r->next)) {
        uint64_t h = atomic_load(&r->head);
        p += h;
        q += h - atomic_load(&r->tail);
        n++;
    }
    pthread_mutex_unlock(&dft_list_mu);
    *pushed = p;
    *pending = q;
    return n;
}
