/* cpu_sgemm_avx512.c — the fp32 GEMM kernel for CPUs with AVX-512
 * (regc_cpu_sgemm_avx512): a 12 x 32 register tile, 24 of the 32 vector
 * registers, one broadcast of A and two loads of B per 24 fused
 * multiply-adds. The loops around it are cpu_sgemm.c's.
 *
 * A bf16 GEMM (g->bf16) rounds every value as it is packed; operands held
 * in bf16 are widened before (cpu_gemm.c), as the CPUs that run this
 * kernel rather than the bf16 one are the few with AVX-512 but not its
 * BF16 extension.
 *
 * Built for AVX-512 whatever the build targets (the pragma below), and
 * run only where CPUID reports it (cpu_gemm.c). */
#include "cpu_kernels.h"
#include "regc_common.h"

#ifdef REGC_CPU_OWN_SGEMM

#include <immintrin.h> /* before the target below, as for every file */

#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")

#include "cpu_avx512.h"

#define SGEMM_MR 12  /* rows of a register tile: 12 x 2 accumulators */
#define SGEMM_NR 32  /* columns of a register tile: two 16-float vectors */
#define SGEMM_KC 256 /* a B panel, KC x NR floats = 32 KiB, most of a 48 KiB L1 */

static int64_t avx512_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* x as packed: itself, or rounded to bf16 for a bf16 GEMM */
static inline float sgemm_value(const regc_gemm *g, float x)
{
    return g->bf16 ? regc_round_bf16(x) : x;
}

static inline __m512 sgemm_values(const regc_gemm *g, __m512 x)
{
    return g->bf16 ? _mm512_castsi512_ps(regc_cpu_round_bf16_bits(x)) : x;
}

/* op(A) as panels of MR rows: AVX2's packing (an AVX-512 CPU has AVX2),
 * the values regc_cpu_pack_a_fp32 gives (tests/test_kernels_cpu_bf16.c
 * checks the two byte for byte on any CPU with AVX2) */
static void sgemm_pack_a(void *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                         int64_t kc)
{
    regc_cpu_avx2_pack_a(dst, g, i0, mc, p0, kc, SGEMM_MR);
}

/* For B stored [n, k]: 16 columns of op(B) from column j, rows p .. p+depth
 * (depth <= 16), are 16 rows of B; transposed in registers, they go to
 * d[q * NR + c] = op(B)[p + q, j + c] for q < depth, with zeros for
 * c >= cols (past the matrix edge). */
static void sgemm_pack_b_rows16(float *restrict d, const regc_gemm *g, int64_t j, int cols,
                                int64_t p, int depth)
{
    const __mmask16 in_depth = (__mmask16)((1u << depth) - 1u);
    __m512 r[16];
    for (int c = 0; c < 16; c++)
        r[c] = c < cols
                   ? sgemm_values(g, _mm512_maskz_loadu_ps(in_depth, g->b + (j + c) * g->ldb + p))
                   : _mm512_setzero_ps();
    regc_cpu_transpose16(r);
    for (int q = 0; q < depth; q++)
        _mm512_store_ps(d + q * SGEMM_NR, r[q]);
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] as panels of NR columns, each [kc][NR]:
 * dst[panel * kc * NR + p * NR + c] = op(B)[p0 + p, j0 + panel * NR + c] */
static void sgemm_pack_b(void *restrict dst, const regc_gemm *g, int64_t j0, int64_t nc, int64_t p0,
                         int64_t kc)
{
    for (int64_t jr = 0; jr < nc; jr += SGEMM_NR) {
        const int cols = (int)avx512_min(nc - jr, SGEMM_NR);
        float *restrict d = (float *)dst + jr * kc; /* [kc][NR] */
        if (!g->trans_b) { /* B is [k, n]: a panel's NR values are contiguous */
            for (int64_t p = 0; p < kc; p++) {
                const float *s = g->b + (p0 + p) * g->ldb + j0 + jr;
                if (cols == SGEMM_NR) {
                    _mm512_store_ps(d + p * SGEMM_NR, sgemm_values(g, _mm512_loadu_ps(s)));
                    _mm512_store_ps(d + p * SGEMM_NR + 16,
                                    sgemm_values(g, _mm512_loadu_ps(s + 16)));
                } else {
                    int c = 0;
                    for (; c < cols; c++)
                        d[p * SGEMM_NR + c] = sgemm_value(g, s[c]);
                    for (; c < SGEMM_NR; c++)
                        d[p * SGEMM_NR + c] = 0.0f;
                }
            }
        } else { /* B is [n, k]: each column of op(B) is a contiguous row */
            for (int half = 0; half < SGEMM_NR; half += 16)
                for (int64_t p = 0; p < kc; p += 16)
                    sgemm_pack_b_rows16(d + p * SGEMM_NR + half, g, j0 + jr + half, cols - half,
                                        p0 + p, (int)avx512_min(kc - p, 16));
        }
    }
}

/* The micro-kernel: t[r][c] = sum over p of a[p][r] * b[p][c], one fused
 * multiply-add per p, in 24 vector registers. a: [kc][MR] and b: [kc][NR],
 * packed. */
static void sgemm_product(float *restrict t, int64_t kc, const void *restrict ap,
                          const void *restrict bp)
{
    const float *restrict a = ap, *restrict b = bp;
    __m512 acc[SGEMM_MR][2]; /* the tile, row r in acc[r][0..1] */
#pragma GCC unroll 12
    for (int r = 0; r < SGEMM_MR; r++) {
        acc[r][0] = _mm512_setzero_ps();
        acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_load_ps(b + p * SGEMM_NR);
        const __m512 b1 = _mm512_load_ps(b + p * SGEMM_NR + 16);
#pragma GCC unroll 12
        for (int r = 0; r < SGEMM_MR; r++) {
            const __m512 ar = _mm512_set1_ps(a[p * SGEMM_MR + r]);
            acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < SGEMM_MR; r++) {
        _mm512_store_ps(t + r * SGEMM_NR, acc[r][0]);
        _mm512_store_ps(t + r * SGEMM_NR + 16, acc[r][1]);
    }
}

const regc_cpu_gemm_kernel regc_cpu_sgemm_avx512 = {
    .name = "avx512",
    .mr = SGEMM_MR,
    .nr = SGEMM_NR,
    .kc = SGEMM_KC,
    .k_unit = 1,
    .value_bytes = sizeof(float),
    .pack_a = sgemm_pack_a,
    .pack_b = sgemm_pack_b,
    .product = sgemm_product,
};

#endif /* REGC_CPU_OWN_SGEMM */
