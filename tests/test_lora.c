/* test_lora.c — LoRA as PEFT trains it.
 *
 * Against PEFT (tests/data/lora_reference.json, written by
 * tools/reference/lora_reference.py with Transformers + PEFT): the tiny
 * Llama of llama_reference.json's first case, an adapter PEFT saved, 10
 * AdamW steps with the real `regc` command; every loss within 1e-5
 * relative; the adapter regc saves holds PEFT's names and shapes, reads back
 * as the same configuration, and gives PEFT's next loss; merged into the
 * base by `regc merge`, PEFT's merged model's loss.
 *
 * By property, on every architecture's preset: regional == full, O0 == O1
 * and 1 == 2 threads bit for bit; the frozen base comes back exactly as
 * drawn while the adapters move; the step holds gradients and moments of
 * the adapters alone; a run resumed from a checkpoint == one that never
 * stopped. Bad configurations are refused with one line naming the key. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_models.h"
#include "regc_train.h"
#include "test_adapter_run.h"
#include "test_device.h"
#include "test_model.h"
#include "test_reference.h"
#include "test_train_case.h"
#include "test_util.h"

#define LOSS_RTOL 1e-5
#define STEPS 5

/* ---------------------------------------------------------------- against PEFT */

/* The tensors of two safetensors files: the same names and shapes. */
static void assert_same_tensors(const char *a_path, const char *b_path)
{
    regc_st_file *a = NULL, *b = NULL;
    assert_int_equal(regc_st_open(a_path, &a), REGC_OK);
    assert_int_equal(regc_st_open(b_path, &b), REGC_OK);
    assert_int_equal(regc_st_count(a), regc_st_count(b));
    for (int i = 0; i < regc_st_count(a); i++) {
        int j = regc_st_find(b, regc_st_name(a, i));
        if (j < 0)
            fail_msg("%s has %s, %s does not", a_path, regc_st_name(a, i), b_path);
        assert_int_equal(regc_st_bytes(a, i), regc_st_bytes(b, j));
    }
    regc_st_close(a);
    regc_st_close(b);
}

static void test_peft_case(void **state)
{
    regc_test_train_case *c = *state;
    const cJSON *lora_case = c->spec;
    c->spec = regc_test_json_get(lora_case, "base"); /* the base model's own record */
    regc_test_train_case_build(c);
    char adapter[1200], saved[1200];
    snprintf(adapter, sizeof adapter, "%s/%s", REGC_SOURCE_DIR,
             regc_test_json_get(lora_case, "adapter_dir")->valuestring);
    snprintf(saved, sizeof saved, "%s/saved", c->tmp);

    /* 10 steps from PEFT's adapter, its losses */
    const int steps = (int)regc_test_json_int(lora_case, "steps");
    const char *const flags[] = {"--adapter", adapter, "--save", saved, NULL};
    regc_test_train_result r;
    regc_test_train_case_run(c, steps, flags, &r);
    regc_test_check_losses(c->name, r.loss, regc_test_json_get(lora_case, "losses"), steps,
                           LOSS_RTOL, "peft");

    /* the adapter regc saved: PEFT's names and shapes, the same config */
    char a[1300], b[1300];
    snprintf(a, sizeof a, "%s/adapter_model.safetensors", adapter);
    snprintf(b, sizeof b, "%s/adapter_model.safetensors", saved);
    assert_same_tensors(a, b);
    regc_lora_config want, got;
    char want_t[1024], got_t[1024];
    assert_int_equal(regc_lora_read_config(adapter, &want, want_t, sizeof want_t), REGC_OK);
    if (regc_lora_read_config(saved, &got, got_t, sizeof got_t) != REGC_OK)
        fail_msg("%s", regc_error_message());
    assert_int_equal(got.r, want.r);
    assert_true(got.alpha == want.alpha && got.use_rslora == want.use_rslora);

    /* trained further from it at a rate that moves nothing, the next
     * batch's loss is PEFT's after its 10 steps (batch 1 holds the next
     * batch's rows, 10 .. 19) */
    c->spec = regc_test_json_get(lora_case, "base");
    const char *const again[] = {"--adapter", saved, "--lr", "1e-30", NULL};
    regc_test_train_case_run(c, 2, again, &r);
    const double next = regc_test_json_number(lora_case, "next_loss");
    print_message("case %s next batch: regc %.9f  peft %.9f\n", c->name, r.loss[1], next);
    assert_true(fabs(r.loss[1] - next) <= LOSS_RTOL * fabs(next));

    /* merged into the base by `regc merge`: PEFT's merged model's loss */
    char merged[sizeof c->model_dir], cmd[4200], *out = NULL;
    snprintf(merged, sizeof merged, "%.1000s/merged", c->tmp);
    snprintf(cmd, sizeof cmd, "'%s' merge --model '%s' --adapter '%s' --save '%s' 2>&1", REGC_BIN,
             c->model_dir, saved, merged);
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s", out);
    free(out);
    snprintf(c->model_dir, sizeof c->model_dir, "%s", merged);
    const char *const plain[] = {"--lr", "1e-30", NULL};
    regc_test_train_case_run(c, 2, plain, &r);
    const double merged_loss = regc_test_json_number(lora_case, "merged_next_loss");
    print_message("case %s merged: regc %.9f  peft %.9f\n", c->name, r.loss[1], merged_loss);
    assert_true(fabs(r.loss[1] - merged_loss) <= LOSS_RTOL * fabs(merged_loss));
    c->spec = lora_case;
}

/* `cmd`, a regc train of steps + 1 steps at a rate that moves nothing, is
 * within LOSS_RTOL of `want` at its last step: the next batch's loss. */
static void expect_next_loss(const char *name, const char *what, const char *cmd, int steps,
                             double want)
{
    char *out = NULL;
    double loss[REGC_TEST_TRAIN_MAX_STEPS];
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s %s: %s", name, what, out);
    assert_int_equal(regc_test_json_losses(out, loss, REGC_TEST_TRAIN_MAX_STEPS), steps + 1);
    free(out);
    print_message("case %s %s: regc %.9f  peft %.9f\n", name, what, loss[steps], want);
    assert_true(fabs(loss[steps] - want) <= LOSS_RTOL * fabs(want));
}

/* A case of the file's "graph_cases": LoRA on a model exported from
 * PyTorch (Qwen2's graph), from PEFT's adapter, with its own token file. */
static void test_peft_graph_case(void **state)
{
    const cJSON *c = *state;
    const char *name = regc_test_json_get(c, "name")->valuestring;
    char *tmp = regc_test_make_temp_dir("lora-graph"), cmd[4000], *out = NULL;
    assert_non_null(tmp);
    const int steps = (int)regc_test_json_int(c, "steps");
    char model[3000];
    snprintf(model, sizeof model,
             "%s train --model %s/%s --weights %s/%s --data %s/%s --batch %lld --seq %lld --lr "
             "%.17g --weight-decay %.17g --json",
             REGC_BIN, REGC_SOURCE_DIR, regc_test_json_get(c, "graph")->valuestring,
             REGC_SOURCE_DIR, regc_test_json_get(c, "weights")->valuestring, REGC_SOURCE_DIR,
             regc_test_json_get(c, "tokens")->valuestring,
             (long long)regc_test_json_int(c, "batch"), (long long)regc_test_json_int(c, "seq"),
             regc_test_json_number(c, "lr"), regc_test_json_number(c, "weight_decay"));
    snprintf(cmd, sizeof cmd, "%s --steps %d --adapter %s/%s --save %s/saved 2>/dev/null", model,
             steps, REGC_SOURCE_DIR, regc_test_json_get(c, "adapter_dir")->valuestring, tmp);
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s: %s", name, out);
    double loss[REGC_TEST_TRAIN_MAX_STEPS];
    assert_int_equal(regc_test_json_losses(out, loss, REGC_TEST_TRAIN_MAX_STEPS), steps);
    free(out);
    regc_test_check_losses(name, loss, regc_test_json_get(c, "losses"), steps, LOSS_RTOL, "peft");
    /* the saved adapter, at a rate that moves nothing: batch `steps`, the
     * next one, gives PEFT's loss after its steps */
    snprintf(cmd, sizeof cmd, "%s --steps %d --lr 1e-30 --adapter %s/saved 2>/dev/null", model,
             steps + 1, tmp);
    expect_next_loss(name, "next batch", cmd, steps, regc_test_json_number(c, "next_loss"));
    /* merged into the graph model's weights by `regc merge`: a graph model
     * of its own (graph.json, model.safetensors), PEFT's merged model's
     * next loss */
    snprintf(cmd, sizeof cmd,
             "%s merge --model %s/%s --weights %s/%s --adapter %s/saved --save "
             "%s/merged 2>&1",
             REGC_BIN, REGC_SOURCE_DIR, regc_test_json_get(c, "graph")->valuestring,
             REGC_SOURCE_DIR, regc_test_json_get(c, "weights")->valuestring, tmp, tmp);
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s: %s", name, out);
    free(out);
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/merged/graph.json --weights %s/merged/model.safetensors --data "
             "%s/%s --batch %lld --seq %lld --lr 1e-30 --steps %d --json 2>/dev/null",
             REGC_BIN, tmp, tmp, REGC_SOURCE_DIR, regc_test_json_get(c, "tokens")->valuestring,
             (long long)regc_test_json_int(c, "batch"), (long long)regc_test_json_int(c, "seq"),
             steps + 1);
    expect_next_loss(name, "merged", cmd, steps, regc_test_json_number(c, "merged_next_loss"));
    regc_test_remove_tree(tmp);
    free(tmp);
}

/* ---------------------------------------------------------------- properties */

static const char *const presets[] = {"llama-tiny", "gpt2-tiny", "bert-tiny", "t5-tiny"};

static regc_lora_config lora_config(const char *targets, uint64_t seed)
{
    return (regc_lora_config){.r = 4, .alpha = 8.0, .target_modules = targets, .seed = seed};
}

/* The losses too: regc_test_train's collector, on a LoRA model. */
static void on_step(const regc_step_report *r, void *user)
{
    regc_test_losses *l = user;
    if (l->n < REGC_TEST_MAX_STEPS)
        l->loss[l->n++] = r->loss;
}

/* `preset` with LoRA on every linear layer (the base's linear weights held
 * in bf16 with base_bf16), trained as o says. */
static regc_model *train_lora_base(const char *preset, regc_train_options *o, regc_test_losses *l,
                                   int base_bf16)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    regc_lora_config c = lora_config("all-linear", o->seed);
    c.base_dtype = base_bf16 ? REGC_BASE_BF16 : REGC_BASE_FP32;
    if (regc_model_add_lora(m, &c) != REGC_OK)
        fail_msg("%s: %s", preset, regc_error_message());
    memset(l, 0, sizeof *l);
    if (regc_train(m, o, on_step, l, NULL) != REGC_OK)
        fail_msg("train %s: %s", preset, regc_error_message());
    assert_int_equal(l->n, o->steps);
    return m;
}

/* `preset` with LoRA as train_lora_base makes it, the base in fp32 but each
 * weight a bf16 base would hold in bf16 drawn and rounded to bf16 (the
 * values a bf16 base holds), trained as o says. */
static regc_model *train_rounded_base(const char *preset, regc_train_options *o,
                                      regc_test_losses *l)
{
    regc_model *m = NULL, *held = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    assert_int_equal(regc_model_load_shapes(preset, &held), REGC_OK);
    regc_lora_config c = lora_config("all-linear", o->seed);
    assert_int_equal(regc_model_add_lora(m, &c), REGC_OK);
    c.base_dtype = REGC_BASE_BF16;
    assert_int_equal(regc_model_add_lora(held, &c), REGC_OK);
    assert_int_equal(regc_model_init_random(m, o->seed), REGC_OK);
    for (int p = 0; p < regc_model_n_params(m); p++) {
        if (regc_model_param_frozen(held, p) != REGC_FROZEN_BF16)
            continue;
        float *w = regc_model_weights(m) + regc_model_param_offset(m, p);
        for (int64_t k = 0; k < regc_model_param_numel(m, p); k++) {
            const uint32_t bits = (uint32_t)regc_f32_to_bf16(w[k]) << 16;
            memcpy(&w[k], &bits, sizeof bits);
        }
    }
    regc_model_free(held);
    memset(l, 0, sizeof *l);
    if (regc_train(m, o, on_step, l, NULL) != REGC_OK)
        fail_msg("train %s: %s", preset, regc_error_message());
    return m;
}

static regc_model *train_lora_losses(const char *preset, regc_train_options *o, regc_test_losses *l)
{
    return train_lora_base(preset, o, l, 0);
}

static void assert_same_run(const char *what, const char *preset, regc_model *a,
                            const regc_test_losses *la, regc_model *b, const regc_test_losses *lb)
{
    if (memcmp(la->loss, lb->loss, sizeof la->loss) != 0)
        fail_msg("%s: %s: the losses differ (%.9g vs %.9g at step 0)", preset, what, la->loss[0],
                 lb->loss[0]);
    regc_test_assert_same_weights(a, b);
}

/* Regional == full and O0 == O1, bit for bit, with the adapters as
 * parameters of every layer region; and the frozen base is untouched. */
static void test_regional_levels_and_frozen(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_train_options o = regc_test_train_options(2, 16, STEPS);
        o.weight_decay = 0.01f;
        regc_test_losses lr, lf, l0;
        regc_model *r = train_lora_losses(presets[i], &o, &lr);
        o.compile.regional = 0;
        regc_model *f = train_lora_losses(presets[i], &o, &lf);
        o.compile.regional = 1, o.compile.level = REGC_LEVEL_O0, o.compile.inline_back = 0;
        regc_model *z = train_lora_losses(presets[i], &o, &l0);
        assert_same_run("regional vs full", presets[i], r, &lr, f, &lf);
        assert_same_run("O1 vs O0", presets[i], r, &lr, z, &l0);

        /* the same model drawn again: the base bit for bit, the adapters moved */
        regc_model *fresh = NULL;
        assert_int_equal(regc_model_load(presets[i], &fresh), REGC_OK);
        regc_lora_config c = lora_config("all-linear", o.seed);
        assert_int_equal(regc_model_add_lora(fresh, &c), REGC_OK);
        assert_int_equal(regc_model_init_random(fresh, o.seed), REGC_OK);
        int moved = 0;
        for (int p = 0; p < regc_model_n_params(r); p++) {
            const float *x = regc_model_weights(r) + regc_model_param_offset(r, p);
            const float *y = regc_model_weights(fresh) + regc_model_param_offset(fresh, p);
            size_t bytes = (size_t)regc_model_param_numel(r, p) * sizeof *x;
            if (regc_model_param_frozen(r, p) && memcmp(x, y, bytes) != 0)
                fail_msg("%s: frozen %s changed", presets[i], regc_model_param_name(r, p));
            moved += !regc_model_param_frozen(r, p) && memcmp(x, y, bytes) != 0;
        }
        int adapters = 0;
        for (int p = 0; p < regc_model_n_params(r); p++)
            adapters += !regc_model_param_frozen(r, p);
        assert_int_equal(moved, adapters); /* every A and B */
        regc_model_free(fresh);
        regc_model_free(r), regc_model_free(f), regc_model_free(z);
    }
}

/* A base held in bf16: under compile.precision bf16, whose GEMMs round
 * their operands to bf16 anyway, the same bits as a base in fp32 holding
 * the same values (the draws rounded: the embedding tables too); in fp32
 * its products are bf16 GEMMs: other bits, close; regional == full and
 * O0 == O1 bit for bit; the frozen block smaller by half the linear
 * weights' bytes; the base comes back as it was drawn, rounded to bf16. */
static void test_bf16_base(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_train_options o = regc_test_train_options(2, 16, STEPS);
        regc_test_losses a, b, f, z, ref;
        o.compile.precision = REGC_PRECISION_BF16;
        regc_model *ma = train_lora_base(presets[i], &o, &a, 1);
        regc_model *mb = train_rounded_base(presets[i], &o, &b);
        if (memcmp(a.loss, b.loss, sizeof a.loss))
            fail_msg("%s: under bf16 a bf16 base gives other losses than its values in fp32 "
                     "(%.9g vs %.9g)",
                     presets[i], a.loss[STEPS - 1], b.loss[STEPS - 1]);
        o.compile.precision = REGC_PRECISION_FP32;
        regc_model *m16 = train_lora_base(presets[i], &o, &a, 1);
        regc_model *m32 = train_lora_base(presets[i], &o, &ref, 0);
        o.compile.regional = 0;
        regc_model *mf = train_lora_base(presets[i], &o, &f, 1);
        o.compile.regional = 1, o.compile.level = REGC_LEVEL_O0, o.compile.inline_back = 0;
        regc_model *mz = train_lora_base(presets[i], &o, &z, 1);
        assert_same_run("bf16 base, regional vs full", presets[i], m16, &a, mf, &f);
        assert_same_run("bf16 base, O1 vs O0", presets[i], m16, &a, mz, &z);
        for (int s = 0; s < STEPS; s++) {
            const double rel = fabs(a.loss[s] - ref.loss[s]) / fabs(ref.loss[s]);
            if (!(rel < 2e-2) || (s == 0 && a.loss[0] == ref.loss[0]))
                fail_msg("%s step %d: bf16 base %.9g, fp32 base %.9g", presets[i], s, a.loss[s],
                         ref.loss[s]);
        }
        /* every frozen weight held in bf16 comes back as its fp32 draw rounded */
        int64_t bf16 = 0;
        for (int p = 0; p < regc_model_n_params(m16); p++) {
            const int64_t n = regc_model_param_numel(m16, p);
            const float *x = regc_model_weights(m16) + regc_model_param_offset(m16, p);
            const float *y = regc_model_weights(m32) + regc_model_param_offset(m32, p);
            if (regc_model_param_frozen(m16, p) != REGC_FROZEN_BF16)
                continue;
            bf16 += n;
            for (int64_t k = 0; k < n; k++) {
                const uint32_t bits = (uint32_t)regc_f32_to_bf16(y[k]) << 16;
                float want;
                memcpy(&want, &bits, sizeof want);
                if (memcmp(&x[k], &want, sizeof want))
                    fail_msg("%s: %s[%lld] is %.9g, not its draw rounded %.9g", presets[i],
                             regc_model_param_name(m16, p), (long long)k, x[k], want);
            }
        }
        assert_true(bf16 > 0);
        assert_true(regc_model_frozen_bytes(m16) < regc_model_frozen_bytes(m32));
        assert_true(regc_model_frozen_bytes(m16) >= regc_model_frozen_bytes(m32) - 2 * bf16);
        regc_model *all[] = {ma, mb, m16, m32, mf, mz};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            regc_model_free(all[k]);
    }
}

/* ZeRO-3 with LoRA: the adapters in gather units and shards, the frozen
 * base in units and shards of its own; in one process stage 3 == stage 0
 * bit for bit, the frozen base returned as drawn, with the base in fp32
 * and in bf16 (two ranks: tests/test_ranks.c's way). */
static void test_stage3(void **state)
{
    (void)state;
    for (int base_bf16 = 0; base_bf16 < 2; base_bf16++)
        for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
            regc_train_options o = regc_test_train_options(2, 16, STEPS);
            regc_test_losses l0, l3;
            regc_model *a = train_lora_base(presets[i], &o, &l0, base_bf16);
            o.zero_stage = 3;
            regc_model *b = train_lora_base(presets[i], &o, &l3, base_bf16);
            assert_same_run("stage 3 vs stage 0", presets[i], a, &l0, b, &l3);
            regc_model_free(a), regc_model_free(b);
        }
}

/* Every thread count sums every element in one order: the same bits. */
static void test_threads(void **state)
{
    (void)state;
    regc_test_losses l1, l2;
    regc_train_options o = regc_test_train_options(2, 16, STEPS);
    o.threads = 1;
    regc_model *a = train_lora_losses("llama-tiny", &o, &l1);
    o.threads = 3;
    regc_model *b = train_lora_losses("llama-tiny", &o, &l2);
    assert_same_run("1 vs 3 threads", "llama-tiny", a, &l1, b, &l2);
    regc_model_free(a), regc_model_free(b);
}

/* The step's blocks: parameters, gradients and moments of the adapters
 * alone; the frozen base in a block of its own, read only, and at ZeRO-3
 * over 4 ranks a quarter of it on each (its units padded to whole words
 * per rank). */
static void test_memory(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("llama-tiny", &m), REGC_OK);
    const int64_t total = regc_model_total_numel(m);
    regc_lora_config c = lora_config("q_proj,v_proj", 1);
    assert_int_equal(regc_model_add_lora(m, &c), REGC_OK);
    /* llama-tiny: 4 layers, hidden 128, 2 kv heads of 32: q 128 -> 128, v 128 -> 64 */
    const int64_t adapters = 4 * (4 * 128 + 128 * 4 + 4 * 128 + 64 * 4);
    assert_int_equal(regc_model_trainable_numel(m), adapters);
    assert_int_equal(regc_model_total_numel(m), total + adapters);
    regc_compile_options co;
    regc_compile_options_default(&co);
    regc_program *p = NULL;
    if (regc_program_compile(m, 2, 16, &co, &p, NULL) != REGC_OK)
        fail_msg("%s", regc_error_message());
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    assert_int_equal(a.block_floats, adapters);
    assert_int_equal(a.grads + a.m + a.v, 3 * adapters * 4);
    assert_int_equal(a.frozen, total * 4);
    assert_true(a.total >= a.params + a.grads + a.m + a.v + a.frozen);
    regc_program_free(p);
    co.zero_stage = 3, co.ranks = 4;
    if (regc_program_compile(m, 2, 16, &co, &p, NULL) != REGC_OK)
        fail_msg("%s", regc_error_message());
    regc_program_device_memory(p, &a);
    const regc_shard_layout *fl = regc_program_frozen_layout(p);
    assert_non_null(fl);
    const int64_t slack = (int64_t)fl->n_units * REGC_SHARD_ALIGN * 4; /* each unit's padding */
    if (!(a.frozen * 4 >= total * 4 && a.frozen <= total + slack))
        fail_msg("a frozen shard of %lld bytes of %lld at 4 ranks", (long long)a.frozen,
                 (long long)(total * 4));
    regc_program_free(p);
    regc_model_free(m);
}

/* ---------------------------------------------------------------- the command */

/* The one error line of a failed run: the last, and no other says "regc:". */
static const char *error_line(const char *out)
{
    const char *line = strstr(out, "regc");
    return line && !strstr(line + 1, "\nregc") ? line : "";
}

/* Resumed from a checkpoint == never stopped: the same losses after it and
 * the same adapter, byte for byte. */
static void test_resume(void **state)
{
    (void)state;
    regc_test_assert_adapter_resume("lora-resume", "--lora-r 4 --lora-target-modules all-linear");
}

/* The lora section of a config file: target_modules as a list, or as a
 * string (a regular expression, PEFT's rule), adapt the same layers as the
 * flags do: the same bits. */
static void test_config_file(void **state)
{
    (void)state;
    char *tmp = regc_test_make_temp_dir("lora-config"), args[3000], *out = NULL;
    assert_non_null(tmp);
    static const char *const configs[] = {
        "{\"lora\": {\"r\": 4, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"]}}",
        "{\"lora\": {\"r\": 4, \"lora_alpha\": 16, \"target_modules\": "
        "\"model\\\\.layers\\\\.[0-9]+\\\\.self_attn\\\\.(q|v)_proj\"}}",
    };
    double want[8], got[8];
    if (regc_test_tiny_train(
            "--lora-r 4 --lora-alpha 16 --lora-target-modules q_proj,v_proj --steps 3 --json",
            &out) != 0)
        fail_msg("%s", out);
    assert_int_equal(regc_test_json_losses(out, want, 8), 3);
    free(out);
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
        assert_int_equal(regc_test_write_text(tmp, "config.json", configs[i]), 0);
        snprintf(args, sizeof args, "--config %s/config.json --steps 3 --json", tmp);
        if (regc_test_tiny_train(args, &out) != 0)
            fail_msg("%s:\n%s", configs[i], out);
        assert_int_equal(regc_test_json_losses(out, got, 8), 3);
        assert_memory_equal(want, got, 3 * sizeof *want);
        free(out);
    }
    regc_test_remove_tree(tmp);
    free(tmp);
}

/* LoRA on a model exported from PyTorch (a graph JSON model: Qwen2's
 * graph, tests/data/exports): every linear layer found by the names the
 * exporter kept, regional == full bit for bit, the adapter saved with
 * PEFT's names. */
static void test_exported_model(void **state)
{
    (void)state;
    char *tmp = regc_test_make_temp_dir("lora-export"), cmd[4000], *out = NULL;
    assert_non_null(tmp);
    uint16_t t[4096];
    for (int i = 0; i < 4096; i++)
        t[i] = (uint16_t)((i * 7919u + 13u) % 96u);
    char *tokens = regc_test_join(tmp, "tokens.bin");
    assert_int_equal(regc_tokens_write(tokens, t, 4096), 0);
    double loss[2][8];
    for (int regional = 0; regional < 2; regional++) {
        snprintf(cmd, sizeof cmd,
                 "%s train --model %s/tests/data/exports/qwen2/graph.json --weights "
                 "%s/tests/data/exports/qwen2/model.safetensors --data %s --batch 2 --seq 12 "
                 "--steps 4 --json --lora-r 4 --lora-target-modules all-linear --regional %s "
                 "--save %s/%d 2>/dev/null",
                 REGC_BIN, REGC_SOURCE_DIR, REGC_SOURCE_DIR, tokens, regional ? "on" : "off", tmp,
                 regional);
        if (regc_test_run_capture(cmd, &out) != 0)
            fail_msg("%s", out);
        assert_int_equal(regc_test_json_losses(out, loss[regional], 8), 4);
        free(out);
    }
    assert_memory_equal(loss[0], loss[1], 4 * sizeof loss[0][0]);
    char a[3100], b[3100];
    snprintf(a, sizeof a, "%s/0/adapter_model.safetensors", tmp);
    snprintf(b, sizeof b, "%s/1/adapter_model.safetensors", tmp);
    size_t na = 0, nb = 0;
    char *x = regc_test_read_file(a, &na), *y = regc_test_read_file(b, &nb);
    assert_non_null(x), assert_non_null(y);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x), free(y);
    regc_st_file *f = NULL;
    assert_int_equal(regc_st_open(a, &f), REGC_OK);
    assert_int_equal(regc_st_count(f), 2 * 7 * 2); /* A and B of 7 layers in each of 2 blocks */
    assert_true(regc_st_find(f, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") >=
                0);
    regc_st_close(f);
    regc_test_remove_tree(tmp);
    free(tmp), free(tokens);
}

/* `regc merge` of a base stored in bf16 writes every tensor in bf16: those
 * no adapter touched as they were, the adapted ones moved. */
static void test_merge_keeps_dtype(void **state)
{
    (void)state;
    char *tmp = regc_test_make_temp_dir("lora-merge"), args[3000], cmd[4000], *out = NULL;
    assert_non_null(tmp);
    char *base = regc_test_join(tmp, "base"), *merged = regc_test_join(tmp, "merged");
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_init_random(m, 5), REGC_OK);
    const int n = regc_model_n_params(m);
    regc_dtype *bf16 = malloc((size_t)n * sizeof *bf16);
    assert_non_null(bf16);
    for (int i = 0; i < n; i++)
        bf16[i] = REGC_BF16;
    assert_int_equal(regc_model_save_as(m, base, bf16), REGC_OK);
    free(bf16);
    regc_model_free(m);
    snprintf(args, sizeof args, "--model %s --lora-r 4 --steps 2 --save %s/a", base, tmp);
    snprintf(cmd, sizeof cmd, "%s train --batch 2 --seq 16 %s 2>&1", REGC_BIN, args);
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s merge --model %s --adapter %s/a --save %s 2>&1", REGC_BIN, base,
             tmp, merged);
    if (regc_test_run_capture(cmd, &out) != 0)
        fail_msg("%s", out);
    free(out);
    char a[3100], b[3100];
    snprintf(a, sizeof a, "%s/model.safetensors", base);
    snprintf(b, sizeof b, "%s/model.safetensors", merged);
    regc_st_file *fa = NULL, *fb = NULL;
    assert_int_equal(regc_st_open(a, &fa), REGC_OK);
    assert_int_equal(regc_st_open(b, &fb), REGC_OK);
    assert_int_equal(regc_st_count(fa), regc_st_count(fb));
    int moved = 0;
    for (int i = 0; i < regc_st_count(fa); i++) {
        const char *name = regc_st_name(fa, i);
        const int j = regc_st_find(fb, name);
        assert_true(j >= 0);
        assert_int_equal(regc_st_float_dtype(fb, j), REGC_BF16);
        const int64_t bytes = regc_st_bytes(fa, i);
        assert_int_equal(bytes, regc_st_bytes(fb, j));
        float *x = malloc((size_t)bytes * 2), *y = malloc((size_t)bytes * 2);
        assert_non_null(x), assert_non_null(y);
        assert_int_equal(regc_st_read_range(fa, i, 0, bytes / 2, x), REGC_OK);
        assert_int_equal(regc_st_read_range(fb, j, 0, bytes / 2, y), REGC_OK);
        const int same = !memcmp(x, y, (size_t)bytes * 2);
        const int adapted = strstr(name, "q_proj") || strstr(name, "v_proj");
        if (!adapted && !same)
            fail_msg("%s changed, yet no adapter touches it", name);
        moved += adapted && !same;
        free(x), free(y);
    }
    assert_int_equal(moved, 8); /* q_proj and v_proj of 4 layers */
    regc_st_close(fa), regc_st_close(fb);
    regc_test_remove_tree(tmp);
    free(tmp), free(base), free(merged);
}

/* One line naming the key, exit 1, for each thing regc does not take. */
static void test_bad_input(void **state)
{
    (void)state;
    static const struct {
        const char *args, *says;
        int status; /* 2: a usage error */
    } cases[] = {
        {"--lora-r 4 --lora-target-modules nothing_here",
         "lora.target_modules: \"nothing_here\" matches no linear layer", 1},
        {"--lora-r 0", "--lora-r: expected an integer from 1", 2},
        {"--lora-alpha 16", "lora.lora_alpha: LoRA is off", 1},
        {"--lora-r 4 --lora-dropout 0.1", "lora.lora_dropout: 0.1 is applied with train.dropout on",
         1},
        {"--adapter /nonexistent-adapter", "/nonexistent-adapter/adapter_config.json", 1},
        {"--base-dtype bf16", "lora.base_dtype: a frozen base in bf16 needs LoRA adapters", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        int status = regc_test_tiny_train(cases[i].args, &out);
        if (status != cases[i].status || !strstr(error_line(out), cases[i].says) ||
            regc_test_count_lines(error_line(out)) != 1)
            fail_msg("%s: exit %d, expected %d and one line saying \"%s\":\n%s", cases[i].args,
                     status, cases[i].status, cases[i].says, out);
        free(out);
    }
}

/* What the library refuses, by key: a target that is no regular
 * expression, a dropout of 1, no target where the model has no default
 * (a graph model), a second set of adapters; and merging a graph model's
 * adapter. Each leaves the model as it was. */
static void test_refused_configs(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("llama-tiny", &m), REGC_OK);
    const int64_t total = regc_model_total_numel(m);
    regc_lora_config c = {.r = 4, .target_modules = "(q_proj", .target_regex = 1};
    assert_int_equal(regc_model_add_lora(m, &c), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "\"(q_proj\" is not a regular expression"));
    c = (regc_lora_config){.r = 4, .dropout = 1.0};
    assert_int_equal(regc_model_add_lora(m, &c), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "lora.lora_dropout: 1 (in [0, 1))"));
    assert_false(regc_model_has_lora(m));
    assert_int_equal(regc_model_total_numel(m), total);
    c = (regc_lora_config){.r = 4};
    assert_int_equal(regc_model_add_lora(m, &c), REGC_OK); /* q_proj,v_proj: PEFT's default */
    assert_int_equal(regc_model_add_lora(m, &c), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "has LoRA adapters already"));
    regc_model_free(m);

    char graph[2000], cmd[4200], *out = NULL;
    snprintf(graph, sizeof graph, "%s/tests/data/exports/qwen2/graph.json", REGC_SOURCE_DIR);
    assert_int_equal(regc_model_load_shapes(graph, &m), REGC_OK);
    assert_int_equal(regc_model_add_lora(m, &c), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "lora.target_modules: none given"));
    regc_model_free(m);
    /* merge: a graph model without its weights, --weights beside a directory */
    snprintf(cmd, sizeof cmd,
             "%s merge --model %s --adapter %s/tests/data/lora/qwen2_qv --save /nonexistent 2>&1",
             REGC_BIN, graph, REGC_SOURCE_DIR);
    assert_int_equal(regc_test_run_capture(cmd, &out), 1);
    assert_non_null(strstr(out, "weights are a file of their own: give --weights"));
    free(out);
    snprintf(cmd, sizeof cmd,
             "%s merge --model %s/tests/data/exports/llama --weights x.safetensors --adapter "
             "%s/tests/data/lora/llama_qv --save /nonexistent 2>&1",
             REGC_BIN, REGC_SOURCE_DIR, REGC_SOURCE_DIR);
    assert_int_equal(regc_test_run_capture(cmd, &out), 2);
    assert_non_null(strstr(out, "--weights applies to graph JSON models only"));
    free(out);
}

/* An adapter of another base (other shapes) or one regc cannot train as
 * PEFT would is refused naming the file and the tensor or key. */
static void test_bad_adapter(void **state)
{
    (void)state;
    char *tmp = regc_test_make_temp_dir("lora-adapter"), args[3000], *out = NULL;
    assert_non_null(tmp);
    /* a llama-tiny adapter saved by regc, then read as gpt2-tiny's */
    snprintf(args, sizeof args, "--lora-r 4 --lora-target-modules q_proj --steps 1 --save %s/a",
             tmp);
    if (regc_test_tiny_train(args, &out) != 0)
        fail_msg("%s", out);
    free(out);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train --model gpt2-tiny --steps 1 --adapter %s/a 2>&1", REGC_BIN,
             tmp);
    int status = regc_test_run_capture(cmd, &out);
    if (status != 1 || !strstr(out, "\"q_proj\" matches no linear layer of gpt2-tiny"))
        fail_msg("exit %d:\n%s", status, out);
    free(out);
    /* the same adapter with another rank in its config: the shapes differ */
    char path[3100], *text = NULL;
    snprintf(path, sizeof path, "%s/a/adapter_config.json", tmp);
    assert_non_null(text = regc_test_read_file(path, NULL));
    char *r = strstr(text, "\"r\":");
    assert_non_null(r);
    r[5] = '8'; /* "r":\t4 -> 8 */
    regc_test_write_file(path, text, strlen(text));
    snprintf(args, sizeof args, "--steps 1 --adapter %s/a", tmp);
    status = regc_test_tiny_train(args, &out);
    if (status != 1 || !strstr(out, "adapter_model.safetensors") || !strstr(out, "lora_A"))
        fail_msg("exit %d:\n%s", status, out);
    free(out);
    /* a bias regc does not train */
    r[5] = '4';
    char *bias = strstr(text, "\"none\"");
    assert_non_null(bias);
    memcpy(bias, "\"all\" ", 6);
    regc_test_write_file(path, text, strlen(text));
    status = regc_test_tiny_train(args, &out);
    if (status != 1 || !strstr(out, "adapter_config.json: bias"))
        fail_msg("exit %d:\n%s", status, out);
    free(out);
    free(text);
    regc_test_remove_tree(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),          cmocka_unit_test(test_regional_levels_and_frozen),
        cmocka_unit_test(test_bf16_base),       cmocka_unit_test(test_stage3),
        cmocka_unit_test(test_threads),         cmocka_unit_test(test_resume),
        cmocka_unit_test(test_config_file),     cmocka_unit_test(test_merge_keeps_dtype),
        cmocka_unit_test(test_exported_model),  cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_refused_configs), cmocka_unit_test(test_bad_adapter),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    const char *path = REGC_SOURCE_DIR "/tests/data/lora_reference.json";
    failed += regc_test_train_cases_run(path, NULL, test_peft_case);
    /* the exported models' cases */
    char *text = regc_test_read_file(path, NULL);
    cJSON *ref = text ? cJSON_Parse(text) : NULL;
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(ref, "graph_cases");
    struct CMUnitTest graph[8];
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach (c, cases)
        if (n < 8)
            graph[n++] =
                (struct CMUnitTest){cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring,
                                    test_peft_graph_case, NULL, NULL, (void *)c};
    if (n == 0) {
        fprintf(stderr, "%s: no \"graph_cases\" (run tools/reference/lora_reference.py)\n", path);
        failed++;
    } else {
        failed += _cmocka_run_group_tests("graph_cases", graph, (size_t)n, NULL, NULL);
    }
    cJSON_Delete(ref);
    free(text);
    return failed;
}
