/* Workflow files (src/workflow/parse.c, docs/runs.md): the input parsed from memory as a workflow
 * file; every workflow that parses is then put through what `tandem run` does with it (the worker
 * script with ${{ params.X }} substituted, the params as JSON, a copy with a --param override).
 * The input as a NUL-terminated string also goes through the max_duration parser. */
#include "fuzz.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/workflow.h"

static void use(const td_workflow *w, const td_workflow_file *wf) {
    const td_workflow *found;
    FUZZ_ASSERT(td_workflow_find(wf, w->name, &found) == TD_OK, "'%s' not found", w->name);
    FUZZ_ASSERT(w->ncommands > 0 && w->nodes >= 1 && w->nproc_per_node >= 1 && w->max_restarts >= 0,
                "workflow '%s': %zu commands, %d nodes, %d per node, %d restarts", w->name,
                w->ncommands, w->nodes, w->nproc_per_node, w->max_restarts);
    char *script = NULL;
    if (td_workflow_script(w, &script) == TD_OK) {
        FUZZ_ASSERT(script != NULL, "%s", "no script");
        free(script);
    }
    td_error_clear();
    char *json = td_workflow_params_json(w);
    json_error_t jerr;
    json_t *obj = json_loads(json, 0, &jerr);
    FUZZ_ASSERT(json_is_object(obj), "params are not a JSON object: %s (%s)", json, jerr.text);
    json_decref(obj);
    free(json);
    td_workflow *copy = td_workflow_copy(w);
    FUZZ_ASSERT(td_workflow_set_param(copy, "fuzz=1") == TD_OK, "%s", td_error_msg());
    td_error_clear();
    td_workflow_free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    td_workflow_file *wf = NULL;
    if (td_workflow_file_parse((const char *)data, size, "fuzz.yaml", &wf) == TD_OK) {
        for (size_t i = 0; i < wf->count; i++) use(&wf->items[i], wf);
        td_workflow_file_free(wf);
    } else {
        FUZZ_ASSERT(wf == NULL && !strncmp(td_error_msg(), "fuzz.yaml:", 10),
                    "error without file:line: %s", td_error_msg());
    }
    td_error_clear();

    char *text = malloc(size + 1);
    FUZZ_ASSERT(text, "%s", "malloc");
    memcpy(text, data, size);
    text[size] = '\0';
    double seconds;
    if (td_parse_duration("max_duration", text, &seconds) == TD_OK)
        FUZZ_ASSERT(seconds > 0, "duration '%s' gave %g s", text, seconds);
    td_error_clear();
    free(text);
    return 0;
}
