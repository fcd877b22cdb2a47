/* A run's record without the store: its status names, its directory's layout, freeing it, the
 * number at the end of its id, and the checks and edits of its labels. Nothing here touches
 * the database, so every other file of the store may use it. */
#include "store_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const status_text[] = {
#define TD__RUN_STATUS_TEXT(name, text) text,
    TD_RUN_STATUS_MAP(TD__RUN_STATUS_TEXT)
#undef TD__RUN_STATUS_TEXT
};

const char *td_run_status_str(td_run_status st) {
    return (unsigned)st < TD_RUN_STATUS_COUNT ? status_text[st] : "unknown";
}

td_status td_run_status_parse(const char *text, td_run_status *out) {
    for (int i = 0; i < TD_RUN_STATUS_COUNT; i++)
        if (text && !strcmp(text, status_text[i])) {
            *out = (td_run_status)i;
            return TD_OK;
        }
    return td_error(TD_ERR_INVALID, "unknown run status '%s'", text ? text : "(null)");
}

int td_run_status_is_final(td_run_status st) {
    return st == TD_RUN_SUCCEEDED || st == TD_RUN_FAILED || st == TD_RUN_STOPPED ||
           st == TD_RUN_PREEMPTED;
}

/* ---- the run directory's layout (TD_RUN_LAYOUT) ---- */
#define TD__RUN_PATH_NAME(id, name, doc) [TD_RUN_PATH_##id] = name,
static const char *const run_path_names[TD_RUN_PATH_COUNT] = {TD_RUN_LAYOUT(TD__RUN_PATH_NAME)};
#undef TD__RUN_PATH_NAME

const char *td_run_path_name(td_run_path_id id) {
    return id >= 0 && id < TD_RUN_PATH_COUNT ? run_path_names[id] : "";
}

char *td_run_path(const char *run_dir, td_run_path_id id) {
    return td_xasprintf("%s/%s", run_dir, td_run_path_name(id));
}

void td_run_clear(td_run *run) {
    if (!run) return;
    free(run->id);
    free(run->workflow);
    free(run->command);
    free(run->code_version);
    free(run->params_json);
    free(run->run_dir);
    free(run->note);
    free(run->tags);
    free(run->group);
    free(run->notes);
    free(run->config_json);
    free(run->summary_json);
    memset(run, 0, sizeof *run);
}

void td_runs_free(td_run *runs, size_t count) {
    for (size_t i = 0; i < count; i++) td_run_clear(&runs[i]);
    free(runs);
}

int64_t td__run_number(const char *id) {
    const char *dash = id ? strrchr(id, '-') : NULL;
    if (!dash || dash == id || !dash[1]) return -1;
    int64_t n = 0;
    for (const char *p = dash + 1; *p; p++) {
        if (*p < '0' || *p > '9' || n > (INT64_MAX - 9) / 10) return -1;
        n = n * 10 + (*p - '0');
    }
    return n > 0 ? n : -1;
}

td_status td_label_check(const char *what, const char *label) {
    size_t len = label ? strlen(label) : 0;
    int ok = len >= 1 && len <= TD_LABEL_MAX;
    for (size_t i = 0; ok && i < len; i++) {
        char c = label[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        ok = alnum || c == '_' ||
             (i > 0 && (c == '.' || c == '-' || c == ':' || c == '/' || c == '='));
    }
    if (ok) return TD_OK;
    /* Control bytes in the value are not echoed as they are: the message reaches a terminal. */
    char shown[3 * TD_LABEL_MAX];
    size_t o = 0;
    for (size_t i = 0; label && label[i] && o + 4 < sizeof shown; i++)
        shown[o++] = (unsigned char)label[i] < 0x20 || label[i] == 0x7f ? '?' : label[i];
    shown[o] = '\0';
    return td_error(TD_ERR_INVALID,
                    "%s '%s'%s: a %s is 1-%d characters of letters, digits and _ . - : / =, "
                    "beginning with a letter, digit or _ (e.g. baseline, lr:3e-4, exp/ablation-2)",
                    what, shown, label && len > TD_LABEL_MAX ? " is too long" : " is not allowed",
                    what, TD_LABEL_MAX);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

td_status td_tags_edit(const char *tags, const char *const *add, size_t nadd,
                       const char *const *del, size_t ndel, char **out) {
    *out = NULL;
    for (size_t i = 0; i < nadd; i++) TD_CHECK(td_label_check("tag", add[i]));
    /* A removal that names no possible tag is a mistake (`tandem tag RUN --help`), not a no-op. */
    for (size_t i = 0; i < ndel; i++) TD_CHECK(td_label_check("tag", del[i]));
    char *copy = td_xstrdup(tags ? tags : "");
    size_t cap = nadd + 1, n = 0;
    for (const char *p = copy; *p; p++) cap += *p == ',';
    const char **set = td_xcalloc(cap, sizeof *set);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
        set[n++] = t;
    for (size_t i = 0; i < nadd; i++) set[n++] = add[i];
    qsort(set, n, sizeof *set, cmp_str);
    size_t kept = 0, len = 1;
    for (size_t i = 0; i < n; i++) {
        int gone = kept && !strcmp(set[kept - 1], set[i]);
        for (size_t j = 0; !gone && j < ndel; j++) gone = !strcmp(del[j], set[i]);
        if (gone) continue;
        set[kept++] = set[i];
        len += strlen(set[i]) + 1;
    }
    td_status st = TD_OK;
    if (kept > TD_TAGS_MAX) {
        st = td_error(TD_ERR_INVALID,
                      "a run has at most %d tags (this would give it %zu); remove some with "
                      "tandem tag RUN -TAG",
                      TD_TAGS_MAX, kept);
    } else {
        char *s = td_xcalloc(len, 1);
        for (size_t i = 0; i < kept; i++) {
            if (i) strcat(s, ",");
            strcat(s, set[i]);
        }
        *out = s;
    }
    free(set);
    free(copy);
    return st;
}
