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

/* One element: the same float operations in the same order as PyTorch's. */
static inline float cpu_adamw_one(float *restrict m, float *restrict v, float p, float g,
                                  const cpu_adamw_coef *c)
{
    *m = *m * c->beta1 + c->one_minus_b1 * g;
    *v = *v * c->beta2 + (c->one_minus_b2 * g) * g;
    const float denom = sqrtf(*v) / c->bc2_sqrt + c->eps;
    return p * c->decay + (c->neg_step_size * *m) / denom;
}

/* One span in a single pass: p, g, m and v are read once and p, m, v
 * written once, so the step runs at memory speed. The build keeps errno
 * semantics, under which GCC will not vectorise sqrtf; the AVX path spells
 * out cpu_adamw_one with vsqrtps, which gives sqrtf's bits, and
 * -ffp-contract=off keeps every multiply and add separate, so both paths
 * give the same results. */
static void cpu_adamw_span(float *restrict param, const float *restrict grad, float *restrict m,
                           float *restrict v, int64_t n, const cpu_adamw_coef *cf) /* all [n] */
{
    int64_t i = 0;
#if defined(__AVX__)
    const __m256 beta1 = _mm256_set1_ps(cf->beta1), beta2 = _mm256_set1_ps(cf->beta2);
    const __m256 omb1 = _mm256_set1_ps(cf->one_minus_b1), omb2 = _mm256_set1_ps(cf->one_minus_b2);
    const __m256 bc2_sqrt = _mm256_set1_ps(cf->bc2_sqrt), eps = _mm256_set1_ps(cf->eps);
    const __m256 decay = _mm256_set1_ps(cf->decay), nss = _mm256_set1_ps(cf->neg_step_size);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(grad + i);
        const __m256 mi =
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), beta1), _mm256_mul_ps(omb1, g));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), beta2),
                                        _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2_sqrt), eps);
        const __m256 pi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(param + i), decay),
                                        _mm256_div_ps(_mm256_mul_ps(nss, mi), denom));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(param + i, pi);
    }
#endif
    for (; i < n; i++)
        param[i] = cpu_adamw_one(&m[i], &v[i], param[i], grad[i], cf);
}

void regc_cpu_adamw_step(regc_backend *be, float *param, const float *grad, float *m, float *v,
                         int64_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int step)
{
    if (step < 1) {
        regc_cpu_set_failure(be,
                             regc_error(REGC_ERR_ARG, "adamw: step %d (steps count from 1)", step));
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
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= REGC_CPU_PAR_MIN)              \
    schedule(static)
    for (int64_t sp = 0; sp < n_spans; sp++) {
        const int64_t i0 = sp * CPU_ADAMW_SPAN;
        const int64_t len = n - i0 < CPU_ADAMW_SPAN ? n - i0 : CPU_ADAMW_SPAN;
        cpu_adamw_span(param + i0, grad + i0, m + i0, v + i0, len, &cf);
    }
}
