/* tandem env: the environment knobs a user may set, then the contract between the launcher (and
 * the `tandem run` supervisor) and its workers: what each worker finds in its environment, and
 * which Python a script runs under and where the Python SDK is. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/core.h"
#include "tandem/launch.h"

/* The source tree's python/ (holding tandem/__init__.py) above this binary (build/tandem,
 * build/tools/tandem/tandem...): the SDK of this tandem. NULL when not found (caller frees). */
static char *sdk_source_dir(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    for (int up = 0; up < 5; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash || slash == exe) break;
        *slash = '\0';
        char *init = td_xasprintf("%s/python/tandem/__init__.py", exe);
        struct stat sb;
        int found = stat(init, &sb) == 0 && S_ISREG(sb.st_mode);
        free(init);
        if (found) return td_xasprintf("%s/python", exe);
    }
    return NULL;
}

/* Where `python -c 'import tandem'` finds the SDK in this environment (the first line it
 * prints), or NULL when it does not (caller frees). */
static char *sdk_imported_from(const char *python) {
    char *cmd = td_xasprintf("'%s' -c 'import os, tandem; print(os.path.dirname(os.path.dirname("
                             "os.path.abspath(tandem.__file__))))' 2>/dev/null </dev/null",
                             python);
    FILE *f = strchr(python, '\'') ? NULL : popen(cmd, "r");
    free(cmd);
    if (!f) return NULL;
    char line[PATH_MAX + 2] = "";
    char *got = fgets(line, sizeof line, f) ? line : NULL;
    int rc = pclose(f);
    if (!got || rc != 0) return NULL;
    line[strcspn(line, "\n")] = '\0';
    return *line ? td_xstrdup(line) : NULL;
}

static void print_python(void) {
    printf("\nPython (scripts and the tandem Python SDK):\n");
    char *python = NULL;
    const char *source = NULL;
    td_status st = td_launch_find_python(&python, &source);
    if (st == TD_OK)
        printf("%-28s %s (from %s)\n", "tandem launch SCRIPT.py", python, source);
    else
        printf("%-28s none: %s\n", "tandem launch SCRIPT.py", td_error_msg());
    td_error_clear();
    printf("%-28s %s\n", "",
           "the first of TANDEM_PYTHON, PYTHON_EXEC, PYTHON, $VIRTUAL_ENV/bin/python3, python3 "
           "on PATH");
    /* tandem run hands its command to /bin/sh (under tandem launch): a `python3` in it is the
     * one PATH finds, whatever PYTHON says. */
    char *path_python = NULL;
    const char *path_source = NULL;
    const char *saved[4];
    static const char *const vars[4] = {"TANDEM_PYTHON", "PYTHON_EXEC", "PYTHON", "VIRTUAL_ENV"};
    for (int i = 0; i < 4; i++) {
        const char *v = getenv(vars[i]);
        saved[i] = v ? td_xstrdup(v) : NULL;
        unsetenv(vars[i]);
    }
    if (td_launch_find_python(&path_python, &path_source) != TD_OK) td_error_clear();
    for (int i = 0; i < 4; i++)
        if (saved[i]) {
            setenv(vars[i], saved[i], 1);
            free((char *)saved[i]);
        }
    printf("%-28s %s\n", "tandem run (python3 in CMD)", path_python ? path_python : "none on PATH");
    printf("%-28s %s\n", "",
           "the command runs through /bin/sh: python3 is PATH's (a virtual "
           "environment's when it is active)");
    char *src = sdk_source_dir();
    printf("%-28s %s\n", "Python SDK (source tree)", src ? src : "not found beside this binary");
    const char *pp = getenv("PYTHONPATH");
    printf("%-28s %s\n", "PYTHONPATH", pp && *pp ? pp : "(unset)");
    printf("%-28s %s\n", "",
           "tandem launch and tandem run pass PYTHONPATH through as it is and add nothing: "
           "set it (or a workflow's env:) to the SDK's directory, or pip install it");
    const char *probe = python ? python : path_python;
    char *from = probe ? sdk_imported_from(probe) : NULL;
    if (from)
        printf("%-28s yes, from %s (%s)\n", "import tandem", from, probe);
    else if (probe)
        printf("%-28s no, not with %s and this PYTHONPATH%s%s\n", "import tandem", probe,
               src ? "; PYTHONPATH=" : "", src ? src : "");
    free(from);
    free(src);
    free(python);
    free(path_python);
}

static const cli_opt opts[] = {{0}};

static const cli_command verb = {
    .name = "tandem env",
    .usage = "",
    .about = "Prints the TANDEM_* knobs with their values, then the variables a worker finds in\n"
             "its environment under `tandem launch` and `tandem run`, then which Python runs a\n"
             "script and where the tandem Python SDK is (and whether `import tandem` finds it).\n",
    .opts = opts,
};

int cmd_env(int argc, char **argv) {
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        return cli_error(&verb, "unexpected argument '%s'", p.value);
    }
    printf("Knobs (set them to change tandem's behaviour):\n");
    td_env_print(stdout);
    printf("\nWhat a worker finds in its environment (set by `tandem launch` / `tandem run`):\n");
    printf("%-28s %-12s %s\n", "VARIABLE", "SET BY", "MEANING");
    td_var_print(stdout);
    print_python();
    return 0;
}
