/* graph_build.c — one helper per op for frontends: each adds a node through
 * regc_graph_add_node and returns its first output's id (or a negative
 * status), so a forward pass reads as one line per op. */
#include <stddef.h>
#include <string.h>

#include "regc_common.h"
#include "regc_graph.h"

static int one_output(regc_graph *g, regc_op op, const regc_attrs *a, int n_in, const int *in)
{
    int out[REGC_MAX_IO] = {0};
    int rc = regc_graph_add_node(g, op, a, n_in, in, 1, out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_embedding(regc_graph *g, int ids, int table)
{
    return one_output(g, REGC_OP_EMBEDDING, NULL, 2, (int[]){ids, table});
}

int regc_graph_embedding_padded(regc_graph *g, int ids, int table, int64_t padding_idx)
{
    const regc_attrs a = {.padded = 1, .padding_idx = padding_idx};
    return one_output(g, REGC_OP_EMBEDDING, &a, 2, (int[]){ids, table});
}

int regc_graph_add(regc_graph *g, int a, int b)
{
    return one_output(g, REGC_OP_ADD, NULL, 2, (int[]){a, b});
}

int regc_graph_bias_add(regc_graph *g, int x, int b)
{
    return one_output(g, REGC_OP_BIAS_ADD, NULL, 2, (int[]){x, b});
}

int regc_graph_layernorm(regc_graph *g, int x, int w, int b, float eps)
{
    regc_attrs a = {.eps = eps};
    int out[3] = {0};
    int rc = regc_graph_add_node(g, REGC_OP_LAYERNORM, &a, 3, (int[]){x, w, b}, 3, out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_matmul(regc_graph *g, int a, int b, int trans_a, int trans_b)
{
    regc_attrs at = {.trans_a = trans_a, .trans_b = trans_b};
    return one_output(g, REGC_OP_MATMUL, &at, 2, (int[]){a, b});
}

int regc_graph_gelu(regc_graph *g, int x) { return one_output(g, REGC_OP_GELU, NULL, 1, &x); }

int regc_graph_split(regc_graph *g, int x, int parts, int *out)
{
    int rc = regc_graph_add_node(g, REGC_OP_SPLIT, NULL, 1, &x, parts, out, 0, NULL);
    return rc < 0 ? rc : REGC_OK;
}

int regc_graph_concat(regc_graph *g, int n, const int *xs)
{
    return one_output(g, REGC_OP_CONCAT, NULL, n, xs);
}

int regc_graph_attention(regc_graph *g, int q, int k, int v, int n_head, int n_kv_head, int causal,
                         float scale)
{
    return regc_graph_attention_bias(g, q, k, v, -1, n_head, n_kv_head, causal, scale);
}

int regc_graph_attention_full(regc_graph *g, int q, int k, int v, int bias, int site, int draw,
                              int docs, const regc_attrs *a)
{
    int in[7] = {q, k, v}, n = 3, out[2] = {0};
    regc_attrs with = *a;
    with.documents = docs >= 0;
    if (bias >= 0)
        in[n++] = bias;
    if (a->value > 0.0f)
        in[n++] = site, in[n++] = draw;
    if (docs >= 0)
        in[n++] = docs;
    int rc = regc_graph_add_node(g, REGC_OP_ATTENTION, &with, n, in, 2, out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_reshape(regc_graph *g, int x, int ndim, const int64_t *shape)
{
    int out[1] = {0};
    int rc = regc_graph_add_node(g, REGC_OP_RESHAPE, NULL, 1, &x, 1, out, ndim, shape);
    return rc < 0 ? rc : out[0];
}

int regc_graph_transpose(regc_graph *g, int x, const int *perm)
{
    regc_attrs a = {0};
    const regc_tensor *t = regc_graph_tensor(g, x);
    for (int i = 0; t && i < t->ndim; i++)
        a.perm[i] = perm[i];
    return one_output(g, REGC_OP_TRANSPOSE, &a, 1, &x);
}

int regc_graph_cross_entropy(regc_graph *g, int logits, int targets)
{
    int out[2] = {0};
    int rc = regc_graph_add_node(g, REGC_OP_CROSS_ENTROPY, NULL, 2, (int[]){logits, targets}, 2,
                                 out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_attention_bias(regc_graph *g, int q, int k, int v, int bias, int n_head,
                              int n_kv_head, int causal, float scale)
{
    const regc_attrs a = {
        .n_head = n_head, .n_kv_head = n_kv_head, .causal = causal, .scale = scale};
    return regc_graph_attention_full(g, q, k, v, bias, -1, -1, -1, &a);
}

int regc_graph_rmsnorm(regc_graph *g, int x, int w, float eps)
{
    regc_attrs a = {.eps = eps};
    int out[2] = {0};
    int rc = regc_graph_add_node(g, REGC_OP_RMSNORM, &a, 2, (int[]){x, w}, 2, out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_rope(regc_graph *g, int x, int cos, int sin, int n_head)
{
    regc_attrs a = {.n_head = n_head};
    return one_output(g, REGC_OP_ROPE, &a, 3, (int[]){x, cos, sin});
}

int regc_graph_silu(regc_graph *g, int x) { return one_output(g, REGC_OP_SILU, NULL, 1, &x); }

int regc_graph_mul(regc_graph *g, int a, int b)
{
    return one_output(g, REGC_OP_MUL, NULL, 2, (int[]){a, b});
}

int regc_graph_gelu_erf(regc_graph *g, int x)
{
    return one_output(g, REGC_OP_GELU_ERF, NULL, 1, &x);
}

int regc_graph_relu(regc_graph *g, int x) { return one_output(g, REGC_OP_RELU, NULL, 1, &x); }

int regc_graph_scale(regc_graph *g, int x, float value)
{
    regc_attrs a = {.value = value};
    return one_output(g, REGC_OP_SCALE, &a, 1, &x);
}

int regc_graph_sub(regc_graph *g, int a, int b)
{
    return one_output(g, REGC_OP_SUB, NULL, 2, (int[]){a, b});
}

int regc_graph_div(regc_graph *g, int a, int b)
{
    return one_output(g, REGC_OP_DIV, NULL, 2, (int[]){a, b});
}

int regc_graph_neg(regc_graph *g, int x) { return one_output(g, REGC_OP_NEG, NULL, 1, &x); }

int regc_graph_add_scalar(regc_graph *g, int x, float value)
{
    regc_attrs a = {.value = value};
    return one_output(g, REGC_OP_ADD_SCALAR, &a, 1, &x);
}

int regc_graph_exp(regc_graph *g, int x) { return one_output(g, REGC_OP_EXP, NULL, 1, &x); }

int regc_graph_tanh(regc_graph *g, int x) { return one_output(g, REGC_OP_TANH, NULL, 1, &x); }

int regc_graph_rsqrt(regc_graph *g, int x) { return one_output(g, REGC_OP_RSQRT, NULL, 1, &x); }

int regc_graph_pow(regc_graph *g, int x, float exponent)
{
    regc_attrs a = {.value = exponent};
    return one_output(g, REGC_OP_POW, &a, 1, &x);
}

int regc_graph_softmax(regc_graph *g, int x)
{
    int out[2] = {0};
    int rc = regc_graph_add_node(g, REGC_OP_SOFTMAX, NULL, 1, &x, 2, out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_log_softmax(regc_graph *g, int x)
{
    int out[2] = {0};
    int rc = regc_graph_add_node(g, REGC_OP_LOG_SOFTMAX, NULL, 1, &x, 2, out, 0, NULL);
    return rc < 0 ? rc : out[0];
}

int regc_graph_sum_last(regc_graph *g, int x)
{
    return one_output(g, REGC_OP_SUM_LAST, NULL, 1, &x);
}

int regc_graph_mean_last(regc_graph *g, int x)
{
    return one_output(g, REGC_OP_MEAN_LAST, NULL, 1, &x);
}

int regc_graph_expand(regc_graph *g, int x, int64_t cols)
{
    const regc_tensor *t = regc_graph_tensor(g, x);
    if (!t || t->ndim < 1)
        return regc_error(REGC_ERR_ARG, "expand: tensor %d is not [..., 1]", x);
    int64_t shape[REGC_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[t->ndim - 1] = cols;
    int out = 0;
    int rc = regc_graph_add_node(g, REGC_OP_EXPAND, NULL, 1, &x, 1, &out, t->ndim, shape);
    return rc < 0 ? rc : out;
}

int regc_graph_masked_fill(regc_graph *g, int x, int mask, float value)
{
    regc_attrs a = {.value = value};
    return one_output(g, REGC_OP_MASKED_FILL, &a, 2, (int[]){x, mask});
}

int regc_graph_dropout(regc_graph *g, int x, int site, int draw, float p)
{
    regc_attrs a = {.value = p};
    return one_output(g, REGC_OP_DROPOUT, &a, 3, (int[]){x, site, draw});
}

int regc_graph_slice(regc_graph *g, int x, int axis, int64_t start, int64_t len)
{
    const regc_tensor *t = regc_graph_tensor(g, x);
    if (!t || axis < 0 || axis >= t->ndim)
        return regc_error(REGC_ERR_ARG, "slice: tensor %d has no axis %d", x, axis);
    int64_t shape[REGC_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[axis] = len;
    regc_attrs a = {.axis = axis, .start = start};
    int out = 0;
    int rc = regc_graph_add_node(g, REGC_OP_SLICE, &a, 1, &x, 1, &out, t->ndim, shape);
    return rc < 0 ? rc : out;
}
