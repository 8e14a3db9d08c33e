/* test_qlora.c — QLoRA: LoRA on a base held in NF4 as bitsandbytes holds it.
 *
 * Against PEFT + bitsandbytes (tests/data/lora_reference.json's
 * "qlora_cases", written by tools/reference/lora_reference.py): the tiny
 * Llama of the LoRA cases loaded in 4 bits by Transformers, PEFT's adapter
 * trained 10 AdamW steps with the real `regc --load-in-4bit`; every
 * quantised layer's NF4 bytes equal bitsandbytes' (their CRC-32), every
 * loss and the next batch's loss with the adapter regc saved within 1e-4
 * relative.
 *
 * By property, on every architecture's preset: a base in NF4 trains to the
 * bits of a base in fp32 (or bf16, with bnb_4bit_compute_dtype bfloat16)
 * holding the weights NF4 dequantises to, since the GEMMs dequantise as
 * they read; regional == full, O0 == O1, stage 3 == stage 0 and 1 == 3
 * threads bit for bit; a resumed run == one that never stopped; the frozen
 * block holds NF4's bytes. Under ZeRO-3 the frozen base's units stay
 * gathered from forward to backward under the persistence threshold and
 * where a budget leaves room: gathered once a step, the same bits. The
 * quantization section's keys regc does not apply are refused by name. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <zlib.h>

#include "program.h"
#include "regc_graph.h"
#include "regc_models.h"
#include "regc_train.h"
#include "test_adapter_run.h"
#include "test_device.h"
#include "test_model.h"
#include "test_reference.h"
#include "test_train_case.h"
#include "test_util.h"

#define LOSS_RTOL 1e-4
#define STEPS 4

/* ---------------------------------------------------------------- against PEFT + bitsandbytes */

/* regc's quantisation of each layer bitsandbytes quantised: its blob's
 * CRC-32 is the one recorded (the same bytes, in nf4_format.h's order). */
static void check_nf4_bytes(regc_test_train_case *c, const cJSON *crcs)
{
    regc_model *m = NULL;
    if (regc_model_load(c->model_dir, &m) != REGC_OK)
        fail_msg("%s", regc_error_message());
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach (it, crcs) {
        const char *name = cJSON_GetArrayItem(it, 0)->valuestring;
        const uint32_t want = (uint32_t)cJSON_GetArrayItem(it, 1)->valuedouble;
        int p = 0;
        while (p < regc_model_n_params(m) && strcmp(regc_model_param_name(m, p), name))
            p++;
        if (p == regc_model_n_params(m))
            fail_msg("%s: the model has no %s", c->name, name);
        const int64_t numel = regc_model_param_numel(m, p);
        const int64_t bytes = regc_frozen_kind_bytes(REGC_FROZEN_NF4, numel);
        uint8_t *blob = malloc((size_t)bytes);
        assert_non_null(blob);
        assert_int_equal(
            regc_nf4_quantize(regc_model_weights(m) + regc_model_param_offset(m, p), numel, blob),
            REGC_OK);
        const uint32_t got = (uint32_t)crc32(0L, blob, (uInt)bytes);
        if (got != want)
            fail_msg("%s: %s in NF4 has CRC-32 %08x, bitsandbytes' %08x", c->name, name, got, want);
        free(blob);
        n++;
    }
    print_message("case %s: %d layers quantised to bitsandbytes' bytes\n", c->name, n);
    assert_true(n > 0);
    regc_model_free(m);
}

static void test_qlora_case(void **state)
{
    regc_test_train_case *c = *state;
    const cJSON *qcase = c->spec;
    c->spec = regc_test_json_get(qcase, "base"); /* the base model's own record */
    regc_test_train_case_build(c);
    check_nf4_bytes(c, regc_test_json_get(qcase, "nf4_crc32"));

    char adapter[1200], saved[1200];
    snprintf(adapter, sizeof adapter, "%s/%s", REGC_SOURCE_DIR,
             regc_test_json_get(qcase, "adapter_dir")->valuestring);
    snprintf(saved, sizeof saved, "%s/saved", c->tmp);
    const int steps = (int)regc_test_json_int(qcase, "steps");
    const char *const flags[] = {"--load-in-4bit", "on",  "--adapter", adapter,
                                 "--save",         saved, NULL};
    regc_test_train_result r;
    regc_test_train_case_run(c, steps, flags, &r);
    regc_test_check_losses(c->name, r.loss, regc_test_json_get(qcase, "losses"), steps, LOSS_RTOL,
                           "peft+bnb");

    /* trained further at a rate that moves nothing: the next batch's loss */
    const char *const again[] = {"--load-in-4bit", "on", "--adapter", saved, "--lr", "1e-30", NULL};
    regc_test_train_case_run(c, 2, again, &r);
    const double next = regc_test_json_number(qcase, "next_loss");
    print_message("case %s next batch: regc %.9f  peft+bnb %.9f\n", c->name, r.loss[1], next);
    assert_true(fabs(r.loss[1] - next) <= LOSS_RTOL * fabs(next));
    c->spec = qcase;
}

/* ---------------------------------------------------------------- properties */

/* not GPT-2: its Conv1D weights are refused in NF4 (test_refused) */
static const char *const presets[] = {"llama-tiny", "bert-tiny", "t5-tiny"};

static void on_step(const regc_step_report *r, void *user)
{
    regc_test_losses *l = user;
    if (l->n < REGC_TEST_MAX_STEPS)
        l->loss[l->n++] = r->loss;
}

/* `preset` with LoRA r=4 on every linear layer, the linear layers in NF4
 * with load_in_4bit, its weights drawn from o's seed; with compute_bf16 the
 * NF4 multiplied in bf16 and the rest of the base in bf16 (a QLoRA base
 * loaded in bf16). With `dequantised` the base in fp32 (bf16 with
 * compute_bf16) holding instead the values its NF4 would give. */
static regc_model *lora_model(const char *preset, const regc_train_options *o, int load_in_4bit,
                              int compute_bf16, int dequantised)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    regc_lora_config c = {.r = 4,
                          .alpha = 8.0,
                          .target_modules = "all-linear",
                          .seed = o->seed,
                          .base_dtype = compute_bf16 ? REGC_BASE_BF16 : REGC_BASE_FP32,
                          .load_in_4bit = !dequantised && load_in_4bit,
                          .compute_bf16 = compute_bf16,
                          .compute_given = 1};
    if (regc_model_add_lora(m, &c) != REGC_OK)
        fail_msg("%s: %s", preset, regc_error_message());
    assert_int_equal(regc_model_init_random(m, o->seed), REGC_OK);
    if (!dequantised)
        return m;
    /* the layers NF4 would hold: those the NF4 model holds so */
    regc_model *q = lora_model(preset, o, 1, compute_bf16, 0);
    int any = 0;
    for (int p = 0; p < regc_model_n_params(q); p++) {
        const int kind = regc_model_param_frozen(q, p);
        if (kind != REGC_FROZEN_NF4 && kind != REGC_FROZEN_NF4_BF16)
            continue;
        const int64_t n = regc_model_param_numel(m, p);
        float *w = regc_model_weights(m) + regc_model_param_offset(m, p);
        uint8_t *blob = malloc((size_t)regc_frozen_kind_bytes(kind, n));
        assert_non_null(blob);
        assert_int_equal(regc_nf4_quantize(w, n, blob), REGC_OK);
        regc_nf4_dequantize(blob, n, w);
        free(blob);
        any = 1;
    }
    assert_true(any);
    regc_model_free(q);
    return m;
}

static regc_model *train(regc_model *m, const regc_train_options *o, regc_test_losses *l)
{
    memset(l, 0, sizeof *l);
    if (regc_train(m, o, on_step, l, NULL) != REGC_OK)
        fail_msg("train: %s", regc_error_message());
    assert_int_equal(l->n, o->steps);
    return m;
}

/* The adapters of two models, and their losses: the same bits. */
static void assert_same_adapters(const char *what, const char *preset, regc_model *a,
                                 const regc_test_losses *la, regc_model *b,
                                 const regc_test_losses *lb)
{
    if (memcmp(la->loss, lb->loss, sizeof la->loss) != 0)
        fail_msg("%s: %s: the losses differ (%.9g vs %.9g at the last step)", preset, what,
                 la->loss[STEPS - 1], lb->loss[STEPS - 1]);
    assert_int_equal(regc_model_n_params(a), regc_model_n_params(b));
    for (int p = 0; p < regc_model_n_params(a); p++)
        if (!regc_model_param_frozen(a, p) &&
            memcmp(regc_model_weights(a) + regc_model_param_offset(a, p),
                   regc_model_weights(b) + regc_model_param_offset(b, p),
                   (size_t)regc_model_param_numel(a, p) * sizeof(float)))
            fail_msg("%s: %s: adapter %s differs", preset, what, regc_model_param_name(a, p));
}

/* NF4 == the dequantised base in fp32 (bf16 products: in bf16), bit for
 * bit; and regional == full, O0 == O1, stage 3 == stage 0. */
static void test_nf4_is_its_dequantised_base(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            regc_train_options o = regc_test_train_options(2, 16, STEPS);
            o.weight_decay = 0.01f;
            regc_test_losses l4, ld, lf, l0, l3;
            regc_model *q = train(lora_model(presets[i], &o, 1, bf16, 0), &o, &l4);
            regc_model *d = train(lora_model(presets[i], &o, 1, bf16, 1), &o, &ld);
            /* the same tensors in bf16 but for the NF4 ones */
            for (int p = 0; p < regc_model_n_params(q); p++) {
                const int kq = regc_model_param_frozen(q, p), kd = regc_model_param_frozen(d, p);
                assert_true(kq == kd || (kq == REGC_FROZEN_NF4 && kd == 1) ||
                            (kq == REGC_FROZEN_NF4_BF16 && kd == REGC_FROZEN_BF16));
            }
            assert_same_adapters(bf16 ? "NF4 (bf16 products) vs its dequantised base in bf16"
                                      : "NF4 vs its dequantised base in fp32",
                                 presets[i], q, &l4, d, &ld);
            o.compile.regional = 0;
            regc_model *f = train(lora_model(presets[i], &o, 1, bf16, 0), &o, &lf);
            assert_same_adapters("NF4, regional vs full", presets[i], q, &l4, f, &lf);
            o.compile.regional = 1, o.compile.level = REGC_LEVEL_O0, o.compile.inline_back = 0;
            regc_model *z = train(lora_model(presets[i], &o, 1, bf16, 0), &o, &l0);
            assert_same_adapters("NF4, O1 vs O0", presets[i], q, &l4, z, &l0);
            o = regc_test_train_options(2, 16, STEPS);
            o.weight_decay = 0.01f, o.zero_stage = 3;
            regc_model *s = train(lora_model(presets[i], &o, 1, bf16, 0), &o, &l3);
            assert_same_adapters("NF4, stage 3 vs stage 0", presets[i], q, &l4, s, &l3);
            regc_model *all[] = {q, d, f, z, s};
            for (size_t k = 0; k < sizeof all / sizeof *all; k++)
                regc_model_free(all[k]);
        }
}

/* The all-gathers of a QLoRA llama-tiny's stage 3 step at 4 ranks under
 * co (its units, the frozen base's included, and those kept resident into
 * st). */
static int gathers_of(const regc_compile_options *co, regc_compile_stats *st)
{
    regc_train_options o = regc_test_train_options(2, 16, 1);
    regc_model *m = lora_model("llama-tiny", &o, 1, 0, 0);
    regc_program *p = NULL;
    if (regc_program_compile(m, 2, 16, co, &p, st) != REGC_OK)
        fail_msg("%s", regc_error_message());
    int n = 0;
    for (int i = 0; i < p->n_instr; i++)
        n += p->instr[i].kernel == K_ALLGATHER;
    regc_program_free(p);
    regc_model_free(m);
    return n;
}

/* The frozen base's units stay gathered from forward to backward as the
 * trained ones do: under the persistence threshold (DeepSpeed's holds for
 * every parameter), and where a memory budget leaves room, after the
 * trained units; then each is gathered once a step, not twice. The bits
 * do not change. */
static void test_frozen_units_resident(void **state)
{
    (void)state;
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.ranks = 4, co.zero_stage = 3;
    regc_compile_stats st;
    const int none = gathers_of(&co, &st);
    assert_int_equal(st.zero3_resident, 0);
    const int units = st.zero3_units;
    co.persistence_floats = INT64_C(1) << 40;
    const int all = gathers_of(&co, &st);
    assert_int_equal(st.zero3_resident, units);
    /* each unit once; without residency twice, but for the frozen
     * embedding, which no backward reads */
    assert_int_equal(all, units);
    assert_int_equal(none, 2 * units - 1);
    /* gathered on demand, a budget one byte short of every unit resident:
     * every trained unit resident, and some of the frozen ones, the
     * smallest first */
    co.prefetch_floats = 0;
    regc_train_options o = regc_test_train_options(2, 16, 1);
    regc_model *m = lora_model("llama-tiny", &o, 1, 0, 0);
    regc_program *p = NULL;
    assert_int_equal(regc_program_compile(m, 2, 16, &co, &p, NULL), REGC_OK);
    regc_device_memory most;
    regc_program_device_memory(p, &most);
    regc_program_free(p);
    co.persistence_floats = 0, co.budget_bytes = most.total - 1;
    assert_int_equal(regc_program_compile(m, 2, 16, &co, &p, &st), REGC_OK);
    const regc_shard_layout *fl = p->frozen_layout;
    int trained = 0, frozen = 0;
    for (int u = 0; u < p->layout->n_units; u++)
        trained += p->resident[u];
    for (int u = 0; u < fl->n_units; u++)
        frozen += p->frozen_resident[u];
    print_message("%d units: %d all-gathers, %d all persistent; under a budget %d of %d trained "
                  "and %d of %d frozen units resident\n",
                  units, none, all, trained, p->layout->n_units, frozen, fl->n_units);
    assert_int_equal(trained, p->layout->n_units);
    assert_true(frozen > 0 && frozen < fl->n_units);
    for (int u = 0; u < fl->n_units; u++) /* a resident unit is no larger than one that is not */
        for (int v = 0; v < fl->n_units; v++)
            assert_false(p->frozen_resident[u] && !p->frozen_resident[v] &&
                         fl->unit_padded[u] > fl->unit_padded[v]);
    regc_program_free(p);
    regc_model_free(m);
    /* bits: every unit persistent, at one rank, against none */
    o = regc_test_train_options(2, 16, STEPS);
    o.zero_stage = 3;
    regc_test_losses l0, l1;
    regc_model *a = train(lora_model("llama-tiny", &o, 1, 0, 0), &o, &l0);
    o.compile.persistence_floats = INT64_C(1) << 40;
    regc_model *b = train(lora_model("llama-tiny", &o, 1, 0, 0), &o, &l1);
    assert_same_adapters("NF4 at stage 3, every unit resident vs none", "llama-tiny", a, &l0, b,
                         &l1);
    regc_model_free(a), regc_model_free(b);
}

/* Every thread count sums every element in one order: the same bits. */
static void test_threads(void **state)
{
    (void)state;
    regc_test_losses l1, l3;
    regc_train_options o = regc_test_train_options(2, 16, STEPS);
    o.threads = 1;
    regc_model *a = train(lora_model("llama-tiny", &o, 1, 0, 0), &o, &l1);
    o.threads = 3;
    regc_model *b = train(lora_model("llama-tiny", &o, 1, 0, 0), &o, &l3);
    assert_same_adapters("NF4, 1 vs 3 threads", "llama-tiny", a, &l1, b, &l3);
    regc_model_free(a), regc_model_free(b);
}

/* The frozen block: every linear weight but the head's in NF4's bytes, the
 * rest in fp32, each 64-byte aligned; the compiled step's block the same. */
static void test_memory(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("llama-tiny", &m), REGC_OK);
    regc_lora_config c = {.r = 4, .target_modules = "q_proj,v_proj", .seed = 1, .load_in_4bit = 1};
    assert_int_equal(regc_model_add_lora(m, &c), REGC_OK);
    int64_t want = 0, nf4 = 0;
    for (int p = 0; p < regc_model_n_params(m); p++) {
        const int kind = regc_model_param_frozen(m, p);
        if (!kind)
            continue;
        const int64_t n = regc_model_param_numel(m, p);
        nf4 += kind == REGC_FROZEN_NF4;
        /* the linear layers: 2-D weights other than the embedding and the head */
        const char *name = regc_model_param_name(m, p);
        int64_t shape[8];
        const int linear = regc_model_param_shape(m, p, shape) == 2 && strstr(name, "layers.");
        assert_int_equal(kind, linear ? REGC_FROZEN_NF4 : 1);
        want += ((linear ? regc_frozen_kind_bytes(REGC_FROZEN_NF4, n) : 4 * n) + 63) & ~63;
    }
    assert_int_equal(nf4, 4 * 7); /* q, k, v, o, gate, up, down in each of 4 layers */
    assert_int_equal(regc_model_frozen_bytes(m), want);
    regc_compile_options co;
    regc_compile_options_default(&co);
    regc_program *p = NULL;
    if (regc_program_compile(m, 2, 16, &co, &p, NULL) != REGC_OK)
        fail_msg("%s", regc_error_message());
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    assert_int_equal(a.frozen, want);
    regc_program_free(p);
    regc_model_free(m);
}

/* ---------------------------------------------------------------- the command */

/* Resumed from a checkpoint == never stopped, with the base in NF4. */
static void test_resume(void **state)
{
    (void)state;
    regc_test_assert_adapter_resume(
        "qlora-resume", "--lora-r 4 --lora-target-modules all-linear --load-in-4bit on");
}

/* The quantization section in a config file gives the flags' bits. */
static void test_config_file(void **state)
{
    (void)state;
    char *tmp = regc_test_make_temp_dir("qlora-config"), args[3000], *out = NULL;
    assert_non_null(tmp);
    double want[4], got[4];
    if (regc_test_tiny_train(
            "--lora-r 4 --load-in-4bit on --bnb-4bit-compute-dtype bfloat16 --steps 3 --json",
            &out) != 0)
        fail_msg("%s", out);
    assert_int_equal(regc_test_json_losses(out, want, 4), 3);
    free(out);
    assert_int_equal(regc_test_write_text(tmp, "config.json",
                                          "{\"lora\": {\"r\": 4}, \"quantization\": "
                                          "{\"load_in_4bit\": true, \"bnb_4bit_quant_type\": "
                                          "\"nf4\", \"bnb_4bit_use_double_quant\": true, "
                                          "\"bnb_4bit_compute_dtype\": \"bfloat16\"}}"),
                     0);
    snprintf(args, sizeof args, "--config %s/config.json --steps 3 --json", tmp);
    if (regc_test_tiny_train(args, &out) != 0)
        fail_msg("%s", out);
    assert_int_equal(regc_test_json_losses(out, got, 4), 3);
    assert_memory_equal(want, got, 3 * sizeof *want);
    free(out);
    regc_test_remove_tree(tmp);
    free(tmp);
}

/* What regc does not apply is refused, by its key, in one line. */
static void test_refused(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"--lora-r 4 --bnb-4bit-quant-type fp4", "--bnb-4bit-quant-type: expected nf4"},
        {"--lora-r 4 --load-in-4bit on --bnb-4bit-use-double-quant off",
         "bnb_4bit_use_double_quant: false is not supported"},
        {"--lora-r 4 --bnb-4bit-compute-dtype bfloat16", "bnb_4bit_compute_dtype: the base is not"},
        {"--load-in-4bit on", "quantization.load_in_4bit: a frozen base in NF4 needs LoRA"},
    };
    /* bitsandbytes quantises a Conv1D weight transposed, which regc does not */
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    regc_lora_config c = {.r = 4, .target_modules = "c_attn", .load_in_4bit = 1};
    assert_int_equal(regc_model_add_lora(m, &c), REGC_ERR_UNSUPPORTED);
    assert_non_null(strstr(regc_error_message(), "c_attn.weight is a Conv1D weight"));
    regc_model_free(m);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        if (regc_test_tiny_train(cases[i][0], &out) == 0)
            fail_msg("%s: accepted", cases[i][0]);
        if (!strstr(out, cases[i][1]))
            fail_msg("%s: expected \"%s\", got:\n%s", cases[i][0], cases[i][1], out);
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_nf4_is_its_dequantised_base),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_frozen_units_resident),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    const char *path = REGC_SOURCE_DIR "/tests/data/lora_reference.json";
    char *text = regc_test_read_file(path, NULL);
    cJSON *ref = text ? cJSON_Parse(text) : NULL;
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(ref, "qlora_cases");
    struct CMUnitTest peft[8];
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach (c, cases)
        if (n < 8)
            peft[n++] = (struct CMUnitTest){
                cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, test_qlora_case,
                regc_test_train_case_setup, regc_test_train_case_teardown, (void *)c};
    if (n == 0) {
        fprintf(stderr, "%s: no qlora_cases\n", path);
        failed++;
    } else {
        failed += _cmocka_run_group_tests("qlora_cases", peft, (size_t)n, NULL, NULL);
    }
    cJSON_Delete(ref);
    free(text);
    return failed ? 1 : 0;
}
