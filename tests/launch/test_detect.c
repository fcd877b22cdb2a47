/* launch: topology from the scheduler's environment (td_launch_detect) on synthetic environments:
 * each scheduler's happy path, every inconsistency it must refuse (with the variables and values
 * in the message), Slurm hostlist expansion (compared with `scontrol show hostnames` where Slurm
 * is installed), and how a detection fills td_launch_options. The end-to-end run of two
 * launchers under a synthetic Slurm step is tests/launch/test_detect_slurm.sh. */
#include "test.h"

#include <stdbool.h>
#include <unistd.h>

#include "tandem/launch.h"

#define ENV(...) ((char *const[]){__VA_ARGS__, NULL})

/* ---- hostlists ---- */
static void expect_hosts(const char *list, const char *const *want, int nwant) {
    char **hosts = NULL;
    int n = 0;
    ASSERT_OK(td_hostlist_expand(list, &hosts, &n));
    if (n != nwant) TEST_FAIL("hostlist '%s': %d hosts, expected %d", list, n, nwant);
    for (int i = 0; i < n; i++)
        if (strcmp(hosts[i], want[i]))
            TEST_FAIL("hostlist '%s': host %d is '%s', expected '%s'", list, i, hosts[i], want[i]);
    td_hostlist_free(hosts, n);
}
#define EXPECT_HOSTS(list, ...)                                                                    \
    do {                                                                                           \
        static const char *const w_[] = {__VA_ARGS__};                                             \
        expect_hosts(list, w_, (int)TD_ARRAY_LEN(w_));                                             \
    } while (0)

static void expect_bad_hostlist(const char *list, const char *needle) {
    char **hosts = NULL;
    int n = 0;
    ASSERT_STATUS(td_hostlist_expand(list, &hosts, &n), TD_ERR_INVALID);
    ASSERT(hosts == NULL && n == 0);
    ASSERT_CONTAINS(td_error_msg(), needle);
}

/* Where Slurm is installed, `scontrol show hostnames` is the reference: it expands offline, given
 * any slurm.conf. Returns false when scontrol calls the list invalid (then nothing is compared). */
static bool compare_with_scontrol(const char *conf, const char *list) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scontrol show hostnames '%s' 2>&1", conf, list);
    FILE *p = popen(cmd, "r");
    ASSERT(p != NULL);
    char **hosts = NULL;
    int n = 0, i = 0;
    bool invalid = false;
    ASSERT_OK(td_hostlist_expand(list, &hosts, &n));
    char line[512];
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (strstr(line, "Invalid hostlist") || strstr(line, "error:")) {
            invalid = true;
            continue;
        }
        if (i >= n) TEST_FAIL("'%s': scontrol prints more hosts than our %d ('%s')", list, n, line);
        if (strcmp(line, hosts[i]))
            TEST_FAIL("'%s': host %d: scontrol '%s', ours '%s'", list, i, line, hosts[i]);
        i++;
    }
    pclose(p);
    td_hostlist_free(hosts, n);
    if (invalid) return false;
    if (i != n) TEST_FAIL("'%s': scontrol prints %d hosts, ours %d", list, i, n);
    return true;
}

static void test_hostlists(void) {
    EXPECT_HOSTS("tdnode[1-3,5]", "tdnode1", "tdnode2", "tdnode3", "tdnode5");
    EXPECT_HOSTS("a[01-03]b", "a01b", "a02b", "a03b");
    EXPECT_HOSTS("n1,n[3-4],gpu-[08-10]", "n1", "n3", "n4", "gpu-08", "gpu-09", "gpu-10");
    /* width is that of the lower bound as written */
    EXPECT_HOSTS("x[8-10]", "x8", "x9", "x10");
    EXPECT_HOSTS("x[008-10]", "x008", "x009", "x010");
    /* two groups: the first varies slowest */
    EXPECT_HOSTS("r[1-2]n[1-2]", "r1n1", "r1n2", "r2n1", "r2n2");
    /* three: Slurm's _push_range_list expands the groups before the last one from the right,
     * so the middle one is the outer loop */
    EXPECT_HOSTS("a[1-2]b[3-4]c[5-6]", "a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6",
                 "a2b4c5", "a2b4c6");
    EXPECT_HOSTS("rack[0-1]_blade[7]-eth", "rack0_blade7-eth", "rack1_blade7-eth");
    EXPECT_HOSTS("127.0.0.[1-2]", "127.0.0.1", "127.0.0.2");
    EXPECT_HOSTS("node01", "node01");
    EXPECT_HOSTS(" a1  a2\tb[1-2],,c ", "a1", "a2", "b1", "b2", "c");
    EXPECT_HOSTS("n[1-2,4],m3", "n1", "n2", "n4", "m3");
    EXPECT_HOSTS("n[7]", "n7");
    {
        char **hosts = NULL;
        int n = -1;
        ASSERT_OK(td_hostlist_expand("", &hosts, &n));
        ASSERT_EQ(n, 0);
        td_hostlist_free(hosts, n);
    }
    expect_bad_hostlist("a[1-", "'[' without ']'");
    expect_bad_hostlist("a[1-2", "'[' without ']'");
    expect_bad_hostlist("a1]", "']' without '['");
    expect_bad_hostlist("a[3-1]", "range goes down");
    expect_bad_hostlist("a[x]", "not a number");
    expect_bad_hostlist("a[1-]", "not a number");
    expect_bad_hostlist("a[]", "empty brackets");
    expect_bad_hostlist("a[1,]", "trailing ','");
    expect_bad_hostlist("a[123x456]", "not a number"); /* 3-D boxes: not on clusters we run on */
    expect_bad_hostlist("a[0-99999]", "more than 65536");
    expect_bad_hostlist("a[0-999]b[0-999]", "more than 65536 hosts");

    if (system("command -v scontrol >/dev/null 2>&1") == 0) {
        /* A name with text after its last bracket ("a[01-03]b") is Slurm 23.02.5's syntax; an
         * older scontrol calls it invalid, and only those may be skipped. */
        static const struct {
            const char *list;
            bool suffix;
        } lists[] = {{"tdnode[1-3,5]", false},
                     {"a[01-03]b", true},
                     {"n1,n[3-4],gpu-[08-10]", false},
                     {"x[8-10]", false},
                     {"x[008-10]", false},
                     {"r[1-2]n[1-2]", false},
                     {"a[1-2]b[3-4]c[5-6]", false},
                     {"127.0.0.[1-2]", false},
                     {"node01", false},
                     {"n[1-2,4],m3", false},
                     {" a1  a2\tb[1-2],,c ", false},
                     {"rack[0-1]_blade[7]-eth", true}};
        char conf[] = "/tmp/test_detect_slurm_conf_XXXXXX";
        int fd = mkstemp(conf);
        ASSERT(fd >= 0);
        static const char text[] = "ClusterName=tdtest\nSlurmctldHost=localhost\n"
                                   "NodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n";
        ASSERT_EQ(write(fd, text, sizeof text - 1), (long long)(sizeof text - 1));
        close(fd);
        int compared = 0, skipped = 0;
        for (size_t i = 0; i < TD_ARRAY_LEN(lists); i++) {
            if (compare_with_scontrol(conf, lists[i].list)) {
                compared++;
            } else if (lists[i].suffix) {
                skipped++;
            } else {
                unlink(conf);
                TEST_FAIL("scontrol calls '%s' invalid", lists[i].list);
            }
        }
        unlink(conf);
        printf("%d hostlists match `scontrol show hostnames`; %d with a suffix skipped (this "
               "Slurm predates 23.02.5)\n",
               compared, skipped);
    } else {
        printf("scontrol not installed: hostlists checked against expansions read from Slurm's "
               "src/common/hostlist.c\n");
    }
}

/* ---- detection ---- */
static void expect_error_at(int line, char *const *env, const char *n1, const char *n2) {
    td_launch_detected d;
    td_error_clear();
    if (td_launch_detect(env, &d) != TD_ERR_USAGE)
        TEST_FAIL("line %d: td_launch_detect did not fail (expected \"%s\")", line, n1);
    ASSERT(d.scheduler == NULL);
    ASSERT_CONTAINS(td_error_msg(), n1);
    if (n2) ASSERT_CONTAINS(td_error_msg(), n2);
    ASSERT_CONTAINS(td_error_msg(), "TANDEM_LAUNCH_DETECT=0"); /* every error says the way out */
}
#define expect_error(env, n1, n2) expect_error_at(__LINE__, env, n1, n2)

#define SLURM_STEP2(nodeid)                                                                        \
    "SLURM_JOB_ID=123456", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NUM_TASKS=2",  \
        "SLURM_STEP_NODELIST=tdnode[1-2]", "SLURM_JOB_NODELIST=tdnode[1-4]", "SLURM_NNODES=2",     \
        "SLURM_LOCALID=0", "SLURM_NODEID=" nodeid

static void test_slurm(void) {
    td_launch_detected d, d0;
    char line[512];
    ASSERT_OK(td_launch_detect(ENV(SLURM_STEP2("1"), "PATH=/bin"), &d));
    ASSERT_STREQ(d.scheduler, "Slurm");
    ASSERT_EQ(d.nnodes, 2);
    ASSERT_EQ(d.node_rank, 1);
    ASSERT_STREQ(d.host, "tdnode1"); /* the step's first host, not the job's */
    ASSERT_EQ(d.port, 23456);        /* 20000 + 123456 mod 10000 */
    ASSERT_STREQ(d.endpoint, "tdnode1:23456");
    ASSERT_STREQ(d.run_id, "slurm-123456.0");
    td_launch_detected_describe(&d, line, sizeof line);
    ASSERT_STREQ(line, "topology from Slurm: node 1 of 2, rendezvous tdnode1:23456, run id "
                       "slurm-123456.0");
    /* every node computes the same endpoint and id */
    ASSERT_OK(td_launch_detect(ENV(SLURM_STEP2("0")), &d0));
    ASSERT_EQ(d0.node_rank, 0);
    ASSERT_STREQ(d0.endpoint, d.endpoint);
    ASSERT_STREQ(d0.run_id, d.run_id);
    /* a requeued job keeps its id (the store died with the first run) */
    ASSERT_OK(td_launch_detect(ENV(SLURM_STEP2("0"), "SLURM_RESTART_COUNT=3"), &d0));
    ASSERT_STREQ(d0.run_id, "slurm-123456.0");
    ASSERT_EQ(d0.port, 23456);
    /* consecutive jobs get consecutive ports; another step another port and id */
    ASSERT_OK(td_launch_detect(ENV("SLURM_JOB_ID=123457", "SLURM_STEP_NUM_NODES=2",
                                   "SLURM_NODEID=0", "SLURM_STEP_NODELIST=tdnode[1-2]"),
                               &d0));
    ASSERT_EQ(d0.port, 23457);
    ASSERT_STREQ(d0.run_id, "slurm-123457"); /* no step id given */
    ASSERT_OK(td_launch_detect(ENV("SLURM_JOBID=123456", "SLURM_STEPID=1", "SLURM_STEP_NUM_NODES=2",
                                   "SLURM_NODEID=0", "SLURM_STEP_NODELIST=tdnode[1-2]"),
                               &d0));
    ASSERT_EQ(d0.port, 20000 + (123456 + 7919) % 10000);
    ASSERT_STREQ(d0.run_id, "slurm-123456.1");
    /* a job id that lands on torch's 29500 is moved off it, still the same on every node */
    ASSERT_OK(td_launch_detect(ENV("SLURM_JOB_ID=9500", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2",
                                   "SLURM_NODEID=1", "SLURM_STEP_NODELIST=n[1-2]"),
                               &d0));
    ASSERT(d0.port >= 30000 && d0.port < 30032);
    for (int job = 0; job < 10000; job++) {
        char jv[32];
        snprintf(jv, sizeof jv, "SLURM_JOB_ID=%d", job);
        ASSERT_OK(td_launch_detect(ENV(jv, "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2",
                                       "SLURM_NODEID=1", "SLURM_STEP_NODELIST=n[1-2]"),
                                   &d0));
        ASSERT(d0.port >= 20000 && d0.port < 32768);
        ASSERT(d0.port != 29400 && d0.port != 29500 && d0.port != 27017 && d0.port != 20048);
    }
    /* the batch script of a one-node job: standalone */
    ASSERT_OK(td_launch_detect(ENV("SLURM_JOB_ID=77", "SLURM_JOB_NUM_NODES=1", "SLURM_NNODES=1",
                                   "SLURM_JOB_NODELIST=tdnode7", "SLURM_NODEID=0"),
                               &d));
    ASSERT_EQ(d.nnodes, 1);
    ASSERT_STREQ(d.endpoint, "");
    ASSERT_STREQ(d.run_id, "slurm-77");
    td_launch_detected_describe(&d, line, sizeof line);
    ASSERT_STREQ(line, "topology from Slurm: 1 node, standalone, run id slurm-77");
    /* an srun step on one node too */
    ASSERT_OK(td_launch_detect(ENV("SLURM_JOB_ID=78", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=1",
                                   "SLURM_STEP_NUM_TASKS=1", "SLURM_NODEID=0",
                                   "SLURM_STEP_NODELIST=tdnode7"),
                               &d));
    ASSERT_EQ(d.nnodes, 1);
    ASSERT_EQ(d.port, 0);
    ASSERT_STREQ(d.host, "");

    /* inconsistencies */
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=2",
                     "SLURM_NODEID=3", "SLURM_STEP_NODELIST=n[1-2]"),
                 "SLURM_NODEID=3 but SLURM_STEP_NUM_NODES=2", NULL);
    /* env_get takes the first of duplicates: the override goes first */
    expect_error(ENV("SLURM_STEP_NUM_TASKS=4", SLURM_STEP2("0")),
                 "SLURM_STEP_NUM_TASKS=4 on SLURM_STEP_NUM_NODES=2 nodes",
                 "srun --ntasks-per-node=1 tandem launch");
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=0",
                     "SLURM_LOCALID=1", "SLURM_STEP_NODELIST=n[1-2]"),
                 "SLURM_LOCALID=1", "srun --ntasks-per-node=1");
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_JOB_NUM_NODES=2", "SLURM_NODEID=0",
                     "SLURM_JOB_NODELIST=n[1-2]"),
                 "SLURM_JOB_NUM_NODES=2 but this process is not in an srun step",
                 "srun --ntasks-per-node=1");
    expect_error(ENV("SLURM_JOB_ID=1"), "SLURM_NNODES is not set", NULL);
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=0",
                     "SLURM_STEP_NODELIST=n[1-3]"),
                 "SLURM_STEP_NODELIST=n[1-3] has 3 hosts but SLURM_STEP_NUM_NODES=2", NULL);
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=0",
                     "SLURM_JOB_NODELIST=n[1-"),
                 "SLURM_JOB_NODELIST: hostlist 'n[1-'", "'[' without ']'");
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=0"),
                 "SLURM_STEP_NODELIST is not set", NULL);
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NODELIST=n[1-2]"),
                 "SLURM_NODEID is not set", NULL);
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=two", "SLURM_NODEID=0"),
                 "SLURM_STEP_NUM_NODES='two' is not an integer", NULL);
    expect_error(ENV("SLURM_JOB_ID=abc"), "SLURM_JOB_ID='abc'", NULL);
    expect_error(ENV("SLURM_JOB_ID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=0",
                     "SLURM_STEP_NODELIST=n/1,n2"),
                 "'n/1' as node 0's address", NULL);
}

#define OMPI2(rank)                                                                                \
    "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=" rank, "OMPI_COMM_WORLD_LOCAL_RANK=0",        \
        "OMPI_COMM_WORLD_LOCAL_SIZE=1", "OMPI_MCA_orte_num_nodes=2", "PMIX_NAMESPACE=1712717825"

static void test_openmpi(void) {
    td_launch_detected d;
    ASSERT_OK(td_launch_detect(ENV(OMPI2("1"), "MASTER_ADDR=10.0.0.5", "MASTER_PORT=29555"), &d));
    ASSERT_STREQ(d.scheduler, "Open MPI");
    ASSERT_EQ(d.nnodes, 2);
    ASSERT_EQ(d.node_rank, 1);
    ASSERT_STREQ(d.endpoint, "10.0.0.5:29555");
    ASSERT_STREQ(d.run_id, "ompi-1712717825");
    ASSERT_OK(td_launch_detect(ENV(OMPI2("0"), "MASTER_ADDR=fd00::1"), &d));
    ASSERT_STREQ(d.host, "fd00::1");
    ASSERT_STREQ(d.endpoint, "[fd00::1]:29500"); /* --master-port's default */
    /* Open MPI 5 (PRRTE) namespaces carry '@': kept readable, safe for store keys */
    ASSERT_OK(td_launch_detect(ENV("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE=1", "MASTER_ADDR=head",
                                   "PMIX_NAMESPACE=prterun-head-123@1"),
                               &d));
    ASSERT_STREQ(d.run_id, "ompi-prterun-head-123_1");
    /* one process: one node, no address needed */
    ASSERT_OK(td_launch_detect(
        ENV("OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1"),
        &d));
    ASSERT_EQ(d.nnodes, 1);
    ASSERT_STREQ(d.run_id, "ompi");

    expect_error(ENV(OMPI2("0")), "MASTER_ADDR is not set", "mpirun -x MASTER_ADDR");
    expect_error(ENV("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1",
                     "OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_ADDR=h"),
                 "OMPI_COMM_WORLD_LOCAL_SIZE=2", "--map-by ppr:1:node");
    expect_error(ENV("OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=1",
                     "OMPI_COMM_WORLD_LOCAL_SIZE=1", "OMPI_MCA_orte_num_nodes=2", "MASTER_ADDR=h"),
                 "OMPI_COMM_WORLD_SIZE=4 processes on OMPI_MCA_orte_num_nodes=2 nodes", NULL);
    expect_error(ENV("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=2",
                     "OMPI_COMM_WORLD_LOCAL_SIZE=1", "MASTER_ADDR=h"),
                 "OMPI_COMM_WORLD_RANK=2 but OMPI_COMM_WORLD_SIZE=2", NULL);
    expect_error(ENV("OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "MASTER_ADDR=h"),
                 "OMPI_COMM_WORLD_LOCAL_SIZE is not set", NULL);
    expect_error(ENV(OMPI2("0"), "MASTER_ADDR=h", "MASTER_PORT=99999"), "MASTER_PORT='99999'",
                 NULL);
    expect_error(ENV(OMPI2("0"), "MASTER_ADDR=tcp://h:1"), "MASTER_ADDR gives 'tcp://h:1'", NULL);
}

static void test_dstack(void) {
    td_launch_detected d;
    ASSERT_OK(
        td_launch_detect(ENV("DSTACK_NODES_NUM=2", "DSTACK_NODE_RANK=1",
                             "DSTACK_MASTER_NODE_IP=10.0.0.7", "DSTACK_RUN_NAME=train-distrib",
                             "DSTACK_NODES_IPS=10.0.0.7\n10.0.0.8", "DSTACK_GPUS_PER_NODE=8"),
                         &d));
    ASSERT_STREQ(d.scheduler, "dstack");
    ASSERT_EQ(d.nnodes, 2);
    ASSERT_EQ(d.node_rank, 1);
    ASSERT_STREQ(d.endpoint, "10.0.0.7:29400");
    ASSERT_STREQ(d.run_id, "dstack-train-distrib");
    ASSERT_OK(td_launch_detect(
        ENV("DSTACK_NODES_NUM=1", "DSTACK_NODE_RANK=0", "DSTACK_RUN_ID=1b0e-42"), &d));
    ASSERT_EQ(d.nnodes, 1);
    ASSERT_STREQ(d.run_id, "dstack-1b0e-42");

    expect_error(ENV("DSTACK_NODES_NUM=2", "DSTACK_NODE_RANK=2", "DSTACK_MASTER_NODE_IP=10.0.0.7"),
                 "DSTACK_NODE_RANK=2 but DSTACK_NODES_NUM=2", NULL);
    expect_error(ENV("DSTACK_NODES_NUM=2", "DSTACK_NODE_RANK=0"),
                 "DSTACK_MASTER_NODE_IP is not set", NULL);
    expect_error(ENV("DSTACK_NODE_RANK=0", "DSTACK_MASTER_NODE_IP=10.0.0.7"),
                 "DSTACK_NODES_NUM is not set", NULL);
    expect_error(ENV("DSTACK_NODES_NUM=3", "DSTACK_NODE_RANK=0", "DSTACK_MASTER_NODE_IP=10.0.0.7",
                     "DSTACK_NODES_IPS=10.0.0.7\n10.0.0.8\n"),
                 "DSTACK_NODES_IPS has 2 addresses but DSTACK_NODES_NUM=3", NULL);
}

static void test_skypilot(void) {
    td_launch_detected d;
    ASSERT_OK(td_launch_detect(ENV("SKYPILOT_NODE_IPS=10.1.0.4\n10.1.0.5\n", "SKYPILOT_NODE_RANK=1",
                                   "SKYPILOT_NUM_NODES=2",
                                   "SKYPILOT_TASK_ID=sky-2024-07-06-21-18-31-563597_mycluster_1"),
                               &d));
    ASSERT_STREQ(d.scheduler, "SkyPilot");
    ASSERT_EQ(d.nnodes, 2);
    ASSERT_EQ(d.node_rank, 1);
    ASSERT_STREQ(d.host, "10.1.0.4");
    ASSERT_STREQ(d.endpoint, "10.1.0.4:29400");
    ASSERT_STREQ(d.run_id, "skypilot-sky-2024-07-06-21-18-31-563597_mycluster_1");
    /* no SKYPILOT_NUM_NODES (older releases): the list says how many */
    ASSERT_OK(td_launch_detect(
        ENV("SKYPILOT_NODE_IPS=10.1.0.4\r\n10.1.0.5\r\n10.1.0.6", "SKYPILOT_NODE_RANK=2"), &d));
    ASSERT_EQ(d.nnodes, 3);
    ASSERT_EQ(d.node_rank, 2);
    ASSERT_STREQ(d.run_id, "skypilot");

    expect_error(ENV("SKYPILOT_NODE_IPS=10.1.0.4", "SKYPILOT_NODE_RANK=0", "SKYPILOT_NUM_NODES=2"),
                 "SKYPILOT_NODE_IPS has 1 address but SKYPILOT_NUM_NODES=2", NULL);
    expect_error(ENV("SKYPILOT_NODE_IPS=10.1.0.4\n10.1.0.5", "SKYPILOT_NODE_RANK=2"),
                 "SKYPILOT_NODE_RANK=2 but SKYPILOT_NODE_IPS has 2 addresses", NULL);
    expect_error(ENV("SKYPILOT_NODE_RANK=0"), "SKYPILOT_NODE_IPS is not set", NULL);
    expect_error(ENV("SKYPILOT_NODE_IPS=10.1.0.4\n10.1.0.5"), "SKYPILOT_NODE_RANK is not set",
                 NULL);
}

static void test_sagemaker(void) {
    td_launch_detected d;
    ASSERT_OK(td_launch_detect(ENV("SM_HOSTS=[\"algo-1\",\"algo-2\"]", "SM_CURRENT_HOST=algo-2",
                                   "TRAINING_JOB_NAME=pytorch-training-2024-01-01"),
                               &d));
    ASSERT_STREQ(d.scheduler, "SageMaker");
    ASSERT_EQ(d.nnodes, 2);
    ASSERT_EQ(d.node_rank, 1);
    ASSERT_STREQ(d.endpoint, "algo-1:29400");
    ASSERT_STREQ(d.run_id, "sagemaker-pytorch-training-2024-01-01");
    /* the list's own order (sorted as strings by SageMaker: algo-10 before algo-2) is the rank */
    ASSERT_OK(td_launch_detect(
        ENV("SM_HOSTS= [ \"algo-1\", \"algo-10\" ,\"algo-2\" ] ", "SM_CURRENT_HOST=algo-2"), &d));
    ASSERT_EQ(d.nnodes, 3);
    ASSERT_EQ(d.node_rank, 2);
    ASSERT_STREQ(d.host, "algo-1");
    ASSERT_OK(td_launch_detect(ENV("SM_HOSTS=[\"algo-1\"]", "SM_CURRENT_HOST=algo-1"), &d));
    ASSERT_EQ(d.nnodes, 1);

    expect_error(ENV("SM_HOSTS=[\"algo-1\",\"algo-2\"]", "SM_CURRENT_HOST=algo-3"),
                 "SM_CURRENT_HOST=algo-3 is not in SM_HOSTS=[\"algo-1\",\"algo-2\"]", NULL);
    expect_error(ENV("SM_HOSTS=algo-1,algo-2", "SM_CURRENT_HOST=algo-1"),
                 "SM_HOSTS='algo-1,algo-2' is not a JSON list", NULL);
    expect_error(ENV("SM_HOSTS=[\"algo-1\",\"algo-2\"", "SM_CURRENT_HOST=algo-1"),
                 "is not a JSON list", NULL);
    expect_error(ENV("SM_HOSTS=[\"algo-1\",\"algo-1\"]", "SM_CURRENT_HOST=algo-1"),
                 "lists 'algo-1' twice", NULL);
    expect_error(ENV("SM_HOSTS=[]", "SM_CURRENT_HOST=algo-1"), "lists no host", NULL);
    expect_error(ENV("SM_HOSTS=[\"algo-1\"]"), "SM_CURRENT_HOST is not set", NULL);
}

static void test_none_and_order(void) {
    td_launch_detected d;
    /* nothing there, or torchrun-style variables only: no scheduler */
    ASSERT_OK(
        td_launch_detect(ENV("PATH=/bin", "MASTER_ADDR=10.0.0.1", "WORLD_SIZE=2", "RANK=1"), &d));
    ASSERT(d.scheduler == NULL);
    ASSERT_OK(td_launch_detect(NULL, &d));
    ASSERT(d.scheduler == NULL);
    /* TANDEM_LAUNCH_DETECT=0 ignores even a broken environment */
    ASSERT_OK(td_launch_detect(
        ENV("TANDEM_LAUNCH_DETECT=0", "SLURM_JOB_ID=1", "SLURM_STEP_NUM_TASKS=8"), &d));
    ASSERT(d.scheduler == NULL);
    ASSERT_OK(td_launch_detect(ENV("TANDEM_LAUNCH_DETECT=1", SLURM_STEP2("0")), &d));
    ASSERT_STREQ(d.scheduler, "Slurm");
    ASSERT_STATUS(td_launch_detect(ENV("TANDEM_LAUNCH_DETECT=yes", SLURM_STEP2("0")), &d),
                  TD_ERR_USAGE);
    ASSERT_CONTAINS(td_error_msg(), "TANDEM_LAUNCH_DETECT='yes'");
    /* mpirun inside a Slurm allocation: the innermost launcher, Open MPI, describes us */
    ASSERT_OK(td_launch_detect(ENV(SLURM_STEP2("0"), OMPI2("1"), "MASTER_ADDR=10.0.0.5"), &d));
    ASSERT_STREQ(d.scheduler, "Open MPI");
    ASSERT_EQ(d.node_rank, 1);
}

static void test_apply(void) {
    td_launch_detected d;
    td_launch_options o;
    ASSERT_OK(td_launch_detect(ENV(SLURM_STEP2("1")), &d));
    td_launch_options_init(&o);
    o.nproc_per_node = 4;
    td_launch_detected_apply(&d, &o);
    ASSERT_EQ(o.min_nodes, 2);
    ASSERT_EQ(o.max_nodes, 2);
    ASSERT_EQ(o.node_rank, 1);
    ASSERT(!o.standalone);
    ASSERT_STREQ(o.rdzv_endpoint, "tdnode1:23456");
    ASSERT_STREQ(o.rdzv_id, "slurm-123456.0");
    ASSERT_EQ(o.nproc_per_node, 4); /* the flag's, not the scheduler's */
    /* --rdzv-id wins over the detected id */
    td_launch_options_init(&o);
    o.rdzv_id = "mine";
    td_launch_detected_apply(&d, &o);
    ASSERT_STREQ(o.rdzv_id, "mine");
    /* one node: standalone, no endpoint */
    ASSERT_OK(td_launch_detect(ENV("SLURM_JOB_ID=77", "SLURM_JOB_NUM_NODES=1"), &d));
    td_launch_options_init(&o);
    td_launch_detected_apply(&d, &o);
    ASSERT(o.standalone);
    ASSERT(o.rdzv_endpoint == NULL);
    ASSERT_EQ(o.max_nodes, 1);
    /* nothing detected: nothing changed */
    ASSERT_OK(td_launch_detect(ENV("PATH=/bin"), &d));
    td_launch_options_init(&o);
    td_launch_detected_apply(&d, &o);
    ASSERT(o.rdzv_id == NULL && o.rdzv_endpoint == NULL && !o.standalone && o.node_rank == -1);
}

int main(void) {
    test_hostlists();
    test_slurm();
    test_openmpi();
    test_dstack();
    test_skypilot();
    test_sagemaker();
    test_none_and_order();
    test_apply();
    TEST_PASS();
}
