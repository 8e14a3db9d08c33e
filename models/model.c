/* model.c — the architecture-independent half of a model: the parameter
 * list, one contiguous fp32 weights block, random init, the graph and its
 * inputs, saving, and the same model at another depth. Loading is
 * model_load.c; architecture specifics come through regc_arch
 * (model_internal.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "decoder.h"
#include "model_internal.h"

/* -------------------------------------------------------- construction */

int regc_model_new(const regc_arch *arch, const char *source, regc_model **out)
{
    regc_model *m = calloc(1, sizeof *m);
    if (!m || !(m->source = strdup(source))) {
        free(m);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", source);
    }
    m->arch = arch;
    *out = m;
    return REGC_OK;
}

void regc_model_free(regc_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++)
        free(m->params[i].name);
    free(m->params);
    for (int i = 0; i < m->n_consts; i++)
        free(m->consts[i].name), free(m->consts[i].data);
    free(m->consts);
    free(m->consts_file);
    regc_lora_free(m->lora);
    if (m->cfg && m->arch && m->arch->free_config)
        m->arch->free_config(m->cfg);
    else
        free(m->cfg);
    cJSON_Delete(m->inert_keys);
    free(m->weights);
    free(m->source);
    free(m);
}

int regc_model_add_2d(regc_model *m, const char *name, int ndim, int64_t d0, int64_t d1,
                      float init_center, float init_halfwidth)
{
    const int64_t shape[2] = {d0, d1};
    return regc_model_add_param(m, name, ndim, shape, init_center, init_halfwidth);
}

int regc_model_add_param(regc_model *m, const char *name, int ndim, const int64_t *shape,
                         float init_center, float init_halfwidth)
{
    if (ndim < 0 || ndim > REGC_MAX_DIMS)
        return regc_error(REGC_ERR_ARG, "%s: parameter %s has %d dimensions", m->source, name,
                          ndim);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || numel > INT64_MAX / shape[d])
            return regc_error(REGC_ERR_ARG, "%s: parameter %s has an invalid or too large shape",
                              m->source, name);
        numel *= shape[d];
    }
    if (m->total_numel > INT64_MAX - numel)
        return regc_error(REGC_ERR_ARG, "%s: too many parameters", m->source);
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? m->cap_params * 2 : 64;
        regc_model_param *grown = realloc(m->params, (size_t)cap * sizeof *grown);
        if (!grown)
            return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
        m->params = grown;
        m->cap_params = cap;
    }
    regc_model_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    if (!(p->name = strdup(name)))
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    p->ndim = ndim;
    memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
    p->numel = numel;
    p->offset = m->total_numel;
    p->init_center = init_center;
    p->init_halfwidth = init_halfwidth;
    m->total_numel += numel;
    m->n_params++;
    return REGC_OK;
}

int regc_model_add_const(regc_model *m, const char *name, regc_dtype dtype, int ndim,
                         const int64_t *shape)
{
    if (dtype != REGC_F32 && dtype != REGC_I32)
        return regc_error(REGC_ERR_UNSUPPORTED, "%s: constant %s is %s; constants are f32 or i32",
                          m->source, name, regc_dtype_name(dtype));
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= shape[d]; /* a graph's tensors have checked shapes */
    regc_model_const *grown = realloc(m->consts, (size_t)(m->n_consts + 1) * sizeof *grown);
    if (!grown)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    m->consts = grown;
    regc_model_const *k = &m->consts[m->n_consts];
    memset(k, 0, sizeof *k);
    if (!(k->name = strdup(name)))
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    k->dtype = dtype;
    k->ndim = ndim;
    memcpy(k->shape, shape, (size_t)ndim * sizeof *shape);
    k->numel = numel;
    m->n_consts++;
    return REGC_OK;
}

int regc_model_alloc_weights(regc_model *m)
{
    if (m->weights)
        return REGC_OK;
    if ((uint64_t)m->total_numel > SIZE_MAX / sizeof(float))
        return regc_error(REGC_ERR_MEMORY, "%s: %" PRId64 " parameters do not fit in memory",
                          m->source, m->total_numel);
    int64_t host = regc_host_memory_bytes();
    if (host > 0 && (double)m->total_numel * 4.0 > (double)host)
        return regc_error(REGC_ERR_MEMORY,
                          "%s: %" PRId64 " parameters take %.1f GiB of fp32, more than this "
                          "host's %.1f GiB of memory",
                          m->source, m->total_numel,
                          (double)m->total_numel * 4.0 / (1024.0 * 1024.0 * 1024.0),
                          (double)host / (1024.0 * 1024.0 * 1024.0));
    m->weights = calloc((size_t)m->total_numel + 1, sizeof(float));
    if (!m->weights)
        return regc_error(
            REGC_ERR_MEMORY, "%s: out of memory for %" PRId64 " parameters (%.1f GiB of fp32)",
            m->source, m->total_numel, (double)m->total_numel * 4.0 / (1024.0 * 1024.0 * 1024.0));
    return REGC_OK;
}

/* ----------------------------------------------------------- accessors */

const char *regc_model_arch(const regc_model *m) { return m->arch->model_type; }
int regc_model_chooses_targets(const regc_model *m) { return m->arch->own_data; }
const char *regc_model_source(const regc_model *m) { return m->source; }
int64_t regc_model_vocab(const regc_model *m) { return m->vocab; }
int64_t regc_model_max_seq(const regc_model *m) { return m->max_seq; }
int regc_model_has_weights(const regc_model *m) { return m->weights != NULL; }
int regc_model_n_params(const regc_model *m) { return m->n_params; }
int64_t regc_model_total_numel(const regc_model *m) { return m->total_numel; }
int regc_model_n_constants(const regc_model *m) { return m->n_consts; }
float *regc_model_weights(regc_model *m) { return m->weights; }

static int write_structure(const regc_model *m, regc_bytes *b);

int regc_model_write_structure(const regc_model *m, regc_bytes *b)
{
    regc_bytes_put_i64(b, m->dropout);
    if (m->documents) /* absent without: the structures of runs before it */
        regc_bytes_put_str(b, "documents"), regc_bytes_put_i64(b, m->eod);
    if (m->reset_positions) /* its graph reads positions per row */
        regc_bytes_put_str(b, "reset_position_ids");
    int rc = write_structure(m, b);
    return rc || !m->lora ? rc : regc_lora_write_structure(m, b);
}

static int write_structure(const regc_model *m, regc_bytes *b)
{
    regc_bytes_put_str(b, m->arch->model_type);
    if (m->arch->write_structure)
        return m->arch->write_structure(m, b);
    /* config.json round-trips the model (save, reload): it holds every
     * field build_graph reads */
    cJSON *cfg = m->arch->write_config(m);
    char *text = cfg ? cJSON_PrintUnformatted(cfg) : NULL;
    cJSON_Delete(cfg);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    regc_bytes_put_str(b, text);
    cJSON_free(text);
    return b->failed ? regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source) : REGC_OK;
}

void regc_model_describe(const regc_model *m, char *buf, size_t cap)
{
    if (cap)
        m->arch->describe(m, buf, cap);
}

int64_t regc_model_compute_rope(const regc_model *m, int64_t seq, float *inv_freq, int64_t n,
                                float *scaling)
{
    if (!m->arch->compute_rope)
        return regc_error(REGC_ERR_ARG, "%s: a %s model has no rotary embedding", m->source,
                          m->arch->model_type);
    const int64_t want = m->arch->compute_rope(m, 0, NULL, 0, NULL);
    if (!inv_freq)
        return want;
    if (n != want)
        return regc_error(REGC_ERR_ARG, "%s: the rotary embedding has %lld frequencies, not %lld",
                          m->source, (long long)want, (long long)n);
    float dummy;
    return m->arch->compute_rope(m, seq, inv_freq, n, scaling ? scaling : &dummy);
}

void regc_model_group_digits(char *buf, size_t cap, int64_t v)
{
    char raw[32];
    int n = snprintf(raw, sizeof raw, "%" PRId64, v), j = 0;
    if (cap == 0)
        return;
    for (int i = 0; i < n && (size_t)j + 2 < cap; i++) {
        if (i > 0 && raw[i - 1] != '-' && (n - i) % 3 == 0)
            buf[j++] = ',';
        buf[j++] = raw[i];
    }
    buf[j] = '\0';
}

const char *regc_model_param_name(const regc_model *m, int i)
{
    return (i >= 0 && i < m->n_params) ? m->params[i].name : NULL;
}

int regc_model_param_shape(const regc_model *m, int i, int64_t *shape)
{
    if (i < 0 || i >= m->n_params)
        return regc_error(REGC_ERR_ARG, "%s: no parameter %d", m->source, i);
    memcpy(shape, m->params[i].shape, (size_t)m->params[i].ndim * sizeof *shape);
    return m->params[i].ndim;
}

int64_t regc_model_param_numel(const regc_model *m, int i)
{
    return (i >= 0 && i < m->n_params) ? m->params[i].numel : -1;
}

int64_t regc_model_param_offset(const regc_model *m, int i)
{
    return (i >= 0 && i < m->n_params) ? m->params[i].offset : -1;
}

/* ------------------------------------------------- init, graph, saving */

int regc_model_init_random(regc_model *m, uint64_t seed)
{
    regc_weights *w = NULL;
    int rc = regc_weights_seeded(m, seed, &w);
    if (rc == REGC_OK)
        rc = regc_model_read_weights(m, w);
    regc_weights_close(w);
    return rc;
}

cJSON *regc_model_config_new(const regc_model *m, const char *architecture)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateStringArray(&architecture, 1);
    int ok = o && arch && cJSON_AddItemToObject(o, "architectures", arch);
    if (!ok)
        cJSON_Delete(arch);
    ok = ok && cJSON_AddStringToObject(o, "model_type", m->arch->model_type);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int regc_model_add_param_tensors(const regc_model *m, regc_graph *g, int **ids)
{
    int *p = malloc((size_t)m->n_params * sizeof *p + 1);
    *ids = p;
    if (!p)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    for (int i = 0; i < m->n_params; i++) {
        const regc_model_param *q = &m->params[i];
        p[i] = regc_graph_add_tensor(g, q->name, REGC_F32, REGC_ROLE_PARAM, q->ndim, q->shape);
        if (p[i] < 0)
            return p[i];
        if (q->frozen)
            regc_graph_set_frozen(g, p[i], q->frozen);
    }
    return REGC_OK;
}

void regc_model_set_dropout(regc_model *m, int on) { m->dropout = on != 0; }

int regc_model_set_documents(regc_model *m, const regc_documents *d)
{
    const int64_t eod = d->eod_token_id;
    m->documents = m->reset_positions = m->mask_eod = 0;
    const int graph = m->arch == &regc_arch_graph;
    int rc = graph ? regc_graph_model_check_documents(m, eod >= 0) : REGC_OK;
    if (rc)
        return rc;
    if (eod < 0) {
        if (d->reset_position_ids || d->eod_mask_loss)
            return regc_error(REGC_ERR_ARG,
                              "train.%s: needs train.eod_token_id, the token "
                              "documents end after",
                              d->reset_position_ids ? "reset_position_ids" : "eod_mask_loss");
        return REGC_OK;
    }
    /* The shared decoder builder places the "doc_start" input, and a graph
     * model's build gives it to the graph's causal attention. */
    const decoder_family *f = m->arch->family;
    if (!f && !graph)
        return regc_error(REGC_ERR_ARG,
                          "train.eod_token_id: documents apply to causal language models (gpt2, "
                          "the llama family, graph models); %s is a %s model",
                          m->source, m->arch->model_type);
    if (eod >= regc_model_vocab(m))
        return regc_error(REGC_ERR_ARG,
                          "train.eod_token_id: %" PRId64 " is past the vocabulary of %s (%" PRId64
                          " tokens)",
                          eod, m->source, regc_model_vocab(m));
    /* A rotary score depends on the distance between query and key alone,
     * so a document's scores are the same wherever it starts: there is no
     * position to reset, and regc's rotary tables are per position, not
     * per row. */
    if (d->reset_position_ids && graph)
        return regc_error(REGC_ERR_ARG,
                          "train.reset_position_ids: %s's positions are its graph's, the same "
                          "for every row; it applies to gpt2",
                          m->source);
    if (d->reset_position_ids && !f->learned_positions)
        return regc_error(REGC_ERR_ARG,
                          "train.reset_position_ids: %s's rotary positions are relative, so its "
                          "documents already train as if each began at 0; it applies to learned "
                          "positions (gpt2)",
                          m->source);
    m->documents = 1, m->eod = (int32_t)eod;
    m->reset_positions = d->reset_position_ids != 0, m->mask_eod = d->eod_mask_loss != 0;
    return REGC_OK;
}

void regc_model_documents(const regc_model *m, regc_documents *out)
{
    *out = (regc_documents){.eod_token_id = m->documents ? m->eod : -1,
                            .reset_position_ids = m->reset_positions,
                            .eod_mask_loss = m->mask_eod};
}

#define DROPOUT_SITE "dropout.site."
#define DOC_START "doc_start" /* where each position's document starts */
#define DROPOUT_DRAW "dropout.draw"

/* A dropout's inputs: the constant naming its site (*s) and the batch's
 * draw, one for the graph (*draw). */
static int dropout_inputs(regc_graph *g, int site, int *s, int *draw)
{
    const int64_t one = 1, four = 4;
    char name[64];
    snprintf(name, sizeof name, DROPOUT_SITE "%d", site);
    *draw = regc_graph_find_tensor(g, DROPOUT_DRAW);
    if (*draw < 0 &&
        (*draw = regc_graph_add_tensor(g, DROPOUT_DRAW, REGC_I32, REGC_ROLE_INPUT, 1, &four)) < 0)
        return *draw;
    *s = regc_graph_add_constant(g, name, REGC_I32, 1, &one);
    return *s < 0 ? *s : REGC_OK;
}

int regc_model_dropout(const regc_model *m, regc_graph *g, int x, int site, double p, int *out)
{
    *out = x;
    if (!m->dropout || p <= 0.0)
        return REGC_OK;
    int s, draw, rc = dropout_inputs(g, site, &s, &draw);
    if (rc)
        return rc;
    *out = regc_graph_dropout(g, x, s, draw, (float)p);
    return *out < 0 ? *out : REGC_OK;
}

int regc_model_attention(const regc_model *m, regc_graph *g, int q, int k, int v, int bias,
                         const regc_attrs *a, double p, int *out)
{
    regc_attrs with = *a;
    int s = -1, draw = -1, docs = -1;
    with.value = 0.0f;
    if (m->dropout && p > 0.0) {
        int rc = dropout_inputs(g, q, &s, &draw);
        if (rc)
            return rc;
        with.value = (float)p;
    }
    if (m->documents && a->causal) { /* one input for every layer: [B, T] as q's */
        const regc_tensor *tq = regc_graph_tensor(g, q);
        if ((docs = regc_graph_find_tensor(g, DOC_START)) < 0 &&
            (docs = regc_graph_add_tensor(g, DOC_START, REGC_I32, REGC_ROLE_INPUT, 2, tq->shape)) <
                0)
            return docs;
    }
    *out = regc_graph_attention_full(g, q, k, v, bias, s, draw, docs, &with);
    return *out < 0 ? *out : REGC_OK;
}

const char *regc_model_dropout_note(const regc_model *m)
{
    return m->dropout ? "(applied in training)" : "(not applied: train.dropout off)";
}

/* The dropout inputs: each site's number (a constant), and the draw of this
 * batch: the seed's words, the micro-batch, 1 when training. */
static void fill_dropout(const regc_batch_spec *b, int n, regc_input *in)
{
    for (int i = 0; i < n; i++) {
        const char *name = in[i].tensor->name;
        int32_t *v = in[i].host;
        if (!strncmp(name, DROPOUT_SITE, strlen(DROPOUT_SITE)) && !in[i].filled) {
            v[0] = (int32_t)strtol(name + strlen(DROPOUT_SITE), NULL, 10);
            in[i].filled = in[i].constant = 1;
        } else if (!strcmp(name, DROPOUT_DRAW)) {
            v[0] = (int32_t)(uint32_t)b->seed, v[1] = (int32_t)(uint32_t)(b->seed >> 32);
            v[2] = (int32_t)(uint32_t)b->step, v[3] = !b->eval;
            in[i].filled = 1;
        }
    }
}

int regc_model_build_graph(const regc_model *m, int64_t batch, int64_t seq, regc_graph **out)
{
    *out = NULL;
    if (batch < 1 || seq < 1)
        return regc_error(REGC_ERR_ARG,
                          "%s: batch %" PRId64 " and sequence length %" PRId64
                          " must both be at least 1",
                          m->source, batch, seq);
    int rc = m->arch->build_graph(m, batch, seq, out);
    if (rc || !m->lora)
        return rc;
    regc_graph *g = *out;
    rc = regc_lora_rewrite(m, g, out);
    regc_graph_free(g);
    return rc;
}

/* ------------------------------------------------------- graph inputs */

regc_input *regc_input_find(int n, regc_input *in, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(in[i].tensor->name, name) == 0)
            return &in[i];
    return NULL;
}

/* An i32 input of exactly `numel` elements, or an error naming it. */
static int lm_input_check(const regc_model *m, const regc_input *x, int64_t numel)
{
    if (x->tensor->dtype != REGC_I32 || regc_tensor_numel(x->tensor) != numel)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: graph input %s must be i32 with %" PRId64 " elements", m->source,
                          x->tensor->name, numel);
    return REGC_OK;
}

int regc_model_fill_lm_inputs(const regc_model *m, const regc_tokens *data,
                              const regc_batch_spec *b, int n, regc_input *in)
{
    regc_input *ids = regc_input_find(n, in, "input_ids");
    regc_input *targets = regc_input_find(n, in, "targets");
    /* per row under reset_position_ids: fill_documents fills them */
    regc_input *pos = m->reset_positions ? NULL : regc_input_find(n, in, "position_ids");
    const int64_t bt = b->batch * b->seq;
    int rc;
    if ((ids && (rc = lm_input_check(m, ids, bt)) < 0) ||
        (targets && (rc = lm_input_check(m, targets, bt)) < 0) ||
        (pos && (rc = lm_input_check(m, pos, b->seq)) < 0))
        return rc;
    if (ids || targets) {
        int32_t *tmp = (ids && targets) ? NULL : malloc((size_t)bt * sizeof *tmp);
        if (!(ids && targets) && !tmp)
            return regc_error(REGC_ERR_MEMORY, "out of memory");
        rc = regc_tokens_rows(data, b->step, b->global_rows ? b->global_rows : b->batch, b->row0,
                              b->batch, b->seq, ids ? ids->host : tmp,
                              targets ? targets->host : tmp);
        free(tmp);
        if (rc < 0)
            return rc;
        if (ids)
            ids->filled = 1;
        if (targets)
            targets->filled = 1;
    }
    if (pos && !pos->filled) {
        int32_t *p = pos->host;
        for (int64_t t = 0; t < b->seq; t++)
            p[t] = (int32_t)t;
        pos->filled = pos->constant = 1;
    }
    return REGC_OK;
}

/* doc_start [B, T] from the batch's input ids: a document ends after each
 * eod token, and a row starts one (its first tokens may continue a
 * document of the row before, which they no longer see). Under
 * reset_position_ids each position counts from its document's start
 * (position_ids [B, T]); under eod_mask_loss the target read at an eod
 * token, the next document's first token, does not count. */
static int fill_documents(const regc_model *m, const regc_batch_spec *b, int n, regc_input *in)
{
    regc_input *docs = regc_input_find(n, in, DOC_START),
               *ids = regc_input_find(n, in, "input_ids"),
               *pos = m->reset_positions ? regc_input_find(n, in, "position_ids") : NULL,
               *targets = m->mask_eod ? regc_input_find(n, in, "targets") : NULL;
    const int64_t bt = b->batch * b->seq;
    int rc;
    if (!docs || docs->filled)
        return REGC_OK;
    if (!m->documents || !ids || !ids->filled || regc_tensor_numel(docs->tensor) != bt)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: graph input " DOC_START " needs train.eod_token_id and the batch's "
                          "input_ids [%" PRId64 ", %" PRId64 "]",
                          m->source, b->batch, b->seq);
    if ((pos && (rc = lm_input_check(m, pos, bt)) < 0) ||
        (targets && (rc = lm_input_check(m, targets, bt)) < 0))
        return rc;
    const int32_t *tok = ids->host;                 /* [B, T] */
    int32_t *start = docs->host;                    /* [B, T] */
    int32_t *p = pos ? pos->host : NULL;            /* [B, T] or NULL */
    int32_t *next = targets ? targets->host : NULL; /* [B, T] or NULL */
    for (int64_t r = 0; r < b->batch; r++) {
        int32_t first = 0;
        for (int64_t t = 0; t < b->seq; t++) {
            const int64_t i = r * b->seq + t;
            start[i] = first;
            if (p)
                p[i] = (int32_t)t - first;
            if (tok[i] == m->eod) {
                first = (int32_t)(t + 1);
                if (next)
                    next[i] = -1;
            }
        }
    }
    docs->filled = 1;
    if (pos)
        pos->filled = 1;
    return REGC_OK;
}

int regc_model_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                           int n, regc_input *in)
{
    for (int i = 0; i < n; i++)
        in[i].filled = in[i].constant;
    fill_dropout(b, n, in);
    int rc = m->arch->fill_inputs ? m->arch->fill_inputs(m, data, b, n, in)
                                  : regc_model_fill_lm_inputs(m, data, b, n, in);
    if (rc < 0 || (rc = fill_documents(m, b, n, in)) < 0)
        return rc;
    for (int i = 0; i < n; i++)
        if (!in[i].filled)
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: graph input %s is not one a %s model can fill from token data",
                              m->source, in[i].tensor->name, m->arch->model_type);
    return REGC_OK;
}

int regc_model_save_config(const regc_model *m, const char *dir)
{
    if (m->arch->save_files)
        return m->arch->save_files(m, dir);
    cJSON *cfg = m->arch->write_config(m);
    /* the keys that change nothing, as the model's config.json had them
     * (its tokenizer's ids: generation after training needs them) */
    for (const cJSON *it = m->inert_keys ? m->inert_keys->child : NULL; cfg && it; it = it->next) {
        cJSON *copy =
            cJSON_GetObjectItemCaseSensitive(cfg, it->string) ? NULL : cJSON_Duplicate(it, 1);
        if (copy && !cJSON_AddItemToObject(cfg, it->string, copy))
            cJSON_Delete(copy);
    }
    char *text = cfg ? cJSON_Print(cfg) : NULL;
    cJSON_Delete(cfg);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory writing config.json", dir);
    size_t len = strlen(text);
    char *with_nl = malloc(len + 2);
    if (with_nl) {
        memcpy(with_nl, text, len);
        with_nl[len] = '\n';
        with_nl[len + 1] = '\0';
    }
    cJSON_free(text);
    if (!with_nl)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory writing config.json", dir);
    char path[4096];
    int rc = regc_path_join(path, sizeof path, dir, "config.json");
    if (rc == REGC_OK)
        rc = regc_file_write_atomic(path, with_nl, len + 1);
    free(with_nl);
    return rc;
}

int regc_model_save(const regc_model *m, const char *dir)
{
    return regc_model_save_as(m, dir, NULL);
}

int regc_model_save_as(const regc_model *m, const char *dir, const regc_dtype *dtype)
{
    if (!m->weights)
        return regc_error(REGC_ERR_ARG,
                          "%s: cannot save %s: the model has no weights yet (shape-only)", dir,
                          m->source);
    /* a staged directory: config and weights appear together or not at all */
    regc_staged_dir *s;
    regc_model_writer *w = NULL;
    int rc = regc_staged_dir_open(dir, &s);
    if (rc)
        return rc;
    rc = regc_model_writer_open_as(m, regc_staged_dir_path(s), dtype, &w);
    for (int i = m->lora ? m->lora->n_base : 0; i < m->n_params && rc == REGC_OK; i++)
        rc = regc_model_writer_put(w, i, 0, m->params[i].numel, m->weights + m->params[i].offset);
    if (rc == REGC_OK) {
        rc = regc_model_writer_finish(w);
        w = NULL;
    }
    regc_model_writer_abandon(w);
    if (rc == REGC_OK)
        return regc_staged_dir_commit(s);
    regc_staged_dir_abandon(s);
    return rc;
}

/* The depth keys of the architectures' config.json files. */
static const char *const layer_keys[] = {"n_layer", "num_hidden_layers", "num_layers",
                                         "num_decoder_layers"};

int regc_model_with_layers(const regc_model *m, int64_t n_layer, regc_model **out)
{
    *out = NULL;
    if (n_layer < 1)
        return regc_error(REGC_ERR_ARG, "%s: a depth must be at least 1 layer (got %lld)",
                          m->source, (long long)n_layer);
    cJSON *cfg = m->arch->save_files ? NULL : m->arch->write_config(m);
    if (!cfg)
        return regc_error(REGC_ERR_UNSUPPORTED, "%s: a %s model has no depth to change", m->source,
                          m->arch->model_type);
    int found = 0;
    for (size_t i = 0; i < sizeof layer_keys / sizeof *layer_keys; i++) {
        cJSON *k = cJSON_GetObjectItemCaseSensitive(cfg, layer_keys[i]);
        if (k && cJSON_IsNumber(k)) {
            cJSON_SetNumberValue(k, (double)n_layer);
            found = 1;
        }
    }
    char source[512];
    snprintf(source, sizeof source, "%s with %lld layers", m->source, (long long)n_layer);
    regc_model *x = NULL;
    int rc = found
                 ? regc_model_new(m->arch, source, &x)
                 : regc_error(REGC_ERR_UNSUPPORTED, "%s: no layer count in its config", m->source);
    if (rc == REGC_OK &&
        ((rc = m->arch->parse_config(x, cfg, source)) < 0 || (rc = m->arch->list_params(x)) < 0)) {
        regc_model_free(x);
        x = NULL;
    }
    cJSON_Delete(cfg);
    if (x) /* the same checkpoint's kind of weights */
        x->checkpoint_nf4 = m->checkpoint_nf4;
    *out = x;
    return rc < 0 ? rc : REGC_OK;
}
