/* cpu_kernels.h — private to the CPU backend: its state, the helpers its
 * files share and the kernel entry points each file provides. */
#ifndef REGC_CPU_KERNELS_H
#define REGC_CPU_KERNELS_H

#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernel_math.h" /* the per-element math, shared with the CUDA backend */
#include "regc_backend.h"

typedef struct {
    int threads;            /* every parallel region uses exactly this many */
    int fit_team;           /* raise the thresholds of going parallel while cores are shared */
    double team_checked_ms; /* when it last looked */
    int64_t par_scale;      /* 1, or REGC_CPU_CONTENDED_SCALE while cores are shared */
    int status;             /* first failure of a void kernel, reported by sync() */
    /* reused between calls so hot kernels never malloc: the kernels' own,
     * and the GEMM's fp32 views of operands held in bf16, which live while
     * the GEMM's kernel takes the first for its packing */
    void *scratch[2];
    size_t scratch_bytes[2];
} regc_cpu_ctx;

/* Below this many elements a loop stays on one thread: waking the team
 * costs more than the loop. Where other processes keep cores busy, waking
 * a thread can cost a time slice, and only loops REGC_CPU_CONTENDED_SCALE
 * times larger go parallel (cpu_team.c; regc_cpu_par_min). */
#define REGC_CPU_PAR_MIN 32768
#define REGC_CPU_CONTENDED_SCALE 128

/* Reductions over rows (column sums) run each column down the rows in
 * order, in double, whatever the split: threads own disjoint column ranges,
 * so the sums are race-free and their bits do not depend on the thread
 * count. A thread walks its range a chunk of columns at a time, each row's
 * chunk one contiguous run the hardware prefetcher follows (narrow blocks
 * jump a whole row stride, a new page, every few cache lines). */
#define REGC_CPU_COL_CHUNK 512

/* Column block of embedding_bwd's scatter-add, whose threads own whole
 * blocks for the same reason. */
#define REGC_CPU_COL_BLOCK 64

/* [*lo, *hi): the share of [0, size) the calling thread of the current team
 * owns, an even split in whole units of `unit`. */
static inline void regc_cpu_team_range(int64_t size, int64_t unit, int64_t *lo, int64_t *hi)
{
    const int64_t units = (size + unit - 1) / unit;
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t a = units * t / nt * unit, b = units * (t + 1) / nt * unit;
    *lo = a < size ? a : size;
    *hi = b < size ? b : size;
}

/* [*lo, *hi): the columns of cols the calling thread owns, in whole cache
 * lines (16 floats). */
static inline void regc_cpu_team_columns(int64_t cols, int64_t *lo, int64_t *hi)
{
    regc_cpu_team_range(cols, 16, lo, hi);
}

/* Below this many multiply-adds (times regc_cpu_par_scale) one thread does
 * a whole GEMM of regc's own. */
#define REGC_CPU_GEMM_PAR_MIN (1 << 18)

/* Before a program run: the thresholds fitted to the free cores (cpu_team.c). */
void regc_cpu_fit_team(regc_backend *be);
/* Are fewer than `threads` of `cores` free, with `running` runnable tasks on
 * the machine of which `own_running` are this process's? */
int regc_cpu_cores_contended(int cores, int running, int own_running, int threads);

/* What the thresholds of going parallel are multiplied by now (cpu_team.c). */
static inline int64_t regc_cpu_par_scale(const regc_backend *be)
{
    return ((const regc_cpu_ctx *)be->ctx)->par_scale;
}

/* The smallest loop worth the team now (REGC_CPU_PAR_MIN, scaled). */
static inline int64_t regc_cpu_par_min(const regc_backend *be)
{
    return REGC_CPU_PAR_MIN * regc_cpu_par_scale(be);
}

static inline int regc_cpu_threads(const regc_backend *be)
{
    return ((const regc_cpu_ctx *)be->ctx)->threads;
}

/* Record the first failure of a kernel that cannot return one (the message
 * is set by the caller through regc_error); sync() returns it. */
void regc_cpu_set_failure(regc_backend *be, int status);
/* A buffer of at least `bytes` owned by the backend, valid until the next
 * call; NULL (failure recorded) when it cannot grow. */
void *regc_cpu_get_scratch(regc_backend *be, size_t bytes);
/* The same, a second buffer: the GEMM's fp32 views of bf16 operands. */
void *regc_cpu_get_gemm_scratch(regc_backend *be, size_t bytes);

/* Marks a loop nest bound by vector arithmetic rather than memory (the exp
 * in GELU and the cross-entropy, attention's row products): GCC keeps to
 * 256-bit vectors under -march=native, and where the CPU has AVX-512 these
 * loops run 1.3 to 2 times faster in 512-bit ones. In a build for no
 * particular x86-64 CPU (REGC_NATIVE=OFF: one binary for all), GCC builds
 * each such function three times, for AVX-512, for AVX2 and for the
 * baseline, and the loader picks one by CPUID (target_clones), as the GEMM
 * kernels are picked (cpu_gemm.c). Every lane computes the same operations
 * whatever the vectors (no contraction, no reassociation), so only the
 * speed changes. */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define REGC_CPU_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))
#elif !defined(__AVX2__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REGC_CPU_WIDE_VECTORS                                                                      \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define REGC_CPU_WIDE_VECTORS
#endif

/* dst[j] = src[j] in bf16 (regc_bf16_bits) for j < n: a row of a GEMM's C
 * held in bf16, rounded from its fp32 view */
static inline void regc_cpu_store_bf16(uint16_t *restrict dst, const float *restrict src, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        dst[j] = regc_bf16_bits(src[j]);
}

/* out[c] = sum over r < rows of x[r * ld + c]   (x: [rows, ld], out: [cols]) */
void regc_cpu_sum_columns(const regc_backend *be, float *out, const float *x, int64_t ld,
                          int64_t rows, int64_t cols);

/* regc's own GEMMs (cpu_sgemm.c's blocking and threading, a micro-kernel
 * per instruction set) are built side by side on x86-64 with GCC, each
 * file for its own instructions, and one is chosen by CPUID when the
 * first CPU backend is made (cpu_gemm.c): AVX-512 with its BF16 pair
 * products, AVX-512, AVX2 with FMA, or else OpenBLAS. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define REGC_CPU_OWN_SGEMM 1

/* The largest register tile of regc's own GEMMs, in floats of C: AVX-512's
 * 12 x 32 (AVX2's is 6 x 16). */
#define REGC_CPU_GEMM_TILE_MAX (12 * 32)

/* What a GEMM kernel supplies to the blocking, packing and threading of
 * cpu_sgemm.c (regc_cpu_gemm_blocked): the kernels differ in the tile, the
 * packed format and the micro-kernel. */
typedef struct {
    const char *name;   /* as regc version prints it */
    int mr, nr;         /* the register tile: mr rows by nr columns of C */
    int64_t kc;         /* the slice of k one packed panel holds */
    int64_t k_unit;     /* packed panels hold kc rounded up to a multiple of this */
    size_t value_bytes; /* one packed value */
    int reads_bf16;     /* packs operands held in bf16 (a_bf16, b_bf16) as they are */
    /* op(A)[i0 .. i0+mc, p0 .. p0+kc] as panels of mr rows (zeros past
     * the matrix edge), each panel k_unit-rounded kc x mr values; with
     * g->bf16 each value rounded by regc_round_bf16 */
    void (*pack_a)(void *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc, int64_t p0,
                   int64_t kc);
    /* op(B)[p0 .. p0+kc, j0 .. j0+nc] as panels of nr columns, likewise */
    void (*pack_b)(void *restrict dst, const regc_gemm *g, int64_t j0, int64_t nc, int64_t p0,
                   int64_t kc);
    /* t[r * nr + c] = sum over p < kc of a[p][r] b[p][c], one panel of
     * each; t: [mr][nr], 64-byte aligned */
    void (*product)(float *restrict t, int64_t kc, const void *restrict a, const void *restrict b);
    /* where not NULL, product's sums written straight into a whole mr x nr
     * tile of C at c (row stride ldc): C = t, or C + t when `add` (the
     * values of product and then sgemm_store_tile at alpha = 1) */
    void (*product_c)(float *restrict c, int64_t ldc, int add, int64_t kc, const void *restrict a,
                      const void *restrict b);
} regc_cpu_gemm_kernel;

/* The kernels (cpu_sgemm_avx512.c, cpu_sgemm_avx2.c, cpu_bgemm.c): fp32
 * GEMMs, whose bf16 GEMMs (g->bf16) round each value as it is packed (a
 * product of two bf16 values is exact in fp32, so the fused multiply-adds
 * give the products of the rounded operands summed in fp32), and the bf16
 * GEMM in AVX-512 BF16's pair products. */
extern const regc_cpu_gemm_kernel regc_cpu_sgemm_avx512;
extern const regc_cpu_gemm_kernel regc_cpu_sgemm_avx2;
extern const regc_cpu_gemm_kernel regc_cpu_bgemm_avx512bf16;

/* The GEMM the process's CPU backends run, chosen once (cpu_gemm.c): by
 * REGC_CPU_GEMM where set, else the best this CPU runs. REGC_OK, or the
 * status of a REGC_CPU_GEMM that names no GEMM or one this CPU cannot run,
 * with the message. */
int regc_cpu_choose_gemm(void);

/* C = alpha op(A) op(B) (+ C when g->accumulate) by `kernel`, then the
 * elementwise epilogue (all but DGELU_BGRAD's column sums and BGRAD's) on
 * each tile as it is finished, packing in the backend's scratch; k > 0.
 * out16, when not NULL, is where C is held in bf16 (cpu_gemm.c's c_bf16):
 * g->c is then its fp32 view, and each tile of the last slice is rounded
 * into out16->c after its epilogue, while in L1. g's operands are fp32, or
 * bf16 where the kernel reads_bf16. REGC_OK, or REGC_ERR_MEMORY when the
 * scratch cannot grow. */
int regc_cpu_gemm_blocked(regc_backend *be, const regc_gemm *g, const regc_cpu_gemm_kernel *kernel,
                          const regc_gemm *out16);

/* Element `at` of an operand as a GEMM reads it: held in bf16, widened
 * (exact, and what rounding would give); fp32, rounded to bf16 for a bf16
 * GEMM, else itself. */
static inline float regc_cpu_gemm_value(const regc_gemm *g, const void *base, int bf16, int64_t at)
{
    if (bf16)
        return regc_bf16_value(((const uint16_t *)base)[at]);
    const float x = ((const float *)base)[at];
    return g->bf16 ? regc_round_bf16(x) : x;
}

/* op(A)[i0 .. i0+mc, p0 .. p0+kc] as fp32 panels of mr rows, each
 * [kc][mr]: dst[panel * kc * mr + p * mr + r] = op(A)[i0 + panel * mr + r,
 * p0 + p], zeros past the edge, rounded to bf16 for a bf16 GEMM; A held in
 * fp32, or in bf16 (g->a_bf16). Scalar, and inlined into each kernel's
 * file: A is packed once per block of B, a small share of the work. */
static inline void regc_cpu_pack_a_fp32(float *restrict dst, const regc_gemm *g, int64_t i0,
                                        int64_t mc, int64_t p0, int64_t kc, int mr)
{
    for (int64_t ir = 0; ir < mc; ir += mr) {
        const int rows = mc - ir < mr ? (int)(mc - ir) : mr;
        float *restrict d = dst + ir * kc; /* [kc][mr] */
        if (g->trans_a) {                  /* A is [k, m]: a panel's mr values are contiguous */
            for (int64_t p = 0; p < kc; p++) {
                const int64_t at = (p0 + p) * g->lda + i0 + ir; /* [rows] values from here */
                int r = 0;
                for (; r < rows; r++)
                    d[p * mr + r] = regc_cpu_gemm_value(g, g->a, g->a_bf16, at + r);
                for (; r < mr; r++)
                    d[p * mr + r] = 0.0f;
            }
        } else { /* A is [m, k]: each row is contiguous */
            for (int r = 0; r < rows; r++) {
                const int64_t at = (i0 + ir + r) * g->lda + p0; /* [kc] values from here */
                for (int64_t p = 0; p < kc; p++)
                    d[p * mr + r] = regc_cpu_gemm_value(g, g->a, g->a_bf16, at + p);
            }
            for (int r = rows; r < mr; r++)
                for (int64_t p = 0; p < kc; p++)
                    d[p * mr + r] = 0.0f;
        }
    }
}

/* regc_cpu_pack_a_fp32, the same values, in AVX2's registers eight at a
 * time for mr = 6 or 12 (cpu_sgemm_avx2.c; the AVX2 and AVX-512 kernels'
 * tiles); only on a CPU with AVX2. */
void regc_cpu_avx2_pack_a(float *restrict dst, const regc_gemm *g, int64_t i0, int64_t mc,
                          int64_t p0, int64_t kc, int mr);
#endif
/* The elementwise epilogue (BIAS, GELU, GELU_AUX, BIAS_GELU_AUX, DGELU) on
 * C[i, j0 .. j0+len) and aux, C holding G; other kinds leave C as it is. */
void regc_cpu_apply_epilogue_span(const regc_gemm *g, int64_t i, int64_t j0, int64_t len);

/* ---- kernel entry points (signatures as in struct regc_backend) ---- */
int regc_cpu_run_gemm(regc_backend *be, const regc_gemm *g);

void regc_cpu_fill_floats(regc_backend *be, float *dst, size_t n, float value);
void regc_cpu_copy_rows(regc_backend *be, float *dst, int64_t ld_dst, const float *src,
                        int64_t ld_src, int64_t rows, int64_t cols);
void regc_cpu_transpose_tensor(regc_backend *be, float *out, const float *x, int ndim,
                               const int64_t *shape, const int *perm);
void regc_cpu_embedding_fwd(regc_backend *be, float *out, const int32_t *ids, const float *table,
                            int64_t rows, int64_t cols, int table_bf16);
void regc_cpu_embedding_bwd(regc_backend *be, float *dtable, const int32_t *ids, const float *dout,
                            int64_t rows, int64_t cols, int64_t vocab, int accumulate, int64_t pad);
void regc_cpu_add_arrays(regc_backend *be, float *out, const float *a, const float *b, int64_t n);
void regc_cpu_add_bias(regc_backend *be, float *out, const float *x, const float *b, int64_t rows,
                       int64_t cols);
void regc_cpu_sum_rows(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols);
void regc_cpu_row_sum(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols,
                      int mean);
void regc_cpu_softmax_fwd(regc_backend *be, float *y, float *lse, const float *x, int64_t rows,
                          int64_t cols, int log);
void regc_cpu_gelu_fwd(regc_backend *be, float *y, const float *x, int64_t n);
void regc_cpu_gelu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);

void regc_cpu_layernorm_fwd(regc_backend *be, void *y, float *mean, float *rstd, const float *x,
                            const float *w, const float *b, int64_t rows, int64_t cols, float eps,
                            int y_bf16);
void regc_cpu_layernorm_bwd(regc_backend *be, float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, const float *mean, const float *rstd,
                            int64_t rows, int64_t cols);

void regc_cpu_attention_fwd(regc_backend *be, float *out, float *lse, const float *q,
                            const float *k, const float *v, const float *bias,
                            const regc_attn_shape *s);
void regc_cpu_attention_bwd(regc_backend *be, float *dq, float *dk, float *dv, float *dbias,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *bias, const float *out, const float *lse,
                            const regc_attn_shape *s);

void regc_cpu_rmsnorm_fwd(regc_backend *be, void *y, float *rstd, const float *x, const float *w,
                          int64_t rows, int64_t cols, float eps, int y_bf16);
void regc_cpu_rmsnorm_bwd(regc_backend *be, float *dx, float *dw, const float *dy, const float *x,
                          const float *w, const float *rstd, int64_t rows, int64_t cols);
void regc_cpu_rope(regc_backend *be, float *y, const float *x, const float *cos, const float *sin,
                   int64_t batch, int64_t t, int n_head, int head_dim, int rot_dim, int inverse,
                   int y_bf16);
void regc_cpu_silu_fwd(regc_backend *be, float *y, const float *x, int64_t n);
void regc_cpu_silu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);
void regc_cpu_mul_arrays(regc_backend *be, float *out, const float *a, const float *b, int64_t n);
void regc_cpu_gelu_erf_fwd(regc_backend *be, float *y, const float *x, int64_t n);
void regc_cpu_gelu_erf_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);
void regc_cpu_relu_fwd(regc_backend *be, float *y, const float *x, int64_t n);
void regc_cpu_relu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);
void regc_cpu_scale(regc_backend *be, float *y, const float *x, float value, int64_t n);
void regc_cpu_dropout(regc_backend *be, float *y, const float *x, const int32_t *site,
                      const int32_t *draw, float p, int64_t n);

void regc_cpu_elementwise(regc_backend *be, const regc_ew_program *p, int64_t n, float *const *out,
                          const float *const *in, unsigned out_bf16, unsigned in_bf16);
void regc_cpu_add_layernorm_fwd(regc_backend *be, float *sum, void *y, float *mean, float *rstd,
                                const float *a, const float *b, const float *w, const float *bias,
                                int64_t rows, int64_t cols, float eps, int y_bf16);
void regc_cpu_add_rmsnorm_fwd(regc_backend *be, float *sum, void *y, float *rstd, const float *a,
                              const float *b, const float *w, int64_t rows, int64_t cols, float eps,
                              int y_bf16);
void regc_cpu_layernorm_bwd_add(regc_backend *be, float *dx, float *dw, float *db,
                                const float *dres, const float *dy, const float *x, const float *w,
                                const float *mean, const float *rstd, int64_t rows, int64_t cols);
void regc_cpu_rmsnorm_bwd_add(regc_backend *be, float *dx, float *dw, const float *dres,
                              const float *dy, const float *x, const float *w, const float *rstd,
                              int64_t rows, int64_t cols);

void regc_cpu_cross_entropy_fwd(regc_backend *be, float *loss, float *lse, const float *logits,
                                const int32_t *targets, int64_t rows, int64_t cols);
void regc_cpu_cross_entropy_bwd(regc_backend *be, void *dlogits, const float *dloss,
                                const float *logits, const int32_t *targets, const float *lse,
                                int64_t rows, int64_t cols, int64_t row0, int64_t all_rows,
                                int dlogits_bf16);
void regc_cpu_cross_entropy_rows(regc_backend *be, float *lse, float *picked, const float *logits,
                                 const int32_t *targets, int64_t rows, int64_t cols);
void regc_cpu_cross_entropy_loss(regc_backend *be, float *loss, const float *lse,
                                 const float *picked, const int32_t *targets, int64_t rows,
                                 int64_t cols);

void regc_cpu_step_schedule(regc_backend *be, regc_step_scalars *s);
void regc_cpu_grad_sumsq(regc_backend *be, const float *g, int64_t n, regc_step_scalars *s);
void regc_cpu_grad_clip(regc_backend *be, regc_step_scalars *s);
void regc_cpu_adamw(regc_backend *be, float *param, const float *grad, float *m, float *v,
                    int64_t n, const regc_step_scalars *s, int decay);

#endif
