/* The S3 mirror's C tests (test_ckpt_s3_queue, test_ckpt_s3_ranks) start tests/launch/s3_gate.py:
 * moto behind a proxy that logs each request and can hold an upload. s3_gate_start sets moto's
 * fake credentials for tandem and boto3 alike (none of the machine's: HOME is dir, no profile),
 * starts `python script serve dir` (gone with the test however it ends; its output in
 * dir/gate.log, so that ctest does not wait for a pipe), waits for the ports it writes to
 * dir/ports, points AWS_ENDPOINT_URL at the proxy and returns the gate's pid (s3_gate_stop);
 * *moto_port is moto's own (for the reference's boto3, past the proxy). */
#ifndef TANDEM_TESTS_S3_GATE_H
#define TANDEM_TESTS_S3_GATE_H

#include "test.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/core.h"

static pid_t s3_gate_start(const char *python, const char *script, const char *dir,
                         int *moto_port) {
    setenv("AWS_ACCESS_KEY_ID", "test", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "test", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("HOME", dir, 1);
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_ENDPOINT_URL_S3");
    pid_t gate_pid = fork();
    ASSERT(gate_pid >= 0);
    if (gate_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char log[600];
        snprintf(log, sizeof log, "%s/gate.log", dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execl(python, python, script, "serve", dir, (char *)NULL);
        _exit(127);
    }
    char ports_path[600];
    snprintf(ports_path, sizeof ports_path, "%s/ports", dir);
    int proxy_port = 0;
    for (double t0 = td_now_s(); proxy_port == 0;) {
        FILE *f = fopen(ports_path, "r");
        if (f) {
            if (fscanf(f, "%d %d", &proxy_port, moto_port) != 2) proxy_port = 0;
            fclose(f);
        }
        int status;
        if (waitpid(gate_pid, &status, WNOHANG) == gate_pid)
            TEST_FAIL("s3_gate.py exited (status %d): see %s/gate.log", status, dir);
        if (!proxy_port && td_now_s() - t0 > 120) TEST_FAIL("s3_gate.py did not start");
        if (!proxy_port) usleep(50000);
    }
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", proxy_port);
    setenv("AWS_ENDPOINT_URL", endpoint, 1);
    return gate_pid;
}

static void s3_gate_stop(pid_t gate_pid) {
    kill(gate_pid, SIGKILL);
    waitpid(gate_pid, NULL, 0);
}

#endif
