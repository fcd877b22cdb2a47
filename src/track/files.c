/* The names of the workers' files in a run directory: RUN/metrics/rank-<R>.jsonl (their metrics,
 * docs/metrics-format.md) and RUN/logs/rank-<R>.log (their output). Made and read here only, so
 * that no layer grows a parser of its own. */
#include "store_internal.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* "rank-<R><ext>" -> R (digits, below TD_METRICS_MAX_RANK); -1 for any other name. */
static int rank_file(const char *name, const char *ext) {
    if (!name || strncmp(name, "rank-", 5)) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return -1;
    long r = 0;
    while (*p >= '0' && *p <= '9' && r < TD_METRICS_MAX_RANK) r = r * 10 + (*p++ - '0');
    return r < TD_METRICS_MAX_RANK && !strcmp(p, ext) ? (int)r : -1;
}

char *td_metrics_file_name(int rank) {
    return td_xasprintf("rank-%d.jsonl", rank);
}

int td_metrics_file_rank(const char *name) {
    return rank_file(name, ".jsonl");
}

int td_metrics_file_is_system(const char *name) {
    size_t n = name ? strlen(name) : 0;
    return n && (!strcmp(name, "sys.jsonl") ||
                 (!strncmp(name, "sys-", 4) && n > 10 && !strcmp(name + n - 6, ".jsonl")));
}

int td_log_file_rank(const char *name) {
    return rank_file(name, ".log");
}

int td__is_run_dir_name(const char *name) {
    return name[0] != '.' && td__run_number(name) > 0;
}

int td__runs_dir_has_runs(const char *store_dir) {
    char *runs = td_xasprintf("%s/runs", store_dir);
    DIR *d = opendir(runs);
    int found = 0;
    if (d) {
        struct dirent *e;
        while (!found && (e = readdir(d))) {
            if (!td__is_run_dir_name(e->d_name)) continue;
            char *p = td_xasprintf("%s/%s", runs, e->d_name);
            struct stat sb;
            found = stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
            free(p);
        }
        closedir(d);
    }
    free(runs);
    return found;
}

/* A run supervised elsewhere (its controller: remote.c) has RUN/remote.json; liveness asks it
 * too, so it lives here, below both. */
int td_run_is_remote(const td_run *run) {
    if (!run || !run->run_dir) return 0;
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_REMOTE);
    struct stat sb;
    int remote = lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
    free(path);
    return remote;
}
