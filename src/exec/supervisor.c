/* The supervisor (supervisor.h): the run's state machine on one event loop, driving a carrier.
 *
 * The loop watches the stop signals (a signalfd) and whatever the carrier watches (its nodes'
 * pipes, children, sockets, its own timers); its timers are the metrics ingest (with the Python
 * SDK's sdk.json, read when it changed) and the
 * system-metrics sample (periodic), whatever periodic work the job brings (job->on_loop: the
 * cloud controller's store push), and the machine's deadlines (a stop's grace, the pause before
 * a restart, max_duration: one-shot). Every event becomes one call of the machine; what it
 * returns is done here, in one place (act). The loop ends when the machine does. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/supervisor.h"
#include "tandem/endrec.h"

#define INGEST_PERIOD_S 0.5
#define SYSMON_PERIOD_S 2.0
/* A worker that finished its script's run (the SDK's end record) and has not exited this long
 * after is said to hang at exit; the run's note says so, renewed this often. */
#define HANG_SAY_S  10.0
#define HANG_NOTE_S 5.0

struct td__sup {
    const td_exec_job *job;
    td__carrier *carrier;
    td__sup_machine m;
    td_loop *loop;
    td_ingester *ing;
    td_sdk_watch sdk; /* RUN/sdk.json as last read (the Python SDK's config and summary) */
    uint64_t grace_timer, backoff_timer, limit_timer;
    int recorded_restarts;
    int world;           /* workers of an attempt: nodes x nproc_per_node */
    double attempt_wall; /* the attempt's start (wall clock): older SDK end records are not its */
    double hang_noted;   /* when the run's note last said which workers hang at exit (0: never) */
    char hang_said[300]; /* the ranks said to hang */
};

td_loop *td__sup_loop(td__sup *s) {
    return s->loop;
}

void td__sup_say(td__sup *s, const char *fmt, ...) {
    if (s->carrier->ops->before_say) s->carrier->ops->before_say(s->carrier);
    va_list ap;
    va_start(ap, fmt);
    fputs("tandem: ", s->job->out);
    vfprintf(s->job->out, fmt, ap);
    fputc('\n', s->job->out);
    fflush(s->job->out);
    va_end(ap);
}

static void on_grace(td_loop *l, void *user);
static void on_backoff(td_loop *l, void *user);
static void on_limit(td_loop *l, void *user);

/* Does what the machine asked. */
static void act(td__sup *s, td__sup_acts a) {
    td__carrier *c = s->carrier;
    if (a.say[0]) td__sup_say(s, "%s", a.say);
    if (a.todo & TD__SUP_DO_STOP_HARD) {
        td_loop_cancel(s->loop, s->grace_timer);
        s->grace_timer = 0;
        c->ops->stop(c, true);
    }
    if (a.todo & TD__SUP_DO_STOP_SOFT) c->ops->stop(c, false);
    if (a.todo & TD__SUP_DO_ARM_GRACE) {
        td_loop_cancel(s->loop, s->grace_timer);
        s->grace_timer = td_loop_timer(s->loop, a.grace_s, 0, on_grace, s);
    }
    if (a.todo & TD__SUP_DO_ARM_BACKOFF)
        s->backoff_timer = td_loop_timer(s->loop, a.backoff_s, 0, on_backoff, s);
    if (a.todo & TD__SUP_DO_ARM_LIMIT)
        s->limit_timer = td_loop_timer(s->loop, a.limit_s > 0 ? a.limit_s : 0, 0, on_limit, s);
    if (a.todo & TD__SUP_DO_RESTARTS) {
        int r = td__sup_restarts(&s->m);
        if (r != s->recorded_restarts) {
            if (td_run_set_restarts(s->job->store, s->job->run->id, r) == TD_OK)
                s->recorded_restarts = r;
            else
                td_error_clear(); /* said by the next try, or the end's record */
        }
    }
    if (a.todo & TD__SUP_DO_START) {
        td_loop_cancel(s->loop, s->grace_timer);
        s->grace_timer = 0;
        s->attempt_wall = td_wall_s() - 1.0; /* a second of slack between clocks */
        s->hang_said[0] = '\0';
        if (c->ops->start(c, s, a.resume) != TD_OK) {
            /* Nothing of the attempt runs: it is over, and failed. */
            td__sup_exit e = {.code = 1, .worker_code = -1};
            snprintf(e.cause, sizeof e.cause, "cannot start the %s nodes: %s", c->ops->name,
                     td_error_msg());
            td_error_clear();
            act(s, td__sup_exited(&s->m, &e, td_now_s()));
        }
    }
    if (a.todo & TD__SUP_DO_END) td_loop_stop(s->loop);
}

static void on_grace(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->grace_timer = 0;
    act(s, td__sup_grace_over(&s->m, td_now_s()));
}

static void on_backoff(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->backoff_timer = 0;
    act(s, td__sup_backoff_over(&s->m, td_now_s()));
}

static void on_limit(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->limit_timer = 0;
    act(s, td__sup_limit(&s->m, td_now_s()));
}

static void on_signal(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    td__sup *s = user;
    for (int sig; (sig = td_sigwatch_next(s->job->sigs));) {
        /* Only a first SIGTERM asks the store whether `tandem stop` was behind it. */
        bool asked = sig == SIGTERM && !s->m.stop.active && td_exec_stop_asked((void *)s->job);
        act(s, td__sup_signal(&s->m, sig, asked, td_now_s()));
    }
}

static void check_exit_hang(td__sup *s);

static void on_ingest(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    /* A full disk is said once; the ingester retries from its offset. */
    td_status st = td_ingester_poll(s->ing, NULL);
    if (st == TD_ERR_NOSPACE)
        act(s, td__sup_disk_full(&s->m, td_now_s()));
    else if (st != TD_OK)
        TD_LOG_WARN("metrics ingest: %s (will retry)", td_error_msg());
    td_error_clear();
    /* On the same timer: a running script's config and summary reach the record while it runs
     * (read only when the file changed; a bad file is a warning, once). */
    if (td_run_sdk_sync(s->job->store, s->job->run, &s->sdk, NULL) != TD_OK) {
        TD_LOG_DEBUG("reading sdk.json: %s (will retry)", td_error_msg());
        td_error_clear();
    }
    check_exit_hang(s);
}

/* Workers that finished their script's run (the Python SDK's end records, sdkend.c) but have not
 * exited: each said once, the run's note renewed while they hang; once every worker finished
 * and the attempt has not ended TANDEM_EXIT_GRACE seconds after the last finish, the workers
 * are stopped and the run ends (td__sup_exit_hung). A process on this machine is looked at
 * (pid and start time); one elsewhere counts as hanging only once every worker finished and the
 * attempt still runs. */
static void check_exit_hang(td__sup *s) {
    if (s->m.phase != TD__SUP_RUNNING || s->m.stop.active || s->m.hung || s->world <= 0) return;
    td__sdk_end *ends = td_xcalloc((size_t)s->world, sizeof *ends);
    if (!td__sdk_ends_read(s->job->run->run_dir, s->world, s->attempt_wall, ends)) goto out;
    int finished = 0;
    bool ok = true;
    double last = 0;
    for (int r = 0; r < s->world; r++)
        if (ends[r].finished && !ends[r].killed) {
            finished++;
            last = TD_MAX(last, ends[r].finish_time);
            if (ends[r].exit_code > 0) ok = false;
        }
    bool all = finished == s->world;
    double now = td_wall_s(), oldest = now;
    char ranks[300] = "";
    int nhung = 0;
    for (int r = 0; r < s->world; r++) {
        if (!ends[r].finished || ends[r].killed) continue;
        int alive = td__sdk_end_alive(&ends[r]);
        if (alive == 0 || (alive < 0 && !all)) continue;
        size_t len = strlen(ranks);
        snprintf(ranks + len, sizeof ranks - len, "%s%d", nhung ? ", " : "", r);
        nhung++;
        oldest = TD_MIN(oldest, ends[r].finish_time);
    }
    double hung_s = now - (all ? last : oldest);
    if (!nhung || hung_s < HANG_SAY_S) goto out;
    int64_t grace = td_env_int(TD_ENV_EXIT_GRACE);
    char note[700];
    snprintf(note, sizeof note,
             "rank%s %s finished training (tandem.finish) and ha%s not exited for %.0f s: %s at "
             "exit (a thread or a child process it waits for)",
             nhung > 1 ? "s" : "", ranks, nhung > 1 ? "ve" : "s", hung_s,
             nhung > 1 ? "they hang" : "it hangs");
    if (all && grace > 0 && hung_s >= (double)grace) {
        char end_note[700];
        snprintf(end_note, sizeof end_note,
                 "every worker finished training (tandem.finish); rank%s %s hung at exit for "
                 "%.0f s (TANDEM_EXIT_GRACE=%lld) and %s stopped",
                 nhung > 1 ? "s" : "", ranks, hung_s, (long long)grace,
                 nhung > 1 ? "were" : "was");
        act(s, td__sup_exit_hung(&s->m, end_note, ok, td_now_s()));
        goto out;
    }
    if (strcmp(ranks, s->hang_said)) {
        snprintf(s->hang_said, sizeof s->hang_said, "%s", ranks);
        td__sup_say(s, "run %s: %s%s", s->job->run->id, note,
                    all && grace > 0 ? "; the run stops the workers after TANDEM_EXIT_GRACE" : "");
    }
    if (now - s->hang_noted >= HANG_NOTE_S) {
        s->hang_noted = now;
        if (td_run_set_status(s->job->store, s->job->run->id, TD_RUN_RUNNING, -2, note) != TD_OK)
            td_error_clear();
    }
out:
    free(ends);
}

static void on_sample(td_loop *l, void *user) {
    (void)l;
    td__sup *s = user;
    s->carrier->ops->sample(s->carrier);
}

void td__sup_running_now(td__sup *s) {
    act(s, td__sup_running(&s->m, td_now_s()));
}

void td__sup_node_lost(td__sup *s, int node, const char *why) {
    act(s, td__sup_node_down(&s->m, node, why, td_now_s()));
}

void td__sup_node_interrupted(td__sup *s, int node, const char *why) {
    act(s, td__sup_node_preempted(&s->m, node, why, td_now_s()));
}

void td__sup_restarts_seen(td__sup *s, int node_restarts) {
    act(s, td__sup_node_restarts(&s->m, node_restarts));
}

static const char *signal_name(int sig, char *buf, size_t nbytes) {
    const char *abbrev = sig > 0 ? sigabbrev_np(sig) : NULL;
    if (abbrev)
        snprintf(buf, nbytes, "SIG%s", abbrev);
    else
        snprintf(buf, nbytes, "signal %d", sig);
    return buf;
}

/* How each worker of the attempt ended, in words built from the typed records: the nodes' end
 * records (endrec.h: each worker's exit code and signal) and the Python SDK's (a SIGTERM that
 * killed a script, which the shell in front of it turns into exit 143; a finish before the end).
 * A worker that exited 143 itself checkpointed (the exit-code contract); one killed by a signal
 * did not. */
static void workers_said(td__sup *s, td__sup_exit *e) {
    const td_run *run = s->job->run;
    int world = s->world;
    if (world <= 0) return;
    td__sdk_end *sdk = td_xcalloc((size_t)world, sizeof *sdk);
    td__sdk_ends_read(run->run_dir, world, s->attempt_wall, sdk);
    int *code = td_xcalloc((size_t)world, sizeof *code);
    int *sig = td_xcalloc((size_t)world, sizeof *sig);
    bool *seen = td_xcalloc((size_t)world, sizeof *seen);
    for (int i = 0; i < run->nodes; i++) {
        char *path = td_exec_end_record_path(run, i);
        td_end_record r;
        if (td_end_record_read(path, &r) == TD_OK) {
            for (int k = 0; k < r.nworkers; k++) {
                int rank = r.workers[k].rank;
                if (rank < 0 || rank >= world) continue;
                seen[rank] = true;
                code[rank] = r.workers[k].exit_code;
                sig[rank] = r.workers[k].signal;
            }
            td_end_record_clear(&r);
        }
        td_error_clear();
        free(path);
    }
    td__buf b = {0};
    td__buf_add(&b, "", 0);
    int known = 0, checkpointed = 0;
    for (int r = 0; r < world; r++) {
        char what[300], sn[32];
        int killed_by = sdk[r].killed ? sdk[r].signal
                        : !seen[r]    ? 0
                        : sig[r]      ? sig[r]
                        : code[r] > 128 && code[r] != 143 ? code[r] - 128
                                                          : 0;
        const char *finished = sdk[r].finished ? " after it finished training (tandem.finish)" : "";
        if (killed_by)
            snprintf(what, sizeof what, "rank %d was killed by %s without a checkpoint%s", r,
                     signal_name(killed_by, sn, sizeof sn),
                     sdk[r].killed && !sdk[r].finished
                         ? " (its script does not ask tandem.should_stop())"
                         : finished);
        else if (!seen[r])
            snprintf(what, sizeof what, "rank %d left no record (its launcher was ended)", r);
        else if (code[r] == 143)
            snprintf(what, sizeof what, "rank %d checkpointed and exited 143", r);
        else
            snprintf(what, sizeof what, "rank %d exited with code %d%s", r, code[r], finished);
        known += seen[r] || sdk[r].killed;
        checkpointed += !killed_by && seen[r] && code[r] == 143;
        td__buf_addf(&b, "%s%s", b.len ? "; " : "", what);
    }
    if (known) snprintf(e->workers, sizeof e->workers, "%s", b.s);
    e->all_checkpointed = checkpointed == world;
    free(b.s);
    free(seen);
    free(code);
    free(sig);
    free(sdk);
}

void td__sup_attempt_over(td__sup *s, const td__sup_exit *e) {
    td__sup_exit with = *e;
    workers_said(s, &with);
    act(s, td__sup_exited(&s->m, &with, td_now_s()));
}

/* The loop's turns until the machine ends; an epoll failure is said and the supervision goes
 * on, slowly, rather than spin or leave the nodes unwatched. */
static void run_loop(td__sup *s) {
    while (!td_loop_stopped(s->loop))
        if (td_loop_turn(s->loop, -1) != TD_OK) {
            TD_LOG_WARN("event loop: %s", td_error_msg());
            td_error_clear();
            usleep(10000);
        }
}

int td__supervise(const td_exec_job *job, td__carrier *c, int max_restarts, double grace_s,
                  const char *success_note, double t0) {
    td__sup s = {.job = job, .carrier = c, .recorded_restarts = job->base_restarts};
    td__sup_init(&s.m, job->run->id);
    s.m.max_restarts = max_restarts;
    s.m.max_duration_s = job->max_duration_s;
    s.m.grace_s = grace_s;
    s.m.base_restarts = job->base_restarts;
    s.m.resuming = job->resuming;
    s.m.success_note = success_note;
    s.world = job->run->nodes * job->run->nproc_per_node;

    char *metrics_dir = td_run_path(job->run->run_dir, TD_RUN_PATH_METRICS);
    td_status st = td_ingester_new(job->store, job->run->id, metrics_dir, &s.ing);
    free(metrics_dir);
    if (st == TD_OK) st = td_loop_new(&s.loop);
    if (st == TD_OK) st = td_loop_watch(s.loop, job->sigs->fd, TD_LOOP_READ, on_signal, &s);
    if (st != TD_OK) {
        int cli = td__exec_fail(job, t0, "supervisor error: %s", td_error_msg());
        td_error_print(st);
        td_loop_free(s.loop);
        td_ingester_free(s.ing);
        return cli;
    }
    td_loop_timer(s.loop, 0, INGEST_PERIOD_S, on_ingest, &s);
    if (c->ops->sample) td_loop_timer(s.loop, 0.5, SYSMON_PERIOD_S, on_sample, &s);
    /* The job's own periodic work (the cloud controller's store push): a field of the job, not
     * of this function, because the job reaches every carrier's td__supervise unchanged from
     * tandem run; td_loop_free below ends it with the loop. */
    if (job->on_loop) job->on_loop(s.loop, job->on_loop_user);

    act(&s, td__sup_begin(&s.m, td_now_s()));
    if (job->stop_signal) { /* a stop that came during the setup, before the loop */
        int sig = job->stop_signal;
        bool asked = sig == SIGTERM && td_exec_stop_asked((void *)job);
        act(&s, td__sup_signal(&s.m, sig, asked, td_now_s()));
    }
    run_loop(&s);
    td_loop_free(s.loop);

    if (c->ops->finish) c->ops->finish(c);
    if (c->ops->before_say) c->ops->before_say(c);
    td__exec_final_ingest(job->out, s.ing);
    td_ingester_free(s.ing);
    /* The script's last sdk.json (tandem.finish() writes it as the script ends). */
    if (td_run_sdk_sync(job->store, job->run, &s.sdk, NULL) != TD_OK) {
        TD_LOG_WARN("reading %s/sdk.json at the run's end: %s", job->run->run_dir, td_error_msg());
        td_error_clear();
    }
    if (td__sup_restarts(&s.m) != s.recorded_restarts &&
        td_run_set_restarts(job->store, job->run->id, td__sup_restarts(&s.m)) != TD_OK)
        td_error_clear();
    td__exec_outcome o = s.m.outcome;
    if (c->ops->outcome) c->ops->outcome(c, &s.m, &o);
    return td__exec_record_end(job, &o, t0);
}
