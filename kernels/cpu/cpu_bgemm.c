/* cpu_bgemm.c — the bf16 GEMM (regc_gemm.bf16) for CPUs with AVX-512 BF16:
 * C[m, n] = alpha op(A) op(B), or C + that, op(A) and op(B) rounded to
 * bfloat16 as they are packed and their products summed in fp32.
 *
 * The blocking, threading and epilogue are regc_cpu_gemm_blocked's
 * (cpu_sgemm.c); this file brings the packed format and the micro-kernel.
 * vdpbf16ps multiplies pairs along k, acc += a[2i] b[2i] + a[2i+1] b[2i+1]
 * in each 32-bit lane, twice the multiply-adds of an fp32 fma per
 * instruction, so both operands are packed with k taken in pairs (an odd k
 * padded with a zero):
 *   A panel [kc/2][MR] bf16 pairs: a row's pair broadcast as one 32-bit value
 *   B panel [kc/2][NR] bf16 pairs: 16 columns' pairs per 512-bit vector
 * The micro-kernel is sgemm's 12 x 32 tile with the fma replaced by the pair
 * product. Half the bytes per value means a slice of k twice as deep (KC)
 * in the same cache footprint, so C is read and written half as often.
 *
 * Rounding: regc_round_bf16 bit for bit, in integer operations
 * (regc_cpu_round_bf16_upper), not vcvtneps2bf16 or vcvtne2ps2bf16: those
 * treat a subnormal input as zero (Intel's manual: "input denormals are
 * always treated as zero"), giving +0 or -0 (checked on AMD Zen 5 for
 * 0x00000001, 0x00018000, 0x00400000, 0x007f7fff and 0x007fffff, the last
 * of which rounds to 2^-126), while regc_round_bf16 rounds them like any
 * value, as CUDA's __float2bfloat16_rn does; the two agree on the normal
 * values, ties, infinities, NaNs and overflows checked.
 *
 * vdpbf16ps itself ignores MXCSR, and per Intel's manual "output denormals
 * are always flushed to zero and input denormals are always treated as
 * zero"; checked on AMD Zen 5: a subnormal bf16 input counts as zero
 * (2^-127 * 2 gives 0), a subnormal product or sum is flushed (2^-126 *
 * 0.5 gives 0), and so is a subnormal accumulator (2^-149 + 0 gives 0). So bf16 operands below
 * 2^-126 in magnitude, and sums that fall below it, count as zero here, where the fp32 fallback
 * (cpu_sgemm.c with rounded operands) keeps them. Each of the two products of a pair is exact and
 * added in turn, the odd one first, each addition rounded to nearest even (acc = 1, products 2^-24
 * (1 + 2^-7) at 2i+1 and 2^-24 at 2i give 1 + 2^-22; swapped, 1 + 2^-23): fp32 sums of the exact
 * products, as the fma fallback computes them in another order.
 *
 * Operands held in bf16 (regc_gemm's a_bf16, b_bf16) are packed as they
 * are, without a fp32 copy: the values are widened as they are loaded, and
 * rounding keeps them.
 *
 * Every element of C is summed by one thread, pair after pair and slice
 * after slice in the same order, so the result does not depend on the
 * thread count.
 *
 * Built for AVX-512 BF16 whatever the build targets (the pragma below),
 * and run only where CPUID reports it (cpu_gemm.c). */
#include "cpu_kernels.h"
#include "regc_common.h"

#ifdef REGC_CPU_OWN_SGEMM

#include <immintrin.h> /* before the target below, as for every file */

#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma")

#include "cpu_avx512.h"

#define BGEMM_MR 12 /* the tile of cpu_sgemm_avx512.c */
#define BGEMM_NR 32
#define BGEMM_KC 512  /* a B panel, KC x NR bf16 = 32 KiB, as sgemm's 256 floats */
#define BGEMM_GROUP 4 /* B panels packed together from B [k, n]: 512 bytes of a row */

static int64_t bgemm_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* The first n of 16 lanes (n clamped to 0 .. 16). */
static __mmask16 bgemm_lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Two rows of 16 values, x0 at k = p and x1 at k = p + 1, as 16 bf16 pairs:
 * lane c = bf16(x0[c]) | bf16(x1[c]) << 16 (the even k in the low half, as
 * vdpbf16ps reads a pair). */
static inline __m512i bgemm_interleave(__m512 x0, __m512 x1)
{
    /* the upper half of each, x0's shifted down: a | (b & c) */
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(regc_cpu_round_bf16_upper(x0), 16),
                                     regc_cpu_round_bf16_upper(x1),
                                     _mm512_set1_epi32((int)0xffff0000u), 0xf8);
}

/* Values at..at+15 of an operand (the lanes `in`, zeros elsewhere) as
 * floats: an fp32 operand's own, or a bf16 operand's (regc_gemm's a_bf16,
 * b_bf16) widened, which are exact and which rounding then keeps. */
static inline __m512 bgemm_load(const void *base, int bf16, int64_t at, __mmask16 in)
{
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, (const uint16_t *)base + at)), 16));
    return _mm512_maskz_loadu_ps(in, (const float *)base + at);
}

/* Values at .. at+depth of an operand (depth <= 32, zeros after) as 16
 * bf16 pairs along k: lane i = bf16(s[2i]) | bf16(s[2i+1]) << 16. */
static inline __m512i bgemm_pairs(const void *base, int bf16, int64_t at, int depth)
{
    /* 16-bit word w of the result is the upper half of value w: word
     * 2w + 1 of the two sources taken as one 64-word table */
    const __m512i upper =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i lo = regc_cpu_round_bf16_upper(bgemm_load(base, bf16, at, bgemm_lanes(depth)));
    const __m512i hi =
        regc_cpu_round_bf16_upper(bgemm_load(base, bf16, at + 16, bgemm_lanes(depth - 16)));
    return _mm512_permutex2var_epi16(lo, upper, hi);
}

/* Up to 16 rows of an operand from value `at` on, row q at at + q *
 * ld_src (q < rows), contiguous along k, k values [0, depth) (depth <=
 * 32), as bf16 pairs transposed in registers: d[x * ld_d + q] = pair x of
 * row q, for x < depth / 2 rounded up, in the lanes `store` selects; rows
 * from `rows` on are zeros. */
static void bgemm_pack_rows16(uint32_t *restrict d, int64_t ld_d, __mmask16 store, const void *base,
                              int bf16, int64_t at, int64_t ld_src, int64_t rows, int depth)
{
    __m512 r[16]; /* [16 rows][16 pairs], then [16 pairs][16 rows] */
    for (int q = 0; q < 16; q++)
        r[q] = q < rows ? _mm512_castsi512_ps(bgemm_pairs(base, bf16, at + q * ld_src, depth))
                        : _mm512_setzero_ps();
    regc_cpu_transpose16(r);
    for (int x = 0; x < (depth + 1) / 2; x++)
        _mm512_mask_storeu_epi32(d + x * ld_d, store, _mm512_castps_si512(r[x]));
}

/* op(A)[i0 .. i0+mc, p0 .. p0+kc] as panels of MR rows, each [kc/2][MR]
 * pairs: pair (panel * kc/2 + x) * MR + r holds op(A)[i0 + panel * MR + r,
 * p0 + 2x] in its low half and p0 + 2x + 1 (zero past kc) in its high. */
static void bgemm_pack_a(void *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                         int64_t kc)
{
    const int64_t kc2 = (kc + 1) / 2;
    const __mmask16 tile_rows = bgemm_lanes(BGEMM_MR);
    if (g->trans_a) {
        /* A is [k, m]: a panel's MR values at each k are contiguous. Row
         * pair after row pair, each read straight across the block, for the
         * reason bgemm_pack_b gives. */
        for (int64_t x = 0; x < kc2; x++) {
            const int64_t s0 = (p0 + 2 * x) * g->lda + i0;         /* [mc] values from here */
            const int odd = 2 * x + 1 < kc;                        /* row p0 + 2x + 1 exists */
            uint32_t *restrict d = (uint32_t *)dst + x * BGEMM_MR; /* panel 0, pair row x */
            for (int64_t ir = 0; ir < mc; ir += BGEMM_MR, d += kc2 * BGEMM_MR) {
                const __mmask16 in = bgemm_lanes(bgemm_min(mc - ir, BGEMM_MR));
                const __m512 x0 = bgemm_load(g->a, g->a_bf16, s0 + ir, in);
                const __m512 x1 =
                    odd ? bgemm_load(g->a, g->a_bf16, s0 + g->lda + ir, in) : _mm512_setzero_ps();
                _mm512_mask_storeu_epi32(d, tile_rows, bgemm_interleave(x0, x1));
            }
        }
        return;
    }
    for (int64_t ir = 0; ir < mc; ir += BGEMM_MR) {
        /* A is [m, k]: each row is contiguous along k */
        const int64_t rows = bgemm_min(mc - ir, BGEMM_MR);
        uint32_t *restrict d = (uint32_t *)dst + ir * kc2; /* [kc/2][MR] bf16 pairs */
        const int64_t s = (i0 + ir) * g->lda + p0;         /* [rows][lda] values from here */
        for (int64_t p = 0; p < kc; p += 32)
            bgemm_pack_rows16(d + p / 2 * BGEMM_MR, BGEMM_MR, tile_rows, g->a, g->a_bf16, s + p,
                              g->lda, rows, (int)bgemm_min(kc - p, 32));
    }
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] as panels of NR columns, each [kc/2][NR]
 * pairs: pair (panel * kc/2 + x) * NR + c holds op(B)[p0 + 2x, j0 + panel *
 * NR + c] in its low half and p0 + 2x + 1 (zero past kc) in its high. */
static void bgemm_pack_b(void *restrict dst, const regc_gemm *g, int64_t j0, int64_t nc, int64_t p0,
                         int64_t kc)
{
    const int64_t kc2 = (kc + 1) / 2;
    if (!g->trans_b) {
        /* B is [k, n]: rows p and p + 1 of B give a row of pairs of every
         * panel. A group of panels at a time, row pair after row pair
         * across the group: a panel's width of a row is only 128 bytes, and
         * B's rows are most often pages apart, so panel after panel would
         * pay for the page of each row once per panel. */
        for (int64_t jg = 0; jg < nc; jg += BGEMM_GROUP * BGEMM_NR) {
            const int64_t gc = bgemm_min(nc - jg, BGEMM_GROUP * BGEMM_NR);
            for (int64_t x = 0; x < kc2; x++) {
                const int64_t s0 = (p0 + 2 * x) * g->ldb + j0 + jg; /* [gc] values from here */
                const int odd = 2 * x + 1 < kc;
                uint32_t *restrict d = (uint32_t *)dst + jg * kc2 + x * BGEMM_NR;
                for (int64_t jr = 0; jr < gc; jr += BGEMM_NR, d += kc2 * BGEMM_NR) {
                    for (int h = 0; h < BGEMM_NR; h += 16) {
                        const __mmask16 in = bgemm_lanes(gc - jr - h);
                        __m512 x0 = _mm512_setzero_ps(), x1 = x0;
                        if (in) { /* no pointer past the edge of B */
                            x0 = bgemm_load(g->b, g->b_bf16, s0 + jr + h, in);
                            if (odd)
                                x1 = bgemm_load(g->b, g->b_bf16, s0 + g->ldb + jr + h, in);
                        }
                        _mm512_store_si512(d + h, bgemm_interleave(x0, x1));
                    }
                }
            }
        }
        return;
    }
    for (int64_t jr = 0; jr < nc; jr += BGEMM_NR) {
        /* B is [n, k]: each column of op(B) is a contiguous row of B */
        const int64_t cols = bgemm_min(nc - jr, BGEMM_NR);
        uint32_t *restrict d = (uint32_t *)dst + jr * kc2; /* [kc/2][NR] bf16 pairs */
        for (int h = 0; h < BGEMM_NR; h += 16) {
            const int64_t s = (j0 + jr + h) * g->ldb + p0; /* [16][ldb] values from here */
            for (int64_t p = 0; p < kc; p += 32)
                bgemm_pack_rows16(d + p / 2 * BGEMM_NR + h, BGEMM_NR, bgemm_lanes(16), g->b,
                                  g->b_bf16, s + p, g->ldb, cols - h, (int)bgemm_min(kc - p, 32));
        }
    }
}

/* The micro-kernel: t[r][c] = sum over k of a[k][r] * b[k][c], one
 * vdpbf16ps (two k) per row and half-tile, in 24 vector registers.
 * a: [kc/2][MR] and b: [kc/2][NR] bf16 pairs, packed. */
static void bgemm_product(float *restrict t, int64_t kc, const void *restrict ap,
                          const void *restrict bp)
{
    const uint32_t *restrict a = ap, *restrict b = bp;
    const int64_t kc2 = (kc + 1) / 2;
    __m512 acc[BGEMM_MR][2]; /* the tile, row r in acc[r][0..1] */
#pragma GCC unroll 12
    for (int r = 0; r < BGEMM_MR; r++) {
        acc[r][0] = _mm512_setzero_ps();
        acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t x = 0; x < kc2; x++) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(b + x * BGEMM_NR);
        const __m512bh b1 = (__m512bh)_mm512_load_si512(b + x * BGEMM_NR + 16);
#pragma GCC unroll 12
        for (int r = 0; r < BGEMM_MR; r++) {
            const __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a[x * BGEMM_MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < BGEMM_MR; r++) {
        _mm512_store_ps(t + r * BGEMM_NR, acc[r][0]);
        _mm512_store_ps(t + r * BGEMM_NR + 16, acc[r][1]);
    }
}

const regc_cpu_gemm_kernel regc_cpu_bgemm_avx512bf16 = {
    .name = "avx512-bf16",
    .mr = BGEMM_MR,
    .nr = BGEMM_NR,
    .kc = BGEMM_KC,
    .k_unit = 2,
    .value_bytes = sizeof(uint16_t),
    .reads_bf16 = 1,
    .pack_a = bgemm_pack_a,
    .pack_b = bgemm_pack_b,
    .product = bgemm_product,
};

#endif /* REGC_CPU_OWN_SGEMM */
