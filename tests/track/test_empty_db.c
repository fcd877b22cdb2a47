/* track: an emptied or schema-less runs.db is a lost index, like a missing one (chaos review:
 * "a 0-byte runs.db hides every run; emptied under a live run, the run's end is lost and a
 * reindex shows a run that exited 0 as failed"). The run directories (run.json) are the record:
 *   - a 0-byte runs.db at open is rebuilt from them, with a warning naming it;
 *   - so is a SQLite file without the store's tables (someone else's database);
 *   - runs.db truncated to 0 bytes while a store has it open (a live supervisor): the run's end
 *     is still recorded, every other run is still there, and a reindex agrees. */
#include "test.h"
#include "track_test.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/os.h"
#include "tandem/track.h"

static char tmpdir[] = "/tmp/tandem-test-empty-db-XXXXXX";
static char *db_path;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) TEST_FAIL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static char *capture_path;

static void remove_journal(void) {
    char *wal = td_xasprintf("%s-wal", db_path), *shm = td_xasprintf("%s-shm", db_path);
    unlink(wal);
    unlink(shm);
    free(wal);
    free(shm);
}

static void expect_runs(td_rundb *store, size_t count) {
    td_run *runs;
    size_t n;
    ASSERT_OK(td_run_list(store, 1, &runs, &n));
    ASSERT_EQ(n, count);
    td_runs_free(runs, n);
}

static void expect_status(td_rundb *store, const char *id, td_run_status status, int code) {
    td_run r;
    ASSERT_OK(td_run_find(store, id, &r));
    if (r.status != status)
        TEST_FAIL("run %s is %s (note: %s), expected %s", id, td_run_status_str(r.status),
                  r.note ? r.note : "-", td_run_status_str(status));
    ASSERT_EQ(r.exit_code, code);
    td_run_clear(&r);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir) != NULL);
    db_path = td_xasprintf("%s/.tandem/runs.db", tmpdir);
    capture_path = td_xasprintf("%s/stderr.txt", tmpdir);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));

    /* tiny-1: finished, with two metric points */
    td_run_spec spec = {.workflow = "tiny",
                        .command = "train",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = 1};
    td_run a, b;
    ASSERT_OK(td_run_create(store, &spec, &a));
    ASSERT_OK(td_run_set_status(store, a.id, TD_RUN_RUNNING, -1, NULL));
    char *p = td_xasprintf("%s/metrics/rank-0.jsonl", a.run_dir);
    write_file(p, "{\"step\": 1, \"loss\": 0.9}\n{\"step\": 2, \"loss\": 0.5}\n");
    free(p);
    p = td_xasprintf("%s/metrics", a.run_dir);
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, a.id, p, &ing));
    free(p);
    ASSERT_OK(td_ingester_poll(ing, NULL));
    td_ingester_free(ing);
    ASSERT_OK(td_run_set_status(store, a.id, TD_RUN_SUCCEEDED, 0, NULL));
    ASSERT_EQ(track_test_points(store, a.id), 2);

    /* ---- a 0-byte runs.db at open ---- */
    td_rundb_close(store);
    remove_journal();
    ASSERT_EQ(truncate(db_path, 0), 0);
    test_capture_begin(capture_path);
    td_status st = td_rundb_open(tmpdir, &store);
    char *err = test_capture_end();
    ASSERT_OK(st);
    expect_runs(store, 1);
    expect_status(store, a.id, TD_RUN_SUCCEEDED, 0);
    ASSERT_EQ(track_test_points(store, a.id), 2);
    ASSERT_CONTAINS(err, db_path);
    ASSERT_CONTAINS(err, "rebuilt it from 1 run directory");
    free(err);
    /* and only once: the next open finds the rebuilt index */
    td_rundb_close(store);
    test_capture_begin(capture_path);
    st = td_rundb_open(tmpdir, &store);
    err = test_capture_end();
    ASSERT_OK(st);
    ASSERT_STREQ(err, "");
    free(err);
    td_rundb_close(store);

    /* ---- a SQLite database with no schema at all (its one table dropped) ---- */
    remove_journal();
    unlink(db_path);
    sqlite3 *other;
    ASSERT_EQ(sqlite3_open(db_path, &other), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(other, "CREATE TABLE t(x); DROP TABLE t;", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(other);
    test_capture_begin(capture_path);
    st = td_rundb_open(tmpdir, &store);
    err = test_capture_end();
    ASSERT_OK(st);
    expect_runs(store, 1);
    expect_status(store, a.id, TD_RUN_SUCCEEDED, 0);
    ASSERT_EQ(track_test_points(store, a.id), 2);
    ASSERT_CONTAINS(err, "without the run store's tables; rebuilt it from 1 run directory");
    free(err);
    td_rundb_close(store);

    /* ---- someone else's SQLite database: kept aside, not mixed into the index ---- */
    remove_journal();
    unlink(db_path);
    ASSERT_EQ(sqlite3_open(db_path, &other), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(other, "CREATE TABLE notes(x TEXT); INSERT INTO notes VALUES('hi');",
                           NULL, NULL, NULL),
              SQLITE_OK);
    sqlite3_close(other);
    test_capture_begin(capture_path);
    st = td_rundb_open(tmpdir, &store);
    err = test_capture_end();
    ASSERT_OK(st);
    expect_runs(store, 1);
    expect_status(store, a.id, TD_RUN_SUCCEEDED, 0);
    ASSERT_CONTAINS(err, "moved aside to");
    ASSERT_CONTAINS(err, "rebuilt it from 1 run directory");
    {
        const char *aside = strstr(err, "moved aside to ") + strlen("moved aside to ");
        char *path = td_xstrdup(aside);
        *strchr(path, ')') = '\0';
        ASSERT_EQ(sqlite3_open(path, &other), SQLITE_OK);
        ASSERT_EQ(sqlite3_exec(other, "SELECT x FROM notes", NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(other);
        free(path);
    }
    free(err);

    /* ---- emptied while a store has it open, a run going under a live supervisor (a process
     * whose command line names tandem, as the reaper wants) ---- */
    pid_t sup = fork();
    ASSERT(sup >= 0);
    if (sup == 0) {
        execlp("sleep", "tandem-supervisor", "60", (char *)NULL);
        _exit(127);
    }
    ASSERT_OK(td_run_create(store, &spec, &b));
    ASSERT_OK(td_run_set_supervisor(store, b.id, (int64_t)sup));
    ASSERT_OK(td_run_set_status(store, b.id, TD_RUN_RUNNING, -1, NULL));
    ASSERT_EQ(truncate(db_path, 0), 0);
    /* the supervisor records the end, as the run exited 0 */
    test_capture_begin(capture_path);
    st = td_run_set_status(store, b.id, TD_RUN_SUCCEEDED, 0, NULL);
    err = test_capture_end();
    ASSERT_OK(st);
    ASSERT_CONTAINS(err, db_path);
    free(err);
    expect_status(store, b.id, TD_RUN_SUCCEEDED, 0);
    expect_runs(store, 2);
    {
        td_run r;
        ASSERT_OK(td_run_find(store, b.id, &r));
        ASSERT(r.note == NULL); /* not reaped as "supervisor gone" on the way */
        td_run_clear(&r);
    }
    kill(sup, SIGKILL);
    waitpid(sup, NULL, 0);
    /* another process's view: both runs, both succeeded, tiny-1's points back */
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        td_rundb *view;
        ASSERT_OK(td_rundb_open(tmpdir, &view));
        expect_runs(view, 2);
        expect_status(view, a.id, TD_RUN_SUCCEEDED, 0);
        expect_status(view, b.id, TD_RUN_SUCCEEDED, 0);
        ASSERT_EQ(track_test_points(view, a.id), 2);
        td_rundb_close(view);
        _exit(0);
    }
    int wst;
    ASSERT_EQ(waitpid(child, &wst, 0), child);
    ASSERT(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    td_rundb_close(store);

    /* a reindex from scratch agrees: run.json had the end */
    remove_journal();
    unlink(db_path);
    ASSERT_OK(td_rundb_open_ex(tmpdir, TD_RUNDB_NO_AUTO_REBUILD, &store));
    td_rebuild_stats rs;
    ASSERT_OK(td_rundb_rebuild(store, NULL, NULL, &rs));
    ASSERT_EQ(rs.restored, 2);
    expect_status(store, b.id, TD_RUN_SUCCEEDED, 0);
    expect_status(store, a.id, TD_RUN_SUCCEEDED, 0);
    td_rundb_close(store);

    td_run_clear(&a);
    td_run_clear(&b);
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cmd);
    free(db_path);
    free(capture_path);
    TEST_PASS();
}
