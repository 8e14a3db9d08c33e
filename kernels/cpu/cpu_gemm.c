/* cpu_gemm.c — the GEMM entry: regc's own sgemm where the build targets
 * AVX-512, which applies the elementwise epilogues on each tile of C, or
 * else OpenBLAS's cblas_sgemm followed by the cuBLASLt-style epilogue as a
 * row-parallel pass over C (never inside the BLAS call, so the OpenMP and
 * OpenBLAS thread pools never run at once). DGELU_BGRAD's column sums are
 * that pass in both. */
#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "cpu_kernels.h"
#include "regc_common.h"

static const char *cpu_epilogue_name(regc_epilogue e)
{
    switch (e) {
    case REGC_EPI_NONE: return "NONE";
    case REGC_EPI_BIAS: return "BIAS";
    case REGC_EPI_GELU: return "GELU";
    case REGC_EPI_GELU_AUX: return "GELU_AUX";
    case REGC_EPI_BIAS_GELU_AUX: return "BIAS_GELU_AUX";
    case REGC_EPI_DGELU: return "DGELU";
    case REGC_EPI_DGELU_BGRAD: return "DGELU_BGRAD";
    case REGC_EPI_BGRAD: return "BGRAD";
    }
    return "?";
}

/* Everything a malformed call could get wrong is caught here, so a bad
 * descriptor is an error message rather than a read out of bounds. */
static int cpu_check_gemm(const regc_gemm *g)
{
    if (g->m < 0 || g->n < 0 || g->k < 0)
        return regc_error(REGC_ERR_ARG, "gemm: negative size m=%lld n=%lld k=%lld", (long long)g->m,
                          (long long)g->n, (long long)g->k);
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX ||
        g->ldb > INT_MAX || g->ldc > INT_MAX)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "gemm: a size or leading dimension exceeds the 32-bit BLAS interface");
    int64_t a_cols = g->trans_a ? g->m : g->k; /* A is stored [k, m] when transposed */
    int64_t b_cols = g->trans_b ? g->k : g->n;
    if (g->lda < (a_cols > 1 ? a_cols : 1))
        return regc_error(REGC_ERR_ARG, "gemm: lda=%lld is less than A's %lld columns",
                          (long long)g->lda, (long long)a_cols);
    if (g->ldb < (b_cols > 1 ? b_cols : 1))
        return regc_error(REGC_ERR_ARG, "gemm: ldb=%lld is less than B's %lld columns",
                          (long long)g->ldb, (long long)b_cols);
    if (g->ldc < (g->n > 1 ? g->n : 1))
        return regc_error(REGC_ERR_ARG, "gemm: ldc=%lld is less than C's %lld columns",
                          (long long)g->ldc, (long long)g->n);
    if (!g->c || (g->k > 0 && g->m > 0 && g->n > 0 && (!g->a || !g->b)))
        return regc_error(REGC_ERR_ARG, "gemm: a NULL matrix pointer");

    int needs_bias = 0, needs_aux = 0, needs_bias_grad = 0;
    switch (g->epilogue) {
    case REGC_EPI_NONE:
    case REGC_EPI_GELU: break;
    case REGC_EPI_BIAS: needs_bias = 1; break;
    case REGC_EPI_GELU_AUX:
    case REGC_EPI_DGELU: needs_aux = 1; break;
    case REGC_EPI_BIAS_GELU_AUX:
        needs_bias = 1;
        needs_aux = 1;
        break;
    case REGC_EPI_DGELU_BGRAD:
        needs_aux = 1;
        needs_bias_grad = 1;
        break;
    case REGC_EPI_BGRAD: needs_bias_grad = 1; break;
    default: return regc_error(REGC_ERR_ARG, "gemm: unknown epilogue %d", (int)g->epilogue);
    }
    const char *name = cpu_epilogue_name(g->epilogue);
    if (needs_bias && !g->bias)
        return regc_error(REGC_ERR_ARG, "gemm: epilogue %s needs a bias", name);
    if (needs_aux && (!g->aux || g->ldaux < g->n))
        return regc_error(REGC_ERR_ARG, "gemm: epilogue %s needs aux with ldaux >= n=%lld", name,
                          (long long)g->n);
    if (needs_bias_grad && !g->bias_grad)
        return regc_error(REGC_ERR_ARG, "gemm: epilogue %s needs a bias_grad output", name);
    if (needs_bias_grad && g->epilogue == REGC_EPI_BGRAD && g->k > 0 && !g->b)
        return regc_error(REGC_ERR_ARG, "gemm: epilogue BGRAD needs B");
    return REGC_OK;
}

/* bias_grad[n] = sum over k of op(B)[k, n]   (B: [k, n], or [n, k] when trans_b) */
static void cpu_bgrad_of_b(const regc_backend *be, const regc_gemm *g)
{
    const int threads = regc_cpu_threads(be);
    if (!g->trans_b) {
        regc_cpu_sum_columns(be, g->bias_grad, g->b, g->ldb, g->k, g->n);
        return;
    }
    /* op(B) = B^T: column n of op(B) is row n of B, contiguous */
#pragma omp parallel for num_threads(threads) if (g->n * g->k >= regc_cpu_par_min(be))             \
    schedule(static)
    for (int64_t j = 0; j < g->n; j++) {
        const float *row = g->b + j * g->ldb;
        double acc = 0.0;
        for (int64_t i = 0; i < g->k; i++)
            acc += row[i];
        g->bias_grad[j] = (float)acc;
    }
}

/* C = G * gelu'(aux) and bias_grad = its column sums in one pass: each
 * thread runs down the rows over its own columns, a chunk at a time, so a
 * chunk of C is summed while still in cache, in the same order (double, row
 * by row) as the separate dgelu and sum_rows kernels, giving the same bits. */
REGC_CPU_WIDE_VECTORS static void cpu_dgelu_bgrad(const regc_backend *be, const regc_gemm *g)
{
    const int threads = regc_cpu_threads(be);
    const int64_t m = g->m, n = g->n;
#pragma omp parallel num_threads(threads) if (m * n >= regc_cpu_par_min(be))
    {
        int64_t lo, hi;
        regc_cpu_team_columns(n, &lo, &hi);
        for (int64_t c0 = lo; c0 < hi; c0 += REGC_CPU_COL_CHUNK) {
            const int64_t w = hi - c0 < REGC_CPU_COL_CHUNK ? hi - c0 : REGC_CPU_COL_CHUNK;
            double acc[REGC_CPU_COL_CHUNK] = {0}; /* [w] */
            for (int64_t i = 0; i < m; i++) {
                float *restrict c = g->c + i * g->ldc + c0;             /* [w] */
                const float *restrict aux = g->aux + i * g->ldaux + c0; /* [w] */
                for (int64_t j = 0; j < w; j++) {
                    c[j] = regc_cpu_gelu_dx(c[j], aux[j]);
                    acc[j] += c[j];
                }
            }
            for (int64_t j = 0; j < w; j++)
                g->bias_grad[c0 + j] = (float)acc[j];
        }
    }
}

/* The elementwise epilogues on C[i, j0 .. j0+len), C holding G. */
REGC_CPU_WIDE_VECTORS void regc_cpu_apply_epilogue_span(const regc_gemm *g, int64_t i, int64_t j0,
                                                        int64_t len)
{
    float *restrict c = g->c + i * g->ldc + j0;                       /* [len] */
    float *restrict aux = g->aux ? g->aux + i * g->ldaux + j0 : NULL; /* [len] */
    const float *restrict bias = g->bias ? g->bias + j0 : NULL;       /* [len] */
    switch (g->epilogue) {
    case REGC_EPI_BIAS:
        for (int64_t j = 0; j < len; j++)
            c[j] = regc_cpu_addf(c[j], bias[j]);
        break;
    case REGC_EPI_GELU:
        for (int64_t j = 0; j < len; j++)
            c[j] = regc_cpu_gelu(c[j]);
        break;
    case REGC_EPI_GELU_AUX:
        for (int64_t j = 0; j < len; j++) {
            aux[j] = c[j];
            c[j] = regc_cpu_gelu(c[j]);
        }
        break;
    case REGC_EPI_BIAS_GELU_AUX:
        for (int64_t j = 0; j < len; j++) {
            float pre = regc_cpu_addf(c[j], bias[j]);
            aux[j] = pre;
            c[j] = regc_cpu_gelu(pre);
        }
        break;
    case REGC_EPI_DGELU:
        for (int64_t j = 0; j < len; j++)
            c[j] = regc_cpu_gelu_dx(c[j], aux[j]);
        break;
    default: break;
    }
}

/* C = epilogue(C) row by row; C already holds G. */
static void cpu_apply_epilogue(const regc_backend *be, const regc_gemm *g)
{
    const int threads = regc_cpu_threads(be);
    const int64_t m = g->m, n = g->n;
    const regc_epilogue e = g->epilogue;
    if (e == REGC_EPI_NONE || e == REGC_EPI_BGRAD)
        return;
    if (e == REGC_EPI_DGELU_BGRAD) {
        cpu_dgelu_bgrad(be, g);
        return;
    }
#pragma omp parallel for num_threads(threads) if (m * n >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t i = 0; i < m; i++)
        regc_cpu_apply_epilogue_span(g, i, 0, n);
}

int regc_cpu_run_gemm(regc_backend *be, const regc_gemm *g)
{
    if (!g)
        return regc_error(REGC_ERR_ARG, "gemm: NULL descriptor");
    int status = cpu_check_gemm(g);
    if (status != REGC_OK)
        return status;
    if (g->epilogue == REGC_EPI_BGRAD)
        cpu_bgrad_of_b(be, g);

    int epilogue_done = 0;
    if (g->m > 0 && g->n > 0) {
        if (g->k > 0) {
#ifdef REGC_CPU_OWN_SGEMM
            status = regc_cpu_sgemm(be, g);
            if (status != REGC_OK)
                return status;
            /* the elementwise epilogues were applied on each tile */
            epilogue_done = g->epilogue != REGC_EPI_DGELU_BGRAD;
#else
            /* OpenBLAS's thread count is process-wide: restore this
             * backend's in case another backend instance changed it */
            const int threads = regc_cpu_threads(be);
            if (openblas_get_num_threads() != threads)
                openblas_set_num_threads(threads);
            cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                        g->trans_b ? CblasTrans : CblasNoTrans, (int)g->m, (int)g->n, (int)g->k,
                        g->alpha, g->a, (int)g->lda, g->b, (int)g->ldb, g->accumulate ? 1.0f : 0.0f,
                        g->c, (int)g->ldc);
#endif
        } else if (!g->accumulate) {
            /* an empty product is zero; BLAS implementations disagree on k = 0 */
            for (int64_t i = 0; i < g->m; i++)
                memset(g->c + i * g->ldc, 0, (size_t)g->n * sizeof(float));
        }
    }
    if (!epilogue_done)
        cpu_apply_epilogue(be, g);
    return REGC_OK;
}

const char *regc_backend_cpu_gemm_name(void)
{
#ifdef REGC_CPU_OWN_SGEMM
    return "regc's AVX-512 kernel";
#else
    return "OpenBLAS";
#endif
}
