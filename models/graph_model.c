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
 * Saving writes model.safetensors (graph names) and graph.json into the
 * directory; `--model DIR/graph.json --weights DIR/model.safetensors` loads
 * it back. */
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

/* The bound on the values an i32 tensor holds when the trainer fills the
 * graph's inputs: token ids (input_ids, targets) are below the vocabulary,
 * positions below the sequence; views (reshape, transpose) keep the bound
 * of what they view. 0 when the tensor is none of these (filling refuses
 * any other input, so nothing can be said or needs to be). */
static int64_t graph_index_bound(const regc_model *m, const graph_config *c, int id)
{
    const regc_graph *g = c->graph;
    for (;;) {
        const regc_tensor *t = regc_graph_tensor(g, id);
        if (t->role == REGC_ROLE_INPUT)
            return !strcmp(t->name, "input_ids") || !strcmp(t->name, "targets") ? m->vocab
                   : !strcmp(t->name, "position_ids")                           ? c->seq
                                                                                : 0;
        const regc_node *n = t->producer >= 0 ? regc_graph_node(g, t->producer) : NULL;
        if (!n || (n->op != REGC_OP_RESHAPE && n->op != REGC_OP_TRANSPOSE))
            return 0;
        id = n->in[0];
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
        switch (n->op) {
        case REGC_OP_EMBEDDING: /* ids, table [rows, C] */
            ids = n->in[0], table = n->in[1];
            rows = regc_graph_tensor(g, table)->shape[0];
            break;
        case REGC_OP_EMBEDDING_BWD: /* dout, ids -> [vocab, C] */
            ids = n->in[1], table = n->out[0];
            rows = n->attrs.vocab;
            break;
        case REGC_OP_CROSS_ENTROPY: /* logits [..., V], targets */
            ids = n->in[1], table = n->in[0];
            rows = regc_graph_tensor(g, table)->shape[regc_graph_tensor(g, table)->ndim - 1];
            break;
        case REGC_OP_CROSS_ENTROPY_BWD: /* dloss, logits [..., V], targets, lse */
            ids = n->in[2], table = n->in[1];
            rows = regc_graph_tensor(g, table)->shape[regc_graph_tensor(g, table)->ndim - 1];
            break;
        default: continue;
        }
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

int regc_graph_model_parse(regc_model *m, const char *text, const char *path)
{
    graph_config *c = calloc(1, sizeof *c);
    if (!c)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    m->cfg = c;
    int rc = regc_graph_from_json(text, path, &c->graph);
    if (rc < 0)
        return rc;
    if ((rc = graph_read_shapes(m, c)) < 0 || (rc = graph_check_indices(m, c)) < 0)
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

static int graph_build_graph(const regc_model *m, int64_t batch, int64_t seq, regc_graph **out)
{
    const graph_config *c = m->cfg;
    if (batch != c->batch || seq != c->seq)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: the graph is built for batch %" PRId64 " and sequence %" PRId64
                          "; got batch %" PRId64 ", sequence %" PRId64,
                          m->source, c->batch, c->seq, batch, seq);
    return graph_copy(c->graph, m->source, out);
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
};
