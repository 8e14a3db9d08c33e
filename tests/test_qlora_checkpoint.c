/* test_qlora_checkpoint.c — a checkpoint Transformers saved from a model
 * loaded in 4 bits (tests/data/qlora_checkpoint/, written by
 * tools/reference/qlora_checkpoint_reference.py: the tiny Llama of
 * lora_reference.json's "qlora_cases"[0] loaded with BitsAndBytesConfig
 * nf4, double quantisation, then save_pretrained) read as the NF4 base it
 * holds.
 *
 * Properties: every quantised weight's blob, assembled from the
 * checkpoint's tensors, is the bytes regc quantises the fp32 base to (and
 * every other tensor the base's values); so training the checkpoint with
 * LoRA gives bit for bit the losses of the fp32 base with --load-in-4bit
 * on, and its quantization_config's bnb_4bit_compute_dtype bfloat16 those
 * of --bnb-4bit-compute-dtype bfloat16. Refused in one line naming the
 * tensor or key, exit 1: a missing quant-state tensor, tables that are not
 * NF4's, a quantised shape that is not the model's, a quantization_config
 * regc cannot honour, the base trained without LoRA. Each bad checkpoint
 * is the good one edited in a temporary directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_graph.h"
#include "regc_models.h"
#include "test_reference.h"
#include "test_train_case.h"
#include "test_util.h"

#define CHECKPOINT REGC_SOURCE_DIR "/tests/data/qlora_checkpoint"
#define ADAPTER REGC_SOURCE_DIR "/tests/data/lora/llama_qv"
#define STEPS 4
#define N_QUANTISED 14 /* every linear layer of the two blocks, not the head */

/* ---------------------------------------------------------------- the same bytes */

/* The checkpoint's model with PEFT's adapter on it, shapes only. */
static regc_model *lora_shapes(const char *dir)
{
    regc_model *m = NULL;
    regc_lora_config c;
    char targets[1024];
    if (regc_model_load_shapes(dir, &m) != REGC_OK ||
        regc_lora_read_config(ADAPTER, &c, targets, sizeof targets) != REGC_OK ||
        regc_model_add_lora(m, &c) != REGC_OK)
        fail_msg("%s: %s", dir, regc_error_message());
    return m;
}

/* Every NF4 weight's blob read from the checkpoint is the fp32 base's
 * quantised by regc; every other tensor reads as the base's values. */
static void check_same_bytes(regc_test_train_case *c)
{
    regc_model *q = lora_shapes(CHECKPOINT), *base = NULL;
    assert_int_equal(regc_model_checkpoint_nf4(q), REGC_FROZEN_NF4);
    if (regc_model_load(c->model_dir, &base) != REGC_OK)
        fail_msg("%s", regc_error_message());
    regc_weights *w = NULL;
    if (regc_weights_open(q, CHECKPOINT, "", &w) != REGC_OK)
        fail_msg("%s", regc_error_message());
    int quantised = 0;
    for (int i = 0; i < regc_model_n_params(q); i++) {
        const char *name = regc_model_param_name(q, i);
        const int kind = regc_model_param_frozen(q, i);
        if (!kind) /* an adapter */
            continue;
        int b = 0;
        while (b < regc_model_n_params(base) && strcmp(regc_model_param_name(base, b), name))
            b++;
        assert_true(b < regc_model_n_params(base));
        const int64_t n = regc_model_param_numel(q, i);
        const float *want = regc_model_weights(base) + regc_model_param_offset(base, b);
        if (kind != REGC_FROZEN_NF4) {
            assert_false(regc_weights_is_nf4(w, i));
            float *got = malloc((size_t)n * sizeof *got);
            assert_non_null(got);
            assert_int_equal(regc_weights_read(w, i, 0, n, got), REGC_OK);
            if (memcmp(got, want, (size_t)n * sizeof *got))
                fail_msg("%s: not the base's values", name);
            free(got);
            continue;
        }
        if (!regc_weights_is_nf4(w, i))
            fail_msg("%s: held in NF4 but not read as NF4 from the checkpoint", name);
        const int64_t bytes = regc_frozen_kind_bytes(REGC_FROZEN_NF4, n);
        uint8_t *got = malloc((size_t)bytes), *quant = malloc((size_t)bytes);
        float *deq = malloc((size_t)n * sizeof *deq), *read = malloc((size_t)n * sizeof *read);
        assert_true(got && quant && deq && read);
        assert_int_equal(regc_weights_read_nf4(w, i, got), REGC_OK);
        assert_int_equal(regc_nf4_quantize(want, n, quant), REGC_OK);
        if (memcmp(got, quant, (size_t)bytes))
            fail_msg("%s: the checkpoint's NF4 bytes are not regc's quantisation of the base",
                     name);
        /* read as floats: dequantised, the same bits */
        regc_nf4_dequantize(quant, n, deq);
        assert_int_equal(regc_weights_read(w, i, 0, n, read), REGC_OK);
        assert_memory_equal(read, deq, (size_t)n * sizeof *deq);
        /* and a range off a block's and a byte's edge: the same values */
        const int64_t first = 37, count = n / 2;
        assert_int_equal(regc_weights_read(w, i, first, count, read), REGC_OK);
        assert_memory_equal(read, deq + first, (size_t)count * sizeof *deq);
        free(got), free(quant), free(deq), free(read);
        quantised++;
    }
    print_message("%d weights in NF4: the checkpoint's bytes are regc's quantisation\n", quantised);
    assert_int_equal(quantised, N_QUANTISED);
    regc_weights_close(w);
    regc_model_free(q), regc_model_free(base);
}

/* ---------------------------------------------------------------- edited copies */

/* A safetensors file's header and data, edited and written back. */
typedef struct {
    cJSON *header;
    unsigned char *data;
    size_t data_len;
} st_image;

static void st_load(const char *path, st_image *im)
{
    size_t size = 0;
    unsigned char *bytes = (unsigned char *)regc_test_read_file(path, &size);
    assert_non_null(bytes);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | bytes[i];
    assert_true(8 + hlen <= size);
    im->header = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)hlen);
    assert_non_null(im->header);
    im->data_len = size - 8 - hlen;
    im->data = malloc(im->data_len + 1);
    assert_non_null(im->data);
    memcpy(im->data, bytes + 8 + hlen, im->data_len);
    free(bytes);
}

/* Tensor `name`'s bytes in the image. */
static unsigned char *st_bytes(st_image *im, const char *name, size_t *len)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(im->header, name);
    assert_non_null(e);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    const size_t begin = (size_t)cJSON_GetArrayItem(o, 0)->valuedouble;
    *len = (size_t)cJSON_GetArrayItem(o, 1)->valuedouble - begin;
    return im->data + begin;
}

/* A tensor of n zero bytes added to the image as `dtype` of shape [d0, d1]. */
static void st_add_zeros(st_image *im, const char *name, const char *dtype, int64_t d0, int64_t d1,
                         size_t n)
{
    unsigned char *grown = realloc(im->data, im->data_len + n + 1);
    assert_non_null(grown);
    memset(grown + im->data_len, 0, n);
    cJSON *e = cJSON_AddObjectToObject(im->header, name);
    cJSON_AddStringToObject(e, "dtype", dtype);
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)d0));
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)d1));
    cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)im->data_len));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(im->data_len + n)));
    im->data = grown, im->data_len += n;
}

/* Written with the tensors left in the header laid out again, contiguous. */
static void st_save(st_image *im, const char *path)
{
    unsigned char *data = malloc(im->data_len + 1);
    assert_non_null(data);
    size_t at = 0;
    cJSON *e;
    cJSON_ArrayForEach (e, im->header) {
        if (!strcmp(e->string, "__metadata__"))
            continue;
        size_t len;
        const unsigned char *from = st_bytes(im, e->string, &len);
        memcpy(data + at, from, len);
        cJSON *offs = cJSON_CreateArray();
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(at + len)));
        cJSON_ReplaceItemInObjectCaseSensitive(e, "data_offsets", offs);
        at += len;
    }
    char *h = cJSON_PrintUnformatted(im->header);
    assert_non_null(h);
    const size_t hlen = strlen(h);
    unsigned char *out = malloc(8 + hlen + at);
    assert_non_null(out);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(out + 8, h, hlen);
    memcpy(out + 8 + hlen, data, at);
    assert_int_equal(regc_test_write_file(path, out, 8 + hlen + at), 0);
    free(out), free(h), free(data);
    cJSON_Delete(im->header), free(im->data);
}

/* The checkpoint copied into dir, its config.json with `from` replaced by
 * `to` (NULL: as it is). */
static void copy_checkpoint(const char *dir, const char *from, const char *to)
{
    char *text = regc_test_read_file(CHECKPOINT "/config.json", NULL);
    assert_non_null(text);
    char config[8192];
    if (from) {
        const char *at = strstr(text, from);
        assert_non_null(at);
        snprintf(config, sizeof config, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    } else {
        snprintf(config, sizeof config, "%s", text);
    }
    free(text);
    assert_int_equal(regc_test_write_text(dir, "config.json", config), 0);
    size_t size = 0;
    char *st = regc_test_read_file(CHECKPOINT "/model.safetensors", &size);
    char *path = regc_test_join(dir, "model.safetensors");
    assert_non_null(st);
    assert_int_equal(regc_test_write_file(path, st, size), 0);
    free(st), free(path);
}

/* `regc train` of dir (with LoRA unless `lora` is 0) fails with one error
 * line holding a and b (the model's description may come before it: the
 * weights open after the model is described). */
static void expect_refused(const char *dir, int lora, const char *a, const char *b)
{
    regc_test_proc p;
    if (lora)
        regc_test_run_regc(&p, "train", "--model", dir, "--lora-r", "8", "--steps", "1", "--batch",
                           "1", "--seq", "8", "--no-cache", NULL);
    else
        regc_test_run_regc(&p, "train", "--model", dir, "--steps", "1", "--batch", "1", "--seq",
                           "8", "--no-cache", NULL);
    const char *line = strstr(p.err, "regc: ");
    print_message("refused: %s", line ? line : p.err);
    if (p.status != 1 || !line || (line != p.err && line[-1] != '\n') ||
        regc_test_count_lines(line) != 1 || !strstr(line, a) || (b && !strstr(line, b)))
        fail_msg("expected exit 1 and one error line with \"%s\"%s%s%s, got %d:\n%s", a,
                 b ? " and \"" : "", b ? b : "", b ? "\"" : "", p.status, p.err);
    regc_test_proc_free(&p);
}

static int setup(void **state) { return regc_test_dir_setup(state, "qlora_checkpoint", NULL); }

#define Q_PROJ "model.layers.0.self_attn.q_proj.weight"
#define K_PROJ "model.layers.0.self_attn.k_proj.weight"
#define DOWN_PROJ "model.layers.1.mlp.down_proj.weight"

/* A quantised weight without one of its quant-state tensors. */
static void test_missing_tensor(void **state)
{
    regc_test_dir *d = *state;
    static const char *const gone[] = {Q_PROJ ".absmax", Q_PROJ ".nested_absmax",
                                       Q_PROJ ".quant_state.bitsandbytes__nf4",
                                       DOWN_PROJ ".nested_quant_map"};
    for (size_t k = 0; k < sizeof gone / sizeof *gone; k++) {
        copy_checkpoint(d->dir, NULL, NULL);
        char *path = regc_test_join(d->dir, "model.safetensors");
        st_image im;
        st_load(path, &im);
        cJSON_DeleteItemFromObjectCaseSensitive(im.header, gone[k]);
        st_save(&im, path);
        free(path);
        expect_refused(d->dir, 1, "missing tensor", gone[k]);
    }
}

/* Tables that are not NF4's, and a quantised shape that is not the model's. */
static void test_wrong_state(void **state)
{
    regc_test_dir *d = *state;
    copy_checkpoint(d->dir, NULL, NULL);
    char *path = regc_test_join(d->dir, "model.safetensors");
    st_image im;
    st_load(path, &im);
    size_t len;
    float *map = (float *)(void *)st_bytes(&im, DOWN_PROJ ".quant_map", &len);
    assert_int_equal(len, 16 * sizeof(float));
    map[3] = -0.4f;
    st_save(&im, path);
    expect_refused(d->dir, 1, DOWN_PROJ ".quant_map", "quant map entry 3");

    copy_checkpoint(d->dir, NULL, NULL);
    st_load(path, &im);
    char *json = (char *)st_bytes(&im, K_PROJ ".quant_state.bitsandbytes__nf4", &len);
    char *shape = strstr(json, "\"shape\": [16, 48]");
    assert_true(shape && shape < json + len);
    memcpy(shape, "\"shape\": [16, 40]", strlen("\"shape\": [16, 40]"));
    st_save(&im, path);
    expect_refused(d->dir, 1, K_PROJ ".quant_state.bitsandbytes__nf4: shape is [16, 40]",
                   "[16, 48]");
    free(path);
}

/* A linear layer the checkpoint keeps unquantised (its quant state gone,
 * the weight in float32) where regc holds every linear layer but the head
 * in NF4: refused, naming the tensor, as training it so would not be the
 * model Transformers trains. */
static void test_unquantised_layer(void **state)
{
    regc_test_dir *d = *state;
    static const char *const state_of[] = {"",
                                           ".absmax",
                                           ".nested_absmax",
                                           ".nested_quant_map",
                                           ".quant_map",
                                           ".quant_state.bitsandbytes__nf4"};
    copy_checkpoint(d->dir, NULL, NULL);
    char *path = regc_test_join(d->dir, "model.safetensors"), name[160];
    st_image im;
    st_load(path, &im);
    for (size_t k = 0; k < sizeof state_of / sizeof *state_of; k++) {
        snprintf(name, sizeof name, "%s%s", Q_PROJ, state_of[k]);
        cJSON_DeleteItemFromObjectCaseSensitive(im.header, name);
    }
    st_add_zeros(&im, Q_PROJ, "F32", 48, 48, 48 * 48 * sizeof(float));
    st_save(&im, path);
    free(path);
    expect_refused(d->dir, 1, "tensor " Q_PROJ " is not in 4 bits in the checkpoint",
                   "every linear layer but the head in NF4");
}

/* A quantization_config regc cannot honour, by its key; the base without LoRA. */
static void test_refused_config(void **state)
{
    regc_test_dir *d = *state;
    static const char *const cases[][3] = {
        {"\"load_in_8bit\": false", "\"load_in_8bit\": true", "quantization_config.load_in_8bit"},
        {"\"bnb_4bit_quant_type\": \"nf4\"", "\"bnb_4bit_quant_type\": \"fp4\"",
         "quantization_config.bnb_4bit_quant_type"},
        {"\"bnb_4bit_use_double_quant\": true", "\"bnb_4bit_use_double_quant\": false",
         "quantization_config.bnb_4bit_use_double_quant"},
        {"\"quant_method\": \"bitsandbytes\"", "\"quant_method\": \"gptq\"",
         "quantization_config.quant_method"},
        {"\"bnb_4bit_compute_dtype\": \"float32\"", "\"bnb_4bit_compute_dtype\": \"float16\"",
         "quantization_config.bnb_4bit_compute_dtype"},
        {"\"llm_int8_skip_modules\": null", "\"llm_int8_skip_modules\": [\"lm_head\", \"q_proj\"]",
         "quantization_config.llm_int8_skip_modules"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        copy_checkpoint(d->dir, cases[k][0], cases[k][1]);
        expect_refused(d->dir, 1, cases[k][2], "config.json");
    }
    copy_checkpoint(d->dir, NULL, NULL);
    expect_refused(d->dir, 0, "quantization_config", "LoRA needed");

    /* a compute dtype the checkpoint's config contradicts */
    copy_checkpoint(d->dir, "\"bnb_4bit_compute_dtype\": \"float32\"",
                    "\"bnb_4bit_compute_dtype\": \"bfloat16\"");
    regc_test_proc p;
    regc_test_run_regc(&p, "train", "--model", d->dir, "--lora-r", "8", "--steps", "1", "--batch",
                       "1", "--seq", "8", "--no-cache", "--bnb-4bit-compute-dtype", "float32",
                       NULL);
    const char *line = strstr(p.err, "regc: ");
    if (p.status != 1 || !line || regc_test_count_lines(line) != 1 ||
        !strstr(line, "bnb_4bit_compute_dtype: float32, but"))
        fail_msg("a contradicted compute dtype: exit %d:\n%s", p.status, p.err);
    regc_test_proc_free(&p);
}

/* Trained from the checkpoint and from the fp32 base quantised as it
 * loads: the same losses, bit for bit; a bfloat16 compute dtype in the
 * checkpoint's config is --bnb-4bit-compute-dtype bfloat16. */
static void test_checkpoint(void **state)
{
    regc_test_train_case *c = *state;
    const cJSON *qcase = c->spec;
    c->spec = regc_test_json_get(qcase, "base");
    regc_test_train_case_build(c);
    check_same_bytes(c);

    char bf16[1200];
    snprintf(bf16, sizeof bf16, "%s/bf16", c->tmp);
    assert_int_equal(mkdir(bf16, 0755), 0);
    copy_checkpoint(bf16, "\"bnb_4bit_compute_dtype\": \"float32\"",
                    "\"bnb_4bit_compute_dtype\": \"bfloat16\"");
    const char *const runs[][6] = {
        {"--load-in-4bit", "on", "--adapter", ADAPTER, NULL},
        {"--model", CHECKPOINT, "--adapter", ADAPTER, NULL},
        {"--load-in-4bit", "on", "--bnb-4bit-compute-dtype", "bfloat16", "--adapter", ADAPTER},
        {"--model", bf16, "--adapter", ADAPTER, NULL},
    };
    for (int k = 0; k < 4; k += 2) {
        regc_test_train_result a, b;
        const char *from_base[8] = {0}, *from_checkpoint[8] = {0};
        memcpy(from_base, runs[k], sizeof runs[k]);
        memcpy(from_checkpoint, runs[k + 1], sizeof runs[k + 1]);
        regc_test_train_case_run(c, STEPS, from_base, &a);
        regc_test_train_case_run(c, STEPS, from_checkpoint, &b);
        for (int j = 0; j < STEPS; j++)
            print_message("%s products, step %d: fp32 base in NF4 %.9g, 4-bit checkpoint %.9g\n",
                          k ? "bf16" : "fp32", j, a.loss[j], b.loss[j]);
        assert_memory_equal(a.loss, b.loss, STEPS * sizeof *a.loss);
    }
    c->spec = qcase;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_missing_tensor, setup),
        regc_test_in_dir(test_wrong_state, setup),
        regc_test_in_dir(test_unquantised_layer, setup),
        regc_test_in_dir(test_refused_config, setup),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    const char *path = REGC_SOURCE_DIR "/tests/data/lora_reference.json";
    char *text = regc_test_read_file(path, NULL);
    cJSON *ref = text ? cJSON_Parse(text) : NULL;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ref, "qlora_cases"), 0);
    if (!c) {
        fprintf(stderr, "%s: no qlora_cases\n", path);
        failed++;
    } else {
        const struct CMUnitTest one[] = {{"qlora_checkpoint", test_checkpoint,
                                          regc_test_train_case_setup, regc_test_train_case_teardown,
                                          (void *)c}};
        failed += cmocka_run_group_tests_name("qlora_checkpoint", one, NULL, NULL);
    }
    cJSON_Delete(ref);
    free(text);
    return failed ? 1 : 0;
}
