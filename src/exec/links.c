/* The supervisor's end of the node agents' TCP links (tandem launch --link; the Slurm executor
 * with slurm: work_dir, whose nodes do not share the run directory).
 *
 * tandem run listens on a port of its own; each node's launcher connects, and the two prove the
 * run's token to each other (td_mirror_auth_accept). The agent says "hello NODE FIRST"; we
 * answer with what our copies hold (the mirror manifest), the code as a tar stream when FIRST
 * asks for it, the artifact patterns (node 0 only: rank 0 writes what a run saves), and "go".
 * From then on the connection is the agent's mirror stream: its rank logs, metric files and
 * its own messages (logs/node-N.log) append to the run directory, and at the end its artifacts
 * land in RUN/work, where the run's end collects them as for a local run. A connection that
 * drops is dialled again by the agent; a requeued job's agents connect anew. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/internal.h"
#include "tandem/mirror.h"

/* A peer that connects must prove the token and greet within this; a slow or foreign one
 * holds up the supervisor's loop no longer. */
#define HANDSHAKE_MS 5000
#define MAX_CONNS    1024

typedef struct {
    int fd;
    int node; /* -1 before "hello" */
    td_mirror_in *in;
    int ended; /* "tdm end": everything of this agent arrived */
} conn;

/* The lines of one node's logs/node-N.log as they arrive: to our stderr, and its last
 * "tandem: error:" line is the cause a failed job reports. */
typedef struct {
    td__buf line;
} node_echo;

struct td__links {
    const td_exec_job *job;
    int listen_fd, port;
    char endpoint[300];
    char token[33];
    char *code_path; /* RUN/code.tar */
    conn conns[MAX_CONNS];
    size_t nconns;
    unsigned char *seen; /* per node: connected at least once */
    int nseen;
    td__echo echo;
    node_echo *node_lines;
    char cause[512];
    /* The run's checkpoint directory below RUN (TANDEM_CHECKPOINT_DIR), as node 0 names what it
     * sends; NULL when it lies elsewhere (then checkpoints do not travel). */
    char *ckpt_rel;
};

/* Checkpoints kept in the supervisor's copy: the newest is what a new node 0 gets; one more in
 * case the newest was cut short when its node died (the sender renames whole files only, so
 * this is belt and braces). */
#define CKPT_KEEP 2

/* The steps of RUN/ckpt_rel/ckpt-STEP.tdck, newest first; *n of them. Caller frees. */
static long long *ckpt_steps(const td__links *l, size_t *n) {
    *n = 0;
    char *dir = td_xasprintf("%s/%s", l->job->run->run_dir, l->ckpt_rel);
    DIR *d = opendir(dir);
    free(dir);
    if (!d) return NULL;
    long long *v = NULL, step;
    size_t cap = 0;
    int used;
    for (struct dirent *e; (e = readdir(d));) {
        if (sscanf(e->d_name, "ckpt-%lld.tdck%n", &step, &used) != 1 ||
            used != (int)strlen(e->d_name))
            continue;
        if (*n == cap) v = td_xrealloc(v, (cap = cap ? 2 * cap : 8) * sizeof *v);
        size_t i = (*n)++;
        for (; i > 0 && v[i - 1] < step; i--) v[i] = v[i - 1];
        v[i] = step;
    }
    closedir(d);
    return v;
}

/* A whole file arrived: a checkpoint replaces all but the newest CKPT_KEEP. */
static void on_file(void *user, const char *name, int64_t size) {
    td__links *l = user;
    (void)size;
    size_t rlen = l->ckpt_rel ? strlen(l->ckpt_rel) : 0;
    if (!rlen || strncmp(name, l->ckpt_rel, rlen) || name[rlen] != '/') return;
    size_t n;
    long long *steps = ckpt_steps(l, &n);
    for (size_t i = CKPT_KEEP; i < n; i++) {
        char *old =
            td_xasprintf("%s/%s/ckpt-%lld.tdck", l->job->run->run_dir, l->ckpt_rel, steps[i]);
        unlink(old);
        free(old);
    }
    free(steps);
}

static void node_line(td__links *l, node_echo *e) {
    td__exec_write_all(STDERR_FILENO, e->line.s, e->line.len);
    if (!strncmp(e->line.s, "tandem: error: ", 15)) {
        size_t len = strcspn(e->line.s + 15, "\r\n");
        snprintf(l->cause, sizeof l->cause, "%.*s", (int)len, e->line.s + 15);
    }
    e->line.len = 0;
    e->line.s[0] = '\0';
}

static void on_data(void *user, const char *name, const char *bytes, size_t n) {
    td__links *l = user;
    if (!strncmp(name, "logs/rank-", 10)) {
        if (!l->job->quiet_output) td__exec_echo_rank_log(&l->echo, name, bytes, n);
        return;
    }
    int node = -1;
    char tail[8];
    if (sscanf(name, "logs/node-%d.lo%1s", &node, tail) != 2 || node < 0 ||
        node >= l->job->run->nodes)
        return;
    node_echo *e = &l->node_lines[node];
    for (size_t i = 0; i < n; i++) {
        td__buf_add(&e->line, &bytes[i], 1);
        if (bytes[i] == '\n' || e->line.len >= 65536) node_line(l, e);
    }
}

td_status td__links_open(const td_exec_job *job, const char *token, const char *host,
                         td__links **out) {
    *out = NULL;
    td__links *l = td_xcalloc(1, sizeof *l);
    l->job = job;
    l->listen_fd = -1;
    snprintf(l->token, sizeof l->token, "%s", token);
    l->seen = td_xcalloc((size_t)job->run->nodes, 1);
    l->node_lines = td_xcalloc((size_t)job->run->nodes, sizeof *l->node_lines);
    const char *ck_var = td_var_name(TD_VAR_TANDEM_CHECKPOINT_DIR);
    size_t klen = strlen(ck_var), rlen = strlen(job->run->run_dir);
    for (char *const *e = job->env; e && *e; e++)
        if (!strncmp(*e, ck_var, klen) && (*e)[klen] == '=' &&
            !strncmp(*e + klen + 1, job->run->run_dir, rlen) && (*e)[klen + 1 + rlen] == '/' &&
            (*e)[klen + 2 + rlen])
            l->ckpt_rel = td_xstrdup(*e + klen + 2 + rlen);
    for (int i = 0; i < job->run->nodes; i++) td__buf_add(&l->node_lines[i].line, "", 0);
    /* The code, once: every node gets the same bytes (the version the run records). */
    l->code_path = td_xasprintf("%s/code.tar", job->run->run_dir);
    char *script = td__exec_code_tar_script(job);
    td__buf sh = {0};
    td__buf_addf(&sh, "( %s ) >", script);
    td__buf_quote(&sh, l->code_path);
    free(script);
    char *argv[] = {"/bin/sh", "-c", sh.s, NULL};
    char *o = NULL, *e = NULL;
    int code = 0;
    td_status st = td__exec_capture(argv, NULL, 300.0, &o, &e, &code);
    struct stat sb;
    if (st == TD_OK && (code != 0 || stat(l->code_path, &sb) != 0)) {
        char why[600];
        td__exec_joined_lines(e, why, sizeof why);
        st = td_error(TD_ERR_IO, "packing the run's code into %s failed (exit code %d): %s",
                      l->code_path, code, why[0] ? why : "no message");
    }
    free(sh.s);
    free(o);
    free(e);
    if (st == TD_OK) st = td_listen_tcp(NULL, 0, 64, &l->listen_fd, &l->port);
    if (st != TD_OK) {
        td__links_free(l);
        return st;
    }
    snprintf(l->endpoint, sizeof l->endpoint, "%s:%d", host, l->port);
    *out = l;
    return TD_OK;
}

const char *td__links_endpoint(const td__links *l) {
    return l->endpoint;
}

int td__links_nodes_seen(const td__links *l) {
    return l->nseen;
}

const char *td__links_cause(const td__links *l) {
    return l->cause;
}

static void conn_close(td__links *l, size_t i, const char *why) {
    conn *c = &l->conns[i];
    if (why && c->node >= 0 && !c->ended)
        TD_LOG_WARN("the link of node %d closed (%s); its agent dials again while it runs", c->node,
                    why);
    close(c->fd);
    td_mirror_in_free(c->in);
    l->conns[i] = l->conns[--l->nconns];
}

static td_status write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return td_error_errno(TD_ERR_IO, "writing to a node's link");
        p += w;
        n -= (size_t)w;
    }
    return TD_OK;
}

/* The greeting, one byte at a time (nothing of the mirror stream may be consumed). */
static td_status read_hello(int fd, int nodes, int *node, int *first) {
    char line[64];
    TD_CHECK(td_mirror_read_line(fd, line, sizeof line,
                                 td_now_ns() + (uint64_t)HANDSHAKE_MS * 1000000, "a node's hello"));
    char end;
    if (sscanf(line, "hello %d %d%c", node, first, &end) != 2 || *node < 0 || *node >= nodes ||
        (*first != 0 && *first != 1))
        return td_error(TD_ERR_PROTOCOL,
                        "a node's link said '%.40s', not hello NODE 0|1 with a "
                        "node below %d",
                        line, nodes);
    return TD_OK;
}

/* "HEAD SIZE\n" and the file's bytes (the code, a checkpoint). */
static td_status send_blob(conn *c, const char *head, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        td_status st = td_error_errno(TD_ERR_IO, "opening %s", path);
        if (fd >= 0) close(fd);
        return st;
    }
    char line[300];
    int n = snprintf(line, sizeof line, "%s %lld\n", head, (long long)sb.st_size);
    td_status st = write_full(c->fd, line, (size_t)n);
    char buf[65536];
    for (int64_t left = (int64_t)sb.st_size; st == TD_OK && left > 0;) {
        ssize_t r = read(fd, buf, (size_t)TD_MIN(left, (int64_t)sizeof buf));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = td_error(TD_ERR_IO, "%s changed while it was sent", path);
            break;
        }
        st = write_full(c->fd, buf, (size_t)r);
        left -= r;
    }
    close(fd);
    return st;
}

/* The opening: our manifest, the code when asked, for node 0 the newest checkpoint we hold (a
 * requeued job's first node may be another machine) and the artifact patterns, go. */
static td_status send_opening(td__links *l, conn *c, int first) {
    char *manifest = td_mirror_in_manifest(c->in);
    td_status st = write_full(c->fd, manifest, strlen(manifest));
    free(manifest);
    if (st == TD_OK && first) st = send_blob(c, "code", l->code_path);
    if (st == TD_OK && first && c->node == 0 && l->ckpt_rel) {
        size_t n;
        long long *steps = ckpt_steps(l, &n);
        if (n) {
            char head[64];
            snprintf(head, sizeof head, "ckpt ckpt-%lld.tdck", steps[0]);
            char *path =
                td_xasprintf("%s/%s/ckpt-%lld.tdck", l->job->run->run_dir, l->ckpt_rel, steps[0]);
            st = send_blob(c, head, path);
            free(path);
        }
        free(steps);
    }
    for (size_t i = 0; st == TD_OK && c->node == 0 && i < l->job->nartifacts; i++) {
        char *line = td_xasprintf("artifact %s\n", l->job->artifacts[i]);
        st = write_full(c->fd, line, strlen(line));
        free(line);
    }
    if (st == TD_OK) st = write_full(c->fd, "go\n", 3);
    return st;
}

static void accept_one(td__links *l) {
    int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    if (l->nconns == MAX_CONNS) {
        close(fd);
        return;
    }
    int node = -1, first = 0;
    td_status st = td_mirror_auth_accept(fd, l->token, HANDSHAKE_MS);
    if (st == TD_OK) st = read_hello(fd, l->job->run->nodes, &node, &first);
    conn *c = &l->conns[l->nconns];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->node = node;
    if (st == TD_OK) {
        static const char *const prefixes[] = {"logs", "metrics", "work", "checkpoints"};
        td_mirror_callbacks cb = {.data = on_data, .file = on_file, .user = l};
        c->in = td_mirror_in_new(l->job->run->run_dir, prefixes, TD_ARRAY_LEN(prefixes), &cb);
        st = send_opening(l, c, first);
    }
    if (st != TD_OK) {
        TD_LOG_WARN("a connection to the run's link port was refused: %s", td_error_msg());
        td_error_clear();
        td_mirror_in_free(c->in);
        close(fd);
        return;
    }
    l->nconns++;
    if (!l->seen[node]) {
        l->seen[node] = 1;
        l->nseen++;
    }
}

static void read_conn(td__links *l, size_t i) {
    conn *c = &l->conns[i];
    char buf[65536];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
        conn_close(l, i, n == 0 ? "it hung up" : strerror(errno));
        return;
    }
    if (td_mirror_in_feed(c->in, buf, (size_t)n) != TD_OK) {
        TD_LOG_WARN("node %d's link: %s; closing it", c->node, td_error_msg());
        td_error_clear();
        conn_close(l, i, NULL);
        return;
    }
    c->ended = td_mirror_in_ended(c->in);
}

void td__links_pump(td__links *l, int extra_fd, int timeout_ms) {
    struct pollfd pf[MAX_CONNS + 2];
    size_t n = 0;
    pf[n++] = (struct pollfd){.fd = extra_fd, .events = POLLIN};
    pf[n++] = (struct pollfd){.fd = l->listen_fd, .events = POLLIN};
    size_t nc = l->nconns;
    for (size_t i = 0; i < nc; i++)
        pf[n++] = (struct pollfd){.fd = l->conns[i].fd, .events = POLLIN};
    if (poll(pf, n, timeout_ms) <= 0) return;
    /* From the end: closing swaps the last connection into the closed one's place. */
    for (size_t i = nc; i-- > 0;)
        if (pf[2 + i].revents) read_conn(l, i);
    if (pf[1].revents & POLLIN) accept_one(l);
}

void td__links_drain(td__links *l, double seconds) {
    double until = td_now_s() + seconds;
    for (;;) {
        int open_ones = 0;
        for (size_t i = 0; i < l->nconns; i++) open_ones += !l->conns[i].ended;
        if (!open_ones || td_now_s() >= until) break;
        td__links_pump(l, -1, 100);
    }
    for (int i = 0; i < l->job->run->nodes; i++)
        if (l->node_lines[i].line.len) {
            td__buf_add(&l->node_lines[i].line, "\n", 1);
            node_line(l, &l->node_lines[i]);
        }
}

void td__links_free(td__links *l) {
    if (!l) return;
    while (l->nconns) conn_close(l, l->nconns - 1, NULL);
    if (l->listen_fd >= 0) close(l->listen_fd);
    if (l->node_lines)
        for (int i = 0; i < l->job->run->nodes; i++) free(l->node_lines[i].line.s);
    free(l->node_lines);
    free(l->seen);
    free(l->code_path);
    free(l->ckpt_rel);
    free(l);
}
