/* test_fileio.c — every file regc reads is input: a FIFO, a device, a
 * directory or a file far larger than its kind is refused with one line
 * naming it, before a byte is read and without blocking; the `regc` command
 * does the same for every path a user can give it. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "regc_common.h"
#include "test_model.h"
#include "test_util.h"

static int setup(void **state) { return regc_test_dir_setup(state, "fileio", "file"); }

static void assert_error_names(int rc, const char *path, const char *why)
{
    assert_int_not_equal(rc, REGC_OK);
    const char *msg = regc_error_message();
    if (!strstr(msg, path) || !strstr(msg, why))
        fail_msg("expected an error naming %s and \"%s\", got: %s", path, why, msg);
}

static void test_regular_file_read_whole(void **state)
{
    regc_test_dir *d = *state;
    assert_int_equal(regc_test_write_text(d->dir, "file", "{\"a\": 1}"), 0);
    char *text;
    size_t len;
    assert_int_equal(regc_file_read_all(d->path, &text, &len), REGC_OK);
    assert_int_equal(len, 8);
    assert_string_equal(text, "{\"a\": 1}");
    free(text);

    /* An empty file is a file: zero bytes, not an error. */
    assert_int_equal(regc_test_write_file(d->path, "", 0), 0);
    assert_int_equal(regc_file_read_all(d->path, &text, &len), REGC_OK);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
}

static void test_fifo_refused_without_blocking(void **state)
{
    regc_test_dir *d = *state;
    assert_int_equal(mkfifo(d->path, 0600), 0);
    char *text = (char *)1;
    /* No writer ever opens the FIFO: a blocking open or read would hang here. */
    assert_error_names(regc_file_read_all(d->path, &text, NULL), d->path, "FIFO");
    assert_null(text);
    int fd = 7;
    assert_error_names(regc_file_open_regular(d->path, 0, &fd, NULL), d->path, "FIFO");
    assert_int_equal(fd, -1);
}

static void test_devices_and_directories_refused(void **state)
{
    regc_test_dir *d = *state;
    char *text;
    assert_error_names(regc_file_read_all("/dev/zero", &text, NULL), "/dev/zero",
                       "character device");
    assert_error_names(regc_file_read_all(d->dir, &text, NULL), d->dir, "directory");
    assert_error_names(regc_file_read_all(d->path, &text, NULL), d->path, "cannot open");
}

static void test_size_cap_from_fstat(void **state)
{
    regc_test_dir *d = *state;
    /* A sparse file past the text cap: refused from its size alone (reading
     * 300 MiB of zeros first would take seconds and the memory). */
    int fd = open(d->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)(REGC_TEXT_FILE_MAX + 1)), 0);
    close(fd);
    char *text;
    assert_error_names(regc_file_read_all(d->path, &text, NULL), d->path, "bytes, more than");

    /* The cap is inclusive: a file of exactly max_bytes is read. */
    assert_int_equal(regc_test_write_text(d->dir, "file", "12345"), 0);
    assert_int_equal(regc_file_read_capped(d->path, 5, &text, NULL), REGC_OK);
    free(text);
    assert_error_names(regc_file_read_capped(d->path, 4, &text, NULL), d->path,
                       "5 bytes, more than the 4");
    uint64_t size = 0;
    assert_int_equal(regc_file_open_regular(d->path, 0, &fd, &size), REGC_OK);
    assert_int_equal(size, 5);
    close(fd);
}

/* `regc train` given a FIFO or a device for each path it reads: one error
 * line naming the path, exit 1, and no hang (timeout(1) kills a hung child and
 * the status becomes 124). */
static void expect_cli_refusal(const char *const *args, const char *path)
{
    const char *argv[32] = {"/usr/bin/timeout", "60", REGC_BIN};
    int n = 3;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    regc_test_proc p;
    int status = regc_test_run_argv(argv, &p);
    /* Progress lines (the model, the compile) may come first; the error is
     * the last line, and the only one that starts with "regc: ". */
    const char *last = p.err_len > 1 ? p.err + p.err_len - 1 : p.err;
    while (last > p.err && last[-1] != '\n')
        last--;
    int errors = 0;
    for (const char *l = p.err; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        errors += strncmp(l, "regc: ", 6) == 0;
    if (status != 1 || errors != 1 || strncmp(last, "regc: ", 6) != 0 || !strstr(last, path))
        fail_msg("%s %s: expected exit 1 and one line naming %s, got %d:\n%s", args[0], args[1],
                 path, status, p.err);
    regc_test_proc_free(&p);
}

static void test_cli_refuses_unreadable_inputs(void **state)
{
    regc_test_dir *d = *state;
    assert_int_equal(mkfifo(d->path, 0600), 0);
    const char *const config[] = {"train", "--config", d->path, NULL};
    expect_cli_refusal(config, d->path);
    const char *const zero[] = {"train", "--config", "/dev/zero", NULL};
    expect_cli_refusal(zero, "/dev/zero");
    const char *const data[] = {"train", "--model", "gpt2-tiny", "--data",
                                d->path, "--steps", "1",         NULL};
    expect_cli_refusal(data, d->path);
    const char *const graph[] = {"train", "--model", d->path, "--steps", "1", NULL};
    expect_cli_refusal(graph, d->path);

    /* A model directory whose config.json is a FIFO. */
    snprintf(d->buf, sizeof d->buf, "%s/model", d->dir);
    assert_int_equal(mkdir(d->buf, 0700), 0);
    char cfg[2100];
    snprintf(cfg, sizeof cfg, "%s/config.json", d->buf);
    assert_int_equal(mkfifo(cfg, 0600), 0);
    const char *const dir[] = {"train", "--model", d->buf, "--steps", "1", NULL};
    expect_cli_refusal(dir, cfg);

    /* Weights named by --weights for a graph model. */
    char *json = regc_test_tiny_graph_json();
    assert_non_null(json);
    assert_int_equal(regc_test_write_text(d->dir, "graph.json", json), 0);
    free(json);
    char graph_json[1100];
    snprintf(graph_json, sizeof graph_json, "%s/graph.json", d->dir);
    const char *const weights[] = {"train", "--model", graph_json, "--weights",
                                   d->path, "--steps", "1",        NULL};
    expect_cli_refusal(weights, d->path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_regular_file_read_whole, setup),
        regc_test_in_dir(test_fifo_refused_without_blocking, setup),
        regc_test_in_dir(test_devices_and_directories_refused, setup),
        regc_test_in_dir(test_size_cap_from_fstat, setup),
        regc_test_in_dir(test_cli_refuses_unreadable_inputs, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
