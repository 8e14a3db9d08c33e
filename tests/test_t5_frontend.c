/* test_t5_frontend.c — T5 models: presets and their published parameter
 * counts, config.json parsing and every config error, save/load round
 * trips, the relative-position buckets against PyTorch's
 * (tests/data/t5_reference.json), the sequence-to-sequence inputs, the flat
 * encoder-decoder graph, a shape-only t5-small and a `regc train` run. */
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
#include "test_reference.h"
#include "test_util.h"

#define REF_PATH REGC_SOURCE_DIR "/tests/data/t5_reference.json"

static int setup(void **state) { return regc_test_dir_setup(state, "t5", "model"); }

/* A small T5 config.json in f->path. `extra` adds keys; a required key it
 * names replaces the default one (cJSON would read the first of two). */
static void write_config(regc_test_dir *f, const char *extra)
{
    static const char *const keys[][2] = {
        {"vocab_size", "64"}, {"d_model", "16"},   {"d_kv", "4"},
        {"d_ff", "24"},       {"num_layers", "2"}, {"num_heads", "3"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"t5\", \"_name_or_path\": [1, 2]", keys,
                           sizeof keys / sizeof keys[0], extra, NULL);
}

static regc_model *load_config(regc_test_dir *f, const char *extra)
{
    write_config(f, extra);
    return regc_test_load_config(f->path, 0);
}

/* ------------------------------------------------------------- presets */

static void test_presets(void **state)
{
    (void)state;
    assert_true(regc_model_is_preset("t5-tiny"));
    assert_true(regc_model_is_preset("t5-small"));
    regc_model *m;
    /* Hugging Face's t5-small: 60,506,624 parameters (shared counted once) */
    assert_int_equal(regc_model_load("t5-small", &m), REGC_OK);
    assert_string_equal(regc_model_arch(m), "t5");
    assert_int_equal(regc_model_total_numel(m), 60506624);
    /* shared, 6 x (4 + 1 + 2 + 1) + bias + final, 6 x (4 + 1 + 4 + 1 + 2 + 1) + bias + final */
    assert_int_equal(regc_model_n_params(m), 1 + 6 * 8 + 2 + 6 * 13 + 2);
    assert_int_equal(regc_model_vocab(m), 32128);
    assert_false(regc_model_has_weights(m));
    assert_null(regc_model_weights(m));
    assert_string_equal(regc_model_param_name(m, 0), "shared.weight");
    assert_string_equal(regc_model_param_name(m, 1),
                        "encoder.block.0.layer.0.SelfAttention.q.weight");
    assert_string_equal(regc_model_param_name(m, 5),
                        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    assert_string_equal(regc_model_param_name(m, 6), "encoder.block.0.layer.0.layer_norm.weight");
    assert_string_equal(regc_model_param_name(m, 7),
                        "encoder.block.0.layer.1.DenseReluDense.wi.weight");
    assert_string_equal(regc_model_param_name(m, 10),
                        "encoder.block.1.layer.0.SelfAttention.q.weight");
    regc_test_assert_param_shape(
        m, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 2, 32, 8);
    assert_int_equal(regc_test_param_index(
                         m, "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
                     -1);
    regc_test_assert_param_shape(
        m, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 2, 32, 8);
    regc_test_assert_param_shape(m, "decoder.block.5.layer.1.EncDecAttention.k.weight", 2, 512,
                                 512);
    regc_test_assert_param_shape(m, "decoder.block.5.layer.2.DenseReluDense.wo.weight", 2, 512,
                                 2048);
    assert_string_equal(regc_model_param_name(m, regc_model_n_params(m) - 1),
                        "decoder.final_layer_norm.weight");
    assert_int_equal(regc_test_param_index(m, "lm_head.weight"), -1);
    assert_int_equal(regc_test_param_index(m, "encoder.embed_tokens.weight"), -1);
    int64_t off = 0;
    for (int i = 0; i < regc_model_n_params(m); i++) {
        assert_int_equal(regc_model_param_offset(m, i), off);
        off += regc_model_param_numel(m, i);
    }
    char d[512];
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "t5-small"));
    assert_non_null(strstr(d, "60,506,624 parameters (shape only)"));
    assert_non_null(strstr(d, "6 encoder + 6 decoder layers"));
    assert_non_null(strstr(d, "dropout_rate 0.1 (not applied: train.dropout off)"));
    regc_model_free(m);

    assert_int_equal(regc_model_load("t5-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_total_numel(m), 722688);
    regc_model_free(m);
}

static void test_init_random(void **state)
{
    (void)state;
    regc_model *m;
    assert_int_equal(regc_model_load("t5-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_init_random(m, 3), REGC_OK);
    const float *w = regc_model_weights(m);
    /* HF's T5 init scales, drawn uniform: norms are 1, q has std
     * (d_model d_kv)^-1/2, wo has std d_ff^-1/2 */
    struct {
        const char *name;
        double std;
    } t[] = {
        {"shared.weight", 1.0},
        {"encoder.block.0.layer.0.SelfAttention.q.weight", 1.0 / sqrt(128.0 * 32.0)},
        {"encoder.block.1.layer.0.SelfAttention.k.weight", 1.0 / sqrt(128.0)},
        {"decoder.block.1.layer.2.DenseReluDense.wo.weight", 1.0 / sqrt(256.0)},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        int i = regc_test_param_index(m, t[k].name);
        assert_true(i >= 0);
        const float *p = w + regc_model_param_offset(m, i);
        int64_t n = regc_model_param_numel(m, i);
        double s2 = 0;
        for (int64_t j = 0; j < n; j++)
            s2 += (double)p[j] * p[j];
        double rms = sqrt(s2 / (double)n);
        if (fabs(rms - t[k].std) > 0.1 * t[k].std)
            fail_msg("%s: rms %g, expected std %g", t[k].name, rms, t[k].std);
    }
    int ln = regc_test_param_index(m, "decoder.final_layer_norm.weight");
    for (int64_t j = 0; j < 128; j++)
        assert_true(w[regc_model_param_offset(m, ln) + j] == 1.0f);
    regc_model_free(m);
}

/* ---------------------------------------------------------- config.json */

static void test_config_defaults_and_keys(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_config(f, NULL);
    char d[768];
    regc_model_describe(m, d, sizeof d);
    /* num_decoder_layers defaults to num_layers; 32 buckets up to 128; eps 1e-6 */
    assert_non_null(strstr(d, "2 encoder + 2 decoder layers, 3 heads"));
    assert_non_null(strstr(d, "32 relative buckets up to 128"));
    assert_non_null(strstr(d, "layer_norm_epsilon 1e-06, relu, tied embeddings, decoder start 0"));
    assert_int_equal(regc_test_param_index(m, "lm_head.weight"), -1);
    regc_test_assert_param_shape(m, "encoder.block.1.layer.1.DenseReluDense.wi.weight", 2, 24, 16);
    regc_test_assert_param_shape(m, "encoder.block.1.layer.0.SelfAttention.o.weight", 2, 16, 12);
    regc_model_free(m);

    m = load_config(f, "\"num_decoder_layers\": 3, \"feed_forward_proj\": \"gated-gelu\", "
                       "\"tie_word_embeddings\": false, \"pad_token_id\": 5, "
                       "\"relative_attention_num_buckets\": 8, "
                       "\"relative_attention_max_distance\": 20, \"dropout_rate\": 0.25, "
                       "\"num_heads\": 2");
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "2 encoder + 3 decoder layers, 2 heads"));
    assert_non_null(strstr(d, "8 relative buckets up to 20"));
    assert_non_null(strstr(d, "gated-gelu, untied embeddings, decoder start 5"));
    assert_non_null(strstr(d, "dropout_rate 0.25"));
    regc_test_assert_param_shape(m, "decoder.block.2.layer.2.DenseReluDense.wi_0.weight", 2, 24,
                                 16);
    regc_test_assert_param_shape(m, "decoder.block.2.layer.2.DenseReluDense.wi_1.weight", 2, 24,
                                 16);
    regc_test_assert_param_shape(
        m, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 2, 8, 2);
    assert_int_equal(
        regc_test_param_index(
            m, "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"),
        -1);
    assert_int_equal(regc_test_param_index(m, "decoder.block.0.layer.2.DenseReluDense.wi.weight"),
                     -1);
    assert_string_equal(regc_model_param_name(m, regc_model_n_params(m) - 1), "lm_head.weight");
    regc_model_free(m);

    m = load_config(f, "\"decoder_start_token_id\": 9, \"pad_token_id\": 4, "
                       "\"num_decoder_layers\": null");
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "2 encoder + 2 decoder layers"));
    assert_non_null(strstr(d, "decoder start 9"));
    regc_model_free(m);
}

static void expect_config_error(regc_test_dir *f, const char *extra, int status, const char *what)
{
    write_config(f, extra);
    regc_test_expect_config_error(f->path, status, what);
}

static void test_config_errors(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, NULL);
    static const char *const required[] = {"vocab_size", "d_model",    "d_kv",
                                           "d_ff",       "num_layers", "num_heads"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        /* the small config with one required key left out */
        char text[512], want[96];
        size_t len = (size_t)snprintf(text, sizeof text, "{\"model_type\": \"t5\"");
        for (size_t k = 0; k < sizeof required / sizeof required[0]; k++)
            if (k != i)
                len += (size_t)snprintf(text + len, sizeof text - len, ", \"%s\": 4", required[k]);
        snprintf(text + len, sizeof text - len, "}");
        assert_int_equal(regc_test_write_text(f->path, "config.json", text), 0);
        regc_model *m = (regc_model *)1;
        assert_int_equal(regc_model_load_config(f->path, &m), REGC_ERR_FORMAT);
        assert_null(m);
        snprintf(want, sizeof want, "missing required key \"%s\"", required[i]);
        regc_test_expect_error(regc_test_path_in(f, "config.json"), want);
    }
    expect_config_error(f, "\"d_kv\": null", REGC_ERR_FORMAT, "key \"d_kv\" must be an integer");
    expect_config_error(
        f, "\"feed_forward_proj\": \"gated-silu\"", REGC_ERR_UNSUPPORTED,
        "key \"feed_forward_proj\" is \"gated-silu\" (supported: relu, gated-gelu)");
    expect_config_error(f, "\"feed_forward_proj\": \"gelu\"", REGC_ERR_UNSUPPORTED,
                        "key \"feed_forward_proj\" is \"gelu\"");
    expect_config_error(f, "\"feed_forward_proj\": 1", REGC_ERR_FORMAT,
                        "key \"feed_forward_proj\" must be a string");
    expect_config_error(f, "\"is_encoder_decoder\": false", REGC_ERR_UNSUPPORTED,
                        "key \"is_encoder_decoder\" = false is not supported");
    expect_config_error(f, "\"d_model\": 16.5", REGC_ERR_FORMAT,
                        "key \"d_model\" must be an integer");
    expect_config_error(f, "\"num_heads\": 0", REGC_ERR_FORMAT, "key \"num_heads\" is 0");
    expect_config_error(f, "\"num_decoder_layers\": 0", REGC_ERR_FORMAT,
                        "key \"num_decoder_layers\" is 0");
    expect_config_error(f, "\"relative_attention_num_buckets\": 3", REGC_ERR_FORMAT,
                        "key \"relative_attention_num_buckets\" is 3");
    expect_config_error(f, "\"relative_attention_max_distance\": 16", REGC_ERR_FORMAT,
                        "key \"relative_attention_max_distance\" is 16, which must exceed");
    expect_config_error(f, "\"layer_norm_epsilon\": -1", REGC_ERR_FORMAT,
                        "key \"layer_norm_epsilon\" is -1");
    expect_config_error(f, "\"tie_word_embeddings\": \"yes\"", REGC_ERR_FORMAT,
                        "key \"tie_word_embeddings\" must be true or false");
    expect_config_error(f, "\"decoder_start_token_id\": 64", REGC_ERR_FORMAT,
                        "key \"decoder_start_token_id\" is 64");
    expect_config_error(f, "\"pad_token_id\": -1", REGC_ERR_FORMAT, "key \"pad_token_id\" is -1");
    expect_config_error(f, "\"dropout_rate\": 2", REGC_ERR_FORMAT, "key \"dropout_rate\" is 2");
}

/* ---------------------------------------------------- save / load files */

static void test_save_load_round_trip(void **state)
{
    regc_test_dir *f = *state;
    static const char *const variants[] = {
        NULL,
        "\"feed_forward_proj\": \"gated-gelu\", \"tie_word_embeddings\": false, "
        "\"num_decoder_layers\": 1, \"decoder_start_token_id\": 2, \"layer_norm_epsilon\": 1e-5",
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        regc_model *m = load_config(f, variants[v]), *back;
        assert_int_equal(regc_model_init_random(m, 100 + v), REGC_OK);
        char out[1200];
        snprintf(out, sizeof out, "%s/saved%zu", f->dir, v);
        assert_int_equal(regc_model_save(m, out), REGC_OK);
        assert_int_equal(regc_model_load(out, &back), REGC_OK);
        regc_test_assert_same_weights(m, back);
        char d1[768], d2[768];
        regc_model_describe(m, d1, sizeof d1);
        regc_model_describe(back, d2, sizeof d2);
        /* the same configuration, read back from the written config.json */
        assert_string_equal(strchr(d1, ':'), strchr(d2, ':'));
        snprintf(out + strlen(out), sizeof out - strlen(out), "/config.json");
        char *cfg = regc_test_read_file(out, NULL);
        assert_non_null(cfg);
        assert_non_null(strstr(cfg, "\"T5ForConditionalGeneration\""));
        assert_non_null(strstr(cfg, "\"is_encoder_decoder\":\ttrue"));
        free(cfg);
        regc_model_free(back);
        regc_model_free(m);
    }
}

/* ------------------------------------------------- buckets and inputs */

/* The two bucket tables of a [1, n] graph, filled by the model. */
static void fill_buckets(regc_model *m, int64_t n, int32_t **enc, int32_t **dec)
{
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 1, n, &g), REGC_OK);
    regc_input in[2] = {
        {.tensor = regc_graph_tensor(g, regc_graph_find_tensor(g, "encoder_position_buckets"))},
        {.tensor = regc_graph_tensor(g, regc_graph_find_tensor(g, "decoder_position_buckets"))},
    };
    *enc = malloc((size_t)(n * n) * sizeof **enc);
    *dec = malloc((size_t)(n * n) * sizeof **dec);
    assert_true(*enc && *dec);
    in[0].host = *enc;
    in[1].host = *dec;
    regc_batch_spec b = {.step = 0, .batch = 1, .seq = n};
    assert_int_equal(regc_model_fill_inputs(m, NULL, &b, 2, in), REGC_OK);
    regc_graph_free(g);
}

static void test_buckets_match_pytorch(void **state)
{
    regc_test_dir *f = *state;
    cJSON *ref = regc_test_load_json(REF_PATH);
    const cJSON *tables = regc_test_json_get(ref, "buckets"), *t;
    int checked = 0;
    cJSON_ArrayForEach (t, tables) {
        const int64_t nb = (int64_t)regc_test_json_number(t, "num_buckets");
        const int64_t md = (int64_t)regc_test_json_number(t, "max_distance");
        const int64_t n = (int64_t)regc_test_json_number(t, "n");
        const int bidir = cJSON_IsTrue(regc_test_json_get(t, "bidirectional"));
        int32_t *want = regc_test_json_ints(t, "buckets", (size_t)(2 * n - 1)); /* rel -(n-1).. */
        char extra[160];
        snprintf(extra, sizeof extra,
                 "\"relative_attention_num_buckets\": %lld, \"relative_attention_max_distance\": "
                 "%lld",
                 (long long)nb, (long long)md);
        regc_model *m = load_config(f, extra);
        int32_t *enc, *dec;
        fill_buckets(m, n, &enc, &dec);
        const int32_t *got = bidir ? enc : dec;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++)
                if (got[i * n + j] != want[j - i + n - 1])
                    fail_msg("buckets %lld/%lld %s [%lld, %lld]: regc %d, PyTorch %d",
                             (long long)nb, (long long)md, bidir ? "bidirectional" : "causal",
                             (long long)i, (long long)j, got[i * n + j], want[j - i + n - 1]);
        checked++;
        free(enc);
        free(dec);
        free(want);
        regc_model_free(m);
    }
    assert_true(checked >= 10);
    cJSON_Delete(ref);
}

static void test_seq2seq_inputs(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_config(f, "\"decoder_start_token_id\": 63");
    /* tokens 0..40: B = 2, T = 5 reads rows of 10, batch 1 starts at 20 */
    uint16_t tok[41];
    for (int i = 0; i < 41; i++)
        tok[i] = (uint16_t)i;
    char *path = regc_test_join(f->dir, "tok.bin");
    assert_int_equal(regc_tokens_write(path, tok, 41), REGC_OK);
    regc_tokens *data;
    assert_int_equal(regc_tokens_open(path, 64, &data), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 2, 5, &g), REGC_OK);
    static const char *const names[] = {"input_ids", "decoder_input_ids", "targets",
                                        "encoder_position_buckets", "decoder_position_buckets"};
    regc_input in[5];
    int32_t buf[5][25];
    for (int i = 0; i < 5; i++) {
        int id = regc_graph_find_tensor(g, names[i]);
        assert_true(id >= 0);
        in[i] = (regc_input){.tensor = regc_graph_tensor(g, id), .host = buf[i]};
    }
    regc_batch_spec b = {.step = 1, .batch = 2, .seq = 5};
    assert_int_equal(regc_model_fill_inputs(m, data, &b, 5, in), REGC_OK);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 5; t++) {
            int row = 20 + 10 * r;
            assert_int_equal(buf[0][r * 5 + t], row + t);
            assert_int_equal(buf[2][r * 5 + t], row + 5 + t);
            assert_int_equal(buf[1][r * 5 + t], t == 0 ? 63 : row + 5 + t - 1);
        }
    /* step 2 wraps: only (41 - 1) / 20 = 2 batches fit */
    b.step = 2;
    assert_int_equal(regc_model_fill_inputs(m, data, &b, 5, in), REGC_OK);
    assert_int_equal(buf[0][0], 0);
    /* too few tokens for rows of 2T */
    b.batch = 1;
    b.seq = 25;
    regc_graph_free(g);
    assert_int_equal(regc_model_build_graph(m, 1, 25, &g), REGC_OK);
    int32_t big[3][25], bk[2][625];
    for (int i = 0; i < 5; i++)
        in[i] = (regc_input){.tensor = regc_graph_tensor(g, regc_graph_find_tensor(g, names[i])),
                             .host = i < 3 ? (void *)big[i] : (void *)bk[i - 3]};
    b.step = 0;
    assert_int_equal(regc_model_fill_inputs(m, data, &b, 5, in), REGC_ERR_SHAPE);
    regc_test_expect_error("41 tokens are too few", NULL);
    regc_graph_free(g);
    regc_tokens_free(data);
    free(path);
    regc_model_free(m);
}

/* --------------------------------------------------------------- graph */

static void test_graph_tiny(void **state)
{
    (void)state;
    regc_model *m;
    assert_int_equal(regc_model_load("t5-tiny", &m), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 2, 7, &g), REGC_OK);
    /* 2 embeddings + 2 x (embedding, transpose) for the biases; encoder layer
     * 12 nodes, decoder layer 19; final norms 2; scale, head, loss */
    assert_int_equal(regc_graph_n_nodes(g), 2 + 4 + 12 * 2 + 19 * 2 + 2 + 3);
    int inputs = 0, params = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role == REGC_ROLE_INPUT) {
            inputs++;
            assert_int_equal(x->dtype, REGC_I32);
        }
        if (x->role == REGC_ROLE_PARAM) {
            assert_string_equal(x->name, regc_model_param_name(m, params));
            params++;
        }
    }
    assert_int_equal(inputs, 5);
    assert_int_equal(params, regc_model_n_params(m));
    const regc_tensor *eb =
        regc_graph_tensor(g, regc_graph_find_tensor(g, "encoder_position_buckets"));
    assert_int_equal(eb->ndim, 2);
    assert_int_equal(eb->shape[0], 7);
    assert_int_equal(eb->shape[1], 7);
    assert_true(regc_graph_find_tensor(g, "decoder_input_ids") >= 0);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_RMSNORM), 2 * 2 + 2 * 3 + 2);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_RELU), 4);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_LAYERNORM), 0);
    /* attention: unscaled; encoder self (bias, not causal), decoder self
     * (bias, causal), cross (no bias, keys from the encoder) */
    int attn = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op != REGC_OP_ATTENTION)
            continue;
        assert_true(n->attrs.scale == 1.0f);
        assert_int_equal(n->attrs.n_head, 4);
        int kind = attn < 2 ? 0 : (attn - 2) % 2 == 0 ? 1 : 2;
        assert_int_equal(n->n_in, kind == 2 ? 3 : 4);
        assert_int_equal(n->attrs.causal, kind == 1);
        if (kind != 2) {
            const regc_tensor *bias = regc_graph_tensor(g, n->in[3]);
            assert_int_equal(bias->ndim, 3);
            assert_int_equal(bias->shape[0], 4);
            assert_int_equal(bias->shape[2], 7);
        }
        attn++;
    }
    assert_int_equal(attn, 2 + 2 * 2);
    /* the tied head: decoder output scaled by d_model^-1/2, then shared.weight */
    const int nn = regc_graph_n_nodes(g);
    const regc_node *scale = regc_graph_node(g, nn - 3), *head = regc_graph_node(g, nn - 2);
    assert_int_equal(scale->op, REGC_OP_SCALE);
    assert_true(fabsf(scale->attrs.value - 1.0f / sqrtf(128.0f)) < 1e-7f);
    assert_int_equal(head->op, REGC_OP_MATMUL);
    assert_int_equal(head->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, head->in[1])->name, "shared.weight");
    assert_int_equal(regc_graph_tensor(g, head->out[0])->shape[2], 512);
    assert_int_equal(regc_graph_node(g, nn - 1)->op, REGC_OP_CROSS_ENTROPY);
    regc_graph_free(g);
    regc_model_free(m);
}

static void test_graph_gated_untied(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_config(f, "\"feed_forward_proj\": \"gated-gelu\", "
                                   "\"tie_word_embeddings\": false, \"num_decoder_layers\": 1");
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 1, 4, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_GELU), 3);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_MUL), 3);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_RELU), 0);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_SCALE), 0); /* an untied head is not rescaled */
    const regc_node *head = regc_graph_node(g, regc_graph_n_nodes(g) - 2);
    assert_string_equal(regc_graph_tensor(g, head->in[1])->name, "lm_head.weight");
    regc_graph_free(g);
    regc_model_free(m);
}

/* t5-small's shapes at a long sequence cost no weights and little time. */
static void test_graph_small_shape_only(void **state)
{
    (void)state;
    double t0 = regc_time_ms();
    regc_model *m;
    assert_int_equal(regc_model_load("t5-small", &m), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 8, 4096, &g), REGC_OK);
    assert_int_equal(regc_graph_n_nodes(g), 2 + 4 + 12 * 6 + 19 * 6 + 2 + 3);
    assert_false(regc_model_has_weights(m));
    assert_true(regc_time_ms() - t0 < 2000.0);
    regc_graph_free(g);
    regc_model_free(m);
}

/* ------------------------------------------------------------------ CLI */

static void test_train_tiny_cli(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "t5-tiny", "--steps", "3",
                                        "--batch", "2", "--seq", "8", "--json", NULL),
                     0);
    assert_int_equal(regc_test_count_lines(p.out) >= 3, 1);
    double first = NAN, last = NAN;
    for (char *line = strtok(p.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
        if (cJSON_IsNumber(loss)) {
            if (isnan(first))
                first = loss->valuedouble;
            last = loss->valuedouble;
        }
        cJSON_Delete(o);
    }
    assert_true(isfinite(first) && isfinite(last));
    assert_true(last < first); /* three AdamW steps on the built-in text learn something */
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_init_random),
        regc_test_in_dir(test_config_defaults_and_keys, setup),
        regc_test_in_dir(test_config_errors, setup),
        regc_test_in_dir(test_save_load_round_trip, setup),
        regc_test_in_dir(test_buckets_match_pytorch, setup),
        regc_test_in_dir(test_seq2seq_inputs, setup),
        cmocka_unit_test(test_graph_tiny),
        regc_test_in_dir(test_graph_gated_untied, setup),
        cmocka_unit_test(test_graph_small_shape_only),
        cmocka_unit_test(test_train_tiny_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
