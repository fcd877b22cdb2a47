/* workflow: nesting is bounded (issue 8). libyaml's document loader takes time quadratic in the
 * nesting depth (100,000 brackets in a model spec took 46 s); a workflow file needs four levels,
 * so anything deeper than the bound is refused at once, naming the file, the line and the
 * limit. Without the bound each of these inputs takes tens of seconds. */
#include "test.h"

#include <unistd.h>

#include "tandem/workflow.h"

/* "workflows: " + n times open + n times close, as a workflow file's text. */
static char *nested(size_t n, char open, char close, const char *prefix) {
    size_t len = strlen(prefix);
    char *text = malloc(len + 2 * n + 2);
    ASSERT(text != NULL);
    memcpy(text, prefix, len);
    for (size_t i = 0; i < n; i++) text[len++] = open;
    for (size_t i = 0; i < n; i++) text[len++] = close;
    text[len++] = '\n';
    text[len] = '\0';
    return text;
}

static void expect_refused(const char *text, const char *where) {
    td_workflow_file *wf = NULL;
    ASSERT_STATUS(td_workflow_file_parse(text, strlen(text), "deep.yaml", &wf), TD_ERR_FORMAT);
    ASSERT(wf == NULL);
    ASSERT_CONTAINS(td_error_msg(), where);
    ASSERT_CONTAINS(td_error_msg(), "nested more than 32 levels");
    td_error_clear();
}

int main(void) {
    /* 100,000 brackets: a list of lists... under workflows:, refused at the 33rd level */
    char *deep = nested(100000, '[', ']', "workflows: ");
    expect_refused(deep, "deep.yaml:1:");
    /* the same through a file and with flow mappings, the error on the line it happens */
    free(deep);
    deep = nested(100000, '{', '}', "# a comment line\nworkflows:\n  - name: x\n    env: ");
    expect_refused(deep, "deep.yaml:4:");
    char path[] = "/tmp/tandem-test-depth-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, deep, strlen(deep)), (long long)strlen(deep));
    close(fd);
    td_workflow_file *wf = NULL;
    ASSERT_STATUS(td_workflow_file_load(path, &wf), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), path);
    ASSERT_CONTAINS(td_error_msg(), "nested more than 32 levels");
    td_error_clear();
    unlink(path);
    free(deep);

    /* 32 levels still parse as YAML and reach the workflow checks (which refuse the shape) */
    char *ok = nested(31, '[', ']', "workflows: ");
    ASSERT_STATUS(td_workflow_file_parse(ok, strlen(ok), "ok.yaml", &wf), TD_ERR_FORMAT);
    if (strstr(td_error_msg(), "nested more than"))
        TEST_FAIL("32 levels refused: %s", td_error_msg());
    ASSERT_CONTAINS(td_error_msg(), "ok.yaml:1:");
    td_error_clear();
    free(ok);
    printf("ok\n");
    return 0;
}
