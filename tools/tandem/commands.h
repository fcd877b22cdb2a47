/* The subcommand table. Add a row here and a cmd_<name>.c defining the function; each function
 * receives argv starting at the subcommand name and returns the process exit code:
 * 0 success, 1 failure of the job, 2 usage error, 143 stopped by SIGTERM after a checkpoint. */
#ifndef TANDEM_COMMANDS_H
#define TANDEM_COMMANDS_H

#define TANDEM_VERSION_STRING "0.1.0"

#define TD_COMMANDS(X)                                                                          \
    X("env", cmd_env, "print the TANDEM_* environment knobs and their values")

int cmd_env(int argc, char **argv);

#endif
