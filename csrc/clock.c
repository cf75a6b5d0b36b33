/* The event clock: nanoseconds on the epoch timeline.
 *
 * Where the kernel itself trusts the TSC (clocksource "tsc": invariant and
 * synchronised across cores) events read rdtsc, about 10 ns cheaper than
 * clock_gettime per read and two reads per op. Ticks become nanoseconds on a
 * piecewise-linear model: each segment starts where the previous one ends
 * and its slope steers the model back onto CLOCK_MONOTONIC (+ the epoch
 * offset). The writer thread adds a segment on every wake;
 * open() re-anchors the model exactly. Until the first update after at least
 * MIN_BASE_NS since import (the model's rate is only as good as its
 * baseline, and nothing steers it before a trace opens) and elsewhere,
 * now_ns() uses clock_gettime: every process on a host reads the same clock.
 * Op-level events keep their raw ticks (dft_tick); the writer converts them
 * on the segment that was current at each tick (dft_clock_ns), and open()
 * waits for the first segment where there is none yet.
 *
 * The epoch offset (CLOCK_REALTIME - CLOCK_MONOTONIC) is measured at import
 * and again on every writer wake and open(): a wall clock stepped forward (NTP,
 * a VM resumed after a pause) is followed there, the model jumping with it, so
 * events stay on the wall clock other tools and ranks read. A step back is not
 * followed (time never goes back): the trace stays ahead by it.
 *
 * DFTRACER_TEST_CLOCK_SHIFT_NS (for tests only) shifts this process's clock by
 * that many ns, as a host whose clock is off would. */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t dft_epoch_off;
#if DFT_HAVE_TSC
static uint64_t base_tick, base_mono; /* long baseline for the tick rate */
static pthread_mutex_t clock_mu = PTHREAD_MUTEX_INITIALIZER;
static int tsc_trusted;
#define MIN_BASE_NS 50000000 /* 50 ms: a rate error under 1e-6 from two ~20 ns samples */
#define MAX_SLEW 5e-4 /* steering changes the rate by at most 0.05% */
#define STEER_NS 1e9  /* an offset is steered away over about a second */
/* The models published since the last exact one, each from its first tick on: the writer
 * converts an event's ticks on the model that was current when they were read. Written by
 * publish() (the writer thread, or open() before the writer starts), read by the writer. */
#define N_HIST 64 /* the writer drains every ring on each wake, after publishing at most one */
static struct {
    uint64_t tick0;
    dft_tsc_seg m;
} hist[N_HIST];
static uint64_t hist_n;
#endif

static int64_t epoch_shift; /* DFTRACER_TEST_CLOCK_SHIFT_NS */
/* The wall clock moved this far ahead of the event clock: it was stepped (NTP, a VM resumed) */
#define WALL_STEP_NS 200000

/* Epoch offset of the monotonic clock from the tightest of n brackets, INT64_MIN if none was
 * narrower than widest. */
static int64_t measure_epoch(int n, uint64_t widest) {
    uint64_t best = widest;
    int64_t off = INT64_MIN;
    for (int i = 0; i < n; i++) {
        struct timespec rt;
        uint64_t a = dft_mono();
        clock_gettime(CLOCK_REALTIME, &rt);
        uint64_t b = dft_mono();
        if (b - a < best) {
            best = b - a;
            off = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec - (int64_t)(a + (b - a) / 2) + epoch_shift;
        }
    }
    return off;
}

/* A wall clock stepped forward is followed (a step back is not: time never goes back; open()
 * and the writer may race here, so the offset only ever grows). */
void dft_clock_follow_wall(void) {
    int64_t off = measure_epoch(3, 20000); /* a wider bracket may hide a preemption, not a step */
    int64_t cur = __atomic_load_n(&dft_epoch_off, __ATOMIC_RELAXED);
    while (off != INT64_MIN && off - cur > WALL_STEP_NS &&
           !__atomic_compare_exchange_n(&dft_epoch_off, &cur, off, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

#if DFT_HAVE_TSC
static int kernel_trusts_tsc(void) {
    char buf[32] = {0};
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f)
        return 0;
    int ok = fgets(buf, sizeof buf, f) && strncmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || !buf[3]);
    fclose(f);
    return ok;
}

/* A (tick, monotonic ns) pair read as close together as we can. */
static void sample(uint64_t *tick, uint64_t *mono) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t a = __rdtsc();
        uint64_t m = dft_mono();
        uint64_t b = __rdtsc();
        if (b - a < best) {
            best = b - a;
            *tick = a + (b - a) / 2;
            *mono = m;
        }
    }
}

/* Into the segment readers are not reading (dft_hot_t), then made the current one. */
static void publish(uint64_t tick0, int64_t ns0, double ns_per_tick, int exact) {
    uint64_t seq = atomic_load_explicit(&dft_hot.seq, memory_order_relaxed) + 1;
    dft_tsc_seg *g = &dft_hot.seg[seq & 1];
    uint64_t mult = (uint64_t)(ns_per_tick * 4294967296.0);
    int64_t base = ns0 - dft_tsc_to_ns(0, mult, tick0); /* ns0 at tick0 */
    __atomic_store_n(&g->mult, mult, __ATOMIC_RELAXED);
    __atomic_store_n(&g->base, base, __ATOMIC_RELAXED);
    atomic_store_explicit(&dft_hot.seq, seq, memory_order_release);
    if (exact) /* a new file: no event of the models before is left to convert */
        hist_n = 0;
    unsigned i = hist_n++ % N_HIST;
    hist[i].tick0 = tick0;
    hist[i].m.base = base;
    hist[i].m.mult = mult;
}

static double rate_since_base(uint64_t tick, uint64_t mono) {
    return (double)(mono - base_mono) / (double)(tick - base_tick);
}
#endif

void dft_clock_init(void) {
    const char *shift = getenv("DFTRACER_TEST_CLOCK_SHIFT_NS");
    epoch_shift = shift ? strtoll(shift, NULL, 10) : 0;
    dft_epoch_off = measure_epoch(9, UINT64_MAX);
#if DFT_HAVE_TSC
    if (!kernel_trusts_tsc())
        return;
    sample(&base_tick, &base_mono);
    tsc_trusted = 1;
    dft_hot.ticks = DFT_FLAG_TICKS;
#endif
}

/* The newest model that had begun by tick, from the k-th published on (before the oldest kept:
 * the oldest); its number. */
#if DFT_HAVE_TSC
static inline uint64_t model_at(uint64_t tick, uint64_t k) {
    uint64_t oldest = hist_n > N_HIST ? hist_n - N_HIST : 0;
    while (k > oldest + 1 && tick < hist[(k - 1) % N_HIST].tick0)
        k--;
    return k;
}
#endif

void dft_clock_ns(uint64_t *start, uint64_t *end) {
#if DFT_HAVE_TSC
    /* the end's model first: a start no later than it is on that model or an earlier one. Events
     * come in nearly in order, drained a few models after they were read: the last event's model
     * is tried first (it holds the end that falls between its first tick and the next's). */
    static uint64_t last;
    uint64_t k = last;
    if (!(k && k <= hist_n && k + N_HIST > hist_n && *end >= hist[(k - 1) % N_HIST].tick0 &&
          (k == hist_n || *end < hist[k % N_HIST].tick0)))
        last = k = model_at(*end, hist_n);
    const dft_tsc_seg *m = &hist[(k - 1) % N_HIST].m;
    uint64_t e = (uint64_t)dft_tsc_to_ns(m->base, m->mult, *end);
    k = model_at(*start, *start <= *end ? k : hist_n);
    m = &hist[(k - 1) % N_HIST].m;
    *start = (uint64_t)dft_tsc_to_ns(m->base, m->mult, *start);
    *end = e;
#endif
}

uint64_t dft_clock_tick_ns(uint64_t tick) {
#if DFT_HAVE_TSC
    pthread_mutex_lock(&clock_mu);
    if (hist_n) {
        const dft_tsc_seg *m = &hist[(model_at(tick, hist_n) - 1) % N_HIST].m;
        tick = (uint64_t)dft_tsc_to_ns(m->base, m->mult, tick);
    }
    pthread_mutex_unlock(&clock_mu);
#endif
    return tick;
}

/* fork() is held off while the writer thread updates the model (ring.c's atfork handlers):
 * the child finds clock_mu free and the model whole. */
void dft_clock_fork_prepare(void) {
#if DFT_HAVE_TSC
    pthread_mutex_lock(&clock_mu);
#endif
}

void dft_clock_fork_parent(void) {
#if DFT_HAVE_TSC
    pthread_mutex_unlock(&clock_mu);
#endif
}

void dft_clock_fork_child(void) {
#if DFT_HAVE_TSC
    pthread_mutex_init(&clock_mu, NULL);
#endif
}

void dft_clock_update(int exact) {
    dft_clock_follow_wall();
#if DFT_HAVE_TSC
    if (!tsc_trusted)
        return;
    pthread_mutex_lock(&clock_mu);
    uint64_t tick, mono;
    sample(&tick, &mono);
    if (exact && !atomic_load(&dft_hot.seq) && mono - base_mono < MIN_BASE_NS) {
        /* a file opened within MIN_BASE_NS of import: the events' ticks need a model */
        uint64_t left = MIN_BASE_NS - (mono - base_mono);
        struct timespec ts = {0, (long)left};
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
        sample(&tick, &mono);
    }
    double rate = rate_since_base(tick, mono);
    int64_t truth = (int64_t)mono + __atomic_load_n(&dft_epoch_off, __ATOMIC_RELAXED);
    uint64_t seq = atomic_load(&dft_hot.seq);
    if (!seq) {
        if (mono - base_mono >= MIN_BASE_NS) /* seq 1: readers use the model from now on */
            publish(tick, truth, rate, exact);
    } else if (exact) {
        publish(tick, truth, rate, 1);
    } else {
        const dft_tsc_seg *g = &dft_hot.seg[seq & 1]; /* only this function writes it: clock_mu */
        int64_t model = dft_tsc_to_ns(g->base, g->mult, tick);
        if (truth - model > WALL_STEP_NS) { /* the wall clock stepped forward: so does the model */
            publish(tick, truth, rate, 0);
            pthread_mutex_unlock(&clock_mu);
            return;
        }
        double slew = -(double)(model - truth) / STEER_NS;
        slew = slew > MAX_SLEW ? MAX_SLEW : slew < -MAX_SLEW ? -MAX_SLEW : slew;
        publish(tick, model, rate * (1.0 + slew), 0);
    }
    pthread_mutex_unlock(&clock_mu);
#endif
}
