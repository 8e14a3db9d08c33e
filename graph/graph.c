/* graph.c — the graph IR: the op, dtype and role facts, storage, tensor
 * names, and adding tensors and nodes.
 *
 * A node may only read tensors that already exist, so insertion order is a
 * topological order and a cycle cannot be built. Shape rules live in
 * graph_shapes.c (regc_graph_infer_outputs): the one place that knows what
 * each op accepts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "regc_backend.h"
#include "regc_common.h"

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
    [REGC_OP_DROPOUT] = {"dropout", 3, 1},
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

void regc_op_arity(regc_op op, int *n_in, int *n_out)
{
    *n_in = op_info[op].n_in;
    *n_out = op_info[op].n_out;
}

int regc_attn_slots_of(regc_op op, const regc_attrs *a, int n_in, regc_attn_slots *out)
{
    /* the fixed inputs: q, k, v; the backward's dout before them and out,
     * lse after */
    const int fixed = op == REGC_OP_ATTENTION_BWD ? 6 : 3, drop = a->value > 0.0f ? 2 : 0;
    const int docs = a->documents != 0;
    const int bias = n_in - fixed - drop - docs;
    if (bias != 0 && bias != 1)
        return regc_error(REGC_ERR_ARG, "%s: %d inputs given (%d, one more with a bias%s%s)",
                          regc_op_name(op), n_in, fixed + drop + docs,
                          drop ? ", the dropout's site and draw after it" : "",
                          docs ? ", doc_start last" : "");
    out->bias = bias ? fixed : -1;
    out->site = drop ? fixed + bias : -1;
    out->draw = drop ? fixed + bias + 1 : -1;
    out->docs = docs ? fixed + bias + drop : -1;
    return REGC_OK;
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

regc_graph *regc_graph_dup(const regc_graph *g)
{
    regc_graph *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    *h = *g;
    h->tensors = malloc(((size_t)g->n_tensors + 1) * sizeof *h->tensors);
    h->nodes = malloc(((size_t)g->n_nodes + 1) * sizeof *h->nodes);
    h->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof *h->outputs);
    h->slots = malloc(((size_t)g->n_slots + 1) * sizeof *h->slots);
    h->cap_tensors = g->n_tensors, h->cap_nodes = g->n_nodes, h->cap_outputs = g->n_outputs;
    h->n_tensors = 0;
    if (!h->tensors || !h->nodes || !h->outputs || !h->slots) {
        regc_graph_free(h);
        return NULL;
    }
    memcpy(h->nodes, g->nodes, (size_t)g->n_nodes * sizeof *h->nodes);
    memcpy(h->outputs, g->outputs, (size_t)g->n_outputs * sizeof *h->outputs);
    memcpy(h->slots, g->slots, (size_t)g->n_slots * sizeof *h->slots);
    for (int t = 0; t < g->n_tensors; t++) {
        h->tensors[t] = g->tensors[t];
        if (!(h->tensors[t].name = strdup(g->tensors[t].name))) {
            regc_graph_free(h);
            return NULL;
        }
        h->n_tensors = t + 1;
    }
    return h;
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
                              regc_shape_str(&t, s, sizeof s));
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

/* The roles of the frozen kinds, by kind (0: trained). */
static const char *const frozen_roles[REGC_FROZEN_KINDS] = {NULL, "frozen", "frozen_bf16",
                                                            "frozen_nf4", "frozen_nf4_bf16"};

const char *regc_frozen_role(int kind)
{
    return kind > 0 && kind < REGC_FROZEN_KINDS ? frozen_roles[kind] : NULL;
}

int regc_frozen_from_role(const char *role)
{
    for (int k = 1; role && k < REGC_FROZEN_KINDS; k++)
        if (!strcmp(role, frozen_roles[k]))
            return k;
    return 0;
}

int64_t regc_frozen_bytes(const regc_tensor *t)
{
    return regc_frozen_kind_bytes(t->frozen, regc_tensor_numel(t));
}

int64_t regc_frozen_kind_bytes(int kind, int64_t n)
{
    switch (kind) {
    case REGC_FROZEN_BF16: return 2 * n;
    case REGC_FROZEN_NF4:
    case REGC_FROZEN_NF4_BF16: return regc_nf4_layout(n).bytes;
    default: return 4 * n;
    }
}

int regc_graph_set_frozen(regc_graph *g, int t, int frozen)
{
    if (t < 0 || t >= g->n_tensors || g->tensors[t].role != REGC_ROLE_PARAM)
        return regc_error(REGC_ERR_ARG, "tensor %d: only a parameter can be frozen", t);
    if (frozen < 0 || frozen >= REGC_FROZEN_KINDS)
        return regc_error(REGC_ERR_ARG, "tensor %s: frozen %d", g->tensors[t].name, frozen);
    g->tensors[t].frozen = frozen;
    return REGC_OK;
}

int regc_graph_attend_documents(regc_graph *g, int docs, int *changed)
{
    *changed = 0;
    if (docs < 0 || docs >= g->n_tensors)
        return regc_error(REGC_ERR_ARG, "attention's doc_start refers to no tensor (id %d)", docs);
    for (int i = 0; i < g->n_nodes; i++) {
        regc_node *n = &g->nodes[i];
        if (n->op != REGC_OP_ATTENTION || !n->attrs.causal || n->attrs.documents)
            continue;
        if (n->n_in >= REGC_MAX_IO)
            return regc_error(REGC_ERR_ARG, "node %d (attention): no room for doc_start", i);
        /* the node as it will be, through the same checks as a new one */
        regc_attrs a = n->attrs;
        a.documents = 1;
        const regc_tensor *x[REGC_MAX_IO];
        for (int k = 0; k < n->n_in; k++)
            x[k] = &g->tensors[n->in[k]];
        x[n->n_in] = &g->tensors[docs];
        out_spec o[REGC_MAX_IO];
        memset(o, 0, sizeof o);
        const regc_tensor *y = &g->tensors[n->out[0]];
        int rc =
            regc_graph_infer_outputs(n->op, &a, n->n_in + 1, x, n->n_out, o, y->ndim, y->shape);
        if (rc)
            return regc_error(rc, "node %d (attention) with doc_start: %s", i,
                              regc_error_message());
        n->in[n->n_in++] = docs;
        n->attrs.documents = 1;
        ++*changed;
    }
    return REGC_OK;
}

int regc_graph_copy_leaves(const regc_graph *g, regc_graph *h, int *map)
{
    for (int t = 0; t < g->n_tensors; t++) {
        const regc_tensor *x = &g->tensors[t];
        if (x->producer >= 0)
            continue;
        map[t] = x->constant
                     ? regc_graph_add_constant(h, x->name, x->dtype, x->ndim, x->shape)
                     : regc_graph_add_tensor(h, x->name, x->dtype, x->role, x->ndim, x->shape);
        if (map[t] < 0)
            return map[t];
        h->tensors[map[t]].frozen = x->frozen;
    }
    return REGC_OK;
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
    int rc = regc_graph_infer_outputs(op, attrs, n_in, x, n_out, o, out_ndim, out_shape);
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
