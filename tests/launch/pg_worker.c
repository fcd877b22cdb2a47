/* A worker for the launch tests: builds tandem's process group from the launcher's environment
 * (td_pg_init_from_env), allreduces and checks the sums, so the env contract between launch and
 * comm is tested end to end (test_launch_pg.py: no arguments, one allreduce and a barrier).
 *
 * The stall tests (test_launch_stall.py, test_stall_nodes.sh) run it longer:
 *   --iters N          N rounds of allreduce (every 8th one pipelined, 1.2 MB), then a barrier
 *   --interval-ms M    sleep M ms between rounds (keeps a 2-core machine usable)
 *   --pid-dir D        write D/rank-R.pid once the group is up (for the test's SIGSTOP)
 *   --nap R:AT:S       rank R sleeps S seconds between round AT and AT+1: busy, not stuck */
#include "test.h"

#include <time.h>
#include <unistd.h>

#include "tandem/comm.h"

#define BIG_COUNT (300 * 1000)

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void allreduce_check(td_pg_t *pg, float *buf, size_t count) {
    int rank = td_pg_rank(pg), world = td_pg_world_size(pg);
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1) * (float)(i % 1000);
    ASSERT_OK(td_allreduce(pg, buf, count, TD_REDUCE_SUM));
    float tri = (float)(world * (world + 1) / 2);
    for (size_t i = 0; i < count; i++) ASSERT_NEAR(buf[i], tri * (float)(i % 1000), 1e-3);
}

int main(int argc, char **argv) {
    long iters = 1, interval_ms = 0, nap_rank = -1, nap_at = -1;
    double nap_s = 0;
    const char *pid_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters"))
            iters = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--interval-ms"))
            interval_ms = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--pid-dir"))
            pid_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--nap"))
            ASSERT_EQ(sscanf(argv[i + 1], "%ld:%ld:%lf", &nap_rank, &nap_at, &nap_s), 3);
        else
            TEST_FAIL("unknown argument %s", argv[i]);
    }
    td_pg_t *pg = NULL;
    td_store_t *store = NULL;
    ASSERT_OK(td_pg_init_from_env(&pg, &store));
    int rank = td_pg_rank(pg), world = td_pg_world_size(pg);
    ASSERT_EQ(rank, atoi(getenv("RANK")));
    ASSERT_EQ(world, atoi(getenv("WORLD_SIZE")));
    if (pid_dir) {
        char path[512];
        snprintf(path, sizeof path, "%s/rank-%d.pid", pid_dir, rank);
        FILE *f = fopen(path, "w");
        ASSERT(f);
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
    float *buf = td_xmalloc(BIG_COUNT * sizeof(float));
    for (long it = 0; it < iters; it++) {
        allreduce_check(pg, buf, it % 8 == 7 ? BIG_COUNT : 1000);
        if (rank == nap_rank && it == nap_at) {
            printf("rank %d naps %.1f s after round %ld\n", rank, nap_s, it);
            fflush(stdout);
            sleep_s(nap_s);
        }
        if (interval_ms) sleep_s((double)interval_ms / 1000.0);
    }
    free(buf);
    ASSERT_OK(td_barrier(pg));
    printf("pg ok rank %d of %d restart %s\n", rank, world, getenv("TANDEM_RESTART_COUNT"));
    td_pg_free(pg);
    td_store_close(store);
    return 0;
}
