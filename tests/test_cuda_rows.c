/* test_cuda_rows.c — the CUDA backend's row and column reductions, proven
 * on the host: the per-thread functions of kernels/cuda/cuda_rows.h run
 * for every lane of every row and every column, composed exactly as the
 * kernels of cuda_norm.cu and cuda_loss.cu compose them (the warp shuffles
 * stood in for by combining the eight lanes), and the results compared bit
 * for bit with the CPU backend's kernels: LayerNorm and RMSNorm forward and
 * backward, the residual add fused with each (in place too), the backward
 * fused with the gradient add (dx = dres too), and cross-entropy forward and
 * backward with ignored targets, rows of -inf and +inf, and a target past
 * the columns. The shapes are not multiples of 8 or 256: fewer than 8
 * columns, one column, and vocabulary-sized rows (50257). The log in the
 * log-sum-exp is C's here, as on the CPU; on a GPU it is CUDA's, the one
 * place the bits may differ (cuda_finish_lse). No GPU is needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_rows.h"
#include "regc_backend.h"
#include "regc_common.h"
#include "test_device.h"

static regc_backend *bes[2]; /* one thread, two threads */

static int group_setup(void **state)
{
    (void)state;
    bes[0] = regc_test_cpu_backend(1);
    bes[1] = regc_test_cpu_backend(2);
    return bes[0] && bes[1] ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(bes[1]);
    regc_backend_free(bes[0]);
    return 0;
}

typedef struct {
    int64_t rows, cols;
} shape2;

/* the norms' shapes: one column, fewer than 8, multiples of 8 and not, more
 * than a warp's rows, and past the CPU's threshold for going parallel
 * (32768 elements) */
static const shape2 norm_shapes[] = {{1, 1},    {3, 1},    {2, 3},    {3, 7},   {5, 8},
                                     {4, 9},    {7, 37},   {3, 300},  {9, 513}, {33, 768},
                                     {64, 769}, {1, 4099}, {50, 1000}};
#define N_NORM_SHAPES (sizeof norm_shapes / sizeof norm_shapes[0])

/* cross-entropy's: around the CPU's blocks of 256 and groups of 8, and
 * GPT-2's vocabulary */
static const shape2 ce_shapes[] = {{1, 1},   {3, 5},   {4, 7},    {5, 8},    {6, 255},  {3, 256},
                                   {3, 257}, {2, 263}, {17, 513}, {4, 1000}, {3, 50257}};
#define N_CE_SHAPES (sizeof ce_shapes / sizeof ce_shapes[0])

static size_t count(shape2 s) { return (size_t)(s.rows * s.cols); }

static void expect_bits(const char *what, shape2 s, const float *emulated, const float *cpu,
                        size_t n)
{
    char label[160];
    snprintf(label, sizeof label, "%s [%lld x %lld]", what, (long long)s.rows, (long long)s.cols);
    regc_test_assert_bitwise_equal(label, emulated, cpu, n);
}

/* a host copy of n floats */
static float *host_copy(const float *src, size_t n)
{
    float *h = regc_test_host_floats(n);
    memcpy(h, src, n * sizeof(float));
    return h;
}

/* ---- the kernels, emulated: every lane of a row, then what the shuffles
 * deliver (cuda_gather_total, cuda_gather_max) */

static double gather_total(const double *lane) { return cuda_combine_lanes(lane); }

static float gather_max(const float *lane)
{
    float mx = -INFINITY;
    for (int k = 0; k < CUDA_ROW_LANES; k++)
        mx = cuda_max_of(mx, lane[k]);
    return mx;
}

/* cuda_layernorm_fwd_kernel, each row; with a non-NULL, sum = a + b first */
static void emulate_layernorm_fwd(float *sum, float *y, float *mean, float *rstd, const float *x,
                                  const float *a, const float *b, const float *w, const float *bias,
                                  int64_t rows, int64_t cols, float eps)
/* sum, y, x, a, b: [rows, cols]; mean, rstd: [rows]; w, bias: [cols] */
{
    for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * cols;
        double part[CUDA_ROW_LANES];
        const float *xr = a ? sum + off : x + off; /* [cols] */
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            part[u] = a ? cuda_add_sum_lane(sum + off, a + off, b + off, cols, u)
                        : cuda_sum_lane(x + off, cols, u);
        const double mu = cuda_divide_cols(gather_total(part), cols);
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            part[u] = cuda_sum_sq_dev_lane(xr, mu, cols, u);
        const double var = cuda_divide_cols(gather_total(part), cols);
        const float m = (float)mu;
        const float s = regc_norm_rstd(var, eps);
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            cuda_write_layernorm_lane(y + off, 0, xr, w, bias, m, s, cols, u);
        mean[r] = m;
        rstd[r] = s;
    }
}

/* cuda_rmsnorm_fwd_kernel */
static void emulate_rmsnorm_fwd(float *sum, float *y, float *rstd, const float *x, const float *a,
                                const float *b, const float *w, int64_t rows, int64_t cols,
                                float eps)
/* sum, y, x, a, b: [rows, cols]; rstd: [rows]; w: [cols] */
{
    for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * cols;
        double part[CUDA_ROW_LANES];
        const float *xr = a ? sum + off : x + off; /* [cols] */
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            part[u] = a ? cuda_add_sum_sq_lane(sum + off, a + off, b + off, cols, u)
                        : cuda_sum_sq_lane(x + off, cols, u);
        const double ms = cuda_divide_cols(gather_total(part), cols);
        const float s = regc_norm_rstd(ms, eps);
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            cuda_write_rmsnorm_lane(y + off, 0, xr, w, s, cols, u);
        rstd[r] = s;
    }
}

/* cuda_layernorm_dx_kernel, then cuda_layernorm_params_kernel */
static void emulate_layernorm_bwd(float *dx, float *dw, float *db, const float *dres,
                                  const float *dy, const float *x, const float *w,
                                  const float *mean, const float *rstd, int64_t rows, int64_t cols)
/* dx, dres, dy, x: [rows, cols]; dw, db, w: [cols]; mean, rstd: [rows] */
{
    for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * cols;
        double d_part[CUDA_ROW_LANES], dx_part[CUDA_ROW_LANES];
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            cuda_sum_layernorm_bwd_lane(&d_part[u], &dx_part[u], dy + off, x + off, w, mean[r],
                                        rstd[r], cols, u);
        const float dnorm_mean = regc_norm_mean_f(gather_total(d_part), cols);
        const float dnorm_xhat_mean = regc_norm_mean_f(gather_total(dx_part), cols);
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            cuda_write_layernorm_dx_lane(dx + off, dres ? dres + off : NULL, dy + off, x + off, w,
                                         mean[r], rstd[r], dnorm_mean, dnorm_xhat_mean, cols, u);
    }
    for (int64_t c = 0; c < cols; c++)
        cuda_sum_layernorm_column(dw, db, dy, x, mean, rstd, rows, cols, c);
}

/* cuda_rmsnorm_dx_kernel, then cuda_rmsnorm_params_kernel */
static void emulate_rmsnorm_bwd(float *dx, float *dw, const float *dres, const float *dy,
                                const float *x, const float *w, const float *rstd, int64_t rows,
                                int64_t cols)
/* dx, dres, dy, x: [rows, cols]; dw, w: [cols]; rstd: [rows] */
{
    for (int64_t r = 0; r < rows; r++) {
        const int64_t off = r * cols;
        double part[CUDA_ROW_LANES];
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            part[u] = cuda_sum_rmsnorm_bwd_lane(dy + off, x + off, w, rstd[r], cols, u);
        const float gx_mean = regc_norm_mean_f(gather_total(part), cols);
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            cuda_write_rmsnorm_dx_lane(dx + off, dres ? dres + off : NULL, dy + off, x + off, w,
                                       rstd[r], gx_mean, cols, u);
    }
    for (int64_t c = 0; c < cols; c++)
        cuda_sum_rmsnorm_column(dw, dy, x, rstd, rows, cols, c);
}

/* one row's log-sum-exp as the eight threads of cuda_lse_kernel (and of
 * cuda_softmax_kernel) find it */
static float emulate_lse_row(const float *x, int64_t cols) /* x: [cols] */
{
    float mx_part[CUDA_ROW_LANES];
    for (int u = 0; u < CUDA_ROW_LANES; u++)
        mx_part[u] = cuda_max_lane(x, cols, u);
    const float mx = gather_max(mx_part);
    double part[CUDA_ROW_LANES];
    for (int u = 0; u < CUDA_ROW_LANES; u++)
        part[u] = cuda_lse_needs_sum(mx) ? cuda_sum_lse_lane(x, mx, cols, u) : 0.0;
    return cuda_finish_lse(mx, gather_total(part));
}

/* cuda_softmax_kernel, each row */
static void emulate_softmax(float *y, float *lse, const float *x, int64_t rows, int64_t cols,
                            int log)
/* y, x: [rows, cols]; lse: [rows] */
{
    for (int64_t r = 0; r < rows; r++) {
        lse[r] = emulate_lse_row(x + r * cols, cols);
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            cuda_write_softmax_lane(y + r * cols, x + r * cols, lse[r], cols, log, u);
    }
}

/* cuda_row_sum_kernel, each row */
static void emulate_row_sum(float *out, const float *x, int64_t rows, int64_t cols, int mean)
/* out: [rows]; x: [rows, cols] */
{
    for (int64_t r = 0; r < rows; r++) {
        double part[CUDA_ROW_LANES];
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            part[u] = cuda_sum_lane(x + r * cols, cols, u);
        out[r] = cuda_finish_row_sum(gather_total(part), cols, mean);
    }
}

/* cuda_lse_kernel, then cuda_ce_loss_kernel (thread 0's serial sum) */
static void emulate_ce_fwd(float *loss, float *lse, const float *logits, const int32_t *targets,
                           int64_t rows, int64_t cols)
/* loss: [1]; lse, targets: [rows]; logits: [rows, cols] */
{
    for (int64_t r = 0; r < rows; r++)
        lse[r] = emulate_lse_row(logits + r * cols, cols);
    double total = 0.0;
    int64_t n_valid = 0;
    for (int64_t r = 0; r < rows; r++)
        if (cuda_counts_target(targets[r], cols)) {
            total += cuda_ce_term(lse[r], logits[r * cols + targets[r]]);
            n_valid++;
        }
    loss[0] = cuda_finish_loss(total, n_valid);
}

/* the logits in chunks: cuda_lse_kernel and cuda_ce_pick_kernel per chunk,
 * then cuda_ce_loss_kernel over the picked logits */
static float emulate_ce_chunked_loss(const float *logits, const int32_t *targets, int64_t rows,
                                     int64_t cols)
{
    double total = 0.0;
    int64_t n_valid = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float lse = emulate_lse_row(logits + r * cols, cols);
        const float picked = cuda_ce_picked(logits + r * cols, targets[r], cols);
        if (cuda_counts_target(targets[r], cols)) {
            total += cuda_ce_term(lse, picked);
            n_valid++;
        }
    }
    return cuda_finish_loss(total, n_valid);
}

/* cuda_ce_scale_kernel, then cuda_ce_dx_kernel */
static void emulate_ce_bwd(float *dlogits, float dloss, const float *logits, const int32_t *targets,
                           const float *lse, int64_t rows, int64_t cols)
/* dlogits, logits: [rows, cols]; targets, lse: [rows] */
{
    int64_t n_valid = 0;
    for (int64_t r = 0; r < rows; r++)
        n_valid += targets[r] >= 0;
    const float g = cuda_ce_grad_scale(dloss, n_valid);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dlogits[r * cols + c] = cuda_ce_dx_at(logits + r * cols, lse[r], g, targets[r], c);
}

/* ---- inputs */

/* a norm's input: rows of different offsets, so that the mean matters */
static float *norm_input(shape2 s, uint64_t seed)
{
    const size_t n = count(s);
    float *h = regc_test_host_uniform(n, seed, 0.0f, 2.0f);
    for (int64_t r = 0; r < s.rows; r++)
        for (int64_t c = 0; c < s.cols; c++)
            h[r * s.cols + c] += (float)(r % 5) * 3.25f - 4.0f;
    return h;
}

#define EPS 1e-5f

/* ---- the norms */

static void test_layernorm(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_NORM_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = norm_shapes[i];
            const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
            float *hx = norm_input(s, 100 + i);
            float *hw = regc_test_host_uniform(nc, 110 + i, 1.0f, 0.5f);
            float *hb = regc_test_host_uniform(nc, 120 + i, 0.0f, 0.5f);
            float *hdy = regc_test_host_uniform(n, 130 + i, 0.0f, 1.0f);
            float *x = regc_test_upload(be, hx, n), *w = regc_test_upload(be, hw, nc);
            float *b = regc_test_upload(be, hb, nc), *dy = regc_test_upload(be, hdy, n);
            float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, nr);
            float *rstd = regc_test_dev_nan(be, nr);
            be->layernorm_fwd(be, y, mean, rstd, x, w, b, s.rows, s.cols, EPS, 0);
            float *ey = regc_test_host_floats(n), *emean = regc_test_host_floats(nr);
            float *erstd = regc_test_host_floats(nr);
            emulate_layernorm_fwd(NULL, ey, emean, erstd, hx, NULL, NULL, hw, hb, s.rows, s.cols,
                                  EPS);
            expect_bits("layernorm_fwd y", s, ey, regc_test_download(be, y, n), n);
            expect_bits("layernorm_fwd mean", s, emean, regc_test_download(be, mean, nr), nr);
            expect_bits("layernorm_fwd rstd", s, erstd, regc_test_download(be, rstd, nr), nr);

            float *dx = regc_test_dev_nan(be, n), *dw = regc_test_dev_nan(be, nc);
            float *db = regc_test_dev_nan(be, nc);
            be->layernorm_bwd(be, dx, dw, db, dy, x, w, mean, rstd, s.rows, s.cols);
            float *edx = regc_test_host_floats(n), *edw = regc_test_host_floats(nc);
            float *edb = regc_test_host_floats(nc);
            emulate_layernorm_bwd(edx, edw, edb, NULL, hdy, hx, hw, emean, erstd, s.rows, s.cols);
            expect_bits("layernorm_bwd dx", s, edx, regc_test_download(be, dx, n), n);
            expect_bits("layernorm_bwd dw", s, edw, regc_test_download(be, dw, nc), nc);
            expect_bits("layernorm_bwd db", s, edb, regc_test_download(be, db, nc), nc);
        }
}

static void test_rmsnorm(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_NORM_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = norm_shapes[i];
            const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
            float *hx = norm_input(s, 200 + i);
            float *hw = regc_test_host_uniform(nc, 210 + i, 1.0f, 0.5f);
            float *hdy = regc_test_host_uniform(n, 230 + i, 0.0f, 1.0f);
            float *x = regc_test_upload(be, hx, n), *w = regc_test_upload(be, hw, nc);
            float *dy = regc_test_upload(be, hdy, n);
            float *y = regc_test_dev_nan(be, n), *rstd = regc_test_dev_nan(be, nr);
            be->rmsnorm_fwd(be, y, rstd, x, w, s.rows, s.cols, EPS, 0);
            float *ey = regc_test_host_floats(n), *erstd = regc_test_host_floats(nr);
            emulate_rmsnorm_fwd(NULL, ey, erstd, hx, NULL, NULL, hw, s.rows, s.cols, EPS);
            expect_bits("rmsnorm_fwd y", s, ey, regc_test_download(be, y, n), n);
            expect_bits("rmsnorm_fwd rstd", s, erstd, regc_test_download(be, rstd, nr), nr);

            float *dx = regc_test_dev_nan(be, n), *dw = regc_test_dev_nan(be, nc);
            be->rmsnorm_bwd(be, dx, dw, dy, x, w, rstd, s.rows, s.cols);
            float *edx = regc_test_host_floats(n), *edw = regc_test_host_floats(nc);
            emulate_rmsnorm_bwd(edx, edw, NULL, hdy, hx, hw, erstd, s.rows, s.cols);
            expect_bits("rmsnorm_bwd dx", s, edx, regc_test_download(be, dx, n), n);
            expect_bits("rmsnorm_bwd dw", s, edw, regc_test_download(be, dw, nc), nc);
        }
}

/* y held in bf16: the lane writers with y_bf16, over the rows' statistics,
 * give the CPU kernels' bf16 bytes, every shape, LayerNorm and RMSNorm. */
static void test_norms_bf16_y(void **state)
{
    (void)state;
    regc_backend *be = bes[1];
    for (size_t i = 0; i < N_NORM_SHAPES; i++) {
        const shape2 s = norm_shapes[i];
        const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
        float *hx = norm_input(s, 700 + i);
        float *hw = regc_test_host_uniform(nc, 710 + i, 1.0f, 0.5f);
        float *hb = regc_test_host_uniform(nc, 720 + i, 0.0f, 0.5f);
        float *x = regc_test_upload(be, hx, n), *w = regc_test_upload(be, hw, nc);
        float *b = regc_test_upload(be, hb, nc);
        for (int ln = 0; ln < 2; ln++) {
            float *y16 = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, nr);
            float *rstd = regc_test_dev_nan(be, nr);
            if (ln)
                be->layernorm_fwd(be, y16, mean, rstd, x, w, b, s.rows, s.cols, EPS, 1);
            else
                be->rmsnorm_fwd(be, y16, rstd, x, w, s.rows, s.cols, EPS, 1);
            const float *hmean = regc_test_download(be, mean, nr);
            const float *hrstd = regc_test_download(be, rstd, nr);
            const uint16_t *got = (const uint16_t *)regc_test_download(be, y16, (n + 1) / 2);
            uint16_t *want = calloc(n + 2, sizeof *want);
            assert_non_null(want);
            for (int64_t r = 0; r < s.rows; r++) {
                const int64_t off = r * s.cols;
                for (int u = 0; u < CUDA_ROW_LANES; u++)
                    if (ln)
                        cuda_write_layernorm_lane(cuda_row_of(want, 1, off), 1, hx + off, hw, hb,
                                                  hmean[r], hrstd[r], s.cols, u);
                    else
                        cuda_write_rmsnorm_lane(cuda_row_of(want, 1, off), 1, hx + off, hw,
                                                hrstd[r], s.cols, u);
            }
            for (size_t e = 0; e < n; e++)
                if (got[e] != want[e])
                    fail_msg("%s y in bf16 [%lld x %lld]: element %zu is 0x%04x, the CUDA lanes "
                             "write 0x%04x",
                             ln ? "layernorm" : "rmsnorm", (long long)s.rows, (long long)s.cols, e,
                             got[e], want[e]);
            free(want);
        }
    }
}

/* sum = a + b then the norm, into a new buffer and in place over a */
static void test_add_norms_fwd(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_NORM_SHAPES; i++)
            for (int in_place = 0; in_place < 2; in_place++) {
                regc_backend *be = bes[t];
                const shape2 s = norm_shapes[i];
                const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
                float *ha = norm_input(s, 300 + i);
                float *hb = regc_test_host_uniform(n, 310 + i, 0.0f, 1.0f);
                float *hw = regc_test_host_uniform(nc, 320 + i, 1.0f, 0.5f);
                float *hbias = regc_test_host_uniform(nc, 330 + i, 0.0f, 0.5f);
                float *w = regc_test_upload(be, hw, nc), *bias = regc_test_upload(be, hbias, nc);
                float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, nr);
                float *rstd = regc_test_dev_nan(be, nr);
                float *ey = regc_test_host_floats(n), *emean = regc_test_host_floats(nr);
                float *erstd = regc_test_host_floats(nr);

                float *a = regc_test_upload(be, ha, n), *b = regc_test_upload(be, hb, n);
                float *sum = in_place ? a : regc_test_dev_nan(be, n);
                float *ea = host_copy(ha, n);
                float *esum = in_place ? ea : regc_test_host_floats(n);
                be->add_layernorm_fwd(be, sum, y, mean, rstd, a, b, w, bias, s.rows, s.cols, EPS,
                                      0);
                emulate_layernorm_fwd(esum, ey, emean, erstd, NULL, ea, hb, hw, hbias, s.rows,
                                      s.cols, EPS);
                expect_bits("add_layernorm_fwd sum", s, esum, regc_test_download(be, sum, n), n);
                expect_bits("add_layernorm_fwd y", s, ey, regc_test_download(be, y, n), n);
                expect_bits("add_layernorm_fwd mean", s, emean, regc_test_download(be, mean, nr),
                            nr);
                expect_bits("add_layernorm_fwd rstd", s, erstd, regc_test_download(be, rstd, nr),
                            nr);
                /* the emulated fused kernel against the emulated unfused ones too */
                float *uy = regc_test_host_floats(n), *umean = regc_test_host_floats(nr);
                float *urstd = regc_test_host_floats(nr);
                emulate_layernorm_fwd(NULL, uy, umean, urstd, esum, NULL, NULL, hw, hbias, s.rows,
                                      s.cols, EPS);
                expect_bits("add_layernorm_fwd y, unfused", s, ey, uy, n);

                a = regc_test_upload(be, ha, n);
                sum = in_place ? a : regc_test_dev_nan(be, n);
                ea = host_copy(ha, n);
                esum = in_place ? ea : regc_test_host_floats(n);
                be->add_rmsnorm_fwd(be, sum, y, rstd, a, b, w, s.rows, s.cols, EPS, 0);
                emulate_rmsnorm_fwd(esum, ey, erstd, NULL, ea, hb, hw, s.rows, s.cols, EPS);
                expect_bits("add_rmsnorm_fwd sum", s, esum, regc_test_download(be, sum, n), n);
                expect_bits("add_rmsnorm_fwd y", s, ey, regc_test_download(be, y, n), n);
                expect_bits("add_rmsnorm_fwd rstd", s, erstd, regc_test_download(be, rstd, nr), nr);
                emulate_rmsnorm_fwd(NULL, uy, urstd, esum, NULL, NULL, hw, s.rows, s.cols, EPS);
                expect_bits("add_rmsnorm_fwd y, unfused", s, ey, uy, n);
            }
}

/* dx = dres + the norm's dx, into a new buffer and in place over dres */
static void test_norms_bwd_add(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_NORM_SHAPES; i++)
            for (int in_place = 0; in_place < 2; in_place++) {
                regc_backend *be = bes[t];
                const shape2 s = norm_shapes[i];
                const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
                float *hx = norm_input(s, 400 + i);
                float *hw = regc_test_host_uniform(nc, 410 + i, 1.0f, 0.5f);
                float *hdy = regc_test_host_uniform(n, 420 + i, 0.0f, 1.0f);
                float *hdres = regc_test_host_uniform(n, 430 + i, 0.0f, 1.0f);
                float *hmean = regc_test_host_floats(nr), *hrstd = regc_test_host_floats(nr);
                float *scratch = regc_test_host_floats(n);
                emulate_layernorm_fwd(NULL, scratch, hmean, hrstd, hx, NULL, NULL, hw, hw, s.rows,
                                      s.cols, EPS);
                float *x = regc_test_upload(be, hx, n), *w = regc_test_upload(be, hw, nc);
                float *dy = regc_test_upload(be, hdy, n);
                float *mean = regc_test_upload(be, hmean, nr);
                float *rstd = regc_test_upload(be, hrstd, nr);
                float *dw = regc_test_dev_nan(be, nc), *db = regc_test_dev_nan(be, nc);
                float *edw = regc_test_host_floats(nc), *edb = regc_test_host_floats(nc);

                float *dres = regc_test_upload(be, hdres, n);
                float *dx = in_place ? dres : regc_test_dev_nan(be, n);
                float *edres = host_copy(hdres, n);
                float *edx = in_place ? edres : regc_test_host_floats(n);
                be->layernorm_bwd_add(be, dx, dw, db, dres, dy, x, w, mean, rstd, s.rows, s.cols);
                emulate_layernorm_bwd(edx, edw, edb, edres, hdy, hx, hw, hmean, hrstd, s.rows,
                                      s.cols);
                expect_bits("layernorm_bwd_add dx", s, edx, regc_test_download(be, dx, n), n);
                expect_bits("layernorm_bwd_add dw", s, edw, regc_test_download(be, dw, nc), nc);
                expect_bits("layernorm_bwd_add db", s, edb, regc_test_download(be, db, nc), nc);
                /* against the emulated unfused kernels: the norm's dx, then the add */
                float *udx = regc_test_host_floats(n), *udw = regc_test_host_floats(nc);
                float *udb = regc_test_host_floats(nc);
                emulate_layernorm_bwd(udx, udw, udb, NULL, hdy, hx, hw, hmean, hrstd, s.rows,
                                      s.cols);
                for (size_t e = 0; e < n; e++)
                    udx[e] = regc_addf(hdres[e], udx[e]);
                expect_bits("layernorm_bwd_add dx, unfused", s, edx, udx, n);

                dres = regc_test_upload(be, hdres, n);
                dx = in_place ? dres : regc_test_dev_nan(be, n);
                edres = host_copy(hdres, n);
                edx = in_place ? edres : regc_test_host_floats(n);
                be->rmsnorm_bwd_add(be, dx, dw, dres, dy, x, w, rstd, s.rows, s.cols);
                emulate_rmsnorm_bwd(edx, edw, edres, hdy, hx, hw, hrstd, s.rows, s.cols);
                expect_bits("rmsnorm_bwd_add dx", s, edx, regc_test_download(be, dx, n), n);
                expect_bits("rmsnorm_bwd_add dw", s, edw, regc_test_download(be, dw, nc), nc);
                emulate_rmsnorm_bwd(udx, udw, NULL, hdy, hx, hw, hrstd, s.rows, s.cols);
                for (size_t e = 0; e < n; e++)
                    udx[e] = regc_addf(hdres[e], udx[e]);
                expect_bits("rmsnorm_bwd_add dx, unfused", s, edx, udx, n);
            }
}

/* ---- cross-entropy */

/* Logits and targets of a shape: every third row ignored (-100), some
 * logits -inf (masked classes) in counted rows; with `extremes`, the
 * second-to-last row all -inf and the last with a +inf logit, both
 * ignored (their lse is -inf and +inf). */
static void ce_inputs(shape2 s, uint64_t seed, int extremes, float **hx, int32_t **ht)
{
    const size_t n = count(s);
    float *x = regc_test_host_uniform(n, seed, 0.0f, 8.0f);
    int32_t *t = malloc((size_t)s.rows * sizeof *t);
    assert_non_null(t);
    for (int64_t r = 0; r < s.rows; r++) {
        t[r] = r % 3 == 1 ? -100 : (int32_t)((r * 7919 + 13) % s.cols);
        for (int64_t c = 5; c < s.cols; c += 97)
            if (c != t[r])
                x[r * s.cols + c] = -INFINITY;
    }
    if (extremes && s.rows >= 3) {
        const int64_t r1 = s.rows - 2, r2 = s.rows - 1;
        for (int64_t c = 0; c < s.cols; c++)
            x[r1 * s.cols + c] = -INFINITY;
        x[r2 * s.cols + s.cols / 2] = INFINITY;
        t[r1] = -1;
        t[r2] = -100;
    }
    *hx = x;
    *ht = t;
}

/* forward and backward through the CPU backend against the emulation;
 * `expect_failure`: the CPU reports a bad target through sync() */
static void check_cross_entropy(regc_backend *be, shape2 s, const float *hx, const int32_t *ht,
                                int expect_failure)
{
    const size_t n = count(s), nr = (size_t)s.rows;
    const float dloss = 0.8125f;
    float *x = regc_test_upload(be, hx, n);
    int32_t *targets = regc_test_upload_ints(be, ht, nr);
    float *loss = regc_test_dev_nan(be, 1), *lse = regc_test_dev_nan(be, nr);
    float *dl = regc_test_upload(be, &dloss, 1), *dx = regc_test_dev_nan(be, n);
    be->cross_entropy_fwd(be, loss, lse, x, targets, s.rows, s.cols);
    be->cross_entropy_bwd(be, dx, dl, x, targets, lse, s.rows, s.cols, 0, s.rows, 0);
    float *cl = regc_test_host_floats(1), *clse = regc_test_host_floats(nr);
    float *cdx = regc_test_host_floats(n);
    be->copy_d2h(be, cl, loss, sizeof(float));
    be->copy_d2h(be, clse, lse, nr * sizeof(float));
    be->copy_d2h(be, cdx, dx, n * sizeof(float));
    const int status = be->sync(be);
    if (expect_failure) {
        assert_int_not_equal(status, REGC_OK);
        assert_non_null(strstr(regc_error_message(), "not below"));
    } else {
        assert_int_equal(status, REGC_OK);
    }

    float el, *e_lse = regc_test_host_floats(nr), *edx = regc_test_host_floats(n);
    emulate_ce_fwd(&el, e_lse, hx, ht, s.rows, s.cols);
    emulate_ce_bwd(edx, dloss, hx, ht, e_lse, s.rows, s.cols);
    expect_bits("cross_entropy_fwd lse", s, e_lse, clse, nr);
    expect_bits("cross_entropy_fwd loss", s, &el, cl, 1);
    expect_bits("cross_entropy_bwd dlogits", s, edx, cdx, n);

    /* the logits in chunks of two rows: the same lse, loss and dlogits */
    float *picked = regc_test_dev_nan(be, nr), *chunk_lse = regc_test_dev_nan(be, nr);
    float *chunk_dx = regc_test_dev_nan(be, n);
    for (int64_t r0 = 0; r0 < s.rows; r0 += 2) {
        const int64_t rows = s.rows - r0 < 2 ? s.rows - r0 : 2;
        be->cross_entropy_rows(be, chunk_lse + r0, picked + r0, x + r0 * s.cols, targets + r0, rows,
                               s.cols);
        be->cross_entropy_bwd(be, chunk_dx + r0 * s.cols, dl, x + r0 * s.cols, targets,
                              chunk_lse + r0, rows, s.cols, r0, s.rows, 0);
    }
    be->cross_entropy_loss(be, loss, chunk_lse, picked, targets, s.rows, s.cols);
    be->copy_d2h(be, cl, loss, sizeof(float));
    be->copy_d2h(be, clse, chunk_lse, nr * sizeof(float));
    be->copy_d2h(be, cdx, chunk_dx, n * sizeof(float));
    assert_int_equal(be->sync(be) != REGC_OK, expect_failure);
    const float chunked = emulate_ce_chunked_loss(hx, ht, s.rows, s.cols);
    expect_bits("cross_entropy_loss, the emulated chunks", s, &el, &chunked, 1);
    expect_bits("cross_entropy_rows lse", s, e_lse, clse, nr);
    expect_bits("cross_entropy_loss", s, &el, cl, 1);
    expect_bits("cross_entropy_bwd dlogits in chunks", s, edx, cdx, n);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_CE_SHAPES; i++)
            for (int extremes = 0; extremes < 2; extremes++) {
                const shape2 s = ce_shapes[i];
                float *hx;
                int32_t *ht;
                ce_inputs(s, 500 + i, extremes, &hx, &ht);
                check_cross_entropy(bes[t], s, hx, ht, 0);
                free(ht);
            }
}

/* softmax and log-softmax over cross-entropy's shapes and inputs (-inf
 * logits, rows all -inf, a +inf), the row sum and mean over the norms' */
static void test_softmax_and_row_sum(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++) {
        regc_backend *be = bes[t];
        for (size_t i = 0; i < N_CE_SHAPES; i++) {
            const shape2 s = ce_shapes[i];
            const size_t n = count(s), nr = (size_t)s.rows;
            float *hx;
            int32_t *ht;
            ce_inputs(s, 560 + i, 1, &hx, &ht);
            float *x = regc_test_upload(be, hx, n), *y = regc_test_dev_nan(be, n);
            float *lse = regc_test_dev_nan(be, nr);
            float *ey = regc_test_host_floats(n), *e_lse = regc_test_host_floats(nr);
            for (int log = 0; log < 2; log++) {
                be->softmax_fwd(be, y, lse, x, s.rows, s.cols, log);
                assert_int_equal(be->sync(be), REGC_OK);
                emulate_softmax(ey, e_lse, hx, s.rows, s.cols, log);
                expect_bits(log ? "log_softmax y" : "softmax y", s, ey, host_copy(y, n), n);
                expect_bits("softmax lse", s, e_lse, host_copy(lse, nr), nr);
            }
            free(ht);
        }
        for (size_t i = 0; i < N_NORM_SHAPES; i++) {
            const shape2 s = norm_shapes[i];
            const size_t n = count(s), nr = (size_t)s.rows;
            float *hx = norm_input(s, 580 + i);
            float *x = regc_test_upload(be, hx, n), *out = regc_test_dev_nan(be, nr);
            float *eo = regc_test_host_floats(nr);
            for (int mean = 0; mean < 2; mean++) {
                be->row_sum(be, out, x, s.rows, s.cols, mean);
                assert_int_equal(be->sync(be), REGC_OK);
                emulate_row_sum(eo, hx, s.rows, s.cols, mean);
                expect_bits(mean ? "row_sum mean" : "row_sum", s, eo, host_copy(out, nr), nr);
            }
        }
    }
}

/* every target ignored: the loss and the gradient are zeros */
static void test_cross_entropy_all_ignored(void **state)
{
    (void)state;
    const shape2 s = {5, 263};
    float *hx;
    int32_t *ht;
    ce_inputs(s, 600, 1, &hx, &ht);
    for (int64_t r = 0; r < s.rows; r++)
        ht[r] = -100;
    check_cross_entropy(bes[1], s, hx, ht, 0);
    free(ht);
}

/* A target past the columns: left out of the loss, counted in the
 * gradient's n_valid with no -1 in its row, as on the CPU (which reports it
 * as well). The kernels' arithmetic is the CPU's either way. */
static void test_cross_entropy_target_past_columns(void **state)
{
    (void)state;
    const shape2 s = {6, 37};
    float *hx;
    int32_t *ht;
    ce_inputs(s, 700, 0, &hx, &ht);
    ht[2] = 37;
    check_cross_entropy(bes[0], s, hx, ht, 1);
    free(ht);
}

/* the tail of a row goes into lane 0 only in the log-sum-exp: the lanes of
 * a 13-column row, written out */
static void test_lse_lanes_written_out(void **state)
{
    (void)state;
    float x[13];
    for (int c = 0; c < 13; c++)
        x[c] = 0.25f * (float)c - 1.0f;
    const float mx = 2.0f;
    for (int u = 0; u < CUDA_ROW_LANES; u++) {
        double want = (double)regc_expf(x[u] - mx);
        if (u == 0)
            for (int c = 8; c < 13; c++)
                want += (double)regc_expf(x[c] - mx);
        assert_true(cuda_sum_lse_lane(x, mx, 13, u) == want);
        /* the norms' lanes take c % 8 throughout */
        const double norm_want = u < 5 ? (double)x[u] + (double)x[u + 8] : (double)x[u];
        assert_true(cuda_sum_lane(x, 13, u) == norm_want);
    }
}

/* Rows and columns where the order of a sum shows in the floats, as a
 * small term vanishes beside 2^60 in double or survives it: row 0's lane 0
 * holds 2^60, -2^60, 1 (1 in order, 0 backwards); row 1's lanes 0 to 3
 * sum to 2, 2^60, -2^60, 1.5 (the CPU's pairs lose the 2 and the 1.5, a
 * running sum of the lanes keeps the 1.5); each column of dy is 2^60,
 * -2^60, 1 (1 down the rows, 0 up them). Any other order than the CPU's
 * changes a mean or db, and with them the other outputs. */
static void test_orders_show(void **state)
{
    (void)state;
    const float big = 1152921504606846976.0f; /* 2^60 */
    const shape2 s = {3, 19};
    const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
    float *hx = regc_test_host_floats(n), *hdy = regc_test_host_floats(n);
    for (size_t e = 0; e < n; e++) {
        hx[e] = 0.5f;
        hdy[e] = 0.25f;
    }
    hx[0] = big; /* row 0, lane 0 */
    hx[8] = -big;
    hx[16] = 1.0f;
    hx[nc + 0] = 1.0f; /* row 1, lanes 0 to 3 */
    hx[nc + 1] = big;
    hx[nc + 2] = -big;
    hx[nc + 3] = 1.0f;
    for (size_t c = 0; c < nc; c++) {
        hdy[c] = big;
        hdy[nc + c] = -big;
        hdy[2 * nc + c] = 1.0f;
    }
    /* on rows 0 and 1 the CPU's order and a running sum disagree */
    double lane[2][CUDA_ROW_LANES];
    for (int r = 0; r < 2; r++) {
        double running = 0.0;
        for (int u = 0; u < CUDA_ROW_LANES; u++)
            lane[r][u] = cuda_sum_lane(hx + r * nc, s.cols, u);
        for (size_t c = 0; c < nc; c++)
            running += hx[r * nc + c];
        assert_true(cuda_combine_lanes(lane[r]) != running);
    }

    float *hw = regc_test_host_uniform(nc, 800, 1.0f, 0.5f);
    float *hb = regc_test_host_uniform(nc, 810, 0.0f, 0.5f);
    for (int t = 0; t < 2; t++) {
        regc_backend *be = bes[t];
        float *x = regc_test_upload(be, hx, n), *dy = regc_test_upload(be, hdy, n);
        float *w = regc_test_upload(be, hw, nc), *b = regc_test_upload(be, hb, nc);
        float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, nr);
        float *rstd = regc_test_dev_nan(be, nr), *dx = regc_test_dev_nan(be, n);
        float *dw = regc_test_dev_nan(be, nc), *db = regc_test_dev_nan(be, nc);
        be->layernorm_fwd(be, y, mean, rstd, x, w, b, s.rows, s.cols, EPS, 0);
        be->layernorm_bwd(be, dx, dw, db, dy, x, w, mean, rstd, s.rows, s.cols);
        float *ey = regc_test_host_floats(n), *emean = regc_test_host_floats(nr);
        float *erstd = regc_test_host_floats(nr), *edx = regc_test_host_floats(n);
        float *edw = regc_test_host_floats(nc), *edb = regc_test_host_floats(nc);
        emulate_layernorm_fwd(NULL, ey, emean, erstd, hx, NULL, NULL, hw, hb, s.rows, s.cols, EPS);
        emulate_layernorm_bwd(edx, edw, edb, NULL, hdy, hx, hw, emean, erstd, s.rows, s.cols);
        assert_true(emean[0] == (float)((1.0 + 16 * 0.5) / 19.0)); /* lane 0 gives 1 */
        assert_true(emean[1] == (float)(cuda_combine_lanes(lane[1]) / (double)s.cols));
        assert_true(edb[0] == 1.0f); /* down the rows; up them it would be 0 */
        expect_bits("ordered layernorm_fwd mean", s, emean, regc_test_download(be, mean, nr), nr);
        expect_bits("ordered layernorm_fwd y", s, ey, regc_test_download(be, y, n), n);
        expect_bits("ordered layernorm_bwd dx", s, edx, regc_test_download(be, dx, n), n);
        expect_bits("ordered layernorm_bwd db", s, edb, regc_test_download(be, db, nc), nc);
        expect_bits("ordered layernorm_bwd dw", s, edw, regc_test_download(be, dw, nc), nc);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lse_lanes_written_out),
        regc_test_with_buffers(test_orders_show),
        regc_test_with_buffers(test_layernorm),
        regc_test_with_buffers(test_rmsnorm),
        regc_test_with_buffers(test_add_norms_fwd),
        regc_test_with_buffers(test_norms_bf16_y),
        regc_test_with_buffers(test_norms_bwd_add),
        regc_test_with_buffers(test_cross_entropy),
        regc_test_with_buffers(test_cross_entropy_all_ignored),
        regc_test_with_buffers(test_softmax_and_row_sum),
        regc_test_with_buffers(test_cross_entropy_target_past_columns),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
