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

/* ---------------- element kernels ----------------
 * combine(out, a, b, n): out[i] = a[i] (op) b[i] over n elements; out may be a or b (same index
 * only). One per (dtype, op); float32 sum is add2 above, the kernel the ddp layer's bits rest
 * on. */
typedef void (*combine_fn)(void *out, const void *a, const void *b, size_t n);

static void f32_sum(void *out, const void *a, const void *b, size_t n) {
    add2(out, a, b, n);
}

/* float16 and bfloat16 <-> float32, rounding to nearest even as PyTorch's c10::Half and
 * c10::BFloat16 do (NaN stays NaN). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (!man) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff)); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half (or zero), rounded to nearest even */
        float a;
        memcpy(&a, &ax, 4);
        float scaled = a * 16777216.0f; /* 2^24: the subnormal half's units, exact in float */
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1); /* nearest even at bit 13 */
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

#define OP_SUM(x, y)  ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y)  ((y) < (x) ? (y) : (x))
#define OP_MAX(x, y)  ((y) > (x) ? (y) : (x))

/* A kernel computing in T itself. */
#define KERNEL(name, T, OP)                                                                        \
    static void name(void *out, const void *a, const void *b, size_t n) {                          \
        T *o = out;                                                                                \
        const T *x = a, *y = b;                                                                    \
        for (size_t i = 0; i < n; i++) o[i] = OP(x[i], y[i]);                                      \
    }
/* Integer sums and products wrap around: computed in the unsigned type U of the same width
 * (signed overflow is undefined in C; the bits are those of two's complement). */
#define KERNEL_WRAP(name, T, U, OP)                                                                \
    static void name(void *out, const void *a, const void *b, size_t n) {                          \
        T *o = out;                                                                                \
        const T *x = a, *y = b;                                                                    \
        for (size_t i = 0; i < n; i++) o[i] = (T)OP((U)x[i], (U)y[i]);                             \
    }
/* A 16-bit float: each operation in float32, rounded back. */
#define KERNEL_HALF(name, TO, FROM, OP)                                                            \
    static void name(void *out, const void *a, const void *b, size_t n) {                          \
        uint16_t *o = out;                                                                         \
        const uint16_t *x = a, *y = b;                                                             \
        for (size_t i = 0; i < n; i++) o[i] = FROM(OP(TO(x[i]), TO(y[i])));                        \
    }

KERNEL(f32_prod, float, OP_PROD)
KERNEL(f32_min, float, OP_MIN)
KERNEL(f32_max, float, OP_MAX)
KERNEL(f64_sum, double, OP_SUM)
KERNEL(f64_prod, double, OP_PROD)
KERNEL(f64_min, double, OP_MIN)
KERNEL(f64_max, double, OP_MAX)
KERNEL_HALF(f16_sum, f16_to_f32, f32_to_f16, OP_SUM)
KERNEL_HALF(f16_prod, f16_to_f32, f32_to_f16, OP_PROD)
KERNEL_HALF(f16_min, f16_to_f32, f32_to_f16, OP_MIN)
KERNEL_HALF(f16_max, f16_to_f32, f32_to_f16, OP_MAX)
KERNEL_HALF(bf16_sum, bf16_to_f32, f32_to_bf16, OP_SUM)
KERNEL_HALF(bf16_prod, bf16_to_f32, f32_to_bf16, OP_PROD)
KERNEL_HALF(bf16_min, bf16_to_f32, f32_to_bf16, OP_MIN)
KERNEL_HALF(bf16_max, bf16_to_f32, f32_to_bf16, OP_MAX)
KERNEL_WRAP(i8_sum, int8_t, uint8_t, OP_SUM)
KERNEL_WRAP(i8_prod, int8_t, uint8_t, OP_PROD)
KERNEL(i8_min, int8_t, OP_MIN)
KERNEL(i8_max, int8_t, OP_MAX)
KERNEL_WRAP(u8_sum, uint8_t, uint8_t, OP_SUM)
KERNEL_WRAP(u8_prod, uint8_t, uint32_t, OP_PROD)
KERNEL(u8_min, uint8_t, OP_MIN)
KERNEL(u8_max, uint8_t, OP_MAX)
KERNEL_WRAP(i16_sum, int16_t, uint16_t, OP_SUM)
KERNEL_WRAP(i16_prod, int16_t, uint32_t, OP_PROD)
KERNEL(i16_min, int16_t, OP_MIN)
KERNEL(i16_max, int16_t, OP_MAX)
KERNEL_WRAP(i32_sum, int32_t, uint32_t, OP_SUM)
KERNEL_WRAP(i32_prod, int32_t, uint32_t, OP_PROD)
KERNEL(i32_min, int32_t, OP_MIN)
KERNEL(i32_max, int32_t, OP_MAX)
KERNEL_WRAP(i64_sum, int64_t, uint64_t, OP_SUM)
KERNEL_WRAP(i64_prod, int64_t, uint64_t, OP_PROD)
KERNEL(i64_min, int64_t, OP_MIN)
KERNEL(i64_max, int64_t, OP_MAX)

/* bool (one byte, 0 or 1): sum and max are "or", product and min are "and". */
static void bool_or(void *out, const void *a, const void *b, size_t n) {
    uint8_t *o = out;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++) o[i] = (uint8_t)((x[i] | y[i]) != 0);
}
static void bool_and(void *out, const void *a, const void *b, size_t n) {
    uint8_t *o = out;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++) o[i] = (uint8_t)((x[i] != 0) & (y[i] != 0));
}
static void bool_xor(void *out, const void *a, const void *b, size_t n) {
    uint8_t *o = out;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++) o[i] = (uint8_t)((x[i] != 0) ^ (y[i] != 0));
}

/* Bitwise ops see only bits: one kernel per width serves signed and unsigned alike. */
#define OP_BAND(x, y) ((x) & (y))
#define OP_BOR(x, y)  ((x) | (y))
#define OP_BXOR(x, y) ((x) ^ (y))
KERNEL(b8_and, uint8_t, OP_BAND)
KERNEL(b8_or, uint8_t, OP_BOR)
KERNEL(b8_xor, uint8_t, OP_BXOR)
KERNEL(b16_and, uint16_t, OP_BAND)
KERNEL(b16_or, uint16_t, OP_BOR)
KERNEL(b16_xor, uint16_t, OP_BXOR)
KERNEL(b32_and, uint32_t, OP_BAND)
KERNEL(b32_or, uint32_t, OP_BOR)
KERNEL(b32_xor, uint32_t, OP_BXOR)
KERNEL(b64_and, uint64_t, OP_BAND)
KERNEL(b64_or, uint64_t, OP_BOR)
KERNEL(b64_xor, uint64_t, OP_BXOR)

/* The kernel of (dtype, op); AVG combines as SUM and divides afterwards. NULL: not supported. */
static combine_fn kernel_of(td_elem_type dt, td_reduce_op op) {
    static const combine_fn table[TD_ELEM_COUNT][7] = {
        /* sum, product, min, max, band, bor, bxor */
        [TD_ELEM_F32] = {f32_sum, f32_prod, f32_min, f32_max, NULL, NULL, NULL},
        [TD_ELEM_F64] = {f64_sum, f64_prod, f64_min, f64_max, NULL, NULL, NULL},
        [TD_ELEM_F16] = {f16_sum, f16_prod, f16_min, f16_max, NULL, NULL, NULL},
        [TD_ELEM_BF16] = {bf16_sum, bf16_prod, bf16_min, bf16_max, NULL, NULL, NULL},
        [TD_ELEM_I8] = {i8_sum, i8_prod, i8_min, i8_max, b8_and, b8_or, b8_xor},
        [TD_ELEM_U8] = {u8_sum, u8_prod, u8_min, u8_max, b8_and, b8_or, b8_xor},
        [TD_ELEM_I16] = {i16_sum, i16_prod, i16_min, i16_max, b16_and, b16_or, b16_xor},
        [TD_ELEM_I32] = {i32_sum, i32_prod, i32_min, i32_max, b32_and, b32_or, b32_xor},
        [TD_ELEM_I64] = {i64_sum, i64_prod, i64_min, i64_max, b64_and, b64_or, b64_xor},
        [TD_ELEM_BOOL] = {bool_or, bool_and, bool_and, bool_or, bool_and, bool_or, bool_xor},
    };
    if ((unsigned)dt >= TD_ELEM_COUNT) return NULL;
    switch (op) {
    case TD_REDUCE_SUM:
    case TD_REDUCE_AVG: /* a mean of integers is not an integer: refused by check_reduction */
        return table[dt][0];
    case TD_REDUCE_PRODUCT:
        return table[dt][1];
    case TD_REDUCE_MIN:
        return table[dt][2];
    case TD_REDUCE_MAX:
        return table[dt][3];
    case TD_REDUCE_BAND:
        return table[dt][4];
    case TD_REDUCE_BOR:
        return table[dt][5];
    case TD_REDUCE_BXOR:
        return table[dt][6];
    }
    return NULL;
}

static bool is_floating(td_elem_type dt) {
    return dt == TD_ELEM_F32 || dt == TD_ELEM_F64 || dt == TD_ELEM_F16 || dt == TD_ELEM_BF16;
}

/* AVG's last step: x[i] / world_size, in the element's own type (16-bit floats via float32). */
static void divide(void *buf, size_t n, int w, td_elem_type dt) {
    switch (dt) {
    case TD_ELEM_F32: {
        float *x = buf;
        const float d = (float)w;
        for (size_t i = 0; i < n; i++) x[i] = x[i] / d;
        break;
    }
    case TD_ELEM_F64: {
        double *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = x[i] / (double)w;
        break;
    }
    case TD_ELEM_F16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = f32_to_f16(f16_to_f32(x[i]) / (float)w);
        break;
    }
    case TD_ELEM_BF16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(bf16_to_f32(x[i]) / (float)w);
        break;
    }
    default:
        break;
    }
}

/* What a reduction computes with: its kernel and element size. */
typedef struct {
    td_elem_type dtype;
    td_reduce_op op;
    combine_fn combine;
    size_t esize;
} reduction;

static td_status check_reduction(const char *what, td_elem_type dt, td_reduce_op op,
                                 reduction *out) {
    if ((unsigned)op > TD_REDUCE_BXOR)
        return td_error(TD_ERR_INVALID, "%s: unknown reduce op %d", what, (int)op);
    if (dt == TD_ELEM_BYTES || (unsigned)dt >= TD_ELEM_COUNT)
        return td_error(TD_ERR_UNSUPPORTED,
                        "%s(op=%s): dtype %d is not a type tandem can reduce (float32, float64, "
                        "float16, bfloat16, int8, uint8, int16, int32, int64, bool)",
                        what, td_reduce_op_name(op), (int)dt);
    if (op == TD_REDUCE_AVG && !is_floating(dt))
        return td_error(TD_ERR_UNSUPPORTED,
                        "%s(op=avg, dtype=%s): the mean of integers is not an integer; use "
                        "op=sum and divide, or a floating dtype",
                        what, td_elem_name(dt));
    out->combine = kernel_of(dt, op);
    if (!out->combine)
        return td_error(TD_ERR_UNSUPPORTED,
                        "%s(op=%s, dtype=%s): bitwise ops take integers and bool only", what,
                        td_reduce_op_name(op), td_elem_name(dt));
    out->dtype = dt;
    out->op = op;
    out->esize = td_elem_size(dt);
    return TD_OK;
}

/* out = the tree reduction of src[0..W) over n elements; out may alias one of the sources. */
static void tree_reduce(td_pg_t *pg, const reduction *rd, void *out, const void **src, int W,
                        size_t n) {
    size_t es = rd->esize;
    if (W == 1) {
        if (out != src[0]) memmove(out, src[0], n * es);
        return;
    }
    if (W == 2) {
        rd->combine(out, src[0], src[1], n);
        return;
    }
    const size_t tile = TILE_FLOATS * sizeof(float) / es; /* elements per tile */
    size_t need = (size_t)(W / 2) * TILE_FLOATS;
    if (pg->scratch_floats < need) {
        free(pg->scratch);
        pg->scratch = td_xmalloc_aligned(need * sizeof(float));
        pg->scratch_floats = need;
    }
    const uint8_t *nodes[64];
    const uint8_t **nd = W <= 64 ? nodes : td_xmalloc((size_t)W * sizeof(*nd));
    uint8_t *scratch = (uint8_t *)pg->scratch;
    for (size_t off = 0; off < n; off += tile) {
        size_t len = TD_MIN(tile, n - off);
        for (int j = 0; j < W; j++) nd[j] = (const uint8_t *)src[j] + off * es;
        /* Writing tmp[i] at a level is safe: a node still needed sits at index > i. */
        for (int m = W; m > 1; m = (m + 1) / 2) {
            for (int i = 0; i < m / 2; i++) {
                uint8_t *dst = m == 2 ? (uint8_t *)out + off * es
                                      : scratch + (size_t)i * TILE_FLOATS * sizeof(float);
                rd->combine(dst, nd[2 * i], nd[2 * i + 1], len);
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

static td_status allreduce_small(td_pg_t *pg, const reduction *rd, void *buf, size_t count) {
    int W = pg->world, r = pg->rank;
    size_t nb = count * rd->esize;
    const void *srcs[64];
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
    tree_reduce(pg, rd, buf, srcs, W, count);
    for (int j = 0; j < W; j++)
        if (j != r) pg->tp[j]->ops->recv_done(pg->tp[j], j, nb);
    if (rd->op == TD_REDUCE_AVG) divide(buf, count, W, rd->dtype);
    return TD_OK;
}

typedef struct {
    size_t base;  /* elements per segment (last ones may be shorter or empty) */
    size_t chunk; /* elements per pipelined step */
    size_t nsteps;
    size_t count;
    size_t esize; /* bytes per element */
} seg_plan;

static seg_plan plan(const td_pg_t *pg, size_t count, size_t esize) {
    seg_plan p;
    size_t align = 64 / esize; /* segments start on 64-byte boundaries */
    p.count = count;
    p.esize = esize;
    p.base = (count + (size_t)pg->world - 1) / (size_t)pg->world;
    p.base = (p.base + align - 1) & ~(align - 1);
    p.chunk = pg->chunk_bytes / esize;
    p.nsteps = (p.base + p.chunk - 1) / p.chunk;
    return p;
}

/* Offset and length (elements) of segment j's step k. */
static size_t piece(const seg_plan *p, int j, size_t k, size_t *len) {
    size_t seg_off = (size_t)j * p->base;
    size_t seg_len = seg_off >= p->count ? 0 : TD_MIN(p->base, p->count - seg_off);
    size_t off = k * p->chunk;
    *len = off >= seg_len ? 0 : TD_MIN(p->chunk, seg_len - off);
    return seg_off + off;
}

/* Step k's pieces to their owners; step 0's ride behind the fingerprint. */
static td_status send_pieces(td_pg_t *pg, uint8_t *buf, const seg_plan *p, size_t k) {
    int W = pg->world, r = pg->rank;
    for (int i = 1; i < W; i++) {
        int j = (r + i) % W;
        size_t len, off = piece(p, j, k, &len);
        if (k == 0)
            TD_CHECK(send_fp(pg, j, buf + off * p->esize, len * p->esize));
        else
            SEND(j, buf + off * p->esize, len * p->esize);
    }
    return TD_OK;
}

static td_status allreduce_large(td_pg_t *pg, const reduction *rd, void *vbuf, size_t count) {
    int W = pg->world, r = pg->rank;
    uint8_t *buf = vbuf;
    size_t es = rd->esize;
    seg_plan p = plan(pg, count, es);
    const void *srcs[64];
    if (W > 64) return td_error(TD_ERR_UNSUPPORTED, "allreduce on more than 64 ranks");
    TD_CHECK(send_pieces(pg, buf, &p, 0));
    TD_CHECK(recv_fps(pg));
    for (size_t k = 0; k < p.nsteps; k++) {
        size_t len, off = piece(&p, r, k, &len);
        size_t nb = len * es;
        uint8_t *mine = buf + off * es;
        /* reduce my piece from everyone's copy, in place from the transports */
        for (int j = 0; j < W; j++) {
            if (j == r) {
                srcs[j] = mine;
                continue;
            }
            const void *ptr;
            TD_CHECK(pg->tp[j]->ops->recv_ptr(pg->tp[j], j, nb, &ptr));
            srcs[j] = ptr;
        }
        tree_reduce(pg, rd, mine, srcs, W, len);
        for (int j = 0; j < W; j++)
            if (j != r) pg->tp[j]->ops->recv_done(pg->tp[j], j, nb);
        if (rd->op == TD_REDUCE_AVG) divide(mine, len, W, rd->dtype);
        for (int i = 1; i < W; i++) SEND((r + i) % W, mine, nb);
        /* next step's pieces go out before this step's results come in (pipelining) */
        if (k + 1 < p.nsteps) TD_CHECK(send_pieces(pg, buf, &p, k + 1));
        for (int i = 1; i < W; i++) {
            int j = (r + W - i) % W;
            size_t jl, jo = piece(&p, j, k, &jl);
            RECV_INTO(j, buf + jo * es, jl * es);
        }
        step_done(pg);
    }
    return TD_OK;
}

static td_status allreduce_run(td_pg_t *pg, td_coll_kind kind, int root, void *buf, size_t count,
                               td_elem_type dtype, td_reduce_op op) {
    reduction rd;
    td_status st = check_reduction(kind == TD_COLL_REDUCE ? "reduce" : "allreduce", dtype, op, &rd);
    if (st != TD_OK) return st; /* a bad argument: the group stays usable */
    if (pg->world == 1 || count == 0)
        st = begin(pg, kind, op, count, root, dtype);
    else if ((st = start(pg, kind, op, count, root, dtype)) == TD_OK) {
        if (count * rd.esize <= SMALL_ALLREDUCE_BYTES)
            st = allreduce_small(pg, &rd, buf, count);
        else
            st = allreduce_large(pg, &rd, buf, count);
    }
    return finish(pg, st);
}

td_status td_allreduce_typed(td_pg_t *pg, void *buf, size_t count, td_elem_type dtype,
                             td_reduce_op op) {
    return allreduce_run(pg, TD_COLL_ALLREDUCE, -1, buf, count, dtype, op);
}

td_status td_allreduce(td_pg_t *pg, float *buf, size_t count, td_reduce_op op) {
    return td_allreduce_typed(pg, buf, count, TD_ELEM_F32, op);
}

/* Every rank computes the reduction (it costs what an allreduce costs on these transports: each
 * rank reduces one segment either way); ranks other than root keep their input. */
td_status td_reduce(td_pg_t *pg, void *buf, size_t count, td_elem_type dtype, td_reduce_op op,
                    int root) {
    if (root < 0 || root >= pg->world)
        return td_error(TD_ERR_INVALID,
                        "reduce: root %d is not a rank of this group (world size %d)", root,
                        pg->world);
    if (pg->rank == root) return allreduce_run(pg, TD_COLL_REDUCE, root, buf, count, dtype, op);
    size_t nb = count * td_elem_size(dtype);
    void *tmp = td_xmalloc_aligned(nb ? nb : 1);
    memcpy(tmp, buf, nb);
    td_status st = allreduce_run(pg, TD_COLL_REDUCE, root, tmp, count, dtype, op);
    free(tmp);
    return st;
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

static td_status reduce_scatter_body(td_pg_t *pg, const reduction *rd, const uint8_t *in,
                                     uint8_t *out, size_t count) {
    int W = pg->world, r = pg->rank;
    size_t es = rd->esize, step = pg->chunk_bytes / es;
    const void *srcs[64];
    if (W > 64) return td_error(TD_ERR_UNSUPPORTED, "reduce_scatter on more than 64 ranks");
    for (size_t off = 0; off < count; off += step) {
        size_t len = TD_MIN(step, count - off), nb = len * es;
        for (int i = 1; i < W; i++) {
            int j = (r + i) % W;
            SEND(j, in + ((size_t)j * count + off) * es, nb);
        }
        for (int j = 0; j < W; j++) {
            if (j == r) {
                srcs[j] = in + ((size_t)r * count + off) * es;
                continue;
            }
            const void *ptr;
            TD_CHECK(pg->tp[j]->ops->recv_ptr(pg->tp[j], j, nb, &ptr));
            srcs[j] = ptr;
        }
        tree_reduce(pg, rd, out + off * es, srcs, W, len);
        for (int j = 0; j < W; j++)
            if (j != r) pg->tp[j]->ops->recv_done(pg->tp[j], j, nb);
        if (rd->op == TD_REDUCE_AVG) divide(out + off * es, len, W, rd->dtype);
        step_done(pg);
    }
    return TD_OK;
}

td_status td_reduce_scatter_typed(td_pg_t *pg, const void *in, void *out, size_t count,
                                  td_elem_type dtype, td_reduce_op op) {
    reduction rd;
    TD_CHECK(check_reduction("reduce_scatter", dtype, op, &rd));
    td_status st = begin(pg, TD_COLL_REDUCE_SCATTER, op, count, -1, dtype);
    if (st == TD_OK && count) st = reduce_scatter_body(pg, &rd, in, out, count);
    return finish(pg, st);
}

td_status td_reduce_scatter(td_pg_t *pg, const float *in, float *out, size_t count,
                            td_reduce_op op) {
    return td_reduce_scatter_typed(pg, in, out, count, TD_ELEM_F32, op);
}

td_status td_barrier(td_pg_t *pg) {
    td_status st = begin(pg, TD_COLL_BARRIER, 0, 0, -1, 0);
    return finish(pg, st);
}

/* ---------------- gather, scatter, alltoall ----------------
 * Rooted data moves straight between root and each peer, in chunks, after the fingerprint
 * exchange; a sender blocks only until its transport holds a chunk, so nothing waits in a cycle. */

static td_status check_root(const td_pg_t *pg, const char *what, int root) {
    if (root < 0 || root >= pg->world)
        return td_error(TD_ERR_INVALID, "%s: root %d is not a rank of this group (world size %d)",
                        what, root, pg->world);
    return TD_OK;
}

static td_status gather_body(td_pg_t *pg, const uint8_t *in, uint8_t *out, size_t n, int root) {
    int W = pg->world, r = pg->rank;
    size_t step = pg->chunk_bytes;
    for (size_t off = 0; off < n; off += step) {
        size_t len = TD_MIN(step, n - off);
        if (r != root) {
            SEND(root, in + off, len);
        } else {
            for (int i = 1; i < W; i++) {
                int j = (root + i) % W;
                RECV_INTO(j, out + (size_t)j * n + off, len);
            }
        }
        step_done(pg);
    }
    return TD_OK;
}

td_status td_gather(td_pg_t *pg, const void *in, void *out, size_t nbytes_per_rank, int root) {
    TD_CHECK(check_root(pg, "gather", root));
    if (pg->rank == root && !out && nbytes_per_rank)
        return td_error(TD_ERR_INVALID, "gather: root %d has no output buffer", root);
    td_status st = begin(pg, TD_COLL_GATHER, 0, nbytes_per_rank, root, 0);
    if (st == TD_OK && nbytes_per_rank) {
        if (pg->rank == root) {
            uint8_t *mine = (uint8_t *)out + (size_t)root * nbytes_per_rank;
            if (mine != in) memmove(mine, in, nbytes_per_rank);
        }
        if (pg->world > 1) st = gather_body(pg, in, out, nbytes_per_rank, root);
    }
    return finish(pg, st);
}

static td_status scatter_body(td_pg_t *pg, const uint8_t *in, uint8_t *out, size_t n, int root) {
    int W = pg->world, r = pg->rank;
    size_t step = pg->chunk_bytes;
    for (size_t off = 0; off < n; off += step) {
        size_t len = TD_MIN(step, n - off);
        if (r == root) {
            for (int i = 1; i < W; i++) {
                int j = (root + i) % W;
                SEND(j, in + (size_t)j * n + off, len);
            }
        } else {
            RECV_INTO(root, out + off, len);
        }
        step_done(pg);
    }
    return TD_OK;
}

td_status td_scatter(td_pg_t *pg, const void *in, void *out, size_t nbytes_per_rank, int root) {
    TD_CHECK(check_root(pg, "scatter", root));
    if (pg->rank == root && !in && nbytes_per_rank)
        return td_error(TD_ERR_INVALID, "scatter: root %d has no input buffer", root);
    td_status st = begin(pg, TD_COLL_SCATTER, 0, nbytes_per_rank, root, 0);
    if (st == TD_OK && nbytes_per_rank) {
        if (pg->rank == root) {
            const uint8_t *mine = (const uint8_t *)in + (size_t)root * nbytes_per_rank;
            if (mine != out) memmove(out, mine, nbytes_per_rank);
        }
        if (pg->world > 1) st = scatter_body(pg, in, out, nbytes_per_rank, root);
    }
    return finish(pg, st);
}

/* Each pair's sizes ride behind the fingerprints; the receiver checks them before any data. */
static td_status alltoall_sizes(td_pg_t *pg, const size_t *send_nbytes, const size_t *recv_nbytes) {
    int W = pg->world, r = pg->rank;
    for (int k = 1; k < W; k++) {
        int j = (r + k) % W;
        uint64_t n = send_nbytes[j];
        TD_CHECK(send_fp(pg, j, &n, sizeof(n)));
    }
    TD_CHECK(recv_fps(pg));
    for (int k = 1; k < W; k++) {
        int j = (r + W - k) % W;
        uint64_t n;
        RECV_INTO(j, &n, sizeof(n));
        if (n != recv_nbytes[j])
            return td_error(TD_ERR_MISMATCH,
                            "alltoall at seq %llu: rank %d sends %llu bytes to rank %d, but rank "
                            "%d expects %llu bytes from rank %d (the split sizes disagree)",
                            (unsigned long long)pg->cur.seq, j, (unsigned long long)n, r, r,
                            (unsigned long long)recv_nbytes[j], j);
    }
    return TD_OK;
}

td_status td_alltoallv(td_pg_t *pg, const void *in, const size_t *send_nbytes,
                       const size_t *send_offsets, void *out, const size_t *recv_nbytes,
                       const size_t *recv_offsets) {
    int W = pg->world, r = pg->rank;
    if (send_nbytes[r] != recv_nbytes[r])
        return td_error(TD_ERR_INVALID,
                        "alltoall: rank %d sends itself %zu bytes but expects %zu from itself",
                        r, send_nbytes[r], recv_nbytes[r]);
    td_status st = start(pg, TD_COLL_ALLTOALL, 0, 0, -1, 0);
    if (st == TD_OK && W > 1) st = alltoall_sizes(pg, send_nbytes, recv_nbytes);
    if (st == TD_OK && send_nbytes[r])
        memmove((uint8_t *)out + recv_offsets[r], (const uint8_t *)in + send_offsets[r],
                send_nbytes[r]);
    size_t most = 0, step = pg->chunk_bytes;
    for (int j = 0; j < W; j++)
        if (j != r) most = TD_MAX(most, TD_MAX(send_nbytes[j], recv_nbytes[j]));
    /* Step by step as allgather: this step's chunk to every peer, then every peer's chunk in. */
    for (size_t off = 0; st == TD_OK && off < most; off += step) {
        for (int i = 1; i < W && st == TD_OK; i++) {
            int j = (r + i) % W;
            if (off >= send_nbytes[j]) continue;
            size_t len = TD_MIN(step, send_nbytes[j] - off);
            st = pg->tp[j]->ops->send(pg->tp[j], j, (const uint8_t *)in + send_offsets[j] + off,
                                      len);
        }
        for (int i = 1; i < W && st == TD_OK; i++) {
            int j = (r + W - i) % W;
            if (off >= recv_nbytes[j]) continue;
            size_t len = TD_MIN(step, recv_nbytes[j] - off);
            st = pg->tp[j]->ops->recv_into(pg->tp[j], j, (uint8_t *)out + recv_offsets[j] + off,
                                           len);
        }
        if (st == TD_OK) step_done(pg);
    }
    return finish(pg, st);
}

/* ---------------- point to point ----------------
 * A message is a header (a fingerprint of kind SEND whose seq counts this pair's messages, count
 * = bytes, root = tag) and the data in chunks. The group's collective sequence is untouched:
 * ranks that take no part need not know. */

static td_status p2p_start(td_pg_t *pg, const char *what, int peer) {
    if (pg->broken)
        return td_error(pg->broken,
                        "rank %d: the process group failed earlier and cannot be used again "
                        "(make a new group): %s",
                        pg->rank, pg->broken_msg);
    if (peer < 0 || peer >= pg->world || peer == pg->rank)
        return td_error(TD_ERR_INVALID, "%s: peer %d is not another rank of this group "
                                        "(rank %d, world size %d)",
                        what, peer, pg->rank, pg->world);
    pg->deadline_ns = td_now_ns() + (uint64_t)pg->timeout_ms * 1000000ull;
    for (int j = 0; j < pg->world; j++) pg->arrived[j] = j != peer;
    atomic_store_explicit(&pg->act.kind, (uint32_t)TD_COLL_SEND, memory_order_relaxed);
    atomic_store_explicit(&pg->act.steps, 0, memory_order_relaxed);
    return TD_OK;
}

td_status td_send(td_pg_t *pg, int peer, const void *buf, size_t nbytes, int tag) {
    TD_CHECK(p2p_start(pg, "send", peer));
    td_fingerprint fp = {.magic = TD_FP_MAGIC,
                         .kind = TD_COLL_SEND,
                         .seq = pg->p2p_sent[peer]++,
                         .count = nbytes,
                         .root = tag};
    pg->cur = fp;
    td_transport *t = pg->tp[peer];
    size_t first = TD_MIN(nbytes, pg->chunk_bytes);
    td_status st = t->ops->send2(t, peer, &fp, sizeof(fp), buf, first);
    for (size_t off = first; st == TD_OK && off < nbytes; off += pg->chunk_bytes) {
        st = t->ops->send(t, peer, (const uint8_t *)buf + off,
                          TD_MIN(pg->chunk_bytes, nbytes - off));
        step_done(pg);
    }
    if (st != TD_OK && st != pg->broken) fail(pg, st);
    return st;
}

td_status td_recv(td_pg_t *pg, int peer, void *buf, size_t nbytes, int tag) {
    TD_CHECK(p2p_start(pg, "recv", peer));
    td_fingerprint want = {.magic = TD_FP_MAGIC,
                           .kind = TD_COLL_SEND,
                           .seq = pg->p2p_recvd[peer]++,
                           .count = nbytes,
                           .root = tag};
    pg->cur = want;
    td_transport *t = pg->tp[peer];
    td_fingerprint got;
    td_status st = t->ops->recv_into(t, peer, &got, sizeof(got));
    if (st == TD_OK && !fp_equal(&want, &got))
        st = td_error(TD_ERR_MISMATCH,
                      "rank %d sent message #%llu to rank %d as %s(nbytes=%llu, tag=%d) but rank "
                      "%d called recv(nbytes=%llu, tag=%d) for it",
                      peer, (unsigned long long)want.seq, pg->rank,
                      got.kind == TD_COLL_SEND ? "send" : td__coll_name(got.kind),
                      (unsigned long long)got.count, got.root, pg->rank,
                      (unsigned long long)nbytes, tag);
    for (size_t off = 0; st == TD_OK && off < nbytes; off += pg->chunk_bytes) {
        st = t->ops->recv_into(t, peer, (uint8_t *)buf + off,
                               TD_MIN(pg->chunk_bytes, nbytes - off));
        step_done(pg);
    }
    if (st != TD_OK && st != pg->broken) fail(pg, st);
    return st;
}

/* ---------------- names ---------------- */

size_t td_elem_size(td_elem_type dtype) {
    switch (dtype) {
    case TD_ELEM_F64:
    case TD_ELEM_I64:
        return 8;
    case TD_ELEM_F32:
    case TD_ELEM_I32:
        return 4;
    case TD_ELEM_F16:
    case TD_ELEM_BF16:
    case TD_ELEM_I16:
        return 2;
    default:
        return 1;
    }
}

const char *td_elem_name(td_elem_type dtype) {
    static const char *const names[TD_ELEM_COUNT] = {
        "bytes", "float32", "float64", "float16", "bfloat16", "int8",
        "uint8", "int16",   "int32",   "int64",   "bool"};
    return (unsigned)dtype < TD_ELEM_COUNT ? names[dtype] : "?";
}

const char *td_reduce_op_name(td_reduce_op op) {
    static const char *const names[] = {"sum",     "avg",  "min", "max",
                                        "product", "band", "bor", "bxor"};
    return (unsigned)op < TD_ARRAY_LEN(names) ? names[op] : "?";
}
