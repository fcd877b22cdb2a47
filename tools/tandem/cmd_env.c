/* tandem env: the environment knobs a user may set, then the contract between the launcher (and
 * the `tandem run` supervisor) and its workers: what each worker finds in its environment. */
#include "commands.h"
#include "tandem/core.h"

int cmd_env(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("Knobs (set them to change tandem's behaviour):\n");
    td_env_print(stdout);
    printf("\nWhat a worker finds in its environment (set by `tandem launch` / `tandem run`):\n");
    printf("%-28s %-12s %s\n", "VARIABLE", "SET BY", "MEANING");
    td_var_print(stdout);
    return 0;
}
