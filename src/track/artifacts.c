/* Artifacts (files a run leaves behind, copied into the run directory with their digest) and the
 * record of a run's log files. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void td_artifacts_free(td_artifact *arts, size_t count) {
    for (size_t i = 0; i < count; i++) {
        free(arts[i].name);
        free(arts[i].path);
    }
    free(arts);
}

static td_status copy_file(const char *src, const char *dst) {
    td_status st = TD_OK;
    char *tmp = td_xasprintf("%s.partial", dst);
    int in = open(src, O_RDONLY | O_CLOEXEC), out = -1;
    if (in < 0) {
        st = td_error_errno(TD_ERR_IO, "cannot open artifact %s", src);
        goto done;
    }
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        st = td_error_errno(TD_ERR_IO, "cannot create %s", tmp);
        goto done;
    }
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = td_error_errno(TD_ERR_IO, "reading %s", src);
            goto done;
        }
        if (n == 0) break;
        for (ssize_t w = 0; w < n;) {
            ssize_t k = write(out, buf + w, (size_t)(n - w));
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) {
                st = td_error_errno(TD_ERR_IO, "writing %s", tmp);
                goto done;
            }
            w += k;
        }
    }
    if (close(out) != 0) st = td_error_errno(TD_ERR_IO, "writing %s", tmp);
    out = -1;
    if (st == TD_OK && rename(tmp, dst) != 0)
        st = td_error_errno(TD_ERR_IO, "cannot rename %s to %s", tmp, dst);
done:
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (st != TD_OK) unlink(tmp);
    free(tmp);
    return st;
}

/* "../x/./y" or "/abs/y" -> a name that stays inside the artifacts directory. */
static char *safe_name(const char *path) {
    char *out = td_xcalloc(strlen(path) * 2 + 2, 1);
    size_t n = 0;
    const char *p = path;
    while (*p) {
        while (*p == '/') p++;
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0) break;
        if (!(len == 1 && p[0] == '.')) {
            if (n) out[n++] = '/';
            if (len == 2 && p[0] == '.' && p[1] == '.') {
                memcpy(out + n, "__", 2);
                n += 2;
            } else {
                memcpy(out + n, p, len);
                n += len;
            }
        }
        p += len;
    }
    out[n] = '\0';
    return out;
}

static td_status record(td_rundb *store, int64_t seq, const char *name, const char *path,
                        int64_t size, const char *sha) {
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(store,
                               "INSERT OR REPLACE INTO artifacts(run, name, path, size, sha256)"
                               " VALUES(?,?,?,?,?)",
                               &q));
    sqlite3_bind_int64(q, 1, seq);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, size);
    sqlite3_bind_text(q, 5, sha, -1, SQLITE_STATIC);
    td_status st = TD_OK;
    for (int attempt = 0; attempt < 200; attempt++) {
        int rc = sqlite3_step(q);
        if (rc == SQLITE_DONE) break;
        if ((rc & 0xff) == SQLITE_BUSY && attempt + 1 < 200) {
            sqlite3_reset(q);
            usleep(20000);
            continue;
        }
        st = td__rundb_err(store, "record an artifact");
        break;
    }
    sqlite3_finalize(q);
    return st;
}

static td_status collect_one(td_rundb *store, int64_t seq, const td_run *run, const char *src,
                             const char *name, size_t *ncopied, int depth) {
    struct stat sb;
    if (stat(src, &sb) != 0) return td_error_errno(TD_ERR_IO, "artifact %s", src);
    if (S_ISDIR(sb.st_mode)) {
        if (depth > 32) return td_error(TD_ERR_INVALID, "artifact %s nests too deeply", src);
        DIR *d = opendir(src);
        if (!d) return td_error_errno(TD_ERR_IO, "cannot list artifact directory %s", src);
        td_status st = TD_OK;
        struct dirent *e;
        while (st == TD_OK && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *s = td_xasprintf("%s/%s", src, e->d_name);
            char *n = td_xasprintf("%s/%s", name, e->d_name);
            st = collect_one(store, seq, run, s, n, ncopied, depth + 1);
            free(s);
            free(n);
        }
        closedir(d);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) return TD_OK;
    /* Runs of a workflow share its working directory: a file nobody wrote since this run was
     * created is what an earlier run left (say this one failed before saving), not its output. */
    double mtime = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
    if (run->created_s > 0 && mtime < run->created_s) {
        TD_LOG_WARN("artifact %s was last written before run %s was created (left by an earlier "
                    "run?); not stored",
                    name, run->id);
        return TD_OK;
    }
    char *dst = td_xasprintf("%s/artifacts/%s", run->run_dir, name);
    char *dir = td_xstrdup(dst);
    td_status st = td_mkdirs(dirname(dir));
    char sha[65];
    if (st == TD_OK) st = copy_file(src, dst);
    if (st == TD_OK) st = td_sha256_file(dst, sha);
    if (st == TD_OK) st = record(store, seq, name, dst, (int64_t)sb.st_size, sha);
    if (st == TD_OK) (*ncopied)++;
    if (st == TD_ERR_NOSPACE) {
        /* The copy failed; the file the run made is where it was. Say so, and where to look. */
        char old[1024];
        snprintf(old, sizeof old, "%s", td_error_msg());
        td_error(TD_ERR_NOSPACE, "artifact %s not stored (the original %s is untouched): %s", name,
                 src, old);
        td__nospace_explain(st, run->run_dir);
    }
    free(dir);
    free(dst);
    return st;
}

td_status td_artifacts_collect(td_rundb *store, const td_run *run, const char *work_dir,
                               const char *const *patterns, size_t npatterns, size_t *ncopied) {
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run->id, &seq));
    size_t copied = 0;
    td_status st = TD_OK;
    for (size_t i = 0; i < npatterns && st == TD_OK; i++) {
        char *pat = patterns[i][0] == '/' ? td_xstrdup(patterns[i])
                                          : td_xasprintf("%s/%s", work_dir, patterns[i]);
        glob_t g;
        memset(&g, 0, sizeof g);
        int rc = glob(pat, 0, NULL, &g);
        if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
            TD_LOG_WARN("artifact pattern '%s' matched nothing in %s", patterns[i], work_dir);
        } else if (rc != 0) {
            st = td_error(TD_ERR_IO, "artifact pattern '%s': glob failed (%d)", patterns[i], rc);
        } else {
            size_t prefix = patterns[i][0] == '/' ? 0 : strlen(work_dir) + 1;
            for (size_t k = 0; k < g.gl_pathc && st == TD_OK; k++) {
                char *name = safe_name(g.gl_pathv[k] + prefix);
                st = collect_one(store, seq, run, g.gl_pathv[k], name, &copied, 0);
                free(name);
            }
        }
        globfree(&g);
        free(pat);
    }
    if (ncopied) *ncopied = copied;
    return st;
}

/* Files under dir (relative name prefix `name`), registered as artifacts of run seq. A copy that
 * never finished (<name>.partial, or the .<name>.tmp.<pid> of an atomic write) is not one. */
static int is_recorded(td_rundb *store, int64_t seq, const char *name) {
    sqlite3_stmt *q = NULL;
    if (td__rundb_prepare(store, "SELECT 1 FROM artifacts WHERE run = ? AND name = ?", &q) !=
        TD_OK) {
        td_error_clear();
        return 0;
    }
    sqlite3_bind_int64(q, 1, seq);
    sqlite3_bind_text(q, 2, name, -1, SQLITE_STATIC);
    int found = sqlite3_step(q) == SQLITE_ROW;
    sqlite3_finalize(q);
    return found;
}

static td_status register_tree(td_rundb *store, int64_t seq, const char *dir, const char *name,
                               int only_missing, size_t *count, int depth) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? TD_OK : td_error_errno(TD_ERR_IO, "cannot list %s", dir);
    td_status st = TD_OK;
    struct dirent *e;
    while (st == TD_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            (len > 8 && !strcmp(e->d_name + len - 8, ".partial")) ||
            (e->d_name[0] == '.' && strstr(e->d_name, ".tmp.")))
            continue;
        char *path = td_xasprintf("%s/%s", dir, e->d_name);
        char *rel = *name ? td_xasprintf("%s/%s", name, e->d_name) : td_xstrdup(e->d_name);
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (depth < 32)
                st = register_tree(store, seq, path, rel, only_missing, count, depth + 1);
        } else if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
                   !(only_missing && is_recorded(store, seq, rel))) {
            char sha[65];
            st = td_sha256_file(path, sha);
            if (st == TD_OK) st = record(store, seq, rel, path, (int64_t)sb.st_size, sha);
            if (st == TD_OK) (*count)++;
        }
        free(path);
        free(rel);
    }
    closedir(d);
    return st;
}

td_status td__artifacts_register_dir(td_rundb *store, const td_run *run, int only_missing,
                                     size_t *count) {
    int64_t seq;
    *count = 0;
    TD_CHECK(td__run_seq(store, run->id, &seq));
    char *dir = td_xasprintf("%s/artifacts", run->run_dir);
    td_status st = td__rundb_begin(store);
    if (st == TD_OK) st = register_tree(store, seq, dir, "", only_missing, count, 0);
    if (st == TD_OK) st = td__rundb_commit(store);
    if (st != TD_OK) {
        td__rundb_rollback(store);
        *count = 0;
    }
    free(dir);
    return st;
}

td_status td_artifacts_list(td_rundb *store, const char *run_id, td_artifact **out, size_t *count) {
    *out = NULL;
    *count = 0;
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run_id, &seq));
    sqlite3_stmt *q = NULL;
    TD_CHECK(td__rundb_prepare(
        store, "SELECT name, path, size, sha256 FROM artifacts WHERE run = ? ORDER BY name", &q));
    sqlite3_bind_int64(q, 1, seq);
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            *out = td_xrealloc(*out, cap * sizeof **out);
        }
        td_artifact *a = &(*out)[(*count)++];
        a->name = td_xstrdup((const char *)sqlite3_column_text(q, 0));
        a->path = td_xstrdup((const char *)sqlite3_column_text(q, 1));
        a->size_bytes = sqlite3_column_int64(q, 2);
        snprintf(a->sha256, sizeof a->sha256, "%s", (const char *)sqlite3_column_text(q, 3));
    }
    td_status st = rc == SQLITE_DONE ? TD_OK : td__rundb_err(store, "list artifacts");
    sqlite3_finalize(q);
    return st;
}

void td_log_files_free(td_log_file *logs, size_t count) {
    for (size_t i = 0; i < count; i++) free(logs[i].path);
    free(logs);
}

static int cmp_log(const void *a, const void *b) {
    const td_log_file *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->path, y->path);
}

td_status td_logs_scan(td_rundb *store, const td_run *run, td_log_file **out, size_t *count) {
    *out = NULL;
    *count = 0;
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run->id, &seq));
    char *dir = td_xasprintf("%s/logs", run->run_dir);
    DIR *d = opendir(dir);
    size_t cap = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            int rank;
            char tail[8];
            if (sscanf(e->d_name, "rank-%d.lo%1[g]", &rank, tail) == 2 && strlen(e->d_name) >= 10 &&
                !strcmp(e->d_name + strlen(e->d_name) - 4, ".log")) {
            } else if (!strcmp(e->d_name, "setup.log") || !strcmp(e->d_name, "supervisor.log")) {
                rank = -1;
            } else {
                continue;
            }
            if (*count == cap) {
                cap = cap ? 2 * cap : 8;
                *out = td_xrealloc(*out, cap * sizeof **out);
            }
            (*out)[(*count)++] = (td_log_file){rank, td_xasprintf("%s/%s", dir, e->d_name)};
        }
        closedir(d);
    }
    free(dir);
    if (*count) qsort(*out, *count, sizeof **out, cmp_log);
    td_status st = TD_OK;
    sqlite3_stmt *q = NULL;
    st = td__rundb_prepare(store, "INSERT OR IGNORE INTO logs(run, rank, path) VALUES(?,?,?)", &q);
    for (size_t i = 0; st == TD_OK && i < *count; i++) {
        sqlite3_reset(q);
        sqlite3_bind_int64(q, 1, seq);
        sqlite3_bind_int(q, 2, (*out)[i].rank);
        sqlite3_bind_text(q, 3, (*out)[i].path, -1, SQLITE_STATIC);
        int rc = sqlite3_step(q);
        /* The record is a convenience for other tools; a busy database must not fail a verb. */
        if (rc != SQLITE_DONE && (rc & 0xff) != SQLITE_BUSY)
            st = td__rundb_err(store, "record logs");
    }
    sqlite3_finalize(q);
    if (st != TD_OK) {
        td_log_files_free(*out, *count);
        *out = NULL;
        *count = 0;
    }
    return st;
}
