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
 * A whole tile at alpha 1 goes from the accumulators straight into C
 * (avx2_product_c); op(A) is packed eight values at a time through 8 x 8
 * transposes in registers (regc_cpu_avx2_pack_a, which also packs the
 * AVX-512 kernel's panels of 12 rows).
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

/* Six floats of x at d: four and two, nothing past d[6). */
static inline void avx2_store6(float *d, __m256 x)
{
    _mm_storeu_ps(d, _mm256_castps256_ps128(x));
    _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(x, 1));
}

/* Rows i .. i+6G of op(A) for A stored [m, k], at columns p .. p+8 of its
 * k, into a panel of mr = 6G rows: d[q * mr + r] = op(A)[i + r, p + q].
 * Each group of six rows is transposed in registers (two rows of zeros);
 * each column's six values are stored as eight, the two extra ones
 * overwritten by the next group or column, in that order, except the last
 * (four and two), so nothing past d[8 * mr) is touched (masked stores are
 * several times slower on Zen 3). */
static inline __attribute__((always_inline)) void
avx2_pack_a_rows8(float *restrict d, int groups, const regc_gemm *g, int64_t i, int64_t p)
{
    const int mr = 6 * groups;
    __m256 r[2][8]; /* [group][column], groups <= 2 */
    for (int h = 0; h < groups; h++) {
        for (int c = 0; c < 6; c++)
            r[h][c] = avx2_load8(g, g->a, g->a_bf16, (i + 6 * h + c) * g->lda + p);
        r[h][6] = r[h][7] = _mm256_setzero_ps();
        regc_cpu_transpose8(r[h]);
    }
    for (int q = 0; q < 8; q++)
        for (int h = 0; h < groups; h++) {
            if (q == 7 && h == groups - 1)
                avx2_store6(d + q * mr + 6 * h, r[h][q]);
            else
                _mm256_storeu_ps(d + q * mr + 6 * h, r[h][q]);
        }
}

/* A panel of mr = 6G rows of op(A) from row i, for A stored [k, m], where
 * a group's six values at one p are contiguous: read as eight (the caller
 * sees that the row of A has them), stored as four and two. */
static inline __attribute__((always_inline)) void avx2_pack_a_cols(float *restrict d, int groups,
                                                                   const regc_gemm *g, int64_t i,
                                                                   int64_t p0, int64_t kc)
{
    for (int64_t p = 0; p < kc; p++)
        for (int h = 0; h < groups; h++)
            avx2_store6(d + p * 6 * groups + 6 * h,
                        avx2_load8(g, g->a, g->a_bf16, (p0 + p) * g->lda + i + 6 * h));
}

/* regc_cpu_pack_a_fp32 with mr six rows a group, in registers eight values
 * at a time where it can. */
static inline __attribute__((always_inline)) void avx2_pack_a_groups(float *restrict dst,
                                                                     int groups, const regc_gemm *g,
                                                                     int64_t i0, int64_t mc,
                                                                     int64_t p0, int64_t kc)
{
    const int mr = 6 * groups;
    int64_t ir = 0;
    if (g->trans_a) /* the last group's eight values within A's row */
        for (; ir + mr <= mc && i0 + ir + mr + 2 <= g->m; ir += mr)
            avx2_pack_a_cols(dst + ir * kc, groups, g, i0 + ir, p0, kc);
    else
        for (; ir + mr <= mc; ir += mr) {
            float *restrict d = dst + ir * kc; /* [kc][mr] */
            int64_t p = 0;
            for (; p + 8 <= kc; p += 8)
                avx2_pack_a_rows8(d + p * mr, groups, g, i0 + ir, p0 + p);
            for (; p < kc; p++) /* the end of k */
                for (int r = 0; r < mr; r++)
                    d[p * mr + r] =
                        regc_cpu_gemm_value(g, g->a, g->a_bf16, (i0 + ir + r) * g->lda + p0 + p);
        }
    if (ir < mc) /* panels at the end of A, past which eight values would read */
        regc_cpu_pack_a_fp32(dst + ir * kc, g, i0 + ir, mc - ir, p0, kc, mr);
}

void regc_cpu_avx2_pack_a(float *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc,
                          int64_t p0, int64_t kc, int mr)
{
    if (mr == 6)
        avx2_pack_a_groups(dst, 1, g, i0, mc, p0, kc);
    else if (mr == 12)
        avx2_pack_a_groups(dst, 2, g, i0, mc, p0, kc);
    else
        regc_cpu_pack_a_fp32(dst, g, i0, mc, p0, kc, mr);
}

static void avx2_pack_a(void *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                        int64_t kc)
{
    regc_cpu_avx2_pack_a(dst, g, i0, mc, p0, kc, AVX2_MR);
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

/* The micro-kernel's sums: acc[r][h] = sum over p of a[p][r] * b[p][8h ..
 * 8h+8], one fused multiply-add per p, in 12 accumulators. a: [kc][MR] and
 * b: [kc][NR], packed. Inlined into both of its stores below, so the tile
 * stays in registers. */
static inline __attribute__((always_inline)) void
avx2_sums(__m256 acc[AVX2_MR][2], int64_t kc, const float *restrict a, const float *restrict b)
{
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
}

/* t[r][c] = the tile's sums, t: [MR][NR]. */
static void avx2_product(float *restrict t, int64_t kc, const void *restrict ap,
                         const void *restrict bp)
{
    __m256 acc[AVX2_MR][2]; /* the tile, row r in acc[r][0..1] */
    avx2_sums(acc, kc, ap, bp);
#pragma GCC unroll 6
    for (int r = 0; r < AVX2_MR; r++) {
        _mm256_store_ps(t + r * AVX2_NR, acc[r][0]);
        _mm256_store_ps(t + r * AVX2_NR + 8, acc[r][1]);
    }
}

/* The whole tile of C at c (row stride ldc) = the sums, or C + them when
 * `add`: straight from the registers, without avx2_product's trip through
 * t (a few percent of a GEMM at m = 256). */
static void avx2_product_c(float *restrict c, int64_t ldc, int add, int64_t kc,
                           const void *restrict ap, const void *restrict bp)
{
    __m256 acc[AVX2_MR][2];
    avx2_sums(acc, kc, ap, bp);
    if (add)
#pragma GCC unroll 6
        for (int r = 0; r < AVX2_MR; r++) {
            float *restrict row = c + r * ldc; /* [NR] */
            _mm256_storeu_ps(row, _mm256_add_ps(_mm256_loadu_ps(row), acc[r][0]));
            _mm256_storeu_ps(row + 8, _mm256_add_ps(_mm256_loadu_ps(row + 8), acc[r][1]));
        }
    else
#pragma GCC unroll 6
        for (int r = 0; r < AVX2_MR; r++) {
            _mm256_storeu_ps(c + r * ldc, acc[r][0]);
            _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
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
    .product_c = avx2_product_c,
};

#endif /* REGC_CPU_OWN_SGEMM */
