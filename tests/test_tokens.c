/* test_tokens.c — llm.c token files: round trip, batch order (including
 * the wrap-around), llm.c's Llama 3 format of uint32 tokens, every error
 * message, and the built-in corpus. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_data.h"
#include "test_util.h"

/* f->path is dir/tokens.bin, the file each test writes. */
static int setup(void **state) { return regc_test_dir_setup(state, "tokens", "tokens.bin"); }

/* Opening path with `vocab` fails with `status` and no tokens, and the
 * error names the file and says `problem`. */
static void expect_open_error(const char *path, int64_t vocab, int status, const char *problem)
{
    regc_tokens *t = (regc_tokens *)0x1;
    assert_int_equal(regc_tokens_open(path, vocab, &t), status);
    assert_null(t);
    regc_test_expect_error(path, problem);
}

static void put_le32(unsigned char *p, int32_t value)
{
    uint32_t v = (uint32_t)value;
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A file with an arbitrary header and `n_body` tokens (i * 7 % 1000), for
 * the malformed cases regc_tokens_write cannot produce. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                      size_t n_body, size_t header_bytes)
{
    size_t size = header_bytes + n_body * 2;
    unsigned char *buf = calloc(1, size + 1024);
    assert_non_null(buf);
    put_le32(buf, magic);
    put_le32(buf + 4, version);
    put_le32(buf + 8, count);
    for (size_t i = 0; i < n_body; i++) {
        uint16_t tok = (uint16_t)(i * 7 % 1000);
        buf[header_bytes + 2 * i] = (unsigned char)(tok & 0xff);
        buf[header_bytes + 2 * i + 1] = (unsigned char)(tok >> 8);
    }
    assert_int_equal(regc_test_write_file(path, buf, size), 0);
    free(buf);
}

static void test_round_trip(void **state)
{
    regc_test_dir *f = *state;
    enum { N = 300 };
    uint16_t tokens[N];
    for (int i = 0; i < N; i++)
        tokens[i] = (uint16_t)(i * 219 + 3); /* wraps through high bytes too */
    tokens[7] = 65535;
    assert_int_equal(regc_tokens_write(f->path, tokens, N), REGC_OK);

    /* The bytes on disk are exactly the llm.c layout, little-endian. */
    size_t size;
    unsigned char *raw = (unsigned char *)regc_test_read_file(f->path, &size);
    assert_non_null(raw);
    assert_int_equal(size, 1024 + 2 * N);
    unsigned char header[12];
    put_le32(header, 20240520);
    put_le32(header + 4, 1);
    put_le32(header + 8, N);
    assert_memory_equal(raw, header, sizeof header);
    for (int i = 3; i < 256; i++)
        assert_int_equal(raw[4 * i] | raw[4 * i + 1] | raw[4 * i + 2] | raw[4 * i + 3], 0);
    assert_int_equal(raw[1024 + 14], 0xff);
    assert_int_equal(raw[1024 + 15], 0xff);
    free(raw);

    regc_tokens *t;
    assert_int_equal(regc_tokens_open(f->path, 65536, &t), REGC_OK);
    assert_int_equal(regc_tokens_count(t), N);
    int32_t in[N - 1], tg[N - 1];
    assert_int_equal(regc_tokens_batch(t, 0, 1, N - 1, in, tg), REGC_OK);
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(in[i], tokens[i]);
        assert_int_equal(tg[i], tokens[i + 1]);
    }
    regc_tokens_free(t);

    /* An empty file is valid; it just cannot make a batch. */
    assert_int_equal(regc_tokens_write(f->path, tokens, 0), REGC_OK);
    assert_int_equal(regc_tokens_open(f->path, 50257, &t), REGC_OK);
    assert_int_equal(regc_tokens_count(t), 0);
    regc_tokens_free(t);
}

/* Worked by hand: 20 tokens, B=2, T=3 (B*T = 6). Batches start at 0, 6,
 * 12 (12+6+1 = 19 <= 20), then 18 fails the rule (18+6+1 = 25 > 20), so
 * the 4th batch starts again at 0. */
static void test_batch_order_hand_worked(void **state)
{
    regc_test_dir *f = *state;
    uint16_t tokens[20];
    for (int i = 0; i < 20; i++)
        tokens[i] = (uint16_t)(100 + i);
    assert_int_equal(regc_tokens_write(f->path, tokens, 20), REGC_OK);
    regc_tokens *t;
    assert_int_equal(regc_tokens_open(f->path, 50257, &t), REGC_OK);

    const int starts[8] = {0, 6, 12, 0, 6, 12, 0, 6};
    for (int k = 0; k < 8; k++) {
        int32_t in[6], tg[6];
        assert_int_equal(regc_tokens_batch(t, k, 2, 3, in, tg), REGC_OK);
        for (int b = 0; b < 2; b++)
            for (int s = 0; s < 3; s++) {
                /* rows of T: row b holds tokens[p + b*T .. p + b*T + T-1] */
                assert_int_equal(in[b * 3 + s], 100 + starts[k] + b * 3 + s);
                assert_int_equal(tg[b * 3 + s], 100 + starts[k] + b * 3 + s + 1);
            }
    }
    /* Batch 2 reads tokens 12..18 (inputs 12..17, targets 13..18); token 19
     * is never used, since a 4th batch at 18 would need 7 more tokens. */
    int32_t in[6], tg[6];
    assert_int_equal(regc_tokens_batch(t, 2, 2, 3, in, tg), REGC_OK);
    assert_int_equal(tg[5], 118);
    regc_tokens_free(t);
}

/* The direct formula against a literal replay of llm.c's loader. */
static void test_batch_order_matches_simulation(void **state)
{
    regc_test_dir *f = *state;
    enum { MAXN = 64 };
    uint16_t tokens[MAXN];
    for (int i = 0; i < MAXN; i++)
        tokens[i] = (uint16_t)i;
    for (int n = 2; n <= MAXN; n += 3) {
        assert_int_equal(regc_tokens_write(f->path, tokens, n), REGC_OK);
        regc_tokens *t;
        assert_int_equal(regc_tokens_open(f->path, 256, &t), REGC_OK);
        for (int b = 1; b <= 4; b++)
            for (int s = 1; s <= 7; s++) {
                int bt = b * s;
                if (n < bt + 1)
                    continue;
                int p = 0;
                for (int k = 0; k < 40; k++) {
                    int32_t in[28], tg[28];
                    assert_int_equal(regc_tokens_batch(t, k, b, s, in, tg), REGC_OK);
                    assert_int_equal(in[0], p);
                    assert_int_equal(tg[bt - 1], p + bt);
                    p += bt;
                    if (p + bt + 1 > n)
                        p = 0;
                }
            }
        regc_tokens_free(t);
    }
}

static void test_error_cannot_open(void **state)
{
    regc_test_dir *f = *state;
    expect_open_error(f->path, 50257, REGC_ERR_IO, "cannot open"); /* never written */
}

static void test_error_truncated_header(void **state)
{
    regc_test_dir *f = *state;
    write_raw(f->path, 20240520, 1, 0, 0, 1000); /* 24 bytes short of a header */
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT, "truncated header");

    assert_int_equal(regc_test_write_file(f->path, "", 0), 0);
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT, "truncated header");
}

static void test_error_bad_magic(void **state)
{
    regc_test_dir *f = *state;
    write_raw(f->path, 12345678, 1, 10, 10, 1024);
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT, "bad magic 12345678");
}

static void test_error_unsupported_version(void **state)
{
    regc_test_dir *f = *state;
    write_raw(f->path, 20240520, 2, 10, 10, 1024); /* llm.c's Llama 3 files have their own magic */
    expect_open_error(f->path, 50257, REGC_ERR_UNSUPPORTED, "unsupported version 2");
    write_raw(f->path, 20240801, 1, 10, 10, 1024);
    expect_open_error(f->path, 50257, REGC_ERR_UNSUPPORTED,
                      "unsupported version 1 (regc reads version 7 of magic 20240801)");
}

/* llm.c's Llama 3 files (magic 20240801, version 7, uint32 tokens): ids
 * past 65,535 read back as written, the same small tokens give the uint16
 * file's batches, and a token past the vocabulary is named. */
static void test_llama3_format(void **state)
{
    regc_test_dir *f = *state;
    enum { N = 500, VOCAB3 = 128256 };
    uint32_t wide[N];
    for (int i = 0; i < N; i++)
        wide[i] = (uint32_t)((i * 9973u + 65530u) % VOCAB3);
    assert_int_equal(regc_tokens_write32(f->path, wide, N), REGC_OK);
    regc_tokens *t = NULL;
    assert_int_equal(regc_tokens_open(f->path, VOCAB3, &t), REGC_OK);
    assert_int_equal(regc_tokens_count(t), N);
    int32_t in[4 * 16], tg[4 * 16];
    assert_int_equal(regc_tokens_batch(t, 2, 4, 16, in, tg), REGC_OK);
    for (int i = 0; i < 4 * 16; i++) {
        assert_int_equal(in[i], (int32_t)wide[2 * 64 + i]);
        assert_int_equal(tg[i], (int32_t)wide[2 * 64 + i + 1]);
    }
    regc_tokens_free(t);
    expect_open_error(f->path, 100000, REGC_ERR_FORMAT, "is >= vocab size 100000");

    /* small ids in either format: the same batches, shuffled too */
    uint16_t narrow[N];
    for (int i = 0; i < N; i++)
        wide[i] %= 1000, narrow[i] = (uint16_t)wide[i];
    char *other = regc_test_join(f->dir, "narrow.bin");
    assert_int_equal(regc_tokens_write32(f->path, wide, N), REGC_OK);
    assert_int_equal(regc_tokens_write(other, narrow, N), REGC_OK);
    regc_tokens *a = NULL, *b = NULL;
    assert_int_equal(regc_tokens_open(f->path, 1000, &a), REGC_OK);
    assert_int_equal(regc_tokens_open(other, 1000, &b), REGC_OK);
    int32_t in2[4 * 16], tg2[4 * 16];
    for (int shuffled = 0; shuffled < 2; shuffled++)
        for (int64_t k = 0; k < 12; k++) {
            regc_tokens_set_shuffle(a, shuffled, 3), regc_tokens_set_shuffle(b, shuffled, 3);
            assert_int_equal(regc_tokens_batch(a, k, 4, 16, in, tg), REGC_OK);
            assert_int_equal(regc_tokens_batch(b, k, 4, 16, in2, tg2), REGC_OK);
            assert_memory_equal(in, in2, sizeof in);
            assert_memory_equal(tg, tg2, sizeof tg);
        }
    regc_tokens_free(a), regc_tokens_free(b);
    /* a pattern of both formats: one format a stream */
    char *both = regc_test_join(f->dir, "*.bin");
    a = (regc_tokens *)0x1;
    assert_int_equal(regc_tokens_open(both, 1000, &a), REGC_ERR_FORMAT);
    assert_null(a);
    regc_test_expect_error("tokens.bin: llm.c's Llama 3 format (uint32 tokens)",
                           "the files before it are of 2-byte tokens");
    int64_t count = -1;
    assert_int_equal(regc_tokens_count_files(both, &count), REGC_ERR_FORMAT);
    assert_int_equal(count, 0);
    /* inspected without a vocabulary, an id past int32 is still refused */
    wide[3] = 0x80000001u;
    assert_int_equal(regc_tokens_write32(f->path, wide, N), REGC_OK);
    assert_int_equal(regc_tokens_open(f->path, 0, &a), REGC_OK);
    assert_int_equal(regc_tokens_batch(a, 0, 1, 8, in, tg), REGC_ERR_FORMAT);
    regc_test_expect_error("tokens.bin: token 2147483649 at position 3",
                           "does not fit a model's int32 ids");
    regc_tokens_free(a);
    free(other), free(both);
}

static void test_error_truncated_body(void **state)
{
    regc_test_dir *f = *state;
    write_raw(f->path, 20240520, 1, 50, 10, 1024);
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT,
                      "truncated: header says 50 tokens, file holds 10");

    /* A half token at the end counts as missing, not as a token. */
    write_raw(f->path, 20240520, 1, 50, 10, 1024);
    FILE *fp = fopen(f->path, "ab");
    assert_non_null(fp);
    fputc(1, fp);
    fclose(fp);
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT,
                      "truncated: header says 50 tokens, file holds 10");
}

static void test_error_trailing_bytes(void **state)
{
    regc_test_dir *f = *state;
    write_raw(f->path, 20240520, 1, 10, 12, 1024);
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT, "header says 10 tokens");
}

static void test_error_token_out_of_vocab(void **state)
{
    regc_test_dir *f = *state;
    uint16_t tokens[200];
    for (int i = 0; i < 200; i++)
        tokens[i] = (uint16_t)(i % 50);
    tokens[123] = 60000;
    tokens[150] = 65535; /* only the first offender is reported */
    assert_int_equal(regc_tokens_write(f->path, tokens, 200), REGC_OK);
    expect_open_error(f->path, 50257, REGC_ERR_FORMAT,
                      "token 60000 at position 123 is >= vocab size 50257");

    /* The bound is exclusive: vocab-1 is fine, vocab is not. */
    tokens[123] = 49;
    tokens[150] = 50;
    assert_int_equal(regc_tokens_write(f->path, tokens, 200), REGC_OK);
    expect_open_error(f->path, 50, REGC_ERR_FORMAT, "token 50 at position 150 is >= vocab size 50");
    regc_tokens *t;
    assert_int_equal(regc_tokens_open(f->path, 51, &t), REGC_OK);
    regc_tokens_free(t);
}

static void test_error_too_few_tokens_for_batch(void **state)
{
    regc_test_dir *f = *state;
    uint16_t tokens[12] = {0};
    assert_int_equal(regc_tokens_write(f->path, tokens, 12), REGC_OK);
    regc_tokens *t;
    assert_int_equal(regc_tokens_open(f->path, 50257, &t), REGC_OK);
    int32_t in[16], tg[16];
    /* 12 tokens make exactly one 11-token batch (plus the shifted target)... */
    assert_int_equal(regc_tokens_batch(t, 5, 1, 11, in, tg), REGC_OK);
    /* ...but not 12. */
    assert_int_equal(regc_tokens_batch(t, 0, 3, 4, in, tg), REGC_ERR_SHAPE);
    regc_test_expect_error(f->path, "12 tokens are too few for a batch of 3 x 4");
    regc_test_expect_error(f->path, "at least 13");
    assert_int_equal(regc_tokens_batch(t, 0, 0, 4, in, tg), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "must be > 0");
    assert_int_equal(regc_tokens_batch(t, -1, 1, 4, in, tg), REGC_ERR_ARG);
    assert_int_equal(regc_tokens_batch(t, 0, INT64_MAX / 2, 4, in, tg), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "overflows");
    regc_tokens_free(t);
}

static void test_write_error_leaves_nothing(void **state)
{
    regc_test_dir *f = *state;
    char path[1100];
    snprintf(path, sizeof path, "%s/no/such/dir/tokens.bin", f->dir);
    uint16_t tokens[4] = {1, 2, 3, 4};
    assert_int_equal(regc_tokens_write(path, tokens, 4), REGC_ERR_IO);
    regc_test_expect_error(path, NULL);
    assert_int_equal(regc_tokens_write(f->path, tokens, -1), REGC_ERR_ARG);
    regc_test_expect_error(f->path, NULL);
}

static void test_builtin_corpus(void **state)
{
    (void)state;
    regc_tokens *t;
    assert_int_equal(regc_tokens_builtin(&t), REGC_OK);
    int64_t n = regc_tokens_count(t);
    assert_true(n > 4000);
    int32_t *in = malloc((size_t)(n - 1) * sizeof *in), *tg = malloc((size_t)(n - 1) * sizeof *tg);
    assert_non_null(in);
    assert_non_null(tg);
    assert_int_equal(regc_tokens_batch(t, 0, 1, n - 1, in, tg), REGC_OK);
    int spaces = 0;
    for (int64_t i = 0; i < n - 1; i++) {
        assert_true(in[i] >= 0 && in[i] < 256);
        spaces += in[i] == ' ';
    }
    assert_true(tg[n - 2] >= 0 && tg[n - 2] < 256);
    /* Plain English prose: about one byte in six is a space. */
    assert_true(spaces > n / 10);
    /* Batch errors name the corpus, as they name a file. */
    assert_int_equal(regc_tokens_batch(t, 0, 1, n, in, tg), REGC_ERR_SHAPE);
    regc_test_expect_error("built-in corpus", "too few");
    free(in);
    free(tg);
    regc_tokens_free(t);
}

/* A file image in memory reads as the file does, and its errors name the
 * source given; a mask image is checked against the tokens' count. */
static void test_parse_memory(void **state)
{
    (void)state;
    unsigned char image[1024 + 2 * 5] = {0};
    put_le32(image, 20240520);
    put_le32(image + 4, 1);
    put_le32(image + 8, 5);
    for (int i = 0; i < 5; i++)
        image[1024 + 2 * i] = (unsigned char)(10 * i);
    regc_tokens *t = NULL;
    assert_int_equal(regc_tokens_parse("mem.bin", image, sizeof image, 50, &t), REGC_OK);
    assert_int_equal(regc_tokens_count(t), 5);
    int32_t in[4], tg[4];
    assert_int_equal(regc_tokens_batch(t, 0, 1, 4, in, tg), REGC_OK);
    assert_int_equal(in[3], 30);
    assert_int_equal(tg[3], 40);

    unsigned char mask[1024 + 5] = {0};
    put_le32(mask, 20240601);
    put_le32(mask + 4, 1);
    put_le32(mask + 8, 5);
    mask[1024 + 2] = 1;
    assert_int_equal(regc_tokens_parse_mask(t, "mem.mask", mask, sizeof mask), REGC_OK);
    assert_int_equal(regc_tokens_batch(t, 0, 1, 4, in, tg), REGC_OK);
    assert_int_equal(tg[0], -1);
    assert_int_equal(tg[1], 20);
    mask[1024 + 4] = 2;
    assert_int_equal(regc_tokens_parse_mask(t, "mem.mask", mask, sizeof mask), REGC_ERR_FORMAT);
    regc_test_expect_error("mem.mask", "byte 4 is 2");
    assert_int_equal(regc_tokens_parse_mask(t, "mem.mask", mask, 1000), REGC_ERR_FORMAT);
    regc_test_expect_error("mem.mask", "truncated header");
    regc_tokens_free(t);

    t = (regc_tokens *)0x1;
    assert_int_equal(regc_tokens_parse("mem.bin", image, sizeof image, 40, &t), REGC_ERR_FORMAT);
    assert_null(t);
    regc_test_expect_error("mem.bin", "token 40 at position 4 is >= vocab size 40");
    assert_int_equal(regc_tokens_parse("mem.bin", image, sizeof image - 1, 50, &t),
                     REGC_ERR_FORMAT);
    regc_test_expect_error("mem.bin", "truncated: header says 5 tokens");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_memory),
        regc_test_in_dir(test_round_trip, setup),
        regc_test_in_dir(test_batch_order_hand_worked, setup),
        regc_test_in_dir(test_batch_order_matches_simulation, setup),
        regc_test_in_dir(test_error_cannot_open, setup),
        regc_test_in_dir(test_error_truncated_header, setup),
        regc_test_in_dir(test_error_bad_magic, setup),
        regc_test_in_dir(test_error_unsupported_version, setup),
        regc_test_in_dir(test_llama3_format, setup),
        regc_test_in_dir(test_error_truncated_body, setup),
        regc_test_in_dir(test_error_trailing_bytes, setup),
        regc_test_in_dir(test_error_token_out_of_vocab, setup),
        regc_test_in_dir(test_error_too_few_tokens_for_batch, setup),
        regc_test_in_dir(test_write_error_leaves_nothing, setup),
        cmocka_unit_test(test_builtin_corpus),
    };
    return cmocka_run_group_tests_name("tokens", tests, NULL, NULL);
}
