/* test_dropout.c — dropout as Transformers trains it, by Philox4x32-10.
 *
 * The generator against Random123's known answers; the kernel by property
 * (each element kept or zeroed by its own draw alone: the kept fraction
 * near 1 - p, kept values scaled exactly, the same mask on a gradient, in
 * place, at any thread count, none outside training); attention's by
 * property too (its values against naive loops are in
 * test_kernels_cpu_props.c): the same bits at any thread count, none
 * outside training. Training by property: GPT-2's embedding, attention and
 * residual dropouts, BERT's hidden and attention ones, a Llama's
 * attention_dropout, T5's dropout_rate at every site Transformers applies
 * it, and LoRA's change the losses, and give the same bits regional and
 * whole, at O0 and O1, at 1 and 3 threads, with every layer recomputed,
 * and (GPT-2) resumed from a checkpoint; validation applies none. LoRA's
 * dropout without train.dropout is refused by its key. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernel_math.h"
#include "regc_backend.h"
#include "regc_models.h"
#include "regc_train.h"
#include "test_device.h"
#include "test_model.h"
#include "test_util.h"

#define STEPS 4

/* ---------------------------------------------------------------- the generator */

/* Random123's kat_vectors for philox4x32 with 10 rounds. */
static void test_philox_known_answers(void **state)
{
    (void)state;
    static const uint32_t kat[][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (size_t i = 0; i < sizeof kat / sizeof *kat; i++) {
        uint32_t out[4];
        regc_philox4x32_10(kat[i], kat[i] + 4, out);
        for (int k = 0; k < 4; k++)
            if (out[k] != kat[i][6 + k])
                fail_msg("vector %zu word %d: %08x, Random123 says %08x", i, k, out[k],
                         kat[i][6 + k]);
    }
}

/* ---------------------------------------------------------------- the kernel */

static void test_kernel(void **state)
{
    (void)state;
    enum { N = 100003 };
    const float p = 0.1f, scale = 1.0f / (1.0f - p);
    const int32_t site = 57, draw[4] = {1337, 0, 5, 1}, eval[4] = {1337, 0, 5, 0};
    float *x = malloc(N * sizeof *x), *y1 = malloc(N * sizeof *y1), *y3 = malloc(N * sizeof *y3);
    float *dy = malloc(N * sizeof *dy), *dx = malloc(N * sizeof *dx);
    assert_non_null(x), assert_non_null(y1), assert_non_null(y3);
    assert_non_null(dy), assert_non_null(dx);
    regc_rng_fill_uniform(x, N, 7, 0.0f, 1.0f);
    regc_rng_fill_uniform(dy, N, 8, 0.0f, 1.0f);
    for (int i = 0; i < N; i++) /* no zero of its own: a zero out is a dropped element */
        x[i] += x[i] == 0.0f ? 0.5f : 0.0f, dy[i] += dy[i] == 0.0f ? 0.5f : 0.0f;
    regc_backend *one = regc_test_backend(1), *three = regc_test_backend(3);
    one->dropout(one, y1, x, &site, draw, p, N);
    three->dropout(three, y3, x, &site, draw, p, N);
    assert_memory_equal(y1, y3, N * sizeof *y1);
    three->dropout(three, dx, dy, &site, draw, p, N);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        const int k = y1[i] != 0.0f;
        kept += k;
        if (k && y1[i] != x[i] * scale)
            fail_msg("element %d kept as %.9g, not %.9g", i, y1[i], x[i] * scale);
        if (k != (dx[i] != 0.0f) || (k && dx[i] != dy[i] * scale))
            fail_msg("element %d: the gradient's mask differs", i);
    }
    /* kept ~ Binomial(N, 0.9): within 6 standard deviations (~570) */
    const double sd = sqrt(N * 0.9 * 0.1);
    if (fabs(kept - 0.9 * N) > 6 * sd)
        fail_msg("%d of %d kept, expected about %.0f", kept, N, 0.9 * N);
    /* another site, another micro-batch: another mask */
    const int32_t other = 58, later[4] = {1337, 0, 6, 1};
    one->dropout(one, y3, x, &other, draw, p, N);
    assert_true(memcmp(y1, y3, N * sizeof *y1) != 0);
    one->dropout(one, y3, x, &site, later, p, N);
    assert_true(memcmp(y1, y3, N * sizeof *y1) != 0);
    /* in place, the same; not training, x itself */
    memcpy(y3, x, N * sizeof *y3);
    one->dropout(one, y3, y3, &site, draw, p, N);
    assert_memory_equal(y1, y3, N * sizeof *y1);
    one->dropout(one, y3, x, &site, eval, p, N);
    assert_memory_equal(x, y3, N * sizeof *y3);
    regc_backend_free(one), regc_backend_free(three);
    free(x), free(y1), free(y3), free(dy), free(dx);
}

/* Attention with its probabilities dropped (GPT-2's causal rows of 37
 * keys, grouped heads): the same bits at 1 and 3 threads; with the draw
 * not training, the bits of no dropout at all; another site, another mask. */
static void test_attention_kernel(void **state)
{
    (void)state;
    regc_attn_shape s = {3, 37, 37, 6, 2, 19, 1, 0.2294157f, 0, 0.0f, 0, 0.0f, NULL, NULL, NULL};
    regc_backend *one = regc_test_backend(1), *three = regc_test_backend(3);
    const int32_t site = 9, other = 10, draw[4] = {42, 0, 1, 1}, eval[4] = {42, 0, 1, 0};
    float *hq, *hk, *hv, *hdo, *q, *k, *v, *dout;
    regc_test_attention_inputs(one, &s, 77, &hq, &hk, &hv, &hdo, &q, &k, &v, &dout);
    const size_t nq = regc_test_attn_q_count(&s), nkv = regc_test_attn_kv_count(&s);
    const size_t nl = (size_t)(s.batch * s.n_head * s.tq);
    /* r[run]: out, lse, dq, dk, dv of one run */
    enum { THREADS_1, THREADS_3, EVAL, NONE, OTHER_SITE, RUNS };
    float *r[RUNS][5];
    const size_t n[5] = {nq, nl, nq, nkv, nkv};
    for (int run = 0; run < RUNS; run++) {
        regc_backend *be = run == THREADS_3 ? three : one;
        regc_attn_shape x = s;
        x.dropout = run == NONE ? 0.0f : 0.1f;
        x.drop_site = run == OTHER_SITE ? &other : &site;
        x.drop_draw = run == EVAL ? eval : draw;
        for (int i = 0; i < 5; i++)
            r[run][i] = regc_test_host_floats(n[i]);
        be->attention_fwd(be, r[run][0], r[run][1], q, k, v, NULL, &x);
        be->attention_bwd(be, r[run][2], r[run][3], r[run][4], NULL, dout, q, k, v, NULL, r[run][0],
                          r[run][1], &x);
        assert_int_equal(be->sync(be), REGC_OK);
    }
    static const char *const name[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        regc_test_assert_bitwise_equal(name[i], r[THREADS_1][i], r[THREADS_3][i], n[i]);
        regc_test_assert_bitwise_equal(name[i], r[NONE][i], r[EVAL][i], n[i]);
    }
    /* the log-sum-exp is the undropped softmax's: dropout leaves it */
    regc_test_assert_bitwise_equal("lse", r[NONE][1], r[THREADS_1][1], nl);
    assert_true(memcmp(r[NONE][0], r[THREADS_1][0], nq * sizeof(float)) != 0);
    assert_true(memcmp(r[OTHER_SITE][0], r[THREADS_1][0], nq * sizeof(float)) != 0);
    regc_test_release_all(); /* before the backends that made them */
    regc_backend_free(one), regc_backend_free(three);
}

/* ---------------------------------------------------------------- training */

static char *tmp, *gpt2_dir, *bert_dir, *llama_dir;

/* The models trained: the GPT-2 below, llama-tiny with LoRA, the BERT and
 * the Llama below, and t5-tiny (dropout_rate 0.1). */
enum { GPT2, LORA, BERT, LLAMA, T5, N_KINDS };
static const char *const kind_name[N_KINDS] = {"gpt2", "llama-tiny with LoRA", "bert",
                                               "llama with attention_dropout", "t5-tiny"};

static int setup(void **state)
{
    (void)state;
    tmp = regc_test_make_temp_dir("dropout");
    gpt2_dir = tmp ? regc_test_join(tmp, "gpt2") : NULL;
    bert_dir = tmp ? regc_test_join(tmp, "bert") : NULL;
    llama_dir = tmp ? regc_test_join(tmp, "llama") : NULL;
    if (!gpt2_dir || !bert_dir || !llama_dir || regc_make_dirs(gpt2_dir) < 0 ||
        regc_make_dirs(bert_dir) < 0 || regc_make_dirs(llama_dir) < 0)
        return -1;
    /* grouped heads, as Llama 3's */
    if (regc_test_write_text(llama_dir, "config.json",
                             "{\"model_type\": \"llama\", \"vocab_size\": 512, "
                             "\"hidden_size\": 64, \"intermediate_size\": 128, "
                             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                             "\"num_key_value_heads\": 2, \"max_position_embeddings\": 64, "
                             "\"attention_dropout\": 0.1}"))
        return -1;
    /* BERT's hidden and attention dropouts; [MASK] outside the byte-level
     * corpus */
    if (regc_test_write_text(
            bert_dir, "config.json",
            "{\"model_type\": \"bert\", \"vocab_size\": 512, "
            "\"hidden_size\": 64, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"intermediate_size\": 128, "
            "\"max_position_embeddings\": 64, \"mask_token_id\": 256, "
            "\"hidden_dropout_prob\": 0.1, \"attention_probs_dropout_prob\": 0.1}"))
        return -1;
    /* validation tokens */
    uint16_t t[4096];
    for (int i = 0; i < 4096; i++)
        t[i] = (uint16_t)((i * 7919u + 13u) % 512u);
    char *val = regc_test_join(tmp, "val.bin");
    int bad = !val || regc_tokens_write(val, t, 4096);
    free(val);
    if (bad)
        return -1;
    /* GPT-2's three dropouts, with weights drawn and saved for the command */
    regc_model *m = NULL;
    bad = regc_test_write_text(gpt2_dir, "config.json",
                               "{\"model_type\": \"gpt2\", \"vocab_size\": 512, \"n_positions\": "
                               "64, \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4, "
                               "\"resid_pdrop\": 0.1, \"embd_pdrop\": 0.1, \"attn_pdrop\": 0.1}") ||
          regc_model_load_config(gpt2_dir, &m) || regc_model_init_random(m, 1337) ||
          regc_model_save(m, gpt2_dir);
    regc_model_free(m);
    return bad ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    regc_test_remove_tree(tmp);
    free(tmp), free(gpt2_dir), free(bert_dir), free(llama_dir);
    return 0;
}

static void on_step(const regc_step_report *r, void *user)
{
    regc_test_losses *l = user;
    if (l->n < REGC_TEST_MAX_STEPS)
        l->loss[l->n++] = r->loss;
}

/* The kind's model (llama-tiny with LoRA dropout 0.1 on every linear
 * layer), trained as o says with dropout `on`. */
static regc_model *train(int kind, int on, const regc_train_options *o, regc_test_losses *l)
{
    regc_model *m = NULL;
    const int lora = kind == LORA;
    const char *dir = kind == BERT ? bert_dir : kind == LLAMA ? llama_dir : gpt2_dir;
    if ((lora || kind == T5 ? regc_model_load(lora ? "llama-tiny" : "t5-tiny", &m)
                            : regc_model_load_config(dir, &m)))
        fail_msg("%s", regc_error_message());
    regc_model_set_dropout(m, on);
    regc_lora_config c = {
        .r = 4, .alpha = 8, .dropout = on ? 0.1 : 0.0, .target_modules = "all-linear"};
    c.seed = o->seed;
    if (lora && regc_model_add_lora(m, &c))
        fail_msg("%s", regc_error_message());
    memset(l, 0, sizeof *l);
    if (regc_train(m, o, on_step, l, NULL))
        fail_msg("%s", regc_error_message());
    assert_int_equal(l->n, o->steps);
    return m;
}

static void assert_same(const char *what, regc_model *a, const regc_test_losses *la, regc_model *b,
                        const regc_test_losses *lb)
{
    if (memcmp(la->loss, lb->loss, sizeof la->loss))
        fail_msg("%s: the losses differ (%.9g vs %.9g at the last step)", what, la->loss[STEPS - 1],
                 lb->loss[STEPS - 1]);
    regc_test_assert_same_weights(a, b);
}

/* Regional == whole, O0 == O1, 1 == 3 threads, recomputed == kept, each
 * bit for bit with dropout on; and on != off. */
static void test_training_properties(void **state)
{
    (void)state;
    for (int kind = 0; kind < N_KINDS; kind++) {
        const char *name = kind_name[kind];
        regc_train_options o = regc_test_train_options(2, 16, STEPS);
        regc_test_losses ref, off, x;
        regc_model *a = train(kind, 1, &o, &ref);
        o.compile.regional = 0;
        regc_model *b = train(kind, 1, &o, &x);
        assert_same(name, a, &ref, b, &x);
        regc_model_free(b);
        o.compile.regional = 1, o.compile.level = REGC_LEVEL_O0, o.compile.inline_back = 0;
        b = train(kind, 1, &o, &x);
        assert_same(name, a, &ref, b, &x);
        regc_model_free(b);
        o = regc_test_train_options(2, 16, STEPS);
        o.compile.recompute = REGC_RECOMPUTE_FULL;
        b = train(kind, 1, &o, &x);
        assert_same(name, a, &ref, b, &x);
        regc_model_free(b);
        o = regc_test_train_options(2, 16, STEPS);
        o.threads = 3;
        b = train(kind, 1, &o, &x);
        assert_same(name, a, &ref, b, &x);
        regc_model_free(b);
        o = regc_test_train_options(2, 16, STEPS);
        b = train(kind, 0, &o, &off);
        if (!memcmp(ref.loss, off.loss, sizeof ref.loss))
            fail_msg("%s: dropout on gives dropout off's losses", name);
        regc_model_free(a), regc_model_free(b);
    }
}

/* `regc train` on the GPT-2 above with `args`: its status, stdout and
 * stderr in *out. */
static int run(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run(char **out, const char *fmt, ...)
{
    char args[3000], cmd[4000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s train --model %s --batch 2 --seq 16 --threads 2 %s 2>&1",
             REGC_BIN, gpt2_dir, args);
    return regc_test_run_capture(cmd, out);
}

/* The first "val_loss" of a --json run's output. */
static double val_loss(const char *out)
{
    const char *at = strstr(out, "\"val_loss\":");
    assert_non_null(at);
    return strtod(at + 11, NULL);
}

/* The command: a resumed run draws the masks a run that never stopped
 * draws; validation draws none (at a rate that moves nothing, its loss is
 * dropout off's); what regc does not apply is refused by its key. */
static void test_command(void **state)
{
    (void)state;
    char *out = NULL;
    double whole[8], resumed[8];
    const char *on = "--steps 6 --json --dropout on";
    if (run(&out, "%s --output-dir %s/ck --save-steps 3", on, tmp))
        fail_msg("%s", out);
    assert_int_equal(regc_test_json_losses(strstr(out, "{\"step"), whole, 8), 6);
    free(out);
    if (run(&out, "%s --resume-from-checkpoint %s/ck/checkpoint-3", on, tmp))
        fail_msg("%s", out);
    assert_int_equal(regc_test_json_losses(strstr(out, "{\"step"), resumed, 8), 3);
    free(out);
    assert_memory_equal(whole + 3, resumed, 3 * sizeof *whole);

    double val[2];
    for (int k = 0; k < 2; k++) {
        if (run(&out, "--steps 1 --lr 1e-30 --json --val-data %s/val.bin --dropout %s", tmp,
                k ? "on" : "off"))
            fail_msg("%s", out);
        val[k] = val_loss(out);
        free(out);
    }
    assert_memory_equal(&val[0], &val[1], sizeof *val);

    /* LoRA's dropout without train.dropout */
    char cmd[4000];
    snprintf(cmd, sizeof cmd,
             "%s train --model llama-tiny --lora-r 4 --lora-dropout 0.1 --steps 1 2>&1", REGC_BIN);
    assert_int_equal(regc_test_run_capture(cmd, &out), 1);
    assert_non_null(strstr(out, "lora.lora_dropout: 0.1 is applied with train.dropout on"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_attention_kernel),
        cmocka_unit_test(test_training_properties),
        cmocka_unit_test(test_command),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
