/* The one argument parser of the tandem commands. Each command declares its options in a table
 * (long name, short name, value name, help) and reads them back one at a time:
 *
 *     cli_parser p;
 *     cli_init(&p, &cmd, argc, argv);
 *     for (int c; (c = cli_next(&p)) != CLI_END;)
 *         switch (c) {
 *         case OPT_FILE: file = p.value; break;
 *         case CLI_ARG: name = p.value; break;        (a positional argument)
 *         case CLI_EXIT: return p.exit_code;          (--help printed: 0; an error printed: 2)
 *         }
 *
 * Spellings: --opt VALUE, --opt=VALUE, -x VALUE, -xVALUE; "--" ends the options; -h and --help
 * print the help generated from the table. Errors name the option and point to
 * 'tandem CMD --help': an unknown option, a missing value, a value given to a flag. An option
 * given twice takes its later value (getopt's and argparse's rule), unless it is CLI_REPEAT:
 * then each value comes back in turn. */
#ifndef TANDEM_CLI_ARGS_H
#define TANDEM_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/core.h"

/* cli_opt.flags */
enum {
    CLI_REPEAT = 1, /* may be given more than once; cli_next returns each value */
};

typedef struct cli_opt {
    int id;            /* what cli_next returns for it: > 0 */
    const char *name;  /* long name without "--"; NULL: none */
    char short_name;   /* 0: none */
    const char *value; /* NULL: a flag; else it takes a value, named so in the help ("DIR") */
    const char *help;  /* its lines in the help ('\n' between them); NULL: not listed */
    unsigned flags;
} cli_opt;

/* cli_command.flags */
enum {
    /* '_' in a long option stands for '-' (torchrun's --nproc_per_node). */
    CLI_UNDERSCORES = 1,
    /* The first positional argument ends the options, and it and what follows are left for
     * the command (tandem launch: the worker command). cli_next returns CLI_END there with
     * p->next on it; "--" too, with p->next after it. */
    CLI_STOP_AT_ARG = 2,
};

typedef struct cli_command {
    const char *name;    /* "tandem run" */
    const char *usage;   /* what follows the name on the usage line; further usage lines after
                          * a '\n', each of them also following the name */
    const char *about;   /* the paragraph after the usage lines (ends with '\n'); NULL: none */
    const cli_opt *opts; /* ends with an entry whose id is 0 */
    const char *epilog;  /* the paragraph after the options (ends with '\n'); NULL: none */
    unsigned flags;
} cli_command;

enum {
    CLI_END = 0,   /* no more options (nor arguments, unless CLI_STOP_AT_ARG) */
    CLI_ARG = -1,  /* a positional argument: p->value */
    CLI_EXIT = -2, /* the help was printed (p->exit_code 0) or an error (2): return it */
};

typedef struct cli_parser {
    const cli_command *cmd;
    int argc;
    char **argv;
    int next;          /* the index of the next argument to read */
    const char *value; /* the option's value (NULL for a flag) or the positional argument */
    const char *given; /* the option as written ("--file", "-f", "--nproc_per_node") */
    char given_buf[128];
    int exit_code;    /* with CLI_EXIT */
    int options_done; /* after "--": everything is positional */
} cli_parser;

void cli_init(cli_parser *p, const cli_command *cmd, int argc, char **argv);
/* The id of the next option with p->value and p->given, CLI_ARG, CLI_END or CLI_EXIT. */
int cli_next(cli_parser *p);
/* Prints "<name>: <message>" and the hint "(see '<name> --help')" to stderr; returns 2, the
 * usage exit code. For the commands' own checks of values, so that every usage error looks
 * alike. */
int cli_error(const cli_command *cmd, const char *fmt, ...) TD_PRINTF(2, 3);
/* The help generated from the table: usage lines, about, the options, epilog. */
void cli_help(const cli_command *cmd, FILE *out);
/* The usage lines alone ("usage: tandem run ..."). */
void cli_usage(const cli_command *cmd, FILE *out);

#endif
