/* test_save.c — a saved model directory appears whole or not at all.
 *
 * - Killed with SIGKILL at 30 moments while it saves two different models
 *   into one directory in turn, a writer leaves a directory that loads as
 *   one of the two, bit for bit: config.json and model.safetensors never
 *   disagree.
 * - The hidden directories killed writers leave are removed by the next
 *   save; a live writer's is not.
 * - Saving over a directory carries over its other files (a tokenizer) and
 *   drops its old weights files; a directory holding a subdirectory is
 *   refused.
 * - A --save path that cannot be written fails before training, not
 *   after: no step runs. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
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

#include <cmocka.h>

#include "regc_models.h"
#include "regc_train.h"
#include "test_model.h"
#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "save", "model"); }

static regc_model *seeded(const char *preset, uint64_t seed)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    assert_int_equal(regc_model_init_random(m, seed), REGC_OK);
    return m;
}

static int same_weights(regc_model *a, regc_model *b)
{
    if (regc_model_n_params(a) != regc_model_n_params(b) ||
        regc_model_total_numel(a) != regc_model_total_numel(b))
        return 0;
    return memcmp(regc_model_weights(a), regc_model_weights(b),
                  (size_t)regc_model_total_numel(a) * sizeof(float)) == 0;
}

/* Entries of dir whose names start with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_killed_saves_leave_a_loadable_directory(void **state)
{
    regc_test_dir *d = *state;
    /* two models of different depth: a config of one with the weights of
     * the other would not load */
    regc_model *a = seeded("gpt2-tiny", 1), *b = seeded("llama-tiny", 2);
    assert_int_equal(regc_model_save(a, d->path), REGC_OK);
    srand(7);
    for (int round = 0; round < 30; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) { /* save the two in turn until killed */
            for (int k = round;; k++)
                if (regc_model_save(k % 2 ? a : b, d->path) != REGC_OK)
                    _exit(3);
        }
        struct timespec ts = {0, (long)(rand() % 40 + 1) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status))
            fail_msg("round %d: the writer exited with %d before it was killed", round,
                     WEXITSTATUS(status));
        regc_model *got = NULL;
        if (regc_model_load(d->path, &got) != REGC_OK)
            fail_msg("round %d: %s does not load: %s", round, d->path, regc_error_message());
        assert_true(same_weights(got, a) || same_weights(got, b));
        regc_model_free(got);
    }
    /* the last killed writer's hidden directory goes with the next save */
    assert_int_equal(regc_model_save(a, d->path), REGC_OK);
    assert_int_equal(count_prefixed(d->dir, ".model.tmp-"), 0);
    regc_model_free(a);
    regc_model_free(b);
}

static void test_dead_writers_leftovers_removed(void **state)
{
    regc_test_dir *d = *state;
    char host[256] = "host", dead[2048], live[2048];
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++)
        if (*c == '/' || *c == '-')
            *c = '_';
    /* pid 2^31 - 2 runs nowhere; the test's parent runs */
    snprintf(dead, sizeof dead, "%s/.model.tmp-%s-%ld", d->dir, host, 2147483646L);
    snprintf(live, sizeof live, "%s/.model.tmp-%s-%ld", d->dir, host, (long)getppid());
    assert_int_equal(mkdir(dead, 0755), 0);
    assert_int_equal(mkdir(live, 0755), 0);
    assert_int_equal(regc_test_write_text(dead, "model.safetensors.tmp.x", "leftover"), 0);
    regc_model *m = seeded("gpt2-tiny", 1);
    assert_int_equal(regc_model_save(m, d->path), REGC_OK);
    struct stat st;
    assert_int_equal(stat(dead, &st), -1);
    assert_int_equal(stat(live, &st), 0);
    regc_model_free(m);
}

static void test_saving_over_a_directory(void **state)
{
    regc_test_dir *d = *state;
    assert_int_equal(mkdir(d->path, 0755), 0);
    assert_int_equal(regc_test_write_text(d->path, "tokenizer.json", "{\"tok\": 1}"), 0);
    assert_int_equal(regc_test_write_text(d->path, "model-00001-of-00002.safetensors", "old"), 0);
    assert_int_equal(regc_test_write_text(d->path, "model.safetensors.index.json", "{}"), 0);
    regc_model *m = seeded("llama-tiny", 3);
    assert_int_equal(regc_model_save(m, d->path), REGC_OK);
    char path[2200];
    snprintf(path, sizeof path, "%s/tokenizer.json", d->path);
    char *tok = regc_test_read_file(path, NULL);
    assert_non_null(tok);
    assert_string_equal(tok, "{\"tok\": 1}");
    free(tok);
    struct stat st;
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", d->path);
    assert_int_equal(stat(path, &st), -1);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", d->path);
    assert_int_equal(stat(path, &st), -1);
    regc_model *got = NULL;
    assert_int_equal(regc_model_load(d->path, &got), REGC_OK);
    assert_true(same_weights(got, m));
    regc_model_free(got);

    /* a subdirectory cannot be carried over in one rename: refused, and
     * the directory is left as it was */
    snprintf(path, sizeof path, "%s/runs", d->path);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_not_equal(regc_model_save(m, d->path), REGC_OK);
    if (!strstr(regc_error_message(), d->path) || !strstr(regc_error_message(), "runs"))
        fail_msg("expected the directory and its subdirectory named, got: %s",
                 regc_error_message());
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(count_prefixed(d->dir, ".model.tmp-"), 0);
    regc_model_free(m);
}

/* Replacing a directory where the filesystem cannot exchange two: the
 * old one aside, the new one in. The new files are in place, the old
 * directory's weights are gone, its other files carried over, and no
 * hidden sibling is left; both ways give the same directory. */
static void test_replacing_without_an_exchange(void **state)
{
    regc_test_dir *d = *state;
    for (int aside = 0; aside < 2; aside++) {
        assert_int_equal(mkdir(d->path, 0755), 0);
        assert_int_equal(regc_test_write_text(d->path, "tokenizer.json", "{\"tok\": 2}"), 0);
        assert_int_equal(regc_test_write_text(d->path, "model.safetensors", "old weights"), 0);
        regc_staged_dir *s = NULL;
        assert_int_equal(regc_staged_dir_open(d->path, &s), REGC_OK);
        assert_int_equal(
            regc_test_write_text(regc_staged_dir_path(s), "model.safetensors", "new weights"), 0);
        assert_int_equal(aside ? regc_staged_dir_commit_aside(s) : regc_staged_dir_commit(s),
                         REGC_OK);
        char path[2200];
        snprintf(path, sizeof path, "%s/model.safetensors", d->path);
        char *got = regc_test_read_file(path, NULL);
        assert_non_null(got);
        assert_string_equal(got, "new weights");
        free(got);
        snprintf(path, sizeof path, "%s/tokenizer.json", d->path);
        got = regc_test_read_file(path, NULL);
        assert_non_null(got);
        assert_string_equal(got, "{\"tok\": 2}");
        free(got);
        assert_int_equal(count_prefixed(d->dir, ".model.tmp-"), 0);
        /* the next round starts from nothing */
        char cmd[2300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->path);
        assert_int_equal(system(cmd), 0);
    }
}

static int steps_run;
static void count_step(const regc_step_report *r, void *user)
{
    (void)r, (void)user;
    steps_run++;
}

static void test_unusable_save_path_fails_first(void **state)
{
    regc_test_dir *d = *state;
    assert_int_equal(regc_test_write_text(d->dir, "model", "a file, not a directory"), 0);
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = 3;
    char save[2200];
    snprintf(save, sizeof save, "%s/out", d->path); /* under a file */
    o.save_dir = save;
    steps_run = 0;
    assert_int_not_equal(regc_train(m, &o, count_step, NULL, NULL), REGC_OK);
    assert_int_equal(steps_run, 0);
    assert_non_null(strstr(regc_error_message(), d->path));

    /* the same for the checkpoints' directory */
    o.save_dir = NULL;
    o.output_dir = save, o.save_steps = 1;
    assert_int_not_equal(regc_train(m, &o, count_step, NULL, NULL), REGC_OK);
    assert_int_equal(steps_run, 0);
    assert_non_null(strstr(regc_error_message(), d->path));

    /* and a save path that is a file */
    o.output_dir = NULL, o.save_steps = 0;
    o.save_dir = d->path;
    assert_int_not_equal(regc_train(m, &o, count_step, NULL, NULL), REGC_OK);
    assert_int_equal(steps_run, 0);
    assert_non_null(strstr(regc_error_message(), "not a directory"));
    regc_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_killed_saves_leave_a_loadable_directory, setup),
        regc_test_in_dir(test_dead_writers_leftovers_removed, setup),
        regc_test_in_dir(test_saving_over_a_directory, setup),
        regc_test_in_dir(test_replacing_without_an_exchange, setup),
        regc_test_in_dir(test_unusable_save_path_fails_first, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
