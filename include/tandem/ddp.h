/* tandem ddp: the data-parallel reducer.
 *
 * How a gradient travels from a layer's backward to the wire:
 *   1. td_model_backward computes layer L's parameter gradients into its slice of the flat grad
 *      buffer and calls the grad-ready hook (nn.h) with that slice;
 *   2. the reducer marks the layer done; when every layer of a bucket is done, the bucket (one
 *      contiguous slice of the grad buffer) is queued to the reducer's comm thread;
 *   3. the comm thread runs td_allreduce(SUM) on the slice while backward goes on with earlier
 *      layers (buckets are filled last layer first, so the first bucket is small and leaves early);
 *   4. td_ddp_wait blocks until every bucket of the step is reduced; the optimizer then steps on
 *      identical bits on every rank.
 * Gradients are already scaled by 1/global_batch in the loss, so the collective is a plain sum
 * in comm's fixed tree: 1, 2 or 4 workers give bitwise-identical gradients.
 */
#ifndef TANDEM_DDP_H
#define TANDEM_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/comm.h"
#include "tandem/core.h"
#include "tandem/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_ddp td_ddp_t;

typedef struct {
    size_t bucket_bytes;       /* 0 = 25 MiB */
    size_t first_bucket_bytes; /* 0 = 1 MiB: the last layers leave early */
    int check_every;           /* compare parameter checksums every N steps; 0 = 100 */
} td_ddp_options;

typedef struct {
    int num_buckets;
    double comm_s; /* time the comm thread spent in allreduce, summed over steps */
    double wait_s; /* time the training thread blocked in td_ddp_wait: the
                      non-overlapped communication */
    uint64_t steps;
    int buckets_reduced; /* buckets of the step in flight (or the last step) reduced so far; in
                            launch order, so bucket b is done when this exceeds b */
} td_ddp_stats;

/* Builds the buckets over the model's flat gradient buffer and starts the comm thread. The
 * model must be finalized; the process group must outlive the reducer. */
td_status td_ddp_new(td_pg_t *pg, td_model_t *model, const td_ddp_options *opts, td_ddp_t **out);
/* Stops the comm thread. Does not touch the model, which may already be freed; a step armed by
 * td_ddp_begin_backward keeps the reducer's hook on the model until td_ddp_wait removes it. */
void td_ddp_free(td_ddp_t *ddp);

/* Broadcasts rank 0's parameters to every rank, then verifies the checksum on every rank. */
td_status td_ddp_broadcast_params(td_ddp_t *ddp);
/* When step % check_every == 0: compares a checksum of the parameters across ranks;
 * TD_ERR_MISMATCH on every rank naming the ranks whose replicas drifted from the majority (ties:
 * from rank 0's). Cheap (one CRC pass and an allgather of 4 bytes per rank). Every rank must
 * call it with the same step. */
td_status td_ddp_check_params(td_ddp_t *ddp, uint64_t step);

/* Arms the reducer for the backward that produces this step's final gradients: installs the
 * grad-ready hook on the model. Call before the last micro-batch's backward. */
void td_ddp_begin_backward(td_ddp_t *ddp);
/* Marks a layer's gradient slice final (what the grad-ready hook calls). Exposed so a trainer
 * that post-processes gradients per layer (accumulation folding) can call it itself. */
void td_ddp_layer_ready(td_ddp_t *ddp, int layer);
/* Waits until every bucket is reduced (launching, in order, any bucket whose layers never
 * reported); returns the first error a bucket met, with its detail. */
td_status td_ddp_wait(td_ddp_t *ddp);

/* A consistent snapshot (taken under the reducer's lock; callable while a step is in flight). */
td_ddp_stats td_ddp_get_stats(const td_ddp_t *ddp);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_DDP_H */
