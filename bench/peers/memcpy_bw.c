/* The ceiling for an allreduce on one host: memcpy bandwidth with N processes copying at once
 * (each its own buffer, as the N ranks of an allreduce move their own data at once, so they
 * share the memory bus the same way). At doubling sizes, the same iteration counts as
 * mpi_allreduce.c; each size starts together (a process-shared barrier) and its time is the
 * slowest process's. Prints "bytes time_us GB/s" per size.
 * Build: cc -O2 -pthread -o memcpy_bw memcpy_bw.c
 * Run:   ./memcpy_bw [min_bytes max_bytes nprocs] */
#include <pthread.h>
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
    pthread_barrier_t barrier;
    double secs[MAX_SIZES][64]; /* per size, per process: seconds per copy */
} shared;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void copier(shared *sh, int id, size_t minb, size_t maxb) {
    char *src = aligned_alloc(64, maxb), *dst = aligned_alloc(64, maxb);
    if (!src || !dst) _exit(1);
    memset(src, id + 1, maxb); /* fault every page in before any timing */
    memset(dst, 0, maxb);
    int k = 0;
    for (size_t b = minb; b <= maxb && k < MAX_SIZES; b *= 2, k++) {
        size_t iters = (256u << 20) / b;
        if (iters < 5) iters = 5;
        if (iters > 2000) iters = 2000;
        for (int w = 0; w < 3; w++) memcpy(dst, src, b);
        pthread_barrier_wait(&sh->barrier);
        double t0 = now_s();
        for (size_t it = 0; it < iters; it++) {
            memcpy(dst, src, b);
            __asm__ volatile("" ::"r"(dst) : "memory"); /* every copy happens */
        }
        sh->secs[k][id] = (now_s() - t0) / (double)iters;
    }
    _exit(0);
}

int main(int argc, char **argv) {
    size_t minb = argc > 3 ? strtoull(argv[1], NULL, 10) : 4096;
    size_t maxb = argc > 3 ? strtoull(argv[2], NULL, 10) : (64u << 20);
    int n = argc > 3 ? atoi(argv[3]) : 2;
    if (n < 1 || n > 64 || minb < 1 || maxb < minb) {
        fprintf(stderr, "usage: memcpy_bw [min_bytes max_bytes nprocs(1-64)]\n");
        return 2;
    }
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    pthread_barrierattr_t a;
    pthread_barrierattr_init(&a);
    pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->barrier, &a, (unsigned)n);
    for (int i = 0; i < n; i++)
        if (fork() == 0) copier(sh, i, minb, maxb);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int ws;
        if (wait(&ws) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws)) bad = 1;
    }
    if (bad) {
        fprintf(stderr, "memcpy_bw: a copier failed\n");
        return 1;
    }
    printf("# memcpy, %d processes at once: %12s %10s %10s\n", n, "bytes", "time_us", "GBs");
    int k = 0;
    for (size_t b = minb; b <= maxb && k < MAX_SIZES; b *= 2, k++) {
        double worst = 0;
        for (int i = 0; i < n; i++)
            if (sh->secs[k][i] > worst) worst = sh->secs[k][i];
        printf("  %12zu %10.2f %10.3f\n", b, worst * 1e6, (double)b / worst / 1e9);
    }
    return 0;
}
