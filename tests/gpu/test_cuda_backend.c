/* test_cuda_backend.c — the CUDA backend against the CPU backend (ctest
 * label "gpu"). Without a usable GPU this test fails: a GPU run that
 * silently tests nothing would look like a pass. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "test_device.h"

static regc_backend *cpu, *gpu;

static int setup(void **state)
{
    (void)state;
    cpu = regc_backend_cpu_new(0);
    gpu = regc_backend_new("cuda", 0);
    if (!gpu) {
        fprintf(stderr, "no CUDA backend: %s\n", regc_error_message());
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    regc_backend_free(cpu);
    regc_backend_free(gpu);
    return 0;
}

static float *to_gpu(const float *h, size_t n)
{
    float *d = gpu->alloc(gpu, n * sizeof(float));
    assert_non_null(d);
    gpu->copy_h2d(gpu, d, h, n * sizeof(float));
    return d;
}

static void from_gpu(float *h, const float *d, size_t n)
{
    gpu->copy_d2h(gpu, h, d, n * sizeof(float));
    assert_int_equal(gpu->sync(gpu), REGC_OK);
}

static void assert_close(const float *want, const float *got, size_t n, float tol, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (fabsf(want[i] - got[i]) > tol * (1.0f + fabsf(want[i])))
            fail_msg("%s[%zu]: cpu %.7g, cuda %.7g", what, i, want[i], got[i]);
}

/* One GEMM with every epilogue and transpose combination, cuda vs cpu. */
static void test_gemm_epilogues_match_cpu(void **state)
{
    (void)state;
    const int64_t m = 40, n = 24, k = 32; /* leading dims multiples of 8 for aux */
    size_t na = (size_t)(m * k), nb = (size_t)(k * n), nc = (size_t)(m * n);
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *bias = malloc((size_t)n * 4);
    float *aux_in = malloc(nc * sizeof(float));
    regc_rng_fill_uniform(a, na, 1, 0.0f, 1.0f);
    regc_rng_fill_uniform(b, nb, 2, 0.0f, 1.0f);
    regc_rng_fill_uniform(bias, (size_t)n, 3, 0.0f, 1.0f);
    regc_rng_fill_uniform(aux_in, nc, 4, 0.0f, 2.0f);
    float *da = to_gpu(a, na), *db = to_gpu(b, nb), *dbias = to_gpu(bias, (size_t)n);
    for (int e = REGC_EPI_NONE; e <= REGC_EPI_BGRAD; e++) {
        for (int tt = 0; tt < 4; tt++) {
            int ta = tt & 1, tb = tt >> 1;
            float *c_cpu = calloc(nc, sizeof(float)), *c_gpu = calloc(nc, sizeof(float));
            float *aux_cpu = malloc(nc * sizeof(float)), *aux_gpu = malloc(nc * sizeof(float));
            float bg_cpu[24] = {0}, bg_gpu[24] = {0};
            memcpy(aux_cpu, aux_in, nc * sizeof(float));
            float *dc = to_gpu(c_gpu, nc), *daux = to_gpu(aux_in, nc), *dbg = to_gpu(bg_gpu, 24);
            regc_gemm g = {.trans_a = ta,
                           .trans_b = tb,
                           .m = m,
                           .n = n,
                           .k = k,
                           .lda = ta ? m : k,
                           .ldb = tb ? k : n,
                           .ldc = n,
                           .alpha = 1.0f,
                           .epilogue = (regc_epilogue)e,
                           .ldaux = n};
            g.a = a;
            g.b = b;
            g.c = c_cpu;
            g.bias = bias;
            g.aux = aux_cpu;
            g.bias_grad = bg_cpu;
            assert_int_equal(cpu->gemm(cpu, &g), REGC_OK);
            g.a = da;
            g.b = db;
            g.c = dc;
            g.bias = dbias;
            g.aux = daux;
            g.bias_grad = dbg;
            if (gpu->gemm(gpu, &g) != REGC_OK)
                fail_msg("epilogue %d trans %d%d: %s", e, ta, tb, regc_error_message());
            from_gpu(c_gpu, dc, nc);
            from_gpu(aux_gpu, daux, nc);
            from_gpu(bg_gpu, dbg, 24);
            assert_close(c_cpu, c_gpu, nc, 1e-3f, "C");
            assert_close(aux_cpu, aux_gpu, nc, 1e-3f, "aux");
            assert_close(bg_cpu, bg_gpu, 24, 1e-3f, "bias_grad");
            gpu->free(gpu, dc);
            gpu->free(gpu, daux);
            gpu->free(gpu, dbg);
            free(c_cpu);
            free(c_gpu);
            free(aux_cpu);
            free(aux_gpu);
        }
    }
    gpu->free(gpu, da);
    gpu->free(gpu, db);
    gpu->free(gpu, dbias);
    free(a);
    free(b);
    free(bias);
    free(aux_in);
}

/* compile.tf32 on the GPU (regc_backend.tf32): an fp32 GEMM multiplies
 * TF32 operands (10 mantissa bits, rounded or cut) with fp32 sums, so it
 * stays within 2^-8 of the exact products' magnitude (each operand within
 * 2^-10, the sums' rounding far below), and it is not the fp32 GEMM: the
 * setting took effect. */
static void test_gemm_tf32(void **state)
{
    (void)state;
    const int64_t m = 128, n = 128, k = 256;
    const size_t na = (size_t)(m * k), nb = (size_t)(k * n), nc = (size_t)(m * n);
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
    float *c32 = malloc(nc * sizeof(float)), *c_tf32 = malloc(nc * sizeof(float));
    regc_rng_fill_uniform(a, na, 5, 0.0f, 1.0f); /* [-1, 1) */
    regc_rng_fill_uniform(b, nb, 6, 0.0f, 1.0f);
    float *da = to_gpu(a, na), *db = to_gpu(b, nb), *dc = gpu->alloc(gpu, nc * sizeof(float));
    assert_true(gpu->has_tf32); /* every GPU the check runs on is sm_80 or later */
    for (int tf32 = 0; tf32 < 2; tf32++) {
        gpu->tf32 = tf32;
        regc_gemm g = {.m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n, .alpha = 1.0f};
        g.a = da, g.b = db, g.c = dc;
        if (gpu->gemm(gpu, &g) != REGC_OK)
            fail_msg("tf32 %d: %s", tf32, regc_error_message());
        from_gpu(tf32 ? c_tf32 : c32, dc, nc);
    }
    gpu->tf32 = 0;
    size_t differ = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double exact = 0.0, size = 0.0;
            for (int64_t p = 0; p < k; p++) {
                exact += (double)a[i * k + p] * (double)b[p * n + j];
                size += fabs((double)a[i * k + p] * (double)b[p * n + j]);
            }
            const float got = c_tf32[i * n + j];
            if (fabs((double)got - exact) > size * 0x1p-8)
                fail_msg("C[%lld, %lld]: tf32 %.7g, exact %.7g (magnitude %.4g)", (long long)i,
                         (long long)j, (double)got, exact, size);
            differ += got != c32[i * n + j];
        }
    printf("tf32: %zu of %zu elements differ from the fp32 GEMM's\n", differ, nc);
    assert_true(differ > 0);
    gpu->free(gpu, da);
    gpu->free(gpu, db);
    gpu->free(gpu, dc);
    free(a), free(b), free(c32), free(c_tf32);
}

static void test_adamw_matches_cpu(void **state)
{
    (void)state;
    const size_t n = 1000;
    float *p = malloc(n * 4), *g = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
    float *p2 = malloc(n * 4);
    regc_rng_fill_uniform(p, n, 5, 0.0f, 1.0f);
    regc_rng_fill_uniform(g, n, 6, 0.0f, 1.0f);
    float *dp = to_gpu(p, n), *dg = to_gpu(g, n), *dm = to_gpu(m, n), *dv = to_gpu(v, n);
    for (int step = 1; step <= 3; step++) { /* step 2 as a group of weight_decay 0 */
        regc_test_adamw(cpu, p, g, m, v, (int64_t)n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step,
                        step != 2);
        regc_test_adamw(gpu, dp, dg, dm, dv, (int64_t)n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step,
                        step != 2);
    }
    from_gpu(p2, dp, n);
    assert_close(p, p2, n, 1e-5f, "param");
    gpu->free(gpu, dp);
    gpu->free(gpu, dg);
    gpu->free(gpu, dm);
    gpu->free(gpu, dv);
    free(p);
    free(g);
    free(m);
    free(v);
    free(p2);
}

/* Attention with its probabilities dropped (or documents' starts docs,
 * [batch, tq], where not NULL), cuda against cpu from the same inputs,
 * site and draw: a mask drawn or applied differently moves values by far
 * more than the tolerance, which covers only the forward's other order of
 * sums. */
static void check_attention(regc_attn_shape s, uint64_t seed, int with_bias, float p,
                            const int32_t *docs)
{
    const size_t nq = regc_test_attn_q_count(&s), nkv = regc_test_attn_kv_count(&s);
    const size_t nl = (size_t)(s.batch * s.n_head * s.tq), nb = (size_t)(s.n_head * s.tq * s.tk);
    const int32_t site = 5 + (int32_t)seed, draw[4] = {(int32_t)seed, 3, 2, 1};
    float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
    regc_test_attention_inputs(gpu, &s, seed, &hq, &hk, &hv, &hdo, &q, &k, &v, &dout);
    float *hb = with_bias ? regc_test_host_uniform(nb, seed + 1, 0.0f, 2.0f) : NULL;
    float *bias = with_bias ? regc_test_upload(gpu, hb, nb) : NULL;
    regc_attn_shape sc = s, sg = s;
    sc.dropout = sg.dropout = p;
    sc.drop_site = &site, sc.drop_draw = draw;
    sg.drop_site = regc_test_upload_ints(gpu, &site, 1);
    sg.drop_draw = regc_test_upload_ints(gpu, draw, 4);
    sc.doc_start = docs;
    sg.doc_start = docs ? regc_test_upload_ints(gpu, docs, (size_t)(s.batch * s.tq)) : NULL;
    float *c[6], *g[6]; /* out, lse, dq, dk, dv, dbias */
    const size_t n[6] = {nq, nl, nq, nkv, nkv, nb};
    for (int i = 0; i < 6; i++)
        c[i] = regc_test_host_floats(n[i]), g[i] = regc_test_dev_nan(gpu, n[i]);
    cpu->attention_fwd(cpu, c[0], c[1], hq, hk, hv, hb, &sc);
    cpu->attention_bwd(cpu, c[2], c[3], c[4], hb ? c[5] : NULL, hdo, hq, hk, hv, hb, c[0], c[1],
                       &sc);
    gpu->attention_fwd(gpu, g[0], g[1], q, k, v, bias, &sg);
    gpu->attention_bwd(gpu, g[2], g[3], g[4], bias ? g[5] : NULL, dout, q, k, v, bias, g[0], g[1],
                       &sg);
    static const char *const name[6] = {"out", "lse", "dq", "dk", "dv", "dbias"};
    for (int i = 0; i < (with_bias ? 6 : 5); i++)
        assert_close(c[i], regc_test_download(gpu, g[i], n[i]), n[i], 1e-4f, name[i]);
}

static void test_attention_dropout_matches_cpu(void **state)
{
    (void)state;
    for (int i = 0; i < REGC_TEST_ATTN_DROP_CASES; i++) {
        const regc_test_attn_drop_case *c = &regc_test_attn_drop_cases[i];
        check_attention(c->s, c->seed, c->bias, c->p, NULL);
    }
}

/* Documents packed in rows, their starts inside and across the kernels'
 * tiles, with a window, with dropout, and one document a row. */
static void test_attention_documents_match_cpu(void **state)
{
    (void)state;
    enum { B = 2, T = 150 };
    static const int starts[B][5] = {{0, 5, 64, 97, T}, {0, T, T, T, T}};
    int32_t docs[B * T];
    for (int b = 0; b < B; b++)
        for (int d = 0; starts[b][d] < T; d++)
            for (int i = starts[b][d]; i < starts[b][d + 1]; i++)
                docs[b * T + i] = starts[b][d];
    regc_attn_shape s = {.batch = B,
                         .tq = T,
                         .tk = T,
                         .n_head = 4,
                         .n_kv_head = 2,
                         .head_dim = 64,
                         .causal = 1,
                         .scale = 0.125f};
    check_attention(s, 70, 0, 0.0f, docs);
    s.window = 40;
    check_attention(s, 71, 0, 0.1f, docs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_epilogues_match_cpu),
        cmocka_unit_test(test_gemm_tf32),
        cmocka_unit_test(test_adamw_matches_cpu),
        regc_test_with_buffers(test_attention_dropout_matches_cpu),
        regc_test_with_buffers(test_attention_documents_match_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
