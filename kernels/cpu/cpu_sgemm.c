/* cpu_sgemm.c — regc's own single-precision GEMM for CPUs with AVX-512:
 * C[m, n] = alpha op(A) op(B), or C + that, all row-major.
 *
 * The blocking of Goto and van de Geijn (as in BLIS), in row-major terms:
 *
 *   for each block of NC columns of C:
 *     for each slice of KC along k:
 *       pack op(B)[KC, NC] as panels of NR columns          (L3)
 *       for each block of MC rows of C:
 *         pack op(A)[MC, KC] as panels of MR rows           (L2)
 *         for each B panel, for each A panel:
 *           one MR x NR tile of C in 24 vector registers   (B panel in L1)
 *           on the last slice, the epilogue on that tile     (C tile in L1)
 *
 * Packing lays each panel out in the order the micro-kernel reads it, with
 * zeros past the matrix edge, so the micro-kernel has no edge cases; only
 * the store of a partial tile does.
 *
 * Threads own disjoint blocks of C (panels of columns when n >= m, else of
 * rows), and every element of C is summed by one thread, slice after slice
 * in the same order, so the result does not depend on the thread count.
 * The calls run in regc's OpenMP team: no second thread pool.
 *
 * The epilogue writes C and aux while other tiles still read A and B, so
 * neither may overlap A or B (as with cuBLASLt).
 *
 * Built only where the compiler targets AVX-512 (cpu_gemm.c calls OpenBLAS
 * elsewhere). */
#include "cpu_kernels.h"
#include "regc_common.h"

#ifdef REGC_CPU_OWN_SGEMM

#include <immintrin.h>

#define SGEMM_MR 12   /* rows of a register tile: 12 x 2 accumulators */
#define SGEMM_NR 32   /* columns of a register tile: two 16-float vectors */
#define SGEMM_KC 256  /* a B panel, KC x NR floats = 32 KiB, most of a 48 KiB L1 */
#define SGEMM_MC 264  /* an A block, MC x KC floats = 264 KiB, fits L2 */
#define SGEMM_NC 4096 /* a B block, KC x NC floats = 4 MiB */

/* Below this many multiply-adds one thread does the whole product. */
#define SGEMM_PAR_MIN (1 << 18)

static int64_t sgemm_round_up(int64_t x, int64_t unit) { return (x + unit - 1) / unit * unit; }

static int64_t sgemm_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* One thread's packing buffers for g: an A block and a B block, each a
 * whole number of cache lines (16 floats), no larger than g needs. */
static void sgemm_pack_sizes(const regc_gemm *g, size_t *a_floats, size_t *b_floats)
{
    const int64_t kc = sgemm_min(g->k, SGEMM_KC);
    *a_floats =
        (size_t)sgemm_round_up(sgemm_min(sgemm_round_up(g->m, SGEMM_MR), SGEMM_MC) * kc, 16);
    *b_floats =
        (size_t)sgemm_round_up(kc * sgemm_min(sgemm_round_up(g->n, SGEMM_NR), SGEMM_NC), 16);
}

/* op(A)[i0 .. i0+mc, p0 .. p0+kc] as panels of MR rows, each [kc][MR]:
 * dst[panel * kc * MR + p * MR + r] = op(A)[i0 + panel * MR + r, p0 + p] */
static void sgemm_pack_a(float *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc,
                         int64_t p0, int64_t kc)
{
    for (int64_t ir = 0; ir < mc; ir += SGEMM_MR) {
        const int rows = (int)sgemm_min(mc - ir, SGEMM_MR);
        float *restrict d = dst + ir * kc; /* [kc][MR] */
        if (g->trans_a) {                  /* A is [k, m]: a panel's MR values are contiguous */
            for (int64_t p = 0; p < kc; p++) {
                const float *s = g->a + (p0 + p) * g->lda + i0 + ir;
                int r = 0;
                for (; r < rows; r++)
                    d[p * SGEMM_MR + r] = s[r];
                for (; r < SGEMM_MR; r++)
                    d[p * SGEMM_MR + r] = 0.0f;
            }
        } else { /* A is [m, k]: each row is contiguous */
            for (int r = 0; r < rows; r++) {
                const float *s = g->a + (i0 + ir + r) * g->lda + p0;
                for (int64_t p = 0; p < kc; p++)
                    d[p * SGEMM_MR + r] = s[p];
            }
            for (int r = rows; r < SGEMM_MR; r++)
                for (int64_t p = 0; p < kc; p++)
                    d[p * SGEMM_MR + r] = 0.0f;
        }
    }
}

/* r[i] holds row i of a 16 x 16 block; afterwards r[j] holds column j. */
static inline void sgemm_transpose16(__m512 r[16])
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
        r[c] = c < cols ? _mm512_maskz_loadu_ps(in_depth, g->b + (j + c) * g->ldb + p)
                        : _mm512_setzero_ps();
    sgemm_transpose16(r);
    for (int q = 0; q < depth; q++)
        _mm512_store_ps(d + q * SGEMM_NR, r[q]);
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] as panels of NR columns, each [kc][NR]:
 * dst[panel * kc * NR + p * NR + c] = op(B)[p0 + p, j0 + panel * NR + c] */
static void sgemm_pack_b(float *restrict dst, const regc_gemm *g, int64_t j0, int64_t nc,
                         int64_t p0, int64_t kc)
{
    for (int64_t jr = 0; jr < nc; jr += SGEMM_NR) {
        const int cols = (int)sgemm_min(nc - jr, SGEMM_NR);
        float *restrict d = dst + jr * kc; /* [kc][NR] */
        if (!g->trans_b) {                 /* B is [k, n]: a panel's NR values are contiguous */
            for (int64_t p = 0; p < kc; p++) {
                const float *s = g->b + (p0 + p) * g->ldb + j0 + jr;
                if (cols == SGEMM_NR) {
                    _mm512_store_ps(d + p * SGEMM_NR, _mm512_loadu_ps(s));
                    _mm512_store_ps(d + p * SGEMM_NR + 16, _mm512_loadu_ps(s + 16));
                } else {
                    int c = 0;
                    for (; c < cols; c++)
                        d[p * SGEMM_NR + c] = s[c];
                    for (; c < SGEMM_NR; c++)
                        d[p * SGEMM_NR + c] = 0.0f;
                }
            }
        } else { /* B is [n, k]: each column of op(B) is a contiguous row */
            for (int half = 0; half < SGEMM_NR; half += 16)
                for (int64_t p = 0; p < kc; p += 16)
                    sgemm_pack_b_rows16(d + p * SGEMM_NR + half, g, j0 + jr + half, cols - half,
                                        p0 + p, (int)sgemm_min(kc - p, 16));
        }
    }
}

/* The micro-kernel: the rows x cols tile (at most MR x NR) of C at [i, j]
 * becomes alpha * sum over p of a[p][r] * b[p][c], added to what C holds
 * when `add`; with `epilogue` the elementwise epilogue follows while the
 * tile is in L1. a: [kc][MR] and b: [kc][NR], packed. */
static void sgemm_compute_tile(const regc_gemm *g, int64_t kc, const float *restrict a,
                               const float *restrict b, int64_t i, int64_t j, int rows, int cols,
                               int add, int epilogue)
{
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

    float *c = g->c + i * g->ldc + j; /* [rows, ldc] */
    const int64_t ldc = g->ldc;
    const __m512 va = _mm512_set1_ps(g->alpha);
    if (rows == SGEMM_MR && cols == SGEMM_NR) {
#pragma GCC unroll 12
        for (int r = 0; r < SGEMM_MR; r++) {
            float *cr = c + r * ldc;
            __m512 x0 = _mm512_mul_ps(va, acc[r][0]), x1 = _mm512_mul_ps(va, acc[r][1]);
            if (add) {
                x0 = _mm512_add_ps(_mm512_loadu_ps(cr), x0);
                x1 = _mm512_add_ps(_mm512_loadu_ps(cr + 16), x1);
            }
            _mm512_storeu_ps(cr, x0);
            _mm512_storeu_ps(cr + 16, x1);
        }
    } else { /* a partial tile at the edge of C: the same sums, stored in part */
        float t[SGEMM_MR][SGEMM_NR] __attribute__((aligned(64)));
        for (int r = 0; r < SGEMM_MR; r++) {
            _mm512_store_ps(t[r], _mm512_mul_ps(va, acc[r][0]));
            _mm512_store_ps(t[r] + 16, _mm512_mul_ps(va, acc[r][1]));
        }
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < cols; q++)
                c[r * ldc + q] = add ? c[r * ldc + q] + t[r][q] : t[r][q];
    }
    if (epilogue)
        for (int r = 0; r < rows; r++)
            regc_cpu_apply_epilogue_span(g, i + r, j, cols);
}

/* The block [m0, m1) x [n0, n1) of C, by one thread with its own buffers
 * apack ([MC / MR][KC][MR] at most) and bpack ([NC / NR][KC][NR] at most). */
static void sgemm_compute_block(const regc_gemm *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                                float *apack, float *bpack)
{
    /* BGRAD's sums are of B and DGELU_BGRAD's of all of C: both come after */
    const int elementwise = g->epilogue != REGC_EPI_NONE && g->epilogue != REGC_EPI_BGRAD &&
                            g->epilogue != REGC_EPI_DGELU_BGRAD;
    for (int64_t j0 = n0; j0 < n1; j0 += SGEMM_NC) {
        const int64_t nc = sgemm_min(n1 - j0, SGEMM_NC);
        for (int64_t p0 = 0; p0 < g->k; p0 += SGEMM_KC) {
            const int64_t kc = sgemm_min(g->k - p0, SGEMM_KC);
            const int add = g->accumulate || p0 > 0;             /* later slices add to C */
            const int epilogue = elementwise && p0 + kc == g->k; /* after the last slice */
            sgemm_pack_b(bpack, g, j0, nc, p0, kc);
            for (int64_t i0 = m0; i0 < m1; i0 += SGEMM_MC) {
                const int64_t mc = sgemm_min(m1 - i0, SGEMM_MC);
                sgemm_pack_a(apack, g, i0, mc, p0, kc);
                for (int64_t jr = 0; jr < nc; jr += SGEMM_NR) {
                    const int cols = (int)sgemm_min(nc - jr, SGEMM_NR);
                    for (int64_t ir = 0; ir < mc; ir += SGEMM_MR) {
                        const int rows = (int)sgemm_min(mc - ir, SGEMM_MR);
                        sgemm_compute_tile(g, kc, apack + ir * kc, bpack + jr * kc, i0 + ir,
                                           j0 + jr, rows, cols, add, epilogue);
                    }
                }
            }
        }
    }
}

int regc_cpu_sgemm(regc_backend *be, const regc_gemm *g)
{
    const int threads = regc_cpu_threads(be);
    size_t a_floats, b_floats;
    sgemm_pack_sizes(g, &a_floats, &b_floats);
    float *pack = regc_cpu_get_scratch(be, (size_t)threads * (a_floats + b_floats) * sizeof(float));
    if (!pack)
        return REGC_ERR_MEMORY;
    const double madds = (double)g->m * (double)g->n * (double)g->k;
#pragma omp parallel num_threads(threads) if (madds >= (double)SGEMM_PAR_MIN *                     \
                                                           (double)regc_cpu_par_scale(be))
    {
        float *apack = pack + (size_t)omp_get_thread_num() * (a_floats + b_floats);
        float *bpack = apack + a_floats;
        int64_t lo, hi;
        if (g->n >= g->m) {
            regc_cpu_team_range(g->n, SGEMM_NR, &lo, &hi);
            if (lo < hi)
                sgemm_compute_block(g, 0, g->m, lo, hi, apack, bpack);
        } else {
            regc_cpu_team_range(g->m, SGEMM_MR, &lo, &hi);
            if (lo < hi)
                sgemm_compute_block(g, lo, hi, 0, g->n, apack, bpack);
        }
    }
    return REGC_OK;
}

#endif /* REGC_CPU_OWN_SGEMM */
