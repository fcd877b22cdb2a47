/* RUN/sdk.json: what a script recorded through the Python SDK (python/tandem/_run.py,
 * docs/python.md) into the run's record. The SDK's rank 0 rewrites the file atomically on every
 * change of tandem.config or tandem.summary; the supervisor reads it on its ingest timer when its
 * size, mtime or inode changed, and once more at the end; `tandem reindex` reads it for every
 * run. The file is the script's, not tandem's: whatever is wrong with it (a link, a FIFO, too
 * big, not JSON, a field of the wrong type, a bad tag) is a warning naming it, and the run goes
 * on with what its record had. */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Newest sdk.json format read; newer files are read for the fields known here. */
#define SDK_JSON_FORMAT 1

enum {
    WARN_KIND = 1u << 0,
    WARN_SIZE = 1u << 1,
    WARN_JSON = 1u << 2,
    WARN_FIELD = 1u << 3,
    WARN_TAG = 1u << 4,
    WARN_FORMAT = 1u << 5,
    WARN_READ = 1u << 6,
    WARN_FIELD_SUMMARY = 1u << 7,
    WARN_FIELD_TAGS = 1u << 8,
};

/* A warning the first time this watch gives one of its kind, a debug line after that (a script
 * rewriting a bad file every step would otherwise fill the supervisor's output). */
TD_PRINTF(3, 4) static void warn(td_sdk_watch *watch, unsigned kind, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (watch && (watch->warned & kind)) {
        TD_LOG_DEBUG("%s", msg);
        return;
    }
    if (watch) watch->warned |= kind;
    TD_LOG_WARN("%s", msg);
}

/* config or summary: the member as compact JSON text when it is an object within the cap; NULL
 * (keep what the row has) otherwise, with a warning when it is there and wrong. */
static char *object_member(json_t *o, const char *key, const char *path, td_sdk_watch *watch) {
    unsigned kind = strcmp(key, "config") ? WARN_FIELD_SUMMARY : WARN_FIELD;
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_object(v)) {
        warn(watch, kind, "%s: \"%s\" is not a JSON object; the run's %s is left as it was", path,
             key, key);
        return NULL;
    }
    char *text = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        warn(watch, kind, "%s: \"%s\" cannot be encoded; the run's %s is left as it was", path, key,
             key);
        return NULL;
    }
    if (strlen(text) > TD_SDK_OBJECT_MAX) {
        warn(watch, WARN_SIZE,
             "%s: \"%s\" is %zu bytes as JSON, over the %d kept; the run's %s is left as it was "
             "(record fewer or smaller values)",
             path, key, strlen(text), TD_SDK_OBJECT_MAX, key);
        free(text);
        return NULL;
    }
    return text;
}

/* Reads the file at path (only a regular file, never through a link, never blocking) into *out.
 * 0: read; 1: no file; -1: warned, not read. */
static int read_file(const char *path, td_sdk_watch *watch, char **out, size_t *len,
                     struct stat *sb) {
    *out = NULL;
    const char *kind = td_file_kind(path);
    if (kind) {
        warn(watch, WARN_KIND,
             "%s is %s, not a regular file: not read (the Python SDK writes a regular file "
             "there)",
             path, kind);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) return 1;
        warn(watch, WARN_READ, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
        warn(watch, WARN_KIND, "%s is not a regular file: not read", path);
        close(fd);
        return -1;
    }
    if (sb->st_size > TD_SDK_JSON_MAX) {
        warn(watch, WARN_SIZE,
             "%s is %lld bytes, over the %d read: not read; the run keeps the config and summary "
             "it had (record fewer or smaller values)",
             path, (long long)sb->st_size, TD_SDK_JSON_MAX);
        close(fd);
        return -1;
    }
    size_t cap = (size_t)sb->st_size + 1, n = 0;
    char *buf = td_xmalloc(cap);
    for (;;) {
        if (n == cap - 1) {
            if (cap > (size_t)TD_SDK_JSON_MAX + 1) break; /* grown since the fstat: cut off */
            cap *= 2;
            buf = td_xrealloc(buf, cap);
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            warn(watch, WARN_READ, "cannot read %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n > TD_SDK_JSON_MAX) {
        warn(watch, WARN_SIZE, "%s is over the %d bytes read: not read", path, TD_SDK_JSON_MAX);
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

td_status td_run_sdk_sync(td_rundb *store, const td_run *run, td_sdk_watch *watch, int *changed) {
    if (changed) *changed = 0;
    if (!run || !run->run_dir || !run->id) return TD_OK;
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_SDK);
    td_status st = TD_OK;
    char *text = NULL, *config = NULL, *summary = NULL;
    json_t *o = NULL;
    const char **tags = NULL;
    size_t ntags = 0;
    if (watch) {
        /* Only a change is read: the supervisor asks twice a second. */
        struct stat sb;
        if (lstat(path, &sb) != 0) goto out; /* none (yet), or gone: the row keeps its values */
        int64_t mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if (watch->seen && watch->dev == (int64_t)sb.st_dev && watch->ino == (int64_t)sb.st_ino &&
            watch->size == (int64_t)sb.st_size && watch->mtime_ns == mtime)
            goto out;
        watch->seen = 1;
        watch->dev = (int64_t)sb.st_dev;
        watch->ino = (int64_t)sb.st_ino;
        watch->size = (int64_t)sb.st_size;
        watch->mtime_ns = mtime;
    }
    struct stat sb;
    size_t len = 0;
    if (read_file(path, watch, &text, &len, &sb) != 0) goto out;
    json_error_t jerr;
    o = json_loadb(text, len, 0, &jerr);
    if (!o || !json_is_object(o)) {
        warn(watch, WARN_JSON,
             "%s:%d: not the Python SDK's record (%s): not read; the run keeps the config and "
             "summary it had",
             path, o ? 1 : jerr.line, o ? "not a JSON object" : jerr.text);
        goto out;
    }
    json_t *fmt = json_object_get(o, "format");
    if (json_is_integer(fmt) && json_integer_value(fmt) > SDK_JSON_FORMAT)
        warn(watch, WARN_FORMAT,
             "%s: format %lld is newer than this tandem knows (%d); its config, summary and tags "
             "are read as format %d's",
             path, (long long)json_integer_value(fmt), SDK_JSON_FORMAT, SDK_JSON_FORMAT);
    config = object_member(o, "config", path, watch);
    summary = object_member(o, "summary", path, watch);
    json_t *jt = json_object_get(o, "tags");
    if (jt && !json_is_null(jt) && !json_is_array(jt))
        warn(watch, WARN_FIELD_TAGS, "%s: \"tags\" is not a list; no tag of it is added", path);
    if (json_is_array(jt)) {
        tags = td_xcalloc(json_array_size(jt) + 1, sizeof *tags);
        size_t i;
        json_t *t;
        json_array_foreach(jt, i, t) {
            const char *tag = json_is_string(t) ? json_string_value(t) : NULL;
            if (tag && td_label_check("tag", tag) == TD_OK) {
                tags[ntags++] = tag;
                continue;
            }
            warn(watch, WARN_TAG, "%s: a tag skipped: %s", path,
                 tag ? td_error_msg() : "a tag is a string");
            td_error_clear();
        }
    }
    if (!config && !summary && !ntags) goto out;
    int did = 0;
    st = td__run_apply_sdk(store, run->id, config, summary, tags, ntags, path, &did);
    if (st == TD_OK && did) {
        TD_LOG_DEBUG("run %s: config, summary and tags taken from %s", run->id, path);
        if (changed) *changed = 1;
    }
    if (st != TD_OK && watch) watch->seen = 0; /* tried again at the next turn */
out:
    json_decref(o);
    free(tags);
    free(config);
    free(summary);
    free(text);
    free(path);
    return st;
}
