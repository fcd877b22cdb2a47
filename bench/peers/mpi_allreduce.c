/* Peer benchmark: MPI_Allreduce (float32 sum, in place) at doubling sizes, nccl-tests columns.
 * Build: mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 * Run:   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_allreduce [min_bytes max_bytes] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t minb = argc > 2 ? strtoull(argv[1], NULL, 10) : 4096;
    size_t maxb = argc > 2 ? strtoull(argv[2], NULL, 10) : (64u << 20);
    float *buf = aligned_alloc(64, maxb);
    if (rank == 0)
        printf("# %12s %10s %10s %10s %8s\n", "bytes", "time_us", "algbw_GBs", "busbw_GBs",
               "wrong");
    for (size_t b = minb; b <= maxb; b *= 2) {
        size_t count = b / sizeof(float);
        for (size_t i = 0; i < count; i++) buf[i] = (float)((rank + 1) * (int)(i % 7 + 1));
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long wrong = 0;
        float tri = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < count; i++) wrong += buf[i] != tri * (float)(i % 7 + 1);
        for (size_t i = 0; i < count; i++) buf[i] = 1e-3f * (float)(i % 5);
        size_t iters = (256u << 20) / b;
        if (iters < 5) iters = 5;
        if (iters > 2000) iters = 2000;
        for (int w = 0; w < 3; w++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (size_t it = 0; it < iters; it++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / (double)iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long wsum;
        MPI_Reduce(&wrong, &wsum, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = (double)b / tmax / 1e9;
            printf("  %12zu %10.2f %10.3f %10.3f %8ld\n", b, tmax * 1e6, algbw,
                   algbw * 2.0 * (n - 1) / n, wsum);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
