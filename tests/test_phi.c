/* test_phi.c — Phi (PhiForCausalLM) in models/decoder.c's terms: the
 * layer's attention and MLP side by side from one LayerNorm, the head's
 * bias, resid_pdrop and embd_pdrop where Transformers drops; RoPE on the
 * first int(head_dim * partial_rotary_factor) dimensions of each head
 * (its tables and frequencies that wide, the factor read from either
 * spelling, written back, its bad values refused by name); qk_layernorm's
 * LayerNorms; one region kind, regional == whole bit for bit at O0 and
 * O1; PEFT's default LoRA targets. Training against Transformers is
 * tests/data/decoder_reference.json's phi cases (test_train_reference);
 * the parameters' names and shapes, saving and the key table are
 * test_decoder_families.c's. */
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

static int setup(void **state) { return regc_test_dir_setup(state, "phi", "model"); }

/* Phi at C 32, 4 heads of 8 over 2 kv heads, 3 layers; `extra` adds keys
 * (one named there replaces its default). */
static void write_phi(regc_test_dir *f, const char *extra)
{
    static const char *const keys[][2] = {
        {"vocab_size", "256"}, /* the built-in corpus's */
        {"hidden_size", "32"},        {"intermediate_size", "48"},
        {"num_hidden_layers", "3"},   {"num_attention_heads", "4"},
        {"num_key_value_heads", "2"}, {"max_position_embeddings", "32"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"phi\"", keys, sizeof keys / sizeof *keys,
                           extra, NULL);
}

static regc_model *load_phi(regc_test_dir *f, const char *extra)
{
    write_phi(f, extra);
    regc_model *m = NULL;
    if (regc_model_load_config(f->path, &m) != REGC_OK)
        fail_msg("phi with %s: %s", extra ? extra : "its defaults", regc_error_message());
    return m;
}

static int count_ops(const regc_graph *g, regc_op op)
{
    int n = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++)
        n += regc_graph_node(g, i)->op == op;
    return n;
}

/* The node that produces tensor t. */
static const regc_node *producer(const regc_graph *g, int t)
{
    return regc_graph_node(g, regc_graph_tensor(g, t)->producer);
}

/* One LayerNorm a layer, read by q, k, v and the MLP's fc1 alike; the
 * residual x + (attention + MLP); the head's bias after its GEMM; with
 * dropout on, resid_pdrop on both blocks' outputs and embd_pdrop on the
 * embeddings. */
static void test_phi_layer(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_phi(f, "\"resid_pdrop\": 0.1, \"embd_pdrop\": 0.2");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    assert_int_equal(count_ops(g, REGC_OP_LAYERNORM), 3 + 1); /* a layer's, the final */
    assert_int_equal(count_ops(g, REGC_OP_DROPOUT), 0);
    int norm_out = -1, readers = 0, blocks = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op == REGC_OP_LAYERNORM && norm_out < 0)
            norm_out = n->out[0];
        if (n->op == REGC_OP_MATMUL && n->in[0] == norm_out)
            readers++;
        /* x + (a + m): the two blocks' outputs (dense's and fc2's, each
         * with its bias) summed before the residual */
        if (n->op == REGC_OP_ADD && producer(g, n->in[0])->op == REGC_OP_BIAS_ADD &&
            producer(g, n->in[1])->op == REGC_OP_BIAS_ADD)
            blocks++;
    }
    assert_int_equal(readers, 4); /* q, k, v, fc1 */
    assert_int_equal(blocks, 3);
    const regc_node *ce = regc_graph_node(g, regc_graph_n_nodes(g) - 1);
    assert_int_equal(ce->op, REGC_OP_CROSS_ENTROPY);
    assert_int_equal(producer(g, ce->in[0])->op, REGC_OP_BIAS_ADD);
    regc_graph_free(g);
    regc_model_set_dropout(m, 1);
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    assert_int_equal(count_ops(g, REGC_OP_DROPOUT), 2 * 3 + 1);
    regc_graph_free(g);
    char d[2048];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, "attention and MLP in parallel") || !strstr(d, "head bias") ||
        !strstr(d, "layer_norm_eps 1e-05") || !strstr(d, "embd_pdrop 0.2"))
        fail_msg("%s", d);
    regc_model_free(m);
}

/* The ROPE ops of m's graph: each over heads of `rotated` dimensions
 * (its tables [T, rotated / 2]), the first `rotated` of each head. */
static void expect_rotated(regc_model *m, int64_t rotated)
{
    const int64_t T = 8;
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, T, &g), REGC_OK);
    const int cos = regc_graph_find_tensor(g, "rope_cos");
    assert_true(cos >= 0);
    assert_int_equal(regc_graph_tensor(g, cos)->shape[0], T);
    assert_int_equal(regc_graph_tensor(g, cos)->shape[1], rotated / 2);
    int ropes = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op != REGC_OP_ROPE)
            continue;
        const regc_tensor *x = regc_graph_tensor(g, n->in[0]);
        assert_int_equal(x->shape[2], (int64_t)n->attrs.n_head * rotated);
        ropes++;
    }
    assert_int_equal(ropes, 2 * 3);
    /* partial: the rest of each head sliced off and joined again */
    assert_int_equal(count_ops(g, REGC_OP_CONCAT), rotated < 8 ? 2 * 3 : 0);
    float inv[4], s;
    assert_int_equal(regc_model_compute_rope(m, 0, NULL, 0, NULL), rotated / 2);
    assert_int_equal(regc_model_compute_rope(m, T, inv, rotated / 2, &s), rotated / 2);
    for (int64_t j = 0; j < rotated / 2; j++) /* 10000^(-2j / rotated) */
        assert_true(fabsf(inv[j] - (float)pow(1e4, -2.0 * (double)j / (double)rotated)) <=
                    1e-6f * inv[j]);
    regc_graph_free(g);
    regc_model_free(m);
}

/* partial_rotary_factor: 0.5 by default; the top level's or the
 * dictionary's (the same value in both taken); written back and read
 * again; refused by name where it is no share, where the two differ, and
 * where the part it rotates is odd or empty. */
static void test_phi_partial_rope(void **state)
{
    regc_test_dir *f = *state;
    expect_rotated(load_phi(f, NULL), 4);
    expect_rotated(load_phi(f, "\"partial_rotary_factor\": 0.75"), 6);
    expect_rotated(load_phi(f, "\"partial_rotary_factor\": 1.0"), 8);
    expect_rotated(load_phi(f, "\"rope_parameters\": {\"rope_type\": \"default\", "
                               "\"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.25}"),
                   2);
    expect_rotated(load_phi(f, "\"partial_rotary_factor\": 0.25, \"rope_parameters\": "
                               "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}"),
                   2);
    /* written back, and read so again */
    regc_model *m = load_phi(f, "\"partial_rotary_factor\": 0.75, \"hidden_act\": \"gelu_new\"");
    char out[1200];
    snprintf(out, sizeof out, "%s/saved", f->dir);
    assert_int_equal(regc_model_init_random(m, 5), REGC_OK);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    regc_model_free(m);
    char *path = regc_test_join(out, "config.json");
    char *text = regc_test_read_file(path, NULL);
    assert_non_null(text);
    if (!strstr(text, "\"partial_rotary_factor\":\t0.75") ||
        !strstr(text, "\"hidden_act\":\t\"gelu_new\"") || !strstr(text, "\"layer_norm_eps\"") ||
        !strstr(text, "\"qk_layernorm\":\tfalse"))
        fail_msg("%s:\n%s", path, text);
    free(text);
    free(path);
    assert_int_equal(regc_model_load(out, &m), REGC_OK);
    expect_rotated(m, 6);
    /* refused by name */
    static const struct {
        const char *extra, *what;
        int status;
    } bad[] = {
        {"\"partial_rotary_factor\": 0", "key \"partial_rotary_factor\" must be a number in (0, 1]",
         REGC_ERR_FORMAT},
        {"\"partial_rotary_factor\": 1.5",
         "key \"partial_rotary_factor\" must be a number in (0, 1]", REGC_ERR_FORMAT},
        {"\"partial_rotary_factor\": \"half\"", "key \"partial_rotary_factor\" must be a number",
         REGC_ERR_FORMAT},
        {"\"partial_rotary_factor\": 0.5, \"rope_parameters\": {\"rope_type\": \"default\", "
         "\"partial_rotary_factor\": 0.25}",
         "keys \"partial_rotary_factor\" (0.5) and \"rope_parameters.partial_rotary_factor\" "
         "(0.25) differ",
         REGC_ERR_FORMAT},
        {"\"partial_rotary_factor\": 0.375",
         "key \"partial_rotary_factor\" 0.375 rotates 3 of a head's 8 dimensions", REGC_ERR_FORMAT},
        {"\"partial_rotary_factor\": 0.1",
         "key \"partial_rotary_factor\" 0.1 rotates 0 of a head's 8 dimensions", REGC_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_phi(f, bad[i].extra);
        regc_test_expect_config_error(f->path, bad[i].status, bad[i].what);
    }
}

/* qk_layernorm: a LayerNorm (weight and bias) over each head of q and of
 * k, before RoPE; refused with heads of another width than
 * hidden_size / num_attention_heads, which Transformers sizes them by. */
static void test_phi_qk_layernorm(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_phi(f, "\"qk_layernorm\": true");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    assert_int_equal(count_ops(g, REGC_OP_LAYERNORM), 3 * 3 + 1);
    int before_rope = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op == REGC_OP_LAYERNORM && regc_graph_tensor(g, n->in[0])->ndim == 4 &&
            regc_graph_tensor(g, n->in[0])->shape[3] == 8 && n->n_in == 3)
            before_rope++;
    }
    assert_int_equal(before_rope, 2 * 3);
    regc_graph_free(g);
    regc_model_free(m);
    write_phi(f, "\"qk_layernorm\": true, \"head_dim\": 12");
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"qk_layernorm\" with head_dim 12");
}

/* Six layers in parallel form: compiled as one region, trained regional
 * and whole at O1 and O0, the same bits. */
static void test_phi_regional_equals_full(void **state)
{
    regc_test_dir *f = *state;
    const char *extra = "\"num_hidden_layers\": 6, \"qk_layernorm\": true";
    regc_model *m = load_phi(f, extra);
    regc_train_options o = regc_test_train_options(2, 16, 5);
    regc_program *p = NULL;
    regc_compile_stats st;
    assert_int_equal(regc_program_compile(m, o.batch, o.seq, &o.compile, &p, &st), REGC_OK);
    if (st.region_compiles != 1)
        fail_msg("phi, 6 layers: %d regions compiled", st.region_compiles);
    regc_program_free(p);
    regc_model_free(m);
    for (int level = 0; level < 2; level++) {
        regc_test_losses l[2];
        regc_model *trained[2];
        for (int regional = 0; regional < 2; regional++) {
            trained[regional] = load_phi(f, extra);
            o.compile.regional = regional;
            o.compile.level = level ? REGC_LEVEL_O1 : REGC_LEVEL_O0;
            regc_test_train_model(trained[regional], &o, &l[regional]);
        }
        if (memcmp(l[0].loss, l[1].loss, sizeof l[0].loss) != 0)
            fail_msg("phi at O%d: regional %.9g, whole %.9g at step 0", level, l[1].loss[0],
                     l[0].loss[0]);
        regc_test_assert_same_weights(trained[0], trained[1]);
        regc_model_free(trained[0]);
        regc_model_free(trained[1]);
    }
}

/* PEFT's default target_modules for phi: q_proj, v_proj, fc1, fc2. */
static void test_phi_lora_targets(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_phi(f, NULL);
    const regc_lora_config lora = {.r = 2};
    assert_int_equal(regc_model_add_lora(m, &lora), REGC_OK);
    char d[512];
    regc_lora_describe(m, d, sizeof d);
    if (!strstr(d, "q_proj") || !strstr(d, "v_proj") || !strstr(d, "fc1") || !strstr(d, "fc2") ||
        strstr(d, "k_proj") || strstr(d, "dense"))
        fail_msg("phi's default targets: %s", d);
    regc_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_phi_layer, setup),
        regc_test_in_dir(test_phi_partial_rope, setup),
        regc_test_in_dir(test_phi_qk_layernorm, setup),
        regc_test_in_dir(test_phi_regional_equals_full, setup),
        regc_test_in_dir(test_phi_lora_targets, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
