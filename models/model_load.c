/* model_load.c — where models come from: built-in presets, Hugging Face
 * directories (config.json dispatched on model_type; weights read by
 * weights.c), and regc graph JSON files; and the config.json readers every architecture parses
 * with. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "model_internal.h"

/* The architectures a config.json's model_type selects. */
static const regc_arch *const model_archs[] = {
    &regc_arch_gpt2,     &regc_arch_llama,    &regc_arch_mistral, &regc_arch_qwen2,
    &regc_arch_qwen3,    &regc_arch_olmo2,    &regc_arch_phi3,    &regc_arch_gemma2,
    &regc_arch_gemma3,   &regc_arch_granite,  &regc_arch_smollm3, &regc_arch_phi,
    &regc_arch_gpt_neox, &regc_arch_stablelm, &regc_arch_bert,    &regc_arch_t5};
#define N_ARCHS (sizeof model_archs / sizeof model_archs[0])

/* The presets and the architecture each belongs to. */
static const struct {
    const char *name;
    const regc_arch *arch;
} presets[] = {
    {"gpt2-tiny", &regc_arch_gpt2},   {"gpt2-124m", &regc_arch_gpt2},
    {"llama-tiny", &regc_arch_llama}, {"llama-127m", &regc_arch_llama},
    {"llama-8b", &regc_arch_llama},   {"llama-70b", &regc_arch_llama},
    {"bert-tiny", &regc_arch_bert},   {"bert-base", &regc_arch_bert},
    {"t5-tiny", &regc_arch_t5},       {"t5-small", &regc_arch_t5},
};
#define N_PRESETS (int)(sizeof presets / sizeof presets[0])

/* ------------------------------------------------------ config readers */

/* Keys any Hugging Face config.json may hold, whatever the architecture. */
static const regc_config_key shared_keys[] = {
    {"model_type", REGC_KEY_APPLIED, NULL, NULL},
    {"quantization_config", REGC_KEY_APPLIED, NULL, NULL},
    {"architectures", REGC_KEY_INERT, NULL,
     "regc trains the architecture's language-model head, whatever class it names"},
    {"transformers_version", REGC_KEY_INERT, NULL, "the version that wrote the file"},
    {"torch_dtype", REGC_KEY_INERT, NULL,
     "the tensors are read in the dtype the checkpoint stores; compile.precision sets the "
     "arithmetic"},
    {"dtype", REGC_KEY_INERT, NULL, "as torch_dtype, Transformers 5's spelling"},
    {"use_cache", REGC_KEY_INERT, NULL, "a key/value cache for generation; training keeps none"},
    {"bos_token_id", REGC_KEY_INERT, NULL, "generation's; training reads the token file as it is"},
    {"eos_token_id", REGC_KEY_INERT, NULL, "generation's; training reads the token file as it is"},
    {"pad_token_id", REGC_KEY_INERT, NULL,
     "padding's; regc's batches are unpadded windows of the token file"},
    {"initializer_range", REGC_KEY_INERT, NULL,
     "random initialisation's; a checkpoint's weights are read as they are"},
    {"_name_or_path", REGC_KEY_INERT, NULL, "where the model came from"},
    {"output_attentions", REGC_KEY_INERT, NULL, "what the forward returns, not what it computes"},
    {"output_hidden_states", REGC_KEY_INERT, NULL,
     "what the forward returns, not what it computes"},
    {"return_dict", REGC_KEY_INERT, NULL, "what the forward returns, not what it computes"},
    {"id2label", REGC_KEY_INERT, NULL, "a classification head's, which regc does not build"},
    {"label2id", REGC_KEY_INERT, NULL, "a classification head's, which regc does not build"},
    {"tokenizer_class", REGC_KEY_INERT, NULL, "the tokenizer's; regc reads token ids"},
    {"auto_map", REGC_KEY_INERT, NULL, "where remote code lives; regc builds the model itself"},
    {"attn_implementation", REGC_KEY_INERT, NULL,
     "which attention kernel Transformers runs; every one computes the same attention"},
    {NULL, 0, NULL, NULL},
};

const char *regc_model_type_name(int i)
{
    return i >= 0 && (size_t)i < N_ARCHS ? model_archs[i]->model_type : NULL;
}

int regc_model_config_keys(const char *model_type, const regc_config_key **tables, int cap)
{
    for (size_t i = 0; i < N_ARCHS; i++) {
        if (strcmp(model_archs[i]->model_type, model_type) != 0 || !model_archs[i]->config_keys)
            continue;
        int n = 0;
        for (const regc_config_key *const *t = model_archs[i]->config_keys; *t && n < cap - 2; t++)
            tables[n++] = *t;
        tables[n++] = shared_keys;
        tables[n] = NULL;
        return n;
    }
    return 0;
}

/* Inert keys that describe the file rather than the model: the saved
 * model's own take their place. */
static const char *const file_keys[] = {"architectures", "transformers_version", "torch_dtype",
                                        "dtype"};

static const regc_config_key *find_key(const regc_config_key *const *tables, const char *key)
{
    for (int t = 0; tables[t]; t++)
        for (const regc_config_key *k = tables[t]; k->key; k++)
            if (strcmp(k->key, key) == 0)
                return k;
    return NULL;
}

/* Every key of root against the architecture's tables: one no table names,
 * or a REFUSED one with other than its neutral value, is an error naming
 * it (a key that would change the model must never be passed over). The
 * inert keys but file_keys are copied into *inert, for the model to write
 * back when it is saved (a tokenizer's ids, generation's settings). */
static int cfg_check_keys(const cJSON *root, const char *path, const regc_arch *arch, cJSON **inert)
{
    const regc_config_key *tables[8];
    *inert = NULL;
    if (!arch->config_keys || regc_model_config_keys(arch->model_type, tables, 8) == 0)
        return REGC_OK;
    int rc = REGC_OK;
    for (const cJSON *it = root->child; it && rc == REGC_OK; it = it->next) {
        const regc_config_key *found = find_key(tables, it->string);
        if (!found) {
            rc = regc_error(REGC_ERR_UNSUPPORTED,
                            "%s: key \"%s\" is not one regc knows for model_type \"%s\" (it "
                            "might change the model; remove it if Transformers ignores it)",
                            path, it->string, arch->model_type);
        } else if (found->use == REGC_KEY_REFUSED) {
            cJSON *neutral = found->neutral ? cJSON_Parse(found->neutral) : NULL;
            const int same = neutral && cJSON_Compare(it, neutral, 1);
            cJSON_Delete(neutral);
            if (!same)
                rc = regc_error(REGC_ERR_UNSUPPORTED, "%s: key \"%s\" is not supported: %s%s%s%s",
                                path, it->string, found->why, found->neutral ? " (allowed: " : "",
                                found->neutral ? found->neutral : "", found->neutral ? ")" : "");
        } else if (found->use == REGC_KEY_INERT) {
            int file_key = 0;
            for (size_t i = 0; i < sizeof file_keys / sizeof *file_keys; i++)
                file_key |= !strcmp(it->string, file_keys[i]);
            if (file_key)
                continue;
            cJSON *copy = cJSON_Duplicate(it, 1);
            if (!*inert)
                *inert = cJSON_CreateObject();
            if (!copy || !*inert || !cJSON_AddItemToObject(*inert, it->string, copy)) {
                cJSON_Delete(copy);
                rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
            }
        }
    }
    if (rc != REGC_OK) {
        cJSON_Delete(*inert);
        *inert = NULL;
    }
    return rc;
}

static const cJSON *cfg_item(const cJSON *root, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(root, key);
}

int regc_cfg_int(const cJSON *root, const char *path, const char *key, int required, int64_t dflt,
                 int64_t lo, int64_t hi, int64_t *out)
{
    const cJSON *it = cfg_item(root, key);
    if (!it || (cJSON_IsNull(it) && !required)) {
        if (required)
            return regc_error(REGC_ERR_FORMAT, "%s: missing required key \"%s\"", path, key);
        *out = dflt;
        return REGC_OK;
    }
    double d = cJSON_IsNumber(it) ? it->valuedouble : 0.5;
    if (!cJSON_IsNumber(it) || !(d >= -9e15 && d <= 9e15) || d != (double)(int64_t)d)
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be an integer", path, key);
    int64_t v = (int64_t)d;
    if (v < lo || v > hi)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"%s\" is %" PRId64 ", expected %" PRId64 " to %" PRId64, path,
                          key, v, lo, hi);
    *out = v;
    return REGC_OK;
}

int regc_cfg_pad_token(const cJSON *root, const char *path, int64_t dflt, int64_t vocab,
                       int64_t *pad)
{
    const cJSON *it = cfg_item(root, "pad_token_id");
    *pad = -1;
    if (it && cJSON_IsNull(it)) /* Transformers: no padding_idx */
        return REGC_OK;
    int64_t v = dflt;
    int rc =
        it ? regc_cfg_int(root, path, "pad_token_id", 0, dflt, INT64_MIN / 2, INT64_MAX / 2, &v)
           : REGC_OK;
    if (rc < 0 || (!it && dflt < 0))
        return rc;
    /* torch's padding_idx: a negative one counts from the end */
    if (v < -vocab || v >= vocab)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"pad_token_id\" is %" PRId64 "%s, not within the vocabulary "
                          "(-%" PRId64 " to %" PRId64
                          ": Transformers' embedding refuses it too; give it explicitly, or null)",
                          path, v, it ? "" : " (the architecture's default)", vocab, vocab - 1);
    *pad = v < 0 ? v + vocab : v;
    return REGC_OK;
}

int regc_cfg_double(const cJSON *root, const char *path, const char *key, int required, double dflt,
                    double lo, double hi, double *out)
{
    const cJSON *it = cfg_item(root, key);
    if (!it || (cJSON_IsNull(it) && !required)) {
        if (required)
            return regc_error(REGC_ERR_FORMAT, "%s: missing required key \"%s\"", path, key);
        *out = dflt;
        return REGC_OK;
    }
    if (!cJSON_IsNumber(it))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be a number", path, key);
    double v = it->valuedouble;
    if (!(v >= lo && v <= hi))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" is %g, expected %g to %g", path, key, v,
                          lo, hi);
    *out = v;
    return REGC_OK;
}

int regc_cfg_dropout(const cJSON *root, const char *path, const char *key, double dflt, double *out)
{
    int rc = regc_cfg_double(root, path, key, 0, dflt, 0.0, 1.0, out);
    if (rc == REGC_OK && *out >= 1.0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"%s\" is %g, expected a dropout probability below 1 (1 "
                          "drops every element)",
                          path, key, *out);
    return rc;
}

int regc_cfg_bool(const cJSON *root, const char *path, const char *key, int required, int dflt,
                  int *out)
{
    const cJSON *it = cfg_item(root, key);
    if (!it || (cJSON_IsNull(it) && !required)) {
        if (required)
            return regc_error(REGC_ERR_FORMAT, "%s: missing required key \"%s\"", path, key);
        *out = dflt;
        return REGC_OK;
    }
    if (!cJSON_IsBool(it))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return REGC_OK;
}

int regc_cfg_string(const cJSON *root, const char *path, const char *key, int required,
                    const char *dflt, const char **out)
{
    const cJSON *it = cfg_item(root, key);
    if (!it || (cJSON_IsNull(it) && !required)) {
        if (required)
            return regc_error(REGC_ERR_FORMAT, "%s: missing required key \"%s\"", path, key);
        *out = dflt;
        return REGC_OK;
    }
    if (!cJSON_IsString(it))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be a string", path, key);
    *out = it->valuestring;
    return REGC_OK;
}

/* ------------------------------------------------------------- loading */

int regc_model_is_preset(const char *spec)
{
    for (int i = 0; i < N_PRESETS; i++)
        if (strcmp(spec, presets[i].name) == 0)
            return 1;
    return 0;
}

const char *regc_model_preset_name(int i)
{
    return i >= 0 && i < N_PRESETS ? presets[i].name : NULL;
}

static int model_from_preset(const char *name, regc_model **out)
{
    for (int i = 0; i < N_PRESETS; i++) {
        if (strcmp(name, presets[i].name) != 0)
            continue;
        regc_model *m = NULL;
        int rc = regc_model_new(presets[i].arch, name, &m);
        if (rc < 0)
            return rc;
        if ((rc = m->arch->preset_config(m, name)) < 0 || (rc = m->arch->list_params(m)) < 0) {
            regc_model_free(m);
            return rc;
        }
        *out = m;
        return REGC_OK;
    }
    return regc_error(REGC_ERR_ARG, "%s: not a preset", name);
}

/* Upper bounds on the sizes a config.json gives, whatever the architecture
 * (each key is checked where present, before the architecture reads it):
 * a parameter list grows with the layers and a graph with every size, so an
 * absurd value would allocate until memory runs out before anything else
 * could fail. Each bound is far above any published model (Llama 3.1 405B:
 * 126 layers, hidden 16384, intermediate 53248, 128 heads; the largest
 * vocabularies are about 256K; contexts reach a few million positions). */
static const struct {
    const char *key;
    int64_t max;
} cfg_bounds[] = {
    {"n_layer", 4096},
    {"num_hidden_layers", 4096},
    {"num_layers", 4096},
    {"num_decoder_layers", 4096},
    {"n_embd", INT64_C(1) << 17},
    {"hidden_size", INT64_C(1) << 17},
    {"d_model", INT64_C(1) << 17},
    {"d_kv", INT64_C(1) << 17},
    {"head_dim", INT64_C(1) << 17},
    {"n_inner", INT64_C(1) << 20},
    {"intermediate_size", INT64_C(1) << 20},
    {"d_ff", INT64_C(1) << 20},
    {"n_head", INT64_C(1) << 14},
    {"num_attention_heads", INT64_C(1) << 14},
    {"num_key_value_heads", INT64_C(1) << 14},
    {"num_heads", INT64_C(1) << 14},
    {"vocab_size", INT64_C(1) << 24},
    {"type_vocab_size", INT64_C(1) << 24},
    {"n_positions", INT64_C(1) << 24},
    {"max_position_embeddings", INT64_C(1) << 24},
    {"relative_attention_num_buckets", INT64_C(1) << 16},
    {"relative_attention_max_distance", INT64_C(1) << 24},
};

static int cfg_check_bounds(const cJSON *root, const char *path)
{
    for (size_t i = 0; i < sizeof cfg_bounds / sizeof cfg_bounds[0]; i++) {
        const cJSON *it = cfg_item(root, cfg_bounds[i].key);
        /* other faults (not a number, not whole, too small) are the
         * architecture's to report, with its own range */
        if (cJSON_IsNumber(it) && it->valuedouble > (double)cfg_bounds[i].max)
            return regc_error(REGC_ERR_FORMAT,
                              "%s: key \"%s\" is %.17g, above the bound of %" PRId64
                              " (no model regc can train is that large)",
                              path, cfg_bounds[i].key, it->valuedouble, cfg_bounds[i].max);
    }
    return REGC_OK;
}

int regc_model_config_parse(const char *text, size_t len, const char *path, const char *dir,
                            regc_model **out)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root)
        return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON near byte %zu", path,
                          (size_t)(end ? end - text : 0));
    regc_model *m = NULL;
    const char *type = NULL;
    int rc;
    if (!cJSON_IsObject(root)) {
        rc = regc_error(REGC_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }
    if ((rc = regc_cfg_string(root, path, "model_type", 1, NULL, &type)) < 0)
        goto done;
    const regc_arch *arch = NULL;
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strcmp(type, model_archs[i]->model_type) == 0)
            arch = model_archs[i];
    if (!arch) {
        char list[256] = "";
        for (size_t i = 0; i < N_ARCHS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     model_archs[i]->model_type);
        rc = regc_error(REGC_ERR_UNSUPPORTED, "%s: unsupported model_type \"%s\" (supported: %s)",
                        path, type, list);
        goto done;
    }
    cJSON *inert = NULL;
    if ((rc = cfg_check_bounds(root, path)) < 0 ||
        (rc = cfg_check_keys(root, path, arch, &inert)) < 0)
        goto done;
    if ((rc = regc_model_new(arch, dir, &m)) < 0) {
        cJSON_Delete(inert);
        goto done;
    }
    m->inert_keys = inert;
    if ((rc = arch->parse_config(m, root, path)) < 0 || (rc = arch->list_params(m)) < 0 ||
        (rc = regc_nf4_read_quantization_config(m, root, path)) < 0) {
        regc_model_free(m);
        m = NULL;
    }
done:
    cJSON_Delete(root);
    *out = m;
    return rc;
}

int regc_model_load_config(const char *dir, regc_model **out)
{
    *out = NULL;
    char path[4096];
    int rc = regc_path_join(path, sizeof path, dir, "config.json");
    if (rc < 0)
        return rc;
    char *text = NULL;
    size_t len = 0;
    if ((rc = regc_file_read_all(path, &text, &len)) < 0)
        return rc;
    rc = regc_model_config_parse(text, len, path, dir, out);
    free(text);
    return rc;
}

static int model_load_weights(regc_model *m, const char *dir)
{
    regc_weights *w = NULL;
    int rc = regc_weights_open(m, dir, "", &w);
    if (rc == REGC_OK)
        rc = regc_model_read_weights(m, w);
    regc_weights_close(w);
    return rc;
}

/* A graph JSON is named by a file path ending in ".json"; a directory so
 * named is still a Hugging Face directory. */
static int is_graph_json(const char *spec)
{
    size_t n = strlen(spec);
    struct stat st;
    return n > 5 && strcmp(spec + n - 5, ".json") == 0 &&
           !(stat(spec, &st) == 0 && S_ISDIR(st.st_mode));
}

static int model_from_graph_json(const char *path, regc_model **out)
{
    regc_model *m = NULL;
    int rc = regc_model_new(&regc_arch_graph, path, &m);
    if (rc < 0)
        return rc;
    if ((rc = regc_graph_model_read(m, path)) < 0) {
        regc_model_free(m);
        return rc;
    }
    *out = m;
    return REGC_OK;
}

int regc_model_load_shapes(const char *spec, regc_model **out)
{
    *out = NULL;
    if (regc_model_is_preset(spec))
        return model_from_preset(spec, out);
    if (is_graph_json(spec))
        return model_from_graph_json(spec, out);
    struct stat st;
    if (stat(spec, &st) != 0 || !S_ISDIR(st.st_mode))
        return regc_model_load(spec, out); /* for its message */
    return regc_model_load_config(spec, out);
}

int regc_model_read_safetensors(regc_model *m, const char *path)
{
    return model_load_weights(m, path);
}

/* A preset name wins over a directory of the same name; "./gpt2-tiny" loads
 * the directory. */
int regc_model_load(const char *spec, regc_model **out)
{
    *out = NULL;
    if (regc_model_is_preset(spec))
        return model_from_preset(spec, out);
    if (is_graph_json(spec))
        return model_from_graph_json(spec, out);
    struct stat st;
    if (stat(spec, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char list[256] = "";
        for (int i = 0; i < N_PRESETS; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     presets[i].name);
        return regc_error(REGC_ERR_ARG, "%s: not a model directory or a preset (presets: %s)", spec,
                          list);
    }
    regc_model *m;
    int rc = regc_model_load_config(spec, &m);
    if (rc < 0)
        return rc;
    if ((rc = model_load_weights(m, spec)) < 0) {
        regc_model_free(m);
        return rc;
    }
    *out = m;
    return REGC_OK;
}
