/* test_cuda_bodies.c — the per-thread bodies of the CUDA backend's
 * elementwise kernels (kernels/cuda/cuda_elementwise.h) run on the host
 * over their kernels' whole grids, against the CPU backend's kernels, bit
 * for bit: the activations and their gradients, add, mul, scale, dropout,
 * the bias add, and the fused elementwise chain (every op, each op alone,
 * the chains the models make, in place, outputs and inputs held in bf16).
 *
 * A GPU kernel of cuda_elementwise.cu is a loop over its grid that calls
 * one of these bodies; running the same body here over every index proves,
 * without a GPU, that it picks the right elements and the CPU's formula.
 * Inputs are regc's random stream plus edge values (zeros of both signs,
 * subnormals, huge values, infinities, NaN, and the arguments where
 * regc_expf clamps), every pair of edge values meeting in the two-operand
 * kernels. Each comparison is shown able to fail: a re-derived formula
 * (libm's tanh, exp or erfc, another op, another index, another
 * micro-batch's draw) is run over the same inputs and must differ
 * somewhere. (The checks a launcher runs before a launch are the CPU's own
 * functions, kernel_checks.h.) The bodies that find their elements by index
 * arithmetic are test_cuda_bodies_indexed.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_elementwise.h"
#include "regc_backend.h"
#include "regc_common.h"
#include "test_cuda_body.h"
#include "test_device.h"

static regc_backend *cpu;

static int group_setup(void **state)
{
    (void)state;
    cpu = regc_test_cpu_backend(2); /* two threads: the CPU's parallel split too */
    return cpu ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(cpu);
    return 0;
}

/* ---- inputs ----------------------------------------------------------------- */

#define N_PAIRS (REGC_TEST_N_EDGES * REGC_TEST_N_EDGES)
#define N_ELEMS (N_PAIRS + 4001) /* every edge pair, then random values */

/* n values: for i < N_PAIRS, edge i % E (phase 0) or i / E (phase 1), so
 * that operands of phases 0 and 1 meet in every pair of edges; then
 * regc's stream on +-16, its first 2000 values scaled to +-2 */
static float *test_inputs(size_t n, uint64_t seed, int phase)
{
    float *h = regc_test_host_uniform(n, seed, 0.0f, 16.0f);
    for (size_t i = 0; i < n; i++) {
        if (i < N_PAIRS)
            h[i] = regc_test_edges[phase ? i / REGC_TEST_N_EDGES : i % REGC_TEST_N_EDGES];
        else if (i < N_PAIRS + 2000)
            h[i] *= 0.125f;
    }
    return h;
}

static float *cpu_download(const float *dev, size_t n) { return regc_test_download(cpu, dev, n); }

/* ---- variants: formulas a body must not use (re-derived, libm, fma) ----------- */

static float gelu_libm_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(REGC_GELU_BETA * (x + REGC_GELU_KAPPA * x * x * x)));
}

static float gelu_erf_libm(float x) { return 0.5f * x * erfcf(-x * REGC_INV_SQRT2); }

static float silu_libm(float x) { return x / (1.0f + expf(-x)); }

static float relu_keeps_neg_zero(float x) { return x >= 0.0f ? x : 0.0f; }

static float gelu_dx_libm_tanh(float dy, float x)
{
    const float u = REGC_GELU_BETA * (x + REGC_GELU_KAPPA * x * x * x);
    const float t = tanhf(u);
    const float du = REGC_GELU_BETA * (1.0f + 3.0f * REGC_GELU_KAPPA * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

static float gelu_erf_dx_libm(float dy, float x)
{
    return dy * (0.5f * erfcf(-x * REGC_INV_SQRT2) + x * REGC_INV_SQRT2PI * expf(-0.5f * x * x));
}

static float silu_dx_libm(float dy, float x)
{
    const float s = 1.0f / (1.0f + expf(-x));
    return dy * (s * (1.0f + x * (1.0f - s)));
}

static float relu_dx_at_zero(float dy, float x) { return x >= 0.0f ? dy : 0.0f; }

static float add_instead(float a, float b) { return a + b; }

static float mul_instead(float a, float b) { return a * b; }

/* ---- one-operand activations -------------------------------------------------------- */

typedef void (*cpu_unary_fn)(regc_backend *, float *, const float *, int64_t);
typedef void (*body_unary_fn)(int64_t, float *, const float *);

static void check_unary(const char *name, cpu_unary_fn kernel, body_unary_fn body,
                        float (*variant)(float))
{
    const size_t n = N_ELEMS;
    float *hx = test_inputs(n, 11, 0);
    float *y = regc_test_dev_nan(cpu, n);
    kernel(cpu, y, regc_test_upload(cpu, hx, n), (int64_t)n);
    const float *want = cpu_download(y, n);
    float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
    for (int64_t i = 0; i < (int64_t)n; i++) /* the kernel's whole grid */
        body(i, got, hx);
    regc_test_expect_bits(name, got, want, n);
    for (size_t i = 0; i < n; i++)
        var[i] = variant(hx[i]);
    regc_test_expect_caught(name, var, want, n);
}

static void test_unary_bodies(void **state)
{
    (void)state;
    check_unary("gelu_fwd", cpu->gelu_fwd, cuda_body_gelu_fwd, gelu_libm_tanh);
    check_unary("gelu_erf_fwd", cpu->gelu_erf_fwd, cuda_body_gelu_erf_fwd, gelu_erf_libm);
    check_unary("silu_fwd", cpu->silu_fwd, cuda_body_silu_fwd, silu_libm);
    check_unary("relu_fwd", cpu->relu_fwd, cuda_body_relu_fwd, relu_keeps_neg_zero);
}

/* ---- two-operand kernels -------------------------------------------------------------- */

typedef void (*cpu_binary_fn)(regc_backend *, float *, const float *, const float *, int64_t);
typedef void (*body_binary_fn)(int64_t, float *, const float *, const float *);

static void check_binary(const char *name, cpu_binary_fn kernel, body_binary_fn body,
                         float (*variant)(float, float))
{
    const size_t n = N_ELEMS;
    float *ha = test_inputs(n, 21, 0), *hb = test_inputs(n, 22, 1);
    float *out = regc_test_dev_nan(cpu, n);
    kernel(cpu, out, regc_test_upload(cpu, ha, n), regc_test_upload(cpu, hb, n), (int64_t)n);
    const float *want = cpu_download(out, n);
    float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
    for (int64_t i = 0; i < (int64_t)n; i++)
        body(i, got, ha, hb);
    regc_test_expect_bits(name, got, want, n);
    for (size_t i = 0; i < n; i++)
        var[i] = variant(ha[i], hb[i]);
    regc_test_expect_caught(name, var, want, n);
}

static void test_binary_bodies(void **state)
{
    (void)state;
    check_binary("add", cpu->add, cuda_body_add, mul_instead);
    check_binary("mul", cpu->mul, cuda_body_mul, add_instead);
    check_binary("gelu_bwd", cpu->gelu_bwd, cuda_body_gelu_bwd, gelu_dx_libm_tanh);
    check_binary("gelu_erf_bwd", cpu->gelu_erf_bwd, cuda_body_gelu_erf_bwd, gelu_erf_dx_libm);
    check_binary("silu_bwd", cpu->silu_bwd, cuda_body_silu_bwd, silu_dx_libm);
    check_binary("relu_bwd", cpu->relu_bwd, cuda_body_relu_bwd, relu_dx_at_zero);
}

static void test_scale_body(void **state)
{
    (void)state;
    const float values[] = {0.3720703125f, -1.75f, 0.0f, -0.0f, 1e-40f, 3e38f, INFINITY, NAN};
    const size_t n = N_ELEMS;
    float *hx = test_inputs(n, 31, 0);
    float *x = regc_test_upload(cpu, hx, n);
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        float *y = regc_test_dev_nan(cpu, n);
        cpu->scale(cpu, y, x, values[v], (int64_t)n);
        const float *want = cpu_download(y, n);
        float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
        for (int64_t i = 0; i < (int64_t)n; i++)
            cuda_body_scale(i, got, hx, values[v]);
        char what[64];
        snprintf(what, sizeof what, "scale by %g", (double)values[v]);
        regc_test_expect_bits(what, got, want, n);
        for (size_t i = 0; i < n; i++) /* the value taken as 1 */
            var[i] = hx[i];
        regc_test_expect_caught(what, var, want, n);
    }
}

/* Dropout: the body over every group of four, for a length that is no
 * multiple of four, against the CPU kernel; a body that drew from another
 * micro-batch would differ. */
static void test_dropout_body(void **state)
{
    (void)state;
    const size_t n = N_ELEMS - 1;
    const float p = 0.25f, scale = 1.0f / (1.0f - p);
    const int32_t site = 3, draw[4] = {42, 7, 11, 1}, other[4] = {42, 7, 12, 1};
    float *hx = test_inputs(n, 33, 0);
    float *x = regc_test_upload(cpu, hx, n);
    float *y = regc_test_dev_nan(cpu, n);
    cpu->dropout(cpu, y, x, &site, draw, p, (int64_t)n);
    const float *want = cpu_download(y, n);
    float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
    for (int64_t q = 0; q < ((int64_t)n + 3) / 4; q++) {
        cuda_body_dropout(q, got, hx, &site, draw, p, scale, (int64_t)n);
        cuda_body_dropout(q, var, hx, &site, other, p, scale, (int64_t)n);
    }
    regc_test_expect_bits("dropout", got, want, n);
    regc_test_expect_caught("dropout", var, want, n);
}

static void test_bias_add_body(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 1}, {3, 37}, {97, 45}, {45, 97}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)(rows * cols);
        float *hx = regc_test_spread_edges(n, 40 + s, 0.0f, 4.0f);
        float *hb = regc_test_spread_edges((size_t)cols, 50 + s, 0.0f, 1.0f);
        float *out = regc_test_dev_nan(cpu, n);
        cpu->bias_add(cpu, out, regc_test_upload(cpu, hx, n),
                      regc_test_upload(cpu, hb, (size_t)cols), rows, cols);
        const float *want = cpu_download(out, n);
        float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
        for (int64_t i = 0; i < rows * cols; i++)
            cuda_body_bias_add(i, got, hx, hb, cols);
        char what[64];
        snprintf(what, sizeof what, "bias_add [%lld x %lld]", (long long)rows, (long long)cols);
        regc_test_expect_bits(what, got, want, n);
        if (n > 1) { /* the bias indexed by row instead of column */
            for (int64_t i = 0; i < rows * cols; i++)
                var[i] = regc_addf(hx[i], hb[(i / cols) % cols]);
            regc_test_expect_caught(what, var, want, n);
        }
    }
}

/* ---- the fused elementwise chain ---------------------------------------------------------- */

static regc_ew_step step(regc_ew_op op, int a, int b, float value)
{
    return (regc_ew_step){(uint8_t)op, (uint8_t)a, (uint8_t)b, value};
}

/* the chain through the CPU backend and through the body over e < n;
 * host_in are the inputs on the host (broadcast ones of their period) */
static void check_chain(const char *what, const regc_ew_program *p, int64_t n,
                        float *const *host_in, const regc_ew_program *variant)
{
    const float *dev_in[REGC_EW_MAX_INPUTS];
    float *dev_out[REGC_EW_MAX_OUTPUTS], *got[REGC_EW_MAX_OUTPUTS], *var[REGC_EW_MAX_OUTPUTS];
    for (int i = 0; i < p->n_inputs; i++) {
        const size_t len = (size_t)(p->period[i] > 0 ? p->period[i] : n);
        dev_in[i] = regc_test_upload(cpu, host_in[i], len);
    }
    for (int k = 0; k < p->n_outputs; k++) {
        dev_out[k] = regc_test_dev_nan(cpu, (size_t)n);
        got[k] = regc_test_host_floats((size_t)n);
        var[k] = regc_test_host_floats((size_t)n);
    }
    cpu->elementwise(cpu, p, n, dev_out, dev_in, 0, 0u);
    const float *const *in = (const float *const *)host_in;
    assert_int_equal(regc_ew_check(p, n, got, in, 0, 0), REGC_OK);
    for (int64_t e = 0; e < n; e++)
        cuda_body_elementwise(e, p, got, in, 0, 0u);
    for (int64_t e = 0; e < n; e++)
        cuda_body_elementwise(e, variant, var, in, 0, 0u);
    int caught = 0;
    for (int k = 0; k < p->n_outputs; k++) {
        const float *want = cpu_download(dev_out[k], (size_t)n);
        char label[160];
        snprintf(label, sizeof label, "%s, output %d", what, k);
        regc_test_expect_bits(label, got[k], want, (size_t)n);
        caught |= memcmp(var[k], want, (size_t)n * sizeof(float)) != 0;
    }
    if (!caught)
        fail_msg("%s: a chain with another op gives the same outputs", what);
}

/* Every op once, chained, the second input broadcast with a period that
 * divides nothing evenly, four outputs (one the broadcast input itself). */
static void test_chain_every_op(void **state)
{
    (void)state;
    const int64_t n = N_ELEMS, period = 29;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 11, .n_outputs = 4};
    p.period[1] = period;
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);          /* r2 = x + v */
    p.steps[1] = step(REGC_EW_RELU, 2, 0, 0.0f);         /* r3 = relu(r2) */
    p.steps[2] = step(REGC_EW_GELU_ERF, 2, 0, 0.0f);     /* r4 = gelu_erf(r2) */
    p.steps[3] = step(REGC_EW_GELU_ERF_BWD, 3, 2, 0.0f); /* r5 = r3 gelu_erf'(r2) */
    p.steps[4] = step(REGC_EW_GELU, 4, 0, 0.0f);         /* r6 = gelu(r4) */
    p.steps[5] = step(REGC_EW_SILU, 5, 0, 0.0f);         /* r7 = silu(r5) */
    p.steps[6] = step(REGC_EW_MUL, 6, 7, 0.0f);          /* r8 = r6 r7 */
    p.steps[7] = step(REGC_EW_SCALE, 8, 0, -1.75f);      /* r9 = -1.75 r8 */
    p.steps[8] = step(REGC_EW_SILU_BWD, 9, 0, 0.0f);     /* r10 = r9 silu'(x) */
    p.steps[9] = step(REGC_EW_GELU_BWD, 10, 2, 0.0f);    /* r11 = r10 gelu'(r2) */
    p.steps[10] = step(REGC_EW_RELU_BWD, 11, 0, 0.0f);   /* r12 = r11 where x > 0 */
    p.out_reg[0] = 12;
    p.out_reg[1] = 5;
    p.out_reg[2] = 9;
    p.out_reg[3] = 1;
    float *in[2] = {test_inputs((size_t)n, 200, 0),
                    regc_test_spread_edges((size_t)period, 201, 0.0f, 1.0f)};
    regc_ew_program variant = p;
    variant.steps[4].op = REGC_EW_GELU_ERF;
    check_chain("every op", &p, n, in, &variant);
}

/* Each op of the table alone, a step of one chain per op: the ops an
 * exported graph brings (sub, div, exp, tanh, pow, ...) run only as chains,
 * so this is their single kernel. The second operand is broadcast. */
static void test_chain_each_op(void **state)
{
    (void)state;
    const int64_t n = N_ELEMS, period = 31;
    float *in[2] = {test_inputs((size_t)n, 240, 0),
                    regc_test_spread_edges((size_t)period, 241, 0.5f, 2.0f)};
    for (int op = 0; op < REGC_EW_COUNT; op++) {
        regc_ew_program p = {.n_inputs = 2, .n_steps = 1, .n_outputs = 1};
        p.period[1] = period;
        p.steps[0] = step((regc_ew_op)op, 0, 1, op == REGC_EW_POW ? 2.5f : 1.5f);
        p.out_reg[0] = 2;
        regc_ew_program variant = p;
        variant.steps[0].op = (uint8_t)((op + 1) % REGC_EW_COUNT);
        check_chain(regc_ew_op_name(op), &p, n, in, &variant);
    }
}

/* GPT-2's MLP: pre = x + bias (period cols), h = gelu(pre), both written */
static void test_chain_bias_gelu(void **state)
{
    (void)state;
    const int64_t rows = 37, cols = 300, n = rows * cols;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 2};
    p.period[1] = cols;
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);
    p.steps[1] = step(REGC_EW_GELU, 2, 0, 0.0f);
    p.out_reg[0] = 2;
    p.out_reg[1] = 3;
    float *in[2] = {regc_test_spread_edges((size_t)n, 210, 0.0f, 4.0f),
                    regc_test_spread_edges((size_t)cols, 211, 0.0f, 1.0f)};
    regc_ew_program variant = p;
    variant.steps[0].op = REGC_EW_MUL;
    check_chain("bias_add+gelu", &p, n, in, &variant);
}

/* SwiGLU's backward over three inputs: dup = dh silu(gate),
 * dgate = silu'(gate) (dh up) */
static void test_chain_swiglu_backward(void **state)
{
    (void)state;
    const int64_t n = N_ELEMS;
    regc_ew_program p = {.n_inputs = 3, .n_steps = 4, .n_outputs = 2};
    p.steps[0] = step(REGC_EW_SILU, 1, 0, 0.0f);
    p.steps[1] = step(REGC_EW_MUL, 0, 3, 0.0f);
    p.steps[2] = step(REGC_EW_MUL, 0, 2, 0.0f);
    p.steps[3] = step(REGC_EW_SILU_BWD, 5, 1, 0.0f);
    p.out_reg[0] = 4;
    p.out_reg[1] = 6;
    float *in[3] = {test_inputs((size_t)n, 220, 0), test_inputs((size_t)n, 221, 1),
                    regc_test_spread_edges((size_t)n, 222, 0.0f, 2.0f)};
    regc_ew_program variant = p;
    variant.steps[3] = step(REGC_EW_SILU_BWD, 5, 2, 0.0f); /* silu' of up, not gate */
    check_chain("swiglu backward", &p, n, in, &variant);
}

/* x + b (b a row of cols, broadcast), then `act` of the sum: registers 2
 * and 3; the two outputs are registers out0 and out1 */
static regc_ew_program bias_then(int64_t cols, regc_ew_op act, int out0, int out1)
{
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 2};
    p.period[1] = cols;
    p.steps[0] = step(REGC_EW_ADD, 0, 1, 0.0f);
    p.steps[1] = step(act, 2, 0, 0.0f);
    p.out_reg[0] = (uint8_t)out0;
    p.out_reg[1] = (uint8_t)out1;
    return p;
}

/* In place on the host as on the GPU: output 0 overwrites input 0 while
 * output 1 passes input 0 through and must see the values from before. */
static void test_chain_in_place(void **state)
{
    (void)state;
    const int64_t rows = 13, cols = 77, n = rows * cols;
    regc_ew_program p = bias_then(cols, REGC_EW_GELU_ERF, 3, 0);
    float *hx = regc_test_spread_edges((size_t)n, 230, 0.0f, 4.0f);
    float *hb = regc_test_spread_edges((size_t)cols, 231, 0.0f, 1.0f);
    float *x = regc_test_upload(cpu, hx, (size_t)n), *copy = regc_test_dev_nan(cpu, (size_t)n);
    float *outs[2] = {x, copy};
    const float *ins[2] = {x, regc_test_upload(cpu, hb, (size_t)cols)};
    cpu->elementwise(cpu, &p, n, outs, ins, 0, 0u);
    const float *want = cpu_download(x, (size_t)n), *want_copy = cpu_download(copy, (size_t)n);
    float *got = regc_test_host_floats((size_t)n), *got_copy = regc_test_host_floats((size_t)n);
    memcpy(got, hx, (size_t)n * sizeof(float));
    float *host_outs[2] = {got, got_copy};
    const float *host_ins[2] = {got, hb};
    for (int64_t e = 0; e < n; e++)
        cuda_body_elementwise(e, &p, host_outs, host_ins, 0, 0u);
    regc_test_expect_bits("chain in place", got, want, (size_t)n);
    regc_test_expect_bits("chain in place, pass-through", got_copy, want_copy, (size_t)n);
    regc_test_expect_bits("chain in place, pass-through is the input", got_copy, hx, (size_t)n);
    regc_test_expect_caught("chain in place", got, hx, (size_t)n);
}

/* Outputs held in bf16 (each bit of out_bf16): the body stores the CPU
 * kernel's bytes, the fp32 output beside them its bits. */
static void test_chain_bf16_outputs(void **state)
{
    (void)state;
    const int64_t rows = 13, cols = 77, n = rows * cols;
    regc_ew_program p = bias_then(cols, REGC_EW_GELU, 3, 2);
    float *hx = regc_test_spread_edges((size_t)n, 240, 0.0f, 4.0f);
    float *hb = regc_test_spread_edges((size_t)cols, 241, 0.0f, 1.0f);
    const float *ins[2] = {regc_test_upload(cpu, hx, (size_t)n),
                           regc_test_upload(cpu, hb, (size_t)cols)};
    float *outs[2] = {regc_test_dev_nan(cpu, (size_t)n), regc_test_dev_nan(cpu, (size_t)n)};
    cpu->elementwise(cpu, &p, n, outs, ins, 1u, 0u); /* output 0 in bf16 */
    const uint16_t *want16 = (const uint16_t *)cpu_download(outs[0], (size_t)(n + 1) / 2);
    const float *want32 = cpu_download(outs[1], (size_t)n);
    uint16_t *got16 = calloc((size_t)n + 2, sizeof *got16);
    float *got32 = regc_test_host_floats((size_t)n);
    assert_non_null(got16);
    float *host_outs[2] = {(float *)got16, got32};
    const float *host_ins[2] = {hx, hb};
    for (int64_t e = 0; e < n; e++)
        cuda_body_elementwise(e, &p, host_outs, host_ins, 1u, 0u);
    if (memcmp(got16, want16, (size_t)n * sizeof *got16))
        fail_msg("chain output in bf16: the body's bytes differ from the CPU's");
    regc_test_expect_bits("chain output in fp32 beside a bf16 one", got32, want32, (size_t)n);
    free(got16);
}

/* Inputs held in bf16 (the full one, the bias, both): the body reads them
 * as the CPU kernel does, to the bit. */
static void test_chain_bf16_inputs(void **state)
{
    (void)state;
    const int64_t rows = 13, cols = 77, n = rows * cols;
    regc_ew_program p = bias_then(cols, REGC_EW_GELU, 3, 2);
    const size_t len[2] = {(size_t)n, (size_t)cols};
    uint16_t *h16[2];
    const float *dev16[2];
    for (int i = 0; i < 2; i++) {
        const float *h = regc_test_spread_edges(len[i], 250 + (uint64_t)i, 0.0f, 4.0f);
        assert_non_null(h16[i] = calloc(len[i] + 2, sizeof *h16[i]));
        for (size_t j = 0; j < len[i]; j++)
            h16[i][j] = regc_bf16_bits(h[j]);
        dev16[i] = regc_test_upload(cpu, (const float *)h16[i], (len[i] + 1) / 2);
    }
    for (unsigned mask = 1; mask < 4; mask++) {
        const float *ins[2] = {dev16[0], dev16[1]},
                    *host_ins[2] = {(const float *)h16[0], (const float *)h16[1]};
        float *wide[2];
        for (int i = 0; i < 2; i++) /* an fp32 input holds the bf16 values */
            if (!(mask >> i & 1u)) {
                wide[i] = regc_test_host_floats(len[i]);
                for (size_t j = 0; j < len[i]; j++)
                    wide[i][j] = regc_bf16_value(h16[i][j]);
                ins[i] = regc_test_upload(cpu, wide[i], len[i]), host_ins[i] = wide[i];
            }
        float *outs[2] = {regc_test_dev_nan(cpu, (size_t)n), regc_test_dev_nan(cpu, (size_t)n)};
        cpu->elementwise(cpu, &p, n, outs, ins, 0u, mask);
        const float *want[2] = {cpu_download(outs[0], (size_t)n), cpu_download(outs[1], (size_t)n)};
        float *got[2] = {regc_test_host_floats((size_t)n), regc_test_host_floats((size_t)n)};
        for (int64_t e = 0; e < n; e++)
            cuda_body_elementwise(e, &p, got, host_ins, 0u, mask);
        regc_test_expect_bits("chain over bf16 inputs", got[0], want[0], (size_t)n);
        regc_test_expect_bits("chain over bf16 inputs, second output", got[1], want[1], (size_t)n);
    }
    free(h16[0]), free(h16[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_unary_bodies),
        regc_test_with_buffers(test_binary_bodies),
        regc_test_with_buffers(test_scale_body),
        regc_test_with_buffers(test_dropout_body),
        regc_test_with_buffers(test_bias_add_body),
        regc_test_with_buffers(test_chain_every_op),
        regc_test_with_buffers(test_chain_each_op),
        regc_test_with_buffers(test_chain_bias_gelu),
        regc_test_with_buffers(test_chain_swiglu_backward),
        regc_test_with_buffers(test_chain_in_place),
        regc_test_with_buffers(test_chain_bf16_outputs),
        regc_test_with_buffers(test_chain_bf16_inputs),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
