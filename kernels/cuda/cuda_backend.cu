/* cuda_backend.cu — the CUDA backend: device memory on one stream, GEMMs
 * through cuBLASLt with each regc epilogue mapped onto one cuBLASLt
 * epilogue, and the optimizer step. Kernels not written yet stay NULL, and the runtime
 * names the missing one instead of running something else.
 *
 * Row-major to cuBLASLt (column-major): C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T, i.e. cuBLASLt's A is our B and its M is our n. Its
 * bias vector runs along its M, our n; BGRADA reduces its A, our op(B),
 * over k, which is our BGRAD. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "regc_backend.h"
#include "regc_common.h"
}
#include "step_math.h"

#define CUDA_WORKSPACE_BYTES (32u << 20)

typedef struct {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    int failed; /* first failure since the last sync */
    char what[256];
    char device[32]; /* "cuda sm_90" */
} cuda_ctx;

static cuda_ctx *ctx_of(regc_backend *be) { return (cuda_ctx *)be->ctx; }

/* Remember the first failure; sync() reports it. */
static void note(regc_backend *be, cudaError_t err, const char *where)
{
    cuda_ctx *c = ctx_of(be);
    if (err != cudaSuccess && !c->failed) {
        c->failed = 1;
        snprintf(c->what, sizeof c->what, "cuda: %s: %s", where, cudaGetErrorString(err));
    }
}

static void *cuda_alloc(regc_backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, bytes, ctx_of(be)->stream);
    if (err != cudaSuccess) {
        regc_error(REGC_ERR_MEMORY, "cuda: cannot allocate %zu bytes: %s", bytes,
                   cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

static void cuda_free(regc_backend *be, void *p)
{
    note(be, cudaFreeAsync(p, ctx_of(be)->stream), "free");
}

static void cuda_copy(regc_backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind k)
{
    note(be, cudaMemcpyAsync(dst, src, bytes, k, ctx_of(be)->stream), "copy");
}

static void cuda_copy_h2d(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_copy(be, d, s, n, cudaMemcpyHostToDevice);
}
static void cuda_copy_d2h(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_copy(be, d, s, n, cudaMemcpyDeviceToHost);
}
static void cuda_copy_d2d(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_copy(be, d, s, n, cudaMemcpyDeviceToDevice);
}

static void cuda_copy_2d(regc_backend *be, float *dst, int64_t ld_dst, const float *src,
                         int64_t ld_src, int64_t rows, int64_t cols)
{
    note(be,
         cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src, (size_t)ld_src * sizeof(float),
                           (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice,
                           ctx_of(be)->stream),
         "copy_2d");
}

__global__ void fill_kernel(float *dst, size_t n, float value)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = value;
}

static unsigned blocks_for(size_t n) { return (unsigned)((n + 255) / 256); }

static void cuda_fill(regc_backend *be, float *dst, size_t n, float value)
{
    if (n == 0)
        return;
    fill_kernel<<<blocks_for(n), 256, 0, ctx_of(be)->stream>>>(dst, n, value);
    note(be, cudaGetLastError(), "fill");
}

static int cuda_sync(regc_backend *be)
{
    cuda_ctx *c = ctx_of(be);
    note(be, cudaStreamSynchronize(c->stream), "synchronize");
    if (c->failed) {
        c->failed = 0;
        return regc_error(REGC_ERR_IO, "%s", c->what);
    }
    return REGC_OK;
}

/* ---- GEMM */

static int lt_fail(const char *where, cublasStatus_t st)
{
    return regc_error(REGC_ERR_UNSUPPORTED, "cuBLASLt: %s failed (status %d)", where, (int)st);
}

static cublasLtEpilogue_t lt_epilogue(regc_epilogue e)
{
    switch (e) {
    case REGC_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case REGC_EPI_GELU: return CUBLASLT_EPILOGUE_GELU;
    case REGC_EPI_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case REGC_EPI_BIAS_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case REGC_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case REGC_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case REGC_EPI_BGRAD: return CUBLASLT_EPILOGUE_BGRADA;
    case REGC_EPI_NONE: break;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

static int cuda_gemm(regc_backend *be, const regc_gemm *g)
{
    cuda_ctx *c = ctx_of(be);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasStatus_t st;
    int rc = REGC_OK;
    /* cuBLASLt's operands: A' = our B, B' = our A, M' = n, N' = m */
    cublasOperation_t ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t a_rows =
        g->trans_b ? (uint64_t)g->k : (uint64_t)g->n; /* col-major rows of A' as stored */
    uint64_t a_cols = g->trans_b ? (uint64_t)g->n : (uint64_t)g->k;
    uint64_t b_rows = g->trans_a ? (uint64_t)g->m : (uint64_t)g->k;
    uint64_t b_cols = g->trans_a ? (uint64_t)g->k : (uint64_t)g->m;
    float beta = g->accumulate ? 1.0f : 0.0f;
    cublasLtEpilogue_t epi = lt_epilogue(g->epilogue);
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    size_t ws = CUDA_WORKSPACE_BYTES;

    if ((st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) {
        rc = lt_fail("descriptor", st);
        goto done;
    }
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (g->epilogue == REGC_EPI_BIAS || g->epilogue == REGC_EPI_BIAS_GELU_AUX)
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                       sizeof g->bias);
    if (g->epilogue == REGC_EPI_BGRAD || g->epilogue == REGC_EPI_DGELU_BGRAD)
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias_grad,
                                       sizeof g->bias_grad);
    if (g->epilogue == REGC_EPI_GELU_AUX || g->epilogue == REGC_EPI_BIAS_GELU_AUX ||
        g->epilogue == REGC_EPI_DGELU || g->epilogue == REGC_EPI_DGELU_BGRAD) {
        int64_t ld = g->ldaux;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                       sizeof g->aux);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
    if ((st = cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, a_rows, a_cols, g->ldb)) ||
        (st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, b_rows, b_cols, g->lda)) ||
        (st =
             cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)g->n, (uint64_t)g->m, g->ldc))) {
        rc = lt_fail("matrix layout", st);
        goto done;
    }
    if ((st = cublasLtMatmulPreferenceCreate(&pref))) {
        rc = lt_fail("preference", st);
        goto done;
    }
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    st = cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
    if (st || found == 0) {
        rc = regc_error(REGC_ERR_UNSUPPORTED,
                        "cuBLASLt: no algorithm for a %lldx%lldx%lld GEMM with epilogue %d",
                        (long long)g->m, (long long)g->n, (long long)g->k, (int)g->epilogue);
        goto done;
    }
    st = cublasLtMatmul(c->lt, op, &g->alpha, g->b, la, g->a, lb, &beta, g->c, lc, g->c, lc,
                        &heur.algo, c->workspace, ws, c->stream);
    if (st)
        rc = lt_fail("matmul", st);
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return rc;
}

/* ---- the optimizer step over the scalar block (step_math.h) */

/* A configuration regc_step_scalars_ok refuses leaves s as it is: the
 * trainer checks the same conditions before the first step, where the CPU
 * backend reports them through sync(). */
__global__ void step_schedule_kernel(regc_step_scalars *s)
{
    if (regc_step_scalars_ok(s))
        regc_step_begin(s);
}

static void cuda_step_schedule(regc_backend *be, regc_step_scalars *s)
{
    step_schedule_kernel<<<1, 1, 0, ctx_of(be)->stream>>>(s);
    note(be, cudaGetLastError(), "step_schedule");
}

#define SUMSQ_THREADS 256
#define SUMSQ_SPAN 65536 /* elements per block: a fixed split, a fixed order */

/* One partial sum per block of SUMSQ_SPAN elements: each thread a strided
 * run, then a tree in shared memory; both orders depend only on n. */
__global__ void sumsq_partial_kernel(const float *g, int64_t n, double *part)
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

__global__ void sumsq_total_kernel(const double *part, int64_t n_parts, regc_step_scalars *s)
{
    double t = s->grad_sumsq;
    for (int64_t p = 0; p < n_parts; p++)
        t += part[p];
    s->grad_sumsq = t;
}

static void cuda_grad_sumsq(regc_backend *be, const float *g, int64_t n, regc_step_scalars *s)
{
    const int64_t n_parts = (n + SUMSQ_SPAN - 1) / SUMSQ_SPAN;
    double *part = NULL;
    cudaStream_t st = ctx_of(be)->stream;
    if (n_parts == 0)
        return;
    note(be, cudaMallocAsync((void **)&part, (size_t)n_parts * sizeof *part, st), "grad_sumsq");
    if (!part)
        return;
    sumsq_partial_kernel<<<(unsigned)n_parts, SUMSQ_THREADS, 0, st>>>(g, n, part);
    sumsq_total_kernel<<<1, 1, 0, st>>>(part, n_parts, s);
    note(be, cudaGetLastError(), "grad_sumsq");
    note(be, cudaFreeAsync(part, st), "grad_sumsq");
}

__global__ void grad_clip_kernel(regc_step_scalars *s) { regc_step_clip(s); }

static void cuda_grad_clip(regc_backend *be, regc_step_scalars *s)
{
    grad_clip_kernel<<<1, 1, 0, ctx_of(be)->stream>>>(s);
    note(be, cudaGetLastError(), "grad_clip");
}

/* torch.optim.AdamW, one element per thread, the coefficients from s. */
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n,
                             const regc_step_scalars *s)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || s->skipped) /* skipped: a non-finite gradient norm */
        return;
    const float gi = g[i] * s->clip_scale;
    const float mi = m[i] * s->beta1_f + s->one_minus_beta1 * gi;
    const float vi = v[i] * s->beta2_f + (s->one_minus_beta2 * gi) * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * s->decay + (s->neg_step_size * mi) / (sqrtf(vi) / s->bc2_sqrt + s->eps_f);
}

static void cuda_adamw(regc_backend *be, float *param, const float *grad, float *m, float *v,
                       int64_t n, const regc_step_scalars *s)
{
    adamw_kernel<<<blocks_for((size_t)n), 256, 0, ctx_of(be)->stream>>>(param, grad, m, v, n, s);
    note(be, cudaGetLastError(), "adamw");
}

/* ---- creation */

static void cuda_destroy(regc_backend *be)
{
    cuda_ctx *c = ctx_of(be);
    if (c->workspace)
        cudaFree(c->workspace);
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

extern "C" int regc_cuda_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" regc_backend *regc_cuda_backend_open(int device)
{
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: device %d cannot be used: %s", device,
                   cudaGetErrorString(err));
        return NULL;
    }
    regc_backend *be = (regc_backend *)calloc(1, sizeof *be);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        regc_error(REGC_ERR_MEMORY, "cuda: out of memory");
        return NULL;
    }
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
        be->mem_capacity = (int64_t)total_bytes;
    be->name = "cuda";
    be->ctx = c;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(c->device, sizeof c->device, "cuda sm_%d%d", prop.major, prop.minor);
    else
        snprintf(c->device, sizeof c->device, "cuda");
    be->device = c->device;
    be->destroy = cuda_destroy;
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&c->workspace, CUDA_WORKSPACE_BYTES) != cudaSuccess) {
        regc_error(REGC_ERR_UNSUPPORTED,
                   "cuda: cannot create a stream, cuBLASLt handle or workspace");
        cuda_destroy(be);
        return NULL;
    }
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->copy_h2d = cuda_copy_h2d;
    be->copy_d2h = cuda_copy_d2h;
    be->copy_d2d = cuda_copy_d2d;
    be->copy_2d = cuda_copy_2d;
    be->fill = cuda_fill;
    be->sync = cuda_sync;
    be->gemm = cuda_gemm;
    be->step_schedule = cuda_step_schedule;
    be->grad_sumsq = cuda_grad_sumsq;
    be->grad_clip = cuda_grad_clip;
    be->adamw = cuda_adamw;
    return be;
}
