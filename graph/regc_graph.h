/* regc_graph.h — the graph IR: tensors, nodes and graphs in topological
 * order. A graph holds shapes only, never data: weights are bound later by
 * the runtime, so a 70B-shaped graph costs kilobytes.
 *
 * Tensors are created as graph inputs, parameters, or as the outputs of a
 * node (activations); a node may only read tensors that already exist, so
 * node order is always a valid topological order. Every tensor has a
 * unique name; parameters carry their checkpoint names. The handle is
 * opaque; nodes and tensors are read through const views. */
#ifndef REGC_GRAPH_H
#define REGC_GRAPH_H

#include <stdint.h>
#include <stdio.h>

#include "regc_common.h"

#define REGC_MAX_DIMS 6
#define REGC_MAX_IO 10 /* inputs or outputs of one node (ATTENTION_BWD reads 10 at most) */
/* regc_tensor's frozen: how a frozen parameter is held (regc_frozen_kinds) */
#define REGC_FROZEN_BF16 2     /* in bf16 */
#define REGC_FROZEN_NF4 3      /* in NF4 (kernels/nf4_format.h), multiplied in fp32 */
#define REGC_FROZEN_NF4_BF16 4 /* in NF4, multiplied as bf16 GEMMs do */
#define REGC_FROZEN_KINDS 5

typedef enum { REGC_F32, REGC_BF16, REGC_F16, REGC_I32, REGC_DTYPE_COUNT } regc_dtype;
typedef enum { REGC_ROLE_INPUT, REGC_ROLE_PARAM, REGC_ROLE_ACT, REGC_ROLE_COUNT } regc_role;

/* Forward ops carry a backward rule (graph/autodiff.c); the ops after
 * REGC_OP_FILL appear only in backward graphs. Shapes (x: [..., C] means any
 * leading dims, flattened to rows):
 *   EMBEDDING     (ids i32 [...], table [V, C]) [padding_idx] -> [..., C]
 *                 with padding_idx, that id's row takes no gradient (PyTorch's)
 *   ADD           (a, b) same shape                       -> a's shape
 *   BIAS_ADD      (x [..., S...], b [S...]) b broadcast    -> x's shape
 *   LAYERNORM     (x [..., C], w [C], b [C]) eps           -> y, mean [...], rstd [...]
 *   MATMUL        (a, b) trans_a, trans_b; each operand is a matrix of its
 *                 last dim by the product of the others. Result: op(a) op(b);
 *                 shape a.shape[:-1] + [N] when !trans_a, else [M, N]
 *   GELU          (x) tanh form                           -> x's shape
 *   SPLIT         (x [..., n*C]) into n equal parts on the last axis -> n x [..., C]
 *   CONCAT        (x1..xn [..., Ci]) on the last axis      -> [..., sum of Ci]
 *   ATTENTION     (q [B, Tq, H*D], k, v [B, Tk, Hkv*D] [, bias [H, Tq, Tk]]
 *                 [, site i32 [1], draw i32 [4]] [, doc_start i32 [B, Tq]])
 *                 n_head, n_kv_head, causal, scale        -> out [B, Tq, H*D], lse [B, H, Tq]
 *                 bias (T5's position bias) is added to the scaled scores
 *                 before masking and softmax, the same for every batch row;
 *                 [softcap] caps the scaled scores (never with a bias),
 *                 [window] slides the causal mask (Gemma 2's, Mistral's);
 *                 [value] = p drops the probabilities as DROPOUT drops x
 *                 (GPT-2's attn_pdrop), site and draw given then alone;
 *                 [documents] (causal) reads doc_start: query i of row b
 *                 sees no key before doc_start[b, i] (packed documents);
 *                 lse stays the undropped softmax's (regc_attn_slots_of)
 *   RESHAPE       (x) to the output's shape, same element count (a view)
 *   TRANSPOSE     (x) perm                                -> x.shape[perm[i]]
 *   CROSS_ENTROPY (logits [..., V], targets i32 [...])    -> loss [] (mean), lse [...]
 *   RMSNORM       (x [..., C], w [C]) eps                  -> y, rstd [...]
 *                 y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)
 *   ROPE          (x [B, T, H*D], cos [T, R/2], sin [T, R/2]) n_head, inverse -> x's shape
 *                 per head, over its first R <= D values (all of it, or
 *                 Phi's and GPT-NeoX's part), halves x1 = x[:R/2], x2 =
 *                 x[R/2:R] (HF Llama's rotate_half): y1 = x1 cos - x2 sin,
 *                 y2 = x2 cos + x1 sin, and y = x past R; inverse = 1 negates
 *                 sin (the backward rotation). cos and sin are constants:
 *                 autodiff gives them no gradient
 *   SILU          (x) x * sigmoid(x)                       -> x's shape
 *   GELU_ERF      (x) exact form 0.5 x (1 + erf(x / sqrt 2)) -> x's shape
 *   RELU          (x) max(x, 0)                            -> x's shape
 *   SCALE         (x) value                                -> value * x, x's shape
 *   SUB, DIV      (a, b) a - b, a / b; b of a's shape, of its trailing
 *                 dimensions (broadcast over the leading ones, as BIAS_ADD)
 *                 or of its shape with the last dimension 1 (a row's
 *                 statistic, broadcast along the row)   -> a's shape
 *   MUL           (a, b) a * b, b broadcast as SUB's      -> a's shape
 *   NEG, EXP, TANH, RSQRT (x) -x, e^x, tanh x, 1 / sqrt x  -> x's shape
 *   ADD_SCALAR    (x) value                                -> x + value, x's shape
 *   POW           (x) value                                -> x^value, x's shape
 *   SOFTMAX, LOG_SOFTMAX (x [..., C]) over the last axis    -> y [..., C], lse [...]
 *                 lse: each row's log-sum-exp, a statistic (as CROSS_ENTROPY's)
 *   SUM_LAST, MEAN_LAST (x [..., C]) over the last axis     -> [..., 1]
 *   EXPAND        (x [..., 1]) along the last axis to the output's shape [..., C]
 *   MASKED_FILL   (x, mask) value: value where mask != 0, else x; mask f32,
 *                 broadcast as SUB's b, and given no gradient -> x's shape
 *   SLICE         (x) axis, start: elements start .. start + len - 1 of
 *                 the axis, len the output's size there -> the output's shape
 *   DROPOUT       (x, site i32 [1], draw i32 [4]) value = p -> x's shape: each
 *                 element kept with probability 1 - p and scaled by 1 / (1 - p),
 *                 else 0, by Philox4x32-10 (kernels' regc_backend dropout): the
 *                 mask a function of the run's seed and micro-batch (draw), the
 *                 site and the element alone; its backward applies the same mask
 *   FILL          () value                                 -> the given shape
 *   SUM_ROWS      (x [..., S...])                          -> [S...] summed over leading dims
 *   EMBEDDING_BWD (dout [..., C], ids [...]) vocab         -> dtable [vocab, C]
 *   LAYERNORM_BWD (dy, x, w, mean, rstd)                   -> dx, dw, db
 *   GELU_BWD      (dy, x)                                  -> dx
 *   ATTENTION_BWD (dout, q, k, v, out, lse [, bias] [, site, draw]) as
 *                 ATTENTION                              -> dq, dk, dv [, dbias]
 *                 dbias [H, Tq, Tk] (summed over the batch) only with a bias
 *   CROSS_ENTROPY_BWD (dloss [], logits, targets, lse)     -> dlogits
 *   RMSNORM_BWD   (dy, x, w, rstd)                         -> dx, dw
 *   SILU_BWD      (dy, x)                                  -> dx
 *   GELU_ERF_BWD  (dy, x)                                  -> dx
 *   TANH_BWD      (dy, y) y = tanh x                       -> dy (1 - y^2)
 *   SLICE_BWD     (dy) axis, start: dy placed in zeros of the output's shape
 *   RELU_BWD      (dy, x)                                  -> dx = dy where x > 0, else 0 */
typedef enum {
    REGC_OP_EMBEDDING,
    REGC_OP_ADD,
    REGC_OP_BIAS_ADD,
    REGC_OP_LAYERNORM,
    REGC_OP_MATMUL,
    REGC_OP_GELU,
    REGC_OP_SPLIT,
    REGC_OP_CONCAT,
    REGC_OP_ATTENTION,
    REGC_OP_RESHAPE,
    REGC_OP_TRANSPOSE,
    REGC_OP_CROSS_ENTROPY,
    REGC_OP_RMSNORM,
    REGC_OP_ROPE,
    REGC_OP_SILU,
    REGC_OP_MUL,
    REGC_OP_GELU_ERF,
    REGC_OP_RELU,
    REGC_OP_SCALE,
    REGC_OP_SUB,
    REGC_OP_DIV,
    REGC_OP_NEG,
    REGC_OP_ADD_SCALAR,
    REGC_OP_EXP,
    REGC_OP_TANH,
    REGC_OP_RSQRT,
    REGC_OP_POW,
    REGC_OP_SOFTMAX,
    REGC_OP_LOG_SOFTMAX,
    REGC_OP_SUM_LAST,
    REGC_OP_MEAN_LAST,
    REGC_OP_EXPAND,
    REGC_OP_MASKED_FILL,
    REGC_OP_SLICE,
    REGC_OP_DROPOUT,
    REGC_OP_FILL,
    REGC_OP_SUM_ROWS,
    REGC_OP_EMBEDDING_BWD,
    REGC_OP_LAYERNORM_BWD,
    REGC_OP_GELU_BWD,
    REGC_OP_ATTENTION_BWD,
    REGC_OP_CROSS_ENTROPY_BWD,
    REGC_OP_RMSNORM_BWD,
    REGC_OP_SILU_BWD,
    REGC_OP_GELU_ERF_BWD,
    REGC_OP_RELU_BWD,
    REGC_OP_TANH_BWD,
    REGC_OP_SLICE_BWD,
    REGC_OP_COUNT
} regc_op;

/* Attributes of a node; each op reads only its own fields (the rest stay 0). */
typedef struct {
    int trans_a, trans_b;  /* MATMUL */
    float eps;             /* LAYERNORM, RMSNORM */
    int n_head, n_kv_head; /* ATTENTION, ATTENTION_BWD; n_head also ROPE */
    int inverse;           /* ROPE: rotate backwards (negated sin) */
    int causal;            /* ATTENTION, ATTENTION_BWD */
    float scale;           /* ATTENTION, ATTENTION_BWD */
    float softcap; /* ATTENTION, ATTENTION_BWD: scores capped, softcap tanh(x / softcap); 0: none */
    int64_t window; /* ATTENTION, ATTENTION_BWD (causal): keys i - window + 1 .. i; 0: all */
    int documents;  /* ATTENTION, ATTENTION_BWD (causal): the doc_start input, read last */
    int perm[REGC_MAX_DIMS]; /* TRANSPOSE */
    float value;         /* FILL, SCALE, ADD_SCALAR, POW (the exponent), DROPOUT (p), ATTENTION and
                            ATTENTION_BWD (the probabilities' dropout p; 0: none) */
    int64_t vocab;       /* EMBEDDING_BWD: rows of the table */
    int padded;          /* EMBEDDING, EMBEDDING_BWD: padding_idx is set */
    int64_t padding_idx; /* ... the id whose row the backward leaves out */
    int axis;            /* SLICE, SLICE_BWD */
    int64_t start;       /* SLICE, SLICE_BWD */
} regc_attrs;

typedef struct {
    char *name;
    regc_dtype dtype;
    regc_role role;
    int ndim; /* 0 for a scalar */
    int64_t shape[REGC_MAX_DIMS];
    int producer; /* index of the producing node, -1 for inputs and params */
    /* An input whose values depend on the shapes alone (positions, rotary
     * tables, relative-position buckets, token types of one segment): the
     * same for every batch, never trained. An architecture computes it; a
     * graph model reads it from its weights file by name. 0 for data
     * inputs (token ids, targets) and for everything else. */
    int constant;
    /* A parameter that is never trained (the base of a LoRA model): it takes
     * no gradient, no optimizer state and no weight-gradient product; the
     * gradient of what reads it still flows. 1: held in fp32;
     * REGC_FROZEN_BF16: held in bf16, read by matrix products alone, which
     * multiply it as bf16 GEMMs do; REGC_FROZEN_NF4 (_BF16): held in NF4,
     * QLoRA's 4 bits, read as the B operand of matrix products alone,
     * dequantised as they read it (in bf16 GEMMs). 0 for everything else. */
    int frozen;
} regc_tensor;

typedef struct {
    regc_op op;
    regc_attrs attrs;
    int n_in, n_out;
    int in[REGC_MAX_IO];  /* tensor ids */
    int out[REGC_MAX_IO]; /* tensor ids */
} regc_node;

typedef struct regc_graph regc_graph;

regc_graph *regc_graph_new(void);
void regc_graph_free(regc_graph *g);
/* A copy of g, ids and names the same; NULL when out of memory. */
regc_graph *regc_graph_dup(const regc_graph *g);

/* Add a graph input or a parameter; returns its tensor id, or a negative
 * status (duplicate name, bad shape). */
int regc_graph_add_tensor(regc_graph *g, const char *name, regc_dtype dtype, regc_role role,
                          int ndim, const int64_t *shape);
/* The same for a constant input (regc_tensor's `constant`). */
int regc_graph_add_constant(regc_graph *g, const char *name, regc_dtype dtype, int ndim,
                            const int64_t *shape);
/* Add a node: checks the inputs, infers the outputs' shapes and dtypes and
 * creates them (named "%<id>"). For RESHAPE and FILL the output shape is
 * given in out_ndim/out_shape (ignored otherwise); for SPLIT n_out is the
 * number of parts. Returns the node index and writes the output ids to
 * out, or a negative status with a message naming the op and tensors. */
int regc_graph_add_node(regc_graph *g, regc_op op, const regc_attrs *attrs, int n_in, const int *in,
                        int n_out, int *out, int out_ndim, const int64_t *out_shape);

/* Freeze (1, or a REGC_FROZEN_* kind) or thaw (0) parameter t
 * (regc_tensor's `frozen`). */
int regc_graph_set_frozen(regc_graph *g, int t, int frozen);
/* Make every causal ATTENTION node of g without a doc_start read tensor
 * docs as its doc_start (packed documents: an i32 [B, Tq] input, appended
 * last), its shape checked as add_node checks it; *changed: how many. */
int regc_graph_attend_documents(regc_graph *g, int docs, int *changed);
/* Add g's inputs, constants and parameters to h, in g's order; map[t]
 * (n_tensors entries) gets each one's id in h. For a graph rebuilt node by
 * node into h. */
int regc_graph_copy_leaves(const regc_graph *g, regc_graph *h, int *map);
/* A copy of g with the decomposed ops regc knows replaced by its own
 * (graph_fuse.c: a written-out RMSNorm or LayerNorm, GPT-2's tanh GELU), each only
 * where nothing else reads the ops it replaces. */
int regc_graph_fuse_patterns(const regc_graph *g, regc_graph **out);

/* Graph outputs (a training graph's loss and gradients). */
int regc_graph_mark_output(regc_graph *g, int tensor);
int regc_graph_n_outputs(const regc_graph *g);
int regc_graph_output(const regc_graph *g, int i);

int regc_graph_n_tensors(const regc_graph *g);
int regc_graph_n_nodes(const regc_graph *g);
const regc_tensor *regc_graph_tensor(const regc_graph *g, int id);
const regc_node *regc_graph_node(const regc_graph *g, int index);
int regc_graph_find_tensor(const regc_graph *g, const char *name); /* id or -1 */

/* ---- one helper per op for frontends: a tensor id, or a negative status */
int regc_graph_embedding(regc_graph *g, int ids, int table);
/* the same, padding_idx's row taking no gradient (PyTorch's padding_idx) */
int regc_graph_embedding_padded(regc_graph *g, int ids, int table, int64_t padding_idx);
int regc_graph_add(regc_graph *g, int a, int b);
int regc_graph_bias_add(regc_graph *g, int x, int b);
int regc_graph_layernorm(regc_graph *g, int x, int w, int b, float eps);
int regc_graph_matmul(regc_graph *g, int a, int b, int trans_a, int trans_b);
int regc_graph_gelu(regc_graph *g, int x);
int regc_graph_split(regc_graph *g, int x, int parts, int *out); /* returns 0 */
int regc_graph_concat(regc_graph *g, int n, const int *xs);
int regc_graph_attention(regc_graph *g, int q, int k, int v, int n_head, int n_kv_head, int causal,
                         float scale);
int regc_graph_reshape(regc_graph *g, int x, int ndim, const int64_t *shape);
int regc_graph_transpose(regc_graph *g, int x, const int *perm);
int regc_graph_cross_entropy(regc_graph *g, int logits, int targets);
/* ATTENTION with every attribute of a (heads, causal, scale, softcap,
 * window) and every input: bias -1 for none; site and draw (DROPOUT's)
 * when a->value, the probabilities' dropout p, is above 0, else -1; docs,
 * the doc_start input (a->documents is then set), or -1. */
int regc_graph_attention_full(regc_graph *g, int q, int k, int v, int bias, int site, int draw,
                              int docs, const regc_attrs *a);
/* attention with an additive score bias [n_head, Tq, Tk] (T5) */
int regc_graph_attention_bias(regc_graph *g, int q, int k, int v, int bias, int n_head,
                              int n_kv_head, int causal, float scale);
int regc_graph_rmsnorm(regc_graph *g, int x, int w, float eps);
int regc_graph_rope(regc_graph *g, int x, int cos, int sin, int n_head);
int regc_graph_silu(regc_graph *g, int x);
int regc_graph_mul(regc_graph *g, int a, int b);
int regc_graph_gelu_erf(regc_graph *g, int x);
int regc_graph_relu(regc_graph *g, int x);
int regc_graph_scale(regc_graph *g, int x, float value);
int regc_graph_sub(regc_graph *g, int a, int b);
int regc_graph_div(regc_graph *g, int a, int b);
int regc_graph_neg(regc_graph *g, int x);
int regc_graph_add_scalar(regc_graph *g, int x, float value);
int regc_graph_exp(regc_graph *g, int x);
int regc_graph_tanh(regc_graph *g, int x);
int regc_graph_rsqrt(regc_graph *g, int x);
int regc_graph_pow(regc_graph *g, int x, float exponent);
int regc_graph_softmax(regc_graph *g, int x);              /* y; the lse output is made too */
int regc_graph_log_softmax(regc_graph *g, int x);          /* y */
int regc_graph_sum_last(regc_graph *g, int x);             /* [..., 1] */
int regc_graph_mean_last(regc_graph *g, int x);            /* [..., 1] */
int regc_graph_expand(regc_graph *g, int x, int64_t cols); /* [..., 1] -> [..., cols] */
int regc_graph_masked_fill(regc_graph *g, int x, int mask, float value);
int regc_graph_slice(regc_graph *g, int x, int axis, int64_t start, int64_t len);
int regc_graph_dropout(regc_graph *g, int x, int site, int draw, float p);

/* ---- facts about ops, dtypes and tensors */

/* Where an ATTENTION's or ATTENTION_BWD's optional inputs sit among its
 * n_in (its dropout's when a->value > 0); -1 where absent. */
typedef struct {
    int bias, site, draw, docs;
} regc_attn_slots;
/* REGC_OK, or an error naming op when n_in does not fit its attributes. */
int regc_attn_slots_of(regc_op op, const regc_attrs *a, int n_in, regc_attn_slots *out);

const char *regc_op_name(regc_op op);
int regc_op_from_name(const char *name); /* op or -1 */
const char *regc_dtype_name(regc_dtype t);
int regc_dtype_from_name(const char *name); /* dtype or -1 */
size_t regc_dtype_size(regc_dtype t);
const char *regc_role_name(regc_role r);
int64_t regc_tensor_numel(const regc_tensor *t);
/* The bytes a frozen parameter is held in (its kind's: 4, 2 or NF4's per
 * value); the same for n values of frozen kind `kind`. */
int64_t regc_frozen_bytes(const regc_tensor *t);
int64_t regc_frozen_kind_bytes(int kind, int64_t n);
/* The name of frozen kind k as graph JSON spells its role ("frozen",
 * "frozen_bf16", "frozen_nf4", "frozen_nf4_bf16"), NULL for 0; and back
 * (0 for none). */
const char *regc_frozen_role(int kind);
int regc_frozen_from_role(const char *role);
int64_t regc_tensor_bytes(const regc_tensor *t); /* numel x dtype size */

/* ---- text and JSON forms */
/* A readable listing: one line per tensor input/parameter, one per node. */
void regc_graph_dump(const regc_graph *g, FILE *f);
/* The same graph in Graphviz DOT: one box per node, one edge per tensor read. */
void regc_graph_dump_dot(const regc_graph *g, FILE *f);
/* regc's graph JSON; the caller frees the string. Serialising a graph read
 * back from this text gives the same text. */
char *regc_graph_to_json(const regc_graph *g);
/* Parse and check a graph JSON text; errors name `source` (a file name)
 * and the offending node or tensor. */
int regc_graph_from_json(const char *text, const char *source, regc_graph **out);

/* ---- canonical form (graph/graph_canon.c): the bytes compile-cache keys
 * hash. Every tensor's role, dtype and shape, every node, the outputs;
 * names only of graph inputs (the trainer fills inputs by name), never of
 * parameters. */
int regc_graph_canon(const regc_graph *g, regc_bytes *b);
/* A tensor's dtype and shape. */
void regc_graph_canon_shape(regc_bytes *b, const regc_tensor *t);
/* A node: op, attributes, and its tensors as id[t] (NULL: the graph's own
 * ids), each output with its dtype and shape. */
void regc_graph_canon_node(regc_bytes *b, const regc_graph *g, const regc_node *n, const int *id);

/* ---- autodiff (graph/autodiff.c) */
/* Reverse mode: append to g the nodes computing the vector-Jacobian product
 * of tensor y with its incoming gradient dy (a tensor of y's shape). On
 * return grad_of[t] (an array of regc_graph_n_tensors(g) entries as it was
 * before the call) is the id of the gradient of tensor t, or -1 where y
 * does not depend on t. Every op before REGC_OP_FILL has a rule. */
int regc_autodiff_vjp(regc_graph *g, int y, int dy, int *grad_of);
/* The training form: y is a scalar loss, dy = 1. */
int regc_autodiff_loss(regc_graph *g, int loss, int *grad_of);
/* The general form over the first n_tensors tensors and n_nodes nodes of g
 * (the forward part): tensor ys[i] starts with gradient dys[i]. A seed on a
 * node's output is its incoming gradient; a seed on an input is a partial
 * sum already accumulated elsewhere, to which the contributions found here
 * are added in the same reverse reader order as one whole-graph pass would
 * add them. leaf_needs[t] (NULL: all) says which float inputs and
 * parameters receive gradients. */
/* needs[t] for the first n_tensors tensors: t is a float tensor that
 * depends, through the first n_nodes nodes, on a float input or parameter
 * (those with leaf_needs[t] set, or all when leaf_needs is NULL). */
void regc_autodiff_needs(const regc_graph *g, int n_tensors, int n_nodes, const char *leaf_needs,
                         char *needs);
int regc_autodiff_seeded(regc_graph *g, int n_tensors, int n_nodes, int n_seeds, const int *ys,
                         const int *dys, const char *leaf_needs, int *grad_of);

#endif
