/* The checkpoint contract (tandem/ckpt.h): names, steps, commits. */
#include "tandem/ckpt.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* 1 to 18 digits at s, ending at end (exclusive); false otherwise. */
static bool digits(const char *s, const char *end, int64_t *v) {
    size_t n = (size_t)(end - s);
    if (n < 1 || n > 18) return false;
    int64_t x = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9') return false;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    return true;
}

/* name == prefix DIGITS suffix */
static bool framed(const char *name, const char *prefix, const char *suffix, int64_t *step) {
    size_t n = strlen(name), np = strlen(prefix), ns = strlen(suffix);
    if (n <= np + ns || strncmp(name, prefix, np) || strcmp(name + n - ns, suffix)) return false;
    return digits(name + np, name + n - ns, step);
}

bool td_ckpt_parse(const char *name, td_ckpt_name *out) {
    td_ckpt_name r = {TD_CKPT_NONE, -1, false};
    int64_t step;
    size_t n = strlen(name);
    if (!n || name[0] == '.' || strchr(name, '/')) {
    } else if (framed(name, "ckpt-", ".tdck", &step)) {
        r = (td_ckpt_name){TD_CKPT_TDCK, step, false};
    } else if (framed(name, "step-", ".pt", &step)) {
        r = (td_ckpt_name){TD_CKPT_SDK, step, false};
    } else if (framed(name, "checkpoint-", "", &step)) {
        r = (td_ckpt_name){TD_CKPT_HF, step, true};
    } else if (n > 5 && !strcmp(name + n - 5, ".ckpt")) {
        r = (td_ckpt_name){TD_CKPT_LIGHTNING, -1, false};
        /* the last "step=DIGITS" of the name */
        const char *end = name + n - 5, *at = NULL;
        for (const char *p = name; (p = strstr(p, "step=")) && p < end; p++) at = p;
        if (at) {
            const char *d = at + 5, *e = d;
            while (e < end && *e >= '0' && *e <= '9') e++;
            if (digits(d, e, &step)) r.step = step;
        }
    }
    if (out) *out = r;
    return r.kind != TD_CKPT_NONE;
}

bool td_ckpt_build(td_ckpt_kind kind, int64_t step, char *buf, size_t nbytes) {
    int len = -1;
    if (nbytes) buf[0] = '\0';
    if (step < 0 || step > 999999999999999999LL) return false;
    if (kind == TD_CKPT_TDCK)
        len = snprintf(buf, nbytes, "ckpt-%" PRId64 ".tdck", step);
    else if (kind == TD_CKPT_SDK)
        len = snprintf(buf, nbytes, "step-%012" PRId64 ".pt", step);
    else if (kind == TD_CKPT_HF)
        len = snprintf(buf, nbytes, "checkpoint-%" PRId64, step);
    if (len < 0 || (size_t)len >= nbytes) {
        if (nbytes) buf[0] = '\0';
        return false;
    }
    return true;
}

const char *td_ckpt_kind_name(td_ckpt_kind kind) {
    switch (kind) {
    case TD_CKPT_TDCK: return "tdck";
    case TD_CKPT_SDK: return "sdk";
    case TD_CKPT_LIGHTNING: return "lightning";
    case TD_CKPT_HF: return "hf";
    default: return "-";
    }
}

static bool regular(const char *dir, const char *name, const char *sub) {
    char *p = sub ? td_xasprintf("%s/%s/%s", dir, name, sub) : td_xasprintf("%s/%s", dir, name);
    struct stat sb;
    bool ok = lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return ok;
}

bool td_ckpt_committed(const char *dir, const char *name, td_ckpt_name *out) {
    td_ckpt_name n;
    if (out) *out = (td_ckpt_name){TD_CKPT_NONE, -1, false};
    if (!td_ckpt_parse(name, &n)) return false;
    bool ok;
    if (!n.is_dir) {
        ok = regular(dir, name, NULL);
    } else {
        char *p = td_xasprintf("%s/%s", dir, name);
        struct stat sb;
        ok = lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode) &&
             (regular(dir, name, TD_CKPT_MARKER) || regular(dir, name, TD_CKPT_HF_MARKER));
        free(p);
    }
    if (ok && out) *out = n;
    return ok;
}

static int cmp_entry(const void *a, const void *b) {
    const td_ckpt_entry *x = a, *y = b;
    if (x->n.step != y->n.step) return x->n.step < y->n.step ? 1 : -1;
    return strcmp(x->name, y->name);
}

td_ckpt_entry *td_ckpt_list(const char *dir, unsigned mask, int *count) {
    *count = 0;
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return NULL;
    td_ckpt_entry *v = NULL;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        td_ckpt_name n;
        if (!td_ckpt_parse(e->d_name, &n) || !(n.kind & mask) ||
            !td_ckpt_committed(dir, e->d_name, &n))
            continue;
        if (*count == cap) v = td_xrealloc(v, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *v);
        v[(*count)++] = (td_ckpt_entry){td_xstrdup(e->d_name), n};
    }
    closedir(d);
    if (*count) qsort(v, (size_t)*count, sizeof *v, cmp_entry);
    return v;
}

void td_ckpt_list_free(td_ckpt_entry *v, int count) {
    for (int i = 0; i < count; i++) free(v[i].name);
    free(v);
}

int64_t td_ckpt_newest(const char *dir, unsigned mask, char *name_out, size_t nbytes) {
    int n;
    td_ckpt_entry *v = td_ckpt_list(dir, mask, &n);
    int64_t step = n && v[0].n.step >= 0 ? v[0].n.step : -1;
    if (name_out && nbytes) snprintf(name_out, nbytes, "%s", step >= 0 ? v[0].name : "");
    td_ckpt_list_free(v, n);
    return step;
}

typedef struct {
    char **v;
    int n, cap;
} file_list;

static void list_add(file_list *l, char *path) {
    if (l->n == l->cap) l->v = td_xrealloc(l->v, (size_t)(l->cap = l->cap ? 2 * l->cap : 16) *
                                                     sizeof *l->v);
    l->v[l->n++] = path;
}

static void walk(file_list *l, const char *dir, const char *rel, int depth) {
    char *path = td_xasprintf("%s/%s", dir, rel);
    DIR *d = depth < 32 ? opendir(path) : NULL;
    free(path);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char *sub = td_xasprintf("%s/%s", rel, e->d_name);
        char *full = td_xasprintf("%s/%s", dir, sub);
        struct stat sb;
        if (lstat(full, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            walk(l, dir, sub, depth + 1);
            free(sub);
        } else if (lstat(full, &sb) == 0 && S_ISREG(sb.st_mode)) {
            list_add(l, sub);
        } else {
            free(sub);
        }
        free(full);
    }
    closedir(d);
}

char **td_ckpt_dir_files(const char *dir, const char *name, int *count) {
    file_list l = {0};
    walk(&l, dir, name, 0);
    char *marker = td_xasprintf("%s/%s", name, TD_CKPT_HF_MARKER);
    for (int i = 0; i + 1 < l.n; i++)
        if (!strcmp(l.v[i], marker)) { /* to the end, the others in their order */
            char *m = l.v[i];
            memmove(&l.v[i], &l.v[i + 1], (size_t)(l.n - i - 1) * sizeof *l.v);
            l.v[l.n - 1] = m;
            break;
        }
    free(marker);
    *count = l.n;
    return l.v;
}

void td_ckpt_files_free(char **v, int count) {
    for (int i = 0; i < count; i++) free(v[i]);
    free(v);
}
