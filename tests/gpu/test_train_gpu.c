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
 *   capture; so with weight decay in Transformers' groups (AdamW a run at
 *   a time), which agrees with the CPU's within 1e-4;
 * - the optimizer offloaded to the host (AdamW on the CPU over pinned
 *   memory, the gradients copied on a side stream during the backward)
 *   gives the bits of AdamW on the GPU: one formula, kernel_math.h's;
 * - in bf16 (cuBLASLt's bf16 GEMMs, what only they read held in bf16):
 *   O2 gives O1's bits, regional gives full's, and every tensor held in
 *   fp32 (compile.fp32_storage) gives the bits of the bf16 storage;
 * - saved activations recomputed (full at O1, selective at O2), and
 *   offloaded to the host on the copy queue (a side stream, events between
 *   it and the compute), give the bits of neither; the logits in chunks
 *   give the first loss within 1e-6. */
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
    int ok; /* the run trained all its steps */
    double capture_ms;
} run_record;

static void record_step(const regc_step_report *r, void *user)
{
    run_record *rec = user;
    if (rec->n < STEPS) {
        rec->loss[rec->n] = r->loss;
        rec->grad_norm[rec->n] = r->grad_norm;
    }
    rec->n++;
    rec->capture_ms += r->capture_ms;
}

/* What one run is: the backend, the compile and the options that must not
 * change its bits. */
typedef struct {
    const char *backend;
    int regional;
    regc_level level;
    int offload;
    regc_precision precision;
    int fp32_storage;
    regc_recompute recompute;
    int64_t logits_chunk_rows;
    int offload_activation;
    int wide;         /* B=4, T=64 instead of B=2, T=32: activations large enough to offload */
    int decay_groups; /* weight decay 0.1 in Transformers' groups (biases, norms undecayed) */
} run_setup;

/* A check's findings: every property of an architecture is checked even
 * after one fails, so that one run on a GPU tells everything at once. */
typedef struct {
    const char *preset;
    int failures;
} findings;

static void found(findings *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", f->preset);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    f->failures++;
}

/* Five steps of `preset` as `u` says; a run that fails is a finding. */
static run_record train_as(findings *f, run_setup u)
{
    run_record rec = {0};
    regc_model *m = NULL;
    if (regc_model_load(f->preset, &m) != REGC_OK) {
        found(f, "load: %s", regc_error_message());
        return rec;
    }
    regc_train_options o;
    regc_train_options_default(&o);
    o.backend = u.backend;
    o.batch = u.wide ? 4 : 2, o.seq = u.wide ? 64 : 32, o.steps = STEPS, o.cache_dir = NULL;
    o.max_grad_norm = 1.0; /* reports the norm every step */
    o.compile.regional = u.regional;
    o.compile.level = u.level;
    o.compile.offload_optimizer = u.offload;
    o.compile.precision = u.precision;
    o.compile.fp32_storage = u.fp32_storage;
    o.compile.recompute = u.recompute;
    o.compile.logits_chunk_rows = u.logits_chunk_rows;
    o.compile.offload_activation = u.offload_activation;
    if (u.decay_groups)
        o.weight_decay = 0.1f, o.weight_decay_params = REGC_DECAY_NOT_BIAS_NORM;
    if (regc_train(m, &o, record_step, &rec, NULL) != REGC_OK)
        found(f, "%s%s %s %s%s%s: %s", u.backend, u.precision == REGC_PRECISION_BF16 ? " bf16" : "",
              u.regional ? "regional" : "full", u.level == REGC_LEVEL_O2 ? "O2" : "O1",
              u.offload ? " offloaded" : "", u.fp32_storage ? " fp32-storage" : "",
              regc_error_message());
    else if (rec.n != STEPS)
        found(f, "%d steps reported, %d expected", rec.n, STEPS);
    else
        rec.ok = 1;
    regc_model_free(m);
    return rec;
}

static void expect_close(findings *f, const char *what, const float *cpu, const float *gpu)
{
    for (int s = 0; s < STEPS; s++) {
        printf("%s step %d %s: cpu %.9g, cuda %.9g\n", f->preset, s, what, cpu[s], gpu[s]);
        if (!(fabsf(cpu[s] - gpu[s]) <= 1e-4f * fabsf(cpu[s])))
            found(f, "step %d %s: cpu %.9g, cuda %.9g (beyond 1e-4 relative)", s, what, cpu[s],
                  gpu[s]);
    }
}

/* `b` gives `a`'s bits, when both ran. */
static void expect_same(findings *f, const char *what, const run_record *a, const run_record *b)
{
    if (!a->ok || !b->ok)
        return; /* the failed run is a finding already */
    if (memcmp(a->loss, b->loss, sizeof a->loss) ||
        memcmp(a->grad_norm, b->grad_norm, sizeof a->grad_norm))
        found(f, "%s differ on the GPU (losses %.9g and %.9g at the last step)", what,
              a->loss[STEPS - 1], b->loss[STEPS - 1]);
}

static void check_architecture(const char *preset)
{
    findings f = {preset, 0};
    const run_setup base = {.backend = "cuda",
                            .regional = 1,
                            .level = REGC_LEVEL_O1,
                            .precision = REGC_PRECISION_FP32,
                            .recompute = REGC_RECOMPUTE_NONE};
    run_setup u = base;

    u.backend = "cpu";
    const run_record cpu = train_as(&f, u);
    const run_record gpu = train_as(&f, base);
    if (cpu.ok && gpu.ok) {
        expect_close(&f, "loss", cpu.loss, gpu.loss);
        expect_close(&f, "gradient norm", cpu.grad_norm, gpu.grad_norm);
    }
    u = base, u.regional = 0;
    const run_record full = train_as(&f, u);
    expect_same(&f, "regional and full compilation", &gpu, &full);
    const run_record again = train_as(&f, base);
    expect_same(&f, "two GPU runs", &gpu, &again);
    u = base, u.level = REGC_LEVEL_O2;
    const run_record o2 = train_as(&f, u);
    printf("%s: O2 captured in %.2f ms\n", preset, o2.capture_ms);
    if (o2.ok && !(o2.capture_ms > 0.0))
        found(&f, "O2 captured nothing");
    expect_same(&f, "O2 and O1", &gpu, &o2);
    /* AdamW in runs with and without decay, captured at O2 as it runs at O1 */
    u = base, u.decay_groups = 1;
    const run_record groups = train_as(&f, u);
    u.level = REGC_LEVEL_O2;
    const run_record groups_o2 = train_as(&f, u);
    expect_same(&f, "weight decay in Transformers' groups, O2 and O1", &groups, &groups_o2);
    u = base, u.decay_groups = 1, u.backend = "cpu";
    const run_record groups_cpu = train_as(&f, u);
    if (groups_cpu.ok && groups.ok)
        expect_close(&f, "loss, weight decay in groups", groups_cpu.loss, groups.loss);
    u = base, u.offload = 1;
    const run_record off = train_as(&f, u);
    expect_same(&f, "the optimizer offloaded to the host and on the GPU", &gpu, &off);
    u = base, u.recompute = REGC_RECOMPUTE_FULL;
    const run_record rec = train_as(&f, u);
    expect_same(&f, "every layer recomputed and kept", &gpu, &rec);
    u = base, u.recompute = REGC_RECOMPUTE_SELECTIVE, u.level = REGC_LEVEL_O2;
    const run_record rec2 = train_as(&f, u);
    expect_same(&f, "selective recomputation at O2 and none at O1", &gpu, &rec2);
    u = base, u.wide = 1;
    const run_record wide = train_as(&f, u);
    u.offload_activation = 1;
    const run_record offloaded = train_as(&f, u);
    expect_same(&f, "activations offloaded on the copy queue and kept", &wide, &offloaded);
    u = base, u.logits_chunk_rows = 5;
    const run_record chunks = train_as(&f, u);
    if (chunks.ok && gpu.ok && !(fabsf(chunks.loss[0] - gpu.loss[0]) <= 1e-6f * fabsf(gpu.loss[0])))
        found(&f, "the logits in chunks: first loss %.9g, whole %.9g", chunks.loss[0], gpu.loss[0]);

    run_setup bf16 = base;
    bf16.precision = REGC_PRECISION_BF16;
    const run_record b_o1 = train_as(&f, bf16);
    u = bf16, u.level = REGC_LEVEL_O2;
    const run_record b_o2 = train_as(&f, u);
    u = bf16, u.regional = 0;
    const run_record b_full = train_as(&f, u);
    u = bf16, u.fp32_storage = 1;
    const run_record b_wide = train_as(&f, u);
    u = bf16, u.backend = "cpu";
    const run_record b_cpu = train_as(&f, u);
    if (b_cpu.ok && b_o1.ok)
        for (int s = 0; s < STEPS; s++)
            printf("%s bf16 step %d loss: cpu %.9g, cuda %.9g\n", preset, s, b_cpu.loss[s],
                   b_o1.loss[s]);
    printf("%s: bf16 O2 captured in %.2f ms\n", preset, b_o2.capture_ms);
    if (b_o2.ok && !(b_o2.capture_ms > 0.0))
        found(&f, "bf16 O2 captured nothing");
    expect_same(&f, "in bf16, O2 and O1", &b_o1, &b_o2);
    expect_same(&f, "in bf16, full and regional", &b_o1, &b_full);
    expect_same(&f, "in bf16, every tensor in fp32 and the bf16 storage", &b_o1, &b_wide);

    if (f.failures)
        fail_msg("%s: %d findings (the FAIL lines above)", preset, f.failures);
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
