/* test_kernels_cpu_fused.c — the CPU backend's fused kernels against the
 * unfused kernels they replace, bit for bit: elementwise chains (bias add +
 * GELU with a broadcast bias, SwiGLU forward and backward, GELU backward +
 * scale, ReLU backward, every op in one chain, in place), the residual add
 * fused with LayerNorm / RMSNorm forward, the norm backward fused with
 * the gradient add, and the GEMM epilogues (bias, bias + GELU, GELU
 * backward + bias gradient). The compiler relies on this equality so that fused and
 * unfused programs, regional and full compilation, give the same bits.
 * Every comparison runs with one thread and with two, at sizes that are not
 * multiples of the block and at sizes above REGC_CPU_PAR_MIN. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "test_device.h"

static regc_backend *bes[2]; /* one thread, two threads */

static int group_setup(void **state)
{
    (void)state;
    bes[0] = regc_test_cpu_backend(1);
    bes[1] = regc_test_cpu_backend(2);
    return bes[0] && bes[1] ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(bes[1]);
    regc_backend_free(bes[0]);
    return 0;
}

/* (rows, cols) pairs: tiny, not a multiple of any block, and past the
 * threshold where loops go parallel (32768 elements) */
typedef struct {
    int64_t rows, cols;
} shape2;
static const shape2 shapes[] = {{1, 1}, {3, 37}, {7, 300}, {97, 513}, {64, 768}};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static size_t count(shape2 s) { return (size_t)(s.rows * s.cols); }

static float *dev_uniform(regc_backend *be, size_t n, uint64_t seed, float center, float hw)
{
    return regc_test_upload(be, regc_test_host_uniform(n, seed, center, hw), n);
}

static void expect_same(regc_backend *be, const char *what, shape2 s, const float *fused,
                        const float *unfused, size_t n)
{
    char label[160];
    snprintf(label, sizeof label, "%s [%lld x %lld]", what, (long long)s.rows, (long long)s.cols);
    regc_test_assert_bitwise_equal(label, regc_test_download(be, fused, n),
                                   regc_test_download(be, unfused, n), n);
}

static regc_ew_step step(regc_ew_op op, int a, int b, float value)
{
    return (regc_ew_step){(uint8_t)op, (uint8_t)a, (uint8_t)b, value};
}

/* ---- elementwise chains ---------------------------------------------------- */

/* GPT-2's MLP after the up projection: pre = x + bias (bias broadcast over
 * rows, period cols), h = gelu(pre); both written, pre kept for backward */
static void test_bias_add_gelu_chain(void **state)
{
    (void)state;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 2};
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);  /* r2 = x + bias */
    p.steps[1] = step(REGC_EW_GELU, 2, 0, 0.0f); /* r3 = gelu(r2) */
    p.out_reg[0] = 2;
    p.out_reg[1] = 3;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const size_t n = count(s);
            p.period[0] = 0;
            p.period[1] = s.cols;
            float *x = dev_uniform(be, n, 100 + i, 0.0f, 4.0f);
            float *bias = dev_uniform(be, (size_t)s.cols, 200 + i, 0.0f, 1.0f);
            float *pre = regc_test_dev_nan(be, n), *h = regc_test_dev_nan(be, n);
            float *pre_ref = regc_test_dev_nan(be, n), *h_ref = regc_test_dev_nan(be, n);
            be->bias_add(be, pre_ref, x, bias, s.rows, s.cols);
            be->gelu_fwd(be, h_ref, pre_ref, (int64_t)n);
            float *outs[2] = {pre, h};
            const float *ins[2] = {x, bias};
            be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
            expect_same(be, "bias_add+gelu pre", s, pre, pre_ref, n);
            expect_same(be, "bias_add+gelu h", s, h, h_ref, n);
        }
}

/* Llama's MLP: a = silu(gate), h = a * up (a is written too, as the
 * backward reads it) */
static void test_swiglu_chain_two_outputs(void **state)
{
    (void)state;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 2};
    p.steps[0] = step(REGC_EW_SILU, 0, 0, 0.0f); /* r2 = silu(gate) */
    p.steps[1] = step(REGC_EW_MUL, 2, 1, 0.0f);  /* r3 = r2 * up */
    p.out_reg[0] = 3;
    p.out_reg[1] = 2;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const size_t n = count(s);
            float *gate = dev_uniform(be, n, 300 + i, 0.0f, 6.0f);
            float *up = dev_uniform(be, n, 400 + i, 0.0f, 2.0f);
            float *h = regc_test_dev_nan(be, n), *a = regc_test_dev_nan(be, n);
            float *h_ref = regc_test_dev_nan(be, n), *a_ref = regc_test_dev_nan(be, n);
            be->silu_fwd(be, a_ref, gate, (int64_t)n);
            be->mul(be, h_ref, a_ref, up, (int64_t)n);
            float *outs[2] = {h, a};
            const float *ins[2] = {gate, up};
            be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
            expect_same(be, "swiglu h", s, h, h_ref, n);
            expect_same(be, "swiglu silu", s, a, a_ref, n);
        }
}

/* SwiGLU's backward: dup = dh * silu(gate), dgate = silu_bwd(dh * up, gate) */
static void test_swiglu_backward_chain(void **state)
{
    (void)state;
    regc_ew_program p = {.n_inputs = 3, .n_steps = 4, .n_outputs = 2};
    p.steps[0] = step(REGC_EW_SILU, 1, 0, 0.0f);     /* r3 = silu(gate) */
    p.steps[1] = step(REGC_EW_MUL, 0, 3, 0.0f);      /* r4 = dh * r3 */
    p.steps[2] = step(REGC_EW_MUL, 0, 2, 0.0f);      /* r5 = dh * up */
    p.steps[3] = step(REGC_EW_SILU_BWD, 5, 1, 0.0f); /* r6 = silu'(gate) r5 */
    p.out_reg[0] = 4;
    p.out_reg[1] = 6;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const size_t n = count(s);
            float *dh = dev_uniform(be, n, 500 + i, 0.0f, 1.0f);
            float *gate = dev_uniform(be, n, 510 + i, 0.0f, 6.0f);
            float *up = dev_uniform(be, n, 520 + i, 0.0f, 2.0f);
            float *a = regc_test_dev_nan(be, n), *da = regc_test_dev_nan(be, n);
            float *dup_ref = regc_test_dev_nan(be, n), *dgate_ref = regc_test_dev_nan(be, n);
            be->silu_fwd(be, a, gate, (int64_t)n);
            be->mul(be, dup_ref, dh, a, (int64_t)n);
            be->mul(be, da, dh, up, (int64_t)n);
            be->silu_bwd(be, dgate_ref, da, gate, (int64_t)n);
            float *dup = regc_test_dev_nan(be, n), *dgate = regc_test_dev_nan(be, n);
            float *outs[2] = {dup, dgate};
            const float *ins[3] = {dh, gate, up};
            be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
            expect_same(be, "swiglu bwd dup", s, dup, dup_ref, n);
            expect_same(be, "swiglu bwd dgate", s, dgate, dgate_ref, n);
        }
}

/* GELU backward followed by a scale (a tied-head rescaling's backward) */
static void test_gelu_bwd_then_scale(void **state)
{
    (void)state;
    const float value = 0.3720703125f;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 1};
    p.steps[0] = step(REGC_EW_GELU_BWD, 0, 1, 0.0f); /* r2 = dy * gelu'(x) */
    p.steps[1] = step(REGC_EW_SCALE, 2, 0, value);   /* r3 = value * r2 */
    p.out_reg[0] = 3;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const size_t n = count(s);
            float *dy = dev_uniform(be, n, 600 + i, 0.0f, 1.0f);
            float *x = dev_uniform(be, n, 610 + i, 0.0f, 5.0f);
            float *tmp = regc_test_dev_nan(be, n), *ref = regc_test_dev_nan(be, n);
            be->gelu_bwd(be, tmp, dy, x, (int64_t)n);
            be->scale(be, ref, tmp, value, (int64_t)n);
            float *dx = regc_test_dev_nan(be, n);
            float *outs[1] = {dx};
            const float *ins[2] = {dy, x};
            be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
            expect_same(be, "gelu_bwd+scale", s, dx, ref, n);
        }
}

/* ReLU backward, with exact zeros in x (the subgradient there is 0) */
static void test_relu_bwd_chain(void **state)
{
    (void)state;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 1, .n_outputs = 1};
    p.steps[0] = step(REGC_EW_RELU_BWD, 0, 1, 0.0f);
    p.out_reg[0] = 2;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const size_t n = count(s);
            float *hx = regc_test_host_uniform(n, 700 + i, 0.0f, 1.0f);
            for (size_t j = 0; j < n; j += 5)
                hx[j] = (j % 10 == 0) ? 0.0f : -0.0f;
            float *x = regc_test_upload(be, hx, n);
            float *dy = dev_uniform(be, n, 710 + i, 0.0f, 1.0f);
            float *ref = regc_test_dev_nan(be, n), *dx = regc_test_dev_nan(be, n);
            be->relu_bwd(be, ref, dy, x, (int64_t)n);
            float *outs[1] = {dx};
            const float *ins[2] = {dy, x};
            be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
            expect_same(be, "relu_bwd", s, dx, ref, n);
        }
}

/* Every op once, chained, against the single kernels one by one; the
 * second input is broadcast with a period that divides nothing evenly. */
static void test_every_op_in_one_chain(void **state)
{
    (void)state;
    const int64_t period = 29;
    const float value = -1.75f;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 11, .n_outputs = 4};
    p.period[1] = period;
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);          /* r2 = x + v */
    p.steps[1] = step(REGC_EW_RELU, 2, 0, 0.0f);         /* r3 = relu(r2) */
    p.steps[2] = step(REGC_EW_GELU_ERF, 2, 0, 0.0f);     /* r4 = gelu_erf(r2) */
    p.steps[3] = step(REGC_EW_GELU_ERF_BWD, 3, 2, 0.0f); /* r5 = r3 gelu_erf'(r2) */
    p.steps[4] = step(REGC_EW_GELU, 4, 0, 0.0f);         /* r6 = gelu(r4) */
    p.steps[5] = step(REGC_EW_SILU, 5, 0, 0.0f);         /* r7 = silu(r5) */
    p.steps[6] = step(REGC_EW_MUL, 6, 7, 0.0f);          /* r8 = r6 r7 */
    p.steps[7] = step(REGC_EW_SCALE, 8, 0, value);       /* r9 = value r8 */
    p.steps[8] = step(REGC_EW_SILU_BWD, 9, 0, 0.0f);     /* r10 = r9 silu'(x) */
    p.steps[9] = step(REGC_EW_GELU_BWD, 10, 2, 0.0f);    /* r11 = r10 gelu'(r2) */
    p.steps[10] = step(REGC_EW_RELU_BWD, 11, 0, 0.0f);   /* r12 = r11 where x > 0 */
    p.out_reg[0] = 12;
    p.out_reg[1] = 5;
    p.out_reg[2] = 9;
    p.out_reg[3] = 1; /* the broadcast input passed through, expanded */
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const int64_t n = s.rows * s.cols;
            const size_t un = (size_t)n;
            float *x = dev_uniform(be, un, 800 + i, 0.0f, 3.0f);
            float *hv = regc_test_host_uniform((size_t)period, 810 + i, 0.0f, 1.0f);
            float *v = regc_test_upload(be, hv, (size_t)period);
            /* the broadcast input spelled out, for the single add kernel */
            float *hvx = regc_test_host_floats(un);
            for (int64_t e = 0; e < n; e++)
                hvx[e] = hv[e % period];
            float *vx = regc_test_upload(be, hvx, un);
            float *r[13];
            r[0] = x;
            r[1] = vx;
            for (int k = 2; k < 13; k++)
                r[k] = regc_test_dev_nan(be, un);
            be->add(be, r[2], x, vx, n);
            be->relu_fwd(be, r[3], r[2], n);
            be->gelu_erf_fwd(be, r[4], r[2], n);
            be->gelu_erf_bwd(be, r[5], r[3], r[2], n);
            be->gelu_fwd(be, r[6], r[4], n);
            be->silu_fwd(be, r[7], r[5], n);
            be->mul(be, r[8], r[6], r[7], n);
            be->scale(be, r[9], r[8], value, n);
            be->silu_bwd(be, r[10], r[9], x, n);
            be->gelu_bwd(be, r[11], r[10], r[2], n);
            be->relu_bwd(be, r[12], r[11], x, n);
            float *outs[4];
            for (int k = 0; k < 4; k++)
                outs[k] = regc_test_dev_nan(be, un);
            const float *ins[2] = {x, v};
            be->elementwise(be, &p, n, outs, ins, 0, 0u);
            for (int k = 0; k < 4; k++) {
                char what[32];
                snprintf(what, sizeof what, "every op, output %d", k);
                expect_same(be, what, s, outs[k], r[p.out_reg[k]], un);
            }
        }
}

/* out[0] overwrites input 0 (in place), while out[1] passes input 0
 * through: it must receive the values from before the overwrite */
static void test_in_place(void **state)
{
    (void)state;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 2};
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);
    p.steps[1] = step(REGC_EW_GELU, 2, 0, 0.0f);
    p.out_reg[0] = 3;
    p.out_reg[1] = 0;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[i];
            const size_t n = count(s);
            p.period[1] = s.cols;
            float *hx = regc_test_host_uniform(n, 900 + i, 0.0f, 4.0f);
            float *x = regc_test_upload(be, hx, n), *x_orig = regc_test_upload(be, hx, n);
            float *bias = dev_uniform(be, (size_t)s.cols, 910 + i, 0.0f, 1.0f);
            float *ref = regc_test_dev_nan(be, n);
            be->bias_add(be, ref, x, bias, s.rows, s.cols);
            be->gelu_fwd(be, ref, ref, (int64_t)n); /* the single kernels in place too */
            float *copy = regc_test_dev_nan(be, n);
            float *outs[2] = {x, copy};
            const float *ins[2] = {x, bias};
            be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
            expect_same(be, "in place result", s, x, ref, n);
            expect_same(be, "in place pass-through", s, copy, x_orig, n);
        }
}

/* the same chain on one thread and on two gives the same bits */
static void test_chain_independent_of_threads(void **state)
{
    (void)state;
    const int64_t n = 100003; /* prime: the last block is partial */
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 1};
    p.period[1] = 768;
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);
    p.steps[1] = step(REGC_EW_GELU_ERF, 2, 0, 0.0f);
    p.out_reg[0] = 3;
    float *res[2];
    for (int t = 0; t < 2; t++) {
        regc_backend *be = bes[t];
        float *x = dev_uniform(be, (size_t)n, 1000, 0.0f, 4.0f);
        float *bias = dev_uniform(be, 768, 1001, 0.0f, 1.0f);
        float *y = regc_test_dev_nan(be, (size_t)n);
        float *outs[1] = {y};
        const float *ins[2] = {x, bias};
        be->elementwise(be, &p, n, outs, ins, 0, 0u);
        res[t] = regc_test_download(be, y, (size_t)n);
    }
    regc_test_assert_bitwise_equal("bias_add+gelu_erf, 1 vs 2 threads", res[0], res[1], (size_t)n);
}

/* ---- invalid programs -------------------------------------------------------- */

/* Run p over 16 elements of two inputs: sync() must fail with `status`,
 * the message must contain `needle`, and the output must stay unwritten. */
static void expect_refused(const regc_ew_program *p, int status, const char *needle)
{
    regc_backend *be = bes[1];
    assert_int_equal(be->sync(be), REGC_OK);
    float *x = dev_uniform(be, 16, 1100, 0.0f, 1.0f), *y = regc_test_dev_nan(be, 16);
    float *outs[REGC_EW_MAX_OUTPUTS] = {y, y, y, y};
    const float *ins[REGC_EW_MAX_INPUTS] = {x, x, x, x, x, x, x, x};
    regc_error_clear();
    be->elementwise(be, p, 16, outs, ins, 0, 0u);
    assert_int_equal(be->sync(be), status);
    if (!strstr(regc_error_message(), needle))
        fail_msg("message \"%s\" does not mention \"%s\"", regc_error_message(), needle);
    assert_int_equal(be->sync(be), REGC_OK); /* reported once */
    float *h = regc_test_download(be, y, 16);
    for (int i = 0; i < 16; i++)
        assert_true(isnan(h[i]));
}

static void test_invalid_programs_are_refused(void **state)
{
    (void)state;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 1};
    p.steps[0] = step(REGC_EW_ADD, 0, 3, 0.0f); /* reads r3, written by step 1 */
    p.steps[1] = step(REGC_EW_GELU, 2, 0, 0.0f);
    p.out_reg[0] = 3;
    expect_refused(&p, REGC_ERR_ARG, "step 0 (add) reads register 3 before it is written");

    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);
    p.steps[1] = step(REGC_EW_GELU, 3, 0, 0.0f); /* its own register */
    expect_refused(&p, REGC_ERR_ARG, "step 1 (gelu) reads register 3 before it is written");

    p.steps[1] = step(REGC_EW_GELU, 2, 0, 0.0f);
    p.out_reg[0] = 4; /* past the last register written */
    expect_refused(&p, REGC_ERR_ARG, "output 0 is register 4");

    p.out_reg[0] = 3;
    p.n_steps = REGC_EW_MAX_STEPS + 1;
    expect_refused(&p, REGC_ERR_ARG, "17 steps");

    p.n_steps = 2;
    p.n_inputs = REGC_EW_MAX_INPUTS + 1;
    expect_refused(&p, REGC_ERR_ARG, "9 inputs");

    p.n_inputs = 2;
    p.n_outputs = REGC_EW_MAX_OUTPUTS + 1;
    expect_refused(&p, REGC_ERR_ARG, "5 outputs");

    p.n_outputs = 1;
    p.steps[1].op = 200;
    expect_refused(&p, REGC_ERR_ARG, "step 1 has unknown op 200");

    p.steps[1].op = REGC_EW_GELU;
    p.period[1] = -3;
    expect_refused(&p, REGC_ERR_ARG, "input 1 has negative period");
}

/* ---- residual add fused with the norms ---------------------------------------- */

static void test_add_layernorm_fwd(void **state)
{
    (void)state;
    const float eps = 1e-5f;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++)
            for (int in_place = 0; in_place < 2; in_place++) {
                regc_backend *be = bes[t];
                const shape2 s = shapes[i];
                const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
                float *ha = regc_test_host_uniform(n, 1200 + i, 0.3f, 2.0f);
                float *a = regc_test_upload(be, ha, n), *a_ref = regc_test_upload(be, ha, n);
                float *b = dev_uniform(be, n, 1210 + i, 0.0f, 1.0f);
                float *w = dev_uniform(be, nc, 1220 + i, 1.0f, 0.5f);
                float *bias = dev_uniform(be, nc, 1230 + i, 0.0f, 0.5f);
                float *sum_ref = regc_test_dev_nan(be, n), *y_ref = regc_test_dev_nan(be, n);
                float *mean_ref = regc_test_dev_nan(be, nr), *rstd_ref = regc_test_dev_nan(be, nr);
                be->add(be, sum_ref, a_ref, b, (int64_t)n);
                be->layernorm_fwd(be, y_ref, mean_ref, rstd_ref, sum_ref, w, bias, s.rows, s.cols,
                                  eps, 0);
                float *sum = in_place ? a : regc_test_dev_nan(be, n);
                float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, nr);
                float *rstd = regc_test_dev_nan(be, nr);
                be->add_layernorm_fwd(be, sum, y, mean, rstd, a, b, w, bias, s.rows, s.cols, eps,
                                      0);
                const char *tag = in_place ? "add_layernorm_fwd in place" : "add_layernorm_fwd";
                char what[80];
                snprintf(what, sizeof what, "%s sum", tag);
                expect_same(be, what, s, sum, sum_ref, n);
                snprintf(what, sizeof what, "%s y", tag);
                expect_same(be, what, s, y, y_ref, n);
                snprintf(what, sizeof what, "%s mean", tag);
                expect_same(be, what, s, mean, mean_ref, nr);
                snprintf(what, sizeof what, "%s rstd", tag);
                expect_same(be, what, s, rstd, rstd_ref, nr);
            }
}

static void test_add_rmsnorm_fwd(void **state)
{
    (void)state;
    const float eps = 1e-6f;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++)
            for (int in_place = 0; in_place < 2; in_place++) {
                regc_backend *be = bes[t];
                const shape2 s = shapes[i];
                const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
                float *ha = regc_test_host_uniform(n, 1300 + i, 0.3f, 2.0f);
                float *a = regc_test_upload(be, ha, n), *a_ref = regc_test_upload(be, ha, n);
                float *b = dev_uniform(be, n, 1310 + i, 0.0f, 1.0f);
                float *w = dev_uniform(be, nc, 1320 + i, 1.0f, 0.5f);
                float *sum_ref = regc_test_dev_nan(be, n), *y_ref = regc_test_dev_nan(be, n);
                float *rstd_ref = regc_test_dev_nan(be, nr);
                be->add(be, sum_ref, a_ref, b, (int64_t)n);
                be->rmsnorm_fwd(be, y_ref, rstd_ref, sum_ref, w, s.rows, s.cols, eps, 0);
                float *sum = in_place ? a : regc_test_dev_nan(be, n);
                float *y = regc_test_dev_nan(be, n), *rstd = regc_test_dev_nan(be, nr);
                be->add_rmsnorm_fwd(be, sum, y, rstd, a, b, w, s.rows, s.cols, eps, 0);
                const char *tag = in_place ? "add_rmsnorm_fwd in place" : "add_rmsnorm_fwd";
                char what[80];
                snprintf(what, sizeof what, "%s sum", tag);
                expect_same(be, what, s, sum, sum_ref, n);
                snprintf(what, sizeof what, "%s y", tag);
                expect_same(be, what, s, y, y_ref, n);
                snprintf(what, sizeof what, "%s rstd", tag);
                expect_same(be, what, s, rstd, rstd_ref, nr);
            }
}

/* dx = dres + layernorm_bwd's dx, against layernorm_bwd into a temporary
 * and then the add kernel; dw and db exactly as layernorm_bwd's */
static void test_layernorm_bwd_add(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++)
            for (int in_place = 0; in_place < 2; in_place++) {
                regc_backend *be = bes[t];
                const shape2 s = shapes[i];
                const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
                float *x = dev_uniform(be, n, 1400 + i, 0.3f, 2.0f);
                float *w = dev_uniform(be, nc, 1410 + i, 1.0f, 0.5f);
                float *bias = dev_uniform(be, nc, 1420 + i, 0.0f, 0.5f);
                float *dy = dev_uniform(be, n, 1430 + i, 0.0f, 1.0f);
                float *hdres = regc_test_host_uniform(n, 1440 + i, 0.0f, 1.0f);
                float *dres = regc_test_upload(be, hdres, n);
                float *dres_ref = regc_test_upload(be, hdres, n);
                float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, nr);
                float *rstd = regc_test_dev_nan(be, nr);
                be->layernorm_fwd(be, y, mean, rstd, x, w, bias, s.rows, s.cols, 1e-5f, 0);

                float *dxln = regc_test_dev_nan(be, n), *dx_ref = regc_test_dev_nan(be, n);
                float *dw_ref = regc_test_dev_nan(be, nc), *db_ref = regc_test_dev_nan(be, nc);
                be->layernorm_bwd(be, dxln, dw_ref, db_ref, dy, x, w, mean, rstd, s.rows, s.cols);
                be->add(be, dx_ref, dxln, dres_ref, (int64_t)n);

                float *dx = in_place ? dres : regc_test_dev_nan(be, n);
                float *dw = regc_test_dev_nan(be, nc), *db = regc_test_dev_nan(be, nc);
                be->layernorm_bwd_add(be, dx, dw, db, dres, dy, x, w, mean, rstd, s.rows, s.cols);
                const char *tag = in_place ? "layernorm_bwd_add in place" : "layernorm_bwd_add";
                char what[80];
                snprintf(what, sizeof what, "%s dx", tag);
                expect_same(be, what, s, dx, dx_ref, n);
                snprintf(what, sizeof what, "%s dw", tag);
                expect_same(be, what, s, dw, dw_ref, nc);
                snprintf(what, sizeof what, "%s db", tag);
                expect_same(be, what, s, db, db_ref, nc);
            }
}

static void test_rmsnorm_bwd_add(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < N_SHAPES; i++)
            for (int in_place = 0; in_place < 2; in_place++) {
                regc_backend *be = bes[t];
                const shape2 s = shapes[i];
                const size_t n = count(s), nc = (size_t)s.cols, nr = (size_t)s.rows;
                float *x = dev_uniform(be, n, 1500 + i, 0.3f, 2.0f);
                float *w = dev_uniform(be, nc, 1510 + i, 1.0f, 0.5f);
                float *dy = dev_uniform(be, n, 1520 + i, 0.0f, 1.0f);
                float *hdres = regc_test_host_uniform(n, 1530 + i, 0.0f, 1.0f);
                float *dres = regc_test_upload(be, hdres, n);
                float *dres_ref = regc_test_upload(be, hdres, n);
                float *y = regc_test_dev_nan(be, n), *rstd = regc_test_dev_nan(be, nr);
                be->rmsnorm_fwd(be, y, rstd, x, w, s.rows, s.cols, 1e-6f, 0);

                float *dxn = regc_test_dev_nan(be, n), *dx_ref = regc_test_dev_nan(be, n);
                float *dw_ref = regc_test_dev_nan(be, nc);
                be->rmsnorm_bwd(be, dxn, dw_ref, dy, x, w, rstd, s.rows, s.cols);
                /* the other operand order than in the LayerNorm test: float
                 * addition commutes, so both give these bits */
                be->add(be, dx_ref, dres_ref, dxn, (int64_t)n);

                float *dx = in_place ? dres : regc_test_dev_nan(be, n);
                float *dw = regc_test_dev_nan(be, nc);
                be->rmsnorm_bwd_add(be, dx, dw, dres, dy, x, w, rstd, s.rows, s.cols);
                const char *tag = in_place ? "rmsnorm_bwd_add in place" : "rmsnorm_bwd_add";
                char what[80];
                snprintf(what, sizeof what, "%s dx", tag);
                expect_same(be, what, s, dx, dx_ref, n);
                snprintf(what, sizeof what, "%s dw", tag);
                expect_same(be, what, s, dw, dw_ref, nc);
            }
}

/* ---- GEMM epilogues ---------------------------------------------------------- */

/* the epilogue of a GEMM against the plain GEMM followed by the kernels it
 * replaces: bias_add, gelu_fwd, gelu_bwd and sum_rows */
static void test_gemm_epilogues_equal_unfused(void **state)
{
    (void)state;
    const int64_t k = 33;
    for (int t = 0; t < 2; t++)
        for (size_t si = 0; si < N_SHAPES; si++) {
            regc_backend *be = bes[t];
            const shape2 s = shapes[si];
            const size_t n = count(s), nc = (size_t)s.cols;
            float *a = dev_uniform(be, (size_t)(s.rows * k), 1200, 0.0f, 1.0f); /* [rows, k] */
            float *b = dev_uniform(be, (size_t)(k * s.cols), 1201, 0.0f, 1.0f); /* [k, cols] */
            float *bias = dev_uniform(be, nc, 1202, 0.0f, 1.0f);                /* [cols] */
            float *pre = dev_uniform(be, n, 1203, 0.0f, 3.0f);                  /* [rows, cols] */
            float *g = regc_test_dev_nan(be, n), *ref = regc_test_dev_nan(be, n);
            float *c = regc_test_dev_nan(be, n), *aux = regc_test_dev_nan(be, n);
            float *bg = regc_test_dev_nan(be, nc), *bg_ref = regc_test_dev_nan(be, nc);
            regc_gemm plain = {.m = s.rows,
                               .n = s.cols,
                               .k = k,
                               .a = a,
                               .lda = k,
                               .b = b,
                               .ldb = s.cols,
                               .c = g,
                               .ldc = s.cols,
                               .alpha = 1.0f,
                               .epilogue = REGC_EPI_NONE};
            assert_int_equal(be->gemm(be, &plain), REGC_OK);

            regc_gemm fused = plain;
            fused.c = c, fused.bias = bias, fused.aux = aux, fused.ldaux = s.cols;
            fused.epilogue = REGC_EPI_BIAS;
            assert_int_equal(be->gemm(be, &fused), REGC_OK);
            be->bias_add(be, ref, g, bias, s.rows, s.cols);
            expect_same(be, "gemm BIAS", s, c, ref, n);

            fused.epilogue = REGC_EPI_BIAS_GELU_AUX;
            assert_int_equal(be->gemm(be, &fused), REGC_OK);
            expect_same(be, "gemm BIAS_GELU_AUX aux", s, aux, ref, n);
            be->gelu_fwd(be, ref, ref, (int64_t)n);
            expect_same(be, "gemm BIAS_GELU_AUX", s, c, ref, n);

            fused.aux = pre, fused.bias_grad = bg, fused.epilogue = REGC_EPI_DGELU_BGRAD;
            assert_int_equal(be->gemm(be, &fused), REGC_OK);
            be->gelu_bwd(be, ref, g, pre, (int64_t)n);
            be->sum_rows(be, bg_ref, ref, s.rows, s.cols);
            expect_same(be, "gemm DGELU_BGRAD", s, c, ref, n);
            expect_same(be, "gemm DGELU_BGRAD bias grad", s, bg, bg_ref, nc);
            assert_int_equal(be->sync(be), REGC_OK);
        }
}

static void test_fused_entries_are_set(void **state)
{
    (void)state;
    for (int t = 0; t < 2; t++) {
        assert_non_null(bes[t]->elementwise);
        assert_non_null(bes[t]->add_layernorm_fwd);
        assert_non_null(bes[t]->add_rmsnorm_fwd);
        assert_non_null(bes[t]->layernorm_bwd_add);
        assert_non_null(bes[t]->rmsnorm_bwd_add);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_entries_are_set),
        regc_test_with_buffers(test_bias_add_gelu_chain),
        regc_test_with_buffers(test_swiglu_chain_two_outputs),
        regc_test_with_buffers(test_swiglu_backward_chain),
        regc_test_with_buffers(test_gelu_bwd_then_scale),
        regc_test_with_buffers(test_relu_bwd_chain),
        regc_test_with_buffers(test_every_op_in_one_chain),
        regc_test_with_buffers(test_in_place),
        regc_test_with_buffers(test_chain_independent_of_threads),
        regc_test_with_buffers(test_invalid_programs_are_refused),
        regc_test_with_buffers(test_add_layernorm_fwd),
        regc_test_with_buffers(test_add_rmsnorm_fwd),
        regc_test_with_buffers(test_layernorm_bwd_add),
        regc_test_with_buffers(test_rmsnorm_bwd_add),
        regc_test_with_buffers(test_gemm_epilogues_equal_unfused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
