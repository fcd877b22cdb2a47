/* A run's store kept in S3 (tandem run -d of an aws run; docs/runs.md, "A run that lives in the
 * cloud"): the controller pushes its run directory to STORE/run/REL as the run goes, and the
 * submitter pulls it back into its own run directory, whose row then follows it
 * (td_run_adopt_remote of track).
 *
 * Every file goes whole (whole-file replacement, never an append piece), and a large one less
 * often (td__push_due, controller.h: its bytes per second bounded): a metrics or log file
 * only grows on the controller, so each copy in S3 is a longer prefix of the same file, and the
 * submitter's ingest, which reads past its stored offset, takes each line once whichever copies
 * it saw. A file is copied aside before it is sent (a file that grows under td_s3_put_file is
 * refused by it, and a busy rank's metrics file always grows). run.json goes last in every pass
 * both ways, so whoever sees its end has the files of that end too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "exec/controller.h"
#include "tandem/os.h"

/* What the controller sends: the record and what the submitter's verbs read. Not the working
 * directory, the checkpoints (in S3 already, under the checkpoint prefix), the lock, the token
 * or the code. */
static bool pushed_top(const char *name) {
    static const td_run_path_id ids[] = {
        TD_RUN_PATH_RECORD,    TD_RUN_PATH_LOGS,      TD_RUN_PATH_METRICS,
        TD_RUN_PATH_ARTIFACTS, TD_RUN_PATH_ARTIFACTS_S3, TD_RUN_PATH_END,
        TD_RUN_PATH_INSTANCES, TD_RUN_PATH_SDK};
    for (size_t i = 0; i < TD_ARRAY_LEN(ids); i++)
        if (!strcmp(name, td_run_path_name(ids[i]))) return true;
    return false;
}

/* A relative path that stays inside the run directory: no empty, "." or ".." segment, no
 * leading '/', no hidden name (temporaries), nothing but [A-Za-z0-9._=+,@-] and '/'. A key in
 * S3 is anyone's text: it must not write outside the run. */
static bool rel_ok(const char *rel) {
    if (!rel[0] || rel[0] == '/' || strlen(rel) > 1024) return false;
    for (const char *seg = rel; *seg;) {
        size_t n = strcspn(seg, "/");
        if (n == 0 || seg[0] == '.') return false;
        for (size_t i = 0; i < n; i++) {
            char c = seg[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  strchr("._=+,@-", c)))
                return false;
        }
        seg += n;
        if (*seg == '/') seg++;
        if (!*seg && seg[-1] == '/') return false;
    }
    return true;
}

/* ---- push (the controller) ---- */
static td__pushed *pushed_find(td__push *p, const char *rel) {
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->files[i].rel, rel)) return &p->files[i];
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->files = td_xrealloc(p->files, p->cap * sizeof *p->files);
    }
    td__pushed *f = &p->files[p->n++];
    memset(f, 0, sizeof *f);
    f->rel = td_xstrdup(rel);
    f->size = -1;
    return f;
}

bool td__push_due(const td__pushed *f, int64_t size, double now_s, double bytes_per_s,
                  bool final) {
    if (final || f->size < 0 || bytes_per_s < 0) return true; /* the end; never sent; no bound */
    if (bytes_per_s == 0) bytes_per_s = TD__PUSH_BYTES_PER_S;
    /* sending size bytes again is paid for by the time since the last send */
    return (double)size <= bytes_per_s * (now_s - f->sent_s);
}

static td_status push_one(td__push *p, const char *run_dir, const char *rel, double now_s,
                          bool final) {
    char *path = td_xasprintf("%s/%s", run_dir, rel);
    struct stat sb;
    td_status st = TD_OK;
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) goto out;
    td__pushed *f = pushed_find(p, rel);
    int64_t mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    if (f->size == (int64_t)sb.st_size && f->mtime_ns == mtime) goto out;
    if (!td__push_due(f, (int64_t)sb.st_size, now_s, p->bytes_per_s, final)) {
        p->ndeferred++;
        goto out;
    }
    /* a copy aside: what the file held when it was read, sent whole */
    char *aside = td_xasprintf("%s/push.%d", p->staging, (int)getpid());
    st = td_copy_file(path, aside, "the run store's copy");
    struct stat asb;
    int64_t nbytes = st == TD_OK && stat(aside, &asb) == 0 ? (int64_t)asb.st_size : 0;
    if (st == TD_OK) {
        char *key = td_xasprintf("%s/run/%s", p->prefix, rel);
        st = p->put ? p->put(p->put_user, key, aside, nbytes)
                    : td_s3_put_file(p->aws, p->bucket, key, aside, NULL);
        free(key);
    }
    unlink(aside);
    free(aside);
    if (st == TD_OK) {
        f->size = (int64_t)sb.st_size;
        f->mtime_ns = mtime;
        f->sent_s = now_s;
        p->nsent++;
        p->nbytes_sent += nbytes;
    }
out:
    free(path);
    return st;
}

static td_status push_walk(td__push *p, const char *run_dir, const char *rel, int depth,
                           double now_s, bool final) {
    char *dir = rel[0] ? td_xasprintf("%s/%s", run_dir, rel) : td_xstrdup(run_dir);
    DIR *d = opendir(dir);
    free(dir);
    if (!d) return TD_OK;
    td_status st = TD_OK;
    for (struct dirent *e; st == TD_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue; /* ., .., temporaries */
        if (!rel[0] && (!pushed_top(e->d_name) ||
                        !strcmp(e->d_name, td_run_path_name(TD_RUN_PATH_RECORD))))
            continue; /* run.json: last, by the caller */
        char *sub = rel[0] ? td_xasprintf("%s/%s", rel, e->d_name) : td_xstrdup(e->d_name);
        char *path = td_xasprintf("%s/%s", run_dir, sub);
        struct stat sb;
        if (rel_ok(sub) && lstat(path, &sb) == 0) {
            if (S_ISDIR(sb.st_mode) && depth < 8)
                st = push_walk(p, run_dir, sub, depth + 1, now_s, final);
            else if (S_ISREG(sb.st_mode))
                st = push_one(p, run_dir, sub, now_s, final);
        }
        free(path);
        free(sub);
    }
    closedir(d);
    return st;
}

/* Whether run_dir's record says the run has ended (unreadable now, as mid-rename: no). */
static bool record_ended(const char *run_dir) {
    char *path = td_run_path(run_dir, TD_RUN_PATH_RECORD);
    json_t *j = json_load_file(path, 0, NULL);
    free(path);
    const char *text = json_string_value(json_object_get(j, "status"));
    td_run_status st;
    bool ended = false;
    if (text) {
        if (td_run_status_parse(text, &st) == TD_OK)
            ended = td_run_status_is_final(st);
        else
            td_error_clear();
    }
    json_decref(j);
    return ended;
}

td_status td__remote_push(td__push *p, const char *run_dir, double now_s, bool final) {
    p->nsent = p->ndeferred = 0;
    TD_CHECK(push_walk(p, run_dir, "", 0, now_s, final));
    /* The record's end goes only with the end's pass: what the end adds after the run stops
     * (the controller's own line in instances.json, its cost) is then in the store by the time
     * a reader sees the end, who takes the end as everything (a pass as the run goes, between
     * the supervisor's last write and the end's pass, sent the end without it). */
    if (!final && record_ended(run_dir)) {
        p->ndeferred++;
        return TD_OK;
    }
    return push_one(p, run_dir, td_run_path_name(TD_RUN_PATH_RECORD), now_s, final);
}

void td__remote_push_free(td__push *p) {
    for (size_t i = 0; i < p->n; i++) free(p->files[i].rel);
    free(p->files);
    p->files = NULL;
    p->n = p->cap = 0;
}

/* ---- pull (the submitter) ---- */
/* RUN/.remote-etags: "ETAG REL" per line, what was pulled last; a changed ETag is pulled again. */
typedef struct {
    char **rel, **etag;
    size_t n;
} etags;

static void etags_load(const char *path, etags *t) {
    FILE *f = fopen(path, "r");
    char line[2048];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = '\0';
        t->rel = td_xrealloc(t->rel, (t->n + 1) * sizeof *t->rel);
        t->etag = td_xrealloc(t->etag, (t->n + 1) * sizeof *t->etag);
        t->etag[t->n] = td_xstrdup(line);
        t->rel[t->n++] = td_xstrdup(sp + 1);
    }
    if (f) fclose(f);
}

static const char *etag_of(const etags *t, const char *rel) {
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->rel[i], rel)) return t->etag[i];
    return NULL;
}

static void etags_free(etags *t) {
    for (size_t i = 0; i < t->n; i++) {
        free(t->rel[i]);
        free(t->etag[i]);
    }
    free(t->rel);
    free(t->etag);
}

static td_status pull_one(td_aws_t *aws, const char *bucket, const td_s3_object *o,
                          const char *run_dir, const char *rel) {
    char *path = td_xasprintf("%s/%s", run_dir, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    td_status st = td_mkdirs(path);
    *slash = '/';
    if (st == TD_OK) st = td_s3_get_file(aws, bucket, o->key, path, NULL);
    free(path);
    return st;
}

td_status td__remote_pull(td_aws_t *aws, const char *bucket, const char *prefix,
                          const char *run_dir, size_t *npulled) {
    *npulled = 0;
    char *list_prefix = td_xasprintf("%s/run/", prefix);
    td_s3_list all = {0};
    td_status st = td_s3_list_objects(aws, bucket, list_prefix, 0, &all);
    char *manifest = td_xasprintf("%s/.remote-etags", run_dir);
    etags seen = {0};
    etags_load(manifest, &seen);
    td__buf now = {0};
    size_t plen = strlen(list_prefix);
    for (int pass = 0; st == TD_OK && pass < 2; pass++)
        for (int i = 0; st == TD_OK && i < all.count; i++) {
            const td_s3_object *o = &all.items[i];
            if (strncmp(o->key, list_prefix, plen)) continue;
            const char *rel = o->key + plen;
            bool is_record = !strcmp(rel, td_run_path_name(TD_RUN_PATH_RECORD));
            /* run.json last: whoever reads its end finds the files of that end */
            if (is_record != (pass == 1)) continue;
            char top[256];
            snprintf(top, sizeof top, "%.*s", (int)strcspn(rel, "/"), rel);
            if (!rel_ok(rel) || !pushed_top(top)) {
                TD_LOG_WARN("run store s3://%s/%s: %s is not a file of a run directory; left out",
                            bucket, prefix, o->key);
                continue;
            }
            const char *was = etag_of(&seen, rel);
            if (!was || strcmp(was, o->etag)) {
                st = pull_one(aws, bucket, o, run_dir, rel);
                if (st == TD_OK) (*npulled)++;
            }
            if (st == TD_OK) td__buf_addf(&now, "%s %s\n", o->etag, rel);
            else if (was) td__buf_addf(&now, "%s %s\n", was, rel);
        }
    if (now.s) {
        td_chunk c = {now.s, now.len};
        td_status wst = td_write_atomic(manifest, "the run store's pull record", &c, 1);
        if (wst != TD_OK) {
            TD_LOG_WARN("%s", td_error_msg());
            td_error_clear();
        }
    }
    free(now.s);
    etags_free(&seen);
    free(manifest);
    td_s3_list_free(&all);
    free(list_prefix);
    return st;
}
