/* test_graph.c — the graph IR: shape rules, names, the text dump, and the
 * JSON form (exact round trip; located errors for bad input). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_common.h"
#include "regc_graph.h"

/* A small graph touching every forward op and, through autodiff, every
 * backward op. */
static regc_graph *every_op_graph(void)
{
    regc_graph *g = regc_graph_new();
    int ids = regc_graph_add_tensor(g, "ids", REGC_I32, REGC_ROLE_INPUT, 2, (int64_t[]){2, 4});
    int tgt = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, (int64_t[]){2, 4});
    int wte = regc_graph_add_tensor(g, "wte", REGC_F32, REGC_ROLE_PARAM, 2, (int64_t[]){11, 6});
    int lnw = regc_graph_add_tensor(g, "ln.w", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){6});
    int lnb = regc_graph_add_tensor(g, "ln.b", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){6});
    int w = regc_graph_add_tensor(g, "w", REGC_F32, REGC_ROLE_PARAM, 2, (int64_t[]){6, 18});
    int b = regc_graph_add_tensor(g, "b", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){18});
    int rmsw = regc_graph_add_tensor(g, "rms.w", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){6});
    int pos =
        regc_graph_add_tensor(g, "pos_bias", REGC_F32, REGC_ROLE_PARAM, 3, (int64_t[]){2, 4, 4});
    /* RoPE tables for 3 heads of head_dim 2: [T, head_dim / 2] */
    int cs = regc_graph_add_constant(g, "cos", REGC_F32, 2, (int64_t[]){4, 1});
    int sn = regc_graph_add_constant(g, "sin", REGC_F32, 2, (int64_t[]){4, 1});
    regc_attrs pad = {.padded = 1, .padding_idx = 3}; /* id 3's row takes no gradient */
    int x = 0;
    assert_true(regc_graph_add_node(g, REGC_OP_EMBEDDING, &pad, 2, (int[]){ids, wte}, 1, &x, 0,
                                    NULL) >= 0);                            /* [2, 4, 6] */
    int h = regc_graph_layernorm(g, x, lnw, lnb, 1e-5f);                    /* [2, 4, 6] */
    int hr = regc_graph_rmsnorm(g, h, rmsw, 1e-6f);                         /* [2, 4, 6] */
    int qkv = regc_graph_bias_add(g, regc_graph_matmul(g, hr, w, 0, 0), b); /* [2, 4, 18] */
    int parts[3];
    assert_int_equal(regc_graph_split(g, qkv, 3, parts), 0);                 /* 3 x [2, 4, 6] */
    int qr = regc_graph_rope(g, parts[0], cs, sn, 3);                        /* [2, 4, 6] */
    int a0 = regc_graph_attention(g, qr, parts[1], parts[2], 2, 2, 1, 0.5f); /* [2, 4, 6] */
    int ab = regc_graph_attention_bias(g, parts[0], parts[1], parts[2], pos, 2, 2, 0, 1.0f);
    int a = regc_graph_mul(g, regc_graph_silu(g, a0), regc_graph_gelu_erf(g, ab)); /* [2, 4, 6] */
    a = regc_graph_scale(g, regc_graph_relu(g, a), 0.3f);                          /* [2, 4, 6] */
    /* the pointwise ops of exported graphs; b [6] broadcast over [2, 4, 6] */
    a = regc_graph_div(g, regc_graph_sub(g, a, lnb), regc_graph_exp(g, lnw));
    a = regc_graph_tanh(g, regc_graph_add_scalar(g, regc_graph_neg(g, a), 0.5f));
    a = regc_graph_mul(g, regc_graph_pow(g, a, 3.0f),
                       regc_graph_rsqrt(g, regc_graph_add_scalar(g, regc_graph_exp(g, a), 1.0f)));
    /* the row ops, and a row's statistic broadcast along it */
    int rs = regc_graph_sum_last(g, regc_graph_softmax(g, a)); /* [2, 4, 1] */
    a = regc_graph_sub(g, regc_graph_log_softmax(g, a), regc_graph_expand(g, rs, 6));
    a = regc_graph_mul(g, a, regc_graph_mean_last(g, a)); /* [2, 4, 6] */
    a = regc_graph_masked_fill(g, a, lnw, -1.0f);         /* the mask [6] broadcast */
    int site = regc_graph_add_constant(g, "dropout.site.1", REGC_I32, 1, (int64_t[]){1});
    int draw =
        regc_graph_add_tensor(g, "dropout.draw", REGC_I32, REGC_ROLE_INPUT, 1, (int64_t[]){4});
    a = regc_graph_dropout(g, a, site, draw, 0.25f); /* [2, 4, 6] */
    /* attention with a bias and its probabilities dropped */
    const regc_attrs drop = {.n_head = 2, .n_kv_head = 2, .scale = 1.0f, .value = 0.125f};
    a = regc_graph_add(
        g, a, regc_graph_attention_full(g, a, parts[1], parts[2], pos, site, draw, -1, &drop));
    int lo = regc_graph_slice(g, a, 2, 0, 3), hi = regc_graph_slice(g, a, 2, 3, 3);
    a = regc_graph_concat(g, 2, (int[]){hi, lo});                             /* [2, 4, 6] */
    int t = regc_graph_transpose(g, regc_graph_gelu(g, a), (int[]){1, 0, 2}); /* [4, 2, 6] */
    int r = regc_graph_reshape(g, regc_graph_transpose(g, t, (int[]){1, 0, 2}), 3,
                               (int64_t[]){2, 4, 6});
    int c = regc_graph_concat(g, 2, (int[]){r, x}); /* [2, 4, 12] */
    int s = regc_graph_add(g, c, c);
    int back = regc_graph_matmul(g, s, w, 0, 1); /* invalid: 12 vs 18 */
    assert_true(back < 0);
    int logits = regc_graph_matmul(g, regc_graph_split(g, s, 2, parts) == 0 ? parts[0] : -1, wte, 0,
                                   1); /* [2, 4, 11] */
    int loss = regc_graph_cross_entropy(g, logits, tgt);
    assert_true(loss >= 0);
    regc_graph_mark_output(g, loss);
    int *grad_of = malloc((size_t)regc_graph_n_tensors(g) * sizeof *grad_of);
    assert_int_equal(regc_autodiff_loss(g, loss, grad_of), REGC_OK);
    free(grad_of);
    return g;
}

static void test_json_round_trip_is_exact(void **state)
{
    (void)state;
    regc_graph *g = every_op_graph();
    char *text = regc_graph_to_json(g);
    assert_non_null(text);
    regc_graph *back = NULL;
    assert_int_equal(regc_graph_from_json(text, "every_op.json", &back), REGC_OK);
    char *again = regc_graph_to_json(back);
    assert_string_equal(text, again);
    assert_int_equal(regc_graph_n_nodes(back), regc_graph_n_nodes(g));
    assert_int_equal(regc_graph_n_tensors(back), regc_graph_n_tensors(g));
    /* constants stay constants, data inputs stay data */
    for (int id = 0; id < regc_graph_n_tensors(g); id++)
        assert_int_equal(regc_graph_tensor(back, id)->constant, regc_graph_tensor(g, id)->constant);
    assert_true(regc_graph_tensor(back, regc_graph_find_tensor(back, "cos"))->constant);
    assert_false(regc_graph_tensor(back, regc_graph_find_tensor(back, "ids"))->constant);
    int n_constant = 0; /* the JSON spells the role out */
    for (const char *s = text; (s = strstr(s, "\"constant\"")) != NULL; s++)
        n_constant++;
    assert_int_equal(n_constant, 3);
    /* every op kind made it through, attributes included */
    int seen[REGC_OP_COUNT] = {0};
    for (int i = 0; i < regc_graph_n_nodes(back); i++) {
        const regc_node *n = regc_graph_node(back, i), *m = regc_graph_node(g, i);
        seen[n->op] = 1;
        assert_int_equal(n->op, m->op);
        assert_memory_equal(&n->attrs, &m->attrs, sizeof n->attrs);
        assert_memory_equal(n->in, m->in, (size_t)n->n_in * sizeof *n->in);
    }
    for (int op = 0; op < REGC_OP_COUNT; op++)
        if (!seen[op])
            fail_msg("op %s missing from the round-trip graph", regc_op_name((regc_op)op));
    free(text);
    free(again);
    regc_graph_free(back);
    regc_graph_free(g);
}

static void test_dump_lists_params_and_nodes(void **state)
{
    (void)state;
    regc_graph *g = every_op_graph();
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    regc_graph_dump(g, f);
    fclose(f);
    assert_non_null(strstr(buf, "param    wte f32 [11, 6]"));
    assert_non_null(strstr(buf, "constant cos f32 [4, 1]"));
    assert_non_null(strstr(buf, "input    ids i32 [2, 4]"));
    assert_non_null(strstr(buf, "= matmul("));
    assert_non_null(strstr(buf, "n_head=2 n_kv_head=2 causal=1"));
    assert_non_null(strstr(buf, "= attention_bwd("));
    assert_non_null(strstr(buf, "= rope("));
    assert_non_null(strstr(buf, "n_head=3 inverse=1")); /* the backward rotation */
    assert_non_null(strstr(buf, "= rmsnorm_bwd("));
    assert_non_null(strstr(buf, "output %"));
    free(buf);
    regc_graph_free(g);
}

static void test_new_op_shape_errors(void **state)
{
    (void)state;
    regc_graph *g = regc_graph_new();
    int x = regc_graph_add_tensor(g, "x", REGC_F32, REGC_ROLE_INPUT, 3, (int64_t[]){2, 4, 6});
    int w5 = regc_graph_add_tensor(g, "w5", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){5});
    int cs = regc_graph_add_tensor(g, "cos", REGC_F32, REGC_ROLE_INPUT, 2, (int64_t[]){4, 1});
    int bias = regc_graph_add_tensor(g, "bias", REGC_F32, REGC_ROLE_PARAM, 3, (int64_t[]){2, 4, 5});
    assert_true(regc_graph_rmsnorm(g, x, w5, 1e-6f) < 0);
    assert_non_null(strstr(regc_error_message(), "rmsnorm"));
    assert_non_null(strstr(regc_error_message(), "w5 [5]"));
    /* the tables' width is half the part of each head rotated: [4, 2]
     * turns 4 values, more than heads of 3 hold */
    int cs2 = regc_graph_add_tensor(g, "cos2", REGC_F32, REGC_ROLE_INPUT, 2, (int64_t[]){4, 2});
    assert_true(regc_graph_rope(g, x, cs2, cs2, 2) < 0);
    assert_non_null(strstr(regc_error_message(), "rot_dim within head_dim"));
    int cs3 = regc_graph_add_tensor(g, "cos3", REGC_F32, REGC_ROLE_INPUT, 2, (int64_t[]){3, 1});
    assert_true(regc_graph_rope(g, x, cs3, cs3, 1) < 0); /* 3 positions, not 4 */
    assert_non_null(strstr(regc_error_message(), "cos3 [3, 1]"));
    assert_true(regc_graph_rope(g, x, cs2, cs, 1) < 0); /* the two tables differ */
    assert_true(regc_graph_mul(g, x, cs) < 0);
    assert_non_null(strstr(regc_error_message(), "mul"));
    assert_true(regc_graph_attention_bias(g, x, x, x, bias, 2, 2, 0, 1.0f) < 0);
    assert_non_null(strstr(regc_error_message(), "expected shape [2, 4, 4]"));
    /* the backward of an unbiased attention has no bias gradient to give */
    int out[4];
    int lse = regc_graph_add_tensor(g, "lse", REGC_F32, REGC_ROLE_INPUT, 3, (int64_t[]){2, 2, 4});
    regc_attrs a = {.n_head = 2, .n_kv_head = 2, .scale = 1.0f};
    assert_true(regc_graph_add_node(g, REGC_OP_ATTENTION_BWD, &a, 6, (int[]){x, x, x, x, x, lse}, 4,
                                    out, 0, NULL) < 0);
    assert_non_null(strstr(regc_error_message(), "4 outputs (3, or 4 with a bias)"));
    /* the probabilities' dropout: p in [0, 1), its site i32 [1] and draw
     * i32 [4] last */
    int site = regc_graph_add_tensor(g, "site", REGC_I32, REGC_ROLE_INPUT, 1, (int64_t[]){1});
    int draw = regc_graph_add_tensor(g, "draw", REGC_I32, REGC_ROLE_INPUT, 1, (int64_t[]){4});
    regc_attrs drop = {.n_head = 2, .n_kv_head = 2, .scale = 1.0f, .value = 0.1f};
    assert_true(
        regc_graph_add_node(g, REGC_OP_ATTENTION, &drop, 3, (int[]){x, x, x}, 2, out, 0, NULL) < 0);
    assert_non_null(strstr(regc_error_message(),
                           "attention: 3 inputs given (5, one more with a bias, the dropout's "
                           "site and draw after it)"));
    assert_true(regc_graph_attention_full(g, x, x, x, -1, draw, site, -1, &drop) < 0);
    assert_non_null(strstr(regc_error_message(), "draw [4]: must be an i32 site [1]"));
    assert_true(regc_graph_attention_full(g, x, x, x, -1, x, draw, -1, &drop) < 0);
    assert_non_null(strstr(regc_error_message(), "x [2, 4, 6]: dtype f32, expected i32"));
    drop.value = 1.0f;
    assert_true(regc_graph_attention_full(g, x, x, x, -1, site, draw, -1, &drop) < 0);
    assert_non_null(strstr(regc_error_message(), "attention: dropout 1 is outside [0, 1)"));
    assert_true(regc_graph_scale(g, x, INFINITY) < 0);
    assert_non_null(strstr(regc_error_message(), "scale: value must be finite"));
    assert_true(regc_graph_add_node(g, REGC_OP_RELU_BWD, NULL, 2, (int[]){x, cs}, 1, out, 0, NULL) <
                0);
    assert_non_null(strstr(regc_error_message(), "relu_bwd"));
    /* the exported graphs' ops */
    int w6 = regc_graph_add_tensor(g, "w6", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){6});
    assert_true(regc_graph_masked_fill(g, x, w6, -INFINITY) < 0); /* JSON has no infinity */
    assert_non_null(strstr(regc_error_message(), "masked_fill: value must be finite"));
    assert_true(regc_graph_sub(g, x, w5) < 0); /* [5] is no broadcast of [2, 4, 6] */
    assert_non_null(strstr(regc_error_message(), "sub"));
    assert_true(regc_graph_slice(g, x, 2, 4, 3) < 0); /* 4 + 3 > 6 */
    assert_non_null(strstr(regc_error_message(), "window"));
    assert_true(regc_graph_expand(g, x, 9) < 0); /* the last dimension is 6, not 1 */
    assert_non_null(strstr(regc_error_message(), "expand"));
    int ids = regc_graph_add_tensor(g, "ids", REGC_I32, REGC_ROLE_INPUT, 2, (int64_t[]){2, 4});
    regc_attrs pad = {.vocab = 5, .padded = 1, .padding_idx = 5};
    assert_true(regc_graph_add_node(g, REGC_OP_EMBEDDING_BWD, &pad, 2, (int[]){x, ids}, 1, out, 0,
                                    NULL) < 0);
    assert_non_null(strstr(regc_error_message(), "padding_idx 5 is not below vocab 5"));
    assert_int_equal(regc_graph_n_nodes(g), 0);
    regc_graph_free(g);
}

static void test_shape_errors_name_the_tensors(void **state)
{
    (void)state;
    regc_graph *g = regc_graph_new();
    int a = regc_graph_add_tensor(g, "a", REGC_F32, REGC_ROLE_INPUT, 2, (int64_t[]){3, 4});
    int b = regc_graph_add_tensor(g, "b", REGC_F32, REGC_ROLE_PARAM, 2, (int64_t[]){5, 6});
    assert_true(regc_graph_matmul(g, a, b, 0, 0) < 0);
    assert_non_null(strstr(regc_error_message(), "matmul"));
    assert_non_null(strstr(regc_error_message(), "b [5, 6]"));
    assert_true(regc_graph_add(g, a, b) < 0);
    assert_non_null(strstr(regc_error_message(), "add"));
    assert_int_equal(regc_graph_add_tensor(g, "a", REGC_F32, REGC_ROLE_INPUT, 1, (int64_t[]){2}),
                     REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "name used twice"));
    assert_true(regc_graph_add_tensor(g, "z", REGC_F32, REGC_ROLE_INPUT, 1, (int64_t[]){0}) < 0);
    int ids = regc_graph_add_tensor(g, "ids", REGC_F32, REGC_ROLE_INPUT, 1, (int64_t[]){3});
    assert_true(regc_graph_embedding(g, ids, b) < 0); /* ids must be i32 */
    assert_non_null(strstr(regc_error_message(), "expected i32"));
    assert_true(regc_graph_attention(g, a, a, a, 3, 2, 1, 1.0f) < 0); /* 3 heads, 2 kv heads */
    /* failed nodes leave the graph as it was */
    assert_int_equal(regc_graph_n_nodes(g), 0);
    assert_int_equal(regc_graph_n_tensors(g), 3);
    regc_graph_free(g);
}

static void test_shape_only_graph_is_small(void **state)
{
    (void)state;
    /* a Llama-70B-wide stack of 80 matmuls: shapes only, no weight memory */
    regc_graph *g = regc_graph_new();
    int x = regc_graph_add_tensor(g, "x", REGC_F32, REGC_ROLE_INPUT, 3, (int64_t[]){1, 4096, 8192});
    for (int l = 0; l < 80; l++) {
        char name[32];
        snprintf(name, sizeof name, "w%d", l);
        int w =
            regc_graph_add_tensor(g, name, REGC_BF16, REGC_ROLE_PARAM, 2, (int64_t[]){8192, 8192});
        assert_true(w >= 0);
        /* bf16 weights are not matmul inputs yet: keep an f32 twin */
        snprintf(name, sizeof name, "v%d", l);
        int v =
            regc_graph_add_tensor(g, name, REGC_F32, REGC_ROLE_PARAM, 2, (int64_t[]){8192, 8192});
        x = regc_graph_matmul(g, x, v, 0, 0);
        assert_true(x >= 0);
    }
    assert_int_equal(regc_graph_n_nodes(g), 80);
    assert_int_equal(regc_graph_find_tensor(g, "v79"), regc_graph_n_tensors(g) - 2);
    regc_graph_free(g);
}

/* ---- JSON errors: each names the source and where */

static void expect_json_error(const char *text, const char *where, const char *what)
{
    regc_graph *g = (regc_graph *)0x1;
    int rc = regc_graph_from_json(text, "bad.json", &g);
    assert_true(rc < 0);
    assert_null(g);
    const char *msg = regc_error_message();
    if (!strstr(msg, "bad.json") || !strstr(msg, where) || !strstr(msg, what))
        fail_msg("expected \"%s\" and \"%s\" in: %s", where, what, msg);
}

#define HEAD "{\"format\": \"regc-graph\", \"version\": 1, "
#define LEAF(id, name)                                                                             \
    "{\"id\": " #id ", \"name\": \"" name                                                          \
    "\", \"dtype\": \"f32\", \"role\": \"input\", \"shape\": [2, 3]}"

static void test_json_malformed(void **state)
{
    (void)state;
    expect_json_error("{\n\"format\": \"regc-graph\",\n \"version\": 1,,\n}", "bad.json",
                      "malformed JSON near line 3");
    expect_json_error("[]", "top level", "expected a JSON object");
    expect_json_error("{\"format\": \"other\"}", "top level", "\"format\"");
    expect_json_error(HEAD "\"tensors\": [], \"nodes\": []}", "top level", "must be arrays");
}

static void test_json_dangling_and_cyclic_ids(void **state)
{
    (void)state;
    /* node 0 reads tensor 5, which nothing defines before it */
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(
            0, "a") "], \"nodes\": ["
                    "{\"op\": \"gelu\", \"in\": [5], \"out\": [1]}], \"outputs\": []}",
        "nodes[0] (gelu)", "not defined before");
    /* a cycle: node 0 reads node 1's output, node 1 reads node 0's */
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(
            0, "a") "], \"nodes\": ["
                    "{\"op\": \"add\", \"in\": [0, 2], \"out\": [1]},"
                    "{\"op\": \"gelu\", \"in\": [1], \"out\": [2]}], \"outputs\": []}",
        "nodes[0] (add)", "not defined before");
    expect_json_error(HEAD "\"tensors\": [" LEAF(0, "a") "], \"nodes\": [], \"outputs\": [7]}",
                      "outputs", "refers to no tensor");
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(0, "a") "," LEAF(0, "b") "], \"nodes\": [], \"outputs\": []}",
        "tensors[1]", "already defined");
}

static void test_json_bad_nodes(void **state)
{
    (void)state;
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(
            0, "a") "], \"nodes\": ["
                    "{\"op\": \"frobnicate\", \"in\": [0], \"out\": [1]}], \"outputs\": []}",
        "nodes[0] (frobnicate)", "unknown op");
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(0, "a") "," LEAF(
            1, "b") "], \"nodes\": ["
                    "{\"op\": \"matmul\", \"in\": [0, 1], \"out\": [2], \"trans_a\": 0, "
                    "\"trans_b\": 0}], \"outputs\": []}",
        "nodes[0] (matmul)", "inner dimension");
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(
            0, "a") "], \"nodes\": ["
                    "{\"op\": \"layernorm\", \"in\": [0, 0, 0], \"out\": [1, 2, 3]}], "
                    "\"outputs\": []}",
        "nodes[0] (layernorm)", "\"eps\"");
    expect_json_error(HEAD "\"tensors\": [{\"id\": 0, \"name\": \"a\", \"dtype\": \"f64\", "
                           "\"role\": \"input\", \"shape\": [2]}], \"nodes\": [], \"outputs\": []}",
                      "tensors[0]", "\"dtype\"");
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(
            0, "a") "], \"nodes\": ["
                    "{\"op\": \"gelu\", \"in\": [0], \"out\": [4]}], \"outputs\": []}",
        "nodes[0] (gelu)", "next unused ids");
}

/* A float attribute beyond float's range would become infinity, which JSON
 * cannot spell: the graph would be accepted and then not read back. */
static void test_json_float_out_of_range(void **state)
{
    (void)state;
    expect_json_error(
        HEAD "\"tensors\": [" LEAF(0, "a") "], \"nodes\": [{\"op\": \"scale\", \"in\": [0], "
                                           "\"out\": [1], \"value\": 1e39}], \"outputs\": []}",
        "nodes[0] (scale)", "\"value\" must be a number a float holds");
    expect_json_error(HEAD "\"tensors\": [" LEAF(0, "a") "," LEAF(1, "w") "," LEAF(
                          2, "b") "], \"nodes\": [{\"op\": \"layernorm\", \"in\": [0, 1, 2], "
                                  "\"out\": [3, 4, 5], \"eps\": -1e300}], \"outputs\": []}",
                      "nodes[0] (layernorm)", "\"eps\" must be a number a float holds");
}

/* Shapes come from files: a product of dimensions past int64 is refused
 * where the tensor is made, naming it, so no later element or byte count
 * (regc_tensor_numel, the memory plan) can overflow. */
static void test_shape_products_overflow(void **state)
{
    (void)state;
    /* a leaf of 2^40 x 2^40 elements */
    expect_json_error(HEAD "\"tensors\": [{\"id\": 0, \"name\": \"huge\", \"dtype\": \"f32\", "
                           "\"role\": \"param\", \"shape\": [1099511627776, 1099511627776]}], "
                           "\"nodes\": [], \"outputs\": []}",
                      "tensors[0]",
                      "tensor huge: shape [1099511627776, 1099511627776] has more "
                      "bytes than int64 counts");
    /* each input fits, their product does not: [2^40, 1] x [1, 2^40] */
    expect_json_error(
        HEAD "\"tensors\": [{\"id\": 0, \"name\": \"a\", \"dtype\": \"f32\", \"role\": \"input\", "
             "\"shape\": [1099511627776, 1]}, {\"id\": 1, \"name\": \"b\", \"dtype\": \"f32\", "
             "\"role\": \"input\", \"shape\": [1, 1099511627776]}], \"nodes\": [{\"op\": "
             "\"matmul\", \"in\": [0, 1], \"out\": [2], \"trans_a\": 0, \"trans_b\": 0}], "
             "\"outputs\": []}",
        "nodes[0] (matmul)", "tensor %2: shape [1099511627776, 1099511627776]");
    /* a reshape target whose product wraps */
    expect_json_error(HEAD "\"tensors\": [" LEAF(0, "a") "], \"nodes\": [{\"op\": \"reshape\", "
                                                         "\"in\": [0], \"out\": [1], \"shape\": "
                                                         "[1099511627776, 1099511627776, 16]}], "
                                                         "\"outputs\": []}",
                      "nodes[0] (reshape)",
                      "tensor a [2, 3]: the target shape is not a valid shape");
    /* bytes past int64 though the elements fit, and a concatenation past it */
    regc_graph *g = regc_graph_new();
    assert_non_null(g);
    int64_t big[1] = {INT64_C(1) << 62};
    assert_int_equal(regc_graph_add_tensor(g, "wide", REGC_F32, REGC_ROLE_INPUT, 1, big),
                     REGC_ERR_SHAPE);
    const char *msg = regc_error_message();
    assert_non_null(strstr(msg, "tensor wide: shape [4611686018427387904]"));
    big[0] = INT64_C(1) << 60;
    int x = regc_graph_add_tensor(g, "x", REGC_F32, REGC_ROLE_INPUT, 1, big);
    assert_true(x >= 0);
    int in[8] = {x, x, x, x, x, x, x, x}, out[1];
    assert_int_equal(regc_graph_add_node(g, REGC_OP_CONCAT, NULL, 8, in, 1, out, 0, NULL),
                     REGC_ERR_SHAPE);
    assert_non_null(strstr(regc_error_message(), "concat: tensor x"));
    assert_int_equal(regc_graph_n_tensors(g), 1);
    regc_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_round_trip_is_exact),
        cmocka_unit_test(test_dump_lists_params_and_nodes),
        cmocka_unit_test(test_shape_errors_name_the_tensors),
        cmocka_unit_test(test_new_op_shape_errors),
        cmocka_unit_test(test_shape_only_graph_is_small),
        cmocka_unit_test(test_json_malformed),
        cmocka_unit_test(test_json_dangling_and_cyclic_ids),
        cmocka_unit_test(test_json_bad_nodes),
        cmocka_unit_test(test_shape_products_overflow),
        cmocka_unit_test(test_json_float_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
