/* track: GPU metrics through NVML. The attribution of NVML's process list to ranks' process
 * subtrees on a made-up snapshot; the run-time loader (on a machine without libnvidia-ml: off, with
 * a reason, the same answer from every thread); and sysmon sampling with or without it. */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../src/track/nvml.h"
#include "tandem/track.h"

#define MIB (1024ULL * 1024ULL)

static void test_attribute(void) {
    /* Devices 0..3: 40% busy, 90% busy, utilisation unknown (e.g. MIG), idle. */
    int util[] = {40, 90, -1, 0};
    td_nvml_proc procs[] = {
        {100, 0, 1024 * MIB},          /* rank 0's worker */
        {101, 0, 512 * MIB},           /* its child (a data loader) on the same device */
        {100, 3, 256 * MIB},           /* rank 0's worker again, on a second device */
        {200, 1, 2048 * MIB},          /* rank 1 */
        {201, 2, TD_NVML_MEM_UNKNOWN}, /* rank 1, memory unknown, device util unknown */
        {300, 1, 4096 * MIB},          /* someone else's process: ignored */
        {400, 2, TD_NVML_MEM_UNKNOWN}, /* rank 2: on a GPU, nothing known about it */
        {500, 7, 100 * MIB},           /* rank 5 on a device index NVML did not list */
        {600, 0, 64 * MIB},            /* rank 9: outside use[] */
    };
    td_nvml_snapshot snap = {4, util, procs, sizeof procs / sizeof procs[0]};
    pid_t pids[] = {100, 101, 102, 200, 201, 400, 450, 500, 600};
    int ranks[] = {0, 0, 0, 1, 1, 2, 3, 5, 9};
    td_nvml_rank_use use[8];
    for (int r = 0; r < 8; r++) use[r] = (td_nvml_rank_use){7, 7, 7.0, 7.0}; /* overwritten */
    td_nvml_attribute(&snap, pids, ranks, sizeof pids / sizeof pids[0], use, 8);

    ASSERT_EQ(use[0].on_gpu, 1);
    ASSERT_EQ(use[0].mem_known, 1);
    ASSERT_NEAR(use[0].mem_mb, 1024 + 512 + 256, 0);
    ASSERT_NEAR(use[0].util, 40, 0); /* max(40, 0) */

    ASSERT_EQ(use[1].on_gpu, 1);
    ASSERT_EQ(use[1].mem_known, 1);
    ASSERT_NEAR(use[1].mem_mb, 2048, 0); /* the unknown one adds nothing */
    ASSERT_NEAR(use[1].util, 90, 0);

    ASSERT_EQ(use[2].on_gpu, 1);
    ASSERT_EQ(use[2].mem_known, 0);
    ASSERT_NEAR(use[2].mem_mb, 0, 0);
    ASSERT_NEAR(use[2].util, -1, 0);

    /* rank 3: a worker with no GPU context; ranks 4, 6, 7: no workers at all */
    for (int r = 3; r < 8; r++) {
        if (r == 5) continue;
        ASSERT_EQ(use[r].on_gpu, 0);
        ASSERT_EQ(use[r].mem_known, 0);
        ASSERT_NEAR(use[r].mem_mb, 0, 0);
        ASSERT_NEAR(use[r].util, -1, 0);
    }

    ASSERT_EQ(use[5].on_gpu, 1);
    ASSERT_NEAR(use[5].mem_mb, 100, 0);
    ASSERT_NEAR(use[5].util, -1, 0); /* no utilisation for a device not in util[] */

    /* Nothing on the GPUs, or no workers: all off. */
    td_nvml_snapshot empty = {4, util, NULL, 0};
    td_nvml_attribute(&empty, pids, ranks, sizeof pids / sizeof pids[0], use, 8);
    for (int r = 0; r < 8; r++) ASSERT_EQ(use[r].on_gpu, 0);
    td_nvml_attribute(&snap, NULL, NULL, 0, use, 8);
    for (int r = 0; r < 8; r++) ASSERT_EQ(use[r].on_gpu, 0);
}

#define NTHREADS 8

struct probe {
    int available;
    const char *reason;
};

static void *probe_thread(void *arg) {
    struct probe *p = arg;
    p->available = td_nvml_available(&p->reason);
    return NULL;
}

/* Returns whether NVML is on here. */
static int test_loader(void) {
    pthread_t th[NTHREADS];
    struct probe probes[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, probe_thread, &probes[i]), 0);
    for (int i = 0; i < NTHREADS; i++) ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 1; i < NTHREADS; i++) {
        ASSERT_EQ(probes[i].available, probes[0].available);
        ASSERT(probes[i].reason == probes[0].reason); /* loaded once: one answer */
    }
    const char *reason = "unset";
    int on = td_nvml_available(&reason);
    ASSERT_EQ(on, probes[0].available);
    td_nvml_snapshot snap;
    if (!on) {
        ASSERT(reason != NULL && reason[0] != '\0');
        printf("NVML unavailable here: %s\n", reason);
        td_nvml_snapshot_free(NULL);
        ASSERT_STATUS(td_nvml_snapshot_take(&snap), TD_ERR_UNSUPPORTED);
        ASSERT_CONTAINS(td_error_msg(), reason);
        td_error_clear();
        ASSERT_EQ(snap.ndevices, 0);
        ASSERT_EQ(snap.nprocs, 0);
        td_nvml_snapshot_free(&snap);
        return 0;
    }
    ASSERT(reason == NULL);
    ASSERT_OK(td_nvml_snapshot_take(&snap));
    ASSERT_GT(snap.ndevices, 0);
    printf("NVML: %d device(s), %zu compute process(es)\n", snap.ndevices, snap.nprocs);
    for (int d = 0; d < snap.ndevices; d++) ASSERT(snap.util[d] >= -1 && snap.util[d] <= 100);
    for (size_t i = 0; i < snap.nprocs; i++) {
        ASSERT(snap.procs[i].device >= 0 && snap.procs[i].device < snap.ndevices);
        printf("  pid %u on device %d: %llu bytes\n", snap.procs[i].pid, snap.procs[i].device,
               snap.procs[i].used_bytes);
    }
    td_nvml_snapshot_free(&snap);
    return 1;
}

/* sysmon still samples CPU and RSS; without NVML it writes no GPU key. */
static void test_sysmon(void) {
    char tmpdir[] = "/tmp/tandem-test-nvml-XXXXXX";
    ASSERT(mkdtemp(tmpdir) != NULL);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    td_run run;
    td_run_spec spec = {
        .workflow = "gpu", .command = "true", .params_json = NULL, .nodes = 1, .nproc_per_node = 1};
    ASSERT_OK(td_run_create(store, &spec, &run));
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        char *argv[] = {"sh", "-c", "while :; do :; done", NULL};
        char *envp[] = {"RANK=0", "PATH=/usr/bin:/bin", NULL};
        execve("/bin/sh", argv, envp);
        _exit(127);
    }
    usleep(200000);
    td_sysmon *mon = td_sysmon_new();
    ASSERT_OK(td_sysmon_sample(mon, store, &run, getpid(), NULL));
    usleep(200000);
    ASSERT_OK(td_sysmon_sample(mon, store, &run, getpid(), NULL));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    td_sysmon_free(mon);
    td_metric_row *rows;
    size_t n;
    ASSERT_OK(td_metrics_query(store, run.id, "sys/cpu_percent", 0, &rows, &n));
    ASSERT_EQ(n, 2);
    td_metric_rows_free(rows, n);
    ASSERT_OK(td_metrics_query(store, run.id, "sys/rss_mb", 0, &rows, &n));
    ASSERT_EQ(n, 2);
    td_metric_rows_free(rows, n);
    /* A shell loop holds no GPU context, with NVML or without: no GPU keys. */
    ASSERT_OK(td_metrics_query(store, run.id, "sys/gpu_mem_mb", -1, &rows, &n));
    ASSERT_EQ(n, 0);
    td_metric_rows_free(rows, n);
    ASSERT_OK(td_metrics_query(store, run.id, "sys/gpu_util_percent", -1, &rows, &n));
    ASSERT_EQ(n, 0);
    td_metric_rows_free(rows, n);
    td_run_clear(&run);
    td_rundb_close(store);
    char *cmd = td_xasprintf("rm -rf '%s'", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
}

int main(void) {
    test_attribute();
    test_loader();
    test_sysmon();
    TEST_PASS();
}
