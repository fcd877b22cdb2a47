/* Node 0's checkpoints kept in S3 (TANDEM_CHECKPOINT_URL, docs/cloud.md "S3 checkpoints and
 * artifacts"). The workers keep writing to the local TANDEM_CHECKPOINT_DIR; the agent of the node
 * that holds rank 0 mirrors it to s3://BUCKET/PREFIX:
 *   - at its start it checks the bucket (a missing bucket or refused credentials end the run
 *     before any training), and on a resume downloads the newest committed checkpoint when it
 *     is newer than the local newest (a fresh machine, or local copies deleted);
 *   - while the workers train, each new newest checkpoint is uploaded on a thread of its own
 *     (the AWS calls block; the agent's loop must not), its result coming back through a pipe
 *     the loop watches; a failure is a warning and the next checkpoint tries again;
 *   - at the agent's end, the checkpoint a stop or preemption made is uploaded before it exits.
 * Write-then-commit: PREFIX/ckpt-STEP.tdck first, then PREFIX/ckpt-STEP.tdck.commit naming its
 * size and SHA-256. A resume takes the newest commit whose object matches it, so an upload cut
 * short (a spot instance gone mid-PUT, a failed part) is never picked. The newest KEEP commits
 * stay; older checkpoints are deleted after each commit. */
#include "launch_internal.h"

#include "tandem/cloud.h"
#include "tandem/loop.h"
#include "tandem/os.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Committed checkpoints kept in S3: a few, so that one the trainer finds corrupt on resume
 * (it then takes the previous one) still has an older one behind it. */
#define KEEP_COMMITTED 3
/* How often the local directory is looked at for a new checkpoint. */
#define SCAN_PERIOD_S 0.5

struct td__ckpt_s3 {
    char *url;    /* s3://bucket/prefix as given, for messages */
    char *bucket; /* "b" */
    char *prefix; /* "prefix/" or "" */
    char *dir;    /* the local TANDEM_CHECKPOINT_DIR */
    td_loop *loop;
    uint64_t timer;
    int pipe_rd, pipe_wr; /* the upload thread's "done" byte */
    /* The upload in flight: owned by its thread until the done byte is read. */
    pthread_t thread;
    bool busy;
    int64_t job_step;
    td_status job_st;
    char job_msg[1024];
    int64_t job_nbytes;
    double job_s;
    int64_t committed; /* newest step committed by this agent or found in S3; -1: none */
    int64_t tried;     /* newest step whose upload failed: the next newer one tries again */
};

/* The newest complete checkpoint in dir: the highest STEP of the files named exactly
 * ckpt-STEP.tdck (the trainer writes them aside and renames, so a name that exists is whole).
 * -1 when none. The agent link picks what it sends up by the same rule. */
int64_t td__ckpt_newest_step(const char *dir) {
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return -1;
    long long newest = -1, step;
    int used;
    for (struct dirent *e; (e = readdir(d));)
        if (sscanf(e->d_name, "ckpt-%lld.tdck%n", &step, &used) == 1 &&
            used == (int)strlen(e->d_name) && step > newest)
            newest = step;
    closedir(d);
    return newest;
}

static td_status new_client(td_aws_t **out) {
    td_aws_opts o;
    memset(&o, 0, sizeof o);
    return td_aws_new(&o, out);
}

/* A step from a key below the prefix: "ckpt-STEP.tdck" + suffix. */
static bool key_step(const td__ckpt_s3 *s, const char *key, const char *suffix, int64_t *step) {
    size_t np = strlen(s->prefix);
    if (strncmp(key, s->prefix, np)) return false;
    const char *name = key + np;
    long long v;
    int used;
    if (sscanf(name, "ckpt-%lld.tdck%n", &v, &used) != 1 || v < 0) return false;
    if (strcmp(name + used, suffix)) return false;
    *step = v;
    return true;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The committed steps in S3, newest first (caller frees). */
static td_status list_commits(td__ckpt_s3 *s, td_aws_t *aws, int64_t **steps, int *n,
                              td_s3_list *all) {
    TD_CHECK(td_s3_list_objects(aws, s->bucket, s->prefix, 0, all));
    *steps = td_xcalloc((size_t)all->count + 1, sizeof **steps);
    *n = 0;
    for (int i = 0; i < all->count; i++) {
        int64_t step;
        if (key_step(s, all->items[i].key, ".commit", &step)) (*steps)[(*n)++] = step;
    }
    qsort(*steps, (size_t)*n, sizeof **steps, cmp_desc);
    return TD_OK;
}

/* Deletes the checkpoints older than the newest KEEP_COMMITTED commits (the commit first, so
 * that no commit names a deleted object), and objects left without a commit below them. */
static void prune(td__ckpt_s3 *s, td_aws_t *aws) {
    td_s3_list all = {0};
    int64_t *steps = NULL;
    int n = 0;
    if (list_commits(s, aws, &steps, &n, &all) != TD_OK) {
        TD_LOG_WARN("s3 checkpoints: listing %s to delete old checkpoints: %s", s->url,
                    td_error_msg());
        td_error_clear();
        goto out;
    }
    if (n <= KEEP_COMMITTED) goto out;
    int64_t oldest_kept = steps[KEEP_COMMITTED - 1];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < all.count; i++) {
            int64_t step;
            if (!key_step(s, all.items[i].key, pass == 0 ? ".commit" : "", &step) ||
                step >= oldest_kept)
                continue;
            if (td_s3_delete(aws, s->bucket, all.items[i].key) != TD_OK) {
                TD_LOG_WARN("s3 checkpoints: deleting old s3://%s/%s: %s", s->bucket,
                            all.items[i].key, td_error_msg());
                td_error_clear();
            }
        }
out:
    free(steps);
    td_s3_list_free(&all);
}

/* Uploads and commits ckpt-STEP.tdck (blocking: the thread's body, and the agent's last
 * upload). The file is hard-linked aside first: the trainer deletes all but its newest two, and
 * a fast trainer could delete this one mid-upload. */
static td_status upload(td__ckpt_s3 *s, int64_t step, int64_t *nbytes) {
    char *path = td_xasprintf("%s/ckpt-%" PRId64 ".tdck", s->dir, step);
    char *held = td_xasprintf("%s/.s3up-ckpt-%" PRId64 ".tdck.%ld", s->dir, step, (long)getpid());
    char *key = td_xasprintf("%sckpt-%" PRId64 ".tdck", s->prefix, step);
    char *commit_key = td_xasprintf("%s.commit", key);
    char *commit = NULL;
    td_aws_t *aws = NULL;
    td_status st = TD_OK;
    (void)unlink(held);
    if (link(path, held) != 0) {
        if (errno == ENOENT) {
            st = td_error_errno(TD_ERR_IO, "s3 checkpoints: holding %s for its upload", path);
            goto out;
        }
        /* no hard links here (EPERM, EXDEV, ...): upload the file itself; a change under the
         * upload is still refused by td_s3_put_file */
        free(held);
        held = td_xstrdup(path);
        free(path);
        path = NULL;
    }
    struct stat sb;
    if (stat(held, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "s3 checkpoints: %s", held);
        goto out;
    }
    *nbytes = (int64_t)sb.st_size;
    TD_CHECK_GOTO(new_client(&aws), st, out);
    char sha[65];
    TD_CHECK_GOTO(td_s3_put_file(aws, s->bucket, key, held, sha), st, out);
    /* The commit: written only once the object is whole; what a resume checks the object by. */
    commit = td_xasprintf("tandem-checkpoint-commit 1\nobject ckpt-%" PRId64 ".tdck\nstep %" PRId64
                          "\nnbytes %" PRId64 "\nsha256 %s\n",
                          step, step, *nbytes, sha);
    TD_CHECK_GOTO(td_s3_put_buffer(aws, s->bucket, commit_key, commit, strlen(commit)), st, out);
    prune(s, aws);
out:
    if (path) (void)unlink(held); /* the hard link, never the checkpoint itself */
    td_aws_free(aws);
    free(commit);
    free(commit_key);
    free(key);
    free(held);
    free(path);
    return st;
}

static void *upload_thread(void *arg) {
    td__ckpt_s3 *s = arg;
    double t0 = td_now_s();
    s->job_nbytes = 0;
    s->job_st = upload(s, s->job_step, &s->job_nbytes);
    s->job_s = td_now_s() - t0;
    snprintf(s->job_msg, sizeof s->job_msg, "%s", s->job_st == TD_OK ? "" : td_error_msg());
    td_error_clear();
    char one = 1;
    while (write(s->pipe_wr, &one, 1) < 0 && errno == EINTR) {
    }
    return NULL;
}

/* last: the agent's own upload as it ends (nothing comes after it). */
static void report(td__ckpt_s3 *s, int64_t step, td_status st, const char *msg, int64_t nbytes,
                   double secs, bool last) {
    if (st == TD_OK) {
        if (step > s->committed) s->committed = step;
        TD_LOG_INFO("s3 checkpoints: uploaded ckpt-%" PRId64 ".tdck (%" PRId64
                    " bytes, %.2f s) to %s/ckpt-%" PRId64 ".tdck and committed it%s",
                    step, nbytes, secs, s->url, step, last ? ": the last, as the agent ends" : "");
        return;
    }
    if (step > s->tried) s->tried = step;
    if (!last) {
        TD_LOG_WARN("s3 checkpoints: uploading ckpt-%" PRId64 ".tdck to %s failed after %.2f s "
                    "(%s); training goes on, and the next checkpoint tries again",
                    step, s->url, secs, msg);
    } else if (s->committed >= 0) {
        TD_LOG_WARN("s3 checkpoints: uploading the last checkpoint ckpt-%" PRId64 ".tdck to %s "
                    "failed after %.2f s (%s); a resume from S3 starts at ckpt-%" PRId64
                    ".tdck, the newest committed; this node keeps ckpt-%" PRId64 ".tdck in %s",
                    step, s->url, secs, msg, s->committed, step, s->dir);
    } else {
        TD_LOG_WARN("s3 checkpoints: uploading the last checkpoint ckpt-%" PRId64 ".tdck to %s "
                    "failed after %.2f s (%s); S3 holds no checkpoint of this run; this node "
                    "keeps it in %s",
                    step, s->url, secs, msg, s->dir);
    }
}

/* The upload thread is done: join it, say how it went. */
static void join_upload(td__ckpt_s3 *s) {
    if (!s->busy) return;
    pthread_join(s->thread, NULL);
    s->busy = false;
    char buf[16];
    while (read(s->pipe_rd, buf, sizeof buf) > 0) {
    }
    report(s, s->job_step, s->job_st, s->job_msg, s->job_nbytes, s->job_s, false);
}

static void on_done(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    join_upload(user);
}

static void on_scan(td_loop *l, void *user) {
    (void)l;
    td__ckpt_s3 *s = user;
    if (s->busy) return;
    int64_t newest = td__ckpt_newest_step(s->dir);
    if (newest < 0 || newest <= s->committed || newest <= s->tried) return;
    s->job_step = newest;
    int rc = pthread_create(&s->thread, NULL, upload_thread, s);
    if (rc != 0) {
        TD_LOG_WARN("s3 checkpoints: cannot start the upload thread (%s); trying again",
                    strerror(rc));
        return;
    }
    s->busy = true;
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

/* The newest committed checkpoint in S3, downloaded when it is newer than the local newest. */
static td_status fetch_newer(td__ckpt_s3 *s, td_aws_t *aws) {
    int64_t local = td__ckpt_newest_step(s->dir);
    td_s3_list all = {0};
    int64_t *steps = NULL;
    int n = 0;
    td_status st = list_commits(s, aws, &steps, &n, &all);
    if (st != TD_OK) {
        st = check_error(s, aws, st);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int64_t step = steps[i];
        if (step <= local) {
            if (step == local) s->committed = local; /* already there: not uploaded again */
            TD_LOG_INFO("s3 checkpoints: the local ckpt-%" PRId64 ".tdck is as new as the "
                        "newest committed in %s (step %" PRId64 ")",
                        local, s->url, steps[0]);
            break;
        }
        char *key = td_xasprintf("%sckpt-%" PRId64 ".tdck", s->prefix, step);
        char *ckey = td_xasprintf("%s.commit", key);
        char *tmp = td_xasprintf("%s/.s3commit-%" PRId64 ".%ld", s->dir, step, (long)getpid());
        char *path = td_xasprintf("%s/ckpt-%" PRId64 ".tdck", s->dir, step);
        long long c_nbytes = -1;
        char c_sha[65] = "";
        td_s3_object head = {0}, got = {0};
        bool ok = false;
        const char *why = "";
        double t0 = td_now_s();
        if (td_s3_get_file(aws, s->bucket, ckey, tmp, NULL) == TD_OK) {
            FILE *f = fopen(tmp, "r");
            char line[256];
            while (f && fgets(line, sizeof line, f)) {
                if (sscanf(line, "nbytes %lld", &c_nbytes) == 1) continue;
                (void)sscanf(line, "sha256 %64[0-9a-f]", c_sha);
            }
            if (f) fclose(f);
            (void)unlink(tmp);
            if (c_nbytes < 0 || strlen(c_sha) != 64)
                why = "the commit object is not one tandem wrote";
            else if (td_s3_head(aws, s->bucket, key, &head) != TD_OK)
                why = td_error_msg();
            else if (head.nbytes != c_nbytes || strcmp(head.sha256_hex, c_sha))
                why = "the object differs from what its commit says (size or sha256)";
            else if (td_s3_get_file(aws, s->bucket, key, path, &got) != TD_OK)
                why = td_error_msg();
            else if (strcmp(got.sha256_hex, c_sha)) {
                (void)unlink(path);
                why = "the downloaded bytes differ from the commit's sha256";
            } else
                ok = true;
        } else {
            why = td_error_msg();
        }
        if (ok) s->committed = step;
        if (ok)
            TD_LOG_INFO("s3 checkpoints: downloaded ckpt-%" PRId64 ".tdck (%lld bytes, %.2f s) "
                        "from %s: newer than the local %s",
                        step, c_nbytes, td_now_s() - t0, s->url,
                        local < 0 ? "directory (no checkpoint)" : "newest");
        else
            TD_LOG_WARN("s3 checkpoints: skipping the committed ckpt-%" PRId64 ".tdck of %s: %s",
                        step, s->url, why);
        td_error_clear();
        td_s3_object_free(&head);
        td_s3_object_free(&got);
        free(key);
        free(ckey);
        free(tmp);
        free(path);
        if (ok) break;
    }
    if (!n)
        TD_LOG_INFO("s3 checkpoints: %s holds no committed checkpoint yet%s", s->url,
                    local >= 0 ? "; the local ones are used" : "");
out:
    free(steps);
    td_s3_list_free(&all);
    return st;
}

/* What an agent killed mid-upload or mid-download left in dir (its hard links, commit copies,
 * partial downloads): only this node's rank-0 agent makes them, and it is starting. */
static void remove_leftovers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        /* (td_s3_get_file's temporaries are NAME.tdpart.XXXXXX) */
        bool download = !strncmp(e->d_name, "ckpt-", 5) && strstr(e->d_name, ".tdck.tdpart.");
        if (strncmp(e->d_name, ".s3up-ckpt-", 11) && strncmp(e->d_name, ".s3commit-", 10) &&
            !download)
            continue;
        char *p = td_xasprintf("%s/%s", dir, e->d_name);
        if (unlink(p) == 0) TD_LOG_INFO("s3 checkpoints: removed %s, left by an earlier agent", p);
        free(p);
    }
    closedir(d);
}

td_status td__ckpt_s3_open(td_loop *loop, bool resume, td__ckpt_s3 **out) {
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
    s->loop = loop;
    s->committed = s->tried = -1;
    s->pipe_rd = s->pipe_wr = -1;
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
    if (st == TD_OK && resume) {
        st = fetch_newer(s, aws);
    } else if (st == TD_OK) {
        td_s3_list l = {0};
        st = td_s3_list_objects(aws, s->bucket, s->prefix, 1, &l);
        if (st != TD_OK) st = check_error(s, aws, st);
        td_s3_list_free(&l);
    }
    td_aws_free(aws);
    int fds[2];
    if (st == TD_OK && pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
        st = td_error_errno(TD_ERR_SYS, "s3 checkpoints: pipe");
    if (st == TD_OK) {
        s->pipe_rd = fds[0];
        s->pipe_wr = fds[1];
        st = td_loop_watch(loop, s->pipe_rd, TD_LOOP_READ, on_done, s);
    }
    if (st != TD_OK) {
        td__ckpt_s3_free(s);
        return st;
    }
    s->timer = td_loop_timer(loop, SCAN_PERIOD_S, SCAN_PERIOD_S, on_scan, s);
    TD_LOG_INFO("s3 checkpoints: %s is mirrored to %s (bucket checked)", s->dir, s->url);
    *out = s;
    return TD_OK;
}

td_status td__ckpt_s3_resume(td__ckpt_s3 *s) {
    if (!s) return TD_OK;
    td_aws_t *aws = NULL;
    join_upload(s);
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

void td__ckpt_s3_end(td__ckpt_s3 *s) {
    if (!s) return;
    td_loop_cancel(s->loop, s->timer);
    s->timer = 0;
    join_upload(s); /* one in flight finishes (it may be the one we need) */
    int64_t newest = td__ckpt_newest_step(s->dir);
    if (newest < 0 || newest <= s->committed) return;
    double t0 = td_now_s();
    int64_t nbytes = 0;
    td_status st = upload(s, newest, &nbytes);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == TD_OK ? "" : td_error_msg());
    td_error_clear();
    report(s, newest, st, msg, nbytes, td_now_s() - t0, true);
}

void td__ckpt_s3_free(td__ckpt_s3 *s) {
    if (!s) return;
    if (s->busy) {
        pthread_join(s->thread, NULL);
        s->busy = false;
    }
    if (s->loop) {
        td_loop_cancel(s->loop, s->timer);
        if (s->pipe_rd >= 0) td_loop_unwatch(s->loop, s->pipe_rd);
    }
    if (s->pipe_rd >= 0) close(s->pipe_rd);
    if (s->pipe_wr >= 0) close(s->pipe_wr);
    free(s->url);
    free(s->bucket);
    free(s->prefix);
    free(s->dir);
    free(s);
}
