/* cuda_rows.h — private to the CUDA backend: what one GPU thread computes in
 * the row and column reductions of the norms (cuda_norm.cu) and of
 * cross-entropy (cuda_loss.cu), written once so that the kernels run it per
 * thread and a host test (tests/test_cuda_rows.c) runs it for every lane of
 * every row and every column and compares the results with the CPU
 * backend's, bit for bit, on a machine without a GPU.
 *
 * The order of every sum is the CPU's (cpu_norm.c, cpu_loss.c), which is
 * what makes the bits agree:
 * - a row sum runs in eight double lanes, element c into lane c % 8 and
 *   each lane in increasing c, the lanes then added as
 *   ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). The GPU gives each
 *   row eight threads, thread u summing lane u (the *_lane functions), and
 *   every thread of the row combines the eight partials by that expression
 *   (cuda_combine_lanes), so all eight hold the same total;
 * - cross-entropy's sum of exponentials differs in one point: the elements
 *   past the last multiple of 8 go into lane 0, after its others
 *   (cpu_row_logsumexp's tail);
 * - a column sum (a norm's weight and bias gradients) runs down the rows
 *   from row 0, in double, one thread per column;
 * - every term is formed by the same float and double operations as the
 *   CPU's expression for it, and the kernels are built with --fmad=false,
 *   as the CPU build has -ffp-contract=off.
 * Element-wise outputs (y, dx) come from kernel_math.h's formulas, walked by
 * the same thread over the same lane.
 *
 * Compiles as C11 and as CUDA (REGC_HD: host and device); the warp
 * shuffles that join a row's eight threads are CUDA only, at the end. */
#ifndef REGC_CUDA_ROWS_H
#define REGC_CUDA_ROWS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel_math.h"
#include "regc_backend.h"

/* the CPU's lanes per row sum, and so the GPU's threads per row */
#define CUDA_ROW_LANES 8

/* The column walks are one dependent chain of double adds each: unrolling
 * lets the device issue the next rows' loads before the adds (the order of
 * the adds is unchanged). Host compilers do not know the pragma. */
#if defined(__CUDA_ARCH__)
#define CUDA_ROWS_UNROLL _Pragma("unroll 4")
#else
#define CUDA_ROWS_UNROLL
#endif

/* ---- lanes of a row */

/* norm_lanes_total's order */
static inline REGC_HD double cuda_combine_lanes(const double *lane) /* lane: [8] */
{
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* a row's double sum over cols (a mean, a variance), 0 for an empty row */
static inline REGC_HD double cuda_divide_cols(double sum, int64_t cols)
{
    return cols > 0 ? sum / (double)cols : 0.0;
}

/* a row's sum (the combined lanes) as row_sum writes it: divided by cols
 * first when mean, then rounded */
static inline REGC_HD float cuda_finish_row_sum(double total, int64_t cols, int mean)
{
    return (float)(mean ? cuda_divide_cols(total, cols) : total);
}

/* lane u of the sum of x[c] (LayerNorm's mean, row_sum) */
static inline REGC_HD double cuda_sum_lane(const float *x, int64_t cols, int u) /* x: [cols] */
{
    double acc = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        acc += x[c];
    return acc;
}

/* the fused residual add: sum[c] = a[c] + b[c] for lane u's elements,
 * returning lane u of the sum of them; sum may be a or b (each element is
 * read before it is written, by the one thread that writes it) */
static inline REGC_HD double cuda_add_sum_lane(float *sum, const float *a, const float *b,
                                               int64_t cols, int u) /* sum, a, b: [cols] */
{
    double acc = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES) {
        const float v = regc_addf(a[c], b[c]);
        sum[c] = v;
        acc += v;
    }
    return acc;
}

/* lane u of the sum of (x[c] - mu)^2 (LayerNorm's variance) */
static inline REGC_HD double cuda_sum_sq_dev_lane(const float *x, double mu, int64_t cols,
                                                  int u) /* x: [cols] */
{
    double acc = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES) {
        const double d = x[c] - mu;
        acc += d * d;
    }
    return acc;
}

/* lane u of the sum of x[c]^2 (RMSNorm's mean square) */
static inline REGC_HD double cuda_sum_sq_lane(const float *x, int64_t cols, int u) /* x: [cols] */
{
    double acc = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        acc += (double)x[c] * x[c];
    return acc;
}

/* cuda_add_sum_lane for RMSNorm: writes the sum, returns lane u of its squares */
static inline REGC_HD double cuda_add_sum_sq_lane(float *sum, const float *a, const float *b,
                                                  int64_t cols, int u) /* sum, a, b: [cols] */
{
    double acc = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES) {
        const float v = regc_addf(a[c], b[c]);
        sum[c] = v;
        acc += (double)v * v;
    }
    return acc;
}

/* LayerNorm's backward, both sums of a row in one walk: lane u of the sum
 * of dnorm = w dy (a float, then widened) and of (double)dnorm * xhat */
static inline REGC_HD void cuda_sum_layernorm_bwd_lane(double *dnorm_sum, double *dnorm_xhat_sum,
                                                       const float *dy, const float *x,
                                                       const float *w, float m, float s,
                                                       int64_t cols, int u) /* dy, x, w: [cols] */
{
    double acc_d = 0.0, acc_dx = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES) {
        const float xhat = (x[c] - m) * s;
        const float dnorm = w[c] * dy[c];
        acc_d += dnorm;
        acc_dx += (double)dnorm * xhat;
    }
    *dnorm_sum = acc_d;
    *dnorm_xhat_sum = acc_dx;
}

/* RMSNorm's backward: lane u of the sum of (double)(w dy) * (x rstd) */
static inline REGC_HD double cuda_sum_rmsnorm_bwd_lane(const float *dy, const float *x,
                                                       const float *w, float s, int64_t cols,
                                                       int u) /* dy, x, w: [cols] */
{
    double acc = 0.0;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        acc += (double)(w[c] * dy[c]) * (x[c] * s);
    return acc;
}

/* ---- the element-wise outputs of lane u's elements */

/* y: the row, held in fp32 or (y_bf16) in bf16 */
static inline REGC_HD void cuda_write_layernorm_lane(void *y, int y_bf16, const float *x,
                                                     const float *w, const float *b, float m,
                                                     float s, int64_t cols,
                                                     int u) /* y, x, w, b: [cols] */
{
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        regc_store_f32_or_bf16(y, y_bf16, c, regc_layernorm_y(x[c], m, s, w[c], b[c]));
}

static inline REGC_HD void cuda_write_rmsnorm_lane(void *y, int y_bf16, const float *x,
                                                   const float *w, float s, int64_t cols,
                                                   int u) /* y, x, w: [cols] */
{
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        regc_store_f32_or_bf16(y, y_bf16, c, regc_rmsnorm_y(x[c], s, w[c]));
}

/* Row `off / cols` of an output held in fp32 or in bf16: off counts values. */
static inline REGC_HD void *cuda_row_of(void *y, int y_bf16, int64_t off)
{
    return (char *)y + off * (y_bf16 ? 2 : 4);
}

/* dx; with dres non-NULL, dx = dres + dx in the add kernel's one float add
 * (dx may be dres: each element is read before it is written) */
static inline REGC_HD void cuda_write_layernorm_dx_lane(
    float *dx, const float *dres, const float *dy, const float *x, const float *w, float m, float s,
    float dnorm_mean, float dnorm_xhat_mean, int64_t cols, int u) /* dx, dres, dy, x, w: [cols] */
{
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES) {
        const float v = regc_layernorm_dx(x[c], dy[c], w[c], m, s, dnorm_mean, dnorm_xhat_mean);
        dx[c] = dres ? regc_addf(dres[c], v) : v;
    }
}

static inline REGC_HD void cuda_write_rmsnorm_dx_lane(float *dx, const float *dres, const float *dy,
                                                      const float *x, const float *w, float s,
                                                      float gx_mean, int64_t cols,
                                                      int u) /* dx, dres, dy, x, w: [cols] */
{
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES) {
        const float v = regc_rmsnorm_dx(x[c], dy[c], w[c], s, gx_mean);
        dx[c] = dres ? regc_addf(dres[c], v) : v;
    }
}

/* ---- columns: the parameter gradients, each column down the rows from
 * row 0 in double, then rounded to float */

/* dw[c] = sum of dy xhat (the float product, widened), db[c] = sum of dy */
static inline REGC_HD void cuda_sum_layernorm_column(float *dw, float *db, const float *dy,
                                                     const float *x, const float *mean,
                                                     const float *rstd, int64_t rows, int64_t cols,
                                                     int64_t c)
/* dw, db: [cols]; dy, x: [rows, cols]; mean, rstd: [rows] */
{
    double acc_w = 0.0, acc_b = 0.0;
    CUDA_ROWS_UNROLL
    for (int64_t r = 0; r < rows; r++) {
        const float dyv = dy[r * cols + c];
        const float xhat = (x[r * cols + c] - mean[r]) * rstd[r];
        acc_w += (double)(dyv * xhat);
        acc_b += dyv;
    }
    dw[c] = (float)acc_w;
    db[c] = (float)acc_b;
}

/* dw[c] = sum of dy (x rstd), the float product widened */
static inline REGC_HD void cuda_sum_rmsnorm_column(float *dw, const float *dy, const float *x,
                                                   const float *rstd, int64_t rows, int64_t cols,
                                                   int64_t c)
/* dw: [cols]; dy, x: [rows, cols]; rstd: [rows] */
{
    double acc = 0.0;
    CUDA_ROWS_UNROLL
    for (int64_t r = 0; r < rows; r++)
        acc += (double)(dy[r * cols + c] * (x[r * cols + c] * rstd[r]));
    dw[c] = (float)acc;
}

/* ---- cross-entropy */

/* the CPU's step of a running maximum: a NaN never replaces it, and any
 * order gives the same maximum up to the sign of a zero, which the
 * log-sum-exp does not see (exp(x - mx) is the same for mx = +0 and -0,
 * and so is mx + log(sum)) */
static inline REGC_HD float cuda_max_of(float mx, float x) { return x > mx ? x : mx; }

/* lane u's maximum of x[c] (-inf for an empty lane) */
static inline REGC_HD float cuda_max_lane(const float *x, int64_t cols, int u) /* x: [cols] */
{
    float mx = -INFINITY;
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        mx = cuda_max_of(mx, x[c]);
    return mx;
}

/* A row whose maximum is -inf (every logit -inf, or no columns) or +inf has
 * nothing to normalise: its log-sum-exp is the maximum, as on the CPU. */
static inline REGC_HD int cuda_lse_needs_sum(float mx) { return mx != -INFINITY && mx != INFINITY; }

/* Lane u of the sum of exp(x[c] - mx) in cpu_row_logsumexp's order: it
 * sums blocks of 256 columns, and within a block eight elements at a time,
 * element c into lane c % 8; the elements that do not fill a last group of
 * eight go into lane 0, after all of lane 0's others. As 256 is a multiple
 * of 8, only the last block has such a tail, and it is the columns from
 * cols rounded down to a multiple of 8: the blocks change nothing else. */
static inline REGC_HD double cuda_sum_lse_lane(const float *x, float mx, int64_t cols,
                                               int u) /* x: [cols] */
{
    const int64_t full = cols / CUDA_ROW_LANES * CUDA_ROW_LANES;
    double acc = 0.0;
    for (int64_t c = u; c < full; c += CUDA_ROW_LANES)
        acc += (double)regc_expf(x[c] - mx);
    if (u == 0)
        for (int64_t c = full; c < cols; c++)
            acc += (double)regc_expf(x[c] - mx);
    return acc;
}

/* mx + log(sum), sum the combined lanes: regc_log (kernel_math.h), not a
 * library's log, so the bits are the CPU's here too. */
static inline REGC_HD float cuda_finish_lse(float mx, double sum)
{
    return cuda_lse_needs_sum(mx) ? mx + (float)regc_log(sum) : mx;
}

/* softmax's (or log-softmax's) outputs of lane u's elements, l the row's
 * log-sum-exp */
static inline REGC_HD void cuda_write_softmax_lane(float *y, const float *x, float l, int64_t cols,
                                                   int log, int u) /* y, x: [cols] */
{
    for (int64_t c = u; c < cols; c += CUDA_ROW_LANES)
        y[c] = regc_softmax_y(x[c], l, log);
}

/* Does the forward's loss count a target? A target past the columns is
 * left out of the mean, as the CPU leaves it out (and reports it). */
static inline REGC_HD int cuda_counts_target(int32_t t, int64_t cols)
{
    return t >= 0 && (int64_t)t < cols;
}

/* one counted row's term of the loss, lse - logit in double */
static inline REGC_HD double cuda_ce_term(float lse, float logit)
{
    return (double)lse - (double)logit;
}

/* a row's target logit for the loss, 0 where the loss leaves the row out
 * (cross_entropy_rows' picked) */
static inline REGC_HD float cuda_ce_picked(const float *x, int32_t t, int64_t cols) /* x: [cols] */
{
    return cuda_counts_target(t, cols) ? x[t] : 0.0f;
}

/* the mean of the terms, summed in row order (0 with no row counted) */
static inline REGC_HD float cuda_finish_loss(double total, int64_t n_valid)
{
    return n_valid > 0 ? (float)(total / (double)n_valid) : 0.0f;
}

/* the backward's factor dloss / n_valid, n_valid the rows whose target is
 * >= 0 (past the columns included, as the CPU counts them) */
static inline REGC_HD float cuda_ce_grad_scale(float dloss, int64_t n_valid)
{
    return n_valid > 0 ? (float)((double)dloss / (double)n_valid) : 0.0f;
}

/* dlogits[c] of a row with target t and log-sum-exp l: 0 for an ignored
 * row (x is not read), else regc_ce_dx, the -1 at the target; a target past
 * the columns leaves every column without it, as on the CPU */
static inline REGC_HD float cuda_ce_dx_at(const float *x, float l, float g, int32_t t,
                                          int64_t c) /* x: [cols] */
{
    return t < 0 ? 0.0f : regc_ce_dx(x[c], l, g, c == (int64_t)t);
}

/* ---- device only: joining the eight threads of a row (4 rows per warp,
 * so the 32 threads of each warp must all reach these, rows past the end
 * included). The host test stands in for them with cuda_combine_lanes over
 * the eight lanes it computed, and with cuda_max_of over them. */
#if defined(__CUDACC__)

#define CUDA_FULL_MASK 0xffffffffu

/* the row's total: every thread of the row receives the eight partials and
 * combines them in the CPU's order, so all eight agree bit for bit */
static __device__ __forceinline__ double cuda_gather_total(double part)
{
    double lane[CUDA_ROW_LANES];
#pragma unroll
    for (int k = 0; k < CUDA_ROW_LANES; k++)
        lane[k] = __shfl_sync(CUDA_FULL_MASK, part, k, CUDA_ROW_LANES);
    return cuda_combine_lanes(lane);
}

/* the row's maximum, folded over the lanes in order by every thread of the
 * row, so all eight agree bit for bit (a zero's sign included) */
static __device__ __forceinline__ float cuda_gather_max(float part)
{
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < CUDA_ROW_LANES; k++)
        mx = cuda_max_of(mx, __shfl_sync(CUDA_FULL_MASK, part, k, CUDA_ROW_LANES));
    return mx;
}

#endif

#endif
