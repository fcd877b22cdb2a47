/* track: the metrics line format end to end (sink -> file -> ingester -> store): both line
 * shapes, resume events cutting history back, malformed lines skipped and counted, partial lines
 * waiting, restart from stored offsets without duplicates; system metrics of a RANK=0 child;
 * artifacts with their sha256; code versions inside and outside git; the run's last sign of
 * life (the silent state) as the ingest records it, against the files' own modification times. */
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/track.h"

static char tmpdir[] = "/tmp/tandem-test-ingest-XXXXXX";

static void append(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* The steps stored for (key, rank), as a comma-separated string. */
static char *steps_of(td_rundb *store, const char *run, const char *key, int rank) {
    td_metric_row *rows;
    size_t n;
    ASSERT_OK(td_metrics_query(store, run, key, rank, &rows, &n));
    char *out = td_xcalloc(n * 24 + 1, 1);
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        used += (size_t)sprintf(out + used, "%s%lld", i ? "," : "", (long long)rows[i].step);
    td_metric_rows_free(rows, n);
    return out;
}

#define ASSERT_STEPS(store, run, key, rank, expected)                                              \
    do {                                                                                           \
        char *s_ = steps_of(store, run, key, rank);                                                \
        ASSERT_STREQ(s_, expected);                                                                \
        free(s_);                                                                                  \
    } while (0)

static void test_lines(td_rundb *store, const td_run *run) {
    char *dir = td_xasprintf("%s/metrics", run->run_dir);
    char *f0 = td_xasprintf("%s/rank-0.jsonl", dir);
    char *f1 = td_xasprintf("%s/rank-1.jsonl", dir);
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run->id, dir, &ing));
    size_t n = 99;
    ASSERT_OK(td_ingester_poll(ing, &n)); /* no files yet */
    ASSERT_EQ(n, 0);

    /* The sink writes lines the ingester reads: multi-key, single key, non-finite as null. */
    td_metrics_sink *sink;
    ASSERT_OK(td_metrics_sink_open(f0, &sink));
    const char *keys[] = {"loss", "acc"};
    double vals[] = {2.5, 0.125};
    for (int step = 1; step <= 5; step++) {
        vals[0] = 3.0 - step * 0.25;
        ASSERT_OK(td_metrics_sink_log(sink, step, 2, keys, vals));
    }
    ASSERT_OK(td_metrics_sink_log1(sink, 6, "weird \"key\"", 1.0 / 0.0));
    td_metrics_sink_close(sink);
    /* a NULL sink (no TANDEM_METRICS) is a no-op */
    unsetenv("TANDEM_METRICS");
    ASSERT_OK(td_metrics_sink_open(NULL, &sink));
    ASSERT(sink == NULL);
    ASSERT_OK(td_metrics_sink_log1(sink, 1, "loss", 1.0));

    /* rank 1: the key/value shape, a malformed line, a non-object, a blank line, a bad step,
     * and a partial last line that must wait */
    append(f1, "{\"key\": \"loss\", \"value\": 0.5, \"step\": 1, \"time\": 1000.5}\n"
               "{\"loss\": oops}\n"
               "[1, 2]\n"
               "\n"
               "{\"step\": \"ten\", \"loss\": 1}\n"
               "{\"step\": 2, \"loss\": 0.4}\n"
               "{\"step\": 3, \"lo");
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(n, 5 * 2 + 2); /* rank 0: 10 points (the null value is skipped); rank 1: 2 */
    ASSERT_EQ(td_ingester_malformed(ing), 3);
    ASSERT_STEPS(store, run->id, "loss", 0, "1,2,3,4,5");
    ASSERT_STEPS(store, run->id, "acc", 0, "1,2,3,4,5");
    ASSERT_STEPS(store, run->id, "loss", 1, "1,2");
    td_metric_row *rows;
    size_t nrows;
    ASSERT_OK(td_metrics_query(store, run->id, "loss", 1, &rows, &nrows));
    ASSERT_NEAR(rows[0].time_s, 1000.5, 0);
    ASSERT_NEAR(rows[1].value, 0.4, 1e-12);
    td_metric_rows_free(rows, nrows);
    ASSERT_OK(td_metrics_query(store, run->id, "loss", 0, &rows, &nrows));
    ASSERT_NEAR(rows[4].value, 1.75, 1e-9);
    td_metric_rows_free(rows, nrows);

    /* the partial line completes; nothing is read twice */
    append(f1, "ss\": 0.3}\n");
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STEPS(store, run->id, "loss", 1, "1,2,3");

    /* A restarted ingester (new store handle too) continues from the stored offsets. */
    td_ingester_free(ing);
    td_rundb *store2;
    ASSERT_OK(td_rundb_open(tmpdir, &store2));
    ASSERT_OK(td_ingester_new(store2, run->id, dir, &ing));
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(n, 0);
    append(f1, "{\"step\": 4, \"loss\": 0.2}\n{\"step\": 5, \"loss\": 0.1}\n");
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(n, 2);
    ASSERT_STEPS(store, run->id, "loss", 1, "1,2,3,4,5");

    /* A resume from the checkpoint at step 3 drops rank 1's steps 4 and 5 (not rank 0's, not
     * system metrics); the rewritten steps then appear once each. */
    td_metric_point sys = {1, "sys/rss_mb", 9, 100.0, 0};
    ASSERT_OK(td_metrics_insert(store, run->id, &sys, 1));
    ASSERT_OK(td_metrics_sink_open(f1, &sink));
    ASSERT_OK(td_metrics_sink_resume(sink, 3));
    ASSERT_OK(td_metrics_sink_log1(sink, 4, "loss", 0.25));
    td_metrics_sink_close(sink);
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_STEPS(store, run->id, "loss", 1, "1,2,3,4");
    ASSERT_STEPS(store, run->id, "loss", 0, "1,2,3,4,5");
    ASSERT_STEPS(store, run->id, "sys/rss_mb", 1, "9");
    ASSERT_OK(td_metrics_query(store, run->id, "loss", 1, &rows, &nrows));
    ASSERT_NEAR(rows[3].value, 0.25, 1e-12);
    td_metric_rows_free(rows, nrows);

    /* last values: highest step per key, rank 0 first on ties */
    ASSERT_OK(td_metrics_last(store, run->id, &rows, &nrows));
    int saw_loss = 0;
    for (size_t i = 0; i < nrows; i++)
        if (!strcmp(rows[i].key, "loss")) {
            saw_loss = 1;
            ASSERT_EQ(rows[i].step, 5);
            ASSERT_EQ(rows[i].rank, 0);
        }
    ASSERT(saw_loss);
    td_metric_rows_free(rows, nrows);
    td_ingester_free(ing);
    td_rundb_close(store2);
    free(dir);
    free(f0);
    free(f1);
}

static void test_sysmon(td_rundb *store, const td_run *run) {
    /* a "worker": a child with RANK=3 burning CPU, under this process */
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        char *argv[] = {"sh", "-c", "while :; do :; done", NULL};
        char *envp[] = {"RANK=3", "TANDEM_RESTART_COUNT=2", "PATH=/usr/bin:/bin", NULL};
        execve("/bin/sh", argv, envp);
        _exit(127);
    }
    usleep(300000);
    td_sysmon *mon = td_sysmon_new();
    int restarts = -5;
    ASSERT_OK(td_sysmon_sample(mon, store, run, getpid(), &restarts));
    usleep(300000);
    ASSERT_OK(td_sysmon_sample(mon, store, run, getpid(), &restarts));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    td_sysmon_free(mon);
    ASSERT_EQ(restarts, 2);
    td_metric_row *rows;
    size_t n;
    ASSERT_OK(td_metrics_query(store, run->id, "sys/cpu_percent", 3, &rows, &n));
    ASSERT_EQ(n, 2);
    /* A busy loop: well above an idle process's ~0%, at most two cores. The lower bound is low
     * on purpose: under a loaded ctest -j2 the loop may get only a small share of a core. */
    ASSERT(rows[1].value > 1.0 && rows[1].value < 250.0);
    td_metric_rows_free(rows, n);
    ASSERT_OK(td_metrics_query(store, run->id, "sys/rss_mb", 3, &rows, &n));
    ASSERT_EQ(n, 2);
    ASSERT(rows[0].value > 0.1 && rows[0].value < 100.0);
    td_metric_rows_free(rows, n);
}

/* Sets path's modification time to t (whole seconds): the reference the store must agree with. */
static void set_mtime(const char *path, double t) {
    struct timespec ts[2] = {{(time_t)t, 0}, {(time_t)t, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static double mtime_of(const char *path) {
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    return (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec * 1e-9;
}

static double stored_activity(td_rundb *store, const char *id) {
    td_run r;
    ASSERT_OK(td_run_find(store, id, &r));
    double t = td_run_last_activity(&r);
    td_run_clear(&r);
    return t;
}

/* td_run_last_activity comes from the store (what the ingest recorded), not the files: the
 * system samples do not count, a worker's metrics line and a worker's log do, setup.log does not,
 * and a file changed after the last poll is not seen until the next. */
static void test_activity(td_rundb *store) {
    td_run run;
    td_run_spec spec = {.workflow = "act", .command = "true", .nodes = 1, .nproc_per_node = 1};
    ASSERT_OK(td_run_create(store, &spec, &run));
    ASSERT_OK(td_run_set_status(store, run.id, TD_RUN_RUNNING, -2, NULL));
    td_run_clear(&run);
    ASSERT_OK(td_run_find(store, "act-1", &run));
    double start = run.started_s;
    ASSERT(start > 0);
    ASSERT_NEAR(td_run_last_activity(&run), start, 1e-6); /* nothing seen yet: the start */
    char *metrics = td_run_path(run.run_dir, TD_RUN_PATH_METRICS);
    char *logs = td_run_path(run.run_dir, TD_RUN_PATH_LOGS);
    char *sys = td_xasprintf("%s/sys.jsonl", metrics);
    char *rank0 = td_xasprintf("%s/rank-0.jsonl", metrics);
    char *log0 = td_xasprintf("%s/rank-0.log", logs);
    char *setup = td_xasprintf("%s/setup.log", logs);
    ASSERT_EQ(mkdir(metrics, 0755) == 0 || errno == EEXIST, 1);
    ASSERT_EQ(mkdir(logs, 0755) == 0 || errno == EEXIST, 1);
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run.id, metrics, &ing));

    append(sys, "{\"rank\": 0, \"time\": 1.0, \"sys/cpu_percent\": 5}\n");
    set_mtime(sys, start + 100);
    append(setup, "pip install\n");
    set_mtime(setup, start + 200);
    ASSERT_OK(td_ingester_poll(ing, NULL));
    int64_t npoints = 0;
    ASSERT_OK(td_metrics_count(store, run.id, &npoints));
    ASSERT_EQ(npoints, 1);
    ASSERT_NEAR(stored_activity(store, run.id), start, 1e-6); /* system samples, setup: no sign */

    append(rank0, "{\"step\": 1, \"loss\": 0.5}\n");
    set_mtime(rank0, start + 50);
    /* Not polled yet: the store does not know. */
    ASSERT_NEAR(stored_activity(store, run.id), start, 1e-6);
    ASSERT_OK(td_ingester_poll(ing, NULL));
    ASSERT_NEAR(stored_activity(store, run.id), mtime_of(rank0), 1e-6);

    append(log0, "epoch 1\n");
    set_mtime(log0, start + 80);
    ASSERT_OK(td_ingester_poll(ing, NULL));
    ASSERT_NEAR(stored_activity(store, run.id), mtime_of(log0), 1e-6);

    td_ingester_free(ing);
    free(metrics);
    free(logs);
    free(sys);
    free(rank0);
    free(log0);
    free(setup);
    td_run_clear(&run);
}

static void test_artifacts(td_rundb *store, const td_run *run) {
    char *work = td_xasprintf("%s/work", tmpdir);
    char *cmd = td_xasprintf("mkdir -p %s/out/sub && printf abc > %s/out/a.txt && "
                             "printf xyz > %s/out/sub/b.bin && printf q > %s/model.st",
                             work, work, work, work);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    const char *pats[] = {"out", "*.st", "missing-*.txt"};
    size_t copied = 0;
    ASSERT_OK(td_artifacts_collect(store, run, work, pats, 3, &copied));
    ASSERT_EQ(copied, 3);
    td_artifact *arts;
    size_t n;
    ASSERT_OK(td_artifacts_list(store, run->id, &arts, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STREQ(arts[0].name, "model.st");
    ASSERT_STREQ(arts[1].name, "out/a.txt");
    ASSERT_STREQ(arts[2].name, "out/sub/b.bin");
    /* SHA-256("abc"), the FIPS 180-2 example */
    ASSERT_STREQ(arts[1].sha256,
                 "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ASSERT_EQ(arts[1].size_bytes, 3);
    ASSERT_CONTAINS(arts[1].path, "/artifacts/out/a.txt");
    char sha[65];
    ASSERT_OK(td_sha256_file(arts[2].path, sha));
    ASSERT_STREQ(sha, arts[2].sha256);
    td_artifacts_free(arts, n);
    free(work);
}

static void test_code_version(void) {
    char *repo = td_xasprintf("%s/repo", tmpdir);
    char *cmd =
        td_xasprintf("mkdir -p %s && cd %s && git init -q . && printf 'a\\n' > f && git add f && "
                     "git -c user.name=t -c user.email=t@t commit -qm init",
                     repo, repo);
    if (system(cmd) != 0) {
        printf("git unavailable; code version inside git not checked\n");
        free(cmd);
        free(repo);
        return;
    }
    free(cmd);
    char *v = td_code_version(repo);
    ASSERT_EQ(strlen(v), 40);
    ASSERT(strchr(v, '+') == NULL);
    char *dirty = td_xasprintf("printf 'b\\n' >> %s/f", repo);
    ASSERT_EQ(system(dirty), 0);
    char *v2 = td_code_version(repo);
    ASSERT_EQ(strncmp(v, v2, 40), 0);
    ASSERT_CONTAINS(v2, "+dirty.");
    ASSERT_EQ(strlen(v2), 40 + 7 + 64);
    free(v);
    free(v2);
    free(dirty);
    free(repo);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir) != NULL);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    td_run run;
    td_run_spec spec = {
        .workflow = "ing", .command = "true", .params_json = NULL, .nodes = 1, .nproc_per_node = 2};
    ASSERT_OK(td_run_create(store, &spec, &run));
    test_lines(store, &run);
    test_sysmon(store, &run);
    test_artifacts(store, &run);
    test_activity(store);
    test_code_version();
    td_run_clear(&run);
    td_rundb_close(store);
    char *cmd = td_xasprintf("rm -rf '%s'", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
