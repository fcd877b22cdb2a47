/* tandem gc: terminate the cloud instances nobody will terminate: those tagged with one of this
 * project's runs whose supervisor is gone (killed, its machine rebooted). The work is in the
 * exec layer (td_gc_instances, src/exec/aws_gc.c); this is its command line. */
#include <stdio.h>

#include "commands.h"
#include "run_cli.h"
#include "tandem/exec.h"

enum { OPT_DRY_RUN = 1, OPT_ALL, OPT_REGION };

static const cli_opt opts[] = {
    {OPT_DRY_RUN, "dry-run", 'n', NULL, "say what would be terminated; terminate nothing", 0},
    {OPT_ALL, "all", 0, NULL,
     "also terminate the instances of other projects' runs and of runs\n"
     "this store does not know (except runs known to be live here)",
     0},
    {OPT_REGION, "region", 0, "R",
     "the region to sweep (default: AWS_REGION, AWS_DEFAULT_REGION\n"
     "or the profile's region)",
     0},
    {0},
};

static const cli_command verb = {
    .name = "tandem gc",
    .usage = "[--dry-run] [--all] [--region R]",
    .about = "Finds every EC2 instance tagged tandem:run (pending, running, stopping or\n"
             "stopped) and terminates those of this project's runs whose supervisor is gone,\n"
             "recording each end in the run's instances.json. A live run's instances are\n"
             "left; other projects' and unknown runs' are listed and left (see --all).\n",
    .opts = opts,
    .epilog = "Exit: 0 when nothing failed, 1 when an instance could not be terminated or AWS\n"
              "could not be asked (credentials, region), 2 usage.\n",
};

int cmd_gc(int argc, char **argv) {
    td_gc_opts o = {.out = stdout};
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        switch (c) {
        case CLI_EXIT:
            return p.exit_code;
        case OPT_DRY_RUN:
            o.dry_run = 1;
            break;
        case OPT_ALL:
            o.all = 1;
            break;
        case OPT_REGION:
            o.region = p.value;
            break;
        default:
            return cli_error(&verb, "unexpected argument '%s'", p.value);
        }
    }
    td_rundb *store;
    if (run_cli_open_store(&store)) return 1;
    td_status st = td_gc_instances(store, &o, NULL);
    if (st != TD_OK) run_cli_error(st);
    run_cli_close(store, NULL);
    return st == TD_OK ? 0 : 1;
}
