/* autodiff.c — reverse-mode differentiation over the graph IR.
 *
 * Walks the forward nodes from last to first and asks each node's backward
 * rule for the gradients of its inputs, given the gradient of its first
 * output (the other outputs — layernorm's mean and rstd, attention's and
 * cross-entropy's log-sum-exp — are statistics saved for backward, not
 * differentiable values). A tensor read by several nodes receives the sum of
 * their contributions, in the reverse order of the readers. */
#include <stdlib.h>
#include <string.h>

#include "regc_common.h"
#include "regc_graph.h"

typedef struct {
    regc_graph *g;
    int *grad_of;      /* gradient id per forward tensor, -1 if none yet */
    const char *needs; /* needs[t]: t depends on a float input or parameter */
} ad_ctx;

/* Add `contribution` to the gradient of tensor t. */
static int accumulate(ad_ctx *c, int t, int contribution)
{
    if (contribution < 0)
        return contribution;
    if (!c->needs[t])
        return REGC_OK;
    if (c->grad_of[t] < 0) {
        c->grad_of[t] = contribution;
        return REGC_OK;
    }
    int sum = regc_graph_add(c->g, c->grad_of[t], contribution);
    if (sum < 0)
        return sum;
    c->grad_of[t] = sum;
    return REGC_OK;
}

/* `x` reshaped to tensor t's shape when the two differ (matmul operands are
 * seen as matrices, so their gradients may come back flattened). */
static int as_shape_of(ad_ctx *c, int x, int t)
{
    if (x < 0)
        return x;
    const regc_tensor *want = regc_graph_tensor(c->g, t), *have = regc_graph_tensor(c->g, x);
    int same = want->ndim == have->ndim;
    for (int i = 0; same && i < want->ndim; i++)
        same = want->shape[i] == have->shape[i];
    if (same)
        return x;
    int64_t shape[REGC_MAX_DIMS];
    memcpy(shape, want->shape, sizeof shape);
    return regc_graph_reshape(c->g, x, want->ndim, shape);
}

static int node_n(ad_ctx *c, regc_op op, const regc_attrs *a, int n_in, const int *in, int n_out,
                  int *out)
{
    int rc = regc_graph_add_node(c->g, op, a, n_in, in, n_out, out, 0, NULL);
    return rc < 0 ? rc : REGC_OK;
}

/* Y = op_a(A) op_b(B): each operand's gradient is one more matmul. */
static int matmul_rule(ad_ctx *c, const regc_node *n, int dy)
{
    int a = n->in[0], b = n->in[1], ta = n->attrs.trans_a, tb = n->attrs.trans_b;
    int da = -1, db = -1;
    if (c->needs[a]) {
        if (!ta) /* dA = dY op_b(B)^T */
            da = regc_graph_matmul(c->g, dy, b, 0, !tb);
        else /* A^T is used: dA = op_b(B) dY^T */
            da = tb ? regc_graph_matmul(c->g, b, dy, 1, 1) : regc_graph_matmul(c->g, b, dy, 0, 1);
        if (accumulate(c, a, as_shape_of(c, da, a)))
            return REGC_ERR_SHAPE;
    }
    if (c->needs[b]) {
        if (!tb) /* dB = op_a(A)^T dY */
            db = regc_graph_matmul(c->g, a, dy, !ta, 0);
        else /* B^T is used: dB = dY^T op_a(A) */
            db = regc_graph_matmul(c->g, dy, a, 1, ta);
        if (accumulate(c, b, as_shape_of(c, db, b)))
            return REGC_ERR_SHAPE;
    }
    return REGC_OK;
}

/* Gradient of the first output of a multi-part op, or zeros when only
 * another part received one. */
static int grad_or_zeros(ad_ctx *c, int t)
{
    if (c->grad_of[t] >= 0)
        return c->grad_of[t];
    const regc_tensor *x = regc_graph_tensor(c->g, t);
    int64_t shape[REGC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    regc_attrs a = {.value = 0.0f};
    int out;
    int rc = regc_graph_add_node(c->g, REGC_OP_FILL, &a, 0, NULL, 1, &out, x->ndim, shape);
    return rc < 0 ? rc : out;
}

/* A gradient x of a's shape brought to tensor t's: summed along the rows t
 * was broadcast along (a row's statistic [..., 1]), or over the leading
 * dimensions it was broadcast over (BIAS_ADD's bias, SUB's, DIV's or
 * MUL's trailing operand). */
static int reduce_to(ad_ctx *c, int x, int t)
{
    if (x < 0)
        return x;
    const regc_tensor *want = regc_graph_tensor(c->g, t), *have = regc_graph_tensor(c->g, x);
    int same = want->ndim == have->ndim, row = same && want->ndim >= 1;
    for (int d = 0; same && d < want->ndim; d++) {
        same = want->shape[d] == have->shape[d];
        row = row && (d + 1 < want->ndim ? same : want->shape[d] == 1);
    }
    if (same)
        return x;
    if (row)
        return regc_graph_sum_last(c->g, x);
    int out;
    int rc =
        regc_graph_add_node(c->g, REGC_OP_SUM_ROWS, NULL, 1, &x, 1, &out, want->ndim, want->shape);
    return rc < 0 ? rc : out;
}

/* One backward rule per forward op. dy is the gradient of n->out[0]. */
static int backward_rule(ad_ctx *c, const regc_node *n, int dy)
{
    regc_graph *g = c->g;
    const int *in = n->in;
    int out[REGC_MAX_IO];
    switch (n->op) {
    case REGC_OP_EMBEDDING: {
        regc_attrs a = {.vocab = regc_graph_tensor(g, in[1])->shape[0],
                        .padded = n->attrs.padded,
                        .padding_idx = n->attrs.padding_idx};
        if (node_n(c, REGC_OP_EMBEDDING_BWD, &a, 2, (int[]){dy, in[0]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[1], out[0]);
    }
    case REGC_OP_ADD:
        if (accumulate(c, in[0], dy))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[1], dy);
    case REGC_OP_BIAS_ADD:
        if (accumulate(c, in[0], dy))
            return REGC_ERR_SHAPE;
        return c->needs[in[1]] ? accumulate(c, in[1], reduce_to(c, dy, in[1])) : REGC_OK;
    case REGC_OP_SUB:
        if (accumulate(c, in[0], dy))
            return REGC_ERR_SHAPE;
        return c->needs[in[1]] ? accumulate(c, in[1], reduce_to(c, regc_graph_neg(g, dy), in[1]))
                               : REGC_OK;
    case REGC_OP_DIV: {
        /* y = a / b: da = dy / b, db = -(dy y) / b */
        if (c->needs[in[0]] && accumulate(c, in[0], regc_graph_div(g, dy, in[1])))
            return REGC_ERR_SHAPE;
        if (!c->needs[in[1]])
            return REGC_OK;
        int t = regc_graph_div(g, regc_graph_mul(g, dy, n->out[0]), in[1]);
        return accumulate(c, in[1], reduce_to(c, regc_graph_neg(g, t), in[1]));
    }
    case REGC_OP_NEG: return accumulate(c, in[0], regc_graph_neg(g, dy));
    case REGC_OP_ADD_SCALAR: return accumulate(c, in[0], dy);
    case REGC_OP_EXP: return accumulate(c, in[0], regc_graph_mul(g, dy, n->out[0]));
    case REGC_OP_TANH:
        if (node_n(c, REGC_OP_TANH_BWD, NULL, 2, (int[]){dy, n->out[0]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    case REGC_OP_RSQRT: {
        /* y = x^-1/2: dx = -1/2 y^3 dy */
        int y3 = regc_graph_scale(g, regc_graph_pow(g, n->out[0], 3.0f), -0.5f);
        return accumulate(c, in[0], regc_graph_mul(g, dy, y3));
    }
    case REGC_OP_POW: {
        /* dx = p x^(p-1) dy; a constant x^0 has none */
        const float p = n->attrs.value;
        if (p == 0.0f)
            return REGC_OK;
        int d = regc_graph_scale(g, regc_graph_pow(g, in[0], p - 1.0f), p);
        return accumulate(c, in[0], regc_graph_mul(g, dy, d));
    }
    case REGC_OP_LAYERNORM:
        if (node_n(c, REGC_OP_LAYERNORM_BWD, NULL, 5,
                   (int[]){dy, in[0], in[1], n->out[1], n->out[2]}, 3, out))
            return REGC_ERR_SHAPE;
        for (int i = 0; i < 3; i++)
            if (accumulate(c, in[i], out[i]))
                return REGC_ERR_SHAPE;
        return REGC_OK;
    case REGC_OP_MATMUL: return matmul_rule(c, n, dy);
    case REGC_OP_GELU:
        if (node_n(c, REGC_OP_GELU_BWD, NULL, 2, (int[]){dy, in[0]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    case REGC_OP_SPLIT: {
        int parts[REGC_MAX_IO];
        for (int i = 0; i < n->n_out; i++)
            if ((parts[i] = grad_or_zeros(c, n->out[i])) < 0)
                return parts[i];
        return accumulate(c, in[0], regc_graph_concat(g, n->n_out, parts));
    }
    case REGC_OP_CONCAT: {
        /* equal parts: one split; otherwise each part's window */
        const regc_tensor *y = regc_graph_tensor(g, n->out[0]);
        const int axis = y->ndim - 1;
        int equal = 1;
        for (int i = 1; i < n->n_in; i++)
            equal &= regc_graph_tensor(g, in[i])->shape[axis] ==
                     regc_graph_tensor(g, in[0])->shape[axis];
        if (equal && regc_graph_split(g, dy, n->n_in, out))
            return REGC_ERR_SHAPE;
        int64_t start = 0;
        for (int i = 0; i < n->n_in; i++) {
            const int64_t len = regc_graph_tensor(g, in[i])->shape[axis];
            if (!equal)
                out[i] = regc_graph_slice(g, dy, axis, start, len);
            start += len;
            if (accumulate(c, in[i], out[i]))
                return REGC_ERR_SHAPE;
        }
        return REGC_OK;
    }
    case REGC_OP_ATTENTION: {
        /* with a score bias the backward reads it and returns its gradient
         * as a 4th output; with dropout it reads the site and draw, to draw
         * the same mask (they get no gradient) */
        regc_attn_slots at;
        if (regc_attn_slots_of(n->op, &n->attrs, n->n_in, &at))
            return REGC_ERR_SHAPE;
        const int has_bias = at.bias >= 0;
        int bwd_in[10] = {dy, in[0], in[1], in[2], n->out[0], n->out[1]}, n_bwd = 6;
        if (has_bias)
            bwd_in[n_bwd++] = in[at.bias];
        if (at.site >= 0)
            bwd_in[n_bwd++] = in[at.site], bwd_in[n_bwd++] = in[at.draw];
        if (at.docs >= 0) /* where each query's document starts; no gradient */
            bwd_in[n_bwd++] = in[at.docs];
        if (node_n(c, REGC_OP_ATTENTION_BWD, &n->attrs, n_bwd, bwd_in, 3 + has_bias, out))
            return REGC_ERR_SHAPE;
        for (int i = 0; i < 3 + has_bias; i++)
            if (accumulate(c, in[i], out[i]))
                return REGC_ERR_SHAPE;
        return REGC_OK;
    }
    case REGC_OP_RMSNORM:
        if (node_n(c, REGC_OP_RMSNORM_BWD, NULL, 4, (int[]){dy, in[0], in[1], n->out[1]}, 2, out))
            return REGC_ERR_SHAPE;
        for (int i = 0; i < 2; i++)
            if (accumulate(c, in[i], out[i]))
                return REGC_ERR_SHAPE;
        return REGC_OK;
    case REGC_OP_ROPE: {
        /* A rotation's transpose is the rotation by the opposite angle: the
         * same op with sin negated. cos and sin are position tables (graph
         * inputs or constants shared by every layer), never trained, so
         * they get no contribution: their gradient stays absent. */
        regc_attrs a = n->attrs;
        a.inverse = !a.inverse;
        if (node_n(c, REGC_OP_ROPE, &a, 3, (int[]){dy, in[1], in[2]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    }
    case REGC_OP_SILU:
        if (node_n(c, REGC_OP_SILU_BWD, NULL, 2, (int[]){dy, in[0]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    case REGC_OP_GELU_ERF:
        if (node_n(c, REGC_OP_GELU_ERF_BWD, NULL, 2, (int[]){dy, in[0]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    case REGC_OP_RELU:
        if (node_n(c, REGC_OP_RELU_BWD, NULL, 2, (int[]){dy, in[0]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    case REGC_OP_SCALE:
        /* linear: the transpose of a scaling is the same scaling */
        return accumulate(c, in[0], regc_graph_scale(g, dy, n->attrs.value));
    case REGC_OP_MUL:
        /* d(a b) = dy b da + dy a db; each side only where it is needed,
         * a broadcast b's summed back to its shape */
        if (c->needs[in[0]] && accumulate(c, in[0], regc_graph_mul(g, dy, in[1])))
            return REGC_ERR_SHAPE;
        if (c->needs[in[1]] &&
            accumulate(c, in[1], reduce_to(c, regc_graph_mul(g, dy, in[0]), in[1])))
            return REGC_ERR_SHAPE;
        return REGC_OK;
    case REGC_OP_SOFTMAX: {
        /* dx = y (dy - sum(dy y)), the sum along the row */
        const int y = n->out[0];
        int s = regc_graph_sum_last(g, regc_graph_mul(g, dy, y));
        return accumulate(c, in[0], regc_graph_mul(g, y, regc_graph_sub(g, dy, s)));
    }
    case REGC_OP_LOG_SOFTMAX: {
        /* dx = dy - exp(y) sum(dy), the sum along the row */
        const int y = n->out[0];
        int s = regc_graph_sum_last(g, dy);
        return accumulate(c, in[0],
                          regc_graph_sub(g, dy, regc_graph_mul(g, regc_graph_exp(g, y), s)));
    }
    case REGC_OP_SUM_LAST:
    case REGC_OP_MEAN_LAST: {
        const regc_tensor *x = regc_graph_tensor(g, in[0]);
        const int64_t cols = x->shape[x->ndim - 1];
        int d = regc_graph_expand(g, dy, cols);
        if (n->op == REGC_OP_MEAN_LAST)
            d = regc_graph_scale(g, d, (float)(1.0 / (double)cols));
        return accumulate(c, in[0], d);
    }
    case REGC_OP_EXPAND: return accumulate(c, in[0], regc_graph_sum_last(g, dy));
    case REGC_OP_DROPOUT: {
        /* the same mask: the same site and draw */
        if (node_n(c, REGC_OP_DROPOUT, &n->attrs, 3, (int[]){dy, in[1], in[2]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    }
    case REGC_OP_MASKED_FILL: {
        /* the filled places pass nothing back; the mask is not differentiable */
        regc_attrs a = {.value = 0.0f};
        if (node_n(c, REGC_OP_MASKED_FILL, &a, 2, (int[]){dy, in[1]}, 1, out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    }
    case REGC_OP_SLICE: {
        const regc_tensor *x = regc_graph_tensor(g, in[0]);
        int rc =
            regc_graph_add_node(g, REGC_OP_SLICE_BWD, &n->attrs, 1, &dy, 1, out, x->ndim, x->shape);
        return rc < 0 ? rc : accumulate(c, in[0], out[0]);
    }
    case REGC_OP_RESHAPE: return accumulate(c, in[0], as_shape_of(c, dy, in[0]));
    case REGC_OP_TRANSPOSE: {
        int inverse[REGC_MAX_DIMS] = {0};
        for (int i = 0; i < regc_graph_tensor(g, in[0])->ndim; i++)
            inverse[n->attrs.perm[i]] = i;
        return accumulate(c, in[0], regc_graph_transpose(g, dy, inverse));
    }
    case REGC_OP_CROSS_ENTROPY:
        if (node_n(c, REGC_OP_CROSS_ENTROPY_BWD, NULL, 4, (int[]){dy, in[0], in[1], n->out[1]}, 1,
                   out))
            return REGC_ERR_SHAPE;
        return accumulate(c, in[0], out[0]);
    default:
        return regc_error(REGC_ERR_UNSUPPORTED, "autodiff: op %s has no backward rule",
                          regc_op_name(n->op));
    }
}

void regc_autodiff_needs(const regc_graph *g, int n_tensors, int n_nodes, const char *leaf_needs,
                         char *needs)
{
    for (int t = 0; t < n_tensors; t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        needs[t] =
            x->role != REGC_ROLE_ACT && x->dtype != REGC_I32 && (!leaf_needs || leaf_needs[t]);
    }
    for (int i = 0; i < n_nodes; i++) {
        const regc_node *n = regc_graph_node(g, i);
        char any = 0;
        for (int k = 0; k < n->n_in; k++)
            any |= needs[n->in[k]];
        for (int k = 0; k < n->n_out; k++)
            needs[n->out[k]] = any && regc_graph_tensor(g, n->out[k])->dtype != REGC_I32;
    }
}

/* The forward graph is the first n_tensors tensors and n_nodes nodes. */
static int vjp(regc_graph *g, int n_tensors, int n_nodes, int n_seeds, const int *ys,
               const int *dys, const char *leaf_needs, int *grad_of)
{
    for (int i = 0; i < n_seeds; i++) {
        const regc_tensor *ty = regc_graph_tensor(g, ys[i]), *tdy = regc_graph_tensor(g, dys[i]);
        if (!ty || !tdy || ys[i] >= n_tensors)
            return regc_error(REGC_ERR_ARG, "autodiff: no tensor %d", ty ? dys[i] : ys[i]);
        if (ty->ndim != tdy->ndim || regc_tensor_numel(ty) != regc_tensor_numel(tdy))
            return regc_error(REGC_ERR_SHAPE, "autodiff: gradient %s does not match %s", tdy->name,
                              ty->name);
    }
    char *needs = calloc((size_t)n_tensors, 1);
    char *seeded = calloc((size_t)n_tensors, 1);
    if (!needs || !seeded) {
        free(needs), free(seeded);
        return regc_error(REGC_ERR_MEMORY, "autodiff: out of memory");
    }
    regc_autodiff_needs(g, n_tensors, n_nodes, leaf_needs, needs);
    for (int t = 0; t < n_tensors; t++)
        grad_of[t] = -1;
    for (int i = 0; i < n_seeds; i++) {
        grad_of[ys[i]] = dys[i];
        seeded[ys[i]] = 1;
    }
    ad_ctx c = {.g = g, .grad_of = grad_of, .needs = needs};
    int rc = REGC_OK;
    for (int i = n_nodes - 1; i >= 0 && rc == REGC_OK; i--) {
        /* copy: adding nodes may move the node array */
        regc_node n = *regc_graph_node(g, i);
        for (int k = 1; k < n.n_out && n.op != REGC_OP_SPLIT; k++)
            if (grad_of[n.out[k]] >= 0 && !seeded[n.out[k]])
                rc = regc_error(
                    REGC_ERR_UNSUPPORTED,
                    "autodiff: %s output %d (%s) is a saved statistic, not differentiable",
                    regc_op_name(n.op), k, regc_graph_tensor(g, n.out[k])->name);
        int has_grad = 0;
        for (int k = 0; k < n.n_out; k++)
            has_grad |= grad_of[n.out[k]] >= 0;
        if (rc == REGC_OK && has_grad) {
            int d0 = grad_of[n.out[0]];
            if (d0 < 0 && n.op != REGC_OP_SPLIT)
                continue;
            rc = backward_rule(&c, &n, d0);
        }
    }
    free(needs);
    free(seeded);
    return rc;
}

int regc_autodiff_seeded(regc_graph *g, int n_tensors, int n_nodes, int n_seeds, const int *ys,
                         const int *dys, const char *leaf_needs, int *grad_of)
{
    return vjp(g, n_tensors, n_nodes, n_seeds, ys, dys, leaf_needs, grad_of);
}

int regc_autodiff_vjp(regc_graph *g, int y, int dy, int *grad_of)
{
    return vjp(g, regc_graph_n_tensors(g), regc_graph_n_nodes(g), 1, &y, &dy, NULL, grad_of);
}

int regc_autodiff_loss(regc_graph *g, int loss, int *grad_of)
{
    const regc_tensor *t = regc_graph_tensor(g, loss);
    if (!t)
        return regc_error(REGC_ERR_ARG, "autodiff: no loss tensor %d", loss);
    if (t->ndim != 0)
        return regc_error(REGC_ERR_SHAPE, "autodiff: loss %s is not a scalar", t->name);
    int n_tensors = regc_graph_n_tensors(g), n_nodes = regc_graph_n_nodes(g);
    regc_attrs one = {.value = 1.0f};
    int dloss;
    int rc = regc_graph_add_node(g, REGC_OP_FILL, &one, 0, NULL, 1, &dloss, 0, NULL);
    if (rc < 0)
        return rc;
    /* the FILL node belongs to backward: grad_of covers the tensors before it */
    return vjp(g, n_tensors, n_nodes, 1, &loss, &dloss, NULL, grad_of);
}
