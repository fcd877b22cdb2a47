/* tandem kill: signal one rank's worker of a run (default SIGKILL), to see the run recover as a
 * crash would make it. The worker is found through the run's own records, never by a name that
 * other runs share: the run's supervisor pid from the store, taken only while that process is
 * the one recorded (td_run_signal_supervisor with signal 0 makes the same identity test as a
 * stop), then, among that process's descendants, the one whose environment says it is this run's
 * worker of this rank (TANDEM_RUN_ID and RANK, which `tandem launch` sets for every worker). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"

enum { OPT_RANK = 1, OPT_SIGNAL };

static const cli_opt opts[] = {
    {OPT_RANK, "rank", 0, "R", "the worker's global rank (required)", 0},
    {OPT_SIGNAL, "signal", 0, "SIG", "KILL (default), TERM, INT, or a number", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem kill",
    .usage = "RUN --rank R [--signal SIG]",
    .about = "Sends a signal (default SIGKILL) to the worker of rank R of a live run on this\n"
             "machine, and to the processes it started (its process group): the launcher sees\n"
             "a worker die, and with max_restarts the run restarts from its newest checkpoint.\n"
             "The worker is found under the run's own supervisor (tandem show: supervisor\n"
             "pid), so no other run's process is ever hit.\n",
    .opts = opts,
};

static const struct {
    const char *name;
    int sig;
} signal_names[] = {{"KILL", SIGKILL}, {"TERM", SIGTERM}, {"INT", SIGINT},
                    {"HUP", SIGHUP},   {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};

/* KILL, SIGKILL, kill or 9 -> 9; -1 for anything else. */
static int parse_signal(const char *text) {
    char *end = NULL;
    long n = strtol(text, &end, 10);
    if (*text && !*end) return n > 0 && n < NSIG ? (int)n : -1;
    if (!strncasecmp(text, "SIG", 3)) text += 3;
    for (size_t i = 0; i < TD_ARRAY_LEN(signal_names); i++)
        if (!strcasecmp(text, signal_names[i].name)) return signal_names[i].sig;
    return -1;
}

/* "SIGKILL" for 9, "signal 40" for one without a name here. */
static const char *signal_label(int sig, char *buf, size_t nbytes) {
    for (size_t i = 0; i < TD_ARRAY_LEN(signal_names); i++)
        if (signal_names[i].sig == sig) {
            snprintf(buf, nbytes, "SIG%s", signal_names[i].name);
            return buf;
        }
    snprintf(buf, nbytes, "signal %d", sig);
    return buf;
}

/* The parent pid of pid from /proc/PID/stat (after the command's closing ')', which may itself
 * hold ')' and spaces); -1 when it is gone. */
static pid_t parent_of(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *close = strrchr(buf, ')');
    int ppid;
    if (!close || sscanf(close + 1, " %*c %d", &ppid) != 1) return -1;
    return (pid_t)ppid;
}

/* 1 when pid's environment holds both NAME=VALUE entries (run id and rank), else 0 (also when
 * it cannot be read: another user's process, or gone). */
static int is_worker(pid_t pid, const char *run_entry, const char *rank_entry) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    size_t cap = 1 << 16, n = 0;
    char *buf = td_xmalloc(cap + 1);
    for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) buf = td_xrealloc(buf, (cap *= 2) + 1);
    }
    fclose(f);
    buf[n] = '\0';
    int has_run = 0, has_rank = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
        has_run |= !strcmp(buf + i, run_entry);
        has_rank |= !strcmp(buf + i, rank_entry);
    }
    free(buf);
    return has_run && has_rank;
}

/* The worker of rank `rank` of run `id` among the descendants of `root`: the topmost process
 * with that run id and rank in its environment (the launcher's child; what it started, a shell's
 * python or a DataLoader's workers, inherits the same variables). 0 when there is none. */
static pid_t find_worker(pid_t root, const char *id, int rank) {
    size_t cap = 256, n = 0;
    pid_t *pids = td_xmalloc(cap * sizeof *pids), *parents = td_xmalloc(cap * sizeof *parents);
    DIR *d = opendir("/proc");
    if (!d) {
        free(pids);
        free(parents);
        return 0;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        pid_t pid = (pid_t)atoi(e->d_name), ppid = parent_of(pid);
        if (ppid < 0) continue;
        if (n == cap) {
            cap *= 2;
            pids = td_xrealloc(pids, cap * sizeof *pids);
            parents = td_xrealloc(parents, cap * sizeof *parents);
        }
        pids[n] = pid;
        parents[n++] = ppid;
    }
    closedir(d);
    /* Breadth first from the supervisor: a parent is seen before its children, so the first
     * match is the topmost worker process. */
    pid_t *queue = td_xmalloc((n + 1) * sizeof *queue);
    size_t head = 0, tail = 0;
    queue[tail++] = root;
    char *run_entry = td_xasprintf("%s=%s", td_var_name(TD_VAR_TANDEM_RUN_ID), id);
    char *rank_entry = td_xasprintf("%s=%d", td_var_name(TD_VAR_RANK), rank);
    pid_t found = 0;
    while (head < tail && !found) {
        pid_t p = queue[head++];
        for (size_t i = 0; i < n && !found; i++) {
            if (parents[i] != p) continue;
            if (is_worker(pids[i], run_entry, rank_entry))
                found = pids[i];
            else if (tail <= n)
                queue[tail++] = pids[i];
        }
    }
    free(run_entry);
    free(rank_entry);
    free(queue);
    free(pids);
    free(parents);
    return found;
}

int cmd_kill(int argc, char **argv) {
    const char *id = NULL, *sig_text = "KILL";
    int rank = -1, rc;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (c == OPT_RANK) {
            if ((rc = run_cli_rank(&verb, p.value, &rank)) >= 0) return rc;
        } else if (c == OPT_SIGNAL)
            sig_text = p.value;
        else if ((rc = run_cli_id(&verb, p.value, &id)) >= 0)
            return rc;
    }
    int sig = parse_signal(sig_text);
    if (sig < 0)
        return cli_error(&verb, "--signal '%s': expects a signal name (KILL, TERM, INT, HUP, USR1, "
                                "USR2) or number",
                         sig_text);
    if (id && rank < 0)
        return cli_error(&verb, "which worker? --rank R is required (0 .. world size - 1)");
    td_rundb *store;
    td_run r;
    if ((rc = run_cli_open_run(&verb, id, &store, &r))) return rc;
    /* A supervisor that died is found out here, as `tandem ps` would, so a stale "running" is
     * not taken for a live run. */
    if (td_run_reap_stale(store, &r) != TD_OK) td_error_clear();
    rc = 1;
    int world = r.nodes * r.nproc_per_node;
    if (td_run_status_is_final(r.status)) {
        fprintf(stderr, "tandem: error: run %s has ended (%s): it has no worker to signal\n",
                run_cli_text(r.id), td_run_status_str(r.status));
    } else if (world > 0 && rank >= world) {
        fprintf(stderr, "tandem: error: run %s has %d worker(s), ranks 0 .. %d; --rank %d is none "
                        "of them\n",
                run_cli_text(r.id), world, world - 1, rank);
        rc = 2;
    } else if (td_executor_of_run(&r)) {
        fprintf(stderr, "tandem: error: run %s runs its workers on other machines (%s); kill "
                        "rank %d there, or `tandem stop %s`\n",
                run_cli_text(r.id), td_executor_of_run(&r)->name, rank, run_cli_text(r.id));
    } else if (r.supervisor_pid <= 0 || td_run_signal_supervisor(&r, 0) != 0) {
        fprintf(stderr, "tandem: error: run %s has no live supervisor on this machine (status %s); "
                        "its workers are not ours to find\n",
                run_cli_text(r.id), td_run_status_str(r.status));
    } else {
        pid_t pid = find_worker((pid_t)r.supervisor_pid, r.id, rank);
        if (!pid) {
            fprintf(stderr, "tandem: error: run %s has no live worker of rank %d now (starting, "
                            "restarting or finishing: tandem show %s); try again\n",
                    run_cli_text(r.id), rank, run_cli_text(r.id));
        } else {
            /* The launcher makes each worker the leader of its own process group: the whole
             * group goes, as when the worker crashes and the launcher cleans up after it. */
            int group = getpgid(pid) == pid;
            char label[32];
            signal_label(sig, label, sizeof label);
            if (kill(group ? -pid : pid, sig) != 0) {
                fprintf(stderr, "tandem: error: %s to rank %d of run %s (pid %d): %s\n", label,
                        rank, run_cli_text(r.id), (int)pid, strerror(errno));
            } else {
                printf("sent %s to rank %d of run %s (pid %d%s)\n", label, rank,
                       run_cli_text(r.id), (int)pid, group ? " and its process group" : "");
                rc = 0;
            }
        }
    }
    run_cli_close(store, &r);
    return rc;
}
