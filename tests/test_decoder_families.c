/* test_decoder_families.c — what the decoder families of models/decoder.c
 * (Llama with biases, Mistral, Qwen 2, Qwen 3, OLMo 2, Phi-3, Gemma 2 and
 * 3, Granite, SmolLM3) share: each family's layer parameters in its
 * checkpoint order and shapes, one region kind repeated per layer for
 * detect/, save and reload, the sliding windows (refused past the window,
 * accepted within it), Gemma's scales and caps, the padding index, the
 * gate's activation, PEFT's default LoRA targets, and SmolLM3's layers
 * without RoPE. Phi-3's and Granite's own keys and SmolLM3 trained regional
 * and whole are test_decoder_variants.c's, the parallel families
 * test_parallel_decoders.c's, every architecture's table of config.json
 * keys test_config_keys.c's. The families' training against Transformers
 * is tests/data/decoder_reference.json (test_train_reference). */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_detect.h"
#include "regc_models.h"
#include "test_model.h"
#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "decoder", "model"); }

/* Every family at the shared small shape (regc_test_write_decoder_config);
 * `extra` adds keys (a key named there replaces its default), `omit` leaves
 * one out. */
static void write_config_omit(regc_test_dir *f, const char *model_type, const char *extra,
                              const char *omit)
{
    regc_test_write_decoder_config(f->path, model_type, extra, omit);
}

static void write_config(regc_test_dir *f, const char *model_type, const char *extra)
{
    write_config_omit(f, model_type, extra, NULL);
}

static regc_model *load(regc_test_dir *f, const char *model_type, const char *extra)
{
    write_config(f, model_type, extra);
    regc_model *m = NULL;
    if (regc_model_load_config(f->path, &m) != REGC_OK)
        fail_msg("%s: %s", model_type, regc_error_message());
    return m;
}

/* A family, the keys that choose its variant, and layer 0's parameters. */
typedef struct {
    const char *model_type, *extra;
    const char *params[20]; /* "suffix:d0xd1" or "suffix:d0" */
} family_case;

static const family_case families[] = {
    {"llama",
     "\"attention_bias\": true, \"mlp_bias\": true",
     {"self_attn.q_proj.weight:24x24", "self_attn.q_proj.bias:24", "self_attn.k_proj.weight:8x24",
      "self_attn.k_proj.bias:8", "self_attn.v_proj.weight:8x24", "self_attn.v_proj.bias:8",
      "self_attn.o_proj.weight:24x24", "self_attn.o_proj.bias:24", "mlp.gate_proj.weight:40x24",
      "mlp.gate_proj.bias:40", "mlp.up_proj.weight:40x24", "mlp.up_proj.bias:40",
      "mlp.down_proj.weight:24x40", "mlp.down_proj.bias:24", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
    {"mistral",
     "\"sliding_window\": 4096",
     {"self_attn.q_proj.weight:24x24", "self_attn.k_proj.weight:8x24",
      "self_attn.v_proj.weight:8x24", "self_attn.o_proj.weight:24x24", "mlp.gate_proj.weight:40x24",
      "mlp.up_proj.weight:40x24", "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
    {"qwen2",
     "\"tie_word_embeddings\": true",
     {"self_attn.q_proj.weight:24x24", "self_attn.q_proj.bias:24", "self_attn.k_proj.weight:8x24",
      "self_attn.k_proj.bias:8", "self_attn.v_proj.weight:8x24", "self_attn.v_proj.bias:8",
      "self_attn.o_proj.weight:24x24", "mlp.gate_proj.weight:40x24", "mlp.up_proj.weight:40x24",
      "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
    {"qwen3",
     "\"head_dim\": 6",
     {"self_attn.q_proj.weight:36x24", "self_attn.k_proj.weight:12x24",
      "self_attn.v_proj.weight:12x24", "self_attn.o_proj.weight:24x36", "self_attn.q_norm.weight:6",
      "self_attn.k_norm.weight:6", "mlp.gate_proj.weight:40x24", "mlp.up_proj.weight:40x24",
      "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
    {"olmo2",
     NULL,
     {"self_attn.q_proj.weight:24x24", "self_attn.k_proj.weight:8x24",
      "self_attn.v_proj.weight:8x24", "self_attn.o_proj.weight:24x24", "self_attn.q_norm.weight:24",
      "self_attn.k_norm.weight:8", "mlp.gate_proj.weight:40x24", "mlp.up_proj.weight:40x24",
      "mlp.down_proj.weight:24x40", "post_attention_layernorm.weight:24",
      "post_feedforward_layernorm.weight:24"}},
    {"gemma2",
     NULL,
     {"self_attn.q_proj.weight:24x24", "self_attn.k_proj.weight:8x24",
      "self_attn.v_proj.weight:8x24", "self_attn.o_proj.weight:24x24", "mlp.gate_proj.weight:40x24",
      "mlp.up_proj.weight:40x24", "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24", "pre_feedforward_layernorm.weight:24",
      "post_feedforward_layernorm.weight:24"}},
    {"gemma3_text",
     "\"attention_bias\": true",
     {"self_attn.q_proj.weight:24x24", "self_attn.q_proj.bias:24", "self_attn.k_proj.weight:8x24",
      "self_attn.k_proj.bias:8", "self_attn.v_proj.weight:8x24", "self_attn.v_proj.bias:8",
      "self_attn.o_proj.weight:24x24", "self_attn.o_proj.bias:24", "self_attn.q_norm.weight:4",
      "self_attn.k_norm.weight:4", "mlp.gate_proj.weight:40x24", "mlp.up_proj.weight:40x24",
      "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24", "pre_feedforward_layernorm.weight:24",
      "post_feedforward_layernorm.weight:24"}},
    {"phi3",
     NULL,
     {"self_attn.o_proj.weight:24x24", "self_attn.qkv_proj.weight:40x24",
      "mlp.gate_up_proj.weight:80x24", "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
    {"granite",
     "\"attention_bias\": true, \"embedding_multiplier\": 12.0, \"logits_scaling\": 8.0",
     {"self_attn.q_proj.weight:24x24", "self_attn.q_proj.bias:24", "self_attn.k_proj.weight:8x24",
      "self_attn.k_proj.bias:8", "self_attn.v_proj.weight:8x24", "self_attn.v_proj.bias:8",
      "self_attn.o_proj.weight:24x24", "self_attn.o_proj.bias:24", "mlp.gate_proj.weight:40x24",
      "mlp.up_proj.weight:40x24", "mlp.down_proj.weight:24x40", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
    {"phi",
     "\"qk_layernorm\": true",
     {"self_attn.q_proj.weight:24x24", "self_attn.q_proj.bias:24", "self_attn.k_proj.weight:8x24",
      "self_attn.k_proj.bias:8", "self_attn.v_proj.weight:8x24", "self_attn.v_proj.bias:8",
      "self_attn.dense.weight:24x24", "self_attn.dense.bias:24", "self_attn.q_layernorm.weight:4",
      "self_attn.q_layernorm.bias:4", "self_attn.k_layernorm.weight:4",
      "self_attn.k_layernorm.bias:4", "mlp.fc1.weight:40x24", "mlp.fc1.bias:40",
      "mlp.fc2.weight:24x40", "mlp.fc2.bias:24", "input_layernorm.weight:24",
      "input_layernorm.bias:24"}},
    {"smollm3",
     "\"mlp_bias\": true",
     {"self_attn.q_proj.weight:24x24", "self_attn.k_proj.weight:8x24",
      "self_attn.v_proj.weight:8x24", "self_attn.o_proj.weight:24x24", "mlp.gate_proj.weight:40x24",
      "mlp.gate_proj.bias:40", "mlp.up_proj.weight:40x24", "mlp.up_proj.bias:40",
      "mlp.down_proj.weight:24x40", "mlp.down_proj.bias:24", "input_layernorm.weight:24",
      "post_attention_layernorm.weight:24"}},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

static int count_params(const family_case *c)
{
    int n = 0;
    while (n < 20 && c->params[n])
        n++;
    return n;
}

/* Layer 0's names and shapes in order, the same count in every layer, and
 * the embedding, final norm and head (tied for qwen2 here, and Gemma's by
 * default; Phi's a LayerNorm and a head with biases) around them. */
static void test_params(void **state)
{
    regc_test_dir *f = *state;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const family_case *c = &families[i];
        regc_model *m = load(f, c->model_type, c->extra);
        assert_string_equal(regc_model_arch(m), c->model_type);
        /* qwen2's tied here; Gemma and SmolLM3 tie by default */
        const int per_layer = count_params(c), tied = !strcmp(c->model_type, "qwen2") ||
                                                      strstr(c->model_type, "gemma") ||
                                                      !strcmp(c->model_type, "smollm3");
        const int phi = !strcmp(c->model_type, "phi");
        assert_int_equal(regc_model_n_params(m), 1 + 3 * per_layer + (phi ? 4 : 1 + !tied));
        assert_string_equal(regc_model_param_name(m, 0), "model.embed_tokens.weight");
        for (int p = 0; p < per_layer; p++) {
            char name[128], want[128];
            const char *colon = strchr(c->params[p], ':');
            snprintf(want, sizeof want, "model.layers.0.%.*s", (int)(colon - c->params[p]),
                     c->params[p]);
            assert_string_equal(regc_model_param_name(m, 1 + p), want);
            int64_t shape[REGC_MAX_DIMS];
            const int ndim = regc_model_param_shape(m, 1 + p, shape);
            if (ndim == 2)
                snprintf(name, sizeof name, "%" PRId64 "x%" PRId64, shape[0], shape[1]);
            else
                snprintf(name, sizeof name, "%" PRId64, shape[0]);
            if (strcmp(name, colon + 1) != 0)
                fail_msg("%s %s: shape %s, want %s", c->model_type, want, name, colon + 1);
            /* the next layer has the same parameter in the same place */
            char next[128];
            snprintf(next, sizeof next, "model.layers.1.%.*s", (int)(colon - c->params[p]),
                     c->params[p]);
            assert_string_equal(regc_model_param_name(m, 1 + per_layer + p), next);
        }
        assert_string_equal(regc_model_param_name(m, 1 + 3 * per_layer),
                            phi ? "model.final_layernorm.weight" : "model.norm.weight");
        if (phi) {
            assert_string_equal(regc_model_param_name(m, 3 + 3 * per_layer), "lm_head.weight");
            assert_string_equal(regc_model_param_name(m, 4 + 3 * per_layer), "lm_head.bias");
        }
        regc_model_free(m);
    }
}

/* detect/ finds one region kind, run once per layer, in every family. */
static void test_one_kind_per_layer(void **state)
{
    regc_test_dir *f = *state;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        regc_model *m = load(f, families[i].model_type, families[i].extra);
        regc_graph *g = NULL;
        assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
        regc_blocks *b = NULL;
        assert_int_equal(regc_detect_blocks(g, &b), REGC_OK);
        if (regc_blocks_n_kinds(b) != 1)
            fail_msg("%s: %d region kinds", families[i].model_type, regc_blocks_n_kinds(b));
        int layers = 0;
        for (int s = 0; s < regc_blocks_n_segments(b); s++)
            if (regc_blocks_segment(b, s)->type == REGC_SEGMENT_RUN)
                layers += regc_blocks_segment(b, s)->count;
        assert_int_equal(layers, 3);
        regc_blocks_free(b);
        regc_graph_free(g);
        regc_model_free(m);
    }
}

/* Gemma 2's alternating windows, really applied: detect/ still covers
 * every layer (a super-block of the pair, or two kinds). */
static void test_alternating_layers(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load(f, "gemma2", "\"num_hidden_layers\": 4, \"sliding_window\": 3");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    regc_blocks *b = NULL;
    assert_int_equal(regc_detect_blocks(g, &b), REGC_OK);
    print_message("gemma2, 4 layers, window 3 of 8: %d kinds, coverage %.3f\n",
                  regc_blocks_n_kinds(b), regc_blocks_coverage(b));
    assert_true(regc_blocks_n_kinds(b) >= 1 && regc_blocks_n_kinds(b) <= 2);
    assert_true(regc_blocks_coverage(b) > 0.9);
    regc_blocks_free(b);
    regc_graph_free(g);
    regc_model_free(m);
}

/* Gemma 3 at its 1B model's depth (26 layers) with a window shorter than
 * the sequence: five sliding layers and a full one are one super-block,
 * four times, and the two sliding layers left a kind of their own (the
 * graph offers the detector the most candidate periods of any family). */
static void test_gemma3_pattern(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load(f, "gemma3_text",
                         "\"num_hidden_layers\": 26, \"sliding_window\": 16, "
                         "\"max_position_embeddings\": 64");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 1, 64, &g), REGC_OK);
    regc_blocks *b = NULL;
    assert_int_equal(regc_detect_blocks(g, &b), REGC_OK);
    int layers[2] = {0, 0};
    for (int s = 0; s < regc_blocks_n_segments(b); s++) {
        const regc_segment *sg = regc_blocks_segment(b, s);
        if (sg->type == REGC_SEGMENT_RUN && sg->kind < 2)
            layers[sg->kind] += sg->count;
    }
    if (regc_blocks_n_kinds(b) != 2 || layers[0] != 4 || layers[1] != 2 ||
        !(regc_blocks_coverage(b) > 0.95))
        fail_msg("gemma3, 26 layers: %d kinds, %d and %d instances, coverage %.3f",
                 regc_blocks_n_kinds(b), layers[0], layers[1], regc_blocks_coverage(b));
    regc_blocks_free(b);
    regc_graph_free(g);
    regc_model_free(m);
}

/* Saved and loaded back: the same model_type, parameters and weights, and
 * a config.json that passes its own key table. */
static void test_save_reload(void **state)
{
    regc_test_dir *f = *state;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        char extra[256];
        snprintf(extra, sizeof extra, "\"bos_token_id\": 3, \"use_cache\": false%s%s",
                 families[i].extra ? ", " : "", families[i].extra ? families[i].extra : "");
        regc_model *m = load(f, families[i].model_type, extra), *back = NULL;
        assert_int_equal(regc_model_init_random(m, 11 + (uint64_t)i), REGC_OK);
        char out[1200];
        snprintf(out, sizeof out, "%s/saved-%s", f->dir, families[i].model_type);
        assert_int_equal(regc_model_save(m, out), REGC_OK);
        if (regc_model_load(out, &back) != REGC_OK)
            fail_msg("%s: %s", out, regc_error_message());
        assert_string_equal(regc_model_arch(back), families[i].model_type);
        regc_test_assert_same_weights(m, back);
        char a[2048], d[2048];
        regc_model_describe(m, a, sizeof a);
        regc_model_describe(back, d, sizeof d);
        assert_non_null(strstr(d, families[i].model_type));
        assert_string_equal(strchr(a, ':'), strchr(d, ':')); /* all but the source */
        /* the inert keys as they were: a tokenizer's ids survive training */
        char *path = regc_test_join(out, "config.json");
        char *text = regc_test_read_file(path, NULL);
        assert_non_null(text);
        if (!strstr(text, "\"bos_token_id\":\t3") || !strstr(text, "\"use_cache\":\tfalse"))
            fail_msg("%s lacks the inert keys:\n%s", path, text);
        free(text);
        free(path);
        regc_model_free(back);
        regc_model_free(m);
    }
}

/* The attention nodes' windows, layer by layer (n of them), and their
 * soft-capping and scale. */
static void attention_attrs(regc_model *m, int64_t T, int64_t *window, int n, float *softcap,
                            float *scale)
{
    regc_graph *g = NULL;
    if (regc_model_build_graph(m, 1, T, &g) != REGC_OK)
        fail_msg("T=%" PRId64 ": %s", T, regc_error_message());
    int l = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *nd = regc_graph_node(g, i);
        if (nd->op != REGC_OP_ATTENTION)
            continue;
        assert_true(l < n);
        window[l++] = nd->attrs.window;
        *softcap = nd->attrs.softcap, *scale = nd->attrs.scale;
    }
    assert_int_equal(l, n);
    regc_graph_free(g);
}

static void expect_windows(regc_model *m, int64_t w0, int64_t w1, int64_t w2)
{
    int64_t w[3];
    float cap, scale;
    attention_attrs(m, 16, w, 3, &cap, &scale);
    if (w[0] != w0 || w[1] != w1 || w[2] != w2)
        fail_msg("%s: windows %" PRId64 " %" PRId64 " %" PRId64 ", want %" PRId64 " %" PRId64
                 " %" PRId64,
                 regc_model_arch(m), w[0], w[1], w[2], w0, w1, w2);
    regc_model_free(m);
}

/* Transformers masks keys i - j >= sliding_window away on a sliding layer;
 * each family's rule for which layers slide gives regc's attention the
 * same window, layer by layer. */
static void test_sliding_windows(void **state)
{
    regc_test_dir *f = *state;
    expect_windows(load(f, "mistral", "\"sliding_window\": 8"), 8, 8, 8);
    expect_windows(load(f, "phi3", "\"sliding_window\": null"), 0, 0, 0);
    /* Qwen: the window only with use_sliding_window, on the layers from
     * max_window_layers on, or as layer_types says */
    expect_windows(load(f, "qwen2", "\"sliding_window\": 4, \"max_window_layers\": 1"), 0, 0, 0);
    regc_model *m = load(f, "qwen2",
                         "\"use_sliding_window\": true, \"sliding_window\": 4, "
                         "\"max_window_layers\": 1");
    /* written back as layer_types, and read so again */
    char out[1200];
    snprintf(out, sizeof out, "%s/qwen2-window", f->dir);
    assert_int_equal(regc_model_init_random(m, 3), REGC_OK);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    expect_windows(m, 0, 4, 4);
    assert_int_equal(regc_model_load(out, &m), REGC_OK);
    expect_windows(m, 0, 4, 4);
    expect_windows(load(f, "qwen3",
                        "\"use_sliding_window\": true, \"sliding_window\": 4, \"layer_types\": "
                        "[\"full_attention\", \"full_attention\", \"sliding_attention\"]"),
                   0, 0, 4);
    /* Gemma: every second layer full (Gemma 2), every sliding_window_pattern-th (Gemma 3, 6) */
    expect_windows(load(f, "gemma2", "\"sliding_window\": 6"), 6, 0, 6);
    /* a window no shorter than the sequence masks nothing, and is left out */
    expect_windows(load(f, "gemma2", NULL), 0, 0, 0);
    expect_windows(load(f, "gemma2", "\"sliding_window\": null"), 0, 0, 0);
    expect_windows(load(f, "gemma3_text", "\"sliding_window\": 5"), 5, 5, 5);
    expect_windows(load(f, "gemma3_text", "\"sliding_window\": 5, \"sliding_window_pattern\": 3"),
                   5, 5, 0);
    write_config(f, "qwen3", "\"layer_types\": [\"full_attention\", \"chunked_attention\", 1]");
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"layer_types\" entry 1 is not \"full_attention\"");
    write_config(f, "gemma2", "\"layer_types\": [\"full_attention\"]");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"layer_types\" must be a list of num_hidden_layers (3)");
}

/* Gemma: the scores scaled by query_pre_attn_scalar^-1/2, Gemma 2's
 * attention soft-capped (50 by default; Gemma 3's never), the logits
 * soft-capped when final_logit_softcapping says, the embeddings times
 * sqrt(hidden_size), and Gemma 3's sliding layers rotating with their own
 * base (a second pair of rotary tables). */
static void test_gemma(void **state)
{
    regc_test_dir *f = *state;
    int64_t w[3];
    float cap, scale;
    regc_model *m = load(f, "gemma2", "\"query_pre_attn_scalar\": 16");
    attention_attrs(m, 8, w, 3, &cap, &scale);
    assert_true(cap == 50.0f && scale == 0.25f);
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    /* the logits: tanh between the head's GEMM and the loss */
    const int ce = regc_graph_n_nodes(g) - 1;
    assert_int_equal(regc_graph_node(g, ce)->op, REGC_OP_CROSS_ENTROPY);
    assert_int_equal(regc_graph_node(g, ce - 2)->op, REGC_OP_TANH);
    assert_int_equal(regc_graph_node(g, 1)->op, REGC_OP_SCALE); /* sqrt(24) on the embeddings */
    assert_true(regc_graph_node(g, 1)->attrs.value == (float)sqrt(24.0));
    assert_int_equal(regc_graph_find_tensor(g, "rope_local_cos"), -1);
    regc_graph_free(g);
    regc_model_free(m);
    m = load(f, "gemma2", "\"attn_logit_softcapping\": null, \"final_logit_softcapping\": null");
    attention_attrs(m, 8, w, 3, &cap, &scale);
    assert_true(cap == 0.0f && scale == 0.0625f); /* 256^-1/2 */
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    assert_int_equal(regc_graph_node(g, regc_graph_n_nodes(g) - 2)->op, REGC_OP_MATMUL);
    regc_graph_free(g);
    regc_model_free(m);
    m = load(f, "gemma3_text", "\"attn_logit_softcapping\": 20.0, \"sliding_window\": 4");
    attention_attrs(m, 8, w, 3, &cap, &scale);
    assert_true(cap == 0.0f);
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    assert_true(regc_graph_find_tensor(g, "rope_local_cos") >= 0);
    regc_graph_free(g);
    /* the two bases: Gemma 3's defaults, 1e6 and 1e4, then as written */
    float full[2], s1;
    assert_int_equal(regc_model_compute_rope(m, 0, full, 2, &s1), 2);
    assert_true(full[1] == (float)(1.0 / pow(1e6, 0.5)));
    regc_model_free(m);
    m = load(f, "gemma3_text",
             "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", "
             "\"rope_theta\": 100.0}, \"sliding_attention\": {\"rope_type\": \"linear\", "
             "\"factor\": 2.0, \"rope_theta\": 10.0}}");
    char d[2048];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, "rope_theta 100") || !strstr(d, "(sliding layers 10)"))
        fail_msg("%s", d);
    regc_model_free(m);
    write_config(f, "gemma3_text", "\"rope_parameters\": {\"rope_type\": \"default\"}");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"rope_parameters\" must hold \"full_attention\" and "
                                  "\"sliding_attention\" for gemma3_text");
    write_config(f, "gemma3_text", "\"use_bidirectional_attention\": true");
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"use_bidirectional_attention\" = true is not supported");
    write_config(f, "gemma2", "\"final_logit_softcapping\": 0");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"final_logit_softcapping\" is 0, must be positive");
    write_config(f, "gemma2", "\"hidden_activation\": \"quick_gelu\"");
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"hidden_activation\" is \"quick_gelu\"");
}

/* pad_token_id is the embedding's padding_idx in every family, as
 * Transformers builds it; absent, the family's default (OLMo 2's 1,
 * Phi-3's 32000, none for the others); null, none. */
static void test_pad_token(void **state)
{
    regc_test_dir *f = *state;
    assert_int_equal(regc_test_embedding_padding(load(f, "llama", "\"pad_token_id\": 5")), 5);
    assert_int_equal(regc_test_embedding_padding(load(f, "qwen3", NULL)), -1);
    write_config_omit(f, "olmo2", NULL, "pad_token_id");
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    assert_int_equal(regc_test_embedding_padding(m), 1);
    write_config_omit(f, "mistral", NULL, "pad_token_id");
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    assert_int_equal(regc_test_embedding_padding(m), -1);
    write_config_omit(f, "phi3", NULL, "pad_token_id");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"pad_token_id\" is 32000 (the architecture's default), "
                                  "not within the vocabulary (-64 to 63");
    write_config(f, "qwen2", "\"pad_token_id\": 64");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"pad_token_id\" is 64, not within the vocabulary");
    write_config(f, "qwen2", "\"pad_token_id\": -65");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"pad_token_id\" is -65, not within the vocabulary");
    /* a negative id counts from the end, as torch's padding_idx does */
    assert_int_equal(regc_test_embedding_padding(load(f, "qwen2", "\"pad_token_id\": -1")), 63);
    /* written back, and read so again */
    m = load(f, "phi3", "\"pad_token_id\": 7");
    assert_int_equal(regc_model_init_random(m, 5), REGC_OK);
    char out[1200];
    snprintf(out, sizeof out, "%s/phi3-pad", f->dir);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    regc_model_free(m);
    assert_int_equal(regc_model_load(out, &m), REGC_OK);
    assert_int_equal(regc_test_embedding_padding(m), 7);
}

/* hidden_act (Gemma's hidden_activation) chooses the gate's op, and is
 * saved under the name it was given. */
static void test_activations(void **state)
{
    regc_test_dir *f = *state;
    static const struct {
        const char *type, *key, *name;
        regc_op op;
    } acts[] = {
        {"llama", "hidden_act", "silu", REGC_OP_SILU},
        {"qwen2", "hidden_act", "gelu_pytorch_tanh", REGC_OP_GELU},
        {"phi3", "hidden_act", "gelu_new", REGC_OP_GELU},
        {"qwen3", "hidden_act", "gelu_fast", REGC_OP_GELU}, /* GPT-NeoX-20B's */
        {"llama", "hidden_act", "gelu_python", REGC_OP_GELU_ERF},
        {"mistral", "hidden_act", "gelu", REGC_OP_GELU_ERF},
        {"olmo2", "hidden_act", "relu", REGC_OP_RELU},
        {"gemma2", "hidden_activation", "gelu", REGC_OP_GELU_ERF},
        {"gemma3_text", "hidden_act", "silu", REGC_OP_GELU}, /* Gemma reads hidden_activation */
    };
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, "\"%s\": \"%s\"", acts[i].key, acts[i].name);
        regc_model *m = load(f, acts[i].type, extra);
        regc_graph *g = NULL;
        assert_int_equal(regc_model_build_graph(m, 1, 4, &g), REGC_OK);
        const int others[] = {REGC_OP_SILU, REGC_OP_GELU, REGC_OP_GELU_ERF, REGC_OP_RELU};
        for (size_t k = 0; k < sizeof others / sizeof *others; k++)
            if (regc_test_count_ops(g, (regc_op)others[k]) !=
                (others[k] == (int)acts[i].op ? 3 : 0))
                fail_msg("%s with %s: %d ops %d", acts[i].type, extra,
                         regc_test_count_ops(g, (regc_op)others[k]), others[k]);
        regc_graph_free(g);
        /* saved as it was named (Gemma 3's hidden_act is inert and kept too) */
        assert_int_equal(regc_model_init_random(m, 1), REGC_OK);
        char out[1200], want[160];
        snprintf(out, sizeof out, "%s/saved-act", f->dir);
        assert_int_equal(regc_model_save(m, out), REGC_OK);
        char *path = regc_test_join(out, "config.json");
        char *text = regc_test_read_file(path, NULL);
        assert_non_null(text);
        snprintf(want, sizeof want, "\"%s\":\t\"%s\"", acts[i].key, acts[i].name);
        if (!strstr(text, want))
            fail_msg("%s with %s: %s lacks %s", acts[i].type, extra, path, want);
        free(text);
        free(path);
        regc_model_free(m);
    }
}

/* PEFT's default target_modules where it has one; none for OLMo 2 and Phi-3. */
static void test_peft_defaults(void **state)
{
    regc_test_dir *f = *state;
    const regc_lora_config lora = {.r = 2};
    regc_model *m = load(f, "qwen3", NULL);
    assert_int_equal(regc_model_add_lora(m, &lora), REGC_OK);
    char d[512];
    regc_lora_describe(m, d, sizeof d);
    if (!strstr(d, "q_proj") || !strstr(d, "v_proj") || strstr(d, "k_proj"))
        fail_msg("qwen3's default targets: %s", d);
    regc_model_free(m);
    m = load(f, "phi3", NULL);
    assert_int_equal(regc_model_add_lora(m, &lora), REGC_ERR_ARG);
    regc_test_expect_error("lora.target_modules: none given, and PEFT has no default", "phi3");
    regc_model_free(m);
}

/* Which of the 3 layers rotate q and k (their RoPE ops before their
 * attention), as "101"; and whether the graph holds the rotary tables. */
static void expect_rope_layers(regc_model *m, const char *want, int tables)
{
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    char got[8] = "";
    int n = 0, ropes = 0, has_tables = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *nd = regc_graph_node(g, i);
        ropes += nd->op == REGC_OP_ROPE;
        if (nd->op == REGC_OP_ROPE && !strcmp(regc_graph_tensor(g, nd->in[1])->name, "rope_cos"))
            has_tables = 1;
        if (nd->op == REGC_OP_ATTENTION && n < 7) {
            if (ropes != 0 && ropes != 2)
                fail_msg("%s: layer %d rotates %d of q and k", regc_model_arch(m), n, ropes);
            got[n++] = ropes ? '1' : '0', ropes = 0;
        }
    }
    if (strcmp(got, want) != 0 || has_tables != tables)
        fail_msg("%s: RoPE on layers %s (tables %d), want %s (%d)", regc_model_arch(m), got,
                 has_tables, want, tables);
    regc_graph_free(g);
    regc_model_free(m);
}

/* SmolLM3 leaves RoPE out of each no_rope_layer_interval-th layer, or of
 * those no_rope_layers marks false (0), as Transformers reads the list;
 * with use_sliding_window those slide, and layer_types, when given, says
 * which slide whatever use_sliding_window says (the attention follows it);
 * both are written back and read again; Transformers' defaults (32768
 * positions, RoPE at 2e6); the pattern of a RoPE and a NoPE layer is one
 * kind for detect/; lists Transformers could not read are refused by name. */
static void test_smollm3_nope(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = NULL;
    expect_rope_layers(load(f, "smollm3", NULL), "111", 1); /* every 4th: none of 3 */
    expect_rope_layers(load(f, "smollm3", "\"no_rope_layer_interval\": 2"), "101", 1);
    expect_rope_layers(
        load(f, "smollm3", "\"no_rope_layer_interval\": 2, \"no_rope_layers\": [0, 1, 0]"), "010",
        1);
    expect_rope_layers(load(f, "smollm3", "\"no_rope_layers\": [0, 0, 0]"), "000", 0);
    expect_rope_layers(load(f, "smollm3",
                            "\"no_rope_layers\": [true, 2, false, 0], "
                            "\"no_rope_layer_interval\": 0"),
                       "110", 1);
    /* windows: none without use_sliding_window; else the NoPE layers, or layer_types */
    expect_windows(load(f, "smollm3", "\"no_rope_layer_interval\": 2, \"sliding_window\": 4"), 0, 0,
                   0);
    expect_windows(load(f, "smollm3",
                        "\"no_rope_layer_interval\": 2, \"sliding_window\": 4, "
                        "\"use_sliding_window\": true"),
                   0, 4, 0);
    expect_windows(load(f, "smollm3",
                        "\"no_rope_layer_interval\": 2, \"sliding_window\": 4, "
                        "\"use_sliding_window\": true, \"layer_types\": [\"sliding_attention\", "
                        "\"full_attention\", \"full_attention\"]"),
                   4, 0, 0);
    expect_windows(load(f, "smollm3",
                        "\"sliding_window\": 4, \"layer_types\": [\"sliding_attention\", "
                        "\"full_attention\", \"sliding_attention\"]"),
                   4, 0, 4);
    /* Transformers' defaults where config.json is silent */
    write_config_omit(f, "smollm3", NULL, "max_position_embeddings");
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    char d[1024];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, "max_position_embeddings 32768") || !strstr(d, "rope_theta 2e+06"))
        fail_msg("smollm3's defaults: %s", d);
    regc_model_free(m);
    /* written back as read */
    m = load(f, "smollm3",
             "\"no_rope_layers\": [1, 0, 0], \"sliding_window\": 4, "
             "\"use_sliding_window\": true");
    char out[1200];
    snprintf(out, sizeof out, "%s/smollm3-nope", f->dir);
    assert_int_equal(regc_model_init_random(m, 9), REGC_OK);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    regc_model_free(m);
    assert_int_equal(regc_model_load(out, &m), REGC_OK);
    expect_windows(m, 0, 4, 4);
    assert_int_equal(regc_model_load(out, &m), REGC_OK);
    expect_rope_layers(m, "100", 1);
    /* RoPE and NoPE layers in turn: detect/ covers them */
    m = load(f, "smollm3", "\"num_hidden_layers\": 4, \"no_rope_layer_interval\": 2");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    regc_blocks *b = NULL;
    assert_int_equal(regc_detect_blocks(g, &b), REGC_OK);
    print_message("smollm3, 4 layers, NoPE every 2nd: %d kinds, coverage %.3f\n",
                  regc_blocks_n_kinds(b), regc_blocks_coverage(b));
    assert_int_equal(regc_blocks_n_kinds(b), 1); /* the pair, one kind */
    assert_true(regc_blocks_coverage(b) > 0.9);
    regc_blocks_free(b);
    regc_graph_free(g);
    regc_model_free(m);
    write_config(f, "smollm3", "\"no_rope_layers\": [1, \"no\", 1]");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"no_rope_layers\" entry 1 is not a number or a boolean");
    write_config(f, "smollm3", "\"no_rope_layers\": [1, 0]");
    regc_test_expect_config_error(
        f->path, REGC_ERR_FORMAT,
        "key \"no_rope_layers\" must be a list of at least num_hidden_layers (3)");
    write_config(f, "smollm3", "\"no_rope_layer_interval\": 0");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT, "\"no_rope_layer_interval\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_params, setup),
        regc_test_in_dir(test_one_kind_per_layer, setup),
        regc_test_in_dir(test_alternating_layers, setup),
        regc_test_in_dir(test_gemma3_pattern, setup),
        regc_test_in_dir(test_save_reload, setup),
        regc_test_in_dir(test_sliding_windows, setup),
        regc_test_in_dir(test_gemma, setup),
        regc_test_in_dir(test_pad_token, setup),
        regc_test_in_dir(test_activations, setup),
        regc_test_in_dir(test_peft_defaults, setup),
        regc_test_in_dir(test_smollm3_nope, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
