/* The node agent's stall check: node heartbeats and the workers' collective progress, judged by
 * every agent (docs/launch.md, "Stalls"). Internal to launch; launch.c drives it from the monitor
 * loop. */
#ifndef TD_LAUNCH_STALL_H
#define TD_LAUNCH_STALL_H

#include <stddef.h>

#include "launch_internal.h"

typedef struct td__stall td__stall;

typedef struct {
    td_store_t *store;  /* borrowed, used from the agent's thread only */
    const char *ns;     /* this attempt's namespace: node heartbeats are <ns>/beat/<node> */
    const char *run_id; /* with restart: where the workers publish (td_pg_progress_key) */
    int restart;
    int node; /* this node's group rank */
    int nnodes;
    int rank_offset; /* global rank of this node's local rank 0 */
    int nlocal;
    int world_size;
    double timeout_s; /* --stall-timeout, > 0 */
    double monitor_s; /* --monitor-interval */
} td__stall_params;

/* What the workers are asked for (TANDEM_HEARTBEAT_MS): T/8, within 100 ms .. 5 s, so that a live
 * process publishes several times within the time the check takes silence for a frozen one. */
int td__stall_heartbeat_ms(double timeout_s);
/* How often td__stall_check should run: T/10 within the monitor interval .. 1 s. */
double td__stall_period_s(const td__stall_params *p);

td__stall *td__stall_new(const td__stall_params *p);
/* One round: reads this node's workers' progress keys, publishes this node's heartbeat (which
 * carries them) when there are several nodes, reads the other nodes' heartbeats and judges.
 * cause[0] == '\0': nothing wrong. Otherwise cause is the group's failure, one line naming the
 * stalled rank or node agent. An error status: the store failed (the caller treats it as lost). */
td_status td__stall_check(td__stall *s, const td__workers *ws, char *cause, size_t nbytes);
/* Other nodes whose heartbeat has not changed for at least min_s: agents that will not check
 * out at the end, so the store host does not wait for them. */
int td__stall_silent_nodes(const td__stall *s, double min_s);
void td__stall_free(td__stall *s);

#endif
