/* launch internals: the agents' rendezvous over a real store (threads stand in for node agents:
 * explicit, missing and duplicate node ranks, N:M closing), endpoint parsing, status text. */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "launch/launch_internal.h"
#include "tandem/os.h"

typedef struct {
    int port;
    const char *ns;
    int min_nodes, max_nodes, node_rank, nproc;
    td_status st;
    td__rdzv_result res;
} agent_arg;

static void *agent_main(void *p) {
    agent_arg *a = p;
    td_store_t *store = NULL;
    a->st = td_store_connect("127.0.0.1", a->port, "tok", 10000, &store);
    if (a->st != TD_OK) return NULL;
    td__rdzv_params rp = {.store = store,
                          .ns = a->ns,
                          .min_nodes = a->min_nodes,
                          .max_nodes = a->max_nodes,
                          .node_rank = a->node_rank,
                          .nproc = a->nproc,
                          .store_host = "127.0.0.1",
                          .store_port = a->port,
                          .timeout_s = 10,
                          .last_call_s = 0.3,
                          .sig_fd = -1};
    a->st = td__rdzv_join(&rp, &a->res);
    td_store_close(store);
    return NULL;
}

static void run_agents(agent_arg *args, int n) {
    pthread_t th[8];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, agent_main, &args[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

int main(void) {
    td_store_server_t *srv = NULL;
    ASSERT_OK(td_store_server_start("127.0.0.1", 0, "tok", &srv));
    int port = td_store_server_port(srv);

    /* 3 nodes: one says --node-rank 1, two give none; nproc 2, 1, 3. */
    agent_arg a[3] = {
        {port, "t1", 3, 3, 1, 2, TD_OK, {0}},
        {port, "t1", 3, 3, -1, 1, TD_OK, {0}},
        {port, "t1", 3, 3, -1, 3, TD_OK, {0}},
    };
    run_agents(a, 3);
    int seen[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(a[i].st);
        ASSERT_EQ(a[i].res.nnodes, 3);
        ASSERT_EQ(a[i].res.world_size, 6);
        ASSERT_EQ(a[i].res.master_port, a[0].res.master_port);
        ASSERT_STREQ(a[i].res.master_addr, "127.0.0.1");
        seen[a[i].res.group_rank]++;
    }
    ASSERT(a[0].res.master_port > 0);
    ASSERT_EQ(seen[0] * seen[1] * seen[2], 1);
    ASSERT_EQ(a[0].res.group_rank, 1); /* explicit rank honoured */
    /* offsets follow group rank order: ranks of node g start after nodes 0..g-1 */
    for (int i = 0; i < 3; i++) {
        int want = 0;
        for (int j = 0; j < 3; j++)
            if (a[j].res.group_rank < a[i].res.group_rank) want += a[j].nproc;
        ASSERT_EQ(a[i].res.rank_offset, want);
    }

    /* N:M = 2:3 with two agents closes at 2 after the last call */
    agent_arg b[2] = {{port, "t2", 2, 3, -1, 1, TD_OK, {0}}, {port, "t2", 2, 3, -1, 1, TD_OK, {0}}};
    double t0 = td_now_s();
    run_agents(b, 2);
    ASSERT_OK(b[0].st);
    ASSERT_OK(b[1].st);
    ASSERT_EQ(b[0].res.nnodes, 2);
    ASSERT_EQ(b[0].res.group_rank + b[1].res.group_rank, 1);
    ASSERT(td_now_s() - t0 >= 0.25);

    /* duplicate --node-rank is a usage error naming the rank */
    agent_arg c[2] = {{port, "t3", 2, 2, 0, 1, TD_OK, {0}}, {port, "t3", 2, 2, 0, 1, TD_OK, {0}}};
    run_agents(c, 2);
    ASSERT_STATUS(c[0].st, TD_ERR_USAGE);
    ASSERT_STATUS(c[1].st, TD_ERR_USAGE);
    td_store_server_stop(srv);

    /* endpoints */
    char host[64];
    int p = 0;
    ASSERT_OK(td__parse_endpoint("10.0.0.1:1234", host, sizeof host, &p));
    ASSERT_STREQ(host, "10.0.0.1");
    ASSERT_EQ(p, 1234);
    ASSERT_OK(td__parse_endpoint("[::1]:99", host, sizeof host, &p));
    ASSERT_STREQ(host, "::1");
    ASSERT_EQ(p, 99);
    ASSERT_OK(td__parse_endpoint("node0", host, sizeof host, &p));
    ASSERT_EQ(p, 29400);
    ASSERT_STATUS(td__parse_endpoint("node0:http", host, sizeof host, &p), TD_ERR_USAGE);
    ASSERT_STATUS(td__parse_endpoint(":5", host, sizeof host, &p), TD_ERR_USAGE);

    /* status text */
    char buf[128];
    td_wait_describe(9, buf, sizeof buf); /* killed by SIGKILL */
    ASSERT_STREQ(buf, "was killed by signal 9 (SIGKILL)");
    td_wait_describe(3 << 8, buf, sizeof buf);
    ASSERT_STREQ(buf, "exited with code 3");
    ASSERT(td__status_ok(0));
    ASSERT(!td__status_ok(3 << 8));
    TEST_PASS();
}
