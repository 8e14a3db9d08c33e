/* gemm_check.h — private to kernels/: the checks every backend makes of a
 * GEMM descriptor before it touches memory, so a bad descriptor is the same
 * error message on the CPU and the GPU rather than a read out of bounds.
 * Static inline: the CUDA module compiles it too, apart from the library. */
#ifndef REGC_GEMM_CHECK_H
#define REGC_GEMM_CHECK_H

#include "regc_backend.h"
#include "regc_common.h"

/* Everything a malformed call could get wrong is caught here, so a bad
 * descriptor is an error message rather than a read out of bounds. */
static inline int regc_gemm_check(const regc_gemm *g)
{
    if (g->m < 0 || g->n < 0 || g->k < 0)
        return regc_error(REGC_ERR_ARG, "gemm: negative size m=%lld n=%lld k=%lld", (long long)g->m,
                          (long long)g->n, (long long)g->k);
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
    const char *name = regc_epilogue_name(g->epilogue);
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

#endif
