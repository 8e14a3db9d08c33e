/* test_cuda_bodies.c — the CUDA backend's per-thread bodies
 * (kernels/cuda/cuda_elementwise.h) run on the host over their kernels'
 * whole grids, against the CPU backend's kernels, bit for bit.
 *
 * A GPU kernel of cuda_elementwise.cu is a loop over its grid that calls
 * one of these bodies; running the same body here over every index proves,
 * without a GPU, that it picks the right elements and the CPU's formula.
 * Inputs are regc's random stream plus edge values (zeros of both signs,
 * subnormals, huge values, infinities, NaN, and the arguments where
 * regc_expf clamps), every pair of edge values meeting in the two-operand
 * kernels. Each comparison is shown able to fail: a re-derived formula
 * (libm's tanh, exp or erfc, an fma, another summation order, another
 * index) is run over the same inputs and must differ somewhere. (The
 * checks a launcher runs before a launch are the CPU's own functions,
 * kernel_checks.h.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_elementwise.h"
#include "regc_backend.h"
#include "regc_common.h"
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

static const float edges[] = {
    0.0f,   -0.0f,  1e-45f, -1e-45f, 1e-40f,  FLT_MIN,  -FLT_MIN, 1e-20f,    1.0f,
    -1.0f,  0.5f,   -0.5f,  3.0f,    -3.0f,   9.0f,     -9.0f,    9.5f,      -9.5f,
    13.5f,  -13.5f, 43.5f,  -43.5f,  86.5f,   -86.5f,   87.0f,    -87.0f,    87.5f,
    -87.5f, 88.0f,  -88.0f, 88.5f,   -88.5f,  100.0f,   -100.0f,  1e10f,     -1e10f,
    1e20f,  -1e20f, 1e30f,  -1e30f,  FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN,
};
#define N_EDGES (sizeof edges / sizeof edges[0])
#define N_PAIRS (N_EDGES * N_EDGES)
#define N_ELEMS (N_PAIRS + 4001) /* every edge pair, then random values */

/* n values: for i < N_PAIRS, edge i % E (phase 0) or i / E (phase 1), so
 * that operands of phases 0 and 1 meet in every pair of edges; then
 * regc's stream on +-16, its first 2000 values scaled to +-2 */
static float *test_inputs(size_t n, uint64_t seed, int phase)
{
    float *h = regc_test_host_uniform(n, seed, 0.0f, 16.0f);
    for (size_t i = 0; i < n; i++) {
        if (i < N_PAIRS)
            h[i] = edges[phase ? i / N_EDGES : i % N_EDGES];
        else if (i < N_PAIRS + 2000)
            h[i] *= 0.125f;
    }
    return h;
}

/* n values of the stream with edge values spread through them */
static float *spread_edges(size_t n, uint64_t seed, float center, float halfwidth)
{
    float *h = regc_test_host_uniform(n, seed, center, halfwidth);
    for (size_t i = 0; i < n; i += 7)
        h[i] = edges[(i / 7) % N_EDGES];
    return h;
}

static float *cpu_download(const float *dev, size_t n) { return regc_test_download(cpu, dev, n); }

/* ---- comparisons ------------------------------------------------------------------ */

/* The body's output against the CPU's, every bit. */
/* Every bit, except a NaN's sign and payload. When two NaNs meet in one
 * operation, x86 returns the first operand's, and the compiler may swap
 * the operands of a commutative operation: the CPU's vectorised kernels
 * and a scalar loop over the same formula then disagree on the sign of
 * such a NaN (an input NaN meeting one that inf - inf made), and builds
 * for other vector widths differ among themselves. IEEE 754 leaves that
 * choice open, and a GPU writes its one canonical NaN anyway; that the
 * result is NaN is still checked. */
static int same_value(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

static void expect_bits(const char *what, const float *body, const float *cpu_out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!same_value(body[i], cpu_out[i]))
            fail_msg("%s: differs at [%zu]: body %.9g (0x%08x), cpu %.9g (0x%08x)", what, i,
                     body[i], regc_float_to_bits(body[i]), cpu_out[i],
                     regc_float_to_bits(cpu_out[i]));
}

/* A variant that a wrong body might compute must differ from the CPU's
 * output somewhere on these inputs, or the comparison could not fail. */
static void expect_caught(const char *what, const float *variant, const float *cpu_out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!same_value(variant[i], cpu_out[i]))
            return;
    fail_msg("%s: the inputs cannot tell it from the CPU's kernel", what);
}

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
    expect_bits(name, got, want, n);
    for (size_t i = 0; i < n; i++)
        var[i] = variant(hx[i]);
    expect_caught(name, var, want, n);
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
    expect_bits(name, got, want, n);
    for (size_t i = 0; i < n; i++)
        var[i] = variant(ha[i], hb[i]);
    expect_caught(name, var, want, n);
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
        expect_bits(what, got, want, n);
        for (size_t i = 0; i < n; i++) /* the value taken as 1 */
            var[i] = hx[i];
        expect_caught(what, var, want, n);
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
    expect_bits("dropout", got, want, n);
    expect_caught("dropout", var, want, n);
}

static void test_bias_add_body(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 1}, {3, 37}, {97, 45}, {45, 97}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)(rows * cols);
        float *hx = spread_edges(n, 40 + s, 0.0f, 4.0f);
        float *hb = spread_edges((size_t)cols, 50 + s, 0.0f, 1.0f);
        float *out = regc_test_dev_nan(cpu, n);
        cpu->bias_add(cpu, out, regc_test_upload(cpu, hx, n),
                      regc_test_upload(cpu, hb, (size_t)cols), rows, cols);
        const float *want = cpu_download(out, n);
        float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
        for (int64_t i = 0; i < rows * cols; i++)
            cuda_body_bias_add(i, got, hx, hb, cols);
        char what[64];
        snprintf(what, sizeof what, "bias_add [%lld x %lld]", (long long)rows, (long long)cols);
        expect_bits(what, got, want, n);
        if (n > 1) { /* the bias indexed by row instead of column */
            for (int64_t i = 0; i < rows * cols; i++)
                var[i] = regc_addf(hx[i], hb[(i / cols) % cols]);
            expect_caught(what, var, want, n);
        }
    }
}

/* ---- rotary embedding ------------------------------------------------------------------- */

static void check_rope(int64_t batch, int64_t t, int n_head, int head_dim, int inverse,
                       int in_place)
{
    const int half = head_dim / 2;
    const size_t n = (size_t)(batch * t * n_head * head_dim), nt = (size_t)(t * half);
    float *hx = spread_edges(n, 60 + (uint64_t)head_dim, 0.0f, 3.0f);
    float *hc = spread_edges(nt, 61, 0.0f, 1.0f), *hs = spread_edges(nt, 62, 0.0f, 1.0f);
    float *x = regc_test_upload(cpu, hx, n);
    float *y = in_place ? x : regc_test_dev_nan(cpu, n);
    const float *cs = regc_test_upload(cpu, hc, nt), *sn = regc_test_upload(cpu, hs, nt);
    cpu->rope(cpu, y, x, cs, sn, batch, t, n_head, head_dim, inverse, 0);
    const float *want = cpu_download(y, n);
    const float sign = inverse ? -1.0f : 1.0f;
    float *got = regc_test_host_floats(n);
    if (in_place)
        memcpy(got, hx, n * sizeof(float));
    const int64_t pairs = batch * t * n_head * half;
    for (int64_t i = 0; i < pairs; i++)
        cuda_body_rope(i, got, in_place ? got : hx, hc, hs, t, n_head, head_dim, sign, 0);
    char what[128];
    snprintf(what, sizeof what, "rope%s%s batch=%lld t=%lld n_head=%d head_dim=%d",
             inverse ? " inverse" : "", in_place ? " in place" : "", (long long)batch, (long long)t,
             n_head, head_dim);
    expect_bits(what, got, want, n);
    if (!in_place) { /* y held in bf16: the fp32 values rounded, by the CPU and the body */
        float *y16 = regc_test_dev_nan(cpu, (n + 1) / 2);
        cpu->rope(cpu, y16, x, cs, sn, batch, t, n_head, head_dim, inverse, 1);
        const uint16_t *cpu16 = (const uint16_t *)cpu_download(y16, (n + 1) / 2);
        uint16_t *body16 = (uint16_t *)regc_test_host_floats((n + 1) / 2);
        for (int64_t i = 0; i < batch * t * n_head * half; i++)
            cuda_body_rope(i, (float *)body16, hx, hc, hs, t, n_head, head_dim, sign, 1);
        for (size_t i = 0; i < n; i++)
            if (cpu16[i] != regc_bf16_bits(want[i]) || body16[i] != cpu16[i])
                fail_msg("%s, y in bf16: [%zu] is 0x%04x on the CPU, 0x%04x in the body; %.9g "
                         "rounds to 0x%04x",
                         what, i, cpu16[i], body16[i], (double)want[i], regc_bf16_bits(want[i]));
    }

    /* an fma in the rotation, and the other direction, are both caught */
    float *var = regc_test_host_floats(n), *other = regc_test_host_floats(n);
    const int64_t ld = (int64_t)n_head * head_dim;
    for (int64_t r = 0; r < batch * t; r++)
        for (int h = 0; h < n_head; h++)
            for (int j = 0; j < half; j++) {
                const int64_t a = r * ld + (int64_t)h * head_dim + j, b = a + half;
                const float c = hc[(r % t) * half + j], s = sign * hs[(r % t) * half + j];
                var[a] = fmaf(hx[a], c, -(hx[b] * s));
                var[b] = fmaf(hx[b], c, hx[a] * s);
            }
    for (int64_t i = 0; i < pairs; i++)
        cuda_body_rope(i, other, hx, hc, hs, t, n_head, head_dim, -sign, 0);
    expect_caught(what, var, want, n);
    expect_caught(what, other, want, n);
}

static void test_rope_body(void **state)
{
    (void)state;
    for (int inverse = 0; inverse < 2; inverse++)
        for (int in_place = 0; in_place < 2; in_place++) {
            check_rope(2, 5, 3, 8, inverse, in_place);
            check_rope(3, 7, 4, 64, inverse, in_place);
            check_rope(1, 33, 2, 6, inverse, in_place);
        }
}

/* ---- embedding lookup and its gradient --------------------------------------------------- */

static void test_embedding_fwd_body(void **state)
{
    (void)state;
    const int64_t vocab = 53, cols = 70, rows = 301;
    float *htable = spread_edges((size_t)(vocab * cols), 70, 0.0f, 1.0f);
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    assert_non_null(ids);
    for (int64_t r = 0; r < rows; r++) /* skewed: many repeats, the ends of the table */
        ids[r] = r % 5 == 0 ? 3 : r % 11 == 0 ? (int32_t)(vocab - 1) : (int32_t)((r * 7) % vocab);
    const size_t n = (size_t)(rows * cols);
    float *out = regc_test_dev_nan(cpu, n);
    cpu->embedding_fwd(cpu, out, regc_test_upload_ints(cpu, ids, (size_t)rows),
                       regc_test_upload(cpu, htable, (size_t)(vocab * cols)), rows, cols, 0);
    const float *want = cpu_download(out, n);
    float *got = regc_test_host_floats(n), *var = regc_test_host_floats(n);
    for (int64_t i = 0; i < rows * cols; i++)
        cuda_body_embedding_fwd(i, got, ids, htable, cols, 0);
    expect_bits("embedding_fwd", got, want, n);
    for (int64_t i = 0; i < rows * cols; i++) /* the row indexed by position, not id */
        var[i] = htable[((i / cols) % vocab) * cols + i % cols];
    expect_caught("embedding_fwd", var, want, n);

    /* the table held in bf16: the body widens each value as the CPU does */
    const size_t tn = (size_t)(vocab * cols);
    uint16_t *h16 = calloc(tn + 2, sizeof *h16);
    assert_non_null(h16);
    for (size_t j = 0; j < tn; j++)
        h16[j] = regc_bf16_bits(htable[j]);
    float *out16 = regc_test_dev_nan(cpu, n);
    cpu->embedding_fwd(cpu, out16, regc_test_upload_ints(cpu, ids, (size_t)rows),
                       regc_test_upload(cpu, (const float *)h16, (tn + 1) / 2), rows, cols, 1);
    const float *want16 = cpu_download(out16, n);
    for (int64_t i = 0; i < rows * cols; i++)
        cuda_body_embedding_fwd(i, got, ids, (const float *)h16, cols, 1);
    expect_bits("embedding_fwd, table in bf16", got, want16, n);
    for (int64_t i = 0; i < rows * cols; i++) /* the fp32 values, not the bf16 ones */
        cuda_body_embedding_fwd(i, var, ids, htable, cols, 0);
    expect_caught("embedding_fwd, table in bf16", var, want16, n);
    free(h16);
    free(ids);
}

static int compare_keys(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The GPU's pipeline on the host: keys, the sort (here a full-key qsort:
 * the keys are distinct, so it gives the order the GPU's stable sort on
 * the id half gives), the zeroing of a fresh table, then the body over its
 * grid of rows x cols threads. Returns the sorted keys. */
static uint64_t *host_embedding_bwd(float *dtable, const int32_t *ids, const float *dout,
                                    int64_t rows, int64_t cols, int64_t vocab, int accumulate,
                                    int64_t pad)
{
    uint64_t *key = malloc((size_t)rows * sizeof *key);
    assert_non_null(key);
    for (int64_t r = 0; r < rows; r++)
        cuda_body_embedding_key(r, key, ids);
    qsort(key, (size_t)rows, sizeof *key, compare_keys);
    if (!cuda_embedding_keys_ok(key, rows, vocab))
        return key;
    if (!accumulate)
        for (int64_t i = 0; i < vocab * cols; i++)
            dtable[i] = 0.0f;
    for (int64_t i = 0; i < rows * cols; i++)
        cuda_body_embedding_bwd(i, dtable, key, dout, rows, cols, pad);
    return key;
}

static void test_embedding_bwd_body(void **state)
{
    (void)state;
    const int64_t vocab = 50, cols = 70, rows = 300;
    const size_t nt = (size_t)(vocab * cols), nd = (size_t)(rows * cols);
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    assert_non_null(ids);
    for (int64_t r = 0; r < rows; r++) /* id 3 on a fifth of the rows; ids >= 40 unused */
        ids[r] = r % 5 == 0 ? 3 : (int32_t)((r * 13) % 40);
    /* mixed magnitudes, so a sum in another order rounds differently */
    float *hdout = spread_edges(nd, 80, 0.0f, 1.0f);
    for (size_t i = 0; i < nd; i++) {
        if (i % 3 == 0)
            hdout[i] *= 4096.0f;
        if (!isfinite(hdout[i])) /* infinities and NaN would swamp every sum they meet */
            hdout[i] = 0.5f;
    }
    float *hinit = spread_edges(nt, 81, 0.0f, 1.0f);
    for (size_t i = 0; i < nt; i += 5) /* kept as they are where no id lands */
        hinit[i] = -0.0f;
    int32_t *dids = regc_test_upload_ints(cpu, ids, (size_t)rows);
    const float *dout = regc_test_upload(cpu, hdout, nd);
    for (int pass = 0; pass < 4; pass++) {
        const int accumulate = pass & 1;
        const int64_t pad = pass & 2 ? 3 : -1; /* the busiest id as the padding row */
        float *dtable = regc_test_upload(cpu, hinit, nt);
        cpu->embedding_bwd(cpu, dtable, dids, dout, rows, cols, vocab, accumulate, pad);
        const float *want = cpu_download(dtable, nt);
        float *got = regc_test_host_floats(nt);
        memcpy(got, hinit, nt * sizeof(float));
        uint64_t *key = host_embedding_bwd(got, ids, hdout, rows, cols, vocab, accumulate, pad);
        const char *what = pass == 0   ? "embedding_bwd"
                           : pass == 1 ? "embedding_bwd accumulate"
                           : pass == 2 ? "embedding_bwd padded"
                                       : "embedding_bwd padded accumulate";
        expect_bits(what, got, want, nt);
        if (pad >= 0) { /* the padding row took nothing: zeros, or as it was */
            for (int64_t c = 0; c < cols; c++)
                if (memcmp(&want[pad * cols + c], accumulate ? &hinit[pad * cols + c] : &(float){0},
                           sizeof(float)) != 0)
                    fail_msg("%s: the padding row changed at column %lld", what, (long long)c);
            free(key);
            continue;
        }

        /* each id's rows summed in reverse order instead */
        float *var = regc_test_host_floats(nt);
        memcpy(var, accumulate ? hinit : got, nt * sizeof(float));
        for (int64_t g = 0; g < rows;) {
            int64_t end = g;
            while (end < rows && key[end] >> 32 == key[g] >> 32)
                end++;
            const int64_t id = (int64_t)(key[g] >> 32);
            for (int64_t c = 0; c < cols; c++) {
                float acc = 0.0f;
                for (int64_t k = end - 1; k >= g; k--)
                    acc = regc_addf(acc, hdout[(int64_t)(key[k] & UINT32_MAX) * cols + c]);
                var[id * cols + c] = accumulate ? regc_addf(hinit[id * cols + c], acc) : acc;
            }
            g = end;
        }
        expect_caught(what, var, want, nt);
        free(key);
    }
    free(ids);
}

/* A bad id is what the sorted keys' last key shows, whether too large or
 * negative; the GPU then writes nothing, and the CPU refuses the call. */
static void test_embedding_bad_ids(void **state)
{
    (void)state;
    const int64_t vocab = 10, cols = 3, rows = 6;
    const int32_t bad_sets[][6] = {{1, 2, 10, 3, 4, 5}, {1, -1, 2, 3, 4, 5}, {9, 0, 0, 9, 0, 9}};
    const int bad[] = {1, 1, 0};
    float *hdout = spread_edges((size_t)(rows * cols), 90, 0.0f, 1.0f);
    float *hinit = spread_edges((size_t)(vocab * cols), 91, 0.0f, 1.0f);
    for (size_t s = 0; s < sizeof bad / sizeof bad[0]; s++) {
        float *got = regc_test_host_floats((size_t)(vocab * cols));
        memcpy(got, hinit, (size_t)(vocab * cols) * sizeof(float));
        uint64_t *key = host_embedding_bwd(got, bad_sets[s], hdout, rows, cols, vocab, 0, -1);
        assert_int_equal(cuda_embedding_keys_ok(key, rows, vocab), !bad[s]);
        free(key);
        float *dtable = regc_test_upload(cpu, hinit, (size_t)(vocab * cols));
        cpu->embedding_bwd(cpu, dtable, regc_test_upload_ints(cpu, bad_sets[s], (size_t)rows),
                           regc_test_upload(cpu, hdout, (size_t)(rows * cols)), rows, cols, vocab,
                           0, -1);
        assert_int_equal(cpu->sync(cpu), bad[s] ? REGC_ERR_ARG : REGC_OK);
        if (bad[s]) { /* both leave the table as it was */
            expect_bits("embedding_bwd bad id, host", got, hinit, (size_t)(vocab * cols));
            expect_bits("embedding_bwd bad id, cpu", cpu_download(dtable, (size_t)(vocab * cols)),
                        hinit, (size_t)(vocab * cols));
        }
    }
}

/* ---- column sums ---------------------------------------------------------------------------- */

static void test_sum_rows_body(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 1}, {0, 4}, {3, 37}, {1000, 37}, {257, 600}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)(rows * cols);
        /* values of 2^-20 to 1 between a first row near 2^40 and a last
         * row that cancels it: every small value is rounded to the big
         * one's last bits, so the sum depends on the order even in double */
        float *hx = regc_test_host_uniform(n ? n : 1, 100 + s, 0.0f, 1.0f);
        for (size_t i = 0; i < n; i++)
            hx[i] = ldexpf(hx[i], (int)(regc_rng_at(101 + s, i) % 21) - 20);
        for (int64_t c = 0; rows >= 2 && c < cols; c++) {
            hx[c] = ldexpf(1.5f + hx[c], 40);
            hx[(rows - 1) * cols + c] = -hx[c];
        }
        float *out = regc_test_dev_nan(cpu, (size_t)cols);
        cpu->sum_rows(cpu, out, regc_test_upload(cpu, hx, n ? n : 1), rows, cols);
        const float *want = cpu_download(out, (size_t)cols);
        float *got = regc_test_host_floats((size_t)cols);
        for (int64_t c = 0; c < cols; c++)
            cuda_body_sum_rows(c, got, hx, rows, cols);
        char what[64];
        snprintf(what, sizeof what, "sum_rows [%lld x %lld]", (long long)rows, (long long)cols);
        expect_bits(what, got, want, (size_t)cols);
        if (rows < 100)
            continue;
        /* in float, or in double from the last row up: both caught */
        float *in_float = regc_test_host_floats((size_t)cols);
        float *reversed = regc_test_host_floats((size_t)cols);
        for (int64_t c = 0; c < cols; c++) {
            float f = 0.0f;
            double d = 0.0;
            for (int64_t r = 0; r < rows; r++)
                f += hx[r * cols + c];
            for (int64_t r = rows - 1; r >= 0; r--)
                d += hx[r * cols + c];
            in_float[c] = f;
            reversed[c] = (float)d;
        }
        expect_caught(what, in_float, want, (size_t)cols);
        expect_caught(what, reversed, want, (size_t)cols);
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
        expect_bits(label, got[k], want, (size_t)n);
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
    float *in[2] = {test_inputs((size_t)n, 200, 0), spread_edges((size_t)period, 201, 0.0f, 1.0f)};
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
    float *in[2] = {test_inputs((size_t)n, 240, 0), spread_edges((size_t)period, 241, 0.5f, 2.0f)};
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
    float *in[2] = {spread_edges((size_t)n, 210, 0.0f, 4.0f),
                    spread_edges((size_t)cols, 211, 0.0f, 1.0f)};
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
                    spread_edges((size_t)n, 222, 0.0f, 2.0f)};
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
    float *hx = spread_edges((size_t)n, 230, 0.0f, 4.0f);
    float *hb = spread_edges((size_t)cols, 231, 0.0f, 1.0f);
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
    expect_bits("chain in place", got, want, (size_t)n);
    expect_bits("chain in place, pass-through", got_copy, want_copy, (size_t)n);
    expect_bits("chain in place, pass-through is the input", got_copy, hx, (size_t)n);
    expect_caught("chain in place", got, hx, (size_t)n);
}

/* Outputs held in bf16 (each bit of out_bf16): the body stores the CPU
 * kernel's bytes, the fp32 output beside them its bits. */
static void test_chain_bf16_outputs(void **state)
{
    (void)state;
    const int64_t rows = 13, cols = 77, n = rows * cols;
    regc_ew_program p = bias_then(cols, REGC_EW_GELU, 3, 2);
    float *hx = spread_edges((size_t)n, 240, 0.0f, 4.0f);
    float *hb = spread_edges((size_t)cols, 241, 0.0f, 1.0f);
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
    expect_bits("chain output in fp32 beside a bf16 one", got32, want32, (size_t)n);
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
        const float *h = spread_edges(len[i], 250 + (uint64_t)i, 0.0f, 4.0f);
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
        expect_bits("chain over bf16 inputs", got[0], want[0], (size_t)n);
        expect_bits("chain over bf16 inputs, second output", got[1], want[1], (size_t)n);
    }
    free(h16[0]), free(h16[1]);
}

/* ---- transpose --------------------------------------------------------------------------- */

static void check_transpose(int ndim, const int64_t *shape, const int *perm)
{
    int64_t total = 1;
    for (int i = 0; i < ndim; i++)
        total *= shape[i];
    const size_t n = (size_t)total;
    float *hx = spread_edges(n, 300 + (uint64_t)ndim, 0.0f, 1.0f);
    float *out = regc_test_dev_nan(cpu, n);
    cpu->transpose(cpu, out, regc_test_upload(cpu, hx, n), ndim, shape, perm);
    const float *want = cpu_download(out, n);
    cuda_transpose_map map;
    assert_int_equal(regc_transpose_check(ndim, shape, perm), REGC_OK);
    cuda_transpose_map_init(&map, ndim, shape, perm);
    assert_int_equal(map.total, total);
    float *got = regc_test_host_floats(n);
    for (int64_t o = 0; o < map.total; o++)
        cuda_body_transpose(o, got, hx, &map);
    char what[128];
    int len = snprintf(what, sizeof what, "transpose perm");
    for (int i = 0; i < ndim; i++)
        len += snprintf(what + len, sizeof what - (size_t)len, " %d", perm[i]);
    expect_bits(what, got, want, n);

    /* the map of the reversed permutation, unless it is the same copy */
    int rev[CUDA_TRANSPOSE_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        rev[i] = perm[ndim - 1 - i];
    cuda_transpose_map other;
    cuda_transpose_map_init(&other, ndim, shape, rev);
    float *var = regc_test_host_floats(n);
    for (int64_t o = 0; o < other.total; o++)
        cuda_body_transpose(o, var, hx, &other);
    if (memcmp(&other, &map, sizeof map) != 0 && n > 1)
        expect_caught(what, var, want, n);
}

static void test_transpose_body(void **state)
{
    (void)state;
    const int64_t s2[] = {5, 7}, s3[] = {4, 1, 6}, s4[] = {2, 3, 4, 5}, s6[] = {2, 3, 1, 4, 2, 3};
    const int64_t s1[] = {9}, s5[] = {3, 2, 5, 1, 4};
    const int p2[] = {1, 0}, p3[] = {2, 0, 1}, p3b[] = {0, 2, 1}, p4[] = {0, 2, 1, 3};
    const int p4b[] = {3, 1, 0, 2}, p4c[] = {0, 1, 2, 3}, p4d[] = {0, 1, 3, 2};
    const int p6[] = {5, 3, 1, 0, 4, 2}, p6b[] = {0, 1, 2, 3, 5, 4}, p1[] = {0};
    const int p5[] = {4, 2, 3, 0, 1};
    check_transpose(2, s2, p2);
    check_transpose(3, s3, p3);
    check_transpose(3, s3, p3b);
    check_transpose(4, s4, p4); /* a head split: [b, t, h, d] -> [b, h, t, d] */
    check_transpose(4, s4, p4b);
    check_transpose(4, s4, p4c); /* the identity */
    check_transpose(4, s4, p4d);
    check_transpose(6, s6, p6);
    check_transpose(6, s6, p6b);
    check_transpose(1, s1, p1);
    check_transpose(5, s5, p5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_unary_bodies),
        regc_test_with_buffers(test_binary_bodies),
        regc_test_with_buffers(test_scale_body),
        regc_test_with_buffers(test_dropout_body),
        regc_test_with_buffers(test_bias_add_body),
        regc_test_with_buffers(test_rope_body),
        regc_test_with_buffers(test_embedding_fwd_body),
        regc_test_with_buffers(test_embedding_bwd_body),
        regc_test_with_buffers(test_embedding_bad_ids),
        regc_test_with_buffers(test_sum_rows_body),
        regc_test_with_buffers(test_chain_every_op),
        regc_test_with_buffers(test_chain_each_op),
        regc_test_with_buffers(test_chain_bias_gelu),
        regc_test_with_buffers(test_chain_swiglu_backward),
        regc_test_with_buffers(test_chain_in_place),
        regc_test_with_buffers(test_chain_bf16_outputs),
        regc_test_with_buffers(test_chain_bf16_inputs),
        regc_test_with_buffers(test_transpose_body),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
