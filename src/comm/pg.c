/* Process groups: rendezvous through the store, host identity, one transport per peer,
 * deadlines and liveness for every blocking wait. */
#include "comm/pg_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/store_internal.h"

/* Pipelining units per transport: a message stays within L2 for shm; tcp amortises syscalls. */
#define SHM_CHUNK_BYTES (64u << 10)
#define TCP_CHUNK_BYTES (256u << 10)

char *td__pg_key(const td_pg_t *pg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *suffix = NULL;
    if (vasprintf(&suffix, fmt, ap) < 0) suffix = NULL;
    va_end(ap);
    if (!suffix) abort();
    char *k = td_xasprintf("%s/%s", pg->prefix, suffix);
    free(suffix);
    return k;
}

static char *read_small_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char buf[256];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = 0;
    return td_xstrdup(buf);
}

/* Ranks in different network namespaces must count as different hosts: they cannot share
 * loopback addresses, and the multi-host tests are built from namespaces on one machine. */
static char *derive_host_key(void) {
    char *boot = read_small_file("/proc/sys/kernel/random/boot_id");
    char ns[128] = "";
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 0] = 0;
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    char *k = td_xasprintf("%s|%s|%s", boot ? boot : "?", ns, host);
    free(boot);
    return k;
}

const char *td__coll_name(uint32_t kind) {
    static const char *const names[] = {"",          "barrier",        "allreduce", "broadcast",
                                        "allgather", "reduce_scatter", "reduce",    "gather",
                                        "scatter",   "alltoall",       "send"};
    return kind < TD_ARRAY_LEN(names) ? names[kind] : "unknown";
}

char *td__pg_env_prefix(const char *run_id, long long restart) {
    return td_xasprintf("tandem/%s/restart%lld/pg", run_id, restart);
}

void td__fp_describe(const td_fingerprint *fp, char *buf, size_t n) {
    const char *op = td_reduce_op_name((td_reduce_op)fp->op);
    /* float32 reductions keep the text they always had; other types name themselves */
    char dt[32] = "";
    if (fp->dtype > TD_ELEM_F32) snprintf(dt, sizeof(dt), ", dtype=%s", td_elem_name(fp->dtype));
    unsigned long long count = (unsigned long long)fp->count;
    switch (fp->kind) {
    case TD_COLL_BARRIER:
        snprintf(buf, n, "barrier()");
        break;
    case TD_COLL_ALLREDUCE:
        snprintf(buf, n, "allreduce(count=%llu, op=%s%s)", count, op, dt);
        break;
    case TD_COLL_BROADCAST:
        snprintf(buf, n, "broadcast(nbytes=%llu, root=%d)", count, fp->root);
        break;
    case TD_COLL_ALLGATHER:
        snprintf(buf, n, "allgather(nbytes_per_rank=%llu)", count);
        break;
    case TD_COLL_REDUCE_SCATTER:
        snprintf(buf, n, "reduce_scatter(count=%llu, op=%s%s)", count, op, dt);
        break;
    case TD_COLL_REDUCE:
        snprintf(buf, n, "reduce(count=%llu, op=%s%s, root=%d)", count, op, dt, fp->root);
        break;
    case TD_COLL_GATHER:
        snprintf(buf, n, "gather(nbytes_per_rank=%llu, root=%d)", count, fp->root);
        break;
    case TD_COLL_SCATTER:
        snprintf(buf, n, "scatter(nbytes_per_rank=%llu, root=%d)", count, fp->root);
        break;
    case TD_COLL_ALLTOALL:
        snprintf(buf, n, "alltoall()");
        break;
    case TD_COLL_SEND:
        snprintf(buf, n, "send(nbytes=%llu, tag=%d)", count, fp->root);
        break;
    default:
        snprintf(buf, n, "unknown collective %u", fp->kind);
    }
}

td_status td__pg_check(td_pg_t *pg, int waiting_peer) {
    td_transport *wt = waiting_peer >= 0 ? pg->tp[waiting_peer] : NULL;
    if (pg->shm) TD_CHECK(pg->shm->ops->check(pg->shm, wt == pg->shm ? waiting_peer : -1));
    if (pg->tcp) TD_CHECK(pg->tcp->ops->check(pg->tcp, wt == pg->tcp ? waiting_peer : -1));
    if (td_now_ns() < pg->deadline_ns) return TD_OK;
    char what[96], missing[512] = "";
    td__fp_describe(&pg->cur, what, sizeof(what));
    size_t off = 0;
    int nmissing = 0;
    for (int j = 0; j < pg->world; j++) {
        if (j == pg->rank || pg->arrived[j]) continue;
        if (pg->tp[j]->ops->ready(pg->tp[j], j, sizeof(td_fingerprint))) continue;
        if (off < sizeof(missing) - 16)
            off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d",
                                    nmissing ? "," : "", j);
        nmissing++;
    }
    if (nmissing)
        return td_error(TD_ERR_TIMEOUT,
                        "rank %d: %s at seq %llu timed out after %d ms: rank(s) "
                        "%s never arrived (they are slower, stuck, or called "
                        "something else; raise TANDEM_COMM_TIMEOUT_MS if slow)",
                        pg->rank, what, (unsigned long long)pg->cur.seq, pg->timeout_ms, missing);
    return td_error(TD_ERR_TIMEOUT,
                    "rank %d: %s at seq %llu timed out after %d ms waiting for "
                    "data from rank %d (every rank arrived; rank %d stalled)",
                    pg->rank, what, (unsigned long long)pg->cur.seq, pg->timeout_ms, waiting_peer,
                    waiting_peer);
}

void td__pg_publish_failure(td_pg_t *pg, td_status failure, const char *msg) {
    if (!pg->store) return;
    char *saved = td_xstrdup(td_error_msg());
    char *key = td__pg_key(pg, "first_failure");
    char *val = td_xasprintf("%d rank %d: %s", (int)failure, pg->rank, msg);
    int old = td__store_set_io_timeout(pg->store, 1000);
    td_status st = td_store_compare_set(pg->store, key, NULL, 0, val, strlen(val), NULL, NULL);
    td__store_set_io_timeout(pg->store, old);
    if (st != TD_OK) td_error(TD_ERR_PEER, "%s", saved);
    free(val);
    free(key);
    free(saved);
}

char *td__pg_first_failure(td_pg_t *pg, td_status *st_out) {
    if (st_out) *st_out = TD_ERR_PEER;
    if (!pg->store) return NULL;
    char *saved = td_xstrdup(td_error_msg());
    char *key = td__pg_key(pg, "first_failure");
    void *v = NULL;
    int old = td__store_set_io_timeout(pg->store, 1000);
    td_status st = td_store_get(pg->store, key, &v, NULL, 0);
    td__store_set_io_timeout(pg->store, old);
    if (st != TD_OK) {
        td_error(TD_ERR_PEER, "%s", saved);
        v = NULL;
    } else {
        char *text = v, *rest = NULL;
        long code = strtol(text, &rest, 10);
        if (rest != text && *rest == ' ') {
            if (st_out && code > TD_OK && code < TD_STATUS_COUNT) *st_out = (td_status)code;
            memmove(text, rest + 1, strlen(rest + 1) + 1);
        }
    }
    free(key);
    free(saved);
    return v;
}

static td_status wait_keys(td_pg_t *pg, const char *what, int timeout_ms) {
    const char **keys = td_xcalloc((size_t)pg->world, sizeof(*keys));
    for (int j = 0; j < pg->world; j++) keys[j] = td__pg_key(pg, "%s/%d", what, j);
    td_status st = td_store_wait(pg->store, keys, pg->world, timeout_ms);
    for (int j = 0; j < pg->world; j++) free((void *)keys[j]);
    free(keys);
    if (st != TD_OK)
        return td_error(st, "rank %d: process group '%s' (world size %d) did not assemble: %s",
                        pg->rank, pg->prefix, pg->world, td_error_msg());
    return TD_OK;
}

td_status td_pg_init(const td_pg_options *opts, td_pg_t **out) {
    *out = NULL;
    if (!opts || opts->world_size < 1 || opts->rank < 0 || opts->rank >= opts->world_size)
        return td_error(TD_ERR_INVALID,
                        "process group: rank %d is not in 0..world_size-1 "
                        "(world_size %d)",
                        opts ? opts->rank : -1, opts ? opts->world_size : 0);
    if (opts->world_size > 1 && !opts->store)
        return td_error(TD_ERR_INVALID, "process group: world size %d needs a store",
                        opts->world_size);
    if (opts->world_size > 1 && (!opts->prefix || !*opts->prefix))
        return td_error(TD_ERR_INVALID, "process group: empty prefix (give each group a unique "
                                        "key namespace, e.g. \"pg0/attempt3\")");
    td_status st = TD_OK;
    td_pg_t *pg = td_xcalloc(1, sizeof(*pg));
    int W = opts->world_size, r = opts->rank;
    pg->rank = r;
    pg->world = W;
    pg->store = opts->store;
    pg->prefix = td_xstrdup(opts->prefix ? opts->prefix : "solo");
    pg->bind_addr = opts->bind_addr && *opts->bind_addr ? td_xstrdup(opts->bind_addr) : NULL;
    pg->timeout_ms =
        opts->timeout_ms > 0 ? opts->timeout_ms : (int)td_env_int(TD_ENV_COMM_TIMEOUT_MS);
    pg->tp = td_xcalloc((size_t)W, sizeof(*pg->tp));
    pg->host_keys = td_xcalloc((size_t)W, sizeof(*pg->host_keys));
    pg->pids = td_xcalloc((size_t)W, sizeof(*pg->pids));
    pg->arrived = td_xcalloc((size_t)W, sizeof(*pg->arrived));
    pg->p2p_sent = td_xcalloc((size_t)W, sizeof(*pg->p2p_sent));
    pg->p2p_recvd = td_xcalloc((size_t)W, sizeof(*pg->p2p_recvd));
    pg->nlocal = 1;
    pg->chunk_bytes = SHM_CHUNK_BYTES;
    bool *use_shm = td_xcalloc((size_t)W, sizeof(bool));
    bool *use_tcp = td_xcalloc((size_t)W, sizeof(bool));
    char *mine = NULL, *key = NULL;
    pg->host_keys[r] =
        opts->host_key && *opts->host_key ? td_xstrdup(opts->host_key) : derive_host_key();
    pg->pids[r] = (int)getpid();
    if (W == 1) goto done;

    /* Phase 1: who lives where. */
    mine = td_xasprintf("%d\n%s", pg->pids[r], pg->host_keys[r]);
    key = td__pg_key(pg, "info/%d", r);
    TD_CHECK_GOTO(td_store_set(pg->store, key, mine, strlen(mine)), st, out);
    TD_CHECK_GOTO(wait_keys(pg, "info", pg->timeout_ms), st, out);
    for (int j = 0; j < W; j++) {
        if (j == r) continue;
        free(key);
        key = td__pg_key(pg, "info/%d", j);
        void *v = NULL;
        TD_CHECK_GOTO(td_store_get(pg->store, key, &v, NULL, 0), st, out);
        char *nl = strchr(v, '\n');
        pg->pids[j] = atoi(v);
        pg->host_keys[j] = td_xstrdup(nl ? nl + 1 : "");
        free(v);
    }
    bool any_shm = false, any_tcp = false;
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 0; i < W; i++) {
        for (int j = 0; j < W; j++) {
            if (i == j) continue;
            bool same = !strcmp(pg->host_keys[i], pg->host_keys[j]);
            bool shm = opts->transport == TD_TRANSPORT_SHM ||
                       (opts->transport == TD_TRANSPORT_AUTO && same);
            any_shm |= shm;
            any_tcp |= !shm;
            if (i == r) {
                use_shm[j] = shm;
                use_tcp[j] = !shm;
                if (same) pg->nlocal++;
            }
        }
    }
    pg->oversubscribed = pg->nlocal > ncpu;
    /* Phase 2: each transport wires itself up with its peers (addresses through the store). */
    TD_CHECK_GOTO(td__shm_transport_new(pg, use_shm, &pg->shm), st, out);
    TD_CHECK_GOTO(td__tcp_transport_new(pg, use_tcp, &pg->tcp), st, out);
    for (int j = 0; j < W; j++)
        if (j != r) pg->tp[j] = use_shm[j] ? pg->shm : pg->tcp;
    /* Every rank derives the same unit from the whole group's view. */
    pg->chunk_bytes = any_tcp ? TCP_CHUNK_BYTES : SHM_CHUNK_BYTES;
    if (any_shm) pg->chunk_bytes = TD_MIN(pg->chunk_bytes, SHM_CHUNK_BYTES);
    TD_LOG_DEBUG("comm: rank %d/%d group '%s' up: %d local rank(s), %s%s", r, W, pg->prefix,
                 pg->nlocal, pg->shm ? "shm " : "", pg->tcp ? "tcp" : "");
done:
    *out = pg;
    pg = NULL;
out:
    free(use_shm);
    free(use_tcp);
    free(mine);
    free(key);
    if (pg) td_pg_free(pg);
    return st;
}

static td_status split_addr(const char *addr, char **host, int *port) {
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return td_error(TD_ERR_INVALID, "TANDEM_STORE_ADDR='%s' is not HOST:PORT", addr);
    int64_t p;
    TD_CHECK(td_parse_i64("TANDEM_STORE_ADDR port", colon + 1, &p));
    if (p <= 0 || p > 65535)
        return td_error(TD_ERR_INVALID, "TANDEM_STORE_ADDR='%s': port out of range", addr);
    size_t hl = (size_t)(colon - addr);
    if (addr[0] == '[' && hl >= 2 && addr[hl - 1] == ']') { /* [v6]:port */
        *host = strndup(addr + 1, hl - 2);
    } else {
        *host = strndup(addr, hl);
    }
    *port = (int)p;
    return TD_OK;
}

static td_status env_int(const char *name, int64_t def, int64_t *out) {
    const char *v = getenv(name);
    if (!v || !*v) {
        if (def < 0)
            return td_error(TD_ERR_INVALID,
                            "%s is not set (start the job with `tandem launch`, "
                            "or set RANK, WORLD_SIZE, TANDEM_STORE_ADDR and "
                            "TANDEM_TOKEN)",
                            name);
        *out = def;
        return TD_OK;
    }
    return td_parse_i64(name, v, out);
}

td_status td_pg_init_from_env(td_pg_t **out, td_store_t **store_out) {
    *out = NULL;
    *store_out = NULL;
    int64_t rank, world, restart;
    TD_CHECK(env_int(td_var_name(TD_VAR_RANK), -1, &rank));
    TD_CHECK(env_int(td_var_name(TD_VAR_WORLD_SIZE), -1, &world));
    TD_CHECK(env_int(td_var_name(TD_VAR_TANDEM_RESTART_COUNT), 0, &restart));
    const char *addr = td_var_get(TD_VAR_TANDEM_STORE_ADDR);
    const char *token = td_var_get(TD_VAR_TANDEM_TOKEN);
    const char *run_id = td_var_get(TD_VAR_TANDEM_RUN_ID);
    if (!run_id) run_id = "run";
    td_store_t *store = NULL;
    char *host = NULL, *prefix = NULL;
    td_status st = TD_OK;
    int port = 0;
    int64_t heartbeat_ms = 0;
    const char *hb = td_var_get(TD_VAR_TANDEM_HEARTBEAT_MS);
    if (hb && (td_parse_i64(td_var_name(TD_VAR_TANDEM_HEARTBEAT_MS), hb, &heartbeat_ms) != TD_OK ||
               heartbeat_ms < 0 || heartbeat_ms > INT32_MAX))
        return td_error(TD_ERR_INVALID,
                        "%s='%s': expected milliseconds >= 0 (tandem launch sets it from "
                        "--stall-timeout; unset it, or 0, to publish no progress)",
                        td_var_name(TD_VAR_TANDEM_HEARTBEAT_MS), hb);
    if (world > 1 || (addr && *addr)) {
        if (!addr || !*addr)
            return td_error(TD_ERR_INVALID,
                            "TANDEM_STORE_ADDR is not set (WORLD_SIZE=%lld needs "
                            "the job's store; start with `tandem launch`)",
                            (long long)world);
        if (!token || !*token)
            return td_error(TD_ERR_INVALID, "TANDEM_TOKEN is not set (the launcher passes the "
                                            "job's token to every worker)");
        TD_CHECK(split_addr(addr, &host, &port));
        TD_CHECK_GOTO(td_store_connect(host, port, token, -1, &store), st, out);
    }
    const char *tr = td_env_str(TD_ENV_COMM_TRANSPORT);
    td_pg_options o = {.rank = (int)rank, .world_size = (int)world, .store = store};
    if (!strcmp(tr, "shm"))
        o.transport = TD_TRANSPORT_SHM;
    else if (!strcmp(tr, "tcp"))
        o.transport = TD_TRANSPORT_TCP;
    else if (strcmp(tr, "auto")) {
        st = td_error(TD_ERR_INVALID, "TANDEM_COMM_TRANSPORT=%s: expected auto, shm or tcp", tr);
        goto out;
    }
    const char *hk = td_env_str(TD_ENV_HOST_KEY);
    o.host_key = hk && *hk ? hk : NULL;
    prefix = td__pg_env_prefix(run_id, (long long)restart);
    o.prefix = prefix;
    TD_CHECK_GOTO(td_pg_init(&o, out), st, out);
    /* Under `tandem launch` with a stall timeout, tell the launcher how far this rank got
     * (docs/comm.md, "Progress"). A group of one has nobody to wait for: nothing to publish. */
    if (world > 1 && heartbeat_ms > 0)
        td__progress_start(*out, host, port, token, (int)heartbeat_ms, &(*out)->progress);
    *store_out = store;
    store = NULL;
out:
    td_store_close(store);
    free(host);
    free(prefix);
    return st;
}

void td_pg_free(td_pg_t *pg) {
    if (!pg) return;
    td__progress_stop(pg->progress); /* first: its thread reads pg->act */
    if (pg->shm) pg->shm->ops->free(pg->shm);
    if (pg->tcp) pg->tcp->ops->free(pg->tcp);
    if (pg->host_keys)
        for (int j = 0; j < pg->world; j++) free(pg->host_keys[j]);
    free(pg->host_keys);
    free(pg->pids);
    free(pg->tp);
    free(pg->arrived);
    free(pg->p2p_sent);
    free(pg->p2p_recvd);
    free(pg->prefix);
    free(pg->bind_addr);
    free(pg->broken_msg);
    free(pg->scratch);
    free(pg);
}

int td_pg_rank(const td_pg_t *pg) {
    return pg->rank;
}

int td_pg_timeout_ms(const td_pg_t *pg) {
    return pg->timeout_ms;
}

int td_pg_world_size(const td_pg_t *pg) {
    return pg->world;
}
