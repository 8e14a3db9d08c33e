/* test_cuda_body.c — see test_cuda_body.h. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernel_math.h"
#include "test_cuda_body.h"
#include "test_device.h"

const float regc_test_edges[] = {
    0.0f,   -0.0f,  1e-45f, -1e-45f, 1e-40f,  FLT_MIN,  -FLT_MIN, 1e-20f,    1.0f,
    -1.0f,  0.5f,   -0.5f,  3.0f,    -3.0f,   9.0f,     -9.0f,    9.5f,      -9.5f,
    13.5f,  -13.5f, 43.5f,  -43.5f,  86.5f,   -86.5f,   87.0f,    -87.0f,    87.5f,
    -87.5f, 88.0f,  -88.0f, 88.5f,   -88.5f,  100.0f,   -100.0f,  1e10f,     -1e10f,
    1e20f,  -1e20f, 1e30f,  -1e30f,  FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN,
};

float *regc_test_spread_edges(size_t n, uint64_t seed, float center, float halfwidth)
{
    float *h = regc_test_host_uniform(n, seed, center, halfwidth);
    for (size_t i = 0; i < n; i += 7)
        h[i] = regc_test_edges[(i / 7) % REGC_TEST_N_EDGES];
    return h;
}

/* Every bit, except a NaN's sign and payload. When two NaNs meet in one
 * operation, x86 returns the first operand's, and the compiler may swap
 * the operands of a commutative operation: the CPU's vectorised kernels
 * and a scalar loop over the same formula then disagree on the sign of
 * such a NaN (an input NaN meeting one that inf - inf made), and builds
 * for other vector widths differ among themselves. IEEE 754 leaves that
 * choice open, and a GPU writes its one canonical NaN anyway; that the
 * result is NaN is still checked. */
static int same_value(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

void regc_test_expect_bits(const char *what, const float *body, const float *cpu_out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!same_value(body[i], cpu_out[i]))
            fail_msg("%s: differs at [%zu]: body %.9g (0x%08x), cpu %.9g (0x%08x)", what, i,
                     body[i], regc_float_to_bits(body[i]), cpu_out[i],
                     regc_float_to_bits(cpu_out[i]));
}

void regc_test_expect_caught(const char *what, const float *variant, const float *cpu_out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!same_value(variant[i], cpu_out[i]))
            return;
    fail_msg("%s: the inputs cannot tell it from the CPU's kernel", what);
}
