/* The Python SDK's end records (python/tandem/_run.py, SDK_END_RECORD): each rank appends one
 * JSON line to RUN/metrics/sdk-end-RANK.jsonl when its script finished its run (tandem.finish)
 * and when a SIGTERM killed a script that never asks tandem.should_stop(). The metrics directory
 * travels over a node's link, so a remote rank's lines arrive here as its metrics do. The
 * supervisor reads them for two things (docs/runs.md, "How the workers ended"): a worker that
 * finished and hangs at exit, and what a stop really did to each rank. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/internal.h"

/* A file of lines, at most this much of its end is read (a rank writes a few per attempt). */
#define TAIL_BYTES 65536

static void take_line(const char *line, size_t len, double since, td__sdk_end *e) {
    json_error_t jerr;
    json_t *o = json_loadb(line, len, 0, &jerr);
    if (!json_is_object(o)) goto out;
    const char *rec = json_string_value(json_object_get(o, "record"));
    const char *ev = json_string_value(json_object_get(o, "event"));
    json_t *t = json_object_get(o, "time");
    if (!rec || strcmp(rec, "tandem.sdk.end") || !ev || !json_is_number(t) ||
        json_number_value(t) < since)
        goto out;
    json_t *pid = json_object_get(o, "pid"), *st = json_object_get(o, "start_ticks");
    const char *boot = json_string_value(json_object_get(o, "boot_id"));
    e->pid = json_is_integer(pid) ? (long long)json_integer_value(pid) : 0;
    e->start_ticks = json_is_integer(st) ? (long long)json_integer_value(st) : -1;
    snprintf(e->boot_id, sizeof e->boot_id, "%s", boot ? boot : "");
    if (!strcmp(ev, "finish")) {
        e->finished = true;
        e->finish_time = json_number_value(t);
        json_t *code = json_object_get(o, "exit_code");
        e->exit_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
    } else if (!strcmp(ev, "killed")) {
        e->killed = true;
        json_t *sig = json_object_get(o, "signal");
        e->signal = json_is_integer(sig) ? (int)json_integer_value(sig) : 15;
    }
out:
    json_decref(o);
}

int td__sdk_ends_read(const char *run_dir, int world, double since, td__sdk_end *out) {
    int with = 0;
    for (int r = 0; r < world; r++) {
        td__sdk_end *e = &out[r];
        memset(e, 0, sizeof *e);
        e->exit_code = -1;
        char *path = td_xasprintf("%s/%s/sdk-end-%d.jsonl", run_dir,
                                  td_run_path_name(TD_RUN_PATH_METRICS), r);
        FILE *f = fopen(path, "re");
        free(path);
        if (!f) continue;
        char *buf = td_xmalloc(TAIL_BYTES + 1);
        if (fseek(f, 0, SEEK_END) == 0) {
            long size = ftell(f);
            if (size > TAIL_BYTES) fseek(f, size - TAIL_BYTES, SEEK_SET);
            else rewind(f);
        }
        size_t n = fread(buf, 1, TAIL_BYTES, f);
        fclose(f);
        buf[n] = '\0';
        for (char *p = buf; p < buf + n;) {
            char *nl = memchr(p, '\n', (size_t)(buf + n - p));
            if (!nl) break; /* a line still being written */
            take_line(p, (size_t)(nl - p), since, e);
            p = nl + 1;
        }
        free(buf);
        with += e->finished || e->killed;
    }
    return with;
}

int td__sdk_end_alive(const td__sdk_end *e) {
    if (!e->pid || e->start_ticks < 0 || !e->boot_id[0]) return -1;
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (strcmp(boot, e->boot_id)) return -1; /* another machine: not ours to look at */
    char path[64], stat[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", e->pid);
    f = fopen(path, "re");
    if (!f) return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *rp = strrchr(stat, ')');
    long long start = -1;
    char state = '?';
    /* after ") ": state, then 18 more fields up to starttime (field 22) */
    if (rp && sscanf(rp + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                              "%*s %*s %lld",
                     &state, &start) != 2)
        return -1;
    return start == e->start_ticks && state != 'Z' ? 1 : 0;
}
