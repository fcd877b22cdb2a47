/* The transport vtable: how bytes move between two ranks. Collectives (collectives.c) are
 * written only against these operations, so the same algorithm runs over shared memory and TCP.
 *
 * Model: an ordered byte stream per (sender, receiver) pair. Both sides know every message's
 * size from the collective's arguments, so there is no framing. A message is at most max_msg
 * bytes. Receives come in two forms: recv_ptr lends a pointer to the next message in place (shm:
 * the sender's ring; tcp: a staging buffer) until recv_done; recv_into copies it out.
 * Blocking operations call td__pg_check() at least every ~50 ms while they wait; it enforces the
 * collective's deadline and the liveness of peers. Internal to src/comm. */
#ifndef TD_COMM_TRANSPORT_H
#define TD_COMM_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "tandem/comm.h"

typedef struct td_transport td_transport;

typedef struct {
    const char *name;
    td_status (*send)(td_transport *t, int peer, const void *buf, size_t nbytes);
    /* Two messages (a, then b) made visible to the receiver at once: one ring publication
     * (shm) or one syscall (tcp). The receiver still takes them as two messages, so it can
     * check a (a fingerprint) before it trusts b's size. */
    td_status (*send2)(td_transport *t, int peer, const void *a, size_t na, const void *b,
                       size_t nb);
    td_status (*recv_ptr)(td_transport *t, int peer, size_t nbytes, const void **ptr);
    void (*recv_done)(td_transport *t, int peer, size_t nbytes);
    td_status (*recv_into)(td_transport *t, int peer, void *dst, size_t nbytes);
    /* Whether nbytes from peer could be received without waiting (for timeout reports). */
    bool (*ready)(td_transport *t, int peer, size_t nbytes);
    /* Liveness while blocked: TD_ERR_PEER if waiting_peer (-1: none) died or any peer of this
     * transport announced that it aborted. May make progress (drain sockets). */
    td_status (*check)(td_transport *t, int waiting_peer);
    /* Tells this transport's peers that this rank failed with st (why: the error text). */
    void (*abort)(td_transport *t, td_status st, const char *why);
    void (*free)(td_transport *t);
} td_transport_ops;

struct td_transport {
    const td_transport_ops *ops;
    td_pg_t *pg;
    size_t max_msg; /* largest single message */
};

/* Build the transports for the peers with use[peer] true (not self). They exchange what they
 * need through the group's store under its prefix; every rank calls both constructors with
 * the same view of the group (possibly with no peers, then *out is NULL). */
td_status td__shm_transport_new(td_pg_t *pg, const bool *use, td_transport **out);
td_status td__tcp_transport_new(td_pg_t *pg, const bool *use, td_transport **out);

#endif
