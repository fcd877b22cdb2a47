/* The run store of the `tandem ui` benchmark (bench/bench_ui.sh), written through the real track
 * API (td_run_create, td_metrics_insert, td_run_set_status), so its schema is the store's own.
 *
 *   ui_store_gen PROJECT_DIR [SMALL_RUNS] [BIG_POINTS] [WIDE_KEYS]
 *
 * Makes PROJECT_DIR/.tandem with SMALL_RUNS (default 99) finished runs of workflow "sweep"
 * (2 ranks x 5 keys x 1,000 steps each, params lr/batch/seed) and then one run of workflow
 * "big" with BIG_POINTS (default 1,000,000) points over 10 keys and 2 ranks (train/loss with
 * rare spikes, train/acc, test/loss, test/acc, lr, grad_norm, samples_per_s, sys/cpu_percent,
 * sys/rss_mb, sys/gpu_util_percent), 0.05 s of wall time per step, and a log per rank.
 * BIG_POINTS 0 makes no big run. With WIDE_KEYS > 0, first one run of workflow "wide" with that
 * many metric keys (train/loss, test/acc, train/to_zero: 1 then 0, and grad/layer000000 ... on
 * rank 0, 10 steps each;
 * what a per-layer logger makes) whose id is printed as "wide ID". Prints the big run's id last
 * (when there is one). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tandem/track.h"

static void check(td_status st) {
    if (st != TD_OK) {
        td_error_print(st);
        exit(1);
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* xorshift64*, [0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define NKEYS 10
static const char *const big_keys[NKEYS] = {
    "train/loss", "train/acc",     "test/loss",       "test/acc",   "lr",
    "grad_norm",  "samples_per_s", "sys/cpu_percent", "sys/rss_mb", "sys/gpu_util_percent"};

static double value(int key, int rank, int64_t step, int64_t steps, double lr0) {
    double p = (double)step / (double)steps;
    double noise = urand() - 0.5;
    double loss = 2.3 * exp(-6.0 * p) + 0.08 + 0.03 * rank;
    switch (key) {
    case 0: /* spikes every ~9973 steps: the downsampler must keep them */
        return loss * (1 + 0.25 * noise) * (step % 9973 == 4000 ? 4.0 : 1.0);
    case 1:
        return fmin(1.0, 1.0 - loss / 2.6 + 0.02 * noise);
    case 2:
        return loss * 1.08 + 0.01 * noise;
    case 3:
        return fmin(1.0, 1.0 - loss / 2.4 + 0.01 * noise);
    case 4:
        return lr0 * 0.5 * (1 + cos(M_PI * p));
    case 5:
        return 1.5 * exp(-3 * p) + 0.3 + 0.4 * fabs(noise) + (urand() < 1e-4 ? 20.0 : 0.0);
    case 6:
        return 5200 + 300 * noise - 150 * rank;
    case 7:
        return 97 + 6 * noise;
    case 8:
        return 1800 + 400 * p + 30 * noise + 120 * rank;
    default:
        return 88 + 10 * noise;
    }
}

static void finish(td_rundb *db, const char *id) {
    check(td_run_set_status(db, id, TD_RUN_RUNNING, -2, NULL));
    check(td_run_set_status(db, id, TD_RUN_SUCCEEDED, 0, NULL));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ui_store_gen PROJECT_DIR [SMALL_RUNS] [BIG_POINTS]\n");
        return 2;
    }
    const char *project = argv[1];
    int small_runs = argc > 2 ? atoi(argv[2]) : 99;
    int64_t big_points = argc > 3 ? atoll(argv[3]) : 1000000;
    int64_t wide_keys = argc > 4 ? atoll(argv[4]) : 0;
    td_rundb *db;
    check(td_rundb_open(project, &db));

    enum { BATCH = 100000 };
    td_metric_point *pts = malloc(sizeof(*pts) * BATCH);
    if (!pts) return 1;
    double t_start = wall_now() - 3600.0 * 24;

    /* The sweep: small finished runs. */
    const char *small_keys[5] = {"train/loss", "train/acc", "test/acc", "lr", "sys/cpu_percent"};
    const int64_t small_steps = 1000;
    for (int r = 0; r < small_runs; r++) {
        double lr = 0.001 * (1 + r % 10);
        char *params =
            td_xasprintf("{\"lr\": %g, \"batch\": %d, \"seed\": %d}", lr, 32 << (r % 3), r);
        td_run_spec spec = {.workflow = "sweep",
                            .command = "python3 train.py",
                            .params_json = params,
                            .nodes = 1,
                            .nproc_per_node = 2};
        td_run run;
        check(td_run_create(db, &spec, &run));
        size_t n = 0;
        for (int64_t s = 0; s < small_steps; s++)
            for (int rank = 0; rank < 2; rank++)
                for (int k = 0; k < 5; k++) {
                    int key = k == 2 ? 3 : k == 3 ? 4 : k == 4 ? 7 : k;
                    pts[n++] = (td_metric_point){rank, small_keys[k], s,
                                                 value(key, rank, s, small_steps, lr),
                                                 t_start + r * 600 + s * 0.5};
                }
        check(td_metrics_insert(db, run.id, pts, n));
        finish(db, run.id);
        td_run_clear(&run);
        free(params);
    }

    /* The wide run: many keys, few points each. */
    if (wide_keys > 0) {
        enum { WIDE_STEPS = 10 };
        td_run_spec wspec = {.workflow = "wide",
                             .command = "python3 train.py --log-every-layer",
                             .params_json = "{\"lr\": 0.01}",
                             .nodes = 1,
                             .nproc_per_node = 1};
        td_run run;
        check(td_run_create(db, &wspec, &run));
        char name[64];
        char **names = malloc(sizeof(char *) * (size_t)wide_keys);
        if (!names) return 1;
        for (int64_t k = 0; k < wide_keys; k++) {
            if (k == 0)
                snprintf(name, sizeof name, "train/loss");
            else if (k == 1)
                snprintf(name, sizeof name, "test/acc");
            else if (k == 2)
                snprintf(name, sizeof name, "train/to_zero");
            else
                snprintf(name, sizeof name, "grad/layer%06lld", (long long)(k - 3));
            names[k] = td_xstrdup(name);
        }
        /* 250 keys per connection: a connection's key cache is a list searched in order
         * (src/track/metrics.c), so 100,000 keys through one connection take minutes. */
        enum { KEYS_PER_CONN = 250 };
        size_t n = 0;
        td_rundb *wdb = NULL;
        for (int64_t k = 0; k < wide_keys; k++) {
            if (k % KEYS_PER_CONN == 0) {
                if (n) check(td_metrics_insert(wdb, run.id, pts, n));
                n = 0;
                if (wdb) td_rundb_close(wdb);
                check(td_rundb_open(project, &wdb));
            }
            for (int64_t s = 0; s < WIDE_STEPS; s++) {
                double v = k == 1   ? 0.5 + 0.04 * (double)s
                           : k == 2 ? (s == 0 ? 1.0 : 0.0) /* smoothed, a residual of ~1e-100 */
                                    : exp(-0.2 * (double)s) * (1 + 0.01 * (double)(k % 97));
                pts[n++] = (td_metric_point){0, names[k], s, v, t_start + 3600 + (double)s};
            }
        }
        if (n) check(td_metrics_insert(wdb, run.id, pts, n));
        if (wdb) td_rundb_close(wdb);
        finish(db, run.id);
        for (int64_t k = 0; k < wide_keys; k++) free(names[k]);
        free(names);
        fprintf(stderr, "ui_store_gen: %s with %lld keys\n", run.id, (long long)wide_keys);
        printf("wide %s\n", run.id);
        td_run_clear(&run);
    }
    if (big_points <= 0) {
        free(pts);
        td_rundb_close(db);
        return 0;
    }

    /* The big run. */
    td_run_spec spec = {.workflow = "big",
                        .command = "tandem train --model basicnet",
                        .params_json = "{\"lr\": 0.1, \"batch\": 64}",
                        .nodes = 1,
                        .nproc_per_node = 2};
    td_run run;
    check(td_run_create(db, &spec, &run));
    int64_t steps = big_points / (NKEYS * 2);
    if (steps < 1) steps = 1;
    double t0 = wall_now() - steps * 0.05;
    size_t n = 0;
    for (int64_t s = 0; s < steps; s++) {
        for (int rank = 0; rank < 2; rank++)
            for (int k = 0; k < NKEYS; k++)
                pts[n++] = (td_metric_point){rank, big_keys[k], s, value(k, rank, s, steps, 0.1),
                                             t0 + s * 0.05 + rank * 0.001};
        if (n + NKEYS * 2 > BATCH || s == steps - 1) {
            check(td_metrics_insert(db, run.id, pts, n));
            n = 0;
        }
    }
    for (int rank = 0; rank < 2; rank++) {
        char *path = td_xasprintf("%s/logs/rank-%d.log", run.run_dir, rank);
        FILE *f = fopen(path, "w");
        if (!f) return 1;
        for (int64_t s = 0; s < steps; s += 500)
            fprintf(f, "[rank %d] step %lld loss %.4f\n", rank, (long long)s,
                    value(0, rank, s, steps, 0.1));
        fprintf(f, "[rank %d] done after %lld steps\n", rank, (long long)steps);
        fclose(f);
        free(path);
    }
    td_log_file *logs;
    size_t nlogs;
    check(td_logs_scan(db, &run, &logs, &nlogs));
    td_log_files_free(logs, nlogs);
    finish(db, run.id);
    int64_t count;
    check(td_metrics_count(db, run.id, &count));
    fprintf(stderr, "ui_store_gen: %d small runs, %s with %lld points\n", small_runs, run.id,
            (long long)count);
    printf("%s\n", run.id);
    td_run_clear(&run);
    free(pts);
    td_rundb_close(db);
    return 0;
}
