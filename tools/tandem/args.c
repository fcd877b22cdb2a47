/* The argument parser of the tandem commands: see args.h. */
#include "args.h"

#include <stdarg.h>
#include <string.h>

void cli_init(cli_parser *p, const cli_command *cmd, int argc, char **argv) {
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->argc = argc;
    p->argv = argv;
    p->next = 1; /* argv[0] is the command's name */
}

int cli_error(const cli_command *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    /* The hint on a line of its own, and one that does not start with "tandem": a launcher
     * reports a worker's last line that says it failed (src/launch/workers.c), which must stay
     * the error itself. */
    fprintf(stderr, "\n(see '%s --help')\n", cmd->name);
    return 2;
}

static int fail(cli_parser *p, const char *fmt, ...) TD_PRINTF(2, 3);
static int fail(cli_parser *p, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->exit_code = cli_error(p->cmd, "%s", msg);
    return CLI_EXIT;
}

/* Whether the long option `name` is written as the n bytes at s. */
static int long_matches(const cli_command *cmd, const char *name, const char *s, size_t n) {
    if (strlen(name) != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '_' && (cmd->flags & CLI_UNDERSCORES)) c = '-';
        if (c != name[i]) return 0;
    }
    return 1;
}

/* Records the option at index k of the table as given with value (NULL for a flag). Given
 * again, a value option's later value wins, as with getopt and argparse: a script's defaults
 * followed by the user's own (`tandem train $DEFAULTS --model basicnet`) mean the user's. */
static int take(cli_parser *p, size_t k, const char *value) {
    const cli_opt *o = &p->cmd->opts[k];
    p->value = value;
    return o->id;
}

/* --name, --name=value, --name value */
static int next_long(cli_parser *p, const char *a) {
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    for (size_t k = 0; p->cmd->opts[k].id; k++) {
        const cli_opt *o = &p->cmd->opts[k];
        if (!o->name || !long_matches(p->cmd, o->name, name, n)) continue;
        if (!o->value) {
            if (eq) return fail(p, "--%s takes no value (got '%s')", o->name, a);
            return take(p, k, NULL);
        }
        if (eq) return take(p, k, eq + 1);
        if (p->next >= p->argc) return fail(p, "%s needs a value: %s %s", a, a, o->value);
        return take(p, k, p->argv[p->next++]);
    }
    if (long_matches(p->cmd, "help", name, n) && !eq) {
        cli_help(p->cmd, stdout);
        p->exit_code = 0;
        return CLI_EXIT;
    }
    return fail(p, "unknown option '%.*s'", (int)(n + 2), a);
}

/* -x, -x value, -xvalue */
static int next_short(cli_parser *p, const char *a) {
    for (size_t k = 0; p->cmd->opts[k].id; k++) {
        const cli_opt *o = &p->cmd->opts[k];
        if (!o->short_name || o->short_name != a[1]) continue;
        if (!o->value) {
            if (a[2]) break; /* -xy: no bundled flags */
            return take(p, k, NULL);
        }
        if (a[2]) return take(p, k, a + 2);
        if (p->next >= p->argc) return fail(p, "%s needs a value: %s %s", a, a, o->value);
        return take(p, k, p->argv[p->next++]);
    }
    if (!strcmp(a, "-h")) {
        cli_help(p->cmd, stdout);
        p->exit_code = 0;
        return CLI_EXIT;
    }
    return fail(p, "unknown option '%s'", a);
}

int cli_next(cli_parser *p) {
    p->value = p->given = NULL;
    if (p->next >= p->argc) return CLI_END;
    const char *a = p->argv[p->next];
    int positional = p->options_done || a[0] != '-' || !strcmp(a, "-");
    if (positional && (p->cmd->flags & CLI_STOP_AT_ARG)) return CLI_END;
    p->next++;
    if (positional) {
        p->value = a;
        return CLI_ARG;
    }
    if (!strcmp(a, "--")) {
        if (p->cmd->flags & CLI_STOP_AT_ARG) return CLI_END;
        p->options_done = 1;
        return cli_next(p);
    }
    p->given = a;
    if (a[1] == '-') {
        const char *eq = strchr(a, '=');
        snprintf(p->given_buf, sizeof p->given_buf, "%.*s", (int)(eq ? eq - a : (long)strlen(a)),
                 a);
        p->given = p->given_buf;
        return next_long(p, a);
    }
    /* "-t" of -t9: a message naming the option and then its value must not repeat the value */
    snprintf(p->given_buf, sizeof p->given_buf, "%.2s", a);
    p->given = p->given_buf;
    return next_short(p, a);
}

void cli_usage(const cli_command *cmd, FILE *out) {
    const char *u = cmd->usage;
    for (int first = 1;; first = 0) {
        const char *nl = strchr(u, '\n');
        fprintf(out, "%s%s %.*s\n", first ? "usage: " : "       ", cmd->name,
                (int)(nl ? nl - u : (long)strlen(u)), u);
        if (!nl || !nl[1]) break;
        u = nl + 1;
    }
}

/* "  -f, --file FILE" / "      --param KEY=VALUE" */
static int opt_spec(const cli_opt *o, char *out, size_t cap) {
    int n = snprintf(out, cap, "  %c%c%s", o->short_name ? '-' : ' ',
                     o->short_name ? o->short_name : ' ', o->short_name && o->name ? ", " : "  ");
    if (o->name) n += snprintf(out + n, cap - (size_t)n, "--%s", o->name);
    if (o->value) n += snprintf(out + n, cap - (size_t)n, " %s", o->value);
    return n;
}

/* The help column starts here, or after the longest option that is shorter. */
#define HELP_COLUMN_MAX 26

void cli_help(const cli_command *cmd, FILE *out) {
    static const cli_opt help_opt = {1, "help", 'h', NULL, "print this help", 0};
    cli_usage(cmd, out);
    if (cmd->about) fprintf(out, "\n%s", cmd->about);
    char spec[160];
    int col = opt_spec(&help_opt, spec, sizeof spec);
    for (const cli_opt *o = cmd->opts; o->id; o++) {
        int n = opt_spec(o, spec, sizeof spec);
        if (o->help && n > col && n + 2 <= HELP_COLUMN_MAX) col = n;
    }
    col += 2;
    fputc('\n', out);
    for (const cli_opt *o = cmd->opts;; o++) {
        const cli_opt *shown = o->id ? o : &help_opt;
        if (shown->help) {
            int n = opt_spec(shown, spec, sizeof spec);
            const char *h = shown->help;
            if (n + 2 > col) { /* too long for the column: its help on the next line */
                fprintf(out, "%s\n", spec);
                spec[0] = '\0';
            }
            for (int first = 1;; first = 0) {
                const char *nl = strchr(h, '\n');
                fprintf(out, "%-*s%.*s\n", col, first ? spec : "",
                        (int)(nl ? nl - h : (long)strlen(h)), h);
                if (!nl) break;
                h = nl + 1;
            }
        }
        if (!o->id) break;
    }
    if (cmd->epilog) fprintf(out, "\n%s", cmd->epilog);
}
