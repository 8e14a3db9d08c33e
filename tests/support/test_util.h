/* test_util.h — helpers shared by the CMocka tests (temporary directories,
 * whole-file reads, running the CLI). Append new helpers; keep old names. */
#ifndef REGC_TEST_UTIL_H
#define REGC_TEST_UTIL_H

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
    int status;     /* exit code, 128 + signal number if killed, -1 if not run */
    char *out;      /* stdout, NUL-terminated (never NULL after a run) */
    size_t out_len;
    char *err;      /* stderr, NUL-terminated (never NULL after a run) */
    size_t err_len;
} regc_test_proc;

/* Run argv[0] (a path, no shell, no PATH search) with argv, stdin from
 * /dev/null, capturing stdout and stderr separately. Returns r->status;
 * free the buffers with regc_test_proc_free. */
int regc_test_run_argv(const char *const *argv, regc_test_proc *r);
void regc_test_proc_free(regc_test_proc *r);

/* Write NUL-terminated `text` to dir/name (e.g. a config.json); 0 on success. */
int regc_test_write_text(const char *dir, const char *name, const char *text);

#endif
