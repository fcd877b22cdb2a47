/* Time, environment knobs, number parsing, CRC-32. */
#include "tandem/core.h"

#include <errno.h>
#include <sched.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

uint64_t td_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double td_now_s(void) {
    return (double)td_now_ns() * 1e-9;
}

double td_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const struct {
    const char *name;
    const char *def;
    const char *doc;
} env_table[] = {
#define TD__ENV_ROW(name, def, doc) {"TANDEM_" #name, def, doc},
    TD_ENV_MAP(TD__ENV_ROW)
#undef TD__ENV_ROW
};

const char *td_env_str(td_env_knob knob) {
    const char *v = getenv(env_table[knob].name);
    return (v && *v) ? v : env_table[knob].def;
}

int64_t td_env_int(td_env_knob knob) {
    /* Parsed on every call on purpose: tests and the launcher change the environment between
     * runs in one process, and none of these knobs sits on a hot path. */
    int64_t v;
    if (td_parse_i64(env_table[knob].name, td_env_str(knob), &v) != TD_OK) {
        TD_LOG_WARN("%s=%s is not an integer; using the default %s", env_table[knob].name,
                    td_env_str(knob), env_table[knob].def);
        td_parse_i64(env_table[knob].name, env_table[knob].def, &v);
    }
    return v;
}

void td_env_print(FILE *out) {
    for (size_t i = 0; i < TD_ARRAY_LEN(env_table); i++)
        fprintf(out, "%-26s = %-10s  %s (default %s)\n", env_table[i].name,
                td_env_str((td_env_knob)i), env_table[i].doc, env_table[i].def);
}

int td_num_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return TD_MAX(1, CPU_COUNT(&set));
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static const struct {
    const char *name;
    const char *by;
    const char *doc;
} var_table[] = {
#define TD__VAR_ROW(name, by, doc) {#name, by, doc},
    TD_VAR_MAP(TD__VAR_ROW)
#undef TD__VAR_ROW
};

const char *td_var_name(td_var var) {
    return var_table[var].name;
}

const char *td_var_get(td_var var) {
    const char *v = getenv(var_table[var].name);
    return v && *v ? v : NULL;
}

void td_var_print(FILE *out) {
    for (size_t i = 0; i < TD_ARRAY_LEN(var_table); i++)
        fprintf(out, "%-28s %-12s %s\n", var_table[i].name, var_table[i].by, var_table[i].doc);
}

td_status td_parse_i64(const char *what, const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s ? s : "", &end, 10);
    if (!s || !*s || *end || errno)
        return td_error(TD_ERR_INVALID, "%s: '%s' is not an integer", what, s ? s : "");
    *out = v;
    return TD_OK;
}

td_status td_parse_f64(const char *what, const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s ? s : "", &end);
    if (!s || !*s || *end || errno || !isfinite(v))
        return td_error(TD_ERR_INVALID, "%s: '%s' is not a finite number", what, s ? s : "");
    *out = v;
    return TD_OK;
}

uint32_t td_crc32(uint32_t crc, const void *buf, size_t nbytes) {
    const unsigned char *p = buf;
    while (nbytes > 0) { /* zlib takes uInt lengths */
        uInt chunk = nbytes > (1u << 30) ? (1u << 30) : (uInt)nbytes;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        nbytes -= chunk;
    }
    return crc;
}

char *td_escape_text(char *dst, size_t cap, const void *src, size_t n) {
    const unsigned char *p = src;
    size_t o = 0;
    if (!cap) return dst;
    for (size_t i = 0; i < n; i++) {
        char esc[8];
        int len = p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\'
                      ? (esc[0] = (char)p[i], 1)
                      : snprintf(esc, sizeof esc, "\\x%02x", p[i]);
        if (o + (size_t)len + 4 > cap) { /* room for "..." and the NUL */
            if (cap >= 4) memcpy(dst + TD_MIN(o, cap - 4), "...", 3), o = TD_MIN(o, cap - 4) + 3;
            break;
        }
        memcpy(dst + o, esc, (size_t)len);
        o += (size_t)len;
    }
    dst[TD_MIN(o, cap - 1)] = '\0';
    return dst;
}
