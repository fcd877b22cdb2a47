/* tandem core: status codes, error details, logging, allocation, RNG, time, env knobs.
 *
 * Every other layer builds on this one and on libc only. Library code never exits: a function
 * that can fail returns td_status and records a human-readable detail (what, which value, what
 * to do) with td_error(); callers add their file:line with TD_CHECK as the error travels up.
 * Only main() decides to exit.
 */
#ifndef TANDEM_CORE_H
#define TANDEM_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TD_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#define TD_NODISCARD                __attribute__((warn_unused_result))
#else
#define TD_PRINTF(fmt_idx, arg_idx)
#define TD_NODISCARD
#endif

/* ---- status codes: one list, messages generated from it (libuv's UV_ERRNO_MAP habit) ---- */
#define TD_STATUS_MAP(X)                                                                           \
    X(OK, "ok")                                                                                    \
    X(ERR_INVALID, "invalid argument")                                                             \
    X(ERR_USAGE, "usage error")                                                                    \
    X(ERR_NOMEM, "out of memory")                                                                  \
    X(ERR_IO, "input/output error")                                                                \
    X(ERR_FORMAT, "corrupt or malformed data")                                                     \
    X(ERR_NOTFOUND, "not found")                                                                   \
    X(ERR_EXISTS, "already exists")                                                                \
    X(ERR_TIMEOUT, "timed out")                                                                    \
    X(ERR_PEER, "peer failed or disconnected")                                                     \
    X(ERR_MISMATCH, "ranks disagree")                                                              \
    X(ERR_AUTH, "authentication failed")                                                           \
    X(ERR_PROTOCOL, "protocol violation")                                                          \
    X(ERR_INTERRUPTED, "interrupted by signal")                                                    \
    X(ERR_NOSPACE, "no space left on device")                                                      \
    X(ERR_SYS, "system call failed")                                                               \
    X(ERR_UNSUPPORTED, "not supported")                                                            \
    X(ERR_DIVERGED, "training diverged")

typedef enum {
#define TD__STATUS_ENUM(name, msg) TD_##name,
    TD_STATUS_MAP(TD__STATUS_ENUM)
#undef TD__STATUS_ENUM
        TD_STATUS_COUNT
} td_status;

/* Short generic text for a status ("timed out"). */
const char *td_status_str(td_status st);
/* Symbolic name ("TD_ERR_TIMEOUT"). */
const char *td_status_name(td_status st);

/* ---- error details (thread-local): the message a user reads ----
 * td_error() records "what went wrong, the value, the fix" and returns st so a caller can write
 *     return td_error(TD_ERR_FORMAT, "%s: bad magic 0x%08x, expected 0x00000803 ...", path, m);
 * td_error_errno() appends strerror(errno) and maps ENOSPC/ENOMEM to their own status codes.
 * TD_CHECK appends "  at file:line" frames as the error propagates (NCCL checks.h habit). */
td_status td__error(const char *file, int line, td_status st, const char *fmt, ...) TD_PRINTF(4, 5);
td_status td__error_errno(const char *file, int line, td_status st, const char *fmt, ...)
    TD_PRINTF(4, 5);
void td__error_trace(const char *file, int line, const char *expr);
#define td_error(st, ...)       td__error(__FILE__, __LINE__, (st), __VA_ARGS__)
#define td_error_errno(st, ...) td__error_errno(__FILE__, __LINE__, (st), __VA_ARGS__)

/* The last recorded detail on this thread (never NULL; "" when none). It may be passed to
 * td_error() to wrap it: "what we were doing: <the detail>". */
const char *td_error_msg(void);
/* The frames appended by TD_CHECK, one "  at file:line (expr)" per line. */
const char *td_error_trace(void);
void td_error_clear(void);
/* Prints "tandem: <status>: <detail>" (and the trace when TANDEM_LOG_LEVEL=debug) to stderr. */
void td_error_print(td_status st);

#define TD_CHECK(call)                                                                             \
    do {                                                                                           \
        td_status td__st = (call);                                                                 \
        if (td__st != TD_OK) {                                                                     \
            td__error_trace(__FILE__, __LINE__, #call);                                            \
            return td__st;                                                                         \
        }                                                                                          \
    } while (0)

#define TD_CHECK_GOTO(call, rc, label)                                                             \
    do {                                                                                           \
        (rc) = (call);                                                                             \
        if ((rc) != TD_OK) {                                                                       \
            td__error_trace(__FILE__, __LINE__, #call);                                            \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- logging ----
 * Levels from TANDEM_LOG_LEVEL (error, warn, info, debug); default info. Lines go to stderr,
 * prefixed with the process's log prefix (e.g. "[rank 1] ") when one is set. */
typedef enum { TD_LOG_ERROR = 0, TD_LOG_WARN, TD_LOG_INFO, TD_LOG_DEBUG } td_log_level;
/* One line "tandem: [level: ]message" to stderr; control bytes in the message (ESC, CR, a
 * newline inside it) are written as \xNN, so quoted outside text cannot drive the terminal or
 * forge a line. */
void td_log(td_log_level level, const char *fmt, ...) TD_PRINTF(2, 3);
/* "tandem: error: MSG" as td_log writes lines (td_error_print's). */
void td__log_error_line(const char *msg);
int td_log_enabled(td_log_level level);
void td_log_set_prefix(const char *prefix);
#define TD_LOG_ERROR(...) td_log(TD_LOG_ERROR, __VA_ARGS__)
#define TD_LOG_WARN(...)  td_log(TD_LOG_WARN, __VA_ARGS__)
#define TD_LOG_INFO(...)  td_log(TD_LOG_INFO, __VA_ARGS__)
#define TD_LOG_DEBUG(...) td_log(TD_LOG_DEBUG, __VA_ARGS__)

/* ---- allocation ----
 * Policy: the td_x* wrappers abort with a message on out-of-memory (Redis zmalloc); callers do
 * not check them. Use plain malloc and check only where running out is a normal outcome.
 * Buffers that kernels touch are 64-byte aligned (td_xmalloc_aligned, freed with free()). */
void *td_xmalloc(size_t nbytes);
void *td_xcalloc(size_t count, size_t size);
void *td_xrealloc(void *ptr, size_t nbytes);
void *td_xmalloc_aligned(size_t nbytes);
char *td_xstrdup(const char *s);
char *td_xstrndup(const char *s, size_t n); /* at most n bytes of s, NUL-terminated */
char *td_xasprintf(const char *fmt, ...) TD_PRINTF(1, 2);

/* A bump arena for scratch: one block reserved up front, allocations 64-byte aligned, overflow
 * is an error the caller sees (ggml_init / ggml_new_object habit), reset frees everything. */
typedef struct td_arena {
    uint8_t *base;
    size_t capacity_bytes;
    size_t used_bytes;
    size_t peak_bytes;
} td_arena;
void td_arena_init(td_arena *arena, size_t capacity_bytes);
void td_arena_free(td_arena *arena);
/* Returns NULL when the request does not fit; never aborts. */
void *td_arena_alloc(td_arena *arena, size_t nbytes);
void td_arena_reset(td_arena *arena);

/* ---- counter-based RNG: Philox4x32-10 ----
 * A random number is a pure function of (key, counter): no hidden state, so any sample's dropout
 * mask or any parameter's initial value can be recomputed anywhere, on any rank, in any order. */
typedef struct {
    uint32_t v[4];
} td_philox_ctr;
/* Four 32-bit random words for (key, counter). */
td_philox_ctr td_philox4x32(uint64_t key, td_philox_ctr counter);
/* Uniform float in [0, 1) with 24 random bits, for stream/index coordinates:
 * counter = {index lo, index hi, stream lo, stream hi}; lane picks one of the 4 words. */
float td_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Fill out[0..count) with uniform floats in [lo, hi) for (seed, stream), element i at index i. */
void td_rng_fill_uniform(uint64_t seed, uint64_t stream, float lo, float hi, float *out,
                         size_t count);
/* A 64-bit mix (splitmix64), for deriving sub-seeds from several integers. */
uint64_t td_mix64(uint64_t x);

/* ---- time ---- */
uint64_t td_now_ns(void); /* monotonic */
double td_now_s(void);    /* monotonic, seconds */
double td_wall_s(void);   /* wall clock (realtime), seconds since the epoch */

/* ---- environment knobs, declared once (NCCL_PARAM habit) ----
 * Every TANDEM_* variable the library reads is listed in TD_ENV_MAP with its default and meaning;
 * td_env_int/td_env_str read it (no knob sits on a hot path, so nothing is cached and tests may
 * change the environment between calls). `tandem env` prints the table. */
#define TD_ENV_MAP(X)                                                                              \
    X(LOG_LEVEL, "info", "log verbosity: error, warn, info, debug")                                \
    X(COMM_TIMEOUT_MS, "300000", "per-collective timeout in milliseconds")                         \
    X(STORE_TIMEOUT_MS, "300000", "rendezvous store wait timeout in milliseconds")                 \
    X(NUM_THREADS, "0", "compute threads per process (0 = all cores / local world size)")          \
    X(COMM_TRANSPORT, "auto", "transport: auto (shm in a host, tcp across), shm, tcp")             \
    X(HOST_KEY, "", "ranks with equal host keys share memory (empty: boot id+netns+hostname)")     \
    X(HOME, "", "project directory holding .tandem/ (runs, workflows); empty: the cwd")            \
    X(CONV_ALGO, "auto", "3x3 stride-1 conv: auto (winograd if in_c >= 8), im2col, winograd")      \
    X(CUDA_GRAPH, "1", "--device cuda: 1 replays each step as a CUDA graph, 0 launches kernels")   \
    X(RESTART_BACKOFF_MS, "1000",                                                                  \
      "launch: wait before the 2nd restart, doubling per restart up to 30 s (the 1st is at once)") \
    X(LAUNCH_DETECT, "1",                                                                          \
      "launch without rendezvous flags: 1 takes the topology from Slurm/MPI/dstack/SkyPilot/...")  \
    X(STALL_TIMEOUT_MS, "120000",                                                                  \
      "launch: fail or restart a group whose collectives are stuck this long (0 = never)")         \
    X(GPU_DATA, "auto",                                                                            \
      "--device cuda: auto (each set resident on the GPU if it fits, else streamed), resident, "  \
      "stream")                                                                                    \
    X(GPU_REDUCE, "auto",                                                                          \
      "--device cuda between ranks: auto (ipc when all ranks share a host), ipc, host (staged)")   \
    X(UI_TOKEN, "", "tandem ui: a fixed access token (empty: a new random one each start)")        \
    X(SPOT_WATCH_PERIOD, "2",                                                                      \
      "launch with TANDEM_SPOT_WATCH=1: seconds between two looks at the instance metadata")       \
    X(DATA_IN_MEMORY, "auto",                                                                      \
      "--data arrays: auto (files of 256 MiB or more are read as needed), 1 (all read), 0 (none)") \
    X(EXIT_GRACE, "300",                                                                           \
      "run: seconds workers that all finished (tandem.finish) may take to exit; then the run "     \
      "stops them and ends (0 = wait)")                                                            \
    X(SHUTDOWN_CMD, "shutdown -h now",                                                             \
      "aws: what an instance's dead-man's switch runs to end its instance (docs/cloud.md)")       \
    X(ISA, "auto",                                                                                 \
      "which build of tandem's own kernels runs: auto (the best this CPU runs among the builds "  \
      "beside the binary), x86-64, x86-64-v2, x86-64-v3 or x86-64-v4 (docs/ddp.md)")              \
    X(SILENT_S, "900",                                                                             \
      "ps and ui: a live run whose workers wrote no metric or log line for this many seconds "     \
      "shows as \"silent for N min\" (0 = never)")

typedef enum {
#define TD__ENV_ENUM(name, def, doc) TD_ENV_##name,
    TD_ENV_MAP(TD__ENV_ENUM)
#undef TD__ENV_ENUM
        TD_ENV_COUNT
} td_env_knob;

const char *td_env_str(td_env_knob knob);
int64_t td_env_int(td_env_knob knob);
/* Prints every knob, its value and its meaning. */
void td_env_print(FILE *out);

/* ---- the launcher/worker contract, declared once ----
 * What `tandem launch` and the `tandem run` supervisor hand a worker through its environment,
 * and what workers (comm's process group, the trainer, a PyTorch script) read. torchrun's names
 * where torchrun has one, so a PyTorch script runs unchanged; TANDEM_* for tandem's own. Code on
 * both sides names a variable through this table (td_var_name), never a string literal, and
 * `tandem env` prints it. X(name, set by, meaning). */
#define TD_VAR_MAP(X)                                                                              \
    X(RANK, "launch", "global rank of this worker, 0 .. WORLD_SIZE-1")                             \
    X(LOCAL_RANK, "launch", "rank of this worker on its node")                                     \
    X(WORLD_SIZE, "launch", "number of workers in the job")                                        \
    X(LOCAL_WORLD_SIZE, "launch", "number of workers on this node")                                \
    X(GROUP_RANK, "launch", "rank of this node (node agent) among the nodes")                      \
    X(GROUP_WORLD_SIZE, "launch", "number of nodes")                                               \
    X(NODE_RANK, "launch", "as GROUP_RANK (not torchrun's: Lightning and others read it)")         \
    X(NUM_NODES, "launch", "as GROUP_WORLD_SIZE (not torchrun's)")                                 \
    X(ROLE_RANK, "launch", "torchrun: equal to RANK (one role)")                                   \
    X(ROLE_WORLD_SIZE, "launch", "torchrun: equal to WORLD_SIZE")                                  \
    X(ROLE_NAME, "launch", "torchrun: always 'default'")                                           \
    X(MASTER_ADDR, "launch", "address of node 0, for torch.distributed's own TCPStore")            \
    X(MASTER_PORT, "launch", "a free port on node 0 for that TCPStore")                            \
    X(TORCHELASTIC_RESTART_COUNT, "launch", "how many times the group was restarted")              \
    X(TORCHELASTIC_MAX_RESTARTS, "launch", "--max-restarts")                                       \
    X(TORCHELASTIC_RUN_ID, "launch", "--rdzv-id (the run id under tandem run)")                    \
    X(TORCHELASTIC_USE_AGENT_STORE, "launch", "False: torch builds its store at MASTER_ADDR")      \
    X(TORCH_NCCL_ASYNC_ERROR_HANDLING, "launch", "as inherited, else 1 (torchrun's default)")        \
    X(OMP_NUM_THREADS, "launch",                                                                   \
      "as inherited, else cores / LOCAL_WORLD_SIZE (torchrun: 1 with several workers)")            \
    X(OPENBLAS_CORETYPE, "launch",                                                                 \
      "several nodes: node 0's OpenBLAS core on every node, so all ranks run one BLAS kernel")     \
    X(TANDEM_ISA, "launch",                                                                        \
      "several nodes: the lowest x86-64 level of the nodes' tandem kernels, on every node")       \
    X(TANDEM_NUM_THREADS, "launch", "tandem's compute threads, as OMP_NUM_THREADS unless set")     \
    X(TANDEM_STORE_ADDR, "launch", "HOST:PORT of the job's rendezvous store (tandem's pg)")        \
    X(TANDEM_STORE_LISTEN_FD, "run",                                                               \
      "node 0's launcher serves the store on this inherited socket")                               \
    X(TANDEM_TOKEN, "launch", "secret for the store's challenge-response (random per job)")        \
    X(TANDEM_RUN_ID, "launch, run", "the run id (namespaces the store's keys)")                    \
    X(TANDEM_RESTART_COUNT, "launch", "as TORCHELASTIC_RESTART_COUNT")                             \
    X(TANDEM_NODE_RANK, "launch", "as GROUP_RANK")                                                 \
    X(TANDEM_METRICS, "launch", "file this rank appends metrics JSON lines to (--metrics-dir)")    \
    X(TANDEM_HEARTBEAT_MS, "launch", "the pg publishes its progress this often (0 = not at all)")  \
    X(TANDEM_RUN_DIR, "run", "the run's directory under .tandem/runs/")                            \
    X(TANDEM_WORK_DIR, "run", "the run's own working directory (the commands' cwd)")               \
    X(TANDEM_PROJECT_DIR, "run", "the project (workflow) directory the run was started from")      \
    X(TANDEM_CHECKPOINT_DIR, "run", "where tandem train keeps its checkpoints")                    \
    X(TANDEM_RESUME, "run", "1: resume from the newest checkpoint in TANDEM_CHECKPOINT_DIR")       \
    X(TANDEM_RESUME_STEP, "launch, run",                                                           \
      "on a resume: the step every rank resumes from (node 0's newest committed checkpoint)")     \
    X(TANDEM_CHECKPOINT_URL, "run",                                                                \
      "s3://BUCKET/PREFIX: node 0's agent mirrors TANDEM_CHECKPOINT_DIR there (docs/cloud.md)")    \
    X(TANDEM_PROGRESS, "run", "1: a person watches; rank 0 draws a progress bar")                  \
    X(TANDEM_SYS_METRICS, "run",                                                                   \
      "the node agent writes its workers' CPU/RSS/GPU to --metrics-dir/sys-HOST.jsonl, steps in "  \
      "seconds since this wall time (the run's creation): set by the Slurm and ssh executors")     \
    X(TANDEM_SPOT_WATCH, "aws executor",                                                           \
      "1: the node agent watches IMDSv2 for spot interruption notices; on one its workers "        \
      "checkpoint and stop (docs/launch.md, \"Spot interruptions\")")                              \
    X(TANDEM_ORPHAN_HEARD, "aws executor",                                                         \
      "the file the node agent touches at each line from its supervisor; the instance's "         \
      "dead-man's switch ends the instance when it grows too old (docs/cloud.md)")                \
    X(TANDEM_BUNDLE_LIB, "shipped tandem's wrapper",                                              \
      "the bundle's library directory, first on tandem's own LD_LIBRARY_PATH; the launcher takes " \
      "it out of the workers' (a user's python must load its own libssl, sqlite3...)")            \
    X(TANDEM_PARAM_, "run", "TANDEM_PARAM_<KEY>: each workflow param, KEY upper-cased")

typedef enum {
#define TD__VAR_ENUM(name, by, doc) TD_VAR_##name,
    TD_VAR_MAP(TD__VAR_ENUM)
#undef TD__VAR_ENUM
        TD_VAR_COUNT
} td_var;

/* The variable's name ("RANK", "TANDEM_STORE_ADDR"). */
const char *td_var_name(td_var var);
/* Its value in our environment, or NULL when unset or empty. */
const char *td_var_get(td_var var);
/* Prints the contract table. */
void td_var_print(FILE *out);

/* ---- small helpers used across layers (processes, files, sockets: tandem/os.h) ---- */
/* The cores this process may run on (its CPU affinity), at least 1. */
int td_num_cores(void);
/* Parses a whole decimal integer / float string; TD_ERR_INVALID naming `what` otherwise. */
td_status td_parse_i64(const char *what, const char *s, int64_t *out);
td_status td_parse_f64(const char *what, const char *s, double *out);
/* Copies n bytes of untrusted text (a peer's message) into dst[cap] with every byte outside
 * printable ASCII written as \xNN, so it can reach a terminal or a log safely; truncates with
 * "..." when it does not fit. Returns dst. */
char *td_escape_text(char *dst, size_t cap, const void *src, size_t n);
/* CRC-32 (zlib polynomial) over a buffer, chainable: crc = td_crc32(crc, buf, n), start at 0. */
uint32_t td_crc32(uint32_t crc, const void *buf, size_t nbytes);

#define TD_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define TD_MAX(a, b)    ((a) > (b) ? (a) : (b))
#define TD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* c ? a : b, chosen by the bits. For vector loops: given a ?: whose arm computes (a product, a
 * quotient), GCC branches around the arm it does not need (it may not speculate an operation
 * that could trap), and without AVX-512's masked moves it cannot turn that branch back into a
 * select, so the loop stays scalar in the AVX2 and SSE builds. Both values are computed here
 * and the choice is a mask: the same result as the ?:, in vectors at every x86 level. */
static inline float td_pick(int c, float a, float b) {
    uint32_t ua, ub, m = (uint32_t)0 - (uint32_t)(c != 0), r;
    float v;
    __builtin_memcpy(&ua, &a, sizeof ua);
    __builtin_memcpy(&ub, &b, sizeof ub);
    r = (ua & m) | (ub & ~m);
    __builtin_memcpy(&v, &r, sizeof v);
    return v;
}

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_CORE_H */
