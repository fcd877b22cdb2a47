/* The end record of a node agent (endrec.h): written with jansson, read field by field with a
 * named error for anything missing or of the wrong type. */
#include "tandem/endrec.h"

#include "tandem/os.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define RECORD_NAME    "tandem.launch.end"
#define RECORD_VERSION 1

static const char *const outcome_names[TD_END_OUTCOME_COUNT] = {
    "succeeded", "failed", "stopped", "preempted", "interrupted", "error"};

const char *td_end_outcome_str(td_end_outcome o) {
    return (unsigned)o < TD_END_OUTCOME_COUNT ? outcome_names[o] : "unknown";
}

static json_t *worker_json(const td_end_worker *w) {
    return json_pack("{s:i, s:i, s:i, s:i, s:i}", "rank", w->rank, "local_rank", w->local_rank,
                     "node", w->node, "exit_code", w->exit_code, "signal", w->signal);
}

td_status td_end_record_write(const char *path, const td_end_record *r) {
    json_t *o = json_pack(
        "{s:s, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "record", RECORD_NAME, "version",
        RECORD_VERSION, "outcome", td_end_outcome_str(r->outcome), "exit_code", r->exit_code,
        "node_rank", r->node_rank, "nnodes", r->nnodes, "restarts", r->restarts, "max_restarts",
        r->max_restarts, "stop_signal", r->stop_signal, "cause", r->cause);
    if (!o) return td_error(TD_ERR_NOMEM, "end record %s: could not build it", path);
    if (r->has_failure) {
        json_t *f = worker_json(&r->failure);
        if (f) json_object_set_new(f, "last_line", json_string(r->failure_line));
        json_object_set_new(o, "failure", f ? f : json_null());
    }
    json_t *ws = json_array();
    for (int i = 0; i < r->nworkers; i++) json_array_append_new(ws, worker_json(&r->workers[i]));
    json_object_set_new(o, "workers", ws);
    /* json_string refuses invalid UTF-8 (a worker's raw bytes): those fields become null above;
     * the dump below never fails for that reason. */
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) return td_error(TD_ERR_NOMEM, "end record %s: could not encode it", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps' terminator becomes the line's end */
    td_chunk c = {text, len + 1};
    td_status st = td_write_atomic(path, "end record", &c, 1);
    free(text);
    return st;
}

/* Field readers: a missing or mistyped field is an error naming it. */
static td_status get_int(const char *path, json_t *o, const char *key, int *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return td_error(TD_ERR_FORMAT, "end record %s: \"%s\" is %s, expected an integer", path,
                        key, v ? "not an integer" : "missing");
    *out = (int)json_integer_value(v);
    return TD_OK;
}

static void get_text(json_t *o, const char *key, char *out, size_t n) {
    json_t *v = json_object_get(o, key);
    snprintf(out, n, "%s", json_is_string(v) ? json_string_value(v) : "");
}

static td_status get_worker(const char *path, json_t *o, td_end_worker *w) {
    if (!json_is_object(o))
        return td_error(TD_ERR_FORMAT, "end record %s: a worker entry is not an object", path);
    TD_CHECK(get_int(path, o, "rank", &w->rank));
    TD_CHECK(get_int(path, o, "local_rank", &w->local_rank));
    TD_CHECK(get_int(path, o, "exit_code", &w->exit_code));
    TD_CHECK(get_int(path, o, "signal", &w->signal));
    w->node = 0;
    json_t *node = json_object_get(o, "node");
    if (json_is_integer(node)) w->node = (int)json_integer_value(node);
    return TD_OK;
}

static td_status parse(const char *path, json_t *o, td_end_record *r) {
    json_t *name = json_object_get(o, "record");
    if (!json_is_string(name) || strcmp(json_string_value(name), RECORD_NAME))
        return td_error(TD_ERR_FORMAT, "%s is not a tandem launch end record (\"record\": \"%s\")",
                        path, RECORD_NAME);
    int version = 0;
    TD_CHECK(get_int(path, o, "version", &version));
    if (version < 1)
        return td_error(TD_ERR_FORMAT, "end record %s: version %d is not a version", path, version);
    json_t *oc = json_object_get(o, "outcome");
    r->outcome = TD_END_OUTCOME_COUNT;
    for (int i = 0; i < TD_END_OUTCOME_COUNT; i++)
        if (json_is_string(oc) && !strcmp(json_string_value(oc), outcome_names[i]))
            r->outcome = (td_end_outcome)i;
    if (r->outcome == TD_END_OUTCOME_COUNT)
        return td_error(TD_ERR_FORMAT,
                        "end record %s: \"outcome\" is not one of succeeded, "
                        "failed, stopped, preempted, interrupted, error",
                        path);
    TD_CHECK(get_int(path, o, "exit_code", &r->exit_code));
    TD_CHECK(get_int(path, o, "node_rank", &r->node_rank));
    TD_CHECK(get_int(path, o, "nnodes", &r->nnodes));
    TD_CHECK(get_int(path, o, "restarts", &r->restarts));
    TD_CHECK(get_int(path, o, "max_restarts", &r->max_restarts));
    TD_CHECK(get_int(path, o, "stop_signal", &r->stop_signal));
    get_text(o, "cause", r->cause, sizeof r->cause);
    json_t *f = json_object_get(o, "failure");
    if (json_is_object(f)) {
        TD_CHECK(get_worker(path, f, &r->failure));
        get_text(f, "last_line", r->failure_line, sizeof r->failure_line);
        r->has_failure = true;
    }
    json_t *ws = json_object_get(o, "workers");
    if (!json_is_array(ws))
        return td_error(TD_ERR_FORMAT, "end record %s: \"workers\" is %s, expected a list", path,
                        ws ? "not a list" : "missing");
    size_t n = json_array_size(ws);
    r->workers = n ? td_xcalloc(n, sizeof *r->workers) : NULL;
    for (size_t i = 0; i < n; i++) {
        TD_CHECK(get_worker(path, json_array_get(ws, i), &r->workers[i]));
        r->nworkers = (int)i + 1;
    }
    return TD_OK;
}

td_status td_end_record_read(const char *path, td_end_record *r) {
    memset(r, 0, sizeof *r);
    /* Only a regular file is read (never a FIFO that would block the supervisor). */
    const char *kind = td_file_kind(path);
    if (kind) return td_error(TD_ERR_FORMAT, "end record %s is %s, not a regular file", path, kind);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        if (errno == ENOENT)
            return td_error(TD_ERR_NOTFOUND, "end record %s: none was written", path);
        return td_error(TD_ERR_FORMAT, "end record %s: line %d: %s", path, je.line, je.text);
    }
    td_status st = json_is_object(o)
                       ? parse(path, o, r)
                       : td_error(TD_ERR_FORMAT, "end record %s: not an object", path);
    json_decref(o);
    if (st != TD_OK) td_end_record_clear(r);
    return st;
}

void td_end_record_clear(td_end_record *r) {
    free(r->workers);
    memset(r, 0, sizeof *r);
}
