/* A helper for tests/comm/test_multihost.sh (not a test by itself):
 *   comm_worker store HOST PORTFILE   runs a store (token from TANDEM_TOKEN) on HOST, port 0,
 *                                     writes the port to PORTFILE, serves until killed
 *   comm_worker rank                  joins the group from the launcher's environment (RANK,
 *                                     WORLD_SIZE, TANDEM_STORE_ADDR, TANDEM_TOKEN), checks the
 *                                     transports (EXPECT_TRANSPORT=tcp|shm|mixed) and runs checked
 *                                     allreduces and broadcasts; exit 0 when all were right */
#include "test.h"

#include <signal.h>
#include <unistd.h>

#include "comm/pg_internal.h"
#include "tandem/comm.h"

static float val(int rank, size_t i) {
    return td_rng_uniform(99, (uint64_t)rank, i) * 2.0f - 1.0f;
}

static float tree_ref(const float *v, int W) {
    float a[64];
    memcpy(a, v, (size_t)W * sizeof(float));
    for (int m = W; m > 1;) {
        int k = 0;
        for (int i = 0; i + 1 < m; i += 2) a[k++] = a[i] + a[i + 1];
        if (m & 1) a[k++] = a[m - 1];
        m = k;
    }
    return a[0];
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "store")) {
        td_store_server_t *srv;
        ASSERT_OK(td_store_server_start(argv[2], 0, getenv("TANDEM_TOKEN"), &srv));
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", argv[3]);
        FILE *f = fopen(tmp, "w");
        ASSERT(f);
        fprintf(f, "%d\n", td_store_server_port(srv));
        fclose(f);
        ASSERT_EQ(rename(tmp, argv[3]), 0);
        for (;;) pause();
    }
    if (argc < 2 || strcmp(argv[1], "rank"))
        TEST_FAIL("usage: comm_worker store HOST PORTFILE | rank");
    td_pg_t *pg;
    td_store_t *store;
    ASSERT_OK(td_pg_init_from_env(&pg, &store));
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    const char *expect = getenv("EXPECT_TRANSPORT");
    if (expect && !strcmp(expect, "tcp")) ASSERT(pg->tcp && !pg->shm);
    if (expect && !strcmp(expect, "shm")) ASSERT(pg->shm && !pg->tcp);
    size_t counts[] = {1, 1023, 262147, (size_t)3 << 20};
    float v[64];
    for (size_t c = 0; c < TD_ARRAY_LEN(counts); c++) {
        size_t n = counts[c];
        float *buf = td_xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) buf[i] = val(r, i);
        ASSERT_OK(td_allreduce(pg, buf, n, TD_REDUCE_SUM));
        for (size_t i = 0; i < n; i++) {
            for (int j = 0; j < W; j++) v[j] = val(j, i);
            float e = tree_ref(v, W);
            if (memcmp(&e, &buf[i], 4))
                TEST_FAIL("rank %d: allreduce(count=%zu) element %zu = %.9g, expected %.9g", r, n,
                          i, buf[i], e);
        }
        for (size_t i = 0; i < n; i++) buf[i] = r == W - 1 ? val(W - 1, i) : 0.0f;
        ASSERT_OK(td_broadcast(pg, buf, n * sizeof(float), W - 1));
        for (size_t i = 0; i < n; i++) ASSERT(buf[i] == val(W - 1, i));
        free(buf);
    }
    ASSERT_OK(td_barrier(pg));
    printf("rank %d of %d ok: transports%s%s\n", r, W, pg->shm ? " shm" : "",
           pg->tcp ? " tcp" : "");
    td_pg_free(pg);
    td_store_close(store);
    return 0;
}
