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

void td_log(td_log_level level, const char *fmt, ...) {
    if (!td_log_enabled(level)) return;
    static const char *const tags[] = {"error: ", "warning: ", "", "debug: "};
    char line[4096];
    int n = snprintf(line, sizeof line, "%standem: %s", log_prefix, tags[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One fputs per line so lines from threads and processes sharing stderr do not interleave. */
    size_t len = strlen(line);
    if (len + 1 < sizeof line && (len == 0 || line[len - 1] != '\n')) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}
