/* Internals of a run that lives in the cloud (controller.c, remote_store.c): its store in S3,
 * pushed by the controller's supervisor and pulled by the submitter. */
#ifndef TANDEM_EXEC_CONTROLLER_H
#define TANDEM_EXEC_CONTROLLER_H

#include "exec/internal.h"
#include "tandem/cloud.h"

/* A file as the controller last sent it. */
typedef struct {
    char *rel;
    int64_t size, mtime_ns;
} td__pushed;

/* The controller's push: files sent once, again only when their size or time changed. */
typedef struct {
    td_aws_t *aws;
    const char *bucket, *prefix; /* the store: s3://bucket/prefix */
    const char *staging;         /* a private directory for the copies aside */
    td__pushed *files;
    size_t n, cap;
    size_t nsent; /* files sent by the last pass */
} td__push;

/* One pass: every changed file of the run directory that the submitter's verbs read (the
 * record, logs, metrics, artifacts, end records, instances, sdk.json) to prefix/run/REL, whole,
 * run.json last. The first failure is returned; the files sent before it count. */
td_status td__remote_push(td__push *p, const char *run_dir);
void td__remote_push_free(td__push *p);

/* The submitter's pull: every object of prefix/run/ whose ETag changed since the last pull (kept
 * in RUN/.remote-etags) into the run directory, run.json last; keys that are not a run file's
 * path are left out with a warning. *npulled: objects downloaded. */
td_status td__remote_pull(td_aws_t *aws, const char *bucket, const char *prefix,
                          const char *run_dir, size_t *npulled);

#endif
