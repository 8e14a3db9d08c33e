/* test_util.c — see test_util.h. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_common.h"
#include "test_util.h"

char *regc_test_make_temp_dir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    size_t cap = strlen(base) + strlen(tag) + 32;
    char *path = malloc(cap);
    if (!path)
        return NULL;
    snprintf(path, cap, "%s/regc-%s-XXXXXX", base, tag);
    if (!mkdtemp(path)) {
        perror(path);
        free(path);
        return NULL;
    }
    return path;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

int regc_test_remove_tree(const char *path)
{
    /* Depth first so directories are empty when removed; FTW_PHYS so a
     * symlink planted in a temp dir cannot lead the removal elsewhere. */
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *regc_test_read_file(const char *path, size_t *size)
{
    char *buf;
    return regc_file_read_all(path, &buf, size) == REGC_OK ? buf : NULL;
}

int regc_test_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(data, 1, size, f);
    int closed = fclose(f);
    return (put == size && closed == 0) ? 0 : -1;
}

/* Append n bytes to a growing NUL-terminated buffer; 0, or -1 out of memory. */
static int append_bytes(char **buf, size_t *len, size_t *cap, const char *src, size_t n)
{
    if (*cap - *len < n + 1) {
        size_t want = *cap ? *cap : 4096;
        while (want - *len < n + 1)
            want *= 2;
        char *grown = realloc(*buf, want);
        if (!grown)
            return -1;
        *buf = grown;
        *cap = want;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int regc_test_run_capture(const char *cmd, char **out)
{
    if (out)
        *out = NULL;
    fflush(NULL); /* keep the child's inherited stdio buffers empty */
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char *buf = NULL, chunk[4096];
    size_t len = 0, cap = 0, got;
    int failed = append_bytes(&buf, &len, &cap, "", 0);
    while (!failed && (got = fread(chunk, 1, sizeof chunk, p)) > 0)
        failed = append_bytes(&buf, &len, &cap, chunk, got);
    int status = pclose(p);
    if (failed) {
        free(buf);
        return -1;
    }
    if (out)
        *out = buf;
    else
        free(buf);
    if (status == -1)
        return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

char *regc_test_shell_quote(const char *s)
{
    /* Inside single quotes only ' itself is special: write it as '\''. */
    size_t n = 3;
    for (const char *c = s; *c; c++)
        n += (*c == '\'') ? 4 : 1;
    char *q = malloc(n);
    if (!q)
        return NULL;
    char *w = q;
    *w++ = '\'';
    for (const char *c = s; *c; c++) {
        if (*c == '\'') {
            memcpy(w, "'\\''", 4);
            w += 4;
        } else {
            *w++ = *c;
        }
    }
    *w++ = '\'';
    *w = '\0';
    return q;
}

/* ---- running a program with both streams captured ---------------------- */

int regc_test_run_argv(const char *const *argv, regc_test_proc *r)
{
    memset(r, 0, sizeof *r);
    r->status = -1;
    int out_pipe[2], err_pipe[2];
    if (pipe(out_pipe) != 0)
        return -1;
    if (pipe(err_pipe) != 0) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        return -1;
    }
    fflush(NULL); /* keep the child's inherited stdio buffers empty */
    pid_t pid = fork();
    if (pid < 0) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        close(err_pipe[0]);
        close(err_pipe[1]);
        return -1;
    }
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        dup2(out_pipe[1], 1);
        dup2(err_pipe[1], 2);
        close(out_pipe[0]);
        close(out_pipe[1]);
        close(err_pipe[0]);
        close(err_pipe[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out_pipe[1]);
    close(err_pipe[1]);

    /* Both pipes are drained together: a child that fills one while the
     * parent blocks on the other would otherwise never finish. */
    size_t out_cap = 0, err_cap = 0;
    int failed = append_bytes(&r->out, &r->out_len, &out_cap, "", 0) ||
                 append_bytes(&r->err, &r->err_len, &err_cap, "", 0);
    struct pollfd fds[2] = {{.fd = out_pipe[0], .events = POLLIN},
                            {.fd = err_pipe[0], .events = POLLIN}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            failed = 1;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char chunk[4096];
            ssize_t got = read(fds[i].fd, chunk, sizeof chunk);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
                continue;
            }
            if (i == 0)
                failed |= append_bytes(&r->out, &r->out_len, &out_cap, chunk, (size_t)got);
            else
                failed |= append_bytes(&r->err, &r->err_len, &err_cap, chunk, (size_t)got);
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);

    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    if (failed)
        return -1;
    if (WIFEXITED(status))
        r->status = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        r->status = 128 + WTERMSIG(status);
    return r->status;
}

void regc_test_proc_free(regc_test_proc *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
    r->out_len = r->err_len = 0;
}

/* ---- small text files in a directory ------------------------------------ */

int regc_test_write_text(const char *dir, const char *name, const char *text)
{
    size_t cap = strlen(dir) + strlen(name) + 2;
    char *path = malloc(cap);
    if (!path)
        return -1;
    snprintf(path, cap, "%s/%s", dir, name);
    int rc = regc_test_write_file(path, text, strlen(text));
    free(path);
    return rc;
}

/* ---- a temporary directory per test, error messages ---------------------- */

int regc_test_dir_setup(void **state, const char *tag, const char *file)
{
    regc_test_dir *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->dir = regc_test_make_temp_dir(tag);
    if (!f->dir) {
        free(f);
        return -1;
    }
    if (file)
        snprintf(f->path, sizeof f->path, "%s/%s", f->dir, file);
    *state = f;
    return 0;
}

int regc_test_dir_teardown(void **state)
{
    regc_test_dir *f = *state;
    regc_test_remove_tree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

void regc_test_expect_error(const char *a, const char *b)
{
    const char *msg = regc_error_message();
    if (!strstr(msg, a))
        fail_msg("error \"%s\" should contain \"%s\"", msg, a);
    if (b && !strstr(msg, b))
        fail_msg("error \"%s\" should contain \"%s\"", msg, b);
    if (strchr(msg, '\n'))
        fail_msg("error \"%s\" should be one line", msg);
}

const char *regc_test_path_in(regc_test_dir *f, const char *name)
{
    snprintf(f->buf, sizeof f->buf, "%s/%s", f->path, name);
    return f->buf;
}

char *regc_test_join(const char *dir, const char *name)
{
    size_t cap = strlen(dir) + strlen(name) + 2;
    char *s = malloc(cap);
    assert_non_null(s);
    snprintf(s, cap, "%s/%s", dir, name);
    return s;
}

int regc_test_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int regc_test_run_regc(regc_test_proc *p, ...)
{
    enum { max_args = 32 };
    const char *argv[max_args + 2] = {REGC_BIN};
    int n = 1;
    va_list ap;
    va_start(ap, p);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL;) {
        assert_true(n < max_args);
        argv[n++] = a;
    }
    va_end(ap);
    argv[n] = NULL;
    return regc_test_run_argv(argv, p);
}

int regc_test_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

void regc_test_expect_one_line_error(const regc_test_proc *p, int status, const char *a,
                                     const char *b)
{
    if (status >= 0 && p->status != status)
        fail_msg("expected exit %d, got %d; stderr:\n%s", status, p->status, p->err);
    if (regc_test_count_lines(p->err) != 1 || p->err[p->err_len - 1] != '\n' ||
        !strstr(p->err, a) || (b && !strstr(p->err, b)))
        fail_msg("expected one stderr line naming \"%s\" and \"%s\", got:\n%s", a, b ? b : "",
                 p->err);
    if (!strstr(p->err, "regc"))
        fail_msg("the error line does not name regc: %s", p->err);
    if (p->out_len != 0)
        fail_msg("an error wrote to stdout too:\n%s", p->out);
}

int regc_test_json_losses(const char *out, double *loss, int max)
{
    int n = 0;
    for (const char *line = out; *line;) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        cJSON *o = cJSON_ParseWithLength(line, (size_t)(nl - line));
        if (!o)
            fail_msg("stdout line is not JSON: %.*s", (int)(nl - line), line);
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "loss");
        if (cJSON_IsNumber(l)) {
            assert_true(n < max);
            loss[n++] = l->valuedouble;
        }
        cJSON_Delete(o);
        line = nl + 1;
    }
    return n;
}

int regc_test_train_losses_v(double *loss, int max, const char *const *args, va_list more)
{
    enum { max_args = 48 };
    const char *argv[max_args + 1] = {REGC_BIN, "train", "--json", "--no-cache"};
    int n = 4;
    for (; *args; args++) {
        assert_true(n < max_args);
        argv[n++] = *args;
    }
    for (const char *a; (a = va_arg(more, const char *)) != NULL;) {
        assert_true(n < max_args);
        argv[n++] = a;
    }
    argv[n] = NULL;
    regc_test_proc p;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("regc train failed (exit %d): %s", p.status, p.err);
    const int got = regc_test_json_losses(p.out, loss, max);
    regc_test_proc_free(&p);
    return got;
}

int regc_test_train_losses(double *loss, int max, const char *const *args, ...)
{
    va_list ap;
    va_start(ap, args);
    const int got = regc_test_train_losses_v(loss, max, args, ap);
    va_end(ap);
    return got;
}
