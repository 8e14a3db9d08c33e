/* cpu_gemm.c — the GEMM entry: regc's own sgemm where the CPU has AVX-512
 * or AVX2 (chosen at run time, below), which applies the elementwise
 * epilogues on each tile of C, or else OpenBLAS's cblas_sgemm, one thread
 * per block of C in regc's team (cpu_blas_gemm), followed by the
 * cuBLASLt-style epilogue as a row-parallel pass over C. DGELU_BGRAD's
 * column sums are that pass in both.
 *
 * A bf16 GEMM (g->bf16) runs regc's bf16 kernel where the CPU has
 * AVX-512 BF16 (cpu_bgemm.c), else the sgemm with its packed values
 * rounded, else cblas_sgemm on rounded copies of A and B: products of bf16
 * values are exact in fp32, so each is a bf16 GEMM summed in fp32. BGRAD's
 * bias gradient then sums op(B) as rounded, the values the product used
 * (as under PyTorch's autocast, where the bias gradient is the sum of the
 * bf16 output gradient).
 *
 * Operands held in bf16 (a_bf16, b_bf16, c_bf16): the bf16 kernel packs A
 * and B as they are; elsewhere (and for BGRAD's sums of B) they are first
 * widened into a second scratch buffer, exactly. A C held in bf16 is
 * computed into an fp32 view in that buffer (the slices' partial sums need
 * fp32) and rounded as each tile of the last slice is stored, or by the
 * pass that applies the epilogue where that comes after the product.
 *
 * A B held in NF4 (b_nf4, a frozen QLoRA weight): regc's kernels
 * dequantise it a slice at a time as they pack (cpu_sgemm.c); for
 * OpenBLAS, and for BGRAD's sums, it is dequantised whole into that
 * buffer first. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu_kernels.h"
#include "kernel_checks.h"
#include "regc_backend.h"
#include "regc_common.h"

/* The shared checks (gemm_check.h), and the 32-bit interface of BLAS. */
static int cpu_check_gemm(const regc_gemm *g)
{
    int status = regc_gemm_check(g);
    if (status != REGC_OK)
        return status;
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX ||
        g->ldb > INT_MAX || g->ldc > INT_MAX)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "gemm: a size or leading dimension exceeds the 32-bit BLAS interface");
    return REGC_OK;
}

/* x as the GEMM reads it: rounded to bf16 for a bf16 GEMM */
static inline float cpu_gemm_value(const regc_gemm *g, float x)
{
    return g->bf16 ? regc_round_bf16(x) : x;
}

/* bias_grad[n] = sum over k of op(B)[k, n]   (B: [k, n], or [n, k] when trans_b),
 * each value as the GEMM reads it */
static void cpu_bgrad_of_b(const regc_backend *be, const regc_gemm *g)
{
    const int threads = regc_cpu_threads(be);
    if (!g->trans_b && !g->bf16) {
        regc_cpu_sum_columns(be, g->bias_grad, g->b, g->ldb, g->k, g->n);
        return;
    }
    if (!g->trans_b) { /* regc_cpu_sum_columns' order, over rounded values */
#pragma omp parallel num_threads(threads) if (g->k * g->n >= regc_cpu_par_min(be))
        {
            int64_t lo, hi;
            regc_cpu_team_columns(g->n, &lo, &hi);
            for (int64_t c0 = lo; c0 < hi; c0 += REGC_CPU_COL_CHUNK) {
                const int64_t w = hi - c0 < REGC_CPU_COL_CHUNK ? hi - c0 : REGC_CPU_COL_CHUNK;
                double acc[REGC_CPU_COL_CHUNK] = {0}; /* [w] */
                for (int64_t r = 0; r < g->k; r++) {
                    const float *row = g->b + r * g->ldb + c0; /* [w] */
                    for (int64_t j = 0; j < w; j++)
                        acc[j] += regc_round_bf16(row[j]);
                }
                for (int64_t j = 0; j < w; j++)
                    g->bias_grad[c0 + j] = (float)acc[j];
            }
        }
        return;
    }
    /* op(B) = B^T: column n of op(B) is row n of B, contiguous */
#pragma omp parallel for num_threads(threads) if (g->n * g->k >= regc_cpu_par_min(be))             \
    schedule(static)
    for (int64_t j = 0; j < g->n; j++) {
        const float *row = g->b + j * g->ldb;
        double acc = 0.0;
        for (int64_t i = 0; i < g->k; i++)
            acc += cpu_gemm_value(g, row[i]);
        g->bias_grad[j] = (float)acc;
    }
}

/* A contiguous copy of x [rows, cols] (row stride ld) rounded to bf16 into
 * dst [rows, cols], for OpenBLAS, which has no bf16 operands of its own. */
static void cpu_round_copy(const regc_backend *be, float *restrict dst, const float *x,
                           int64_t rows, int64_t cols, int64_t ld)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[i * cols + j] = regc_round_bf16(x[i * ld + j]);
}

/* OpenBLAS's sums depend on how many threads split its GEMM, and a step's
 * bits must depend on neither the thread count nor the load that fits
 * regc's team to the free cores. So regc splits C itself, into blocks of
 * CPU_BLAS_BLOCK columns (or rows, where m > n) fixed by the shape alone,
 * and each block is one single-threaded cblas_sgemm inside regc's team:
 * every block's sums are the same whichever thread runs it and however
 * many there are, and a small GEMM under load stays on one thread as
 * regc's own loops do (no library threads spin). Each block repacks the
 * other operand, one value per CPU_BLAS_BLOCK multiply-adds.
 *
 * OpenBLAS built on OpenMP runs a call on one thread inside an active
 * parallel region, else on as many as the calling thread's default team
 * (omp_get_max_threads): a region that stays on one thread is inactive,
 * so that default is 1 while the blocks run, and restored after. (Its own
 * openblas_set_num_threads would set the same default for good.) */
#define CPU_BLAS_BLOCK 128

/* C = alpha op(A) op(B) (+ C) through OpenBLAS, in blocks of C; a bf16
 * GEMM multiplies rounded copies of A and B, made in the backend's
 * scratch. */
static int cpu_blas_gemm(regc_backend *be, const regc_gemm *g)
{
    const float *a = g->a, *b = g->b;
    int64_t lda = g->lda, ldb = g->ldb;
    if (g->bf16) {
        const int64_t a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
        const int64_t b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
        float *copy = regc_cpu_get_scratch(be, (size_t)(a_rows * a_cols + b_rows * b_cols) *
                                                   sizeof(float)); /* A, then B */
        if (!copy)
            return REGC_ERR_MEMORY;
        cpu_round_copy(be, copy, g->a, a_rows, a_cols, g->lda);
        cpu_round_copy(be, copy + a_rows * a_cols, g->b, b_rows, b_cols, g->ldb);
        a = copy, lda = a_cols;
        b = copy + a_rows * a_cols, ldb = b_cols;
    }
    const CBLAS_TRANSPOSE ta = g->trans_a ? CblasTrans : CblasNoTrans,
                          tb = g->trans_b ? CblasTrans : CblasNoTrans;
    const float beta = g->accumulate ? 1.0f : 0.0f;
    const int by_cols = g->n >= g->m;
    const double madds = (double)g->m * (double)g->n * (double)g->k;
    const int threads = regc_cpu_threads(be),
              parallel = madds >= (double)REGC_CPU_GEMM_PAR_MIN * (double)regc_cpu_par_scale(be);
    const int default_team = omp_get_max_threads();
    omp_set_num_threads(1); /* each block's call on one thread: the team inherits it */
#pragma omp parallel num_threads(threads) if (parallel)
    {
        int64_t lo, hi; /* this thread's blocks: whole ones, at multiples of the block */
        regc_cpu_team_range(by_cols ? g->n : g->m, CPU_BLAS_BLOCK, &lo, &hi);
        for (int64_t x0 = lo; x0 < hi; x0 += CPU_BLAS_BLOCK) {
            const int64_t len = hi - x0 < CPU_BLAS_BLOCK ? hi - x0 : CPU_BLAS_BLOCK;
            if (by_cols) /* C[:, x0 .. x0+len) = op(A) op(B)[:, x0 .. x0+len) */
                cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)len, (int)g->k, g->alpha, a,
                            (int)lda, g->trans_b ? b + x0 * ldb : b + x0, (int)ldb, beta, g->c + x0,
                            (int)g->ldc);
            else /* C[x0 .. x0+len, :) = op(A)[x0 .. x0+len, :) op(B) */
                cblas_sgemm(CblasRowMajor, ta, tb, (int)len, (int)g->n, (int)g->k, g->alpha,
                            g->trans_a ? a + x0 : a + x0 * lda, (int)lda, b, (int)ldb, beta,
                            g->c + x0 * g->ldc, (int)g->ldc);
        }
    }
    omp_set_num_threads(default_team);
    return REGC_OK;
}

/* C = G * gelu'(aux) and bias_grad = its column sums in one pass: each
 * thread runs down the rows over its own columns, a chunk at a time, so a
 * chunk of C is summed while still in cache, in the same order (double, row
 * by row) as the separate dgelu and sum_rows kernels, giving the same bits. */
REGC_CPU_WIDE_VECTORS static void cpu_dgelu_bgrad(const regc_backend *be, const regc_gemm *g,
                                                  const regc_gemm *out16)
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
                    c[j] = regc_gelu_dx(c[j], aux[j]);
                    acc[j] += c[j];
                }
                if (out16) /* C held in bf16: the chunk rounded while in cache */
                    regc_cpu_store_bf16((uint16_t *)out16->c + i * out16->ldc + c0, c, w);
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
            c[j] = regc_addf(c[j], bias[j]);
        break;
    case REGC_EPI_GELU:
        for (int64_t j = 0; j < len; j++)
            c[j] = regc_gelu(c[j]);
        break;
    case REGC_EPI_GELU_AUX:
        for (int64_t j = 0; j < len; j++) {
            aux[j] = c[j];
            c[j] = regc_gelu(c[j]);
        }
        break;
    case REGC_EPI_BIAS_GELU_AUX:
        for (int64_t j = 0; j < len; j++) {
            float pre = regc_addf(c[j], bias[j]);
            aux[j] = pre;
            c[j] = regc_gelu(pre);
        }
        break;
    case REGC_EPI_DGELU:
        for (int64_t j = 0; j < len; j++)
            c[j] = regc_gelu_dx(c[j], aux[j]);
        break;
    default: break;
    }
}

/* C = epilogue(C) row by row; C already holds G. With out16 each row is
 * then rounded into the C held in bf16. */
static void cpu_apply_epilogue(const regc_backend *be, const regc_gemm *g, const regc_gemm *out16)
{
    const int threads = regc_cpu_threads(be);
    const int64_t m = g->m, n = g->n;
    const regc_epilogue e = g->epilogue;
    if (e == REGC_EPI_DGELU_BGRAD) {
        cpu_dgelu_bgrad(be, g, out16);
        return;
    }
    if (e == REGC_EPI_NONE || e == REGC_EPI_BGRAD) {
        if (!out16)
            return;
#pragma omp parallel for num_threads(threads) if (m * n >= regc_cpu_par_min(be)) schedule(static)
        for (int64_t i = 0; i < m; i++)
            regc_cpu_store_bf16((uint16_t *)out16->c + i * out16->ldc, g->c + i * g->ldc, n);
        return;
    }
#pragma omp parallel for num_threads(threads) if (m * n >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t i = 0; i < m; i++) {
        regc_cpu_apply_epilogue_span(g, i, 0, n);
        if (out16)
            regc_cpu_store_bf16((uint16_t *)out16->c + i * out16->ldc, g->c + i * g->ldc, n);
    }
}

/* ---------------------------------------------------------------- operands held in bf16 */

/* dst[n] = the n values of an NF4 blob, dequantised (nf4_format.h), a range
 * of blocks per thread. */
static void cpu_dequant_copy(const regc_backend *be, float *dst, const uint8_t *blob, int64_t n)
{
    static const float levels[16] = REGC_NF4_LEVELS;
    static const float dynamic_map[256] = REGC_NF4_DYNAMIC_MAP;
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    const int64_t blocks = l.blocks;
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= regc_cpu_par_min(be))
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t e0 = b * REGC_NF4_BLOCK,
                      len = n - e0 < REGC_NF4_BLOCK ? n - e0 : REGC_NF4_BLOCK;
        regc_nf4_read(blob, &l, levels, dynamic_map, e0, len, dst + e0, 1);
    }
}

/* dst [rows, cols] (contiguous) = x [rows, cols] (row stride ld) held in
 * bf16, widened to fp32: exact */
static void cpu_widen_copy(const regc_backend *be, float *dst, const uint16_t *x, int64_t rows,
                           int64_t cols, int64_t ld)
{
#pragma omp parallel for num_threads(                                                              \
    regc_cpu_threads(be)) if (rows * cols >= regc_cpu_par_min(be)) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[i * cols + j] = regc_bf16_value(x[i * ld + j]);
}

/* ---- the kernels, chosen at run time ----
 * Each entry names the kernels of the fp32 and the bf16 GEMM (NULL:
 * OpenBLAS) and the CPUID features they need, best first. The choice is
 * the process's, as the processor is: the first entry this CPU runs,
 * unless REGC_CPU_GEMM names another when the first backend is made, or
 * regc_backend_cpu_use_gemm does (tests and benchmarks that compare the
 * kernels). */
typedef enum { NEEDS_NOTHING, NEEDS_AVX2, NEEDS_AVX512, NEEDS_AVX512_BF16 } cpu_gemm_needs;

typedef struct {
    const char *name;
    const regc_cpu_gemm_kernel *fp32, *bf16;
    cpu_gemm_needs needs;
} cpu_gemm_choice;

static const cpu_gemm_choice cpu_gemm_choices[] = {
#ifdef REGC_CPU_OWN_SGEMM
    {"avx512-bf16", &regc_cpu_sgemm_avx512, &regc_cpu_bgemm_avx512bf16, NEEDS_AVX512_BF16},
    {"avx512", &regc_cpu_sgemm_avx512, &regc_cpu_sgemm_avx512, NEEDS_AVX512},
    {"avx2", &regc_cpu_sgemm_avx2, &regc_cpu_sgemm_avx2, NEEDS_AVX2},
#endif
    {"openblas", NULL, NULL, NEEDS_NOTHING},
};
#define CPU_GEMM_CHOICES ((int)(sizeof cpu_gemm_choices / sizeof cpu_gemm_choices[0]))

static const cpu_gemm_choice *cpu_gemm_chosen; /* NULL until the first backend */

/* Whether this CPU (and its operating system, which must save the wider
 * registers: GCC's CPUID check asks it) runs choice c. */
static int cpu_gemm_runs(const cpu_gemm_choice *c)
{
    if (c->needs == NEEDS_NOTHING)
        return 1;
#ifdef REGC_CPU_OWN_SGEMM
    __builtin_cpu_init();
    /* the AVX-512 kernel packs op(A) with AVX2's instructions, which every
     * AVX-512 CPU has; asked all the same */
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
    switch (c->needs) {
    case NEEDS_AVX512_BF16: return avx512 && __builtin_cpu_supports("avx512bf16");
    case NEEDS_AVX512: return avx512;
    case NEEDS_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: break;
    }
#endif
    return 0;
}

static const cpu_gemm_choice *cpu_gemm_find(const char *name)
{
    for (int i = 0; i < CPU_GEMM_CHOICES; i++)
        if (!strcmp(cpu_gemm_choices[i].name, name))
            return &cpu_gemm_choices[i];
    return NULL;
}

/* The names, for messages: "avx512-bf16, avx512, avx2, openblas" */
static const char *cpu_gemm_names(void)
{
    static char list[128];
    if (!list[0])
        for (int i = 0; i < CPU_GEMM_CHOICES; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     cpu_gemm_choices[i].name);
    return list;
}

const char *regc_backend_cpu_gemm_at(int i)
{
    return i >= 0 && i < CPU_GEMM_CHOICES ? cpu_gemm_choices[i].name : NULL;
}

int regc_backend_cpu_gemm_runs(const char *name)
{
    const cpu_gemm_choice *c = name ? cpu_gemm_find(name) : NULL;
    return c && cpu_gemm_runs(c);
}

int regc_backend_cpu_use_gemm(const char *name)
{
    if (!name) {
        for (int i = 0; i < CPU_GEMM_CHOICES; i++)
            if (cpu_gemm_runs(&cpu_gemm_choices[i])) {
                cpu_gemm_chosen = &cpu_gemm_choices[i];
                break;
            }
        return REGC_OK;
    }
    const cpu_gemm_choice *c = cpu_gemm_find(name);
    if (!c)
        return regc_error(REGC_ERR_ARG, "cpu GEMM \"%s\": not one of %s", name, cpu_gemm_names());
    if (!cpu_gemm_runs(c))
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "cpu GEMM \"%s\": this CPU lacks the instructions it needs", name);
    cpu_gemm_chosen = c;
    return REGC_OK;
}

int regc_cpu_choose_gemm(void)
{
    if (cpu_gemm_chosen)
        return REGC_OK;
    const char *name = getenv("REGC_CPU_GEMM");
    if (name && name[0]) {
        const int status = regc_backend_cpu_use_gemm(name);
        if (status != REGC_OK)
            regc_error_prefix("REGC_CPU_GEMM");
        return status;
    }
    return regc_backend_cpu_use_gemm(NULL);
}

const char *regc_backend_cpu_gemm_name(void)
{
    if (!cpu_gemm_chosen && regc_cpu_choose_gemm() != REGC_OK)
        regc_backend_cpu_use_gemm(NULL); /* a bad REGC_CPU_GEMM fails the backend, not this */
    return cpu_gemm_chosen->name;
}

/* The kernel that runs g, NULL for OpenBLAS. */
static const regc_cpu_gemm_kernel *cpu_gemm_kernel_for(const regc_gemm *g)
{
    if (!cpu_gemm_chosen)
        regc_backend_cpu_use_gemm(NULL);
    return g->bf16 ? cpu_gemm_chosen->bf16 : cpu_gemm_chosen->fp32;
}

/* w: the descriptor the kernels run for g, over fp32 views where they need
 * them (this file's header); *out16: g where C is held in bf16, else NULL. */
static int cpu_gemm_views(regc_backend *be, const regc_gemm *g, regc_gemm *w,
                          const regc_gemm **out16)
{
    *w = *g;
    *out16 = NULL;
    if (!g->a_bf16 && !g->b_bf16 && !g->c_bf16 && !g->b_nf4)
        return REGC_OK;
    const regc_cpu_gemm_kernel *kern = cpu_gemm_kernel_for(g);
    const int reads = kern && kern->reads_bf16;
    const int widen_a = g->a_bf16 && !reads,
              widen_b = g->b_bf16 && (!reads || g->epilogue == REGC_EPI_BGRAD);
    /* regc's kernels dequantise NF4 as they pack; OpenBLAS and BGRAD's
     * sums read a whole fp32 B */
    const int dequant_b = g->b_nf4 && (!kern || g->epilogue == REGC_EPI_BGRAD);
    const int64_t a_rows = g->trans_a ? g->k : g->m, a_cols = g->trans_a ? g->m : g->k;
    const int64_t b_rows = g->trans_b ? g->n : g->k, b_cols = g->trans_b ? g->k : g->n;
    const int64_t floats = (g->c_bf16 ? g->m * g->n : 0) + (widen_a ? a_rows * a_cols : 0) +
                           (widen_b || dequant_b ? b_rows * b_cols : 0);
    float *s = regc_cpu_get_gemm_scratch(be, (size_t)(floats + 1) * sizeof(float));
    if (!s)
        return REGC_ERR_MEMORY;
    if (g->c_bf16) {
        w->c = s, w->ldc = g->n > 0 ? g->n : 1, w->c_bf16 = 0;
        *out16 = g;
        s += g->m * g->n;
    }
    if (widen_a) {
        cpu_widen_copy(be, s, (const uint16_t *)g->a, a_rows, a_cols, g->lda);
        w->a = s, w->lda = a_cols > 0 ? a_cols : 1, w->a_bf16 = 0;
        s += a_rows * a_cols;
    }
    if (widen_b) {
        cpu_widen_copy(be, s, (const uint16_t *)g->b, b_rows, b_cols, g->ldb);
        w->b = s, w->ldb = b_cols > 0 ? b_cols : 1, w->b_bf16 = 0;
    }
    if (dequant_b) {
        cpu_dequant_copy(be, s, (const uint8_t *)g->b, b_rows * b_cols);
        w->b = s, w->b_nf4 = 0;
    }
    return REGC_OK;
}

int regc_cpu_run_gemm(regc_backend *be, const regc_gemm *g_in)
{
    if (!g_in)
        return regc_error(REGC_ERR_ARG, "gemm: NULL descriptor");
    int status = cpu_check_gemm(g_in);
    if (status != REGC_OK)
        return status;
    regc_gemm view;
    const regc_gemm *g = &view, *out16;
    if ((status = cpu_gemm_views(be, g_in, &view, &out16)) != REGC_OK)
        return status;
    if (g->epilogue == REGC_EPI_BGRAD)
        cpu_bgrad_of_b(be, g);

    int epilogue_done = 0;
    if (g->m > 0 && g->n > 0) {
        const regc_cpu_gemm_kernel *kern = cpu_gemm_kernel_for(g);
        if (g->k > 0 && kern) {
            /* DGELU_BGRAD's C is rounded after its epilogue, below */
            const regc_gemm *tiles16 = g->epilogue == REGC_EPI_DGELU_BGRAD ? NULL : out16;
            status = regc_cpu_gemm_blocked(be, g, kern, tiles16);
            if (status != REGC_OK)
                return status;
            /* the elementwise epilogues were applied on each tile */
            epilogue_done = g->epilogue != REGC_EPI_DGELU_BGRAD;
        } else if (g->k > 0) {
            status = cpu_blas_gemm(be, g);
            if (status != REGC_OK)
                return status;
        } else if (!g->accumulate) {
            /* an empty product is zero; BLAS implementations disagree on k = 0 */
            for (int64_t i = 0; i < g->m; i++)
                memset(g->c + i * g->ldc, 0, (size_t)g->n * sizeof(float));
        }
    }
    if (!epilogue_done)
        cpu_apply_epilogue(be, g, out16);
    return REGC_OK;
}
