/* test_kernels_cpu_props.c — properties of the CPU backend's kernels that
 * need no recorded values: agreement with naive double-precision loops at
 * shapes large enough to run multi-threaded, grouped-query attention equal
 * to attention over repeated heads, ignored targets, transpose round trips.
 * The PyTorch comparisons are in test_kernels_cpu.c; thread-count
 * independence and errors in test_kernels_cpu_threads.c. */
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

static regc_backend *be;     /* OMP_NUM_THREADS (2 under ctest) */
static regc_backend *serial; /* one thread: the thread-count comparisons */
static regc_backend *three;  /* three threads: splits that fall unevenly */

static int group_setup(void **state)
{
    (void)state;
    be = regc_test_cpu_backend(0);
    serial = regc_test_cpu_backend(1);
    three = regc_test_cpu_backend(3);
    return be && serial && three ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(three);
    regc_backend_free(serial);
    regc_backend_free(be);
    return 0;
}

/* ---- attention ------------------------------------------------------------------ */

/* Attention written out in double with an explicit probability row: out,
 * lse and the gradients for upstream gradient dout; with a score bias
 * [H, tq, tk] (or NULL) also its gradient dbias, summed over the batch;
 * with soft-capping and a sliding window as Transformers' eager attention
 * applies them (cap tanh(x / cap) of the scaled score; keys i - j >=
 * window masked); with z ([B, H, tq, tk] or NULL) the probabilities
 * multiplied by it, as eager attention's dropout does after the softmax. */
static void naive_attention(const regc_attn_shape *s, const float *q, const float *k,
                            const float *v, const float *dout, const float *bias, const float *z,
                            double *out, double *lse, double *dq, double *dk, double *dv,
                            double *dbias)
{
    const int64_t H = s->n_head, Hkv = s->n_kv_head, D = s->head_dim, rep = H / Hkv;
    const int64_t qld = H * D, kvld = Hkv * D;
    double *p = malloc((size_t)s->tk * sizeof *p), *dp = malloc((size_t)s->tk * sizeof *dp);
    double *slope = malloc((size_t)s->tk * sizeof *slope);
    assert_non_null(p);
    assert_non_null(dp);
    assert_non_null(slope);
    memset(dk, 0, regc_test_attn_kv_count(s) * sizeof *dk);
    memset(dv, 0, regc_test_attn_kv_count(s) * sizeof *dv);
    if (dbias)
        memset(dbias, 0, (size_t)(H * s->tq * s->tk) * sizeof *dbias);
    for (int64_t b = 0; b < s->batch; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < s->tq; i++) {
                const int64_t g = h / rep, nk = s->causal ? i + 1 : s->tk;
                /* a sliding window: keys before i - window + 1 are not seen */
                const int64_t j0 = s->window > 0 && i >= s->window ? i - s->window + 1 : 0;
                const float *qi = q + (b * s->tq + i) * qld + h * D;
                const float *doi = dout + (b * s->tq + i) * qld + h * D;
                double mx = -INFINITY, sum = 0.0, delta = 0.0;
                for (int64_t j = j0; j < nk; j++) {
                    const float *kj = k + (b * s->tk + j) * kvld + g * D;
                    double d = 0.0;
                    for (int64_t e = 0; e < D; e++)
                        d += (double)qi[e] * kj[e];
                    p[j] = d * s->scale;
                    slope[j] = 1.0;
                    if (s->softcap > 0.0f) { /* cap tanh(x / cap), slope 1 - tanh^2 */
                        const double t = tanh(p[j] / s->softcap);
                        p[j] = s->softcap * t;
                        slope[j] = 1.0 - t * t;
                    }
                    p[j] += bias ? bias[(h * s->tq + i) * s->tk + j] : 0.0;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = j0; j < nk; j++)
                    sum += exp(p[j] - mx);
                lse[(b * H + h) * s->tq + i] = mx + log(sum);
                double *oi = out + (b * s->tq + i) * qld + h * D;
                double *dqi = dq + (b * s->tq + i) * qld + h * D;
                for (int64_t e = 0; e < D; e++)
                    oi[e] = dqi[e] = 0.0;
                /* the row's dropout factors, 1 without */
                const float *zi = z ? z + ((b * H + h) * s->tq + i) * s->tk : NULL;
                for (int64_t j = j0; j < nk; j++) {
                    const float *vj = v + (b * s->tk + j) * kvld + g * D;
                    const double zj = zi ? zi[j] : 1.0;
                    p[j] = exp(p[j] - mx) / sum;
                    dp[j] = 0.0;
                    for (int64_t e = 0; e < D; e++) {
                        oi[e] += p[j] * zj * vj[e];
                        dp[j] += (double)doi[e] * vj[e];
                    }
                    dp[j] *= zj; /* the gradient of the dropped probability's input */
                    delta += p[j] * dp[j];
                }
                for (int64_t j = j0; j < nk; j++) {
                    const float *kj = k + (b * s->tk + j) * kvld + g * D;
                    double *dkj = dk + (b * s->tk + j) * kvld + g * D;
                    double *dvj = dv + (b * s->tk + j) * kvld + g * D;
                    const double zj = zi ? zi[j] : 1.0;
                    const double ds = p[j] * (dp[j] - delta) * slope[j] * s->scale;
                    if (dbias)
                        dbias[(h * s->tq + i) * s->tk + j] += p[j] * (dp[j] - delta);
                    for (int64_t e = 0; e < D; e++) {
                        dqi[e] += ds * kj[e];
                        dkj[e] += ds * qi[e];
                        dvj[e] += p[j] * zj * doi[e];
                    }
                }
            }
    free(p);
    free(dp);
    free(slope);
}

/* The factors the dropout kernel gives a tensor of ones of the
 * probabilities' shape [B, H, tq, tk] for s's site and draw: attention's
 * dropout must draw these. */
static float *dropout_of_ones(const regc_attn_shape *s)
{
    const size_t n = (size_t)(s->batch * s->n_head * s->tq * s->tk);
    float *ones = malloc(n * sizeof *ones);
    assert_non_null(ones);
    for (size_t e = 0; e < n; e++)
        ones[e] = 1.0f;
    float *x = regc_test_upload(be, ones, n), *y = regc_test_dev_nan(be, n);
    be->dropout(be, y, x, s->drop_site, s->drop_draw, s->dropout, (int64_t)n);
    free(ones);
    return regc_test_download(be, y, n);
}

/* s as given, or with its probabilities dropped with p (p > 0), against
 * the naive loops above. */
static void check_attention_vs_naive_drop(regc_attn_shape s, uint64_t seed, int with_bias, float p)
{
    const size_t nq = regc_test_attn_q_count(&s), nkv = regc_test_attn_kv_count(&s),
                 nl = (size_t)(s.batch * s.n_head * s.tq);
    const size_t nb = (size_t)(s.n_head * s.tq * s.tk);
    const int32_t site = 11 + (int32_t)seed, draw[4] = {(int32_t)seed, 7, 3, 1};
    float *z = NULL;
    if (p > 0.0f) {
        s.dropout = p;
        s.drop_site = regc_test_upload_ints(be, &site, 1);
        s.drop_draw = regc_test_upload_ints(be, draw, 4);
        z = dropout_of_ones(&s);
        size_t dropped = 0, n = (size_t)(s.batch * s.n_head * s.tq * s.tk);
        for (size_t e = 0; e < n; e++)
            dropped += z[e] == 0.0f;
        assert_true(dropped > 0 && dropped < n / 2); /* a mask, not all or nothing */
    }
    float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
    regc_test_attention_inputs(be, &s, seed, &hq, &hk, &hv, &hdo, &q, &k, &v, &dout);
    float *hb = with_bias ? regc_test_host_uniform(nb, seed + 7, 0.0f, 2.0f) : NULL;
    float *bias = with_bias ? regc_test_upload(be, hb, nb) : NULL;
    float *dbias = with_bias ? regc_test_dev_nan(be, nb) : NULL;
    float *out = regc_test_dev_nan(be, nq), *lse = regc_test_dev_nan(be, nl);
    float *dq = regc_test_dev_nan(be, nq), *dk = regc_test_dev_nan(be, nkv);
    float *dv = regc_test_dev_nan(be, nkv);
    be->attention_fwd(be, out, lse, q, k, v, bias, &s);
    be->attention_bwd(be, dq, dk, dv, dbias, dout, q, k, v, bias, out, lse, &s);
    assert_int_equal(be->sync(be), REGC_OK);
    double *w_out = regc_test_host_doubles(nq), *w_lse = regc_test_host_doubles(nl);
    double *w_dq = regc_test_host_doubles(nq), *w_dk = regc_test_host_doubles(nkv);
    double *w_dv = regc_test_host_doubles(nkv);
    double *w_db = with_bias ? regc_test_host_doubles(nb) : NULL;
    naive_attention(&s, hq, hk, hv, hdo, hb, z, w_out, w_lse, w_dq, w_dk, w_dv, w_db);
    char what[128];
    snprintf(what, sizeof what,
             "attention T=%lld D=%d H=%d/%d causal=%d bias=%d cap=%g window=%lld dropout=%g",
             (long long)s.tq, s.head_dim, s.n_head, s.n_kv_head, s.causal, with_bias,
             (double)s.softcap, (long long)s.window, (double)p);
    if (with_bias)
        regc_test_assert_close(what, regc_test_download(be, dbias, nb), w_db, nb, 3e-5, 3e-5);
    regc_test_assert_close(what, regc_test_download(be, out, nq), w_out, nq, 3e-5, 3e-5);
    regc_test_assert_close(what, regc_test_download(be, lse, nl), w_lse, nl, 3e-5, 3e-5);
    regc_test_assert_close(what, regc_test_download(be, dq, nq), w_dq, nq, 3e-5, 3e-5);
    regc_test_assert_close(what, regc_test_download(be, dk, nkv), w_dk, nkv, 3e-5, 3e-5);
    regc_test_assert_close(what, regc_test_download(be, dv, nkv), w_dv, nkv, 3e-5, 3e-5);
}

static void check_attention_vs_naive(regc_attn_shape s, uint64_t seed, int with_bias)
{
    check_attention_vs_naive_drop(s, seed, with_bias, 0.0f);
}

/* An attention shape: batch, tq, tk, heads, kv heads, head_dim, causal,
 * scale, softcap, window. */
#define ATTN_SHAPE(b, q, k, h, kv, d, c, sc, cap, w)                                               \
    {                                                                                              \
        .batch = b, .tq = q, .tk = k, .n_head = h, .n_kv_head = kv, .head_dim = d, .causal = c,    \
        .scale = sc, .softcap = cap, .window = w                                                   \
    }

static void test_attention_matches_naive(void **state)
{
    (void)state;
    static const struct {
        regc_attn_shape s;
        uint64_t seed;
        int bias;
    } cases[] = {
        /* head_dim 19: two 8-wide blocks of the dot product plus a tail */
        {ATTN_SHAPE(3, 37, 37, 6, 2, 19, 1, 0.2294157f, 0.0f, 0), 100, 0},
        {ATTN_SHAPE(3, 37, 37, 6, 3, 19, 0, 0.2294157f, 0.0f, 0), 200, 0},
        {ATTN_SHAPE(2, 11, 29, 4, 1, 8, 0, 0.35f, 0.0f, 0), 300, 0},
        /* T5: scale 1 and a position bias, multi-threaded dbias over 3 batch rows */
        {ATTN_SHAPE(3, 37, 37, 6, 2, 19, 1, 1.0f, 0.0f, 0), 600, 1},
        {ATTN_SHAPE(3, 11, 29, 4, 4, 8, 0, 1.0f, 0.0f, 0), 700, 1},
        /* Gemma 2: soft-capped scores (a cap the scores reach, so tanh
         * bends them), a sliding window shorter than T, and both */
        {ATTN_SHAPE(3, 37, 37, 6, 2, 19, 1, 0.6f, 0.5f, 0), 800, 0},
        {ATTN_SHAPE(3, 37, 37, 6, 2, 19, 1, 0.23f, 0.0f, 5), 900, 0},
        {ATTN_SHAPE(2, 70, 70, 4, 1, 16, 1, 0.6f, 0.7f, 9), 1000, 0},
        /* a window as long as T changes nothing; one key wide, each query
         * sees itself */
        {ATTN_SHAPE(2, 11, 11, 4, 2, 8, 1, 0.35f, 0.0f, 11), 1100, 0},
        {ATTN_SHAPE(2, 11, 11, 4, 2, 8, 1, 0.35f, 0.0f, 1), 1200, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_attention_vs_naive(cases[i].s, cases[i].seed, cases[i].bias);
    /* the probabilities' dropout */
    for (int i = 0; i < REGC_TEST_ATTN_DROP_CASES; i++) {
        const regc_test_attn_drop_case *c = &regc_test_attn_drop_cases[i];
        check_attention_vs_naive_drop(c->s, c->seed, c->bias, c->p);
    }
}

/* Soft-capping with a bias is refused by name (neither backend forms its
 * bias gradient), and so is a window without the causal mask. */
static void test_attention_refusals(void **state)
{
    (void)state;
    regc_attn_shape s = {1, 4, 4, 2, 2, 4, 1, 0.5f, 0, 0.5f, 0, 0.0f, NULL, NULL};
    float *q = regc_test_dev_nan(be, 32), *out = regc_test_dev_nan(be, 32);
    float *lse = regc_test_dev_nan(be, 8), *bias = regc_test_dev_nan(be, 32);
    be->attention_fwd(be, out, lse, q, q, q, bias, &s);
    assert_int_equal(be->sync(be), REGC_ERR_UNSUPPORTED);
    assert_non_null(strstr(regc_error_message(),
                           "attention_fwd: a score bias with soft-capping is not supported"));
    s.softcap = 0.0f, s.window = 2, s.causal = 0;
    be->attention_fwd(be, out, lse, q, q, q, NULL, &s);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "a window (2) needs the causal mask"));
    /* a dropout needs its site and draw, and a probability below 1 */
    const int32_t site = 1, draw[4] = {1, 0, 0, 1};
    s.window = 0, s.dropout = 0.1f;
    be->attention_fwd(be, out, lse, q, q, q, NULL, &s);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "dropout 0.1 must be in [0, 1), and given its "
                                                 "site and draw"));
    s.dropout = 1.0f, s.drop_site = &site, s.drop_draw = draw;
    be->attention_fwd(be, out, lse, q, q, q, NULL, &s);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "dropout 1 must be in [0, 1)"));
}

/* GQA must equal ordinary attention with each kv head repeated for its
 * query heads; the gradient of a shared kv head is the sum over them. */
static void test_attention_gqa_equals_repeated_heads(void **state)
{
    (void)state;
    regc_attn_shape gqa = {2, 9, 9, 6, 2, 5, 1, 0.4472136f, 0, 0.0f, 0, 0.0f, NULL, NULL};
    regc_attn_shape mha = gqa;
    mha.n_kv_head = gqa.n_head;
    const int rep = gqa.n_head / gqa.n_kv_head, D = gqa.head_dim;
    const size_t nq = regc_test_attn_q_count(&gqa), nkv = regc_test_attn_kv_count(&gqa),
                 nkv_rep = regc_test_attn_kv_count(&mha);
    const size_t nl = (size_t)(gqa.batch * gqa.n_head * gqa.tq);
    float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
    regc_test_attention_inputs(be, &gqa, 400, &hq, &hk, &hv, &hdo, &q, &k, &v, &dout);
    float *hk_rep = regc_test_host_floats(nkv_rep), *hv_rep = regc_test_host_floats(nkv_rep);
    for (int64_t r = 0; r < gqa.batch * gqa.tk; r++)
        for (int h = 0; h < gqa.n_head; h++) {
            const int64_t src = (r * gqa.n_kv_head + h / rep) * D, dst = (r * gqa.n_head + h) * D;
            memcpy(hk_rep + dst, hk + src, (size_t)D * sizeof(float));
            memcpy(hv_rep + dst, hv + src, (size_t)D * sizeof(float));
        }
    float *k_rep = regc_test_upload(be, hk_rep, nkv_rep),
          *v_rep = regc_test_upload(be, hv_rep, nkv_rep);
    float *out_g = regc_test_dev_nan(be, nq), *lse_g = regc_test_dev_nan(be, nl);
    float *out_m = regc_test_dev_nan(be, nq), *lse_m = regc_test_dev_nan(be, nl);
    float *dq_g = regc_test_dev_nan(be, nq), *dk_g = regc_test_dev_nan(be, nkv);
    float *dv_g = regc_test_dev_nan(be, nkv), *dq_m = regc_test_dev_nan(be, nq);
    float *dk_m = regc_test_dev_nan(be, nkv_rep), *dv_m = regc_test_dev_nan(be, nkv_rep);
    be->attention_fwd(be, out_g, lse_g, q, k, v, NULL, &gqa);
    be->attention_fwd(be, out_m, lse_m, q, k_rep, v_rep, NULL, &mha);
    be->attention_bwd(be, dq_g, dk_g, dv_g, NULL, dout, q, k, v, NULL, out_g, lse_g, &gqa);
    be->attention_bwd(be, dq_m, dk_m, dv_m, NULL, dout, q, k_rep, v_rep, NULL, out_m, lse_m, &mha);
    /* the same arithmetic on the same numbers: identical bits */
    regc_test_assert_bitwise_equal("gqa out", regc_test_download(be, out_g, nq),
                                   regc_test_download(be, out_m, nq), nq);
    regc_test_assert_bitwise_equal("gqa lse", regc_test_download(be, lse_g, nl),
                                   regc_test_download(be, lse_m, nl), nl);
    regc_test_assert_bitwise_equal("gqa dq", regc_test_download(be, dq_g, nq),
                                   regc_test_download(be, dq_m, nq), nq);
    float *hdk_m = regc_test_download(be, dk_m, nkv_rep),
          *hdv_m = regc_test_download(be, dv_m, nkv_rep);
    double *sum_dk = regc_test_host_doubles(nkv), *sum_dv = regc_test_host_doubles(nkv);
    memset(sum_dk, 0, nkv * sizeof(double));
    memset(sum_dv, 0, nkv * sizeof(double));
    for (int64_t r = 0; r < gqa.batch * gqa.tk; r++)
        for (int h = 0; h < gqa.n_head; h++)
            for (int e = 0; e < D; e++) {
                sum_dk[(r * gqa.n_kv_head + h / rep) * D + e] +=
                    hdk_m[(r * gqa.n_head + h) * D + e];
                sum_dv[(r * gqa.n_kv_head + h / rep) * D + e] +=
                    hdv_m[(r * gqa.n_head + h) * D + e];
            }
    regc_test_assert_close("gqa dk = sum of repeated heads", regc_test_download(be, dk_g, nkv),
                           sum_dk, nkv, 1e-5, 1e-6);
    regc_test_assert_close("gqa dv = sum of repeated heads", regc_test_download(be, dv_g, nkv),
                           sum_dv, nkv, 1e-5, 1e-6);
}

static void test_attention_causal_first_row_is_v0(void **state)
{
    (void)state;
    regc_attn_shape s = {3, 7, 7, 4, 2, 6, 1, 0.408f, 0, 0.0f, 0, 0.0f, NULL, NULL};
    const size_t nq = regc_test_attn_q_count(&s), nl = (size_t)(s.batch * s.n_head * s.tq);
    float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
    regc_test_attention_inputs(be, &s, 500, &hq, &hk, &hv, &hdo, &q, &k, &v, &dout);
    float *out = regc_test_dev_nan(be, nq), *lse = regc_test_dev_nan(be, nl);
    be->attention_fwd(be, out, lse, q, k, v, NULL, &s);
    float *ho = regc_test_download(be, out, nq), *hl = regc_test_download(be, lse, nl);
    const int rep = s.n_head / s.n_kv_head, D = s.head_dim;
    for (int64_t b = 0; b < s.batch; b++)
        for (int h = 0; h < s.n_head; h++) {
            /* query 0 sees key 0 only: probability exactly 1 */
            const float *o0 = ho + (b * s.tq) * s.n_head * D + h * D;
            const float *v0 = hv + (b * s.tk) * s.n_kv_head * D + (h / rep) * D;
            const float *q0 = hq + (b * s.tq) * s.n_head * D + h * D;
            const float *k0 = hk + (b * s.tk) * s.n_kv_head * D + (h / rep) * D;
            for (int e = 0; e < D; e++)
                assert_float_equal(o0[e], v0[e], 0.0f);
            double score = 0.0;
            for (int e = 0; e < D; e++)
                score += (double)q0[e] * k0[e];
            assert_float_equal(hl[(b * s.n_head + h) * s.tq], score * s.scale, 1e-5);
        }
}

/* with no keys at all every output is defined: zero, and -inf for lse; a
 * fresh backend, so the kernels find their scratch still unallocated */
static void test_attention_without_keys(void **state)
{
    (void)state;
    regc_backend *d = regc_test_cpu_backend(2);
    assert_non_null(d);
    regc_attn_shape s = {2, 5, 0, 4, 2, 8, 0, 0.35f, 0, 0.0f, 0, 0.0f, NULL, NULL};
    const size_t nq = regc_test_attn_q_count(&s), nl = (size_t)(s.batch * s.n_head * s.tq);
    float *q = regc_test_upload(d, regc_test_host_uniform(nq, 510, 0.0f, 1.0f), nq);
    float *dout = regc_test_upload(d, regc_test_host_uniform(nq, 511, 0.0f, 1.0f), nq);
    float *out = regc_test_dev_nan(d, nq), *lse = regc_test_dev_nan(d, nl);
    float *dq = regc_test_dev_nan(d, nq);
    d->attention_bwd(d, dq, NULL, NULL, NULL, dout, q, q, q, NULL, out, lse, &s);
    d->attention_fwd(d, out, lse, q, q, q, NULL, &s);
    assert_int_equal(d->sync(d), REGC_OK);
    float *ho = regc_test_download(d, out, nq), *hl = regc_test_download(d, lse, nl);
    float *hdq = regc_test_download(d, dq, nq);
    for (size_t i = 0; i < nq; i++) {
        assert_true(ho[i] == 0.0f);
        assert_true(hdq[i] == 0.0f);
    }
    for (size_t i = 0; i < nl; i++)
        assert_true(isinf(hl[i]) && hl[i] < 0.0f);
    regc_test_release_all(); /* before the backend that owns the buffers goes */
    regc_backend_free(d);
}

/* ---- cross-entropy -------------------------------------------------------------- */

static void test_cross_entropy_ignored_targets(void **state)
{
    (void)state;
    const int64_t rows = 5, cols = 6;
    float *hl = regc_test_host_uniform((size_t)(rows * cols), 600, 0.0f, 2.0f);
    float *logits = regc_test_upload(be, hl, (size_t)(rows * cols));
    float one = 1.0f, *dloss = regc_test_upload(be, &one, 1);
    float *loss = regc_test_dev_nan(be, 1), *lse = regc_test_dev_nan(be, (size_t)rows);
    float *dl = regc_test_dev_nan(be, (size_t)(rows * cols));

    /* every target ignored: loss 0, no gradient, lse still written */
    int32_t none[5] = {-1, -100, -1, -7, -1};
    int32_t *t_none = regc_test_upload_ints(be, none, 5);
    be->cross_entropy_fwd(be, loss, lse, logits, t_none, rows, cols);
    be->cross_entropy_bwd(be, dl, dloss, logits, t_none, lse, rows, cols, 0, rows, 0);
    assert_float_equal(regc_test_download(be, loss, 1)[0], 0.0f, 0.0f);
    float *hlse = regc_test_download(be, lse, (size_t)rows),
          *hdl = regc_test_download(be, dl, (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        assert_float_equal(hdl[i], 0.0f, 0.0f);
    for (int64_t r = 0; r < rows; r++)
        assert_false(isnan(hlse[r]));

    /* two valid rows out of five: the mean is over those two only */
    int32_t some[5] = {-100, 4, -1, 0, -1};
    int32_t *t_some = regc_test_upload_ints(be, some, 5);
    be->cross_entropy_fwd(be, loss, lse, logits, t_some, rows, cols);
    be->cross_entropy_bwd(be, dl, dloss, logits, t_some, lse, rows, cols, 0, rows, 0);
    hdl = regc_test_download(be, dl, (size_t)(rows * cols));
    double want = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0.0, row_sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            mx = fmax(mx, hl[r * cols + c]);
        for (int64_t c = 0; c < cols; c++)
            sum += exp(hl[r * cols + c] - mx);
        for (int64_t c = 0; c < cols; c++) {
            row_sum += hdl[r * cols + c];
            if (some[r] < 0) {
                assert_float_equal(hdl[r * cols + c], 0.0f, 0.0f);
                continue;
            }
            double p = exp(hl[r * cols + c] - mx) / sum;
            assert_float_equal(hdl[r * cols + c], (p - (c == some[r])) / 2.0, 1e-6);
        }
        assert_float_equal(row_sum, 0.0, 1e-6); /* softmax minus one-hot sums to zero */
        if (some[r] >= 0)
            want += mx + log(sum) - hl[r * cols + some[r]];
    }
    assert_float_equal(regc_test_download(be, loss, 1)[0], want / 2.0, 1e-5);
}

static void test_cross_entropy_wide_vocab_is_stable(void **state)
{
    (void)state;
    /* GPT-2's vocabulary with logits far from zero: exp() would overflow
     * without subtracting the row maximum */
    const int64_t rows = 3, cols = 50257;
    const size_t n = (size_t)(rows * cols);
    float *hl = regc_test_host_uniform(n, 700, 0.0f, 4.0f);
    hl[0 * cols + 17] = 95.0f;
    for (int64_t c = 0; c < cols; c++)
        hl[2 * cols + c] += 200.0f;
    int32_t targets[3] = {17, 50256, 0};
    float *logits = regc_test_upload(be, hl, n), *loss = regc_test_dev_nan(be, 1);
    float *lse = regc_test_dev_nan(be, (size_t)rows);
    be->cross_entropy_fwd(be, loss, lse, logits, regc_test_upload_ints(be, targets, 3), rows, cols);
    float *hlse = regc_test_download(be, lse, (size_t)rows);
    double want_loss = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            mx = fmax(mx, hl[r * cols + c]);
        for (int64_t c = 0; c < cols; c++)
            sum += exp(hl[r * cols + c] - mx);
        double want = mx + log(sum);
        assert_true(isfinite(hlse[r]));
        assert_float_equal(hlse[r], want, 1e-5 * fabs(want) + 1e-5);
        want_loss += want - hl[r * cols + targets[r]];
    }
    assert_float_equal(regc_test_download(be, loss, 1)[0], want_loss / 3.0, 1e-4);
}

/* ---- layout kernels ------------------------------------------------------------- */

/* out = x permuted, by explicit index arithmetic */
static void naive_transpose(double *out, const float *x, int nd, const int64_t *shape,
                            const int *perm)
{
    int64_t in_stride[6], oshape[6], total = 1, s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        in_stride[i] = s;
        s *= shape[i];
    }
    for (int i = 0; i < nd; i++) {
        oshape[i] = shape[perm[i]];
        total *= oshape[i];
    }
    for (int64_t o = 0; o < total; o++) {
        int64_t rem = o, src = 0;
        for (int i = nd - 1; i >= 0; i--) {
            src += (rem % oshape[i]) * in_stride[perm[i]];
            rem /= oshape[i];
        }
        out[o] = x[src];
    }
}

static void test_transpose_permutations_and_round_trip(void **state)
{
    (void)state;
    static const struct {
        int nd;
        int64_t shape[6];
        int perm[6];
    } cases[] = {
        {6, {2, 3, 4, 1, 5, 3}, {4, 1, 5, 0, 3, 2}},
        {6, {3, 2, 2, 3, 2, 5}, {5, 4, 3, 2, 1, 0}},
        {4, {4, 33, 12, 7}, {0, 2, 1, 3}}, /* attention heads: rows stay rows */
        {2, {70, 45}, {1, 0}},             /* tiled, multi-threaded */
        {3, {3, 130, 97}, {0, 2, 1}},      /* batched, tiled, ragged tiles */
        {3, {5, 1, 4}, {1, 2, 0}},
        {1, {17}, {0}},
        {3, {2, 3, 4}, {0, 1, 2}}, /* the identity */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int nd = cases[ci].nd;
        const int64_t *shape = cases[ci].shape;
        const int *perm = cases[ci].perm;
        size_t total = 1;
        int64_t oshape[6];
        int inv[6];
        for (int i = 0; i < nd; i++) {
            total *= (size_t)shape[i];
            oshape[i] = shape[perm[i]];
            inv[perm[i]] = i;
        }
        float *hx = regc_test_host_uniform(total, 800 + ci, 0.0f, 1.0f);
        float *x = regc_test_upload(be, hx, total), *y = regc_test_dev_nan(be, total);
        float *back = regc_test_dev_nan(be, total);
        be->transpose(be, y, x, nd, shape, perm);
        be->transpose(be, back, y, nd, oshape, inv);
        double *want = regc_test_host_doubles(total);
        naive_transpose(want, hx, nd, shape, perm);
        char what[64];
        snprintf(what, sizeof what, "transpose case %zu", ci);
        regc_test_assert_close(what, regc_test_download(be, y, total), want, total, 0.0, 0.0);
        regc_test_assert_bitwise_equal(what, regc_test_download(be, back, total), hx, total);
    }
}

static void test_copy_2d_fill_and_copies(void **state)
{
    (void)state;
    const int64_t rows = 4, cols = 5, ld_src = 7, ld_dst = 9;
    float *hs = regc_test_host_uniform((size_t)(rows * ld_src), 900, 0.0f, 1.0f);
    float *src = regc_test_upload(be, hs, (size_t)(rows * ld_src));
    float *dst = regc_test_dev_nan(be, (size_t)(rows * ld_dst));
    be->copy_2d(be, dst, ld_dst, src, ld_src, rows, cols);
    float *hd = regc_test_download(be, dst, (size_t)(rows * ld_dst));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld_dst; c++) {
            if (c < cols)
                assert_float_equal(hd[r * ld_dst + c], hs[r * ld_src + c], 0.0f);
            else
                assert_true(isnan(hd[r * ld_dst + c])); /* outside the copy: untouched */
        }
    float *big = regc_test_dev_nan(be, 100003);
    be->fill(be, big, 100003, -2.5f);
    float *copy = regc_test_dev_nan(be, 100003);
    be->copy_d2d(be, copy, big, 100003 * sizeof(float));
    float *hb = regc_test_download(be, copy, 100003);
    for (size_t i = 0; i < 100003; i++)
        assert_float_equal(hb[i], -2.5f, 0.0f);
}

/* ---- the rest, at shapes that run multi-threaded ------------------------------------ */

static void test_layernorm_matches_naive(void **state)
{
    (void)state;
    const int64_t rows = 300, cols = 200;
    const size_t n = (size_t)(rows * cols);
    float *hx = regc_test_host_uniform(n, 1000, 3.0f, 2.0f); /* off-centre: mean matters */
    float *hw = regc_test_host_uniform((size_t)cols, 1001, 1.0f, 0.5f);
    float *hb = regc_test_host_uniform((size_t)cols, 1002, 0.0f, 0.5f);
    float *hdy = regc_test_host_uniform(n, 1003, 0.0f, 1.0f);
    float *x = regc_test_upload(be, hx, n), *w = regc_test_upload(be, hw, (size_t)cols);
    float *b = regc_test_upload(be, hb, (size_t)cols), *dy = regc_test_upload(be, hdy, n);
    float *y = regc_test_dev_nan(be, n), *mean = regc_test_dev_nan(be, (size_t)rows);
    float *rstd = regc_test_dev_nan(be, (size_t)rows), *dx = regc_test_dev_nan(be, n);
    float *dw = regc_test_dev_nan(be, (size_t)cols), *db = regc_test_dev_nan(be, (size_t)cols);
    be->layernorm_fwd(be, y, mean, rstd, x, w, b, rows, cols, 1e-5f, 0);
    be->layernorm_bwd(be, dx, dw, db, dy, x, w, mean, rstd, rows, cols);
    double *wy = regc_test_host_doubles(n), *wdx = regc_test_host_doubles(n);
    double *wdw = regc_test_host_doubles((size_t)cols), *wdb = regc_test_host_doubles((size_t)cols);
    memset(wdw, 0, (size_t)cols * sizeof(double));
    memset(wdb, 0, (size_t)cols * sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = hx + r * cols, *dyr = hdy + r * cols;
        double mu = 0.0, var = 0.0, g1 = 0.0, g2 = 0.0;
        for (int64_t c = 0; c < cols; c++)
            mu += xr[c];
        mu /= (double)cols;
        for (int64_t c = 0; c < cols; c++)
            var += (xr[c] - mu) * (xr[c] - mu);
        double rs = 1.0 / sqrt(var / (double)cols + 1e-5);
        for (int64_t c = 0; c < cols; c++) {
            double xh = (xr[c] - mu) * rs;
            wy[r * cols + c] = xh * hw[c] + hb[c];
            g1 += hw[c] * (double)dyr[c];
            g2 += hw[c] * (double)dyr[c] * xh;
            wdw[c] += dyr[c] * xh;
            wdb[c] += dyr[c];
        }
        for (int64_t c = 0; c < cols; c++) {
            double xh = (xr[c] - mu) * rs;
            wdx[r * cols + c] =
                (hw[c] * (double)dyr[c] - g1 / (double)cols - xh * g2 / (double)cols) * rs;
        }
    }
    regc_test_assert_close("layernorm y", regc_test_download(be, y, n), wy, n, 1e-5, 1e-5);
    regc_test_assert_close("layernorm dx", regc_test_download(be, dx, n), wdx, n, 1e-4, 2e-5);
    regc_test_assert_close("layernorm dw", regc_test_download(be, dw, (size_t)cols), wdw,
                           (size_t)cols, 1e-4, 1e-4);
    regc_test_assert_close("layernorm db", regc_test_download(be, db, (size_t)cols), wdb,
                           (size_t)cols, 1e-5, 1e-4);
}

static void test_gelu_and_adamw_match_naive(void **state)
{
    (void)state;
    const size_t n = 200003;
    float *hx = regc_test_host_uniform(n, 1100, 0.0f, 10.0f);
    float *hdy = regc_test_host_uniform(n, 1101, 0.0f, 1.0f);
    float *x = regc_test_upload(be, hx, n), *dy = regc_test_upload(be, hdy, n);
    float *y = regc_test_dev_nan(be, n), *dx = regc_test_dev_nan(be, n);
    be->gelu_fwd(be, y, x, (int64_t)n);
    be->gelu_bwd(be, dx, dy, x, (int64_t)n);
    double *wy = regc_test_host_doubles(n), *wdx = regc_test_host_doubles(n);
    const double c = 0.79788456080286535588, kappa = 0.044715;
    for (size_t i = 0; i < n; i++) {
        double xi = hx[i], t = tanh(c * (xi + kappa * xi * xi * xi));
        wy[i] = 0.5 * xi * (1.0 + t);
        wdx[i] = hdy[i] *
                 (0.5 * (1.0 + t) + 0.5 * xi * (1.0 - t * t) * c * (1.0 + 3.0 * kappa * xi * xi));
    }
    regc_test_assert_close("gelu y", regc_test_download(be, y, n), wy, n, 1e-5, 1e-6);
    regc_test_assert_close("gelu dx", regc_test_download(be, dx, n), wdx, n, 1e-5, 1e-6);

    /* one AdamW step from nonzero moments, in double */
    float *hp = regc_test_host_uniform(n, 1102, 0.0f, 1.0f),
          *hm = regc_test_host_uniform(n, 1103, 0.0f, 0.1f);
    float *hv = regc_test_host_uniform(n, 1104, 0.02f, 0.01f);
    float *p = regc_test_upload(be, hp, n), *m = regc_test_upload(be, hm, n),
          *v = regc_test_upload(be, hv, n);
    /* the same step with the parameters in a group of weight_decay 0 is
     * exactly the step at weight_decay 0 (taken first, from copies) */
    float *p0 = regc_test_upload(be, hp, n), *m0 = regc_test_upload(be, hm, n),
          *v0 = regc_test_upload(be, hv, n);
    float *p1 = regc_test_upload(be, hp, n), *m1 = regc_test_upload(be, hm, n),
          *v1 = regc_test_upload(be, hv, n);
    regc_test_adamw(be, p0, dy, m0, v0, (int64_t)n, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 5, 1);
    regc_test_adamw(be, p1, dy, m1, v1, (int64_t)n, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 5, 0);
    regc_test_assert_bitwise_equal("adamw undecayed", regc_test_download(be, p1, n),
                                   regc_test_download(be, p0, n), n);
    regc_test_adamw(be, p, dy, m, v, (int64_t)n, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 5, 1);
    double *wp = regc_test_host_doubles(n);
    const double bc1 = 1.0 - pow(0.9f, 5), bc2 = 1.0 - pow(0.999f, 5);
    for (size_t i = 0; i < n; i++) {
        double g = hdy[i], mi = 0.9f * (double)hm[i] + (1.0 - 0.9f) * g;
        double vi = 0.999f * (double)hv[i] + (1.0 - 0.999f) * g * g;
        wp[i] = hp[i] * (1.0 - 3e-3f * 0.1f) - 3e-3f / bc1 * mi / (sqrt(vi) / sqrt(bc2) + 1e-8f);
    }
    regc_test_assert_close("adamw param", regc_test_download(be, p, n), wp, n, 1e-6, 1e-6);
}

static void test_embedding_and_sum_rows_match_naive(void **state)
{
    (void)state;
    const int64_t rows = 500, cols = 130, vocab = 17;
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    assert_non_null(ids);
    for (int64_t r = 0; r < rows; r++)
        ids[r] = (int32_t)(regc_rng_at(1200, (uint64_t)r) % 13); /* ids 13..16 never occur */
    float *hd = regc_test_host_uniform((size_t)(rows * cols), 1201, 0.0f, 1.0f);
    float *dout = regc_test_upload(be, hd, (size_t)(rows * cols));
    float *dtable = regc_test_dev_nan(be, (size_t)(vocab * cols)),
          *col = regc_test_dev_nan(be, (size_t)cols);
    be->embedding_bwd(be, dtable, regc_test_upload_ints(be, ids, (size_t)rows), dout, rows, cols,
                      vocab, 0, -1);
    be->sum_rows(be, col, dout, rows, cols);
    double *want = regc_test_host_doubles((size_t)(vocab * cols)),
           *wcol = regc_test_host_doubles((size_t)cols);
    memset(want, 0, (size_t)(vocab * cols) * sizeof(double));
    memset(wcol, 0, (size_t)cols * sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            want[ids[r] * cols + c] += hd[r * cols + c];
            wcol[c] += hd[r * cols + c];
        }
    free(ids);
    regc_test_assert_close("embedding dtable",
                           regc_test_download(be, dtable, (size_t)(vocab * cols)), want,
                           (size_t)(vocab * cols), 1e-5, 1e-5);
    regc_test_assert_close("sum_rows", regc_test_download(be, col, (size_t)cols), wcol,
                           (size_t)cols, 1e-5, 1e-5);
}

/* An accumulating embedding backward is a fresh table plus an add, bit for
 * bit, at one thread and at two: ids 0..29 occur 1 to 5 times each in a
 * shuffled order, 30..39 never (their rows keep the old values). */
static void test_embedding_bwd_accumulate_equals_fresh_plus_add(void **state)
{
    (void)state;
    const int64_t vocab = 40, cols = 400, rows = 90;
    const size_t nt = (size_t)(vocab * cols), nd = (size_t)(rows * cols);
    int32_t ids[90];
    int64_t r = 0;
    for (int32_t v = 0; v < 30; v++)
        for (int k = 0; k <= v % 5; k++)
            ids[r++] = v;
    assert_int_equal(r, rows);
    for (int64_t i = rows - 1; i > 0; i--) {
        int64_t j = (int64_t)(regc_rng_at(1210, (uint64_t)i) % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    /* magnitudes spread over 1e-3..1e3, so the order of the sums shows */
    float *hd = regc_test_host_uniform(nd, 1211, 0.0f, 1.0f);
    for (size_t i = 0; i < nd; i++)
        hd[i] *= powf(10.0f, (float)(int)(regc_rng_at(1212, i) % 7) - 3.0f);
    float *hbase = regc_test_host_uniform(nt, 1213, 0.0f, 4.0f); /* [vocab, cols] */
    float *res[2][2];
    regc_backend *devs[2] = {serial, be};
    for (int t = 0; t < 2; t++) {
        regc_backend *d = devs[t];
        const int32_t *dids = regc_test_upload_ints(d, ids, (size_t)rows);
        float *dout = regc_test_upload(d, hd, nd);    /* [rows, cols] */
        float *base = regc_test_upload(d, hbase, nt); /* [vocab, cols] */
        float *fresh = regc_test_dev_nan(d, nt), *sum = regc_test_dev_nan(d, nt);
        float *acc = regc_test_upload(d, hbase, nt); /* [vocab, cols] */
        d->embedding_bwd(d, fresh, dids, dout, rows, cols, vocab, 0, -1);
        d->add(d, sum, base, fresh, (int64_t)nt);
        d->embedding_bwd(d, acc, dids, dout, rows, cols, vocab, 1, -1);
        assert_int_equal(d->sync(d), REGC_OK);
        res[t][0] = regc_test_download(d, sum, nt);
        res[t][1] = regc_test_download(d, acc, nt);
    }
    regc_test_assert_bitwise_equal("accumulate vs fresh + add, 1 thread", res[0][0], res[0][1], nt);
    regc_test_assert_bitwise_equal("accumulate vs fresh + add, 2 threads", res[1][0], res[1][1],
                                   nt);
    regc_test_assert_bitwise_equal("accumulate, 1 vs 2 threads", res[0][1], res[1][1], nt);
    for (int64_t v = 30; v < vocab; v++) /* untouched rows keep their values */
        regc_test_assert_bitwise_equal("untouched row", res[1][1] + v * cols, hbase + v * cols,
                                       (size_t)cols);

    int32_t bad[2] = {1, 40}; /* id 40 >= vocab 40 */
    float *acc = regc_test_upload(be, hbase, nt);
    be->embedding_bwd(be, acc, regc_test_upload_ints(be, bad, 2), regc_test_upload(be, hd, nd), 2,
                      cols, vocab, 1, -1);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "outside the vocabulary"));
    regc_test_assert_bitwise_equal("table after a bad id", regc_test_download(be, acc, nt), hbase,
                                   nt);
}

/* RMSNorm, RoPE, SiLU, the erf GELU and mul at multi-threaded sizes,
 * against loops in double; RoPE's inverse undoes it on unit (cos, sin). */
static void test_llama_bert_ops_match_naive(void **state)
{
    (void)state;
    const int64_t rows = 300, cols = 258;
    const size_t n = (size_t)(rows * cols);
    float *hx = regc_test_host_uniform(n, 1500, 0.2f, 2.0f);
    float *hdy = regc_test_host_uniform(n, 1501, 0.0f, 1.0f);
    float *hw = regc_test_host_uniform((size_t)cols, 1502, 1.0f, 0.5f);
    float *x = regc_test_upload(be, hx, n), *dy = regc_test_upload(be, hdy, n);
    float *w = regc_test_upload(be, hw, (size_t)cols);
    float *y = regc_test_dev_nan(be, n), *dx = regc_test_dev_nan(be, n);
    float *rstd = regc_test_dev_nan(be, (size_t)rows), *dw = regc_test_dev_nan(be, (size_t)cols);
    double *wy = regc_test_host_doubles(n), *wdx = regc_test_host_doubles(n);
    double *wdw = regc_test_host_doubles((size_t)cols);

    be->rmsnorm_fwd(be, y, rstd, x, w, rows, cols, 1e-6f, 0);
    be->rmsnorm_bwd(be, dx, dw, dy, x, w, rstd, rows, cols);
    memset(wdw, 0, (size_t)cols * sizeof *wdw);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = hx + r * cols, *dyr = hdy + r * cols;
        double sq = 0.0, gx = 0.0;
        for (int64_t c = 0; c < cols; c++)
            sq += (double)xr[c] * xr[c];
        const double rs = 1.0 / sqrt(sq / (double)cols + 1e-6);
        for (int64_t c = 0; c < cols; c++)
            gx += (double)hw[c] * dyr[c] * xr[c] * rs;
        for (int64_t c = 0; c < cols; c++) {
            wy[r * cols + c] = xr[c] * rs * hw[c];
            wdx[r * cols + c] = rs * (hw[c] * dyr[c] - xr[c] * rs * gx / (double)cols);
            wdw[c] += (double)dyr[c] * xr[c] * rs;
        }
    }
    regc_test_assert_close("rmsnorm y", regc_test_download(be, y, n), wy, n, 2e-5, 2e-5);
    regc_test_assert_close("rmsnorm dx", regc_test_download(be, dx, n), wdx, n, 2e-5, 2e-5);
    regc_test_assert_close("rmsnorm dw", regc_test_download(be, dw, (size_t)cols), wdw,
                           (size_t)cols, 2e-5, 2e-5);

    be->silu_fwd(be, y, x, (int64_t)n);
    be->silu_bwd(be, dx, dy, x, (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        const double sg = 1.0 / (1.0 + exp(-(double)hx[i]));
        wy[i] = hx[i] * sg;
        wdx[i] = hdy[i] * sg * (1.0 + hx[i] * (1.0 - sg));
    }
    regc_test_assert_close("silu y", regc_test_download(be, y, n), wy, n, 2e-5, 2e-5);
    regc_test_assert_close("silu dx", regc_test_download(be, dx, n), wdx, n, 2e-5, 2e-5);

    be->gelu_erf_fwd(be, y, x, (int64_t)n);
    be->gelu_erf_bwd(be, dx, dy, x, (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        const double xi = hx[i], cdf = 0.5 * (1.0 + erf(xi / sqrt(2.0)));
        wy[i] = xi * cdf;
        wdx[i] = hdy[i] * (cdf + xi * exp(-0.5 * xi * xi) / sqrt(2.0 * 3.14159265358979323846));
    }
    regc_test_assert_close("gelu_erf y", regc_test_download(be, y, n), wy, n, 2e-5, 2e-5);
    regc_test_assert_close("gelu_erf dx", regc_test_download(be, dx, n), wdx, n, 2e-5, 2e-5);

    be->mul(be, y, x, dy, (int64_t)n);
    for (size_t i = 0; i < n; i++)
        wy[i] = (double)hx[i] * hdy[i];
    regc_test_assert_close("mul", regc_test_download(be, y, n), wy, n, 1e-7, 0.0);

    /* rope: x as [3, 100, 4 heads * 64] (n elements = 76800 < rows * cols) */
    const int64_t B = 3, T = 100;
    const int H = 4, D = 64, half = D / 2;
    const size_t nr = (size_t)(B * T * H * D), nt = (size_t)(T * half);
    float *hc = regc_test_host_floats(nt), *hs = regc_test_host_floats(nt);
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const double ang = (double)t * pow(10000.0, -2.0 * i / D);
            hc[t * half + i] = (float)cos(ang);
            hs[t * half + i] = (float)sin(ang);
        }
    float *cs = regc_test_upload(be, hc, nt), *sn = regc_test_upload(be, hs, nt);
    float *back = regc_test_dev_nan(be, nr);
    be->rope(be, y, x, cs, sn, B, T, H, D, 0, 0);
    be->rope(be, back, y, cs, sn, B, T, H, D, 1, 0);
    assert_int_equal(be->sync(be), REGC_OK);
    for (int64_t r = 0; r < B * T; r++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                const int64_t o = r * H * D + (int64_t)h * D + i, t = (r % T) * half + i;
                wy[o] = (double)hx[o] * hc[t] - (double)hx[o + half] * hs[t];
                wy[o + half] = (double)hx[o + half] * hc[t] + (double)hx[o] * hs[t];
                wdx[o] = hx[o];
                wdx[o + half] = hx[o + half];
            }
    regc_test_assert_close("rope", regc_test_download(be, y, nr), wy, nr, 2e-6, 2e-6);
    regc_test_assert_close("rope inverse", regc_test_download(be, back, nr), wdx, nr, 1e-5, 1e-5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_attention_matches_naive),
        regc_test_with_buffers(test_attention_refusals),
        regc_test_with_buffers(test_attention_gqa_equals_repeated_heads),
        regc_test_with_buffers(test_attention_causal_first_row_is_v0),
        regc_test_with_buffers(test_attention_without_keys),
        regc_test_with_buffers(test_cross_entropy_ignored_targets),
        regc_test_with_buffers(test_cross_entropy_wide_vocab_is_stable),
        regc_test_with_buffers(test_transpose_permutations_and_round_trip),
        regc_test_with_buffers(test_copy_2d_fill_and_copies),
        regc_test_with_buffers(test_layernorm_matches_naive),
        regc_test_with_buffers(test_gelu_and_adamw_match_naive),
        regc_test_with_buffers(test_embedding_and_sum_rows_match_naive),
        regc_test_with_buffers(test_embedding_bwd_accumulate_equals_fresh_plus_add),
        regc_test_with_buffers(test_llama_bert_ops_match_naive),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
