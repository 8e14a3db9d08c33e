/* test_ds_config_train.c — the configs people already have, trained as
 * they are through `regc train`: a DeepSpeed ds_config.json given to
 * --deepspeed or --config, and Transformers' TrainingArguments as JSON.
 *
 * The seed design's DeepCompile example and the ZeRO-3 configs of
 * tests/data train on one process and, where mpirun runs regc's ranks, on
 * two, DeepSpeed's batch rule splitting ds_zero3.json's global batch over
 * the ranks and the losses agreeing with one process's; a refused config
 * is one line naming the file and the key, and exit status 1; a
 * TrainingArguments file with its DeepSpeed config trains, num_train_epochs
 * reading the token file that many times and max_steps or a flag overriding
 * it; --print-config gives every option with a key its value and where the
 * value came from (default, file, flag, "auto" or what it follows from),
 * and trains nothing. How each key is read is test_ds_config.c's. */
#define _XOPEN_SOURCE 700
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "options.h"
#include "regc_data.h"
#include "regc_train.h"
#include "test_ranks_run.h"
#include "test_util.h"

#define DATA REGC_SOURCE_DIR "/tests/data/"
#define MPIRUN REGC_RANKS_MPIRUN

static int setup(void **state) { return regc_test_dir_setup(state, "dsconfig", "cfg.json"); }

static void write_config(const regc_test_dir *f, const char *text)
{
    assert_int_equal(regc_test_write_file(f->path, text, strlen(text)), 0);
}

/* The seed design's DeepCompile example and ZeRO-3 configs train as they
 * are. */
static void test_configs_train(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 200000000},"
                    " \"compile\": {\"deepcompile\": true}}");
    regc_test_proc p;
    double loss[8];
    for (int i = 0; i < 2; i++) { /* Hugging Face's flag and regc's */
        assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny",
                                            i ? "--config" : "--deepspeed", f->path, "--steps", "2",
                                            "--batch", "1", "--seq", "8", "--json", NULL),
                         0);
        assert_int_equal(regc_test_json_losses(p.out, loss, 8), 2);
        regc_test_proc_free(&p);
    }
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed",
                                        DATA "ds_zero3.json", "--steps", "6", "--seq", "8",
                                        "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, loss, 8), 6);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed",
                                        DATA "ds_zero3_auto.json", "--steps", "3", "--batch", "2",
                                        "--seq", "8", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, loss, 8), 3);
    regc_test_proc_free(&p);

    /* a refusal is one line naming the file and the key, exit 1 */
    write_config(f, "{\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--steps", "1", NULL),
                     1);
    assert_int_equal(regc_test_count_lines(p.err), 1);
    assert_non_null(strstr(p.err, "zero_optimization.zero_quantized_weights: true is not "
                                  "supported"));
    assert_int_equal(p.out_len, 0);
    regc_test_proc_free(&p);
    write_config(f, "{\"zero_optimization\": {\"stage\": 2}}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--steps", "1", NULL),
                     1);
    assert_non_null(strstr(p.err, ": zero_optimization.stage: 2 is not built (0 or 3"));
    assert_non_null(strstr(p.err, f->path));
    regc_test_proc_free(&p);
    write_config(f, "{\"deepspeed\": \"other.json\"}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--steps", "1", NULL),
                     1);
    assert_non_null(strstr(p.err, ": deepspeed: a DeepSpeed config names no other"));
    regc_test_proc_free(&p);
    assert_int_equal(
        regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", "", NULL), 2);
    regc_test_proc_free(&p);
}

/* `mpirun -np 2 regc train ARGS...` (NULL-terminated). */
static int run_two_ranks(regc_test_proc *p, ...)
{
    const char *argv[48];
    int n = regc_ranks_add_mpirun(argv, 0);
    argv[n++] = "-np", argv[n++] = "2", argv[n++] = REGC_BIN, argv[n++] = "train";
    va_list ap;
    va_start(ap, p);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && n < 47;)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    return regc_test_run_argv(argv, p);
}

/* Under mpirun the same configs: the ds_zero3.json global batch of 8 is
 * two micro-batches of 2 on each of 2 ranks, four on one, and the two
 * runs' losses agree (a sum over ranks reorders additions: 1e-5). Skipped
 * where mpirun is missing or regc is built without MPI (each of its
 * processes would train alone: accumulation would stay 4). */
static void test_configs_train_two_ranks(void **state)
{
    regc_test_dir *f = *state;
    if (access(MPIRUN, X_OK) != 0)
        skip();
    regc_test_proc p;
    assert_int_equal(run_two_ranks(&p, "--model", "gpt2-tiny", "--deepspeed", DATA "ds_zero3.json",
                                   "--seq", "8", "--print-config", NULL),
                     0);
    cJSON *cfg = cJSON_Parse(p.out);
    assert_non_null(cfg);
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cfg, "train"),
                                         "gradient_accumulation_steps"),
        "value");
    const int two_ranks = cJSON_IsNumber(acc) && acc->valueint == 2;
    cJSON_Delete(cfg);
    regc_test_proc_free(&p);
    if (!two_ranks)
        skip();
    double one[8], two[8];
    assert_int_equal(run_two_ranks(&p, "--model", "gpt2-tiny", "--deepspeed", DATA "ds_zero3.json",
                                   "--seq", "8", "--steps", "4", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, two, 8), 4);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed",
                                        DATA "ds_zero3.json", "--seq", "8", "--steps", "4",
                                        "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, one, 8), 4);
    regc_test_proc_free(&p);
    for (int k = 0; k < 4; k++)
        if (!(fabs(one[k] - two[k]) <= 1e-5 * fabs(one[k])))
            fail_msg("step %d: loss %.9g on 2 ranks, %.9g on one", k, two[k], one[k]);
    /* the seed's DeepCompile example, and the all-"auto" ZeRO-3 config */
    write_config(f, "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 200000000},"
                    " \"compile\": {\"deepcompile\": true}}");
    assert_int_equal(run_two_ranks(&p, "--model", "gpt2-tiny", "--deepspeed", f->path, "--steps",
                                   "2", "--batch", "1", "--seq", "8", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, two, 8), 2);
    regc_test_proc_free(&p);
    assert_int_equal(run_two_ranks(&p, "--model", "gpt2-tiny", "--deepspeed",
                                   DATA "ds_zero3_auto.json", "--steps", "2", "--batch", "1",
                                   "--seq", "8", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, two, 8), 2);
    regc_test_proc_free(&p);
}

/* A token file of n tokens. */
static char *tokens(const regc_test_dir *f, int n)
{
    char *path = regc_test_join(f->dir, "tokens.bin");
    uint16_t *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++)
        t[i] = (uint16_t)((i * 37 + 11) % 251);
    assert_int_equal(regc_tokens_write(path, t, n), 0);
    free(t);
    return path;
}

/* Transformers' TrainingArguments as a file, with its DeepSpeed config: it
 * trains, and num_train_epochs reads the token file that many times. */
static void test_training_arguments(void **state)
{
    regc_test_dir *f = *state;
    char *data = tokens(f, 321), *out = regc_test_join(f->dir, "out"), text[4096];
    /* 320 targets in rows of 8, 2 rows a micro-batch: 20 micro-batches an
     * epoch, 2 a step */
    snprintf(text, sizeof text,
             "{\"output_dir\": \"%s\", \"per_device_train_batch_size\": 2,"
             " \"gradient_accumulation_steps\": 2, \"num_train_epochs\": 2, \"max_steps\": -1,"
             " \"learning_rate\": 5e-4, \"weight_decay\": 0.01, \"adam_beta1\": 0.9,"
             " \"adam_beta2\": 0.98, \"adam_epsilon\": 1e-6, \"lr_scheduler_type\": \"cosine\","
             " \"warmup_steps\": 0, \"warmup_ratio\": 0.1, \"max_grad_norm\": 1.0, \"bf16\": false,"
             " \"fp16\": false, \"gradient_checkpointing\": true, \"save_steps\": 15,"
             " \"save_total_limit\": 1, \"logging_steps\": 5, \"eval_steps\": null, \"seed\": 7,"
             " \"report_to\": \"none\", \"run_name\": \"ta\", \"logging_dir\": \"logs\","
             " \"do_train\": true, \"optim\": \"adamw_torch\", \"lr_scheduler_kwargs\": {},"
             " \"eval_strategy\": \"no\", \"save_strategy\": \"steps\", \"tf32\": null,"
             " \"dataloader_num_workers\": 0, \"deepspeed\": \"%s\"}",
             out, DATA "ds_zero3_auto.json");
    write_config(f, text);
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path,
                                        "--data", data, "--seq", "8", "--print-config", NULL),
                     0);
    cJSON *cfg = cJSON_Parse(p.out);
    assert_non_null(cfg);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(cfg, "train");
#define VALUE(sec, key)                                                                            \
    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sec, key), "value")
#define FROM(sec, key)                                                                             \
    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sec, key), "from")           \
        ->valuestring
    assert_int_equal(VALUE(train, "steps")->valueint, 20);
    assert_non_null(strstr(FROM(train, "steps"), "num_train_epochs 2 over"));
    assert_int_equal(VALUE(train, "batch")->valueint, 2);
    assert_non_null(strstr(FROM(train, "batch"), ": per_device_train_batch_size"));
    /* DeepSpeed's scheduler replaced lr_scheduler_type; its "auto" peak is learning_rate */
    assert_string_equal(VALUE(train, "lr_scheduler_type")->valuestring, "WarmupDecayLR");
    assert_non_null(strstr(FROM(train, "lr_scheduler_type"), "ds_zero3_auto.json: scheduler.type"));
    assert_true(VALUE(train, "lr")->valuedouble == 5e-4);
    assert_non_null(strstr(FROM(train, "lr"), ": learning_rate"));
    assert_string_equal(
        VALUE(cJSON_GetObjectItemCaseSensitive(cfg, "compile"), "recompute")->valuestring, "full");
    assert_int_equal(VALUE(train, "train_batch_size")->valueint, 4);
    const cJSON *zero = cJSON_GetObjectItemCaseSensitive(cfg, "zero_optimization");
    assert_int_equal(VALUE(zero, "stage")->valueint, 3);
    assert_non_null(strstr(FROM(zero, "reduce_bucket_size"), "\"auto\" in "));
    cJSON_Delete(cfg);
    regc_test_proc_free(&p);

    /* it trains 2 epochs: 20 steps, a checkpoint at 15, the newest kept */
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path,
                                        "--data", data, "--seq", "8", "--json", NULL),
                     0);
    double loss[32];
    assert_int_equal(regc_test_json_losses(p.out, loss, 32), 20);
    regc_test_proc_free(&p);
    char *ck = regc_test_join(out, "checkpoint-15/trainer_state.json");
    assert_true(regc_test_is_file(ck));
    free(ck);
    /* half an epoch: 10 micro-batches, 5 steps; a flag overrides the file */
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path,
                                        "--data", data, "--seq", "8", "--num-train-epochs", "0.5",
                                        "--save-steps", "0", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, loss, 32), 5);
    regc_test_proc_free(&p);
    /* max_steps given wins over the epochs, as in Transformers */
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path,
                                        "--data", data, "--seq", "8", "--steps", "3",
                                        "--save-steps", "0", "--json", NULL),
                     0);
    assert_int_equal(regc_test_json_losses(p.out, loss, 32), 3);
    regc_test_proc_free(&p);
    free(data), free(out);
}

/* Transformers' tf32, as its usual GPU arguments set it beside bf16: under
 * bf16 every GEMM is bf16 and the run is the bits of one without it; under
 * fp32 the cpu backend, which has no TF32, refuses it by name, from the
 * file and from the flag, as Transformers refuses it without an Ampere GPU. */
static void test_tf32(void **state)
{
    regc_test_dir *f = *state;
    regc_test_proc p;
    static const char *const files[2] = {"{\"bf16\": true, \"tf32\": true}",
                                         "{\"bf16\": true, \"tf32\": null}"};
    double loss[2][4] = {{0}};
    for (int i = 0; i < 2; i++) {
        write_config(f, files[i]);
        assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config",
                                            f->path, "--steps", "3", "--batch", "2", "--seq", "8",
                                            "--json", NULL),
                         0);
        assert_int_equal(regc_test_json_losses(p.out, loss[i], 4), 3);
        regc_test_proc_free(&p);
    }
    assert_memory_equal(loss[0], loss[1], sizeof loss[0]);

    write_config(f, "{\"tf32\": true}");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--config", f->path,
                                        "--steps", "1", NULL),
                     1);
    regc_test_expect_one_line_error(&p, 1, "compile.tf32: the cpu backend has no TF32", NULL);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "plan", "--model", "gpt2-tiny", "--ranks", "1",
                                        "--tf32", "on", NULL),
                     1);
    regc_test_expect_one_line_error(&p, 1, "compile.tf32: the cpu backend has no TF32", NULL);
    regc_test_proc_free(&p);
}

/* --print-config: every option with a key once, from its default, file,
 * flag, "auto" or what it follows from; nothing trains. */
static void test_print_config(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, "{\"optimizer\": {\"params\": {\"lr\": 2e-4, \"eps\": \"auto\"}},"
                    " \"train_micro_batch_size_per_gpu\": 2, \"train_batch_size\": 8,"
                    " \"scheduler\": {\"type\": \"WarmupLR\"}}");
    char *save = regc_test_join(f->dir, "saved");
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--deepspeed", f->path,
                                        "--print-config", "--weight-decay", "0.5", "--save", save,
                                        NULL),
                     0);
    assert_false(regc_test_is_file(save));
    cJSON *cfg = cJSON_Parse(p.out);
    assert_non_null(cfg);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(cfg, "train");
    char want[1200];
    snprintf(want, sizeof want, "%s: optimizer.params.lr", f->path);
    assert_string_equal(FROM(train, "lr"), want);
    assert_string_equal(FROM(train, "weight_decay"), "flag --weight-decay");
    snprintf(want, sizeof want, "default (\"auto\" in %s: optimizer.params.eps)", f->path);
    assert_string_equal(FROM(train, "adam_epsilon"), want);
    assert_string_equal(FROM(train, "seq"), "default");
    assert_string_equal(FROM(train, "gradient_accumulation_steps"),
                        "train_batch_size 8 / (train.batch 2 x 1 ranks)");
    assert_int_equal(VALUE(train, "gradient_accumulation_steps")->valueint, 4);
    snprintf(want, sizeof want,
             "%s: scheduler.params.warmup_num_steps (left out: DeepSpeed's default)", f->path);
    assert_string_equal(FROM(train, "warmup_steps"), want);
    assert_int_equal(VALUE(train, "warmup_steps")->valueint, 1000);
    /* every row with a key and a value, once */
    for (int k = 0; k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        if (!o->key || !o->size || o->type == OPT_INERT || o->type == OPT_NEUTRAL)
            continue;
        const cJSON *at = cfg;
        char sec[128];
        for (const char *s = o->section; *s;) {
            size_t n = strcspn(s, ".");
            snprintf(sec, sizeof sec, "%.*s", (int)n, s);
            at = cJSON_GetObjectItemCaseSensitive(at, sec);
            s += n + (s[n] == '.');
        }
        if (!VALUE(at, o->key))
            fail_msg("--print-config lacks %s.%s", o->section, o->key);
    }
    cJSON_Delete(cfg);
    regc_test_proc_free(&p);
    free(save);
#undef VALUE
#undef FROM
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_configs_train, setup),
        regc_test_in_dir(test_configs_train_two_ranks, setup),
        regc_test_in_dir(test_training_arguments, setup),
        regc_test_in_dir(test_tf32, setup),
        regc_test_in_dir(test_print_config, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
