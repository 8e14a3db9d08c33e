/* regc_backend.h — the backend interface: memory, copies and one entry per
 * kernel, as a struct of function pointers (cpu/ and cuda/ implement it).
 *
 * Contract (the same for every backend):
 * - Kernel calls are ordered and may be asynchronous; pointers are device
 *   pointers from alloc(). The host reads device memory only through
 *   copy_d2h followed by sync(). The CPU backend runs synchronously.
 * - Matrices are row-major. Every kernel overwrites its outputs, except
 *   gemm with accumulate = 1 (C += ...).
 * - fp32 throughout on the CPU; a backend that lacks a kernel leaves its
 *   pointer NULL and the runtime reports which one is missing.
 * Kernels know nothing of graphs: shapes arrive as plain integers. */
#ifndef REGC_BACKEND_H
#define REGC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA module's .cu files include it */
extern "C" {
#endif

/* GEMM epilogues, mirroring cuBLASLt's so the CUDA backend maps each one to
 * one cuBLASLt epilogue. Let G = alpha * op(A) op(B) (+ C if accumulate).
 *   NONE            C = G
 *   BIAS            C = G + bias[n]
 *   GELU            C = gelu(G)
 *   GELU_AUX        aux = G;            C = gelu(aux)
 *   BIAS_GELU_AUX   aux = G + bias[n];  C = gelu(aux)
 *   DGELU           C = G * gelu'(aux)                      (aux as saved)
 *   DGELU_BGRAD     C = G * gelu'(aux); bias_grad[n] = sum over rows of C
 *   BGRAD           C = G;              bias_grad[n] = sum over k of op(B)[k, n]
 * gelu is the tanh form (GPT-2's gelu_new). */
typedef enum {
    REGC_EPI_NONE,
    REGC_EPI_BIAS,
    REGC_EPI_GELU,
    REGC_EPI_GELU_AUX,
    REGC_EPI_BIAS_GELU_AUX,
    REGC_EPI_DGELU,
    REGC_EPI_DGELU_BGRAD,
    REGC_EPI_BGRAD,
} regc_epilogue;

/* The epilogue's name, as above ("?" for none of them). */
static inline const char *regc_epilogue_name(regc_epilogue e)
{
    switch (e) {
    case REGC_EPI_NONE: return "NONE";
    case REGC_EPI_BIAS: return "BIAS";
    case REGC_EPI_GELU: return "GELU";
    case REGC_EPI_GELU_AUX: return "GELU_AUX";
    case REGC_EPI_BIAS_GELU_AUX: return "BIAS_GELU_AUX";
    case REGC_EPI_DGELU: return "DGELU";
    case REGC_EPI_DGELU_BGRAD: return "DGELU_BGRAD";
    case REGC_EPI_BGRAD: return "BGRAD";
    }
    return "?";
}

/* C[m, n] = op(A)[m, k] op(B)[k, n], op(X) = X or X^T; leading dimensions
 * are row strides of the matrices as stored (A is [k, m] when trans_a).
 * C and aux must not overlap A or B. */
typedef struct {
    int trans_a, trans_b;
    int64_t m, n, k;
    const float *a;
    int64_t lda;
    const float *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    float alpha;
    int accumulate; /* 1: C += G instead of C = G */
    regc_epilogue epilogue;
    const float *bias; /* [n], BIAS and BIAS_GELU_AUX */
    float *aux;        /* [m, n] with row stride ldaux, GELU_AUX/DGELU kinds */
    int64_t ldaux;
    float *bias_grad; /* [n] output, BGRAD and DGELU_BGRAD */
    /* 1: mixed precision (compile.precision "bf16"): op(A) and op(B) are
     * rounded to bfloat16 (to nearest, ties to even) as they are read, and
     * their products summed in fp32; C, the epilogue and aux stay fp32,
     * and BGRAD sums op(B) as rounded. The CPU uses AVX-512 BF16's pair
     * products where the build has them, which count bf16 values and sums
     * below 2^-126 in magnitude as zero */
    int bf16;
    /* with bf16, operands held in bf16 (regc_bf16_bits; a, b, c then point
     * at uint16_t values, their leading dimensions still in elements): A or
     * B is read as it is, and C is written rounded to bf16 after the
     * epilogue (not with accumulate). Each gives the bits the fp32 operand
     * would, rounded where the GEMM rounds it, in half the memory. */
    int a_bf16, b_bf16, c_bf16;
    /* 1: B is a frozen weight held in NF4 (nf4_format.h): b points at the
     * blob of B's k * n values as stored, which is contiguous (ldb = n, or
     * k when trans_b), and each value is dequantised as it is read, to
     * fp32 (then rounded to bf16 with bf16). Never with b_bf16. */
    int b_nf4;
} regc_gemm;

/* Multi-head attention over row-major [batch, t, heads * head_dim] tensors:
 * query head h reads key/value head h / (n_head / n_kv_head) (grouped-query
 * attention when n_kv_head < n_head). lse[batch, n_head, tq] is the
 * log-sum-exp of each row of scaled scores, saved so backward recomputes the
 * probabilities instead of storing T x T of them. */
typedef struct {
    int64_t batch, tq, tk;
    int n_head, n_kv_head, head_dim;
    int causal;  /* query i sees keys 0..i (requires tq == tk) */
    float scale; /* multiplies q.k, usually 1/sqrt(head_dim) */
    /* the operands held in bf16 (regc_bf16_bits; their pointers then point
     * to uint16_t), REGC_ATTN_*_BF16: each is read widened, exactly, and a
     * bf16 out is stored rounded; every other operand is fp32 */
    unsigned bf16;
    /* soft-capping (Gemma 2's attn_logit_softcapping): the scaled score x
     * becomes softcap tanh(x / softcap); 0: none (never with a bias) */
    float softcap;
    /* a sliding window (causal only): query i sees keys i - window + 1 ..
     * i, Transformers' sliding_window; 0: none */
    int64_t window;
    /* dropout on the probabilities (GPT-2's attn_pdrop): each kept with
     * chance 1 - dropout and scaled by 1 / (1 - dropout), else 0, drawn as
     * the dropout kernel draws at the element's index in the [batch, n_head,
     * tq, tk] probabilities (regc_attn_keep); drop_site [1] and drop_draw [4]
     * are the dropout kernel's device int32 operands, and drop_draw[3] == 0
     * (not training) draws nothing. 0: none. */
    float dropout;
    const int32_t *drop_site, *drop_draw;
    /* documents packed in a row (causal only): query i of batch row b sees
     * no key before doc_start[b * tq + i], the first position of its
     * document (device int32 [batch, tq], non-decreasing along a row, each
     * at most its own position); NULL: one document a row */
    const int32_t *doc_start;
} regc_attn_shape;

#define REGC_ATTN_Q_BF16 1u   /* q */
#define REGC_ATTN_K_BF16 2u   /* k */
#define REGC_ATTN_V_BF16 4u   /* v */
#define REGC_ATTN_OUT_BF16 8u /* the forward's out, which the backward reads */

/* A fused elementwise chain (the CPU form of a fused loop): a straight-line
 * program over per-element registers. Registers 0 .. n_inputs-1 hold the
 * inputs; step s writes register n_inputs + s. Input i is read at element
 * e as in[i][(e / inner[i]) % period[i]] (regc_ew_index; inner 0 or 1:
 * e itself, period 0: no wrap): a bias of C columns has period C, a row's
 * statistic ([rows] against [rows, C]) inner C. Each step computes exactly what the single kernel
 * of the same name computes for one element, in the same float operations, so a fused chain gives
 * bit-identical results to the kernels run one by one. */
#define REGC_EW_MAX_INPUTS 8
#define REGC_EW_MAX_STEPS 16
#define REGC_EW_MAX_OUTPUTS 4
/* The steps, one row each: id, name, the operands read (1: a; 2: a and
 * b), costly (its CPU loop goes parallel at an eighth of the usual size),
 * and the per-element formula over a, b and the step's value v — the
 * functions of kernels/kernel_math.h, so the column is expanded only
 * inside the backends. A backward step reads a = dy and b = x (or y). */
#define REGC_EW_OPS(X)                                                                             \
    X(ADD, "add", 2, 0, regc_addf(a, b))                                                           \
    X(MUL, "mul", 2, 0, regc_mulf(a, b))                                                           \
    X(SCALE, "scale", 1, 0, regc_scalef(v, a))                                                     \
    X(GELU, "gelu", 1, 1, regc_gelu(a)) /* the tanh form */                                        \
    X(GELU_BWD, "gelu_bwd", 2, 1, regc_gelu_dx(a, b))                                              \
    X(GELU_ERF, "gelu_erf", 1, 1, regc_gelu_erf(a))                                                \
    X(GELU_ERF_BWD, "gelu_erf_bwd", 2, 1, regc_gelu_erf_dx(a, b))                                  \
    X(SILU, "silu", 1, 1, regc_silu(a))                                                            \
    X(SILU_BWD, "silu_bwd", 2, 1, regc_silu_dx(a, b))                                              \
    X(RELU, "relu", 1, 0, regc_relu(a))                                                            \
    X(RELU_BWD, "relu_bwd", 2, 0, regc_relu_dx(a, b))                                              \
    X(SUB, "sub", 2, 0, regc_subf(a, b))                                                           \
    X(DIV, "div", 2, 0, regc_divf(a, b))                                                           \
    X(NEG, "neg", 1, 0, regc_negf(a))                                                              \
    X(ADD_SCALAR, "add_scalar", 1, 0, regc_add_scalarf(v, a))                                      \
    X(EXP, "exp", 1, 1, regc_expf(a))                                                              \
    X(TANH, "tanh", 1, 1, regc_tanhf(a))                                                           \
    X(TANH_BWD, "tanh_bwd", 2, 0, regc_tanh_dy(a, b)) /* b = y = tanh x */                         \
    X(RSQRT, "rsqrt", 1, 1, regc_rsqrtf(a))                                                        \
    X(POW, "pow", 1, 1, regc_powf(a, v))                                                           \
    X(MASKED_FILL, "masked_fill", 2, 0, regc_masked_fillf(v, a, b)) /* b = the mask */             \
    X(ROUND_BF16, "round_bf16", 1, 0, regc_round_bf16(a))           /* as a bf16 slot holds it */

typedef enum {
#define REGC_EW_ENUM(id, name, arity, costly, f) REGC_EW_##id,
    REGC_EW_OPS(REGC_EW_ENUM)
#undef REGC_EW_ENUM
        REGC_EW_COUNT
} regc_ew_op;

/* Functions the host and, compiled by nvcc, the GPU both call. */
#if defined(__CUDACC__)
#define REGC_HD __host__ __device__
#else
#define REGC_HD
#endif

/* Does an op read its second operand? */
static inline REGC_HD int regc_ew_binary(int op)
{
    switch (op) {
#define REGC_EW_CASE(id, name, arity, costly, f)                                                   \
    case REGC_EW_##id: return arity == 2;
        REGC_EW_OPS(REGC_EW_CASE)
#undef REGC_EW_CASE
    default: return 0;
    }
}

typedef struct {
    uint8_t op;   /* regc_ew_op */
    uint8_t a, b; /* source registers (b unused by one-operand ops) */
    float value;  /* v: SCALE, ADD_SCALAR, POW, MASKED_FILL */
} regc_ew_step;

typedef struct {
    int n_inputs, n_steps, n_outputs;
    int64_t period[REGC_EW_MAX_INPUTS];
    int64_t inner[REGC_EW_MAX_INPUTS];
    regc_ew_step steps[REGC_EW_MAX_STEPS];
    uint8_t out_reg[REGC_EW_MAX_OUTPUTS]; /* the registers written to out[0..n_outputs-1] */
} regc_ew_program;

/* Learning-rate schedules, with Hugging Face's names and formulas
 * (transformers' get_scheduler): the factor on the base learning rate at
 * optimizer step s (from 0), warmup w, total steps n:
 *   CONSTANT              1
 *   CONSTANT_WITH_WARMUP  s < w: s / max(1, w); else 1
 *   LINEAR                s < w: s / max(1, w); else max(0, (n - s) / max(1, n - w))
 *   COSINE                s < w: s / max(1, w); else with p = (s - w) / max(1, n - w):
 *                         max(0, (1 + cos(pi * cycles * 2 p)) / 2)
 *   COSINE_WITH_MIN_LR    as COSINE, the factor f then f (1 - min_lr_rate) + min_lr_rate */
typedef enum {
    REGC_SCHEDULE_CONSTANT,
    REGC_SCHEDULE_CONSTANT_WITH_WARMUP,
    REGC_SCHEDULE_LINEAR,
    REGC_SCHEDULE_COSINE,
    REGC_SCHEDULE_COSINE_WITH_MIN_LR,
    REGC_SCHEDULE_COUNT
} regc_schedule;

/* The optimizer's scalars: one small struct in device memory that the
 * step's update instructions read and write, so that the whole step —
 * forward, backward, schedule, clipping, AdamW — runs from device state.
 * The trainer sets the run's constants and `step` (0, or where a resumed
 * run stands) once, and loss_scale before each micro-batch; the kernels
 * keep the rest. Scalars that torch forms as Python floats are doubles
 * here, rounded to float where torch's kernels round them. */
typedef struct {
    /* the run's constants */
    double base_lr, weight_decay, beta1, beta2, eps;
    double max_grad_norm; /* > 0: clip the gradients' global L2 norm to it */
    double warmup_steps, total_steps, min_lr_rate, num_cycles;
    int32_t schedule; /* regc_schedule */
    int32_t reserved;
    /* state */
    double step;       /* optimizer steps taken: the schedule reads it, then adds one */
    double lr;         /* this step's learning rate */
    double grad_sumsq; /* sum of the gradients' squares (grad_sumsq), in element order */
    float grad_norm;   /* its square root: clip_grad_norm_'s total norm */
    float clip_scale;  /* what AdamW multiplies each gradient by: 1 unless clipped */
    float loss_scale;  /* the loss gradient's seed: 1, or a micro-batch's share */
    /* 1 when this step's gradient norm is not finite: AdamW leaves the
     * parameters and moments as they are and `step` is taken back, so the
     * step is as if it never ran (the trainer stops or goes on) */
    int32_t skipped;
    /* AdamW's coefficients for this step, rounded to float as torch's CPU
     * kernel rounds them (written by the schedule) */
    float decay;         /* 1 - lr * weight_decay */
    float neg_step_size; /* -lr / (1 - beta1^t) */
    float bc2_sqrt;      /* sqrt(1 - beta2^t) */
    float beta1_f, beta2_f, one_minus_beta1, one_minus_beta2, eps_f;
} regc_step_scalars;

typedef struct regc_backend regc_backend;

struct regc_backend {
    const char *name;
    /* what compiled code is specific to, for compile-cache keys: "cpu",
     * or "cuda sm_90" with the GPU's compute capability */
    const char *device;
    void *ctx; /* the implementation's own state */

    /* memory; alloc returns NULL on failure (the message is set) */
    void *(*alloc)(regc_backend *be, size_t bytes);
    /* the bytes alloc handed out and free has not taken back, and their
     * high-water mark: what the device holds for the run (kernel scratch
     * aside); backends that do not count leave both 0 */
    int64_t mem_in_use, mem_peak;
    /* the bytes the device has in all (the host's memory for the CPU): what
     * a run is checked against before it allocates; 0 when unknown */
    int64_t mem_capacity;
    void (*free)(regc_backend *be, void *ptr);
    /* host memory the device copies to and from without staging (pinned
     * on a GPU; the CPU's is its own memory): an offloaded optimizer's
     * state, offloaded activations. Never counted in mem_in_use: what a
     * run holds on its device is what it could not put there. */
    void *(*alloc_host)(regc_backend *be, size_t bytes);
    void (*free_host)(regc_backend *be, void *ptr);
    void (*copy_h2d)(regc_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy_d2h)(regc_backend *be, void *dst, const void *src, size_t bytes);
    /* A copy to host memory from alloc_host, behind the work queued so far,
     * on a queue of its own: work queued after it does not wait for it
     * (sync does). NULL: copy_d2h serves (the CPU, where a copy is done
     * when it returns). */
    void (*copy_d2h_side)(regc_backend *be, void *dst, const void *src, size_t bytes);
    /* The copy queue (offloaded activations): copy_start queues a copy
     * between the device and alloc_host's memory (to_host: device to host)
     * behind the work queued so far, on a queue of its own, and returns its
     * ticket; work queued later does not wait for it until copy_wait(ticket)
     * is queued, after which it does (the host never blocks). NULL where
     * copies are done when they return (the CPU): copy_h2d and copy_d2h
     * serve then. */
    int64_t (*copy_start)(regc_backend *be, void *dst, const void *src, size_t bytes, int to_host);
    void (*copy_wait)(regc_backend *be, int64_t ticket);
    void (*copy_d2d)(regc_backend *be, void *dst, const void *src, size_t bytes);
    void (*fill)(regc_backend *be, float *dst, size_t n, float value);
    int (*sync)(regc_backend *be); /* waits for all queued work; reports failures */
    /* Before each run of a program (NULL: nothing to do): the CPU backend
     * fits its thread team to the cores other processes leave free. */
    void (*begin_run)(regc_backend *be);
    /* Whole-step capture (O2); NULL where the backend has none (the CPU:
     * O2 runs as O1). Between capture_begin and capture_end the calls on
     * the backend record their work instead of doing it; capture_end gives
     * the recording as one graph, which graph_launch runs (the same work
     * on the same memory, each time it is launched) and graph_free frees.
     * Nothing between them may wait for the device (sync). */
    int (*capture_begin)(regc_backend *be);
    int (*capture_end)(regc_backend *be, void **graph);
    int (*graph_launch)(regc_backend *be, void *graph);
    void (*graph_free)(regc_backend *be, void *graph);

    /* dst[r, 0:cols] = src[r, 0:cols] for r < rows; strides in elements.
     * Splits and concatenations along the last axis are this copy. */
    void (*copy_2d)(regc_backend *be, float *dst, int64_t ld_dst, const float *src, int64_t ld_src,
                    int64_t rows, int64_t cols);
    /* out = x with axes permuted: out.shape[i] = shape[perm[i]], ndim <= 6 */
    void (*transpose)(regc_backend *be, float *out, const float *x, int ndim, const int64_t *shape,
                      const int *perm);

    int (*gemm)(regc_backend *be, const regc_gemm *g);
    /* TF32: has_tf32, the device multiplies fp32 operands rounded to TF32
     * (10 mantissa bits, fp32 sums) on its matrix units (a CUDA device of
     * compute capability 8.0 or later; never the CPU); tf32, set by the
     * caller before the first gemm or gemm_prepare, lets its fp32 GEMMs do
     * so (torch.backends.cuda.matmul.allow_tf32). bf16 GEMMs are unaffected. */
    int has_tf32, tf32;
    /* Optional (NULL: nothing to set up). Set up, once, what gemm() needs
     * for the GEMMs g describes (its shape, epilogue and operands'
     * alignment): a program calls it for each of its GEMMs when it is
     * bound, so no choice is made while the step runs. */
    int (*gemm_prepare)(regc_backend *be, const regc_gemm *g);
    /* Optional: what preparing chose (cuBLASLt's algorithms), as bytes to
     * keep beside a compiled step under the backend's device; tuning_save
     * returns the size and writes it when buf holds that many bytes.
     * tuning_load gives them back on a later start, so that preparing
     * chooses nothing again; bytes of another build are refused. */
    size_t (*tuning_save)(regc_backend *be, void *buf, size_t cap);
    int (*tuning_load)(regc_backend *be, const void *data, size_t len);
    /* the choices preparing made by searching rather than by loading */
    int64_t tuning_queries;

    /* out[r, c] = table[ids[r], c]; every id < vocab (checked by the caller).
     * The table is held in bf16 when table_bf16 (regc_bf16_bits; table then
     * points at its uint16_t values): a frozen embedding of a base held in
     * bf16, each value read exactly, widened (regc_load_f32_or_bf16), so out
     * holds the bf16 value itself. */
    void (*embedding_fwd)(regc_backend *be, float *out, const int32_t *ids, const float *table,
                          int64_t rows, int64_t cols, int table_bf16);
    /* dtable[v, :] (+)= sum over r with ids[r] == v of dout[r, :], the sum in row
     * order from 0 (dtable is [vocab, cols]): written fresh, or with
     * accumulate added once to the rows of ids (others untouched), so a
     * gradient already in dtable takes no separate add; the row of id `pad`
     * (PyTorch's padding_idx; -1 for none) takes nothing: zeros, or left as
     * it is */
    void (*embedding_bwd)(regc_backend *be, float *dtable, const int32_t *ids, const float *dout,
                          int64_t rows, int64_t cols, int64_t vocab, int accumulate, int64_t pad);

    void (*add)(regc_backend *be, float *out, const float *a, const float *b, int64_t n);
    /* out[r, c] = x[r, c] + b[c] */
    void (*bias_add)(regc_backend *be, float *out, const float *x, const float *b, int64_t rows,
                     int64_t cols);
    /* out[c] = sum over r of x[r, c] */
    void (*sum_rows)(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols);
    /* out[r] = sum over c of x[r, c] in double (the norms' eight lanes),
     * divided by cols when mean, rounded to float */
    void (*row_sum)(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols,
                    int mean);

    /* y = (x - mean) * rstd * w + b over each row of cols; mean, rstd: [rows].
     * The norms' y is held in bf16 when y_bf16 (regc_store_f32_or_bf16): a
     * norm feeding only bf16 GEMMs. */
    void (*layernorm_fwd)(regc_backend *be, void *y, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int64_t rows, int64_t cols, float eps,
                          int y_bf16);
    void (*layernorm_bwd)(regc_backend *be, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, const float *mean, const float *rstd,
                          int64_t rows, int64_t cols);

    void (*gelu_fwd)(regc_backend *be, float *y, const float *x, int64_t n);
    void (*gelu_bwd)(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);

    /* y = x * rstd * w over each row of cols, rstd = 1 / sqrt(mean(x^2) + eps): [rows] */
    void (*rmsnorm_fwd)(regc_backend *be, void *y, float *rstd, const float *x, const float *w,
                        int64_t rows, int64_t cols, float eps, int y_bf16);
    void (*rmsnorm_bwd)(regc_backend *be, float *dx, float *dw, const float *dy, const float *x,
                        const float *w, const float *rstd, int64_t rows, int64_t cols);
    /* rotary embedding, HF Llama's rotate_half on the first rot_dim values
     * of each head (all of it, or Phi's and GPT-NeoX's part): x, y [batch,
     * t, n_head * head_dim], cos, sin [t, rot_dim / 2]; per head y1 = x1 cos
     * - x2 sin, y2 = x2 cos + x1 sin over the halves x1 = x[:rot_dim/2], x2
     * = x[rot_dim/2:rot_dim], and y = x past rot_dim; inverse = 1 negates
     * sin (the backward). rot_dim is even and at most head_dim. y_bf16: y
     * is held in bf16 (regc_bf16_bits), each value rounded as it is stored. */
    void (*rope)(regc_backend *be, float *y, const float *x, const float *cos, const float *sin,
                 int64_t batch, int64_t t, int n_head, int head_dim, int rot_dim, int inverse,
                 int y_bf16);
    /* silu(x) = x * sigmoid(x) */
    void (*silu_fwd)(regc_backend *be, float *y, const float *x, int64_t n);
    void (*silu_bwd)(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);
    /* out = a * b elementwise */
    void (*mul)(regc_backend *be, float *out, const float *a, const float *b, int64_t n);
    /* the exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (BERT's "gelu") */
    void (*gelu_erf_fwd)(regc_backend *be, float *y, const float *x, int64_t n);
    void (*gelu_erf_bwd)(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);
    /* relu(x) = max(x, 0); backward dx = dy where x > 0, else 0 (0 at x = 0, as PyTorch) */
    void (*relu_fwd)(regc_backend *be, float *y, const float *x, int64_t n);
    void (*relu_bwd)(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n);
    /* y = value * x (T5's tied-head rescaling; its own backward) */
    void (*scale)(regc_backend *be, float *y, const float *x, float value, int64_t n);
    /* y = dropout(x) [n]: element i kept with probability 1 - p and scaled
     * by 1 / (1 - p), else 0; its draw is Philox4x32-10's word i % 4 at
     * counter (i / 4, *site, draw[2]) under key (draw[0], draw[1]) (device
     * int32: site [1], draw [4]; regc_dropout_words). draw[3] == 0 (not
     * training): y = x. The same call on a gradient applies the same mask. */
    void (*dropout)(regc_backend *be, float *y, const float *x, const int32_t *site,
                    const int32_t *draw, float p, int64_t n);

    /* out, q: [batch, tq, n_head * head_dim]; k, v: [batch, tk, n_kv_head * head_dim].
     * bias [n_head, tq, tk] or NULL: added to the scaled scores before the
     * causal mask and softmax, the same for every batch row (T5). dbias
     * [n_head, tq, tk] or NULL: the bias gradient, summed over the batch
     * (wanted only when the forward had a bias; it needs bias too). */
    void (*attention_fwd)(regc_backend *be, float *out, float *lse, const float *q, const float *k,
                          const float *v, const float *bias, const regc_attn_shape *s);
    void (*attention_bwd)(regc_backend *be, float *dq, float *dk, float *dv, float *dbias,
                          const float *dout, const float *q, const float *k, const float *v,
                          const float *bias, const float *out, const float *lse,
                          const regc_attn_shape *s);

    /* loss[0] = mean over rows with targets[r] >= 0 of
     * lse[r] - logits[r, targets[r]]; rows with a negative target are ignored
     * (lse still written). Every non-negative target is < cols. */
    void (*cross_entropy_fwd)(regc_backend *be, float *loss, float *lse, const float *logits,
                              const int32_t *targets, int64_t rows, int64_t cols);
    /* Per row: lse[r] = log sum exp x[r, :] (cross_entropy_fwd's), then
     * y = exp(x - lse) (softmax) or, with log, x - lse (log-softmax); y is
     * not x. */
    void (*softmax_fwd)(regc_backend *be, float *y, float *lse, const float *x, int64_t rows,
                        int64_t cols, int log);
    /* dlogits = dloss[0] / n_valid * (softmax(logits) - onehot(target)) for
     * rows [row0, row0 + rows) of a loss over all_rows: logits, lse and
     * dlogits point at those rows, targets at the whole loss's [all_rows],
     * over which n_valid counts the targets >= 0, so the logits taken in
     * chunks of rows get one call's factor (one call: row0 0, all_rows
     * rows). Held in bf16 when dlogits_bf16 (it feeds only the head's bf16
     * GEMMs). */
    void (*cross_entropy_bwd)(regc_backend *be, void *dlogits, const float *dloss,
                              const float *logits, const int32_t *targets, const float *lse,
                              int64_t rows, int64_t cols, int64_t row0, int64_t all_rows,
                              int dlogits_bf16);
    /* cross_entropy_fwd's rows without the mean, for logits taken in chunks
     * of rows: lse[r] as it computes it, picked[r] = logits[r, targets[r]]
     * (0 where the target is negative); every non-negative target < cols. */
    void (*cross_entropy_rows)(regc_backend *be, float *lse, float *picked, const float *logits,
                               const int32_t *targets, int64_t rows, int64_t cols);
    /* loss[0] = the mean over rows with 0 <= targets[r] < cols of lse[r] -
     * picked[r]: from cross_entropy_rows' outputs over every chunk,
     * cross_entropy_fwd's loss to the bit. */
    void (*cross_entropy_loss)(regc_backend *be, float *loss, const float *lse, const float *picked,
                               const int32_t *targets, int64_t rows, int64_t cols);

    /* ---- fused kernels of the compiled levels; each gives bit-identical
     * results to the unfused kernels it replaces */
    /* out[k][e] = the program's out_reg[k] at element e, for e < n; out[k]
     * holds bf16 values (regc_store_f32_or_bf16) when bit k of out_bf16 is
     * set, and then overlaps no input; in[i] holds bf16 values
     * (regc_load_f32_or_bf16: read exactly, widened) when bit i of in_bf16
     * is set, and then no output overlaps it. A program of no steps whose
     * output is its input converts: fp32 to bf16 or back. */
    void (*elementwise)(regc_backend *be, const regc_ew_program *p, int64_t n, float *const *out,
                        const float *const *in, unsigned out_bf16, unsigned in_bf16);
    /* sum = a + b, then layernorm_fwd over sum: the residual add that ends
     * one layer fused with the norm that starts the next */
    void (*add_layernorm_fwd)(regc_backend *be, float *sum, void *y, float *mean, float *rstd,
                              const float *a, const float *b, const float *w, const float *bias,
                              int64_t rows, int64_t cols, float eps, int y_bf16);
    void (*add_rmsnorm_fwd)(regc_backend *be, float *sum, void *y, float *rstd, const float *a,
                            const float *b, const float *w, int64_t rows, int64_t cols, float eps,
                            int y_bf16);
    /* the backward pair: dx = dres + (layernorm_bwd's dx); dx may be dres */
    void (*layernorm_bwd_add)(regc_backend *be, float *dx, float *dw, float *db, const float *dres,
                              const float *dy, const float *x, const float *w, const float *mean,
                              const float *rstd, int64_t rows, int64_t cols);
    void (*rmsnorm_bwd_add)(regc_backend *be, float *dx, float *dw, const float *dres,
                            const float *dy, const float *x, const float *w, const float *rstd,
                            int64_t rows, int64_t cols);

    /* ---- the optimizer step, over regc_step_scalars in device memory */
    /* Begin an optimizer step: lr = base_lr * the schedule's factor at `step`,
     * then step += 1 and AdamW's coefficients for it; grad_sumsq = 0,
     * clip_scale = 1. A bad schedule or constant is reported by sync(). */
    void (*step_schedule)(regc_backend *be, regc_step_scalars *s);
    /* s->grad_sumsq += sum of g[i]^2 over one span, in double, in element
     * order whatever the threads */
    void (*grad_sumsq)(regc_backend *be, const float *g, int64_t n, regc_step_scalars *s);
    /* grad_norm = sqrt(grad_sumsq); with max_grad_norm > 0, clip_scale =
     * min(1, max_grad_norm / (grad_norm + 1e-6)) as torch's clip_grad_norm_ */
    void (*grad_clip)(regc_backend *be, regc_step_scalars *s);
    /* torch.optim.AdamW over one contiguous span, each gradient first
     * multiplied by s->clip_scale (exact when it is 1), with the step's
     * coefficients from s; decay 0: the span's parameters are in a group
     * of weight_decay 0 (biases and norms, as Transformers' Trainer groups
     * them), 1: s->weight_decay's */
    void (*adamw)(regc_backend *be, float *param, const float *grad, float *m, float *v, int64_t n,
                  const regc_step_scalars *s, int decay);

    void (*destroy)(regc_backend *be); /* frees ctx and be; called by regc_backend_free */
};

/* Every kernel entry of the table, once: what a backend must fill to run
 * every program the compiler makes. A test compares the CPU's and the
 * CUDA backend's tables through it, so an entry one fills and the other
 * leaves NULL fails a test instead of a run. */
/* clang-format off */
#define REGC_BACKEND_KERNELS(X)                                                                    \
    X(copy_2d) X(transpose) X(gemm) X(embedding_fwd) X(embedding_bwd)                             \
    X(add) X(bias_add) X(sum_rows) X(row_sum) X(mul) X(scale) X(dropout)                          \
    X(gelu_fwd) X(gelu_bwd) X(gelu_erf_fwd) X(gelu_erf_bwd) X(silu_fwd) X(silu_bwd)               \
    X(relu_fwd) X(relu_bwd) X(rope) X(elementwise)                                                \
    X(layernorm_fwd) X(layernorm_bwd) X(rmsnorm_fwd) X(rmsnorm_bwd)                               \
    X(add_layernorm_fwd) X(add_rmsnorm_fwd) X(layernorm_bwd_add) X(rmsnorm_bwd_add)               \
    X(attention_fwd) X(attention_bwd) X(softmax_fwd) X(cross_entropy_fwd) X(cross_entropy_bwd)    \
    X(cross_entropy_rows) X(cross_entropy_loss)                                                   \
    X(step_schedule) X(grad_sumsq) X(grad_clip) X(adamw)
/* clang-format on */

/* The CPU backend (OpenMP; regc's own GEMM kernels, else OpenBLAS).
 * threads <= 0: OMP_NUM_THREADS or all cores. NULL with a message when
 * REGC_CPU_GEMM names a GEMM this CPU cannot run. */
regc_backend *regc_backend_cpu_new(int threads);
/* The GEMM the CPU backends of this process run: "avx512-bf16" (regc's
 * kernels, bf16 GEMMs in AVX-512 BF16's pair products), "avx512", "avx2"
 * (with FMA), or "openblas" (processors with none of these, or builds
 * other than x86-64 GCC). Chosen when the first backend is made: the
 * first of these this CPU runs, or the one REGC_CPU_GEMM names. */
const char *regc_backend_cpu_gemm_name(void);
/* The names of the CPU GEMMs, best first, i from 0; NULL past the last. */
const char *regc_backend_cpu_gemm_at(int i);
/* Whether this CPU runs the GEMM so named. */
int regc_backend_cpu_gemm_runs(const char *name);
/* Chooses the CPU backends' GEMM by name (NULL: the best this CPU runs),
 * for every backend of the process from its next GEMM on. REGC_ERR_ARG for
 * an unknown name, REGC_ERR_UNSUPPORTED where this CPU cannot run it. */
int regc_backend_cpu_use_gemm(const char *name);
/* The CUDA backend; NULL with a message when regc was built without CUDA,
 * its module cannot be loaded or no device can be used. */
regc_backend *regc_backend_cuda_new(int device);
/* GPUs the CUDA backend can use (0 without CUDA). */
int regc_backend_cuda_device_count(void);

/* ---- libregc_cuda.so
 * cuBLASLt, NCCL and the CUDA runtime map about 200 MB into a process that
 * links them, whether or not it ever touches a GPU. So they are linked
 * only into a module of their own, libregc_cuda.so (the CUDA backend,
 * kernels/cuda/, and the NCCL communicator, zero3/comm_nccl.c, entered
 * through zero3/cuda_module.c), which the library loads with dlopen the
 * first time a CUDA backend, a device count or an NCCL communicator is
 * asked for: a CPU run never maps them. The module calls back into the
 * library for one thing, the error message, through the function it is
 * given. It is looked for at $REGC_CUDA_MODULE, beside the executable, in
 * the build directory, then on the loader's path. */

/* Raised whenever this table's first fields change. A module of another
 * build is refused rather than called through another layout of the
 * backend or a descriptor: its source_id (the hash of the sources and
 * headers, generated/regc_source_id.h) must be the library's. */
#define REGC_CUDA_MODULE_ABI 8
#define REGC_CUDA_MODULE_ENTRY "regc_cuda_module_entry" /* the one exported symbol */

typedef int (*regc_error_fn)(int status, const char *fmt, ...);
typedef struct {
    int abi;               /* REGC_CUDA_MODULE_ABI of the module's build */
    const char *source_id; /* REGC_SOURCE_ID of the module's build */
    regc_backend *(*backend_new)(int device);
    int (*device_count)(void);
    /* every entry the backend sets, into a zeroed table, without a device
     * (no call is made through it): what the completeness test reads */
    void (*fill_table)(regc_backend *be);
    /* the NCCL communicator (zero3/): host and the result are regc_comm;
     * NULL when the module was built without NCCL */
    void *(*nccl_comm_new)(void *host, regc_backend *be);
} regc_cuda_module;
typedef const regc_cuda_module *(*regc_cuda_module_entry_fn)(regc_error_fn error);

/* The loaded module's table; NULL with a message when regc was built
 * without CUDA or the module cannot be loaded (loaded once per process). */
const regc_cuda_module *regc_cuda_module_get(void);
/* Inside the module only (kernels/cuda/cuda_backend.cu). */
regc_backend *regc_cuda_backend_open(int device);
int regc_cuda_device_count(void);
void regc_cuda_fill_table(regc_backend *be);
/* out = a + b (the add kernel) on another stream than the backend's: the
 * NCCL communicator's accumulating reduce-scatter, which runs on the
 * communication queue's thread and must not touch the backend's state.
 * cudaError_t's value; the caller synchronises its stream. */
int regc_cuda_add_on_stream(void *stream, float *out, const float *a, const float *b, int64_t n);
/* "cpu" or "cuda"; NULL with a message for an unknown or unavailable name */
regc_backend *regc_backend_new(const char *name, int threads);
void regc_backend_free(regc_backend *be);

/* NF4's format and dequantisation (QLoRA's frozen weights: regc_gemm's
 * b_nf4), shared by both backends' GEMMs and the models' quantiser */
#include "nf4_format.h"

#ifdef __cplusplus
}
#endif

#endif
