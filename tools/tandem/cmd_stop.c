/* tandem stop: ask a run's supervisor to stop it (the workers checkpoint on SIGTERM). */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tandem/workflow.h"

int cmd_stop(int argc, char **argv) {
    const char *id = NULL;
    double wait_s = 60;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tandem stop RUN [--wait SECONDS]\n\n"
                   "Sends SIGTERM to the run's supervisor, which forwards it to the workers\n"
                   "(they checkpoint and exit), and waits for the run to end (default 60 s).\n");
            return 0;
        } else if (!strcmp(argv[i], "--wait") && i + 1 < argc) {
            if (td_parse_f64("--wait", argv[++i], &wait_s) != TD_OK || wait_s < 0) {
                fprintf(stderr, "tandem stop: --wait expects seconds >= 0\n");
                return 2;
            }
        } else if (argv[i][0] != '-' && !id) {
            id = argv[i];
        } else {
            fprintf(stderr, "usage: tandem stop RUN [--wait SECONDS]\n");
            return 2;
        }
    }
    if (!id) {
        fprintf(stderr, "usage: tandem stop RUN [--wait SECONDS]\n");
        return 2;
    }
    td_rundb *store;
    td_status st = td_rundb_open(NULL, &store);
    td_run r = {0};
    if (st == TD_OK) st = td_run_stop(store, id, wait_s, &r);
    int rc = 0;
    if (st != TD_OK) {
        td_error_print(st);
        rc = st == TD_ERR_NOTFOUND || st == TD_ERR_INVALID ? 2 : 1;
    } else if (td_run_status_is_final(r.status)) {
        printf("run %s %s (exit code %d)\n", r.id, td_run_status_str(r.status), r.exit_code);
    } else {
        printf("run %s: stop requested; still %s after %.0f s (its supervisor escalates to "
               "SIGKILL after the grace period)\n",
               r.id, td_run_status_str(r.status), wait_s);
        rc = 1;
    }
    td_run_clear(&r);
    td_rundb_close(store);
    return rc;
}
