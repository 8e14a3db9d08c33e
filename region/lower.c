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
 *  - contiguous elementwise ops over the same elements fuse into one loop.
 * Every fused kernel computes the same float operations as the kernels it
 * replaces, so the levels differ in speed and memory, never in bits. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

typedef struct {
    regc_compiled_region *r;
    const regc_graph *g;
    const int *slot_of;
    int n_nodes;
    int *n_readers;     /* [n_tensors] over all nodes */
    int *n_fwd_readers; /* [n_tensors] over forward nodes */
    int *reader;        /* [n_tensors] the last reader (meaningful when there is one) */
    char *skip;         /* [n_nodes] absorbed by a fusion or an alias */
    int *gemm_epi;      /* [n_nodes] matmul: epilogue decided, -1 none */
    int *gemm_bias, *gemm_aux, *gemm_bgrad, *gemm_c; /* [n_nodes] tensors, -1 none */
    int *fused_norm; /* [n_nodes] ADD: the norm backward it absorbs, -1 none */
    /* [n_nodes] ADD: the embedding backward accumulating into its output, -1 none */
    int *embed_acc;
    regc_instr *ins;
    int n_ins, cap;
} lower_ctx;

static const regc_tensor *T(const lower_ctx *c, int t) { return regc_graph_tensor(c->g, t); }
static int64_t numel(const lower_ctx *c, int t) { return regc_tensor_numel(T(c, t)); }
static int64_t last_dim(const lower_ctx *c, int t)
{
    const regc_tensor *x = T(c, t);
    return x->ndim ? x->shape[x->ndim - 1] : 1;
}
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

static int root_slot(const lower_ctx *c, int s)
{
    while (c->r->slots[s].alias >= 0)
        s = c->r->slots[s].alias;
    return s;
}

static regc_instr *emit(lower_ctx *c, regc_kernel k, int node, int n_out, int n_refs,
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
    regc_instr *in = emit(c, K_GEMM, i, 1, 6, t);
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
                           .scale = n->attrs.scale};
}

static int lower_node(lower_ctx *c, int i)
{
    const regc_node *n = regc_graph_node(c->g, i);
    const int *in = n->in, *o = n->out;
    regc_instr *x = NULL;
#define EMIT(k, n_out, ...)                                                                        \
    do {                                                                                           \
        int t_[] = {__VA_ARGS__};                                                                  \
        if (!(x = emit(c, k, i, n_out, (int)(sizeof t_ / sizeof *t_), t_)))                        \
            return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");                   \
    } while (0)
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
    case REGC_OP_ATTENTION:
        if (n->n_in == 4)
            EMIT(K_ATTN_FWD, 2, o[0], o[1], in[0], in[1], in[2], in[3]);
        else
            EMIT(K_ATTN_FWD, 2, o[0], o[1], in[0], in[1], in[2], -1);
        attn_of(c, n, in[0], in[1], &x->attn);
        break;
    case REGC_OP_ATTENTION_BWD:
        if (n->n_in == 7)
            EMIT(K_ATTN_BWD, 4, o[0], o[1], o[2], o[3], in[0], in[1], in[2], in[3], in[6], in[4],
                 in[5]);
        else
            EMIT(K_ATTN_BWD, 4, o[0], o[1], o[2], -1, in[0], in[1], in[2], in[3], -1, in[4], in[5]);
        attn_of(c, n, in[1], in[2], &x->attn);
        break;
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
    return REGC_OK;
}

/* ---------------------------------------------------------------- elementwise chains */

static int ew_op_of(regc_op op)
{
    switch (op) {
    case REGC_OP_ADD: return REGC_EW_ADD;
    case REGC_OP_BIAS_ADD: return REGC_EW_ADD;
    case REGC_OP_MUL: return REGC_EW_MUL;
    case REGC_OP_SCALE: return REGC_EW_SCALE;
    case REGC_OP_GELU: return REGC_EW_GELU;
    case REGC_OP_GELU_BWD: return REGC_EW_GELU_BWD;
    case REGC_OP_GELU_ERF: return REGC_EW_GELU_ERF;
    case REGC_OP_GELU_ERF_BWD: return REGC_EW_GELU_ERF_BWD;
    case REGC_OP_SILU: return REGC_EW_SILU;
    case REGC_OP_SILU_BWD: return REGC_EW_SILU_BWD;
    case REGC_OP_RELU: return REGC_EW_RELU;
    case REGC_OP_RELU_BWD: return REGC_EW_RELU_BWD;
    case REGC_OP_SUB: return REGC_EW_SUB;
    case REGC_OP_DIV: return REGC_EW_DIV;
    case REGC_OP_NEG: return REGC_EW_NEG;
    case REGC_OP_ADD_SCALAR: return REGC_EW_ADD_SCALAR;
    case REGC_OP_EXP: return REGC_EW_EXP;
    case REGC_OP_TANH: return REGC_EW_TANH;
    case REGC_OP_TANH_BWD: return REGC_EW_TANH_BWD;
    case REGC_OP_RSQRT: return REGC_EW_RSQRT;
    case REGC_OP_POW: return REGC_EW_POW;
    case REGC_OP_EXPAND: return REGC_EW_SCALE; /* by 1: a copy of the row's value */
    case REGC_OP_MASKED_FILL: return REGC_EW_MASKED_FILL;
    default: return -1;
    }
}

/* Ops with no single kernel of their own: each lowers as a chain, of one
 * step when nothing joins it (at O0, too). */
static int ew_only(regc_op op)
{
    return ew_op_of(op) >= 0 && op != REGC_OP_ADD && op != REGC_OP_BIAS_ADD && op != REGC_OP_MUL &&
           op != REGC_OP_SCALE && op != REGC_OP_GELU && op != REGC_OP_GELU_BWD &&
           op != REGC_OP_GELU_ERF && op != REGC_OP_GELU_ERF_BWD && op != REGC_OP_SILU &&
           op != REGC_OP_SILU_BWD && op != REGC_OP_RELU && op != REGC_OP_RELU_BWD;
}

/* May operand k of x be broadcast (read with a period or an inner count)
 * in a chain? */
static int ew_broadcast_ok(const regc_node *x, int k)
{
    return (k == 1 && (x->op == REGC_OP_BIAS_ADD || x->op == REGC_OP_SUB || x->op == REGC_OP_DIV ||
                       x->op == REGC_OP_MUL || x->op == REGC_OP_MASKED_FILL)) ||
           (k == 0 && x->op == REGC_OP_EXPAND);
}

/* Does node i read a broadcast operand? MUL's single kernel takes equal
 * shapes only; broadcast, it runs as a chain. */
static int ew_broadcasts(const lower_ctx *c, int i)
{
    const regc_node *x = regc_graph_node(c->g, i);
    if (ew_op_of(x->op) < 0 || x->op == REGC_OP_BIAS_ADD)
        return 0;
    for (int k = 0; k < x->n_in; k++)
        if (numel(c, x->in[k]) != numel(c, x->out[0]))
            return 1;
    return 0;
}

/* Can node i join a chain over n elements? */
static int ew_candidate(const lower_ctx *c, int i, int64_t n)
{
    const regc_node *x = regc_graph_node(c->g, i);
    if (c->skip[i] || ew_op_of(x->op) < 0 ||
        (x->op == REGC_OP_ADD && (c->fused_norm[i] >= 0 || c->embed_acc[i] >= 0)))
        return 0;
    if (T(c, x->out[0])->dtype != REGC_F32 || numel(c, x->out[0]) != n)
        return 0;
    for (int k = 0; k < x->n_in; k++)
        if (numel(c, x->in[k]) != n && !ew_broadcast_ok(x, k))
            return 0;
    return 1;
}

typedef struct {
    int n_members;
    int members[REGC_EW_MAX_STEPS];
    int inputs[REGC_EW_MAX_INPUTS], n_inputs;
    int outputs[REGC_EW_MAX_OUTPUTS], n_outputs;
} ew_group;

static int in_group(const ew_group *gr, int node)
{
    for (int i = 0; i < gr->n_members; i++)
        if (gr->members[i] == node)
            return 1;
    return 0;
}

/* The tensor whose memory t is: t, or what the reshapes it comes through
 * view (aliases, which emit nothing, so a chain may run across them). */
static int ew_alias_source(const lower_ctx *c, int t)
{
    for (;;) {
        const int p = T(c, t)->producer;
        if (p < 0 || !c->skip[p] || regc_graph_node(c->g, p)->op != REGC_OP_RESHAPE)
            return t;
        t = regc_graph_node(c->g, p)->in[0];
    }
}

/* The member of gr whose output operand t of a member is, through any
 * alias, or -1: such an operand is a register of the chain, never read
 * from memory (which the chain writes only at its end). */
static int ew_member_source(const lower_ctx *c, const ew_group *gr, int t)
{
    const int p = T(c, ew_alias_source(c, t))->producer;
    return p >= 0 && in_group(gr, p) ? ew_alias_source(c, t) : -1;
}

/* How member x reads operand t in a chain over n elements: element by
 * element (both 0), a row's statistic [..., 1] held along x's rows
 * (inner), or trailing dimensions repeated over x's leading ones
 * (period). */
static void ew_read_rule(const lower_ctx *c, const regc_node *x, int t, int64_t n, int64_t *inner,
                         int64_t *period)
{
    const regc_tensor *in = T(c, t), *full = T(c, x->out[0]);
    *inner = *period = 0;
    if (regc_tensor_numel(in) == n)
        return;
    if (in->ndim == full->ndim && in->ndim >= 1 && in->shape[in->ndim - 1] == 1 &&
        full->shape[full->ndim - 1] > 1)
        *inner = full->shape[full->ndim - 1];
    else
        *period = regc_tensor_numel(in);
}

/* Does every member that reads input t read it the same way? A chain
 * gives each input one rule; members of other shapes may need others. */
static int ew_reads_agree(const lower_ctx *c, const ew_group *gr, int t, int64_t n)
{
    int64_t inner0 = -1, period0 = -1;
    for (int m = 0; m < gr->n_members; m++) {
        const regc_node *x = regc_graph_node(c->g, gr->members[m]);
        for (int k = 0; k < x->n_in; k++) {
            if (x->in[k] != t)
                continue;
            int64_t inner, period;
            ew_read_rule(c, x, t, n, &inner, &period);
            if (inner0 >= 0 && (inner != inner0 || period != period0))
                return 0;
            inner0 = inner, period0 = period;
        }
    }
    return 1;
}

/* Would adding node i keep the group within the program limits? Fills the
 * group's inputs and outputs as they would be. */
static int ew_try(const lower_ctx *c, ew_group *gr, int i)
{
    ew_group t = *gr;
    t.members[t.n_members++] = i;
    t.n_inputs = 0, t.n_outputs = 0;
    const int64_t n = numel(c, regc_graph_node(c->g, t.members[0])->out[0]);
    for (int m = 0; m < t.n_members; m++) {
        const regc_node *x = regc_graph_node(c->g, t.members[m]);
        for (int k = 0; k < x->n_in; k++) {
            int seen = 0;
            if (ew_member_source(c, &t, x->in[k]) >= 0)
                continue;
            for (int j = 0; j < t.n_inputs; j++)
                seen |= t.inputs[j] == x->in[k];
            if (!seen) {
                if (t.n_inputs == REGC_EW_MAX_INPUTS || !ew_reads_agree(c, &t, x->in[k], n))
                    return 0;
                t.inputs[t.n_inputs++] = x->in[k];
            }
        }
    }
    for (int m = 0; m < t.n_members; m++) {
        int o = regc_graph_node(c->g, t.members[m])->out[0];
        int needed = c->r->slots[c->slot_of[o]].kind != SLOT_TEMP ||
                     c->r->slots[root_slot(c, c->slot_of[o])].kind != SLOT_TEMP;
        int inside = 0;
        for (int m2 = 0; m2 < t.n_members; m2++) {
            const regc_node *q = regc_graph_node(c->g, t.members[m2]);
            int reads = 0;
            for (int k = 0; k < q->n_in; k++)
                reads |= q->in[k] == o;
            inside += reads;
        }
        needed |= c->n_readers[o] > inside;
        if (needed) {
            if (t.n_outputs == REGC_EW_MAX_OUTPUTS)
                return 0;
            t.outputs[t.n_outputs++] = o;
        }
    }
    *gr = t;
    return 1;
}

static int emit_group(lower_ctx *c, const ew_group *gr, regc_ew_program *prog)
{
    memset(prog, 0, sizeof *prog);
    /* register r holds tensor tensor_of[r]: the inputs, then one per step */
    int tensor_of[REGC_EW_MAX_INPUTS + REGC_EW_MAX_STEPS];
    int n_regs = 0;
    int64_t n = numel(c, regc_graph_node(c->g, gr->members[0])->out[0]);
    for (int k = 0; k < gr->n_inputs; k++) {
        const regc_tensor *t = T(c, gr->inputs[k]);
        tensor_of[n_regs++] = gr->inputs[k];
        if (regc_tensor_numel(t) == n)
            continue; /* read element by element */
        /* broadcast: as its readers say (ew_try made them agree) */
        for (int m = 0; m < gr->n_members; m++) {
            const regc_node *x = regc_graph_node(c->g, gr->members[m]);
            for (int j = 0; j < x->n_in; j++)
                if (x->in[j] == gr->inputs[k])
                    ew_read_rule(c, x, gr->inputs[k], n, &prog->inner[k], &prog->period[k]);
        }
    }
    prog->n_inputs = gr->n_inputs;
    for (int m = 0; m < gr->n_members; m++) {
        const regc_node *x = regc_graph_node(c->g, gr->members[m]);
        regc_ew_step *s = &prog->steps[m];
        s->op = (uint8_t)ew_op_of(x->op);
        s->value = x->op == REGC_OP_EXPAND ? 1.0f : x->attrs.value;
        for (int k = 0; k < x->n_in && k < 2; k++) {
            const int src = ew_member_source(c, gr, x->in[k]); /* a register, through aliases */
            const int want = src >= 0 ? src : x->in[k];
            for (int r = 0; r < n_regs; r++)
                if (tensor_of[r] == want)
                    *(k == 0 ? &s->a : &s->b) = (uint8_t)r;
        }
        tensor_of[n_regs++] = x->out[0];
    }
    prog->n_steps = gr->n_members;
    prog->n_outputs = gr->n_outputs;
    int t[REGC_INSTR_MAX_REFS];
    for (int k = 0; k < gr->n_outputs; k++) {
        t[k] = gr->outputs[k];
        for (int r = 0; r < n_regs; r++)
            if (tensor_of[r] == gr->outputs[k])
                prog->out_reg[k] = (uint8_t)r;
    }
    for (int k = 0; k < gr->n_inputs; k++)
        t[gr->n_outputs + k] = gr->inputs[k];
    regc_instr *in = emit(c, K_EW, gr->members[gr->n_members - 1], gr->n_outputs,
                          gr->n_outputs + gr->n_inputs, t);
    if (!in)
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    in->d[0] = n;
    in->ew = prog;
    return REGC_OK;
}

/* ---------------------------------------------------------------- driver */

/* Emit nodes [lo, hi) as instructions, chaining elementwise runs at O1. */
static int lower_range(lower_ctx *c, int lo, int hi, int fuse, int *n_ew)
{
    for (int i = lo; i < hi; i++) {
        if (c->skip[i])
            continue;
        int64_t n = numel(c, regc_graph_node(c->g, i)->out[0]);
        if (fuse && ew_candidate(c, i, n)) {
            ew_group gr = {0};
            ew_try(c, &gr, i);
            int j = i + 1, last = i;
            for (; j < hi; j++) {
                if (c->skip[j] && regc_graph_node(c->g, j)->op == REGC_OP_RESHAPE)
                    continue; /* an alias emits nothing */
                if (!ew_candidate(c, j, n) || gr.n_members == REGC_EW_MAX_STEPS ||
                    !ew_try(c, &gr, j))
                    break;
                last = j;
            }
            if (gr.n_members > 1) {
                int rc = emit_group(c, &gr, &c->r->ew[(*n_ew)++]);
                if (rc)
                    return rc;
                i = last;
                continue;
            }
        }
        if (ew_only(regc_graph_node(c->g, i)->op) || ew_broadcasts(c, i)) {
            ew_group gr = {0};
            ew_try(c, &gr, i); /* one step always fits */
            int rc = emit_group(c, &gr, &c->r->ew[(*n_ew)++]);
            if (rc)
                return rc;
            continue;
        }
        int rc = lower_node(c, i);
        if (rc)
            return rc;
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
