/* test_weight_decay.c — train.weight_decay_params: the parameters AdamW
 * decays.
 *
 * - Names are read as Transformers' Trainer reads them (its patterns
 *   "bias", "layernorm", "rmsnorm", "(^|\.)norm($|\.)", "_norm($|\.)" on
 *   the lower-cased name), and a LayerNorm's scale and shift are left out
 *   whatever their names (GPT-2's ln_1): the families' counts are what
 *   Transformers' get_decay_parameter_names leaves out of their
 *   checkpoints' names (T5's relative_attention_bias among them).
 * - Against PyTorch: tests/data/gpt2_reference.json's decay_groups case
 *   (test_train_reference.c).
 * - One step under not_bias_norm gives, parameter by parameter, the bits
 *   of the step at weight_decay 0 where a parameter does not decay and of
 *   the step decaying all where it does (GPT-2, Llama, BERT, T5).
 * - ZeRO-3 at one rank (each parameter where its shard puts it), and the
 *   update offloaded to the host, give stage 0's bits over several steps
 *   (two ranks: test_ranks.c; resumed: test_resume.c).
 * - Ranges a program is bound with that are not ascending and disjoint
 *   within the block are refused, naming the range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_backend.h"
#include "regc_models.h"
#include "regc_region.h"
#include "regc_train.h"
#include "test_model.h"
#include "test_util.h"

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

static void test_names_as_transformers_reads_them(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int decays;
    } cases[] = {
        {"transformer.wte.weight", 1},
        {"transformer.h.0.attn.c_attn.weight", 1},
        {"transformer.h.0.attn.c_attn.bias", 0},
        {"lm_head.weight", 1},
        {"model.layers.0.input_layernorm.weight", 0},
        {"model.layers.0.self_attn.q_norm.weight", 0},
        {"model.norm.weight", 0},
        {"norm.weight", 0},
        {"model.x_norm", 0},
        {"encoder.block.0.layer.0.layer_norm.weight", 0},
        {"encoder.final_layer_norm.weight", 0},
        {"bert.embeddings.LayerNorm.weight", 0},
        {"model.RMSNorm.weight", 0},
        {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 0},
        {"model.normalizer.weight", 1}, /* "norm" not a whole component */
        {"model.enorm.weight", 1},
        {"model.norm_out.weight", 1},
        {"model.x_normal.weight", 1},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (regc_train_name_decays(cases[i].name) != cases[i].decays)
            fail_msg("%s: decays %d, expected %d", cases[i].name,
                     regc_train_name_decays(cases[i].name), cases[i].decays);
}

/* Decay flags of a preset's parameters (freed by the caller). */
static unsigned char *flags_of(regc_model *m, int kind)
{
    unsigned char *d = malloc((size_t)regc_model_n_params(m));
    assert_non_null(d);
    assert_int_equal(regc_train_decayed_params(m, kind, 1, 8, d), REGC_OK);
    return d;
}

static void test_groups_of_the_families(void **state)
{
    (void)state;
    /* what get_decay_parameter_names leaves out: GPT-2's 4 layers of two
     * LayerNorms (weight and bias) and four biases, and ln_f; Llama's two
     * RMSNorms a layer and the last; BERT's biases and LayerNorms; T5's
     * layer_norms and its two relative_attention_bias tables */
    static const int undecayed[] = {34, 9, 46, 14};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load(presets[p], &m), REGC_OK);
        unsigned char *all = flags_of(m, REGC_DECAY_ALL),
                      *groups = flags_of(m, REGC_DECAY_NOT_BIAS_NORM);
        int n = 0;
        for (int i = 0; i < regc_model_n_params(m); i++) {
            assert_int_equal(all[i], 1);
            n += !groups[i];
            if (!groups[i] && regc_train_name_decays(regc_model_param_name(m, i)) &&
                strcmp(presets[p], "gpt2-tiny") != 0)
                fail_msg("%s: %s left out by its graph alone", presets[p],
                         regc_model_param_name(m, i));
        }
        if (n != undecayed[p])
            fail_msg("%s: %d parameters not decayed, expected %d", presets[p], n, undecayed[p]);
        free(all), free(groups);
        regc_model_free(m);
    }
}

static regc_train_options options(int steps, float wd, int kind, int stage)
{
    regc_train_options o = regc_test_train_options(2, 16, steps);
    o.lr = 1e-2f, o.weight_decay = wd, o.weight_decay_params = kind, o.zero_stage = stage;
    return o;
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

static void test_one_step_decays_only_the_decayed(void **state)
{
    (void)state;
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
        regc_train_options og = options(1, 0.1f, REGC_DECAY_NOT_BIAS_NORM, 0),
                           oa = options(1, 0.1f, REGC_DECAY_ALL, 0),
                           o0 = options(1, 0.0f, REGC_DECAY_ALL, 0);
        regc_test_losses l;
        regc_model *g = regc_test_train(presets[p], &og, &l);
        regc_model *a = regc_test_train(presets[p], &oa, &l);
        regc_model *z = regc_test_train(presets[p], &o0, &l);
        unsigned char *decays = flags_of(g, REGC_DECAY_NOT_BIAS_NORM);
        int decay_shows = 0; /* a parameter whose decay changed its bits */
        for (int i = 0; i < regc_model_n_params(g); i++) {
            const int64_t at = regc_model_param_offset(g, i), n = regc_model_param_numel(g, i);
            const float *wg = regc_model_weights(g) + at, *wa = regc_model_weights(a) + at,
                        *wz = regc_model_weights(z) + at;
            if (!same_bits(wg, decays[i] ? wa : wz, n))
                fail_msg("%s: %s is not the step %s", presets[p], regc_model_param_name(g, i),
                         decays[i] ? "decaying all" : "at weight_decay 0");
            decay_shows += !decays[i] && !same_bits(wa, wz, n);
        }
        if (decay_shows == 0)
            fail_msg("%s: no undecayed parameter differs between decaying all and none",
                     presets[p]);
        free(decays);
        regc_model_free(g), regc_model_free(a), regc_model_free(z);
    }
}

static void test_stage3_and_offload_group_as_stage0(void **state)
{
    (void)state;
    for (size_t p = 0; p < 2; p++) {
        regc_train_options z0 = options(4, 0.1f, REGC_DECAY_NOT_BIAS_NORM, 0);
        regc_test_losses l0;
        regc_model *m0 = regc_test_train(presets[p], &z0, &l0);
        for (int way = 0; way < 2; way++) { /* stage 3; the update on the host */
            regc_train_options o = options(4, 0.1f, REGC_DECAY_NOT_BIAS_NORM, way ? 0 : 3);
            o.compile.offload_optimizer = way;
            regc_test_losses l;
            regc_model *m = regc_test_train(presets[p], &o, &l);
            for (int k = 0; k < 4; k++)
                if (memcmp(&l0.loss[k], &l.loss[k], sizeof l.loss[k]) != 0)
                    fail_msg("%s step %d: stage 0 %.9g, %s %.9g", presets[p], k, l0.loss[k],
                             way ? "offloaded" : "stage 3", l.loss[k]);
            regc_test_assert_same_weights(m0, m);
            regc_model_free(m);
        }
        regc_model_free(m0);
    }
}

/* Ranges that are not ascending, overlap, pass the block's end or are
 * missing are refused when the program is bound, naming them. */
static void test_bad_ranges_refused(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    const int64_t n = regc_model_total_numel(m);
    regc_backend *be = regc_backend_new("cpu", 1);
    assert_non_null(be);
    regc_test_state st;
    regc_test_state_alloc(be, m, 0.0f, &st);
    const int64_t descending[] = {10, 5}, overlapping[] = {0, 10, 5, 20}, past[] = {0, n + 1};
    const struct {
        const int64_t *r;
        int n;
        const char *says;
    } cases[] = {{descending, 1, "range 0 of the undecayed parameters, [10, 5)"},
                 {overlapping, 2, "range 1 of the undecayed parameters, [5, 20)"},
                 {past, 1, "within the"},
                 {NULL, 3, "3 undecayed ranges and no table"}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        regc_compile_options o;
        regc_compile_options_default(&o);
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, NULL), REGC_OK);
        for (int i = 0; i < regc_program_n_inputs(p); i++)
            if (!st.inputs[i])
                st.inputs[i] = be->alloc(be, (size_t)regc_tensor_bytes(regc_program_input(p, i)));
        regc_program_memory mem = {.params = st.block[0],
                                   .grads = st.block[1],
                                   .m = st.block[2],
                                   .v = st.block[3],
                                   .inputs = st.inputs,
                                   .no_decay = cases[c].r,
                                   .n_no_decay = cases[c].n};
        assert_int_equal(regc_program_bind(p, be, &mem), REGC_ERR_ARG);
        regc_test_expect_error(cases[c].says, NULL);
        regc_program_free(p);
    }
    regc_test_state_free(be, &st);
    regc_backend_free(be);
    regc_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_as_transformers_reads_them),
        cmocka_unit_test(test_groups_of_the_families),
        cmocka_unit_test(test_one_step_decays_only_the_decayed),
        cmocka_unit_test(test_stage3_and_offload_group_as_stage0),
        cmocka_unit_test(test_bad_ranges_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
