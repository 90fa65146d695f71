/* The GPU tests' seeded inputs: a 64-bit linear congruential generator
 * (`rng` is its state; the test's main seeds it and prints the seed),
 * normal draws from it, and bf16 rounding on the host (round to nearest
 * even, as the device's __float2bfloat16_rn), so that the host holds the
 * exact values the device computes on. */
#ifndef MAL_TEST_RAND_H
#define MAL_TEST_RAND_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng;

static inline double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static inline float nrand(void)
{
    return (float)(sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()));
}

static inline uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
