/* The shm transport: ranks on one host talk through POSIX shared memory.
 *
 * Each rank creates one segment holding a control block and one single-producer ring per peer
 * (rank r's ring j carries r -> j). Counters are free-running uint32 byte positions on their
 * own cache lines; the receiver reads messages in place from the sender's ring (recv_ptr), so a
 * reduction reads peers' data with no copy on its side. Waiting spins briefly, then sleeps on a
 * futex with a short timeout so deadlines, peer deaths (pidfd) and peer aborts are noticed.
 * A message never straddles the ring's end: both sides skip to the start by the same rule.
 * Segments are unlinked as soon as every peer has mapped them, so nothing is left in /dev/shm
 * even if a rank is killed later. */
#include "comm/pg_internal.h"
#include "comm/store_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SEG_MAGIC      0x4d485354u /* "TSHM" */
#define CTRL_BYTES     4096u
#define RING_HDR_BYTES 4096u
#define RING_BYTES     (1u << 20)
#define CHECK_EVERY_NS 20000000ull /* liveness/deadline checks while asleep */

/* 128 bytes apart, not 64: the adjacent-line prefetcher moves lines in 128-byte pairs, so
 * neighbours on one pair would bounce between the cores together (false sharing). */
typedef struct {
    _Alignas(128) atomic_uint head; /* bytes published by the sender */
    _Alignas(128) atomic_uint head_wait;
    _Alignas(128) atomic_uint tail; /* bytes released by the receiver */
    _Alignas(128) atomic_uint tail_wait;
} ring_hdr;

typedef struct {
    uint32_t magic;
    int32_t rank, world, pid;
    _Alignas(64) atomic_uint aborted;
    int32_t status; /* the td_status that made the rank abort */
    char why[1024];
} seg_ctrl;

typedef struct {
    td_transport base;
    int rank, world;
    bool *peer;    /* per rank: reached through this transport */
    uint8_t **seg; /* per rank: mapped segment (own included) */
    size_t seg_bytes;
    char *own_name; /* until unlinked */
    uint32_t *wpos; /* per peer: my ring's head (local copy) */
    uint32_t *rpos; /* per peer: my read position in the peer's ring */
    int *pidfd;     /* per peer, -1 = unknown */
    uint64_t spin_ns;
    unsigned yields;
} shm_t;

static inline ring_hdr *ring_of(shm_t *t, int owner, int dest) {
    return (ring_hdr *)(t->seg[owner] + CTRL_BYTES + (size_t)dest * (RING_HDR_BYTES + RING_BYTES));
}

static inline uint8_t *ring_data(shm_t *t, int owner, int dest) {
    return (uint8_t *)ring_of(t, owner, dest) + RING_HDR_BYTES;
}

static inline seg_ctrl *ctrl_of(shm_t *t, int rank) {
    return (seg_ctrl *)t->seg[rank];
}

static inline bool reached(uint32_t v, uint32_t target) {
    return (int32_t)(v - target) >= 0;
}

static long futex(atomic_uint *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* Waits until *word reaches target. peer is the rank that will move it. */
static td_status wait_word(shm_t *t, int peer, atomic_uint *word, atomic_uint *waitflag,
                           uint32_t target) {
    if (reached(atomic_load_explicit(word, memory_order_acquire), target)) return TD_OK;
    uint64_t start = td_now_ns();
    unsigned i = 0;
    while (td_now_ns() - start < t->spin_ns) {
        for (int k = 0; k < 32; k++) {
            cpu_relax();
            if (reached(atomic_load_explicit(word, memory_order_acquire), target)) return TD_OK;
        }
        if (++i % 64 == 0) sched_yield();
    }
    for (unsigned y = 0; y < t->yields; y++) {
        sched_yield();
        if (reached(atomic_load_explicit(word, memory_order_acquire), target)) return TD_OK;
    }
    uint64_t last_check = 0;
    const struct timespec ts = {0, (long)CHECK_EVERY_NS};
    for (;;) {
        atomic_store(waitflag, 1);
        uint32_t v = atomic_load(word);
        if (reached(v, target)) break;
        futex(word, FUTEX_WAIT, v, &ts);
        if (reached(atomic_load_explicit(word, memory_order_acquire), target)) break;
        uint64_t now = td_now_ns();
        if (now - last_check >= CHECK_EVERY_NS / 2) {
            last_check = now;
            td_status st = td__pg_check(t->base.pg, peer);
            if (st != TD_OK) {
                atomic_store(waitflag, 0);
                return st;
            }
        }
    }
    atomic_store(waitflag, 0);
    return TD_OK;
}

static inline void publish(atomic_uint *word, atomic_uint *waitflag, uint32_t v) {
    /* seq_cst store then load: pairs with the waiter's store-flag-then-load (Dekker), so either
     * the waiter sees v or we see its flag and wake it. */
    atomic_store(word, v);
    if (atomic_load(waitflag)) futex(word, FUTEX_WAKE, INT32_MAX, NULL);
}

/* Where a message of n bytes starts: 64-byte aligned (reductions read floats in place) and
 * never straddling the ring's end. Both sides apply the same rule. */
static inline uint32_t place(uint32_t pos, size_t n) {
    pos = (pos + 63u) & ~63u;
    uint32_t off = pos & (RING_BYTES - 1);
    if (off + n > RING_BYTES) pos += RING_BYTES - off;
    return pos;
}

static td_status shm_send(td_transport *tr, int peer, const void *buf, size_t n) {
    shm_t *t = (shm_t *)tr;
    if (n == 0) return TD_OK;
    ring_hdr *rg = ring_of(t, t->rank, peer);
    uint32_t pos = place(t->wpos[peer], n);
    TD_CHECK(wait_word(t, peer, &rg->tail, &rg->tail_wait, pos + (uint32_t)n - RING_BYTES));
    memcpy(ring_data(t, t->rank, peer) + (pos & (RING_BYTES - 1)), buf, n);
    t->wpos[peer] = pos + (uint32_t)n;
    publish(&rg->head, &rg->head_wait, t->wpos[peer]);
    return TD_OK;
}

static td_status shm_send2(td_transport *tr, int peer, const void *a, size_t na, const void *b,
                           size_t nb) {
    shm_t *t = (shm_t *)tr;
    ring_hdr *rg = ring_of(t, t->rank, peer);
    uint32_t pa = na ? place(t->wpos[peer], na) : t->wpos[peer];
    uint32_t pb = nb ? place(pa + (uint32_t)na, nb) : pa + (uint32_t)na;
    uint32_t end = pb + (uint32_t)nb;
    if (end == t->wpos[peer]) return TD_OK;
    TD_CHECK(wait_word(t, peer, &rg->tail, &rg->tail_wait, end - RING_BYTES));
    uint8_t *d = ring_data(t, t->rank, peer);
    if (na) memcpy(d + (pa & (RING_BYTES - 1)), a, na);
    if (nb) memcpy(d + (pb & (RING_BYTES - 1)), b, nb);
    t->wpos[peer] = end;
    publish(&rg->head, &rg->head_wait, end);
    return TD_OK;
}

static td_status shm_recv_ptr(td_transport *tr, int peer, size_t n, const void **ptr) {
    shm_t *t = (shm_t *)tr;
    ring_hdr *rg = ring_of(t, peer, t->rank);
    uint32_t pos = place(t->rpos[peer], n);
    if (n) TD_CHECK(wait_word(t, peer, &rg->head, &rg->head_wait, pos + (uint32_t)n));
    *ptr = ring_data(t, peer, t->rank) + (pos & (RING_BYTES - 1));
    return TD_OK;
}

static void shm_recv_done(td_transport *tr, int peer, size_t n) {
    shm_t *t = (shm_t *)tr;
    if (n == 0) return;
    ring_hdr *rg = ring_of(t, peer, t->rank);
    t->rpos[peer] = place(t->rpos[peer], n) + (uint32_t)n;
    publish(&rg->tail, &rg->tail_wait, t->rpos[peer]);
}

static td_status shm_recv_into(td_transport *tr, int peer, void *dst, size_t n) {
    const void *p;
    if (n == 0) return TD_OK;
    TD_CHECK(shm_recv_ptr(tr, peer, n, &p));
    memcpy(dst, p, n);
    shm_recv_done(tr, peer, n);
    return TD_OK;
}

static bool shm_ready(td_transport *tr, int peer, size_t n) {
    shm_t *t = (shm_t *)tr;
    ring_hdr *rg = ring_of(t, peer, t->rank);
    return reached(atomic_load(&rg->head), place(t->rpos[peer], n) + (uint32_t)n);
}

static td_status shm_check(td_transport *tr, int waiting_peer) {
    shm_t *t = (shm_t *)tr;
    td_pg_t *pg = tr->pg;
    for (int j = 0; j < t->world; j++) {
        if (!t->peer[j]) continue;
        seg_ctrl *c = ctrl_of(t, j);
        if (atomic_load(&c->aborted)) {
            char why[sizeof(c->why)];
            memcpy(why, c->why, sizeof(why));
            why[sizeof(why) - 1] = 0;
            /* A timeout stays a timeout (the peer's message names the ranks that never came) and
             * a mismatch stays a mismatch (it names both calls). */
            td_status st = c->status == TD_ERR_TIMEOUT || c->status == TD_ERR_MISMATCH
                               ? (td_status)c->status
                               : TD_ERR_PEER;
            return td_error(st, "rank %d failed, so this collective cannot finish: %s", j, why);
        }
    }
    if (waiting_peer >= 0 && t->pidfd[waiting_peer] >= 0) {
        struct pollfd p = {.fd = t->pidfd[waiting_peer], .events = POLLIN};
        if (poll(&p, 1, 0) > 0) {
            char what[96];
            td__fp_describe(&pg->cur, what, sizeof(what));
            return td_error(TD_ERR_PEER,
                            "rank %d (pid %d) died (killed or exited) while rank %d "
                            "waited for it in %s at seq %llu",
                            waiting_peer, pg->pids[waiting_peer], t->rank, what,
                            (unsigned long long)pg->cur.seq);
        }
    }
    return TD_OK;
}

static void shm_abort(td_transport *tr, td_status st, const char *why) {
    shm_t *t = (shm_t *)tr;
    seg_ctrl *c = ctrl_of(t, t->rank);
    if (atomic_load(&c->aborted)) return;
    snprintf(c->why, sizeof(c->why), "%s", why);
    c->status = st;
    atomic_store(&c->aborted, 1);
}

static void shm_free(td_transport *tr) {
    shm_t *t = (shm_t *)tr;
    if (t->own_name) shm_unlink(t->own_name);
    for (int j = 0; j < t->world; j++) {
        if (t->seg[j]) munmap(t->seg[j], t->seg_bytes);
        if (t->pidfd[j] >= 0) close(t->pidfd[j]);
    }
    free(t->own_name);
    free(t->peer);
    free(t->seg);
    free(t->wpos);
    free(t->rpos);
    free(t->pidfd);
    free(t);
}

static const td_transport_ops shm_ops = {
    .name = "shm",
    .send = shm_send,
    .send2 = shm_send2,
    .recv_ptr = shm_recv_ptr,
    .recv_done = shm_recv_done,
    .recv_into = shm_recv_into,
    .ready = shm_ready,
    .check = shm_check,
    .abort = shm_abort,
    .free = shm_free,
};

static td_status map_segment(const char *name, size_t bytes, bool create, uint8_t **out) {
    int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0)
        return td_error_errno(TD_ERR_SYS,
                              "shm: cannot %s segment %s (is /dev/shm mounted and "
                              "writable? ranks with equal host keys must share it)",
                              create ? "create" : "open", name);
    td_status st = TD_OK;
    if (create && ftruncate(fd, (off_t)bytes) != 0) {
        st = td_error_errno(TD_ERR_SYS, "shm: cannot size segment %s to %zu bytes", name, bytes);
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != bytes) {
        st = td_error(TD_ERR_PROTOCOL,
                      "shm: segment %s has %lld bytes, expected %zu (ranks of "
                      "different tandem versions?)",
                      name, (long long)sb.st_size, bytes);
        goto out;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        st = td_error_errno(TD_ERR_SYS, "shm: cannot map segment %s", name);
        goto out;
    }
    *out = p;
out:
    close(fd);
    return st;
}

td_status td__shm_transport_new(td_pg_t *pg, const bool *use, td_transport **out) {
    *out = NULL;
    int W = pg->world, r = pg->rank, npeers = 0;
    for (int j = 0; j < W; j++) npeers += use[j];
    if (!npeers) return TD_OK;
    td_status st = TD_OK;
    shm_t *t = td_xcalloc(1, sizeof(*t));
    t->base.ops = &shm_ops;
    t->base.pg = pg;
    t->base.max_msg = RING_BYTES / 2;
    t->rank = r;
    t->world = W;
    t->peer = td_xcalloc((size_t)W, sizeof(bool));
    t->seg = td_xcalloc((size_t)W, sizeof(uint8_t *));
    t->wpos = td_xcalloc((size_t)W, sizeof(uint32_t));
    t->rpos = td_xcalloc((size_t)W, sizeof(uint32_t));
    t->pidfd = td_xmalloc((size_t)W * sizeof(int));
    for (int j = 0; j < W; j++) t->pidfd[j] = -1;
    memcpy(t->peer, use, (size_t)W * sizeof(bool));
    t->seg_bytes = CTRL_BYTES + (size_t)W * (RING_HDR_BYTES + RING_BYTES);
    /* Spinning only pays when every rank has a core of its own. With more ranks than CPUs, the
     * rank being waited for may be queued behind this one: give it the CPU a few times first
     * (what Open MPI does oversubscribed), then sleep. A futex sleep and wake-up per hand-off
     * had made a 4-rank allreduce on 2 CPUs 2.5x slower than Open MPI's below 1 MiB. */
    t->spin_ns = pg->oversubscribed ? 0 : 50000;
    t->yields = pg->oversubscribed ? 32 : 0;
    char *key = NULL;
    void *v = NULL;
    const char **keys = td_xcalloc((size_t)W, sizeof(*keys));
    int nkeys = 0;

    uint8_t rnd[8];
    if (td__random_bytes(rnd, sizeof(rnd)) != 0) {
        st = td_error_errno(TD_ERR_SYS, "getrandom");
        goto out;
    }
    t->own_name = td_xasprintf("/tandem-%d-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(), rnd[0],
                               rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    TD_CHECK_GOTO(map_segment(t->own_name, t->seg_bytes, true, &t->seg[r]), st, out);
    seg_ctrl *c = ctrl_of(t, r);
    c->magic = SEG_MAGIC;
    c->rank = r;
    c->world = W;
    c->pid = (int)getpid();
    key = td__pg_key(pg, "shm/%d", r);
    TD_CHECK_GOTO(td_store_set(pg->store, key, t->own_name, strlen(t->own_name)), st, out);
    for (int j = 0; j < W; j++) {
        if (!use[j]) continue;
        free(key);
        key = td__pg_key(pg, "shm/%d", j);
        TD_CHECK_GOTO(td_store_get(pg->store, key, &v, NULL, pg->timeout_ms), st, out);
        TD_CHECK_GOTO(map_segment(v, t->seg_bytes, false, &t->seg[j]), st, out);
        seg_ctrl *pc = ctrl_of(t, j);
        if (pc->magic != SEG_MAGIC || pc->rank != j || pc->world != W) {
            st = td_error(TD_ERR_PROTOCOL,
                          "shm: segment %s does not belong to rank %d of this "
                          "group (magic 0x%x rank %d world %d)",
                          (char *)v, j, pc->magic, pc->rank, pc->world);
            goto out;
        }
        free(v);
        v = NULL;
        t->pidfd[j] = (int)syscall(SYS_pidfd_open, pc->pid, 0);
        keys[nkeys++] = td__pg_key(pg, "shm_mapped/%d", j);
    }
    /* Once every peer mapped my segment, its name is no longer needed: unlink it now, so a
     * rank killed later leaks nothing. */
    free(key);
    key = td__pg_key(pg, "shm_mapped/%d", r);
    TD_CHECK_GOTO(td_store_set(pg->store, key, "1", 1), st, out);
    TD_CHECK_GOTO(td_store_wait(pg->store, keys, nkeys, pg->timeout_ms), st, out);
    shm_unlink(t->own_name);
    free(t->own_name);
    t->own_name = NULL;
    *out = &t->base;
    t = NULL;
out:
    for (int i = 0; i < nkeys; i++) free((void *)keys[i]);
    free(keys);
    free(key);
    free(v);
    if (t) shm_free(&t->base);
    return st;
}
