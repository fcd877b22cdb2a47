/* comm: the collectives PyTorch's backend needs beyond float32 sums (docs/torch.md), over shm and
 * tcp at 2, 3 and 4 ranks as forked processes around a store in the parent:
 *  - td_allreduce_typed / td_reduce / td_reduce_scatter_typed for the integer types, float64 and
 *    bool with every op they take, bit for bit against a reference computed here (integers wrap
 *    like two's complement; float64 sums in the same fixed tree as float32's); float32 through
 *    td_allreduce_typed gives td_allreduce's bits;
 *  - td_gather, td_scatter, td_alltoallv (uneven sizes, some empty), td_send/td_recv (a short
 *    and a chunked message, in a ring) moving byte patterns unchanged;
 *  - refusals and mismatches: AVG of an integer and BAND of a float are refused before anything
 *    is sent (the group still works); alltoall sizes that disagree and a recv whose tag is not
 *    the sender's fail with TD_ERR_MISMATCH naming both sides. */
#include "test.h"

#include <sys/wait.h>
#include <unistd.h>

#include "tandem/comm.h"

static int g_port;
static int g_seq;
static const char *TOKEN = "typed-token";

static uint64_t mix(uint64_t x) { /* splitmix64: inputs any rank can recompute */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint8_t byte_of(int rank, size_t i, uint64_t seed) {
    return (uint8_t)mix(seed * 1000003u + (uint64_t)rank * 7919u + i);
}

/* element i of rank r's input, as raw little-endian bits of the type's width */
static void fill(void *buf, td_elem_type dt, size_t n, int r, uint64_t seed, bool small) {
    for (size_t i = 0; i < n; i++) {
        uint64_t v = mix(seed * 31 + (uint64_t)r * 1000000007u + i);
        switch (dt) {
        case TD_ELEM_I8:
        case TD_ELEM_U8:
            ((uint8_t *)buf)[i] = (uint8_t)(small ? v % 5 : v);
            break;
        case TD_ELEM_BOOL:
            ((uint8_t *)buf)[i] = (uint8_t)(v & 1);
            break;
        case TD_ELEM_I16:
            ((int16_t *)buf)[i] = (int16_t)(small ? (int16_t)(v % 7) - 3 : (int16_t)v);
            break;
        case TD_ELEM_I32:
            ((int32_t *)buf)[i] = small ? (int32_t)(v % 7) - 3 : (int32_t)v;
            break;
        case TD_ELEM_I64:
            ((int64_t *)buf)[i] = small ? (int64_t)(v % 7) - 3 : (int64_t)v;
            break;
        case TD_ELEM_F64:
            ((double *)buf)[i] = ldexp((double)(int64_t)(v >> 11) / 4503599627370496.0,
                                       (int)(v % 33) - 16);
            break;
        case TD_ELEM_F32:
            ((float *)buf)[i] = ldexpf((float)(int32_t)(v >> 40) / 8388608.0f, (int)(v % 33) - 16);
            break;
        default:
            TEST_FAIL("fill: dtype %d", (int)dt);
        }
    }
}

/* The reference: element i reduced over W ranks in the fixed tree ((0,1),(2,3)),... level by
 * level, an odd node carried up; integers in 64-bit two's complement, then truncated. */
static uint64_t ref_int(td_elem_type dt, td_reduce_op op, const uint64_t *v, int W) {
    uint64_t a[8];
    memcpy(a, v, (size_t)W * sizeof(uint64_t));
    for (int m = W; m > 1;) {
        int k = 0;
        for (int i = 0; i + 1 < m; i += 2) {
            uint64_t x = a[i], y = a[i + 1], r = 0;
            int64_t sx = (int64_t)x, sy = (int64_t)y;
            bool is_unsigned = dt == TD_ELEM_U8 || dt == TD_ELEM_BOOL;
            switch (op) {
            case TD_REDUCE_SUM:
                r = dt == TD_ELEM_BOOL ? (x | y) : x + y;
                break;
            case TD_REDUCE_PRODUCT:
                r = dt == TD_ELEM_BOOL ? (x & y) : x * y;
                break;
            case TD_REDUCE_MIN:
                r = is_unsigned ? (x < y ? x : y) : (uint64_t)(sx < sy ? sx : sy);
                break;
            case TD_REDUCE_MAX:
                r = is_unsigned ? (x > y ? x : y) : (uint64_t)(sx > sy ? sx : sy);
                break;
            case TD_REDUCE_BAND:
                r = x & y;
                break;
            case TD_REDUCE_BOR:
                r = x | y;
                break;
            case TD_REDUCE_BXOR:
                r = x ^ y;
                break;
            default:
                TEST_FAIL("ref_int: op %d", (int)op);
            }
            /* truncate to the width and sign-extend again, as the type holds it */
            switch (dt) {
            case TD_ELEM_I8:
                r = (uint64_t)(int64_t)(int8_t)r;
                break;
            case TD_ELEM_U8:
            case TD_ELEM_BOOL:
                r = (uint8_t)r;
                break;
            case TD_ELEM_I16:
                r = (uint64_t)(int64_t)(int16_t)r;
                break;
            case TD_ELEM_I32:
                r = (uint64_t)(int64_t)(int32_t)r;
                break;
            default:
                break;
            }
            a[k++] = r;
        }
        if (m & 1) a[k++] = a[m - 1];
        m = k;
    }
    return a[0];
}

static uint64_t load_int(const void *buf, td_elem_type dt, size_t i) {
    switch (dt) {
    case TD_ELEM_I8:
        return (uint64_t)(int64_t)((const int8_t *)buf)[i];
    case TD_ELEM_U8:
    case TD_ELEM_BOOL:
        return ((const uint8_t *)buf)[i];
    case TD_ELEM_I16:
        return (uint64_t)(int64_t)((const int16_t *)buf)[i];
    case TD_ELEM_I32:
        return (uint64_t)(int64_t)((const int32_t *)buf)[i];
    default:
        return (uint64_t)((const int64_t *)buf)[i];
    }
}

static double ref_f64(td_reduce_op op, const double *v, int W) {
    double a[8];
    memcpy(a, v, (size_t)W * sizeof(double));
    for (int m = W; m > 1;) {
        int k = 0;
        for (int i = 0; i + 1 < m; i += 2) {
            double x = a[i], y = a[i + 1];
            a[k++] = op == TD_REDUCE_SUM || op == TD_REDUCE_AVG ? x + y
                     : op == TD_REDUCE_PRODUCT                  ? x * y
                     : op == TD_REDUCE_MIN                      ? (y < x ? y : x)
                                                                : (y > x ? y : x);
        }
        if (m & 1) a[k++] = a[m - 1];
        m = k;
    }
    return op == TD_REDUCE_AVG ? a[0] / W : a[0];
}

/* Reduces n elements of dt with op over the group, checks every element against the reference. */
static void check_reduction(td_pg_t *pg, td_elem_type dt, td_reduce_op op, size_t n,
                            uint64_t seed, int root) {
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    size_t es = td_elem_size(dt);
    bool small = op == TD_REDUCE_PRODUCT;
    uint8_t *in[8], *buf = malloc(n * es + 1);
    for (int j = 0; j < W; j++) {
        in[j] = malloc(n * es + 1);
        fill(in[j], dt, n, j, seed, small);
    }
    memcpy(buf, in[r], n * es);
    if (root >= 0)
        ASSERT_OK(td_reduce(pg, buf, n, dt, op, root));
    else
        ASSERT_OK(td_allreduce_typed(pg, buf, n, dt, op));
    for (size_t i = 0; i < n; i++) {
        if (root >= 0 && r != root) { /* left as it was */
            if (memcmp(buf + i * es, in[r] + i * es, es))
                TEST_FAIL("reduce(%s, %s, root %d): rank %d's input changed at %zu",
                          td_elem_name(dt), td_reduce_op_name(op), root, r, i);
            continue;
        }
        if (dt == TD_ELEM_F64 || dt == TD_ELEM_F32) {
            double v[8], got, want;
            for (int j = 0; j < W; j++)
                v[j] = dt == TD_ELEM_F64 ? ((double *)in[j])[i] : ((float *)in[j])[i];
            if (dt == TD_ELEM_F64) {
                want = ref_f64(op, v, W);
                got = ((double *)buf)[i];
            } else { /* min/max only: exact in any width */
                want = ref_f64(op, v, W);
                got = ((float *)buf)[i];
            }
            if (memcmp(&got, &want, sizeof(double)))
                TEST_FAIL("%s(%s, op=%s, n=%zu) world %d rank %d element %zu: got %.17g, "
                          "want %.17g",
                          root >= 0 ? "reduce" : "allreduce", td_elem_name(dt),
                          td_reduce_op_name(op), n, W, r, i, got, want);
        } else {
            uint64_t v[8];
            for (int j = 0; j < W; j++) v[j] = load_int(in[j], dt, i);
            uint64_t want = ref_int(dt, op, v, W), got = load_int(buf, dt, i);
            if (got != want)
                TEST_FAIL("%s(%s, op=%s, n=%zu) world %d rank %d element %zu: got %lld, want %lld",
                          root >= 0 ? "reduce" : "allreduce", td_elem_name(dt),
                          td_reduce_op_name(op), n, W, r, i, (long long)got, (long long)want);
        }
    }
    for (int j = 0; j < W; j++) free(in[j]);
    free(buf);
}

static void check_reduce_scatter_i64(td_pg_t *pg, size_t n) {
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    int64_t *in[8], *out = malloc(n * 8 + 8);
    for (int j = 0; j < W; j++) {
        in[j] = malloc((size_t)W * n * 8);
        fill(in[j], TD_ELEM_I64, (size_t)W * n, j, 77, false);
    }
    ASSERT_OK(td_reduce_scatter_typed(pg, in[r], out, n, TD_ELEM_I64, TD_REDUCE_SUM));
    for (size_t i = 0; i < n; i++) {
        uint64_t v[8];
        for (int j = 0; j < W; j++) v[j] = (uint64_t)in[j][(size_t)r * n + i];
        ASSERT_EQ((long long)out[i], (long long)ref_int(TD_ELEM_I64, TD_REDUCE_SUM, v, W));
    }
    for (int j = 0; j < W; j++) free(in[j]);
    free(out);
}

static void check_float32_is_allreduce(td_pg_t *pg, size_t n) {
    int r = td_pg_rank(pg);
    float *a = malloc(n * 4), *b = malloc(n * 4);
    fill(a, TD_ELEM_F32, n, r, 5, false);
    memcpy(b, a, n * 4);
    ASSERT_OK(td_allreduce(pg, a, n, TD_REDUCE_SUM));
    ASSERT_OK(td_allreduce_typed(pg, b, n, TD_ELEM_F32, TD_REDUCE_SUM));
    ASSERT(!memcmp(a, b, n * 4));
    free(a);
    free(b);
}

static void check_moves(td_pg_t *pg, size_t n) {
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    uint8_t *in = malloc((size_t)W * n + 1), *out = malloc((size_t)W * n + 1);
    /* gather to the last rank */
    int root = W - 1;
    for (size_t i = 0; i < n; i++) in[i] = byte_of(r, i, 1);
    ASSERT_OK(td_gather(pg, in, r == root ? out : NULL, n, root));
    if (r == root)
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < n; i++) ASSERT_EQ(out[(size_t)j * n + i], byte_of(j, i, 1));
    /* scatter from rank 0: block j of its buffer to rank j */
    for (size_t i = 0; i < (size_t)W * n; i++) in[i] = byte_of(r, i, 2);
    ASSERT_OK(td_scatter(pg, r == 0 ? in : NULL, out, n, 0));
    for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], byte_of(0, (size_t)r * n + i, 2));
    /* alltoallv: rank i sends (i + j) * n / 4 bytes to rank j (rank 0 sends itself nothing) */
    size_t sn[8], so[8], rn[8], ro[8], at_s = 0, at_r = 0;
    for (int j = 0; j < W; j++) {
        sn[j] = (size_t)(r + j) * n / 4;
        so[j] = at_s;
        at_s += sn[j];
        rn[j] = (size_t)(j + r) * n / 4;
        ro[j] = at_r;
        at_r += rn[j];
    }
    uint8_t *big_in = malloc(at_s + 1), *big_out = malloc(at_r + 1);
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < sn[j]; i++) big_in[so[j] + i] = byte_of(r * 16 + j, i, 3);
    ASSERT_OK(td_alltoallv(pg, big_in, sn, so, big_out, rn, ro));
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < rn[j]; i++) ASSERT_EQ(big_out[ro[j] + i], byte_of(j * 16 + r, i, 3));
    free(big_in);
    free(big_out);
    /* send/recv in a ring; even ranks send first */
    int nxt = (r + 1) % W, prv = (r + W - 1) % W;
    for (size_t i = 0; i < n; i++) in[i] = byte_of(r, i, 4);
    if (r % 2 == 0) {
        ASSERT_OK(td_send(pg, nxt, in, n, 3));
        ASSERT_OK(td_recv(pg, prv, out, n, 3));
    } else {
        ASSERT_OK(td_recv(pg, prv, out, n, 3));
        ASSERT_OK(td_send(pg, nxt, in, n, 3));
    }
    for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], byte_of(prv, i, 4));
    free(in);
    free(out);
}

static td_pg_t *join(int W, int r, td_transport_kind tr, td_store_t **store, int timeout_ms) {
    ASSERT_OK(td_store_connect("127.0.0.1", g_port, TOKEN, 10000, store));
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "typed/%d", g_seq);
    td_pg_options o = {.rank = r, .world_size = W, .store = *store, .prefix = prefix,
                       .transport = tr, .timeout_ms = timeout_ms};
    td_pg_t *pg;
    ASSERT_OK(td_pg_init(&o, &pg));
    return pg;
}

static void body_ops(int W, int r, td_transport_kind tr) {
    td_store_t *store;
    td_pg_t *pg = join(W, r, tr, &store, 60000);
    static const td_elem_type ints[] = {TD_ELEM_I8,  TD_ELEM_U8,  TD_ELEM_I16,
                                        TD_ELEM_I32, TD_ELEM_I64, TD_ELEM_BOOL};
    static const td_reduce_op int_ops[] = {TD_REDUCE_SUM, TD_REDUCE_PRODUCT, TD_REDUCE_MIN,
                                           TD_REDUCE_MAX, TD_REDUCE_BAND,    TD_REDUCE_BOR,
                                           TD_REDUCE_BXOR};
    static const td_reduce_op f_ops[] = {TD_REDUCE_SUM, TD_REDUCE_PRODUCT, TD_REDUCE_MIN,
                                         TD_REDUCE_MAX, TD_REDUCE_AVG};
    size_t sizes[] = {9, 100003}; /* one round; pipelined in chunks */
    uint64_t seed = 10;
    for (size_t s = 0; s < 2; s++) {
        for (size_t d = 0; d < TD_ARRAY_LEN(ints); d++)
            for (size_t o = 0; o < TD_ARRAY_LEN(int_ops); o++)
                check_reduction(pg, ints[d], int_ops[o], sizes[s], seed++, -1);
        for (size_t o = 0; o < TD_ARRAY_LEN(f_ops); o++)
            check_reduction(pg, TD_ELEM_F64, f_ops[o], sizes[s], seed++, -1);
        check_reduction(pg, TD_ELEM_F32, TD_REDUCE_MIN, sizes[s], seed++, -1);
        check_reduction(pg, TD_ELEM_F32, TD_REDUCE_MAX, sizes[s], seed++, -1);
        check_reduction(pg, TD_ELEM_I32, TD_REDUCE_SUM, sizes[s], seed++, W - 1);
        check_reduction(pg, TD_ELEM_F64, TD_REDUCE_MAX, sizes[s], seed++, 0);
        check_reduce_scatter_i64(pg, sizes[s]);
        check_float32_is_allreduce(pg, sizes[s]);
        check_moves(pg, sizes[s] * 3);
    }
    /* refused before anything is sent: the group goes on working */
    int32_t i32[4] = {1, 2, 3, 4};
    float f32[4] = {1, 2, 3, 4};
    ASSERT_STATUS(td_allreduce_typed(pg, i32, 4, TD_ELEM_I32, TD_REDUCE_AVG), TD_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(td_error_msg(), "op=avg, dtype=int32");
    ASSERT_STATUS(td_allreduce_typed(pg, f32, 4, TD_ELEM_F32, TD_REDUCE_BAND), TD_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(td_error_msg(), "op=band, dtype=float32");
    ASSERT_OK(td_allreduce_typed(pg, i32, 4, TD_ELEM_I32, TD_REDUCE_SUM));
    ASSERT_EQ(i32[3], 4 * W);
    td_pg_free(pg);
    td_store_close(store);
}

/* alltoall sizes that disagree: rank 1 expects one byte more from rank 0 than rank 0 sends */
static void body_alltoall_mismatch(int W, int r, td_transport_kind tr) {
    td_store_t *store;
    td_pg_t *pg = join(W, r, tr, &store, 20000);
    size_t sn[2] = {8, 8}, so[2] = {0, 8}, rn[2] = {8, 8}, ro[2] = {0, 8};
    if (r == 1) rn[0] = 9, ro[1] = 9;
    uint8_t in[16] = {0}, out[17];
    td_status st = td_alltoallv(pg, in, sn, so, out, rn, ro);
    ASSERT(st != TD_OK);
    if (r == 1) {
        ASSERT_EQ(st, TD_ERR_MISMATCH);
        ASSERT_CONTAINS(td_error_msg(), "rank 0 sends 8 bytes to rank 1, but rank 1 expects 9");
    }
    td_pg_free(pg);
    td_store_close(store);
    (void)W;
}

/* a recv whose tag is not the sender's */
static void body_tag_mismatch(int W, int r, td_transport_kind tr) {
    td_store_t *store;
    td_pg_t *pg = join(W, r, tr, &store, 20000);
    uint8_t b[32] = {0};
    if (r == 0) {
        ASSERT_OK(td_send(pg, 1, b, sizeof(b), 5));
    } else {
        ASSERT_STATUS(td_recv(pg, 0, b, sizeof(b), 6), TD_ERR_MISMATCH);
        ASSERT_CONTAINS(td_error_msg(),
                        "send(nbytes=32, tag=5) but rank 1 called recv(nbytes=32, tag=6)");
    }
    td_pg_free(pg);
    td_store_close(store);
    (void)W;
}

typedef void (*body_fn)(int, int, td_transport_kind);

static void run(const char *name, int W, td_transport_kind tr, body_fn body) {
    g_seq++;
    uint64_t t0 = td_now_ns();
    pid_t pids[8];
    for (int r = 0; r < W; r++) {
        pids[r] = fork();
        ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            alarm(240);
            body(W, r, tr);
            _exit(0);
        }
    }
    for (int r = 0; r < W; r++) {
        int ws;
        ASSERT_EQ(waitpid(pids[r], &ws, 0), pids[r]);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            TEST_FAIL("%s, world %d, %s: rank %d failed (wait status 0x%x)", name, W,
                      tr == TD_TRANSPORT_SHM ? "shm" : "tcp", r, ws);
    }
    printf("  %-26s world %d %s: ok (%.2f s)\n", name, W, tr == TD_TRANSPORT_SHM ? "shm" : "tcp",
           (double)(td_now_ns() - t0) * 1e-9);
    fflush(stdout);
}

int main(void) {
    td_store_server_t *srv;
    ASSERT_OK(td_store_server_start("127.0.0.1", 0, TOKEN, &srv));
    g_port = td_store_server_port(srv);
    td_transport_kind kinds[] = {TD_TRANSPORT_SHM, TD_TRANSPORT_TCP};
    for (int k = 0; k < 2; k++) {
        for (int W = 2; W <= 4; W++) run("typed ops and moves", W, kinds[k], body_ops);
        run("alltoall size mismatch", 2, kinds[k], body_alltoall_mismatch);
        run("send/recv tag mismatch", 2, kinds[k], body_tag_mismatch);
    }
    td_store_server_stop(srv);
    printf("PASS\n");
    return 0;
}
