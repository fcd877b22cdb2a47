/* track: the JSON lines the metrics sink and the system-metrics sampler write (src/track/jsonl.c)
 * are the bytes the ingester and the Python side expect, and any key survives the trip sink ->
 * file -> ingester -> store unchanged: quotes, backslashes, newlines, every control byte, DEL,
 * non-ASCII UTF-8. A key that is not UTF-8, or a line too long, is refused at the sink with
 * nothing written; NaN and infinities are null, no point, and the rest of their line is
 * stored. */
#include "test.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/os.h"
#include "tandem/track.h"

static char tmpdir[] = "/tmp/tandem-test-jsonl-XXXXXX";

/* The whole file; caller frees. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    char *buf = td_xcalloc(1 << 16, 1);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static off_t size_of(const char *path) {
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    return sb.st_size;
}

/* Replaces the number after each "time": in text with T, checking that it is a wall-clock time
 * taken between before and after (the sink's clock: the one part of a line a test cannot fix). */
static void mask_times(char *text, double before, double after) {
    char *p = text;
    while ((p = strstr(p, "\"time\": "))) {
        p += 8;
        char *end;
        double t = strtod(p, &end);
        ASSERT(end > p);
        ASSERT(t >= before - 1e-3 && t <= after + 1e-3);
        *p = 'T';
        memmove(p + 1, end, strlen(end) + 1);
    }
}

/* The line format, byte for byte (docs/metrics-format.md): what the ingester's and the Python
 * tests' readers were written against. */
static void test_bytes(const char *dir) {
    char *path = td_xasprintf("%s/rank-9.jsonl", dir);
    td_metrics_sink *sink;
    ASSERT_OK(td_metrics_sink_open(path, &sink));
    double before = td_wall_s();
    const char *keys[] = {"loss", "train/acc", "big", "neg"};
    double vals[] = {0.5, 0.125, 1e300, -2.0 / 3.0};
    ASSERT_OK(td_metrics_sink_log(sink, 3, 4, keys, vals));
    ASSERT_OK(td_metrics_sink_log1(sink, -4, "nan", NAN));
    ASSERT_OK(td_metrics_sink_log1(sink, 5, "inf", -INFINITY));
    /* A key named like a schema field gets a one-point line of its own; a non-finite one none. */
    const char *schema_keys[] = {"acc", "step", "value", "time"};
    double schema_vals[] = {0.25, 7, NAN, 1.5};
    ASSERT_OK(td_metrics_sink_log(sink, 6, 4, schema_keys, schema_vals));
    ASSERT_OK(td_metrics_sink_resume(sink, 2));
    ASSERT_OK(td_metrics_sink_event(sink, TD_RUN_EVENT_RESTART, 2));
    td_metrics_sink_close(sink);
    double after = td_wall_s();
    char *text = slurp(path);
    mask_times(text, before, after);
    ASSERT_STREQ(text, "{\"step\": 3, \"time\": T, \"loss\": 0.5, \"train/acc\": 0.125, "
                       "\"big\": 1e+300, \"neg\": -0.666666667}\n"
                       "{\"step\": -4, \"time\": T, \"nan\": null}\n"
                       "{\"step\": 5, \"time\": T, \"inf\": null}\n"
                       "{\"step\": 6, \"time\": T, \"acc\": 0.25}\n"
                       "{\"key\": \"step\", \"value\": 7, \"step\": 6, \"time\": T}\n"
                       "{\"key\": \"time\", \"value\": 1.5, \"step\": 6, \"time\": T}\n"
                       "{\"event\": \"resume\", \"step\": 2, \"time\": T}\n"
                       "{\"event\": \"restart\", \"step\": 2, \"time\": T}\n");
    free(text);
    unlink(path);
    free(path);
}

/* Keys with everything JSON must escape, and text it must not change. */
static const char *const odd_keys[] = {
    "quote\"d",
    "back\\slash",
    "new\nline",
    "cr\rtab\tff\fbs\b",
    "ctl \x01\x02\x1b[31m\x1f end",
    "del\x7f",
    "utf8 \xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x9a\x80",
    "\\\"\\u0041\"",
    "{\"step\": 1}",
    "slash/ok",
};

static void test_round_trip(td_rundb *store, const td_run *run, const char *dir) {
    char *path = td_xasprintf("%s/rank-2.jsonl", dir);
    td_metrics_sink *sink;
    ASSERT_OK(td_metrics_sink_open(path, &sink));
    size_t nkeys = TD_ARRAY_LEN(odd_keys);
    double vals[TD_ARRAY_LEN(odd_keys)];
    for (size_t i = 0; i < nkeys; i++) vals[i] = 0.25 * (double)(i + 1);
    /* all in one line, each alone, and one line with a NaN among them */
    ASSERT_OK(td_metrics_sink_log(sink, 1, nkeys, odd_keys, vals));
    for (size_t i = 0; i < nkeys; i++)
        ASSERT_OK(td_metrics_sink_log1(sink, 2, odd_keys[i], vals[i]));
    vals[1] = NAN;
    ASSERT_OK(td_metrics_sink_log(sink, 3, nkeys, odd_keys, vals));
    vals[1] = 0.5;

    /* Refused, nothing written: a key that is not UTF-8 (a lone continuation byte, a cut
     * sequence), and a line past the writer's bound. */
    off_t before = size_of(path);
    const char *bad[] = {"ok", "bad \xff key"};
    double two[] = {1, 2};
    ASSERT_STATUS(td_metrics_sink_log(sink, 4, 2, bad, two), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "bad \\xff key");
    ASSERT_CONTAINS(td_error_msg(), "UTF-8");
    ASSERT_STATUS(td_metrics_sink_log1(sink, 4, "cut \xe2\x9c", 1), TD_ERR_INVALID);
    enum { MANY = 300 };
    const char *many[MANY];
    double mvals[MANY];
    for (int i = 0; i < MANY; i++) {
        many[i] = "a_rather_long_metric_name/with_parts";
        mvals[i] = i;
    }
    ASSERT_STATUS(td_metrics_sink_log(sink, 4, MANY, many, mvals), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "longer than 4096 bytes");
    td_error_clear();
    ASSERT_EQ(size_of(path), before);
    td_metrics_sink_close(sink);

    /* One line per call: no newline or quote leaked out of a key. */
    char *text = slurp(path);
    size_t lines = 0;
    for (char *p = text; *p; p++) lines += *p == '\n';
    ASSERT_EQ(lines, 2 + nkeys);
    free(text);

    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run->id, dir, &ing));
    size_t n = 0;
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(td_ingester_malformed(ing), 0);
    ASSERT_EQ(n, 3 * nkeys - 1); /* the NaN is no point */
    td_ingester_free(ing);
    for (size_t i = 0; i < nkeys; i++) {
        td_metric_row *rows;
        size_t nrows;
        ASSERT_OK(td_metrics_query(store, run->id, odd_keys[i], 2, &rows, &nrows));
        if (nrows != (i == 1 ? 2u : 3u))
            TEST_FAIL("key %zu came back as %zu points, expected %u", i, nrows, i == 1 ? 2u : 3u);
        for (size_t r = 0; r < nrows; r++) {
            ASSERT_STREQ(rows[r].key, odd_keys[i]);
            ASSERT_NEAR(rows[r].value, 0.25 * (double)(i + 1), 0);
        }
        ASSERT_EQ(rows[nrows - 1].step, i == 1 ? 2 : 3);
        td_metric_rows_free(rows, nrows);
    }
    free(path);
}

/* The system-metrics sampler's lines (a node agent's sys-HOST.jsonl): the same writer, read by
 * the same ingester, one line per rank. */
static void test_sys_lines(td_rundb *store, const td_run *run, const char *dir) {
    pid_t child = fork();
    ASSERT(child >= 0);
    if (child == 0) {
        char *argv[] = {"sleep", "30", NULL};
        char *envp[] = {"RANK=5", "PATH=/usr/bin:/bin", NULL};
        execve("/bin/sleep", argv, envp);
        _exit(127);
    }
    usleep(200000);
    char *path = td_xasprintf("%s/sys-nodeX.jsonl", dir);
    td_sysmon *mon = td_sysmon_new();
    ASSERT_OK(td_sysmon_sample_to_file(mon, path, getpid(), td_wall_s() - 7.5));
    td_sysmon_free(mon);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    char *text = slurp(path);
    const char *head = "{\"rank\": 5, \"step\": 7, \"time\": ";
    if (strncmp(text, head, strlen(head)) || !strstr(text, ", \"sys/cpu_percent\": ") ||
        !strstr(text, ", \"sys/rss_mb\": ") || strcmp(text + strlen(text) - 2, "}\n"))
        TEST_FAIL("sys line: %s", text);
    free(text);
    td_ingester *ing;
    ASSERT_OK(td_ingester_new(store, run->id, dir, &ing));
    size_t n = 0;
    ASSERT_OK(td_ingester_poll(ing, &n));
    ASSERT_EQ(td_ingester_malformed(ing), 0);
    ASSERT_GE(n, 2);
    td_ingester_free(ing);
    td_metric_row *rows;
    size_t nrows;
    ASSERT_OK(td_metrics_query(store, run->id, "sys/rss_mb", 5, &rows, &nrows));
    ASSERT_EQ(nrows, 1);
    ASSERT_EQ(rows[0].step, 7);
    ASSERT_GT(rows[0].value, 0);
    td_metric_rows_free(rows, nrows);
    free(path);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir) != NULL);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    td_run run;
    td_run_spec spec = {.workflow = "jsonl",
                        .command = "true",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = 2};
    ASSERT_OK(td_run_create(store, &spec, &run));
    char *dir = td_xasprintf("%s/metrics", run.run_dir);
    ASSERT_OK(td_mkdirs(dir));
    test_bytes(dir);
    test_round_trip(store, &run, dir);
    test_sys_lines(store, &run, dir);
    free(dir);
    td_run_clear(&run);
    td_rundb_close(store);
    char *cmd = td_xasprintf("rm -rf '%s'", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
