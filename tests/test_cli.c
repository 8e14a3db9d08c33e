/* test_cli.c — the `regc` command as a user meets it: the real binary run as
 * a child process, checked on exit status, stdout and stderr. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "options.h"
#include "regc_models.h"
#include "test_util.h"

#define MAX_STEPS 64

/* A usage or load error is exactly one line on stderr that names `what`
 * (a sanitizer report or a stray diagnostic would add lines). */
static void assert_one_line_error(const regc_test_proc *p, const char *what)
{
    if (regc_test_count_lines(p->err) != 1 || p->err[p->err_len - 1] != '\n' ||
        !strstr(p->err, what))
        fail_msg("expected one stderr line naming \"%s\", got:\n%s", what, p->err);
    assert_non_null(strstr(p->err, "regc"));
    assert_int_equal(p->out_len, 0);
}

/* The steps of a --json run: each stdout line must be one JSON object with
 * exactly the keys step, loss, ms, tokens_per_s and device_peak (the CPU
 * backend counts its memory), all numbers. */
static int parse_json_steps(const char *out, float *loss, int max)
{
    int n = 0;
    const char *line = out;
    while (*line) {
        const char *nl = strchr(line, '\n');
        if (!nl)
            fail_msg("unterminated last line: %s", line);
        size_t len = (size_t)(nl - line);
        char *text = malloc(len + 1);
        assert_non_null(text);
        memcpy(text, line, len);
        text[len] = '\0';

        cJSON *obj = cJSON_ParseWithOpts(text, NULL, 1);
        if (!obj || !cJSON_IsObject(obj))
            fail_msg("not one JSON object: %s", text);
        assert_int_equal(cJSON_GetArraySize(obj), 5);
        static const char *const keys[] = {"step", "loss", "ms", "tokens_per_s", "device_peak"};
        for (int k = 0; k < 5; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, keys[k]);
            if (!cJSON_IsNumber(v))
                fail_msg("key %s missing or not a number in: %s", keys[k], text);
        }
        assert_true(n < max);
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(obj, "step")->valueint, n);
        double l = cJSON_GetObjectItemCaseSensitive(obj, "loss")->valuedouble;
        double ms = cJSON_GetObjectItemCaseSensitive(obj, "ms")->valuedouble;
        double tps = cJSON_GetObjectItemCaseSensitive(obj, "tokens_per_s")->valuedouble;
        assert_true(isfinite(l));
        assert_true(ms > 0.0 && isfinite(ms));
        assert_true(tps > 0.0 && isfinite(tps));
        /* Printed with %.9g, the value converts back to the exact float. */
        loss[n++] = (float)l;

        cJSON_Delete(obj);
        free(text);
        line = nl + 1;
    }
    return n;
}

static int64_t tiny_vocab(void)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    int64_t v = regc_model_vocab(m);
    regc_model_free(m);
    return v;
}

/* Names in dir, excluding "." and "..". */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* ---- usage ------------------------------------------------------------- */

static void test_help_lists_commands(void **state)
{
    (void)state;
    static const char *const forms[][2] = {{"--help", NULL}, {"help", NULL}, {"-h", NULL}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        regc_test_proc p;
        assert_int_equal(regc_test_run_regc(&p, forms[i][0], NULL), 0);
        assert_non_null(strstr(p.out, "train"));
        assert_non_null(strstr(p.out, "version"));
        regc_test_proc_free(&p);
    }

    /* No command at all is a usage error, with the usage as the help. */
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, NULL), 2);
    assert_non_null(strstr(p.err, "train"));
    regc_test_proc_free(&p);
}

static void test_train_help_describes_every_flag(void **state)
{
    (void)state;
    static const char *const flags[] = {
        "--model", "--data",    "--steps",   "--batch", "--seq",  "--lr",  "--weight-decay",
        "--seed",  "--threads", "--backend", "--json",  "--save", "--help"};
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--help", NULL), 0);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(p.out, flags[i]))
            fail_msg("regc train --help does not mention %s:\n%s", flags[i], p.out);
    /* and every flag of the option table, a section inside a section's too */
    for (int i = 0; i < regc_option_count; i++) {
        char row[80];
        if (!regc_option_table[i].flag)
            continue; /* a config file key only */
        snprintf(row, sizeof row, "  %s ", regc_option_table[i].flag);
        if (!strstr(p.out, row))
            fail_msg("regc train --help has no row for %s", row);
    }
    assert_non_null(strstr(p.out, "gpt2-tiny")); /* the presets are listed */
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "help", "train", NULL), 0);
    assert_non_null(strstr(p.out, "--weight-decay"));
    regc_test_proc_free(&p);
}

static void test_version(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "version", NULL), 0);
    assert_true(strncmp(p.out, "regc ", 5) == 0);
    assert_int_equal(regc_test_count_lines(p.out), 2);
    /* the GEMM chosen for this CPU, which it runs */
    char want[64];
    snprintf(want, sizeof want, "\ncpu GEMM: %s (", regc_backend_cpu_gemm_name());
    assert_non_null(strstr(p.out, want));
    snprintf(want, sizeof want, " %s", regc_backend_cpu_gemm_name());
    assert_non_null(strstr(strchr(p.out, '('), want));
    regc_test_proc_free(&p);

    /* REGC_CPU_GEMM chooses another: OpenBLAS runs anywhere */
    setenv("REGC_CPU_GEMM", "openblas", 1);
    assert_int_equal(regc_test_run_regc(&p, "version", NULL), 0);
    assert_non_null(strstr(p.out, "\ncpu GEMM: openblas ("));
    regc_test_proc_free(&p);
    unsetenv("REGC_CPU_GEMM");
}

/* A REGC_CPU_GEMM that names no GEMM stops a run before it trains, with a
 * line naming the variable and the GEMMs there are. */
static void test_bad_cpu_gemm(void **state)
{
    (void)state;
    regc_test_proc p;
    setenv("REGC_CPU_GEMM", "avx3", 1);
    const int rc = regc_test_run_regc(&p, "train", "--model", "llama-tiny", "--steps", "1", NULL);
    unsetenv("REGC_CPU_GEMM");
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(p.err, "REGC_CPU_GEMM"));
    assert_non_null(strstr(p.err, "regc: REGC_CPU_GEMM: cpu GEMM \"avx3\": not one of avx512-bf16, "
                                  "avx512, avx2, openblas\n"));
    regc_test_proc_free(&p);

    /* a GEMM this CPU cannot run (where there is one) is refused by name */
    for (int i = 0; regc_backend_cpu_gemm_at(i); i++) {
        const char *name = regc_backend_cpu_gemm_at(i);
        if (regc_backend_cpu_gemm_runs(name))
            continue;
        assert_int_equal(regc_backend_cpu_use_gemm(name), REGC_ERR_UNSUPPORTED);
        assert_non_null(strstr(regc_error_message(), name));
        assert_non_null(strstr(regc_error_message(), "lacks the instructions"));
    }
    int n = 0; /* OpenBLAS, which runs anywhere, last */
    while (regc_backend_cpu_gemm_at(n))
        n++;
    assert_true(n > 0);
    assert_string_equal(regc_backend_cpu_gemm_at(n - 1), "openblas");
    assert_true(regc_backend_cpu_gemm_runs("openblas"));
}

static void test_unknown_command(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "frobnicate", NULL), 2);
    assert_one_line_error(&p, "frobnicate");
    regc_test_proc_free(&p);
}

/* regc plan and regc train take the same passes: none leaves every gather
 * where it is needed; an unknown pass is one line naming it, exit 2. */
static void test_passes_on_the_command_line(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "2",
                                        "--passes", "none", NULL),
                     0);
    assert_non_null(strstr(p.out, "each gathered where it is needed"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "2", NULL),
                     0);
    assert_non_null(strstr(p.out, "gathers start 1 unit ahead"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "2",
                                        "--passes", "prefetch,bogus", NULL),
                     2);
    assert_one_line_error(&p, "no pass named \"bogus\"");
    regc_test_proc_free(&p);
    assert_int_equal(
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--passes", "prefetch,bogus", NULL),
        2);
    assert_one_line_error(&p, "no pass named \"bogus\"");
    regc_test_proc_free(&p);
}

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
    assert_one_line_error(&p, "compile.recompute");
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

/* regc plan's precision flags: a bad value is one line naming the flag, exit 2 */
static void test_plan_precision_flags(void **state)
{
    (void)state;
    static const char *const bad[][3] = {
        {"--precision", "fp16", "--precision: expected fp32"},
        {"--fp32-storage", "maybe", "--fp32-storage: expected on"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        regc_test_proc p;
        assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "2",
                                            bad[i][0], bad[i][1], NULL),
                         2);
        assert_one_line_error(&p, bad[i][2]);
        regc_test_proc_free(&p);
    }
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
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        regc_test_proc p;
        assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                            bad[i][0], bad[i][1], bad[i][2], bad[i][3], NULL),
                         2);
        assert_one_line_error(&p, bad[i][4]);
        regc_test_proc_free(&p);
    }
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
        assert_one_line_error(&p, bad[i][2]);
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
    assert_one_line_error(&p, "even seq 1 does not fit 5 MiB per rank");
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
 * the longest sequence that fits is shorter than offloading freely finds. */
static void test_plan_fit_host_memory(void **state)
{
    (void)state;
    const long long free_fit = fit_offloading(NULL), host_fit = fit_offloading("1");
    if (!(host_fit >= 1 && host_fit < free_fit))
        fail_msg("seq %lld within 1 MiB of host memory, %lld without a limit", host_fit, free_fit);
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

static void test_unknown_flag(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--bogus", "3", NULL),
                     2);
    assert_one_line_error(&p, "--bogus");
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "stray", NULL), 2);
    assert_one_line_error(&p, "stray");
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--json=yes", NULL),
                     2);
    assert_one_line_error(&p, "--json");
    regc_test_proc_free(&p);
}

static void test_bad_numbers(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"--steps", "abc"},
        {"--steps", "0"},
        {"--steps", "-3"},
        {"--steps", "12x"},
        {"--steps", " 5"},
        {"--steps", "1.5"},
        {"--steps", "99999999999"},
        {"--batch", "0"},
        {"--batch", "99999999999999999999"},
        {"--seq", "0x10"},
        {"--seq", ""},
        {"--lr", "fast"},
        {"--lr", "0"},
        {"--lr", "-1e-3"},
        {"--lr", "nan"},
        {"--lr", "inf"},
        {"--lr", "1e-3x"},
        {"--weight-decay", "-0.1"},
        {"--seed", "-1"},
        {"--seed", "18446744073709551616"},
        {"--threads", "-2"},
        {"--threads", "two"},
        {"--lr-scheduler-type", "cosin"},
        {"--warmup-ratio", "1.5"},
        {"--warmup-steps", "-1"},
        {"--max-grad-norm", "-0.5"},
        {"--gradient-accumulation-steps", "0"},
        {"--min-lr-rate", "2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regc_test_proc p;
        int rc =
            regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", cases[i][0], cases[i][1], NULL);
        if (rc != 2)
            fail_msg("%s \"%s\": exit %d, stderr: %s", cases[i][0], cases[i][1], rc, p.err);
        assert_one_line_error(&p, cases[i][0]);
        /* The offending text is quoted back, except for the empty one. */
        if (cases[i][1][0])
            assert_non_null(strstr(p.err, cases[i][1]));
        regc_test_proc_free(&p);
    }

    regc_test_proc p;
    assert_int_equal(
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "abc", NULL), 2);
    assert_string_equal(p.err, "regc train: --steps: expected a positive integer, got \"abc\"\n");
    regc_test_proc_free(&p);
}

static void test_missing_values(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", NULL), 2);
    assert_one_line_error(&p, "--model");
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", NULL), 2);
    assert_one_line_error(&p, "--steps");
    regc_test_proc_free(&p);

    /* A flag where a value belongs means the value was left out. */
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "--json", NULL), 2);
    assert_one_line_error(&p, "--model");
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--steps", "2", NULL), 2);
    assert_one_line_error(&p, "--model");
    regc_test_proc_free(&p);
}

/* More threads than 4 per core: refused before a thread starts. */
static void test_threads_beyond_the_cores(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--threads", "4096",
                                        "--steps", "1", NULL),
                     1);
    if (!strstr(p.err, "train.threads: 4096 threads on a host of"))
        fail_msg("expected train.threads refused, got:\n%s", p.err);
    regc_test_proc_free(&p);
}

static void test_model_not_found(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("cli-missing");
    assert_non_null(dir);
    char *missing = regc_test_join(dir, "no-such-dir");
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", missing, "--steps", "1", NULL);
    assert_int_equal(rc, 1);
    assert_one_line_error(&p, "no-such-dir");
    assert_true(strncmp(p.err, "regc: ", 6) == 0);
    regc_test_proc_free(&p);
    free(missing);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

/* ---- training runs ------------------------------------------------------ */

static void test_json_steps(void **state)
{
    (void)state;
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "3", "--batch", "2",
                                "--seq", "16", "--json", NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    float loss[MAX_STEPS];
    assert_int_equal(parse_json_steps(p.out, loss, MAX_STEPS), 3);
    assert_int_equal(regc_test_count_lines(p.out), 3);
    /* Random init with std 0.02 gives near-uniform logits: loss ~ ln(vocab). */
    double expect = log((double)tiny_vocab());
    if (fabs(loss[0] - expect) > 0.5)
        fail_msg("step-0 loss %g is not near ln(vocab) = %g", (double)loss[0], expect);
    regc_test_proc_free(&p);
}

static void test_human_output(void **state)
{
    (void)state;
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "2", "--batch", "2",
                                "--seq", "16", NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    assert_int_equal(regc_test_count_lines(p.out), 2);
    const char *l1 = strchr(p.out, '\n') + 1;
    assert_true(strncmp(p.out, "step    0 | loss ", 17) == 0);
    assert_true(strncmp(l1, "step    1 | loss ", 17) == 0);
    assert_non_null(strstr(p.out, " ms | "));
    assert_non_null(strstr(p.out, " tok/s\n"));
    /* Columns line up: both lines are equally long. */
    assert_int_equal(strchr(p.out, '\n') - p.out, strchr(l1, '\n') - l1);
    assert_true(regc_test_count_lines(p.err) >= 1); /* the model's description */
    regc_test_proc_free(&p);
}

static void test_seed_decides_init(void **state)
{
    (void)state;
    float a[MAX_STEPS], b[MAX_STEPS], c[MAX_STEPS];
    regc_test_proc p;
    const char *seeds[] = {"7", "7", "8"};
    float *into[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "2", "--batch",
                                    "2", "--seq", "16", "--seed", seeds[i], "--json", NULL);
        if (rc != 0)
            fail_msg("exit %d: %s", rc, p.err);
        assert_int_equal(parse_json_steps(p.out, into[i], MAX_STEPS), 2);
        regc_test_proc_free(&p);
    }
    /* Same seed, same losses to the bit (the JSON text round-trips floats). */
    assert_memory_equal(a, b, 2 * sizeof(float));
    assert_true(a[0] != c[0]);
}

static void test_loss_decreases(void **state)
{
    (void)state;
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "8", "--batch", "2",
                                "--seq", "16", "--lr", "1e-3", "--json", NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    float loss[MAX_STEPS];
    assert_int_equal(parse_json_steps(p.out, loss, MAX_STEPS), 8);
    if (!(loss[7] < loss[0] - 0.5f))
        fail_msg("loss did not fall over 8 steps at lr 1e-3: %g -> %g", (double)loss[0],
                 (double)loss[7]);
    regc_test_proc_free(&p);
}

static void test_save_and_retrain(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("cli-save");
    assert_non_null(dir);
    char *out = regc_test_join(dir, "trained");
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "8", "--batch", "2",
                                "--seq", "16", "--lr", "1e-3", "--json", "--save", out, NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    float first[MAX_STEPS];
    assert_int_equal(parse_json_steps(p.out, first, MAX_STEPS), 8);
    regc_test_proc_free(&p);

    char *config = regc_test_join(out, "config.json");
    char *weights = regc_test_join(out, "model.safetensors");
    assert_true(regc_test_is_file(config));
    assert_true(regc_test_is_file(weights));
    assert_int_equal(count_entries(out), 2); /* no temporary files left behind */

    /* The reloaded model has learnt: batch 0 again, now at a lower loss. */
    rc = regc_test_run_regc(&p, "train", "--model", out, "--steps", "1", "--batch", "2", "--seq",
                            "16", "--json", NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    float again[MAX_STEPS];
    assert_int_equal(parse_json_steps(p.out, again, MAX_STEPS), 1);
    if (!(again[0] < first[0]))
        fail_msg("reloaded loss %g is not below the untrained %g", (double)again[0],
                 (double)first[0]);
    regc_test_proc_free(&p);

    free(config);
    free(weights);
    free(out);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

static void test_save_failure_leaves_nothing(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("cli-savefail");
    assert_non_null(dir);
    /* A regular file where the save directory's parent should be. */
    char *blocker = regc_test_join(dir, "blocker");
    assert_int_equal(regc_test_write_file(blocker, "x", 1), 0);
    char *out = regc_test_join(blocker, "model");
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "1", "--batch", "2",
                                "--seq", "16", "--json", "--save", out, NULL);
    assert_int_equal(rc, 1);
    const char *last = p.err;
    for (const char *s = p.err; *s; s++)
        if (*s == '\n' && s[1])
            last = s + 1;
    if (strncmp(last, "regc: ", 6) != 0 || !strstr(last, "blocker"))
        fail_msg("expected a last stderr line naming the save path, got:\n%s", p.err);
    assert_int_equal(count_entries(dir), 1);
    regc_test_proc_free(&p);
    free(out);
    free(blocker);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

static void test_data_file(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("cli-data");
    assert_non_null(dir);
    char *good = regc_test_join(dir, "tokens.bin");
    enum { N = 2 * 16 * 3 + 1 };
    uint16_t tokens[N];
    for (int i = 0; i < N; i++)
        tokens[i] = (uint16_t)((i * 7) % 97);
    assert_int_equal(regc_tokens_write(good, tokens, N), REGC_OK);

    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", good, "--steps", "2",
                                "--batch", "2", "--seq", "16", "--json", NULL);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, p.err);
    float loss[MAX_STEPS];
    assert_int_equal(parse_json_steps(p.out, loss, MAX_STEPS), 2);
    regc_test_proc_free(&p);

    /* A file that is not a token file: the error names it. */
    char *bad = regc_test_join(dir, "garbage.bin");
    assert_int_equal(regc_test_write_file(bad, "not tokens", 10), 0);
    rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", bad, "--steps", "1",
                            "--batch", "2", "--seq", "16", "--json", NULL);
    assert_int_equal(rc, 1);
    if (!strstr(p.err, "garbage.bin"))
        fail_msg("error does not name the data file:\n%s", p.err);
    assert_int_equal(p.out_len, 0);
    regc_test_proc_free(&p);

    free(bad);
    free(good);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

/* Options that are each valid but contradict one another: one line
 * naming the key, exit 1, nothing trained or written. */
static void test_contradicting_options(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("cli-contradict");
    assert_non_null(dir);
    char *save = regc_test_join(dir, "out");
    static const char *const cases[][5] = {
        {"--warmup-steps", "5", "--lr-scheduler-type", "linear", "train.warmup_steps"},
        {"--warmup-steps", "2", "--lr-scheduler-type", "constant", "constant_with_warmup"},
        {"--min-lr", "1e-5", "--lr-scheduler-type", "cosine", "train.min_lr"},
        {"--lr-scheduler-type", "cosine_with_min_lr", "--steps", "3", "min_lr_rate"},
        {"--communicator", "nccl", "--backend", "cpu", "nccl needs the cuda backend"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regc_test_proc p;
        int rc = regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "3",
                                    cases[i][0], cases[i][1], cases[i][2], cases[i][3], "--save",
                                    save, "--no-cache", NULL);
        assert_int_equal(rc, 1);
        if (regc_test_count_lines(p.err) != 1 || !strstr(p.err, cases[i][4]))
            fail_msg("case %zu: expected one line naming %s, got:\n%s", i, cases[i][4], p.err);
        assert_int_equal(p.out_len, 0);
        struct stat st;
        assert_true(stat(save, &st) != 0); /* nothing written */
        regc_test_proc_free(&p);
    }
    free(save);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_lists_commands),
        cmocka_unit_test(test_train_help_describes_every_flag),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_bad_cpu_gemm),
        cmocka_unit_test(test_unknown_command),
        cmocka_unit_test(test_unknown_flag),
        cmocka_unit_test(test_passes_on_the_command_line),
        cmocka_unit_test(test_plan_precision_flags),
        cmocka_unit_test(test_plan_reads_the_configs),
        cmocka_unit_test(test_plan_recompute_flags),
        cmocka_unit_test(test_train_memory_flags),
        cmocka_unit_test(test_plan_fit_finds_the_longest),
        cmocka_unit_test(test_plan_fit_host_memory),
        cmocka_unit_test(test_plan_host_memory),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_missing_values),
        cmocka_unit_test(test_threads_beyond_the_cores),
        cmocka_unit_test(test_model_not_found),
        cmocka_unit_test(test_json_steps),
        cmocka_unit_test(test_human_output),
        cmocka_unit_test(test_seed_decides_init),
        cmocka_unit_test(test_loss_decreases),
        cmocka_unit_test(test_save_and_retrain),
        cmocka_unit_test(test_save_failure_leaves_nothing),
        cmocka_unit_test(test_data_file),
        cmocka_unit_test(test_contradicting_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
