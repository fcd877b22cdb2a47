#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/fileio.h"

static td_status write_all(int fd, const void *buf, size_t nbytes, const char *tmp,
                           const char *what) {
    const char *p = buf;
    while (nbytes > 0) {
        ssize_t n = write(fd, p, nbytes > (1u << 30) ? (1u << 30) : nbytes);
        if (n < 0) {
            if (errno == EINTR) continue;
            return td_error_errno(TD_ERR_IO, "cannot write %s %s", what, tmp);
        }
        p += n;
        nbytes -= (size_t)n;
    }
    return TD_OK;
}

/* What is at `path` when it is not a regular file, for messages; NULL for a regular file or
 * nothing. */
static const char *not_regular(const char *path, struct stat *st) {
    if (lstat(path, st) != 0) return NULL;
    if (S_ISREG(st->st_mode)) return NULL;
    if (S_ISLNK(st->st_mode)) return "a symbolic link";
    if (S_ISDIR(st->st_mode)) return "a directory";
    if (S_ISCHR(st->st_mode)) return "a character device";
    if (S_ISBLK(st->st_mode)) return "a block device";
    if (S_ISFIFO(st->st_mode)) return "a FIFO";
    if (S_ISSOCK(st->st_mode)) return "a socket";
    return "not a regular file";
}

static td_status refuse(const char *path, const char *flag, const char *kind) {
    if (!strcmp(kind, "a symbolic link")) {
        char target[4096];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        return td_error(TD_ERR_INVALID,
                        "%s %s is a symbolic link (to %s): tandem replaces its output files "
                        "atomically, which would replace the link, not write through it; pass the "
                        "link's target instead",
                        flag, path, target);
    }
    if (!strcmp(kind, "a directory"))
        return td_error(TD_ERR_INVALID, "%s %s is a directory; pass a file path in it, e.g. %s/%s",
                        flag, path, path, !strcmp(flag, "--save") ? "weights.safetensors" : "out");
    return td_error(TD_ERR_INVALID,
                    "%s %s is %s, not a regular file: tandem writes a new file and renames it "
                    "over the target, which would replace %s; pass a regular file path",
                    flag, path, kind, kind);
}

/* A probe file created and removed in dir: the directory takes new files right now. */
static td_status probe_dir(const char *dir, const char *flag, const char *for_path) {
    char *probe = td_xasprintf("%s/.tandem-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    td_status rc = TD_OK;
    if (fd < 0)
        rc = td_error_errno(TD_ERR_IO, "%s %s: cannot create a file in %s", flag, for_path, dir);
    else {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return rc;
}

td_status td__check_output_file(const char *path, const char *flag) {
    struct stat st;
    const char *kind = not_regular(path, &st);
    if (kind) return refuse(path, flag, kind);
    char *dircopy = td_xstrdup(path);
    const char *dir = dirname(dircopy);
    td_status rc = TD_OK;
    if (stat(dir, &st) != 0)
        rc = td_error_errno(TD_ERR_NOTFOUND,
                            "%s %s: the directory %s does not exist; create it "
                            "first",
                            flag, path, dir);
    else if (!S_ISDIR(st.st_mode))
        rc = td_error(TD_ERR_INVALID, "%s %s: %s is not a directory", flag, path, dir);
    else
        rc = probe_dir(dir, flag, path);
    free(dircopy);
    return rc;
}

td_status td__check_output_dir(const char *dir, const char *flag) {
    td_status st = td_mkdirs(dir);
    if (st != TD_OK)
        return td_error(st, "%s %s: %s; choose another directory", flag, dir, td_error_msg());
    return probe_dir(dir, flag, dir);
}

td_status td__write_atomic(const char *path, const char *what, const td__chunk *chunks,
                           int nchunks) {
    td_status rc = TD_OK;
    char *dircopy = td_xstrdup(path);
    char *basecopy = td_xstrdup(path);
    const char *dir = dirname(dircopy);
    char *tmp = td_xasprintf("%s/.%s.tmp.%ld", dir, basename(basecopy), (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = td_error_errno(TD_ERR_IO,
                            "cannot create %s %s (for %s); check that the directory "
                            "exists and is writable",
                            what, tmp, path);
        goto out;
    }
    for (int i = 0; i < nchunks; i++)
        TD_CHECK_GOTO(write_all(fd, chunks[i].data, chunks[i].nbytes, tmp, what), rc, out);
    if (fsync(fd) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot fsync %s %s", what, tmp);
        goto out;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot close %s %s", what, tmp);
        goto out;
    }
    struct stat st;
    const char *kind = not_regular(path, &st); /* it may have appeared since the start */
    if (kind) {
        rc = refuse(path, what, kind);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot rename %s to %s", tmp, path);
        goto out;
    }
    /* the rename is durable only once the directory entry is */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
out:
    if (fd >= 0) close(fd);
    if (rc != TD_OK) {
        unlink(tmp);
        if (rc == TD_ERR_NOSPACE) {
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", td_error_msg());
            td_error(TD_ERR_NOSPACE,
                     "%s; the %s %s was not written (existing files are "
                     "untouched): free space on that filesystem or choose "
                     "another directory",
                     detail, what, path);
        }
    }
    free(tmp);
    free(dircopy);
    free(basecopy);
    return rc;
}
