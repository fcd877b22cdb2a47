/* track: run directories describe their runs (run.json) and the index is rebuilt from them
 * (issue 8). Each row change rewrites run.json; after runs.db is deleted, td_rundb_rebuild and
 * the automatic rebuild on open bring back every run with its status, params, note, metrics,
 * artifacts (SHA-256) and logs; a directory without run.json is recovered and marked; a run that
 * was running with its supervisor gone ends up failed; a run whose end is only in run.json takes
 * it from there; an open store follows runs.db being replaced under it; numbering continues. */
#include "test.h"
#include "track_test.h"

#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/os.h"
#include "tandem/track.h"

static char tmpdir[] = "/tmp/tandem-test-rebuild-XXXXXX";

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) TEST_FAIL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static json_t *load_run_json(const td_run *run) {
    char *path = td_xasprintf("%s/run.json", run->run_dir);
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr);
    if (!o) TEST_FAIL("%s: %s", path, jerr.text);
    free(path);
    return o;
}

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A pid that surely belongs to no process now. */
static pid_t dead_pid(void) {
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    return child;
}

typedef struct {
    int restored, recovered, updated, present;
} seen_t;

static void on_run(void *arg, const td_run *run, const char *what) {
    seen_t *s = arg;
    (void)run;
    if (!strcmp(what, "restored")) s->restored++;
    if (!strcmp(what, "recovered")) s->recovered++;
    if (!strcmp(what, "updated")) s->updated++;
    if (!strcmp(what, "present") || !strcmp(what, "completed")) s->present++;
}

int main(void) {
    ASSERT(mkdtemp(tmpdir) != NULL);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));

    /* ---- a finished run with metrics, an artifact and a log ---- */
    td_run a, b;
    td_run_spec spec = {.workflow = "tiny",
                        .command = "train --lr 0.5",
                        .params_json = "{\"lr\":0.5,\"name\":\"x\"}",
                        .nodes = 1,
                        .nproc_per_node = 2};
    ASSERT_OK(td_run_create(store, &spec, &a));
    ASSERT_STREQ(a.id, "tiny-1");
    json_t *o = load_run_json(&a);
    ASSERT_STREQ(jstr(o, "id"), "tiny-1");
    ASSERT_STREQ(jstr(o, "status"), "pending");
    ASSERT_STREQ(jstr(o, "command"), "train --lr 0.5");
    ASSERT(json_is_object(json_object_get(o, "params")));
    ASSERT_EQ(json_integer_value(json_object_get(o, "nproc_per_node")), 2);
    json_decref(o);

    ASSERT_OK(td_run_set_supervisor(store, a.id, 4242));
    ASSERT_OK(td_run_set_status(store, a.id, TD_RUN_RUNNING, -1, NULL));
    ASSERT_OK(td_run_set_restarts(store, a.id, 2));
    char *p = td_xasprintf("%s/metrics/rank-0.jsonl", a.run_dir);
    write_file(p, "{\"step\": 1, \"loss\": 0.9, \"acc\": 0.1}\n{\"step\": 2, \"loss\": 0.5}\n"
                  "{\"event\": \"resume\", \"step\": 1}\n{\"step\": 2, \"loss\": 0.4}\n");
    free(p);
    p = td_xasprintf("%s/metrics/rank-1.jsonl", a.run_dir);
    write_file(p, "{\"step\": 1, \"loss\": 0.8}\n");
    free(p);
    td_ingester *ing;
    p = td_xasprintf("%s/metrics", a.run_dir);
    ASSERT_OK(td_ingester_new(store, a.id, p, &ing));
    free(p);
    ASSERT_OK(td_ingester_poll(ing, NULL));
    td_ingester_free(ing);
    int64_t points_a = track_test_points(store, a.id);
    ASSERT_EQ(points_a, 4); /* 0.9, 0.1, resumed 0.4; rank 1: 0.8 */
    char *work = td_xasprintf("%s/work", tmpdir);
    ASSERT_OK(td_mkdirs(work));
    p = td_xasprintf("%s/model.bin", work);
    write_file(p, "weights");
    free(p);
    const char *pats[] = {"model.bin"};
    size_t ncopied = 0;
    ASSERT_OK(td_artifacts_collect(store, &a, work, pats, 1, &ncopied));
    ASSERT_EQ(ncopied, 1);
    p = td_xasprintf("%s/logs/rank-0.log", a.run_dir);
    write_file(p, "hello\n");
    free(p);
    td_log_file *logs;
    size_t nlogs;
    ASSERT_OK(td_logs_scan(store, &a, &logs, &nlogs));
    td_log_files_free(logs, nlogs);
    ASSERT_OK(td_run_set_status(store, a.id, TD_RUN_SUCCEEDED, 0, "all good"));
    td_run_clear(&a);
    ASSERT_OK(td_run_find(store, "tiny-1", &a));
    o = load_run_json(&a);
    ASSERT_STREQ(jstr(o, "status"), "succeeded");
    ASSERT_STREQ(jstr(o, "note"), "all good");
    ASSERT_EQ(json_integer_value(json_object_get(o, "restarts")), 2);
    ASSERT_EQ(json_integer_value(json_object_get(o, "exit_code")), 0);
    ASSERT_EQ(json_integer_value(json_object_get(o, "supervisor_pid")), 4242);
    json_decref(o);
    td_artifact *arts;
    size_t narts;
    ASSERT_OK(td_artifacts_list(store, a.id, &arts, &narts));
    ASSERT_EQ(narts, 1);
    char sha_a[65];
    snprintf(sha_a, sizeof sha_a, "%s", arts[0].sha256);
    td_artifacts_free(arts, narts);

    /* ---- a run that was running when the index was lost; its supervisor is gone ---- */
    td_run_spec spec2 = {.workflow = "tiny",
                         .command = "sleep",
                         .params_json = NULL,
                         .nodes = 1,
                         .nproc_per_node = 1};
    ASSERT_OK(td_run_create(store, &spec2, &b));
    ASSERT_OK(td_run_set_supervisor(store, b.id, dead_pid()));
    ASSERT_OK(td_run_set_status(store, b.id, TD_RUN_RUNNING, -1, NULL));

    /* ---- a directory without run.json (from before tandem wrote one) ---- */
    char *old_dir = td_xasprintf("%s/.tandem/runs/other-wf-3", tmpdir);
    char *old_metrics = td_xasprintf("%s/metrics", old_dir);
    ASSERT_OK(td_mkdirs(old_metrics));
    p = td_xasprintf("%s/rank-1.jsonl", old_metrics);
    write_file(p, "{\"step\": 5, \"loss\": 1.5}\n");
    free(p);
    /* a third worker that logged but never wrote a metric: its log names it */
    p = td_xasprintf("%s/logs", old_dir);
    ASSERT_OK(td_mkdirs(p));
    free(p);
    p = td_xasprintf("%s/logs/rank-2.log", old_dir);
    write_file(p, "started\n");
    free(p);
    /* ---- and one whose run.json is damaged ---- */
    char *bad_dir = td_xasprintf("%s/.tandem/runs/bad-1", tmpdir);
    ASSERT_OK(td_mkdirs(bad_dir));
    p = td_xasprintf("%s/run.json", bad_dir);
    write_file(p, "{\"id\": \"bad-1\", ");
    free(p);

    /* ---- the index is lost ---- */
    td_rundb_close(store);
    track_test_remove_index(tmpdir);
    ASSERT_OK(td_rundb_open_ex(tmpdir, TD_RUNDB_NO_AUTO_REBUILD, &store));
    td_run *runs;
    size_t n;
    ASSERT_OK(td_run_list(store, 1, &runs, &n));
    ASSERT_EQ(n, 0);
    td_runs_free(runs, n);
    td_rebuild_stats st;
    seen_t seen = {0};
    ASSERT_OK(td_rundb_rebuild(store, on_run, &seen, &st));
    ASSERT_EQ(st.dirs, 4);
    ASSERT_EQ(st.restored, 2);
    ASSERT_EQ(st.recovered, 2);
    ASSERT_EQ(st.reaped, 1);
    ASSERT_EQ(st.present, 0);
    ASSERT_EQ(st.artifacts, 1);
    ASSERT_EQ(seen.restored, 2);
    ASSERT_EQ(seen.recovered, 2);

    td_run r;
    ASSERT_OK(td_run_find(store, "tiny-1", &r));
    ASSERT_EQ(r.status, TD_RUN_SUCCEEDED);
    ASSERT_EQ(r.exit_code, 0);
    ASSERT_EQ(r.restarts, 2);
    ASSERT_EQ(r.nproc_per_node, 2);
    ASSERT_STREQ(r.note, "all good");
    ASSERT_STREQ(r.params_json, "{\"lr\":0.5,\"name\":\"x\"}");
    ASSERT_STREQ(r.command, "train --lr 0.5");
    ASSERT_STREQ(r.run_dir, a.run_dir);
    ASSERT_NEAR(r.created_s, a.created_s, 1e-6);
    ASSERT_NEAR(r.ended_s, a.ended_s, 1e-6);
    ASSERT_EQ(track_test_points(store, "tiny-1"), points_a);
    td_metric_row *rows;
    size_t nrows;
    ASSERT_OK(td_metrics_query(store, "tiny-1", "loss", 0, &rows, &nrows));
    ASSERT_EQ(nrows, 2);
    ASSERT_NEAR(rows[1].value, 0.4, 1e-12); /* the resume cut applied again */
    td_metric_rows_free(rows, nrows);
    ASSERT_OK(td_artifacts_list(store, "tiny-1", &arts, &narts));
    ASSERT_EQ(narts, 1);
    ASSERT_STREQ(arts[0].name, "model.bin");
    ASSERT_STREQ(arts[0].sha256, sha_a);
    ASSERT_EQ(arts[0].size_bytes, 7);
    td_artifacts_free(arts, narts);
    ASSERT_OK(td_logs_scan(store, &r, &logs, &nlogs));
    ASSERT_EQ(nlogs, 1);
    td_log_files_free(logs, nlogs);
    td_run_clear(&r);

    ASSERT_OK(td_run_find(store, "tiny-2", &r));
    ASSERT_EQ(r.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(r.note, "supervisor");
    td_run_clear(&r);
    o = load_run_json(&b); /* the reap is in run.json too */
    ASSERT_STREQ(jstr(o, "status"), "failed");
    json_decref(o);

    ASSERT_OK(td_run_find(store, "other-wf-3", &r));
    ASSERT_STREQ(r.workflow, "other-wf");
    ASSERT_EQ(r.status, TD_RUN_FAILED);
    ASSERT_EQ(r.nproc_per_node, 3); /* rank-1.jsonl, and logs/rank-2.log */
    ASSERT_CONTAINS(r.note, "without run.json");
    ASSERT_EQ(track_test_points(store, "other-wf-3"), 1);
    td_run_clear(&r);
    ASSERT_OK(td_run_find(store, "bad-1", &r));
    ASSERT_CONTAINS(r.note, "without a readable run.json");
    td_run_clear(&r);

    /* idempotent: nothing new the second time */
    ASSERT_OK(td_rundb_rebuild(store, NULL, NULL, &st));
    ASSERT_EQ(st.present, 4);
    ASSERT_EQ(st.restored + st.recovered + st.updated, 0);
    ASSERT_EQ(st.metric_points, 0);
    ASSERT_EQ(st.artifacts, 0);
    ASSERT_EQ(track_test_points(store, "tiny-1"), points_a);

    /* numbering continues after the highest id, per workflow */
    td_run c;
    ASSERT_OK(td_run_create(store, &spec2, &c));
    ASSERT_STREQ(c.id, "tiny-3");
    td_run_spec spec3 = {.workflow = "other-wf",
                         .command = "x",
                         .params_json = NULL,
                         .nodes = 1,
                         .nproc_per_node = 1};
    td_run d;
    ASSERT_OK(td_run_create(store, &spec3, &d));
    ASSERT_STREQ(d.id, "other-wf-4");
    td_run_clear(&d);

    /* ---- runs.db deleted while a store has it open: the next write follows the new file,
     * which the reopen rebuilt from the directories ---- */
    track_test_remove_index(tmpdir);
    ASSERT_OK(td_run_set_status(store, c.id, TD_RUN_STOPPED, 143, "stopped by hand"));
    td_rundb *other;
    ASSERT_OK(td_rundb_open(tmpdir, &other));
    ASSERT_OK(td_run_find(other, c.id, &r));
    ASSERT_EQ(r.status, TD_RUN_STOPPED);
    ASSERT_STREQ(r.note, "stopped by hand");
    td_run_clear(&r);
    ASSERT_OK(td_run_find(other, "tiny-1", &r));
    ASSERT_EQ(r.status, TD_RUN_SUCCEEDED);
    td_run_clear(&r);
    ASSERT_EQ(track_test_points(other, "tiny-1"), points_a);
    td_rundb_close(other);

    /* ---- the index still shows a run running, but its run.json has the end (its supervisor
     * wrote it elsewhere): the reaper believes run.json, not "supervisor gone" ---- */
    td_run e;
    ASSERT_OK(td_run_create(store, &spec2, &e));
    ASSERT_OK(td_run_set_supervisor(store, e.id, dead_pid()));
    ASSERT_OK(td_run_set_status(store, e.id, TD_RUN_RUNNING, -1, NULL));
    ASSERT_OK(td_run_find(store, e.id, &r));
    double ended = td_wall_s();
    /* what its supervisor wrote into run.json while this index did not get it */
    {
        char *json = td_xasprintf("%s/run.json", r.run_dir);
        json_t *jo = json_load_file(json, 0, NULL);
        ASSERT(jo);
        json_object_set_new(jo, "status", json_string("succeeded"));
        json_object_set_new(jo, "exit_code", json_integer(0));
        json_object_set_new(jo, "ended", json_real(ended));
        json_object_set_new(jo, "note", json_string("finished elsewhere"));
        ASSERT_EQ(json_dump_file(jo, json, 0), 0);
        json_decref(jo);
        free(json);
    }
    p = td_xasprintf("%s/metrics/rank-0.jsonl", r.run_dir);
    write_file(p, "{\"step\": 1, \"loss\": 0.3}\n");
    free(p);
    ASSERT_OK(td_run_reap_stale(store, &r));
    ASSERT_EQ(r.status, TD_RUN_SUCCEEDED);
    ASSERT_STREQ(r.note, "finished elsewhere");
    ASSERT_EQ(track_test_points(store, e.id), 1);
    ASSERT_NEAR(r.ended_s, ended, 1e-6);
    td_run_clear(&r);
    td_run_clear(&e);

    /* ---- automatic rebuild on open ---- */
    td_rundb_close(store);
    track_test_remove_index(tmpdir);
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    ASSERT_OK(td_run_list(store, 1, &runs, &n));
    ASSERT_EQ(n, 7);
    ASSERT_STREQ(runs[0].id, "tiny-1"); /* oldest first */
    td_runs_free(runs, n);
    ASSERT_OK(td_run_find(store, "tiny-4", &r));
    ASSERT_EQ(r.status, TD_RUN_SUCCEEDED);
    td_run_clear(&r);

    td_run_clear(&a);
    td_run_clear(&b);
    td_run_clear(&c);
    td_rundb_close(store);
    free(work);
    free(old_dir);
    free(old_metrics);
    free(bad_dir);
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cmd);
    TEST_PASS();
}
