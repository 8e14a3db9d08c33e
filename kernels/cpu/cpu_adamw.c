/* cpu_adamw.c — torch.optim.AdamW (decoupled weight decay) over one
 * contiguous span, in the same float operations and order as PyTorch's
 * single-tensor implementation so the two agree to the last bit or two. */
#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "cpu_kernels.h"
#include "regc_common.h"

/* Elements per parallel task: large enough to amortise the call, small
 * enough to balance the threads. */
#define CPU_ADAMW_SPAN 4096

typedef struct {
    float decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step_size, bc2_sqrt, eps;
} cpu_adamw_coef;

/* out = sqrt(in), correctly rounded on either path. The build keeps errno
 * semantics, under which GCC will not vectorise sqrtf; vsqrtps gives the
 * same bits as sqrtf, so the intrinsic changes speed only. */
static void cpu_sqrt_array(float *restrict out, const float *restrict in, int64_t n)
{
    int64_t i = 0;
#if defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_sqrt_ps(_mm256_loadu_ps(in + i)));
#endif
    for (; i < n; i++)
        out[i] = sqrtf(in[i]);
}

/* One span in three vectorisable passes (moments, square roots, update),
 * each the same float operations in the same order as PyTorch's. */
static void cpu_adamw_span(float *restrict param, const float *restrict grad,
                           float *restrict m, float *restrict v, float *restrict root,
                           int64_t n, const cpu_adamw_coef *cf) /* all [n] */
{
    const cpu_adamw_coef c = *cf;
    for (int64_t i = 0; i < n; i++) {
        const float gi = grad[i];
        m[i] = m[i] * c.beta1 + c.one_minus_b1 * gi;
        v[i] = v[i] * c.beta2 + (c.one_minus_b2 * gi) * gi;
    }
    cpu_sqrt_array(root, v, n);
    for (int64_t i = 0; i < n; i++) {
        float denom = root[i] / c.bc2_sqrt + c.eps;
        param[i] = param[i] * c.decay + (c.neg_step_size * m[i]) / denom;
    }
}

void regc_cpu_adamw_step(regc_backend *be, float *param, const float *grad, float *m, float *v,
                         int64_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int step)
{
    if (step < 1) {
        regc_cpu_set_failure(be, regc_error(REGC_ERR_ARG,
            "adamw: step %d (steps count from 1)", step));
        return;
    }
    /* PyTorch forms these scalars in double (Python floats) and the CPU
     * kernels then round each one to float once. */
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const cpu_adamw_coef cf = {
        .decay = (float)(1.0 - (double)lr * (double)weight_decay),
        .beta1 = beta1,
        .beta2 = beta2,
        .one_minus_b1 = (float)(1.0 - (double)beta1),
        .one_minus_b2 = (float)(1.0 - (double)beta2),
        .neg_step_size = (float)(-((double)lr / bc1)),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = eps,
    };
    const int64_t n_spans = (n + CPU_ADAMW_SPAN - 1) / CPU_ADAMW_SPAN;
#pragma omp parallel for num_threads(regc_cpu_threads(be)) \
    if (n >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t sp = 0; sp < n_spans; sp++) {
        const int64_t i0 = sp * CPU_ADAMW_SPAN;
        const int64_t len = n - i0 < CPU_ADAMW_SPAN ? n - i0 : CPU_ADAMW_SPAN;
        float root[CPU_ADAMW_SPAN]; /* [len] */
        cpu_adamw_span(param + i0, grad + i0, m + i0, v + i0, root, len, &cf);
    }
}
