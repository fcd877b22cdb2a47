/* The detached run's store push (src/exec/remote_store.c): a changed file is sent again only
 * once the bytes-per-second bound allows (td__push_due), the end's push sends everything.
 * 1. The decision itself, at the edges: never sent, no bound, a small file, a 20 MiB file 2 s
 *    and 80 s after its last send, the end.
 * 2. The measure, through the real push walk (td__remote_push over a run directory, the S3 put
 *    replaced by a counter): a run whose metrics file grows to 20 MiB in 100 passes of 2 s (a
 *    200 s run), pushed without the bound (as before it) and with it, in the same process. With
 *    it, the bytes sent stay within rate x duration + the file once, and the end's push leaves the
 *    whole file in the store; without it, every pass re-sends the whole file (the sum of its
 *    sizes), which the test computes independently of the push.
 * 3. The record's end goes only with the end's pass (record_end). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/controller.h"
#include "tandem/os.h"

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define MiB (1024.0 * 1024.0)

static void decisions(void) {
    td__pushed never = {.size = -1};
    CHECK(td__push_due(&never, 20 * (int64_t)MiB, 0.0, 0, false), "a file never sent goes now");
    td__pushed f = {.size = 1000, .sent_s = 100.0};
    /* no bound (< 0): every change at the next pass, as before the bound */
    CHECK(td__push_due(&f, 20 * (int64_t)MiB, 102.0, -1, false), "no bound: sent");
    /* a small file (100 KiB) changed 2 s after its last send: under 2 s x 256 KiB/s */
    CHECK(td__push_due(&f, 100 * 1024, 102.0, 0, false), "100 KiB after 2 s: sent");
    /* 20 MiB at the default 256 KiB/s: 80 s between sends */
    CHECK(!td__push_due(&f, 20 * (int64_t)MiB, 102.0, 0, false), "20 MiB after 2 s: deferred");
    CHECK(!td__push_due(&f, 20 * (int64_t)MiB, 179.0, 0, false), "20 MiB after 79 s: deferred");
    CHECK(td__push_due(&f, 20 * (int64_t)MiB, 180.0, 0, false), "20 MiB after 80 s: sent");
    CHECK(TD__PUSH_BYTES_PER_S == 256.0 * 1024, "the default rate is %.0f B/s",
          TD__PUSH_BYTES_PER_S);
    /* the end: everything, whatever the bound */
    CHECK(td__push_due(&f, 20 * (int64_t)MiB, 100.5, 0, true), "the end's push: sent");
    /* another rate: 1 MiB/s sends 20 MiB every 20 s */
    CHECK(!td__push_due(&f, 20 * (int64_t)MiB, 119.0, MiB, false), "1 MiB/s, 19 s: deferred");
    CHECK(td__push_due(&f, 20 * (int64_t)MiB, 120.0, MiB, false), "1 MiB/s, 20 s: sent");
}

/* The S3 put, counted: bytes, and the last size sent of the metrics file. */
typedef struct {
    int64_t nbytes, puts, metrics_last;
} counter;

static td_status count_put(void *user, const char *key, const char *path, int64_t nbytes) {
    counter *c = user;
    struct stat sb;
    if (stat(path, &sb) != 0 || (int64_t)sb.st_size != nbytes)
        return td_error(TD_ERR_IO, "the copy aside %s is not %lld bytes", path, (long long)nbytes);
    c->nbytes += nbytes;
    c->puts++;
    if (strstr(key, "/run/metrics/rank-0.jsonl")) c->metrics_last = nbytes;
    return TD_OK;
}

#define PASSES  100
#define PERIOD  2.0
#define TARGET  (20 * 1024 * 1024)

/* One simulated run: the metrics file grows by TARGET / PASSES per pass; a pass every PERIOD s
 * of the push's clock; the end's push at the end. *expected_unbounded: the sum of the file's
 * sizes at each pass (what re-sending it whole every pass costs), computed here. */
static void simulate(const char *root, double bytes_per_s, counter *out, int64_t *file_size,
                     int64_t *expected_unbounded, size_t *deferred) {
    char *run_dir = td_xasprintf("%s/run-%s", root, bytes_per_s < 0 ? "unbounded" : "bounded");
    char *metrics = td_xasprintf("%s/metrics", run_dir);
    char *staging = td_xasprintf("%s/staging-%s", root, bytes_per_s < 0 ? "u" : "b");
    CHECK(td_mkdirs(metrics) == TD_OK && td_mkdirs(staging) == TD_OK, "%s", td_error_msg());
    char *rank0 = td_xasprintf("%s/rank-0.jsonl", metrics);
    char *record = td_xasprintf("%s/run.json", run_dir);
    FILE *rj = fopen(record, "w");
    if (rj) {
        fputs("{\"id\": \"sim-1\", \"status\": \"running\"}\n", rj);
        fclose(rj);
    }
    counter c = {0};
    td__push p = {.prefix = "store", .staging = staging, .bytes_per_s = bytes_per_s,
                  .put = count_put, .put_user = &c};
    char line[128];
    int len = snprintf(line, sizeof line, "{\"k\": \"train/loss\", \"step\": 0, \"v\": 0.5}\n");
    int64_t size = 0, sum = 0;
    size_t ndeferred = 0;
    double now = 1000.0;
    FILE *f = fopen(rank0, "a");
    CHECK(f != NULL, "%s: %s", rank0, strerror(errno));
    for (int pass = 0; f && pass < PASSES; pass++) {
        int64_t goal = (int64_t)TARGET * (pass + 1) / PASSES;
        while (size < goal) {
            fwrite(line, 1, (size_t)len, f);
            size += len;
        }
        fflush(f);
        sum += size; /* unbounded: the whole file again */
        td_status st = td__remote_push(&p, run_dir, now, false);
        CHECK(st == TD_OK, "pass %d: %s", pass, td_error_msg());
        ndeferred += p.ndeferred;
        now += PERIOD;
    }
    if (f) fclose(f);
    td_status st = td__remote_push(&p, run_dir, now, true);
    CHECK(st == TD_OK, "the end's push: %s", td_error_msg());
    CHECK(p.nbytes_sent == c.nbytes, "the push counts %lld bytes, the counter %lld",
          (long long)p.nbytes_sent, (long long)c.nbytes);
    td__remote_push_free(&p);
    *out = c;
    *file_size = size;
    *expected_unbounded = sum;
    *deferred = ndeferred;
    unlink(rank0);
    unlink(record);
    rmdir(metrics);
    rmdir(run_dir);
    rmdir(staging);
    free(rank0);
    free(record);
    free(metrics);
    free(run_dir);
    free(staging);
}

static void measure(void) {
    char tmpl[] = "/tmp/tandem-push-test-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL, "mkdtemp: %s", strerror(errno));
    counter before, after;
    int64_t size_b, size_a, sum_b, sum_a;
    size_t def_b, def_a;
    simulate(tmpl, -1, &before, &size_b, &sum_b, &def_b);
    simulate(tmpl, 0, &after, &size_a, &sum_a, &def_a);
    rmdir(tmpl);
    double duration = PASSES * PERIOD;
    /* the peer: the push as it was, every change whole at every pass */
    CHECK(before.nbytes >= sum_b, "unbounded: %lld bytes sent, the file's sizes sum to %lld",
          (long long)before.nbytes, (long long)sum_b);
    CHECK(def_b == 0, "unbounded: %zu changes deferred", def_b);
    /* bounded: rate x duration, plus the file once (its first send and the end's), plus the
     * small run.json at every pass */
    double bound = TD__PUSH_BYTES_PER_S * duration + 2.0 * (double)size_a + 64.0 * (PASSES + 1);
    CHECK((double)after.nbytes <= bound, "bounded: %lld bytes sent over %.0f s, above %.0f",
          (long long)after.nbytes, duration, bound);
    CHECK(def_a > 0, "bounded: nothing was deferred");
    /* the end is complete: the whole file went last */
    CHECK(after.metrics_last == size_a, "the end's push sent %lld bytes of the %lld-byte file",
          (long long)after.metrics_last, (long long)size_a);
    CHECK(before.metrics_last == size_b, "unbounded end: %lld of %lld",
          (long long)before.metrics_last, (long long)size_b);
    printf("bytes pushed for a metrics file growing to %.1f MiB in %.0f s (%d passes of %.0f s):\n"
           "  unbounded (before): %8.1f MiB in %lld puts (%.1f MiB/min)\n"
           "  bounded   (after):  %8.1f MiB in %lld puts (%.1f MiB/min; %.0f KiB/s per file)\n"
           "  ratio before/after: %.1f x; the end's push: the whole %.1f MiB file\n",
           (double)size_a / MiB, duration, PASSES, PERIOD, (double)before.nbytes / MiB,
           (long long)before.puts, (double)before.nbytes / MiB / (duration / 60.0),
           (double)after.nbytes / MiB, (long long)after.puts,
           (double)after.nbytes / MiB / (duration / 60.0), TD__PUSH_BYTES_PER_S / 1024.0,
           (double)before.nbytes / (double)after.nbytes, (double)after.metrics_last / MiB);
}

/* The record's end waits for the end's pass: a pass as the run goes sends run.json while it
 * says running, holds it back once it says the run ended (the controller adds its own line to
 * instances.json after that, and a reader takes the end as everything), and the end's pass
 * sends it. */
typedef struct {
    int record_puts;
} record_counter;

static td_status count_record(void *user, const char *key, const char *path, int64_t nbytes) {
    (void)path, (void)nbytes;
    record_counter *c = user;
    size_t n = strlen(key);
    if (n >= 13 && !strcmp(key + n - 13, "/run/run.json")) c->record_puts++;
    return TD_OK;
}

static void write_record(const char *run_dir, const char *status) {
    char *record = td_xasprintf("%s/run.json", run_dir);
    FILE *f = fopen(record, "w");
    CHECK(f != NULL, "%s: %s", record, strerror(errno));
    if (f) {
        fprintf(f, "{\"id\": \"end-1\", \"status\": \"%s\"}\n", status);
        fclose(f);
    }
    free(record);
}

static void record_end(void) {
    char tmpl[] = "/tmp/tandem-push-end-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL, "mkdtemp: %s", strerror(errno));
    char *run_dir = td_xasprintf("%s/run", tmpl), *staging = td_xasprintf("%s/staging", tmpl);
    CHECK(td_mkdirs(run_dir) == TD_OK && td_mkdirs(staging) == TD_OK, "%s", td_error_msg());
    record_counter c = {0};
    td__push p = {.prefix = "store", .staging = staging, .bytes_per_s = -1,
                  .put = count_record, .put_user = &c};
    write_record(run_dir, "running");
    CHECK(td__remote_push(&p, run_dir, 10.0, false) == TD_OK, "%s", td_error_msg());
    CHECK(c.record_puts == 1, "a running record: %d puts of run.json, not 1", c.record_puts);
    write_record(run_dir, "succeeded");
    CHECK(td__remote_push(&p, run_dir, 12.0, false) == TD_OK, "%s", td_error_msg());
    CHECK(c.record_puts == 1, "the ended record went with a pass as the run goes");
    CHECK(p.ndeferred == 1, "the ended record held back: %zu deferred, not 1", p.ndeferred);
    CHECK(td__remote_push(&p, run_dir, 14.0, true) == TD_OK, "%s", td_error_msg());
    CHECK(c.record_puts == 2, "the end's pass did not send the ended record (%d puts)",
          c.record_puts);
    td__remote_push_free(&p);
    char *record = td_xasprintf("%s/run.json", run_dir);
    unlink(record);
    rmdir(run_dir);
    rmdir(staging);
    rmdir(tmpl);
    free(record);
    free(run_dir);
    free(staging);
}

int main(void) {
    decisions();
    measure();
    record_end();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
