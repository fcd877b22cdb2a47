/* executors: the ssh executor's parts that need no host. The workflow fields (executor: ssh,
 * ssh:) and their errors, host entries, hostfiles. The hosts themselves are
 * test_ssh_run.sh's. */
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
                       "    executor: ssh\n"
                       "    ssh:\n"
                       "      hosts: [gpu1, 'me@gpu2:2222', '[fe80::1]:22']\n"
                       "      work_dir: /scratch/runs\n"
                       "      ssh_args: [-i, ~/.ssh/cluster]\n"
                       "      tandem: /opt/tandem/bin/tandem\n"
                       "      rdzv_host: 10.0.0.1\n"
                       "  - name: b\n"
                       "    command: tandem train\n"
                       "    nodes: 4\n"
                       "    executor: ssh\n"
                       "    ssh: {hostfile: hosts.txt}\n";
    td_workflow_file *wf;
    ASSERT_OK(td_workflow_file_parse(text, strlen(text), "wf.yaml", &wf));
    const td_workflow *a, *b;
    ASSERT_OK(td_workflow_find(wf, "a", &a));
    ASSERT_OK(td_workflow_find(wf, "b", &b));
    ASSERT_STREQ(a->executor, "ssh");
    ASSERT_EQ(a->nodes, 3); /* one node per host */
    ASSERT_EQ(a->ssh.nhosts, 3);
    ASSERT_STREQ(a->ssh.hosts[1], "me@gpu2:2222");
    ASSERT_STREQ(a->ssh.work_dir, "/scratch/runs");
    ASSERT_EQ(a->ssh.nssh_args, 2);
    ASSERT_STREQ(a->ssh.tandem, "/opt/tandem/bin/tandem");
    ASSERT_STREQ(a->ssh.rdzv_host, "10.0.0.1");
    ASSERT_STREQ(b->ssh.hostfile, "hosts.txt");
    ASSERT_EQ(b->nodes, 4); /* checked against the file when the run starts */
    td_workflow *copy = td_workflow_copy(a);
    ASSERT_STREQ(copy->ssh.hosts[2], "[fe80::1]:22");
    td_workflow_free(copy);
    td_workflow_file_free(wf);

    const char *head = "workflows:\n  - name: x\n    command: tandem train\n";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s    ssh: {hosts: [a]}\n", head);
    expect_error(buf, "ssh: but runs on the local executor", "executor: ssh");
    snprintf(buf, sizeof buf, "%s    executor: ssh\n", head);
    expect_error(buf, "names no machines", "hosts: [host1, host2]");
    snprintf(buf, sizeof buf, "%s    executor: ssh\n    ssh: {hosts: [a, b], hostfile: h}\n", head);
    expect_error(buf, "one of them", NULL);
    snprintf(buf, sizeof buf, "%s    executor: ssh\n    ssh: {}\n", head);
    expect_error(buf, "hosts: [a, b] or as hostfile", NULL);
    snprintf(buf, sizeof buf, "%s    executor: ssh\n    ssh: {hosts: [a], user: me}\n", head);
    expect_error(buf, "unknown field 'user'", "hosts, hostfile, work_dir");
    snprintf(buf, sizeof buf, "%s    executor: ssh\n    nodes: 3\n    ssh: {hosts: [a, b]}\n",
             head);
    expect_error(buf, "nodes: 3 but 2 ssh hosts", NULL);
    snprintf(buf, sizeof buf, "%s    executor: ssh\n    ssh: {hosts: ['a;reboot']}\n", head);
    expect_error(buf, "'a;reboot' is not a host", "';' is not allowed");
    snprintf(buf, sizeof buf, "%s    executor: rsh\n", head);
    expect_error(buf, "expected local or slurm, ssh or aws", NULL);
}

static void test_hosts(void) {
    static const char *const good[] = {"gpu1",      "me@gpu1",        "gpu1:2222", "me@10.0.0.2:22",
                                       "[fe80::1]", "[fe80::1]:2200", "a.b-c_d"};
    for (size_t i = 0; i < TD_ARRAY_LEN(good); i++) ASSERT_OK(td_ssh_host_check("h", good[i]));
    static const char *const bad[] = {
        "", "a b", "-oProxyCommand=x", "a:", "a:port", "a:70000", "$(x)", "a'b", "@", ":22"};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        ASSERT_STATUS(td_ssh_host_check("ssh.hosts", bad[i]), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), "ssh.hosts");
        td_error_clear();
    }

    char dir[] = "/tmp/tandem-test-ssh-XXXXXX";
    ASSERT(mkdtemp(dir));
    char *path = td_xasprintf("%s/hosts.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("# the cluster\n  gpu1 slots=8\n\nme@gpu2:2222   # spare\n", f);
    fclose(f);
    td_ssh_options o = {.hostfile = "hosts.txt"};
    char **hosts;
    size_t n;
    ASSERT_OK(td_ssh_hosts(&o, dir, &hosts, &n));
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(hosts[0], "gpu1");
    ASSERT_STREQ(hosts[1], "me@gpu2:2222");
    td_ssh_hosts_free(hosts, n);

    f = fopen(path, "w");
    fputs("gpu1\ngpu2 gpu3\n", f);
    fclose(f);
    ASSERT_STATUS(td_ssh_hosts(&o, dir, &hosts, &n), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "hosts.txt:2: one host per line");
    td_error_clear();
    f = fopen(path, "w");
    fputs("# nobody\n", f);
    fclose(f);
    ASSERT_STATUS(td_ssh_hosts(&o, dir, &hosts, &n), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "names no host");
    td_error_clear();
    o.hostfile = "missing.txt";
    ASSERT_STATUS(td_ssh_hosts(&o, dir, &hosts, &n), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "missing.txt");
    td_error_clear();
    unlink(path);
    rmdir(dir);
    free(path);
}

int main(void) {
    test_parse();
    test_hosts();
    printf("test_ssh_unit: ok\n");
    return 0;
}
