/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 * Counter-based: the output is a pure function of (key, counter), which is what lets a dropout
 * mask depend only on (seed, step, global sample index) and never on rank or batch position. */
#include "tandem/core.h"

enum {
    PHILOX_M0 = 0xD2511F53u,
    PHILOX_M1 = 0xCD9E8D57u,
    PHILOX_W0 = 0x9E3779B9u,
    PHILOX_W1 = 0xBB67AE85u,
};

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

td_philox_ctr td_philox4x32(uint64_t key, td_philox_ctr ctr) {
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    uint32_t *c = ctr.v;
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c[0], &hi0, &lo0);
        mulhilo(PHILOX_M1, c[2], &hi1, &lo1);
        uint32_t n0 = hi1 ^ c[1] ^ k0, n1 = lo1, n2 = hi0 ^ c[3] ^ k1, n3 = lo0;
        c[0] = n0;
        c[1] = n1;
        c[2] = n2;
        c[3] = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return ctr;
}

static inline float u32_to_unit(uint32_t x) {
    return (float)(x >> 8) * (1.0f / 16777216.0f); /* 24 bits: exactly representable, < 1 */
}

float td_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    /* Each Philox call yields 4 words; index/4 picks the block, index%4 the lane. */
    uint64_t block = index >> 2;
    td_philox_ctr c = {
        {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)}};
    td_philox_ctr r = td_philox4x32(seed, c);
    return u32_to_unit(r.v[index & 3]);
}

void td_rng_fill_uniform(uint64_t seed, uint64_t stream, float lo, float hi, float *out,
                         size_t count) {
    float span = hi - lo;
    for (size_t base = 0; base < count; base += 4) {
        uint64_t block = base >> 2;
        td_philox_ctr c = {
            {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)}};
        td_philox_ctr r = td_philox4x32(seed, c);
        for (size_t j = 0; j < 4 && base + j < count; j++)
            out[base + j] = lo + span * u32_to_unit(r.v[j]);
    }
}

uint64_t td_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
