/* test_kernels_cpu_attention.c — the CPU attention kernels' properties,
 * which need no recorded values: forward and backward against attention
 * written out in double (score bias, soft-capping, sliding windows, the
 * probabilities' dropout), grouped-query attention equal to attention over
 * repeated heads, a causal first row that is v's first, documents packed in
 * a row equal to each document alone, no keys at all, and the shapes
 * refused. */
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

static regc_backend *be; /* OMP_NUM_THREADS (2 under ctest) */

static int group_setup(void **state)
{
    (void)state;
    be = regc_test_cpu_backend(0);
    return be ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
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
    regc_attn_shape s = {1, 4, 4, 2, 2, 4, 1, 0.5f, 0, 0.5f, 0, 0.0f, NULL, NULL, NULL};
    float *q = regc_test_dev_nan(be, 32), *out = regc_test_dev_nan(be, 32);
    float *lse = regc_test_dev_nan(be, 8), *bias = regc_test_dev_nan(be, 32);
    be->attention_fwd(be, out, lse, q, q, q, bias, &s);
    assert_int_equal(be->sync(be), REGC_ERR_UNSUPPORTED);
    assert_non_null(strstr(regc_error_message(),
                           "attention_fwd: a score bias with soft-capping is not supported"));
    s.softcap = 0.0f, s.window = 2, s.causal = 0;
    be->attention_fwd(be, out, lse, q, q, q, NULL, &s);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "a window (2) or documents need the causal mask"));
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
    regc_attn_shape gqa = {2, 9, 9, 6, 2, 5, 1, 0.4472136f, 0, 0.0f, 0, 0.0f, NULL, NULL, NULL};
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
    regc_attn_shape s = {3, 7, 7, 4, 2, 6, 1, 0.408f, 0, 0.0f, 0, 0.0f, NULL, NULL, NULL};
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

/* Documents packed in a row (doc_start) attend as separate sequences: each
 * document's rows of out, lse, dq, dk and dv hold the bits of attention run
 * on that document alone, with or without a sliding window (every sum runs
 * from the first key seen, in order, wherever the row starts). */
static void check_documents(int64_t window)
{
    enum { B = 2, T = 21, H = 4, HKV = 2, D = 6 };
    static const int64_t starts[B][4] = {{0, 7, 15, T}, {0, 12, T, T}}; /* T ends the list */
    regc_attn_shape s = {B, T,    T,      H,    HKV,  D,    1,   0.40824829f,
                         0, 0.0f, window, 0.0f, NULL, NULL, NULL};
    int32_t doc_start[B * T];
    for (int b = 0; b < B; b++)
        for (int d = 0; starts[b][d] < T; d++)
            for (int64_t i = starts[b][d]; i < starts[b][d + 1]; i++)
                doc_start[b * T + i] = (int32_t)starts[b][d];
    const size_t nq = regc_test_attn_q_count(&s), nkv = regc_test_attn_kv_count(&s);
    const size_t nl = (size_t)(B * H * T);
    float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
    regc_test_attention_inputs(be, &s, 600 + (uint64_t)window, &hq, &hk, &hv, &hdo, &q, &k, &v,
                               &dout);
    s.doc_start = regc_test_upload_ints(be, doc_start, B * T);
    float *out = regc_test_dev_nan(be, nq), *lse = regc_test_dev_nan(be, nl);
    float *dq = regc_test_dev_nan(be, nq), *dk = regc_test_dev_nan(be, nkv);
    float *dv = regc_test_dev_nan(be, nkv);
    be->attention_fwd(be, out, lse, q, k, v, NULL, &s);
    be->attention_bwd(be, dq, dk, dv, NULL, dout, q, k, v, NULL, out, lse, &s);
    const float *ho = regc_test_download(be, out, nq), *hl = regc_test_download(be, lse, nl);
    const float *hdq = regc_test_download(be, dq, nq), *hdk = regc_test_download(be, dk, nkv);
    const float *hdv = regc_test_download(be, dv, nkv);
    for (int b = 0; b < B; b++)
        for (int d = 0; starts[b][d] < T; d++) {
            const int64_t a = starts[b][d], n = starts[b][d + 1] - a;
            regc_attn_shape one = s;
            one.batch = 1, one.tq = one.tk = n, one.doc_start = NULL;
            const size_t oq = (size_t)(n * H * D), okv = (size_t)(n * HKV * D);
            const size_t at_q = (size_t)((b * T + a) * H * D),
                         at_kv = (size_t)((b * T + a) * HKV * D);
            float *q1 = regc_test_upload(be, hq + at_q, oq),
                  *k1 = regc_test_upload(be, hk + at_kv, okv);
            float *v1 = regc_test_upload(be, hv + at_kv, okv);
            float *do1 = regc_test_upload(be, hdo + at_q, oq);
            float *out1 = regc_test_dev_nan(be, oq), *lse1 = regc_test_dev_nan(be, (size_t)(H * n));
            float *dq1 = regc_test_dev_nan(be, oq), *dk1 = regc_test_dev_nan(be, okv);
            float *dv1 = regc_test_dev_nan(be, okv);
            be->attention_fwd(be, out1, lse1, q1, k1, v1, NULL, &one);
            be->attention_bwd(be, dq1, dk1, dv1, NULL, do1, q1, k1, v1, NULL, out1, lse1, &one);
            char what[64];
            snprintf(what, sizeof what, "window %d, row %d, document %d: out", (int)window, b, d);
            regc_test_assert_bitwise_equal(what, ho + at_q, regc_test_download(be, out1, oq), oq);
            snprintf(what, sizeof what, "window %d, row %d, document %d: dq", (int)window, b, d);
            regc_test_assert_bitwise_equal(what, hdq + at_q, regc_test_download(be, dq1, oq), oq);
            snprintf(what, sizeof what, "window %d, row %d, document %d: dk", (int)window, b, d);
            regc_test_assert_bitwise_equal(what, hdk + at_kv, regc_test_download(be, dk1, okv),
                                           okv);
            snprintf(what, sizeof what, "window %d, row %d, document %d: dv", (int)window, b, d);
            regc_test_assert_bitwise_equal(what, hdv + at_kv, regc_test_download(be, dv1, okv),
                                           okv);
            const float *hl1 = regc_test_download(be, lse1, (size_t)(H * n)); /* [H, n] */
            for (int h = 0; h < H; h++) {
                snprintf(what, sizeof what, "window %d, row %d, document %d: lse", (int)window, b,
                         d);
                regc_test_assert_bitwise_equal(what, hl + (b * H + h) * T + a, hl1 + h * n,
                                               (size_t)n);
            }
        }
}

static void test_attention_documents_are_separate(void **state)
{
    (void)state;
    check_documents(0);
    check_documents(5);
}

/* with no keys at all every output is defined: zero, and -inf for lse; a
 * fresh backend, so the kernels find their scratch still unallocated */
static void test_attention_without_keys(void **state)
{
    (void)state;
    regc_backend *d = regc_test_cpu_backend(2);
    assert_non_null(d);
    regc_attn_shape s = {2, 5, 0, 4, 2, 8, 0, 0.35f, 0, 0.0f, 0, 0.0f, NULL, NULL, NULL};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_attention_matches_naive),
        regc_test_with_buffers(test_attention_refusals),
        regc_test_with_buffers(test_attention_gqa_equals_repeated_heads),
        regc_test_with_buffers(test_attention_causal_first_row_is_v0),
        regc_test_with_buffers(test_attention_documents_are_separate),
        regc_test_with_buffers(test_attention_without_keys),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
