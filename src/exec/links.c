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
 * drops is dialled again by the agent; a requeued job's agents connect anew.
 *
 * The links live on the supervisor's event loop (td__links_attach): the listening socket and
 * every connection are watched descriptors; a tick checks the deadlines. No peer can hold the
 * supervisor up: the port is open to anyone who can reach it, so nothing here waits for a
 * peer. A connection's handshake (the token's challenge-response, mirror.h's exchange in steps,
 * td_mirror_auth_step, then the hello) goes as far as its socket allows at each turn, and is
 * refused at its deadline, while the loop serves everyone else; the opening is sent the same
 * way, as the connection takes it. Connections still in the handshake are bounded, and when the
 * slots are full the oldest one that has had a tenth of its deadline is cut short. So a run's
 * agents join however many strangers connect and say nothing. (No thread: the handshake used
 * to be mirror.c's blocking call on a thread per connection; thousands of strangers would be
 * thousands of threads, or, on the loop's few work threads (td_loop_queue_work), a handful of
 * silent ones would keep the run's agents waiting for a thread.) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/internal.h"
#include "tandem/ckpt.h"
#include "tandem/loop.h"
#include "tandem/mirror.h"

/* A peer that connects must prove the token and greet within this (the agent's own limit is
 * twice that); a slow or foreign one is then closed, and never holds up anyone else. */
#define HANDSHAKE_MS 5000
/* An agent that passed the handshake must take the opening (the code may be megabytes) within
 * this: the agent waits as long for it (agent_link.c, OPENING_TIMEOUT_MS). */
#define OPENING_MS 120000
#define MAX_CONNS  1024
/* Connections in the handshake (a few hundred bytes of state each): a job's connect storm
 * fits, as in the rendezvous store's server (comm/store_server.c). */
#define MAX_PENDING 256
/* The listen queue: a job's nodes connect at once (the kernel holds them until accepted). */
#define BACKLOG 512
/* Refused connections: the first few are said one by one, then summed up this often. */
#define REFUSED_SAID     5
#define REFUSED_PERIOD_S 30.0
/* The deadlines (an opening's, the handshake slots', refusals' sums) are looked at this often. */
#define TICK_S 0.1

typedef enum {
    C_HANDSHAKE, /* it proves the token (td_mirror_auth_step) and says its hello */
    C_OPENING,   /* we send the manifest, code, checkpoint, artifacts and go */
    C_LIVE,      /* its mirror stream arrives */
} conn_state;

/* One piece of the opening: bytes of ours, or a file's bytes [off, end) sent from its fd. */
typedef struct {
    char *bytes;
    size_t len;
    int fd; /* -1: bytes */
    off_t off, end;
    char *path; /* for a message when the file changes under us */
} piece;

typedef struct {
    int fd;
    conn_state state;
    char peer[80];        /* "10.0.0.5:41234", for messages */
    uint64_t since_ns;    /* accepted */
    uint64_t deadline_ns; /* of the opening */
    /* the handshake: the token's exchange until it is done (then NULL), then the hello's bytes */
    bool pending; /* counted in npending */
    td_mirror_auth *auth;
    unsigned wants; /* what the handshake waits for: TD_LOOP_READ or TD_LOOP_WRITE */
    char hello[64];
    size_t hello_len;
    piece *pieces;
    size_t npieces, next;
    int node; /* -1 before "hello" */
    td_mirror_in *in;
    int ended; /* "tdm end": everything of this agent arrived */
} conn;

/* The lines of one node's logs/node-N.log as they arrive, to our stderr. Nothing is parsed from
 * them: how a node's agent ended arrives as its end record (end/node-N.json). */
typedef struct {
    td__buf line;
} node_echo;

struct td__links {
    const td_exec_job *job;
    int listen_fd, port;
    td_loop *loop; /* the supervisor's, once attached */
    uint64_t tick;
    int listen_watched;
    char endpoint[300];
    char token[33];
    char *code_path; /* RUN/code.tar */
    conn conns[MAX_CONNS];
    size_t nconns, npending;
    unsigned char *seen; /* per node: connected at least once */
    int nseen;
    int refused;        /* connections closed before they joined */
    int refused_unsaid; /* ... of which not said yet */
    char last_refused[600];
    uint64_t refused_said_ns;
    int queue_full;            /* connections wait in the listen queue, the slots are full */
    uint64_t accept_resume_ns; /* out of descriptors: accept again then */
    td__echo echo;
    node_echo *node_lines;
    /* The run's checkpoint directory below RUN (TANDEM_CHECKPOINT_DIR), as node 0 names what it
     * sends; NULL when it lies elsewhere (then checkpoints do not travel). */
    char *ckpt_rel;
};

/* Checkpoints kept in the supervisor's copy: the newest is what a new node 0 gets; one more in
 * case the newest was cut short when its node died (the sender renames whole files only, so
 * this is belt and braces). */
#define CKPT_KEEP 2

/* The checkpoints that travel over the links (tandem/ckpt.h): every kind; a directory (HF's
 * checkpoint-N/) file by file, its framework's marker last, so that it counts here only once
 * whole. */
#define CKPT_LINK_KINDS TD_CKPT_ANY

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    (void)remove(path);
    return 0;
}

/* The committed checkpoints of RUN/ckpt_rel, newest first; *n of them. */
static td_ckpt_entry *ckpt_list(const td__links *l, int *n) {
    char *dir = td_xasprintf("%s/%s", l->job->run->run_dir, l->ckpt_rel);
    td_ckpt_entry *v = td_ckpt_list(dir, CKPT_LINK_KINDS, n);
    free(dir);
    return v;
}

/* A whole file arrived: a checkpoint replaces all but the newest CKPT_KEEP (with a step). */
static void on_file(void *user, const char *name, int64_t size) {
    td__links *l = user;
    (void)size;
    td__exec_record_arrived(l->job->run, name); /* the script's sdk.json, into place */
    size_t rlen = l->ckpt_rel ? strlen(l->ckpt_rel) : 0;
    if (!rlen || strncmp(name, l->ckpt_rel, rlen) || name[rlen] != '/') return;
    int n;
    td_ckpt_entry *v = ckpt_list(l, &n);
    for (int i = CKPT_KEEP; i < n; i++) {
        if (v[i].n.step < 0) continue;
        char *old = td_xasprintf("%s/%s/%s", l->job->run->run_dir, l->ckpt_rel, v[i].name);
        if (v[i].n.is_dir)
            (void)nftw(old, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        else
            unlink(old);
        free(old);
    }
    td_ckpt_list_free(v, n);
}

static void node_line(td__links *l, node_echo *e) {
    (void)l;
    td__exec_write_all(STDERR_FILENO, e->line.s, e->line.len);
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

static void set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
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
    l->code_path = td_run_path(job->run->run_dir, TD_RUN_PATH_CODE_TAR);
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
    if (st == TD_OK) st = td_listen_tcp(NULL, 0, BACKLOG, &l->listen_fd, &l->port);
    if (st != TD_OK) {
        td__links_free(l);
        return st;
    }
    set_nonblocking(l->listen_fd); /* accept until the queue is empty, never wait in accept */
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

int td__links_refused(const td__links *l) {
    return l->refused;
}

/* ---- refusals: each counted, the first few said, then a sum now and then ---- */
static void refusals_say(td__links *l) {
    if (!l->refused_unsaid) return;
    TD_LOG_WARN("refused %d more connection%s to the run's link port (%s) in the last %.0f s; "
                "the last %s",
                l->refused_unsaid, l->refused_unsaid == 1 ? "" : "s", l->endpoint,
                (double)(td_now_ns() - l->refused_said_ns) * 1e-9, l->last_refused);
    l->refused_unsaid = 0;
    l->refused_said_ns = td_now_ns();
}

static void refused(td__links *l, const char *peer, const char *why) {
    l->refused++;
    snprintf(l->last_refused, sizeof l->last_refused, "from %s: %s", peer, why);
    if (l->refused <= REFUSED_SAID) {
        TD_LOG_WARN("refused a connection to the run's link port from %s: %s%s", peer, why,
                    l->refused == REFUSED_SAID
                        ? " (more refusals are counted and summed up every 30 s)"
                        : "");
        l->refused_said_ns = td_now_ns();
    } else {
        l->refused_unsaid++;
    }
}

/* ---- the handshake, on the loop: the token's exchange, then the hello ---- */
/* "hello NODE FIRST" read so far, a byte at a time (nothing after its newline is the
 * handshake's: the agent waits for our opening). 1: the line is whole (*node, *first); 0: more
 * later; -1: refused (the error set). */
static int read_hello(conn *c, int nodes, int *node, int *first) {
    for (;;) {
        char ch;
        ssize_t r = recv(c->fd, &ch, 1, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (r < 0) {
            td_error_errno(TD_ERR_IO, "link: reading a node's hello");
            return -1;
        }
        if (r == 0) {
            td_error(TD_ERR_IO, "link: the connection closed while waiting for a node's hello");
            return -1;
        }
        if (ch != '\n') {
            if (c->hello_len + 1 >= sizeof c->hello) {
                char quoted[96];
                td_escape_text(quoted, sizeof quoted, c->hello, c->hello_len);
                td_error(TD_ERR_PROTOCOL, "a node's link said '%s...', not hello NODE 0|1",
                         quoted);
                return -1;
            }
            c->hello[c->hello_len++] = ch;
            continue;
        }
        c->hello[c->hello_len] = '\0';
        char end;
        if (sscanf(c->hello, "hello %d %d%c", node, first, &end) != 2 || *node < 0 ||
            *node >= nodes || (*first != 0 && *first != 1)) {
            td_error(TD_ERR_PROTOCOL,
                     "a node's link said '%.40s', not hello NODE 0|1 with a node below %d",
                     c->hello, nodes);
            return -1;
        }
        return 1;
    }
}

static void conn_free_pieces(conn *c) {
    for (size_t i = 0; i < c->npieces; i++) {
        free(c->pieces[i].bytes);
        free(c->pieces[i].path);
        if (c->pieces[i].fd >= 0) close(c->pieces[i].fd);
    }
    free(c->pieces);
    c->pieces = NULL;
    c->npieces = c->next = 0;
}

/* A connection leaves the handshake (passed, refused or closed): its slot frees. */
static void handshake_end(td__links *l, conn *c) {
    td_mirror_auth_free(c->auth);
    c->auth = NULL;
    if (c->pending) l->npending--;
    c->pending = false;
}

/* What the loop watches a connection for: what its handshake waits for, its opening's room and
 * its bytes while the opening goes out, its bytes once it joined. */
static void conn_watch(td__links *l, conn *c);
static void listen_update(td__links *l);

static void conn_close(td__links *l, size_t i, const char *why) {
    conn *c = &l->conns[i];
    if (l->loop) td_loop_unwatch(l->loop, c->fd);
    handshake_end(l, c);
    if (why && c->node >= 0 && !c->ended)
        TD_LOG_WARN("the link of node %d closed (%s); its agent dials again while it runs", c->node,
                    why);
    close(c->fd);
    conn_free_pieces(c);
    td_mirror_in_free(c->in);
    l->conns[i] = l->conns[--l->nconns];
    listen_update(l); /* a slot is free */
}

/* ---- the opening, sent from the loop as the connection takes it ---- */
static void add_bytes(conn *c, char *bytes) {
    c->pieces = td_xrealloc(c->pieces, (c->npieces + 1) * sizeof *c->pieces);
    c->pieces[c->npieces++] = (piece){.bytes = bytes, .len = strlen(bytes), .fd = -1};
}

/* "HEAD SIZE\n" and the file's bytes (the code, a checkpoint), from a descriptor opened now: a
 * checkpoint replaced meanwhile is still sent whole. */
static td_status add_blob(conn *c, const char *head, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        td_status st = td_error_errno(TD_ERR_IO, "opening %s", path);
        if (fd >= 0) close(fd);
        return st;
    }
    add_bytes(c, td_xasprintf("%s %lld\n", head, (long long)sb.st_size));
    c->pieces = td_xrealloc(c->pieces, (c->npieces + 1) * sizeof *c->pieces);
    c->pieces[c->npieces++] =
        (piece){.fd = fd, .off = 0, .end = sb.st_size, .path = td_xstrdup(path)};
    return TD_OK;
}

/* The opening: our manifest, the code when asked, for node 0 the newest checkpoint we hold (a
 * requeued job's first node may be another machine) and the artifact patterns, go. */
static td_status build_opening(td__links *l, conn *c, int first) {
    add_bytes(c, td_mirror_in_manifest(c->in));
    td_status st = first ? add_blob(c, "code", l->code_path) : TD_OK;
    if (st == TD_OK && first && c->node == 0 && l->ckpt_rel) {
        int n;
        td_ckpt_entry *v = ckpt_list(l, &n);
        if (n && v[0].n.step >= 0) {
            /* a directory: "ckpt ENTRY/REL SIZE" per file, then "ckpt-commit ENTRY" */
            char *dir = td_xasprintf("%s/%s", l->job->run->run_dir, l->ckpt_rel);
            int nfiles = 1;
            char **files = v[0].n.is_dir ? td_ckpt_dir_files(dir, v[0].name, &nfiles) : NULL;
            for (int i = 0; st == TD_OK && i < nfiles; i++) {
                const char *rel = files ? files[i] : v[0].name;
                char *head = td_xasprintf("ckpt %s", rel);
                char *path = td_xasprintf("%s/%s", dir, rel);
                st = add_blob(c, head, path);
                free(path);
                free(head);
            }
            if (st == TD_OK && files) add_bytes(c, td_xasprintf("ckpt-commit %s\n", v[0].name));
            td_ckpt_files_free(files, files ? nfiles : 0);
            free(dir);
        }
        td_ckpt_list_free(v, n);
    }
    for (size_t i = 0; st == TD_OK && c->node == 0 && i < l->job->nartifacts; i++)
        add_bytes(c, td_xasprintf("artifact %s\n", l->job->artifacts[i]));
    /* node 0 holds rank 0, which writes the script's record (sdk.json, artifacts/) */
    if (st == TD_OK && c->node == 0) add_bytes(c, td_xstrdup("record\n"));
    if (st == TD_OK) add_bytes(c, td_xstrdup("go\n"));
    return st;
}

/* Sends what the connection takes now. 1: all of it went; 0: more later; -1: failed (the
 * error set). */
static int flush_opening(conn *c) {
    while (c->next < c->npieces) {
        piece *p = &c->pieces[c->next];
        if (p->fd < 0 ? (size_t)p->off == p->len : p->off == p->end) {
            c->next++;
            continue;
        }
        ssize_t w;
        if (p->fd < 0) {
            w = send(c->fd, p->bytes + p->off, p->len - (size_t)p->off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
        } else {
            w = sendfile(c->fd, p->fd, &p->off, (size_t)TD_MIN(p->end - p->off, (off_t)1 << 20));
            if (w == 0) {
                td_error(TD_ERR_IO, "%s changed while it was sent", p->path);
                return -1;
            }
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (w < 0) {
            td_error_errno(TD_ERR_IO, "writing to a node's link");
            return -1;
        }
        if (p->fd < 0) p->off += w; /* sendfile moved a file's offset itself */
    }
    return 1;
}

/* The opening went out: the node has joined. */
static void joined(td__links *l, conn *c) {
    conn_free_pieces(c);
    c->state = C_LIVE;
    c->deadline_ns = 0;
    conn_watch(l, c);
    if (!l->seen[c->node]) {
        l->seen[c->node] = 1;
        l->nseen++;
    }
}

/* Sends what it can of a connection's opening; closes it when that fails or its time is up.
 * Returns 0 when it was closed. */
static int progress_opening(td__links *l, size_t i, uint64_t now) {
    conn *c = &l->conns[i];
    int r = flush_opening(c);
    if (r > 0) {
        joined(l, c);
        return 1;
    }
    char why[700];
    if (r < 0) {
        snprintf(why, sizeof why, "sending the opening: %s", td_error_msg());
        td_error_clear();
    } else if (now >= c->deadline_ns) {
        snprintf(why, sizeof why, "it took no opening (%zu of %zu pieces sent) in %d s", c->next,
                 c->npieces, OPENING_MS / 1000);
    } else {
        return 1;
    }
    TD_LOG_WARN("node %d's link from %s: %s; closing it", c->node, c->peer, why);
    conn_close(l, i, NULL);
    return 0;
}

/* The handshake passed: the connection sends its opening. */
static void handshake_done(td__links *l, size_t i, int node, int first) {
    conn *c = &l->conns[i];
    handshake_end(l, c);
    c->node = node;
    c->state = C_OPENING;
    conn_watch(l, c);
    c->deadline_ns = td_now_ns() + (uint64_t)OPENING_MS * 1000000;
    const char *const prefixes[] = {
        td_run_path_name(TD_RUN_PATH_LOGS), td_run_path_name(TD_RUN_PATH_METRICS),
        td_run_path_name(TD_RUN_PATH_WORK), td_run_path_name(TD_RUN_PATH_CHECKPOINTS),
        td_run_path_name(TD_RUN_PATH_END), TD__EXEC_RECORD_PREFIXES};
    td_mirror_callbacks cb = {.data = on_data, .file = on_file, .user = l};
    c->in = td_mirror_in_new(l->job->run->run_dir, prefixes, TD_ARRAY_LEN(prefixes), &cb);
    if (build_opening(l, c, first) != TD_OK) {
        TD_LOG_WARN("node %d's link from %s: %s; closing it", node, c->peer, td_error_msg());
        td_error_clear();
        conn_close(l, i, NULL);
        return;
    }
    progress_opening(l, i, td_now_ns());
}

/* A connection's handshake failed (the error set, or why): refused and closed. */
static void handshake_refused(td__links *l, size_t i, const char *why) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s", why ? why : td_error_msg());
    td_error_clear();
    refused(l, l->conns[i].peer, msg);
    conn_close(l, i, NULL);
}

/* The handshake slots are full: cuts short the oldest handshake if it has had a tenth of its
 * deadline (a real agent needs one round trip), so strangers that connect and say nothing
 * cannot keep the run's agents out. Returns whether one was cut (its slot is free). */
static int cut_oldest(td__links *l, uint64_t now) {
    size_t oldest = SIZE_MAX;
    for (size_t i = 0; i < l->nconns; i++)
        if (l->conns[i].state == C_HANDSHAKE &&
            (oldest == SIZE_MAX || l->conns[i].since_ns < l->conns[oldest].since_ns))
            oldest = i;
    if (oldest == SIZE_MAX || now < l->conns[oldest].since_ns + (uint64_t)HANDSHAKE_MS * 100000)
        return 0;
    handshake_refused(l, oldest,
                      "the oldest of the connections still in the handshake when the slots were "
                      "full; cut short");
    return 1;
}

/* Takes the handshake as far as the connection allows now: the token's exchange, then the
 * hello; then the opening. A handshake that fails closes the connection (refused). */
static void handshake_progress(td__links *l, size_t i) {
    conn *c = &l->conns[i];
    if (c->auth) {
        unsigned wants = 0;
        if (td_mirror_auth_step(c->auth, &wants) != TD_OK) {
            handshake_refused(l, i, NULL);
            return;
        }
        if (wants) {
            c->wants = wants;
            conn_watch(l, c);
            return;
        }
        td_mirror_auth_free(c->auth); /* the peer knows the token */
        c->auth = NULL;
    }
    int node = -1, first = 0;
    int r = read_hello(c, l->job->run->nodes, &node, &first);
    if (r < 0) {
        handshake_refused(l, i, NULL);
        return;
    }
    if (r == 0) {
        c->wants = TD_LOOP_READ;
        conn_watch(l, c);
        return;
    }
    handshake_done(l, i, node, first);
}

/* A handshake past its deadline: refused, naming what it did not say. */
static void handshake_late(td__links *l, size_t i) {
    const conn *c = &l->conns[i];
    char why[300];
    snprintf(why, sizeof why,
             "link: %s did not come within %d ms of the connection (is the other end a tandem "
             "of this version, and not stalled?)",
             c->auth ? td_mirror_auth_waiting_for(c->auth) : "a node's hello", HANDSHAKE_MS);
    handshake_refused(l, i, why);
}

static void peer_name(int fd, char *out, size_t nbytes) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    char raw[sizeof host + sizeof serv + 2];
    snprintf(raw, sizeof raw, "%s:%s", host, serv);
    td_escape_text(out, nbytes, raw, strlen(raw));
}

/* Starts a connection's handshake: our challenge, sent when the socket takes it. */
static int handshake_start(td__links *l, conn *c) {
    if (td_mirror_auth_begin(&c->auth, c->fd, l->token, TD_MIRROR_AUTH_ACCEPT) != TD_OK) {
        char why[500];
        snprintf(why, sizeof why, "no handshake: %s", td_error_msg());
        td_error_clear();
        refused(l, c->peer, why);
        return -1;
    }
    c->pending = true;
    l->npending++;
    return 0;
}

/* Takes the connections waiting in the listen queue while there are slots for them. With the
 * slots full, those waiting stay in the queue (the listening socket is not polled meanwhile) and
 * the oldest handshake is cut short once it may be. */
static void accept_all(td__links *l, bool readable) {
    for (;;) {
        if (l->nconns == MAX_CONNS || l->npending >= MAX_PENDING) {
            if (readable) l->queue_full = 1;
            if (l->queue_full) cut_oldest(l, td_now_ns());
            listen_update(l);
            return;
        }
        l->queue_full = 0;
        int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && (errno == EINTR || errno == ECONNABORTED)) continue;
        if (fd < 0) {
            /* Out of descriptors (or memory): the connection stays queued and the socket
             * readable, so it is not polled for a while instead of spinning. */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (!l->accept_resume_ns)
                    TD_LOG_WARN("links: cannot accept connections on %s (%s, %zu open); retrying "
                                "every 100 ms",
                                l->endpoint, strerror(errno), l->nconns);
                l->accept_resume_ns = td_now_ns() + 100000000ull;
            } else {
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    TD_LOG_WARN("links: cannot accept a connection on %s: %s", l->endpoint,
                                strerror(errno));
                l->accept_resume_ns = 0;
            }
            listen_update(l);
            return;
        }
        l->accept_resume_ns = 0;
        conn *c = &l->conns[l->nconns];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->node = -1;
        c->state = C_HANDSHAKE;
        c->since_ns = td_now_ns();
        peer_name(fd, c->peer, sizeof c->peer);
        if (handshake_start(l, c) != 0) {
            close(fd);
            continue;
        }
        l->nconns++;
        handshake_progress(l, l->nconns - 1); /* the challenge goes out now */
    }
}

static void read_conn(td__links *l, size_t i) {
    conn *c = &l->conns[i];
    char buf[65536];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
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

/* ---- on the loop ---- */
static void on_listen(td_loop *loop, int fd, unsigned events, void *user);

/* The listening socket is watched unless accepting is paused: out of descriptors until
 * accept_resume_ns, or the slots full with connections known to wait in the queue (it stays
 * readable; a slot that frees, or the tick, takes them). */
static void listen_update(td__links *l) {
    if (!l->loop || l->listen_fd < 0) return;
    bool full = l->nconns == MAX_CONNS || l->npending >= MAX_PENDING;
    if (!full) l->queue_full = 0;
    bool want = !(l->accept_resume_ns && td_now_ns() < l->accept_resume_ns) && !l->queue_full;
    if (want == (bool)l->listen_watched) return;
    l->listen_watched = want;
    if (!want) {
        td_loop_unwatch(l->loop, l->listen_fd);
        return;
    }
    if (td_loop_watch(l->loop, l->listen_fd, TD_LOOP_READ, on_listen, l) != TD_OK) {
        TD_LOG_WARN("links: %s (the tick accepts instead)", td_error_msg());
        td_error_clear();
        l->listen_watched = 0;
    }
}

static void on_conn(td_loop *loop, int fd, unsigned events, void *user);

static void conn_watch(td__links *l, conn *c) {
    if (!l->loop) return;
    unsigned ev = c->state == C_OPENING ? TD_LOOP_READ | TD_LOOP_WRITE
                  : c->state == C_LIVE  ? TD_LOOP_READ
                                        : c->wants;
    td_status st = ev ? td_loop_watch(l->loop, c->fd, ev, on_conn, l) : TD_OK;
    if (!ev) td_loop_unwatch(l->loop, c->fd);
    if (st != TD_OK) { /* unwatched, it would hang: the agent dials again */
        TD_LOG_WARN("node %d's link: %s; closing it", c->node, td_error_msg());
        td_error_clear();
        shutdown(c->fd, SHUT_RDWR);
    }
}

static void on_listen(td_loop *loop, int fd, unsigned events, void *user) {
    (void)loop, (void)fd, (void)events;
    accept_all(user, true);
}

static void on_conn(td_loop *loop, int fd, unsigned events, void *user) {
    (void)loop;
    td__links *l = user;
    for (size_t i = 0; i < l->nconns; i++) {
        conn *c = &l->conns[i];
        if (c->fd != fd) continue;
        if (c->state == C_HANDSHAKE) {
            handshake_progress(l, i);
        } else if (c->state == C_OPENING) {
            size_t before = l->nconns;
            if (events & TD_LOOP_READ) read_conn(l, i);
            if (l->nconns == before) progress_opening(l, i, td_now_ns());
        } else if (c->state == C_LIVE) {
            read_conn(l, i);
        }
        return;
    }
}

/* The deadlines: handshakes and openings not done in time, the oldest handshake when the
 * slots are full, accepting again after running out of descriptors, the refusals' sum. */
static void on_tick(td_loop *loop, void *user) {
    (void)loop;
    td__links *l = user;
    uint64_t now = td_now_ns();
    /* From the end: closing swaps the last connection into the closed one's place. */
    for (size_t i = l->nconns; i-- > 0;)
        if (l->conns[i].state == C_OPENING && now >= l->conns[i].deadline_ns)
            progress_opening(l, i, now);
        else if (l->conns[i].state == C_HANDSHAKE &&
                 now >= l->conns[i].since_ns + (uint64_t)HANDSHAKE_MS * 1000000)
            handshake_late(l, i);
    if (l->queue_full || (l->accept_resume_ns && now >= l->accept_resume_ns)) {
        if (l->accept_resume_ns && now >= l->accept_resume_ns) l->accept_resume_ns = 0;
        accept_all(l, false);
    }
    if (l->refused_unsaid && now >= l->refused_said_ns + (uint64_t)(REFUSED_PERIOD_S * 1e9))
        refusals_say(l);
    listen_update(l);
}

td_status td__links_attach(td__links *l, td_loop *loop) {
    td__links_detach(l);
    l->loop = loop;
    l->tick = td_loop_timer(loop, TICK_S, TICK_S, on_tick, l);
    for (size_t i = 0; i < l->nconns; i++) conn_watch(l, &l->conns[i]);
    listen_update(l);
    return TD_OK;
}

void td__links_detach(td__links *l) {
    if (!l->loop) return;
    if (l->listen_watched) td_loop_unwatch(l->loop, l->listen_fd);
    l->listen_watched = 0;
    for (size_t i = 0; i < l->nconns; i++) td_loop_unwatch(l->loop, l->conns[i].fd);
    td_loop_cancel(l->loop, l->tick);
    l->tick = 0;
    l->loop = NULL;
}

int td__links_open_count(const td__links *l) {
    /* A node's connection (past its hello) that has not said its end; a stranger still in the
     * handshake carries nothing of the run and is not waited for. */
    int open_ones = 0;
    for (size_t i = 0; i < l->nconns; i++) open_ones += l->conns[i].node >= 0 && !l->conns[i].ended;
    return open_ones;
}

void td__links_flush_lines(td__links *l) {
    for (int i = 0; i < l->job->run->nodes; i++)
        if (l->node_lines[i].line.len) {
            td__buf_add(&l->node_lines[i].line, "\n", 1);
            node_line(l, &l->node_lines[i]);
        }
}

void td__links_free(td__links *l) {
    if (!l) return;
    td__links_detach(l);
    while (l->nconns) conn_close(l, l->nconns - 1, NULL);
    refusals_say(l);
    if (l->listen_fd >= 0) close(l->listen_fd);
    if (l->node_lines)
        for (int i = 0; i < l->job->run->nodes; i++) free(l->node_lines[i].line.s);
    free(l->node_lines);
    free(l->seen);
    free(l->code_path);
    free(l->ckpt_rel);
    free(l);
}
