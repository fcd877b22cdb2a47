#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
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
