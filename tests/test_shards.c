/* test_shards.c — token data in shards, as llm.c's datasets come: a pattern
 * names files whose tokens read as their concatenation in name order.
 *
 * - Shards of uneven sizes (one empty), written out of name order beside
 *   files the pattern does not match, read as the one file of their
 *   tokens joined: the same count from the headers alone, the same hash
 *   (what a checkpoint records, so a run may resume on either), and the
 *   same batches in llm.c's order and shuffled, rows crossing the files'
 *   ends; masks beside the shards likewise.
 * - Errors name the file: a pattern matching nothing or a directory, a
 *   token past the vocabulary in one shard, masks of another number of
 *   files or another length, and a shard or mask shortened, replaced,
 *   rewritten in place or removed after open (a batch then fails in one
 *   line; nothing is read from a file it was not checked as).
 * - A name holding * ? [ that a file has is that file, not a pattern.
 * - Through `regc train`: a pattern trains as the joined file does (and as
 *   the same tokens in llm.c's Llama 3 format of uint32 do), its
 *   epochs counted over every shard, the run says how many files and
 *   tokens it read, and a pattern a shell expanded into several arguments
 *   is refused with the quoting that fixes it. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "regc_data.h"
#include "test_util.h"

#define VOCAB 256 /* below gpt2-tiny's 512: `regc train` reads the same files */
#define N_SHARDS 4
static const int64_t shard_count[N_SHARDS] = {37, 0, 101, 64}; /* shard_00 .. shard_03 */
#define TOTAL (37 + 0 + 101 + 64)

static int setup(void **state) { return regc_test_dir_setup(state, "shards", ""); }

static uint16_t token_at(int64_t i) { return (uint16_t)((i * 31 + 7) % VOCAB); }

/* dir/shard_0s.bin and .mask for each s, last first, and dir/whole.bin and
 * whole.mask: their concatenation; beside them files no pattern below
 * matches. */
static void write_shards(regc_test_dir *f)
{
    uint16_t tokens[TOTAL];
    uint8_t mask[TOTAL];
    for (int64_t i = 0; i < TOTAL; i++)
        tokens[i] = token_at(i), mask[i] = (uint8_t)(i % 5 != 0);
    for (int s = N_SHARDS - 1; s >= 0; s--) {
        int64_t first = 0;
        for (int j = 0; j < s; j++)
            first += shard_count[j];
        char name[32];
        snprintf(name, sizeof name, "shard_%02d.bin", s);
        assert_int_equal(
            regc_tokens_write(regc_test_path_in(f, name), tokens + first, shard_count[s]), REGC_OK);
        snprintf(name, sizeof name, "shard_%02d.mask", s);
        assert_int_equal(
            regc_tokens_write_mask(regc_test_path_in(f, name), mask + first, shard_count[s]),
            REGC_OK);
    }
    assert_int_equal(regc_tokens_write(regc_test_path_in(f, "whole.bin"), tokens, TOTAL), REGC_OK);
    assert_int_equal(regc_tokens_write_mask(regc_test_path_in(f, "whole.mask"), mask, TOTAL),
                     REGC_OK);
    assert_int_equal(regc_tokens_write(regc_test_path_in(f, "other.bin"), tokens, 9), REGC_OK);
    assert_int_equal(regc_test_write_file(regc_test_path_in(f, "shard_notes.txt"), "x", 1), 0);
}

static regc_tokens *open_tokens(regc_test_dir *f, const char *name, const char *mask)
{
    regc_tokens *t = NULL;
    assert_int_equal(regc_tokens_open(regc_test_path_in(f, name), VOCAB, &t), REGC_OK);
    if (mask)
        assert_int_equal(regc_tokens_open_mask(t, regc_test_path_in(f, mask)), REGC_OK);
    return t;
}

/* Batches 0 .. 19 of 3 x 8 of a and b are the same, in both orders. */
static void expect_same_batches(regc_tokens *a, regc_tokens *b)
{
    enum { B = 3, T = 8 };
    int32_t in_a[B * T], tg_a[B * T], in_b[B * T], tg_b[B * T];
    for (int shuffled = 0; shuffled < 2; shuffled++) {
        regc_tokens_set_shuffle(a, shuffled, 11);
        regc_tokens_set_shuffle(b, shuffled, 11);
        for (int64_t k = 0; k < 20; k++) {
            assert_int_equal(regc_tokens_batch(a, k, B, T, in_a, tg_a), REGC_OK);
            assert_int_equal(regc_tokens_batch(b, k, B, T, in_b, tg_b), REGC_OK);
            assert_memory_equal(in_a, in_b, sizeof in_a);
            assert_memory_equal(tg_a, tg_b, sizeof tg_a);
        }
    }
}

static void test_shards_read_as_their_concatenation(void **state)
{
    regc_test_dir *f = *state;
    write_shards(f);
    regc_tokens *shards = open_tokens(f, "shard_*.bin", NULL);
    regc_tokens *whole = open_tokens(f, "whole.bin", NULL);
    assert_int_equal(regc_tokens_count(shards), TOTAL);
    int64_t count = 0;
    assert_int_equal(regc_tokens_count_files(regc_test_path_in(f, "shard_*.bin"), &count), REGC_OK);
    assert_int_equal(count, TOTAL);
    assert_true(regc_tokens_hash(shards) == regc_tokens_hash(whole));
    expect_same_batches(shards, whole);
    /* llm.c's order runs through the files' ends: batch 1's first row
     * starts at token 24, the first shard's ending at 37 */
    int32_t in[3 * 8], tg[3 * 8];
    regc_tokens_set_shuffle(shards, 0, 0);
    assert_int_equal(regc_tokens_batch(shards, 1, 3, 8, in, tg), REGC_OK);
    for (int i = 0; i < 3 * 8; i++) {
        assert_int_equal(in[i], token_at(24 + i));
        assert_int_equal(tg[i], token_at(25 + i));
    }
    regc_tokens_free(shards);
    regc_tokens_free(whole);

    shards = open_tokens(f, "shard_0?.bin", "shard_*.mask");
    whole = open_tokens(f, "whole.bin", "whole.mask");
    assert_true(regc_tokens_hash(shards) == regc_tokens_hash(whole));
    expect_same_batches(shards, whole);
    regc_tokens_free(shards);
    regc_tokens_free(whole);
}

static void expect_mask_error(regc_test_dir *f, const char *mask, const char *a, const char *b)
{
    regc_tokens *t = open_tokens(f, "shard_*.bin", NULL);
    assert_int_equal(regc_tokens_open_mask(t, regc_test_path_in(f, mask)), REGC_ERR_SHAPE);
    regc_test_expect_error(a, b);
    regc_tokens_free(t);
}

static void test_shard_errors_name_the_file(void **state)
{
    regc_test_dir *f = *state;
    write_shards(f);
    regc_tokens *t = (regc_tokens *)0x1;
    const char *none = regc_test_path_in(f, "none_*.bin");
    assert_int_equal(regc_tokens_open(none, VOCAB, &t), REGC_ERR_IO);
    assert_null(t);
    regc_test_expect_error(none, "no file matches this pattern");
    int64_t count = -1;
    assert_int_equal(regc_tokens_count_files(none, &count), REGC_ERR_IO);

    /* masks: a file too few, then one shard's mask a byte short */
    expect_mask_error(f, "shard_0[0-2].mask", "3 mask files for the 4 token files", "shard_*.bin");
    uint8_t short_mask[100] = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s", regc_test_path_in(f, "shard_02.mask"));
    assert_int_equal(regc_tokens_write_mask(path, short_mask, 100), REGC_OK);
    expect_mask_error(f, "shard_*.mask", "shard_02.mask: 100 mask bytes for the 101 tokens of",
                      "shard_02.bin");

    /* a token past the vocabulary in the third shard: named with its place
     * in that file */
    uint16_t bad[101];
    for (int i = 0; i < 101; i++)
        bad[i] = i == 5 ? VOCAB : token_at(i);
    snprintf(path, sizeof path, "%s", regc_test_path_in(f, "shard_02.bin"));
    assert_int_equal(regc_tokens_write(path, bad, 101), REGC_OK);
    assert_int_equal(regc_tokens_open(regc_test_path_in(f, "shard_*.bin"), VOCAB, &t),
                     REGC_ERR_FORMAT);
    assert_null(t);
    regc_test_expect_error("shard_02.bin", "token 256 at position 5 is >= vocab size 256");
    /* the headers alone still count it: epochs need no more */
    assert_int_equal(regc_tokens_count_files(regc_test_path_in(f, "shard_*.bin"), &count), REGC_OK);
    assert_int_equal(count, TOTAL);
}

/* Batch 7 of 3 x 8 (tokens 168 .. 192) reads the last shard (138 ..). */
static void expect_batch_error(regc_tokens *t, const char *a, const char *b)
{
    int32_t in[3 * 8], tg[3 * 8];
    assert_int_equal(regc_tokens_batch(t, 0, 3, 8, in, tg), REGC_OK); /* the first shard is whole */
    assert_int_not_equal(regc_tokens_batch(t, 7, 3, 8, in, tg), REGC_OK);
    regc_test_expect_error(a, b);
}

static void test_shard_changed_after_open(void **state)
{
    regc_test_dir *f = *state;
    write_shards(f);
    regc_tokens *t = open_tokens(f, "shard_*.bin", "shard_*.mask");
    char path[1024];
    snprintf(path, sizeof path, "%s", regc_test_path_in(f, "shard_03.bin"));
    uint16_t tokens[64];
    for (int i = 0; i < 64; i++)
        tokens[i] = token_at(TOTAL - 64 + i);
    /* shorter; the same tokens in a new file of the same size; the same
     * file rewritten in place, its size the same */
    assert_int_equal(regc_tokens_write(path, tokens, 60), REGC_OK);
    expect_batch_error(t, "shard_03.bin", "changed since it was opened");
    assert_int_equal(regc_tokens_write(path, tokens, 64), REGC_OK);
    expect_batch_error(t, "shard_03.bin", "changed since it was opened");
    regc_tokens_free(t);
    t = open_tokens(f, "shard_*.bin", "shard_*.mask");
    struct timespec pause = {0, 20 * 1000 * 1000}; /* past the file system's time grain */
    nanosleep(&pause, NULL);
    struct stat before;
    assert_int_equal(stat(path, &before), 0);
    FILE *w = fopen(path, "r+b");
    assert_non_null(w);
    assert_int_equal(fseek(w, 1024 + 2 * 40 + 1, SEEK_SET), 0);
    assert_int_equal(fputc(0x0f, w), 0x0f); /* token 40's high byte: past the vocabulary */
    assert_int_equal(fclose(w), 0);
    expect_batch_error(t, "shard_03.bin", "replaced or rewritten");
    /* the same, its modification time set back: the token itself is
     * refused, named by its file and its place there */
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
    expect_batch_error(
        t, "shard_03.bin: token ",
        " at position 40 is >= vocab size 256: the file changed since it was opened");
    assert_int_equal(remove(path), 0);
    expect_batch_error(t, "shard_03.bin", "cannot open");
    regc_tokens_free(t);
    /* a mask rewritten beside its tokens */
    assert_int_equal(regc_tokens_write(path, tokens, 64), REGC_OK);
    t = open_tokens(f, "shard_*.bin", "shard_*.mask");
    uint8_t mask[64] = {0};
    snprintf(path, sizeof path, "%s", regc_test_path_in(f, "shard_03.mask"));
    assert_int_equal(regc_tokens_write_mask(path, mask, 64), REGC_OK);
    expect_batch_error(t, "shard_03.mask", "changed since it was opened");
    regc_tokens_free(t);
}

/* A name holding * ? [ that a file has is that file, never a pattern
 * standing in for others; a pattern matching a directory refuses it. */
static void test_literal_names_and_directories(void **state)
{
    regc_test_dir *f = *state;
    uint16_t one[40], other[40];
    for (int i = 0; i < 40; i++)
        one[i] = 1, other[i] = 2;
    char bracket[1024];
    snprintf(bracket, sizeof bracket, "%s", regc_test_path_in(f, "run[1].bin"));
    assert_int_equal(regc_tokens_write(bracket, one, 40), REGC_OK);
    assert_int_equal(regc_tokens_write(regc_test_path_in(f, "run1.bin"), other, 40), REGC_OK);
    regc_tokens *t = NULL;
    assert_int_equal(regc_tokens_open(bracket, VOCAB, &t), REGC_OK);
    int32_t in[8], tg[8];
    assert_int_equal(regc_tokens_batch(t, 0, 1, 8, in, tg), REGC_OK);
    assert_int_equal(in[0], 1); /* run[1].bin's, not run1.bin's */
    regc_tokens_free(t);
    assert_int_equal(regc_tokens_open(regc_test_path_in(f, "run[0-9].bin"), VOCAB, &t), REGC_OK);
    assert_int_equal(regc_tokens_batch(t, 0, 1, 8, in, tg), REGC_OK);
    assert_int_equal(in[0], 2); /* as a pattern it matches run1.bin alone */
    regc_tokens_free(t);

    char sub[1024];
    snprintf(sub, sizeof sub, "%s", regc_test_path_in(f, "run_dir.bin"));
    assert_int_equal(mkdir(sub, 0700), 0);
    t = (regc_tokens *)0x1;
    assert_int_not_equal(regc_tokens_open(regc_test_path_in(f, "run*.bin"), VOCAB, &t), REGC_OK);
    assert_null(t);
    regc_test_expect_error("run_dir.bin", "not a regular file");
    /* the headers alone, of a file that is no token file */
    assert_int_equal(regc_test_write_file(regc_test_path_in(f, "bad.bin"), "x", 1), 0);
    int64_t count = 0;
    assert_int_equal(regc_tokens_count_files(regc_test_path_in(f, "bad.bin"), &count),
                     REGC_ERR_FORMAT);
    regc_test_expect_error("bad.bin", "truncated header");
}

/* The step losses of gpt2-tiny trained on dir/data, B=2, T=16, with the
 * steps flag given; their number. */
static int train(regc_test_dir *f, const char *data, const char *steps_flag, const char *steps,
                 double *loss, int max)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", regc_test_path_in(f, data));
    const char *const args[] = {"--model", "gpt2-tiny", "--data",   path,  "--batch", "2",
                                "--seq",   "16",        steps_flag, steps, NULL};
    return regc_test_train_losses(loss, max, args, NULL);
}

static void test_train_on_a_pattern(void **state)
{
    regc_test_dir *f = *state;
    write_shards(f);
    double shards[TOTAL], whole[TOTAL];
    assert_int_equal(train(f, "shard_*.bin", "--steps", "4", shards, TOTAL), 4);
    assert_int_equal(train(f, "whole.bin", "--steps", "4", whole, TOTAL), 4);
    assert_memory_equal(shards, whole, 4 * sizeof *whole);
    /* the same tokens in llm.c's Llama 3 format (uint32): the same run */
    uint32_t wide[TOTAL];
    for (int64_t i = 0; i < TOTAL; i++)
        wide[i] = token_at(i);
    assert_int_equal(regc_tokens_write32(regc_test_path_in(f, "wide.bin"), wide, TOTAL), REGC_OK);
    assert_int_equal(train(f, "wide.bin", "--steps", "4", shards, TOTAL), 4);
    assert_memory_equal(shards, whole, 4 * sizeof *whole);
    /* one epoch of every shard: (202 - 1) / 32 = 6 batches */
    assert_int_equal(train(f, "shard_*.bin", "--num-train-epochs", "1", shards, TOTAL),
                     (TOTAL - 1) / 32);

    /* the run says what it read */
    regc_test_proc p;
    char pattern[1024];
    snprintf(pattern, sizeof pattern, "%s", regc_test_path_in(f, "shard_*.bin"));
    regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", pattern, "--batch", "2",
                       "--seq", "16", "--steps", "1", "--no-cache", NULL);
    assert_int_equal(p.status, 0);
    if (!strstr(p.err, "shard_*.bin: 4 files, 202 tokens, checked in"))
        fail_msg("no data line on stderr:\n%s", p.err);
    regc_test_proc_free(&p);

    /* the pattern unquoted: the shell hands regc the files */
    char first[1024], second[1024];
    snprintf(first, sizeof first, "%s", regc_test_path_in(f, "shard_00.bin"));
    snprintf(second, sizeof second, "%s", regc_test_path_in(f, "shard_01.bin"));
    regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--data", first, second, NULL);
    regc_test_expect_one_line_error(&p, 2, "after --data's value",
                                    "several files are one quoted pattern");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "5", second, NULL);
    regc_test_expect_one_line_error(&p, 2, "unexpected argument", "options start with --");
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_shards_read_as_their_concatenation, setup),
        regc_test_in_dir(test_shard_errors_name_the_file, setup),
        regc_test_in_dir(test_shard_changed_after_open, setup),
        regc_test_in_dir(test_literal_names_and_directories, setup),
        regc_test_in_dir(test_train_on_a_pattern, setup),
    };
    return cmocka_run_group_tests_name("shards", tests, NULL, NULL);
}
