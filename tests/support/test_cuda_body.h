/* test_cuda_body.h — what the host runs of the CUDA kernels' per-thread
 * bodies (test_cuda_bodies.c, test_cuda_bodies_indexed.c) share: the edge
 * values their inputs hold, and the two comparisons with the CPU backend's
 * output. A body's output must hold the CPU's bits; a variant, a formula a
 * wrong body might use, must differ from them somewhere on the same
 * inputs, or the comparison could not fail. Failures fail the test. */
#ifndef REGC_TEST_CUDA_BODY_H
#define REGC_TEST_CUDA_BODY_H

#include <stddef.h>
#include <stdint.h>

/* zeros of both signs, subnormals, huge values, infinities, NaN, and the
 * arguments where regc_expf clamps */
#define REGC_TEST_N_EDGES ((size_t)45)
extern const float regc_test_edges[REGC_TEST_N_EDGES];

/* n values of regc's random stream `seed` on center +- halfwidth, every
 * seventh an edge value, the edges in turn (a tracked host buffer) */
float *regc_test_spread_edges(size_t n, uint64_t seed, float center, float halfwidth);

/* Fail unless body[i] and cpu_out[i] hold the same bits at every index,
 * except a NaN's sign and payload (that both are NaN is checked); the
 * message names `what` and the first index that differs. */
void regc_test_expect_bits(const char *what, const float *body, const float *cpu_out, size_t n);
/* Fail unless variant and cpu_out differ somewhere, by the same measure. */
void regc_test_expect_caught(const char *what, const float *variant, const float *cpu_out,
                             size_t n);

#endif
