/* test_config.c — the training config file: every key reaching
 * regc_train_options, defaults surviving a partial file, every error
 * naming the file and the key, and `regc train --config` with flags
 * overriding the file. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "options.h"
#include "regc_train.h"
#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "config", "cfg.json"); }

static void write_config(const regc_test_dir *f, const char *text)
{
    assert_int_equal(regc_test_write_file(f->path, text, strlen(text)), 0);
}

/* Load f->path, which must succeed. */
static regc_config *load_ok(const regc_test_dir *f)
{
    regc_config *c = NULL;
    int rc = regc_config_load(f->path, &c);
    if (rc != REGC_OK)
        fail_msg("load failed: %s", regc_error_message());
    assert_non_null(c);
    return c;
}

/* The file over options o: the library's part of the settings. */
static void apply_options(const regc_config *c, regc_train_options *o)
{
    regc_train_settings s;
    regc_train_settings_default(&s);
    s.train = *o;
    regc_config_apply(c, &s);
    *o = s.train;
}

/* Field by field: padding bytes are not part of the options. */
static void assert_str_same(const char *a, const char *b)
{
    if (a != b && (!a || !b || strcmp(a, b) != 0))
        fail_msg("\"%s\" != \"%s\"", a ? a : "(null)", b ? b : "(null)");
}

static void assert_options_equal(const regc_train_options *a, const regc_train_options *b)
{
    assert_str_same(a->data_path, b->data_path);
    assert_str_same(a->save_dir, b->save_dir);
    assert_str_same(a->backend, b->backend);
    assert_str_same(a->compile.dump_dir, b->compile.dump_dir);
    assert_true(a->batch == b->batch && a->seq == b->seq && a->steps == b->steps);
    assert_true(a->lr == b->lr && a->weight_decay == b->weight_decay);
    assert_true(a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps);
    assert_true(a->seed == b->seed && a->threads == b->threads);
    assert_int_equal(a->compile.regional, b->compile.regional);
    assert_int_equal(a->compile.level, b->compile.level);
    assert_int_equal(a->compile.inline_back, b->compile.inline_back);
    assert_str_same(a->cache_dir, b->cache_dir);
    assert_true(a->cache_max_bytes == b->cache_max_bytes);
}

static void test_full_file(void **state)
{
    regc_test_dir *f = *state;
    write_config(f,
                 "{\"compile\": {\"use_regional_compilation\": false, \"level\": \"O2\",\n"
                 "             \"backend\": \"cuda\", \"dump_graphs\": \"graphs\",\n"
                 "             \"inline_back\": false, \"cache_dir\": \"cc\",\n"
                 "             \"cache_max_mb\": 3},\n"
                 " \"train\": {\"model\": \"gpt2-tiny\", \"weights\": \"w.safetensors\",\n"
                 "           \"data\": \"tokens.bin\", \"steps\": 7, \"batch\": 3, \"seq\": 17,\n"
                 "           \"lr\": 0.00125, \"weight_decay\": 0.05,\n"
                 "           \"seed\": 9007199254740991, \"threads\": 3, \"save\": \"out\",\n"
                 "           \"json\": true}}\n");
    regc_config *c = load_ok(f);
    regc_train_options o;
    regc_train_options_default(&o);
    apply_options(c, &o);

    assert_int_equal(o.compile.regional, 0);
    assert_int_equal(o.compile.level, REGC_LEVEL_O2);
    assert_int_equal(o.compile.inline_back, 0);
    assert_string_equal(o.compile.dump_dir, "graphs");
    assert_string_equal(o.cache_dir, "cc");
    assert_true(o.cache_max_bytes == 3 << 20);
    assert_string_equal(o.backend, "cuda");
    assert_string_equal(o.data_path, "tokens.bin");
    assert_string_equal(o.save_dir, "out");
    assert_int_equal(o.steps, 7);
    assert_int_equal(o.batch, 3);
    assert_int_equal(o.seq, 17);
    assert_true(o.lr == 0.00125f);
    assert_true(o.weight_decay == 0.05f);
    /* 2^53 - 1, the largest seed a JSON number carries exactly */
    assert_true(o.seed == UINT64_C(9007199254740991));
    assert_int_equal(o.threads, 3);
    assert_string_equal(regc_config_model(c), "gpt2-tiny");
    assert_string_equal(regc_config_weights(c), "w.safetensors");
    assert_int_equal(regc_config_json(c), 1);

    /* Not config keys: the optimizer's constants stay as they were. */
    regc_train_options d;
    regc_train_options_default(&d);
    assert_true(o.beta1 == d.beta1 && o.beta2 == d.beta2 && o.eps == d.eps);
    regc_config_free(c);
}

/* compile.passes and compile.schedule from the file and as text, and
 * zero_optimization.offload_optimizer, a section inside a section. */
static void test_passes_schedule_offload(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, "{\"compile\": {\"passes\": [[\"selective_gather\", 64], \"prefetch\"],\n"
                    "             \"schedule\": [[4, [\"prefetch\"]], [9, []]]}}\n");
    regc_config *c = load_ok(f);
    regc_train_options o;
    regc_train_options_default(&o);
    apply_options(c, &o);
    assert_int_equal(o.compile.passes.n, 2);
    assert_string_equal(o.compile.passes.pass[0].name, "selective_gather");
    assert_true(o.compile.passes.pass[0].budget_bytes == INT64_C(64) << 20);
    assert_string_equal(o.compile.passes.pass[1].name, "prefetch");
    assert_true(o.compile.passes.pass[1].budget_bytes == 0);
    assert_int_equal(o.replans.n, 2);
    assert_true(o.replans.at[0].step == 4 && o.replans.at[1].step == 9);
    assert_int_equal(o.replans.at[0].passes.n, 1);
    assert_int_equal(o.replans.at[1].passes.n, 0);
    regc_config_free(c);
    /* the same as text; the default list */
    regc_pass_list l;
    regc_replan_list r;
    char why[160], text[128];
    assert_int_equal(regc_passes_from_text("selective_gather@64,prefetch", &l, why, sizeof why), 0);
    assert_memory_equal(&l, &o.compile.passes, sizeof l);
    assert_int_equal(regc_replans_from_text("4:prefetch;9:none", &r, why, sizeof why), 0);
    assert_memory_equal(&r, &o.replans, sizeof r);
    assert_int_equal(regc_passes_from_text("prefetch@0", &l, why, sizeof why), -1);
    assert_int_equal(regc_replans_from_text("4:prefetch;4:none", &r, why, sizeof why), -1);
    regc_train_options d;
    regc_train_options_default(&d);
    regc_passes_to_text(&d.compile.passes, text, sizeof text);
    assert_string_equal(text, "prefetch,overlap_reduce,selective_gather");
    /* pin_memory false is refused once the optimizer is offloaded */
    regc_train_options_default(&o);
    o.offload_pin_memory = 0;
    assert_int_equal(regc_train_check_options(&o), REGC_OK);
    o.compile.offload_optimizer = 1;
    assert_int_equal(regc_train_check_options(&o), REGC_ERR_ARG);
    assert_non_null(strstr(regc_error_message(), "offload_optimizer.pin_memory"));
    /* a section inside a section */
    write_config(f, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", "
                    "\"pin_memory\": true}}}");
    c = load_ok(f);
    regc_train_options_default(&o);
    assert_int_equal(o.compile.offload_optimizer, 0);
    apply_options(c, &o);
    assert_int_equal(o.compile.offload_optimizer, 1);
    regc_config_free(c);
}

static void test_partial_file_keeps_defaults(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, "{\"train\": {\"steps\": 3, \"data\": null, \"json\": false},\n"
                    " \"compile\": {\"backend\": null, \"level\": null, \"dump_graphs\": null}}");
    regc_config *c = load_ok(f);

    /* Applied over options that are not the defaults: only steps changes. */
    regc_train_options o, want;
    regc_train_options_default(&o);
    o.batch = 9;
    o.data_path = "mine.bin";
    o.compile.level = REGC_LEVEL_O0;
    o.compile.regional = 0;
    want = o;
    want.steps = 3;
    apply_options(c, &o);
    assert_options_equal(&o, &want);
    assert_null(regc_config_model(c));
    assert_null(regc_config_weights(c));
    assert_int_equal(regc_config_json(c), 0);
    regc_config_free(c);

    /* An empty object (and empty sections) sets nothing at all. */
    write_config(f, "{\"compile\": {}, \"train\": {}}");
    c = load_ok(f);
    regc_train_options_default(&o);
    regc_train_options_default(&want);
    apply_options(c, &o);
    assert_options_equal(&o, &want);
    assert_int_equal(regc_config_json(c), -1);
    regc_config_free(c);

    write_config(f, "  {}\n");
    c = load_ok(f);
    apply_options(c, &o);
    assert_options_equal(&o, &want);
    regc_config_free(c);

    /* cache_dir null turns a cache given before off; absent leaves it */
    write_config(f, "{\"compile\": {\"cache_dir\": null}}");
    c = load_ok(f);
    o.cache_dir = "somewhere";
    apply_options(c, &o);
    assert_null(o.cache_dir);
    regc_config_free(c);
}

/* The file as written, the key path the message must name, and what it
 * must say about the value. */
typedef struct {
    const char *text, *key, *what;
} bad_case;

static const bad_case bad_cases[] = {
    /* unknown keys, at each level */
    {"{\"trian\": {}}", "trian: unknown key", "\"compile\", \"train\" or"},
    {"{\"compile\": {\"lvl\": \"O1\"}}", "compile.lvl: unknown key", NULL},
    {"{\"train\": {\"bacth\": 4}}", "train.bacth: unknown key", NULL},
    {"{\"train\": {\"a\\nb\": 4}}", "train.a?b: unknown key", NULL},
    {"{\"train\": {\"steps\": 1, \"steps\": 2}}", "train.steps: duplicate key", NULL},
    /* the shape of the file */
    {"[1, 2]", "expected a JSON object", "got an array"},
    {"{\"compile\": true}", "compile: expected an object", "got true"},
    {"{\"train\": [4]}", "train: expected an object", "got an array"},
    /* compile.level and compile.backend: fixed sets of names */
    {"{\"compile\": {\"level\": \"O3\"}}", "compile.level: expected \"O0\", \"O1\" or \"O2\"",
     "got \"O3\""},
    {"{\"compile\": {\"level\": 1}}", "compile.level:", "got 1"},
    {"{\"compile\": {\"level\": \"o1\"}}", "compile.level:", "got \"o1\""},
    {"{\"compile\": {\"backend\": \"tpu\"}}", "compile.backend: expected \"cpu\", \"cuda\"",
     "got \"tpu\""},
    {"{\"compile\": {\"backend\": 0}}", "compile.backend:", "got 0"},
    /* booleans */
    {"{\"compile\": {\"use_regional_compilation\": \"yes\"}}",
     "compile.use_regional_compilation: expected true or false", "got \"yes\""},
    {"{\"compile\": {\"inline_back\": 1}}", "compile.inline_back: expected true or false", "got 1"},
    {"{\"train\": {\"json\": null}}", "train.json: expected true or false", "got null"},
    /* strings (paths and names) */
    {"{\"train\": {\"model\": 5}}", "train.model: expected a non-empty string", "got 5"},
    {"{\"train\": {\"data\": \"\"}}", "train.data: expected a non-empty string", "got \"\""},
    {"{\"train\": {\"weights\": {}}}", "train.weights:", "got an object"},
    {"{\"train\": {\"save\": []}}", "train.save:", "got an array"},
    {"{\"compile\": {\"dump_graphs\": 3}}",
     "compile.dump_graphs: expected a non-empty string, true, false or null", "got 3"},
    /* integers */
    {"{\"train\": {\"batch\": 0}}", "train.batch: expected an integer >= 1", "got 0"},
    {"{\"train\": {\"steps\": 2.5}}", "train.steps: expected an integer >= 1", "got 2.5"},
    {"{\"train\": {\"steps\": 1e10}}", "train.steps: expected an integer >= 1", "got 10000000000"},
    {"{\"train\": {\"seq\": \"64\"}}", "train.seq: expected an integer >= 1", "got \"64\""},
    {"{\"train\": {\"seq\": -3}}", "train.seq: expected an integer >= 1", "got -3"},
    {"{\"train\": {\"threads\": -1}}", "train.threads: expected an integer from 0 to 4096",
     "got -1"},
    {"{\"train\": {\"threads\": 5000}}", "train.threads:", "got 5000"},
    {"{\"train\": {\"threads\": true}}", "train.threads:", "got true"},
    /* seeds: whole, non-negative, and exactly what was written */
    {"{\"train\": {\"seed\": -1}}", "train.seed: expected an integer from 0 to 2^53 - 1", "got -1"},
    {"{\"train\": {\"seed\": 1.5}}", "train.seed:", "got 1.5"},
    {"{\"train\": {\"seed\": 9007199254740992}}", "train.seed:", "got 9007199254740992"},
    {"{\"train\": {\"seed\": 18446744073709551615}}", "train.seed:", "got 1.8446744073709552e+19"},
    {"{\"train\": {\"seed\": \"7\"}}", "train.seed:", "got \"7\""},
    /* floats */
    {"{\"train\": {\"lr\": 0}}", "train.lr: expected a finite number > 0", "got 0"},
    {"{\"train\": {\"lr\": -0.001}}", "train.lr: expected a finite number > 0", "got -0.001"},
    {"{\"train\": {\"lr\": \"3e-4\"}}", "train.lr:", "got \"3e-4\""},
    {"{\"train\": {\"lr\": 1e39}}", "train.lr:", "got 1e+39"},
    {"{\"train\": {\"lr\": 1e400}}", "train.lr:", "got inf"},
    {"{\"train\": {\"lr\": 1e-50}}", "train.lr: expected a number > 0 that a float can hold",
     "got 1e-50"},
    {"{\"train\": {\"weight_decay\": -0.1}}", "train.weight_decay: expected a finite number >= 0",
     "got -0.1"},
    {"{\"train\": {\"weight_decay\": null}}", "train.weight_decay:", "got null"},
    /* named by the design, not implemented */
    {"{\"compile\": {\"cache_dir\": 3}}", "compile.cache_dir:", "got 3"},
    {"{\"compile\": {\"cache_dir\": \"\"}}", "compile.cache_dir:", "non-empty"},
    {"{\"compile\": {\"cache_max_mb\": 0}}", "compile.cache_max_mb:", ">= 1"},
    {"{\"compile\": {\"cache_max_mb\": 1.5}}", "compile.cache_max_mb:", "got 1.5"},
    /* the trainer's schedule, clipping and accumulation */
    {"{\"train\": {\"lr_scheduler_type\": \"cosin\"}}",
     "train.lr_scheduler_type: expected \"constant\", \"constant_with_warmup\"", "got \"cosin\""},
    {"{\"train\": {\"warmup_ratio\": 1.5}}", "train.warmup_ratio: expected a number from 0 to 1",
     "got 1.5"},
    {"{\"train\": {\"warmup_steps\": -2}}", "train.warmup_steps:", "got -2"},
    {"{\"train\": {\"max_grad_norm\": -1}}", "train.max_grad_norm: expected a finite number >= 0",
     NULL},
    {"{\"train\": {\"gradient_accumulation_steps\": 0}}",
     "train.gradient_accumulation_steps: expected an integer from 1 to", "got 0"},
    {"{\"train\": {\"min_lr_rate\": \"0.1\"}}", "train.min_lr_rate:", "got \"0.1\""},
    {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\"}}}",
     "zero_optimization.offload_param.device: \"cpu\" is not supported: parameter offload", NULL},
    {"{\"zero_optimization\": {\"stage\": \"3\"}}",
     "zero_optimization.stage: expected an integer from 0 to 3", "got \"3\""},
    {"{\"zero_optimization\": {\"stages\": 3}}", "zero_optimization.stages: unknown key", NULL},
    {"{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": -1}}",
     "zero_optimization.stage3_prefetch_bucket_size: expected an integer >= 0", "got -1"},
    {"{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
     "zero_optimization.offload_optimizer.device: expected \"none\" or \"cpu\"", "got \"nvme\""},
    {"{\"zero_optimization\": {\"offload_optimizer\": 1}}",
     "zero_optimization.offload_optimizer: expected an object", "got 1"},
    {"{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_cnt\": 4}}}",
     "zero_optimization.offload_optimizer.buffer_cnt: unknown key", NULL},
    {"{\"zero_optimization\": {\"offload_optimizer\": {\"pin_memory\": 1}}}",
     "zero_optimization.offload_optimizer.pin_memory: expected true or false", NULL},
    {"{\"compile\": {\"passes\": [\"prefetch\", \"bogus\"]}}",
     "compile.passes: no pass named \"bogus\"", NULL},
    {"{\"compile\": {\"passes\": [[\"selective_gather\", 0]]}}", "compile.passes: an array of",
     "budgets whole MiB"},
    {"{\"compile\": {\"schedule\": [[5, [\"prefetch\"]], [3, []]]}}",
     "compile.schedule: steps > 0 in ascending order (got 3)", NULL},
    {"{\"compile\": {\"schedule\": [5, [\"prefetch\"]]}}",
     "compile.schedule: an array of [step, [passes]] pairs", NULL},
    {"{\"zero_optimization\": {\"reduce_bucket_size\": 0}}",
     "zero_optimization.reduce_bucket_size: expected an integer >= 1", "got 0"},
    {"{\"zero_optimization\": {\"communicator\": \"gloo\"}}",
     "zero_optimization.communicator: expected \"auto\"", "got \"gloo\""},
    {"{\"compile\": {\"deepcompile\": 1}}", "compile.deepcompile:", "got 1"},
    {"{\"compile\": {\"recompute\": \"most\"}}",
     "compile.recompute: expected \"none\", \"selective\", \"full\" or \"auto\"", "got \"most\""},
    {"{\"compile\": {\"memory_budget_mb\": -5}}", "compile.memory_budget_mb: expected an integer",
     "got -5"},
    {"{\"compile\": {\"logits_chunk_rows\": -1}}", "compile.logits_chunk_rows:", "got -1"},
    {"{\"compile\": {\"offload_activation\": \"yes\"}}",
     "compile.offload_activation:", "got \"yes\""},
    /* malformed JSON: where it failed */
    {"{\"train\": {\"steps\": 1,}}", "malformed JSON near line 1, column 24", NULL},
    {"{\n  \"train\": {\n    \"steps\": 1\n  \n}\n", "malformed JSON near line 6", NULL},
    {"{\"train\": {}} trailing", "malformed JSON near line 1, column 15", NULL},
    {"{'train': {}}", "malformed JSON near line 1, column", NULL},
    {"", "malformed JSON: the file is empty", NULL},
    {" \n\t", "malformed JSON: the file is empty", NULL},
};

static void test_errors_name_file_and_key(void **state)
{
    regc_test_dir *f = *state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *b = &bad_cases[i];
        write_config(f, b->text);
        regc_config *c = (regc_config *)&c; /* must be reset on failure */
        regc_error_clear();
        int rc = regc_config_load(f->path, &c);
        if (rc >= 0)
            fail_msg("case %zu (%s) loaded", i, b->text);
        assert_null(c);
        /* "<file>: <key>: ..." in one line */
        char want[1200];
        snprintf(want, sizeof want, "%s: %s", f->path, b->key);
        regc_test_expect_error(want, b->what);
    }
}

static void test_nul_byte_and_missing_file(void **state)
{
    regc_test_dir *f = *state;
    static const char text[] = "{\"train\":\n {\"steps\": 1\0}}";
    assert_int_equal(regc_test_write_file(f->path, text, sizeof text - 1), 0);
    regc_config *c = NULL;
    assert_true(regc_config_load(f->path, &c) < 0);
    assert_null(c);
    regc_test_expect_error(f->path, "NUL byte at line 2, column 13");

    char *missing = regc_test_join(f->dir, "missing.json");
    assert_int_equal(regc_config_load(missing, &c), REGC_ERR_IO);
    assert_null(c);
    regc_test_expect_error(missing, "cannot open");
    free(missing);

    /* A directory opens but does not read. */
    assert_true(regc_config_load(f->dir, &c) < 0);
    assert_null(c);
    regc_test_expect_error(f->dir, NULL);
}

/* The text of a file parses as the file does; its errors name the path
 * given, and a NUL inside the text is refused where it sits. */
static void test_parse_text(void **state)
{
    (void)state;
    static const char text[] = "{\"train\": {\"model\": \"gpt2-tiny\", \"json\": true}}";
    regc_config *c = NULL;
    assert_int_equal(regc_config_parse(text, sizeof text - 1, "mem.json", &c), REGC_OK);
    assert_string_equal(regc_config_model(c), "gpt2-tiny");
    assert_int_equal(regc_config_json(c), 1);
    assert_null(regc_config_weights(c));
    regc_config_free(c);

    static const char nul[] = "{\"train\":\n {\"steps\": 1\0}}";
    c = (regc_config *)0x1;
    assert_int_equal(regc_config_parse(nul, sizeof nul - 1, "mem.json", &c), REGC_ERR_FORMAT);
    assert_null(c);
    regc_test_expect_error("mem.json", "NUL byte at line 2, column 13");
    static const char typo[] = "{\"train\": {\"bacth\": 4}}";
    assert_int_equal(regc_config_parse(typo, sizeof typo - 1, "mem.json", &c), REGC_ERR_FORMAT);
    regc_test_expect_error("mem.json: train.bacth: unknown key", NULL);
}

static void test_free_and_accessors_take_null(void **state)
{
    (void)state;
    regc_config_free(NULL);
    regc_train_options o, d;
    regc_train_options_default(&o);
    regc_train_options_default(&d);
    apply_options(NULL, &o);
    assert_options_equal(&o, &d);
    assert_null(regc_config_model(NULL));
    assert_null(regc_config_weights(NULL));
    assert_int_equal(regc_config_json(NULL), -1);
}

/* ---- through `regc train` ------------------------------------------------ */

/* Lines of --json output that are steps. */
static int count_steps(const char *out)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, "{\"step\": ")) != NULL; p++)
        n++;
    return n;
}

/* A config that trains gpt2-tiny briefly with --json output. */
static const char small_config[] =
    "{\"compile\": {\"level\": \"O1\"},\n"
    " \"train\": {\"model\": \"gpt2-tiny\", \"steps\": 3, \"batch\": 1, \"seq\": 8,\n"
    "           \"json\": true}}\n";

static void test_cli_flags_override_file(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, small_config);
    regc_test_proc p;

    /* The file alone: its model, step count and --json all apply. */
    assert_int_equal(regc_test_run_regc(&p, "train", "--config", f->path, NULL), 0);
    assert_int_equal(count_steps(p.out), 3);
    assert_int_equal(regc_test_count_lines(p.out), 3);
    regc_test_proc_free(&p);

    /* A flag overrides the file wherever it stands. */
    assert_int_equal(regc_test_run_regc(&p, "train", "--config", f->path, "--steps", "1", NULL), 0);
    assert_int_equal(count_steps(p.out), 1);
    assert_int_equal(regc_test_count_lines(p.out), 1);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--steps=1", "--config", f->path, NULL), 0);
    assert_int_equal(count_steps(p.out), 1);
    assert_int_equal(regc_test_count_lines(p.out), 1);
    regc_test_proc_free(&p);

    /* --model over train.model, with the compile flags accepted. */
    write_config(f, "{\"train\": {\"model\": \"no-such-preset\", \"steps\": 2, \"batch\": 1,"
                    " \"seq\": 8}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path,
                                        "--json", "--level", "O0", "--regional", "off",
                                        "--inline-back=off", NULL),
                     0);
    assert_int_equal(count_steps(p.out), 2);
    regc_test_proc_free(&p);

    /* Without --json the file's train.json (unset here) leaves the table. */
    assert_int_equal(
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path, NULL), 0);
    assert_int_equal(count_steps(p.out), 0);
    assert_int_equal(regc_test_count_lines(p.out), 2);
    regc_test_proc_free(&p);
}

static void test_cli_bad_config_is_an_error(void **state)
{
    regc_test_dir *f = *state;
    char *save = regc_test_join(f->dir, "saved");
    char text[1400];
    snprintf(text, sizeof text,
             "{\"train\": {\"model\": \"gpt2-tiny\", \"steps\": 1, \"save\": \"%s\","
             " \"bacth\": 2}}",
             save);
    write_config(f, text);
    regc_test_proc p;

    assert_int_equal(regc_test_run_regc(&p, "train", "--config", f->path, NULL), 1);
    regc_test_expect_one_line_error(&p, -1, f->path, "train.bacth: unknown key");
    regc_test_proc_free(&p);
    struct stat st;
    assert_true(stat(save, &st) != 0); /* nothing written */

    /* A flag for the same option does not excuse a bad value in the file. */
    write_config(f, "{\"train\": {\"model\": \"gpt2-tiny\", \"steps\": 0}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--steps", "1", "--config", f->path, NULL), 1);
    regc_test_expect_one_line_error(&p, -1, f->path,
                                    "train.steps: expected an integer >= 1, got 0");
    regc_test_proc_free(&p);

    char *missing = regc_test_join(f->dir, "missing.json");
    assert_int_equal(regc_test_run_regc(&p, "train", "--config", missing, NULL), 1);
    regc_test_expect_one_line_error(&p, -1, missing, "cannot open");
    regc_test_proc_free(&p);
    free(missing);

    /* train.weights on a preset: the file's mistake, named by its key. */
    write_config(f, "{\"train\": {\"model\": \"gpt2-tiny\", \"weights\": \"w.safetensors\"}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--config", f->path, NULL), 1);
    regc_test_expect_one_line_error(&p, -1, f->path, "train.weights");
    regc_test_proc_free(&p);
    free(save);
}

static void test_cli_usage_errors(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, small_config);
    regc_test_proc p;

    static const char *const cases[][3] = {
        {"--level", "O3", "--level: expected O0, O1 or O2, got \"O3\""},
        {"--level", "o1", "--level"},
        {"--regional", "maybe", "--regional: expected on or off"},
        {"--inline-back", "1", "--inline-back: expected on or off"},
        {"--dump-graphs", "", "--dump-graphs: expected a non-empty value"},
        {"--config", "", "--config: expected a non-empty value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(
            regc_test_run_regc(&p, "train", "--config", f->path, cases[i][0], cases[i][1], NULL),
            2);
        regc_test_expect_one_line_error(&p, -1, "regc train", cases[i][2]);
        regc_test_proc_free(&p);
    }

    /* A usage error is reported before the file is even read. */
    char *missing = regc_test_join(f->dir, "missing.json");
    assert_int_equal(regc_test_run_regc(&p, "train", "--config", missing, "--level=O3", NULL), 2);
    regc_test_expect_one_line_error(&p, -1, "--level", NULL);
    regc_test_proc_free(&p);
    free(missing);

    /* --model stays required when the file does not give train.model. */
    write_config(f, "{\"train\": {\"steps\": 1}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--config", f->path, NULL), 2);
    regc_test_expect_one_line_error(&p, -1, "--model is required", NULL);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "train", "--help", NULL), 0);
    static const char *const documented[] = {"--config <FILE>", "--level <O0|O1|O2>",
                                             "--regional <on|off>", "--inline-back <on|off>",
                                             "--dump-graphs <DIR>"};
    for (size_t i = 0; i < sizeof documented / sizeof documented[0]; i++)
        if (!strstr(p.out, documented[i]))
            fail_msg("regc train --help does not document %s", documented[i]);
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_full_file, setup),
        regc_test_in_dir(test_passes_schedule_offload, setup),
        regc_test_in_dir(test_partial_file_keeps_defaults, setup),
        regc_test_in_dir(test_errors_name_file_and_key, setup),
        regc_test_in_dir(test_nul_byte_and_missing_file, setup),
        cmocka_unit_test(test_parse_text),
        cmocka_unit_test(test_free_and_accessors_take_null),
        regc_test_in_dir(test_cli_flags_override_file, setup),
        regc_test_in_dir(test_cli_bad_config_is_an_error, setup),
        regc_test_in_dir(test_cli_usage_errors, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
