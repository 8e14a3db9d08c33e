/* lower.c — a region graph's nodes become instructions.
 *
 * O0 lowers one node to one instruction. O1 (and O2) first run the passes:
 *  - views: a reshape, or a transpose that keeps every non-unit axis in
 *    order, only relabels memory, so its output becomes an alias of its
 *    input (MindSpore's no-task nodes);
 *  - GEMM epilogues: matmul + bias (+ GELU) is one GEMM with the BIAS or
 *    BIAS_GELU_AUX epilogue (the pre-activation saved as aux for backward);
 *    in backward, the GEMM that produces a GELU's incoming gradient applies
 *    DGELU, and the bias gradient that sums its result comes out as
 *    DGELU_BGRAD — one to one with cuBLASLt's epilogues;
 *  - a norm's backward followed by the add that accumulates its input's
 *    gradient is one kernel;
 *  - an embedding backward whose table only feeds an add accumulates into
 *    the add's output, where the add's other operand is written directly;
 *  - contiguous elementwise ops over the same elements fuse into one loop
 *    (lower_chain.c).
 * Every fused kernel computes the same float operations as the kernels it
 * replaces, so the levels differ in speed and memory, never in bits. */
#include <stdlib.h>
#include <string.h>

#include "lower.h"

static int is_value_slot(const regc_slot *s)
{
    return s->kind != SLOT_TEMP && s->kind != SLOT_SAVED;
}

/* The reference of tensor t: its slot, through any alias. */
static regc_ref ref_of(const lower_ctx *c, int t)
{
    if (t < 0)
        return (regc_ref){REGC_REF_NONE, 0};
    int s = c->slot_of[t];
    int64_t off = 0;
    while (c->r->slots[s].alias >= 0) {
        off += c->r->slots[s].alias_off;
        s = c->r->slots[s].alias;
    }
    return (regc_ref){s, off};
}

regc_instr *regc_lower_emit(lower_ctx *c, regc_kernel k, int node, int n_out, int n_refs,
                            const int *tensors)
{
    if (c->n_ins == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        regc_instr *p = realloc(c->ins, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        c->ins = p, c->cap = cap;
    }
    regc_instr *in = &c->ins[c->n_ins++];
    memset(in, 0, sizeof *in);
    in->kernel = (uint8_t)k, in->node = node, in->n_out = (uint8_t)n_out,
    in->n_refs = (uint8_t)n_refs;
    for (int i = 0; i < n_refs; i++)
        in->refs[i] = ref_of(c, tensors[i]);
    return in;
}

/* ---------------------------------------------------------------- views */

/* A transpose that keeps the non-unit axes in order moves no data. */
static int transpose_is_view(const lower_ctx *c, const regc_node *n)
{
    const regc_tensor *x = T(c, n->in[0]);
    int prev = -1;
    for (int i = 0; i < x->ndim; i++) {
        int axis = n->attrs.perm[i];
        if (x->shape[axis] == 1)
            continue;
        if (axis < prev)
            return 0;
        prev = axis;
    }
    return 1;
}

/* Views become aliases: the output names the input's memory, or, when the
 * output must live in a program value and the input is a temporary read by
 * nothing else, the input is written straight into the output. */
static void make_views(lower_ctx *c)
{
    regc_slot *sl = c->r->slots;
    for (int i = 0; i < c->n_nodes; i++) {
        const regc_node *n = regc_graph_node(c->g, i);
        if (n->op != REGC_OP_RESHAPE && !(n->op == REGC_OP_TRANSPOSE && transpose_is_view(c, n)))
            continue;
        int so = c->slot_of[n->out[0]], si = c->slot_of[n->in[0]];
        if (!is_value_slot(&sl[so])) {
            sl[so].alias = si;
            int root = root_slot(c, si);
            if (sl[so].kind == SLOT_SAVED && sl[root].kind == SLOT_TEMP)
                sl[root].kind = SLOT_SAVED; /* the view is read by backward */
            c->skip[i] = 1;
        } else if (sl[si].kind == SLOT_TEMP && sl[si].alias < 0 && c->n_readers[n->in[0]] == 1 &&
                   regc_graph_tensor(c->g, n->in[0])->producer >= 0) {
            sl[si].alias = so;
            c->skip[i] = 1;
        }
    }
}

/* ---------------------------------------------------------------- GEMM epilogues */

/* The forward node after node `from` that reads tensor t. */
static int forward_reader(const lower_ctx *c, int t, int from)
{
    for (int j = from + 1; j < c->r->n_fwd_nodes; j++) {
        const regc_node *q = regc_graph_node(c->g, j);
        for (int k = 0; k < q->n_in; k++)
            if (q->in[k] == t)
                return j;
    }
    return from;
}

static void fuse_gemms(lower_ctx *c)
{
    const regc_slot *sl = c->r->slots;
    for (int i = 0; i < c->n_nodes; i++) {
        const regc_node *m = regc_graph_node(c->g, i);
        if (m->op != REGC_OP_MATMUL)
            continue;
        int o = m->out[0], N = (int)last_dim(c, o);
        if (is_value_slot(&sl[c->slot_of[o]]))
            continue;
        int rd = c->reader[o];
        if (c->n_fwd_readers[o] == 1 && i < c->r->n_fwd_nodes) {
            rd = forward_reader(c, o, i);
            const regc_node *n2 = regc_graph_node(c->g, rd);
            if (n2->op == REGC_OP_BIAS_ADD && c->n_readers[o] == 1 && n2->in[0] == o &&
                T(c, n2->in[1])->ndim == 1 && numel(c, n2->in[1]) == N && !c->skip[rd]) {
                c->gemm_epi[i] = REGC_EPI_BIAS, c->gemm_bias[i] = n2->in[1];
                c->gemm_c[i] = n2->out[0], c->skip[rd] = 1;
                int p = n2->out[0];
                int gi = c->n_fwd_readers[p] == 1 ? forward_reader(c, p, rd) : rd;
                if (gi != rd && regc_graph_node(c->g, gi)->in[0] == p &&
                    regc_graph_node(c->g, gi)->op == REGC_OP_GELU && !c->skip[gi]) {
                    c->gemm_epi[i] = REGC_EPI_BIAS_GELU_AUX, c->gemm_aux[i] = p;
                    c->gemm_c[i] = regc_graph_node(c->g, gi)->out[0], c->skip[gi] = 1;
                }
            } else if (n2->op == REGC_OP_GELU && n2->in[0] == o && !c->skip[rd]) {
                c->gemm_epi[i] = REGC_EPI_GELU_AUX, c->gemm_aux[i] = o;
                c->gemm_c[i] = n2->out[0], c->skip[rd] = 1;
            }
        } else if (c->n_readers[o] == 1 && i >= c->r->n_fwd_nodes) {
            const regc_node *n2 = regc_graph_node(c->g, rd);
            if (n2->op != REGC_OP_GELU_BWD || n2->in[0] != o || n2->in[1] == o || c->skip[rd])
                continue;
            c->gemm_epi[i] = REGC_EPI_DGELU, c->gemm_aux[i] = n2->in[1];
            c->gemm_c[i] = n2->out[0], c->skip[rd] = 1;
            int u = n2->out[0];
            for (int j = rd + 1; j < c->n_nodes; j++) {
                const regc_node *s = regc_graph_node(c->g, j);
                if (s->op == REGC_OP_SUM_ROWS && s->in[0] == u && numel(c, s->out[0]) == N &&
                    !c->skip[j]) {
                    c->gemm_epi[i] = REGC_EPI_DGELU_BGRAD, c->gemm_bgrad[i] = s->out[0];
                    c->skip[j] = 1;
                    break;
                }
            }
        }
    }
}

/* LAYERNORM_BWD / RMSNORM_BWD whose dx only feeds the add after it that
 * accumulates the input's gradient: one kernel at the add. */
static void fuse_norm_bwd(lower_ctx *c)
{
    for (int i = c->r->n_fwd_nodes; i < c->n_nodes; i++) {
        const regc_node *a = regc_graph_node(c->g, i);
        if (a->op != REGC_OP_ADD || a->in[0] == a->in[1] || c->skip[i])
            continue;
        for (int side = 0; side < 2; side++) {
            int dx = a->in[side];
            int l = regc_graph_tensor(c->g, dx)->producer;
            if (l < c->r->n_fwd_nodes || c->n_readers[dx] != 1 || c->skip[l])
                continue;
            const regc_node *ln = regc_graph_node(c->g, l);
            if ((ln->op != REGC_OP_LAYERNORM_BWD && ln->op != REGC_OP_RMSNORM_BWD) ||
                ln->out[0] != dx)
                continue;
            /* the norm's other outputs move to the add: nobody may read them before */
            int ok = 1;
            for (int j = l + 1; j < i && ok; j++) {
                const regc_node *q = regc_graph_node(c->g, j);
                for (int k = 0; k < q->n_in; k++)
                    for (int o = 1; o < ln->n_out; o++)
                        ok &= q->in[k] != ln->out[o];
            }
            if (!ok)
                continue;
            c->fused_norm[i] = l, c->skip[l] = 1;
            break;
        }
    }
}

/* An ADD of an embedding backward's table (read by nothing else) and a
 * temporary computed here and read by nothing else: the temporary is
 * written straight into the add's output and the embedding backward
 * accumulates into it at the add. The output is written earlier than
 * before, so it must be memory nothing else reads in between: a temporary,
 * or an input's gradient that no later reader seeded. */
static void fuse_embed_bwd_add(lower_ctx *c)
{
    regc_slot *sl = c->r->slots;
    for (int i = c->r->n_fwd_nodes; i < c->n_nodes; i++) {
        const regc_node *a = regc_graph_node(c->g, i);
        if (a->op != REGC_OP_ADD || a->in[0] == a->in[1] || c->skip[i] || c->fused_norm[i] >= 0)
            continue;
        int root = root_slot(c, c->slot_of[a->out[0]]);
        if (sl[root].kind != SLOT_TEMP &&
            !(sl[root].kind == SLOT_DIN && c->r->seed_slot[sl[root].index] < 0))
            continue;
        for (int side = 0; side < 2; side++) {
            int table = a->in[side], other = a->in[1 - side];
            int l = T(c, table)->producer, p = T(c, other)->producer, so = c->slot_of[other];
            if (l < c->r->n_fwd_nodes || c->n_readers[table] != 1 || c->skip[l] ||
                regc_graph_node(c->g, l)->op != REGC_OP_EMBEDDING_BWD)
                continue;
            if (p < 0 || c->n_readers[other] != 1 || sl[so].kind != SLOT_TEMP ||
                sl[so].alias >= 0 || numel(c, other) != numel(c, a->out[0]) ||
                T(c, other)->dtype != REGC_F32)
                continue;
            sl[so].alias = c->slot_of[a->out[0]], sl[so].alias_off = 0;
            c->embed_acc[i] = l, c->skip[l] = 1;
            break;
        }
    }
}

/* ---------------------------------------------------------------- one node */

static int lower_matmul(lower_ctx *c, int i, const regc_node *n)
{
    int epi = c->gemm_epi[i] >= 0 ? c->gemm_epi[i] : REGC_EPI_NONE;
    int out = c->gemm_c[i] >= 0 ? c->gemm_c[i] : n->out[0];
    int t[6] = {out, n->in[0], n->in[1], c->gemm_bias[i], c->gemm_aux[i], c->gemm_bgrad[i]};
    /* outputs: c, and aux when forward writes it, bias_grad when produced */
    regc_instr *in = regc_lower_emit(c, K_GEMM, i, 1, 6, t);
    if (!in)
        return REGC_ERR_MEMORY;
    int64_t a_cols = last_dim(c, n->in[0]), a_rows = numel(c, n->in[0]) / a_cols;
    int64_t b_cols = last_dim(c, n->in[1]), b_rows = numel(c, n->in[1]) / b_cols;
    in->trans_a = n->attrs.trans_a, in->trans_b = n->attrs.trans_b, in->epilogue = epi;
    in->d[0] = n->attrs.trans_a ? a_cols : a_rows; /* m */
    in->d[1] = n->attrs.trans_b ? b_rows : b_cols; /* n */
    in->d[2] = n->attrs.trans_a ? a_rows : a_cols; /* k */
    in->d[3] = a_cols, in->d[4] = b_cols;          /* lda, ldb */
    return REGC_OK;
}

static void attn_of(const lower_ctx *c, const regc_node *n, int q, int k, regc_attn_shape *s)
{
    const regc_tensor *tq = T(c, q), *tk = T(c, k);
    *s = (regc_attn_shape){.batch = tq->shape[0],
                           .tq = tq->shape[1],
                           .tk = tk->shape[1],
                           .n_head = n->attrs.n_head,
                           .n_kv_head = n->attrs.n_kv_head,
                           .head_dim = (int)(tq->shape[2] / n->attrs.n_head),
                           .causal = n->attrs.causal,
                           .scale = n->attrs.scale,
                           .softcap = n->attrs.softcap,
                           .window = n->attrs.window};
}

static int lower_node(lower_ctx *c, int i)
{
    const regc_node *n = regc_graph_node(c->g, i);
    const int *in = n->in, *o = n->out;
    regc_instr *x = NULL;
#define EMIT(k, n_out, ...)                                                                        \
    do {                                                                                           \
        int t_[] = {__VA_ARGS__};                                                                  \
        if (!(x = regc_lower_emit(c, k, i, n_out, (int)(sizeof t_ / sizeof *t_), t_)))             \
            return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");                   \
    } while (0)
#define OPT(slot) ((slot) >= 0 ? in[slot] : -1) /* an optional input, -1 when absent */
    int64_t rows_in0 = n->n_in ? numel(c, in[0]) / last_dim(c, in[0]) : 0;
    switch (n->op) {
    case REGC_OP_EMBEDDING:
        EMIT(K_EMBED_FWD, 1, o[0], in[0], in[1]);
        x->d[0] = numel(c, in[0]), x->d[1] = last_dim(c, in[1]);
        break;
    case REGC_OP_ADD:
        if (c->fused_norm[i] >= 0) {
            const regc_node *l = regc_graph_node(c->g, c->fused_norm[i]);
            int dres = in[0] == l->out[0] ? in[1] : in[0];
            if (l->op == REGC_OP_LAYERNORM_BWD)
                EMIT(K_LN_BWD_ADD, 3, o[0], l->out[1], l->out[2], dres, l->in[0], l->in[1],
                     l->in[2], l->in[3], l->in[4]);
            else
                EMIT(K_RMS_BWD_ADD, 2, o[0], l->out[1], dres, l->in[0], l->in[1], l->in[2],
                     l->in[3]);
            x->d[1] = last_dim(c, l->in[1]);
            x->d[0] = numel(c, l->in[1]) / x->d[1];
            x->node = c->fused_norm[i];
            break;
        }
        if (c->embed_acc[i] >= 0) {
            const regc_node *l = regc_graph_node(c->g, c->embed_acc[i]);
            EMIT(K_EMBED_BWD, 1, o[0], l->in[1], l->in[0]);
            x->d[0] = numel(c, l->in[1]), x->d[1] = last_dim(c, l->in[0]), x->d[2] = l->attrs.vocab;
            x->d[3] = l->attrs.padded ? l->attrs.padding_idx + 1 : 0;
            x->accumulate = 1, x->node = c->embed_acc[i];
            break;
        }
        EMIT(K_ADD, 1, o[0], in[0], in[1]);
        x->d[0] = numel(c, o[0]);
        break;
    case REGC_OP_BIAS_ADD:
        EMIT(K_BIAS_ADD, 1, o[0], in[0], in[1]);
        x->d[1] = numel(c, in[1]), x->d[0] = numel(c, in[0]) / x->d[1];
        break;
    case REGC_OP_LAYERNORM:
        EMIT(K_LN_FWD, 3, o[0], o[1], o[2], in[0], in[1], in[2]);
        x->d[0] = rows_in0, x->d[1] = last_dim(c, in[0]), x->f = n->attrs.eps;
        break;
    case REGC_OP_MATMUL: return lower_matmul(c, i, n);
    case REGC_OP_SPLIT:
    case REGC_OP_CONCAT: { /* each part a 2-D copy at its column offset of the whole */
        const int split = n->op == REGC_OP_SPLIT, parts = split ? n->n_out : n->n_in;
        const int whole = split ? in[0] : o[0];
        const int64_t width = last_dim(c, whole), rows = numel(c, whole) / width;
        int64_t at = 0; /* columns */
        for (int p = 0; p < parts; p++) {
            const int part = split ? o[p] : in[p];
            const int64_t cols = last_dim(c, part);
            if (split)
                EMIT(K_COPY_2D, 1, o[p], in[0]);
            else
                EMIT(K_COPY_2D, 1, o[0], in[p]);
            x->refs[split ? 1 : 0].off += at * (int64_t)sizeof(float);
            x->d[0] = rows, x->d[1] = cols;
            x->d[2] = split ? cols : width, x->d[3] = split ? width : cols;
            at += cols;
        }
        break;
    }
    case REGC_OP_ATTENTION: {
        regc_attn_slots at;
        if (regc_attn_slots_of(n->op, &n->attrs, n->n_in, &at))
            return REGC_ERR_ARG;
        EMIT(K_ATTN_FWD, 2, o[0], o[1], in[0], in[1], in[2], OPT(at.bias), OPT(at.site),
             OPT(at.draw), OPT(at.docs));
        attn_of(c, n, in[0], in[1], &x->attn);
        x->f = n->attrs.value; /* the probabilities' dropout */
        break;
    }
    case REGC_OP_ATTENTION_BWD: {
        regc_attn_slots at;
        if (regc_attn_slots_of(n->op, &n->attrs, n->n_in, &at))
            return REGC_ERR_ARG;
        EMIT(K_ATTN_BWD, 4, o[0], o[1], o[2], at.bias >= 0 ? o[3] : -1, in[0], in[1], in[2], in[3],
             OPT(at.bias), in[4], in[5], OPT(at.site), OPT(at.draw), OPT(at.docs));
        attn_of(c, n, in[1], in[2], &x->attn);
        x->f = n->attrs.value;
        break;
    }
    case REGC_OP_RESHAPE:
        EMIT(K_COPY, 1, o[0], in[0]);
        x->d[0] = regc_tensor_bytes(T(c, in[0]));
        break;
    case REGC_OP_TRANSPOSE: {
        const regc_tensor *t = T(c, in[0]);
        EMIT(K_TRANSPOSE, 1, o[0], in[0]);
        x->d[0] = t->ndim;
        for (int k = 0; k < t->ndim; k++)
            x->d[1 + k] = t->shape[k], x->perm[k] = n->attrs.perm[k];
        break;
    }
    case REGC_OP_CROSS_ENTROPY:
        EMIT(K_CE_FWD, 2, o[0], o[1], in[0], in[1]);
        x->d[0] = rows_in0, x->d[1] = last_dim(c, in[0]);
        break;
    case REGC_OP_CROSS_ENTROPY_BWD:
        EMIT(K_CE_BWD, 1, o[0], in[0], in[1], in[2], in[3]);
        x->d[1] = last_dim(c, in[1]), x->d[0] = numel(c, in[1]) / x->d[1];
        x->d[2] = 0, x->d[3] = x->d[0]; /* every row of the loss */
        break;
    case REGC_OP_RMSNORM:
        EMIT(K_RMS_FWD, 2, o[0], o[1], in[0], in[1]);
        x->d[0] = rows_in0, x->d[1] = last_dim(c, in[0]), x->f = n->attrs.eps;
        break;
    case REGC_OP_RMSNORM_BWD:
        EMIT(K_RMS_BWD, 2, o[0], o[1], in[0], in[1], in[2], in[3]);
        x->d[1] = last_dim(c, in[1]), x->d[0] = numel(c, in[1]) / x->d[1];
        break;
    case REGC_OP_LAYERNORM_BWD:
        EMIT(K_LN_BWD, 3, o[0], o[1], o[2], in[0], in[1], in[2], in[3], in[4]);
        x->d[1] = last_dim(c, in[1]), x->d[0] = numel(c, in[1]) / x->d[1];
        break;
    case REGC_OP_ROPE: {
        const regc_tensor *t = T(c, in[0]); /* [B, T, H*D] */
        EMIT(K_ROPE, 1, o[0], in[0], in[1], in[2]);
        x->d[0] = t->shape[0], x->d[1] = t->shape[1], x->d[2] = n->attrs.n_head;
        x->d[3] = t->shape[2] / n->attrs.n_head, x->d[4] = n->attrs.inverse;
        x->d[5] = 2 * T(c, in[1])->shape[1]; /* rotated: all of a head, or its first part */
        break;
    }
    case REGC_OP_GELU:
    case REGC_OP_SILU:
    case REGC_OP_GELU_ERF:
    case REGC_OP_RELU:
    case REGC_OP_SCALE:
        EMIT(K_UNARY, 1, o[0], in[0]);
        x->unary = (uint8_t)n->op, x->d[0] = numel(c, in[0]), x->f = n->attrs.value;
        break;
    case REGC_OP_MUL:
    case REGC_OP_GELU_BWD:
    case REGC_OP_SILU_BWD:
    case REGC_OP_GELU_ERF_BWD:
    case REGC_OP_RELU_BWD:
        EMIT(K_BINARY, 1, o[0], in[0], in[1]);
        x->unary = (uint8_t)n->op, x->d[0] = numel(c, o[0]);
        break;
    case REGC_OP_DROPOUT:
        EMIT(K_DROPOUT, 1, o[0], in[0], in[1], in[2]);
        x->d[0] = numel(c, in[0]), x->f = n->attrs.value;
        break;
    case REGC_OP_FILL:
        EMIT(K_FILL, 1, o[0]);
        x->d[0] = numel(c, o[0]), x->f = n->attrs.value;
        break;
    case REGC_OP_SUM_ROWS:
        EMIT(K_SUM_ROWS, 1, o[0], in[0]);
        x->d[1] = numel(c, o[0]), x->d[0] = numel(c, in[0]) / x->d[1];
        break;
    case REGC_OP_EMBEDDING_BWD:
        EMIT(K_EMBED_BWD, 1, o[0], in[1], in[0]);
        x->d[0] = numel(c, in[1]), x->d[1] = last_dim(c, in[0]), x->d[2] = n->attrs.vocab;
        x->d[3] = n->attrs.padded ? n->attrs.padding_idx + 1 : 0;
        break;
    case REGC_OP_SOFTMAX:
    case REGC_OP_LOG_SOFTMAX:
        EMIT(K_SOFTMAX, 2, o[0], o[1], in[0]);
        x->d[0] = rows_in0, x->d[1] = last_dim(c, in[0]);
        x->d[2] = n->op == REGC_OP_LOG_SOFTMAX;
        break;
    case REGC_OP_SUM_LAST:
    case REGC_OP_MEAN_LAST:
        EMIT(K_ROW_SUM, 1, o[0], in[0]);
        x->d[0] = rows_in0, x->d[1] = last_dim(c, in[0]);
        x->d[2] = n->op == REGC_OP_MEAN_LAST;
        break;
    case REGC_OP_SLICE:
    case REGC_OP_SLICE_BWD: {
        /* the whole as [outer, dim, inner] rows: the window is len * inner
         * of each row of dim * inner, from start * inner */
        const int whole = n->op == REGC_OP_SLICE ? in[0] : o[0];
        const int64_t dim = T(c, whole)->shape[n->attrs.axis];
        const int64_t len = T(c, n->op == REGC_OP_SLICE ? o[0] : in[0])->shape[n->attrs.axis];
        int64_t inner = 1;
        for (int d = n->attrs.axis + 1; d < T(c, whole)->ndim; d++)
            inner *= T(c, whole)->shape[d];
        const int64_t outer = numel(c, whole) / (dim * inner);
        const int64_t at = n->attrs.start * inner * (int64_t)sizeof(float);
        if (n->op == REGC_OP_SLICE_BWD) { /* zeros, then the gradient in its window */
            EMIT(K_FILL, 1, o[0]);
            x->d[0] = numel(c, o[0]), x->f = 0.0f;
        }
        EMIT(K_COPY_2D, 1, o[0], in[0]);
        x->refs[n->op == REGC_OP_SLICE ? 1 : 0].off += at;
        x->d[0] = outer, x->d[1] = len * inner;
        x->d[2] = n->op == REGC_OP_SLICE ? len * inner : dim * inner;
        x->d[3] = n->op == REGC_OP_SLICE ? dim * inner : len * inner;
        break;
    }
    case REGC_OP_MASKED_FILL:
    case REGC_OP_EXPAND:
    case REGC_OP_SUB:
    case REGC_OP_DIV:
    case REGC_OP_NEG:
    case REGC_OP_ADD_SCALAR:
    case REGC_OP_EXP:
    case REGC_OP_TANH:
    case REGC_OP_TANH_BWD:
    case REGC_OP_RSQRT:
    case REGC_OP_POW: /* lower_range makes a chain of each (ew_only) */
    case REGC_OP_COUNT:
        return regc_error(REGC_ERR_UNSUPPORTED, "region compile: op %s has no single kernel",
                          regc_op_name(n->op));
    }
#undef EMIT
#undef OPT
    return REGC_OK;
}

/* ---------------------------------------------------------------- driver */

/* Emit nodes [lo, hi) as instructions, chaining elementwise runs at O1. */
static int lower_range(lower_ctx *c, int lo, int hi, int fuse, int *n_ew)
{
    for (int i = lo; i < hi; i++) {
        if (c->skip[i])
            continue;
        int last = i;
        int rc = regc_lower_chain(c, i, hi, fuse, n_ew, &last);
        if (rc == 0)
            rc = lower_node(c, i);
        if (rc < 0)
            return rc;
        i = last;
    }
    return REGC_OK;
}

int regc_region_lower(regc_compiled_region *r, const int *slot_of, regc_level level)
{
    const regc_graph *g = r->graph;
    int n_t = regc_graph_n_tensors(g), n_nodes = regc_graph_n_nodes(g);
    lower_ctx c = {.r = r, .g = g, .slot_of = slot_of, .n_nodes = n_nodes};
    size_t nt = (size_t)n_t + 1, nn = (size_t)n_nodes + 1;
    c.n_readers = calloc(nt, sizeof(int)), c.n_fwd_readers = calloc(nt, sizeof(int));
    c.reader = calloc(nt, sizeof(int)), c.skip = calloc(nn, 1);
    c.gemm_epi = malloc(nn * sizeof(int)), c.gemm_bias = malloc(nn * sizeof(int));
    c.gemm_aux = malloc(nn * sizeof(int)), c.gemm_bgrad = malloc(nn * sizeof(int));
    c.gemm_c = malloc(nn * sizeof(int)), c.fused_norm = malloc(nn * sizeof(int));
    c.embed_acc = malloc(nn * sizeof(int));
    r->ew = calloc(nn, sizeof *r->ew);
    r->ew_cap = (int)nn;
    int rc = REGC_OK;
    if (!c.n_readers || !c.n_fwd_readers || !c.reader || !c.skip || !c.gemm_epi || !c.gemm_bias ||
        !c.gemm_aux || !c.gemm_bgrad || !c.gemm_c || !c.fused_norm || !c.embed_acc || !r->ew) {
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        goto done;
    }
    for (int i = 0; i < n_nodes; i++) {
        const regc_node *n = regc_graph_node(g, i);
        c.gemm_epi[i] = c.gemm_bias[i] = c.gemm_aux[i] = c.gemm_bgrad[i] = c.gemm_c[i] = -1;
        c.fused_norm[i] = c.embed_acc[i] = -1;
        for (int k = 0; k < n->n_in; k++) {
            int dup = 0;
            for (int j = 0; j < k; j++)
                dup |= n->in[j] == n->in[k];
            if (dup)
                continue;
            c.n_readers[n->in[k]]++;
            c.n_fwd_readers[n->in[k]] += i < r->n_fwd_nodes;
            c.reader[n->in[k]] = i;
        }
    }
    int fuse = level != REGC_LEVEL_O0;
    if (fuse) {
        make_views(&c);
        fuse_gemms(&c);
        fuse_norm_bwd(&c);
        fuse_embed_bwd_add(&c);
    }
    int n_ew = 0;
    if ((rc = lower_range(&c, 0, r->n_fwd_nodes, fuse, &n_ew)))
        goto done;
    r->n_fwd = c.n_ins;
    if ((rc = lower_range(&c, r->n_fwd_nodes, n_nodes, fuse, &n_ew)))
        goto done;
    r->n_ew = n_ew;
    r->n_bwd = c.n_ins - r->n_fwd;
    if (fuse) {
        int nf = r->n_fwd;
        regc_fuse_add_norm(c.ins, &nf); /* BERT's post-norm layers: add then norm inside */
        memmove(c.ins + nf, c.ins + r->n_fwd, (size_t)r->n_bwd * sizeof *c.ins);
        r->n_fwd = nf;
    }
    r->fwd = malloc(((size_t)r->n_fwd + 1) * sizeof *r->fwd);
    r->bwd = malloc(((size_t)r->n_bwd + 1) * sizeof *r->bwd);
    if (!r->fwd || !r->bwd) {
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        goto done;
    }
    memcpy(r->fwd, c.ins, (size_t)r->n_fwd * sizeof *r->fwd);
    memcpy(r->bwd, c.ins + r->n_fwd, (size_t)r->n_bwd * sizeof *r->bwd);
done:
    free(c.n_readers), free(c.n_fwd_readers), free(c.reader), free(c.skip), free(c.gemm_epi);
    free(c.gemm_bias), free(c.gemm_aux), free(c.gemm_bgrad), free(c.gemm_c), free(c.fused_norm);
    free(c.embed_acc);
    free(c.ins);
    return rc;
}
