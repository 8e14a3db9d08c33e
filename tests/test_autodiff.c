/* test_autodiff.c — the backward rules of the ops regc's frontends build
 * (embedding, norms, GEMMs, attention, RoPE, activations, views, the
 * loss), each checked against central finite differences at O0 and O1 by
 * tests/support/test_vjp_check.h, which says how; then the embedding's
 * padding row and the errors of autodiff itself. The primitive ops an
 * exported model brings are in test_autodiff_exported.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_backend.h"
#include "regc_region.h"
#include "test_vjp_check.h"

/* ---- one builder per rule */

static int b_embedding(regc_graph *g)
{
    int i = regc_test_vjp_ids(g, "ids", 2, (int64_t[]){2, 3});
    int table = regc_test_vjp_param(g, "table", 2, (int64_t[]){REGC_TEST_VJP_VOCAB, 4});
    return regc_graph_embedding(g, i, table);
}

static int b_add(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 2, (int64_t[]){3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_add(g, a, b);
}

static int b_add_same_tensor_twice(regc_graph *g)
{
    /* x feeds two readers: its gradient is the sum of both contributions */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 4});
    return regc_graph_add(g, regc_graph_gelu(g, x), x);
}

static int b_bias_add(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 1, (int64_t[]){4});
    return regc_graph_bias_add(g, x, b);
}

static int b_bias_add_2d(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_bias_add(g, x, b);
}

static int b_layernorm(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 5});
    int w = regc_test_vjp_param(g, "w", 1, (int64_t[]){5}),
        b = regc_test_vjp_param(g, "b", 1, (int64_t[]){5});
    return regc_graph_layernorm(g, x, w, b, 1e-5f);
}

static int b_matmul_nn(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){4, 5});
    return regc_graph_matmul(g, a, b, 0, 0);
}

static int b_matmul_nt(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){5, 4});
    return regc_graph_matmul(g, a, b, 0, 1);
}

static int b_matmul_tn(regc_graph *g)
{
    /* a is [2, 3, 4]: as a matrix [6, 4], transposed [4, 6]; the weight
     * gradient of a linear layer has this form */
    int a = regc_test_vjp_param(g, "a", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 3, (int64_t[]){2, 3, 5});
    return regc_graph_matmul(g, a, b, 1, 0);
}

static int b_matmul_tt(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 2, (int64_t[]){6, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){5, 6});
    return regc_graph_matmul(g, a, b, 1, 1);
}

static int b_gelu(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 7});
    return regc_graph_gelu(g, x);
}

static int b_split_concat(regc_graph *g)
{
    /* one part unused: its gradient is zeros */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){2, 9});
    int parts[3];
    assert_int_equal(regc_graph_split(g, x, 3, parts), 0);
    return regc_graph_concat(g, 2, (int[]){parts[2], parts[0]});
}

static int b_concat(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 2, (int64_t[]){3, 2}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 2});
    return regc_graph_concat(g, 2, (int[]){a, b});
}

static int b_attention_causal_gqa(regc_graph *g)
{
    /* 4 query heads share 2 key/value heads, head_dim 3 */
    int q = regc_test_vjp_param(g, "q", 3, (int64_t[]){2, 4, 12});
    int k = regc_test_vjp_param(g, "k", 3, (int64_t[]){2, 4, 6}),
        v = regc_test_vjp_param(g, "v", 3, (int64_t[]){2, 4, 6});
    return regc_graph_attention(g, q, k, v, 4, 2, 1, 1.0f / sqrtf(3.0f));
}

static int b_attention_documents(regc_graph *g)
{
    /* rows of 7 holding documents of 3, 3 and 1 (the harness's doc_start),
     * with a window of 2 inside them */
    int q = regc_test_vjp_param(g, "q", 3, (int64_t[]){2, 7, 12});
    int k = regc_test_vjp_param(g, "k", 3, (int64_t[]){2, 7, 6}),
        v = regc_test_vjp_param(g, "v", 3, (int64_t[]){2, 7, 6});
    int docs = regc_test_vjp_ids(g, "doc_start", 2, (int64_t[]){2, 7});
    const regc_attrs a = {
        .n_head = 4, .n_kv_head = 2, .causal = 1, .scale = 1.0f / sqrtf(3.0f), .window = 2};
    return regc_graph_attention_full(g, q, k, v, -1, -1, -1, docs, &a);
}

static int b_attention_every_input(regc_graph *g)
{
    /* a score bias, a dropout's site and draw (its draw says not training)
     * and documents: the backward reads ten inputs */
    int q = regc_test_vjp_param(g, "q", 3, (int64_t[]){1, 6, 4});
    int k = regc_test_vjp_param(g, "k", 3, (int64_t[]){1, 6, 4}),
        v = regc_test_vjp_param(g, "v", 3, (int64_t[]){1, 6, 4});
    int bias = regc_test_vjp_param(g, "bias", 3, (int64_t[]){2, 6, 6});
    int site = regc_test_vjp_ids(g, "site", 1, (int64_t[]){1});
    int draw = regc_test_vjp_ids(g, "draw", 1, (int64_t[]){4});
    int docs = regc_test_vjp_ids(g, "doc_start", 2, (int64_t[]){1, 6});
    const regc_attrs a = {.n_head = 2, .n_kv_head = 2, .causal = 1, .scale = 0.7f, .value = 0.1f};
    return regc_graph_attention_full(g, q, k, v, bias, site, draw, docs, &a);
}

static int b_attention_cross(regc_graph *g)
{
    /* bidirectional, fewer queries than keys */
    int q = regc_test_vjp_param(g, "q", 3, (int64_t[]){1, 3, 4});
    int k = regc_test_vjp_param(g, "k", 3, (int64_t[]){1, 5, 4}),
        v = regc_test_vjp_param(g, "v", 3, (int64_t[]){1, 5, 4});
    return regc_graph_attention(g, q, k, v, 2, 2, 0, 0.5f);
}

static int b_attention_bias_causal_gqa(regc_graph *g)
{
    /* T5 decoder self-attention: scale 1, position bias [H, T, T] */
    int q = regc_test_vjp_param(g, "q", 3, (int64_t[]){2, 4, 12});
    int k = regc_test_vjp_param(g, "k", 3, (int64_t[]){2, 4, 6}),
        v = regc_test_vjp_param(g, "v", 3, (int64_t[]){2, 4, 6});
    int bias = regc_test_vjp_param(g, "bias", 3, (int64_t[]){4, 4, 4});
    return regc_graph_attention_bias(g, q, k, v, bias, 4, 2, 1, 1.0f);
}

static int b_attention_bias_cross(regc_graph *g)
{
    int q = regc_test_vjp_param(g, "q", 3, (int64_t[]){2, 3, 4});
    int k = regc_test_vjp_param(g, "k", 3, (int64_t[]){2, 5, 4}),
        v = regc_test_vjp_param(g, "v", 3, (int64_t[]){2, 5, 4});
    int bias = regc_test_vjp_param(g, "bias", 3, (int64_t[]){2, 3, 5});
    return regc_graph_attention_bias(g, q, k, v, bias, 2, 2, 0, 1.0f);
}

static int b_rmsnorm(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 5}),
        w = regc_test_vjp_param(g, "w", 1, (int64_t[]){5});
    return regc_graph_rmsnorm(g, x, w, 1e-6f);
}

static int b_rope(regc_graph *g)
{
    /* 2 heads of head_dim 4; the tables are [T, head_dim / 2] */
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 8});
    int cs = regc_test_vjp_param(g, "const_cos", 2, (int64_t[]){3, 2});
    int sn = regc_test_vjp_param(g, "const_sin", 2, (int64_t[]){3, 2});
    return regc_graph_rope(g, x, cs, sn, 2);
}

static int b_silu(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 7});
    return regc_graph_silu(g, x);
}

static int b_gelu_erf(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 7});
    return regc_graph_gelu_erf(g, x);
}

static int b_relu(regc_graph *g)
{
    /* The inputs are drawn from [0, 1): the negated half covers the zeroed
     * side, and both halves stay clear of the kink at 0 for these draws. */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 7}),
        neg = regc_test_vjp_param(g, "neg", 2, (int64_t[]){3, 7});
    int both = regc_graph_concat(g, 2, (int[]){x, regc_graph_scale(g, neg, -1.0f)}); /* [3, 14] */
    return regc_graph_relu(g, both);
}

static int b_scale(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 5});
    return regc_graph_scale(g, x, -0.37f);
}

static int b_t5_gated_gelu(regc_graph *g)
{
    /* T5's gated-gelu feed-forward: gelu(x wi_0^T) * (x wi_1^T) */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 4});
    int wi0 = regc_test_vjp_param(g, "wi0", 2, (int64_t[]){5, 4}),
        wi1 = regc_test_vjp_param(g, "wi1", 2, (int64_t[]){5, 4});
    return regc_graph_mul(g, regc_graph_gelu(g, regc_graph_matmul(g, x, wi0, 0, 1)),
                          regc_graph_matmul(g, x, wi1, 0, 1));
}

static int b_swiglu(regc_graph *g)
{
    /* Llama's MLP gate: silu(gate) * up */
    int gate = regc_test_vjp_param(g, "gate", 2, (int64_t[]){3, 4}),
        up = regc_test_vjp_param(g, "up", 2, (int64_t[]){3, 4});
    return regc_graph_mul(g, regc_graph_silu(g, gate), up);
}

static int b_mul_same_tensor_twice(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 4});
    return regc_graph_mul(g, x, x);
}

static int b_reshape(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){2, 6});
    int w = regc_test_vjp_param(g, "w", 2, (int64_t[]){4, 2});
    return regc_graph_matmul(g, regc_graph_reshape(g, x, 2, (int64_t[]){3, 4}), w, 0, 0);
}

static int b_transpose(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 4});
    return regc_graph_transpose(g, x, (int[]){2, 0, 1});
}

static int b_cross_entropy(regc_graph *g)
{
    int logits = regc_test_vjp_param(g, "logits", 3, (int64_t[]){2, 3, REGC_TEST_VJP_VOCAB});
    int t = regc_test_vjp_ids(g, "targets", 2, (int64_t[]){2, 3});
    return regc_graph_cross_entropy(g, logits, t);
}

REGC_TEST_VJP_CASE(embedding)
REGC_TEST_VJP_CASE(add)
REGC_TEST_VJP_CASE(add_same_tensor_twice)
REGC_TEST_VJP_CASE(bias_add)
REGC_TEST_VJP_CASE(bias_add_2d)
REGC_TEST_VJP_CASE(layernorm)
REGC_TEST_VJP_CASE(matmul_nn)
REGC_TEST_VJP_CASE(matmul_nt)
REGC_TEST_VJP_CASE(matmul_tn)
REGC_TEST_VJP_CASE(matmul_tt)
REGC_TEST_VJP_CASE(gelu)
REGC_TEST_VJP_CASE(split_concat)
REGC_TEST_VJP_CASE(concat)
REGC_TEST_VJP_CASE(attention_causal_gqa)
REGC_TEST_VJP_CASE(attention_documents)
REGC_TEST_VJP_CASE(attention_every_input)
REGC_TEST_VJP_CASE(attention_cross)
REGC_TEST_VJP_CASE(attention_bias_causal_gqa)
REGC_TEST_VJP_CASE(attention_bias_cross)
REGC_TEST_VJP_CASE(rmsnorm)
REGC_TEST_VJP_CASE(rope)
REGC_TEST_VJP_CASE(silu)
REGC_TEST_VJP_CASE(gelu_erf)
REGC_TEST_VJP_CASE(relu)
REGC_TEST_VJP_CASE(scale)
REGC_TEST_VJP_CASE(t5_gated_gelu)
REGC_TEST_VJP_CASE(swiglu)
REGC_TEST_VJP_CASE(mul_same_tensor_twice)
REGC_TEST_VJP_CASE(reshape)
REGC_TEST_VJP_CASE(transpose)
REGC_TEST_VJP_CASE(cross_entropy)

/* A padding row (PyTorch's padding_idx) takes no gradient from the
 * embedding; every other row gets the bits it gets without one. */
static void test_embedding_padding_row(void **state)
{
    (void)state;
    float *grads[2];
    const int64_t vocab = REGC_TEST_VJP_VOCAB, cols = 4, pad = 1; /* fill_input's ids hold 1 */
    for (int padded = 0; padded < 2; padded++) {
        regc_graph *g = regc_graph_new();
        int i = regc_test_vjp_ids(g, "ids", 2, (int64_t[]){2, 3});
        int table = regc_test_vjp_param(g, "table", 2, (int64_t[]){vocab, cols});
        regc_attrs a = {.padded = padded, .padding_idx = padded ? pad : 0};
        int y = 0;
        assert_true(regc_graph_add_node(g, REGC_OP_EMBEDDING, &a, 2, (int[]){i, table}, 1, &y, 0,
                                        NULL) >= 0);
        regc_test_vjp_objective(g, y);
        regc_compile_options o;
        regc_compile_options_default(&o);
        o.regional = 0;
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile_graph(g, &o, &p, NULL), REGC_OK);
        int n_in = regc_program_n_inputs(p);
        void **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
        for (int k = 0; k < n_in; k++) {
            const regc_tensor *t = regc_program_input(p, k);
            inputs[k] = malloc((size_t)regc_tensor_bytes(t));
            regc_test_vjp_fill_input(t, inputs[k], regc_rng_substream(43, (uint64_t)k));
        }
        float *params = malloc((size_t)(vocab * cols) * sizeof *params);
        grads[padded] = malloc((size_t)(vocab * cols) * sizeof(float));
        regc_rng_fill_uniform(params, (size_t)(vocab * cols), 42, 0.0f, 1.0f);
        regc_backend *be = regc_backend_cpu_new(1);
        regc_program_memory mem = {.params = params, .grads = grads[padded], .inputs = inputs};
        assert_int_equal(regc_program_bind(p, be, &mem), REGC_OK);
        assert_int_equal(regc_program_run(p), REGC_OK);
        for (int k = 0; k < n_in; k++)
            free(inputs[k]);
        free(inputs), free(params);
        regc_program_free(p); /* and the graph it took */
        regc_backend_free(be);
    }
    for (int64_t v = 0; v < vocab; v++)
        for (int64_t c = 0; c < cols; c++) {
            const float got = grads[1][v * cols + c], plain = grads[0][v * cols + c];
            if (v == pad ? got != 0.0f || plain == 0.0f : memcmp(&got, &plain, sizeof got) != 0)
                fail_msg("row %lld column %lld: %g with the padding row %lld, %g without",
                         (long long)v, (long long)c, got, (long long)pad, plain);
        }
    free(grads[0]), free(grads[1]);
}

/* ---- errors */

static void test_backward_op_has_no_rule(void **state)
{
    (void)state;
    regc_graph *g = regc_graph_new();
    int x = regc_test_vjp_param(g, "x", 1, (int64_t[]){4}),
        dy = regc_test_vjp_param(g, "dy", 1, (int64_t[]){4});
    int out;
    assert_true(
        regc_graph_add_node(g, REGC_OP_GELU_BWD, NULL, 2, (int[]){dy, x}, 1, &out, 0, NULL) >= 0);
    int d = regc_test_vjp_param(g, "d", 1, (int64_t[]){4});
    int *grad_of = malloc((size_t)regc_graph_n_tensors(g) * sizeof *grad_of);
    assert_int_equal(regc_autodiff_vjp(g, out, d, grad_of), REGC_ERR_UNSUPPORTED);
    assert_non_null(strstr(regc_error_message(), "gelu_bwd"));
    free(grad_of);
    regc_graph_free(g);
}

static void test_loss_must_be_scalar(void **state)
{
    (void)state;
    regc_graph *g = regc_graph_new();
    int x = regc_test_vjp_param(g, "x", 1, (int64_t[]){4});
    int y = regc_graph_gelu(g, x);
    int *grad_of = malloc((size_t)(regc_graph_n_tensors(g) + 1) * sizeof *grad_of);
    assert_int_equal(regc_autodiff_loss(g, y, grad_of), REGC_ERR_SHAPE);
    assert_non_null(strstr(regc_error_message(), "not a scalar"));
    free(grad_of);
    regc_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_add_same_tensor_twice),
        cmocka_unit_test(test_bias_add),
        cmocka_unit_test(test_bias_add_2d),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul_nn),
        cmocka_unit_test(test_matmul_nt),
        cmocka_unit_test(test_matmul_tn),
        cmocka_unit_test(test_matmul_tt),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_split_concat),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_attention_causal_gqa),
        cmocka_unit_test(test_attention_documents),
        cmocka_unit_test(test_attention_every_input),
        cmocka_unit_test(test_attention_cross),
        cmocka_unit_test(test_attention_bias_causal_gqa),
        cmocka_unit_test(test_attention_bias_cross),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_t5_gated_gelu),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_mul_same_tensor_twice),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_embedding_padding_row),
        cmocka_unit_test(test_backward_op_has_no_rule),
        cmocka_unit_test(test_loss_must_be_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
