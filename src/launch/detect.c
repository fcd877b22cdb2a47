/* launch: the topology from the scheduler that started `tandem launch` (Open MPI's mpirun, Slurm's
 * srun, SkyPilot, dstack, SageMaker), so that one command line works on every node.
 *
 * td_launch_detect is a pure function of an environment array: tests feed it synthetic ones,
 * cmd_launch feeds it `environ` when no rendezvous flag was given. It never guesses: a variable
 * that is missing or disagrees with another is an error naming both values and the fix, because
 * a wrong guess shows up much later as a launcher waiting at the rendezvous for a node that will
 * never come. docs/launch.md ("Inside a scheduler") lists every variable read here. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/launch.h"

/* More nodes than this is a typo in a variable, not a job. */
#define MAX_NODES 65536
/* Slurm's own limit on one bracket range, and ours on a whole hostlist. */
#define HOSTLIST_MAX 65536
#define HOSTNAME_MAX 255
/* torchrun's default rendezvous port; the platforms without a port of their own get it. */
#define DEFAULT_RDZV_PORT 29400
/* The port `--master-addr` pairs with when no `--master-port` is given (as torchrun). */
#define DEFAULT_MASTER_PORT 29500

/* ---- a growable list of strings ---- */
typedef struct {
    char **v;
    int n, cap;
} strlist;

static void sl_push(strlist *l, char *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = td_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = s;
}

static void sl_free(strlist *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

/* ---- Slurm hostlists ----
 * What `scontrol show hostnames` prints, following Slurm's src/common/hostlist.c
 * (_hostlist_create_bracketed, _push_range_list): names are separated by ',', space, tab or
 * newline outside brackets; in each name the LAST bracket group is the innermost loop, any text
 * after it is a suffix ("a[01-03]b"), and the groups before it are expanded recursively from the
 * right: for "a[1-2]b[3-4]c[5-6]" Slurm loops over [3-4] outermost, then [1-2], then [5-6]
 * (a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ...), and so do we. A number is printed zero-padded to
 * the width of its range's lower bound as written ("[08-10]" gives 08 09 10, "[8-10]" 8 9 10).
 * Stricter than Slurm only where Slurm accepts what it never writes ("a[1-]", "a[+1]"). */
typedef struct {
    uint64_t lo, hi;
    int width;
} hl_range;

typedef struct {
    const char *whole; /* the hostlist, for messages */
    strlist out;
} hl_state;

static td_status hl_bad(const hl_state *s, const char *what, const char *near) {
    return td_error(TD_ERR_INVALID,
                    "hostlist '%s': %s at '%s' (expected names like node[1-3,5] or a[01-03]b)",
                    s->whole, what, near);
}

/* Parses "1-3,5,08-10" (the text between one pair of brackets, len bytes) into *ranges. */
static td_status hl_parse_ranges(const hl_state *s, const char *p, size_t len, hl_range **ranges,
                                 int *nranges) {
    hl_range *r = NULL;
    int n = 0, cap = 0;
    const char *end = p + len;
    td_status st = TD_OK;
    if (len == 0) {
        st = hl_bad(s, "empty brackets", p);
        goto out;
    }
    while (p < end) {
        const char *item = p;
        uint64_t v[2] = {0, 0};
        int nd[2] = {0, 0};
        int k = 0;
        for (; p < end && *p != ','; p++) {
            if (*p == '-' && k == 0 && nd[0] > 0) {
                k = 1;
            } else if (*p >= '0' && *p <= '9' && nd[k] < 18) {
                v[k] = v[k] * 10 + (uint64_t)(*p - '0');
                nd[k]++;
            } else {
                st = hl_bad(s, "not a number or range N-M", item);
                goto out;
            }
        }
        if (nd[0] == 0 || (k == 1 && nd[1] == 0)) {
            st = hl_bad(s, "not a number or range N-M", item);
            goto out;
        }
        if (k == 0) v[1] = v[0];
        if (v[1] < v[0]) {
            st = hl_bad(s, "range goes down", item);
            goto out;
        }
        if (v[1] - v[0] >= HOSTLIST_MAX) {
            st = hl_bad(s, "range of more than 65536 hosts", item);
            goto out;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            r = td_xrealloc(r, (size_t)cap * sizeof *r);
        }
        r[n++] = (hl_range){v[0], v[1], nd[0]};
        if (p < end) p++; /* the ',' */
        if (p == end && p[-1] == ',') {
            st = hl_bad(s, "trailing ','", item);
            goto out;
        }
    }
out:
    if (st != TD_OK) {
        free(r);
        r = NULL;
        n = 0;
    }
    *ranges = r;
    *nranges = n;
    return st;
}

static td_status hl_emit(hl_state *s, const char *prefix, const hl_range *r, int nr,
                         const char *suffix) {
    for (int i = 0; i < nr; i++)
        for (uint64_t v = r[i].lo; v <= r[i].hi; v++) {
            if (s->out.n >= HOSTLIST_MAX)
                return td_error(TD_ERR_INVALID, "hostlist '%s' names more than %d hosts", s->whole,
                                HOSTLIST_MAX);
            char *name =
                td_xasprintf("%s%0*llu%s", prefix, r[i].width, (unsigned long long)v, suffix);
            if (strlen(name) > HOSTNAME_MAX) {
                td_status st = td_error(TD_ERR_INVALID,
                                        "hostlist '%s' gives a name of %zu characters (%.40s...), "
                                        "more than a host name has (%d)",
                                        s->whole, strlen(name), name, HOSTNAME_MAX);
                free(name);
                return st;
            }
            sl_push(&s->out, name);
        }
    return TD_OK;
}

/* Slurm's _push_range_list: prefix may still hold bracket groups; the rightmost one is expanded
 * here (outer loop) and the rest recursively, the innermost ranges r always last. */
static td_status hl_push_ranges(hl_state *s, const char *prefix, const hl_range *r, int nr,
                                const char *suffix) {
    const char *open = strrchr(prefix, '[');
    if (!open) {
        if (strchr(prefix, ']')) return hl_bad(s, "']' without '['", strchr(prefix, ']'));
        return hl_emit(s, prefix, r, nr, suffix);
    }
    const char *close = strchr(open, ']');
    if (!close) return hl_bad(s, "'[' without ']'", open);
    const char *mid = close + 1;
    if (strchr(mid, ']')) return hl_bad(s, "']' without '['", strchr(mid, ']'));
    hl_range *pr = NULL;
    int npr = 0;
    TD_CHECK(hl_parse_ranges(s, open + 1, (size_t)(close - open - 1), &pr, &npr));
    td_status st = TD_OK;
    size_t pre_len = (size_t)(open - prefix);
    for (int i = 0; i < npr && st == TD_OK; i++)
        for (uint64_t v = pr[i].lo; v <= pr[i].hi && st == TD_OK; v++) {
            char *np = td_xasprintf("%.*s%0*llu%s", (int)pre_len, prefix, pr[i].width,
                                    (unsigned long long)v, mid);
            st = hl_push_ranges(s, np, r, nr, suffix);
            free(np);
        }
    free(pr);
    return st;
}

static td_status hl_token(hl_state *s, char *tok) {
    char *open = strrchr(tok, '[');
    if (!open) {
        if (strchr(tok, ']')) return hl_bad(s, "']' without '['", strchr(tok, ']'));
        if (s->out.n >= HOSTLIST_MAX)
            return td_error(TD_ERR_INVALID, "hostlist '%s' names more than %d hosts", s->whole,
                            HOSTLIST_MAX);
        if (strlen(tok) > HOSTNAME_MAX)
            return hl_bad(s, "name longer than a host name can be", tok);
        sl_push(&s->out, td_xstrdup(tok));
        return TD_OK;
    }
    char *close = strchr(open, ']');
    if (!close) return hl_bad(s, "'[' without ']'", open);
    const char *suffix = close + 1;
    if (strchr(suffix, ']')) return hl_bad(s, "']' without '['", strchr(suffix, ']'));
    hl_range *r = NULL;
    int nr = 0;
    TD_CHECK(hl_parse_ranges(s, open + 1, (size_t)(close - open - 1), &r, &nr));
    *open = '\0'; /* tok is now the prefix */
    td_status st = hl_push_ranges(s, tok, r, nr, suffix);
    free(r);
    return st;
}

td_status td_hostlist_expand(const char *hostlist, char ***hosts, int *count) {
    *hosts = NULL;
    *count = 0;
    hl_state s = {.whole = hostlist};
    char *buf = td_xstrdup(hostlist);
    td_status st = TD_OK;
    /* Split at separators outside brackets: "n[1-2,4],m3" is two names, not three. */
    int depth = 0;
    char *tok = NULL;
    for (char *p = buf;; p++) {
        bool sep = *p == '\0' || (depth == 0 && strchr(", \t\n", *p));
        if (*p == '[') depth++;
        if (*p == ']' && depth > 0) depth--;
        if (!sep) {
            if (!tok) tok = p;
            continue;
        }
        char c = *p;
        *p = '\0';
        if (tok) {
            st = hl_token(&s, tok);
            if (st != TD_OK) break;
            tok = NULL;
        }
        if (c == '\0') break;
    }
    free(buf);
    if (st != TD_OK) {
        sl_free(&s.out);
        return st;
    }
    *hosts = s.out.v;
    *count = s.out.n;
    return TD_OK;
}

void td_hostlist_free(char **hosts, int count) {
    for (int i = 0; i < count; i++) free(hosts[i]);
    free(hosts);
}

/* ---- reading the environment ---- */
typedef struct {
    char *const *envp;
    const char *sched; /* "Slurm", ... for messages */
} ctx;

/* The value of name in envp; NULL when unset or empty (an empty variable says nothing). */
static const char *env_get(char *const *envp, const char *name) {
    if (!envp) return NULL;
    size_t n = strlen(name);
    for (char *const *e = envp; *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return (*e)[n + 1] ? *e + n + 1 : NULL;
    return NULL;
}

/* Every detection error ends with the two ways out, so none needs to repeat them. */
static td_status fail(const ctx *c, const char *fmt, ...) TD_PRINTF(2, 3);
static td_status fail(const ctx *c, const char *fmt, ...) {
    char what[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return td_error(TD_ERR_USAGE,
                    "%s environment: %s. Or give the topology yourself (--nnodes, --node-rank, "
                    "--rdzv-endpoint, or --standalone for one node), or set "
                    "TANDEM_LAUNCH_DETECT=0 to ignore the %s environment",
                    c->sched, what, c->sched);
}

static td_status parse_uint(const ctx *c, const char *name, const char *v, int64_t hi,
                            int64_t *out) {
    int64_t x = 0;
    const char *p = v;
    for (; *p >= '0' && *p <= '9' && x <= hi; p++) x = x * 10 + (*p - '0');
    if (p == v || *p || x > hi)
        return fail(c, "%s='%s' is not an integer in 0..%lld", name, v, (long long)hi);
    *out = x;
    return TD_OK;
}

/* An integer variable; *found false (and no error) when unset. */
static td_status opt_uint(const ctx *c, const char *name, int64_t hi, int64_t *out, bool *found) {
    const char *v = env_get(c->envp, name);
    *found = v != NULL;
    if (!v) return TD_OK;
    return parse_uint(c, name, v, hi, out);
}

static td_status need_uint(const ctx *c, const char *name, int64_t hi, const char *why,
                           int64_t *out) {
    bool found;
    TD_CHECK(opt_uint(c, name, hi, out, &found));
    if (!found) return fail(c, "%s is not set (%s)", name, why);
    return TD_OK;
}

static const char *need_str(const ctx *c, const char *name, const char *why, td_status *st) {
    const char *v = env_get(c->envp, name);
    if (!v) *st = fail(c, "%s is not set (%s)", name, why);
    return v;
}

/* A host or address a peer will connect to: no separators, quotes or spaces that would mean the
 * variable holds something else (a list, a URL). "[v6]" loses its brackets. */
static td_status check_host(const ctx *c, const char *name, const char *v, char *out,
                            size_t nbytes) {
    size_t len = strlen(v);
    if (len >= 2 && v[0] == '[' && v[len - 1] == ']') {
        v++;
        len -= 2;
    }
    bool ok = len > 0 && len < nbytes && v[0] != '-';
    for (size_t i = 0; ok && i < len; i++) {
        char ch = v[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '-' || ch == '_' || ch == ':' || ch == '%';
    }
    if (!ok) {
        char esc[300];
        td_escape_text(esc, sizeof esc, v, len);
        return fail(c, "%s gives '%s' as node 0's address, which is not a host name or IP address",
                    name, esc);
    }
    memcpy(out, v, len);
    out[len] = '\0';
    return TD_OK;
}

/* The lines of a newline-separated list, trimmed, empty ones skipped. */
static void split_lines(const char *v, strlist *out) {
    const char *p = v;
    while (*p) {
        const char *e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        const char *a = p, *b = e;
        while (a < b && (*a == ' ' || *a == '\t' || *a == '\r')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t' || b[-1] == '\r')) b--;
        if (b > a) sl_push(out, td_xasprintf("%.*s", (int)(b - a), a));
        p = *e ? e + 1 : e;
    }
}

/* "<prefix>-<id>" with every byte outside [A-Za-z0-9._-] of id as '_': the id becomes part of
 * store keys and is printed in logs. */
static void set_run_id(td_launch_detected *d, const char *prefix, const char *id) {
    int n = snprintf(d->run_id, sizeof d->run_id, "%s%s%s", prefix, id ? "-" : "", id ? id : "");
    size_t start = strlen(prefix) + 1;
    for (size_t i = start; n > 0 && i < strlen(d->run_id); i++) {
        char ch = d->run_id[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_';
        if (!ok) d->run_id[i] = '_';
    }
}

static void set_endpoint(td_launch_detected *d, int port) {
    d->port = port;
    snprintf(d->endpoint, sizeof d->endpoint, strchr(d->host, ':') ? "[%s]:%d" : "%s:%d", d->host,
             port);
}

static const char one_per_node_slurm[] =
    "tandem launch runs once per node and starts --nproc-per-node workers itself; start it with "
    "`srun --ntasks-per-node=1 tandem launch ...` (sbatch: "
    "`#SBATCH --ntasks-per-node=1`)";

/* ---- Slurm ----
 * Inside an srun step the step's variables describe the nodes this launcher runs with (a step
 * may use part of the allocation; SLURM_NODEID counts within the step). Node 0 is the first host
 * of the step's nodelist and hosts the store, on a port derived from the job and step ids.
 * Outside a step (the batch script, an salloc shell) only a one-node job makes sense: the
 * batch script runs on the first node alone, and its launcher would wait for the others. */

/* Ports Slurm jobs must not take: NFS mountd (20048 on Red Hat), GlusterFS (24007-24008),
 * FlexLM license servers (27000-27009, common on clusters), MongoDB (27017-27019), and torch's
 * own defaults (29400 rendezvous, 29500 MASTER_PORT), which a job's workers may use. */
static const int slurm_avoided_ports[] = {20048, 24007, 24008, 27000, 27001, 27002,
                                          27003, 27004, 27005, 27006, 27007, 27008,
                                          27009, 27017, 27018, 27019, 29400, 29500};

/* 20000 + (job + 7919 * step) mod 10000: every node of a step computes the same port; the jobs
 * j .. j+9999 never share one (job ids are consecutive, so two recent jobs sharing a node 0 do
 * not collide, as with PyTorch Lightning's job-id port); other steps of the job are spread by a
 * prime. Below 32768, Linux's default ephemeral range, so no outgoing connection of this host
 * holds the port by chance. An avoided port maps to 30000 + its index in the list above. */
static int slurm_port(uint64_t job, uint64_t step) {
    int port = 20000 + (int)((job + 7919 * step) % 10000);
    for (size_t i = 0; i < TD_ARRAY_LEN(slurm_avoided_ports); i++)
        if (port == slurm_avoided_ports[i]) return 30000 + (int)i;
    return port;
}

static td_status detect_slurm(const ctx *c, const char *job_var, td_launch_detected *d) {
    int64_t job = 0, nnodes = 0, node = 0, v = 0, step = 0;
    bool found = false, have_step = false;
    strlist hosts = {0};
    td_status st = TD_OK;
    TD_CHECK(parse_uint(c, job_var, env_get(c->envp, job_var), UINT32_MAX, &job));

    if (!env_get(c->envp, "SLURM_STEP_NUM_NODES")) {
        TD_CHECK(opt_uint(c, "SLURM_JOB_NUM_NODES", MAX_NODES, &nnodes, &found));
        const char *nvar = "SLURM_JOB_NUM_NODES";
        if (!found) {
            nvar = "SLURM_NNODES";
            TD_CHECK(need_uint(c, nvar, MAX_NODES, "the job's node count", &nnodes));
        }
        if (nnodes != 1)
            return fail(c,
                        "%s=%lld but this process is not in an srun step (SLURM_STEP_NUM_NODES is "
                        "not set): the batch script runs on the first node only, and a launcher "
                        "there would wait for the other nodes forever; %s",
                        nvar, (long long)nnodes, one_per_node_slurm);
        d->nnodes = 1;
        set_run_id(d, "slurm", env_get(c->envp, job_var));
        return TD_OK;
    }

    TD_CHECK(need_uint(c, "SLURM_STEP_NUM_NODES", MAX_NODES, "", &nnodes));
    if (nnodes < 1) return fail(c, "SLURM_STEP_NUM_NODES=0: a step runs on at least one node");
    TD_CHECK(need_uint(c, "SLURM_NODEID", MAX_NODES, "this node's index in the step", &node));
    if (node >= nnodes)
        return fail(c,
                    "SLURM_NODEID=%lld but SLURM_STEP_NUM_NODES=%lld: a node id is below the "
                    "node count (is SLURM_NODEID left over from another step?)",
                    (long long)node, (long long)nnodes);
    TD_CHECK(opt_uint(c, "SLURM_STEP_NUM_TASKS", INT32_MAX, &v, &found));
    if (found && v != nnodes)
        return fail(c, "SLURM_STEP_NUM_TASKS=%lld on SLURM_STEP_NUM_NODES=%lld nodes: %s",
                    (long long)v, (long long)nnodes, one_per_node_slurm);
    TD_CHECK(opt_uint(c, "SLURM_LOCALID", INT32_MAX, &v, &found));
    if (found && v != 0)
        return fail(c, "SLURM_LOCALID=%lld: this is not the only task on its node; %s",
                    (long long)v, one_per_node_slurm);

    const char *lvar = "SLURM_STEP_NODELIST";
    const char *list = env_get(c->envp, lvar);
    if (!list) list = env_get(c->envp, lvar = "SLURM_JOB_NODELIST");
    if (!list) list = env_get(c->envp, lvar = "SLURM_NODELIST");
    if (!list)
        return fail(c, "SLURM_STEP_NODELIST is not set (nor SLURM_JOB_NODELIST): node 0's "
                       "host is the first name in it");
    st = td_hostlist_expand(list, &hosts.v, &hosts.n);
    if (st != TD_OK) return fail(c, "%s: %s", lvar, td_error_msg());
    hosts.cap = hosts.n;
    if (hosts.n != nnodes) {
        st = fail(c, "%s=%s has %d host%s but SLURM_STEP_NUM_NODES=%lld", lvar, list, hosts.n,
                  hosts.n == 1 ? "" : "s", (long long)nnodes);
        goto out;
    }
    if (nnodes > 1)
        TD_CHECK_GOTO(check_host(c, lvar, hosts.v[0], d->host, sizeof d->host), st, out);

    TD_CHECK_GOTO(opt_uint(c, "SLURM_STEP_ID", UINT32_MAX, &step, &have_step), st, out);
    if (!have_step)
        TD_CHECK_GOTO(opt_uint(c, "SLURM_STEPID", UINT32_MAX, &step, &have_step), st, out);
    d->nnodes = (int)nnodes;
    d->node_rank = (int)node;
    /* The job id alone would do against stale keys (the store lives in node 0's launcher and
     * dies with the job; a requeued job, SLURM_RESTART_COUNT > 0, starts an empty one) and keeps
     * the id stable across requeues. The step id separates steps running at once: their tokens
     * then differ, so a launcher never joins another step's group. */
    char id[64];
    snprintf(id, sizeof id, have_step ? "%lld.%lld" : "%lld", (long long)job, (long long)step);
    set_run_id(d, "slurm", id);
    if (nnodes > 1) set_endpoint(d, slurm_port((uint64_t)job, (uint64_t)step));
out:
    sl_free(&hosts);
    return st;
}

/* ---- Open MPI ----
 * mpirun -np N --map-by ppr:1:node: one launcher per node, world rank = node rank. Open MPI does
 * not say which address node 0 is reachable at, so MASTER_ADDR (exported with mpirun -x) must. */
static const char one_per_node_ompi[] =
    "tandem launch runs once per node and starts --nproc-per-node workers itself; start one per "
    "node with `mpirun -np NODES --map-by ppr:1:node -x MASTER_ADDR tandem launch ...`";

static td_status detect_ompi(const ctx *c, td_launch_detected *d) {
    int64_t size = 0, rank = 0, local = 0, nodes = 0, port = DEFAULT_MASTER_PORT;
    bool found = false;
    TD_CHECK(need_uint(c, "OMPI_COMM_WORLD_SIZE", MAX_NODES, "", &size));
    if (size < 1) return fail(c, "OMPI_COMM_WORLD_SIZE=0");
    TD_CHECK(need_uint(c, "OMPI_COMM_WORLD_RANK", MAX_NODES, "this process's rank", &rank));
    if (rank >= size)
        return fail(c, "OMPI_COMM_WORLD_RANK=%lld but OMPI_COMM_WORLD_SIZE=%lld", (long long)rank,
                    (long long)size);
    TD_CHECK(need_uint(c, "OMPI_COMM_WORLD_LOCAL_SIZE", MAX_NODES,
                       "how many processes mpirun started on this node", &local));
    if (local != 1)
        return fail(
            c, "OMPI_COMM_WORLD_LOCAL_SIZE=%lld: mpirun started %lld processes on this node; %s",
            (long long)local, (long long)local, one_per_node_ompi);
    TD_CHECK(opt_uint(c, "OMPI_MCA_orte_num_nodes", MAX_NODES, &nodes, &found));
    if (found && nodes != size)
        return fail(c,
                    "OMPI_COMM_WORLD_SIZE=%lld processes on OMPI_MCA_orte_num_nodes=%lld nodes; %s",
                    (long long)size, (long long)nodes, one_per_node_ompi);
    d->nnodes = (int)size;
    d->node_rank = (int)rank;
    const char *ns = env_get(c->envp, "PMIX_NAMESPACE");
    if (!ns) ns = env_get(c->envp, "OMPI_MCA_ess_base_jobid");
    set_run_id(d, "ompi", ns);
    if (size == 1) return TD_OK;
    const char *addr = env_get(c->envp, "MASTER_ADDR");
    if (!addr)
        return fail(c,
                    "MASTER_ADDR is not set: Open MPI does not tell node 0's address; export it "
                    "on the node that runs mpirun and pass it on, e.g. `MASTER_ADDR=$(hostname) "
                    "mpirun -x MASTER_ADDR -np %lld --map-by ppr:1:node tandem launch ...` "
                    "(MASTER_PORT, default %d, the same way)",
                    (long long)size, DEFAULT_MASTER_PORT);
    TD_CHECK(check_host(c, "MASTER_ADDR", addr, d->host, sizeof d->host));
    TD_CHECK(opt_uint(c, "MASTER_PORT", 65535, &port, &found));
    if (found && port < 1) return fail(c, "MASTER_PORT=0 is not a port");
    set_endpoint(d, (int)port);
    return TD_OK;
}

/* ---- dstack ----
 * Its documented variables: DSTACK_NODES_NUM, DSTACK_NODE_RANK, DSTACK_MASTER_NODE_IP (and
 * DSTACK_NODES_IPS, one per line, checked against the count when present). dstack reserves no
 * port; its examples pick one in the torchrun command line, so we take torchrun's. */
static td_status count_matches(const ctx *c, const char *list_var, const char *what, int64_t n,
                               const char *n_var) {
    const char *v = env_get(c->envp, list_var);
    if (!v) return TD_OK;
    strlist l = {0};
    split_lines(v, &l);
    int got = l.n;
    sl_free(&l);
    if (got != n)
        return fail(c, "%s has %d %s%s but %s=%lld", list_var, got, what, got == 1 ? "" : "es",
                    n_var, (long long)n);
    return TD_OK;
}

static td_status detect_dstack(const ctx *c, td_launch_detected *d) {
    int64_t n = 0, rank = 0;
    td_status st = TD_OK;
    TD_CHECK(need_uint(c, "DSTACK_NODES_NUM", MAX_NODES, "the number of nodes", &n));
    if (n < 1) return fail(c, "DSTACK_NODES_NUM=0");
    TD_CHECK(need_uint(c, "DSTACK_NODE_RANK", MAX_NODES, "this node's rank", &rank));
    if (rank >= n)
        return fail(c, "DSTACK_NODE_RANK=%lld but DSTACK_NODES_NUM=%lld", (long long)rank,
                    (long long)n);
    TD_CHECK(count_matches(c, "DSTACK_NODES_IPS", "address", n, "DSTACK_NODES_NUM"));
    d->nnodes = (int)n;
    d->node_rank = (int)rank;
    const char *name = env_get(c->envp, "DSTACK_RUN_NAME");
    set_run_id(d, "dstack", name ? name : env_get(c->envp, "DSTACK_RUN_ID"));
    if (n == 1) return TD_OK;
    const char *ip = need_str(c, "DSTACK_MASTER_NODE_IP", "node 0's address", &st);
    if (!ip) return st;
    TD_CHECK(check_host(c, "DSTACK_MASTER_NODE_IP", ip, d->host, sizeof d->host));
    set_endpoint(d, DEFAULT_RDZV_PORT);
    return TD_OK;
}

/* ---- SkyPilot ----
 * SKYPILOT_NODE_IPS, one per line, node 0 first (SkyPilot's own examples take `head -n1` as
 * MASTER_ADDR); SKYPILOT_NODE_RANK; SKYPILOT_NUM_NODES checked against the list when present.
 * SKYPILOT_TASK_ID is the same on every node and across a managed job's recoveries. */
static td_status detect_skypilot(const ctx *c, td_launch_detected *d) {
    td_status st = TD_OK;
    int64_t rank = 0, n = 0;
    bool found = false;
    strlist ips = {0};
    const char *v = need_str(c, "SKYPILOT_NODE_IPS", "the nodes' addresses, node 0 first", &st);
    if (!v) return st;
    split_lines(v, &ips);
    if (ips.n == 0) {
        st = fail(c, "SKYPILOT_NODE_IPS holds no address");
        goto out;
    }
    TD_CHECK_GOTO(opt_uint(c, "SKYPILOT_NUM_NODES", MAX_NODES, &n, &found), st, out);
    if (found && n != ips.n) {
        st = fail(c, "SKYPILOT_NODE_IPS has %d address%s but SKYPILOT_NUM_NODES=%lld", ips.n,
                  ips.n == 1 ? "" : "es", (long long)n);
        goto out;
    }
    TD_CHECK_GOTO(need_uint(c, "SKYPILOT_NODE_RANK", MAX_NODES, "this node's rank", &rank), st,
                  out);
    if (rank >= ips.n) {
        st = fail(c, "SKYPILOT_NODE_RANK=%lld but SKYPILOT_NODE_IPS has %d address%s",
                  (long long)rank, ips.n, ips.n == 1 ? "" : "es");
        goto out;
    }
    d->nnodes = ips.n;
    d->node_rank = (int)rank;
    set_run_id(d, "skypilot", env_get(c->envp, "SKYPILOT_TASK_ID"));
    if (ips.n > 1) {
        TD_CHECK_GOTO(check_host(c, "SKYPILOT_NODE_IPS", ips.v[0], d->host, sizeof d->host), st,
                      out);
        set_endpoint(d, DEFAULT_RDZV_PORT);
    }
out:
    sl_free(&ips);
    return st;
}

/* ---- SageMaker ----
 * SM_HOSTS is a JSON list of the containers' host names, SM_CURRENT_HOST this one. The rank is
 * the index in the list as given and node 0 its first entry, as in sagemaker-training-toolkit
 * (master_hostname = hosts[0]) and SageMaker's PyTorch examples (hosts.index(current_host));
 * SageMaker writes the list sorted, and re-sorting it here could only disagree with them. */
static td_status parse_json_strings(const ctx *c, const char *name, const char *v, strlist *out) {
    const char *p = v;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p++ != '[') goto bad;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (*p == ']' && out->n == 0) {
            p++;
            break;
        }
        if (*p++ != '"') goto bad;
        char buf[HOSTNAME_MAX + 1];
        size_t len = 0;
        for (; *p && *p != '"'; p++) {
            char ch = *p;
            if (ch == '\\') {
                ch = *++p;
                if (ch != '"' && ch != '\\' && ch != '/') goto bad; /* no \uXXXX in host names */
            }
            if (len >= HOSTNAME_MAX) goto bad;
            buf[len++] = ch;
        }
        if (*p++ != '"') goto bad;
        sl_push(out, td_xasprintf("%.*s", (int)len, buf));
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p++ != ']') goto bad;
        break;
    }
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p) goto bad;
    return TD_OK;
bad:
    return fail(c, "%s='%s' is not a JSON list of host names like [\"algo-1\",\"algo-2\"]", name,
                v);
}

static td_status detect_sagemaker(const ctx *c, td_launch_detected *d) {
    td_status st = TD_OK;
    strlist hosts = {0};
    const char *list = need_str(c, "SM_HOSTS", "the JSON list of the job's hosts", &st);
    if (!list) return st;
    const char *cur = need_str(c, "SM_CURRENT_HOST", "this container's host name", &st);
    if (!cur) return st;
    TD_CHECK_GOTO(parse_json_strings(c, "SM_HOSTS", list, &hosts), st, out);
    if (hosts.n == 0) {
        st = fail(c, "SM_HOSTS=%s lists no host", list);
        goto out;
    }
    int rank = -1;
    for (int i = 0; i < hosts.n; i++) {
        for (int j = 0; j < i; j++)
            if (!strcmp(hosts.v[i], hosts.v[j])) {
                st = fail(c, "SM_HOSTS=%s lists '%s' twice", list, hosts.v[i]);
                goto out;
            }
        if (!strcmp(hosts.v[i], cur)) rank = i;
    }
    if (rank < 0) {
        st = fail(c, "SM_CURRENT_HOST=%s is not in SM_HOSTS=%s", cur, list);
        goto out;
    }
    d->nnodes = hosts.n;
    d->node_rank = rank;
    set_run_id(d, "sagemaker", env_get(c->envp, "TRAINING_JOB_NAME"));
    if (hosts.n > 1) {
        TD_CHECK_GOTO(check_host(c, "SM_HOSTS", hosts.v[0], d->host, sizeof d->host), st, out);
        set_endpoint(d, DEFAULT_RDZV_PORT);
    }
out:
    sl_free(&hosts);
    return st;
}

/* ---- entry points ---- */
static td_status detect(char *const *envp, td_launch_detected *d) {
    const char *knob = env_get(envp, "TANDEM_LAUNCH_DETECT");
    if (knob && !strcmp(knob, "0")) return TD_OK;
    if (knob && strcmp(knob, "1"))
        return td_error(TD_ERR_USAGE,
                        "TANDEM_LAUNCH_DETECT='%s': expected 1 (the default: take the topology "
                        "from Slurm, Open MPI, SkyPilot, dstack or SageMaker) or 0 (ignore them)",
                        knob);
    /* Innermost launcher first: mpirun inside a Slurm allocation started this process, and its
     * ranks are about these processes; the cloud platforms last, they run no launcher of their
     * own inside the others. */
    ctx c = {.envp = envp};
    if (env_get(envp, "OMPI_COMM_WORLD_SIZE")) {
        d->scheduler = c.sched = "Open MPI";
        return detect_ompi(&c, d);
    }
    const char *job_var = env_get(envp, "SLURM_JOB_ID") ? "SLURM_JOB_ID" : "SLURM_JOBID";
    if (env_get(envp, job_var)) {
        d->scheduler = c.sched = "Slurm";
        return detect_slurm(&c, job_var, d);
    }
    if (env_get(envp, "SKYPILOT_NODE_RANK") || env_get(envp, "SKYPILOT_NODE_IPS")) {
        d->scheduler = c.sched = "SkyPilot";
        return detect_skypilot(&c, d);
    }
    if (env_get(envp, "DSTACK_NODE_RANK") || env_get(envp, "DSTACK_NODES_NUM") ||
        env_get(envp, "DSTACK_MASTER_NODE_IP")) {
        d->scheduler = c.sched = "dstack";
        return detect_dstack(&c, d);
    }
    if (env_get(envp, "SM_HOSTS") || env_get(envp, "SM_CURRENT_HOST")) {
        d->scheduler = c.sched = "SageMaker";
        return detect_sagemaker(&c, d);
    }
    return TD_OK;
}

td_status td_launch_detect(char *const *envp, td_launch_detected *out) {
    memset(out, 0, sizeof *out);
    td_status st = detect(envp, out);
    if (st != TD_OK) memset(out, 0, sizeof *out);
    return st;
}

void td_launch_detected_apply(const td_launch_detected *det, td_launch_options *opts) {
    if (!det->scheduler) return;
    opts->min_nodes = opts->max_nodes = det->nnodes;
    opts->node_rank = det->node_rank;
    if (det->nnodes > 1) {
        opts->standalone = false;
        opts->rdzv_endpoint = det->endpoint;
    } else {
        /* One node needs no rendezvous: a private store on 127.0.0.1 and port 0, which no other
         * job on this host can collide with. */
        opts->standalone = true;
        opts->rdzv_endpoint = NULL;
    }
    if (!opts->rdzv_id || !*opts->rdzv_id) opts->rdzv_id = det->run_id;
}

void td_launch_detected_describe(const td_launch_detected *det, char *buf, size_t nbytes) {
    if (!det->scheduler)
        snprintf(buf, nbytes, "no scheduler found in the environment");
    else if (det->nnodes > 1)
        snprintf(buf, nbytes, "topology from %s: node %d of %d, rendezvous %s, run id %s",
                 det->scheduler, det->node_rank, det->nnodes, det->endpoint, det->run_id);
    else
        snprintf(buf, nbytes, "topology from %s: 1 node, standalone, run id %s", det->scheduler,
                 det->run_id);
}
