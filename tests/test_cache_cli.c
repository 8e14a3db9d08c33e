/* test_cache_cli.c — `regc cache ls|verify|clear`: listing entries with
 * their labels, reporting damage with exit status 1, clearing, and usage
 * errors. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
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
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "regc_cache.h"
#include "regc_common.h"
#include "test_cache_util.h"
#include "test_util.h"

/* t->path is the cache directory (not made yet: regc_cache_open makes it). */
static int setup(void **state) { return regc_test_dir_setup(state, "cache", "c"); }

/* ---------------------------------------------------------------- 8. regc cache */

/* The line of `out` containing `s`, copied into buf; fails if none. */
static void line_with(const char *out, const char *s, char *buf, size_t cap)
{
    const char *hit = strstr(out, s);
    if (!hit)
        fail_msg("no line with \"%s\" in:\n%s", s, out);
    const char *start = hit;
    while (start > out && start[-1] != '\n')
        start--;
    const char *end = strchr(hit, '\n');
    size_t n = end ? (size_t)(end - start) : strlen(start);
    snprintf(buf, cap, "%.*s", (int)n, start);
}

static void test_cli_ls_verify_clear(void **state)
{
    regc_test_dir *t = *state;
    regc_cache *c = regc_test_open_cache(t->path, 0, NULL);
    regc_bytes pa = regc_test_noise(3000, 3), pb = regc_test_text("a step program");
    regc_test_cache_put(c, "A", "layer kind 1 (O1, cpu)", &pa);
    regc_test_cache_put(c, "B", "whole step (O1, cpu)", &pb);
    regc_cache_close(c);
    char path_a[1200], path_b[1200], line[1400];
    regc_test_entry_path(t->path, "layer kind 1 (O1, cpu)", path_a, sizeof path_a);
    regc_test_entry_path(t->path, "whole step (O1, cpu)", path_b, sizeof path_b);

    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 3);
    line_with(p.out, regc_test_base_name(path_a), line, sizeof line);
    assert_non_null(strstr(line, "layer kind 1 (O1, cpu)"));
    line_with(p.out, regc_test_base_name(path_b), line, sizeof line);
    assert_non_null(strstr(line, "whole step (O1, cpu)"));
    line_with(p.out, "2 entries", line, sizeof line);
    assert_non_null(strstr(line, t->path));
    assert_int_equal(p.err_len, 0);
    regc_test_proc_free(&p);

    /* --dir=D is the same option. */
    char opt[1300];
    snprintf(opt, sizeof opt, "--dir=%s", t->path);
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", opt, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 3);
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "every entry is sound"));
    assert_null(strstr(p.out, "DAMAGED"));
    regc_test_proc_free(&p);

    /* One flipped byte in A's body: verify names A, and only A. */
    size_t n;
    uint8_t *a = regc_test_read_bytes(path_a, &n);
    a[n - 100] ^= 0x04;
    regc_test_write_bytes(path_a, a, n);
    free(a);
    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 1);
    line_with(p.out, regc_test_base_name(path_a), line, sizeof line);
    assert_non_null(strstr(line, "DAMAGED"));
    assert_null(strstr(p.out, regc_test_base_name(path_b)));
    assert_null(strstr(p.out, "every entry is sound"));
    assert_non_null(strstr(p.out, "damaged entries found"));
    regc_test_proc_free(&p);

    /* A writer's temporary file is listed as such and counted apart. */
    char temp[1300];
    snprintf(temp, sizeof temp, "%s.tmp.Q1w2E3", path_b);
    regc_test_write_bytes(temp, "partial", 7);
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 4);
    line_with(p.out, regc_test_base_name(temp), line, sizeof line);
    assert_non_null(strstr(line, "temporary"));
    line_with(p.out, "2 entries", line, sizeof line);
    assert_non_null(strstr(line, "1 temporary file"));
    regc_test_proc_free(&p);

    assert_int_equal(regc_test_run_regc(&p, "cache", "clear", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "removed 3 files"));
    regc_test_proc_free(&p);
    assert_false(regc_test_exists(path_a) || regc_test_exists(path_b) || regc_test_exists(temp));
    assert_true(regc_test_exists(t->path)); /* the directory itself stays */
    assert_int_equal(regc_test_run_regc(&p, "cache", "ls", "--dir", t->path, NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 1);
    assert_non_null(strstr(p.out, "0 entries"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "every entry is sound"));
    regc_test_proc_free(&p);
    regc_bytes_free(&pa), regc_bytes_free(&pb);
}

/* Nothing cached yet is not an error, and looking does not create it. */
static void test_cli_missing_dir(void **state)
{
    regc_test_dir *t = *state;
    static const char *const subs[] = {"ls", "verify", "clear"};
    for (int i = 0; i < 3; i++) {
        regc_test_proc p;
        assert_int_equal(regc_test_run_regc(&p, "cache", subs[i], "--dir", t->path, NULL), 0);
        assert_non_null(strstr(p.out, "no cache directory"));
        assert_non_null(strstr(p.out, t->path));
        assert_int_equal(regc_test_count_lines(p.out), 1);
        regc_test_proc_free(&p);
        assert_false(regc_test_exists(t->path));
    }
}

static void test_cli_usage(void **state)
{
    regc_test_dir *t = *state;
    regc_test_proc p;
    regc_test_run_regc(&p, "cache", NULL);
    regc_test_expect_one_line_error(&p, 2, "expected ls, verify or clear", NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "lss", "--dir", t->path, NULL);
    regc_test_expect_one_line_error(&p, 2, "\"lss\"", NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--bogus", NULL);
    regc_test_expect_one_line_error(&p, 2, "--bogus", NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--dir", NULL);
    regc_test_expect_one_line_error(&p, 2, "--dir", NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--dir=", NULL);
    regc_test_expect_one_line_error(&p, 2, "--dir", NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "--dir", "--bogus", NULL);
    regc_test_expect_one_line_error(&p, 2, "--dir", NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "cache", "ls", "verify", NULL);
    regc_test_expect_one_line_error(&p, 2, "\"verify\"", NULL);
    regc_test_proc_free(&p);
    assert_false(regc_test_exists(t->path));

    const char *help[][3] = {
        {"cache", "--help", NULL}, {"cache", "-h", NULL}, {"help", "cache", NULL}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(regc_test_run_regc(&p, help[i][0], help[i][1], NULL), 0);
        assert_non_null(strstr(p.out, "usage: regc cache"));
        assert_non_null(strstr(p.out, "  ls "));
        assert_non_null(strstr(p.out, "  verify "));
        assert_non_null(strstr(p.out, "  clear "));
        assert_non_null(strstr(p.out, "--dir"));
        assert_int_equal(p.err_len, 0);
        regc_test_proc_free(&p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_cli_ls_verify_clear, setup),
        regc_test_in_dir(test_cli_missing_dir, setup),
        regc_test_in_dir(test_cli_usage, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
