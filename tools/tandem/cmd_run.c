/* tandem run: run a workflow from the project's workflow file as a tracked run. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/exec.h"
#include "tandem/workflow.h"

enum {
    OPT_FILE = 1,
    OPT_DETACH,
    OPT_PARAM,
    OPT_RESUME,
    OPT_NAME,
    OPT_NPROC,
    OPT_TAG,
    OPT_GROUP,
    OPT_NOTES,
    OPT_MAX_RESTARTS
};

static const cli_opt run_opts[] = {
    {OPT_FILE, "file", 'f', "FILE",
     "workflow file (default .tandem/workflows.yaml of the project:\n"
     "$TANDEM_HOME or the current directory)",
     0},
    {OPT_DETACH, "detach", 'd', NULL, "run in the background; print the run id and return", 0},
    {OPT_PARAM, "param", 0, "KEY=VALUE", "override or add a param (repeatable)", CLI_REPEAT},
    {OPT_RESUME, "resume", 0, "RUN",
     "continue a preempted, stopped or failed run (same id) with\nTANDEM_RESUME=1", 0},
    {OPT_NAME, "name", 0, "NAME",
     "with -- CMD: the run's workflow name (default: the script's\nor program's name)", 0},
    {OPT_NPROC, "nproc-per-node", 0, "N", "with -- CMD: workers (default 1), as tandem launch's",
     0},
    {OPT_MAX_RESTARTS, "max-restarts", 0, "N",
     "with -- CMD: restart the workers up to N times after one\nfails (a workflow's max_restarts; "
     "default 0)",
     0},
    {OPT_TAG, "tag", 0, "TAG", "label the run (repeatable; see tandem tag)", CLI_REPEAT},
    {OPT_GROUP, "group", 0, "GROUP", "put the run in a group (see tandem group)", 0},
    {OPT_NOTES, "notes", 0, "TEXT", "the run's notes (see tandem note)", 0},
    {0},
};

static const cli_command verb = {
    .name = "tandem run",
    .usage = "[WORKFLOW] [-f FILE] [-d] [--param KEY=VALUE]... [--tag TAG]... [--group G]\n"
             "[--name NAME] [--nproc-per-node N] [--max-restarts N] [-d] [--param K=V]... [--tag "
             "T]... -- "
             "CMD "
             "[ARG]...\n"
             "--resume RUN [-d] [--tag TAG]...",
    .about = "Runs a workflow as a tracked run. WORKFLOW is a name from the workflow file\n"
             "(optional when it has one). With -- CMD, runs that command instead, on this\n"
             "machine, tracked as a workflow of one command would be (no workflow file needed;\n"
             "params are appended to it as --KEY VALUE, as to a workflow's command).\n",
    .opts = run_opts,
    .epilog = "Exit: 0 succeeded, 1 failed or stopped, 2 usage, 143 preempted (resumable).\n",
};

/* s as one shell word: as is when the shell would read it so (the recorded command stays
 * readable), else in '...' with each ' written as '\''. */
static void add_quoted(char **out, size_t *len, const char *s) {
    size_t n = strlen(s), cap = *len + 4 * n + 4;
    *out = td_xrealloc(*out, cap);
    char *o = *out + *len;
    int plain = n > 0;
    for (const char *c = s; *c && plain; c++)
        plain = isalnum((unsigned char)*c) || strchr("_./=:,+@%-", *c);
    if (plain) {
        memcpy(o, s, n + 1);
        *len += n;
        return;
    }
    *o++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *s;
        }
    }
    *o++ = '\'';
    *o = '\0';
    *len = (size_t)(o - *out);
}

/* The name of a command's run: its script's (train for python3 train.py), else its program's,
 * in the characters a workflow's name may have. */
static char *command_name(char *const *cmd, int n) {
    const char *pick = cmd[0];
    for (int i = 0; i < n; i++) {
        size_t len = strlen(cmd[i]);
        if (len > 3 && !strcmp(cmd[i] + len - 3, ".py")) {
            pick = cmd[i];
            break;
        }
    }
    const char *slash = strrchr(pick, '/');
    char *name = td_xstrdup(slash ? slash + 1 : pick);
    char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".py")) *dot = '\0';
    for (char *c = name; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("_-.", *c)) *c = '-';
    if (!*name) {
        free(name);
        name = td_xstrdup("command");
    }
    return name;
}

/* A workflow of one command (tandem run -- CMD), as a workflow file would give it. */
static td_workflow *command_workflow(const char *name, int nproc, char *const *cmd, int n) {
    td_workflow *w = td_xcalloc(1, sizeof *w);
    w->name = name ? td_xstrdup(name) : command_name(cmd, n);
    w->nodes = 1;
    w->nproc_per_node = nproc;
    char *line = NULL;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (i) {
            line = td_xrealloc(line, len + 2);
            line[len++] = ' ';
            line[len] = '\0';
        }
        add_quoted(&line, &len, cmd[i]);
    }
    w->commands = td_xcalloc(1, sizeof *w->commands);
    w->commands[0] = line;
    w->ncommands = 1;
    return w;
}

static char *default_file(void) {
    const char *home = td_env_str(TD_ENV_HOME);
    if (home && *home) return td_xasprintf("%s/.tandem/workflows.yaml", home);
    return td_xstrdup(".tandem/workflows.yaml");
}

int cmd_run(int argc, char **argv) {
    const char *name = NULL, *file = NULL, *resume = NULL, *run_name = NULL;
    int detach = 0, nproc = 0, cmd_at = -1, max_restarts = -1;
    const char **params = td_xcalloc((size_t)argc, sizeof *params);
    const char **tags = td_xcalloc((size_t)argc, sizeof *tags);
    const char *group = NULL, *notes = NULL;
    char *tag_set = NULL;
    size_t nparams = 0, ntags = 0;
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
        case OPT_NAME:
            run_name = p.value;
            break;
        case OPT_TAG:
            tags[ntags++] = p.value;
            break;
        case OPT_GROUP:
            group = p.value;
            break;
        case OPT_NOTES:
            notes = p.value;
            break;
        case OPT_NPROC: {
            char *end = NULL;
            long v = strtol(p.value, &end, 10);
            if (!*p.value || *end || v < 1 || v > 4096) {
                cli_error(&verb,
                          "--nproc-per-node: expected a number of workers (1-4096), got '%s'",
                          p.value);
                goto out;
            }
            nproc = (int)v;
            break;
        }
        case OPT_MAX_RESTARTS: {
            char *end = NULL;
            long v = strtol(p.value, &end, 10);
            if (!*p.value || *end || v < 0 || v > 1000) {
                cli_error(&verb, "--max-restarts: expected a number of restarts (0-1000), got '%s'",
                          p.value);
                goto out;
            }
            max_restarts = (int)v;
            break;
        }
        default:                  /* CLI_ARG */
            if (p.options_done) { /* after "--": the command and its arguments */
                cmd_at = p.next - 1;
                p.next = argc;
                break;
            }
            if (name) {
                cli_error(&verb, "one workflow at a time ('%s' and '%s')", name, p.value);
                goto out;
            }
            name = p.value;
        }
    }
    if (cmd_at >= 0 && (name || resume || file)) {
        cli_error(&verb,
                  "-- CMD runs that command; it takes no %s (a workflow is either named or "
                  "given as a command)",
                  resume ? "--resume"
                  : file ? "-f FILE"
                         : "WORKFLOW");
        goto out;
    }
    if (cmd_at < 0 && (run_name || nproc || max_restarts >= 0)) {
        const char *flag = run_name ? "--name" : nproc ? "--nproc-per-node" : "--max-restarts";
        cli_error(&verb,
                  "%s is for a command run: tandem run %s ... -- CMD [ARG]... (a workflow "
                  "says its own name, workers and max_restarts)",
                  flag, flag);
        goto out;
    }
    if (cmd_at < 0 && p.options_done) {
        cli_error(&verb, "'--' but no command after it: tandem run -- CMD [ARG]...");
        goto out;
    }
    /* The labels are checked before anything starts: a typo in a tag must not cost a run. */
    {
        td_status lst = td_tags_edit("", tags, ntags, NULL, 0, &tag_set);
        if (lst == TD_OK && group) lst = td_label_check("group", group);
        if (lst == TD_OK && notes && strlen(notes) > TD_NOTES_MAX)
            lst = td_error(TD_ERR_INVALID, "--notes: at most %d bytes", TD_NOTES_MAX);
        if (lst != TD_OK) {
            cli_error(&verb, "%s", td_error_msg());
            td_error_clear();
            goto out;
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
    if (cmd_at >= 0) {
        w = command_workflow(run_name, nproc ? nproc : 1, argv + cmd_at, argc - cmd_at);
        if (max_restarts > 0) w->max_restarts = max_restarts;
        for (size_t i = 0; st == TD_OK && i < nparams; i++)
            st = td_workflow_set_param(w, params[i]);
    } else if (resume) {
        /* The workflow file, when it still defines the run's workflow, supplies setup, env and
         * artifacts; the command itself always comes from the stored run. */
        td_rundb *store = NULL;
        td_run r = {0};
        st = td_rundb_open(NULL, &store);
        if (st == TD_OK) st = td_run_find(store, resume, &r);
        /* Labels given with --resume are added to the run's own (its tags stay). */
        /* The tags are merged inside one write transaction, as `tandem tag` does: a tag added
         * by a concurrent command between our read and our write would otherwise be lost. */
        if (st == TD_OK && ntags) {
            char *merged = NULL;
            st = td_run_edit_tags(store, r.id, tags, ntags, NULL, 0, &merged);
            free(merged);
        }
        if (st == TD_OK && (group || notes)) st = td_run_set_labels(store, r.id, NULL, group, notes);
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
    /* the workflow's own tags: and group:, under what the command line adds */
    if (st == TD_OK && w && !resume && (w->ntags || w->group)) {
        char *merged = NULL;
        st = td_tags_edit(tag_set ? tag_set : "", (const char *const *)w->tags, w->ntags, NULL, 0,
                          &merged);
        if (st == TD_OK) {
            free(tag_set);
            tag_set = merged;
        }
        if (!group) group = w->group;
    }
    if (st == TD_OK) {
        /* Instances a dead supervisor of this project left running are terminated first (no
         * AWS call unless a run's RUN/instances.json lists one alive and its lock is free). */
        td_rundb *gc_store = NULL;
        if (td_rundb_open(NULL, &gc_store) == TD_OK) td_gc_orphans(gc_store, stderr, NULL);
        td_error_clear();
        td_rundb_close(gc_store);
        td_run_options opts = {.detach = detach,
                               .resume_run = resume,
                               .tags = tag_set,
                               .group = group,
                               .notes = notes};
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
    free(tags);
    free(tag_set);
    return rc;
}
