/* cpu_sgemm_avx2.c — the fp32 GEMM kernel for CPUs with AVX2 and FMA but
 * not AVX-512 (regc_cpu_sgemm_avx2). The loops around it are cpu_sgemm.c's,
 * as for the AVX-512 kernel; this file brings the tile, the packing and the
 * micro-kernel.
 *
 * The tile is 6 x 16 (as BLIS's for Haswell and Zen): twelve accumulators,
 * two vectors of a B row and one broadcast of A, 15 of the 16 256-bit
 * registers. Per step of k: 2 loads and 6 broadcasts (memory operands) for
 * 12 fused multiply-adds, so the two FMA pipes of a Zen 3 or Haswell core
 * stay busy with loads to spare, and the 12 independent chains cover the
 * FMA's 4 to 5 cycles of latency.
 *
 * A bf16 GEMM (g->bf16) rounds every value as it is packed (no pass of
 * its own); operands held in bf16 (a_bf16, b_bf16) are widened as they are
 * packed, exactly, so they are read in half the bytes of fp32 and never
 * copied. The products of rounded values are exact in fp32 and summed in
 * it, as every bf16 GEMM of regc.
 *
 * Built for AVX2 and FMA whatever the build targets (the pragma below),
 * and run only where CPUID reports both (cpu_gemm.c). */
#include "cpu_kernels.h"
#include "regc_common.h"

#ifdef REGC_CPU_OWN_SGEMM

#include <immintrin.h> /* before the target below, as for every file */

#pragma GCC target("avx2,fma")

#include "cpu_avx2.h"

#define AVX2_MR 6   /* rows of a register tile: 6 x 2 accumulators */
#define AVX2_NR 16  /* columns of a register tile: two 8-float vectors */
#define AVX2_KC 256 /* a B panel, KC x NR floats = 16 KiB, half a 32 KiB L1 */

static int64_t avx2_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Values at .. at+7 of an operand as the GEMM reads them: fp32 rounded to
 * bf16 for a bf16 GEMM, or as stored; one held in bf16 widened (exact, and
 * already what rounding would give). */
static inline __m256 avx2_load8(const regc_gemm *g, const void *base, int bf16, int64_t at)
{
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + at))),
            16));
    const __m256 x = _mm256_loadu_ps((const float *)base + at);
    return g->bf16 ? regc_cpu_avx2_round_bf16(x) : x;
}

static void avx2_pack_a(void *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                        int64_t kc)
{
    regc_cpu_pack_a_fp32(dst, g, i0, mc, p0, kc, AVX2_MR);
}

/* For B stored [n, k]: columns j .. j+cols of op(B) (cols <= 8) at rows
 * p .. p+depth (depth <= 8) are rows of B, transposed into d[q * NR + c] =
 * op(B)[p + q, j + c] for c < 8, with zeros past cols. */
static void avx2_pack_b_rows8(float *restrict d, const regc_gemm *g, int64_t j, int cols, int64_t p,
                              int depth)
{
    __m256 r[8];
    for (int c = 0; c < 8; c++) {
        if (c >= cols) {
            r[c] = _mm256_setzero_ps();
        } else if (depth == 8) {
            r[c] = avx2_load8(g, g->b, g->b_bf16, (j + c) * g->ldb + p);
        } else { /* the end of k: no read past it */
            float v[8] = {0};
            for (int q = 0; q < depth; q++)
                v[q] = regc_cpu_gemm_value(g, g->b, g->b_bf16, (j + c) * g->ldb + p + q);
            r[c] = _mm256_loadu_ps(v);
        }
    }
    regc_cpu_transpose8(r);
    for (int q = 0; q < depth; q++)
        _mm256_store_ps(d + q * AVX2_NR, r[q]);
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] as panels of NR columns, each [kc][NR]:
 * dst[panel * kc * NR + p * NR + c] = op(B)[p0 + p, j0 + panel * NR + c] */
static void avx2_pack_b(void *restrict dst, const regc_gemm *g, int64_t j0, int64_t nc, int64_t p0,
                        int64_t kc)
{
    for (int64_t jr = 0; jr < nc; jr += AVX2_NR) {
        const int cols = (int)avx2_min(nc - jr, AVX2_NR);
        float *restrict d = (float *)dst + jr * kc; /* [kc][NR] */
        if (!g->trans_b) { /* B is [k, n]: a panel's NR values are contiguous */
            for (int64_t p = 0; p < kc; p++) {
                const int64_t at = (p0 + p) * g->ldb + j0 + jr; /* [cols] values from here */
                if (cols == AVX2_NR) {
                    _mm256_store_ps(d + p * AVX2_NR, avx2_load8(g, g->b, g->b_bf16, at));
                    _mm256_store_ps(d + p * AVX2_NR + 8, avx2_load8(g, g->b, g->b_bf16, at + 8));
                } else {
                    int c = 0;
                    for (; c < cols; c++)
                        d[p * AVX2_NR + c] = regc_cpu_gemm_value(g, g->b, g->b_bf16, at + c);
                    for (; c < AVX2_NR; c++)
                        d[p * AVX2_NR + c] = 0.0f;
                }
            }
        } else { /* B is [n, k]: each column of op(B) is a contiguous row */
            for (int half = 0; half < AVX2_NR; half += 8)
                for (int64_t p = 0; p < kc; p += 8)
                    avx2_pack_b_rows8(d + p * AVX2_NR + half, g, j0 + jr + half, cols - half,
                                      p0 + p, (int)avx2_min(kc - p, 8));
        }
    }
}

/* The micro-kernel: t[r][c] = sum over p of a[p][r] * b[p][c], one fused
 * multiply-add per p, in 12 accumulators. a: [kc][MR] and b: [kc][NR],
 * packed. */
static void avx2_product(float *restrict t, int64_t kc, const void *restrict ap,
                         const void *restrict bp)
{
    const float *restrict a = ap, *restrict b = bp;
    __m256 acc[AVX2_MR][2]; /* the tile, row r in acc[r][0..1] */
#pragma GCC unroll 6
    for (int r = 0; r < AVX2_MR; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
#pragma GCC unroll 2 /* two steps a loop: 5 to 10% faster on Zen 3 than one */
    for (int64_t p = 0; p < kc; p++) {
        const __m256 b0 = _mm256_load_ps(b + p * AVX2_NR);
        const __m256 b1 = _mm256_load_ps(b + p * AVX2_NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < AVX2_MR; r++) {
            const __m256 ar = _mm256_broadcast_ss(a + p * AVX2_MR + r);
            acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < AVX2_MR; r++) {
        _mm256_store_ps(t + r * AVX2_NR, acc[r][0]);
        _mm256_store_ps(t + r * AVX2_NR + 8, acc[r][1]);
    }
}

const regc_cpu_gemm_kernel regc_cpu_sgemm_avx2 = {
    .name = "avx2",
    .mr = AVX2_MR,
    .nr = AVX2_NR,
    .kc = AVX2_KC,
    .k_unit = 1,
    .value_bytes = sizeof(float),
    .reads_bf16 = 1,
    .pack_a = avx2_pack_a,
    .pack_b = avx2_pack_b,
    .product = avx2_product,
};

#endif /* REGC_CPU_OWN_SGEMM */
