/* launch: another node's own files of a directory checkpoint in S3 (src/launch/ckpt_s3_ranks.c),
 * against moto behind tests/launch/s3_gate.py (its request log and boto3, through
 * tests/launch/ckpt_ranks_ref.py, are the references). Node 1's checkpoint-10/ holds, as the HF
 * Trainer leaves it there, its rank's rng_state_1.pth and a file node 0's commit names too:
 * 1. while node 0's commit of checkpoint-10 is not in S3, the scan asks for it (GET) and puts
 *    nothing; an older checkpoint-5/ never goes up;
 * 2. once node 0's commit is there, only rng_state_1.pth goes up, its object before the
 *    addendum PREFIX/checkpoint-10/.tandem-node-1.commit, which boto3 finds naming its size and
 *    hashlib's SHA-256;
 * 3. a replacement (checkpoint-10/ as restored from node 0's copy, no rng_state_1.pth): the
 *    restore puts it back with the uploaded bytes;
 * 4. an object that differs from the addendum is not restored (nothing left in its place), and a
 *    missing addendum restores nothing; neither fails;
 * 5. the agent's end uploads the newest checkpoint's files at once (its workers are gone).
 * Skips (77) without the venv's moto_server and boto3 (scripts/venv.sh). */
#include "test.h"
#include "launch/s3_gate.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch/launch_internal.h"
#include "tandem/cloud.h"
#include "tandem/loop.h"

static char dir[256], ckdir[300], requests[300], python[512], ref[512];
static int moto_port;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    s[n] = '\0';
    if (len) *len = (size_t)n;
    fclose(f);
    return s;
}

static bool log_has(const char *needle) {
    char *s = slurp(requests, NULL);
    bool has = strstr(s, needle) != NULL;
    free(s);
    return has;
}

static void write_file(const char *rel, size_t nbytes, unsigned seed) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", ckdir, rel);
    char *parent = strdup(path);
    *strrchr(parent, '/') = '\0';
    mkdir(parent, 0755);
    free(parent);
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    for (size_t i = 0; i < nbytes; i++) fputc((int)((i * 2654435761u + seed) >> 13) & 0xff, f);
    ASSERT_EQ(fclose(f), 0);
}

static void ref_ok(const char *args, const char *what) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s", python, ref, args);
    if (system(cmd) != 0) TEST_FAIL("%s (%s)", what, cmd);
}

/* Turns the loop until the proxy's log holds needle and no work is left (its after() ran). */
static void turn_until(td_loop *l, const char *needle) {
    for (double t0 = td_now_s(); !log_has(needle) || td_loop_work_pending(l);) {
        ASSERT_OK(td_loop_turn(l, 0.05));
        if (td_now_s() - t0 > 120) TEST_FAIL("no '%s' in %s after 120 s", needle, requests);
    }
}

static bool same_bytes(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = na == nb && na > 0 && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

int main(void) {
    const char *src = TD_TEST_SOURCE_DIR;
    snprintf(python, sizeof python, "%s/.venv/bin/python", src);
    snprintf(ref, sizeof ref, "%s/tests/launch/ckpt_ranks_ref.py", src);
    char moto[600], gate_py[600];
    snprintf(moto, sizeof moto, "%s/.venv/bin/moto_server", src);
    snprintf(gate_py, sizeof gate_py, "%s/tests/launch/s3_gate.py", src);
    if (access(moto, X_OK) != 0) {
        printf("SKIP: no %s (scripts/venv.sh)\n", moto);
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/td_ckpt_s3_ranks_XXXXXX");
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    snprintf(requests, sizeof requests, "%s/requests", dir);
    ASSERT_EQ(mkdir(ckdir, 0755), 0);

    pid_t gate_pid = s3_gate_start(python, gate_py, dir, &moto_port);
    char args[1024];

    /* node 1's directory as the HF Trainer leaves it: its rank's RNG state in each checkpoint,
     * plus (here) a file node 0's commit names too */
    write_file("checkpoint-5/rng_state_1.pth", 14000, 5);
    write_file("checkpoint-10/rng_state_1.pth", 15000, 10);
    write_file("checkpoint-10/training_args.bin", 500, 11);
    td_loop *loop = NULL;
    ASSERT_OK(td_loop_new(&loop));
    td__ckpt_ranks *r = td__ckpt_ranks_start(loop, "s3://ckpts/run", "ckpts", "run/", ckdir, 1);

    /* 1. no commit of node 0's yet: asked for, nothing put */
    turn_until(loop, "GET /ckpts/run/checkpoint-10.commit");
    if (log_has("PUT "))
        TEST_FAIL("a file went up before node 0's commit of checkpoint-10 was in S3");

    /* 2. node 0's commit arrives: only what it lacks goes up, object before addendum */
    snprintf(args, sizeof args,
             "commit %d run/checkpoint-10 model.safetensors training_args.bin rng_state_0.pth",
             moto_port);
    ref_ok(args, "putting node 0's commit");
    turn_until(loop, "PUT /ckpts/run/checkpoint-10/.tandem-node-1.commit");
    {
        char *s = slurp(requests, NULL);
        char *obj = strstr(s, "PUT /ckpts/run/checkpoint-10/.tandem-node-1/rng_state_1.pth\n");
        char *add = strstr(s, "PUT /ckpts/run/checkpoint-10/.tandem-node-1.commit");
        if (!obj || obj > add) TEST_FAIL("the addendum went up before the file it names:\n%s", s);
        free(s);
    }
    snprintf(args, sizeof args, "verify %d run checkpoint-10 1 '%s/checkpoint-10' rng_state_1.pth",
             moto_port, ckdir);
    ref_ok(args, "boto3 does not find node 1's rng_state_1.pth committed whole");
    snprintf(args, sizeof args, "absent %d run/checkpoint-5/", moto_port);
    ref_ok(args, "the older checkpoint-5 went up");

    /* 3. a replacement node 1: checkpoint-10/ as restored from node 0's copy */
    char kept[700], rng[700], cmd[1600];
    snprintf(kept, sizeof kept, "%s/rng_state_1.pth.uploaded", dir);
    snprintf(rng, sizeof rng, "%s/checkpoint-10/rng_state_1.pth", ckdir);
    ASSERT_EQ(rename(rng, kept), 0);
    td_aws_t *aws = NULL;
    td_aws_opts o;
    memset(&o, 0, sizeof o);
    ASSERT_OK(td_aws_new(&o, &aws));
    td__ckpt_ranks_restore(r, aws, "checkpoint-10", 10);
    if (!same_bytes(rng, kept))
        TEST_FAIL("the restore did not put back node 1's rng_state_1.pth as uploaded (%s)", rng);

    /* 4. an object that differs from the addendum, and a missing addendum */
    ASSERT_EQ(unlink(rng), 0);
    snprintf(args, sizeof args, "tamper %d run/checkpoint-10/.tandem-node-1/rng_state_1.pth",
             moto_port);
    ref_ok(args, "tampering with the object");
    td__ckpt_ranks_restore(r, aws, "checkpoint-10", 10);
    if (access(rng, F_OK) == 0)
        TEST_FAIL("a file that differs from the addendum's SHA-256 was restored (%s)", rng);
    td__ckpt_ranks_restore(r, aws, "checkpoint-15", 15);
    snprintf(cmd, sizeof cmd, "%s/checkpoint-15", ckdir);
    if (access(cmd, F_OK) == 0) TEST_FAIL("a restore without an addendum made %s", cmd);
    td_aws_free(aws);

    /* 5. the agent's end (a spot notice's stop): the newest goes up at once, no second scan */
    write_file("checkpoint-20/rng_state_1.pth", 16000, 20);
    snprintf(args, sizeof args, "commit %d run/checkpoint-20 model.safetensors rng_state_0.pth",
             moto_port);
    ref_ok(args, "putting node 0's commit of checkpoint-20");
    td__ckpt_ranks_end(r);
    snprintf(args, sizeof args, "verify %d run checkpoint-20 1 '%s/checkpoint-20' rng_state_1.pth",
             moto_port, ckdir);
    ref_ok(args, "the agent's end did not upload node 1's files of checkpoint-20");

    td__ckpt_ranks_free(r);
    td_loop_free(loop);
    s3_gate_stop(gate_pid);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    TEST_PASS();
}
