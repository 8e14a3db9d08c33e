/* test_safetensors.c — the safetensors reader and writer: round trips,
 * BF16/F16 conversion against known bit patterns, and the error message of
 * every malformed-file case (each must name the file and the problem). */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "regc_common.h"
#include "regc_models.h"
#include "test_util.h"

/* f->path is dir/t.safetensors, the file each test writes. */
static int setup(void **state)
{
    return regc_test_dir_setup(state, "safetensors", "t.safetensors");
}

/* A file with the given header length field, header text and data bytes. */
static void write_raw_len(const char *path, uint64_t hlen, const char *header, const void *data,
                          size_t n)
{
    size_t h = strlen(header), total = 8 + h + n;
    unsigned char *buf = malloc(total);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, h);
    if (n)
        memcpy(buf + 8 + h, data, n);
    assert_int_equal(regc_test_write_file(path, buf, total), 0);
    free(buf);
}

static void write_raw(const char *path, const char *header, const void *data, size_t n)
{
    write_raw_len(path, strlen(header), header, data, n);
}

/* path fails to open with REGC_ERR_FORMAT and an error that names it and
 * says `what`. */
static void expect_open_error(const char *path, const char *what)
{
    regc_st_file *st;
    assert_int_equal(regc_st_open(path, &st), REGC_ERR_FORMAT);
    regc_test_expect_error(path, what);
}

static uint32_t bits_of(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static void test_round_trip(void **state)
{
    regc_test_dir *f = *state;
    float a[6] = {1.5f, -2.0f, 0.0f, 3.25e-7f, 1e30f, -0.0f};
    float b[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    float s = 42.0f;
    regc_st_entry e[3] = {
        {.name = "layer.a", .dtype = REGC_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b \"quoted\"", .dtype = REGC_F32, .ndim = 1, .shape = {4}, .data = b},
        {.name = "scalar", .dtype = REGC_F32, .ndim = 0, .data = &s},
    };
    assert_int_equal(regc_st_write(f->path, e, 3), REGC_OK);

    /* The header is padded to 8 bytes and carries the pt format tag. */
    size_t size;
    char *raw = regc_test_read_file(f->path, &size);
    assert_non_null(raw);
    uint64_t hlen = 0;
    memcpy(&hlen, raw, 8);
    assert_int_equal(hlen % 8, 0);
    assert_int_equal(size, 8 + hlen + sizeof a + sizeof b + sizeof s);
    assert_non_null(strstr(raw + 8, "\"__metadata__\":{\"format\":\"pt\"}"));
    free(raw);

    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    assert_int_equal(regc_st_count(st), 3);
    assert_string_equal(regc_st_name(st, 0), "layer.a");
    assert_string_equal(regc_st_name(st, 1), "b \"quoted\"");
    assert_null(regc_st_name(st, 3));
    assert_int_equal(regc_st_find(st, "scalar"), 2);
    assert_int_equal(regc_st_find(st, "b \"quoted\""), 1);
    assert_int_equal(regc_st_find(st, "nope"), -1);

    float ra[6], rb[4], rs;
    const int64_t sa[] = {2, 3}, sb[] = {4};
    assert_int_equal(regc_st_read_f32(st, 0, 2, sa, ra), REGC_OK);
    assert_int_equal(regc_st_read_f32(st, 1, 1, sb, rb), REGC_OK);
    assert_int_equal(regc_st_read_f32(st, 2, 0, NULL, &rs), REGC_OK);
    assert_memory_equal(ra, a, sizeof a);
    assert_memory_equal(rb, b, sizeof b);
    assert_true(rs == 42.0f);
    regc_st_close(st);
}

static void test_empty_file_list(void **state)
{
    regc_test_dir *f = *state;
    assert_int_equal(regc_st_write(f->path, NULL, 0), REGC_OK);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    assert_int_equal(regc_st_count(st), 0);
    regc_st_close(st);
}

static void test_bf16_bits(void **state)
{
    regc_test_dir *f = *state;
    /* 1, -2, +inf, the smallest bf16 subnormal (2^-133), pi rounded, -0 */
    const uint16_t v[6] = {0x3f80, 0xc000, 0x7f80, 0x0001, 0x4049, 0x8000};
    write_raw(f->path,
              "{\"__metadata__\":{\"format\":\"pt\"},"
              "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
              v, sizeof v);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    float out[6];
    const int64_t shape[] = {2, 3};
    assert_int_equal(regc_st_read_f32(st, 0, 2, shape, out), REGC_OK);
    regc_st_close(st);
    assert_true(out[0] == 1.0f);
    assert_true(out[1] == -2.0f);
    assert_true(isinf(out[2]) && out[2] > 0);
    assert_true(out[3] == ldexpf(1.0f, -133));
    assert_int_equal(bits_of(out[4]), 0x40490000u); /* 3.140625 */
    assert_int_equal(bits_of(out[5]), 0x80000000u);
}

static void test_f16_bits(void **state)
{
    regc_test_dir *f = *state;
    const uint16_t v[10] = {
        0x3c00, /* 1 */
        0xc000, /* -2 */
        0x0001, /* 2^-24, smallest subnormal */
        0x03ff, /* 1023 * 2^-24, largest subnormal */
        0x0400, /* 2^-14, smallest normal */
        0x7bff, /* 65504, largest finite */
        0x7c00, /* +inf */
        0xfc00, /* -inf */
        0x8000, /* -0 */
        0x7e00, /* NaN */
    };
    write_raw(f->path, "{\"h\":{\"dtype\":\"F16\",\"shape\":[10],\"data_offsets\":[0,20]}}    ", v,
              sizeof v);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    float out[10];
    const int64_t shape[] = {10};
    assert_int_equal(regc_st_read_f32(st, 0, 1, shape, out), REGC_OK);
    regc_st_close(st);
    assert_true(out[0] == 1.0f);
    assert_true(out[1] == -2.0f);
    assert_true(out[2] == ldexpf(1.0f, -24));
    assert_true(out[3] == ldexpf(1023.0f, -24));
    assert_true(out[4] == ldexpf(1.0f, -14));
    assert_true(out[5] == 65504.0f);
    assert_true(isinf(out[6]) && out[6] > 0);
    assert_true(isinf(out[7]) && out[7] < 0);
    assert_int_equal(bits_of(out[8]), 0x80000000u);
    assert_true(isnan(out[9]));
}

/* A tensor longer than the reader's bounce buffer converts every chunk. */
static void test_f16_large(void **state)
{
    regc_test_dir *f = *state;
    enum { N = 200003 };
    float *src = malloc(N * sizeof *src), *back = malloc(N * sizeof *back);
    assert_non_null(src);
    assert_non_null(back);
    for (int i = 0; i < N; i++)
        src[i] = (float)(i % 2048) - 1024.0f; /* exact in f16 */
    regc_st_entry e = {.name = "big", .dtype = REGC_F16, .ndim = 1, .shape = {N}, .data = src};
    assert_int_equal(regc_st_write(f->path, &e, 1), REGC_OK);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    const int64_t shape[] = {N};
    assert_int_equal(regc_st_read_f32(st, 0, 1, shape, back), REGC_OK);
    regc_st_close(st);
    assert_memory_equal(src, back, N * sizeof *src);
    free(src);
    free(back);
}

/* Writing BF16/F16 rounds to nearest even, subnormals and overflow included. */
static void test_write_half_rounding(void **state)
{
    regc_test_dir *f = *state;
    const float in_b[4] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.5f, 0x1p-130f};
    const float want_b[4] = {1.0f, 1.0f + 0x1p-6f, -1.5f, 0x1p-130f};
    const float in_h[5] = {1.0f + 0x1p-11f, 65520.0f, 0x1p-25f, 3 * 0x1p-25f, -0.333333f};
    const float want_h[5] = {1.0f, INFINITY, 0.0f, 0x1p-23f, -0.33325195f};
    regc_st_entry e[2] = {
        {.name = "b", .dtype = REGC_BF16, .ndim = 1, .shape = {4}, .data = in_b},
        {.name = "h", .dtype = REGC_F16, .ndim = 1, .shape = {5}, .data = in_h},
    };
    assert_int_equal(regc_st_write(f->path, e, 2), REGC_OK);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    float ob[4], oh[5];
    const int64_t s4[] = {4}, s5[] = {5};
    assert_int_equal(regc_st_read_f32(st, 0, 1, s4, ob), REGC_OK);
    assert_int_equal(regc_st_read_f32(st, 1, 1, s5, oh), REGC_OK);
    regc_st_close(st);
    for (int i = 0; i < 4; i++)
        assert_int_equal(bits_of(ob[i]), bits_of(want_b[i]));
    for (int i = 0; i < 5; i++)
        assert_int_equal(bits_of(oh[i]), bits_of(want_h[i]));
}

static void test_err_missing_file(void **state)
{
    regc_test_dir *f = *state;
    regc_st_file *st = (regc_st_file *)1;
    assert_int_equal(regc_st_open(f->path, &st), REGC_ERR_IO);
    assert_null(st);
    regc_test_expect_error(f->path, "cannot open");
}

static void test_err_header_length(void **state)
{
    regc_test_dir *f = *state;
    const char *h = "{}      ";
    write_raw_len(f->path, 1000, h, NULL, 0);
    expect_open_error(f->path, "header length 1000 exceeds file size 16");

    write_raw_len(f->path, UINT64_MAX, h, NULL, 0);
    expect_open_error(f->path, "header length 18446744073709551615 exceeds file size 16");

    write_raw_len(f->path, 0, h, NULL, 0);
    expect_open_error(f->path, "header length 0 is implausible");

    assert_int_equal(regc_test_write_file(f->path, "abc", 3), 0);
    expect_open_error(f->path, "too short");
}

static void test_err_malformed_json(void **state)
{
    regc_test_dir *f = *state;
    write_raw(f->path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],", NULL, 0);
    expect_open_error(f->path, "malformed header JSON");

    write_raw(f->path, "{}xx", NULL, 0);
    expect_open_error(f->path, "trailing data");

    write_raw(f->path, "[1,2]", NULL, 0);
    expect_open_error(f->path, "not a JSON object");

    write_raw(f->path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", NULL,
              0);
    expect_open_error(f->path, "tensor w: \"shape\"");

    write_raw(f->path, "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd", 4);
    expect_open_error(f->path, "tensor w: missing or invalid \"dtype\"");

    write_raw(f->path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", "abcd",
              4);
    expect_open_error(f->path, "tensor w: \"data_offsets\"");
}

static void test_err_truncated(void **state)
{
    regc_test_dir *f = *state;
    float d[3] = {1, 2, 3};
    write_raw(f->path,
              "{\"ok\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[4,28]}}",
              d, sizeof d);
    expect_open_error(f->path, "truncated");
    regc_test_expect_error(f->path,
                           "tensor w ends at byte 28 of the data section, which has 12 bytes");
}

static void test_err_offsets_vs_shape(void **state)
{
    regc_test_dir *f = *state;
    float d[6] = {0};
    write_raw(f->path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", d,
              sizeof d);
    expect_open_error(f->path, "tensor w: data_offsets [0, 20] hold 20 bytes but shape [2, 3] "
                               "of F32 needs 24");
}

static void test_err_duplicate(void **state)
{
    regc_test_dir *f = *state;
    float d[1] = {0};
    write_raw(f->path,
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
              d, sizeof d);
    expect_open_error(f->path, "duplicate tensor w");
}

static void test_err_wrong_shape_and_index(void **state)
{
    regc_test_dir *f = *state;
    float d[6] = {0};
    regc_st_entry e = {.name = "w", .dtype = REGC_F32, .ndim = 2, .shape = {2, 3}, .data = d};
    assert_int_equal(regc_st_write(f->path, &e, 1), REGC_OK);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    float out[6];
    const int64_t s32[] = {3, 2}, s6[] = {6};
    assert_int_equal(regc_st_read_f32(st, 0, 2, s32, out), REGC_ERR_SHAPE);
    regc_test_expect_error(f->path, "tensor w has shape [2, 3], expected [3, 2]");
    assert_int_equal(regc_st_read_f32(st, 0, 1, s6, out), REGC_ERR_SHAPE);
    regc_test_expect_error(f->path, "expected [6]");
    assert_int_equal(regc_st_read_f32(st, 1, 1, s6, out), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "no tensor with index 1");
    assert_int_equal(regc_st_find(st, "missing"), -1);
    regc_st_close(st);
}

/* The data section is tiled exactly by the tensors, as the format
 * requires: two tensors sharing bytes (the same range, or ranges that
 * start together), a gap between tensors, bytes after the last one, or
 * data with no tensor at all are each refused, naming the file and the
 * tensors. */
static void test_err_layout(void **state)
{
    regc_test_dir *f = *state;
    unsigned char d[16] = {0};
    write_raw(f->path,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
              d, 8);
    expect_open_error(f->path, "tensors a [0, 8) and b [0, 8) overlap");

    write_raw(f->path,
              "{\"big\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"small\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
              d, 16);
    expect_open_error(f->path, "tensors small [0, 4) and big [0, 16) overlap");

    write_raw(f->path,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              d, 12);
    expect_open_error(f->path, "tensors a [0, 8) and b [4, 12) overlap");

    write_raw(f->path,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              d, 12);
    expect_open_error(f->path, "bytes [4, 8) of the data belong to no tensor");
    regc_test_expect_error(f->path, "after tensor a before tensor b");

    write_raw(f->path, "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8);
    expect_open_error(f->path, "bytes [0, 4) of the data belong to no tensor");

    write_raw(f->path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 7);
    expect_open_error(f->path, "3 bytes of data after the last tensor a");

    write_raw(f->path, "{\"__metadata__\":{}}", d, 5);
    expect_open_error(f->path, "5 bytes of data after the header");

    /* Empty tensors take no bytes, wherever they sit in the order. */
    float one = 1.0f;
    write_raw(f->path,
              "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"z\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[4,4]}}",
              &one, 4);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    assert_int_equal(regc_st_count(st), 3);
    regc_st_close(st);
}

/* A tensor name is the file's text: a newline or escape in it must not
 * break the one-line message. */
static void test_err_message_one_line(void **state)
{
    regc_test_dir *f = *state;
    unsigned char d[8] = {0};
    write_raw(f->path,
              "{\"a\\nb\\u001b[2J\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", d,
              8);
    expect_open_error(f->path, "tensor a?b?[2J: data_offsets");
}

/* A file image in memory reads as the same file on disk does. */
static void test_parse_memory_image(void **state)
{
    regc_test_dir *f = *state;
    float a[3] = {1.0f, -2.5f, 3.0f};
    regc_st_entry e = {.name = "a", .dtype = REGC_BF16, .ndim = 1, .shape = {3}, .data = a};
    assert_int_equal(regc_st_write(f->path, &e, 1), REGC_OK);
    size_t size;
    char *image = regc_test_read_file(f->path, &size);
    assert_non_null(image);
    regc_st_file *st;
    assert_int_equal(regc_st_parse("image", image, size, &st), REGC_OK);
    assert_int_equal(regc_st_find(st, "a"), 0);
    float out[3];
    const int64_t s3[] = {3};
    assert_int_equal(regc_st_read_f32(st, 0, 1, s3, out), REGC_OK);
    assert_memory_equal(out, a, sizeof a);
    regc_st_close(st);
    assert_int_equal(regc_st_parse("image", image, size - 1, &st), REGC_ERR_FORMAT);
    regc_test_expect_error("image", "tensor a ends at byte 6");
    assert_null(st);
    assert_int_equal(regc_st_parse("image", image, 5, &st), REGC_ERR_FORMAT);
    regc_test_expect_error("image", "too short");
    free(image);
}

/* Other dtypes are part of a valid file; only reading them is an error. */
static void test_unknown_dtype_on_read(void **state)
{
    regc_test_dir *f = *state;
    unsigned char d[8 + 4 + 3] = {0};
    float one = 1.0f;
    memcpy(d + 8, &one, 4);
    write_raw(f->path,
              "{\"pos\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
              "\"odd\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[12,15]}}",
              d, sizeof d);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    const int64_t s1[] = {1};
    float out[2];
    assert_int_equal(regc_st_read_f32(st, regc_st_find(st, "w"), 1, s1, out), REGC_OK);
    assert_true(out[0] == 1.0f);
    assert_int_equal(regc_st_read_f32(st, regc_st_find(st, "pos"), 1, s1, out),
                     REGC_ERR_UNSUPPORTED);
    regc_test_expect_error(f->path, "tensor pos has dtype I64");
    assert_int_equal(regc_st_read_f32(st, regc_st_find(st, "odd"), 1, s1, out),
                     REGC_ERR_UNSUPPORTED);
    regc_test_expect_error(f->path, "dtype X9");
    regc_st_close(st);

    /* A known dtype still has its byte count checked at open. */
    write_raw(f->path, "{\"pos\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    expect_open_error(f->path, "shape [1] of I64 needs 8");
}

/* A rank reads only its elements: every range of every dtype equals the
 * same elements of the whole tensor, and a range past the end is refused
 * by tensor name. */
static void test_read_range(void **state)
{
    regc_test_dir *f = *state;
    enum { N = 37 };
    float src[N];
    for (int i = 0; i < N; i++)
        src[i] = 0.37f * (float)i - 5.1f;
    regc_st_entry e[3] = {
        {.name = "f", .dtype = REGC_F32, .ndim = 1, .shape = {N}, .data = src},
        {.name = "b", .dtype = REGC_BF16, .ndim = 1, .shape = {N}, .data = src},
        {.name = "h", .dtype = REGC_F16, .ndim = 1, .shape = {N}, .data = src},
    };
    assert_int_equal(regc_st_write(f->path, e, 3), REGC_OK);
    regc_st_file *st;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    const int64_t shape[] = {N};
    for (int t = 0; t < 3; t++) {
        float whole[N], part[N];
        assert_int_equal(regc_st_read_f32(st, t, 1, shape, whole), REGC_OK);
        for (int first = 0; first <= N; first += 6)
            for (int n = 0; first + n <= N; n += 5) {
                assert_int_equal(regc_st_read_range(st, t, first, n, part), REGC_OK);
                assert_memory_equal(part, whole + first, (size_t)n * sizeof(float));
            }
    }
    float out[N];
    assert_int_equal(regc_st_read_range(st, 1, 30, 8, out), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "tensor b has 37 elements, not [30, 38)");
    assert_int_equal(regc_st_read_range(st, 0, -1, 2, out), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "tensor f");
    regc_st_close(st);
}

/* The streaming writer, fed pieces out of order, writes the same bytes as
 * the one-shot writer; a tensor never put reads as zeros. */
static void test_writer_in_pieces(void **state)
{
    regc_test_dir *f = *state;
    enum { N = 23 };
    float a[N], b[6] = {1, -2, 3.5f, 4, 5, 6};
    for (int i = 0; i < N; i++)
        a[i] = 1.0f / (float)(i + 1);
    regc_st_entry e[3] = {
        {.name = "a", .dtype = REGC_BF16, .ndim = 1, .shape = {N}, .data = a},
        {.name = "b", .dtype = REGC_F32, .ndim = 2, .shape = {2, 3}, .data = b},
        {.name = "z", .dtype = REGC_F16, .ndim = 1, .shape = {4}, .data = NULL},
    };
    float zeros[4] = {0};
    e[2].data = zeros;
    char one[1200];
    snprintf(one, sizeof one, "%s/one.safetensors", f->dir);
    assert_int_equal(regc_st_write(one, e, 3), REGC_OK);

    e[2].data = NULL;
    regc_st_writer *w;
    assert_int_equal(regc_st_writer_open(f->path, e, 3, 0, &w), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 1, 3, 3, b + 3), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 0, 10, N - 10, a + 10), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 1, 0, 3, b), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 0, 0, 10, a), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 0, 20, 4, a), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "tensor a has 23 elements, not [20, 24)");
    assert_int_not_equal(access(f->path, F_OK), 0); /* nothing in place before finish */
    assert_int_equal(regc_st_writer_finish(w), REGC_OK);

    char *x, *y;
    size_t nx, ny;
    assert_int_equal(regc_file_read_all(one, &x, &nx), REGC_OK);
    assert_int_equal(regc_file_read_all(f->path, &y, &ny), REGC_OK);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, nx);
    free(x), free(y);

    /* Abandoned, the writer leaves no file and no temporary behind. */
    char gone[1200];
    snprintf(gone, sizeof gone, "%s/gone.safetensors", f->dir);
    assert_int_equal(regc_st_writer_open(gone, e, 3, 0, &w), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 1, 0, 6, b), REGC_OK);
    regc_st_writer_abandon(w);
    assert_int_not_equal(access(gone, F_OK), 0);
    int files = 0;
    DIR *d = opendir(f->dir);
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));)
        files += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(files, 2); /* one.safetensors and the streamed file */

    /* With data required, a tensor without it is refused by name. */
    assert_int_equal(regc_st_writer_open(gone, e, 3, 1, &w), REGC_ERR_ARG);
    regc_test_expect_error(gone, "tensor z has no data");
    assert_null(w);
}

/* Integer tensors: I32 written and read back, I64 read within int32's
 * range, anything else refused naming the tensor. */
static void test_integers(void **state)
{
    regc_test_dir *f = *state;
    const int32_t want[5] = {0, -1, 7, INT32_MAX, INT32_MIN};
    regc_st_entry e = {.name = "pos",
                       .dtype = REGC_I32,
                       .ndim = 1,
                       .shape = {5},
                       .data = (const float *)(const void *)want};
    assert_int_equal(regc_st_write(f->path, &e, 1), REGC_OK);
    regc_st_file *st = NULL;
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    int32_t got[5] = {0};
    assert_int_equal(regc_st_read_i32(st, regc_st_find(st, "pos"), 5, got), REGC_OK);
    assert_memory_equal(got, want, sizeof want);
    assert_int_equal(regc_st_read_i32(st, 0, 4, got), REGC_ERR_ARG); /* 5 elements, not 4 */
    regc_test_expect_error(f->path, "tensor pos has 5 elements, not 4");
    float x;
    assert_int_equal(regc_st_read_range(st, 0, 0, 1, &x), REGC_ERR_UNSUPPORTED);
    regc_test_expect_error(f->path, "tensor pos has dtype I32");
    regc_st_close(st);

    const int64_t wide[3] = {5, -3, INT64_C(1) << 40};
    write_raw(f->path, "{\"w\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]}}    ",
              wide, sizeof wide);
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    assert_int_equal(regc_st_read_i32(st, 0, 3, got), REGC_ERR_FORMAT);
    regc_test_expect_error(f->path,
                           "tensor w: element 2 is 1099511627776, outside the 32-bit range");
    assert_int_equal(got[0], 5);
    assert_int_equal(got[1], -3);
    regc_st_close(st);

    const float fl[1] = {1.0f};
    write_raw(f->path, "{\"f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", fl,
              sizeof fl);
    assert_int_equal(regc_st_open(f->path, &st), REGC_OK);
    assert_int_equal(regc_st_read_i32(st, 0, 1, got), REGC_ERR_UNSUPPORTED);
    regc_test_expect_error(f->path, "tensor f has dtype F32; an integer tensor must be I32 or I64");
    regc_st_close(st);
}

static void test_err_writer(void **state)
{
    regc_test_dir *f = *state;
    float d[2] = {1, 2};
    regc_st_entry dup[2] = {
        {.name = "x", .dtype = REGC_F32, .ndim = 1, .shape = {2}, .data = d},
        {.name = "x", .dtype = REGC_F32, .ndim = 1, .shape = {2}, .data = d},
    };
    assert_int_equal(regc_st_write(f->path, dup, 2), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "duplicate tensor name x");
    assert_int_not_equal(access(f->path, F_OK), 0);

    regc_st_entry bf = {.name = "i", .dtype = REGC_BF16, .ndim = 1, .shape = {2}, .data = d};
    regc_st_writer *w = NULL;
    assert_int_equal(regc_st_writer_open(f->path, &bf, 1, 1, &w), REGC_OK);
    const int32_t iv[2] = {1, 2};
    assert_int_equal(regc_st_writer_put_i32(w, 0, 0, 2, iv), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "tensor i is floating-point, not int32 data");
    regc_st_writer_abandon(w);
    regc_st_entry ints = {.name = "i", .dtype = REGC_I32, .ndim = 1, .shape = {2}, .data = d};
    assert_int_equal(regc_st_writer_open(f->path, &ints, 1, 1, &w), REGC_OK);
    assert_int_equal(regc_st_writer_put(w, 0, 0, 2, d), REGC_ERR_ARG);
    regc_test_expect_error(f->path, "tensor i is I32, not fp32 data");
    regc_st_writer_abandon(w);
    assert_int_not_equal(access(f->path, F_OK), 0);

    char bad[1200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/t.safetensors", f->dir);
    assert_true(regc_st_write(bad, dup, 1) < 0);
    regc_test_expect_error(bad, "t.safetensors");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_round_trip, setup),
        regc_test_in_dir(test_integers, setup),
        regc_test_in_dir(test_empty_file_list, setup),
        regc_test_in_dir(test_bf16_bits, setup),
        regc_test_in_dir(test_f16_bits, setup),
        regc_test_in_dir(test_f16_large, setup),
        regc_test_in_dir(test_write_half_rounding, setup),
        regc_test_in_dir(test_err_missing_file, setup),
        regc_test_in_dir(test_err_header_length, setup),
        regc_test_in_dir(test_err_malformed_json, setup),
        regc_test_in_dir(test_err_truncated, setup),
        regc_test_in_dir(test_err_offsets_vs_shape, setup),
        regc_test_in_dir(test_err_duplicate, setup),
        regc_test_in_dir(test_err_layout, setup),
        regc_test_in_dir(test_err_message_one_line, setup),
        regc_test_in_dir(test_parse_memory_image, setup),
        regc_test_in_dir(test_err_wrong_shape_and_index, setup),
        regc_test_in_dir(test_unknown_dtype_on_read, setup),
        regc_test_in_dir(test_read_range, setup),
        regc_test_in_dir(test_writer_in_pieces, setup),
        regc_test_in_dir(test_err_writer, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
