/* gpt2.c — the GPT-2 architecture (Hugging Face GPT2LMHeadModel): its
 * config.json, parameters in checkpoint order, presets and the flat forward
 * graph. The graph is deliberately flat: layer structure is left for
 * detect/ to discover from the ops alone. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define GPT2_PREFIX "transformer."
#define GPT2_MAX_DIM 2147483647 /* ids are i32 and heads are int */

typedef struct {
    int64_t vocab, n_pos, n_embd, n_layer, n_head, n_inner;
    double eps;
    char activation[32]; /* kept verbatim so a saved config says what it read */
    int tied;
    double resid_pdrop, embd_pdrop, attn_pdrop;
} gpt2_config;

static int gpt2_set_config(regc_model *m, const gpt2_config *c)
{
    gpt2_config *copy = malloc(sizeof *copy);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    *copy = *c;
    m->cfg = copy;
    m->vocab = c->vocab;
    m->max_seq = c->n_pos;
    return REGC_OK;
}

static int gpt2_preset_config(regc_model *m, const char *preset)
{
    gpt2_config c = {.eps = 1e-5,
                     .activation = "gelu_new",
                     .tied = 1,
                     .resid_pdrop = 0.1,
                     .embd_pdrop = 0.1,
                     .attn_pdrop = 0.1};
    if (strcmp(preset, "gpt2-tiny") == 0) {
        c.vocab = 512, c.n_pos = 256, c.n_embd = 128, c.n_layer = 4, c.n_head = 4;
    } else if (strcmp(preset, "gpt2-124m") == 0) {
        c.vocab = 50257, c.n_pos = 1024, c.n_embd = 768, c.n_layer = 12, c.n_head = 12;
    } else {
        return regc_error(REGC_ERR_ARG, "%s: not a gpt2 preset", preset);
    }
    c.n_inner = 4 * c.n_embd;
    return gpt2_set_config(m, &c);
}

/* Keys whose non-default value changes the computation in ways regc does
 * not implement: refusing them beats training a different model. */
static int gpt2_check_unsupported(const cJSON *root, const char *path)
{
    static const struct {
        const char *key;
        int dflt;
    } keys[] = {
        {"scale_attn_weights", 1},
        {"scale_attn_by_inverse_layer_idx", 0},
        {"reorder_and_upcast_attn", 0},
        {"add_cross_attention", 0},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int v, rc = regc_cfg_bool(root, path, keys[i].key, 0, keys[i].dflt, &v);
        if (rc < 0)
            return rc;
        if (v != keys[i].dflt)
            return regc_error(REGC_ERR_UNSUPPORTED, "%s: key \"%s\" = %s is not supported", path,
                              keys[i].key, v ? "true" : "false");
    }
    return REGC_OK;
}

static int gpt2_parse_config(regc_model *m, const cJSON *root, const char *path)
{
    gpt2_config c = {0};
    const char *act = NULL;
    int rc;
    if ((rc = regc_cfg_int(root, path, "vocab_size", 1, 0, 1, GPT2_MAX_DIM, &c.vocab)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_positions", 1, 0, 1, GPT2_MAX_DIM, &c.n_pos)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_embd", 1, 0, 1, GPT2_MAX_DIM, &c.n_embd)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_layer", 1, 0, 1, GPT2_MAX_DIM, &c.n_layer)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_head", 1, 0, 1, GPT2_MAX_DIM, &c.n_head)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_inner", 0, 4 * c.n_embd, 1, 4 * (int64_t)GPT2_MAX_DIM,
                           &c.n_inner)) < 0 ||
        (rc = regc_cfg_double(root, path, "layer_norm_epsilon", 0, 1e-5, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = regc_cfg_string(root, path, "activation_function", 0, "gelu_new", &act)) < 0 ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, 1, &c.tied)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "resid_pdrop", 0.1, &c.resid_pdrop)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "embd_pdrop", 0.1, &c.embd_pdrop)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "attn_pdrop", 0.1, &c.attn_pdrop)) < 0 ||
        (rc = gpt2_check_unsupported(root, path)) < 0)
        return rc;
    /* Both names denote the tanh approximation, which is what the kernels
     * compute; "gelu" (erf) and the rest would silently differ. */
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"activation_function\" is \"%s\" (supported: gelu_new, "
                          "gelu_pytorch_tanh)",
                          path, act);
    snprintf(c.activation, sizeof c.activation, "%s", act);
    if (c.n_embd % c.n_head != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: n_embd %" PRId64 " is not divisible by n_head %" PRId64, path,
                          c.n_embd, c.n_head);
    return gpt2_set_config(m, &c);
}

/* One layer's parameters, in the checkpoint's order: the slots of
 * gpt2_layer_params and of each layer's ids in gpt2_build_graph. */
enum {
    LN_1_W,
    LN_1_B, /* ln_1 */
    ATTN_W,
    ATTN_B, /* attn.c_attn: q, k, v in one [C, 3C] */
    ATTN_PROJ_W,
    ATTN_PROJ_B, /* attn.c_proj */
    LN_2_W,
    LN_2_B, /* ln_2 */
    FC_W,
    FC_B, /* mlp.c_fc */
    FC_PROJ_W,
    FC_PROJ_B, /* mlp.c_proj */
    LAYER_PARAMS
};

/* The checkpoint order of GPT2LMHeadModel's state dict. */
static int gpt2_list_params(regc_model *m)
{
    const gpt2_config *c = m->cfg;
    const int64_t C = c->n_embd, F = c->n_inner, V = c->vocab;
    /* GPT-2's init as uniform draws of the same std (halfwidth = std * sqrt 3):
     * 0.02, and 0.02 / sqrt(2 n_layer) for the projections into the residual. */
    const float w = (float)(0.02 * sqrt(3.0));
    const float proj = (float)(0.02 / sqrt(2.0 * (double)c->n_layer) * sqrt(3.0));
    char n[128];
    int rc;
    if ((rc = regc_model_add_2d(m, GPT2_PREFIX "wte.weight", 2, V, C, 0.0f, w)) < 0 ||
        (rc = regc_model_add_2d(m, GPT2_PREFIX "wpe.weight", 2, c->n_pos, C, 0.0f, w)) < 0)
        return rc;
    for (int64_t l = 0; l < c->n_layer; l++) {
        /* Conv1D weights are stored [in, out]. */
        const struct {
            const char *suffix;
            int ndim;
            int64_t d0, d1;
            float center, hw;
        } t[] = {
            [LN_1_W] = {"ln_1.weight", 1, C, 0, 1.0f, 0.0f},
            [LN_1_B] = {"ln_1.bias", 1, C, 0, 0.0f, 0.0f},
            [ATTN_W] = {"attn.c_attn.weight", 2, C, 3 * C, 0.0f, w},
            [ATTN_B] = {"attn.c_attn.bias", 1, 3 * C, 0, 0.0f, 0.0f},
            [ATTN_PROJ_W] = {"attn.c_proj.weight", 2, C, C, 0.0f, proj},
            [ATTN_PROJ_B] = {"attn.c_proj.bias", 1, C, 0, 0.0f, 0.0f},
            [LN_2_W] = {"ln_2.weight", 1, C, 0, 1.0f, 0.0f},
            [LN_2_B] = {"ln_2.bias", 1, C, 0, 0.0f, 0.0f},
            [FC_W] = {"mlp.c_fc.weight", 2, C, F, 0.0f, w},
            [FC_B] = {"mlp.c_fc.bias", 1, F, 0, 0.0f, 0.0f},
            [FC_PROJ_W] = {"mlp.c_proj.weight", 2, F, C, 0.0f, proj},
            [FC_PROJ_B] = {"mlp.c_proj.bias", 1, C, 0, 0.0f, 0.0f},
        };
        _Static_assert(sizeof t / sizeof t[0] == LAYER_PARAMS, "one row per layer slot");
        for (size_t i = 0; i < LAYER_PARAMS; i++) {
            snprintf(n, sizeof n, GPT2_PREFIX "h.%" PRId64 ".%s", l, t[i].suffix);
            if ((rc = regc_model_add_2d(m, n, t[i].ndim, t[i].d0, t[i].d1, t[i].center, t[i].hw)) <
                0)
                return rc;
        }
    }
    if ((rc = regc_model_add_2d(m, GPT2_PREFIX "ln_f.weight", 1, C, 0, 1.0f, 0.0f)) < 0 ||
        (rc = regc_model_add_2d(m, GPT2_PREFIX "ln_f.bias", 1, C, 0, 0.0f, 0.0f)) < 0)
        return rc;
    if (!c->tied && (rc = regc_model_add_2d(m, "lm_head.weight", 2, V, C, 0.0f, w)) < 0)
        return rc;
    return REGC_OK;
}

/* Tensor ids below are checked once per call through this macro: every
 * helper returns an id or a negative status with its own message. */
#define G(expr)                                                                                    \
    do {                                                                                           \
        if ((rc = (expr)) < 0)                                                                     \
            goto fail;                                                                             \
    } while (0)

static int gpt2_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out)
{
    const gpt2_config *c = m->cfg;
    if (T > c->n_pos)
        return regc_error(REGC_ERR_ARG,
                          "sequence length %" PRId64 " exceeds n_positions %" PRId64 " of %s", T,
                          c->n_pos, m->source);
    int rc;
    regc_graph *g = regc_graph_new();
    int *p = NULL; /* [n_params] the parameters' tensor ids */
    if (!g)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    int ids, pos, targets, x, h, t, k = 0;
    const int64_t bt[] = {B, T}, tt[] = {T};
    G(ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(pos = regc_graph_add_constant(g, "position_ids", REGC_I32, 1, tt));
    G(targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(regc_model_add_param_tensors(m, g, &p));
    const int wte = p[k++], wpe = p[k++];
    const float eps = (float)c->eps;
    const float scale = (float)(1.0 / sqrt((double)(c->n_embd / c->n_head)));
    const regc_attrs attn = {
        .n_head = (int)c->n_head, .n_kv_head = (int)c->n_head, .causal = 1, .scale = scale};
    G(x = regc_graph_embedding(g, ids, wte)); /* [B, T, C] */
    G(t = regc_graph_embedding(g, pos, wpe)); /* [T, C] */
    G(x = regc_graph_bias_add(g, x, t));      /* [B, T, C] */
    G(regc_model_dropout(m, g, x, x, c->embd_pdrop, &x));
    for (int64_t l = 0; l < c->n_layer; l++) {
        const int *w = &p[k]; /* this layer's parameters, by slot */
        k += LAYER_PARAMS;
        int qkv[3];
        G(h = regc_graph_layernorm(g, x, w[LN_1_W], w[LN_1_B], eps)); /* [B, T, C] */
        G(h = regc_graph_matmul(g, h, w[ATTN_W], 0, 0));              /* [B, T, 3C] */
        G(h = regc_graph_bias_add(g, h, w[ATTN_B]));                  /* [B, T, 3C] */
        G(regc_graph_split(g, h, 3, qkv));                            /* 3 x [B, T, C] */
        G(regc_model_attention(m, g, qkv[0], qkv[1], qkv[2], -1, &attn, c->attn_pdrop,
                               &h));                                  /* [B, T, C] */
        G(h = regc_graph_matmul(g, h, w[ATTN_PROJ_W], 0, 0));         /* [B, T, C] */
        G(h = regc_graph_bias_add(g, h, w[ATTN_PROJ_B]));             /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->resid_pdrop, &h));        /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                               /* [B, T, C] */
        G(h = regc_graph_layernorm(g, x, w[LN_2_W], w[LN_2_B], eps)); /* [B, T, C] */
        G(h = regc_graph_matmul(g, h, w[FC_W], 0, 0));                /* [B, T, n_inner] */
        G(h = regc_graph_bias_add(g, h, w[FC_B]));                    /* [B, T, n_inner] */
        G(h = regc_graph_gelu(g, h));                                 /* [B, T, n_inner] */
        G(h = regc_graph_matmul(g, h, w[FC_PROJ_W], 0, 0));           /* [B, T, C] */
        G(h = regc_graph_bias_add(g, h, w[FC_PROJ_B]));               /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->resid_pdrop, &h));        /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                               /* [B, T, C] */
    }
    const int lnf_w = p[k++], lnf_b = p[k++];
    const int head = c->tied ? wte : p[k++];
    int logits, loss;
    G(x = regc_graph_layernorm(g, x, lnf_w, lnf_b, eps));   /* [B, T, C] */
    G(logits = regc_graph_matmul(g, x, head, 0, 1));        /* [B, T, V] */
    G(loss = regc_graph_cross_entropy(g, logits, targets)); /* [] */
    G(regc_graph_mark_output(g, loss));
    free(p);
    *out = g;
    return REGC_OK;
fail:
    regc_error_prefix("%s: building the gpt2 graph", m->source);
    free(p);
    regc_graph_free(g);
    return rc;
}
#undef G

static cJSON *gpt2_write_config(const regc_model *m)
{
    const gpt2_config *c = m->cfg;
    cJSON *o = regc_model_config_new(m, "GPT2LMHeadModel");
    int ok = o != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    ok = ok && cJSON_AddNumberToObject(o, "n_positions", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, "n_ctx", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, "n_embd", (double)c->n_embd);
    ok = ok && cJSON_AddNumberToObject(o, "n_layer", (double)c->n_layer);
    ok = ok && cJSON_AddNumberToObject(o, "n_head", (double)c->n_head);
    ok = ok && cJSON_AddNumberToObject(o, "n_inner", (double)c->n_inner);
    ok = ok && cJSON_AddStringToObject(o, "activation_function", c->activation);
    ok = ok && cJSON_AddNumberToObject(o, "layer_norm_epsilon", c->eps);
    ok = ok && cJSON_AddNumberToObject(o, "resid_pdrop", c->resid_pdrop);
    ok = ok && cJSON_AddNumberToObject(o, "embd_pdrop", c->embd_pdrop);
    ok = ok && cJSON_AddNumberToObject(o, "attn_pdrop", c->attn_pdrop);
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    ok = ok && cJSON_AddBoolToObject(o, "scale_attn_weights", 1);
    ok = ok && cJSON_AddBoolToObject(o, "scale_attn_by_inverse_layer_idx", 0);
    ok = ok && cJSON_AddBoolToObject(o, "reorder_and_upcast_attn", 0);
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void gpt2_describe(const regc_model *m, char *buf, size_t cap)
{
    const gpt2_config *c = m->cfg;
    char count[40];
    regc_model_group_digits(count, sizeof count, m->total_numel);
    snprintf(buf, cap,
             "gpt2 %s: vocab %" PRId64 ", n_positions %" PRId64 ", n_embd %" PRId64
             ", n_layer %" PRId64 ", n_head %" PRId64 ", n_inner %" PRId64
             ", layer_norm_epsilon %g, %s, %s embeddings, %s parameters%s; dropout resid %g "
             "embd %g attn %g %s",
             m->source, c->vocab, c->n_pos, c->n_embd, c->n_layer, c->n_head, c->n_inner, c->eps,
             c->activation, c->tied ? "tied" : "untied", count, m->weights ? "" : " (shape only)",
             c->resid_pdrop, c->embd_pdrop, c->attn_pdrop, regc_model_dropout_note(m));
}

/* the tied head, and the causal-mask buffers older checkpoints saved */
static const char *const gpt2_ignored[] = {"lm_head.weight", "*.attn.bias", "*.attn.masked_bias",
                                           NULL};

/* config.json's keys (model_load.c checks every key against them) */
static const regc_config_key gpt2_keys[] = {
    {"vocab_size", REGC_KEY_APPLIED, NULL, NULL},
    {"n_positions", REGC_KEY_APPLIED, NULL, NULL},
    {"n_embd", REGC_KEY_APPLIED, NULL, NULL},
    {"n_layer", REGC_KEY_APPLIED, NULL, NULL},
    {"n_head", REGC_KEY_APPLIED, NULL, NULL},
    {"n_inner", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_norm_epsilon", REGC_KEY_APPLIED, NULL, NULL},
    {"activation_function", REGC_KEY_APPLIED, NULL, NULL},
    {"tie_word_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"resid_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {"embd_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {"attn_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {"scale_attn_weights", REGC_KEY_APPLIED, NULL, NULL},
    {"scale_attn_by_inverse_layer_idx", REGC_KEY_APPLIED, NULL, NULL},
    {"reorder_and_upcast_attn", REGC_KEY_APPLIED, NULL, NULL},
    {"add_cross_attention", REGC_KEY_APPLIED, NULL, NULL},
    {"n_ctx", REGC_KEY_INERT, NULL,
     "an older copy of n_positions that Transformers' GPT-2 does not read"},
    {"summary_activation", REGC_KEY_INERT, NULL,
     "GPT2DoubleHeadsModel's summary head, which a causal LM has not"},
    {"summary_first_dropout", REGC_KEY_INERT, NULL,
     "GPT2DoubleHeadsModel's summary head, which a causal LM has not"},
    {"summary_proj_to_labels", REGC_KEY_INERT, NULL,
     "GPT2DoubleHeadsModel's summary head, which a causal LM has not"},
    {"summary_type", REGC_KEY_INERT, NULL,
     "GPT2DoubleHeadsModel's summary head, which a causal LM has not"},
    {"summary_use_proj", REGC_KEY_INERT, NULL,
     "GPT2DoubleHeadsModel's summary head, which a causal LM has not"},
    {"task_specific_params", REGC_KEY_INERT, NULL, "generation settings per task"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key *const gpt2_tables[] = {gpt2_keys, NULL};

const regc_arch regc_arch_gpt2 = {
    .model_type = "gpt2",
    .config_keys = gpt2_tables,
    .peft_targets = "c_attn", /* PEFT's default target_modules */
    .optional_prefix = GPT2_PREFIX,
    .ignored_tensors = gpt2_ignored,
    .preset_config = gpt2_preset_config,
    .parse_config = gpt2_parse_config,
    .list_params = gpt2_list_params,
    .build_graph = gpt2_build_graph,
    .write_config = gpt2_write_config,
    .describe = gpt2_describe,
};
