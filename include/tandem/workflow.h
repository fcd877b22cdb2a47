/* tandem workflow: workflow files and the executor behind `tandem run`.
 *
 * A workflow file (.tandem/workflows.yaml of the project, or -f FILE) lists named workflows:
 *
 *   workflows:
 *     - name: demo
 *       command: tandem train --model basicnet --data /usr/share/datasets/fashion-mnist
 *       nproc_per_node: 2
 *       params: {lr: 0.001}
 *       artifacts: [model.safetensors]
 *
 * The executor creates a run in the store, runs the setup commands, then runs
 * `tandem launch ... -- sh -c SCRIPT` as a child while ingesting metrics and sampling system
 * metrics, and records how it ended. A workflow with `executor: slurm` is handed, after the
 * setup commands, to that executor of the exec layer (tandem/exec.h), which submits it as a
 * batch job instead. Errors in a file name file:line:column and the field.
 * The full format is in docs/runs.md.
 */
#ifndef TANDEM_WORKFLOW_H
#define TANDEM_WORKFLOW_H

#include <stddef.h>

#include "tandem/core.h"
#include "tandem/exec.h"
#include "tandem/track.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_kv {
    char *key;
    char *value;
} td_kv;

typedef struct td_workflow {
    char *name;
    char **commands; /* run in sequence in one shell; the last one gets the params appended */
    size_t ncommands;
    char **setup; /* each run once, locally, before the launch */
    size_t nsetup;
    char **node_setup; /* each run once on every node, by its launcher, before its workers
                        * (packages, a build on a fresh machine): tandem launch --node-setup */
    size_t nnode_setup;
    int nodes, nproc_per_node; /* default 1 */
    /* nproc_per_node: gpu, auto or cpu as written (torchrun's words; "" for a number): counted
     * on the machine the workers run on with td_launch_nproc_resolve before the run starts
     * (tandem run does), nproc_per_node 0 until then */
    char nproc_spec[8];
    td_kv *env;
    size_t nenv;
    /* `secrets: [NAME, ...]`: variables whose values tandem run takes from its own environment
     * and passes to the workers without writing them anywhere (exec.h, td_exec_secrets) */
    char **secrets;
    size_t nsecrets;
    char **tags; /* `tags: [...]`: labels every run of it starts with (td_label_check) */
    size_t ntags;
    char *group;   /* `group: G`: the runs' group */
    td_kv *params; /* in file order; values as written */
    size_t nparams;
    char **artifacts; /* paths or globs relative to the working directory */
    size_t nartifacts;
    char *artifacts_to;    /* artifacts: {to: s3://B/P}: also uploaded to s3://B/P/RUN_ID/NAME */
    char *checkpoint_dir;  /* NULL = <run_dir>/checkpoints; s3://B/P: <run_dir>/checkpoints,
                            * mirrored by node 0's agent to s3://B/P/RUN_ID (docs/cloud.md) */
    char *workdir;         /* NULL = the project directory */
    int max_restarts;      /* default 0 */
    double max_duration_s; /* 0 = no limit */
    int line;              /* where the entry starts in the file (1-based) */
    char *file;            /* the file it came from, for messages; NULL: not from a file */
    char *executor;        /* NULL: the local one (`executor: local`); else a name that
                            * td_executor_find knows ("slurm", "ssh") */
    /* `slurm:` (executor slurm) */
    td_slurm_options slurm;
    /* `ssh:` (executor ssh); nodes is the number of hosts */
    td_ssh_options ssh;
    /* `aws:` (executor aws); nodes is the number of instances */
    td_aws_options aws;
} td_workflow;

typedef struct td_workflow_file {
    char *path;
    td_workflow *items;
    size_t count;
} td_workflow_file;

/* Parses a workflow file. Errors read "FILE:LINE:COL: FIELD: problem, got 'VALUE'". */
td_status td_workflow_file_load(const char *path, td_workflow_file **out);
/* Same, from memory; name is used in messages. */
td_status td_workflow_file_parse(const char *text, size_t nbytes, const char *name,
                                 td_workflow_file **out);
void td_workflow_file_free(td_workflow_file *wf);
/* TD_ERR_NOTFOUND listing the known names when there is no such workflow. */
td_status td_workflow_find(const td_workflow_file *wf, const char *name, const td_workflow **out);

/* Executor settings from YAML (tandem run --profile FILE, and the flags of a command run): a
 * mapping with the workflow's own keys for where and how it runs (executor, nodes,
 * nproc_per_node, slurm, ssh, aws, env, secrets, node_setup, checkpoint_dir, artifacts,
 * max_restarts, max_duration), parsed by the workflow file's parser into w over what w holds:
 * a scalar or a list replaces w's, an executor section's fields replace those fields only.
 * name is used in messages ("FILE:LINE:COL: FIELD: ..."). Call td_workflow_check after the
 * last one. */
td_status td_workflow_apply_settings(td_workflow *w, const char *text, size_t nbytes,
                                     const char *name);
/* What the fields must say together (an executor's section only with it, what each executor
 * needs, ssh hosts matching nodes, env and secrets apart), as for a workflow in a file; name
 * is used in messages. */
td_status td_workflow_check(td_workflow *w, const char *name);
/* "key=value": replaces the param's value or adds the param. */
td_status td_workflow_set_param(td_workflow *w, const char *assignment);
/* Deep copy (for applying overrides without touching the file's entry). */
td_workflow *td_workflow_copy(const td_workflow *w);
void td_workflow_free(td_workflow *w);
/* Parses "90s", "30m", "2h", "1d", "1h30m" or plain seconds. */
td_status td_parse_duration(const char *what, const char *text, double *seconds_out);

/* The shell script the workers run: ${{ params.KEY }} substituted, commands joined so the first
 * failure stops the script, and every param not substituted appended to the last command as
 * `--KEY VALUE` (shell-quoted). Caller frees. */
td_status td_workflow_script(const td_workflow *w, char **out);
/* Params as a JSON object (numbers stay numbers, other values strings). Caller frees. */
char *td_workflow_params_json(const td_workflow *w);

/* The job's secrets for w (exec.h): each name of its secrets: with its value from our own
 * environment, and, for a workflow that reaches AWS (executor: aws, or a checkpoint_dir in
 * s3://), the AWS_* variables set here (td_exec_secrets_add_aws), which the agents' S3 client
 * and the workers need. TD_ERR_INVALID naming the secret and the workflow file, before anything
 * has started, when one is not set. Free with td_exec_secrets_free. td_workflow_run calls it. */
td_status td_workflow_secrets(const td_workflow *w, td_exec_secrets *out);

/* ---- the executor ---- */
typedef struct td_run_options {
    const char *project_dir; /* NULL = TANDEM_HOME or the current directory */
    int detach;              /* -d: the supervisor runs in the background, output to log files */
    const char *resume_run;  /* --resume RUN: re-run that run's command with TANDEM_RESUME=1 */
    const char *tandem_bin;  /* the binary to run `launch` with; NULL = /proc/self/exe */
    FILE *out;               /* progress lines (attached); NULL = stdout */
    /* a new run's labels (tandem run --tag/--group/--notes; td_run_spec's); NULL: none */
    const char *tags, *group, *notes;
    /* The controller of a detached aws run (docs/runs.md, "A run that lives in the cloud"):
     * tandem run -d on the controller instance, started by the submitter's handoff. The run gets
     * exactly this id (the submitter's), and its detached supervisor pushes the run directory
     * to controller_store and polls it for a stop (td_exec_controller_start). NULL: not one. */
    const char *controller_of, *controller_store;
} td_run_options;

/* Runs a workflow (w may be NULL with resume_run set: the command is taken from the stored run
 * and the workflow file, when it still has the workflow, supplies setup and artifacts).
 * Attached: returns when the run has ended, *exit_code the process exit code for the CLI
 * (0 succeeded, 1 failed, 143 preempted/stopped after a checkpoint, 130 stopped otherwise).
 * Detached: returns as soon as the background supervisor owns the run, *exit_code = 0.
 * run_id_out (may be NULL) receives the run id; caller frees. */
td_status td_workflow_run(const td_workflow *w, const td_run_options *opts, char **run_id_out,
                          int *exit_code);

/* Asks a run's supervisor to stop it (SIGTERM; it forwards to the workers and records
 * "stopped"), then waits up to wait_s seconds for a final status. A run without a live
 * supervisor is marked stopped directly. */
td_status td_run_stop(td_rundb *store, const char *run_id, double wait_s, td_run *final_out);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_WORKFLOW_H */
