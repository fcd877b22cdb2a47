/* The other ceiling for a 2-rank allreduce on one host: moving data between two cores. Every
 * byte a rank of a 2-rank allreduce of N bytes ends with came from the other core once (half is
 * the peer's input to this rank's half, half the peer's reduced half), and the rank wrote as many
 * bytes into the rings its peer reads; both ranks at once. In cache, memcpy (memcpy_bw.c) runs
 * within a core's own L1/L2 and says nothing about this: here the lines move between cores.
 *
 * Two processes, pinned to two CPUs where the affinity mask allows, exchange at doubling sizes:
 * each writes B bytes into its half of a shared mapping (lines the peer read last round, so the
 * writes must take them back from the peer's cache, as a rank writing into a ring its peer reads
 * must), publishes a sequence number, waits for the peer's, and reads (sums) the peer's B bytes.
 * Prints per size "bytes read_us read_GBs exchange_us exchange_GBs": the read alone, and the
 * whole exchange (write, hand-off, read), each the slower process's. The exchange is the cross-
 * core work of a 2-rank allreduce of B bytes (each rank writes B into rings and reads B out of
 * the peer's); an allreduce through shared memory does it and more (the reduction, its own
 * copies), so its busbw stays near or below B / the exchange's time (near: its passes overlap
 * in a pipeline, these do not).
 * Build: cc -O2 -mavx2 -pthread -o xcore_bw xcore_bw.c
 * Run:   ./xcore_bw [min_bytes max_bytes] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 64

typedef struct {
    _Alignas(128) atomic_ulong seq[2];
    _Alignas(128) double secs[MAX_SIZES][2];
    _Alignas(128) double xsecs[MAX_SIZES][2];
    _Alignas(128) float sink[2];
} shared;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float read_all(const float *p, size_t n) {
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a = _mm256_add_ps(a, _mm256_load_ps(p + i));
        b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(a, b));
    return t[0] + t[7];
}

static void wait_for(atomic_ulong *w, unsigned long v) {
    while (atomic_load_explicit(w, memory_order_acquire) < v) _mm_pause();
}

static void exchanger(shared *sh, float *area, int id, size_t minb, size_t maxb) {
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) >= 2) {
        int seen = 0;
        for (int c = 0; c < CPU_SETSIZE; c++) /* the id-th CPU of the mask */
            if (CPU_ISSET(c, &mask) && seen++ == id) {
                CPU_ZERO(&mask);
                CPU_SET(c, &mask);
                sched_setaffinity(0, sizeof mask, &mask);
                break;
            }
    }
    float *mine = area + (size_t)id * (maxb / sizeof(float));
    const float *theirs = area + (size_t)(1 - id) * (maxb / sizeof(float));
    float *src = aligned_alloc(64, maxb); /* this process's own data, as a rank's buffer */
    if (!src) _exit(1);
    for (size_t i = 0; i < maxb / sizeof(float); i++) src[i] = (float)(i % 1000);
    unsigned long round = 0;
    float sink = 0;
    int k = 0;
    for (size_t b = minb; b <= maxb && k < MAX_SIZES; b *= 2, k++) {
        size_t n = b / sizeof(float), iters = (64u << 20) / b;
        if (iters < 5) iters = 5;
        if (iters > 2000) iters = 2000;
        double t = 0, tx = 0;
        for (size_t it = 0; it < iters + 3; it++) {
            double tw = now_s();
            src[0] = (float)round;
            memcpy(mine, src, b); /* as a send copies into a ring: Modified here */
            atomic_store_explicit(&sh->seq[id], ++round, memory_order_release);
            wait_for(&sh->seq[1 - id], round);
            double t0 = now_s();
            sink += read_all(theirs, n);
            double t1 = now_s();
            if (it >= 3) t += t1 - t0, tx += t1 - tw;
            /* neither side writes again before the other has read */
            atomic_store_explicit(&sh->seq[id], ++round, memory_order_release);
            wait_for(&sh->seq[1 - id], round);
        }
        sh->secs[k][id] = t / (double)iters;
        sh->xsecs[k][id] = tx / (double)iters;
    }
    sh->sink[id] = sink;
    _exit(0);
}

int main(int argc, char **argv) {
    size_t minb = argc > 2 ? strtoull(argv[1], NULL, 10) : 4096;
    size_t maxb = argc > 2 ? strtoull(argv[2], NULL, 10) : (64u << 20);
    if (minb < 64 || maxb < minb || minb % 64) {
        fprintf(stderr, "usage: xcore_bw [min_bytes max_bytes] (multiples of 64)\n");
        return 2;
    }
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *area = mmap(NULL, 2 * maxb, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || area == MAP_FAILED) return 1;
    memset(area, 0, 2 * maxb);
    for (int i = 0; i < 2; i++)
        if (fork() == 0) exchanger(sh, area, i, minb, maxb);
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        int ws;
        if (wait(&ws) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws)) bad = 1;
    }
    if (bad) {
        fprintf(stderr, "xcore_bw: an exchanger failed\n");
        return 1;
    }
    printf("# the other core's fresh writes, 2 processes: %12s %10s %10s %12s %12s\n", "bytes",
           "read_us", "read_GBs", "exchange_us", "exchange_GBs");
    int k = 0;
    for (size_t b = minb; b <= maxb && k < MAX_SIZES; b *= 2, k++) {
        double worst = sh->secs[k][0] > sh->secs[k][1] ? sh->secs[k][0] : sh->secs[k][1];
        double xw = sh->xsecs[k][0] > sh->xsecs[k][1] ? sh->xsecs[k][0] : sh->xsecs[k][1];
        printf("  %12zu %10.2f %10.3f %12.2f %12.3f\n", b, worst * 1e6, (double)b / worst / 1e9,
               xw * 1e6, (double)b / xw / 1e9);
    }
    return 0;
}
