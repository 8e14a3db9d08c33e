/* test_parallel_decoders.c — the decoders whose attention and MLP run side
 * by side, in models/decoder.c's terms.
 *  - Phi (PhiForCausalLM): both blocks from one LayerNorm, the head's bias,
 *    resid_pdrop and embd_pdrop where Transformers drops; RoPE on the first
 *    int(head_dim * partial_rotary_factor) dimensions of each head (its
 *    tables and frequencies that wide, the factor read from either
 *    spelling, written back, its bad values refused by name); qk_layernorm's
 *    LayerNorms; one region kind, regional == whole bit for bit at O0 and
 *    O1; PEFT's default LoRA targets.
 *  - GPT-NeoX (GPTNeoXForCausalLM): each block from its own LayerNorm of x,
 *    or one after the other (use_parallel_residual); q, k and v fused head
 *    by head; RoPE by rotary_pct and rotary_emb_base, refused by those names;
 *    hidden_dropout on the embeddings and both blocks; its parameters in
 *    checkpoint order, the head read under either name; pad_token_id no
 *    padding index, written back as read; regional == whole.
 *  - StableLM (StableLmForCausalLM): Llama's layer with LayerNorms, side by
 *    side from one of them (summed (x + a) + m, no post-attention norm) or
 *    not (use_parallel_residual), use_qkv_bias, hidden_dropout after the MLP
 *    alone, its per-head q/k norms and head_dim refused by name;
 *    regional == whole.
 * Training against Transformers is tests/data/decoder_reference.json's phi,
 * gpt_neox and stablelm cases (test_train_reference); Phi's parameters and
 * saving are test_decoder_families.c's, every key table test_config_keys.c's. */
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

static int setup(void **state) { return regc_test_dir_setup(state, "parallel", "model"); }

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

/* The node that produces tensor t; the test fails where none does (a
 * parameter, an input). */
static const regc_node *producer(const regc_graph *g, int t)
{
    const int at = regc_graph_tensor(g, t)->producer;
    if (at < 0)
        fail_msg("tensor %s: no node produces it", regc_graph_tensor(g, t)->name);
    return regc_graph_node(g, at);
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
    assert_int_equal(regc_test_count_ops(g, REGC_OP_LAYERNORM), 3 + 1); /* a layer's, the final */
    assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 0);
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
    assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 2 * 3 + 1);
    regc_graph_free(g);
    char d[2048];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, "attention and MLP in parallel") || !strstr(d, "head bias") ||
        !strstr(d, "layer_norm_eps 1e-05") || !strstr(d, "embd_pdrop 0.2"))
        fail_msg("%s", d);
    regc_model_free(m);
}

/* The ROPE ops of m's graph: each over whole heads of 8, its tables
 * [T, rotated / 2] (the first `rotated` of each head turn, the kernel
 * passes the rest through). */
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
        assert_int_equal(x->shape[2], (int64_t)n->attrs.n_head * 8);
        assert_int_equal(regc_graph_tensor(g, n->in[1])->shape[1], rotated / 2);
        ropes++;
    }
    assert_int_equal(ropes, 2 * 3);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_SLICE) + regc_test_count_ops(g, REGC_OP_CONCAT),
                     0);
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
        {"\"partial_rotary_factor\": null", "key \"partial_rotary_factor\" is null",
         REGC_ERR_FORMAT},
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
    assert_int_equal(regc_test_count_ops(g, REGC_OP_LAYERNORM), 3 * 3 + 1);
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
    regc_test_expect_regional_equals_full(
        *state, load_phi, "\"num_hidden_layers\": 6, \"qk_layernorm\": true", "phi");
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

/* ---- GPT-NeoX ------------------------------------------------------------ */

/* GPT-NeoX at C 64, 4 heads of 16, 3 layers (no num_key_value_heads or
 * head_dim keys: it has none); `extra` adds keys. */
static void write_neox(regc_test_dir *f, const char *extra)
{
    static const char *const keys[][2] = {
        {"vocab_size", "256"},      {"hidden_size", "64"},        {"intermediate_size", "80"},
        {"num_hidden_layers", "3"}, {"num_attention_heads", "4"}, {"max_position_embeddings", "32"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"gpt_neox\"", keys,
                           sizeof keys / sizeof *keys, extra, NULL);
}

static regc_model *load_neox(regc_test_dir *f, const char *extra)
{
    write_neox(f, extra);
    regc_model *m = NULL;
    if (regc_model_load_config(f->path, &m) != REGC_OK)
        fail_msg("gpt_neox with %s: %s", extra ? extra : "its defaults", regc_error_message());
    return m;
}

/* Its parameters in GPTNeoXForCausalLM's order and shapes, the head saved
 * as embed_out. */
static void test_neox_params(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_neox(f, NULL);
    static const char *const layer[] = {"input_layernorm.weight:64",
                                        "input_layernorm.bias:64",
                                        "post_attention_layernorm.weight:64",
                                        "post_attention_layernorm.bias:64",
                                        "attention.query_key_value.weight:192x64",
                                        "attention.query_key_value.bias:192",
                                        "attention.dense.weight:64x64",
                                        "attention.dense.bias:64",
                                        "mlp.dense_h_to_4h.weight:80x64",
                                        "mlp.dense_h_to_4h.bias:80",
                                        "mlp.dense_4h_to_h.weight:64x80",
                                        "mlp.dense_4h_to_h.bias:64"};
    const int per = (int)(sizeof layer / sizeof *layer);
    assert_int_equal(regc_model_n_params(m), 1 + 3 * per + 3);
    assert_string_equal(regc_model_param_name(m, 0), "gpt_neox.embed_in.weight");
    for (int p = 0; p < per; p++) {
        const char *colon = strchr(layer[p], ':');
        char want[128], shape[32];
        snprintf(want, sizeof want, "gpt_neox.layers.1.%.*s", (int)(colon - layer[p]), layer[p]);
        assert_string_equal(regc_model_param_name(m, 1 + per + p), want);
        int64_t d[REGC_MAX_DIMS];
        if (regc_model_param_shape(m, 1 + per + p, d) == 2)
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)d[0], (long long)d[1]);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)d[0]);
        if (strcmp(shape, colon + 1) != 0)
            fail_msg("%s: %s, want %s", want, shape, colon + 1);
    }
    assert_string_equal(regc_model_param_name(m, 1 + 3 * per), "gpt_neox.final_layer_norm.weight");
    assert_string_equal(regc_model_param_name(m, 2 + 3 * per), "gpt_neox.final_layer_norm.bias");
    assert_string_equal(regc_model_param_name(m, 3 + 3 * per), "embed_out.weight");
    regc_model_free(m);
    m = load_neox(f, "\"attention_bias\": false");
    assert_int_equal(regc_model_n_params(m), 1 + 3 * (per - 2) + 3);
    regc_model_free(m);
}

/* The fused projection's rows head by head: regrouped [B, T, H, 3, D] ->
 * [B, T, 3, H, D] and split in three, q, k and v are tensors of their own
 * (no views, which bf16 would not hold). */
static void test_neox_qkv_per_head(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_neox(f, NULL);
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    int n = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *nd = regc_graph_node(g, i);
        if (nd->op != REGC_OP_TRANSPOSE)
            continue;
        const regc_tensor *x = regc_graph_tensor(g, nd->in[0]);
        const int64_t want[] = {2, 8, 4, 3, 16}; /* B, T, heads, q/k/v, D */
        const int perm[] = {0, 1, 3, 2, 4};
        assert_int_equal(x->ndim, 5);
        assert_memory_equal(x->shape, want, sizeof want);
        assert_memory_equal(nd->attrs.perm, perm, sizeof perm);
        n++;
    }
    assert_int_equal(n, 3);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_SPLIT), 3);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_SLICE), 0);
    regc_graph_free(g);
    char d[2048];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, "q/k/v fused head by head") || !strstr(d, "attention and MLP in parallel") ||
        strstr(d, "gate_up") || !strstr(d, "RoPE on 4 of each head's 16 dimensions") ||
        !strstr(d, ", gelu,"))
        fail_msg("%s", d);
    regc_model_free(m);
}

/* The MLP's LayerNorm reads the layer's input x in parallel form, x + a
 * one after the other; hidden_dropout on the embeddings and both blocks. */
static void test_neox_parallel(void **state)
{
    regc_test_dir *f = *state;
    for (int parallel = 0; parallel < 2; parallel++) {
        regc_model *m =
            load_neox(f, parallel ? "\"hidden_dropout\": 0.1" : "\"use_parallel_residual\": false");
        regc_graph *g = NULL;
        assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
        assert_int_equal(regc_test_count_ops(g, REGC_OP_LAYERNORM), 2 * 3 + 1);
        /* layer 0's two norms: the first reads the embeddings; the second
         * the same (parallel) or the attention's residual sum */
        int norms[2], n = 0;
        for (int i = 0; i < regc_graph_n_nodes(g) && n < 2; i++)
            if (regc_graph_node(g, i)->op == REGC_OP_LAYERNORM)
                norms[n++] = i;
        const regc_node *a = regc_graph_node(g, norms[0]), *b = regc_graph_node(g, norms[1]);
        if (parallel)
            assert_int_equal(a->in[0], b->in[0]);
        else
            assert_int_equal(producer(g, b->in[0])->op, REGC_OP_ADD);
        regc_graph_free(g);
        if (parallel) {
            regc_model_set_dropout(m, 1);
            assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
            assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 2 * 3 + 1);
            regc_graph_free(g);
        }
        regc_model_free(m);
    }
}

/* The inverse frequencies of m's RoPE: n of them, base^(-2j / (2n)). */
static void expect_base(regc_model *m, int64_t n, double base)
{
    float inv[8], s;
    assert_int_equal(regc_model_compute_rope(m, 8, inv, n, &s), n);
    for (int64_t j = 0; j < n; j++)
        if (!(fabsf(inv[j] - (float)pow(base, -(double)j / (double)n)) <= 1e-6f * inv[j]))
            fail_msg("frequency %lld: %g, want base %g's", (long long)j, inv[j], base);
    regc_model_free(m);
}

/* RoPE by GPT-NeoX's names: rotary_pct (0.25) and rotary_emb_base
 * (10000), or rope_parameters' (Transformers 5's); the top-level
 * rope_theta and partial_rotary_factor inert, as Transformers ignores
 * them; bad values and disagreements refused by GPT-NeoX's names; written
 * back as rope_parameters and read so again. */
static void test_neox_rope(void **state)
{
    regc_test_dir *f = *state;
    expect_base(load_neox(f, NULL), 2, 1e4);
    expect_base(load_neox(f, "\"rotary_pct\": 0.5, \"rotary_emb_base\": 100"), 4, 100.0);
    expect_base(load_neox(f, "\"rope_theta\": 5.0, \"partial_rotary_factor\": 1.0"), 2, 1e4);
    expect_base(load_neox(f, "\"rope_parameters\": {\"rope_type\": \"default\", "
                             "\"rope_theta\": 50.0, \"partial_rotary_factor\": 1.0}"),
                8, 50.0);
    expect_base(load_neox(f, "\"rotary_pct\": 1.0, \"rope_parameters\": {\"rope_type\": "
                             "\"default\", \"partial_rotary_factor\": 1.0}"),
                8, 1e4);
    regc_model *m = load_neox(f, "\"rotary_pct\": 0.5, \"rotary_emb_base\": 100, "
                                 "\"pad_token_id\": 5");
    assert_int_equal(regc_test_embedding_padding(m), -1); /* no padding index */
    m = load_neox(f, "\"rotary_pct\": 0.5, \"rotary_emb_base\": 100, \"pad_token_id\": 5");
    char out[1200];
    snprintf(out, sizeof out, "%s/saved", f->dir);
    assert_int_equal(regc_model_init_random(m, 7), REGC_OK);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    regc_model_free(m);
    char *path = regc_test_join(out, "config.json");
    char *text = regc_test_read_file(path, NULL);
    assert_non_null(text);
    if (!strstr(text, "\"rope_parameters\":") || !strstr(text, "\"partial_rotary_factor\":\t0.5") ||
        !strstr(text, "\"pad_token_id\":\t5") || strstr(text, "num_key_value_heads") ||
        !strstr(text, "\"use_parallel_residual\":\ttrue"))
        fail_msg("%s:\n%s", path, text);
    free(text);
    free(path);
    assert_int_equal(regc_model_load(out, &m), REGC_OK);
    expect_base(m, 4, 100.0);
    static const struct {
        const char *extra, *what;
    } bad[] = {
        {"\"rotary_pct\": 0", "key \"rotary_pct\" must be a number in (0, 1]"},
        {"\"rotary_pct\": true", "key \"rotary_pct\" must be a number in (0, 1]"},
        {"\"rotary_emb_base\": -1", "key \"rotary_emb_base\""},
        {"\"rotary_pct\": 0.5, \"rope_parameters\": {\"rope_type\": \"default\", "
         "\"partial_rotary_factor\": 0.25}",
         "keys \"rotary_pct\" (0.5) and \"rope_parameters.partial_rotary_factor\" (0.25) differ"},
        {"\"rotary_emb_base\": 100, \"rope_scaling\": {\"rope_type\": \"linear\", "
         "\"factor\": 2.0, \"rope_theta\": 10.0}",
         "keys \"rotary_emb_base\" (100) and \"rope_scaling.rope_theta\" (10) differ"},
        {"\"rotary_pct\": 0.1875", "key \"rotary_pct\" 0.1875 rotates 3 of a head's 16"},
        {"\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.1875}",
         "key \"rope_parameters.partial_rotary_factor\" 0.1875 rotates 3"},
        {"\"rotary_pct\": null", "key \"rotary_pct\" is null"},
        {"\"rotary_emb_base\": null", "key \"rotary_emb_base\" is null"},
        {"\"rotary_pct\": 0.125, \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}",
         "rope_type \"dynamic\" with 2 of each head's 16 dimensions rotated"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_neox(f, bad[i].extra);
        regc_test_expect_config_error(f->path, REGC_ERR_FORMAT, bad[i].what);
    }
}

/* A checkpoint whose head is named as Transformers 5 names it in memory
 * (lm_head.weight) loads as one saved as embed_out.weight. */
static void test_neox_head_names(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_neox(f, NULL), *back = NULL;
    assert_int_equal(regc_model_init_random(m, 3), REGC_OK);
    char out[1200], st_path[1300];
    snprintf(out, sizeof out, "%s/saved", f->dir);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", out);
    regc_st_file *sf = NULL;
    assert_int_equal(regc_st_open(st_path, &sf), REGC_OK);
    const int n = regc_st_count(sf);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    assert_non_null(e);
    int renamed = 0;
    for (int i = 0; i < n; i++) {
        const int k = regc_test_param_index(m, regc_st_name(sf, i));
        assert_true(k >= 0);
        e[i].name = strdup(strcmp(regc_st_name(sf, i), "embed_out.weight") ? regc_st_name(sf, i)
                                                                           : "lm_head.weight");
        assert_non_null(e[i].name);
        renamed += e[i].name[0] == 'l';
        e[i].dtype = REGC_F32;
        e[i].ndim = regc_model_param_shape(m, k, e[i].shape);
        int64_t numel = 1;
        for (int d = 0; d < e[i].ndim; d++)
            numel *= e[i].shape[d];
        float *data = malloc((size_t)numel * sizeof *data);
        assert_non_null(data);
        assert_int_equal(regc_st_read_f32(sf, i, e[i].ndim, e[i].shape, data), REGC_OK);
        e[i].data = data;
    }
    assert_int_equal(renamed, 1);
    regc_st_close(sf);
    assert_int_equal(regc_st_write(st_path, e, n), REGC_OK);
    for (int i = 0; i < n; i++)
        free((void *)e[i].data), free(e[i].name);
    free(e);
    if (regc_model_load(out, &back) != REGC_OK)
        fail_msg("%s: %s", out, regc_error_message());
    regc_test_assert_same_weights(m, back);
    regc_model_free(back);
    regc_model_free(m);
}

/* Six layers, parallel: one region, regional == whole at O1 and O0; PEFT's
 * default LoRA target, the fused projection. */
static void test_neox_regional_equals_full(void **state)
{
    regc_test_dir *f = *state;
    regc_test_expect_regional_equals_full(f, load_neox, "\"num_hidden_layers\": 6", "gpt_neox");
    regc_model *m = load_neox(f, NULL);
    const regc_lora_config lora = {.r = 2};
    assert_int_equal(regc_model_add_lora(m, &lora), REGC_OK);
    char d[512];
    regc_lora_describe(m, d, sizeof d);
    if (!strstr(d, "query_key_value") || strstr(d, "dense"))
        fail_msg("gpt_neox's default targets: %s", d);
    regc_model_free(m);
}

/* ---- StableLM ------------------------------------------------------------ */

static regc_model *load_stablelm(regc_test_dir *f, const char *extra)
{
    static const char *const keys[][2] = {
        {"vocab_size", "256"},
        {"hidden_size", "64"},
        {"intermediate_size", "80"},
        {"num_hidden_layers", "3"},
        {"num_attention_heads", "4"},
        {"num_key_value_heads", "2"},
        {"max_position_embeddings", "32"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"stablelm\"", keys,
                           sizeof keys / sizeof *keys, extra, NULL);
    regc_model *m = NULL;
    if (regc_model_load_config(f->path, &m) != REGC_OK)
        fail_msg("stablelm with %s: %s", extra ? extra : "its defaults", regc_error_message());
    return m;
}

/* The layer's parameters (q/k/v biases with use_qkv_bias; no
 * post-attention norm side by side); side by side, the sum (x + a) + m
 * and one LayerNorm a layer; hidden_dropout after the MLP alone. */
static void test_stablelm_layer(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = load_stablelm(f, NULL);
    assert_int_equal(regc_model_n_params(m), 1 + 3 * 11 + 3); /* 11 a layer; norm, bias, head */
    assert_string_equal(regc_model_param_name(m, 9), "model.layers.0.input_layernorm.bias");
    assert_string_equal(regc_model_param_name(m, 11),
                        "model.layers.0.post_attention_layernorm.bias");
    regc_model_free(m);
    m = load_stablelm(f, "\"use_qkv_bias\": true, \"use_parallel_residual\": true, "
                         "\"hidden_dropout\": 0.1");
    assert_int_equal(regc_model_n_params(m), 1 + 3 * 12 + 3); /* +3 biases, -2 norm */
    assert_string_equal(regc_model_param_name(m, 2), "model.layers.0.self_attn.q_proj.bias");
    assert_string_equal(regc_model_param_name(m, 12), "model.layers.0.input_layernorm.bias");
    assert_string_equal(regc_model_param_name(m, 13), "model.layers.1.self_attn.q_proj.weight");
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_LAYERNORM), 3 + 1);
    /* (x + a) + m: an add of the residual sum and the MLP's down projection */
    int sums = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op != REGC_OP_ADD)
            continue;
        const regc_node *mlp = producer(g, n->in[1]);
        sums += producer(g, n->in[0])->op == REGC_OP_ADD && mlp->op == REGC_OP_MATMUL &&
                strstr(regc_graph_tensor(g, mlp->in[1])->name, "down_proj") != NULL;
    }
    assert_int_equal(sums, 3);
    regc_graph_free(g);
    regc_model_set_dropout(m, 1);
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    assert_int_equal(regc_test_count_ops(g, REGC_OP_DROPOUT), 3);
    regc_graph_free(g);
    char d[2048];
    regc_model_describe(m, d, sizeof d);
    if (!strstr(d, "q/k/v biases") || !strstr(d, "attention and MLP in parallel") ||
        !strstr(d, "RoPE on 4 of each head's 16 dimensions") || !strstr(d, "hidden_dropout 0.1"))
        fail_msg("%s", d);
    /* saved and read back: the same model (no head_dim written, which it refuses) */
    char out[1200], back_d[2048];
    snprintf(out, sizeof out, "%s/saved", f->dir);
    assert_int_equal(regc_model_init_random(m, 4), REGC_OK);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    regc_model *back = NULL;
    if (regc_model_load(out, &back) != REGC_OK)
        fail_msg("%s: %s", out, regc_error_message());
    regc_test_assert_same_weights(m, back);
    regc_model_describe(m, d, sizeof d);
    regc_model_describe(back, back_d, sizeof back_d);
    *strchr(d, ';') = *strchr(back_d, ';') = '\0'; /* the run's dropout apart */
    assert_string_equal(strchr(d, ':'), strchr(back_d, ':'));
    regc_model_free(back);
    regc_model_free(m);
    /* what regc does not build, by name */
    write_neox(f, NULL); /* a directory to overwrite */
    static const char *const keys[][2] = {
        {"vocab_size", "256"},      {"hidden_size", "64"},        {"intermediate_size", "80"},
        {"num_hidden_layers", "3"}, {"num_attention_heads", "4"}, {"max_position_embeddings", "32"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"stablelm\"", keys,
                           sizeof keys / sizeof *keys, "\"qk_layernorm\": true", NULL);
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"qk_layernorm\" is not supported: StableLM normalises");
    regc_test_write_config(f->path, "\"model_type\": \"stablelm\"", keys,
                           sizeof keys / sizeof *keys, "\"head_dim\": 16", NULL);
    regc_test_expect_config_error(f->path, REGC_ERR_UNSUPPORTED,
                                  "key \"head_dim\" is not supported");
    /* num_key_value_heads absent: Transformers' StableLM takes 32, whatever
     * the heads (4 here: refused; 64: k and v of 32 heads) */
    regc_test_write_config(f->path, "\"model_type\": \"stablelm\"", keys,
                           sizeof keys / sizeof *keys, NULL, NULL);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT,
                                  "key \"num_key_value_heads\" is 32, which does not divide");
    regc_test_write_config(f->path, "\"model_type\": \"stablelm\"", keys,
                           sizeof keys / sizeof *keys,
                           "\"hidden_size\": 1024, \"num_attention_heads\": 64", NULL);
    m = NULL;
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    regc_test_assert_param_shape(m, "model.layers.0.self_attn.k_proj.weight", 2, 512, 1024);
    regc_model_free(m);
}

/* Side by side over six layers: one region, regional == whole at O0 and
 * O1. */
static void test_stablelm_regional_equals_full(void **state)
{
    regc_test_expect_regional_equals_full(
        *state, load_stablelm, "\"num_hidden_layers\": 6, \"use_parallel_residual\": true",
        "stablelm");
}

/* ---- bf16 ---------------------------------------------------------------- */

/* In bf16, O0 and O1 give the same bits for each family here: q, k and v
 * are tensors of their own (partial RoPE in one kernel, GPT-NeoX's q/k/v
 * split rather than sliced views), so both levels hold the same saved
 * values in bf16. */
static void test_bf16_levels_alike(void **state)
{
    regc_test_dir *f = *state;
    static const char *const extra[] = {
        "\"model_type\": \"phi\", \"num_key_value_heads\": 2",
        "\"model_type\": \"gpt_neox\"",
        "\"model_type\": \"stablelm\", \"num_key_value_heads\": 2, "
        "\"use_parallel_residual\": true",
    };
    static const char *const keys[][2] = {
        {"vocab_size", "256"},      {"hidden_size", "64"},        {"intermediate_size", "80"},
        {"num_hidden_layers", "2"}, {"num_attention_heads", "4"}, {"max_position_embeddings", "32"},
    };
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) {
        regc_test_write_config(f->path, extra[i], keys, sizeof keys / sizeof *keys, NULL, NULL);
        regc_train_options o = regc_test_train_options(2, 16, 3);
        o.compile.precision = REGC_PRECISION_BF16;
        regc_test_losses l[2];
        regc_model *m[2];
        for (int level = 0; level < 2; level++) {
            assert_int_equal(regc_model_load_config(f->path, &m[level]), REGC_OK);
            o.compile.level = level ? REGC_LEVEL_O1 : REGC_LEVEL_O0;
            regc_test_train_model(m[level], &o, &l[level]);
        }
        if (memcmp(l[0].loss, l[1].loss, sizeof l[0].loss) != 0)
            fail_msg("%s in bf16: O0 %.9g, O1 %.9g at step 0", extra[i], l[0].loss[0],
                     l[1].loss[0]);
        regc_test_assert_same_weights(m[0], m[1]);
        regc_model_free(m[0]), regc_model_free(m[1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_phi_layer, setup),
        regc_test_in_dir(test_phi_partial_rope, setup),
        regc_test_in_dir(test_phi_qk_layernorm, setup),
        regc_test_in_dir(test_phi_regional_equals_full, setup),
        regc_test_in_dir(test_phi_lora_targets, setup),
        regc_test_in_dir(test_neox_params, setup),
        regc_test_in_dir(test_neox_qkv_per_head, setup),
        regc_test_in_dir(test_neox_parallel, setup),
        regc_test_in_dir(test_neox_rope, setup),
        regc_test_in_dir(test_neox_head_names, setup),
        regc_test_in_dir(test_neox_regional_equals_full, setup),
        regc_test_in_dir(test_stablelm_layer, setup),
        regc_test_in_dir(test_stablelm_regional_equals_full, setup),
        regc_test_in_dir(test_bf16_levels_alike, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
