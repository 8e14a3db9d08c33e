/* decoder_write.c — a decoder family's decoder_config written back as
 * config.json in Transformers 5's spelling (so that Transformers loads a
 * saved model, and each key reads back the same model: decoder_config.c
 * reads it), and described in one line. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

/* config.json's spelling of an activation, for writing it back. */
static const char *decoder_act_name(act_kind act)
{
    switch (act) {
    case ACT_GELU_TANH: return "gelu_pytorch_tanh";
    case ACT_GELU: return "gelu";
    case ACT_RELU: return "relu";
    case ACT_SILU: break;
    }
    return "silu";
}

/* Two keys that are one (GPT-NeoX's hidden_dropout serves both dropouts). */
static int decoder_same_key(const char *a, const char *b) { return a && b && !strcmp(a, b); }

/* A float as JSON that reads back as a float (Transformers' strict
 * configs refuse 50 where they want 50.0). */
static int decoder_add_float(cJSON *o, const char *key, double v)
{
    char text[64];
    snprintf(text, sizeof text, "%.17g", v);
    if (!strpbrk(text, ".eEn"))
        strcat(text, ".0");
    return cJSON_AddRawToObject(o, key, text) != NULL;
}

/* A rope_parameters dictionary of r (Gemma 3 writes one per layer type). */
static cJSON *decoder_rope_dict(const regc_rope *r)
{
    cJSON *tmp = cJSON_CreateObject(), *dict = NULL;
    if (tmp && regc_rope_write_config(r, tmp)) {
        const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(tmp, "rope_scaling");
        dict = cJSON_IsObject(scaling) ? cJSON_Duplicate(scaling, 1) : cJSON_CreateObject();
        if (dict && !cJSON_GetObjectItemCaseSensitive(dict, "rope_type") &&
            !cJSON_AddStringToObject(dict, "rope_type", "default"))
            cJSON_Delete(dict), dict = NULL;
        if (dict && !cJSON_AddNumberToObject(dict, "rope_theta", r->theta))
            cJSON_Delete(dict), dict = NULL;
        if (dict && r->partial_key &&
            !cJSON_AddNumberToObject(dict, "partial_rotary_factor", r->partial))
            cJSON_Delete(dict), dict = NULL;
    }
    cJSON_Delete(tmp);
    return dict;
}

/* The windows as read, and which layers slide, spelled as Transformers 5
 * spells them. */
static int decoder_write_windows(const decoder_config *c, cJSON *o)
{
    const decoder_family *f = c->family;
    if (f->window == WINDOW_NONE)
        return 1;
    int ok = c->window > 0 ? cJSON_AddNumberToObject(o, "sliding_window", (double)c->window) != NULL
                           : cJSON_AddNullToObject(o, "sliding_window") != NULL;
    if (f->window == WINDOW_ALL)
        return ok;
    if (f->window == WINDOW_LAYERS || f->window == WINDOW_NOPE)
        ok = ok && cJSON_AddBoolToObject(o, "use_sliding_window", c->use_sliding_window);
    if (f->window == WINDOW_LAYERS)
        ok = ok && cJSON_AddNumberToObject(o, "max_window_layers", (double)c->max_window_layers);
    cJSON *types = ok ? cJSON_AddArrayToObject(o, "layer_types") : NULL;
    ok = types != NULL;
    for (int64_t l = 0; ok && l < c->n_layer; l++) {
        cJSON *s = cJSON_CreateString(c->layer[l] & LAYER_SLIDING ? "sliding_attention"
                                                                  : "full_attention");
        ok = s && cJSON_AddItemToArray(types, s);
    }
    return ok;
}

/* SmolLM3's layers without RoPE, as read. */
static int decoder_write_nope(const decoder_config *c, cJSON *o)
{
    cJSON *list = cJSON_AddArrayToObject(o, "no_rope_layers");
    int ok = list &&
             cJSON_AddNumberToObject(o, "no_rope_layer_interval", (double)c->nope_interval) != NULL;
    for (int64_t l = 0; ok && l < c->n_layer; l++) {
        cJSON *x = cJSON_CreateNumber(c->layer[l] & LAYER_NOPE ? 0 : 1);
        ok = x && cJSON_AddItemToArray(list, x);
    }
    return ok;
}

/* Gemma's own keys. */
static int decoder_write_gemma(const decoder_config *c, cJSON *o)
{
    int ok = cJSON_AddNumberToObject(o, "query_pre_attn_scalar", c->query_scalar) != NULL;
    if (c->family->gemma == 2)
        ok = ok && (c->attn_softcap > 0.0
                        ? decoder_add_float(o, "attn_logit_softcapping", c->attn_softcap)
                        : cJSON_AddNullToObject(o, "attn_logit_softcapping") != NULL);
    ok = ok &&
         (c->final_softcap > 0.0 ? decoder_add_float(o, "final_logit_softcapping", c->final_softcap)
                                 : cJSON_AddNullToObject(o, "final_logit_softcapping") != NULL);
    if (c->family->gemma == 3)
        ok = ok && cJSON_AddBoolToObject(o, "use_bidirectional_attention", 0);
    if (c->family->local_rope) {
        cJSON *params = cJSON_AddObjectToObject(o, "rope_parameters");
        cJSON *full = decoder_rope_dict(&c->rope), *local = decoder_rope_dict(&c->rope_local);
        ok = ok && params && full && cJSON_AddItemToObject(params, "full_attention", full);
        if (!ok)
            cJSON_Delete(full);
        ok = ok && local && cJSON_AddItemToObject(params, "sliding_attention", local);
        if (!ok)
            cJSON_Delete(local);
    }
    return ok;
}

cJSON *decoder_write_config(const regc_model *m)
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
    if (!f->no_kv_heads)
        ok = ok && cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->n_kv_head);
    if (!f->no_head_dim)
        ok = ok && cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
    ok = ok && cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->n_pos);
    ok = ok && cJSON_AddNumberToObject(o, decoder_eps_key(f), c->eps);
    if (c->rope.partial_key) { /* the share with the rest, where every such family reads it */
        cJSON *params = decoder_rope_dict(&c->rope);
        ok = ok && params && cJSON_AddItemToObject(o, "rope_parameters", params);
        if (!ok)
            cJSON_Delete(params);
    } else if (!f->local_rope) {
        ok = ok && regc_rope_write_config(&c->rope, o);
    }
    /* Phi3Config takes longrope's original length from the top level */
    if (f->phi3_rope)
        ok = ok && cJSON_AddNumberToObject(o, "original_max_position_embeddings",
                                           (double)c->rope.original_max_pos);
    ok = ok && cJSON_AddStringToObject(o, f->act_key,
                                       c->act_name[0] ? c->act_name : decoder_act_name(c->act));
    if (f->gemma)
        ok = ok && decoder_write_gemma(c, o);
    if (f->bias_key)
        ok = ok && cJSON_AddBoolToObject(o, "attention_bias", c->attn_bias);
    if (f->mlp_bias_key)
        ok = ok && cJSON_AddBoolToObject(o, "mlp_bias", c->mlp_bias);
    if (f->resid_dropout_key)
        ok = ok && cJSON_AddNumberToObject(o, f->resid_dropout_key, c->resid_dropout);
    if (f->embed_dropout_key && !decoder_same_key(f->embed_dropout_key, f->resid_dropout_key))
        ok = ok && cJSON_AddNumberToObject(o, f->embed_dropout_key, c->embed_dropout);
    if (f->qk_norm_key)
        ok = ok && cJSON_AddBoolToObject(o, f->qk_norm_key, c->qk_norm != QK_NORM_NONE);
    if (f->parallel_key)
        ok = ok && cJSON_AddBoolToObject(o, f->parallel_key, c->parallel != PARALLEL_NONE);
    if (f->qkv_bias_key)
        ok = ok && cJSON_AddBoolToObject(o, f->qkv_bias_key, c->qkv_bias);
    if (f->nope)
        ok = ok && decoder_write_nope(c, o);
    if (f->granite)
        ok = ok && decoder_add_float(o, "embedding_multiplier", c->embed_mult) &&
             decoder_add_float(o, "residual_multiplier", c->resid_mult) &&
             decoder_add_float(o, "attention_multiplier", c->attn_mult) &&
             decoder_add_float(o, "logits_scaling", c->logits_scaling);
    ok = ok && decoder_write_windows(c, o);
    ok = ok && cJSON_AddNumberToObject(o, "attention_dropout", c->attn_dropout);
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied);
    if (!f->pad_unused)
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

/* printf onto the end of buf (cap bytes), truncating. */
static void decoder_append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void decoder_append(char *buf, size_t cap, const char *fmt, ...)
{
    const size_t at = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    if (at + 1 < cap)
        vsnprintf(buf + at, cap - at, fmt, ap);
    va_end(ap);
}

void decoder_describe(const regc_model *m, char *buf, size_t cap)
{
    const decoder_config *c = m->cfg;
    const decoder_family *f = c->family;
    char count[40], rope[200], extra[512] = "";
    regc_model_group_digits(count, sizeof count, m->total_numel);
    regc_rope_describe(&c->rope, rope, sizeof rope);
    if (f->local_rope)
        decoder_append(rope, sizeof rope, " (sliding layers %g)", c->rope_local.theta);
    if (c->qkv_bias || c->attn_bias)
        decoder_append(extra, sizeof extra, ", %s biases", c->attn_bias ? "q/k/v/o" : "q/k/v");
    if (c->mlp_bias)
        decoder_append(extra, sizeof extra, ", MLP biases");
    if (c->qk_norm != QK_NORM_NONE)
        decoder_append(extra, sizeof extra, ", q/k norm %s",
                       c->qk_norm == QK_NORM_HEAD ? "per head" : "over the projection");
    if (regc_rope_dim(&c->rope, c->head_dim) != c->head_dim)
        decoder_append(extra, sizeof extra,
                       ", RoPE on %" PRId64 " of each head's %" PRId64 " dimensions",
                       regc_rope_dim(&c->rope, c->head_dim), c->head_dim);
    if (c->parallel != PARALLEL_NONE)
        decoder_append(extra, sizeof extra, ", attention and MLP in parallel");
    if (f->qkv_per_head)
        decoder_append(extra, sizeof extra, ", q/k/v fused head by head");
    if (f->head_bias)
        decoder_append(extra, sizeof extra, ", head bias");
    if (f->norms != NORMS_BEFORE)
        decoder_append(extra, sizeof extra, ", norms %s each block",
                       f->norms == NORMS_AFTER ? "after" : "before and after");
    if (f->norm_offset)
        decoder_append(extra, sizeof extra, ", norms by 1 + w, embeddings times sqrt(hidden_size)");
    if (f->fused)
        decoder_append(extra, sizeof extra, ", fused qkv%s", f->plain_mlp ? "" : " and gate_up");
    if (f->gemma)
        decoder_append(extra, sizeof extra, ", query_pre_attn_scalar %g", c->query_scalar);
    if (c->attn_softcap > 0.0)
        decoder_append(extra, sizeof extra, ", attn_logit_softcapping %g", c->attn_softcap);
    if (c->final_softcap > 0.0)
        decoder_append(extra, sizeof extra, ", final_logit_softcapping %g", c->final_softcap);
    if (f->granite)
        decoder_append(extra, sizeof extra,
                       ", embedding_multiplier %g, residual_multiplier %g, attention_multiplier "
                       "%g, logits_scaling %g",
                       c->embed_mult, c->resid_mult, c->attn_mult, c->logits_scaling);
    if (f->nope) {
        int64_t n = 0;
        for (int64_t l = 0; l < c->n_layer; l++)
            n += (c->layer[l] & LAYER_NOPE) != 0;
        decoder_append(extra, sizeof extra, ", no RoPE on %" PRId64 " of %" PRId64 " layers", n,
                       c->n_layer);
    }
    if (c->window > 0) {
        int64_t n = 0;
        for (int64_t l = 0; l < c->n_layer; l++)
            n += (c->layer[l] & LAYER_SLIDING) != 0;
        decoder_append(extra, sizeof extra,
                       ", sliding_window %" PRId64 " on %" PRId64 " of %" PRId64 " layers",
                       c->window, n, c->n_layer);
    }
    if (c->pad >= 0)
        decoder_append(extra, sizeof extra, ", pad_token_id %" PRId64 " (no gradient)", c->pad);
    char drop[96] = "";
    if (f->resid_dropout_key)
        decoder_append(drop, sizeof drop, ", %s %g", f->resid_dropout_key, c->resid_dropout);
    if (f->embed_dropout_key && !decoder_same_key(f->embed_dropout_key, f->resid_dropout_key))
        decoder_append(drop, sizeof drop, ", %s %g", f->embed_dropout_key, c->embed_dropout);
    snprintf(buf, cap,
             "%s %s: vocab %" PRId64 ", max_position_embeddings %" PRId64 ", hidden_size %" PRId64
             ", intermediate_size %" PRId64 ", num_hidden_layers %" PRId64
             ", num_attention_heads %" PRId64 ", num_key_value_heads %" PRId64 ", head_dim %" PRId64
             ", %s %g, rope_theta %g%s, %s%s, %s embeddings, %s parameters%s; "
             "attention_dropout %g%s %s",
             m->arch->model_type, m->source, c->vocab, c->n_pos, c->hidden, c->inter, c->n_layer,
             c->n_head, c->n_kv_head, c->head_dim, decoder_eps_key(f), c->eps, c->rope.theta, rope,
             c->act_name[0] ? c->act_name : decoder_act_name(c->act), extra,
             c->tied ? "tied" : "untied", count, m->weights ? "" : " (shape only)", c->attn_dropout,
             drop, regc_model_dropout_note(m));
}
