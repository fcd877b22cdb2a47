/* Processes, files and sockets: see include/tandem/os.h for why they live in one place. */
#include "tandem/os.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---------------- processes ---------------- */

void td_spawn_opts_init(td_spawn_opts *o) {
    memset(o, 0, sizeof *o);
    o->in_fd = TD_SPAWN_DEVNULL; /* a background group that read the terminal would stop */
    o->out_fd = o->err_fd = TD_SPAWN_INHERIT;
    o->new_group = true;
}

/* The child between fork and exec: async-signal-safe calls only. Reports errno on the pipe. */
static void __attribute__((noreturn))
spawn_child(const td_spawn_opts *o, pid_t parent, int err_w, int devnull) {
    int err = 0;
    if (o->new_group) setpgid(0, 0);
    if (o->death_signal) {
        prctl(PR_SET_PDEATHSIG, o->death_signal);
        /* the parent may have died before prctl: then nobody would ever send it */
        if (getppid() != parent) _exit(128 + o->death_signal);
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    const int want[3] = {o->in_fd, o->out_fd, o->err_fd};
    for (int i = 0; i < 3; i++) {
        int fd = want[i] == TD_SPAWN_DEVNULL ? devnull : want[i];
        if (fd >= 0 && fd != i && dup2(fd, i) < 0) goto fail;
        if (fd == i) fcntl(i, F_SETFD, 0); /* an inherited 0..2 must survive exec */
    }
    /* mark rather than close: the error pipe must stay open until exec succeeds */
    if (o->close_fds) close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
    for (int i = 0; i < o->nkeep; i++)
        if (o->keep_fds[i] != err_w) fcntl(o->keep_fds[i], F_SETFD, 0);
    if (o->cwd && chdir(o->cwd) != 0) goto fail;
    execve(o->path ? o->path : o->argv[0], o->argv, o->envp ? o->envp : environ);
fail:
    err = errno;
    ssize_t w = write(err_w, &err, sizeof err);
    (void)w;
    _exit(127);
}

td_status td_spawn(const td_spawn_opts *o, pid_t *pid_out) {
    const char *prog = o->path ? o->path : o->argv[0];
    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC) != 0) return td_error_errno(TD_ERR_SYS, "pipe to start %s", prog);
    /* opened here: open() between fork and exec is safe, but failing there would be silent */
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) spawn_child(o, parent, errpipe[1], devnull);
    close(errpipe[1]);
    if (devnull >= 0) close(devnull);
    if (pid < 0) {
        close(errpipe[0]);
        return td_error_errno(TD_ERR_SYS, "cannot fork to start %s", prog);
    }
    /* also here: a signal sent to the group right after we return must reach it */
    if (o->new_group) setpgid(pid, pid);
    int err = 0;
    ssize_t n;
    while ((n = read(errpipe[0], &err, sizeof err)) < 0 && errno == EINTR) {
    }
    close(errpipe[0]);
    if (n == (ssize_t)sizeof err) {
        td_waitpid(pid, NULL, 0);
        errno = err;
        return td_error_errno(TD_ERR_SYS, "cannot start %s%s%s", prog, o->cwd ? " in " : "",
                              o->cwd ? o->cwd : "");
    }
    *pid_out = pid;
    return TD_OK;
}

pid_t td_waitpid(pid_t pid, int *status, int options) {
    pid_t r;
    while ((r = waitpid(pid, status, options)) < 0 && errno == EINTR) {
    }
    return r;
}

/* root and its descendants, breadth first, through /proc/<pid>/task/<pid>/children. */
static size_t descendants(pid_t root, pid_t *out, size_t cap) {
    size_t n = 0;
    out[n++] = root;
    for (size_t scanned = 0; scanned < n && n < cap; scanned++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)out[scanned],
                 (int)out[scanned]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int c;
        while (n < cap && fscanf(f, "%d", &c) == 1) out[n++] = (pid_t)c;
        fclose(f);
    }
    return n;
}

void td_kill_tree(pid_t root, int sig) {
    if (root <= 0) return;
    pid_t *pids = td_xmalloc(4096 * sizeof *pids);
    size_t n = descendants(root, pids, 4096);
    /* stop first, so nobody forks a new child between the scan and the kill */
    if (sig == SIGKILL)
        for (size_t i = 0; i < n; i++) kill(pids[i], SIGSTOP);
    for (size_t i = 0; i < n; i++) {
        kill(-pids[i], sig); /* its group, when it leads one */
        kill(pids[i], sig);
    }
    free(pids);
}

int td_wait_exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

void td_wait_describe(int status, char *buf, size_t nbytes) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, nbytes, "was killed by signal %d (SIG%s)", sig, abbrev ? abbrev : "?");
    } else if (WIFEXITED(status)) {
        snprintf(buf, nbytes, "exited with code %d", WEXITSTATUS(status));
    } else {
        snprintf(buf, nbytes, "ended with wait status 0x%x", status);
    }
}

/* The number of threads of process pid (/proc/PID/status), 0 when it cannot be read. */
static int proc_threads(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    fclose(f);
    return n;
}

/* Whether we were orphaned: our parent is not in our process group (a wrapper shell the launcher
 * started is: it leads the group the launcher made for the worker) and is init, or the group's
 * leader is gone (then a subreaper adopted us). */
static bool orphaned(pid_t parent) {
    pid_t group = getpgrp();
    if (getpgid(parent) == group) return false;
    if (parent == 1) return true;
    return group != getpid() && kill(group, 0) != 0 && errno == ESRCH;
}

static td_status orphan_error(pid_t parent) {
    return td_error(TD_ERR_PEER,
                    "the process that started this one is already gone (pid %d adopted it): "
                    "its launcher died while it was starting, and nothing would stop it later; "
                    "not running on as an orphan. Start the job again (tandem run --resume RUN "
                    "for a tracked run)",
                    (int)parent);
}

td_status td_die_with_parent(int sig) {
    int cur = 0;
    if (prctl(PR_GET_PDEATHSIG, &cur) == 0 && cur != 0) return TD_OK; /* the launcher's own */
    pid_t parent = getppid();
    if (orphaned(parent)) return orphan_error(parent);
    if (proc_threads(parent) > 1) {
        TD_LOG_DEBUG("parent pid %d has several threads: no death signal asked for", (int)parent);
        return TD_OK;
    }
    if (prctl(PR_SET_PDEATHSIG, sig) != 0)
        return td_error_errno(TD_ERR_SYS, "prctl(PR_SET_PDEATHSIG, %d)", sig);
    /* the parent may have died before prctl: then the signal will never come */
    if (getppid() != parent) return orphan_error(getppid());
    /* The launcher's death also breaks the pipes our output goes through: a write there must
     * fail (EPIPE), not kill us before the stop that `sig` asks for is done (a checkpoint). */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, NULL);
    return TD_OK;
}

void td_stop_signals_begin(td_stop_signals *s, double now_s) {
    if (s->begun) return;
    s->begun = true;
    s->began_s = now_s;
}

td_stop_action td_stop_signals_take(td_stop_signals *s, int sig, double now_s) {
    if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) return TD_STOP_IGNORE;
    int earlier_sigints = s->nsigint;
    if (sig == SIGINT) s->nsigint++;
    if (!s->begun) {
        td_stop_signals_begin(s, now_s);
        return TD_STOP_GRACEFUL;
    }
    if ((sig == SIGINT && earlier_sigints > 0) || now_s - s->began_s >= TD_STOP_REPEAT_GRACE_S)
        return TD_STOP_ESCALATE;
    return TD_STOP_REPEAT;
}

/* The thread that reads the open sigwatch; the handler below passes stray signals to it. */
static volatile pid_t sigwatch_tid;

static void sigwatch_pass_on(int sig) {
    int saved = errno;
    syscall(SYS_tgkill, getpid(), sigwatch_tid, sig);
    errno = saved;
}

td_status td_sigwatch_open(td_sigwatch *w, const int *signals, int count) {
    if (count > TD_SIGWATCH_MAX)
        return td_error(TD_ERR_INVALID, "td_sigwatch_open: %d signals, at most %d", count,
                        TD_SIGWATCH_MAX);
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < count; i++) sigaddset(&set, signals[i]);
    pthread_sigmask(SIG_BLOCK, &set, &w->old_mask);
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &w->old_pipe);
    w->fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (w->fd < 0) {
        td_status st = td_error_errno(TD_ERR_SYS, "signalfd");
        sigaction(SIGPIPE, &w->old_pipe, NULL);
        pthread_sigmask(SIG_SETMASK, &w->old_mask, NULL);
        return st;
    }
    sigwatch_tid = (pid_t)syscall(SYS_gettid);
    struct sigaction pass;
    memset(&pass, 0, sizeof pass);
    pass.sa_handler = sigwatch_pass_on;
    sigfillset(&pass.sa_mask);
    pass.sa_flags = SA_RESTART;
    w->count = count;
    for (int i = 0; i < count; i++) {
        w->signals[i] = signals[i];
        sigaction(signals[i], &pass, &w->old_actions[i]);
    }
    return TD_OK;
}

int td_sigwatch_next(td_sigwatch *w) {
    struct signalfd_siginfo si;
    ssize_t n;
    while ((n = read(w->fd, &si, sizeof si)) < 0 && errno == EINTR) {
    }
    return n == (ssize_t)sizeof si ? (int)si.ssi_signo : 0;
}

void td_sigwatch_close(td_sigwatch *w) {
    if (w->fd < 0) return;
    close(w->fd);
    w->fd = -1;
    for (int i = 0; i < w->count; i++) sigaction(w->signals[i], &w->old_actions[i], NULL);
    w->count = 0;
    sigaction(SIGPIPE, &w->old_pipe, NULL);
    pthread_sigmask(SIG_SETMASK, &w->old_mask, NULL);
}

/* ---------------- files ---------------- */

char *td_install_binary(const char *exe) {
    const char *slash = strrchr(exe, '/');
    if (slash && !strncmp(slash + 1, "tandem-x86-64", 13)) {
        char *main_exe = td_xasprintf("%.*s/tandem", (int)(slash - exe), exe);
        if (access(main_exe, X_OK) == 0) return main_exe;
        free(main_exe);
    }
    return td_xstrdup(exe);
}

char *td_self_exe(void) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return td_xstrdup("tandem");
    buf[n] = '\0';
    return td_install_binary(buf);
}

td_status td_mkdirs(const char *path) {
    char *p = td_xstrdup(path);
    td_status rc = TD_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        struct stat st;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = td_error_errno(TD_ERR_IO, "cannot create directory %s", p);
            break;
        }
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = td_error(TD_ERR_INVALID, "%s is in the way and is not a directory", p);
            break;
        }
        *s = c;
        if (c == '\0') break;
    }
    free(p);
    return rc;
}

const char *td_mode_kind(mode_t mode) {
    if (S_ISREG(mode)) return NULL;
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

const char *td_file_kind(const char *path) {
    struct stat st;
    return lstat(path, &st) != 0 ? NULL : td_mode_kind(st.st_mode);
}

static td_status refuse(const char *path, const char *what, const char *kind) {
    if (!strcmp(kind, "a symbolic link")) {
        char target[4096];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        return td_error(TD_ERR_INVALID,
                        "%s %s is a symbolic link (to %s): tandem replaces its output files "
                        "atomically, which would replace the link, not write through it; pass the "
                        "link's target instead",
                        what, path, target);
    }
    if (!strcmp(kind, "a directory"))
        return td_error(TD_ERR_INVALID, "%s %s is a directory; pass a file path in it, e.g. %s/%s",
                        what, path, path, !strcmp(what, "--save") ? "weights.safetensors" : "out");
    return td_error(TD_ERR_INVALID,
                    "%s %s is %s, not a regular file: tandem writes a new file and renames it "
                    "over the target, which would replace %s; pass a regular file path",
                    what, path, kind, kind);
}

/* A probe file created and removed in dir: the directory takes new files right now. */
static td_status probe_dir(const char *dir, const char *what, const char *for_path) {
    char *probe = td_xasprintf("%s/.tandem-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    td_status rc = TD_OK;
    if (fd < 0)
        rc = td_error_errno(TD_ERR_IO, "%s %s: cannot create a file in %s", what, for_path, dir);
    else {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return rc;
}

td_status td_check_output_file(const char *path, const char *what) {
    const char *kind = td_file_kind(path);
    if (kind) return refuse(path, what, kind);
    char *dircopy = td_xstrdup(path);
    const char *dir = dirname(dircopy);
    struct stat st;
    td_status rc;
    if (stat(dir, &st) != 0)
        rc = td_error_errno(TD_ERR_NOTFOUND,
                            "%s %s: the directory %s does not exist; create it first", what, path,
                            dir);
    else if (!S_ISDIR(st.st_mode))
        rc = td_error(TD_ERR_INVALID, "%s %s: %s is not a directory", what, path, dir);
    else
        rc = probe_dir(dir, what, path);
    free(dircopy);
    return rc;
}

td_status td_check_output_dir(const char *dir, const char *what) {
    td_status st = td_mkdirs(dir);
    if (st != TD_OK)
        return td_error(st, "%s %s: %s; choose another directory", what, dir, td_error_msg());
    return probe_dir(dir, what, dir);
}

static td_status write_all(int fd, const void *buf, size_t nbytes, const char *tmp,
                           const char *what) {
    const char *p = buf;
    while (nbytes > 0) {
        ssize_t n = write(fd, p, nbytes > (1u << 30) ? (1u << 30) : nbytes);
        if (n < 0) {
            if (errno == EINTR) continue;
            return td_error_errno(TD_ERR_IO, "cannot write %s %s", what, tmp);
        }
        p += n;
        nbytes -= (size_t)n;
    }
    return TD_OK;
}

typedef struct {
    char *dircopy, *basecopy, *tmp;
    const char *dir;
    int lock_fd; /* holds the writer's flock on tmp until it is renamed or removed; -1: none */
    int unnamed; /* the bytes go to an O_TMPFILE file, named tmp only once complete */
} tmp_name;

/* The common tail of td_write_atomic and td_copy_file: fd holds the bytes; make them path. An
 * unnamed file gets tmp's name first (rename(2) takes names, and linkat cannot replace one). */
static td_status commit_tmp(int fd, tmp_name *t, const char *path, const char *what) {
    const char *tmp = t->tmp;
    if (fsync(fd) != 0) {
        td_status st = td_error_errno(TD_ERR_IO, "cannot fsync %s %s", what, tmp);
        close(fd);
        return st;
    }
    if (t->unnamed) {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        (void)unlink(tmp); /* our pid's name: a leftover of a killed process that had it before */
        if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) != 0) {
            td_status st = td_error_errno(TD_ERR_IO, "cannot link %s %s", what, tmp);
            close(fd);
            return st;
        }
    }
    if (close(fd) != 0) return td_error_errno(TD_ERR_IO, "cannot close %s %s", what, tmp);
    const char *kind = td_file_kind(path); /* it may have appeared since the caller checked */
    if (kind) return refuse(path, what, kind);
    if (rename(tmp, path) != 0)
        return td_error_errno(TD_ERR_IO, "cannot rename %s to %s", tmp, path);
    /* the rename is durable only once the directory entry is */
    int dfd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return TD_OK;
}

static void tmp_name_init(tmp_name *t, const char *path) {
    t->dircopy = td_xstrdup(path);
    t->basecopy = td_xstrdup(path);
    t->dir = dirname(t->dircopy);
    t->tmp = td_xasprintf("%s/.%s.tmp.%ld", t->dir, basename(t->basecopy), (long)getpid());
    t->lock_fd = -1;
    t->unnamed = 0;
}

/* Creates t->tmp for writing and takes its writer's flock, kept on a second descriptor (the
 * caller closes the first before the rename, to see close errors) until tmp_name_finish: so
 * td_remove_stale_tmp never removes a file that is still being written, whatever host or pid
 * namespace writes it. The lock is best effort: a filesystem without locks still gets its file. */
static int open_tmp(tmp_name *t) {
    /* First choice: an unnamed file (O_TMPFILE), given a name only once every byte is written
     * and synced, so a writer killed mid-write (SIGKILL, the OOM killer, a lost node) leaves
     * nothing; the named temporary below waits for td_remove_stale_tmp, which keeps it while its
     * pid lives, and in a container the next run's writer often has the dead one's pid. Its
     * flock, taken now, covers the short time it has tmp's name before the rename. Where the
     * file system has no O_TMPFILE, or /proc cannot name it, the named temporary it is. */
    if (access("/proc/self/fd", X_OK) == 0) {
        int fd = open(t->dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
        if (fd >= 0) {
            t->unnamed = 1;
            if (flock(fd, LOCK_EX | LOCK_NB) == 0) t->lock_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
            return fd;
        }
    }
    for (int attempt = 0;; attempt++) {
        int fd = open(t->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) return -1;
        int locked = 0;
        for (int i = 0; i < 200 && !(locked = flock(fd, LOCK_EX | LOCK_NB) == 0); i++) {
            if (errno != EWOULDBLOCK && errno != EINTR) break; /* no locks here (ENOLCK) */
            struct timespec ms = {0, 5000000};
            nanosleep(&ms, NULL); /* a sweeper holds it for an instant */
        }
        struct stat st;
        /* a sweeper may have removed it between our open and our lock: create it again */
        if (locked && attempt < 3 && fstat(fd, &st) == 0 && st.st_nlink == 0) {
            close(fd);
            continue;
        }
        if (locked) t->lock_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        return fd;
    }
}

static td_status tmp_name_finish(tmp_name *t, td_status rc, const char *what, const char *path) {
    if (rc != TD_OK) unlink(t->tmp);
    if (t->lock_fd >= 0) close(t->lock_fd); /* after the rename or the unlink, not before */
    if (rc != TD_OK) {
        if (rc == TD_ERR_NOSPACE) {
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", td_error_msg());
            td_error(TD_ERR_NOSPACE,
                     "%s; the %s %s was not written (existing files are untouched): free space "
                     "on that filesystem or choose another directory",
                     detail, what, path);
        }
    }
    free(t->tmp);
    free(t->dircopy);
    free(t->basecopy);
    return rc;
}

td_status td_write_atomic(const char *path, const char *what, const td_chunk *chunks, int nchunks) {
    const char *kind = td_file_kind(path);
    if (kind) return refuse(path, what, kind);
    tmp_name t;
    tmp_name_init(&t, path);
    td_status rc = TD_OK;
    int fd = open_tmp(&t);
    if (fd < 0) {
        rc = td_error_errno(TD_ERR_IO,
                            "cannot create %s %s (for %s); check that the directory exists and "
                            "is writable",
                            what, t.tmp, path);
        return tmp_name_finish(&t, rc, what, path);
    }
    for (int i = 0; i < nchunks && rc == TD_OK; i++)
        rc = write_all(fd, chunks[i].data, chunks[i].nbytes, t.tmp, what);
    if (rc == TD_OK)
        rc = commit_tmp(fd, &t, path, what);
    else
        close(fd);
    return tmp_name_finish(&t, rc, what, path);
}

td_status td_copy_file(const char *src, const char *dst, const char *what) {
    const char *kind = td_file_kind(dst);
    if (kind) return refuse(dst, what, kind);
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return td_error_errno(TD_ERR_IO, "cannot open %s %s", what, src);
    tmp_name t;
    tmp_name_init(&t, dst);
    td_status rc = TD_OK;
    int out = open_tmp(&t);
    if (out < 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot create %s (for %s %s)", t.tmp, what, dst);
        close(in);
        return tmp_name_finish(&t, rc, what, dst);
    }
    char *buf = td_xmalloc(1 << 16);
    for (;;) {
        ssize_t n = read(in, buf, 1 << 16);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = td_error_errno(TD_ERR_IO, "cannot read %s %s", what, src);
            break;
        }
        if (n == 0) break;
        if ((rc = write_all(out, buf, (size_t)n, t.tmp, what)) != TD_OK) break;
    }
    free(buf);
    close(in);
    if (rc == TD_OK)
        rc = commit_tmp(out, &t, dst, what);
    else
        close(out);
    return tmp_name_finish(&t, rc, what, dst);
}

/* The pid in a temporary file's name `.<target>.tmp.<pid>` when target is prefix...suffix;
 * 0 when the name is not one. */
static long stale_tmp_pid(const char *name, const char *prefix, const char *suffix) {
    if (name[0] != '.') return 0;
    const char *tag = NULL;
    for (const char *p = name; (p = strstr(p, ".tmp.")); p++) tag = p; /* the last one */
    if (!tag) return 0;
    const char *target = name + 1;
    size_t len = (size_t)(tag - target), plen = strlen(prefix), slen = strlen(suffix);
    if (len < plen + slen || memcmp(target, prefix, plen) ||
        memcmp(target + len - slen, suffix, slen))
        return 0;
    const char *digits = tag + 5;
    size_t ndigits = strspn(digits, "0123456789");
    if (ndigits == 0 || ndigits > 9 || digits[ndigits] != '\0') return 0;
    return strtol(digits, NULL, 10);
}

td_status td_remove_stale_tmp(const char *dir, const char *prefix, const char *suffix,
                              size_t *removed_out) {
    size_t removed = 0;
    if (removed_out) *removed_out = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return TD_OK;
        return td_error_errno(TD_ERR_IO, "cannot list %s to remove stale temporary files", dir);
    }
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        long pid = stale_tmp_pid(name, prefix, suffix);
        if (pid <= 0) continue;
        /* its writer may live: a live pid, or one we may not signal (EPERM), keeps the file */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        int fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st, now;
        /* a writer elsewhere (another host, another pid namespace) holds the lock */
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == st.st_ino &&
            now.st_dev == st.st_dev) {
            if (unlinkat(dfd, name, 0) == 0) {
                removed++;
                TD_LOG_INFO("removed %s/%s (%lld bytes): the temporary file of a write that "
                            "never finished (its writer, pid %ld, is gone)",
                            dir, name, (long long)st.st_size, pid);
            } else if (errno != ENOENT) {
                TD_LOG_WARN("cannot remove %s/%s, the temporary file of an unfinished write: %s; "
                            "delete it by hand",
                            dir, name, strerror(errno));
            }
        }
        close(fd);
    }
    closedir(d);
    if (removed_out) *removed_out = removed;
    return TD_OK;
}

td_status td_random_hex(char *out, size_t nbytes_random) {
    unsigned char r[64];
    if (nbytes_random > sizeof r)
        return td_error(TD_ERR_INVALID, "td_random_hex: %zu bytes asked, at most %zu",
                        nbytes_random, sizeof r);
    size_t got = 0;
    while (got < nbytes_random) {
        ssize_t k = getrandom(r + got, nbytes_random - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return td_error_errno(TD_ERR_SYS, "getrandom (for a token or id)");
        got += (size_t)k;
    }
    for (size_t i = 0; i < nbytes_random; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
    out[2 * nbytes_random] = '\0';
    return TD_OK;
}

/* ---------------- sockets ---------------- */

td_status td_listen_tcp(const char *host, int port, int backlog, int *fd_out, int *port_out) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(host && *host ? host : NULL, service, &hints, &res);
    if (gai != 0)
        return td_error(TD_ERR_INVALID, "cannot listen on %s:%d: %s", host && *host ? host : "*",
                        port, gai_strerror(gai));
    int fd = -1, err = 0;
    for (struct addrinfo *p = res; p; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, p->ai_addr, p->ai_addrlen) == 0 && listen(fd, backlog) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        errno = err;
        return td_error_errno(TD_ERR_SYS, "cannot listen on %s:%d", host && *host ? host : "*",
                              port);
    }
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        td_status st = td_error_errno(TD_ERR_SYS, "getsockname");
        close(fd);
        return st;
    }
    *port_out = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                              : ((struct sockaddr_in *)&a)->sin_port);
    *fd_out = fd;
    return TD_OK;
}

td_status td_pick_free_port(int *port_out) {
    int fd, port;
    TD_CHECK(td_listen_tcp(NULL, 0, 1, &fd, &port));
    close(fd);
    *port_out = port;
    return TD_OK;
}

/* One address: a non-blocking connect and a wait for its end (connected, refused, the kernel's
 * timeout) or for the deadline (0: none). 0, or -1 with errno; *late: the deadline ended it. */
static int connect_one(int fd, const struct sockaddr *addr, socklen_t len, double deadline_s,
                       bool *late) {
    *late = false;
    if (connect(fd, addr, len) == 0) return 0;
    if (errno != EINPROGRESS && errno != EINTR) return -1; /* EINTR: it goes on in the kernel */
    for (;;) {
        int ms = -1;
        if (deadline_s > 0) {
            double left = deadline_s - td_now_s();
            ms = left <= 0 ? 0 : (int)TD_MIN(left * 1000.0 + 1.0, 3600e3);
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n = poll(&p, 1, ms);
        if (n < 0 && errno != EINTR) return -1;
        if (n > 0) break;
        if (n == 0 && ms == 0) {
            *late = true;
            errno = ETIMEDOUT;
            return -1;
        }
    }
    int err = 0;
    socklen_t elen = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) return -1;
    if (err == 0) return 0;
    errno = err;
    return -1;
}

/* Failures that another dial may not meet: the peer not listening yet, a route not up yet. */
static bool connect_retryable(int err) {
    return err == ECONNREFUSED || err == ENETUNREACH || err == EHOSTUNREACH || err == ETIMEDOUT ||
           err == EAGAIN;
}

td_status td_connect_tcp(const char *host, int port, const td_connect_opts *o, int *fd_out,
                         td_connect_result *how) {
    static const td_connect_opts defaults;
    td_connect_result ignored;
    if (!o) o = &defaults;
    if (!how) how = &ignored;
    *fd_out = -1;
    if (!host || !*host) {
        *how = TD_CONNECT_UNRESOLVED;
        return td_error(TD_ERR_INVALID, "cannot connect to %s%sport %d: no host given",
                        o->peer ? o->peer : "", o->peer ? " at " : "", port);
    }
    const char *peer = o->peer ? o->peer : "", *at = o->peer ? " at " : "";
    /* an IPv6 literal in brackets, so the port stays readable */
    const char *lb = strchr(host, ':') ? "[" : "", *rb = *lb ? "]" : "";
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (o->numeric_host ? AI_NUMERICHOST : 0)};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        *how = gai == EAI_AGAIN ? TD_CONNECT_RESOLVE_AGAIN : TD_CONNECT_UNRESOLVED;
        return td_error(gai == EAI_AGAIN ? TD_ERR_IO : TD_ERR_INVALID,
                        "cannot resolve %s%shost '%s' (for port %d): %s%s", peer,
                        o->peer ? "'s " : "", host, port,
                        gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai),
                        o->numeric_host ? " (a numeric address is expected)" : "");
    }
    double t0 = td_now_s();
    int err = 0;
    bool late = false, no_socket = false;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd =
            socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            no_socket = true;
            continue;
        }
        no_socket = false;
        if (o->before) o->before(fd, a->ai_addr, a->ai_addrlen, o->user);
        if (connect_one(fd, a->ai_addr, a->ai_addrlen, o->deadline_s, &late) == 0) {
            int fl = fcntl(fd, F_GETFL);
            if (fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0) {
                freeaddrinfo(res);
                *fd_out = fd;
                *how = TD_CONNECT_OK;
                return TD_OK;
            }
        }
        err = errno;
        close(fd);
        if (late) break; /* the deadline is the same for the next address */
    }
    freeaddrinfo(res);
    errno = err;
    if (late) {
        *how = TD_CONNECT_REFUSED;
        td_status st =
            td_error(TD_ERR_TIMEOUT, "cannot connect to %s%s%s%s%s:%d: no answer within %.1f s",
                     peer, at, lb, host, rb, port, td_now_s() - t0);
        errno = err;
        return st;
    }
    *how = !no_socket && connect_retryable(err) ? TD_CONNECT_REFUSED : TD_CONNECT_FAILED;
    td_status st = td_error_errno(*how == TD_CONNECT_REFUSED ? TD_ERR_PEER : TD_ERR_SYS,
                                  "cannot connect to %s%s%s%s%s:%d", peer, at, lb, host, rb, port);
    errno = err;
    return st;
}
