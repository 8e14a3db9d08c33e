/* test_reference.c — see test_reference.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "regc_common.h"
#include "test_reference.h"

cJSON *regc_test_load_json(const char *path)
{
    char *text = NULL;
    size_t size = 0;
    if (regc_file_read_all(path, &text, &size) != REGC_OK)
        fail_msg("cannot read %s: %s", path, regc_error_message());
    cJSON *doc = cJSON_ParseWithLength(text, size);
    free(text);
    if (!doc)
        fail_msg("%s is not valid JSON", path);
    return doc;
}

const cJSON *regc_test_json_get(const cJSON *obj, const char *key)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item)
        fail_msg("reference: key \"%s\" is missing", key);
    return item;
}

double regc_test_json_number(const cJSON *obj, const char *key)
{
    const cJSON *item = regc_test_json_get(obj, key);
    if (cJSON_IsBool(item))
        return cJSON_IsTrue(item) ? 1.0 : 0.0;
    if (!cJSON_IsNumber(item))
        fail_msg("reference: \"%s\" is not a number", key);
    return item->valuedouble;
}

int64_t regc_test_json_int(const cJSON *obj, const char *key)
{
    double v = regc_test_json_number(obj, key);
    if (v != floor(v) || v < 0 || v > 9007199254740992.0)
        fail_msg("reference: \"%s\" = %g is not a non-negative integer", key, v);
    return (int64_t)v;
}

const char *regc_test_json_string(const cJSON *obj, const char *key)
{
    const cJSON *item = regc_test_json_get(obj, key);
    if (!cJSON_IsString(item))
        fail_msg("reference: \"%s\" is not a string", key);
    return item->valuestring;
}

static const cJSON *reference_array(const cJSON *obj, const char *key, size_t n)
{
    const cJSON *arr = regc_test_json_get(obj, key);
    if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != n)
        fail_msg("reference: \"%s\" should be an array of %zu numbers", key, n);
    return arr;
}

double *regc_test_json_doubles(const cJSON *obj, const char *key, size_t n)
{
    const cJSON *arr = reference_array(obj, key, n);
    size_t i = 0;
    const cJSON *el;
    cJSON_ArrayForEach (el, arr) {
        if (!cJSON_IsNumber(el))
            fail_msg("reference: \"%s\"[%zu] is not a number", key, i);
        i++;
    }
    double *out = malloc((n ? n : 1) * sizeof *out);
    assert_non_null(out);
    i = 0;
    cJSON_ArrayForEach (el, arr)
        out[i++] = el->valuedouble;
    return out;
}

int32_t *regc_test_json_ints(const cJSON *obj, const char *key, size_t n)
{
    double *d = regc_test_json_doubles(obj, key, n);
    int32_t *out = malloc((n ? n : 1) * sizeof *out);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)d[i];
    free(d);
    return out;
}

float *regc_test_reference_input(const cJSON *ref_case, const char *name, size_t n)
{
    const cJSON *inputs = regc_test_json_get(ref_case, "inputs");
    double *spec = regc_test_json_doubles(inputs, name, 3); /* stream, center, halfwidth */
    uint64_t seed = (uint64_t)regc_test_json_number(ref_case, "seed");
    float *out = malloc((n ? n : 1) * sizeof *out);
    assert_non_null(out);
    regc_rng_fill_uniform(out, n, regc_rng_substream(seed, (uint64_t)spec[0]), (float)spec[1],
                          (float)spec[2]);
    free(spec);
    return out;
}

void regc_test_assert_close(const char *what, const float *got, const double *want, size_t n,
                            double rtol, double atol)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        /* written as !(err <= tol) so a NaN counts as a mismatch */
        if (!(err <= atol + rtol * fabs(want[i]))) {
            if (bad++ == 0)
                first = i;
        }
    }
    if (bad)
        fail_msg("%s: %zu of %zu values off; first at [%zu]: got %.9g, want %.9g "
                 "(rtol %g, atol %g)",
                 what, bad, n, first, (double)got[first], want[first], rtol, atol);
}
