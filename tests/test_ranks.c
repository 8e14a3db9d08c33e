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
 * - A checkpoint written at N = 2 under stage 3 resumes at N = 2 bit for
 *   bit, and in one process and at N = 4 within 1e-5.
 * - `regc plan` predicts the device memory each rank holds, within 1%, at
 *   N = 1, 2 and 4.
 * - Ranks started with different settings (the run's, the stage, the
 *   compile level) fail at start-up with one line naming what differs; a
 *   rank that dies ends the others instead of leaving them waiting.
 *
 * Under AddressSanitizer the ranks run without leak detection: Open MPI's
 * components keep memory until exit from libraries it has unloaded by
 * then, which no suppression can name; address errors are still caught,
 * and the one-process runs check regc's own leaks. */
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

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_data.h"
#include "regc_models.h"
#include "test_util.h"

#define MPIRUN "/usr/bin/mpirun"
#define STEPS 5

static char *tmp;      /* the group's directory */
static char *periodic; /* tokens whose period is one batch of 2 x 16 */
static char *plain;    /* tokens without a period */

static int group_setup(void **state)
{
    (void)state;
    if (!(tmp = regc_test_make_temp_dir("ranks")))
        return -1;
    periodic = regc_test_join(tmp, "periodic.bin");
    plain = regc_test_join(tmp, "plain.bin");
    enum { N = 6000 };
    uint16_t *t = malloc(N * sizeof *t), *u = malloc(N * sizeof *u);
    for (int i = 0; i < N; i++) {
        t[i] = (uint16_t)(((i % (2 * 16)) * 37 + 11) % 251); /* T5 reads 2T per row: 2 x 16 */
        u[i] = (uint16_t)(regc_rng_at(77, (uint64_t)i) % 251);
    }
    int rc = regc_tokens_write(periodic, t, N) || regc_tokens_write(plain, u, N);
    free(t), free(u);
    return rc;
}

static int group_teardown(void **state)
{
    (void)state;
    regc_test_remove_tree(tmp);
    free(tmp), free(periodic), free(plain);
    return 0;
}

static double device_peak; /* the last run's, from its last step line */

/* mpirun and the options every job here takes (root allowed, more ranks
 * than cores, no binding, one thread per rank, no leak check of Open MPI's
 * own memory) into argv from n; returns the new count. */
static int add_mpirun(const char **argv, int n)
{
    static const char *const mpi[] = {MPIRUN,
                                      "--allow-run-as-root",
                                      "--oversubscribe",
                                      "--bind-to",
                                      "none",
                                      "-x",
                                      "OMP_NUM_THREADS=1",
                                      "-x",
                                      "ASAN_OPTIONS=detect_leaks=0"};
    for (size_t i = 0; i < sizeof mpi / sizeof *mpi; i++)
        argv[n++] = mpi[i];
    return n;
}

/* Run regc train on `np` ranks (0: one process, no mpirun) with argv after
 * "train"; stdout's step losses into loss[] (and the device's high-water
 * mark into device_peak), returns the exit status. */
static int run(int np, const char *const *args, double *loss, char **err)
{
    const char *argv[64];
    int n = 0;
    char npbuf[16];
    if (np > 0) {
        snprintf(npbuf, sizeof npbuf, "%d", np);
        n = add_mpirun(argv, n);
        argv[n++] = "-np";
        argv[n++] = npbuf;
    }
    argv[n++] = REGC_BIN;
    argv[n++] = "train";
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    regc_test_proc p;
    int rc = regc_test_run_argv(argv, &p);
    for (int k = 0; loss && k < STEPS; k++)
        loss[k] = NAN;
    device_peak = NAN;
    for (char *line = strtok(p.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "loss");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "device_peak");
        if (loss && cJSON_IsNumber(s) && cJSON_IsNumber(l) && s->valueint >= 0 &&
            s->valueint < STEPS)
            loss[s->valueint] = l->valuedouble;
        if (cJSON_IsNumber(d))
            device_peak = d->valuedouble;
        cJSON_Delete(o);
    }
    if (err)
        *err = strdup(p.err);
    else if (rc != 0)
        fprintf(stderr, "%s", p.err);
    regc_test_proc_free(&p);
    return rc;
}

static void same_bytes(const char *a, const char *b)
{
    size_t na, nb;
    char *x = regc_test_read_file(a, &na), *y = regc_test_read_file(b, &nb);
    if (!x || !y || na != nb || memcmp(x, y, na) != 0)
        fail_msg("%s and %s differ", a, b);
    free(x), free(y);
}

/* ---- equal halves: bit for bit ------------------------------------------ */

/* precision: compile.precision of every run; under bf16, stage 3 gathers
 * the weights in bf16, which gives stage 0's bits (their GEMMs round them);
 * extra (NULL-terminated, or NULL) more flags of every run, and `saved` the
 * file of --save's directory compared. */
static void equal_halves(const char *model, const char *precision, const char *const *extra,
                         const char *saved)
{
    char *one = regc_test_join(tmp, "one"), *two = regc_test_join(tmp, "two");
    const char *a1[48] = {"--model", model,    "--data", periodic,      "--batch",
                          "2",       "--seq",  "16",     "--steps",     "5",
                          "--lr",    "3e-3",   "--json", "--no-cache",  "--threads",
                          "1",       "--save", one,      "--precision", precision};
    int n1 = 20;
    for (int i = 0; extra && extra[i]; i++)
        a1[n1++] = extra[i];
    a1[n1] = NULL;
    double l1[STEPS], l2[STEPS];
    assert_int_equal(run(0, a1, l1, NULL), 0);
    char *w1 = regc_test_join(one, saved), *w2 = regc_test_join(two, saved);
    for (int stage = 0; stage <= 3; stage += 3) {
        const char *a2[48] = {
            "--model",     model,        "--data",  periodic, "--batch",      "2",
            "--seq",       "16",         "--steps", "5",      "--lr",         "3e-3",
            "--json",      "--no-cache", "--save",  two,      "--zero-stage", stage ? "3" : "0",
            "--precision", precision};
        int n2 = 20;
        for (int i = 0; extra && extra[i]; i++)
            a2[n2++] = extra[i];
        a2[n2] = NULL;
        assert_int_equal(run(2, a2, l2, NULL), 0);
        for (int k = 0; k < STEPS; k++)
            if (memcmp(&l1[k], &l2[k], sizeof l1[k]) != 0)
                fail_msg("%s %s step %d: one process %.9g, two ranks at stage %d %.9g", model,
                         precision, k, l1[k], stage, l2[k]);
        same_bytes(w1, w2);
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
    const char *a1[] = {"--model", model,        "--data",    plain, "--batch", "4",
                        "--seq",   "16",         "--steps",   "5",   "--lr",    "3e-3",
                        "--json",  "--no-cache", "--threads", "1",   NULL};
    double one[STEPS], two[STEPS], two_again[STEPS], four[STEPS];
    assert_int_equal(run(0, a1, one, NULL), 0);
    for (int stage = 0; stage <= 3; stage += 3) {
        const char *z = stage ? "3" : "0";
        const char *a2[] = {"--model", model,        "--data",       plain, "--batch", "2",
                            "--seq",   "16",         "--steps",      "5",   "--lr",    "3e-3",
                            "--json",  "--no-cache", "--zero-stage", z,     NULL};
        const char *a4[] = {"--model", model,        "--data",       plain, "--batch", "1",
                            "--seq",   "16",         "--steps",      "5",   "--lr",    "3e-3",
                            "--json",  "--no-cache", "--zero-stage", z,     NULL};
        assert_int_equal(run(2, a2, two, NULL), 0);
        assert_int_equal(run(2, a2, two_again, NULL), 0);
        assert_int_equal(run(4, a4, four, NULL), 0);
        for (int k = 0; k < STEPS; k++) {
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
    const char *a[] = {"--model", "gpt2-tiny",   "--data", plain,        "--batch",
                       "4",       "--seq",       "16",     "--steps",    "5",
                       "--lr",    "3e-3",        "--json", "--no-cache", "--shuffle",
                       "on",      "--data-seed", "9",      NULL};
    double one[STEPS], two[STEPS];
    assert_int_equal(run(0, a, one, NULL), 0);
    a[5] = "2"; /* --batch: per rank */
    assert_int_equal(run(2, a, two, NULL), 0);
    for (int k = 0; k < STEPS; k++)
        if (!(fabs(two[k] - one[k]) <= 1e-5 * fabs(one[k])))
            fail_msg("shuffled, step %d: one process %.9g, 2 ranks %.9g", k, one[k], two[k]);
}

/* At 2 ranks every program of a stage gives the scheduled one's bits, at
 * compile.precision `precision`. */
static void check_programs_agree(const char *stage, const char *precision,
                                 const char *const (*ways)[2], size_t n_ways)
{
    char *ref = regc_test_join(tmp, "scheduled"), *other = regc_test_join(tmp, "other");
    char *wref = regc_test_join(ref, "model.safetensors"),
         *wother = regc_test_join(other, "model.safetensors");
    double lref[STEPS], l[STEPS];
    const char *base[] = {"--model",     "llama-tiny", "--data",  plain, "--batch",      "2",
                          "--seq",       "16",         "--steps", "5",   "--lr",         "3e-3",
                          "--json",      "--no-cache", "--save",  ref,   "--zero-stage", stage,
                          "--precision", precision,    NULL};
    assert_int_equal(run(2, base, lref, NULL), 0);
    for (size_t w = 0; w < n_ways; w++) {
        const char *args[] = {"--model",  "llama-tiny",   "--data", plain,         "--batch",
                              "2",        "--seq",        "16",     "--steps",     "5",
                              "--lr",     "3e-3",         "--json", "--no-cache",  "--save",
                              other,      "--zero-stage", stage,    "--precision", precision,
                              ways[w][0], ways[w][1],     NULL};
        assert_int_equal(run(2, args, l, NULL), 0);
        for (int k = 0; k < STEPS; k++)
            if (memcmp(&l[k], &lref[k], sizeof l[k]) != 0)
                fail_msg("stage %s %s, %s %s, step %d: %.9g, scheduled %.9g", stage, precision,
                         ways[w][0], ways[w][1], k, l[k], lref[k]);
        same_bytes(wref, wother);
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

/* ---- checkpoints move between rank counts and stages ---------------------- */

/* A checkpoint written by 2 ranks at stage 3 (every rank's shards joined
 * into the model's order) resumes at 2 ranks bit for bit, and in one
 * process and at 4 ranks within 1e-5 of a run that never stopped. */
static void test_checkpoint_moves_between_rank_counts(void **state)
{
    (void)state;
    char *out = regc_test_join(tmp, "ck"), *ck = regc_test_join(out, "checkpoint-2");
    const char *straight[] = {"--model", "gpt2-tiny",  "--data",    plain, "--batch", "4",
                              "--seq",   "16",         "--steps",   "5",   "--lr",    "3e-3",
                              "--json",  "--no-cache", "--threads", "1",   NULL};
    const char *first[] = {"--model", "gpt2-tiny",    "--data", plain,          "--batch",
                           "2",       "--seq",        "16",     "--steps",      "5",
                           "--lr",    "3e-3",         "--json", "--no-cache",   "--zero-stage",
                           "3",       "--output-dir", out,      "--save-steps", "2",
                           NULL};
    const char *again[] = {"--model",
                           "gpt2-tiny",
                           "--data",
                           plain,
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
                         plain,
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
                          plain,
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
    double s[STEPS], f[STEPS], a[STEPS], r1[STEPS], r4[STEPS];
    assert_int_equal(run(0, straight, s, NULL), 0);
    assert_int_equal(run(2, first, f, NULL), 0);
    assert_int_equal(run(2, again, a, NULL), 0);
    assert_int_equal(run(0, one, r1, NULL), 0);
    assert_int_equal(run(4, four, r4, NULL), 0);
    for (int k = 2; k < STEPS; k++) {
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
    char *src = regc_test_join(tmp, "src"), *half = regc_test_join(tmp, "src16");
    char *one = regc_test_join(tmp, "dir1"), *two = regc_test_join(tmp, "dir2");
    const char *make[] = {"--model", "llama-tiny", "--data", periodic,     "--batch",
                          "2",       "--seq",      "16",     "--steps",    "2",
                          "--lr",    "3e-3",       "--json", "--no-cache", "--threads",
                          "1",       "--save",     src,      NULL};
    assert_int_equal(run(0, make, NULL, NULL), 0);

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
        const char *a1[] = {"--model", dirs[d],  "--data", periodic,     "--batch",
                            "2",       "--seq",  "16",     "--steps",    "5",
                            "--lr",    "3e-3",   "--json", "--no-cache", "--threads",
                            "1",       "--save", one,      NULL};
        const char *a2[] = {"--model",    dirs[d],        "--data", periodic,  "--batch",
                            "2",          "--seq",        "16",     "--steps", "5",
                            "--lr",       "3e-3",         "--json", "--save",  two,
                            "--no-cache", "--zero-stage", "3",      NULL};
        double l1[STEPS], l2[STEPS];
        char *err1 = NULL, *err2 = NULL;
        assert_int_equal(run(0, a1, l1, &err1), 0);
        assert_int_equal(run(2, a2, l2, &err2), 0);
        assert_memory_equal(l1, l2, sizeof l1);
        char *w1 = regc_test_join(one, "model.safetensors"),
             *w2 = regc_test_join(two, "model.safetensors"),
             *file = regc_test_join(dirs[d], "model.safetensors");
        same_bytes(w1, w2);
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
    const char *train[32] = {"--model", model,         "--data",       plain,     "--batch",
                             "2",       "--seq",       "16",           "--steps", "2",
                             "--json",  "--no-cache",  "--zero-stage", stage,     "--precision",
                             precision, "--recompute", recompute};
    int n_train = 18;
    for (int i = 0; extra && extra[i]; i++)
        train[n_train++] = extra[i];
    train[n_train] = NULL;
    assert_int_equal(run(ranks > 1 ? ranks : 0, train, NULL, NULL), 0);
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
    double kept[STEPS], moved[STEPS], peak[2];
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
                               plain,
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
        assert_int_equal(run(2, train, on ? moved : kept, NULL), 0);
        peak[on] = device_peak;
        if (!(fabs(device_peak - predicted) <= 0.01 * predicted))
            fail_msg("offload %d: regc plan says %.0f bytes per rank, the run held %.0f", on,
                     predicted, device_peak);
    }
    assert_memory_equal(kept, moved, sizeof kept);
    assert_true(peak[1] < peak[0]);
}

/* ---- ranks that disagree, and a rank that dies ----------------------------- */

/* Two ranks, one started with `flag value0`, the other with `flag value1`:
 * the job fails with one line that says `expect`. */
static void expect_disagreement(const char *flag, const char *value0, const char *value1,
                                const char *expect)
{
    const char *argv[64];
    int n = add_mpirun(argv, 0);
    for (int r = 0; r < 2; r++) {
        const char *rank[] = {"-np",       "1",      REGC_BIN,     "train",   "--model",
                              "gpt2-tiny", "--data", plain,        "--batch", "2",
                              "--seq",     "16",     "--no-cache", flag,      r ? value1 : value0};
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
             REGC_BIN, plain);
    const char *tail[] = {"-np",     "1",      REGC_BIN,     "train", "--model", "gpt2-tiny",
                          "--data",  plain,    "--batch",    "2",     "--seq",   "16",
                          "--steps", "100000", "--no-cache", ":",     "-np",     "1",
                          "/bin/sh", "-c",     script,       NULL};
    const char *argv[64];
    int n = add_mpirun(argv, 0);
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
        cmocka_unit_test(test_checkpoint_moves_between_rank_counts),
        cmocka_unit_test(test_model_directory_read_by_shards),
        cmocka_unit_test(test_plan_predicts_the_peak),
        cmocka_unit_test(test_offload_at_two_ranks),
        cmocka_unit_test(test_ranks_that_disagree),
        cmocka_unit_test(test_a_rank_that_dies_ends_the_others),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
