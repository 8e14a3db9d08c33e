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
 * Where a thread's rows fit one A block (m <= MC, as for a small batch of
 * tokens), each B panel serves one row of tiles, and B is packed a strip
 * of panels at a time just before them instead, the next strip's op(B)
 * fetched from memory while the tiles run (sgemm_compute_rows); in the
 * loops above, the next A block is fetched likewise. Neither changes which
 * products are summed, or in what order.
 *
 * Threads own disjoint blocks of C (panels of columns when n >= m, else of
 * rows), and every element of C is summed by one thread, slice after slice
 * in the same order, so the result does not depend on the thread count.
 * The calls run in regc's OpenMP team: no second thread pool.
 *
 * The epilogue writes C and aux while other tiles still read A and B, so
 * neither may overlap A or B (as with cuBLASLt).
 *
 * The loops above are regc_cpu_gemm_blocked, shared with the bf16 kernel
 * (cpu_bgemm.c), which brings its own packing and micro-kernel
 * (regc_cpu_gemm_kernel); this file's are fp32. Where that kernel is not
 * built, a bf16 GEMM runs here with every packed value rounded to bf16: a
 * product of two bf16 values is exact in fp32, so the fused multiply-adds
 * give the products of the rounded operands summed in fp32.
 *
 * Built only where the compiler targets AVX-512 (cpu_gemm.c calls OpenBLAS
 * elsewhere). */
#include "cpu_kernels.h"
#include "regc_common.h"

#ifdef REGC_CPU_OWN_SGEMM

#include <immintrin.h>

#define SGEMM_MR REGC_CPU_GEMM_MR /* rows of a register tile: 12 x 2 accumulators */
#define SGEMM_NR REGC_CPU_GEMM_NR /* columns of a register tile: two 16-float vectors */
#define SGEMM_KC 256              /* a B panel, KC x NR floats = 32 KiB, most of a 48 KiB L1 */
#define SGEMM_MC 264              /* an A block, MC x KC floats = 264 KiB, fits L2 */
#define SGEMM_NC 4096             /* a B block, KC x NC floats = 4 MiB */
#define SGEMM_STRIP 2             /* B panels packed at a time where m fits one A block */

/* Below this many multiply-adds one thread does the whole product. */
#define SGEMM_PAR_MIN (1 << 18)

static int64_t sgemm_round_up(int64_t x, int64_t unit) { return (x + unit - 1) / unit * unit; }

static int64_t sgemm_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* x as packed: itself, or rounded to bf16 for a bf16 GEMM */
static inline float sgemm_value(const regc_gemm *g, float x)
{
    return g->bf16 ? regc_round_bf16(x) : x;
}

static inline __m512 sgemm_values(const regc_gemm *g, __m512 x)
{
    return g->bf16 ? _mm512_castsi512_ps(regc_cpu_round_bf16_bits(x)) : x;
}

/* op(A)[i0 .. i0+mc, p0 .. p0+kc] as panels of MR rows, each [kc][MR]:
 * dst[panel * kc * MR + p * MR + r] = op(A)[i0 + panel * MR + r, p0 + p] */
static void sgemm_pack_a(void *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                         int64_t kc)
{
    for (int64_t ir = 0; ir < mc; ir += SGEMM_MR) {
        const int rows = (int)sgemm_min(mc - ir, SGEMM_MR);
        float *restrict d = (float *)dst + ir * kc; /* [kc][MR] */
        if (g->trans_a) { /* A is [k, m]: a panel's MR values are contiguous */
            for (int64_t p = 0; p < kc; p++) {
                const float *s = g->a + (p0 + p) * g->lda + i0 + ir;
                int r = 0;
                for (; r < rows; r++)
                    d[p * SGEMM_MR + r] = sgemm_value(g, s[r]);
                for (; r < SGEMM_MR; r++)
                    d[p * SGEMM_MR + r] = 0.0f;
            }
        } else { /* A is [m, k]: each row is contiguous */
            for (int r = 0; r < rows; r++) {
                const float *s = g->a + (i0 + ir + r) * g->lda + p0;
                for (int64_t p = 0; p < kc; p++)
                    d[p * SGEMM_MR + r] = sgemm_value(g, s[p]);
            }
            for (int r = rows; r < SGEMM_MR; r++)
                for (int64_t p = 0; p < kc; p++)
                    d[p * SGEMM_MR + r] = 0.0f;
        }
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
        const int cols = (int)sgemm_min(nc - jr, SGEMM_NR);
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
                                        p0 + p, (int)sgemm_min(kc - p, 16));
        }
    }
}

/* The micro-kernel: t[r][c] = sum over p of a[p][r] * b[p][c], one fused
 * multiply-add per p, in 24 vector registers. a: [kc][MR] and b: [kc][NR],
 * packed. */
static void sgemm_product(float t[SGEMM_MR][SGEMM_NR], int64_t kc, const void *restrict ap,
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
        _mm512_store_ps(t[r], acc[r][0]);
        _mm512_store_ps(t[r] + 16, acc[r][1]);
    }
}

static const regc_cpu_gemm_kernel sgemm_kernel = {
    .kc = SGEMM_KC,
    .k_unit = 1,
    .value_bytes = sizeof(float),
    .pack_a = sgemm_pack_a,
    .pack_b = sgemm_pack_b,
    .product = sgemm_product,
};

/* One thread's packing buffers for g: an A block and a B block, each a
 * whole number of cache lines, no larger than g needs. */
static void sgemm_pack_sizes(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, size_t *a_bytes,
                             size_t *b_bytes)
{
    const int64_t kc = sgemm_round_up(sgemm_min(g->k, kern->kc), kern->k_unit);
    const int64_t vb = (int64_t)kern->value_bytes;
    *a_bytes =
        (size_t)sgemm_round_up(sgemm_min(sgemm_round_up(g->m, SGEMM_MR), SGEMM_MC) * kc * vb, 64);
    *b_bytes =
        (size_t)sgemm_round_up(kc * sgemm_min(sgemm_round_up(g->n, SGEMM_NR), SGEMM_NC) * vb, 64);
}

/* The rows x cols tile (at most MR x NR) of C at [i, j] becomes alpha * t,
 * added to what C holds when `add`; with `epilogue` the elementwise
 * epilogue follows while the tile is in L1, and with out16 (the last
 * slice of a C held in bf16) its rounding into out16->c. */
static void sgemm_store_tile(const regc_gemm *g, float t[SGEMM_MR][SGEMM_NR], int64_t i, int64_t j,
                             int rows, int cols, int add, int epilogue, const regc_gemm *out16)
{
    float *c = g->c + i * g->ldc + j; /* [rows, ldc] */
    const int64_t ldc = g->ldc;
    const __m512 va = _mm512_set1_ps(g->alpha);
    if (rows == SGEMM_MR && cols == SGEMM_NR) {
#pragma GCC unroll 12
        for (int r = 0; r < SGEMM_MR; r++) {
            float *cr = c + r * ldc;
            __m512 x0 = _mm512_mul_ps(va, _mm512_load_ps(t[r]));
            __m512 x1 = _mm512_mul_ps(va, _mm512_load_ps(t[r] + 16));
            if (add) {
                x0 = _mm512_add_ps(_mm512_loadu_ps(cr), x0);
                x1 = _mm512_add_ps(_mm512_loadu_ps(cr + 16), x1);
            }
            _mm512_storeu_ps(cr, x0);
            _mm512_storeu_ps(cr + 16, x1);
        }
    } else { /* a partial tile at the edge of C: the same sums, stored in part */
        for (int r = 0; r < rows; r++)
            for (int q = 0; q < cols; q++) {
                const float x = g->alpha * t[r][q];
                c[r * ldc + q] = add ? c[r * ldc + q] + x : x;
            }
    }
    if (epilogue)
        for (int r = 0; r < rows; r++)
            regc_cpu_apply_epilogue_span(g, i + r, j, cols);
    if (out16)
        for (int r = 0; r < rows; r++)
            regc_cpu_store_bf16((uint16_t *)out16->c + (i + r) * out16->ldc + j,
                                g->c + (i + r) * g->ldc + j, cols);
}

/* Part `part` of `parts` of the cache lines of x[r0 .. r0+rows, c0 .. c0+cols]
 * (row stride ld), fetched ahead of their packing while tiles are
 * multiplied: the parts spread the fetches, which the hardware then serves
 * beside the arithmetic rather than as one burst. Into L1 (T0): on AMD
 * Zen 5, lines fetched for L2 alone (T1, T2) were read back two to four
 * times slower than those, where their rows lie pages apart as op(B)'s
 * rows of weights [k, n] do. Always inlined: GCC takes a function that only
 * prefetches for one without effects and drops its calls. */
static inline __attribute__((always_inline)) void
sgemm_prefetch_rect(const void *x, int64_t elem, int64_t ld, int64_t r0, int64_t rows, int64_t c0,
                    int64_t cols, int64_t part, int64_t parts)
{
    /* lines a row can touch: its bytes, plus one where it starts mid-line */
    const int64_t per_row = (cols * elem + 63) / 64 + 1;
    const int64_t lo = rows * per_row * part / parts, hi = rows * per_row * (part + 1) / parts;
    int64_t r = lo / per_row, l = lo % per_row;
    for (int64_t t = lo; t < hi; r++, l = 0) {
        const char *row = (const char *)x + ((r0 + r) * ld + c0) * elem; /* [cols] values */
        const uintptr_t first = (uintptr_t)row & ~(uintptr_t)63,
                        last = (uintptr_t)(row + (cols - 1) * elem);
        for (; l < per_row && t < hi; l++, t++)
            if (first + 64 * (uintptr_t)l <= last)
                _mm_prefetch((const char *)(first + 64 * (uintptr_t)l), _MM_HINT_T0);
    }
}

/* Part `part` of `parts` of op(A)[i0 .. i0+mc, p0 .. p0+kc] as stored. */
static inline __attribute__((always_inline)) void sgemm_prefetch_a(const regc_gemm *g, int64_t i0,
                                                                   int64_t mc, int64_t p0,
                                                                   int64_t kc, int64_t part,
                                                                   int64_t parts)
{
    const int64_t elem = g->a_bf16 ? 2 : 4; /* bytes of a value as stored */
    if (g->trans_a)                         /* A is [k, m] */
        sgemm_prefetch_rect(g->a, elem, g->lda, p0, kc, i0, mc, part, parts);
    else
        sgemm_prefetch_rect(g->a, elem, g->lda, i0, mc, p0, kc, part, parts);
}

/* Part `part` of `parts` of op(B)[p0 .. p0+kc, j0 .. j0+nc] as stored. */
static inline __attribute__((always_inline)) void sgemm_prefetch_b(const regc_gemm *g, int64_t j0,
                                                                   int64_t nc, int64_t p0,
                                                                   int64_t kc, int64_t part,
                                                                   int64_t parts)
{
    const int64_t elem = g->b_bf16 ? 2 : 4;
    if (g->trans_b) /* B is [n, k] */
        sgemm_prefetch_rect(g->b, elem, g->ldb, j0, nc, p0, kc, part, parts);
    else
        sgemm_prefetch_rect(g->b, elem, g->ldb, p0, kc, j0, nc, part, parts);
}

/* sgemm_compute_block where the rows fit one A block (m1 - m0 <= MC), as
 * in the GEMMs of a small batch of tokens (m = 256), whose op(B) is then
 * mostly weights that no earlier kernel left in the caches. Each B panel is
 * used by one row of tiles only, so B is packed a strip of panels at a
 * time, just before its tiles, rather than a whole block ahead (4 MiB of
 * fp32, out of L2), and while those tiles run the next strip's op(B), the
 * next columns or the next slice's first, is fetched a part after each
 * tile: its reads from memory overlap the arithmetic instead of stalling
 * the packing. Each tile's sums come slice after slice as in the general
 * loop, in the same order. */
static void sgemm_compute_rows(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, int64_t m0,
                               int64_t m1, int64_t n0, int64_t n1, int elementwise, char *apack,
                               char *bpack, const regc_gemm *out16)
{
    float t[SGEMM_MR][SGEMM_NR] __attribute__((aligned(64))); /* one tile's sums */
    const int64_t mc = m1 - m0, tiles = (mc + SGEMM_MR - 1) / SGEMM_MR;
    const int64_t strip = SGEMM_STRIP * SGEMM_NR;
    for (int64_t p0 = 0; p0 < g->k; p0 += kern->kc) {
        const int64_t kc = sgemm_min(g->k - p0, kern->kc);
        const int64_t stride = sgemm_round_up(kc, kern->k_unit) * (int64_t)kern->value_bytes;
        const int add = g->accumulate || p0 > 0;
        const int epilogue = elementwise && p0 + kc == g->k;
        const regc_gemm *last16 = p0 + kc == g->k ? out16 : NULL;
        kern->pack_a(apack, g, m0, mc, p0, kc);
        for (int64_t j0 = n0; j0 < n1; j0 += strip) {
            const int64_t nc = sgemm_min(n1 - j0, strip);
            kern->pack_b(bpack, g, j0, nc, p0, kc);
            const int64_t next_j0 = j0 + strip < n1 ? j0 + strip : n0;
            const int64_t next_p0 = j0 + strip < n1 ? p0 : p0 + kern->kc;
            const int64_t next_nc = sgemm_min(n1 - next_j0, strip);
            const int64_t next_kc = sgemm_min(g->k - next_p0, kern->kc); /* <= 0 past k */
            const int64_t parts = (nc + SGEMM_NR - 1) / SGEMM_NR * tiles;
            int64_t part = 0;
            for (int64_t jr = 0; jr < nc; jr += SGEMM_NR) {
                const int cols = (int)sgemm_min(nc - jr, SGEMM_NR);
                for (int64_t ir = 0; ir < mc; ir += SGEMM_MR, part++) {
                    const int rows = (int)sgemm_min(mc - ir, SGEMM_MR);
                    kern->product(t, kc, apack + ir * stride, bpack + jr * stride);
                    sgemm_store_tile(g, t, m0 + ir, j0 + jr, rows, cols, add, epilogue, last16);
                    if (next_kc > 0)
                        sgemm_prefetch_b(g, next_j0, next_nc, next_p0, next_kc, part, parts);
                }
            }
        }
    }
}

/* The block [m0, m1) x [n0, n1) of C, by one thread with its own buffers
 * apack (an A block) and bpack (a B block). */
static void sgemm_compute_block(const regc_gemm *g, const regc_cpu_gemm_kernel *kern, int64_t m0,
                                int64_t m1, int64_t n0, int64_t n1, char *apack, char *bpack,
                                const regc_gemm *out16)
{
    /* BGRAD's sums are of B and DGELU_BGRAD's of all of C: both come after */
    const int elementwise = g->epilogue != REGC_EPI_NONE && g->epilogue != REGC_EPI_BGRAD &&
                            g->epilogue != REGC_EPI_DGELU_BGRAD;
    if (m1 - m0 <= SGEMM_MC) {
        sgemm_compute_rows(g, kern, m0, m1, n0, n1, elementwise, apack, bpack, out16);
        return;
    }
    float t[SGEMM_MR][SGEMM_NR] __attribute__((aligned(64))); /* one tile's sums */
    for (int64_t j0 = n0; j0 < n1; j0 += SGEMM_NC) {
        const int64_t nc = sgemm_min(n1 - j0, SGEMM_NC);
        for (int64_t p0 = 0; p0 < g->k; p0 += kern->kc) {
            const int64_t kc = sgemm_min(g->k - p0, kern->kc);
            /* bytes per row (A) or column (B) of a packed panel */
            const int64_t stride = sgemm_round_up(kc, kern->k_unit) * (int64_t)kern->value_bytes;
            const int add = g->accumulate || p0 > 0;             /* later slices add to C */
            const int epilogue = elementwise && p0 + kc == g->k; /* after the last slice */
            const regc_gemm *last16 = p0 + kc == g->k ? out16 : NULL;
            kern->pack_b(bpack, g, j0, nc, p0, kc);
            for (int64_t i0 = m0; i0 < m1; i0 += SGEMM_MC) {
                const int64_t mc = sgemm_min(m1 - i0, SGEMM_MC);
                kern->pack_a(apack, g, i0, mc, p0, kc);
                /* the next A block is fetched while this one's tiles run:
                 * with m in the tens of thousands (the vocabulary) op(A) is
                 * too large to stay in the caches from the kernel before */
                const int64_t next_mc = sgemm_min(m1 - i0 - SGEMM_MC, SGEMM_MC); /* <= 0: none */
                const int64_t parts =
                    (nc + SGEMM_NR - 1) / SGEMM_NR * ((mc + SGEMM_MR - 1) / SGEMM_MR);
                int64_t part = 0;
                for (int64_t jr = 0; jr < nc; jr += SGEMM_NR) {
                    const int cols = (int)sgemm_min(nc - jr, SGEMM_NR);
                    for (int64_t ir = 0; ir < mc; ir += SGEMM_MR, part++) {
                        const int rows = (int)sgemm_min(mc - ir, SGEMM_MR);
                        kern->product(t, kc, apack + ir * stride, bpack + jr * stride);
                        sgemm_store_tile(g, t, i0 + ir, j0 + jr, rows, cols, add, epilogue, last16);
                        if (next_mc > 0)
                            sgemm_prefetch_a(g, i0 + SGEMM_MC, next_mc, p0, kc, part, parts);
                    }
                }
            }
        }
    }
}

int regc_cpu_gemm_blocked(regc_backend *be, const regc_gemm *g, const regc_cpu_gemm_kernel *kern,
                          const regc_gemm *out16)
{
    const int threads = regc_cpu_threads(be);
    size_t a_bytes, b_bytes;
    sgemm_pack_sizes(g, kern, &a_bytes, &b_bytes);
    char *pack = regc_cpu_get_scratch(be, (size_t)threads * (a_bytes + b_bytes));
    if (!pack)
        return REGC_ERR_MEMORY;
    const double madds = (double)g->m * (double)g->n * (double)g->k;
#pragma omp parallel num_threads(threads) if (madds >= (double)SGEMM_PAR_MIN *                     \
                                                           (double)regc_cpu_par_scale(be))
    {
        char *apack = pack + (size_t)omp_get_thread_num() * (a_bytes + b_bytes);
        char *bpack = apack + a_bytes;
        int64_t lo, hi;
        if (g->n >= g->m) {
            regc_cpu_team_range(g->n, SGEMM_NR, &lo, &hi);
            if (lo < hi)
                sgemm_compute_block(g, kern, 0, g->m, lo, hi, apack, bpack, out16);
        } else {
            regc_cpu_team_range(g->m, SGEMM_MR, &lo, &hi);
            if (lo < hi)
                sgemm_compute_block(g, kern, lo, hi, 0, g->n, apack, bpack, out16);
        }
    }
    return REGC_OK;
}

int regc_cpu_sgemm(regc_backend *be, const regc_gemm *g, const regc_gemm *out16)
{
    return regc_cpu_gemm_blocked(be, g, &sgemm_kernel, out16);
}

#endif /* REGC_CPU_OWN_SGEMM */
