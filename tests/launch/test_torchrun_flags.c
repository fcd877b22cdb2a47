/* launch: the pure parts of torchrun's flags (src/launch/torchrun.c). The value of --redirects and
 * --tee per local rank, every malformed one refused with what is wrong; the GPUs that
 * CUDA_VISIBLE_DEVICES leaves visible, read as CUDA reads it (up to the first entry naming no
 * device), which a GPU-less machine cannot show end to end; and the Python interpreter's order
 * of choice on a fake file system. The flags end to end: test_launch_torchrun.sh. */
#include "test.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/launch.h"

static int std_of(const char *spec, int local_rank) {
    int v = -1;
    ASSERT_OK(td_launch_std_parse(spec, local_rank, &v));
    return v;
}

static void expect_bad_std(const char *spec, const char *needle) {
    int v = -1;
    ASSERT_STATUS(td_launch_std_parse(spec, 0, &v), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), needle);
    td_error_clear();
}

static void test_std(void) {
    ASSERT_EQ(std_of(NULL, 0), 0); /* torchrun's default "0" */
    for (int v = 0; v <= 3; v++) {
        char spec[2] = {(char)('0' + v), 0};
        ASSERT_EQ(std_of(spec, 0), v);
        ASSERT_EQ(std_of(spec, 7), v); /* one value: every local rank */
    }
    ASSERT_EQ(TD_LAUNCH_STD_OUT | TD_LAUNCH_STD_ERR, 3);
    /* torchrun's docstring example: {0: ALL, 1: NONE, 2: OUT, 3: ERR} */
    const char *m = "0:3,1:0,2:1,3:2";
    ASSERT_EQ(std_of(m, 0), 3);
    ASSERT_EQ(std_of(m, 1), 0);
    ASSERT_EQ(std_of(m, 2), 1);
    ASSERT_EQ(std_of(m, 3), 2);
    ASSERT_EQ(std_of(m, 4), 0);         /* not listed: none */
    ASSERT_EQ(std_of("1:2", 0), 0);     /* a map naming rank 1 only */
    ASSERT_EQ(std_of("12:3", 12), 3);   /* two-digit local ranks (torchrun: one digit) */
    ASSERT_EQ(std_of("0:1,0:2", 0), 2); /* given twice: the later, as a dict */
    expect_bad_std("", "an empty value");
    expect_bad_std("4", "not a value from 0 to 3");
    expect_bad_std("-1", "not a value from 0 to 3");
    expect_bad_std("all", "not a value from 0 to 3");
    expect_bad_std("0:4", "'0:4' is not LOCAL_RANK:VALUE with VALUE 0-3");
    expect_bad_std("0:1,", "'' is not LOCAL_RANK:VALUE");
    expect_bad_std("0:1,,1:2", "'' is not LOCAL_RANK:VALUE");
    expect_bad_std("a:1", "'a:1' is not");
    expect_bad_std(":1", "':1' is not");
    expect_bad_std("0:", "'0:' is not");
    expect_bad_std("0:1:2", "'0:1:2' is not");
    expect_bad_std("0:1,x", "'x' is not"); /* a later item is checked too, whatever the rank */
}

static void test_visible_gpus(void) {
    ASSERT_EQ(td_launch_visible_gpus(NULL, 4), 4); /* unset: all */
    ASSERT_EQ(td_launch_visible_gpus(NULL, 0), 0);
    ASSERT_EQ(td_launch_visible_gpus("", 4), 0); /* set and empty: none */
    ASSERT_EQ(td_launch_visible_gpus("0", 4), 1);
    ASSERT_EQ(td_launch_visible_gpus("3,1", 4), 2);
    ASSERT_EQ(td_launch_visible_gpus(" 0 , 1 ", 4), 2);
    ASSERT_EQ(td_launch_visible_gpus("0,2,-1,1", 4), 2); /* CUDA's docs: stops at -1 */
    ASSERT_EQ(td_launch_visible_gpus("-1", 4), 0);
    ASSERT_EQ(td_launch_visible_gpus("4", 4), 0);          /* out of range */
    ASSERT_EQ(td_launch_visible_gpus("0,7,1", 4), 1);      /* stops at the first one */
    ASSERT_EQ(td_launch_visible_gpus("0,0,1", 4), 1);      /* a repeat ends the list */
    ASSERT_EQ(td_launch_visible_gpus("0,,1", 4), 1);       /* so does an empty item */
    ASSERT_EQ(td_launch_visible_gpus("NoDevFiles", 4), 0); /* old Slurm without a GPU */
    ASSERT_EQ(td_launch_visible_gpus("0", 0), 0);          /* no driver: nothing to see */
    ASSERT_EQ(td_launch_visible_gpus("GPU-8f6e1d2a,MIG-1a2b", 1), 2); /* UUIDs count */
    ASSERT_EQ(td_launch_visible_gpus("GPU-8f6e1d2a,GPU-8f6e1d2a", 2), 1);
}

/* An executable file at path that is no interpreter: only its path matters here. */
static void touch_exec(const char *path) {
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fputs("#!/bin/sh\n", f);
    fclose(f);
    ASSERT_EQ(chmod(path, 0755), 0);
}

static void expect_python(const char *want_path, const char *want_source) {
    char *path = NULL;
    const char *source = NULL;
    ASSERT_OK(td_launch_find_python(&path, &source));
    ASSERT_STREQ(path, want_path);
    ASSERT_STREQ(source, want_source);
    free(path);
}

static void expect_no_python(const char *needle) {
    char *path = NULL;
    ASSERT_STATUS(td_launch_find_python(&path, NULL), TD_ERR_NOTFOUND);
    ASSERT(path == NULL);
    ASSERT_CONTAINS(td_error_msg(), needle);
    td_error_clear();
}

static void test_python(void) {
    char dir[] = "/tmp/tandem-test-python-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char bin[256], venv_bin[256], venv_py[300], path_py[300], tandem_py[300], exec_py[300], py[300];
    snprintf(bin, sizeof bin, "%s/bin", dir);
    snprintf(venv_bin, sizeof venv_bin, "%s/venv/bin", dir);
    ASSERT_EQ(mkdir(bin, 0755), 0);
    snprintf(py, sizeof py, "%s/venv", dir);
    ASSERT_EQ(mkdir(py, 0755), 0);
    ASSERT_EQ(mkdir(venv_bin, 0755), 0);
    snprintf(venv_py, sizeof venv_py, "%s/python3", venv_bin);
    snprintf(path_py, sizeof path_py, "%s/python3", bin);
    snprintf(tandem_py, sizeof tandem_py, "%s/tandem-python", bin);
    snprintf(exec_py, sizeof exec_py, "%s/exec-python", bin);
    snprintf(py, sizeof py, "%s/py", bin);
    touch_exec(venv_py);
    touch_exec(path_py);
    touch_exec(tandem_py);
    touch_exec(exec_py);
    touch_exec(py);
    /* python3 on PATH, the first one */
    unsetenv("TANDEM_PYTHON");
    unsetenv("PYTHON_EXEC");
    unsetenv("PYTHON");
    unsetenv("VIRTUAL_ENV");
    char path_env[600];
    snprintf(path_env, sizeof path_env, "/nonexistent:%s:%s", bin, venv_bin);
    setenv("PATH", path_env, 1);
    expect_python(path_py, "PATH");
    /* the active virtual environment before PATH: the path as found, not its target */
    snprintf(py, sizeof py, "%s/venv", dir);
    setenv("VIRTUAL_ENV", py, 1);
    expect_python(venv_py, "VIRTUAL_ENV");
    /* PYTHON before it, a name looked up on PATH */
    setenv("PYTHON", "py", 1);
    snprintf(py, sizeof py, "%s/py", bin);
    expect_python(py, "PYTHON");
    setenv("PYTHON_EXEC", exec_py, 1);
    expect_python(exec_py, "PYTHON_EXEC");
    setenv("TANDEM_PYTHON", tandem_py, 1);
    expect_python(tandem_py, "TANDEM_PYTHON");
    /* empty is unset */
    setenv("TANDEM_PYTHON", "", 1);
    expect_python(exec_py, "PYTHON_EXEC");
    /* a named interpreter that is not there is an error, not a silent fall-through */
    setenv("PYTHON_EXEC", "/nonexistent/python", 1);
    expect_no_python("PYTHON_EXEC=/nonexistent/python: no executable file there");
    unsetenv("PYTHON_EXEC");
    setenv("PYTHON", "python9.99", 1);
    expect_no_python("PYTHON=python9.99: not found on PATH");
    unsetenv("PYTHON");
    setenv("VIRTUAL_ENV", "/nonexistent/venv", 1);
    expect_no_python("VIRTUAL_ENV=/nonexistent/venv (an active virtual environment) has no "
                     "executable /nonexistent/venv/bin/python3");
    unsetenv("VIRTUAL_ENV");
    setenv("PATH", "/nonexistent", 1);
    expect_no_python("no python3 is on PATH; set PYTHON=/path/to/python3, or run the command "
                     "itself with --no-python");
    /* a directory named python3 is no interpreter */
    char dir_py[300];
    snprintf(dir_py, sizeof dir_py, "%s/dirpy", dir);
    ASSERT_EQ(mkdir(dir_py, 0755), 0);
    char dir_py3[320];
    snprintf(dir_py3, sizeof dir_py3, "%s/python3", dir_py);
    ASSERT_EQ(mkdir(dir_py3, 0755), 0);
    setenv("PATH", dir_py, 1);
    expect_no_python("no python3 is on PATH");
    char cmd[400];
    setenv("PATH", "/usr/bin:/bin", 1);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
}

int main(void) {
    test_std();
    test_visible_gpus();
    test_python();
    TEST_PASS();
}
