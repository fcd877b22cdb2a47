/* The run's restart and resume marks (docs/ui-api.md, "marks"): read from the event lines of its
 * workers' metrics files, RUN/metrics/rank-<R>.jsonl, which are the record of them (the store
 * applies a resume's cut and keeps no trace of it). A trainer that restarts from a checkpoint
 * writes {"event": "resume", "step": S} there (tandem train, tandem.checkpoint in Python), after
 * a worker restart by the launcher as after `tandem run --resume`; {"event": "restart", ...}
 * lines are read the same way. Only lines holding the text "event" are parsed, so a scan reads
 * the files at memory speed; results are cached per file by (size, mtime), and a file that only
 * grew is read from where the last scan stopped. */
#include "ui_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MARKS_CHUNK_BYTES (1 << 20)
#define MARKS_MAX         1000 /* per file: a file of nothing but events is not a chart's business */

typedef struct mark {
    int kind; /* 0 resume, 1 restart */
    int rank;
    int64_t step;
    double time;   /* 0: unknown yet */
    int want_time; /* the next line with a "time" gives it */
} mark;

typedef struct mark_file {
    char *path;
    int64_t scanned; /* bytes read, up to the end of the last whole line */
    int64_t size;
    int64_t mtime_ns;
    mark *marks;
    size_t nmarks;
} mark_file;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static mark_file *cache;
static size_t ncache;

static int rank_of(const char *name) {
    size_t n = strlen(name);
    if (strncmp(name, "rank-", 5) || n < 12 || strcmp(name + n - 6, ".jsonl")) return -1;
    char *end;
    long r = strtol(name + 5, &end, 10);
    return end == name + n - 6 && r >= 0 && r < 1000000 ? (int)r : -1;
}

static mark_file *cached(const char *path) {
    for (size_t i = 0; i < ncache; i++)
        if (!strcmp(cache[i].path, path)) return &cache[i];
    cache = td_xrealloc(cache, (ncache + 1) * sizeof *cache);
    cache[ncache] = (mark_file){.path = td_xstrdup(path)};
    return &cache[ncache++];
}

/* One line: an event becomes a mark; a line with a "time" dates the marks still waiting. */
static void scan_line(mark_file *f, int rank, const char *line, size_t n) {
    int has_event = memmem(line, n, "\"event\"", 7) != NULL;
    int waiting = f->nmarks && f->marks[f->nmarks - 1].want_time;
    if (!has_event && !(waiting && memmem(line, n, "\"time\"", 6))) return;
    json_t *o = json_loadb(line, n, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    json_t *t = json_object_get(o, "time");
    double when = json_is_number(t) ? json_number_value(t) : 0;
    if (when > 0)
        for (size_t i = f->nmarks; i > 0 && f->marks[i - 1].want_time; i--) {
            f->marks[i - 1].time = when;
            f->marks[i - 1].want_time = 0;
        }
    const char *ev = json_string_value(json_object_get(o, "event"));
    json_t *step = json_object_get(o, "step");
    int kind = !ev ? -1 : !strcmp(ev, "resume") ? 0 : !strcmp(ev, "restart") ? 1 : -1;
    if (kind >= 0 && json_is_integer(step) && f->nmarks < MARKS_MAX) {
        f->marks = td_xrealloc(f->marks, (f->nmarks + 1) * sizeof *f->marks);
        f->marks[f->nmarks++] =
            (mark){kind, rank, (int64_t)json_integer_value(step), when, when <= 0};
    }
    json_decref(o);
}

static void scan_file(mark_file *f, int rank, int fd, const struct stat *sb, char **chunk) {
    int64_t mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    if ((int64_t)sb->st_size < f->scanned) { /* rewritten: start again */
        free(f->marks);
        f->marks = NULL;
        f->nmarks = 0;
        f->scanned = 0;
    }
    if ((int64_t)sb->st_size == f->size && mtime_ns == f->mtime_ns) return;
    f->size = (int64_t)sb->st_size;
    f->mtime_ns = mtime_ns;
    while (f->scanned < f->size) {
        int64_t left = f->size - f->scanned;
        size_t k = (size_t)(left < MARKS_CHUNK_BYTES ? left : MARKS_CHUNK_BYTES);
        if (!*chunk) *chunk = td_xmalloc(MARKS_CHUNK_BYTES);
        if (td__ui_pread_all(fd, *chunk, k, f->scanned) != 0) break;
        size_t used = 0;
        for (;;) {
            char *nl = memchr(*chunk + used, '\n', k - used);
            if (!nl) break;
            size_t len = (size_t)(nl - (*chunk + used));
            scan_line(f, rank, *chunk + used, len);
            used += len + 1;
        }
        if (used == 0) {                      /* a line longer than a chunk: skip it whole */
            if (k < MARKS_CHUNK_BYTES) break; /* or a partial last line */
            int64_t p = f->scanned + (int64_t)k;
            char c = 0;
            while (p < f->size && td__ui_pread_all(fd, &c, 1, p) == 0 && c != '\n') p++;
            if (p >= f->size) break;
            f->scanned = p + 1;
            continue;
        }
        f->scanned += (int64_t)used;
    }
    /* A partial last line is read again next time: the size must not say it was seen. */
    if (f->scanned < f->size) f->size = -1;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

json_t *td__ui_marks_json(const td_run *run) {
    json_t *arr = json_array();
    if (!run->run_dir) return arr;
    char *dir = td_run_path(run->run_dir, TD_RUN_PATH_METRICS);
    DIR *d = opendir(dir);
    if (!d) {
        free(dir);
        return arr;
    }
    int *ranks = NULL;
    size_t nranks = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int rank = rank_of(e->d_name);
        if (rank < 0) continue;
        ranks = td_xrealloc(ranks, (nranks + 1) * sizeof *ranks);
        ranks[nranks++] = rank;
    }
    closedir(d);
    if (nranks) qsort(ranks, nranks, sizeof *ranks, cmp_int);
    char *chunk = NULL;
    pthread_mutex_lock(&cache_lock);
    for (size_t r = 0; r < nranks; r++) {
        char *path = td_xasprintf("%s/rank-%d.jsonl", dir, ranks[r]);
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat sb;
        if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
            mark_file *f = cached(path);
            scan_file(f, ranks[r], fd, &sb, &chunk);
            for (size_t i = 0; i < f->nmarks; i++) {
                const mark *m = &f->marks[i];
                json_array_append_new(
                    arr, json_pack("{s:s,s:i,s:I,s:o}", "kind", m->kind ? "restart" : "resume",
                                   "rank", m->rank, "step", (json_int_t)m->step, "time",
                                   m->time > 0 ? json_real(m->time) : json_null()));
            }
        }
        if (fd >= 0) close(fd);
        free(path);
    }
    pthread_mutex_unlock(&cache_lock);
    free(ranks);
    free(chunk);
    free(dir);
    return arr;
}
