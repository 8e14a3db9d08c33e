/* cuda_loss.cu — softmax cross-entropy over rows of logits (vocabularies
 * of 50257 and more), negative targets ignored, and softmax and
 * log-softmax over rows through the same log-sum-exp, giving the CPU
 * backend's bits (cpu_loss.c).
 *
 * Forward, in two kernels:
 * - the log-sum-exp of each row, eight threads per row: the maximum (exact
 *   in any order), then the sum of exp(x - max) in the CPU's eight double
 *   lanes, each thread walking one lane in order, the tail of the row in
 *   lane 0 as cpu_row_logsumexp puts it, the lanes combined in the CPU's
 *   order (cuda_rows.h). The one difference that can remain is the double
 *   log, CUDA's here and glibc's on the CPU (cuda_finish_lse); its code is
 *   also the only fma and approximate reciprocal in this file's PTX;
 * - the loss, the mean of lse - logit over the counted rows, summed in row
 *   order by one thread, as the CPU sums it: the block's threads gather a
 *   chunk of rows' terms in parallel, and thread 0 adds them one by one.
 *   It is rows terms, not rows * cols, so the serial sum costs little.
 * A target at or past the columns is left out of the mean as on the CPU,
 * which also reports it through sync(); the GPU could only name it after
 * a copy back to the host, and the callers guarantee it does not happen
 * (tokens are checked against the vocabulary when they are loaded), so
 * here it is not reported.
 *
 * Backward: the factor g = dloss / n_valid (n_valid the rows with a target
 * >= 0, counted on the device), then one block per row writes
 * regc_ce_dx(x, lse, g, c == target) per element, zeros for an ignored row. */
#include <limits.h>
#include <stdio.h>

#include "cuda_internal.h"
#include "cuda_rows.h"

/* rows per block of the log-sum-exp kernel: CUDA_THREADS threads, eight per row */
#define CUDA_LSE_ROWS_PER_BLOCK (CUDA_THREADS / CUDA_ROW_LANES)

/* threads of the one block that sums the loss or counts the targets */
#define CUDA_LOSS_THREADS 1024

/* Is a grid of `blocks` blocks launchable? If not, the failure is reported. */
static int cuda_check_grid(regc_backend *be, int64_t blocks, const char *what)
{
    if (blocks <= INT_MAX)
        return 1;
    cuda_refuse(be, REGC_ERR_SHAPE, "cuda: %s: %lld blocks do not fit one grid", what,
                (long long)blocks);
    return 0;
}

/* ---- forward */

static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_lse_kernel(float *lse,          /* [rows] */
                    const float *logits, /* [rows, cols] */
                    int64_t rows, int64_t cols)
{
    const int64_t r = (int64_t)blockIdx.x * CUDA_LSE_ROWS_PER_BLOCK + threadIdx.x / CUDA_ROW_LANES;
    const int u = (int)(threadIdx.x % CUDA_ROW_LANES);
    /* a row past the end walks no columns but joins its warp's shuffles */
    const int live = r < rows;
    const int64_t n = live ? cols : 0;
    const float *x = logits + (live ? r * cols : 0); /* [cols] */
    const float mx = cuda_gather_max(cuda_max_lane(x, n, u));
    /* the same for the row's eight threads, so the shuffle below is reached by all */
    const double part = cuda_lse_needs_sum(mx) ? cuda_sum_lse_lane(x, mx, n, u) : 0.0;
    const double sum = cuda_gather_total(part);
    if (live && u == 0)
        lse[r] = cuda_finish_lse(mx, sum);
}

/* softmax or log-softmax of each row: cuda_lse_kernel's log-sum-exp, which
 * every thread of the row holds, then each thread's lane of outputs */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_softmax_kernel(float *y,       /* [rows, cols] */
                        float *lse,     /* [rows] */
                        const float *x, /* [rows, cols] */
                        int64_t rows, int64_t cols, int log)
{
    const int64_t r = (int64_t)blockIdx.x * CUDA_LSE_ROWS_PER_BLOCK + threadIdx.x / CUDA_ROW_LANES;
    const int u = (int)(threadIdx.x % CUDA_ROW_LANES);
    const int live = r < rows;
    const int64_t n = live ? cols : 0, off = live ? r * cols : 0;
    const float mx = cuda_gather_max(cuda_max_lane(x + off, n, u));
    const double part = cuda_lse_needs_sum(mx) ? cuda_sum_lse_lane(x + off, mx, n, u) : 0.0;
    const float l = cuda_finish_lse(mx, cuda_gather_total(part));
    cuda_write_softmax_lane(y + off, x + off, l, n, log, u);
    if (live && u == 0)
        lse[r] = l;
}

static void cuda_softmax_fwd(regc_backend *be, float *y, float *lse, const float *x, int64_t rows,
                             int64_t cols, int log)
{
    if (rows <= 0)
        return;
    const int64_t blocks = (rows + CUDA_LSE_ROWS_PER_BLOCK - 1) / CUDA_LSE_ROWS_PER_BLOCK;
    if (!cuda_check_grid(be, blocks, "softmax_fwd"))
        return;
    cuda_softmax_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(y, lse, x, rows,
                                                                                cols, log);
    cuda_note(be, cudaGetLastError(), "softmax_fwd");
}

/* loss[0], from lse written by cuda_lse_kernel and each row's target
 * logit: in logits, or picked out already (picked non-NULL:
 * cuda_ce_pick_kernel's); one block */
static __global__ void __launch_bounds__(CUDA_LOSS_THREADS)
    cuda_ce_loss_kernel(float *loss,            /* [1] */
                        const float *lse,       /* [rows] */
                        const float *logits,    /* [rows, cols], or NULL */
                        const float *picked,    /* [rows], or NULL */
                        const int32_t *targets, /* [rows] */
                        int64_t rows, int64_t cols)
{
    __shared__ double term[CUDA_LOSS_THREADS];
    __shared__ int counted[CUDA_LOSS_THREADS];
    double total = 0.0; /* thread 0's */
    int64_t n_valid = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += CUDA_LOSS_THREADS) {
        const int64_t r = r0 + threadIdx.x;
        const int32_t t = r < rows ? targets[r] : -1;
        const int take = cuda_counts_target(t, cols);
        term[threadIdx.x] =
            take ? cuda_ce_term(lse[r], picked ? picked[r] : logits[r * cols + t]) : 0.0;
        counted[threadIdx.x] = take;
        __syncthreads();
        if (threadIdx.x == 0) {
            const int64_t chunk = rows - r0 < CUDA_LOSS_THREADS ? rows - r0 : CUDA_LOSS_THREADS;
            for (int64_t j = 0; j < chunk; j++)
                if (counted[j]) {
                    total += term[j];
                    n_valid++;
                }
        }
        __syncthreads(); /* the chunk is read before the next one overwrites it */
    }
    if (threadIdx.x == 0)
        loss[0] = cuda_finish_loss(total, n_valid);
}

static void cuda_cross_entropy_fwd(regc_backend *be, float *loss, float *lse, const float *logits,
                                   const int32_t *targets, int64_t rows, int64_t cols)
{
    if (rows > 0) {
        const int64_t blocks = (rows + CUDA_LSE_ROWS_PER_BLOCK - 1) / CUDA_LSE_ROWS_PER_BLOCK;
        if (!cuda_check_grid(be, blocks, "cross_entropy_fwd"))
            return;
        cuda_lse_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(lse, logits, rows,
                                                                                cols);
        cuda_note(be, cudaGetLastError(), "cross_entropy_fwd");
    }
    /* with no rows the loss is still written: 0, as on the CPU */
    cuda_ce_loss_kernel<<<1, CUDA_LOSS_THREADS, 0, cuda_stream(be)>>>(loss, lse, logits, NULL,
                                                                      targets, rows, cols);
    cuda_note(be, cudaGetLastError(), "cross_entropy_fwd");
}

/* picked[r] = logits[r, targets[r]], 0 for a target the loss leaves out;
 * a thread a row */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_ce_pick_kernel(float *picked,          /* [rows] */
                        const float *logits,    /* [rows, cols] */
                        const int32_t *targets, /* [rows] */
                        int64_t rows, int64_t cols)
{
    const int64_t r = (int64_t)blockIdx.x * CUDA_THREADS + threadIdx.x;
    if (r < rows)
        picked[r] = cuda_ce_picked(logits + r * cols, targets[r], cols);
}

static void cuda_cross_entropy_rows(regc_backend *be, float *lse, float *picked,
                                    const float *logits, const int32_t *targets, int64_t rows,
                                    int64_t cols)
{
    if (rows <= 0)
        return;
    const int64_t blocks = (rows + CUDA_LSE_ROWS_PER_BLOCK - 1) / CUDA_LSE_ROWS_PER_BLOCK;
    const int64_t pick_blocks = (rows + CUDA_THREADS - 1) / CUDA_THREADS;
    if (!cuda_check_grid(be, blocks, "cross_entropy_rows"))
        return;
    cuda_lse_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(lse, logits, rows,
                                                                            cols);
    cuda_note(be, cudaGetLastError(), "cross_entropy_rows");
    cuda_ce_pick_kernel<<<(unsigned)pick_blocks, CUDA_THREADS, 0, cuda_stream(be)>>>(
        picked, logits, targets, rows, cols);
    cuda_note(be, cudaGetLastError(), "cross_entropy_rows");
}

static void cuda_cross_entropy_loss(regc_backend *be, float *loss, const float *lse,
                                    const float *picked, const int32_t *targets, int64_t rows,
                                    int64_t cols)
{
    cuda_ce_loss_kernel<<<1, CUDA_LOSS_THREADS, 0, cuda_stream(be)>>>(loss, lse, NULL, picked,
                                                                      targets, rows, cols);
    cuda_note(be, cudaGetLastError(), "cross_entropy_loss");
}

/* ---- backward */

/* *g = dloss[0] / n_valid; one block. The count is exact in any order; a
 * fixed tree keeps it one. */
static __global__ void __launch_bounds__(CUDA_LOSS_THREADS)
    cuda_ce_scale_kernel(float *g,               /* [1] */
                         const float *dloss,     /* [1] */
                         const int32_t *targets, /* [rows] */
                         int64_t rows)
{
    __shared__ int64_t count[CUDA_LOSS_THREADS];
    int64_t n = 0;
    for (int64_t r = threadIdx.x; r < rows; r += CUDA_LOSS_THREADS)
        n += targets[r] >= 0;
    count[threadIdx.x] = n;
    __syncthreads();
    for (int w = CUDA_LOSS_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            count[threadIdx.x] += count[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *g = cuda_ce_grad_scale(dloss[0], count[0]);
}

/* one block per row, its threads striding over the columns */
static __global__ void __launch_bounds__(CUDA_THREADS)
    cuda_ce_dx_kernel(void *dlogits,          /* [rows, cols], fp32 or (bf16) bf16 */
                      const float *g,         /* [1] */
                      const float *logits,    /* [rows, cols] */
                      const int32_t *targets, /* [rows] */
                      const float *lse,       /* [rows] */
                      int64_t cols, int bf16)
{
    const int64_t r = blockIdx.x;
    const int32_t t = targets[r];
    const float l = lse[r], gv = *g;
    const float *x = logits + r * cols;                     /* [cols] */
    void *dx = (char *)dlogits + r * cols * (bf16 ? 2 : 4); /* [cols] */
    for (int64_t c = threadIdx.x; c < cols; c += CUDA_THREADS)
        regc_store_f32_or_bf16(dx, bf16, c, cuda_ce_dx_at(x, l, gv, t, c));
}

static void cuda_cross_entropy_bwd(regc_backend *be, void *dlogits, const float *dloss,
                                   const float *logits, const int32_t *all_targets,
                                   const float *lse, int64_t rows, int64_t cols, int64_t row0,
                                   int64_t all_rows, int dlogits_bf16)
{
    if (rows <= 0 || cols <= 0)
        return; /* no gradient to write */
    if (!cuda_check_grid(be, rows, "cross_entropy_bwd"))
        return;
    float *g = (float *)cuda_scratch_alloc(be, sizeof *g, "cross_entropy_bwd");
    if (!g)
        return;
    cuda_ce_scale_kernel<<<1, CUDA_LOSS_THREADS, 0, cuda_stream(be)>>>(g, dloss, all_targets,
                                                                       all_rows);
    cuda_note(be, cudaGetLastError(), "cross_entropy_bwd");
    cuda_ce_dx_kernel<<<(unsigned)rows, CUDA_THREADS, 0, cuda_stream(be)>>>(
        dlogits, g, logits, all_targets + row0, lse, cols, dlogits_bf16);
    cuda_note(be, cudaGetLastError(), "cross_entropy_bwd");
    cuda_scratch_free(be, g, "cross_entropy_bwd");
}

void regc_cuda_set_loss(regc_backend *be)
{
    be->softmax_fwd = cuda_softmax_fwd;
    be->cross_entropy_fwd = cuda_cross_entropy_fwd;
    be->cross_entropy_bwd = cuda_cross_entropy_bwd;
    be->cross_entropy_rows = cuda_cross_entropy_rows;
    be->cross_entropy_loss = cuda_cross_entropy_loss;
}
