/* tandem run: run a workflow from the project's workflow file as a tracked run. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/exec.h"
#include "tandem/workflow.h"

enum { OPT_FILE = 1, OPT_DETACH, OPT_PARAM, OPT_RESUME };

static const cli_opt run_opts[] = {
    {OPT_FILE, "file", 'f', "FILE",
     "workflow file (default .tandem/workflows.yaml of the project:\n"
     "$TANDEM_HOME or the current directory)",
     0},
    {OPT_DETACH, "detach", 'd', NULL, "run in the background; print the run id and return", 0},
    {OPT_PARAM, "param", 0, "KEY=VALUE", "override or add a param (repeatable)", CLI_REPEAT},
    {OPT_RESUME, "resume", 0, "RUN",
     "continue a preempted, stopped or failed run (same id) with\nTANDEM_RESUME=1", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem run",
    .usage = "[WORKFLOW] [-f FILE] [-d] [--param KEY=VALUE]...\n--resume RUN [-d]",
    .about = "Runs a workflow as a tracked run. WORKFLOW is a name from the workflow file\n"
             "(optional when it has one).\n",
    .opts = run_opts,
    .epilog = "Exit: 0 succeeded, 1 failed or stopped, 2 usage, 143 preempted (resumable).\n",
};

static char *default_file(void) {
    const char *home = td_env_str(TD_ENV_HOME);
    if (home && *home) return td_xasprintf("%s/.tandem/workflows.yaml", home);
    return td_xstrdup(".tandem/workflows.yaml");
}

int cmd_run(int argc, char **argv) {
    const char *name = NULL, *file = NULL, *resume = NULL;
    int detach = 0;
    const char **params = td_xcalloc((size_t)argc, sizeof *params);
    size_t nparams = 0;
    int rc = 2;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        switch (c) {
        case CLI_EXIT:
            rc = p.exit_code;
            goto out;
        case OPT_DETACH:
            detach = 1;
            break;
        case OPT_FILE:
            file = p.value;
            break;
        case OPT_PARAM:
            params[nparams++] = p.value;
            break;
        case OPT_RESUME:
            resume = p.value;
            break;
        default: /* CLI_ARG */
            if (name) {
                cli_error(&verb, "one workflow at a time ('%s' and '%s')", name, p.value);
                goto out;
            }
            name = p.value;
        }
    }
    if (resume && nparams) {
        cli_error(&verb, "--resume re-runs the stored command; --param cannot change it (start "
                         "a new run instead)");
        goto out;
    }

    char *path = file ? td_xstrdup(file) : default_file();
    td_workflow_file *wf = NULL;
    td_workflow *w = NULL;
    td_status st = TD_OK;
    char *run_id = NULL;
    int exit_code = 1;
    if (resume) {
        /* The workflow file, when it still defines the run's workflow, supplies setup, env and
         * artifacts; the command itself always comes from the stored run. */
        td_rundb *store = NULL;
        td_run r = {0};
        st = td_rundb_open(NULL, &store);
        if (st == TD_OK) st = td_run_find(store, resume, &r);
        if (st == TD_OK && access(path, F_OK) == 0) {
            const td_workflow *found = NULL;
            st = td_workflow_file_load(path, &wf);
            if (st == TD_OK && td_workflow_find(wf, r.workflow, &found) == TD_OK)
                w = td_workflow_copy(found);
            else if (st == TD_OK && td_executor_of_run(&r))
                td_error_clear(); /* refused below */
            else if (st == TD_OK) {
                fprintf(stderr,
                        "tandem run: workflow '%s' is no longer in %s; resuming with "
                        "the stored command only (no setup, env or artifacts)\n",
                        r.workflow, path);
                td_error_clear();
            }
        }
        /* The stored command is not the whole job on a scheduler: without the workflow its
         * executor settings (partition, time limit, ...) are unknown, and running it locally
         * instead would be a surprise. */
        if (st == TD_OK && !w && td_executor_of_run(&r))
            st = td_error(TD_ERR_INVALID,
                          "run %s ran on the %s executor, but its workflow '%s' is not in %s, "
                          "so its %s settings are unknown; put the workflow back (or pass the "
                          "file that has it with -f) to resume it",
                          r.id, td_executor_of_run(&r)->name, r.workflow, path,
                          td_executor_of_run(&r)->name);
        td_run_clear(&r);
        td_rundb_close(store);
    } else {
        st = td_workflow_file_load(path, &wf);
        if (st == TD_OK) {
            const td_workflow *found = NULL;
            if (!name && wf->count == 1)
                found = &wf->items[0];
            else if (!name) {
                char list[1024] = "";
                size_t used = 0;
                for (size_t i = 0; i < wf->count && used < sizeof list; i++)
                    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                             wf->items[i].name);
                fprintf(stderr, "tandem run: which workflow? %s defines: %s\n", path, list);
                rc = 2;
                goto done;
            } else {
                st = td_workflow_find(wf, name, &found);
            }
            if (st == TD_OK) w = td_workflow_copy(found);
            for (size_t i = 0; st == TD_OK && i < nparams; i++)
                st = td_workflow_set_param(w, params[i]);
        }
    }
    if (st == TD_OK) {
        /* Instances a dead supervisor of this project left running are terminated first (no
         * AWS call unless a run's RUN/instances.json lists one alive and its lock is free). */
        td_rundb *gc_store = NULL;
        if (td_rundb_open(NULL, &gc_store) == TD_OK) td_gc_orphans(gc_store, stderr, NULL);
        td_error_clear();
        td_rundb_close(gc_store);
        td_run_options opts = {.detach = detach, .resume_run = resume};
        st = td_workflow_run(w, &opts, &run_id, &exit_code);
    }
    if (st != TD_OK) {
        td_error_print(st);
        rc = st == TD_ERR_USAGE || st == TD_ERR_FORMAT || st == TD_ERR_NOTFOUND ? 2 : 1;
        if (st == TD_ERR_INVALID) rc = 2;
    } else {
        if (detach) printf("%s\n", run_id);
        rc = exit_code;
    }
done:
    free(run_id);
    td_workflow_free(w);
    td_workflow_file_free(wf);
    free(path);
out:
    free(params);
    return rc;
}
