/* Code version of a project (git commit, plus a digest of the uncommitted diff) and file
 * digests. SHA-256 comes from nettle, the library comm already uses for the store's HMAC. */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void hex_digest(struct sha256_ctx *ctx, char hex_out[65]) {
    uint8_t md[SHA256_DIGEST_SIZE];
    sha256_digest(ctx, sizeof md, md);
    for (unsigned i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex_out + 2 * i, 3, "%02x", md[i]);
    hex_out[64] = '\0';
}

td_status td_sha256_file(const char *path, char hex_out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return td_error_errno(TD_ERR_IO, "cannot open %s to hash it", path);
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    unsigned char buf[1 << 16];
    td_status st = TD_OK;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = td_error_errno(TD_ERR_IO, "reading %s", path);
            break;
        }
        if (n == 0) break;
        sha256_update(&ctx, (size_t)n, buf);
    }
    if (st == TD_OK) hex_digest(&ctx, hex_out);
    close(fd);
    return st;
}

/* Runs git -C dir ARGS with stdout to a pipe (stderr and stdin to /dev/null), feeding the output
 * to a digest and/or a small buffer. Returns git's exit status, or -1 if it could not run. */
static int run_git(const char *dir, const char *const *args, struct sha256_ctx *digest, char *buf,
                   size_t buf_size, size_t *nbytes) {
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) return -1;
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"git";
    argv[argc++] = (char *)"-C";
    argv[argc++] = (char *)dir;
    for (int i = 0; args[i] && argc < 15; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, "git", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        return -1;
    }
    size_t used = 0;
    char chunk[1 << 15];
    for (;;) {
        ssize_t n = read(pipefd[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (digest) sha256_update(digest, (size_t)n, (const uint8_t *)chunk);
        if (buf && used + 1 < buf_size) {
            size_t take = TD_MIN((size_t)n, buf_size - 1 - used);
            memcpy(buf + used, chunk, take);
            used += take;
        }
    }
    close(pipefd[0]);
    if (buf) buf[used] = '\0';
    if (nbytes) *nbytes = used;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

char *td_code_version(const char *project_dir) {
    char commit[128];
    static const char *const rev_args[] = {"rev-parse", "--verify", "HEAD", NULL};
    if (run_git(project_dir, rev_args, NULL, commit, sizeof commit, NULL) != 0)
        return td_xstrdup("none");
    commit[strcspn(commit, "\r\n")] = '\0';
    if (strlen(commit) < 7) return td_xstrdup("none");
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    size_t diff_bytes = 0;
    char probe[2];
    static const char *const diff_args[] = {"diff", "HEAD", "--no-color", "--no-ext-diff", NULL};
    int rc = run_git(project_dir, diff_args, &ctx, probe, sizeof probe, &diff_bytes);
    char *out;
    if (rc == 0 && diff_bytes > 0) {
        char hex[65];
        hex_digest(&ctx, hex);
        out = td_xasprintf("%s+dirty.%s", commit, hex);
    } else {
        out = td_xstrdup(commit);
    }
    return out;
}
