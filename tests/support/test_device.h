/* test_device.h — buffers for kernel tests that go through a backend's own
 * memory calls (alloc, copies, sync), as the backend contract requires, so
 * a test written against them runs unchanged on any backend. Every buffer
 * made here, host or device, is tracked; regc_test_release_all() frees
 * them all (call it from a test's teardown). Failures fail the test. */
#ifndef REGC_TEST_DEVICE_H
#define REGC_TEST_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "regc_backend.h"

/* n device floats, every one NaN, so an output a kernel forgets to write
 * shows up in any comparison */
float *regc_test_dev_nan(regc_backend *be, size_t n);
float *regc_test_upload(regc_backend *be, const float *host, size_t n);
int32_t *regc_test_upload_ints(regc_backend *be, const int32_t *host, size_t n);
/* a host copy of n device floats, after sync() has reported success */
float *regc_test_download(regc_backend *be, const float *dev, size_t n);

float *regc_test_host_floats(size_t n);
double *regc_test_host_doubles(size_t n);
/* n values of regc's random stream `seed`, uniform on center +- halfwidth */
float *regc_test_host_uniform(size_t n, uint64_t seed, float center, float halfwidth);

/* Attention's dropout cases, the same for every backend: GPT-2's (causal,
 * rows of 37 keys, so a draw's four elements straddle rows), T5's (a
 * score bias, tq != tk, the bias gradient summed over the batch) and
 * Gemma 2's (grouped heads, a cap and a window); p the dropout, seed the
 * inputs'. */
typedef struct {
    regc_attn_shape s;
    int bias;
    float p;
    uint64_t seed;
} regc_test_attn_drop_case;
#define REGC_TEST_ATTN_DROP_CASES 3
extern const regc_test_attn_drop_case regc_test_attn_drop_cases[REGC_TEST_ATTN_DROP_CASES];

/* Elements of an attention shape's q (and out) and of its k (and v). */
size_t regc_test_attn_q_count(const regc_attn_shape *s);
size_t regc_test_attn_kv_count(const regc_attn_shape *s);
/* Host inputs of an attention shape from `seed` (q, k, v, the upstream
 * gradient dout), and their copies uploaded to dev. */
void regc_test_attention_inputs(regc_backend *dev, const regc_attn_shape *s, uint64_t seed,
                                float **hq, float **hk, float **hv, float **hdo, float **q,
                                float **k, float **v, float **dout);

/* Fail unless a and b hold the same bits at every index (NaNs included);
 * the message names `what` and the first index that differs. */
void regc_test_assert_bitwise_equal(const char *what, const float *a, const float *b, size_t n);

/* One torch.optim.AdamW step (constant learning rate) through the
 * backend's optimizer kernels: a scalar block on the device at t = step
 * (from 1), step_schedule, then adamw over n elements (decay 0: as a
 * parameter group of weight_decay 0). */
void regc_test_adamw(regc_backend *be, float *param, const float *grad, float *m, float *v,
                     int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int step, int decay);

void regc_test_release_all(void);
/* A CMocka teardown that calls regc_test_release_all(); always 0. */
int regc_test_release_teardown(void **state);
/* A CMocka test entry whose buffers are released after it runs. */
#define regc_test_with_buffers(test) cmocka_unit_test_teardown(test, regc_test_release_teardown)

/* The kernel variants of a test: CMakeLists.txt runs some tests again once
 * per GEMM, REGC_TEST_GEMM naming it, which becomes REGC_CPU_GEMM for the
 * backends. Where this CPU cannot run the one named, or the run without a
 * variant already runs it, says so and exits with 77, which ctest counts
 * as skipped; a name that is no GEMM fails. Called by the backend helpers
 * below, and by tests whose backends the trainer makes. */
void regc_test_gemm_or_skip(void);

/* A CPU backend with `threads` threads (0: OMP_NUM_THREADS), or NULL after
 * saying why on stderr; for a test group's setup. */
regc_backend *regc_test_cpu_backend(int threads);
/* The backend a kernel test runs on: $REGC_TEST_BACKEND ("cpu" when
 * unset, "cuda" for the same test as a gpu-labelled one), or NULL after
 * saying why on stderr: a GPU test without a GPU fails, it never skips. */
regc_backend *regc_test_backend(int threads);

#endif
