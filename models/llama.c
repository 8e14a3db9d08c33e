/* llama.c — the Llama architecture (Hugging Face LlamaForCausalLM): its
 * config.json, parameters in checkpoint order, presets, the flat forward
 * graph and its rotary tables. The graph is deliberately flat: layer
 * structure is left for detect/ to discover from the ops alone. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define LLAMA_MAX_DIM 2147483647 /* ids are i32 and heads are int */

typedef struct {
    int64_t vocab, hidden, inter, n_layer, n_head, n_kv_head, head_dim, n_pos;
    double eps, attn_dropout;
    regc_rope rope; /* rope_theta and its scaling (rope.c) */
    int tied;
} llama_config;

static int llama_set_config(regc_model *m, const llama_config *c)
{
    llama_config *copy = malloc(sizeof *copy);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    *copy = *c;
    m->cfg = copy;
    m->vocab = c->vocab;
    m->max_seq = c->n_pos;
    return REGC_OK;
}

static int llama_preset_config(regc_model *m, const char *preset)
{
    llama_config c = {
        .eps = 1e-5, .rope.theta = 500000.0, .n_pos = 8192, .vocab = 128256, .n_kv_head = 8};
    if (strcmp(preset, "llama-tiny") == 0) {
        c = (llama_config){.vocab = 512,
                           .hidden = 128,
                           .inter = 344,
                           .n_layer = 4,
                           .n_head = 4,
                           .n_kv_head = 2,
                           .n_pos = 256,
                           .eps = 1e-6,
                           .rope.theta = 10000.0};
    } else if (strcmp(preset, "llama-127m") == 0) {
        /* llama-tiny's shape (grouped-query attention, two query heads per
         * key/value head; SwiGLU; an untied head) at GPT-2 124M's width
         * and depth: the benchmarks' Llama beside gpt2-124m */
        c = (llama_config){.vocab = 32000,
                           .hidden = 768,
                           .inter = 2048,
                           .n_layer = 12,
                           .n_head = 12,
                           .n_kv_head = 6,
                           .n_pos = 1024,
                           .eps = 1e-6,
                           .rope.theta = 10000.0};
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
    return llama_set_config(m, &c);
}

/* Options whose non-default value changes the computation in ways regc
 * does not implement: refusing them beats training a different model. */
static int llama_check_unsupported(const cJSON *root, const char *path)
{
    static const char *const biases[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++) {
        int v, rc = regc_cfg_bool(root, path, biases[i], 0, 0, &v);
        if (rc < 0)
            return rc;
        if (v)
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: key \"%s\" = true is not supported (no bias terms)", path,
                              biases[i]);
    }
    const char *act = NULL;
    int rc = regc_cfg_string(root, path, "hidden_act", 0, "silu", &act);
    if (rc < 0)
        return rc;
    /* The SwiGLU gate is what the graph builds; any other activation
     * would silently train a different model. */
    if (strcmp(act, "silu") != 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"hidden_act\" is \"%s\" (supported: silu)", path, act);
    return REGC_OK;
}

static int llama_parse_config(regc_model *m, const cJSON *root, const char *path)
{
    llama_config c = {0};
    int64_t head_dim_dflt = 0;
    int rc;
    if ((rc = regc_cfg_int(root, path, "vocab_size", 1, 0, 1, LLAMA_MAX_DIM, &c.vocab)) < 0 ||
        (rc = regc_cfg_int(root, path, "hidden_size", 1, 0, 1, LLAMA_MAX_DIM, &c.hidden)) < 0 ||
        (rc = regc_cfg_int(root, path, "intermediate_size", 1, 0, 1, LLAMA_MAX_DIM, &c.inter)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_hidden_layers", 1, 0, 1, LLAMA_MAX_DIM, &c.n_layer)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_attention_heads", 1, 0, 1, LLAMA_MAX_DIM, &c.n_head)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_key_value_heads", 0, c.n_head, 1, LLAMA_MAX_DIM,
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
    head_dim_dflt = c.hidden / c.n_head;
    if ((rc = regc_cfg_int(root, path, "head_dim", 0, head_dim_dflt, 1, LLAMA_MAX_DIM,
                           &c.head_dim)) < 0 ||
        (rc = regc_cfg_int(root, path, "max_position_embeddings", 0, 2048, 1, LLAMA_MAX_DIM,
                           &c.n_pos)) < 0 ||
        (rc = regc_cfg_double(root, path, "rms_norm_eps", 0, 1e-6, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = regc_rope_parse(root, path, c.n_pos, &c.rope)) < 0 ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, 0, &c.tied)) < 0 ||
        (rc = regc_cfg_double(root, path, "attention_dropout", 0, 0.0, 0.0, 1.0, &c.attn_dropout)) <
            0 ||
        (rc = llama_check_unsupported(root, path)) < 0)
        return rc;
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
    if (c.n_head * c.head_dim > LLAMA_MAX_DIM)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: num_attention_heads * head_dim = %" PRId64 " is too large", path,
                          c.n_head * c.head_dim);
    return llama_set_config(m, &c);
}

/* One layer's parameters, in the checkpoint's order: the slots of
 * llama_list_params' table and of each layer's ids in llama_build_graph. */
enum {
    Q_PROJ,
    K_PROJ,
    V_PROJ,
    O_PROJ, /* self_attn */
    GATE_PROJ,
    UP_PROJ,
    DOWN_PROJ, /* mlp (SwiGLU) */
    INPUT_NORM,
    POST_ATTN_NORM, /* RMSNorm weights */
    LAYER_PARAMS
};

/* The checkpoint order of LlamaForCausalLM's state dict. */
static int llama_list_params(regc_model *m)
{
    const llama_config *c = m->cfg;
    const int64_t C = c->hidden, F = c->inter, V = c->vocab;
    const int64_t QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim;
    /* HF's init (normal, std initializer_range = 0.02, for every Linear and
     * the embedding) as uniform draws of the same std. */
    const float w = (float)(0.02 * sqrt(3.0));
    char n[128];
    int rc;
    if ((rc = regc_model_add_2d(m, "model.embed_tokens.weight", 2, V, C, 0.0f, w)) < 0)
        return rc;
    for (int64_t l = 0; l < c->n_layer; l++) {
        /* nn.Linear weights are stored [out, in]. */
        const struct {
            const char *suffix;
            int ndim;
            int64_t d0, d1;
            float center, hw;
        } t[] = {
            [Q_PROJ] = {"self_attn.q_proj.weight", 2, QD, C, 0.0f, w},
            [K_PROJ] = {"self_attn.k_proj.weight", 2, KD, C, 0.0f, w},
            [V_PROJ] = {"self_attn.v_proj.weight", 2, KD, C, 0.0f, w},
            [O_PROJ] = {"self_attn.o_proj.weight", 2, C, QD, 0.0f, w},
            [GATE_PROJ] = {"mlp.gate_proj.weight", 2, F, C, 0.0f, w},
            [UP_PROJ] = {"mlp.up_proj.weight", 2, F, C, 0.0f, w},
            [DOWN_PROJ] = {"mlp.down_proj.weight", 2, C, F, 0.0f, w},
            [INPUT_NORM] = {"input_layernorm.weight", 1, C, 0, 1.0f, 0.0f},
            [POST_ATTN_NORM] = {"post_attention_layernorm.weight", 1, C, 0, 1.0f, 0.0f},
        };
        _Static_assert(sizeof t / sizeof t[0] == LAYER_PARAMS, "one row per layer slot");
        for (size_t i = 0; i < LAYER_PARAMS; i++) {
            snprintf(n, sizeof n, "model.layers.%" PRId64 ".%s", l, t[i].suffix);
            if ((rc = regc_model_add_2d(m, n, t[i].ndim, t[i].d0, t[i].d1, t[i].center, t[i].hw)) <
                0)
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

static int llama_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out)
{
    const llama_config *c = m->cfg;
    if (T > c->n_pos)
        return regc_error(REGC_ERR_ARG,
                          "sequence length %" PRId64 " exceeds max_position_embeddings %" PRId64
                          " of %s",
                          T, c->n_pos, m->source);
    int rc0 = regc_model_dropout_unapplied(m, "attention_dropout", c->attn_dropout);
    if (rc0)
        return rc0;
    regc_graph *g = regc_graph_new();
    int *p = NULL; /* [n_params] the parameters' tensor ids */
    if (!g)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    const int H = (int)c->n_head, Hkv = (int)c->n_kv_head;
    int rc, ids, targets, cos, sin, x, h, q, k, v, u, n = 0;
    const int64_t bt[] = {B, T}, rot[] = {T, c->head_dim / 2};
    G(ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    /* One rotary table for every layer, filled per batch (llama_fill_inputs). */
    G(cos = regc_graph_add_constant(g, "rope_cos", REGC_F32, 2, rot));
    G(sin = regc_graph_add_constant(g, "rope_sin", REGC_F32, 2, rot));
    G(regc_model_add_param_tensors(m, g, &p));
    const int embed = p[n++];
    const float eps = (float)c->eps;
    const float scale = (float)(1.0 / sqrt((double)c->head_dim));
    G(x = regc_graph_embedding(g, ids, embed)); /* [B, T, C] */
    for (int64_t l = 0; l < c->n_layer; l++) {
        const int *w = &p[n]; /* this layer's parameters, by slot */
        n += LAYER_PARAMS;
        G(h = regc_graph_rmsnorm(g, x, w[INPUT_NORM], eps));       /* [B, T, C] */
        G(q = regc_graph_matmul(g, h, w[Q_PROJ], 0, 1));           /* [B, T, H*D] */
        G(k = regc_graph_matmul(g, h, w[K_PROJ], 0, 1));           /* [B, T, Hkv*D] */
        G(v = regc_graph_matmul(g, h, w[V_PROJ], 0, 1));           /* [B, T, Hkv*D] */
        G(q = regc_graph_rope(g, q, cos, sin, H));                 /* [B, T, H*D] */
        G(k = regc_graph_rope(g, k, cos, sin, Hkv));               /* [B, T, Hkv*D] */
        G(h = regc_graph_attention(g, q, k, v, H, Hkv, 1, scale)); /* [B, T, H*D] */
        G(h = regc_graph_matmul(g, h, w[O_PROJ], 0, 1));           /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                            /* [B, T, C] */
        G(h = regc_graph_rmsnorm(g, x, w[POST_ATTN_NORM], eps));   /* [B, T, C] */
        G(u = regc_graph_matmul(g, h, w[GATE_PROJ], 0, 1));        /* [B, T, F] */
        G(u = regc_graph_silu(g, u));                              /* [B, T, F] */
        G(h = regc_graph_matmul(g, h, w[UP_PROJ], 0, 1));          /* [B, T, F] */
        G(h = regc_graph_mul(g, u, h));                            /* [B, T, F] */
        G(h = regc_graph_matmul(g, h, w[DOWN_PROJ], 0, 1));        /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                            /* [B, T, C] */
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
    regc_error_prefix("%s: building the llama graph", m->source);
    free(p);
    regc_graph_free(g);
    return rc;
}
#undef G

static int64_t llama_compute_rope(const regc_model *m, float *inv_freq, int64_t n, float *scaling)
{
    const llama_config *c = m->cfg;
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
static int llama_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                             int n, regc_input *in)
{
    const llama_config *c = m->cfg;
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

static cJSON *llama_write_config(const regc_model *m)
{
    const llama_config *c = m->cfg;
    cJSON *o = regc_model_config_new(m, "LlamaForCausalLM");
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
    ok = ok && cJSON_AddBoolToObject(o, "attention_bias", 0);
    ok = ok && cJSON_AddBoolToObject(o, "mlp_bias", 0);
    ok = ok && cJSON_AddNumberToObject(o, "attention_dropout", c->attn_dropout);
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    ok = ok && cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void llama_describe(const regc_model *m, char *buf, size_t cap)
{
    const llama_config *c = m->cfg;
    char count[40], rope[200];
    regc_model_group_digits(count, sizeof count, m->total_numel);
    regc_rope_describe(&c->rope, rope, sizeof rope);
    snprintf(buf, cap,
             "llama %s: vocab %" PRId64 ", max_position_embeddings %" PRId64
             ", hidden_size %" PRId64 ", intermediate_size %" PRId64 ", num_hidden_layers %" PRId64
             ", num_attention_heads %" PRId64 ", num_key_value_heads %" PRId64 ", head_dim %" PRId64
             ", rms_norm_eps %g, rope_theta %g%s, silu, %s embeddings, %s parameters%s; "
             "attention_dropout %g %s",
             m->source, c->vocab, c->n_pos, c->hidden, c->inter, c->n_layer, c->n_head,
             c->n_kv_head, c->head_dim, c->eps, c->rope.theta, rope, c->tied ? "tied" : "untied",
             count, m->weights ? "" : " (shape only)", c->attn_dropout, regc_model_dropout_note(m));
}

/* the head of a tied model, and the rotary buffer older checkpoints saved */
static const char *const llama_ignored[] = {"lm_head.weight", "*.rotary_emb.inv_freq", NULL};

const regc_arch regc_arch_llama = {
    .model_type = "llama",
    .optional_prefix = NULL,
    .ignored_tensors = llama_ignored,
    .preset_config = llama_preset_config,
    .parse_config = llama_parse_config,
    .list_params = llama_list_params,
    .build_graph = llama_build_graph,
    .write_config = llama_write_config,
    .describe = llama_describe,
    .fill_inputs = llama_fill_inputs,
    .compute_rope = llama_compute_rope,
};
