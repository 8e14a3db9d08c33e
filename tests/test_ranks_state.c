/* test_ranks_state.c — what each rank of `mpirun -np N regc train` holds.
 *
 * - A checkpoint written at N = 2 under stage 3 (every rank's shards
 *   joined into the model's order) resumes at N = 2 bit for bit, and in one
 *   process and at N = 4 within 1e-5 of a run that never stopped.
 * - A Hugging Face directory, fp32 and its bf16 copy, trained under ZeRO-3
 *   at N = 2, each rank reading only its shards' bytes, gives one
 *   process's losses and saved weights bit for bit.
 * - `regc plan` predicts the device memory each rank holds, within 1%, at
 *   N = 1, 2 and 4; activations offloaded at N = 2 keep the bits of
 *   keeping them, in the less memory the plan says. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_models.h"
#include "test_ranks_run.h"
#include "test_util.h"

static double device_peak; /* the last run's */

/* ---- checkpoints move between rank counts and stages ---------------------- */

/* A checkpoint written by 2 ranks at stage 3 (every rank's shards joined
 * into the model's order) resumes at 2 ranks bit for bit, and in one
 * process and at 4 ranks within 1e-5 of a run that never stopped. */
static void test_checkpoint_moves_between_rank_counts(void **state)
{
    (void)state;
    char *out = regc_test_join(regc_ranks.dir, "ck"), *ck = regc_test_join(out, "checkpoint-2");
    const char *straight[] = {"--model", "gpt2-tiny", "--data", regc_ranks.plain, "--batch",
                              "4",       "--seq",     "16",     "--steps",        "5",
                              "--lr",    "3e-3",      "--json", "--no-cache",     "--threads",
                              "1",       NULL};
    const char *first[] = {"--model", "gpt2-tiny",    "--data", regc_ranks.plain, "--batch",
                           "2",       "--seq",        "16",     "--steps",        "5",
                           "--lr",    "3e-3",         "--json", "--no-cache",     "--zero-stage",
                           "3",       "--output-dir", out,      "--save-steps",   "2",
                           NULL};
    const char *again[] = {"--model",
                           "gpt2-tiny",
                           "--data",
                           regc_ranks.plain,
                           "--batch",
                           "2",
                           "--seq",
                           "16",
                           "--steps",
                           "5",
                           "--lr",
                           "3e-3",
                           "--json",
                           "--no-cache",
                           "--zero-stage",
                           "3",
                           "--resume-from-checkpoint",
                           ck,
                           NULL};
    const char *one[] = {"--model",
                         "gpt2-tiny",
                         "--data",
                         regc_ranks.plain,
                         "--batch",
                         "4",
                         "--seq",
                         "16",
                         "--steps",
                         "5",
                         "--lr",
                         "3e-3",
                         "--json",
                         "--no-cache",
                         "--threads",
                         "1",
                         "--resume-from-checkpoint",
                         ck,
                         NULL};
    const char *four[] = {"--model",
                          "gpt2-tiny",
                          "--data",
                          regc_ranks.plain,
                          "--batch",
                          "1",
                          "--seq",
                          "16",
                          "--steps",
                          "5",
                          "--lr",
                          "3e-3",
                          "--json",
                          "--no-cache",
                          "--zero-stage",
                          "3",
                          "--resume-from-checkpoint",
                          ck,
                          NULL};
    double s[REGC_RANKS_STEPS], f[REGC_RANKS_STEPS], a[REGC_RANKS_STEPS], r1[REGC_RANKS_STEPS],
        r4[REGC_RANKS_STEPS];
    assert_int_equal(regc_ranks_run(0, straight, s, &device_peak, NULL), 0);
    assert_int_equal(regc_ranks_run(2, first, f, &device_peak, NULL), 0);
    assert_int_equal(regc_ranks_run(2, again, a, &device_peak, NULL), 0);
    assert_int_equal(regc_ranks_run(0, one, r1, &device_peak, NULL), 0);
    assert_int_equal(regc_ranks_run(4, four, r4, &device_peak, NULL), 0);
    for (int k = 2; k < REGC_RANKS_STEPS; k++) {
        if (memcmp(&a[k], &f[k], sizeof a[k]) != 0)
            fail_msg("step %d: 2 ranks %.9g, resumed at 2 ranks %.9g", k, f[k], a[k]);
        if (!(fabs(r1[k] - s[k]) <= 1e-5 * fabs(s[k])) ||
            !(fabs(r4[k] - s[k]) <= 1e-5 * fabs(s[k])))
            fail_msg("step %d: straight %.9g, resumed in one process %.9g, at 4 ranks %.9g", k,
                     s[k], r1[k], r4[k]);
    }
    free(out), free(ck);
}

/* ---- a model directory read by shards ------------------------------------ */

/* The bytes of tensor data in a safetensors file. */
static long long data_bytes(const char *path)
{
    regc_st_file *f;
    assert_int_equal(regc_st_open(path, &f), REGC_OK);
    long long n = 0;
    for (int i = 0; i < regc_st_count(f); i++)
        n += regc_st_bytes(f, i);
    regc_st_close(f);
    return n;
}

/* The byte count of the "weights: ... (N bytes) read from" line, or -1. */
static long long bytes_read(const char *err)
{
    const char *at = strstr(err, "weights: ");
    const char *paren = at ? strstr(at, " bytes) read from ") : NULL;
    if (!paren)
        return -1;
    while (paren > at && paren[-1] >= '0' && paren[-1] <= '9')
        paren--;
    return atoll(paren);
}

/* A Hugging Face directory, fp32 and its bf16 copy, trained under ZeRO-3
 * at N = 2 (each rank reading only its shards' bytes, the ranks together
 * reading the file once) gives one process's losses and saved weights bit
 * for bit; --save streams the weights unit by unit from the shards. */
static void test_model_directory_read_by_shards(void **state)
{
    (void)state;
    char *src = regc_test_join(regc_ranks.dir, "src"),
         *half = regc_test_join(regc_ranks.dir, "src16");
    char *one = regc_test_join(regc_ranks.dir, "dir1"),
         *two = regc_test_join(regc_ranks.dir, "dir2");
    const char *make[] = {"--model", "llama-tiny", "--data",    regc_ranks.periodic,
                          "--batch", "2",          "--seq",     "16",
                          "--steps", "2",          "--lr",      "3e-3",
                          "--json",  "--no-cache", "--threads", "1",
                          "--save",  src,          NULL};
    assert_int_equal(regc_ranks_run(0, make, NULL, &device_peak, NULL), 0);

    /* the same weights in bf16: a rank converts the ranges it reads */
    regc_model *m;
    assert_int_equal(regc_model_load(src, &m), REGC_OK);
    assert_int_equal(regc_model_save(m, half), REGC_OK);
    int n = regc_model_n_params(m);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    assert_non_null(e);
    for (int i = 0; i < n; i++) {
        e[i].name = (char *)regc_model_param_name(m, i);
        e[i].dtype = REGC_BF16;
        e[i].ndim = regc_model_param_shape(m, i, e[i].shape);
        e[i].data = regc_model_weights(m) + regc_model_param_offset(m, i);
    }
    char *half_file = regc_test_join(half, "model.safetensors");
    assert_int_equal(regc_st_write(half_file, e, n), REGC_OK);
    free(e);
    regc_model_free(m);

    const char *dirs[] = {src, half};
    for (int d = 0; d < 2; d++) {
        const char *a1[] = {"--model", dirs[d],      "--data",    regc_ranks.periodic,
                            "--batch", "2",          "--seq",     "16",
                            "--steps", "5",          "--lr",      "3e-3",
                            "--json",  "--no-cache", "--threads", "1",
                            "--save",  one,          NULL};
        const char *a2[] = {"--model",      dirs[d],  "--data", regc_ranks.periodic,
                            "--batch",      "2",      "--seq",  "16",
                            "--steps",      "5",      "--lr",   "3e-3",
                            "--json",       "--save", two,      "--no-cache",
                            "--zero-stage", "3",      NULL};
        double l1[REGC_RANKS_STEPS], l2[REGC_RANKS_STEPS];
        char *err1 = NULL, *err2 = NULL;
        assert_int_equal(regc_ranks_run(0, a1, l1, &device_peak, &err1), 0);
        assert_int_equal(regc_ranks_run(2, a2, l2, &device_peak, &err2), 0);
        assert_memory_equal(l1, l2, sizeof l1);
        char *w1 = regc_test_join(one, "model.safetensors"),
             *w2 = regc_test_join(two, "model.safetensors"),
             *file = regc_test_join(dirs[d], "model.safetensors");
        regc_test_same_bytes(w1, w2);
        long long want = data_bytes(file);
        if (bytes_read(err1) != want || bytes_read(err2) != want)
            fail_msg("%s holds %lld bytes of tensors; one process read %lld, two ranks %lld\n%s",
                     file, want, bytes_read(err1), bytes_read(err2), err2);
        assert_non_null(strstr(err2, "2 ranks each reading their shards"));
        free(w1), free(w2), free(file), free(err1), free(err2);
    }
    free(half_file), free(src), free(half), free(one), free(two);
}

/* ---- regc plan against the runtime --------------------------------------- */

/* regc plan's per-rank total against the device memory the ranks of a run
 * measured (their backend's high-water mark); extra: more flags of both
 * (NULL-terminated, or NULL). */
static void check_plan_with(const char *model, int ranks, const char *stage, const char *precision,
                            const char *recompute, const char *const *extra)
{
    char n[16];
    snprintf(n, sizeof n, "%d", ranks);
    const char *plan[32] = {
        REGC_BIN,      "plan",    "--model",     model,     "--ranks",      n,
        "--batch",     "2",       "--seq",       "16",      "--zero-stage", stage,
        "--precision", precision, "--recompute", recompute, "--json"};
    int n_plan = 17;
    for (int i = 0; extra && extra[i]; i++)
        plan[n_plan++] = extra[i];
    plan[n_plan] = NULL;
    regc_test_proc p;
    assert_int_equal(regc_test_run_argv(plan, &p), 0);
    cJSON *o = cJSON_Parse(p.out);
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "memory");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(mem, "total");
    assert_true(cJSON_IsNumber(total));
    double predicted = total->valuedouble;
    cJSON_Delete(o);
    regc_test_proc_free(&p);
    const char *train[32] = {"--model",      model,    "--data",      regc_ranks.plain,
                             "--batch",      "2",      "--seq",       "16",
                             "--steps",      "2",      "--json",      "--no-cache",
                             "--zero-stage", stage,    "--precision", precision,
                             "--recompute",  recompute};
    int n_train = 18;
    for (int i = 0; extra && extra[i]; i++)
        train[n_train++] = extra[i];
    train[n_train] = NULL;
    assert_int_equal(regc_ranks_run(ranks > 1 ? ranks : 0, train, NULL, &device_peak, NULL), 0);
    if (!(fabs(device_peak - predicted) <= 0.01 * predicted))
        fail_msg("%s %s at %d ranks, stage %s, recompute %s: regc plan says %.0f bytes per rank, "
                 "the run held %.0f",
                 model, precision, ranks, stage, recompute, predicted, device_peak);
}

static void check_plan(const char *model, int ranks, const char *stage, const char *precision,
                       const char *recompute)
{
    check_plan_with(model, ranks, stage, precision, recompute, NULL);
}

static void test_plan_predicts_the_peak(void **state)
{
    (void)state;
    for (int ranks = 1; ranks <= 4; ranks *= 2) {
        check_plan("gpt2-tiny", ranks, "3", "fp32", "none");
        check_plan("t5-tiny", ranks, "3", "fp32", "none");
    }
    check_plan("llama-tiny", 2, "0", "fp32", "none");
    /* bf16: tensors and gathered units in half the bytes */
    check_plan("gpt2-tiny", 2, "3", "bf16", "none");
    check_plan("llama-tiny", 2, "0", "bf16", "none");
    /* saved activations recomputed, at one rank and two */
    check_plan("gpt2-tiny", 1, "3", "fp32", "selective");
    check_plan("llama-tiny", 2, "3", "bf16", "full");
    /* LoRA: the frozen base sharded at stage 3, in bf16 and in NF4 */
    static const char *const bf16_base[] = {
        "--lora-r", "4", "--lora-target-modules", "all-linear", "--base-dtype", "bf16", NULL};
    static const char *const nf4_base[] = {
        "--lora-r", "4", "--lora-target-modules", "all-linear", "--load-in-4bit", "on", NULL};
    check_plan_with("llama-tiny", 2, "3", "fp32", "none", bf16_base);
    check_plan_with("llama-tiny", 2, "3", "fp32", "none", nf4_base);
}

/* Activations offloaded at two ranks under ZeRO-3 (B=2, T=64: large
 * enough to move): the bits of keeping them, the device memory regc plan
 * says, less of it. */
static void test_offload_at_two_ranks(void **state)
{
    (void)state;
    double kept[REGC_RANKS_STEPS], moved[REGC_RANKS_STEPS], peak[2];
    for (int on = 0; on < 2; on++) {
        const char *const plan[] = {REGC_BIN,
                                    "plan",
                                    "--model",
                                    "llama-tiny",
                                    "--ranks",
                                    "2",
                                    "--batch",
                                    "2",
                                    "--seq",
                                    "64",
                                    "--offload-activation",
                                    on ? "on" : "off",
                                    "--json",
                                    NULL};
        regc_test_proc p;
        assert_int_equal(regc_test_run_argv(plan, &p), 0);
        cJSON *o = cJSON_Parse(p.out);
        const cJSON *total = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(o, "memory"), "total");
        assert_true(cJSON_IsNumber(total));
        const double predicted = total->valuedouble;
        cJSON_Delete(o);
        regc_test_proc_free(&p);
        const char *train[] = {"--model",
                               "llama-tiny",
                               "--data",
                               regc_ranks.plain,
                               "--batch",
                               "2",
                               "--seq",
                               "64",
                               "--steps",
                               "5",
                               "--lr",
                               "3e-3",
                               "--json",
                               "--no-cache",
                               "--zero-stage",
                               "3",
                               "--offload-activation",
                               on ? "on" : "off",
                               NULL};
        assert_int_equal(regc_ranks_run(2, train, on ? moved : kept, &device_peak, NULL), 0);
        peak[on] = device_peak;
        if (!(fabs(device_peak - predicted) <= 0.01 * predicted))
            fail_msg("offload %d: regc plan says %.0f bytes per rank, the run held %.0f", on,
                     predicted, device_peak);
    }
    assert_memory_equal(kept, moved, sizeof kept);
    assert_true(peak[1] < peak[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_moves_between_rank_counts),
        cmocka_unit_test(test_model_directory_read_by_shards),
        cmocka_unit_test(test_plan_predicts_the_peak),
        cmocka_unit_test(test_offload_at_two_ranks),
    };
    return cmocka_run_group_tests(tests, regc_ranks_group_setup, regc_ranks_group_teardown);
}
