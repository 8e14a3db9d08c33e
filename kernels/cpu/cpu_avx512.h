/* cpu_avx512.h — the AVX-512 helpers of regc's GEMM kernels for that
 * instruction set (cpu_sgemm_avx512.c, cpu_bgemm.c): a 16 x 16 transpose in
 * registers and regc_round_bf16 on a vector. Included after <immintrin.h>
 * and then the including file's `#pragma GCC target`, which makes the
 * instructions available whatever the build targets (intrinsics declared
 * after the pragma would take on its target and clash with code outside
 * it); only code chosen at run time for a CPU with AVX-512 (cpu_gemm.c) may
 * call them. */
#ifndef REGC_CPU_AVX512_H
#define REGC_CPU_AVX512_H

#include <immintrin.h>

/* r[i] holds row i of a 16 x 16 block of 32-bit values; afterwards r[j]
 * holds column j. */
static inline void regc_cpu_transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {                  /* within each 128-bit lane: */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);     /* a0 b0 a1 b1 */
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);         /* a0 b0 c0 d0 */
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);     /* a1 b1 c1 d1 */
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44); /* a2 b2 c2 d2 */
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE); /* a3 b3 c3 d3 */
    }
    /* u[4 g + c], lane L: column 4 L + c of rows 4 g .. 4 g + 3; now gather
     * lane L of the four groups into one register */
    for (int c = 0; c < 4; c++) {
        const __m512 even01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88); /* lanes 0, 2 */
        const __m512 odd01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);  /* lanes 1, 3 */
        const __m512 even23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 odd23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(even01, even23, 0x88);     /* lane 0 */
        r[4 + c] = _mm512_shuffle_f32x4(odd01, odd23, 0x88);   /* lane 1 */
        r[8 + c] = _mm512_shuffle_f32x4(even01, even23, 0xDD); /* lane 2 */
        r[12 + c] = _mm512_shuffle_f32x4(odd01, odd23, 0xDD);  /* lane 3 */
    }
}

/* regc_round_bf16 on 16 floats, bit for bit, in the upper halves; the
 * lower halves are left as they fall, for packing that keeps only the upper
 * ones. Integer operations, because the conversion instructions flush
 * subnormal inputs to zero (cpu_bgemm.c): u + 0x7fff, or + 0x8000 where bit
 * 16 is odd, rounds to nearest even (a carry out of the mantissa raises the
 * exponent, to infinity past the largest value), and a NaN, which that sum
 * could turn into another value, keeps its upper bits with the quiet bit
 * set. */
static inline __m512i regc_cpu_round_bf16_upper(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x00010000));
    __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
    r = _mm512_mask_add_epi32(r, odd, u, _mm512_set1_epi32(0x8000));
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
}

/* regc_round_bf16 on 16 floats, bit for bit: the bf16 values in the upper
 * halves, zeros below. */
static inline __m512i regc_cpu_round_bf16_bits(__m512 x)
{
    return _mm512_and_si512(regc_cpu_round_bf16_upper(x), _mm512_set1_epi32((int)0xffff0000u));
}

#endif
