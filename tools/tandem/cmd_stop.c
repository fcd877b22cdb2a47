/* tandem stop: ask a run's supervisor to stop it (the workers checkpoint on SIGTERM). A run whose
 * supervisor is gone (its pid free, or held by another process since) gets no signal: it is
 * marked failed, and the error says so with the run's note. A run that lives in the cloud
 * (tandem run -d of an aws run) is asked through its store in S3, which its controller polls
 * (docs/runs.md). */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"
#include "tandem/workflow.h"

enum { OPT_WAIT = 1 };

static const cli_opt opts[] = {
    {OPT_WAIT, "wait", 0, "SECONDS", "how long to wait for the run to end (default 60)", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem stop",
    .usage = "RUN [--wait SECONDS]",
    .about = "Sends SIGTERM to the run's supervisor, which forwards it to the workers\n"
             "(they checkpoint and exit), and waits for the run to end (default 60 s).\n",
    .opts = opts,
};

int cmd_stop(int argc, char **argv) {
    const char *id = NULL;
    double wait_s = 60;
    int rc;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (c == OPT_WAIT) {
            if (td_parse_f64("--wait", p.value, &wait_s) != TD_OK || wait_s < 0) {
                td_error_clear();
                return cli_error(&verb, "--wait '%s': expects seconds >= 0", p.value);
            }
        } else if ((rc = run_cli_id(&verb, p.value, &id)) >= 0)
            return rc;
    }
    if (!id) return run_cli_usage_error(&verb);
    /* Not run_cli_open_run: td_run_stop resolves the prefix itself, and a missing project
     * directory counts with an unknown run as a usage error here. */
    td_rundb *store;
    td_status st = td_rundb_open(NULL, &store);
    td_run r = {0};
    /* a run that lives in the cloud: asked through its store, which its controller polls */
    int remote = 0;
    if (st == TD_OK && td_run_find(store, id, &r) == TD_OK && td_run_is_remote(&r)) {
        remote = 1;
        run_cli_attach(store, &r);
        st = td_run_status_is_final(r.status)
                 ? td_error(TD_ERR_INVALID, "run %s already ended (%s)", r.id,
                            td_run_status_str(r.status))
                 : td_exec_remote_stop(store, &r, wait_s);
    } else {
        td_run_clear(&r);
        memset(&r, 0, sizeof r);
        td_error_clear();
    }
    if (st == TD_OK && !remote) st = td_run_stop(store, id, wait_s, &r);
    /* A run on a cluster scheduler whose supervisor died (the run is recorded as ended, and
     * td_run_stop had nobody to ask) may have left its job queued or running there: cancel it
     * too. A supervisor that recorded the end left no job behind, and this does nothing. */
    td_run cur = {0};
    int have_cur = store && (st == TD_OK || st == TD_ERR_INVALID) &&
                   td_run_find(store, id, &cur) == TD_OK && td_run_status_is_final(cur.status);
    /* Why it had ended, for the "already ended" error (a supervisor found gone just now). */
    char *ended_note = st == TD_ERR_INVALID && have_cur && cur.note ? td_xstrdup(cur.note) : NULL;
    if (have_cur && !remote && td_executor_of_run(&cur)) {
        int cancelled = 0;
        char what[512];
        td_status cst =
            td_executor_of_run(&cur)->cancel_orphan(&cur, &cancelled, what, sizeof what);
        if (cst != TD_OK) {
            if (st == TD_OK) td_run_clear(&r);
            st = cst;
        } else if (cancelled) {
            printf("%s\n", what);
            if (st != TD_OK) { /* "already ended": its job had not */
                td_error_clear();
                free(ended_note);
                ended_note = NULL;
                st = TD_OK;
                r = cur;
                memset(&cur, 0, sizeof cur);
            }
        }
    }
    td_run_clear(&cur);
    rc = 0;
    if (st != TD_OK) {
        run_cli_error(st);
        if (ended_note) fprintf(stderr, "tandem: note: %s\n", run_cli_text(ended_note));
        rc = st == TD_ERR_NOTFOUND || st == TD_ERR_INVALID ? 2 : 1;
    } else if (td_run_status_is_final(r.status)) {
        printf("run %s %s (exit code %d)\n", run_cli_text(r.id), td_run_status_str(r.status),
               r.exit_code);
    } else {
        printf("run %s: stop requested; still %s after %.0f s (its supervisor escalates to "
               "SIGKILL after the grace period)\n",
               run_cli_text(r.id), td_run_status_str(r.status), wait_s);
        rc = 1;
    }
    free(ended_note);
    run_cli_close(store, &r);
    return rc;
}
