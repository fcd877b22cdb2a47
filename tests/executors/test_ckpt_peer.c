/* executors (launch): node 0's agent hands the resume checkpoint to the other nodes through the
 * rendezvous store (src/launch/ckpt_peer.c), with 3 "nodes" as threads of this process, each
 * with its own checkpoint directory and store client, over a real store server on loopback.
 * Node 0 holds step 7 as two checkpoints: the SDK's step-7 file (9 MiB) and an HF
 * checkpoint-7/ directory (a nested 11 MiB file, an empty file, rng_state_0.pth,
 * trainer_state.json): 20 MiB, 5 pieces of 4 MiB, more than the 4 the store may hold at once,
 * so node 0 must retire pieces as the others take them. Node 1 holds nothing committed but the
 * uncommitted checkpoint-7/ its rank wrote (rng_state_1.pth); node 2 holds both committed
 * already. Asserts: node 1 gets every file byte for byte equal to node 0's (read back here with
 * plain stdio), keeps its rng_state_1.pth, has tandem's commit marker, and no staged leftover;
 * node 2 is not sent anything (it says so, and its files are untouched); no piece is left in
 * the store; a step node 0 does not hold offers nothing; an offer in a form this agent does not
 * read is refused naming the step. */
#include "test.h"

#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch/launch_internal.h"
#include "tandem/ckpt.h"
#include "tandem/comm.h"

static char root[256];
static int store_port;
static const char *token = "test-ckpt-peer";

static void write_bytes(const char *path, size_t nbytes, unsigned seed) {
    char *parent = td_xstrdup(path);
    *strrchr(parent, '/') = '\0';
    ASSERT_OK(td_mkdirs(parent));
    free(parent);
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < nbytes; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        fputc((int)(x & 0xff), f);
    }
    ASSERT_EQ(fclose(f), 0);
}

/* Whether two files hold the same bytes (plain stdio, not the code under test). */
static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = false;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static char *dir_of(int node) {
    return td_xasprintf("%s/node%d", root, node);
}

typedef struct {
    int node;
    int nnodes;
    int64_t step;
    td_status st;
    char msg[512];
} job;

static void *run_node(void *arg) {
    job *j = arg;
    td_store_t *store = NULL;
    j->st = td_store_connect("127.0.0.1", store_port, token, 10000, &store);
    char *dir = dir_of(j->node);
    td__rdzv_params p = {.store = store, .ns = "t/attempt1", .timeout_s = 60, .sig_fd = -1};
    if (j->st == TD_OK && j->node == 0) {
        j->st = td__ckpt_peer_offer(&p, dir, j->step);
        if (j->st == TD_OK) j->st = td__ckpt_peer_serve(&p, j->nnodes, dir, j->step);
    } else if (j->st == TD_OK) {
        j->st = td__ckpt_peer_fetch(&p, j->node, dir, j->step);
    }
    if (j->st != TD_OK) snprintf(j->msg, sizeof j->msg, "%s", td_error_msg());
    if (store) td_store_close(store);
    free(dir);
    return NULL;
}

static void run_nodes(int nnodes, int64_t step, job *jobs) {
    pthread_t th[3];
    for (int i = 0; i < nnodes; i++) {
        jobs[i] = (job){.node = i, .nnodes = nnodes, .step = step};
        ASSERT_EQ(pthread_create(&th[i], NULL, run_node, &jobs[i]), 0);
    }
    for (int i = 0; i < nnodes; i++) pthread_join(th[i], NULL);
}

static void expect_same(int node, const char *rel) {
    char *a = td_xasprintf("%s/node0/%s", root, rel), *b = td_xasprintf("%s/node%d/%s", root, node,
                                                                          rel);
    if (!same_file(a, b)) TEST_FAIL("%s differs from node 0's %s", b, a);
    free(a);
    free(b);
}

static int hidden_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static void test_transfer(void) {
    const char *sdk = "step-000000000007.pt";
    char *p;
    /* node 0: the committed checkpoints of step 7, and an older one that is not offered */
    p = td_xasprintf("%s/node0/%s", root, sdk), write_bytes(p, 9u << 20, 1), free(p);
    p = td_xasprintf("%s/node0/step-000000000003.pt", root), write_bytes(p, 1000, 2), free(p);
    p = td_xasprintf("%s/node0/checkpoint-7/sub/model.bin", root), write_bytes(p, 11u << 20, 3),
    free(p);
    p = td_xasprintf("%s/node0/checkpoint-7/empty.txt", root), write_bytes(p, 0, 4), free(p);
    p = td_xasprintf("%s/node0/checkpoint-7/rng_state_0.pth", root), write_bytes(p, 333, 5),
    free(p);
    p = td_xasprintf("%s/node0/checkpoint-7/trainer_state.json", root), write_bytes(p, 77, 6),
    free(p);
    /* node 1: only what its own rank wrote into the uncommitted checkpoint-7/ */
    p = td_xasprintf("%s/node1/checkpoint-7/rng_state_1.pth", root), write_bytes(p, 444, 7),
    free(p);
    /* node 2: both committed already (a shared disk, or an earlier transfer) */
    p = td_xasprintf("%s/node2/%s", root, sdk), write_bytes(p, 10, 8), free(p);
    p = td_xasprintf("%s/node2/checkpoint-7/trainer_state.json", root), write_bytes(p, 5, 9),
    free(p);

    job jobs[3];
    run_nodes(3, 7, jobs);
    for (int i = 0; i < 3; i++)
        if (jobs[i].st != TD_OK) TEST_FAIL("node %d: %s", i, jobs[i].msg);

    expect_same(1, sdk);
    expect_same(1, "checkpoint-7/sub/model.bin");
    expect_same(1, "checkpoint-7/empty.txt");
    expect_same(1, "checkpoint-7/rng_state_0.pth");
    expect_same(1, "checkpoint-7/trainer_state.json");
    p = td_xasprintf("%s/node1/step-000000000003.pt", root);
    ASSERT(access(p, F_OK) != 0); /* not the step every rank resumes from */
    free(p);
    p = td_xasprintf("%s/node1/checkpoint-7/rng_state_1.pth", root);
    struct stat sb;
    ASSERT_EQ(stat(p, &sb), 0);
    ASSERT_EQ((long long)sb.st_size, 444); /* this node's rank's RNG state, kept */
    free(p);
    p = td_xasprintf("%s/node1/checkpoint-7/" TD_CKPT_MARKER, root);
    ASSERT_EQ(access(p, F_OK), 0);
    free(p);
    char *d1 = dir_of(1);
    ASSERT_EQ(hidden_entries(d1), 0); /* nothing staged left behind */
    ASSERT(td_ckpt_committed(d1, "checkpoint-7", NULL));
    free(d1);
    /* node 2 was sent nothing: its own bytes are still there */
    p = td_xasprintf("%s/node2/%s", root, sdk);
    ASSERT_EQ(stat(p, &sb), 0);
    ASSERT_EQ((long long)sb.st_size, 10);
    free(p);

    /* no piece left in the store */
    td_store_t *store = NULL;
    ASSERT_OK(td_store_connect("127.0.0.1", store_port, token, 10000, &store));
    for (int k = 0; k < 6; k++) {
        char key[64];
        void *v = NULL;
        size_t n = 0;
        snprintf(key, sizeof key, "t/attempt1/ckpt/chunk/%d", k);
        td_status st = td_store_get(store, key, &v, &n, 0);
        if (st == TD_OK) TEST_FAIL("piece %d is still in the store (%zu bytes)", k, n);
        td_error_clear();
    }
    /* an offer this agent does not read: refused, naming the step */
    ASSERT_OK(td_store_set(store, "t/bad/ckpt/offer", "tandem-ckpt-offer 9 1 5 4194304\n", 32));
    td__rdzv_params bad = {.store = store, .ns = "t/bad", .timeout_s = 5, .sig_fd = -1};
    char *d2 = dir_of(2);
    ASSERT_STATUS(td__ckpt_peer_fetch(&bad, 1, d2, 7), TD_ERR_PROTOCOL);
    ASSERT_CONTAINS(td_error_msg(), "step 7");
    td_error_clear();
    free(d2);
    td_store_close(store);
}

/* A step node 0 does not hold: an empty offer, nothing waits, nothing is written. */
static void test_nothing_to_send(void) {
    td_store_t *store = NULL;
    ASSERT_OK(td_store_connect("127.0.0.1", store_port, token, 10000, &store));
    char *d0 = dir_of(0), *d1 = td_xasprintf("%s/empty1", root);
    td__rdzv_params p = {.store = store, .ns = "t/none", .timeout_s = 5, .sig_fd = -1};
    ASSERT_OK(td__ckpt_peer_offer(&p, d0, 99));
    ASSERT_OK(td__ckpt_peer_serve(&p, 2, d0, 99));
    ASSERT_OK(td__ckpt_peer_fetch(&p, 1, d1, 99));
    ASSERT(access(d1, F_OK) != 0);
    free(d0);
    free(d1);
    td_store_close(store);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tandem-ckpt-peer-XXXXXX");
    ASSERT(mkdtemp(root));
    td_store_server_t *srv = NULL;
    ASSERT_OK(td_store_server_start("127.0.0.1", 0, token, &srv));
    store_port = td_store_server_port(srv);
    test_transfer();
    test_nothing_to_send();
    td_store_server_stop(srv);
    char *cmd = td_xasprintf("rm -rf '%s'", root);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    printf("test_ckpt_peer: ok\n");
    return 0;
}
