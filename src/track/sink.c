/* The metrics sink: what a training process uses to publish metrics. It appends JSON lines to
 * one file with O_APPEND and one write(2) per line, so a reader never sees half a line from a
 * writer that is alive, and several writers to one file never interleave inside a line. */
#include "store_internal.h"
#include "track/jsonl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct td_metrics_sink {
    int fd;
    char *path;
    int nospace; /* the disk is full: said once, and again when it is over */
};

td_status td_metrics_sink_open(const char *path, td_metrics_sink **out) {
    *out = NULL;
    if (!path || !*path) path = td_var_get(TD_VAR_TANDEM_METRICS);
    if (!path || !*path) return TD_OK;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        td_status st =
            td_error_errno(TD_ERR_IO, "cannot open metrics file %s (TANDEM_METRICS)", path);
        return td__nospace_explain(st, path);
    }
    td_metrics_sink *s = td_xcalloc(1, sizeof *s);
    s->fd = fd;
    s->path = td_xstrdup(path);
    *out = s;
    return TD_OK;
}

void td_metrics_sink_close(td_metrics_sink *sink) {
    if (!sink) return;
    close(sink->fd);
    free(sink->path);
    free(sink);
}

/* A line cut short by a full disk would glue itself to the next one (and make both
 * unreadable): cut the file back to where the line began, unless another writer has appended
 * since. */
static void undo_partial(td_metrics_sink *sink, size_t done) {
    off_t end = lseek(sink->fd, 0, SEEK_CUR);
    struct stat sb;
    if (end >= (off_t)done && fstat(sink->fd, &sb) == 0 && sb.st_size == end &&
        ftruncate(sink->fd, end - (off_t)done) != 0)
        TD_LOG_DEBUG("could not cut a partial metrics line from %s", sink->path);
}

static td_status append_line(td_metrics_sink *sink, const char *line, size_t len) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(sink->fd, line + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            td_status st = td_error_errno(TD_ERR_IO, "writing metrics to %s", sink->path);
            if (done) undo_partial(sink, done);
            if (st != TD_ERR_NOSPACE) return st;
            char *dir = td_xstrdup(sink->path);
            char *slash = strrchr(dir, '/');
            if (slash && slash != dir) *slash = '\0';
            td__nospace_explain(st, slash ? dir : ".");
            free(dir);
            if (!sink->nospace) {
                TD_LOG_WARN("metrics points are being dropped: %s (said once; each later "
                            "point is tried again and written once there is room)",
                            td_error_msg());
                sink->nospace = 1;
            }
            return st;
        }
        done += (size_t)n;
    }
    if (sink->nospace) {
        TD_LOG_WARN("metrics are written to %s again (the disk has room)", sink->path);
        sink->nospace = 0;
    }
    return TD_OK;
}

/* The one C writer of the metrics line schema (docs/metrics-format.md): every line has "step"
 * and "time"; the keys of a call share one line, except a key named like a schema field (step,
 * time, rank, key, value, event), which gets a one-point line {"key": K, "value": V, "step": S,
 * "time": T} of its own, as the Python SDK writes it. Reals with 9 significant digits, as the
 * sink has always written them (enough to tell any two floats apart); time with 17 (what Python's
 * time.time() prints). Non-finite values become null (jsonl.h): a diverged loss is no point, and
 * the line's other keys are still stored. All lines of a call go out in one write(2). */
#define TIME_DIGITS 17

static int is_schema_field(const char *key) {
    static const char *const fields[] = {"step", "time", "rank", "key", "value", "event"};
    for (size_t i = 0; i < TD_ARRAY_LEN(fields); i++)
        if (!strcmp(key, fields[i])) return 1;
    return 0;
}

/* Appends j's finished line to out (grown as needed). */
static td_status take_line(td_jsonl *j, int64_t step, char **out, size_t *len) {
    if (j->overflow)
        return td_error(TD_ERR_INVALID,
                        "metrics line for step %lld is longer than %d bytes; log fewer keys at "
                        "once",
                        (long long)step, TD_JSONL_MAX_BYTES);
    const char *line;
    size_t n;
    TD_CHECK(td_jsonl_end(j, &line, &n));
    *out = td_xrealloc(*out, *len + n);
    memcpy(*out + *len, line, n);
    *len += n;
    return TD_OK;
}

td_status td_metrics_sink_log(td_metrics_sink *sink, int64_t step, size_t count,
                              const char *const *keys, const double *values) {
    if (!sink) return TD_OK;
    double now = td_wall_s();
    char *text = NULL;
    size_t len = 0, plain = 0, own_lines = 0;
    td_status st = TD_OK;
    td_jsonl j;
    td_jsonl_begin(&j);
    td_jsonl_int(&j, "step", step);
    td_jsonl_real(&j, "time", now, TIME_DIGITS);
    for (size_t i = 0; i < count; i++)
        if (!is_schema_field(keys[i])) {
            td_jsonl_real(&j, keys[i], values[i], 9);
            plain++;
        } else if (isfinite(values[i])) {
            own_lines++;
        }
    /* The shared line, unless every key has a line of its own (a call with nothing to store
     * still leaves its step and time, as the SDK's does). */
    if (plain || !own_lines) TD_CHECK_GOTO(take_line(&j, step, &text, &len), st, out);
    for (size_t i = 0; i < count; i++) {
        if (!is_schema_field(keys[i]) || !isfinite(values[i])) continue;
        td_jsonl_begin(&j);
        td_jsonl_str(&j, "key", keys[i]);
        td_jsonl_real(&j, "value", values[i], 9);
        td_jsonl_int(&j, "step", step);
        td_jsonl_real(&j, "time", now, TIME_DIGITS);
        TD_CHECK_GOTO(take_line(&j, step, &text, &len), st, out);
    }
    st = append_line(sink, text, len);
out:
    free(text);
    return st;
}

td_status td_metrics_sink_log1(td_metrics_sink *sink, int64_t step, const char *key, double value) {
    return td_metrics_sink_log(sink, step, 1, &key, &value);
}

td_status td_metrics_sink_event(td_metrics_sink *sink, td_run_event_kind kind, int64_t step) {
    if (!sink) return TD_OK;
    td_jsonl j;
    td_jsonl_begin(&j);
    td_jsonl_str(&j, "event", td_run_event_kind_name(kind));
    td_jsonl_int(&j, "step", step);
    td_jsonl_real(&j, "time", td_wall_s(), TIME_DIGITS);
    const char *line;
    size_t n;
    TD_CHECK(td_jsonl_end(&j, &line, &n));
    return append_line(sink, line, n);
}

td_status td_metrics_sink_resume(td_metrics_sink *sink, int64_t step) {
    return td_metrics_sink_event(sink, TD_RUN_EVENT_RESUME, step);
}
