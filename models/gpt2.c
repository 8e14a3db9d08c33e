/* gpt2.c — the GPT-2 architecture (Hugging Face GPT2LMHeadModel): its
 * layer in the decoder builder's terms (decoder.h: LayerNorms with biases,
 * learned positions, one fused qkv projection, a plain GELU MLP, Conv1D
 * weights stored [in, out], GPT-2's init), its checkpoint names, its own
 * config.json (read, written back, described) and the presets. The graph
 * is decoder_graph.c's, the parameters decoder.c's. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

#define GPT2_PREFIX "transformer."
#define GPT2_MAX_DIM 2147483647 /* ids are i32 and heads are int */

/* A layer's parameters in GPT2LMHeadModel's state-dict order. */
static const int slots_gpt2[] = {S_INPUT_NORM,
                                 S_INPUT_NORM_BIAS,
                                 S_QKV,
                                 S_QKV_BIAS,
                                 S_O,
                                 S_O_BIAS,
                                 S_POST_ATTN_NORM,
                                 S_POST_ATTN_NORM_BIAS,
                                 S_UP,
                                 S_UP_BIAS,
                                 S_DOWN,
                                 S_DOWN_BIAS,
                                 -1};

static const char *const gpt2_slot_suffix[N_SLOTS] = {
    [S_INPUT_NORM] = "ln_1.weight",        [S_INPUT_NORM_BIAS] = "ln_1.bias",
    [S_QKV] = "attn.c_attn.weight", /* q, k, v in one [C, 3C] */
    [S_QKV_BIAS] = "attn.c_attn.bias",     [S_O] = "attn.c_proj.weight",
    [S_O_BIAS] = "attn.c_proj.bias",       [S_POST_ATTN_NORM] = "ln_2.weight",
    [S_POST_ATTN_NORM_BIAS] = "ln_2.bias", [S_UP] = "mlp.c_fc.weight",
    [S_UP_BIAS] = "mlp.c_fc.bias",         [S_DOWN] = "mlp.c_proj.weight",
    [S_DOWN_BIAS] = "mlp.c_proj.bias",
};

static const decoder_names gpt2_names = {.embed = GPT2_PREFIX "wte.weight",
                                         .positions = GPT2_PREFIX "wpe.weight",
                                         .layer = GPT2_PREFIX "h.%" PRId64 ".",
                                         .norm = GPT2_PREFIX "ln_f.weight",
                                         .norm_bias = GPT2_PREFIX "ln_f.bias",
                                         .slot_suffix = gpt2_slot_suffix};

static const decoder_family family_gpt2 = {.architecture = "GPT2LMHeadModel",
                                           .slots = slots_gpt2,
                                           .names = &gpt2_names,
                                           .layernorm = 1,
                                           .learned_positions = 1,
                                           .plain_mlp = 1,
                                           .conv1d = 1,
                                           .scaled_init = 1,
                                           .fused = 1,
                                           .act_default = ACT_GELU_TANH,
                                           .n_pos_key = "n_positions",
                                           .pad_default = -1};

/* GPT-2's constants in the builder's config: every projection has its
 * bias, the tanh GELU, no padding index; the sizes and options are read. */
#define GPT2_CONFIG                                                                                \
    {                                                                                              \
        .family = &family_gpt2, .act = ACT_GELU_TANH, .pad = -1, .attn_bias = 1, .mlp_bias = 1     \
    }

/* c, its sizes and options read, into m's config: q, k and v as many
 * heads each, the activation named as config.json spells it. */
static int gpt2_set_config(regc_model *m, decoder_config *c, const char *activation)
{
    c->n_kv_head = c->n_head;
    c->head_dim = c->hidden / c->n_head;
    snprintf(c->act_name, sizeof c->act_name, "%s", activation);
    return decoder_set_config(m, c, NULL);
}

static int gpt2_preset_config(regc_model *m, const char *preset)
{
    decoder_config c = GPT2_CONFIG;
    c.eps = 1e-5, c.tied = 1;
    c.resid_dropout = c.embed_dropout = c.attn_dropout = 0.1;
    if (strcmp(preset, "gpt2-tiny") == 0)
        c.vocab = 512, c.n_pos = 256, c.hidden = 128, c.n_layer = 4, c.n_head = 4;
    else if (strcmp(preset, "gpt2-124m") == 0)
        c.vocab = 50257, c.n_pos = 1024, c.hidden = 768, c.n_layer = 12, c.n_head = 12;
    else
        return regc_error(REGC_ERR_ARG, "%s: not a gpt2 preset", preset);
    c.inter = 4 * c.hidden;
    return gpt2_set_config(m, &c, "gelu_new");
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
    decoder_config c = GPT2_CONFIG;
    const char *act = NULL;
    int rc;
    if ((rc = regc_cfg_int(root, path, "vocab_size", 1, 0, 1, GPT2_MAX_DIM, &c.vocab)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_positions", 1, 0, 1, GPT2_MAX_DIM, &c.n_pos)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_embd", 1, 0, 1, GPT2_MAX_DIM, &c.hidden)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_layer", 1, 0, 1, GPT2_MAX_DIM, &c.n_layer)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_head", 1, 0, 1, GPT2_MAX_DIM, &c.n_head)) < 0 ||
        (rc = regc_cfg_int(root, path, "n_inner", 0, 4 * c.hidden, 1, 4 * (int64_t)GPT2_MAX_DIM,
                           &c.inter)) < 0 ||
        (rc = regc_cfg_double(root, path, "layer_norm_epsilon", 0, 1e-5, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = regc_cfg_string(root, path, "activation_function", 0, "gelu_new", &act)) < 0 ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, 1, &c.tied)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "resid_pdrop", 0.1, &c.resid_dropout)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "embd_pdrop", 0.1, &c.embed_dropout)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "attn_pdrop", 0.1, &c.attn_dropout)) < 0 ||
        (rc = gpt2_check_unsupported(root, path)) < 0)
        return rc;
    /* Both names denote the tanh approximation, which is what the kernels
     * compute; "gelu" (erf) and the rest would silently differ. */
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"activation_function\" is \"%s\" (supported: gelu_new, "
                          "gelu_pytorch_tanh)",
                          path, act);
    if (c.hidden % c.n_head != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: n_embd %" PRId64 " is not divisible by n_head %" PRId64, path,
                          c.hidden, c.n_head);
    return gpt2_set_config(m, &c, act);
}

static cJSON *gpt2_write_config(const regc_model *m)
{
    const decoder_config *c = m->cfg;
    cJSON *o = regc_model_config_new(m, "GPT2LMHeadModel");
    int ok = o != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    ok = ok && cJSON_AddNumberToObject(o, "n_positions", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, "n_ctx", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, "n_embd", (double)c->hidden);
    ok = ok && cJSON_AddNumberToObject(o, "n_layer", (double)c->n_layer);
    ok = ok && cJSON_AddNumberToObject(o, "n_head", (double)c->n_head);
    ok = ok && cJSON_AddNumberToObject(o, "n_inner", (double)c->inter);
    ok = ok && cJSON_AddStringToObject(o, "activation_function", c->act_name);
    ok = ok && cJSON_AddNumberToObject(o, "layer_norm_epsilon", c->eps);
    ok = ok && cJSON_AddNumberToObject(o, "resid_pdrop", c->resid_dropout);
    ok = ok && cJSON_AddNumberToObject(o, "embd_pdrop", c->embed_dropout);
    ok = ok && cJSON_AddNumberToObject(o, "attn_pdrop", c->attn_dropout);
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
    const decoder_config *c = m->cfg;
    char count[40];
    regc_model_group_digits(count, sizeof count, m->total_numel);
    snprintf(buf, cap,
             "gpt2 %s: vocab %" PRId64 ", n_positions %" PRId64 ", n_embd %" PRId64
             ", n_layer %" PRId64 ", n_head %" PRId64 ", n_inner %" PRId64
             ", layer_norm_epsilon %g, %s, %s embeddings, %s parameters%s; dropout resid %g "
             "embd %g attn %g %s",
             m->source, c->vocab, c->n_pos, c->hidden, c->n_layer, c->n_head, c->inter, c->eps,
             c->act_name, c->tied ? "tied" : "untied", count, m->weights ? "" : " (shape only)",
             c->resid_dropout, c->embed_dropout, c->attn_dropout, regc_model_dropout_note(m));
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
    .family = &family_gpt2,
    .config_keys = gpt2_tables,
    .peft_targets = "c_attn", /* PEFT's default target_modules */
    .optional_prefix = GPT2_PREFIX,
    .ignored_tensors = gpt2_ignored,
    .preset_config = gpt2_preset_config,
    .parse_config = gpt2_parse_config,
    .list_params = decoder_list_params,
    .build_graph = decoder_build_graph,
    .write_config = gpt2_write_config,
    .describe = gpt2_describe,
};
