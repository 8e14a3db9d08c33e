/* cpu_norm.c — LayerNorm (the llm.c formulation) and RMSNorm (Llama's
 * LlamaRMSNorm, T5's T5LayerNorm) over the last axis, forward and backward.
 * Row statistics are accumulated in double: the mean of 768 floats
 * otherwise loses digits the backward pass needs. */
#include "cpu_kernels.h"
#include "regc_common.h"

void regc_cpu_layernorm_fwd(regc_backend *be, float *y, float *mean, float *rstd,
                            const float *x, const float *w, const float *b,
                            int64_t rows, int64_t cols, float eps)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) \
    if (rows * cols >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols; /* [cols] */
        float *yr = y + r * cols;       /* [cols] */
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            sum += xr[c];
        double mu = cols > 0 ? sum / (double)cols : 0.0;
        double sq = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            double d = xr[c] - mu;
            sq += d * d;
        }
        /* biased variance, as PyTorch normalises */
        double var = cols > 0 ? sq / (double)cols : 0.0;
        float m = (float)mu;
        float s = (float)(1.0 / sqrt(var + (double)eps));
        for (int64_t c = 0; c < cols; c++) {
            float n = (xr[c] - m) * s;
            yr[c] = n * w[c] + b[c];
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

void regc_cpu_layernorm_bwd(regc_backend *be, float *dx, float *dw, float *db,
                            const float *dy, const float *x, const float *w,
                            const float *mean, const float *rstd, int64_t rows, int64_t cols)
{
    const int threads = regc_cpu_threads(be);
#pragma omp parallel for num_threads(threads) if (rows * cols >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;   /* [cols] */
        const float *dyr = dy + r * cols; /* [cols] */
        float *dxr = dx + r * cols;       /* [cols] */
        const float m = mean[r], s = rstd[r];
        double dnorm_sum = 0.0, dnorm_xhat_sum = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            float xhat = (xr[c] - m) * s;
            float dnorm = w[c] * dyr[c];
            dnorm_sum += dnorm;
            dnorm_xhat_sum += (double)dnorm * xhat;
        }
        const float dnorm_mean = cols > 0 ? (float)(dnorm_sum / (double)cols) : 0.0f;
        const float dnorm_xhat_mean = cols > 0 ? (float)(dnorm_xhat_sum / (double)cols) : 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            float xhat = (xr[c] - m) * s;
            float dnorm = w[c] * dyr[c];
            dxr[c] = (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * s;
        }
    }

    /* dw, db: sums over rows, so threads own column blocks (no races, and
     * the summation order is independent of the thread count) */
    const int64_t n_blocks = (cols + REGC_CPU_COL_BLOCK - 1) / REGC_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(threads) if (rows * cols >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t c0 = blk * REGC_CPU_COL_BLOCK;
        const int64_t wd = cols - c0 < REGC_CPU_COL_BLOCK ? cols - c0 : REGC_CPU_COL_BLOCK;
        double acc_w[REGC_CPU_COL_BLOCK] = {0}, acc_b[REGC_CPU_COL_BLOCK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * cols + c0;   /* [wd] */
            const float *dyr = dy + r * cols + c0; /* [wd] */
            const float m = mean[r], s = rstd[r];
            for (int64_t j = 0; j < wd; j++) {
                float xhat = (xr[j] - m) * s;
                acc_w[j] += (double)(dyr[j] * xhat);
                acc_b[j] += dyr[j];
            }
        }
        for (int64_t j = 0; j < wd; j++) {
            dw[c0 + j] = (float)acc_w[j];
            db[c0 + j] = (float)acc_b[j];
        }
    }
}

void regc_cpu_rmsnorm_fwd(regc_backend *be, float *y, float *rstd, const float *x,
                          const float *w, int64_t rows, int64_t cols, float eps)
{
#pragma omp parallel for num_threads(regc_cpu_threads(be)) \
    if (rows * cols >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols; /* [cols] */
        float *yr = y + r * cols;       /* [cols] */
        double sq = 0.0;
        for (int64_t c = 0; c < cols; c++)
            sq += (double)xr[c] * xr[c];
        double ms = cols > 0 ? sq / (double)cols : 0.0;
        float s = (float)(1.0 / sqrt(ms + (double)eps));
        /* (x * rstd) * w: the order HF applies them in */
        for (int64_t c = 0; c < cols; c++)
            yr[c] = (xr[c] * s) * w[c];
        rstd[r] = s;
    }
}

void regc_cpu_rmsnorm_bwd(regc_backend *be, float *dx, float *dw, const float *dy,
                          const float *x, const float *w, const float *rstd, int64_t rows,
                          int64_t cols)
{
    const int threads = regc_cpu_threads(be);
    /* with xhat = x * rstd and g = w * dy: dx = rstd * (g - xhat * mean(g * xhat)) */
#pragma omp parallel for num_threads(threads) if (rows * cols >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;   /* [cols] */
        const float *dyr = dy + r * cols; /* [cols] */
        float *dxr = dx + r * cols;       /* [cols] */
        const float s = rstd[r];
        double gx_sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            gx_sum += (double)(w[c] * dyr[c]) * (xr[c] * s);
        const float gx_mean = cols > 0 ? (float)(gx_sum / (double)cols) : 0.0f;
        for (int64_t c = 0; c < cols; c++)
            dxr[c] = (w[c] * dyr[c] - (xr[c] * s) * gx_mean) * s;
    }

    /* dw: a sum over rows, so threads own column blocks (race-free, and the
     * order does not depend on the thread count) */
    const int64_t n_blocks = (cols + REGC_CPU_COL_BLOCK - 1) / REGC_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(threads) if (rows * cols >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t c0 = blk * REGC_CPU_COL_BLOCK;
        const int64_t wd = cols - c0 < REGC_CPU_COL_BLOCK ? cols - c0 : REGC_CPU_COL_BLOCK;
        double acc[REGC_CPU_COL_BLOCK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * cols + c0;   /* [wd] */
            const float *dyr = dy + r * cols + c0; /* [wd] */
            const float s = rstd[r];
            for (int64_t j = 0; j < wd; j++)
                acc[j] += (double)(dyr[j] * (xr[j] * s));
        }
        for (int64_t j = 0; j < wd; j++)
            dw[c0 + j] = (float)acc[j];
    }
}
