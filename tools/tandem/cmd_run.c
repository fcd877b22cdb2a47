/* tandem run: run a workflow from the project's workflow file as a tracked run. */
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/exec.h"
#include "tandem/gpu.h"
#include "tandem/launch.h"
#include "tandem/os.h"
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
    OPT_MAX_RESTARTS,
    OPT_EXECUTOR,
    OPT_NNODES,
    OPT_PROFILE,
    OPT_ARTIFACT,
    OPT_HOST,
    OPT_PARTITION,
    OPT_TIME,
    OPT_INSTANCE_TYPE,
    OPT_IMAGE,
    OPT_KEY_NAME,
    OPT_SSH_KEY,
    OPT_REGION,
    OPT_SPOT,
    OPT_SET,
    OPT_DRY_RUN,
    OPT_CONTROLLER_OF,
    OPT_CONTROLLER_STORE
};

static const cli_opt run_opts[] = {
    {OPT_FILE, "file", 'f', "FILE",
     "workflow file (default .tandem/workflows.yaml of the project:\n"
     "$TANDEM_HOME or the current directory)",
     0},
    {OPT_DETACH, "detach", 'd', NULL, "run in the background; print the run id and return", 0},
    {OPT_DRY_RUN, "dry-run", 0, NULL,
     "executor aws: print the plan (instances, market, price,\nwhat is created, the permissions) "
     "and create nothing",
     0},
    {OPT_PARAM, "param", 0, "KEY=VALUE", "override or add a param (repeatable)", CLI_REPEAT},
    {OPT_CONTROLLER_OF, "controller-of", 0, "RUN",
     "(set by tandem run -d of an aws run, on its controller) run\nthe workflow as run RUN", 0},
    {OPT_CONTROLLER_STORE, "controller-store", 0, "S3URL",
     "(with --controller-of) keep the run's store there", 0},
    {OPT_RESUME, "resume", 0, "RUN",
     "continue a preempted, stopped or failed run (same id) with\nTANDEM_RESUME=1", 0},
    {OPT_NAME, "name", 0, "NAME",
     "with -- CMD: the run's workflow name (default: the script's\nor program's name)", 0},
    {OPT_NPROC, "nproc-per-node", 0, "N",
     "with -- CMD: workers per node (default 1): a number, gpu,\ncpu or auto, as tandem launch's",
     0},
    {OPT_EXECUTOR, "executor", 0, "NAME",
     "with -- CMD: where it runs: local (default), ssh, slurm\nor aws (docs/executors.md)", 0},
    {OPT_NNODES, "nnodes", 0, "N", "with -- CMD: nodes (a workflow's nodes:; ssh: one per host)",
     0},
    {OPT_PROFILE, "profile", 0, "FILE",
     "with -- CMD: executor settings as YAML, a workflow's keys:\nexecutor, nodes, aws: {...}, "
     "ssh: {...}, slurm: {...},\nenv, checkpoint_dir, ... (the flags here win)",
     0},
    {OPT_ARTIFACT, "artifact", 0, "PATH",
     "with -- CMD: an output to keep (a workflow's artifacts:;\nrepeatable; globs as there)",
     CLI_REPEAT},
    {OPT_HOST, "host", 0, "HOST", "with --executor ssh: a machine (repeatable; ssh.hosts)",
     CLI_REPEAT},
    {OPT_PARTITION, "partition", 0, "P", "with --executor slurm: slurm.partition", 0},
    {OPT_TIME, "time", 0, "LIMIT", "with --executor slurm: slurm.time (30:00, 2h)", 0},
    {OPT_INSTANCE_TYPE, "instance-type", 0, "TYPE", "with --executor aws: aws.instance_type", 0},
    {OPT_IMAGE, "image", 0, "AMI", "with --executor aws: aws.image", 0},
    {OPT_KEY_NAME, "key-name", 0, "NAME", "with --executor aws: aws.key_name", 0},
    {OPT_SSH_KEY, "ssh-key", 0, "FILE", "with --executor aws: aws.ssh_key", 0},
    {OPT_REGION, "region", 0, "REGION", "with --executor aws: aws.region", 0},
    {OPT_SPOT, "spot", 0, NULL, "with --executor aws: spot instances (aws.spot)", 0},
    {OPT_SET, "set", 0, "KEY=VALUE",
     "with -- CMD: any other setting, as in a profile: aws.subnet=...,\nssh.work_dir=/x, "
     "checkpoint_dir=s3://b/p (VALUE is YAML;\nrepeatable)",
     CLI_REPEAT},
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
             "[--name NAME] [--nproc-per-node N] [--max-restarts N] [--executor E] [--nnodes N]\n"
             "[--profile FILE] [--artifact PATH]... [EXECUTOR FLAGS] [-d] [--param K=V]... -- CMD "
             "[ARG]...\n"
             "--resume RUN [-d] [--tag TAG]...",
    .about = "Runs a workflow as a tracked run. WORKFLOW is a name from the workflow file\n"
             "(optional when it has one). With -- CMD, runs that command instead, tracked as a\n"
             "workflow of one command would be (no workflow file needed; params are appended to\n"
             "it as --KEY VALUE, as to a workflow's command), on this machine or on any executor\n"
             "(--executor, --profile FILE and the executor flags).\n",
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

/* Appends printf-formatted text to *out (NULL to start). */
static void cat(char **out, const char *fmt, ...) TD_PRINTF(2, 3);
static void cat(char **out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *add = NULL;
    if (vasprintf(&add, fmt, ap) < 0) add = NULL;
    va_end(ap);
    char *joined = td_xasprintf("%s%s", *out ? *out : "", add ? add : "");
    free(add);
    free(*out);
    *out = joined;
}

/* A --profile FILE whole. */
static td_status read_profile(const char *path, char **text, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return td_error_errno(TD_ERR_NOTFOUND, "--profile %s: cannot open it", path);
    size_t cap = 4096;
    *text = td_xcalloc(cap, 1);
    *n = 0;
    for (size_t k; (k = fread(*text + *n, 1, cap - *n - 1, f)) > 0;) {
        *n += k;
        if (cap - *n < 2) *text = td_xrealloc(*text, cap *= 2);
    }
    int err = ferror(f);
    fclose(f);
    (*text)[*n] = '\0';
    return err ? td_error(TD_ERR_IO, "--profile %s: read error", path) : TD_OK;
}

/* s as a YAML double-quoted scalar. */
static void cat_quoted(char **out, const char *s) {
    cat(out, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            cat(out, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            cat(out, "\\x%02x", (unsigned char)*s);
        else
            cat(out, "%c", *s);
    }
    cat(out, "\"");
}

/* A command run's settings from its flags, as a profile would hold them: YAML for the workflow
 * parser (td_workflow_apply_settings), so a flag means what the profile's key means. */
typedef struct {
    const char *key, *value; /* "aws.image", "ami-1"; top-level keys have no '.' */
    int raw;                 /* value is YAML already (--set) */
} setting;

static char *settings_yaml(const setting *v, size_t n) {
    static const char *const sections[] = {"slurm", "ssh", "aws"};
    char *out = td_xstrdup("");
    for (size_t i = 0; i < n; i++) {
        if (strchr(v[i].key, '.')) continue;
        cat(&out, "%s: ", v[i].key);
        if (v[i].raw)
            cat(&out, "%s", v[i].value);
        else
            cat_quoted(&out, v[i].value);
        cat(&out, "\n");
    }
    for (size_t s = 0; s < TD_ARRAY_LEN(sections); s++) {
        size_t len = strlen(sections[s]);
        int opened = 0;
        for (size_t i = 0; i < n; i++) {
            if (strncmp(v[i].key, sections[s], len) || v[i].key[len] != '.') continue;
            if (!opened++) cat(&out, "%s:\n", sections[s]);
            cat(&out, "  %s: ", v[i].key + len + 1);
            if (v[i].raw)
                cat(&out, "%s", v[i].value);
            else
                cat_quoted(&out, v[i].value);
            cat(&out, "\n");
        }
    }
    return out;
}

static char *default_file(void) {
    const char *home = td_env_str(TD_ENV_HOME);
    if (home && *home) return td_xasprintf("%s/.tandem/workflows.yaml", home);
    return td_xstrdup(".tandem/workflows.yaml");
}

int cmd_run(int argc, char **argv) {
    const char *name = NULL, *file = NULL, *resume = NULL, *run_name = NULL;
    int detach = 0, cmd_at = -1, max_restarts = -1, dry_run = 0;
    const char *controller_of = NULL, *controller_store = NULL;
    const char *nproc = NULL, *profile = NULL;
    setting *sets = td_xcalloc((size_t)argc, sizeof *sets);
    size_t nsets = 0, nhosts = 0, nartifacts = 0;
    const char **hosts = td_xcalloc((size_t)argc, sizeof *hosts);
    const char **artifacts = td_xcalloc((size_t)argc, sizeof *artifacts);
    char *hosts_yaml = NULL;
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
        case OPT_DRY_RUN:
            dry_run = 1;
            break;
        case OPT_CONTROLLER_OF:
            controller_of = p.value;
            break;
        case OPT_CONTROLLER_STORE:
            controller_store = p.value;
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
            if (!td_launch_nproc_is_spec(p.value) && (!*p.value || *end || v < 1 || v > 4096)) {
                cli_error(&verb,
                          "--nproc-per-node: expected a number of workers (1-4096), or gpu (one "
                          "per visible GPU), cpu (one per core) or auto (gpu where a GPU is "
                          "visible, else cpu), got '%s'",
                          p.value);
                goto out;
            }
            nproc = p.value;
            break;
        }
        case OPT_EXECUTOR:
            sets[nsets++] = (setting){"executor", p.value, 0};
            break;
        case OPT_NNODES:
            sets[nsets++] = (setting){"nodes", p.value, 0};
            break;
        case OPT_PROFILE:
            profile = p.value;
            break;
        case OPT_ARTIFACT:
            artifacts[nartifacts++] = p.value;
            break;
        case OPT_HOST:
            hosts[nhosts++] = p.value;
            break;
        case OPT_PARTITION:
            sets[nsets++] = (setting){"slurm.partition", p.value, 0};
            break;
        case OPT_TIME:
            sets[nsets++] = (setting){"slurm.time", p.value, 0};
            break;
        case OPT_INSTANCE_TYPE:
            sets[nsets++] = (setting){"aws.instance_type", p.value, 0};
            break;
        case OPT_IMAGE:
            sets[nsets++] = (setting){"aws.image", p.value, 0};
            break;
        case OPT_KEY_NAME:
            sets[nsets++] = (setting){"aws.key_name", p.value, 0};
            break;
        case OPT_SSH_KEY:
            sets[nsets++] = (setting){"aws.ssh_key", p.value, 0};
            break;
        case OPT_REGION:
            sets[nsets++] = (setting){"aws.region", p.value, 0};
            break;
        case OPT_SPOT:
            sets[nsets++] = (setting){"aws.spot", "true", 1};
            break;
        case OPT_SET: {
            const char *eq = strchr(p.value, '=');
            const char *dot = strchr(p.value, '.');
            if (!eq || eq == p.value ||
                (dot && dot < eq && strncmp(p.value, "aws.", 4) && strncmp(p.value, "ssh.", 4) &&
                 strncmp(p.value, "slurm.", 6))) {
                cli_error(&verb,
                          "--set '%s': expected KEY=VALUE, KEY a setting of a profile "
                          "(checkpoint_dir, env, ...) or SECTION.FIELD of aws, ssh or slurm",
                          p.value);
                goto out;
            }
            char *key = td_xasprintf("%.*s", (int)(eq - p.value), p.value);
            /* the key's text stays in argv: point into it */
            sets[nsets++] = (setting){p.value, eq + 1, 1};
            sets[nsets - 1].key = key;
            sets[nsets - 1].raw = 2; /* key allocated */
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
    if (cmd_at < 0 && (run_name || nproc || max_restarts >= 0 || nsets || profile || nhosts ||
                       nartifacts)) {
        const char *flag = run_name       ? "--name"
                           : nproc        ? "--nproc-per-node"
                           : profile      ? "--profile"
                           : nartifacts   ? "--artifact"
                           : nhosts       ? "--host"
                           : nsets        ? "--executor"
                                          : "--max-restarts";
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
        w = command_workflow(run_name, 1, argv + cmd_at, argc - cmd_at);
        if (max_restarts > 0) w->max_restarts = max_restarts;
        /* where and how: the profile, then the flags over it, through the workflow's parser */
        if (profile) {
            char *text = NULL;
            size_t n = 0;
            st = read_profile(profile, &text, &n);
            if (st == TD_OK) st = td_workflow_apply_settings(w, text, n, profile);
            free(text);
        }
        if (nhosts) {
            cat(&hosts_yaml, "[");
            for (size_t i = 0; i < nhosts; i++) {
                if (i) cat(&hosts_yaml, ", ");
                cat_quoted(&hosts_yaml, hosts[i]);
            }
            cat(&hosts_yaml, "]");
            sets[nsets++] = (setting){"ssh.hosts", hosts_yaml, 1};
        }
        if (nproc) sets[nsets++] = (setting){"nproc_per_node", nproc, 0};
        char *yaml = settings_yaml(sets, nsets);
        if (st == TD_OK && nsets)
            st = td_workflow_apply_settings(w, yaml, strlen(yaml), "tandem run's flags");
        free(yaml);
        for (size_t i = 0; st == TD_OK && i < nartifacts; i++) {
            w->artifacts = td_xrealloc(w->artifacts, (w->nartifacts + 1) * sizeof *w->artifacts);
            w->artifacts[w->nartifacts++] = td_xstrdup(artifacts[i]);
        }
        if (st == TD_OK) st = td_workflow_check(w, "tandem run");
        for (size_t i = 0; st == TD_OK && i < nparams; i++)
            st = td_workflow_set_param(w, params[i]);
    } else if (resume && !controller_of) {
        /* (a resumed run's controller has no such run yet: it loads the workflow it was sent by
         * name, below, and makes the run from its store: td_exec_controller_adopt) */
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
    /* nproc_per_node: gpu|auto|cpu, counted where the workers run (tandem launch's rule,
     * td_launch_nproc_resolve), before the run starts, and recorded: here for this machine's
     * executor; on every host for executor ssh; on the partition's nodes (sinfo) for Slurm; from
     * the instance type (EC2's catalog) for aws, whose instances do not exist yet. */
    char nproc_note[768] = "";
    if (st == TD_OK && w && w->nproc_spec[0]) {
        char *note = nproc_note;
        if (w->executor && !strcmp(w->executor, "ssh")) {
            const char *cuda = NULL;
            for (size_t i = 0; i < w->nenv; i++)
                if (!strcmp(w->env[i].key, "CUDA_VISIBLE_DEVICES")) cuda = w->env[i].value;
            /* the project (a hostfile is relative to it) and this tandem, as tandem run's
             * supervisor takes them (src/workflow/run.c) */
            char *exe = td_self_exe();
            td_rundb *pstore = NULL;
            st = td_rundb_open(NULL, &pstore);
            char *project = NULL;
            if (st == TD_OK)
                project = w->workdir && w->workdir[0] == '/'
                              ? td_xstrdup(w->workdir)
                              : w->workdir ? td_xasprintf("%s/%s", td_rundb_project_dir(pstore),
                                                          w->workdir)
                                           : td_xstrdup(td_rundb_project_dir(pstore));
            td_rundb_close(pstore);
            if (st == TD_OK)
                st = td_ssh_count_nproc(&w->ssh, project, exe, w->nproc_spec, cuda,
                                        &w->nproc_per_node, note, sizeof nproc_note);
            free(project);
            free(exe);
        } else if (w->executor && !strcmp(w->executor, "slurm"))
            st = td_slurm_count_nproc(&w->slurm, w->nproc_spec, &w->nproc_per_node, note,
                                      sizeof nproc_note);
        else if (w->executor && !strcmp(w->executor, "aws"))
            st = td_aws_count_nproc(&w->aws, w->nproc_spec, &w->nproc_per_node, note,
                                    sizeof nproc_note);
        else if (w->executor)
            st = td_error(TD_ERR_USAGE,
                          "nproc_per_node: %s: the %s executor cannot count the machines its "
                          "workers run on beforehand: give a number of workers per node",
                          w->nproc_spec, w->executor);
        else
            st = td_launch_nproc_resolve("nproc_per_node", w->nproc_spec, td_gpu_device_count,
                                         &w->nproc_per_node, note, sizeof nproc_note);
        if (st == TD_OK && note[0]) fprintf(stderr, "tandem run: %s\n", note);
    }
    if (st == TD_OK && dry_run) { /* the plan, and nothing made (src/exec/aws_plan.c) */
        if (!w || !w->executor || strcmp(w->executor, "aws"))
            st = td_error(TD_ERR_USAGE, "--dry-run plans the instances of an executor: aws run; "
                                        "this one runs on the %s executor",
                          w && w->executor ? w->executor : "local");
        else {
            td_aws_plan_in plan = {.aws = &w->aws,
                                   .workflow = w->name,
                                   .nodes = w->nodes > 0 ? w->nodes : 1,
                                   .nproc_per_node = w->nproc_per_node > 0 ? w->nproc_per_node : 1,
                                   .max_duration_s = w->max_duration_s,
                                   .s3 = (w->checkpoint_dir &&
                                          !strncmp(w->checkpoint_dir, "s3://", 5)) ||
                                         w->artifacts_to,
                                   .nproc_note = nproc_note};
            st = td_aws_plan(&plan, stdout);
        }
        exit_code = 0;
        if (st == TD_OK) {
            rc = 0;
            goto done;
        }
    } else if (st == TD_OK) {
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
                               .notes = notes,
                               .controller_of = controller_of,
                               .controller_store = controller_store};
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
    for (size_t i = 0; i < nsets; i++)
        if (sets[i].raw == 2) free((char *)sets[i].key);
    free(sets);
    free(hosts);
    free(artifacts);
    free(hosts_yaml);
    free(params);
    free(tags);
    free(tag_set);
    return rc;
}
