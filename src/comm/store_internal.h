/* What the process group needs from a store client beyond the public API. Internal. */
#ifndef TD_COMM_STORE_INTERNAL_H
#define TD_COMM_STORE_INTERNAL_H

#include "tandem/comm.h"

/* The connected socket (getsockname tells the address this host uses to reach the store). */
int td__store_fd(const td_store_t *store);
/* "host:port" as given to td_store_connect. */
const char *td__store_addr(const td_store_t *store);

/* How long ordinary requests wait for the server; returns the previous value. The process group
 * shortens it on failure paths so a dead store cannot hold an error report up. */
int td__store_set_io_timeout(td_store_t *store, int ms);

#endif
