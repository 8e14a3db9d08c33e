/* cpu_norm.c — LayerNorm (the llm.c formulation) and RMSNorm (Llama's
 * LlamaRMSNorm, T5's T5LayerNorm) over the last axis, forward and backward,
 * and each fused with the residual add beside it (add + norm forward,
 * norm backward + gradient add), sharing the row routines with the plain
 * kernels so fused and unfused results are the same bits; and the plain
 * row sum and mean (an exported graph's sum and mean over the last axis),
 * in the same lanes.
 * Row statistics are accumulated in double: the mean of 768 floats
 * otherwise loses digits the backward pass needs. The row routines are
 * built for the widest vectors the CPU has (REGC_CPU_WIDE_VECTORS): in a
 * build for no particular CPU, built for the baseline alone, they took 1.6
 * to 1.9 times as long on a CPU with AVX-512. */
#include "cpu_kernels.h"
#include "regc_common.h"

/* The row sums below run in eight double lanes, element c into lane c % 8,
 * the lanes added pairwise at the end: a fixed order (the same whatever the
 * thread count or the compiler's choice) that vectorises, where one running
 * sum is a chain of dependent adds. */
#define NORM_LANES 8

static double norm_lanes_total(const double *acc)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* sum of x[c] */
static double norm_row_sum(const float *x, int64_t cols)
{
    double acc[NORM_LANES] = {0};
    int64_t c = 0;
    for (; c + NORM_LANES <= cols; c += NORM_LANES)
        for (int u = 0; u < NORM_LANES; u++)
            acc[u] += x[c + u];
    for (; c < cols; c++)
        acc[c % NORM_LANES] += x[c];
    return norm_lanes_total(acc);
}

void regc_cpu_row_sum(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols,
                      int mean)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const double sum = norm_row_sum(x + r * cols, cols);
        out[r] = (float)(mean ? (cols > 0 ? sum / (double)cols : 0.0) : sum);
    }
}

/* sum of (x[c] - mu)^2 */
static double norm_row_sq_dev(const float *x, double mu, int64_t cols)
{
    double acc[NORM_LANES] = {0};
    int64_t c = 0;
    for (; c + NORM_LANES <= cols; c += NORM_LANES)
        for (int u = 0; u < NORM_LANES; u++) {
            double d = x[c + u] - mu;
            acc[u] += d * d;
        }
    for (; c < cols; c++) {
        double d = x[c] - mu;
        acc[c % NORM_LANES] += d * d;
    }
    return norm_lanes_total(acc);
}

/* One row of LayerNorm forward: the single kernel and the fused residual
 * add + norm both run this, so their arithmetic is the same code. */
REGC_CPU_WIDE_VECTORS static void layernorm_fwd_row(void *yr, int y_bf16, float *mean_r,
                                                    float *rstd_r, const float *xr, const float *w,
                                                    const float *b, int64_t cols, float eps)
{
    double mu = cols > 0 ? norm_row_sum(xr, cols) / (double)cols : 0.0;
    double sq = norm_row_sq_dev(xr, mu, cols);
    /* biased variance, as PyTorch normalises */
    double var = cols > 0 ? sq / (double)cols : 0.0;
    float m = (float)mu;
    float s = regc_norm_rstd(var, eps);
    if (y_bf16) /* one loop per storage, each vectorises */
        for (int64_t c = 0; c < cols; c++)
            ((uint16_t *)yr)[c] = regc_bf16_bits(regc_layernorm_y(xr[c], m, s, w[c], b[c]));
    else
        for (int64_t c = 0; c < cols; c++)
            ((float *)yr)[c] = regc_layernorm_y(xr[c], m, s, w[c], b[c]);
    *mean_r = m;
    *rstd_r = s;
}

/* Row r of an output held in fp32 or bf16. */
static void *norm_row_of(void *y, int y_bf16, int64_t r, int64_t cols)
{
    return (char *)y + (size_t)(r * cols) * (y_bf16 ? sizeof(uint16_t) : sizeof(float));
}

void regc_cpu_layernorm_fwd(regc_backend *be, void *y, float *mean, float *rstd, const float *x,
                            const float *w, const float *b, int64_t rows, int64_t cols, float eps,
                            int y_bf16)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        layernorm_fwd_row(norm_row_of(y, y_bf16, r, cols), y_bf16, &mean[r], &rstd[r], x + r * cols,
                          w, b, cols, eps);
}

void regc_cpu_add_layernorm_fwd(regc_backend *be, float *sum, void *y, float *mean, float *rstd,
                                const float *a, const float *b, const float *w, const float *bias,
                                int64_t rows, int64_t cols, float eps, int y_bf16)
{
    /* the row of sum is written and then normalised while still in cache;
     * sum may be a or b (each element is read before it is written) */
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *sr = sum + r * cols;     /* [cols] */
        const float *ar = a + r * cols; /* [cols] */
        const float *br = b + r * cols; /* [cols] */
        for (int64_t c = 0; c < cols; c++)
            sr[c] = regc_addf(ar[c], br[c]);
        layernorm_fwd_row(norm_row_of(y, y_bf16, r, cols), y_bf16, &mean[r], &rstd[r], sr, w, bias,
                          cols, eps);
    }
}

/* One row of LayerNorm's dx; with dres non-NULL, dx = dres + that, the one
 * float add the add kernel would do afterwards (dx may be dres). */
REGC_CPU_WIDE_VECTORS static void layernorm_bwd_row(float *dxr, const float *dresr,
                                                    const float *dyr, const float *xr,
                                                    const float *w, float m, float s, int64_t cols)
{
    double acc_d[NORM_LANES] = {0}, acc_dx[NORM_LANES] = {0};
    const int64_t c0 = cols / NORM_LANES * NORM_LANES;
    /* one sum per loop: GCC vectorises neither when they share one */
    for (int64_t c = 0; c < c0; c += NORM_LANES)
        for (int u = 0; u < NORM_LANES; u++)
            acc_d[u] += w[c + u] * dyr[c + u];
    for (int64_t c = 0; c < c0; c += NORM_LANES)
        for (int u = 0; u < NORM_LANES; u++) {
            float xhat = (xr[c + u] - m) * s;
            float dnorm = w[c + u] * dyr[c + u];
            acc_dx[u] += (double)dnorm * xhat;
        }
    for (int64_t c = c0; c < cols; c++) {
        float xhat = (xr[c] - m) * s;
        float dnorm = w[c] * dyr[c];
        acc_d[c % NORM_LANES] += dnorm;
        acc_dx[c % NORM_LANES] += (double)dnorm * xhat;
    }
    const double dnorm_sum = norm_lanes_total(acc_d), dnorm_xhat_sum = norm_lanes_total(acc_dx);
    const float dnorm_mean = regc_norm_mean_f(dnorm_sum, cols);
    const float dnorm_xhat_mean = regc_norm_mean_f(dnorm_xhat_sum, cols);
    if (dresr) {
        for (int64_t c = 0; c < cols; c++)
            dxr[c] = regc_addf(dresr[c], regc_layernorm_dx(xr[c], dyr[c], w[c], m, s, dnorm_mean,
                                                           dnorm_xhat_mean));
    } else {
        for (int64_t c = 0; c < cols; c++)
            dxr[c] = regc_layernorm_dx(xr[c], dyr[c], w[c], m, s, dnorm_mean, dnorm_xhat_mean);
    }
}

/* dw, db: sums over rows, so threads own column ranges (no races, and the
 * summation order is independent of the thread count) */
static void layernorm_bwd_params(const regc_backend *be, float *dw, float *db, const float *dy,
                                 const float *x, const float *mean, const float *rstd, int64_t rows,
                                 int64_t cols)
{
    const int threads = regc_cpu_threads(be);
#pragma omp parallel num_threads(threads) if (rows * cols >= regc_cpu_par_min(be))
    {
        int64_t lo, hi;
        regc_cpu_team_columns(cols, &lo, &hi);
        for (int64_t c0 = lo; c0 < hi; c0 += REGC_CPU_COL_CHUNK) {
            const int64_t wd = hi - c0 < REGC_CPU_COL_CHUNK ? hi - c0 : REGC_CPU_COL_CHUNK;
            double acc_w[REGC_CPU_COL_CHUNK] = {0}, acc_b[REGC_CPU_COL_CHUNK] = {0}; /* [wd] */
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
}

static void layernorm_bwd(regc_backend *be, float *dx, float *dw, float *db, const float *dres,
                          const float *dy, const float *x, const float *w, const float *mean,
                          const float *rstd, int64_t rows, int64_t cols)
{
    const int threads = regc_cpu_threads(be);
#pragma omp parallel for num_threads(threads) if (rows * cols >= regc_cpu_par_min(be))             \
    schedule(static)
    for (int64_t r = 0; r < rows; r++)
        layernorm_bwd_row(dx + r * cols, dres ? dres + r * cols : NULL, dy + r * cols, x + r * cols,
                          w, mean[r], rstd[r], cols);
    layernorm_bwd_params(be, dw, db, dy, x, mean, rstd, rows, cols);
}

void regc_cpu_layernorm_bwd(regc_backend *be, float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, const float *mean, const float *rstd,
                            int64_t rows, int64_t cols)
{
    layernorm_bwd(be, dx, dw, db, NULL, dy, x, w, mean, rstd, rows, cols);
}

void regc_cpu_layernorm_bwd_add(regc_backend *be, float *dx, float *dw, float *db,
                                const float *dres, const float *dy, const float *x, const float *w,
                                const float *mean, const float *rstd, int64_t rows, int64_t cols)
{
    layernorm_bwd(be, dx, dw, db, dres, dy, x, w, mean, rstd, rows, cols);
}

REGC_CPU_WIDE_VECTORS static void rmsnorm_fwd_row(void *yr, int y_bf16, float *rstd_r,
                                                  const float *xr, const float *w, int64_t cols,
                                                  float eps)
{
    double acc[NORM_LANES] = {0};
    int64_t c0 = 0;
    for (; c0 + NORM_LANES <= cols; c0 += NORM_LANES)
        for (int u = 0; u < NORM_LANES; u++)
            acc[u] += (double)xr[c0 + u] * xr[c0 + u];
    for (int64_t c = c0; c < cols; c++)
        acc[c % NORM_LANES] += (double)xr[c] * xr[c];
    const double sq = norm_lanes_total(acc);
    double ms = cols > 0 ? sq / (double)cols : 0.0;
    float s = regc_norm_rstd(ms, eps);
    if (y_bf16)
        for (int64_t c = 0; c < cols; c++)
            ((uint16_t *)yr)[c] = regc_bf16_bits(regc_rmsnorm_y(xr[c], s, w[c]));
    else
        for (int64_t c = 0; c < cols; c++)
            ((float *)yr)[c] = regc_rmsnorm_y(xr[c], s, w[c]);
    *rstd_r = s;
}

void regc_cpu_rmsnorm_fwd(regc_backend *be, void *y, float *rstd, const float *x, const float *w,
                          int64_t rows, int64_t cols, float eps, int y_bf16)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        rmsnorm_fwd_row(norm_row_of(y, y_bf16, r, cols), y_bf16, &rstd[r], x + r * cols, w, cols,
                        eps);
}

void regc_cpu_add_rmsnorm_fwd(regc_backend *be, float *sum, void *y, float *rstd, const float *a,
                              const float *b, const float *w, int64_t rows, int64_t cols, float eps,
                              int y_bf16)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *sr = sum + r * cols;     /* [cols] */
        const float *ar = a + r * cols; /* [cols] */
        const float *br = b + r * cols; /* [cols] */
        for (int64_t c = 0; c < cols; c++)
            sr[c] = regc_addf(ar[c], br[c]);
        rmsnorm_fwd_row(norm_row_of(y, y_bf16, r, cols), y_bf16, &rstd[r], sr, w, cols, eps);
    }
}

/* RMSNorm's dx (regc_rmsnorm_dx); with dres non-NULL, dx = dres + that
 * (dx may be dres) */
REGC_CPU_WIDE_VECTORS static void rmsnorm_bwd_row(float *dxr, const float *dresr, const float *dyr,
                                                  const float *xr, const float *w, float s,
                                                  int64_t cols)
{
    double acc[NORM_LANES] = {0};
    int64_t c0 = 0;
    for (; c0 + NORM_LANES <= cols; c0 += NORM_LANES)
        for (int u = 0; u < NORM_LANES; u++)
            acc[u] += (double)(w[c0 + u] * dyr[c0 + u]) * (xr[c0 + u] * s);
    for (int64_t c = c0; c < cols; c++)
        acc[c % NORM_LANES] += (double)(w[c] * dyr[c]) * (xr[c] * s);
    const double gx_sum = norm_lanes_total(acc);
    const float gx_mean = regc_norm_mean_f(gx_sum, cols);
    if (dresr) {
        for (int64_t c = 0; c < cols; c++)
            dxr[c] = regc_addf(dresr[c], regc_rmsnorm_dx(xr[c], dyr[c], w[c], s, gx_mean));
    } else {
        for (int64_t c = 0; c < cols; c++)
            dxr[c] = regc_rmsnorm_dx(xr[c], dyr[c], w[c], s, gx_mean);
    }
}

/* dw: a sum over rows, so threads own column ranges (race-free, and the
 * order does not depend on the thread count) */
static void rmsnorm_bwd_params(const regc_backend *be, float *dw, const float *dy, const float *x,
                               const float *rstd, int64_t rows, int64_t cols)
{
    const int threads = regc_cpu_threads(be);
#pragma omp parallel num_threads(threads) if (rows * cols >= regc_cpu_par_min(be))
    {
        int64_t lo, hi;
        regc_cpu_team_columns(cols, &lo, &hi);
        for (int64_t c0 = lo; c0 < hi; c0 += REGC_CPU_COL_CHUNK) {
            const int64_t wd = hi - c0 < REGC_CPU_COL_CHUNK ? hi - c0 : REGC_CPU_COL_CHUNK;
            double acc[REGC_CPU_COL_CHUNK] = {0}; /* [wd] */
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
}

static void rmsnorm_bwd(regc_backend *be, float *dx, float *dw, const float *dres, const float *dy,
                        const float *x, const float *w, const float *rstd, int64_t rows,
                        int64_t cols)
{
    const int threads = regc_cpu_threads(be);
#pragma omp parallel for num_threads(threads) if (rows * cols >= regc_cpu_par_min(be))             \
    schedule(static)
    for (int64_t r = 0; r < rows; r++)
        rmsnorm_bwd_row(dx + r * cols, dres ? dres + r * cols : NULL, dy + r * cols, x + r * cols,
                        w, rstd[r], cols);
    rmsnorm_bwd_params(be, dw, dy, x, rstd, rows, cols);
}

void regc_cpu_rmsnorm_bwd(regc_backend *be, float *dx, float *dw, const float *dy, const float *x,
                          const float *w, const float *rstd, int64_t rows, int64_t cols)
{
    rmsnorm_bwd(be, dx, dw, NULL, dy, x, w, rstd, rows, cols);
}

void regc_cpu_rmsnorm_bwd_add(regc_backend *be, float *dx, float *dw, const float *dres,
                              const float *dy, const float *x, const float *w, const float *rstd,
                              int64_t rows, int64_t cols)
{
    rmsnorm_bwd(be, dx, dw, dres, dy, x, w, rstd, rows, cols);
}
