/* run.json: each run directory describes its own run, so the index (runs.db) can be rebuilt
 * from the directories when it is lost (issue 8). The store rewrites the file whenever the run's
 * row changes, from the row itself, atomically (a temporary file, fsync, rename): a reader sees
 * the old description or the new one, never half of one. */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bumped when a field changes meaning; readers accept this version and older. */
#define RUN_JSON_FORMAT 1

static json_t *str_or_null(const char *s) {
    return s ? json_string(s) : json_null();
}

/* A stored JSON object's text as the object, null for none (or for text that is not one). */
static json_t *object_or_null(const char *text) {
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_null();
}

/* An object member as compact text (NULL when it is not an object). */
static char *object_text(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_object(v) ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
}

td_status td__run_json_write(const td_run *run) {
    json_t *o = json_object();
    json_object_set_new(o, "format", json_integer(RUN_JSON_FORMAT));
    json_object_set_new(o, "id", json_string(run->id));
    json_object_set_new(o, "workflow", str_or_null(run->workflow));
    json_object_set_new(o, "n", json_integer(td__run_number(run->id)));
    json_object_set_new(o, "status", json_string(td_run_status_str(run->status)));
    json_object_set_new(o, "exit_code", json_integer(run->exit_code));
    json_object_set_new(o, "created", json_real(run->created_s));
    json_object_set_new(o, "started", json_real(run->started_s));
    json_object_set_new(o, "ended", json_real(run->ended_s));
    json_object_set_new(o, "command", str_or_null(run->command));
    json_object_set_new(o, "code_version", str_or_null(run->code_version));
    /* params as the object they are, for a person reading the file; text that is not a JSON
     * object is kept as a string so it comes back unchanged. */
    json_t *params = json_loads(run->params_json ? run->params_json : "{}", 0, NULL);
    if (!params || !json_is_object(params)) {
        json_decref(params);
        params = json_string(run->params_json ? run->params_json : "");
    }
    json_object_set_new(o, "params", params);
    json_object_set_new(o, "nodes", json_integer(run->nodes));
    json_object_set_new(o, "nproc_per_node", json_integer(run->nproc_per_node));
    json_object_set_new(o, "restarts", json_integer(run->restarts));
    json_object_set_new(o, "supervisor_pid", json_integer(run->supervisor_pid));
    /* Added after format 1 came out: a reader without it takes 0 (unknown). */
    json_object_set_new(o, "supervisor_start", json_integer(run->supervisor_start));
    json_object_set_new(o, "stop_requested", json_boolean(run->stop_requested));
    json_object_set_new(o, "note", str_or_null(run->note));
    json_object_set_new(o, "run_dir", str_or_null(run->run_dir));
    /* The user's labels (issue 19); a reader without them takes none. */
    json_t *tags = json_array();
    if (run->tags && *run->tags) {
        char *copy = td_xstrdup(run->tags);
        for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
            json_array_append_new(tags, json_string(t));
        free(copy);
    }
    json_object_set_new(o, "tags", tags);
    json_object_set_new(o, "group",
                        run->group && *run->group ? json_string(run->group) : json_null());
    json_object_set_new(o, "notes", str_or_null(run->notes));
    json_object_set_new(o, "archived", json_boolean(run->archived));
    /* What the script recorded through the SDK (RUN/sdk.json): objects, or null for none. A
     * reader without them takes none; the rebuild also reads sdk.json itself. */
    json_object_set_new(o, "config", object_or_null(run->config_json));
    json_object_set_new(o, "summary", object_or_null(run->summary_json));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return td_error(TD_ERR_NOMEM, "cannot encode run.json of run %s", run->id);
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_RECORD);
    /* Something else put there (a FIFO, a link) is left alone, as the metrics ingest leaves
     * such files: the row changes all the same (a run's end must still reach the index), and
     * the directory's record waits until it is removed. */
    const char *kind = td_file_kind(path);
    if (kind) {
        TD_LOG_WARN("%s is %s, not a regular file: the record of run %s there is not updated "
                    "(its row in the index is); remove it (rm '%s') and the run's next change "
                    "writes it again",
                    path, kind, run->id, path);
        free(path);
        free(text);
        return TD_OK;
    }
    td_chunk chunks[2] = {{text, strlen(text)}, {"\n", 1}};
    td_status st = td_write_atomic(path, "run record", chunks, 2);
    if (st == TD_ERR_NOSPACE) {
        /* td_write_atomic's text speaks of "that filesystem"; name it, once. */
        td_error(st,
                 "cannot write the run record %s: no space left on device (the previous "
                 "one is untouched)",
                 path);
        td__nospace_explain(st, run->run_dir);
    }
    free(path);
    free(text);
    return st;
}

static char *get_str(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? td_xstrdup(json_string_value(v)) : NULL;
}

static double get_num(json_t *o, const char *key, double dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* TD_ERR_INVALID: run.json is kind (a FIFO, a link...), which is never read. */
static td_status refuse(const char *path, const char *kind) {
    char target[1024] = "";
    if (!strcmp(kind, "a symbolic link")) {
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
    }
    return td_error(TD_ERR_INVALID,
                    "%s is %s%s%s, not a regular file, and was not read (tandem writes a run's "
                    "record there as a regular file itself); if the run is to be indexed, remove "
                    "it (rm '%s') and run 'tandem reindex': the run is then recovered from its "
                    "files",
                    path, kind, *target ? " to " : "", target, path);
}

td_status td__run_json_read(const char *run_dir, td_run *out, int *found) {
    memset(out, 0, sizeof *out);
    *found = 0;
    char *path = td_run_path(run_dir, TD_RUN_PATH_RECORD);
    td_status st = TD_OK;
    json_error_t jerr;
    json_t *o = NULL;
    /* Only a regular file is read, and the open neither blocks nor follows a link: a FIFO named
     * run.json would otherwise hold the reader (a reindex, every verb's stale-run check)
     * forever, and a device could do worse. lstat first, so nothing else is even opened; the
     * fstat after the open closes the gap of a file swapped in between. */
    const char *kind = td_file_kind(path);
    if (kind) {
        st = refuse(path, kind);
        goto out;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ELOOP)
            st = refuse(path, "a symbolic link");
        else if (errno != ENOENT)
            st = td_error_errno(TD_ERR_IO, "cannot read %s", path);
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "cannot examine %s (fstat)", path);
        close(fd);
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = refuse(path, td_mode_kind(sb.st_mode));
        close(fd);
        goto out;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        st = td_error_errno(TD_ERR_IO, "cannot read %s", path);
        close(fd);
        goto out;
    }
    o = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!o || !json_is_object(o)) {
        st = td_error(TD_ERR_FORMAT,
                      "%s:%d: not a run record (%s); the run is recovered from "
                      "its files instead",
                      path, jerr.line, o ? "not a JSON object" : jerr.text);
        goto out;
    }
    json_t *fmt = json_object_get(o, "format");
    if (json_is_integer(fmt) && json_integer_value(fmt) > RUN_JSON_FORMAT) {
        st = td_error(TD_ERR_FORMAT,
                      "%s: format %lld is newer than this tandem reads (%d); use a newer tandem",
                      path, (long long)json_integer_value(fmt), RUN_JSON_FORMAT);
        goto out;
    }
    char *status = get_str(o, "status");
    out->id = get_str(o, "id");
    if (!out->id || !status || td_run_status_parse(status, &out->status) != TD_OK) {
        st = td_error(TD_ERR_FORMAT,
                      "%s: no id or no known status (got '%s'); the run is "
                      "recovered from its files instead",
                      path, status ? status : "(none)");
        free(status);
        td_run_clear(out);
        goto out;
    }
    free(status);
    out->workflow = get_str(o, "workflow");
    out->exit_code = (int)get_num(o, "exit_code", -1);
    out->created_s = get_num(o, "created", 0);
    out->started_s = get_num(o, "started", 0);
    out->ended_s = get_num(o, "ended", 0);
    out->command = get_str(o, "command");
    out->code_version = get_str(o, "code_version");
    json_t *params = json_object_get(o, "params");
    if (json_is_object(params))
        out->params_json = json_dumps(params, JSON_COMPACT | JSON_PRESERVE_ORDER);
    else
        out->params_json = get_str(o, "params");
    if (!out->params_json) out->params_json = td_xstrdup("{}");
    out->nodes = (int)get_num(o, "nodes", 1);
    out->nproc_per_node = (int)get_num(o, "nproc_per_node", 1);
    out->restarts = (int)get_num(o, "restarts", 0);
    out->supervisor_pid = (int64_t)get_num(o, "supervisor_pid", 0);
    json_t *start = json_object_get(o, "supervisor_start");
    out->supervisor_start =
        json_is_integer(start) && json_integer_value(start) > 0 ? json_integer_value(start) : 0;
    out->stop_requested = json_is_true(json_object_get(o, "stop_requested"));
    out->note = get_str(o, "note");
    /* Tags that break the rules (a hand edit) are left out, not trusted: they would break
     * tandem tag's comma-separated set. */
    json_t *tags = json_object_get(o, "tags");
    const char *valid[TD_TAGS_MAX];
    size_t nvalid = 0, i;
    json_t *t;
    json_array_foreach(tags, i, t) {
        if (json_is_string(t) && nvalid < TD_TAGS_MAX &&
            td_label_check("tag", json_string_value(t)) == TD_OK)
            valid[nvalid++] = json_string_value(t);
        td_error_clear();
    }
    if (td_tags_edit("", valid, nvalid, NULL, 0, &out->tags) != TD_OK) td_error_clear();
    out->group = get_str(o, "group");
    if (out->group && td_label_check("group", out->group) != TD_OK) {
        td_error_clear();
        free(out->group);
        out->group = NULL;
    }
    out->notes = get_str(o, "notes");
    out->archived = json_is_true(json_object_get(o, "archived"));
    out->config_json = object_text(o, "config");
    out->summary_json = object_text(o, "summary");
    /* The directory is where the run is now (the project may have moved since). */
    out->run_dir = td_xstrdup(run_dir);
    *found = 1;
out:
    json_decref(o);
    free(path);
    return st;
}
