/* test_coldstart.c — `regc coldstart` through the real binary: the JSON
 * rows' keys and the properties they must have (one compile per region
 * kind, a memory plan no smaller than its lower bound, measured steps), the
 * SVG chart, and every usage and load error with its exit code. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "coldstart", "chart.svg"); }

static const char *const json_keys[] = {
    "model",           "layers",     "mode",         "detect_ms",
    "compile_ms",      "inline_ms",  "total_ms",     "setup_ms",
    "first_step_ms",   "step_ms",    "peak_bytes",   "lower_bound_bytes",
    "region_compiles", "build_ms",   "total_min_ms", "total_max_ms",
    "region_kinds",    "cache_hits", "cache_misses"};

static void test_json_rows_and_svg(void **state)
{
    regc_test_dir *t = *state;
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "coldstart", "--model", "gpt2-tiny", "--layers", "1,2,4",
                                "--repeat", "2", "--steps", "2", "--batch", "2", "--seq", "16",
                                "--threads", "1", "--json", "--svg", t->path, NULL);
    if (rc != 0)
        fail_msg("regc coldstart failed (%d):\n%s", rc, p.err);
    assert_int_equal(regc_test_count_lines(p.out), 9);

    static const int64_t depths[] = {1, 2, 4};
    static const char *const modes[] = {"full", "regional", "regional+cache"};
    const char *line = p.out;
    for (int row = 0; row < 9; row++) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        char *text = strndup(line, (size_t)(nl - line));
        assert_non_null(text);
        cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
        if (!o || !cJSON_IsObject(o))
            fail_msg("not one JSON object: %s", text);
        for (size_t k = 0; k < sizeof json_keys / sizeof json_keys[0]; k++)
            if (!cJSON_GetObjectItemCaseSensitive(o, json_keys[k]))
                fail_msg("key %s missing in: %s", json_keys[k], text);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "model")->valuestring, "gpt2-tiny");
        /* Depths in the order given; full, regional, regional+cache at each. */
        int mode = row % 3;
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "mode")->valuestring, modes[mode]);
        double layers = cJSON_GetObjectItemCaseSensitive(o, "layers")->valuedouble;
        assert_true(layers == (double)depths[row / 3]);

        /* A warm start compiles nothing: the whole step comes from the cache. */
        int compiles = cJSON_GetObjectItemCaseSensitive(o, "region_compiles")->valueint;
        int hits = cJSON_GetObjectItemCaseSensitive(o, "cache_hits")->valueint;
        int misses = cJSON_GetObjectItemCaseSensitive(o, "cache_misses")->valueint;
        if (mode == 2)
            assert_true(compiles == 0 && hits == 1 && misses == 0);
        else if (mode == 0 || layers >= 2)
            assert_true(compiles == 1 && hits == 0 && misses == 0);
        double peak = cJSON_GetObjectItemCaseSensitive(o, "peak_bytes")->valuedouble;
        double bound = cJSON_GetObjectItemCaseSensitive(o, "lower_bound_bytes")->valuedouble;
        assert_true(bound > 0);
        assert_true(peak >= bound);

        double total = cJSON_GetObjectItemCaseSensitive(o, "total_ms")->valuedouble;
        double lo = cJSON_GetObjectItemCaseSensitive(o, "total_min_ms")->valuedouble;
        double hi = cJSON_GetObjectItemCaseSensitive(o, "total_max_ms")->valuedouble;
        assert_true(lo > 0 && lo <= total && total <= hi);
        if (mode == 0)
            assert_true(cJSON_GetObjectItemCaseSensitive(o, "detect_ms")->valuedouble == 0.0);

        const cJSON *first = cJSON_GetObjectItemCaseSensitive(o, "first_step_ms");
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step_ms");
        const cJSON *setup = cJSON_GetObjectItemCaseSensitive(o, "setup_ms");
        if (!cJSON_IsNumber(first) || !cJSON_IsNumber(step) || !cJSON_IsNumber(setup))
            fail_msg("steps not measured: %s", text);
        assert_true(first->valuedouble > 0 && step->valuedouble > 0 && setup->valuedouble > 0);
        cJSON_Delete(o);
        free(text);
        line = nl + 1;
    }
    regc_test_proc_free(&p);

    char *svg = regc_test_read_file(t->path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "<svg"));
    assert_non_null(strstr(svg, "</svg>"));
    /* One line per mode, with a legend naming each. */
    char *first = strstr(svg, "<polyline");
    assert_non_null(first);
    char *second = strstr(first + 1, "<polyline");
    assert_non_null(second);
    assert_non_null(strstr(second + 1, "<polyline"));
    assert_non_null(strstr(svg, ">full<"));
    assert_non_null(strstr(svg, ">regional<"));
    assert_non_null(strstr(svg, ">regional+cache<"));
    free(svg);
}

static void test_table(void **state)
{
    (void)state;
    regc_test_proc p;
    int rc = regc_test_run_regc(&p, "coldstart", "--model", "gpt2-tiny", "--layers", "2",
                                "--repeat", "1", "--steps", "2", "--batch", "1", "--seq", "8",
                                "--threads", "1", NULL);
    if (rc != 0)
        fail_msg("regc coldstart failed (%d):\n%s", rc, p.err);
    assert_int_equal(regc_test_count_lines(p.out), 4); /* header and one row per mode */
    assert_non_null(strstr(p.out, "total_ms"));
    assert_non_null(strstr(p.out, " full "));
    assert_non_null(strstr(p.out, " regional "));
    assert_non_null(strstr(p.out, " regional+cache "));
    regc_test_proc_free(&p);
}

static void test_help(void **state)
{
    (void)state;
    static const char *const flags[] = {"--model", "--layers",  "--repeat", "--batch", "--seq",
                                        "--steps", "--threads", "--json",   "--svg"};
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "coldstart", "--help", NULL), 0);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(p.out, flags[i]))
            fail_msg("regc coldstart --help does not mention %s", flags[i]);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "help", "coldstart", NULL), 0);
    assert_non_null(strstr(p.out, "--layers"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "--help", NULL), 0);
    assert_non_null(strstr(p.out, "coldstart"));
    regc_test_proc_free(&p);
}

static void test_usage_errors(void **state)
{
    regc_test_dir *t = *state;
    static const struct {
        const char *flag, *value, *a, *b;
    } cases[] = {
        {"--bogus", "1", "--bogus", "unknown option"},
        {"--layers", "", "--layers", "\"\""},
        {"--layers", "1,,2", "--layers", "1,,2"},
        {"--layers", "1,2,", "--layers", "1,2,"},
        {"--layers", "2,x", "--layers", "\"x\""},
        {"--layers", "0", "--layers", "\"0\""},
        {"--layers", "-3", "--layers", "-3"},
        {"--layers", "2,4,2", "--layers", "twice"},
        {"--repeat", "0", "--repeat", "\"0\""},
        {"--repeat", "x", "--repeat", "\"x\""},
        {"--steps", "1", "--steps", "\"1\""},
        {"--batch", "0", "--batch", "\"0\""},
        {"--seq", "-1", "--seq", "\"-1\""},
        {"--threads", "x", "--threads", "\"x\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regc_test_proc p;
        regc_test_run_regc(&p, "coldstart", "--model", "gpt2-tiny", "--svg", t->path, cases[i].flag,
                           cases[i].value, NULL);
        regc_test_expect_one_line_error(&p, 2, cases[i].a, cases[i].b);
        assert_non_null(strstr(p.err, "regc coldstart"));
        regc_test_proc_free(&p);
        assert_false(regc_test_is_file(t->path));
    }

    regc_test_proc p;
    regc_test_run_regc(&p, "coldstart", "--layers", "1", NULL);
    regc_test_expect_one_line_error(&p, 2, "--model", "required");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "coldstart", "--model", "gpt2-tiny", "--repeat", NULL);
    regc_test_expect_one_line_error(&p, 2, "--repeat", "missing value");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "coldstart", "--model", "gpt2-tiny", "--json=1", NULL);
    regc_test_expect_one_line_error(&p, 2, "--json", "takes no value");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "coldstart", "--model", "gpt2-tiny", "stray", NULL);
    regc_test_expect_one_line_error(&p, 2, "stray", NULL);
    regc_test_proc_free(&p);
}

static void test_library_errors(void **state)
{
    regc_test_dir *t = *state;
    regc_test_proc p;
    regc_test_run_regc(&p, "coldstart", "--model", "gpt2-nonexistent", "--svg", t->path, NULL);
    regc_test_expect_one_line_error(&p, 1, "gpt2-nonexistent", NULL);
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(t->path));

    /* A graph JSON file has the depth it was built with. */
    char *graph = regc_test_join(t->dir, "g.json");
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", "--batch", "1",
                                        "--seq", "8", "--out", graph, NULL),
                     0);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "coldstart", "--model", graph, "--layers", "2", "--repeat", "1", "--svg",
                       t->path, NULL);
    regc_test_expect_one_line_error(&p, 1, graph, "depth");
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(t->path));
    free(graph);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_json_rows_and_svg, setup),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_help),
        regc_test_in_dir(test_usage_errors, setup),
        regc_test_in_dir(test_library_errors, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
