/* executors: a job's secrets (include/tandem/exec.h) without a run. The names a secret may have;
 * the list (set, replace, look up, the length limit, errors that never hold the value); the ssh
 * opening's "secret NAME HEX" lines; the implicit AWS secrets; and the workflow's side
 * (td_workflow_secrets): values from our environment, AWS_* added for an s3:// checkpoint_dir
 * only, an unset secret refused naming it and the file. */
#include "test.h"

#include <stdlib.h>

#include "exec/internal.h"
#include "tandem/workflow.h"

static void test_names(void) {
    ASSERT(td_exec_secret_name_ok("WANDB_API_KEY"));
    ASSERT(td_exec_secret_name_ok("_x1"));
    ASSERT(!td_exec_secret_name_ok(""));
    ASSERT(!td_exec_secret_name_ok("1X"));
    ASSERT(!td_exec_secret_name_ok("A-B"));
    ASSERT(!td_exec_secret_name_ok("A=B"));
    ASSERT(!td_exec_secret_name_ok("TANDEM_TOKEN"));
    ASSERT(!td_exec_secret_name_ok("PATH"));
}

static void test_list(void) {
    td_exec_secrets s = {0};
    ASSERT(s.v == NULL && td_exec_secret_value(s.v, "A") == NULL);
    ASSERT_OK(td_exec_secrets_set(&s, "A", "one"));
    ASSERT_OK(td_exec_secrets_set(&s, "B", ""));
    ASSERT_OK(td_exec_secrets_set(&s, "A", "two")); /* replaces */
    ASSERT_EQ(s.count, (size_t)2);
    ASSERT(s.v[2] == NULL);
    ASSERT_STREQ(td_exec_secret_value(s.v, "A"), "two");
    ASSERT_STREQ(td_exec_secret_value(s.v, "B"), "");
    ASSERT(td_exec_secret_value(s.v, "AB") == NULL);
    /* errors name the secret, never its value */
    ASSERT_EQ(td_exec_secrets_set(&s, "1X", "hidden-value"), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "secret '1X'");
    ASSERT(!strstr(td_error_msg(), "hidden-value"));
    td_error_clear();
    char *big = calloc(TD_EXEC_SECRET_MAX_BYTES + 2, 1);
    memset(big, 'v', TD_EXEC_SECRET_MAX_BYTES + 1);
    ASSERT_EQ(td_exec_secrets_set(&s, "BIG", big), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "secret BIG is 8193 bytes long; at most 8192");
    td_error_clear();
    big[TD_EXEC_SECRET_MAX_BYTES] = '\0';
    ASSERT_OK(td_exec_secrets_set(&s, "BIG", big));
    free(big);
    /* the ssh opening: the value's bytes in hex, so no byte of it can end or split the line */
    td_exec_secrets t = {0};
    ASSERT_OK(td_exec_secrets_set(&t, "K", "a b\n'\xff"));
    ASSERT_OK(td_exec_secrets_set(&t, "E", ""));
    char *lines = td__exec_secret_lines(t.v);
    ASSERT_STREQ(lines, "secret K 6120620a27ff\nsecret E \n");
    td__exec_wipe_free(lines);
    lines = td__exec_secret_lines(NULL);
    ASSERT_STREQ(lines, "");
    td__exec_wipe_free(lines);
    td_exec_secrets_free(&t);
    td_exec_secrets_free(&s);
    ASSERT(s.v == NULL && s.count == 0);
}

static void test_aws(void) {
    for (const char *const *n = td_exec_aws_secret_names; *n; n++) unsetenv(*n);
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "sk", 1);
    setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:5000", 1);
    setenv("AWS_REGION", "", 1); /* empty: not forwarded */
    td_exec_secrets s = {0};
    ASSERT_EQ(td_exec_secrets_add_aws(&s), (size_t)3);
    ASSERT_STREQ(td_exec_secret_value(s.v, "AWS_ACCESS_KEY_ID"), "AKIDTEST");
    ASSERT_STREQ(td_exec_secret_value(s.v, "AWS_ENDPOINT_URL_S3"), "http://127.0.0.1:5000");
    ASSERT(td_exec_secret_value(s.v, "AWS_REGION") == NULL);
    td_exec_secrets_free(&s);
}

static td_workflow_file *parse(const char *text) {
    td_workflow_file *wf = NULL;
    ASSERT_OK(td_workflow_file_parse(text, strlen(text), "wf.yaml", &wf));
    return wf;
}

static void test_workflow(void) {
    /* AWS_* as test_aws left them */
    td_workflow_file *wf = parse("workflows:\n"
                                 "  - {name: plain, command: 'true', secrets: [TD_T_SECRET]}\n"
                                 "  - {name: s3, command: 'true', secrets: [TD_T_SECRET],\n"
                                 "     checkpoint_dir: 's3://bucket/prefix'}\n"
                                 "  - {name: none, command: 'true'}\n");
    td_exec_secrets s;
    unsetenv("TD_T_SECRET");
    ASSERT_EQ(td_workflow_secrets(&wf->items[0], &s), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "wf.yaml: workflow 'plain': secret TD_T_SECRET is not set in "
                                    "tandem run's environment: export it, or remove it from "
                                    "secrets:");
    td_error_clear();
    ASSERT(s.v == NULL && s.count == 0);
    setenv("TD_T_SECRET", "v4lue", 1);
    ASSERT_OK(td_workflow_secrets(&wf->items[0], &s));
    ASSERT_EQ(s.count, (size_t)1);
    ASSERT_STREQ(td_exec_secret_value(s.v, "TD_T_SECRET"), "v4lue");
    td_exec_secrets_free(&s);
    /* an s3:// checkpoint_dir: node 0's agent uploads, so it gets our AWS credentials too */
    ASSERT_OK(td_workflow_secrets(&wf->items[1], &s));
    ASSERT_EQ(s.count, (size_t)4);
    ASSERT_STREQ(td_exec_secret_value(s.v, "AWS_SECRET_ACCESS_KEY"), "sk");
    td_exec_secrets_free(&s);
    ASSERT_OK(td_workflow_secrets(&wf->items[2], &s));
    ASSERT(s.count == 0 && s.v == NULL);
    /* a copy (tandem run's --param path) keeps them, and the file for the message */
    td_workflow *copy = td_workflow_copy(&wf->items[0]);
    ASSERT_EQ(copy->nsecrets, (size_t)1);
    ASSERT_STREQ(copy->secrets[0], "TD_T_SECRET");
    ASSERT_STREQ(copy->file, "wf.yaml");
    td_workflow_free(copy);
    td_workflow_file_free(wf);
    unsetenv("TD_T_SECRET");
    for (const char *const *n = td_exec_aws_secret_names; *n; n++) unsetenv(*n);
}

int main(void) {
    test_names();
    test_list();
    test_aws();
    test_workflow();
    printf("ok\n");
    return 0;
}
