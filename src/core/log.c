/* Leveled logging to stderr with an optional per-process prefix ("[rank 3] "). */
#include "tandem/core.h"

#include <stdarg.h>
#include <string.h>
#include <strings.h>

static char log_prefix[64];

static td_log_level current_level(void) {
    static int level = -1;
    if (level < 0) {
        const char *s = td_env_str(TD_ENV_LOG_LEVEL);
        if (!strcasecmp(s, "error"))
            level = TD_LOG_ERROR;
        else if (!strcasecmp(s, "warn"))
            level = TD_LOG_WARN;
        else if (!strcasecmp(s, "debug"))
            level = TD_LOG_DEBUG;
        else
            level = TD_LOG_INFO;
    }
    return (td_log_level)level;
}

int td_log_enabled(td_log_level level) {
    return level <= current_level();
}

void td_log_set_prefix(const char *prefix) {
    snprintf(log_prefix, sizeof log_prefix, "%s", prefix ? prefix : "");
}

/* Writes one message line to stderr. Control bytes in it (an ESC that would retitle or clear the
 * terminal, a newline that would forge a second "tandem: error:" line, a carriage return that
 * would hide what came before) come from what the message quotes: a peer's text, a file name, a
 * metric key. They are written as \xNN; tabs and UTF-8 pass. */
static void write_line(const char *line) {
    char out[4096 * 4 + 2];
    size_t o = 0, len = strlen(line);
    while (len && line[len - 1] == '\n') len--;
    for (size_t i = 0; i < len && o + 5 < sizeof out - 2; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            o += (size_t)snprintf(out + o, sizeof out - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o++] = '\n';
    out[o] = '\0';
    /* One fputs per line so lines from threads and processes sharing stderr do not interleave. */
    fputs(out, stderr);
}

void td_log(td_log_level level, const char *fmt, ...) {
    if (!td_log_enabled(level)) return;
    static const char *const tags[] = {"error: ", "warning: ", "", "debug: "};
    char line[4096];
    int n = snprintf(line, sizeof line, "%standem: %s", log_prefix, tags[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    write_line(line);
}

void td__log_error_line(const char *msg) {
    char line[4096];
    snprintf(line, sizeof line, "tandem: error: %s", msg);
    write_line(line);
}
