/* The executor interface (tandem/exec.h) and what every executor shares: finding and running
 * the scheduler's client commands, shell quoting for batch scripts, secrets on disk, and
 * recording how a run ended exactly as the local executor does. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/internal.h"
#include "tandem/endrec.h"
#include "tandem/loop.h"

/* ---- the executors ---- */
static const td_executor *const executors[] = {&td__executor_slurm, &td__executor_ssh,
                                               &td__executor_aws};

const td_executor *td_executor_find(const char *name) {
    for (size_t i = 0; name && i < TD_ARRAY_LEN(executors); i++)
        if (!strcmp(executors[i]->name, name)) return executors[i];
    return NULL;
}

const char *td_executor_names(void) {
    return "slurm, ssh or aws";
}

const td_executor *td_executor_of_run(const td_run *run) {
    /* Each executor leaves its mark in the run directory (Slurm its batch script, ssh its host
     * list, aws its instances); the local one leaves none. */
    if (!run || !run->run_dir) return NULL;
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_SLURM_SCRIPT);
    int slurm = access(path, F_OK) == 0;
    free(path);
    path = td_run_path(run->run_dir, TD_RUN_PATH_SSH_HOSTS);
    int ssh = access(path, F_OK) == 0;
    free(path);
    path = td_run_path(run->run_dir, TD_RUN_PATH_INSTANCES);
    int aws = access(path, F_OK) == 0;
    free(path);
    return slurm ? &td__executor_slurm : ssh ? &td__executor_ssh : aws ? &td__executor_aws : NULL;
}

/* ---- strings ---- */
void td__buf_add(td__buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = td_xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void td__buf_addf(td__buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        fprintf(stderr, "tandem: out of memory formatting a string\n");
        abort();
    }
    td__buf_add(b, s, (size_t)n);
    free(s);
}

void td__buf_quote(td__buf *b, const char *s) {
    td__buf_add(b, "'", 1);
    for (const char *p = s; *p; p++) {
        if (*p == '\'')
            td__buf_add(b, "'\\''", 4);
        else
            td__buf_add(b, p, 1);
    }
    td__buf_add(b, "'", 1);
}

void td__buf_export_numerics(td__buf *b) {
    static const char *const names[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TANDEM_ISA"};
    for (size_t i = 0; i < TD_ARRAY_LEN(names); i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        td__buf_addf(b, "export %s=", names[i]);
        td__buf_quote(b, v);
        td__buf_add(b, "\n", 1);
    }
}

/* ---- client commands ---- */
char *td__exec_which(const char *prog) {
    if (strchr(prog, '/')) return access(prog, X_OK) == 0 ? td_xstrdup(prog) : NULL;
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0) {
            char *cand = td_xasprintf("%.*s/%s", (int)n, p, prog);
            struct stat stt;
            if (stat(cand, &stt) == 0 && S_ISREG(stt.st_mode) && access(cand, X_OK) == 0)
                return cand;
            free(cand);
        }
        p += n;
        if (*p == ':') p++;
    }
    return NULL;
}

#define CAPTURE_MAX (64 * 1024)

typedef struct {
    int fds[2]; /* stdout, stderr; -1 once at their end */
    td__buf bufs[2];
    int open, timed_out;
} capture;

static void on_capture(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    capture *c = user;
    int i = fd == c->fds[0] ? 0 : 1;
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
        td_loop_unwatch(l, fd);
        close(fd);
        c->fds[i] = -1;
        if (--c->open == 0) td_loop_stop(l);
        return;
    }
    if (c->bufs[i].len < CAPTURE_MAX)
        td__buf_add(&c->bufs[i], chunk, TD_MIN((size_t)n, CAPTURE_MAX - c->bufs[i].len));
}

static void on_capture_deadline(td_loop *l, void *user) {
    ((capture *)user)->timed_out = 1;
    td_loop_stop(l);
}

td_status td__exec_capture(char *const *argv, const char *cwd, double timeout_s, char **out,
                           char **err, int *code) {
    *out = *err = NULL;
    *code = -1;
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) != 0) return td_error_errno(TD_ERR_SYS, "pipe to run %s", argv[0]);
    if (pipe2(pe, O_CLOEXEC) != 0) {
        close(po[0]);
        close(po[1]);
        return td_error_errno(TD_ERR_SYS, "pipe to run %s", argv[0]);
    }
    td_spawn_opts so;
    td_spawn_opts_init(&so);
    so.argv = argv;
    so.cwd = cwd;
    so.out_fd = po[1];
    so.err_fd = pe[1];
    so.death_signal = SIGKILL; /* a client command is nothing without us */
    pid_t pid;
    td_status st = td_spawn(&so, &pid);
    close(po[1]);
    close(pe[1]);
    if (st != TD_OK) {
        close(po[0]);
        close(pe[0]);
        return st;
    }
    capture cap = {.fds = {po[0], pe[0]}, .open = 2};
    td__buf_add(&cap.bufs[0], "", 0);
    td__buf_add(&cap.bufs[1], "", 0);
    /* Both pipes and the deadline on a loop of its own: a bounded wait for one command. */
    td_loop *l = NULL;
    st = td_loop_new(&l);
    for (int i = 0; st == TD_OK && i < 2; i++)
        st = td_loop_watch(l, cap.fds[i], TD_LOOP_READ, on_capture, &cap);
    if (st == TD_OK) {
        td_loop_timer(l, timeout_s, 0, on_capture_deadline, &cap);
        st = td_loop_run(l);
    }
    td_loop_free(l);
    int timed_out = cap.timed_out || st != TD_OK;
    td_error_clear();
    for (int i = 0; i < 2; i++)
        if (cap.fds[i] >= 0) close(cap.fds[i]);
    if (timed_out) kill(-pid, SIGKILL); /* it leads its own group: take its children too */
    int status = 0;
    td_waitpid(pid, &status, 0);
    *code = timed_out ? 124 : td_wait_exit_code(status);
    *out = cap.bufs[0].s;
    *err = cap.bufs[1].s;
    return TD_OK;
}

td_status td__write_private(const char *path, const char *what, const char *text) {
    char *tmp = td_xasprintf("%s.tmp.%d", path, (int)getpid());
    td_status st = TD_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        st = td_error_errno(TD_ERR_IO, "cannot create the %s %s", what, tmp);
        free(tmp);
        return st;
    }
    size_t n = strlen(text), done = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            st = td_error_errno(TD_ERR_IO, "cannot write the %s %s", what, tmp);
            break;
        }
        done += (size_t)w;
    }
    if (st == TD_OK && fsync(fd) != 0)
        st = td_error_errno(TD_ERR_IO, "cannot sync the %s %s", what, tmp);
    close(fd);
    if (st == TD_OK && rename(tmp, path) != 0)
        st = td_error_errno(TD_ERR_IO, "cannot rename %s to %s", tmp, path);
    if (st != TD_OK) unlink(tmp);
    free(tmp);
    return st;
}

/* ---- output ---- */
void td__exec_say(FILE *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tandem: ", out);
    vfprintf(out, fmt, ap);
    fputc('\n', out);
    fflush(out);
    va_end(ap);
}

void td__exec_write_all(int fd, const char *s, size_t n) {
    while (fd >= 0 && n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

void td__exec_joined_lines(const char *s, char *out, size_t nbytes) {
    size_t used = 0;
    out[0] = '\0';
    while (s && *s && used + 1 < nbytes) {
        size_t n = strcspn(s, "\n");
        size_t k = n;
        while (k > 0 && isspace((unsigned char)s[k - 1])) k--;
        if (k) { /* snprintf says what it would have written: never step past the end */
            int w = snprintf(out + used, nbytes - used, "%s%.*s", used ? "; " : "", (int)k, s);
            used = w < 0 ? nbytes - 1 : TD_MIN(nbytes - 1, used + (size_t)w);
        }
        s = s[n] ? s + n + 1 : NULL;
    }
}

void td__exec_final_ingest(FILE *out, td_ingester *ing) {
    td_status st = td_ingester_poll(ing, NULL);
    if (st != TD_OK && st != TD_ERR_NOSPACE)
        TD_LOG_WARN("final metrics ingest: %s", td_error_msg());
    td_error_clear();
    size_t bad = td_ingester_malformed(ing);
    if (bad) td__exec_say(out, "%zu malformed metrics line%s skipped", bad, bad > 1 ? "s" : "");
}

/* ---- secrets ---- */
td_status td__exec_token(const td_run *run, char **path_out) {
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_TOKEN);
    *path_out = path;
    struct stat stt;
    if (stat(path, &stt) == 0 && S_ISREG(stt.st_mode) && stt.st_size > 0) {
        if ((stt.st_mode & 077) && chmod(path, 0600) != 0)
            return td_error_errno(TD_ERR_IO, "cannot make the token file %s private (0600)", path);
        return TD_OK;
    }
    char token[33], text[40];
    TD_CHECK(td_random_hex(token, 16));
    snprintf(text, sizeof text, "%s\n", token);
    return td__write_private(path, "rendezvous token", text);
}

td_status td__exec_read_token(const td_run *run, char token[33]) {
    char *path = NULL;
    td_status st = td__exec_token(run, &path);
    if (st == TD_OK) {
        FILE *f = fopen(path, "r");
        if (!f || !fgets(token, 33, f))
            st = td_error_errno(TD_ERR_IO, "reading the run's token %s", path);
        if (f) fclose(f);
        token[strcspn(token, "\n")] = '\0';
    }
    free(path);
    return st;
}

char *td__exec_code_tar_script(const td_exec_job *job) {
    td__buf l = {0};
    td__buf_addf(&l, "cd ");
    td__buf_quote(&l, job->work_dir);
    td__buf_addf(&l, " || exit 1\nif git -C ");
    td__buf_quote(&l, job->project_dir);
    td__buf_addf(&l, " rev-parse --is-inside-work-tree >/dev/null 2>&1; then git -C ");
    td__buf_quote(&l, job->project_dir);
    td__buf_addf(&l, " ls-files -z -co --exclude-standard -- . ':(exclude).tandem'; else "
                     "find -L . -mindepth 1 \\( -name .git -o -name .tandem \\) -prune -o ! "
                     "-type d -print0; fi | tar --null -T - -chf - --ignore-failed-read");
    return l.s;
}

void td__exec_echo_rank_log(td__echo *echo, const char *name, const char *bytes, size_t n) {
    if (strncmp(name, "logs/rank-", 10)) return;
    td__echo_file *e = NULL;
    for (size_t i = 0; i < TD_ARRAY_LEN(echo->files) && !e; i++)
        if (!strcmp(echo->files[i].name, name) || !echo->files[i].name[0]) e = &echo->files[i];
    if (!e) return;
    if (!e->name[0]) {
        snprintf(e->name, sizeof e->name, "%s", name);
        e->at_line_start = 1;
    }
    int rank = atoi(name + 10);
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    for (size_t i = 0; i < n;) {
        if (e->at_line_start) td__exec_write_all(STDOUT_FILENO, prefix, (size_t)plen);
        const char *nl = memchr(bytes + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - bytes - i) + 1 : n - i;
        td__exec_write_all(STDOUT_FILENO, bytes + i, len);
        e->at_line_start = nl != NULL;
        i += len;
    }
}

void td__exec_record_arrived(const td_run *run, const char *name) {
    const char *rec = td_run_path_name(TD_RUN_PATH_SDK_INBOX);
    size_t rlen = strlen(rec);
    if (strncmp(name, rec, rlen) || strcmp(name + rlen, "/sdk.json")) return;
    char *from = td_xasprintf("%s/%s", run->run_dir, name);
    char *to = td_run_path(run->run_dir, TD_RUN_PATH_SDK);
    if (rename(from, to) != 0)
        TD_LOG_WARN("the script's sdk.json from node 0: moving %s to %s: %s", from, to,
                    strerror(errno));
    free(from);
    free(to);
}

/* ---- the end of a run ---- */
int td__exec_fail(const td_exec_job *job, double t0, const char *fmt, ...) {
    td__exec_outcome o = {.status = TD_RUN_FAILED, .exit_code = -2, .cli_code = 1};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o.note, sizeof o.note, fmt, ap);
    va_end(ap);
    return td__exec_record_end(job, &o, t0);
}

int td__exec_record_end(const td_exec_job *job, const td__exec_outcome *o, double t0) {
    const td_run *run = job->run;
    if (job->nartifacts) {
        size_t copied = 0;
        if (td_artifacts_collect(job->store, run, job->work_dir, job->artifacts, job->nartifacts,
                                 &copied) != TD_OK) {
            TD_LOG_WARN("artifacts: %s", td_error_msg());
            td_error_clear();
        } else if (copied) {
            fprintf(job->out, "tandem: %zu artifact file%s stored\n", copied,
                    copied > 1 ? "s" : "");
        }
        /* artifacts: {to: s3://...}: a failed upload warns; the local copies stand */
        if (job->artifacts_to &&
            td_artifacts_s3_upload(job->store, run, job->artifacts_to, job->out) != TD_OK) {
            TD_LOG_WARN("artifacts: %s", td_error_msg());
            td_error_clear();
        }
    }
    /* what the workers stored there themselves (tandem.artifact of the Python SDK) */
    size_t found = 0;
    if (td_artifacts_register_found(job->store, run, &found) != TD_OK) {
        TD_LOG_WARN("artifacts: %s", td_error_msg());
        td_error_clear();
    }
    td_log_file *logs = NULL;
    size_t nlogs = 0;
    if (td_logs_scan(job->store, run, &logs, &nlogs) == TD_OK)
        td_log_files_free(logs, nlogs);
    else
        td_error_clear();
    td_status st = td_run_set_status(job->store, run->id, o->status, o->exit_code,
                                     o->note[0] ? o->note : NULL);
    if (st != TD_OK) {
        /* The job's outcome stands; only its record is missing (a full disk names itself). */
        td_error_print(st);
        fprintf(job->out, "tandem: run %s %s after %.1f s, but its record could not be written\n",
                run->id, td_run_status_str(o->status), td_now_s() - t0);
        fflush(job->out);
        return st == TD_ERR_NOSPACE ? o->cli_code : 1;
    }
    /* The stored note: the store adds what it met (a full disk). */
    char note[1024];
    snprintf(note, sizeof note, "%s", o->note);
    td_run cur = {0};
    if (td_run_find(job->store, run->id, &cur) == TD_OK && cur.note && *cur.note)
        snprintf(note, sizeof note, "%s", cur.note);
    td_run_clear(&cur);
    td_error_clear();
    char code[32] = "no exit code";
    if (o->exit_code >= 0) snprintf(code, sizeof code, "exit code %d", o->exit_code);
    fprintf(job->out, "tandem: run %s %s after %.1f s (%s)%s%s\n", run->id,
            td_run_status_str(o->status), td_now_s() - t0, code, note[0] ? ": " : "", note);
    fflush(job->out);
    return o->cli_code;
}

int td_exec_end_before_job(const td_exec_job *job, td_run_status status, int exit_code,
                           const char *note, double t0) {
    td__exec_outcome o = {.status = status, .exit_code = exit_code, .cli_code = 1};
    snprintf(o.note, sizeof o.note, "%s", note);
    return td__exec_record_end(job, &o, t0);
}

/* ---- the nodes' end records ---- */

char *td_exec_end_record_path(const td_run *run, int node) {
    return td_xasprintf("%s/%s/node-%d.json", run->run_dir, td_run_path_name(TD_RUN_PATH_END),
                        node);
}

td_status td_exec_end_records_reset(const td_run *run, int nodes) {
    char *dir = td_run_path(run->run_dir, TD_RUN_PATH_END);
    td_status st = td_mkdirs(dir);
    free(dir);
    for (int i = 0; st == TD_OK && i < nodes; i++) {
        char *path = td_exec_end_record_path(run, i);
        if (unlink(path) != 0 && errno != ENOENT)
            st = td_error_errno(TD_ERR_IO, "removing the old end record %s", path);
        free(path);
    }
    return st;
}

void td_exec_end_records_read(const td_run *run, int nodes, const int *launch_codes,
                              td_exec_end_summary *e) {
    char other[1024] = "";
    memset(e, 0, sizeof *e);
    e->worker_code = -1;
    for (int i = 0; i < nodes; i++) {
        char *path = td_exec_end_record_path(run, i);
        td_end_record r;
        int code = launch_codes ? launch_codes[i] : -1;
        if (td_end_record_read(path, &r) != TD_OK) {
            if (code != 0 && !other[0])
                snprintf(other, sizeof other,
                         "the launcher of node %d %s and left no end record (%s); see tandem "
                         "logs %s",
                         i, code > 0 ? "exited with an error" : "ended", td_error_msg(), run->id);
            td_error_clear();
            free(path);
            continue;
        }
        e->records++;
        e->restarts = TD_MAX(e->restarts, r.restarts);
        if (r.has_failure && e->worker_code < 0) {
            e->worker_code = r.failure.exit_code;
            snprintf(e->cause, sizeof e->cause, "%.500s%s%.500s", r.cause,
                     r.failure_line[0] ? ": " : "", r.failure_line);
        } else if (!other[0] && r.cause[0] &&
                   (r.outcome == TD_END_FAILED || r.outcome == TD_END_ERROR)) {
            snprintf(other, sizeof other, "%s", r.cause);
        }
        td_end_record_clear(&r);
        free(path);
    }
    if (!e->cause[0]) snprintf(e->cause, sizeof e->cause, "%s", other);
}

/* ---- a run's stop ---- */

td_exec_stop_step td_exec_stop_signal(td_exec_stop *s, int sig, double now,
                                      bool (*asked)(void *user), void *user) {
    td_stop_action a = td_stop_signals_take(&s->signals, sig, now);
    if (a == TD_STOP_IGNORE || s->hard) return TD_EXEC_STOP_NONE;
    s->last_signal = sig;
    if (!s->active) {
        s->active = true;
        bool user_stop = sig != SIGTERM || (asked && asked(user));
        s->preempt = !user_stop;
        snprintf(s->stopped_by, sizeof s->stopped_by, "%s",
                 !user_stop      ? ""
                 : sig == SIGINT ? "SIGINT (Ctrl-C)"
                 : sig == SIGHUP ? "SIGHUP"
                                 : "tandem stop");
        return TD_EXEC_STOP_SOFT;
    }
    if (a == TD_STOP_ESCALATE) {
        s->hard = true;
        return TD_EXEC_STOP_HARD;
    }
    return TD_EXEC_STOP_AGAIN;
}

td_exec_stop_step td_exec_stop_max_duration(td_exec_stop *s, double max_duration_s, double now) {
    if (s->active) return TD_EXEC_STOP_NONE;
    s->active = true;
    td_stop_signals_begin(&s->signals, now);
    snprintf(s->stopped_by, sizeof s->stopped_by, "max_duration of %.0f s exceeded",
             max_duration_s);
    return TD_EXEC_STOP_SOFT;
}

bool td_exec_stop_requested(td_rundb *store, const char *run_id) {
    td_run cur;
    bool asked = false;
    if (td_run_find(store, run_id, &cur) == TD_OK) {
        asked = cur.stop_requested;
        td_run_clear(&cur);
    }
    td_error_clear();
    return asked;
}

bool td_exec_stop_asked(void *job) {
    const td_exec_job *j = job;
    return td_exec_stop_requested(j->store, j->run->id);
}
