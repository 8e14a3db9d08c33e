/* rng.c — the counter-based random stream (splitmix64's mixer). */
#include "regc_common.h"

#define RNG_GOLDEN 0x9E3779B97F4A7C15ULL

uint64_t regc_rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t regc_rng_at(uint64_t seed, uint64_t i)
{
    return regc_rng_mix(seed + (i + 1) * RNG_GOLDEN);
}

uint64_t regc_rng_substream(uint64_t seed, uint64_t index)
{
    return regc_rng_mix(seed ^ regc_rng_mix(index + RNG_GOLDEN));
}

void regc_rng_fill_uniform(float *out, size_t n, uint64_t seed, float center, float halfwidth)
{
    regc_rng_fill_uniform_range(out, 0, n, seed, center, halfwidth);
}

void regc_rng_fill_uniform_range(float *out, size_t first, size_t n, uint64_t seed, float center,
                                 float halfwidth)
{
    /* Two float32 roundings (product, then sum) and no fused multiply-add,
     * so any language with IEEE float32 reproduces the values bit for bit. */
    const float step = (float)((double)halfwidth / 8388608.0);
    for (size_t i = 0; i < n; i++) {
        int32_t k = (int32_t)(regc_rng_at(seed, first + i) >> 40) - 8388608;
        float t = (float)k * step;
        out[i] = center + t;
    }
}
