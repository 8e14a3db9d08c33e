/* test_bert_frontend.c — BERT (BertForMaskedLM) models: presets and their
 * published parameter count, random init, config.json parsing and every
 * config error, save/load round trips (tied and untied decoder, the older
 * gamma/beta LayerNorm names, sharded), the flat graph, a shape-only
 * bert-base, the masked-LM input rule as a property, and training through
 * the command line. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_models.h"
#include "test_model.h"
#include "test_util.h"

/* f->path is dir/model, the HF directory most tests build. */
static int setup(void **state) { return regc_test_dir_setup(state, "bert", "model"); }

/* The keys BertConfig needs, as a small model. */
static const char *const required_keys[][2] = {
    {"vocab_size", "64"},         {"hidden_size", "16"},       {"num_hidden_layers", "2"},
    {"num_attention_heads", "2"}, {"intermediate_size", "24"}, {"max_position_embeddings", "16"},
};
#define N_REQUIRED (sizeof required_keys / sizeof required_keys[0])

/* A small BERT config.json in f->path. `extra` adds keys; a required key it
 * names replaces the default one; `omit` (may be NULL) drops a required key. */
static void write_config_omit(regc_test_dir *f, const char *extra, const char *omit)
{
    regc_test_write_config(f->path, "\"model_type\": \"bert\", \"_name_or_path\": [1, 2]",
                           required_keys, N_REQUIRED, extra, omit);
}

static void write_config(regc_test_dir *f, const char *extra) { write_config_omit(f, extra, NULL); }

static regc_model *make_small_model(regc_test_dir *f, const char *extra, uint64_t seed)
{
    write_config(f, extra);
    return regc_test_load_config(f->path, seed);
}

/* BertForMaskedLM's parameter count with a tied decoder. */
static int64_t bert_count(int64_t V, int64_t P, int64_t TV, int64_t C, int64_t F, int64_t L)
{
    int64_t emb = V * C + P * C + TV * C + 2 * C;
    int64_t layer = 4 * (C * C + C) + 2 * C + (F * C + F) + (C * F + C) + 2 * C;
    int64_t head = V + (C * C + C) + 2 * C;
    return emb + L * layer + head;
}

/* ------------------------------------------------------------- presets */

static void test_presets(void **state)
{
    (void)state;
    assert_true(regc_model_is_preset("bert-tiny"));
    assert_true(regc_model_is_preset("bert-base"));
    int listed = 0;
    for (int i = 0; regc_model_preset_name(i); i++)
        listed += strcmp(regc_model_preset_name(i), "bert-tiny") == 0 ||
                  strcmp(regc_model_preset_name(i), "bert-base") == 0;
    assert_int_equal(listed, 2);

    regc_model *m;
    assert_int_equal(regc_model_load("bert-base", &m), REGC_OK);
    assert_string_equal(regc_model_arch(m), "bert");
    /* bert-base-uncased's BertForMaskedLM, as published. */
    assert_int_equal(regc_model_total_numel(m), 109514298);
    assert_int_equal(bert_count(30522, 512, 2, 768, 3072, 12), 109514298);
    assert_int_equal(regc_model_n_params(m), 5 + 16 * 12 + 5);
    assert_int_equal(regc_model_vocab(m), 30522);
    assert_int_equal(regc_model_max_seq(m), 512);
    assert_false(regc_model_has_weights(m));
    assert_null(regc_model_weights(m));
    /* HF's state_dict order and [out, in] layouts. */
    static const char *const first[] = {
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.LayerNorm.weight",
        "bert.embeddings.LayerNorm.bias",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.0.attention.self.query.bias",
        "bert.encoder.layer.0.attention.self.key.weight",
        "bert.encoder.layer.0.attention.self.key.bias",
        "bert.encoder.layer.0.attention.self.value.weight",
        "bert.encoder.layer.0.attention.self.value.bias",
        "bert.encoder.layer.0.attention.output.dense.weight",
        "bert.encoder.layer.0.attention.output.dense.bias",
        "bert.encoder.layer.0.attention.output.LayerNorm.weight",
        "bert.encoder.layer.0.attention.output.LayerNorm.bias",
        "bert.encoder.layer.0.intermediate.dense.weight",
        "bert.encoder.layer.0.intermediate.dense.bias",
        "bert.encoder.layer.0.output.dense.weight",
        "bert.encoder.layer.0.output.dense.bias",
        "bert.encoder.layer.0.output.LayerNorm.weight",
        "bert.encoder.layer.0.output.LayerNorm.bias",
        "bert.encoder.layer.1.attention.self.query.weight",
    };
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
        assert_string_equal(regc_model_param_name(m, (int)i), first[i]);
    static const char *const last[] = {
        "bert.encoder.layer.11.output.LayerNorm.bias", "cls.predictions.bias",
        "cls.predictions.transform.dense.weight",      "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight",  "cls.predictions.transform.LayerNorm.bias",
    };
    for (int i = 0; i < 6; i++)
        assert_string_equal(regc_model_param_name(m, 196 + i), last[i]);
    assert_null(regc_model_param_name(m, 202));
    regc_test_assert_param_shape(m, "bert.embeddings.word_embeddings.weight", 2, 30522, 768);
    regc_test_assert_param_shape(m, "bert.embeddings.token_type_embeddings.weight", 2, 2, 768);
    regc_test_assert_param_shape(m, "bert.encoder.layer.5.intermediate.dense.weight", 2, 3072, 768);
    regc_test_assert_param_shape(m, "bert.encoder.layer.5.intermediate.dense.bias", 1, 3072, 0);
    regc_test_assert_param_shape(m, "bert.encoder.layer.5.output.dense.weight", 2, 768, 3072);
    regc_test_assert_param_shape(m, "cls.predictions.bias", 1, 30522, 0);
    int64_t off = 0;
    for (int i = 0; i < regc_model_n_params(m); i++) {
        assert_int_equal(regc_model_param_offset(m, i), off);
        off += regc_model_param_numel(m, i);
    }
    assert_int_equal(off, regc_model_total_numel(m));
    char d[640];
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "bert bert-base"));
    assert_non_null(strstr(d, "109,514,298 parameters (shape only)"));
    assert_non_null(strstr(d, "tied decoder"));
    assert_non_null(strstr(d, "[MASK] id 103"));
    assert_non_null(strstr(d, "layer_norm_eps 1e-12"));
    assert_non_null(strstr(d, "dropout hidden 0.1 attention 0.1"));
    regc_model_free(m);

    assert_int_equal(regc_model_load("bert-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_total_numel(m), bert_count(512, 256, 2, 128, 512, 4));
    assert_int_equal(regc_model_n_params(m), 5 + 16 * 4 + 5);
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "[MASK] id 256")); /* past the byte-level corpus */
    regc_model_free(m);
}

static void test_init_random(void **state)
{
    (void)state;
    regc_model *a, *b;
    assert_int_equal(regc_model_load("bert-tiny", &a), REGC_OK);
    assert_int_equal(regc_model_load("bert-tiny", &b), REGC_OK);
    assert_int_equal(regc_model_init_random(a, 7), REGC_OK);
    assert_int_equal(regc_model_init_random(b, 7), REGC_OK);
    regc_test_assert_same_weights(a, b);
    const float *w = regc_model_weights(a);
    const float hw = (float)(0.02 * sqrt(3.0));
    for (int i = 0; i < regc_model_n_params(a); i++) {
        const char *name = regc_model_param_name(a, i);
        const float *p = w + regc_model_param_offset(a, i);
        int64_t n = regc_model_param_numel(a, i);
        size_t len = strlen(name);
        if (strstr(name, "LayerNorm.weight")) {
            for (int64_t j = 0; j < n; j++)
                assert_true(p[j] == 1.0f);
        } else if (strcmp(name + len - 5, ".bias") == 0) {
            for (int64_t j = 0; j < n; j++)
                assert_true(p[j] == 0.0f);
        } else {
            /* Every matrix at HF's std 0.02, none scaled by depth. */
            double sum2 = 0;
            float maxabs = 0;
            for (int64_t j = 0; j < n; j++) {
                sum2 += (double)p[j] * p[j];
                maxabs = fmaxf(maxabs, fabsf(p[j]));
            }
            assert_true(maxabs <= hw);
            if (fabs(sqrt(sum2 / (double)n) - 0.02) > 0.003)
                fail_msg("%s has std %g", name, sqrt(sum2 / (double)n));
        }
    }
    regc_model_free(a);
    regc_model_free(b);
}

/* ---------------------------------------------------- save / load files */

static void test_save_load_round_trip(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m, *back;
    assert_int_equal(regc_model_load("bert-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_init_random(m, 1234), REGC_OK);
    assert_int_equal(regc_model_save(m, f->path), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    char d1[640], d2[640];
    regc_model_describe(m, d1, sizeof d1);
    regc_model_describe(back, d2, sizeof d2);
    /* Every setting survives (the sources differ: preset vs directory). */
    assert_string_equal(strchr(d1, ':'), strchr(d2, ':'));

    char *cfg = regc_test_read_file(regc_test_path_in(f, "config.json"), NULL);
    assert_non_null(cfg);
    cJSON *root = cJSON_Parse(cfg);
    free(cfg);
    assert_non_null(root);
    const cJSON *archs = cJSON_GetObjectItem(root, "architectures");
    assert_string_equal(cJSON_GetArrayItem(archs, 0)->valuestring, "BertForMaskedLM");
    assert_string_equal(cJSON_GetObjectItem(root, "model_type")->valuestring, "bert");
    assert_string_equal(cJSON_GetObjectItem(root, "hidden_act")->valuestring, "gelu");
    assert_int_equal(cJSON_GetObjectItem(root, "mask_token_id")->valuedouble, 256);
    assert_int_equal(cJSON_GetObjectItem(root, "intermediate_size")->valuedouble, 512);
    cJSON_Delete(root);

    regc_st_file *st;
    assert_int_equal(regc_st_open(regc_test_path_in(f, "model.safetensors"), &st), REGC_OK);
    assert_int_equal(regc_st_count(st), regc_model_n_params(m));
    assert_int_equal(regc_st_find(st, "cls.predictions.decoder.weight"), -1);
    assert_true(regc_st_find(st, "cls.predictions.bias") >= 0);
    regc_st_close(st);
    regc_model_free(back);
    regc_model_free(m);
}

/* Checkpoint entries for m's parameters; LayerNorm names in the older
 * gamma/beta spelling when `legacy` is set (the strings live in names). */
static regc_st_entry *entries_of(regc_model *m, int legacy, char (*names)[160])
{
    int n = regc_model_n_params(m);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    assert_non_null(e);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 160, "%s", regc_model_param_name(m, i));
        char *ln = strstr(names[i], "LayerNorm.");
        if (legacy && ln)
            strcpy(ln + 10, strcmp(ln + 10, "weight") == 0 ? "gamma" : "beta");
        e[i].name = names[i];
        e[i].dtype = REGC_F32;
        e[i].ndim = regc_model_param_shape(m, i, e[i].shape);
        e[i].data = regc_model_weights(m) + regc_model_param_offset(m, i);
    }
    return e;
}

/* bert-base-uncased's own file says LayerNorm.gamma/beta and carries extra
 * tensors (position_ids, the decoder's copy of the bias, a pooler). */
static void test_legacy_names_and_extras(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, NULL, 9), *back;
    int n = regc_model_n_params(m);
    char(*names)[160] = calloc((size_t)n, sizeof *names);
    assert_non_null(names);
    regc_st_entry *e = entries_of(m, 1, names);
    regc_st_entry *all = calloc((size_t)n + 3, sizeof *all);
    assert_non_null(all);
    static const float pos_ids[16] = {0}, pooler[16 * 16] = {0};
    all[0] = (regc_st_entry){.name = "bert.embeddings.position_ids",
                             .dtype = REGC_F32,
                             .ndim = 2,
                             .shape = {1, 16},
                             .data = pos_ids};
    all[1] = (regc_st_entry){.name = "bert.pooler.dense.weight",
                             .dtype = REGC_F32,
                             .ndim = 2,
                             .shape = {16, 16},
                             .data = pooler};
    memcpy(all + 2, e, (size_t)n * sizeof *e);
    int bias = regc_test_param_index(m, "cls.predictions.bias");
    all[n + 2] = e[bias];
    all[n + 2].name = "cls.predictions.decoder.bias";
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), all, n + 3), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    regc_model_free(back);
    unlink(regc_test_path_in(f, "model.safetensors"));

    /* The same through a sharded checkpoint's weight map. */
    int half = n / 2;
    assert_int_equal(regc_st_write(regc_test_path_in(f, "a.safetensors"), e, half), REGC_OK);
    assert_int_equal(regc_st_write(regc_test_path_in(f, "b.safetensors"), e + half, n - half),
                     REGC_OK);
    char *index = malloc(65536);
    assert_non_null(index);
    size_t len = (size_t)snprintf(index, 65536, "{\"weight_map\": {");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(index + len, 65536 - len, "%s\"%s\": \"%s.safetensors\"",
                                i ? ", " : "", e[i].name, i < half ? "a" : "b");
    snprintf(index + len, 65536 - len, "}}");
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", index), 0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    regc_model_free(back);

    /* A LayerNorm missing under both spellings is named as regc calls it. */
    char *cut = strstr(index, ", \"cls.predictions.transform.LayerNorm.beta\"");
    assert_non_null(cut);
    strcpy(cut, "}}");
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", index), 0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error("model.safetensors.index.json",
                           "missing tensor cls.predictions.transform.LayerNorm.bias");
    free(index);
    free(all);
    free(e);
    free(names);
    regc_model_free(m);
}

static void test_untied_decoder(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, "\"tie_word_embeddings\": false", 3), *back;
    int n = regc_model_n_params(m);
    assert_int_equal(n, 5 + 16 * 2 + 6);
    assert_string_equal(regc_model_param_name(m, n - 1), "cls.predictions.decoder.weight");
    regc_test_assert_param_shape(m, "cls.predictions.decoder.weight", 2, 64, 16);
    assert_int_equal(regc_model_total_numel(m), bert_count(64, 16, 2, 16, 24, 2) + 64 * 16);
    char out[1200];
    snprintf(out, sizeof out, "%s/saved", f->dir);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    assert_int_equal(regc_model_load(out, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    char d[640];
    regc_model_describe(back, d, sizeof d);
    assert_non_null(strstr(d, "untied decoder"));

    /* The logits read the decoder and add cls.predictions.bias. */
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(back, 1, 4, &g), REGC_OK);
    const regc_node *mm = regc_graph_node(g, regc_graph_n_nodes(g) - 3);
    assert_int_equal(mm->op, REGC_OP_MATMUL);
    assert_int_equal(mm->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, mm->in[1])->name, "cls.predictions.decoder.weight");
    const regc_node *ba = regc_graph_node(g, regc_graph_n_nodes(g) - 2);
    assert_int_equal(ba->op, REGC_OP_BIAS_ADD);
    assert_string_equal(regc_graph_tensor(g, ba->in[1])->name, "cls.predictions.bias");
    regc_graph_free(g);
    regc_model_free(back);
    regc_model_free(m);
}

/* -------------------------------------------------------------- errors */

/* pad_token_id is the word embedding's padding_idx, as BertConfig builds
 * it: 0 when absent, none when null, a negative one from the end, and
 * written back as read. */
static void test_pad_token(void **state)
{
    regc_test_dir *f = *state;
    static const struct {
        const char *extra;
        int64_t pad;
    } cases[] = {{NULL, 0},
                 {"\"pad_token_id\": 5", 5},
                 {"\"pad_token_id\": null", -1},
                 {"\"pad_token_id\": -1", 63}}; /* torch counts a negative one from the end */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(f, cases[i].extra);
        regc_model *m = NULL, *back = NULL;
        assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
        assert_int_equal(regc_model_with_layers(m, 1, &back), REGC_OK);
        assert_int_equal(regc_test_embedding_padding(m), cases[i].pad);
        assert_int_equal(regc_test_embedding_padding(back), cases[i].pad);
    }
}

static void expect_config_error(regc_test_dir *f, const char *extra, int status, const char *what)
{
    write_config(f, extra);
    regc_test_expect_config_error(f->path, status, what);
}

static void test_config_errors(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = (regc_model *)1;
    char want[128];
    for (size_t i = 0; i < N_REQUIRED; i++) {
        write_config_omit(f, NULL, required_keys[i][0]);
        assert_int_equal(regc_model_load_config(f->path, &m), REGC_ERR_FORMAT);
        assert_null(m);
        snprintf(want, sizeof want, "missing required key \"%s\"", required_keys[i][0]);
        regc_test_expect_error(regc_test_path_in(f, "config.json"), want);
    }
    expect_config_error(f, "\"hidden_act\": \"gelu_new\"", REGC_ERR_UNSUPPORTED,
                        "key \"hidden_act\" is \"gelu_new\" (supported: gelu)");
    expect_config_error(f, "\"hidden_act\": \"relu\"", REGC_ERR_UNSUPPORTED,
                        "key \"hidden_act\" is \"relu\"");
    expect_config_error(f, "\"hidden_act\": 1", REGC_ERR_FORMAT,
                        "key \"hidden_act\" must be a string");
    expect_config_error(f, "\"position_embedding_type\": \"relative_key\"", REGC_ERR_UNSUPPORTED,
                        "key \"position_embedding_type\" is \"relative_key\"");
    expect_config_error(f, "\"is_decoder\": true", REGC_ERR_UNSUPPORTED,
                        "key \"is_decoder\" = true is not supported");
    expect_config_error(f, "\"add_cross_attention\": true", REGC_ERR_UNSUPPORTED,
                        "key \"add_cross_attention\" = true is not supported");
    expect_config_error(f, "\"is_decoder\": \"no\"", REGC_ERR_FORMAT,
                        "key \"is_decoder\" must be true or false");
    expect_config_error(f, "\"hidden_size\": \"16\"", REGC_ERR_FORMAT,
                        "key \"hidden_size\" must be an integer");
    expect_config_error(f, "\"num_hidden_layers\": 2.5", REGC_ERR_FORMAT,
                        "key \"num_hidden_layers\" must be an integer");
    expect_config_error(f, "\"vocab_size\": 0", REGC_ERR_FORMAT, "key \"vocab_size\" is 0");
    expect_config_error(f, "\"intermediate_size\": -4", REGC_ERR_FORMAT,
                        "key \"intermediate_size\" is -4");
    expect_config_error(f, "\"type_vocab_size\": 0", REGC_ERR_FORMAT,
                        "key \"type_vocab_size\" is 0");
    expect_config_error(f, "\"num_attention_heads\": 3", REGC_ERR_FORMAT,
                        "hidden_size 16 is not divisible by num_attention_heads 3");
    expect_config_error(f, "\"layer_norm_eps\": \"1e-12\"", REGC_ERR_FORMAT,
                        "key \"layer_norm_eps\" must be a number");
    expect_config_error(f, "\"layer_norm_eps\": -1", REGC_ERR_FORMAT,
                        "key \"layer_norm_eps\" is -1");
    expect_config_error(f, "\"tie_word_embeddings\": 1", REGC_ERR_FORMAT,
                        "key \"tie_word_embeddings\" must be true or false");
    expect_config_error(f, "\"hidden_dropout_prob\": 1.5", REGC_ERR_FORMAT,
                        "key \"hidden_dropout_prob\" is 1.5");
    expect_config_error(f, "\"attention_probs_dropout_prob\": \"x\"", REGC_ERR_FORMAT,
                        "key \"attention_probs_dropout_prob\" must be a number");
    expect_config_error(f, "\"mask_token_id\": 64", REGC_ERR_FORMAT,
                        "key \"mask_token_id\" is 64, expected 0 to 63");
    expect_config_error(f, "\"pad_token_id\": -65", REGC_ERR_FORMAT,
                        "key \"pad_token_id\" is -65, not within the vocabulary");
    expect_config_error(f, "\"pad_token_id\": 64", REGC_ERR_FORMAT,
                        "key \"pad_token_id\" is 64, not within the vocabulary");
    expect_config_error(f, "\"pad_token_id\": 1.5", REGC_ERR_FORMAT,
                        "key \"pad_token_id\" must be an integer");

    /* Defaults, nulls and reported values. */
    write_config(f, "\"layer_norm_eps\": null, \"hidden_dropout_prob\": 0.0, "
                    "\"attention_probs_dropout_prob\": 0.25");
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    char d[640];
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "layer_norm_eps 1e-12"));
    assert_non_null(strstr(d, "type_vocab 2"));
    assert_non_null(strstr(d, "[MASK] id 63")); /* a vocabulary of 64 has no id 103 */
    assert_non_null(strstr(d, "dropout hidden 0 attention 0.25"));
    assert_non_null(strstr(d, "tied decoder"));
    regc_model_free(m);
    static const struct {
        const char *extra, *want;
    } masks[] = {
        {"\"vocab_size\": 104", "[MASK] id 103"},
        {"\"vocab_size\": 103", "[MASK] id 102"},
        {"\"mask_token_id\": 5", "[MASK] id 5"},
        {"\"type_vocab_size\": 3, \"layer_norm_eps\": 1e-5", "type_vocab 3, layer_norm_eps 1e-05"},
    };
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        write_config(f, masks[i].extra);
        assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
        regc_model_describe(m, d, sizeof d);
        if (!strstr(d, masks[i].want))
            fail_msg("%s: \"%s\" lacks \"%s\"", masks[i].extra, d, masks[i].want);
        regc_model_free(m);
    }
}

/* --------------------------------------------------------------- graph */

static void test_graph_tiny(void **state)
{
    (void)state;
    regc_model *m;
    assert_int_equal(regc_model_load("bert-tiny", &m), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    /* 6 embedding nodes, 18 per layer, 7 for the head and loss */
    assert_int_equal(regc_graph_n_nodes(g), 6 + 18 * 4 + 7);
    const char *const inputs[] = {"input_ids", "token_type_ids", "position_ids", "targets"};
    int n_in = 0, params = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role == REGC_ROLE_INPUT) {
            assert_true(n_in < 4);
            assert_string_equal(x->name, inputs[n_in]);
            assert_int_equal(x->dtype, REGC_I32);
            assert_int_equal(x->ndim, n_in == 2 ? 1 : 2);
            assert_int_equal(x->shape[x->ndim - 1], 8);
            n_in++;
        }
        if (x->role == REGC_ROLE_PARAM) {
            assert_string_equal(x->name, regc_model_param_name(m, params));
            params++;
        }
    }
    assert_int_equal(n_in, 4);
    assert_int_equal(params, regc_model_n_params(m));
    /* No layer boundary is recorded anywhere: the ops repeat with period 18. */
    int gelu = 0, attn = 0, ln = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *nd = regc_graph_node(g, i);
        assert_int_not_equal(nd->op, REGC_OP_GELU); /* BERT's gelu is the erf form */
        gelu += nd->op == REGC_OP_GELU_ERF;
        ln += nd->op == REGC_OP_LAYERNORM;
        if (nd->op == REGC_OP_ATTENTION) {
            attn++;
            assert_int_equal(nd->attrs.causal, 0);
            assert_int_equal(nd->attrs.n_head, 4);
            assert_int_equal(nd->attrs.n_kv_head, 4);
            assert_true(fabsf(nd->attrs.scale - 1.0f / sqrtf(32.0f)) < 1e-7f);
        }
        if (i >= 6 && i < 6 + 18 * 4)
            assert_int_equal(nd->op, regc_graph_node(g, 6 + (i - 6) % 18)->op);
    }
    assert_int_equal(gelu, 4 + 1);
    assert_int_equal(attn, 4);
    assert_int_equal(ln, 1 + 2 * 4 + 1);
    /* Post-LN: every layer ends in a LayerNorm of the residual sum. */
    assert_int_equal(regc_graph_node(g, 5)->op, REGC_OP_LAYERNORM);
    assert_int_equal(regc_graph_node(g, 6 + 18 - 1)->op, REGC_OP_LAYERNORM);
    assert_int_equal(regc_graph_node(g, 6 + 18 - 2)->op, REGC_OP_ADD);
    const regc_node *dec = regc_graph_node(g, regc_graph_n_nodes(g) - 3);
    assert_int_equal(dec->op, REGC_OP_MATMUL);
    assert_int_equal(dec->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, dec->in[1])->name,
                        "bert.embeddings.word_embeddings.weight");
    const regc_tensor *logits = regc_graph_tensor(g, dec->out[0]);
    assert_int_equal(logits->ndim, 3);
    assert_int_equal(logits->shape[2], 512);
    const regc_node *ce = regc_graph_node(g, regc_graph_n_nodes(g) - 1);
    assert_int_equal(ce->op, REGC_OP_CROSS_ENTROPY);
    assert_int_equal(regc_graph_n_outputs(g), 1);
    assert_int_equal(regc_graph_output(g, 0), ce->out[0]);
    assert_int_equal(regc_graph_tensor(g, ce->out[0])->ndim, 0);
    regc_graph_free(g);

    assert_int_equal(regc_model_build_graph(m, 1, 256, &g), REGC_OK);
    regc_graph_free(g);
    g = (regc_graph *)1;
    assert_int_equal(regc_model_build_graph(m, 1, 257, &g), REGC_ERR_ARG);
    assert_null(g);
    assert_string_equal(regc_error_message(),
                        "sequence length 257 exceeds max_position_embeddings 256 of bert-tiny");
    regc_model_free(m);
}

/* bert-base and its graph at full length cost shapes only. */
static void test_base_shape_only(void **state)
{
    (void)state;
    double t0 = regc_time_ms();
    regc_model *m;
    assert_int_equal(regc_model_load_shapes("bert-base", &m), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 32, 512, &g), REGC_OK);
    assert_int_equal(regc_graph_n_nodes(g), 6 + 18 * 12 + 7);
    assert_false(regc_model_has_weights(m));
    assert_null(regc_model_weights(m));
    assert_true(regc_time_ms() - t0 < 2000.0);
    regc_graph_free(g);
    regc_model_free(m);
}

/* ------------------------------------------------------------- masking */

/* The inputs of m's training graph at [B, T], with host buffers. */
typedef struct {
    regc_graph *g;
    int n;
    regc_input in[8];
    int32_t *ids, *types, *pos, *targets;
} graph_inputs;

static void inputs_make(regc_model *m, int64_t B, int64_t T, graph_inputs *x)
{
    memset(x, 0, sizeof *x);
    assert_int_equal(regc_model_build_graph(m, B, T, &x->g), REGC_OK);
    for (int t = 0; t < regc_graph_n_tensors(x->g); t++) {
        const regc_tensor *ts = regc_graph_tensor(x->g, t);
        if (ts->role != REGC_ROLE_INPUT)
            continue;
        assert_true(x->n < 8);
        x->in[x->n].tensor = ts;
        x->in[x->n].host = calloc((size_t)regc_tensor_numel(ts), sizeof(int32_t));
        assert_non_null(x->in[x->n].host);
        int32_t *h = x->in[x->n].host;
        if (!strcmp(ts->name, "input_ids"))
            x->ids = h;
        else if (!strcmp(ts->name, "token_type_ids"))
            x->types = h;
        else if (!strcmp(ts->name, "position_ids"))
            x->pos = h;
        else if (!strcmp(ts->name, "targets"))
            x->targets = h;
        x->n++;
    }
    assert_true(x->ids && x->types && x->pos && x->targets);
}

static void inputs_free(graph_inputs *x)
{
    for (int i = 0; i < x->n; i++)
        free(x->in[i].host);
    regc_graph_free(x->g);
}

/* The documented rule, written independently of models/bert.c: the top 24
 * bits of the position's draw, as a fraction of 2^24, below 0.15. */
static int rule_masks(uint64_t seed, int64_t step, int64_t i)
{
    uint64_t u = regc_rng_at(regc_rng_substream(seed, (uint64_t)step), (uint64_t)i);
    return (double)(u >> 40) < 0.15 * 16777216.0;
}

static void test_mask_rule(void **state)
{
    (void)state;
    regc_model *m;
    regc_tokens *data;
    assert_int_equal(regc_model_load("bert-tiny", &m), REGC_OK);
    assert_int_equal(regc_tokens_builtin(&data), REGC_OK);
    const int64_t B = 8, T = 64, BT = B * T, steps = 25;
    const int32_t mask_id = 256;
    graph_inputs x, y;
    inputs_make(m, B, T, &x);
    inputs_make(m, B, T, &y);
    int32_t *orig = malloc((size_t)BT * sizeof *orig), *next = malloc((size_t)BT * sizeof *next);
    assert_true(orig && next);
    int64_t masked = 0, total = 0;
    for (int64_t k = 0; k < steps; k++) {
        const regc_batch_spec b = {.step = k, .batch = B, .seq = T, .seed = 4242};
        assert_int_equal(regc_model_fill_inputs(m, data, &b, x.n, x.in), REGC_OK);
        assert_int_equal(regc_tokens_batch(data, k, B, T, orig, next), REGC_OK);
        for (int64_t i = 0; i < BT; i++) {
            int is = x.targets[i] >= 0;
            if (is != rule_masks(4242, k, i))
                fail_msg("step %lld position %lld: masked %d, the rule says %d", (long long)k,
                         (long long)i, is, !is);
            if (is) {
                assert_int_equal(x.targets[i], orig[i]); /* the input token, not the next one */
                assert_int_equal(x.ids[i], mask_id);
            } else {
                assert_int_equal(x.targets[i], -1);
                assert_int_equal(x.ids[i], orig[i]);
            }
            assert_int_equal(x.types[i], 0);
            masked += is;
        }
        total += BT;
        for (int64_t t = 0; t < T; t++)
            assert_int_equal(x.pos[t], t);
        /* Deterministic per seed and step; another seed masks elsewhere. */
        assert_int_equal(regc_model_fill_inputs(m, data, &b, y.n, y.in), REGC_OK);
        assert_memory_equal(x.ids, y.ids, (size_t)BT * sizeof(int32_t));
        assert_memory_equal(x.targets, y.targets, (size_t)BT * sizeof(int32_t));
        const regc_batch_spec other = {.step = k, .batch = B, .seq = T, .seed = 4243};
        assert_int_equal(regc_model_fill_inputs(m, data, &other, y.n, y.in), REGC_OK);
        assert_memory_not_equal(x.targets, y.targets, (size_t)BT * sizeof(int32_t));
    }
    /* 12800 positions: the standard deviation of the fraction is 0.0032. */
    double frac = (double)masked / (double)total;
    if (fabs(frac - 0.15) > 0.015)
        fail_msg("masked fraction %g is not near 0.15", frac);
    inputs_free(&x);
    inputs_free(&y);

    /* One position a batch: where the rule masks nothing, (0, 0) is masked. */
    inputs_make(m, 1, 1, &x);
    int fallbacks = 0;
    for (int64_t k = 0; k < 20; k++) {
        const regc_batch_spec b = {.step = k, .batch = 1, .seq = 1, .seed = 4242};
        assert_int_equal(regc_model_fill_inputs(m, data, &b, x.n, x.in), REGC_OK);
        assert_int_equal(regc_tokens_batch(data, k, 1, 1, orig, next), REGC_OK);
        assert_int_equal(x.ids[0], mask_id);
        assert_int_equal(x.targets[0], orig[0]);
        fallbacks += !rule_masks(4242, k, 0);
    }
    assert_true(fallbacks > 0);

    /* Without a targets input there is nothing to put the originals in. */
    assert_string_equal(x.in[3].tensor->name, "targets");
    const regc_batch_spec b = {.step = 0, .batch = 1, .seq = 1, .seed = 1};
    assert_int_equal(regc_model_fill_inputs(m, data, &b, 3, x.in), REGC_ERR_ARG);
    regc_test_expect_error("bert-tiny", "targets");
    inputs_free(&x);
    free(orig);
    free(next);
    regc_tokens_free(data);
    regc_model_free(m);
}

/* ----------------------------------------------------------------- CLI */

static int json_losses(const char *out, double *loss, int cap)
{
    int n = 0;
    char *copy = strdup(out);
    assert_non_null(copy);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *l = cJSON_GetObjectItem(o, "loss");
        if (cJSON_IsNumber(l) && n < cap)
            loss[n++] = l->valuedouble;
        cJSON_Delete(o);
    }
    free(copy);
    return n;
}

static void test_cli_train(void **state)
{
    regc_test_dir *f = *state;
    double a[4], b[4], c[4];
    regc_test_proc p;
    const char *seeds[] = {"7", "7", "8"};
    double *into[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        int rc = regc_test_run_regc(&p, "train", "--model", "bert-tiny", "--steps", "3", "--batch",
                                    "2", "--seq", "32", "--lr", "1e-3", "--seed", seeds[i],
                                    "--json", i == 0 ? "--save" : NULL, f->path, NULL);
        if (rc != 0)
            fail_msg("exit %d: %s", rc, p.err);
        assert_int_equal(json_losses(p.out, into[i], 4), 3);
        assert_non_null(strstr(p.err, "bert bert-tiny"));
        regc_test_proc_free(&p);
    }
    /* Near-uniform logits at the start: about ln(vocab). */
    if (fabs(a[0] - log(512.0)) > 0.5)
        fail_msg("step-0 loss %g is not near ln(512)", a[0]);
    assert_true(a[0] == b[0] && a[2] == b[2]);
    assert_true(a[0] != c[0]);
    /* The saved directory trains again. */
    int rc = regc_test_run_regc(&p, "train", "--model", f->path, "--steps", "1", "--batch", "2",
                                "--seq", "32", "--json", NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    assert_int_equal(json_losses(p.out, c, 4), 1);
    assert_true(isfinite(c[0]));
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_init_random),
        regc_test_in_dir(test_save_load_round_trip, setup),
        regc_test_in_dir(test_legacy_names_and_extras, setup),
        regc_test_in_dir(test_untied_decoder, setup),
        regc_test_in_dir(test_pad_token, setup),
        regc_test_in_dir(test_config_errors, setup),
        cmocka_unit_test(test_graph_tiny),
        cmocka_unit_test(test_base_shape_only),
        cmocka_unit_test(test_mask_rule),
        regc_test_in_dir(test_cli_train, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
