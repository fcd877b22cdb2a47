/* launch internals: the stall check's rule (src/launch/stall.c) on hand-written progress records
 * and node heartbeats in a real store, one case at a time, with a stall time of 0.8 s. Live ranks
 * get a new heartbeat before every check; a silent one gets none. The whole-process behaviour
 * (SIGSTOP, restarts, two launchers) is in test_launch_stall.py and test_launch_stall_nodes.py. */
#include "test.h"

#include <time.h>

#include "launch/stall.h"

#define STALL_S 0.8
#define MAX_W   8

static td_store_t *g_store;
static int g_case;

typedef struct {
    td_pg_progress p[MAX_W];
    bool silent[MAX_W]; /* no new heartbeat */
    bool moving[MAX_W]; /* steps go up every round: data moves */
    int world, nlocal, node, nnodes;
    char run_id[32], ns[64];
    td__workers ws;
    /* node 1's heartbeat, written by hand when nnodes == 2 */
    bool remote_silent;
    long long remote_quiet_ms;
    uint64_t remote_counter;
} scene;

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void set(scene *sc, int r, uint64_t started, uint64_t finished, td_pg_state state) {
    td_pg_progress *p = &sc->p[r];
    p->started = started;
    p->finished = finished;
    p->state = state;
    p->pid = 1000 + r;
    snprintf(p->op, sizeof p->op, "%s", started ? "allreduce" : "");
}

static void scene_init(scene *sc, int world, int nlocal, int nnodes) {
    memset(sc, 0, sizeof *sc);
    sc->world = world;
    sc->nlocal = nlocal;
    sc->nnodes = nnodes;
    g_case++;
    snprintf(sc->run_id, sizeof sc->run_id, "case%d", g_case);
    snprintf(sc->ns, sizeof sc->ns, "tandem.launch/case%d/attempt0", g_case);
    sc->ws.n = nlocal;
    sc->ws.w = td_xcalloc((size_t)nlocal, sizeof *sc->ws.w);
    for (int i = 0; i < nlocal; i++) {
        sc->ws.w[i].pid = 1000 + i;
        sc->ws.w[i].running = true;
    }
}

static void write_records(scene *sc) {
    for (int r = 0; r < sc->nlocal; r++) {
        if (sc->silent[r] && sc->p[r].beat) continue;
        sc->p[r].beat++;
        if (sc->moving[r]) sc->p[r].steps++;
        char key_v[256], *key = td_pg_progress_key(sc->run_id, 0, r);
        td_pg_progress_format(&sc->p[r], key_v, sizeof key_v);
        ASSERT_OK(td_store_set(g_store, key, key_v, strlen(key_v)));
        free(key);
    }
    if (sc->nnodes < 2 || (sc->remote_silent && sc->remote_counter)) return;
    /* Node 1 holds ranks nlocal..world-1, as its agent would write them. */
    char buf[2048], rec[256], key[128];
    size_t off = (size_t)snprintf(buf, sizeof buf, "tdhb1 %llu %d fakehost\n",
                                  (unsigned long long)++sc->remote_counter, sc->world - sc->nlocal);
    for (int r = sc->nlocal; r < sc->world; r++) {
        if (!sc->silent[r]) sc->p[r].beat++;
        td_pg_progress_format(&sc->p[r], rec, sizeof rec);
        off += (size_t)snprintf(buf + off, sizeof buf - off, "%d %d 0 %lld %s\n", r, 4200 + r,
                                sc->silent[r] ? sc->remote_quiet_ms : 0, rec);
    }
    snprintf(key, sizeof key, "%s/beat/1", sc->ns);
    ASSERT_OK(td_store_set(g_store, key, buf, off));
}

/* Runs rounds for up to max_s; returns the cause (static buffer, "" for none). */
static const char *run(scene *sc, double max_s) {
    static char cause[512];
    td__stall_params sp = {.store = g_store,
                           .ns = sc->ns,
                           .run_id = sc->run_id,
                           .restart = 0,
                           .node = 0,
                           .nnodes = sc->nnodes,
                           .rank_offset = 0,
                           .nlocal = sc->nlocal,
                           .world_size = sc->world,
                           .timeout_s = STALL_S,
                           .monitor_s = 0.01};
    td__stall *s = td__stall_new(&sp);
    double end = td_now_s() + max_s;
    cause[0] = '\0';
    while (td_now_s() < end) {
        write_records(sc);
        ASSERT_OK(td__stall_check(s, &sc->ws, cause, sizeof cause));
        if (cause[0]) break;
        sleep_ms(30);
    }
    td__stall_free(s);
    free(sc->ws.w);
    printf("case %d: %s\n", g_case, cause[0] ? cause : "(no stall)");
    return cause;
}

#define IN(sc, r, seq)   set(sc, r, (seq) + 1, (seq), TD_PG_INSIDE)
#define PAST(sc, r, seq) set(sc, r, (seq) + 1, (seq) + 1, TD_PG_BETWEEN)
#define NO_STALL(sc)     ASSERT_STREQ(run(sc, 3 * STALL_S), "")
#define STALL(sc, ...)                                                                             \
    do {                                                                                           \
        const char *c_ = run(sc, 6 * STALL_S);                                                     \
        const char *want_[] = {__VA_ARGS__};                                                       \
        ASSERT(c_[0]);                                                                             \
        for (size_t i_ = 0; i_ < TD_ARRAY_LEN(want_); i_++) ASSERT_CONTAINS(c_, want_[i_]);        \
    } while (0)

int main(void) {
    td_store_server_t *srv = NULL;
    ASSERT_OK(td_store_server_start("127.0.0.1", 0, "tok", &srv));
    ASSERT_OK(td_store_connect("127.0.0.1", td_store_server_port(srv), "tok", 5000, &g_store));
    scene sc;

    /* The record format: round trip, and garbage refused by name. */
    td_pg_progress a = {.beat = 7,
                        .started = 12,
                        .finished = 11,
                        .steps = 3,
                        .op = "broadcast",
                        .state = TD_PG_INSIDE,
                        .pid = 99},
                   b;
    char text[256];
    td_pg_progress_format(&a, text, sizeof text);
    ASSERT_OK(td_pg_progress_parse(text, strlen(text), &b));
    ASSERT(b.beat == 7 && b.started == 12 && b.finished == 11 && b.steps == 3 && b.pid == 99);
    ASSERT_STREQ(b.op, "broadcast");
    ASSERT_EQ(b.state, TD_PG_INSIDE);
    ASSERT_STATUS(td_pg_progress_parse("tdp1 1 2 3", 10, &b), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "is not a progress record");
    ASSERT_STATUS(td_pg_progress_parse("tdp1 1 2 3 0 allreduce inside 5", 31, &b), TD_ERR_FORMAT);
    char *key = td_pg_progress_key("job", 3, 5);
    ASSERT_STREQ(key, "tandem/job/restart3/pg/progress/5");
    free(key);

    /* Everyone between collectives (an evaluation, a checkpoint on every rank): no stall. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) PAST(&sc, r, 9);
    NO_STALL(&sc);

    /* Rank 2 busy between collectives while the others wait in the next one: no stall. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) IN(&sc, r, 10);
    PAST(&sc, 2, 9);
    NO_STALL(&sc);

    /* The same rank silent (its process stopped): a stall naming it, its seq, the others'. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) IN(&sc, r, 10);
    PAST(&sc, 2, 9);
    sc.silent[2] = true;
    STALL(&sc, "stall: rank 2 on node 0 (", "pid 1002) is at allreduce seq 9 (finished it; between",
          "the others at allreduce seq 10 (inside it); no progress for",
          "rank 2's process sent no heartbeat", "(--stall-timeout 0.8)");

    /* Rank 2 alive but inside an earlier collective the others are past: stuck. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) IN(&sc, r, 10);
    IN(&sc, 2, 9);
    STALL(&sc, "stall: rank 2 on node 0",
          "is at allreduce seq 9 (inside it), the others at "
          "allreduce seq 10 (inside it)");

    /* Everyone inside one collective, all alive, nothing moves: a stall of the whole group. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) IN(&sc, r, 10);
    STALL(&sc, "stall: all 4 ranks are at allreduce seq 10 (inside it) and no data moved");

    /* ... but data moving inside a long collective is progress. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) IN(&sc, r, 10);
    sc.moving[1] = true;
    NO_STALL(&sc);

    /* Everyone inside one collective and rank 3 silent: rank 3 holds it up. */
    scene_init(&sc, 4, 4, 1);
    for (int r = 0; r < 4; r++) IN(&sc, r, 10);
    sc.silent[3] = true;
    STALL(&sc, "stall: rank 3 on node 0",
          "is at allreduce seq 10 (inside it), the others at "
          "allreduce seq 10 (inside it)",
          "sent no heartbeat");

    /* A silent rank's last report lags (a sample, a heartbeat old): the others' progress bounds
     * where it really is. */
    scene_init(&sc, 2, 2, 1);
    IN(&sc, 0, 10);
    PAST(&sc, 1, 2);
    sc.silent[1] = true;
    STALL(&sc, "stall: rank 1 on node 0", "is at seq 9 or just past it (its last report, ",
          "was allreduce seq 2), the other at allreduce seq 10 (inside it)");

    /* The others grouped by where they are. */
    scene_init(&sc, 6, 6, 1);
    for (int r = 0; r < 6; r++) IN(&sc, r, 10);
    PAST(&sc, 1, 9);
    PAST(&sc, 4, 9);
    IN(&sc, 5, 9);
    STALL(&sc, "stall: rank 5 on node 0",
          "is at allreduce seq 9 (inside it), ranks 0,2-3 at "
          "allreduce seq 10 (inside it); ranks 1,4 at allreduce "
          "seq 9 (finished it; between collectives)");

    /* A rank whose process exited is not waited for; ranks without a record are not judged. */
    scene_init(&sc, 3, 3, 1);
    IN(&sc, 0, 5);
    PAST(&sc, 1, 4);
    sc.silent[1] = true;
    sc.ws.w[1].running = false;
    PAST(&sc, 2, 4);
    NO_STALL(&sc); /* rank 2, the one left behind, is alive and between collectives */

    /* A rank with no record may be the one everyone waits for: only silence is proof then. */
    scene_init(&sc, 3, 3, 1);
    for (int r = 0; r < 3; r++) IN(&sc, r, 7);
    sc.p[2].beat = 1; /* never written: write_records skips a silent rank once it has a beat */
    sc.silent[2] = true;
    NO_STALL(&sc);

    /* Two nodes: node 1's agent heartbeats, its rank 1 is busy: no stall; this node publishes
     * its own heartbeat with its rank's record. */
    scene_init(&sc, 2, 1, 2);
    IN(&sc, 0, 5);
    PAST(&sc, 1, 4);
    NO_STALL(&sc);
    {
        char k[128];
        void *v = NULL;
        size_t n = 0;
        snprintf(k, sizeof k, "%s/beat/0", sc.ns);
        ASSERT_OK(td_store_get(g_store, k, &v, &n, 0));
        ASSERT(!strncmp(v, "tdhb1 ", 6));
        ASSERT_CONTAINS(v, "\n0 1000 0 ");
        ASSERT_CONTAINS(v, " allreduce inside 1000\n");
        free(v);
    }

    /* ... node 1's rank 1 silent (its agent says so) while its agent is alive. */
    scene_init(&sc, 2, 1, 2);
    IN(&sc, 0, 5);
    PAST(&sc, 1, 4);
    sc.silent[1] = true;
    sc.remote_quiet_ms = 5000;
    STALL(&sc, "stall: rank 1 on node 1 (fakehost, pid 4201) is at allreduce seq 4",
          "the other at allreduce seq 5 (inside it)", "sent no heartbeat for");

    /* ... node 1's agent stops heartbeating: named, with where its rank was. */
    scene_init(&sc, 2, 1, 2);
    IN(&sc, 0, 5);
    PAST(&sc, 1, 4);
    sc.remote_silent = true;
    STALL(&sc, "stall: the node agent of node 1 (fakehost) has not updated its heartbeat for",
          "its rank 1 was last seen at allreduce seq 4 (finished it; between collectives)");

    /* ... or never published one at all. */
    scene_init(&sc, 2, 1, 2);
    IN(&sc, 0, 5);
    sc.remote_silent = true;
    sc.remote_counter = 1; /* as if written once: write_records skips it from the start */
    STALL(&sc, "stall: the node agent of node 1 published no heartbeat in the");

    td_store_close(g_store);
    td_store_server_stop(srv);
    TEST_PASS();
}
