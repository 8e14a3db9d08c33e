/* test_kernels_cpu.c — a backend's kernels (the CPU's, or the one
 * $REGC_TEST_BACKEND names: ctest runs it on CUDA as gpu_kernel_reference)
 * against values recorded
 * from PyTorch (tests/data/kernel_reference.json, written by
 * tools/reference/kernel_reference.py), against naive double-precision
 * loops, and against their own algebraic properties. Property checks that
 * need a second backend or larger shapes live in test_kernels_cpu_props.c. */
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
#include "test_reference.h"

#define REF_PATH REGC_SOURCE_DIR "/tests/data/kernel_reference.json"
#define RTOL 1e-5
#define ATOL 1e-5

static cJSON *g_ref;
static regc_backend *be;

static int group_setup(void **state)
{
    (void)state;
    g_ref = regc_test_load_json(REF_PATH);
    /* the CPU (OMP_NUM_THREADS=2 under ctest), or $REGC_TEST_BACKEND: the
     * same references through the CUDA backend carry the label gpu */
    be = regc_test_backend(0);
    return be ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    cJSON_Delete(g_ref);
    regc_backend_free(be);
    return 0;
}

/* input `name` of a reference case, uploaded to the backend */
static float *ref_input(const cJSON *c, const char *name, size_t n)
{
    float *h = regc_test_reference_input(c, name, n);
    float *d = regc_test_upload(be, h, n);
    free(h);
    return d;
}

/* compare a device buffer with expected[name] */
static void ref_check(const cJSON *c, const char *name, const float *dev, size_t n,
                      const char *what)
{
    const cJSON *expected = regc_test_json_get(c, "expected");
    double *want = regc_test_json_doubles(expected, name, n);
    float *got = regc_test_download(be, dev, n);
    char label[160];
    snprintf(label, sizeof label, "%s: %s", what, name);
    regc_test_assert_close(label, got, want, n, RTOL, ATOL);
    free(want);
}

static size_t num(const cJSON *c, const char *key) { return (size_t)regc_test_json_number(c, key); }

/* ---- the random stream ------------------------------------------------------ */

static void test_rng_matches_python(void **state)
{
    (void)state;
    const cJSON *r = regc_test_json_get(g_ref, "rng");
    uint64_t seed = (uint64_t)regc_test_json_number(r, "seed");
    const cJSON *at = regc_test_json_get(r, "at");
    int n = cJSON_GetArraySize(at);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        const char *hex = cJSON_GetStringValue(cJSON_GetArrayItem(at, i));
        assert_non_null(hex);
        uint64_t want = strtoull(hex, NULL, 16);
        assert_int_equal(regc_rng_at(seed, (uint64_t)i), want);
    }
    const char *sub_hex = cJSON_GetStringValue(regc_test_json_get(r, "substream"));
    assert_non_null(sub_hex);
    uint64_t sub = strtoull(sub_hex, NULL, 16);
    assert_int_equal(
        regc_rng_substream(seed, (uint64_t)regc_test_json_number(r, "substream_index")), sub);
    double *bits = regc_test_json_doubles(r, "uniform_bits", (size_t)n);
    float vals[64];
    assert_true(n <= 64);
    regc_rng_fill_uniform(vals, (size_t)n, seed, (float)regc_test_json_number(r, "center"),
                          (float)regc_test_json_number(r, "halfwidth"));
    for (int i = 0; i < n; i++) {
        uint32_t got;
        memcpy(&got, &vals[i], sizeof got);
        assert_int_equal(got, (uint32_t)bits[i]);
    }
    free(bits);
}

/* ---- GEMM -------------------------------------------------------------------- */

static regc_epilogue epilogue_from_name(const char *name)
{
    for (int i = REGC_EPI_NONE; i <= REGC_EPI_BGRAD; i++)
        if (strcmp(name, regc_epilogue_name((regc_epilogue)i)) == 0)
            return (regc_epilogue)i;
    fail_msg("unknown epilogue %s in the reference", name);
    return REGC_EPI_NONE;
}

static void test_gemm_reference(void **state)
{
    (void)state;
    const cJSON *cases = regc_test_json_get(g_ref, "gemm"), *c;
    int seen = 0;
    cJSON_ArrayForEach (c, cases) {
        const char *epi_name = cJSON_GetStringValue(regc_test_json_get(c, "epilogue"));
        assert_non_null(epi_name);
        regc_gemm g = {0};
        g.trans_a = (int)num(c, "trans_a");
        g.trans_b = (int)num(c, "trans_b");
        g.m = (int64_t)num(c, "m");
        g.n = (int64_t)num(c, "n");
        g.k = (int64_t)num(c, "k");
        g.alpha = (float)regc_test_json_number(c, "alpha");
        g.accumulate = (int)num(c, "accumulate");
        g.epilogue = epilogue_from_name(epi_name);
        g.a = ref_input(c, "a", (size_t)(g.m * g.k));
        g.lda = g.trans_a ? g.m : g.k;
        g.b = ref_input(c, "b", (size_t)(g.k * g.n));
        g.ldb = g.trans_b ? g.k : g.n;
        g.c = g.accumulate ? ref_input(c, "c", (size_t)(g.m * g.n))
                           : regc_test_dev_nan(be, (size_t)(g.m * g.n));
        g.ldc = g.n;
        const cJSON *inputs = regc_test_json_get(c, "inputs");
        if (cJSON_HasObjectItem(inputs, "bias"))
            g.bias = ref_input(c, "bias", (size_t)g.n);
        if (cJSON_HasObjectItem(inputs, "aux"))
            g.aux = ref_input(c, "aux", (size_t)(g.m * g.n));
        else if (g.epilogue == REGC_EPI_GELU_AUX || g.epilogue == REGC_EPI_BIAS_GELU_AUX)
            g.aux = regc_test_dev_nan(be, (size_t)(g.m * g.n));
        g.ldaux = g.n;
        g.bias_grad = regc_test_dev_nan(be, (size_t)g.n);
        assert_int_equal(be->gemm(be, &g), REGC_OK);

        const cJSON *expected = regc_test_json_get(c, "expected");
        ref_check(c, "c", g.c, (size_t)(g.m * g.n), epi_name);
        if (cJSON_HasObjectItem(expected, "aux"))
            ref_check(c, "aux", g.aux, (size_t)(g.m * g.n), epi_name);
        if (cJSON_HasObjectItem(expected, "bias_grad"))
            ref_check(c, "bias_grad", g.bias_grad, (size_t)g.n, epi_name);
        seen |= 1 << g.epilogue;
        regc_test_release_all();
    }
    assert_int_equal(seen, 0xff); /* every epilogue has a recorded case */
}

#define SQRT_2_OVER_PI 0.79788456080286535588 /* sqrt(2 / pi) */

static double naive_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
}

static double naive_gelu_grad(double x)
{
    double t = tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x);
}

/* One GEMM with padded leading dimensions against a triple loop in double;
 * the padding of C and aux must come back untouched. */
static void check_gemm_case(int ta, int tb, regc_epilogue epi, int acc, float alpha, int64_t m,
                            int64_t n, int64_t k, uint64_t seed)
{
    const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5, ldaux = n + 4;
    const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
    const float sentinel = 12345.0f;
    float *a = regc_test_host_uniform((size_t)(a_rows * lda), seed + 1, 0.0f, 1.0f);
    float *b = regc_test_host_uniform((size_t)(b_rows * ldb), seed + 2, 0.0f, 1.0f);
    float *c0 = regc_test_host_uniform((size_t)(m * ldc), seed + 3, 0.0f, 1.0f);
    float *bias = regc_test_host_uniform((size_t)n, seed + 4, 0.2f, 0.5f);
    float *aux0 = regc_test_host_uniform((size_t)(m * ldaux), seed + 5, 0.0f, 3.0f);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = n; j < ldc; j++)
            c0[i * ldc + j] = sentinel;
        for (int64_t j = n; j < ldaux; j++)
            aux0[i * ldaux + j] = sentinel;
    }
    regc_gemm g = {
        .trans_a = ta,
        .trans_b = tb,
        .m = m,
        .n = n,
        .k = k,
        .a = regc_test_upload(be, a, (size_t)(a_rows * lda)),
        .lda = lda,
        .b = regc_test_upload(be, b, (size_t)(b_rows * ldb)),
        .ldb = ldb,
        .c = regc_test_upload(be, c0, (size_t)(m * ldc)),
        .ldc = ldc,
        .alpha = alpha,
        .accumulate = acc,
        .epilogue = epi,
        .bias = regc_test_upload(be, bias, (size_t)n),
        .aux = regc_test_upload(be, aux0, (size_t)(m * ldaux)),
        .ldaux = ldaux,
        .bias_grad = regc_test_dev_nan(be, (size_t)n),
    };
    assert_int_equal(be->gemm(be, &g), REGC_OK);
    float *c = regc_test_download(be, g.c, (size_t)(m * ldc));
    float *aux = regc_test_download(be, g.aux, (size_t)(m * ldaux));
    float *bgrad = regc_test_download(be, g.bias_grad, (size_t)n);

    double *want_c = regc_test_host_doubles((size_t)(m * n)),
           *want_aux = regc_test_host_doubles((size_t)(m * n));
    double *want_bg = regc_test_host_doubles((size_t)n);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < k; p++)
                s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                     (double)(tb ? b[j * ldb + p] : b[p * ldb + j]);
            double gv = (double)alpha * s + (acc ? c0[i * ldc + j] : 0.0), out = gv;
            double au = aux0[i * ldaux + j];
            switch (epi) {
            case REGC_EPI_BIAS: out = gv + bias[j]; break;
            case REGC_EPI_GELU: out = naive_gelu(gv); break;
            case REGC_EPI_GELU_AUX:
                au = gv;
                out = naive_gelu(gv);
                break;
            case REGC_EPI_BIAS_GELU_AUX:
                au = gv + bias[j];
                out = naive_gelu(au);
                break;
            case REGC_EPI_DGELU:
            case REGC_EPI_DGELU_BGRAD: out = gv * naive_gelu_grad(au); break;
            default: break;
            }
            want_c[i * n + j] = out;
            want_aux[i * n + j] = au;
        }
    }
    for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        if (epi == REGC_EPI_DGELU_BGRAD)
            for (int64_t i = 0; i < m; i++)
                s += want_c[i * n + j];
        else
            for (int64_t p = 0; p < k; p++)
                s += tb ? b[j * ldb + p] : b[p * ldb + j];
        want_bg[j] = s;
    }
    char what[128];
    snprintf(what, sizeof what, "gemm ta=%d tb=%d epilogue=%d acc=%d alpha=%g m=%lld n=%lld k=%lld",
             ta, tb, (int)epi, acc, (double)alpha, (long long)m, (long long)n, (long long)k);
    float *c_packed = regc_test_host_floats((size_t)(m * n)),
          *aux_packed = regc_test_host_floats((size_t)(m * n));
    for (int64_t i = 0; i < m; i++) {
        memcpy(c_packed + i * n, c + i * ldc, (size_t)n * sizeof(float));
        memcpy(aux_packed + i * n, aux + i * ldaux, (size_t)n * sizeof(float));
        for (int64_t j = n; j < ldc; j++)
            if (c[i * ldc + j] != sentinel)
                fail_msg("%s: C padding [%lld, %lld] was written", what, (long long)i,
                         (long long)j);
        for (int64_t j = n; j < ldaux; j++)
            if (aux[i * ldaux + j] != sentinel)
                fail_msg("%s: aux padding [%lld, %lld] was written", what, (long long)i,
                         (long long)j);
    }
    regc_test_assert_close(what, c_packed, want_c, (size_t)(m * n), 2e-5, 2e-5);
    regc_test_assert_close(what, aux_packed, want_aux, (size_t)(m * n), 2e-5, 2e-5);
    if (epi == REGC_EPI_BGRAD || epi == REGC_EPI_DGELU_BGRAD)
        regc_test_assert_close(what, bgrad, want_bg, (size_t)n, 2e-5, 2e-5);
    regc_test_release_all();
}

static void test_gemm_all_transposes_and_epilogues(void **state)
{
    (void)state;
    uint64_t seed = 1000;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int epi = REGC_EPI_NONE; epi <= REGC_EPI_BGRAD; epi++)
                for (int acc = 0; acc < 2; acc++, seed += 10)
                    check_gemm_case(ta, tb, (regc_epilogue)epi, acc, 0.625f, 9, 11, 7, seed);
}

static void test_gemm_large_parallel_epilogues(void **state)
{
    (void)state;
    /* big enough that the epilogue and the column sums run multi-threaded */
    check_gemm_case(0, 0, REGC_EPI_BIAS_GELU_AUX, 0, 0.625f, 200, 190, 33, 7000);
    check_gemm_case(1, 0, REGC_EPI_DGELU_BGRAD, 1, 0.625f, 200, 190, 33, 7100);
    check_gemm_case(0, 1, REGC_EPI_BGRAD, 0, 0.625f, 190, 200, 300, 7200);
    check_gemm_case(1, 1, REGC_EPI_BGRAD, 1, 0.625f, 150, 170, 260, 7300);
}

/* Shapes past every block of regc's packed GEMM at up to 3 threads: k over
 * two slices of 256 with a ragged end (an elementwise epilogue must wait
 * for the last), m over a 264-row block in each thread's rows (rows split),
 * n over a 4096-column block in each thread's columns (columns split), and
 * tile edges in both directions; at alpha 1 too, where whole tiles skip
 * the kernel's buffer. */
static void test_gemm_blocking_edges(void **state)
{
    (void)state;
    static const regc_epilogue deep_k[4] = {REGC_EPI_NONE, REGC_EPI_BIAS_GELU_AUX, REGC_EPI_DGELU,
                                            REGC_EPI_GELU};
    uint64_t seed = 8000;
    static const float alphas[2] = {0.625f, 1.0f};
    for (int s = 0; s < 2; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++, seed += 10) {
                check_gemm_case(ta, tb, deep_k[2 * ta + tb], ta ^ tb, alphas[s], 3 * 264 + 13, 45,
                                530, seed);
                check_gemm_case(ta, tb, REGC_EPI_BIAS, ta, alphas[s], 14, 3 * 4096 + 45, 37,
                                seed + 5);
            }
}

static void test_gemm_empty_k(void **state)
{
    (void)state;
    /* k = 0: G is zero (plus C when accumulating), the epilogue still runs */
    float c_init[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {0.5f, -1.0f, 2.0f};
    for (int acc = 0; acc < 2; acc++) {
        regc_gemm g = {.m = 2,
                       .n = 3,
                       .k = 0,
                       .lda = 1,
                       .ldb = 3,
                       .ldc = 3,
                       .alpha = 1.0f,
                       .accumulate = acc,
                       .epilogue = REGC_EPI_BIAS,
                       .c = regc_test_upload(be, c_init, 6),
                       .bias = regc_test_upload(be, bias, 3)};
        assert_int_equal(be->gemm(be, &g), REGC_OK);
        float *c = regc_test_download(be, g.c, 6);
        for (int i = 0; i < 6; i++)
            assert_float_equal(c[i], (acc ? c_init[i] : 0.0f) + bias[i % 3], 0.0f);
    }
}

static void test_gemm_rejects_bad_descriptors(void **state)
{
    (void)state;
    float *a = regc_test_dev_nan(be, 64), *b = regc_test_dev_nan(be, 64),
          *c = regc_test_dev_nan(be, 64);
    regc_gemm ok = {.m = 4,
                    .n = 4,
                    .k = 4,
                    .a = a,
                    .lda = 4,
                    .b = b,
                    .ldb = 4,
                    .c = c,
                    .ldc = 4,
                    .alpha = 1.0f};
    regc_gemm g = ok;
    g.epilogue = REGC_EPI_BIAS; /* without a bias */
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "BIAS"));
    g = ok;
    g.lda = 3;
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "lda"));
    g = ok;
    g.trans_b = 1;
    g.k = 5; /* B^T is stored [n, k]: ldb 4 < k */
    g.lda = 5;
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "ldb"));
    g = ok;
    g.epilogue = REGC_EPI_DGELU; /* without aux */
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    g = ok;
    g.epilogue = REGC_EPI_BGRAD; /* without bias_grad */
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    g = ok;
    g.epilogue = (regc_epilogue)42;
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    g = ok;
    g.m = -1;
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    /* a rejected call leaves C alone */
    float *back = regc_test_download(be, c, 16);
    for (int i = 0; i < 16; i++)
        assert_true(isnan(back[i]));
}

/* ---- normalisation, activation, attention, loss -------------------------------- */

static void test_layernorm_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "layernorm");
    const int64_t rows = (int64_t)num(c, "rows"), cols = (int64_t)num(c, "cols");
    const size_t n = (size_t)(rows * cols);
    float *x = ref_input(c, "x", n), *w = ref_input(c, "w", (size_t)cols);
    float *b = ref_input(c, "b", (size_t)cols), *dy = ref_input(c, "dy", n);
    float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, (size_t)rows),
          *rstd = regc_test_dev_nan(be, (size_t)rows);
    float *dx = regc_test_dev_nan(be, n), *dw = regc_test_dev_nan(be, (size_t)cols),
          *db = regc_test_dev_nan(be, (size_t)cols);
    be->layernorm_fwd(be, y, mean, rstd, x, w, b, rows, cols,
                      (float)regc_test_json_number(c, "eps"), 0);
    ref_check(c, "y", y, n, "layernorm");
    ref_check(c, "mean", mean, (size_t)rows, "layernorm");
    ref_check(c, "rstd", rstd, (size_t)rows, "layernorm");
    be->layernorm_bwd(be, dx, dw, db, dy, x, w, mean, rstd, rows, cols);
    ref_check(c, "dx", dx, n, "layernorm");
    ref_check(c, "dw", dw, (size_t)cols, "layernorm");
    ref_check(c, "db", db, (size_t)cols, "layernorm");
}

static void test_gelu_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "gelu");
    const size_t n = num(c, "n");
    float *x = ref_input(c, "x", n), *dy = ref_input(c, "dy", n);
    float *y = regc_test_dev_nan(be, n), *dx = regc_test_dev_nan(be, n);
    be->gelu_fwd(be, y, x, (int64_t)n);
    be->gelu_bwd(be, dx, dy, x, (int64_t)n);
    ref_check(c, "y", y, n, "gelu");
    ref_check(c, "dx", dx, n, "gelu");
}

static void test_attention_reference(void **state)
{
    (void)state;
    const cJSON *cases = regc_test_json_get(g_ref, "attention"), *c;
    int count = 0, n_bias = 0;
    cJSON_ArrayForEach (c, cases) {
        regc_attn_shape s = {.batch = (int64_t)num(c, "batch"),
                             .tq = (int64_t)num(c, "tq"),
                             .tk = (int64_t)num(c, "tk"),
                             .n_head = (int)num(c, "n_head"),
                             .n_kv_head = (int)num(c, "n_kv_head"),
                             .head_dim = (int)num(c, "head_dim"),
                             .causal = (int)num(c, "causal"),
                             .scale = (float)regc_test_json_number(c, "scale")};
        const size_t nq = (size_t)(s.batch * s.tq * s.n_head * s.head_dim);
        const size_t nkv = (size_t)(s.batch * s.tk * s.n_kv_head * s.head_dim);
        const size_t nl = (size_t)(s.batch * s.n_head * s.tq);
        float *q = ref_input(c, "q", nq), *k = ref_input(c, "k", nkv);
        float *v = ref_input(c, "v", nkv), *dout = ref_input(c, "dout", nq);
        float *out = regc_test_dev_nan(be, nq), *lse = regc_test_dev_nan(be, nl);
        float *dq = regc_test_dev_nan(be, nq), *dk = regc_test_dev_nan(be, nkv),
              *dv = regc_test_dev_nan(be, nkv);
        /* T5's cases carry a position bias [n_head, tq, tk] and expect its gradient */
        const int has_bias = cJSON_HasObjectItem(regc_test_json_get(c, "inputs"), "bias");
        const size_t nb = (size_t)(s.n_head * s.tq * s.tk);
        float *bias = has_bias ? ref_input(c, "bias", nb) : NULL;
        float *dbias = has_bias ? regc_test_dev_nan(be, nb) : NULL;
        char what[64];
        snprintf(what, sizeof what, "attention case %d (causal=%d bias=%d)", count, s.causal,
                 has_bias);
        be->attention_fwd(be, out, lse, q, k, v, bias, &s);
        ref_check(c, "out", out, nq, what);
        ref_check(c, "lse", lse, nl, what);
        be->attention_bwd(be, dq, dk, dv, dbias, dout, q, k, v, bias, out, lse, &s);
        assert_int_equal(be->sync(be), REGC_OK);
        ref_check(c, "dq", dq, nq, what);
        ref_check(c, "dk", dk, nkv, what);
        ref_check(c, "dv", dv, nkv, what);
        if (has_bias)
            ref_check(c, "dbias", dbias, nb, what);
        n_bias += has_bias;
        regc_test_release_all();
        count++;
    }
    assert_true(count >= 2);
    assert_true(n_bias >= 2); /* a causal and a cross-attention case with a bias */
}

static void test_rmsnorm_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "rmsnorm");
    const int64_t rows = (int64_t)num(c, "rows"), cols = (int64_t)num(c, "cols");
    const size_t n = (size_t)(rows * cols);
    float *x = ref_input(c, "x", n), *w = ref_input(c, "w", (size_t)cols);
    float *dy = ref_input(c, "dy", n);
    float *y = regc_test_dev_nan(be, n), *rstd = regc_test_dev_nan(be, (size_t)rows);
    float *dx = regc_test_dev_nan(be, n), *dw = regc_test_dev_nan(be, (size_t)cols);
    be->rmsnorm_fwd(be, y, rstd, x, w, rows, cols, (float)regc_test_json_number(c, "eps"), 0);
    ref_check(c, "y", y, n, "rmsnorm");
    ref_check(c, "rstd", rstd, (size_t)rows, "rmsnorm");
    be->rmsnorm_bwd(be, dx, dw, dy, x, w, rstd, rows, cols);
    ref_check(c, "dx", dx, n, "rmsnorm");
    ref_check(c, "dw", dw, (size_t)cols, "rmsnorm");
}

static void test_rope_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "rope");
    const int64_t batch = (int64_t)num(c, "batch"), t = (int64_t)num(c, "t");
    const int n_head = (int)num(c, "n_head"), head_dim = (int)num(c, "head_dim");
    const size_t n = (size_t)(batch * t * n_head * head_dim), nc = (size_t)(t * head_dim / 2);
    /* the tables are stored as values: the frontend computes them, not the rng */
    double *cos_d = regc_test_json_doubles(c, "cos", nc),
           *sin_d = regc_test_json_doubles(c, "sin", nc);
    float *cos_h = regc_test_host_floats(nc), *sin_h = regc_test_host_floats(nc);
    for (size_t i = 0; i < nc; i++) {
        cos_h[i] = (float)cos_d[i];
        sin_h[i] = (float)sin_d[i];
    }
    free(cos_d);
    free(sin_d);
    float *cs = regc_test_upload(be, cos_h, nc), *sn = regc_test_upload(be, sin_h, nc);
    float *x = ref_input(c, "x", n), *dy = ref_input(c, "dy", n);
    float *y = regc_test_dev_nan(be, n), *dx = regc_test_dev_nan(be, n);
    be->rope(be, y, x, cs, sn, batch, t, n_head, head_dim, head_dim, 0, 0);
    be->rope(be, dx, dy, cs, sn, batch, t, n_head, head_dim, head_dim, 1, 0); /* the backward */
    assert_int_equal(be->sync(be), REGC_OK);
    ref_check(c, "y", y, n, "rope");
    ref_check(c, "dx", dx, n, "rope");
}

static void test_activations_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "activations");
    const size_t n = num(c, "n");
    float *x = ref_input(c, "x", n), *dy = ref_input(c, "dy", n), *b = ref_input(c, "b", n);
    float *y = regc_test_dev_nan(be, n), *dx = regc_test_dev_nan(be, n);
    be->silu_fwd(be, y, x, (int64_t)n);
    be->silu_bwd(be, dx, dy, x, (int64_t)n);
    ref_check(c, "silu", y, n, "silu");
    ref_check(c, "silu_dx", dx, n, "silu");
    be->gelu_erf_fwd(be, y, x, (int64_t)n);
    be->gelu_erf_bwd(be, dx, dy, x, (int64_t)n);
    ref_check(c, "gelu_erf", y, n, "gelu_erf");
    ref_check(c, "gelu_erf_dx", dx, n, "gelu_erf");
    be->mul(be, y, x, b, (int64_t)n);
    ref_check(c, "mul", y, n, "mul");
    be->relu_fwd(be, y, x, (int64_t)n);
    be->relu_bwd(be, dx, dy, x, (int64_t)n);
    ref_check(c, "relu", y, n, "relu");
    ref_check(c, "relu_dx", dx, n, "relu");
    be->scale(be, y, x, (float)regc_test_json_number(c, "scale_value"), (int64_t)n);
    ref_check(c, "scale", y, n, "scale");
}

/* out = op(a, b) with value v, as a fused chain of one step (how the ops
 * without a single kernel run). */
static void ew_one(regc_ew_op op, float v, float *out, const float *a, const float *b, size_t n)
{
    regc_ew_program p = {.n_inputs = 2, .n_steps = 1, .n_outputs = 1};
    p.steps[0] = (regc_ew_step){.op = (uint8_t)op, .a = 0, .b = 1, .value = v};
    p.out_reg[0] = 2;
    float *outs[1] = {out};
    const float *ins[2] = {a, b};
    be->elementwise(be, &p, (int64_t)n, outs, ins, 0, 0u);
    assert_int_equal(be->sync(be), REGC_OK);
}

static void test_pointwise_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "pointwise");
    const size_t n = num(c, "n");
    float *x = ref_input(c, "x", n), *p = ref_input(c, "p", n), *b = ref_input(c, "b", n);
    float *dy = ref_input(c, "dy", n), *y = regc_test_dev_nan(be, n);
    float *t = regc_test_dev_nan(be, n);
    const struct {
        const char *name;
        regc_ew_op op;
        const char *value; /* the case's key of the step's value, or NULL */
        float *a, *b;
    } rows[] = {
        {"sub", REGC_EW_SUB, NULL, x, b},
        {"div", REGC_EW_DIV, NULL, x, b},
        {"neg", REGC_EW_NEG, NULL, x, x},
        {"add_scalar", REGC_EW_ADD_SCALAR, "add_value", x, x},
        {"exp", REGC_EW_EXP, NULL, x, x},
        {"rsqrt", REGC_EW_RSQRT, NULL, p, p},
        {"pow_int", REGC_EW_POW, "pow_int", x, x},
        {"pow_frac", REGC_EW_POW, "pow_frac", p, p},
        {"pow_neg", REGC_EW_POW, "pow_neg", p, p},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const float v = rows[i].value ? (float)regc_test_json_number(c, rows[i].value) : 0.0f;
        ew_one(rows[i].op, v, y, rows[i].a, rows[i].b, n);
        ref_check(c, rows[i].name, y, n, rows[i].name);
    }
    /* the mask as torch's b > 1, in 0 and 1 floats: what an exporter writes */
    float *hmask = regc_test_host_floats(n), *hb = regc_test_download(be, b, n);
    for (size_t i = 0; i < n; i++)
        hmask[i] = hb[i] > 1.0f ? 1.0f : 0.0f;
    ew_one(REGC_EW_MASKED_FILL, (float)regc_test_json_number(c, "fill_value"), y, x,
           regc_test_upload(be, hmask, n), n);
    ref_check(c, "masked_fill", y, n, "masked_fill");
    ew_one(REGC_EW_TANH, 0.0f, t, x, x, n);
    ref_check(c, "tanh", t, n, "tanh");
    ew_one(REGC_EW_TANH_BWD, 0.0f, y, dy, t, n); /* from the saved output */
    ref_check(c, "tanh_dx", y, n, "tanh");
}

static void test_row_ops_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "row_ops");
    const int64_t rows = (int64_t)num(c, "rows"), cols = (int64_t)num(c, "cols");
    const size_t n = (size_t)(rows * cols);
    float *x = ref_input(c, "x", n), *y = regc_test_dev_nan(be, n);
    float *lse = regc_test_dev_nan(be, (size_t)rows), *s = regc_test_dev_nan(be, (size_t)rows);
    for (int log = 0; log < 2; log++) {
        be->softmax_fwd(be, y, lse, x, rows, cols, log);
        assert_int_equal(be->sync(be), REGC_OK);
        ref_check(c, log ? "log_softmax" : "softmax", y, n, "softmax");
        ref_check(c, "lse", lse, (size_t)rows, "softmax");
    }
    for (int mean = 0; mean < 2; mean++) {
        be->row_sum(be, s, x, rows, cols, mean);
        assert_int_equal(be->sync(be), REGC_OK);
        ref_check(c, mean ? "mean" : "sum", s, (size_t)rows, "row_sum");
    }
}

static void test_cross_entropy_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "cross_entropy");
    const int64_t rows = (int64_t)num(c, "rows"), cols = (int64_t)num(c, "cols");
    const size_t n = (size_t)(rows * cols);
    int32_t *t_host = regc_test_json_ints(c, "targets", (size_t)rows);
    int32_t *targets = regc_test_upload_ints(be, t_host, (size_t)rows);
    free(t_host);
    float dloss_h = (float)regc_test_json_number(c, "dloss");
    float *logits = ref_input(c, "logits", n), *dloss = regc_test_upload(be, &dloss_h, 1);
    float *loss = regc_test_dev_nan(be, 1), *lse = regc_test_dev_nan(be, (size_t)rows),
          *dlogits = regc_test_dev_nan(be, n);
    be->cross_entropy_fwd(be, loss, lse, logits, targets, rows, cols);
    ref_check(c, "loss", loss, 1, "cross_entropy");
    ref_check(c, "lse", lse, (size_t)rows, "cross_entropy");
    be->cross_entropy_bwd(be, dlogits, dloss, logits, targets, lse, rows, cols, 0, rows, 0);
    ref_check(c, "dlogits", dlogits, n, "cross_entropy");
    /* the logits in chunks of rows (a chunk of one row, then the rest): the
     * same values */
    float *picked = regc_test_dev_nan(be, (size_t)rows);
    float *chunk_lse = regc_test_dev_nan(be, (size_t)rows), *chunk_dx = regc_test_dev_nan(be, n);
    for (int64_t r0 = 0, len = 1; r0 < rows; r0 += len, len = rows - r0) {
        be->cross_entropy_rows(be, chunk_lse + r0, picked + r0, logits + r0 * cols, targets + r0,
                               len, cols);
        be->cross_entropy_bwd(be, chunk_dx + r0 * cols, dloss, logits + r0 * cols, targets,
                              chunk_lse + r0, len, cols, r0, rows, 0);
    }
    be->cross_entropy_loss(be, loss, chunk_lse, picked, targets, rows, cols);
    ref_check(c, "loss", loss, 1, "cross_entropy in chunks");
    ref_check(c, "lse", chunk_lse, (size_t)rows, "cross_entropy in chunks");
    ref_check(c, "dlogits", chunk_dx, n, "cross_entropy in chunks");
}

/* ---- memory-bound kernels and the optimizer ---------------------------------- */

static void test_embedding_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "embedding");
    const int64_t rows = (int64_t)num(c, "rows"), cols = (int64_t)num(c, "cols");
    const int64_t vocab = (int64_t)num(c, "vocab");
    int32_t *ids_h = regc_test_json_ints(c, "ids", (size_t)rows);
    int32_t *ids = regc_test_upload_ints(be, ids_h, (size_t)rows);
    free(ids_h);
    float *table = ref_input(c, "table", (size_t)(vocab * cols));
    float *dout = ref_input(c, "dout", (size_t)(rows * cols));
    float *out = regc_test_dev_nan(be, (size_t)(rows * cols)),
          *dtable = regc_test_dev_nan(be, (size_t)(vocab * cols));
    be->embedding_fwd(be, out, ids, table, rows, cols, 0);
    be->embedding_bwd(be, dtable, ids, dout, rows, cols, vocab, 0, -1);
    ref_check(c, "out", out, (size_t)(rows * cols), "embedding");
    ref_check(c, "dtable", dtable, (size_t)(vocab * cols), "embedding");
}

static void test_elementwise_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "elementwise");
    const int64_t rows = (int64_t)num(c, "rows"), cols = (int64_t)num(c, "cols");
    const size_t n = (size_t)(rows * cols);
    float *a = ref_input(c, "a", n), *b = ref_input(c, "b", n);
    float *bias = ref_input(c, "bias", (size_t)cols);
    float *sum = regc_test_dev_nan(be, n), *biased = regc_test_dev_nan(be, n),
          *col = regc_test_dev_nan(be, (size_t)cols);
    be->add(be, sum, a, b, (int64_t)n);
    be->bias_add(be, biased, a, bias, rows, cols);
    be->sum_rows(be, col, a, rows, cols);
    ref_check(c, "add", sum, n, "elementwise");
    ref_check(c, "bias_add", biased, n, "elementwise");
    ref_check(c, "sum_rows", col, (size_t)cols, "elementwise");
}

static void test_transpose_reference(void **state)
{
    (void)state;
    const cJSON *cases = regc_test_json_get(g_ref, "transpose"), *c;
    cJSON_ArrayForEach (c, cases) {
        const cJSON *shape_j = regc_test_json_get(c, "shape");
        const int nd = cJSON_GetArraySize(shape_j);
        assert_true(nd >= 1 && nd <= 6);
        double *shape_d = regc_test_json_doubles(c, "shape", (size_t)nd);
        double *perm_d = regc_test_json_doubles(c, "perm", (size_t)nd);
        int64_t shape[6];
        int perm[6];
        size_t total = 1;
        for (int i = 0; i < nd; i++) {
            shape[i] = (int64_t)shape_d[i];
            perm[i] = (int)perm_d[i];
            total *= (size_t)shape[i];
        }
        free(shape_d);
        free(perm_d);
        float *x = ref_input(c, "x", total), *out = regc_test_dev_nan(be, total);
        be->transpose(be, out, x, nd, shape, perm);
        assert_int_equal(be->sync(be), REGC_OK);
        ref_check(c, "out", out, total, "transpose");
    }
}

static void test_adamw_reference(void **state)
{
    (void)state;
    const cJSON *c = regc_test_json_get(g_ref, "adamw");
    const size_t n = num(c, "n");
    const int steps = (int)num(c, "steps");
    float *p = ref_input(c, "param", n), *m = regc_test_dev_nan(be, n),
          *v = regc_test_dev_nan(be, n);
    be->fill(be, m, n, 0.0f);
    be->fill(be, v, n, 0.0f);
    for (int step = 1; step <= steps; step++) {
        char name[16];
        snprintf(name, sizeof name, "grad%d", step - 1);
        float *g = ref_input(c, name, n);
        regc_test_adamw(be, p, g, m, v, (int64_t)n, (float)regc_test_json_number(c, "lr"),
                        (float)regc_test_json_number(c, "beta1"),
                        (float)regc_test_json_number(c, "beta2"),
                        (float)regc_test_json_number(c, "eps"),
                        (float)regc_test_json_number(c, "weight_decay"), step, 1);
    }
    /* PyTorch ran the same float32 operations, except that its vector
     * loops fuse some multiply-adds (regc never fuses): agreement is to a
     * few ulps of the largest intermediate, far tighter than elsewhere */
    const cJSON *expected = regc_test_json_get(c, "expected");
    const char *names[3] = {"param", "m", "v"};
    float *bufs[3] = {p, m, v};
    for (int i = 0; i < 3; i++) {
        double *want = regc_test_json_doubles(expected, names[i], n);
        regc_test_assert_close(names[i], regc_test_download(be, bufs[i], n), want, n, 1e-6, 1e-7);
        free(want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_rng_matches_python),
        regc_test_with_buffers(test_gemm_reference),
        regc_test_with_buffers(test_gemm_all_transposes_and_epilogues),
        regc_test_with_buffers(test_gemm_large_parallel_epilogues),
        regc_test_with_buffers(test_gemm_blocking_edges),
        regc_test_with_buffers(test_gemm_empty_k),
        regc_test_with_buffers(test_gemm_rejects_bad_descriptors),
        regc_test_with_buffers(test_layernorm_reference),
        regc_test_with_buffers(test_gelu_reference),
        regc_test_with_buffers(test_attention_reference),
        regc_test_with_buffers(test_rmsnorm_reference),
        regc_test_with_buffers(test_rope_reference),
        regc_test_with_buffers(test_activations_reference),
        regc_test_with_buffers(test_pointwise_reference),
        regc_test_with_buffers(test_row_ops_reference),
        regc_test_with_buffers(test_cross_entropy_reference),
        regc_test_with_buffers(test_embedding_reference),
        regc_test_with_buffers(test_elementwise_reference),
        regc_test_with_buffers(test_transpose_reference),
        regc_test_with_buffers(test_adamw_reference),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
