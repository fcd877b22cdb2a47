/* The run's restart and resume marks (docs/ui-api.md, "marks"): the events the ingest kept in
 * the store (run_events, track's events.c) from the workers' metrics files. The UI never opens
 * RUN/metrics itself: one run's metrics file of many GB, or one that blocks (a FIFO), used to
 * stall every other run's page while its event lines were scanned here (issues 29 and 31); the
 * store answers from an indexed table, whatever the files hold. */
#include "ui_internal.h"

#include <stdlib.h>

/* A chart shows a handful; a run of nothing but events is not a chart's business. */
#define MARKS_MAX 1000

/* By rank, then in the order stored (the order of the lines in the rank's file). */
static int by_rank(const void *a, const void *b) {
    const td_run_event *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

json_t *td__ui_marks_json(td_rundb *db, const td_run *run, int *partial) {
    json_t *arr = json_array();
    *partial = 0;
    td_run_event *ev = NULL;
    size_t n = 0;
    if (td_run_events(db, run->id, 0, MARKS_MAX + 1, &ev, &n) != TD_OK) {
        TD_LOG_DEBUG("tandem ui: marks of run %s: %s", run->id, td_error_msg());
        td_error_clear();
        return arr;
    }
    if (n > MARKS_MAX) {
        n = MARKS_MAX;
        *partial = 1;
    }
    if (n) qsort(ev, n, sizeof *ev, by_rank);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(
            arr, json_pack("{s:s,s:i,s:I,s:o}", "kind", td_run_event_kind_name(ev[i].kind), "rank",
                           ev[i].rank, "step", (json_int_t)ev[i].step, "time",
                           ev[i].time_s > 0 ? json_real(ev[i].time_s) : json_null()));
    free(ev);
    return arr;
}
