/* Internals of a run that lives in the cloud (controller.c, remote_store.c): its store in S3,
 * pushed by the controller's supervisor and pulled by the submitter. */
#ifndef TANDEM_EXEC_CONTROLLER_H
#define TANDEM_EXEC_CONTROLLER_H

#include "exec/internal.h"
#include "tandem/cloud.h"

/* The controller's word in its store (STORE/controller.json), written each time it feeds its
 * dead-man's switch and once at its end: {"format": 1, "run", "instance" (its id), "heard_s"
 * (when it spoke), "promise_s" (until when its switch waits: heard_s + orphan_timeout; in the
 * past at its end), "orphan_timeout_s", "ended"}. tandem gc reads it (aws_gc.c). */
#define TD_CONTROLLER_WORD "controller.json"

/* A file as the controller last sent it. */
typedef struct {
    char *rel;
    int64_t size, mtime_ns;
    double sent_s; /* the push's clock when it was last sent */
} td__pushed;

/* The controller's push: files sent once, again only when their size or time changed, and a
 * changed file no sooner than td__push_due allows. */
typedef struct {
    td_aws_t *aws;
    const char *bucket, *prefix; /* the store: s3://bucket/prefix */
    const char *staging;         /* a private directory for the copies aside */
    /* bytes per second that one file may cost while the run goes (0: TD__PUSH_BYTES_PER_S;
     * < 0: no bound, every change sent at the next pass, as before the bound) */
    double bytes_per_s;
    /* sends a copy (NULL: td_s3_put_file to bucket/key): a test counts bytes with it */
    td_status (*put)(void *user, const char *key, const char *path, int64_t nbytes);
    void *put_user;
    td__pushed *files;
    size_t n, cap;
    size_t nsent;       /* files sent by the last pass */
    size_t ndeferred;   /* changed files the last pass left for later (td__push_due) */
    int64_t nbytes_sent; /* bytes sent by every pass so far */
} td__push;

/* Every changed file would otherwise go whole at each 2 s pass: a long run's metrics file of 20
 * MiB would be sent 30 times a minute (600 MiB/min of a t3.micro's network, its copy and its
 * checksums). So a file that changed is sent again only once bytes_per_s x (now - its last
 * send) covers its size: a file under 2 s x the rate goes every pass as before, a 20 MiB one
 * (at the default 256 KiB/s) every 80 s; what one file costs stays under bytes_per_s on
 * average, however large it grows, and the submitter sees it at most size / rate old. The end
 * push (final) sends every change at once, so the store's end is complete. S3 has no append (a
 * multipart UploadPartCopy needs parts of 5 MiB), hence the bound rather than pieces. */
#define TD__PUSH_BYTES_PER_S (256.0 * 1024)
bool td__push_due(const td__pushed *f, int64_t size, double now_s, double bytes_per_s,
                  bool final);

/* One pass at now_s (the push's clock; td_now_s in the controller): every changed file of the
 * run directory that the submitter's verbs read (the record, logs, metrics, artifacts, end
 * records, instances, sdk.json) that td__push_due allows to prefix/run/REL, whole, run.json
 * last. final: the end's pass, every change sent; any other pass holds back a record that says
 * the run has ended (counted as deferred), so the end reaches the store only with what the end
 * adds. The first failure is returned; the files sent before it count. */
td_status td__remote_push(td__push *p, const char *run_dir, double now_s, bool final);
void td__remote_push_free(td__push *p);

/* The submitter's pull: every object of prefix/run/ whose ETag changed since the last pull (kept
 * in RUN/.remote-etags) into the run directory, run.json last; keys that are not a run file's
 * path are left out with a warning. *npulled: objects downloaded. */
td_status td__remote_pull(td_aws_t *aws, const char *bucket, const char *prefix,
                          const char *run_dir, size_t *npulled);

#endif
