/* bench_sgemm.c — the sgemm rate at given shapes (a benchmark, not a
 * test): the ceiling a training step's GEMMs can reach on this machine.
 *
 *   bench_sgemm [--threads N] [--repeat R] [--kernel openblas|regc|regc-bf16]
 *               M,N,K,TA,TB[,COUNT] ...
 *
 * --kernel openblas (the default) times OpenBLAS's cblas_sgemm; regc times
 * the CPU backend's GEMM (regc's own kernel for the CPU: AVX-512 or AVX2,
 * or another that REGC_CPU_GEMM names); regc-bf16 its mixed-precision GEMM
 * (compile.precision "bf16": operands rounded to bf16, fp32 sums; AVX-512
 * BF16 where the CPU has it).
 * Each shape is C[M, N] = op(A) op(B) in row-major order (TA, TB: 1 for a
 * transposed operand), timed R times after one untimed call; the best time
 * counts. COUNT (default 1) is how often the shape occurs in a step: the
 * summary line is the rate of the whole mix, total FLOPs over total best time,
 * the figure a step made only of these GEMMs would reach.
 *
 * The peak is measured too, before and after the shapes: independent
 * chains of fused multiply-adds on every thread, in the widest vectors the
 * CPU has, so the mix's rate is also given as a fraction of what the cores
 * can do at that moment (a shared machine's speed drifts between runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include "regc_backend.h"
#include "regc_common.h"

typedef struct {
    long m, n, k, count;
    int ta, tb;
} bench_shape;

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_parse_shape(const char *arg, bench_shape *s)
{
    s->count = 1;
    int n = sscanf(arg, "%ld,%ld,%ld,%d,%d,%ld", &s->m, &s->n, &s->k, &s->ta, &s->tb, &s->count);
    if (n < 5 || s->m < 1 || s->n < 1 || s->k < 1 || s->count < 1 || (s->ta != 0 && s->ta != 1) ||
        (s->tb != 0 && s->tb != 1)) {
        fprintf(stderr, "bench_sgemm: bad shape '%s' (want M,N,K,TA,TB[,COUNT])\n", arg);
        return -1;
    }
    return 0;
}

/* Operands filled with small values so no denormal or overflow slows a run. */
static float *bench_matrix(long rows, long cols)
{
    float *p = malloc((size_t)rows * (size_t)cols * sizeof(float));
    if (p)
        for (long i = 0; i < rows * cols; i++)
            p[i] = (float)((i * 7919) % 17 - 8) * 0.01f;
    return p;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* FLOPs of `iters` steps of 12 chains of 256-bit fused multiply-adds, or
 * 24 of 512-bit ones: as many chains as hide the FMA's latency on both of
 * a core's FMA pipes, the sums kept so the work is not optimised away. */
__attribute__((target("avx2,fma"))) static double bench_fma_avx2(long iters, float *sink)
{
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    float out[8];
    for (int i = 1; i < 12; i++)
        acc[0] = _mm256_add_ps(acc[0], acc[i]);
    _mm256_storeu_ps(out, acc[0]);
    *sink += out[0];
    return (double)iters * 12 * 8 * 2;
}

__attribute__((target("avx512f"))) static double bench_fma_avx512(long iters, float *sink)
{
    __m512 acc[24];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++)
            acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    float out[16];
    for (int i = 1; i < 24; i++)
        acc[0] = _mm512_add_ps(acc[0], acc[i]);
    _mm512_storeu_ps(out, acc[0]);
    *sink += out[0];
    return (double)iters * 24 * 16 * 2;
}

/* The fp32 FMA peak of `threads` threads in GFLOP/s, best of 3 (0 where
 * the CPU has neither instruction set). */
static double bench_peak(int threads)
{
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f");
    if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return 0.0;
    double best = 0.0;
    float sink = 0.0f;
    for (int r = 0; r < 3; r++) {
        double flop = 0.0;
        const double t0 = bench_now();
#pragma omp parallel num_threads(threads) reduction(+ : flop, sink)
        flop += avx512 ? bench_fma_avx512(20000000, &sink) : bench_fma_avx2(40000000, &sink);
        const double rate = flop / (bench_now() - t0) * 1e-9;
        best = rate > best ? rate : best;
    }
    return sink == 12345.0f ? 0.0 : best; /* never 12345: keeps the sums */
}
#else
static double bench_peak(int threads)
{
    (void)threads;
    return 0.0;
}
#endif

/* C = op(A) op(B) through OpenBLAS, or through the backend when be != NULL */
static int bench_bf16; /* --kernel regc-bf16 */

static void bench_run(regc_backend *be, const bench_shape *s, const float *a, const float *b,
                      float *c)
{
    const int lda = (int)(s->ta ? s->m : s->k), ldb = (int)(s->tb ? s->k : s->n);
    if (!be) {
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n, (int)s->k, 1.0f, a,
                    lda, b, ldb, 0.0f, c, (int)s->n);
        return;
    }
    regc_gemm g = {.trans_a = s->ta,
                   .trans_b = s->tb,
                   .m = s->m,
                   .n = s->n,
                   .k = s->k,
                   .a = a,
                   .lda = lda,
                   .b = b,
                   .ldb = ldb,
                   .c = c,
                   .ldc = s->n,
                   .alpha = 1.0f,
                   .epilogue = REGC_EPI_NONE,
                   .bf16 = bench_bf16};
    be->gemm(be, &g); /* the shape is valid by construction */
}

/* best seconds of `repeat` calls at one shape, or a negative value when the
 * operands cannot be allocated */
static double bench_time_shape(regc_backend *be, const bench_shape *s, int repeat)
{
    float *a = bench_matrix(s->m, s->k); /* [m, k] or [k, m] */
    float *b = bench_matrix(s->k, s->n); /* [k, n] or [n, k] */
    float *c = bench_matrix(s->m, s->n); /* [m, n] */
    double best = -1.0;
    if (a && b && c) {
        for (int r = 0; r <= repeat; r++) {
            double t0 = bench_now();
            bench_run(be, s, a, b, c);
            double dt = bench_now() - t0;
            if (r > 0 && (best < 0.0 || dt < best)) /* call 0 warms caches and threads */
                best = dt;
        }
    }
    free(a);
    free(b);
    free(c);
    return best;
}

int main(int argc, char **argv)
{
    int threads = 0, repeat = 5, first = 1;
    const char *kernel = "openblas";
    for (; first < argc && strncmp(argv[first], "--", 2) == 0; first += 2) {
        if (first + 1 >= argc) {
            fprintf(stderr, "bench_sgemm: %s needs a value\n", argv[first]);
            return 2;
        }
        if (strcmp(argv[first], "--threads") == 0)
            threads = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--repeat") == 0)
            repeat = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--kernel") == 0)
            kernel = argv[first + 1];
        else {
            fprintf(stderr, "bench_sgemm: unknown option %s\n", argv[first]);
            return 2;
        }
    }
    bench_bf16 = strcmp(kernel, "regc-bf16") == 0;
    const int use_regc = bench_bf16 || strcmp(kernel, "regc") == 0;
    if (first >= argc || repeat < 1 || (!use_regc && strcmp(kernel, "openblas") != 0)) {
        fprintf(stderr, "usage: bench_sgemm [--threads N] [--repeat R] "
                        "[--kernel openblas|regc|regc-bf16] M,N,K,TA,TB[,COUNT] ...\n");
        return 2;
    }
    regc_backend *be = NULL;
    if (use_regc) {
        be = regc_backend_cpu_new(threads);
        if (!be) {
            fprintf(stderr, "bench_sgemm: %s\n", regc_error_message());
            return 1;
        }
        printf("regc cpu backend GEMM (%s%s), threads %d, best of %d\n",
               regc_backend_cpu_gemm_name(), bench_bf16 ? ", bf16 operands" : "",
               threads > 0 ? threads : omp_get_max_threads(), repeat);
    } else {
        if (threads > 0)
            openblas_set_num_threads(threads);
        /* the kernels OpenBLAS picked: OPENBLAS_CORETYPE, when set, overrides
         * its detection of the CPU and can change the rate by half */
        printf("openblas %s, core %s, threads %d, best of %d\n", openblas_get_config(),
               openblas_get_corename(), openblas_get_num_threads(), repeat);
    }

    const int team = threads > 0 ? threads : omp_get_max_threads();
    const double peak_before = bench_peak(team);
    double total_flop = 0.0, total_s = 0.0;
    for (int i = first; i < argc; i++) {
        bench_shape s;
        if (bench_parse_shape(argv[i], &s) < 0) {
            regc_backend_free(be);
            return 2;
        }
        double best = bench_time_shape(be, &s, repeat);
        if (best < 0.0) {
            fprintf(stderr, "bench_sgemm: cannot allocate the operands of %s\n", argv[i]);
            regc_backend_free(be);
            return 1;
        }
        double flop = 2.0 * (double)s.m * (double)s.n * (double)s.k;
        printf("sgemm m=%ld n=%ld k=%ld ta=%d tb=%d x%ld: %.3f ms  %.1f GFLOP/s\n", s.m, s.n, s.k,
               s.ta, s.tb, s.count, best * 1e3, flop / best * 1e-9);
        total_flop += flop * (double)s.count;
        total_s += best * (double)s.count;
    }
    const double rate = total_flop / total_s * 1e-9, peak_after = bench_peak(team);
    const double peak = peak_before > peak_after ? peak_before : peak_after;
    printf("mix: %.2f GFLOP in %.1f ms: %.1f GFLOP/s\n", total_flop * 1e-9, total_s * 1e3, rate);
    if (peak > 0.0)
        printf("peak: %.1f GFLOP/s (fp32 fused multiply-adds on %d threads, %.1f before the "
               "shapes, %.1f after); the mix at %.0f%% of it\n",
               peak, team, peak_before, peak_after, 100.0 * rate / peak);
    regc_backend_free(be);
    return 0;
}
