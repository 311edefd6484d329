/* sampling_rng.c - the counter-based random stream of sampling.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
 * easy as 1, 2, 3", SC'11), written from the paper's definition and checked
 * against Random123's known-answer vectors in tests/unit/test_sampling.c.
 * A counter-based generator has no state: a draw is a pure function of its
 * key, which is what makes sampling independent of batch arrangement and
 * reproducible on the GPU.  The exact key layout is in sampling.h.
 */
#include "runtime/sampling.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void splash_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static void keyed_words(uint64_t seed, uint64_t position, uint32_t purpose, uint32_t index,
                        uint32_t w[4]) {
    const uint32_t ctr[4] = {index, purpose, (uint32_t)position, (uint32_t)(position >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    splash_philox4x32_10(ctr, key, w);
}

double splash_rng_uniform(uint64_t seed, uint64_t position, uint32_t purpose, uint32_t index) {
    uint32_t w[4];
    keyed_words(seed, position, purpose, index, w);
    uint64_t bits = ((uint64_t)(w[0] >> 5) << 26) | (uint64_t)(w[1] >> 6); /* 27 + 26 bits */
    return (double)bits * (1.0 / 9007199254740992.0);                     /* 2^-53 */
}

float splash_rng_uniform_f32(uint64_t seed, uint64_t position, uint32_t purpose, uint32_t index) {
    uint32_t w[4];
    keyed_words(seed, position, purpose, index, w);
    return (float)(w[0] >> 8) * (1.0f / 16777216.0f); /* 2^-24 */
}
