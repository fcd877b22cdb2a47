/* Node 0 hands the checkpoint every rank resumes from to the other nodes, through the
 * rendezvous store, before any worker starts (launch.c decide_resume).
 *
 * Why this way: Lightning's ckpt_path and the HF Trainer's resume_from_checkpoint make every
 * rank read the checkpoint from its own disk, but only rank 0 (node 0) writes one. Without a
 * shared disk or an S3 checkpoint_dir the other nodes lack it (on ssh, Slurm and aws alike, a
 * fresh or replacement node most of all). Node 0's agent already decides the step and
 * publishes it through the store, every agent already holds an authenticated connection to
 * it, and the store's port is the one port every node is known to reach; so the bytes take the
 * same road, in chunks: no new port, no new secret, the same for every executor. The store
 * bounds a value (16 MiB) and all of its values together (64 MiB), so node 0 keeps at most
 * WINDOW chunks of CHUNK_BYTES in it at once and deletes each chunk once every node that needs
 * it has taken it: a checkpoint of any size passes.
 *
 * Keys, under the attempt's namespace (beside rdzv.c's):
 *   ckpt/offer          node 0, before resume_step: the files of the step's committed
 *                       checkpoints (OFFER_MAGIC, see build_offer), or no files
 *   ckpt/need/<node>    every other node: "1" it lacks one of them, "0" it holds them all
 *   ckpt/chunk/<k>      node 0: bytes [k*CHUNK_BYTES, ...) of the offered files, in order
 *   ckpt/got/<k>/<node> a node that needs them wrote chunk k
 *
 * The receiving side writes each checkpoint aside (a name beginning with '.', never a
 * checkpoint: tandem/ckpt.h) and renames it into place once whole, a directory with tandem's
 * commit marker written last: a transfer cut short leaves nothing that counts. */
#include "launch_internal.h"

#include "tandem/ckpt.h"
#include "tandem/loop.h"
#include "tandem/os.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OFFER_MAGIC "tandem-ckpt-offer 1"
#define CHUNK_BYTES ((size_t)4 << 20)
#define WINDOW      4
/* A store wait is cut into slices this long, to look at the signalfd between them. */
#define SLICE_MS 200

typedef struct {
    char *name;  /* below the checkpoint directory: ENTRY or ENTRY/REL */
    char *entry; /* the checkpoint it belongs to (a td_ckpt_parse name) */
    int64_t nbytes;
} offered_file;

typedef struct {
    offered_file *f;
    int n, cap;
    int64_t total;
} offer;

static void offer_free(offer *o) {
    for (int i = 0; i < o->n; i++) {
        free(o->f[i].name);
        free(o->f[i].entry);
    }
    free(o->f);
    memset(o, 0, sizeof *o);
}

static void offer_add(offer *o, const char *name, const char *entry, int64_t nbytes) {
    if (o->n == o->cap) o->f = td_xrealloc(o->f, (size_t)(o->cap = o->cap ? 2 * o->cap : 16) *
                                                     sizeof *o->f);
    o->f[o->n++] = (offered_file){td_xstrdup(name), td_xstrdup(entry), nbytes};
    o->total += nbytes;
}

/* The committed checkpoints of step in dir, any kind (a step may have several: the SDK's and
 * tandem train's, say); those without a step (Lightning's last.ckpt) are not what a step names. */
static void build_offer(offer *o, const char *dir, int64_t step) {
    int n;
    td_ckpt_entry *v = td_ckpt_list(dir, TD_CKPT_ANY, &n);
    for (int i = 0; i < n; i++) {
        if (v[i].n.step != step) continue;
        if (v[i].n.is_dir) {
            int nf;
            char **files = td_ckpt_dir_files(dir, v[i].name, &nf);
            for (int f = 0; f < nf; f++) {
                char *full = td_xasprintf("%s/%s", dir, files[f]);
                struct stat sb;
                if (lstat(full, &sb) == 0 && S_ISREG(sb.st_mode))
                    offer_add(o, files[f], v[i].name, (int64_t)sb.st_size);
                free(full);
            }
            td_ckpt_files_free(files, nf);
        } else {
            char *full = td_xasprintf("%s/%s", dir, v[i].name);
            struct stat sb;
            if (lstat(full, &sb) == 0 && S_ISREG(sb.st_mode))
                offer_add(o, v[i].name, v[i].name, (int64_t)sb.st_size);
            free(full);
        }
    }
    td_ckpt_list_free(v, n);
}

/* The offer as a store value: OFFER_MAGIC NFILES TOTAL CHUNK_BYTES, then per file
 * "NBYTES NAMELEN NAME" (a name may hold any byte but NUL: its length frames it). */
static char *offer_text(const offer *o, size_t *len) {
    size_t cap = 128;
    for (int i = 0; i < o->n; i++) cap += strlen(o->f[i].name) + 48;
    char *s = td_xmalloc(cap);
    size_t at = (size_t)snprintf(s, cap, "%s %d %lld %zu\n", OFFER_MAGIC, o->n,
                                 (long long)o->total, CHUNK_BYTES);
    for (int i = 0; i < o->n; i++)
        at += (size_t)snprintf(s + at, cap - at, "%lld %zu %s\n", (long long)o->f[i].nbytes,
                               strlen(o->f[i].name), o->f[i].name);
    *len = at;
    return s;
}

/* A name the receiver will write: relative, no empty, "." or ".." component. */
static bool safe_name(const char *name) {
    if (!name[0] || name[0] == '/') return false;
    for (const char *p = name;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (!n || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return false;
        if (!slash) return true;
        p = slash + 1;
    }
}

static td_status parse_offer(const char *s, size_t len, int64_t step, offer *o, size_t *chunk) {
    char magic[32];
    int nfiles = -1, used = 0;
    long long total = -1;
    size_t cb = 0;
    memset(o, 0, sizeof *o);
    if (sscanf(s, "%19s %*d %d %lld %zu%n", magic, &nfiles, &total, &cb, &used) != 4 ||
        strncmp(s, OFFER_MAGIC, strlen(OFFER_MAGIC)) || nfiles < 0 || total < 0 || !cb ||
        cb > ((size_t)16 << 20))
        goto bad;
    (void)magic;
    const char *p = s + used, *end = s + len;
    if (p < end && *p == '\n') p++;
    for (int i = 0; i < nfiles; i++) {
        long long nb;
        size_t nl;
        int k = 0;
        if (sscanf(p, "%lld %zu%n", &nb, &nl, &k) != 2 || nb < 0 || p[k] != ' ' ||
            (size_t)(end - p) < (size_t)k + 1 + nl + 1)
            goto bad;
        k++;
        char *name = td_xstrndup(p + k, nl);
        p += (size_t)k + nl;
        if (*p++ != '\n' || strlen(name) != nl || !safe_name(name)) {
            free(name);
            goto bad;
        }
        char *entry = td_xstrdup(name);
        char *slash = strchr(entry, '/');
        if (slash) *slash = '\0';
        td_ckpt_name cn;
        bool ok = td_ckpt_parse(entry, &cn) && cn.step == step && (cn.is_dir == (slash != NULL));
        if (ok) offer_add(o, name, entry, nb);
        free(name);
        free(entry);
        if (!ok) goto bad;
    }
    if (o->total != total) goto bad;
    *chunk = cb;
    return TD_OK;
bad:
    offer_free(o);
    return td_error(TD_ERR_PROTOCOL,
                    "node 0 offered the checkpoint of step %lld in a form this agent does not "
                    "read ('%.60s'); run the same tandem on every node",
                    (long long)step, s);
}

static bool signal_pending(int sig_fd) {
    return sig_fd >= 0 && td_loop_wait_readable(sig_fd, 0);
}

/* Waits for key in slices, looking at the signalfd between them (a stop stays queued there for
 * the agent). *val (may be NULL: then freed) on TD_OK. */
static td_status wait_key(const td__rdzv_params *p, const char *key, const char *what, void **val,
                          size_t *len) {
    double deadline = td_now_s() + p->timeout_s;
    for (;;) {
        void *v = NULL;
        size_t n = 0;
        td_status st = td_store_get(p->store, key, &v, &n, SLICE_MS);
        if (st == TD_OK) {
            td_error_clear();
            if (val) {
                *val = v;
                if (len) *len = n;
            } else {
                free(v);
            }
            return TD_OK;
        }
        if (st != TD_ERR_TIMEOUT && st != TD_ERR_NOTFOUND) return st;
        if (signal_pending(p->sig_fd))
            return td_error(TD_ERR_INTERRUPTED, "a signal came while waiting for %s", what);
        if (td_now_s() >= deadline)
            return td_error(TD_ERR_TIMEOUT,
                            "waited %.0f s (--rdzv-timeout) for %s; did that node's agent end? "
                            "(its log says why)",
                            p->timeout_s, what);
    }
}

/* The keys above, malloc'ed. */
static char *key_offer(const td__rdzv_params *p) {
    return td_xasprintf("%s/ckpt/offer", p->ns);
}
static char *key_need(const td__rdzv_params *p, int node) {
    return td_xasprintf("%s/ckpt/need/%d", p->ns, node);
}
static char *key_chunk(const td__rdzv_params *p, long long k) {
    return td_xasprintf("%s/ckpt/chunk/%lld", p->ns, k);
}
static char *key_got(const td__rdzv_params *p, long long k, int node) {
    return td_xasprintf("%s/ckpt/got/%lld/%d", p->ns, k, node);
}

/* ---- node 0 ---- */

/* Waits until every needing node took chunk k, then takes it and its receipts out of the store. */
static td_status retire_chunk(const td__rdzv_params *p, const bool *need, int nnodes, long long k) {
    for (int node = 1; node < nnodes; node++) {
        if (!need[node]) continue;
        char *key = key_got(p, k, node);
        char what[96];
        snprintf(what, sizeof what, "node %d to take piece %lld of the checkpoint", node, k);
        td_status st = wait_key(p, key, what, NULL, NULL);
        if (st == TD_OK) st = td_store_delete(p->store, key, NULL);
        free(key);
        TD_CHECK(st);
    }
    char *key = key_chunk(p, k);
    td_status st = td_store_delete(p->store, key, NULL);
    free(key);
    return st;
}

static td_status stream(const td__rdzv_params *p, const char *dir, const offer *o,
                        const bool *need, int nnodes) {
    char *buf = td_xmalloc(CHUNK_BYTES);
    size_t fill = 0;
    long long k = 0;
    td_status st = TD_OK;
    for (int i = 0; st == TD_OK && i <= o->n; i++) {
        int fd = -1;
        int64_t left = 0;
        if (i < o->n) {
            char *path = td_xasprintf("%s/%s", dir, o->f[i].name);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) st = td_error_errno(TD_ERR_IO, "sending the checkpoint: opening %s", path);
            free(path);
            left = o->f[i].nbytes;
        }
        /* the last round (i == o->n) only flushes what is buffered */
        while (st == TD_OK && (left > 0 || (i == o->n && fill > 0))) {
            if (left > 0) {
                ssize_t got = read(fd, buf + fill, (size_t)TD_MIN((int64_t)(CHUNK_BYTES - fill),
                                                                  left));
                if (got < 0 && errno == EINTR) continue;
                if (got <= 0) {
                    st = td_error(TD_ERR_IO, "sending the checkpoint: %s/%s changed while it was "
                                  "sent (%s)", dir, o->f[i].name,
                                  got < 0 ? strerror(errno) : "shorter than listed");
                    break;
                }
                fill += (size_t)got;
                left -= got;
            }
            if (fill == CHUNK_BYTES || (i == o->n && fill > 0)) {
                if (k >= WINDOW) st = retire_chunk(p, need, nnodes, k - WINDOW);
                char *key = key_chunk(p, k);
                if (st == TD_OK) st = td_store_set(p->store, key, buf, fill);
                free(key);
                k++;
                fill = 0;
            }
        }
        if (fd >= 0) close(fd);
    }
    for (long long j = TD_MAX(0, k - WINDOW); st == TD_OK && j < k; j++)
        st = retire_chunk(p, need, nnodes, j);
    free(buf);
    return st;
}

td_status td__ckpt_peer_offer(const td__rdzv_params *p, const char *dir, int64_t step) {
    offer o = {0};
    if (dir && step >= 0) build_offer(&o, dir, step);
    size_t len;
    char *text = offer_text(&o, &len);
    char *key = key_offer(p);
    td_status st = td_store_set(p->store, key, text, len);
    free(key);
    free(text);
    offer_free(&o);
    return st;
}

td_status td__ckpt_peer_serve(const td__rdzv_params *p, int nnodes, const char *dir,
                              int64_t step) {
    offer o = {0};
    if (!dir || step < 0 || nnodes < 2) return TD_OK;
    build_offer(&o, dir, step);
    if (!o.n) return TD_OK;
    bool *need = td_xcalloc((size_t)nnodes, sizeof *need);
    int needing = 0;
    td_status st = TD_OK;
    for (int node = 1; st == TD_OK && node < nnodes; node++) {
        char *key = key_need(p, node), what[96];
        void *v = NULL;
        snprintf(what, sizeof what, "node %d to say whether it holds the checkpoint", node);
        st = wait_key(p, key, what, &v, NULL);
        if (st == TD_OK) need[node] = !strcmp(v, "1");
        needing += need[node];
        free(v);
        free(key);
    }
    double t0 = td_now_s();
    if (st == TD_OK && needing) st = stream(p, dir, &o, need, nnodes);
    if (st == TD_OK && needing)
        TD_LOG_INFO("checkpoint of step %lld (%d file%s, %lld bytes) sent to %d node%s in %.1f s "
                    "through the rendezvous store",
                    (long long)step, o.n, o.n == 1 ? "" : "s", (long long)o.total, needing,
                    needing == 1 ? "" : "s", td_now_s() - t0);
    free(need);
    offer_free(&o);
    return st;
}

/* ---- the other nodes ---- */

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    (void)remove(path);
    return 0;
}

void td__rm_tree(const char *path) {
    (void)nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Where a received checkpoint is written before it is renamed into place: a name beginning
 * with '.', which no reader takes for a checkpoint. */
static char *stage_path(const char *dir, const char *entry) {
    return td_xasprintf("%s/.%s.peer-%ld", dir, entry, (long)getpid());
}

void td__ckpt_keep_local_files(const char *dir, const char *entry, const char *stage) {
    char *local = td_xasprintf("%s/%s", dir, entry);
    DIR *d = opendir(local);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char *from = td_xasprintf("%s/%s", local, e->d_name);
        char *to = td_xasprintf("%s/%s", stage, e->d_name);
        struct stat sb;
        if (lstat(from, &sb) == 0 && S_ISREG(sb.st_mode) && lstat(to, &sb) != 0 &&
            errno == ENOENT && rename(from, to) == 0)
            TD_LOG_INFO("kept this node's %s/%s in the copy of node 0's checkpoint", entry,
                        e->d_name);
        free(from);
        free(to);
    }
    if (d) closedir(d);
    free(local);
}

td_status td__ckpt_commit_staged(const char *dir, const char *entry, const char *stage,
                                 bool is_dir, const char *source) {
    char *path = td_xasprintf("%s/%s", dir, entry);
    char *old = td_xasprintf("%s/.%s.old-%ld", dir, entry, (long)getpid());
    td_status st = TD_OK;
    if (is_dir) {
        td__ckpt_keep_local_files(dir, entry, stage);
        char *marker = td_xasprintf("%s/%s", stage, TD_CKPT_MARKER);
        char *text = td_xasprintf("received from %s\n", source);
        td_chunk c = {text, strlen(text)};
        st = td_write_atomic(marker, "checkpoint commit marker", &c, 1);
        free(text);
        free(marker);
        if (st == TD_OK && access(path, F_OK) == 0 && rename(path, old) != 0)
            st = td_error_errno(TD_ERR_IO, "moving the uncommitted %s aside", path);
    }
    if (st == TD_OK && rename(stage, path) != 0)
        st = td_error_errno(TD_ERR_IO, "renaming the received checkpoint %s into place", stage);
    if (is_dir) td__rm_tree(old);
    if (st != TD_OK) td__rm_tree(stage);
    free(path);
    free(old);
    return st;
}

/* Receives the offered files chunk by chunk into their staged entries, skipping the bytes of
 * entries this node holds committed already (skip[i] per file); commits each entry once its
 * last file is whole. A failure to write still takes and acknowledges every chunk, so that
 * node 0 is never left waiting; the error is returned at the end. */
typedef struct {
    const char *dir;
    const offer *o;
    const bool *skip;
    int i;        /* the file being received */
    int64_t left; /* its bytes still to come */
    int fd;       /* its staged copy, or -1 (skipped, or a write failed) */
    td_status werr;
    char *werr_msg;
} receiver;

static void write_failed(receiver *r, td_status st) {
    r->werr = st;
    if (!r->werr_msg) r->werr_msg = td_xstrdup(td_error_msg());
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
}

static void open_file(receiver *r) {
    const offered_file *f = &r->o->f[r->i];
    if (r->skip[r->i] || r->werr != TD_OK) return;
    char *stage = stage_path(r->dir, f->entry);
    char *out = strcmp(f->name, f->entry)
                    ? td_xasprintf("%s%s", stage, f->name + strlen(f->entry))
                    : td_xstrdup(stage);
    char *parent = td_xstrdup(out);
    *strrchr(parent, '/') = '\0';
    td_status st = td_mkdirs(parent);
    if (st == TD_OK && (r->fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        st = td_error_errno(TD_ERR_IO, "writing the received checkpoint file %s", out);
    if (st != TD_OK) write_failed(r, st);
    free(parent);
    free(out);
    free(stage);
}

/* File r->i is whole: synced and closed; its entry committed when it was the entry's last. */
static void file_done(receiver *r) {
    const offered_file *f = &r->o->f[r->i];
    if (r->fd >= 0 && (fsync(r->fd) != 0 || close(r->fd) != 0))
        write_failed(r, td_error_errno(TD_ERR_IO, "writing %s/%s", r->dir, f->name));
    r->fd = -1;
    bool last_of_entry = r->i + 1 == r->o->n || strcmp(r->o->f[r->i + 1].entry, f->entry);
    if (last_of_entry && !r->skip[r->i] && r->werr == TD_OK) {
        td_ckpt_name cn;
        td_ckpt_parse(f->entry, &cn);
        char *stage = stage_path(r->dir, f->entry);
        td_status st = td__ckpt_commit_staged(r->dir, f->entry, stage, cn.is_dir,
                                              "node 0's agent");
        free(stage);
        if (st != TD_OK) write_failed(r, st);
        else TD_LOG_INFO("received %s/%s from node 0's agent", r->dir, f->entry);
    }
    if (++r->i < r->o->n) r->left = r->o->f[r->i].nbytes;
}

/* Takes bytes [0, n) of the stream (n may be 0: the empty files left at its end). */
static void take_bytes(receiver *r, const char *bytes, size_t n) {
    size_t at = 0;
    while (r->i < r->o->n && (at < n || r->left == 0)) {
        if (r->fd < 0 && r->left == r->o->f[r->i].nbytes) open_file(r);
        size_t take = (size_t)TD_MIN((int64_t)(n - at), r->left);
        if (r->fd >= 0 && take && td__write_all(r->fd, bytes + at, take) != 0)
            write_failed(r, td_error_errno(TD_ERR_IO, "writing the received checkpoint file "
                                           "%s/%s", r->dir, r->o->f[r->i].name));
        at += take;
        r->left -= (int64_t)take;
        if (r->left == 0) file_done(r);
    }
}

static td_status receive(const td__rdzv_params *p, int node, const char *dir, const offer *o,
                         const bool *skip, size_t chunk_bytes) {
    receiver r = {.dir = dir, .o = o, .skip = skip, .left = o->f[0].nbytes, .fd = -1};
    td_status st = TD_OK;
    int64_t to_come = o->total;
    take_bytes(&r, "", 0); /* empty files at the start */
    for (long long k = 0; st == TD_OK && to_come > 0; k++) {
        char *key = key_chunk(p, k), what[96];
        snprintf(what, sizeof what, "piece %lld of node 0's checkpoint", k);
        void *v = NULL;
        size_t n = 0;
        st = wait_key(p, key, what, &v, &n);
        free(key);
        if (st == TD_OK && (n == 0 || n > chunk_bytes || (int64_t)n > to_come))
            st = td_error(TD_ERR_PROTOCOL, "piece %lld of node 0's checkpoint has %zu bytes, "
                          "not what its list of files says", k, n);
        if (st == TD_OK) {
            take_bytes(&r, v, n);
            to_come -= (int64_t)n;
            char *got = key_got(p, k, node);
            st = td_store_set(p->store, got, "1", 1);
            free(got);
        }
        free(v);
    }
    if (r.fd >= 0) close(r.fd);
    if (st != TD_OK || r.werr != TD_OK) {
        for (int j = 0; j < o->n; j++) {
            char *stage = stage_path(dir, o->f[j].entry);
            td__rm_tree(stage);
            free(stage);
        }
    }
    if (st == TD_OK && r.werr != TD_OK)
        st = td_error(r.werr, "%s (is %s writable on this node, with room?)",
                      r.werr_msg ? r.werr_msg : "writing the received checkpoint", dir);
    free(r.werr_msg);
    return st;
}

td_status td__ckpt_peer_fetch(const td__rdzv_params *p, int node, const char *dir,
                              int64_t step) {
    if (step < 0) return TD_OK;
    void *v = NULL;
    size_t len = 0, chunk_bytes = 0;
    char *key = key_offer(p);
    td_status st = wait_key(p, key, "node 0's list of the checkpoint's files", &v, &len);
    free(key);
    TD_CHECK(st);
    offer o;
    st = parse_offer(v, len, step, &o, &chunk_bytes);
    free(v);
    TD_CHECK(st);
    if (!o.n) return TD_OK;
    /* per file: skip it when its entry is committed here already (this node wrote or received
     * it, or a shared disk holds it) */
    bool *skip = td_xcalloc((size_t)o.n, sizeof *skip);
    bool need = false;
    for (int i = 0; i < o.n; i++) {
        td_ckpt_name cn;
        skip[i] = dir && td_ckpt_committed(dir, o.f[i].entry, &cn);
        need |= !skip[i];
    }
    if (need && !dir)
        st = td_error(TD_ERR_USAGE, "node 0 resumes from step %lld but this node has no %s to "
                      "put its checkpoint in", (long long)step,
                      td_var_name(TD_VAR_TANDEM_CHECKPOINT_DIR));
    if (st == TD_OK && need) st = td_mkdirs(dir);
    key = key_need(p, node);
    /* said even after a local failure, so that node 0 does not wait for us */
    td_status said = td_store_set(p->store, key, need && st == TD_OK ? "1" : "0", 1);
    free(key);
    if (st == TD_OK) st = said;
    double t0 = td_now_s();
    if (st == TD_OK && need) {
        st = receive(p, node, dir, &o, skip, chunk_bytes);
        if (st == TD_OK)
            TD_LOG_INFO("received the checkpoint of step %lld (%lld bytes) from node 0 in %.1f s",
                        (long long)step, (long long)o.total, td_now_s() - t0);
    }
    free(skip);
    offer_free(&o);
    return st;
}
