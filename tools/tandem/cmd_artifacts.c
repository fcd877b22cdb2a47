/* tandem artifacts: list a run's artifacts, or copy them out with their sha256 checked. Names are
 * whatever files the run made: they reach the terminal escaped (run_cli_text), as do paths and
 * errors quoting them. */
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "tandem/exec.h"
#include "tandem/os.h"
#include "run_cli.h"

enum { OPT_DOWNLOAD = 1, OPT_FROM_S3 };

static const cli_opt opts[] = {
    {OPT_DOWNLOAD, "download", 0, "DIR", "copy them into DIR/<name>, each checked", 0},
    {OPT_FROM_S3, "from-s3", 0, NULL,
     "with --download: take them from their S3 copy (artifacts: {to: s3://...})\n"
     "even where the run's own copy is there",
     0},
    {0},
};

static const cli_command verb = {
    .name = "tandem artifacts",
    .usage = "RUN [--download DIR [--from-s3]]",
    .about = "Lists the run's artifacts (name, size, sha256); --download copies them into\n"
             "DIR/<name> and checks each copy's sha256 against the record. RUN is a run id or\n"
             "a unique prefix of one. An artifact whose copy in the run directory is gone comes\n"
             "from its S3 copy when the workflow uploaded them (artifacts: {to: s3://...}).\n",
    .opts = opts,
};

int cmd_artifacts(int argc, char **argv) {
    const char *id = NULL, *dest = NULL;
    int rc, from_s3 = 0;
    cli_parser p;
    cli_init(&p, &verb, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        if (c == CLI_EXIT) return p.exit_code;
        if (c == OPT_DOWNLOAD)
            dest = p.value;
        else if (c == OPT_FROM_S3)
            from_s3 = 1;
        else if ((rc = run_cli_id(&verb, p.value, &id)) >= 0)
            return rc;
    }
    td_rundb *store;
    td_run r;
    if ((rc = run_cli_open_run(&verb, id, &store, &r))) return rc;
    td_artifact *arts = NULL;
    size_t n = 0;
    td_status st = td_artifacts_list(store, r.id, &arts, &n);
    if (st != TD_OK) {
        run_cli_error(st);
        rc = 1;
    } else if (!dest) {
        printf("%-40s %12s  %s\n", "NAME", "BYTES", "SHA256");
        for (size_t i = 0; i < n; i++)
            printf("%-40s %12lld  %s\n", run_cli_text(arts[i].name), (long long)arts[i].size_bytes,
                   run_cli_text(arts[i].sha256));
        if (!n) printf("(run %s has no artifacts)\n", run_cli_text(r.id));
    } else {
        for (size_t i = 0; i < n && rc == 0; i++) {
            char *to = td_xasprintf("%s/%s", dest, arts[i].name);
            char *dir = td_xstrdup(to);
            char sha[65];
            /* the S3 copy (artifacts-s3.json) when asked, or when the run's own is gone */
            int s3 = from_s3 || access(arts[i].path, F_OK) != 0;
            if ((st = td_mkdirs(dirname(dir))) != TD_OK ||
                (st = s3 ? td_artifacts_s3_download(&r, arts[i].name, to)
                         : td_copy_file(arts[i].path, to, "artifact")) != TD_OK) {
                run_cli_error(st);
                rc = 1;
            } else if ((st = td_sha256_file(to, sha)) != TD_OK) {
                run_cli_error(st);
                rc = 1;
            } else if (strcmp(sha, arts[i].sha256)) {
                fprintf(stderr,
                        "tandem artifacts: %s: sha256 %s does not match the recorded %s; the "
                        "stored copy %s was changed or damaged\n",
                        run_cli_text(to), sha, run_cli_text(arts[i].sha256),
                        run_cli_text(arts[i].path));
                rc = 1;
            } else {
                printf("%s  %s (sha256 ok%s)\n", sha, run_cli_text(to), s3 ? ", from S3" : "");
            }
            free(to);
            free(dir);
        }
    }
    td_artifacts_free(arts, n);
    run_cli_close(store, &r);
    return rc;
}
