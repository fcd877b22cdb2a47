/* Allocation wrappers (abort on out-of-memory, by policy) and the scratch arena. */
#include "tandem/core.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t nbytes) {
    fprintf(stderr, "tandem: fatal: out of memory allocating %zu bytes\n", nbytes);
    abort();
}

void *td_xmalloc(size_t nbytes) {
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) oom(nbytes);
    return p;
}

void *td_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *td_xrealloc(void *ptr, size_t nbytes) {
    void *p = realloc(ptr, nbytes ? nbytes : 1);
    if (!p) oom(nbytes);
    return p;
}

void *td_xmalloc_aligned(size_t nbytes) {
    void *p = NULL;
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) oom(nbytes);
    return p;
}

char *td_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = td_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

char *td_xstrndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *p = td_xmalloc(len + 1);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

char *td_xasprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    char *p = td_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void td_arena_init(td_arena *arena, size_t capacity_bytes) {
    arena->base = td_xmalloc_aligned(capacity_bytes);
    arena->capacity_bytes = capacity_bytes;
    arena->used_bytes = 0;
    arena->peak_bytes = 0;
}

void td_arena_free(td_arena *arena) {
    free(arena->base);
    memset(arena, 0, sizeof *arena);
}

void *td_arena_alloc(td_arena *arena, size_t nbytes) {
    size_t start = (arena->used_bytes + 63) & ~(size_t)63;
    if (start > arena->capacity_bytes || nbytes > arena->capacity_bytes - start) return NULL;
    arena->used_bytes = start + nbytes;
    if (arena->used_bytes > arena->peak_bytes) arena->peak_bytes = arena->used_bytes;
    return arena->base + start;
}

void td_arena_reset(td_arena *arena) {
    arena->used_bytes = 0;
}
