/* The files of a directory checkpoint that only another node's ranks wrote, kept in S3 next to
 * node 0's copy (docs/cloud.md "S3 checkpoints and artifacts", "What is mirrored from the other
 * nodes"). The S3 mirror (ckpt_s3.c) uploads from the node of rank 0 only; a framework that
 * writes one directory per checkpoint from every rank writes part of it on each node: the HF
 * Trainer's checkpoint-N/ holds the weights, optimizer, trainer_state.json and rank 0's
 * rng_state_0.pth on node 0, and only rng_state_R.pth on the node of rank R. Without these, a
 * replaced node's ranks resume with a fresh RNG (the Trainer logs "Didn't find an RNG file for
 * process R") and draw other dropout masks than the uninterrupted run.
 *
 * The rule, with no framework's names in it: on a node that is not the uploader, the regular
 * files of a local directory checkpoint (tandem/ckpt.h) that node 0's commit of the same name
 * does not list are this node's own. They go up write-then-commit like the rest: each file to
 * PREFIX/NAME/.tandem-node-K/REL, then PREFIX/NAME/.tandem-node-K.commit (the addendum) naming
 * each one's size and SHA-256. Both keys lie below PREFIX/NAME/, so the mirror's prune, which
 * deletes every key of an old checkpoint, takes them with it, and node 0's restore, which takes
 * only the files its commit names, never sees them.
 *
 * When such a file is whole: it has no commit marker of its own on this node (the framework
 * commits the directory on node 0 only), so it is taken as whole once (1) node 0's commit of
 * the checkpoint is in S3: node 0's agent commits only a directory holding its marker, which
 * the framework writes after its own rank's files, at the same point of the step as every
 * rank's, and (2) none of this node's files of it changed between two scans (SCAN_PERIOD_S
 * apart: a file still being written grows). At the agent's end (1) alone: the workers are gone,
 * so nothing is being written.
 *
 * Only the newest such checkpoint matters (a resume takes node 0's newest): once one is up
 * (or restored, or found to hold nothing of this node's), older ones are never uploaded. The
 * uploads are work on the agent's loop's threads (td_loop_queue_work: the AWS calls block; the
 * loop must not), one at a time. */
#include "launch_internal.h"

#include "tandem/ckpt.h"
#include "tandem/cloud.h"
#include "tandem/loop.h"
#include "tandem/os.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How often the local directory is looked at (the mirror's own period). */
#define SCAN_PERIOD_S 0.5
/* How long to wait before asking S3 again for node 0's commit that was not there yet. */
#define RETRY_NOT_YET_S 1.0
/* The longest wait after failed uploads (doubling from 1 s). */
#define RETRY_MAX_S 30.0

typedef enum { JOB_UPLOADED, JOB_NOT_YET, JOB_NOTHING, JOB_FAILED } job_result;

struct td__ckpt_ranks {
    char *url, *bucket, *prefix, *dir; /* the mirror's (prefix "P/" or "") */
    int node;                          /* this node's group rank: the addendum's K */
    td_loop *loop;
    uint64_t timer;
    int64_t floor; /* the newest step whose files are settled (up, restored, or none): -1 none */
    /* the previous scan's view of the newest checkpoint above floor */
    char cand[256];
    td__ckpt_files prev;
    double next_try_s, backoff_s;
    /* the upload in flight (0: none); job_* are the work's until its after() ran or
     * td_loop_cancel_work returned */
    uint64_t job;
    bool job_started;
    char job_name[256];
    int64_t job_step;
    job_result job_res;
    int job_count;
    int64_t job_nbytes;
    double job_s;
    char job_names[512]; /* the files, for the log line */
    char job_msg[1024];
};

/* A node's own files: none whose name along the way begins with '.' (tandem's marker, writers'
 * temporaries); td_s3_get_file's own temporaries (NAME.tdpart.XXXXXX, left by a restore killed
 * mid-download) are none of the node's files either. */
static bool own_name(const char *name, bool top) {
    (void)top;
    return name[0] != '.' && !strstr(name, ".tdpart.");
}

static int cmp_sig(const void *a, const void *b) {
    return strcmp(((const td__ckpt_file *)a)->rel, ((const td__ckpt_file *)b)->rel);
}

static bool sigs_same(const td__ckpt_files *a, const td__ckpt_files *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->v[i].rel, b->v[i].rel) ||
            memcmp(a->v[i].sig, b->v[i].sig, sizeof a->v[i].sig))
            return false;
    return true;
}

/* The newest directory checkpoint in dir above floor that holds any file (name: 256 bytes),
 * its files sorted; false when none. */
static bool newest_above(const char *dir, int64_t floor, char name[256], int64_t *step,
                         td__ckpt_files *files) {
    DIR *d = opendir(dir);
    if (!d) return false;
    *step = -1;
    for (struct dirent *e; (e = readdir(d));) {
        td_ckpt_name n;
        if (!td_ckpt_parse(e->d_name, &n) || !n.is_dir || n.step <= floor || n.step <= *step ||
            strlen(e->d_name) >= 256)
            continue;
        *step = n.step;
        snprintf(name, 256, "%s", e->d_name);
    }
    closedir(d);
    if (*step < 0) return false;
    char *p = td_xasprintf("%s/%s", dir, name);
    td__ckpt_walk(p, own_name, files);
    free(p);
    qsort(files->v, (size_t)files->n, sizeof *files->v, cmp_sig);
    return files->n > 0;
}

/* A commit object at key into *text, read through a hidden file in dir (the mirror's
 * ".s3commit-" leftovers rule removes one an agent killed here left); TD_ERR_NOTFOUND when S3
 * has no such key. */
static td_status get_text(td_aws_t *aws, const char *bucket, const char *key, const char *dir,
                          char **text) {
    char *tmp = td_xasprintf("%s/.s3commit-node-%ld", dir, (long)getpid());
    *text = NULL;
    td_status st = td_s3_get_file(aws, bucket, key, tmp, NULL);
    if (st == TD_OK && !(*text = td__ckpt_slurp(tmp)))
        st = td_error_errno(TD_ERR_IO, "reading %s, a copy of s3 object %s", tmp, key);
    (void)unlink(tmp);
    free(tmp);
    return st;
}

/* Whether a commit's text ("file NBYTES SHA256 REL" lines: node 0's commit or an addendum)
 * names rel. */
static bool commit_lists(const char *text, const char *rel) {
    for (const char *line = text; line && *line;) {
        long long nb;
        char sha[65];
        int off = 0;
        if (sscanf(line, "file %lld %64[0-9a-f] %n", &nb, sha, &off) == 2 && off > 0) {
            const char *r = line + off, *nl = strchr(r, '\n');
            size_t len = nl ? (size_t)(nl - r) : strlen(r);
            if (len == strlen(rel) && !strncmp(r, rel, len)) return true;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return false;
}

static char *addendum_key(const td__ckpt_ranks *r, const char *name) {
    return td_xasprintf("%s%s/.tandem-node-%d.commit", r->prefix, name, r->node);
}

/* Appends ", rel" to the list in buf (cut at nbytes: it is for a log line). */
static void names_add(char *buf, size_t nbytes, const char *rel) {
    size_t len = strlen(buf);
    for (const char *p = len ? ", " : ""; *p && len + 1 < nbytes; p++) buf[len++] = *p;
    for (const char *p = rel; *p && len + 1 < nbytes; p++) buf[len++] = *p;
    buf[len] = '\0';
}

/* Uploads and commits this node's files of dir/name (the blocking body of the work, and the
 * agent's last upload): those node 0's commit of name does not list, held aside by a hard
 * link for the upload, then the addendum. */
static job_result upload_own(td__ckpt_ranks *r, const char *name, int64_t step, int *count,
                             int64_t *nbytes, char *names, size_t names_n) {
    td_aws_t *aws = NULL;
    td_aws_opts o;
    memset(&o, 0, sizeof o);
    char *ckey = td_xasprintf("%s%s.commit", r->prefix, name);
    char *base = td_xasprintf("%s/%s", r->dir, name);
    char *node0 = NULL, *addendum = td_xstrdup("");
    td__ckpt_files files = {0};
    job_result res = JOB_FAILED;
    *count = 0;
    *nbytes = 0;
    names[0] = '\0';
    if (td_aws_new(&o, &aws) != TD_OK) goto out;
    td_status gst = get_text(aws, r->bucket, ckey, r->dir, &node0);
    if (gst == TD_ERR_NOTFOUND) {
        td_error_clear();
        res = JOB_NOT_YET;
    }
    if (gst != TD_OK) goto out;
    td__ckpt_walk(base, own_name, &files);
    qsort(files.v, (size_t)files.n, sizeof *files.v, cmp_sig);
    for (int i = 0; i < files.n; i++) {
        if (commit_lists(node0, files.v[i].rel)) continue;
        char *path = td_xasprintf("%s/%s", base, files.v[i].rel);
        char *key = td_xasprintf("%s%s/.tandem-node-%d/%s", r->prefix, name, r->node,
                                 files.v[i].rel);
        char sha[65];
        int64_t size = 0;
        td_status st = td__ckpt_put_held(aws, r->bucket, r->dir, "node-", path, key, &size, sha);
        free(path);
        free(key);
        if (st != TD_OK) goto out;
        char *more = td_xasprintf("%sfile %" PRId64 " %s %s\n", addendum, size, sha,
                                  files.v[i].rel);
        free(addendum);
        addendum = more;
        (*count)++;
        *nbytes += size;
        names_add(names, names_n, files.v[i].rel);
    }
    if (!*count) {
        res = JOB_NOTHING;
        goto out;
    }
    /* The addendum: written only once every file is whole in S3; what a restore checks by. */
    char *text = td_xasprintf("tandem-node-files 1\nobject %s/\nnode %d\nstep %" PRId64
                              "\nfiles %d\n%s",
                              name, r->node, step, *count, addendum);
    char *akey = addendum_key(r, name);
    td_status st = td_s3_put_buffer(aws, r->bucket, akey, text, strlen(text));
    free(akey);
    free(text);
    if (st == TD_OK) res = JOB_UPLOADED;
out:
    td__ckpt_files_free(&files);
    td_aws_free(aws);
    free(node0);
    free(addendum);
    free(base);
    free(ckey);
    return res;
}

static void upload_work(void *user) {
    td__ckpt_ranks *r = user;
    r->job_started = true;
    double t0 = td_now_s();
    r->job_res = upload_own(r, r->job_name, r->job_step, &r->job_count, &r->job_nbytes,
                            r->job_names, sizeof r->job_names);
    r->job_s = td_now_s() - t0;
    snprintf(r->job_msg, sizeof r->job_msg, "%s", r->job_res == JOB_FAILED ? td_error_msg() : "");
    td_error_clear();
}

/* last: the agent's own upload as it ends. */
static void report(td__ckpt_ranks *r, bool last) {
    switch (r->job_res) {
    case JOB_UPLOADED:
        TD_LOG_INFO("s3 checkpoints: uploaded this node's %d file(s) of %s that node 0's commit "
                    "lacks (%s; %" PRId64 " bytes, %.2f s) to %s/%s/.tandem-node-%d/ and "
                    "committed them (.tandem-node-%d.commit)%s",
                    r->job_count, r->job_name, r->job_names, r->job_nbytes, r->job_s, r->url,
                    r->job_name, r->node, r->node, last ? ", as the agent ends" : "");
        /* fallthrough */
    case JOB_NOTHING:
        if (r->job_step > r->floor) r->floor = r->job_step;
        r->backoff_s = 0;
        r->next_try_s = 0;
        break;
    case JOB_NOT_YET:
        r->next_try_s = td_now_s() + RETRY_NOT_YET_S;
        if (last)
            TD_LOG_WARN("s3 checkpoints: the agent ends before node 0 committed %s to %s: this "
                        "node's files of it stay only in %s/%s",
                        r->job_name, r->url, r->dir, r->job_name);
        break;
    case JOB_FAILED:
        r->backoff_s = r->backoff_s ? TD_MIN(r->backoff_s * 2, RETRY_MAX_S) : 1.0;
        r->next_try_s = td_now_s() + r->backoff_s;
        TD_LOG_WARN("s3 checkpoints: uploading this node's files of %s to %s failed after %.2f s "
                    "(%s); %s",
                    r->job_name, r->url, r->job_s, r->job_msg,
                    last ? "a resume of this node's ranks from it goes on without them"
                         : "training goes on, and the upload is tried again");
        break;
    }
}

static void upload_done(td_loop *l, void *user) {
    (void)l;
    td__ckpt_ranks *r = user;
    r->job = 0;
    report(r, false);
}

/* Off the loop: the upload in flight finishes and is said; one still queued never starts. */
static void join(td__ckpt_ranks *r) {
    if (!r->job) return;
    td_loop_cancel_work(r->loop, r->job); /* waits for it when it runs */
    r->job = 0;
    if (r->job_started) report(r, false);
}

static void on_scan(td_loop *l, void *user) {
    td__ckpt_ranks *r = user;
    if (r->job || td_now_s() < r->next_try_s) return;
    char name[256];
    int64_t step;
    td__ckpt_files now = {0};
    if (!newest_above(r->dir, r->floor, name, &step, &now)) {
        td__ckpt_files_free(&now);
        td__ckpt_files_free(&r->prev);
        r->cand[0] = '\0';
        return;
    }
    /* whole once unchanged since the last scan (and node 0's commit is in S3: the work asks) */
    bool settled = !strcmp(name, r->cand) && sigs_same(&now, &r->prev);
    td__ckpt_files_free(&r->prev);
    r->prev = now;
    snprintf(r->cand, sizeof r->cand, "%s", name);
    if (!settled) return;
    snprintf(r->job_name, sizeof r->job_name, "%s", name);
    r->job_step = step;
    r->job_started = false;
    r->job = td_loop_queue_work(l, upload_work, upload_done, r);
    if (!r->job) {
        TD_LOG_WARN("s3 checkpoints: cannot queue the upload of this node's files of %s (%s); "
                    "trying again",
                    name, td_error_msg());
        td_error_clear();
    }
}

td__ckpt_ranks *td__ckpt_ranks_start(td_loop *loop, const char *url, const char *bucket,
                                     const char *prefix, const char *dir, int node) {
    td__ckpt_ranks *r = td_xcalloc(1, sizeof *r);
    r->url = td_xstrdup(url);
    r->bucket = td_xstrdup(bucket);
    r->prefix = td_xstrdup(prefix);
    r->dir = td_xstrdup(dir);
    r->node = node;
    r->loop = loop;
    r->floor = -1;
    r->timer = td_loop_timer(loop, SCAN_PERIOD_S, SCAN_PERIOD_S, on_scan, r);
    return r;
}

void td__ckpt_ranks_end(td__ckpt_ranks *r) {
    if (!r) return;
    td_loop_cancel(r->loop, r->timer);
    r->timer = 0;
    join(r);
    td__ckpt_files files = {0};
    char name[256];
    int64_t step;
    if (newest_above(r->dir, r->floor, name, &step, &files)) {
        snprintf(r->job_name, sizeof r->job_name, "%s", name);
        r->job_step = step;
        double t0 = td_now_s();
        r->job_res = upload_own(r, name, step, &r->job_count, &r->job_nbytes, r->job_names,
                                sizeof r->job_names);
        r->job_s = td_now_s() - t0;
        snprintf(r->job_msg, sizeof r->job_msg, "%s",
                 r->job_res == JOB_FAILED ? td_error_msg() : "");
        td_error_clear();
        report(r, true);
    }
    td__ckpt_files_free(&files);
}

/* Whether dir/name holds a file that node0 (node 0's commit's text, may be NULL) lacks. */
static bool holds_own(const char *dir, const char *name, const char *node0) {
    char *base = td_xasprintf("%s/%s", dir, name);
    td__ckpt_files files = {0};
    td__ckpt_walk(base, own_name, &files);
    bool own = false;
    for (int i = 0; i < files.n && !own; i++) own = !node0 || !commit_lists(node0, files.v[i].rel);
    td__ckpt_files_free(&files);
    free(base);
    return own;
}

void td__ckpt_ranks_restore(td__ckpt_ranks *r, td_aws_t *aws, const char *name, int64_t step) {
    if (!r) return;
    join(r);
    char *akey = addendum_key(r, name);
    char *ckey = td_xasprintf("%s%s.commit", r->prefix, name);
    char *node0 = NULL, *text = NULL;
    (void)get_text(aws, r->bucket, ckey, r->dir, &node0);
    td_error_clear();
    td_status gst = get_text(aws, r->bucket, akey, r->dir, &text);
    char lost[512] = "", got_names[512] = "";
    int listed = -1, lines = 0, got = 0, kept = 0;
    if (gst != TD_OK) {
        bool missing = gst == TD_ERR_NOTFOUND;
        if (holds_own(r->dir, name, node0))
            TD_LOG_INFO("s3 checkpoints: %s/%s %s; this node keeps its own files of %s", r->url,
                        akey + strlen(r->prefix), missing ? "does not exist" : "is unreadable",
                        name);
        else
            TD_LOG_WARN("s3 checkpoints: this node's files of %s (those only its ranks wrote, "
                        "e.g. the HF Trainer's rng_state_R.pth) are lost: %s/%s %s%s%s; its "
                        "ranks resume %s without them (a fresh RNG: the run's bits then differ "
                        "from an uninterrupted one's)",
                        name, r->url, akey + strlen(r->prefix),
                        missing ? "does not exist" : "cannot be read (",
                        missing ? "" : td_error_msg(), missing ? "" : ")", name);
        td_error_clear();
        goto out;
    }
    for (char *line = text; line && *line;) {
        long long nb;
        char sha[65], rel[1024];
        if (sscanf(line, "files %d", &listed) != 1 &&
            sscanf(line, "file %lld %64[0-9a-f] %1023[^\n]", &nb, sha, rel) == 3) {
            lines++;
            char *path = td_xasprintf("%s/%s/%s", r->dir, name, rel);
            char have[65] = "";
            struct stat sb;
            if (!td__ckpt_safe_rel(rel) || strlen(sha) != 64) {
                names_add(lost, sizeof lost, rel);
                TD_LOG_WARN("s3 checkpoints: %s/%s names a file %.200s that tandem would not "
                            "write; not restored",
                            r->url, akey + strlen(r->prefix), rel);
            } else if (stat(path, &sb) == 0 && sb.st_size == nb &&
                       td_aws_sha256_file(path, 0, nb, have) == TD_OK && !strcmp(have, sha)) {
                kept++; /* this node's own, as it wrote it */
            } else {
                char *key = td_xasprintf("%s%s/.tandem-node-%d/%s", r->prefix, name, r->node, rel);
                char *parent = td_xstrdup(path);
                *strrchr(parent, '/') = '\0';
                td_s3_object o = {0};
                if (td_mkdirs(parent) != TD_OK ||
                    td_s3_get_file(aws, r->bucket, key, path, &o) != TD_OK) {
                    names_add(lost, sizeof lost, rel);
                    TD_LOG_WARN("s3 checkpoints: this node's %s/%s is lost: %s", name, rel,
                                td_error_msg());
                } else if (o.nbytes != nb || strcmp(o.sha256_hex, sha)) {
                    (void)unlink(path);
                    names_add(lost, sizeof lost, rel);
                    TD_LOG_WARN("s3 checkpoints: this node's %s/%s is lost: s3://%s/%s differs "
                                "from what %s/%s says (size or sha256)",
                                name, rel, r->bucket, key, r->url, akey + strlen(r->prefix));
                } else {
                    got++;
                    names_add(got_names, sizeof got_names, rel);
                }
                td_error_clear();
                td_s3_object_free(&o);
                free(parent);
                free(key);
            }
            free(path);
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    if (listed != lines)
        TD_LOG_WARN("s3 checkpoints: %s/%s is not one tandem wrote (files %d, %d listed); what "
                    "it names was checked one by one",
                    r->url, akey + strlen(r->prefix), listed, lines);
    if (got)
        TD_LOG_INFO("s3 checkpoints: downloaded this node's %d file(s) of %s that node 0's "
                    "commit lacks (%s) from %s/%s/.tandem-node-%d/%s",
                    got, name, got_names, r->url, name, r->node,
                    kept ? " (the others it holds already)" : "");
    else if (!lost[0])
        TD_LOG_INFO("s3 checkpoints: this node holds its own %d file(s) of %s already", kept,
                    name);
    if (lost[0])
        TD_LOG_WARN("s3 checkpoints: this node's ranks resume %s without %s (only this node "
                    "wrote them; e.g. the HF Trainer's RNG states: a fresh RNG)",
                    name, lost);
out:
    if (step > r->floor) r->floor = step; /* settled: never uploaded again from here */
    free(text);
    free(node0);
    free(ckey);
    free(akey);
}

void td__ckpt_ranks_free(td__ckpt_ranks *r) {
    if (!r) return;
    if (r->job) td_loop_cancel_work(r->loop, r->job);
    if (r->timer) td_loop_cancel(r->loop, r->timer);
    td__ckpt_files_free(&r->prev);
    free(r->url);
    free(r->bucket);
    free(r->prefix);
    free(r->dir);
    free(r);
}
