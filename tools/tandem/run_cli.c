/* The shared part of the run verbs: see run_cli.h. */
#include "run_cli.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

int run_cli_arg(const run_cli_verb *verb, const char *arg, const char **id) {
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
        printf("usage: %s %s\n\n%s", verb->name, verb->args, verb->help);
        return 0;
    }
    if (arg[0] != '-' && !*id) {
        *id = arg;
        return -1;
    }
    return run_cli_usage_error(verb);
}

int run_cli_usage_error(const run_cli_verb *verb) {
    fprintf(stderr, "usage: %s %s\n", verb->name, verb->args);
    return 2;
}

int run_cli_rank(const run_cli_verb *verb, const char *value, int *rank) {
    int64_t r;
    if (td_parse_i64("--rank", value, &r) != TD_OK || r < 0 || r > INT_MAX) {
        fprintf(stderr, "%s: --rank expects an integer >= 0\n", verb->name);
        return 2;
    }
    *rank = (int)r;
    return -1;
}

int run_cli_open_store(td_rundb **store) {
    td_status st = td_rundb_open(NULL, store);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    return 0;
}

int run_cli_open_run(const run_cli_verb *verb, const char *id, td_rundb **store, td_run *run) {
    if (!id) return run_cli_usage_error(verb);
    int rc = run_cli_open_store(store);
    if (rc) return rc;
    td_status st = td_run_find(*store, id, run);
    if (st != TD_OK) {
        td_error_print(st);
        td_rundb_close(*store);
        return 2;
    }
    return 0;
}

void run_cli_close(td_rundb *store, td_run *run) {
    if (run) td_run_clear(run);
    td_rundb_close(store);
}
