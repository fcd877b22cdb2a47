/* The node agent's link to an executor's supervisor: over its stdin and stdout (ssh, tandem
 * launch --forward-stdio) or over a TCP connection it opens back to the supervisor (Slurm
 * without a shared file system, --link). include/tandem/launch.h describes both. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "launch_internal.h"
#include "orphan.h"

#include "tandem/ckpt.h"
#include "tandem/launch.h"
#include "tandem/loop.h"
#include "tandem/mirror.h"
#include "tandem/os.h"

/* How often the files are looked at: a log line reaches the supervisor within this. */
#define LINK_PERIOD_MS 200
/* A dropped TCP link is dialled again this often while the job goes on (its files wait on
 * this node's disk), and for this long at the end, so the last lines still arrive. */
#define REDIAL_PERIOD_S 2.0
#define FINAL_REDIAL_S  20.0
/* Connecting and proving the token; the opening lines (which carry the code) after it. The
 * first dial tries again until DIAL_TIMEOUT_MS have passed: the supervisor may be busy, or a
 * connection refused or cut short (the supervisor closes handshakes that take too long when
 * strangers crowd its port). The waits between tries grow from 0.1 s to 2 s, each jittered into
 * [w/2, w] so that a job's nodes do not dial in step. */
#define DIAL_TIMEOUT_MS    10000
#define OPENING_TIMEOUT_MS 120000
#define BACKOFF_FIRST_S    0.1
#define BACKOFF_MAX_S      2.0

struct td_agent_link {
    int in_fd, out_fd;
    pid_t agent_tid; /* the thread that runs td_launch_run and reads the signalfd */
    td_mirror_out *mirror;
    pthread_mutex_t lock; /* the mirror and the descriptors: the sender thread and the agent */
    pthread_t thread;
    bool thread_started;
    atomic_bool closing;
    atomic_int lost; /* "lost NODE" lines: other agents known gone */
    bool broken;     /* stdio: the stream to the supervisor failed: nothing more is sent */
    bool stopped;    /* we asked ourselves to stop already */
    /* --link: the supervisor's address, and what a dropped connection needs to start again */
    char *host, *port;
    int port_num;
    int node;
    bool down;        /* the TCP link is gone and not dialled again yet */
    double next_dial; /* when to try */
    char **artifacts; /* "artifact GLOB" lines: sent as whole files at the end */
    size_t nartifacts;
    /* Node 0 over TCP: its newest checkpoint goes up as a whole file, so that a requeued job
     * whose first node is another machine resumes from it (the supervisor sends it down). */
    char *ckpt_dir;    /* TANDEM_CHECKPOINT_DIR */
    char *ckpt_name;   /* its path below TANDEM_RUN_DIR, the name both copies use */
    int64_t ckpt_sent; /* the step of the newest one sent; -1: none */
    char *ckpt_staged; /* the directory checkpoint being received from the supervisor, or NULL */
    bool local_error;  /* the last dial failed on this node (unpacking the code): no retry */
    uint64_t jitter;   /* xorshift64 state, seeded from the node and the process */
    char *end_name;    /* the end record's name for the supervisor, sent at close; or NULL */
    char *end_path;
    /* "record" (node 0 when the supervisor does not share the run directory): the script's
     * record travels too: TANDEM_RUN_DIR/sdk.json (the Python SDK's config, summary, tags)
     * whenever it changed, as sdk-inbox/sdk.json, and the files of its artifacts/ at the end. */
    char *record_dir;
    struct stat record_sent; /* sdk.json as last sent (st_ino 0: not yet) */
};

/* Stops the job the way a SIGTERM does: the agent reads it from its signalfd, forwards it to
 * the workers (they checkpoint), and tells the other nodes. Sent to the agent's thread, not to
 * the process: a stop may come before td_launch_run has opened its sigwatch (whose handler
 * passes stray signals on), and until then a process-directed SIGTERM could land on the thread
 * OpenBLAS starts at load time with nothing blocked, and kill the agent there. */
static void stop_self(td_agent_link *l, const char *why) {
    if (l->stopped) return;
    l->stopped = true;
    TD_LOG_WARN("%s: stopping the workers (as SIGTERM)", why);
    syscall(SYS_tgkill, getpid(), l->agent_tid, SIGTERM);
}

/* A line from the supervisor after "go". */
static void on_line(td_agent_link *l, const char *line) {
    if (!strcmp(line, "stop"))
        stop_self(l, "the supervisor asked to stop");
    else if (!strncmp(line, "lost ", 5))
        atomic_fetch_add(&l->lost, 1);
    else if (!strncmp(line, "alive ", 6)) /* the dead-man's switch (orphan.c) */
        td__orphan_heard(line + 6);
    else
        TD_LOG_WARN("the supervisor sent '%.60s', which this agent does not know; ignored", line);
}

/* ---- the opening ---- */
static td_status read_exact(int fd, void *buf, size_t n, double deadline, const char *what) {
    char *p = buf;
    while (n) {
        /* a transport's bounded wait for the next bytes (the link's own loop is not running
         * yet: this is the opening) */
        double left = deadline - td_now_s();
        if (left < 0.001) return td_error(TD_ERR_TIMEOUT, "link: %s took too long", what);
        if (!td_loop_wait_readable(fd, left)) continue;
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return td_error_errno(TD_ERR_IO, "link: reading %s", what);
        if (got == 0) return td_error(TD_ERR_IO, "link: the supervisor hung up during %s", what);
        p += got;
        n -= (size_t)got;
    }
    return TD_OK;
}

/* "code SIZE" and SIZE bytes of a tar stream: the run's code, unpacked into our working
 * directory (the node's copy of the run's work directory) by tar. */
static td_status unpack_code(td_agent_link *l, const char *size_text, double deadline) {
    int64_t size;
    TD_CHECK(td_parse_i64("link: code size", size_text, &size));
    char cwd[4096] = "?";
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    FILE *tar = popen("tar -xf - --no-same-owner --warning=no-timestamp", "w");
    if (!tar) {
        l->local_error = true;
        return td_error_errno(TD_ERR_SYS, "link: starting tar to unpack the code");
    }
    char buf[65536];
    td_status st = TD_OK;
    bool tar_gone = false;
    for (int64_t left = size; left > 0 && st == TD_OK;) {
        size_t n = (size_t)TD_MIN(left, (int64_t)sizeof buf);
        st = read_exact(l->in_fd, buf, n, deadline, "receiving the code");
        if (st == TD_OK && !tar_gone && fwrite(buf, 1, n, tar) != n) tar_gone = true;
        left -= (int64_t)n;
    }
    int status = pclose(tar);
    if (st != TD_OK) return st;
    l->local_error = tar_gone || status != 0;
    if (l->local_error)
        return td_error(TD_ERR_IO,
                        "link: unpacking the run's code (%lld bytes) into %s failed (tar: wait "
                        "status %d); is slurm: work_dir writable on this node, with room?",
                        (long long)size, cwd, status);
    TD_LOG_INFO("unpacked the run's code (%lld bytes) into %s", (long long)size, cwd);
    return TD_OK;
}

/* Where a directory checkpoint from the supervisor is put together before "ckpt-commit": a
 * hidden name, never a checkpoint. */
static char *link_stage(const td_agent_link *l, const char *entry) {
    return td_xasprintf("%s/.%s.link", l->ckpt_dir, entry);
}

/* NAME of "ckpt NAME SIZE": a file checkpoint's name, or ENTRY/REL, a file of the directory
 * checkpoint ENTRY (no empty, ".", ".." or hidden component). *rel: REL, or NULL. */
static bool link_ckpt_name(char *name, td_ckpt_name *cn, const char **rel) {
    char *slash = strchr(name, '/');
    *rel = NULL;
    if (slash) *slash = '\0';
    bool ok = td_ckpt_parse(name, cn) && cn->is_dir == (slash != NULL);
    if (slash) {
        *slash = '/';
        *rel = slash + 1;
        for (const char *p = *rel; ok;) {
            const char *e = strchr(p, '/');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            ok = n > 0 && p[0] != '.';
            if (!e) break;
            p = e + 1;
        }
    }
    return ok;
}

/* "ckpt NAME SIZE" and SIZE bytes: the newest checkpoint the supervisor holds of this run, for
 * node 0 (rank 0 alone writes checkpoints; node 0's agent hands them to the others, ckpt_peer.c).
 * A file checkpoint is written atomically into the checkpoint directory unless a file of that
 * name is there already (this node wrote it: the same bytes). A directory checkpoint comes as
 * one "ckpt ENTRY/REL SIZE" per file into a staged copy, then "ckpt-commit ENTRY"
 * (commit_checkpoint); nothing when ENTRY is committed here already. */
static td_status receive_checkpoint(td_agent_link *l, const char *args, double deadline) {
    char name[1024];
    long long size = -1;
    char end;
    td_ckpt_name cn;
    const char *rel = NULL;
    if (sscanf(args, "%1023s %lld%c", name, &size, &end) != 2 || size < 0 || !l->ckpt_dir ||
        !link_ckpt_name(name, &cn, &rel))
        return td_error(TD_ERR_FORMAT, "link: 'ckpt %.80s' is not a checkpoint this node takes",
                        args);
    char *path, *tmp;
    bool have;
    td_status st = td_mkdirs(l->ckpt_dir);
    if (rel) {
        char entry[1024];
        snprintf(entry, sizeof entry, "%.*s", (int)(rel - 1 - name), name);
        have = td_ckpt_committed(l->ckpt_dir, entry, NULL);
        char *stage = link_stage(l, entry);
        if (!have && (!l->ckpt_staged || strcmp(l->ckpt_staged, entry))) {
            td__rm_tree(stage); /* what an earlier opening left: this one starts it again */
            free(l->ckpt_staged);
            l->ckpt_staged = td_xstrdup(entry);
        }
        tmp = td_xasprintf("%s/%s", stage, rel);
        path = td_xstrdup(tmp);
        char *parent = td_xstrdup(tmp);
        *strrchr(parent, '/') = '\0';
        if (st == TD_OK && !have) st = td_mkdirs(parent);
        free(parent);
        free(stage);
    } else {
        path = td_xasprintf("%s/%s", l->ckpt_dir, name);
        tmp = td_xasprintf("%s/.%s.part", l->ckpt_dir, name);
        have = access(path, F_OK) == 0;
    }
    FILE *f = NULL;
    if (st == TD_OK && !have && !(f = fopen(tmp, "wb")))
        st = td_error_errno(TD_ERR_IO, "link: writing the checkpoint %s", tmp);
    bool local = st != TD_OK; /* this node's disk failed, not the link: no use dialling again */
    char buf[65536];
    for (long long left = size; left > 0;) {
        size_t n = (size_t)TD_MIN(left, (long long)sizeof buf);
        td_status rst = read_exact(l->in_fd, buf, n, deadline, "receiving a checkpoint");
        if (rst != TD_OK) {
            st = rst;
            local = false;
            break;
        }
        if (f && st == TD_OK && fwrite(buf, 1, n, f) != n) {
            st = td_error_errno(TD_ERR_IO, "link: writing the checkpoint %s", tmp);
            local = true;
        }
        left -= (long long)n;
    }
    if (f && fclose(f) != 0 && st == TD_OK) {
        st = td_error_errno(TD_ERR_IO, "link: writing the checkpoint %s", tmp);
        local = true;
    }
    if (f && st == TD_OK && strcmp(tmp, path) && rename(tmp, path) != 0) {
        st = td_error_errno(TD_ERR_IO, "link: renaming %s", tmp);
        local = true;
    }
    if (f && st == TD_OK && !rel)
        TD_LOG_INFO("received the run's newest checkpoint %s (%lld bytes) from the supervisor",
                    path, size);
    if (f && st != TD_OK) unlink(tmp);
    l->local_error = local;
    free(path);
    free(tmp);
    return st;
}

/* "secret NAME HEX": a secret of the job (exec.h), into our environment, which the workers
 * inherit (and an S3 client here reads). The refusal names the variable, never the value. */
static td_status set_secret(const char *args) {
    size_t nlen = strcspn(args, " ");
    const char *hex = args + nlen + (args[nlen] == ' ');
    size_t hlen = strlen(hex);
    bool ok = nlen > 0 && nlen <= 128 && args[nlen] == ' ' && !isdigit((unsigned char)args[0]) &&
              hlen % 2 == 0 && strspn(hex, "0123456789abcdefABCDEF") == hlen;
    for (size_t i = 0; i < nlen && ok; i++) ok = isalnum((unsigned char)args[i]) || args[i] == '_';
    char *value = ok ? td_xcalloc(hlen / 2 + 1, 1) : NULL;
    for (size_t i = 0; ok && i < hlen / 2; i++) {
        unsigned byte = 0;
        sscanf(hex + 2 * i, "%2x", &byte);
        value[i] = (char)byte;
        ok = byte != 0; /* a NUL cannot be in an environment variable */
    }
    if (!ok) {
        free(value);
        return td_error(TD_ERR_FORMAT,
                        "link: a 'secret' line from the supervisor must be 'secret NAME HEX' (NAME "
                        "an environment variable name, HEX the value's bytes, none zero, in hex); "
                        "got one for '%.*s' that is not (is this agent's tandem the supervisor's "
                        "version?)",
                        (int)TD_MIN(nlen, 128), args);
    }
    char *name = td_xasprintf("%.*s", (int)nlen, args);
    int rc = setenv(name, value, 1);
    memset(value, 0, hlen / 2);
    free(value);
    td_status st =
        rc == 0 ? TD_OK : td_error_errno(TD_ERR_SYS, "link: setting the job's secret %s", name);
    free(name);
    return st;
}

/* The longest opening line: a secret of exec.h's TD_EXEC_SECRET_MAX_BYTES (8192) as hex. */
/* "ckpt-commit ENTRY": the directory checkpoint ENTRY staged by its "ckpt ENTRY/REL" lines is
 * whole: into place with tandem's commit marker (td__ckpt_commit_staged). Nothing staged (this
 * node holds it committed already): nothing to do. */
static td_status commit_checkpoint(td_agent_link *l, const char *entry) {
    td_ckpt_name cn;
    if (!l->ckpt_dir || !td_ckpt_parse(entry, &cn) || !cn.is_dir)
        return td_error(TD_ERR_FORMAT, "link: 'ckpt-commit %.80s' is not a checkpoint this node "
                        "takes", entry);
    if (!l->ckpt_staged || strcmp(l->ckpt_staged, entry)) return TD_OK;
    char *stage = link_stage(l, entry);
    td_status st = td__ckpt_commit_staged(l->ckpt_dir, entry, stage, true, "tandem run (the link)");
    if (st == TD_OK)
        TD_LOG_INFO("received the run's newest checkpoint %s/%s from the supervisor",
                    l->ckpt_dir, entry);
    l->local_error = st != TD_OK;
    free(l->ckpt_staged);
    l->ckpt_staged = NULL;
    free(stage);
    return st;
}

#define OPENING_LINE_MAX (sizeof "secret " + 128 + 2 * 8192 + 1)

/* The opening lines, up to "go", one byte at a time: nothing after "go" may be consumed here,
 * and the lines are few. */
static td_status read_opening(td_agent_link *l, double deadline) {
    char line[OPENING_LINE_MAX];
    for (;;) {
        /* over stdin (ssh), no deadline: the agent waits for its executor as long as ssh lives */
        TD_CHECK(td_mirror_read_line(l->in_fd, line, sizeof line,
                                     l->host ? (uint64_t)(deadline * 1e9) : 0,
                                     "the supervisor's opening lines (up to 'go')"));
        if (!strcmp(line, "go")) return TD_OK;
        if (!strncmp(line, "token ", 6)) {
            setenv(td_var_name(TD_VAR_TANDEM_TOKEN), line + 6, 1);
            memset(line, 0, sizeof line);
        } else if (!strncmp(line, "secret ", 7)) {
            td_status st = set_secret(line + 7);
            memset(line, 0, sizeof line);
            TD_CHECK(st);
        } else if (!strncmp(line, "have ", 5)) {
            TD_CHECK(td_mirror_out_have(l->mirror, line));
        } else if (!strncmp(line, "code ", 5) && l->host) {
            TD_CHECK(unpack_code(l, line + 5, deadline));
        } else if (!strncmp(line, "ckpt ", 5) && l->host) {
            TD_CHECK(receive_checkpoint(l, line + 5, deadline));
        } else if (!strncmp(line, "ckpt-commit ", 12) && l->host) {
            TD_CHECK(commit_checkpoint(l, line + 12));
        } else if (!strcmp(line, "record")) {
            free(l->record_dir);
            const char *rd = td_var_get(TD_VAR_TANDEM_RUN_DIR);
            l->record_dir = rd ? td_xstrdup(rd) : NULL;
            memset(&l->record_sent, 0, sizeof l->record_sent); /* a new link: sent again */
        } else if (!strncmp(line, "artifact ", 9) && l->host) {
            l->artifacts = td_xrealloc(l->artifacts, (l->nartifacts + 1) * sizeof *l->artifacts);
            l->artifacts[l->nartifacts++] = td_xstrdup(line + 9);
        } else {
            return td_error(TD_ERR_FORMAT,
                            "link: '%.60s' from the supervisor is not an opening line (token, "
                            "secret, have, code, ckpt, ckpt-commit, artifact, record, go)",
                            line);
        }
    }
}

/* ---- --link: the TCP connection ---- */
/* A connection to the supervisor that gives up at deadline (td_now_s's clock) instead of the
 * kernel's minutes of SYN retries. *permanent: dialling again cannot help (a name that does not
 * resolve). */
static td_status dial_tcp(const td_agent_link *l, double deadline, int *fd_out, bool *permanent) {
    td_connect_opts o = {.deadline_s = deadline, .peer = "the supervisor"};
    td_connect_result how;
    *permanent = false;
    if (td_connect_tcp(l->host, l->port_num, &o, fd_out, &how) != TD_OK) {
        *permanent = how == TD_CONNECT_UNRESOLVED;
        if (how == TD_CONNECT_UNRESOLVED || how == TD_CONNECT_RESOLVE_AGAIN)
            return td_error(TD_ERR_IO,
                            "link: %s; set slurm: link_host to a name or address the nodes can "
                            "reach",
                            td_error_msg());
        return td_error(TD_ERR_IO, "link: %s", td_error_msg());
    }
    int one = 1;
    setsockopt(*fd_out, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    return TD_OK;
}

/* One try: connects, proves the token, says who we are ("hello NODE FIRST": FIRST 1 asks for
 * the code) and reads the opening. The mirror then sends from what the new manifest says.
 * deadline: for connecting and the token (0: DIAL_TIMEOUT_MS from now). *retry: the failure
 * is the link's (refused, cut short, timed out), so another try may work. */
static td_status dial(td_agent_link *l, bool first, double deadline, bool *retry) {
    if (deadline <= 0) deadline = td_now_s() + DIAL_TIMEOUT_MS / 1000.0;
    int fd = -1;
    bool permanent = false;
    l->local_error = false;
    td_status st = dial_tcp(l, deadline, &fd, &permanent);
    if (st != TD_OK) {
        *retry = !permanent;
        return st;
    }
    const char *token = td_var_get(TD_VAR_TANDEM_TOKEN);
    int left_ms = (int)((deadline - td_now_s()) * 1000);
    if (!token || !*token)
        st = td_error(TD_ERR_AUTH,
                      "link: %s is not set; the executor passes the run's token in the job's "
                      "environment",
                      td_var_name(TD_VAR_TANDEM_TOKEN));
    else
        st = td_mirror_auth_connect(fd, token, TD_MAX(left_ms, 1));
    if (st == TD_OK) {
        char hello[64];
        int n = snprintf(hello, sizeof hello, "hello %d %d\n", l->node, first ? 1 : 0);
        if (write(fd, hello, (size_t)n) != n)
            st = td_error_errno(TD_ERR_IO, "link: greeting the supervisor");
    }
    if (st == TD_OK) {
        l->in_fd = l->out_fd = fd;
        td_mirror_out_reset(l->mirror, fd);
        for (size_t i = 0; i < l->nartifacts; i++) free(l->artifacts[i]);
        l->nartifacts = 0;
        st = read_opening(l, td_now_s() + OPENING_TIMEOUT_MS / 1000.0);
    }
    if (st != TD_OK) {
        /* a wrong token or not a tandem link (AUTH, PROTOCOL, FORMAT) stays so */
        *retry = (st == TD_ERR_IO || st == TD_ERR_TIMEOUT) && !l->local_error;
        close(fd);
        l->in_fd = l->out_fd = -1;
        return st;
    }
    l->down = false;
    return TD_OK;
}

/* A wait before the next try: w jittered into [w/2, w]. The source need not be secret, only
 * differ between the nodes of a job: the node and the process seed it. */
static double jittered(td_agent_link *l, double w) {
    uint64_t x = l->jitter;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    l->jitter = x;
    return w * (0.5 + 0.5 * (double)(x >> 11) / 9007199254740992.0);
}

/* The first dial: tries again, backing off, while the failure is the link's and DIAL_TIMEOUT_MS
 * have not passed. Each try is a one-shot timer, set by the one before, on a loop of the dial's
 * own (the link's loop starts once it is up). */
typedef struct {
    td_agent_link *l;
    double t0, deadline, wait;
    int attempt;
    td_status st;
} first_dial;

static void dial_try(td_loop *loop, void *user) {
    first_dial *d = user;
    td_agent_link *l = d->l;
    bool retry = false;
    d->attempt++;
    d->st = dial(l, true, d->deadline, &retry);
    if (d->st == TD_OK) {
        if (d->attempt > 1)
            TD_LOG_INFO("link: joined the supervisor at %s:%s on try %d, after %.1f s", l->host,
                        l->port, d->attempt, td_now_s() - d->t0);
        td_loop_stop(loop);
        return;
    }
    char why[600];
    const char *msg = td_error_msg();
    snprintf(why, sizeof why, "%s", strncmp(msg, "link: ", 6) ? msg : msg + 6);
    td_error_clear();
    double now = td_now_s();
    if (!retry || d->deadline - now < 0.2) { /* too little left for another try to mean anything */
        d->st = !retry ? td_error(d->st, "link: joining the supervisor at %s:%s: %s", l->host,
                                  l->port, why)
                       : td_error(d->st,
                                  "link: could not join the supervisor at %s:%s in %d attempts "
                                  "over %.0f s (the last: %s); check that tandem run is still "
                                  "running and that the nodes reach it at that address (slurm: "
                                  "link_host, a firewall between them)",
                                  l->host, l->port, d->attempt, now - d->t0, why);
        td_loop_stop(loop);
        return;
    }
    if (d->attempt == 1)
        TD_LOG_INFO("link: the supervisor at %s:%s did not answer yet (%s); trying again for "
                    "up to %.0f s",
                    l->host, l->port, why, d->deadline - now);
    double pause = TD_MIN(jittered(l, d->wait), d->deadline - now - 0.1);
    d->wait = TD_MIN(2 * d->wait, BACKOFF_MAX_S);
    td_loop_timer(loop, pause, 0, dial_try, d);
}

static td_status dial_first(td_agent_link *l) {
    first_dial d = {.l = l, .t0 = td_now_s(), .wait = BACKOFF_FIRST_S};
    d.deadline = d.t0 + DIAL_TIMEOUT_MS / 1000.0;
    td_loop *loop = NULL;
    TD_CHECK(td_loop_new(&loop));
    td_loop_timer(loop, 0, 0, dial_try, &d);
    td_status st = td_loop_run(loop);
    td_loop_free(loop);
    return st != TD_OK ? st : d.st;
}

/* The TCP link failed (held under l->lock): its files wait on this disk until a dial works. */
static void link_down(td_agent_link *l, const char *why) {
    if (l->down) return;
    TD_LOG_WARN("link to the supervisor at %s:%s lost (%s); logs and metrics wait on this node "
                "and follow when it is back (trying every %.0f s)",
                l->host, l->port, why, REDIAL_PERIOD_S);
    close(l->in_fd);
    l->in_fd = l->out_fd = -1;
    l->down = true;
    l->next_dial = td_now_s() + REDIAL_PERIOD_S;
}

/* Sending to the supervisor failed: a --link connection (host) is down and is dialled again; the
 * stdio stream of an ssh agent cannot come back, so the agent stops its workers. */
static void send_failed(td_agent_link *l, const char *why) {
    if (l->host) {
        link_down(l, why);
    } else {
        l->broken = true;
        stop_self(l, why);
    }
}

static void try_dial(td_agent_link *l) {
    if (!l->down || td_now_s() < l->next_dial) return;
    bool retry;
    if (dial(l, false, 0, &retry) == TD_OK) {
        TD_LOG_INFO("link to the supervisor at %s:%s is back", l->host, l->port);
    } else {
        td_error_clear();
        l->next_dial = td_now_s() + REDIAL_PERIOD_S;
    }
}

/* Node 0's newest checkpoint, when it is newer than the last one sent (held under l->lock).
 * Checkpoints appear whole (written aside and renamed), and only the newest matters. */
static void send_checkpoint(td_agent_link *l) {
    if (!l->ckpt_name || l->down) return;
    char base[256];
    long long newest = (long long)td_ckpt_newest(l->ckpt_dir, TD_CKPT_ANY, base, sizeof base);
    if (newest < 0 || newest <= l->ckpt_sent) return;
    td_ckpt_name cn;
    td_ckpt_parse(base, &cn);
    /* a directory (HF's checkpoint-N/): file by file, its framework's marker last, so that the
     * supervisor's copy counts as committed only once whole (tandem/ckpt.h) */
    int nfiles = 1;
    char **files = cn.is_dir ? td_ckpt_dir_files(l->ckpt_dir, base, &nfiles) : NULL;
    bool sent = true;
    for (int i = 0; i < nfiles && sent; i++) {
        const char *rel = files ? files[i] : base;
        char *path = td_xasprintf("%s/%s", l->ckpt_dir, rel);
        char *name = td_xasprintf("%s/%s", l->ckpt_name, rel);
        struct stat sb;
        sent = false;
        if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (td_mirror_out_file(l->mirror, name, path) == TD_OK) {
                sent = true;
            } else if (access(path, F_OK) == 0) {
                char why[600];
                snprintf(why, sizeof why, "sending %s: %s", path, td_error_msg());
                td_error_clear();
                link_down(l, why);
            } else {
                td_error_clear(); /* a newer one replaced it meanwhile: that one goes next */
            }
        }
        free(path);
        free(name);
    }
    if (sent && nfiles > 0) l->ckpt_sent = newest;
    td_ckpt_files_free(files, files ? nfiles : 0);
}

/* ---- the script's record (node 0, "record") ---- */
/* TANDEM_RUN_DIR/sdk.json when it changed since it was last sent (held under l->lock). The SDK
 * replaces it whole (written aside, renamed), so a changed inode, size or mtime is a new one. */
static void send_record_sdk(td_agent_link *l) {
    if (!l->record_dir || l->down || l->broken) return;
    char *path = td_xasprintf("%s/sdk.json", l->record_dir);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
        (sb.st_ino != l->record_sent.st_ino || sb.st_dev != l->record_sent.st_dev ||
         sb.st_size != l->record_sent.st_size ||
         sb.st_mtim.tv_sec != l->record_sent.st_mtim.tv_sec ||
         sb.st_mtim.tv_nsec != l->record_sent.st_mtim.tv_nsec)) {
        if (td_mirror_out_file(l->mirror, "sdk-inbox/sdk.json", path) == TD_OK) {
            l->record_sent = sb;
        } else {
            char why[600];
            snprintf(why, sizeof why, "sending %s: %s", path, td_error_msg());
            td_error_clear();
            send_failed(l, why);
        }
    }
    free(path);
}

/* The regular files under dir (the script's artifacts/), each as whole file NAME/REL; links
 * are not followed, names starting with '.' (an atomic write's temporary) are left out. */
static td_status send_tree(td_agent_link *l, const char *dir, const char *name, int depth) {
    DIR *d = depth < 16 ? opendir(dir) : NULL;
    if (!d) return TD_OK;
    td_status st = TD_OK;
    for (struct dirent *e; st == TD_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char *path = td_xasprintf("%s/%s", dir, e->d_name);
        char *sub = td_xasprintf("%s/%s", name, e->d_name);
        struct stat sb;
        int got = lstat(path, &sb) == 0;
        if (got && S_ISDIR(sb.st_mode))
            st = send_tree(l, path, sub, depth + 1);
        else if (got && S_ISREG(sb.st_mode))
            st = td_mirror_out_file(l->mirror, sub, path);
        free(path);
        free(sub);
    }
    closedir(d);
    return st;
}

/* ---- the sender ---- */
/* The link's own thread, on an event loop of its own (core's loop.h): the supervisor's commands
 * arrive on the watched in_fd, and a timer every LINK_PERIOD_MS redials a TCP link that is down,
 * sends a new checkpoint and the files' new bytes, and ends the loop once the agent is closing
 * (a TCP link that is down after FINAL_REDIAL_S more of redialling).
 * The link's descriptor changes when it is dialled again: the watch follows it.
 *
 * Why a thread and a loop of its own, and not work queued on the agent's loop (launch.c's, the
 * one the spot watch and the S3 mirror use): the link lives longer than that loop and must run
 * while it does not turn. It opens before td_launch_run (the opening brings the token, the
 * secrets and the code the agent starts with) and closes after it returns (the last
 * checkpoint, the artifacts, the end record); in between, the agent blocks outside its loop
 * (the node's setup, the rendezvous, the pause between attempts), and the supervisor's "stop"
 * and "alive" lines (the dead-man's switch, orphan.c) must still be read then. Nor is it a
 * blocking call handed off and back: it is the link's whole life, which reaches the agent only
 * through a signal (stop_self), an atomic (lost) and the lock. */
typedef struct {
    td_agent_link *l;
    char buf[512];
    size_t len;
    bool in_open;
    int watched;       /* the descriptor the loop watches, or -1 */
    double closing_at; /* when the tick first saw the agent closing the link, or 0 */
} sender_ctx;

static void sender_read(td_loop *loop, int fd, unsigned events, void *user);

/* Watches the link's current descriptor (none while it is down or closed); force: watch it anew
 * even if its number is the old one's (a descriptor closed and reused by a new connection). */
static void sender_rewatch(td_loop *loop, sender_ctx *s, bool force) {
    td_agent_link *l = s->l;
    pthread_mutex_lock(&l->lock);
    int want = s->in_open && !l->down && !atomic_load(&l->closing) ? l->in_fd : -1;
    pthread_mutex_unlock(&l->lock);
    if (want == s->watched && !force) return;
    if (s->watched >= 0) td_loop_unwatch(loop, s->watched);
    s->watched = -1;
    if (want >= 0 && td_loop_watch(loop, want, TD_LOOP_READ, sender_read, s) == TD_OK)
        s->watched = want;
    td_error_clear();
}

static void sender_read(td_loop *loop, int fd, unsigned events, void *user) {
    (void)events;
    sender_ctx *s = user;
    td_agent_link *l = s->l;
    pthread_mutex_lock(&l->lock);
    if (fd == l->in_fd && !l->down) {
        ssize_t n = read(l->in_fd, s->buf + s->len, sizeof s->buf - 1 - s->len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            /* again */
        } else if (n <= 0 && l->host) {
            link_down(l, n == 0 ? "the supervisor closed it" : strerror(errno));
            s->len = 0;
        } else if (n <= 0) {
            s->in_open = false;
            stop_self(l, "the link to the supervisor closed (its host, ssh or the supervisor is "
                         "gone)");
        } else {
            s->len += (size_t)n;
            char *nl;
            while ((nl = memchr(s->buf, '\n', s->len))) {
                *nl = '\0';
                on_line(l, s->buf);
                s->len -= (size_t)(nl + 1 - s->buf);
                memmove(s->buf, nl + 1, s->len);
            }
            if (s->len == sizeof s->buf - 1) s->len = 0; /* a line that long is no command */
        }
    }
    pthread_mutex_unlock(&l->lock);
    sender_rewatch(loop, s, false);
}

/* The agent is closing the link: the loop ends, but a TCP link that is down gets a last chance
 * first, FINAL_REDIAL_S of dialling (the tails and the artifacts are here). Nothing is read or
 * sent meanwhile: td_agent_link_close sends the rest once the loop has ended. */
static void closing_tick(td_loop *loop, sender_ctx *s) {
    td_agent_link *l = s->l;
    double now = td_now_s();
    if (s->closing_at == 0) s->closing_at = now;
    pthread_mutex_lock(&l->lock);
    bool redial = l->host && l->down && now - s->closing_at < FINAL_REDIAL_S;
    if (redial) try_dial(l);
    bool over = !redial || !l->down;
    pthread_mutex_unlock(&l->lock);
    sender_rewatch(loop, s, false); /* closing: watches nothing */
    if (over) td_loop_stop(loop);
}

static void sender_tick(td_loop *loop, void *user) {
    sender_ctx *s = user;
    td_agent_link *l = s->l;
    if (atomic_load(&l->closing)) {
        closing_tick(loop, s);
        return;
    }
    pthread_mutex_lock(&l->lock);
    bool was_down = l->down;
    if (l->host) try_dial(l);
    bool redialled = was_down && !l->down;
    if (l->host) send_checkpoint(l);
    send_record_sdk(l);
    if (!l->broken && !l->down && td_mirror_out_poll(l->mirror, NULL) != TD_OK) {
        char why[600];
        snprintf(why, sizeof why, "cannot send logs and metrics to the supervisor (%s)",
                 td_error_msg());
        td_error_clear();
        send_failed(l, why);
    }
    pthread_mutex_unlock(&l->lock);
    sender_rewatch(loop, s, redialled);
}

static void *sender(void *arg) {
    sender_ctx s = {.l = arg, .in_open = true, .watched = -1};
    td_loop *loop = NULL;
    if (td_loop_new(&loop) != TD_OK) {
        /* no loop (no memory for epoll): the link cannot run; the agent's job goes on alone */
        TD_LOG_WARN("link: %s; this node's logs and metrics stay in its --log-dir and "
                    "--metrics-dir",
                    td_error_msg());
        td_error_clear();
        return NULL;
    }
    sender_rewatch(loop, &s, false);
    td_loop_timer(loop, LINK_PERIOD_MS / 1000.0, LINK_PERIOD_MS / 1000.0, sender_tick, &s);
    while (!td_loop_stopped(loop))
        if (td_loop_turn(loop, -1) != TD_OK) { /* epoll failed: keep going, slowly */
            td_error_clear();
            usleep(10000);
        }
    td_loop_free(loop);
    return NULL;
}

static td_status start(td_agent_link *l) {
    /* The thread starts with every signal blocked (it inherits this mask): the agent's
     * SIGTERM and SIGCHLD belong to its signalfd, never to a thread's default action. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&l->thread, NULL, sender, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) return td_error(TD_ERR_SYS, "link: starting a thread: %s", strerror(err));
    l->thread_started = true;
    return TD_OK;
}

static td_agent_link *link_new(int in_fd, int out_fd, const char *log_dir,
                               const char *metrics_dir) {
    td_agent_link *l = td_xcalloc(1, sizeof *l);
    l->in_fd = in_fd;
    l->out_fd = out_fd;
    l->agent_tid = (pid_t)syscall(SYS_gettid);
    l->mirror = td_mirror_out_new(out_fd);
    pthread_mutex_init(&l->lock, NULL);
    if (log_dir) td_mirror_out_watch(l->mirror, "logs", log_dir);
    if (metrics_dir) td_mirror_out_watch(l->mirror, "metrics", metrics_dir);
    return l;
}

td_status td_agent_link_open(int in_fd, int out_fd, const char *log_dir, const char *metrics_dir,
                             td_agent_link **out) {
    *out = NULL;
    td_agent_link *l = link_new(in_fd, out_fd, log_dir, metrics_dir);
    td_status st = read_opening(l, 0);
    if (st == TD_OK) st = start(l);
    if (st != TD_OK) {
        td_agent_link_close(l);
        return st;
    }
    *out = l;
    return TD_OK;
}

td_status td_agent_link_connect(const char *endpoint, int node, const char *log_dir,
                                const char *metrics_dir, td_agent_link **out) {
    *out = NULL;
    const char *colon = strrchr(endpoint, ':');
    if (!colon || colon == endpoint || !colon[1])
        return td_error(TD_ERR_USAGE, "--link '%s': expected HOST:PORT (the supervisor's)",
                        endpoint);
    int64_t port;
    if (td_parse_i64("--link's port", colon + 1, &port) != TD_OK || port < 1 || port > 65535)
        return td_error(TD_ERR_USAGE,
                        "--link '%s': expected HOST:PORT (the supervisor's), PORT "
                        "a number from 1 to 65535",
                        endpoint);
    td_agent_link *l = link_new(-1, -1, log_dir, metrics_dir);
    l->host = td_xasprintf("%.*s", (int)(colon - endpoint), endpoint);
    l->port = td_xstrdup(colon + 1);
    l->port_num = (int)port;
    l->node = node;
    l->ckpt_sent = -1;
    /* The executor gives each incarnation of a job its own spool (docs/executors.md): whatever
     * the supervisor holds already comes before everything in it. */
    td_mirror_out_fresh_spool(l->mirror);
    const char *ck = td_var_get(TD_VAR_TANDEM_CHECKPOINT_DIR),
               *run = td_var_get(TD_VAR_TANDEM_RUN_DIR);
    size_t rlen = run ? strlen(run) : 0;
    if (node == 0 && ck && run && rlen && !strncmp(ck, run, rlen) && ck[rlen] == '/' &&
        ck[rlen + 1]) {
        l->ckpt_dir = td_xstrdup(ck);
        l->ckpt_name = td_xstrdup(ck + rlen + 1);
    }
    l->jitter =
        ((uint64_t)getpid() << 32 ^ (uint64_t)node * 0x9e3779b97f4a7c15ull ^ td_now_ns()) | 1;
    td_status st = dial_first(l);
    if (st == TD_OK) st = start(l);
    if (st != TD_OK) {
        td_agent_link_close(l);
        return st;
    }
    *out = l;
    return TD_OK;
}

void td_agent_link_store_port(void *link, int port) {
    td_agent_link *l = link;
    char value[16];
    snprintf(value, sizeof value, "%d", port);
    pthread_mutex_lock(&l->lock);
    if (!l->broken && !l->down && td_mirror_out_note(l->mirror, "store_port", value) != TD_OK) {
        TD_LOG_WARN("cannot tell the supervisor the store's port: %s", td_error_msg());
        td_error_clear();
        if (!l->host) l->broken = true;
    }
    pthread_mutex_unlock(&l->lock);
}

void td_agent_link_note(void *link, const char *key, const char *value) {
    td_agent_link *l = link;
    pthread_mutex_lock(&l->lock);
    /* The agent stops itself on a spot interruption notice (spot_watch.c): a "stop" that the
     * supervisor answers the note with is that same stop, not a second one, which would SIGKILL
     * the workers while they write their checkpoint. */
    if (!strcmp(key, "interrupted")) l->stopped = true;
    if (!l->broken && !l->down && td_mirror_out_note(l->mirror, key, value) != TD_OK) {
        TD_LOG_WARN("cannot tell the supervisor '%s %s': %s", key, value, td_error_msg());
        td_error_clear();
        if (!l->host) l->broken = true;
    }
    pthread_mutex_unlock(&l->lock);
}

int td_agent_link_lost_nodes(void *link) {
    return atomic_load(&((td_agent_link *)link)->lost);
}

/* The "artifact GLOB" files (relative to our working directory: the node's copy of the run's
 * work directory), as whole files named work/PATH. */
static td_status send_artifacts(td_agent_link *l) {
    td_status st = TD_OK;
    for (size_t i = 0; i < l->nartifacts && st == TD_OK; i++) {
        glob_t g;
        if (glob(l->artifacts[i], 0, NULL, &g) != 0) continue; /* none (or unreadable) */
        for (size_t k = 0; k < g.gl_pathc && st == TD_OK; k++) {
            struct stat sb;
            const char *path = g.gl_pathv[k];
            if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
            while (!strncmp(path, "./", 2)) path += 2;
            char *name = td_xasprintf("work/%s", path);
            st = td_mirror_out_file(l->mirror, name, g.gl_pathv[k]);
            free(name);
        }
        globfree(&g);
    }
    return st;
}

void td_agent_link_end_record(td_agent_link *l, const char *name, const char *path) {
    if (!l) return;
    free(l->end_name);
    free(l->end_path);
    l->end_name = td_xstrdup(name);
    l->end_path = td_xstrdup(path);
}

td_status td_agent_link_close(td_agent_link *l) {
    if (!l) return TD_OK;
    td_status st = TD_OK;
    if (l->thread_started) {
        atomic_store(&l->closing, true);
        pthread_join(l->thread, NULL); /* after the last redials of a link that is down */
        if (l->down) {
            st = td_error(TD_ERR_IO,
                          "link: the supervisor at %s:%s could not be reached again; what this "
                          "node did not send is in its --log-dir and --metrics-dir",
                          l->host, l->port);
        } else if (!l->broken) {
            /* the checkpoint a stop or preemption made as the workers exited */
            send_checkpoint(l);
            st = l->down ? td_error(TD_ERR_IO, "link: lost while sending the last checkpoint")
                         : send_artifacts(l);
            /* the script's record: its last sdk.json (tandem.finish writes it) and artifacts */
            if (st == TD_OK && l->record_dir) {
                send_record_sdk(l);
                if (l->down || l->broken)
                    st = td_error(TD_ERR_IO, "link: lost while sending sdk.json");
            }
            if (st == TD_OK && l->record_dir) {
                char *dir = td_xasprintf("%s/artifacts", l->record_dir);
                st = send_tree(l, dir, "artifacts", 0);
                free(dir);
            }
            if (st == TD_OK && l->end_name)
                st = td_mirror_out_file(l->mirror, l->end_name, l->end_path);
            if (st == TD_OK) st = td_mirror_out_end(l->mirror);
        }
    }
    if (l->host && l->in_fd >= 0) close(l->in_fd);
    for (size_t i = 0; i < l->nartifacts; i++) free(l->artifacts[i]);
    free(l->artifacts);
    free(l->host);
    free(l->port);
    free(l->ckpt_dir);
    free(l->ckpt_name);
    free(l->ckpt_staged);
    free(l->end_name);
    free(l->end_path);
    free(l->record_dir);
    td_mirror_out_free(l->mirror);
    pthread_mutex_destroy(&l->lock);
    free(l);
    return st;
}
