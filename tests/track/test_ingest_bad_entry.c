/* track: chaos review, "a directory named rank-1.jsonl in the metrics directory stops the ingest
 * of every file after it (0 of 10 points stored, run 'succeeded')". One bad entry among a run's
 * metrics files is skipped with one warning naming it, and every other file is still stored:
 *   - a directory rank-1.jsonl, a symbolic link rank-6.jsonl (not followed: it would store
 *     rank 0's points again as rank 6's) and an unreadable rank-7.jsonl (when not root) among
 *     rank-0, 2, 3 and 4 with 10 points between them: all 10 stored, the poll succeeds;
 *   - each bad entry is named once, however often the ingester polls;
 *   - the same through a rebuild of the index (tandem reindex);
 *   - a bad entry put right (the directory replaced by a file) is read at the next poll. */
#include "test.h"
#include "track_test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/os.h"
#include "tandem/track.h"

static char tmpdir[] = "/tmp/tandem-test-ingest-bad-XXXXXX";
static char *capture_path;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) TEST_FAIL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir) != NULL);
    capture_path = td_xasprintf("%s/stderr.txt", tmpdir);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    td_run_spec spec = {.workflow = "bad",
                        .command = "train",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = 8};
    td_run run;
    ASSERT_OK(td_run_create(store, &spec, &run));
    char *dir = td_xasprintf("%s/metrics", run.run_dir);
    static const char *const good[] = {"rank-0.jsonl", "rank-2.jsonl", "rank-3.jsonl",
                                       "rank-4.jsonl"};
    static const char *const lines[] = {
        "{\"step\": 1, \"loss\": 0.9}\n{\"step\": 2, \"loss\": 0.8}\n{\"step\": 3, \"loss\": "
        "0.7}\n",
        "{\"step\": 1, \"loss\": 0.6}\n{\"step\": 2, \"loss\": 0.5}\n",
        "{\"step\": 1, \"loss\": 0.4}\n{\"step\": 2, \"loss\": 0.3}\n{\"step\": 3, \"loss\": "
        "0.2}\n",
        "{\"step\": 1, \"loss\": 0.1, \"acc\": 0.5}\n",
    }; /* 10 points */
    for (size_t i = 0; i < TD_ARRAY_LEN(good); i++) {
        char *p = td_xasprintf("%s/%s", dir, good[i]);
        write_file(p, lines[i]);
        free(p);
    }
    char *bad_dir = td_xasprintf("%s/rank-1.jsonl", dir);
    ASSERT_EQ(mkdir(bad_dir, 0755), 0);
    char *link = td_xasprintf("%s/rank-6.jsonl", dir);
    ASSERT_EQ(symlink("rank-0.jsonl", link), 0);
    char *locked = td_xasprintf("%s/rank-7.jsonl", dir);
    write_file(locked, "{\"step\": 1, \"loss\": 0.05}\n");
    ASSERT_EQ(chmod(locked, 0), 0);
    int root = geteuid() == 0; /* root reads it all the same: then it is a good file */
    int64_t expected = 10 + root;

    /* ---- the supervisor's ingester: polled several times ---- */
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run.id, dir, &ing));
    test_capture_begin(capture_path);
    size_t n = 0;
    td_status st = td_ingester_poll(ing, &n);
    td_status st2 = td_ingester_poll(ing, NULL);
    td_status st3 = td_ingester_poll(ing, NULL);
    char *err = test_capture_end();
    ASSERT_OK(st);
    ASSERT_OK(st2);
    ASSERT_OK(st3);
    ASSERT_EQ(n, expected);
    ASSERT_EQ(track_test_points(store, run.id), expected);
    ASSERT_EQ(test_count(err, "rank-1.jsonl is a directory, not a regular file: skipped"), 1);
    ASSERT_CONTAINS(err, bad_dir);
    ASSERT_EQ(test_count(err, "rank-6.jsonl is a symbolic link: skipped"), 1);
    if (!root) ASSERT_EQ(test_count(err, "rank-7.jsonl cannot be opened (Permission denied)"), 1);
    free(err);

    /* ---- the directory put right: a regular file in its place is read ---- */
    ASSERT_EQ(rmdir(bad_dir), 0);
    write_file(bad_dir, "{\"step\": 1, \"loss\": 0.55}\n");
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(track_test_points(store, run.id), expected + 1);
    td_ingester_free(ing);
    ASSERT_EQ(unlink(bad_dir), 0);
    ASSERT_EQ(mkdir(bad_dir, 0755), 0);

    /* ---- a rebuild of the index (tandem reindex) reads around it the same way ---- */
    td_rundb_close(store);
    track_test_remove_index(tmpdir);
    ASSERT_OK(td_rundb_open_ex(tmpdir, TD_RUNDB_NO_AUTO_REBUILD, &store));
    td_rebuild_stats rs;
    test_capture_begin(capture_path);
    st = td_rundb_rebuild(store, NULL, NULL, &rs);
    err = test_capture_end();
    ASSERT_OK(st);
    ASSERT_EQ(rs.restored, 1);
    ASSERT_EQ(rs.metric_points, expected);
    ASSERT_EQ(track_test_points(store, run.id), expected);
    ASSERT_EQ(test_count(err, "rank-1.jsonl is a directory, not a regular file: skipped"), 1);
    free(err);

    td_rundb_close(store);
    td_run_clear(&run);
    free(dir);
    free(bad_dir);
    free(link);
    free(locked);
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cmd);
    free(capture_path);
    TEST_PASS();
}
