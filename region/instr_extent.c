/* instr_extent.c — the rule of each kernel (validate.h): from an
 * instruction's sizes, the bytes each operand's kernel call reads or
 * writes from its reference, the same way region/instr.c passes them and
 * kernels/cpu/ indexes them, which operands must be present and which hold
 * token ids. One case per kernel: adding a kernel adds its rule here. All
 * arithmetic is on sizes bounded by REGC_VALIDATE_SIZE_LIMIT first, so
 * products of two of them cannot overflow, and larger products are
 * checked. */
#include <stdlib.h>
#include <string.h>

#include "regc_backend.h"
#include "validate.h"

#define SIZE_LIMIT REGC_VALIDATE_SIZE_LIMIT
#define F32 ((int64_t)sizeof(float))

/* ---------------------------------------------------------------- per kernel */

/* Operand counts by kernel: 0 for the kernels whose count varies (a fused
 * chain's, a wait's: the collective's it waits for). */
static const struct {
    uint8_t n_refs, n_out;
} arity[K_COUNT] = {
    [K_FILL] = {1, 1},       [K_COPY] = {2, 1},
    [K_COPY_2D] = {2, 1},    [K_TRANSPOSE] = {2, 1},
    [K_GEMM] = {6, 1},       [K_EMBED_FWD] = {3, 1},
    [K_EMBED_BWD] = {3, 1},  [K_ADD] = {3, 1},
    [K_BIAS_ADD] = {3, 1},   [K_SUM_ROWS] = {2, 1},
    [K_LN_FWD] = {6, 3},     [K_LN_BWD] = {8, 3},
    [K_RMS_FWD] = {4, 2},    [K_RMS_BWD] = {6, 2},
    [K_ROPE] = {4, 1},       [K_UNARY] = {2, 1},
    [K_BINARY] = {3, 1},     [K_ATTN_FWD] = {9, 2},
    [K_ATTN_BWD] = {14, 4},  [K_CE_FWD] = {4, 2},
    [K_CE_BWD] = {5, 1},     [K_EW] = {0, 0},
    [K_CE_ROWS] = {4, 2},    [K_CE_LOSS] = {4, 1},
    [K_ROW_SUM] = {2, 1},    [K_SOFTMAX] = {3, 2},
    [K_ADD_LN_FWD] = {8, 4}, [K_ADD_RMS_FWD] = {6, 3},
    [K_LN_BWD_ADD] = {9, 3}, [K_RMS_BWD_ADD] = {7, 2},
    [K_DROPOUT] = {4, 1},    [K_STEP_SCHEDULE] = {1, 1},
    [K_GRAD_SUMSQ] = {2, 1}, [K_GRAD_CLIP] = {1, 1},
    [K_ADAMW] = {5, 3},      [K_COPY_D2H] = {2, 1},
    [K_COPY_H2D] = {2, 1},   [K_ALLREDUCE] = {1, 1},
    [K_ALLGATHER] = {2, 1},  [K_REDUCE_SCATTER] = {2, 1},
    [K_COMM_WAIT] = {0, 0},
};

typedef struct {
    const regc_instr *in;
    regc_instr_extent *e;
    int bad;
    char why[160];
} rule;

static void fail(rule *r, const char *why)
{
    if (!r->bad)
        snprintf(r->why, sizeof r->why, "%s", why);
    r->bad = 1;
}

/* d[k], a size: 0 .. SIZE_LIMIT. */
static int64_t dim(rule *r, int k)
{
    int64_t v = r->in->d[k];
    if (v < 0 || v > SIZE_LIMIT) {
        char why[80];
        snprintf(why, sizeof why, "size d%d = %lld out of range", k, (long long)v);
        fail(r, why);
        return 0;
    }
    return v;
}

static int64_t mul(rule *r, int64_t a, int64_t b)
{
    int64_t v;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &v) || v > SIZE_LIMIT) {
        fail(r, "sizes overflow");
        return 0;
    }
    return v;
}

/* Elements of a row-major matrix of rows x cols stored ld apart. */
static int64_t span(rule *r, int64_t rows, int64_t ld, int64_t cols)
{
    if (rows == 0 || cols == 0)
        return 0;
    if (ld < cols)
        fail(r, "a leading dimension below the row length");
    return mul(r, rows - 1, ld) + cols;
}

/* Operand k touches n floats (or bytes with F32 replaced by 1); required
 * operands must name memory, optional ones may be absent. */
static void need(rule *r, int k, int64_t n, int64_t unit)
{
    r->e->bytes[k] = mul(r, n, unit);
    r->e->required |= 1u << k;
}

static void opt(rule *r, int k, int64_t n) { r->e->bytes[k] = mul(r, n, F32); }

/* A norm's row-wise shape: the common operand sizes of its family. */
static void norm_sizes(rule *r, int64_t *rc, int64_t *rows, int64_t *cols)
{
    *rows = dim(r, 0), *cols = dim(r, 1);
    *rc = mul(r, *rows, *cols);
}

static void gemm_rule(rule *r)
{
    const regc_instr *in = r->in;
    int64_t m = dim(r, 0), n = dim(r, 1), k = dim(r, 2), lda = dim(r, 3), ldb = dim(r, 4);
    if (in->epilogue < REGC_EPI_NONE || in->epilogue > REGC_EPI_BGRAD)
        fail(r, "unknown GEMM epilogue");
    int e = in->epilogue;
    int bias = e == REGC_EPI_BIAS || e == REGC_EPI_BIAS_GELU_AUX;
    int aux = e == REGC_EPI_GELU_AUX || e == REGC_EPI_BIAS_GELU_AUX || e == REGC_EPI_DGELU ||
              e == REGC_EPI_DGELU_BGRAD;
    int bgrad = e == REGC_EPI_DGELU_BGRAD || e == REGC_EPI_BGRAD;
    int busy = m > 0 && n > 0 && k > 0; /* the kernel reads A and B only then */
    need(r, 0, mul(r, m, n), F32);
    /* A is stored [k, m] when transposed, B [n, k] */
    int64_t a = in->trans_a ? span(r, k, lda, m) : span(r, m, lda, k);
    int64_t b = in->trans_b ? span(r, n, ldb, k) : span(r, k, ldb, n);
    if (lda < 1 || ldb < 1)
        fail(r, "a leading dimension below 1");
    if (busy)
        need(r, 1, a, F32), need(r, 2, b, F32);
    /* B held in NF4: the blob of its values, stored contiguous */
    if (in->b_nf4 && (ldb != (in->trans_b ? k : n) || regc_instr_ref_bf16(in, 2)))
        fail(r, "a B held in NF4 that is not contiguous, or also bf16");
    else if (in->b_nf4 && busy)
        need(r, 2, regc_nf4_layout(mul(r, k, n)).bytes, 1);
    if (bias)
        need(r, 3, n, F32);
    if (aux)
        need(r, 4, mul(r, m, n), F32);
    if (bgrad)
        need(r, 5, n, F32);
    /* an operand the epilogue does not use is absent, as the compiler makes it */
    if ((!bias && in->refs[3].buf >= 0) || (!aux && in->refs[4].buf >= 0) ||
        (!bgrad && in->refs[5].buf >= 0))
        fail(r, "an operand the GEMM epilogue does not use");
}

static void attention_rule(rule *r, int backward)
{
    const regc_attn_shape *s = &r->in->attn;
    if (s->batch < 1 || s->tq < 1 || s->tk < 1 || s->batch > SIZE_LIMIT || s->tq > SIZE_LIMIT ||
        s->tk > SIZE_LIMIT || s->n_head < 1 || s->n_kv_head < 1 || s->head_dim < 1 ||
        s->n_head % s->n_kv_head != 0 || (s->causal && s->tq != s->tk))
        fail(r, "inconsistent attention shape");
    int64_t hd = mul(r, s->n_head, s->head_dim), kvd = mul(r, s->n_kv_head, s->head_dim);
    int64_t q = mul(r, mul(r, s->batch, s->tq), hd), kv = mul(r, mul(r, s->batch, s->tk), kvd);
    int64_t bias = mul(r, mul(r, s->n_head, s->tq), s->tk);
    int64_t lse = mul(r, mul(r, s->batch, s->n_head), s->tq);
    /* the dropout's site [1] and draw [4], int32, after every other operand
     * but the documents' starts [batch, tq], int32, last */
    const int site = backward ? 11 : 6, draw = site + 1, docs = draw + 1;
    if (r->in->refs[docs].buf >= 0) {
        if (!s->causal)
            fail(r, "documents given to an attention that is not causal");
        need(r, docs, mul(r, s->batch, s->tq), 4);
        r->e->ids |= 1u << docs;
    }
    if (!(r->in->f >= 0.0f && r->in->f < 1.0f))
        fail(r, "attention's dropout p is outside [0, 1)");
    if (r->in->f > 0.0f) {
        need(r, site, 1, 4), need(r, draw, 4, 4);
        r->e->ids |= 1u << site | 1u << draw;
    } else if (r->in->refs[site].buf >= 0 || r->in->refs[draw].buf >= 0) {
        fail(r, "a dropout's site or draw given to an attention that does not drop");
    }
    if (!backward) { /* out, lse, q, k, v, bias */
        need(r, 0, q, F32), need(r, 1, lse, F32), need(r, 2, q, F32);
        need(r, 3, kv, F32), need(r, 4, kv, F32), opt(r, 5, bias);
        return;
    }
    /* dq, dk, dv, dbias, dout, q, k, v, bias, out, lse; dbias needs bias */
    need(r, 0, q, F32), need(r, 1, kv, F32), need(r, 2, kv, F32), opt(r, 3, bias);
    need(r, 4, q, F32), need(r, 5, q, F32), need(r, 6, kv, F32), need(r, 7, kv, F32);
    opt(r, 8, bias), need(r, 9, q, F32), need(r, 10, lse, F32);
    if (r->in->refs[3].buf >= 0)
        r->e->required |= 1u << 8;
}

/* (a chain of no steps converts between fp32 and bf16) */
static void ew_rule(rule *r)
{
    const regc_instr *in = r->in;
    const regc_ew_program *p = in->ew;
    if (!p) {
        fail(r, "a fused chain without its program");
        return;
    }
    if (p->n_inputs < 1 || p->n_inputs > REGC_EW_MAX_INPUTS || p->n_steps < 0 ||
        p->n_steps > REGC_EW_MAX_STEPS || p->n_outputs < 1 || p->n_outputs > REGC_EW_MAX_OUTPUTS) {
        fail(r, "fused chain counts out of range");
        return;
    }
    for (int s = 0; s < p->n_steps; s++) /* registers are written before they are read */
        if (p->steps[s].op >= REGC_EW_COUNT || p->steps[s].a >= p->n_inputs + s ||
            p->steps[s].b >= p->n_inputs + s)
            fail(r, "fused chain step reads a register not yet written");
    for (int k = 0; k < p->n_outputs; k++)
        if (p->out_reg[k] >= p->n_inputs + p->n_steps)
            fail(r, "fused chain output register out of range");
    if (in->n_out != p->n_outputs || in->n_refs != p->n_outputs + p->n_inputs) {
        fail(r, "fused chain operand counts differ from its program's");
        return;
    }
    int64_t n = dim(r, 0);
    for (int k = 0; k < p->n_outputs; k++)
        need(r, k, n, F32);
    for (int k = 0; k < p->n_inputs; k++) { /* input k is read at (e / inner) % period */
        const int64_t period = p->period[k], inner = p->inner[k];
        if (period < 0 || period > SIZE_LIMIT || inner < 0 || inner > SIZE_LIMIT) {
            fail(r, "fused chain period or inner count out of range");
            continue;
        }
        const int64_t held = inner > 1 ? (n + inner - 1) / inner : n; /* distinct indices */
        need(r, p->n_outputs + k, period > 0 && period < held ? period : held, F32);
    }
}

static int unary_op(int op)
{
    return op == REGC_OP_GELU || op == REGC_OP_SILU || op == REGC_OP_GELU_ERF ||
           op == REGC_OP_RELU || op == REGC_OP_SCALE;
}

static int binary_op(int op)
{
    return op == REGC_OP_MUL || op == REGC_OP_GELU_BWD || op == REGC_OP_SILU_BWD ||
           op == REGC_OP_GELU_ERF_BWD || op == REGC_OP_RELU_BWD;
}

/* The collectives: dst and src of one shard (n floats) or of every rank's;
 * an all-reduce's elements are f32 or (d1 = 1) f64, those waited for
 * asynchronously f32 (a wait's d1 names the kernel). */
static void collective_rule(rule *r, int kernel, int ranks)
{
    int64_t n = dim(r, 0);
    const int64_t wide = r->in->kernel == K_ALLREDUCE ? r->in->d[1] : 0;
    switch (kernel) {
    case K_ALLREDUCE:
        if (wide != 0 && wide != 1)
            fail(r, "all-reduce of an unknown element type");
        else if (wide && r->in->signal)
            fail(r, "an asynchronous all-reduce of f64");
        need(r, 0, n, wide ? 8 : F32);
        break;
    case K_ALLGATHER: need(r, 0, mul(r, ranks, n), F32), need(r, 1, n, F32); break;
    case K_REDUCE_SCATTER: need(r, 0, n, F32), need(r, 1, mul(r, ranks, n), F32); break;
    default: fail(r, "a wait for something that is not an asynchronous collective");
    }
}

int regc_instr_extent_of(const regc_instr *in, int ranks, regc_instr_extent *e)
{
    memset(e, 0, sizeof *e);
    rule r = {.in = in, .e = e};
    int k = in->kernel;
    if (k >= K_COUNT)
        return regc_error(REGC_ERR_FORMAT, "kernel %d does not exist", k);
    if (in->n_refs > REGC_INSTR_MAX_REFS || in->n_out > in->n_refs)
        return regc_error(REGC_ERR_FORMAT, "%s: operand counts out of range", regc_kernel_name(k));
    if (arity[k].n_refs && (in->n_refs != arity[k].n_refs || in->n_out != arity[k].n_out))
        return regc_error(REGC_ERR_FORMAT, "%s: %d operands (%d written), the kernel has %d (%d)",
                          regc_kernel_name(k), in->n_refs, in->n_out, arity[k].n_refs,
                          arity[k].n_out);
    if (k != K_GEMM && (in->epilogue || in->trans_a || in->trans_b || in->b_nf4))
        fail(&r, "GEMM fields on another kernel");
    if (in->ew && k != K_EW)
        fail(&r, "a fused chain on another kernel");
    int64_t rc, rows, cols;
    const int64_t *d = in->d;
    switch ((regc_kernel)k) {
    case K_FILL: need(&r, 0, dim(&r, 0), F32); break;
    case K_COPY:
    case K_COPY_D2H:
    case K_COPY_H2D: need(&r, 0, dim(&r, 0), 1), need(&r, 1, dim(&r, 0), 1); break;
    case K_COPY_2D: /* dst, src; rows, cols, ld_dst, ld_src */
        rows = dim(&r, 0), cols = dim(&r, 1);
        need(&r, 0, span(&r, rows, dim(&r, 2), cols), F32);
        need(&r, 1, span(&r, rows, dim(&r, 3), cols), F32);
        break;
    case K_TRANSPOSE: {
        int64_t n = 1;
        unsigned seen = 0;
        if (d[0] < 1 || d[0] > REGC_MAX_DIMS) {
            fail(&r, "transpose rank out of range");
            break;
        }
        for (int i = 0; i < d[0]; i++) {
            n = mul(&r, n, dim(&r, 1 + i));
            if (in->perm[i] < 0 || in->perm[i] >= d[0] || (seen >> in->perm[i] & 1))
                fail(&r, "transpose axes are not a permutation");
            else
                seen |= 1u << in->perm[i];
        }
        need(&r, 0, n, F32), need(&r, 1, n, F32);
        break;
    }
    case K_GEMM: gemm_rule(&r); break;
    case K_EMBED_FWD: /* out, ids, table: a row per id, each id below the model's vocabulary */
        rows = dim(&r, 0), cols = dim(&r, 1);
        need(&r, 0, mul(&r, rows, cols), F32), need(&r, 1, rows, 4), need(&r, 2, cols, F32);
        e->ids = 1u << 1;
        break;
    case K_EMBED_BWD: /* dtable [vocab, cols], ids, dout; ids checked against vocab */
        rows = dim(&r, 0), cols = dim(&r, 1);
        if (dim(&r, 3) > dim(&r, 2))
            fail(&r, "embedding_bwd's padding id is outside the vocabulary");
        need(&r, 0, mul(&r, dim(&r, 2), cols), F32), need(&r, 1, rows, 4);
        need(&r, 2, mul(&r, rows, cols), F32);
        e->ids = 1u << 1;
        break;
    case K_ADD:
        for (int i = 0; i < 3; i++)
            need(&r, i, dim(&r, 0), F32);
        break;
    case K_BIAS_ADD:
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, rc, F32), need(&r, 2, cols, F32);
        break;
    case K_SUM_ROWS:
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, cols, F32), need(&r, 1, rc, F32);
        break;
    case K_ROW_SUM: /* out [rows], x */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rows, F32), need(&r, 1, rc, F32);
        break;
    case K_SOFTMAX: /* y, lse [rows], x */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, rows, F32), need(&r, 2, rc, F32);
        break;
    case K_LN_FWD: /* y, mean, rstd, x, w, b */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, rows, F32), need(&r, 2, rows, F32);
        need(&r, 3, rc, F32), need(&r, 4, cols, F32), need(&r, 5, cols, F32);
        break;
    case K_LN_BWD: /* dx, dw, db, dy, x, w, mean, rstd */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, cols, F32), need(&r, 2, cols, F32);
        need(&r, 3, rc, F32), need(&r, 4, rc, F32), need(&r, 5, cols, F32);
        need(&r, 6, rows, F32), need(&r, 7, rows, F32);
        break;
    case K_RMS_FWD: /* y, rstd, x, w */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, rows, F32), need(&r, 2, rc, F32);
        need(&r, 3, cols, F32);
        break;
    case K_RMS_BWD: /* dx, dw, dy, x, w, rstd */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, cols, F32), need(&r, 2, rc, F32);
        need(&r, 3, rc, F32), need(&r, 4, cols, F32), need(&r, 5, rows, F32);
        break;
    case K_ROPE: { /* y, x [batch, t, heads x head_dim]; cos, sin [t, rot / 2] (d5: rot) */
        int64_t b = dim(&r, 0), t = dim(&r, 1), h = dim(&r, 2), hd = dim(&r, 3), rot = d[5];
        if (t < 1 || h < 1 || h > INT32_MAX || hd < 2 || hd > INT32_MAX || rot < 2 || rot % 2 ||
            rot > hd || (d[4] != 0 && d[4] != 1))
            fail(&r, "inconsistent rotary shape");
        int64_t n = mul(&r, mul(&r, b, t), mul(&r, h, hd));
        need(&r, 0, n, F32), need(&r, 1, n, F32);
        need(&r, 2, mul(&r, t, rot / 2), F32), need(&r, 3, mul(&r, t, rot / 2), F32);
        break;
    }
    case K_UNARY:
    case K_BINARY:
        if (!(k == K_UNARY ? unary_op : binary_op)(in->unary))
            fail(&r, "an elementwise op of the other kind");
        for (int i = 0; i < in->n_refs; i++)
            need(&r, i, dim(&r, 0), F32);
        break;
    case K_DROPOUT: /* y, x [n]; the site [1] and the draw [4], int32 inputs */
        need(&r, 0, dim(&r, 0), F32), need(&r, 1, dim(&r, 0), F32);
        need(&r, 2, 1, 4), need(&r, 3, 4, 4);
        if (!(in->f >= 0.0f && in->f < 1.0f))
            fail(&r, "dropout's p is outside [0, 1)");
        e->ids = 1u << 2 | 1u << 3;
        break;
    case K_ATTN_FWD: attention_rule(&r, 0); break;
    case K_ATTN_BWD: attention_rule(&r, 1); break;
    case K_CE_FWD: /* loss [1], lse, logits, targets: each target below cols */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, 1, F32), need(&r, 1, rows, F32), need(&r, 2, rc, F32), need(&r, 3, rows, 4);
        e->ids = 1u << 3;
        break;
    case K_CE_BWD: /* dlogits, dloss [1], logits, targets [all], lse; rows from d2 of all */
        norm_sizes(&r, &rc, &rows, &cols);
        if (d[2] < 0 || d[3] < 1 || d[3] > SIZE_LIMIT || d[2] > d[3] - rows)
            fail(&r, "rows outside the loss's");
        need(&r, 0, rc, F32), need(&r, 1, 1, F32), need(&r, 2, rc, F32);
        need(&r, 3, d[3], 4), need(&r, 4, rows, F32);
        e->ids = 1u << 3;
        break;
    case K_CE_ROWS: /* lse, picked, logits, targets */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rows, F32), need(&r, 1, rows, F32), need(&r, 2, rc, F32), need(&r, 3, rows, 4);
        e->ids = 1u << 3;
        break;
    case K_CE_LOSS: /* loss [1], lse, picked, targets */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, 1, F32), need(&r, 1, rows, F32), need(&r, 2, rows, F32), need(&r, 3, rows, 4);
        e->ids = 1u << 3;
        break;
    case K_EW: ew_rule(&r); break;
    case K_ADD_LN_FWD: /* sum, y, mean, rstd, a, b, w, bias */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, rc, F32), need(&r, 2, rows, F32);
        need(&r, 3, rows, F32), need(&r, 4, rc, F32), need(&r, 5, rc, F32);
        need(&r, 6, cols, F32), need(&r, 7, cols, F32);
        break;
    case K_ADD_RMS_FWD: /* sum, y, rstd, a, b, w */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, rc, F32), need(&r, 2, rows, F32);
        need(&r, 3, rc, F32), need(&r, 4, rc, F32), need(&r, 5, cols, F32);
        break;
    case K_LN_BWD_ADD: /* dx, dw, db, dres, dy, x, w, mean, rstd */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, cols, F32), need(&r, 2, cols, F32);
        need(&r, 3, rc, F32), need(&r, 4, rc, F32), need(&r, 5, rc, F32);
        need(&r, 6, cols, F32), need(&r, 7, rows, F32), need(&r, 8, rows, F32);
        break;
    case K_RMS_BWD_ADD: /* dx, dw, dres, dy, x, w, rstd */
        norm_sizes(&r, &rc, &rows, &cols);
        need(&r, 0, rc, F32), need(&r, 1, cols, F32), need(&r, 2, rc, F32);
        need(&r, 3, rc, F32), need(&r, 4, rc, F32), need(&r, 5, cols, F32);
        need(&r, 6, rows, F32);
        break;
    case K_STEP_SCHEDULE:
    case K_GRAD_CLIP: need(&r, 0, (int64_t)sizeof(regc_step_scalars), 1); break;
    case K_GRAD_SUMSQ: /* scalars, g */
        need(&r, 0, (int64_t)sizeof(regc_step_scalars), 1), need(&r, 1, dim(&r, 0), F32);
        break;
    case K_ADAMW: /* param, m, v, g, scalars */
        for (int i = 0; i < 4; i++)
            need(&r, i, dim(&r, 0), F32);
        need(&r, 4, (int64_t)sizeof(regc_step_scalars), 1);
        break;
    case K_ALLREDUCE:
    case K_ALLGATHER:
    case K_REDUCE_SCATTER: collective_rule(&r, k, ranks); break;
    case K_COMM_WAIT: /* names the buffers of the collective or copy it waits for */
        if (d[1] != K_ALLGATHER && d[1] != K_REDUCE_SCATTER && d[1] != K_ALLREDUCE &&
            d[1] != K_COPY_D2H && d[1] != K_COPY_H2D)
            fail(&r, "a wait for something that is not an asynchronous collective or copy");
        else if (in->n_refs != arity[d[1]].n_refs || in->n_out != arity[d[1]].n_out)
            fail(&r, "a wait's operands differ from its collective's");
        else if (d[1] == K_COPY_D2H || d[1] == K_COPY_H2D)
            need(&r, 0, dim(&r, 0), 1), need(&r, 1, dim(&r, 0), 1);
        else
            collective_rule(&r, (int)d[1], ranks);
        break;
    case K_COUNT: break;
    }
    if (in->signal && k != K_ALLGATHER && k != K_REDUCE_SCATTER && k != K_ALLREDUCE &&
        k != K_COMM_WAIT && k != K_COPY_D2H && k != K_COPY_H2D)
        fail(&r, "a signal on a kernel that is no collective or copy");
    if (k == K_COMM_WAIT && in->signal < 1)
        fail(&r, "a wait without a signal");
    /* an operand held in bf16 spans half the bytes of its fp32 rule, where
     * its kernel reads or writes bf16 at all */
    if (in->bf16_refs >> in->n_refs)
        fail(&r, "a bf16 mark on an absent operand");
    if ((k == K_ALLGATHER || k == K_COMM_WAIT) && regc_instr_ref_bf16(in, 0) && d[0] % 2)
        fail(&r, "a bf16 all-gather of an odd count (its values travel in pairs)");
    for (int i = 0; i < in->n_refs && !r.bad; i++)
        if (regc_instr_ref_bf16(in, i)) {
            if (!regc_instr_bf16_allowed(in, i))
                fail(&r, "an operand held in bf16 that the kernel reads or writes in fp32");
            e->bytes[i] /= 2;
        }
    if (r.bad)
        return regc_error(REGC_ERR_FORMAT, "%s: %s", regc_kernel_name(k), r.why);
    return REGC_OK;
}
