/* test_resume.c — checkpoints and resume through `regc train`.
 *
 * - A run stopped after 3 steps and resumed from its checkpoint gives the
 *   same bits as one that never stopped: every loss, every weight and every
 *   AdamW moment, for GPT-2, Llama, BERT and T5, with a cosine schedule,
 *   clipping and gradient accumulation on; Llama and T5 resume with the
 *   optimizer offloaded to the host, which changes where AdamW runs, not
 *   what it computes. GPT-2 also at a rate and a decay that a float holds
 *   inexactly (2e-5, 0.01), its biases and norms undecayed.
 * - Killed with SIGKILL at 20 moments while it writes checkpoints, a run
 *   leaves only whole checkpoints; the newest resumes and finishes with the
 *   bits of a run that was never killed.
 * - SIGTERM finishes the step under way, writes a checkpoint and exits 0.
 * - A resume directory that is missing, damaged, of another model or of
 *   other settings is refused with one line naming it, exit 1, nothing
 *   written. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_util.h"

extern char **environ;

#define MAX_STEPS 64

/* The losses of the step lines of --json output: loss[k] for step k
 * (NaN where a step has no line); returns the number of lines. */
static int step_losses(const char *out, double *loss)
{
    for (int k = 0; k < MAX_STEPS; k++)
        loss[k] = NAN;
    int n = 0;
    for (const char *line = out; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        cJSON *obj = cJSON_ParseWithLength(line, len);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(obj, "loss");
        if (cJSON_IsNumber(step) && cJSON_IsNumber(l) && step->valueint >= 0 &&
            step->valueint < MAX_STEPS) {
            loss[step->valueint] = l->valuedouble;
            n++;
        }
        cJSON_Delete(obj);
        line = nl ? nl + 1 : line + len;
    }
    return n;
}

/* Two files hold the same bytes. */
static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = regc_test_read_file(a, &na), *y = regc_test_read_file(b, &nb);
    if (!x || !y)
        fail_msg("cannot read %s or %s", a, b);
    if (na != nb || memcmp(x, y, na) != 0)
        fail_msg("%s and %s differ", a, b);
    free(x), free(y);
}

static char *path_in(const char *dir, const char *a, const char *b)
{
    char *ab = regc_test_join(dir, a);
    if (!b)
        return ab;
    char *p = regc_test_join(ab, b);
    free(ab);
    return p;
}

/* ---- resume == a run that never stopped --------------------------------- */

/* lr: the run's learning rate; `more`: flags of every run (NULL-terminated) */
static void check_resume(const char *model, int offload, const char *lr, const char *const *more)
{
    char *dir = regc_test_make_temp_dir("resume");
    assert_non_null(dir);
    char *a = path_in(dir, "a", NULL), *b = path_in(dir, "b", NULL);
    char *a_final = path_in(dir, "a-final", NULL), *b_final = path_in(dir, "b-final", NULL);
    char *a3 = path_in(a, "checkpoint-3", NULL);
    /* a schedule, clipping and accumulation: every piece of state a resume
     * must carry (the step count, the moments, the data position) */
    static const char *const common[] = {"--steps",
                                         "6",
                                         "--batch",
                                         "2",
                                         "--seq",
                                         "8",
                                         "--lr-scheduler-type",
                                         "cosine",
                                         "--warmup-steps",
                                         "2",
                                         "--max-grad-norm",
                                         "0.5",
                                         "--gradient-accumulation-steps",
                                         "2",
                                         "--save-steps",
                                         "3",
                                         "--json",
                                         "--no-cache"};
    const char *argv[48] = {REGC_BIN, "train", "--model", model, "--lr", lr};
    int n = 6;
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        argv[n++] = common[i];
    for (int i = 0; more && more[i]; i++)
        argv[n++] = more[i];
    int base = n;
    regc_test_proc p;

    /* straight through, checkpoints after steps 3 and 6 */
    argv[n++] = "--output-dir", argv[n++] = a, argv[n++] = "--save", argv[n++] = a_final;
    argv[n] = NULL;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("%s: straight run failed: %s", model, p.err);
    double straight[MAX_STEPS], resumed[MAX_STEPS];
    assert_int_equal(step_losses(p.out, straight), 6);
    regc_test_proc_free(&p);

    /* from checkpoint-3 into another directory */
    n = base;
    argv[n++] = "--output-dir", argv[n++] = b, argv[n++] = "--save", argv[n++] = b_final;
    argv[n++] = "--resume-from-checkpoint", argv[n++] = a3;
    if (offload) /* the moments resumed into host memory, the update there */
        argv[n++] = "--offload-optimizer", argv[n++] = "cpu";
    argv[n] = NULL;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("%s: resumed run failed: %s", model, p.err);
    assert_int_equal(step_losses(p.out, resumed), 3);
    regc_test_proc_free(&p);
    for (int k = 3; k < 6; k++)
        if (memcmp(&straight[k], &resumed[k], sizeof(double)) != 0)
            fail_msg("%s: step %d loss %.9g straight, %.9g resumed", model, k, straight[k],
                     resumed[k]);
    char *x = path_in(a_final, "model.safetensors", NULL),
         *y = path_in(b_final, "model.safetensors", NULL);
    assert_same_file(x, y);
    free(x), free(y);
    x = path_in(a, "checkpoint-6", "optimizer.safetensors");
    y = path_in(b, "checkpoint-6", "optimizer.safetensors");
    assert_same_file(x, y);
    free(x), free(y);

    free(a), free(b), free(a_final), free(b_final), free(a3);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

static void test_resume_gpt2(void **state)
{
    (void)state;
    check_resume("gpt2-tiny", 0, "3e-3", NULL);
}

/* Rates and decays that a float holds inexactly (2e-5 and 0.01, as
 * fine-tuning often uses), whose doubles a 15-digit decimal does not name,
 * and weight decay in Transformers' groups. */
static void test_resume_usual_fine_tuning_rates(void **state)
{
    (void)state;
    static const char *const more[] = {"--weight-decay", "0.01", "--weight-decay-params",
                                       "not_bias_norm", NULL};
    check_resume("gpt2-tiny", 0, "2e-5", more);

    /* a state file whose doubles cJSON wrote, as it did before, in 15
     * digits wherever they read back within a rounding (the rate, the
     * floor's ratio to it: neighbouring doubles) still resumes */
    char *dir = regc_test_make_temp_dir("resume-rate");
    assert_non_null(dir);
    char *out = path_in(dir, "out", NULL), *ck = path_in(out, "checkpoint-1", NULL);
    char *state_file = path_in(ck, "trainer_state.json", NULL);
    /* two steps at the rate, a cosine to a floor: written, then resumed */
    const char *argv[] = {REGC_BIN,
                          "train",
                          "--model",
                          "gpt2-tiny",
                          "--steps",
                          "2",
                          "--batch",
                          "2",
                          "--seq",
                          "8",
                          "--lr",
                          "2e-5",
                          "--lr-scheduler-type",
                          "cosine_with_min_lr",
                          "--min-lr",
                          "7e-6",
                          "--no-cache",
                          "--save-steps",
                          "1",
                          "--output-dir",
                          out,
                          NULL};
    regc_test_proc p;
    assert_int_equal(regc_test_run_argv(argv, &p), 0);
    regc_test_proc_free(&p);
    size_t len;
    char *text = regc_test_read_file(state_file, &len);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    char *old_text = cJSON_Print(root);
    assert_non_null(strstr(old_text, "1.99999994947575e-05"));
    assert_non_null(strstr(old_text, "0.350000008841744,")); /* 7e-6 / the rate */
    assert_int_equal(regc_test_write_file(state_file, old_text, strlen(old_text)), 0);
    /* in place of --save-steps 1 and the output directory */
    argv[17] = "--resume-from-checkpoint", argv[18] = ck;
    argv[19] = NULL;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("resumed from a state file of 15-digit doubles: %s", p.err);
    regc_test_proc_free(&p);
    cJSON_free(old_text), cJSON_Delete(root), free(text);
    free(out), free(ck), free(state_file);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

static void test_resume_llama(void **state)
{
    (void)state;
    check_resume("llama-tiny", 1, "3e-3", NULL);
}

static void test_resume_bert(void **state)
{
    (void)state;
    check_resume("bert-tiny", 0, "3e-3", NULL);
}

static void test_resume_t5(void **state)
{
    (void)state;
    check_resume("t5-tiny", 1, "3e-3", NULL);
}

/* ---- SIGKILL while checkpoints are written -------------------------------- */

static pid_t spawn(const char *const *argv)
{
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 1, 0);
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    return pid;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

/* Every checkpoint-N of dir is whole: its four files are there. */
static int count_whole_checkpoints(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "checkpoint-", 11) != 0)
            continue;
        static const char *const files[] = {"config.json", "model.safetensors",
                                            "optimizer.safetensors", "trainer_state.json"};
        for (size_t i = 0; i < 4; i++) {
            char *f = path_in(dir, e->d_name, files[i]);
            if (!regc_test_is_file(f))
                fail_msg("%s/%s is not whole: no %s", dir, e->d_name, files[i]);
            free(f);
        }
        n++;
    }
    closedir(d);
    return n;
}

static void test_sigkill_while_checkpointing(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("sigkill");
    assert_non_null(dir);
    char *ref = path_in(dir, "ref", NULL), *ref_final = path_in(dir, "ref-final", NULL);
    const char *argv[32] = {REGC_BIN,
                            "train",
                            "--model",
                            "gpt2-tiny",
                            "--steps",
                            "12",
                            "--batch",
                            "1",
                            "--seq",
                            "8",
                            "--save-steps",
                            "1",
                            "--lr-scheduler-type",
                            "linear",
                            "--warmup-steps",
                            "2",
                            "--no-cache",
                            "--output-dir"};
    const int base = 18;
    int n = base;
    argv[n++] = ref, argv[n++] = "--save", argv[n++] = ref_final, argv[n] = NULL;
    regc_test_proc p;
    double t0 = now_ms();
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("uninterrupted run failed: %s", p.err);
    double run_ms = now_ms() - t0;
    regc_test_proc_free(&p);
    char *want = path_in(ref_final, "model.safetensors", NULL);

    int with_checkpoints = 0, mid_write = 0;
    for (int i = 0; i < 20; i++) {
        char name[32];
        snprintf(name, sizeof name, "kill%d", i);
        char *out = path_in(dir, name, NULL), *final = path_in(dir, name, "final");
        n = base;
        argv[n++] = out, argv[n] = NULL;
        pid_t pid = spawn(argv);
        sleep_ms(run_ms * (i + 0.5) / 20.0); /* from start-up to the last steps */
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        int whole = count_whole_checkpoints(out);
        with_checkpoints += whole > 0;
        DIR *dd = opendir(out);
        struct dirent *de;
        while (dd && (de = readdir(dd)))
            mid_write += !strncmp(de->d_name, ".checkpoint-", 12);
        if (dd)
            closedir(dd);
        /* the newest whole checkpoint (or none: from the start) finishes it */
        n = base;
        argv[n++] = out, argv[n++] = "--save", argv[n++] = final;
        if (whole)
            argv[n++] = "--resume-from-checkpoint", argv[n++] = "latest";
        argv[n] = NULL;
        if (regc_test_run_argv(argv, &p) != 0)
            fail_msg("kill %d (%d whole checkpoints): the resumed run failed: %s", i, whole, p.err);
        regc_test_proc_free(&p);
        char *got = path_in(final, "model.safetensors", NULL);
        assert_same_file(want, got);
        free(got);
        /* what the killed writer left is gone after the resumed run's saves */
        DIR *d = opendir(out);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (!strncmp(e->d_name, ".checkpoint-", 12))
                fail_msg("kill %d: %s/%s left behind", i, out, e->d_name);
        if (d)
            closedir(d);
        free(out), free(final);
    }
    /* most kills land after the first checkpoint: the test saw resumes */
    assert_true(with_checkpoints >= 10);
    print_message("%d of 20 kills left a checkpoint half-written (a hidden directory)\n",
                  mid_write);
    free(want), free(ref), free(ref_final);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

/* ---- SIGTERM: finish the step, checkpoint, exit 0 ------------------------ */

static void test_sigterm_checkpoints_and_exits_0(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("sigterm");
    assert_non_null(dir);
    char *out = path_in(dir, "out", NULL), *final = path_in(dir, "final", NULL);
    char *ref_final = path_in(dir, "ref-final", NULL);
    const char *argv[32] = {REGC_BIN,     "train",        "--model", "gpt2-tiny", "--steps",
                            "400",        "--batch",      "1",       "--seq",     "8",
                            "--no-cache", "--output-dir", out};
    int n = 13;
    argv[n] = NULL;
    pid_t pid = spawn(argv);
    sleep_ms(150);
    kill(pid, SIGTERM);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(count_whole_checkpoints(out), 1);

    regc_test_proc p;
    argv[n++] = "--save", argv[n++] = final, argv[n++] = "--resume-from-checkpoint";
    argv[n++] = "latest", argv[n] = NULL;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("resume after SIGTERM failed: %s", p.err);
    regc_test_proc_free(&p);
    const char *straight[] = {REGC_BIN,     "train",   "--model", "gpt2-tiny", "--steps",
                              "400",        "--batch", "1",       "--seq",     "8",
                              "--no-cache", "--save",  ref_final, NULL};
    if (regc_test_run_argv(straight, &p) != 0)
        fail_msg("straight run failed: %s", p.err);
    regc_test_proc_free(&p);
    char *x = path_in(final, "model.safetensors", NULL),
         *y = path_in(ref_final, "model.safetensors", NULL);
    assert_same_file(x, y);
    free(x), free(y), free(out), free(final), free(ref_final);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

/* ---- bad resume directories ------------------------------------------------ */

/* Lines of s that start with "regc: ": the errors (the model's
 * description comes before them on stderr). */
static int error_lines(const char *s)
{
    int n = 0;
    for (const char *l = s; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        n += !strncmp(l, "regc: ", 6);
    return n;
}

/* One error line naming `what`, exit 1, nothing on stdout, no --save;
 * extra: more flags (NULL-terminated), or NULL. */
static void expect_refused(const char *dir, const char *ck, const char *what,
                           const char *const *extra)
{
    char *save = path_in(dir, "never", NULL);
    const char *argv[24] = {REGC_BIN,    "train",      "--model",
                            "gpt2-tiny", "--steps",    "4",
                            "--batch",   "2",          "--seq",
                            "8",         "--no-cache", "--json",
                            "--save",    save,         "--resume-from-checkpoint",
                            ck};
    for (int i = 0, n = 16; extra && extra[i]; i++)
        argv[n++] = extra[i];
    regc_test_proc p;
    int rc = regc_test_run_argv(argv, &p);
    if (rc != 1 || error_lines(p.err) != 1 || !strstr(p.err, what) || p.out_len != 0)
        fail_msg("resume from %s: expected exit 1 and one line naming \"%s\", got %d:\n%s", ck,
                 what, rc, p.err);
    struct stat st;
    assert_true(stat(save, &st) != 0);
    regc_test_proc_free(&p);
    free(save);
}

static void test_bad_resume_directories(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("badresume");
    assert_non_null(dir);
    char *out = path_in(dir, "out", NULL), *ck = path_in(out, "checkpoint-2", NULL);
    char *llama = path_in(dir, "llama", NULL), *llama_ck = path_in(llama, "checkpoint-2", NULL);
    regc_test_proc p;
    const char *argv[] = {REGC_BIN,     "train",        "--model", "gpt2-tiny",    "--steps",
                          "4",          "--batch",      "2",       "--seq",        "8",
                          "--no-cache", "--output-dir", out,       "--save-steps", "2",
                          NULL};
    assert_int_equal(regc_test_run_argv(argv, &p), 0);
    regc_test_proc_free(&p);
    const char *argl[] = {REGC_BIN,     "train",        "--model", "llama-tiny",   "--steps",
                          "4",          "--batch",      "2",       "--seq",        "8",
                          "--no-cache", "--output-dir", llama,     "--save-steps", "2",
                          NULL};
    assert_int_equal(regc_test_run_argv(argl, &p), 0);
    regc_test_proc_free(&p);

    char *missing = path_in(dir, "no-such-checkpoint", NULL);
    expect_refused(dir, missing, "no-such-checkpoint", NULL);
    expect_refused(dir, llama_ck, "another model", NULL);
    /* settings the remaining steps depend on */
    static const char *const batch[] = {"--batch", "3", NULL};
    static const char *const accumulation[] = {"--gradient-accumulation-steps", "3", NULL};
    static const char *const groups[] = {"--weight-decay", "0.1", "--weight-decay-params",
                                         "not_bias_norm", NULL};
    expect_refused(dir, ck, "train.batch is 2 in the checkpoint", batch);
    expect_refused(dir, ck, "train.gradient_accumulation_steps", accumulation);
    expect_refused(dir, ck, "train.weight_decay_params is all in the checkpoint, not_bias_norm now",
                   groups);

    /* damage: each file truncated or mangled in turn */
    static const char *const files[] = {"trainer_state.json", "model.safetensors",
                                        "optimizer.safetensors"};
    for (size_t i = 0; i < 3; i++) {
        char *f = path_in(ck, files[i], NULL);
        size_t len;
        char *orig = regc_test_read_file(f, &len);
        assert_non_null(orig);
        assert_int_equal(regc_test_write_file(f, orig, len / 2), 0);
        expect_refused(dir, ck, files[i], NULL);
        assert_int_equal(regc_test_write_file(f, orig, len), 0);
        free(orig), free(f);
    }
    /* a grouping of the weight decay regc does not know */
    char *f = path_in(ck, "trainer_state.json", NULL);
    size_t len;
    char *orig = regc_test_read_file(f, &len);
    assert_non_null(orig);
    char *at = strstr(orig, "\"weight_decay_params\":");
    assert_non_null(at);
    char *mangled = malloc(len + 16);
    assert_non_null(mangled);
    const char *value = strchr(at + 22, '"'); /* the value's opening quote */
    const char *end = strchr(value + 1, '"');
    int n = snprintf(mangled, len + 16, "%.*s\"norms\"%s", (int)(value - orig), orig, end + 1);
    assert_int_equal(regc_test_write_file(f, mangled, (size_t)n), 0);
    expect_refused(dir, ck, "\"weight_decay_params\" is not \"all\" or \"not_bias_norm\"", NULL);
    assert_int_equal(regc_test_write_file(f, orig, len), 0);
    free(mangled), free(orig), free(f);
    free(missing), free(out), free(ck), free(llama), free(llama_ck);
    assert_int_equal(regc_test_remove_tree(dir), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_gpt2),
        cmocka_unit_test(test_resume_usual_fine_tuning_rates),
        cmocka_unit_test(test_resume_llama),
        cmocka_unit_test(test_resume_bert),
        cmocka_unit_test(test_resume_t5),
        cmocka_unit_test(test_sigkill_while_checkpointing),
        cmocka_unit_test(test_sigterm_checkpoints_and_exits_0),
        cmocka_unit_test(test_bad_resume_directories),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
