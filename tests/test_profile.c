/* test_profile.c — the step profile accounts for every GEMM of the step
 * (its FLOPs equal 6 per matmul weight per token, counted from the model's
 * shapes), leaves out the warm-up step, does not change what training
 * computes, and `regc train --profile` prints it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_train.h"
#include "test_model.h"
#include "test_util.h"

#define BATCH 2
#define SEQ 16

/* Train a preset for `steps` steps, profiled into pr when it is not NULL. */
static regc_model *train(const char *preset, int steps, regc_profile *pr, regc_test_losses *l)
{
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = BATCH, o.seq = SEQ, o.steps = steps, o.threads = 2, o.lr = 1e-3f;
    o.profile = pr;
    return regc_test_train(preset, &o, l);
}

/* Sum of the GEMM rows' FLOPs and calls, over every run. */
static void gemm_totals(const regc_profile *pr, double *flop, long *calls)
{
    *flop = 0.0, *calls = 0;
    for (int i = 0; i < regc_profile_n_rows(pr); i++) {
        double ms, f;
        long c;
        const char *label = regc_profile_row(pr, i, &ms, &f, &c);
        assert_true(ms >= 0.0);
        if (strncmp(label, "gemm[", 5) == 0) {
            assert_true(f > 0.0);
            *flop += f, *calls += c;
        } else {
            assert_true(f == 0.0);
        }
    }
}

/* Calls per run of the row named label (0 when absent). */
static long calls_of(const regc_profile *pr, const char *label)
{
    for (int i = 0; i < regc_profile_n_rows(pr); i++) {
        double ms, f;
        long c;
        if (!strcmp(regc_profile_row(pr, i, &ms, &f, &c), label))
            return c;
    }
    return 0;
}

/* Forward and backward of a matmul with a [in, out] weight cost 6 * in * out
 * FLOPs per token (2 forward, 2 for the input's gradient, 2 for the
 * weight's): the step's GEMM FLOPs follow from the shapes alone. */
static void check_gemm_flop(const char *preset, double weights_per_token, long gemms_per_step)
{
    regc_profile *pr = regc_profile_new();
    assert_non_null(pr);
    regc_test_losses l;
    regc_model_free(train(preset, 3, pr, &l));
    assert_int_equal(regc_profile_runs(pr), 2); /* the first step is left out */
    double flop;
    long calls;
    gemm_totals(pr, &flop, &calls);
    assert_true(flop == 2.0 * 6.0 * weights_per_token * BATCH * SEQ);
    assert_int_equal(calls, 2 * gemms_per_step);
    /* every row is whole runs' worth of calls; the optimizer runs once a step */
    for (int i = 0; i < regc_profile_n_rows(pr); i++) {
        double ms, f;
        long c;
        regc_profile_row(pr, i, &ms, &f, &c);
        assert_int_equal(c % 2, 0);
    }
    assert_int_equal(calls_of(pr, "adamw"), 2);
    assert_int_equal(calls_of(pr, "loss and scalars to the host"), 2);
    regc_profile_free(pr);
}

static void test_gpt2_gemm_flop(void **state)
{
    (void)state;
    /* gpt2-tiny: C = 128, 4 layers of qkv [C, 3C], proj [C, C], fc [C, 4C],
     * fc_proj [4C, C]; the tied LM head [C, vocab 512]. Each layer runs 12
     * GEMMs (4 forward, 8 backward), the head 3. */
    const double C = 128.0, layer = C * 3 * C + C * C + 2 * C * 4 * C;
    check_gemm_flop("gpt2-tiny", 4 * layer + C * 512, 4 * 12 + 3);
}

static void test_llama_gemm_flop(void **state)
{
    (void)state;
    /* llama-tiny: hidden 128, 4 heads of 32, 2 kv heads (k and v [128, 64]),
     * SwiGLU with intermediate 344, untied head [128, vocab 512] */
    const double h = 128.0, kv = 64.0, inter = 344.0;
    const double layer = h * h + 2 * h * kv + h * h + 3 * h * inter;
    double flop;
    long calls;
    regc_profile *pr = regc_profile_new();
    assert_non_null(pr);
    regc_test_losses l;
    regc_model_free(train("llama-tiny", 2, pr, &l));
    assert_int_equal(regc_profile_runs(pr), 1);
    gemm_totals(pr, &flop, &calls);
    assert_true(flop == 6.0 * (4 * layer + h * 512) * BATCH * SEQ);
    regc_profile_free(pr);
}

/* A single step is the profiled one. */
static void test_single_step_is_profiled(void **state)
{
    (void)state;
    regc_profile *pr = regc_profile_new();
    assert_non_null(pr);
    regc_test_losses l;
    regc_model_free(train("gpt2-tiny", 1, pr, &l));
    assert_int_equal(regc_profile_runs(pr), 1);
    assert_int_equal(calls_of(pr, "adamw"), 1);
    regc_profile_free(pr);
}

/* Timing every instruction changes nothing that is computed. */
static void test_profile_changes_nothing(void **state)
{
    (void)state;
    const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
        regc_profile *pr = regc_profile_new();
        assert_non_null(pr);
        regc_test_losses a, b;
        regc_model *plain = train(presets[p], 3, NULL, &a);
        regc_model *timed = train(presets[p], 3, pr, &b);
        assert_memory_equal(a.loss, b.loss, sizeof a.loss);
        size_t bytes = (size_t)regc_model_total_numel(plain) * sizeof(float);
        assert_memory_equal(regc_model_weights(plain), regc_model_weights(timed), bytes);
        assert_true(regc_profile_n_rows(pr) > 0);
        regc_model_free(plain);
        regc_model_free(timed);
        regc_profile_free(pr);
    }
}

/* The table: one row per label, largest first, and a total that is their sum. */
static void test_profile_table(void **state)
{
    (void)state;
    regc_profile *pr = regc_profile_new();
    assert_non_null(pr);
    assert_int_equal(regc_profile_add(pr, "small", 1.0, 0.0), REGC_OK);
    assert_int_equal(regc_profile_add(pr, "gemm[x]", 4.0, 8e6), REGC_OK);
    assert_int_equal(regc_profile_add(pr, "small", 1.0, 0.0), REGC_OK);
    assert_int_equal(regc_profile_add(pr, "gemm[x]", 4.0, 8e6), REGC_OK);
    regc_profile_count_run(pr);
    regc_profile_count_run(pr);
    assert_int_equal(regc_profile_n_rows(pr), 2);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(regc_profile_write(pr, f), REGC_OK);
    assert_int_equal(fclose(f), 0);
    /* per run: gemm 4 ms at 2 GFLOP/s (8 MFLOP in 4 ms), then small 1 ms */
    const char *gemm = strstr(text, "gemm[x]"), *small = strstr(text, "small");
    assert_non_null(gemm);
    assert_non_null(small);
    assert_true(gemm < small);
    assert_non_null(strstr(text, "profile over 2 runs"));
    assert_non_null(strstr(text, "4.00   80.0%     1.0      2.0  gemm[x]"));
    assert_non_null(strstr(text, "1.00   20.0%     1.0           small"));
    assert_non_null(strstr(text, "5.00  100.0%"));
    assert_non_null(strstr(text, "GEMMs 4.00 ms at 2.0 GFLOP/s, 80.0% of the time"));
    free(text);
    regc_profile_free(pr);
}

static void test_cli_profile(void **state)
{
    (void)state;
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "2", "--batch", "2",
                                "--seq", "16", "--no-cache", "--profile", NULL);
    if (rc != 0)
        fprintf(stderr, "%s", p.err);
    assert_int_equal(rc, 0);
    assert_int_equal(regc_test_count_lines(p.out), 2); /* the steps only */
    assert_non_null(strstr(p.err, "profile over 1 run, per run:"));
    assert_non_null(strstr(p.err, "gemm[BIAS_GELU_AUX m=32 n=512 k=128 ta=0 tb=0]"));
    assert_non_null(strstr(p.err, "adamw"));
    assert_non_null(strstr(p.err, "total (GEMMs"));
    regc_test_proc_free(&p);

    rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--profile=yes", NULL);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(p.err, "--profile takes no value"));
    assert_int_equal(regc_test_count_lines(p.err), 1);
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_gemm_flop),
        cmocka_unit_test(test_llama_gemm_flop),
        cmocka_unit_test(test_single_step_is_profiled),
        cmocka_unit_test(test_profile_changes_nothing),
        cmocka_unit_test(test_profile_table),
        cmocka_unit_test(test_cli_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
