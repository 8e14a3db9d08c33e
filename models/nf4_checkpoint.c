/* nf4_checkpoint.c — reading a checkpoint Transformers saved from a model
 * loaded in 4 bits (BitsAndBytesConfig: load_in_4bit, nf4, double
 * quantisation; `save_pretrained` of the quantised model).
 *
 * Its config.json has a "quantization_config" object: regc accepts the one
 * it can honour (quant_method bitsandbytes, load_in_4bit, nf4, double
 * quantisation, compute in float32 or bfloat16, uint8 storage) and refuses
 * any other by its key. Such a model's linear layers are NF4 whatever the
 * LoRA configuration says, as Transformers loads them (regc_model_add_lora
 * reads regc_model_checkpoint_nf4).
 *
 * In model.safetensors each quantised Linear's weight is six tensors:
 *
 *   W                                  U8  [ceil(n / 2), 1]  the packed nibbles
 *   W.absmax                           U8  [blocks]          the 8-bit absmax codes
 *   W.nested_absmax                    F32 [nested_blocks]
 *   W.quant_map                        F32 [16]              the NF4 levels
 *   W.nested_quant_map                 F32 [256]             the dynamic map
 *   W.quant_state.bitsandbytes__nf4    U8  [len]             JSON: quant_type, blocksize,
 *                                                            dtype, shape, nested_blocksize,
 *                                                            nested_offset, nested_dtype
 *
 * They are exactly kernels/nf4_format.h's blob in pieces (the offset is the
 * JSON's nested_offset, an fp32 value written as a double that holds it
 * exactly), so the blob is assembled from them with no quantisation: a
 * checkpoint's bytes are the frozen block's. Binding checks everything
 * the bytes' meaning depends on (the tables bit for bit, the block sizes,
 * the shape against the model's parameter, every tensor's dtype and size)
 * when the source opens, so a bad file fails before any data is read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "regc_backend.h"

/* ---------------------------------------------------------------- config.json */

/* A string key of quantization_config, one of `allowed` (absent: dflt,
 * Transformers' default), else an error naming it and why. */
static int qc_string(const cJSON *q, const char *path, const char *key, const char *dflt,
                     const char *const *allowed, const char *why, const char **out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(q, key);
    if (!it || cJSON_IsNull(it))
        *out = dflt;
    else if (cJSON_IsString(it))
        *out = it->valuestring;
    else
        return regc_error(REGC_ERR_FORMAT, "%s: key \"quantization_config.%s\" must be a string",
                          path, key);
    for (const char *const *a = allowed; *a; a++)
        if (*out && !strcmp(*out, *a))
            return REGC_OK;
    return regc_error(REGC_ERR_UNSUPPORTED, "%s: key \"quantization_config.%s\" is \"%s\" (%s)",
                      path, key, *out ? *out : "absent", why);
}

static int qc_bool(const cJSON *q, const char *path, const char *key, int dflt, int *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(q, key);
    if (!it || cJSON_IsNull(it))
        *out = dflt;
    else if (cJSON_IsBool(it))
        *out = cJSON_IsTrue(it);
    else
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"quantization_config.%s\" must be true or false", path, key);
    return REGC_OK;
}

int regc_nf4_read_quantization_config(regc_model *m, const cJSON *root, const char *path)
{
    m->checkpoint_nf4 = 0;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!q || cJSON_IsNull(q))
        return REGC_OK;
    if (!cJSON_IsObject(q))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"quantization_config\" must be an object",
                          path);
    static const char *const bnb[] = {"bitsandbytes", NULL}, *const nf4[] = {"nf4", NULL},
                             *const compute[] = {"float32", "bfloat16", NULL},
                             *const storage[] = {"uint8", NULL};
    const char *s = NULL;
    int in8 = 0, in4 = 0, dq = 0, rc;
    /* Transformers' defaults where a key is absent (BitsAndBytesConfig's:
     * fp4, no double quantisation, float32 products) */
    if ((rc = qc_string(q, path, "quant_method", "bitsandbytes", bnb,
                        "regc reads bitsandbytes' 4-bit NF4 checkpoints only", &s)) ||
        (rc = qc_bool(q, path, "load_in_8bit", 0, &in8)) ||
        (rc = qc_bool(q, path, "load_in_4bit", 0, &in4)))
        return rc;
    if (in8)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"quantization_config.load_in_8bit\" is true (regc reads "
                          "bitsandbytes' 4-bit NF4 checkpoints only, not LLM.int8())",
                          path);
    if (!in4)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"quantization_config.load_in_4bit\" is not true (regc reads "
                          "bitsandbytes' 4-bit NF4 checkpoints only)",
                          path);
    if ((rc = qc_string(q, path, "bnb_4bit_quant_type", "fp4", nf4, "regc holds NF4 only, not fp4",
                        &s)) ||
        (rc = qc_bool(q, path, "bnb_4bit_use_double_quant", 0, &dq)))
        return rc;
    if (!dq)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"quantization_config.bnb_4bit_use_double_quant\" is not true "
                          "(regc holds NF4 with its absmaxes quantised again, as QLoRA does)",
                          path);
    if ((rc = qc_string(q, path, "bnb_4bit_quant_storage", "uint8", storage,
                        "regc reads the packed values as bytes", &s)) ||
        (rc = qc_string(q, path, "bnb_4bit_compute_dtype", "float32", compute,
                        "regc multiplies NF4 in float32 or as bfloat16 GEMMs do", &s)))
        return rc;
    /* the modules kept out of 4 bits: regc keeps the output head out, as
     * Transformers does by default, and no other */
    const cJSON *skip = cJSON_GetObjectItemCaseSensitive(q, "llm_int8_skip_modules"), *it;
    int only_head = !skip || cJSON_IsNull(skip) || cJSON_IsArray(skip);
    if (cJSON_IsArray(skip))
        cJSON_ArrayForEach (it, skip)
            only_head &= cJSON_IsString(it) && !strcmp(it->valuestring, "lm_head");
    if (!only_head)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"quantization_config.llm_int8_skip_modules\" names modules "
                          "other than lm_head (regc keeps only the output head out of NF4)",
                          path);
    m->checkpoint_nf4 = !strcmp(s, "bfloat16") ? REGC_FROZEN_NF4_BF16 : REGC_FROZEN_NF4;
    return REGC_OK;
}

int regc_model_checkpoint_nf4(const regc_model *m) { return m->checkpoint_nf4; }

int regc_model_check_nf4_trainable(const regc_model *m, int lora)
{
    if (!m->checkpoint_nf4 || lora)
        return REGC_OK;
    return regc_error(REGC_ERR_ARG,
                      "%s: config.json's quantization_config holds the base in 4 bits (NF4), "
                      "which cannot be trained: LoRA needed (lora.r, --lora-r or --adapter)",
                      m->source);
}

/* ---------------------------------------------------------------- tensors */

/* The quant state's tensors, in regc_nf4_tensors.extra's order. */
static const char *const nf4_suffix[REGC_NF4_EXTRA] = {
    ".absmax",
    ".nested_absmax",
    ".quant_map",
    ".nested_quant_map",
    ".quant_state.bitsandbytes__nf4",
};
enum { ABSMAX, NESTED, QUANT_MAP, NESTED_MAP, STATE };

size_t regc_nf4_state_base(const char *name)
{
    const size_t n = strlen(name);
    for (int k = 0; k < REGC_NF4_EXTRA; k++) {
        const size_t s = strlen(nf4_suffix[k]);
        if (n > s && !strcmp(name + n - s, nf4_suffix[k]))
            return n - s;
    }
    return 0;
}

/* Tensor `weight` + suffix k of f, of this dtype and shape, into q->extra[k]. */
static int nf4_find(const regc_st_file *f, const char *path, const char *weight, int k,
                    const char *dtype, int ndim, const int64_t *shape, regc_nf4_tensors *q)
{
    char name[700];
    snprintf(name, sizeof name, "%s%s", weight, nf4_suffix[k]);
    const int t = regc_st_find(f, name);
    if (t < 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: missing tensor %s (the 4-bit weight %s needs its quant state)", path,
                          name, weight);
    q->extra[k] = t;
    if (strcmp(regc_st_dtype(f, t), dtype) != 0)
        return regc_error(REGC_ERR_FORMAT, "%s: tensor %s has dtype %s, expected %s", path, name,
                          regc_st_dtype(f, t), dtype);
    return regc_st_check_shape(f, t, ndim, shape);
}

/* The quant state's JSON: what bitsandbytes quantised, and how. */
static int nf4_state(const regc_st_file *f, const char *path, const char *weight,
                     const regc_model_param *p, int compute_bf16, regc_nf4_tensors *q)
{
    char where[5000]; /* "file: tensor", what the messages name */
    snprintf(where, sizeof where, "%s: %s%s", path, weight, nf4_suffix[STATE]);
    const int t = q->extra[STATE];
    const int64_t len = regc_st_bytes(f, t);
    char *text = malloc((size_t)len + 1);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", where);
    int rc = regc_st_read_raw(f, t, "U8", len, text);
    cJSON *js = NULL;
    if (rc == REGC_OK) {
        text[len] = '\0';
        if (!(js = cJSON_ParseWithLength(text, (size_t)len)) || !cJSON_IsObject(js))
            rc = regc_error(REGC_ERR_FORMAT, "%s: not a JSON object", where);
    }
    free(text);
    const cJSON *it = NULL;
    int64_t v;
    const char *s;
    if (rc == REGC_OK && (rc = regc_cfg_string(js, where, "quant_type", 1, NULL, &s)) == REGC_OK &&
        strcmp(s, "nf4") != 0)
        rc =
            regc_error(REGC_ERR_UNSUPPORTED, "%s: quant_type is \"%s\" (regc holds nf4)", where, s);
    if (rc == REGC_OK && (rc = regc_cfg_int(js, where, "blocksize", 1, 0, 1, INT64_MAX, &v)) == 0 &&
        v != REGC_NF4_BLOCK)
        rc = regc_error(REGC_ERR_UNSUPPORTED, "%s: blocksize is %lld (regc's NF4 has %d)", where,
                        (long long)v, REGC_NF4_BLOCK);
    if (rc == REGC_OK &&
        (rc = regc_cfg_int(js, where, "nested_blocksize", 1, 0, 1, INT64_MAX, &v)) == 0 &&
        v != REGC_NF4_NESTED_BLOCK)
        rc = regc_error(REGC_ERR_UNSUPPORTED, "%s: nested_blocksize is %lld (regc's NF4 has %d)",
                        where, (long long)v, REGC_NF4_NESTED_BLOCK);
    if (rc == REGC_OK &&
        (rc = regc_cfg_string(js, where, "nested_dtype", 1, NULL, &s)) == REGC_OK &&
        strcmp(s, "float32") != 0)
        rc = regc_error(REGC_ERR_UNSUPPORTED, "%s: nested_dtype is \"%s\" (regc's is float32)",
                        where, s);
    /* bitsandbytes dequantises to the state's dtype before its product:
     * bfloat16 values in a float32 product are a rounding regc does not make */
    if (rc == REGC_OK && (rc = regc_cfg_string(js, where, "dtype", 1, NULL, &s)) == REGC_OK &&
        strcmp(s, "float32") != 0 && !(compute_bf16 && !strcmp(s, "bfloat16")))
        rc = regc_error(REGC_ERR_UNSUPPORTED,
                        "%s: dtype is \"%s\" (regc reads float32, or bfloat16 with "
                        "bnb_4bit_compute_dtype bfloat16)",
                        where, s);
    if (rc == REGC_OK &&
        !cJSON_IsNumber(it = cJSON_GetObjectItemCaseSensitive(js, "nested_offset")))
        rc = regc_error(REGC_ERR_FORMAT, "%s: missing or invalid \"nested_offset\"", where);
    if (rc == REGC_OK) {
        q->offset = (float)it->valuedouble;
        if (!isfinite(q->offset) || (double)q->offset != it->valuedouble)
            rc = regc_error(REGC_ERR_FORMAT, "%s: nested_offset %.17g is not a float32", where,
                            it->valuedouble);
    }
    /* the shape bitsandbytes quantised: the model's parameter's */
    it = rc == REGC_OK ? cJSON_GetObjectItemCaseSensitive(js, "shape") : NULL;
    int same = cJSON_IsArray(it) && cJSON_GetArraySize(it) == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) {
        const cJSON *x = cJSON_GetArrayItem(it, d);
        same = cJSON_IsNumber(x) && x->valuedouble == (double)p->shape[d];
    }
    if (rc == REGC_OK && !same) {
        /* an empty array is "[]" (it was appended to "missing": "missing[]") */
        char have[160] = "missing", want[160] = "[";
        if (cJSON_IsArray(it)) {
            snprintf(have, sizeof have, "[");
            for (int d = 0; d < cJSON_GetArraySize(it); d++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%.17g", d ? ", " : "",
                         cJSON_GetArrayItem(it, d)->valuedouble);
            snprintf(have + strlen(have), sizeof have - strlen(have), "]");
        }
        for (int d = 0; d < p->ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                     (long long)p->shape[d]);
        snprintf(want + strlen(want), sizeof want - strlen(want), "]");
        rc = regc_error(REGC_ERR_SHAPE, "%s: shape is %s, but the model's %s is %s", where, have,
                        p->name, want);
    }
    cJSON_Delete(js);
    return rc;
}

int regc_nf4_bind(const regc_st_file *f, const char *path, int t, const regc_model_param *p,
                  int compute_bf16, regc_nf4_tensors *q)
{
    const char *weight = regc_st_name(f, t);
    const regc_nf4_layout_t l = regc_nf4_layout(p->numel);
    const int64_t packed[2] = {(p->numel + 1) / 2, 1}, blocks[1] = {l.blocks},
                  nested[1] = {l.nested_blocks}, levels[1] = {16}, dynamic[1] = {256};
    float map16[16], map256[256];
    q->weight = t;
    /* the state first: what the other tensors' sizes mean depends on it */
    char name[700];
    snprintf(name, sizeof name, "%s%s", weight, nf4_suffix[STATE]);
    q->extra[STATE] = regc_st_find(f, name);
    if (q->extra[STATE] < 0)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: missing tensor %s (the 4-bit weight %s needs its quant state)", path,
                          name, weight);
    if (strcmp(regc_st_dtype(f, q->extra[STATE]), "U8") != 0)
        return regc_error(REGC_ERR_FORMAT, "%s: tensor %s has dtype %s, expected U8", path, name,
                          regc_st_dtype(f, q->extra[STATE]));
    int rc = nf4_state(f, path, weight, p, compute_bf16, q);
    if (rc == REGC_OK)
        rc = regc_st_check_shape(f, t, 2, packed);
    if (rc == REGC_OK)
        rc = nf4_find(f, path, weight, ABSMAX, "U8", 1, blocks, q);
    if (rc == REGC_OK)
        rc = nf4_find(f, path, weight, NESTED, "F32", 1, nested, q);
    if (rc == REGC_OK)
        rc = nf4_find(f, path, weight, QUANT_MAP, "F32", 1, levels, q);
    if (rc == REGC_OK)
        rc = nf4_find(f, path, weight, NESTED_MAP, "F32", 1, dynamic, q);
    if (rc == REGC_OK && (rc = regc_st_read_raw(f, q->extra[QUANT_MAP], "F32", 16, map16)) == 0 &&
        (rc = regc_st_read_raw(f, q->extra[NESTED_MAP], "F32", 256, map256)) == 0 &&
        (rc = regc_nf4_check_tables(map16, map256)) != REGC_OK)
        regc_error_prefix("%s: %s (tensors %s%s, %s%s)", path, weight, weight,
                          nf4_suffix[QUANT_MAP], weight, nf4_suffix[NESTED_MAP]);
    return rc;
}

int regc_nf4_read_blob(const regc_st_file *f, const regc_nf4_tensors *q, int64_t n, uint8_t *blob)
{
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    memcpy(blob, &q->offset, sizeof q->offset);
    int rc = regc_st_read_raw(f, q->extra[NESTED], "F32", l.nested_blocks, blob + l.nested_at);
    if (rc == REGC_OK)
        rc = regc_st_read_raw(f, q->extra[ABSMAX], "U8", l.blocks, blob + l.q8_at);
    if (rc == REGC_OK)
        rc = regc_st_read_raw(f, q->weight, "U8", (n + 1) / 2, blob + l.packed_at);
    return rc;
}
