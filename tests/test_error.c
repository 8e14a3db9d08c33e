/* test_error.c — the library's error message (common/error.c): one line,
 * and a new message may quote the one it replaces (a caller that adds
 * where an error happened passes regc_error_message() to regc_error). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "regc_common.h"

static void test_message_quotes_the_previous_one(void **state)
{
    (void)state;
    regc_error(REGC_ERR_ARG, "adamw: a signal on a kernel that is no collective");
    assert_int_equal(
        regc_error(REGC_ERR_FORMAT, "step program: instruction %d: %s", 52, regc_error_message()),
        REGC_ERR_FORMAT);
    assert_string_equal(regc_error_message(), "step program: instruction 52: adamw: a signal on "
                                              "a kernel that is no collective");
    regc_error(REGC_ERR_ARG, "two\nlines");
    assert_string_equal(regc_error_message(), "two?lines");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_quotes_the_previous_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
