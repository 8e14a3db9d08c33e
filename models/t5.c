/* t5.c — the T5 architecture (Hugging Face T5ForConditionalGeneration): its
 * config.json, parameters in checkpoint order, presets, the relative
 * position buckets, the training inputs and the flat forward graph of the
 * whole encoder followed by the whole decoder. As for every architecture
 * the graph records no layer boundaries: detect/ finds the encoder and
 * decoder layers from the ops alone. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

#define T5_MAX_DIM 2147483647 /* ids are i32 and heads are int */

typedef struct {
    int64_t vocab, d_model, d_kv, d_ff, n_enc, n_dec, n_head;
    int64_t n_buckets, max_distance;
    int64_t pad_id, start_id;
    double eps, dropout;
    int gated; /* feed_forward_proj "gated-gelu" (else "relu") */
    int tied;
} t5_config;

static int t5_set_config(regc_model *m, const t5_config *c)
{
    t5_config *copy = malloc(sizeof *copy);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    *copy = *c;
    m->cfg = copy;
    m->vocab = c->vocab;
    /* relative positions have no table to outgrow: any length the ids allow */
    m->max_seq = T5_MAX_DIM;
    return REGC_OK;
}

static int t5_preset_config(regc_model *m, const char *preset)
{
    t5_config c = {.n_buckets = 32, .max_distance = 128, .eps = 1e-6, .dropout = 0.1, .tied = 1};
    if (strcmp(preset, "t5-tiny") == 0) {
        c.vocab = 512, c.d_model = 128, c.d_kv = 32, c.d_ff = 256, c.n_enc = 2, c.n_dec = 2;
        c.n_head = 4;
    } else if (strcmp(preset, "t5-small") == 0) {
        c.vocab = 32128, c.d_model = 512, c.d_kv = 64, c.d_ff = 2048, c.n_enc = 6, c.n_dec = 6;
        c.n_head = 8;
    } else {
        return regc_error(REGC_ERR_ARG, "%s: not a t5 preset", preset);
    }
    return t5_set_config(m, &c);
}

static int t5_parse_config(regc_model *m, const cJSON *root, const char *path)
{
    t5_config c = {0};
    const char *proj = NULL;
    int rc, enc_dec;
    if ((rc = regc_cfg_int(root, path, "vocab_size", 1, 0, 1, T5_MAX_DIM, &c.vocab)) < 0 ||
        (rc = regc_cfg_int(root, path, "d_model", 1, 0, 1, T5_MAX_DIM, &c.d_model)) < 0 ||
        (rc = regc_cfg_int(root, path, "d_kv", 1, 0, 1, T5_MAX_DIM, &c.d_kv)) < 0 ||
        (rc = regc_cfg_int(root, path, "d_ff", 1, 0, 1, T5_MAX_DIM, &c.d_ff)) < 0 ||
        (rc = regc_cfg_int(root, path, "num_layers", 1, 0, 1, T5_MAX_DIM, &c.n_enc)) < 0 ||
        (rc = regc_cfg_int(root, path, "num_decoder_layers", 0, c.n_enc, 1, T5_MAX_DIM, &c.n_dec)) <
            0 ||
        (rc = regc_cfg_int(root, path, "num_heads", 1, 0, 1, T5_MAX_DIM, &c.n_head)) < 0 ||
        /* below 4 buckets the bidirectional half has no exact range (HF
         * would divide by zero); the log range must start above it */
        (rc = regc_cfg_int(root, path, "relative_attention_num_buckets", 0, 32, 4, T5_MAX_DIM,
                           &c.n_buckets)) < 0 ||
        (rc = regc_cfg_int(root, path, "relative_attention_max_distance", 0, 128, 1, T5_MAX_DIM,
                           &c.max_distance)) < 0 ||
        (rc = regc_cfg_double(root, path, "layer_norm_epsilon", 0, 1e-6, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = regc_cfg_string(root, path, "feed_forward_proj", 0, "relu", &proj)) < 0 ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, 1, &c.tied)) < 0 ||
        (rc = regc_cfg_int(root, path, "pad_token_id", 0, 0, 0, c.vocab - 1, &c.pad_id)) < 0 ||
        (rc = regc_cfg_int(root, path, "decoder_start_token_id", 0, c.pad_id, 0, c.vocab - 1,
                           &c.start_id)) < 0 ||
        (rc = regc_cfg_bool(root, path, "is_encoder_decoder", 0, 1, &enc_dec)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "dropout_rate", 0.1, &c.dropout)) < 0)
        return rc;
    if (!enc_dec)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"is_encoder_decoder\" = false is not supported (T5 here is "
                          "the encoder-decoder T5ForConditionalGeneration)",
                          path);
    /* "gated-gelu" means gelu_new (tanh), what the kernels compute; HF's
     * other spellings (gated-relu, gated-silu, gelu, ...) are not built */
    if (strcmp(proj, "relu") == 0)
        c.gated = 0;
    else if (strcmp(proj, "gated-gelu") == 0)
        c.gated = 1;
    else
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"feed_forward_proj\" is \"%s\" (supported: relu, gated-gelu)",
                          path, proj);
    if (c.max_distance <= c.n_buckets / 2)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"relative_attention_max_distance\" is %" PRId64
                          ", which must exceed the %" PRId64
                          " exact positions of relative_attention_num_buckets %" PRId64,
                          path, c.max_distance, c.n_buckets / 2, c.n_buckets);
    if (c.n_head > T5_MAX_DIM / c.d_kv)
        return regc_error(REGC_ERR_FORMAT, "%s: num_heads x d_kv overflows", path);
    return t5_set_config(m, &c);
}

/* uniform halfwidth of standard deviation s */
static float t5_hw(double s) { return (float)(s * sqrt(3.0)); }

/* One attention's q, k, v, o (and block 0's relative_attention_bias when
 * bias) under prefix, in checkpoint order. HF's init scales them: q by
 * (d_model d_kv)^-1/2 (T5 does not scale the scores), k, v and the bias by
 * d_model^-1/2, o by (num_heads d_kv)^-1/2. */
static int t5_list_attention(regc_model *m, const char *prefix, int bias)
{
    const t5_config *c = m->cfg;
    const int64_t C = c->d_model, HD = c->n_head * c->d_kv;
    const double sc = 1.0 / sqrt((double)C);
    char n[192];
    int rc;
    const struct {
        const char *w;
        int64_t d0, d1;
        float hw;
    } t[] = {
        {"q", HD, C, t5_hw(1.0 / sqrt((double)C * (double)c->d_kv))},
        {"k", HD, C, t5_hw(sc)},
        {"v", HD, C, t5_hw(sc)},
        {"o", C, HD, t5_hw(1.0 / sqrt((double)HD))},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        snprintf(n, sizeof n, "%s.%s.weight", prefix, t[i].w);
        if ((rc = regc_model_add_2d(m, n, 2, t[i].d0, t[i].d1, 0.0f, t[i].hw)) < 0)
            return rc;
    }
    if (bias) {
        snprintf(n, sizeof n, "%s.relative_attention_bias.weight", prefix);
        if ((rc = regc_model_add_2d(m, n, 2, c->n_buckets, c->n_head, 0.0f, t5_hw(sc))) < 0)
            return rc;
    }
    return REGC_OK;
}

/* layer.<i>.DenseReluDense and its layer norm */
static int t5_list_ff(regc_model *m, const char *block, int i)
{
    const t5_config *c = m->cfg;
    const float wi = t5_hw(1.0 / sqrt((double)c->d_model)), wo = t5_hw(1.0 / sqrt((double)c->d_ff));
    char n[192];
    int rc;
    for (int k = 0; k < (c->gated ? 2 : 1); k++) {
        snprintf(n, sizeof n, "%s.layer.%d.DenseReluDense.wi%s.weight", block, i,
                 c->gated ? (k ? "_1" : "_0") : "");
        if ((rc = regc_model_add_2d(m, n, 2, c->d_ff, c->d_model, 0.0f, wi)) < 0)
            return rc;
    }
    snprintf(n, sizeof n, "%s.layer.%d.DenseReluDense.wo.weight", block, i);
    if ((rc = regc_model_add_2d(m, n, 2, c->d_model, c->d_ff, 0.0f, wo)) < 0)
        return rc;
    snprintf(n, sizeof n, "%s.layer.%d.layer_norm.weight", block, i);
    return regc_model_add_2d(m, n, 1, c->d_model, 0, 1.0f, 0.0f);
}

/* The checkpoint order of T5ForConditionalGeneration's state dict, less
 * the encoder/decoder embed_tokens copies of shared.weight. */
static int t5_list_params(regc_model *m)
{
    const t5_config *c = m->cfg;
    const int64_t C = c->d_model, V = c->vocab;
    char block[64], n[192];
    int rc;
    /* HF draws shared (and an untied lm_head) with std 1: T5 does not scale
     * its embeddings, the norm after them does */
    if ((rc = regc_model_add_2d(m, "shared.weight", 2, V, C, 0.0f, t5_hw(1.0))) < 0)
        return rc;
    for (int64_t l = 0; l < c->n_enc; l++) {
        snprintf(block, sizeof block, "encoder.block.%" PRId64, l);
        snprintf(n, sizeof n, "%s.layer.0.SelfAttention", block);
        if ((rc = t5_list_attention(m, n, l == 0)) < 0)
            return rc;
        snprintf(n, sizeof n, "%s.layer.0.layer_norm.weight", block);
        if ((rc = regc_model_add_2d(m, n, 1, C, 0, 1.0f, 0.0f)) < 0 ||
            (rc = t5_list_ff(m, block, 1)) < 0)
            return rc;
    }
    if ((rc = regc_model_add_2d(m, "encoder.final_layer_norm.weight", 1, C, 0, 1.0f, 0.0f)) < 0)
        return rc;
    for (int64_t l = 0; l < c->n_dec; l++) {
        snprintf(block, sizeof block, "decoder.block.%" PRId64, l);
        snprintf(n, sizeof n, "%s.layer.0.SelfAttention", block);
        if ((rc = t5_list_attention(m, n, l == 0)) < 0)
            return rc;
        snprintf(n, sizeof n, "%s.layer.0.layer_norm.weight", block);
        if ((rc = regc_model_add_2d(m, n, 1, C, 0, 1.0f, 0.0f)) < 0)
            return rc;
        snprintf(n, sizeof n, "%s.layer.1.EncDecAttention", block);
        if ((rc = t5_list_attention(m, n, 0)) < 0)
            return rc;
        snprintf(n, sizeof n, "%s.layer.1.layer_norm.weight", block);
        if ((rc = regc_model_add_2d(m, n, 1, C, 0, 1.0f, 0.0f)) < 0 ||
            (rc = t5_list_ff(m, block, 2)) < 0)
            return rc;
    }
    if ((rc = regc_model_add_2d(m, "decoder.final_layer_norm.weight", 1, C, 0, 1.0f, 0.0f)) < 0)
        return rc;
    if (!c->tied && (rc = regc_model_add_2d(m, "lm_head.weight", 2, V, C, 0.0f, t5_hw(1.0))) < 0)
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

/* One sublayer's parameter ids, by name, taken from the checkpoint-ordered
 * list in that order (t5_list_params). */
typedef struct {
    int q, k, v, o;
    int rel_bias; /* relative_attention_bias: block 0 only, else -1 */
    int ln;       /* the sublayer's layer_norm */
} t5_attn_params;

typedef struct {
    int wi_0, wi_1; /* wi_1 only for gated-gelu (-1 for relu, whose wi is wi_0) */
    int wo, ln;
} t5_ff_params;

/* p[*k] on: q, k, v, o, the bias table when `bias`, then the layer norm. */
static t5_attn_params t5_take_attn(const int *p, int *k, int bias)
{
    t5_attn_params a;
    a.q = p[(*k)++], a.k = p[(*k)++], a.v = p[(*k)++], a.o = p[(*k)++];
    a.rel_bias = bias ? p[(*k)++] : -1;
    a.ln = p[(*k)++];
    return a;
}

/* p[*k] on: wi (or wi_0, wi_1), wo, then the layer norm. */
static t5_ff_params t5_take_ff(const t5_config *c, const int *p, int *k)
{
    t5_ff_params f;
    f.wi_0 = p[(*k)++];
    f.wi_1 = c->gated ? p[(*k)++] : -1;
    f.wo = p[(*k)++], f.ln = p[(*k)++];
    return f;
}

/* rmsnorm, q/k/v from (x, kv), attention with an optional bias, o, and the
 * residual add: one pre-norm attention sublayer. dropout_rate drops the
 * probabilities and the sublayer's output, as T5LayerSelfAttention does. */
static int t5_attention(const regc_model *m, regc_graph *g, int x, int kv, const t5_attn_params *w,
                        int bias, int causal)
{
    const t5_config *c = m->cfg;
    int rc, h, q, k, v, a;
    const int H = (int)c->n_head;
    const regc_attrs attn = {.n_head = H, .n_kv_head = H, .causal = causal, .scale = 1.0f};
    G(h = regc_graph_rmsnorm(g, x, w->ln, (float)c->eps));    /* [B, T, C] */
    G(q = regc_graph_matmul(g, h, w->q, 0, 1));               /* [B, T, H*Dkv] */
    G(k = regc_graph_matmul(g, kv < 0 ? h : kv, w->k, 0, 1)); /* [B, Tk, H*Dkv] */
    G(v = regc_graph_matmul(g, kv < 0 ? h : kv, w->v, 0, 1)); /* [B, Tk, H*Dkv] */
    /* T5 folds the 1/sqrt(d_kv) into q's init: the scores are not scaled */
    G(regc_model_attention(m, g, q, k, v, bias, &attn, c->dropout, &a)); /* [B, T, H*Dkv] */
    G(a = regc_graph_matmul(g, a, w->o, 0, 1));                          /* [B, T, C] */
    G(regc_model_dropout(m, g, a, a, c->dropout, &a));                   /* [B, T, C] */
    return regc_graph_add(g, x, a);                                      /* [B, T, C] */
fail:
    return rc;
}

/* rmsnorm, DenseReluDense (relu or gated-gelu) and the residual add;
 * dropout_rate drops the activation before wo and the sublayer's output. */
static int t5_feed_forward(const regc_model *m, regc_graph *g, int x, const t5_ff_params *w)
{
    const t5_config *c = m->cfg;
    int rc, h, u;
    G(h = regc_graph_rmsnorm(g, x, w->ln, (float)c->eps)); /* [B, T, C] */
    if (c->gated) {
        G(u = regc_graph_matmul(g, h, w->wi_1, 0, 1)); /* [B, T, F] */
        G(h = regc_graph_matmul(g, h, w->wi_0, 0, 1)); /* [B, T, F] */
        G(h = regc_graph_gelu(g, h));                  /* [B, T, F] */
        G(h = regc_graph_mul(g, h, u));                /* [B, T, F] */
    } else {
        G(h = regc_graph_matmul(g, h, w->wi_0, 0, 1)); /* [B, T, F] */
        G(h = regc_graph_relu(g, h));                  /* [B, T, F] */
    }
    G(regc_model_dropout(m, g, h, h, c->dropout, &h)); /* [B, T, F] */
    G(h = regc_graph_matmul(g, h, w->wo, 0, 1));       /* [B, T, C] */
    G(regc_model_dropout(m, g, h, h, c->dropout, &h)); /* [B, T, C] */
    return regc_graph_add(g, x, h);                    /* [B, T, C] */
fail:
    return rc;
}

/* The position bias [H, Tq, Tk] of one stack from its bucket table. */
static int t5_position_bias(regc_graph *g, int buckets, int table)
{
    int rc, b;
    G(b = regc_graph_embedding(g, buckets, table));            /* [Tq, Tk, H] */
    return regc_graph_transpose(g, b, (const int[]){2, 0, 1}); /* [H, Tq, Tk] */
fail:
    return rc;
}

static int t5_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out)
{
    const t5_config *c = m->cfg;
    regc_graph *g = regc_graph_new();
    int *p = NULL; /* [n_params] the parameters' tensor ids */
    if (!g)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    int rc, ids, dec_ids, targets, enc_buckets, dec_buckets, x, y, bias, k = 0;
    const int64_t bt[] = {B, T}, tt[] = {T, T};
    G(ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(dec_ids = regc_graph_add_tensor(g, "decoder_input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    G(enc_buckets = regc_graph_add_constant(g, "encoder_position_buckets", REGC_I32, 2, tt));
    G(dec_buckets = regc_graph_add_constant(g, "decoder_position_buckets", REGC_I32, 2, tt));
    G(regc_model_add_param_tensors(m, g, &p));
    const int shared = p[k++];
    const float eps = (float)c->eps;

    /* encoder: block 0's table gives every layer's bias; dropout_rate
     * drops each stack's embeddings and its final norm's output too */
    G(x = regc_graph_embedding(g, ids, shared));       /* [B, T, C] */
    G(regc_model_dropout(m, g, x, x, c->dropout, &x)); /* [B, T, C] */
    for (int64_t l = 0; l < c->n_enc; l++) {
        const t5_attn_params self = t5_take_attn(p, &k, l == 0);
        const t5_ff_params ff = t5_take_ff(c, p, &k);
        if (l == 0)
            G(bias = t5_position_bias(g, enc_buckets, self.rel_bias)); /* [H, T, T] */
        G(x = t5_attention(m, g, x, -1, &self, bias, 0));              /* [B, T, C] */
        G(x = t5_feed_forward(m, g, x, &ff));                          /* [B, T, C] */
    }
    const int enc_norm = p[k++];
    int enc;
    G(enc = regc_graph_rmsnorm(g, x, enc_norm, eps));        /* [B, T, C] */
    G(regc_model_dropout(m, g, enc, enc, c->dropout, &enc)); /* [B, T, C] */

    /* decoder: causal self-attention with its own bias, then cross-attention */
    G(y = regc_graph_embedding(g, dec_ids, shared));   /* [B, T, C] */
    G(regc_model_dropout(m, g, y, y, c->dropout, &y)); /* [B, T, C] */
    for (int64_t l = 0; l < c->n_dec; l++) {
        const t5_attn_params self = t5_take_attn(p, &k, l == 0);
        const t5_attn_params cross = t5_take_attn(p, &k, 0);
        const t5_ff_params ff = t5_take_ff(c, p, &k);
        if (l == 0)
            G(bias = t5_position_bias(g, dec_buckets, self.rel_bias)); /* [H, T, T] */
        G(y = t5_attention(m, g, y, -1, &self, bias, 1));              /* [B, T, C] */
        G(y = t5_attention(m, g, y, enc, &cross, -1, 0));              /* [B, T, C] */
        G(y = t5_feed_forward(m, g, y, &ff));                          /* [B, T, C] */
    }
    const int dec_norm = p[k++];
    const int head = c->tied ? shared : p[k++];
    int logits, loss;
    G(y = regc_graph_rmsnorm(g, y, dec_norm, eps));    /* [B, T, C] */
    G(regc_model_dropout(m, g, y, y, c->dropout, &y)); /* [B, T, C] */
    /* a tied head reads the embedding table, whose scale is the input's:
     * HF rescales the decoder output by d_model^-1/2 first */
    if (c->tied)
        G(y = regc_graph_scale(g, y, (float)(1.0 / sqrt((double)c->d_model)))); /* [B, T, C] */
    G(logits = regc_graph_matmul(g, y, head, 0, 1));                            /* [B, T, V] */
    G(loss = regc_graph_cross_entropy(g, logits, targets));                     /* [] */
    G(regc_graph_mark_output(g, loss));
    free(p);
    *out = g;
    return REGC_OK;
fail:
    regc_error_prefix("%s: building the t5 graph", m->source);
    free(p);
    regc_graph_free(g);
    return rc;
}
#undef G

/* HF's T5Attention._relative_position_bucket for one relative position
 * (key minus query), in its float32 arithmetic so that the buckets agree
 * at the edges of the logarithmic range. */
static int32_t t5_bucket(int64_t rel, int bidirectional, int64_t n_buckets, int64_t max_distance)
{
    int64_t bucket = 0;
    if (bidirectional) {
        n_buckets /= 2;
        if (rel > 0)
            bucket += n_buckets;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int64_t max_exact = n_buckets / 2;
    if (rel < max_exact)
        return (int32_t)(bucket + rel);
    float f = logf((float)rel / (float)max_exact);
    f = f / (float)log((double)max_distance / (double)max_exact);
    f = f * (float)(n_buckets - max_exact);
    int64_t large = max_exact + (int64_t)f;
    if (large > n_buckets - 1)
        large = n_buckets - 1;
    return (int32_t)(bucket + large);
}

/* An i32 input of the given shape, or an error naming it. */
static int t5_input_check(const regc_model *m, const regc_input *x, int64_t d0, int64_t d1)
{
    const regc_tensor *t = x->tensor;
    if (t->dtype != REGC_I32 || t->ndim != 2 || t->shape[0] != d0 || t->shape[1] != d1)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: graph input %s must be i32 [%" PRId64 ", %" PRId64 "]", m->source,
                          t->name, d0, d1);
    return REGC_OK;
}

static int t5_fill_buckets(const regc_model *m, regc_input *x, int bidirectional)
{
    const t5_config *c = m->cfg;
    if (!x || x->filled)
        return REGC_OK; /* absent, or filled for an earlier batch */
    const int64_t tq = x->tensor->ndim == 2 ? x->tensor->shape[0] : 0;
    const int64_t tk = x->tensor->ndim == 2 ? x->tensor->shape[1] : 0;
    int rc = t5_input_check(m, x, tq, tk);
    if (rc < 0)
        return rc;
    int32_t *b = x->host; /* [Tq, Tk] */
    for (int64_t i = 0; i < tq; i++)
        for (int64_t j = 0; j < tk; j++)
            b[i * tk + j] = t5_bucket(j - i, bidirectional, c->n_buckets, c->max_distance);
    x->filled = x->constant = 1;
    return REGC_OK;
}

/* Each row of 2T tokens is one pair: the encoder reads the first T, the
 * decoder predicts the last T, fed them shifted right behind
 * decoder_start_token_id (HF's _shift_right). */
static int t5_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                          int n, regc_input *in)
{
    const t5_config *c = m->cfg;
    regc_input *ids = regc_input_find(n, in, "input_ids");
    regc_input *dec = regc_input_find(n, in, "decoder_input_ids");
    regc_input *targets = regc_input_find(n, in, "targets");
    const int64_t B = b->batch, T = b->seq;
    int rc;
    if ((ids && (rc = t5_input_check(m, ids, B, T)) < 0) ||
        (dec && (rc = t5_input_check(m, dec, B, T)) < 0) ||
        (targets && (rc = t5_input_check(m, targets, B, T)) < 0))
        return rc;
    if (ids || dec || targets) {
        if (T > INT64_MAX / 2 / B)
            return regc_error(REGC_ERR_ARG,
                              "%s: batch %" PRId64 " x 2 x sequence %" PRId64 " overflows",
                              m->source, B, T);
        int32_t *rows = malloc((size_t)(2 * B * T) * sizeof *rows);
        int32_t *next = malloc((size_t)(2 * B * T) * sizeof *next);
        if (!rows || !next) {
            free(rows);
            free(next);
            return regc_error(REGC_ERR_MEMORY, "out of memory");
        }
        rc = regc_tokens_rows(data, b->step, b->global_rows ? b->global_rows : B, b->row0, B, 2 * T,
                              rows, next); /* [B, 2T] */
        for (int64_t r = 0; rc == REGC_OK && r < B; r++) {
            const int32_t *row = rows + r * 2 * T;
            for (int64_t t = 0; t < T; t++) {
                if (ids)
                    ((int32_t *)ids->host)[r * T + t] = row[t];
                if (targets)
                    ((int32_t *)targets->host)[r * T + t] = row[T + t];
                if (dec)
                    ((int32_t *)dec->host)[r * T + t] =
                        t == 0 ? (int32_t)c->start_id : row[T + t - 1];
            }
        }
        free(rows);
        free(next);
        if (rc < 0)
            return rc;
        if (ids)
            ids->filled = 1;
        if (dec)
            dec->filled = 1;
        if (targets)
            targets->filled = 1;
    }
    if ((rc = t5_fill_buckets(m, regc_input_find(n, in, "encoder_position_buckets"), 1)) < 0 ||
        (rc = t5_fill_buckets(m, regc_input_find(n, in, "decoder_position_buckets"), 0)) < 0)
        return rc;
    return REGC_OK;
}

static cJSON *t5_write_config(const regc_model *m)
{
    const t5_config *c = m->cfg;
    cJSON *o = regc_model_config_new(m, "T5ForConditionalGeneration");
    int ok = o != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab);
    ok = ok && cJSON_AddNumberToObject(o, "d_model", (double)c->d_model);
    ok = ok && cJSON_AddNumberToObject(o, "d_kv", (double)c->d_kv);
    ok = ok && cJSON_AddNumberToObject(o, "d_ff", (double)c->d_ff);
    ok = ok && cJSON_AddNumberToObject(o, "num_layers", (double)c->n_enc);
    ok = ok && cJSON_AddNumberToObject(o, "num_decoder_layers", (double)c->n_dec);
    ok = ok && cJSON_AddNumberToObject(o, "num_heads", (double)c->n_head);
    ok = ok && cJSON_AddNumberToObject(o, "relative_attention_num_buckets", (double)c->n_buckets);
    ok = ok &&
         cJSON_AddNumberToObject(o, "relative_attention_max_distance", (double)c->max_distance);
    ok = ok && cJSON_AddNumberToObject(o, "layer_norm_epsilon", c->eps);
    ok = ok && cJSON_AddStringToObject(o, "feed_forward_proj", c->gated ? "gated-gelu" : "relu");
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    ok = ok && cJSON_AddBoolToObject(o, "is_encoder_decoder", 1);
    ok = ok && cJSON_AddNumberToObject(o, "pad_token_id", (double)c->pad_id);
    ok = ok && cJSON_AddNumberToObject(o, "decoder_start_token_id", (double)c->start_id);
    ok = ok && cJSON_AddNumberToObject(o, "dropout_rate", c->dropout);
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", "float32");
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static void t5_describe(const regc_model *m, char *buf, size_t cap)
{
    const t5_config *c = m->cfg;
    char count[40];
    regc_model_group_digits(count, sizeof count, m->total_numel);
    snprintf(buf, cap,
             "t5 %s: vocab %" PRId64 ", d_model %" PRId64 ", d_kv %" PRId64 ", d_ff %" PRId64
             ", %" PRId64 " encoder + %" PRId64 " decoder layers, %" PRId64 " heads, %" PRId64
             " relative buckets up to %" PRId64
             ", layer_norm_epsilon %g, %s, %s embeddings, decoder start %" PRId64
             ", %s parameters%s; dropout_rate %g %s",
             m->source, c->vocab, c->d_model, c->d_kv, c->d_ff, c->n_enc, c->n_dec, c->n_head,
             c->n_buckets, c->max_distance, c->eps, c->gated ? "gated-gelu" : "relu",
             c->tied ? "tied" : "untied", c->start_id, count, m->weights ? "" : " (shape only)",
             c->dropout, regc_model_dropout_note(m));
}

/* the copies of the shared embedding, the tied head, and the decoder's
 * unused cross-attention bias */
static const char *const t5_ignored[] = {
    "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", NULL};

/* config.json's keys (model_load.c checks every key against them) */
static const regc_config_key t5_keys[] = {
    {"vocab_size", REGC_KEY_APPLIED, NULL, NULL},
    {"d_model", REGC_KEY_APPLIED, NULL, NULL},
    {"d_kv", REGC_KEY_APPLIED, NULL, NULL},
    {"d_ff", REGC_KEY_APPLIED, NULL, NULL},
    {"num_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"num_decoder_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"num_heads", REGC_KEY_APPLIED, NULL, NULL},
    {"relative_attention_num_buckets", REGC_KEY_APPLIED, NULL, NULL},
    {"relative_attention_max_distance", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_norm_epsilon", REGC_KEY_APPLIED, NULL, NULL},
    {"feed_forward_proj", REGC_KEY_APPLIED, NULL, NULL},
    {"tie_word_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"pad_token_id", REGC_KEY_APPLIED, NULL, NULL},
    {"decoder_start_token_id", REGC_KEY_APPLIED, NULL, NULL},
    {"is_encoder_decoder", REGC_KEY_APPLIED, NULL, NULL},
    {"dropout_rate", REGC_KEY_APPLIED, NULL, NULL},
    {"dense_act_fn", REGC_KEY_INERT, NULL,
     "Transformers derives it from feed_forward_proj, which regc applies"},
    {"is_gated_act", REGC_KEY_INERT, NULL,
     "Transformers derives it from feed_forward_proj, which regc applies"},
    {"scale_decoder_outputs", REGC_KEY_INERT, NULL,
     "Transformers derives it from tie_word_embeddings, which regc applies"},
    {"initializer_factor", REGC_KEY_INERT, NULL,
     "random initialisation's; a checkpoint's weights are read as they are"},
    {"n_positions", REGC_KEY_INERT, NULL,
     "T5's positions are relative buckets; Transformers does not read it"},
    {"output_past", REGC_KEY_INERT, NULL, "an older spelling of use_cache (generation's)"},
    {"task_specific_params", REGC_KEY_INERT, NULL, "generation settings per task"},
    {"classifier_dropout", REGC_KEY_INERT, NULL,
     "a classification head's, which regc does not build"},
    {"is_decoder", REGC_KEY_INERT, NULL,
     "T5ForConditionalGeneration sets it for each stack itself"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key *const t5_tables[] = {t5_keys, NULL};

const regc_arch regc_arch_t5 = {
    .model_type = "t5",
    .config_keys = t5_tables,
    .peft_targets = "q,v", /* PEFT's default target_modules */
    .optional_prefix = NULL,
    .ignored_tensors = t5_ignored,
    .preset_config = t5_preset_config,
    .parse_config = t5_parse_config,
    .list_params = t5_list_params,
    .build_graph = t5_build_graph,
    .write_config = t5_write_config,
    .describe = t5_describe,
    .fill_inputs = t5_fill_inputs,
    .own_data = 1,
};
