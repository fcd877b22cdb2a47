/* launch internals: the worker set of one node (workers.c), the rendezvous of node agents
 * (rdzv.c) and the agent loop that ties them together (launch.c). */
#ifndef TANDEM_LAUNCH_INTERNAL_H
#define TANDEM_LAUNCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tandem/comm.h"
#include "tandem/launch.h"
#include "tandem/loop.h"
#include "tandem/os.h"

/* Writes all of buf to fd, retrying short writes and waiting out a full non-blocking stream.
 * 0, or the errno of the failed write (the caller decides what a failure means). */
int td__write_all(int fd, const char *buf, size_t nbytes);

/* cmd as execve will find it: itself when it holds a '/', else the first executable file of
 * that name on PATH; NULL when there is none. malloc'ed. */
char *td__which(const char *cmd);

/* The node's setup commands (td_launch_options.node_setup, node_setup.c), before it joins the
 * group. *stopped: a stop signal ended them (*exit_code 143, or 130 for SIGINT). An error: a
 * command failed (the message names it, its exit code and its log) or could not run. */
td_status td__node_setup(const td_launch_options *o, td_sigwatch *sigs, int *exit_code,
                         bool *stopped);

/* Bytes of one output line kept while waiting for its newline; a longer line is emitted in
 * pieces of this size, each with the rank prefix. */
#define TD__LINE_MAX 65536

typedef struct {
    char *buf; /* TD__LINE_MAX bytes */
    size_t len;
    int fd;       /* read end of the worker's pipe; -1 once closed */
    int out_fd;   /* the agent's stream this one is copied to */
    bool console; /* copied to out_fd at all (false: --redirects sends it to file_fd only) */
    int file_fd;  /* --redirects/--tee: the raw bytes also go here (stdout.log), or -1 */
    char *file_path;
} td__stream;

typedef struct {
    int rank;
    int local_rank;
    pid_t pid;    /* also the worker's process group id */
    bool running; /* spawned and not reaped yet */
    int status;   /* wait status once reaped */
    char prefix[32];
    td__stream out, err;
    int log_fd;         /* DIR/rank-R.log or -1 */
    char *log_path;     /* its path, for messages */
    bool log_failed;    /* a write to it failed and was reported */
    char last_err[512]; /* its last stderr line that says it failed, else its last non-blank one */
    bool last_err_says; /* last_err is such a line */
} td__worker;

typedef struct {
    td__worker *w;
    int n;
} td__workers;

typedef struct {
    int n;            /* workers on this node */
    int rank_offset;  /* the global rank of local rank 0 */
    const char *path; /* the command, resolved */
    char *const *argv;
    char **const *envs;  /* per worker, "K=V" arrays */
    int out_fd, err_fd;  /* where the prefixed lines go */
    const char *log_dir; /* NULL or DIR: DIR/rank-R.log */
    int restart_count;
    /* torchrun's --redirects/--tee: per local rank TD_LAUNCH_STD_* bits (NULL: none), and the
     * attempt's directory for the files, std_dir/<local rank>/stdout.log and stderr.log */
    const int *redirects, *tee;
    const char *std_dir;
} td__spawn_args;

/* Spawns the workers running argv with their environments in their own process groups,
 * stdout/stderr on pipes. */
td_status td__workers_spawn(td__workers *ws, const td__spawn_args *args);
/* Reads what is available on fd (one of the workers' pipes), emits complete lines. */
void td__workers_pump_fd(td__workers *ws, int fd);
/* The workers' pipes still open: the agent's loop watches them until they end (EOF), or until
 * a short deadline after the workers exited (a grandchild holding a pipe open must not hold up
 * the agent). */
int td__workers_open_streams(const td__workers *ws);
/* Reads what is left in the pipes without waiting, emits it (a last line without its newline
 * too) and closes them. */
void td__workers_close_streams(td__workers *ws);
/* Sends sig to the process group of every worker that is still running (all = every group,
 * reaped leaders included: sweeps grandchildren). */
void td__workers_signal(td__workers *ws, int sig, bool all);
/* Reaps exited workers without blocking; returns the index of the first one reaped with a
 * failure during this call in *failed (or -1). */
int td__workers_reap(td__workers *ws, int *failed);
int td__workers_running(const td__workers *ws);
void td__workers_free(td__workers *ws);

bool td__status_ok(int status);

/* Waits up to `seconds` for fd to take bytes (or fail: the write then says how), on
 * an event loop of its own (wait.c); true if it did. A transport's bounded wait. */
bool td__wait_writable(int fd, double seconds);

/* ---- the run's checkpoints in S3 (ckpt_s3.c; TANDEM_CHECKPOINT_URL) ---- */
typedef struct td__ckpt_s3 td__ckpt_s3;
/* The step of the newest committed checkpoint in dir, any kind (tandem/ckpt.h), -1 when none. */
int64_t td__ckpt_newest_step(const char *dir);
/* With TANDEM_CHECKPOINT_URL set: checks the bucket and credentials (an error names the bucket
 * and the fix); on the uploader (the node of rank 0), on a resume, restores the newest
 * committed checkpoint when it is newer than the local newest and then uploads each local one
 * S3 lacks (so S3 holds the step it resumes from), and from then on uploads each new committed
 * checkpoint as work on loop's threads (td_loop_queue_work), one at a time, its result said on
 * loop's thread. *out NULL when the variable is unset. Free it before loop. */
td_status td__ckpt_s3_open(td_loop *loop, bool resume, bool uploader, td__ckpt_s3 **out);
/* Before a restart's workers start: the uploader uploads what S3 lacks, then restores a newer
 * one from S3 if any (warns, never fails); another node: nothing (restore_step follows). */
td_status td__ckpt_s3_resume(td__ckpt_s3 *s);
/* Another node on a resume, once node 0 said which step the run resumes from: restores that
 * step's committed checkpoints from S3 when the directory lacks one, and those without a step
 * it lacks (warns, never fails: the SDK's workers get rank 0's bytes). */
td_status td__ckpt_s3_restore_step(td__ckpt_s3 *s, int64_t step);
/* The agent ends: waits for the upload in flight, then uploads and commits the newest local
 * checkpoint when S3 does not hold it yet (the one a stop or preemption made). */
void td__ckpt_s3_end(td__ckpt_s3 *s);
void td__ckpt_s3_free(td__ckpt_s3 *s);
/* After td__ckpt_s3_open, once the rendezvous gave this node its group rank: a node that is
 * not the uploader starts mirroring its own files of directory checkpoints (ckpt_s3_ranks.c). */
void td__ckpt_s3_set_node(td__ckpt_s3 *s, int node);
/* The whole of a small file (a commit object), NUL-terminated; NULL when unreadable. */
char *td__ckpt_slurp(const char *path);
/* A relative path inside a directory checkpoint: no "..", no leading '/'. */
bool td__ckpt_safe_rel(const char *rel);
/* A regular file below a directory checkpoint: its path relative to it, its signature. */
typedef struct {
    char *rel;
    int64_t sig[3]; /* size, mtime (ns), inode */
} td__ckpt_file;
typedef struct {
    td__ckpt_file *v;
    int n;
} td__ckpt_files;
/* Appends the regular files below dir (links left out) whose names along the way keep(name,
 * top) takes (top: directly in dir), in directory order. */
void td__ckpt_walk(const char *dir, bool (*keep)(const char *name, bool top), td__ckpt_files *out);
void td__ckpt_files_free(td__ckpt_files *f);
/* Uploads path to bucket/key (blocking), held aside by a hard link dir/.s3up-TAG-PID first: a
 * writer deletes all but its newest few checkpoints, and a fast one could delete this one
 * mid-upload (no hard links there: the file itself; td_s3_put_file refuses a change under it).
 * *nbytes its size, sha its SHA-256 in hex. */
struct td_aws;
td_status td__ckpt_put_held(struct td_aws *aws, const char *bucket, const char *dir,
                            const char *tag, const char *path, const char *key, int64_t *nbytes,
                            char sha[65]);

/* ---- another node's own files of directory checkpoints in S3 (ckpt_s3_ranks.c) ----
 * The files of a local directory checkpoint (tandem/ckpt.h) that node 0's commit of it does not
 * list (the HF Trainer's rng_state_R.pth of this node's ranks) are this node's: they go up to
 * PREFIX/NAME/.tandem-node-NODE/REL, then the addendum PREFIX/NAME/.tandem-node-NODE.commit
 * names each one's size and SHA-256 (below PREFIX/NAME/: pruned with the checkpoint). */
typedef struct td__ckpt_ranks td__ckpt_ranks;
/* Scans dir every 0.5 s on loop's timer; the newest directory checkpoint goes up once node 0's
 * commit of it is in S3 and this node's files of it did not change between two scans, as work
 * on loop's threads (a failure warns and is tried again). prefix: "P/" or "". */
td__ckpt_ranks *td__ckpt_ranks_start(td_loop *loop, const char *url, const char *bucket,
                                     const char *prefix, const char *dir, int node);
/* The agent ends (its workers are gone, so every file is whole): the upload in flight finishes,
 * then the newest checkpoint's files go up if node 0's commit is in S3 (blocking). */
void td__ckpt_ranks_end(td__ckpt_ranks *r);
/* Before the workers start on a resume, after node 0's copy of name (of step) was restored or
 * found here: downloads this node's files of it from the addendum into dir/name, each checked
 * against the addendum's size and SHA-256 (one this node holds with that SHA-256 stays). A
 * missing or mismatched addendum or file is a warning naming what is lost, never a failure. */
void td__ckpt_ranks_restore(td__ckpt_ranks *r, struct td_aws *aws, const char *name,
                            int64_t step);
void td__ckpt_ranks_free(td__ckpt_ranks *r);

/* ---- the spot watch (spot_watch.c) ----
 * With TANDEM_SPOT_WATCH=1, the agent's loop asks IMDSv2 every TANDEM_SPOT_WATCH_PERIOD seconds
 * (2) for a spot interruption notice and a rebalance recommendation, each look as work on the
 * loop's threads (td_loop_queue_work); its findings come back on the agent's loop, which logs
 * them and notes them to the supervisor (on_note: "interrupted ACTION TIME", "rebalance TIME");
 * on an interruption notice it stops the workers as a SIGTERM does (a SIGTERM raised in the
 * agent's thread, read from its signalfd). */
typedef struct td__spot_watch td__spot_watch;
struct td_loop;
/* *out NULL (and TD_OK) when TANDEM_SPOT_WATCH is unset or 0. TD_ERR_USAGE for a bad value of
 * either variable or of AWS_EC2_METADATA_SERVICE_ENDPOINT. Call it from the agent's thread after
 * its signalfd blocked the signals (the thread inherits the mask). */
td_status td__spot_watch_start(struct td_loop *loop, const td_launch_options *o,
                               td__spot_watch **out);
/* Once an interruption notice stopped the agent: "spot interruption notice: ..." for its end
 * record; else NULL. */
const char *td__spot_watch_cause(const td__spot_watch *w);
/* Cancels the next look (a call in flight is cancelled and waited for); before the loop is
 * freed. */
void td__spot_watch_free(td__spot_watch *w);

/* ---- rendezvous ---- */
typedef struct {
    int group_rank; /* this node's rank among the nodes */
    int nnodes;
    int rank_offset; /* global rank of this node's local rank 0 */
    int world_size;
    char master_addr[256];
    int master_port;
    char blas_core[64]; /* node 0's OpenBLAS core, every node's workers' (tensor.h, numerics) */
    char isa_level[32]; /* the lowest x86-64 level of the nodes' kernels, every node's workers' */
} td__rdzv_result;

typedef struct {
    td_store_t *store;
    const char *ns; /* key prefix of this attempt */
    int min_nodes, max_nodes;
    int node_rank; /* -1 = arrival order */
    int nproc;
    const char *store_host; /* how this node reaches the store, for its own address */
    int store_port;
    double timeout_s;
    double last_call_s;
    int sig_fd; /* polled while waiting: a signal aborts the wait with TD_ERR_INTERRUPTED */
} td__rdzv_params;

td_status td__rdzv_join(const td__rdzv_params *p, td__rdzv_result *out);
/* On a resume, the step every rank resumes from (-1: none), decided once by node 0's agent
 * (after its checkpoints are restored and uploaded) and handed to every node through the store
 * (key resume_step of the attempt). The wait polls p->sig_fd (TD_ERR_INTERRUPTED) and gives up
 * after p->timeout_s. */
td_status td__rdzv_publish_step(const td__rdzv_params *p, int64_t step);
td_status td__rdzv_wait_step(const td__rdzv_params *p, int64_t *step);

/* ---- node 0's resume checkpoint to the other nodes (ckpt_peer.c) ----
 * On a resume of a multi-node group, before any worker starts: node 0's agent offers the files
 * of the committed checkpoints of the step every rank resumes from (any kind, files and HF
 * directories) through the store, before it publishes the step; each other node's agent says
 * whether it lacks any, and node 0 streams them in chunks to those that do, which write them
 * aside and rename them into place (a directory with its commit marker). */
td_status td__ckpt_peer_offer(const td__rdzv_params *p, const char *dir, int64_t step);
/* Node 0, after publishing the step: serves the nodes 1..nnodes-1 that need the offer. */
td_status td__ckpt_peer_serve(const td__rdzv_params *p, int nnodes, const char *dir,
                              int64_t step);
/* Node `node` (> 0), once it knows the step (and after its S3 restore): takes what it lacks. */
td_status td__ckpt_peer_fetch(const td__rdzv_params *p, int node, const char *dir, int64_t step);
/* A directory checkpoint dir/entry this node began but never committed (the HF Trainer writes
 * each rank's rng_state_R.pth into its own node's checkpoint-N/, and only node 0 writes the
 * rest): its top-level files that the staged copy at stage lacks move into it, so each local
 * rank finds its own RNG state in the copy that replaces it. */
void td__ckpt_keep_local_files(const char *dir, const char *entry, const char *stage);
/* rm -rf path (no link followed); what cannot go stays. */
void td__rm_tree(const char *path);
/* A received checkpoint, whole at stage (a hidden name in dir), into place as dir/entry: a
 * directory gets tandem's commit marker (saying it came from `source`) written last, keeps the
 * files of an uncommitted dir/entry that it lacks (HF's rng_state_R.pth of this node's ranks)
 * and replaces it. Used by ckpt_peer.c and the agent link (a checkpoint from the supervisor). */
td_status td__ckpt_commit_staged(const char *dir, const char *entry, const char *stage,
                                 bool is_dir, const char *source);

/* The local address this host uses to reach host:port ("127.0.0.1" for loopback). */
td_status td__local_addr_for(const char *host, int port, char *out, size_t nbytes);
/* Splits "host:port" ("[v6]:port" too). */
td_status td__parse_endpoint(const char *ep, char *host, size_t nbytes, int *port);

#endif
