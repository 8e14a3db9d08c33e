/* test_kernels_cpu_threads.c — the CPU kernels give the same bits at one,
 * two and three threads (every reduction is ordered by data, not by
 * thread: regional == full and a run's reproducibility rest on it), the
 * backend is chosen by name, and sync() reports a kernel's failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
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

/* ---- determinism, creation, errors ---------------------------------------------- */

/* Every reduction is ordered by data, not by thread: one thread and many
 * give identical bits (regional == full relies on kernels like these). */
static void test_results_do_not_depend_on_thread_count(void **state)
{
    (void)state;
    enum { N_OUT = 17 };
    static const char *names[N_OUT] = {
        "attention out", "lse",          "dq",        "dk",        "dv",
        "layernorm dx",  "layernorm dw", "loss",      "dlogits",   "biased attention out",
        "biased lse",    "biased dq",    "biased dk", "biased dv", "dbias",
        "rmsnorm dx",    "rmsnorm dw"};
    regc_attn_shape s = {2, 40, 40, 4, 2, 16, 1, 0.25f, 0, 0.0f, 0, 0.0f, NULL, NULL, NULL};
    const size_t nq = regc_test_attn_q_count(&s), nkv = regc_test_attn_kv_count(&s),
                 nl = (size_t)(s.batch * s.n_head * s.tq);
    const int64_t rows = 300, cols = 257;
    const size_t n = (size_t)(rows * cols);
    const size_t nb = (size_t)(s.n_head * s.tq * s.tk);
    const size_t counts[N_OUT] = {nq, nl, nq,  nkv, nkv, n, (size_t)cols, 1, n, nq,
                                  nl, nq, nkv, nkv, nb,  n, (size_t)cols};
    int32_t tg[300];
    for (int i = 0; i < 300; i++)
        tg[i] = (i % 7 == 3) ? -1 : (int32_t)(regc_rng_at(1300, (uint64_t)i) % (uint64_t)cols);
    regc_backend *bes[2] = {be, serial};
    float *res[2][N_OUT];
    for (int t = 0; t < 2; t++) {
        regc_backend *d = bes[t];
        float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
        regc_test_attention_inputs(d, &s, 1310, &hq, &hk, &hv, &hdo, &q, &k, &v, &dout);
        float *out = regc_test_dev_nan(d, nq), *lse = regc_test_dev_nan(d, nl);
        float *dq = regc_test_dev_nan(d, nq), *dk = regc_test_dev_nan(d, nkv);
        float *dv = regc_test_dev_nan(d, nkv);
        d->attention_fwd(d, out, lse, q, k, v, NULL, &s);
        d->attention_bwd(d, dq, dk, dv, NULL, dout, q, k, v, NULL, out, lse, &s);

        float *x = regc_test_upload(d, regc_test_host_uniform(n, 1320, 0.5f, 2.0f), n);
        float *w = regc_test_upload(d, regc_test_host_uniform((size_t)cols, 1321, 1.0f, 0.5f),
                                    (size_t)cols);
        float *y = regc_test_dev_nan(d, n), *mean = regc_test_dev_nan(d, (size_t)rows);
        float *rstd = regc_test_dev_nan(d, (size_t)rows), *dx = regc_test_dev_nan(d, n);
        float *dw = regc_test_dev_nan(d, (size_t)cols), *db = regc_test_dev_nan(d, (size_t)cols);
        d->layernorm_fwd(d, y, mean, rstd, x, w, w, rows, cols, 1e-5f, 0);
        d->layernorm_bwd(d, dx, dw, db, y, x, w, mean, rstd, rows, cols); /* y as dy */

        float one = 1.0f, *loss = regc_test_dev_nan(d, 1), *dl = regc_test_dev_nan(d, n);
        float *ce_lse = regc_test_dev_nan(d, (size_t)rows);
        int32_t *targets = regc_test_upload_ints(d, tg, 300);
        d->cross_entropy_fwd(d, loss, ce_lse, x, targets, rows, cols);
        d->cross_entropy_bwd(d, dl, regc_test_upload(d, &one, 1), x, targets, ce_lse, rows, cols, 0,
                             rows, 0);

        /* T5's biased attention: dbias sums over the batch, the one
         * reduction across the (batch, head) tasks */
        float *bias = regc_test_upload(d, regc_test_host_uniform(nb, 1330, 0.0f, 2.0f), nb);
        float *out_b = regc_test_dev_nan(d, nq), *lse_b = regc_test_dev_nan(d, nl);
        float *dq_b = regc_test_dev_nan(d, nq), *dk_b = regc_test_dev_nan(d, nkv);
        float *dv_b = regc_test_dev_nan(d, nkv), *dbias = regc_test_dev_nan(d, nb);
        d->attention_fwd(d, out_b, lse_b, q, k, v, bias, &s);
        d->attention_bwd(d, dq_b, dk_b, dv_b, dbias, dout, q, k, v, bias, out_b, lse_b, &s);

        float *rdx = regc_test_dev_nan(d, n), *rdw = regc_test_dev_nan(d, (size_t)cols);
        float *rrstd = regc_test_dev_nan(d, (size_t)rows);
        d->rmsnorm_fwd(d, y, rrstd, x, w, rows, cols, 1e-6f, 0);
        d->rmsnorm_bwd(d, rdx, rdw, x, x, w, rrstd, rows, cols); /* x as dy */
        assert_int_equal(d->sync(d), REGC_OK);

        const float *outs[N_OUT] = {out,   lse,   dq,   dk,   dv,   dx,    dw,  loss, dl,
                                    out_b, lse_b, dq_b, dk_b, dv_b, dbias, rdx, rdw};
        for (int i = 0; i < N_OUT; i++)
            res[t][i] = regc_test_download(d, outs[i], counts[i]);
    }
    for (int i = 0; i < N_OUT; i++)
        regc_test_assert_bitwise_equal(names[i], res[0][i], res[1][i], counts[i]);
}

/* Column sums (sum_rows, the DGELU_BGRAD bias gradient) split their columns
 * between threads and AdamW its elements: at 1, 2 and 3 threads (an uneven
 * split) every result is the same bits. cols spans several column chunks
 * and ends mid cache line; n ends past a whole vector. */
static void test_column_sums_and_adamw_do_not_depend_on_thread_count(void **state)
{
    (void)state;
    enum { N_OUT = 6 };
    static const char *names[N_OUT] = {"sum_rows", "dgelu_bgrad c", "dgelu_bgrad bias grad",
                                       "adamw p",  "adamw m",       "adamw v"};
    const int64_t rows = 37, cols = 1301, k = 5;
    const size_t nx = (size_t)(rows * cols), n = 200003;
    const size_t counts[N_OUT] = {(size_t)cols, nx, (size_t)cols, n, n, n};
    regc_backend *bes[3] = {serial, be, three};
    float *res[3][N_OUT];
    for (int t = 0; t < 3; t++) {
        regc_backend *d = bes[t];
        /* [rows, cols] */
        float *x = regc_test_upload(d, regc_test_host_uniform(nx, 1400, 0.0f, 2.0f), nx);
        float *sums = regc_test_dev_nan(d, (size_t)cols); /* [cols] */
        d->sum_rows(d, sums, x, rows, cols);

        regc_gemm g = {0};
        g.m = rows, g.n = cols, g.k = k, g.alpha = 1.0f;
        g.a = regc_test_upload(d, regc_test_host_uniform((size_t)(rows * k), 1401, 0.0f, 1.0f),
                               (size_t)(rows * k)); /* [rows, k] */
        g.lda = k;
        g.b = regc_test_upload(d, regc_test_host_uniform((size_t)(k * cols), 1402, 0.0f, 1.0f),
                               (size_t)(k * cols)); /* [k, cols] */
        g.ldb = cols;
        g.c = regc_test_dev_nan(d, nx); /* [rows, cols] */
        g.ldc = cols;
        g.aux = x, g.ldaux = cols;
        g.bias_grad = regc_test_dev_nan(d, (size_t)cols); /* [cols] */
        g.epilogue = REGC_EPI_DGELU_BGRAD;
        assert_int_equal(d->gemm(d, &g), REGC_OK);

        float *p = regc_test_upload(d, regc_test_host_uniform(n, 1403, 0.0f, 1.0f), n); /* [n] */
        float *gr = regc_test_upload(d, regc_test_host_uniform(n, 1404, 0.0f, 1.0f), n);
        float *m = regc_test_upload(d, regc_test_host_uniform(n, 1405, 0.0f, 0.1f), n);
        float *v = regc_test_upload(d, regc_test_host_uniform(n, 1406, 0.02f, 0.01f), n);
        regc_test_adamw(d, p, gr, m, v, (int64_t)n, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 2, 1);
        assert_int_equal(d->sync(d), REGC_OK);

        const float *outs[N_OUT] = {sums, g.c, g.bias_grad, p, m, v};
        for (int i = 0; i < N_OUT; i++)
            res[t][i] = regc_test_download(d, outs[i], counts[i]);
    }
    for (int t = 1; t < 3; t++)
        for (int i = 0; i < N_OUT; i++)
            regc_test_assert_bitwise_equal(names[i], res[0][i], res[t][i], counts[i]);
}

/* Threads own disjoint blocks of C, each summed in one order (in regc's
 * own GEMM, and in blocks fixed by the shape around OpenBLAS's): the same
 * bits at 1, 2 and 3 threads, in all four transpose cases,
 * split by columns (n >= m) and by rows, across several k slices and
 * column blocks, at alpha 1 (whole tiles stored from the kernel's
 * registers) and not. Operands are allocated to their last value, with no
 * padding of their rows (m = 72: a kernel's whole panel of A next to the
 * end of a row), so the sanitizers see any read past them. */
static void test_gemm_does_not_depend_on_thread_count(void **state)
{
    (void)state;
    static const int64_t shapes[3][3] = {{72, 333, 600}, {333, 72, 600}, {5, 2 * 4096 + 100, 40}};
    static const float alphas[2] = {0.75f, 1.0f};
    regc_backend *bes[3] = {serial, be, three};
    for (int s = 0; s < 3; s++) /* m, n, k = shapes[s] */
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int al = 0; al < 2; al++) {
                    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                    float *res[3];
                    for (int t = 0; t < 3; t++) {
                        regc_backend *d = bes[t];
                        regc_gemm g = {0};
                        g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k;
                        g.alpha = alphas[al], g.accumulate = 1;
                        g.a = regc_test_upload(
                            d, regc_test_host_uniform((size_t)(m * k), 1500 + s, 0.0f, 1.0f),
                            (size_t)(m * k)); /* [m, k] or [k, m] */
                        g.lda = ta ? m : k;
                        g.b = regc_test_upload(
                            d, regc_test_host_uniform((size_t)(k * n), 1510 + s, 0.0f, 1.0f),
                            (size_t)(k * n)); /* [k, n] or [n, k] */
                        g.ldb = tb ? k : n;
                        g.c = regc_test_upload(
                            d, regc_test_host_uniform((size_t)(m * n), 1520 + s, 0.0f, 1.0f),
                            (size_t)(m * n)); /* [m, n] */
                        g.ldc = n;
                        assert_int_equal(d->gemm(d, &g), REGC_OK);
                        res[t] = regc_test_download(d, g.c, (size_t)(m * n));
                    }
                    char what[96];
                    snprintf(what, sizeof what,
                             "gemm m=%lld n=%lld ta=%d tb=%d alpha=%g, 1 vs 2 and 3 threads",
                             (long long)m, (long long)n, ta, tb, (double)alphas[al]);
                    regc_test_assert_bitwise_equal(what, res[0], res[1], (size_t)(m * n));
                    regc_test_assert_bitwise_equal(what, res[0], res[2], (size_t)(m * n));
                }
}

/* A backend made with 0 threads takes the calling thread's default OpenMP
 * team, so the GEMM (OpenBLAS's too, which follows that default and whose
 * own thread setting would change it for good) leaves it as it found it,
 * at a size that goes parallel and one that does not. */
static void test_gemm_keeps_the_default_team(void **state)
{
    (void)state;
    regc_backend *two = regc_test_cpu_backend(2); /* the default made 2 */
    assert_non_null(two);
    assert_int_equal(omp_get_max_threads(), 2);
    static const int64_t sizes[2] = {160, 8}; /* m = n = k: 4.1M multiply-adds, and 512 */
    for (int s = 0; s < 2; s++) {
        const int64_t n = sizes[s];
        regc_gemm g = {0};
        g.m = g.n = g.k = n, g.lda = g.ldb = g.ldc = n, g.alpha = 1.0f;
        g.a = regc_test_upload(two, regc_test_host_uniform((size_t)(n * n), 1600, 0.0f, 1.0f),
                               (size_t)(n * n)); /* [n, n] */
        g.b = regc_test_upload(two, regc_test_host_uniform((size_t)(n * n), 1601, 0.0f, 1.0f),
                               (size_t)(n * n)); /* [n, n] */
        g.c = regc_test_upload(two, regc_test_host_uniform((size_t)(n * n), 1602, 0.0f, 1.0f),
                               (size_t)(n * n)); /* [n, n] */
        assert_int_equal(two->gemm(two, &g), REGC_OK);
        assert_int_equal(two->sync(two), REGC_OK);
        if (omp_get_max_threads() != 2)
            fail_msg("a %lld-cube GEMM on %s left the default team at %d threads, not 2",
                     (long long)n, regc_backend_cpu_gemm_name(), omp_get_max_threads());
    }
    regc_test_release_all(); /* the buffers, while their backend lives */
    regc_backend_free(two);
}

static void test_backend_by_name(void **state)
{
    (void)state;
    regc_backend *cpu = regc_backend_new("cpu", 1);
    assert_non_null(cpu);
    assert_string_equal(cpu->name, "cpu");
    /* a NULL entry would be a kernel the runtime cannot run on the CPU */
#define EXPECT_FN(f)                                                                               \
    if (!cpu->f)                                                                                   \
    fail_msg("cpu backend: " #f " is NULL")
    EXPECT_FN(alloc);
    EXPECT_FN(free);
    EXPECT_FN(copy_h2d);
    EXPECT_FN(copy_d2h);
    EXPECT_FN(copy_d2d);
    EXPECT_FN(fill);
    EXPECT_FN(sync);
    EXPECT_FN(copy_2d);
    EXPECT_FN(transpose);
    EXPECT_FN(gemm);
    EXPECT_FN(embedding_fwd);
    EXPECT_FN(embedding_bwd);
    EXPECT_FN(add);
    EXPECT_FN(bias_add);
    EXPECT_FN(sum_rows);
    EXPECT_FN(layernorm_fwd);
    EXPECT_FN(layernorm_bwd);
    EXPECT_FN(gelu_fwd);
    EXPECT_FN(gelu_bwd);
    EXPECT_FN(attention_fwd);
    EXPECT_FN(attention_bwd);
    EXPECT_FN(cross_entropy_fwd);
    EXPECT_FN(cross_entropy_bwd);
    EXPECT_FN(adamw);
    EXPECT_FN(destroy);
    EXPECT_FN(rmsnorm_fwd);
    EXPECT_FN(rmsnorm_bwd);
    EXPECT_FN(rope);
    EXPECT_FN(silu_fwd);
    EXPECT_FN(silu_bwd);
    EXPECT_FN(mul);
    EXPECT_FN(gelu_erf_fwd);
    EXPECT_FN(gelu_erf_bwd);
    EXPECT_FN(relu_fwd);
    EXPECT_FN(relu_bwd);
    EXPECT_FN(scale);
#undef EXPECT_FN
    regc_backend_free(cpu);
    regc_backend_free(NULL);

    regc_error_clear();
    assert_null(regc_backend_new("tpu-9000", 0));
    assert_non_null(strstr(regc_error_message(), "tpu-9000"));
    assert_null(regc_backend_new(NULL, 0));

    regc_error_clear();
    regc_backend *cuda = regc_backend_new("cuda", 0);
    if (cuda)
        regc_backend_free(cuda); /* a CUDA build on a machine with a GPU */
    else
        assert_true(strlen(regc_error_message()) > 0 &&
                    strcmp(regc_error_message(), "no error") != 0);
}

static void test_sync_reports_kernel_failures(void **state)
{
    (void)state;
    assert_int_equal(be->sync(be), REGC_OK);
    float *x = regc_test_dev_nan(be, 8), *y = regc_test_dev_nan(be, 8);
    int64_t shape[2] = {2, 4};
    int bad_perm[2] = {1, 1};
    be->transpose(be, y, x, 2, shape, bad_perm);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "transpose"));
    assert_int_equal(be->sync(be), REGC_OK); /* reported once, then cleared */

    regc_step_scalars bad = {.base_lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .schedule = 99};
    regc_step_scalars *d =
        (regc_step_scalars *)regc_test_upload(be, (const float *)&bad, sizeof bad / sizeof(float));
    be->step_schedule(be, d); /* no such schedule */
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "step_schedule"));

    int32_t ids[2] = {1, 9};
    be->embedding_bwd(be, y, regc_test_upload_ints(be, ids, 2), x, 2, 2, 4, 0,
                      -1); /* id 9 >= vocab 4 */
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "embedding_bwd"));

    regc_attn_shape s = {1, 3,    4, 2,    2,    2,    1,   1.0f,
                         0, 0.0f, 0, 0.0f, NULL, NULL, NULL}; /* causal needs tq == tk */
    be->attention_fwd(be, x, y, x, x, x, NULL, &s);
    assert_int_equal(be->sync(be), REGC_ERR_SHAPE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_results_do_not_depend_on_thread_count),
        regc_test_with_buffers(test_column_sums_and_adamw_do_not_depend_on_thread_count),
        regc_test_with_buffers(test_gemm_does_not_depend_on_thread_count),
        regc_test_with_buffers(test_gemm_keeps_the_default_team),
        regc_test_with_buffers(test_backend_by_name),
        regc_test_with_buffers(test_sync_reports_kernel_failures),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
