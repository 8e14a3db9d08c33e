/* exec.c — level O0: run a graph node by node on a backend.
 *
 * Each activation is allocated when its node runs and freed right after its
 * last reader (reference counting), so memory follows the program without a
 * plan. Tensors bound by the caller (parameters, gradients, inputs) live in
 * the caller's memory and are never freed here. This is the debugging level
 * and the reference that compiled levels are checked against. */
#include <stdlib.h>
#include <string.h>

#include "regc_region.h"

struct regc_exec {
    const regc_graph *g;
    regc_backend *be;
    void **ptr;          /* [n_tensors] device memory of each tensor, NULL if none */
    char *bound;         /* [n_tensors] memory belongs to the caller */
    char *keep;          /* [n_tensors] graph outputs: survive the run */
    int *n_readers;      /* [n_tensors] nodes reading each tensor (a node reading twice counts twice) */
    int *readers_left;   /* [n_tensors] during a run */
};

int regc_exec_new(const regc_graph *g, regc_backend *be, regc_exec **out)
{
    *out = NULL;
    int n = regc_graph_n_tensors(g);
    regc_exec *x = calloc(1, sizeof *x);
    if (!x)
        return regc_error(REGC_ERR_MEMORY, "out of memory creating an executor");
    x->g = g;
    x->be = be;
    x->ptr = calloc((size_t)n + 1, sizeof *x->ptr);
    x->bound = calloc((size_t)n + 1, 1);
    x->keep = calloc((size_t)n + 1, 1);
    x->n_readers = calloc((size_t)n + 1, sizeof *x->n_readers);
    x->readers_left = calloc((size_t)n + 1, sizeof *x->readers_left);
    if (!x->ptr || !x->bound || !x->keep || !x->n_readers || !x->readers_left) {
        regc_exec_free(x);
        return regc_error(REGC_ERR_MEMORY, "out of memory creating an executor");
    }
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *node = regc_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++)
            x->n_readers[node->in[k]]++;
    }
    for (int i = 0; i < regc_graph_n_outputs(g); i++)
        x->keep[regc_graph_output(g, i)] = 1;
    *out = x;
    return REGC_OK;
}

/* Free the executor's own activations (not bound memory). */
static void release_all(regc_exec *x)
{
    for (int t = 0; t < regc_graph_n_tensors(x->g); t++) {
        if (x->ptr[t] && !x->bound[t])
            x->be->free(x->be, x->ptr[t]);
        if (!x->bound[t])
            x->ptr[t] = NULL;
    }
}

void regc_exec_free(regc_exec *x)
{
    if (!x)
        return;
    if (x->ptr && x->bound)
        release_all(x);
    free(x->ptr);
    free(x->bound);
    free(x->keep);
    free(x->n_readers);
    free(x->readers_left);
    free(x);
}

int regc_exec_bind(regc_exec *x, int tensor, void *device_ptr)
{
    if (tensor < 0 || tensor >= regc_graph_n_tensors(x->g))
        return regc_error(REGC_ERR_ARG, "bind: no tensor %d", tensor);
    if (x->ptr[tensor] && !x->bound[tensor])
        x->be->free(x->be, x->ptr[tensor]);
    x->ptr[tensor] = device_ptr;
    x->bound[tensor] = 1;
    return REGC_OK;
}

void *regc_exec_tensor(regc_exec *x, int tensor)
{
    if (tensor < 0 || tensor >= regc_graph_n_tensors(x->g))
        return NULL;
    return x->ptr[tensor];
}

/* ---------------------------------------------------------------- dispatch */

static int64_t numel(const regc_exec *x, int t) { return regc_tensor_numel(regc_graph_tensor(x->g, t)); }

static int64_t last_dim(const regc_exec *x, int t)
{
    const regc_tensor *tt = regc_graph_tensor(x->g, t);
    return tt->ndim ? tt->shape[tt->ndim - 1] : 1;
}

#define F(i) ((float *)x->ptr[n->in[i]])
#define I(i) ((const int32_t *)x->ptr[n->in[i]])
#define O(i) ((float *)x->ptr[n->out[i]])

/* A backend entry that is NULL is a missing kernel, reported by name. */
#define NEED(fn)                                                                          \
    do {                                                                                  \
        if (!be->fn)                                                                      \
            return regc_error(REGC_ERR_UNSUPPORTED, "backend %s has no kernel %s (op %s)", \
                              be->name, #fn, regc_op_name(n->op));                        \
    } while (0)

static void attn_shape(const regc_exec *x, const regc_node *n, int q, int k, regc_attn_shape *s)
{
    const regc_tensor *tq = regc_graph_tensor(x->g, q), *tk = regc_graph_tensor(x->g, k);
    s->batch = tq->shape[0];
    s->tq = tq->shape[1];
    s->tk = tk->shape[1];
    s->n_head = n->attrs.n_head;
    s->n_kv_head = n->attrs.n_kv_head;
    s->head_dim = (int)(tq->shape[2] / n->attrs.n_head);
    s->causal = n->attrs.causal;
    s->scale = n->attrs.scale;
}

static int run_matmul(regc_exec *x, const regc_node *n)
{
    regc_backend *be = x->be;
    NEED(gemm);
    int64_t a_cols = last_dim(x, n->in[0]), a_rows = numel(x, n->in[0]) / a_cols;
    int64_t b_cols = last_dim(x, n->in[1]), b_rows = numel(x, n->in[1]) / b_cols;
    regc_gemm gm = {
        .trans_a = n->attrs.trans_a, .trans_b = n->attrs.trans_b,
        .m = n->attrs.trans_a ? a_cols : a_rows,
        .k = n->attrs.trans_a ? a_rows : a_cols,
        .n = n->attrs.trans_b ? b_rows : b_cols,
        .a = F(0), .lda = a_cols, .b = F(1), .ldb = b_cols,
        .c = O(0), .alpha = 1.0f, .epilogue = REGC_EPI_NONE,
    };
    gm.ldc = gm.n;
    return be->gemm(be, &gm);
}

static int run_node(regc_exec *x, const regc_node *n)
{
    regc_backend *be = x->be;
    regc_attn_shape s;
    switch (n->op) {
    case REGC_OP_EMBEDDING:
        NEED(embedding_fwd);
        be->embedding_fwd(be, O(0), I(0), F(1), numel(x, n->in[0]), last_dim(x, n->in[1]));
        return REGC_OK;
    case REGC_OP_ADD:
        NEED(add);
        be->add(be, O(0), F(0), F(1), numel(x, n->out[0]));
        return REGC_OK;
    case REGC_OP_BIAS_ADD: {
        NEED(bias_add);
        int64_t cols = numel(x, n->in[1]);
        be->bias_add(be, O(0), F(0), F(1), numel(x, n->in[0]) / cols, cols);
        return REGC_OK;
    }
    case REGC_OP_LAYERNORM: {
        NEED(layernorm_fwd);
        int64_t cols = last_dim(x, n->in[0]);
        be->layernorm_fwd(be, O(0), O(1), O(2), F(0), F(1), F(2), numel(x, n->in[0]) / cols, cols,
                          n->attrs.eps);
        return REGC_OK;
    }
    case REGC_OP_MATMUL:
        return run_matmul(x, n);
    case REGC_OP_GELU:
        NEED(gelu_fwd);
        be->gelu_fwd(be, O(0), F(0), numel(x, n->in[0]));
        return REGC_OK;
    case REGC_OP_SPLIT:
    case REGC_OP_CONCAT: {
        /* both are strided copies between one wide and several narrow tensors */
        NEED(copy_2d);
        int split = n->op == REGC_OP_SPLIT;
        int parts = split ? n->n_out : n->n_in;
        int narrow0 = split ? n->out[0] : n->in[0];
        int64_t cols = last_dim(x, narrow0), rows = numel(x, narrow0) / cols;
        for (int i = 0; i < parts; i++) {
            if (split)
                be->copy_2d(be, O(i), cols, F(0) + i * cols, cols * parts, rows, cols);
            else
                be->copy_2d(be, O(0) + i * cols, cols * parts, F(i), cols, rows, cols);
        }
        return REGC_OK;
    }
    case REGC_OP_ATTENTION:
        NEED(attention_fwd);
        attn_shape(x, n, n->in[0], n->in[1], &s);
        be->attention_fwd(be, O(0), O(1), F(0), F(1), F(2), n->n_in == 4 ? F(3) : NULL, &s);
        return REGC_OK;
    case REGC_OP_RESHAPE:
        be->copy_d2d(be, O(0), F(0), (size_t)numel(x, n->in[0]) *
                                         regc_dtype_size(regc_graph_tensor(x->g, n->in[0])->dtype));
        return REGC_OK;
    case REGC_OP_TRANSPOSE: {
        NEED(transpose);
        const regc_tensor *t = regc_graph_tensor(x->g, n->in[0]);
        be->transpose(be, O(0), F(0), t->ndim, t->shape, n->attrs.perm);
        return REGC_OK;
    }
    case REGC_OP_CROSS_ENTROPY: {
        NEED(cross_entropy_fwd);
        int64_t cols = last_dim(x, n->in[0]);
        be->cross_entropy_fwd(be, O(0), O(1), F(0), I(1), numel(x, n->in[0]) / cols, cols);
        return REGC_OK;
    }
    case REGC_OP_RMSNORM: {
        NEED(rmsnorm_fwd);
        int64_t cols = last_dim(x, n->in[0]);
        be->rmsnorm_fwd(be, O(0), O(1), F(0), F(1), numel(x, n->in[0]) / cols, cols,
                        n->attrs.eps);
        return REGC_OK;
    }
    case REGC_OP_RMSNORM_BWD: {
        NEED(rmsnorm_bwd);
        int64_t cols = last_dim(x, n->in[1]);
        be->rmsnorm_bwd(be, O(0), O(1), F(0), F(1), F(2), F(3), numel(x, n->in[1]) / cols, cols);
        return REGC_OK;
    }
    case REGC_OP_ROPE: {
        NEED(rope);
        const regc_tensor *t = regc_graph_tensor(x->g, n->in[0]); /* [B, T, H*D] */
        be->rope(be, O(0), F(0), F(1), F(2), t->shape[0], t->shape[1], n->attrs.n_head,
                 (int)(t->shape[2] / n->attrs.n_head), n->attrs.inverse);
        return REGC_OK;
    }
    case REGC_OP_SILU:
        NEED(silu_fwd);
        be->silu_fwd(be, O(0), F(0), numel(x, n->in[0]));
        return REGC_OK;
    case REGC_OP_SILU_BWD:
        NEED(silu_bwd);
        be->silu_bwd(be, O(0), F(0), F(1), numel(x, n->in[1]));
        return REGC_OK;
    case REGC_OP_MUL:
        NEED(mul);
        be->mul(be, O(0), F(0), F(1), numel(x, n->out[0]));
        return REGC_OK;
    case REGC_OP_GELU_ERF:
        NEED(gelu_erf_fwd);
        be->gelu_erf_fwd(be, O(0), F(0), numel(x, n->in[0]));
        return REGC_OK;
    case REGC_OP_GELU_ERF_BWD:
        NEED(gelu_erf_bwd);
        be->gelu_erf_bwd(be, O(0), F(0), F(1), numel(x, n->in[1]));
        return REGC_OK;
    case REGC_OP_RELU:
        NEED(relu_fwd);
        be->relu_fwd(be, O(0), F(0), numel(x, n->in[0]));
        return REGC_OK;
    case REGC_OP_RELU_BWD:
        NEED(relu_bwd);
        be->relu_bwd(be, O(0), F(0), F(1), numel(x, n->in[1]));
        return REGC_OK;
    case REGC_OP_SCALE:
        NEED(scale);
        be->scale(be, O(0), F(0), n->attrs.value, numel(x, n->in[0]));
        return REGC_OK;
    case REGC_OP_FILL:
        be->fill(be, O(0), (size_t)numel(x, n->out[0]), n->attrs.value);
        return REGC_OK;
    case REGC_OP_SUM_ROWS: {
        NEED(sum_rows);
        int64_t cols = numel(x, n->out[0]);
        be->sum_rows(be, O(0), F(0), numel(x, n->in[0]) / cols, cols);
        return REGC_OK;
    }
    case REGC_OP_EMBEDDING_BWD:
        NEED(embedding_bwd);
        be->embedding_bwd(be, O(0), I(1), F(0), numel(x, n->in[1]), last_dim(x, n->in[0]),
                          n->attrs.vocab, 0);
        return REGC_OK;
    case REGC_OP_LAYERNORM_BWD: {
        NEED(layernorm_bwd);
        int64_t cols = last_dim(x, n->in[1]);
        be->layernorm_bwd(be, O(0), O(1), O(2), F(0), F(1), F(2), F(3), F(4),
                          numel(x, n->in[1]) / cols, cols);
        return REGC_OK;
    }
    case REGC_OP_GELU_BWD:
        NEED(gelu_bwd);
        be->gelu_bwd(be, O(0), F(0), F(1), numel(x, n->in[1]));
        return REGC_OK;
    case REGC_OP_ATTENTION_BWD:
        NEED(attention_bwd);
        attn_shape(x, n, n->in[1], n->in[2], &s);
        /* 7 inputs: the forward had a score bias, whose gradient is output 3 */
        be->attention_bwd(be, O(0), O(1), O(2), n->n_in == 7 ? O(3) : NULL, F(0), F(1), F(2),
                          F(3), n->n_in == 7 ? F(6) : NULL, F(4), F(5), &s);
        return REGC_OK;
    case REGC_OP_CROSS_ENTROPY_BWD: {
        NEED(cross_entropy_bwd);
        int64_t cols = last_dim(x, n->in[1]);
        be->cross_entropy_bwd(be, O(0), F(0), F(1), I(2), F(3), numel(x, n->in[1]) / cols, cols);
        return REGC_OK;
    }
    case REGC_OP_COUNT:
        break;
    }
    return regc_error(REGC_ERR_UNSUPPORTED, "executor: unknown op %d", (int)n->op);
}

#undef F
#undef I
#undef O

/* ---------------------------------------------------------------- running */

static int allocate(regc_exec *x, int t)
{
    if (x->bound[t])
        return REGC_OK;
    const regc_tensor *tt = regc_graph_tensor(x->g, t);
    size_t bytes = (size_t)regc_tensor_bytes(tt);
    x->ptr[t] = x->be->alloc(x->be, bytes ? bytes : 1);
    if (!x->ptr[t])
        return regc_error(REGC_ERR_MEMORY, "out of memory for tensor %s (%zu bytes)", tt->name,
                          bytes);
    return REGC_OK;
}

static void release(regc_exec *x, int t)
{
    if (x->bound[t] || x->keep[t] || x->readers_left[t] > 0 || !x->ptr[t])
        return;
    x->be->free(x->be, x->ptr[t]);
    x->ptr[t] = NULL;
}

int regc_exec_run(regc_exec *x)
{
    const regc_graph *g = x->g;
    release_all(x);
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *tt = regc_graph_tensor(g, t);
        x->readers_left[t] = x->n_readers[t];
        if (tt->role != REGC_ROLE_ACT && !x->bound[t])
            return regc_error(REGC_ERR_ARG, "executor: %s %s has no memory bound",
                              regc_role_name(tt->role), tt->name);
    }
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int k = 0; k < n->n_out; k++)
            if (allocate(x, n->out[k]))
                return REGC_ERR_MEMORY;
        int rc = run_node(x, n);
        if (rc)
            return rc;
        for (int k = 0; k < n->n_in; k++) {
            x->readers_left[n->in[k]]--;
            release(x, n->in[k]);
        }
        for (int k = 0; k < n->n_out; k++)
            release(x, n->out[k]); /* outputs nobody reads */
    }
    return x->be->sync(x->be);
}
