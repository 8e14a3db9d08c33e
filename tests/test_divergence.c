/* test_divergence.c — a step whose loss or gradient norm is not finite is
 * never applied: training stops there with REGC_ERR_DIVERGED naming the
 * step (checkpoints before it kept, none after), or, told to skip, goes on
 * as if the step had never run — its weights the bits of a run that ended
 * before it, and a run resumed after a skip the bits of one that never
 * stopped.
 *
 * Two poisons of llama-tiny (untied embeddings):
 * - NaN in token 511's embedding row, with a token file in which 511 is an
 *   input of batch 2 only: batch 2's loss is NaN, the others are sound.
 * - 1e38 in 8 channels of the final norm's weight: every logit stays
 *   finite (8 channels times weights of about 0.02), and so does the loss,
 *   but lm_head's gradient sums those channels over the positions and
 *   overflows: every step's gradient norm is infinite. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "regc_data.h"
#include "regc_models.h"
#include "regc_train.h"
#include "test_model.h"
#include "test_util.h"

#define B 2
#define T 16
#define POISON_BATCH 2
#define POISON_TOKEN 511

static int setup(void **state) { return regc_test_dir_setup(state, "divergence", "tokens.bin"); }

/* Tokens below POISON_TOKEN everywhere but one input of POISON_BATCH. */
static void write_tokens(const char *path)
{
    const int64_t n = 8 * B * T + 1;
    uint16_t *tok = malloc((size_t)n * sizeof *tok);
    assert_non_null(tok);
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (uint16_t)(x % POISON_TOKEN);
    }
    tok[POISON_BATCH * B * T + 5] = POISON_TOKEN;
    assert_int_equal(regc_tokens_write(path, tok, n), REGC_OK);
    free(tok);
}

typedef enum { POISON_EMBEDDING, POISON_NORM } poison;

static regc_model *poisoned_model(poison which)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_init_random(m, 1337), REGC_OK);
    const char *name =
        which == POISON_EMBEDDING ? "model.embed_tokens.weight" : "model.norm.weight";
    int p = regc_test_param_index(m, name);
    assert_true(p >= 0);
    int64_t shape[4];
    int nd = regc_model_param_shape(m, p, shape);
    float *w = regc_model_weights(m) + regc_model_param_offset(m, p);
    if (which == POISON_EMBEDDING)
        w[POISON_TOKEN * shape[nd - 1] + 3] = NAN; /* [V, C] */
    else
        for (int c = 0; c < 8; c++)
            w[c] = 1e38f; /* [C] */
    return m;
}

typedef struct {
    float loss[8];
    const char *nonfinite[8];
    int n;
} steps_seen;

static void on_step(const regc_step_report *r, void *user)
{
    steps_seen *s = user;
    if (r->step < 8) {
        s->loss[r->step] = r->loss;
        s->nonfinite[r->step] = r->nonfinite;
    }
    s->n++;
}

static regc_train_options options(const char *tokens, int steps, int skip)
{
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = B, o.seq = T, o.steps = steps, o.lr = 1e-3f;
    o.data_path = tokens;
    o.skip_nonfinite = skip;
    o.max_grad_norm = 1.0; /* clipping must not hide an infinite norm */
    o.cache_dir = NULL;
    return o;
}

static void test_nan_loss_stops(void **state)
{
    regc_test_dir *d = *state;
    write_tokens(d->path);
    regc_model *m = poisoned_model(POISON_EMBEDDING);
    regc_train_options o = options(d->path, 6, 0);
    snprintf(d->buf, sizeof d->buf, "%s/run", d->dir);
    o.output_dir = d->buf, o.save_steps = 1;
    steps_seen seen = {0};
    assert_int_equal(regc_train(m, &o, on_step, &seen, NULL), REGC_ERR_DIVERGED);
    const char *msg = regc_error_message();
    if (!strstr(msg, "step 2: the loss is not finite") || !strstr(msg, "checkpoint-2"))
        fail_msg("expected step 2, the loss and the last checkpoint, got: %s", msg);
    assert_int_equal(seen.n, POISON_BATCH); /* steps 0 and 1 reported, then the stop */
    for (int s = 0; s < POISON_BATCH; s++) {
        assert_true(isfinite(seen.loss[s]));
        assert_null(seen.nonfinite[s]);
    }
    /* the checkpoints of the steps before it, none after */
    struct stat st;
    for (int k = 1; k <= 3; k++) {
        char ck[2200];
        snprintf(ck, sizeof ck, "%s/checkpoint-%d", d->buf, k);
        assert_int_equal(stat(ck, &st) == 0, k <= POISON_BATCH);
    }
    regc_model_free(m);
}

static void test_infinite_norm_stops(void **state)
{
    regc_test_dir *d = *state;
    write_tokens(d->path);
    regc_model *m = poisoned_model(POISON_NORM);
    regc_train_options o = options(d->path, 3, 0);
    steps_seen seen = {0};
    assert_int_equal(regc_train(m, &o, on_step, &seen, NULL), REGC_ERR_DIVERGED);
    if (!strstr(regc_error_message(), "step 0: the gradient norm is not finite"))
        fail_msg("expected step 0 and the gradient norm, got: %s", regc_error_message());
    assert_int_equal(seen.n, 0);
    regc_model_free(m);
}

/* Skipping: the weights after the skipped step are those of a run that
 * stopped before it (a constant learning rate: the step count changes no
 * other step), and the steps after it train on. */
static void test_nan_loss_skipped(void **state)
{
    regc_test_dir *d = *state;
    write_tokens(d->path);
    regc_model *before = poisoned_model(POISON_EMBEDDING);
    regc_model *skipped = poisoned_model(POISON_EMBEDDING);
    regc_train_options o = options(d->path, POISON_BATCH, 1);
    steps_seen a = {0}, b = {0};
    assert_int_equal(regc_train(before, &o, on_step, &a, NULL), REGC_OK);
    o.steps = POISON_BATCH + 1;
    assert_int_equal(regc_train(skipped, &o, on_step, &b, NULL), REGC_OK);
    assert_int_equal(b.n, POISON_BATCH + 1);
    assert_non_null(b.nonfinite[POISON_BATCH]);
    assert_string_equal(b.nonfinite[POISON_BATCH], "loss");
    for (int s = 0; s < POISON_BATCH; s++)
        assert_memory_equal(&a.loss[s], &b.loss[s], sizeof(float));
    regc_test_assert_same_weights(before, skipped);
    regc_model_free(before);
    regc_model_free(skipped);
}

/* Every step's norm infinite and skipped: the loss is still reported
 * (finite), and the weights leave training as they came. */
static void test_infinite_norm_skipped(void **state)
{
    regc_test_dir *d = *state;
    write_tokens(d->path);
    regc_model *init = poisoned_model(POISON_NORM), *trained = poisoned_model(POISON_NORM);
    regc_train_options o = options(d->path, 3, 1);
    steps_seen seen = {0};
    assert_int_equal(regc_train(trained, &o, on_step, &seen, NULL), REGC_OK);
    assert_int_equal(seen.n, 3);
    for (int s = 0; s < 3; s++) {
        assert_true(isfinite(seen.loss[s]));
        assert_non_null(seen.nonfinite[s]);
        assert_string_equal(seen.nonfinite[s], "gradient norm");
    }
    regc_test_assert_same_weights(init, trained);
    regc_model_free(init);
    regc_model_free(trained);
}

/* A run that skipped a step, wrote a checkpoint after step 4 and resumed
 * from it gives the bits of one that never stopped: the checkpoint counts
 * the skipped step, so the resumed schedule and AdamW's step count stand
 * where they stood. */
static void test_resume_after_skip(void **state)
{
    regc_test_dir *d = *state;
    write_tokens(d->path);
    regc_model *whole = poisoned_model(POISON_EMBEDDING), *parts = poisoned_model(POISON_EMBEDDING);
    regc_train_options o = options(d->path, 6, 1);
    o.lr_scheduler = REGC_SCHEDULE_COSINE; /* every step's learning rate depends on the count */
    o.warmup_steps = 2;
    steps_seen a = {0}, b = {0}, c = {0};
    assert_int_equal(regc_train(whole, &o, on_step, &a, NULL), REGC_OK);
    assert_non_null(a.nonfinite[POISON_BATCH]);
    snprintf(d->buf, sizeof d->buf, "%s/run", d->dir);
    o.output_dir = d->buf, o.save_steps = 4;
    assert_int_equal(regc_train(parts, &o, on_step, &b, NULL), REGC_OK);
    regc_model_free(parts);
    parts = poisoned_model(POISON_EMBEDDING);
    o.resume_from = "latest";
    o.save_steps = 0;
    assert_int_equal(regc_train(parts, &o, on_step, &c, NULL), REGC_OK);
    assert_int_equal(c.n, 2);
    assert_memory_equal(&a.loss[4], &c.loss[4], 2 * sizeof(float));
    regc_test_assert_same_weights(whole, parts);
    regc_model_free(whole);
    regc_model_free(parts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_nan_loss_stops, setup),
        regc_test_in_dir(test_infinite_norm_stops, setup),
        regc_test_in_dir(test_nan_loss_skipped, setup),
        regc_test_in_dir(test_infinite_norm_skipped, setup),
        regc_test_in_dir(test_resume_after_skip, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
