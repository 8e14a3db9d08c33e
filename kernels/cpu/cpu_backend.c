/* cpu_backend.c — the CPU backend's creation, memory and copies. Device
 * memory is host memory, so every call completes before it returns; sync()
 * only reports failures that void kernels recorded. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "regc_common.h"

/* Cache-line alignment keeps vector loads of any buffer start aligned and
 * stops two buffers from sharing a line between threads. */
#define CPU_ALIGN 64

void regc_cpu_set_failure(regc_backend *be, int status)
{
    regc_cpu_ctx *ctx = be->ctx;
    if (ctx->status == REGC_OK)
        ctx->status = status;
}

static void *cpu_scratch_of(regc_backend *be, int which, size_t bytes)
{
    regc_cpu_ctx *ctx = be->ctx;
    if (bytes <= ctx->scratch_bytes[which])
        return ctx->scratch[which];
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = rounded >= bytes ? aligned_alloc(CPU_ALIGN, rounded) : NULL;
    if (!p) {
        regc_cpu_set_failure(
            be, regc_error(REGC_ERR_MEMORY,
                           "cpu backend: cannot allocate %zu bytes of kernel scratch", bytes));
        return NULL;
    }
    free(ctx->scratch[which]);
    ctx->scratch[which] = p;
    ctx->scratch_bytes[which] = rounded;
    return p;
}

void *regc_cpu_get_scratch(regc_backend *be, size_t bytes) { return cpu_scratch_of(be, 0, bytes); }

void *regc_cpu_get_gemm_scratch(regc_backend *be, size_t bytes)
{
    return cpu_scratch_of(be, 1, bytes);
}

/* Each allocation carries its size in a header of CPU_ALIGN bytes before
 * it, so free can count it back. */
static void *cpu_alloc(regc_backend *be, size_t bytes)
{
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN + CPU_ALIGN;
    char *p = rounded > bytes ? aligned_alloc(CPU_ALIGN, rounded) : NULL;
    if (!p) {
        regc_error(REGC_ERR_MEMORY, "cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    memcpy(p, &bytes, sizeof bytes);
    be->mem_in_use += (int64_t)bytes;
    if (be->mem_in_use > be->mem_peak)
        be->mem_peak = be->mem_in_use;
    return p + CPU_ALIGN;
}

static void cpu_free(regc_backend *be, void *ptr)
{
    if (!ptr)
        return;
    char *p = (char *)ptr - CPU_ALIGN;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    be->mem_in_use -= (int64_t)bytes;
    free(p);
}

/* Host memory: the same kind, but not the device's to count (the
 * contract of alloc_host): an offloaded tensor is what the arena does not
 * hold. */
static void *cpu_alloc_host(regc_backend *be, size_t bytes)
{
    (void)be;
    void *p = aligned_alloc(CPU_ALIGN, (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN + CPU_ALIGN);
    if (!p)
        regc_error(REGC_ERR_MEMORY, "cpu backend: cannot allocate %zu bytes of host memory", bytes);
    return p;
}

static void cpu_free_host(regc_backend *be, void *ptr)
{
    (void)be;
    free(ptr);
}

static void cpu_copy(regc_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    /* memmove: a copy onto itself is harmless here and must not be UB */
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}

static int cpu_sync(regc_backend *be)
{
    regc_cpu_ctx *ctx = be->ctx;
    int status = ctx->status;
    ctx->status = REGC_OK;
    return status;
}

static void cpu_destroy(regc_backend *be)
{
    regc_cpu_ctx *ctx = be->ctx;
    if (ctx)
        free(ctx->scratch[0]), free(ctx->scratch[1]);
    free(ctx);
    free(be);
}

regc_backend *regc_backend_cpu_new(int threads)
{
    if (regc_cpu_choose_gemm() != REGC_OK)
        return NULL;
    regc_backend *be = calloc(1, sizeof *be);
    regc_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        regc_error(REGC_ERR_MEMORY, "cpu backend: out of memory creating the backend");
        return NULL;
    }
    if (threads > 0)
        omp_set_num_threads(threads);
    else
        threads = omp_get_max_threads(); /* honours OMP_NUM_THREADS, else all cores */
    if (threads < 1)
        threads = 1;
    ctx->threads = threads;
    ctx->par_scale = 1;
    /* REGC_FIXED_TEAM=1: the idle thresholds whatever the load (benchmarks
     * that measure what fitting the team gains) */
    const char *fixed = getenv("REGC_FIXED_TEAM");
    ctx->fit_team = !(fixed && fixed[0] == '1');
    ctx->status = REGC_OK;

    be->mem_capacity = regc_host_memory_bytes();
    be->begin_run = regc_cpu_fit_team;
    be->name = "cpu";
    be->device = "cpu";
    be->ctx = ctx;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->alloc_host = cpu_alloc_host;
    be->free_host = cpu_free_host;
    be->copy_h2d = cpu_copy;
    be->copy_d2h = cpu_copy;
    be->copy_d2d = cpu_copy;
    be->fill = regc_cpu_fill_floats;
    be->sync = cpu_sync;
    be->copy_2d = regc_cpu_copy_rows;
    be->transpose = regc_cpu_transpose_tensor;
    be->gemm = regc_cpu_run_gemm;
    be->embedding_fwd = regc_cpu_embedding_fwd;
    be->embedding_bwd = regc_cpu_embedding_bwd;
    be->add = regc_cpu_add_arrays;
    be->bias_add = regc_cpu_add_bias;
    be->sum_rows = regc_cpu_sum_rows;
    be->row_sum = regc_cpu_row_sum;
    be->layernorm_fwd = regc_cpu_layernorm_fwd;
    be->layernorm_bwd = regc_cpu_layernorm_bwd;
    be->gelu_fwd = regc_cpu_gelu_fwd;
    be->gelu_bwd = regc_cpu_gelu_bwd;
    be->rmsnorm_fwd = regc_cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = regc_cpu_rmsnorm_bwd;
    be->rope = regc_cpu_rope;
    be->silu_fwd = regc_cpu_silu_fwd;
    be->silu_bwd = regc_cpu_silu_bwd;
    be->mul = regc_cpu_mul_arrays;
    be->gelu_erf_fwd = regc_cpu_gelu_erf_fwd;
    be->gelu_erf_bwd = regc_cpu_gelu_erf_bwd;
    be->relu_fwd = regc_cpu_relu_fwd;
    be->relu_bwd = regc_cpu_relu_bwd;
    be->scale = regc_cpu_scale;
    be->dropout = regc_cpu_dropout;
    be->attention_fwd = regc_cpu_attention_fwd;
    be->attention_bwd = regc_cpu_attention_bwd;
    be->softmax_fwd = regc_cpu_softmax_fwd;
    be->cross_entropy_fwd = regc_cpu_cross_entropy_fwd;
    be->cross_entropy_bwd = regc_cpu_cross_entropy_bwd;
    be->cross_entropy_rows = regc_cpu_cross_entropy_rows;
    be->cross_entropy_loss = regc_cpu_cross_entropy_loss;
    be->elementwise = regc_cpu_elementwise;
    be->add_layernorm_fwd = regc_cpu_add_layernorm_fwd;
    be->add_rmsnorm_fwd = regc_cpu_add_rmsnorm_fwd;
    be->layernorm_bwd_add = regc_cpu_layernorm_bwd_add;
    be->rmsnorm_bwd_add = regc_cpu_rmsnorm_bwd_add;
    be->step_schedule = regc_cpu_step_schedule;
    be->grad_sumsq = regc_cpu_grad_sumsq;
    be->grad_clip = regc_cpu_grad_clip;
    be->adamw = regc_cpu_adamw;
    be->destroy = cpu_destroy;
    return be;
}
