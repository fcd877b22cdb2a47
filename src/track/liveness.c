/* Whether a run's processes still live: the supervisor's pid and start time, the lock its
 * workers hold, the signals sent to it, and the reaping of runs whose supervisor is gone. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* When process pid started: field 22 of /proc/PID/stat, in clock ticks after boot. > 0: the start
 * time; -1: no such process (its /proc entry is gone, or it is a zombie: dead, not yet waited
 * for); 0: unknown (no /proc, unreadable, or not in the format expected). The second field is
 * the command name in parentheses, which may hold spaces and parentheses itself ("(a) b)"): the
 * fields are counted from after the last ')'. */
static int64_t proc_start_ticks(int64_t pid) {
    if (pid <= 0) return -1;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT && errno != ESRCH) return 0;
        /* A /proc without the entry says the process is gone; no /proc at all says nothing. */
        return access("/proc/self/stat", F_OK) == 0 ? -1 : 0;
    }
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf - 1)) < 0 && errno == EINTR) {
    }
    int err = errno;
    close(fd);
    if (n <= 0) return n < 0 && err == ESRCH ? -1 : 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p) return 0;
    p++;
    while (*p == ' ') p++;
    if (*p == 'Z' || *p == 'X') return -1; /* field 3, the state: zombie or dead */
    /* After ')': field 3 (state) is the first, so field 22 (starttime) is the 20th. */
    for (int field = 3; field < 22; field++) {
        while (*p == ' ') p++;
        if (!*p) return 0;
        while (*p && *p != ' ') p++;
    }
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || (*end && *end != ' ' && *end != '\n') || v == 0 || v > INT64_MAX) return 0;
    return (int64_t)v;
}

struct supervisor_args {
    const char *id;
    int64_t pid, start;
};

static void bind_supervisor(sqlite3_stmt *q, const void *p) {
    const struct supervisor_args *a = p;
    sqlite3_bind_int64(q, 1, a->pid);
    sqlite3_bind_int64(q, 2, a->start);
    sqlite3_bind_text(q, 3, a->id, -1, SQLITE_STATIC);
}

td_status td_run_set_supervisor(td_rundb *store, const char *id, int64_t pid) {
    /* Read now, while the process is there: with the pid it names the one process, so a later
     * process that is handed the same pid is never taken for this supervisor. */
    int64_t start = proc_start_ticks(pid);
    struct supervisor_args a = {id, pid, start > 0 ? start : 0};
    int changed = 0;
    td_status st = td__run_update_row(store, id,
                                      "UPDATE runs SET supervisor_pid = ?1, supervisor_start = ?2"
                                      " WHERE id = ?3",
                                      bind_supervisor, &a, "update run", &changed, NULL);
    if (st == TD_OK && !changed) st = td_error(TD_ERR_NOTFOUND, "no run with id '%s'", id);
    return st;
}

td_status td_run_set_restarts(td_rundb *store, const char *id, int restarts) {
    return td__run_set_int_column(store, "UPDATE runs SET restarts = ? WHERE id = ?", id,
                                  restarts, 0);
}

td_status td_run_request_stop(td_rundb *store, const char *id, int requested) {
    /* The reserve too: `tandem stop` on a full disk must still tell stopped from preempted. */
    return td__run_set_int_column(store, "UPDATE runs SET stop_requested = ? WHERE id = ?", id,
                                  requested, 1);
}

enum { SUPERVISOR_ALIVE, SUPERVISOR_GONE, SUPERVISOR_PID_REUSED };

/* Whether the run's supervisor still lives. A pid is reused once its process is gone: with the
 * start time recorded beside it, the pid counts only while the process holding it started then
 * (a run's supervisor that died, its pid handed to the supervisor of a later run, must not be
 * signalled as the first run's: `tandem stop a-1` stopped a-2). A run recorded without one (by
 * an older tandem) falls back to: alive, and its command line names tandem. */
static int supervisor_state(int64_t pid, int64_t start) {
    if (pid <= 0) return SUPERVISOR_GONE;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return SUPERVISOR_GONE;
    if (start > 0) {
        int64_t now = proc_start_ticks(pid);
        if (now < 0) return SUPERVISOR_GONE;
        if (now > 0) return now == start ? SUPERVISOR_ALIVE : SUPERVISOR_PID_REUSED;
        /* Unknown now (no /proc): the check below is all there is. */
    }
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%lld/cmdline", (long long)pid);
    FILE *f = fopen(path, "rb");
    if (!f) return SUPERVISOR_ALIVE; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    return strstr(buf, "tandem") ? SUPERVISOR_ALIVE : SUPERVISOR_PID_REUSED;
}

int td_run_signal_supervisor(const td_run *run, int sig) {
    int64_t pid = run->supervisor_pid;
    if (pid <= 0) {
        errno = ESRCH;
        return -1;
    }
    /* A pidfd names one process for good: once it is open and the process it names is found to
     * be the supervisor, a signal through it can only reach that process (ESRCH once it is
     * gone, whoever holds the pid by then). Without pidfds (a kernel before 5.3), the check and
     * kill(2) leave the narrow gap a pid is reused in between. */
    int fd = -1;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0 && errno == ESRCH) return -1;
#endif
    if (supervisor_state(pid, run->supervisor_start) != SUPERVISOR_ALIVE) {
        if (fd >= 0) close(fd);
        errno = ESRCH;
        return -1;
    }
    int rc;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    if (fd >= 0) {
        rc = (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
        int err = errno;
        close(fd);
        errno = err;
        return rc;
    }
#endif
    rc = kill((pid_t)pid, sig);
    return rc;
}

struct adopt_args {
    const td_run *disk;
    const char *id;
    const char *expect; /* the status the index still shows */
};

static void bind_adopt(sqlite3_stmt *q, const void *p) {
    const struct adopt_args *a = p;
    sqlite3_bind_text(q, 1, td_run_status_str(a->disk->status), -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, a->disk->exit_code);
    sqlite3_bind_double(q, 3, a->disk->started_s);
    sqlite3_bind_double(q, 4, a->disk->ended_s);
    if (a->disk->note)
        sqlite3_bind_text(q, 5, a->disk->note, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 5);
    sqlite3_bind_int(q, 6, a->disk->restarts);
    sqlite3_bind_text(q, 7, a->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 8, a->expect, -1, SQLITE_STATIC);
}

td_status td__run_adopt(td_rundb *store, td_run *run, const td_run *disk, int *changed) {
    struct adopt_args a = {disk, run->id, td_run_status_str(run->status)};
    td_run row;
    memset(&row, 0, sizeof row);
    TD_CHECK(td__run_update_row(
        store, run->id,
        "UPDATE runs SET status = ?1, exit_code = ?2,"
        " started = CASE WHEN ?3 > 0 THEN ?3 ELSE started END, ended = ?4,"
        " note = ?5, restarts = MAX(restarts, ?6) WHERE id = ?7 AND status = ?8",
        bind_adopt, &a, "take a run's end from its run.json", changed, &row));
    if (*changed) {
        td_run_clear(run);
        *run = row;
    }
    return TD_OK;
}

struct reap_args {
    const char *id;
    const char *note;
    const char *expect;
    int64_t pid, start;
    double now;
};

static void bind_reap(sqlite3_stmt *q, const void *p) {
    const struct reap_args *a = p;
    sqlite3_bind_double(q, 1, a->now);
    sqlite3_bind_text(q, 2, a->note, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, a->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 4, a->expect, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 5, a->pid);
    sqlite3_bind_int64(q, 6, a->start);
}

td_status td_run_reap_stale(td_rundb *store, td_run *run) {
    if (td_run_status_is_final(run->status)) return TD_OK;
    /* Its supervisor lives on another machine (its controller): no process here to look at. */
    if (td_run_is_remote(run)) return TD_OK;
    /* A pending run without a supervisor may be being set up right now; give it a minute. */
    if (run->supervisor_pid == 0 && td_wall_s() - run->created_s < 60) return TD_OK;
    int state = supervisor_state(run->supervisor_pid, run->supervisor_start);
    if (state == SUPERVISOR_ALIVE) return TD_OK;
    /* The supervisor may have recorded the end in run.json and not in this index: the index was
     * deleted and rebuilt while it ran, or the disk was full. run.json is then the record. */
    td_run disk;
    int found = 0;
    memset(&disk, 0, sizeof disk);
    if (run->run_dir && td__run_json_read(run->run_dir, &disk, &found) == TD_OK && found &&
        disk.id && !strcmp(disk.id, run->id) && td_run_status_is_final(disk.status)) {
        int changed = 0;
        td_status st = td__run_adopt(store, run, &disk, &changed);
        td_run_clear(&disk);
        if (st == TD_OK && changed) st = td__run_sync_files(store, run, 1, NULL, NULL, NULL);
        return st;
    }
    td_run_clear(&disk);
    td_error_clear();
    char *note = td_xasprintf("its supervisor (pid %lld) is gone; it died or was killed%s",
                              (long long)run->supervisor_pid,
                              state == SUPERVISOR_PID_REUSED
                                  ? " (its pid now belongs to another process, left alone)"
                                  : "");
    if (td__run_disk_is_full(store)) {
        char *noted = td__run_note_disk_full(note, store);
        free(note);
        note = noted;
    }
    struct reap_args a = {run->id,
                          note,
                          td_run_status_str(run->status),
                          run->supervisor_pid,
                          run->supervisor_start,
                          td_wall_s()};
    int changed = 0;
    td_run row;
    memset(&row, 0, sizeof row);
    td_status st = td__run_write_with_reserve(
        store, run->id,
        "UPDATE runs SET status = 'failed', ended = ?, note = ?"
        " WHERE id = ? AND status = ? AND supervisor_pid = ? AND supervisor_start = ?",
        bind_reap, &a, &a.note, "mark a stale run failed", &changed, &row);
    if (st == TD_OK && changed) {
        td_run_clear(run);
        *run = row;
    } else {
        td_run_clear(&row);
    }
    free(note);
    return st;
}

/* ---- the user's labels, archive and delete (issue 19) ---- */

int td_run_is_live(const td_run *run) {
    if (!td_run_status_is_final(run->status) &&
        supervisor_state(run->supervisor_pid, run->supervisor_start) == SUPERVISOR_ALIVE)
        return 1;
    /* RUN/lock is held (flock) by the supervisor and inherited by its launcher and workers:
     * while any of them lives, something may still write into the directory. */
    if (!run->run_dir) return 0;
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_LOCK);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    free(path);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}
