/* tandem mirror: append-only files (rank logs, metric streams) copied over one byte stream, each
 * byte exactly once, however often the stream breaks and starts again.
 *
 * A node agent without a file system shared with the submitting machine writes its workers'
 * logs and metrics to local directories, as it always does; a td_mirror_out sends what those
 * files gain over its link to the supervisor (tandem launch --forward-stdio: its stdout, carried
 * by ssh), and the supervisor's td_mirror_in appends it to the run directory's copies. A copy is
 * only ever appended to at its own end: a frame is (name, offset, bytes), and the receiver
 * writes only the part beyond what it has. When a link starts, the receiver first tells the
 * sender how much of each file it holds (the manifest, "have NAME SIZE" lines), so a restarted
 * agent sends the tails the last connection did not deliver and nothing twice. The files on the
 * agent's disk are the spool: nothing is lost while they exist.
 *
 * The stream, sender to receiver (text headers, raw payload):
 *   tdm data NAME OFFSET LENGTH\n<LENGTH bytes>   NAME is PREFIX/FILE, FILE of [A-Za-z0-9._-]
 *   tdm note KEY VALUE\n                          a fact for the supervisor ("store_port 41234")
 *   tdm end\n                                     everything was sent; the sender is done
 * The receiver accepts only names under the prefixes it was given, never a '/', ".." or a
 * leading '.', so a remote host cannot write anywhere else. docs/executors.md has the rest. */
#ifndef TANDEM_MIRROR_H
#define TANDEM_MIRROR_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Payload bytes per frame at most; a file that grew by more is sent in several. */
#define TD_MIRROR_CHUNK (256 * 1024)
/* Files a mirror tracks at most (ranks x 2 streams): more is an error, not unbounded memory. */
#define TD_MIRROR_MAX_FILES 4096

/* ---- sender ---- */
typedef struct td_mirror_out td_mirror_out;

/* Frames go to fd (blocking writes: call it from a thread that may wait on a slow link). */
td_mirror_out *td_mirror_out_new(int fd);
void td_mirror_out_free(td_mirror_out *m);
/* Sends the regular files directly in dir as "prefix/FILE" (dir need not exist yet). */
void td_mirror_out_watch(td_mirror_out *m, const char *prefix, const char *dir);
/* One manifest line from the receiver, "have NAME SIZE": sending NAME starts at SIZE.
 * TD_ERR_FORMAT naming the line when it is not one. */
td_status td_mirror_out_have(td_mirror_out *m, const char *line);
/* Sends what every watched file gained since the last call. TD_ERR_IO when the stream is gone
 * (EPIPE: the link broke) or a file cannot be read; *sent (may be NULL) gets the payload bytes. */
td_status td_mirror_out_poll(td_mirror_out *m, int64_t *sent);
td_status td_mirror_out_note(td_mirror_out *m, const char *key, const char *value);
/* A last poll, then "tdm end". */
td_status td_mirror_out_end(td_mirror_out *m);

/* ---- receiver ---- */
typedef struct td_mirror_in td_mirror_in;
typedef struct {
    void (*note)(void *user, const char *key, const char *value);
    /* Bytes newly appended to a copy (for echoing logs to a terminal); duplicates are not. */
    void (*data)(void *user, const char *name, const char *bytes, size_t n);
    void *user;
} td_mirror_callbacks;

/* Copies live under root: a frame for "logs/rank-0.log" appends to root/logs/rank-0.log.
 * prefixes: the first components accepted ("logs", "metrics"); directories made on demand. */
td_mirror_in *td_mirror_in_new(const char *root, const char *const *prefixes, size_t nprefixes,
                               const td_mirror_callbacks *cb);
void td_mirror_in_free(td_mirror_in *m);
/* What the copies hold now, as "have NAME SIZE\n" lines (every regular file under the prefixes'
 * directories), for a sender that is about to start. Caller frees. */
char *td_mirror_in_manifest(td_mirror_in *m);
/* Bytes read from the stream, in any pieces. TD_ERR_FORMAT naming what was wrong for a
 * malformed frame or a name outside the prefixes (stop reading that stream: it cannot be
 * trusted); TD_ERR_IO when a copy cannot be written. */
td_status td_mirror_in_feed(td_mirror_in *m, const void *buf, size_t n);
/* The sender said "tdm end" (everything arrived). */
int td_mirror_in_ended(const td_mirror_in *m);
/* Payload bytes appended to the copies, and bytes dropped because a copy already had them. */
void td_mirror_in_counts(const td_mirror_in *m, int64_t *appended, int64_t *duplicate);
/* A new link begins (the sender restarted): a half-read frame of the old one is dropped. */
void td_mirror_in_reset(td_mirror_in *m);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_MIRROR_H */
