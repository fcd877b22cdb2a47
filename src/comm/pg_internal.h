/* The process group's insides, shared by pg.c, the transports and collectives.c. Internal. */
#ifndef TD_COMM_PG_INTERNAL_H
#define TD_COMM_PG_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "comm/transport.h"
#include "tandem/comm.h"

typedef enum {
    TD_COLL_BARRIER = 1,
    TD_COLL_ALLREDUCE,
    TD_COLL_BROADCAST,
    TD_COLL_ALLGATHER,
    TD_COLL_REDUCE_SCATTER,
    TD_COLL_REDUCE,
    TD_COLL_GATHER,
    TD_COLL_SCATTER,
    TD_COLL_ALLTOALL,
    TD_COLL_SEND, /* point to point: outside the group's sequence (seq counts per pair) */
} td_coll_kind;

/* What every rank sends every peer at the start of a collective; all fields must agree. */
typedef struct {
    uint32_t magic;
    uint16_t kind;  /* td_coll_kind */
    uint16_t op;    /* td_reduce_op, or 0 */
    uint64_t seq;   /* collectives called on this group so far */
    uint64_t count; /* elements (reductions) or bytes (broadcast, allgather) */
    int32_t root;
    uint32_t dtype; /* td_dtype: 0 = bytes, 1 = float32, ... */
} td_fingerprint;

#define TD_FP_MAGIC 0x43445446u /* "FTDC" */

/* What this rank's collectives are doing, for the progress publisher (progress.c). Written only
 * by the thread running a collective, with relaxed stores: on x86 each is one plain move, so the
 * data path neither locks nor waits; the publisher reads them from its own thread. */
typedef struct {
    _Atomic uint64_t started;  /* collectives started; the current or last one has seq started-1 */
    _Atomic uint64_t finished; /* collectives finished, successfully or not */
    _Atomic uint64_t steps;    /* pipelined pieces done in the current collective */
    _Atomic uint32_t kind;     /* td_coll_kind of the current or last collective; 0 = none yet */
    _Atomic bool failed;       /* the group broke (pg->broken) */
} td__pg_activity;

typedef struct td__progress td__progress;

struct td_pg {
    int rank, world;
    int timeout_ms;
    td_store_t *store;
    char *prefix;
    char *bind_addr; /* tcp: NULL = the address that reaches the store */
    td_transport *shm, *tcp;
    td_transport **tp;   /* per rank; NULL for self */
    char **host_keys;    /* per rank */
    int *pids;           /* per rank */
    size_t chunk_bytes;  /* pipelining unit, identical on every rank */
    int nlocal;          /* ranks sharing this rank's host key, self included */
    bool oversubscribed; /* more local ranks than CPUs: spin less */
    /* the collective in flight */
    uint64_t seq;
    td_fingerprint cur;
    uint64_t deadline_ns;
    bool *arrived; /* per rank: its fingerprint for cur.seq was received */
    /* a failed group stays failed: the streams between ranks are out of step */
    td_status broken;
    char *broken_msg;
    uint64_t *p2p_sent, *p2p_recvd; /* per peer: point-to-point messages so far */
    float *scratch; /* tree-reduction temporaries */
    size_t scratch_floats;
    td__pg_activity act;
    td__progress *progress; /* the publisher thread, or NULL */
};

/* Called by blocked transports: TD_ERR_TIMEOUT past the deadline (naming the ranks that never
 * arrived), TD_ERR_PEER when waiting_peer died or any peer aborted. */
td_status td__pg_check(td_pg_t *pg, int waiting_peer);
/* Records this rank's failure as the group's first (if none yet) in the store, so ranks that
 * only see a closed connection can name the root cause; and fetches it (NULL if none). Both
 * keep the thread's error detail intact and give up quickly when the store is gone. */
/* The group's first failure, kept in the store as "<status> rank R: <msg>" so that a rank that
 * only sees a peer hang up can report the root cause, and its status: a mismatch or a timeout
 * stays what it is on every rank instead of turning into "peer closed" by a race. */
void td__pg_publish_failure(td_pg_t *pg, td_status st, const char *msg);
/* malloc'd "rank R: <msg>", or NULL; *st_out (may be NULL) gets the status. */
char *td__pg_first_failure(td_pg_t *pg, td_status *st_out);
/* "allreduce(count=1024, op=sum)" */
void td__fp_describe(const td_fingerprint *fp, char *buf, size_t n);
/* Store key "<prefix>/<suffix>" (caller frees). */
char *td__pg_key(const td_pg_t *pg, const char *fmt, ...) TD_PRINTF(2, 3);
/* The prefix td_pg_init_from_env gives the group of (run_id, restart): "tandem/<id>/restart<k>/pg".
 * The launcher finds the progress keys under it (td_pg_progress_key). Caller frees. */
char *td__pg_env_prefix(const char *run_id, long long restart);
/* "allreduce", "broadcast", ...; "" for 0. */
const char *td__coll_name(uint32_t kind);

/* ---- progress publisher (progress.c) ----
 * Starts a thread that publishes pg->act under "<prefix>/progress/<rank>" over a store connection
 * of its own (host:port, token): when it changed, at most every min(heartbeat_ms, 1 s), and every
 * heartbeat_ms regardless. Best effort: a failure to connect is logged and leaves *out NULL. */
void td__progress_start(td_pg_t *pg, const char *host, int port, const char *token,
                        int heartbeat_ms, td__progress **out);
/* Publishes a last record (state closed), stops and joins the thread, closes its connection. */
void td__progress_stop(td__progress *p);

#endif
