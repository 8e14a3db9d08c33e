/* cpu_optimizer.c — the optimizer step over the scalar block: the schedule
 * (step_math.h), the gradients' sum of squares and the clip scale, and
 * torch.optim.AdamW (decoupled weight decay) over one contiguous span, in
 * the same float operations and order as PyTorch's single-tensor
 * implementation so the two agree to the last bit or two. */
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_kernels.h"
#include "regc_common.h"
#include "step_math.h"

/* Elements per parallel task: large enough to amortise the call, small
 * enough to balance the threads. */
#define CPU_ADAMW_SPAN 4096

/* Elements per task of the sum of squares: a fixed split, so the partial
 * sums and their order do not depend on the thread count. Inside a span,
 * element i goes into lane i % 8 and the lanes are added pairwise at the
 * end: a fixed order that vectorises, where one running sum is a chain of
 * dependent adds (a fifth of a GPT-2 124M step on two cores). */
#define CPU_SUMSQ_SPAN 65536
#define CPU_SUMSQ_LANES 8

void regc_cpu_step_schedule(regc_backend *be, regc_step_scalars *s)
{
    if (!regc_step_scalars_ok(s)) {
        regc_cpu_set_failure(be,
                             regc_error(REGC_ERR_ARG,
                                        "step_schedule: schedule %d, base lr %g, step %g, "
                                        "betas %g %g are not a valid optimizer step",
                                        (int)s->schedule, s->base_lr, s->step, s->beta1, s->beta2));
        return;
    }
    regc_step_begin(s);
}

void regc_cpu_grad_sumsq(regc_backend *be, const float *g, int64_t n, regc_step_scalars *s)
{
    const int64_t n_spans = (n + CPU_SUMSQ_SPAN - 1) / CPU_SUMSQ_SPAN;
    double *part = regc_cpu_get_scratch(be, (size_t)(n_spans + 1) * sizeof *part);
    if (!part) {
        regc_cpu_set_failure(be, regc_error(REGC_ERR_MEMORY, "grad_sumsq: out of memory"));
        return;
    }
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t sp = 0; sp < n_spans; sp++) {
        const int64_t i0 = sp * CPU_SUMSQ_SPAN,
                      i1 = i0 + CPU_SUMSQ_SPAN < n ? i0 + CPU_SUMSQ_SPAN : n;
        double acc[CPU_SUMSQ_LANES] = {0};
        int64_t i = i0;
        for (; i + CPU_SUMSQ_LANES <= i1; i += CPU_SUMSQ_LANES)
            for (int u = 0; u < CPU_SUMSQ_LANES; u++)
                acc[u] += (double)g[i + u] * (double)g[i + u];
        for (; i < i1; i++)
            acc[(i - i0) % CPU_SUMSQ_LANES] += (double)g[i] * (double)g[i];
        part[sp] =
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    double total = s->grad_sumsq;
    for (int64_t sp = 0; sp < n_spans; sp++)
        total += part[sp];
    s->grad_sumsq = total;
}

void regc_cpu_grad_clip(regc_backend *be, regc_step_scalars *s)
{
    (void)be;
    regc_step_clip(s);
}

/* One span in a single pass: p, g, m and v are read once and p, m, v
 * written once, so the step runs at memory speed. The build keeps errno
 * semantics, under which GCC will not vectorise sqrtf; the AVX path spells
 * out regc_adamw_one (kernel_math.h) with vsqrtps, which gives sqrtf's bits, and
 * -ffp-contract=off keeps every multiply and add separate, so both paths
 * give the same results. The AVX path is built whatever the build targets
 * and taken where CPUID reports AVX. Returns the elements done. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx"))) static int64_t
cpu_adamw_span_avx(float *restrict param, const float *restrict grad, float *restrict m,
                   float *restrict v, int64_t n, const regc_step_scalars *cf,
                   float decay_f) /* all [n] */
{
    int64_t i = 0;
    const __m256 beta1 = _mm256_set1_ps(cf->beta1_f), beta2 = _mm256_set1_ps(cf->beta2_f);
    const __m256 omb1 = _mm256_set1_ps(cf->one_minus_beta1);
    const __m256 omb2 = _mm256_set1_ps(cf->one_minus_beta2);
    const __m256 bc2_sqrt = _mm256_set1_ps(cf->bc2_sqrt), eps = _mm256_set1_ps(cf->eps_f);
    const __m256 decay = _mm256_set1_ps(decay_f), nss = _mm256_set1_ps(cf->neg_step_size);
    const __m256 clip = _mm256_set1_ps(cf->clip_scale);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), clip);
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
    return i;
}
#endif

static void cpu_adamw_span(float *restrict param, const float *restrict grad, float *restrict m,
                           float *restrict v, int64_t n, const regc_step_scalars *cf,
                           float decay) /* all [n] */
{
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (__builtin_cpu_supports("avx"))
        i = cpu_adamw_span_avx(param, grad, m, v, n, cf, decay);
#endif
    for (; i < n; i++)
        param[i] = regc_adamw_one(&m[i], &v[i], param[i], grad[i], cf, decay);
}

void regc_cpu_adamw(regc_backend *be, float *param, const float *grad, float *m, float *v,
                    int64_t n, const regc_step_scalars *cf, int decay)
{
    if (cf->skipped) /* a non-finite gradient norm: this step changes nothing */
        return;
    const float decay_f = decay ? cf->decay : 1.0f;
    const int64_t n_spans = (n + CPU_ADAMW_SPAN - 1) / CPU_ADAMW_SPAN;
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))          \
    schedule(static)
    for (int64_t sp = 0; sp < n_spans; sp++) {
        const int64_t i0 = sp * CPU_ADAMW_SPAN;
        const int64_t len = n - i0 < CPU_ADAMW_SPAN ? n - i0 : CPU_ADAMW_SPAN;
        cpu_adamw_span(param + i0, grad + i0, m + i0, v + i0, len, cf, decay_f);
    }
}
