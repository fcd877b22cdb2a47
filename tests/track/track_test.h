/* What the track tests share. */
#ifndef TANDEM_TRACK_TEST_H
#define TANDEM_TRACK_TEST_H

#include <unistd.h>

#include "tandem/track.h"
#include "test.h"

/* Removes the project's run index (.tandem/runs.db and its -wal and -shm), as if it were lost. */
static inline void track_test_remove_index(const char *project) {
    static const char *const suffix[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < TD_ARRAY_LEN(suffix); i++) {
        char *p = td_xasprintf("%s/.tandem/runs.db%s", project, suffix[i]);
        unlink(p);
        free(p);
    }
}

/* The number of metric points stored for run id. */
static inline int64_t track_test_points(td_rundb *store, const char *id) {
    int64_t n = -1;
    ASSERT_OK(td_metrics_count(store, id, &n));
    return n;
}

#endif
