/* ddp: the reducer in isolation, ranks as real processes (fork) around a store server (in a
 * process of its own, so the forking parent has no threads).
 *
 * - Gradients after td_ddp_wait equal, bit for bit, the fixed-tree sum ((g0+g1)+(g2+g3))... of
 *   every rank's own gradient, where each rank computes the reference itself by running every
 *   rank's batch through its model before the step (shm and tcp, 2-4 ranks, default and tiny
 *   buckets, and a backward whose hook never reports so td_ddp_wait launches everything).
 * - Buckets: tiny bucket sizes give one bucket per parametered layer; backward is held inside
 *   the grad-ready hook until the buckets already complete have been reduced, which can only
 *   happen if they left while backward was still running; buckets reported out of order still
 *   go in index order.
 * - td_ddp_check_params names the rank whose parameters were perturbed (also when it is rank 0).
 * - A rank killed mid-step makes td_ddp_wait on the others return TD_ERR_PEER naming the bucket
 *   and the rank, well before the collective timeout (no hang), and td_ddp_free still returns.
 */
#include "test.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/ddp.h"
#include "tandem/tensor.h"

#define BATCH   5
#define CLASSES 5
#define MAXW    4
#define IN_C    1
#define IN_HW   6
#define IN_SIZE (IN_C * IN_HW * IN_HW)
#define COMM_MS 60000 /* collective timeout: a death must be noticed long before this */

static int g_port;
static int g_scenario;
static const char *TOKEN = "ddp-reducer-token";

typedef struct {
    int status[MAXW];
    double fail_s[MAXW]; /* seconds from the start of the failing wait to its return */
    char msg[MAXW][1024];
} shared_out;
static shared_out *g_out;

typedef struct {
    const char *name;
    int world;
    td_transport_kind transport;
    size_t bucket_bytes, first_bucket_bytes; /* 0 = the reducer's defaults */
} scenario;

/* conv 1->4 3x3, relu, flatten, fc 64->24, relu, fc 24->16, relu, fc 16->5, log_softmax:
 * four parametered layers of different sizes, a conv among them like BasicNet. */
static td_model_t *make_model(void) {
    td_model_t *m = td_model_new(IN_C, IN_HW, IN_HW);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 0));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 24));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_linear(m, 16));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_linear(m, CLASSES));
    ASSERT_OK(td_model_add_log_softmax(m));
    ASSERT_OK(td_model_finalize(m, BATCH));
    td_model_init_params(m, 42);
    return m;
}

/* Rank r's batch at a given step: different data and labels on every rank. */
static void make_batch(int rank, int step, float *x, int32_t *y) {
    for (int i = 0; i < BATCH * IN_SIZE; i++)
        x[i] = td_rng_uniform(1000 + (uint64_t)step, (uint64_t)rank, (uint64_t)i) * 2.0f - 1.0f;
    for (int i = 0; i < BATCH; i++) y[i] = (rank * 3 + i + step) % CLASSES;
}

/* forward + NLL + backward of rank r's batch into the model's grads (zeroed first); the hook
 * state of the model is whatever the caller set. Loss scale as the trainer uses it. */
static void forward_backward(td_model_t *m, int rank, int step, int world) {
    float x[BATCH * IN_SIZE], dout[BATCH * CLASSES];
    int32_t y[BATCH];
    make_batch(rank, step, x, y);
    const float *out = td_model_forward(m, x, BATCH, NULL);
    ASSERT(out != NULL);
    td_nll_loss(out, y, BATCH, CLASSES, 1.0f / (float)(BATCH * world), dout);
    td_model_backward(m, dout, BATCH);
}

/* ref[i] = tree sum over ranks of each rank's gradient of this step, computed locally. */
static float *reference_grads(td_model_t *m, int step, int world) {
    size_t n = td_model_num_params(m);
    float *per = td_xmalloc(sizeof(float) * n * (size_t)world);
    float *ref = td_xmalloc(sizeof(float) * n);
    for (int r = 0; r < world; r++) {
        td_model_zero_grads(m);
        forward_backward(m, r, step, world);
        memcpy(per + (size_t)r * n, td_model_grads(m), n * sizeof(float));
    }
    size_t order_shows = 0; /* elements whose tree sum differs from the left-to-right sum */
    for (size_t i = 0; i < n; i++) {
        float v[MAXW];
        for (int r = 0; r < world; r++) v[r] = per[(size_t)r * n + i];
        ref[i] = test_tree_sum(v, world);
        float linear = 0;
        for (int r = 0; r < world; r++) linear += v[r];
        order_shows += memcmp(&linear, &ref[i], sizeof(float)) != 0;
    }
    /* a vacuous comparison would pass too: the ranks' gradients must really differ */
    ASSERT(world == 1 || memcmp(per, per + n, n * sizeof(float)) != 0);
    /* With 4 ranks the tree ((g0+g1)+(g2+g3)) and a plain left-to-right sum differ in some
     * elements of these gradients: a reducer that added in another order fails the comparison.
     * (With 2 ranks every order gives the same bits; with 3 the tree is the left-to-right sum.) */
    ASSERT(world != 4 || order_shows > 0);
    free(per);
    return ref;
}

static void expect_grads(td_model_t *m, const float *ref, size_t off, size_t count, int rank,
                         const char *what) {
    const float *g = td_model_grads(m);
    for (size_t i = off; i < off + count; i++)
        if (memcmp(&g[i], &ref[i], sizeof(float)))
            TEST_FAIL("rank %d, %s: gradient %zu is %.9g but the tree sum of the ranks' own "
                      "gradients is %.9g",
                      rank, what, i, g[i], ref[i]);
}

static td_pg_t *join(const scenario *sc, int rank, td_store_t **store_out) {
    td_store_t *store = NULL;
    ASSERT_OK(td_store_connect("127.0.0.1", g_port, TOKEN, 10000, &store));
    char prefix[64];
    snprintf(prefix, sizeof prefix, "ddptest/%d", g_scenario);
    td_pg_options o = {.rank = rank,
                       .world_size = sc->world,
                       .store = store,
                       .prefix = prefix,
                       .transport = sc->transport,
                       .timeout_ms = COMM_MS};
    td_pg_t *pg = NULL;
    ASSERT_OK(td_pg_init(&o, &pg));
    *store_out = store;
    return pg;
}

static td_ddp_t *make_ddp(const scenario *sc, td_pg_t *pg, td_model_t *m, int check_every) {
    td_ddp_options o = {.bucket_bytes = sc->bucket_bytes,
                        .first_bucket_bytes = sc->first_bucket_bytes,
                        .check_every = check_every};
    td_ddp_t *ddp = NULL;
    ASSERT_OK(td_ddp_new(pg, m, &o, &ddp));
    return ddp;
}

/* Parametered layers, last first: with tiny buckets, bucket b holds exactly layer_of[b]. */
static int param_layers_last_first(td_model_t *m, int *layer_of) {
    int n = 0;
    for (int i = td_model_num_layers(m) - 1; i >= 0; i--)
        if (td_model_layer(m, i).param_count) layer_of[n++] = i;
    return n;
}

/* Polls the stats until `want` buckets of the step are reduced; fails after 20 s. */
static void await_reduced(td_ddp_t *ddp, int want, int rank, const char *why) {
    double t0 = td_now_s();
    for (;;) {
        int got = td_ddp_get_stats(ddp).buckets_reduced;
        if (got >= want) return;
        if (td_now_s() - t0 > 20)
            TEST_FAIL("rank %d: %s: only %d of %d buckets reduced after 20 s", rank, why, got,
                      want);
        usleep(200);
    }
}

/* ---- scenario bodies ---- */

/* Several steps of forward/backward through the reducer; every gradient checked. */
static void body_sum(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    td_model_t *m = make_model();
    td_ddp_t *ddp = make_ddp(sc, pg, m, 1);
    size_t n = td_model_num_params(m);
    int layer_of[16];
    int nparam = param_layers_last_first(m, layer_of);
    int nb = td_ddp_get_stats(ddp).num_buckets;
    if (sc->bucket_bytes == 0) /* defaults: the whole 8 KB model fits the 1 MiB first bucket */
        ASSERT_EQ(nb, 1);
    else
        ASSERT_EQ(nb, nparam);
    ASSERT_OK(td_ddp_broadcast_params(ddp));
    for (int step = 0; step < 3; step++) {
        float *ref = reference_grads(m, step, sc->world);
        td_model_zero_grads(m);
        td_ddp_begin_backward(ddp);
        forward_backward(m, rank, step, sc->world);
        ASSERT_OK(td_ddp_wait(ddp));
        expect_grads(m, ref, 0, n, rank, sc->name);
        td_ddp_stats s = td_ddp_get_stats(ddp);
        ASSERT_EQ(s.buckets_reduced, nb);
        ASSERT_EQ(s.steps, (uint64_t)step + 1);
        free(ref);
        /* the optimizer's stand-in: the same update on every rank keeps replicas equal */
        float *p = td_model_params(m);
        const float *g = td_model_grads(m);
        for (size_t i = 0; i < n; i++) p[i] -= 0.1f * g[i];
        ASSERT_OK(td_ddp_check_params(ddp, (uint64_t)step + 1));
    }
    td_model_free(m); /* the trainer's teardown order: the reducer must not touch the model */
    td_ddp_free(ddp);
    td_pg_free(pg);
    td_store_close(store);
}

/* Buckets whose layers never report (the hook removed) are all launched, in order, by wait. */
static void body_no_hook(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    td_model_t *m = make_model();
    td_ddp_t *ddp = make_ddp(sc, pg, m, 1);
    float *ref = reference_grads(m, 7, sc->world);
    td_model_zero_grads(m);
    td_ddp_begin_backward(ddp);
    td_model_set_grad_ready_hook(m, NULL, NULL);
    forward_backward(m, rank, 7, sc->world);
    usleep(20000);
    ASSERT_EQ(td_ddp_get_stats(ddp).buckets_reduced, 0); /* nothing left on its own */
    ASSERT_OK(td_ddp_wait(ddp));
    expect_grads(m, ref, 0, td_model_num_params(m), rank, "buckets launched by wait");
    free(ref);
    td_ddp_free(ddp);
    td_model_free(m);
    td_pg_free(pg);
    td_store_close(store);
}

/* The overlap: the test's hook holds backward at each layer until every bucket completed so far
 * has been reduced. If a bucket only left at td_ddp_wait (after backward), this would never
 * happen and the test would fail after 20 s. */
typedef struct {
    td_ddp_t *ddp;
    td_model_t *m;
    int rank;
    int order[16];
    int norder;
    int layer_of[16];
    int nb;
    const float *ref;
} overlap_ctx;

static void overlap_hook(void *user, int layer, size_t off, size_t count) {
    overlap_ctx *c = user;
    c->order[c->norder++] = layer;
    td_ddp_layer_ready(c->ddp, layer);
    int b = 0;
    while (b < c->nb && c->layer_of[b] != layer) b++;
    ASSERT(b < c->nb);
    if (b == c->nb - 1) return; /* the last bucket completes with backward itself */
    await_reduced(c->ddp, b + 1, c->rank, "bucket reduced while backward runs");
    /* backward has not yet reached the layers of bucket b + 1 ... */
    for (int k = b + 1; k < c->nb; k++)
        for (int j = 0; j < c->norder; j++) ASSERT_NE(c->order[j], c->layer_of[k]);
    /* ... but bucket b already holds the sum over ranks */
    expect_grads(c->m, c->ref, off, count, c->rank, "bucket reduced during backward");
}

static void body_overlap(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    td_model_t *m = make_model();
    td_ddp_t *ddp = make_ddp(sc, pg, m, 1);
    overlap_ctx c = {.ddp = ddp, .m = m, .rank = rank};
    c.nb = param_layers_last_first(m, c.layer_of);
    ASSERT_EQ(td_ddp_get_stats(ddp).num_buckets, c.nb);
    float *ref = reference_grads(m, 3, sc->world);
    c.ref = ref;
    td_model_zero_grads(m);
    td_ddp_begin_backward(ddp);
    td_model_set_grad_ready_hook(m, overlap_hook, &c); /* the trainer's way: its hook relays */
    forward_backward(m, rank, 3, sc->world);
    ASSERT_OK(td_ddp_wait(ddp));
    ASSERT_EQ(c.norder, c.nb);
    for (int b = 0; b < c.nb; b++) ASSERT_EQ(c.order[b], c.layer_of[b]); /* last layer first */
    expect_grads(m, ref, 0, td_model_num_params(m), rank, "after the overlapped step");
    free(ref);

    /* Out of order: bucket 1's layer reports first; it must wait for bucket 0 (collectives go
     * in the same order on every rank). */
    size_t n = td_model_num_params(m);
    float *g = td_model_grads(m);
    for (size_t i = 0; i < n; i++) g[i] = (float)(rank + 1) * 0.5f + (float)i;
    td_ddp_begin_backward(ddp);
    td_model_set_grad_ready_hook(m, NULL, NULL);
    td_ddp_layer_ready(ddp, c.layer_of[1]);
    usleep(50000);
    ASSERT_EQ(td_ddp_get_stats(ddp).buckets_reduced, 0);
    td_ddp_layer_ready(ddp, c.layer_of[0]);
    await_reduced(ddp, 2, rank, "buckets 0 and 1 after bucket 0 reported");
    ASSERT_OK(td_ddp_wait(ddp));
    for (size_t i = 0; i < n; i++) {
        float v[MAXW];
        for (int r = 0; r < sc->world; r++) v[r] = (float)(r + 1) * 0.5f + (float)i;
        float e = test_tree_sum(v, sc->world);
        if (memcmp(&e, &g[i], sizeof e))
            TEST_FAIL("rank %d: out-of-order step, element %zu is %.9g, expected %.9g", rank, i,
                      g[i], e);
    }
    td_ddp_free(ddp);
    td_model_free(m);
    td_pg_free(pg);
    td_store_close(store);
}

/* Rank `victim` perturbs one parameter; every rank's check names it. */
static void check_drift(const scenario *sc, int rank, int victim) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    td_model_t *m = make_model();
    td_ddp_t *ddp = make_ddp(sc, pg, m, 10);
    ASSERT_OK(td_ddp_broadcast_params(ddp));
    ASSERT_OK(td_ddp_check_params(ddp, 10));
    if (rank == victim) td_model_params(m)[17] += 1e-6f;
    /* not a checking step: no collective, no verdict */
    ASSERT_OK(td_ddp_check_params(ddp, 15));
    ASSERT_STATUS(td_ddp_check_params(ddp, 20), TD_ERR_MISMATCH);
    char want[64];
    snprintf(want, sizeof want, "rank %d (crc 0x", victim);
    ASSERT_CONTAINS(td_error_msg(), want);
    ASSERT_CONTAINS(td_error_msg(), "at step 20");
    snprintf(want, sizeof want, "that %d of %d ranks hold", sc->world - 1, sc->world);
    ASSERT_CONTAINS(td_error_msg(), want);
    if (rank == 0) printf("    victim %d: %s\n", victim, td_error_msg());
    /* broadcasting rank 0's parameters heals the replicas */
    ASSERT_OK(td_ddp_broadcast_params(ddp));
    ASSERT_OK(td_ddp_check_params(ddp, 30));
    td_ddp_free(ddp);
    td_model_free(m);
    td_pg_free(pg);
    td_store_close(store);
}

static void body_drift_2(const scenario *sc, int rank) {
    check_drift(sc, rank, 2);
}

static void body_drift_0(const scenario *sc, int rank) {
    check_drift(sc, rank, 0);
}

/* One good step, then rank 1 dies after arming the reducer for the next. */
static void body_death(const scenario *sc, int rank) {
    td_store_t *store;
    td_pg_t *pg = join(sc, rank, &store);
    td_model_t *m = make_model();
    td_ddp_t *ddp = make_ddp(sc, pg, m, 1);
    td_model_zero_grads(m);
    td_ddp_begin_backward(ddp);
    forward_backward(m, rank, 0, sc->world);
    ASSERT_OK(td_ddp_wait(ddp));
    td_model_zero_grads(m);
    td_ddp_begin_backward(ddp);
    if (rank == 1) kill(getpid(), SIGKILL);
    forward_backward(m, rank, 1, sc->world);
    double t0 = td_now_s();
    td_status st = td_ddp_wait(ddp);
    g_out->fail_s[rank] = td_now_s() - t0;
    g_out->status[rank] = st;
    snprintf(g_out->msg[rank], sizeof g_out->msg[rank], "%s", td_error_msg());
    /* the group stays failed: the next step fails at once instead of hanging */
    td_ddp_begin_backward(ddp);
    ASSERT(td_ddp_wait(ddp) != TD_OK);
    td_ddp_free(ddp);
    td_model_free(m);
    td_pg_free(pg);
    td_store_close(store);
}

typedef void (*body_fn)(const scenario *, int);

/* The store server runs in a child process of its own, so that this process has no other
 * threads when it forks ranks: a fork while the server thread holds an allocator lock leaves the
 * rank with a lock nobody will release (seen with ASan's allocator). The server lives until this
 * process exits and the lifetime pipe closes, whatever way the test ends. */
static void start_store_process(void) {
    int port_pipe[2], life_pipe[2];
    ASSERT(pipe(port_pipe) == 0 && pipe(life_pipe) == 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(port_pipe[0]);
        close(life_pipe[1]);
        td_store_server_t *srv;
        ASSERT_OK(td_store_server_start("127.0.0.1", 0, TOKEN, &srv));
        int port = td_store_server_port(srv);
        ASSERT(write(port_pipe[1], &port, sizeof port) == (ssize_t)sizeof port);
        char c;
        while (read(life_pipe[0], &c, 1) != 0) {
        }
        td_store_server_stop(srv);
        _exit(0);
    }
    close(port_pipe[1]);
    close(life_pipe[0]); /* the write end stays open, unused, until this process exits */
    ASSERT(read(port_pipe[0], &g_port, sizeof g_port) == (ssize_t)sizeof g_port);
    close(port_pipe[0]);
}

/* Forks one process per rank and waits; expect_killed >= 0 is the rank expected to die. */
static void run(const scenario *sc, body_fn body, int expect_killed) {
    g_scenario++;
    memset(g_out, 0, sizeof *g_out);
    pid_t pids[MAXW];
    double t0 = td_now_s();
    fflush(stdout);
    for (int r = 0; r < sc->world; r++) {
        pids[r] = fork();
        ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            alarm(120);
            char pre[32];
            snprintf(pre, sizeof pre, "[rank %d] ", r);
            td_log_set_prefix(pre);
            body(sc, r);
            fflush(stdout);
            _exit(0);
        }
    }
    for (int r = 0; r < sc->world; r++) {
        int ws;
        ASSERT_EQ(waitpid(pids[r], &ws, 0), pids[r]);
        if (r == expect_killed) {
            if (!WIFSIGNALED(ws) || WTERMSIG(ws) != SIGKILL)
                TEST_FAIL("%s: rank %d should have died by SIGKILL (wait status 0x%x)", sc->name, r,
                          ws);
            continue;
        }
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            TEST_FAIL("scenario %s (world %d): rank %d failed (wait status 0x%x)", sc->name,
                      sc->world, r, ws);
    }
    printf("  %-34s world %d: ok (%.2f s)\n", sc->name, sc->world, td_now_s() - t0);
    fflush(stdout);
}

int main(void) {
    td_set_num_threads(1);
    g_out = mmap(NULL, sizeof *g_out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT(g_out != MAP_FAILED);
    start_store_process();

    /* tiny caps: the first bucket takes only fc3 (340 B), each later one a single layer */
    const size_t tiny = 64, tiny_first = 400;
    scenario sums[] = {
        {"sum, default buckets, shm", 2, TD_TRANSPORT_SHM, 0, 0},
        {"sum, default buckets, shm", 3, TD_TRANSPORT_SHM, 0, 0},
        {"sum, one bucket per layer, shm", 4, TD_TRANSPORT_SHM, tiny, tiny_first},
        {"sum, one bucket per layer, tcp", 3, TD_TRANSPORT_TCP, tiny, tiny_first},
        {"sum, one process", 1, TD_TRANSPORT_AUTO, tiny, tiny_first},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(sums); i++) run(&sums[i], body_sum, -1);
    scenario nohook = {"buckets launched by wait", 3, TD_TRANSPORT_SHM, tiny, tiny_first};
    run(&nohook, body_no_hook, -1);
    scenario overlap = {"buckets leave during backward", 3, TD_TRANSPORT_SHM, tiny, tiny_first};
    run(&overlap, body_overlap, -1);
    scenario drift = {"check_params names the drifted rank", 3, TD_TRANSPORT_SHM, 0, 0};
    run(&drift, body_drift_2, -1);
    run(&drift, body_drift_0, -1);

    scenario death = {"rank killed mid-step", 3, TD_TRANSPORT_SHM, tiny, tiny_first};
    for (int k = 0; k < 2; k++) {
        death.transport = k ? TD_TRANSPORT_TCP : TD_TRANSPORT_SHM;
        death.name = k ? "rank killed mid-step, tcp" : "rank killed mid-step, shm";
        run(&death, body_death, 1);
        for (int r = 0; r < 3; r += 2) {
            printf("    rank %d: td_ddp_wait returned %s after %.3f s: %s\n", r,
                   td_status_name((td_status)g_out->status[r]), g_out->fail_s[r], g_out->msg[r]);
            if (g_out->status[r] != TD_ERR_PEER)
                TEST_FAIL("rank %d: td_ddp_wait returned %s (%s), expected TD_ERR_PEER", r,
                          td_status_name((td_status)g_out->status[r]), g_out->msg[r]);
            ASSERT_CONTAINS(g_out->msg[r], "gradient bucket");
            ASSERT_CONTAINS(g_out->msg[r], "rank 1");
            /* a hang would run into the 60 s collective timeout (TD_ERR_TIMEOUT above) */
            ASSERT(g_out->fail_s[r] < COMM_MS / 1000.0 / 2);
        }
    }
    TEST_PASS();
}
