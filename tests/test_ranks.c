/* test_ranks.c — `mpirun -np N regc train` against one process.
 *
 * - Every rank reading the same batch (a token file whose period is one
 *   batch) gives one process's losses and weights bit for bit at N = 2, at
 *   stage 0 and at stage 3: the mean of two equal halves is exact. GPT-2,
 *   Llama and T5 (BERT's masks are drawn per global position, so its
 *   halves differ); GPT-2 also with its biases and norms undecayed
 *   (Transformers' weight-decay groups).
 * - Each rank reading its own rows of the global batch, N = 2 and N = 4
 *   match one process at the global batch within 1e-5 over 5 steps, for
 *   GPT-2, Llama, BERT and T5; two runs at the same N give the same bits.
 * - The same under ZeRO-3 (stage 3). At N = 2 its scheduled program gives
 *   the bits of the lazy reference (each gather right before its call),
 *   of gathers on demand, of no schedule, of a whole-step compile, of every
 *   reduce-scatter in flight, of a run re-planned on its measured profile
 *   (compile.schedule), of the communicator that stages device buffers
 *   through the host. At stage 0 the buckets' all-reduces in the
 *   backward give the bits of the sums in the update, at any bucket size.
 * - Ranks started with different settings (the run's, the stage, the
 *   compile level) fail at start-up with one line naming what differs; a
 *   rank that dies ends the others instead of leaving them waiting.
 *
 * What each rank holds — checkpoints between rank counts, a model read by
 * shards, the plan against the measured peak — is test_ranks_state.c's. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "test_ranks_run.h"
#include "test_util.h"

/* ---- equal halves: bit for bit ------------------------------------------ */

/* precision: compile.precision of every run; under bf16, stage 3 gathers
 * the weights in bf16, which gives stage 0's bits (their GEMMs round them);
 * extra (NULL-terminated, or NULL) more flags of every run, and `saved` the
 * file of --save's directory compared. */
static void equal_halves(const char *model, const char *precision, const char *const *extra,
                         const char *saved)
{
    char *one = regc_test_join(regc_ranks.dir, "one"), *two = regc_test_join(regc_ranks.dir, "two");
    const char *a1[48] = {"--model", model,    "--data", regc_ranks.periodic, "--batch",
                          "2",       "--seq",  "16",     "--steps",           "5",
                          "--lr",    "3e-3",   "--json", "--no-cache",        "--threads",
                          "1",       "--save", one,      "--precision",       precision};
    int n1 = 20;
    for (int i = 0; extra && extra[i]; i++)
        a1[n1++] = extra[i];
    a1[n1] = NULL;
    double l1[REGC_RANKS_STEPS], l2[REGC_RANKS_STEPS];
    assert_int_equal(regc_ranks_run(0, a1, l1, NULL, NULL), 0);
    char *w1 = regc_test_join(one, saved), *w2 = regc_test_join(two, saved);
    for (int stage = 0; stage <= 3; stage += 3) {
        const char *a2[48] = {"--model",      model,
                              "--data",       regc_ranks.periodic,
                              "--batch",      "2",
                              "--seq",        "16",
                              "--steps",      "5",
                              "--lr",         "3e-3",
                              "--json",       "--no-cache",
                              "--save",       two,
                              "--zero-stage", stage ? "3" : "0",
                              "--precision",  precision};
        int n2 = 20;
        for (int i = 0; extra && extra[i]; i++)
            a2[n2++] = extra[i];
        a2[n2] = NULL;
        assert_int_equal(regc_ranks_run(2, a2, l2, NULL, NULL), 0);
        for (int k = 0; k < REGC_RANKS_STEPS; k++)
            if (memcmp(&l1[k], &l2[k], sizeof l1[k]) != 0)
                fail_msg("%s %s step %d: one process %.9g, two ranks at stage %d %.9g", model,
                         precision, k, l1[k], stage, l2[k]);
        regc_test_same_bytes(w1, w2);
    }
    free(w1), free(w2), free(one), free(two);
}

static void check_equal_halves(const char *model, const char *precision)
{
    equal_halves(model, precision, NULL, "model.safetensors");
}

static void test_equal_halves_gpt2(void **state)
{
    (void)state;
    check_equal_halves("gpt2-tiny", "fp32");
    check_equal_halves("gpt2-tiny", "bf16");
    /* biases and norms undecayed: under stage 3 each rank's block holds
     * other parts of them */
    static const char *const groups[] = {"--weight-decay", "0.1", "--weight-decay-params",
                                         "not_bias_norm", NULL};
    equal_halves("gpt2-tiny", "fp32", groups, "model.safetensors");
}

static void test_equal_halves_llama(void **state)
{
    (void)state;
    check_equal_halves("llama-tiny", "fp32");
    check_equal_halves("llama-tiny", "bf16");
}

/* LoRA (every linear layer, the base held in bf16, or in NF4): two ranks
 * at stage 0 and at stage 3 (the adapters sharded, and the frozen base in
 * the bytes it is held in, gathered twice a step or kept from forward to
 * backward) give one process's losses and adapter, bit for bit. */
static void test_equal_halves_lora(void **state)
{
    (void)state;
    static const char *const lora[] = {
        "--lora-r", "4", "--lora-target-modules", "all-linear", "--base-dtype", "bf16", NULL};
    static const char *const qlora[] = {
        "--lora-r", "4", "--lora-target-modules", "all-linear", "--load-in-4bit", "on", NULL};
    /* every unit, the frozen base's included, kept from forward to backward */
    static const char *const resident[] = {"--lora-r",
                                           "4",
                                           "--lora-target-modules",
                                           "all-linear",
                                           "--load-in-4bit",
                                           "on",
                                           "--param-persistence-threshold",
                                           "1000000000",
                                           NULL};
    equal_halves("llama-tiny", "fp32", lora, "adapter_model.safetensors");
    equal_halves("llama-tiny", "fp32", qlora, "adapter_model.safetensors");
    equal_halves("llama-tiny", "fp32", resident, "adapter_model.safetensors");
}

static void test_equal_halves_t5(void **state)
{
    (void)state;
    check_equal_halves("t5-tiny", "fp32");
    check_equal_halves("t5-tiny", "bf16");
}

/* ---- the global batch split over ranks ------------------------------------ */

static void check_global_batch(const char *model)
{
    const char *a1[] = {"--model", model,   "--data", regc_ranks.plain, "--batch",
                        "4",       "--seq", "16",     "--steps",        "5",
                        "--lr",    "3e-3",  "--json", "--no-cache",     "--threads",
                        "1",       NULL};
    double one[REGC_RANKS_STEPS], two[REGC_RANKS_STEPS], two_again[REGC_RANKS_STEPS],
        four[REGC_RANKS_STEPS];
    assert_int_equal(regc_ranks_run(0, a1, one, NULL, NULL), 0);
    for (int stage = 0; stage <= 3; stage += 3) {
        const char *z = stage ? "3" : "0";
        const char *a2[] = {"--model", model,   "--data", regc_ranks.plain, "--batch",
                            "2",       "--seq", "16",     "--steps",        "5",
                            "--lr",    "3e-3",  "--json", "--no-cache",     "--zero-stage",
                            z,         NULL};
        const char *a4[] = {"--model", model,   "--data", regc_ranks.plain, "--batch",
                            "1",       "--seq", "16",     "--steps",        "5",
                            "--lr",    "3e-3",  "--json", "--no-cache",     "--zero-stage",
                            z,         NULL};
        assert_int_equal(regc_ranks_run(2, a2, two, NULL, NULL), 0);
        assert_int_equal(regc_ranks_run(2, a2, two_again, NULL, NULL), 0);
        assert_int_equal(regc_ranks_run(4, a4, four, NULL, NULL), 0);
        for (int k = 0; k < REGC_RANKS_STEPS; k++) {
            double r2 = fabs(two[k] - one[k]) / fabs(one[k]),
                   r4 = fabs(four[k] - one[k]) / fabs(one[k]);
            if (!(r2 <= 1e-5) || !(r4 <= 1e-5))
                fail_msg("%s stage %d step %d: one process %.9g, 2 ranks %.9g, 4 ranks %.9g", model,
                         stage, k, one[k], two[k], four[k]);
            if (memcmp(&two[k], &two_again[k], sizeof two[k]) != 0)
                fail_msg("%s stage %d step %d: two runs at 2 ranks differ: %.9g, %.9g", model,
                         stage, k, two[k], two_again[k]);
        }
    }
}

static void test_global_batch_gpt2(void **state)
{
    (void)state;
    check_global_batch("gpt2-tiny");
}

static void test_global_batch_llama(void **state)
{
    (void)state;
    check_global_batch("llama-tiny");
}

static void test_global_batch_bert(void **state)
{
    (void)state;
    check_global_batch("bert-tiny");
}

static void test_global_batch_t5(void **state)
{
    (void)state;
    check_global_batch("t5-tiny");
}

/* Shuffled rows: 2 ranks of 2 rows train as one process of 4 (1e-5). */
static void test_global_batch_shuffled(void **state)
{
    (void)state;
    const char *a[] = {"--model",     "gpt2-tiny",  "--data",    regc_ranks.plain,
                       "--batch",     "4",          "--seq",     "16",
                       "--steps",     "5",          "--lr",      "3e-3",
                       "--json",      "--no-cache", "--shuffle", "on",
                       "--data-seed", "9",          NULL};
    double one[REGC_RANKS_STEPS], two[REGC_RANKS_STEPS];
    assert_int_equal(regc_ranks_run(0, a, one, NULL, NULL), 0);
    a[5] = "2"; /* --batch: per rank */
    assert_int_equal(regc_ranks_run(2, a, two, NULL, NULL), 0);
    for (int k = 0; k < REGC_RANKS_STEPS; k++)
        if (!(fabs(two[k] - one[k]) <= 1e-5 * fabs(one[k])))
            fail_msg("shuffled, step %d: one process %.9g, 2 ranks %.9g", k, one[k], two[k]);
}

/* At 2 ranks every program of a stage gives the scheduled one's bits, at
 * compile.precision `precision`. */
static void check_programs_agree(const char *stage, const char *precision,
                                 const char *const (*ways)[2], size_t n_ways)
{
    char *ref = regc_test_join(regc_ranks.dir, "scheduled"),
         *other = regc_test_join(regc_ranks.dir, "other");
    char *wref = regc_test_join(ref, "model.safetensors"),
         *wother = regc_test_join(other, "model.safetensors");
    double lref[REGC_RANKS_STEPS], l[REGC_RANKS_STEPS];
    const char *base[] = {"--model", "llama-tiny",   "--data", regc_ranks.plain, "--batch",
                          "2",       "--seq",        "16",     "--steps",        "5",
                          "--lr",    "3e-3",         "--json", "--no-cache",     "--save",
                          ref,       "--zero-stage", stage,    "--precision",    precision,
                          NULL};
    assert_int_equal(regc_ranks_run(2, base, lref, NULL, NULL), 0);
    for (size_t w = 0; w < n_ways; w++) {
        const char *args[] = {"--model",  "llama-tiny",   "--data", regc_ranks.plain, "--batch",
                              "2",        "--seq",        "16",     "--steps",        "5",
                              "--lr",     "3e-3",         "--json", "--no-cache",     "--save",
                              other,      "--zero-stage", stage,    "--precision",    precision,
                              ways[w][0], ways[w][1],     NULL};
        assert_int_equal(regc_ranks_run(2, args, l, NULL, NULL), 0);
        for (int k = 0; k < REGC_RANKS_STEPS; k++)
            if (memcmp(&l[k], &lref[k], sizeof l[k]) != 0)
                fail_msg("stage %s %s, %s %s, step %d: %.9g, scheduled %.9g", stage, precision,
                         ways[w][0], ways[w][1], k, l[k], lref[k]);
        regc_test_same_bytes(wref, wother);
    }
    free(ref), free(other), free(wref), free(wother);
}

/* Under ZeRO-3: the lazy reference (O0, each gather right before its
 * call), gathers on demand, no schedule at all, a whole-step compile, a
 * deep prefetch, every reduce-scatter in flight; so does the staged
 * communicator. */
static void test_stage3_programs_agree_at_two_ranks(void **state)
{
    (void)state;
    static const char *const ways[][2] = {
        {"--level", "O0"},
        {"--inline-back", "off"},
        {"--prefetch-bucket-size", "0"},
        {"--deepcompile", "off"},
        {"--regional", "off"},
        {"--prefetch-bucket-size", "1000000"},
        {"--reduce-bucket-size", "1000000000"},
        /* re-planned at step 2 on the profile of step 1, every rank alike */
        {"--schedule", "2:prefetch,overlap_reduce,selective_gather@100000"},
        {"--offload-optimizer", "cpu"},
        /* saved activations computed again in the backward */
        {"--recompute", "full"},
    };
    check_programs_agree("3", "fp32", ways, sizeof ways / sizeof *ways);
    /* bf16, its units gathered in bf16 and its saved activations held in
     * bf16: the schedules that move the gathers, and recomputation */
    static const char *const bf16_ways[][2] = {
        {"--level", "O0"},       {"--prefetch-bucket-size", "0"},
        {"--regional", "off"},   {"--prefetch-bucket-size", "1000000"},
        {"--recompute", "full"},
    };
    check_programs_agree("3", "bf16", bf16_ways, sizeof bf16_ways / sizeof *bf16_ways);
}

/* At stage 0: the sums in the update (lazy, or no schedule), and buckets
 * of another size (two ranks' sum is exact whatever the bucket). */
static void test_stage0_programs_agree_at_two_ranks(void **state)
{
    (void)state;
    static const char *const ways[][2] = {
        {"--level", "O0"},
        {"--deepcompile", "off"},
        {"--reduce-bucket-size", "1000"},
        {"--reduce-bucket-size", "1000000000"},
        {"--passes", "none"},
        {"--offload-optimizer", "cpu"},
    };
    check_programs_agree("0", "fp32", ways, sizeof ways / sizeof *ways);
}

/* ---- ranks that disagree, and a rank that dies ----------------------------- */

/* Two ranks, one started with `flag value0`, the other with `flag value1`:
 * the job fails with one line that says `expect`. */
static void expect_disagreement(const char *flag, const char *value0, const char *value1,
                                const char *expect)
{
    const char *argv[64];
    int n = regc_ranks_add_mpirun(argv, 0);
    for (int r = 0; r < 2; r++) {
        const char *rank[] = {
            "-np",       "1",      REGC_BIN,         "train",   "--model",
            "gpt2-tiny", "--data", regc_ranks.plain, "--batch", "2",
            "--seq",     "16",     "--no-cache",     flag,      r ? value1 : value0};
        if (r)
            argv[n++] = ":";
        for (size_t i = 0; i < sizeof rank / sizeof *rank; i++)
            argv[n++] = rank[i];
    }
    argv[n] = NULL;
    regc_test_proc p;
    int rc = regc_test_run_argv(argv, &p);
    int lines = 0;
    for (const char *l = p.err; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        lines += !strncmp(l, "regc", 4) && strstr(l, "disagree") != NULL;
    if (rc == 0 || lines != 1 || !strstr(p.err, expect))
        fail_msg("expected a failure with one line saying \"%s\"; got %d:\n%s", expect, rc, p.err);
    regc_test_proc_free(&p);
}

static void test_ranks_that_disagree(void **state)
{
    (void)state;
    expect_disagreement("--lr", "1e-3", "2e-3", "train.lr is 0.0010000000474974513 on rank 0");
    expect_disagreement("--zero-stage", "0", "3",
                        "zero_optimization.stage is 0 on rank 0, 3 on "
                        "rank 1");
    expect_disagreement("--level", "O1", "O0", "compile.level is O1 on rank 0, O0 on rank 1");
    expect_disagreement("--shuffle", "on", "off",
                        "train.shuffle is true on rank 0, false on rank 1");
}

static void test_a_rank_that_dies_ends_the_others(void **state)
{
    (void)state;
    char script[4096];
    snprintf(script, sizeof script,
             "%s train --model gpt2-tiny --data %s --batch 2 --seq 16 --steps 100000 --no-cache "
             ">/dev/null 2>&1 & pid=$!; sleep 1; kill -9 $pid; wait $pid; exit 1",
             REGC_BIN, regc_ranks.plain);
    const char *tail[] = {
        "-np",     "1", REGC_BIN,  "train", "--model", "gpt2-tiny", "--data",     regc_ranks.plain,
        "--batch", "2", "--seq",   "16",    "--steps", "100000",    "--no-cache", ":",
        "-np",     "1", "/bin/sh", "-c",    script,    NULL};
    const char *argv[64];
    int n = regc_ranks_add_mpirun(argv, 0);
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
        argv[n++] = tail[i];
    regc_test_proc p;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = regc_test_run_argv(argv, &p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    /* 100000 steps would take minutes: the job ended because a rank died */
    if (rc == 0 || s > 60.0)
        fail_msg("mpirun exited %d after %.1f s:\n%s", rc, s, p.err);
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_halves_gpt2),
        cmocka_unit_test(test_equal_halves_llama),
        cmocka_unit_test(test_equal_halves_lora),
        cmocka_unit_test(test_equal_halves_t5),
        cmocka_unit_test(test_global_batch_gpt2),
        cmocka_unit_test(test_global_batch_llama),
        cmocka_unit_test(test_global_batch_bert),
        cmocka_unit_test(test_global_batch_t5),
        cmocka_unit_test(test_global_batch_shuffled),
        cmocka_unit_test(test_stage3_programs_agree_at_two_ranks),
        cmocka_unit_test(test_stage0_programs_agree_at_two_ranks),
        cmocka_unit_test(test_ranks_that_disagree),
        cmocka_unit_test(test_a_rank_that_dies_ends_the_others),
    };
    return cmocka_run_group_tests(tests, regc_ranks_group_setup, regc_ranks_group_teardown);
}
