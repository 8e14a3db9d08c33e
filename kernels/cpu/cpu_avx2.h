/* cpu_avx2.h — the AVX2 helpers of regc's GEMM kernel for that
 * instruction set (cpu_sgemm_avx2.c): regc_round_bf16 on a vector and an
 * 8 x 8 transpose in registers. Included after <immintrin.h> and then the
 * including file's `#pragma GCC target("avx2,fma")`, which makes the
 * instructions available whatever the build targets (intrinsics declared
 * after the pragma would take on its target and clash with code outside
 * it); only code chosen at run time for a CPU with AVX2 (cpu_gemm.c) may
 * call them. */
#ifndef REGC_CPU_AVX2_H
#define REGC_CPU_AVX2_H

#include <immintrin.h>

/* regc_round_bf16 on 8 floats, bit for bit: u + 0x7fff + (bit 16 of u),
 * the upper halves kept (a carry out of the mantissa raises the exponent,
 * to infinity past the largest value), and a NaN, which that sum could
 * turn into another value, keeps its upper bits with the quiet bit set. */
static inline __m256 regc_cpu_avx2_round_bf16(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i r =
        _mm256_blendv_epi8(sum, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* r[i] holds row i of an 8 x 8 block of floats; afterwards r[j] holds
 * column j. */
static inline void regc_cpu_transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {                   /* within each 128-bit lane: */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);         /* a0 b0 c0 d0 | a4 .. d4 */
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);     /* a1 b1 c1 d1 | a5 .. d5 */
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44); /* a2 .. d2 | a6 .. d6 */
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE); /* a3 .. d3 | a7 .. d7 */
    }
    for (int c = 0; c < 4; c++) { /* rows 0-3 from s[c], rows 4-7 from s[4 + c] */
        r[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);     /* column c */
        r[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31); /* column 4 + c */
    }
}

#endif
