/* The run's working directory (RUN/work) as a copy of the project's entries, never links to
 * them (issue 30): a script that writes a name the project has (torch.save("model.pt")) writes
 * its own file, and the project is untouched. A symbolic link is followed by open(2) when it is
 * written, so a link to the project's file would send the write there; a hard link shares the
 * file itself. A copy is the only one of the three that keeps the project as it was, without
 * privileges (a read-only bind mount needs a mount namespace).
 *
 * Each regular file is cloned first (FICLONE: a reflink on btrfs, XFS, bcachefs, ZFS 2.2, where
 * it costs no space and no time), else copied by copy_file_range (in the kernel, server-side on
 * NFS 4.2), else by read and write. Directories are made and walked without following links; a
 * symbolic link of the project is made again as it is (the project's own link, pointing where it
 * points); anything else (a FIFO, a socket, a device) is left out. docs/executors.md ("The run's
 * working directory") says what this means for large data kept inside a project. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/internal.h"

#define COPY_BUF (1 << 20)

/* The bytes of in (a regular file of size bytes) into out. */
static td_status copy_bytes(int in, int out, off_t size, const char *from,
                            td_exec_copy_stats *stats) {
    if (ioctl(out, FICLONE, in) == 0) {
        stats->cloned_bytes += size;
        return TD_OK;
    }
    off_t done = 0;
    bool plain = false;
    while (done < size && !plain) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, (size_t)(size - done), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && done == 0 &&
            (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
            plain = true;
            break;
        }
        if (n < 0)
            return td_error_errno(TD_ERR_IO, "copying %s into the run's work directory", from);
        if (n == 0) break; /* shrank under us: what there is */
        done += n;
    }
    if (plain) {
        char *buf = td_xmalloc(COPY_BUF);
        td_status st = TD_OK;
        for (;;) {
            ssize_t n = read(in, buf, COPY_BUF);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                st = td_error_errno(TD_ERR_IO, "reading %s", from);
                break;
            }
            if (n == 0) break;
            for (ssize_t w = 0; w < n;) {
                ssize_t k = write(out, buf + w, (size_t)(n - w));
                if (k < 0 && errno == EINTR) continue;
                if (k < 0) {
                    st = td_error_errno(TD_ERR_IO, "copying %s into the run's work directory",
                                        from);
                    break;
                }
                w += k;
            }
            if (st != TD_OK) break;
            done += n;
        }
        free(buf);
        if (st != TD_OK) return st;
    }
    stats->copied_bytes += done;
    return TD_OK;
}

static td_status copy_at(int sdir, const char *name, int ddir, const char *from,
                         td_exec_copy_stats *stats, int depth);

/* The entries of the directory open as sfd into the one open as dfd. */
static td_status copy_dir(int sfd, int dfd, const char *from, td_exec_copy_stats *stats,
                          int depth) {
    int dup_fd = dup(sfd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0) close(dup_fd);
        return td_error_errno(TD_ERR_IO, "cannot read %s", from);
    }
    td_status st = TD_OK;
    for (struct dirent *e; st == TD_OK && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".tandem"))
            continue;
        char *path = td_xasprintf("%s/%s", from, e->d_name);
        st = copy_at(sfd, e->d_name, dfd, path, stats, depth + 1);
        free(path);
    }
    closedir(d);
    return st;
}

static td_status copy_at(int sdir, const char *name, int ddir, const char *from,
                         td_exec_copy_stats *stats, int depth) {
    struct stat sb;
    if (fstatat(sdir, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? TD_OK : td_error_errno(TD_ERR_IO, "cannot read %s", from);
    if (depth > 64)
        return td_error(TD_ERR_INVALID, "%s: directories nested over 64 deep in the project",
                        from);
    if (S_ISLNK(sb.st_mode)) {
        char target[4096];
        ssize_t n = readlinkat(sdir, name, target, sizeof target - 1);
        if (n < 0) return td_error_errno(TD_ERR_IO, "cannot read the link %s", from);
        target[n] = '\0';
        if (symlinkat(target, ddir, name) != 0)
            return td_error_errno(TD_ERR_IO, "cannot make the link %s in the run's work directory",
                                  name);
        stats->links++;
        return TD_OK;
    }
    if (S_ISDIR(sb.st_mode)) {
        int sfd = openat(sdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sfd < 0) return td_error_errno(TD_ERR_IO, "cannot open %s", from);
        td_status st = TD_OK;
        if (mkdirat(ddir, name, (sb.st_mode & 07777) | 0700) != 0 && errno != EEXIST)
            st = td_error_errno(TD_ERR_IO, "cannot make %s in the run's work directory", name);
        int dfd = st == TD_OK ? openat(ddir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                              : -1;
        if (st == TD_OK && dfd < 0)
            st = td_error_errno(TD_ERR_IO, "cannot open %s in the run's work directory", name);
        if (st == TD_OK) st = copy_dir(sfd, dfd, from, stats, depth);
        if (dfd >= 0) close(dfd);
        close(sfd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        stats->skipped++;
        return TD_OK;
    }
    int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (in < 0) return td_error_errno(TD_ERR_IO, "cannot open %s", from);
    int out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     (sb.st_mode & 0777) | 0600);
    td_status st = TD_OK;
    if (out < 0)
        st = td_error_errno(TD_ERR_IO, "cannot create %s in the run's work directory", name);
    if (st == TD_OK) st = copy_bytes(in, out, sb.st_size, from, stats);
    if (st == TD_OK) {
        struct timespec times[2] = {sb.st_atim, sb.st_mtim}; /* make and friends compare them */
        futimens(out, times);
        stats->files++;
    }
    if (out >= 0 && close(out) != 0 && st == TD_OK)
        st = td_error_errno(TD_ERR_IO, "writing %s in the run's work directory", name);
    close(in);
    if (st != TD_OK) unlinkat(ddir, name, 0);
    return st;
}

/* Adds the bytes and files under the entry `name` of sdir to *bytes and *files, without
 * following links, and stops once either passes its limit. */
static void measure_at(int sdir, const char *name, int64_t *bytes, int64_t *files, int depth) {
    struct stat sb;
    if (fstatat(sdir, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || depth > 64) return;
    if (S_ISREG(sb.st_mode)) {
        *bytes += sb.st_size;
        *files += 1;
        return;
    }
    if (!S_ISDIR(sb.st_mode)) return;
    int fd = openat(sdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d)) && *bytes <= TD_EXEC_WORK_COPY_MAX_BYTES &&
                           *files <= TD_EXEC_WORK_COPY_MAX_FILES;) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".tandem"))
            measure_at(dirfd(d), e->d_name, bytes, files, depth + 1);
    }
    closedir(d);
}

bool td_exec_work_copyable(const char *from, int64_t *bytes_out, int64_t *files_out) {
    int64_t bytes = 0, files = 0;
    measure_at(AT_FDCWD, from, &bytes, &files, 0);
    if (bytes_out) *bytes_out = bytes;
    if (files_out) *files_out = files;
    return bytes <= TD_EXEC_WORK_COPY_MAX_BYTES && files <= TD_EXEC_WORK_COPY_MAX_FILES;
}

td_status td_exec_work_copy(const char *from, const char *to, td_exec_copy_stats *stats) {
    char *sdir_path = td_xstrdup(from), *ddir_path = td_xstrdup(to);
    char *sslash = strrchr(sdir_path, '/'), *dslash = strrchr(ddir_path, '/');
    if (!sslash || !dslash || !sslash[1] || !dslash[1]) {
        free(sdir_path);
        free(ddir_path);
        return td_error(TD_ERR_INVALID, "td_exec_work_copy: %s -> %s: absolute paths of entries",
                        from, to);
    }
    *sslash = *dslash = '\0';
    const char *sname = sslash + 1, *dname = dslash + 1;
    td_status st = TD_OK;
    int sdir = open(sdir_path[0] ? sdir_path : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int ddir = open(ddir_path[0] ? ddir_path : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sdir < 0 || ddir < 0)
        st = td_error_errno(TD_ERR_IO, "cannot open %s or %s", sdir_path, ddir_path);
    else if (strcmp(sname, dname))
        st = td_error(TD_ERR_INVALID, "td_exec_work_copy: %s -> %s: the same name on both sides",
                      from, to);
    else
        st = copy_at(sdir, sname, ddir, from, stats, 0);
    if (sdir >= 0) close(sdir);
    if (ddir >= 0) close(ddir);
    free(sdir_path);
    free(ddir_path);
    return st;
}
