/* test_kernels_cpu_bf16_storage.c — tensors held in bf16 (compile.precision
 * "bf16" keeps what only bf16 GEMMs read in half the bytes): every kernel
 * that reads or writes one gives the bits of its fp32 counterpart,
 * rounded on store (regc_bf16_bits) where it writes.
 *   - a bf16 GEMM reading A or B held in bf16 gives the bits of the same
 *     GEMM reading the fp32 values they were rounded from, and one writing
 *     C in bf16 gives the fp32 C rounded, with the same aux and bias
 *     gradient: every transpose and epilogue, several k slices, row and
 *     column blocks, one thread or two;
 *   - the norms' y, a fused chain's outputs and the cross-entropy's
 *     dlogits held in bf16 are the fp32 kernels' rounded, the rest of
 *     their outputs unchanged;
 *   - a fused chain reading inputs held in bf16 (full, broadcast, a row's
 *     statistic) gives the bits of the chain reading their fp32 values,
 *     and the chain of no steps converts either way;
 *   - the embedding lookup reading its table held in bf16 (repeated ids,
 *     one thread or two) gives the bits of the lookup reading the fp32
 *     values it holds;
 *   - attention reading q, k, v and out held in bf16 (all or some; GQA and
 *     causal, T5's bias and its gradient; one thread or two) gives the bits
 *     of attention reading their fp32 values, and its out in bf16 is the
 *     fp32 out rounded;
 *   - a GEMM reading B as an NF4 blob (a frozen QLoRA weight) gives the
 *     bits of the GEMM reading the fp32 values it dequantises to;
 *   - what cannot hold: a C held in bf16 that accumulates, a bf16 operand
 *     of an fp32 GEMM, a bf16 chain output over one of its inputs, an
 *     output over a chain's bf16 input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_math.h"
#include "regc_backend.h"
#include "regc_common.h"
#include "test_device.h"

static regc_backend *be;     /* OMP_NUM_THREADS (2 under ctest) */
static regc_backend *serial; /* one thread */

static int group_setup(void **state)
{
    (void)state;
    be = regc_test_cpu_backend(0);
    serial = regc_test_cpu_backend(1);
    return be && serial ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(serial);
    regc_backend_free(be);
    return 0;
}

#define SENTINEL16 0x7e01u /* a NaN no rounding makes: bf16 padding that must come back */

/* n bf16 values as the device holds them (uploaded as floats: pairs of them) */
static uint16_t *upload16(regc_backend *d, const uint16_t *host, size_t n)
{
    uint16_t *pad = calloc(n + 2, sizeof *pad);
    assert_non_null(pad);
    memcpy(pad, host, n * sizeof *pad);
    uint16_t *dev = (uint16_t *)regc_test_upload(d, (const float *)pad, (n + 1) / 2);
    free(pad);
    return dev;
}

static uint16_t *download16(regc_backend *d, const uint16_t *dev, size_t n)
{
    return (uint16_t *)regc_test_download(d, (const float *)dev, (n + 1) / 2);
}

/* x rounded to bf16, each value (its storage) */
static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *h = calloc(n + 2, sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = regc_bf16_bits(x[i]);
    return h;
}

/* Fail unless got[i * ld + j] holds want[i * ld_want + j] rounded to bf16. */
static void expect_rounded(const char *what, const uint16_t *got, int64_t ld, const float *want,
                           int64_t ld_want, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const uint16_t g = got[i * ld + j], w = regc_bf16_bits(want[i * ld_want + j]);
            if (g != w)
                fail_msg("%s: [%lld, %lld] is 0x%04x, the fp32 value %.9g rounds to 0x%04x", what,
                         (long long)i, (long long)j, g, (double)want[i * ld_want + j], w);
        }
}

/* ---- GEMMs ------------------------------------------------------------------- */

typedef struct {
    int ta, tb, acc;
    float alpha; /* 0.625; 1 where a kernel writes whole tiles from its registers */
    regc_epilogue epi;
    int64_t m, n, k, lda, ldb, ldc, ldaux;
    float *a, *b, *c0, *bias, *aux0;
    uint16_t *a16, *b16, *c16_0; /* A and B rounded; C's bf16 start: sentinels */
} storage_case;

static storage_case make_case(int ta, int tb, regc_epilogue epi, int acc, int64_t m, int64_t n,
                              int64_t k, uint64_t seed)
{
    storage_case cs = {
        .ta = ta, .tb = tb, .acc = acc, .alpha = 0.625f, .epi = epi, .m = m, .n = n, .k = k};
    cs.lda = (ta ? m : k) + 3, cs.ldb = (tb ? k : n) + 2, cs.ldc = n + 5, cs.ldaux = n + 4;
    const size_t na = (size_t)((ta ? k : m) * cs.lda), nb = (size_t)((tb ? n : k) * cs.ldb);
    cs.a = regc_test_host_uniform(na, seed + 1, 0.0f, 1.0f);
    cs.b = regc_test_host_uniform(nb, seed + 2, 0.0f, 1.0f);
    cs.c0 = regc_test_host_uniform((size_t)(m * cs.ldc), seed + 3, 0.0f, 1.0f);
    cs.bias = regc_test_host_uniform((size_t)n, seed + 4, 0.2f, 0.5f);
    cs.aux0 = regc_test_host_uniform((size_t)(m * cs.ldaux), seed + 5, 0.0f, 3.0f);
    cs.a16 = to_bf16(cs.a, na);
    cs.b16 = to_bf16(cs.b, nb);
    cs.c16_0 = calloc((size_t)(m * cs.ldc) + 2, sizeof *cs.c16_0);
    assert_non_null(cs.c16_0);
    for (int64_t i = 0; i < m * cs.ldc; i++)
        cs.c16_0[i] = SENTINEL16;
    return cs;
}

static void free_case(storage_case *cs) { free(cs->a16), free(cs->b16), free(cs->c16_0); }

typedef struct {
    float *c, *aux, *bgrad; /* c: fp32 C, or NULL where C is held in bf16 */
    uint16_t *c16;
} gemm_out;

/* The case on d, with A, B and C held as the flags say. */
static gemm_out run_gemm(regc_backend *d, const storage_case *cs, int a16, int b16, int c16)
{
    const size_t na = (size_t)((cs->ta ? cs->k : cs->m) * cs->lda);
    const size_t nb = (size_t)((cs->tb ? cs->n : cs->k) * cs->ldb);
    const size_t nc = (size_t)(cs->m * cs->ldc);
    regc_gemm g = {
        .trans_a = cs->ta,
        .trans_b = cs->tb,
        .m = cs->m,
        .n = cs->n,
        .k = cs->k,
        .a = a16 ? (const float *)upload16(d, cs->a16, na) : regc_test_upload(d, cs->a, na),
        .lda = cs->lda,
        .b = b16 ? (const float *)upload16(d, cs->b16, nb) : regc_test_upload(d, cs->b, nb),
        .ldb = cs->ldb,
        .c = c16 ? (float *)upload16(d, cs->c16_0, nc) : regc_test_upload(d, cs->c0, nc),
        .ldc = cs->ldc,
        .alpha = cs->alpha,
        .accumulate = cs->acc,
        .epilogue = cs->epi,
        .bias = regc_test_upload(d, cs->bias, (size_t)cs->n),
        .aux = regc_test_upload(d, cs->aux0, (size_t)(cs->m * cs->ldaux)),
        .ldaux = cs->ldaux,
        .bias_grad = regc_test_dev_nan(d, (size_t)cs->n),
        .bf16 = 1,
        .a_bf16 = a16,
        .b_bf16 = b16,
        .c_bf16 = c16,
    };
    assert_int_equal(d->gemm(d, &g), REGC_OK);
    assert_int_equal(d->sync(d), REGC_OK);
    gemm_out o = {0};
    if (c16)
        o.c16 = download16(d, (const uint16_t *)g.c, nc);
    else
        o.c = regc_test_download(d, g.c, nc);
    o.aux = regc_test_download(d, g.aux, (size_t)(cs->m * cs->ldaux));
    o.bgrad = regc_test_download(d, g.bias_grad, (size_t)cs->n);
    return o;
}

/* Every storage of A, B and C against the GEMM of fp32 operands and C. */
static void check_storage(regc_backend *d, const storage_case *cs)
{
    char what[200];
    const gemm_out ref = run_gemm(d, cs, 0, 0, 0);
    for (int flags = 1; flags < 8; flags++) {
        const int a16 = flags & 1, b16 = flags >> 1 & 1, c16 = flags >> 2 & 1;
        if (c16 && cs->acc)
            continue; /* refused: test_bf16_storage_refusals */
        snprintf(what, sizeof what,
                 "gemm ta=%d tb=%d %s acc=%d alpha=%g m=%lld n=%lld k=%lld, A %s, B %s, C %s",
                 cs->ta, cs->tb, regc_epilogue_name(cs->epi), cs->acc, (double)cs->alpha,
                 (long long)cs->m, (long long)cs->n, (long long)cs->k, a16 ? "bf16" : "fp32",
                 b16 ? "bf16" : "fp32", c16 ? "bf16" : "fp32");
        const gemm_out got = run_gemm(d, cs, a16, b16, c16);
        if (c16) {
            expect_rounded(what, got.c16, cs->ldc, ref.c, cs->ldc, cs->m, cs->n);
            for (int64_t i = 0; i < cs->m; i++)
                for (int64_t j = cs->n; j < cs->ldc; j++)
                    if (got.c16[i * cs->ldc + j] != SENTINEL16)
                        fail_msg("%s: C padding [%lld, %lld] was written", what, (long long)i,
                                 (long long)j);
        } else {
            regc_test_assert_bitwise_equal(what, got.c, ref.c, (size_t)(cs->m * cs->ldc));
        }
        regc_test_assert_bitwise_equal(what, got.aux, ref.aux, (size_t)(cs->m * cs->ldaux));
        if (cs->epi == REGC_EPI_BGRAD || cs->epi == REGC_EPI_DGELU_BGRAD)
            regc_test_assert_bitwise_equal(what, got.bgrad, ref.bgrad, (size_t)cs->n);
    }
    regc_test_release_all();
}

/* Every transpose and epilogue, with and without accumulation, at shapes
 * off the register tile and past the blocks: k over two and three slices
 * of the bf16 kernel (512) with odd remainders, m past a 264-row block. */
static void test_bf16_gemm_storage(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {13, 37, 19}, {1, 45, 7}, {29, 1, 1}, {40, 70, 1031}, {275, 33, 531}};
    uint64_t seed = 30000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int epi = REGC_EPI_NONE; epi <= REGC_EPI_BGRAD; epi++, seed += 10) {
                    /* accumulation on the small shapes only: it keeps C fp32 */
                    storage_case cs = make_case(ta, tb, (regc_epilogue)epi, s < 2 && (epi & 1),
                                                shapes[s][0], shapes[s][1], shapes[s][2], seed);
                    check_storage(be, &cs);
                    free_case(&cs);
                }
    /* alpha 1, where whole tiles go from the kernel's registers into C */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++, seed += 10) {
            storage_case cs = make_case(ta, tb, REGC_EPI_BIAS_GELU_AUX, 0, 275, 33, 531, seed);
            cs.alpha = 1.0f;
            check_storage(be, &cs);
            free_case(&cs);
        }
}

/* One thread gives the bits two do, bf16 C and operands included. */
static void test_bf16_gemm_storage_one_thread(void **state)
{
    (void)state;
    storage_case cs = make_case(0, 1, REGC_EPI_BIAS_GELU_AUX, 0, 275, 70, 1031, 31000);
    const gemm_out two = run_gemm(be, &cs, 1, 1, 1), one = run_gemm(serial, &cs, 1, 1, 1);
    if (memcmp(one.c16, two.c16, (size_t)(cs.m * cs.ldc) * sizeof(uint16_t)))
        fail_msg("a bf16 C depends on the thread count");
    regc_test_assert_bitwise_equal("aux, one thread", one.aux, two.aux, (size_t)(cs.m * cs.ldaux));
    free_case(&cs);
}

static void test_bf16_storage_refusals(void **state)
{
    (void)state;
    float *x = regc_test_upload(be, (float[16]){0}, 16);
    regc_gemm g = {.m = 2,
                   .n = 2,
                   .k = 2,
                   .a = x,
                   .lda = 2,
                   .b = x + 4,
                   .ldb = 2,
                   .c = x + 8,
                   .ldc = 2,
                   .alpha = 1.0f,
                   .bf16 = 1,
                   .c_bf16 = 1,
                   .accumulate = 1};
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "cannot accumulate"));
    g.accumulate = 0, g.bf16 = 0, g.c_bf16 = 0, g.a_bf16 = 1;
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "needs a bf16 GEMM"));

    /* a chain's bf16 output over its own input */
    regc_ew_program p = {.n_inputs = 1, .n_steps = 1, .n_outputs = 1};
    p.steps[0] = (regc_ew_step){.op = REGC_EW_GELU, .a = 0};
    p.out_reg[0] = 1;
    float *outs[1] = {x};
    const float *ins[1] = {x};
    be->elementwise(be, &p, 8, outs, ins, 1u, 0u);
    assert_int_equal(be->sync(be), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "held in bf16 and overwrites input 0"));
    regc_test_release_all();
}

/* ---- B held in NF4 -------------------------------------------------------------- */

/* A random NF4 blob of n values: any bytes are a valid one, with a finite
 * offset and nested absmaxes. Returned as floats, ready to upload. */
static float *random_nf4_blob(int64_t n, uint64_t seed, size_t *floats)
{
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    *floats = (size_t)(l.bytes + 3) / 4;
    float *blob = regc_test_host_uniform(*floats, seed, 0.0f, 1.0f);
    uint8_t *bytes = (uint8_t *)blob;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = l.q8_at; i < l.bytes; i++) { /* q8 and the packed nibbles */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        bytes[i] = (uint8_t)(x >> 24);
    }
    blob[0] = 0.03125f;                           /* the offset */
    for (int64_t b = 0; b < l.nested_blocks; b++) /* the nested absmaxes, in [0.5, 1.5) */
        ((float *)(bytes + l.nested_at))[b] = 1.0f + blob[1 + b] * 0.5f;
    return blob;
}

/* The n values of a blob, dequantised on the host by nf4_format.h's
 * formula (tracked: released). */
static float *dequantised(const float *blob, int64_t n)
{
    static const float levels[16] = REGC_NF4_LEVELS, map[256] = REGC_NF4_DYNAMIC_MAP;
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    float *x = regc_test_host_floats((size_t)n);
    /* value by value, apart from regc_nf4_read's runs that the GEMM uses */
    for (int64_t e = 0; e < n; e++)
        x[e] = levels[regc_nf4_index((const uint8_t *)blob, &l, e)] *
               regc_nf4_absmax((const uint8_t *)blob, &l, map, e / REGC_NF4_BLOCK);
    return x;
}

/* A GEMM reading B as an NF4 blob gives the bits of the same GEMM reading
 * the fp32 values the blob dequantises to (nf4_format.h's formula, on the
 * host): B as stored and transposed, fp32 and bf16, through the epilogues
 * (BGRAD sums B itself), at shapes whose k crosses slices and whose n
 * crosses the strips and NF4's blocks off their edges, on one thread and
 * two. */
static void test_nf4_gemm(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {3, 37, 19}, {40, 70, 1031}, {275, 129, 300}, {1, 4200, 65}};
    uint64_t seed = 40000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tb = 0; tb < 2; tb++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                for (int e = 0; e < 4; e++, seed += 10) {
                    static const regc_epilogue epis[4] = {REGC_EPI_NONE, REGC_EPI_BIAS,
                                                          REGC_EPI_BIAS_GELU_AUX, REGC_EPI_BGRAD};
                    const regc_epilogue epi = epis[e];
                    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                    size_t blob_floats;
                    float *blob = random_nf4_blob(n * k, seed, &blob_floats);
                    float *b = dequantised(blob, n * k);
                    float *a = regc_test_host_uniform((size_t)(m * k), seed + 1, 0.0f, 1.0f);
                    float *bias = regc_test_host_uniform((size_t)n, seed + 2, 0.0f, 1.0f);
                    for (int threads = 1; threads <= 2; threads++) {
                        regc_backend *d = threads == 1 ? serial : be;
                        float *out[2], *bgrad[2], *aux[2];
                        for (int nf4 = 0; nf4 < 2; nf4++) {
                            regc_gemm g = {
                                .trans_b = tb,
                                .m = m,
                                .n = n,
                                .k = k,
                                .a = regc_test_upload(d, a, (size_t)(m * k)),
                                .lda = k,
                                .b = regc_test_upload(d, nf4 ? blob : b,
                                                      nf4 ? blob_floats : (size_t)(n * k)),
                                .ldb = tb ? k : n,
                                .c = regc_test_dev_nan(d, (size_t)(m * n)),
                                .ldc = n,
                                .alpha = 1.0f,
                                .epilogue = epi,
                                .bias = regc_test_upload(d, bias, (size_t)n),
                                .aux = regc_test_dev_nan(d, (size_t)(m * n)),
                                .ldaux = n,
                                .bias_grad = regc_test_dev_nan(d, (size_t)n),
                                .bf16 = bf16,
                                .b_nf4 = nf4,
                            };
                            assert_int_equal(d->gemm(d, &g), REGC_OK);
                            assert_int_equal(d->sync(d), REGC_OK);
                            out[nf4] = regc_test_download(d, g.c, (size_t)(m * n));
                            bgrad[nf4] = regc_test_download(d, g.bias_grad, (size_t)n);
                            aux[nf4] = regc_test_download(d, g.aux, (size_t)(m * n));
                        }
                        char what[160];
                        snprintf(what, sizeof what,
                                 "NF4 B: m=%lld n=%lld k=%lld tb=%d bf16=%d %s, %d thread(s)",
                                 (long long)m, (long long)n, (long long)k, tb, bf16,
                                 regc_epilogue_name(epi), threads);
                        regc_test_assert_bitwise_equal(what, out[1], out[0], (size_t)(m * n));
                        regc_test_assert_bitwise_equal(what, aux[1], aux[0], (size_t)(m * n));
                        if (epi == REGC_EPI_BGRAD)
                            regc_test_assert_bitwise_equal(what, bgrad[1], bgrad[0], (size_t)n);
                    }
                    regc_test_release_all();
                }
}

/* B held in NF4 must be contiguous and is never bf16 as well. */
static void test_nf4_gemm_refusals(void **state)
{
    (void)state;
    float *x = regc_test_upload(be, (float[64]){0}, 64);
    regc_gemm g = {.m = 2,
                   .n = 2,
                   .k = 2,
                   .a = x,
                   .lda = 2,
                   .b = x + 8,
                   .ldb = 3,
                   .c = x + 32,
                   .ldc = 2,
                   .alpha = 1.0f,
                   .b_nf4 = 1};
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "NF4 must be contiguous"));
    g.ldb = 2, g.bf16 = 1, g.b_bf16 = 1;
    assert_int_equal(be->gemm(be, &g), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "not also bf16"));
    regc_test_release_all();
}

/* ---- the other kernels --------------------------------------------------------- */

#define ROWS 37
#define COLS 133 /* past a vector, odd */

/* LayerNorm, RMSNorm and their fused residual adds: y held in bf16 is the
 * fp32 y rounded; mean, rstd and the sum keep their bits. */
static void test_bf16_norm_outputs(void **state)
{
    (void)state;
    const size_t rc = (size_t)ROWS * COLS;
    float *hx = regc_test_host_uniform(rc, 32001, 0.5f, 2.0f);
    float *hb = regc_test_host_uniform(rc, 32002, 0.0f, 1.0f);
    float *hw = regc_test_host_uniform(COLS, 32003, 1.0f, 0.5f);
    float *hbias = regc_test_host_uniform(COLS, 32004, 0.0f, 0.5f);
    const float *x = regc_test_upload(be, hx, rc), *b = regc_test_upload(be, hb, rc);
    const float *w = regc_test_upload(be, hw, COLS), *bias = regc_test_upload(be, hbias, COLS);
    for (int kind = 0; kind < 4; kind++) { /* layernorm, rmsnorm, add + each */
        const int ln = kind % 2 == 0, add = kind >= 2;
        float *y[2], *mean[2], *rstd[2], *sum[2];
        for (int s = 0; s < 2; s++) { /* s: y in bf16 */
            y[s] = regc_test_dev_nan(be, rc), mean[s] = regc_test_dev_nan(be, ROWS);
            rstd[s] = regc_test_dev_nan(be, ROWS), sum[s] = regc_test_dev_nan(be, rc);
            if (ln && add)
                be->add_layernorm_fwd(be, sum[s], y[s], mean[s], rstd[s], x, b, w, bias, ROWS, COLS,
                                      1e-5f, s);
            else if (ln)
                be->layernorm_fwd(be, y[s], mean[s], rstd[s], x, w, bias, ROWS, COLS, 1e-5f, s);
            else if (add)
                be->add_rmsnorm_fwd(be, sum[s], y[s], rstd[s], x, b, w, ROWS, COLS, 1e-6f, s);
            else
                be->rmsnorm_fwd(be, y[s], rstd[s], x, w, ROWS, COLS, 1e-6f, s);
            assert_int_equal(be->sync(be), REGC_OK);
        }
        static const char *const names[4] = {"layernorm", "rmsnorm", "add_layernorm",
                                             "add_rmsnorm"};
        float *y32 = regc_test_download(be, y[0], rc);
        uint16_t *y16 = download16(be, (const uint16_t *)y[1], rc);
        expect_rounded(names[kind], y16, COLS, y32, COLS, ROWS, COLS);
        regc_test_assert_bitwise_equal(names[kind], regc_test_download(be, rstd[1], ROWS),
                                       regc_test_download(be, rstd[0], ROWS), ROWS);
        if (ln)
            regc_test_assert_bitwise_equal(names[kind], regc_test_download(be, mean[1], ROWS),
                                           regc_test_download(be, mean[0], ROWS), ROWS);
        if (add)
            regc_test_assert_bitwise_equal(names[kind], regc_test_download(be, sum[1], rc),
                                           regc_test_download(be, sum[0], rc), rc);
    }
    regc_test_release_all();
}

/* A chain of two outputs (bias add, then GELU of it), each in either
 * storage: a bf16 one is the fp32 one rounded, the other keeps its bits. */
static void test_bf16_chain_outputs(void **state)
{
    (void)state;
    const int64_t n = ROWS * COLS;
    regc_ew_program p = {.n_inputs = 2, .n_steps = 2, .n_outputs = 2};
    p.period[1] = COLS;
    p.steps[0] = (regc_ew_step){.op = REGC_EW_ADD, .a = 0, .b = 1};
    p.steps[1] = (regc_ew_step){.op = REGC_EW_GELU, .a = 2};
    p.out_reg[0] = 2, p.out_reg[1] = 3;
    float *hx = regc_test_host_uniform((size_t)n, 33001, 0.0f, 3.0f);
    float *hb = regc_test_host_uniform(COLS, 33002, 0.0f, 1.0f);
    const float *ins[2] = {regc_test_upload(be, hx, (size_t)n), regc_test_upload(be, hb, COLS)};
    float *ref[2] = {regc_test_dev_nan(be, (size_t)n), regc_test_dev_nan(be, (size_t)n)};
    be->elementwise(be, &p, n, ref, ins, 0u, 0u);
    float *want[2] = {regc_test_download(be, ref[0], (size_t)n),
                      regc_test_download(be, ref[1], (size_t)n)};
    for (unsigned mask = 1; mask < 4; mask++) {
        float *outs[2] = {regc_test_dev_nan(be, (size_t)n), regc_test_dev_nan(be, (size_t)n)};
        be->elementwise(be, &p, n, outs, ins, mask, 0u);
        assert_int_equal(be->sync(be), REGC_OK);
        for (int k = 0; k < 2; k++) {
            char what[64];
            snprintf(what, sizeof what, "chain output %d, mask %u", k, mask);
            if (mask >> k & 1u)
                expect_rounded(what, download16(be, (const uint16_t *)outs[k], (size_t)n), n,
                               want[k], n, 1, n);
            else
                regc_test_assert_bitwise_equal(what, regc_test_download(be, outs[k], (size_t)n),
                                               want[k], (size_t)n);
        }
    }
    regc_test_release_all();
}

/* A chain reading inputs held in bf16 (a full one, a bias of period COLS,
 * a row statistic of inner COLS), in every combination, at two threads
 * and one: the bits of the same chain reading the fp32 values they hold.
 * And the program of no steps converts: fp32 to bf16 is the fp32 value
 * rounded, bf16 to fp32 its value exactly. */
static void test_bf16_chain_inputs(void **state)
{
    (void)state;
    const int64_t n = ROWS * COLS;
    regc_ew_program p = {.n_inputs = 3, .n_steps = 3, .n_outputs = 2};
    p.period[1] = COLS, p.inner[2] = COLS;
    p.steps[0] = (regc_ew_step){.op = REGC_EW_ADD, .a = 0, .b = 1};
    p.steps[1] = (regc_ew_step){.op = REGC_EW_SILU, .a = 3};
    p.steps[2] = (regc_ew_step){.op = REGC_EW_MUL, .a = 4, .b = 2};
    p.out_reg[0] = 5, p.out_reg[1] = 3;
    const size_t len[3] = {(size_t)n, COLS, ROWS};
    float *h[3];
    uint16_t *h16[3];
    for (int i = 0; i < 3; i++) { /* values bf16 holds exactly */
        h[i] = regc_test_host_uniform(len[i], 35001 + (uint64_t)i, 0.0f, 3.0f);
        h16[i] = to_bf16(h[i], len[i]);
        for (size_t j = 0; j < len[i]; j++)
            h[i][j] = regc_bf16_value(h16[i][j]);
    }
    regc_backend *const bes[2] = {be, serial};
    for (int t = 0; t < 2; t++) {
        regc_backend *d = bes[t];
        const float *wide[3], *half[3];
        for (int i = 0; i < 3; i++) {
            wide[i] = regc_test_upload(d, h[i], len[i]);
            half[i] = (const float *)upload16(d, h16[i], len[i]);
        }
        float *ref[2] = {regc_test_dev_nan(d, (size_t)n), regc_test_dev_nan(d, (size_t)n)};
        d->elementwise(d, &p, n, ref, wide, 0u, 0u);
        float *want[2] = {regc_test_download(d, ref[0], (size_t)n),
                          regc_test_download(d, ref[1], (size_t)n)};
        for (unsigned mask = 1; mask < 8; mask++) {
            const float *ins[3];
            for (int i = 0; i < 3; i++)
                ins[i] = mask >> i & 1u ? half[i] : wide[i];
            float *outs[2] = {regc_test_dev_nan(d, (size_t)n), regc_test_dev_nan(d, (size_t)n)};
            d->elementwise(d, &p, n, outs, ins, 0u, mask);
            assert_int_equal(d->sync(d), REGC_OK);
            for (int k = 0; k < 2; k++) {
                char what[80];
                snprintf(what, sizeof what, "chain output %d, inputs in bf16 %u, %s", k, mask,
                         t ? "one thread" : "two threads");
                regc_test_assert_bitwise_equal(what, regc_test_download(d, outs[k], (size_t)n),
                                               want[k], (size_t)n);
            }
        }
        /* the conversions */
        const regc_ew_program convert = {.n_inputs = 1, .n_outputs = 1, .out_reg = {0}};
        float *hx = regc_test_host_uniform((size_t)n, 35011, 0.0f, 3.0f);
        const float *x[1] = {regc_test_upload(d, hx, (size_t)n)};
        float *narrow[1] = {regc_test_dev_nan(d, (size_t)n)};
        d->elementwise(d, &convert, n, narrow, x, 1u, 0u);
        float *widened[1] = {regc_test_dev_nan(d, (size_t)n)};
        d->elementwise(d, &convert, n, widened, (const float *const *)narrow, 0u, 1u);
        assert_int_equal(d->sync(d), REGC_OK);
        expect_rounded("fp32 to bf16", download16(d, (const uint16_t *)narrow[0], (size_t)n), n, hx,
                       n, 1, n);
        float *back = regc_test_download(d, widened[0], (size_t)n);
        for (int64_t j = 0; j < n; j++)
            if (regc_float_to_bits(back[j]) != (uint32_t)regc_bf16_bits(hx[j]) << 16)
                fail_msg("bf16 to fp32: element %lld is %.9g, not %.9g rounded", (long long)j,
                         (double)back[j], (double)hx[j]);
        /* an output over an input held in bf16 is refused */
        d->elementwise(d, &convert, n, (float *const *)narrow, (const float *const *)narrow, 0u,
                       1u);
        assert_int_not_equal(d->sync(d), REGC_OK);
        assert_non_null(strstr(regc_error_message(), "overwrites input 0, held in bf16"));
    }
    for (int i = 0; i < 3; i++)
        free(h16[i]);
    regc_test_release_all();
}

/* The cross-entropy's dlogits in bf16, ignored rows (zeros) included. */
static void test_bf16_dlogits(void **state)
{
    (void)state;
    const size_t rc = (size_t)ROWS * COLS;
    float *hx = regc_test_host_uniform(rc, 34001, 0.0f, 4.0f);
    int32_t targets[ROWS];
    for (int r = 0; r < ROWS; r++)
        targets[r] = r % 5 == 3 ? -100 : (r * 7) % COLS;
    const float *x = regc_test_upload(be, hx, rc);
    const int32_t *t = regc_test_upload_ints(be, targets, ROWS);
    float *loss = regc_test_dev_nan(be, 1), *lse = regc_test_dev_nan(be, ROWS);
    const float one = 1.0f;
    const float *dloss = regc_test_upload(be, &one, 1);
    be->cross_entropy_fwd(be, loss, lse, x, t, ROWS, COLS);
    float *d32 = regc_test_dev_nan(be, rc), *d16 = regc_test_dev_nan(be, rc);
    be->cross_entropy_bwd(be, d32, dloss, x, t, lse, ROWS, COLS, 0, ROWS, 0);
    be->cross_entropy_bwd(be, d16, dloss, x, t, lse, ROWS, COLS, 0, ROWS, 1);
    assert_int_equal(be->sync(be), REGC_OK);
    expect_rounded("dlogits", download16(be, (const uint16_t *)d16, rc), COLS,
                   regc_test_download(be, d32, rc), COLS, ROWS, COLS);
    regc_test_release_all();
}

/* The embedding lookup reading its table held in bf16 (a frozen embedding
 * of a base held in bf16), at two threads and one, over ids that repeat
 * and reach both ends of the table: the bits of the lookup reading the
 * fp32 table of the values it holds. Enough rows that two threads split
 * the loop; signed zeros, a subnormal, infinities and a NaN among the
 * values, each widened exactly. */
static void test_bf16_embedding_table(void **state)
{
    (void)state;
    const int64_t vocab = 61, rows = 300;
    const size_t tn = (size_t)vocab * COLS, n = (size_t)rows * COLS;
    float *h = regc_test_host_uniform(tn, 36001, 0.0f, 3.0f);
    static const float specials[] = {0.0f, -0.0f, 1e-40f, INFINITY, -INFINITY, NAN};
    for (size_t j = 0; j < sizeof specials / sizeof specials[0]; j++)
        h[j * 97] = specials[j];
    uint16_t *h16 = to_bf16(h, tn);
    for (size_t j = 0; j < tn; j++) /* the values the bf16 table holds */
        h[j] = regc_bf16_value(h16[j]);
    int32_t ids[300];
    for (int64_t r = 0; r < rows; r++) /* many repeats, the first and last rows */
        ids[r] = r % 5 == 0    ? 3
                 : r % 11 == 0 ? (int32_t)(vocab - 1)
                 : r % 13 == 0 ? 0
                               : (int32_t)((r * 7) % vocab);
    regc_backend *const bes[2] = {be, serial};
    for (int t = 0; t < 2; t++) {
        regc_backend *d = bes[t];
        const int32_t *dev_ids = regc_test_upload_ints(d, ids, (size_t)rows);
        const float *wide = regc_test_upload(d, h, tn);
        const float *half = (const float *)upload16(d, h16, tn);
        float *want = regc_test_dev_nan(d, n), *got = regc_test_dev_nan(d, n);
        d->embedding_fwd(d, want, dev_ids, wide, rows, COLS, 0);
        d->embedding_fwd(d, got, dev_ids, half, rows, COLS, 1);
        assert_int_equal(d->sync(d), REGC_OK);
        regc_test_assert_bitwise_equal(
            t ? "embedding, table in bf16, one thread" : "embedding, table in bf16, two threads",
            regc_test_download(d, got, n), regc_test_download(d, want, n), n);
    }
    free(h16);
    regc_test_release_all();
}

/* ---- attention ---------------------------------------------------------------- */

/* n bf16 values widened, as fp32 device memory */
static float *widened(regc_backend *d, const uint16_t *h16, size_t n)
{
    float *h = malloc((n + 1) * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = regc_bf16_value(h16[i]);
    float *dev = regc_test_upload(d, h, n);
    free(h);
    return dev;
}

/* Attention reading q, k, v (and, backward, out) held in bf16 as `flags`
 * names them gives the bits of attention reading their values widened into
 * fp32, and writes out rounded where out is bf16. */
static void check_attention_bf16(regc_backend *d, regc_attn_shape s, unsigned flags, int bias)
{
    const size_t nq = regc_test_attn_q_count(&s), nkv = regc_test_attn_kv_count(&s);
    const size_t nl = (size_t)(s.batch * s.n_head * s.tq), nb = (size_t)(s.n_head * s.tq * s.tk);
    uint16_t *h16[3] = {to_bf16(regc_test_host_uniform(nq, 35001, 0.0f, 1.0f), nq),
                        to_bf16(regc_test_host_uniform(nkv, 35002, 0.0f, 1.0f), nkv),
                        to_bf16(regc_test_host_uniform(nkv, 35003, 0.0f, 1.0f), nkv)};
    const size_t n[3] = {nq, nkv, nkv};
    const unsigned bit[3] = {REGC_ATTN_Q_BF16, REGC_ATTN_K_BF16, REGC_ATTN_V_BF16};
    const float *x32[3], *x[3]; /* x: as the bf16 run reads them */
    for (int i = 0; i < 3; i++) {
        x32[i] = widened(d, h16[i], n[i]);
        x[i] = flags & bit[i] ? (const float *)upload16(d, h16[i], n[i]) : x32[i];
    }
    const float *b =
        bias ? regc_test_upload(d, regc_test_host_uniform(nb, 35004, 0.0f, 1.0f), nb) : NULL;
    const float *dout = regc_test_upload(d, regc_test_host_uniform(nq, 35005, 0.0f, 1.0f), nq);
    const int o16 = (flags & REGC_ATTN_OUT_BF16) != 0;

    /* forward: the fp32 run, then the bf16 one */
    regc_attn_shape s16 = s;
    s16.bf16 = flags;
    float *out32 = regc_test_dev_nan(d, nq), *lse32 = regc_test_dev_nan(d, nl);
    float *out = regc_test_dev_nan(d, nq), *lse = regc_test_dev_nan(d, nl);
    d->attention_fwd(d, out32, lse32, x32[0], x32[1], x32[2], b, &s);
    d->attention_fwd(d, out, lse, x[0], x[1], x[2], b, &s16);
    assert_int_equal(d->sync(d), REGC_OK);
    float *h_out32 = regc_test_download(d, out32, nq);
    regc_test_assert_bitwise_equal("attention lse", regc_test_download(d, lse, nl),
                                   regc_test_download(d, lse32, nl), nl);
    uint16_t *h_out16 = to_bf16(h_out32, nq);
    if (o16)
        expect_rounded("attention out", download16(d, (const uint16_t *)out, nq), 1, h_out32, 1, 1,
                       (int64_t)nq);
    else
        regc_test_assert_bitwise_equal("attention out", regc_test_download(d, out, nq), h_out32,
                                       nq);

    /* backward: the fp32 run reads out's values as the bf16 run holds them */
    const float *out_ref = o16 ? widened(d, h_out16, nq) : out32;
    float *g32[4], *g[4];
    const size_t gn[4] = {nq, nkv, nkv, nb};
    for (int i = 0; i < 4; i++)
        g32[i] = regc_test_dev_nan(d, gn[i]), g[i] = regc_test_dev_nan(d, gn[i]);
    d->attention_bwd(d, g32[0], g32[1], g32[2], bias ? g32[3] : NULL, dout, x32[0], x32[1], x32[2],
                     b, out_ref, lse32, &s);
    d->attention_bwd(d, g[0], g[1], g[2], bias ? g[3] : NULL, dout, x[0], x[1], x[2], b, out, lse,
                     &s16);
    assert_int_equal(d->sync(d), REGC_OK);
    static const char *const names[4] = {"attention dq", "attention dk", "attention dv",
                                         "attention dbias"};
    for (int i = 0; i < (bias ? 4 : 3); i++)
        regc_test_assert_bitwise_equal(names[i], regc_test_download(d, g[i], gn[i]),
                                       regc_test_download(d, g32[i], gn[i]), gn[i]);
    for (int i = 0; i < 3; i++)
        free(h16[i]);
    free(h_out16);
}

static void test_bf16_attention(void **state)
{
    (void)state;
    const unsigned all =
        REGC_ATTN_Q_BF16 | REGC_ATTN_K_BF16 | REGC_ATTN_V_BF16 | REGC_ATTN_OUT_BF16;
    /* GQA, causal, head_dim 19 (blocks and a tail); T5: a bias, tq != tk */
    const regc_attn_shape gqa = {3, 37,   37, 6,    2,    19,   1,   0.2294157f,
                                 0, 0.0f, 0,  0.0f, NULL, NULL, NULL};
    const regc_attn_shape t5 = {3, 11, 29, 4, 4, 8, 0, 1.0f, 0, 0.0f, 0, 0.0f, NULL, NULL, NULL};
    for (int threads = 0; threads < 2; threads++) {
        regc_backend *d = threads ? be : serial;
        check_attention_bf16(d, gqa, all, 0);
        check_attention_bf16(d, t5, all, 1);
        /* each operand alone, and out without q (the bias gradient's rows) */
        check_attention_bf16(d, gqa, REGC_ATTN_K_BF16, 0);
        check_attention_bf16(d, t5, REGC_ATTN_OUT_BF16, 1);
        check_attention_bf16(d, t5, REGC_ATTN_Q_BF16 | REGC_ATTN_V_BF16, 1);
    }
    regc_test_release_all();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_bf16_gemm_storage),
        regc_test_with_buffers(test_bf16_gemm_storage_one_thread),
        regc_test_with_buffers(test_bf16_storage_refusals),
        regc_test_with_buffers(test_nf4_gemm),
        regc_test_with_buffers(test_nf4_gemm_refusals),
        regc_test_with_buffers(test_bf16_norm_outputs),
        regc_test_with_buffers(test_bf16_chain_outputs),
        regc_test_with_buffers(test_bf16_chain_inputs),
        regc_test_with_buffers(test_bf16_dlogits),
        regc_test_with_buffers(test_bf16_embedding_table),
        regc_test_with_buffers(test_bf16_attention),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
