/* The metrics sink: what a training process uses to publish metrics. It appends JSON lines to
 * one file with O_APPEND and one write(2) per line, so a reader never sees half a line from a
 * writer that is alive, and several writers to one file never interleave inside a line. */
#include "tandem/track.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct td_metrics_sink {
    int fd;
    char *path;
};

td_status td_metrics_sink_open(const char *path, td_metrics_sink **out) {
    *out = NULL;
    if (!path || !*path) path = td_env_str(TD_ENV_METRICS);
    if (!path || !*path) return TD_OK;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return td_error_errno(TD_ERR_IO, "cannot open metrics file %s (TANDEM_METRICS)", path);
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

static td_status append_line(td_metrics_sink *sink, const char *line, size_t len) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(sink->fd, line + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return td_error_errno(TD_ERR_IO, "writing metrics to %s", sink->path);
        done += (size_t)n;
    }
    return TD_OK;
}

/* Keys are written as JSON strings; escape what JSON requires. */
static size_t put_json_string(char *out, size_t cap, const char *s) {
    size_t n = 0;
    if (n < cap) out[n] = '"';
    n++;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        const char *piece = esc;
        if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", c);
        else {
            esc[0] = (char)c;
            esc[1] = '\0';
        }
        for (; *piece; piece++, n++)
            if (n < cap) out[n] = *piece;
    }
    if (n < cap) out[n] = '"';
    return n + 1;
}

td_status td_metrics_sink_log(td_metrics_sink *sink, int64_t step, size_t count,
                              const char *const *keys, const double *values) {
    if (!sink) return TD_OK;
    char line[4096];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"step\": %lld", (long long)step);
    for (size_t i = 0; i < count && n < sizeof line; i++) {
        n += (size_t)snprintf(line + n, sizeof line - n, ", ");
        if (n < sizeof line) n += put_json_string(line + n, sizeof line - n, keys[i]);
        /* JSON has no NaN or infinity: a diverged loss is written as null, which the ingester
         * skips, rather than making the whole line unreadable. */
        if (n < sizeof line) {
            if (isfinite(values[i]))
                n += (size_t)snprintf(line + n, sizeof line - n, ": %.9g", values[i]);
            else
                n += (size_t)snprintf(line + n, sizeof line - n, ": null");
        }
    }
    if (n + 2 >= sizeof line)
        return td_error(TD_ERR_INVALID,
                        "metrics line for step %lld is longer than %zu bytes; log fewer keys at "
                        "once",
                        (long long)step, sizeof line);
    line[n++] = '}';
    line[n++] = '\n';
    return append_line(sink, line, n);
}

td_status td_metrics_sink_log1(td_metrics_sink *sink, int64_t step, const char *key, double value) {
    return td_metrics_sink_log(sink, step, 1, &key, &value);
}

td_status td_metrics_sink_resume(td_metrics_sink *sink, int64_t step) {
    if (!sink) return TD_OK;
    char line[96];
    int n =
        snprintf(line, sizeof line, "{\"event\": \"resume\", \"step\": %lld}\n", (long long)step);
    return append_line(sink, line, (size_t)n);
}
