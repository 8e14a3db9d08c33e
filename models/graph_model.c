/* graph_model.c — the "graph" architecture: a model given as a regc graph
 * JSON file (the flat forward graph `regc dump-graph` writes, or one
 * exported from elsewhere) rather than as a config.json.
 *
 * The graph fixes everything: the parameters are its PARAM tensors in graph
 * order, named as in the graph (a --weights safetensors file is matched by
 * those names), and its shapes are fixed, so it trains only at the batch and
 * sequence its "input_ids" input [B, T] was built for. The loss is output 0,
 * which must come from a cross_entropy node; the vocabulary is the last
 * dimension of that node's logits. Every table the inputs index (an
 * embedding's rows, the logits a loss reads at the targets) must have a row
 * for each id the input can hold, or the kernels would read past it.
 *
 * Random init (no --weights): parameters of two or more dimensions are
 * uniform with std 0.02; parameters of fewer dimensions start at 1.0 when
 * their name ends in "weight" (norm gains) and at 0.0 otherwise (biases).
 *
 * Inputs marked constant (rotary tables, positions, buckets) are read from
 * the weights file by name, never trained, and saved beside the
 * parameters; the data inputs are filled as a causal language model's
 * (input_ids, targets the next tokens) and, for an encoder-decoder,
 * decoder_input_ids as T5's: the targets shifted right behind id 0.
 *
 * A graph tools/export_torch.py wrote names its constants' own file
 * (top-level "constants", beside graph.json): its parameters are then read
 * from --weights alone (a Hugging Face directory's: the user's checkpoint
 * as it is, sharded or not), and the constants from that file.
 *
 * Saving writes model.safetensors (graph names, the constants beside the
 * parameters) and graph.json into the directory; `--model DIR/graph.json
 * --weights DIR/model.safetensors` loads it back. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

typedef struct {
    regc_graph *graph; /* as read; build_graph hands out copies */
    int64_t batch, seq;
} graph_config;

static void graph_free_config(void *cfg)
{
    graph_config *c = cfg;
    if (!c)
        return;
    regc_graph_free(c->graph);
    free(c);
}

/* A graph read back from its own JSON is the same graph (graph_json.c's
 * round-trip guarantee), which makes the text a deep copy that the trainer
 * may extend with backward nodes. */
static int graph_copy(const regc_graph *g, const char *source, regc_graph **out)
{
    char *text = regc_graph_to_json(g);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory copying the graph", source);
    int rc = regc_graph_from_json(text, source, out);
    free(text);
    return rc;
}

/* Checks what the trainer relies on and fills batch, seq and vocab. */
static int graph_read_shapes(regc_model *m, graph_config *c)
{
    const regc_graph *g = c->graph;
    const char *src = m->source;
    int ids = regc_graph_find_tensor(g, "input_ids");
    const regc_tensor *t = ids >= 0 ? regc_graph_tensor(g, ids) : NULL;
    if (!t || t->role != REGC_ROLE_INPUT || t->dtype != REGC_I32 || t->ndim != 2)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: the graph needs an i32 input \"input_ids\" of shape [batch, seq]",
                          src);
    c->batch = t->shape[0];
    c->seq = t->shape[1];
    int tg = regc_graph_find_tensor(g, "targets");
    t = tg >= 0 ? regc_graph_tensor(g, tg) : NULL;
    if (!t || t->role != REGC_ROLE_INPUT || t->dtype != REGC_I32 || t->ndim != 2 ||
        t->shape[0] != c->batch || t->shape[1] != c->seq)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: the graph needs an i32 input \"targets\" of shape [%" PRId64
                          ", %" PRId64 "] like input_ids",
                          src, c->batch, c->seq);
    int dec = regc_graph_find_tensor(g, "decoder_input_ids");
    t = dec >= 0 ? regc_graph_tensor(g, dec) : NULL;
    if (t && (t->role != REGC_ROLE_INPUT || t->constant || t->dtype != REGC_I32 || t->ndim != 2 ||
              t->shape[0] != c->batch || t->shape[1] != c->seq))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: decoder_input_ids must be an i32 data input of shape [%" PRId64
                          ", %" PRId64 "] like input_ids",
                          src, c->batch, c->seq);
    if (regc_graph_n_outputs(g) < 1)
        return regc_error(REGC_ERR_FORMAT, "%s: the graph has no outputs (output 0 is the loss)",
                          src);
    const regc_tensor *loss = regc_graph_tensor(g, regc_graph_output(g, 0));
    const regc_node *n = loss->producer >= 0 ? regc_graph_node(g, loss->producer) : NULL;
    if (!n || n->op != REGC_OP_CROSS_ENTROPY || n->out[0] != regc_graph_output(g, 0))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: output 0 (%s) is not the loss of a cross_entropy node", src,
                          loss->name);
    const regc_tensor *logits = regc_graph_tensor(g, n->in[0]);
    m->vocab = logits->shape[logits->ndim - 1];
    m->max_seq = c->seq;
    return REGC_OK;
}

/* The graph input tensor id views (reshape, transpose) of tensor id show,
 * or -1 when it is computed. */
static int graph_viewed_input(const regc_graph *g, int id)
{
    for (;;) {
        const regc_tensor *t = regc_graph_tensor(g, id);
        if (t->role == REGC_ROLE_INPUT)
            return id;
        const regc_node *n = t->producer >= 0 ? regc_graph_node(g, t->producer) : NULL;
        if (!n || (n->op != REGC_OP_RESHAPE && n->op != REGC_OP_TRANSPOSE))
            return -1;
        id = n->in[0];
    }
}

/* The bound on the values an i32 tensor holds when the trainer fills the
 * graph's data inputs: token ids (input_ids, targets) are below the
 * vocabulary, positions below the sequence; views keep the bound of what
 * they view. 0 when the tensor is none of these: filling refuses any other
 * data input, and a constant's values are checked when they are read
 * (graph_check_constant). */
static int64_t graph_index_bound(const regc_model *m, const graph_config *c, int id)
{
    id = graph_viewed_input(c->graph, id);
    const regc_tensor *t = id >= 0 ? regc_graph_tensor(c->graph, id) : NULL;
    if (!t || t->constant)
        return 0;
    return !strcmp(t->name, "input_ids") || !strcmp(t->name, "targets") ||
                   !strcmp(t->name, "decoder_input_ids")
               ? m->vocab
           : !strcmp(t->name, "position_ids") ? c->seq
                                              : 0;
}

/* The rows an op indexes by its ids operand, and that operand: an
 * embedding's table, the logits a loss reads at its targets. 0 when the
 * op indexes nothing. */
static int graph_indexed_rows(const regc_graph *g, const regc_node *n, int *ids, int *table,
                              int64_t *rows)
{
    const regc_tensor *t;
    switch (n->op) {
    case REGC_OP_EMBEDDING: /* ids, table [rows, C] */
        *ids = n->in[0], *table = n->in[1];
        *rows = regc_graph_tensor(g, *table)->shape[0];
        return 1;
    case REGC_OP_EMBEDDING_BWD: /* dout, ids -> [vocab, C] */
        *ids = n->in[1], *table = n->out[0];
        *rows = n->attrs.vocab;
        return 1;
    case REGC_OP_CROSS_ENTROPY: /* logits [..., V], targets */
        *ids = n->in[1], *table = n->in[0];
        t = regc_graph_tensor(g, *table);
        *rows = t->shape[t->ndim - 1];
        return 1;
    case REGC_OP_CROSS_ENTROPY_BWD: /* dloss, logits [..., V], targets, lse */
        *ids = n->in[2], *table = n->in[1];
        t = regc_graph_tensor(g, *table);
        *rows = t->shape[t->ndim - 1];
        return 1;
    default: return 0;
    }
}

/* Every op that indexes rows by a filled input must have a row for every
 * value the input can hold: an embedding table with fewer rows than the
 * vocabulary would be read past its end by the kernel, which trusts the
 * graph. The shape rules cannot see this; only the inputs' meaning says it. */
static int graph_check_indices(const regc_model *m, const graph_config *c)
{
    const regc_graph *g = c->graph;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        int ids, table;
        int64_t rows;
        if (!graph_indexed_rows(g, n, &ids, &table, &rows))
            continue;
        int64_t bound = graph_index_bound(m, c, ids);
        if (bound > rows)
            return regc_error(REGC_ERR_SHAPE,
                              "%s: %s: tensor %s has %" PRId64 " rows, fewer than the %s (%" PRId64
                              ") whose ids %s holds",
                              m->source, regc_op_name(n->op), regc_graph_tensor(g, table)->name,
                              rows, bound == m->vocab ? "vocabulary" : "sequence", bound,
                              regc_graph_tensor(g, ids)->name);
    }
    return REGC_OK;
}

/* An i32 constant's values, read from a file, index only rows that exist:
 * an embedding's ids in [0, rows), a loss's targets below rows (a negative
 * one is ignored). */
static int graph_check_constant(const regc_model *m, const regc_model_const *k)
{
    if (!k->data)
        return REGC_OK;
    const graph_config *c = m->cfg;
    const regc_graph *g = c->graph;
    if (k->dtype != REGC_I32)
        return REGC_OK;
    const int32_t *v = k->data;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        int ids, table;
        int64_t rows;
        if (!graph_indexed_rows(g, n, &ids, &table, &rows))
            continue;
        int root = graph_viewed_input(g, ids);
        if (root < 0 || strcmp(regc_graph_tensor(g, root)->name, k->name) != 0)
            continue;
        const int64_t lo = n->op == REGC_OP_EMBEDDING || n->op == REGC_OP_EMBEDDING_BWD
                               ? 0
                               : INT32_MIN; /* a loss ignores any negative target */
        for (int64_t e = 0; e < k->numel; e++)
            if (v[e] < lo || v[e] >= rows)
                return regc_error(REGC_ERR_FORMAT,
                                  "%s: constant %s holds %d at element %" PRId64
                                  ", outside the %" PRId64 " rows of %s that %s indexes",
                                  m->source, k->name, (int)v[e], e, rows,
                                  regc_graph_tensor(g, table)->name, regc_op_name(n->op));
    }
    return REGC_OK;
}

static int graph_check_constants(const regc_model *m)
{
    int rc = REGC_OK;
    for (int k = 0; k < m->n_consts && rc == REGC_OK; k++)
        rc = graph_check_constant(m, &m->consts[k]);
    return rc;
}

/* Every constant input, as a constant of the model (values from the
 * weights file). */
static int graph_list_constants(regc_model *m)
{
    const graph_config *c = m->cfg;
    for (int i = 0; i < regc_graph_n_tensors(c->graph); i++) {
        const regc_tensor *t = regc_graph_tensor(c->graph, i);
        int rc =
            t->constant ? regc_model_add_const(m, t->name, t->dtype, t->ndim, t->shape) : REGC_OK;
        if (rc < 0)
            return rc;
    }
    return REGC_OK;
}

static int graph_list_params(regc_model *m)
{
    const graph_config *c = m->cfg;
    const float std02 = (float)(0.02 * sqrt(3.0)); /* halfwidth of a uniform of std 0.02 */
    for (int i = 0; i < regc_graph_n_tensors(c->graph); i++) {
        const regc_tensor *t = regc_graph_tensor(c->graph, i);
        if (t->role != REGC_ROLE_PARAM)
            continue;
        if (t->dtype != REGC_F32)
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: parameter %s is %s; graph models take f32 parameters", m->source,
                              t->name, regc_dtype_name(t->dtype));
        size_t len = strlen(t->name);
        int is_gain = len >= 6 && strcmp(t->name + len - 6, "weight") == 0;
        float center = t->ndim >= 2 ? 0.0f : (is_gain ? 1.0f : 0.0f);
        float hw = t->ndim >= 2 ? std02 : 0.0f;
        int rc = regc_model_add_param(m, t->name, t->ndim, t->shape, center, hw);
        if (rc < 0)
            return rc;
    }
    return REGC_OK;
}

/* The directory part of path ("." when it has none). */
static void graph_dirname(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

/* The top-level "constants" of an exported graph: the safetensors file,
 * beside the graph's file at path, its constants are read from, so that its
 * parameters come from the user's own checkpoint unchanged. */
static int graph_read_constants_file(regc_model *m, const char *text, const char *path)
{
    cJSON *root = cJSON_Parse(text);
    if (!root) /* the graph itself parsed: only memory can fail here */
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "constants");
    int rc = REGC_OK;
    char dir[4096], file[4096];
    if (name && !cJSON_IsString(name))
        rc = regc_error(REGC_ERR_FORMAT, "%s: \"constants\" must be a file name (a string)", path);
    else if (name && !regc_model_inside_name(name->valuestring))
        rc = regc_error(REGC_ERR_FORMAT,
                        "%s: \"constants\" must name a file beside the graph (no absolute path, "
                        "no \"..\")",
                        path);
    else if (name) {
        graph_dirname(path, dir, sizeof dir);
        if ((rc = regc_path_join(file, sizeof file, dir, name->valuestring)) == REGC_OK &&
            !(m->consts_file = strdup(file)))
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    }
    cJSON_Delete(root);
    return rc;
}

int regc_graph_model_parse(regc_model *m, const char *text, const char *path)
{
    graph_config *c = calloc(1, sizeof *c);
    if (!c)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    m->cfg = c;
    regc_graph *read = NULL;
    int rc = regc_graph_from_json(text, path, &read);
    if (rc < 0)
        return rc;
    /* a decomposed RMSNorm or GELU runs as regc's own kernel */
    rc = regc_graph_fuse_patterns(read, &c->graph);
    regc_graph_free(read);
    if (rc < 0)
        return rc;
    if ((rc = graph_read_shapes(m, c)) < 0 || (rc = graph_check_indices(m, c)) < 0 ||
        (rc = graph_list_constants(m)) < 0 || (rc = graph_read_constants_file(m, text, path)) < 0)
        return rc;
    return graph_list_params(m);
}

int regc_graph_model_read(regc_model *m, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    int rc = regc_file_read_all(path, &text, &len);
    if (rc < 0)
        return rc;
    rc = regc_graph_model_parse(m, text, path);
    free(text);
    return rc;
}

void regc_graph_model_shape(const regc_model *m, int64_t *batch, int64_t *seq)
{
    const graph_config *c = m->cfg;
    *batch = c->batch, *seq = c->seq;
}

int regc_graph_model_check_documents(const regc_model *m, int on)
{
    const regc_graph *g = ((const graph_config *)m->cfg)->graph;
    int causal = 0, reading = -1; /* a causal attention; a node reading doc_start */
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *a = regc_graph_node(g, i);
        causal |= a->op == REGC_OP_ATTENTION && a->attrs.causal;
        if (a->op == REGC_OP_ATTENTION && a->attrs.documents && reading < 0)
            reading = i;
    }
    if (!on && reading >= 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: node %d attends over documents: train.eod_token_id says where "
                          "they end",
                          m->source, reading);
    if (on && regc_graph_find_tensor(g, "decoder_input_ids") >= 0)
        return regc_error(REGC_ERR_ARG,
                          "train.eod_token_id: %s is an encoder-decoder graph; documents apply "
                          "to causal language models",
                          m->source);
    if (on && !causal)
        return regc_error(REGC_ERR_ARG,
                          "train.eod_token_id: %s has no causal attention to keep within "
                          "documents",
                          m->source);
    /* the graph's own doc_start must be what regc_model_fill_inputs fills */
    const int docs = regc_graph_find_tensor(g, "doc_start");
    const regc_tensor *d = on && docs >= 0 ? regc_graph_tensor(g, docs) : NULL;
    const graph_config *c = m->cfg;
    if (d && (d->role != REGC_ROLE_INPUT || d->constant || d->dtype != REGC_I32 || d->ndim != 2 ||
              d->shape[0] != c->batch || d->shape[1] != c->seq))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: doc_start must be an i32 data input of shape [%" PRId64 ", %" PRId64
                          "] like input_ids",
                          m->source, c->batch, c->seq);
    return REGC_OK;
}

/* Packed documents (train.eod_token_id): every causal attention reads the
 * doc_start input [B, T] that regc_model_fill_inputs fills from the ids. */
static int graph_attend_documents(const regc_model *m, regc_graph *g)
{
    const graph_config *c = m->cfg;
    int rc = regc_graph_model_check_documents(m, m->documents);
    if (rc || !m->documents)
        return rc;
    const int64_t shape[2] = {c->batch, c->seq};
    int docs = regc_graph_find_tensor(g, "doc_start"), changed;
    if (docs < 0 &&
        (docs = regc_graph_add_tensor(g, "doc_start", REGC_I32, REGC_ROLE_INPUT, 2, shape)) < 0)
        return docs;
    rc = regc_graph_attend_documents(g, docs, &changed);
    return rc ? regc_error(rc, "%s: %s", m->source, regc_error_message()) : REGC_OK;
}

static int graph_build_graph(const regc_model *m, int64_t batch, int64_t seq, regc_graph **out)
{
    const graph_config *c = m->cfg;
    if (batch != c->batch || seq != c->seq)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: the graph is built for batch %" PRId64 " and sequence %" PRId64
                          "; got batch %" PRId64 ", sequence %" PRId64,
                          m->source, c->batch, c->seq, batch, seq);
    int rc = graph_copy(c->graph, m->source, out);
    return rc ? rc : graph_attend_documents(m, *out);
}

/* The data inputs as a causal language model's (input_ids, targets, and
 * position_ids when it is data), each constant from the values read with
 * the weights (checked when read: graph_check_constants). The
 * inputs are the compiled step's, whose tensors may come from the compile
 * cache: a constant is known by its name among the model's. */
static int graph_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                             int n, regc_input *in)
{
    for (int i = 0; i < n; i++) {
        const regc_tensor *t = in[i].tensor;
        if (in[i].filled) /* a constant stays filled from the first batch on */
            continue;
        const regc_model_const *k = NULL;
        for (int j = 0; j < m->n_consts && !k; j++)
            if (!strcmp(m->consts[j].name, t->name))
                k = &m->consts[j];
        if (!k)
            continue;
        if (!k->data) /* regc_model_read_constants gives them, checked */
            return regc_error(REGC_ERR_ARG,
                              "%s: constant %s has no values: a graph with constants trains "
                              "from --weights, a file that holds them (dump-graph --save "
                              "writes one)",
                              m->source, t->name);
        if (t->dtype != k->dtype || regc_tensor_numel(t) != k->numel)
            return regc_error(REGC_ERR_SHAPE,
                              "%s: graph input %s is %s with %" PRId64
                              " elements; the constant read for it is %s with %" PRId64,
                              m->source, t->name, regc_dtype_name(t->dtype), regc_tensor_numel(t),
                              regc_dtype_name(k->dtype), k->numel);
        memcpy(in[i].host, k->data, (size_t)regc_tensor_bytes(t));
        in[i].filled = in[i].constant = 1;
    }
    int rc = regc_model_fill_lm_inputs(m, data, b, n, in);
    regc_input *dec = regc_input_find(n, in, "decoder_input_ids");
    if (rc < 0 || !dec)
        return rc;
    /* an encoder-decoder's: the targets shifted right behind id 0, an
     * ignored (negative) target as 0 (T5's _shift_right: its start and pad
     * ids are 0) */
    const regc_input *tg = regc_input_find(n, in, "targets");
    const int64_t bt = b->batch * b->seq;
    if (!tg || dec->tensor->dtype != REGC_I32 || regc_tensor_numel(dec->tensor) != bt ||
        regc_tensor_numel(tg->tensor) != bt)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: graph input decoder_input_ids must be i32 [%" PRId64 ", %" PRId64
                          "] beside targets of that shape",
                          m->source, b->batch, b->seq);
    const int32_t *t = tg->host;
    int32_t *d = dec->host;
    for (int64_t r = 0; r < b->batch; r++)
        for (int64_t s = 0; s < b->seq; s++) {
            const int32_t prev = s ? t[r * b->seq + s - 1] : 0;
            d[r * b->seq + s] = prev > 0 ? prev : 0;
        }
    dec->filled = 1;
    return REGC_OK;
}

static int graph_preset_config(regc_model *m, const char *preset)
{
    (void)m;
    return regc_error(REGC_ERR_ARG, "%s: the graph architecture has no presets", preset);
}

static int graph_parse_config(regc_model *m, const cJSON *root, const char *path)
{
    (void)m;
    (void)root;
    return regc_error(REGC_ERR_UNSUPPORTED,
                      "%s: a graph model is a graph JSON file, not a config.json", path);
}

static cJSON *graph_write_config(const regc_model *m)
{
    (void)m;
    return NULL; /* save_files writes graph.json instead */
}

static int graph_save_files(const regc_model *m, const char *dir)
{
    const graph_config *c = m->cfg;
    char path[4096];
    int rc = regc_path_join(path, sizeof path, dir, "graph.json");
    if (rc < 0)
        return rc;
    char *text = regc_graph_to_json(c->graph);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory writing the graph", path);
    size_t len = strlen(text);
    int nl = len == 0 || text[len - 1] != '\n';
    char *full = nl ? realloc(text, len + 2) : text;
    if (!full) {
        free(text);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory writing the graph", path);
    }
    if (nl) {
        full[len++] = '\n';
        full[len] = '\0';
    }
    rc = regc_file_write_atomic(path, full, len);
    free(full);
    return rc;
}

static void graph_describe(const regc_model *m, char *buf, size_t cap)
{
    const graph_config *c = m->cfg;
    snprintf(buf, cap,
             "graph %s: %d nodes, %d parameter tensors, %" PRId64 " parameters%s; batch %" PRId64
             ", sequence %" PRId64 ", vocab %" PRId64,
             m->source, regc_graph_n_nodes(c->graph), m->n_params, m->total_numel,
             m->weights ? "" : " (shape only)", c->batch, c->seq, m->vocab);
}

/* The graph itself (its batch and sequence are in its shapes). */
static int graph_write_structure(const regc_model *m, regc_bytes *b)
{
    const graph_config *c = m->cfg;
    return regc_graph_canon(c->graph, b);
}

/* ---------------------------------------------------------- a model as a graph */

/* gm's constants (the constant inputs of m's graph) as m's architecture
 * fills them: its filler is asked for those inputs alone. */
static int graph_fill_constants_from(const regc_model *m, regc_model *gm, int64_t batch,
                                     int64_t seq)
{
    const graph_config *c = gm->cfg;
    const int n = gm->n_consts;
    regc_input *in = calloc((size_t)n + 1, sizeof *in);
    if (!in)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    int rc = REGC_OK;
    for (int k = 0; k < n && rc == REGC_OK; k++) {
        in[k].tensor =
            regc_graph_tensor(c->graph, regc_graph_find_tensor(c->graph, gm->consts[k].name));
        if (!(in[k].host = calloc((size_t)regc_tensor_bytes(in[k].tensor) + 1, 1)))
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    }
    const regc_batch_spec b = {.batch = batch, .seq = seq};
    if (rc == REGC_OK)
        rc = regc_model_fill_inputs(m, NULL, &b, n, in);
    for (int k = 0; k < n; k++) {
        if (rc == REGC_OK)
            gm->consts[k].data = in[k].host;
        else
            free(in[k].host);
    }
    free(in);
    return rc;
}

int regc_model_as_graph(const regc_model *m, int64_t batch, int64_t seq, regc_model **out)
{
    *out = NULL;
    if (m->arch == &regc_arch_graph)
        return regc_error(REGC_ERR_ARG,
                          "%s: a graph model already: it trains with --weights; dump-graph "
                          "--save writes the other architectures as graph models",
                          m->source);
    if (m->arch->own_data)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: a %s model fills its data inputs its own way; a graph model fills "
                          "input_ids and targets as a causal language model's, so it cannot "
                          "train as this model does",
                          m->source, m->arch->model_type);
    regc_graph *g = NULL;
    regc_model *gm = NULL;
    char *text = NULL;
    int rc = regc_model_build_graph(m, batch, seq, &g);
    if (rc == REGC_OK && !(text = regc_graph_to_json(g)))
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory writing the graph", m->source);
    regc_graph_free(g);
    if (rc == REGC_OK)
        rc = regc_model_new(&regc_arch_graph, m->source, &gm);
    if (rc == REGC_OK)
        rc = regc_graph_model_parse(gm, text, m->source);
    free(text);
    /* the graph's parameters are m's, by name and in m's order */
    for (int i = 0; rc == REGC_OK && i < gm->n_params; i++)
        if (i >= m->n_params || strcmp(gm->params[i].name, m->params[i].name) != 0)
            rc = regc_error(REGC_ERR_ARG, "%s: the graph's parameter %d is not the model's",
                            m->source, i);
    if (rc == REGC_OK && m->weights && (rc = regc_model_alloc_weights(gm)) == REGC_OK)
        memcpy(gm->weights, m->weights, (size_t)gm->total_numel * sizeof(float));
    if (rc == REGC_OK)
        rc = graph_fill_constants_from(m, gm, batch, seq);
    if (rc) {
        regc_model_free(gm);
        return rc;
    }
    *out = gm;
    return REGC_OK;
}

const regc_arch regc_arch_graph = {
    .model_type = "graph",
    .optional_prefix = NULL,
    .preset_config = graph_preset_config,
    .parse_config = graph_parse_config,
    .free_config = graph_free_config,
    .list_params = graph_list_params,
    .build_graph = graph_build_graph,
    .write_config = graph_write_config,
    .describe = graph_describe,
    .write_structure = graph_write_structure,
    .save_files = graph_save_files,
    .fill_inputs = graph_fill_inputs,
    .check_constants = graph_check_constants,
};
