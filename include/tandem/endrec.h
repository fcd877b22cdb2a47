/* tandem end record: how a node agent (`tandem launch`) ended, as a typed record its supervisor
 * reads, never as text on stderr that it would have to parse.
 *
 * `tandem launch --end-record PATH` writes one small JSON object at PATH as it exits, whatever
 * ended it (its workers' exit, a failure after the last restart, a stop, a rendezvous error):
 *
 *   {"record": "tandem.launch.end", "version": 1,
 *    "outcome": "succeeded" | "failed" | "stopped" | "preempted" | "interrupted" | "error",
 *    "exit_code": 143, "node_rank": 0, "nnodes": 2, "restarts": 1, "max_restarts": 3,
 *    "stop_signal": 15,                      (0: none)
 *    "cause": "worker rank 1 (...) exited with code 2",   ("" when it succeeded)
 *    "failure": {"rank": 1, "local_rank": 1, "node": 0, "exit_code": 2, "signal": 0,
 *                "last_line": "tandem: error: --lr: not a number: 'x'"},   (absent: none)
 *    "workers": [{"rank": 0, "local_rank": 0, "exit_code": 0, "signal": 0}, ...]}
 *
 * exit_code is the launcher's own (0, 1, 2 for a usage error, 130 after SIGINT, 143 when every
 * worker checkpointed on a stop); a worker's exit_code is the shell's convention (128 + N for a
 * signal N, which `signal` names). `failure` is the first failure of the group as this node saw
 * it, with the failing worker's last non-empty stderr line (its own words: a Python exception,
 * tandem's "error:" line). The record is written atomically (td_write_atomic): a reader sees the
 * whole of it or none. Readers accept unknown fields, so the record can grow. */
#ifndef TANDEM_ENDREC_H
#define TANDEM_ENDREC_H

#include <stdbool.h>

#include "tandem/core.h"

typedef enum {
    TD_END_SUCCEEDED,
    TD_END_FAILED,      /* a worker failed (after the last restart), a stall, a lost node */
    TD_END_STOPPED,     /* a stop signal, and not every worker checkpointed */
    TD_END_PREEMPTED,   /* a stop signal, and every worker checkpointed (exit 143) */
    TD_END_INTERRUPTED, /* SIGINT */
    TD_END_ERROR,       /* the agent itself could not go on (rendezvous, spawn, usage) */
    TD_END_OUTCOME_COUNT
} td_end_outcome;

typedef struct {
    int rank, local_rank, node;
    int exit_code; /* 128 + N when killed by signal N */
    int signal;    /* N, or 0 */
} td_end_worker;

#define TD_END_TEXT 512

typedef struct {
    td_end_outcome outcome;
    int exit_code;
    int node_rank, nnodes;
    int restarts, max_restarts;
    int stop_signal;
    char cause[TD_END_TEXT];
    bool has_failure;
    td_end_worker failure;
    char failure_line[TD_END_TEXT]; /* the failing worker's last stderr line, or "" */
    td_end_worker *workers;         /* owned */
    int nworkers;
} td_end_record;

const char *td_end_outcome_str(td_end_outcome o);

/* Writes r at path atomically. */
td_status td_end_record_write(const char *path, const td_end_record *r);
/* Reads the record at path into *r (cleared first; td_end_record_clear frees it).
 * TD_ERR_NOTFOUND when there is none (the agent was killed before it could write one);
 * TD_ERR_FORMAT, naming the path and the field, for anything that is not such a record. */
td_status td_end_record_read(const char *path, td_end_record *r);
void td_end_record_clear(td_end_record *r);

#endif
