/* test_autodiff_exported.c — the backward rules of the primitive ops an
 * exported model brings (sub, div, exp, tanh, pow, softmax, sums, masked
 * fills, slices, and chains of them), each against central finite
 * differences at O0 and O1 through tests/support/test_vjp_check.c, as
 * test_autodiff.c checks the frontends' ops. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_vjp_check.h"

/* The elementwise ops an exported model brings. Parameters are drawn from
 * [-1, 1); shifts and scales place them where each op is interesting. */
static int b_sub(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 2, (int64_t[]){3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_sub(g, a, b);
}

static int b_sub_broadcast(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 1, (int64_t[]){4});
    return regc_graph_sub(g, a, b);
}

static int b_sub_broadcast_batch1(regc_graph *g)
{
    /* GPT-2's positions at batch 1: b has as many elements as a, and a one
     * more (unit) dimension; b's gradient still comes back in b's shape,
     * which the embedding's backward below it checks */
    int tok = regc_test_vjp_ids(g, "ids", 2, (int64_t[]){1, 3}),
        pos = regc_test_vjp_ids(g, "pos", 1, (int64_t[]){3});
    int wte = regc_test_vjp_param(g, "wte", 2, (int64_t[]){REGC_TEST_VJP_VOCAB, 4}),
        wpe = regc_test_vjp_param(g, "wpe", 2, (int64_t[]){REGC_TEST_VJP_VOCAB, 4});
    int a = regc_graph_embedding(g, tok, wte), b = regc_graph_embedding(g, pos, wpe);
    return regc_graph_sub(g, regc_graph_bias_add(g, a, b), b);
}

static int b_div(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 2, (int64_t[]){3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_div(g, a, regc_graph_add_scalar(g, regc_graph_scale(g, b, 0.25f), 1.0f));
}

static int b_div_broadcast(regc_graph *g)
{
    int a = regc_test_vjp_param(g, "a", 3, (int64_t[]){2, 3, 4}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_div(g, a, regc_graph_add_scalar(g, regc_graph_scale(g, b, 0.25f), 1.0f));
}

static int b_neg_exp(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 5});
    return regc_graph_exp(g, regc_graph_neg(g, regc_graph_scale(g, x, 3.0f)));
}

static int b_tanh(regc_graph *g)
{
    /* [-2.4, 2.6): both of regc_tanhf's forms */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){4, 6});
    return regc_graph_tanh(g, regc_graph_add_scalar(g, regc_graph_scale(g, x, 2.5f), 0.1f));
}

static int b_rsqrt(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 5});
    return regc_graph_rsqrt(g, regc_graph_add_scalar(g, regc_graph_scale(g, x, 0.4f), 1.0f));
}

static int b_pow(regc_graph *g)
{
    /* a whole exponent over signed values, a fractional and a negative one
     * over positive values */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 4});
    int s = regc_graph_scale(g, x, 1.0f);                                 /* [-1, 1) */
    int p = regc_graph_add_scalar(g, regc_graph_scale(g, x, 0.5f), 1.0f); /* [0.5, 1.5) */
    int cube = regc_graph_pow(g, s, 3.0f);
    int frac = regc_graph_pow(g, p, 2.5f), inv = regc_graph_pow(g, p, -1.5f);
    return regc_graph_concat(g, 3, (int[]){cube, frac, inv}); /* [3, 12] */
}

static int b_gelu_decomposed(regc_graph *g)
{
    /* GPT-2's gelu_new as torch.export spells it: 0.5 x (1 + tanh(sqrt(2/pi)
     * (x + 0.044715 x^3))) */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){3, 6});
    int s = regc_graph_scale(g, x, 3.0f); /* [-3, 3) */
    int inner = regc_graph_add(g, s, regc_graph_scale(g, regc_graph_pow(g, s, 3.0f), 0.044715f));
    int t = regc_graph_tanh(g, regc_graph_scale(g, inner, 0.7978845608f));
    return regc_graph_mul(g, regc_graph_scale(g, s, 0.5f), regc_graph_add_scalar(g, t, 1.0f));
}

/* The row ops (softmax, log-softmax, sum, mean over the last axis) and the
 * row broadcasts of their statistics. */
static int b_softmax(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 7});
    return regc_graph_softmax(g, regc_graph_scale(g, x, 3.0f));
}

static int b_log_softmax(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){4, 9});
    return regc_graph_log_softmax(g, regc_graph_scale(g, x, 3.0f));
}

static int b_sum_mean_last(regc_graph *g)
{
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 5});
    int s = regc_graph_sum_last(g, x), m = regc_graph_mean_last(g, regc_graph_mul(g, x, x));
    return regc_graph_concat(g, 2, (int[]){s, m}); /* [2, 3, 2] */
}

static int b_row_broadcast(regc_graph *g)
{
    /* a [..., 1] statistic against its rows, in each operand place */
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 4}),
        r = regc_test_vjp_param(g, "r", 3, (int64_t[]){2, 3, 1});
    int d = regc_graph_add_scalar(g, regc_graph_scale(g, r, 0.25f), 1.0f); /* [0.75, 1.25) */
    int y = regc_graph_div(g, regc_graph_sub(g, regc_graph_mul(g, x, r), r), d);
    return regc_graph_add(g, y, regc_graph_expand(g, r, 4));
}

static int b_rmsnorm_decomposed(regc_graph *g)
{
    /* Llama's RMSNorm as torch.export spells it:
     * w * (x * rsqrt(mean(x^2, -1, keepdim) + eps)) */
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 3, 8}),
        w = regc_test_vjp_param(g, "w", 1, (int64_t[]){8});
    int ms = regc_graph_mean_last(g, regc_graph_pow(g, x, 2.0f));
    int n = regc_graph_mul(g, x, regc_graph_rsqrt(g, regc_graph_add_scalar(g, ms, 1e-5f)));
    return regc_graph_mul(g, n, w);
}

static int b_attention_decomposed(regc_graph *g)
{
    /* one head of attention with an explicit additive mask (a parameter
     * here, so that its gradient is checked too): softmax(q k^T / 2 + mask) v */
    int q = regc_test_vjp_param(g, "q", 2, (int64_t[]){5, 4}),
        k = regc_test_vjp_param(g, "k", 2, (int64_t[]){5, 4});
    int v = regc_test_vjp_param(g, "v", 2, (int64_t[]){5, 3});
    int mask = regc_test_vjp_param(g, "mask", 2, (int64_t[]){5, 5});
    int s = regc_graph_scale(g, regc_graph_matmul(g, q, k, 0, 1), 0.5f); /* [5, 5] */
    int p = regc_graph_softmax(g, regc_graph_add(g, s, mask));
    return regc_graph_matmul(g, p, v, 0, 0); /* [5, 3] */
}

static int b_chain_shared_broadcast(regc_graph *g)
{
    /* one operand broadcast two ways by two ops of one chain: t [2, 1] a
     * row's statistic of A [2, 3], trailing dimensions of B [3, 2, 1] */
    int A = regc_test_vjp_param(g, "A", 2, (int64_t[]){2, 3}),
        B = regc_test_vjp_param(g, "B", 3, (int64_t[]){3, 2, 1});
    int t = regc_test_vjp_param(g, "t", 2, (int64_t[]){2, 1});
    int y1 = regc_graph_sub(g, A, t), y2 = regc_graph_mul(g, B, t); /* 6 elements each */
    return regc_graph_matmul(g, regc_graph_reshape(g, y1, 2, (int64_t[]){6, 1}),
                             regc_graph_reshape(g, y2, 2, (int64_t[]){1, 6}), 0, 0); /* [6, 6] */
}

static int b_chain_through_reshape(regc_graph *g)
{
    /* a chain across a view: the add reads the gelu's output reshaped */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){2, 3}),
        w = regc_test_vjp_param(g, "w", 2, (int64_t[]){3, 2});
    return regc_graph_add(g, regc_graph_reshape(g, regc_graph_gelu(g, x), 2, (int64_t[]){3, 2}), w);
}

static int b_concat_unequal(regc_graph *g)
{
    /* parts of widths 2, 5 and 1 on the last axis */
    int a = regc_test_vjp_param(g, "a", 2, (int64_t[]){3, 2}),
        b = regc_test_vjp_param(g, "b", 2, (int64_t[]){3, 5});
    int c = regc_test_vjp_param(g, "c", 2, (int64_t[]){3, 1});
    return regc_graph_concat(g, 3, (int[]){a, regc_graph_tanh(g, b), c}); /* [3, 8] */
}

static int b_masked_fill(regc_graph *g)
{
    /* masks from constants: relu zeroes about half of each; one of x's
     * shape, one per row, one per column */
    int x = regc_test_vjp_param(g, "x", 2, (int64_t[]){4, 5});
    int m = regc_graph_relu(g, regc_test_vjp_param(g, "const_m", 2, (int64_t[]){4, 5}));
    int r = regc_graph_relu(g, regc_test_vjp_param(g, "const_r", 2, (int64_t[]){4, 1}));
    int cm = regc_graph_relu(g, regc_test_vjp_param(g, "const_c", 1, (int64_t[]){5}));
    int y = regc_graph_masked_fill(g, regc_graph_scale(g, x, 2.0f), m, -2.5f);
    y = regc_graph_masked_fill(g, y, r, 0.0f);
    return regc_graph_masked_fill(g, regc_graph_mul(g, y, x), cm, 7.0f);
}

static int b_slice(regc_graph *g)
{
    /* windows of each axis, overlapping, read back together */
    int x = regc_test_vjp_param(g, "x", 3, (int64_t[]){2, 5, 6});
    int a = regc_graph_slice(g, x, 0, 1, 1);                               /* [1, 5, 6] */
    int b = regc_graph_slice(g, regc_graph_slice(g, x, 1, 1, 3), 0, 0, 1); /* [1, 3, 6] */
    int c = regc_graph_slice(g, a, 2, 2, 3);                               /* [1, 5, 3] */
    int ab = regc_graph_matmul(g, regc_graph_reshape(g, b, 2, (int64_t[]){3, 6}),
                               regc_graph_reshape(g, a, 2, (int64_t[]){5, 6}), 0, 1); /* [3, 5] */
    int cc = regc_graph_reshape(g, regc_graph_mul(g, c, c), 2, (int64_t[]){5, 3});
    return regc_graph_matmul(g, ab, cc, 0, 0); /* [3, 3] */
}

REGC_TEST_VJP_CASE(sub)
REGC_TEST_VJP_CASE(sub_broadcast)
REGC_TEST_VJP_CASE(sub_broadcast_batch1)
REGC_TEST_VJP_CASE(div)
REGC_TEST_VJP_CASE(div_broadcast)
REGC_TEST_VJP_CASE(neg_exp)
REGC_TEST_VJP_CASE(tanh)
REGC_TEST_VJP_CASE(rsqrt)
REGC_TEST_VJP_CASE(pow)
REGC_TEST_VJP_CASE(gelu_decomposed)
REGC_TEST_VJP_CASE(softmax)
REGC_TEST_VJP_CASE(log_softmax)
REGC_TEST_VJP_CASE(sum_mean_last)
REGC_TEST_VJP_CASE(row_broadcast)
REGC_TEST_VJP_CASE(rmsnorm_decomposed)
REGC_TEST_VJP_CASE(attention_decomposed)
REGC_TEST_VJP_CASE(masked_fill)
REGC_TEST_VJP_CASE(concat_unequal)
REGC_TEST_VJP_CASE(chain_shared_broadcast)
REGC_TEST_VJP_CASE(chain_through_reshape)
REGC_TEST_VJP_CASE(slice)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sub),
        cmocka_unit_test(test_sub_broadcast),
        cmocka_unit_test(test_sub_broadcast_batch1),
        cmocka_unit_test(test_div),
        cmocka_unit_test(test_div_broadcast),
        cmocka_unit_test(test_neg_exp),
        cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_rsqrt),
        cmocka_unit_test(test_pow),
        cmocka_unit_test(test_gelu_decomposed),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_sum_mean_last),
        cmocka_unit_test(test_row_broadcast),
        cmocka_unit_test(test_rmsnorm_decomposed),
        cmocka_unit_test(test_attention_decomposed),
        cmocka_unit_test(test_masked_fill),
        cmocka_unit_test(test_concat_unequal),
        cmocka_unit_test(test_chain_shared_broadcast),
        cmocka_unit_test(test_chain_through_reshape),
        cmocka_unit_test(test_slice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
