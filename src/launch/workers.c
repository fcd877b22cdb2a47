/* The workers of one node: spawning (own process group, pipes, death signal), line-prefixed
 * output, reaping and signalling. Single-threaded: the agent loop drives everything. */
#include "launch_internal.h"

#include "tandem/os.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

bool td__status_ok(int status) {
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Writes all of buf, retrying short writes. Returns 0, or the errno of a failed write: the
 * caller decides what a failure means (a closed stdout is ignored on purpose, the agent must
 * keep supervising its workers even when nobody reads their output; a log file that cannot be
 * written is reported). */
int td__write_all(int fd, const char *buf, size_t nbytes) {
    while (nbytes > 0) {
        ssize_t k = write(fd, buf, nbytes);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { /* a non-blocking stream that is full: until it drains */
                td__wait_writable(fd, 0.1);
                continue;
            }
            return errno;
        }
        buf += k;
        nbytes -= (size_t)k;
    }
    return 0;
}

/* A worker's log file could not be written (issue 8: a log on a full disk was cut at 1.9 MB
 * without a word). Said once, on the agent's stderr, where the supervisor and the user see it;
 * the output still reaches the agent's stdout. Later writes are not attempted: a log with a
 * silent hole in the middle would be worse than one that stops where the message says. */
static void log_failed(td__worker *w, int err) {
    TD_LOG_ERROR("rank %d's log %s is incomplete from here on: %s%s", w->rank, w->log_path,
                 strerror(err),
                 err == ENOSPC ? " (the disk is full: free space there; the rest of this rank's "
                                 "output is only on the launcher's output)"
                               : "");
    close(w->log_fd);
    w->log_fd = -1;
    w->log_failed = true;
}

/* Writes the rank prefix, text and end in one write, so that lines from different workers never
 * interleave; with log, also text and end to the worker's log file. */
static void emit(td__worker *w, td__stream *s, const char *text, size_t len, char end, bool log) {
    if (!s->console && !(log && w->log_fd >= 0)) return; /* redirected, and no rank log */
    size_t plen = strlen(w->prefix);
    char stackbuf[4096];
    char *out = plen + len + 1 <= sizeof stackbuf ? stackbuf : td_xmalloc(plen + len + 1);
    memcpy(out, w->prefix, plen);
    memcpy(out + plen, text, len);
    out[plen + len] = end;
    if (s->console) td__write_all(s->out_fd, out, plen + len + 1);
    if (log && w->log_fd >= 0) {
        int err = td__write_all(w->log_fd, out + plen, len + 1);
        if (err) log_failed(w, err);
    }
    if (out != stackbuf) free(out);
}

/* A line in which a program says it failed: tandem's own messages ("tandem train: --lr ...",
 * "tandem: error: ..."), or one naming an error, an exception, a fatal condition, an abort or
 * a panic (Python's "ValueError: ...", "fatal error: ..."). A hint printed after it ("(see
 * 'tandem train --help')") must not displace it. */
static bool says_failure(const char *line, size_t len) {
    static const char *const words[] = {"error", "exception", "fatal", "abort", "panic"};
    if (len >= 6 && !strncmp(line, "tandem", 6)) return true;
    for (size_t i = 0; i < len; i++)
        for (size_t k = 0; k < sizeof words / sizeof *words; k++) {
            size_t n = strlen(words[k]);
            if (i + n <= len && !strncasecmp(line + i, words[k], n)) return true;
        }
    return false;
}

/* One line, given without its newline. Remembers the worker's last stderr line that says it
 * failed (else its last non-blank one) for the end record. */
static void emit_line(td__worker *w, td__stream *s, const char *line, size_t len) {
    emit(w, s, line, len, '\n', true);
    if (s != &w->err) return;
    size_t b = 0;
    while (b < len && (line[b] == ' ' || line[b] == '\t')) b++;
    if (b == len) return;
    bool says_error = says_failure(line + b, len - b);
    if (says_error || !w->last_err_says) {
        snprintf(w->last_err, sizeof w->last_err, "%.*s", (int)len, line);
        w->last_err_says = says_error;
    }
}

/* A segment a worker ended with '\r' (a progress bar redrawn in place): prefixed and ended with
 * '\r' as well, so the next redraw overwrites it on a terminal. Not logged: the log keeps the
 * bar's last state, which ends with '\n'. */
static void emit_redraw(td__worker *w, td__stream *s, const char *seg, size_t len) {
    if (len > 0) emit(w, s, seg, len, '\r', false);
}

/* --redirects/--tee: what the worker wrote, byte for byte, as torchrun's stdout.log holds it
 * (the worker writes that file itself there). A failed write is said once, as for the rank
 * log, and the file is not written any more. */
static void stream_to_file(td__worker *w, td__stream *s, const char *buf, size_t len) {
    if (s->file_fd < 0) return;
    int err = td__write_all(s->file_fd, buf, len);
    if (!err) return;
    TD_LOG_ERROR("rank %d's %s is incomplete from here on: %s%s", w->rank, s->file_path,
                 strerror(err), err == ENOSPC ? " (the disk is full: free space there)" : "");
    close(s->file_fd);
    s->file_fd = -1;
}

static void stream_consume(td__worker *w, td__stream *s) {
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            size_t end = i > start && s->buf[i - 1] == '\r' ? i - 1 : i; /* CRLF */
            emit_line(w, s, s->buf + start, end - start);
            start = i + 1;
        } else if (s->buf[i] == '\r' && i + 1 < s->len && s->buf[i + 1] != '\n') {
            /* a '\r' last in the buffer waits: it may be half of a CRLF */
            emit_redraw(w, s, s->buf + start, i - start);
            start = i + 1;
        }
    }
    if (start == 0 && s->len == TD__LINE_MAX) { /* one line longer than the buffer */
        emit_line(w, s, s->buf, s->len);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void stream_close(td__worker *w, td__stream *s) {
    if (s->fd < 0) return;
    if (s->len > 0) { /* a last line without its newline */
        emit_line(w, s, s->buf, s->len);
        s->len = 0;
    }
    close(s->fd);
    s->fd = -1;
}

/* Returns false at EOF (or error), having closed the stream. */
static bool stream_read(td__worker *w, td__stream *s) {
    for (;;) {
        ssize_t k = read(s->fd, s->buf + s->len, TD__LINE_MAX - s->len);
        if (k > 0) {
            stream_to_file(w, s, s->buf + s->len, (size_t)k);
            s->len += (size_t)k;
            stream_consume(w, s);
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) return true;
        stream_close(w, s);
        return false;
    }
}

void td__workers_pump_fd(td__workers *ws, int fd) {
    for (int i = 0; i < ws->n; i++) {
        td__worker *w = &ws->w[i];
        if (w->out.fd == fd)
            stream_read(w, &w->out);
        else if (w->err.fd == fd)
            stream_read(w, &w->err);
        else
            continue;
        return;
    }
}

int td__workers_open_streams(const td__workers *ws) {
    int n = 0;
    for (int i = 0; i < ws->n; i++) n += (ws->w[i].out.fd >= 0) + (ws->w[i].err.fd >= 0);
    return n;
}

void td__workers_close_streams(td__workers *ws) {
    for (int i = 0; i < ws->n; i++) {
        /* Whatever is still buffered in the pipe goes out before we close it. */
        if (ws->w[i].out.fd >= 0) stream_read(&ws->w[i], &ws->w[i].out);
        if (ws->w[i].err.fd >= 0) stream_read(&ws->w[i], &ws->w[i].err);
        stream_close(&ws->w[i], &ws->w[i].out);
        stream_close(&ws->w[i], &ws->w[i].err);
    }
}

void td__workers_signal(td__workers *ws, int sig, bool all) {
    for (int i = 0; i < ws->n; i++) {
        td__worker *w = &ws->w[i];
        if (w->pid <= 0 || (!all && !w->running)) continue;
        /* The group (the worker and what it started), and the worker alone only if it left
         * the group: signalled twice, it may take the second as "stop now" (trainer.c). */
        bool group = kill(-w->pid, sig) == 0;
        if (w->running && (!group || getpgid(w->pid) != w->pid)) kill(w->pid, sig);
    }
}

int td__workers_reap(td__workers *ws, int *failed) {
    int reaped = 0;
    *failed = -1;
    for (int i = 0; i < ws->n; i++) {
        td__worker *w = &ws->w[i];
        if (!w->running) continue;
        int status;
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r == w->pid) {
            w->running = false;
            w->status = status;
            reaped++;
            if (!td__status_ok(status) && *failed < 0) *failed = i;
        } else if (r < 0 && errno == ECHILD) {
            /* Someone else reaped it (a caller's SIGCHLD handler): we cannot know how it ended. */
            w->running = false;
            w->status = 0xff00; /* exit code 255 */
            if (*failed < 0) *failed = i;
        }
    }
    return reaped;
}

int td__workers_running(const td__workers *ws) {
    int n = 0;
    for (int i = 0; i < ws->n; i++) n += ws->w[i].running;
    return n;
}

void td__workers_free(td__workers *ws) {
    for (int i = 0; i < ws->n; i++) {
        td__worker *w = &ws->w[i];
        if (w->out.fd >= 0) close(w->out.fd);
        if (w->err.fd >= 0) close(w->err.fd);
        if (w->log_fd >= 0) close(w->log_fd);
        if (w->out.file_fd >= 0) close(w->out.file_fd);
        if (w->err.file_fd >= 0) close(w->err.file_fd);
        free(w->log_path);
        free(w->out.file_path);
        free(w->err.file_path);
        free(w->out.buf);
        free(w->err.buf);
    }
    free(ws->w);
    ws->w = NULL;
    ws->n = 0;
}

static td_status open_log(const char *log_dir, int rank, int restart_count, int *fd,
                          char **path_out) {
    char *path = td_xasprintf("%s/rank-%d.log", log_dir, rank);
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (*fd < 0) {
        td_status st = td_error_errno(TD_ERR_IO, "cannot open worker log %s (--log-dir)", path);
        free(path);
        return st;
    }
    *path_out = path;
    if (restart_count > 0) {
        char marker[64];
        int n = snprintf(marker, sizeof marker, "--- restart %d ---\n", restart_count);
        int err = td__write_all(*fd, marker, (size_t)n);
        if (err) {
            errno = err;
            return td_error_errno(TD_ERR_IO, "cannot write worker log %s (--log-dir)", path);
        }
    }
    return TD_OK;
}

/* torchrun's layout: DIR/<local rank>/stdout.log and stderr.log, for the streams redirected or
 * teed (a fresh attempt directory: the files start empty). */
static td_status open_std_files(const td__spawn_args *a, td__worker *w) {
    int bits =
        (a->redirects ? a->redirects[w->local_rank] : 0) | (a->tee ? a->tee[w->local_rank] : 0);
    if (!bits) return TD_OK;
    char *dir = td_xasprintf("%s/%d", a->std_dir, w->local_rank);
    td_status st = td_mkdirs(dir);
    if (st != TD_OK) {
        st = td_error(st, "--redirects/--tee: %s", td_error_msg());
        free(dir);
        return st;
    }
    static const char *const names[] = {"stdout.log", "stderr.log"};
    td__stream *streams[] = {&w->out, &w->err};
    for (int k = 0; k < 2 && st == TD_OK; k++) {
        if (!(bits & (k ? TD_LAUNCH_STD_ERR : TD_LAUNCH_STD_OUT))) continue;
        td__stream *s = streams[k];
        s->file_path = td_xasprintf("%s/%s", dir, names[k]);
        s->file_fd = open(s->file_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (s->file_fd < 0)
            st = td_error_errno(TD_ERR_IO, "cannot open %s (--redirects/--tee)", s->file_path);
    }
    free(dir);
    return st;
}

td_status td__workers_spawn(td__workers *ws, const td__spawn_args *a) {
    td_status st = TD_OK;
    int n = a->n;
    ws->w = td_xcalloc((size_t)n, sizeof *ws->w);
    ws->n = n;
    for (int i = 0; i < n; i++) {
        td__worker *w = &ws->w[i];
        w->rank = a->rank_offset + i;
        w->local_rank = i;
        w->out.fd = w->err.fd = w->log_fd = -1;
        w->out.file_fd = w->err.file_fd = -1;
        w->out.buf = td_xmalloc(TD__LINE_MAX);
        w->err.buf = td_xmalloc(TD__LINE_MAX);
        w->out.out_fd = a->out_fd;
        w->err.out_fd = a->err_fd;
        /* redirected: the file only; teed or neither: the console as ever */
        int redir = a->redirects ? a->redirects[i] : 0;
        w->out.console = !(redir & TD_LAUNCH_STD_OUT);
        w->err.console = !(redir & TD_LAUNCH_STD_ERR);
        snprintf(w->prefix, sizeof w->prefix, "[rank %d] ", w->rank);
    }
    for (int i = 0; i < n; i++) {
        td__worker *w = &ws->w[i];
        if (a->log_dir)
            TD_CHECK_GOTO(open_log(a->log_dir, w->rank, a->restart_count, &w->log_fd, &w->log_path),
                          st, out);
        if (a->std_dir) TD_CHECK_GOTO(open_std_files(a, w), st, out);
        int po[2], pe[2];
        if (pipe2(po, O_CLOEXEC) < 0) {
            st = td_error_errno(TD_ERR_SYS, "pipe for worker rank %d", w->rank);
            goto out;
        }
        if (pipe2(pe, O_CLOEXEC) < 0) {
            st = td_error_errno(TD_ERR_SYS, "pipe for worker rank %d", w->rank);
            close(po[0]);
            close(po[1]);
            goto out;
        }
        /* Its own group (a signal to the group reaches its children too); SIGKILL when the
         * agent dies, even by SIGKILL, so no worker lives on as an orphan; the store sockets,
         * the signalfd and the other workers' pipes stay with the agent. */
        td_spawn_opts so;
        td_spawn_opts_init(&so);
        so.path = a->path;
        so.argv = a->argv;
        so.envp = a->envs[i];
        so.out_fd = po[1];
        so.err_fd = pe[1];
        so.death_signal = SIGKILL;
        so.close_fds = true;
        pid_t pid = -1;
        st = td_spawn(&so, &pid);
        close(po[1]);
        close(pe[1]);
        if (st != TD_OK) {
            close(po[0]);
            close(pe[0]);
            st = td_error(st, "worker rank %d: %s", w->rank, td_error_msg());
            goto out;
        }
        w->pid = pid;
        w->running = true;
        w->out.fd = po[0];
        w->err.fd = pe[0];
        fcntl(po[0], F_SETFL, O_NONBLOCK);
        fcntl(pe[0], F_SETFL, O_NONBLOCK);
    }
out:
    return st;
}
