/* graph_shapes.c — the shape rule of every op: given its inputs and
 * attributes, check them (naming the op and the tensor that does not fit)
 * and give each output's shape and dtype. regc_graph_add_node (graph.c)
 * asks it before a node exists, so a graph holds only nodes whose shapes
 * agree; the comment beside each op in regc_graph.h says the rule. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph_internal.h"

static void spec_like(out_spec *o, const regc_tensor *t)
{
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    memcpy(o->shape, t->shape, sizeof o->shape);
}

static void spec_set(out_spec *o, regc_dtype dtype, int ndim, const int64_t *shape)
{
    o->dtype = dtype;
    o->ndim = ndim;
    memset(o->shape, 0, sizeof o->shape);
    for (int i = 0; i < ndim; i++)
        o->shape[i] = shape[i];
}

static int same_shape(const regc_tensor *a, const regc_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

const char *regc_shape_str(const regc_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

static int64_t last_dim(const regc_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
static int64_t rows_of(const regc_tensor *t) { return regc_tensor_numel(t) / last_dim(t); }

/* Error helper: "<op>: <tensor> <shape>: <what>" */
static int bad(regc_op op, const regc_tensor *t, const char *what)
{
    char s[128];
    return regc_error(REGC_ERR_SHAPE, "%s: tensor %s %s: %s", regc_op_name(op), t->name,
                      regc_shape_str(t, s, sizeof s), what);
}

static int want_dtype(regc_op op, const regc_tensor *t, regc_dtype d)
{
    if (t->dtype == d)
        return REGC_OK;
    char what[64];
    snprintf(what, sizeof what, "dtype %s, expected %s", regc_dtype_name(t->dtype),
             regc_dtype_name(d));
    return bad(op, t, what);
}

/* t must have exactly the given shape */
static int want_shape(regc_op op, const regc_tensor *t, int ndim, const int64_t *shape)
{
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (ok)
        return REGC_OK;
    regc_tensor want = {.ndim = ndim};
    for (int i = 0; i < ndim; i++)
        want.shape[i] = shape[i];
    char s[128], what[160];
    snprintf(what, sizeof what, "expected shape %s", regc_shape_str(&want, s, sizeof s));
    return bad(op, t, what);
}

static int infer_attention(regc_op op, const regc_attrs *a, const regc_tensor *q,
                           const regc_tensor *k, const regc_tensor *v)
{
    if (a->n_head < 1 || a->n_kv_head < 1 || a->n_head % a->n_kv_head)
        return regc_error(REGC_ERR_SHAPE, "%s: n_head %d is not a multiple of n_kv_head %d",
                          regc_op_name(op), a->n_head, a->n_kv_head);
    if (q->ndim != 3 || q->shape[2] % a->n_head)
        return bad(op, q, "expected [B, T, n_head * head_dim]");
    int64_t d = q->shape[2] / a->n_head;
    int64_t kv[3] = {q->shape[0], k->ndim == 3 ? k->shape[1] : 0, d * a->n_kv_head};
    if (k->ndim != 3 || want_shape(op, k, 3, kv) || want_shape(op, v, 3, kv))
        return k->ndim != 3 ? bad(op, k, "expected [B, T, n_kv_head * head_dim]") : REGC_ERR_SHAPE;
    if (a->causal && k->shape[1] != q->shape[1])
        return bad(op, k, "causal attention needs as many keys as queries");
    if (!(a->softcap >= 0.0f && a->softcap < INFINITY) || a->window < 0 ||
        ((a->window > 0 || a->documents) && !a->causal))
        return regc_error(REGC_ERR_ARG,
                          "%s: softcap %g must be finite and not negative, and a window (%lld) "
                          "or documents need the causal mask",
                          regc_op_name(op), (double)a->softcap, (long long)a->window);
    if (!(a->value >= 0.0f && a->value < 1.0f))
        return regc_error(REGC_ERR_ARG, "%s: dropout %g is outside [0, 1)", regc_op_name(op),
                          (double)a->value);
    return REGC_OK;
}

/* Attention's optional score bias: [n_head, Tq, Tk], shared by the batch. */
static int want_bias(regc_op op, const regc_attrs *a, const regc_tensor *q, const regc_tensor *k,
                     const regc_tensor *bias)
{
    int64_t s[3] = {a->n_head, q->shape[1], k->shape[1]};
    return want_shape(op, bias, 3, s);
}

/* A dropout's site [1] and draw [4] (their dtype is checked with every
 * input's). */
static int want_draw(regc_op op, const regc_tensor *site, const regc_tensor *draw)
{
    if (regc_tensor_numel(site) != 1)
        return bad(op, site, "must be an i32 site [1]");
    if (regc_tensor_numel(draw) != 4)
        return bad(op, draw, "must be the i32 draw [4]");
    return REGC_OK;
}

/* Attention's doc_start: [B, Tq], a document's first position per query. */
static int want_docs(regc_op op, const regc_tensor *q, const regc_tensor *docs)
{
    int64_t s[2] = {q->shape[0], q->shape[1]};
    return want_shape(op, docs, 2, s);
}

/* Is r a row statistic of x: x's shape with the last dimension 1? */
static int is_row_of(const regc_tensor *r, const regc_tensor *x)
{
    if (r->ndim != x->ndim || r->ndim < 1 || r->shape[r->ndim - 1] != 1)
        return 0;
    for (int d = 0; d + 1 < r->ndim; d++)
        if (r->shape[d] != x->shape[d])
            return 0;
    return 1;
}

/* The shape rule of each op: checks the inputs and fills the outputs. */
int regc_graph_infer_outputs(regc_op op, const regc_attrs *a, int n_in, const regc_tensor *const *x,
                             int n_out, out_spec *o, int out_ndim, const int64_t *out_shape)
{
    const char *name = regc_op_name(op);
    int want_in, want_out;
    regc_op_arity(op, &want_in, &want_out);
    if (want_in >= 0 ? n_in != want_in : (n_in < 1 || n_in > REGC_MAX_IO))
        return regc_error(REGC_ERR_ARG, "%s: %d inputs given", name, n_in);
    if (want_out >= 0 ? n_out != want_out : (n_out < 1 || n_out > REGC_MAX_IO))
        return regc_error(REGC_ERR_ARG, "%s: %d outputs requested", name, n_out);
    /* attention's dropout reads its site and draw last */
    regc_attn_slots at = {-1, -1, -1, -1};
    if ((op == REGC_OP_ATTENTION || op == REGC_OP_ATTENTION_BWD) &&
        regc_attn_slots_of(op, a, n_in, &at))
        return REGC_ERR_ARG;
    /* every op but these reads f32 in every slot (ids are read only from
     * the graph's inputs, whose values are checked when they are filled) */
    for (int i = 0; i < n_in; i++) {
        int is_index =
            (op == REGC_OP_EMBEDDING && i == 0) || (op == REGC_OP_EMBEDDING_BWD && i == 1) ||
            (op == REGC_OP_CROSS_ENTROPY && i == 1) ||
            (op == REGC_OP_CROSS_ENTROPY_BWD && i == 2) || (op == REGC_OP_DROPOUT && i > 0) ||
            i == at.site || i == at.draw || i == at.docs;
        if (want_dtype(op, x[i], is_index ? REGC_I32 : REGC_F32))
            return REGC_ERR_SHAPE;
    }
    int64_t s[REGC_MAX_DIMS];
    switch (op) {
    case REGC_OP_EMBEDDING:
        if (x[1]->ndim != 2)
            return bad(op, x[1], "expected a [vocab, C] table");
        if (a->padded && (a->padding_idx < 0 || a->padding_idx >= x[1]->shape[0]))
            return bad(op, x[1], "padding_idx is not one of its rows");
        if (x[0]->ndim + 1 > REGC_MAX_DIMS)
            return bad(op, x[0], "too many dimensions");
        memcpy(s, x[0]->shape, sizeof s);
        s[x[0]->ndim] = x[1]->shape[1];
        spec_set(&o[0], REGC_F32, x[0]->ndim + 1, s);
        return REGC_OK;
    case REGC_OP_ADD:
    case REGC_OP_TANH_BWD:
    case REGC_OP_GELU_BWD:
    case REGC_OP_SILU_BWD:
    case REGC_OP_GELU_ERF_BWD:
    case REGC_OP_RELU_BWD:
        if (!same_shape(x[0], x[1]))
            return bad(op, x[1], "shape differs from the first input");
        spec_like(&o[0], x[0]);
        return REGC_OK;
    case REGC_OP_MASKED_FILL:
    case REGC_OP_SUB:
    case REGC_OP_DIV:
    case REGC_OP_MUL:
    case REGC_OP_BIAS_ADD: {
        if (op == REGC_OP_MASKED_FILL && !isfinite(a->value)) /* JSON has no infinity */
            return regc_error(REGC_ERR_ARG, "%s: value must be finite", name);
        /* b broadcast over a's leading dimensions; SUB, DIV, MUL: or of a's
         * shape, or a row's statistic [..., 1] */
        if (op != REGC_OP_BIAS_ADD && (same_shape(x[0], x[1]) || is_row_of(x[1], x[0]))) {
            spec_like(&o[0], x[0]);
            return REGC_OK;
        }
        int lead = x[0]->ndim - x[1]->ndim;
        if (lead < 0 || x[1]->ndim < 1 || want_shape(op, x[1], x[1]->ndim, x[0]->shape + lead))
            return bad(op, x[1], "is not a trailing part of the input's shape");
        spec_like(&o[0], x[0]);
        return REGC_OK;
    }
    case REGC_OP_LAYERNORM: {
        int64_t c = last_dim(x[0]);
        if (x[0]->ndim < 1 || want_shape(op, x[1], 1, &c) || want_shape(op, x[2], 1, &c))
            return REGC_ERR_SHAPE;
        if (!(a->eps > 0.0f))
            return regc_error(REGC_ERR_ARG, "%s: eps must be positive", name);
        spec_like(&o[0], x[0]);
        spec_set(&o[1], REGC_F32, x[0]->ndim - 1, x[0]->shape);
        spec_set(&o[2], REGC_F32, x[0]->ndim - 1, x[0]->shape);
        return REGC_OK;
    }
    case REGC_OP_MATMUL: {
        if (x[0]->ndim < 1 || x[1]->ndim < 1)
            return bad(op, x[0]->ndim < 1 ? x[0] : x[1], "a scalar is not a matrix");
        int64_t k_a = a->trans_a ? rows_of(x[0]) : last_dim(x[0]);
        int64_t k_b = a->trans_b ? last_dim(x[1]) : rows_of(x[1]);
        int64_t n = a->trans_b ? rows_of(x[1]) : last_dim(x[1]);
        if (k_a != k_b) {
            char sa[128], msg[200];
            snprintf(msg, sizeof msg, "inner dimension %lld does not match %s %s (%lld)",
                     (long long)k_b, x[0]->name, regc_shape_str(x[0], sa, sizeof sa),
                     (long long)k_a);
            return bad(op, x[1], msg);
        }
        if (a->trans_a) {
            int64_t mn[2] = {last_dim(x[0]), n};
            spec_set(&o[0], REGC_F32, 2, mn);
        } else {
            memcpy(s, x[0]->shape, sizeof s);
            s[x[0]->ndim - 1] = n;
            spec_set(&o[0], REGC_F32, x[0]->ndim, s);
        }
        return REGC_OK;
    }
    case REGC_OP_GELU:
    case REGC_OP_SILU:
    case REGC_OP_GELU_ERF:
    case REGC_OP_RELU:
    case REGC_OP_NEG:
    case REGC_OP_EXP:
    case REGC_OP_TANH:
    case REGC_OP_RSQRT: spec_like(&o[0], x[0]); return REGC_OK;
    case REGC_OP_SOFTMAX:
    case REGC_OP_LOG_SOFTMAX:
        if (x[0]->ndim < 1)
            return bad(op, x[0], "a scalar has no last axis");
        spec_like(&o[0], x[0]);
        spec_set(&o[1], REGC_F32, x[0]->ndim - 1, x[0]->shape);
        return REGC_OK;
    case REGC_OP_SUM_LAST:
    case REGC_OP_MEAN_LAST:
        if (x[0]->ndim < 1)
            return bad(op, x[0], "a scalar has no last axis");
        spec_like(&o[0], x[0]);
        o[0].shape[x[0]->ndim - 1] = 1;
        return REGC_OK;
    case REGC_OP_EXPAND: {
        regc_tensor want = {.ndim = out_ndim};
        if (out_ndim == x[0]->ndim && out_ndim >= 1)
            memcpy(want.shape, out_shape, (size_t)out_ndim * sizeof *out_shape);
        if (x[0]->ndim < 1 || out_ndim != x[0]->ndim || want.shape[out_ndim - 1] < 1 ||
            !is_row_of(x[0], &want))
            return bad(op, x[0], "expands only a last dimension of 1, to the output's shape");
        spec_set(&o[0], REGC_F32, out_ndim, out_shape);
        return REGC_OK;
    }
    case REGC_OP_SLICE:
    case REGC_OP_SLICE_BWD: {
        /* SLICE: x is the whole, the output the window; SLICE_BWD the other way */
        const int whole_is_x = op == REGC_OP_SLICE;
        regc_tensor w = {.ndim = out_ndim};
        if (out_ndim == x[0]->ndim && out_ndim >= 1)
            memcpy(w.shape, out_shape, (size_t)out_ndim * sizeof *out_shape);
        const regc_tensor *whole = whole_is_x ? x[0] : &w, *win = whole_is_x ? &w : x[0];
        int ok = out_ndim == x[0]->ndim && a->axis >= 0 && a->axis < out_ndim;
        for (int d = 0; ok && d < out_ndim; d++)
            ok = d == a->axis ? win->shape[d] >= 1 && a->start >= 0 &&
                                    a->start <= whole->shape[d] - win->shape[d]
                              : win->shape[d] == whole->shape[d];
        if (!ok)
            return bad(op, x[0],
                       "the window (axis, start and the output's shape) is not inside it");
        spec_set(&o[0], x[0]->dtype, out_ndim, out_shape);
        return REGC_OK;
    }
    case REGC_OP_DROPOUT:
        if (!(a->value >= 0.0f && a->value < 1.0f))
            return regc_error(REGC_ERR_ARG, "%s: p must be in [0, 1)", name);
        if (want_draw(op, x[1], x[2]))
            return REGC_ERR_SHAPE;
        spec_like(&o[0], x[0]);
        return REGC_OK;
    case REGC_OP_ADD_SCALAR:
    case REGC_OP_POW:
    case REGC_OP_SCALE:
        if (!isfinite(a->value))
            return regc_error(REGC_ERR_ARG, "%s: value must be finite", name);
        spec_like(&o[0], x[0]);
        return REGC_OK;
    case REGC_OP_SPLIT:
        if (x[0]->ndim < 1 || last_dim(x[0]) % n_out)
            return bad(op, x[0], "last dimension does not split evenly");
        for (int i = 0; i < n_out; i++) {
            spec_like(&o[i], x[0]);
            o[i].shape[x[0]->ndim - 1] /= n_out;
        }
        return REGC_OK;
    case REGC_OP_CONCAT: /* on the last axis; the parts may differ there */
        if (x[0]->ndim < 1)
            return bad(op, x[0], "a scalar has no last axis");
        spec_like(&o[0], x[0]);
        for (int i = 1; i < n_in; i++) {
            int same = x[i]->ndim == x[0]->ndim;
            for (int d = 0; same && d + 1 < x[0]->ndim; d++)
                same = x[i]->shape[d] == x[0]->shape[d];
            if (!same)
                return bad(op, x[i], "shape differs from the first input's but in the last axis");
            if (__builtin_add_overflow(o[0].shape[x[0]->ndim - 1], last_dim(x[i]),
                                       &o[0].shape[x[0]->ndim - 1]))
                return bad(op, x[0], "the concatenated axis overflows int64");
        }
        return REGC_OK;
    case REGC_OP_ATTENTION: {
        /* q, k, v, optionally T5's additive score bias, then the dropout's
         * site and draw when it drops */
        if (infer_attention(op, a, x[0], x[1], x[2]) ||
            (at.bias >= 0 && want_bias(op, a, x[0], x[1], x[at.bias])) ||
            (at.site >= 0 && want_draw(op, x[at.site], x[at.draw])) ||
            (at.docs >= 0 && want_docs(op, x[0], x[at.docs])))
            return REGC_ERR_SHAPE;
        if (at.bias >= 0 && a->softcap > 0.0f)
            return regc_error(REGC_ERR_UNSUPPORTED, "%s: a score bias with soft-capping", name);
        spec_like(&o[0], x[0]);
        int64_t lse[3] = {x[0]->shape[0], a->n_head, x[0]->shape[1]};
        spec_set(&o[1], REGC_F32, 3, lse);
        return REGC_OK;
    }
    case REGC_OP_RESHAPE: {
        if (out_ndim < 0 || out_ndim > REGC_MAX_DIMS || !out_shape)
            return regc_error(REGC_ERR_ARG, "%s: no target shape", name);
        /* the target comes from the file: its product may overflow, and a
         * dimension below 1 is refused when the output is made */
        int64_t n = 1;
        for (int i = 0; i < out_ndim; i++)
            if (out_shape[i] < 1 || __builtin_mul_overflow(n, out_shape[i], &n))
                return bad(op, x[0], "the target shape is not a valid shape");
        if (n != regc_tensor_numel(x[0]))
            return bad(op, x[0], "element count differs from the target shape");
        spec_set(&o[0], x[0]->dtype, out_ndim, out_shape);
        return REGC_OK;
    }
    case REGC_OP_TRANSPOSE: {
        int seen = 0;
        for (int i = 0; i < x[0]->ndim; i++) {
            int p = a->perm[i];
            if (p < 0 || p >= x[0]->ndim || (seen & (1 << p)))
                return bad(op, x[0], "perm is not a permutation of its axes");
            seen |= 1 << p;
            s[i] = x[0]->shape[p];
        }
        spec_set(&o[0], x[0]->dtype, x[0]->ndim, s);
        return REGC_OK;
    }
    case REGC_OP_CROSS_ENTROPY:
        if (x[0]->ndim < 1 || want_shape(op, x[1], x[0]->ndim - 1, x[0]->shape))
            return REGC_ERR_SHAPE;
        spec_set(&o[0], REGC_F32, 0, NULL);
        spec_set(&o[1], REGC_F32, x[1]->ndim, x[1]->shape);
        return REGC_OK;
    case REGC_OP_RMSNORM: {
        int64_t c = last_dim(x[0]);
        if (x[0]->ndim < 1 || want_shape(op, x[1], 1, &c))
            return x[0]->ndim < 1 ? bad(op, x[0], "a scalar has no last axis") : REGC_ERR_SHAPE;
        if (!(a->eps > 0.0f))
            return regc_error(REGC_ERR_ARG, "%s: eps must be positive", name);
        spec_like(&o[0], x[0]);
        spec_set(&o[1], REGC_F32, x[0]->ndim - 1, x[0]->shape);
        return REGC_OK;
    }
    case REGC_OP_ROPE: {
        if (a->n_head < 1)
            return regc_error(REGC_ERR_ARG, "%s: n_head %d must be positive", name, a->n_head);
        if (a->inverse != 0 && a->inverse != 1)
            return regc_error(REGC_ERR_ARG, "%s: inverse must be 0 or 1", name);
        /* the tables' width is half the part of a head rotated: all of it,
         * or its first part (Phi's, GPT-NeoX's), the rest passing through */
        if (x[0]->ndim != 3 || x[0]->shape[2] % a->n_head)
            return bad(op, x[0], "expected [B, T, n_head * head_dim]");
        int64_t cs[2] = {x[0]->shape[1], x[1]->ndim == 2 ? x[1]->shape[1] : -1};
        if (!(cs[1] >= 1 && 2 * cs[1] <= x[0]->shape[2] / a->n_head))
            return bad(op, x[1], "expected [T, rot_dim / 2] tables, rot_dim within head_dim");
        if (want_shape(op, x[1], 2, cs) || want_shape(op, x[2], 2, cs))
            return REGC_ERR_SHAPE;
        spec_like(&o[0], x[0]);
        return REGC_OK;
    }
    case REGC_OP_RMSNORM_BWD: {
        int64_t c = last_dim(x[1]);
        if (x[1]->ndim < 1 || !same_shape(x[0], x[1]) || want_shape(op, x[2], 1, &c) ||
            want_shape(op, x[3], x[1]->ndim - 1, x[1]->shape))
            return bad(op, x[0], "inputs do not match (dy, x, w, rstd)");
        spec_like(&o[0], x[1]);
        spec_set(&o[1], REGC_F32, 1, &c);
        return REGC_OK;
    }
    case REGC_OP_FILL:
        if (out_ndim < 0 || out_ndim > REGC_MAX_DIMS || (out_ndim > 0 && !out_shape))
            return regc_error(REGC_ERR_ARG, "%s: no target shape", name);
        spec_set(&o[0], REGC_F32, out_ndim, out_shape);
        return REGC_OK;
    case REGC_OP_SUM_ROWS:
        if (out_ndim < 1 || out_ndim > x[0]->ndim || !out_shape)
            return regc_error(REGC_ERR_ARG, "%s: bad target shape", name);
        if (memcmp(out_shape, x[0]->shape + x[0]->ndim - out_ndim,
                   (size_t)out_ndim * sizeof *out_shape) != 0)
            return bad(op, x[0], "target shape is not its trailing part");
        spec_set(&o[0], REGC_F32, out_ndim, out_shape);
        return REGC_OK;
    case REGC_OP_EMBEDDING_BWD:
        if (a->vocab < 1 || x[0]->ndim != x[1]->ndim + 1 ||
            want_shape(op, x[1], x[1]->ndim, x[0]->shape))
            return bad(op, x[0], "does not match the ids' shape plus a width");
        if (a->padded && (a->padding_idx < 0 || a->padding_idx >= a->vocab))
            return regc_error(REGC_ERR_ARG, "%s: padding_idx %lld is not below vocab %lld", name,
                              (long long)a->padding_idx, (long long)a->vocab);
        s[0] = a->vocab;
        s[1] = last_dim(x[0]);
        spec_set(&o[0], REGC_F32, 2, s);
        return REGC_OK;
    case REGC_OP_LAYERNORM_BWD: {
        int64_t c = last_dim(x[1]);
        if (!same_shape(x[0], x[1]) || want_shape(op, x[2], 1, &c) ||
            want_shape(op, x[3], x[1]->ndim - 1, x[1]->shape) ||
            want_shape(op, x[4], x[1]->ndim - 1, x[1]->shape))
            return bad(op, x[0], "inputs do not match (dy, x, w, mean, rstd)");
        spec_like(&o[0], x[1]);
        spec_set(&o[1], REGC_F32, 1, &c);
        spec_set(&o[2], REGC_F32, 1, &c);
        return REGC_OK;
    }
    case REGC_OP_ATTENTION_BWD: {
        /* a forward with a bias reads it again and returns its gradient
         * too; one that drops draws its mask again */
        if (n_out != (at.bias >= 0 ? 4 : 3))
            return regc_error(REGC_ERR_ARG, "%s: %d outputs (3, or 4 with a bias)", name, n_out);
        if (infer_attention(op, a, x[1], x[2], x[3]) ||
            (at.bias >= 0 && want_bias(op, a, x[1], x[2], x[at.bias])) ||
            (at.site >= 0 && want_draw(op, x[at.site], x[at.draw])) ||
            (at.docs >= 0 && want_docs(op, x[1], x[at.docs])))
            return REGC_ERR_SHAPE;
        int64_t lse[3] = {x[1]->shape[0], a->n_head, x[1]->shape[1]};
        if (!same_shape(x[0], x[1]) || !same_shape(x[4], x[1]) || want_shape(op, x[5], 3, lse))
            return bad(op, x[0], "inputs do not match (dout, q, k, v, out, lse)");
        spec_like(&o[0], x[1]);
        spec_like(&o[1], x[2]);
        spec_like(&o[2], x[3]);
        if (n_out == 4)
            spec_like(&o[3], x[at.bias]);
        return REGC_OK;
    }
    case REGC_OP_CROSS_ENTROPY_BWD:
        if (x[0]->ndim != 0 || x[1]->ndim < 1 ||
            want_shape(op, x[2], x[1]->ndim - 1, x[1]->shape) ||
            want_shape(op, x[3], x[1]->ndim - 1, x[1]->shape))
            return bad(op, x[1], "inputs do not match (dloss, logits, targets, lse)");
        spec_like(&o[0], x[1]);
        return REGC_OK;
    case REGC_OP_COUNT: break;
    }
    return regc_error(REGC_ERR_ARG, "unknown op %d", (int)op);
}
