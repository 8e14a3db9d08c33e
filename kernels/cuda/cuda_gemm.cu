/* cuda_gemm.cu — GEMMs through cuBLASLt, each regc epilogue mapped onto
 * one cuBLASLt epilogue, set up once per distinct GEMM rather than on every
 * call.
 *
 * Row-major to cuBLASLt (column-major): C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T, i.e. cuBLASLt's A is our B and its M is our n. Its
 * bias vector runs along its M, our n; BGRADA reduces its A, our op(B),
 * over k, which is our BGRAD.
 *
 * Plans. A GEMM's plan is its matmul descriptor, its three layouts and its
 * algorithm, keyed on everything they depend on: the shape, the leading
 * dimensions, the transposes, the epilogue, accumulation and each
 * operand's alignment (the largest power of two up to 256 bytes dividing
 * its address, which cuBLASLt's alignment preferences are set from). A
 * program's GEMMs are prepared when it is bound (gemm_prepare), so the
 * heuristic query runs then, once per distinct GEMM; a call finds its plan
 * by key and only points the descriptor at this call's bias, aux and bias
 * gradient. The chosen algorithms can be saved as bytes (tuning_save) and
 * loaded on a later start (tuning_load): the compile cache keeps them
 * beside the step, under the device's name, so a warm start queries
 * nothing (each loaded algorithm is still checked against its descriptors
 * with cublasLtMatmulAlgoCheck, a cheap call).
 *
 * Where cuBLASLt cannot run an epilogue — GELU's aux needs a leading
 * dimension that is a multiple of 8, or no algorithm supports the fused
 * form — the plan is a plain GEMM followed by regc's own epilogue kernel,
 * whose per-element math is kernel_math.h's (the CPU's bits for the
 * epilogue; the GEMM's own sums are cuBLASLt's order, not the CPU's).
 *
 * A B held in NF4 (b_nf4, a frozen QLoRA weight): cuBLASLt has no 4-bit
 * operand, so one pass (cuda_nf4_dequant_kernel, one thread per value)
 * dequantises the whole blob into stream-ordered scratch with nf4_format.h's
 * formula and bitsandbytes' tables in __constant__ memory — the CPU's fp32
 * bits, since nothing is fused (--fmad=false) — stored as regc_bf16_bits
 * when the GEMM is bf16, exactly what a B held in bf16 would hold. The GEMM
 * then runs on a copy of the descriptor pointing at that scratch (b_bf16 =
 * bf16, b_nf4 = 0) and the scratch is freed after it, on the stream, so a
 * captured step records the allocation, the pass and the free as graph
 * nodes. The plan is the dequantised GEMM's: prepare keys it with B at
 * NULL, aligned as scratch is, so an NF4 weight and a plain one of the same
 * shape share a plan and the key needs no field of its own. A bf16 B that
 * is contiguous, with rows of a multiple of 8 values, and 256-byte aligned
 * (the dequantised copy, or a weight held in bf16) is read where it lies
 * instead of being copied again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "kernel_checks.h"
#include "regc_backend.h"

#define CUDA_WORKSPACE_BYTES (32u << 20)

/* Everything a plan depends on; int64 fields only, so there is no padding
 * and a key compares and saves as its bytes. */
typedef struct {
    int64_t trans_a, trans_b, epilogue, accumulate;
    int64_t m, n, k, lda, ldb, ldc, ldaux;
    int64_t align_a, align_b, align_c, align_aux, align_bias;
    int64_t bf16; /* operands copied to bf16 first (cuda_gemm_to_bf16) */
    int64_t tf32; /* fp32 operands multiplied as TF32 (regc_backend.tf32) */
    /* BGRAD only: alpha is not 1. cuBLASLt documents BGRADA's reduction of
     * its input over k but not whether alpha scales it, and regc's BGRAD
     * leaves the sums unscaled, so only alpha 1 (every GEMM the compiler
     * makes) runs fused */
    int64_t bgrad_scaled;
} cuda_gemm_key;

typedef struct {
    cuda_gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int fused; /* 1: cuBLASLt runs the epilogue; 0: a plain GEMM, then regc's kernel */
} cuda_gemm_plan;

/* a loaded choice: the algorithm for a key, and whether it ran fused */
typedef struct {
    cuda_gemm_key key;
    cublasLtMatmulAlgo_t algo;
    int64_t fused;
} cuda_gemm_choice;

struct cuda_gemm_plans {
    cuda_gemm_plan *plan;
    int n, cap;
    cuda_gemm_choice *known; /* from tuning_load */
    int n_known;
};

/* ---- keys */

static int64_t cuda_alignment(const void *p)
{
    const uintptr_t u = (uintptr_t)p;
    if (!u)
        return 256;
    int64_t a = 1;
    while (a < 256 && u % (uintptr_t)(a * 2) == 0)
        a *= 2;
    return a;
}

/* The row stride of a bf16 operand's copy: a multiple of 8 values (16
 * bytes), as cuBLASLt's tensor-core kernels want their leading dimensions
 * aligned; a vocabulary of 50,257 would otherwise leave the head's GEMMs to
 * slower kernels, or to none (llm.c pads its vocabulary to 50,304 for the
 * same reason). */
static int64_t cuda_bf16_ld(int64_t cols) { return (cols + 7) / 8 * 8; }

static int cuda_epilogue_has_aux(int e)
{
    return e == REGC_EPI_GELU_AUX || e == REGC_EPI_BIAS_GELU_AUX || e == REGC_EPI_DGELU ||
           e == REGC_EPI_DGELU_BGRAD;
}

static cuda_gemm_key cuda_gemm_key_of(const regc_backend *be, const regc_gemm *g)
{
    cuda_gemm_key k;
    memset(&k, 0, sizeof k);
    k.trans_a = g->trans_a;
    k.trans_b = g->trans_b;
    k.epilogue = g->epilogue;
    k.accumulate = g->accumulate != 0;
    k.m = g->m;
    k.n = g->n;
    k.k = g->k;
    k.lda = g->lda;
    k.ldb = g->ldb;
    k.ldc = g->ldc;
    k.ldaux = cuda_epilogue_has_aux(g->epilogue) ? g->ldaux : 0;
    k.bf16 = g->bf16 != 0;
    k.tf32 = !k.bf16 && be->tf32;
    k.bgrad_scaled = g->epilogue == REGC_EPI_BGRAD && g->alpha != 1.0f;
    /* bf16 operands are fresh copies, aligned as every allocation is */
    k.align_a = k.bf16 ? 256 : cuda_alignment(g->a);
    k.align_b = k.bf16 ? 256 : cuda_alignment(g->b);
    k.align_c = cuda_alignment(g->c);
    k.align_aux = cuda_epilogue_has_aux(g->epilogue) ? cuda_alignment(g->aux) : 0;
    const int e = g->epilogue;
    k.align_bias = e == REGC_EPI_BIAS || e == REGC_EPI_BIAS_GELU_AUX  ? cuda_alignment(g->bias)
                   : e == REGC_EPI_BGRAD || e == REGC_EPI_DGELU_BGRAD ? cuda_alignment(g->bias_grad)
                                                                      : 0;
    return k;
}

static int cuda_gemm_lt_fail(const char *where, cublasStatus_t st)
{
    return regc_error(REGC_ERR_UNSUPPORTED, "cuBLASLt: %s failed (status %d)", where, (int)st);
}

static cublasLtEpilogue_t cuda_lt_epilogue(int e)
{
    switch (e) {
    case REGC_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case REGC_EPI_GELU: return CUBLASLT_EPILOGUE_GELU;
    case REGC_EPI_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case REGC_EPI_BIAS_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case REGC_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case REGC_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case REGC_EPI_BGRAD: return CUBLASLT_EPILOGUE_BGRADA;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

/* ---- plans */

static void cuda_gemm_plan_release(cuda_gemm_plan *p)
{
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* The descriptor and layouts of a plan, fused or plain. */
static int cuda_gemm_plan_describe(cuda_gemm_plan *p, int fused)
{
    const cuda_gemm_key *k = &p->key;
    cublasStatus_t st;
    /* cuBLASLt's operands: A' = our B, B' = our A, M' = n, N' = m */
    cublasOperation_t ta = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint64_t a_rows = (uint64_t)(k->trans_b ? k->k : k->n); /* col-major, as stored */
    const uint64_t a_cols = (uint64_t)(k->trans_b ? k->n : k->k);
    const uint64_t b_rows = (uint64_t)(k->trans_a ? k->m : k->k);
    const uint64_t b_cols = (uint64_t)(k->trans_a ? k->k : k->m);
    cublasLtEpilogue_t epi = fused ? cuda_lt_epilogue((int)k->epilogue) : CUBLASLT_EPILOGUE_DEFAULT;
    const cublasComputeType_t compute = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if ((st = cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F)))
        return cuda_gemm_lt_fail("descriptor", st);
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (fused && cuda_epilogue_has_aux((int)k->epilogue)) {
        const int64_t ld = k->ldaux;
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
    /* bf16: the operands' copies have rows of cuda_bf16_ld values
     * (cuda_gemm_to_bf16), and the bias and aux stay fp32 */
    const cudaDataType_t in_type = k->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const int64_t lda = k->bf16 ? cuda_bf16_ld((int64_t)b_rows) : k->lda,
                  ldb = k->bf16 ? cuda_bf16_ld((int64_t)a_rows) : k->ldb;
    if (k->bf16) {
        const cudaDataType_t f32 = CUDA_R_32F;
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32,
                                       sizeof f32);
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &f32,
                                       sizeof f32);
    }
    if ((st = cublasLtMatrixLayoutCreate(&p->la, in_type, a_rows, a_cols, ldb)) ||
        (st = cublasLtMatrixLayoutCreate(&p->lb, in_type, b_rows, b_cols, lda)) ||
        (st = cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)k->n, (uint64_t)k->m,
                                         k->ldc)))
        return cuda_gemm_lt_fail("matrix layout", st);
    p->fused = fused;
    return REGC_OK;
}

/* Point the descriptor at this call's bias, aux and bias gradient (the
 * addresses vary from call to call; everything else is the plan's). */
static void cuda_gemm_plan_point(cuda_gemm_plan *p, const regc_gemm *g)
{
    if (!p->fused)
        return;
    const int e = (int)p->key.epilogue;
    if (e == REGC_EPI_BIAS || e == REGC_EPI_BIAS_GELU_AUX)
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                       sizeof g->bias);
    if (e == REGC_EPI_BGRAD || e == REGC_EPI_DGELU_BGRAD)
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias_grad,
                                       sizeof g->bias_grad);
    if (cuda_epilogue_has_aux(e))
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                       sizeof g->aux);
}

/* The heuristic's first algorithm for the plan's descriptors, within the
 * workspace and the operands' alignment; 0 when there is none. */
static int cuda_gemm_plan_query(regc_backend *be, cuda_gemm_plan *p)
{
    cuda_ctx *c = cuda_ctx_of(be);
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (cublasLtMatmulPreferenceCreate(&pref))
        return 0;
    const size_t ws = c->workspace_bytes;
    const uint32_t align_a = (uint32_t)p->key.align_b, align_b = (uint32_t)p->key.align_a;
    const uint32_t align_c = (uint32_t)p->key.align_c;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                         sizeof align_a);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                         sizeof align_b);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                         sizeof align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                         sizeof align_c);
    be->tuning_queries++;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc,
                                                       pref, 1, &heur, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st || found == 0)
        return 0;
    p->algo = heur.algo;
    return 1;
}

/* A loaded algorithm for the plan's key, if it still suits the descriptors. */
static int cuda_gemm_plan_recall(regc_backend *be, cuda_gemm_plan *p)
{
    const cuda_gemm_plans *ps = cuda_ctx_of(be)->plans;
    for (int i = 0; ps && i < ps->n_known; i++) {
        const cuda_gemm_choice *k = &ps->known[i];
        if (memcmp(&k->key, &p->key, sizeof p->key) != 0)
            continue;
        if (!!k->fused != p->fused)
            return 0;
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(cuda_ctx_of(be)->lt, p->op, p->la, p->lb, p->lc, p->lc,
                                    &k->algo, &check) != CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > cuda_ctx_of(be)->workspace_bytes)
            return 0;
        p->algo = k->algo;
        return 1;
    }
    return 0;
}

/* Choose a plan for g: the fused epilogue where cuBLASLt can run it, else
 * a plain GEMM and regc's epilogue kernel. The descriptor points at g's
 * bias and aux before the heuristic runs: cuBLASLt reads their alignment
 * from the pointers. */
static int cuda_gemm_plan_choose(regc_backend *be, cuda_gemm_plan *p, const regc_gemm *g)
{
    const int e = (int)p->key.epilogue;
    /* GELU's aux: cuBLASLt wants its leading dimension a multiple of 8 */
    const int can_fuse = e != REGC_EPI_NONE && !p->key.bgrad_scaled &&
                         (!cuda_epilogue_has_aux(e) || p->key.ldaux % 8 == 0);
    for (int fused = can_fuse; fused >= 0; fused--) {
        int rc = cuda_gemm_plan_describe(p, fused);
        if (rc == REGC_OK)
            cuda_gemm_plan_point(p, g);
        if (rc == REGC_OK && (cuda_gemm_plan_recall(be, p) || cuda_gemm_plan_query(be, p)))
            return REGC_OK;
        const cuda_gemm_key key = p->key;
        cuda_gemm_plan_release(p);
        p->key = key;
        if (rc != REGC_OK)
            return rc;
    }
    return regc_error(REGC_ERR_UNSUPPORTED,
                      "cuBLASLt: no algorithm for a %lldx%lldx%lld GEMM (epilogue %d)",
                      (long long)p->key.m, (long long)p->key.n, (long long)p->key.k, e);
}

/* The plan for g: found, or chosen now and kept. */
static int cuda_gemm_plan_for(regc_backend *be, const regc_gemm *g, cuda_gemm_plan **out)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (!c->plans && !(c->plans = (cuda_gemm_plans *)calloc(1, sizeof *c->plans)))
        return regc_error(REGC_ERR_MEMORY, "cuda: out of memory");
    cuda_gemm_plans *ps = c->plans;
    const cuda_gemm_key key = cuda_gemm_key_of(be, g);
    for (int i = 0; i < ps->n; i++)
        if (memcmp(&ps->plan[i].key, &key, sizeof key) == 0) {
            *out = &ps->plan[i];
            return REGC_OK;
        }
    if (ps->n == ps->cap) {
        const int cap = ps->cap ? ps->cap * 2 : 32;
        cuda_gemm_plan *grown = (cuda_gemm_plan *)realloc(ps->plan, (size_t)cap * sizeof *grown);
        if (!grown)
            return regc_error(REGC_ERR_MEMORY, "cuda: out of memory");
        ps->plan = grown;
        ps->cap = cap;
    }
    cuda_gemm_plan *p = &ps->plan[ps->n];
    memset(p, 0, sizeof *p);
    p->key = key;
    int rc = cuda_gemm_plan_choose(be, p, g);
    if (rc != REGC_OK)
        return rc;
    ps->n++;
    *out = p;
    return REGC_OK;
}

void regc_cuda_gemm_plans_free(regc_backend *be)
{
    cuda_gemm_plans *ps = cuda_ctx_of(be)->plans;
    if (!ps)
        return;
    for (int i = 0; i < ps->n; i++)
        cuda_gemm_plan_release(&ps->plan[i]);
    free(ps->plan);
    free(ps->known);
    free(ps);
    cuda_ctx_of(be)->plans = NULL;
}

/* ---- regc's own epilogues, for plans cuBLASLt cannot fuse */

/* C[i, j] = epilogue(C[i, j]) and aux, one element per thread (the
 * elementwise kinds: BIAS, GELU, GELU_AUX, BIAS_GELU_AUX, DGELU, and
 * DGELU_BGRAD's elementwise part). */
__global__ void cuda_epilogue_kernel(int e, int64_t m, int64_t n, float *c, int64_t ldc, float *aux,
                                     int64_t ldaux, const float *bias)
{
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= m * n)
        return;
    const int64_t i = idx / n, j = idx % n;
    float *cij = c + i * ldc + j;
    switch (e) {
    case REGC_EPI_BIAS: *cij = regc_addf(*cij, bias[j]); break;
    case REGC_EPI_GELU: *cij = regc_gelu(*cij); break;
    case REGC_EPI_GELU_AUX:
        aux[i * ldaux + j] = *cij;
        *cij = regc_gelu(*cij);
        break;
    case REGC_EPI_BIAS_GELU_AUX: {
        const float pre = regc_addf(*cij, bias[j]);
        aux[i * ldaux + j] = pre;
        *cij = regc_gelu(pre);
        break;
    }
    case REGC_EPI_DGELU:
    case REGC_EPI_DGELU_BGRAD: *cij = regc_gelu_dx(*cij, aux[i * ldaux + j]); break;
    default: break;
    }
}

/* out[j] = sum over i < rows of x[i * ld_row + j * ld_col], each value
 * first rounded to bf16 when round_bf16 (BGRAD of a bf16 GEMM sums the
 * operand it multiplied), in double, i in order from 0 (the CPU's column
 * sums): one thread per column. */
__global__ void cuda_strided_sums_kernel(float *out, const void *x, int x_bf16, int64_t rows,
                                         int64_t cols, int64_t ld_row, int64_t ld_col,
                                         int round_bf16)
/* x: fp32 values, or bf16 ones where x_bf16 */
{
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols)
        return;
    double acc = 0.0;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t at = i * ld_row + j * ld_col;
        const float v =
            x_bf16 ? regc_bf16_value(((const uint16_t *)x)[at]) : ((const float *)x)[at];
        acc += round_bf16 ? regc_round_bf16(v) : v;
    }
    out[j] = (float)acc;
}

static void cuda_gemm_unfused_epilogue(regc_backend *be, const regc_gemm *g)
{
    const int e = g->epilogue;
    cudaStream_t st = cuda_stream(be);
    if (e == REGC_EPI_BGRAD) { /* bias_grad[n] = sum over k of op(B)[k, n] */
        const int64_t ld_row = g->trans_b ? 1 : g->ldb, ld_col = g->trans_b ? g->ldb : 1;
        cuda_strided_sums_kernel<<<cuda_blocks_for(g->n), CUDA_THREADS, 0, st>>>(
            g->bias_grad, g->b, g->b_bf16, g->k, g->n, ld_row, ld_col, g->bf16);
    } else if (e != REGC_EPI_NONE && g->m > 0 && g->n > 0) {
        cuda_epilogue_kernel<<<cuda_blocks_for(g->m * g->n), CUDA_THREADS, 0, st>>>(
            e, g->m, g->n, g->c, g->ldc, g->aux, g->ldaux, g->bias);
        if (e == REGC_EPI_DGELU_BGRAD)
            cuda_strided_sums_kernel<<<cuda_blocks_for(g->n), CUDA_THREADS, 0, st>>>(
                g->bias_grad, g->c, 0, g->m, g->n, g->ldc, 1, 0);
    }
    cuda_note(be, cudaGetLastError(), "gemm epilogue");
}

/* ---- bf16 operands: x [rows, cols] (row stride ld) rounded to bf16
 * (regc_round_bf16: the CPU's rounding) into a copy of row stride
 * cuda_bf16_ld(cols), whose padding no product reads; an operand held in
 * bf16 already (x_bf16) is copied as it is */

__global__ void cuda_to_bf16_kernel(uint16_t *dst, int64_t dst_ld, const void *x, int x_bf16,
                                    int64_t rows, int64_t cols,
                                    int64_t ld) /* dst: [rows, dst_ld]; x: [rows, ld] */
{
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * cols)
        return;
    const int64_t r = idx / cols, col = idx % cols;
    const int64_t at = r * ld + col;
    dst[r * dst_ld + col] =
        x_bf16 ? ((const uint16_t *)x)[at] : regc_bf16_bits(((const float *)x)[at]);
}

static uint16_t *cuda_gemm_to_bf16(regc_backend *be, const void *x, int x_bf16, int64_t rows,
                                   int64_t cols, int64_t ld)
{
    const int64_t dst_ld = cuda_bf16_ld(cols);
    uint16_t *dst =
        (uint16_t *)cuda_scratch_alloc(be, (size_t)(rows * dst_ld) * sizeof *dst, "gemm bf16");
    if (!dst)
        return NULL;
    cuda_to_bf16_kernel<<<cuda_blocks_for(rows * cols), CUDA_THREADS, 0, cuda_stream(be)>>>(
        dst, dst_ld, x, x_bf16, rows, cols, ld);
    cuda_note(be, cudaGetLastError(), "gemm bf16");
    return dst;
}

/* ---- a B held in NF4 (b_nf4): dequantised whole into scratch, then the
 * GEMM of that copy */

/* bitsandbytes' tables (nf4_format.h), read by every thread at the same few
 * addresses: constant memory's broadcast */
__constant__ float cuda_nf4_levels[16] = REGC_NF4_LEVELS;
__constant__ float cuda_nf4_dynamic_map[256] = REGC_NF4_DYNAMIC_MAP;

/* dst[e] = value e of the blob (count values), fp32 or regc_bf16_bits of
 * it; one value per thread, grid-stride. Each thread recomputes its
 * block's absmax (a multiply and an add of cached values), cheaper than
 * sharing it through shared memory and a barrier. */
__global__ void cuda_nf4_dequant_kernel(void *dst, int to_bf16, const uint8_t *blob, int64_t count)
{
    const regc_nf4_layout_t l = regc_nf4_layout(count);
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += step) {
        float v;
        regc_nf4_read(blob, &l, cuda_nf4_levels, cuda_nf4_dynamic_map, e, 1, &v, 1);
        if (to_bf16)
            ((uint16_t *)dst)[e] = regc_bf16_bits(v);
        else
            ((float *)dst)[e] = v;
    }
}

/* Blocks for the grid-stride pass: enough to fill any current GPU, and the
 * grid's x dimension stays far below its limit whatever the count. */
#define CUDA_NF4_MAX_BLOCKS 8192

/* B's k * n values dequantised into fresh scratch (bf16 with g->bf16);
 * NULL when there is no memory. */
static void *cuda_gemm_dequant_b(regc_backend *be, const regc_gemm *g)
{
    const int64_t count = g->k * g->n;
    const size_t bytes = (size_t)count * (g->bf16 ? sizeof(uint16_t) : sizeof(float));
    void *dst = cuda_scratch_alloc(be, bytes, "gemm nf4");
    if (!dst)
        return NULL;
    const int64_t blocks = (count + CUDA_THREADS - 1) / CUDA_THREADS;
    const unsigned grid = (unsigned)(blocks < CUDA_NF4_MAX_BLOCKS ? blocks : CUDA_NF4_MAX_BLOCKS);
    cuda_nf4_dequant_kernel<<<grid, CUDA_THREADS, 0, cuda_stream(be)>>>(
        dst, g->bf16, (const uint8_t *)g->b, count);
    cuda_note(be, cudaGetLastError(), "gemm nf4");
    return dst;
}

/* g with an NF4 B replaced by its dequantised copy bq, held in bf16 with a
 * bf16 GEMM (a plan's key sees the copy: prepare passes bq = NULL, aligned
 * as scratch). The blob is contiguous, so ldb already suits the copy. */
static regc_gemm cuda_gemm_dequant_view(const regc_gemm *g, void *bq)
{
    regc_gemm w = *g;
    if (g->b_nf4)
        w.b = (const float *)bq, w.b_bf16 = g->bf16, w.b_nf4 = 0;
    return w;
}

/* ---- a C held in bf16 (c_bf16): the GEMM and its epilogue write an fp32
 * view [m, n] in scratch (cuBLASLt's fused epilogues and regc's unfused
 * ones alike, so the bias gradient and aux are those of fp32 values), then
 * one pass rounds it into C */

__global__ void cuda_store_bf16_kernel(uint16_t *dst, int64_t ld_dst, const float *src,
                                       int64_t rows, int64_t cols) /* dst: [rows, ld_dst] */
{
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * cols)
        return;
    dst[idx / cols * ld_dst + idx % cols] = regc_bf16_bits(src[idx]);
}

/* g with C replaced by its fp32 view c32 where g's C is held in bf16 (a
 * plan's key sees the view: prepare passes c32 = NULL, aligned as scratch) */
static regc_gemm cuda_gemm_fp32_view(const regc_gemm *g, float *c32)
{
    regc_gemm w = *g;
    if (g->c_bf16)
        w.c = c32, w.ldc = g->n > 0 ? g->n : 1, w.c_bf16 = 0;
    return w;
}

/* ---- the entries */

/* g's C is fp32 here (cuda_gemm made the view) */
static int cuda_gemm_run(regc_backend *be, const regc_gemm *g)
{
    cuda_ctx *c = cuda_ctx_of(be);
    int rc = REGC_OK;
    if (g->n == 0)
        return rc;
    if (g->m == 0) { /* no C, but a bias gradient as the CPU writes it */
        if (g->epilogue == REGC_EPI_BGRAD)
            cuda_gemm_unfused_epilogue(be, g);
        else if (g->epilogue == REGC_EPI_DGELU_BGRAD)
            cuda_note(be, cudaMemsetAsync(g->bias_grad, 0, (size_t)g->n * sizeof(float), c->stream),
                      "gemm");
        return REGC_OK;
    }
    if (g->k <= 0) { /* an empty product: C = 0 (or kept), then the epilogue */
        if (!g->accumulate)
            cuda_note(be,
                      cudaMemset2DAsync(g->c, (size_t)g->ldc * sizeof(float), 0,
                                        (size_t)g->n * sizeof(float), (size_t)g->m, c->stream),
                      "gemm");
        cuda_gemm_unfused_epilogue(be, g);
        return REGC_OK;
    }
    cuda_gemm_plan *p;
    if ((rc = cuda_gemm_plan_for(be, g, &p)) != REGC_OK)
        return rc;
    cuda_gemm_plan_point(p, g);
    const float beta = g->accumulate ? 1.0f : 0.0f;
    const void *a = g->a, *b = g->b;
    uint16_t *a16 = NULL, *b16 = NULL; /* op(A), op(B) as stored, in bf16 (cuda_bf16_ld) */
    if (g->bf16) {
        const int64_t a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
        const int64_t b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
        /* the plan takes bf16 operands of row stride cuda_bf16_ld and
         * 256-byte aligned (cuda_gemm_key_of): a B already so needs no copy */
        const int b_as_is =
            g->b_bf16 && g->ldb == cuda_bf16_ld(b_cols) && cuda_alignment(g->b) == 256;
        a = a16 = cuda_gemm_to_bf16(be, g->a, g->a_bf16, a_rows, a_cols, g->lda);
        if (!b_as_is)
            b = b16 = cuda_gemm_to_bf16(be, g->b, g->b_bf16, b_rows, b_cols, g->ldb);
        if (!a16 || !b) {
            cuda_scratch_free(be, a16, "gemm bf16");
            cuda_scratch_free(be, b16, "gemm bf16");
            return regc_error(REGC_ERR_MEMORY, "cuda: no memory for a GEMM's bf16 operands");
        }
    }
    cublasStatus_t st =
        cublasLtMatmul(c->lt, p->op, &g->alpha, b, p->la, a, p->lb, &beta, g->c, p->lc, g->c, p->lc,
                       &p->algo, c->workspace, c->workspace_bytes, c->stream);
    cuda_scratch_free(be, a16, "gemm bf16");
    cuda_scratch_free(be, b16, "gemm bf16");
    if (st)
        return cuda_gemm_lt_fail("matmul", st);
    if (!p->fused)
        cuda_gemm_unfused_epilogue(be, g);
    return REGC_OK;
}

static int cuda_gemm_prepare(regc_backend *be, const regc_gemm *g_in)
{
    cuda_gemm_plan *p;
    int rc = regc_gemm_check(g_in);
    if (rc != REGC_OK)
        return rc;
    const regc_gemm c_view = cuda_gemm_fp32_view(g_in, NULL);
    const regc_gemm g = cuda_gemm_dequant_view(&c_view, NULL);
    return g.m > 0 && g.n > 0 && g.k > 0 ? cuda_gemm_plan_for(be, &g, &p) : REGC_OK;
}

/* g checked, its B not in NF4 */
static int cuda_gemm_checked(regc_backend *be, const regc_gemm *g)
{
    if (!g->c_bf16 || g->m == 0 || g->n == 0)
        return cuda_gemm_run(be, g);
    float *c32 =
        (float *)cuda_scratch_alloc(be, (size_t)(g->m * g->n) * sizeof(float), "gemm bf16 C");
    if (!c32)
        return regc_error(REGC_ERR_MEMORY, "cuda: no memory for a GEMM's fp32 view of C");
    const regc_gemm w = cuda_gemm_fp32_view(g, c32);
    const int rc = cuda_gemm_run(be, &w);
    if (rc == REGC_OK) {
        cuda_store_bf16_kernel<<<cuda_blocks_for(g->m * g->n), CUDA_THREADS, 0, cuda_stream(be)>>>(
            (uint16_t *)g->c, g->ldc, c32, g->m, g->n);
        cuda_note(be, cudaGetLastError(), "gemm bf16 C");
    }
    cuda_scratch_free(be, c32, "gemm bf16 C");
    return rc;
}

static int cuda_gemm(regc_backend *be, const regc_gemm *g)
{
    int rc = regc_gemm_check(g);
    if (rc != REGC_OK || !g->b_nf4)
        return rc == REGC_OK ? cuda_gemm_checked(be, g) : rc;
    /* B is read by the product, and by BGRAD's sums even without rows of C */
    const int reads_b = g->n > 0 && g->k > 0 && (g->m > 0 || g->epilogue == REGC_EPI_BGRAD);
    void *bq = reads_b ? cuda_gemm_dequant_b(be, g) : NULL;
    if (reads_b && !bq)
        return regc_error(REGC_ERR_MEMORY, "cuda: no memory for a GEMM's dequantised NF4 B");
    const regc_gemm w = cuda_gemm_dequant_view(g, bq);
    rc = cuda_gemm_checked(be, &w);
    cuda_scratch_free(be, bq, "gemm nf4");
    return rc;
}

/* ---- the chosen algorithms as bytes: a header (magic, cuBLASLt's version,
 * the count), then (key, algorithm, fused) records */

#define CUDA_TUNING_MAGIC 0x35304c6363676572ull /* "regccL05" */

typedef struct {
    uint64_t magic, lt_version, count;
} cuda_tuning_header;

static size_t cuda_tuning_save(regc_backend *be, void *buf, size_t cap)
{
    const cuda_gemm_plans *ps = cuda_ctx_of(be)->plans;
    const int n = ps ? ps->n : 0;
    const size_t need = sizeof(cuda_tuning_header) + (size_t)n * sizeof(cuda_gemm_choice);
    if (!buf || cap < need)
        return need;
    cuda_tuning_header h = {CUDA_TUNING_MAGIC, (uint64_t)cublasLtGetVersion(), (uint64_t)n};
    memcpy(buf, &h, sizeof h);
    for (int i = 0; i < n; i++) {
        cuda_gemm_choice k;
        memset(&k, 0, sizeof k);
        k.key = ps->plan[i].key;
        k.algo = ps->plan[i].algo;
        k.fused = ps->plan[i].fused;
        memcpy((char *)buf + sizeof h + (size_t)i * sizeof k, &k, sizeof k);
    }
    return need;
}

static int cuda_tuning_load(regc_backend *be, const void *data, size_t len)
{
    cuda_ctx *c = cuda_ctx_of(be);
    cuda_tuning_header h;
    if (len < sizeof h)
        return regc_error(REGC_ERR_FORMAT, "cuda tuning: %zu bytes, too short", len);
    memcpy(&h, data, sizeof h);
    if (h.magic != CUDA_TUNING_MAGIC || h.lt_version != (uint64_t)cublasLtGetVersion() ||
        h.count != (len - sizeof h) / sizeof(cuda_gemm_choice) ||
        (len - sizeof h) % sizeof(cuda_gemm_choice) != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "cuda tuning: not this build's algorithms (cuBLASLt %llu, %zu bytes)",
                          (unsigned long long)h.lt_version, len);
    if (!c->plans && !(c->plans = (cuda_gemm_plans *)calloc(1, sizeof *c->plans)))
        return regc_error(REGC_ERR_MEMORY, "cuda: out of memory");
    cuda_gemm_choice *known = (cuda_gemm_choice *)malloc(len - sizeof h + 1);
    if (!known)
        return regc_error(REGC_ERR_MEMORY, "cuda: out of memory");
    memcpy(known, (const char *)data + sizeof h, len - sizeof h);
    free(c->plans->known);
    c->plans->known = known;
    c->plans->n_known = (int)h.count;
    return REGC_OK;
}

void regc_cuda_set_gemm(regc_backend *be)
{
    be->gemm = cuda_gemm;
    be->gemm_prepare = cuda_gemm_prepare;
    be->tuning_save = cuda_tuning_save;
    be->tuning_load = cuda_tuning_load;
}

/* The workspace every plan may use. */
int regc_cuda_gemm_open(regc_backend *be)
{
    cuda_ctx *c = cuda_ctx_of(be);
    c->workspace_bytes = CUDA_WORKSPACE_BYTES;
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&c->workspace, c->workspace_bytes) != cudaSuccess)
        return regc_error(REGC_ERR_UNSUPPORTED, "cuda: cannot create a cuBLASLt handle or its "
                                                "workspace");
    return REGC_OK;
}
