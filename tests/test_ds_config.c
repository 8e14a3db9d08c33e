/* test_ds_config.c — the configs people already have, key by key: a
 * DeepSpeed ds_config.json and Transformers' TrainingArguments as JSON,
 * read through the one option table.
 *
 * DeepSpeed's three schedulers against tools/reference/
 * ds_schedule_reference.py's rates (DeepSpeed's own formulas, checked
 * there against its lr_schedules.py), through the library and through
 * `regc train`, and a run under one resumed from a checkpoint bit for bit;
 * every key DeepSpeed documents under zero_optimization and compile has a
 * row, and every value a row refuses is refused with its line; DeepSpeed's
 * batch rule; "auto"; contradictions between spellings and between files.
 * Whole configs trained as they are, and --print-config, are
 * test_ds_config_train.c's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "options.h"
#include "regc_train.h"
#include "test_util.h"

#define DATA REGC_SOURCE_DIR "/tests/data/"

static int setup(void **state) { return regc_test_dir_setup(state, "dsconfig", "cfg.json"); }

static void write_config(const regc_test_dir *f, const char *text)
{
    assert_int_equal(regc_test_write_file(f->path, text, strlen(text)), 0);
}

/* The text parsed as a file named `name`, which must load. */
static regc_config *parse_ok(const char *text, const char *name)
{
    regc_config *c = NULL;
    if (regc_config_parse(text, strlen(text), name, &c) != REGC_OK)
        fail_msg("%s did not load: %s\n%s", name, regc_error_message(), text);
    return c;
}

/* The text must be refused with one line holding `a` and `b` (b may be NULL). */
static void parse_refused(const char *text, const char *a, const char *b)
{
    regc_config *c = (regc_config *)&c;
    regc_error_clear();
    if (regc_config_parse(text, strlen(text), "ds.json", &c) >= 0)
        fail_msg("loaded: %s", text);
    assert_null(c);
    regc_test_expect_error(a, b);
}

/* Settings from the files' texts in order, resolved for `ranks`. */
static int settings_of(const char *const *texts, int ranks, regc_train_settings *s)
{
    regc_origins *from = regc_origins_new();
    regc_config *c[4] = {NULL};
    int rc = REGC_OK, n = 0;
    regc_train_settings_default(s);
    for (; texts[n] && rc == REGC_OK; n++) {
        char name[32];
        snprintf(name, sizeof name, "f%d.json", n);
        if ((rc = regc_config_parse(texts[n], strlen(texts[n]), name, &c[n])) == REGC_OK)
            rc = regc_config_apply_from(c[n], s, from);
    }
    if (rc == REGC_OK)
        rc = regc_settings_resolve(s, from, ranks, NULL);
    /* the strings were the configs': the callers read numbers only */
    for (int k = 0; k < regc_option_count; k++)
        if (regc_option_table[k].type == OPT_STRING || regc_option_table[k].type == OPT_BACKEND)
            *(char **)regc_option_field(&regc_option_table[k], s) = NULL;
    for (int i = 0; i < n; i++)
        regc_config_free(c[i]);
    regc_origins_free(from);
    return rc;
}

/* ---- DeepSpeed's schedulers ------------------------------------------------ */

static cJSON *load_reference(void)
{
    char *text = regc_test_read_file(DATA "ds_schedule_reference.json", NULL);
    assert_non_null(text);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    return ref;
}

/* A reference case as the ds_config.json DeepSpeed would have read. */
static char *case_config(const cJSON *c)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *opt = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddStringToObject(opt, "type", "AdamW");
    cJSON *params = cJSON_AddObjectToObject(opt, "params");
    cJSON_AddNumberToObject(params, "lr",
                            cJSON_GetObjectItemCaseSensitive(c, "optimizer_lr")->valuedouble);
    cJSON_AddItemToObject(root, "scheduler",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "scheduler"), 1));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* |got - want| within rel of want (an exact 0 within 1e-12). */
static void assert_rate(const char *name, int step, double got, double want, double rel)
{
    const double tol = want == 0.0 ? 1e-12 : rel * fabs(want);
    if (!(fabs(got - want) <= tol))
        fail_msg("%s step %d: lr %.17g, DeepSpeed's %.17g (tolerance %g)", name, step, got, want,
                 tol);
}

/* The file, read and resolved, gives each step DeepSpeed's rate: exactly
 * the reference's formula over a float32 peak (regc's train.lr), and
 * within 1e-7 of DeepSpeed's own rate over the decimal. */
static void test_schedulers_match_deepspeed(void **state)
{
    (void)state;
    cJSON *ref = load_reference(), *c;
    int cases = 0;
    cJSON_ArrayForEach (c, cJSON_GetObjectItemCaseSensitive(ref, "cases")) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const int steps = cJSON_GetObjectItemCaseSensitive(c, "steps")->valueint;
        char *text = case_config(c);
        regc_train_settings s;
        const char *texts[] = {text, NULL};
        if (settings_of(texts, 1, &s) != REGC_OK)
            fail_msg("%s: %s", name, regc_error_message());
        s.train.steps = steps;
        assert_true(regc_train_schedule_is_deepspeed(s.train.lr_scheduler));
        assert_int_equal(regc_train_check_options(&s.train), REGC_OK);
        const cJSON *lr = cJSON_GetObjectItemCaseSensitive(c, "lr");
        const cJSON *lr32 = cJSON_GetObjectItemCaseSensitive(c, "lr_float32_peak");
        assert_int_equal(cJSON_GetArraySize(lr), steps);
        for (int k = 0; k < steps; k++) {
            const double got = regc_train_ds_lr(&s.train, k);
            assert_rate(name, k, got, cJSON_GetArrayItem(lr32, k)->valuedouble, 1e-15);
            assert_rate(name, k, got, cJSON_GetArrayItem(lr, k)->valuedouble, 1e-7);
        }
        free(text);
        cases++;
    }
    assert_true(cases >= 9);
    cJSON_Delete(ref);
}

/* The rate of each step `regc train --json` reports. */
static int json_rates(const char *out, double *lr, int max)
{
    int n = 0;
    for (const char *line = out; *line;) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        cJSON *o = cJSON_ParseWithLength(line, (size_t)(nl - line));
        assert_non_null(o);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "lr");
        if (cJSON_IsNumber(l) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "loss"))) {
            assert_true(n < max);
            lr[n++] = l->valuedouble;
        }
        cJSON_Delete(o);
        line = nl + 1;
    }
    return n;
}

/* The same through `regc train --deepspeed FILE`, for the first case of
 * each scheduler: the rate each step's update ran at, as the step reports
 * it (9 significant digits). */
static void test_schedulers_train(void **state)
{
    regc_test_dir *f = *state;
    cJSON *ref = load_reference(), *c;
    const char *last = "";
    cJSON_ArrayForEach (c, cJSON_GetObjectItemCaseSensitive(ref, "cases")) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const char *type = cJSON_GetObjectItemCaseSensitive(
                               cJSON_GetObjectItemCaseSensitive(c, "scheduler"), "type")
                               ->valuestring;
        if (!strcmp(type, last))
            continue;
        last = type;
        const int steps = cJSON_GetObjectItemCaseSensitive(c, "steps")->valueint;
        char *text = case_config(c), n[32];
        write_config(f, text);
        free(text);
        snprintf(n, sizeof n, "%d", steps);
        regc_test_proc p;
        if (regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                               "--steps", n, "--batch", "1", "--seq", "8", "--json", NULL) != 0)
            fail_msg("%s: regc train failed:\n%s", name, p.err);
        double lr[64];
        assert_int_equal(json_rates(p.out, lr, 64), steps);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "lr");
        for (int k = 0; k < steps; k++)
            assert_rate(name, k, lr[k], cJSON_GetArrayItem(want, k)->valuedouble, 1e-7);
        regc_test_proc_free(&p);
    }
    cJSON_Delete(ref);
}

/* A DeepSpeed scheduler's parameters a file leaves out are DeepSpeed's
 * defaults (1000 warmup steps; WarmupDecayLR's peak 0.001); the same
 * option in another spelling that DeepSpeed would not use is refused. */
static void test_scheduler_defaults(void **state)
{
    (void)state;
    regc_train_settings s;
    const char *decay[] = {"{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                           "{\"total_num_steps\": 2000}}}",
                           NULL};
    assert_int_equal(settings_of(decay, 1, &s), REGC_OK);
    assert_int_equal(s.train.warmup_steps, 1000);
    assert_true(s.train.lr == 0.001f);
    assert_int_equal(s.train.lr_scheduler, REGC_SCHEDULE_WARMUP_DECAY_LR);
    /* WarmupLR's peak is the optimizer's */
    const char *warm[] = {"{\"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.02}},"
                          " \"scheduler\": {\"type\": \"WarmupLR\"}}",
                          NULL};
    assert_int_equal(settings_of(warm, 1, &s), REGC_OK);
    assert_true(s.train.lr == 0.02f);
    assert_int_equal(s.train.warmup_steps, 1000);

    parse_refused("{\"optimizer\": {\"params\": {\"lr\": 0.02}}, \"scheduler\": {\"type\": "
                  "\"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 5}}}",
                  "ds.json: scheduler.params.warmup_max_lr: left out, so DeepSpeed's "
                  "WarmupDecayLR would take its default 0.001, not optimizer.params.lr's 0.02",
                  "\"auto\"");
    parse_refused("{\"warmup_ratio\": 0.1, \"scheduler\": {\"type\": \"WarmupLR\"}}",
                  "scheduler.params.warmup_num_steps: left out", "warmup_ratio's 0.1");
    /* "auto" is regc's own value: its warmup, the run's steps */
    const char *auto_[] = {"{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                           "{\"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}},"
                           " \"warmup_steps\": 3, \"max_steps\": 9}",
                           NULL};
    assert_int_equal(settings_of(auto_, 1, &s), REGC_OK);
    assert_int_equal(s.train.warmup_steps, 3);
    assert_int_equal(s.train.total_num_steps, 0);
    assert_int_equal(s.train.steps, 9);

    /* a parameter its scheduler does not take, as DeepSpeed's constructor refuses it */
    const char *extra[] = {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                           "{\"total_num_steps\": 10, \"warmup_num_steps\": 2}}}",
                           NULL};
    assert_int_equal(settings_of(extra, 1, &s), REGC_OK);
    assert_int_equal(regc_train_check_options(&s.train), REGC_ERR_ARG);
    regc_test_expect_error("scheduler.params.total_num_steps", "WarmupLR does not take it");
    const char *ratio[] = {"{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                           "{\"cos_min_ratio\": 0.1, \"warmup_num_steps\": 2, "
                           "\"warmup_max_lr\": 0.001}}}",
                           NULL};
    assert_int_equal(settings_of(ratio, 1, &s), REGC_OK);
    assert_int_equal(regc_train_check_options(&s.train), REGC_ERR_ARG);
    regc_test_expect_error("scheduler.params.cos_min_ratio", "WarmupDecayLR does not take it");
    const char *other[] = {"{\"scheduler\": {\"type\": \"OneCycle\"}}", NULL};
    assert_true(settings_of(other, 1, &s) < 0);
    regc_test_expect_error("f0.json: scheduler.type: expected \"constant\"", "got \"OneCycle\"");
}

/* A run under a DeepSpeed schedule resumed from a checkpoint goes on as if
 * it had never stopped: the same rates and losses, bit for bit. */
static void test_resume_deepspeed_schedule(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},"
                    " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\":"
                    " {\"warmup_num_steps\": 2, \"warmup_min_ratio\": 0.1}}}");
    char *out = regc_test_join(f->dir, "out"), *ck = regc_test_join(out, "checkpoint-2");
    regc_test_proc p;
    double whole[8], lr_whole[8], rest[8], lr_rest[8];
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--steps", "5", "--batch", "1", "--seq", "8",
                                        "--output-dir", out, "--save-steps", "2", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, whole, 8), 5);
    assert_int_equal(json_rates(p.out, lr_whole, 8), 5);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--steps", "5", "--batch", "1", "--seq", "8",
                                        "--resume-from-checkpoint", ck, "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, rest, 8), 3);
    assert_int_equal(json_rates(p.out, lr_rest, 8), 3);
    regc_test_proc_free(&p);
    for (int k = 0; k < 3; k++) {
        assert_true(rest[k] == whole[k + 2]);
        assert_true(lr_rest[k] == lr_whole[k + 2]);
    }
    /* another scheduler parameter is another run: refused by its key */
    write_config(f, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},"
                    " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\":"
                    " {\"warmup_num_steps\": 2, \"warmup_min_ratio\": 0.2}}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--steps", "5", "--batch", "1", "--seq", "8",
                                        "--resume-from-checkpoint", ck, NULL),
                     1);
    assert_non_null(strstr(p.err, "train.warmup_min_ratio is 0.10000000000000001 in the "
                                  "checkpoint, 0.20000000000000001 now"));
    regc_test_proc_free(&p);
    free(out), free(ck);
}

/* ---- every documented key ---------------------------------------------------- */

/* DeepSpeed's keys under zero_optimization (deepspeed/runtime/zero/
 * config.py and offload_config.py, docs/_pages/config-json.md) and
 * DeepCompile's under compile (deepspeed/compile/config.py), written out
 * here rather than read from the table. */
static const char *const documented[] = {
    "zero_optimization.stage",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_scatter",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.allgather_partitions",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.overlap_comm",
    "zero_optimization.load_from_fp32_weights",
    "zero_optimization.elastic_checkpoint",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.offload_param.pin_memory",
    "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size",
    "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_optimizer.buffer_count",
    "zero_optimization.offload_optimizer.pipeline_read",
    "zero_optimization.offload_optimizer.pipeline_write",
    "zero_optimization.offload_optimizer.fast_init",
    "zero_optimization.offload_optimizer.ratio",
    "zero_optimization.offload_optimizer.super_offload",
    "zero_optimization.offload_optimizer.cpuadam_cores_perc",
    "zero_optimization.zenflow",
    "zero_optimization.sub_group_size",
    "zero_optimization.cpu_offload_param",
    "zero_optimization.cpu_offload_use_pin_memory",
    "zero_optimization.cpu_offload",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params",
    "zero_optimization.stage3_allgather_sequential",
    "zero_optimization.ignore_unused_parameters",
    "zero_optimization.legacy_stage1",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.grad_hooks",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_optimization.zero_quantized_gradients",
    "zero_optimization.zeropp_loco_param",
    "zero_optimization.mics_shard_size",
    "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.memory_efficient_linear",
    "zero_optimization.pipeline_loading_checkpoint",
    "zero_optimization.override_module_apply",
    "zero_optimization.log_trace_cache_warnings",
    "zero_optimization.enable_sanity_checks",
    "zero_optimization.save_muon_momentum_buffer_in_memory",
    "zero_optimization.leaf_module",
    "compile.deepcompile",
    "compile.offload_activation",
    "compile.offload_opt_states",
    "compile.double_buffer",
    "compile.symmetric_memory",
    "compile.free_activation",
    "compile.dump_graphs",
    "compile.free_activation_threshold",
    "compile.offload_activation_pin_memory",
    "compile.debug_log",
    "compile.offload_parameters",
    "compile.sync_before_reduce",
    "compile.sync_after_reduce",
    "compile.sync_before_allgather",
    "compile.sync_after_allgather",
    "compile.keep_int_input_tensors",
    "compile.keep_all_input_tensors",
    "compile.passes",
};

static void test_every_documented_key_has_a_row(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof documented / sizeof *documented; i++) {
        int alias;
        if (!regc_option_by_path(documented[i], &alias))
            fail_msg("%s has no row in train/options.c", documented[i]);
    }
}

/* {"a": {"b": VALUE}} for the path "a.b". */
static void nested(char *buf, size_t cap, const char *path, const char *value)
{
    size_t n = 0;
    int depth = 0;
    for (const char *p = path; *p; depth++) {
        size_t len = strcspn(p, ".");
        n += (size_t)snprintf(buf + n, cap - n, "{\"%.*s\": ", (int)len, p);
        p += len + (p[len] == '.');
    }
    n += (size_t)snprintf(buf + n, cap - n, "%s", value);
    while (depth--)
        n += (size_t)snprintf(buf + n, cap - n, "}");
}

/* Every value a row refuses is refused with its line: the file, the key,
 * the value and the reason; each value it takes loads and sets nothing. */
static void test_refused_values_name_key_and_reason(void **state)
{
    (void)state;
    static const char *const candidates[] = {"true", "false", "7", "0.25", "\"x\"", "{}"};
    int refused = 0;
    for (int k = 0; k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        if (o->type != OPT_NEUTRAL)
            continue;
        char path[256], text[512], want[512];
        snprintf(path, sizeof path, "%s%s%s", o->section, o->section[0] ? "." : "", o->key);
        cJSON *ok = cJSON_Parse(o->values);
        assert_non_null(ok);
        const cJSON *v;
        cJSON_ArrayForEach (v, ok) { /* each neutral value loads */
            char *vt = cJSON_PrintUnformatted(v);
            nested(text, sizeof text, path, vt);
            regc_config_free(parse_ok(text, "ds.json"));
            free(vt);
        }
        const char *off = NULL;
        for (size_t c = 0; !off && c < sizeof candidates / sizeof *candidates; c++) {
            cJSON *x = cJSON_Parse(candidates[c]);
            int neutral = 0;
            cJSON_ArrayForEach (v, ok)
                neutral |= cJSON_Compare(v, x, 1);
            cJSON_Delete(x);
            off = neutral ? NULL : candidates[c];
        }
        cJSON_Delete(ok);
        assert_non_null(off);
        nested(text, sizeof text, path, off);
        snprintf(want, sizeof want, "ds.json: %s: %s is not supported: %s", path,
                 !strcmp(off, "{}") ? "an object" : off, o->help);
        parse_refused(text, want, NULL);
        refused++;
    }
    assert_true(refused >= 30);

    /* refused by the values a key may take, or by what follows from them */
    parse_refused("{\"fp16\": {\"enabled\": true}}", "ds.json: fp16.enabled: true is not supported",
                  "no loss scaling");
    parse_refused("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
                  "zero_optimization.offload_optimizer.device: expected \"none\" or \"cpu\"",
                  "got \"nvme\"");
    parse_refused("{\"optimizer\": {\"type\": \"Lamb\"}}",
                  "ds.json: optimizer.type: expected \"AdamW\" or \"Adam\"", "got \"Lamb\"");
    parse_refused("{\"compile\": {\"passes\": [\"z3\"]}}", "compile.passes: no pass named \"z3\"",
                  NULL);
    parse_refused("{\"optimizer\": {\"params\": {\"betas\": [0.9, 1]}}}",
                  "ds.json: optimizer.params.betas: expected [beta1, beta2]", NULL);
    regc_train_settings s;
    const char *l2[] = {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": "
                        "false, \"weight_decay\": 0.01}}}",
                        NULL};
    assert_int_equal(settings_of(l2, 1, &s), REGC_ERR_UNSUPPORTED);
    regc_test_expect_error("f0.json: optimizer.params.adam_w_mode: false makes Adam add "
                           "weight_decay 0.01 to the gradient",
                           NULL);
    /* Adam without decay is AdamW; DeepSpeed's AdamW ignores adam_w_mode */
    const char *plain[] = {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": "
                           "false}}}",
                           NULL};
    assert_int_equal(settings_of(plain, 1, &s), REGC_OK);
}

/* Keys that change nothing load whatever their value of the kind they take. */
static void test_inert_keys_load(void **state)
{
    (void)state;
    regc_config *c = parse_ok(
        "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 200000000, \"overlap_comm\": "
        "true, \"contiguous_gradients\": false, \"stage3_max_reuse_distance\": 1e9, "
        "\"offload_param\": {\"device\": \"none\", \"pin_memory\": true}, \"zenflow\": null, "
        "\"leaf_module\": {\"classes\": []}}, \"compile\": {\"deepcompile\": true, "
        "\"free_activation\": true, \"double_buffer\": false, \"symmetric_memory\": false, "
        "\"dump_graphs\": false, \"offload_activation\": false}, \"tensorboard\": {\"enabled\": "
        "false}, \"activation_checkpointing\": {\"partition_activations\": true}, "
        "\"amp\": {\"enabled\": \"auto\", \"opt_level\": \"auto\"}, \"report_to\": [\"wandb\"], "
        "\"lr_scheduler_kwargs\": null, \"fsdp\": \"\"}",
        "ds.json");
    regc_train_settings s, d;
    regc_train_settings_default(&s);
    regc_train_settings_default(&d);
    regc_config_apply(c, &s);
    assert_int_equal(s.train.zero_stage, 3);
    s.train.zero_stage = 0;
    assert_int_equal(s.train.compile.deepcompile, d.train.compile.deepcompile);
    assert_null(s.train.compile.dump_dir);
    regc_config_free(c);
    parse_refused("{\"zero_optimization\": {\"overlap_comm\": \"yes\"}}",
                  "ds.json: zero_optimization.overlap_comm: expected bool/null", "got \"yes\"");
    parse_refused("{\"zero_optimization\": {\"sub_group_size\": true}}",
                  "zero_optimization.sub_group_size: expected number", NULL);
    parse_refused("{\"zero_optimization\": {\"sub_group_sizes\": 1}}",
                  "ds.json: zero_optimization.sub_group_sizes: unknown key", NULL);
    parse_refused("{\"steps_per_prnt\": 1}", "ds.json: steps_per_prnt: unknown key",
                  "TrainingArguments");
    parse_refused("{\"fp16\": 3}", "ds.json: fp16: 3 is not supported", NULL);
}

/* ---- DeepSpeed's spellings onto regc's options ------------------------------- */

static void test_spellings_and_auto(void **state)
{
    (void)state;
    regc_train_settings s;
    const char *ds[] = {"{\"train_micro_batch_size_per_gpu\": 3, \"gradient_accumulation_steps\":"
                        " 2, \"gradient_clipping\": 0.5, \"bf16\": {\"enabled\": true},"
                        " \"fp16\": {\"enabled\": false}, \"optimizer\": {\"type\": \"AdamW\","
                        " \"params\": {\"lr\": 2e-4, \"betas\": [0.8, 0.95], \"eps\": 1e-6,"
                        " \"weight_decay\": 0.05}}, \"zero_optimization\": {\"stage\": 3,"
                        " \"offload_optimizer\": {\"device\": \"cpu\"}, \"reduce_bucket_size\":"
                        " 5e8, \"stage3_prefetch_bucket_size\": 1000},"
                        " \"compile\": {\"dump_graphs\": true, \"offload_activation\": true}}",
                        NULL};
    assert_int_equal(settings_of(ds, 2, &s), REGC_OK);
    assert_int_equal(s.train.batch, 3);
    assert_int_equal(s.train.grad_accum, 2);
    assert_int_equal(s.train_batch_size, 12); /* derived: 3 x 2 x 2 ranks */
    assert_true(s.train.max_grad_norm == 0.5);
    assert_int_equal(s.train.compile.precision, 1);
    assert_true(s.train.lr == 2e-4f && s.train.weight_decay == 0.05f);
    assert_true(s.train.beta1 == 0.8f && s.train.beta2 == 0.95f && s.train.eps == 1e-6f);
    assert_int_equal(s.train.zero_stage, 3);
    assert_int_equal(s.train.compile.offload_optimizer, 1);
    assert_true(s.train.compile.reduce_bucket_floats == 500000000);
    assert_true(s.train.compile.prefetch_floats == 1000);
    assert_int_equal(s.train.compile.offload_activation, 1);
    /* dump_graphs true: the default directory (its string belonged to the config) */
    regc_config *c = parse_ok("{\"compile\": {\"dump_graphs\": true}}", "ds.json");
    regc_train_settings_default(&s);
    regc_config_apply(c, &s);
    assert_string_equal(s.train.compile.dump_dir, "regc-graphs");
    regc_config_free(c);

    /* "auto" wherever Transformers fills one in: regc's own value */
    regc_train_settings d;
    regc_train_settings_default(&d);
    const char *autos[] = {"{\"train_micro_batch_size_per_gpu\": \"auto\", \"train_batch_size\":"
                           " \"auto\", \"gradient_accumulation_steps\": \"auto\","
                           " \"gradient_clipping\": \"auto\", \"bf16\": {\"enabled\": \"auto\"},"
                           " \"fp16\": {\"enabled\": \"auto\"}, \"optimizer\": {\"params\":"
                           " {\"lr\": \"auto\", \"betas\": \"auto\", \"eps\": \"auto\","
                           " \"weight_decay\": \"auto\"}}, \"zero_optimization\":"
                           " {\"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\":"
                           " \"auto\", \"stage3_param_persistence_threshold\": \"auto\"}}",
                           NULL};
    assert_int_equal(settings_of(autos, 1, &s), REGC_OK);
    assert_true(s.train.batch == d.train.batch && s.train.lr == d.train.lr &&
                s.train.beta1 == d.train.beta1 && s.train.eps == d.train.eps &&
                s.train.compile.precision == d.train.compile.precision &&
                s.train.compile.reduce_bucket_floats == d.train.compile.reduce_bucket_floats &&
                s.train.compile.prefetch_floats == d.train.compile.prefetch_floats);
    /* where Transformers does not fill it in, "auto" is a wrong value */
    parse_refused("{\"zero_optimization\": {\"stage\": \"auto\"}}",
                  "ds.json: zero_optimization.stage: expected an integer from 0 to 3",
                  "got \"auto\"");
    parse_refused("{\"max_steps\": \"auto\"}", "ds.json: max_steps: expected an integer >= 1",
                  NULL);

    /* Transformers 5's warmup_steps below 1: a fraction of the steps */
    const char *frac[] = {"{\"warmup_steps\": 0.25, \"max_steps\": 10}", NULL};
    assert_int_equal(settings_of(frac, 1, &s), REGC_OK);
    assert_true(s.train.warmup_ratio == 0.25 && s.train.warmup_steps == 0);
    assert_int_equal(regc_train_warmup_steps(&s.train), 3);
    parse_refused("{\"warmup_steps\": 1.5}", "ds.json: warmup_steps: expected an integer >= 0",
                  "got 1.5");

    /* two spellings of one option in one file must agree */
    parse_refused("{\"learning_rate\": 1e-4, \"optimizer\": {\"params\": {\"lr\": 2e-4}}}",
                  "ds.json: optimizer.params.lr: 0.0002 contradicts learning_rate: 0.0001", NULL);
    regc_config_free(parse_ok("{\"learning_rate\": 1e-4, \"optimizer\": {\"params\": {\"lr\": "
                              "1e-4}}, \"train\": {\"lr\": 0.0001}}",
                              "ds.json"));
    /* Transformers' inline "deepspeed" object is read in place */
    parse_refused("{\"gradient_accumulation_steps\": 2, \"deepspeed\": "
                  "{\"gradient_accumulation_steps\": 4}}",
                  "ds.json: deepspeed.gradient_accumulation_steps: 4 contradicts "
                  "gradient_accumulation_steps: 2",
                  NULL);
    parse_refused("{\"deepspeed\": {\"deepspeed\": {}}}",
                  "ds.json: deepspeed.deepspeed: a DeepSpeed config inside another", NULL);
}

/* DeepSpeed's rule: train_batch_size = micro-batch x accumulation x ranks,
 * any two giving the third. */
static void test_batch_rule(void **state)
{
    (void)state;
    regc_train_settings s;
    const char *tm[] = {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4}", NULL};
    assert_int_equal(settings_of(tm, 2, &s), REGC_OK);
    assert_int_equal(s.train.grad_accum, 4);
    const char *tg[] = {"{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 2}", NULL};
    assert_int_equal(settings_of(tg, 4, &s), REGC_OK);
    assert_int_equal(s.train.batch, 4);
    const char *t[] = {"{\"train_batch_size\": 6}", NULL};
    assert_int_equal(settings_of(t, 3, &s), REGC_OK);
    assert_int_equal(s.train.batch, 2);
    assert_int_equal(s.train.grad_accum, 1);
    const char *all[] = {"{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 4,"
                         " \"gradient_accumulation_steps\": 2}",
                         NULL};
    assert_int_equal(settings_of(all, 2, &s), REGC_OK);
    assert_int_equal(settings_of(all, 1, &s), REGC_ERR_ARG);
    regc_test_expect_error("f0.json: train_batch_size: 16 is not f0.json: "
                           "train_micro_batch_size_per_gpu 4 x f0.json: "
                           "gradient_accumulation_steps 2 x 1 ranks (8)",
                           NULL);
    const char *odd[] = {"{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 3}", NULL};
    assert_int_equal(settings_of(odd, 1, &s), REGC_ERR_ARG);
    regc_test_expect_error("f0.json: train_batch_size: 10 is not a multiple of", "3 x 1 ranks");
}

/* A value two files give must agree (Transformers' mismatch check); a
 * DeepSpeed scheduler replaces lr_scheduler_type, as the Trainer makes none. */
static void test_two_files(void **state)
{
    (void)state;
    regc_train_settings s;
    const char *clash[] = {"{\"learning_rate\": 1e-4}",
                           "{\"optimizer\": {\"params\": {\"lr\": 3e-4}}}", NULL};
    assert_int_equal(settings_of(clash, 1, &s), REGC_ERR_FORMAT);
    regc_test_expect_error("f1.json: optimizer.params.lr: 0.0003 contradicts f0.json: "
                           "learning_rate: 0.0001",
                           NULL);
    const char *betas[] = {"{\"adam_beta2\": 0.98}",
                           "{\"optimizer\": {\"params\": {\"betas\": [0.9, 0.95]}}}", NULL};
    assert_int_equal(settings_of(betas, 1, &s), REGC_ERR_FORMAT);
    regc_test_expect_error("f1.json: optimizer.params.betas: [0.9, 0.95] contradicts f0.json: "
                           "adam_beta2: 0.98",
                           NULL);
    const char *agree[] = {"{\"learning_rate\": 1e-4, \"lr_scheduler_type\": \"cosine\","
                           " \"warmup_steps\": 4}",
                           "{\"optimizer\": {\"params\": {\"lr\": \"auto\"}}, \"scheduler\":"
                           " {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 4}}}",
                           NULL};
    assert_int_equal(settings_of(agree, 1, &s), REGC_OK);
    assert_int_equal(s.train.lr_scheduler, REGC_SCHEDULE_WARMUP_LR);
    assert_true(s.train.lr == 1e-4f);
}

/* Transformers' weight_decay brings its Trainer's groups (biases and norm
 * weights undecayed) unless a DeepSpeed optimizer section makes the
 * optimizer, which decays all; regc's own spelling, and a value given,
 * decide for themselves. */
static void test_weight_decay_groups_follow_the_optimizer(void **state)
{
    (void)state;
    regc_train_settings s;
    const char *trainer[] = {"{\"weight_decay\": 0.1}", NULL};
    assert_int_equal(settings_of(trainer, 1, &s), REGC_OK);
    assert_int_equal(s.train.weight_decay_params, REGC_DECAY_NOT_BIAS_NORM);
    const char *own[] = {"{\"train\": {\"weight_decay\": 0.1}}", NULL};
    assert_int_equal(settings_of(own, 1, &s), REGC_OK);
    assert_int_equal(s.train.weight_decay_params, REGC_DECAY_ALL);
    const char *deepspeed[] = {"{\"weight_decay\": 0.1}",
                               "{\"optimizer\": {\"type\": \"AdamW\", \"params\":"
                               " {\"weight_decay\": \"auto\"}}}",
                               NULL};
    assert_int_equal(settings_of(deepspeed, 1, &s), REGC_OK);
    assert_int_equal(s.train.weight_decay_params, REGC_DECAY_ALL);
    assert_true(s.train.weight_decay == 0.1f);
    const char *given[] = {"{\"weight_decay\": 0.1}",
                           "{\"train\": {\"weight_decay_params\": \"all\"}}", NULL};
    assert_int_equal(settings_of(given, 1, &s), REGC_OK);
    assert_int_equal(s.train.weight_decay_params, REGC_DECAY_ALL);
    const char *chosen[] = {"{\"train\": {\"weight_decay_params\": \"not_bias_norm\"}}", NULL};
    assert_int_equal(settings_of(chosen, 1, &s), REGC_OK);
    assert_int_equal(s.train.weight_decay_params, REGC_DECAY_NOT_BIAS_NORM);
    parse_refused("{\"train\": {\"weight_decay_params\": \"norms\"}}",
                  "ds.json: train.weight_decay_params:", "\"norms\"");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedulers_match_deepspeed),
        regc_test_in_dir(test_schedulers_train, setup),
        cmocka_unit_test(test_scheduler_defaults),
        regc_test_in_dir(test_resume_deepspeed_schedule, setup),
        cmocka_unit_test(test_every_documented_key_has_a_row),
        cmocka_unit_test(test_refused_values_name_key_and_reason),
        cmocka_unit_test(test_inert_keys_load),
        cmocka_unit_test(test_spellings_and_auto),
        cmocka_unit_test(test_batch_rule),
        cmocka_unit_test(test_two_files),
        cmocka_unit_test(test_weight_decay_groups_follow_the_optimizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
