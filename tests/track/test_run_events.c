/* track: the metrics files' resume and restart lines kept in the store's run_events table, and
 * the one place that names those files. The sink writes events (with time) and an old-format
 * resume line (no time) is dated by the line after it; events come out of td_run_events in the
 * order stored, with a cursor; a resume still cuts points back in the same transaction; a file
 * read again from its start (rewritten) does not double its events; after runs.db is lost, the
 * rebuild from the directories (what `tandem reindex` runs) brings the events back; deleting the
 * run removes them. The expected values are this test's own literals, not the store's output. */
#include "track_test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

static char tmpdir[] = "/tmp/tandem-test-run-events-XXXXXX";

static void append(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* The run's events as "kind:rank:step" joined by commas. */
static char *events_text(td_rundb *store, const char *run, int64_t after) {
    td_run_event *ev = NULL;
    size_t n = 0;
    ASSERT_OK(td_run_events(store, run, after, 0, &ev, &n));
    char *out = td_xcalloc(n * 48 + 1, 1);
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) ASSERT(ev[i].id > ev[i - 1].id);
        used += (size_t)sprintf(out + used, "%s%s:%d:%lld", i ? "," : "",
                                td_run_event_kind_name(ev[i].kind), ev[i].rank,
                                (long long)ev[i].step);
    }
    free(ev);
    return out;
}

#define ASSERT_EVENTS(store, run, after, expected)                                                 \
    do {                                                                                           \
        char *e_ = events_text(store, run, after);                                                 \
        ASSERT_STREQ(e_, expected);                                                                \
        free(e_);                                                                                  \
    } while (0)

static void test_names(void) {
    ASSERT_EQ(td_metrics_file_rank("rank-0.jsonl"), 0);
    ASSERT_EQ(td_metrics_file_rank("rank-17.jsonl"), 17);
    ASSERT_EQ(td_metrics_file_rank("rank-.jsonl"), -1);
    ASSERT_EQ(td_metrics_file_rank("rank--1.jsonl"), -1);
    ASSERT_EQ(td_metrics_file_rank("rank-1.jsonl.tmp"), -1);
    ASSERT_EQ(td_metrics_file_rank("rank-1.log"), -1);
    ASSERT_EQ(td_metrics_file_rank("sys.jsonl"), -1);
    ASSERT_EQ(td_metrics_file_rank("rank-99999999.jsonl"), -1);
    ASSERT_EQ(td_log_file_rank("rank-3.log"), 3);
    ASSERT_EQ(td_log_file_rank("rank-3.jsonl"), -1);
    ASSERT(td_metrics_file_is_system("sys.jsonl"));
    ASSERT(td_metrics_file_is_system("sys-node1.jsonl"));
    ASSERT(!td_metrics_file_is_system("rank-0.jsonl"));
    char *name = td_metrics_file_name(5);
    ASSERT_STREQ(name, "rank-5.jsonl");
    ASSERT_EQ(td_metrics_file_rank(name), 5);
    free(name);
}

int main(void) {
    test_names();
    ASSERT(mkdtemp(tmpdir) != NULL);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    td_run run;
    td_run_spec spec = {.workflow = "ev", .command = "true", .nodes = 1, .nproc_per_node = 2};
    ASSERT_OK(td_run_create(store, &spec, &run));
    char *dir = td_run_path(run.run_dir, TD_RUN_PATH_METRICS);
    ASSERT(mkdir(dir, 0755) == 0 || errno == EEXIST);
    char *f0 = td_xasprintf("%s/rank-0.jsonl", dir), *f1 = td_xasprintf("%s/rank-1.jsonl", dir);

    /* Rank 0 through the sink: points, a resume at 2 (cutting 3), a restart at 2. */
    td_metrics_sink *sink;
    ASSERT_OK(td_metrics_sink_open(f0, &sink));
    for (int step = 1; step <= 3; step++) ASSERT_OK(td_metrics_sink_log1(sink, step, "loss", 1));
    ASSERT_OK(td_metrics_sink_resume(sink, 2));
    ASSERT_OK(td_metrics_sink_event(sink, TD_RUN_EVENT_RESTART, 2));
    ASSERT_OK(td_metrics_sink_log1(sink, 3, "loss", 0.5));
    td_metrics_sink_close(sink);
    /* Rank 1 in the old format: a resume without time, dated by the next line's time; an
     * unknown event is ignored; a resume without a step is malformed. */
    append(f1, "{\"step\": 1, \"loss\": 2}\n{\"event\": \"resume\", \"step\": 0}\n"
               "{\"event\": \"preempted\", \"step\": 1}\n{\"event\": \"resume\"}\n"
               "{\"step\": 1, \"loss\": 3, \"time\": 1234.5}\n");

    int64_t before = -1;
    ASSERT_OK(td_run_events_cursor(store, run.id, &before));
    ASSERT_EQ(before, 0);
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run.id, dir, &ing));
    size_t n;
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(td_ingester_malformed(ing), 1);
    td_ingester_free(ing);

    /* Files are polled in directory order: compare per rank. */
    td_run_event *ev;
    size_t nev;
    ASSERT_OK(td_run_events(store, run.id, 0, 0, &ev, &nev));
    ASSERT_EQ(nev, 3);
    int seen0 = 0, seen1 = 0;
    double now = td_wall_s();
    for (size_t i = 0; i < nev; i++) {
        if (ev[i].rank == 0) {
            ASSERT_EQ(ev[i].kind, seen0 ? TD_RUN_EVENT_RESTART : TD_RUN_EVENT_RESUME);
            ASSERT_EQ(ev[i].step, 2);
            ASSERT(ev[i].time_s > now - 600 && ev[i].time_s <= now + 1); /* the sink's time */
            seen0++;
        } else {
            ASSERT_EQ(ev[i].rank, 1);
            ASSERT_EQ(ev[i].kind, TD_RUN_EVENT_RESUME);
            ASSERT_EQ(ev[i].step, 0);
            ASSERT_NEAR(ev[i].time_s, 1234.5, 1e-9); /* dated by the line after it */
            seen1++;
        }
    }
    ASSERT_EQ(seen0, 2);
    ASSERT_EQ(seen1, 1);
    int64_t cursor;
    ASSERT_OK(td_run_events_cursor(store, run.id, &cursor));
    ASSERT_EQ(cursor, ev[nev - 1].id);
    free(ev);
    ASSERT_EVENTS(store, run.id, cursor, "");
    /* The resume cut rank 0's step 3, which came again once. */
    td_metric_row *rows;
    size_t nrows;
    ASSERT_OK(td_metrics_query(store, run.id, "loss", 0, &rows, &nrows));
    ASSERT_EQ(nrows, 3);
    ASSERT_NEAR(rows[2].value, 0.5, 1e-12);
    td_metric_rows_free(rows, nrows);

    /* Rank 1's file rewritten (shorter): read again from its start, its events replaced, not
     * doubled; rank 0's stay. */
    ASSERT_EQ(truncate(f1, 0), 0);
    append(f1, "{\"event\": \"resume\", \"step\": 7, \"time\": 99.0}\n");
    ASSERT_OK(td_ingester_new(store, run.id, dir, &ing));
    ASSERT_OK(td_ingester_poll(ing, &n));
    td_ingester_free(ing);
    ASSERT_EVENTS(store, run.id, cursor, "resume:1:7");
    ASSERT_OK(td_run_events(store, run.id, 0, 0, &ev, &nev));
    ASSERT_EQ(nev, 3);
    free(ev);

    /* runs.db lost: the rebuild from the run directories brings the events back. */
    td_rundb_close(store);
    track_test_remove_index(tmpdir);
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    ASSERT_OK(td_run_events(store, run.id, 0, 0, &ev, &nev));
    ASSERT_EQ(nev, 3);
    int resumes = 0, restarts = 0;
    for (size_t i = 0; i < nev; i++) {
        resumes += ev[i].kind == TD_RUN_EVENT_RESUME;
        restarts += ev[i].kind == TD_RUN_EVENT_RESTART;
    }
    ASSERT_EQ(resumes, 2);
    ASSERT_EQ(restarts, 1);
    free(ev);
    /* A second rebuild (tandem reindex on an intact index) adds nothing. */
    ASSERT_OK(td_rundb_rebuild(store, NULL, NULL, NULL));
    ASSERT_OK(td_run_events(store, run.id, 0, 0, &ev, &nev));
    ASSERT_EQ(nev, 3);
    free(ev);

    /* Deleting the run deletes its events (a new run does not inherit them). */
    td_run found;
    ASSERT_OK(td_run_find(store, run.id, &found));
    ASSERT_OK(td_run_delete(store, &found));
    td_run_clear(&found);
    td_run run2;
    ASSERT_OK(td_run_create(store, &spec, &run2));
    ASSERT_EVENTS(store, run2.id, 0, "");
    td_run_clear(&run2);

    td_rundb_close(store);
    free(f0);
    free(f1);
    free(dir);
    td_run_clear(&run);
    char *cmd = td_xasprintf("rm -rf '%s'", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
