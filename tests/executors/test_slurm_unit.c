/* executors: the Slurm executor's parts that need no cluster. The workflow fields (executor:,
 * slurm:) and their errors; Slurm time limits; `scontrol show job -o` lines; the mapping of
 * Slurm's states to run statuses, notes and exit codes; the batch script (directives, the
 * environment as a difference from ours, the token file, the launch line, the time-limit
 * relay), checked by running it with sh -n. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

#include "exec/internal.h"
#include "tandem/workflow.h"

static void expect_error(const char *text, const char *n1, const char *n2) {
    td_workflow_file *wf = NULL;
    td_status st = td_workflow_file_parse(text, strlen(text), "wf.yaml", &wf);
    if (st == TD_OK) TEST_FAIL("parsed, but expected an error containing '%s'", n1);
    ASSERT_CONTAINS(td_error_msg(), n1);
    if (n2) ASSERT_CONTAINS(td_error_msg(), n2);
    td_error_clear();
}

static void test_parse(void) {
    const char *text = "workflows:\n"
                       "  - name: a\n"
                       "    command: tandem train\n"
                       "    nodes: 2\n"
                       "    executor: slurm\n"
                       "    slurm:\n"
                       "      partition: gpu\n"
                       "      account: proj1\n"
                       "      time: '1-02:03:04'\n"
                       "      signal_lead: 2m\n"
                       "      sbatch_args: [--exclusive, --gres=gpu:4]\n"
                       "  - name: b\n"
                       "    command: tandem train\n"
                       "    executor: local\n"
                       "  - name: c\n"
                       "    command: tandem train\n"
                       "    executor: slurm\n"
                       "    slurm: {time: 90m, work_dir: /scratch/td, link_host: login1}\n";
    td_workflow_file *wf;
    ASSERT_OK(td_workflow_file_parse(text, strlen(text), "wf.yaml", &wf));
    const td_workflow *a, *b, *c;
    ASSERT_OK(td_workflow_find(wf, "a", &a));
    ASSERT_OK(td_workflow_find(wf, "b", &b));
    ASSERT_OK(td_workflow_find(wf, "c", &c));
    ASSERT_STREQ(a->executor, "slurm");
    ASSERT_STREQ(a->slurm.partition, "gpu");
    ASSERT_STREQ(a->slurm.account, "proj1");
    ASSERT_NEAR(a->slurm.time_limit_s, 86400 + 2 * 3600 + 3 * 60 + 4, 0);
    ASSERT_NEAR(a->slurm.signal_lead_s, 120, 0);
    ASSERT_EQ(a->slurm.nsbatch_args, 2);
    ASSERT_STREQ(a->slurm.sbatch_args[1], "--gres=gpu:4");
    ASSERT(b->executor == NULL);
    ASSERT_NEAR(c->slurm.time_limit_s, 5400, 0);
    ASSERT_NEAR(c->slurm.signal_lead_s, 0, 0); /* the default, 60 s, applies */
    ASSERT_STREQ(c->slurm.work_dir, "/scratch/td");
    ASSERT_STREQ(c->slurm.link_host, "login1");
    ASSERT(a->slurm.work_dir == NULL && a->slurm.link_host == NULL);

    /* a copy owns its slurm settings */
    td_workflow *copy = td_workflow_copy(c);
    ASSERT(copy->slurm.work_dir != c->slurm.work_dir);
    ASSERT_STREQ(copy->slurm.link_host, "login1");
    td_workflow_free(copy);
    copy = td_workflow_copy(a);
    ASSERT(copy->slurm.sbatch_args != a->slurm.sbatch_args);
    ASSERT_STREQ(copy->slurm.sbatch_args[0], "--exclusive");
    ASSERT_STREQ(copy->executor, "slurm");
    td_workflow_free(copy);
    td_workflow_file_free(wf);

    const char *head = "workflows:\n  - name: a\n    command: x\n";
    char buf[512];
#define BAD(extra, n1, n2)                                                                         \
    do {                                                                                           \
        snprintf(buf, sizeof buf, "%s%s", head, extra);                                            \
        expect_error(buf, n1, n2);                                                                 \
    } while (0)
    BAD("    executor: rsh\n", "wf.yaml:4:15: executor: expected local or slurm, ssh or aws",
        "'rsh'");
    BAD("    executor: slurm\n    slurm: {queue: x}\n", "unknown field 'queue'",
        "partition, time, account, sbatch_args, signal_lead, work_dir, link_host");
    BAD("    executor: slurm\n    slurm: {work_dir: scratch}\n",
        "slurm.work_dir: expected an absolute path on the nodes", "'scratch'");
    BAD("    executor: slurm\n    slurm: {work_dir: '/a b'}\n", "slurm.work_dir: expected",
        "'/a b'");
    BAD("    executor: slurm\n    slurm: {work_dir: /s, link_host: 'a;b'}\n",
        "slurm.link_host: expected a host name or address", "'a;b'");
    BAD("    executor: slurm\n    slurm: {work_dir: /s, link_host: 'h:1'}\n",
        "slurm.link_host: expected a host name", "'h:1'");
    BAD("    executor: slurm\n    slurm: {link_host: h}\n", "slurm.link_host: is only used",
        "set slurm.work_dir");
    BAD("    slurm: {partition: x}\n", "slurm: workflow 'a' sets slurm: but runs on the local",
        "add 'executor: slurm'");
    BAD("    executor: slurm\n    slurm: {time: 90}\n", "slurm.time: '90' is ambiguous",
        "write 90m, or Slurm's 90:00");
    BAD("    executor: slurm\n    slurm: {time: 1-2-3}\n", "slurm.time: expected a time limit",
        "'1-2-3'");
    BAD("    executor: slurm\n    slurm: {time: 30s}\n", "slurm.time: 30 s leaves no room",
        "signal_lead");
    BAD("    executor: slurm\n    slurm: {time: '10:00', signal_lead: 10m}\n",
        "slurm.signal_lead: 600 s is not shorter than the time limit (600 s)", NULL);
    BAD("    executor: slurm\n    slurm: {signal_lead: 20h}\n",
        "slurm.signal_lead: expected a duration up to 65535 s", "'20h'");
    BAD("    executor: slurm\n    slurm: [a]\n", "slurm: expected a mapping", NULL);
    BAD("    colour: x\n", "unknown field", "executor, slurm");
#undef BAD
}

static void test_time(void) {
    double s;
    ASSERT_OK(td_slurm_parse_time("t", "30:00", &s));
    ASSERT_NEAR(s, 1800, 0);
    ASSERT_OK(td_slurm_parse_time("t", "2:00:00", &s));
    ASSERT_NEAR(s, 7200, 0);
    ASSERT_OK(td_slurm_parse_time("t", "1-12", &s));
    ASSERT_NEAR(s, 129600, 0);
    ASSERT_OK(td_slurm_parse_time("t", "1-0:30", &s));
    ASSERT_NEAR(s, 86400 + 1800, 0);
    const char *bad[] = {"", "1:2:3:4", "a:b", "-5", "1-", "0:00", "1:-2"};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        ASSERT_STATUS(td_slurm_parse_time("slurm.time", bad[i], &s), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), "slurm.time: expected a Slurm time limit");
        td_error_clear();
    }
}

static void test_scontrol(void) {
    td__slurm_job j;
    const char *line =
        "JobId=12 JobName=bn-1 UserId=root(0) JobState=PENDING Reason=PartitionConfig "
        "Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:0 NodeList=(null) "
        "BatchHost=n1 ReqNodeList=(null)\n";
    ASSERT_OK(td__slurm_parse_job(line, &j));
    ASSERT_STREQ(j.state, "PENDING");
    ASSERT_STREQ(j.reason, "PartitionConfig");
    ASSERT_EQ(j.restarts, 2);
    ASSERT_STREQ(j.nodes, ""); /* ReqNodeList must not be taken for NodeList */
    ASSERT_EQ(td__slurm_phase_of(j.state), TD__SLURM_WAITING);
    char note[768];
    td__slurm_live_note("12", &j, note, sizeof note);
    ASSERT_CONTAINS(note, "slurm job 12 (requeued, restart 2) pending: PartitionConfig (it asks "
                          "for more than the partition has");

    ASSERT_OK(td__slurm_parse_job("JobId=3 JobState=FAILED Reason=NonZeroExitCode Restarts=0 "
                                  "ExitCode=1:0 NodeList=tds1n[1-2]",
                                  &j));
    ASSERT_EQ(j.exit_code, 1);
    ASSERT_EQ(j.exit_signal, 0);
    ASSERT_STREQ(j.nodes, "tds1n[1-2]");
    ASSERT_EQ(td__slurm_phase_of("COMPLETING"), TD__SLURM_ACTIVE);
    ASSERT_EQ(td__slurm_phase_of("REQUEUED"), TD__SLURM_WAITING);
    ASSERT_EQ(td__slurm_phase_of("OUT_OF_MEMORY"), TD__SLURM_ENDED);
    ASSERT_OK(td__slurm_parse_job("JobState=RUNNING Reason=None NodeList=n[1-2] Restarts=0", &j));
    td__slurm_live_note("7", &j, note, sizeof note);
    ASSERT_STREQ(note, "slurm job 7 running on n[1-2]");
    ASSERT_STATUS(td__slurm_parse_job("slurm_load_jobs error", &j), TD_ERR_FORMAT);
    td_error_clear();
}

/* The outcome of a final state line, with the cause and the failing worker's exit code that
 * the launchers' end records gave (-1: none). */
static td__exec_outcome outcome_of(const char *line, const char *stopped_by, int preempted,
                                   const char *cause, int worker_code) {
    td__slurm_job j;
    if (td__slurm_parse_job(line, &j) != TD_OK) TEST_FAIL("cannot parse '%s'", line);
    td__exec_outcome o;
    td__slurm_outcome("bn-1", "12", &j, stopped_by, preempted, cause, worker_code, &o);
    return o;
}

static td__exec_outcome outcome(const char *line, const char *stopped_by, int preempted,
                                const char *cause) {
    return outcome_of(line, stopped_by, preempted, cause, -1);
}

static void test_outcome(void) {
    const char *nodes = " NodeList=n[1-2] Restarts=0";
    char line[256];
#define LINE(state, code)                                                                          \
    (snprintf(line, sizeof line, "JobState=%s ExitCode=%s%s", state, code, nodes), line)
    td__exec_outcome o = outcome(LINE("COMPLETED", "0:0"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_SUCCEEDED);
    ASSERT_EQ(o.cli_code, 0);
    ASSERT_CONTAINS(o.note, "slurm job 12 completed on n[1-2]");

    /* a worker's failure: the launcher's root cause and the worker's own code */
    o = outcome_of(LINE("FAILED", "1:0"), NULL, 0,
                   "worker rank 1 (local rank 0 on node 1, pid 9) exited with code 3", 3);
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_EQ(o.exit_code, 3);
    ASSERT_EQ(o.cli_code, 1);
    ASSERT_CONTAINS(o.note, "worker rank 1");
    /* ... whose node ended the step (--kill-on-bad-exit): the other launchers, SIGTERMed by
     * srun, exit 143, the highest code, which srun passes on; still the worker's failure */
    o = outcome_of(LINE("FAILED", "143:0"), NULL, 0,
                   "worker rank 1 (local rank 0 on node 1, pid 9) exited with code 2", 2);
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_EQ(o.exit_code, 2);
    ASSERT_EQ(o.cli_code, 1);
    ASSERT_CONTAINS(o.note, "worker rank 1");
    /* ... and a launcher's own failure (no worker's): its cause, not a checkpointed stop */
    o = outcome(LINE("FAILED", "143:0"), NULL, 0, "no node connected back to tandem run");
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_EQ(o.cli_code, 1);
    ASSERT_CONTAINS(o.note, "no node connected back");
    o = outcome(LINE("FAILED", "2:0"), NULL, 0, "");
    ASSERT_CONTAINS(o.note, "slurm job 12 failed with exit code 2");
    ASSERT_CONTAINS(o.note, "logs/slurm-12.err");

    /* tandem stop: checkpointed (143) or cancelled; before it started: no exit code */
    o = outcome(LINE("FAILED", "143:0"), "tandem stop", 0, "");
    ASSERT_EQ(o.status, TD_RUN_STOPPED);
    ASSERT_EQ(o.cli_code, 143);
    ASSERT_CONTAINS(o.note, "stopped by tandem stop: slurm job 12 ended after the workers "
                            "checkpointed");
    o = outcome(LINE("CANCELLED", "0:15"), "tandem stop", 0, "");
    ASSERT_EQ(o.status, TD_RUN_STOPPED);
    ASSERT_EQ(o.cli_code, 1);
    ASSERT_EQ(o.exit_code, 143);
    {
        td__slurm_job j;
        ASSERT_OK(td__slurm_parse_job("JobState=CANCELLED Reason=PartitionConfig ExitCode=0:0 "
                                      "NodeList=(null)",
                                      &j));
        td__slurm_outcome("bn-1", "12", &j, "tandem stop", 0, "", -1, &o);
        ASSERT_EQ(o.status, TD_RUN_STOPPED);
        ASSERT_EQ(o.exit_code, -2);
        ASSERT_CONTAINS(o.note, "stopped by tandem stop: slurm job 12 cancelled before it started");
    }

    /* time limit, preemption, a SIGTERM from outside: preempted, resumable */
    o = outcome(LINE("TIMEOUT", "0:15"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_PREEMPTED);
    ASSERT_EQ(o.cli_code, 143);
    ASSERT_CONTAINS(o.note, "reached its time limit");
    ASSERT_CONTAINS(o.note, "tandem run --resume bn-1");
    o = outcome(LINE("PREEMPTED", "0:15"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_PREEMPTED);
    o = outcome(LINE("FAILED", "143:0"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_PREEMPTED);
    ASSERT_CONTAINS(o.note, "scancel --signal=TERM");
    o = outcome(LINE("FAILED", "143:0"), NULL, 1, "");
    ASSERT_EQ(o.status, TD_RUN_PREEMPTED);
    ASSERT_CONTAINS(o.note, "tandem run got SIGTERM");
    o = outcome(LINE("CANCELLED", "0:15"), NULL, 1, "");
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(o.note, "did not all checkpoint");

    /* Slurm's own failures */
    o = outcome(LINE("NODE_FAIL", "0:0"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(o.note, "lost a node (NODE_FAIL on n[1-2])");
    o = outcome(LINE("OUT_OF_MEMORY", "0:125"), NULL, 0, "");
    ASSERT_CONTAINS(o.note, "--mem=");
    o = outcome(LINE("CANCELLED", "0:15"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_STOPPED);
    ASSERT_CONTAINS(o.note, "cancelled outside tandem");
    o = outcome(LINE("BOOT_FAIL", "0:0"), NULL, 0, "");
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(o.note, "slurm job 12 ended BOOT_FAIL");
    /* the job vanished from slurmctld */
    td__slurm_job none = {0};
    td__slurm_outcome("bn-1", "12", &none, NULL, 0, "", -1, &o);
    ASSERT_EQ(o.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(o.note, "no longer known to slurmctld");
#undef LINE
}

static void test_script(void) {
    setenv("TD_TEST_KEEP", "same", 1);
    setenv("TD_TEST_GONE", "x", 1);
    setenv("PATH", "/usr/bin:/bin", 1);
    char *env[] = {"TD_TEST_KEEP=same",  "PATH=/opt/tandem/bin:/usr/bin:/bin",
                   "TANDEM_RUN_ID=bn-1", "WF_VAR=it's here",
                   "bad.name=1",         NULL};
    td_run run = {.id = "bn-1", .run_dir = "/p/.tandem/runs/bn-1", .nodes = 2, .nproc_per_node = 3};
    td_slurm_options so = {.partition = "gpu", .time_limit_s = 3600 + 59, .signal_lead_s = 90};
    const char *const node_setup[] = {"pip install -r req.txt", "make it's"};
    td_exec_job job = {.run = &run,
                       .node_setup = node_setup,
                       .nnode_setup = 2,
                       .work_dir = "/p/.tandem/runs/bn-1/work",
                       .script = "set -e\nmkdir -p out\ntandem train --save 'out/w x'",
                       .tandem_bin = "/opt/tandem/bin/tandem",
                       .env = env,
                       .max_restarts = 1,
                       .slurm = &so};
    char *s = td__slurm_batch_script(&job, "/p/.tandem/runs/bn-1/token", NULL);
    ASSERT_CONTAINS(s, "#SBATCH --job-name=bn-1\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                       "#SBATCH --cpus-per-task=3\n#SBATCH --requeue\n"
                       "#SBATCH --signal=B:USR1@90\n");
    ASSERT_CONTAINS(s, "#SBATCH --output=/p/.tandem/runs/bn-1/logs/slurm-%j.out\n");
    ASSERT_CONTAINS(s, "#SBATCH --chdir=/p/.tandem/runs/bn-1/work\n");
    ASSERT_CONTAINS(s, "#SBATCH --partition=gpu\n");
    ASSERT_CONTAINS(s, "#SBATCH --time=0-01:00:59\n");
    ASSERT(!strstr(s, "--account"));
    /* the environment: only what differs from ours */
    ASSERT(!strstr(s, "TD_TEST_KEEP"));
    ASSERT_CONTAINS(s, "\nunset TD_TEST_GONE\n");
    ASSERT_CONTAINS(s, "\nexport PATH='/opt/tandem/bin':\"$PATH\"\n");
    ASSERT_CONTAINS(s, "\nexport TANDEM_RUN_ID='bn-1'\n");
    ASSERT_CONTAINS(s, "\nexport WF_VAR='it'\\''s here'\n");
    ASSERT(!strstr(s, "bad.name"));
    ASSERT_CONTAINS(s, "TANDEM_TOKEN=$(cat '/p/.tandem/runs/bn-1/token') || exit 1\n"
                       "export TANDEM_TOKEN\n");
    ASSERT_CONTAINS(s, "export TANDEM_LAUNCH_DETECT=1\n");
    ASSERT_CONTAINS(s, "if [ \"${SLURM_RESTART_COUNT:-0}\" -gt 0 ]; then\n"
                       "    export TANDEM_RESUME=1\n");
    ASSERT_CONTAINS(s, "while [ \"$r\" -lt 6 ]");
    ASSERT_CONTAINS(s, "trap 'limit=1; scancel --signal=TERM \"$SLURM_JOB_ID\"' USR1\n");
    /* a launcher that ends badly ends the step; one lost to a signal starts a new step while
     * max_restarts allow, and its launchers count it (--restarts-before) */
    ASSERT_CONTAINS(s, "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 ");
    ASSERT_CONTAINS(s, "tandem_step_restarts=0\nexport tandem_step_restarts\nwhile :; do\n");
    ASSERT_CONTAINS(s, "if [ \"$limit\" = 0 ] && [ \"$code\" -gt 128 ] && [ \"$code\" != 130 ] && "
                       "[ \"$code\" != 143 ] &&\n    [ \"$tandem_step_restarts\" -lt 1 ]; then\n"
                       "    tandem_step_restarts=$((tandem_step_restarts + 1))\n");
    /* every node's launcher runs the workflow's node_setup before its workers, in order */
    ASSERT_CONTAINS(s, "'/opt/tandem/bin/tandem' launch --nproc-per-node=3 --rdzv-id='bn-1' "
                       "--max-restarts=1 --restarts-before=\"${tandem_step_restarts:-0}\" "
                       "--stop-grace=30 \\\n    "
                       "--log-dir='/p/.tandem/runs/bn-1/logs' "
                       "--metrics-dir='/p/.tandem/runs/bn-1/metrics' "
                       "--end-record='/p/.tandem/runs/bn-1/end/node-%n.json' \\\n"
                       "    --node-setup='pip install -r req.txt' \\\n"
                       "    --node-setup='make it'\\''s' "
                       "-- /bin/sh -c 'trap : TERM\n"
                       "set -e\nmkdir -p out\ntandem train --save '\\''out/w x'\\''' &\n");
    ASSERT_CONTAINS(s, "scontrol requeue \"$SLURM_JOB_ID\"");
    /* the shell reads it */
    char path[] = "/tmp/tandem-sbatch-XXXXXX";
    char path0[sizeof path];
    memcpy(path0, path, sizeof path);
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, s, strlen(s)), (ssize_t)strlen(s));
    close(fd);
    char *cmd = td_xasprintf("sh -n %s", path);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    unlink(path);
    free(s);

    /* a short signal lead shortens the launchers' stop grace, so the requeue comes first */
    so.signal_lead_s = 20;
    s = td__slurm_batch_script(&job, "/t", NULL);
    ASSERT_CONTAINS(s, "--stop-grace=10 ");
    free(s);

    /* slurm: work_dir: the nodes keep their own copy of the run; nothing of ours is read */
    so.signal_lead_s = 90;
    so.work_dir = "/scratch/td";
    char *env2[] = {"TANDEM_RUN_DIR=/p/.tandem/runs/bn-1",
                    "TANDEM_CHECKPOINT_DIR=/p/.tandem/runs/bn-1/work/ckpt", "TANDEM_PROJECT_DIR=/p",
                    "TANDEM_RUN_DIRX=/p/.tandem/runs/bn-1x", NULL};
    job.env = env2;
    s = td__slurm_batch_script(&job, NULL, "login1:4242");
    ASSERT_CONTAINS(s, "#SBATCH --output=/scratch/td/bn-1-slurm-%j.out\n");
    ASSERT_CONTAINS(s, "#SBATCH --chdir=/scratch/td\n");
    ASSERT_CONTAINS(s, "\nexport TANDEM_RUN_DIR='/scratch/td/bn-1'\n");
    ASSERT_CONTAINS(s, "\nexport TANDEM_CHECKPOINT_DIR='/scratch/td/bn-1/work/ckpt'\n");
    ASSERT_CONTAINS(s, "\nexport TANDEM_PROJECT_DIR='/scratch/td/bn-1/work'\n");
    ASSERT_CONTAINS(s, "\nexport TANDEM_RUN_DIRX='/p/.tandem/runs/bn-1x'\n"); /* a prefix only */
    /* no path the nodes cannot see (the comment at the top names the script itself) */
    ASSERT(!strstr(s, "runs/bn-1/work") && !strstr(s, "runs/bn-1/logs") &&
           !strstr(s, "runs/bn-1/metrics") && !strstr(s, "runs/bn-1/token"));
    ASSERT(!strstr(s, "TANDEM_TOKEN=$(cat")); /* the token is in sbatch's environment */
    ASSERT_CONTAINS(s, "[ -n \"${TANDEM_TOKEN:-}\" ] ||");
    ASSERT_CONTAINS(s, "launch --link=login1:4242 --nproc-per-node=3");
    /* a spool per incarnation: per requeue and per step (a new step after a lost launcher) */
    ASSERT_CONTAINS(s,
                    "s=\"$d/spool/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}.${SLURM_STEP_ID:-0}\"");
    ASSERT_CONTAINS(s, "--log-dir=\"$s/logs\" --metrics-dir=\"$s/metrics\"");
    /* each node writes the requeue line into its own ranks' logs only */
    ASSERT_CONTAINS(s, "r=$((SLURM_NODEID * 3)); e=$((r + 3))");
    memcpy(path, path0, sizeof path);
    fd = mkstemp(path);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, s, strlen(s)), (ssize_t)strlen(s));
    close(fd);
    cmd = td_xasprintf("sh -n %s", path);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    unlink(path);
    free(s);
    job.env = env;
    so.work_dir = NULL;

    td_slurm_options extra = {.sbatch_args = (char *[]){"--exclusive", "--qos=high"},
                              .nsbatch_args = 2};
    char **argv = td__slurm_sbatch_argv("/usr/bin/sbatch", &extra, "/r/job.sbatch");
    /* --export=ALL: the token and the secrets travel in sbatch's environment */
    const char *want[] = {"/usr/bin/sbatch", "--parsable", "--export=ALL",
                          "--exclusive",     "--qos=high", "/r/job.sbatch"};
    for (size_t i = 0; i < TD_ARRAY_LEN(want); i++) ASSERT_STREQ(argv[i], want[i]);
    ASSERT(argv[6] == NULL);
    for (size_t i = 0; argv[i]; i++) free(argv[i]);
    free(argv);
}

/* A job's secrets (exec.h) are never in the batch script, nor unset by it: the script would
 * otherwise export a secret the job's environment holds and ours does not (A), and unset one
 * ours holds and the job's environment does not (B, an implicit secret such as credentials
 * resolved from a profile), both of which sbatch's environment carries. It only checks each
 * name arrived. */
static void test_script_secrets(void) {
    unsetenv("TD_TEST_SECRET_A");
    setenv("TD_TEST_SECRET_B", "stale", 1);
    char *env[] = {"TD_TEST_SECRET_A=va1ue-of-a", "TANDEM_RUN_ID=bn-1", NULL};
    char *secrets[] = {"TD_TEST_SECRET_A=va1ue-of-a", "TD_TEST_SECRET_B=va1ue-of-b", NULL};
    td_run run = {.id = "bn-1", .run_dir = "/p/.tandem/runs/bn-1", .nodes = 2, .nproc_per_node = 1};
    td_slurm_options so = {0};
    td_exec_job job = {.run = &run,
                       .work_dir = "/p/.tandem/runs/bn-1/work",
                       .script = "true",
                       .tandem_bin = "/opt/tandem/bin/tandem",
                       .env = env,
                       .secrets = secrets,
                       .slurm = &so};
    for (int linked = 0; linked < 2; linked++) {
        so.work_dir = linked ? "/scratch/td" : NULL;
        char *s = td__slurm_batch_script(&job, linked ? NULL : "/t", linked ? "login1:1" : NULL);
        ASSERT(!strstr(s, "va1ue-of"));
        ASSERT(!strstr(s, "unset TD_TEST_SECRET"));
        ASSERT(!strstr(s, "export TD_TEST_SECRET"));
        ASSERT_CONTAINS(s, "[ -n \"${TD_TEST_SECRET_A+x}\" ] || { echo \"tandem: error: secret "
                           "TD_TEST_SECRET_A is not in the job's environment");
        ASSERT_CONTAINS(s, "[ -n \"${TD_TEST_SECRET_B+x}\" ] ||");
        free(s);
    }
    unsetenv("TD_TEST_SECRET_B");
}

static void test_capture(void) {
    char *out, *err;
    int code;
    char *argv[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", NULL};
    ASSERT_OK(td__exec_capture(argv, NULL, 10, &out, &err, &code));
    ASSERT_STREQ(out, "out\n");
    ASSERT_STREQ(err, "err\n");
    ASSERT_EQ(code, 3);
    free(out);
    free(err);
    char *slow[] = {"/bin/sh", "-c", "sleep 30", NULL};
    double t = td_now_s();
    ASSERT_OK(td__exec_capture(slow, NULL, 0.3, &out, &err, &code));
    ASSERT_EQ(code, 124);
    ASSERT_LT(td_now_s() - t, 5.0);
    free(out);
    free(err);
    char *which = td__exec_which("sh");
    ASSERT(which && which[0] == '/');
    free(which);
    ASSERT(td__exec_which("no-such-program-tandem") == NULL);
}

int main(void) {
    test_parse();
    test_time();
    test_scontrol();
    test_outcome();
    test_script();
    test_script_secrets();
    test_capture();
    ASSERT(td_executor_find("slurm") == &td__executor_slurm);
    ASSERT(td_executor_find("local") == NULL);
    printf("ok\n");
    return 0;
}
