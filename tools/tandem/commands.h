/* The subcommand table. Add a row here and a cmd_<name>.c defining the function; each function
 * receives argv starting at the subcommand name and returns the process exit code:
 * 0 success, 1 failure of the job, 2 usage error, 143 stopped by SIGTERM after a checkpoint. */
#ifndef TANDEM_COMMANDS_H
#define TANDEM_COMMANDS_H

#define TANDEM_VERSION_STRING "0.1.0"

#define TD_COMMANDS(X)                                                                             \
    X("env", cmd_env, "print the TANDEM_* environment knobs and their values")                     \
    X("launch", cmd_launch, "run workers on this node (torchrun-compatible launcher)")             \
    X("train", cmd_train, "train a model on your data: CSV, NumPy, images, safetensors, IDX")      \
    X("run", cmd_run, "run a workflow as a tracked run (-d: in the background)")                   \
    X("ps", cmd_ps, "list runs")                                                                   \
    X("show", cmd_show, "everything about one run")                                                \
    X("logs", cmd_logs, "a run's worker logs (-f follows)")                                        \
    X("metrics", cmd_metrics, "a run's metrics (--csv, --json)")                                   \
    X("artifacts", cmd_artifacts, "a run's artifacts (--download DIR)")                            \
    X("stop", cmd_stop, "stop a run (workers checkpoint and exit)")                                \
    X("kill", cmd_kill, "signal one worker of a run (--rank R; default SIGKILL)")                  \
    X("tag", cmd_tag, "add or remove a run's tags (tandem tag RUN +T -U)")                         \
    X("note", cmd_note, "set a run's notes")                                                       \
    X("group", cmd_group, "put a run in a group")                                                  \
    X("archive", cmd_archive, "hide finished runs from the listings (--undo)")                     \
    X("rm", cmd_rm, "delete runs: directory and index rows (a live run is refused)")               \
    X("gc", cmd_gc, "terminate cloud instances whose run's supervisor is gone (--dry-run)")        \
    X("import", cmd_import, "bring offline runs of the Python SDK (tandem-offline/ID) in")         \
    X("reindex", cmd_reindex, "rebuild the run index (.tandem/runs.db) from the run directories")  \
    X("ui", cmd_ui, "serve the runs dashboard (http://127.0.0.1:8080)")                            \
    X("bench", cmd_bench, "benchmarks: 'tandem bench comm ...' (collectives)")

int cmd_env(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_ps(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_logs(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
int cmd_artifacts(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_kill(int argc, char **argv);
int cmd_tag(int argc, char **argv);
int cmd_note(int argc, char **argv);
int cmd_group(int argc, char **argv);
int cmd_archive(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_reindex(int argc, char **argv);
int cmd_ui(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
