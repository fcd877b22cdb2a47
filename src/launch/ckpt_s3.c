/* The run's checkpoints kept in S3 (TANDEM_CHECKPOINT_URL, docs/cloud.md "S3 checkpoints and
 * artifacts"). The workers keep writing to the local TANDEM_CHECKPOINT_DIR; the agent of the node
 * that holds rank 0 mirrors it to s3://BUCKET/PREFIX, and every node's agent restores from it:
 *   - what is mirrored: every committed checkpoint of the directory by the contract of
 *     tandem/ckpt.h, whoever wrote it: tandem train's ckpt-STEP.tdck, the SDK's step-STEP.pt,
 *     Lightning's NAME.ckpt files, the HF Trainer's checkpoint-STEP/ directories (one committed
 *     by its trainer_state.json); a file again when it changed (Lightning's last.ckpt);
 *   - at its start an agent checks the bucket (a missing bucket or refused credentials end the
 *     run before any training), and on a resume downloads the newest committed checkpoint when
 *     it is newer than the local newest (a fresh machine, or local copies deleted), and each
 *     committed one without a step (last.ckpt) the directory lacks; every node does, so a
 *     framework whose every rank reads its own directory finds the same checkpoint;
 *   - while the workers train, each new checkpoint is uploaded as work on the agent's loop's
 *     threads (td_loop_queue_work, loop.h: the AWS calls block; the loop must not), one upload
 *     at a time, its result reported in its after(), on the loop's thread; a failure is a
 *     warning and the next checkpoint tries again;
 *   - at the agent's end, the checkpoint a stop or preemption made is uploaded before it exits.
 * Write-then-commit: PREFIX/NAME (a file) or PREFIX/NAME/REL (each file of a directory) first,
 * then PREFIX/NAME.commit naming the size and SHA-256 of each. A restore takes the newest commit
 * whose objects match it, so an upload cut short (a spot instance gone mid-PUT, a failed part)
 * is never picked; a restored directory gets tandem's commit marker (TD_CKPT_MARKER) last. The
 * newest KEEP commits with a step stay; older checkpoints are deleted after each commit. */
#include "launch_internal.h"

#include "tandem/ckpt.h"
#include "tandem/cloud.h"
#include "tandem/loop.h"
#include "tandem/os.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Committed checkpoints with a step kept in S3: a few, so that one the trainer finds corrupt on
 * resume (it then takes the previous one) still has an older one behind it. */
#define KEEP_COMMITTED 3
/* How often the local directory is looked at for a new checkpoint. */
#define SCAN_PERIOD_S 0.5

/* A checkpoint's identity on disk: a file's size, mtime and inode; a directory's marker's. */
typedef struct {
    char *name;
    int64_t sig[3];
} seen;

struct td__ckpt_s3 {
    char *url;      /* s3://bucket/prefix as given, for messages */
    char *bucket;   /* "b" */
    char *prefix;   /* "prefix/" or "" */
    char *dir;      /* the local TANDEM_CHECKPOINT_DIR */
    bool uploader;  /* the node of rank 0: it uploads; every node restores */
    td__ckpt_ranks *ranks; /* another node: its own files of directory checkpoints */
    td_loop *loop;
    uint64_t timer;
    /* The upload in flight, as work on the loop's threads (0: none). The job_* fields are the
     * work's own from its queueing until its after() ran or td_loop_cancel_work returned. */
    uint64_t job;
    bool job_started; /* the work began (set by the work): an upload was at least tried */
    char job_name[256];
    td_ckpt_name job_n;
    int64_t job_sig[3];
    td_status job_st;
    char job_msg[1024];
    int64_t job_nbytes;
    double job_s;
    int64_t committed; /* newest step committed by this agent or found in S3; -1: none */
    seen *done;        /* uploaded (or found in S3) as they are now */
    int ndone;
    seen *failed; /* whose upload failed as they are now: tried again once they change */
    int nfailed;
};

int64_t td__ckpt_newest_step(const char *dir) {
    return td_ckpt_newest(dir, TD_CKPT_ANY, NULL, 0);
}

/* The signature of dir/name (false when it is gone or not committed). */
static bool entry_sig(const char *dir, const char *name, int64_t sig[3]) {
    td_ckpt_name n;
    if (!td_ckpt_committed(dir, name, &n)) return false;
    char *p = td_xasprintf("%s/%s", dir, name), *m = NULL;
    if (n.is_dir) {
        m = td_xasprintf("%s/%s", p, TD_CKPT_HF_MARKER);
        if (access(m, F_OK) != 0) {
            free(m);
            m = td_xasprintf("%s/%s", p, TD_CKPT_MARKER);
        }
    }
    struct stat sb;
    bool ok = lstat(m ? m : p, &sb) == 0;
    if (ok) {
        sig[0] = (int64_t)sb.st_size;
        sig[1] = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        sig[2] = (int64_t)sb.st_ino;
    }
    free(p);
    free(m);
    return ok;
}

static seen *seen_find(seen *v, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name)) return &v[i];
    return NULL;
}

static void seen_set(seen **v, int *n, const char *name, const int64_t sig[3]) {
    seen *e = seen_find(*v, *n, name);
    if (!e) {
        *v = td_xrealloc(*v, (size_t)(*n + 1) * sizeof **v);
        e = &(*v)[(*n)++];
        e->name = td_xstrdup(name);
    }
    memcpy(e->sig, sig, sizeof e->sig);
}

static bool seen_same(seen *v, int n, const char *name, const int64_t sig[3]) {
    seen *e = seen_find(v, n, name);
    return e && !memcmp(e->sig, sig, sizeof e->sig);
}

/* Marks dir/name as held by S3 as it is now (restored, or found there). */
static void mark_done(td__ckpt_s3 *s, const char *name) {
    int64_t sig[3];
    if (entry_sig(s->dir, name, sig)) seen_set(&s->done, &s->ndone, name, sig);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    (void)remove(p);
    return 0;
}

static void rm_rf(const char *p) {
    (void)nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static td_status new_client(td_aws_t **out) {
    td_aws_opts o;
    memset(&o, 0, sizeof o);
    return td_aws_new(&o, out);
}

/* The checkpoint a key below the prefix belongs to: PREFIX/NAME, PREFIX/NAME/REL (a file of a
 * directory) or PREFIX/NAME.commit (*commit set). name: NAME_MAX + 1 bytes. */
static bool key_entry(const td__ckpt_s3 *s, const char *key, char name[256], bool *commit,
                      td_ckpt_name *n) {
    size_t np = strlen(s->prefix);
    if (strncmp(key, s->prefix, np)) return false;
    const char *rem = key + np, *slash = strchr(rem, '/');
    size_t len = slash ? (size_t)(slash - rem) : strlen(rem);
    *commit = !slash && len > 7 && !strcmp(rem + len - 7, ".commit");
    if (*commit) len -= 7;
    if (len >= 256) return false;
    memcpy(name, rem, len);
    name[len] = '\0';
    return td_ckpt_parse(name, n) && (!slash || n->is_dir);
}

typedef struct {
    char name[256];
    td_ckpt_name n;
} commit_ref;

static int cmp_commit(const void *a, const void *b) {
    const commit_ref *x = a, *y = b;
    if (x->n.step != y->n.step) return x->n.step < y->n.step ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* The commits in S3, newest step first, those without a step last (caller frees). */
static td_status list_commits(td__ckpt_s3 *s, td_aws_t *aws, commit_ref **out, int *n,
                              td_s3_list *all) {
    TD_CHECK(td_s3_list_objects(aws, s->bucket, s->prefix, 0, all));
    *out = td_xcalloc((size_t)all->count + 1, sizeof **out);
    *n = 0;
    for (int i = 0; i < all->count; i++) {
        commit_ref c;
        bool is_commit;
        if (key_entry(s, all->items[i].key, c.name, &is_commit, &c.n) && is_commit)
            (*out)[(*n)++] = c;
    }
    qsort(*out, (size_t)*n, sizeof **out, cmp_commit);
    return TD_OK;
}

/* Deletes the checkpoints older than the newest KEEP_COMMITTED commits with a step (the commit
 * first, so that no commit names a deleted object), and objects left without a commit below
 * them. Checkpoints without a step (last.ckpt) stay. */
static void prune(td__ckpt_s3 *s, td_aws_t *aws) {
    td_s3_list all = {0};
    commit_ref *c = NULL;
    int n = 0, stepped = 0;
    if (list_commits(s, aws, &c, &n, &all) != TD_OK) {
        TD_LOG_WARN("s3 checkpoints: listing %s to delete old checkpoints: %s", s->url,
                    td_error_msg());
        td_error_clear();
        goto out;
    }
    while (stepped < n && c[stepped].n.step >= 0) stepped++;
    if (stepped <= KEEP_COMMITTED) goto out;
    int64_t oldest_kept = c[KEEP_COMMITTED - 1].n.step;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < all.count; i++) {
            char name[256];
            bool is_commit;
            td_ckpt_name kn;
            if (!key_entry(s, all.items[i].key, name, &is_commit, &kn) ||
                is_commit != (pass == 0) || kn.step < 0 || kn.step >= oldest_kept)
                continue;
            if (td_s3_delete(aws, s->bucket, all.items[i].key) != TD_OK) {
                TD_LOG_WARN("s3 checkpoints: deleting old s3://%s/%s: %s", s->bucket,
                            all.items[i].key, td_error_msg());
                td_error_clear();
            }
        }
out:
    free(c);
    td_s3_list_free(&all);
}

static void walk(const char *base, const char *rel, bool (*keep)(const char *, bool),
                 td__ckpt_files *out) {
    char *p = rel[0] ? td_xasprintf("%s/%s", base, rel) : td_xstrdup(base);
    DIR *d = opendir(p);
    free(p);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !keep(e->d_name, !rel[0]))
            continue;
        char *r = rel[0] ? td_xasprintf("%s/%s", rel, e->d_name) : td_xstrdup(e->d_name);
        char *full = td_xasprintf("%s/%s", base, r);
        struct stat sb;
        bool got = lstat(full, &sb) == 0;
        if (got && S_ISDIR(sb.st_mode)) {
            walk(base, r, keep, out);
            free(r);
        } else if (got && S_ISREG(sb.st_mode)) {
            out->v = td_xrealloc(out->v, (size_t)(out->n + 1) * sizeof *out->v);
            td__ckpt_file *f = &out->v[out->n++];
            f->rel = r;
            f->sig[0] = (int64_t)sb.st_size;
            f->sig[1] = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
            f->sig[2] = (int64_t)sb.st_ino;
        } else {
            free(r);
        }
        free(full);
    }
    closedir(d);
}

void td__ckpt_walk(const char *dir, bool (*keep)(const char *name, bool top), td__ckpt_files *out) {
    walk(dir, "", keep, out);
}

void td__ckpt_files_free(td__ckpt_files *f) {
    for (int i = 0; i < f->n; i++) free(f->v[i].rel);
    free(f->v);
    f->v = NULL;
    f->n = 0;
}

/* What a checkpoint's upload takes: everything but tandem's own marker. */
static bool not_marker(const char *name, bool top) {
    return !top || strcmp(name, TD_CKPT_MARKER);
}

td_status td__ckpt_put_held(td_aws_t *aws, const char *bucket, const char *dir, const char *tag,
                           const char *path, const char *key, int64_t *nbytes, char sha[65]) {
    char *held = td_xasprintf("%s/.s3up-%s%ld", dir, tag, (long)getpid());
    const char *from = held;
    td_status st = TD_OK;
    (void)unlink(held);
    if (link(path, held) != 0) {
        if (errno == ENOENT) {
            st = td_error_errno(TD_ERR_IO, "s3 checkpoints: holding %s for its upload", path);
            goto out;
        }
        /* no hard links here (EPERM, EXDEV, ...): upload the file itself; a change under the
         * upload is still refused by td_s3_put_file */
        from = path;
    }
    struct stat sb;
    if (stat(from, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "s3 checkpoints: %s", path);
        goto out;
    }
    *nbytes = (int64_t)sb.st_size;
    TD_CHECK_GOTO(td_s3_put_file(aws, bucket, key, from, sha), st, out);
out:
    if (from == held) (void)unlink(held); /* the hard link, never the checkpoint itself */
    free(held);
    return st;
}

/* Uploads and commits dir/name (blocking: the thread's body, and the agent's last upload):
 * its object or objects first, then NAME.commit naming each one's size and SHA-256. */
static td_status upload(td__ckpt_s3 *s, const char *name, const td_ckpt_name *n,
                        int64_t *nbytes) {
    char *path = td_xasprintf("%s/%s", s->dir, name);
    char *commit_key = td_xasprintf("%s%s.commit", s->prefix, name);
    char *commit = NULL;
    td_aws_t *aws = NULL;
    td__ckpt_files files = {0};
    td_status st = TD_OK;
    *nbytes = 0;
    TD_CHECK_GOTO(new_client(&aws), st, out);
    if (!n->is_dir) {
        char sha[65];
        char *key = td_xasprintf("%s%s", s->prefix, name);
        st = td__ckpt_put_held(aws, s->bucket, s->dir, "", path, key, nbytes, sha);
        free(key);
        if (st != TD_OK) goto out;
        commit = td_xasprintf("tandem-checkpoint-commit 1\nobject %s\nstep %" PRId64
                              "\nnbytes %" PRId64 "\nsha256 %s\n",
                              name, n->step, *nbytes, sha);
    } else {
        td__ckpt_walk(path, not_marker, &files);
        commit = td_xasprintf("tandem-checkpoint-commit 1\nobject %s/\nstep %" PRId64
                              "\nfiles %d\n",
                              name, n->step, files.n);
        for (int i = 0; i < files.n; i++) {
            char sha[65];
            int64_t nb = 0;
            char *fp = td_xasprintf("%s/%s", path, files.v[i].rel);
            char *key = td_xasprintf("%s%s/%s", s->prefix, name, files.v[i].rel);
            st = td__ckpt_put_held(aws, s->bucket, s->dir, "", fp, key, &nb, sha);
            free(fp);
            free(key);
            if (st != TD_OK) goto out;
            *nbytes += nb;
            char *more = td_xasprintf("%sfile %" PRId64 " %s %s\n", commit, nb, sha, files.v[i].rel);
            free(commit);
            commit = more;
        }
    }
    /* The commit: written only once the objects are whole; what a restore checks them by. */
    TD_CHECK_GOTO(td_s3_put_buffer(aws, s->bucket, commit_key, commit, strlen(commit)), st, out);
    prune(s, aws);
out:
    td__ckpt_files_free(&files);
    td_aws_free(aws);
    free(commit);
    free(commit_key);
    free(path);
    return st;
}

/* The work: one checkpoint's upload and commit, on a thread of the loop's. Its error stays
 * in job_msg (td_error is per thread). */
static void upload_work(void *user) {
    td__ckpt_s3 *s = user;
    s->job_started = true;
    double t0 = td_now_s();
    s->job_st = upload(s, s->job_name, &s->job_n, &s->job_nbytes);
    s->job_s = td_now_s() - t0;
    snprintf(s->job_msg, sizeof s->job_msg, "%s", s->job_st == TD_OK ? "" : td_error_msg());
    td_error_clear();
}

/* last: the agent's own upload as it ends (nothing comes after it). */
static void report(td__ckpt_s3 *s, td_status st, const char *msg, double secs, bool last) {
    const char *name = s->job_name;
    if (st == TD_OK) {
        if (s->job_n.step > s->committed) s->committed = s->job_n.step;
        seen_set(&s->done, &s->ndone, name, s->job_sig);
        TD_LOG_INFO("s3 checkpoints: uploaded %s (%" PRId64 " bytes, %.2f s) to %s/%s and "
                    "committed it%s",
                    name, s->job_nbytes, secs, s->url, name,
                    last ? ": the last, as the agent ends" : "");
        return;
    }
    seen_set(&s->failed, &s->nfailed, name, s->job_sig);
    if (!last) {
        TD_LOG_WARN("s3 checkpoints: uploading %s to %s failed after %.2f s (%s); training goes "
                    "on, and the next checkpoint tries again",
                    name, s->url, secs, msg);
    } else if (s->committed >= 0) {
        TD_LOG_WARN("s3 checkpoints: uploading the last checkpoint %s to %s failed after %.2f s "
                    "(%s); a resume from S3 starts at step %" PRId64
                    ", the newest committed; this node keeps %s in %s",
                    name, s->url, secs, msg, s->committed, name, s->dir);
    } else {
        TD_LOG_WARN("s3 checkpoints: uploading the last checkpoint %s to %s failed after %.2f s "
                    "(%s); S3 holds no checkpoint of this run; this node keeps it in %s",
                    name, s->url, secs, msg, s->dir);
    }
}

/* The after(), on the agent's loop: says how the upload went. */
static void upload_done(td_loop *l, void *user) {
    (void)l;
    td__ckpt_s3 *s = user;
    s->job = 0;
    report(s, s->job_st, s->job_msg, s->job_s, false);
}

/* Off the loop (the agent's own steps: a restart's resume, its end, its teardown): the upload
 * in flight finishes, for it may be the checkpoint a resume needs, and is said as its after()
 * would have; one still queued never starts (the next upload takes the newest anyway). */
static void join_upload(td__ckpt_s3 *s) {
    if (!s->job) return;
    td_loop_cancel_work(s->loop, s->job); /* waits for it when it runs */
    s->job = 0;
    if (s->job_started) report(s, s->job_st, s->job_msg, s->job_s, false);
}

/* The next checkpoint to upload into s->job_*: the newest committed one S3 does not hold as
 * it is now (none older than the newest committed step); false when none. */
static bool next_job(td__ckpt_s3 *s) {
    int n;
    td_ckpt_entry *v = td_ckpt_list(s->dir, TD_CKPT_ANY, &n);
    bool found = false;
    for (int i = 0; i < n && !found; i++) {
        int64_t sig[3];
        if ((v[i].n.step >= 0 && v[i].n.step < s->committed) || strlen(v[i].name) >= 256 ||
            !entry_sig(s->dir, v[i].name, sig) || seen_same(s->done, s->ndone, v[i].name, sig) ||
            seen_same(s->failed, s->nfailed, v[i].name, sig))
            continue;
        snprintf(s->job_name, sizeof s->job_name, "%s", v[i].name);
        s->job_n = v[i].n;
        memcpy(s->job_sig, sig, sizeof sig);
        found = true;
    }
    td_ckpt_list_free(v, n);
    return found;
}

static void on_scan(td_loop *l, void *user) {
    td__ckpt_s3 *s = user;
    if (s->job || !next_job(s)) return;
    s->job_nbytes = 0;
    s->job_started = false;
    s->job = td_loop_queue_work(l, upload_work, upload_done, s);
    if (!s->job) {
        TD_LOG_WARN("s3 checkpoints: cannot queue the upload of %s (%s); trying again",
                    s->job_name, td_error_msg());
        td_error_clear();
    }
}

/* Says what is wrong with the bucket or the credentials, and what to do. */
static td_status check_error(td__ckpt_s3 *s, td_aws_t *aws, td_status st) {
    const td_aws_error *e = aws ? td_aws_last_error(aws) : NULL;
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", td_error_msg());
    td_error_clear();
    if (e && e->kind == TD_AWS_ERRK_NOTFOUND)
        return td_error(TD_ERR_NOTFOUND,
                        "checkpoint_dir %s: the bucket '%s' does not exist (or is not in region "
                        "%s); create it (aws s3 mb s3://%s) or change checkpoint_dir [%s]",
                        s->url, s->bucket, td_aws_region(aws), s->bucket, detail);
    if (e && e->kind == TD_AWS_ERRK_AUTH)
        return td_error(TD_ERR_AUTH,
                        "checkpoint_dir %s: S3 refused this node's credentials for bucket '%s'; "
                        "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or the profile, or the "
                        "instance role) and that they may read and write s3://%s/%s* [%s]",
                        s->url, s->bucket, s->bucket, s->prefix, detail);
    return td_error(st, "checkpoint_dir %s: cannot use bucket '%s' on this node: %s", s->url,
                    s->bucket, detail);
}

char *td__ckpt_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *buf = td_xmalloc(cap);
    for (size_t got; (got = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (len + 1 == cap) buf = td_xrealloc(buf, cap *= 2);
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* The line after line's, NULL at the end. */
static char *next_line(char *line) {
    char *nl = strchr(line, '\n');
    return nl ? nl + 1 : NULL;
}

bool td__ckpt_safe_rel(const char *rel) {
    if (!rel[0] || rel[0] == '/') return false;
    for (const char *p = rel; p;) {
        if (!strncmp(p, "..", 2) && (p[2] == '/' || !p[2])) return false;
        p = strchr(p, '/');
        if (p) p++;
    }
    return true;
}

/* Downloads the committed checkpoint c into the directory; why says what failed. */
static bool restore_one(td__ckpt_s3 *s, td_aws_t *aws, const commit_ref *c, int64_t *nbytes,
                        char *why, size_t why_n) {
    char *ckey = td_xasprintf("%s%s.commit", s->prefix, c->name);
    char *tmp = td_xasprintf("%s/.s3commit-%ld", s->dir, (long)getpid());
    char *path = td_xasprintf("%s/%s", s->dir, c->name);
    char *stage = td_xasprintf("%s/.s3dl-%s.%ld", s->dir, c->name, (long)getpid());
    char *old = td_xasprintf("%s/.s3old-%s.%ld", s->dir, c->name, (long)getpid());
    char *text = NULL;
    bool ok = false;
    *nbytes = 0;
    why[0] = '\0';
    if (td_s3_get_file(aws, s->bucket, ckey, tmp, NULL) != TD_OK) {
        snprintf(why, why_n, "%s", td_error_msg());
        goto out;
    }
    if (!(text = td__ckpt_slurp(tmp))) {
        snprintf(why, why_n, "reading the commit %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (!c->n.is_dir) {
        long long c_nbytes = -1;
        char c_sha[65] = "";
        td_s3_object head = {0}, got = {0};
        char *key = td_xasprintf("%s%s", s->prefix, c->name);
        for (char *line = text; line && *line; line = next_line(line)) {
            if (sscanf(line, "nbytes %lld", &c_nbytes) == 1) continue;
            (void)sscanf(line, "sha256 %64[0-9a-f]", c_sha);
        }
        if (c_nbytes < 0 || strlen(c_sha) != 64)
            snprintf(why, why_n, "the commit object is not one tandem wrote");
        else if (td_s3_head(aws, s->bucket, key, &head) != TD_OK)
            snprintf(why, why_n, "%s", td_error_msg());
        else if (head.nbytes != c_nbytes || strcmp(head.sha256_hex, c_sha))
            snprintf(why, why_n, "the object differs from what its commit says (size or sha256)");
        else if (td_s3_get_file(aws, s->bucket, key, path, &got) != TD_OK)
            snprintf(why, why_n, "%s", td_error_msg());
        else if (strcmp(got.sha256_hex, c_sha)) {
            (void)unlink(path);
            snprintf(why, why_n, "the downloaded bytes differ from the commit's sha256");
        } else {
            ok = true;
            *nbytes = c_nbytes;
        }
        td_s3_object_free(&head);
        td_s3_object_free(&got);
        free(key);
        goto out;
    }
    /* a directory: each file into a staging directory, checked, then the marker, then renamed
     * into place (replacing an uncommitted one of the same name) */
    rm_rf(stage);
    int nfiles = -1, got_files = 0;
    ok = td_mkdirs(stage) == TD_OK;
    if (!ok) snprintf(why, why_n, "%s", td_error_msg());
    for (char *line = text; ok && line && *line; line = next_line(line)) {
        long long fb;
        char fsha[65], rel[1024];
        if (sscanf(line, "files %d", &nfiles) == 1) continue;
        if (sscanf(line, "file %lld %64[0-9a-f] %1023[^\n]", &fb, fsha, rel) != 3) continue;
        if (!td__ckpt_safe_rel(rel) || strlen(fsha) != 64) {
            snprintf(why, why_n, "the commit names a file %.200s that tandem would not write", rel);
            ok = false;
            break;
        }
        char *key = td_xasprintf("%s%s/%s", s->prefix, c->name, rel);
        char *dst = td_xasprintf("%s/%s", stage, rel);
        char *parent = td_xstrdup(dst);
        *strrchr(parent, '/') = '\0';
        td_s3_object got = {0};
        if (td_mkdirs(parent) != TD_OK || td_s3_get_file(aws, s->bucket, key, dst, &got) != TD_OK) {
            snprintf(why, why_n, "%s", td_error_msg());
            ok = false;
        } else if (got.nbytes != fb || strcmp(got.sha256_hex, fsha)) {
            snprintf(why, why_n, "%s differs from what its commit says (size or sha256)", key);
            ok = false;
        } else {
            got_files++;
            *nbytes += fb;
        }
        td_s3_object_free(&got);
        free(key);
        free(dst);
        free(parent);
    }
    if (ok && nfiles != got_files) {
        snprintf(why, why_n, "the commit is not one tandem wrote (files %d, %d listed)", nfiles,
                 got_files);
        ok = false;
    }
    if (ok) td__ckpt_keep_local_files(s->dir, c->name, stage); /* this node's ranks' RNG states */
    if (ok) {
        char *marker = td_xasprintf("%s/%s", stage, TD_CKPT_MARKER);
        FILE *f = fopen(marker, "w");
        ok = f && fprintf(f, "restored from %s/%s\n", s->url, c->name) > 0;
        if (f && fclose(f) != 0) ok = false;
        if (!ok) snprintf(why, why_n, "writing %s: %s", marker, strerror(errno));
        free(marker);
    }
    if (ok && access(path, F_OK) == 0 && rename(path, old) != 0) {
        snprintf(why, why_n, "moving the uncommitted %s aside: %s", path, strerror(errno));
        ok = false;
    }
    if (ok && rename(stage, path) != 0) {
        snprintf(why, why_n, "renaming %s into place: %s", stage, strerror(errno));
        ok = false;
    }
    rm_rf(old);
    if (!ok) rm_rf(stage);
out:
    td_error_clear();
    (void)unlink(tmp);
    free(text);
    free(ckey);
    free(tmp);
    free(path);
    free(stage);
    free(old);
    return ok;
}

/* The restore: the newest committed checkpoint with a step in S3, downloaded when it is newer
 * than the local newest, and each committed one without a step the directory lacks. */
static td_status fetch_newer(td__ckpt_s3 *s, td_aws_t *aws) {
    int64_t local = td_ckpt_newest(s->dir, TD_CKPT_ANY, NULL, 0);
    td_s3_list all = {0};
    commit_ref *c = NULL;
    int n = 0;
    bool stepped_done = false;
    td_status st = list_commits(s, aws, &c, &n, &all);
    if (st != TD_OK) {
        st = check_error(s, aws, st);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (td_ckpt_committed(s->dir, c[i].name, NULL)) {
            /* here already: not uploaded again unless it changes */
            mark_done(s, c[i].name);
            if (c[i].n.step > s->committed && c[i].n.step <= local) s->committed = c[i].n.step;
        }
    }
    for (int i = 0; i < n; i++) {
        bool stepped = c[i].n.step >= 0;
        if (stepped && stepped_done) continue;
        if (stepped && c[i].n.step <= local) {
            TD_LOG_INFO("s3 checkpoints: the local newest (step %" PRId64 ") is as new as the "
                        "newest committed in %s (%s)",
                        local, s->url, c[0].name);
            stepped_done = true;
            continue;
        }
        if (!stepped && td_ckpt_committed(s->dir, c[i].name, NULL)) continue;
        char why[1024];
        int64_t nbytes;
        double t0 = td_now_s();
        if (restore_one(s, aws, &c[i], &nbytes, why, sizeof why)) {
            mark_done(s, c[i].name);
            if (stepped) {
                stepped_done = true;
                if (c[i].n.step > s->committed) s->committed = c[i].n.step;
            }
            TD_LOG_INFO("s3 checkpoints: downloaded %s (%" PRId64 " bytes, %.2f s) from %s%s",
                        c[i].name, nbytes, td_now_s() - t0, s->url,
                        !stepped    ? ""
                        : local < 0 ? ": newer than the local directory (no checkpoint)"
                                    : ": newer than the local newest");
        } else {
            TD_LOG_WARN("s3 checkpoints: skipping the committed %s of %s: %s", c[i].name, s->url,
                        why);
        }
    }
    if (!n)
        TD_LOG_INFO("s3 checkpoints: %s holds no committed checkpoint yet%s", s->url,
                    local >= 0 ? "; the local ones are used" : "");
out:
    free(c);
    td_s3_list_free(&all);
    return st;
}

/* What an agent killed mid-upload or mid-download left in dir (its hard links, commit copies,
 * partial downloads, staged directories): only this node's agent makes them, and it is
 * starting. */
static void remove_leftovers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        /* (td_s3_get_file's temporaries are NAME.tdpart.XXXXXX) */
        bool download = td_ckpt_parse(e->d_name, NULL) == false && strstr(e->d_name, ".tdpart.");
        if (strncmp(e->d_name, ".s3up-", 6) && strncmp(e->d_name, ".s3commit-", 10) &&
            strncmp(e->d_name, ".s3dl-", 6) && strncmp(e->d_name, ".s3old-", 7) && !download)
            continue;
        char *p = td_xasprintf("%s/%s", dir, e->d_name);
        rm_rf(p);
        if (access(p, F_OK) != 0)
            TD_LOG_INFO("s3 checkpoints: removed %s, left by an earlier agent", p);
        free(p);
    }
    closedir(d);
}

static void upload_all(td__ckpt_s3 *s);

td_status td__ckpt_s3_open(td_loop *loop, bool resume, bool uploader, td__ckpt_s3 **out) {
    *out = NULL;
    const char *url = td_var_get(TD_VAR_TANDEM_CHECKPOINT_URL);
    if (!url) return TD_OK;
    const char *dir = td_var_get(TD_VAR_TANDEM_CHECKPOINT_DIR);
    if (!dir)
        return td_error(TD_ERR_USAGE,
                        "%s=%s needs %s, the local directory the workers write and the agent "
                        "uploads from",
                        td_var_name(TD_VAR_TANDEM_CHECKPOINT_URL), url,
                        td_var_name(TD_VAR_TANDEM_CHECKPOINT_DIR));
    td_s3_url u = {0};
    TD_CHECK(td_s3_url_parse(url, &u));
    td__ckpt_s3 *s = td_xcalloc(1, sizeof *s);
    s->url = td_xstrdup(url);
    size_t ul = strlen(s->url);
    while (ul > 5 && s->url[ul - 1] == '/') s->url[--ul] = '\0';
    s->bucket = u.bucket;
    size_t kl = strlen(u.key);
    while (kl && u.key[kl - 1] == '/') u.key[--kl] = '\0';
    s->prefix = kl ? td_xasprintf("%s/", u.key) : td_xstrdup("");
    free(u.key);
    s->dir = td_xstrdup(dir);
    s->uploader = uploader;
    s->loop = loop;
    s->committed = -1;
    td_aws_t *aws = NULL;
    td_status st = td_mkdirs(s->dir);
    if (st == TD_OK) remove_leftovers(s->dir);
    if (st == TD_OK) {
        st = new_client(&aws);
        if (st != TD_OK)
            st = td_error(st,
                          "checkpoint_dir %s: no AWS credentials or region on this node: %s (a "
                          "remote node needs its own: files in its ~/.aws, an instance role, or "
                          "AWS_* delivered by the workflow's secrets:)",
                          s->url, td_error_msg());
    }
    /* The bucket is checked before any worker starts: a typo or missing credentials end the
     * run now, not after the first checkpoint. */
    if (st == TD_OK && resume && uploader) {
        st = fetch_newer(s, aws);
    } else if (st == TD_OK) {
        td_s3_list l = {0};
        st = td_s3_list_objects(aws, s->bucket, s->prefix, 1, &l);
        if (st != TD_OK) st = check_error(s, aws, st);
        td_s3_list_free(&l);
    }
    td_aws_free(aws);
    if (st != TD_OK && !uploader) {
        /* another node: its workers then read what rank 0 gives them (the SDK) or their own
         * directory; the run goes on */
        TD_LOG_WARN("s3 checkpoints: this node cannot restore from S3: %s; its workers read "
                    "%s as it is",
                    td_error_msg(), s->dir);
        td_error_clear();
        td__ckpt_s3_free(s);
        return TD_OK;
    }
    if (st != TD_OK) {
        td__ckpt_s3_free(s);
        return st;
    }
    /* On a resume, S3 gets this node's newest before any other node restores from it: the
     * step every rank resumes from is this node's newest (launch.c hands it to the others). */
    if (uploader && resume) upload_all(s);
    if (uploader) {
        s->timer = td_loop_timer(loop, SCAN_PERIOD_S, SCAN_PERIOD_S, on_scan, s);
        TD_LOG_INFO("s3 checkpoints: %s is mirrored to %s (bucket checked)", s->dir, s->url);
    } else {
        TD_LOG_INFO("s3 checkpoints: %s is restored from %s on a resume, the step node 0 "
                    "resumes from (bucket checked; the node of rank 0 uploads)",
                    s->dir, s->url);
    }
    *out = s;
    return TD_OK;
}

/* Uploads the newest local checkpoint S3 lacks, now (blocking); last: as the agent ends. */
static void upload_now(td__ckpt_s3 *s, bool last) {
    if (!next_job(s)) return;
    double t0 = td_now_s();
    s->job_nbytes = 0;
    td_status st = upload(s, s->job_name, &s->job_n, &s->job_nbytes);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == TD_OK ? "" : td_error_msg());
    td_error_clear();
    report(s, st, msg, td_now_s() - t0, last);
}

/* Uploads every committed checkpoint S3 lacks, newest first (blocking); a failed one is marked
 * failed, so this ends. */
static void upload_all(td__ckpt_s3 *s) {
    while (next_job(s)) upload_now(s, false);
}

td_status td__ckpt_s3_resume(td__ckpt_s3 *s) {
    /* another node restores the step node 0 hands it (td__ckpt_s3_restore_step) */
    if (!s || !s->uploader) return TD_OK;
    td_aws_t *aws = NULL;
    join_upload(s);
    /* The node of rank 0 first puts its newest in S3, so that what the other nodes restore is
     * what its rank 0 resumes from. */
    upload_all(s);
    /* A restart's workers resume from the local copies anyway: S3 trouble now only warns. */
    td_status st = new_client(&aws);
    if (st == TD_OK) st = fetch_newer(s, aws);
    if (st != TD_OK) {
        TD_LOG_WARN("s3 checkpoints: before the restart: %s; resuming from the local copies",
                    td_error_msg());
        td_error_clear();
    }
    td_aws_free(aws);
    return TD_OK;
}

/* Whether dir holds a committed checkpoint of step (any kind). */
static bool have_step(const char *dir, int64_t step) {
    int n;
    td_ckpt_entry *v = td_ckpt_list(dir, TD_CKPT_ANY, &n);
    bool have = false;
    for (int i = 0; i < n && !have; i++) have = v[i].n.step == step;
    td_ckpt_list_free(v, n);
    return have;
}

td_status td__ckpt_s3_restore_step(td__ckpt_s3 *s, int64_t step) {
    if (!s || s->uploader) return TD_OK;
    td_aws_t *aws = NULL;
    td_s3_list all = {0};
    commit_ref *c = NULL;
    int n = 0, got = 0, tried = 0;
    bool have = step >= 0 && have_step(s->dir, step);
    if (have)
        TD_LOG_INFO("s3 checkpoints: this node holds the checkpoint of step %" PRId64
                    ", the step node 0 resumes from, in %s",
                    step, s->dir);
    td_status st = new_client(&aws);
    if (st == TD_OK) st = list_commits(s, aws, &c, &n, &all);
    for (int i = 0; st == TD_OK && i < n; i++) {
        bool stepped = c[i].n.step >= 0;
        /* that step's checkpoints (every kind that has it), and those without a step the
         * directory lacks (last.ckpt) */
        if (stepped ? (have || c[i].n.step != step) : td_ckpt_committed(s->dir, c[i].name, NULL))
            continue;
        char why[1024];
        int64_t nbytes;
        double t0 = td_now_s();
        if (stepped) tried++;
        if (restore_one(s, aws, &c[i], &nbytes, why, sizeof why)) {
            if (stepped) got++;
            TD_LOG_INFO("s3 checkpoints: downloaded %s (%" PRId64 " bytes, %.2f s) from %s%s",
                        c[i].name, nbytes, td_now_s() - t0, s->url,
                        stepped ? ": the step node 0 resumes from" : "");
        } else {
            TD_LOG_WARN("s3 checkpoints: skipping the committed %s of %s: %s", c[i].name, s->url,
                        why);
        }
    }
    if (st != TD_OK) {
        TD_LOG_WARN("s3 checkpoints: this node cannot restore step %" PRId64 " from %s: %s; its "
                    "workers read %s as it is",
                    step, s->url, td_error_msg(), s->dir);
        td_error_clear();
    } else if (step >= 0 && !have && !got) {
        TD_LOG_WARN("s3 checkpoints: %s holds no whole committed checkpoint of step %" PRId64
                    " (%d tried), the step node 0 resumes from, and %s lacks it: the SDK's "
                    "workers get it from rank 0; a framework reading its own directory does not",
                    s->url, step, tried, s->dir);
    }
    /* this node's own files of that step's directory checkpoints (ckpt_s3_ranks.c) */
    for (int i = 0; st == TD_OK && i < n; i++)
        if (c[i].n.is_dir && c[i].n.step == step)
            td__ckpt_ranks_restore(s->ranks, aws, c[i].name, step);
    free(c);
    td_s3_list_free(&all);
    td_aws_free(aws);
    return TD_OK;
}

void td__ckpt_s3_set_node(td__ckpt_s3 *s, int node) {
    if (s && !s->uploader && !s->ranks)
        s->ranks = td__ckpt_ranks_start(s->loop, s->url, s->bucket, s->prefix, s->dir, node);
}

void td__ckpt_s3_end(td__ckpt_s3 *s) {
    if (s && !s->uploader) td__ckpt_ranks_end(s->ranks);
    if (!s || !s->uploader) return;
    td_loop_cancel(s->loop, s->timer);
    s->timer = 0;
    join_upload(s); /* one in flight finishes (it may be the one we need) */
    upload_now(s, true);
}

void td__ckpt_s3_free(td__ckpt_s3 *s) {
    if (!s) return;
    if (s->loop) {
        /* an upload in flight ends first (its own client; nothing here aborts it): the agent
         * frees this before its loop, whose td_loop_free would wait for it as well */
        if (s->job) td_loop_cancel_work(s->loop, s->job);
        if (s->timer) td_loop_cancel(s->loop, s->timer);
    }
    for (int i = 0; i < s->ndone; i++) free(s->done[i].name);
    td__ckpt_ranks_free(s->ranks);
    for (int i = 0; i < s->nfailed; i++) free(s->failed[i].name);
    free(s->done);
    free(s->failed);
    free(s->url);
    free(s->bucket);
    free(s->prefix);
    free(s->dir);
    free(s);
}
