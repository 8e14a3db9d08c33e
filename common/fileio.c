/* fileio.c — bounded reads of regular files, whole-file reads, atomic writes, durable directories,
 * removing trees, paths and the clock. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "regc_common.h"

/* Every file regc reads is input: it may be a FIFO (a read would block
 * forever), a device (/dev/zero never ends) or far larger than anything of
 * its kind. So a file is opened non-blocking, checked with fstat before any
 * byte is read, and refused unless it is a regular file within the cap its
 * kind allows. O_NONBLOCK is harmless on a regular file, and is what keeps
 * open() itself from waiting for a FIFO's writer. */
int regc_file_try_open_regular(const char *path, uint64_t max_bytes, int *fd_out,
                               uint64_t *size_out, char *why, size_t cap)
{
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int missing = errno == ENOENT;
        snprintf(why, cap, "cannot open: %s", strerror(errno));
        return missing ? -1 : 0;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, cap, "cannot stat: %s", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, cap, "not a regular file (%s)",
                 S_ISDIR(st.st_mode)    ? "a directory"
                 : S_ISFIFO(st.st_mode) ? "a FIFO"
                 : S_ISCHR(st.st_mode)  ? "a character device"
                 : S_ISBLK(st.st_mode)  ? "a block device"
                 : S_ISSOCK(st.st_mode) ? "a socket"
                                        : "not a plain file");
    } else if (max_bytes && (uint64_t)st.st_size > max_bytes) {
        snprintf(why, cap, "%llu bytes, more than the %llu a file of its kind may have",
                 (unsigned long long)st.st_size, (unsigned long long)max_bytes);
    } else {
        *fd_out = fd;
        if (size_out)
            *size_out = (uint64_t)st.st_size;
        return 1;
    }
    close(fd);
    return 0;
}

int regc_file_open_regular(const char *path, uint64_t max_bytes, int *fd_out, uint64_t *size_out)
{
    char why[256];
    return regc_file_try_open_regular(path, max_bytes, fd_out, size_out, why, sizeof why) > 0
               ? REGC_OK
               : regc_error(REGC_ERR_IO, "%s: %s", path, why);
}

int regc_file_pread_full(int fd, const char *path, void *buf, size_t size, uint64_t offset,
                         const char *what)
{
    char *p = buf;
    while (size > 0) {
        ssize_t got = pread(fd, p, size, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return regc_error(REGC_ERR_IO, "%s: reading %s failed: %s", path, what,
                              strerror(errno));
        if (got == 0)
            return regc_error(REGC_ERR_FORMAT, "%s: truncated while reading %s", path, what);
        p += got;
        size -= (size_t)got;
        offset += (uint64_t)got;
    }
    return REGC_OK;
}

int regc_file_read_capped(const char *path, uint64_t max_bytes, char **out, size_t *size)
{
    *out = NULL;
    int fd;
    uint64_t len;
    int rc = regc_file_open_regular(path, max_bytes, &fd, &len);
    if (rc)
        return rc;
    char *buf = malloc((size_t)len + 1);
    if (!buf) {
        close(fd);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory reading %llu bytes", path,
                          (unsigned long long)len);
    }
    /* Read exactly the size fstat gave: a file that grows meanwhile is read
     * as it was, one that shrinks is an error rather than a short buffer. */
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, (size_t)len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(buf);
            close(fd);
            return e ? regc_error(REGC_ERR_IO, "%s: read error: %s", path, strerror(e))
                     : regc_error(REGC_ERR_IO, "%s: file shrank while being read", path);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *out = buf;
    if (size)
        *size = (size_t)len;
    return REGC_OK;
}

int regc_file_read_all(const char *path, char **out, size_t *size)
{
    return regc_file_read_capped(path, REGC_TEXT_FILE_MAX, out, size);
}

struct regc_atomic_file {
    char *path, *tmp;
    int fd;
};

int regc_atomic_open(const char *path, regc_atomic_file **out)
{
    *out = NULL;
    size_t plen = strlen(path);
    regc_atomic_file *f = calloc(1, sizeof *f);
    if (f) {
        f->path = strdup(path);
        f->tmp = malloc(plen + 32);
    }
    if (!f || !f->path || !f->tmp) {
        if (f)
            free(f->path), free(f->tmp);
        free(f);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    }
    snprintf(f->tmp, plen + 32, "%s.tmp.XXXXXX", path);
    if ((f->fd = mkstemp(f->tmp)) < 0) {
        int rc = regc_error(REGC_ERR_IO, "%s: cannot create a temporary file: %s", path,
                            strerror(errno));
        free(f->path), free(f->tmp), free(f);
        return rc;
    }
    *out = f;
    return REGC_OK;
}

int regc_atomic_pwrite(regc_atomic_file *f, const void *data, size_t size, uint64_t offset)
{
    const char *p = data;
    while (size > 0) {
        ssize_t w = pwrite(f->fd, p, size, (off_t)offset);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return regc_error(REGC_ERR_IO, "%s: write failed: %s", f->path,
                              w < 0 ? strerror(errno) : "no progress");
        p += w, offset += (uint64_t)w;
        size -= (size_t)w;
    }
    return REGC_OK;
}

void regc_atomic_abandon(regc_atomic_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    unlink(f->tmp);
    free(f->path), free(f->tmp), free(f);
}

int regc_atomic_commit(regc_atomic_file *f)
{
    int ok = fsync(f->fd) == 0;
    ok = close(f->fd) == 0 && ok;
    f->fd = -1;
    chmod(f->tmp, 0644); /* mkstemp makes 0600; checkpoints are ordinary files */
    if (!ok || rename(f->tmp, f->path) != 0) {
        int rc = regc_error(REGC_ERR_IO, "%s: write failed: %s", f->path, strerror(errno));
        regc_atomic_abandon(f);
        return rc;
    }
    free(f->path), free(f->tmp), free(f);
    return REGC_OK;
}

int regc_file_write_atomic(const char *path, const void *data, size_t size)
{
    regc_atomic_file *f;
    int rc = regc_atomic_open(path, &f);
    if (rc == REGC_OK && (rc = regc_atomic_pwrite(f, data, size, 0)) != REGC_OK)
        regc_atomic_abandon(f);
    else if (rc == REGC_OK)
        rc = regc_atomic_commit(f);
    return rc;
}

int regc_path_join(char *buf, size_t cap, const char *dir, const char *name)
{
    size_t dl = strlen(dir);
    int n = (dl > 0 && dir[dl - 1] == '/') ? snprintf(buf, cap, "%s%s", dir, name)
                                           : snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return regc_error(REGC_ERR_ARG, "%s/%s: path too long", dir, name);
    return REGC_OK;
}

/* The first number after `key` in a small kernel file, or -1. */
static int64_t read_kernel_number(const char *path, const char *key)
{
    FILE *f = fopen(path, "r"); /* /proc and /sys: not input, and st_size is 0 */
    if (!f)
        return -1;
    char line[256];
    int64_t v = -1;
    while (v < 0 && fgets(line, sizeof line, f)) {
        long long x;
        if (!strncmp(line, key, strlen(key)) && sscanf(line + strlen(key), " %lld", &x) == 1)
            v = (int64_t)x;
    }
    fclose(f);
    return v;
}

int64_t regc_host_memory_bytes(void)
{
    int64_t total = read_kernel_number("/proc/meminfo", "MemTotal:");
    total = total > 0 ? total * 1024 : 0;
    /* cgroup v2: "max" (no limit) does not parse, which is right */
    int64_t limit = read_kernel_number("/sys/fs/cgroup/memory.max", "");
    if (limit > 0 && (total == 0 || limit < total))
        total = limit;
    return total;
}

double regc_time_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int regc_make_dirs(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path)
        return regc_error(REGC_ERR_ARG, "%s: invalid directory name", dir);
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return regc_error(REGC_ERR_IO, "%s: cannot create directory: %s", path,
                              strerror(errno));
        path[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return regc_error(REGC_ERR_IO, "%s: not a directory", dir);
    return REGC_OK;
}

int regc_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return regc_error(REGC_ERR_IO, "%s: cannot open the directory: %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 ? REGC_OK
                            : regc_error(REGC_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

/* Depth first; a symbolic link is removed, never followed. */
int regc_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? REGC_OK : regc_error(REGC_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return regc_error(REGC_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
        struct dirent *e;
        int rc = REGC_OK;
        while (rc == REGC_OK && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char sub[4096];
            if ((rc = regc_path_join(sub, sizeof sub, path, e->d_name)) == REGC_OK)
                rc = regc_remove_tree(sub);
        }
        closedir(d);
        if (rc)
            return rc;
        return rmdir(path) == 0
                   ? REGC_OK
                   : regc_error(REGC_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    }
    return unlink(path) == 0
               ? REGC_OK
               : regc_error(REGC_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
}
