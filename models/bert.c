/* bert.c — the BERT architecture (Hugging Face BertForMaskedLM): its
 * config.json, parameters in checkpoint order, presets, the flat forward
 * graph with the masked-language-model head and loss, and the per-batch
 * masking of the training inputs. The graph is flat like gpt2.c's: the
 * encoder layers are left for detect/ to find from the ops alone. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define BERT_MAX_DIM 2147483647 /* ids are i32 and heads are int */

/* A position is masked when the top 24 bits of its random draw are below
 * this: the integers below 0.15 * 2^24 = 2516582.4 (probability 0.15000003). */
#define BERT_MASK_BELOW 2516583u
/* BERT's WordPiece vocabularies put [MASK] at 103. */
#define BERT_DEFAULT_MASK_ID 103

typedef struct {
    int64_t vocab, n_pos, hidden, n_layer, n_head, inter, type_vocab;
    int64_t mask_id, pad_id; /* pad_id: the word embedding's padding_idx; -1: none */
    double eps;
    int tied;
    double hidden_drop, attn_drop;
} bert_config;

static int bert_set_config(regc_model *m, const bert_config *c)
{
    bert_config *copy = malloc(sizeof *copy);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    *copy = *c;
    m->cfg = copy;
    m->vocab = c->vocab;
    m->max_seq = c->n_pos;
    return REGC_OK;
}

static int bert_preset_config(regc_model *m, const char *preset)
{
    bert_config c = {.type_vocab = 2,
                     .eps = 1e-12,
                     .tied = 1,
                     .mask_id = BERT_DEFAULT_MASK_ID,
                     .hidden_drop = 0.1,
                     .attn_drop = 0.1};
    if (strcmp(preset, "bert-tiny") == 0) {
        c.vocab = 512, c.n_pos = 256, c.hidden = 128, c.n_layer = 4, c.n_head = 4, c.inter = 512;
        /* The built-in corpus is bytes: 103 would be the letter 'g'; 256 is
         * the first id no byte uses. */
        c.mask_id = 256;
    } else if (strcmp(preset, "bert-base") == 0) {
        /* bert-base-uncased */
        c.vocab = 30522, c.n_pos = 512, c.hidden = 768, c.n_layer = 12, c.n_head = 12;
        c.inter = 3072;
    } else {
        return regc_error(REGC_ERR_ARG, "%s: not a bert preset", preset);
    }
    return bert_set_config(m, &c);
}

/* Options whose other values change the computation in ways regc does not
 * implement: refusing them beats training a different model. */
static int bert_check_unsupported(const cJSON *root, const char *path)
{
    static const char *const flags[] = {"is_decoder", "add_cross_attention"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        int v, rc = regc_cfg_bool(root, path, flags[i], 0, 0, &v);
        if (rc < 0)
            return rc;
        if (v)
            return regc_error(REGC_ERR_UNSUPPORTED, "%s: key \"%s\" = true is not supported", path,
                              flags[i]);
    }
    const char *act, *pos;
    int rc;
    if ((rc = regc_cfg_string(root, path, "hidden_act", 0, "gelu", &act)) < 0 ||
        (rc = regc_cfg_string(root, path, "position_embedding_type", 0, "absolute", &pos)) < 0)
        return rc;
    /* "gelu" is the erf form the GELU_ERF op computes; "gelu_new" and the
     * other tanh spellings would silently differ. */
    if (strcmp(act, "gelu") != 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"hidden_act\" is \"%s\" (supported: gelu)", path, act);
    if (strcmp(pos, "absolute") != 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"position_embedding_type\" is \"%s\" (supported: absolute)",
                          path, pos);
    return REGC_OK;
}

static int bert_parse_config(regc_model *m, const cJSON *root, const char *path)
{
    bert_config c = {0};
    int rc;
    if ((rc = regc_cfg_int(root, path, "vocab_size", 1, 0, 1, BERT_MAX_DIM, &c.vocab)) < 0 ||
        (rc = regc_cfg_int(root, path, "hidden_size", 1, 0, 1, BERT_MAX_DIM, &c.hidden)) < 0 ||
        (rc = regc_cfg_int(root, path, "num_hidden_layers", 1, 0, 1, BERT_MAX_DIM, &c.n_layer)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_attention_heads", 1, 0, 1, BERT_MAX_DIM, &c.n_head)) <
            0 ||
        (rc = regc_cfg_int(root, path, "intermediate_size", 1, 0, 1, BERT_MAX_DIM, &c.inter)) < 0 ||
        (rc = regc_cfg_int(root, path, "max_position_embeddings", 1, 0, 1, BERT_MAX_DIM,
                           &c.n_pos)) < 0 ||
        (rc = regc_cfg_int(root, path, "type_vocab_size", 0, 2, 1, BERT_MAX_DIM, &c.type_vocab)) <
            0 ||
        (rc = regc_cfg_double(root, path, "layer_norm_eps", 0, 1e-12, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, 1, &c.tied)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "hidden_dropout_prob", 0.1, &c.hidden_drop)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "attention_probs_dropout_prob", 0.1, &c.attn_drop)) <
            0 ||
        (rc = bert_check_unsupported(root, path)) < 0)
        return rc;
    /* Small vocabularies have no id 103; their last id stands in for [MASK]. */
    int64_t dflt_mask = c.vocab > BERT_DEFAULT_MASK_ID ? BERT_DEFAULT_MASK_ID : c.vocab - 1;
    /* pad_token_id (BertConfig's default 0) is the word embedding's
     * padding_idx, whose row takes no gradient from the lookup */
    if ((rc = regc_cfg_int(root, path, "mask_token_id", 0, dflt_mask, 0, c.vocab - 1, &c.mask_id)) <
            0 ||
        (rc = regc_cfg_pad_token(root, path, 0, c.vocab, &c.pad_id)) < 0)
        return rc;
    if (c.hidden % c.n_head != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: hidden_size %" PRId64
                          " is not divisible by num_attention_heads %" PRId64,
                          path, c.hidden, c.n_head);
    return bert_set_config(m, &c);
}

/* Parameters of one encoder layer in checkpoint order; build_graph reads
 * them by these positions. nn.Linear weights are [out, in]. */
enum {
    L_Q_W,
    L_Q_B,
    L_K_W,
    L_K_B,
    L_V_W,
    L_V_B,
    L_AO_W,
    L_AO_B,
    L_ALN_W,
    L_ALN_B,
    L_I_W,
    L_I_B,
    L_O_W,
    L_O_B,
    L_OLN_W,
    L_OLN_B,
    L_COUNT
};

/* The checkpoint order of BertForMaskedLM's state dict (BertLMPredictionHead
 * registers its own bias before its submodules). */
static int bert_list_params(regc_model *m)
{
    const bert_config *c = m->cfg;
    const int64_t C = c->hidden, F = c->inter, V = c->vocab;
    /* HF BERT's init (normal, std initializer_range 0.02) as uniform draws
     * of the same std; no residual scaling, unlike GPT-2. */
    const float w = (float)(0.02 * sqrt(3.0));
    char n[160];
    int rc;
    if ((rc = regc_model_add_2d(m, "bert.embeddings.word_embeddings.weight", 2, V, C, 0.0f, w)) <
            0 ||
        (rc = regc_model_add_2d(m, "bert.embeddings.position_embeddings.weight", 2, c->n_pos, C,
                                0.0f, w)) < 0 ||
        (rc = regc_model_add_2d(m, "bert.embeddings.token_type_embeddings.weight", 2, c->type_vocab,
                                C, 0.0f, w)) < 0 ||
        (rc = regc_model_add_2d(m, "bert.embeddings.LayerNorm.weight", 1, C, 0, 1.0f, 0.0f)) < 0 ||
        (rc = regc_model_add_2d(m, "bert.embeddings.LayerNorm.bias", 1, C, 0, 0.0f, 0.0f)) < 0)
        return rc;
    static const struct {
        const char *suffix;
        int ndim;
        char d0, d1;
        float center;
        int random;
    } t[L_COUNT] = {
        [L_Q_W] = {"attention.self.query.weight", 2, 'C', 'C', 0.0f, 1},
        [L_Q_B] = {"attention.self.query.bias", 1, 'C', 0, 0.0f, 0},
        [L_K_W] = {"attention.self.key.weight", 2, 'C', 'C', 0.0f, 1},
        [L_K_B] = {"attention.self.key.bias", 1, 'C', 0, 0.0f, 0},
        [L_V_W] = {"attention.self.value.weight", 2, 'C', 'C', 0.0f, 1},
        [L_V_B] = {"attention.self.value.bias", 1, 'C', 0, 0.0f, 0},
        [L_AO_W] = {"attention.output.dense.weight", 2, 'C', 'C', 0.0f, 1},
        [L_AO_B] = {"attention.output.dense.bias", 1, 'C', 0, 0.0f, 0},
        [L_ALN_W] = {"attention.output.LayerNorm.weight", 1, 'C', 0, 1.0f, 0},
        [L_ALN_B] = {"attention.output.LayerNorm.bias", 1, 'C', 0, 0.0f, 0},
        [L_I_W] = {"intermediate.dense.weight", 2, 'F', 'C', 0.0f, 1},
        [L_I_B] = {"intermediate.dense.bias", 1, 'F', 0, 0.0f, 0},
        [L_O_W] = {"output.dense.weight", 2, 'C', 'F', 0.0f, 1},
        [L_O_B] = {"output.dense.bias", 1, 'C', 0, 0.0f, 0},
        [L_OLN_W] = {"output.LayerNorm.weight", 1, 'C', 0, 1.0f, 0},
        [L_OLN_B] = {"output.LayerNorm.bias", 1, 'C', 0, 0.0f, 0},
    };
    for (int64_t l = 0; l < c->n_layer; l++) {
        for (int i = 0; i < L_COUNT; i++) {
            int64_t d0 = t[i].d0 == 'F' ? F : C, d1 = t[i].d1 == 'F' ? F : C;
            snprintf(n, sizeof n, "bert.encoder.layer.%" PRId64 ".%s", l, t[i].suffix);
            if ((rc = regc_model_add_2d(m, n, t[i].ndim, d0, d1, t[i].center,
                                        t[i].random ? w : 0.0f)) < 0)
                return rc;
        }
    }
    if ((rc = regc_model_add_2d(m, "cls.predictions.bias", 1, V, 0, 0.0f, 0.0f)) < 0 ||
        (rc = regc_model_add_2d(m, "cls.predictions.transform.dense.weight", 2, C, C, 0.0f, w)) <
            0 ||
        (rc = regc_model_add_2d(m, "cls.predictions.transform.dense.bias", 1, C, 0, 0.0f, 0.0f)) <
            0 ||
        (rc = regc_model_add_2d(m, "cls.predictions.transform.LayerNorm.weight", 1, C, 0, 1.0f,
                                0.0f)) < 0 ||
        (rc = regc_model_add_2d(m, "cls.predictions.transform.LayerNorm.bias", 1, C, 0, 0.0f,
                                0.0f)) < 0)
        return rc;
    /* Tied: the decoder reads word_embeddings (HF drops the duplicate from
     * the file); its bias is cls.predictions.bias either way. */
    if (!c->tied &&
        (rc = regc_model_add_2d(m, "cls.predictions.decoder.weight", 2, V, C, 0.0f, w)) < 0)
        return rc;
    return REGC_OK;
}

/* Older checkpoints (bert-base-uncased's own model.safetensors among them)
 * spell LayerNorm parameters as TensorFlow did: gamma and beta. */
static int bert_legacy_name(const char *name, char *buf, size_t cap)
{
    static const char *const from[] = {"LayerNorm.weight", "LayerNorm.bias"};
    static const char *const to[] = {"LayerNorm.gamma", "LayerNorm.beta"};
    size_t n = strlen(name);
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(from[i]);
        if (n >= k && strcmp(name + n - k, from[i]) == 0 && n - k + strlen(to[i]) < cap) {
            memcpy(buf, name, n - k);
            strcpy(buf + n - k, to[i]);
            return 1;
        }
    }
    return 0;
}

/* Tensor ids below are checked once per call through this macro: every
 * helper returns an id or a negative status with its own message. */
#define G(expr)                                                                                    \
    do {                                                                                           \
        if ((rc = (expr)) < 0)                                                                     \
            goto fail;                                                                             \
    } while (0)

static int bert_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out)
{
    const bert_config *c = m->cfg;
    if (T > c->n_pos)
        return regc_error(REGC_ERR_ARG,
                          "sequence length %" PRId64 " exceeds max_position_embeddings %" PRId64
                          " of %s",
                          T, c->n_pos, m->source);
    regc_graph *g = regc_graph_new();
    int *p = NULL; /* [n_params] the parameters' tensor ids */
    if (!g)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    int rc, ids, types, pos, targets, x, h, q, kk, v, t, k = 0;
    const int64_t bt[] = {B, T}, tt[] = {T};
    G(ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(types = regc_graph_add_constant(g, "token_type_ids", REGC_I32, 2, bt));
    G(pos = regc_graph_add_constant(g, "position_ids", REGC_I32, 1, tt));
    G(targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(regc_model_add_param_tensors(m, g, &p));
    const int word = p[k++], wpe = p[k++], tte = p[k++], eln_w = p[k++], eln_b = p[k++];
    const float eps = (float)c->eps;
    const float scale = (float)(1.0 / sqrt((double)(c->hidden / c->n_head)));
    const regc_attrs attn = {.n_head = (int)c->n_head, .n_kv_head = (int)c->n_head, .scale = scale};
    /* HF's order: word + token type, then + position. */
    G(x = c->pad_id >= 0 ? regc_graph_embedding_padded(g, ids, word, c->pad_id)
                         : regc_graph_embedding(g, ids, word)); /* [B, T, C] */
    G(t = regc_graph_embedding(g, types, tte));                 /* [B, T, C] */
    G(x = regc_graph_add(g, x, t));                             /* [B, T, C] */
    G(t = regc_graph_embedding(g, pos, wpe));                   /* [T, C] */
    G(x = regc_graph_bias_add(g, x, t));                        /* [B, T, C] */
    G(x = regc_graph_layernorm(g, x, eln_w, eln_b, eps));       /* [B, T, C] */
    /* hidden_dropout_prob where Transformers applies it: after the
     * embeddings' norm, and on each sublayer's output before the residual */
    G(regc_model_dropout(m, g, x, x, c->hidden_drop, &x)); /* [B, T, C] */
    for (int64_t l = 0; l < c->n_layer; l++) {
        const int *w = &p[k];
        k += L_COUNT;
        /* Post-LN: each sublayer's output joins the residual, then normalises. */
        G(q = regc_graph_matmul(g, x, w[L_Q_W], 0, 1));                       /* [B, T, C] */
        G(q = regc_graph_bias_add(g, q, w[L_Q_B]));                           /* [B, T, C] */
        G(kk = regc_graph_matmul(g, x, w[L_K_W], 0, 1));                      /* [B, T, C] */
        G(kk = regc_graph_bias_add(g, kk, w[L_K_B]));                         /* [B, T, C] */
        G(v = regc_graph_matmul(g, x, w[L_V_W], 0, 1));                       /* [B, T, C] */
        G(v = regc_graph_bias_add(g, v, w[L_V_B]));                           /* [B, T, C] */
        G(regc_model_attention(m, g, q, kk, v, -1, &attn, c->attn_drop, &h)); /* [B, T, C] */
        G(h = regc_graph_matmul(g, h, w[L_AO_W], 0, 1));                      /* [B, T, C] */
        G(h = regc_graph_bias_add(g, h, w[L_AO_B]));                          /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->hidden_drop, &h));                /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                                       /* [B, T, C] */
        G(x = regc_graph_layernorm(g, x, w[L_ALN_W], w[L_ALN_B], eps));       /* [B, T, C] */
        G(h = regc_graph_matmul(g, x, w[L_I_W], 0, 1));                       /* [B, T, F] */
        G(h = regc_graph_bias_add(g, h, w[L_I_B]));                           /* [B, T, F] */
        G(h = regc_graph_gelu_erf(g, h));                                     /* [B, T, F] */
        G(h = regc_graph_matmul(g, h, w[L_O_W], 0, 1));                       /* [B, T, C] */
        G(h = regc_graph_bias_add(g, h, w[L_O_B]));                           /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->hidden_drop, &h));                /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                                       /* [B, T, C] */
        G(x = regc_graph_layernorm(g, x, w[L_OLN_W], w[L_OLN_B], eps));       /* [B, T, C] */
    }
    const int dec_b = p[k++], tr_w = p[k++], tr_b = p[k++], tln_w = p[k++], tln_b = p[k++];
    const int dec_w = c->tied ? word : p[k++];
    int logits, loss;
    G(h = regc_graph_matmul(g, x, tr_w, 0, 1));           /* [B, T, C] */
    G(h = regc_graph_bias_add(g, h, tr_b));               /* [B, T, C] */
    G(h = regc_graph_gelu_erf(g, h));                     /* [B, T, C] */
    G(h = regc_graph_layernorm(g, h, tln_w, tln_b, eps)); /* [B, T, C] */
    G(logits = regc_graph_matmul(g, h, dec_w, 0, 1));     /* [B, T, V] */
    G(logits = regc_graph_bias_add(g, logits, dec_b));    /* [B, T, V] */
    /* Unmasked positions carry target -1: the mean runs over masked ones. */
    G(loss = regc_graph_cross_entropy(g, logits, targets)); /* [] */
    G(regc_graph_mark_output(g, loss));
    free(p);
    *out = g;
    return REGC_OK;
fail:
    regc_error_prefix("%s: building the bert graph", m->source);
    free(p);
    regc_graph_free(g);
    return rc;
}
#undef G

/* ------------------------------------------------------------- masking */

/* The masked-LM inputs of one batch. Position (b, t) is masked when
 * regc_rng_at(regc_rng_substream(seed, step), b*T + t) >> 40 < BERT_MASK_BELOW
 * (probability 0.15): its input becomes [MASK] and its target the original
 * token; every other target is -1, which the loss ignores. A batch with no
 * masked position masks (0, 0), so the mean always has a term. Unlike BERT's
 * pre-training recipe, a masked input is always [MASK] (no 10% random, 10%
 * kept): the rule stays one comparison that a reference can replay. */
static int bert_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                            int n, regc_input *in)
{
    const bert_config *c = m->cfg;
    regc_input *ids = regc_input_find(n, in, "input_ids");
    regc_input *targets = regc_input_find(n, in, "targets");
    regc_input *types = regc_input_find(n, in, "token_type_ids");
    const int64_t bt = b->batch * b->seq;
    if (!ids != !targets) /* neither: the constants alone are asked for */
        return regc_error(REGC_ERR_ARG,
                          "%s: a bert training graph needs inputs input_ids and targets",
                          m->source);
    if (types && (types->tensor->dtype != REGC_I32 || regc_tensor_numel(types->tensor) != bt))
        return regc_error(REGC_ERR_SHAPE,
                          "%s: graph input token_type_ids must be i32 with %" PRId64 " elements",
                          m->source, bt);
    if (types && !types->filled) {
        /* Single-segment text: every position is segment 0. */
        memset(types->host, 0, (size_t)bt * sizeof(int32_t));
        types->filled = types->constant = 1;
    }
    /* input_ids, position_ids, and targets (the shifted ones, replaced below) */
    int rc = regc_model_fill_lm_inputs(m, data, b, n, in);
    if (rc < 0 || !ids)
        return rc;
    int32_t *x = ids->host, *y = targets->host;
    const uint64_t stream = regc_rng_substream(b->seed, (uint64_t)b->step);
    /* Masks are drawn per position of the global batch, so a rank of a
     * data-parallel run masks what one process would; that includes the
     * rule for a batch with no masked position at all, decided over the
     * whole global batch (every rank can draw it). */
    const int64_t first = b->row0 * b->seq;
    const int64_t global = (b->global_rows ? b->global_rows : b->batch) * b->seq;
    int64_t n_masked = 0;
    for (int64_t i = 0; i < global && n_masked == 0; i++)
        n_masked += (regc_rng_at(stream, (uint64_t)i) >> 40) < BERT_MASK_BELOW;
    for (int64_t i = 0; i < bt; i++) {
        int masked = (regc_rng_at(stream, (uint64_t)(first + i)) >> 40) < BERT_MASK_BELOW;
        if (n_masked == 0) /* none in the whole batch: its first position */
            masked = first + i == 0;
        y[i] = masked ? x[i] : -1;
        if (masked)
            x[i] = (int32_t)c->mask_id;
    }
    return REGC_OK;
}

/* ------------------------------------------------------- config, describe */

static cJSON *bert_write_config(const regc_model *m)
{
    const bert_config *c = m->cfg;
    cJSON *o = regc_model_config_new(m, "BertForMaskedLM");
    int ok = o != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    ok = ok && cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden);
    ok = ok && cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->n_layer);
    ok = ok && cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->n_head);
    ok = ok && cJSON_AddNumberToObject(o, "intermediate_size", (double)c->inter);
    ok = ok && cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, "type_vocab_size", (double)c->type_vocab);
    ok = ok && cJSON_AddNumberToObject(o, "layer_norm_eps", c->eps);
    ok = ok && cJSON_AddStringToObject(o, "hidden_act", "gelu");
    ok = ok && cJSON_AddStringToObject(o, "position_embedding_type", "absolute");
    ok = ok && cJSON_AddBoolToObject(o, "is_decoder", 0);
    ok = ok && cJSON_AddBoolToObject(o, "add_cross_attention", 0);
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    ok = ok && cJSON_AddNumberToObject(o, "hidden_dropout_prob", c->hidden_drop);
    ok = ok && cJSON_AddNumberToObject(o, "attention_probs_dropout_prob", c->attn_drop);
    ok = ok && cJSON_AddNumberToObject(o, "mask_token_id", (double)c->mask_id);
    ok = ok && (c->pad_id >= 0 ? cJSON_AddNumberToObject(o, "pad_token_id", (double)c->pad_id)
                               : cJSON_AddNullToObject(o, "pad_token_id")) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void bert_describe(const regc_model *m, char *buf, size_t cap)
{
    const bert_config *c = m->cfg;
    char count[40];
    regc_model_group_digits(count, sizeof count, m->total_numel);
    snprintf(buf, cap,
             "bert %s: vocab %" PRId64 ", max_position_embeddings %" PRId64 ", hidden %" PRId64
             ", layers %" PRId64 ", heads %" PRId64 ", intermediate %" PRId64
             ", type_vocab %" PRId64 ", layer_norm_eps %g, gelu, %s decoder, [MASK] id %" PRId64
             " (15%% of positions masked), %s parameters%s; dropout hidden %g attention %g %s",
             m->source, c->vocab, c->n_pos, c->hidden, c->n_layer, c->n_head, c->inter,
             c->type_vocab, c->eps, c->tied ? "tied" : "untied", c->mask_id, count,
             m->weights ? "" : " (shape only)", c->hidden_drop, c->attn_drop,
             regc_model_dropout_note(m));
}

/* the tied decoder, the next-sentence head and the pooler (pre-training
 * heads regc does not train), and the position-id buffer */
static const char *const bert_ignored[] = {
    "cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
    "cls.seq_relationship.weight",    "cls.seq_relationship.bias",
    "bert.pooler.dense.weight",       "bert.pooler.dense.bias",
    "*embeddings.position_ids",       NULL};

/* config.json's keys (model_load.c checks every key against them) */
static const regc_config_key bert_keys[] = {
    {"vocab_size", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_size", REGC_KEY_APPLIED, NULL, NULL},
    {"num_hidden_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"num_attention_heads", REGC_KEY_APPLIED, NULL, NULL},
    {"intermediate_size", REGC_KEY_APPLIED, NULL, NULL},
    {"max_position_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"type_vocab_size", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_norm_eps", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_act", REGC_KEY_APPLIED, NULL, NULL},
    {"position_embedding_type", REGC_KEY_APPLIED, NULL, NULL},
    {"tie_word_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_dropout_prob", REGC_KEY_APPLIED, NULL, NULL},
    {"attention_probs_dropout_prob", REGC_KEY_APPLIED, NULL, NULL},
    {"mask_token_id", REGC_KEY_APPLIED, NULL, NULL},
    {"pad_token_id", REGC_KEY_APPLIED, NULL, NULL},
    {"is_decoder", REGC_KEY_APPLIED, NULL, NULL},
    {"add_cross_attention", REGC_KEY_APPLIED, NULL, NULL},
    {"classifier_dropout", REGC_KEY_INERT, NULL,
     "a classification head's, which regc does not build"},
    {"gradient_checkpointing", REGC_KEY_INERT, NULL,
     "memory, not the math (compile.recompute is regc's)"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key *const bert_tables[] = {bert_keys, NULL};

const regc_arch regc_arch_bert = {
    .model_type = "bert",
    .config_keys = bert_tables,
    .peft_targets = "query,value", /* PEFT's default target_modules */
    .optional_prefix = NULL,
    .ignored_tensors = bert_ignored,
    .legacy_name = bert_legacy_name,
    .preset_config = bert_preset_config,
    .parse_config = bert_parse_config,
    .list_params = bert_list_params,
    .build_graph = bert_build_graph,
    .write_config = bert_write_config,
    .describe = bert_describe,
    .fill_inputs = bert_fill_inputs,
    .own_data = 1,
};
