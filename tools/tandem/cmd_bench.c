/* tandem bench <what>: benchmarks. Each target is one row in bench_targets[] below; add yours.
 *
 * tandem bench comm: forks N ranks around a store of its own, warms up, and times a collective
 * at doubling sizes, checking the data at every size (nccl-tests columns: bytes, time, algbw,
 * busbw, wrong). Bus bandwidth factors: allreduce 2(n-1)/n, allgather and reduce_scatter
 * (n-1)/n, broadcast 1; bytes is the whole buffer (for allgather the gathered output, for
 * reduce_scatter the input). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/comm.h"
#include "tandem/core.h"

typedef enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_REDUCE_SCATTER } bench_op;
static const char *const op_names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter"};

#define MAX_SIZES 48
#define MAX_RANKS 64

typedef struct {
    double time_us[MAX_RANKS][MAX_SIZES];
    int64_t wrong[MAX_RANKS][MAX_SIZES];
    int failed[MAX_RANKS];
    char msg[512];
} bench_shared;

typedef struct {
    bench_op op;
    td_transport_kind backend;
    int nranks;
    size_t min_bytes, max_bytes;
    int iters; /* 0 = by size */
    int warmup;
    bool json;
    int port;
    const char *token;
} bench_cfg;

static size_t sizes(const bench_cfg *c, size_t *out) {
    size_t n = 0;
    for (size_t b = c->min_bytes; b <= c->max_bytes && n < MAX_SIZES; b *= 2) out[n++] = b;
    return n;
}

/* Element counts that keep every rank's share whole. */
static size_t elems_for(const bench_cfg *c, size_t bytes, size_t *per_rank) {
    size_t elem = c->op == OP_BROADCAST ? 1 : sizeof(float);
    size_t total = bytes / elem;
    if (c->op == OP_ALLGATHER || c->op == OP_REDUCE_SCATTER) {
        *per_rank = total / (size_t)c->nranks;
        return *per_rank * (size_t)c->nranks;
    }
    *per_rank = total;
    return total;
}

static float input_val(int rank, size_t i) {
    return (float)((rank + 1) * (int)(i % 7 + 1));
}

/* One collective call on prepared buffers. */
static td_status run_once(const bench_cfg *c, td_pg_t *pg, float *a, float *b, size_t per_rank) {
    switch (c->op) {
    case OP_ALLREDUCE:
        return td_allreduce(pg, a, per_rank, TD_REDUCE_SUM);
    case OP_BROADCAST:
        return td_broadcast(pg, a, per_rank, 0);
    case OP_ALLGATHER:
        return td_allgather(pg, a, b, per_rank * sizeof(float));
    case OP_REDUCE_SCATTER:
        return td_reduce_scatter(pg, a, b, per_rank, TD_REDUCE_SUM);
    }
    return TD_ERR_INVALID;
}

/* Fills inputs with exact small integers and counts the elements that come out wrong. */
static td_status check(const bench_cfg *c, td_pg_t *pg, float *a, float *b, size_t per_rank,
                       int64_t *wrong) {
    int W = c->nranks, r = td_pg_rank(pg);
    int64_t bad = 0;
    float tri = (float)(W * (W + 1) / 2);
    switch (c->op) {
    case OP_ALLREDUCE:
        for (size_t i = 0; i < per_rank; i++) a[i] = input_val(r, i);
        TD_CHECK(run_once(c, pg, a, b, per_rank));
        for (size_t i = 0; i < per_rank; i++) bad += a[i] != tri * (float)(i % 7 + 1);
        break;
    case OP_BROADCAST: {
        uint8_t *p = (uint8_t *)a;
        for (size_t i = 0; i < per_rank; i++) p[i] = r == 0 ? (uint8_t)(i * 13 + 5) : 0;
        TD_CHECK(run_once(c, pg, a, b, per_rank));
        for (size_t i = 0; i < per_rank; i++) bad += p[i] != (uint8_t)(i * 13 + 5);
        break;
    }
    case OP_ALLGATHER:
        for (size_t i = 0; i < per_rank; i++) a[i] = input_val(r, i);
        TD_CHECK(run_once(c, pg, a, b, per_rank));
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < per_rank; i++)
                bad += b[(size_t)j * per_rank + i] != input_val(j, i);
        break;
    case OP_REDUCE_SCATTER:
        for (size_t i = 0; i < per_rank * (size_t)W; i++) a[i] = input_val(r, i);
        TD_CHECK(run_once(c, pg, a, b, per_rank));
        for (size_t i = 0; i < per_rank; i++)
            bad += b[i] != tri * (float)(((size_t)r * per_rank + i) % 7 + 1);
        break;
    }
    *wrong = bad;
    return TD_OK;
}

static int rank_main(const bench_cfg *c, int rank, bench_shared *sh) {
    td_store_t *store = NULL;
    td_pg_t *pg = NULL;
    float *a = NULL, *b = NULL;
    td_status st;
    TD_CHECK_GOTO(td_store_connect("127.0.0.1", c->port, c->token, 10000, &store), st, out);
    td_pg_options o = {.rank = rank,
                       .world_size = c->nranks,
                       .store = store,
                       .prefix = "bench",
                       .transport = c->backend,
                       .timeout_ms = 120000};
    TD_CHECK_GOTO(td_pg_init(&o, &pg), st, out);
    size_t sz[MAX_SIZES], n = sizes(c, sz);
    size_t maxel = c->max_bytes / sizeof(float) + 16;
    size_t in_el = c->op == OP_REDUCE_SCATTER ? maxel : maxel;
    size_t out_el = c->op == OP_ALLGATHER || c->op == OP_REDUCE_SCATTER ? maxel : 16;
    a = td_xmalloc_aligned(in_el * sizeof(float));
    b = td_xmalloc_aligned(out_el * sizeof(float));
    memset(a, 0, in_el * sizeof(float));
    memset(b, 0, out_el * sizeof(float));
    for (size_t s = 0; s < n; s++) {
        size_t per_rank;
        elems_for(c, sz[s], &per_rank);
        TD_CHECK_GOTO(check(c, pg, a, b, per_rank, &sh->wrong[rank][s]), st, out);
        /* timing inputs: small values, so repeated sums stay finite for a while (and infinities
         * cost the same as finite numbers if they come) */
        if (c->op != OP_BROADCAST)
            for (size_t i = 0; i < in_el; i++) a[i] = 1e-3f * (float)(i % 5);
        int iters = c->iters;
        if (iters <= 0) {
            size_t target = (size_t)256 << 20;
            iters = (int)TD_MAX((size_t)5, TD_MIN((size_t)2000, target / TD_MAX(sz[s], (size_t)1)));
        }
        for (int w = 0; w < c->warmup; w++) TD_CHECK_GOTO(run_once(c, pg, a, b, per_rank), st, out);
        TD_CHECK_GOTO(td_barrier(pg), st, out);
        uint64_t t0 = td_now_ns();
        for (int it = 0; it < iters; it++) TD_CHECK_GOTO(run_once(c, pg, a, b, per_rank), st, out);
        sh->time_us[rank][s] = (double)(td_now_ns() - t0) * 1e-3 / iters;
    }
    TD_CHECK_GOTO(td_barrier(pg), st, out);
out:
    if (st != TD_OK) {
        sh->failed[rank] = 1;
        if (!sh->msg[0]) snprintf(sh->msg, sizeof(sh->msg), "rank %d: %s", rank, td_error_msg());
    }
    free(a);
    free(b);
    td_pg_free(pg);
    td_store_close(store);
    return st == TD_OK ? 0 : 1;
}

static double bus_factor(bench_op op, int n) {
    switch (op) {
    case OP_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case OP_ALLGATHER:
    case OP_REDUCE_SCATTER:
        return (double)(n - 1) / n;
    case OP_BROADCAST:
        return 1.0;
    }
    return 1.0;
}

enum {
    OPT_BACKEND = 1,
    OPT_OP,
    OPT_NRANKS,
    OPT_MIN_BYTES,
    OPT_MAX_BYTES,
    OPT_ITERS,
    OPT_WARMUP,
    OPT_JSON,
};

static const cli_opt comm_opts[] = {
    {OPT_BACKEND, "backend", 0, "shm|tcp|auto", "transport (default shm)", 0},
    {OPT_OP, "op", 0, "OP", "allreduce (default), broadcast, allgather or reduce_scatter", 0},
    {OPT_NRANKS, "nranks", 0, "N", "ranks, forked here (default 2)", 0},
    {OPT_MIN_BYTES, "min-bytes", 0, "B", "smallest size (default 4K; K, M, G suffixes)", 0},
    {OPT_MAX_BYTES, "max-bytes", 0, "B", "largest size, doubling from the smallest (default 64M)",
     0},
    {OPT_ITERS, "iters", 0, "K", "timed calls per size (default: by size)", 0},
    {OPT_WARMUP, "warmup", 0, "K", "untimed calls per size first (default 3)", 0},
    {OPT_JSON, "json", 0, NULL, "one JSON array of rows instead of the table", 0},
    {0},
};

static const cli_command comm_cmd = {
    .name = "tandem bench comm",
    .usage = "--backend shm|tcp --op allreduce|broadcast|allgather|reduce_scatter --nranks N\n"
             "[--min-bytes B] [--max-bytes B] [--iters K] [--warmup K] [--json]",
    .about = "Times a collective at doubling sizes and checks the data at every size\n"
             "(nccl-tests columns: bytes, count, time_us, algbw_GBs, busbw_GBs, wrong).\n",
    .opts = comm_opts,
};

static int parse_size(const char *what, const char *s, size_t *out) {
    int64_t v;
    char *end = NULL;
    double d = strtod(s, &end);
    int64_t mult = 1;
    if (end && *end) {
        if (!strcmp(end, "K") || !strcmp(end, "KiB"))
            mult = 1 << 10;
        else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
            mult = 1 << 20;
        else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
            mult = 1 << 30;
        else {
            if (td_parse_i64(what, s, &v) != TD_OK) {
                td_error_print(TD_ERR_USAGE);
                return -1;
            }
        }
    }
    if (d <= 0) {
        fprintf(stderr, "tandem bench comm: %s must be positive (got %s)\n", what, s);
        return -1;
    }
    *out = (size_t)(d * (double)mult);
    return 0;
}

static int bench_comm(int argc, char **argv) {
    bench_cfg c = {.op = OP_ALLREDUCE,
                   .backend = TD_TRANSPORT_SHM,
                   .nranks = 2,
                   .min_bytes = 4096,
                   .max_bytes = 64u << 20,
                   .warmup = 3};
    int64_t v;
    cli_parser p;
    cli_init(&p, &comm_cmd, argc, argv);
    for (int ch; (ch = cli_next(&p)) != CLI_END;) {
        const char *val = p.value;
        switch (ch) {
        case CLI_EXIT:
            return p.exit_code;
        case CLI_ARG:
            return cli_error(&comm_cmd, "unexpected argument '%s'", val);
        case OPT_BACKEND:
            if (!strcmp(val, "shm"))
                c.backend = TD_TRANSPORT_SHM;
            else if (!strcmp(val, "tcp"))
                c.backend = TD_TRANSPORT_TCP;
            else if (!strcmp(val, "auto"))
                c.backend = TD_TRANSPORT_AUTO;
            else
                return cli_error(&comm_cmd, "--backend %s: expected shm, tcp or auto", val);
            break;
        case OPT_OP: {
            int found = -1;
            for (int k = 0; k < 4; k++)
                if (!strcmp(val, op_names[k])) found = k;
            if (found < 0)
                return cli_error(&comm_cmd,
                                 "--op %s: expected allreduce, broadcast, allgather or "
                                 "reduce_scatter",
                                 val);
            c.op = (bench_op)found;
            break;
        }
        case OPT_NRANKS:
        case OPT_ITERS:
        case OPT_WARMUP:
            if (td_parse_i64(p.given, val, &v) != TD_OK) {
                td_error_print(TD_ERR_USAGE);
                return 2;
            }
            if (ch == OPT_NRANKS) c.nranks = (int)v;
            if (ch == OPT_ITERS) c.iters = (int)v;
            if (ch == OPT_WARMUP) c.warmup = (int)v;
            break;
        case OPT_MIN_BYTES:
            if (parse_size("--min-bytes", val, &c.min_bytes)) return 2;
            break;
        case OPT_MAX_BYTES:
            if (parse_size("--max-bytes", val, &c.max_bytes)) return 2;
            break;
        case OPT_JSON:
            c.json = true;
            break;
        }
    }
    if (c.nranks < 1 || c.nranks > MAX_RANKS || c.min_bytes > c.max_bytes || c.warmup < 0) {
        fprintf(stderr,
                "tandem bench comm: need 1 <= --nranks <= %d and --min-bytes <= "
                "--max-bytes\n",
                MAX_RANKS);
        return 2;
    }
    bench_shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("tandem bench comm: mmap");
        return 1;
    }
    char token[33];
    uint64_t rnd = td_mix64(td_now_ns() ^ (uint64_t)getpid());
    snprintf(token, sizeof(token), "%016llx%08x", (unsigned long long)rnd, (unsigned)getpid());
    c.token = token;
    td_store_server_t *srv = NULL;
    td_status st = td_store_server_start("127.0.0.1", 0, token, &srv);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    c.port = td_store_server_port(srv);
    fflush(stdout);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < c.nranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("tandem bench comm: fork");
            for (int k = 0; k < r; k++) kill(pids[k], SIGKILL);
            return 1;
        }
        if (pids[r] == 0) _exit(rank_main(&c, r, sh));
    }
    int rc = 0;
    for (int r = 0; r < c.nranks; r++) {
        int ws;
        waitpid(pids[r], &ws, 0);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws)) rc = 1;
    }
    td_store_server_stop(srv);
    if (rc) {
        fprintf(stderr, "tandem bench comm: failed: %s\n", sh->msg[0] ? sh->msg : "a rank died");
        munmap(sh, sizeof(*sh));
        return 1;
    }
    size_t sz[MAX_SIZES], n = sizes(&c, sz);
    const char *bn = c.backend == TD_TRANSPORT_SHM   ? "shm"
                     : c.backend == TD_TRANSPORT_TCP ? "tcp"
                                                     : "auto";
    if (!c.json) {
        printf("# tandem bench comm: %s, backend %s, %d ranks\n", op_names[c.op], bn, c.nranks);
        printf("# %12s %12s %10s %10s %10s %8s\n", "bytes", "count", "time_us", "algbw_GBs",
               "busbw_GBs", "wrong");
    } else {
        printf("[\n");
    }
    for (size_t s = 0; s < n; s++) {
        size_t per_rank, elems = elems_for(&c, sz[s], &per_rank);
        size_t bytes = elems * (c.op == OP_BROADCAST ? 1 : sizeof(float));
        double t = 0;
        int64_t wrong = 0;
        for (int r = 0; r < c.nranks; r++) {
            t = TD_MAX(t, sh->time_us[r][s]);
            wrong += sh->wrong[r][s];
        }
        double algbw = (double)bytes / (t * 1e-6) / 1e9;
        double busbw = algbw * bus_factor(c.op, c.nranks);
        if (wrong) rc = 1;
        if (c.json)
            printf("  {\"op\": \"%s\", \"backend\": \"%s\", \"nranks\": %d, \"bytes\": %zu, "
                   "\"count\": %zu, \"time_us\": %.2f, \"algbw_GBs\": %.3f, \"busbw_GBs\": %.3f, "
                   "\"wrong\": %lld}%s\n",
                   op_names[c.op], bn, c.nranks, bytes, elems, t, algbw, busbw, (long long)wrong,
                   s + 1 < n ? "," : "");
        else
            printf("  %12zu %12zu %10.2f %10.3f %10.3f %8lld\n", bytes, elems, t, algbw, busbw,
                   (long long)wrong);
    }
    if (c.json) printf("]\n");
    munmap(sh, sizeof(*sh));
    return rc;
}

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} bench_targets[] = {
    {"comm", bench_comm, "collectives over shm or tcp (nccl-tests columns)"},
};

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "usage: tandem bench <target> [options]\n\ntargets:\n");
        for (size_t i = 0; i < TD_ARRAY_LEN(bench_targets); i++)
            fprintf(out, "  %-8s %s\n", bench_targets[i].name, bench_targets[i].summary);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < TD_ARRAY_LEN(bench_targets); i++)
        if (!strcmp(argv[1], bench_targets[i].name))
            return bench_targets[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tandem bench: unknown target '%s' (try 'tandem bench --help')\n", argv[1]);
    return 2;
}
