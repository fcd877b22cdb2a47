/* The run's restart and resume marks (docs/ui-api.md, "marks"): read from the event lines of its
 * workers' metrics files, RUN/metrics/rank-<R>.jsonl, which are the record of them (the store
 * applies a resume's cut and keeps no trace of it). A trainer that restarts from a checkpoint
 * writes {"event": "resume", "step": S} there (tandem train, tandem.checkpoint in Python), after
 * a worker restart by the launcher as after `tandem run --resume`; {"event": "restart", ...}
 * lines are read the same way. Only lines holding the text "event" are parsed, so a scan reads
 * the files at memory speed; results are cached per file by (size, mtime), and a file that only
 * grew is read from where the last scan stopped.
 *
 * One run's files must not hold up another run's page (issue 29: a run with a metrics file of
 * many GB stalled every page): a request reads at most MARKS_REQUEST_BYTES of a run's files and
 * answers with what it has ("marks_partial"), the next request going on from there; and each
 * file has a lock of its own, the cache's lock being held only to find the file's entry. */
#include "ui_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MARKS_CHUNK_BYTES (1 << 20)
#define MARKS_MAX         1000 /* per file: a file of nothing but events is not a chart's business */
/* Read per request and run, over all its files: about 30 ms at memory speed, and a chunk more
 * at most (a chunk is read whole once begun). */
#define MARKS_REQUEST_BYTES ((int64_t)64 << 20)

typedef struct mark {
    int kind; /* 0 resume, 1 restart */
    int rank;
    int64_t step;
    double time;   /* 0: unknown yet */
    int want_time; /* the next line with a "time" gives it */
} mark;

typedef struct mark_file {
    pthread_mutex_t lock; /* held while the file is read and its marks copied out */
    char *path;
    int64_t scanned; /* bytes read, up to the end of the last whole line */
    int64_t size;
    int64_t mtime_ns;
    int skipping; /* inside a line longer than a chunk: read on to its end, unparsed */
    mark *marks;
    size_t nmarks;
} mark_file;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER; /* the array, not the files */
static mark_file **cache; /* pointers: an entry stays put while the array grows */
static size_t ncache;

static int rank_of(const char *name) {
    size_t n = strlen(name);
    if (strncmp(name, "rank-", 5) || n < 12 || strcmp(name + n - 6, ".jsonl")) return -1;
    char *end;
    long r = strtol(name + 5, &end, 10);
    return end == name + n - 6 && r >= 0 && r < 1000000 ? (int)r : -1;
}

/* The file's entry, locked (the caller unlocks f->lock). */
static mark_file *cached(const char *path) {
    mark_file *f = NULL;
    pthread_mutex_lock(&cache_lock);
    for (size_t i = 0; i < ncache && !f; i++)
        if (!strcmp(cache[i]->path, path)) f = cache[i];
    if (!f) {
        f = td_xcalloc(1, sizeof *f);
        pthread_mutex_init(&f->lock, NULL);
        f->path = td_xstrdup(path);
        cache = td_xrealloc(cache, (ncache + 1) * sizeof *cache);
        cache[ncache++] = f;
    }
    pthread_mutex_unlock(&cache_lock);
    pthread_mutex_lock(&f->lock);
    return f;
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

/* Reads the file on from where the last scan stopped, while *budget (bytes, taken off it) lasts.
 * 1: read to its end; 0: the budget ran out first (a later call goes on). */
static int scan_file(mark_file *f, int rank, int fd, const struct stat *sb, char **chunk,
                     int64_t *budget) {
    int64_t mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    if ((int64_t)sb->st_size < f->scanned) { /* rewritten: start again */
        free(f->marks);
        f->marks = NULL;
        f->nmarks = 0;
        f->scanned = 0;
        f->skipping = 0;
    }
    if ((int64_t)sb->st_size == f->size && mtime_ns == f->mtime_ns) return 1;
    int64_t size = (int64_t)sb->st_size;
    while (f->scanned < size && *budget > 0) {
        int64_t left = size - f->scanned;
        size_t k = (size_t)(left < MARKS_CHUNK_BYTES ? left : MARKS_CHUNK_BYTES);
        if (!*chunk) *chunk = td_xmalloc(MARKS_CHUNK_BYTES);
        if (td__ui_pread_all(fd, *chunk, k, f->scanned) != 0) break;
        *budget -= (int64_t)k;
        size_t used = 0;
        if (f->skipping) { /* the rest of a line longer than a chunk, up to its newline */
            char *nl = memchr(*chunk, '\n', k);
            used = nl ? (size_t)(nl - *chunk) + 1 : k;
            f->skipping = !nl;
            f->scanned += (int64_t)used;
            continue;
        }
        for (;;) {
            char *nl = memchr(*chunk + used, '\n', k - used);
            if (!nl) break;
            size_t len = (size_t)(nl - (*chunk + used));
            scan_line(f, rank, *chunk + used, len);
            used += len + 1;
        }
        if (used == 0) {
            if (k < MARKS_CHUNK_BYTES) break; /* a partial last line: read again next time */
            f->skipping = 1;                  /* a line longer than a chunk: skip it whole */
            used = k;
        }
        f->scanned += (int64_t)used;
    }
    /* Kept as read only when read to its end: a partial last line, or a read that the budget
     * cut, goes on next time. Only the budget makes the answer partial. */
    f->size = f->scanned >= size ? size : -1;
    f->mtime_ns = mtime_ns;
    return f->scanned >= size || *budget > 0;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

json_t *td__ui_marks_json(const td_run *run, int *partial) {
    json_t *arr = json_array();
    *partial = 0;
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
    int64_t budget = MARKS_REQUEST_BYTES;
    for (size_t r = 0; r < nranks; r++) {
        char *path = td_xasprintf("%s/rank-%d.jsonl", dir, ranks[r]);
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat sb;
        if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
            mark_file *f = cached(path);
            if (!scan_file(f, ranks[r], fd, &sb, &chunk, &budget)) *partial = 1;
            for (size_t i = 0; i < f->nmarks; i++) {
                const mark *m = &f->marks[i];
                json_array_append_new(
                    arr, json_pack("{s:s,s:i,s:I,s:o}", "kind", m->kind ? "restart" : "resume",
                                   "rank", m->rank, "step", (json_int_t)m->step, "time",
                                   m->time > 0 ? json_real(m->time) : json_null()));
            }
            pthread_mutex_unlock(&f->lock);
        }
        if (fd >= 0) close(fd);
        free(path);
    }
    free(ranks);
    free(chunk);
    free(dir);
    return arr;
}
