/* cpu_loss.c — softmax cross-entropy over rows of logits (vocabularies of
 * 50257 and more), with negative targets ignored, and softmax and
 * log-softmax over rows through the same log-sum-exp. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "regc_common.h"

#define CPU_EXP_BLOCK 256

/* The simd pragma below is a request; clang reports (as an error under
 * -Werror) when it cannot honour it, and a slower loop is still correct. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* log(sum(exp(x))) of one row, written so every loop vectorises without
 * reassociating a sum: the maximum is exact in any order, the exponentials
 * go through a small buffer, and eight double partial sums are taken in a
 * fixed pattern. The result does not depend on how it compiled or on the
 * thread count. */
REGC_CPU_WIDE_VECTORS static float cpu_row_logsumexp(const float *x, int64_t cols) /* x: [cols] */
{
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t c = 0; c < cols; c++)
        mx = x[c] > mx ? x[c] : mx;
    if (mx == -INFINITY || mx == INFINITY)
        return mx; /* every logit -inf (or one +inf): nothing to normalise */
    /* double sums: 50257 terms summed in float would lose the small ones */
    double acc[8] = {0};
    float e[CPU_EXP_BLOCK];
    for (int64_t c0 = 0; c0 < cols; c0 += CPU_EXP_BLOCK) {
        const int64_t w = cols - c0 < CPU_EXP_BLOCK ? cols - c0 : CPU_EXP_BLOCK;
        for (int64_t j = 0; j < w; j++)
            e[j] = regc_expf(x[c0 + j] - mx);
        int64_t j = 0;
        for (; j + 8 <= w; j += 8)
            for (int u = 0; u < 8; u++)
                acc[u] += (double)e[j + u];
        for (; j < w; j++)
            acc[0] += (double)e[j];
    }
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return mx + (float)regc_log(sum);
}

static void cpu_rows_logsumexp(regc_backend *be, float *lse, const float *logits, int64_t rows,
                               int64_t cols)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * cols; /* [cols] */
        lse[r] = cpu_row_logsumexp(x, cols);
    }
}

/* Is target t of row r a class? A negative one is ignored; one past the
 * classes is reported (the kernel's caller named what it reads). */
static int cpu_target_ok(regc_backend *be, const char *kernel, int32_t t, int64_t r, int64_t cols)
{
    if (t >= cols)
        regc_cpu_set_failure(be, regc_error(REGC_ERR_ARG,
                                            "%s: target %d at row %lld is not below %lld classes",
                                            kernel, (int)t, (long long)r, (long long)cols));
    return t >= 0 && t < cols;
}

/* the mean of lse - logit over the counted rows, serially in row order so
 * it does not depend on threads; logit(r) reads the picked logit */
static float cpu_loss_mean(const float *lse, const int32_t *targets, const float *logits,
                           const float *picked, int64_t rows, int64_t cols)
{
    double total = 0.0;
    int64_t n_valid = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int32_t t = targets[r];
        if (t < 0 || t >= cols)
            continue;
        total += (double)lse[r] - (double)(logits ? logits[r * cols + t] : picked[r]);
        n_valid++;
    }
    return n_valid > 0 ? (float)(total / (double)n_valid) : 0.0f;
}

void regc_cpu_cross_entropy_fwd(regc_backend *be, float *loss, float *lse, const float *logits,
                                const int32_t *targets, int64_t rows, int64_t cols)
{
    cpu_rows_logsumexp(be, lse, logits, rows, cols);
    for (int64_t r = 0; r < rows; r++)
        cpu_target_ok(be, "cross_entropy_fwd", targets[r], r, cols);
    loss[0] = cpu_loss_mean(lse, targets, logits, NULL, rows, cols);
}

void regc_cpu_cross_entropy_rows(regc_backend *be, float *lse, float *picked, const float *logits,
                                 const int32_t *targets, int64_t rows, int64_t cols)
{
    cpu_rows_logsumexp(be, lse, logits, rows, cols);
    for (int64_t r = 0; r < rows; r++)
        picked[r] = cpu_target_ok(be, "cross_entropy_rows", targets[r], r, cols)
                        ? logits[r * cols + targets[r]]
                        : 0.0f;
}

void regc_cpu_cross_entropy_loss(regc_backend *be, float *loss, const float *lse,
                                 const float *picked, const int32_t *targets, int64_t rows,
                                 int64_t cols)
{
    (void)be;
    loss[0] = cpu_loss_mean(lse, targets, NULL, picked, rows, cols);
}

void regc_cpu_softmax_fwd(regc_backend *be, float *y, float *lse, const float *x, int64_t rows,
                          int64_t cols, int log)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be) / 8) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols; /* [cols] */
        float *yr = y + r * cols;       /* [cols] */
        const float l = cpu_row_logsumexp(xr, cols);
        for (int64_t c = 0; c < cols; c++)
            yr[c] = regc_softmax_y(xr[c], l, log);
        lse[r] = l;
    }
}

/* dx[c] = g * softmax(x)[c], with l the row's log-sum-exp */
REGC_CPU_WIDE_VECTORS static void
cpu_row_softmax_scaled(float *restrict dx, const float *restrict x, float l, float g, int64_t cols)
{
    for (int64_t c = 0; c < cols; c++)
        dx[c] = regc_ce_dx(x[c], l, g, 0);
}

/* the same in bf16 (a dlogits held in bf16: every value rounded on store) */
REGC_CPU_WIDE_VECTORS static void cpu_row_softmax_scaled_bf16(uint16_t *restrict dx,
                                                              const float *restrict x, float l,
                                                              float g, int64_t cols)
{
    for (int64_t c = 0; c < cols; c++)
        dx[c] = regc_bf16_bits(regc_ce_dx(x[c], l, g, 0));
}

void regc_cpu_cross_entropy_bwd(regc_backend *be, void *dlogits, const float *dloss,
                                const float *logits, const int32_t *all_targets, const float *lse,
                                int64_t rows, int64_t cols, int64_t row0, int64_t all_rows,
                                int dlogits_bf16)
{
    const size_t elem = dlogits_bf16 ? sizeof(uint16_t) : sizeof(float);
    int64_t n_valid = 0;
    for (int64_t r = 0; r < all_rows; r++)
        n_valid += all_targets[r] >= 0;
    const float g = n_valid > 0 ? (float)((double)dloss[0] / (double)n_valid) : 0.0f;
    const int32_t *targets = all_targets + row0; /* [rows]: this call's */
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * cols;                     /* [cols] */
        void *dx = (char *)dlogits + (size_t)(r * cols) * elem; /* [cols] */
        const int32_t t = targets[r];
        if (t < 0) {
            memset(dx, 0, (size_t)cols * elem);
            continue;
        }
        if (dlogits_bf16)
            cpu_row_softmax_scaled_bf16(dx, x, lse[r], g, cols);
        else
            cpu_row_softmax_scaled(dx, x, lse[r], g, cols);
        if (t < cols)
            regc_store_f32_or_bf16(dx, dlogits_bf16, t, regc_ce_dx(x[t], lse[r], g, 1));
    }
}
