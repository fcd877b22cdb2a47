/* What the run verbs (show, logs, metrics, artifacts, stop, ps) share: the RUN argument, usage
 * errors, and opening the run store with a run resolved from an id or a unique prefix. Each
 * helper prints its own error and hands back the exit code (commands.h) for the verb to return. */
#ifndef TANDEM_RUN_CLI_H
#define TANDEM_RUN_CLI_H

#include "args.h"
#include "tandem/track.h"

/* A verb's options and help are a cli_command (args.h): name "tandem logs", usage
 * "RUN [-f] [--rank R]". */

/* A positional argument the verb read (CLI_ARG): the first becomes *id and returns -1 (go on);
 * a second is a usage error (2). */
int run_cli_id(const cli_command *verb, const char *arg, const char **id);

/* The arguments of a verb that takes one optional flag (its option id flag_opt, 0: none) and
 * any number of operands (tandem rm RUN..., tandem archive [--undo] RUN..., tandem import
 * [--force] DIR...): *ops (the caller frees it) gets the operands in order, *nops their count,
 * *flag 1 when the flag was given. Returns -1 to go on, else the exit code (--help, a bad
 * option). No operand is not checked here: the verb says what is missing. */
int run_cli_operands(const cli_command *verb, int argc, char **argv, int flag_opt, int *flag,
                     const char ***ops, size_t *nops);

/* Prints the usage line to stderr; returns 2. */
int run_cli_usage_error(const cli_command *verb);

/* The value of --rank R (an integer >= 0) into *rank: -1 (go on), or 2 after saying what is
 * wrong. */
int run_cli_rank(const cli_command *verb, const char *value, int *rank);

/* Opens the project's run store: 0, or 1 after printing why not. */
int run_cli_open_store(td_rundb **store);

/* Opens the store and finds the run id names (an id or a unique prefix of one): 0 with *store and
 * *run set (release them with run_cli_close), 1 when the store cannot be opened, 2 when id is NULL
 * (no RUN was given: the usage line) or no single run matches; the error is printed. */
int run_cli_open_run(const cli_command *verb, const char *id, td_rundb **store, td_run *run);

/* A run that lives in the cloud (tandem run -d of an aws run): its store pulled from S3 and its
 * row brought up to it (td_exec_remote_refresh); a store that cannot be read is a warning, and
 * what was pulled before is shown. Nothing for another run. run_cli_open_run does it. */
void run_cli_attach(td_rundb *store, td_run *run);

/* Clears run (may be NULL) and closes store. */
void run_cli_close(td_rundb *store, td_run *run);

/* s with every byte a terminal acts on (C0 and C1 controls, DEL) written as \xNN, other UTF-8
 * kept: for printing anyone's text (metric keys, notes, commands, paths) to a terminal. The
 * result lives until 16 more calls. */
const char *run_cli_text(const char *s);

/* The shortest decimal text that reads back as the same double, as Python's repr: "%.17g"'s
 * digits cut to the fewest that round-trip ("0.2" for --param lr=0.2, not
 * "0.20000000000000001"), and an integral value keeps ".0" so it still reads as a float. Written
 * into buf (32 bytes are enough); returns buf. */
const char *run_cli_double(double v, char *buf, size_t nbytes);

/* A JSON value (params, config, a summary value) as compact JSON text for a person: numbers as
 * run_cli_double writes them (jansson writes %.17g), object keys in their order, or sorted with
 * sort_keys. Caller frees. */
struct json_t;
char *run_cli_json(const struct json_t *value, int sort_keys);

/* The same for JSON text (the store's params_json); text that is not JSON comes back as it
 * is. Caller frees. */
char *run_cli_json_text(const char *json);

/* td_error_print for the run verbs: the error's text (which may quote run ids, notes, paths and
 * file names from the store) with its control bytes escaped as run_cli_text does. */
void run_cli_error(td_status st);

#endif
