/* cpu_elementwise.c — the memory-bound kernels: fill, strided copies,
 * embedding lookup and its scatter-add, add, multiply, bias add, column
 * sums, scaling, and the activations GELU (tanh and erf forms), SiLU and ReLU. */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "regc_common.h"

void regc_cpu_sum_columns(const regc_backend *be, float *out, const float *x, int64_t ld,
                          int64_t rows, int64_t cols)
{
    const int threads = regc_cpu_threads(be);
    /* double accumulators: a sum over thousands of rows keeps float accuracy */
#pragma omp parallel num_threads(threads) if (rows * cols >= regc_cpu_par_min(be))
    {
        int64_t lo, hi;
        regc_cpu_team_columns(cols, &lo, &hi);
        for (int64_t c0 = lo; c0 < hi; c0 += REGC_CPU_COL_CHUNK) {
            const int64_t w = hi - c0 < REGC_CPU_COL_CHUNK ? hi - c0 : REGC_CPU_COL_CHUNK;
            double acc[REGC_CPU_COL_CHUNK] = {0}; /* [w] */
            for (int64_t r = 0; r < rows; r++) {
                const float *row = x + r * ld + c0; /* [w] */
                for (int64_t j = 0; j < w; j++)
                    acc[j] += row[j];
            }
            for (int64_t j = 0; j < w; j++)
                out[c0 + j] = (float)acc[j];
        }
    }
}

void regc_cpu_fill_floats(regc_backend *be, float *dst, size_t n, float value)
{
    const int64_t count = (int64_t)n;
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (count >= regc_cpu_par_min(be))      \
    schedule(static)
    for (int64_t i = 0; i < count; i++)
        dst[i] = value;
}

void regc_cpu_copy_rows(regc_backend *be, float *dst, int64_t ld_dst, const float *src,
                        int64_t ld_src, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0)
        return;
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        memmove(dst + r * ld_dst, src + r * ld_src, (size_t)cols * sizeof(float));
}

/* A table held in bf16 is widened value by value, exactly (every bf16
 * value is a float): the row the fp32 table of the same values gives. */
void regc_cpu_embedding_fwd(regc_backend *be, float *out, const int32_t *ids, const float *table,
                            int64_t rows, int64_t cols, int table_bf16)
{
    const uint16_t *table16 = (const uint16_t *)table; /* [vocab, cols] when table_bf16 */
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (!table_bf16) {
            memcpy(out + r * cols, table + (int64_t)ids[r] * cols, (size_t)cols * sizeof(float));
            continue;
        }
        const uint16_t *src = table16 + (int64_t)ids[r] * cols; /* [cols] */
        float *dst = out + r * cols;                            /* [cols] */
        for (int64_t c = 0; c < cols; c++)
            dst[c] = regc_bf16_value(src[c]);
    }
}

static int compare_keys(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sums each touched vocabulary row's dout rows in row order, starting from
 * 0, and adds the sum to dtable's row once: a fresh table (zero-filled) and
 * an accumulating one then get the same bits as filling a fresh table and
 * adding it to the old contents. An untouched row keeps its value, where
 * fresh + add would give old + 0: the same except that -0.0 becomes +0.0. */
void regc_cpu_embedding_bwd(regc_backend *be, float *dtable, const int32_t *ids, const float *dout,
                            int64_t rows, int64_t cols, int64_t vocab, int accumulate, int64_t pad)
{
    const int threads = regc_cpu_threads(be);
    for (int64_t r = 0; r < rows; r++) {
        if (ids[r] < 0 || ids[r] >= vocab) {
            regc_cpu_set_failure(
                be, regc_error(REGC_ERR_ARG,
                               "embedding_bwd: id %d at row %lld is outside the vocabulary of %lld",
                               (int)ids[r], (long long)r, (long long)vocab));
            return;
        }
    }
    if (rows > (int64_t)UINT32_MAX) {
        regc_cpu_set_failure(
            be, regc_error(REGC_ERR_ARG,
                           "embedding_bwd: %lld rows exceed the 2^32 the grouping indexes",
                           (long long)rows));
        return;
    }
    /* (id, row) keys sorted: the rows of one id are adjacent and in row
     * order, so every sum runs in row order whatever the thread count */
    uint64_t *key = regc_cpu_get_scratch(be, (size_t)(rows + 1) * sizeof *key); /* [rows] */
    if (!key)
        return;
    for (int64_t r = 0; r < rows; r++)
        key[r] = (uint64_t)ids[r] << 32 | (uint64_t)r;
    qsort(key, (size_t)rows, sizeof *key, compare_keys);
    if (!accumulate)
        regc_cpu_fill_floats(be, dtable, (size_t)(vocab * cols), 0.0f);
    /* Threads own column blocks, so rows of one id never race. */
    const int64_t n_blocks = (cols + REGC_CPU_COL_BLOCK - 1) / REGC_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(threads) if (rows * cols >= regc_cpu_par_min(be))             \
    schedule(static)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t c0 = blk * REGC_CPU_COL_BLOCK;
        const int64_t w = cols - c0 < REGC_CPU_COL_BLOCK ? cols - c0 : REGC_CPU_COL_BLOCK;
        for (int64_t g = 0; g < rows;) {
            const int64_t id = (int64_t)(key[g] >> 32);
            if (id == pad) { /* the padding row takes no gradient */
                while (g < rows && (int64_t)(key[g] >> 32) == id)
                    g++;
                continue;
            }
            float acc[REGC_CPU_COL_BLOCK] = {0}; /* [w] */
            for (; g < rows && (int64_t)(key[g] >> 32) == id; g++) {
                const float *src = dout + (int64_t)(key[g] & UINT32_MAX) * cols + c0; /* [w] */
                for (int64_t j = 0; j < w; j++)
                    acc[j] = regc_addf(acc[j], src[j]);
            }
            float *dst = dtable + id * cols + c0; /* [w] */
            for (int64_t j = 0; j < w; j++)
                dst[j] = regc_addf(dst[j], acc[j]);
        }
    }
}

void regc_cpu_add_arrays(regc_backend *be, float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = regc_addf(a[i], b[i]);
}

void regc_cpu_add_bias(regc_backend *be, float *out, const float *x, const float *b, int64_t rows,
                       int64_t cols)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * cols;      /* [cols] */
        const float *xr = x + r * cols; /* [cols] */
        for (int64_t c = 0; c < cols; c++)
            o[c] = regc_addf(xr[c], b[c]);
    }
}

void regc_cpu_sum_rows(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols)
{
    regc_cpu_sum_columns(be, out, x, cols, rows, cols);
}

/* The activations bound by their arithmetic (the exp of GELU and SiLU, the
 * erfc of exact GELU), forward y = f(x) and backward y = dy f'(x). */
typedef enum {
    CPU_ACT_GELU,
    CPU_ACT_GELU_BWD,
    CPU_ACT_SILU,
    CPU_ACT_SILU_BWD,
    CPU_ACT_GELU_ERF,
    CPU_ACT_GELU_ERF_BWD,
} cpu_act;

/* Elements per parallel task of an activation, at most */
#define CPU_ACT_SPAN 4096

/* One span of an activation, in the widest vectors the CPU has
 * (REGC_CPU_WIDE_VECTORS; each loop the same per-element function as the
 * fused chain's step, so the bits are the chain's): in a build for no
 * particular CPU, built for the baseline alone, SiLU took 18 times as long
 * on a CPU with AVX-512. dy is unused by the forward ones. */
REGC_CPU_WIDE_VECTORS static void cpu_act_span(cpu_act act, float *y, const float *dy,
                                               const float *x, int64_t len) /* all [len] */
{
    switch (act) {
    case CPU_ACT_GELU:
        for (int64_t i = 0; i < len; i++)
            y[i] = regc_gelu(x[i]);
        break;
    case CPU_ACT_GELU_BWD:
        for (int64_t i = 0; i < len; i++)
            y[i] = regc_gelu_dx(dy[i], x[i]);
        break;
    case CPU_ACT_SILU:
        for (int64_t i = 0; i < len; i++)
            y[i] = regc_silu(x[i]);
        break;
    case CPU_ACT_SILU_BWD:
        for (int64_t i = 0; i < len; i++)
            y[i] = regc_silu_dx(dy[i], x[i]);
        break;
    case CPU_ACT_GELU_ERF:
        for (int64_t i = 0; i < len; i++)
            y[i] = regc_gelu_erf(x[i]);
        break;
    case CPU_ACT_GELU_ERF_BWD:
        for (int64_t i = 0; i < len; i++)
            y[i] = regc_gelu_erf_dx(dy[i], x[i]);
        break;
    }
}

/* An activation over n elements, spans shared out among the team (the
 * calls come from inside the parallel loop, so each runs its chosen
 * vectors: OpenMP's outlined loop body itself is built for the baseline). */
static void cpu_act_run(regc_backend *be, cpu_act act, float *y, const float *dy, const float *x,
                        int64_t n)
{
    const int threads = regc_cpu_threads(be);
    /* a span a thread at least, where n is short of a whole one each */
    const int64_t span =
        n >= (int64_t)CPU_ACT_SPAN * threads ? CPU_ACT_SPAN : (n + threads - 1) / threads;
    if (span == 0)
        return;
    const int64_t spans = (n + span - 1) / span;
#pragma omp parallel for num_threads(threads) if (n >= regc_cpu_par_min(be) / 8) schedule(static)
    for (int64_t sp = 0; sp < spans; sp++) {
        const int64_t i0 = sp * span, len = n - i0 < span ? n - i0 : span;
        cpu_act_span(act, y + i0, dy ? dy + i0 : NULL, x + i0, len);
    }
}

void regc_cpu_gelu_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    cpu_act_run(be, CPU_ACT_GELU, y, NULL, x, n);
}

void regc_cpu_gelu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
    cpu_act_run(be, CPU_ACT_GELU_BWD, dx, dy, x, n);
}

void regc_cpu_mul_arrays(regc_backend *be, float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = regc_mulf(a[i], b[i]);
}

void regc_cpu_silu_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    cpu_act_run(be, CPU_ACT_SILU, y, NULL, x, n);
}

void regc_cpu_silu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
    cpu_act_run(be, CPU_ACT_SILU_BWD, dx, dy, x, n);
}

void regc_cpu_gelu_erf_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    cpu_act_run(be, CPU_ACT_GELU_ERF, y, NULL, x, n);
}

void regc_cpu_gelu_erf_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
    cpu_act_run(be, CPU_ACT_GELU_ERF_BWD, dx, dy, x, n);
}

void regc_cpu_relu_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] = regc_relu(x[i]);
}

void regc_cpu_relu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t i = 0; i < n; i++)
        dx[i] = regc_relu_dx(dy[i], x[i]);
}

void regc_cpu_scale(regc_backend *be, float *y, const float *x, float value, int64_t n)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] = regc_scalef(value, x[i]);
}

/* One Philox call draws four elements' words: each thread takes whole
 * groups of four, so every element's draw and product are the same at any
 * thread count (they depend on the element's index alone). */
void regc_cpu_dropout(regc_backend *be, float *y, const float *x, const int32_t *site,
                      const int32_t *draw, float p, int64_t n)
{
    if (!draw[3] || p <= 0.0f) {
        if (y != x)
            memmove(y, x, (size_t)n * sizeof *y);
        return;
    }
    const float scale = 1.0f / (1.0f - p);
    const int32_t s = *site;
    const int64_t groups = (n + 3) / 4;
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t q = 0; q < groups; q++) {
        uint32_t w[4];
        regc_dropout_words(draw, s, q, w);
        for (int64_t i = 4 * q; i < 4 * q + 4 && i < n; i++)
            y[i] = regc_dropout_apply(x[i], w[i - 4 * q], p, scale);
    }
}
