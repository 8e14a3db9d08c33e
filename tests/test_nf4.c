/* test_nf4.c — NF4 quantisation (models/nf4.c) against bitsandbytes.
 *
 * Against bitsandbytes 0.50.2 on the CPU (tests/data/nf4_reference.json,
 * written by tools/reference/nf4_reference.py): each case's n values are
 * rebuilt from regc's counter stream exactly as the script builds them (or
 * read as hex floats), quantised, and the blob must equal quantize_4bit's
 * byte for byte (the whole blob, or its CRC-32 for the big cases); the
 * reference blob dequantised must give dequantize_4bit's fp32 bits (CRC-32
 * of the output and a few values); and the offset alone, torch's mean of
 * the absmaxes, must match for many block counts, serial and threaded.
 *
 * By property: each value comes back within half the widest gap between
 * NF4 levels times its block's absmax, plus what double quantisation moved
 * that absmax, itself within half the widest gap of the dynamic map (and
 * one table step) times the nested absmax; quantising the dequantised
 * values again gives the same nibbles; a value on a midpoint takes the
 * lower level. NaN or infinite input and bad tables are refused with one
 * line naming the value or the entry. */
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
#include <zlib.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "regc_models.h"
#include "test_reference.h"
#include "test_util.h"

#define REFERENCE REGC_SOURCE_DIR "/tests/data/nf4_reference.json"

static const float levels[16] = REGC_NF4_LEVELS;
static const float dynamic_map[256] = REGC_NF4_DYNAMIC_MAP;

/* ---------------------------------------------------------------- inputs */

/* Value e of a case with seed `seed` and block kinds `kinds`, as
 * nf4_reference.py's make_input builds it (its docstring lists the kinds);
 * every value is an integer times a power of two, exact in fp32. */
static float input_value(uint64_t seed, const int *kinds, int nk, int64_t e)
{
    const uint64_t r = regc_rng_at(seed, (uint64_t)e);
    const int64_t b = e / 64, p = e % 64;
    const int64_t top = (int64_t)(r >> 40);
    const double int24 = (double)(top - (1 << 23));
    switch (kinds[b % nk]) {
    case 0: return (float)ldexp(int24, -29);
    case 1: return (float)ldexp(int24, (int)((r >> 8) % 41) - 20 - 23);
    case 2: return 0.0f;
    case 3: return (float)-ldexp((double)top, -21);
    case 4: {
        const int s = (int)(b % 16) - 8;
        if (p == 0)
            return (float)ldexp((r & 1) ? -1.0 : 1.0, s);
        float m = (levels[p % 15] + levels[p % 15 + 1]) / 2.0f;
        if ((p / 15) % 3 == 1)
            m = nextafterf(m, INFINITY);
        else if ((p / 15) % 3 == 2)
            m = nextafterf(m, -INFINITY);
        return (float)ldexp((double)m, s);
    }
    case 5: return (float)ldexp(int24, 77);
    case 6: {
        const double int10 = (double)((int64_t)(r >> 54) - 512);
        return (float)ldexp((b / 8) % 2 == 1 ? int10 : int24, -149);
    }
    default: return r % 8 == 0 ? (float)ldexp(int24, -23) : 0.0f;
    }
}

static float *make_input(int64_t n, uint64_t seed, const int *kinds, int nk)
{
    float *x = malloc((size_t)n * sizeof(float));
    assert_non_null(x);
    for (int64_t e = 0; e < n; e++)
        x[e] = input_value(seed, kinds, nk, e);
    return x;
}

static float hex_float(const char *s)
{
    char *end = NULL;
    const double v = strtod(s, &end);
    if (end == s || *end)
        fail_msg("\"%s\" is not a hex float", s);
    return (float)v;
}

/* A case's input: its "values", or its generator (seed, kinds). */
static float *case_input(const cJSON *c, int64_t n)
{
    const cJSON *values = cJSON_GetObjectItemCaseSensitive(c, "values");
    if (values) {
        assert_int_equal(cJSON_GetArraySize(values), n);
        float *x = malloc((size_t)n * sizeof(float));
        assert_non_null(x);
        for (int64_t i = 0; i < n; i++)
            x[i] = hex_float(cJSON_GetArrayItem(values, (int)i)->valuestring);
        return x;
    }
    const cJSON *kj = regc_test_json_get(c, "kinds");
    int kinds[16], nk = cJSON_GetArraySize(kj);
    assert_true(nk >= 1 && nk <= 16);
    for (int i = 0; i < nk; i++)
        kinds[i] = cJSON_GetArrayItem(kj, i)->valueint;
    return make_input(n, (uint64_t)regc_test_json_int(c, "seed"), kinds, nk);
}

static uint32_t crc_of(const void *p, size_t size)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    const unsigned char *b = p;
    for (size_t at = 0; at < size; at += 1u << 30) {
        const size_t k = size - at < (1u << 30) ? size - at : (1u << 30);
        crc = crc32(crc, b + at, (uInt)k);
    }
    return (uint32_t)crc;
}

static float blob_offset(const uint8_t *blob)
{
    float v;
    memcpy(&v, blob, sizeof v);
    return v;
}

static const char *blob_part(const regc_nf4_layout_t *l, int64_t at)
{
    return at < l->nested_at   ? "offset"
           : at < l->q8_at     ? "nested absmax"
           : at < l->packed_at ? "8-bit absmax code"
                               : "packed nibbles";
}

static uint32_t bits_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* ---------------------------------------------------------------- against bitsandbytes */

static void check_case(const cJSON *c)
{
    const char *name = regc_test_json_string(c, "name");
    const int64_t n = regc_test_json_int(c, "n");
    const int threads = (int)regc_test_json_int(c, "threads");
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    float *x = case_input(c, n);
    uint8_t *blob = malloc((size_t)l.bytes), *want = malloc((size_t)l.bytes);
    float *out = malloc((size_t)n * sizeof(float));
    assert_true(blob && want && out);
    if (regc_nf4_quantize_threads(x, n, threads, blob) != REGC_OK)
        fail_msg("case %s: %s", name, regc_error_message());

    const float offset = hex_float(regc_test_json_string(c, "offset"));
    if (bits_of(blob_offset(blob)) != bits_of(offset))
        fail_msg("case %s: offset %a, bitsandbytes' (torch's absmax.mean()) %a", name,
                 (double)blob_offset(blob), (double)offset);
    const cJSON *hex = cJSON_GetObjectItemCaseSensitive(c, "blob");
    if (hex) {
        assert_int_equal((int64_t)strlen(hex->valuestring), 2 * l.bytes);
        for (int64_t i = 0; i < l.bytes; i++) {
            unsigned v;
            assert_int_equal(sscanf(hex->valuestring + 2 * i, "%2x", &v), 1);
            want[i] = (uint8_t)v;
        }
        for (int64_t i = 0; i < l.bytes; i++)
            if (blob[i] != want[i])
                fail_msg("case %s: byte %lld (%s) is %02x, bitsandbytes' %02x", name, (long long)i,
                         blob_part(&l, i), blob[i], want[i]);
    }
    const uint32_t crc = crc_of(blob, (size_t)l.bytes);
    if (crc != (uint32_t)regc_test_json_int(c, "blob_crc32"))
        fail_msg("case %s: the blob's CRC-32 %08x is not bitsandbytes' %08x", name, crc,
                 (uint32_t)regc_test_json_int(c, "blob_crc32"));

    /* dequantise bitsandbytes' own blob (equal to ours by now) */
    regc_nf4_dequantize(hex ? want : blob, n, out);
    const cJSON *pick;
    cJSON_ArrayForEach (pick, regc_test_json_get(c, "dequant")) {
        const int64_t i = (int64_t)cJSON_GetArrayItem(pick, 0)->valuedouble;
        const float v = hex_float(cJSON_GetArrayItem(pick, 1)->valuestring);
        if (bits_of(out[i]) != bits_of(v))
            fail_msg("case %s: value %lld dequantises to %a, bitsandbytes' to %a", name,
                     (long long)i, (double)out[i], (double)v);
    }
    const uint32_t dcrc = crc_of(out, (size_t)n * sizeof(float));
    if (dcrc != (uint32_t)regc_test_json_int(c, "dequant_crc32"))
        fail_msg("case %s: the dequantised values' CRC-32 %08x is not bitsandbytes' %08x", name,
                 dcrc, (uint32_t)regc_test_json_int(c, "dequant_crc32"));
    print_message("case %-13s n %8lld  offset %a: blob and dequantised values equal\n", name,
                  (long long)n, (double)offset);
    free(x), free(blob), free(want), free(out);
}

static void test_bitsandbytes_cases(void **state)
{
    (void)state;
    cJSON *doc = regc_test_load_json(REFERENCE);
    const cJSON *c;
    int count = 0;
    cJSON_ArrayForEach (c, regc_test_json_get(doc, "cases")) {
        check_case(c);
        count++;
    }
    assert_true(count >= 8);
    cJSON_Delete(doc);
}

/* torch's mean over block counts where its cascade changes shape (vector
 * lanes, rows of 4, levels of 16) and, threaded, where it splits. */
static void test_bitsandbytes_offsets(void **state)
{
    (void)state;
    cJSON *doc = regc_test_load_json(REFERENCE);
    const cJSON *kj = regc_test_json_get(doc, "offset_kinds"), *o;
    int kinds[16], nk = cJSON_GetArraySize(kj), count = 0, bad = 0;
    for (int i = 0; i < nk; i++)
        kinds[i] = cJSON_GetArrayItem(kj, i)->valueint;
    cJSON_ArrayForEach (o, regc_test_json_get(doc, "offsets")) {
        const int64_t blocks = regc_test_json_int(o, "blocks"), n = 64 * blocks;
        const int threads = (int)regc_test_json_int(o, "threads");
        float *x = make_input(n, (uint64_t)regc_test_json_int(o, "seed"), kinds, nk);
        uint8_t *blob = malloc((size_t)regc_nf4_layout(n).bytes);
        assert_non_null(blob);
        assert_int_equal(regc_nf4_quantize_threads(x, n, threads, blob), REGC_OK);
        const float want = hex_float(regc_test_json_string(o, "offset"));
        if (bits_of(blob_offset(blob)) != bits_of(want)) {
            print_error("%lld blocks, %d threads: offset %a, torch's mean %a\n", (long long)blocks,
                        threads, (double)blob_offset(blob), (double)want);
            bad++;
        }
        count++;
        free(x), free(blob);
    }
    print_message("%d offsets, %d differ from torch's\n", count, bad);
    assert_true(count >= 70);
    assert_int_equal(bad, 0);
    cJSON_Delete(doc);
}

/* Below 32768 blocks the thread count changes nothing; one thread is
 * regc_nf4_quantize. */
static void test_threads_below_grain(void **state)
{
    (void)state;
    static const int kinds[] = {0, 3, 7};
    const int64_t n = 64 * 5000 + 7;
    const int64_t bytes = regc_nf4_layout(n).bytes;
    float *x = make_input(n, 99, kinds, 3);
    uint8_t *a = malloc((size_t)bytes), *b = malloc((size_t)bytes);
    assert_true(a && b);
    assert_int_equal(regc_nf4_quantize(x, n, a), REGC_OK);
    assert_int_equal(regc_nf4_quantize_threads(x, n, 8, b), REGC_OK);
    assert_memory_equal(a, b, (size_t)bytes);
    free(x), free(a), free(b);
}

/* ---------------------------------------------------------------- properties */

static float widest_gap(const float *t, int count)
{
    float g = 0.0f;
    for (int i = 0; i + 1 < count; i++)
        g = fmaxf(g, t[i + 1] - t[i]);
    return g;
}

static void test_error_bound(void **state)
{
    (void)state;
    static const int kinds[] = {0, 3, 1, 7, 4, 2, 6, 0, 3};
    const int64_t n = 64 * 700 + 21;
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    float *x = make_input(n, 7, kinds, 9), *y = malloc((size_t)n * sizeof(float));
    uint8_t *blob = malloc((size_t)l.bytes);
    assert_true(y && blob);
    assert_int_equal(regc_nf4_quantize(x, n, blob), REGC_OK);
    regc_nf4_dequantize(blob, n, y);
    const double half4 = widest_gap(levels, 16) / 2.0, half8 = widest_gap(dynamic_map, 256) / 2.0;
    const double offset = blob_offset(blob);
    for (int64_t b = 0; b < l.blocks; b++) {
        const int64_t e0 = b * 64, e1 = e0 + 64 < n ? e0 + 64 : n;
        double a = 0.0;
        for (int64_t e = e0; e < e1; e++)
            a = fmax(a, fabs(x[e]));
        a = fmax(a, 0x1.b38fb8p-127); /* torch's clamp(min=1e-38) */
        const double a2 = regc_nf4_absmax(blob, &l, dynamic_map, b);
        float nested;
        memcpy(&nested, blob + l.nested_at + 4 * (b / 256), sizeof nested);
        /* the 8-bit code: the nearest of the map to the table step, one
         * step (2 / 65535) from d / nested */
        const double moved = fabs(a2 - a);
        const double moved_bound =
            (half8 + 2.0 / 65535) * nested + 0x1p-21 * (nested + a + fabs(offset));
        if (!(moved <= moved_bound))
            fail_msg("block %lld: absmax %a comes back as %a (off by %g, bound %g)", (long long)b,
                     a, a2, moved, moved_bound);
        for (int64_t e = e0; e < e1; e++) {
            const double err = fabs((double)x[e] - y[e]);
            const double bound = half4 * a + moved + 0x1p-21 * (a + fabs(a2));
            if (!(err <= bound))
                fail_msg("value %lld: %a comes back as %a (off by %g, bound %g)", (long long)e,
                         (double)x[e], (double)y[e], err, bound);
        }
    }
    free(x), free(y), free(blob);
}

/* Quantising dequantised values gives the same nibbles wherever the
 * rebuilt absmax is positive (a negative one flips the block's signs, and
 * NF4 is not symmetric). The offset, nested absmaxes and codes need not
 * repeat: the absmaxes are now the rebuilt ones, as in bitsandbytes. */
static void test_round_trip_nibbles(void **state)
{
    (void)state;
    static const int kinds[] = {0, 3, 7, 4, 2, 0};
    const int64_t n = 64 * 900 + 33;
    const regc_nf4_layout_t l = regc_nf4_layout(n);
    float *x = make_input(n, 8, kinds, 6), *y = malloc((size_t)n * sizeof(float));
    uint8_t *a = malloc((size_t)l.bytes), *b = malloc((size_t)l.bytes);
    assert_true(y && a && b);
    assert_int_equal(regc_nf4_quantize(x, n, a), REGC_OK);
    regc_nf4_dequantize(a, n, y);
    assert_int_equal(regc_nf4_quantize(y, n, b), REGC_OK);
    int64_t checked = 0;
    for (int64_t blk = 0; blk < l.blocks; blk++) {
        if (!(regc_nf4_absmax(a, &l, dynamic_map, blk) > 0.0f))
            continue;
        checked++;
        for (int64_t e = blk * 64; e < n && e < (blk + 1) * 64; e++)
            if (regc_nf4_index(a, &l, e) != regc_nf4_index(b, &l, e))
                fail_msg("value %lld: nibble %d, %d after a round trip", (long long)e,
                         regc_nf4_index(a, &l, e), regc_nf4_index(b, &l, e));
    }
    assert_true(checked >= l.blocks - l.blocks / 4);
    /* the padding nibble of an odd n */
    assert_int_equal(regc_nf4_index(b, &l, n), 7);
    free(x), free(y), free(a), free(b);
}

/* A value exactly on the midpoint of two levels takes the lower one; one
 * fp32 step above, the upper. */
static void test_ties_take_lower_level(void **state)
{
    (void)state;
    float x[64] = {1.0f};
    for (int j = 0; j < 15; j++) {
        const float m = (levels[j] + levels[j + 1]) / 2.0f;
        x[1 + 2 * j] = m;
        x[2 + 2 * j] = nextafterf(m, INFINITY);
    }
    const regc_nf4_layout_t l = regc_nf4_layout(64);
    uint8_t blob[256];
    assert_true(l.bytes <= (int64_t)sizeof blob);
    assert_int_equal(regc_nf4_quantize(x, 64, blob), REGC_OK);
    assert_int_equal(regc_nf4_index(blob, &l, 0), 15);
    for (int j = 0; j < 15; j++) {
        assert_int_equal(regc_nf4_index(blob, &l, 1 + 2 * j), j);
        assert_int_equal(regc_nf4_index(blob, &l, 2 + 2 * j), j + 1);
    }
    for (int e = 31; e < 64; e++)
        assert_int_equal(regc_nf4_index(blob, &l, e), 7); /* zeros */
}

/* ---------------------------------------------------------------- refusals */

static void test_refuses_non_finite(void **state)
{
    (void)state;
    float x[130];
    for (int i = 0; i < 130; i++)
        x[i] = (float)(i % 7) - 3.0f;
    uint8_t blob[256];
    assert_true(regc_nf4_layout(130).bytes <= (int64_t)sizeof blob);
    x[77] = NAN;
    assert_int_equal(regc_nf4_quantize(x, 130, blob), REGC_ERR_ARG);
    regc_test_expect_error("value 77 of 130", "NaN");
    x[77] = 1.0f;
    x[129] = -INFINITY;
    assert_int_equal(regc_nf4_quantize(x, 130, blob), REGC_ERR_ARG);
    regc_test_expect_error("value 129 of 130", "infinite");
    assert_int_equal(regc_nf4_quantize(x, 0, blob), REGC_ERR_ARG);
    regc_test_expect_error("NF4", "0 values");
}

static void test_check_tables(void **state)
{
    (void)state;
    float q[16], m[256];
    memcpy(q, levels, sizeof q);
    memcpy(m, dynamic_map, sizeof m);
    assert_int_equal(regc_nf4_check_tables(q, m), REGC_OK);
    q[9] = nextafterf(q[9], 1.0f); /* one bit off */
    assert_int_not_equal(regc_nf4_check_tables(q, m), REGC_OK);
    regc_test_expect_error("quant map entry 9", NULL);
    memcpy(q, levels, sizeof q);
    m[255] = 0.0f;
    assert_int_not_equal(regc_nf4_check_tables(q, m), REGC_OK);
    regc_test_expect_error("nested quant map entry 255", NULL);
    m[255] = 1.0f;
    q[7] = -0.0f; /* equal as a float, not as bits */
    assert_int_not_equal(regc_nf4_check_tables(q, m), REGC_OK);
    regc_test_expect_error("entry 7", NULL);
    assert_int_not_equal(regc_nf4_check_tables(NULL, m), REGC_OK);
    regc_test_expect_error("quant map", "missing");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitsandbytes_cases),  cmocka_unit_test(test_bitsandbytes_offsets),
        cmocka_unit_test(test_threads_below_grain), cmocka_unit_test(test_error_bound),
        cmocka_unit_test(test_round_trip_nibbles),  cmocka_unit_test(test_ties_take_lower_level),
        cmocka_unit_test(test_refuses_non_finite),  cmocka_unit_test(test_check_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
