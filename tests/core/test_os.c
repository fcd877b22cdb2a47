/* core's processes, files and sockets (tandem/os.h): each behaviour the layers above rely on. */
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/os.h"

static char dir[] = "/tmp/tandem-test-os-XXXXXX";

static char *path_in(const char *name) {
    return td_xasprintf("%s/%s", dir, name);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = td_xcalloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_spawn(void) {
    /* exec failure comes back as an error naming the program, not as exit 127 */
    char *missing[] = {"/nonexistent/tandem-no-such-program", NULL};
    td_spawn_opts o;
    td_spawn_opts_init(&o);
    o.argv = missing;
    pid_t pid = 0;
    ASSERT_STATUS(td_spawn(&o, &pid), TD_ERR_SYS);
    ASSERT_CONTAINS(td_error_msg(), "cannot start /nonexistent/tandem-no-such-program");
    ASSERT_CONTAINS(td_error_msg(), "No such file or directory");

    /* a bad cwd is named too */
    char *sh_true[] = {"/bin/true", NULL};
    o.argv = sh_true;
    o.cwd = "/nonexistent-dir";
    ASSERT_STATUS(td_spawn(&o, &pid), TD_ERR_SYS);
    ASSERT_CONTAINS(td_error_msg(), "in /nonexistent-dir");

    /* output to a descriptor, cwd honoured, its own process group, stdin is /dev/null, and the
     * signals we block are not blocked in the child */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);
    char *out_path = path_in("spawn.out");
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT(fd >= 0);
    char *argv[] = {"/bin/sh", "-c",
                    "pwd; read x && echo read-something || echo stdin-empty; "
                    "ps -o pgid= -p $$ | tr -d ' '; echo $$; grep SigBlk /proc/self/status",
                    NULL};
    td_spawn_opts_init(&o);
    o.argv = argv;
    o.cwd = dir;
    o.out_fd = fd;
    ASSERT_OK(td_spawn(&o, &pid));
    close(fd);
    int status = 0;
    ASSERT_EQ(td_waitpid(pid, &status, 0), pid);
    sigprocmask(SIG_SETMASK, &old, NULL);
    ASSERT_EQ(td_wait_exit_code(status), 0);
    char *text = slurp(out_path);
    ASSERT(text);
    ASSERT_CONTAINS(text, dir);
    ASSERT_CONTAINS(text, "stdin-empty");
    char expect[64];
    snprintf(expect, sizeof expect, "%d\n%d\n", (int)pid, (int)pid); /* pgid == pid */
    ASSERT_CONTAINS(text, expect);
    ASSERT_CONTAINS(text, "SigBlk:\t0000000000000000");
    free(text);

    /* close_fds: an inheritable descriptor is closed unless kept */
    int keep = open("/dev/null", O_RDONLY), drop = open("/dev/null", O_RDONLY);
    ASSERT(keep >= 0 && drop >= 0);
    char *cmd = td_xasprintf("test -e /proc/self/fd/%d && echo kept; test -e /proc/self/fd/%d "
                             "|| echo dropped",
                             keep, drop);
    char *argv2[] = {"/bin/sh", "-c", cmd, NULL};
    fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    td_spawn_opts_init(&o);
    o.argv = argv2;
    o.out_fd = fd;
    o.close_fds = true;
    o.keep_fds = &keep;
    o.nkeep = 1;
    ASSERT_OK(td_spawn(&o, &pid));
    close(fd);
    ASSERT_EQ(td_waitpid(pid, &status, 0), pid);
    text = slurp(out_path);
    ASSERT_STREQ(text, "kept\ndropped\n");
    free(text);
    free(cmd);
    close(keep);
    close(drop);
    free(out_path);

    /* exit codes and their words */
    char words[128];
    td_wait_describe(9, words, sizeof words);
    ASSERT_STREQ(words, "was killed by signal 9 (SIGKILL)");
    ASSERT_EQ(td_wait_exit_code(9), 137);
    td_wait_describe(3 << 8, words, sizeof words);
    ASSERT_STREQ(words, "exited with code 3");
}

/* A child that starts a grandchild in a process group of its own (as the launcher's workers
 * are) and prints its pid: td_kill_tree must reach both. */
static void test_kill_tree(void) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    char *argv[] = {"/bin/sh", "-c", "setsid sleep 60 & echo $!; wait", NULL};
    td_spawn_opts o;
    td_spawn_opts_init(&o);
    o.argv = argv;
    o.out_fd = p[1];
    pid_t pid;
    ASSERT_OK(td_spawn(&o, &pid));
    close(p[1]);
    char buf[32] = "";
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    ASSERT_GT(n, 0);
    close(p[0]);
    pid_t grandchild = (pid_t)atoi(buf);
    ASSERT_GT(grandchild, 0);
    /* setsid sleep forks only when it is a group leader; wait until it runs as sleep */
    for (int i = 0; i < 200 && kill(grandchild, 0) != 0; i++) usleep(10000);
    ASSERT_EQ(kill(grandchild, 0), 0);
    td_kill_tree(pid, SIGKILL);
    int status;
    ASSERT_EQ(td_waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status));
    /* the grandchild is reparented (to init or a subreaper) and reaped there: poll for it */
    int gone = 0;
    for (int i = 0; i < 500 && !gone; i++) {
        char path[64], state = 0;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)grandchild);
        FILE *f = fopen(path, "r");
        if (!f) {
            gone = 1;
            break;
        }
        if (fscanf(f, "%*d %*s %c", &state) == 1 && state == 'Z') gone = 1;
        fclose(f);
        if (!gone) usleep(10000);
    }
    ASSERT(gone);
}

static void test_sigwatch(void) {
    td_sigwatch w;
    const int sigs[] = {SIGUSR1, SIGUSR2};
    ASSERT_OK(td_sigwatch_open(&w, sigs, 2));
    ASSERT_EQ(td_sigwatch_next(&w), 0);
    kill(getpid(), SIGUSR2); /* blocked: no handler runs, the fd has it */
    ASSERT_EQ(td_sigwatch_next(&w), SIGUSR2);
    ASSERT_EQ(td_sigwatch_next(&w), 0);
    td_sigwatch_close(&w);
    sigset_t now;
    sigprocmask(SIG_SETMASK, NULL, &now);
    ASSERT(!sigismember(&now, SIGUSR2)); /* the mask is restored */
}

/* A thread started before the sigwatch (as OpenBLAS starts one at load time) has nothing
 * blocked: a process-directed SIGTERM may land there, and its default action would kill the
 * process. The sigwatch's handler passes it on to the fd instead. */
static void *idle_thread(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

static void test_sigwatch_early_thread(void) {
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        pthread_t th;
        sigset_t none;
        sigemptyset(&none);
        pthread_sigmask(SIG_SETMASK, &none, NULL);
        if (pthread_create(&th, NULL, idle_thread, NULL) != 0) _exit(3);
        usleep(100 * 1000); /* running, its mask set: OpenBLAS's has long been by main() */
        td_sigwatch w;
        int sigs[] = {SIGTERM};
        if (td_sigwatch_open(&w, sigs, 1) != TD_OK) _exit(4);
        for (int i = 0; i < 20; i++) {
            kill(getpid(), SIGTERM);
            /* The fd turns readable while the signal is pending for the process; the early
             * thread may take it in that instant and pass it on a moment later, so a read may
             * find nothing once: poll again, as every caller's loop does. */
            int got = 0;
            for (double end = td_now_s() + 2.0; !got && td_now_s() < end;) {
                struct pollfd p = {.fd = w.fd, .events = POLLIN};
                if (poll(&p, 1, 100) == 1) got = td_sigwatch_next(&w);
            }
            if (got != SIGTERM) _exit(5);
        }
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(td_waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        TEST_FAIL("killed by signal %d: a thread took the SIGTERM", WTERMSIG(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
}

static void test_files(void) {
    char *deep = path_in("a/b/c");
    ASSERT_OK(td_mkdirs(deep));
    struct stat st;
    ASSERT(stat(deep, &st) == 0 && S_ISDIR(st.st_mode));
    char *file = path_in("a/file");
    td_chunk chunks[2] = {{"hello ", 6}, {"world\n", 6}};
    ASSERT_OK(td_write_atomic(file, "test file", chunks, 2));
    char *text = slurp(file);
    ASSERT_STREQ(text, "hello world\n");
    free(text);
    char *under_file = path_in("a/file/x");
    ASSERT_STATUS(td_mkdirs(under_file), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "is in the way");

    /* kinds: a link is a link (lstat), a device a device, a regular file nothing */
    char *link = path_in("link");
    ASSERT_EQ(symlink(file, link), 0);
    ASSERT_STREQ(td_file_kind(link), "a symbolic link");
    ASSERT_STREQ(td_file_kind("/dev/null"), "a character device");
    ASSERT_STREQ(td_file_kind(dir), "a directory");
    ASSERT(td_file_kind(file) == NULL);
    ASSERT(td_file_kind("/nonexistent/x") == NULL);

    /* issue 8: an atomic replace never swaps a link, a device or a directory for a file */
    ASSERT_STATUS(td_write_atomic(link, "--save", chunks, 2), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "is a symbolic link");
    ASSERT(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    ASSERT_STATUS(td_write_atomic("/dev/null", "--save", chunks, 2), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "a character device");
    ASSERT(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    ASSERT_STATUS(td_check_output_file(dir, "--save"), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "is a directory");
    ASSERT_STATUS(td_check_output_file("/nonexistent-dir/x", "--save"), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "does not exist");
    ASSERT_OK(td_check_output_file(file, "--save"));
    char *ck = path_in("ck/d");
    ASSERT_OK(td_check_output_dir(ck, "--checkpoint-dir"));

    /* copy: same bytes, and the same refusals */
    char *copy = path_in("copy");
    ASSERT_OK(td_copy_file(file, copy, "artifact"));
    text = slurp(copy);
    ASSERT_STREQ(text, "hello world\n");
    free(text);
    ASSERT_STATUS(td_copy_file(file, link, "artifact"), TD_ERR_INVALID);
    ASSERT_STATUS(td_copy_file("/nonexistent/x", copy, "artifact"), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "/nonexistent/x");
    /* nothing left behind: no temporary files in the directory */
    char *cmd = td_xasprintf("ls -a %s | grep -c tmp", dir);
    FILE *pp = popen(cmd, "r");
    int ntmp = -1;
    ASSERT(pp && fscanf(pp, "%d", &ntmp) == 1);
    pclose(pp);
    ASSERT_EQ(ntmp, 0);
    free(cmd);

    char a[33], b[33];
    ASSERT_OK(td_random_hex(a, 16));
    ASSERT_OK(td_random_hex(b, 16));
    ASSERT_EQ(strlen(a), 32);
    ASSERT(strcmp(a, b) != 0);
    free(deep);
    free(file);
    free(under_file);
    free(link);
    free(ck);
    free(copy);
}

/* Whether `path` holds exactly bytes[0..n). */
static int holds(const char *path, const unsigned char *bytes, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char *buf = td_xmalloc(n + 1);
    size_t got = fread(buf, 1, n + 1, f);
    fclose(f);
    int same = got == n && memcmp(buf, bytes, n) == 0;
    free(buf);
    return same;
}

/* The names in dir that contain "tmp", as one string ("" when none). */
static char *tmp_names(const char *d) {
    char *cmd = td_xasprintf("ls -a %s | grep tmp | tr '\\n' ' '", d);
    FILE *pp = popen(cmd, "r");
    ASSERT(pp);
    char *out = td_xcalloc(1, 4096);
    size_t n = fread(out, 1, 4095, pp);
    out[n] = '\0';
    pclose(pp);
    free(cmd);
    return out;
}

/* A child that replaces `path` with `n` bytes under a file size limit of 4 KiB, so its write
 * stops midway: with SIGXFSZ ignored the write fails (EFBIG) and td_write_atomic must report it;
 * with SIGXFSZ's default action the kernel kills the writer in the middle of its write, as a
 * crash or a kill -9 would. Returns the child's wait status. */
static int write_over_limit(const char *path, const unsigned char *bytes, size_t n, int killed) {
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {4096, 4096};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
        prctl(PR_SET_DUMPABLE, 0); /* SIGXFSZ dumps core by default: not here */
        signal(SIGXFSZ, killed ? SIG_DFL : SIG_IGN);
        td_chunk c = {bytes, n};
        td_status st = td_write_atomic(path, "test file", &c, 1);
        if (st == TD_OK) _exit(11); /* 64 KiB past a 4 KiB limit cannot have succeeded */
        fprintf(stderr, "(expected) %s\n", td_error_msg());
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(td_waitpid(pid, &status, 0), pid);
    return status;
}

/* td_write_atomic over an existing file: a reader never sees a torn file, and a write that fails
 * or dies midway leaves the old bytes (os.h: "the old file or the new one, never a torn one").
 * A temporary file named like the target would truncate the old bytes when it is opened. */
static void test_atomic_replace(void) {
    char *sub = path_in("atomic");
    ASSERT_OK(td_mkdirs(sub));
    char *file = td_xasprintf("%s/model.bin", sub);
    enum { OLD = 3000, NEW = 65536 };
    unsigned char *old = td_xmalloc(OLD), *neu = td_xmalloc(NEW);
    for (int i = 0; i < OLD; i++) old[i] = (unsigned char)(i * 7 + 1);
    for (int i = 0; i < NEW; i++) neu[i] = (unsigned char)(i * 13 + 5);
    td_chunk c_old = {old, OLD};
    ASSERT_OK(td_write_atomic(file, "test file", &c_old, 1));
    ASSERT(holds(file, old, OLD));

    /* (1) the write fails midway (EFBIG): an error, the old bytes, no temporary file left */
    int status = write_over_limit(file, neu, NEW, 0);
    ASSERT(WIFEXITED(status));
    if (WEXITSTATUS(status) == 11) TEST_FAIL("td_write_atomic past RLIMIT_FSIZE returned TD_OK");
    ASSERT_EQ(WEXITSTATUS(status), 0);
    if (!holds(file, old, OLD))
        TEST_FAIL("a failed write destroyed the file it was replacing: %s no longer holds its "
                  "%d old bytes",
                  file, OLD);
    char *left = tmp_names(sub);
    if (*left) TEST_FAIL("a failed write left temporary files behind: %s", left);
    free(left);

    /* (2) the writer is killed mid-write (SIGXFSZ): the old bytes, and nothing else where the
     * file system has O_TMPFILE (the bytes went to an unnamed file); elsewhere its temporary
     * file is a separate `.model.bin.tmp.<pid>` that td_remove_stale_tmp then sweeps */
    int probe = open(sub, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    int unnamed = probe >= 0 && access("/proc/self/fd", X_OK) == 0;
    if (probe >= 0) close(probe);
    status = write_over_limit(file, neu, NEW, 1);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGXFSZ)
        TEST_FAIL("the writer was meant to die of SIGXFSZ mid-write; wait status 0x%x", status);
    if (!holds(file, old, OLD))
        TEST_FAIL("a writer killed mid-write tore the file it was replacing: %s no longer holds "
                  "its %d old bytes",
                  file, OLD);
    left = tmp_names(sub);
    if (unnamed && *left)
        TEST_FAIL("a writer killed mid-write left %s on a file system with O_TMPFILE: its bytes "
                  "should have gone to an unnamed file",
                  left);
    if (!unnamed) ASSERT_CONTAINS(left, ".model.bin.tmp.");
    free(left);
    /* the sweep, for what a killed writer leaves without O_TMPFILE: a named file, pid gone */
    pid_t dead = fork();
    ASSERT(dead >= 0);
    if (dead == 0) _exit(0);
    ASSERT_EQ(td_waitpid(dead, &status, 0), dead);
    char *stale = td_xasprintf("%s/.model.bin.tmp.%ld", sub, (long)dead);
    if (unnamed) { /* as a killed writer on a file system without O_TMPFILE leaves it */
        FILE *f = fopen(stale, "wb");
        ASSERT(f);
        ASSERT_EQ(fwrite(neu, 1, 100, f), (size_t)100);
        ASSERT_EQ(fclose(f), 0);
    }
    size_t removed = 0;
    ASSERT_OK(td_remove_stale_tmp(sub, "model", ".bin", &removed));
    ASSERT_EQ(removed, 1);
    left = tmp_names(sub);
    if (*left) TEST_FAIL("td_remove_stale_tmp left %s", left);
    free(left);
    free(stale);
    ASSERT(holds(file, old, OLD));

    /* (3) a successful replace: a reader that opened the old file still reads the old bytes
     * (the new file is a new inode, renamed over the name), the name gives the new bytes */
    FILE *reader = fopen(file, "rb");
    ASSERT(reader);
    td_chunk c_new = {neu, NEW};
    ASSERT_OK(td_write_atomic(file, "test file", &c_new, 1));
    ASSERT(holds(file, neu, NEW));
    unsigned char *seen = td_xmalloc(OLD + 1);
    size_t got = fread(seen, 1, OLD + 1, reader);
    fclose(reader);
    if (got != OLD || memcmp(seen, old, OLD))
        TEST_FAIL("a reader that opened %s before an atomic replace read %s%zu bytes, not its %d "
                  "old bytes: the replace wrote into the old file instead of renaming a new one "
                  "over it",
                  file, got > OLD ? "more than " : "", got > OLD ? (size_t)OLD : got, OLD);
    left = tmp_names(sub);
    if (*left) TEST_FAIL("a successful write left temporary files behind: %s", left);
    free(left);
    free(seen);
    free(old);
    free(neu);
    free(file);
    free(sub);
}

static void test_sockets(void) {
    int fd, port;
    ASSERT_OK(td_listen_tcp("127.0.0.1", 0, 4, &fd, &port));
    ASSERT_GT(port, 0);
    /* the descriptor is kept: the port stays ours, a second listener cannot take it */
    int fd2, port2;
    ASSERT_STATUS(td_listen_tcp("127.0.0.1", port, 4, &fd2, &port2), TD_ERR_SYS);
    ASSERT_CONTAINS(td_error_msg(), "Address already in use");
    ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    ASSERT_STATUS(td_listen_tcp("no-such-host.invalid", 0, 4, &fd2, &port2), TD_ERR_INVALID);
    ASSERT_OK(td_pick_free_port(&port));
    ASSERT_GT(port, 0);
}

int main(void) {
    ASSERT(mkdtemp(dir) != NULL);
    test_spawn();
    test_kill_tree();
    test_sigwatch();
    test_sigwatch_early_thread();
    test_files();
    test_atomic_replace();
    test_sockets();
    char *cmd = td_xasprintf("rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
