/* cuda_norm.cu — LayerNorm and RMSNorm over the last axis, forward and
 * backward, and each fused with the residual add beside it, and a row's
 * plain sum or mean, giving the CPU backend's bits (cpu_norm.c).
 *
 * The CPU sums each row in eight double lanes in a fixed order; here each
 * row has eight threads (four rows to a warp, the eight reading eight
 * adjacent floats), thread u walking lane u in order, and the eight
 * partials are combined by the CPU's expression (cuda_rows.h). The same
 * per-thread functions run on the host in tests/test_cuda_rows.c, which
 * checks them against the CPU backend without a GPU.
 *
 * The parameter gradients (dw, db) are column sums, each column down the
 * rows from row 0 in double as on the CPU, one thread per column. That
 * favours determinism and CPU parity over speed: a column is one chain of
 * dependent adds, and a tall matrix with few columns keeps few threads
 * busy, where a split over rows would be faster but sum in another order.
 *
 * The fused forms run the unfused arithmetic: the sum is written and then
 * normalised (read back by the thread that wrote it), and the backward's
 * dx = dres + the norm's dx is one float add (dx may be dres). */
#include <limits.h>
#include <stdio.h>

#include "cuda_internal.h"
#include "cuda_rows.h"

/* rows per block of the row kernels: CUDA_THREADS threads, eight per row */
#define CUDA_ROWS_PER_BLOCK (CUDA_THREADS / CUDA_ROW_LANES)

/* Blocks of CUDA_ROWS_PER_BLOCK rows covering `rows`, or 0 after reporting
 * a count no grid holds (more than 2^31 - 1 blocks). */
static unsigned cuda_count_row_blocks(regc_backend *be, int64_t rows, const char *what)
{
    const int64_t blocks = (rows + CUDA_ROWS_PER_BLOCK - 1) / CUDA_ROWS_PER_BLOCK;
    if (blocks > INT_MAX) {
        cuda_refuse(be, REGC_ERR_SHAPE, "cuda: %s: %lld rows do not fit one grid", what,
                    (long long)rows);
        return 0;
    }
    return (unsigned)blocks;
}

/* The thread's row and lane. A row past the end walks no columns (n = 0)
 * but still joins its warp's shuffles; `live` says whether it writes. */
typedef struct {
    int64_t r;   /* the row */
    int64_t off; /* its first element: r * cols, 0 past the end */
    int64_t n;   /* the columns it walks: cols, 0 past the end */
    int u;       /* the lane */
    int live;
} cuda_row_slot;

static __device__ __forceinline__ cuda_row_slot cuda_find_row(int64_t rows, int64_t cols)
{
    cuda_row_slot t;
    t.r = (int64_t)blockIdx.x * CUDA_ROWS_PER_BLOCK + threadIdx.x / CUDA_ROW_LANES;
    t.u = (int)(threadIdx.x % CUDA_ROW_LANES);
    t.live = t.r < rows;
    t.off = t.live ? t.r * cols : 0;
    t.n = t.live ? cols : 0;
    return t;
}

/* ---- forward */

/* LayerNorm of each row; with a non-NULL, x is first replaced by
 * sum = a + b (x is then ignored and sum is normalised) */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_layernorm_fwd_kernel(float *sum,        /* [rows, cols], the fused add's */
                              void *y,           /* [rows, cols], fp32 or (y_bf16) bf16 */
                              float *mean,       /* [rows] */
                              float *rstd,       /* [rows] */
                              const float *x,    /* [rows, cols], unfused */
                              const float *a,    /* [rows, cols], fused */
                              const float *b,    /* [rows, cols], fused */
                              const float *w,    /* [cols] */
                              const float *bias, /* [cols] */
                              int64_t rows, int64_t cols, float eps, int y_bf16)
{
    const cuda_row_slot t = cuda_find_row(rows, cols);
    double part;
    const float *xr; /* [cols] */
    if (a) {
        part = cuda_add_sum_lane(sum + t.off, a + t.off, b + t.off, t.n, t.u);
        xr = sum + t.off;
    } else {
        part = cuda_sum_lane(x + t.off, t.n, t.u);
        xr = x + t.off;
    }
    const double mu = cuda_divide_cols(cuda_gather_total(part), cols);
    /* biased variance, as PyTorch normalises */
    const double var =
        cuda_divide_cols(cuda_gather_total(cuda_sum_sq_dev_lane(xr, mu, t.n, t.u)), cols);
    const float m = (float)mu;
    const float s = regc_norm_rstd(var, eps);
    cuda_write_layernorm_lane(cuda_row_of(y, y_bf16, t.off), y_bf16, xr, w, bias, m, s, t.n, t.u);
    if (t.live && t.u == 0) {
        mean[t.r] = m;
        rstd[t.r] = s;
    }
}

static void cuda_launch_layernorm_fwd(regc_backend *be, float *sum, void *y, float *mean,
                                      float *rstd, const float *x, const float *a, const float *b,
                                      const float *w, const float *bias, int64_t rows, int64_t cols,
                                      float eps, int y_bf16, const char *what)
{
    if (rows <= 0)
        return;
    const unsigned blocks = cuda_count_row_blocks(be, rows, what);
    if (blocks == 0)
        return;
    cuda_layernorm_fwd_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(
        sum, y, mean, rstd, x, a, b, w, bias, rows, cols, eps, y_bf16);
    cuda_note(be, cudaGetLastError(), what);
}

static void cuda_layernorm_fwd(regc_backend *be, void *y, float *mean, float *rstd, const float *x,
                               const float *w, const float *b, int64_t rows, int64_t cols,
                               float eps, int y_bf16)
{
    cuda_launch_layernorm_fwd(be, NULL, y, mean, rstd, x, NULL, NULL, w, b, rows, cols, eps, y_bf16,
                              "layernorm_fwd");
}

static void cuda_add_layernorm_fwd(regc_backend *be, float *sum, void *y, float *mean, float *rstd,
                                   const float *a, const float *b, const float *w,
                                   const float *bias, int64_t rows, int64_t cols, float eps,
                                   int y_bf16)
{
    cuda_launch_layernorm_fwd(be, sum, y, mean, rstd, NULL, a, b, w, bias, rows, cols, eps, y_bf16,
                              "add_layernorm_fwd");
}

/* RMSNorm of each row; with a non-NULL, of sum = a + b (written) */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_rmsnorm_fwd_kernel(float *sum,     /* [rows, cols], the fused add's */
                            void *y,        /* [rows, cols], fp32 or (y_bf16) bf16 */
                            float *rstd,    /* [rows] */
                            const float *x, /* [rows, cols], unfused */
                            const float *a, /* [rows, cols], fused */
                            const float *b, /* [rows, cols], fused */
                            const float *w, /* [cols] */
                            int64_t rows, int64_t cols, float eps, int y_bf16)
{
    const cuda_row_slot t = cuda_find_row(rows, cols);
    double part;
    const float *xr; /* [cols] */
    if (a) {
        part = cuda_add_sum_sq_lane(sum + t.off, a + t.off, b + t.off, t.n, t.u);
        xr = sum + t.off;
    } else {
        part = cuda_sum_sq_lane(x + t.off, t.n, t.u);
        xr = x + t.off;
    }
    const double ms = cuda_divide_cols(cuda_gather_total(part), cols);
    const float s = regc_norm_rstd(ms, eps);
    cuda_write_rmsnorm_lane(cuda_row_of(y, y_bf16, t.off), y_bf16, xr, w, s, t.n, t.u);
    if (t.live && t.u == 0)
        rstd[t.r] = s;
}

static void cuda_launch_rmsnorm_fwd(regc_backend *be, float *sum, void *y, float *rstd,
                                    const float *x, const float *a, const float *b, const float *w,
                                    int64_t rows, int64_t cols, float eps, int y_bf16,
                                    const char *what)
{
    if (rows <= 0)
        return;
    const unsigned blocks = cuda_count_row_blocks(be, rows, what);
    if (blocks == 0)
        return;
    cuda_rmsnorm_fwd_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(sum, y, rstd, x, a, b, w,
                                                                          rows, cols, eps, y_bf16);
    cuda_note(be, cudaGetLastError(), what);
}

static void cuda_rmsnorm_fwd(regc_backend *be, void *y, float *rstd, const float *x, const float *w,
                             int64_t rows, int64_t cols, float eps, int y_bf16)
{
    cuda_launch_rmsnorm_fwd(be, NULL, y, rstd, x, NULL, NULL, w, rows, cols, eps, y_bf16,
                            "rmsnorm_fwd");
}

static void cuda_add_rmsnorm_fwd(regc_backend *be, float *sum, void *y, float *rstd, const float *a,
                                 const float *b, const float *w, int64_t rows, int64_t cols,
                                 float eps, int y_bf16)
{
    cuda_launch_rmsnorm_fwd(be, sum, y, rstd, NULL, a, b, w, rows, cols, eps, y_bf16,
                            "add_rmsnorm_fwd");
}

/* ---- a row's plain sum or mean, the lanes of LayerNorm's mean */

static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_row_sum_kernel(float *out,     /* [rows] */
                        const float *x, /* [rows, cols] */
                        int64_t rows, int64_t cols, int mean)
{
    const cuda_row_slot t = cuda_find_row(rows, cols);
    const double total = cuda_gather_total(cuda_sum_lane(x + t.off, t.n, t.u));
    if (t.live && t.u == 0)
        out[t.r] = cuda_finish_row_sum(total, cols, mean);
}

static void cuda_row_sum(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols,
                         int mean)
{
    if (rows <= 0)
        return;
    const unsigned blocks = cuda_count_row_blocks(be, rows, "row_sum");
    if (blocks == 0)
        return;
    cuda_row_sum_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(out, x, rows, cols, mean);
    cuda_note(be, cudaGetLastError(), "row_sum");
}

/* ---- backward */

/* LayerNorm's dx of each row; with dres non-NULL, dx = dres + that */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_layernorm_dx_kernel(float *dx,         /* [rows, cols] */
                             const float *dres, /* [rows, cols] or NULL */
                             const float *dy,   /* [rows, cols] */
                             const float *x,    /* [rows, cols] */
                             const float *w,    /* [cols] */
                             const float *mean, /* [rows] */
                             const float *rstd, /* [rows] */
                             int64_t rows, int64_t cols)
{
    const cuda_row_slot t = cuda_find_row(rows, cols);
    const float m = t.live ? mean[t.r] : 0.0f;
    const float s = t.live ? rstd[t.r] : 0.0f;
    double d_part, dx_part;
    cuda_sum_layernorm_bwd_lane(&d_part, &dx_part, dy + t.off, x + t.off, w, m, s, t.n, t.u);
    const float dnorm_mean = regc_norm_mean_f(cuda_gather_total(d_part), cols);
    const float dnorm_xhat_mean = regc_norm_mean_f(cuda_gather_total(dx_part), cols);
    cuda_write_layernorm_dx_lane(dx + t.off, dres ? dres + t.off : NULL, dy + t.off, x + t.off, w,
                                 m, s, dnorm_mean, dnorm_xhat_mean, t.n, t.u);
}

/* dw, db: one thread per column */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_layernorm_params_kernel(float *dw,         /* [cols] */
                                 float *db,         /* [cols] */
                                 const float *dy,   /* [rows, cols] */
                                 const float *x,    /* [rows, cols] */
                                 const float *mean, /* [rows] */
                                 const float *rstd, /* [rows] */
                                 int64_t rows, int64_t cols)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols)
        cuda_sum_layernorm_column(dw, db, dy, x, mean, rstd, rows, cols, c);
}

static void cuda_launch_layernorm_bwd(regc_backend *be, float *dx, float *dw, float *db,
                                      const float *dres, const float *dy, const float *x,
                                      const float *w, const float *mean, const float *rstd,
                                      int64_t rows, int64_t cols, const char *what)
{
    if (rows > 0) {
        const unsigned blocks = cuda_count_row_blocks(be, rows, what);
        if (blocks == 0)
            return;
        cuda_layernorm_dx_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(
            dx, dres, dy, x, w, mean, rstd, rows, cols);
        cuda_note(be, cudaGetLastError(), what);
    }
    /* with no rows, dw and db are still written: zeros, as on the CPU */
    if (cols > 0) {
        cuda_layernorm_params_kernel<<<cuda_blocks_for(cols), CUDA_THREADS, 0, cuda_stream(be)>>>(
            dw, db, dy, x, mean, rstd, rows, cols);
        cuda_note(be, cudaGetLastError(), what);
    }
}

static void cuda_layernorm_bwd(regc_backend *be, float *dx, float *dw, float *db, const float *dy,
                               const float *x, const float *w, const float *mean, const float *rstd,
                               int64_t rows, int64_t cols)
{
    cuda_launch_layernorm_bwd(be, dx, dw, db, NULL, dy, x, w, mean, rstd, rows, cols,
                              "layernorm_bwd");
}

static void cuda_layernorm_bwd_add(regc_backend *be, float *dx, float *dw, float *db,
                                   const float *dres, const float *dy, const float *x,
                                   const float *w, const float *mean, const float *rstd,
                                   int64_t rows, int64_t cols)
{
    cuda_launch_layernorm_bwd(be, dx, dw, db, dres, dy, x, w, mean, rstd, rows, cols,
                              "layernorm_bwd_add");
}

/* RMSNorm's dx of each row; with dres non-NULL, dx = dres + that */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_rmsnorm_dx_kernel(float *dx,         /* [rows, cols] */
                           const float *dres, /* [rows, cols] or NULL */
                           const float *dy,   /* [rows, cols] */
                           const float *x,    /* [rows, cols] */
                           const float *w,    /* [cols] */
                           const float *rstd, /* [rows] */
                           int64_t rows, int64_t cols)
{
    const cuda_row_slot t = cuda_find_row(rows, cols);
    const float s = t.live ? rstd[t.r] : 0.0f;
    const double part = cuda_sum_rmsnorm_bwd_lane(dy + t.off, x + t.off, w, s, t.n, t.u);
    const float gx_mean = regc_norm_mean_f(cuda_gather_total(part), cols);
    cuda_write_rmsnorm_dx_lane(dx + t.off, dres ? dres + t.off : NULL, dy + t.off, x + t.off, w, s,
                               gx_mean, t.n, t.u);
}

/* dw: one thread per column */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_rmsnorm_params_kernel(float *dw,         /* [cols] */
                               const float *dy,   /* [rows, cols] */
                               const float *x,    /* [rows, cols] */
                               const float *rstd, /* [rows] */
                               int64_t rows, int64_t cols)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols)
        cuda_sum_rmsnorm_column(dw, dy, x, rstd, rows, cols, c);
}

static void cuda_launch_rmsnorm_bwd(regc_backend *be, float *dx, float *dw, const float *dres,
                                    const float *dy, const float *x, const float *w,
                                    const float *rstd, int64_t rows, int64_t cols, const char *what)
{
    if (rows > 0) {
        const unsigned blocks = cuda_count_row_blocks(be, rows, what);
        if (blocks == 0)
            return;
        cuda_rmsnorm_dx_kernel<<<blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(dx, dres, dy, x, w,
                                                                             rstd, rows, cols);
        cuda_note(be, cudaGetLastError(), what);
    }
    if (cols > 0) {
        cuda_rmsnorm_params_kernel<<<cuda_blocks_for(cols), CUDA_THREADS, 0, cuda_stream(be)>>>(
            dw, dy, x, rstd, rows, cols);
        cuda_note(be, cudaGetLastError(), what);
    }
}

static void cuda_rmsnorm_bwd(regc_backend *be, float *dx, float *dw, const float *dy,
                             const float *x, const float *w, const float *rstd, int64_t rows,
                             int64_t cols)
{
    cuda_launch_rmsnorm_bwd(be, dx, dw, NULL, dy, x, w, rstd, rows, cols, "rmsnorm_bwd");
}

static void cuda_rmsnorm_bwd_add(regc_backend *be, float *dx, float *dw, const float *dres,
                                 const float *dy, const float *x, const float *w, const float *rstd,
                                 int64_t rows, int64_t cols)
{
    cuda_launch_rmsnorm_bwd(be, dx, dw, dres, dy, x, w, rstd, rows, cols, "rmsnorm_bwd_add");
}

void regc_cuda_set_norm(regc_backend *be)
{
    be->layernorm_fwd = cuda_layernorm_fwd;
    be->layernorm_bwd = cuda_layernorm_bwd;
    be->rmsnorm_fwd = cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = cuda_rmsnorm_bwd;
    be->add_layernorm_fwd = cuda_add_layernorm_fwd;
    be->add_rmsnorm_fwd = cuda_add_rmsnorm_fwd;
    be->layernorm_bwd_add = cuda_layernorm_bwd_add;
    be->rmsnorm_bwd_add = cuda_rmsnorm_bwd_add;
    be->row_sum = cuda_row_sum;
}
