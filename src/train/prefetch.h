/* The batch prefetcher: while a micro-batch trains, one thread gathers the next one from a
 * file-backed data set (its pread calls wait on the disk, not the CPU). It gathers exactly what
 * the trainer would, into buffers of its own, so the bits do not depend on it. */
#ifndef TANDEM_TRAIN_PREFETCH_H
#define TANDEM_TRAIN_PREFETCH_H

#include <stdint.h>

#include "tandem/data.h"

typedef struct prefetcher prefetcher;

/* Buffers for batches of up to max_batch samples of sample_size floats and target_dim targets. */
prefetcher *prefetch_new(const td_dataset_t *ds, int max_batch, int sample_size, int target_dim);
void prefetch_free(prefetcher *p);
/* Starts gathering ids[0..n) (copied) for the micro-batch with this tag, and after it asks the
 * kernel to start reading hint[0..nhint), the micro-batch after that (td_dataset_will_need), so
 * a cold file's reads are in flight a micro-batch early and the trainer's thread never waits
 * on them. A job already running is waited for and dropped first. */
void prefetch_start(prefetcher *p, int64_t tag, const uint64_t *ids, int n, const uint64_t *hint,
                    int nhint);
/* When the job for `tag` was started: waits for it, then swaps its buffers with the caller's
 * (*x, *y, *t, *ids hold the gathered batch afterwards; the old ones become the prefetcher's)
 * and returns its status in *rc. Returns false (touching nothing) when no such job was started. */
bool prefetch_take(prefetcher *p, int64_t tag, float **x, int32_t **y, float **t, uint64_t **ids,
                   td_status *rc);

#endif
