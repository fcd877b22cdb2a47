/* tandem env: the environment knobs a user may set, then the contract between the launcher (and
 * the `tandem run` supervisor) and its workers: what each worker finds in its environment. */
#include "args.h"
#include "commands.h"
#include "tandem/core.h"

static const cli_opt opts[] = {{0}};

static const cli_command verb = {
    .name = "tandem env",
    .usage = "",
    .about = "Prints the TANDEM_* knobs with their values, then the variables a worker finds in\n"
             "its environment under `tandem launch` and `tandem run`.\n",
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
    return 0;
}
