/* Status codes and the thread-local error detail that travels with them. */
#include "tandem/core.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_msgs[] = {
#define TD__STATUS_MSG(name, msg) msg,
    TD_STATUS_MAP(TD__STATUS_MSG)
#undef TD__STATUS_MSG
};

static const char *const status_names[] = {
#define TD__STATUS_NAME(name, msg) "TD_" #name,
    TD_STATUS_MAP(TD__STATUS_NAME)
#undef TD__STATUS_NAME
};

const char *td_status_str(td_status st) {
    if ((unsigned)st >= TD_STATUS_COUNT) return "unknown status";
    return status_msgs[st];
}

const char *td_status_name(td_status st) {
    if ((unsigned)st >= TD_STATUS_COUNT) return "TD_UNKNOWN";
    return status_names[st];
}

/* One detail and a short trace per thread: a comm thread's failure must not overwrite the
 * training thread's message. Sizes are generous; longer messages are truncated, never overrun. */
enum { ERROR_MSG_BYTES = 2048, ERROR_TRACE_BYTES = 2048 };
static _Thread_local char error_msg[ERROR_MSG_BYTES];
static _Thread_local char error_trace[ERROR_TRACE_BYTES];

static void append(char *buf, size_t cap, const char *fmt, ...) TD_PRINTF(3, 4);
static void append(char *buf, size_t cap, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

static td_status record(const char *file, int line, td_status st, int err, const char *fmt,
                        va_list ap) {
    /* Formatted aside first: callers wrap the previous detail, td_error(st, "...: %s",
     * td_error_msg()), and vsnprintf from a buffer into itself is undefined. */
    char fresh[ERROR_MSG_BYTES];
    vsnprintf(fresh, sizeof fresh, fmt, ap);
    memcpy(error_msg, fresh, sizeof error_msg);
    if (err) append(error_msg, sizeof error_msg, ": %s", strerror(err));
    error_trace[0] = '\0';
    append(error_trace, sizeof error_trace, "  at %s:%d\n", file, line);
    return st;
}

td_status td__error(const char *file, int line, td_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(file, line, st, 0, fmt, ap);
    va_end(ap);
    return st;
}

td_status td__error_errno(const char *file, int line, td_status st, const char *fmt, ...) {
    int err = errno;
    if (err == ENOSPC || err == EDQUOT)
        st = TD_ERR_NOSPACE;
    else if (err == ENOMEM)
        st = TD_ERR_NOMEM;
    va_list ap;
    va_start(ap, fmt);
    record(file, line, st, err, fmt, ap);
    va_end(ap);
    return st;
}

void td__error_trace(const char *file, int line, const char *expr) {
    append(error_trace, sizeof error_trace, "  at %s:%d (%s)\n", file, line, expr);
}

const char *td_error_msg(void) {
    return error_msg;
}

const char *td_error_trace(void) {
    return error_trace;
}

void td_error_clear(void) {
    error_msg[0] = '\0';
    error_trace[0] = '\0';
}

void td_error_print(td_status st) {
    /* through the log's line writer: a message quoting a peer's bytes reaches a terminal */
    td__log_error_line(error_msg[0] ? error_msg : td_status_str(st));
    if (td_log_enabled(TD_LOG_DEBUG) && error_trace[0]) fputs(error_trace, stderr);
}
