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

/* Copies the regular file src to dst through dst.partial and a rename. The source is opened
 * without following a link or blocking (a FIFO put there after the lstat that found a file),
 * and must still be a regular file. The copy gets the source's read and write bits for owner
 * and group, never more than the source has (a 0600 output stays private); the execute bits and
 * the world's go. *nbytes: the bytes copied. */
static td_status copy_file(const char *src, const char *dst, int64_t *nbytes) {
    td_status st = TD_OK;
    char *tmp = td_xasprintf("%s.partial", dst);
    int in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), out = -1;
    *nbytes = 0;
    if (in < 0) {
        st = errno == ELOOP ? td_error(TD_ERR_INVALID, "artifact %s became a symbolic link", src)
                            : td_error_errno(TD_ERR_IO, "cannot open artifact %s", src);
        goto done;
    }
    struct stat sb;
    if (fstat(in, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "cannot examine artifact %s", src);
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = td_error(TD_ERR_INVALID, "artifact %s is no longer a regular file", src);
        goto done;
    }
    /* A .partial left by an interrupted copy goes first: O_EXCL then creates ours, and never
     * writes through whatever (a link) might stand there. */
    unlink(tmp);
    out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
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
        *nbytes += n;
    }
    if (fchmod(out, sb.st_mode & 0660) != 0) {
        st = td_error_errno(TD_ERR_IO, "cannot set the permissions of %s", tmp);
        goto done;
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

/* The warning for a symbolic link where an artifact was looked for. Links are not followed and
 * not stored: a link can lead out of the run's files (a secret copied into the run directory),
 * back up its own tree (every file stored again under each turn of the loop) or round in a
 * circle, and stored as a link it would name a path that is not the run's and has no content to
 * hash. The run should put the file itself there. */
static void warn_link(const char *what, const char *name, const char *path) {
    char target[512];
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    TD_LOG_WARN("%s %s (%s) is a symbolic link%s%s%s: not stored (links are not followed; write "
                "or copy the file itself there to keep it)",
                what, name, path, n > 0 ? " to '" : "", target, n > 0 ? "'" : "");
}

/* Stores src (a file, or a directory's files) as artifact `name`. Every problem with one entry
 * (a link, something not a file, a file that cannot be read) is a warning naming it, and the
 * others are stored all the same; the result is an error only when the disk is full or the
 * index refused the record, which would stop every file after it too. */
static td_status collect_one(td_rundb *store, int64_t seq, const td_run *run, const char *src,
                             const char *name, size_t *ncopied, int depth) {
    struct stat sb;
    if (lstat(src, &sb) != 0) {
        TD_LOG_WARN("artifact %s (%s) not stored: %s", name, src, strerror(errno));
        return TD_OK;
    }
    if (S_ISLNK(sb.st_mode)) {
        warn_link("artifact", name, src);
        return TD_OK;
    }
    if (S_ISDIR(sb.st_mode)) {
        if (depth > 32) {
            TD_LOG_WARN("artifact directory %s (%s) nests more than 32 levels deep: what is "
                        "below it is not stored",
                        name, src);
            return TD_OK;
        }
        DIR *d = opendir(src);
        if (!d) {
            TD_LOG_WARN("artifact directory %s (%s) cannot be listed: %s; its files are not "
                        "stored",
                        name, src, strerror(errno));
            return TD_OK;
        }
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
    if (!S_ISREG(sb.st_mode)) {
        TD_LOG_WARN("artifact %s (%s) is %s: not stored", name, src, td_mode_kind(sb.st_mode));
        return TD_OK;
    }
    /* Runs of a workflow share its working directory: a file nobody wrote since this run was
     * created is what an earlier run left (say this one failed before saving), not its output.
     * Compared in whole seconds: a file fetched from a remote node comes through tar, which
     * keeps its mtime to the second only (a file written 0.3 s after the run began, at X.9,
     * arrives as X.0, before a creation at X.6). */
    if (run->created_s > 0 && sb.st_mtim.tv_sec < (time_t)run->created_s) {
        TD_LOG_WARN("artifact %s was last written before run %s was created (left by an earlier "
                    "run?); not stored",
                    name, run->id);
        return TD_OK;
    }
    char *dst =
        td_xasprintf("%s/%s/%s", run->run_dir, td_run_path_name(TD_RUN_PATH_ARTIFACTS), name);
    char *dir = td_xstrdup(dst);
    td_status st = td_mkdirs(dirname(dir));
    char sha[65];
    int64_t nbytes = 0;
    if (st == TD_OK) st = copy_file(src, dst, &nbytes);
    if (st == TD_OK) st = td_sha256_file(dst, sha);
    int entry_failed = st != TD_OK; /* this file's trouble; after it, the store's */
    if (st == TD_OK) st = record(store, seq, name, dst, nbytes, sha);
    if (st == TD_OK) (*ncopied)++;
    if (st == TD_ERR_NOSPACE) {
        /* The copy failed; the file the run made is where it was. Say so, and where to look. */
        char old[1024];
        snprintf(old, sizeof old, "%s", td_error_msg());
        td_error(TD_ERR_NOSPACE, "artifact %s not stored (the original %s is untouched): %s", name,
                 src, old);
        td__nospace_explain(st, run->run_dir);
    } else if (st != TD_OK && entry_failed) {
        TD_LOG_WARN("artifact %s not stored (the original %s is untouched): %s", name, src,
                    td_error_msg());
        td_error_clear();
        st = TD_OK;
    }
    free(dir);
    free(dst);
    return st;
}

/* Whether a path below work_dir (rel: its part below) passes through a symbolic link on the way
 * (the pattern "models/x.bin" where models is a link, or a wildcard that matched one); the
 * matched entry itself is collect_one's to check. *link (freed by the caller) names the link. */
static int through_link(const char *work_dir, const char *rel, char **link) {
    char *path = td_xasprintf("%s/%s", work_dir, rel);
    size_t base = strlen(work_dir) + 1;
    int found = 0;
    for (char *p = path + base; (p = strchr(p, '/')) && !found; p++) {
        *p = '\0';
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
            found = 1;
            *link = td_xstrdup(path);
        }
        *p = '/';
    }
    free(path);
    return found;
}

td_status td_artifacts_collect(td_rundb *store, const td_run *run, const char *work_dir,
                               const char *const *patterns, size_t npatterns, size_t *ncopied) {
    int64_t seq;
    TD_CHECK(td__rundb_ensure(store));
    TD_CHECK(td__run_seq(store, run->id, &seq));
    size_t copied = 0;
    td_status st = TD_OK;
    for (size_t i = 0; i < npatterns && st == TD_OK; i++) {
        int absolute = patterns[i][0] == '/';
        char *pat =
            absolute ? td_xstrdup(patterns[i]) : td_xasprintf("%s/%s", work_dir, patterns[i]);
        glob_t g;
        memset(&g, 0, sizeof g);
        int rc = glob(pat, 0, NULL, &g);
        if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
            TD_LOG_WARN("artifact pattern '%s' matched nothing in %s", patterns[i], work_dir);
        } else if (rc != 0) {
            TD_LOG_WARN("artifact pattern '%s' could not be expanded in %s (glob error %d); what "
                        "it names is not stored",
                        patterns[i], work_dir, rc);
        } else {
            size_t prefix = absolute ? 0 : strlen(work_dir) + 1;
            for (size_t k = 0; k < g.gl_pathc && st == TD_OK; k++) {
                char *name = safe_name(g.gl_pathv[k] + prefix);
                char *link = NULL;
                if (!absolute && through_link(work_dir, g.gl_pathv[k] + prefix, &link))
                    warn_link("the way to artifact", name, link);
                else
                    st = collect_one(store, seq, run, g.gl_pathv[k], name, &copied, 0);
                free(link);
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
    if (!d) {
        if (errno == ENOENT) return TD_OK;
        if (!depth) return td_error_errno(TD_ERR_IO, "cannot list %s", dir);
        TD_LOG_WARN("artifact directory %s cannot be listed: %s; its files are not registered", dir,
                    strerror(errno));
        return TD_OK;
    }
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
        /* lstat: a link put into artifacts/ is not followed (see warn_link). */
        if (lstat(path, &sb) != 0) {
            TD_LOG_WARN("artifact %s not registered: %s", path, strerror(errno));
        } else if (S_ISLNK(sb.st_mode)) {
            warn_link("artifact", rel, path);
        } else if (S_ISDIR(sb.st_mode)) {
            if (depth < 32)
                st = register_tree(store, seq, path, rel, only_missing, count, depth + 1);
            else
                TD_LOG_WARN("artifact directory %s nests more than 32 levels deep: what is below "
                            "it is not registered",
                            path);
        } else if (!S_ISREG(sb.st_mode)) {
            TD_LOG_WARN("artifact %s is %s: not registered", path, td_mode_kind(sb.st_mode));
        } else if (!(only_missing && is_recorded(store, seq, rel))) {
            char sha[65];
            if (td_sha256_file(path, sha) != TD_OK) {
                TD_LOG_WARN("artifact %s not registered: %s", path, td_error_msg());
                td_error_clear();
            } else {
                st = record(store, seq, rel, path, (int64_t)sb.st_size, sha);
                if (st == TD_OK) (*count)++;
            }
        }
        free(path);
        free(rel);
    }
    closedir(d);
    return st;
}

td_status td_artifacts_register_found(td_rundb *store, const td_run *run, size_t *nfound) {
    size_t n = 0;
    td_status st = td__artifacts_register_dir(store, run, 1, &n);
    if (nfound) *nfound = n;
    return st;
}

td_status td__artifacts_register_dir(td_rundb *store, const td_run *run, int only_missing,
                                     size_t *count) {
    int64_t seq;
    *count = 0;
    TD_CHECK(td__run_seq(store, run->id, &seq));
    char *dir = td_run_path(run->run_dir, TD_RUN_PATH_ARTIFACTS);
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
    char *dir = td_run_path(run->run_dir, TD_RUN_PATH_LOGS);
    DIR *d = opendir(dir);
    size_t cap = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            int rank = td_log_file_rank(e->d_name);
            if (rank >= 0) {
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
