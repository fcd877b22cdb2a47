/* executors: nproc_per_node: gpu|cpu|auto counted before a run on the executors whose machines
 * tandem run cannot ask (issue 30): Slurm from sinfo's view of the nodes, aws from EC2's
 * catalog entry of the instance type. The expected counts here are read off the inputs by hand,
 * following Slurm's documented GRES syntax (gres.conf(5): NAME[:TYPE][:COUNT]) and tandem
 * launch's rule (gpu: the GPUs, an error without; cpu: the CPUs; auto: gpu where there are
 * GPUs, else cpu). A fake sinfo on PATH checks which nodes td_slurm_count_nproc asks about
 * (the partition and the nodelist of slurm: sbatch_args win over slurm: partition). The live
 * counts are checked against `scontrol show node` in test_slurm_run.sh and boto3's
 * DescribeInstanceTypes in tests/cloud/test_aws_cost.sh. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/internal.h"
#include "tandem/cloud.h"

static void test_gres(void) {
    ASSERT_EQ(td__slurm_gres_gpus("gpu:2"), 2);
    ASSERT_EQ(td__slurm_gres_gpus("gpu:a100:2"), 2);
    ASSERT_EQ(td__slurm_gres_gpus("gpu:a100:2(S:0-1)"), 2);
    ASSERT_EQ(td__slurm_gres_gpus("gpu:tesla:4(S:0,1)"), 4); /* a ',' inside the socket list */
    ASSERT_EQ(td__slurm_gres_gpus("gpu:a100:2(S:0),gpu:v100:1,mps:400"), 3);
    ASSERT_EQ(td__slurm_gres_gpus("mps:400,gpu:8"), 8);
    ASSERT_EQ(td__slurm_gres_gpus("gpu"), 1); /* no count: one */
    ASSERT_EQ(td__slurm_gres_gpus("(null)"), 0);
    ASSERT_EQ(td__slurm_gres_gpus(""), 0);
    ASSERT_EQ(td__slurm_gres_gpus("mps:100"), 0);
    ASSERT_EQ(td__slurm_gres_gpus("gpus:2"), 0); /* another GRES name, not gpu */
}

/* sinfo -h -N -o '%N|%P|%c|%G|%f' of a cluster: cpu* (default) has c1, c2; gpu has g1, g2 (2
 * A100 each, g2 also in big) and g3 (4 V100, feature v100); big has g2 and b1 */
static const char *const SINFO = "c1|cpu*|8|(null)|(null)\n"
                                 "c2|cpu*|8|(null)|(null)\n"
                                 "g1|gpu|32|gpu:a100:2(S:0-1)|a100,ib\n"
                                 "g2|gpu|32|gpu:a100:2(S:0-1)|a100\n"
                                 "g2|big|32|gpu:a100:2(S:0-1)|a100\n"
                                 "g3|gpu|64|gpu:v100:4|v100,ib\n"
                                 "b1|big|128|(null)|(null)\n";

static void names(const td__slurm_node *n, size_t count, char *out, size_t nbytes) {
    out[0] = '\0';
    for (size_t i = 0; i < count; i++)
        snprintf(out + strlen(out), nbytes - strlen(out), "%s%s", i ? " " : "", n[i].name);
}

static void test_nodes(void) {
    td__slurm_node *n = NULL;
    size_t count = 0;
    char got[256];
    ASSERT_OK(td__slurm_nodes_parse(SINFO, NULL, NULL, &n, &count));
    names(n, count, got, sizeof got);
    ASSERT_STREQ(got, "c1 c2"); /* the default partition */
    ASSERT_STREQ(n[0].partition, "cpu");
    ASSERT_EQ(n[0].cpus, 8);
    ASSERT_EQ(n[0].gpus, 0);
    free(n);
    ASSERT_OK(td__slurm_nodes_parse(SINFO, "gpu", NULL, &n, &count));
    names(n, count, got, sizeof got);
    ASSERT_STREQ(got, "g1 g2 g3");
    ASSERT_EQ(n[2].gpus, 4);
    ASSERT_EQ(n[2].cpus, 64);
    free(n);
    ASSERT_OK(td__slurm_nodes_parse(SINFO, "gpu,big", NULL, &n, &count));
    names(n, count, got, sizeof got);
    ASSERT_STREQ(got, "g1 g2 g3 b1"); /* g2 once */
    free(n);
    ASSERT_OK(td__slurm_nodes_parse(SINFO, "gpu", "a100", &n, &count));
    names(n, count, got, sizeof got);
    ASSERT_STREQ(got, "g1 g2");
    free(n);
    ASSERT_OK(td__slurm_nodes_parse(SINFO, "gpu", "v100&ib", &n, &count));
    names(n, count, got, sizeof got);
    ASSERT_STREQ(got, "g3");
    free(n);
    /* an expression beyond a plain AND filters nothing: a superset of the nodes */
    ASSERT_OK(td__slurm_nodes_parse(SINFO, "gpu", "a100|v100", &n, &count));
    ASSERT_EQ(count, 3);
    free(n);
    ASSERT_OK(td__slurm_nodes_parse(SINFO, "nosuch", NULL, &n, &count));
    ASSERT_EQ(count, 0);
    free(n);
    ASSERT_STATUS(td__slurm_nodes_parse("c1|cpu*|eight|(null)|(null)\n", NULL, NULL, &n, &count),
                  TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "sinfo line 1");
    ASSERT_CONTAINS(td_error_msg(), "c1|cpu*|eight");
    td_error_clear();
}

static void count_of(const char *partitions, const char *constraint, const char *spec,
                     td_status want, int want_n, int want_gpus, const char *msg) {
    td__slurm_node *n = NULL;
    size_t count = 0;
    ASSERT_OK(td__slurm_nodes_parse(SINFO, partitions, constraint, &n, &count));
    int got = -1, gpus = -1;
    char note[512];
    td_status st = td__slurm_count_nodes(n, count, "partition X", spec, &got, &gpus, note,
                                         sizeof note);
    free(n);
    if (st != want) TEST_FAIL("%s %s: status %d, want %d (%s)", partitions, spec, st, want,
                              td_error_msg());
    if (st == TD_OK) {
        ASSERT_EQ(got, want_n);
        ASSERT_EQ(gpus, want_gpus);
        if (msg) ASSERT_CONTAINS(note, msg);
    } else {
        ASSERT_CONTAINS(td_error_msg(), msg);
        td_error_clear();
    }
}

static void test_count_rule(void) {
    count_of(NULL, NULL, "cpu", TD_OK, 8, 0, "nproc_per_node cpu: 8 workers, one per CPU");
    count_of(NULL, NULL, "auto", TD_OK, 8, 0,
             "one per CPU of each of partition X's 2 nodes (sinfo: 8 CPUs, GRES (null))");
    count_of(NULL, NULL, "gpu", TD_ERR_USAGE, 0, 0,
             "nproc_per_node: gpu counts the GPUs of the Slurm nodes, and partition X has none");
    count_of("gpu", "a100", "gpu", TD_OK, 2, 2, "one per GPU");
    count_of("gpu", "a100", "auto", TD_OK, 2, 2, "gpu:a100:2(S:0-1)");
    count_of("gpu", "a100", "cpu", TD_OK, 32, 0, "one per CPU");
    count_of("gpu", "v100", "gpu", TD_OK, 4, 4, NULL);
    /* nodes that disagree: one count per node */
    count_of("gpu", NULL, "gpu", TD_ERR_USAGE, 0, 0,
             "nproc_per_node: gpu counts 2 workers on Slurm node g1 (GPUs) but 4 on g3 (GPUs) "
             "(partition X); a run has one count per node: give a number");
    count_of("gpu", NULL, "cpu", TD_ERR_USAGE, 0, 0, "counts 32 workers on Slurm node g1");
    count_of("big", NULL, "gpu", TD_ERR_USAGE, 0, 0, "but none on b1, which has no GPU");
    count_of("big", NULL, "auto", TD_ERR_USAGE, 0, 0, "but 128 on b1 (CPUs)");
    count_of("nosuch", NULL, "auto", TD_ERR_NOTFOUND, 0, 0, "sinfo lists no node for partition X");
}

/* td_slurm_count_nproc through a fake sinfo: what it is asked, and the options it reads */
static void test_count_sinfo(void) {
    char dir[] = "/tmp/td-nproc-XXXXXX";
    ASSERT(mkdtemp(dir));
    char path[512], args[512];
    snprintf(path, sizeof path, "%s/sinfo", dir);
    snprintf(args, sizeof args, "%s/args", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fprintf(f, "#!/bin/sh\necho \"$*\" >%s\ncat <<'EOF'\n%sEOF\n", args, SINFO);
    fclose(f);
    ASSERT_EQ(chmod(path, 0755), 0);
    const char *old = getenv("PATH");
    char *saved = old ? strdup(old) : NULL;
    char *p = NULL;
    ASSERT(asprintf(&p, "%s:%s", dir, old ? old : "/usr/bin:/bin") > 0);
    setenv("PATH", p, 1);
    free(p);

    char *sargs[] = {"--exclusive", "-p", "gpu", "--nodelist=g[1-2]", NULL};
    td_slurm_options o = {.partition = "cpu", .sbatch_args = sargs, .nsbatch_args = 4};
    int n = 0;
    char note[512], line[512] = "";
    /* the fake ignores --nodes: the gpu partition's three nodes disagree, and the refusal
     * names the nodes asked for (sbatch_args' -p gpu wins over slurm: partition cpu) */
    ASSERT_STATUS(td_slurm_count_nproc(&o, "auto", &n, note, sizeof note), TD_ERR_USAGE);
    ASSERT_CONTAINS(td_error_msg(), "(partition gpu, nodes g[1-2]); a run has one count per node");
    td_error_clear();
    f = fopen(args, "r");
    ASSERT(f && fgets(line, sizeof line, f));
    fclose(f);
    ASSERT_STREQ(line, "-h -N -o %N|%P|%c|%G|%f --nodes=g[1-2]\n");
    /* a plain AND constraint narrows them to the A100s */
    char *sargs2[] = {"-p", "gpu", "-C", "a100", NULL};
    td_slurm_options o2 = {.partition = "cpu", .sbatch_args = sargs2, .nsbatch_args = 4};
    ASSERT_OK(td_slurm_count_nproc(&o2, "auto", &n, note, sizeof note));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(o2.gpus_per_node, 2);
    ASSERT_CONTAINS(note, "partition gpu, constraint a100");
    td_slurm_options o3 = {.partition = "cpu"};
    ASSERT_OK(td_slurm_count_nproc(&o3, "auto", &n, note, sizeof note));
    ASSERT_EQ(n, 8);
    ASSERT_EQ(o3.gpus_per_node, 0);
    td_slurm_options o4 = {0};
    ASSERT_STATUS(td_slurm_count_nproc(&o4, "gpu", &n, note, sizeof note), TD_ERR_USAGE);
    ASSERT_CONTAINS(td_error_msg(), "the default partition cpu has none");
    td_error_clear();

    if (saved) setenv("PATH", saved, 1);
    free(saved);
    unlink(path);
    unlink(args);
    rmdir(dir);
}

/* the batch script asks for the GPUs a count of GPUs gave each node, and for none otherwise */
static void test_script_gres(void) {
    td_run run = {.id = "g-1", .run_dir = "/p/.tandem/runs/g-1", .nodes = 2, .nproc_per_node = 2};
    td_slurm_options so = {.partition = "gpu", .gpus_per_node = 2};
    td_exec_job job = {.run = &run,
                       .work_dir = "/p/.tandem/runs/g-1/work",
                       .script = "true",
                       .tandem_bin = "/opt/tandem/bin/tandem",
                       .slurm = &so};
    char *s = td__slurm_batch_script(&job, "/t", NULL);
    ASSERT_CONTAINS(s, "#SBATCH --cpus-per-task=2\n#SBATCH --gres=gpu:2\n");
    free(s);
    so.gpus_per_node = 0;
    s = td__slurm_batch_script(&job, "/t", NULL);
    ASSERT(!strstr(s, "--gres"));
    free(s);
}

static void test_aws_type(void) {
    td_ec2_type g = {.name = "g5.12xlarge", .vcpus = 48, .memory_gib = 192, .gpus = 4,
                     .gpu_model = "A10G", .gpu_memory_gib = 24};
    td_ec2_type t = {.name = "t3.micro", .vcpus = 2, .memory_gib = 1};
    int n = 0;
    char why[256];
    ASSERT_OK(td__aws_type_nproc(&g, "gpu", &n, why, sizeof why));
    ASSERT_EQ(n, 4);
    ASSERT_STREQ(why, "one per GPU of g5.12xlarge (4 x A10G)");
    ASSERT_OK(td__aws_type_nproc(&g, "auto", &n, why, sizeof why));
    ASSERT_EQ(n, 4);
    ASSERT_OK(td__aws_type_nproc(&g, "cpu", &n, why, sizeof why));
    ASSERT_EQ(n, 48);
    ASSERT_OK(td__aws_type_nproc(&t, "auto", &n, why, sizeof why));
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(why, "one per vCPU of t3.micro (2 vCPU, no GPU)");
    ASSERT_OK(td__aws_type_nproc(&t, "cpu", &n, why, sizeof why));
    ASSERT_EQ(n, 2);
    ASSERT_STATUS(td__aws_type_nproc(&t, "gpu", &n, why, sizeof why), TD_ERR_USAGE);
    ASSERT_CONTAINS(td_error_msg(), "nproc_per_node: gpu counts the GPUs of the instance type, "
                                    "and t3.micro has none");
    ASSERT_CONTAINS(td_error_msg(), "aws.resources: {gpu: 1}");
    td_error_clear();
}

int main(void) {
    test_gres();
    test_nodes();
    test_count_rule();
    test_count_sinfo();
    test_script_gres();
    test_aws_type();
    printf("ok\n");
    return 0;
}
