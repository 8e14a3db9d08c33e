/* graph.c — the graph IR: storage, tensor names, and one shape rule per op.
 *
 * A node may only read tensors that already exist, so insertion order is a
 * topological order and a cycle cannot be built. Shape rules live in
 * graph_infer_outputs(): the one place that knows what each op accepts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "regc_common.h"
#include "regc_graph.h"

struct regc_graph {
    regc_tensor *tensors;
    int n_tensors, cap_tensors;
    regc_node *nodes;
    int n_nodes, cap_nodes;
    int *outputs;
    int n_outputs, cap_outputs;
    /* open-addressing table of tensor ids keyed by name, for unique names
     * and fast lookup in graphs with tens of thousands of tensors */
    int *slots;
    int n_slots;
};

/* ---------------------------------------------------------------- facts */

/* Each op's name and its input and output counts (-1: one to
 * REGC_MAX_IO); the shape rules are in infer_outputs. */
static const struct {
    const char *name;
    int n_in, n_out;
} op_info[REGC_OP_COUNT] = {
    [REGC_OP_EMBEDDING] = {"embedding", 2, 1},
    [REGC_OP_ADD] = {"add", 2, 1},
    [REGC_OP_BIAS_ADD] = {"bias_add", 2, 1},
    [REGC_OP_LAYERNORM] = {"layernorm", 3, 3},
    [REGC_OP_MATMUL] = {"matmul", 2, 1},
    [REGC_OP_GELU] = {"gelu", 1, 1},
    [REGC_OP_SPLIT] = {"split", 1, -1},
    [REGC_OP_CONCAT] = {"concat", -1, 1},
    [REGC_OP_ATTENTION] = {"attention", -1, 2},
    [REGC_OP_RESHAPE] = {"reshape", 1, 1},
    [REGC_OP_TRANSPOSE] = {"transpose", 1, 1},
    [REGC_OP_CROSS_ENTROPY] = {"cross_entropy", 2, 2},
    [REGC_OP_RMSNORM] = {"rmsnorm", 2, 2},
    [REGC_OP_ROPE] = {"rope", 3, 1},
    [REGC_OP_SILU] = {"silu", 1, 1},
    [REGC_OP_MUL] = {"mul", 2, 1},
    [REGC_OP_GELU_ERF] = {"gelu_erf", 1, 1},
    [REGC_OP_RELU] = {"relu", 1, 1},
    [REGC_OP_SCALE] = {"scale", 1, 1},
    [REGC_OP_SUB] = {"sub", 2, 1},
    [REGC_OP_DIV] = {"div", 2, 1},
    [REGC_OP_NEG] = {"neg", 1, 1},
    [REGC_OP_ADD_SCALAR] = {"add_scalar", 1, 1},
    [REGC_OP_EXP] = {"exp", 1, 1},
    [REGC_OP_TANH] = {"tanh", 1, 1},
    [REGC_OP_RSQRT] = {"rsqrt", 1, 1},
    [REGC_OP_POW] = {"pow", 1, 1},
    [REGC_OP_SOFTMAX] = {"softmax", 1, 2},
    [REGC_OP_LOG_SOFTMAX] = {"log_softmax", 1, 2},
    [REGC_OP_SUM_LAST] = {"sum_last", 1, 1},
    [REGC_OP_MEAN_LAST] = {"mean_last", 1, 1},
    [REGC_OP_EXPAND] = {"expand", 1, 1},
    [REGC_OP_MASKED_FILL] = {"masked_fill", 2, 1},
    [REGC_OP_SLICE] = {"slice", 1, 1},
    [REGC_OP_FILL] = {"fill", 0, 1},
    [REGC_OP_SUM_ROWS] = {"sum_rows", 1, 1},
    [REGC_OP_EMBEDDING_BWD] = {"embedding_bwd", 2, 1},
    [REGC_OP_LAYERNORM_BWD] = {"layernorm_bwd", 5, 3},
    [REGC_OP_GELU_BWD] = {"gelu_bwd", 2, 1},
    [REGC_OP_ATTENTION_BWD] = {"attention_bwd", -1, -1},
    [REGC_OP_CROSS_ENTROPY_BWD] = {"cross_entropy_bwd", 4, 1},
    [REGC_OP_RMSNORM_BWD] = {"rmsnorm_bwd", 4, 2},
    [REGC_OP_SILU_BWD] = {"silu_bwd", 2, 1},
    [REGC_OP_GELU_ERF_BWD] = {"gelu_erf_bwd", 2, 1},
    [REGC_OP_RELU_BWD] = {"relu_bwd", 2, 1},
    [REGC_OP_TANH_BWD] = {"tanh_bwd", 2, 1},
    [REGC_OP_SLICE_BWD] = {"slice_bwd", 1, 1},
};

const char *regc_op_name(regc_op op)
{
    return (op >= 0 && op < REGC_OP_COUNT) ? op_info[op].name : "?";
}

int regc_op_from_name(const char *name)
{
    for (int i = 0; i < REGC_OP_COUNT; i++)
        if (strcmp(op_info[i].name, name) == 0)
            return i;
    return -1;
}

static const char *const dtype_names[REGC_DTYPE_COUNT] = {"f32", "bf16", "f16", "i32"};
static const size_t dtype_sizes[REGC_DTYPE_COUNT] = {4, 2, 2, 4};

const char *regc_dtype_name(regc_dtype t)
{
    return (t >= 0 && t < REGC_DTYPE_COUNT) ? dtype_names[t] : "?";
}

int regc_dtype_from_name(const char *name)
{
    for (int i = 0; i < REGC_DTYPE_COUNT; i++)
        if (strcmp(dtype_names[i], name) == 0)
            return i;
    return -1;
}

size_t regc_dtype_size(regc_dtype t)
{
    return (t >= 0 && t < REGC_DTYPE_COUNT) ? dtype_sizes[t] : 0;
}

const char *regc_role_name(regc_role r)
{
    static const char *const names[REGC_ROLE_COUNT] = {"input", "param", "act"};
    return (r >= 0 && r < REGC_ROLE_COUNT) ? names[r] : "?";
}

int64_t regc_tensor_numel(const regc_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

int64_t regc_tensor_bytes(const regc_tensor *t)
{
    return regc_tensor_numel(t) * (int64_t)regc_dtype_size(t->dtype);
}

/* ---------------------------------------------------------------- storage */

regc_graph *regc_graph_new(void)
{
    regc_graph *g = calloc(1, sizeof *g);
    if (!g)
        regc_error(REGC_ERR_MEMORY, "out of memory creating a graph");
    return g;
}

void regc_graph_free(regc_graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->tensors);
    free(g->nodes);
    free(g->outputs);
    free(g->slots);
    free(g);
}

int regc_graph_n_tensors(const regc_graph *g) { return g->n_tensors; }
int regc_graph_n_nodes(const regc_graph *g) { return g->n_nodes; }
int regc_graph_n_outputs(const regc_graph *g) { return g->n_outputs; }
int regc_graph_output(const regc_graph *g, int i) { return g->outputs[i]; }

const regc_tensor *regc_graph_tensor(const regc_graph *g, int id)
{
    return (id >= 0 && id < g->n_tensors) ? &g->tensors[id] : NULL;
}

const regc_node *regc_graph_node(const regc_graph *g, int index)
{
    return (index >= 0 && index < g->n_nodes) ? &g->nodes[index] : NULL;
}

static int grow(void **items, int *cap, int need, size_t item_size)
{
    if (need <= *cap)
        return REGC_OK;
    int new_cap = *cap ? *cap : 16;
    while (new_cap < need)
        new_cap *= 2;
    void *p = realloc(*items, (size_t)new_cap * item_size);
    if (!p)
        return regc_error(REGC_ERR_MEMORY, "out of memory growing a graph");
    *items = p;
    *cap = new_cap;
    return REGC_OK;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Slot holding `name`, or the empty slot where it would go. */
static int name_slot(const regc_graph *g, const char *name)
{
    size_t mask = (size_t)g->n_slots - 1;
    size_t i = name_hash(name) & mask;
    while (g->slots[i] >= 0 && strcmp(g->tensors[g->slots[i]].name, name) != 0)
        i = (i + 1) & mask;
    return (int)i;
}

static int rehash(regc_graph *g, int n_slots)
{
    int *slots = malloc((size_t)n_slots * sizeof *slots);
    if (!slots)
        return regc_error(REGC_ERR_MEMORY, "out of memory growing a graph");
    for (int i = 0; i < n_slots; i++)
        slots[i] = -1;
    free(g->slots);
    g->slots = slots;
    g->n_slots = n_slots;
    for (int t = 0; t < g->n_tensors; t++)
        g->slots[name_slot(g, g->tensors[t].name)] = t;
    return REGC_OK;
}

int regc_graph_find_tensor(const regc_graph *g, const char *name)
{
    if (g->n_slots == 0)
        return -1;
    return g->slots[name_slot(g, name)];
}

static const char *shape_str(const regc_tensor *t, char *buf, size_t cap);

/* Append a tensor with a unique name; returns its id or a negative status. */
static int new_tensor(regc_graph *g, const char *name, regc_dtype dtype, regc_role role, int ndim,
                      const int64_t *shape, int producer)
{
    if (ndim < 0 || ndim > REGC_MAX_DIMS)
        return regc_error(REGC_ERR_SHAPE, "tensor %s: %d dimensions (at most %d)", name, ndim,
                          REGC_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1)
            return regc_error(REGC_ERR_SHAPE, "tensor %s: dimension %d has size %lld", name, i,
                              (long long)shape[i]);
    if (dtype < 0 || dtype >= REGC_DTYPE_COUNT)
        return regc_error(REGC_ERR_ARG, "tensor %s: bad dtype", name);
    /* Every tensor's element and byte counts fit in int64, so that
     * regc_tensor_numel and regc_tensor_bytes, which every later stage
     * calls, never overflow; the dimensions come from untrusted files. */
    int64_t numel = 1, bytes;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel) ||
            __builtin_mul_overflow(numel, (int64_t)dtype_sizes[dtype], &bytes)) {
            regc_tensor t = {.ndim = ndim};
            memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
            char s[128];
            return regc_error(REGC_ERR_SHAPE,
                              "tensor %s: shape %s has more bytes than int64 counts", name,
                              shape_str(&t, s, sizeof s));
        }
    if (regc_graph_find_tensor(g, name) >= 0)
        return regc_error(REGC_ERR_ARG, "tensor %s: name used twice", name);
    if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors))
        return REGC_ERR_MEMORY;
    if ((g->n_tensors + 1) * 2 > g->n_slots && rehash(g, g->n_slots ? g->n_slots * 2 : 64))
        return REGC_ERR_MEMORY;
    char *copy = strdup(name);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "out of memory naming a tensor");
    int id = g->n_tensors++;
    regc_tensor *t = &g->tensors[id];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->dtype = dtype;
    t->role = role;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->producer = producer;
    g->slots[name_slot(g, name)] = id;
    return id;
}

int regc_graph_add_tensor(regc_graph *g, const char *name, regc_dtype dtype, regc_role role,
                          int ndim, const int64_t *shape)
{
    if (role == REGC_ROLE_ACT)
        return regc_error(REGC_ERR_ARG, "tensor %s: activations are created by nodes", name);
    if (name[0] == '%')
        return regc_error(REGC_ERR_ARG, "tensor %s: names starting with %% are reserved", name);
    return new_tensor(g, name, dtype, role, ndim, shape, -1);
}

int regc_graph_add_constant(regc_graph *g, const char *name, regc_dtype dtype, int ndim,
                            const int64_t *shape)
{
    int id = regc_graph_add_tensor(g, name, dtype, REGC_ROLE_INPUT, ndim, shape);
    if (id >= 0)
        g->tensors[id].constant = 1;
    return id;
}

int regc_graph_mark_output(regc_graph *g, int tensor)
{
    if (tensor < 0 || tensor >= g->n_tensors)
        return regc_error(REGC_ERR_ARG, "graph output: no tensor %d", tensor);
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == tensor)
            return REGC_OK;
    if (grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1, sizeof *g->outputs))
        return REGC_ERR_MEMORY;
    g->outputs[g->n_outputs++] = tensor;
    return REGC_OK;
}

/* ---------------------------------------------------------------- shapes */

/* The shape and dtype of one output, filled in by the shape rules. */
typedef struct {
    regc_dtype dtype;
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
} out_spec;

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

/* "[2, 3, 4]" into buf, for messages */
static const char *shape_str(const regc_tensor *t, char *buf, size_t cap)
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
                      shape_str(t, s, sizeof s), what);
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
    snprintf(what, sizeof what, "expected shape %s", shape_str(&want, s, sizeof s));
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
    return REGC_OK;
}

/* Attention's optional score bias: [n_head, Tq, Tk], shared by the batch. */
static int want_bias(regc_op op, const regc_attrs *a, const regc_tensor *q, const regc_tensor *k,
                     const regc_tensor *bias)
{
    int64_t s[3] = {a->n_head, q->shape[1], k->shape[1]};
    return want_shape(op, bias, 3, s);
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
static int infer_outputs(regc_op op, const regc_attrs *a, int n_in, const regc_tensor *const *x,
                         int n_out, out_spec *o, int out_ndim, const int64_t *out_shape)
{
    const char *name = regc_op_name(op);
    const int want_in = op_info[op].n_in, want_out = op_info[op].n_out;
    if (want_in >= 0 ? n_in != want_in : (n_in < 1 || n_in > REGC_MAX_IO))
        return regc_error(REGC_ERR_ARG, "%s: %d inputs given", name, n_in);
    if (want_out >= 0 ? n_out != want_out : (n_out < 1 || n_out > REGC_MAX_IO))
        return regc_error(REGC_ERR_ARG, "%s: %d outputs requested", name, n_out);
    /* every op but these reads f32 in every slot (ids are read only from
     * the graph's inputs, whose values are checked when they are filled) */
    for (int i = 0; i < n_in; i++) {
        int is_index =
            (op == REGC_OP_EMBEDDING && i == 0) || (op == REGC_OP_EMBEDDING_BWD && i == 1) ||
            (op == REGC_OP_CROSS_ENTROPY && i == 1) || (op == REGC_OP_CROSS_ENTROPY_BWD && i == 2);
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
                     (long long)k_b, x[0]->name, shape_str(x[0], sa, sizeof sa), (long long)k_a);
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
        /* q, k, v and optionally T5's additive score bias */
        if (n_in != 3 && n_in != 4)
            return regc_error(REGC_ERR_ARG, "%s: %d inputs given (3, or 4 with a bias)", name,
                              n_in);
        if (infer_attention(op, a, x[0], x[1], x[2]) ||
            (n_in == 4 && want_bias(op, a, x[0], x[1], x[3])))
            return REGC_ERR_SHAPE;
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
        /* the head dimension splits into two halves, so it must be even */
        if (x[0]->ndim != 3 || x[0]->shape[2] % (2 * a->n_head))
            return bad(op, x[0], "expected [B, T, n_head * head_dim] with an even head_dim");
        int64_t cs[2] = {x[0]->shape[1], x[0]->shape[2] / a->n_head / 2};
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
        /* a forward with a bias reads it again and returns its gradient too */
        if ((n_in != 6 && n_in != 7) || n_out != n_in - 3)
            return regc_error(REGC_ERR_ARG,
                              "%s: %d inputs and %d outputs (6 and 3, or 7 and 4 with a bias)",
                              name, n_in, n_out);
        if (infer_attention(op, a, x[1], x[2], x[3]) ||
            (n_in == 7 && want_bias(op, a, x[1], x[2], x[6])))
            return REGC_ERR_SHAPE;
        int64_t lse[3] = {x[1]->shape[0], a->n_head, x[1]->shape[1]};
        if (!same_shape(x[0], x[1]) || !same_shape(x[4], x[1]) || want_shape(op, x[5], 3, lse))
            return bad(op, x[0], "inputs do not match (dout, q, k, v, out, lse)");
        spec_like(&o[0], x[1]);
        spec_like(&o[1], x[2]);
        spec_like(&o[2], x[3]);
        if (n_out == 4)
            spec_like(&o[3], x[6]);
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

int regc_graph_add_node(regc_graph *g, regc_op op, const regc_attrs *attrs, int n_in, const int *in,
                        int n_out, int *out, int out_ndim, const int64_t *out_shape)
{
    static const regc_attrs no_attrs;
    if (op < 0 || op >= REGC_OP_COUNT)
        return regc_error(REGC_ERR_ARG, "unknown op %d", (int)op);
    if (n_in < 0 || n_in > REGC_MAX_IO || n_out < 0 || n_out > REGC_MAX_IO)
        return regc_error(REGC_ERR_ARG, "%s: too many inputs or outputs", regc_op_name(op));
    if (!attrs)
        attrs = &no_attrs;
    const regc_tensor *x[REGC_MAX_IO];
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0 || in[i] >= g->n_tensors)
            return regc_error(REGC_ERR_ARG, "%s: input %d refers to no tensor (id %d)",
                              regc_op_name(op), i, in[i]);
        x[i] = &g->tensors[in[i]];
    }
    out_spec o[REGC_MAX_IO];
    memset(o, 0, sizeof o);
    int rc = infer_outputs(op, attrs, n_in, x, n_out, o, out_ndim, out_shape);
    if (rc)
        return rc;
    if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes))
        return REGC_ERR_MEMORY;
    regc_node node;
    memset(&node, 0, sizeof node);
    node.op = op;
    node.attrs = *attrs;
    node.n_in = n_in;
    node.n_out = n_out;
    if (n_in > 0)
        memcpy(node.in, in, (size_t)n_in * sizeof *in);
    int index = g->n_nodes, first = g->n_tensors;
    for (int i = 0; i < n_out; i++) {
        char name[32];
        snprintf(name, sizeof name, "%%%d", g->n_tensors);
        int id = new_tensor(g, name, o[i].dtype, REGC_ROLE_ACT, o[i].ndim, o[i].shape, index);
        if (id < 0) {
            /* drop the outputs made so far: the graph stays as it was */
            while (g->n_tensors > first)
                free(g->tensors[--g->n_tensors].name);
            rehash(g, g->n_slots);
            return id;
        }
        node.out[i] = id;
        if (out)
            out[i] = id;
    }
    g->nodes[g->n_nodes++] = node;
    return index;
}
