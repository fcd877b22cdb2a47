/* train: checkpoint round trip, corruption (flipped byte, truncation, bad magic) refused with a
 * message naming the file, fallback to an older valid checkpoint, keep-last-2 pruning, and a
 * full disk (a 1 MiB tmpfs, when this process may mount one) failing cleanly. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/train.h"
#include "test.h"

enum { NP = 5000, NS = 2 * NP };

static float params[NP], state[NS];

static td_checkpoint make(int64_t step) {
    td_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    snprintf(ck.model, sizeof ck.model, "basicnet");
    ck.num_params = NP;
    ck.batch = 16;
    ck.accum = 2;
    ck.world_size = 1;
    ck.optim = td_optim_defaults(TD_OPTIM_ADAMW);
    ck.optim.lr = 0.1 / 3; /* not exactly representable: must still round-trip */
    ck.seed = 12345678901234ull;
    ck.step = step;
    ck.epoch = step / 10;
    ck.step_in_epoch = step % 10;
    ck.optim_steps = (uint64_t)step;
    for (int i = 0; i < NP; i++) params[i] = (float)step + (float)i * 0.001f;
    for (int i = 0; i < NS; i++) state[i] = -(float)i;
    ck.params = params;
    ck.optim_state = state;
    ck.optim_state_count = NS;
    return ck;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    ASSERT(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || strstr(e->d_name, ".tmp")) n++;
    closedir(d);
    return n;
}

static void flip_byte(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    ASSERT(f);
    ASSERT_EQ(fseek(f, offset, SEEK_SET), 0);
    int c = fgetc(f);
    ASSERT_EQ(fseek(f, offset, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    ASSERT_EQ(fclose(f), 0);
}

static void check_nospace(void) {
    char dir[] = "/tmp/td_test_ckpt_full_XXXXXX";
    ASSERT(mkdtemp(dir));
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0) {
        printf("note: cannot mount a small tmpfs (%s); skipping the full-disk check\n",
               strerror(errno));
        rmdir(dir);
        return;
    }
    /* 5000 + 10000 floats = 60 KB: the first fits; then fill the disk so the next cannot */
    td_checkpoint ck = make(1);
    ASSERT_OK(td_checkpoint_save(dir, &ck, 2));
    char *filler = td_xasprintf("%s/filler", dir);
    FILE *f = fopen(filler, "wb");
    ASSERT(f);
    static char block[4096];
    while (fwrite(block, 1, sizeof block, f) == sizeof block) {
    }
    fclose(f);
    /* leave ~20 KB: less than one checkpoint */
    ASSERT_EQ(truncate(filler, 1024 * 1024 - 80 * 1024), 0);
    ck = make(2);
    td_status st = td_checkpoint_save(dir, &ck, 2);
    ASSERT_EQ(st, TD_ERR_NOSPACE);
    ASSERT_CONTAINS(td_error_msg(), "ckpt-2.tdck");
    ASSERT_CONTAINS(td_error_msg(), "No space left on device");
    ASSERT_CONTAINS(td_error_msg(), "free space");
    /* the earlier checkpoint is intact and no temporary file is left behind */
    char *p1 = td_xasprintf("%s/ckpt-1.tdck", dir), *p2 = td_xasprintf("%s/ckpt-2.tdck", dir);
    td_checkpoint got;
    ASSERT_OK(td_checkpoint_load(p1, &got));
    ASSERT_EQ(got.step, 1);
    td_checkpoint_free(&got);
    ASSERT(access(p2, F_OK) != 0);
    ASSERT_EQ(count_files(dir), 2); /* ckpt-1 and the filler */
    ASSERT_EQ(umount(dir), 0);
    rmdir(dir);
    free(p1);
    free(p2);
    free(filler);
}

int main(void) {
    char dir[] = "/tmp/td_test_ckpt_XXXXXX";
    ASSERT(mkdtemp(dir));
    char *sub = td_xasprintf("%s/ck", dir); /* created by the first save */

    /* round trip */
    td_checkpoint ck = make(10);
    ASSERT_OK(td_checkpoint_save(sub, &ck, 2));
    char *p10 = td_xasprintf("%s/ckpt-10.tdck", sub);
    td_checkpoint got;
    ASSERT_OK(td_checkpoint_load(p10, &got));
    ASSERT_STREQ(got.model, "basicnet");
    ASSERT_EQ(got.num_params, NP);
    ASSERT_EQ(got.batch, 16);
    ASSERT_EQ(got.accum, 2);
    ASSERT_EQ(got.world_size, 1);
    ASSERT_EQ(got.seed, 12345678901234ull);
    ASSERT_EQ(got.step, 10);
    ASSERT_EQ(got.epoch, 1);
    ASSERT_EQ(got.step_in_epoch, 0);
    ASSERT_EQ(got.optim_steps, 10);
    ASSERT_EQ(got.optim.kind, TD_OPTIM_ADAMW);
    ASSERT(got.optim.lr == 0.1 / 3);
    ASSERT(got.optim.beta2 == 0.999);
    ASSERT_EQ(got.optim_state_count, NS);
    ASSERT_EQ(memcmp(got.params, params, sizeof params), 0);
    ASSERT_EQ(memcmp(got.optim_state, state, sizeof state), 0);
    td_checkpoint_free(&got);

    /* keep the last 2 */
    ck = make(20);
    ASSERT_OK(td_checkpoint_save(sub, &ck, 2));
    ck = make(30);
    ASSERT_OK(td_checkpoint_save(sub, &ck, 2));
    ASSERT(access(p10, F_OK) != 0);
    ASSERT_EQ(count_files(sub), 2);
    char *p20 = td_xasprintf("%s/ckpt-20.tdck", sub), *p30 = td_xasprintf("%s/ckpt-30.tdck", sub);

    /* the newest valid one is found */
    char *path = NULL;
    ASSERT_OK(td_checkpoint_find_latest(sub, &path, &got));
    ASSERT_STREQ(path, p30);
    ASSERT_EQ(got.step, 30);
    td_checkpoint_free(&got);
    free(path);

    /* a flipped byte in the params: refused, named, checksum shown */
    flip_byte(p30, 64 + 4096);
    ASSERT_STATUS(td_checkpoint_load(p30, &got), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "checkpoint ckpt-30.tdck is corrupt: checksum 0x");
    /* ... and the older valid one is used instead (with a warning on stderr) */
    ASSERT_OK(td_checkpoint_find_latest(sub, &path, &got));
    ASSERT_STREQ(path, p20);
    ASSERT_EQ(got.step, 20);
    ASSERT_EQ(got.params[0], 20.0f);
    td_checkpoint_free(&got);
    free(path);

    /* a flipped byte in the header's metadata lengths is caught by the same checksum */
    flip_byte(p20, 17);
    ASSERT_STATUS(td_checkpoint_load(p20, &got), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "ckpt-20.tdck is corrupt");
    /* every one corrupt: the newest one's error, with what to do */
    ASSERT_STATUS(td_checkpoint_find_latest(sub, &path, &got), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "ckpt-30.tdck is corrupt");
    ASSERT_CONTAINS(td_error_msg(), "delete it");
    ASSERT(path == NULL);

    /* truncated and wrong-magic files */
    ck = make(40);
    ASSERT_OK(td_checkpoint_save(sub, &ck, 5));
    char *p40 = td_xasprintf("%s/ckpt-40.tdck", sub);
    struct stat sb;
    ASSERT_EQ(stat(p40, &sb), 0);
    ASSERT_EQ(truncate(p40, sb.st_size - 3), 0);
    ASSERT_STATUS(td_checkpoint_load(p40, &got), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "ckpt-40.tdck is corrupt");
    ASSERT_CONTAINS(td_error_msg(), "truncated");
    ASSERT_EQ(truncate(p40, 10), 0);
    ASSERT_STATUS(td_checkpoint_load(p40, &got), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "shorter than its");
    ck = make(40);
    ASSERT_OK(td_checkpoint_save(sub, &ck, 5));
    flip_byte(p40, 0);
    ASSERT_STATUS(td_checkpoint_load(p40, &got), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "bad magic");
    char *missing = td_xasprintf("%s/ckpt-99.tdck", sub);
    ASSERT_STATUS(td_checkpoint_load(missing, &got), TD_ERR_NOTFOUND);

    /* an empty directory has none, which is not an error */
    ASSERT_OK(td_checkpoint_find_latest(dir, &path, &got));
    ASSERT(path == NULL);

    check_nospace();

    char *cmd = td_xasprintf("rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    free(sub);
    free(p10);
    free(p20);
    free(p30);
    free(p40);
    free(missing);
    TEST_PASS();
}
