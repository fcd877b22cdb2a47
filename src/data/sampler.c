/* The global sampler: a Fisher-Yates shuffle driven by Philox draws keyed by the seed and
 * indexed by (position, epoch), so an epoch's order is the same on every rank and every restart
 * without any state to save. */
#include <stdlib.h>

#include "tandem/data.h"

/* Domain separation: the sampler's key differs from the seed used for init and dropout. */
#define SAMPLER_KEY_SALT 0x53414d504c455231ull /* "SAMPLER1" */

struct td_sampler {
    uint64_t count;
    uint64_t seed;
    uint64_t epoch; /* the epoch perm holds, valid when have_epoch */
    int have_epoch;
    uint64_t *perm;
};

void td_sampler_permutation(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t *perm) {
    uint64_t key = td_mix64(seed ^ SAMPLER_KEY_SALT);
    for (uint64_t i = 0; i < n; i++) perm[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t pos = i - 1;
        td_philox_ctr c = {
            {(uint32_t)pos, (uint32_t)(pos >> 32), (uint32_t)epoch, (uint32_t)(epoch >> 32)}};
        td_philox_ctr r = td_philox4x32(key, c);
        uint64_t bits = (uint64_t)r.v[0] | (uint64_t)r.v[1] << 32;
        /* Multiply-shift maps 64 random bits to [0, i); the bias is below i / 2^64. */
        uint64_t j = (uint64_t)(((unsigned __int128)bits * i) >> 64);
        uint64_t t = perm[pos];
        perm[pos] = perm[j];
        perm[j] = t;
    }
}

td_sampler_t *td_sampler_new(uint64_t num_samples, uint64_t seed) {
    td_sampler_t *s = td_xcalloc(1, sizeof *s);
    s->count = num_samples;
    s->seed = seed;
    s->perm = td_xmalloc((num_samples ? num_samples : 1) * sizeof(uint64_t));
    return s;
}

void td_sampler_free(td_sampler_t *s) {
    if (!s) return;
    free(s->perm);
    free(s);
}

uint64_t td_sampler_count(const td_sampler_t *s) {
    return s->count;
}

const uint64_t *td_sampler_epoch(td_sampler_t *s, uint64_t epoch) {
    if (!s->have_epoch || s->epoch != epoch) {
        td_sampler_permutation(s->seed, epoch, s->count, s->perm);
        s->epoch = epoch;
        s->have_epoch = 1;
    }
    return s->perm;
}
