/* test_decoder_variants.c — the decoder families' own keys
 * (models/decoder.c): Phi-3's residual dropout and its RoPE (LongRoPE's
 * factors, a share of each head), Granite's multipliers, and SmolLM3
 * trained regional and whole to the same bits.
 * What every family shares is test_decoder_families.c's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_models.h"
#include "test_model.h"
#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "variants", "model"); }

static void write_config(regc_test_dir *f, const char *model_type, const char *extra)
{
    regc_test_write_decoder_config(f->path, model_type, extra, NULL);
}

static regc_model *load(regc_test_dir *f, const char *model_type, const char *extra)
{
    write_config(f, model_type, extra);
    regc_model *m = NULL;
    if (regc_model_load_config(f->path, &m) != REGC_OK)
        fail_msg("%s: %s", model_type, regc_error_message());
    return m;
}

/* Phi-3's resid_pdrop drops the attention's and the MLP's outputs, once
 * each per layer, when training applies dropout; attention_dropout, each
 * attention's probabilities. */
static void test_phi3_dropout(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load(f, "phi3", "\"resid_pdrop\": 0.1");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 1, 4, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 0);
    regc_graph_free(g);
    regc_model_set_dropout(m, 1);
    assert_int_equal(regc_model_build_graph(m, 1, 4, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 2 * 3);
    regc_graph_free(g);
    regc_model_free(m);
    /* attention_dropout drops each layer's attention probabilities */
    m = load(f, "qwen2", "\"attention_dropout\": 0.1");
    regc_model_set_dropout(m, 1);
    assert_int_equal(regc_model_build_graph(m, 1, 4, &g), REGC_OK);
    int dropping = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        dropping += n->op == REGC_OP_ATTENTION && n->attrs.value == 0.1f && n->n_in == 5;
    }
    assert_int_equal(dropping, 3);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 0);
    regc_graph_free(g);
    regc_model_free(m);
}

/* Phi-3's RoPE as Phi3Config reads it: "su" (and "yarn") mean longrope,
 * whose original length is the top-level key (default 4096, whatever the
 * dictionary says); past it, the long factors; only default and longrope;
 * a share of each head rotated, its lists as long as its frequencies.
 * Heads of 4: two frequencies, theta 10000 gives 1 and 1/100 before the
 * factors. */
static void test_phi3_rope(void **state)
{
    regc_test_dir *f = *state;
    const char *lists = "\"short_factor\": [1.0, 2.0], \"long_factor\": [3.0, 4.0]";
    char extra[512];
    snprintf(extra, sizeof extra,
             "\"original_max_position_embeddings\": 8, \"rope_scaling\": {\"type\": \"su\", %s}",
             lists);
    regc_model *m = load(f, "phi3", extra), *back = NULL;
    float inv[2], s, inv2[2], s2;
    assert_int_equal(regc_model_compute_rope(m, 8, inv, 2, &s), 2); /* within 8: short */
    assert_true(fabsf(inv[1] - 1.0f / 200.0f) <= 1e-7f * inv[1]);
    /* past 8: long, and sqrt(1 + ln(16 / 8) / ln 8) on cos and sin */
    assert_int_equal(regc_model_compute_rope(m, 12, inv, 2, &s), 2);
    assert_true(fabsf(inv[0] - 1.0f / 3.0f) <= 1e-7f && fabsf(inv[1] - 1.0f / 400.0f) <= 1e-9f);
    assert_true(fabsf(s - (float)sqrt(1.0 + log(2.0) / log(8.0))) <= 1e-7f);
    /* written back (the top-level length too) and read again alike */
    assert_int_equal(regc_model_with_layers(m, 2, &back), REGC_OK);
    assert_int_equal(regc_model_compute_rope(back, 12, inv2, 2, &s2), 2);
    assert_memory_equal(inv, inv2, sizeof inv);
    assert_true(s == s2);
    regc_model_free(back);
    regc_model_free(m);
    /* the dictionary's length gives way to the top level's default 4096 */
    snprintf(extra, sizeof extra,
             "\"rope_scaling\": {\"type\": \"longrope\", "
             "\"original_max_position_embeddings\": 8, %s}",
             lists);
    m = load(f, "phi3", extra);
    assert_int_equal(regc_model_compute_rope(m, 12, inv, 2, &s), 2);
    assert_true(fabsf(inv[1] - 1.0f / 200.0f) <= 1e-7f * inv[1]);
    regc_model_free(m);
    /* a top-level original length that is no length */
    snprintf(extra, sizeof extra,
             "\"original_max_position_embeddings\": 0, \"rope_scaling\": {\"type\": "
             "\"longrope\", %s}",
             lists);
    write_config(f, "phi3", extra);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"original_max_position_embeddings\" is 0");
    /* Gemma 3's sliding layers' lists against the head too */
    write_config(f, "gemma3_text",
                 "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}, "
                 "\"sliding_attention\": {\"rope_type\": \"longrope\", "
                 "\"short_factor\": [1.0], \"long_factor\": [2.0]}}");
    regc_test_expect_config_error(
        f->path, REGC_ERR_FORMAT,
        "(the sliding layers' RoPE): keys \"rope_parameters.long_factor\"");
    /* a share of each head rotated (Phi-4-mini's 0.75): the lists, one
     * factor per frequency of that share; its config.json's keys of its
     * remote code at their neutral values taken, others refused */
    m = load(f, "phi3",
             "\"partial_rotary_factor\": 0.5, \"attention_bias\": false, \"mlp_bias\": false, "
             "\"lm_head_bias\": false, \"full_attn_mod\": 1, \"interpolate_factor\": 1");
    assert_int_equal(regc_model_compute_rope(m, 0, NULL, 0, NULL), 1);
    regc_model_free(m);
    write_config(f, "phi3", "\"attention_bias\": true");
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"attention_bias\" is not supported: Transformers' Phi-3");
    snprintf(extra, sizeof extra,
             "\"partial_rotary_factor\": 0.5, \"rope_scaling\": {\"type\": \"longrope\", %s}",
             lists);
    write_config(f, "phi3", extra);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "have 2 values; a head of 4 rotates 1 frequencies");
    /* Phi3Config refuses the other types */
    write_config(f, "phi3", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}");
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"rope_scaling\" has rope_type \"linear\": Phi-3 reads "
                                  "only default and longrope");
}

/* Granite's multipliers where Transformers applies them: the embeddings,
 * each block's output before its residual add (two a layer), the logits
 * (by the reciprocal of logits_scaling), and the scores' scale in place
 * of head_dim^-1/2; none where they are 1; any number Transformers
 * multiplies by taken, a logits_scaling of 0 refused by name. */
static void test_granite_multipliers(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load(f, "granite",
                         "\"embedding_multiplier\": 12.0, \"residual_multiplier\": 0.22, "
                         "\"attention_multiplier\": 0.0078125, \"logits_scaling\": 8.0");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    float scales[16];
    int n = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *nd = regc_graph_node(g, i);
        if (nd->op == REGC_OP_SCALE && n < 16)
            scales[n++] = nd->attrs.value;
        if (nd->op == REGC_OP_ATTENTION)
            assert_true(nd->attrs.scale == 0.0078125f);
    }
    const float want[] = {12.0f, 0.22f, 0.22f, 0.22f, 0.22f, 0.22f, 0.22f, 0.125f};
    assert_int_equal(n, 8);
    assert_memory_equal(scales, want, sizeof want);
    regc_graph_free(g);
    regc_model_free(m);
    m = load(f, "granite", NULL);
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_SCALE), 0);
    for (int i = 0; i < regc_graph_n_nodes(g); i++)
        if (regc_graph_node(g, i)->op == REGC_OP_ATTENTION)
            assert_true(regc_graph_node(g, i)->attrs.scale == 1.0f); /* Granite's default */
    regc_graph_free(g);
    regc_model_free(m);
    /* any number, as Transformers multiplies by it; but the logits are divided */
    m = load(f, "granite", "\"residual_multiplier\": -0.5");
    assert_int_equal(regc_model_build_graph(m, 1, 8, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_SCALE), 6);
    regc_graph_free(g);
    regc_model_free(m);
    write_config(f, "granite", "\"logits_scaling\": 0");
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"logits_scaling\" is 0: the logits are divided by it");
}

static regc_model *load_smollm3(regc_test_dir *f, const char *extra)
{
    return load(f, "smollm3", extra);
}

/* SmolLM3's 8 layers, three RoPE layers and a NoPE one (sliding by 4 of
 * 16 positions) twice: compiled as one region of four layers, trained
 * regional and whole, at O1 and O0, the same bits. */
static void test_smollm3_regional_equals_full(void **state)
{
    regc_test_expect_regional_equals_full(
        *state, load_smollm3,
        "\"num_hidden_layers\": 8, \"use_sliding_window\": true, "
        "\"sliding_window\": 4, \"vocab_size\": 256", /* the built-in corpus's */
        "smollm3, 8 layers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_phi3_dropout, setup),
        regc_test_in_dir(test_phi3_rope, setup),
        regc_test_in_dir(test_granite_multipliers, setup),
        regc_test_in_dir(test_smollm3_regional_equals_full, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
