/* test_kernels_cpu_bf16.c — the CPU backend's bf16 GEMM (regc_gemm.bf16):
 * op(A) and op(B) rounded to bfloat16 by regc_round_bf16, their products
 * summed in fp32, whichever GEMM the backend runs (cpu_bgemm.c's AVX-512
 * BF16 kernel, the AVX-512 or AVX2 kernel with rounded packing, OpenBLAS on
 * rounded copies): ctest runs this file once for each (REGC_CPU_GEMM), and
 * skips those this CPU cannot run.
 *
 * The products of bf16 values are exact, so the result is an fp32 sum of
 * exact terms: against the same sum in double, each of at most N roundings
 * (one per term added, one per k slice added into C, alpha, C + G) moves it
 * by at most 2^-24 of the magnitudes summed so far, and
 *   |G - ref| <= N 2^-24 (|alpha| sum |a b| + |C0|) (1 + N 2^-24),
 * with N = k + 2 ceil(k / 64) + 4, slices no shallower than 64. The
 * epilogue is fp32 arithmetic on G: the same GEMM without an epilogue
 * gives G's bits, and C (and aux) must be the kernel_math.h functions of
 * them exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h" /* REGC_CPU_OWN_SGEMM */
#include "kernel_math.h"
#include "regc_backend.h"
#include "regc_common.h"
#include "test_device.h"

static regc_backend *be;     /* OMP_NUM_THREADS (2 under ctest) */
static regc_backend *serial; /* one thread */
static regc_backend *two;    /* two threads, whatever OMP_NUM_THREADS says */

static int group_setup(void **state)
{
    (void)state;
    be = regc_test_cpu_backend(0);
    serial = regc_test_cpu_backend(1);
    two = regc_test_cpu_backend(2);
    return be && serial && two ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_backend_free(two);
    regc_backend_free(serial);
    regc_backend_free(be);
    return 0;
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- one GEMM case ------------------------------------------------------------ */

/* Host operands of a case, every matrix with padded leading dimensions;
 * the padding of C and aux holds a sentinel that must come back. */
typedef struct {
    int ta, tb, acc;
    regc_epilogue epi;
    int64_t m, n, k, lda, ldb, ldc, ldaux;
    float *a, *b, *c0, *bias, *aux0; /* [a_rows, lda], [b_rows, ldb], [m, ldc], [n], [m, ldaux] */
} bf16_case;

#define SENTINEL 12345.0f

static bf16_case make_case(int ta, int tb, regc_epilogue epi, int acc, int64_t m, int64_t n,
                           int64_t k, uint64_t seed)
{
    bf16_case cs = {.ta = ta, .tb = tb, .acc = acc, .epi = epi, .m = m, .n = n, .k = k};
    cs.lda = (ta ? m : k) + 3, cs.ldb = (tb ? k : n) + 2, cs.ldc = n + 5, cs.ldaux = n + 4;
    const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
    /* uniform floats: nearly all carry bits below bf16's 8-bit significand */
    cs.a = regc_test_host_uniform((size_t)(a_rows * cs.lda), seed + 1, 0.0f, 1.0f);
    cs.b = regc_test_host_uniform((size_t)(b_rows * cs.ldb), seed + 2, 0.0f, 1.0f);
    cs.c0 = regc_test_host_uniform((size_t)(m * cs.ldc), seed + 3, 0.0f, 1.0f);
    cs.bias = regc_test_host_uniform((size_t)n, seed + 4, 0.2f, 0.5f);
    cs.aux0 = regc_test_host_uniform((size_t)(m * cs.ldaux), seed + 5, 0.0f, 3.0f);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = n; j < cs.ldc; j++)
            cs.c0[i * cs.ldc + j] = SENTINEL;
        for (int64_t j = n; j < cs.ldaux; j++)
            cs.aux0[i * cs.ldaux + j] = SENTINEL;
    }
    return cs;
}

static float op_a(const bf16_case *cs, int64_t i, int64_t p)
{
    return cs->ta ? cs->a[p * cs->lda + i] : cs->a[i * cs->lda + p];
}

static float op_b(const bf16_case *cs, int64_t p, int64_t j)
{
    return cs->tb ? cs->b[j * cs->ldb + p] : cs->b[p * cs->ldb + j];
}

/* Whether the backend's bf16 GEMM is AVX-512 BF16's, which counts
 * subnormal bf16 values and sums as zero (cpu_bgemm.c). */
static int bf16_flushes(void) { return strcmp(regc_backend_cpu_gemm_name(), "avx512-bf16") == 0; }

/* Run the case on d with epilogue `epi` and the bf16 flag; host copies of
 * C, aux and the bias gradient come back. */
static void run_case(regc_backend *d, const bf16_case *cs, regc_epilogue epi, int bf16, float **c,
                     float **aux, float **bgrad)
{
    const int64_t a_rows = cs->ta ? cs->k : cs->m, b_rows = cs->tb ? cs->n : cs->k;
    regc_gemm g = {
        .trans_a = cs->ta,
        .trans_b = cs->tb,
        .m = cs->m,
        .n = cs->n,
        .k = cs->k,
        .a = regc_test_upload(d, cs->a, (size_t)(a_rows * cs->lda)),
        .lda = cs->lda,
        .b = regc_test_upload(d, cs->b, (size_t)(b_rows * cs->ldb)),
        .ldb = cs->ldb,
        .c = regc_test_upload(d, cs->c0, (size_t)(cs->m * cs->ldc)),
        .ldc = cs->ldc,
        .alpha = 0.625f,
        .accumulate = cs->acc,
        .epilogue = epi,
        .bias = regc_test_upload(d, cs->bias, (size_t)cs->n),
        .aux = regc_test_upload(d, cs->aux0, (size_t)(cs->m * cs->ldaux)),
        .ldaux = cs->ldaux,
        .bias_grad = regc_test_dev_nan(d, (size_t)cs->n),
        .bf16 = bf16,
    };
    assert_int_equal(d->gemm(d, &g), REGC_OK);
    *c = regc_test_download(d, g.c, (size_t)(cs->m * cs->ldc));
    *aux = regc_test_download(d, g.aux, (size_t)(cs->m * cs->ldaux));
    *bgrad = regc_test_download(d, g.bias_grad, (size_t)cs->n);
}

/* Fail unless every |got - want| <= bound (all [m, n], got with stride ldc). */
static void assert_within(const char *what, const float *got, int64_t ldc, const double *want,
                          const double *bound, int64_t m, int64_t n)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const double err = fabs((double)got[i * ldc + j] - want[i * n + j]);
            if (!(err <= bound[i * n + j]))
                fail_msg("%s: [%lld, %lld] = %.9g, want %.9g within %.3g", what, (long long)i,
                         (long long)j, (double)got[i * ldc + j], want[i * n + j], bound[i * n + j]);
        }
}

/* The reference G of the bf16-rounded operands in double, and the bound
 * of the header on an fp32 sum of them. */
static void reference(const bf16_case *cs, double *want, double *bound)
{
    const double slices = (double)((cs->k + 63) / 64);
    const double nops = (double)cs->k + 2.0 * slices + 4.0, u = ldexp(1.0, -24);
    for (int64_t i = 0; i < cs->m; i++)
        for (int64_t j = 0; j < cs->n; j++) {
            double s = 0.0, mag = 0.0;
            for (int64_t p = 0; p < cs->k; p++) {
                const double t = (double)regc_round_bf16(op_a(cs, i, p)) *
                                 (double)regc_round_bf16(op_b(cs, p, j));
                s += t;
                mag += fabs(t);
            }
            const double c0 = cs->acc ? (double)cs->c0[i * cs->ldc + j] : 0.0;
            want[i * cs->n + j] = 0.625 * s + c0;
            bound[i * cs->n + j] = nops * u * (0.625 * mag + fabs(c0)) * (1.0 + nops * u);
        }
}

static void check_padding(const char *what, const bf16_case *cs, const float *c, const float *aux)
{
    for (int64_t i = 0; i < cs->m; i++) {
        for (int64_t j = cs->n; j < cs->ldc; j++)
            if (c[i * cs->ldc + j] != SENTINEL)
                fail_msg("%s: C padding [%lld, %lld] was written", what, (long long)i,
                         (long long)j);
        for (int64_t j = cs->n; j < cs->ldaux; j++)
            if (aux[i * cs->ldaux + j] != SENTINEL)
                fail_msg("%s: aux padding [%lld, %lld] was written", what, (long long)i,
                         (long long)j);
    }
}

static void assert_same_bits(const char *what, const char *name, int64_t i, int64_t j, float got,
                             float want)
{
    if (bits_of(got) != bits_of(want))
        fail_msg("%s: %s[%lld, %lld] = %.9g (0x%08x), want %.9g (0x%08x)", what, name, (long long)i,
                 (long long)j, (double)got, bits_of(got), (double)want, bits_of(want));
}

/* One case: G (the same GEMM without an epilogue) within the bound of the
 * rounded operands' product; C, aux and the bias gradient exactly what
 * the fp32 epilogue makes of G. */
static void check_case(const bf16_case *cs)
{
    const int64_t m = cs->m, n = cs->n, k = cs->k;
    char what[160];
    snprintf(what, sizeof what, "bf16 gemm (%s) ta=%d tb=%d %s acc=%d m=%lld n=%lld k=%lld",
             regc_backend_cpu_gemm_name(), cs->ta, cs->tb, regc_epilogue_name(cs->epi), cs->acc,
             (long long)m, (long long)n, (long long)k);
    float *gv, *g_aux, *g_bgrad, *c, *aux, *bgrad;
    run_case(be, cs, REGC_EPI_NONE, 1, &gv, &g_aux, &g_bgrad);
    run_case(be, cs, cs->epi, 1, &c, &aux, &bgrad);
    check_padding(what, cs, c, aux);

    double *want = regc_test_host_doubles((size_t)(m * n)),
           *bound = regc_test_host_doubles((size_t)(m * n));
    reference(cs, want, bound);
    assert_within(what, gv, cs->ldc, want, bound, m, n);

    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float gij = gv[i * cs->ldc + j], a0 = cs->aux0[i * cs->ldaux + j];
            float want_c = gij, want_aux = a0;
            switch (cs->epi) {
            case REGC_EPI_BIAS: want_c = regc_addf(gij, cs->bias[j]); break;
            case REGC_EPI_GELU: want_c = regc_gelu(gij); break;
            case REGC_EPI_GELU_AUX:
                want_aux = gij;
                want_c = regc_gelu(gij);
                break;
            case REGC_EPI_BIAS_GELU_AUX:
                want_aux = regc_addf(gij, cs->bias[j]);
                want_c = regc_gelu(want_aux);
                break;
            case REGC_EPI_DGELU:
            case REGC_EPI_DGELU_BGRAD: want_c = regc_gelu_dx(gij, a0); break;
            default: break;
            }
            assert_same_bits(what, "C", i, j, c[i * cs->ldc + j], want_c);
            assert_same_bits(what, "aux", i, j, aux[i * cs->ldaux + j], want_aux);
        }

    /* the bias gradients: sums in double in k (or row) order, as the
     * backend's, so the same bits; BGRAD's of op(B) as the GEMM read it */
    if (cs->epi == REGC_EPI_BGRAD || cs->epi == REGC_EPI_DGELU_BGRAD)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            if (cs->epi == REGC_EPI_BGRAD)
                for (int64_t p = 0; p < k; p++)
                    s += regc_round_bf16(op_b(cs, p, j));
            else
                for (int64_t i = 0; i < m; i++)
                    s += c[i * cs->ldc + j];
            assert_same_bits(what, "bias_grad", 0, j, bgrad[j], (float)s);
        }
    regc_test_release_all();
}

/* ---- the cases ------------------------------------------------------------------ */

/* Every transpose and epilogue, with and without accumulation, at shapes
 * off the 12 x 32 tile: odd k, k = 1, m = 1, n = 1. */
static void test_bf16_all_transposes_and_epilogues(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {{13, 37, 19}, {1, 45, 7}, {29, 1, 33}, {5, 6, 1}};
    uint64_t seed = 20000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int epi = REGC_EPI_NONE; epi <= REGC_EPI_BGRAD; epi++)
                    for (int acc = 0; acc < 2; acc++, seed += 10) {
                        bf16_case cs = make_case(ta, tb, (regc_epilogue)epi, acc, shapes[s][0],
                                                 shapes[s][1], shapes[s][2], seed);
                        check_case(&cs);
                    }
}

/* Shapes past every block, large enough to run on the whole team: k over
 * two slices with an odd remainder, m past a 264-row block (rows split),
 * n past a 4096-column block (columns split). */
static void test_bf16_blocking_edges_parallel(void **state)
{
    (void)state;
    static const regc_epilogue deep_k[4] = {REGC_EPI_BIAS_GELU_AUX, REGC_EPI_DGELU_BGRAD,
                                            REGC_EPI_BGRAD, REGC_EPI_GELU};
    uint64_t seed = 21000;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++, seed += 10) {
            bf16_case deep = make_case(ta, tb, deep_k[2 * ta + tb], ta ^ tb, 275, 70, 1031, seed);
            check_case(&deep);
            bf16_case wide = make_case(ta, tb, REGC_EPI_BIAS, tb, 14, 4096 + 45, 37, seed + 5);
            check_case(&wide);
        }
}

/* The flag is not ignored: on operands with bits below bf16's precision
 * the bf16 GEMM differs from the fp32 one, and the fp32 result is out of
 * the bound around the rounded operands' product. */
static void test_bf16_differs_from_fp32(void **state)
{
    (void)state;
    bf16_case cs = make_case(0, 1, REGC_EPI_NONE, 0, 40, 40, 40, 23000);
    float *c16, *c32, *aux, *bgrad;
    run_case(be, &cs, REGC_EPI_NONE, 1, &c16, &aux, &bgrad);
    run_case(be, &cs, REGC_EPI_NONE, 0, &c32, &aux, &bgrad);
    int64_t differ = 0;
    double worst = 0.0; /* the fp32 result's largest error in bounds */
    double *want = regc_test_host_doubles(40 * 40), *bound = regc_test_host_doubles(40 * 40);
    reference(&cs, want, bound);
    for (int64_t i = 0; i < 40; i++)
        for (int64_t j = 0; j < 40; j++) {
            differ += bits_of(c16[i * cs.ldc + j]) != bits_of(c32[i * cs.ldc + j]);
            const double e = fabs((double)c32[i * cs.ldc + j] - want[i * 40 + j]);
            worst = e / bound[i * 40 + j] > worst ? e / bound[i * 40 + j] : worst;
        }
    if (differ < 40 * 40 * 9 / 10)
        fail_msg("bf16 and fp32 GEMMs agree on %lld of 1600 elements", (long long)(1600 - differ));
    if (worst < 10.0)
        fail_msg("the fp32 GEMM is within %.3g bounds of the bf16 reference", worst);
    assert_within("bf16 gemm 40^3", c16, cs.ldc, want, bound, 40, 40);
    regc_test_release_all();
}

/* ---- the rounding ---------------------------------------------------------------- */

/* Inputs at rounding's edges: ties either way, subnormals (one that rounds
 * up to the smallest normal), signalling and quiet NaNs with payloads,
 * infinities, the largest finite floats (which round to infinity). */
static const uint32_t edge_bits[] = {
    0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
    0xbf808000u, 0xbf818000u, 0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u, 0x00400000u,
    0x007f7fffu, 0x007f8000u, 0x007fffffu, 0x807fffffu, 0x00800000u, 0x00808000u, 0x7f800000u,
    0xff800000u, 0x7f800001u, 0xff812345u, 0x7fc00000u, 0x7fffffffu, 0xffffffffu, 0x7f7fffffu,
    0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x7f7e8000u, 0x42f6e979u, 0xc2f6e979u,
};
#define N_EDGE ((int)(sizeof edge_bits / sizeof edge_bits[0]))

static int is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

#ifdef REGC_CPU_OWN_SGEMM
/* The vector roundings of the kernels' packing, 16 values at a time, each
 * built for its instructions as the kernels are (the intrinsics declared
 * first, outside either target). */
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl")
#include "cpu/cpu_avx512.h"
static void round16_avx512(const uint32_t in[16], uint32_t out[16])
{
    __m512 x;
    memcpy(&x, in, sizeof x);
    const __m512i r = regc_cpu_round_bf16_bits(x);
    memcpy(out, &r, sizeof r);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "cpu/cpu_avx2.h"
static void round16_avx2(const uint32_t in[16], uint32_t out[16])
{
    for (int h = 0; h < 16; h += 8) {
        __m256 x;
        memcpy(&x, in + h, sizeof x);
        const __m256 r = regc_cpu_avx2_round_bf16(x);
        memcpy(out + h, &r, sizeof r);
    }
}
#pragma GCC pop_options
#endif

/* The vector rounding of the packing (integer operations) is
 * regc_round_bf16 bit for bit: the edge inputs, every exponent with the
 * mantissas around each rounding boundary, and random bit patterns; for
 * each instruction set this CPU has. */
static void test_bf16_vector_rounding_matches_scalar(void **state)
{
    (void)state;
#ifdef REGC_CPU_OWN_SGEMM
    enum { BATCH = 16 };
    static const uint32_t mantissas[] = {0x000000u, 0x000001u, 0x007fffu, 0x008000u, 0x008001u,
                                         0x017fffu, 0x018000u, 0x018001u, 0x7f7fffu, 0x7f8000u,
                                         0x7fffffu, 0x400000u, 0x3fffffu, 0x408000u};
    static const struct {
        const char *gemm;
        void (*round16)(const uint32_t in[16], uint32_t out[16]);
    } sets[] = {{"avx512", round16_avx512}, {"avx2", round16_avx2}};
    const int n_mant = (int)(sizeof mantissas / sizeof mantissas[0]);
    const int64_t total = N_EDGE + 2 * 256 * n_mant + (1 << 20);
    int tested = 0;
    for (size_t v = 0; v < sizeof sets / sizeof sets[0]; v++) {
        if (!regc_backend_cpu_gemm_runs(sets[v].gemm)) {
            print_message("%s rounding: not tested, this CPU lacks its instructions\n",
                          sets[v].gemm);
            continue;
        }
        tested++;
        for (int64_t base = 0; base < total; base += BATCH) {
            uint32_t in[BATCH], out[BATCH];
            for (int l = 0; l < BATCH; l++) {
                const int64_t i = base + l;
                if (i < N_EDGE) {
                    in[l] = edge_bits[i];
                } else if (i < N_EDGE + 2 * 256 * n_mant) {
                    const int64_t q = i - N_EDGE; /* sign, exponent, mantissa */
                    in[l] = (uint32_t)(q / (256 * n_mant)) << 31 |
                            (uint32_t)(q / n_mant % 256) << 23 | mantissas[q % n_mant];
                } else {
                    in[l] = (uint32_t)(regc_rng_at(24000, (uint64_t)i) >> 32);
                }
            }
            sets[v].round16(in, out);
            for (int l = 0; l < BATCH; l++) {
                const uint32_t want = bits_of(regc_round_bf16(float_of(in[l])));
                if (out[l] != want)
                    fail_msg("%s rounding 0x%08x: 0x%08x, regc_round_bf16 0x%08x", sets[v].gemm,
                             in[l], out[l], want);
            }
        }
    }
    if (!tested)
        skip();
#else
    skip(); /* no vector rounding in this build */
#endif
}

/* The AVX2 packing of op(A) (regc_cpu_avx2_pack_a: the AVX2 kernel's
 * panels of 6 rows and the AVX-512 kernel's of 12) lays out what the
 * scalar regc_cpu_pack_a_fp32 does, byte for byte: both layouts of A,
 * fp32 and bf16-held, with and without a bf16 GEMM's rounding (edge
 * inputs among the values), blocks starting inside A and ending at its
 * edge, and k ragged against the eight values read at a time. A and the
 * panels are allocated to their last byte, so a read or write past either
 * is the sanitizers' to see. */
static void test_avx2_pack_a_matches_scalar(void **state)
{
    (void)state;
#ifdef REGC_CPU_OWN_SGEMM
    if (!regc_backend_cpu_gemm_runs("avx2")) {
        print_message("AVX2 packing: not tested, this CPU lacks AVX2\n");
        skip();
    }
    static const int64_t sizes[][2] = {{13, 37}, {72, 16}, {50, 9}, {8, 300}, {25, 256}}; /* m, k */
    uint64_t seed = 41000;
    int cases = 0;
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
        for (int ta = 0; ta < 2; ta++)
            for (int a16 = 0; a16 < 2; a16++)
                for (int bf16 = 0; bf16 < 2; bf16++)
                    for (int mr = 6; mr <= 12; mr += 6) {
                        const int64_t m = sizes[z][0], k = sizes[z][1];
                        float *a = regc_test_host_uniform((size_t)(m * k), seed++, 0.0f, 2.0f);
                        for (int i = 0; i < N_EDGE && i < m * k; i++) /* spread through A */
                            memcpy(&a[i * 7 % (m * k)], &edge_bits[i], sizeof(float));
                        uint16_t *a_bits = malloc((size_t)(m * k) * sizeof *a_bits);
                        assert_non_null(a_bits);
                        for (int64_t i = 0; i < m * k; i++)
                            a_bits[i] = regc_bf16_bits(a[i]);
                        regc_gemm g = {.trans_a = ta,
                                       .m = m,
                                       .k = k,
                                       .a = a16 ? (const float *)a_bits : a,
                                       .lda = ta ? m : k, /* A [k, m] or [m, k], unpadded */
                                       .a_bf16 = a16,
                                       .bf16 = bf16};
                        const int64_t starts[3] = {0, 7, m / 2}, k_starts[2] = {0, 3};
                        for (int si = 0; si < 3; si++)
                            for (int whole = 0; whole < 2; whole++)
                                for (int sk = 0; sk < 2; sk++) {
                                    const int64_t i0 = starts[si] < m ? starts[si] : 0;
                                    const int64_t mc = whole || m - i0 < 2 * mr + 1
                                                           ? m - i0
                                                           : 2 * mr + 1; /* to the edge, or not */
                                    const int64_t p0 = k_starts[sk] < k ? k_starts[sk] : 0;
                                    const int64_t kc = k - p0 - (sk && k - p0 > 9 ? 5 : 0);
                                    const size_t n = (size_t)((mc + mr - 1) / mr * mr * kc);
                                    float *want = malloc(n * sizeof *want),
                                          *got = malloc(n * sizeof *got);
                                    assert_non_null(want);
                                    assert_non_null(got);
                                    regc_cpu_pack_a_fp32(want, &g, i0, mc, p0, kc, mr);
                                    regc_cpu_avx2_pack_a(got, &g, i0, mc, p0, kc, mr);
                                    if (memcmp(want, got, n * sizeof *got))
                                        fail_msg("AVX2 pack of A: m=%lld k=%lld ta=%d a_bf16=%d "
                                                 "bf16=%d mr=%d i0=%lld mc=%lld p0=%lld kc=%lld "
                                                 "differs from the scalar pack",
                                                 (long long)m, (long long)k, ta, a16, bf16, mr,
                                                 (long long)i0, (long long)mc, (long long)p0,
                                                 (long long)kc);
                                    free(want), free(got);
                                    cases++;
                                }
                        free(a_bits); /* a: released after the test */
                    }
    assert_true(cases > 0);
#else
    skip(); /* no kernels of regc's own in this build */
#endif
}

/* What the GEMM makes of x * 1 for each edge input x, through op(A) (a
 * column, m of them) and op(B) (a row, n of them) in every layout: x as
 * regc_round_bf16 rounds it. The AVX-512 BF16 product counts a subnormal
 * bf16 value as zero (cpu_bgemm.c); the other paths keep it. */
static void test_bf16_gemm_rounds_like_regc_round_bf16(void **state)
{
    (void)state;
    float xs[N_EDGE], one = 1.0f;
    for (int i = 0; i < N_EDGE; i++)
        xs[i] = float_of(edge_bits[i]);
    for (int side = 0; side < 2; side++)
        for (int trans = 0; trans < 2; trans++) {
            regc_gemm g = {0};
            g.m = side == 0 ? N_EDGE : 1, g.n = side == 0 ? 1 : N_EDGE, g.k = 1;
            g.trans_a = side == 0 && trans, g.trans_b = side == 1 && trans;
            g.a = regc_test_upload(be, side == 0 ? xs : &one, side == 0 ? N_EDGE : 1);
            g.b = regc_test_upload(be, side == 1 ? xs : &one, side == 1 ? N_EDGE : 1);
            g.lda = g.trans_a ? g.m : 1; /* A [m, 1], or [1, m] */
            g.ldb = g.trans_b ? 1 : g.n; /* B [1, n], or [n, 1] */
            g.c = regc_test_dev_nan(be, N_EDGE), g.ldc = g.n;
            g.alpha = 1.0f, g.bf16 = 1;
            assert_int_equal(be->gemm(be, &g), REGC_OK);
            float *c = regc_test_download(be, g.c, N_EDGE);
            for (int i = 0; i < N_EDGE; i++) {
                const uint32_t r = bits_of(regc_round_bf16(xs[i]));
                const uint32_t got = bits_of(c[i]);
                const int subnormal = (r & 0x7f800000u) == 0 && (r & 0x007fffffu) != 0;
                if (is_nan_bits(r)) {
                    if (!is_nan_bits(got))
                        fail_msg("side %d trans %d: NaN 0x%08x gave 0x%08x", side, trans,
                                 edge_bits[i], got);
                    continue;
                }
                const uint32_t want = bf16_flushes() && subnormal ? 0u : r; /* DAZ: +0 */
                /* a zero product sums to +0 from the accumulator's +0 */
                if ((got & 0x7fffffffu) != (want & 0x7fffffffu) ||
                    ((want & 0x7fffffffu) != 0 && got != want))
                    fail_msg("side %d trans %d: 0x%08x gave 0x%08x, want 0x%08x", side, trans,
                             edge_bits[i], got, want);
            }
            regc_test_release_all();
        }
}

/* A product below 2^-126 (normal bf16 operands 2^-100 and 2^-30): the
 * AVX-512 BF16 product flushes it to zero; fp32 arithmetic keeps 2^-130. */
static void test_bf16_subnormal_product(void **state)
{
    (void)state;
    const float a = ldexpf(1.0f, -100), b = ldexpf(1.0f, -30);
    regc_gemm g = {.m = 1, .n = 1, .k = 1, .lda = 1, .ldb = 1, .ldc = 1, .alpha = 1.0f, .bf16 = 1};
    g.a = regc_test_upload(be, &a, 1), g.b = regc_test_upload(be, &b, 1);
    g.c = regc_test_dev_nan(be, 1);
    assert_int_equal(be->gemm(be, &g), REGC_OK);
    const float c = *regc_test_download(be, g.c, 1);
    assert_true(c == (bf16_flushes() ? 0.0f : ldexpf(1.0f, -130)));
}

/* ---- threads ---------------------------------------------------------------------- */

/* Every kernel sums each element of C on one thread in one order:
 * the same bits on one thread and two, split by columns (n >= m) or rows,
 * across k slices and column blocks. */
static void test_bf16_does_not_depend_on_thread_count(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        {70, 333, 601}, {333, 70, 600}, {5, 2 * 4096 + 100, 41}, {275, 70, 1031}};
    uint64_t seed = 25000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++, seed += 10) {
                bf16_case cs = make_case(ta, tb, REGC_EPI_BIAS_GELU_AUX, 1, shapes[s][0],
                                         shapes[s][1], shapes[s][2], seed);
                float *c[2], *aux[2], *bgrad;
                run_case(serial, &cs, cs.epi, 1, &c[0], &aux[0], &bgrad);
                run_case(two, &cs, cs.epi, 1, &c[1], &aux[1], &bgrad);
                char what[128];
                snprintf(what, sizeof what, "bf16 gemm (%s) m=%lld n=%lld k=%lld ta=%d tb=%d",
                         regc_backend_cpu_gemm_name(), (long long)cs.m, (long long)cs.n,
                         (long long)cs.k, ta, tb);
                regc_test_assert_bitwise_equal(what, c[0], c[1], (size_t)(cs.m * cs.ldc));
                regc_test_assert_bitwise_equal(what, aux[0], aux[1], (size_t)(cs.m * cs.ldaux));
                regc_test_release_all();
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_with_buffers(test_bf16_all_transposes_and_epilogues),
        regc_test_with_buffers(test_bf16_blocking_edges_parallel),
        regc_test_with_buffers(test_bf16_differs_from_fp32),
        regc_test_with_buffers(test_bf16_vector_rounding_matches_scalar),
        regc_test_with_buffers(test_avx2_pack_a_matches_scalar),
        regc_test_with_buffers(test_bf16_gemm_rounds_like_regc_round_bf16),
        regc_test_with_buffers(test_bf16_subnormal_product),
        regc_test_with_buffers(test_bf16_does_not_depend_on_thread_count),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
