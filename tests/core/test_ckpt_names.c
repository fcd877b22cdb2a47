/* The checkpoint contract (tandem/ckpt.h): every line of tests/core/ckpt_names.txt (which the
 * SDK's test reads too: tests/python/test_ckpt_names.py), and the commit rule on real files. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/ckpt.h"

static td_ckpt_kind kind_of(const char *s) {
    const td_ckpt_kind all[] = {TD_CKPT_TDCK, TD_CKPT_SDK, TD_CKPT_LIGHTNING, TD_CKPT_HF};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!strcmp(s, td_ckpt_kind_name(all[i]))) return all[i];
    return TD_CKPT_NONE;
}

static void test_vectors(void) {
    FILE *f = fopen(TD_TEST_CKPT_NAMES, "r");
    ASSERT(f != NULL);
    char line[512];
    int names = 0, builds = 0;
    while (fgets(line, sizeof line, f)) {
        char a[256], b[64], c[256], d[256];
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "build %63s %255s %255s", b, c, d) == 3) {
            char got[256];
            ASSERT(td_ckpt_build(kind_of(b), atoll(c), got, sizeof got));
            if (strcmp(got, d)) fprintf(stderr, "build %s %s\n", b, c);
            ASSERT_STREQ(got, d);
            builds++;
            continue;
        }
        ASSERT_EQ(sscanf(line, "%255s %63s %255s", a, b, c), 3);
        td_ckpt_name n;
        bool is = td_ckpt_parse(a, &n);
        if (is != (kind_of(b) != TD_CKPT_NONE) || n.kind != kind_of(b) || n.step != atoll(c))
            fprintf(stderr, "name %s: expected %s %s, got %s %lld\n", a, b, c,
                    td_ckpt_kind_name(n.kind), (long long)n.step);
        ASSERT_STREQ(td_ckpt_kind_name(n.kind), b);
        ASSERT_EQ((long long)n.step, atoll(c));
        ASSERT_EQ(n.is_dir, n.kind == TD_CKPT_HF);
        names++;
    }
    fclose(f);
    ASSERT_GE(names, 30);
    ASSERT_GE(builds, 4);
    char small[8];
    ASSERT(!td_ckpt_build(TD_CKPT_TDCK, 123456, small, sizeof small)); /* too long for buf */
    ASSERT_STREQ(small, "");
    ASSERT(!td_ckpt_build(TD_CKPT_LIGHTNING, 3, small, sizeof small));
    ASSERT(!td_ckpt_build(TD_CKPT_TDCK, -1, small, sizeof small));
}

static void touch(const char *dir, const char *name) {
    char *p = td_xasprintf("%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs("x", f);
    fclose(f);
    free(p);
}

static void mkdir_in(const char *dir, const char *name) {
    char *p = td_xasprintf("%s/%s", dir, name);
    ASSERT_EQ(mkdir(p, 0755), 0);
    free(p);
}

static void test_commit_rule(void) {
    char dir[] = "/tmp/tandem-test-ckpt-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    ASSERT_EQ(td_ckpt_newest(dir, TD_CKPT_ANY, NULL, 0), -1);
    touch(dir, "ckpt-5.tdck");
    touch(dir, ".ckpt-9.tdck.tmp.1");      /* a writer's temporary */
    mkdir_in(dir, "ckpt-7.tdck");          /* a file kind as a directory */
    touch(dir, "step-000000000006.pt");
    char *target = td_xasprintf("%s/step-000000000006.pt", dir);
    char *link = td_xasprintf("%s/step-000000000008.pt", dir);
    ASSERT_EQ(symlink(target, link), 0); /* a link is no committed checkpoint */
    mkdir_in(dir, "checkpoint-20");          /* HF, still being written: no marker */
    touch(dir, "checkpoint-20/model.safetensors");
    mkdir_in(dir, "checkpoint-10");
    touch(dir, "checkpoint-10/trainer_state.json");
    mkdir_in(dir, "checkpoint-12");
    mkdir_in(dir, "checkpoint-12/" TD_CKPT_HF_MARKER); /* the marker must be a file */
    touch(dir, "last.ckpt");
    touch(dir, "epoch=0-step=4.ckpt");
    td_ckpt_name n;
    ASSERT(td_ckpt_committed(dir, "ckpt-5.tdck", &n) && n.step == 5);
    ASSERT(!td_ckpt_committed(dir, "ckpt-7.tdck", &n) && n.kind == TD_CKPT_NONE);
    ASSERT(!td_ckpt_committed(dir, "step-000000000008.pt", &n));
    ASSERT(!td_ckpt_committed(dir, "checkpoint-20", &n));
    ASSERT(!td_ckpt_committed(dir, "checkpoint-12", &n));
    ASSERT(td_ckpt_committed(dir, "checkpoint-10", &n) && n.is_dir && n.step == 10);
    ASSERT(!td_ckpt_committed(dir, "ckpt-404.tdck", &n));
    int count;
    td_ckpt_entry *v = td_ckpt_list(dir, TD_CKPT_ANY, &count);
    const char *want[] = {"checkpoint-10", "step-000000000006.pt", "ckpt-5.tdck",
                          "epoch=0-step=4.ckpt", "last.ckpt"};
    ASSERT_EQ(count, 5);
    for (int i = 0; i < count; i++) ASSERT_STREQ(v[i].name, want[i]);
    td_ckpt_list_free(v, count);
    char name[64];
    ASSERT_EQ(td_ckpt_newest(dir, TD_CKPT_ANY, name, sizeof name), 10);
    ASSERT_STREQ(name, "checkpoint-10");
    ASSERT_EQ(td_ckpt_newest(dir, TD_CKPT_TDCK, name, sizeof name), 5);
    ASSERT_STREQ(name, "ckpt-5.tdck");
    /* tandem's own marker commits a directory too, once it is there */
    mkdir_in(dir, "checkpoint-30");
    ASSERT(!td_ckpt_committed(dir, "checkpoint-30", &n));
    touch(dir, "checkpoint-30/" TD_CKPT_MARKER);
    ASSERT_EQ(td_ckpt_newest(dir, TD_CKPT_HF | TD_CKPT_SDK, NULL, 0), 30);
    ASSERT_EQ(td_ckpt_newest(dir, TD_CKPT_LIGHTNING, name, sizeof name), 4);
    ASSERT_EQ(td_ckpt_newest("/nonexistent/tandem-ckpt", TD_CKPT_ANY, NULL, 0), -1);
    char *cmd = td_xasprintf("rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    free(target);
    free(link);
}

int main(void) {
    test_vectors();
    test_commit_rule();
    TEST_PASS();
}
