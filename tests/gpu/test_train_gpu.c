/* test_train_gpu.c — training on the CUDA backend against the CPU (ctest
 * label "gpu"; without a usable GPU this test fails).
 *
 * For each architecture (GPT-2, Llama, BERT, T5, their tiny presets), five
 * steps from the same initialisation on the same batches:
 * - the CUDA losses and gradient norms equal the CPU's within 1e-4
 *   relative: the per-element math is shared (kernel_math.h), but
 *   cuBLASLt's GEMMs and the GPU's attention sum in another order;
 * - regional and full compilation give the same bits on the GPU, as they
 *   do on the CPU: one compiled layer reused for every layer computes
 *   exactly what the whole graph compiled at once computes;
 * - two GPU runs give the same bits: every reduction has a fixed order;
 * - O2 (the step and its update captured once as CUDA graphs and replayed)
 *   gives O1's bits: the same kernels on the same memory, and it did
 *   capture;
 * - the optimizer offloaded to the host (AdamW on the CPU over pinned
 *   memory, the gradients copied on a side stream during the backward)
 *   gives the bits of AdamW on the GPU: one formula, kernel_math.h's;
 * - in bf16 (cuBLASLt's bf16 GEMMs, what only they read held in bf16):
 *   O2 gives O1's bits, regional gives full's, and every tensor held in
 *   fp32 (compile.fp32_storage) gives the bits of the bf16 storage. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_backend.h"
#include "regc_models.h"
#include "regc_train.h"

#define STEPS 5

typedef struct {
    float loss[STEPS], grad_norm[STEPS];
    int n;
} run_record;

static void record_step(const regc_step_report *r, void *user)
{
    run_record *rec = user;
    assert_true(rec->n < STEPS);
    rec->loss[rec->n] = r->loss;
    rec->grad_norm[rec->n] = r->grad_norm;
    rec->n++;
}

static double capture_ms;
static void record_capture(const regc_step_report *r, void *user)
{
    record_step(r, user);
    capture_ms += r->capture_ms;
}

static int offload;              /* the next runs offload the optimizer */
static regc_precision precision; /* of the next runs */
static int fp32_storage;         /* the next bf16 runs hold every tensor in fp32 */

/* Five steps of `preset` on `backend`, regional or full, at O1 or O2. */
static run_record train_at(const char *preset, const char *backend, int regional, regc_level level)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    regc_train_options o;
    regc_train_options_default(&o);
    o.backend = backend;
    o.batch = 2, o.seq = 32, o.steps = STEPS, o.cache_dir = NULL;
    o.max_grad_norm = 1.0; /* reports the norm every step */
    o.compile.regional = regional;
    o.compile.level = level;
    o.compile.offload_optimizer = offload;
    o.compile.precision = precision;
    o.compile.fp32_storage = fp32_storage;
    run_record rec = {0};
    if (regc_train(m, &o, record_capture, &rec, NULL) != REGC_OK)
        fail_msg("%s on %s: %s", preset, backend, regc_error_message());
    assert_int_equal(rec.n, STEPS);
    regc_model_free(m);
    return rec;
}

static run_record train_five(const char *preset, const char *backend, int regional)
{
    return train_at(preset, backend, regional, REGC_LEVEL_O1);
}

static void expect_close(const char *preset, const char *what, const float *cpu, const float *gpu)
{
    for (int s = 0; s < STEPS; s++) {
        printf("%s step %d %s: cpu %.9g, cuda %.9g\n", preset, s, what, cpu[s], gpu[s]);
        if (!(fabsf(cpu[s] - gpu[s]) <= 1e-4f * fabsf(cpu[s])))
            fail_msg("%s step %d %s: cpu %.9g, cuda %.9g (beyond 1e-4 relative)", preset, s, what,
                     cpu[s], gpu[s]);
    }
}

static void check_architecture(const char *preset)
{
    const run_record cpu = train_five(preset, "cpu", 1);
    const run_record gpu = train_five(preset, "cuda", 1);
    expect_close(preset, "loss", cpu.loss, gpu.loss);
    expect_close(preset, "gradient norm", cpu.grad_norm, gpu.grad_norm);
    const run_record full = train_five(preset, "cuda", 0);
    if (memcmp(full.loss, gpu.loss, sizeof gpu.loss) ||
        memcmp(full.grad_norm, gpu.grad_norm, sizeof gpu.grad_norm))
        fail_msg("%s: regional and full compilation differ on the GPU", preset);
    const run_record again = train_five(preset, "cuda", 1);
    if (memcmp(again.loss, gpu.loss, sizeof gpu.loss) ||
        memcmp(again.grad_norm, gpu.grad_norm, sizeof gpu.grad_norm))
        fail_msg("%s: two GPU runs differ", preset);
    capture_ms = 0.0;
    const run_record o2 = train_at(preset, "cuda", 1, REGC_LEVEL_O2);
    printf("%s: O2 captured in %.2f ms\n", preset, capture_ms);
    if (!(capture_ms > 0.0))
        fail_msg("%s: O2 captured nothing", preset);
    if (memcmp(o2.loss, gpu.loss, sizeof gpu.loss) ||
        memcmp(o2.grad_norm, gpu.grad_norm, sizeof gpu.grad_norm))
        fail_msg("%s: O2 and O1 differ on the GPU", preset);
    offload = 1;
    const run_record off = train_five(preset, "cuda", 1);
    offload = 0;
    if (memcmp(off.loss, gpu.loss, sizeof gpu.loss) ||
        memcmp(off.grad_norm, gpu.grad_norm, sizeof gpu.grad_norm))
        fail_msg("%s: the optimizer offloaded to the host differs on the GPU", preset);

    precision = REGC_PRECISION_BF16;
    const run_record b_o1 = train_five(preset, "cuda", 1);
    capture_ms = 0.0;
    const run_record b_o2 = train_at(preset, "cuda", 1, REGC_LEVEL_O2);
    const double b_capture_ms = capture_ms;
    const run_record b_full = train_five(preset, "cuda", 0);
    fp32_storage = 1;
    const run_record b_wide = train_five(preset, "cuda", 1);
    fp32_storage = 0;
    const run_record b_cpu = train_five(preset, "cpu", 1);
    precision = REGC_PRECISION_FP32;
    for (int s = 0; s < STEPS; s++)
        printf("%s bf16 step %d loss: cpu %.9g, cuda %.9g\n", preset, s, b_cpu.loss[s],
               b_o1.loss[s]);
    printf("%s: bf16 O2 captured in %.2f ms\n", preset, b_capture_ms);
    if (!(b_capture_ms > 0.0))
        fail_msg("%s: bf16 O2 captured nothing", preset);
    const struct {
        const run_record *r;
        const char *what;
    } same[] = {{&b_o2, "O2 and O1"},
                {&b_full, "full and regional"},
                {&b_wide, "every tensor in fp32 and the bf16 storage"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if (memcmp(same[i].r->loss, b_o1.loss, sizeof b_o1.loss) ||
            memcmp(same[i].r->grad_norm, b_o1.grad_norm, sizeof b_o1.grad_norm))
            fail_msg("%s: in bf16, %s differ on the GPU", preset, same[i].what);
}

static void test_gpt2(void **state)
{
    (void)state;
    check_architecture("gpt2-tiny");
}

static void test_llama(void **state)
{
    (void)state;
    check_architecture("llama-tiny");
}

static void test_bert(void **state)
{
    (void)state;
    check_architecture("bert-tiny");
}

static void test_t5(void **state)
{
    (void)state;
    check_architecture("t5-tiny");
}

static int setup(void **state)
{
    (void)state;
    regc_backend *gpu = regc_backend_new("cuda", 0);
    if (!gpu) {
        fprintf(stderr, "no CUDA backend: %s\n", regc_error_message());
        return -1;
    }
    regc_backend_free(gpu);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_bert),
        cmocka_unit_test(test_t5),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
