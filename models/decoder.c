/* decoder.c — the decoder-only families of Hugging Face Transformers that
 * share Llama's layer (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, Olmo2ForCausalLM, Phi3ForCausalLM):
 * one description of the layer whose variations a family fixes or
 * config.json chooses, its parameters in checkpoint order, the presets,
 * the flat forward graph and its rotary tables.
 *
 * The layer, x [B, T, C] in and out:
 *     h = x                          (norm_after: OLMo 2)
 *     h = rmsnorm(x)                 (otherwise: input_layernorm)
 *     q, k, v = h Wq + bq, h Wk + bk, h Wv + bv   (fused: one qkv_proj, sliced)
 *     q, k = qk_norm(q), qk_norm(k)  (Qwen 3 per head; OLMo 2 over the whole projection)
 *     q, k = rope(q), rope(k)
 *     a = attention(q, k, v) Wo + bo
 *     x = x + a                      (norm_after: x + rmsnorm(a))
 *     m = down(silu(gate(h')) * up(h'))   (fused: one gate_up_proj, halved)
 *     x = x + m                      (likewise; h' = rmsnorm(x) before the MLP
 *                                     unless norm_after)
 * then the final rmsnorm, the head (tied or not) and the cross-entropy.
 * Where a family reads a key (attention_bias, mlp_bias, sliding_window,
 * layer_types, ...) the table of its keys says so (decoder_keys_*), and
 * model_load.c refuses every key no table knows. The graph is flat: layer
 * structure is left for detect/ to discover from the ops alone.
 *
 * Sliding windows. Transformers masks key j from query i when
 * i - j >= sliding_window on a sliding layer, which changes nothing while
 * T <= sliding_window; regc's attention has no window, so a longer
 * sequence is refused by name (decoder_build_graph) rather than trained
 * with the whole context. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define DECODER_MAX_DIM 2147483647 /* ids are i32 and heads are int */

/* One layer's parameter slots; a family lists the ones it may have in its
 * checkpoint order, and the config decides which optional ones exist. */
enum {
    S_Q,
    S_Q_BIAS,
    S_K,
    S_K_BIAS,
    S_V,
    S_V_BIAS,
    S_QKV, /* Phi-3: [q; k; v] in one projection */
    S_O,
    S_O_BIAS,
    S_Q_NORM,
    S_K_NORM,
    S_GATE,
    S_GATE_BIAS,
    S_UP,
    S_UP_BIAS,
    S_GATE_UP, /* Phi-3: [gate; up] in one projection */
    S_DOWN,
    S_DOWN_BIAS,
    S_INPUT_NORM,
    S_POST_ATTN_NORM,
    S_POST_FF_NORM,
    N_SLOTS
};

static const char *const slot_suffix[N_SLOTS] = {
    [S_Q] = "self_attn.q_proj.weight",
    [S_Q_BIAS] = "self_attn.q_proj.bias",
    [S_K] = "self_attn.k_proj.weight",
    [S_K_BIAS] = "self_attn.k_proj.bias",
    [S_V] = "self_attn.v_proj.weight",
    [S_V_BIAS] = "self_attn.v_proj.bias",
    [S_QKV] = "self_attn.qkv_proj.weight",
    [S_O] = "self_attn.o_proj.weight",
    [S_O_BIAS] = "self_attn.o_proj.bias",
    [S_Q_NORM] = "self_attn.q_norm.weight",
    [S_K_NORM] = "self_attn.k_norm.weight",
    [S_GATE] = "mlp.gate_proj.weight",
    [S_GATE_BIAS] = "mlp.gate_proj.bias",
    [S_UP] = "mlp.up_proj.weight",
    [S_UP_BIAS] = "mlp.up_proj.bias",
    [S_GATE_UP] = "mlp.gate_up_proj.weight",
    [S_DOWN] = "mlp.down_proj.weight",
    [S_DOWN_BIAS] = "mlp.down_proj.bias",
    [S_INPUT_NORM] = "input_layernorm.weight",
    [S_POST_ATTN_NORM] = "post_attention_layernorm.weight",
    [S_POST_FF_NORM] = "post_feedforward_layernorm.weight",
};

typedef enum { QK_NORM_NONE, QK_NORM_HEAD, QK_NORM_WHOLE } qk_norm_kind;
/* how a family reads its sliding windows */
typedef enum {
    WINDOW_NONE,   /* no window (Llama, OLMo 2) */
    WINDOW_ALL,    /* sliding_window, when set, on every layer (Mistral, Phi-3) */
    WINDOW_LAYERS, /* layer_types, or use_sliding_window and max_window_layers (Qwen) */
} window_kind;

typedef struct {
    const char *architecture; /* config.json's "architectures" */
    const int *slots;         /* its layer's possible slots, checkpoint order, -1 ends */
    qk_norm_kind qk_norm;
    int norm_after; /* the norms follow attention and the MLP; no input norm */
    int fused;      /* qkv_proj and gate_up_proj */
    int qkv_bias;   /* q, k and v always have biases (Qwen 2) */
    int bias_key;   /* attention_bias adds biases to q, k, v and o */
    int mlp_bias_key;
    int resid_dropout; /* resid_pdrop after attention and the MLP (Phi-3) */
    window_kind window;
    int64_t pad_default; /* pad_token_id when config.json has none; -1: none */
} decoder_family;

static const int slots_llama[] = {
    S_Q,      S_Q_BIAS,    S_K,          S_K_BIAS,         S_V,         S_V_BIAS, S_O,
    S_O_BIAS, S_Q_NORM,    S_K_NORM,     S_GATE,           S_GATE_BIAS, S_UP,     S_UP_BIAS,
    S_DOWN,   S_DOWN_BIAS, S_INPUT_NORM, S_POST_ATTN_NORM, -1};
static const int slots_olmo2[] = {S_Q,
                                  S_Q_BIAS,
                                  S_K,
                                  S_K_BIAS,
                                  S_V,
                                  S_V_BIAS,
                                  S_O,
                                  S_O_BIAS,
                                  S_Q_NORM,
                                  S_K_NORM,
                                  S_GATE,
                                  S_GATE_BIAS,
                                  S_UP,
                                  S_UP_BIAS,
                                  S_DOWN,
                                  S_DOWN_BIAS,
                                  S_POST_ATTN_NORM,
                                  S_POST_FF_NORM,
                                  -1};
/* Phi3Attention defines o_proj before qkv_proj */
static const int slots_phi3[] = {S_O, S_QKV, S_GATE_UP, S_DOWN, S_INPUT_NORM, S_POST_ATTN_NORM, -1};

static const decoder_family family_llama = {.architecture = "LlamaForCausalLM",
                                            .slots = slots_llama,
                                            .bias_key = 1,
                                            .mlp_bias_key = 1,
                                            .pad_default = -1};
static const decoder_family family_mistral = {.architecture = "MistralForCausalLM",
                                              .slots = slots_llama,
                                              .window = WINDOW_ALL,
                                              .pad_default = -1};
static const decoder_family family_qwen2 = {.architecture = "Qwen2ForCausalLM",
                                            .slots = slots_llama,
                                            .qkv_bias = 1,
                                            .window = WINDOW_LAYERS,
                                            .pad_default = -1};
static const decoder_family family_qwen3 = {.architecture = "Qwen3ForCausalLM",
                                            .slots = slots_llama,
                                            .qk_norm = QK_NORM_HEAD,
                                            .bias_key = 1,
                                            .window = WINDOW_LAYERS,
                                            .pad_default = -1};
static const decoder_family family_olmo2 = {.architecture = "Olmo2ForCausalLM",
                                            .slots = slots_olmo2,
                                            .qk_norm = QK_NORM_WHOLE,
                                            .norm_after = 1,
                                            .bias_key = 1,
                                            .pad_default = 1};
static const decoder_family family_phi3 = {.architecture = "Phi3ForCausalLM",
                                           .slots = slots_phi3,
                                           .fused = 1,
                                           .resid_dropout = 1,
                                           .window = WINDOW_ALL,
                                           .pad_default = 32000};

typedef struct {
    const decoder_family *family;
    int64_t vocab, hidden, inter, n_layer, n_head, n_kv_head, head_dim, n_pos;
    double eps, attn_dropout, resid_dropout;
    regc_rope rope; /* rope_theta and its scaling (rope.c) */
    int tied;
    int64_t pad;             /* pad_token_id: the embedding row that takes no gradient; -1: none */
    int attn_bias, mlp_bias; /* attention_bias (q, k, v, o), mlp_bias (gate, up, down) */
    int use_sliding_window;  /* Qwen's switch, written back as read */
    int64_t max_window_layers;
    int64_t window;          /* sliding_window; 0: none */
    int n_slots;             /* the layer's parameters */
    int slot_at[N_SLOTS];    /* a slot's index among them, or -1 */
    unsigned char sliding[]; /* [n_layer] the layer slides (its window is `window`) */
} decoder_config;

/* ---- config.json's keys (model_load.c checks every key against these
 * tables and those every architecture shares before parse_config) */
static const regc_config_key keys_decoder[] = {
    {"vocab_size", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_size", REGC_KEY_APPLIED, NULL, NULL},
    {"intermediate_size", REGC_KEY_APPLIED, NULL, NULL},
    {"num_hidden_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"num_attention_heads", REGC_KEY_APPLIED, NULL, NULL},
    {"num_key_value_heads", REGC_KEY_APPLIED, NULL, NULL},
    {"head_dim", REGC_KEY_APPLIED, NULL, NULL},
    {"max_position_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"rms_norm_eps", REGC_KEY_APPLIED, NULL, NULL},
    {"rope_parameters", REGC_KEY_APPLIED, NULL, NULL},
    {"rope_theta", REGC_KEY_APPLIED, NULL, NULL},
    {"rope_scaling", REGC_KEY_APPLIED, NULL, NULL},
    {"partial_rotary_factor", REGC_KEY_APPLIED, NULL, NULL}, /* rope.c: 1 or refused */
    {"tie_word_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_act", REGC_KEY_APPLIED, NULL, NULL},
    {"attention_dropout", REGC_KEY_APPLIED, NULL, NULL},
    {"pad_token_id", REGC_KEY_APPLIED, NULL, NULL}, /* the embedding's padding_idx */
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_attention_bias[] = {
    {"attention_bias", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_llama[] = {
    {"mlp_bias", REGC_KEY_APPLIED, NULL, NULL},
    {"pretraining_tp", REGC_KEY_INERT, NULL,
     "Transformers 5's LlamaForCausalLM does not read it (it only split the projections' "
     "products in pre-training)"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_window[] = {
    {"sliding_window", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
/* Qwen's: sliding_window (keys_window) gated, and placed by layer */
static const regc_config_key keys_qwen_windows[] = {
    {"use_sliding_window", REGC_KEY_APPLIED, NULL, NULL},
    {"max_window_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_types", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_phi3[] = {
    {"resid_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {"embd_pdrop", REGC_KEY_INERT, NULL, "Transformers 5's Phi3Model never applies it"},
    {"original_max_position_embeddings", REGC_KEY_INERT, NULL,
     "only longrope scaling reads it, and rope.c refuses longrope"},
    {NULL, 0, NULL, NULL},
};

static int decoder_set_config(regc_model *m, const decoder_config *c, const unsigned char *sliding)
{
    decoder_config *copy = malloc(sizeof *copy + (size_t)c->n_layer);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    *copy = *c;
    for (int64_t l = 0; l < c->n_layer; l++)
        copy->sliding[l] = sliding ? sliding[l] : (c->window > 0);
    /* the layer's slots: the family's, less the optional ones the config leaves out */
    copy->n_slots = 0;
    for (int s = 0; s < N_SLOTS; s++)
        copy->slot_at[s] = -1;
    for (const int *s = c->family->slots; *s >= 0; s++) {
        int present = 1;
        if (*s == S_Q_BIAS || *s == S_K_BIAS || *s == S_V_BIAS)
            present = c->family->qkv_bias || c->attn_bias;
        else if (*s == S_O_BIAS)
            present = c->attn_bias;
        else if (*s == S_GATE_BIAS || *s == S_UP_BIAS || *s == S_DOWN_BIAS)
            present = c->mlp_bias;
        else if (*s == S_Q_NORM || *s == S_K_NORM)
            present = c->family->qk_norm != QK_NORM_NONE;
        if (present)
            copy->slot_at[*s] = copy->n_slots++;
    }
    m->cfg = copy;
    m->vocab = c->vocab;
    m->max_seq = c->n_pos;
    return REGC_OK;
}

static int llama_preset_config(regc_model *m, const char *preset)
{
    decoder_config c = {.family = &family_llama,
                        .pad = -1,
                        .eps = 1e-5,
                        .rope.theta = 500000.0,
                        .n_pos = 8192,
                        .vocab = 128256,
                        .n_kv_head = 8};
    if (strcmp(preset, "llama-tiny") == 0) {
        c.vocab = 512, c.hidden = 128, c.inter = 344, c.n_layer = 4, c.n_head = 4;
        c.n_kv_head = 2, c.n_pos = 256, c.eps = 1e-6, c.rope.theta = 10000.0;
    } else if (strcmp(preset, "llama-127m") == 0) {
        /* llama-tiny's shape (grouped-query attention, two query heads per
         * key/value head; SwiGLU; an untied head) at GPT-2 124M's width
         * and depth: the benchmarks' Llama beside gpt2-124m */
        c.vocab = 32000, c.hidden = 768, c.inter = 2048, c.n_layer = 12, c.n_head = 12;
        c.n_kv_head = 6, c.n_pos = 1024, c.eps = 1e-6, c.rope.theta = 10000.0;
    } else if (strcmp(preset, "llama-8b") == 0) {
        /* Llama 3.1 8B's published shape and context (its RoPE plain, at
         * θ 500000: the presets are for shapes) */
        c.hidden = 4096, c.inter = 14336, c.n_layer = 32, c.n_head = 32, c.n_pos = 131072;
    } else if (strcmp(preset, "llama-70b") == 0) {
        /* Llama 3.1 70B's, likewise */
        c.hidden = 8192, c.inter = 28672, c.n_layer = 80, c.n_head = 64, c.n_pos = 131072;
    } else {
        return regc_error(REGC_ERR_ARG, "%s: not a llama preset", preset);
    }
    c.head_dim = c.hidden / c.n_head;
    return decoder_set_config(m, &c, NULL);
}

/* The family a model_type names (its regc_arch's description). */
static const decoder_family *family_of(const regc_model *m) { return m->arch->family; }

/* The sliding windows: which layers slide, and by how much (0: none). */
static int decoder_parse_windows(const cJSON *root, const char *path, decoder_config *c,
                                 unsigned char *sliding)
{
    int rc;
    memset(sliding, 0, (size_t)c->n_layer);
    if (c->family->window == WINDOW_NONE)
        return REGC_OK;
    if ((rc = regc_cfg_int(root, path, "sliding_window", 0, 0, 1, INT64_MAX, &c->window)) < 0)
        return rc;
    if (c->family->window == WINDOW_ALL) {
        memset(sliding, c->window > 0, (size_t)c->n_layer);
        return REGC_OK;
    }
    /* Qwen: use_sliding_window gates the window; layer_types, or else the
     * layers from max_window_layers on, say which layers slide */
    if ((rc = regc_cfg_bool(root, path, "use_sliding_window", 0, 0, &c->use_sliding_window)) < 0 ||
        (rc = regc_cfg_int(root, path, "max_window_layers", 0, 28, 0, INT64_MAX,
                           &c->max_window_layers)) < 0)
        return rc;
    if (!c->use_sliding_window)
        c->window = 0;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!types || cJSON_IsNull(types)) {
        for (int64_t l = c->max_window_layers; c->window > 0 && l < c->n_layer; l++)
            sliding[l] = 1;
        return REGC_OK;
    }
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layer)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"layer_types\" must be a list of num_hidden_layers (%" PRId64
                          ") strings",
                          path, c->n_layer);
    int64_t l = 0;
    for (const cJSON *t = types->child; t; t = t->next, l++) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "";
        if (strcmp(s, "sliding_attention") != 0 && strcmp(s, "full_attention") != 0)
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: key \"layer_types\" entry %" PRId64
                              " is not \"full_attention\" or \"sliding_attention\"",
                              path, l);
        sliding[l] = c->window > 0 && s[0] == 's';
    }
    return REGC_OK;
}

static int decoder_parse_biases(const cJSON *root, const char *path, decoder_config *c)
{
    int rc;
    if (c->family->bias_key &&
        (rc = regc_cfg_bool(root, path, "attention_bias", 0, 0, &c->attn_bias)) < 0)
        return rc;
    if (c->family->mlp_bias_key &&
        (rc = regc_cfg_bool(root, path, "mlp_bias", 0, 0, &c->mlp_bias)) < 0)
        return rc;
    return REGC_OK;
}

/* pad_token_id: Transformers makes it the embedding's padding_idx, whose
 * row takes no gradient; null means none, absent the family's default. */
static int decoder_parse_pad(const cJSON *root, const char *path, decoder_config *c)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "pad_token_id");
    c->pad = -1;
    if (it && cJSON_IsNull(it))
        return REGC_OK;
    int rc =
        regc_cfg_int(root, path, "pad_token_id", 0, c->family->pad_default, -1, INT64_MAX, &c->pad);
    if (rc < 0)
        return rc;
    if (c->pad >= c->vocab)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"pad_token_id\" is %" PRId64 "%s, not below vocab_size %" PRId64
                          " (Transformers' embedding refuses it too; give it explicitly, or null)",
                          path, c->pad, it ? "" : " (the family's default)", c->vocab);
    return REGC_OK;
}

static int decoder_parse_config(regc_model *m, const cJSON *root, const char *path)
{
    decoder_config c = {.family = family_of(m)};
    int rc;
    if ((rc = regc_cfg_int(root, path, "vocab_size", 1, 0, 1, DECODER_MAX_DIM, &c.vocab)) < 0 ||
        (rc = regc_cfg_int(root, path, "hidden_size", 1, 0, 1, DECODER_MAX_DIM, &c.hidden)) < 0 ||
        (rc = regc_cfg_int(root, path, "intermediate_size", 1, 0, 1, DECODER_MAX_DIM, &c.inter)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_hidden_layers", 1, 0, 1, DECODER_MAX_DIM, &c.n_layer)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_attention_heads", 1, 0, 1, DECODER_MAX_DIM,
                           &c.n_head)) < 0 ||
        (rc = regc_cfg_int(root, path, "num_key_value_heads", 0, c.n_head, 1, DECODER_MAX_DIM,
                           &c.n_kv_head)) < 0)
        return rc;
    /* HF derives head_dim when it is absent; a hidden size the heads do not
     * divide would then drop columns, so that needs an explicit head_dim. */
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if ((!hd || cJSON_IsNull(hd)) && c.hidden % c.n_head != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: hidden_size %" PRId64 " is not divisible by num_attention_heads "
                          "%" PRId64 " (give \"head_dim\" explicitly)",
                          path, c.hidden, c.n_head);
    const char *act = NULL;
    if ((rc = regc_cfg_int(root, path, "head_dim", 0, c.hidden / c.n_head, 1, DECODER_MAX_DIM,
                           &c.head_dim)) < 0 ||
        (rc = regc_cfg_int(root, path, "max_position_embeddings", 0, 2048, 1, DECODER_MAX_DIM,
                           &c.n_pos)) < 0 ||
        (rc = regc_cfg_double(root, path, "rms_norm_eps", 0, 1e-6, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = regc_rope_parse(root, path, c.n_pos, &c.rope)) < 0 ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, 0, &c.tied)) < 0 ||
        (rc = regc_cfg_double(root, path, "attention_dropout", 0, 0.0, 0.0, 1.0, &c.attn_dropout)) <
            0 ||
        (rc = regc_cfg_string(root, path, "hidden_act", 0, "silu", &act)) < 0 ||
        (rc = decoder_parse_biases(root, path, &c)) < 0 ||
        (rc = decoder_parse_pad(root, path, &c)) < 0)
        return rc;
    if (c.family->resid_dropout &&
        (rc = regc_cfg_double(root, path, "resid_pdrop", 0, 0.0, 0.0, 1.0, &c.resid_dropout)) < 0)
        return rc;
    /* The SwiGLU gate is what the graph builds; any other activation
     * would silently train a different model. */
    if (strcmp(act, "silu") != 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"hidden_act\" is \"%s\" (supported: silu)", path, act);
    if (c.n_head % c.n_kv_head != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"num_key_value_heads\" is %" PRId64
                          ", which does not divide num_attention_heads %" PRId64,
                          path, c.n_kv_head, c.n_head);
    /* RoPE rotates the two halves of each head against each other. */
    if (c.head_dim % 2 != 0)
        return regc_error(REGC_ERR_FORMAT, "%s: key \"head_dim\" is %" PRId64 ", must be even",
                          path, c.head_dim);
    if ((float)c.eps <= 0.0f)
        return regc_error(REGC_ERR_FORMAT, "%s: key \"rms_norm_eps\" is %g, must be positive", path,
                          c.eps);
    if (c.n_head * c.head_dim + 2 * c.n_kv_head * c.head_dim > DECODER_MAX_DIM ||
        2 * c.inter > DECODER_MAX_DIM)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: the projections (num_attention_heads * head_dim, "
                          "intermediate_size) are too large",
                          path);
    unsigned char *sliding = malloc((size_t)c.n_layer);
    if (!sliding)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    rc = decoder_parse_windows(root, path, &c, sliding);
    if (rc == REGC_OK)
        rc = decoder_set_config(m, &c, sliding);
    free(sliding);
    return rc;
}

/* A slot's shape and random init (HF's: normal with std
 * initializer_range = 0.02 for every weight, as uniform draws of the same
 * std; biases zero; norm weights one). */
static void slot_shape(const decoder_config *c, int s, int *ndim, int64_t *d, float *center,
                       float *halfwidth)
{
    const int64_t C = c->hidden, F = c->inter;
    const int64_t QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim;
    const int head_norm = c->family->qk_norm == QK_NORM_HEAD;
    const int64_t out[N_SLOTS] = {
        [S_Q] = QD,
        [S_Q_BIAS] = QD,
        [S_K] = KD,
        [S_K_BIAS] = KD,
        [S_V] = KD,
        [S_V_BIAS] = KD,
        [S_QKV] = QD + 2 * KD,
        [S_O] = C,
        [S_O_BIAS] = C,
        [S_Q_NORM] = head_norm ? c->head_dim : QD,
        [S_K_NORM] = head_norm ? c->head_dim : KD,
        [S_GATE] = F,
        [S_GATE_BIAS] = F,
        [S_UP] = F,
        [S_UP_BIAS] = F,
        [S_GATE_UP] = 2 * F,
        [S_DOWN] = C,
        [S_DOWN_BIAS] = C,
        [S_INPUT_NORM] = C,
        [S_POST_ATTN_NORM] = C,
        [S_POST_FF_NORM] = C,
    };
    const int is_weight = s == S_Q || s == S_K || s == S_V || s == S_QKV || s == S_O ||
                          s == S_GATE || s == S_UP || s == S_GATE_UP || s == S_DOWN;
    const int is_norm = s == S_Q_NORM || s == S_K_NORM || s == S_INPUT_NORM ||
                        s == S_POST_ATTN_NORM || s == S_POST_FF_NORM;
    d[0] = out[s];
    /* nn.Linear weights are stored [out, in] */
    d[1] = !is_weight ? 0 : s == S_O ? QD : s == S_DOWN ? F : C;
    *ndim = is_weight ? 2 : 1;
    *center = is_norm ? 1.0f : 0.0f;
    *halfwidth = is_weight ? (float)(0.02 * sqrt(3.0)) : 0.0f;
}

/* The checkpoint order of the family's state dict. */
static int decoder_list_params(regc_model *m)
{
    const decoder_config *c = m->cfg;
    const int64_t C = c->hidden, V = c->vocab;
    const float w = (float)(0.02 * sqrt(3.0));
    char n[160];
    int rc;
    if ((rc = regc_model_add_2d(m, "model.embed_tokens.weight", 2, V, C, 0.0f, w)) < 0)
        return rc;
    for (int64_t l = 0; l < c->n_layer; l++) {
        for (const int *s = c->family->slots; *s >= 0; s++) {
            if (c->slot_at[*s] < 0)
                continue;
            int ndim;
            int64_t d[2];
            float center, hw;
            slot_shape(c, *s, &ndim, d, &center, &hw);
            snprintf(n, sizeof n, "model.layers.%" PRId64 ".%s", l, slot_suffix[*s]);
            if ((rc = regc_model_add_2d(m, n, ndim, d[0], d[1], center, hw)) < 0)
                return rc;
        }
    }
    if ((rc = regc_model_add_2d(m, "model.norm.weight", 1, C, 0, 1.0f, 0.0f)) < 0)
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

/* x W^T (+ b): an nn.Linear, its bias a parameter id or -1. */
static int decoder_linear(regc_graph *g, int x, int w, int b)
{
    int y = regc_graph_matmul(g, x, w, 0, 1);
    return y < 0 || b < 0 ? y : regc_graph_bias_add(g, y, b);
}

/* Qwen 3's q/k norm: RMSNorm over each head's D values, weight [D]. */
static int decoder_head_norm(regc_graph *g, int x, int w, int64_t B, int64_t T, int64_t heads,
                             int64_t D, float eps)
{
    const int64_t split[] = {B, T, heads, D}, whole[] = {B, T, heads * D};
    int rc, y;
    if ((rc = y = regc_graph_reshape(g, x, 4, split)) < 0 || /* [B, T, heads, D] */
        (rc = y = regc_graph_rmsnorm(g, y, w, eps)) < 0)     /* [B, T, heads, D] */
        return rc;
    return regc_graph_reshape(g, y, 3, whole); /* [B, T, heads*D] */
}

static int decoder_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out)
{
    const decoder_config *c = m->cfg;
    const decoder_family *f = c->family;
    if (T > c->n_pos)
        return regc_error(REGC_ERR_ARG,
                          "sequence length %" PRId64 " exceeds max_position_embeddings %" PRId64
                          " of %s",
                          T, c->n_pos, m->source);
    for (int64_t l = 0; l < c->n_layer; l++)
        if (c->sliding[l] && T > c->window)
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: sequence length %" PRId64
                              " exceeds key \"sliding_window\" %" PRId64 " (layer %" PRId64
                              " slides; regc's attention has no window): "
                              "train at most %" PRId64 " tokens",
                              m->source, T, c->window, l, c->window);
    int rc0 = regc_model_dropout_unapplied(m, "attention_dropout", c->attn_dropout);
    if (rc0)
        return rc0;
    regc_graph *g = regc_graph_new();
    int *p = NULL; /* [n_params] the parameters' tensor ids */
    if (!g)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    const int H = (int)c->n_head, Hkv = (int)c->n_kv_head;
    const int64_t D = c->head_dim, QD = H * D, KD = Hkv * D, F = c->inter;
    int rc, ids, targets, cos, sin, x, h, q, k, v, u, n = 0;
    const int64_t bt[] = {B, T}, rot[] = {T, D / 2};
    G(ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    /* One rotary table for every layer, filled per batch (decoder_fill_inputs). */
    G(cos = regc_graph_add_constant(g, "rope_cos", REGC_F32, 2, rot));
    G(sin = regc_graph_add_constant(g, "rope_sin", REGC_F32, 2, rot));
    G(regc_model_add_param_tensors(m, g, &p));
    const int embed = p[n++];
    const float eps = (float)c->eps;
    const float scale = (float)(1.0 / sqrt((double)D));
    if (c->pad >= 0)
        G(x = regc_graph_embedding_padded(g, ids, embed, c->pad)); /* [B, T, C] */
    else
        G(x = regc_graph_embedding(g, ids, embed)); /* [B, T, C] */
    for (int64_t l = 0; l < c->n_layer; l++) {
        int w[N_SLOTS]; /* this layer's parameters by slot, -1 where absent */
        for (int s = 0; s < N_SLOTS; s++)
            w[s] = c->slot_at[s] < 0 ? -1 : p[n + c->slot_at[s]];
        n += c->n_slots;
        /* attention */
        if (f->norm_after)
            h = x;
        else
            G(h = regc_graph_rmsnorm(g, x, w[S_INPUT_NORM], eps)); /* [B, T, C] */
        if (f->fused) {
            G(u = regc_graph_matmul(g, h, w[S_QKV], 0, 1)); /* [B, T, QD + 2 KD] */
            G(q = regc_graph_slice(g, u, 2, 0, QD));        /* [B, T, QD] */
            G(k = regc_graph_slice(g, u, 2, QD, KD));       /* [B, T, KD] */
            G(v = regc_graph_slice(g, u, 2, QD + KD, KD));  /* [B, T, KD] */
        } else {
            G(q = decoder_linear(g, h, w[S_Q], w[S_Q_BIAS])); /* [B, T, QD] */
            G(k = decoder_linear(g, h, w[S_K], w[S_K_BIAS])); /* [B, T, KD] */
            G(v = decoder_linear(g, h, w[S_V], w[S_V_BIAS])); /* [B, T, KD] */
        }
        if (f->qk_norm == QK_NORM_WHOLE) {
            G(q = regc_graph_rmsnorm(g, q, w[S_Q_NORM], eps)); /* [B, T, QD] */
            G(k = regc_graph_rmsnorm(g, k, w[S_K_NORM], eps)); /* [B, T, KD] */
        } else if (f->qk_norm == QK_NORM_HEAD) {
            G(q = decoder_head_norm(g, q, w[S_Q_NORM], B, T, H, D, eps));   /* [B, T, QD] */
            G(k = decoder_head_norm(g, k, w[S_K_NORM], B, T, Hkv, D, eps)); /* [B, T, KD] */
        }
        G(q = regc_graph_rope(g, q, cos, sin, H));                 /* [B, T, QD] */
        G(k = regc_graph_rope(g, k, cos, sin, Hkv));               /* [B, T, KD] */
        G(h = regc_graph_attention(g, q, k, v, H, Hkv, 1, scale)); /* [B, T, QD] */
        G(h = decoder_linear(g, h, w[S_O], w[S_O_BIAS]));          /* [B, T, C] */
        if (f->norm_after)
            G(h = regc_graph_rmsnorm(g, h, w[S_POST_ATTN_NORM], eps)); /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->resid_dropout, &h));       /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                                /* [B, T, C] */
        /* the MLP (SwiGLU) */
        if (f->norm_after)
            h = x;
        else
            G(h = regc_graph_rmsnorm(g, x, w[S_POST_ATTN_NORM], eps)); /* [B, T, C] */
        if (f->fused) {
            G(h = regc_graph_matmul(g, h, w[S_GATE_UP], 0, 1)); /* [B, T, 2F] */
            G(u = regc_graph_slice(g, h, 2, 0, F));             /* [B, T, F] gate */
            G(u = regc_graph_silu(g, u));                       /* [B, T, F] */
            G(h = regc_graph_slice(g, h, 2, F, F));             /* [B, T, F] up */
        } else {
            G(u = decoder_linear(g, h, w[S_GATE], w[S_GATE_BIAS])); /* [B, T, F] */
            G(u = regc_graph_silu(g, u));                           /* [B, T, F] */
            G(h = decoder_linear(g, h, w[S_UP], w[S_UP_BIAS]));     /* [B, T, F] */
        }
        G(h = regc_graph_mul(g, u, h));                         /* [B, T, F] */
        G(h = decoder_linear(g, h, w[S_DOWN], w[S_DOWN_BIAS])); /* [B, T, C] */
        if (f->norm_after)
            G(h = regc_graph_rmsnorm(g, h, w[S_POST_FF_NORM], eps)); /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->resid_dropout, &h));     /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                              /* [B, T, C] */
    }
    const int norm = p[n++];
    const int head = c->tied ? embed : p[n++];
    int logits, loss;
    G(x = regc_graph_rmsnorm(g, x, norm, eps));             /* [B, T, C] */
    G(logits = regc_graph_matmul(g, x, head, 0, 1));        /* [B, T, V] */
    G(loss = regc_graph_cross_entropy(g, logits, targets)); /* [] */
    G(regc_graph_mark_output(g, loss));
    free(p);
    *out = g;
    return REGC_OK;
fail:
    regc_error_prefix("%s: building the %s graph", m->source, m->arch->model_type);
    free(p);
    regc_graph_free(g);
    return rc;
}
#undef G

static int64_t decoder_compute_rope(const regc_model *m, float *inv_freq, int64_t n, float *scaling)
{
    const decoder_config *c = m->cfg;
    if (inv_freq)
        regc_rope_inv_freq(&c->rope, c->head_dim, inv_freq, scaling);
    (void)n;
    return c->head_dim / 2;
}

/* The rotary tables [T, D/2], rounded exactly as HF's LlamaRotaryEmbedding
 * rounds them: inv_freq as Transformers' initialiser for the rope_type
 * computes it (rope.c), the angle t * inv_freq in float32 (HF computes
 * them in float32 whatever the model's dtype), so long positions see the
 * same angle error as the checkpoint was trained with; then cos and sin
 * times the attention scaling (yarn's; 1 otherwise), in float32. */
static int decoder_fill_inputs(const regc_model *m, const regc_tokens *data,
                               const regc_batch_spec *b, int n, regc_input *in)
{
    const decoder_config *c = m->cfg;
    int rc = regc_model_fill_lm_inputs(m, data, b, n, in);
    if (rc < 0)
        return rc;
    regc_input *cos = regc_input_find(n, in, "rope_cos");
    regc_input *sin = regc_input_find(n, in, "rope_sin");
    if ((!cos || cos->filled) && (!sin || sin->filled))
        return REGC_OK; /* absent, or filled for an earlier batch */
    const int64_t half = c->head_dim / 2, numel = b->seq * half;
    const regc_input *tabs[2] = {cos, sin};
    for (int i = 0; i < 2; i++)
        if (tabs[i] &&
            (tabs[i]->tensor->dtype != REGC_F32 || regc_tensor_numel(tabs[i]->tensor) != numel))
            return regc_error(REGC_ERR_SHAPE,
                              "%s: graph input %s must be f32 [%" PRId64 ", %" PRId64 "]",
                              m->source, tabs[i]->tensor->name, b->seq, half);
    float *inv_freq = malloc((size_t)half * sizeof *inv_freq + 1);
    if (!inv_freq)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for the rotary tables", m->source);
    float scaling;
    regc_rope_inv_freq(&c->rope, c->head_dim, inv_freq, &scaling);
    float *cs = cos ? cos->host : NULL, *sn = sin ? sin->host : NULL;
    for (int64_t t = 0; t < b->seq; t++) {
        for (int64_t j = 0; j < half; j++) {
            const float angle = (float)t * inv_freq[j];
            if (cs)
                cs[t * half + j] = cosf(angle) * scaling;
            if (sn)
                sn[t * half + j] = sinf(angle) * scaling;
        }
    }
    free(inv_freq);
    if (cos)
        cos->filled = cos->constant = 1;
    if (sin)
        sin->filled = sin->constant = 1;
    return REGC_OK;
}

static cJSON *decoder_write_config(const regc_model *m)
{
    const decoder_config *c = m->cfg;
    const decoder_family *f = c->family;
    cJSON *o = regc_model_config_new(m, f->architecture);
    int ok = o != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    ok = ok && cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden);
    ok = ok && cJSON_AddNumberToObject(o, "intermediate_size", (double)c->inter);
    ok = ok && cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->n_layer);
    ok = ok && cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->n_head);
    ok = ok && cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->n_kv_head);
    ok = ok && cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
    ok = ok && cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, "rms_norm_eps", c->eps);
    ok = ok && regc_rope_write_config(&c->rope, o);
    ok = ok && cJSON_AddStringToObject(o, "hidden_act", "silu");
    if (f->bias_key)
        ok = ok && cJSON_AddBoolToObject(o, "attention_bias", c->attn_bias);
    if (f->mlp_bias_key)
        ok = ok && cJSON_AddBoolToObject(o, "mlp_bias", c->mlp_bias);
    if (f->resid_dropout)
        ok = ok && cJSON_AddNumberToObject(o, "resid_pdrop", c->resid_dropout);
    if (f->window == WINDOW_ALL)
        ok = ok && (c->window > 0 ? cJSON_AddNumberToObject(o, "sliding_window", (double)c->window)
                                  : cJSON_AddNullToObject(o, "sliding_window"));
    if (f->window == WINDOW_LAYERS) {
        /* the window as read, and which layers slide, spelled as Transformers 5 does */
        ok = ok && cJSON_AddBoolToObject(o, "use_sliding_window", c->use_sliding_window);
        ok = ok && (c->window > 0 ? cJSON_AddNumberToObject(o, "sliding_window", (double)c->window)
                                  : cJSON_AddNullToObject(o, "sliding_window"));
        ok = ok && cJSON_AddNumberToObject(o, "max_window_layers", (double)c->max_window_layers);
        cJSON *types = ok ? cJSON_AddArrayToObject(o, "layer_types") : NULL;
        ok = types != NULL;
        for (int64_t l = 0; ok && l < c->n_layer; l++) {
            cJSON *s = cJSON_CreateString(c->sliding[l] ? "sliding_attention" : "full_attention");
            ok = s && cJSON_AddItemToArray(types, s);
        }
    }
    ok = ok && cJSON_AddNumberToObject(o, "attention_dropout", c->attn_dropout);
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    ok = ok && (c->pad >= 0 ? cJSON_AddNumberToObject(o, "pad_token_id", (double)c->pad)
                            : cJSON_AddNullToObject(o, "pad_token_id"));
    ok = ok && cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void decoder_describe(const regc_model *m, char *buf, size_t cap)
{
    const decoder_config *c = m->cfg;
    const decoder_family *f = c->family;
    char count[40], rope[200], extra[160] = "";
    regc_model_group_digits(count, sizeof count, m->total_numel);
    regc_rope_describe(&c->rope, rope, sizeof rope);
    size_t at = 0;
    if (f->qkv_bias || c->attn_bias)
        at += (size_t)snprintf(extra + at, sizeof extra - at, ", %s biases",
                               c->attn_bias ? "q/k/v/o" : "q/k/v");
    if (c->mlp_bias && at < sizeof extra)
        at += (size_t)snprintf(extra + at, sizeof extra - at, ", MLP biases");
    if (f->qk_norm != QK_NORM_NONE && at < sizeof extra)
        at += (size_t)snprintf(extra + at, sizeof extra - at, ", q/k norm %s",
                               f->qk_norm == QK_NORM_HEAD ? "per head" : "over the projection");
    if (f->norm_after && at < sizeof extra)
        at += (size_t)snprintf(extra + at, sizeof extra - at, ", norms after each block");
    if (f->fused && at < sizeof extra)
        at += (size_t)snprintf(extra + at, sizeof extra - at, ", fused qkv and gate_up");
    if (c->window > 0 && at < sizeof extra)
        at +=
            (size_t)snprintf(extra + at, sizeof extra - at, ", sliding_window %" PRId64, c->window);
    if (c->pad >= 0 && at < sizeof extra)
        snprintf(extra + at, sizeof extra - at, ", pad_token_id %" PRId64 " (no gradient)", c->pad);
    char drop[96] = "";
    if (f->resid_dropout)
        snprintf(drop, sizeof drop, ", resid_pdrop %g", c->resid_dropout);
    snprintf(buf, cap,
             "%s %s: vocab %" PRId64 ", max_position_embeddings %" PRId64 ", hidden_size %" PRId64
             ", intermediate_size %" PRId64 ", num_hidden_layers %" PRId64
             ", num_attention_heads %" PRId64 ", num_key_value_heads %" PRId64 ", head_dim %" PRId64
             ", rms_norm_eps %g, rope_theta %g%s, silu%s, %s embeddings, %s parameters%s; "
             "attention_dropout %g%s %s",
             m->arch->model_type, m->source, c->vocab, c->n_pos, c->hidden, c->inter, c->n_layer,
             c->n_head, c->n_kv_head, c->head_dim, c->eps, c->rope.theta, rope, extra,
             c->tied ? "tied" : "untied", count, m->weights ? "" : " (shape only)", c->attn_dropout,
             drop, regc_model_dropout_note(m));
}

/* the head of a tied model, and the rotary buffer older checkpoints saved */
static const char *const decoder_ignored[] = {"lm_head.weight", "*.rotary_emb.inv_freq", NULL};

#define DECODER_ARCH(type_, family_, keys_, peft_, preset_)                                        \
    {                                                                                              \
        .model_type = type_, .family = &family_, .config_keys = keys_, .peft_targets = peft_,      \
        .ignored_tensors = decoder_ignored, .preset_config = preset_,                              \
        .parse_config = decoder_parse_config, .list_params = decoder_list_params,                  \
        .build_graph = decoder_build_graph, .write_config = decoder_write_config,                  \
        .describe = decoder_describe, .fill_inputs = decoder_fill_inputs,                          \
        .compute_rope = decoder_compute_rope,                                                      \
    }

static const regc_config_key *const tables_llama[] = {keys_decoder, keys_attention_bias, keys_llama,
                                                      NULL};
static const regc_config_key *const tables_mistral[] = {keys_decoder, keys_window, NULL};
static const regc_config_key *const tables_qwen2[] = {keys_decoder, keys_window, keys_qwen_windows,
                                                      NULL};
static const regc_config_key *const tables_qwen3[] = {keys_decoder, keys_attention_bias,
                                                      keys_window, keys_qwen_windows, NULL};
static const regc_config_key *const tables_olmo2[] = {keys_decoder, keys_attention_bias, NULL};
static const regc_config_key *const tables_phi3[] = {keys_decoder, keys_window, keys_phi3, NULL};

/* PEFT's default target_modules (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING;
 * it has none for OLMo 2 and Phi-3) */
const regc_arch regc_arch_llama =
    DECODER_ARCH("llama", family_llama, tables_llama, "q_proj,v_proj", llama_preset_config);
const regc_arch regc_arch_mistral =
    DECODER_ARCH("mistral", family_mistral, tables_mistral, "q_proj,v_proj", NULL);
const regc_arch regc_arch_qwen2 =
    DECODER_ARCH("qwen2", family_qwen2, tables_qwen2, "q_proj,v_proj", NULL);
const regc_arch regc_arch_qwen3 =
    DECODER_ARCH("qwen3", family_qwen3, tables_qwen3, "q_proj,v_proj", NULL);
const regc_arch regc_arch_olmo2 = DECODER_ARCH("olmo2", family_olmo2, tables_olmo2, NULL, NULL);
const regc_arch regc_arch_phi3 = DECODER_ARCH("phi3", family_phi3, tables_phi3, NULL, NULL);
