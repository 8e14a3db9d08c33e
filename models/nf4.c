/* nf4.c — NF4, QLoRA's 4-bit format (kernels/nf4_format.h), quantised and
 * dequantised on the host byte for byte as bitsandbytes 0.50.2 does on the
 * CPU: quantize_4bit(x, blocksize=64, compress_statistics=True,
 * quant_type="nf4") and dequantize_4bit to fp32. A base regc quantises then
 * holds the bytes a bitsandbytes checkpoint would, and a checkpoint's
 * blob reads back to bitsandbytes' floats.
 *
 * bitsandbytes runs three pieces of code here, and each one's roundings
 * are reproduced:
 *
 *  1. The 4-bit step (backends/default/ops.py, torch ops). absmax_b is the
 *     largest |x| of block b. A value becomes s = x * (1 / max(absmax_b,
 *     1e-38)), clamped to [-1, 1] (the last block, when n is not a multiple
 *     of 64, divides instead: s = x / max(absmax_b, 1e-38), and it keeps the
 *     clamped absmax), then the number of NF4 midpoints (l_i + l_i+1) / 2
 *     (fp32) strictly below s: the nearest level, a tie going to the lower
 *     one. An odd n packs a padding 0, so the last low nibble is 7.
 *  2. offset = absmax.mean(): torch's CPU sum divided by the count. The sum
 *     is aten's cascade_sum: 8 fp32 lanes (torch's AVX2 and default
 *     kernels; AVX-512 ones have 16), rows of 4 vectors summed in a cascade
 *     of four levels, the leftover scalars and then the lanes added in
 *     order; past 32768 elements, one such sum per thread's chunk and a sum
 *     of those (TensorIterator's two-pass reduction).
 *  3. The absmaxes less the offset, by the native library's 8-bit blockwise
 *     quantiser (csrc/cpu_ops.cpp quantize_cpu, blocks of 256): nested =
 *     the block's largest magnitude (0 gives all codes 0); the code is a
 *     table of 65536 steps, lut[(uint16)fma((clamp(d * (1 / nested)) + 1)
 *     * 0.5, 65535, 0.5)], entry i being the number of dynamic-map
 *     midpoints below 2i / 65535 - 1 (fp32). That is not always the
 *     nearest code. The fma is the library's (its build contracts the
 *     expression); for every fp32 in [0, 1] it gives the step a multiply
 *     then an add would.
 *
 * Dequantising is nf4_format.h's formula, which is bitsandbytes': the absmax
 * rebuilt as map[q8] * nested + offset (two roundings), times the level. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "regc_models.h"

static const float nf4_levels[16] = REGC_NF4_LEVELS;
static const float nf4_dynamic_map[256] = REGC_NF4_DYNAMIC_MAP;

/* torch's clamp(min=1e-38) bound: the double 1e-38 rounded to fp32 (a
 * subnormal), so an all-zero block scales by a finite 1 / tiny. */
#define NF4_TINY 0x1.b38fb8p-127f
/* Vectorized<float>::size() of torch's AVX2 and default CPU kernels: the
 * lanes of cascade_sum's partial sums (AVX-512 builds use 16). */
#define TORCH_LANES 8
#define TORCH_GRAIN 32768 /* at::internal::GRAIN_SIZE */

/* ---------------------------------------------------------------- torch's sum */

/* aten's utils::CeilLog2: 1 up to 2, else floor(log2(x - 1)) + 1. */
static int64_t torch_ceil_log2(int64_t x)
{
    if (x <= 2)
        return 1;
    int64_t b = 0;
    for (uint64_t v = (uint64_t)x - 1; v > 1; v >>= 1)
        b++;
    return b + 1;
}

/* multi_row_sum: `rows` rows of 4 elements, each element w floats (element
 * (i, k) at x + (4 i + k) w), summed per column in a cascade of 4 levels of
 * 2^power rows, so only partial sums of like size meet. */
static void torch_multi_row_sum(const float *x, int64_t rows, int w, float ret[4][TORCH_LANES])
{
    const int64_t power = torch_ceil_log2(rows) / 4 > 4 ? torch_ceil_log2(rows) / 4 : 4;
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[4][4][TORCH_LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + step <= rows) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < w; l++)
                    acc[0][k][l] += x[(4 * i + k) * w + l];
        for (int j = 1; j < 4; j++) {
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < w; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < w; l++)
                acc[0][k][l] += x[(4 * i + k) * w + l];
    for (int j = 1; j < 4; j++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < w; l++)
                acc[0][k][l] += acc[j][k][l];
    memcpy(ret, acc[0], sizeof acc[0]);
}

/* row_sum: n elements of w floats as rows of 4 (the ILP factor), the
 * leftover elements into column 0, then the columns in order. */
static void torch_row_sum(const float *x, int64_t n, int w, float *out)
{
    float part[4][TORCH_LANES];
    const int64_t rows = n / 4;
    torch_multi_row_sum(x, rows, w, part);
    for (int64_t i = rows * 4; i < n; i++)
        for (int l = 0; l < w; l++)
            part[0][l] += x[i * w + l];
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < w; l++)
            part[0][l] += part[k][l];
    memcpy(out, part[0], (size_t)w * sizeof(float));
}

/* One contiguous range through cascade_sum's loop: vectors of TORCH_LANES
 * when there is at least one (vectorized_inner_sum: the tail scalars first,
 * then the lanes in order), else a scalar row_sum; accumulated into an
 * output that starts at 0. */
static float torch_sum_range(const float *x, int64_t n)
{
    float sum;
    if (n >= TORCH_LANES) {
        float lanes[TORCH_LANES];
        const int64_t vecs = n / TORCH_LANES;
        torch_row_sum(x, vecs, TORCH_LANES, lanes);
        sum = 0.0f;
        for (int64_t k = vecs * TORCH_LANES; k < n; k++)
            sum += x[k];
        for (int l = 0; l < TORCH_LANES; l++)
            sum += lanes[l];
    } else {
        torch_row_sum(x, n, 1, &sum);
    }
    return 0.0f + sum;
}

/* torch.sum of a contiguous fp32 vector with `threads` intra-op threads:
 * serial below the grain; else parallel_for's chunks (one per thread, at
 * most one per grain), each summed alone into `partial` (threads floats,
 * the rest left 0), which is summed again (TensorIterator's two-pass
 * reduction). */
static float torch_sum(const float *x, int64_t n, int threads, float *partial)
{
    if (n < TORCH_GRAIN || threads <= 1)
        return torch_sum_range(x, n);
    int64_t used = (n + TORCH_GRAIN - 1) / TORCH_GRAIN;
    if (used > threads)
        used = threads;
    const int64_t chunk = (n + used - 1) / used;
    memset(partial, 0, (size_t)threads * sizeof(float));
    for (int64_t t = 0; t < used && t * chunk < n; t++)
        partial[t] = torch_sum_range(x + t * chunk, n - t * chunk < chunk ? n - t * chunk : chunk);
    return torch_sum_range(partial, threads);
}

/* ---------------------------------------------------------------- quantising */

/* The index bucketize gives s among the 15 NF4 midpoints: how many lie
 * strictly below it. */
static int nf4_nibble(const float *mid, float s)
{
    s = s < -1.0f ? -1.0f : s > 1.0f ? 1.0f : s;
    int q = 0;
    for (int i = 0; i < 15; i++)
        q += mid[i] < s;
    return q;
}

/* The 8-bit code quantize_cpu gives d, nested > 0: the step of its table
 * (the fma is the library's, rounded once), then that step's entry, the
 * number of dynamic-map midpoints below the step's value. */
static uint8_t nested_code(const float *mid255, float d, float inv)
{
    float v = d * inv;
    v = v < -1.0f ? -1.0f : 1.0f < v ? 1.0f : v;
    const uint16_t step = (uint16_t)(int32_t)fmaf((v + 1.0f) * 0.5f, 65535.0f, 0.5f);
    const float at = (float)(2 * (int32_t)step) / 65535.0f - 1.0f;
    int lo = 0, hi = 255; /* the first midpoint not below `at` */
    while (lo < hi) {
        const int m = (lo + hi) / 2;
        if (mid255[m] < at)
            lo = m + 1;
        else
            hi = m;
    }
    return (uint8_t)lo;
}

int regc_nf4_quantize_threads(const float *x, int64_t n, int threads, uint8_t *blob)
{
    if (n < 1)
        return regc_error(REGC_ERR_ARG, "NF4 quantisation: %lld values (need at least one)",
                          (long long)n);
    if (!x || !blob)
        return regc_error(REGC_ERR_ARG, "NF4 quantisation: no %s", x ? "blob" : "values");
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return regc_error(REGC_ERR_ARG,
                              "NF4 quantisation: value %lld of %lld is %s (only finite values "
                              "have a code)",
                              (long long)i, (long long)n, isnan(x[i]) ? "NaN" : "infinite");
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    if (threads < 1)
        threads = 1;
    /* the absmaxes, then the mean's per-thread partial sums */
    float *absmax = malloc((size_t)(l.blocks + threads) * sizeof(float));
    if (!absmax)
        return regc_error(REGC_ERR_MEMORY, "NF4 quantisation: no memory for %lld absmaxes",
                          (long long)l.blocks);
    float mid16[15], mid256[255];
    for (int i = 0; i < 15; i++)
        mid16[i] = (nf4_levels[i] + nf4_levels[i + 1]) / 2.0f;
    for (int i = 0; i < 255; i++)
        mid256[i] = 0.5f * (nf4_dynamic_map[i] + nf4_dynamic_map[i + 1]);

    uint8_t *packed = blob + l.packed_at;
    memset(packed, 0, (size_t)((n + 1) / 2));
    for (int64_t b = 0; b < l.blocks; b++) {
        const int64_t e0 = b * REGC_NF4_BLOCK;
        const int64_t len = n - e0 < REGC_NF4_BLOCK ? n - e0 : REGC_NF4_BLOCK;
        float m = 0.0f;
        for (int64_t i = 0; i < len; i++)
            m = fabsf(x[e0 + i]) > m ? fabsf(x[e0 + i]) : m;
        const float scale = m < NF4_TINY ? NF4_TINY : m;
        const int whole = len == REGC_NF4_BLOCK;
        /* a whole block multiplies by the reciprocal; the short last one
         * divides and keeps the clamped absmax (two branches of torch code) */
        const float inv = 1.0f / scale;
        absmax[b] = whole ? m : scale;
        for (int64_t i = 0; i < len; i++) {
            const int64_t e = e0 + i;
            const int q = nf4_nibble(mid16, whole ? x[e] * inv : x[e] / scale);
            packed[e / 2] |= (uint8_t)((e & 1) ? q : q << 4);
        }
    }
    if (n & 1)
        packed[n / 2] |= (uint8_t)nf4_nibble(mid16, 0.0f); /* the padding 0 */

    const float offset = torch_sum(absmax, l.blocks, threads, absmax + l.blocks) / (float)l.blocks;
    memcpy(blob, &offset, sizeof offset);
    uint8_t *q8 = blob + l.q8_at;
    for (int64_t nb = 0; nb < l.nested_blocks; nb++) {
        const int64_t b0 = nb * REGC_NF4_NESTED_BLOCK;
        const int64_t len =
            l.blocks - b0 < REGC_NF4_NESTED_BLOCK ? l.blocks - b0 : REGC_NF4_NESTED_BLOCK;
        float nested = 0.0f;
        for (int64_t i = 0; i < len; i++) {
            const float d = fabsf(absmax[b0 + i] - offset);
            nested = d > nested ? d : nested;
        }
        memcpy(blob + l.nested_at + 4 * nb, &nested, sizeof nested);
        const float inv = 1.0f / nested;
        for (int64_t i = 0; i < len; i++)
            q8[b0 + i] = nested == 0.0f ? 0 : nested_code(mid256, absmax[b0 + i] - offset, inv);
    }
    free(absmax);
    return REGC_OK;
}

int regc_nf4_quantize(const float *x, int64_t n, uint8_t *blob)
{
    return regc_nf4_quantize_threads(x, n, 1, blob);
}

/* ---------------------------------------------------------------- dequantising */

void regc_nf4_dequantize_range(const uint8_t *blob, int64_t n, int64_t first, int64_t count,
                               float *out)
{
    if (!blob || !out || first < 0 || count < 1 || first > n - count)
        return;
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    regc_nf4_read(blob, &l, nf4_levels, nf4_dynamic_map, first, count, out, 1);
}

void regc_nf4_dequantize(const uint8_t *blob, int64_t n, float *out)
{
    regc_nf4_dequantize_range(blob, n, 0, n, out);
}

int regc_nf4_check_tables(const float *quant_map16, const float *nested_map256)
{
    if (!quant_map16 || !nested_map256)
        return regc_error(REGC_ERR_ARG, "NF4 tables: the %s is missing",
                          quant_map16 ? "nested map" : "quant map");
    for (int i = 0; i < 16; i++)
        if (memcmp(&quant_map16[i], &nf4_levels[i], sizeof(float)) != 0)
            return regc_error(REGC_ERR_FORMAT,
                              "NF4 quant map entry %d is %a where bitsandbytes' NF4 has %a", i,
                              (double)quant_map16[i], (double)nf4_levels[i]);
    for (int i = 0; i < 256; i++)
        if (memcmp(&nested_map256[i], &nf4_dynamic_map[i], sizeof(float)) != 0)
            return regc_error(REGC_ERR_FORMAT,
                              "NF4 nested quant map entry %d is %a where bitsandbytes' dynamic "
                              "map has %a",
                              i, (double)nested_map256[i], (double)nf4_dynamic_map[i]);
    return REGC_OK;
}
