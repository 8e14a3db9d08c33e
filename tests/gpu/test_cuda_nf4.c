/* test_cuda_nf4.c — a GEMM whose B is held in NF4 (regc_gemm.b_nf4) on the
 * CUDA backend, against the same GEMM on the CPU backend with B
 * dequantised on the host by nf4_format.h's own formula (ctest label "gpu").
 * Without a usable GPU this test fails: a GPU run that silently tests
 * nothing would look like a pass.
 *
 * Each blob is random bytes — any bytes are a blob — with an offset and
 * positive nested absmaxes written over its first floats. The shapes make
 * k and n no multiples of 64, k * n odd (a last value alone in its byte)
 * and above 64 * 256 values (two nested absmaxes). For trans_b 0 and 1, in
 * fp32 and in bf16:
 * - C and BGRAD's bias gradient against the CPU's: the same rounded
 *   operands summed in another order, so within that order's error bound;
 * - A = identity: C is op(B) itself, so the dequantised values (rounded to
 *   bf16 in a bf16 GEMM) must be the host's exactly;
 * - gemm_prepare makes the plan the call uses: the call queries nothing
 *   (a captured step must not plan);
 * - a captured call, launched as a graph, gives the same values as the
 *   host: the dequantising pass and its scratch record into a graph. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernel_math.h"
#include "regc_backend.h"
#include "regc_common.h"

static regc_backend *cpu, *gpu;

static const float nf4_levels[16] = REGC_NF4_LEVELS;
static const float nf4_dynamic_map[256] = REGC_NF4_DYNAMIC_MAP;

/* m rows of A, and B's k x n: neither k nor n a multiple of 64, k * n odd
 * and over 64 * 256 */
enum { M = 37, K = 133, N = 151 };

static int setup(void **state)
{
    (void)state;
    cpu = regc_backend_cpu_new(0);
    gpu = regc_backend_new("cuda", 0);
    if (!cpu || !gpu) {
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

static void *to_gpu(const void *h, size_t bytes)
{
    void *d = gpu->alloc(gpu, bytes);
    assert_non_null(d);
    gpu->copy_h2d(gpu, d, h, bytes);
    return d;
}

static void from_gpu(void *h, const void *d, size_t bytes)
{
    gpu->copy_d2h(gpu, h, d, bytes);
    if (gpu->sync(gpu) != REGC_OK)
        fail_msg("cuda: %s", regc_error_message());
}

/* splitmix64: the blob's bytes */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A blob of count values: random q8 and packed bytes, an offset, and
 * nested absmaxes in [0.5, 1.5]. */
static uint8_t *make_blob(int64_t count, uint64_t seed)
{
    const regc_nf4_layout_t l = regc_nf4_layout(count);
    uint8_t *blob = malloc((size_t)l.bytes);
    assert_non_null(blob);
    uint64_t s = seed;
    for (int64_t i = 0; i < l.bytes; i++)
        blob[i] = (uint8_t)(next_u64(&s) >> 56);
    const float offset = 0.03125f;
    memcpy(blob, &offset, sizeof offset);
    float *nested = malloc((size_t)l.nested_blocks * sizeof *nested);
    assert_non_null(nested);
    regc_rng_fill_uniform(nested, (size_t)l.nested_blocks, seed + 1, 1.0f, 0.5f);
    memcpy(blob + l.nested_at, nested, (size_t)l.nested_blocks * sizeof *nested);
    free(nested);
    return blob;
}

/* The blob's values in fp32, as the CPU dequantises them. */
static float *host_dequant(const uint8_t *blob, int64_t count)
{
    const regc_nf4_layout_t l = regc_nf4_layout(count);
    float *v = malloc((size_t)count * sizeof *v);
    assert_non_null(v);
    regc_nf4_read(blob, &l, nf4_levels, nf4_dynamic_map, 0, count, v, 1);
    return v;
}

static float rounded(float x, int bf16) { return bf16 ? regc_round_bf16(x) : x; }

/* op(B)[p, j] of B stored [k, n] (or [n, k] when trans_b) */
static float op_b(const float *b, int trans_b, int64_t p, int64_t j)
{
    return trans_b ? b[j * K + p] : b[p * N + j];
}

/* C = A op(B) with A [m, K] random and B an NF4 blob, BGRAD's bias
 * gradient beside it: the GPU on the blob, the CPU on its host
 * dequantisation. */
static void test_gemm_matches_cpu(void **state)
{
    (void)state;
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *a = malloc(na * sizeof *a);
    assert_non_null(a);
    regc_rng_fill_uniform(a, na, 11, 0.0f, 1.0f);
    float *da = to_gpu(a, na * sizeof *a);
    for (int t = 0; t < 4; t++) {
        const int trans_b = t & 1, bf16 = t >> 1;
        uint8_t *blob = make_blob((int64_t)nb, 100 + (uint64_t)t);
        const regc_nf4_layout_t l = regc_nf4_layout((int64_t)nb);
        float *bq = host_dequant(blob, (int64_t)nb);
        void *dblob = to_gpu(blob, (size_t)l.bytes);
        float *c_cpu = calloc(nc, sizeof(float)), *c_gpu = calloc(nc, sizeof(float));
        float bg_cpu[N] = {0}, bg_gpu[N] = {0};
        float *dc = to_gpu(c_gpu, nc * sizeof(float)), *dbg = to_gpu(bg_cpu, sizeof bg_cpu);
        for (int e = 0; e < 2; e++) {
            regc_gemm g = {.trans_b = trans_b,
                           .m = M,
                           .n = N,
                           .k = K,
                           .lda = K,
                           .ldb = trans_b ? K : N,
                           .ldc = N,
                           .alpha = 1.0f,
                           .epilogue = e ? REGC_EPI_BGRAD : REGC_EPI_NONE,
                           .bf16 = bf16};
            g.a = a, g.b = bq, g.c = c_cpu, g.bias_grad = bg_cpu;
            assert_int_equal(cpu->gemm(cpu, &g), REGC_OK);
            g.a = da, g.b = (const float *)dblob, g.c = dc, g.bias_grad = dbg, g.b_nf4 = 1;
            if (gpu->gemm_prepare(gpu, &g) != REGC_OK)
                fail_msg("prepare, trans_b %d bf16 %d: %s", trans_b, bf16, regc_error_message());
            const int64_t queries = gpu->tuning_queries;
            if (gpu->gemm(gpu, &g) != REGC_OK)
                fail_msg("trans_b %d bf16 %d: %s", trans_b, bf16, regc_error_message());
            from_gpu(c_gpu, dc, nc * sizeof(float));
            from_gpu(bg_gpu, dbg, sizeof bg_gpu);
            if (gpu->tuning_queries != queries)
                fail_msg("trans_b %d bf16 %d: the call planned again (prepare's key differs)",
                         trans_b, bf16);
            /* Both sides sum the same rounded products in fp32, in
             * different orders; each order is within 2 k u sum |a b| of the
             * exact sum even where the accumulation truncates (u = 2^-24),
             * so the two are within twice that. A wrong value of B is off
             * by a sizeable part of sum |a b|. */
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = 0.0;
                    for (int64_t p = 0; p < K; p++)
                        s += fabs((double)rounded(a[i * K + p], bf16) *
                                  rounded(op_b(bq, trans_b, p, j), bf16));
                    const double want = c_cpu[i * N + j], got = c_gpu[i * N + j];
                    if (fabs(got - want) > 4.0 * K * 0x1p-24 * s)
                        fail_msg("trans_b %d bf16 %d epilogue %d: C[%lld, %lld] cpu %.9g cuda "
                                 "%.9g",
                                 trans_b, bf16, e, (long long)i, (long long)j, want, got);
                }
            for (int64_t j = 0; e && j < N; j++) {
                double s = 0.0;
                for (int64_t p = 0; p < K; p++)
                    s += fabs((double)rounded(op_b(bq, trans_b, p, j), bf16));
                if (fabs((double)bg_gpu[j] - bg_cpu[j]) > 4.0 * K * 0x1p-24 * s)
                    fail_msg("trans_b %d bf16 %d: bias_grad[%lld] cpu %.9g cuda %.9g", trans_b,
                             bf16, (long long)j, bg_cpu[j], bg_gpu[j]);
            }
        }
        gpu->free(gpu, dblob);
        gpu->free(gpu, dc);
        gpu->free(gpu, dbg);
        free(blob);
        free(bq);
        free(c_cpu);
        free(c_gpu);
    }
    gpu->free(gpu, da);
    free(a);
}

/* A = I [K, K], so C = op(B) [K, N]: each value of the dequantised B, bit
 * for bit. Every term but one is an exact zero and the scale is 1, so the
 * sum is that value in any order. The values are finite, so == is the
 * comparison of bits but for the sign of a zero (B's -0 summed with +0
 * terms gives +0). With captured, the call is recorded into a graph first
 * and the graph launched. */
static void check_identity(int captured)
{
    const size_t ni = (size_t)K * K, nb = (size_t)K * N;
    float *eye = calloc(ni, sizeof *eye);
    float *c = malloc(nb * sizeof *c), *nans = malloc(nb * sizeof *nans);
    assert_non_null(eye);
    assert_non_null(c);
    assert_non_null(nans);
    for (int64_t i = 0; i < K; i++)
        eye[i * K + i] = 1.0f;
    for (size_t i = 0; i < nb; i++)
        nans[i] = NAN; /* a value the GEMM fails to write shows */
    float *deye = to_gpu(eye, ni * sizeof *eye);
    for (int t = 0; t < 4; t++) {
        const int trans_b = t & 1, bf16 = t >> 1;
        uint8_t *blob = make_blob((int64_t)nb, 200 + (uint64_t)t);
        const regc_nf4_layout_t l = regc_nf4_layout((int64_t)nb);
        float *bq = host_dequant(blob, (int64_t)nb);
        void *dblob = to_gpu(blob, (size_t)l.bytes);
        float *dc = to_gpu(nans, nb * sizeof *nans);
        regc_gemm g = {.trans_b = trans_b,
                       .m = K,
                       .n = N,
                       .k = K,
                       .lda = K,
                       .ldb = trans_b ? K : N,
                       .ldc = N,
                       .alpha = 1.0f,
                       .bf16 = bf16,
                       .b_nf4 = 1};
        g.a = deye, g.b = (const float *)dblob, g.c = dc;
        assert_int_equal(gpu->gemm_prepare(gpu, &g), REGC_OK);
        if (captured) {
            void *graph = NULL;
            assert_non_null(gpu->capture_begin);
            assert_int_equal(gpu->capture_begin(gpu), REGC_OK);
            const int rc = gpu->gemm(gpu, &g);
            const int end = gpu->capture_end(gpu, &graph);
            if (rc != REGC_OK || end != REGC_OK)
                fail_msg("captured trans_b %d bf16 %d: %s", trans_b, bf16, regc_error_message());
            assert_int_equal(gpu->graph_launch(gpu, graph), REGC_OK);
            from_gpu(c, dc, nb * sizeof *c);
            gpu->graph_free(gpu, graph);
        } else {
            if (gpu->gemm(gpu, &g) != REGC_OK)
                fail_msg("trans_b %d bf16 %d: %s", trans_b, bf16, regc_error_message());
            from_gpu(c, dc, nb * sizeof *c);
        }
        for (int64_t p = 0; p < K; p++)
            for (int64_t j = 0; j < N; j++) {
                const float want = rounded(op_b(bq, trans_b, p, j), bf16), got = c[p * N + j];
                if (!(got == want))
                    fail_msg("%strans_b %d bf16 %d: op(B)[%lld, %lld] host %a, cuda %a",
                             captured ? "captured " : "", trans_b, bf16, (long long)p, (long long)j,
                             want, got);
            }
        gpu->free(gpu, dblob);
        gpu->free(gpu, dc);
        free(blob);
        free(bq);
    }
    gpu->free(gpu, deye);
    free(eye);
    free(c);
    free(nans);
}

static void test_dequantised_b_is_exact(void **state)
{
    (void)state;
    check_identity(0);
}

static void test_captured_gemm_dequantises(void **state)
{
    (void)state;
    check_identity(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_matches_cpu),
        cmocka_unit_test(test_dequantised_b_is_exact),
        cmocka_unit_test(test_captured_gemm_dequantises),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
