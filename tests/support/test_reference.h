/* test_reference.h — reading recorded reference values (the JSON files in tests/data
 * written by the scripts in tools/reference) and comparing kernel outputs with them.
 * A reference input is [stream, center, halfwidth]: values of regc's random
 * stream regc_rng_substream(case.seed, stream), so files stay small and the
 * C side rebuilds exactly what the Python side used. Every helper fails the
 * current CMocka test, with a message that names the key, on bad data. */
#ifndef REGC_TEST_REFERENCE_H
#define REGC_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Parse a JSON file; free with cJSON_Delete. */
cJSON *regc_test_load_json(const char *path);
/* obj[key], which must exist */
const cJSON *regc_test_json_get(const cJSON *obj, const char *key);
double regc_test_json_number(const cJSON *obj, const char *key);
/* obj[key] as a non-negative integer. Read through valuedouble: cJSON's
 * valueint saturates at INT_MAX, and a double is exact below 2^53. */
int64_t regc_test_json_int(const cJSON *obj, const char *key);
/* obj[key], which must be a string */
const char *regc_test_json_string(const cJSON *obj, const char *key);
/* obj[key] as a new array of exactly n numbers (malloc'd) */
double *regc_test_json_doubles(const cJSON *obj, const char *key, size_t n);
int32_t *regc_test_json_ints(const cJSON *obj, const char *key, size_t n);
/* Input `name` of a reference case (its "seed" and "inputs"), n floats, malloc'd. */
float *regc_test_reference_input(const cJSON *ref_case, const char *name, size_t n);
/* Fail unless |got[i] - want[i]| <= atol + rtol * |want[i]| for every i;
 * the message names `what`, the first bad index and how many are off. */
void regc_test_assert_close(const char *what, const float *got, const double *want, size_t n,
                            double rtol, double atol);

#endif
