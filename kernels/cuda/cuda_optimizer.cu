/* cuda_optimizer.cu — the optimizer step over the scalar block in device
 * memory: the schedule and clipping (step_math.h, the CPU's code), the sum
 * of the gradients' squares, and AdamW (regc_adamw_one, the CPU's formula,
 * so a step gives the CPU's bits element for element).
 *
 * The sum of squares runs in a fixed split (SUMSQ_SPAN elements per block,
 * a fixed tree inside a block, the blocks' partials added in order by one
 * thread), so two runs give the same bits; the CPU sums in element order,
 * so the two backends' norms may differ in the last bits. */
#include "cuda_internal.h"
#include "step_math.h"

/* A configuration regc_step_scalars_ok refuses makes the step a no-op
 * (skipped: AdamW changes nothing) rather than one with the last step's
 * coefficients; the trainer checks the same conditions before the first
 * step, where the CPU backend reports them through sync(). */
__global__ void cuda_step_schedule_kernel(regc_step_scalars *s)
{
    if (regc_step_scalars_ok(s))
        regc_step_begin(s);
    else
        s->skipped = 1;
}

static void cuda_step_schedule(regc_backend *be, regc_step_scalars *s)
{
    cuda_step_schedule_kernel<<<1, 1, 0, cuda_stream(be)>>>(s);
    cuda_note(be, cudaGetLastError(), "step_schedule");
}

#define SUMSQ_THREADS 256
#define SUMSQ_SPAN 65536 /* elements per block: a fixed split, a fixed order */

/* One partial sum per block of SUMSQ_SPAN elements: each thread a strided
 * run, then a tree in shared memory; both orders depend only on n. */
__global__ void cuda_sumsq_partial_kernel(const float *g, int64_t n, double *part)
{
    __shared__ double acc[SUMSQ_THREADS];
    const int64_t i0 = (int64_t)blockIdx.x * SUMSQ_SPAN;
    const int64_t i1 = i0 + SUMSQ_SPAN < n ? i0 + SUMSQ_SPAN : n;
    double a = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += SUMSQ_THREADS)
        a += (double)g[i] * (double)g[i];
    acc[threadIdx.x] = a;
    __syncthreads();
    for (int w = SUMSQ_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[blockIdx.x] = acc[0];
}

__global__ void cuda_sumsq_total_kernel(const double *part, int64_t n_parts, regc_step_scalars *s)
{
    double t = s->grad_sumsq;
    for (int64_t p = 0; p < n_parts; p++)
        t += part[p];
    s->grad_sumsq = t;
}

static void cuda_grad_sumsq(regc_backend *be, const float *g, int64_t n, regc_step_scalars *s)
{
    const int64_t n_parts = (n + SUMSQ_SPAN - 1) / SUMSQ_SPAN;
    if (n_parts == 0)
        return;
    double *part = (double *)cuda_scratch_alloc(be, (size_t)n_parts * sizeof *part, "grad_sumsq");
    if (!part)
        return;
    cuda_sumsq_partial_kernel<<<(unsigned)n_parts, SUMSQ_THREADS, 0, cuda_stream(be)>>>(g, n, part);
    cuda_sumsq_total_kernel<<<1, 1, 0, cuda_stream(be)>>>(part, n_parts, s);
    cuda_note(be, cudaGetLastError(), "grad_sumsq");
    cuda_scratch_free(be, part, "grad_sumsq");
}

__global__ void cuda_grad_clip_kernel(regc_step_scalars *s) { regc_step_clip(s); }

static void cuda_grad_clip(regc_backend *be, regc_step_scalars *s)
{
    cuda_grad_clip_kernel<<<1, 1, 0, cuda_stream(be)>>>(s);
    cuda_note(be, cudaGetLastError(), "grad_clip");
}

/* torch.optim.AdamW, one element per thread, the coefficients from s
 * (decay 0: no weight decay on these parameters). */
__global__ void cuda_adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n,
                                  const regc_step_scalars *s, int decay) /* p, g, m, v: [n] */
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || s->skipped) /* skipped: a non-finite gradient norm */
        return;
    float mi = m[i], vi = v[i];
    p[i] = regc_adamw_one(&mi, &vi, p[i], g[i], s, decay ? s->decay : 1.0f);
    m[i] = mi;
    v[i] = vi;
}

static void cuda_adamw(regc_backend *be, float *param, const float *grad, float *m, float *v,
                       int64_t n, const regc_step_scalars *s, int decay)
{
    if (n <= 0)
        return;
    cuda_adamw_kernel<<<cuda_blocks_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(param, grad, m, v,
                                                                                n, s, decay);
    cuda_note(be, cudaGetLastError(), "adamw");
}

void regc_cuda_set_optimizer(regc_backend *be)
{
    be->step_schedule = cuda_step_schedule;
    be->grad_sumsq = cuda_grad_sumsq;
    be->grad_clip = cuda_grad_clip;
    be->adamw = cuda_adamw;
}
