/* The event clock: nanoseconds on the epoch timeline.
 *
 * Where the kernel itself trusts the TSC (clocksource "tsc": invariant and
 * synchronised across cores) events read rdtsc, about 10 ns cheaper than
 * clock_gettime per read and two reads per op. Ticks become nanoseconds on a
 * piecewise-linear model: each segment starts where the previous one ends
 * (time never jumps) and its slope steers the model back onto CLOCK_MONOTONIC
 * (+ the epoch offset). The writer thread adds a segment on every wake;
 * open() re-anchors the model exactly. Until the first update after at least
 * MIN_BASE_NS since import (the model's rate is only as good as its
 * baseline, and nothing steers it before a trace opens) and elsewhere, events
 * use clock_gettime: every process on a host reads the same clock.
 *
 * DFTRACER_TEST_CLOCK_SHIFT_NS (for tests only) shifts this process's clock by
 * that many ns, as a host whose clock is off would. */
#include "core.h"

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
#endif

/* Epoch offset of the monotonic clock, from the tightest of a few brackets. */
static void calibrate_epoch(void) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 9; i++) {
        struct timespec rt;
        uint64_t a = dft_mono();
        clock_gettime(CLOCK_REALTIME, &rt);
        uint64_t b = dft_mono();
        if (b - a < best) {
            best = b - a;
            int64_t real = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
            dft_epoch_off = real - (int64_t)(a + (b - a) / 2);
        }
    }
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
static void publish(uint64_t tick0, int64_t ns0, double ns_per_tick) {
    uint64_t seq = atomic_load_explicit(&dft_hot.seq, memory_order_relaxed) + 1;
    dft_tsc_seg *g = &dft_hot.seg[seq & 1];
    uint64_t mult = (uint64_t)(ns_per_tick * 4294967296.0);
    __atomic_store_n(&g->mult, mult, __ATOMIC_RELAXED);
    __atomic_store_n(&g->base, ns0 - dft_tsc_to_ns(0, mult, tick0), __ATOMIC_RELAXED); /* ns0 at tick0 */
    atomic_store_explicit(&dft_hot.seq, seq, memory_order_release);
}

static double rate_since_base(uint64_t tick, uint64_t mono) {
    return (double)(mono - base_mono) / (double)(tick - base_tick);
}
#endif

void dft_clock_init(void) {
    calibrate_epoch();
    const char *shift = getenv("DFTRACER_TEST_CLOCK_SHIFT_NS");
    if (shift)
        dft_epoch_off += strtoll(shift, NULL, 10);
#if DFT_HAVE_TSC
    if (!kernel_trusts_tsc())
        return;
    sample(&base_tick, &base_mono);
    tsc_trusted = 1;
#endif
}

void dft_clock_update(int exact) {
#if DFT_HAVE_TSC
    if (!tsc_trusted)
        return;
    pthread_mutex_lock(&clock_mu);
    uint64_t tick, mono;
    sample(&tick, &mono);
    double rate = rate_since_base(tick, mono);
    int64_t truth = (int64_t)mono + dft_epoch_off;
    uint64_t seq = atomic_load(&dft_hot.seq);
    if (!seq) {
        if (mono - base_mono >= MIN_BASE_NS) /* seq 1: readers use the model from now on */
            publish(tick, truth, rate);
    } else if (exact) {
        publish(tick, truth, rate);
    } else {
        const dft_tsc_seg *g = &dft_hot.seg[seq & 1]; /* only this function writes it: clock_mu */
        int64_t model = dft_tsc_to_ns(g->base, g->mult, tick);
        double slew = -(double)(model - truth) / STEER_NS;
        slew = slew > MAX_SLEW ? MAX_SLEW : slew < -MAX_SLEW ? -MAX_SLEW : slew;
        publish(tick, model, rate * (1.0 + slew));
    }
    pthread_mutex_unlock(&clock_mu);
#endif
}
