/* The shared part of the run verbs: see run_cli.h. */
#include "run_cli.h"
#include "tandem/exec.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

int run_cli_id(const cli_command *verb, const char *arg, const char **id) {
    if (*id) return cli_error(verb, "one run at a time ('%s' and '%s')", *id, arg);
    *id = arg;
    return -1;
}

int run_cli_operands(const cli_command *verb, int argc, char **argv, int flag_opt, int *flag,
                     const char ***ops, size_t *nops) {
    cli_parser p;
    cli_init(&p, verb, argc, argv);
    *ops = td_xcalloc((size_t)argc + 1, sizeof **ops);
    *nops = 0;
    if (flag) *flag = 0;
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) {
            free(*ops);
            *ops = NULL;
            return p.exit_code;
        }
        if (flag_opt && c == flag_opt)
            *flag = 1;
        else
            (*ops)[(*nops)++] = p.value;
    }
    return -1;
}

int run_cli_usage_error(const cli_command *verb) {
    cli_usage(verb, stderr);
    return 2;
}

int run_cli_rank(const cli_command *verb, const char *value, int *rank) {
    int64_t r;
    if (td_parse_i64("--rank", value, &r) != TD_OK || r < 0 || r > INT_MAX) {
        td_error_clear();
        return cli_error(verb, "--rank '%s': expects an integer >= 0", value);
    }
    *rank = (int)r;
    return -1;
}

int run_cli_open_store(td_rundb **store) {
    td_status st = td_rundb_open(NULL, store);
    if (st != TD_OK) {
        run_cli_error(st);
        return 1;
    }
    return 0;
}

int run_cli_open_run(const cli_command *verb, const char *id, td_rundb **store, td_run *run) {
    if (!id) return run_cli_usage_error(verb);
    int rc = run_cli_open_store(store);
    if (rc) return rc;
    td_status st = td_run_find(*store, id, run);
    if (st != TD_OK) {
        run_cli_error(st);
        td_rundb_close(*store);
        return 2;
    }
    run_cli_attach(*store, run);
    return 0;
}

void run_cli_attach(td_rundb *store, td_run *run) {
    if (td_exec_remote_refresh(store, run) != TD_OK) {
        fprintf(stderr, "tandem: warning: %s; showing what was pulled before\n",
                run_cli_text(td_error_msg()));
        td_error_clear();
    }
}

void run_cli_close(td_rundb *store, td_run *run) {
    if (run) td_run_clear(run);
    td_rundb_close(store);
}

/* The length of the valid UTF-8 sequence at p (1 for ASCII), 0 when it is not one. */
static size_t utf8_len(const unsigned char *p) {
    if (*p < 0x80) return 1;
    size_t n = *p >= 0xc2 && *p <= 0xdf   ? 2
               : *p >= 0xe0 && *p <= 0xef ? 3
               : *p >= 0xf0 && *p <= 0xf4 ? 4
                                          : 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    return n;
}

/* Terminal-safe text (run_cli.h): every byte a terminal acts on written as \xNN: the C0
 * controls and DEL, and the C1 controls U+0080..U+009F (in UTF-8, or as bytes 0x80..0x9f outside a
 * valid UTF-8 sequence). Metric keys, notes, commands and paths are anyone's text: an escape
 * sequence in one must not retitle or clear the terminal of whoever looks at the run. Other UTF-8
 * text is kept as it is. The result lives until 16 more calls. */
const char *run_cli_text(const char *s) {
    static char *ring[16];
    static unsigned next;
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    char *out = td_xmalloc(strlen((const char *)p) * 4 + 1), *o = out;
    while (*p) {
        size_t n = utf8_len(p);
        int c1 = n == 2 && p[0] == 0xc2 && p[1] <= 0x9f;
        if (*p < 0x20 || *p == 0x7f || c1 || (n == 0 && *p <= 0x9f)) {
            for (size_t i = 0; i < (c1 ? 2u : 1u); i++) o += sprintf(o, "\\x%02x", p[i]);
            p += c1 ? 2 : 1;
        } else {
            n = n ? n : 1;
            memcpy(o, p, n);
            o += n;
            p += n;
        }
    }
    *o = '\0';
    free(ring[next % 16]);
    ring[next++ % 16] = out;
    return out;
}

void run_cli_error(td_status st) {
    const char *msg = td_error_msg();
    fprintf(stderr, "tandem: error: %s\n", *msg ? run_cli_text(msg) : td_status_str(st));
    if (td_log_enabled(TD_LOG_DEBUG) && *td_error_trace()) fputs(td_error_trace(), stderr);
}

const char *run_cli_double(double v, char *buf, size_t nbytes) {
    if (!isfinite(v)) {
        snprintf(buf, nbytes, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        return buf;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, nbytes, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break; /* %.17g always reads back: the loop ends by then */
    }
    if (!strpbrk(buf, ".eE")) strncat(buf, ".0", nbytes - strlen(buf) - 1);
    return buf;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void json_write(FILE *out, const json_t *v, int sort_keys) {
    char num[40];
    if (json_is_real(v)) {
        fputs(run_cli_double(json_real_value(v), num, sizeof num), out);
    } else if (json_is_object(v)) {
        size_t n = 0;
        const char **keys = td_xcalloc(json_object_size(v) + 1, sizeof *keys);
        const char *k;
        json_t *item;
        json_object_foreach((json_t *)v, k, item) keys[n++] = k;
        if (sort_keys) qsort(keys, n, sizeof *keys, cmp_str);
        fputc('{', out);
        for (size_t i = 0; i < n; i++) {
            json_t *name = json_string(keys[i]);
            char *quoted = json_dumps(name, JSON_ENCODE_ANY);
            fprintf(out, "%s%s:", i ? "," : "", quoted ? quoted : "\"?\"");
            free(quoted);
            json_decref(name);
            json_write(out, json_object_get(v, keys[i]), sort_keys);
        }
        fputc('}', out);
        free(keys);
    } else if (json_is_array(v)) {
        fputc('[', out);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) fputc(',', out);
            json_write(out, json_array_get(v, i), sort_keys);
        }
        fputc(']', out);
    } else {
        char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        fputs(text ? text : "?", out);
        free(text);
    }
}

char *run_cli_json(const json_t *value, int sort_keys) {
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out) return td_xstrdup("?");
    json_write(out, value, sort_keys);
    fclose(out);
    return text;
}

char *run_cli_json_text(const char *json) {
    json_t *v = json ? json_loads(json, JSON_DECODE_ANY, NULL) : NULL;
    if (!v) return td_xstrdup(json ? json : "");
    char *text = run_cli_json(v, 0);
    json_decref(v);
    return text;
}
