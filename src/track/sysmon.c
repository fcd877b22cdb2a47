/* System metrics: CPU % and resident memory of each rank's processes, read from /proc, and where
 * the NVIDIA driver's NVML can be loaded, the GPU memory and utilisation of those processes.
 * A worker is any descendant of the launch process whose environment carries RANK (the launcher
 * sets it; a shell wrapper and the program it runs share it), so the numbers per rank cover the
 * whole subtree the rank runs in. */
#include "store_internal.h"
#include "track/jsonl.h"
#include "track/nvml.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct proc_sample {
    pid_t pid;
    uint64_t ticks;
    double at_s;
};

struct td_sysmon {
    struct proc_sample *prev;
    size_t nprev;
    /* stores sys.jsonl of the run last sampled (see store_points) */
    td_ingester *ing;
    td_rundb *ing_store;
    char *ing_run;
};

struct proc_info {
    pid_t pid, ppid;
    uint64_t ticks, start_ticks;
    int64_t rss_pages;
};

td_sysmon *td_sysmon_new(void) {
    return td_xcalloc(1, sizeof(td_sysmon));
}

void td_sysmon_free(td_sysmon *mon) {
    if (!mon) return;
    free(mon->prev);
    td_ingester_free(mon->ing);
    free(mon->ing_run);
    free(mon);
}

/* Appends pts (grouped by rank) to path as one JSON line per rank (track/jsonl.h). */
static td_status append_points(const char *path, const char *dir, const td_metric_point *pts,
                               size_t npts) {
    td_status st = TD_OK;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) st = td_error_errno(TD_ERR_IO, "cannot open system metrics file %s", path);
    double now = td_wall_s();
    for (size_t i = 0; i < npts && st == TD_OK;) {
        /* Reals with all 17 digits; a value that is not finite is left out (null would be no
         * point either, and the line stays as it always was). */
        td_jsonl j;
        td_jsonl_begin(&j);
        td_jsonl_int(&j, "rank", pts[i].rank);
        td_jsonl_int(&j, "step", pts[i].step);
        td_jsonl_real(&j, "time", now, 17);
        int rank = pts[i].rank;
        for (; i < npts && pts[i].rank == rank; i++)
            if (isfinite(pts[i].value)) td_jsonl_real(&j, pts[i].key, pts[i].value, 17);
        const char *line;
        size_t len;
        if (td_jsonl_end(&j, &line, &len) != TD_OK) { /* four fixed keys: cannot happen */
            td_error_clear();
            continue;
        }
        /* One write per line in append mode: a reader never sees half of one. */
        ssize_t w = write(fd, line, len);
        if (w != (ssize_t)len) {
            if (w >= 0) errno = ENOSPC; /* a short write to a regular file: the disk filled */
            st = td_error_errno(TD_ERR_IO, "writing system metrics to %s", path);
            if (w > 0 && ftruncate(fd, lseek(fd, 0, SEEK_CUR) - w) != 0)
                TD_LOG_DEBUG("could not cut a partial line from %s", path);
            td__nospace_explain(st, dir);
        }
    }
    if (fd >= 0) close(fd);
    return st;
}

/* The samples are appended to <run_dir>/metrics/sys.jsonl, one line per rank
 * ({"rank": R, "step": S, "time": T, "sys/cpu_percent": ...}), and stored from there at once
 * through the same exactly-once ingest as the workers' files: the run directory then holds
 * every point of the run, and `tandem reindex` gets these back too. A run without a metrics
 * directory has them stored directly. pts are grouped by rank. */
static td_status store_points(td_sysmon *mon, td_rundb *store, const td_run *run,
                              const td_metric_point *pts, size_t npts) {
    struct stat sb;
    char *dir = run->run_dir ? td_run_path(run->run_dir, TD_RUN_PATH_METRICS) : NULL;
    if (!dir || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        free(dir);
        return td_metrics_insert(store, run->id, pts, npts);
    }
    char *path = td_xasprintf("%s/sys.jsonl", dir);
    td_status st = append_points(path, dir, pts, npts);
    if (st == TD_OK && (!mon->ing || mon->ing_store != store || strcmp(mon->ing_run, run->id))) {
        td_ingester_free(mon->ing);
        free(mon->ing_run);
        mon->ing = NULL;
        mon->ing_run = td_xstrdup(run->id);
        mon->ing_store = store;
        st = td__ingester_new_file(store, run->id, dir, "sys.jsonl", &mon->ing);
    }
    if (st == TD_OK) st = td_ingester_poll(mon->ing, NULL);
    free(path);
    free(dir);
    return st;
}

static int read_stat(pid_t pid, struct proc_info *pi) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name sits in parentheses and may contain spaces: parse after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    p += 2;
    char state;
    int ppid;
    unsigned long long utime, stime, start;
    long long rss;
    if (sscanf(p,
               "%c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu "
               "%*u %lld",
               &state, &ppid, &utime, &stime, &start, &rss) != 6)
        return 0;
    if (state == 'Z') return 0;
    pi->pid = pid;
    pi->ppid = (pid_t)ppid;
    pi->ticks = utime + stime;
    pi->start_ticks = start;
    pi->rss_pages = rss;
    return 1;
}

/* RANK and the restart counter from /proc/<pid>/environ; rank -1 when absent. */

/* The value in a "NAME=value" entry of an environment block when NAME is var, else NULL. */
static const char *var_value(const char *kv, td_var var) {
    const char *name = td_var_name(var);
    size_t n = strlen(name);
    return !strncmp(kv, name, n) && kv[n] == '=' ? kv + n + 1 : NULL;
}

static void read_env(pid_t pid, int *rank, int *restart) {
    *rank = -1;
    *restart = -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i < n;) {
        const char *kv = buf + i;
        size_t len = strlen(kv);
        const char *v;
        if ((v = var_value(kv, TD_VAR_RANK)))
            *rank = atoi(v);
        else if ((v = var_value(kv, TD_VAR_TORCHELASTIC_RESTART_COUNT)) ||
                 (v = var_value(kv, TD_VAR_TANDEM_RESTART_COUNT)))
            *restart = atoi(v);
        i += len + 1;
    }
}

static double uptime_s(void) {
    double up = 0;
    FILE *f = fopen("/proc/uptime", "r");
    if (f) {
        if (fscanf(f, "%lf", &up) != 1) up = 0;
        fclose(f);
    }
    return up;
}

/* One sample of root's descendants as points (grouped by rank, step as given); caller frees
 * *out. */
static void collect(td_sysmon *mon, pid_t root, int64_t step, int *max_restart,
                    td_metric_point **out, size_t *nout) {
    *out = NULL;
    *nout = 0;
    if (max_restart) *max_restart = -1;
    DIR *d = opendir("/proc");
    if (!d) return; /* no /proc: no system metrics, not an error */
    struct proc_info *all = NULL;
    size_t nall = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        struct proc_info pi;
        if (!read_stat((pid_t)atoi(e->d_name), &pi)) continue;
        if (nall == cap) {
            cap = cap ? 2 * cap : 256;
            all = td_xrealloc(all, cap * sizeof *all);
        }
        all[nall++] = pi;
    }
    closedir(d);

    /* Descendants of root: repeat until no process joins (the tree is shallow). */
    char *in = td_xcalloc(nall ? nall : 1, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t i = 0; i < nall; i++) {
            if (in[i]) continue;
            int parent_in = all[i].ppid == root;
            for (size_t j = 0; j < nall && !parent_in; j++)
                parent_in = in[j] && all[j].pid == all[i].ppid;
            if (parent_in) in[i] = changed = 1;
        }
    }

    long hz = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    double now = td_now_s(), up = uptime_s();
    enum { MAX_RANKS = 1024 };
    double *cpu = td_xcalloc(MAX_RANKS, sizeof *cpu), *rss = td_xcalloc(MAX_RANKS, sizeof *rss);
    char *seen = td_xcalloc(MAX_RANKS, 1);
    struct proc_sample *next = td_xcalloc(nall ? nall : 1, sizeof *next);
    pid_t *wpid = td_xcalloc(nall ? nall : 1, sizeof *wpid); /* the workers and their ranks */
    int *wrank = td_xcalloc(nall ? nall : 1, sizeof *wrank);
    size_t nnext = 0;
    for (size_t i = 0; i < nall; i++) {
        if (!in[i]) continue;
        int rank, restart;
        read_env(all[i].pid, &rank, &restart);
        if (rank < 0 || rank >= MAX_RANKS) continue;
        if (max_restart && restart > *max_restart) *max_restart = restart;
        double pct = 0;
        int have_prev = 0;
        for (size_t j = 0; j < mon->nprev; j++)
            if (mon->prev[j].pid == all[i].pid && now > mon->prev[j].at_s) {
                pct = 100.0 * (double)(all[i].ticks - mon->prev[j].ticks) / (double)hz /
                      (now - mon->prev[j].at_s);
                have_prev = 1;
                break;
            }
        if (!have_prev) {
            /* First sight of this process: its average since it started. */
            double age = up - (double)all[i].start_ticks / (double)hz;
            if (age > 0.05) pct = 100.0 * (double)all[i].ticks / (double)hz / age;
        }
        cpu[rank] += pct;
        rss[rank] += (double)all[i].rss_pages * (double)page / (1024.0 * 1024.0);
        seen[rank] = 1;
        wpid[nnext] = all[i].pid;
        wrank[nnext] = rank;
        next[nnext++] = (struct proc_sample){all[i].pid, all[i].ticks, now};
    }

    /* GPUs: NVML's compute processes whose pid is one of the workers'. Without NVML (no driver,
     * no GPU) td_nvml_available says so once at debug level and this is skipped. */
    td_nvml_rank_use *gpu = NULL;
    if (nnext && td_nvml_available(NULL)) {
        td_nvml_snapshot snap;
        if (td_nvml_snapshot_take(&snap) == TD_OK) {
            gpu = td_xcalloc(MAX_RANKS, sizeof *gpu);
            td_nvml_attribute(&snap, wpid, wrank, nnext, gpu, MAX_RANKS);
            td_nvml_snapshot_free(&snap);
        } else {
            TD_LOG_DEBUG("GPU metrics: %s", td_error_msg());
            td_error_clear();
        }
    }
    free(mon->prev);
    mon->prev = next;
    mon->nprev = nnext;

    td_metric_point *pts = td_xcalloc(4 * MAX_RANKS, sizeof *pts);
    size_t npts = 0;
    for (int r = 0; r < MAX_RANKS; r++) {
        if (!seen[r]) continue;
        pts[npts++] = (td_metric_point){r, "sys/cpu_percent", step, cpu[r], 0};
        pts[npts++] = (td_metric_point){r, "sys/rss_mb", step, rss[r], 0};
        if (!gpu || !gpu[r].on_gpu) continue;
        if (gpu[r].mem_known)
            pts[npts++] = (td_metric_point){r, "sys/gpu_mem_mb", step, gpu[r].mem_mb, 0};
        if (gpu[r].util >= 0)
            pts[npts++] = (td_metric_point){r, "sys/gpu_util_percent", step, gpu[r].util, 0};
    }
    *out = pts;
    *nout = npts;
    free(gpu);
    free(wpid);
    free(wrank);
    free(cpu);
    free(rss);
    free(seen);
    free(in);
    free(all);
}

td_status td_sysmon_sample(td_sysmon *mon, td_rundb *store, const td_run *run, pid_t root,
                           int *max_restart) {
    td_metric_point *pts;
    size_t npts;
    collect(mon, root, (int64_t)(td_wall_s() - run->created_s), max_restart, &pts, &npts);
    td_status st = npts ? store_points(mon, store, run, pts, npts) : TD_OK;
    free(pts);
    return st;
}

td_status td_sysmon_sample_to_file(td_sysmon *mon, const char *path, pid_t root, double t0_wall) {
    td_metric_point *pts;
    size_t npts;
    collect(mon, root, (int64_t)(td_wall_s() - t0_wall), NULL, &pts, &npts);
    td_status st = TD_OK;
    if (npts) {
        char *dir = td_xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        st = append_points(path, slash ? dir : ".", pts, npts);
        free(dir);
    }
    free(pts);
    return st;
}
