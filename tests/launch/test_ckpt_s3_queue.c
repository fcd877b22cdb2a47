/* launch: the S3 checkpoint mirror's uploads (src/launch/ckpt_s3.c) as work on the agent's loop
 * (td_loop_queue_work), against moto behind a proxy that can hold an upload mid-transfer
 * (tests/launch/s3_gate.py: its request log and boto3 are the references):
 * 1. while an upload is held, the loop goes on turning (a timer ticks 10 times; the gate opens
 *    only then, so a loop stuck in the upload fails here, once curl gives up after 30 s), the
 *    upload is the loop's one item of work, and S3 has had no commit for it (objects first);
 * 2. the agent's end with that upload in flight: it waits for it, then uploads the newest
 *    checkpoint; the proxy saw object, commit, object, commit, in that order (one upload at a
 *    time, each object before its commit), and boto3 finds each object equal to the local file
 *    and its commit naming its size and SHA-256;
 * 3. teardown (td__ckpt_s3_free) with an upload held: it waits for the upload, which is
 *    committed, and leaves no work on the loop to call back into the freed mirror.
 * Skips (77) without the venv's moto_server and boto3 (scripts/venv.sh). */
#include "test.h"
#include "launch/s3_gate.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch/launch_internal.h"
#include "tandem/loop.h"

static char dir[256], ckdir[300], gate[300], requests[300], python[512], script[512];
static int moto_port;
static atomic_int ticks;

static void tick(td_loop *l, void *user) {
    (void)l, (void)user;
    atomic_fetch_add(&ticks, 1);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
    fclose(f);
    return s;
}

static bool log_has(const char *needle) {
    char *s = slurp(requests);
    bool has = strstr(s, needle) != NULL;
    free(s);
    return has;
}

/* A checkpoint as the trainer writes one: aside, then renamed into place (committed). */
static void write_ckpt(const char *name, size_t nbytes, unsigned seed) {
    char tmp[400], path[400];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", ckdir, name);
    snprintf(path, sizeof path, "%s/%s", ckdir, name);
    FILE *f = fopen(tmp, "wb");
    ASSERT(f != NULL);
    for (size_t i = 0; i < nbytes; i++) fputc((int)((i * 2654435761u + seed) >> 13) & 0xff, f);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_EQ(rename(tmp, path), 0);
}

static void set_gate(bool closed) {
    if (closed) {
        FILE *f = fopen(gate, "w");
        ASSERT(f != NULL);
        fclose(f);
    } else {
        unlink(gate);
    }
}

/* The gate's keeper, on a thread of its own: once the proxy holds the upload of `held`, it waits
 * for the loop to tick 10 more times (it cannot while the loop's thread is stuck in the upload),
 * says so (turned), and opens the gate a moment later, when the main thread has gone to wait
 * for the upload (whichever comes first, the assertions are the same: the wait covers a
 * running upload and one that ended and was not handed to its after() yet). */
static atomic_bool turned;

static void *keeper(void *arg) {
    char needle[300];
    snprintf(needle, sizeof needle, "HELD /ckpts/run/%s", (const char *)arg);
    while (!log_has(needle)) usleep(20000);
    int t0 = atomic_load(&ticks);
    while (atomic_load(&ticks) < t0 + 10) usleep(10000);
    atomic_store(&turned, true);
    usleep(100000);
    set_gate(false);
    return NULL;
}

/* Turns the loop until the keeper saw it turn with the upload held; then that upload is the
 * loop's one item of work, and still held (the gate opens only after this). */
static void turn_while_held(td_loop *l, const char *name) {
    for (double t0 = td_now_s(); !atomic_load(&turned);) {
        ASSERT_OK(td_loop_turn(l, 0.02));
        if (td_now_s() - t0 > 120) TEST_FAIL("the proxy never held the upload of %s", name);
    }
    if (td_loop_work_pending(l) != 1)
        TEST_FAIL("the upload of %s is not work on the loop's threads (%zu items); the loop "
                  "turned only after the upload on its own thread gave up",
                  name, td_loop_work_pending(l));
    char put[300];
    snprintf(put, sizeof put, "PUT /ckpts/run/%s\n", name);
    if (log_has(put)) TEST_FAIL("the upload of %s went through while the gate was closed", name);
}

/* boto3: s3://ckpts/run/NAME holds ckdir/NAME's bytes and its commit names them. */
static void verify(const char *name) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' '%s' verify %d run/%s '%s/%s'", python, script, moto_port, name,
             ckdir, name);
    if (system(cmd) != 0) TEST_FAIL("boto3 does not find %s committed whole (%s)", name, cmd);
}

/* The PUT lines of the proxy's log, in order, joined by spaces (keys only). */
static char *puts_in_order(void) {
    char *s = slurp(requests);
    size_t cap = strlen(s) + 1, len = 0;
    char *out = calloc(1, cap);
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "PUT ", 4)) continue;
        const char *key = strstr(line, "/run/");
        key = key ? key + 5 : line + 4;
        len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? " " : "", key);
    }
    free(s);
    return out;
}

int main(void) {
    const char *src = TD_TEST_SOURCE_DIR;
    snprintf(python, sizeof python, "%s/.venv/bin/python", src);
    snprintf(script, sizeof script, "%s/tests/launch/s3_gate.py", src);
    char moto[600];
    snprintf(moto, sizeof moto, "%s/.venv/bin/moto_server", src);
    if (access(moto, X_OK) != 0) {
        printf("SKIP: no %s (scripts/venv.sh)\n", moto);
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/td_ckpt_s3_queue_XXXXXX");
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    snprintf(gate, sizeof gate, "%s/gate", dir);
    snprintf(requests, sizeof requests, "%s/requests", dir);
    ASSERT_EQ(mkdir(ckdir, 0755), 0);

    pid_t gate_pid = s3_gate_start(python, script, dir, &moto_port);
    char url[64];
    snprintf(url, sizeof url, "s3://ckpts/run");
    setenv(td_var_name(TD_VAR_TANDEM_CHECKPOINT_URL), url, 1);
    setenv(td_var_name(TD_VAR_TANDEM_CHECKPOINT_DIR), ckdir, 1);

    td_loop *loop = NULL;
    ASSERT_OK(td_loop_new(&loop));
    td_loop_timer(loop, 0.01, 0.01, tick, NULL);

    /* 1. an upload held mid-transfer: the loop turns on */
    set_gate(true);
    write_ckpt("ckpt-10.tdck", 300000, 1);
    td__ckpt_s3 *s = NULL;
    ASSERT_OK(td__ckpt_s3_open(loop, false, true, &s));
    ASSERT(s != NULL);
    pthread_t kt;
    ASSERT_EQ(pthread_create(&kt, NULL, keeper, "ckpt-10.tdck"), 0);
    turn_while_held(loop, "ckpt-10.tdck");
    if (log_has(".commit"))
        TEST_FAIL("S3 got a commit while the first checkpoint's object was held: a commit went "
                  "before its object");

    /* 2. the agent ends with that upload in flight, a newer checkpoint waiting */
    write_ckpt("ckpt-20.tdck", 200000, 2);
    td__ckpt_s3_end(s);
    pthread_join(kt, NULL);
    ASSERT_EQ((int)td_loop_work_pending(loop), 0);
    char *order = puts_in_order();
    ASSERT_STREQ(order, "ckpt-10.tdck ckpt-10.tdck.commit ckpt-20.tdck ckpt-20.tdck.commit");
    free(order);
    verify("ckpt-10.tdck");
    verify("ckpt-20.tdck");
    td__ckpt_s3_free(s);

    /* 3. teardown with an upload held */
    ASSERT_OK(td__ckpt_s3_open(loop, false, true, &s));
    set_gate(true);
    atomic_store(&turned, false);
    write_ckpt("ckpt-30.tdck", 250000, 3);
    ASSERT_EQ(pthread_create(&kt, NULL, keeper, "ckpt-30.tdck"), 0);
    turn_while_held(loop, "ckpt-30.tdck");
    td__ckpt_s3_free(s);
    pthread_join(kt, NULL);
    ASSERT_EQ((int)td_loop_work_pending(loop), 0);
    int t0 = atomic_load(&ticks);
    while (atomic_load(&ticks) < t0 + 3) ASSERT_OK(td_loop_turn(loop, 0.05));
    verify("ckpt-30.tdck");

    td_loop_free(loop);
    s3_gate_stop(gate_pid);
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_PASS();
}
