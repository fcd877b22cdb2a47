/* tandem: the one CLI binary. Each subcommand lives in its own cmd_*.c and is listed once in
 * commands.h; main() only dispatches and turns a status into an exit code. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "isa.h"
#include "tandem/core.h"
#include "tandem/tensor.h"

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
#define TD__CMD_ROW(name, fn, summary) {name, fn, summary},
    TD_COMMANDS(TD__CMD_ROW)
#undef TD__CMD_ROW
};

static void usage(FILE *out) {
    fprintf(out, "usage: tandem <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < TD_ARRAY_LEN(commands); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'tandem <command> --help' shows a command's options.\n");
}

int main(int argc, char **argv) {
    td_cli_pick_kernels(argv); /* may exec the build of these sources for this CPU (isa.c) */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        /* the kernels: the hash of the sources that decide a step's bits (tensor.h, numerics) */
        td_numerics n;
        td_numerics_get(&n);
        printf("tandem %s (kernels %s)\n", TANDEM_VERSION_STRING, n.kernels);
        /* which build runs (TANDEM_ISA, isa.c) and what else decides the bits */
        printf("kernels for %s, OpenBLAS core %s, %s\n", n.isa, n.blas_core, n.compiler);
        if (td_cli_blas_fallback())
            printf("OpenBLAS picked %s, its SSE3 fallback, for this CPU it does not know: tandem "
                   "runs it under OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose)\n",
                   td_cli_blas_fallback(), n.blas_core);
        return 0;
    }
    for (size_t i = 0; i < TD_ARRAY_LEN(commands); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
