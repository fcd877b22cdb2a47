/* Metrics JSON lines (src/track/ingest.c, metrics.c; docs/runs.md): the input as a rank's
 * metrics file, ingested into a run store in memory. Exactly-once is checked too: a second
 * ingester, starting from the offset the first one committed, must find nothing new.
 *
 * The store and both ingesters live for the whole process (an ingester's 8 MiB read buffer
 * costs more under ASan than the parsing). Before each input the store's metrics, ingest offsets
 * and metric keys are deleted (and its key cache dropped), and after it both ingesters see the
 * file empty, which resets their size hint to 0; so every input starts from the same state and
 * the database stays small over millions of runs. */
#include "fuzz.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_internal.h"
#include "tandem/track.h"

static td_rundb *store;
static td_run run;
static char metrics_dir[512], metrics_file[600];

static void setup(void) {
    FUZZ_ASSERT(td_rundb_open(fuzz_dir(), &store) == TD_OK, "%s", td_error_msg());
    td_run_spec spec = {.workflow = "fuzz", .command = "true", .nodes = 1, .nproc_per_node = 1};
    FUZZ_ASSERT(td_run_create(store, &spec, &run) == TD_OK, "%s", td_error_msg());
    snprintf(metrics_dir, sizeof metrics_dir, "%s/metrics", run.run_dir);
    snprintf(metrics_file, sizeof metrics_file, "%s/rank-0.jsonl", metrics_dir);
}

static void reset(void) {
    FUZZ_ASSERT(td__rundb_begin(store) == TD_OK, "%s", td_error_msg());
    FUZZ_ASSERT(td__rundb_exec(store, "DELETE FROM metrics; DELETE FROM ingest_offsets;"
                                      " DELETE FROM metric_keys") == TD_OK,
                "%s", td_error_msg());
    FUZZ_ASSERT(td__rundb_commit(store) == TD_OK, "%s", td_error_msg());
    /* the key cache holds ids of the keys just deleted; a rollback drops it (store_internal.h) */
    FUZZ_ASSERT(td__rundb_begin(store) == TD_OK, "%s", td_error_msg());
    td__rundb_rollback(store);
}

static size_t poll(td_ingester *ing) {
    size_t n = 0;
    FUZZ_ASSERT(td_ingester_poll(ing, &n) == TD_OK, "poll: %s", td_error_msg());
    return n;
}

static void write_file(const uint8_t *data, size_t size) {
    int fd = open(metrics_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FUZZ_ASSERT(fd >= 0, "cannot write %s", metrics_file);
    FUZZ_ASSERT(write(fd, data, size) == (ssize_t)size, "%s", "short write");
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static td_ingester *first, *second;
    fuzz_init();
    if (!store) {
        setup();
        FUZZ_ASSERT(td_ingester_new(store, run.id, metrics_dir, &first) == TD_OK &&
                        td_ingester_new(store, run.id, metrics_dir, &second) == TD_OK,
                    "%s", td_error_msg());
    }
    reset();
    write_file(data, size);
    size_t points = poll(first);
    int64_t stored = -1;
    FUZZ_ASSERT(td_metrics_count(store, run.id, &stored) == TD_OK, "%s", td_error_msg());
    /* resume events may cut points stored earlier in the same file, never add any */
    FUZZ_ASSERT(stored >= 0 && (size_t)stored <= points, "%lld stored, %zu ingested",
                (long long)stored, points);
    size_t again = poll(second);
    FUZZ_ASSERT(again == 0, "a second ingester stored %zu points again", again);
    /* an empty file: each ingester's "unchanged size" hint becomes 0 for the next input */
    write_file(data, 0);
    poll(first);
    poll(second);
    td_error_clear();
    return 0;
}
