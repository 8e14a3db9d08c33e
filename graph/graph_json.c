/* graph_json.c — regc's graph JSON, written and read with cJSON.
 *
 *   {"format": "regc-graph", "version": 1,
 *    "tensors": [{"id": 0, "name": "input_ids", "dtype": "i32", "role": "input", "shape": [4, 64]},
 * ...], "nodes":   [{"op": "matmul", "in": [3, 7], "out": [8], "trans_a": 0, "trans_b": 1}, ...],
 *    "outputs": [42]}
 *
 * A tensor's role is "input" (data: token ids, targets), "constant" (an
 * input whose values depend on the shapes alone: positions, rotary tables,
 * buckets; a graph model reads them from its weights file), "param", or
 * "frozen" (a parameter never trained: a LoRA model's base; "frozen_bf16"
 * held in bf16, "frozen_nf4" and "frozen_nf4_bf16" in NF4).
 * "tensors" lists graph inputs and parameters only; activations are the
 * nodes' outputs, named "%<id>". Ids are dense and follow creation order, so
 * reading replays inputs, parameters and nodes in id order: a node that reads
 * a tensor not defined before it (a cycle, or a dangling id) is an error. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "regc_common.h"
#include "regc_graph.h"

#define GRAPH_FORMAT "regc-graph"
#define GRAPH_VERSION 1

/* Which attributes each op carries in JSON. */
enum {
    A_TRANS = 1,
    A_EPS = 2,
    A_HEADS = 4,
    A_PERM = 8,
    A_VALUE = 16,
    A_VOCAB = 32,
    A_SHAPE = 64,
    A_ROPE = 128,
    A_SLICE = 256,
    A_PAD = 512, /* optional: written only when set */
};

static int op_attr_set(regc_op op)
{
    switch (op) {
    case REGC_OP_MATMUL: return A_TRANS;
    case REGC_OP_LAYERNORM:
    case REGC_OP_RMSNORM: return A_EPS;
    case REGC_OP_ROPE: return A_ROPE;
    case REGC_OP_ATTENTION:
    case REGC_OP_ATTENTION_BWD: return A_HEADS;
    case REGC_OP_TRANSPOSE: return A_PERM;
    case REGC_OP_FILL: return A_VALUE | A_SHAPE;
    case REGC_OP_SCALE:
    case REGC_OP_ADD_SCALAR:
    case REGC_OP_MASKED_FILL:
    case REGC_OP_DROPOUT:
    case REGC_OP_POW: return A_VALUE;
    case REGC_OP_SLICE:
    case REGC_OP_SLICE_BWD: return A_SLICE | A_SHAPE;
    case REGC_OP_RESHAPE:
    case REGC_OP_EXPAND:
    case REGC_OP_SUM_ROWS: return A_SHAPE;
    case REGC_OP_EMBEDDING: return A_PAD;
    case REGC_OP_EMBEDDING_BWD: return A_VOCAB | A_PAD;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- writing */

static cJSON *int_array(const int *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *shape_array(const int64_t *shape, int ndim)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < ndim; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[i]));
    return a;
}

static cJSON *node_to_json(const regc_graph *g, const regc_node *n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "op", regc_op_name(n->op));
    cJSON_AddItemToObject(o, "in", int_array(n->in, n->n_in));
    cJSON_AddItemToObject(o, "out", int_array(n->out, n->n_out));
    const regc_attrs *a = &n->attrs;
    int set = op_attr_set(n->op);
    if (set & A_TRANS) {
        cJSON_AddNumberToObject(o, "trans_a", a->trans_a);
        cJSON_AddNumberToObject(o, "trans_b", a->trans_b);
    }
    if (set & A_EPS)
        cJSON_AddNumberToObject(o, "eps", a->eps);
    if (set & A_HEADS) {
        cJSON_AddNumberToObject(o, "n_head", a->n_head);
        cJSON_AddNumberToObject(o, "n_kv_head", a->n_kv_head);
        cJSON_AddNumberToObject(o, "causal", a->causal);
        cJSON_AddNumberToObject(o, "scale", a->scale);
        if (a->softcap != 0.0f) /* absent: none, as in files written before it */
            cJSON_AddNumberToObject(o, "softcap", a->softcap);
        if (a->window != 0)
            cJSON_AddNumberToObject(o, "window", (double)a->window);
        if (a->documents) /* absent: one document a row */
            cJSON_AddNumberToObject(o, "documents", 1);
        if (a->value != 0.0f) /* the probabilities' dropout */
            cJSON_AddNumberToObject(o, "dropout", a->value);
    }
    if (set & A_ROPE) {
        cJSON_AddNumberToObject(o, "n_head", a->n_head);
        cJSON_AddNumberToObject(o, "inverse", a->inverse);
    }
    if (set & A_PERM)
        cJSON_AddItemToObject(o, "perm", int_array(a->perm, regc_graph_tensor(g, n->in[0])->ndim));
    if (set & A_VALUE)
        cJSON_AddNumberToObject(o, "value", a->value);
    if (set & A_VOCAB)
        cJSON_AddNumberToObject(o, "vocab", (double)a->vocab);
    if ((set & A_PAD) && a->padded)
        cJSON_AddNumberToObject(o, "padding_idx", (double)a->padding_idx);
    if (set & A_SLICE) {
        cJSON_AddNumberToObject(o, "axis", a->axis);
        cJSON_AddNumberToObject(o, "start", (double)a->start);
    }
    if (set & A_SHAPE) {
        const regc_tensor *t = regc_graph_tensor(g, n->out[0]);
        cJSON_AddItemToObject(o, "shape", shape_array(t->shape, t->ndim));
    }
    return o;
}

char *regc_graph_to_json(const regc_graph *g)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", GRAPH_FORMAT);
    cJSON_AddNumberToObject(root, "version", GRAPH_VERSION);
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    for (int id = 0; id < regc_graph_n_tensors(g); id++) {
        const regc_tensor *t = regc_graph_tensor(g, id);
        if (t->role == REGC_ROLE_ACT)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", id);
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddStringToObject(o, "dtype", regc_dtype_name(t->dtype));
        cJSON_AddStringToObject(o, "role",
                                t->constant ? "constant"
                                : t->frozen ? regc_frozen_role(t->frozen)
                                            : regc_role_name(t->role));
        cJSON_AddItemToObject(o, "shape", shape_array(t->shape, t->ndim));
        cJSON_AddItemToArray(tensors, o);
    }
    cJSON *nodes = cJSON_AddArrayToObject(root, "nodes");
    for (int i = 0; i < regc_graph_n_nodes(g); i++)
        cJSON_AddItemToArray(nodes, node_to_json(g, regc_graph_node(g, i)));
    cJSON *outputs = cJSON_AddArrayToObject(root, "outputs");
    for (int i = 0; i < regc_graph_n_outputs(g); i++)
        cJSON_AddItemToArray(outputs, cJSON_CreateNumber(regc_graph_output(g, i)));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        regc_error(REGC_ERR_MEMORY, "out of memory writing graph JSON");
    return text;
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    const char *source; /* file name for messages */
    const char *where;  /* "tensors[3]" or "nodes[12] (matmul)" */
} json_ctx;

static int fail(const json_ctx *c, int status, const char *what)
{
    return regc_error(status, "%s: %s: %s", c->source, c->where, what);
}

/* A whole number in [lo, hi] from `key` of object o. */
static int get_int(const json_ctx *c, const cJSON *o, const char *key, int64_t lo, int64_t hi,
                   int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    char msg[160];
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        snprintf(msg, sizeof msg, "\"%s\" must be a whole number in [%lld, %lld]", key,
                 (long long)lo, (long long)hi);
        return fail(c, REGC_ERR_FORMAT, msg);
    }
    *out = (int64_t)v->valuedouble;
    return REGC_OK;
}

/* A number a float holds: a larger one would become infinity, which the
 * writer cannot spell in JSON, so the graph would not read back. */
static int get_float(const json_ctx *c, const cJSON *o, const char *key, float *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= FLT_MAX)) {
        char msg[96];
        snprintf(msg, sizeof msg, "\"%s\" must be a number a float holds", key);
        return fail(c, REGC_ERR_FORMAT, msg);
    }
    *out = (float)v->valuedouble;
    return REGC_OK;
}

/* An array of at most `cap` whole numbers in [lo, hi]. */
static int get_ints(const json_ctx *c, const cJSON *o, const char *key, int cap, int64_t lo,
                    int64_t hi, int64_t *out, int *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    char msg[160];
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > cap) {
        snprintf(msg, sizeof msg, "\"%s\" must be an array of at most %d numbers", key, cap);
        return fail(c, REGC_ERR_FORMAT, msg);
    }
    *n = 0;
    const cJSON *v;
    cJSON_ArrayForEach (v, a) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
            v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
            snprintf(msg, sizeof msg, "\"%s\"[%d] must be a whole number in [%lld, %lld]", key, *n,
                     (long long)lo, (long long)hi);
            return fail(c, REGC_ERR_FORMAT, msg);
        }
        out[(*n)++] = (int64_t)v->valuedouble;
    }
    return REGC_OK;
}

static const char *get_string(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int read_leaf(json_ctx *c, regc_graph *g, const cJSON *o)
{
    const char *name = get_string(o, "name");
    const char *dtype = get_string(o, "dtype");
    const char *role = get_string(o, "role");
    if (!name || !name[0])
        return fail(c, REGC_ERR_FORMAT, "\"name\" must be a non-empty string");
    int dt = dtype ? regc_dtype_from_name(dtype) : -1;
    if (dt < 0)
        return fail(c, REGC_ERR_FORMAT, "\"dtype\" must be one of f32, bf16, f16, i32");
    int r = !role                           ? -1
            : strcmp(role, "input") == 0    ? REGC_ROLE_INPUT
            : strcmp(role, "constant") == 0 ? REGC_ROLE_COUNT /* an input, constant */
            : strcmp(role, "param") == 0    ? REGC_ROLE_PARAM
            : regc_frozen_from_role(role)   ? REGC_ROLE_PARAM
                                            : -1;
    if (r < 0)
        return fail(c, REGC_ERR_FORMAT,
                    "\"role\" must be \"input\", \"constant\", \"param\", "
                    "\"frozen\", \"frozen_bf16\", \"frozen_nf4\" or \"frozen_nf4_bf16\"");
    int64_t shape[REGC_MAX_DIMS];
    int ndim;
    if (get_ints(c, o, "shape", REGC_MAX_DIMS, 1, INT64_C(1) << 40, shape, &ndim))
        return REGC_ERR_FORMAT;
    int id = r == REGC_ROLE_COUNT
                 ? regc_graph_add_constant(g, name, (regc_dtype)dt, ndim, shape)
                 : regc_graph_add_tensor(g, name, (regc_dtype)dt, (regc_role)r, ndim, shape);
    if (id < 0)
        regc_error_prefix("%s: %s", c->source, c->where);
    if (id >= 0 && regc_frozen_from_role(role))
        regc_graph_set_frozen(g, id, regc_frozen_from_role(role));
    return id < 0 ? id : REGC_OK;
}

static int read_node(json_ctx *c, regc_graph *g, const cJSON *o, int op, int next_id)
{
    int64_t in64[REGC_MAX_IO], out64[REGC_MAX_IO], shape[REGC_MAX_DIMS] = {0}, v = 0;
    int n_in, n_out, ndim = 0;
    if (get_ints(c, o, "in", REGC_MAX_IO, 0, INT32_MAX, in64, &n_in) ||
        get_ints(c, o, "out", REGC_MAX_IO, 0, INT32_MAX, out64, &n_out))
        return REGC_ERR_FORMAT;
    int in[REGC_MAX_IO];
    for (int i = 0; i < n_in; i++) {
        if (in64[i] >= next_id) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "input %d reads tensor %lld, which is not defined before this node "
                     "(a cycle, or a dangling id)",
                     i, (long long)in64[i]);
            return fail(c, REGC_ERR_FORMAT, msg);
        }
        in[i] = (int)in64[i];
    }
    regc_attrs a;
    memset(&a, 0, sizeof a);
    int set = op_attr_set((regc_op)op);
    if (set & A_TRANS) {
        if (get_int(c, o, "trans_a", 0, 1, &v))
            return REGC_ERR_FORMAT;
        a.trans_a = (int)v;
        if (get_int(c, o, "trans_b", 0, 1, &v))
            return REGC_ERR_FORMAT;
        a.trans_b = (int)v;
    }
    if ((set & A_EPS) && get_float(c, o, "eps", &a.eps))
        return REGC_ERR_FORMAT;
    if (set & A_HEADS) {
        if (get_int(c, o, "n_head", 1, 1 << 20, &v))
            return REGC_ERR_FORMAT;
        a.n_head = (int)v;
        if (get_int(c, o, "n_kv_head", 1, 1 << 20, &v))
            return REGC_ERR_FORMAT;
        a.n_kv_head = (int)v;
        if (get_int(c, o, "causal", 0, 1, &v))
            return REGC_ERR_FORMAT;
        a.causal = (int)v;
        if (get_float(c, o, "scale", &a.scale))
            return REGC_ERR_FORMAT;
        if (cJSON_GetObjectItemCaseSensitive(o, "softcap") &&
            get_float(c, o, "softcap", &a.softcap))
            return REGC_ERR_FORMAT;
        if (cJSON_GetObjectItemCaseSensitive(o, "window")) {
            if (get_int(c, o, "window", 0, INT64_C(1) << 40, &v))
                return REGC_ERR_FORMAT;
            a.window = v;
        }
        if (cJSON_GetObjectItemCaseSensitive(o, "documents")) {
            if (get_int(c, o, "documents", 0, 1, &v))
                return REGC_ERR_FORMAT;
            a.documents = (int)v;
        }
        if (cJSON_GetObjectItemCaseSensitive(o, "dropout") && get_float(c, o, "dropout", &a.value))
            return REGC_ERR_FORMAT;
    }
    if (set & A_ROPE) {
        if (get_int(c, o, "n_head", 1, 1 << 20, &v))
            return REGC_ERR_FORMAT;
        a.n_head = (int)v;
        if (get_int(c, o, "inverse", 0, 1, &v))
            return REGC_ERR_FORMAT;
        a.inverse = (int)v;
    }
    if (set & A_PERM) {
        int64_t perm[REGC_MAX_DIMS];
        int np;
        if (get_ints(c, o, "perm", REGC_MAX_DIMS, 0, REGC_MAX_DIMS - 1, perm, &np))
            return REGC_ERR_FORMAT;
        if (n_in > 0 && np != regc_graph_tensor(g, in[0])->ndim)
            return fail(c, REGC_ERR_FORMAT, "\"perm\" must list every axis of the input");
        for (int i = 0; i < np; i++)
            a.perm[i] = (int)perm[i];
    }
    if ((set & A_VALUE) && get_float(c, o, "value", &a.value))
        return REGC_ERR_FORMAT;
    if (set & A_VOCAB) {
        if (get_int(c, o, "vocab", 1, INT64_C(1) << 40, &v))
            return REGC_ERR_FORMAT;
        a.vocab = v;
    }
    if ((set & A_PAD) && cJSON_GetObjectItemCaseSensitive(o, "padding_idx")) {
        if (get_int(c, o, "padding_idx", 0, INT64_C(1) << 40, &v))
            return REGC_ERR_FORMAT;
        a.padded = 1, a.padding_idx = v;
    }
    if (set & A_SLICE) {
        if (get_int(c, o, "axis", 0, REGC_MAX_DIMS - 1, &v))
            return REGC_ERR_FORMAT;
        a.axis = (int)v;
        if (get_int(c, o, "start", 0, INT64_C(1) << 40, &v))
            return REGC_ERR_FORMAT;
        a.start = v;
    }
    if ((set & A_SHAPE) &&
        get_ints(c, o, "shape", REGC_MAX_DIMS, 1, INT64_C(1) << 40, shape, &ndim))
        return REGC_ERR_FORMAT;
    int out[REGC_MAX_IO];
    int rc = regc_graph_add_node(g, (regc_op)op, &a, n_in, in, n_out, out, ndim, shape);
    if (rc < 0) {
        regc_error_prefix("%s: %s", c->source, c->where);
        return rc;
    }
    for (int i = 0; i < n_out; i++)
        if (out[i] != out64[i])
            return fail(c, REGC_ERR_FORMAT, "\"out\" ids must be the next unused ids, in order");
    return REGC_OK;
}

static int read_graph(json_ctx *c, const cJSON *root, regc_graph *g)
{
    c->where = "top level";
    if (!cJSON_IsObject(root))
        return fail(c, REGC_ERR_FORMAT, "expected a JSON object");
    const char *format = get_string(root, "format");
    if (!format || strcmp(format, GRAPH_FORMAT) != 0)
        return fail(c, REGC_ERR_FORMAT, "\"format\" must be \"" GRAPH_FORMAT "\"");
    int64_t version = 0;
    if (get_int(c, root, "version", 1, 1000000, &version))
        return REGC_ERR_FORMAT;
    if (version != GRAPH_VERSION)
        return fail(c, REGC_ERR_UNSUPPORTED, "unsupported \"version\" (this regc reads version 1)");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(root, "nodes");
    const cJSON *outputs = cJSON_GetObjectItemCaseSensitive(root, "outputs");
    if (!cJSON_IsArray(tensors) || !cJSON_IsArray(nodes) || !cJSON_IsArray(outputs))
        return fail(c, REGC_ERR_FORMAT, "\"tensors\", \"nodes\" and \"outputs\" must be arrays");

    /* Replay definitions in id order: the next id is either the next leaf
     * tensor (whose "id" says so) or the first output of the next node. */
    const cJSON *leaf = tensors->child, *node = nodes->child;
    char where[96];
    int leaf_index = 0, node_index = 0;
    c->where = where;
    while (leaf || node) {
        int next_id = regc_graph_n_tensors(g);
        int64_t leaf_id = -1;
        if (leaf) {
            snprintf(where, sizeof where, "tensors[%d]", leaf_index);
            if (!cJSON_IsObject(leaf) || get_int(c, leaf, "id", 0, INT32_MAX, &leaf_id))
                return cJSON_IsObject(leaf) ? REGC_ERR_FORMAT
                                            : fail(c, REGC_ERR_FORMAT, "expected an object");
            if (leaf_id < next_id)
                return fail(c, REGC_ERR_FORMAT,
                            "\"id\" is already defined (ids must be unique and increasing)");
        }
        if (leaf_id == next_id) {
            if (read_leaf(c, g, leaf))
                return REGC_ERR_FORMAT;
            leaf = leaf->next;
            leaf_index++;
            continue;
        }
        if (!node) {
            snprintf(where, sizeof where, "tensors[%d]", leaf_index);
            return fail(c, REGC_ERR_FORMAT, "\"id\" skips ids that no node defines");
        }
        const char *op_name = cJSON_IsObject(node) ? get_string(node, "op") : NULL;
        int op = op_name ? regc_op_from_name(op_name) : -1;
        snprintf(where, sizeof where, "nodes[%d] (%s)", node_index, op_name ? op_name : "?");
        if (op < 0)
            return fail(c, REGC_ERR_FORMAT, op_name ? "unknown op" : "\"op\" must be a string");
        if (read_node(c, g, node, op, next_id))
            return REGC_ERR_FORMAT;
        node = node->next;
        node_index++;
    }
    c->where = "outputs";
    const cJSON *v;
    cJSON_ArrayForEach (v, outputs) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= regc_graph_n_tensors(g) ||
            v->valuedouble != floor(v->valuedouble))
            return fail(c, REGC_ERR_FORMAT, "an output id refers to no tensor");
        regc_graph_mark_output(g, (int)v->valuedouble);
    }
    return REGC_OK;
}

int regc_graph_from_json(const char *text, const char *source, regc_graph **out)
{
    *out = NULL;
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        for (const char *p = text; at && p < at; p++)
            line += *p == '\n';
        return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON near line %d", source, line);
    }
    regc_graph *g = regc_graph_new();
    if (!g) {
        cJSON_Delete(root);
        return REGC_ERR_MEMORY;
    }
    json_ctx c = {.source = source, .where = ""};
    int rc = read_graph(&c, root, g);
    cJSON_Delete(root);
    if (rc) {
        regc_graph_free(g);
        return rc;
    }
    *out = g;
    return REGC_OK;
}
