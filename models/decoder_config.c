/* decoder_config.c — a decoder family's config.json read (every key its
 * tables in decoder.c apply: sizes, norms' epsilon, RoPE — Gemma 3's per
 * layer type, SmolLM3's layers without it, the rotated share under either
 * family's names —, biases, the gate's activation, the pad token, Gemma's
 * scale and soft-capping, which layers slide and by how much, the blocks
 * side by side or not, the dropouts) into a decoder_config.
 * decoder_write.c writes it back and describes it. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

#define DECODER_MAX_DIM 2147483647 /* ids are i32 and heads are int */

int decoder_set_config(regc_model *m, const decoder_config *c, const unsigned char *layer)
{
    decoder_config *copy = malloc(sizeof *copy + (size_t)c->n_layer);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    *copy = *c;
    if (!c->family->qk_norm_key) /* fixed by the family; else as config.json chose */
        copy->qk_norm = c->family->qk_norm;
    if (!c->family->parallel_key)
        copy->parallel = c->family->parallel;
    if (!c->family->qkv_bias_key)
        copy->qkv_bias = c->family->qkv_bias;
    for (int64_t l = 0; l < c->n_layer; l++)
        copy->layer[l] = layer ? layer[l] : c->window > 0 ? LAYER_SLIDING : 0;
    /* the layer's slots: the family's, less the optional ones the config leaves out */
    copy->n_slots = 0;
    for (int s = 0; s < N_SLOTS; s++)
        copy->slot_at[s] = -1;
    for (const int *s = c->family->slots; *s >= 0; s++) {
        int present = 1;
        if (*s == S_Q_BIAS || *s == S_K_BIAS || *s == S_V_BIAS || *s == S_QKV_BIAS)
            present = copy->qkv_bias || c->attn_bias;
        else if (*s == S_O_BIAS)
            present = c->attn_bias;
        else if (*s == S_GATE_BIAS || *s == S_UP_BIAS || *s == S_DOWN_BIAS)
            present = c->mlp_bias;
        else if (*s == S_Q_NORM || *s == S_K_NORM)
            present = copy->qk_norm != QK_NORM_NONE;
        else if (*s == S_Q_NORM_BIAS || *s == S_K_NORM_BIAS)
            present = copy->qk_norm != QK_NORM_NONE && c->family->layernorm;
        else if (*s == S_INPUT_NORM_BIAS)
            present = c->family->layernorm;
        else if (*s == S_POST_ATTN_NORM ||
                 *s == S_POST_ATTN_NORM_BIAS) /* one norm for both: none */
            present = copy->parallel != PARALLEL_ONE_NORM &&
                      (*s == S_POST_ATTN_NORM || c->family->layernorm);
        if (present)
            copy->slot_at[*s] = copy->n_slots++;
    }
    m->cfg = copy;
    m->vocab = c->vocab;
    m->max_seq = c->n_pos;
    return REGC_OK;
}

/* The family a model_type names (its regc_arch's description). */
static const decoder_family *family_of(const regc_model *m) { return m->arch->family; }

/* Layer l slides, or not. */
static void decoder_set_sliding(unsigned char *layer, int64_t l, int on)
{
    layer[l] = (unsigned char)(on ? layer[l] | LAYER_SLIDING : layer[l] & ~LAYER_SLIDING);
}

/* layer_types, when config.json gives it: layer l slides for each
 * "sliding_attention" (with a window to slide by); *given says whether it
 * was there. */
static int decoder_parse_layer_types(const cJSON *root, const char *path, const decoder_config *c,
                                     unsigned char *layer, int *given)
{
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    *given = types && !cJSON_IsNull(types);
    if (!*given)
        return REGC_OK;
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
        decoder_set_sliding(layer, l, c->window > 0 && s[0] == 's');
    }
    return REGC_OK;
}

/* SmolLM3's layers without RoPE: no_rope_layers, an entry per layer (or
 * more) that Transformers reads as true (RoPE) or false (none): a number
 * or a boolean; or else every no_rope_layer_interval-th layer without
 * (the interval unused, and free, when the list is given). */
static int decoder_parse_nope(const cJSON *root, const char *path, decoder_config *c,
                              unsigned char *layer)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "no_rope_layers");
    const int given = list && !cJSON_IsNull(list);
    int rc = regc_cfg_int(root, path, "no_rope_layer_interval", 0, 4, given ? 0 : 1,
                          DECODER_MAX_DIM, &c->nope_interval);
    if (rc < 0)
        return rc;
    if (!given) {
        for (int64_t l = 0; l < c->n_layer; l++)
            if ((l + 1) % c->nope_interval == 0)
                layer[l] |= LAYER_NOPE;
        return REGC_OK;
    }
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < c->n_layer)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"no_rope_layers\" must be a list of at least "
                          "num_hidden_layers (%" PRId64 ") entries, 1 (RoPE) or 0 (none)",
                          path, c->n_layer);
    int64_t l = 0;
    for (const cJSON *x = list->child; x && l < c->n_layer; x = x->next, l++) {
        if (!cJSON_IsNumber(x) && !cJSON_IsBool(x))
            return regc_error(REGC_ERR_FORMAT,
                              "%s: key \"no_rope_layers\" entry %" PRId64
                              " is not a number or a boolean (RoPE when true or nonzero)",
                              path, l);
        if (cJSON_IsFalse(x) || (cJSON_IsNumber(x) && x->valuedouble == 0.0))
            layer[l] |= LAYER_NOPE;
    }
    return REGC_OK;
}

/* The sliding windows: which layers slide, and by how much (0: none);
 * after decoder_parse_nope, which SmolLM3's windows follow. */
static int decoder_parse_windows(const cJSON *root, const char *path, decoder_config *c,
                                 unsigned char *layer)
{
    const decoder_family *f = c->family;
    int rc, given;
    if (f->window == WINDOW_NONE)
        return REGC_OK;
    /* null is no window; absent, Gemma's default of 4096 */
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (!(w && cJSON_IsNull(w)) &&
        (rc = regc_cfg_int(root, path, "sliding_window", 0, f->window == WINDOW_GEMMA ? 4096 : 0, 1,
                           INT64_MAX, &c->window)) < 0)
        return rc;
    switch (f->window) {
    case WINDOW_ALL:
        for (int64_t l = 0; l < c->n_layer; l++)
            decoder_set_sliding(layer, l, c->window > 0);
        return REGC_OK;
    case WINDOW_LAYERS:
    case WINDOW_NOPE:
        /* Qwen: use_sliding_window gates the window (Qwen2Config drops it
         * without); layer_types, or else the layers from max_window_layers
         * on, say which layers slide. SmolLM3: layer_types says, or else,
         * with use_sliding_window, the layers without RoPE slide (its
         * config derives layer_types so; its attention follows them) */
        if ((rc = regc_cfg_bool(root, path, "use_sliding_window", 0, 0, &c->use_sliding_window)) <
                0 ||
            (f->window == WINDOW_LAYERS &&
             (rc = regc_cfg_int(root, path, "max_window_layers", 0, 28, 0, INT64_MAX,
                                &c->max_window_layers)) < 0))
            return rc;
        if (!c->use_sliding_window && f->window == WINDOW_LAYERS)
            c->window = 0;
        if ((rc = decoder_parse_layer_types(root, path, c, layer, &given)) < 0 || given)
            return rc;
        for (int64_t l = 0; c->window > 0 && l < c->n_layer; l++)
            decoder_set_sliding(layer, l,
                                f->window == WINDOW_LAYERS
                                    ? l >= c->max_window_layers
                                    : c->use_sliding_window && (layer[l] & LAYER_NOPE) != 0);
        return REGC_OK;
    case WINDOW_GEMMA:
        /* layer_types, or every pattern-th layer full (Gemma 3's
         * sliding_window_pattern, either spelling; Gemma 2's 2) */
        c->window_pattern = f->window_pattern;
        if (f->gemma == 3 &&
            ((rc = regc_cfg_int(root, path, "_sliding_window_pattern", 0, c->window_pattern, 1,
                                INT64_MAX, &c->window_pattern)) < 0 ||
             (rc = regc_cfg_int(root, path, "sliding_window_pattern", 0, c->window_pattern, 1,
                                INT64_MAX, &c->window_pattern)) < 0))
            return rc;
        if ((rc = decoder_parse_layer_types(root, path, c, layer, &given)) < 0 || given)
            return rc;
        for (int64_t l = 0; c->window > 0 && l < c->n_layer; l++)
            decoder_set_sliding(layer, l, (l + 1) % c->window_pattern != 0);
        return REGC_OK;
    case WINDOW_NONE: break;
    }
    return REGC_OK;
}

/* The gate's activation from the family's key (hidden_act, or Gemma's
 * hidden_activation): the functions regc's kernels compute, under each of
 * Transformers' names for them (gelu_new, gelu_pytorch_tanh and gelu_fast
 * are the tanh form, in other orders of the same float operations;
 * gelu_python is the erf form, as gelu). */
static int decoder_parse_act(const cJSON *root, const char *path, decoder_config *c)
{
    static const struct {
        const char *name;
        act_kind act;
    } acts[] = {{"silu", ACT_SILU},          {"gelu_pytorch_tanh", ACT_GELU_TANH},
                {"gelu_new", ACT_GELU_TANH}, {"gelu_fast", ACT_GELU_TANH},
                {"gelu", ACT_GELU},          {"gelu_python", ACT_GELU},
                {"relu", ACT_RELU}};
    const char *key = c->family->act_key, *name = NULL;
    int rc = regc_cfg_string(root, path, key, 0, NULL, &name);
    if (rc < 0)
        return rc;
    c->act = c->family->act_default;
    if (!name)
        return REGC_OK;
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
        if (!strcmp(name, acts[i].name)) {
            c->act = acts[i].act;
            snprintf(c->act_name, sizeof c->act_name, "%s", acts[i].name); /* written back */
            return REGC_OK;
        }
    return regc_error(REGC_ERR_UNSUPPORTED,
                      "%s: key \"%s\" is \"%s\" (supported: silu, gelu_pytorch_tanh, gelu_new, "
                      "gelu_fast, gelu, gelu_python, relu)",
                      path, key, name);
}

/* A nullable positive number: 0 when null (or absent with no default). */
static int decoder_parse_cap(const cJSON *root, const char *path, const char *key, double dflt,
                             double *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = 0.0;
    if (it && cJSON_IsNull(it))
        return REGC_OK;
    int rc = regc_cfg_double(root, path, key, 0, dflt, 0.0, 1e30, out);
    if (rc == REGC_OK && it && !(*out > 0.0))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" is %g, must be positive (or null)", path,
                          key, *out);
    return rc;
}

/* Gemma's keys: the scores' scale, the soft-capping (Gemma 2's attention;
 * the logits of both, when set), bidirectional attention refused. */
static int decoder_parse_gemma(const cJSON *root, const char *path, decoder_config *c)
{
    const int g2 = c->family->gemma == 2;
    int bidi = 0, rc;
    if ((rc = regc_cfg_double(root, path, "query_pre_attn_scalar", 0, 256.0, 1e-30, 1e30,
                              &c->query_scalar)) < 0 ||
        (rc = decoder_parse_cap(root, path, "final_logit_softcapping", g2 ? 30.0 : 0.0,
                                &c->final_softcap)) < 0 ||
        (g2 && (rc = decoder_parse_cap(root, path, "attn_logit_softcapping", 50.0,
                                       &c->attn_softcap)) < 0))
        return rc;
    if (!g2 && (rc = regc_cfg_bool(root, path, "use_bidirectional_attention", 0, 0, &bidi)) < 0)
        return rc;
    if (bidi)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"use_bidirectional_attention\" = true is not supported "
                          "(regc's decoders attend causally)",
                          path);
    return REGC_OK;
}

/* One of Gemma 3's two RoPE configurations as rope.c reads them: `sub`, a
 * dictionary of rope_parameters (or NULL), its rope_theta defaulting to
 * theta; read through a root of its own so rope.c's rules apply. */
static int decoder_parse_rope_of(const cJSON *sub, double theta, const char *path,
                                 const char *which, int64_t n_pos, regc_rope *r)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *dict = sub ? cJSON_Duplicate(sub, 1) : cJSON_CreateObject();
    char where[512];
    snprintf(where, sizeof where, "%s (%s)", path, which);
    int ok = root && dict && cJSON_IsObject(dict) &&
             cJSON_AddItemToObject(root, "rope_parameters", dict);
    if (!ok)
        cJSON_Delete(dict);
    if (ok && !cJSON_GetObjectItemCaseSensitive(dict, "rope_type") &&
        !cJSON_GetObjectItemCaseSensitive(dict, "type"))
        ok = cJSON_AddStringToObject(dict, "rope_type", "default") != NULL;
    if (ok && !cJSON_GetObjectItemCaseSensitive(dict, "rope_theta"))
        ok = cJSON_AddNumberToObject(dict, "rope_theta", theta) != NULL;
    int rc = ok ? regc_rope_parse(root, where, n_pos, theta, 0.0, r)
             : sub && !cJSON_IsObject(sub)
                 ? regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be an object", path, which)
                 : regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    cJSON_Delete(root);
    return rc;
}

/* Gemma 3's RoPE: rope_parameters per layer type ("full_attention",
 * "sliding_attention"), or the older rope_theta (1e6) with rope_scaling
 * for the full layers and rope_local_base_freq (1e4) for the sliding
 * ones, as Gemma3TextConfig reads them. */
static int decoder_parse_gemma3_rope(const cJSON *root, const char *path, decoder_config *c)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    double theta, local;
    int rc;
    if ((rc = regc_cfg_double(root, path, "rope_theta", 0, 1e6, 1e-30, 1e30, &theta)) < 0 ||
        (rc = regc_cfg_double(root, path, "rope_local_base_freq", 0, 1e4, 1e-30, 1e30, &local)) < 0)
        return rc;
    if (params && !cJSON_IsNull(params)) {
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(params, "full_attention");
        const cJSON *slide = cJSON_GetObjectItemCaseSensitive(params, "sliding_attention");
        if (!cJSON_IsObject(params) ||
            cJSON_GetArraySize(params) != (full != NULL) + (slide != NULL))
            return regc_error(REGC_ERR_FORMAT,
                              "%s: key \"rope_parameters\" must hold \"full_attention\" and "
                              "\"sliding_attention\" for gemma3_text",
                              path);
        if ((rc = decoder_parse_rope_of(full, theta, path, "rope_parameters.full_attention",
                                        c->n_pos, &c->rope)) < 0)
            return rc;
        return decoder_parse_rope_of(slide, local, path, "rope_parameters.sliding_attention",
                                     c->n_pos, &c->rope_local);
    }
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if ((rc = decoder_parse_rope_of(scaling && !cJSON_IsNull(scaling) ? scaling : NULL, theta, path,
                                    "rope_scaling", c->n_pos, &c->rope)) < 0)
        return rc;
    return decoder_parse_rope_of(NULL, local, path, "rope_local_base_freq", c->n_pos,
                                 &c->rope_local);
}

static int decoder_parse_biases(const cJSON *root, const char *path, decoder_config *c)
{
    const decoder_family *f = c->family;
    int rc;
    c->attn_bias = f->bias_default, c->mlp_bias = f->mlp_bias_default;
    if (f->bias_key &&
        (rc = regc_cfg_bool(root, path, "attention_bias", 0, f->bias_default, &c->attn_bias)) < 0)
        return rc;
    if (f->mlp_bias_key &&
        (rc = regc_cfg_bool(root, path, "mlp_bias", 0, f->mlp_bias_default, &c->mlp_bias)) < 0)
        return rc;
    return REGC_OK;
}

/* pad_token_id: Transformers makes it the embedding's padding_idx, whose
 * row takes no gradient; null means none, absent the family's default. */
static int decoder_parse_pad(const cJSON *root, const char *path, decoder_config *c)
{
    if (c->family->pad_unused) { /* the key inert, written back as read */
        c->pad = -1;
        return REGC_OK;
    }
    return regc_cfg_pad_token(root, path, c->family->pad_default, c->vocab, &c->pad);
}

/* Granite's multipliers: any float32 number, 1 when absent; the logits
 * are divided by logits_scaling, which therefore may not be 0. */
static int decoder_parse_granite(const cJSON *root, const char *path, decoder_config *c)
{
    int rc;
    if ((rc = regc_cfg_double(root, path, "embedding_multiplier", 0, 1.0, -1e30, 1e30,
                              &c->embed_mult)) < 0 ||
        (rc = regc_cfg_double(root, path, "residual_multiplier", 0, 1.0, -1e30, 1e30,
                              &c->resid_mult)) < 0 ||
        (rc = regc_cfg_double(root, path, "attention_multiplier", 0, 1.0, -1e30, 1e30,
                              &c->attn_mult)) < 0 ||
        (rc = regc_cfg_double(root, path, "logits_scaling", 0, 1.0, -1e30, 1e30,
                              &c->logits_scaling)) < 0)
        return rc;
    if ((float)(1.0 / c->logits_scaling) == 0.0f || isinf((float)(1.0 / c->logits_scaling)))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"logits_scaling\" is %g: the logits are divided by it, so it "
                          "must be a nonzero float32 with a float32 reciprocal",
                          path, c->logits_scaling);
    return REGC_OK;
}

/* Gemma 3's sliding layers' RoPE against the head, named as such. */
static int decoder_check_local_rope(const decoder_config *c, const char *path)
{
    char where[512];
    snprintf(where, sizeof where, "%s (the sliding layers' RoPE)", path);
    return regc_rope_check_head(&c->rope_local, c->head_dim, where);
}

const char *decoder_eps_key(const decoder_family *f)
{
    return f->eps_key ? f->eps_key : "rms_norm_eps";
}

/* A q/k norm per head chosen by a key (Phi's qk_layernorm): a LayerNorm
 * sized hidden_size / num_attention_heads, as Transformers sizes it, so
 * the heads must be that wide. */
static int decoder_parse_qk_norm(const cJSON *root, const char *path, decoder_config *c)
{
    const char *key = c->family->qk_norm_key;
    int on, rc = regc_cfg_bool(root, path, key, 0, 0, &on);
    if (rc < 0)
        return rc;
    c->qk_norm = on ? QK_NORM_HEAD : QK_NORM_NONE;
    if (on && c->head_dim * c->n_head != c->hidden)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"%s\" with head_dim %" PRId64
                          ": Transformers sizes those norms hidden_size / num_attention_heads "
                          "(%" PRId64 "), which its heads must then be",
                          path, key, c->head_dim, c->hidden / c->n_head);
    return REGC_OK;
}

/* RoPE's base and rotated share under a family's own keys (GPT-NeoX's
 * rotary_emb_base, rotary_pct), checked by their names, then read on a
 * copy of config.json as rope_theta and partial_rotary_factor are (the
 * family ignores those two, and they are left out of the copy); a
 * dictionary's value that differs is refused as rope.c refuses it. */
static int decoder_parse_own_rope(const cJSON *root, const char *path, decoder_config *c,
                                  double theta)
{
    const decoder_family *f = c->family;
    static const char *const std[2] = {"rope_theta", "partial_rotary_factor"};
    const char *own[2] = {f->theta_key, f->partial_key};
    const cJSON *dict = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!cJSON_IsObject(dict))
        dict = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    double v;
    int rc;
    for (int i = 0; i < 2; i++) /* Transformers fails on None */
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, own[i])))
            return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" is null: give a number", path,
                              own[i]);
    if ((rc = regc_cfg_double(root, path, own[0], 0, theta, 1e-30, 1e30, &v)) < 0)
        return rc;
    for (int i = 0; i < 2; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, own[i]);
        if (!it)
            continue;
        if (!cJSON_IsNumber(it) || (i == 1 && !(it->valuedouble > 0.0 && it->valuedouble <= 1.0)))
            return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be a number%s", path, own[i],
                              i ? " in (0, 1]" : "");
        const cJSON *d =
            cJSON_IsObject(dict) ? cJSON_GetObjectItemCaseSensitive(dict, std[i]) : NULL;
        if (cJSON_IsNumber(d) && d->valuedouble != it->valuedouble)
            return regc_error(REGC_ERR_FORMAT,
                              "%s: keys \"%s\" (%g) and \"%s.%s\" (%g) differ (Transformers "
                              "takes the latter): give one",
                              path, own[i], it->valuedouble, dict->string, std[i], d->valuedouble);
    }
    cJSON *copy = cJSON_Duplicate(root, 1);
    int ok = copy != NULL;
    for (int i = 0; i < 2 && ok; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(copy, std[i]);
        cJSON *it = cJSON_DetachItemFromObjectCaseSensitive(copy, own[i]);
        if (it && !cJSON_IsNull(it))
            ok = cJSON_AddItemToObject(copy, std[i], it);
        else
            cJSON_Delete(it);
    }
    rc = ok ? regc_rope_parse(copy, path, c->n_pos, theta, f->partial_default, &c->rope)
            : regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    cJSON_Delete(copy);
    /* the share named as the file names it: the family's own key, where
     * that gave it rather than a dictionary */
    if (rc == REGC_OK && c->rope.partial_name && !strchr(c->rope.partial_name, '.'))
        c->rope.partial_name = f->partial_key;
    return rc;
}

/* RoPE as the family reads it. */
static int decoder_parse_rope(const cJSON *root, const char *path, decoder_config *c)
{
    const decoder_family *f = c->family;
    const double theta = f->theta_default ? f->theta_default : 10000.0;
    if (f->local_rope)
        return decoder_parse_gemma3_rope(root, path, c);
    if (f->phi3_rope)
        return regc_rope_parse_phi3(root, path, c->n_pos, f->partial_default, &c->rope);
    if (f->theta_key)
        return decoder_parse_own_rope(root, path, c, theta);
    return regc_rope_parse(root, path, c->n_pos, theta, f->partial_default, &c->rope);
}

/* The dropouts a family reads, by its keys. */
static int decoder_parse_dropouts(const cJSON *root, const char *path, decoder_config *c)
{
    const decoder_family *f = c->family;
    int rc;
    if (f->resid_dropout_key &&
        (rc = regc_cfg_dropout(root, path, f->resid_dropout_key, 0.0, &c->resid_dropout)) < 0)
        return rc;
    if (f->embed_dropout_key &&
        (rc = regc_cfg_dropout(root, path, f->embed_dropout_key, 0.0, &c->embed_dropout)) < 0)
        return rc;
    return REGC_OK;
}

int decoder_parse_config(regc_model *m, const cJSON *root, const char *path)
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
        (rc = regc_cfg_int(root, path, "num_key_value_heads", 0,
                           c.family->kv_heads_default ? c.family->kv_heads_default : c.n_head, 1,
                           DECODER_MAX_DIM, &c.n_kv_head)) < 0)
        return rc;
    /* HF derives head_dim when it is absent; a hidden size the heads do not
     * divide would then drop columns, so that needs an explicit head_dim. */
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if ((!hd || cJSON_IsNull(hd)) && c.hidden % c.n_head != 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: hidden_size %" PRId64 " is not divisible by num_attention_heads "
                          "%" PRId64 "%s",
                          path, c.hidden, c.n_head,
                          c.family->no_head_dim ? "" : " (give \"head_dim\" explicitly)");
    if ((rc = regc_cfg_int(root, path, "head_dim", 0, c.hidden / c.n_head, 1, DECODER_MAX_DIM,
                           &c.head_dim)) < 0 ||
        (rc = regc_cfg_int(root, path, "max_position_embeddings", 0,
                           c.family->n_pos_default ? c.family->n_pos_default : 2048, 1,
                           DECODER_MAX_DIM, &c.n_pos)) < 0 ||
        (rc = regc_cfg_double(root, path, decoder_eps_key(c.family), 0,
                              c.family->eps_key ? 1e-5 : 1e-6, 0.0, 1.0, &c.eps)) < 0 ||
        (rc = decoder_parse_rope(root, path, &c)) < 0 ||
        (rc = regc_rope_check_head(&c.rope, c.head_dim, path)) < 0 ||
        (c.family->local_rope && (rc = decoder_check_local_rope(&c, path)) < 0) ||
        (rc = regc_cfg_bool(root, path, "tie_word_embeddings", 0, c.family->tied_default,
                            &c.tied)) < 0 ||
        (rc = regc_cfg_dropout(root, path, "attention_dropout", 0.0, &c.attn_dropout)) < 0 ||
        (rc = decoder_parse_act(root, path, &c)) < 0 ||
        (rc = decoder_parse_biases(root, path, &c)) < 0 ||
        (rc = decoder_parse_pad(root, path, &c)) < 0)
        return rc;
    if (c.family->qkv_bias_key &&
        (rc = regc_cfg_bool(root, path, c.family->qkv_bias_key, 0, 0, &c.qkv_bias)) < 0)
        return rc;
    if ((rc = decoder_parse_dropouts(root, path, &c)) < 0 ||
        (c.family->qk_norm_key && (rc = decoder_parse_qk_norm(root, path, &c)) < 0))
        return rc;
    if (c.family->parallel_key) {
        int on;
        if ((rc = regc_cfg_bool(root, path, c.family->parallel_key, 0, c.family->parallel_default,
                                &on)) < 0)
            return rc;
        c.parallel = on ? c.family->parallel : PARALLEL_NONE;
    }
    if (c.family->gemma && (rc = decoder_parse_gemma(root, path, &c)) < 0)
        return rc;
    if (c.family->granite && (rc = decoder_parse_granite(root, path, &c)) < 0)
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
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" is %g, must be positive", path,
                          decoder_eps_key(c.family), c.eps);
    if (c.n_head * c.head_dim + 2 * c.n_kv_head * c.head_dim > DECODER_MAX_DIM ||
        2 * c.inter > DECODER_MAX_DIM)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: the projections (num_attention_heads * head_dim, "
                          "intermediate_size) are too large",
                          path);
    unsigned char *layer = calloc((size_t)c.n_layer, 1);
    if (!layer)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    rc = c.family->nope ? decoder_parse_nope(root, path, &c, layer) : REGC_OK;
    if (rc == REGC_OK)
        rc = decoder_parse_windows(root, path, &c, layer);
    if (rc == REGC_OK)
        rc = decoder_set_config(m, &c, layer);
    free(layer);
    return rc;
}
