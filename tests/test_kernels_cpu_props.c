/* test_kernels_cpu_props.c — properties of the CPU backend's kernels that
 * need no recorded values: agreement with naive double-precision loops at
 * shapes large enough to run multi-threaded, ignored targets, transpose
 * round trips. Attention's are in test_kernels_cpu_attention.c, the
 * PyTorch comparisons in test_kernels_cpu.c, thread-count independence and
 * errors in test_kernels_cpu_threads.c. */
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

    /* rope: x as [3, 100, 4 heads * 64] (n elements = 76800 < rows * cols),
     * the whole of each head turned, then its first R (Phi's, GPT-NeoX's
     * part) with the rest passed through as it is; both ways */
    const int64_t B = 3, T = 100;
    const int H = 4, D = 64;
    const size_t nr = (size_t)(B * T * H * D);
    float *back = regc_test_dev_nan(be, nr);
    static const int rotated[2] = {64, 24};
    for (int k = 0; k < 2; k++) {
        const int R = rotated[k], rh = R / 2;
        const size_t nt = (size_t)(T * rh);
        float *hc = regc_test_host_floats(nt), *hs = regc_test_host_floats(nt); /* [T, R/2] */
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < rh; i++) {
                const double ang = (double)t * pow(10000.0, -2.0 * i / R);
                hc[t * rh + i] = (float)cos(ang);
                hs[t * rh + i] = (float)sin(ang);
            }
        float *cs = regc_test_upload(be, hc, nt), *sn = regc_test_upload(be, hs, nt);
        be->rope(be, y, x, cs, sn, B, T, H, D, R, 0, 0);
        be->rope(be, back, y, cs, sn, B, T, H, D, R, 1, 0);
        assert_int_equal(be->sync(be), REGC_OK);
        for (int64_t r = 0; r < B * T; r++)
            for (int h = 0; h < H; h++) {
                const int64_t at = r * H * D + (int64_t)h * D, t = (r % T) * rh;
                for (int i = 0; i < D; i++)
                    wy[at + i] = wdx[at + i] = hx[at + i];
                for (int i = 0; i < rh; i++) {
                    wy[at + i] =
                        (double)hx[at + i] * hc[t + i] - (double)hx[at + i + rh] * hs[t + i];
                    wy[at + i + rh] =
                        (double)hx[at + i + rh] * hc[t + i] + (double)hx[at + i] * hs[t + i];
                }
            }
        char what[48];
        snprintf(what, sizeof what, "rope, %d of %d turned", R, D);
        regc_test_assert_close(what, regc_test_download(be, y, nr), wy, nr, 2e-6, 2e-6);
        snprintf(what, sizeof what, "rope inverse, %d of %d turned", R, D);
        regc_test_assert_close(what, regc_test_download(be, back, nr), wdx, nr, 1e-5, 1e-5);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
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
