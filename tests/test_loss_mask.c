/* test_loss_mask.c — supervised fine-tuning data: tools/prepare_data.py's
 * token file and loss mask, and `regc train --loss-mask`.
 *
 * - prepare_data.py packs JSONL examples as prompt · response · end of text,
 *   masked 0 · 1 · 1, byte for byte; in shards (--shard-tokens) the same
 *   tokens and mask, an earlier run's extra shards removed (and its masks
 *   by a text run), a failed run leaving the shards as they were; in
 *   llm.c's Llama 3 format (uint32) the same tokens.
 * - The mask decides which targets count: for the same first batch, the
 *   loss over the masked targets and the loss over the others, weighted by
 *   their counts, add up to the loss over all of them.
 * - Gradient accumulation normalises by the step's targets, however they
 *   fall between micro-batches: 2 micro-batches of 1 row train like 1
 *   batch of 2 rows.
 * - A mask of the wrong length or with a byte other than 0 and 1, a mask for
 *   an architecture that chooses its own targets, and malformed JSONL are
 *   one-line errors that name the file, with nothing written. */
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

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_data.h"
#include "test_util.h"

#define PYTHON "/usr/bin/python3"
#define SCRIPT REGC_SOURCE_DIR "/tools/prepare_data.py"
#define HEADER 1024

static const char jsonl[] =
    "{\"prompt\": \"Q: two plus two? A:\", \"response\": \" four.\"}\n"
    "\n"
    "{\"prompt\": \"Name a colour:\", \"response\": \" blue, or green, or red.\"}\n"
    "{\"prompt\": \"Say hi.\", \"response\": \" Hello there, friend!\"}\n";

typedef struct {
    char *dir, *jsonl, *prefix, *bin, *mask;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f || !(f->dir = regc_test_make_temp_dir("lossmask")))
        return -1;
    f->jsonl = regc_test_join(f->dir, "sft.jsonl");
    f->prefix = regc_test_join(f->dir, "sft");
    f->bin = regc_test_join(f->dir, "sft.bin");
    f->mask = regc_test_join(f->dir, "sft.mask.bin");
    *state = f;
    return regc_test_write_file(f->jsonl, jsonl, strlen(jsonl));
}

static int teardown(void **state)
{
    fixture *f = *state;
    regc_test_remove_tree(f->dir);
    free(f->dir), free(f->jsonl), free(f->prefix), free(f->bin), free(f->mask);
    free(f);
    return 0;
}

static void prepare(const fixture *f)
{
    regc_test_proc p;
    const char *argv[] = {PYTHON, SCRIPT, "--jsonl", f->jsonl, "--out", f->prefix, NULL};
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("prepare_data.py failed: %s", p.err);
    regc_test_proc_free(&p);
}

/* The step-0 loss of a run (--json), with the extra flags given. */
static double step0_loss(const fixture *f, const char *const *extra, double *step1)
{
    const char *argv[32] = {REGC_BIN, "train", "--model", "gpt2-tiny", "--data",     f->bin,
                            "--seq",  "16",    "--steps", "2",         "--no-cache", "--json"};
    int n = 12;
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    regc_test_proc p;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("regc train failed: %s", p.err);
    double loss[2] = {NAN, NAN};
    for (char *line = strtok(p.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "loss");
        if (cJSON_IsNumber(s) && cJSON_IsNumber(l) && s->valueint < 2)
            loss[s->valueint] = l->valuedouble;
        cJSON_Delete(o);
    }
    regc_test_proc_free(&p);
    if (step1)
        *step1 = loss[1];
    return loss[0];
}

/* --shard-tokens: shards that read as the one file (tokens, mask and so
 * the hash a checkpoint records), an earlier run's shards past the last
 * removed and other files of the prefix kept. */
static void test_prepare_in_shards(void **state)
{
    fixture *f = *state;
    prepare(f);
    char *stale = regc_test_join(f->dir, "sft_000099.bin"),
         *other = regc_test_join(f->dir, "sft_notes.bin");
    /* and a killed run's staged shard, which no later run publishes */
    char *leftover = regc_test_join(f->dir, "sft_000050.bin.staged"),
         *published = regc_test_join(f->dir, "sft_000050.bin");
    assert_int_equal(regc_test_write_file(stale, "x", 1), 0);
    assert_int_equal(regc_test_write_file(other, "x", 1), 0);
    assert_int_equal(regc_test_write_file(leftover, "x", 1), 0);
    regc_test_proc p;
    const char *argv[] = {PYTHON,    SCRIPT,           "--jsonl", f->jsonl, "--out",
                          f->prefix, "--shard-tokens", "7",       NULL};
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("prepare_data.py --shard-tokens failed: %s", p.err);
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(stale));
    assert_true(regc_test_is_file(other));
    assert_false(regc_test_is_file(leftover) || regc_test_is_file(published));
    free(leftover), free(published);

    char *tokens = regc_test_join(f->dir, "sft_??????.bin"),
         *masks = regc_test_join(f->dir, "sft_??????.mask.bin"),
         *last = regc_test_join(f->dir, "sft_000001.bin");
    regc_tokens *whole = NULL, *shards = NULL;
    assert_int_equal(regc_tokens_open(f->bin, 256, &whole), REGC_OK);
    assert_int_equal(regc_tokens_open_mask(whole, f->mask), REGC_OK);
    assert_int_equal(regc_tokens_open(tokens, 256, &shards), REGC_OK);
    assert_int_equal(regc_tokens_open_mask(shards, masks), REGC_OK);
    assert_int_equal(regc_tokens_count(shards), regc_tokens_count(whole));
    assert_true(regc_tokens_hash(shards) == regc_tokens_hash(whole));
    assert_true(regc_test_is_file(last)); /* more than one shard */
    regc_tokens_free(whole), regc_tokens_free(shards);

    /* a run that fails on its second example leaves the shards as they
     * were, nothing staged beside them */
    char *broken = regc_test_join(f->dir, "broken.jsonl"), *text = regc_test_join(f->dir, "a.txt");
    const char *bad = "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": 1}\n";
    assert_int_equal(regc_test_write_file(broken, bad, strlen(bad)), 0);
    size_t n_before, n_after;
    char *before = regc_test_read_file(last, &n_before);
    const char *fail[] = {PYTHON,    SCRIPT,           "--jsonl", broken, "--out",
                          f->prefix, "--shard-tokens", "1",       NULL};
    assert_int_equal(regc_test_run_argv(fail, &p), 1);
    regc_test_proc_free(&p);
    char *after = regc_test_read_file(last, &n_after);
    assert_non_null(before), assert_non_null(after);
    assert_true(n_before == n_after && !memcmp(before, after, n_before));
    char *staged = regc_test_join(f->dir, "sft_000000.bin.staged");
    assert_false(regc_test_is_file(staged));
    /* a text run writes no masks: the earlier run's go */
    assert_int_equal(regc_test_write_file(text, "plain text, every token counted", 31), 0);
    const char *plain[] = {PYTHON,    SCRIPT,           "--text", text, "--out",
                           f->prefix, "--shard-tokens", "7",      NULL};
    assert_int_equal(regc_test_run_argv(plain, &p), 0);
    regc_test_proc_free(&p);
    char *mask0 = regc_test_join(f->dir, "sft_000000.mask.bin");
    assert_false(regc_test_is_file(mask0));
    assert_true(regc_test_is_file(last));
    free(stale), free(other), free(tokens), free(masks), free(last), free(broken), free(text);
    free(before), free(after), free(staged), free(mask0);
}

/* --format llama-3: llm.c's uint32 tokens, which regc reads as the uint16
 * file's, batch for batch. */
static void test_prepare_llama3_format(void **state)
{
    fixture *f = *state;
    prepare(f);
    char *wide = regc_test_join(f->dir, "wide"), *wide_bin = regc_test_join(f->dir, "wide.bin");
    regc_test_proc p;
    const char *argv[] = {PYTHON, SCRIPT,     "--jsonl", f->jsonl, "--out",
                          wide,   "--format", "llama-3", NULL};
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("prepare_data.py --format llama-3 failed: %s", p.err);
    assert_non_null(strstr(p.out, "llm.c's llama-3 format"));
    regc_test_proc_free(&p);
    regc_tokens *a = NULL, *b = NULL;
    assert_int_equal(regc_tokens_open(f->bin, 256, &a), REGC_OK);
    assert_int_equal(regc_tokens_open(wide_bin, 256, &b), REGC_OK);
    const int64_t n = regc_tokens_count(a);
    assert_int_equal(regc_tokens_count(b), n);
    size_t size;
    char *bytes = regc_test_read_file(wide_bin, &size);
    assert_non_null(bytes);
    assert_int_equal(size, HEADER + 4 * (size_t)n);
    int32_t in[2][16], tg[2][16];
    assert_int_equal(regc_tokens_batch(a, 1, 1, 16, in[0], tg[0]), REGC_OK);
    assert_int_equal(regc_tokens_batch(b, 1, 1, 16, in[1], tg[1]), REGC_OK);
    assert_memory_equal(in[0], in[1], sizeof in[0]);
    assert_memory_equal(tg[0], tg[1], sizeof tg[0]);
    regc_tokens_free(a), regc_tokens_free(b);
    free(wide), free(wide_bin), free(bytes);
}

static void test_prepare_packs_and_masks(void **state)
{
    fixture *f = *state;
    prepare(f);
    size_t nb, nm;
    unsigned char *bin = (unsigned char *)regc_test_read_file(f->bin, &nb);
    unsigned char *mask = (unsigned char *)regc_test_read_file(f->mask, &nm);
    assert_non_null(bin);
    assert_non_null(mask);
    /* the expected stream, byte-level with end of text 0 */
    const char *ex[3][2] = {{"Q: two plus two? A:", " four."},
                            {"Name a colour:", " blue, or green, or red."},
                            {"Say hi.", " Hello there, friend!"}};
    int64_t n = 0;
    for (int e = 0; e < 3; e++) {
        for (int part = 0; part < 2; part++)
            for (const char *c = ex[e][part]; *c; c++, n++) {
                assert_int_equal(bin[HEADER + 2 * n] | bin[HEADER + 2 * n + 1] << 8,
                                 (unsigned char)*c);
                assert_int_equal(mask[HEADER + n], part); /* the prompt 0, the response 1 */
            }
        assert_int_equal(bin[HEADER + 2 * n] | bin[HEADER + 2 * n + 1] << 8, 0); /* end of text */
        assert_int_equal(mask[HEADER + n], 1);
        n++;
    }
    assert_int_equal(nb, HEADER + 2 * (size_t)n);
    assert_int_equal(nm, HEADER + (size_t)n);
    free(bin), free(mask);
}

static void test_masked_losses_add_up(void **state)
{
    fixture *f = *state;
    prepare(f);
    /* the complement mask */
    size_t nm;
    unsigned char *mask = (unsigned char *)regc_test_read_file(f->mask, &nm);
    assert_non_null(mask);
    int64_t count = (int64_t)nm - HEADER;
    uint8_t *inv = malloc((size_t)count);
    for (int64_t i = 0; i < count; i++)
        inv[i] = (uint8_t)!mask[HEADER + i];
    char *inv_path = regc_test_join(f->dir, "inverse.mask.bin");
    assert_int_equal(regc_tokens_write_mask(inv_path, inv, count), REGC_OK);
    /* batch 0 has 2 rows of 16: its targets are tokens 1 .. 32 */
    int64_t in_mask = 0;
    for (int64_t i = 1; i <= 32; i++)
        in_mask += mask[HEADER + i];
    assert_true(in_mask > 0 && in_mask < 32);

    const char *m[] = {"--batch", "2", "--loss-mask", f->mask, NULL};
    const char *im[] = {"--batch", "2", "--loss-mask", inv_path, NULL};
    const char *all[] = {"--batch", "2", NULL};
    double lm = step0_loss(f, m, NULL), li = step0_loss(f, im, NULL), la = step0_loss(f, all, NULL);
    double sum = (lm * (double)in_mask + li * (double)(32 - in_mask)) / 32.0;
    if (!(fabs(sum - la) <= 2e-6 * fabs(la)))
        fail_msg("masked %.9g over %lld + unmasked %.9g over %lld = %.9g, all %.9g", lm,
                 (long long)in_mask, li, (long long)(32 - in_mask), sum, la);
    assert_true(fabs(lm - la) > 1e-3); /* the mask did change the loss */
    free(inv), free(inv_path), free(mask);
}

static void test_accumulation_weighs_by_targets(void **state)
{
    fixture *f = *state;
    prepare(f);
    double one1, two1;
    const char *one[] = {"--batch", "2", "--loss-mask", f->mask, NULL};
    const char *two[] = {"--batch", "1", "--gradient-accumulation-steps", "2", "--loss-mask",
                         f->mask,   NULL};
    double one0 = step0_loss(f, one, &one1), two0 = step0_loss(f, two, &two1);
    /* the same 32 targets; the two rows hold different numbers of them */
    if (!(fabs(one0 - two0) <= 2e-6 * fabs(one0)) || !(fabs(one1 - two1) <= 1e-5 * fabs(one1)))
        fail_msg("one batch of 2: %.9g then %.9g; two micro-batches of 1: %.9g then %.9g", one0,
                 one1, two0, two1);
}

/* One stderr line that starts "regc" or "prepare_data.py" and names `what`,
 * exit 1, and no file at `never`. */
static void expect_error(const char *const *argv, const char *what, const char *never)
{
    regc_test_proc p;
    int rc = regc_test_run_argv(argv, &p);
    int lines = 0;
    for (const char *l = p.err; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        lines += !strncmp(l, "regc: ", 6) || !strncmp(l, "prepare_data.py: ", 17);
    if (rc != 1 || lines != 1 || !strstr(p.err, what))
        fail_msg("expected exit 1 and one error naming \"%s\"; got %d:\n%s", what, rc, p.err);
    struct stat st;
    if (never)
        assert_true(stat(never, &st) != 0);
    regc_test_proc_free(&p);
}

static void test_bad_masks_and_data(void **state)
{
    fixture *f = *state;
    prepare(f);
    char *save = regc_test_join(f->dir, "never");
    char *short_mask = regc_test_join(f->dir, "short.mask.bin");
    char *bad_mask = regc_test_join(f->dir, "two.mask.bin");
    uint8_t bytes[8] = {0, 1, 1, 0, 1, 1, 1, 1};
    assert_int_equal(regc_tokens_write_mask(short_mask, bytes, 8), REGC_OK);
    size_t nm;
    unsigned char *mask = (unsigned char *)regc_test_read_file(f->mask, &nm);
    mask[HEADER + 5] = 2;
    assert_int_equal(regc_test_write_file(bad_mask, mask, nm), 0);
    free(mask);

    const char *a1[] = {REGC_BIN, "train",       "--model",  "gpt2-tiny", "--data",
                        f->bin,   "--loss-mask", short_mask, "--seq",     "16",
                        "--save", save,          NULL};
    expect_error(a1, "short.mask.bin: 8 mask bytes for the", save);
    const char *a2[] = {REGC_BIN, "train", "--model", "gpt2-tiny", "--data", f->bin, "--loss-mask",
                        bad_mask, "--seq", "16",      "--save",    save,     NULL};
    expect_error(a2, "two.mask.bin: byte 5 is 2", save);
    const char *a3[] = {REGC_BIN, "train", "--model", "bert-tiny", "--data", f->bin, "--loss-mask",
                        f->mask,  "--seq", "16",      "--save",    save,     NULL};
    expect_error(a3, "train.loss_mask", save);

    /* malformed JSONL: the line is named, no output */
    char *broken = regc_test_join(f->dir, "broken.jsonl"), *out = regc_test_join(f->dir, "out");
    char *out_bin = regc_test_join(f->dir, "out.bin");
    const char *text = "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"c\"}\n";
    assert_int_equal(regc_test_write_file(broken, text, strlen(text)), 0);
    const char *p1[] = {PYTHON, SCRIPT, "--jsonl", broken, "--out", out, NULL};
    expect_error(p1, "broken.jsonl:2: \"response\" is missing", out_bin);
    free(broken), free(out), free(out_bin), free(save), free(short_mask), free(bad_mask);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_prepare_packs_and_masks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_in_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_llama3_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_masked_losses_add_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulation_weighs_by_targets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_masks_and_data, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
