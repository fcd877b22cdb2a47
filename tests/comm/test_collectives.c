/* comm: every collective on world sizes 1..8 over shm, tcp and a mixed group, ranks as real
 * processes (fork) around a store in the parent. Every element is checked; allreduce and
 * reduce_scatter results must equal, bit for bit, a reference tree sum computed here from random
 * floats whose exponents span 2^-16..2^15, so that the order of the additions changes the bits
 * at every world size where the tree has a choice (3 ranks and up; checked before the ranks run:
 * at 2, a+b = b+a whatever the code does). Then the safety nets: mismatched
 * calls named on both sides, a timeout naming the rank that never came, a rank killed with
 * SIGKILL mid-collective (the others fail with TD_ERR_PEER within 2 s), init from the
 * launcher's environment. */
#include "test.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/pg_internal.h"
#include "tandem/comm.h"

static int g_port;
static int g_scenario;
static const char *TOKEN = "collectives-token";

typedef struct {
    const char *name;
    int world;
    td_transport_kind transport;
    bool two_hosts; /* host_key splits ranks into halves */
    int timeout_ms;
} scenario;

/* Shared with the children: per-rank timestamps and status. */
typedef struct {
    uint64_t fail_ns[16];
    int status[16];
    char msg[16][512];
} shared_out;
static shared_out *g_out;
static pid_t g_all_pids[1024];
static int g_nall;

/* Element i of rank `rank`'s input: 24 random bits (one Philox lane) as a sign and 18-bit
 * significand in [-1, 1), scaled by 2^k with k uniform in [-16, 15]. Plain uniforms in [-1, 1)
 * are all multiples of 2^-23 whose partial sums fit a float's 24 bits: at 5 ranks or fewer every
 * order of adding them gave the same bits, so a changed tree went unseen there. */
static float val(uint64_t seed, int rank, size_t i) {
    static float pow2[32];
    if (pow2[0] == 0)
        for (int k = 0; k < 32; k++) pow2[k] = ldexpf(1.0f, k - 16);
    uint32_t b = (uint32_t)(td_rng_uniform(seed, (uint64_t)rank, i) * 16777216.0f);
    float m = (float)((int32_t)(b & 0x7ffff) - 0x40000) * (1.0f / 262144.0f);
    return m * pow2[b >> 19];
}

/* Other orders of adding v[0..W): what a changed reduction tree would compute. */
static float left_fold(const float *v, int W) { /* ((v0 + v1) + v2) + ... */
    float a = v[0];
    for (int j = 1; j < W; j++) a = a + v[j];
    return a;
}
static float right_fold(const float *v, int W) { /* v0 + (v1 + (v2 + ...)) */
    float a = v[W - 1];
    for (int j = W - 2; j >= 0; j--) a = v[j] + a;
    return a;
}
static float odd_first(const float *v, int W) { /* the tree, an odd node carried from the front */
    float a[64];
    memcpy(a, v, (size_t)W * sizeof(float));
    for (int m = W; m > 1;) {
        int k = 0, s = m & 1;
        if (s) a[k++] = a[0];
        for (int i = s; i + 1 < m; i += 2) a[k++] = a[i] + a[i + 1];
        m = k;
    }
    return a[0];
}

static float interleaved(const float *v, int W) { /* pairs (i, i + m/2) at each level */
    float a[64];
    memcpy(a, v, (size_t)W * sizeof(float));
    for (int m = W; m > 1;) {
        int h = m / 2;
        for (int i = 0; i < h; i++) a[i] = a[i] + a[i + h];
        if (m & 1) a[h] = a[m - 1];
        m = h + (m & 1);
    }
    return a[0];
}

/* The inputs can tell the tree from every other order that differs from it at W ranks: for each
 * alternative that is another expression at that W (not just commuted pairs), some of 1023
 * elements come out different. Without this the bitwise checks below prove nothing about the
 * order. */
static void check_inputs_tell_orders(void) {
    struct {
        const char *name;
        float (*fn)(const float *, int);
        int min_w, odd_only;
    } alt[] = {{"left fold", left_fold, 4, 0},
               {"right fold", right_fold, 3, 0},
               {"odd node carried first", odd_first, 3, 1},
               {"interleaved pairs", interleaved, 4, 0}};
    for (int W = 3; W <= 8; W++)
        for (size_t a = 0; a < TD_ARRAY_LEN(alt); a++) {
            if (W < alt[a].min_w || (alt[a].odd_only && !(W & 1))) continue;
            int differ = 0;
            float v[64];
            for (size_t i = 0; i < 1023; i++) {
                for (int j = 0; j < W; j++) v[j] = val(100, j, i);
                float t = test_tree_sum(v, W), o = alt[a].fn(v, W);
                differ += memcmp(&t, &o, 4) != 0;
            }
            if (differ < 10)
                TEST_FAIL("W=%d: the %s gives the tree's bits at %d of 1023 elements: the inputs "
                          "cannot tell the orders apart",
                          W, alt[a].name, 1023 - differ);
            printf("  inputs at W=%d: %s: other bits than the tree's at %d of 1023 elements\n", W,
                   alt[a].name, differ);
        }
}

static void check_allreduce(td_pg_t *pg, size_t count, td_reduce_op op, uint64_t seed) {
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    float *buf = td_xmalloc_aligned(count * sizeof(float) + 64);
    for (size_t i = 0; i < count; i++) buf[i] = val(seed, r, i);
    ASSERT_OK(td_allreduce(pg, buf, count, op));
    float v[64];
    for (size_t i = 0; i < count; i++) {
        for (int j = 0; j < W; j++) v[j] = val(seed, j, i);
        float e = test_tree_sum(v, W);
        if (op == TD_REDUCE_AVG) e = e / (float)W;
        if (memcmp(&e, &buf[i], 4))
            TEST_FAIL("rank %d allreduce(count=%zu, op=%d) W=%d: element %zu is %.9g, expected "
                      "%.9g (tree order)",
                      r, count, (int)op, W, i, buf[i], e);
    }
    free(buf);
}

static void check_reduce_scatter(td_pg_t *pg, size_t count, td_reduce_op op, uint64_t seed) {
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    float *in = td_xmalloc_aligned((size_t)W * count * sizeof(float) + 64);
    float *out = td_xmalloc_aligned(count * sizeof(float) + 64);
    for (size_t i = 0; i < (size_t)W * count; i++) in[i] = val(seed, r, i);
    ASSERT_OK(td_reduce_scatter(pg, in, out, count, op));
    float v[64];
    for (size_t i = 0; i < count; i++) {
        for (int j = 0; j < W; j++) v[j] = val(seed, j, (size_t)r * count + i);
        float e = test_tree_sum(v, W);
        if (op == TD_REDUCE_AVG) e = e / (float)W;
        if (memcmp(&e, &out[i], 4))
            TEST_FAIL("rank %d reduce_scatter(count=%zu) W=%d: element %zu is %.9g, expected %.9g",
                      r, count, W, i, out[i], e);
    }
    free(in);
    free(out);
}

static uint8_t pattern(int rank, size_t i) {
    return (uint8_t)((size_t)rank * 131 + i * 7 + (i >> 9));
}

static void check_broadcast(td_pg_t *pg, size_t nbytes, int root) {
    int r = td_pg_rank(pg);
    uint8_t *b = td_xmalloc(nbytes + 1);
    for (size_t i = 0; i < nbytes; i++) b[i] = r == root ? pattern(root, i) : 0xEE;
    ASSERT_OK(td_broadcast(pg, b, nbytes, root));
    for (size_t i = 0; i < nbytes; i++)
        if (b[i] != pattern(root, i))
            TEST_FAIL("rank %d broadcast(nbytes=%zu, root=%d): byte %zu is %u, expected %u", r,
                      nbytes, root, i, b[i], pattern(root, i));
    free(b);
}

static void check_allgather(td_pg_t *pg, size_t n) {
    int W = td_pg_world_size(pg), r = td_pg_rank(pg);
    uint8_t *in = td_xmalloc(n + 1), *out = td_xmalloc((size_t)W * n + 1);
    for (size_t i = 0; i < n; i++) in[i] = pattern(r, i);
    memset(out, 0xEE, (size_t)W * n);
    ASSERT_OK(td_allgather(pg, in, out, n));
    for (int j = 0; j < W; j++)
        for (size_t i = 0; i < n; i++)
            if (out[(size_t)j * n + i] != pattern(j, i))
                TEST_FAIL("rank %d allgather(n=%zu): block %d byte %zu is %u, expected %u", r, n, j,
                          i, out[(size_t)j * n + i], pattern(j, i));
    free(in);
    free(out);
}

static td_pg_t *join(const scenario *sc, int rank, td_store_t **store_out) {
    td_store_t *store = NULL;
    ASSERT_OK(td_store_connect("127.0.0.1", g_port, TOKEN, 10000, &store));
    char prefix[64], host[32];
    snprintf(prefix, sizeof(prefix), "test/%d/%s", g_scenario, sc->name);
    snprintf(host, sizeof(host), "fakehost%d", rank < sc->world / 2 ? 0 : 1);
    td_pg_options o = {.rank = rank,
                       .world_size = sc->world,
                       .store = store,
                       .prefix = prefix,
                       .transport = sc->transport,
                       .host_key = sc->two_hosts ? host : NULL,
                       .timeout_ms = sc->timeout_ms ? sc->timeout_ms : 60000};
    td_pg_t *pg = NULL;
    ASSERT_OK(td_pg_init(&o, &pg));
    /* the transports really are the ones asked for */
    if (sc->world > 1) {
        if (sc->transport == TD_TRANSPORT_SHM) ASSERT(pg->shm && !pg->tcp);
        if (sc->transport == TD_TRANSPORT_TCP) ASSERT(pg->tcp && !pg->shm);
        if (sc->two_hosts && sc->world >= 4) ASSERT(pg->tcp && pg->shm);
    }
    *store_out = store;
    return pg;
}

static void body_all_ops(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    int W = sc->world;
    size_t counts[] = {0, 1, 1023, 262147};
    for (size_t c = 0; c < TD_ARRAY_LEN(counts); c++) {
        check_allreduce(pg, counts[c], TD_REDUCE_SUM, 100 + c);
        check_allreduce(pg, counts[c], TD_REDUCE_AVG, 200 + c);
        check_reduce_scatter(pg, counts[c] / (size_t)W + (c > 0), TD_REDUCE_SUM, 300 + c);
        check_broadcast(pg, counts[c] * 4 + (c > 0 ? 3 : 0), W - 1);
        check_allgather(pg, counts[c] + (c > 0 ? 5 : 0));
        ASSERT_OK(td_barrier(pg));
    }
    if (W == 2 || W == 3) { /* tens of MiB through the pipelined path */
        check_allreduce(pg, (size_t)5 << 20, TD_REDUCE_SUM, 400);
        check_reduce_scatter(pg, (size_t)3 << 20, TD_REDUCE_AVG, 401);
        check_broadcast(pg, (size_t)20 << 20, 0);
    }
    td_pg_free(pg);
    td_store_close(store);
}

static void body_mismatch(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    float buf[2048] = {0};
    ASSERT_OK(td_allreduce(pg, buf, 16, TD_REDUCE_SUM)); /* seq 0 fine */
    td_status st = td_allreduce(pg, buf, rank == 0 ? 2048 : 1024, TD_REDUCE_SUM);
    ASSERT_EQ(st, TD_ERR_MISMATCH);
    if (rank == 0)
        ASSERT_CONTAINS(td_error_msg(), "rank 1 called allreduce(count=1024, op=sum) but rank 0 "
                                        "called allreduce(count=2048, op=sum) at seq 1");
    else
        ASSERT_CONTAINS(td_error_msg(), "rank 0 called allreduce(count=2048, op=sum) but rank 1 "
                                        "called allreduce(count=1024, op=sum) at seq 1");
    /* the group stays failed */
    ASSERT_STATUS(td_barrier(pg), TD_ERR_MISMATCH);
    ASSERT_CONTAINS(td_error_msg(), "failed earlier");
    td_pg_free(pg);
    td_store_close(store);
}

/* The first data rides behind the fingerprint: a small allreduce against a pipelined one puts
 * different sizes behind it, and both ranks must still name the disagreement, not hang on it. */
static void body_size_mismatch(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    size_t big = (size_t)1 << 20;
    float *buf = td_xcalloc(big, sizeof(float));
    td_status st = td_allreduce(pg, buf, rank == 0 ? 1024 : big, TD_REDUCE_SUM);
    ASSERT_EQ(st, TD_ERR_MISMATCH);
    if (rank == 0)
        ASSERT_CONTAINS(td_error_msg(), "rank 1 called allreduce(count=1048576, op=sum) but rank 0 "
                                        "called allreduce(count=1024, op=sum) at seq 0");
    else
        ASSERT_CONTAINS(td_error_msg(), "rank 0 called allreduce(count=1024, op=sum) but rank 1 "
                                        "called allreduce(count=1048576, op=sum) at seq 0");
    free(buf);
    td_pg_free(pg);
    td_store_close(store);
}

static void body_kind_mismatch(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    float buf[64] = {0};
    td_status st = rank == 1 ? td_broadcast(pg, buf, 64, 0) : td_allreduce(pg, buf, 16, 0);
    ASSERT_EQ(st, TD_ERR_MISMATCH);
    ASSERT_CONTAINS(td_error_msg(), rank == 1 ? "called allreduce(count=16"
                                              : "rank 1 called "
                                                "broadcast(nbytes=64, root=0)");
    td_pg_free(pg);
    td_store_close(store);
}

static void body_timeout(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    if (rank == 2) {
        usleep(1500 * 1000); /* never arrives */
        _exit(0);
    }
    float buf[8] = {0};
    uint64_t t0 = td_now_ns();
    ASSERT_STATUS(td_allreduce(pg, buf, 8, TD_REDUCE_SUM), TD_ERR_TIMEOUT);
    ASSERT_CONTAINS(td_error_msg(), "rank(s) 2 never arrived");
    ASSERT_CONTAINS(td_error_msg(), "allreduce(count=8");
    ASSERT_GE(td_now_ns() - t0, 400000000ull);
    td_pg_free(pg);
    td_store_close(store);
}

static void body_kill(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    size_t count = 1 << 20;
    float *buf = td_xmalloc_aligned(count * sizeof(float));
    memset(buf, 0, count * sizeof(float));
    /* rank 2 is killed by the parent at some point inside this loop */
    for (int it = 0; it < 1000000; it++) {
        td_status st = td_allreduce(pg, buf, count, TD_REDUCE_SUM);
        if (st != TD_OK) {
            g_out->fail_ns[rank] = td_now_ns();
            g_out->status[rank] = st;
            snprintf(g_out->msg[rank], sizeof(g_out->msg[rank]), "%s", td_error_msg());
            break;
        }
    }
    free(buf);
    td_pg_free(pg);
    td_store_close(store);
}

static void body_env(const scenario *sc, int rank) {
    char v[64];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", sc->world);
    setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "127.0.0.1:%d", g_port);
    setenv("TANDEM_STORE_ADDR", v, 1);
    setenv("TANDEM_TOKEN", TOKEN, 1);
    setenv("TANDEM_RUN_ID", "envrun", 1);
    setenv("TANDEM_RESTART_COUNT", "2", 1);
    td_pg_t *pg = NULL;
    td_store_t *store = NULL;
    ASSERT_OK(td_pg_init_from_env(&pg, &store));
    ASSERT_EQ(td_pg_rank(pg), rank);
    ASSERT_STREQ(pg->prefix, "tandem/envrun/restart2/pg");
    check_allreduce(pg, 5000, TD_REDUCE_SUM, 7);
    td_pg_free(pg);
    td_store_close(store);
    setenv("TANDEM_TOKEN", "wrong", 1);
    ASSERT_STATUS(td_pg_init_from_env(&pg, &store), TD_ERR_AUTH);
}

typedef void (*body_fn)(const scenario *, int);

/* Forks one process per rank; kill_rank >= 0 is SIGKILLed kill_after_ms after start. */
static void run(const scenario *sc, body_fn body, int kill_rank, int kill_after_ms,
                uint64_t *kill_ns) {
    g_scenario++;
    pid_t pids[16];
    memset(g_out, 0, sizeof(*g_out));
    uint64_t t0 = td_now_ns();
    for (int r = 0; r < sc->world; r++) {
        pids[r] = fork();
        ASSERT(pids[r] >= 0);
        if (g_nall < 1024) g_all_pids[g_nall++] = pids[r];
        if (pids[r] == 0) {
            alarm(120);
            char pre[32];
            snprintf(pre, sizeof(pre), "[rank %d] ", r);
            td_log_set_prefix(pre);
            body(sc, r);
            _exit(0);
        }
    }
    if (kill_rank >= 0) {
        usleep((useconds_t)kill_after_ms * 1000);
        *kill_ns = td_now_ns();
        kill(pids[kill_rank], SIGKILL);
    }
    for (int r = 0; r < sc->world; r++) {
        int ws;
        ASSERT_EQ(waitpid(pids[r], &ws, 0), pids[r]);
        if (r == kill_rank) continue;
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            TEST_FAIL("scenario %s (world %d): rank %d failed (wait status 0x%x)", sc->name,
                      sc->world, r, ws);
    }
    printf("  %-28s world %d: ok (%.2f s)\n", sc->name, sc->world,
           (double)(td_now_ns() - t0) * 1e-9);
    fflush(stdout);
}

int main(void) {
    g_out =
        mmap(NULL, sizeof(shared_out), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT(g_out != MAP_FAILED);
    td_store_server_t *srv;
    ASSERT_OK(td_store_server_start("127.0.0.1", 0, TOKEN, &srv));
    g_port = td_store_server_port(srv);
    check_inputs_tell_orders();
    fflush(stdout);

    for (int W = 1; W <= 8; W++) {
        scenario s1 = {"shm all ops", W, TD_TRANSPORT_SHM, false, 0};
        run(&s1, body_all_ops, -1, 0, NULL);
        scenario s2 = {"tcp all ops", W, TD_TRANSPORT_TCP, false, 0};
        run(&s2, body_all_ops, -1, 0, NULL);
    }
    scenario mixed4 = {"mixed (2 fake hosts) all ops", 4, TD_TRANSPORT_AUTO, true, 0};
    run(&mixed4, body_all_ops, -1, 0, NULL);
    scenario mixed5 = {"mixed (2 fake hosts) all ops", 5, TD_TRANSPORT_AUTO, true, 0};
    run(&mixed5, body_all_ops, -1, 0, NULL);
    scenario autoshm = {"auto one host all ops", 3, TD_TRANSPORT_AUTO, false, 0};
    run(&autoshm, body_all_ops, -1, 0, NULL);

    td_transport_kind kinds[] = {TD_TRANSPORT_SHM, TD_TRANSPORT_TCP};
    for (size_t k = 0; k < 2; k++) {
        const char *kn = kinds[k] == TD_TRANSPORT_SHM ? "shm" : "tcp";
        scenario mm = {kn, 2, kinds[k], false, 10000};
        mm.name = k ? "tcp mismatch" : "shm mismatch";
        run(&mm, body_mismatch, -1, 0, NULL);
        scenario sm = {k ? "tcp size mismatch" : "shm size mismatch", 2, kinds[k], false, 10000};
        run(&sm, body_size_mismatch, -1, 0, NULL);
        scenario km = {k ? "tcp kind mismatch" : "shm kind mismatch", 3, kinds[k], false, 10000};
        run(&km, body_kind_mismatch, -1, 0, NULL);
        scenario to = {k ? "tcp timeout" : "shm timeout", 3, kinds[k], false, 500};
        run(&to, body_timeout, -1, 0, NULL);
        scenario kl = {k ? "tcp sigkill" : "shm sigkill", 3, kinds[k], false, 30000};
        uint64_t kill_ns = 0;
        run(&kl, body_kill, 2, 700, &kill_ns);
        for (int r = 0; r < 2; r++) {
            if (g_out->status[r] != TD_ERR_PEER)
                TEST_FAIL("%s: rank %d ended with %s (%s), expected TD_ERR_PEER", kn, r,
                          td_status_name((td_status)g_out->status[r]), g_out->msg[r]);
            ASSERT_CONTAINS(g_out->msg[r], "rank 2");
            double dt = (double)(g_out->fail_ns[r] - kill_ns) * 1e-9;
            printf("    rank %d noticed the kill after %.3f s: %s\n", r, dt, g_out->msg[r]);
            ASSERT(dt < 2.0);
        }
    }
    scenario mixedkill = {"mixed sigkill", 4, TD_TRANSPORT_AUTO, true, 30000};
    uint64_t kill_ns = 0;
    run(&mixedkill, body_kill, 2, 700, &kill_ns);
    for (int r = 0; r < 4; r++) {
        if (r == 2) continue;
        ASSERT_EQ(g_out->status[r], TD_ERR_PEER);
        ASSERT_CONTAINS(g_out->msg[r], "rank 2");
        ASSERT((double)(g_out->fail_ns[r] - kill_ns) * 1e-9 < 2.0);
    }
    scenario env = {"init from env", 2, TD_TRANSPORT_AUTO, false, 0};
    run(&env, body_env, -1, 0, NULL);

    td_store_server_stop(srv);
    /* nothing left behind in /dev/shm by any of our ranks, the killed ones included */
    for (int i = 0; i < g_nall; i++) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "ls /dev/shm | grep -q '^tandem-%d-'", (int)g_all_pids[i]);
        if (system(cmd) == 0)
            TEST_FAIL("a shm segment of pid %d was left in /dev/shm", (int)g_all_pids[i]);
    }
    TEST_PASS();
}
