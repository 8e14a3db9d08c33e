/* test_limits.c — what cannot fit is refused from shapes alone, before
 * anything is allocated, with the figures: a model whose weights exceed
 * the host's memory, and a step (weights, gradients, AdamW's moments,
 * activations) that exceeds the device's. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "regc_models.h"
#include "regc_train.h"

static void assert_message_has(const char *a, const char *b)
{
    const char *msg = regc_error_message();
    if (!strstr(msg, a) || !strstr(msg, b))
        fail_msg("expected \"%s\" and \"%s\" in: %s", a, b, msg);
}

static void test_host_memory_known(void **state)
{
    (void)state;
    /* the limits below mean something only if the host says what it has */
    int64_t host = regc_host_memory_bytes();
    assert_true(host > (int64_t)64 << 20);
    regc_backend *be = regc_backend_new("cpu", 1);
    assert_non_null(be);
    assert_int_equal(be->mem_capacity, host);
    regc_backend_free(be);
}

static void test_weights_beyond_the_host(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("llama-70b", &m), REGC_OK);
    /* 282 GB of fp32: more than any host this suite runs on */
    if (regc_host_memory_bytes() > (int64_t)282 << 30)
        skip();
    assert_int_equal(regc_model_alloc_weights(m), REGC_ERR_MEMORY);
    assert_message_has("llama-70b: 70553706496 parameters take 262.8 GiB", "this host's");
    assert_false(regc_model_has_weights(m));
    regc_model_free(m);
}

static void test_step_beyond_the_device(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("llama-8b", &m), REGC_OK);
    if (regc_host_memory_bytes() > (int64_t)130 << 30)
        skip();
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 1, o.seq = 16, o.steps = 1, o.cache_dir = NULL;
    assert_int_equal(regc_train(m, &o, NULL, NULL, NULL), REGC_ERR_MEMORY);
    /* 16 bytes a parameter of weights, gradients and both moments */
    assert_message_has("llama-8b: a step needs 119.8 GiB per rank", "more than the host's");
    assert_message_has("zero_optimization.stage 3", "train.batch");
    assert_false(regc_model_has_weights(m)); /* nothing was read or drawn */
    regc_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_memory_known),
        cmocka_unit_test(test_weights_beyond_the_host),
        cmocka_unit_test(test_step_beyond_the_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
