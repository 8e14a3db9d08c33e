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
    regc_test_expect_one_line_error(&p, -1, "frobnicate", NULL);
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
    regc_test_expect_one_line_error(&p, -1, "no pass named \"bogus\"", NULL);
    regc_test_proc_free(&p);
    assert_int_equal(
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--passes", "prefetch,bogus", NULL),
        2);
    regc_test_expect_one_line_error(&p, -1, "no pass named \"bogus\"", NULL);
    regc_test_proc_free(&p);
}

static void test_unknown_flag(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--bogus", "3", NULL),
                     2);
    regc_test_expect_one_line_error(&p, -1, "--bogus", NULL);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "stray", NULL), 2);
    regc_test_expect_one_line_error(&p, -1, "stray", NULL);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--json=yes", NULL),
                     2);
    regc_test_expect_one_line_error(&p, -1, "--json", NULL);
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
        regc_test_expect_one_line_error(&p, -1, cases[i][0], NULL);
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
    regc_test_expect_one_line_error(&p, -1, "--model", NULL);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", NULL), 2);
    regc_test_expect_one_line_error(&p, -1, "--steps", NULL);
    regc_test_proc_free(&p);

    /* A flag where a value belongs means the value was left out. */
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "--json", NULL), 2);
    regc_test_expect_one_line_error(&p, -1, "--model", NULL);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--steps", "2", NULL), 2);
    regc_test_expect_one_line_error(&p, -1, "--model", NULL);
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
    regc_test_expect_one_line_error(&p, -1, "no-such-dir", NULL);
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
