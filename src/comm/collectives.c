/* Collectives, written only against the transport vtable.
 *
 * Every collective starts with a fingerprint exchange (seq, kind, op, count, root, dtype) with
 * every peer, so ranks that disagree fail on both sides with a message naming both calls.
 * allreduce sends its first data right behind the fingerprint (one publication, no extra round
 * trip); receivers still check the fingerprint before they read that data.
 *
 * Reductions sum in one fixed binary tree over ranks: adjacent pairs (0,1),(2,3),... are added
 * left+right level by level and a trailing odd node is carried up unchanged. Whichever rank
 * computes an element and whatever the algorithm, the operations and their order are the same,
 * so every rank gets the same bits (the ddp layer's reproducibility rests on this).
 *
 * allreduce: small messages use one round where every rank sends its whole buffer to every peer
 * and reduces all of it locally (latency); larger ones reduce-scatter + allgather, pipelined in
 * chunks: rank r owns segment r, receives every peer's slice of it (in place from shm rings),
 * reduces it in the tree, and sends the result back out. */
#include "comm/pg_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_ALLREDUCE_BYTES (16u << 10)
#define TILE_FLOATS           2048

typedef float v8f __attribute__((vector_size(32)));

/* out[i] = a[i] + b[i]; out may be a or b (same index only). */
static void add2(float *out, const float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        v8f x0, x1, x2, x3, y0, y1, y2, y3;
        memcpy(&x0, a + i, 32);
        memcpy(&x1, a + i + 8, 32);
        memcpy(&x2, a + i + 16, 32);
        memcpy(&x3, a + i + 24, 32);
        memcpy(&y0, b + i, 32);
        memcpy(&y1, b + i + 8, 32);
        memcpy(&y2, b + i + 16, 32);
        memcpy(&y3, b + i + 24, 32);
        x0 += y0;
        x1 += y1;
        x2 += y2;
        x3 += y3;
        memcpy(out + i, &x0, 32);
        memcpy(out + i + 8, &x1, 32);
        memcpy(out + i + 16, &x2, 32);
        memcpy(out + i + 24, &x3, 32);
    }
    for (; i < n; i++) out[i] = a[i] + b[i];
}

static void divide(float *x, size_t n, int w) {
    const float d = (float)w;
    for (size_t i = 0; i < n; i++) x[i] = x[i] / d;
}

/* out = the tree sum of src[0..W) over n floats; out may alias one of the sources. */
static void tree_reduce(td_pg_t *pg, float *out, const float **src, int W, size_t n) {
    if (W == 1) {
        if (out != src[0]) memmove(out, src[0], n * sizeof(float));
        return;
    }
    if (W == 2) {
        add2(out, src[0], src[1], n);
        return;
    }
    size_t need = (size_t)(W / 2) * TILE_FLOATS;
    if (pg->scratch_floats < need) {
        free(pg->scratch);
        pg->scratch = td_xmalloc_aligned(need * sizeof(float));
        pg->scratch_floats = need;
    }
    const float *nodes[64];
    const float **nd = W <= 64 ? nodes : td_xmalloc((size_t)W * sizeof(*nd));
    for (size_t off = 0; off < n; off += TILE_FLOATS) {
        size_t len = TD_MIN((size_t)TILE_FLOATS, n - off);
        for (int j = 0; j < W; j++) nd[j] = src[j] + off;
        /* Writing tmp[i] at a level is safe: a node still needed sits at index > i. */
        for (int m = W; m > 1; m = (m + 1) / 2) {
            for (int i = 0; i < m / 2; i++) {
                float *dst = m == 2 ? out + off : pg->scratch + (size_t)i * TILE_FLOATS;
                add2(dst, nd[2 * i], nd[2 * i + 1], len);
                nd[i] = dst;
            }
            if (m & 1) nd[m / 2] = nd[m - 1];
        }
    }
    if (nd != nodes) free(nd);
}

/* ---------------- fingerprints and failure ---------------- */

static bool fp_equal(const td_fingerprint *a, const td_fingerprint *b) {
    return a->magic == b->magic && a->kind == b->kind && a->op == b->op && a->seq == b->seq &&
           a->count == b->count && a->root == b->root && a->dtype == b->dtype;
}

static td_status fail(td_pg_t *pg, td_status st) {
    if (!pg->broken) {
        pg->broken = st;
        atomic_store_explicit(&pg->act.failed, true, memory_order_relaxed);
        pg->broken_msg = td_xstrdup(td_error_msg());
        td__pg_publish_failure(pg, st, pg->broken_msg);
        if (pg->shm) pg->shm->ops->abort(pg->shm, st, pg->broken_msg);
        if (pg->tcp) pg->tcp->ops->abort(pg->tcp, st, pg->broken_msg);
    }
    return st;
}

/* Starts a collective locally: the fingerprint, the deadline. Nothing is sent yet. */
static td_status start(td_pg_t *pg, td_coll_kind kind, int op, uint64_t count, int root,
                       uint32_t dtype) {
    if (pg->broken)
        return td_error(pg->broken,
                        "rank %d: the process group failed earlier and cannot be "
                        "used again (make a new group): %s",
                        pg->rank, pg->broken_msg);
    td_fingerprint fp = {.magic = TD_FP_MAGIC,
                         .kind = (uint16_t)kind,
                         .op = (uint16_t)op,
                         .seq = pg->seq++,
                         .count = count,
                         .root = root,
                         .dtype = dtype};
    pg->cur = fp;
    pg->deadline_ns = td_now_ns() + (uint64_t)pg->timeout_ms * 1000000ull;
    if (pg->world > 1) memset(pg->arrived, 0, (size_t)pg->world * sizeof(bool));
    /* Progress for the launcher's stall check: relaxed stores, plain moves, no store traffic. */
    atomic_store_explicit(&pg->act.kind, (uint32_t)kind, memory_order_relaxed);
    atomic_store_explicit(&pg->act.steps, 0, memory_order_relaxed);
    atomic_store_explicit(&pg->act.started, pg->seq, memory_order_relaxed);
    return TD_OK;
}

/* One pipelined piece done: data moves inside a long collective, so it is not stalled. Only this
 * thread writes the counter, so load + store (no locked add) is enough. */
static void step_done(td_pg_t *pg) {
    uint64_t n = atomic_load_explicit(&pg->act.steps, memory_order_relaxed);
    atomic_store_explicit(&pg->act.steps, n + 1, memory_order_relaxed);
}

/* Every collective ends here: a failure marks the group broken (once), and the collective counts
 * as finished either way, so the progress record never shows a rank inside a call it left. */
static td_status finish(td_pg_t *pg, td_status st) {
    if (st != TD_OK && st != pg->broken) st = fail(pg, st);
    atomic_store_explicit(&pg->act.finished, pg->seq, memory_order_relaxed);
    return st;
}

/* Sends this collective's fingerprint to peer j, with the first data message (may be empty)
 * right behind it in the same publication, so the data does not wait a round trip for the
 * fingerprints. The receiver checks the fingerprint before it reads the data (recv_fps). */
static td_status send_fp(td_pg_t *pg, int j, const void *data, size_t n) {
    td_transport *t = pg->tp[j];
    return t->ops->send2(t, j, &pg->cur, sizeof(pg->cur), data, n);
}

/* Receives and checks every peer's fingerprint: disagreement fails here, before any of the
 * data behind it (whose size was computed from the peer's arguments) is read. */
static td_status recv_fps(td_pg_t *pg) {
    int W = pg->world, r = pg->rank;
    const td_fingerprint *fp = &pg->cur;
    for (int k = 1; k < W; k++) {
        int j = (r + W - k) % W;
        td_fingerprint other;
        TD_CHECK(pg->tp[j]->ops->recv_into(pg->tp[j], j, &other, sizeof(other)));
        pg->arrived[j] = true;
        if (!fp_equal(fp, &other)) {
            char mine[96], theirs[96];
            td__fp_describe(fp, mine, sizeof(mine));
            if (other.magic != TD_FP_MAGIC)
                return td_error(TD_ERR_PROTOCOL,
                                "rank %d sent garbage where the fingerprint "
                                "of %s at seq %llu belongs",
                                j, mine, (unsigned long long)fp->seq);
            td__fp_describe(&other, theirs, sizeof(theirs));
            if (other.seq != fp->seq)
                return td_error(TD_ERR_MISMATCH,
                                "rank %d called %s at seq %llu but rank %d "
                                "called %s at seq %llu (ranks made different "
                                "numbers of collective calls)",
                                j, theirs, (unsigned long long)other.seq, r, mine,
                                (unsigned long long)fp->seq);
            return td_error(TD_ERR_MISMATCH, "rank %d called %s but rank %d called %s at seq %llu",
                            j, theirs, r, mine, (unsigned long long)fp->seq);
        }
    }
    return TD_OK;
}

/* The fingerprint exchange alone, for collectives that send no data with it. */
static td_status begin(td_pg_t *pg, td_coll_kind kind, int op, uint64_t count, int root,
                       uint32_t dtype) {
    TD_CHECK(start(pg, kind, op, count, root, dtype));
    int W = pg->world, r = pg->rank;
    if (W == 1) return TD_OK;
    for (int k = 1; k < W; k++) /* start with the next rank so senders spread out */
        TD_CHECK(send_fp(pg, (r + k) % W, NULL, 0));
    return recv_fps(pg);
}

#define SEND(j, p, n)      TD_CHECK(pg->tp[j]->ops->send(pg->tp[j], (j), (p), (n)))
#define RECV_INTO(j, p, n) TD_CHECK(pg->tp[j]->ops->recv_into(pg->tp[j], (j), (p), (n)))

/* ---------------- allreduce ---------------- */

static td_status allreduce_small(td_pg_t *pg, float *buf, size_t count, td_reduce_op op) {
    int W = pg->world, r = pg->rank;
    size_t nb = count * sizeof(float);
    const float *srcs[64];
    if (W > 64) return td_error(TD_ERR_UNSUPPORTED, "small allreduce on more than 64 ranks");
    for (int k = 1; k < W; k++) TD_CHECK(send_fp(pg, (r + k) % W, buf, nb));
    TD_CHECK(recv_fps(pg));
    for (int j = 0; j < W; j++) {
        if (j == r) {
            srcs[j] = buf;
            continue;
        }
        const void *p;
        TD_CHECK(pg->tp[j]->ops->recv_ptr(pg->tp[j], j, nb, &p));
        srcs[j] = p;
    }
    tree_reduce(pg, buf, srcs, W, count);
    for (int j = 0; j < W; j++)
        if (j != r) pg->tp[j]->ops->recv_done(pg->tp[j], j, nb);
    if (op == TD_REDUCE_AVG) divide(buf, count, W);
    return TD_OK;
}

typedef struct {
    size_t base;  /* floats per segment (last ones may be shorter or empty) */
    size_t chunk; /* floats per pipelined step */
    size_t nsteps;
    size_t count;
} seg_plan;

static seg_plan plan(const td_pg_t *pg, size_t count) {
    seg_plan p;
    p.count = count;
    p.base = (count + (size_t)pg->world - 1) / (size_t)pg->world;
    p.base = (p.base + 15) & ~(size_t)15; /* segments start on 64-byte boundaries */
    p.chunk = pg->chunk_bytes / sizeof(float);
    p.nsteps = (p.base + p.chunk - 1) / p.chunk;
    return p;
}

/* Offset and length (floats) of segment j's step k. */
static size_t piece(const seg_plan *p, int j, size_t k, size_t *len) {
    size_t seg_off = (size_t)j * p->base;
    size_t seg_len = seg_off >= p->count ? 0 : TD_MIN(p->base, p->count - seg_off);
    size_t off = k * p->chunk;
    *len = off >= seg_len ? 0 : TD_MIN(p->chunk, seg_len - off);
    return seg_off + off;
}

/* Step k's pieces to their owners; step 0's ride behind the fingerprint. */
static td_status send_pieces(td_pg_t *pg, float *buf, const seg_plan *p, size_t k) {
    int W = pg->world, r = pg->rank;
    for (int i = 1; i < W; i++) {
        int j = (r + i) % W;
        size_t len, off = piece(p, j, k, &len);
        if (k == 0)
            TD_CHECK(send_fp(pg, j, buf + off, len * sizeof(float)));
        else
            SEND(j, buf + off, len * sizeof(float));
    }
    return TD_OK;
}

static td_status allreduce_large(td_pg_t *pg, float *buf, size_t count, td_reduce_op op) {
    int W = pg->world, r = pg->rank;
    seg_plan p = plan(pg, count);
    const float *srcs[64];
    if (W > 64) return td_error(TD_ERR_UNSUPPORTED, "allreduce on more than 64 ranks");
    TD_CHECK(send_pieces(pg, buf, &p, 0));
    TD_CHECK(recv_fps(pg));
    for (size_t k = 0; k < p.nsteps; k++) {
        size_t len, off = piece(&p, r, k, &len);
        size_t nb = len * sizeof(float);
        /* reduce my piece from everyone's copy, in place from the transports */
        for (int j = 0; j < W; j++) {
            if (j == r) {
                srcs[j] = buf + off;
                continue;
            }
            const void *ptr;
            TD_CHECK(pg->tp[j]->ops->recv_ptr(pg->tp[j], j, nb, &ptr));
            srcs[j] = ptr;
        }
        tree_reduce(pg, buf + off, srcs, W, len);
        for (int j = 0; j < W; j++)
            if (j != r) pg->tp[j]->ops->recv_done(pg->tp[j], j, nb);
        if (op == TD_REDUCE_AVG) divide(buf + off, len, W);
        for (int i = 1; i < W; i++) SEND((r + i) % W, buf + off, nb);
        /* next step's pieces go out before this step's results come in (pipelining) */
        if (k + 1 < p.nsteps) TD_CHECK(send_pieces(pg, buf, &p, k + 1));
        for (int i = 1; i < W; i++) {
            int j = (r + W - i) % W;
            size_t jl, jo = piece(&p, j, k, &jl);
            RECV_INTO(j, buf + jo, jl * sizeof(float));
        }
        step_done(pg);
    }
    return TD_OK;
}

td_status td_allreduce(td_pg_t *pg, float *buf, size_t count, td_reduce_op op) {
    if (op != TD_REDUCE_SUM && op != TD_REDUCE_AVG)
        return td_error(TD_ERR_INVALID, "allreduce: unknown reduce op %d", (int)op);
    td_status st;
    if (pg->world == 1 || count == 0)
        st = begin(pg, TD_COLL_ALLREDUCE, op, count, -1, 1);
    else if ((st = start(pg, TD_COLL_ALLREDUCE, op, count, -1, 1)) == TD_OK) {
        if (count * sizeof(float) <= SMALL_ALLREDUCE_BYTES)
            st = allreduce_small(pg, buf, count, op);
        else
            st = allreduce_large(pg, buf, count, op);
    }
    return finish(pg, st);
}

/* ---------------- broadcast, allgather, reduce_scatter, barrier ---------------- */

static td_status broadcast_body(td_pg_t *pg, uint8_t *buf, size_t nbytes, int root) {
    int W = pg->world, r = pg->rank;
    size_t step = pg->chunk_bytes;
    for (size_t off = 0; off < nbytes; off += step) {
        size_t len = TD_MIN(step, nbytes - off);
        if (r == root) {
            for (int i = 1; i < W; i++) SEND((root + i) % W, buf + off, len);
        } else {
            RECV_INTO(root, buf + off, len);
        }
        step_done(pg);
    }
    return TD_OK;
}

td_status td_broadcast(td_pg_t *pg, void *buf, size_t nbytes, int root) {
    if (root < 0 || root >= pg->world)
        return td_error(TD_ERR_INVALID,
                        "broadcast: root %d is not a rank of this group (world "
                        "size %d)",
                        root, pg->world);
    td_status st = begin(pg, TD_COLL_BROADCAST, 0, nbytes, root, 0);
    if (st == TD_OK && pg->world > 1) st = broadcast_body(pg, buf, nbytes, root);
    return finish(pg, st);
}

static td_status allgather_body(td_pg_t *pg, const uint8_t *in, uint8_t *out, size_t n) {
    int W = pg->world, r = pg->rank;
    size_t step = pg->chunk_bytes;
    for (size_t off = 0; off < n; off += step) {
        size_t len = TD_MIN(step, n - off);
        for (int i = 1; i < W; i++) SEND((r + i) % W, in + off, len);
        for (int i = 1; i < W; i++) {
            int j = (r + W - i) % W;
            RECV_INTO(j, out + (size_t)j * n + off, len);
        }
        step_done(pg);
    }
    return TD_OK;
}

td_status td_allgather(td_pg_t *pg, const void *in, void *out, size_t nbytes_per_rank) {
    td_status st = begin(pg, TD_COLL_ALLGATHER, 0, nbytes_per_rank, -1, 0);
    if (st == TD_OK && nbytes_per_rank) {
        uint8_t *mine = (uint8_t *)out + (size_t)pg->rank * nbytes_per_rank;
        if (mine != in) memmove(mine, in, nbytes_per_rank);
        if (pg->world > 1) st = allgather_body(pg, mine, out, nbytes_per_rank);
    }
    return finish(pg, st);
}

static td_status reduce_scatter_body(td_pg_t *pg, const float *in, float *out, size_t count,
                                     td_reduce_op op) {
    int W = pg->world, r = pg->rank;
    size_t step = pg->chunk_bytes / sizeof(float);
    const float *srcs[64];
    if (W > 64) return td_error(TD_ERR_UNSUPPORTED, "reduce_scatter on more than 64 ranks");
    for (size_t off = 0; off < count; off += step) {
        size_t len = TD_MIN(step, count - off), nb = len * sizeof(float);
        for (int i = 1; i < W; i++) {
            int j = (r + i) % W;
            SEND(j, in + (size_t)j * count + off, nb);
        }
        for (int j = 0; j < W; j++) {
            if (j == r) {
                srcs[j] = in + (size_t)r * count + off;
                continue;
            }
            const void *ptr;
            TD_CHECK(pg->tp[j]->ops->recv_ptr(pg->tp[j], j, nb, &ptr));
            srcs[j] = ptr;
        }
        tree_reduce(pg, out + off, srcs, W, len);
        for (int j = 0; j < W; j++)
            if (j != r) pg->tp[j]->ops->recv_done(pg->tp[j], j, nb);
        if (op == TD_REDUCE_AVG) divide(out + off, len, W);
        step_done(pg);
    }
    return TD_OK;
}

td_status td_reduce_scatter(td_pg_t *pg, const float *in, float *out, size_t count,
                            td_reduce_op op) {
    if (op != TD_REDUCE_SUM && op != TD_REDUCE_AVG)
        return td_error(TD_ERR_INVALID, "reduce_scatter: unknown reduce op %d", (int)op);
    td_status st = begin(pg, TD_COLL_REDUCE_SCATTER, op, count, -1, 1);
    if (st == TD_OK && count) st = reduce_scatter_body(pg, in, out, count, op);
    return finish(pg, st);
}

td_status td_barrier(td_pg_t *pg) {
    td_status st = begin(pg, TD_COLL_BARRIER, 0, 0, -1, 0);
    return finish(pg, st);
}
