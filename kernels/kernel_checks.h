/* kernel_checks.h — private to kernels/: the checks every backend makes of
 * a call before it touches memory (a GEMM descriptor, a fused elementwise
 * program, a rotary embedding's or an attention's shape), one definition
 * each, so a bad call is the same one-line error on the CPU and the GPU
 * rather than a read out of bounds. Each returns REGC_OK or regc_error's
 * status with the message set. Static inline: the CUDA module compiles
 * them too, apart from the library. */
#ifndef REGC_KERNEL_CHECKS_H
#define REGC_KERNEL_CHECKS_H

#include "kernel_math.h"
#include "regc_backend.h"
#include "regc_common.h"

/* Everything a malformed call could get wrong is caught here, so a bad
 * descriptor is an error message rather than a read out of bounds. */
static inline int regc_gemm_check(const regc_gemm *g)
{
    if (g->m < 0 || g->n < 0 || g->k < 0)
        return regc_error(REGC_ERR_ARG, "gemm: negative size m=%lld n=%lld k=%lld", (long long)g->m,
                          (long long)g->n, (long long)g->k);
    int64_t a_cols = g->trans_a ? g->m : g->k; /* A is stored [k, m] when transposed */
    int64_t b_cols = g->trans_b ? g->k : g->n;
    if (g->lda < (a_cols > 1 ? a_cols : 1))
        return regc_error(REGC_ERR_ARG, "gemm: lda=%lld is less than A's %lld columns",
                          (long long)g->lda, (long long)a_cols);
    if (g->ldb < (b_cols > 1 ? b_cols : 1))
        return regc_error(REGC_ERR_ARG, "gemm: ldb=%lld is less than B's %lld columns",
                          (long long)g->ldb, (long long)b_cols);
    if (g->ldc < (g->n > 1 ? g->n : 1))
        return regc_error(REGC_ERR_ARG, "gemm: ldc=%lld is less than C's %lld columns",
                          (long long)g->ldc, (long long)g->n);
    if (!g->c || (g->k > 0 && g->m > 0 && g->n > 0 && (!g->a || !g->b)))
        return regc_error(REGC_ERR_ARG, "gemm: a NULL matrix pointer");
    if ((g->a_bf16 || g->b_bf16 || g->c_bf16) && !g->bf16)
        return regc_error(REGC_ERR_ARG, "gemm: an operand held in bf16 needs a bf16 GEMM");
    if (g->c_bf16 && g->accumulate)
        return regc_error(REGC_ERR_ARG, "gemm: C held in bf16 cannot accumulate");
    if (g->b_nf4 && (g->b_bf16 || g->ldb != b_cols))
        return regc_error(REGC_ERR_ARG,
                          "gemm: B held in NF4 must be contiguous (ldb=%lld, %lld "
                          "columns) and not also bf16",
                          (long long)g->ldb, (long long)b_cols);

    int needs_bias = 0, needs_aux = 0, needs_bias_grad = 0;
    switch (g->epilogue) {
    case REGC_EPI_NONE:
    case REGC_EPI_GELU: break;
    case REGC_EPI_BIAS: needs_bias = 1; break;
    case REGC_EPI_GELU_AUX:
    case REGC_EPI_DGELU: needs_aux = 1; break;
    case REGC_EPI_BIAS_GELU_AUX:
        needs_bias = 1;
        needs_aux = 1;
        break;
    case REGC_EPI_DGELU_BGRAD:
        needs_aux = 1;
        needs_bias_grad = 1;
        break;
    case REGC_EPI_BGRAD: needs_bias_grad = 1; break;
    default: return regc_error(REGC_ERR_ARG, "gemm: unknown epilogue %d", (int)g->epilogue);
    }
    const char *name = regc_epilogue_name(g->epilogue);
    if (needs_bias && !g->bias)
        return regc_error(REGC_ERR_ARG, "gemm: epilogue %s needs a bias", name);
    if (needs_aux && (!g->aux || g->ldaux < g->n))
        return regc_error(REGC_ERR_ARG, "gemm: epilogue %s needs aux with ldaux >= n=%lld", name,
                          (long long)g->n);
    if (needs_bias_grad && !g->bias_grad)
        return regc_error(REGC_ERR_ARG, "gemm: epilogue %s needs a bias_grad output", name);
    if (needs_bias_grad && g->epilogue == REGC_EPI_BGRAD && g->k > 0 && !g->b)
        return regc_error(REGC_ERR_ARG, "gemm: epilogue BGRAD needs B");
    return REGC_OK;
}

static inline const char *regc_ew_op_name(int op)
{
    switch (op) {
#define REGC_EW_CASE(id, name, arity, costly, f)                                                   \
    case REGC_EW_##id: return name;
        REGC_EW_OPS(REGC_EW_CASE)
#undef REGC_EW_CASE
    default: return NULL;
    }
}

/* Everything the loop relies on, checked before it reads a byte: a bad
 * program is refused with a message instead of reading outside the arrays. */
static inline int regc_ew_check(const regc_ew_program *p, int64_t n, float *const *out,
                                const float *const *in, unsigned out_bf16, unsigned in_bf16)
{
    if (!p)
        return regc_error(REGC_ERR_ARG, "elementwise: no program");
    if (n < 0)
        return regc_error(REGC_ERR_ARG, "elementwise: negative element count %lld", (long long)n);
    if (p->n_inputs < 0 || p->n_inputs > REGC_EW_MAX_INPUTS)
        return regc_error(REGC_ERR_ARG, "elementwise: %d inputs, outside 0..%d", p->n_inputs,
                          REGC_EW_MAX_INPUTS);
    if (p->n_steps < 0 || p->n_steps > REGC_EW_MAX_STEPS)
        return regc_error(REGC_ERR_ARG, "elementwise: %d steps, outside 0..%d", p->n_steps,
                          REGC_EW_MAX_STEPS);
    if (p->n_outputs < 0 || p->n_outputs > REGC_EW_MAX_OUTPUTS)
        return regc_error(REGC_ERR_ARG, "elementwise: %d outputs, outside 0..%d", p->n_outputs,
                          REGC_EW_MAX_OUTPUTS);
    for (int i = 0; i < p->n_inputs; i++) {
        if (p->period[i] < 0 || p->inner[i] < 0)
            return regc_error(REGC_ERR_ARG,
                              "elementwise: input %d has negative period %lld or inner count %lld",
                              i, (long long)p->period[i], (long long)p->inner[i]);
        if (n > 0 && (!in || !in[i]))
            return regc_error(REGC_ERR_ARG, "elementwise: input %d is NULL", i);
    }
    for (int s = 0; s < p->n_steps; s++) {
        const regc_ew_step *st = &p->steps[s];
        const char *name = regc_ew_op_name(st->op);
        const int written = p->n_inputs + s; /* registers 0 .. written-1 hold values */
        if (!name)
            return regc_error(REGC_ERR_ARG, "elementwise: step %d has unknown op %d", s, st->op);
        if (st->a >= written || (regc_ew_binary(st->op) && st->b >= written))
            return regc_error(REGC_ERR_ARG,
                              "elementwise: step %d (%s) reads register %d before it is written "
                              "(%d inputs; step %d writes register %d)",
                              s, name, st->a >= written ? st->a : st->b, p->n_inputs, s, written);
    }
    for (int k = 0; k < p->n_outputs; k++) {
        const int reg = p->out_reg[k];
        if (reg >= p->n_inputs + p->n_steps)
            return regc_error(REGC_ERR_ARG,
                              "elementwise: output %d is register %d, but only registers 0..%d "
                              "are written",
                              k, reg, p->n_inputs + p->n_steps - 1);
        if (n > 0 && (!out || !out[k]))
            return regc_error(REGC_ERR_ARG, "elementwise: output %d is NULL", k);
        /* a broadcast input is read at every block, and a bf16 output's
         * elements lie at other addresses than the input's: overwriting
         * either races */
        for (int i = 0; n > 0 && i < p->n_inputs; i++)
            if ((out_bf16 >> k & 1u) && (const float *)out[k] == in[i])
                return regc_error(REGC_ERR_ARG,
                                  "elementwise: output %d is held in bf16 and overwrites input %d",
                                  k, i);
            else if ((in_bf16 >> i & 1u) && (const float *)out[k] == in[i])
                return regc_error(REGC_ERR_ARG,
                                  "elementwise: output %d overwrites input %d, held in bf16", k, i);
            else if ((p->period[i] > 0 || p->inner[i] > 1) && (const float *)out[k] == in[i])
                return regc_error(REGC_ERR_ARG,
                                  "elementwise: output %d overwrites input %d, which is "
                                  "broadcast (period %lld, inner %lld)",
                                  k, i, (long long)p->period[i], (long long)p->inner[i]);
    }
    return REGC_OK;
}

/* An axis permutation of at most REGC_TRANSPOSE_MAX_DIMS axes. */
#define REGC_TRANSPOSE_MAX_DIMS 6
static inline int regc_transpose_check(int ndim, const int64_t *shape, const int *perm)
{
    if (ndim < 1 || ndim > REGC_TRANSPOSE_MAX_DIMS)
        return regc_error(REGC_ERR_ARG, "transpose: %d axes (1 to %d are supported)", ndim,
                          REGC_TRANSPOSE_MAX_DIMS);
    unsigned seen = 0;
    for (int i = 0; i < ndim; i++) {
        if (perm[i] < 0 || perm[i] >= ndim || (seen >> perm[i] & 1u) || shape[i] < 0)
            return regc_error(REGC_ERR_ARG, "transpose: axis %d of the permutation (%d) is invalid",
                              i, perm[i]);
        seen |= 1u << perm[i];
    }
    return REGC_OK;
}

/* A rotary embedding's shape: the rotated part of each head (its first
 * rot_dim values) even, its two halves rotating, and within the head. */
static inline int regc_rope_check(int64_t batch, int64_t t, int n_head, int head_dim, int rot_dim)
{
    if (batch < 0 || t < 0 || n_head <= 0 || head_dim <= 0 || rot_dim < 2 || rot_dim % 2 ||
        rot_dim > head_dim)
        return regc_error(REGC_ERR_SHAPE,
                          "rope: bad shape batch=%lld t=%lld n_head=%d head_dim=%d rot_dim=%d "
                          "(rot_dim must be even and within head_dim)",
                          (long long)batch, (long long)t, n_head, head_dim, rot_dim);
    return REGC_OK;
}

/* An attention's shape (what names the kernel: attention_fwd, ...). */
static inline int regc_attn_check(const regc_attn_shape *s, const char *what)
{
    if (s->batch < 0 || s->tq < 0 || s->tk < 0 || s->n_head <= 0 || s->n_kv_head <= 0 ||
        s->head_dim <= 0 || s->n_head % s->n_kv_head != 0 || (s->causal && s->tq != s->tk))
        return regc_error(REGC_ERR_SHAPE,
                          "%s: bad shape batch=%lld tq=%lld tk=%lld heads=%d kv_heads=%d "
                          "head_dim=%d causal=%d",
                          what, (long long)s->batch, (long long)s->tq, (long long)s->tk, s->n_head,
                          s->n_kv_head, s->head_dim, s->causal);
    if (!(s->softcap >= 0.0f && s->softcap < INFINITY) || s->window < 0 ||
        ((s->window > 0 || s->doc_start) && !s->causal))
        return regc_error(REGC_ERR_ARG,
                          "%s: softcap %g must be finite and not negative, and a window (%lld) "
                          "or documents need the causal mask",
                          what, (double)s->softcap, (long long)s->window);
    if (!(s->dropout >= 0.0f && s->dropout < 1.0f) ||
        (s->dropout > 0.0f && (!s->drop_site || !s->drop_draw)))
        return regc_error(REGC_ERR_ARG,
                          "%s: dropout %g must be in [0, 1), and given its site and draw", what,
                          (double)s->dropout);
    return REGC_OK;
}

/* A score bias and soft-capping together: the bias gradient would be the
 * capped scores', which neither backend forms; no model has both. */
static inline int regc_attn_check_bias(const regc_attn_shape *s, const void *bias, const char *what)
{
    if (bias && s->softcap > 0.0f)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: a score bias with soft-capping is not supported", what);
    return REGC_OK;
}

/* Is attention's dropout drawn in this call? (Read from drop_draw, which
 * lives where the kernel runs.) */
static inline REGC_HD int regc_attn_drops(const regc_attn_shape *s)
{
    return s->dropout > 0.0f && s->drop_draw[3] != 0;
}

/* The factor attention's dropout multiplies probability (b, h, i, j) by
 * when regc_attn_drops: 0, or 1 / (1 - dropout) rounded to float as torch
 * rounds it, from the dropout kernel's draw (regc_dropout_words) at that
 * element's index in the [batch, n_head, tq, tk] probabilities; a backend
 * that walks a row may draw four elements per call instead, as the dropout
 * kernel does, and get the same factors. */
static inline REGC_HD float regc_attn_keep(const regc_attn_shape *s, int64_t b, int h, int64_t i,
                                           int64_t j)
{
    const int64_t e = ((b * s->n_head + h) * s->tq + i) * s->tk + j;
    uint32_t w[4];
    regc_dropout_words(s->drop_draw, *s->drop_site, e >> 2, w);
    return regc_dropout_apply(1.0f, w[e & 3], s->dropout, 1.0f / (1.0f - s->dropout));
}

/* The first key query i of batch row b sees: i - window + 1 under a
 * sliding window, and never one before its document's first position (a
 * start outside [0, i] held to it: no read outside the row, whatever the
 * values). */
static inline REGC_HD int64_t regc_attn_first_key(const regc_attn_shape *s, int64_t b, int64_t i)
{
    const int64_t w = s->window > 0 && i >= s->window ? i - s->window + 1 : 0;
    int64_t d = s->doc_start ? s->doc_start[b * s->tq + i] : 0;
    d = d < 0 ? 0 : d > i ? i : d;
    return w > d ? w : d;
}

#endif
