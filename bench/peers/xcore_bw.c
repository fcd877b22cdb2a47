/* The other ceiling for a 2-rank allreduce on one host: how fast a core reads data that the
 * other core has just written. Every byte a rank of a 2-rank allreduce ends with came through
 * that path once (half of it is the peer's input to this rank's half, half is the peer's reduced
 * half), so a call on N bytes costs at least N bytes of such reads per rank, both ranks at once.
 * In cache, memcpy (memcpy_bw.c) runs from the core's own L1/L2 and says nothing about this;
 * here the lines are Modified in the other core's cache and must be fetched from it.
 *
 * Two processes, pinned to two CPUs where the affinity mask allows, exchange at doubling sizes:
 * each writes B bytes into its half of a shared mapping, publishes a sequence number, waits for
 * the peer's, and reads (sums) the peer's B bytes; only the read is timed. Prints
 * "bytes time_us GB/s" per size, the slower process's read time, so GB/s is B / read time.
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
    unsigned long round = 0;
    float sink = 0;
    int k = 0;
    for (size_t b = minb; b <= maxb && k < MAX_SIZES; b *= 2, k++) {
        size_t n = b / sizeof(float), iters = (64u << 20) / b;
        if (iters < 5) iters = 5;
        if (iters > 2000) iters = 2000;
        double t = 0;
        for (size_t it = 0; it < iters + 3; it++) {
            for (size_t i = 0; i < n; i++) mine[i] = (float)(round + i); /* Modified here */
            atomic_store_explicit(&sh->seq[id], ++round, memory_order_release);
            wait_for(&sh->seq[1 - id], round);
            double t0 = now_s();
            sink += read_all(theirs, n);
            if (it >= 3) t += now_s() - t0;
            /* neither side writes again before the other has read */
            atomic_store_explicit(&sh->seq[id], ++round, memory_order_release);
            wait_for(&sh->seq[1 - id], round);
        }
        sh->secs[k][id] = t / (double)iters;
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
    printf("# reads of the other core's fresh writes, 2 processes: %12s %10s %10s\n", "bytes",
           "time_us", "GBs");
    int k = 0;
    for (size_t b = minb; b <= maxb && k < MAX_SIZES; b *= 2, k++) {
        double worst = sh->secs[k][0] > sh->secs[k][1] ? sh->secs[k][0] : sh->secs[k][1];
        printf("  %12zu %10.2f %10.3f\n", b, worst * 1e6, (double)b / worst / 1e9);
    }
    return 0;
}
