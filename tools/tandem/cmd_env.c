/* tandem env: the environment knobs, their values and meanings. */
#include "commands.h"
#include "tandem/core.h"

int cmd_env(int argc, char **argv) {
    (void)argc;
    (void)argv;
    td_env_print(stdout);
    return 0;
}
