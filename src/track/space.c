/* A full disk, reported as what it is, and the reserve that lets the store record how a run
 * ended even then.
 *
 * Issue 8: on a full disk a run that succeeded was recorded as failed ("its supervisor is
 * gone"): its final status write failed, and the supervisor's fallback failed the same way. The
 * store keeps <project>/.tandem/reserve, a few MiB allocated in advance; a status write that
 * fails for lack of space deletes it and tries once more, and the note says the disk was full.
 * The reserve comes back (on the next open or run creation) once there is room for it and as
 * much again, so a disk that is still nearly full does not swallow the space just freed. */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define RESERVE_BYTES ((int64_t)4 << 20)

/* path, or its nearest ancestor that exists (a file that could not be created is named by
 * the directory it was to go in). Caller frees. */
static char *existing(const char *path) {
    char *p = td_xstrdup(path);
    struct stat sb;
    while (stat(p, &sb) != 0) {
        char *slash = strrchr(p, '/');
        if (!slash) {
            free(p);
            return td_xstrdup(".");
        }
        if (slash == p) {
            p[1] = '\0';
            break;
        }
        *slash = '\0';
    }
    return p;
}

void td__fs_mount_point(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *there = existing(path);
    char *cur = realpath(there, NULL);
    free(there);
    if (!cur) return;
    struct stat sb;
    if (stat(cur, &sb) != 0) {
        free(cur);
        return;
    }
    /* Walk up while the parent is on the same device: the last one is the mount point. */
    for (;;) {
        char *slash = strrchr(cur, '/');
        if (!slash || slash == cur) {
            struct stat root;
            if (stat("/", &root) == 0 && root.st_dev == sb.st_dev) snprintf(cur, 2, "/");
            break;
        }
        *slash = '\0';
        struct stat up;
        if (stat(cur, &up) != 0 || up.st_dev != sb.st_dev) {
            *slash = '/';
            break;
        }
    }
    snprintf(out, cap, "%s", cur);
    free(cur);
}

int64_t td__fs_free_bytes(const char *path) {
    struct statvfs vs;
    char *there = existing(path);
    int rc = statvfs(there, &vs);
    free(there);
    /* Some filesystems (FUSE, network mounts) report no blocks at all: that is "unknown", not
     * a full disk, or every run ending there would be noted as ending on one. */
    if (rc != 0 || vs.f_blocks == 0) return -1;
    return (int64_t)vs.f_bavail * (int64_t)vs.f_frsize;
}

static void fmt_bytes(int64_t n, char *out, size_t cap) {
    if (n < 0)
        snprintf(out, cap, "unknown");
    else if (n < (1 << 20))
        snprintf(out, cap, "%lld KiB", (long long)(n >> 10));
    else
        snprintf(out, cap, "%.1f MiB", (double)n / (1 << 20));
}

td_status td__nospace_explain(td_status st, const char *path) {
    if (st != TD_ERR_NOSPACE) return st;
    if (strstr(td_error_msg(), "the filesystem mounted at")) return st; /* said already */
    char mnt[PATH_MAX], avail[32], old[1024];
    td__fs_mount_point(path, mnt, sizeof mnt);
    fmt_bytes(td__fs_free_bytes(path), avail, sizeof avail);
    snprintf(old, sizeof old, "%s", td_error_msg());
    return td_error(TD_ERR_NOSPACE,
                    "%s; the filesystem mounted at %s is full (%s free): free space on %s", old,
                    mnt, avail, mnt);
}

char *td__nospace_note(const char *path) {
    char mnt[PATH_MAX], avail[32];
    td__fs_mount_point(path, mnt, sizeof mnt);
    fmt_bytes(td__fs_free_bytes(path), avail, sizeof avail);
    return td_xasprintf("the disk was full: the filesystem mounted at %s had %s free; free space "
                        "on %s",
                        mnt, avail, mnt);
}

void td__reserve_ensure(td_rundb *store) {
    char *path = td_xasprintf("%s/reserve", store->dir);
    struct stat sb;
    if (stat(path, &sb) == 0 && sb.st_size >= RESERVE_BYTES) goto out;
    int64_t avail = td__fs_free_bytes(store->dir);
    if (avail < 2 * RESERVE_BYTES) goto out;
    /* Allocated under another name and renamed: a reserve that exists is a whole one. */
    char *tmp = td_xasprintf("%s.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0 && posix_fallocate(fd, 0, (off_t)RESERVE_BYTES) == 0;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (ok && rename(tmp, path) == 0) {
        store->nospace_noted = 0; /* there is room again */
    } else {
        TD_LOG_DEBUG("could not set aside %lld bytes in %s (the disk may be nearly full)",
                     (long long)RESERVE_BYTES, path);
        unlink(tmp);
    }
    free(tmp);
out:
    free(path);
}

int td__reserve_release(td_rundb *store) {
    char *path = td_xasprintf("%s/reserve", store->dir);
    int freed = unlink(path) == 0;
    free(path);
    return freed;
}
