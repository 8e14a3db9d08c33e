/* test_util.h — helpers shared by the CMocka tests (temporary directories,
 * whole-file reads, running the CLI, error messages). Append new helpers;
 * keep old names. */
#ifndef REGC_TEST_UTIL_H
#define REGC_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>

/* Create a fresh directory under $TMPDIR (or /tmp) named after `tag`;
 * returns a malloc'd path, or NULL (with a message on stderr). */
char *regc_test_make_temp_dir(const char *tag);
/* Remove a file or a directory tree (no symlink is followed); 0 on success. */
int regc_test_remove_tree(const char *path);
/* Read a whole file (NUL-terminated, *size excludes the NUL; size may be
 * NULL); returns a malloc'd buffer, or NULL when it cannot be read. */
char *regc_test_read_file(const char *path, size_t *size);
/* Write `size` bytes to path (not atomically: tests build bad files too). */
int regc_test_write_file(const char *path, const void *data, size_t size);
/* Run a shell command, capturing its stdout into a malloc'd string (*out,
 * may be NULL to discard); stderr passes through to the test's stderr.
 * Returns the exit status, 128 + signal number if killed, or -1 if the
 * command could not be run. */
int regc_test_run_capture(const char *cmd, char **out);
/* Quote a string for /bin/sh by wrapping it in single quotes; malloc'd. */
char *regc_test_shell_quote(const char *s);

/* A finished child process: its exit status and both output streams. */
typedef struct {
    int status; /* exit code, 128 + signal number if killed, -1 if not run */
    char *out;  /* stdout, NUL-terminated (never NULL after a run) */
    size_t out_len;
    char *err; /* stderr, NUL-terminated (never NULL after a run) */
    size_t err_len;
} regc_test_proc;

/* Run argv[0] (a path, no shell, no PATH search) with argv, stdin from
 * /dev/null, capturing stdout and stderr separately. Returns r->status;
 * free the buffers with regc_test_proc_free. */
int regc_test_run_argv(const char *const *argv, regc_test_proc *r);
void regc_test_proc_free(regc_test_proc *r);

/* Write NUL-terminated `text` to dir/name (e.g. a config.json); 0 on success. */
int regc_test_write_text(const char *dir, const char *name, const char *text);

/* A CMocka fixture: a fresh temporary directory for each test. */
typedef struct {
    char *dir;       /* made by regc_test_dir_setup, removed with its contents */
    char path[1024]; /* dir/file: what the test works on ("" without a file) */
    char buf[2048];  /* scratch space for other paths */
} regc_test_dir;

/* Make *state a new regc_test_dir whose directory is named after `tag` and
 * whose path is dir/file (file may be NULL); 0 on success, -1 on failure. */
int regc_test_dir_setup(void **state, const char *tag, const char *file);
/* f->path/name in f->buf (overwritten by the next call). */
const char *regc_test_path_in(regc_test_dir *f, const char *name);
/* Remove the directory tree and free the fixture; always 0. */
int regc_test_dir_teardown(void **state);
/* A CMocka test entry run in a regc_test_dir made by `setup` (a function
 * that calls regc_test_dir_setup) and removed by regc_test_dir_teardown. */
#define regc_test_in_dir(test, setup)                                                              \
    cmocka_unit_test_setup_teardown(test, setup, regc_test_dir_teardown)

/* Fail the test, showing the message, unless regc's last error message
 * contains `a` and `b` (b may be NULL) and is a single line. */
void regc_test_expect_error(const char *a, const char *b);

/* dir/name in a new malloc'd string (the test fails if out of memory). */
char *regc_test_join(const char *dir, const char *name);
/* 1 when path is a regular file. */
int regc_test_is_file(const char *path);

/* Run the regc binary (REGC_BIN) with the given arguments, NULL-terminated,
 * capturing its output like regc_test_run_argv. */
int regc_test_run_regc(regc_test_proc *p, ...) __attribute__((sentinel));
/* Number of '\n' in s. */
int regc_test_count_lines(const char *s);
/* Fail unless p is a usage or load error as regc gives one: exit `status`
 * (-1: not checked), exactly one line on stderr that names regc, `a` and
 * `b` (b may be NULL), and nothing on stdout (a sanitizer report or a stray
 * diagnostic would add lines). */
void regc_test_expect_one_line_error(const regc_test_proc *p, int status, const char *a,
                                     const char *b);
/* The "loss" of each line of a `regc train --json` stdout that has one, in
 * order (at most max); every line must be JSON. */
int regc_test_json_losses(const char *out, double *loss, int max);
/* `regc train --json --no-cache` with `args` (NULL-terminated) and then
 * the NULL-terminated arguments of `more`: it must exit 0; its step
 * losses (at most max) go to loss, their number returned. */
int regc_test_train_losses_v(double *loss, int max, const char *const *args, va_list more);
int regc_test_train_losses(double *loss, int max, const char *const *args, ...)
    __attribute__((sentinel));

#endif
