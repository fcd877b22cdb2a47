/* The Slurm executor: `executor: slurm` in a workflow.
 *
 * tandem run writes the run's batch script RUN/job.sbatch (one `tandem launch` per node under
 * srun, the workers' environment, the token, the time-limit relay), submits it with
 * `sbatch --parsable`, and supervises the job from the submitting host: `scontrol show job`
 * every 1.5 s maps Slurm's state to the run's (with Slurm's Reason in the note), the metrics
 * the workers append under RUN/metrics are ingested as the local executor does, the job's output
 * files are followed, stop signals become scancel, and the end is recorded as for a local run.
 * Everything between the two sides travels through the run directory, so it must be on a file
 * system that the submitting host and every node share (docs/executors.md). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/supervisor.h"
#include "tandem/loop.h"

extern char **environ;

#define QUERY_PERIOD_S 1.5  /* scontrol show job: cheap for slurmctld, prompt enough for us */
#define TAIL_PERIOD_S  0.5  /* the job's output files */
#define CMD_TIMEOUT_S  60.0 /* a client command; slurmctld answers in MessageTimeout (10 s) */
/* The launchers' --stop-grace, as the local executor's; shorter when the time-limit signal
 * comes less than a minute before the limit, so the requeue happens before the kill. */
#define LAUNCH_STOP_GRACE_S 30.0
/* A stop asks the launchers to checkpoint (scancel --signal=TERM); what is left after this
 * long is cancelled outright (the local executor escalates to SIGKILL after as long). */
#define CANCEL_AFTER_S (LAUNCH_STOP_GRACE_S + 15.0)

/* ---- options ---- */
void td_slurm_options_clear(td_slurm_options *o) {
    free(o->partition);
    free(o->account);
    free(o->work_dir);
    free(o->link_host);
    for (size_t i = 0; i < o->nsbatch_args; i++) free(o->sbatch_args[i]);
    free(o->sbatch_args);
    memset(o, 0, sizeof *o);
}

void td_slurm_options_copy(td_slurm_options *dst, const td_slurm_options *src) {
    *dst = *src;
    dst->partition = src->partition ? td_xstrdup(src->partition) : NULL;
    dst->account = src->account ? td_xstrdup(src->account) : NULL;
    dst->work_dir = src->work_dir ? td_xstrdup(src->work_dir) : NULL;
    dst->link_host = src->link_host ? td_xstrdup(src->link_host) : NULL;
    dst->sbatch_args = NULL;
    if (src->nsbatch_args) {
        dst->sbatch_args = td_xcalloc(src->nsbatch_args, sizeof *dst->sbatch_args);
        for (size_t i = 0; i < src->nsbatch_args; i++)
            dst->sbatch_args[i] = td_xstrdup(src->sbatch_args[i]);
    }
}

/* ---- nproc_per_node: gpu|cpu|auto, counted on the cluster before the job ----
 * Why sinfo before submission rather than srun inside the allocation: the count is part of the
 * job's request itself (--cpus-per-task, --gres=gpu:N in the batch script) and of the run's
 * record, which exist before any node is allocated; a count taken inside the allocation would
 * come after the request it has to size. sinfo answers from slurmctld's view of the nodes
 * (their configured CPUs and GRES), which is what the scheduler allocates from. */

int td__slurm_gres_gpus(const char *gres) {
    if (!gres) return 0;
    int total = 0;
    const char *p = gres;
    while (*p) {
        /* one entry: up to a ',' outside parentheses ("gpu:a100:2(S:0,1)" has one inside) */
        const char *start = p;
        int depth = 0;
        while (*p && (depth || *p != ',')) {
            if (*p == '(') depth++;
            if (*p == ')' && depth) depth--;
            p++;
        }
        size_t len = (size_t)(p - start);
        const char *paren = memchr(start, '(', len);
        if (paren) len = (size_t)(paren - start);
        if (len >= 3 && !strncmp(start, "gpu", 3) && (len == 3 || start[3] == ':')) {
            /* gpu[:TYPE][:COUNT]: the count is the last field when it is a number */
            const char *colon = NULL;
            for (const char *q = start; q < start + len; q++)
                if (*q == ':') colon = q;
            long n = 1;
            if (colon && colon + 1 < start + len) {
                char digits[16];
                size_t nd = (size_t)(start + len - colon - 1);
                if (nd < sizeof digits) {
                    memcpy(digits, colon + 1, nd);
                    digits[nd] = '\0';
                    char *end = NULL;
                    long v = strtol(digits, &end, 10);
                    if (end != digits && !*end && v >= 0) n = v;
                }
            }
            total += (int)n;
        }
        if (*p == ',') p++;
    }
    return total;
}

/* name is one of the comma-separated list */
static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

/* constraint as a plain AND of feature names, or 0 when it is more (then it filters nothing) */
static int plain_and(const char *constraint) {
    if (!constraint || !*constraint) return 0;
    for (const char *p = constraint; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("_.-&", *p)) return 0;
    return 1;
}

static int has_features(const char *features, const char *constraint) {
    char want[256];
    snprintf(want, sizeof want, "%s", constraint);
    for (char *save = NULL, *f = strtok_r(want, "&", &save); f; f = strtok_r(NULL, "&", &save))
        if (!in_list(features, f)) return 0;
    return 1;
}

td_status td__slurm_nodes_parse(const char *sinfo_out, const char *partitions,
                                const char *constraint, td__slurm_node **out, size_t *count) {
    *out = NULL;
    *count = 0;
    size_t cap = 0;
    int lineno = 0;
    int filter_features = plain_and(constraint);
    for (const char *p = sinfo_out ? sinfo_out : ""; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        p = e ? e + 1 : p + len;
        lineno++;
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\r' || line[l - 1] == ' ')) line[--l] = '\0';
        if (!l) continue;
        char orig[1024]; /* for a message: the fields are cut out of line below */
        snprintf(orig, sizeof orig, "%s", line);
        char *field[5] = {0};
        int nf = 0;
        char *cur = line;
        for (; nf < 5; nf++) {
            char *bar = strchr(cur, '|');
            field[nf] = cur;
            if (!bar) {
                nf++;
                break;
            }
            *bar = '\0';
            cur = bar + 1;
        }
        char *end = NULL;
        long cpus = nf == 5 ? strtol(field[2], &end, 10) : -1;
        if (nf != 5 || end == field[2] || *end || cpus < 1 || !field[0][0] || !field[1][0]) {
            free(*out);
            *out = NULL;
            *count = 0;
            return td_error(TD_ERR_FORMAT,
                            "sinfo line %d: expected NODE|PARTITION|CPUS|GRES|FEATURES "
                            "(sinfo -h -N -o '%%N|%%P|%%c|%%G|%%f'), got '%.200s'",
                            lineno, orig);
        }
        td__slurm_node nd = {0};
        snprintf(nd.name, sizeof nd.name, "%s", field[0]);
        size_t pl = strlen(field[1]);
        nd.is_default = field[1][pl - 1] == '*';
        snprintf(nd.partition, sizeof nd.partition, "%.*s", (int)(pl - (size_t)nd.is_default),
                 field[1]);
        nd.cpus = (int)cpus;
        snprintf(nd.gres, sizeof nd.gres, "%s", field[3]);
        nd.gpus = td__slurm_gres_gpus(field[3]);
        snprintf(nd.features, sizeof nd.features, "%s", field[4]);
        if (partitions ? !in_list(partitions, nd.partition) : !nd.is_default) continue;
        if (filter_features && !has_features(nd.features, constraint)) continue;
        int seen = 0; /* a node of two listed partitions: once */
        for (size_t i = 0; i < *count && !seen; i++) seen = !strcmp((*out)[i].name, nd.name);
        if (seen) continue;
        if (*count == cap) {
            cap = cap ? cap * 2 : 16;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        (*out)[(*count)++] = nd;
    }
    return TD_OK;
}

td_status td__slurm_count_nodes(const td__slurm_node *nodes, size_t count, const char *where,
                                const char *spec, int *out, int *gpus_out, char *note,
                                size_t nbytes) {
    *out = 0;
    *gpus_out = 0;
    if (note && nbytes) note[0] = '\0';
    if (!count)
        return td_error(TD_ERR_NOTFOUND,
                        "nproc_per_node: %s counts the CPUs or GPUs of the Slurm nodes the job "
                        "may get, and sinfo lists no node for %s; check slurm: partition (and "
                        "sbatch_args' --nodelist or --constraint), or give a number of workers",
                        spec, where);
    int gpu = !strcmp(spec, "gpu"), cpu = !strcmp(spec, "cpu");
    if (gpu) {
        size_t with = 0;
        for (size_t i = 0; i < count; i++) with += nodes[i].gpus > 0;
        if (!with)
            return td_error(TD_ERR_USAGE,
                            "nproc_per_node: gpu counts the GPUs of the Slurm nodes, and %s has "
                            "none (sinfo's GRES of %s: %s); give a number of workers, cpu (one "
                            "per CPU) or auto, or a partition with GPUs (slurm: partition)",
                            where, nodes[0].name, nodes[0].gres[0] ? nodes[0].gres : "(null)");
    }
    /* each node's count by the rule; the first node's is the run's */
    int first = 0;
    for (size_t i = 0; i < count; i++) {
        const td__slurm_node *nd = &nodes[i];
        int by_gpu = !cpu && nd->gpus > 0;
        int n = by_gpu ? nd->gpus : nd->cpus;
        if (gpu && !nd->gpus)
            return td_error(TD_ERR_USAGE,
                            "nproc_per_node: gpu counts %d worker%s on Slurm node %s but none "
                            "on %s, which has no GPU (GRES %s) (%s); a run has one count per "
                            "node: give a number, or narrow the nodes (slurm: partition, or "
                            "sbatch_args: [--nodelist=...] or [--constraint=...])",
                            first, first == 1 ? "" : "s", nodes[0].name, nd->name,
                            nd->gres[0] ? nd->gres : "(null)", where);
        if (!i) {
            first = n;
            *gpus_out = by_gpu ? n : 0;
        } else if (n != first || (by_gpu ? n : 0) != *gpus_out)
            return td_error(TD_ERR_USAGE,
                            "nproc_per_node: %s counts %d worker%s on Slurm node %s (%s) but %d "
                            "on %s (%s) (%s); a run has one count per node: give a number, or "
                            "narrow the nodes (slurm: partition, or sbatch_args: "
                            "[--nodelist=...] or [--constraint=...])",
                            spec, first, first == 1 ? "" : "s", nodes[0].name,
                            *gpus_out ? "GPUs" : "CPUs", n, nd->name, by_gpu ? "GPUs" : "CPUs",
                            where);
    }
    *out = first;
    if (note && *gpus_out)
        snprintf(note, nbytes, "nproc_per_node %s: %d worker%s, one per GPU of each of %s's %zu "
                               "node%s (sinfo: GRES %s)",
                 spec, first, first == 1 ? "" : "s", where, count, count == 1 ? "" : "s",
                 nodes[0].gres);
    else if (note)
        snprintf(note, nbytes, "nproc_per_node %s: %d worker%s, one per CPU of each of %s's %zu "
                               "node%s (sinfo: %d CPUs, GRES %s)",
                 spec, first, first == 1 ? "" : "s", where, count, count == 1 ? "" : "s",
                 nodes[0].cpus, nodes[0].gres[0] ? nodes[0].gres : "(null)");
    return TD_OK;
}

/* The value of the last of sbatch_args' options named long_name (--x=V, --x V) or short_name
 * (-c V, -cV): sbatch takes the last, and sbatch_args come after tandem's own. NULL: none. */
static const char *sbatch_option(const td_slurm_options *o, const char *long_name,
                                 char short_name) {
    const char *val = NULL;
    size_t ln = strlen(long_name);
    for (size_t i = 0; i < o->nsbatch_args; i++) {
        const char *a = o->sbatch_args[i];
        const char *next = i + 1 < o->nsbatch_args ? o->sbatch_args[i + 1] : NULL;
        if (!strncmp(a, long_name, ln) && a[ln] == '=')
            val = a + ln + 1;
        else if (!strcmp(a, long_name) && next)
            val = next, i++;
        else if (a[0] == '-' && a[1] == short_name && a[2])
            val = a + 2;
        else if (a[0] == '-' && a[1] == short_name && !a[2] && next)
            val = next, i++;
    }
    return val;
}

td_status td_slurm_count_nproc(td_slurm_options *o, const char *spec, int *out, char *note,
                               size_t nbytes) {
    const char *partitions = sbatch_option(o, "--partition", 'p');
    if (!partitions) partitions = o->partition;
    const char *nodelist = sbatch_option(o, "--nodelist", 'w');
    const char *constraint = sbatch_option(o, "--constraint", 'C');
    char *sinfo = td__exec_which("sinfo");
    if (!sinfo)
        return td_error(TD_ERR_NOTFOUND,
                        "nproc_per_node: %s counts the CPUs or GPUs of the Slurm nodes the job "
                        "may get, with sinfo, which is not on PATH; give a number of workers "
                        "per node",
                        spec);
    char *nodes_arg = nodelist ? td_xasprintf("--nodes=%s", nodelist) : NULL;
    char *argv[] = {sinfo, "-h", "-N", "-o", "%N|%P|%c|%G|%f", nodes_arg, NULL};
    char *sout = NULL, *serr = NULL;
    int code = 0;
    td_status st = td__exec_capture(argv, NULL, 60, &sout, &serr, &code);
    if (st == TD_OK && code != 0) {
        char why[400];
        td__exec_joined_lines(serr && *serr ? serr : sout, why, sizeof why);
        st = td_error(TD_ERR_IO,
                      "nproc_per_node: %s: counting the Slurm nodes: sinfo failed (exit code "
                      "%d): %s; run tandem run where sinfo reaches the cluster (a login node), "
                      "or give a number of workers per node",
                      spec, code, why);
    }
    td__slurm_node *nodes = NULL;
    size_t n = 0;
    if (st == TD_OK) st = td__slurm_nodes_parse(sout, partitions, constraint, &nodes, &n);
    if (st == TD_OK) {
        /* without slurm: partition, the nodes kept are the default partition's: its name */
        char where[512];
        snprintf(where, sizeof where, "%s%s%s%s%s%s%s",
                 partitions ? "partition " : "the default partition",
                 partitions ? partitions : n ? " " : "", partitions ? "" : n ? nodes[0].partition : "",
                 nodelist ? ", nodes " : "", nodelist ? nodelist : "",
                 plain_and(constraint) ? ", constraint " : "",
                 plain_and(constraint) ? constraint : "");
        int gpus = 0;
        st = td__slurm_count_nodes(nodes, n, where, spec, out, &gpus, note, nbytes);
        if (st == TD_OK) o->gpus_per_node = gpus;
    }
    free(nodes);
    free(sout);
    free(serr);
    free(nodes_arg);
    free(sinfo);
    return st;
}

/* A whole non-negative decimal number of at most 9 digits at *p; advances p. */
static int time_part(const char **p, long *out) {
    const char *s = *p;
    long v = 0;
    int n = 0;
    while (isdigit((unsigned char)*s) && n < 9) {
        v = v * 10 + (*s++ - '0');
        n++;
    }
    if (!n || isdigit((unsigned char)*s)) return 0;
    *p = s;
    *out = v;
    return 1;
}

td_status td_slurm_parse_time(const char *what, const char *text, double *seconds_out) {
    /* Slurm's src/common/parse_time.c (time_str2secs): with a day part, D-H[:M[:S]]; without,
     * the fields are M, M:S or H:M:S. */
    long f[4] = {0, 0, 0, 0};
    int nf = 0;
    long days = 0;
    const char *p = text ? text : "";
    const char *dash = strchr(p, '-');
    if (dash) {
        if (!time_part(&p, &days) || *p != '-') goto bad;
        p++;
    }
    for (;;) {
        if (nf == 3 || !time_part(&p, &f[nf])) goto bad;
        nf++;
        if (*p == '\0') break;
        if (*p != ':') goto bad;
        p++;
    }
    double s;
    if (dash)
        s = (double)days * 86400 + (double)f[0] * 3600 + (nf > 1 ? (double)f[1] * 60 : 0) +
            (nf > 2 ? (double)f[2] : 0);
    else if (nf == 1)
        s = (double)f[0] * 60;
    else if (nf == 2)
        s = (double)f[0] * 60 + (double)f[1];
    else
        s = (double)f[0] * 3600 + (double)f[1] * 60 + (double)f[2];
    if (s <= 0) goto bad;
    *seconds_out = s;
    return TD_OK;
bad:
    return td_error(TD_ERR_INVALID,
                    "%s: expected a Slurm time limit such as 30:00 (minutes:seconds), 2:00:00 "
                    "(hours:minutes:seconds) or 1-12:00:00 (days-hours:minutes:seconds), or a "
                    "duration such as 90m or 2h, got '%s'",
                    what, text ? text : "");
}

/* ---- what scontrol says ---- */
/* The value of " KEY=" in an `scontrol show job -o` line, up to the next blank. */
static void field(const char *line, const char *key, char *out, size_t nbytes) {
    size_t klen = strlen(key);
    out[0] = '\0';
    for (const char *p = line; (p = strstr(p, key)); p += klen) {
        if ((p != line && p[-1] != ' ') || p[klen] != '=') continue;
        const char *v = p + klen + 1;
        size_t n = strcspn(v, " \n");
        snprintf(out, nbytes, "%.*s", (int)TD_MIN(n, nbytes - 1), v);
        return;
    }
}

td_status td__slurm_parse_job(const char *line, td__slurm_job *out) {
    memset(out, 0, sizeof *out);
    char v[64];
    field(line, "JobState", out->state, sizeof out->state);
    if (!out->state[0])
        return td_error(TD_ERR_FORMAT, "scontrol show job printed no JobState: '%.200s'", line);
    field(line, "Reason", out->reason, sizeof out->reason);
    field(line, "NodeList", out->nodes, sizeof out->nodes);
    if (!strcmp(out->nodes, "(null)")) out->nodes[0] = '\0';
    field(line, "Restarts", v, sizeof v);
    out->restarts = atoi(v);
    field(line, "ExitCode", v, sizeof v);
    out->exit_code = atoi(v);
    const char *colon = strchr(v, ':');
    out->exit_signal = colon ? atoi(colon + 1) : 0;
    return TD_OK;
}

td__slurm_phase td__slurm_phase_of(const char *state) {
    static const char *const waiting[] = {"PENDING",      "REQUEUED",     "REQUEUE_FED",
                                          "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD",
                                          "CONFIGURING",  "POWER_UP_NODE"};
    static const char *const ended[] = {"COMPLETED", "CANCELLED", "FAILED",    "TIMEOUT",
                                        "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "OUT_OF_MEMORY",
                                        "DEADLINE",  "REVOKED"};
    for (size_t i = 0; i < TD_ARRAY_LEN(waiting); i++)
        if (!strcmp(state, waiting[i])) return TD__SLURM_WAITING;
    for (size_t i = 0; i < TD_ARRAY_LEN(ended); i++)
        if (!strcmp(state, ended[i])) return TD__SLURM_ENDED;
    /* RUNNING, SUSPENDED, COMPLETING, SIGNALING, STAGE_OUT, RESIZING, and any state a newer
     * Slurm adds: the job holds nodes, so it counts as running until a final state shows. */
    return TD__SLURM_ACTIVE;
}

const char *td__slurm_reason_hint(const char *reason) {
    static const struct {
        const char *reason, *hint;
    } hints[] = {
        {"Resources", "waiting for nodes to become free"},
        {"Priority", "other jobs are ahead of it in the queue"},
        {"PartitionConfig",
         "it asks for more than the partition has (nodes, CPUs, memory or time) and will not "
         "start unless that changes; tandem stop the run and lower nodes or the slurm: settings"},
        {"PartitionNodeLimit", "it asks for more nodes than the partition allows a job"},
        {"PartitionTimeLimit", "its time limit (slurm: time) is above the partition's"},
        {"BeginTime", "not eligible yet; a requeued job waits a few seconds before it may start"},
        {"Dependency", "waiting for a job it depends on"},
        {"JobHeldUser", "held: scontrol release the job"},
        {"JobHeldAdmin", "held by an administrator"},
        {"ReqNodeNotAvail", "a node it needs is down, drained or reserved"},
        {"NodeDown", "a node allocated to it is down"},
        {"InvalidAccount", "the account (slurm: account) is not valid here"},
        {"InvalidQOS", "the QOS is not valid for this account or partition"},
        {"Reservation", "waiting for its reservation to start"},
    };
    if (!reason) return NULL;
    for (size_t i = 0; i < TD_ARRAY_LEN(hints); i++)
        if (!strcmp(reason, hints[i].reason)) return hints[i].hint;
    if (!strncmp(reason, "Assoc", 5) || !strncmp(reason, "QOS", 3))
        return "an account or QOS limit holds it back";
    return NULL;
}

void td__slurm_live_note(const char *job_id, const td__slurm_job *j, char *buf, size_t nbytes) {
    char again[48] = "";
    if (j->restarts > 0) snprintf(again, sizeof again, " (requeued, restart %d)", j->restarts);
    const char *state = j->state;
    if (td__slurm_phase_of(state) == TD__SLURM_WAITING) {
        const char *hint = td__slurm_reason_hint(j->reason);
        int has_reason = j->reason[0] && strcmp(j->reason, "None");
        snprintf(buf, nbytes, "slurm job %s%s %s%s%s%s%s%s", job_id, again,
                 !strcmp(state, "PENDING") ? "pending" : state, has_reason ? ": " : "",
                 has_reason ? j->reason : "", hint ? " (" : "", hint ? hint : "", hint ? ")" : "");
    } else {
        char lower[32];
        size_t n = 0;
        for (; state[n] && n + 1 < sizeof lower; n++)
            lower[n] = (char)tolower((unsigned char)state[n]);
        lower[n] = '\0';
        snprintf(buf, nbytes, "slurm job %s%s %s%s%s", job_id, again, lower,
                 j->nodes[0] ? " on " : "", j->nodes);
    }
}

void td__slurm_outcome(const char *run_id, const char *job_id, const td__slurm_job *j,
                       const char *stopped_by, int preempted_by_us, const char *cause,
                       int worker_code, td__exec_outcome *o) {
    memset(o, 0, sizeof *o);
    const char *s = j->state;
    /* The batch script exits with the launchers' code (srun passes the highest on); a job
     * killed by a signal reports it after the colon. */
    int code = j->exit_signal ? 128 + j->exit_signal : j->exit_code;
    int ran = j->nodes[0] != '\0';
    /* 143 is a checkpointed stop, unless something failed: a launcher that fails (its worker
     * failed, it gave up on the rendezvous or on its link) ends the step (srun
     * --kill-on-bad-exit), srun's SIGTERM makes the other launchers exit 143, and srun passes
     * the highest code on; the failure is in the end records (cause, the worker's own code) or
     * in what the supervisor saw (no node connected back). */
    int worker_failed = worker_code > 0 && worker_code != 143;
    int checkpointed =
        !strcmp(s, "FAILED") && code == 143 && !worker_failed && !(cause && cause[0]);
    char reason[200] = "";
    if (j->reason[0] && strcmp(j->reason, "None"))
        snprintf(reason, sizeof reason, " (%s)", j->reason);
    o->exit_code = code;
    if (!strcmp(s, "COMPLETED")) {
        o->status = TD_RUN_SUCCEEDED;
        o->exit_code = o->cli_code = 0;
        snprintf(o->note, sizeof o->note, "slurm job %s completed on %s", job_id,
                 ran ? j->nodes : "its nodes");
    } else if (stopped_by) {
        o->status = TD_RUN_STOPPED;
        o->cli_code = checkpointed ? 143 : 1;
        if (!ran) o->exit_code = -2; /* stopped before it started: no exit code */
        snprintf(o->note, sizeof o->note, "stopped by %s: slurm job %s %s%s", stopped_by, job_id,
                 !ran           ? "cancelled before it started"
                 : checkpointed ? "ended after the workers checkpointed (exit 143)"
                                : "cancelled",
                 ran && !checkpointed ? " before the workers had all checkpointed" : "");
    } else if (preempted_by_us) {
        o->status = checkpointed ? TD_RUN_PREEMPTED : TD_RUN_FAILED;
        o->cli_code = checkpointed ? 143 : 1;
        if (checkpointed)
            snprintf(o->note, sizeof o->note,
                     "preempted: tandem run got SIGTERM and ended slurm job %s after the workers "
                     "checkpointed; continue with tandem run --resume %s",
                     job_id, run_id);
        else
            snprintf(o->note, sizeof o->note,
                     "received SIGTERM but the workers did not all checkpoint and exit 143: "
                     "slurm job %s %s%s",
                     job_id, s, reason);
    } else if (!strcmp(s, "TIMEOUT") || !strcmp(s, "PREEMPTED") || !strcmp(s, "DEADLINE") ||
               checkpointed) {
        o->status = TD_RUN_PREEMPTED;
        o->cli_code = 143;
        snprintf(o->note, sizeof o->note,
                 "preempted: slurm job %s %s; continue with tandem run "
                 "--resume %s",
                 job_id,
                 !strcmp(s, "TIMEOUT")     ? "reached its time limit and was not requeued"
                 : !strcmp(s, "PREEMPTED") ? "was preempted and not requeued"
                 : !strcmp(s, "DEADLINE")
                     ? "reached its deadline"
                     : "ended after the workers checkpointed and exited 143 "
                       "(a SIGTERM from outside tandem: scancel --signal=TERM?)",
                 run_id);
    } else if (!strcmp(s, "CANCELLED")) {
        o->status = TD_RUN_STOPPED;
        o->cli_code = 1;
        if (!ran) o->exit_code = -2;
        snprintf(o->note, sizeof o->note,
                 "slurm job %s was cancelled outside tandem (scancel, or an administrator)%s",
                 job_id, reason);
    } else {
        o->status = TD_RUN_FAILED;
        o->cli_code = 1;
        if (!s[0]) {
            snprintf(o->note, sizeof o->note,
                     "slurm job %s is no longer known to slurmctld (it ended more than MinJobAge "
                     "ago, or the controller lost its state); see tandem logs %s",
                     job_id, run_id);
        } else if (!strcmp(s, "FAILED") && cause && cause[0]) {
            snprintf(o->note, sizeof o->note, "%s", cause);
            if ((code == 1 || code == 143) && worker_failed)
                o->exit_code = worker_code; /* the worker's own */
        } else if (!strcmp(s, "FAILED")) {
            snprintf(o->note, sizeof o->note,
                     "slurm job %s failed with exit code %d%s; see tandem logs %s and "
                     "logs/slurm-%s.err in the run directory",
                     job_id, code, reason, run_id, job_id);
        } else if (!strcmp(s, "NODE_FAIL")) {
            snprintf(o->note, sizeof o->note,
                     "slurm job %s lost a node (NODE_FAIL on %s) and was not requeued; continue "
                     "with tandem run --resume %s",
                     job_id, ran ? j->nodes : "its nodes", run_id);
        } else if (!strcmp(s, "OUT_OF_MEMORY")) {
            snprintf(o->note, sizeof o->note,
                     "slurm job %s ran out of memory (OUT_OF_MEMORY); ask for more with slurm: "
                     "sbatch_args: [--mem=...]",
                     job_id);
        } else {
            snprintf(o->note, sizeof o->note, "slurm job %s ended %s%s", job_id, s, reason);
        }
    }
}

/* ---- the batch script ---- */
static int shell_name(const char *s, size_t n) {
    if (!n || isdigit((unsigned char)s[0])) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_') return 0;
    return 1;
}

/* With slurm: work_dir, the run's directory on the nodes (their own copy), for the paths in
 * the workers' environment and the launchers' directories. */
typedef struct {
    const char *run_dir; /* ours */
    char *node_run;      /* work_dir/RUN_ID */
} node_paths;

/* The environment lines: what the job's environment adds to or removes from ours. sbatch
 * passes ours on as it is (--export=ALL, its default), so the script carries only the
 * difference, and the workers end with exactly the local executor's environment. */
static void add_env_lines(td__buf *b, char *const *env, char *const *secrets,
                          const node_paths *np) {
    for (char *const *e = env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        size_t klen = (size_t)(eq - *e);
        char *key = td_xasprintf("%.*s", (int)klen, *e);
        if (td_exec_secret_value(secrets, key)) { /* in sbatch's environment, not here */
            free(key);
            continue;
        }
        const char *old = getenv(key);
        const char *val = eq + 1;
        char *moved = NULL; /* the value with the run's directory as the nodes have it */
        if (np && !strcmp(key, td_var_name(TD_VAR_TANDEM_PROJECT_DIR))) {
            val = moved = td_run_path(np->node_run, TD_RUN_PATH_WORK);
        } else if (np && !strncmp(val, np->run_dir, strlen(np->run_dir)) &&
                   (val[strlen(np->run_dir)] == '/' || !val[strlen(np->run_dir)])) {
            val = moved = td_xasprintf("%s%s", np->node_run, val + strlen(np->run_dir));
        }
        if (!old || strcmp(old, val)) {
            size_t olen = old ? strlen(old) : 0, vlen = strlen(val);
            if (!shell_name(key, klen)) {
                TD_LOG_WARN("the environment variable '%s' cannot be set by a shell script (its "
                            "name is not a shell name); the Slurm job's workers will not have it",
                            key);
            } else if (!strcmp(key, "PATH") && old && olen && vlen > olen + 1 &&
                       !strcmp(val + vlen - olen, old) && val[vlen - olen - 1] == ':') {
                /* this tandem's directory first, then the node's own PATH */
                td__buf_addf(b, "export PATH=");
                char *prefix = td_xasprintf("%.*s", (int)(vlen - olen - 1), val);
                td__buf_quote(b, prefix);
                free(prefix);
                td__buf_addf(b, ":\"$PATH\"\n");
            } else {
                td__buf_addf(b, "export %s=", key);
                td__buf_quote(b, val);
                td__buf_add(b, "\n", 1);
            }
        }
        free(moved);
        free(key);
    }
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq) continue;
        size_t klen = (size_t)(eq - *e);
        int kept = 0;
        for (char *const *f = env; f && *f && !kept; f++)
            kept = !strncmp(*f, *e, klen) && (*f)[klen] == '=';
        for (char *const *f = secrets; f && *f && !kept; f++)
            kept = !strncmp(*f, *e, klen) && (*f)[klen] == '=';
        if (!kept && shell_name(*e, klen)) td__buf_addf(b, "unset %.*s\n", (int)klen, *e);
    }
}

/* The name of a TANDEM_* knob, from core's table (TD_ENV_MAP), never spelled out here. */
#define TD__KNOB_CASE(name, def, doc)                                                              \
    case TD_ENV_##name:                                                                            \
        return "TANDEM_" #name;
static const char *knob_name(td_env_knob k) {
    switch (k) {
        TD_ENV_MAP(TD__KNOB_CASE)
    default:
        return "";
    }
}
#undef TD__KNOB_CASE

static double signal_lead(const td_slurm_options *o) {
    return o && o->signal_lead_s > 0 ? o->signal_lead_s : TD_SLURM_SIGNAL_LEAD_DEFAULT_S;
}

/* The launcher's command line, after `tandem launch`: the same on every node. log_dir and
 * metrics_dir are shell words already (quoted, or "$d/logs"). */
static void add_launch_args(td__buf *b, const td_exec_job *job, double grace, const char *log_dir,
                            const char *metrics_dir, const char *end_record) {
    td__buf_addf(b, " --nproc-per-node=%d --rdzv-id=", job->run->nproc_per_node);
    td__buf_quote(b, job->run->id);
    /* --restarts-before: the batch script's new steps after a lost launcher (its loop), expanded
     * by the shell that starts the launcher (exported, so each node's own shell sees it) */
    td__buf_addf(b,
                 " --max-restarts=%d --restarts-before=\"${tandem_step_restarts:-0}\" "
                 "--stop-grace=%g \\\n    --log-dir=%s --metrics-dir=%s",
                 job->max_restarts, grace, log_dir, metrics_dir);
    if (end_record) td__buf_addf(b, " --end-record=%s", end_record);
    for (size_t i = 0; i < job->nnode_setup; i++) {
        td__buf_addf(b, " \\\n    --node-setup=");
        td__buf_quote(b, job->node_setup[i]);
    }
    /* As the local executor: the worker is this shell, which waits for the program under
     * `trap : TERM` and exits with its status (143 after a checkpoint). */
    td__buf_addf(b, " -- /bin/sh -c ");
    char *worker = td_xasprintf("trap : TERM\n%s", job->script);
    td__buf_quote(b, worker);
    free(worker);
}

/* ---- the batch script, section by section ---- */
/* The #SBATCH directives. Their values cannot be quoted (sbatch splits them at blanks), so they
 * name only what tandem controls: the run id, its directory, numbers, a checked work_dir. */
static void script_directives(td__buf *b, const td_exec_job *job, const char *link, double lead) {
    const td_run *run = job->run;
    const td_slurm_options *o = job->slurm;
    int nodes = run->nodes, nproc = run->nproc_per_node;
    td__buf_addf(b, "#!/bin/sh\n");
    td__buf_addf(b,
                 "# The Slurm batch script of tandem run %s, written by `tandem run` "
                 "(docs/executors.md).\n"
                 "# Submitted with: sbatch --parsable --export=ALL [slurm: sbatch_args] "
                 "%s/job.sbatch\n",
                 run->id, run->run_dir);
    td__buf_addf(b, "#SBATCH --job-name=%s\n", run->id);
    td__buf_addf(b, "#SBATCH --nodes=%d\n#SBATCH --ntasks-per-node=1\n", nodes);
    td__buf_addf(b, "#SBATCH --cpus-per-task=%d\n", nproc);
    /* nproc_per_node: gpu|auto counted the nodes' GPUs (td_slurm_count_nproc): the job asks
     * for them, or a cluster that hides unrequested GPUs (ConstrainDevices) gives it none; its
     * steps get the job's GRES */
    if (o && o->gpus_per_node > 0) td__buf_addf(b, "#SBATCH --gres=gpu:%d\n", o->gpus_per_node);
    td__buf_addf(b, "#SBATCH --requeue\n");
    td__buf_addf(b, "#SBATCH --signal=B:USR1@%.0f\n", lead);
    td__buf_addf(b, "#SBATCH --open-mode=append\n");
    if (link) {
        /* The nodes do not see our run directory: the job's own output stays on its first
         * node, beside the nodes' copies of the run. */
        td__buf_addf(b, "#SBATCH --output=%s/%s-slurm-%%j.out\n", o->work_dir, run->id);
        td__buf_addf(b, "#SBATCH --error=%s/%s-slurm-%%j.err\n", o->work_dir, run->id);
        td__buf_addf(b, "#SBATCH --chdir=%s\n", o->work_dir);
    } else {
        td__buf_addf(b, "#SBATCH --output=%s/logs/slurm-%%j.out\n", run->run_dir);
        td__buf_addf(b, "#SBATCH --error=%s/logs/slurm-%%j.err\n", run->run_dir);
        td__buf_addf(b, "#SBATCH --chdir=%s\n", job->work_dir);
    }
    if (o && o->partition) td__buf_addf(b, "#SBATCH --partition=%s\n", o->partition);
    if (o && o->account) td__buf_addf(b, "#SBATCH --account=%s\n", o->account);
    if (o && o->time_limit_s > 0) {
        long s = (long)ceil(o->time_limit_s);
        td__buf_addf(b, "#SBATCH --time=%ld-%02ld:%02ld:%02ld\n", s / 86400, s / 3600 % 24,
                     s / 60 % 60, s % 60);
    }
}

/* The workers' environment, the token, the launchers' knobs, and the resume of a requeued job. */
static void script_environment(td__buf *b, const td_exec_job *job, const char *token_path,
                               const char *link, const node_paths *np) {
    const td_run *run = job->run;
    int nodes = run->nodes, nproc = run->nproc_per_node;
    td__buf_addf(b,
                 "\n# The workers' environment: what tandem run adds to or removes from the "
                 "submitting shell's,\n# which sbatch passes on (--export=ALL)%s.\n",
                 link ? ", with the run's directory as the nodes have it" : "");
    add_env_lines(b, job->env, job->secrets, link ? np : NULL);
    if (job->secrets && job->secrets[0])
        td__buf_addf(b, "# The job's secrets: in sbatch's environment (as the token), never in "
                        "this script; checked by name.\n");
    for (char *const *e = job->secrets; e && *e; e++) {
        int n = (int)strcspn(*e, "=");
        td__buf_addf(
            b,
            "[ -n \"${%.*s+x}\" ] || { echo \"tandem: error: secret %.*s is not in the "
            "job's environment (sbatch --export=NONE in slurm: sbatch_args?)\" >&2; exit 1; "
            "}\n",
            n, *e, n, *e);
    }
    const char *tok = td_var_name(TD_VAR_TANDEM_TOKEN);
    if (link) {
        td__buf_addf(b,
                     "# The rendezvous store's and the link's secret: in sbatch's environment "
                     "(Slurm keeps a job's\n# environment from everyone but its owner and the "
                     "administrators), never in this script.\n"
                     "[ -n \"${%s:-}\" ] || { echo \"tandem: error: %s is not in the job's "
                     "environment (sbatch --export=NONE in slurm: sbatch_args?)\" >&2; exit 1; "
                     "}\n",
                     tok, tok);
    } else {
        td__buf_addf(b,
                     "# The rendezvous store's secret: random per run, in a file only its "
                     "owner can read.\n%s=$(cat ",
                     tok);
        td__buf_quote(b, token_path);
        td__buf_addf(b, ") || exit 1\nexport %s\n", tok);
    }
    td__buf_addf(b,
                 "# tandem launch takes the nodes, this node's rank and node 0's address from "
                 "srun's variables\n# (docs/launch.md); a %s=0 of the submitting shell must "
                 "not turn that off.\nexport %s=1\n",
                 knob_name(TD_ENV_LAUNCH_DETECT), knob_name(TD_ENV_LAUNCH_DETECT));
    td__buf_addf(b,
                 "# Each node's launcher samples its workers' CPU, memory and GPU (this "
                 "supervisor cannot see\n# the nodes' /proc): steps are seconds since the "
                 "run was created.\nexport %s=%.3f\n",
                 td_var_name(TD_VAR_TANDEM_SYS_METRICS), job->run->created_s);
    td__buf_addf(b,
                 "# A requeued job (scontrol requeue, preemption, the time-limit requeue below) "
                 "resumes from the\n# newest checkpoint; each rank log says where.\n"
                 "if [ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ]; then\n"
                 "    export %s=1\n",
                 td_var_name(TD_VAR_TANDEM_RESUME));
    if (!link) {
        td__buf_addf(b,
                     "    r=0\n"
                     "    while [ \"$r\" -lt %d ]; do\n"
                     "        echo \"--- slurm requeue $SLURM_RESTART_COUNT of job "
                     "$SLURM_JOB_ID ---\" >>",
                     nodes * nproc);
        char *rank_log =
            td_xasprintf("%s/%s/rank-", run->run_dir, td_run_path_name(TD_RUN_PATH_LOGS));
        td__buf_quote(b, rank_log);
        free(rank_log);
        td__buf_addf(b, "\"$r.log\"\n        r=$((r + 1))\n    done\n");
    }
    td__buf_addf(b, "fi\n");
}

/* srun for the nodes that do not see the run directory (slurm: work_dir): each makes its copy
 * of the run and starts its launcher linked back to tandem run. */
static void script_srun_linked(td__buf *b, const td_exec_job *job, const char *link,
                               const node_paths *np, double grace) {
    int nproc = job->run->nproc_per_node;
    td__buf node = {0};
    td__buf_addf(&node, "d=");
    td__buf_quote(&node, np->node_run);
    td__buf_addf(&node,
                 "\ns=\"$d/spool/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}.${SLURM_STEP_ID:-0}\"\n"
                 "mkdir -p \"$d/work\" \"$s/logs\" \"$s/metrics\" || exit 1\n"
                 "if [ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ]; then\n"
                 "    r=$((SLURM_NODEID * %d)); e=$((r + %d))\n"
                 "    while [ \"$r\" -lt \"$e\" ]; do\n"
                 "        echo \"--- slurm requeue $SLURM_RESTART_COUNT of job "
                 "$SLURM_JOB_ID ---\" >>\"$s/logs/rank-$r.log\"\n"
                 "        r=$((r + 1))\n"
                 "    done\n"
                 "fi\n"
                 "cd \"$d/work\" || exit 1\nexec ",
                 nproc, nproc);
    td__buf_quote(&node, job->tandem_bin);
    td__buf_addf(&node, " launch --link=%s", link);
    /* the end record: the link sends it as RUN/end/node-N.json (tandem launch's default) */
    add_launch_args(&node, job, grace, "\"$s/logs\"", "\"$s/metrics\"", NULL);
    td__buf_addf(b, "/bin/sh -c ");
    td__buf_quote(b, node.s);
    free(node.s);
}

/* srun for nodes that share the run directory: the launchers write into it. */
static void script_srun_shared(td__buf *b, const td_exec_job *job, double grace) {
    const td_run *run = job->run;
    td__buf_quote(b, job->tandem_bin);
    td__buf_addf(b, " launch");
    td__buf dirs = {0};
    char *dir = td_run_path(run->run_dir, TD_RUN_PATH_LOGS);
    td__buf_quote(&dirs, dir);
    free(dir);
    size_t split = dirs.len;
    dir = td_run_path(run->run_dir, TD_RUN_PATH_METRICS);
    td__buf_quote(&dirs, dir);
    free(dir);
    char *log_word = td_xasprintf("%.*s", (int)split, dirs.s);
    /* one srun command line for every node: %n is each launcher's node rank */
    td__buf end_word = {0};
    char *end =
        td_xasprintf("%s/%s/node-%%n.json", run->run_dir, td_run_path_name(TD_RUN_PATH_END));
    td__buf_quote(&end_word, end);
    free(end);
    add_launch_args(b, job, grace, log_word, dirs.s + split, end_word.s);
    free(end_word.s);
    free(log_word);
    free(dirs.s);
}

char *td__slurm_batch_script(const td_exec_job *job, const char *token_path, const char *link) {
    const td_run *run = job->run;
    const td_slurm_options *o = job->slurm;
    td__buf b = {0};
    double lead = signal_lead(o);
    double grace = TD_MIN(LAUNCH_STOP_GRACE_S, TD_MAX(1.0, floor(lead / 2)));
    int nodes = run->nodes;
    node_paths np = {.run_dir = run->run_dir};
    if (link) np.node_run = td_xasprintf("%s/%s", o->work_dir, run->id);
    script_directives(&b, job, link, lead);
    script_environment(&b, job, token_path, link, &np);
    td__buf_addf(&b,
                 "\n# The time-limit signal (--signal=B:USR1@%.0f) comes to this shell alone: it "
                 "passes it on to the\n# launchers as SIGTERM (their workers stop at a step "
                 "boundary with a checkpoint) and, once\n# they have exited 143, requeues the job, "
                 "which continues under the same run id. (A SIGTERM to\n# this shell's srun would "
                 "end the step at once: srun takes it for a cancel.)\n"
                 "limit=0\n"
                 "trap 'limit=1; scancel --signal=TERM \"$SLURM_JOB_ID\"' USR1\n",
                 lead);
    if (link)
        td__buf_addf(&b,
                     "# On each node: its copy of the run (the code comes over the link, into "
                     "work/), a spool of\n# this job's own for the logs and metrics the link "
                     "carries (all of it follows what tandem run\n# has), the requeue line in "
                     "its own ranks' logs, and the launcher, linked back to tandem\n# run at "
                     "%s.\n",
                     link);
    /* Slurm never restarts a task inside a running job: a launcher that dies (SIGKILL, the OOM
     * killer) would leave the others waiting in the rendezvous for their 300 s. So a task that
     * ends badly ends the whole step (--kill-on-bad-exit: the others get SIGTERM and checkpoint
     * if they can), and a launcher lost to a signal starts the group again as a new step of
     * the same allocation while max_restarts allow, resuming from the newest checkpoint, as
     * torchrun's agents restart the group when one of them is lost. */
    td__buf_addf(&b,
                 "# A launcher lost to a signal (killed, out of memory: srun exits 128+N; 143 is a "
                 "stop that\n# checkpointed, 130 an interrupt) ends the step at once "
                 "(--kill-on-bad-exit), and the group\n# starts again as a new step while "
                 "max_restarts (%d) allow: each launcher's --restarts-before\n# counts it, and "
                 "the workers resume from the newest checkpoint.\n"
                 "tandem_step_restarts=0\nexport tandem_step_restarts\n"
                 "while :; do\n",
                 job->max_restarts);
    td__buf_addf(&b,
                 "srun --nodes=%d --ntasks=%d --ntasks-per-node=1 --kill-on-bad-exit=1 "
                 "${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK} \\\n    ",
                 nodes, nodes);
    if (link)
        script_srun_linked(&b, job, link, &np, grace);
    else
        script_srun_shared(&b, job, grace);
    td__buf_addf(&b, " &\n");
    td__buf_addf(&b, "# wait returns early when a trap runs: wait again until srun itself has "
                     "ended\nsrun_pid=$!\n"
                     "while :; do\n"
                     "    wait \"$srun_pid\"\n"
                     "    code=$?\n"
                     "    kill -0 \"$srun_pid\" 2>/dev/null || break\n"
                     "done\n");
    td__buf_addf(&b,
                 "if [ \"$limit\" = 0 ] && [ \"$code\" -gt 128 ] && [ \"$code\" != 130 ] && "
                 "[ \"$code\" != 143 ] &&\n"
                 "    [ \"$tandem_step_restarts\" -lt %d ]; then\n"
                 "    tandem_step_restarts=$((tandem_step_restarts + 1))\n"
                 "    echo \"tandem: a launcher of slurm job $SLURM_JOB_ID was lost (srun exit "
                 "$code): starting the group again as a new step (restart "
                 "$tandem_step_restarts of %d)\" >&2\n"
                 "    continue\n"
                 "fi\n"
                 "break\n"
                 "done\n",
                 job->max_restarts, job->max_restarts);
    td__buf_addf(&b, "if [ \"$limit\" = 1 ] && [ \"$code\" = 143 ]; then\n"
                     "    echo \"tandem: the time limit is near and the workers checkpointed: "
                     "requeueing slurm job $SLURM_JOB_ID\" >&2\n"
                     "    scontrol requeue \"$SLURM_JOB_ID\"\n"
                     "fi\n"
                     "exit \"$code\"\n");
    free(np.node_run);
    return b.s;
}

char **td__slurm_sbatch_argv(const char *sbatch, const td_slurm_options *o, const char *script) {
    size_t n = 0, extra = o ? o->nsbatch_args : 0;
    char **argv = td_xcalloc(extra + 5, sizeof *argv);
    argv[n++] = td_xstrdup(sbatch);
    argv[n++] = td_xstrdup("--parsable");
    /* sbatch's environment reaches the job: the token (slurm: work_dir) and the secrets travel
     * there. Said here, so an SBATCH_EXPORT in the submitting shell cannot turn it off. */
    argv[n++] = td_xstrdup("--export=ALL");
    for (size_t i = 0; i < extra; i++) argv[n++] = td_xstrdup(o->sbatch_args[i]);
    argv[n++] = td_xstrdup(script);
    argv[n] = NULL;
    return argv;
}

static void argv_free(char **argv) {
    for (size_t i = 0; argv && argv[i]; i++) free(argv[i]);
    free(argv);
}

/* ---- the supervisor ---- */
/* One of the job's output files, followed: lines go to a descriptor of ours. The root cause of
 * a failure comes from the launchers' end records (RUN/end/node-N.json), not from these lines. */
typedef struct {
    char *path;
    off_t off;
    td__buf line;
    int to_fd; /* -1: followed, not echoed (detached) */
} tail;

typedef struct {
    const td_exec_job *job;
    char *sbatch, *scontrol, *scancel;
    char job_id[32];
    tail out, err;
    char cause[1024]; /* why the job failed, when the scheduler alone cannot say */
    td__links *links; /* slurm: work_dir: the nodes' links back to us */
    td_run_status shown_status;
    char shown_note[768];
    int query_warned;
} slurm_sup;

/* A progress line ("tandem: ...") and how a run fails before its job ran: exec.c's. */
#define say(c, ...)          td__exec_say((c)->job->out, __VA_ARGS__)
#define fail_run(c, t0, ...) td__exec_fail((c)->job, (t0), __VA_ARGS__)
#define write_all            td__exec_write_all

static void tail_line(slurm_sup *c, tail *t) {
    (void)c;
    write_all(t->to_fd, t->line.s, t->line.len);
    t->line.len = 0;
    t->line.s[0] = '\0';
}

static void tail_pump(slurm_sup *c, tail *t, int final) {
    if (!t->path) return;
    int fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return; /* not there until the job starts */
    struct stat stt;
    if (fstat(fd, &stt) == 0 && stt.st_size < t->off) t->off = 0; /* replaced: start over */
    char buf[8192];
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, t->off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        t->off += n;
        for (ssize_t i = 0; i < n; i++) {
            td__buf_add(&t->line, &buf[i], 1);
            if (buf[i] == '\n' || t->line.len >= 65536) tail_line(c, t);
        }
    }
    close(fd);
    if (final && t->line.len) {
        td__buf_add(&t->line, "\n", 1);
        tail_line(c, t);
    }
}

static void tail_init(tail *t, const char *run_dir, const char *job_id, const char *ext,
                      int to_fd) {
    t->path =
        td_xasprintf("%s/%s/slurm-%s.%s", run_dir, td_run_path_name(TD_RUN_PATH_LOGS), job_id, ext);
    t->to_fd = to_fd;
    td__buf_add(&t->line, "", 0);
    /* A resume may reuse nothing of an earlier job's files, but a restarted supervisor of the
     * same job must not print them twice: start from what is there now. */
    struct stat stt;
    t->off = stat(t->path, &stt) == 0 ? stt.st_size : 0;
}

static void tail_free(tail *t) {
    free(t->path);
    free(t->line.s);
}

/* The first line of s, trimmed, for messages. */
static void first_line(const char *s, char *out, size_t nbytes) {
    while (s && isspace((unsigned char)*s)) s++;
    size_t n = s ? strcspn(s, "\n") : 0;
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    snprintf(out, nbytes, "%.*s", (int)n, s ? s : "");
}

/* scontrol show job -o JOB. *gone: slurmctld no longer knows the job. TD_ERR_PEER when
 * scontrol cannot get an answer (the controller is down or busy): the caller tries again. */
static td_status query_job(slurm_sup *c, const char *job_id, td__slurm_job *j, int *gone) {
    char *argv[] = {c->scontrol, "show", "job", "-o", (char *)job_id, NULL};
    char *out = NULL, *err = NULL;
    int code = 0;
    *gone = 0;
    td_status st = td__exec_capture(argv, NULL, CMD_TIMEOUT_S, &out, &err, &code);
    if (st == TD_OK) {
        if (code == 0 && out[0]) {
            st = td__slurm_parse_job(out, j);
        } else if (strstr(err, "Invalid job id")) {
            *gone = 1;
        } else {
            char line[300];
            first_line(err[0] ? err : out, line, sizeof line);
            st =
                td_error(TD_ERR_PEER, "scontrol show job %s: exit code %d: %s", job_id, code, line);
        }
    }
    free(out);
    free(err);
    return st;
}

/* scancel [--signal=TERM] JOB; a failure is reported, not fatal (the job may have just
 * ended). */
static void cancel_job(slurm_sup *c, const char *job_id, int term_only) {
    char *argv[] = {c->scancel, term_only ? "--signal=TERM" : (char *)job_id,
                    term_only ? (char *)job_id : NULL, NULL};
    char *out = NULL, *err = NULL;
    int code = 0;
    if (td__exec_capture(argv, NULL, CMD_TIMEOUT_S, &out, &err, &code) != TD_OK) {
        TD_LOG_WARN("scancel %s: %s", job_id, td_error_msg());
        td_error_clear();
    } else if (code != 0) {
        char line[300];
        first_line(err, line, sizeof line);
        TD_LOG_WARN("scancel%s %s: exit code %d: %s", term_only ? " --signal=TERM" : "", job_id,
                    code, line);
    }
    free(out);
    free(err);
}

/* The run's status and note while the job lives, written when they change. */
static void show_live(slurm_sup *c, const td__slurm_job *j) {
    const td_exec_job *job = c->job;
    td_run_status st =
        td__slurm_phase_of(j->state) == TD__SLURM_WAITING ? TD_RUN_PENDING : TD_RUN_RUNNING;
    char note[768];
    td__slurm_live_note(c->job_id, j, note, sizeof note);
    if (st != c->shown_status || strcmp(note, c->shown_note)) {
        if (td_run_set_status(job->store, job->run->id, st, -1, note) != TD_OK) {
            TD_LOG_WARN("run %s: %s", job->run->id, td_error_msg());
            td_error_clear();
        } else {
            c->shown_status = st;
            snprintf(c->shown_note, sizeof c->shown_note, "%s", note);
            say(c, "%s", note);
        }
    }
}

/* RUN/slurm-job: the newest job submitted for the run, its id on the first line; a second line
 * "ended STATE" once its supervisor saw it end. Only a job without that line can be left in
 * the queue by a supervisor that died. */
static char *job_file(const td_run *run) {
    return td_run_path(run->run_dir, TD_RUN_PATH_SLURM_JOB);
}

static void write_job_file(const td_run *run, const char *job_id, const char *ended) {
    char *path = job_file(run);
    char text[96];
    snprintf(text, sizeof text, "%s\n%s%s%s", job_id, ended ? "ended " : "", ended ? ended : "",
             ended ? "\n" : "");
    td_chunk chunk = {text, strlen(text)};
    if (td_write_atomic(path, "Slurm job id", &chunk, 1) != TD_OK) {
        /* Only `tandem stop` of an orphaned job needs the file: go on without it. */
        TD_LOG_WARN("%s", td_error_msg());
        td_error_clear();
    }
    free(path);
}

/* The id of the newest job submitted for run, or "" when none was; *ended (may be NULL): its
 * supervisor saw it end. */
static void read_job_id(const td_run *run, char *out, size_t nbytes, int *ended) {
    out[0] = '\0';
    if (ended) *ended = 0;
    char *path = job_file(run);
    FILE *f = fopen(path, "r");
    free(path);
    if (!f) return;
    char line[64] = "";
    if (fgets(line, sizeof line, f)) first_line(line, out, nbytes);
    if (ended && fgets(line, sizeof line, f)) *ended = !strncmp(line, "ended ", 6);
    fclose(f);
}

static int find_commands(slurm_sup *c, char *missing, size_t nbytes) {
    c->sbatch = td__exec_which("sbatch");
    c->scontrol = td__exec_which("scontrol");
    c->scancel = td__exec_which("scancel");
    snprintf(missing, nbytes, "%s%s%s", c->sbatch ? "" : "sbatch ", c->scontrol ? "" : "scontrol ",
             c->scancel ? "" : "scancel ");
    return c->sbatch && c->scontrol && c->scancel;
}

/* Before the job: no earlier job of the run still queued or running (two jobs would train into
 * the same checkpoints; the run's lock keeps a second supervisor out, not a job whose supervisor
 * is gone), the token, the links (slurm: work_dir), the batch script, no stale end records. 0, or
 * tandem run's exit code after recording the failure. */
static int slurm_prepare(slurm_sup *c, double t0, char token[33], char **token_path,
                         char **script_path) {
    const td_exec_job *job = c->job;
    const td_run *run = job->run;
    char missing[64];
    if (!find_commands(c, missing, sizeof missing))
        return fail_run(c, t0,
                        "executor slurm: %sis not on PATH; run tandem run where Slurm's client "
                        "commands are (a login node of the cluster), or install them "
                        "(Debian: slurm-client)",
                        missing);
    char old[32];
    int old_ended = 0;
    read_job_id(run, old, sizeof old, &old_ended);
    if (old[0] && !old_ended) {
        td__slurm_job j;
        int gone = 0;
        if (query_job(c, old, &j, &gone) == TD_OK && !gone &&
            td__slurm_phase_of(j.state) != TD__SLURM_ENDED)
            return fail_run(c, t0,
                            "slurm job %s of run %s is still %s; cancel it first (scancel %s, or "
                            "tandem stop %s) so that two jobs never share the run's checkpoints",
                            old, run->id, j.state, old, run->id);
        td_error_clear();
    }
    /* With slurm: work_dir the nodes see nothing of ours: the token goes in sbatch's
     * environment, and the code, logs, metrics and artifacts over the nodes' links. */
    int linked = job->slurm && job->slurm->work_dir;
    td_status st = linked ? td__exec_read_token(run, token) : td__exec_token(run, token_path);
    if (st == TD_OK && linked) {
        char host[256] = "";
        if (job->slurm->link_host)
            snprintf(host, sizeof host, "%s", job->slurm->link_host);
        else if (gethostname(host, sizeof host - 1) != 0 || !host[0])
            snprintf(host, sizeof host, "localhost");
        st = td__links_open(job, token, host, &c->links);
    }
    if (st == TD_OK) {
        char *script =
            td__slurm_batch_script(job, *token_path, linked ? td__links_endpoint(c->links) : NULL);
        *script_path = td_run_path(run->run_dir, TD_RUN_PATH_SLURM_SCRIPT);
        td_chunk chunk = {script, strlen(script)};
        st = td_write_atomic(*script_path, "Slurm batch script", &chunk, 1);
        free(script);
    }
    /* the launchers' end records of an earlier attempt (a resume) must not speak for this one */
    if (st == TD_OK) st = td_exec_end_records_reset(run, run->nodes);
    if (st != TD_OK) {
        int cli = fail_run(c, t0, "supervisor error: %s", td_error_msg());
        td_error_print(st);
        return cli;
    }
    return 0;
}

/* The job's secrets set in our environment for sbatch to pass on; returns what each name held
 * before (NULL: unset), for secrets_out_of_environ to put back. */
static char **secrets_into_environ(char *const *secrets) {
    size_t n = 0;
    while (secrets && secrets[n]) n++;
    char **saved = td_xcalloc(n + 1, sizeof *saved);
    for (size_t i = 0; i < n; i++) {
        char *name = td_xasprintf("%.*s", (int)strcspn(secrets[i], "="), secrets[i]);
        const char *old = getenv(name);
        saved[i] = old ? td_xstrdup(old) : NULL;
        setenv(name, strchr(secrets[i], '=') + 1, 1);
        free(name);
    }
    return saved;
}

static void secrets_out_of_environ(char *const *secrets, char **saved) {
    for (size_t i = 0; secrets && secrets[i]; i++) {
        char *name = td_xasprintf("%.*s", (int)strcspn(secrets[i], "="), secrets[i]);
        if (saved[i])
            setenv(name, saved[i], 1);
        else
            unsetenv(name);
        td__exec_wipe_free(saved[i]);
        free(name);
    }
    free(saved);
}

/* sbatch: the job's id into c->job_id, and where its output goes. 0, or tandem run's exit code
 * after recording the refusal. */
static int slurm_submit(slurm_sup *c, double t0, char token[33], const char *script_path) {
    const td_exec_job *job = c->job;
    const td_run *run = job->run;
    int linked = c->links != NULL;
    char **argv = td__slurm_sbatch_argv(c->sbatch, job->slurm, script_path);
    char *out = NULL, *err = NULL, line[512];
    int code = 0, cli = 0;
    /* sbatch passes its environment to the job (--export=ALL): the token and the secrets ride
     * there, and leave ours again at once (the script was written without them). */
    if (linked) setenv(td_var_name(TD_VAR_TANDEM_TOKEN), token, 1);
    char **saved = secrets_into_environ(job->secrets);
    td_status st = td__exec_capture(argv, job->work_dir, CMD_TIMEOUT_S, &out, &err, &code);
    secrets_out_of_environ(job->secrets, saved);
    if (linked) unsetenv(td_var_name(TD_VAR_TANDEM_TOKEN));
    memset(token, 0, 33);
    argv_free(argv);
    if (st != TD_OK) {
        cli = fail_run(c, t0, "cannot submit the run's Slurm job: %s", td_error_msg());
        td_error_clear();
        goto out;
    }
    first_line(out, line, sizeof line);
    size_t idlen = strspn(line, "0123456789");
    if (code != 0 || idlen == 0 || idlen >= sizeof c->job_id ||
        (line[idlen] && line[idlen] != ';')) {
        char why[600];
        td__exec_joined_lines(err[0] ? err : out, why, sizeof why);
        cli = fail_run(c, t0, "sbatch refused the run's job (exit code %d): %s", code,
                       why[0] ? why : "(no message)");
        goto out;
    }
    memcpy(c->job_id, line, idlen);
    c->job_id[idlen] = '\0';
    write_job_file(run, c->job_id, NULL);
    if (linked)
        say(c,
            "run %s: submitted slurm job %s (%d node%s x %d worker%s); the nodes keep the run in "
            "%s/%s and link back to %s",
            run->id, c->job_id, run->nodes, run->nodes > 1 ? "s" : "", run->nproc_per_node,
            run->nproc_per_node > 1 ? "s" : "", job->slurm->work_dir, run->id,
            td__links_endpoint(c->links));
    else
        say(c,
            "run %s: submitted slurm job %s (%d node%s x %d worker%s); output in "
            "%s/logs/slurm-%s.*",
            run->id, c->job_id, run->nodes, run->nodes > 1 ? "s" : "", run->nproc_per_node,
            run->nproc_per_node > 1 ? "s" : "", run->run_dir, c->job_id);
    if (!linked) { /* else the output stays on the first node; the links carry the rest */
        tail_init(&c->out, run->run_dir, c->job_id, "out", job->quiet_output ? -1 : STDOUT_FILENO);
        tail_init(&c->err, run->run_dir, c->job_id, "err", STDERR_FILENO);
    }
out:
    free(out);
    free(err);
    return cli;
}

/* The job's state from slurmctld, once per QUERY_PERIOD_S: returns 1 once it has ended (or is
 * no longer known: *gone). */
static int slurm_query(slurm_sup *c, td__slurm_job *j, int *gone, double now, double *run_since) {
    td__slurm_job nj;
    td_status st = query_job(c, c->job_id, &nj, gone);
    td__slurm_phase phase = td__slurm_phase_of(j->state);
    if (st == TD_OK && !*gone) {
        *j = nj;
        phase = td__slurm_phase_of(j->state);
        if (phase == TD__SLURM_ACTIVE && *run_since == 0) *run_since = now;
        if (phase != TD__SLURM_ENDED) show_live(c, j);
        if (c->query_warned) say(c, "slurmctld answers again");
        c->query_warned = 0;
    } else if (st != TD_OK) {
        if (!c->query_warned)
            TD_LOG_WARN("%s (will keep asking every %.1f s)", td_error_msg(), QUERY_PERIOD_S);
        c->query_warned = 1;
        td_error_clear();
    }
    return *gone || phase == TD__SLURM_ENDED;
}

/* ---- the carrier: the job on the supervisor's event loop ----
 * Timers: the job's state from slurmctld (QUERY_PERIOD_S), its output files (TAIL_PERIOD_S);
 * with slurm: work_dir, the nodes' links are watched on the same loop. The job first seen
 * running is every node running (max_duration counts from there); Slurm's requeues are the
 * nodes' restarts. Once the job has ended, what the links still carry arrives (DRAIN_S at most),
 * then the attempt is over, with the launchers' end records. Slurm requeues by itself, and the
 * batch script starts a new step after a lost launcher (counted in the end records' restarts):
 * the supervisor restarts nothing for this carrier. */
#define DRAIN_S 10.0

typedef struct {
    td__carrier base;
    slurm_sup *c;
    td__sup *sup;
    td__slurm_job j;
    int gone;
    bool running, cancelled, ended;
    int worker_code; /* from the end records, for the outcome */
    double run_since, drain_until;
    uint64_t query_timer, tail_timer, drain_timer;
} slurm_carrier;

/* The job has ended and its links carried what they had: the attempt is over. */
static void job_over(slurm_carrier *sc) {
    slurm_sup *c = sc->c;
    const td_exec_job *job = c->job;
    const td_run *run = job->run;
    td__sup_exit e = {.worker_code = -1};
    if (c->links) {
        td__links_flush_lines(c->links);
        td__links_detach(c->links);
        if (!td__links_nodes_seen(c->links) && sc->j.nodes[0]) {
            char *why = td_xasprintf(
                "slurm job %s ran on %s, but no node connected back to tandem run at %s (slurm: "
                "link_host: can the nodes reach this machine by that name?); the launchers' "
                "messages are in %s/%s-slurm-%s.err on the job's first node",
                c->job_id, sc->j.nodes, td__links_endpoint(c->links), job->slurm->work_dir, run->id,
                c->job_id);
            snprintf(c->cause, sizeof c->cause, "%.*s", (int)sizeof c->cause - 1, why);
            free(why);
        }
    }
    /* How the launchers ended, in their own records (in the shared run directory, or sent over
     * their links): the failing worker's cause, its last error line and its exit code. */
    td_exec_end_summary ends;
    td_exec_end_records_read(run, run->nodes, NULL, &ends);
    if (ends.worker_code >= 0 || (!c->cause[0] && ends.records && ends.cause[0]))
        snprintf(c->cause, sizeof c->cause, "%s", ends.cause);
    sc->worker_code = ends.worker_code;
    if (sc->gone) memset(&sc->j, 0, sizeof sc->j); /* what the outcome reads as "no longer known" */
    e.code = !sc->j.nodes[0] ? -1 : sc->j.exit_signal ? 128 + sc->j.exit_signal : sc->j.exit_code;
    e.worker_code = ends.worker_code;
    e.node_restarts = sc->j.restarts + ends.restarts; /* requeues, and the launchers' own */
    snprintf(e.cause, sizeof e.cause, "%s", c->cause);
    td__sup_attempt_over(sc->sup, &e);
}

static void on_drain(td_loop *l, void *user) {
    slurm_carrier *sc = user;
    if (td__links_open_count(sc->c->links) > 0 && td_now_s() < sc->drain_until) return;
    td_loop_cancel(l, sc->drain_timer);
    sc->drain_timer = 0;
    job_over(sc);
}

/* The job ended (or slurmctld no longer knows it): the rest of its output, then the links'. */
static void job_ended(slurm_carrier *sc) {
    slurm_sup *c = sc->c;
    td_loop *l = td__sup_loop(sc->sup);
    sc->ended = true;
    td_loop_cancel(l, sc->query_timer);
    td_loop_cancel(l, sc->tail_timer);
    sc->query_timer = sc->tail_timer = 0;
    write_job_file(c->job->run, c->job_id, sc->gone ? "GONE" : sc->j.state);
    tail_pump(c, &c->out, 1);
    tail_pump(c, &c->err, 1);
    if (c->links && td__links_open_count(c->links) > 0) {
        /* The agents sent everything before they exited; what is still in flight arrives. */
        sc->drain_until = td_now_s() + DRAIN_S;
        sc->drain_timer = td_loop_timer(l, 0.1, 0.1, on_drain, sc);
        return;
    }
    job_over(sc);
}

/* The job's state from slurmctld now; true when it has ended (job_ended has run). */
static bool refresh_job(slurm_carrier *sc) {
    if (slurm_query(sc->c, &sc->j, &sc->gone, td_now_s(), &sc->run_since)) {
        job_ended(sc);
        return true;
    }
    if (sc->j.restarts > 0) td__sup_restarts_seen(sc->sup, sc->j.restarts);
    if (!sc->running && sc->run_since > 0) {
        sc->running = true;
        td__sup_running_now(sc->sup);
    }
    return false;
}

static void on_query(td_loop *l, void *user) {
    (void)l;
    refresh_job(user);
}

static void on_tail(td_loop *l, void *user) {
    (void)l;
    slurm_carrier *sc = user;
    tail_pump(sc->c, &sc->c->out, 0);
    tail_pump(sc->c, &sc->c->err, 0);
}

/* The job was submitted before (sbatch's refusal is the run's note): watch it. */
static td_status slurm_start(td__carrier *base, td__sup *sup, bool resume) {
    slurm_carrier *sc = (slurm_carrier *)base;
    (void)resume; /* one attempt: Slurm requeues the job itself */
    td_loop *l = td__sup_loop(sup);
    sc->sup = sup;
    memset(&sc->j, 0, sizeof sc->j);
    snprintf(sc->j.state, sizeof sc->j.state, "PENDING");
    show_live(sc->c, &sc->j);
    if (sc->c->links) TD_CHECK(td__links_attach(sc->c->links, l));
    sc->query_timer = td_loop_timer(l, 0, QUERY_PERIOD_S, on_query, sc);
    sc->tail_timer = td_loop_timer(l, TAIL_PERIOD_S, TAIL_PERIOD_S, on_tail, sc);
    return TD_OK;
}

/* A queued job has nothing to checkpoint: it is cancelled. A running one: SIGTERM to the
 * launchers (not to the batch shell: its srun would end the step at once); the hard stop is a
 * plain scancel. */
static void slurm_stop(td__carrier *base, bool hard) {
    slurm_carrier *sc = (slurm_carrier *)base;
    slurm_sup *c = sc->c;
    if (sc->ended || sc->cancelled) return;
    bool queued = td__slurm_phase_of(sc->j.state) == TD__SLURM_WAITING;
    /* The state we hold is up to QUERY_PERIOD_S old: a job that started since would be
     * cancelled outright, its workers' checkpoint lost. Ask again before cancelling. */
    if (!hard && queued) {
        if (refresh_job(sc)) return;
        queued = td__slurm_phase_of(sc->j.state) == TD__SLURM_WAITING;
    }
    if (hard || queued) {
        td__sup_say(sc->sup, "run %s: cancelling slurm job %s", c->job->run->id, c->job_id);
        cancel_job(c, c->job_id, 0);
        sc->cancelled = true;
    } else {
        td__sup_say(sc->sup, "run %s: SIGTERM to the launchers of slurm job %s", c->job->run->id,
                    c->job_id);
        cancel_job(c, c->job_id, 1);
    }
}

/* The outcome as the scheduler tells it: a time limit, a preemption, a lost node, a cancel from
 * outside tandem, out of memory. */
static void slurm_outcome(td__carrier *base, const td__sup_machine *m, td__exec_outcome *o) {
    slurm_carrier *sc = (slurm_carrier *)base;
    const td_exec_stop *stop = &m->stop;
    td__slurm_outcome(sc->c->job->run->id, sc->c->job_id, &sc->j,
                      stop->active && !stop->preempt ? stop->stopped_by : NULL, stop->preempt,
                      sc->c->cause, sc->worker_code, o);
}

static const td__carrier_ops slurm_ops = {
    .name = "slurm",
    .start = slurm_start,
    .stop = slurm_stop,
    .outcome = slurm_outcome,
};

static int slurm_run(const td_exec_job *job) {
    slurm_sup c = {.job = job, .shown_status = TD_RUN_STATUS_COUNT};
    double t0 = td_now_s();
    char token[33] = "", *token_path = NULL, *script_path = NULL;
    int cli = slurm_prepare(&c, t0, token, &token_path, &script_path);
    if (!cli) cli = slurm_submit(&c, t0, token, script_path);
    if (!cli) {
        slurm_carrier sc = {.base = {&slurm_ops}, .c = &c, .worker_code = -1};
        cli = td__supervise(job, &sc.base, 0, CANCEL_AFTER_S, NULL, t0);
    }
    memset(token, 0, sizeof token);
    td__links_free(c.links);
    tail_free(&c.out);
    tail_free(&c.err);
    free(script_path);
    free(token_path);
    free(c.sbatch);
    free(c.scontrol);
    free(c.scancel);
    return cli;
}

/* ---- after the supervisor ---- */
static td_status slurm_cancel_orphan(const td_run *run, int *cancelled, char *buf, size_t nbytes) {
    *cancelled = 0;
    buf[0] = '\0';
    char id[32];
    int ended = 0;
    read_job_id(run, id, sizeof id, &ended);
    if (!id[0] || ended) return TD_OK;
    slurm_sup c = {0};
    char missing[64];
    td_status st = TD_OK;
    if (!find_commands(&c, missing, sizeof missing)) {
        st = td_error(TD_ERR_UNSUPPORTED,
                      "run %s has slurm job %s, which may still be queued or running, but %sis "
                      "not on PATH here; cancel it where Slurm's commands are (scancel %s)",
                      run->id, id, missing, id);
        goto out;
    }
    td__slurm_job j;
    int gone = 0;
    st = query_job(&c, id, &j, &gone);
    if (st != TD_OK || gone || td__slurm_phase_of(j.state) == TD__SLURM_ENDED) goto out;
    /* Nobody is left to wait for a checkpoint: a plain scancel, whose SIGTERM still gives the
     * workers Slurm's KillWait to write one. */
    cancel_job(&c, id, 0);
    *cancelled = 1;
    snprintf(buf, nbytes, "cancelled slurm job %s of run %s (it was %s without a supervisor)", id,
             run->id, j.state);
out:
    free(c.sbatch);
    free(c.scontrol);
    free(c.scancel);
    return st;
}

static char *slurm_describe(const td_run *run) {
    char id[32];
    read_job_id(run, id, sizeof id, NULL);
    if (!id[0])
        return td_xasprintf("slurm (no job submitted); batch script %s/job.sbatch", run->run_dir);
    /* RUN/code.tar: the nodes had no shared file system (slurm: work_dir), and the job's
     * output stayed on its first node. */
    char *code = td_run_path(run->run_dir, TD_RUN_PATH_CODE_TAR);
    int linked = access(code, F_OK) == 0;
    free(code);
    if (linked)
        return td_xasprintf("slurm job %s; batch script %s/job.sbatch, its output on the job's "
                            "first node (slurm: work_dir), the nodes' messages in "
                            "logs/node-N.log",
                            id, run->run_dir);
    return td_xasprintf("slurm job %s; batch script %s/job.sbatch, its output "
                        "%s/logs/slurm-%s.out and .err",
                        id, run->run_dir, run->run_dir, id);
}

const td_executor td__executor_slurm = {
    .name = "slurm",
    .run = slurm_run,
    .cancel_orphan = slurm_cancel_orphan,
    .describe = slurm_describe,
};
