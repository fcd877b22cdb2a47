/* tandem core, the operating-system part: the one home for processes, files and sockets.
 *
 * The supervisor (workflow), the node agent (launch), the trainer and the run store all start
 * processes, watch signals, replace files and open ports. Each did it its own way before; the
 * ways differed exactly where bugs hide (a pipe without CLOEXEC, an exec failure reported as
 * exit 127, a port picked by bind-close-and-hope, a rename over a device). Here each is done
 * once, carefully, and the layers above call it. */
#ifndef TANDEM_OS_H
#define TANDEM_OS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- processes ---- */

/* How td_spawn starts a child. td_spawn_opts_init fills the defaults; then set what differs. */
typedef struct td_spawn_opts {
    const char *path;    /* the executable; NULL: argv[0] (no PATH search either way) */
    char *const *argv;   /* NULL-terminated */
    char *const *envp;   /* NULL: our environment */
    const char *cwd;     /* NULL: ours */
    int in_fd;           /* TD_SPAWN_DEVNULL (default), TD_SPAWN_INHERIT or a descriptor */
    int out_fd, err_fd;  /* TD_SPAWN_INHERIT (default), TD_SPAWN_DEVNULL or a descriptor */
    bool new_group;      /* leads a process group of its own (default true): signals reach the
                          * child and everything it starts, and not us */
    int death_signal;    /* sent to the child when we die, even by SIGKILL (0: none) */
    bool close_fds;      /* close every descriptor >= 3 except keep_fds (default false: only
                          * CLOEXEC ones close) */
    const int *keep_fds; /* inherited by the child even when CLOEXEC (our copies stay CLOEXEC,
                          * so other children do not get them) */
    int nkeep;
} td_spawn_opts;

#define TD_SPAWN_INHERIT (-1)
#define TD_SPAWN_DEVNULL (-2)

void td_spawn_opts_init(td_spawn_opts *o);
/* fork + exec. The child resets every signal to its default and unblocks them all, so it never
 * inherits a supervisor's blocked set. Returns only once the child has exec'd or failed: a
 * failure to chdir or exec comes back through a close-on-exec pipe as an error naming the
 * program and errno (not as a mysterious exit 127), and the child is reaped. Between fork and
 * exec the child makes async-signal-safe calls only, so the caller may have threads. */
td_status td_spawn(const td_spawn_opts *o, pid_t *pid_out);

/* Signals root, every descendant (found through /proc) and the process group each one leads:
 * the workers of a launcher sit in groups of their own, and a SIGKILL must leave none behind. */
void td_kill_tree(pid_t root, int sig);

/* A wait status as a shell reports it: the exit code, or 128 + the signal. */
int td_wait_exit_code(int wait_status);
/* "exited with code 3" / "was killed by signal 9 (SIGKILL)". */
void td_wait_describe(int wait_status, char *buf, size_t nbytes);
/* waitpid that retries on EINTR; returns its result. */
pid_t td_waitpid(pid_t pid, int *status, int options);

/* Ties this process to its parent's life: `sig` when the parent dies (PR_SET_PDEATHSIG), for a
 * worker that a wrapper started. The launcher's death signal reaches only its direct child (the
 * kernel neither inherits it through fork nor sends it to a process group), so under
 * `tandem launch -- /bin/sh -c '... tandem train ...'` a SIGKILLed launcher takes the shell and
 * leaves the trainer it forked training as an orphan. With this in the trainer the death travels
 * down the chain: launcher dies, the shell gets the launcher's SIGKILL, the trainer gets `sig`.
 * Nothing changes when a death signal is already set (the launcher's direct child, or a program
 * it exec'd: execve keeps it) or when the parent has several threads (a program, not a shell:
 * the kernel sends the signal when the thread that forked us ends, which need not be the
 * process). Once armed, SIGPIPE is ignored: the launcher's death breaks the pipes our output goes
 * to, and a write there must fail, not kill us before the stop `sig` asks for (a checkpoint) is
 * done. TD_ERR_PEER when the parent is already gone: orphaned before we could ask (reparented to
 * init, or the process group the launcher made for the worker has lost its leader). */
td_status td_die_with_parent(int sig);

/* How a supervisor takes stop signals (SIGINT, SIGTERM, SIGHUP). The first starts a graceful
 * stop: the workers finish their step and write a checkpoint. A later one cuts that short only
 * when it is an explicit second request: a second SIGINT (Ctrl-C twice, as torchrun does), or
 * any stop signal TD_STOP_REPEAT_GRACE_S or more after the stop began. Sooner, a SIGTERM or
 * SIGHUP is the same request delivered again (timeout(1) signals its child and then its whole
 * process group; schedulers and init systems signal a process and its group) and must not cost
 * the checkpoint. SIGKILL needs no help. */
#define TD_STOP_REPEAT_GRACE   10 /* seconds */
#define TD_STOP_REPEAT_GRACE_S ((double)TD_STOP_REPEAT_GRACE)
#define TD__STOP_STR(x)        #x
#define TD__STOP_XSTR(x)       TD__STOP_STR(x)
/* What the supervisors tell a person who wants the stop cut short ("... kills them now"). */
#define TD_STOP_ESCALATE_HINT                                                                      \
    "Ctrl-C twice, or a signal " TD__STOP_XSTR(TD_STOP_REPEAT_GRACE) " s or more after the first,"
typedef enum {
    TD_STOP_IGNORE,   /* not a stop signal */
    TD_STOP_GRACEFUL, /* the first: ask the workers to checkpoint and exit */
    TD_STOP_REPEAT,   /* the same request again: keep waiting for the checkpoint */
    TD_STOP_ESCALATE, /* an explicit second request: cut the workers off now */
} td_stop_action;
typedef struct td_stop_signals { /* zero-initialized: no stop yet */
    bool begun;
    double began_s; /* when the graceful stop began (td_now_s) */
    int nsigint;    /* SIGINTs taken so far */
} td_stop_signals;
/* A stop that began without a signal (max_duration): later signals count from `now_s`. */
void td_stop_signals_begin(td_stop_signals *s, double now_s);
/* What signal `sig`, arriving at `now_s`, asks for. */
td_stop_action td_stop_signals_take(td_stop_signals *s, int sig, double now_s);

/* Signals read from a descriptor (signalfd) instead of handlers: the loop that owns the process
 * polls it beside its pipes and acts on a signal where it is safe to. Opening blocks the given
 * signals in the calling thread (do it before any thread starts, so every thread inherits the
 * mask) and ignores SIGPIPE; closing restores both.
 * A thread that was started before (OpenBLAS starts one at load time, before main, with nothing
 * blocked) would take a process-directed signal itself, and a SIGTERM's default action there
 * kills the process: so each watched signal also gets a handler that passes it on to the
 * watching thread (tgkill), where it is blocked and so read from the descriptor. One sigwatch
 * per process at a time; at most TD_SIGWATCH_MAX signals. */
#define TD_SIGWATCH_MAX 8
typedef struct td_sigwatch {
    int fd;
    sigset_t old_mask;
    struct sigaction old_pipe;
    int signals[TD_SIGWATCH_MAX];
    struct sigaction old_actions[TD_SIGWATCH_MAX];
    int count;
} td_sigwatch;
td_status td_sigwatch_open(td_sigwatch *w, const int *signals, int count);
/* The next pending signal, or 0 when none is. */
int td_sigwatch_next(td_sigwatch *w);
void td_sigwatch_close(td_sigwatch *w);

/* ---- files ---- */

/* The path to start this tandem by, in another process or on another host that shares the
 * install (newly allocated): /proc/self/exe as td_install_binary names it; "tandem" when
 * unreadable. */
char *td_self_exe(void);
/* The binary a tandem at `exe` is installed as (newly allocated): exe, except that a portable
 * install's build for one x86-64 level (DIR/tandem-x86-64-v4, which DIR/tandem exec'd on this
 * CPU: tools/tandem/isa.c) is DIR/tandem when that is there, which picks again for the CPU it
 * runs on. */
char *td_install_binary(const char *exe);

/* mkdir -p: creates path and its missing parents (0755). A component that exists and is not a
 * directory is TD_ERR_INVALID naming it ("... is in the way"); other failures TD_ERR_IO. */
td_status td_mkdirs(const char *path);

/* What is at `path` when it is not a regular file ("a symbolic link", "a directory", "a
 * character device", ...); NULL when it is a regular file or nothing is there. lstat: a link
 * is reported as a link, not as its target. */
const char *td_file_kind(const char *path);
/* The same for a stat mode (st_mode): NULL for a regular file. */
const char *td_mode_kind(mode_t mode);

typedef struct {
    const void *data;
    size_t nbytes;
} td_chunk;

/* Writes the chunks in order as `path`: a temporary file in the same directory, every byte
 * written and fsync'd, renamed over the target, the directory fsync'd. A crash or a full disk
 * at any point leaves the old file or the new one, never a torn one. Only a regular file is
 * ever replaced: a directory, a device or a symbolic link at `path` is refused with its kind
 * named. `what` names the file's role in messages ("checkpoint"). TD_ERR_NOSPACE on a full
 * disk, saying nothing existing was touched. The bytes go to an unnamed file (O_TMPFILE) in
 * `path`'s directory that is named `.<name>.tmp.<pid>` only once written and synced, then renamed
 * at once: a writer killed mid-write leaves nothing. Where the file system has no O_TMPFILE (or
 * there is no /proc to name it through) the bytes go to that named file itself; the writer holds
 * an exclusive flock on it until it is renamed or removed, and one killed mid-write leaves it
 * behind for td_remove_stale_tmp. */
td_status td_write_atomic(const char *path, const char *what, const td_chunk *chunks, int nchunks);
/* Copies src to dst the same way (atomic, regular targets only). */
td_status td_copy_file(const char *src, const char *dst, const char *what);

/* Removes from `dir` the temporary files that td_write_atomic and td_copy_file left for targets
 * named `prefix`...`suffix` (".ckpt-100.tdck.tmp.4242" for prefix "ckpt-", suffix ".tdck") whose
 * writer is gone. Only a file that no writer might still be writing goes: the pid in its name is
 * no process here (a live or recycled pid keeps it) and nobody holds its writer's flock (a writer
 * on another host sharing the directory, or in another pid namespace, does). A directory that
 * does not exist has nothing to remove. *removed_out (may be NULL): how many went, each logged. */
td_status td_remove_stale_tmp(const char *dir, const char *prefix, const char *suffix,
                              size_t *removed_out);
/* Checks before any work that `path` can be written as a regular file: its directory exists and
 * takes a new file, and `path` is absent or a regular file. `what` names the option or role in
 * messages ("--save"). */
td_status td_check_output_file(const char *path, const char *what);
/* Creates `dir` and its missing parents and checks that it takes a new file. */
td_status td_check_output_dir(const char *dir, const char *what);

/* nbytes_random bytes from the kernel's CSPRNG as 2*nbytes_random hex digits (out must hold
 * 2*nbytes_random + 1). For tokens and ids: never time-derived. */
td_status td_random_hex(char *out, size_t nbytes_random);

/* ---- sockets ---- */

/* A listening TCP socket on host (NULL or "": every interface) and port (0: the kernel picks
 * one); *port_out is the port it got. The descriptor is kept open and handed on, so the port
 * cannot be taken between picking and using it (bind, close and pass the number on is a race).
 * CLOEXEC, SO_REUSEADDR. */
td_status td_listen_tcp(const char *host, int port, int backlog, int *fd_out, int *port_out);
/* A port that was free a moment ago, for a program that binds it itself and cannot take a
 * descriptor (torch.distributed's TCPStore at MASTER_PORT). Racy by nature: use td_listen_tcp
 * whenever the listener is ours. */
td_status td_pick_free_port(int *port_out);

/* What became of a td_connect_tcp, for a caller deciding whether to dial again. */
typedef enum {
    TD_CONNECT_OK,
    TD_CONNECT_UNRESOLVED,    /* the name does not resolve (or is not numeric when that was
                               * asked): dialling again cannot help */
    TD_CONNECT_RESOLVE_AGAIN, /* the resolver failed for now (EAI_AGAIN): worth trying again */
    TD_CONNECT_REFUSED,       /* refused, unreachable or timed out (the kernel's timeout or the
                               * deadline): worth dialling again; errno says which */
    TD_CONNECT_FAILED,        /* anything else (no socket, a local error) */
} td_connect_result;

/* How td_connect_tcp dials. Zero-initialized (or NULL): the kernel's own timeout, any host name,
 * no hook, no name in messages. */
typedef struct td_connect_opts {
    double deadline_s; /* give up on a connect at this time (td_now_s's clock) instead of after
                        * the kernel's minutes of SYN retries; 0: the kernel's own */
    bool numeric_host; /* the host must be a numeric address: no name lookup */
    /* called on each socket before it connects (socket options that must be set first: buffer
     * sizes, congestion control), with the address it is about to dial; the socket is
     * non-blocking until the connect is done */
    void (*before)(int fd, const struct sockaddr *addr, socklen_t len, void *user);
    void *user;
    const char *peer; /* who is dialled, for messages ("the store", "rank 3"); NULL: nobody */
} td_connect_opts;

/* A TCP connection to host:port (host: a name or a numeric address; NULL or "" is
 * TD_ERR_INVALID). Every address the name resolves to is tried in order, each until it answers,
 * fails or the deadline passes; the descriptor is CLOEXEC and blocking. The error message names
 * the peer, host:port and the cause ("cannot connect to the store at node1:29400: Connection
 * refused"; "cannot resolve the store's host 'node1' (for port 29400): Name or service not
 * known"). Status: TD_ERR_INVALID (unresolved), TD_ERR_IO (resolve again), TD_ERR_PEER (refused,
 * unreachable), TD_ERR_TIMEOUT (the deadline), TD_ERR_SYS (failed). *how (may be NULL) classifies
 * the outcome; on TD_CONNECT_REFUSED and TD_CONNECT_FAILED errno holds the last try's cause. */
td_status td_connect_tcp(const char *host, int port, const td_connect_opts *o, int *fd_out,
                         td_connect_result *how);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_OS_H */
