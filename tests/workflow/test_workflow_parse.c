/* workflow: parsing workflow files, errors that point at file:line:column and name the field,
 * unknown names listing the known ones, param overrides, the generated script. */
#include "test.h"

#include "tandem/workflow.h"

static const char *good = "workflows:\n"
                          "  - name: demo\n"
                          "    description: BasicNet on 2 workers\n"
                          "    setup: [echo one, echo two]\n"
                          "    command: tandem train --model basicnet\n"
                          "    nproc_per_node: 2\n"
                          "    env: {OMP_NUM_THREADS: '1'}\n"
                          "    params:\n"
                          "      lr: 0.001\n"
                          "      optimizer: adamw\n"
                          "    artifacts: model.safetensors\n"
                          "    max_restarts: 1\n"
                          "    max_duration: 1h30m\n"
                          "  - name: seq\n"
                          "    commands:\n"
                          "      - echo start\n"
                          "      - python3 train.py --epochs ${{ params.epochs }}\n"
                          "    params: {epochs: 3, name: \"it's\"}\n"
                          "    nodes: 2\n"
                          "    checkpoint_dir: ckpt\n";

/* Parsing text must fail with a message containing each of the needles. */
static void expect_error(const char *text, const char *n1, const char *n2) {
    td_workflow_file *wf = NULL;
    td_status st = td_workflow_file_parse(text, strlen(text), "workflows.yaml", &wf);
    if (st == TD_OK) TEST_FAIL("parsed, but expected an error containing '%s'", n1);
    ASSERT(wf == NULL);
    ASSERT_CONTAINS(td_error_msg(), n1);
    if (n2) ASSERT_CONTAINS(td_error_msg(), n2);
    td_error_clear();
}

int main(void) {
    td_workflow_file *wf;
    ASSERT_OK(td_workflow_file_parse(good, strlen(good), "workflows.yaml", &wf));
    ASSERT_EQ(wf->count, 2);
    const td_workflow *demo, *seq;
    ASSERT_OK(td_workflow_find(wf, "demo", &demo));
    ASSERT_EQ(demo->nproc_per_node, 2);
    ASSERT_EQ(demo->nodes, 1);
    ASSERT_EQ(demo->nsetup, 2);
    ASSERT_STREQ(demo->setup[1], "echo two");
    ASSERT_EQ(demo->nenv, 1);
    ASSERT_STREQ(demo->env[0].key, "OMP_NUM_THREADS");
    ASSERT_STREQ(demo->env[0].value, "1");
    ASSERT_EQ(demo->nartifacts, 1);
    ASSERT_EQ(demo->max_restarts, 1);
    ASSERT_NEAR(demo->max_duration_s, 5400, 0);
    ASSERT_EQ(demo->line, 2);

    /* params are appended to the command, shell-quoted, in file order */
    char *script;
    ASSERT_OK(td_workflow_script(demo, &script));
    ASSERT_STREQ(script, "tandem train --model basicnet --lr '0.001' --optimizer 'adamw'");
    free(script);
    char *json = td_workflow_params_json(demo);
    ASSERT_STREQ(json, "{\"lr\":0.001,\"optimizer\":\"adamw\"}");
    free(json);

    /* --param overrides a value and adds new ones, on a copy */
    td_workflow *w = td_workflow_copy(demo);
    ASSERT_OK(td_workflow_set_param(w, "lr=0.01"));
    ASSERT_OK(td_workflow_set_param(w, "seed=7"));
    ASSERT_OK(td_workflow_script(w, &script));
    ASSERT_STREQ(script,
                 "tandem train --model basicnet --lr '0.01' --optimizer 'adamw' --seed '7'");
    free(script);
    ASSERT_STREQ(demo->params[0].value, "0.001"); /* the file's entry is untouched */
    ASSERT_STATUS(td_workflow_set_param(w, "novalue"), TD_ERR_USAGE);
    ASSERT_CONTAINS(td_error_msg(), "KEY=VALUE");
    ASSERT_STATUS(td_workflow_set_param(w, "bad key=1"), TD_ERR_USAGE);
    td_workflow_free(w);

    /* commands run in sequence under set -e; substituted params are not appended again; the
     * others are, quoted (a ' inside survives) */
    ASSERT_OK(td_workflow_find(wf, "seq", &seq));
    ASSERT_EQ(seq->nodes, 2);
    ASSERT_STREQ(seq->checkpoint_dir, "ckpt");
    ASSERT_OK(td_workflow_script(seq, &script));
    ASSERT_STREQ(script, "set -e\necho start\npython3 train.py --epochs 3 --name 'it'\\''s'");
    free(script);
    w = td_workflow_copy(seq);
    free(w->commands[1]);
    w->commands[1] = td_xstrdup("run ${{ params.missing }}");
    ASSERT_STATUS(td_workflow_script(w, &script), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "params.missing");
    td_workflow_free(w);

    /* an unknown workflow name lists the known ones */
    const td_workflow *none;
    ASSERT_STATUS(td_workflow_find(wf, "dmeo", &none), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "'dmeo'");
    ASSERT_CONTAINS(td_error_msg(), "known workflows: demo, seq");
    td_workflow_file_free(wf);

    /* errors point at file:line:column and name the field */
    expect_error("workflows:\n"
                 "  - name: a\n"
                 "    command: x\n"
                 "    nproc_per_node: two\n",
                 "workflows.yaml:4:21: nproc_per_node: expected a positive integer, got 'two'",
                 NULL);
    expect_error("workflows:\n  - name: a\n    command: x\n    nodes: 0\n",
                 "workflows.yaml:4:12: nodes:", "got '0'");
    expect_error("workflows:\n  - name: a\n    command: x\n    max_restarts: -1\n",
                 "workflows.yaml:4:19: max_restarts: expected a non-negative integer", NULL);
    expect_error("workflows:\n  - name: a\n    command: x\n    nproc: 2\n",
                 "workflows.yaml:4:5: nproc: unknown field", "nproc_per_node");
    expect_error("workflows:\n  - name: a\n    command: x\n    max_duration: soon\n",
                 "workflows.yaml:4:19: max_duration: expected a duration", "got 'soon'");
    expect_error("workflows:\n  - name: a\n    command: [x, y]\n",
                 "workflows.yaml:3:14: command: expected a string", "commands:");
    expect_error("workflows:\n  - name: a\n    setup: {a: b}\n    command: x\n",
                 "workflows.yaml:3:12: setup: expected a string or a list", NULL);
    expect_error("workflows:\n  - name: a\n    params: [1, 2]\n    command: x\n",
                 "workflows.yaml:3:13: params: expected a mapping", NULL);
    expect_error("workflows:\n  - name: a\n", "workflows.yaml:2:5: command:", "no command");
    expect_error("workflows:\n  - command: x\n", "workflows.yaml:2:5: name:", NULL);
    expect_error("workflows:\n  - name: a\n    command: x\n  - name: a\n    command: y\n",
                 "workflows.yaml:4:5: name: workflow 'a' is defined twice (first at line 2)", NULL);
    expect_error("workflows:\n  - name: a\n    command: x\n   bad indent: 1\n",
                 "workflows.yaml:4:", "invalid YAML");
    expect_error("runs:\n  - name: a\n", "workflows.yaml:1:1: runs: unknown top-level field", NULL);
    expect_error("", "workflows.yaml:1:1: workflows:", "empty");

    /* s3:// checkpoints and artifacts (docs/cloud.md): the mapping form of artifacts, and the
     * URLs checked as they are read */
    static const char *s3 = "workflows:\n  - name: s\n    command: x\n"
                            "    checkpoint_dir: s3://ckpts/runs/\n"
                            "    artifacts: {paths: [a.bin, 'out/*.png'], to: s3://arts/p}\n";
    ASSERT_OK(td_workflow_file_parse(s3, strlen(s3), "workflows.yaml", &wf));
    ASSERT_STREQ(wf->items[0].checkpoint_dir, "s3://ckpts/runs/");
    ASSERT_EQ(wf->items[0].nartifacts, 2);
    ASSERT_STREQ(wf->items[0].artifacts[1], "out/*.png");
    ASSERT_STREQ(wf->items[0].artifacts_to, "s3://arts/p");
    td_workflow *copy = td_workflow_copy(&wf->items[0]);
    ASSERT_STREQ(copy->artifacts_to, "s3://arts/p");
    td_workflow_free(copy);
    td_workflow_file_free(wf);
    expect_error("workflows:\n  - name: a\n    command: x\n    checkpoint_dir: s3://Bad_Bucket/x\n",
                 "workflows.yaml:4:21: checkpoint_dir:", "Bad_Bucket");
    expect_error(
        "workflows:\n  - name: a\n    command: x\n    artifacts: {paths: [a], to: /tmp/x}\n",
        "artifacts.to: expected an s3://BUCKET/PREFIX URL", "/tmp/x");
    expect_error("workflows:\n  - name: a\n    command: x\n    artifacts: {path: [a]}\n",
                 "artifacts: unknown field 'path'", "paths or to");

    ASSERT_STATUS(td_workflow_file_load("/nonexistent/workflows.yaml", &wf), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "/nonexistent/workflows.yaml");

    double d;
    ASSERT_OK(td_parse_duration("t", "90s", &d));
    ASSERT_NEAR(d, 90, 0);
    ASSERT_OK(td_parse_duration("t", "2h", &d));
    ASSERT_NEAR(d, 7200, 0);
    ASSERT_OK(td_parse_duration("t", "45", &d));
    ASSERT_NEAR(d, 45, 0);
    ASSERT_STATUS(td_parse_duration("t", "1h30", &d), TD_ERR_INVALID);

    /* issue 30: torchrun's worker counts are kept as written, counted where the workers run */
    const char *gpu = "workflows:\n  - name: g\n    nproc_per_node: auto\n    command: x\n";
    ASSERT_OK(td_workflow_file_parse(gpu, strlen(gpu), "workflows.yaml", &wf));
    ASSERT_STREQ(wf->items[0].nproc_spec, "auto");
    ASSERT_EQ(wf->items[0].nproc_per_node, 0);
    td_workflow_file_free(wf);
    /* env: what tandem sets, and names no shell exports, are refused naming the key */
    expect_error("workflows:\n  - name: e\n    env: {WORLD_SIZE: '4'}\n    command: x\n",
                 "WORLD_SIZE cannot be set here: the launcher sets it for each worker", NULL);
    expect_error("workflows:\n  - name: e\n    env: {TANDEM_RESUME: '1'}\n    command: x\n",
                 "TANDEM_RESUME cannot be set here", "tandem run --resume RUN");
    expect_error("workflows:\n  - name: e\n    env: {1X: '1'}\n    command: x\n",
                 "'1X' is not an environment variable name a shell can set", NULL);

    /* settings outside a file (tandem run --profile, its flags): later fields win */
    td_workflow *cw = td_xcalloc(1, sizeof *cw);
    cw->nodes = cw->nproc_per_node = 1;
    const char *prof = "executor: ssh\nssh: {hosts: [a, b], work_dir: /w}\nnproc_per_node: 2\n";
    ASSERT_OK(td_workflow_apply_settings(cw, prof, strlen(prof), "prof.yaml"));
    const char *flags = "ssh:\n  hosts: [\"c\"]\n";
    ASSERT_OK(td_workflow_apply_settings(cw, flags, strlen(flags), "flags"));
    ASSERT_OK(td_workflow_check(cw, "tandem run"));
    ASSERT_EQ(cw->ssh.nhosts, 1);
    ASSERT_STREQ(cw->ssh.hosts[0], "c");
    ASSERT_STREQ(cw->ssh.work_dir, "/w");
    ASSERT_EQ(cw->nodes, 1);
    ASSERT_EQ(cw->nproc_per_node, 2);
    const char *cmd = "command: x\n";
    ASSERT_STATUS(td_workflow_apply_settings(cw, cmd, strlen(cmd), "p.yaml"), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "p.yaml:1:1: command: not an executor setting");
    td_error_clear();
    td_workflow_free(cw);
    TEST_PASS();
}
