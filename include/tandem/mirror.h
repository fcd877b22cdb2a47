/* tandem mirror: append-only files (rank logs, metric streams) copied over one byte stream, each
 * byte exactly once, however often the stream breaks and starts again.
 *
 * A node agent without a file system shared with the submitting machine writes its workers'
 * logs and metrics to local directories, as it always does; a td_mirror_out sends what those
 * files gain over its link to the supervisor (tandem launch --forward-stdio: its stdout, carried
 * by ssh; or a TCP connection the agent makes back to `tandem run`, authenticated first with
 * td_mirror_auth_*), and the supervisor's td_mirror_in appends it to the run directory's copies.
 * A copy is only ever appended to at its own end: a frame is (name, offset, bytes), and the
 * receiver writes only the part beyond what it has. When a link starts, the receiver first tells
 * the sender how much of each file it holds (the manifest, "have NAME SIZE" lines), so a
 * restarted agent sends the tails the last connection did not deliver and nothing twice. The
 * files on the agent's disk are the spool: nothing is lost while they exist.
 *
 * A spool can also be new: a requeued Slurm job may put node N on another machine, or a node's
 * directory may have been cleaned. Its local file is then shorter than the receiver's copy (or
 * absent) when the manifest arrives, so it is not the file the copy came from; its bytes
 * continue the copy instead: local byte K goes out at offset SIZE + K (SIZE from the "have"
 * line, the file's base). A local file at least SIZE long is the copy's source, sent from SIZE
 * on. The base outlives td_mirror_out_reset, so the next connection of the same agent resumes
 * the continuation rather than appending it twice.
 *
 * The stream, sender to receiver (text headers, raw payload):
 *   tdm data NAME OFFSET LENGTH\n<LENGTH bytes>   NAME is PREFIX/FILE, FILE of [A-Za-z0-9._-]
 *   tdm file NAME SIZE\n<SIZE bytes>              a whole file (an artifact), replacing the copy
 *   tdm note KEY VALUE\n                          a fact for the supervisor ("store_port 41234")
 *   tdm end\n                                     everything was sent; the sender is done
 * The receiver accepts only names under the prefixes it was given, never a '/', ".." or a
 * leading '.', so a remote host cannot write anywhere else. A file frame's NAME may go deeper,
 * PREFIX/DIR/.../FILE, each component of [A-Za-z0-9._+=-] and none starting with '.'; its
 * directories are made and entered one at a time without following a link, so a symlink under
 * the receiver's root cannot send the write elsewhere, and the file appears whole (written
 * beside it, then renamed) or not at all. docs/executors.md has the rest. */
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

/* ---- authentication: both ends prove they know the run's token, which never travels ----
 * A TCP link is reachable by anyone on the network, and what arrives is written into the run
 * directory, so the supervisor accepts only agents that know the run's token (TANDEM_TOKEN),
 * and an agent sends its logs only to a supervisor that knows it too. Challenge-response with
 * HMAC-SHA256 over fresh 32-byte nonces from both sides (a recorded exchange replays nowhere),
 * one text line each way, in lowercase hex (the MACs cover the raw nonce bytes):
 *   supervisor: tandem-link 1 NONCE_S\n
 *   agent:      NONCE_C MAC_C\n     MAC_C = HMAC(token, "tandem-link-agent" NONCE_S NONCE_C)
 *   supervisor: ok MAC_S\n          MAC_S = HMAC(token, "tandem-link-supervisor" NONCE_C NONCE_S)
 *               or denied\n when MAC_C is wrong
 * Lines are read a byte at a time, so nothing after the last newline is taken from fd: the
 * caller's protocol starts right there. The whole exchange must finish within timeout_ms.
 * TD_ERR_AUTH when the tokens differ (the supervisor cannot tell whose is wrong: it refuses,
 * the agent hears so) or the supervisor's proof is wrong; TD_ERR_TIMEOUT naming the line
 * waited for; TD_ERR_PROTOCOL quoting a line that is not the protocol (a stranger on the port);
 * TD_ERR_IO when the connection closes or fails; TD_ERR_INVALID for an empty token. */
/* The supervisor's side, on a connection it accepted. */
td_status td_mirror_auth_accept(int fd, const char *token, int timeout_ms);
/* The agent's side, on a connection it made. */
td_status td_mirror_auth_connect(int fd, const char *token, int timeout_ms);
/* The same exchange in steps, for a supervisor that runs many handshakes on its event loop
 * (loop.h) instead of a thread each. td_mirror_auth_begin starts one side on fd (a socket; a
 * pipe works, a byte per step); td_mirror_auth_step does what fd allows without blocking and
 * says in *wants what to wait for next: TD_LOOP_READ or TD_LOOP_WRITE, or 0 when the
 * handshake is done (TD_OK: the peer knows the token). The deadline is the caller's (a timer);
 * td_mirror_auth_waiting_for names the line in question, for its message. Errors are the
 * blocking calls' (TD_ERR_AUTH, TD_ERR_PROTOCOL, TD_ERR_IO; after any, drop the connection).
 * As there, nothing after the last line is read from fd. */
enum { TD_MIRROR_AUTH_ACCEPT = 1, TD_MIRROR_AUTH_CONNECT = 2 };
typedef struct td_mirror_auth td_mirror_auth;
td_status td_mirror_auth_begin(td_mirror_auth **out, int fd, const char *token, int role);
td_status td_mirror_auth_step(td_mirror_auth *a, unsigned *wants);
const char *td_mirror_auth_waiting_for(const td_mirror_auth *a);
void td_mirror_auth_free(td_mirror_auth *a);
/* One line (without its '\n') into line[cap], a byte at a time, so that what follows stays in
 * fd for the caller's protocol (the handshake, a greeting, an opening), waiting until
 * deadline_ns (td_now_ns's clock; 0: no deadline). TD_ERR_TIMEOUT, TD_ERR_IO when fd closes or
 * fails, TD_ERR_PROTOCOL for a line that does not fit; each names `what`. */
td_status td_mirror_read_line(int fd, char *line, size_t cap, uint64_t deadline_ns,
                              const char *what);

/* ---- sender ---- */
typedef struct td_mirror_out td_mirror_out;

/* Frames go to fd (blocking writes: call it from a thread that may wait on a slow link). */
td_mirror_out *td_mirror_out_new(int fd);
void td_mirror_out_free(td_mirror_out *m);
/* Sends the regular files directly in dir as "prefix/FILE" (dir need not exist yet). Files a
 * receiver would refuse (a leading '.', as an atomic write's temporary has, or a character
 * outside FILE's set) are skipped, so one stray file cannot end the stream. */
void td_mirror_out_watch(td_mirror_out *m, const char *prefix, const char *dir);
/* One manifest line from the receiver, "have NAME SIZE" (after td_mirror_out_watch, since the
 * local file's size decides): a local file of at least SIZE bytes is sent from SIZE; a shorter
 * or missing one is a new spool and continues the copy (base SIZE, see above).
 * TD_ERR_FORMAT naming the line when it is not one. */
td_status td_mirror_out_have(td_mirror_out *m, const char *line);
/* A new link (the agent reconnected): frames go to fd from now on, and what the last receiver
 * had is forgotten, so every file is sent from its start until this link's "have" lines say
 * otherwise (a receiver drops what it already has). The bases of continued files are kept. */
void td_mirror_out_reset(td_mirror_out *m, int fd);
/* Every watched file is new, made for this sender alone (tandem launch --link: a spool per job
 * incarnation): the first "have" line of a name sets its base to SIZE whatever the local file
 * holds, so its bytes always follow the copy's. Guessing from sizes cannot tell a new spool
 * whose file already outgrew a short copy (a requeue line written before the link opened) from
 * the copy's own source. Call it before the first manifest. */
void td_mirror_out_fresh_spool(td_mirror_out *m);
/* Sends what every watched file gained since the last call. TD_ERR_IO when the stream is gone
 * (EPIPE: the link broke) or a file cannot be read; *sent (may be NULL) gets the payload bytes. */
td_status td_mirror_out_poll(td_mirror_out *m, int64_t *sent);
td_status td_mirror_out_note(td_mirror_out *m, const char *key, const char *value);
/* Sends the regular file at path (not a link: O_NOFOLLOW) whole as NAME, replacing the
 * receiver's copy: its size when opened, exactly that many bytes. A NAME the receiver would
 * refuse is skipped with a warning (TD_OK), as one odd artifact should not cost the others.
 * TD_ERR_IO when path cannot be read or shrinks while being sent; after an error in the
 * middle of the frame the stream is unusable (drop the link and reset). */
td_status td_mirror_out_file(td_mirror_out *m, const char *name, const char *path);
/* A last poll, then "tdm end". */
td_status td_mirror_out_end(td_mirror_out *m);

/* ---- receiver ---- */
typedef struct td_mirror_in td_mirror_in;
typedef struct {
    void (*note)(void *user, const char *key, const char *value);
    /* Bytes newly appended to a copy (for echoing logs to a terminal); duplicates are not. */
    void (*data)(void *user, const char *name, const char *bytes, size_t n);
    void *user;
    /* A whole file (tdm file) is in place under its NAME, size bytes. Optional. */
    void (*file)(void *user, const char *name, int64_t size);
} td_mirror_callbacks;

/* Copies live under root: a frame for "logs/rank-0.log" appends to root/logs/rank-0.log.
 * prefixes: the first components accepted ("logs", "metrics"); directories made on demand.
 * One receiver per connection: a new one on the same root (the agent reconnected) starts from
 * the files on disk, as its manifest does. */
td_mirror_in *td_mirror_in_new(const char *root, const char *const *prefixes, size_t nprefixes,
                               const td_mirror_callbacks *cb);
void td_mirror_in_free(td_mirror_in *m);
/* What the copies hold now, as "have NAME SIZE\n" lines (every regular file under the prefixes'
 * directories), for a sender that is about to start. Caller frees. */
char *td_mirror_in_manifest(td_mirror_in *m);
/* Bytes read from the stream, in any pieces. TD_ERR_FORMAT naming what was wrong for a
 * malformed frame or a name outside the prefixes (stop reading that stream: it cannot be
 * trusted); TD_ERR_IO when a copy cannot be written (a link or a file where a directory goes
 * included). After any error, stop feeding that stream. */
td_status td_mirror_in_feed(td_mirror_in *m, const void *buf, size_t n);
/* The sender said "tdm end" (everything arrived). */
int td_mirror_in_ended(const td_mirror_in *m);
/* Payload bytes appended to the copies, and bytes dropped because a copy already had them. */
void td_mirror_in_counts(const td_mirror_in *m, int64_t *appended, int64_t *duplicate);
/* A new link begins (the sender restarted): a half-read frame of the old one is dropped (a
 * half-received whole file too: its copy stays as it was). */
void td_mirror_in_reset(td_mirror_in *m);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_MIRROR_H */
