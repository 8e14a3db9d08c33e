/* test_cli_plan.c — `regc plan` and the memory flags as a user meets them:
 * the real binary run as a child process, checked on exit status, stdout
 * and stderr. The plan reads regc train's options and config files, its
 * precision and recompute flags, the search for the longest sequence that
 * fits, and host memory; `regc train` refuses bad memory flags alike. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_util.h"

/* One plan's JSON (its exit status 0 asserted), from regc plan argv. */
static cJSON *plan_json(const char *const *args)
{
    const char *argv[32] = {REGC_BIN, "plan", "--json"};
    int n = 3;
    for (; args[n - 3] && n < 31; n++)
        argv[n] = args[n - 3];
    argv[n] = NULL;
    regc_test_proc p;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("regc plan failed: %s", p.err);
    cJSON *o = cJSON_Parse(p.out);
    regc_test_proc_free(&p);
    assert_non_null(o);
    return o;
}

static double json_at(const cJSON *o, const char *section, const char *key)
{
    const cJSON *x = section ? cJSON_GetObjectItemCaseSensitive(o, section) : o;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(x, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* regc plan reads regc train's options, config files included: a DeepSpeed
 * config's micro-batch, bf16 and offloaded optimizer reach the plan, and
 * the plan of the file is the plan of the flags that say the same; a flag
 * overrides the file; a bad key is the file's error, exit 1; a file that
 * names no stage plans stage 0, as its run would, and its epochs read no
 * data. */
static void test_plan_reads_the_configs(void **state)
{
    (void)state;
    const char *ds = REGC_SOURCE_DIR "/tests/data/ds_zero3.json";
    const char *by_file[] = {"--model", "gpt2-tiny", "--ranks", "2", "--deepspeed", ds, NULL};
    cJSON *f = plan_json(by_file);
    const cJSON *precision = cJSON_GetObjectItemCaseSensitive(f, "precision");
    if (json_at(f, NULL, "batch") != 2 || !cJSON_IsString(precision) ||
        strcmp(precision->valuestring, "bf16") != 0 || !(json_at(f, "memory", "host") > 0))
        fail_msg("the DeepSpeed config's micro-batch 2, bf16 and offloaded optimizer did not "
                 "reach the plan");
    /* the same step said by flags: ds_zero3.json's keys one by one */
    const char *by_flags[] = {"--model",
                              "gpt2-tiny",
                              "--ranks",
                              "2",
                              "--batch",
                              "2",
                              "--gradient-accumulation-steps",
                              "2",
                              "--precision",
                              "bf16",
                              "--offload-optimizer",
                              "cpu",
                              "--prefetch-bucket-size",
                              "50000000",
                              "--param-persistence-threshold",
                              "100000",
                              "--max-live-parameters",
                              "1000000000",
                              "--reduce-bucket-size",
                              "500000000",
                              NULL};
    cJSON *g = plan_json(by_flags);
    if (json_at(f, "memory", "total") != json_at(g, "memory", "total") ||
        json_at(f, "memory", "host") != json_at(g, "memory", "host") ||
        json_at(f, "schedule", "resident") != json_at(g, "schedule", "resident"))
        fail_msg("the config planned %.0f bytes (%.0f on the host, %.0f resident), its flags "
                 "%.0f (%.0f, %.0f)",
                 json_at(f, "memory", "total"), json_at(f, "memory", "host"),
                 json_at(f, "schedule", "resident"), json_at(g, "memory", "total"),
                 json_at(g, "memory", "host"), json_at(g, "schedule", "resident"));
    const char *overridden[] = {"--model", "gpt2-tiny", "--ranks", "2", "--deepspeed",
                                ds,        "--batch",   "1",       NULL};
    cJSON *h = plan_json(overridden);
    assert_true(json_at(h, NULL, "batch") == 1);
    cJSON_Delete(f), cJSON_Delete(g), cJSON_Delete(h);
    char *dir = regc_test_make_temp_dir("plan-config");
    char *bad = regc_test_join(dir, "bad.json");
    FILE *out = fopen(bad, "w");
    assert_non_null(out);
    fputs("{\"compile\": {\"recompute\": \"most\"}}", out);
    fclose(out);
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                        "--config", bad, NULL),
                     1);
    regc_test_expect_one_line_error(&p, -1, "compile.recompute", NULL);
    regc_test_proc_free(&p);
    /* a file that names no stage plans its run's, 0; epochs read no data */
    char *plain = regc_test_join(dir, "plain.json");
    out = fopen(plain, "w");
    assert_non_null(out);
    fputs("{\"train\": {\"model\": \"gpt2-tiny\", \"data\": \"/nonexistent/tokens.bin\"}, "
          "\"num_train_epochs\": 2}",
          out);
    fclose(out);
    const char *by_plain[] = {"--config", plain, "--ranks", "2", NULL};
    cJSON *k = plan_json(by_plain);
    assert_true(json_at(k, NULL, "zero_stage") == 0);
    cJSON_Delete(k);
    regc_test_remove_tree(dir);
    free(bad), free(plain), free(dir);
}

/* regc plan of gpt2-tiny at `ranks` with flags a .. d (NULL ends them) is
 * refused as a usage error: exit 2, one line naming `what`. */
static void expect_plan_refuses(const char *ranks, const char *a, const char *b, const char *c,
                                const char *d, const char *what)
{
    regc_test_proc p;
    regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", ranks, a, b, c, d, NULL);
    regc_test_expect_one_line_error(&p, 2, what, NULL);
    regc_test_proc_free(&p);
}

/* regc plan's precision flags: a bad value is one line naming the flag, exit 2 */
static void test_plan_precision_flags(void **state)
{
    (void)state;
    static const char *const bad[][3] = {
        {"--precision", "fp16", "--precision: expected fp32"},
        {"--fp32-storage", "maybe", "--fp32-storage: expected on"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_plan_refuses("2", bad[i][0], bad[i][1], NULL, NULL, bad[i][2]);
}

/* regc plan's recompute flags: a bad value is one line naming the flag,
 * exit 2; --fit without its memory likewise */
static void test_plan_recompute_flags(void **state)
{
    (void)state;
    static const char *const bad[][5] = {
        {"--recompute", "most", NULL, NULL, "--recompute: expected none"},
        {"--fit", "depth", "--device-memory-mb", "100", "--fit: expected seq or batch"},
        {"--fit", "seq", NULL, NULL, "--fit and --device-memory-mb go together"},
        {"--device-memory-mb", "-4", NULL, NULL, "--device-memory-mb"},
        {"--fit", "seq", "--device-memory-mb", "0", "--device-memory-mb"},
        {"--memory-budget-mb", "-3", NULL, NULL, "--memory-budget-mb: expected an integer"},
        {"--host-memory-mb", "0", NULL, NULL, "--host-memory-mb: expected an integer from 1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_plan_refuses("1", bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4]);
}

/* regc train's memory flags: a bad value is one line naming the flag, exit
 * 2; a budget below the least the step can need is one line naming that
 * least, exit 1, before any step runs. */
static void test_train_memory_flags(void **state)
{
    (void)state;
    static const char *const bad[][3] = {
        {"--recompute", "most", "--recompute: expected none, selective, full or auto"},
        {"--memory-budget-mb", "-3", "--memory-budget-mb: expected an integer"},
        {"--logits-chunk-rows", "-1", "--logits-chunk-rows:"},
        {"--offload-activation", "yes", "--offload-activation:"},
        {"--host-memory-mb", "-1", "--host-memory-mb: expected an integer"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        regc_test_proc p;
        assert_int_equal(
            regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", bad[i][0], bad[i][1], NULL), 2);
        regc_test_expect_one_line_error(&p, -1, bad[i][2], NULL);
        regc_test_proc_free(&p);
    }
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "1",
                                        "--memory-budget-mb", "4", "--no-cache", NULL),
                     1);
    /* the model's description may come first; then one line, the last */
    const char *why = strstr(p.err, "regc: compile.memory_budget_mb: the step needs");
    const char *nl = why ? strchr(why, '\n') : NULL;
    if (!why || (why != p.err && why[-1] != '\n') || !nl || nl[1] != '\0' ||
        !strstr(why, "MiB per rank at the least") || p.out_len != 0)
        fail_msg("expected one line naming the least the step needs, got:\n%s%s", p.out, p.err);
    regc_test_proc_free(&p);
}

/* The JSON plan's total at --seq T (and the plan's exit status). */
static double plan_total(const char *seq, const char *budget_mb, int *status)
{
    regc_test_proc p;
    *status =
        regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1", "--zero-stage", "0",
                           "--seq", seq, "--memory-budget-mb", budget_mb, "--json", NULL);
    double total = -1.0;
    cJSON *o = *status == 0 ? cJSON_Parse(p.out) : NULL;
    const cJSON *t =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "memory"), "total");
    if (cJSON_IsNumber(t))
        total = t->valuedouble;
    cJSON_Delete(o);
    regc_test_proc_free(&p);
    return total;
}

/* regc plan --fit seq finds the longest sequence that fits: the step at it
 * fits the memory, one token more does not; below the least it can need it
 * refuses with one line, exit 1. */
static void test_plan_fit_finds_the_longest(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                        "--zero-stage", "0", "--fit", "seq", "--device-memory-mb",
                                        "30", NULL),
                     0);
    const char *at = strstr(p.out, "seq ");
    assert_non_null(at);
    long long t = atoll(at + 4);
    assert_true(t >= 1);
    assert_non_null(strstr(p.out, "recompute: auto"));
    regc_test_proc_free(&p);
    char seq[32], next[32];
    snprintf(seq, sizeof seq, "%lld", t);
    snprintf(next, sizeof next, "%lld", t + 1);
    int status;
    const double fits = plan_total(seq, "30", &status);
    assert_int_equal(status, 0);
    assert_true(fits > 0 && fits <= 30.0 * (1 << 20));
    plan_total(next, "30", &status);
    if (t < 256) /* gpt2-tiny's positions end at 256: beyond, the model says no */
        assert_int_equal(status, 1);
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                        "--zero-stage", "0", "--fit", "seq", "--device-memory-mb",
                                        "5", NULL),
                     1);
    regc_test_expect_one_line_error(&p, -1, "even seq 1 does not fit 5 MiB per rank", NULL);
    regc_test_proc_free(&p);
}

/* regc plan on llama-tiny, ZeRO-3 over 2 ranks, within budget_mb: the
 * exit status of the plan at --<what> size, or with fit (size NULL) the
 * size --fit finds (-1 when it refuses). */
static long long plan_llama(const char *what, const char *size, const char *budget_mb)
{
    char flag[16];
    snprintf(flag, sizeof flag, "--%s", what);
    const char *argv[] = {REGC_BIN,
                          "plan",
                          "--model",
                          "llama-tiny",
                          "--ranks",
                          "2",
                          "--zero-stage",
                          "3",
                          size ? flag : "--fit",
                          size ? size : what,
                          size ? "--memory-budget-mb" : "--device-memory-mb",
                          budget_mb,
                          NULL};
    regc_test_proc p;
    const int status = regc_test_run_argv(argv, &p);
    long long found = -1;
    char want[64];
    snprintf(want, sizeof want, "--fit %s: %s ", what, what);
    const char *at = strstr(p.out, want);
    if (!size && status == 0 && at)
        found = atoll(at + strlen(want));
    if (!size && status == 0 && !strstr(p.out, "sizes tried in"))
        fail_msg("the fit does not say how many sizes it tried:\n%s", p.out);
    regc_test_proc_free(&p);
    return size ? status : found;
}

/* --fit's search steers by what each size's least choice holds, but only
 * whether a size fits decides: under ZeRO-3, where the budget's room is
 * then filled with gathered units, the size found fits the budget as a
 * plan of it compiles, and one more does not, for sequences and batches
 * at budgets from tight to the model's positions; a pass's own smaller
 * budget is the one fitted. */
static void test_plan_fit_is_the_boundary(void **state)
{
    (void)state;
    static const struct {
        const char *what, *budget_mb;
    } cases[] = {{"seq", "12"}, {"seq", "20"}, {"batch", "12"}, {"batch", "20"}, {"seq", "40"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const long long t = plan_llama(cases[i].what, NULL, cases[i].budget_mb);
        char at[32], next[32];
        snprintf(at, sizeof at, "%lld", t);
        snprintf(next, sizeof next, "%lld", t + 1);
        const long long fits = t >= 1 ? plan_llama(cases[i].what, at, cases[i].budget_mb) : -1;
        const long long over = t >= 1 ? plan_llama(cases[i].what, next, cases[i].budget_mb) : -1;
        if (fits != 0 || over != 1)
            fail_msg("--fit %s within %s MiB found %lld: its plan exits %lld, one more %lld",
                     cases[i].what, cases[i].budget_mb, t, fits, over);
    }
    /* a pass's own budget, below --device-memory-mb, is the one to fit:
     * the same size as that budget alone */
    regc_test_proc q;
    assert_int_equal(regc_test_run_regc(&q, "plan", "--model", "llama-tiny", "--ranks", "2",
                                        "--zero-stage", "3", "--fit", "seq", "--device-memory-mb",
                                        "40", "--passes",
                                        "prefetch,overlap_reduce,selective_gather@12", NULL),
                     0);
    const char *at = strstr(q.out, "--fit seq: seq ");
    assert_non_null(at);
    const long long with_pass = atoll(at + strlen("--fit seq: seq "));
    regc_test_proc_free(&q);
    if (with_pass != plan_llama("seq", NULL, "12"))
        fail_msg("--fit within 40 MiB and selective_gather@12 found %lld, within 12 MiB %lld",
                 with_pass, plan_llama("seq", NULL, "12"));
    /* past the positions: the size that does not fit is the first the
     * model refuses, and the line says why */
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "llama-tiny", "--ranks", "2",
                                        "--zero-stage", "3", "--fit", "seq", "--device-memory-mb",
                                        "400", NULL),
                     0);
    if (!strstr(p.out, "seq 256 is the most that fits 400 MiB per rank (257 does not; seq 257: "
                       "sequence length 257 exceeds max_position_embeddings 256"))
        fail_msg("expected the positions to end the search:\n%s", p.out);
    regc_test_proc_free(&p);
}

/* The sequence regc plan --fit finds for gpt2-tiny offloading activations
 * within 18 MiB of device memory, and `host` MiB of host memory (NULL: no
 * limit). */
static long long fit_offloading(const char *host)
{
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                        "--zero-stage", "0", "--offload-activation", "on", "--fit",
                                        "seq", "--device-memory-mb", "18",
                                        host ? "--host-memory-mb" : NULL, host, NULL),
                     0);
    const char *at = strstr(p.out, "seq ");
    assert_non_null(at);
    const long long t = atoll(at + 4);
    if (host && !strstr(p.out, "and 1 MiB of host memory"))
        fail_msg("the fit does not name its host memory:\n%s", p.out);
    regc_test_proc_free(&p);
    return t;
}

/* --host-memory-mb bounds what offloading may put on the host: with 1 MiB
 * the longest sequence that fits is shorter than offloading freely finds;
 * where the optimizer's state alone is more than the host takes, even one
 * token is refused naming the host's limit and what it would hold. */
static void test_plan_fit_host_memory(void **state)
{
    (void)state;
    const long long free_fit = fit_offloading(NULL), host_fit = fit_offloading("1");
    if (!(host_fit >= 1 && host_fit < free_fit))
        fail_msg("seq %lld within 1 MiB of host memory, %lld without a limit", host_fit, free_fit);
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                        "--zero-stage", "0", "--fit", "seq", "--device-memory-mb",
                                        "64", "--offload-optimizer", "cpu", "--host-memory-mb", "1",
                                        NULL),
                     1);
    regc_test_expect_one_line_error(&p, -1, "compile.host_memory_mb: the step holds",
                                    "on the host at its least device memory; the limit is 1.0 MiB");
    regc_test_proc_free(&p);
}

/* regc plan says what the host holds: offloaded activations, the
 * optimizer's state, or both with each part's size; the JSON's host is
 * the sum of its parts. */
static void test_plan_host_memory(void **state)
{
    (void)state;
    static const struct {
        const char *optimizer, *activation, *says;
    } ways[] = {
        {"none", "on", "(offloaded activations)"},
        {"cpu", "off", "(the optimizer's, offloaded: AdamW m and v"},
        {"cpu", "on", "; offloaded activations "},
    };
    for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
        regc_test_proc p;
        for (int json = 0; json < 2; json++) {
            assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                                "--batch", "2", "--seq", "64",
                                                "--offload-optimizer", ways[w].optimizer,
                                                "--offload-activation", ways[w].activation,
                                                json ? "--json" : NULL, NULL),
                             0);
            if (!json) {
                if (!strstr(p.out, ways[w].says))
                    fail_msg("optimizer %s, activations %s: no \"%s\" in\n%s", ways[w].optimizer,
                             ways[w].activation, ways[w].says, p.out);
            } else {
                cJSON *o = cJSON_Parse(p.out);
                const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "memory");
                const double host = cJSON_GetObjectItemCaseSensitive(mem, "host")->valuedouble;
                const double act =
                    cJSON_GetObjectItemCaseSensitive(mem, "host_activations")->valuedouble;
                const int on = strcmp(ways[w].activation, "on") == 0;
                assert_true(on ? act > 0 : act == 0);
                assert_true(strcmp(ways[w].optimizer, "cpu") == 0 ? host > act : host == act);
                cJSON_Delete(o);
            }
            regc_test_proc_free(&p);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_precision_flags),
        cmocka_unit_test(test_plan_reads_the_configs),
        cmocka_unit_test(test_plan_recompute_flags),
        cmocka_unit_test(test_train_memory_flags),
        cmocka_unit_test(test_plan_fit_finds_the_longest),
        cmocka_unit_test(test_plan_fit_is_the_boundary),
        cmocka_unit_test(test_plan_fit_host_memory),
        cmocka_unit_test(test_plan_host_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
