/* test_llama_frontend.c — Llama models: presets against the published
 * Llama 3 parameter counts, random init, config.json parsing with every
 * default and every error, save/load round trips, checkpoint errors, the
 * flat forward graph (GQA, explicit head_dim, tied and untied head), the
 * rotary tables the architecture fills per batch, shape-only 8B and 70B
 * graphs that cost no weights, and a short `regc train` run. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "regc_models.h"
#include "test_model.h"
#include "test_util.h"

/* f->path is dir/model, the HF directory most tests build. */
static int setup(void **state) { return regc_test_dir_setup(state, "llama", "model"); }

/* A small GQA Llama config.json in f->path (C 24, 6 heads of 4 over 2 kv
 * heads). `extra` adds keys; a required key it names replaces the default
 * one (cJSON would read the first of two). */
static void write_config(regc_test_dir *f, const char *extra)
{
    static const char *const keys[][2] = {
        {"vocab_size", "64"},
        {"hidden_size", "24"},
        {"intermediate_size", "40"},
        {"num_hidden_layers", "2"},
        {"num_attention_heads", "6"},
        {"num_key_value_heads", "2"},
        {"max_position_embeddings", "16"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"llama\", \"bos_token_id\": 1", keys,
                           sizeof keys / sizeof keys[0], extra, NULL);
}

static regc_model *load_config(regc_test_dir *f, const char *extra)
{
    write_config(f, extra);
    return regc_test_load_config(f->path, 0);
}

static void assert_param(regc_model *m, int i, const char *name, int ndim, int64_t d0, int64_t d1)
{
    int64_t shape[REGC_MAX_DIMS];
    assert_string_equal(regc_model_param_name(m, i), name);
    assert_int_equal(regc_model_param_shape(m, i, shape), ndim);
    assert_int_equal(shape[0], d0);
    if (ndim == 2)
        assert_int_equal(shape[1], d1);
}

static void describe_has(regc_model *m, const char *what)
{
    char d[1024];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, what))
        fail_msg("description \"%s\" lacks \"%s\"", d, what);
}

/* ------------------------------------------------------------- presets */

static void test_presets(void **state)
{
    (void)state;
    int found = 0;
    for (int i = 0; regc_model_preset_name(i); i++)
        found += !strcmp(regc_model_preset_name(i), "llama-tiny") +
                 !strcmp(regc_model_preset_name(i), "llama-8b") +
                 !strcmp(regc_model_preset_name(i), "llama-70b");
    assert_int_equal(found, 3);
    assert_true(regc_model_is_preset("llama-8b"));
    assert_false(regc_model_is_preset("llama"));

    /* Llama 3.1 8B: the count Meta and HF publish, and its context. */
    regc_model *m;
    assert_int_equal(regc_model_load("llama-8b", &m), REGC_OK);
    assert_string_equal(regc_model_arch(m), "llama");
    assert_int_equal(regc_model_total_numel(m), 8030261248LL);
    assert_int_equal(regc_model_n_params(m), 1 + 9 * 32 + 2);
    assert_int_equal(regc_model_vocab(m), 128256);
    assert_int_equal(regc_model_max_seq(m), 131072);
    assert_false(regc_model_has_weights(m));
    assert_null(regc_model_weights(m));
    assert_param(m, 0, "model.embed_tokens.weight", 2, 128256, 4096);
    assert_param(m, 1, "model.layers.0.self_attn.q_proj.weight", 2, 4096, 4096);
    assert_param(m, 2, "model.layers.0.self_attn.k_proj.weight", 2, 1024, 4096);
    assert_param(m, 3, "model.layers.0.self_attn.v_proj.weight", 2, 1024, 4096);
    assert_param(m, 4, "model.layers.0.self_attn.o_proj.weight", 2, 4096, 4096);
    assert_param(m, 5, "model.layers.0.mlp.gate_proj.weight", 2, 14336, 4096);
    assert_param(m, 6, "model.layers.0.mlp.up_proj.weight", 2, 14336, 4096);
    assert_param(m, 7, "model.layers.0.mlp.down_proj.weight", 2, 4096, 14336);
    assert_param(m, 8, "model.layers.0.input_layernorm.weight", 1, 4096, 0);
    assert_param(m, 9, "model.layers.0.post_attention_layernorm.weight", 1, 4096, 0);
    assert_param(m, 10, "model.layers.1.self_attn.q_proj.weight", 2, 4096, 4096);
    assert_param(m, 289, "model.norm.weight", 1, 4096, 0);
    assert_param(m, 290, "lm_head.weight", 2, 128256, 4096);
    assert_null(regc_model_param_name(m, 291));
    int64_t off = 0;
    for (int i = 0; i < regc_model_n_params(m); i++) {
        assert_int_equal(regc_model_param_offset(m, i), off);
        off += regc_model_param_numel(m, i);
    }
    assert_int_equal(off, regc_model_total_numel(m));
    describe_has(m, "llama llama-8b");
    describe_has(m, "8,030,261,248 parameters (shape only)");
    describe_has(m, "num_key_value_heads 8, head_dim 128");
    describe_has(m, "rms_norm_eps 1e-05, rope_theta 500000");
    describe_has(m, "untied");
    regc_model_free(m);

    assert_int_equal(regc_model_load("llama-70b", &m), REGC_OK);
    assert_int_equal(regc_model_total_numel(m), 70553706496LL);
    assert_int_equal(regc_model_n_params(m), 1 + 9 * 80 + 2);
    assert_param(m, 2, "model.layers.0.self_attn.k_proj.weight", 2, 1024, 8192);
    assert_param(m, 5, "model.layers.0.mlp.gate_proj.weight", 2, 28672, 8192);
    describe_has(m, "70,553,706,496 parameters");
    regc_model_free(m);

    /* llama-tiny: V 512, C 128, F 344, 4 layers of 4 heads over 2 kv heads. */
    assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_total_numel(m), 857216);
    assert_int_equal(regc_model_n_params(m), 1 + 9 * 4 + 2);
    assert_int_equal(regc_model_vocab(m), 512);
    assert_int_equal(regc_model_max_seq(m), 256);
    assert_param(m, 2, "model.layers.0.self_attn.k_proj.weight", 2, 64, 128);
    regc_model_free(m);
}

static void test_init_random(void **state)
{
    (void)state;
    regc_model *a, *b;
    assert_int_equal(regc_model_load("llama-tiny", &a), REGC_OK);
    assert_int_equal(regc_model_load("llama-tiny", &b), REGC_OK);
    assert_int_equal(regc_model_init_random(a, 7), REGC_OK);
    assert_int_equal(regc_model_init_random(b, 7), REGC_OK);
    regc_test_assert_same_weights(a, b);

    /* Norm weights are 1; every matrix draws with HF's std 0.02. */
    const float *w = regc_model_weights(a);
    const float hw = (float)(0.02 * sqrt(3.0));
    for (int i = 0; i < regc_model_n_params(a); i++) {
        const char *name = regc_model_param_name(a, i);
        const float *p = w + regc_model_param_offset(a, i);
        int64_t n = regc_model_param_numel(a, i);
        if (strstr(name, "norm.weight")) {
            for (int64_t j = 0; j < n; j++)
                assert_true(p[j] == 1.0f);
            continue;
        }
        double sum2 = 0;
        float maxabs = 0;
        for (int64_t j = 0; j < n; j++) {
            sum2 += (double)p[j] * p[j];
            maxabs = fmaxf(maxabs, fabsf(p[j]));
        }
        assert_true(maxabs <= hw);
        if (fabs(sqrt(sum2 / (double)n) - 0.02) > 0.002)
            fail_msg("%s: std %g, expected 0.02", name, sqrt(sum2 / (double)n));
    }
    assert_int_equal(regc_model_init_random(b, 8), REGC_OK);
    assert_memory_not_equal(regc_model_weights(a), regc_model_weights(b), 64);
    regc_model_free(a);
    regc_model_free(b);
}

/* ------------------------------------------------------------- config */

static void test_config_defaults(void **state)
{
    regc_test_dir *f = *state;
    /* Only the required keys: kv heads = heads, head_dim = C / heads, and
     * HF's defaults for the rest. */
    write_config(f, NULL);
    assert_int_equal(regc_test_write_text(f->path, "config.json",
                                          "{\"model_type\": \"llama\", \"vocab_size\": 64, "
                                          "\"hidden_size\": 24, \"intermediate_size\": 40, "
                                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 6}"),
                     0);
    regc_model *m;
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    assert_int_equal(regc_model_max_seq(m), 2048);
    describe_has(m, "num_attention_heads 6, num_key_value_heads 6, head_dim 4");
    describe_has(m, "rms_norm_eps 1e-06, rope_theta 10000, silu, untied");
    describe_has(m, "attention_dropout 0 (not applied: train.dropout off)");
    assert_param(m, 2, "model.layers.0.self_attn.k_proj.weight", 2, 24, 24);
    assert_string_equal(regc_model_param_name(m, regc_model_n_params(m) - 1), "lm_head.weight");
    regc_model_free(m);

    /* null means the default; explicit values are honoured and reported. */
    m = load_config(f, "\"num_key_value_heads\": null, \"head_dim\": null, \"rope_scaling\": null, "
                       "\"hidden_act\": \"silu\", \"attention_bias\": false, \"mlp_bias\": false, "
                       "\"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, "
                       "\"attention_dropout\": 0.1, \"tie_word_embeddings\": true");
    describe_has(m, "num_key_value_heads 6, head_dim 4");
    describe_has(m, "rms_norm_eps 1e-05, rope_theta 500000, silu, tied");
    describe_has(m, "attention_dropout 0.1 (not applied: train.dropout off)");
    assert_string_equal(regc_model_param_name(m, regc_model_n_params(m) - 1), "model.norm.weight");
    regc_model_free(m);

    /* An explicit head_dim need not be C / heads: q is [H*D, C], o [C, H*D]. */
    m = load_config(f, "\"head_dim\": 10");
    assert_param(m, 1, "model.layers.0.self_attn.q_proj.weight", 2, 60, 24);
    assert_param(m, 2, "model.layers.0.self_attn.k_proj.weight", 2, 20, 24);
    assert_param(m, 4, "model.layers.0.self_attn.o_proj.weight", 2, 24, 60);
    assert_param(m, 5, "model.layers.0.mlp.gate_proj.weight", 2, 40, 24);
    assert_param(m, 7, "model.layers.0.mlp.down_proj.weight", 2, 24, 40);
    regc_model_free(m);
}

/* Loading f->path's config fails with `status` and an error that names
 * config.json and says `what`. */
static void expect_config_error(regc_test_dir *f, const char *extra, int status, const char *what)
{
    write_config(f, extra);
    regc_test_expect_config_error(f->path, status, what);
}

static void test_config_errors(void **state)
{
    regc_test_dir *f = *state;
    static const char *const required[] = {"vocab_size", "hidden_size", "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char text[1024], want[128];
        size_t len = (size_t)snprintf(text, sizeof text, "{\"model_type\": \"llama\"");
        for (size_t j = 0; j < sizeof required / sizeof required[0]; j++)
            if (j != i)
                len += (size_t)snprintf(text + len, sizeof text - len, ", \"%s\": 8", required[j]);
        snprintf(text + len, sizeof text - len, "}");
        write_config(f, NULL);
        assert_int_equal(regc_test_write_text(f->path, "config.json", text), 0);
        regc_model *m = (regc_model *)1;
        assert_int_equal(regc_model_load_config(f->path, &m), REGC_ERR_FORMAT);
        assert_null(m);
        snprintf(want, sizeof want, "missing required key \"%s\"", required[i]);
        regc_test_expect_error(regc_test_path_in(f, "config.json"), want);
    }

    expect_config_error(f, "\"hidden_size\": \"24\"", REGC_ERR_FORMAT,
                        "key \"hidden_size\" must be an integer");
    expect_config_error(f, "\"num_hidden_layers\": 2.5", REGC_ERR_FORMAT,
                        "key \"num_hidden_layers\" must be an integer");
    expect_config_error(f, "\"vocab_size\": 0", REGC_ERR_FORMAT, "key \"vocab_size\" is 0");
    expect_config_error(f, "\"intermediate_size\": -3", REGC_ERR_FORMAT,
                        "key \"intermediate_size\" is -3");
    expect_config_error(f, "\"num_key_value_heads\": 4", REGC_ERR_FORMAT,
                        "key \"num_key_value_heads\" is 4, which does not divide "
                        "num_attention_heads 6");
    expect_config_error(f, "\"num_key_value_heads\": 0", REGC_ERR_FORMAT,
                        "key \"num_key_value_heads\" is 0");
    expect_config_error(f, "\"num_attention_heads\": 5, \"num_key_value_heads\": 5",
                        REGC_ERR_FORMAT,
                        "hidden_size 24 is not divisible by num_attention_heads 5 (give "
                        "\"head_dim\" explicitly)");
    expect_config_error(f, "\"head_dim\": 5", REGC_ERR_FORMAT,
                        "key \"head_dim\" is 5, must be even");
    expect_config_error(f, "\"head_dim\": 0", REGC_ERR_FORMAT, "key \"head_dim\" is 0");
    expect_config_error(f, "\"max_position_embeddings\": 0", REGC_ERR_FORMAT,
                        "key \"max_position_embeddings\" is 0");
    expect_config_error(f, "\"rms_norm_eps\": 0", REGC_ERR_FORMAT,
                        "key \"rms_norm_eps\" is 0, must be positive");
    expect_config_error(f, "\"rms_norm_eps\": \"1e-6\"", REGC_ERR_FORMAT,
                        "key \"rms_norm_eps\" must be a number");
    expect_config_error(f, "\"rope_theta\": 0", REGC_ERR_FORMAT, "key \"rope_theta\" is 0");
    expect_config_error(f, "\"rope_theta\": -1", REGC_ERR_FORMAT, "key \"rope_theta\" is -1");
    expect_config_error(f, "\"tie_word_embeddings\": 1", REGC_ERR_FORMAT,
                        "key \"tie_word_embeddings\" must be true or false");
    expect_config_error(f, "\"attention_dropout\": 1.5", REGC_ERR_FORMAT,
                        "key \"attention_dropout\" is 1.5");

    /* Sizes no model has are refused before anything is allocated. */
    expect_config_error(f, "\"num_hidden_layers\": 1000000000", REGC_ERR_FORMAT,
                        "key \"num_hidden_layers\" is 1000000000, above the bound of 4096");
    expect_config_error(f, "\"intermediate_size\": 1073741824", REGC_ERR_FORMAT,
                        "key \"intermediate_size\" is 1073741824, above the bound of 1048576");
    expect_config_error(f, "\"num_key_value_heads\": 100000", REGC_ERR_FORMAT,
                        "key \"num_key_value_heads\" is 100000, above the bound of 16384");

    /* Options regc does not implement are refused by name. */
    expect_config_error(f, "\"hidden_act\": \"quick_gelu\"", REGC_ERR_UNSUPPORTED,
                        "key \"hidden_act\" is \"quick_gelu\" (supported: silu, gelu_pytorch_tanh, "
                        "gelu_new, gelu_fast, gelu, gelu_python, relu)");
    expect_config_error(f, "\"hidden_act\": 3", REGC_ERR_FORMAT,
                        "key \"hidden_act\" must be a string");
    expect_config_error(f, "\"sliding_window\": 4096", REGC_ERR_UNSUPPORTED,
                        "key \"sliding_window\" is not one regc knows for model_type \"llama\"");
    expect_config_error(f, "\"mlp_bias\": \"no\"", REGC_ERR_FORMAT,
                        "key \"mlp_bias\" must be true or false");
    /* RoPE scaling (models/rope.c; every case in tests/test_rope_config.c) */
    expect_config_error(f, "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
                        REGC_ERR_FORMAT, "missing required key \"rope_scaling.low_freq_factor\"");
    expect_config_error(
        f, "\"rope_scaling\": {\"rope_type\": \"proportional\", \"factor\": 8.0}",
        REGC_ERR_UNSUPPORTED,
        "key \"rope_scaling.rope_type\" is \"proportional\": regc does not implement");
    expect_config_error(f, "\"rope_scaling\": false", REGC_ERR_FORMAT,
                        "key \"rope_scaling\" must be an object or null");
}

/* ---------------------------------------------------- save / load files */

static void test_save_load_round_trip(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m, *back;
    assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
    char out[1200];
    snprintf(out, sizeof out, "%s/runs/step1", f->dir);
    assert_int_equal(regc_model_save(m, out), REGC_ERR_ARG); /* shape-only */
    regc_test_expect_error("no weights", NULL);
    assert_int_equal(regc_model_init_random(m, 99), REGC_OK);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    assert_int_equal(regc_model_load(out, &back), REGC_OK);
    assert_string_equal(regc_model_arch(back), "llama");
    regc_test_assert_same_weights(m, back);
    assert_int_equal(regc_model_vocab(back), 512);
    assert_int_equal(regc_model_max_seq(back), 256);
    describe_has(back, "num_key_value_heads 2, head_dim 32, rms_norm_eps 1e-06, rope_theta 10000");

    char *cfg_path = regc_test_join(out, "config.json");
    char *cfg = regc_test_read_file(cfg_path, NULL);
    free(cfg_path);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"LlamaForCausalLM\""));
    assert_non_null(strstr(cfg, "\"model_type\":\t\"llama\""));
    assert_non_null(strstr(cfg, "\"rope_scaling\":\tnull"));
    free(cfg);
    regc_model_free(back);
    regc_model_free(m);

    /* A tied GQA model with an explicit head_dim keeps every setting. */
    m = load_config(f, "\"head_dim\": 10, \"tie_word_embeddings\": true, \"rope_theta\": 250000.0, "
                       "\"rms_norm_eps\": 3e-6, \"attention_dropout\": 0.25");
    assert_int_equal(regc_model_init_random(m, 5), REGC_OK);
    snprintf(out, sizeof out, "%s/tied", f->dir);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    assert_int_equal(regc_model_load(out, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    describe_has(back, "num_attention_heads 6, num_key_value_heads 2, head_dim 10");
    describe_has(back, "rms_norm_eps 3e-06, rope_theta 250000");
    describe_has(back, "tied embeddings");
    describe_has(back, "attention_dropout 0.25");
    regc_st_file *st;
    char *st_path = regc_test_join(out, "model.safetensors");
    assert_int_equal(regc_st_open(st_path, &st), REGC_OK);
    free(st_path);
    assert_int_equal(regc_st_count(st), 1 + 9 * 2 + 1);
    assert_int_equal(regc_st_find(st, "lm_head.weight"), -1);
    regc_st_close(st);
    regc_model_free(back);
    regc_model_free(m);
}

static void test_weight_errors(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_config(f, NULL), *back = (regc_model *)1;
    assert_int_equal(regc_model_init_random(m, 11), REGC_OK);
    int n = regc_model_n_params(m);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    assert_non_null(e);
    int kproj = -1;
    for (int i = 0; i < n; i++) {
        e[i].name = (char *)regc_model_param_name(m, i);
        e[i].dtype = REGC_F32;
        e[i].ndim = regc_model_param_shape(m, i, e[i].shape);
        e[i].data = regc_model_weights(m) + regc_model_param_offset(m, i);
        if (!strcmp(e[i].name, "model.layers.1.self_attn.k_proj.weight"))
            kproj = i;
    }
    assert_true(kproj > 0);
    /* A full-size k_proj ([C, C]) where the config says 2 kv heads ([8, 24]). */
    e[kproj].shape[0] = 24;
    float *big = calloc(24 * 24, sizeof *big);
    assert_non_null(big);
    const float *saved = e[kproj].data;
    e[kproj].data = big;
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), e, n), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_SHAPE);
    assert_null(back);
    regc_test_expect_error(regc_test_path_in(f, "model.safetensors"),
                           "tensor model.layers.1.self_attn.k_proj.weight has shape [24, 24], "
                           "expected [8, 24]");
    e[kproj].shape[0] = 8;
    e[kproj].data = saved;

    /* The untied head missing. */
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), e, n - 1), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error(regc_test_path_in(f, "model.safetensors"),
                           "missing tensor lm_head.weight");

    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), e, n), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    regc_model_free(back);
    free(big);
    free(e);
    regc_model_free(m);
}

/* --------------------------------------------------------------- graph */

static void test_graph_tiny(void **state)
{
    (void)state;
    regc_model *m;
    assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    /* the embedding, 16 nodes per layer, final norm, head and loss */
    assert_int_equal(regc_graph_n_nodes(g), 1 + 16 * 4 + 3);
    int inputs = 0, params = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        inputs += x->role == REGC_ROLE_INPUT;
        if (x->role == REGC_ROLE_PARAM) {
            assert_string_equal(x->name, regc_model_param_name(m, params));
            int64_t shape[REGC_MAX_DIMS];
            assert_int_equal(x->ndim, regc_model_param_shape(m, params, shape));
            assert_memory_equal(x->shape, shape, (size_t)x->ndim * sizeof *shape);
            params++;
        }
    }
    assert_int_equal(inputs, 4);
    assert_int_equal(params, 39);
    assert_int_equal(regc_graph_find_tensor(g, "position_ids"), -1);
    static const char *const tables[] = {"rope_cos", "rope_sin"};
    for (int i = 0; i < 2; i++) {
        const regc_tensor *t = regc_graph_tensor(g, regc_graph_find_tensor(g, tables[i]));
        assert_int_equal(t->role, REGC_ROLE_INPUT);
        assert_int_equal(t->dtype, REGC_F32);
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->shape[0], 8);
        assert_int_equal(t->shape[1], 16);
    }
    const int cos_id = regc_graph_find_tensor(g, "rope_cos");

    /* Layer 0, op by op, in forward order; every later layer repeats it. */
    static const regc_op layer[16] = {
        REGC_OP_RMSNORM, REGC_OP_MATMUL,  REGC_OP_MATMUL,    REGC_OP_MATMUL,
        REGC_OP_ROPE,    REGC_OP_ROPE,    REGC_OP_ATTENTION, REGC_OP_MATMUL,
        REGC_OP_ADD,     REGC_OP_RMSNORM, REGC_OP_MATMUL,    REGC_OP_SILU,
        REGC_OP_MATMUL,  REGC_OP_MUL,     REGC_OP_MATMUL,    REGC_OP_ADD,
    };
    assert_int_equal(regc_graph_node(g, 0)->op, REGC_OP_EMBEDDING);
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 16; i++)
            assert_int_equal(regc_graph_node(g, 1 + 16 * l + i)->op, layer[i]);
    const regc_node *qm = regc_graph_node(g, 2), *km = regc_graph_node(g, 3);
    assert_int_equal(qm->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, qm->in[1])->name,
                        "model.layers.0.self_attn.q_proj.weight");
    assert_int_equal(regc_graph_tensor(g, km->out[0])->shape[2], 64); /* 2 kv heads of 32 */
    const regc_node *rq = regc_graph_node(g, 5), *rk = regc_graph_node(g, 6);
    assert_int_equal(rq->attrs.n_head, 4);
    assert_int_equal(rk->attrs.n_head, 2);
    assert_int_equal(rq->in[0], qm->out[0]);
    assert_int_equal(rk->in[0], km->out[0]);
    assert_int_equal(rq->in[1], cos_id);
    assert_int_equal(regc_graph_node(g, 1 + 16 * 3 + 4)->in[1], cos_id); /* one table for all */
    const regc_node *attn = regc_graph_node(g, 7);
    assert_int_equal(attn->attrs.n_head, 4);
    assert_int_equal(attn->attrs.n_kv_head, 2);
    assert_int_equal(attn->attrs.causal, 1);
    assert_true(fabsf(attn->attrs.scale - 1.0f / sqrtf(32.0f)) < 1e-7f);
    assert_true(fabsf(regc_graph_node(g, 1)->attrs.eps - 1e-6f) < 1e-12f);
    /* silu(gate) * up */
    const regc_node *gate = regc_graph_node(g, 11), *silu = regc_graph_node(g, 12);
    const regc_node *up = regc_graph_node(g, 13), *mul = regc_graph_node(g, 14);
    assert_string_equal(regc_graph_tensor(g, gate->in[1])->name,
                        "model.layers.0.mlp.gate_proj.weight");
    assert_int_equal(silu->in[0], gate->out[0]);
    assert_string_equal(regc_graph_tensor(g, up->in[1])->name, "model.layers.0.mlp.up_proj.weight");
    assert_int_equal(mul->in[0], silu->out[0]);
    assert_int_equal(mul->in[1], up->out[0]);
    const regc_node *head = regc_graph_node(g, regc_graph_n_nodes(g) - 2);
    assert_int_equal(head->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, head->in[1])->name, "lm_head.weight");
    assert_int_equal(regc_graph_tensor(g, head->out[0])->shape[2], 512);
    assert_int_equal(regc_graph_n_outputs(g), 1);
    assert_int_equal(regc_graph_tensor(g, regc_graph_output(g, 0))->ndim, 0);
    regc_graph_free(g);

    assert_int_equal(regc_model_build_graph(m, 1, 256, &g), REGC_OK);
    regc_graph_free(g);
    g = (regc_graph *)1;
    assert_int_equal(regc_model_build_graph(m, 1, 257, &g), REGC_ERR_ARG);
    assert_null(g);
    assert_string_equal(regc_error_message(),
                        "sequence length 257 exceeds max_position_embeddings 256 of llama-tiny");
    regc_model_free(m);
}

static void test_graph_tied_head_dim(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_config(f, "\"head_dim\": 10, \"tie_word_embeddings\": true");
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 3, 5, &g), REGC_OK);
    const regc_tensor *table = regc_graph_tensor(g, regc_graph_find_tensor(g, "rope_cos"));
    assert_int_equal(table->shape[0], 5);
    assert_int_equal(table->shape[1], 5);
    const regc_node *attn = regc_graph_node(g, 7);
    assert_int_equal(attn->op, REGC_OP_ATTENTION);
    assert_true(fabsf(attn->attrs.scale - 1.0f / sqrtf(10.0f)) < 1e-7f);
    assert_int_equal(regc_graph_tensor(g, attn->out[0])->shape[2], 60);
    assert_int_equal(regc_graph_tensor(g, regc_graph_node(g, 8)->out[0])->shape[2], 24);
    const regc_node *head = regc_graph_node(g, regc_graph_n_nodes(g) - 2);
    assert_string_equal(regc_graph_tensor(g, head->in[1])->name, "model.embed_tokens.weight");
    regc_graph_free(g);
    regc_model_free(m);
}

/* The rotary tables the architecture fills: HF's float32 angles, whose
 * cos and sin must agree with double-precision trigonometry of the exact
 * angle t / theta^(2j/D) to float32 rounding of the angle. */
static void test_fill_inputs(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_config(f, "\"head_dim\": 10, \"rope_theta\": 500000.0");
    const int64_t B = 2, T = 16, half = 5;
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, B, T, &g), REGC_OK);
    regc_input in[8];
    int n = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role != REGC_ROLE_INPUT)
            continue;
        assert_true(n < 8);
        in[n] = (regc_input){
            .tensor = x, .host = calloc((size_t)regc_tensor_numel(x), regc_dtype_size(x->dtype))};
        assert_non_null(in[n].host);
        n++;
    }
    assert_int_equal(n, 4);
    regc_tokens *data;
    assert_int_equal(regc_tokens_builtin(&data), REGC_OK);
    regc_batch_spec b = {.step = 1, .batch = B, .seq = T, .seed = 0};
    assert_int_equal(regc_model_fill_inputs(m, data, &b, n, in), REGC_OK);
    int32_t ids[2 * 16], targets[2 * 16];
    assert_int_equal(regc_tokens_batch(data, 1, B, T, ids, targets), REGC_OK);
    const float *cs = NULL, *sn = NULL;
    for (int i = 0; i < n; i++) {
        assert_true(in[i].filled);
        if (!strcmp(in[i].tensor->name, "input_ids"))
            assert_memory_equal(in[i].host, ids, sizeof ids);
        if (!strcmp(in[i].tensor->name, "targets"))
            assert_memory_equal(in[i].host, targets, sizeof targets);
        if (!strcmp(in[i].tensor->name, "rope_cos"))
            cs = in[i].host;
        if (!strcmp(in[i].tensor->name, "rope_sin"))
            sn = in[i].host;
    }
    assert_true(cs && sn);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < half; j++) {
            double angle = (double)t * pow(500000.0, -2.0 * (double)j / 10.0);
            /* float32 rounding of inv_freq and of the product */
            double tol = 4.0 * 6e-8 * (angle + 1e-30) + 1e-7;
            float c = cs[t * half + j], s = sn[t * half + j];
            if (fabs(c - cos(angle)) > tol || fabs(s - sin(angle)) > tol)
                fail_msg("rotary table at t=%lld j=%lld: cos %.9g sin %.9g, expected %.9g %.9g",
                         (long long)t, (long long)j, (double)c, (double)s, cos(angle), sin(angle));
        }
    }
    /* position 0 is the identity, and the lowest frequency of position 1
     * is 1 radian exactly */
    for (int64_t j = 0; j < half; j++) {
        assert_true(cs[j] == 1.0f);
        assert_true(sn[j] == 0.0f);
    }
    assert_true(cs[half] == cosf(1.0f));
    assert_true(sn[half] == sinf(1.0f));
    regc_tokens_free(data);
    for (int i = 0; i < n; i++)
        free(in[i].host);
    regc_graph_free(g);
    regc_model_free(m);
}

/* Shape-only 8B and 70B models: the model and the graph cost shapes only. */
static void test_graph_big_shape_only(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int layers;
    } big[] = {{"llama-8b", 32}, {"llama-70b", 80}};
    for (int i = 0; i < 2; i++) {
        double t0 = regc_time_ms();
        regc_model *m;
        assert_int_equal(regc_model_load_shapes(big[i].name, &m), REGC_OK);
        regc_graph *g;
        assert_int_equal(regc_model_build_graph(m, 8, 8192, &g), REGC_OK);
        assert_int_equal(regc_graph_n_nodes(g), 1 + 16 * big[i].layers + 3);
        assert_false(regc_model_has_weights(m));
        assert_null(regc_model_weights(m));
        const regc_tensor *logits =
            regc_graph_tensor(g, regc_graph_node(g, regc_graph_n_nodes(g) - 2)->out[0]);
        assert_int_equal(logits->shape[0], 8);
        assert_int_equal(logits->shape[1], 8192);
        assert_int_equal(logits->shape[2], 128256);
        assert_true(regc_time_ms() - t0 < 2000.0);
        regc_graph_free(g);
        g = (regc_graph *)1;
        assert_int_equal(regc_model_build_graph(m, 1, 131073, &g), REGC_ERR_ARG);
        regc_test_expect_error("exceeds max_position_embeddings 131072", big[i].name);
        regc_model_free(m);
    }
}

/* ----------------------------------------------------------------- CLI */

static void test_train_cli(void **state)
{
    regc_test_dir *f = *state;
    regc_test_proc p;
    char *save = regc_test_join(f->dir, "trained");
    int rc = regc_test_run_regc(&p, "train", "--model", "llama-tiny", "--steps", "4", "--batch",
                                "2", "--seq", "32", "--lr", "1e-3", "--json", "--save", save, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    assert_non_null(strstr(p.err, "llama llama-tiny"));
    double loss[4];
    int n = 0;
    for (const char *s = strstr(p.out, "\"loss\":"); s && n < 4; s = strstr(s + 1, "\"loss\":"))
        loss[n++] = strtod(s + 7, NULL);
    assert_int_equal(n, 4);
    /* Random init with std 0.02 gives near-uniform logits: loss ~ ln(512). */
    if (fabs(loss[0] - log(512.0)) > 0.3)
        fail_msg("step-0 loss %g is not near ln(512) = %g", loss[0], log(512.0));
    for (int i = 0; i < 4; i++)
        assert_true(isfinite(loss[i]));
    assert_true(loss[3] < loss[0]);
    regc_test_proc_free(&p);

    regc_model *m;
    assert_int_equal(regc_model_load(save, &m), REGC_OK);
    assert_string_equal(regc_model_arch(m), "llama");
    assert_int_equal(regc_model_total_numel(m), 857216);
    regc_model_free(m);

    rc = regc_test_run_regc(&p, "train", "--model", "llama-tiny", "--steps", "1", "--batch", "1",
                            "--seq", "257", NULL);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(p.err, "max_position_embeddings 256"));
    regc_test_proc_free(&p);
    free(save);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_init_random),
        regc_test_in_dir(test_config_defaults, setup),
        regc_test_in_dir(test_config_errors, setup),
        regc_test_in_dir(test_save_load_round_trip, setup),
        regc_test_in_dir(test_weight_errors, setup),
        cmocka_unit_test(test_graph_tiny),
        regc_test_in_dir(test_graph_tied_head_dim, setup),
        regc_test_in_dir(test_fill_inputs, setup),
        cmocka_unit_test(test_graph_big_shape_only),
        regc_test_in_dir(test_train_cli, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
