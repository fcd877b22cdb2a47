/* track: chaos review of artifacts, "a symlink cycle in an artifact directory makes nothing
 * stored (another pattern's file included) while the run succeeded; with a '..' link each file
 * is stored 17 times; copies are always 0644 (a 0600 output becomes world-readable) and they
 * follow symlinked outputs". Links are never followed (neither when collecting a run's outputs
 * nor when a rebuild registers RUN/artifacts): each is skipped with a warning naming it, and a
 * problem with one entry does not drop the others. Copies keep the source's read and write bits
 * for owner and group, never wider than the source. */
#include "test.h"
#include "track_test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/os.h"
#include "tandem/track.h"

static char tmpdir[] = "/tmp/tandem-test-artifact-links-XXXXXX";
static char *capture_path;

static void write_file(const char *path, const char *text, mode_t mode) {
    FILE *f = fopen(path, "w");
    if (!f) TEST_FAIL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
    ASSERT_EQ(chmod(path, mode), 0);
}

/* The stored names, comma-separated, in order. */
static char *names_of(td_rundb *store, const char *id) {
    td_artifact *arts;
    size_t n;
    ASSERT_OK(td_artifacts_list(store, id, &arts, &n));
    char *out = td_xstrdup("");
    for (size_t i = 0; i < n; i++) {
        char *next = td_xasprintf("%s%s%s", out, i ? "," : "", arts[i].name);
        free(out);
        out = next;
    }
    td_artifacts_free(arts, n);
    return out;
}

static void expect_copy(const td_run *run, const char *name, mode_t mode, const char *text) {
    char *p = td_xasprintf("%s/artifacts/%s", run->run_dir, name);
    struct stat sb;
    if (lstat(p, &sb) != 0) TEST_FAIL("no copy %s", p);
    ASSERT(S_ISREG(sb.st_mode));
    if ((sb.st_mode & 07777) != mode)
        TEST_FAIL("%s has mode %04o, expected %04o", p, (unsigned)(sb.st_mode & 07777),
                  (unsigned)mode);
    char buf[64] = "";
    FILE *f = fopen(p, "r");
    ASSERT(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    ASSERT_STREQ(buf, text);
    free(p);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir) != NULL);
    capture_path = td_xasprintf("%s/stderr.txt", tmpdir);
    umask(022);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(tmpdir, &store));
    td_run_spec spec = {.workflow = "arts",
                        .command = "train",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = 1};
    td_run run;
    ASSERT_OK(td_run_create(store, &spec, &run));

    /* The run's outputs, written after it was created. */
    char *work = td_xasprintf("%s/work", tmpdir);
    char *secret = td_xasprintf("%s/secret.txt", tmpdir); /* outside the work dir */
    write_file(secret, "secret", 0600);
    const char *dirs[] = {"out", "out/sub", "other"};
    for (size_t i = 0; i < TD_ARRAY_LEN(dirs); i++) {
        char *p = td_xasprintf("%s/%s", work, dirs[i]);
        ASSERT_OK(td_mkdirs(p));
        free(p);
    }
    struct {
        const char *name, *text;
        mode_t mode, copy_mode;
    } files[] = {
        {"out/private.bin", "private", 0600, 0600}, {"out/shared.bin", "shared", 0644, 0640},
        {"out/sub/group.bin", "group", 0660, 0660}, {"out/run.sh", "script", 0755, 0640},
        {"out/readonly.bin", "ro", 0400, 0400},     {"other/d.bin", "other", 0644, 0640},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(files); i++) {
        char *p = td_xasprintf("%s/%s", work, files[i].name);
        write_file(p, files[i].text, files[i].mode);
        free(p);
    }
    /* the links: a cycle, a way up, a secret outside, a link as an output of its own, a
     * directory reached through a link */
    struct {
        const char *target, *name;
    } links[] = {
        {".", "out/loop"},        {"..", "out/up"},
        {NULL, "out/secret.txt"}, {"out/shared.bin", "link.bin"},
        {"out", "lnkdir"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(links); i++) {
        char *p = td_xasprintf("%s/%s", work, links[i].name);
        ASSERT_EQ(symlink(links[i].target ? links[i].target : secret, p), 0);
        free(p);
    }
    char *fifo = td_xasprintf("%s/out/pipe", work);
    ASSERT_EQ(mkfifo(fifo, 0644), 0);

    const char *pats[] = {"out", "link.bin", "lnkdir/*.bin", "other/*.bin"};
    size_t copied = 99;
    test_capture_begin(capture_path);
    td_status st = td_artifacts_collect(store, &run, work, pats, TD_ARRAY_LEN(pats), &copied);
    char *err = test_capture_end();
    ASSERT_OK(st);
    ASSERT_EQ(copied, 6);
    char *names = names_of(store, run.id);
    ASSERT_STREQ(names, "other/d.bin,out/private.bin,out/readonly.bin,out/run.sh,out/shared.bin,"
                        "out/sub/group.bin");
    free(names);
    for (size_t i = 0; i < TD_ARRAY_LEN(files); i++)
        expect_copy(&run, files[i].name, files[i].copy_mode, files[i].text);
    /* each link named, with the fix; the FIFO too */
    ASSERT_CONTAINS(err, "artifact out/loop (");
    ASSERT_CONTAINS(err, "out/loop) is a symbolic link to '.': not stored");
    ASSERT_CONTAINS(err, "out/up) is a symbolic link to '..': not stored");
    ASSERT_CONTAINS(err, "out/secret.txt) is a symbolic link");
    ASSERT_CONTAINS(err, "link.bin) is a symbolic link to 'out/shared.bin': not stored");
    ASSERT_CONTAINS(err, "the way to artifact lnkdir/");
    ASSERT_CONTAINS(err, "write or copy the file itself there");
    ASSERT_CONTAINS(err, "out/pipe) is a FIFO (named pipe): not stored");
    free(err);
    char *leak = td_xasprintf("%s/artifacts/out/secret.txt", run.run_dir);
    struct stat sb;
    ASSERT(lstat(leak, &sb) != 0); /* the secret was not copied in */
    free(leak);

    /* ---- a rebuild registers RUN/artifacts without following a link put there ---- */
    char *planted = td_xasprintf("%s/artifacts/etc", run.run_dir);
    ASSERT_EQ(symlink("/etc", planted), 0);
    char *planted_loop = td_xasprintf("%s/artifacts/out/again", run.run_dir);
    ASSERT_EQ(symlink("..", planted_loop), 0);
    td_rundb_close(store);
    track_test_remove_index(tmpdir);
    ASSERT_OK(td_rundb_open_ex(tmpdir, TD_RUNDB_NO_AUTO_REBUILD, &store));
    td_rebuild_stats rs;
    test_capture_begin(capture_path);
    st = td_rundb_rebuild(store, NULL, NULL, &rs);
    err = test_capture_end();
    ASSERT_OK(st);
    ASSERT_EQ(rs.artifacts, 6);
    names = names_of(store, run.id);
    ASSERT_STREQ(names, "other/d.bin,out/private.bin,out/readonly.bin,out/run.sh,out/shared.bin,"
                        "out/sub/group.bin");
    free(names);
    ASSERT_CONTAINS(err, "artifact etc (");
    ASSERT_CONTAINS(err, "is a symbolic link to '/etc': not stored");
    ASSERT_CONTAINS(err, "artifact out/again (");
    free(err);

    td_rundb_close(store);
    td_run_clear(&run);
    free(planted);
    free(planted_loop);
    free(fifo);
    free(work);
    free(secret);
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    free(cmd);
    free(capture_path);
    TEST_PASS();
}
