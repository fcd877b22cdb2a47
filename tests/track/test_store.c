/* track: runs table (ids, prefixes, transitions, stale supervisors) and many processes writing
 * metrics at once: direct inserts and concurrent ingesters tailing the same growing files. No
 * point may be lost or stored twice. */
#include "test.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/track.h"

#define NPROC 4

static char tmpdir[] = "/tmp/tandem-test-store-XXXXXX";

static void wait_children(pid_t *pids, int n) {
    for (int i = 0; i < n; i++) {
        int status = 0;
        ASSERT_EQ(waitpid(pids[i], &status, 0), pids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            TEST_FAIL("child %d (pid %d) failed: status 0x%x", i, (int)pids[i], status);
    }
}

/* Every (rank, step) in [0, nrank) x [0, nstep) exactly once for key. */
static void assert_exactly_once(td_rundb *store, const char *run, const char *key, int nrank,
                                int nstep) {
    td_metric_row *rows;
    size_t n;
    ASSERT_OK(td_metrics_query(store, run, key, -1, &rows, &n));
    ASSERT_EQ(n, (size_t)nrank * (size_t)nstep);
    /* ordered by rank then step: position i must be rank i / nstep, step i % nstep */
    for (size_t i = 0; i < n; i++) {
        if (rows[i].rank != (int)(i / (size_t)nstep) ||
            rows[i].step != (int64_t)(i % (size_t)nstep))
            TEST_FAIL("%s row %zu: rank %d step %lld, expected rank %zu step %zu", key, i,
                      rows[i].rank, (long long)rows[i].step, i / (size_t)nstep, i % (size_t)nstep);
        ASSERT_NEAR(rows[i].value, rows[i].rank * 100000.0 + (double)rows[i].step, 0);
    }
    td_metric_rows_free(rows, n);
}

static void test_runs(td_rundb *store) {
    td_run a, b, c, r;
    td_run_spec spec = {.workflow = "demo",
                        .command = "echo hi",
                        .params_json = "{\"lr\": 0.1}",
                        .nodes = 1,
                        .nproc_per_node = 2};
    ASSERT_OK(td_run_create(store, &spec, &a));
    ASSERT_STREQ(a.id, "demo-1");
    ASSERT_EQ(a.status, TD_RUN_PENDING);
    ASSERT_EQ(a.nproc_per_node, 2);
    ASSERT_STREQ(a.code_version, "none"); /* /tmp is not a git checkout */
    ASSERT_CONTAINS(a.run_dir, "/.tandem/runs/demo-1");
    char *logs = td_xasprintf("%s/logs", a.run_dir);
    ASSERT_EQ(access(logs, F_OK), 0);
    free(logs);
    td_run_spec spec2 = {.workflow = "demo",
                         .command = "echo 2",
                         .params_json = NULL,
                         .nodes = 1,
                         .nproc_per_node = 1};
    ASSERT_OK(td_run_create(store, &spec2, &b));
    ASSERT_STREQ(b.id, "demo-2");
    td_run_spec spec3 = {.workflow = "my flow",
                         .command = "echo 3",
                         .params_json = NULL,
                         .nodes = 1,
                         .nproc_per_node = 1};
    ASSERT_OK(td_run_create(store, &spec3, &c));
    ASSERT_STREQ(c.id, "my_flow-1");

    /* exact id, unique prefix, ambiguous prefix, unknown */
    ASSERT_OK(td_run_find(store, "demo-1", &r));
    ASSERT_STREQ(r.id, "demo-1");
    td_run_clear(&r);
    ASSERT_OK(td_run_find(store, "my", &r));
    ASSERT_STREQ(r.id, "my_flow-1");
    td_run_clear(&r);
    ASSERT_STATUS(td_run_find(store, "demo", &r), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "ambiguous");
    ASSERT_CONTAINS(td_error_msg(), "demo-1, demo-2");
    ASSERT_STATUS(td_run_find(store, "nope", &r), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "my_flow-1");

    /* transitions stamp times; a final status stamps ended and keeps the exit code */
    ASSERT_OK(td_run_set_status(store, a.id, TD_RUN_RUNNING, -2, NULL));
    ASSERT_OK(td_run_find(store, a.id, &r));
    ASSERT_EQ(r.status, TD_RUN_RUNNING);
    ASSERT(r.started_s > 0);
    ASSERT(r.ended_s == 0);
    ASSERT_EQ(r.exit_code, -1);
    td_run_clear(&r);
    ASSERT_OK(td_run_set_status(store, a.id, TD_RUN_FAILED, 3, "exit 3"));
    ASSERT_OK(td_run_find(store, a.id, &r));
    ASSERT_EQ(r.status, TD_RUN_FAILED);
    ASSERT_EQ(r.exit_code, 3);
    ASSERT(r.ended_s >= r.started_s);
    ASSERT_STREQ(r.note, "exit 3");
    td_run_clear(&r);
    ASSERT_STATUS(td_run_set_status(store, "zzz", TD_RUN_FAILED, 1, NULL), TD_ERR_NOTFOUND);

    /* a running run whose supervisor is dead is reaped as failed; a live one is left alone */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    ASSERT_OK(td_run_set_supervisor(store, b.id, child));
    ASSERT_OK(td_run_set_status(store, b.id, TD_RUN_RUNNING, -2, NULL));
    ASSERT_OK(td_run_find(store, b.id, &r));
    ASSERT_OK(td_run_reap_stale(store, &r));
    ASSERT_EQ(r.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(r.note, "supervisor");
    td_run_clear(&r);

    td_run *runs;
    size_t n;
    ASSERT_OK(td_run_list(store, 1, &runs, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STREQ(runs[0].id, "demo-1");
    ASSERT_STREQ(runs[2].id, "my_flow-1");
    td_runs_free(runs, n);
    td_run_clear(&a);
    td_run_clear(&b);
    td_run_clear(&c);
}

/* 4 processes insert 2,000 points each in 100 small transactions, all at once. */
static void test_concurrent_inserts(td_rundb *store, const char *run) {
    enum { NSTEP = 2000, BATCH = 20 };
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        ASSERT(pids[p] >= 0);
        if (pids[p] == 0) {
            td_rundb *s;
            if (td_rundb_open(tmpdir, &s) != TD_OK) _exit(10);
            td_metric_point pts[BATCH];
            for (int base = 0; base < NSTEP; base += BATCH) {
                for (int i = 0; i < BATCH; i++)
                    pts[i] = (td_metric_point){p, "direct", base + i, p * 100000.0 + base + i, 0};
                if (td_metrics_insert(s, run, pts, BATCH) != TD_OK) {
                    td_error_print(TD_ERR_IO);
                    _exit(11);
                }
            }
            td_rundb_close(s);
            _exit(0);
        }
    }
    wait_children(pids, NPROC);
    assert_exactly_once(store, run, "direct", NPROC, NSTEP);
}

/* One writer appends to 4 rank files (sometimes half a line at a time) while 4 ingester
 * processes poll the same directory; afterwards every point is stored exactly once. */
static void test_concurrent_ingest(td_rundb *store, const char *run, const char *metrics_dir) {
    enum { NSTEP = 3000 };
    pid_t writer = fork();
    ASSERT(writer >= 0);
    if (writer == 0) {
        int fds[NPROC];
        for (int r = 0; r < NPROC; r++) {
            char *path = td_xasprintf("%s/rank-%d.jsonl", metrics_dir, r);
            fds[r] = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            free(path);
            if (fds[r] < 0) _exit(20);
        }
        for (int step = 0; step < NSTEP; step++)
            for (int r = 0; r < NPROC; r++) {
                char line[128];
                int n = snprintf(line, sizeof line, "{\"step\": %d, \"tailed\": %.1f}\n", step,
                                 r * 100000.0 + step);
                int cut = (step % 97 == 0) ? n / 2 : n;
                if (write(fds[r], line, (size_t)cut) != cut) _exit(21);
                if (cut < n) {
                    usleep(2000); /* let an ingester see the partial line */
                    if (write(fds[r], line + cut, (size_t)(n - cut)) != n - cut) _exit(22);
                }
            }
        _exit(0);
    }
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        ASSERT(pids[p] >= 0);
        if (pids[p] == 0) {
            td_rundb *s;
            td_ingester *ing;
            if (td_rundb_open(tmpdir, &s) != TD_OK) _exit(30);
            if (td_ingester_new(s, run, metrics_dir, &ing) != TD_OK) _exit(31);
            for (int i = 0; i < 400; i++) {
                if (td_ingester_poll(ing, NULL) != TD_OK) {
                    td_error_print(TD_ERR_IO);
                    _exit(32);
                }
                if (kill(writer, 0) != 0) break; /* writer reaped? (zombie still answers) */
                usleep(3000);
            }
            td_ingester_free(ing);
            td_rundb_close(s);
            _exit(0);
        }
    }
    int status;
    ASSERT_EQ(waitpid(writer, &status, 0), writer);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    wait_children(pids, NPROC);
    /* the ingesters may have stopped before the last bytes: one more poll drains the rest */
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run, metrics_dir, &ing));
    ASSERT_OK(td_ingester_poll(ing, NULL));
    ASSERT_EQ(td_ingester_malformed(ing), 0);
    td_ingester_free(ing);
    assert_exactly_once(store, run, "tailed", NPROC, NSTEP);
}

/* Issue 8: with runs.db deleted mid-project, the next run took the id tiny-1 and its directory
 * again, appending to the old logs and mixing checkpoints. A run directory is never reused. */
static void test_index_lost(void) {
    char dir[] = "/tmp/tandem-index-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    td_rundb *s;
    td_run a, b;
    td_run_spec spec = {.workflow = "tiny",
                        .command = "true",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = 1};
    ASSERT_OK(td_rundb_open(dir, &s));
    ASSERT_OK(td_run_create(s, &spec, &a));
    ASSERT_STREQ(a.id, "tiny-1");
    char *marker = td_xasprintf("%s/logs/rank-0.log", a.run_dir);
    FILE *f = fopen(marker, "w");
    ASSERT(f != NULL);
    fputs("the first run's log\n", f);
    fclose(f);
    td_rundb_close(s);
    char *rm = td_xasprintf("rm -f '%s'/.tandem/runs.db*", dir);
    ASSERT_EQ(system(rm), 0);
    ASSERT_OK(td_rundb_open(dir, &s));
    ASSERT_OK(td_run_create(s, &spec, &b));
    ASSERT_STREQ(b.id, "tiny-2"); /* tiny-1's directory is still there: skipped */
    f = fopen(marker, "r");
    char line[64] = "";
    ASSERT(f != NULL && fgets(line, sizeof line, f));
    fclose(f);
    ASSERT_STREQ(line, "the first run's log\n");
    td_run_clear(&a);
    td_run_clear(&b);
    td_rundb_close(s);
    free(marker);
    free(rm);
    rm = td_xasprintf("rm -rf '%s'", dir);
    ASSERT_EQ(system(rm), 0);
    free(rm);
}

int main(void) {
    test_index_lost();
    ASSERT(mkdtemp(tmpdir) != NULL);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    test_runs(store);

    td_run run;
    td_run_spec spec = {.workflow = "conc",
                        .command = "true",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = NPROC};
    ASSERT_OK(td_run_create(store, &spec, &run));
    test_concurrent_inserts(store, run.id);
    char *metrics_dir = td_xasprintf("%s/metrics", run.run_dir);
    test_concurrent_ingest(store, run.id, metrics_dir);
    int64_t total;
    ASSERT_OK(td_metrics_count(store, run.id, &total));
    ASSERT_EQ(total, NPROC * 2000 + NPROC * 3000);
    free(metrics_dir);
    td_run_clear(&run);
    td_rundb_close(store);
    char *cmd = td_xasprintf("rm -rf '%s'", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
