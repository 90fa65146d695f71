/* Counter-based random numbers: every value is a pure function of
 * (seed, stream, index), so that results never depend on which rank draws
 * them or in which order.  Used for parameter initialisation (stream = tensor
 * id, index = global element index) and data sampling (stream = step, index
 * = position in the global batch).  Local, thread-safe, no state. */
#ifndef MAL_RNG_H
#define MAL_RNG_H

#include <math.h>
#include <stdint.h>

/* SplitMix64 finaliser: a bijective 64-bit mixer with good avalanche. */
static inline uint64_t mal_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* 64 random bits for (seed, stream, index). */
static inline uint64_t mal_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return mal_mix64(mal_mix64(mal_mix64(seed) ^ stream) ^ index);
}

/* Uniform in (0, 1), never exactly 0 or 1. */
static inline double mal_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return ((double)(mal_rng_u64(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Standard normal via Box-Muller on two independent uniforms. */
static inline double mal_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    double u1 = mal_rng_uniform(seed, stream, 2 * index);
    double u2 = mal_rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Uniform integer in [0, n), n > 0 (multiply-shift; bias < n / 2^64). */
static inline uint64_t mal_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)mal_rng_u64(seed, stream, index) * n) >> 64);
}

#endif /* MAL_RNG_H */
