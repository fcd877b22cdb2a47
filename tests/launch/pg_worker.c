/* A worker for test_launch_pg.py: builds tandem's process group from the launcher's environment
 * (td_pg_init_from_env), allreduces and checks the sum, so the env contract between launch and
 * comm is tested end to end. */
#include "test.h"

#include "tandem/comm.h"

int main(void) {
    td_pg_t *pg = NULL;
    td_store_t *store = NULL;
    ASSERT_OK(td_pg_init_from_env(&pg, &store));
    int rank = td_pg_rank(pg), world = td_pg_world_size(pg);
    ASSERT_EQ(rank, atoi(getenv("RANK")));
    ASSERT_EQ(world, atoi(getenv("WORLD_SIZE")));
    float buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (float)(rank + 1) * (float)i;
    ASSERT_OK(td_allreduce(pg, buf, 1000, TD_REDUCE_SUM));
    float tri = (float)(world * (world + 1) / 2);
    for (int i = 0; i < 1000; i++) ASSERT_NEAR(buf[i], tri * (float)i, 1e-3);
    ASSERT_OK(td_barrier(pg));
    printf("pg ok rank %d of %d restart %s\n", rank, world, getenv("TANDEM_RESTART_COUNT"));
    td_pg_free(pg);
    td_store_close(store);
    return 0;
}
