/* Metrics ingest throughput through the real path: 4 writer processes append JSON lines
 * (the td_metrics_sink format) to rank-<R>.jsonl while one ingester tails them into the run
 * store, exactly as the `tandem run` supervisor does. Prints points/s for two line shapes.
 *
 * usage: bench_track [points_per_writer] (default 100000) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/track.h"

#define NWRITERS 4

static void die(td_status st) {
    td_error_print(st);
    exit(1);
}

/* Writers log `npoints` points each, `keys_per_line` keys per line, as fast as they can. */
static void spawn_writers(const char *dir, int npoints, int keys_per_line, pid_t *pids) {
    for (int r = 0; r < NWRITERS; r++) {
        pids[r] = fork();
        if (pids[r] != 0) continue;
        char *path = td_xasprintf("%s/rank-%d.jsonl", dir, r);
        td_metrics_sink *sink;
        if (td_metrics_sink_open(path, &sink) != TD_OK) _exit(1);
        const char *keys[] = {"loss", "acc", "lr", "grad_norm"};
        double vals[4];
        for (int step = 0; step < npoints / keys_per_line; step++) {
            for (int k = 0; k < keys_per_line; k++) vals[k] = 1.0 / (step + k + 1);
            if (td_metrics_sink_log(sink, step, (size_t)keys_per_line, keys, vals) != TD_OK)
                _exit(1);
        }
        td_metrics_sink_close(sink);
        _exit(0);
    }
}

static double run_case(const char *project, int npoints, int keys_per_line) {
    td_rundb *db;
    td_status st = td_rundb_open(project, &db);
    if (st != TD_OK) die(st);
    td_run run;
    td_run_spec spec = {.workflow = "bench",
                        .command = "bench",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = NWRITERS};
    if ((st = td_run_create(db, &spec, &run)) != TD_OK) die(st);
    char *dir = td_xasprintf("%s/metrics", run.run_dir);
    td_ingester *ing;
    if ((st = td_ingester_new(db, run.id, dir, &ing)) != TD_OK) die(st);
    int64_t expected = (int64_t)NWRITERS * (npoints / keys_per_line) * keys_per_line;
    pid_t pids[NWRITERS];
    double t0 = td_now_s();
    spawn_writers(dir, npoints, keys_per_line, pids);
    int64_t total = 0;
    int writers_left = NWRITERS;
    while (total < expected) {
        size_t n = 0;
        if ((st = td_ingester_poll(ing, &n)) != TD_OK) die(st);
        total += (int64_t)n;
        for (int r = 0; r < NWRITERS && writers_left; r++) {
            int status;
            if (pids[r] > 0 && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
                pids[r] = 0;
                writers_left--;
            }
        }
        if (n == 0) usleep(2000);
    }
    double dt = td_now_s() - t0;
    for (int r = 0; r < NWRITERS; r++)
        if (pids[r] > 0) waitpid(pids[r], NULL, 0);
    int64_t stored;
    if ((st = td_metrics_count(db, run.id, &stored)) != TD_OK) die(st);
    double rate = (double)stored / dt;
    printf("%-28s %10lld points %8.3f s %12.0f points/s  stored %lld%s\n",
           keys_per_line == 1 ? "1 key per line" : "4 keys per line", (long long)expected, dt, rate,
           (long long)stored, stored == expected ? "" : "  MISMATCH");
    td_ingester_free(ing);
    free(dir);
    td_run_clear(&run);
    td_rundb_close(db);
    if (stored != expected) exit(1);
    return rate;
}

int main(int argc, char **argv) {
    int npoints = argc > 1 ? atoi(argv[1]) : 100000;
    if (npoints < 4) npoints = 4;
    char project[] = "/tmp/tandem-bench-track-XXXXXX";
    if (!mkdtemp(project)) return 1;
    printf("metrics ingest: %d writer processes x %d points -> one ingester -> SQLite (WAL)\n",
           NWRITERS, npoints);
    double r1 = run_case(project, npoints, 1);
    double r4 = run_case(project, npoints, 4);
    printf("result: %.0f points/s (1 key/line), %.0f points/s (4 keys/line); target >= 100000\n",
           r1, r4);
    char *cmd = td_xasprintf("rm -rf '%s'", project);
    int rc = system(cmd);
    free(cmd);
    return rc == 0 ? 0 : 1;
}
