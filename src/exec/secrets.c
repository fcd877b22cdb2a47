/* A job's secrets (exec.h): "NAME=VALUE" strings every executor delivers to its node agents'
 * environment without writing them anywhere. This file keeps the list; each carrier delivers it
 * (local.c, ssh.c, slurm.c). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "exec/internal.h"

const char *const td_exec_aws_secret_names[] = {
    "AWS_ACCESS_KEY_ID",  "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",   "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",      "AWS_ENDPOINT_URL_S3", NULL,
};

bool td_exec_secret_name_ok(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 128 || isdigit((unsigned char)name[0])) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_') return false;
    /* tandem sets these for the workers itself: a secret would silently lose to them */
    return strncmp(name, "TANDEM_", 7) != 0 && strcmp(name, "PATH") != 0;
}

/* The index of name's entry, or count. */
static size_t find(const td_exec_secrets *s, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < s->count; i++)
        if (!strncmp(s->v[i], name, n) && s->v[i][n] == '=') return i;
    return s->count;
}

/* Frees an entry, its value wiped first: a freed heap block is not where a secret should
 * linger (a core dump, the next allocation's garbage). */
static void wipe(char *entry) {
    if (!entry) return;
    volatile char *p = entry;
    while (*p) *p++ = 0;
    free(entry);
}

td_status td_exec_secrets_set(td_exec_secrets *s, const char *name, const char *value) {
    if (!td_exec_secret_name_ok(name))
        return td_error(TD_ERR_INVALID,
                        "secret '%s': a secret's name must be an environment variable name "
                        "(letters, digits and '_', not starting with a digit, 128 bytes at most) "
                        "and not one tandem sets itself (TANDEM_*, PATH)",
                        name ? name : "");
    if (strlen(value) > TD_EXEC_SECRET_MAX_BYTES)
        return td_error(TD_ERR_INVALID,
                        "secret %s is %zu bytes long; at most %d bytes can be passed to the "
                        "nodes",
                        name, strlen(value), TD_EXEC_SECRET_MAX_BYTES);
    char *entry = td_xasprintf("%s=%s", name, value);
    size_t i = find(s, name);
    if (i < s->count) {
        wipe(s->v[i]);
        s->v[i] = entry;
        return TD_OK;
    }
    s->v = td_xrealloc(s->v, (s->count + 2) * sizeof *s->v);
    s->v[s->count++] = entry;
    s->v[s->count] = NULL;
    return TD_OK;
}

size_t td_exec_secrets_add_aws(td_exec_secrets *s) {
    size_t added = 0;
    for (const char *const *n = td_exec_aws_secret_names; *n; n++) {
        const char *v = getenv(*n);
        if (!v || !*v) continue;
        if (td_exec_secrets_set(s, *n, v) == TD_OK)
            added++;
        else /* only a value over the limit: the agent's client then finds none and says so */
            TD_LOG_WARN("%s; not passed to the nodes", td_error_msg());
        td_error_clear();
    }
    return added;
}

void td_exec_secrets_free(td_exec_secrets *s) {
    for (size_t i = 0; i < s->count; i++) wipe(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->count = 0;
}

const char *td_exec_secret_value(char *const *secrets, const char *name) {
    size_t n = strlen(name);
    for (char *const *e = secrets; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

char *td__exec_secret_lines(char *const *secrets) {
    static const char hex[] = "0123456789abcdef";
    size_t cap = 1;
    for (char *const *e = secrets; e && *e; e++) cap += 8 + 2 * strlen(*e);
    char *out = td_xcalloc(cap, 1), *p = out;
    for (char *const *e = secrets; e && *e; e++) {
        size_t n = strcspn(*e, "=");
        memcpy(p, "secret ", 7);
        p += 7;
        memcpy(p, *e, n);
        p += n;
        *p++ = ' ';
        for (const unsigned char *v = (const unsigned char *)*e + n + 1; *v; v++) {
            *p++ = hex[*v >> 4];
            *p++ = hex[*v & 15];
        }
        *p++ = '\n';
    }
    *p = '\0';
    return out;
}

void td__exec_wipe_free(char *s) {
    wipe(s);
}
