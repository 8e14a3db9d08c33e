/* test_bytes.c — the byte encoding of canonical forms and cached payloads
 * (common/): varints at their boundaries, floats and strings round trip,
 * and a reader that fails, sticky, on truncated or out-of-range input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_common.h"

static void test_varints(void **state)
{
    (void)state;
    static const int64_t ints[] = {
        0,         1,         -1,        63,        -64,           64,
        127,       128,       -128,      300,       -300,          1 << 20,
        INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1};
    static const uint64_t uints[] = {0,     1,     127,        128,        255,
                                     16383, 16384, UINT32_MAX, UINT64_MAX, (uint64_t)1 << 63};
    const size_t ni = sizeof ints / sizeof ints[0], nu = sizeof uints / sizeof uints[0];
    regc_bytes b = {0};
    for (size_t i = 0; i < ni; i++)
        regc_bytes_put_i64(&b, ints[i]);
    for (size_t i = 0; i < nu; i++)
        regc_bytes_put_u64(&b, uints[i]);
    assert_false(b.failed);
    regc_reader r = regc_reader_of(b.data, b.len);
    for (size_t i = 0; i < ni; i++) {
        int64_t v = regc_reader_i64(&r);
        if (v != ints[i])
            fail_msg("i64 %lld read back as %lld", (long long)ints[i], (long long)v);
    }
    for (size_t i = 0; i < nu; i++)
        assert_true(regc_reader_u64(&r) == uints[i]);
    assert_false(r.failed);
    assert_ptr_equal(r.p, r.end);
    regc_bytes_free(&b);

    /* The widths LEB128 and zigzag promise: small magnitudes are short. */
    struct {
        int64_t v;
        size_t len;
    } widths[] = {{0, 1}, {-1, 1}, {63, 1}, {-64, 1}, {64, 2}, {INT64_MAX, 10}, {INT64_MIN, 10}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        regc_bytes w = {0};
        regc_bytes_put_i64(&w, widths[i].v);
        assert_int_equal(w.len, widths[i].len);
        regc_bytes_free(&w);
    }
    regc_bytes u = {0};
    regc_bytes_put_u64(&u, 127);
    assert_int_equal(u.len, 1);
    assert_int_equal(u.data[0], 0x7f);
    regc_bytes_put_u64(&u, 128);
    assert_int_equal(u.len, 3);
    assert_int_equal(u.data[1], 0x80);
    assert_int_equal(u.data[2], 0x01);
    regc_bytes_free(&u);
}

static void test_floats_and_strings(void **state)
{
    (void)state;
    static const uint32_t bits[] = {0x00000000u,
                                    0x80000000u /* -0.0 */,
                                    0x3f800000u,
                                    0x7f800000u,
                                    0xff800000u,
                                    0x7fc00000u,
                                    0x7fc12345u,
                                    0xffc00001u,
                                    0x00000001u /* subnormal */,
                                    0x7f7fffffu};
    const size_t nb = sizeof bits / sizeof bits[0];
    regc_bytes b = {0};
    for (size_t i = 0; i < nb; i++) {
        float f;
        memcpy(&f, &bits[i], 4);
        regc_bytes_put_f32(&b, f);
    }
    regc_bytes_put_str(&b, "");
    regc_bytes_put_str(&b, NULL);
    regc_bytes_put_str(&b, "hello, cache");
    assert_false(b.failed);
    /* Four little-endian IEEE bytes: 1.0f is 00 00 80 3f. */
    assert_int_equal(b.data[8], 0x00);
    assert_int_equal(b.data[10], 0x80);
    assert_int_equal(b.data[11], 0x3f);

    regc_reader r = regc_reader_of(b.data, b.len);
    for (size_t i = 0; i < nb; i++) {
        float f = regc_reader_f32(&r);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (u != bits[i])
            fail_msg("float bits %08x read back as %08x", bits[i], u);
    }
    char *s1 = regc_reader_str(&r), *s2 = regc_reader_str(&r), *s3 = regc_reader_str(&r);
    assert_false(r.failed);
    assert_ptr_equal(r.p, r.end);
    assert_string_equal(s1, "");
    assert_string_equal(s2, "");
    assert_string_equal(s3, "hello, cache");
    free(s1), free(s2), free(s3);

    /* A string whose length runs past the end. */
    regc_bytes_free(&b);
    regc_bytes_put_u64(&b, 10);
    regc_bytes_put(&b, "abc", 3);
    r = regc_reader_of(b.data, b.len);
    assert_null(regc_reader_str(&r));
    assert_true(r.failed);
    regc_bytes_free(&b);
}

static void test_reader_failures(void **state)
{
    (void)state;
    regc_bytes b = {0};
    regc_bytes_put_i64(&b, 5);
    regc_bytes_put_i64(&b, -3);
    regc_bytes_put_i64(&b, 7);

    /* In range, then out of it: lo comes back and the failure sticks. */
    regc_reader r = regc_reader_of(b.data, b.len);
    assert_int_equal(regc_reader_int(&r, 0, 5), 5);
    assert_false(r.failed);
    assert_int_equal(regc_reader_int(&r, 0, 10), 0);
    assert_true(r.failed);
    assert_int_equal(regc_reader_i64(&r), 0); /* 7 is there, but the reader has failed */
    r = regc_reader_of(b.data, b.len);
    assert_int_equal(regc_reader_int(&r, 6, 9), 6);
    assert_true(r.failed);
    r = regc_reader_of(b.data, b.len);
    assert_int_equal(regc_reader_int(&r, 5, 5), 5);
    assert_int_equal(regc_reader_int(&r, -3, -3), -3);
    assert_int_equal(regc_reader_int(&r, INT64_MIN, INT64_MAX), 7);
    assert_false(r.failed);
    regc_bytes_free(&b);

    /* Past the end: 0, zeroed bytes, and failed. */
    r = regc_reader_of("", 0);
    assert_true(regc_reader_u64(&r) == 0);
    assert_true(r.failed);
    r = regc_reader_of("ab", 2);
    uint8_t dst[4] = {9, 9, 9, 9};
    regc_reader_get(&r, dst, 4);
    assert_true(r.failed);
    assert_true(dst[0] == 0 && dst[1] == 0 && dst[2] == 0 && dst[3] == 0);
    r = regc_reader_of("abc", 3);
    assert_true(regc_reader_f32(&r) == 0.0f);
    assert_true(r.failed);
    r = regc_reader_of("ab", 2);
    regc_reader_get(&r, dst, 2);
    assert_false(r.failed);
    assert_true(regc_reader_i64(&r) == 0);
    assert_true(r.failed);

    /* A varint cut off after a continuation byte. */
    static const uint8_t cut[] = {0x80};
    r = regc_reader_of(cut, sizeof cut);
    assert_true(regc_reader_u64(&r) == 0);
    assert_true(r.failed);
    static const uint8_t cut2[] = {0xff, 0xff, 0xff};
    r = regc_reader_of(cut2, sizeof cut2);
    assert_true(regc_reader_i64(&r) == 0);
    assert_true(r.failed);
    /* Longer than any 64-bit value: eleven bytes. */
    static const uint8_t overlong[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                       0x80, 0x80, 0x80, 0x80, 0x00};
    r = regc_reader_of(overlong, sizeof overlong);
    assert_true(regc_reader_u64(&r) == 0);
    assert_true(r.failed);
}

/* SipHash-2-4 against the reference's published vectors: key 00 01 .. 0f,
 * messages 00 01 .. of each length. */
static void test_siphash_vectors(void **state)
{
    (void)state;
    uint8_t key[16], msg[64];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    assert_true(regc_siphash64(key, msg, 0) == 0x726fdb47dd0e0e31ull);
    assert_true(regc_siphash64(key, msg, 1) == 0x74f839c593dc67fdull);
    assert_true(regc_siphash64(key, msg, 15) == 0xa129ca6149be45e5ull);
    static const uint8_t empty128[16] = {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6,
                                         0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93};
    uint8_t out[16];
    regc_siphash128(key, msg, 0, out);
    assert_memory_equal(out, empty128, 16);
    /* every byte of input and of key matters */
    uint8_t other[16];
    regc_siphash128(key, msg, 63, out);
    msg[62] ^= 1;
    regc_siphash128(key, msg, 63, other);
    assert_memory_not_equal(out, other, 16);
    key[15] ^= 1;
    regc_siphash128(key, msg, 63, out);
    assert_memory_not_equal(out, other, 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_varints),
        cmocka_unit_test(test_floats_and_strings),
        cmocka_unit_test(test_reader_failures),
        cmocka_unit_test(test_siphash_vectors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
