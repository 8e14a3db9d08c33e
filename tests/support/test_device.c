/* test_device.c — see test_device.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_common.h"
#include "test_device.h"

typedef struct {
    regc_backend *be; /* NULL for host memory */
    void *ptr;
} tracked_buffer;

static tracked_buffer *tracked;
static size_t n_tracked, cap_tracked;

static void *track(regc_backend *be, void *ptr)
{
    if (!ptr)
        fail_msg("allocation failed: %s", be ? regc_error_message() : "out of host memory");
    if (n_tracked == cap_tracked) {
        size_t cap = cap_tracked ? cap_tracked * 2 : 64;
        tracked_buffer *grown = realloc(tracked, cap * sizeof *grown);
        assert_non_null(grown);
        tracked = grown;
        cap_tracked = cap;
    }
    tracked[n_tracked++] = (tracked_buffer){be, ptr};
    return ptr;
}

void regc_test_release_all(void)
{
    while (n_tracked > 0) {
        tracked_buffer t = tracked[--n_tracked];
        if (t.be)
            t.be->free(t.be, t.ptr);
        else
            free(t.ptr);
    }
    free(tracked);
    tracked = NULL;
    cap_tracked = 0;
}

int regc_test_release_teardown(void **state)
{
    (void)state;
    regc_test_release_all();
    return 0;
}

void regc_test_gemm_or_skip(void)
{
    static int checked; /* once a process: later calls find REGC_CPU_GEMM set */
    const char *name = getenv("REGC_TEST_GEMM");
    if (checked || !name || !name[0])
        return;
    checked = 1;
    const int status = regc_backend_cpu_use_gemm(name);
    if (status == REGC_ERR_UNSUPPORTED) {
        printf("REGC_TEST_GEMM=%s: not tested, this CPU lacks its instructions\n", name);
        exit(77);
    }
    if (status != REGC_OK) {
        fprintf(stderr, "REGC_TEST_GEMM: %s\n", regc_error_message());
        exit(1);
    }
    /* the GEMM of the run without a variant: REGC_CPU_GEMM's, else the best */
    const char *plain = getenv("REGC_CPU_GEMM");
    if (!plain || !plain[0]) {
        regc_backend_cpu_use_gemm(NULL);
        plain = regc_backend_cpu_gemm_name();
    }
    if (!strcmp(plain, name)) {
        printf("REGC_TEST_GEMM=%s: the run without a variant tests it\n", name);
        exit(77);
    }
    setenv("REGC_CPU_GEMM", name, 1);
    regc_backend_cpu_use_gemm(name);
}

regc_backend *regc_test_cpu_backend(int threads)
{
    regc_test_gemm_or_skip();
    regc_backend *be = regc_backend_new("cpu", threads);
    if (!be)
        fprintf(stderr, "cpu backend: %s\n", regc_error_message());
    return be;
}

regc_backend *regc_test_backend(int threads)
{
    regc_test_gemm_or_skip();
    const char *name = getenv("REGC_TEST_BACKEND");
    regc_backend *be = regc_backend_new(name && name[0] ? name : "cpu", threads);
    if (!be)
        fprintf(stderr, "REGC_TEST_BACKEND=%s: %s\n", name ? name : "", regc_error_message());
    return be;
}

static void *dev_alloc(regc_backend *be, size_t bytes)
{
    return track(be, be->alloc(be, bytes ? bytes : 1));
}

float *regc_test_dev_nan(regc_backend *be, size_t n)
{
    float *d = dev_alloc(be, n * sizeof(float));
    be->fill(be, d, n, NAN);
    return d;
}

float *regc_test_upload(regc_backend *be, const float *host, size_t n)
{
    float *d = dev_alloc(be, n * sizeof(float));
    be->copy_h2d(be, d, host, n * sizeof(float));
    return d;
}

int32_t *regc_test_upload_ints(regc_backend *be, const int32_t *host, size_t n)
{
    int32_t *d = dev_alloc(be, n * sizeof(int32_t));
    be->copy_h2d(be, d, host, n * sizeof(int32_t));
    return d;
}

float *regc_test_download(regc_backend *be, const float *dev, size_t n)
{
    float *h = regc_test_host_floats(n);
    be->copy_d2h(be, h, dev, n * sizeof(float));
    int status = be->sync(be);
    if (status != REGC_OK)
        fail_msg("sync failed (%d): %s", status, regc_error_message());
    return h;
}

float *regc_test_host_floats(size_t n) { return track(NULL, malloc((n ? n : 1) * sizeof(float))); }

double *regc_test_host_doubles(size_t n)
{
    return track(NULL, malloc((n ? n : 1) * sizeof(double)));
}

float *regc_test_host_uniform(size_t n, uint64_t seed, float center, float halfwidth)
{
    float *h = regc_test_host_floats(n);
    regc_rng_fill_uniform(h, n, seed, center, halfwidth);
    return h;
}

void regc_test_assert_bitwise_equal(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: differs at [%zu]: %.9g vs %.9g", what, i, (double)a[i], (double)b[i]);
}

const regc_test_attn_drop_case regc_test_attn_drop_cases[REGC_TEST_ATTN_DROP_CASES] = {
    {.s = {.batch = 3,
           .tq = 37,
           .tk = 37,
           .n_head = 6,
           .n_kv_head = 6,
           .head_dim = 19,
           .causal = 1,
           .scale = 0.2294157f},
     .p = 0.1f,
     .seed = 1300},
    {.s = {.batch = 3,
           .tq = 11,
           .tk = 29,
           .n_head = 4,
           .n_kv_head = 4,
           .head_dim = 8,
           .scale = 1.0f},
     .bias = 1,
     .p = 0.25f,
     .seed = 1400},
    {.s = {.batch = 2,
           .tq = 70,
           .tk = 70,
           .n_head = 4,
           .n_kv_head = 1,
           .head_dim = 16,
           .causal = 1,
           .scale = 0.6f,
           .softcap = 0.7f,
           .window = 9},
     .p = 0.1f,
     .seed = 1500},
};

size_t regc_test_attn_q_count(const regc_attn_shape *s)
{
    return (size_t)(s->batch * s->tq * s->n_head * s->head_dim);
}

size_t regc_test_attn_kv_count(const regc_attn_shape *s)
{
    return (size_t)(s->batch * s->tk * s->n_kv_head * s->head_dim);
}

void regc_test_attention_inputs(regc_backend *dev, const regc_attn_shape *s, uint64_t seed,
                                float **hq, float **hk, float **hv, float **hdo, float **q,
                                float **k, float **v, float **dout)
{
    size_t nq = regc_test_attn_q_count(s), nkv = regc_test_attn_kv_count(s);
    *hq = regc_test_host_uniform(nq, seed, 0.0f, 1.5f);
    *hk = regc_test_host_uniform(nkv, seed + 1, 0.0f, 1.5f);
    *hv = regc_test_host_uniform(nkv, seed + 2, 0.0f, 1.0f);
    *hdo = regc_test_host_uniform(nq, seed + 3, 0.0f, 1.0f);
    *q = regc_test_upload(dev, *hq, nq);
    *k = regc_test_upload(dev, *hk, nkv);
    *v = regc_test_upload(dev, *hv, nkv);
    *dout = regc_test_upload(dev, *hdo, nq);
}

void regc_test_adamw(regc_backend *be, float *param, const float *grad, float *m, float *v,
                     int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int step, int decay)
{
    regc_step_scalars s = {.base_lr = lr,
                           .weight_decay = weight_decay,
                           .beta1 = beta1,
                           .beta2 = beta2,
                           .eps = eps,
                           .schedule = REGC_SCHEDULE_CONSTANT,
                           .step = step - 1,
                           .loss_scale = 1.0f,
                           .clip_scale = 1.0f};
    regc_step_scalars *d = be->alloc(be, sizeof s);
    assert_non_null(d);
    be->copy_h2d(be, d, &s, sizeof s);
    be->step_schedule(be, d);
    be->adamw(be, param, grad, m, v, n, d, decay);
    assert_int_equal(be->sync(be), REGC_OK);
    be->free(be, d);
}
