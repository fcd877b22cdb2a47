/* tandem comm: the rendezvous store, process groups, transports and collectives.
 *
 * Store: a TCP key-value server (one per job, hosted by the launcher's node-0 agent or by rank 0)
 * and a client. Every connection proves it knows the job token through a challenge-response
 * (HMAC-style, the token never crosses the wire). Values are opaque bytes.
 *
 * Process group: rank, world size and a transport per peer behind one vtable (shm within a host,
 * tcp across hosts). Collectives are written only against that vtable. Every collective carries
 * a fingerprint (sequence number, op, dtype, count) that all ranks compare, has a timeout, and
 * fails fast when a peer dies. Sums use one fixed binary tree over ranks, so every rank gets the
 * same bits, in every run.
 *
 * Threading: a td_store_t or td_pg_t is used by one thread at a time (the ddp reducer's comm
 * thread owns the process group while a step is in flight).
 */
#ifndef TANDEM_COMM_H
#define TANDEM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================ rendezvous store ================================ */

typedef struct td_store_server td_store_server_t;
typedef struct td_store td_store_t;

/* Starts a server thread listening on host:port ("0.0.0.0" or NULL = all interfaces; port 0 =
 * an ephemeral port, read it back with td_store_server_port). token must be non-empty. What
 * clients can make it hold is bounded (docs/comm.md, "Limits"): 262144 keys, 64 MiB of keys and
 * values, 16 MiB per value, 8192 connections; a request past a bound fails with TD_ERR_NOSPACE
 * (a value too large: TD_ERR_INVALID) and a message naming the bound, and changes nothing. */
td_status td_store_server_start(const char *host, int port, const char *token,
                                td_store_server_t **out);
/* The same over a listening socket the caller already holds (td_listen_tcp, possibly inherited
 * from a parent that picked the port): the port can never be lost between choosing and serving
 * it. The server owns fd from here on, also on failure (it is closed then). */
td_status td_store_server_start_fd(int fd, const char *token, td_store_server_t **out);
int td_store_server_port(const td_store_server_t *srv);
void td_store_server_stop(td_store_server_t *srv);

/* Connects and authenticates, retrying refused connections until timeout_ms has passed (the
 * server may not be up yet, or be at its connection limit: then TD_ERR_NOSPACE in the end). A
 * wrong token is TD_ERR_AUTH at once. */
td_status td_store_connect(const char *host, int port, const char *token, int timeout_ms,
                           td_store_t **out);
void td_store_close(td_store_t *store);

td_status td_store_set(td_store_t *store, const char *key, const void *value, size_t nbytes);
/* Waits up to timeout_ms for key to exist (0 = don't wait: TD_ERR_NOTFOUND when absent, -1 =
 * TANDEM_STORE_TIMEOUT_MS). *value is malloc'd (and NUL-terminated past nbytes for
 * convenience); the caller frees it. */
td_status td_store_get(td_store_t *store, const char *key, void **value, size_t *nbytes,
                       int timeout_ms);
/* Atomic counter: adds delta to the integer stored at key (absent = 0) and returns the sum. */
td_status td_store_add(td_store_t *store, const char *key, int64_t delta, int64_t *result);
/* Blocks until all keys exist; TD_ERR_TIMEOUT naming the missing keys otherwise. */
td_status td_store_wait(td_store_t *store, const char *const *keys, int nkeys, int timeout_ms);
/* Sets key to desired if its current value equals expected (expected_nbytes == 0 and expected
 * NULL: if key is absent). Returns the value now stored in *actual (malloc'd; may be NULL). */
td_status td_store_compare_set(td_store_t *store, const char *key, const void *expected,
                               size_t expected_nbytes, const void *desired, size_t desired_nbytes,
                               void **actual, size_t *actual_nbytes);
td_status td_store_delete(td_store_t *store, const char *key, bool *existed);

/* ================================ process groups ================================ */

typedef struct td_pg td_pg_t;

typedef enum { TD_TRANSPORT_AUTO = 0, TD_TRANSPORT_SHM, TD_TRANSPORT_TCP } td_transport_kind;
/* AVG = the sum divided by the world size (floating types only); MIN, MAX and PRODUCT are
 * elementwise; BAND, BOR and BXOR are bitwise (integers and bool only). td_allreduce and
 * td_reduce_scatter (float32) take every op a float takes. */
typedef enum {
    TD_REDUCE_SUM = 0,
    TD_REDUCE_AVG,
    TD_REDUCE_MIN,
    TD_REDUCE_MAX,
    TD_REDUCE_PRODUCT,
    TD_REDUCE_BAND,
    TD_REDUCE_BOR,
    TD_REDUCE_BXOR,
} td_reduce_op;

/* Element types of the typed collectives (the values travel in fingerprints: keep them). BYTES
 * is for data moved without arithmetic; the reductions take every other one. float16 and
 * bfloat16 are reduced pairwise in float32 and rounded back (to nearest even) after every
 * operation, as PyTorch's CPU kernels do; integers wrap around on overflow; BOOL: sum and max
 * are "or", product and min are "and". */
typedef enum {
    TD_ELEM_BYTES = 0,
    TD_ELEM_F32 = 1,
    TD_ELEM_F64,
    TD_ELEM_F16,
    TD_ELEM_BF16,
    TD_ELEM_I8,
    TD_ELEM_U8,
    TD_ELEM_I16,
    TD_ELEM_I32,
    TD_ELEM_I64,
    TD_ELEM_BOOL,
    TD_ELEM_COUNT
} td_elem_type;

/* Bytes per element (1 for BYTES), and "float32", "int64", ... ("?" past the end). */
size_t td_elem_size(td_elem_type dtype);
const char *td_elem_name(td_elem_type dtype);
/* "sum", "avg", "min", "max", "product", "band", "bor", "bxor". */
const char *td_reduce_op_name(td_reduce_op op);

typedef struct {
    int rank;
    int world_size;
    td_store_t *store;           /* borrowed; must outlive the group */
    const char *prefix;          /* key namespace in the store, e.g. "pg0/attempt3" */
    td_transport_kind transport; /* AUTO: shm between ranks on the same host, tcp otherwise */
    const char *host_key;        /* ranks with equal host_key may use shm; NULL = derive from the
                                    machine (boot id + network namespace + hostname) */
    const char *bind_addr;       /* tcp: address to listen on and publish; NULL = the address this
                                    host uses to reach the store */
    int timeout_ms;              /* per collective; 0 = TANDEM_COMM_TIMEOUT_MS */
} td_pg_options;

td_status td_pg_init(const td_pg_options *opts, td_pg_t **out);
/* Builds a group from the launcher's environment: RANK, WORLD_SIZE, LOCAL_RANK,
 * TANDEM_STORE_ADDR (host:port), TANDEM_TOKEN, TANDEM_RUN_ID, TANDEM_RESTART_COUNT; connects to
 * the store (returned in *store_out, caller closes it after td_pg_free). */
td_status td_pg_init_from_env(td_pg_t **out, td_store_t **store_out);
void td_pg_free(td_pg_t *pg);
int td_pg_rank(const td_pg_t *pg);
int td_pg_world_size(const td_pg_t *pg);

/* ---- progress, for the launcher's stall check (docs/comm.md, "Progress") ----
 * A group that td_pg_init_from_env builds with TANDEM_HEARTBEAT_MS > 0 (tandem launch sets it
 * from --stall-timeout) publishes what this rank's collectives are doing under
 * td_pg_progress_key, from a thread with a store connection of its own: when it changed (at most
 * every min(TANDEM_HEARTBEAT_MS, 1 s)) and every TANDEM_HEARTBEAT_MS regardless, as a heartbeat.
 * Collectives themselves only update counters in memory. */
typedef enum {
    TD_PG_BETWEEN = 0, /* not inside a collective: before the first one, or past the last one */
    TD_PG_INSIDE,      /* inside collective seq started-1 */
    TD_PG_FAILED,      /* the group failed (the process is expected to exit) */
    TD_PG_CLOSED,      /* td_pg_free ran */
} td_pg_state;

typedef struct {
    uint64_t beat;     /* publication number: a new one at least every TANDEM_HEARTBEAT_MS */
    uint64_t started;  /* collectives started; the current or last one has seq started-1 */
    uint64_t finished; /* collectives finished */
    uint64_t steps;    /* pipelined pieces moved in the current collective (data is moving) */
    char op[16];       /* "allreduce", "broadcast", ... of that collective; "" before the first */
    td_pg_state state;
    int pid;
} td_pg_progress;

/* Where rank publishes for the group td_pg_init_from_env builds for (run_id, restart):
 * "tandem/<run_id>/restart<restart>/pg/progress/<rank>". malloc'd. */
char *td_pg_progress_key(const char *run_id, int restart, int rank);
/* Parses a published value; TD_ERR_FORMAT naming what is wrong otherwise. */
td_status td_pg_progress_parse(const void *value, size_t nbytes, td_pg_progress *out);
/* Formats p as the one-line value the publisher stores (what td_pg_progress_parse reads). */
void td_pg_progress_format(const td_pg_progress *p, char *buf, size_t nbytes);

/* ================================ collectives ================================
 * All ranks must call the same collectives in the same order with the same counts; a mismatch
 * is TD_ERR_MISMATCH on every rank naming both ranks and both calls. */

/* In place, float32. Sum in a fixed binary tree over ranks ((r0+r1)+(r2+r3))...; AVG divides
 * the sum by world_size afterwards. Every rank ends with identical bits. */
td_status td_allreduce(td_pg_t *pg, float *buf, size_t count, td_reduce_op op);
td_status td_broadcast(td_pg_t *pg, void *buf, size_t nbytes, int root);
/* out holds world_size * nbytes_per_rank bytes, rank r's contribution at r * nbytes_per_rank. */
td_status td_allgather(td_pg_t *pg, const void *in, void *out, size_t nbytes_per_rank);
/* in: world_size * count floats; out: count floats = the reduction of block `rank`. */
td_status td_reduce_scatter(td_pg_t *pg, const float *in, float *out, size_t count,
                            td_reduce_op op);
td_status td_barrier(td_pg_t *pg);

/* ---- typed and rooted collectives (the PyTorch backend's, docs/torch.md) ----
 * The reductions use the same fixed tree as td_allreduce, so every rank gets the same bits, and
 * td_allreduce_typed(TD_ELEM_F32) is td_allreduce. An op the dtype cannot take (AVG of an
 * integer) is TD_ERR_UNSUPPORTED naming both, on every rank, before anything is sent. */
td_status td_allreduce_typed(td_pg_t *pg, void *buf, size_t count, td_elem_type dtype,
                             td_reduce_op op);
/* in: world_size * count elements; out: count elements = the reduction of block `rank`. */
td_status td_reduce_scatter_typed(td_pg_t *pg, const void *in, void *out, size_t count,
                                  td_elem_type dtype, td_reduce_op op);
/* The reduction lands in buf on root; other ranks' buf is left as it was. */
td_status td_reduce(td_pg_t *pg, void *buf, size_t count, td_elem_type dtype, td_reduce_op op,
                    int root);
/* root's out (world_size * nbytes_per_rank) gets rank r's in at r * nbytes_per_rank; out is
 * not touched (may be NULL) elsewhere. */
td_status td_gather(td_pg_t *pg, const void *in, void *out, size_t nbytes_per_rank, int root);
/* Rank r's out gets root's in[r * nbytes_per_rank ..]; in is only read on root (may be NULL
 * elsewhere). */
td_status td_scatter(td_pg_t *pg, const void *in, void *out, size_t nbytes_per_rank, int root);
/* Every rank sends send_nbytes[j] bytes from in + send_offsets[j] to rank j, and receives
 * recv_nbytes[j] bytes from rank j at out + recv_offsets[j]. Rank i's send_nbytes[j] must equal
 * rank j's recv_nbytes[i]: each rank checks the sizes its peers announce before any data moves,
 * and a disagreement is TD_ERR_MISMATCH naming both ranks. */
td_status td_alltoallv(td_pg_t *pg, const void *in, const size_t *send_nbytes,
                       const size_t *send_offsets, void *out, const size_t *recv_nbytes,
                       const size_t *recv_offsets);
/* Point to point, outside the collective sequence (the peers alone take part): messages from
 * one rank to another arrive in the order sent, and td_recv checks the size and tag the sender
 * gave (TD_ERR_MISMATCH naming both otherwise). td_send returns once the transport holds the
 * bytes; two ranks that both send more than it buffers (a chunk, 64 KiB on shm) to each other
 * before receiving wait on each other until the group's timeout, which names the peer. */
td_status td_send(td_pg_t *pg, int peer, const void *buf, size_t nbytes, int tag);
td_status td_recv(td_pg_t *pg, int peer, void *buf, size_t nbytes, int tag);
/* The per-collective timeout this group uses (ms). */
int td_pg_timeout_ms(const td_pg_t *pg);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_COMM_H */
