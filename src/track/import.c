/* tandem import: an offline run of the Python SDK (what tandem.init() writes outside a tracked
 * run: ./tandem-offline/<id>/ with offline.json, sdk.json, metrics/rank-R.jsonl, artifacts/)
 * becomes a run of the store. A new run is created the usual way (id under the write lock,
 * run.json), the offline run's files are copied into its directory (regular files only; no link
 * is followed, DIR itself included: each path component is opened with O_NOFOLLOW from the one
 * above it; the offline directory is left as it was), and the store's own ingest, artifact
 * registration and sdk.json reading take them in, as `tandem reindex` would. RUN/imported.json
 * names the source, so importing it again finds that run instead of making a second one. */
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define IMPORTED_FORMAT 1

/* The JSON of `name` in the directory dfd (shown as `path`), read without following a link or
 * blocking, at most max bytes. 1: no file; 0: *out holds it; -1: an error recorded naming path
 * (a link, not a regular file, too big, not JSON). */
static int load_json_at(int dfd, const char *name, const char *path, size_t max, json_t **out) {
    *out = NULL;
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        struct stat lsb;
        if (errno == ENOENT) return 1;
        if (errno == ELOOP && fstatat(dfd, name, &lsb, AT_SYMLINK_NOFOLLOW) == 0) {
            td_error(TD_ERR_INVALID, "%s is %s, not a regular file: not read", path,
                     td_mode_kind(lsb.st_mode));
            return -1;
        }
        td_error_errno(TD_ERR_IO, "cannot read %s", path);
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > max) {
        td_error(TD_ERR_FORMAT, "%s is not a regular file of at most %zu bytes: not read", path,
                 max);
        close(fd);
        return -1;
    }
    json_error_t jerr;
    json_t *o = json_loadfd(fd, 0, &jerr);
    close(fd);
    if (!json_is_object(o)) {
        td_error(TD_ERR_FORMAT, "%s:%d: not a JSON object (%s)", path, o ? 1 : jerr.line,
                 o ? "another JSON value" : jerr.text);
        json_decref(o);
        return -1;
    }
    *out = o;
    return 0;
}

/* load_json_at for a full path (a file the store wrote itself). */
static int load_json(const char *path, size_t max, json_t **out) {
    return load_json_at(AT_FDCWD, path, path, max, out);
}

static const char *str_member(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) && *json_string_value(v) ? json_string_value(v) : NULL;
}

/* The command line as a shell would take it back: words with other characters quoted. */
static char *command_text(json_t *cmd) {
    if (!json_is_array(cmd) || !json_array_size(cmd)) return td_xstrdup("");
    size_t cap = 1, i;
    json_t *w;
    json_array_foreach(cmd, i, w) cap +=
        4 * (json_is_string(w) ? strlen(json_string_value(w)) : 0) + 3;
    char *s = td_xcalloc(cap, 1), *o = s;
    json_array_foreach(cmd, i, w) {
        const char *t = json_is_string(w) ? json_string_value(w) : "?";
        if (i) *o++ = ' ';
        int plain = *t != '\0';
        for (const char *p = t; *p && plain; p++)
            plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                    (*p >= '0' && *p <= '9') || strchr("-_./=:,+@%", *p);
        if (plain) {
            o += sprintf(o, "%s", t);
            continue;
        }
        *o++ = '\'';
        for (const char *p = t; *p; p++) {
            if (*p == '\'') {
                memcpy(o, "'\\''", 4);
                o += 4;
            } else {
                *o++ = *p;
            }
        }
        *o++ = '\'';
    }
    *o = '\0';
    return s;
}

/* A file name the Python SDK's atomic writes leave while writing: .NAME.tmp.PID. */
static int is_tmp_name(const char *name) {
    return name[0] == '.' && strstr(name, ".tmp.") != NULL;
}

/* Opens `name` in the directory dfd for reading without following a link at it: a directory
 * when dir, else a regular file (fstat checked after the open, so what was checked is what is
 * read). -1 with *kind saying what is there instead (NULL: nothing, or errno says why). */
static int open_nofollow(int dfd, const char *name, int dir, const char **kind) {
    *kind = NULL;
    int fd = openat(dfd, name,
                    O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (dir ? O_DIRECTORY : 0));
    struct stat sb;
    int have = 0;
    if (fd >= 0) {
        have = fstat(fd, &sb) == 0;
        if (have && (dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode))) return fd;
    }
    int saved = errno;
    if (fd >= 0)
        close(fd);
    else if (errno == ELOOP || errno == ENOTDIR)
        have = fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
    if (have) {
        const char *k = td_mode_kind(sb.st_mode);
        *kind = S_ISDIR(sb.st_mode) ? "a directory" : k ? k : "a regular file";
    }
    errno = saved;
    return -1;
}

/* Copies the regular file `name` in dfd (shown as src) to dst, never through a link: the file is
 * opened with O_NOFOLLOW and checked, and the copy reads that open file (through its
 * /proc/self/fd entry, which names the open file itself, not a path that could change). */
static td_status copy_file_at(int dfd, const char *name, const char *src, const char *dst,
                              const char *what) {
    const char *kind;
    int fd = open_nofollow(dfd, name, 0, &kind);
    if (fd < 0) {
        if (kind)
            return td_error(TD_ERR_INVALID,
                            "%s is %s, not a regular file: not imported (links are never "
                            "followed)",
                            src, kind);
        return td_error_errno(TD_ERR_IO, "cannot open %s %s", what, src);
    }
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    td_status st = td_copy_file(self, dst, what);
    close(fd);
    if (st != TD_OK && strstr(td_error_msg(), self))
        st = td_error(st, "cannot copy %s %s to %s: %s", what, src, dst, td_error_msg());
    return st;
}

/* Copies the regular files of the directory `name` in dfd (shown as src) into dst (made as
 * needed), recursively when recurse; only names ending in suffix (NULL: any). Every path
 * component is opened with O_NOFOLLOW from the one above it, so a link anywhere (the folder
 * itself, a folder below it, a file) is never followed: it is left out, and said. */
static td_status copy_tree(int dfd, const char *name, const char *src, const char *dst,
                           int recurse, const char *suffix, size_t *copied) {
    const char *kind;
    int fd = open_nofollow(dfd, name, 1, &kind);
    if (fd < 0) {
        if (kind) {
            TD_LOG_WARN("%s is %s, not a directory: not imported (links are never followed)",
                        src, kind);
            return TD_OK;
        }
        if (errno == ENOENT) return TD_OK;
        return td_error_errno(TD_ERR_IO, "cannot list %s", src);
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return td_error_errno(TD_ERR_IO, "cannot list %s", src);
    }
    td_status st = td_mkdirs(dst);
    for (struct dirent *e; st == TD_OK && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || is_tmp_name(e->d_name)) continue;
        char *from = td_xasprintf("%s/%s", src, e->d_name);
        char *to = td_xasprintf("%s/%s", dst, e->d_name);
        struct stat sb;
        size_t len = strlen(e->d_name), slen = suffix ? strlen(suffix) : 0;
        if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            st = td_error_errno(TD_ERR_IO, "cannot examine %s", from);
        } else if (S_ISDIR(sb.st_mode)) {
            if (recurse) st = copy_tree(fd, e->d_name, from, to, recurse, suffix, copied);
        } else if (!S_ISREG(sb.st_mode)) {
            TD_LOG_WARN("%s is %s, not a regular file: not imported (links are never followed)",
                        from, td_mode_kind(sb.st_mode));
        } else if (suffix && (len < slen || strcmp(e->d_name + len - slen, suffix))) {
            TD_LOG_DEBUG("%s: not a metrics file; not imported", from);
        } else {
            st = copy_file_at(fd, e->d_name, from, to, "imported file");
            if (st == TD_OK) {
                chmod(to, (sb.st_mode & 0660) | 0600);
                (*copied)++;
            }
        }
        free(from);
        free(to);
    }
    closedir(d);
    return st;
}

/* The run of the store imported from offline run `oid` created at `created`; *found = 0: none. */
static td_status find_imported(td_rundb *store, const char *oid, double created, td_run *out,
                               int *found) {
    *found = 0;
    td_run *runs = NULL;
    size_t n = 0;
    TD_CHECK(td_run_list(store, TD_RUN_LIST_ALL | TD_RUN_LIST_ARCHIVED, &runs, &n));
    for (size_t i = 0; i < n && !*found; i++) {
        if (!runs[i].run_dir) continue;
        char *path = td_run_path(runs[i].run_dir, TD_RUN_PATH_IMPORTED);
        json_t *o = NULL;
        if (load_json(path, 1 << 16, &o) == 0) {
            const char *id = str_member(o, "offline_id");
            json_t *c = json_object_get(o, "created");
            if (id && !strcmp(id, oid) && json_is_number(c) &&
                (json_number_value(c) - created) * (json_number_value(c) - created) < 1e-6) {
                *out = runs[i];
                memset(&runs[i], 0, sizeof runs[i]);
                *found = 1;
            }
        }
        td_error_clear();
        json_decref(o);
        free(path);
    }
    td_runs_free(runs, n);
    return TD_OK;
}

/* The newest modification time among the offline run's metrics files (its last sign of life);
 * dfd is the offline run's directory, and no link is followed. */
static double newest_metrics_time(int dfd) {
    const char *kind;
    double newest = 0;
    int fd = open_nofollow(dfd, "metrics", 1, &kind);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (fd >= 0 && !d) close(fd);
    for (struct dirent *e; d && (e = readdir(d));) {
        struct stat sb;
        if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode)) {
            double t = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
            if (t > newest) newest = t;
        }
    }
    if (d) closedir(d);
    return newest;
}

td_status td_run_import(td_rundb *store, const char *dir, int force, td_run *out, int *existed) {
    memset(out, 0, sizeof *out);
    *existed = 0;
    td_status st = TD_OK;
    char *abs = NULL, *offline_path = NULL, *lock_path = NULL, *command = NULL, *note = NULL;
    json_t *off = NULL, *sdk = NULL;
    int lock_fd = -1, created_run = 0, dfd = -1;
    td_run run;
    memset(&run, 0, sizeof run);
    struct stat sb;
    if (!dir || !*dir) return td_error(TD_ERR_INVALID, "no directory to import");
    /* DIR itself is not followed either ("DIR/" would be: the slashes go first). */
    char *bare = td_xstrdup(dir);
    for (size_t n = strlen(bare); n > 1 && bare[n - 1] == '/'; n--) bare[n - 1] = '\0';
    int is_link = lstat(bare, &sb) == 0 && S_ISLNK(sb.st_mode);
    free(bare);
    if (is_link) {
        char *target = realpath(dir, NULL);
        st = td_error(TD_ERR_INVALID,
                      "%s is a symbolic link%s%s: tandem import never follows links; import the "
                      "directory itself (tandem import %s)",
                      dir, target ? " to " : "", target ? target : "",
                      target ? target : "<the directory it names>");
        free(target);
        return st;
    }
    if (stat(dir, &sb) != 0) {
        if (errno == ENOENT)
            return td_error(TD_ERR_NOTFOUND, "%s: cannot import it: no such directory", dir);
        return td_error_errno(TD_ERR_IO, "%s: cannot import it", dir);
    }
    if (!S_ISDIR(sb.st_mode))
        return td_error(TD_ERR_INVALID,
                        "%s is not a directory: tandem import takes an offline run's directory "
                        "(./tandem-offline/<id>/, written by tandem.init() outside tandem run)",
                        dir);
    abs = realpath(dir, NULL);
    if (!abs) return td_error_errno(TD_ERR_IO, "%s: cannot resolve its path", dir);
    /* Everything below is read relative to this descriptor, one O_NOFOLLOW component at a
     * time: a link inside the offline run (a folder, a file) is never followed. */
    dfd = open(abs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        st = td_error_errno(TD_ERR_IO, "%s: cannot open it to import it", abs);
        goto out;
    }
    offline_path = td_xasprintf("%s/offline.json", abs);
    int rc = load_json_at(dfd, "offline.json", offline_path, 1 << 20, &off);
    if (rc == 1) {
        st = td_error(TD_ERR_NOTFOUND,
                      "%s has no offline.json: it is not an offline run of the tandem Python SDK "
                      "(tandem.init() outside tandem run writes offline.json, sdk.json and "
                      "metrics/ into ./tandem-offline/<id>/; a run of tandem run is in its "
                      "project's store already)",
                      abs);
        goto out;
    }
    if (rc < 0) {
        st = td_error(TD_ERR_FORMAT, "%s: cannot import it: %s", abs, td_error_msg());
        goto out;
    }
    const char *oid = str_member(off, "id"), *ostatus = str_member(off, "status");
    json_t *jfmt = json_object_get(off, "format");
    if (json_is_integer(jfmt) && json_integer_value(jfmt) > 1) {
        st = td_error(TD_ERR_FORMAT, "%s: format %lld is newer than this tandem imports (1)",
                      offline_path, (long long)json_integer_value(jfmt));
        goto out;
    }
    if (!oid || !ostatus || (strcmp(ostatus, "running") && strcmp(ostatus, "finished"))) {
        st = td_error(TD_ERR_FORMAT,
                      "%s: no \"id\", or a \"status\" that is neither running nor finished "
                      "(got %s%s%s): not an offline run's record",
                      offline_path, ostatus ? "'" : "", ostatus ? ostatus : "none",
                      ostatus ? "'" : "");
        goto out;
    }
    int running = !strcmp(ostatus, "running");
    if (running && !force) {
        st = td_error(TD_ERR_INVALID,
                      "%s: offline.json says run %s is still running: its script is still "
                      "writing it (import it once the script has ended: tandem.finish() or its "
                      "exit records the end), or was killed before it could say so (then "
                      "tandem import --force imports what is there, as failed)",
                      abs, oid);
        goto out;
    }
    /* The offline run's identity: its id and creation time (an id alone may come again: a
     * Slurm job id, a torchrun run id). */
    double ocreated = json_number_value(json_object_get(off, "created"));
    double created = ocreated;
    double ended = json_number_value(json_object_get(off, "ended"));
    json_t *jcode = json_object_get(off, "exit_code");
    json_t *jws = json_object_get(off, "world_size");
    int world =
        json_is_integer(jws) && json_integer_value(jws) > 0 && json_integer_value(jws) < 100000
            ? (int)json_integer_value(jws)
            : 1;

    /* One import at a time per store: two at once would both find no earlier import. */
    lock_path = td_xasprintf("%s/import.lock", td_rundb_dir(store));
    lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd >= 0)
        while (flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {
        }
    int found = 0;
    TD_CHECK_GOTO(find_imported(store, oid, ocreated, out, &found), st, out);
    if (found) {
        *existed = 1;
        goto out;
    }

    /* The SDK's name names the run (as tandem run --name does), else its project. */
    char *sdk_path = td_xasprintf("%s/sdk.json", abs);
    if (load_json_at(dfd, "sdk.json", sdk_path, TD_SDK_JSON_MAX, &sdk) < 0) {
        TD_LOG_WARN("%s (its config and summary are not imported)", td_error_msg());
        td_error_clear();
    }
    free(sdk_path);
    const char *name = sdk ? str_member(sdk, "name") : NULL;
    const char *project = sdk ? str_member(sdk, "project") : NULL;
    const char *group = NULL;
    if (project && td_label_check("group", project) == TD_OK) group = project;
    td_error_clear();
    command = command_text(json_object_get(off, "command"));
    td_run_spec spec = {.workflow = name      ? name
                                    : project ? project
                                              : "offline",
                        .command = command,
                        .nodes = 1,
                        .nproc_per_node = world,
                        .group = group};
    TD_CHECK_GOTO(td_run_create(store, &spec, &run), st, out);
    created_run = 1;

    size_t nmetrics = 0, narts = 0, nsdk = 0;
    char *from = td_xasprintf("%s/metrics", abs);
    char *to = td_run_path(run.run_dir, TD_RUN_PATH_METRICS);
    st = copy_tree(dfd, "metrics", from, to, 0, ".jsonl", &nmetrics);
    free(from);
    free(to);
    if (st != TD_OK) goto out;
    from = td_xasprintf("%s/artifacts", abs);
    to = td_run_path(run.run_dir, TD_RUN_PATH_ARTIFACTS);
    st = copy_tree(dfd, "artifacts", from, to, 1, NULL, &narts);
    free(from);
    free(to);
    if (st != TD_OK) goto out;
    if (sdk) {
        from = td_xasprintf("%s/sdk.json", abs);
        to = td_run_path(run.run_dir, TD_RUN_PATH_SDK);
        st = copy_file_at(dfd, "sdk.json", from, to, "sdk.json");
        nsdk = st == TD_OK;
        free(from);
        free(to);
        if (st != TD_OK) goto out;
    }
    (void)nsdk;
    /* The store's own ingest, registration and sdk.json reading, as a reindex does. */
    TD_CHECK_GOTO(td__run_sync_files(store, &run, 0, NULL, NULL, NULL), st, out);

    td_run_status status;
    int code = -1;
    const char *why = "";
    if (running) {
        status = TD_RUN_FAILED;
        why = "; its offline.json still said running (the script was killed, or was still "
              "writing it): imported with --force as failed";
    } else if (json_is_integer(jcode)) {
        code = (int)json_integer_value(jcode);
        status = code == 0 ? TD_RUN_SUCCEEDED : TD_RUN_FAILED;
    } else {
        status = TD_RUN_SUCCEEDED;
        why = "; its offline.json records no exit code (the script ended without "
              "tandem.finish(exit_code=...)): taken as succeeded";
    }
    if (created <= 0) created = run.created_s;
    double last = newest_metrics_time(dfd);
    if (ended <= 0) ended = last > created ? last : created;
    note = td_xasprintf("imported by tandem import from %s (offline run %s of the tandem Python "
                        "SDK)%s",
                        abs, oid, why);
    TD_CHECK_GOTO(
        td__run_set_imported(store, run.id, status, code, created, created, ended, note, "unknown"),
        st, out);

    /* Last: a run is found as imported only once it is whole. */
    json_t *rec = json_pack("{s:i,s:s,s:s,s:f,s:f}", "format", IMPORTED_FORMAT, "source", abs,
                            "offline_id", oid, "created", ocreated, "imported", td_wall_s());
    char *text = rec ? json_dumps(rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(rec);
    if (!text) {
        st = td_error(TD_ERR_NOMEM, "cannot encode imported.json of run %s", run.id);
        goto out;
    }
    char *path = td_run_path(run.run_dir, TD_RUN_PATH_IMPORTED);
    td_chunk chunks[2] = {{text, strlen(text)}, {"\n", 1}};
    st = td_write_atomic(path, "import record", chunks, 2);
    free(path);
    free(text);
    if (st != TD_OK) goto out;
    TD_LOG_DEBUG("imported %s as run %s: %zu metrics file(s), %zu artifact(s)", abs, run.id,
                 nmetrics, narts);
    st = td_run_find(store, run.id, out);
out:
    if (st != TD_OK && created_run) {
        /* Nothing half-imported stays behind: the next try starts afresh. */
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", td_error_msg());
        td_run fresh;
        if (td_run_find(store, run.id, &fresh) == TD_OK) {
            if (td_run_delete(store, &fresh) != TD_OK)
                TD_LOG_WARN("the half-imported run %s could not be removed: %s (tandem rm %s)",
                            run.id, td_error_msg(), run.id);
            td_run_clear(&fresh);
        }
        td_error(st, "%s", msg);
    }
    if (lock_fd >= 0) close(lock_fd);
    if (dfd >= 0) close(dfd);
    td_run_clear(&run);
    json_decref(off);
    json_decref(sdk);
    free(abs);
    free(offline_path);
    free(lock_path);
    free(command);
    free(note);
    return st;
}
