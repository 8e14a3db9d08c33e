/* stagedir.c — a directory that appears whole or not at all.
 *
 * A saved model or a checkpoint is several files (config.json and
 * model.safetensors, or those and the optimizer's moments and the run's
 * state) that only mean something together. Renaming them into place one
 * by one leaves, after a kill between two renames, a directory whose
 * config.json and weights disagree and that does not load. So every file
 * is written into a hidden sibling, `.NAME.tmp-HOST-PID`, made durable, and
 * the sibling takes the directory's place in one step:
 *
 *   - no directory there yet: rename(2) of the sibling;
 *   - one there: renameat2(RENAME_EXCHANGE) swaps the two atomically, and
 *     the old one, now under the sibling's name, is removed. Where the
 *     filesystem cannot exchange, the old one is renamed aside first (a
 *     kill between the two renames then leaves the new directory under the
 *     hidden name, whole, and no half-written one under the real name).
 *
 * Files of the old directory that the writer does not replace (a
 * tokenizer beside the weights) are carried over by hard link before the
 * swap; weights and configs are not: a directory keeps no weights of an
 * earlier save. A subdirectory cannot be carried over atomically, so a
 * target that has one is refused when the writer opens, before any work.
 *
 * A writer that was killed leaves its sibling behind (possibly hundreds of
 * MB); the next writer of the same directory removes every sibling whose
 * process, on this host, no longer runs (regc_staged_dir_remove_dead, which
 * the checkpoints' pruning also runs over every checkpoint's name). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "regc_common.h"

struct regc_staged_dir {
    char dir[4096];    /* where the directory appears */
    char parent[4096]; /* its parent */
    char tmp[4096];    /* the hidden sibling being written */
};

/* dir's parent and last component, without trailing slashes. */
static int split_path(const char *dir, char *parent, size_t pcap, char *base, size_t bcap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    if (n == b || n - b >= bcap || (n - b == 1 && dir[b] == '.') ||
        (n - b == 2 && !strncmp(dir + b, "..", 2)))
        return regc_error(REGC_ERR_ARG, "%s: not a directory name a model can be saved to", dir);
    snprintf(base, bcap, "%.*s", (int)(n - b), dir + b);
    if (b == 0)
        snprintf(parent, pcap, ".");
    else if (b == 1)
        snprintf(parent, pcap, "/");
    else if (b - 1 >= pcap)
        return regc_error(REGC_ERR_ARG, "%s: path too long", dir);
    else
        snprintf(parent, pcap, "%.*s", (int)(b - 1), dir);
    return REGC_OK;
}

/* This host's name as a sibling's name carries it: no '/' and no '-'. */
static void host_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "host");
    gethostname(buf, cap - 1);
    buf[cap - 1] = '\0';
    for (char *c = buf; *c; c++)
        if (*c == '/' || *c == '-')
            *c = '_';
}

void regc_staged_dir_remove_dead(const char *parent, const char *name_prefix)
{
    char host[256], mark[300];
    host_name(host, sizeof host);
    snprintf(mark, sizeof mark, ".tmp-%s-", host);
    size_t plen = strlen(name_prefix), mlen = strlen(mark);
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* .NAME.tmp-HOST-PID, or .NAME.tmp-HOST-PID.old, NAME starting with the prefix */
        const char *t = strstr(e->d_name, mark);
        if (e->d_name[0] != '.' || strncmp(e->d_name + 1, name_prefix, plen) != 0 || !t)
            continue;
        char *end;
        long pid = strtol(t + mlen, &end, 10);
        if ((*end && strcmp(end, ".old")) || pid <= 0 || pid == (long)getpid())
            continue;
        /* ESRCH: no such process; EPERM would be a live one of another user */
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
            regc_remove_tree(path);
        }
    }
    closedir(d);
}

/* What a save never carries over from the directory it replaces. */
static int is_rewritten(const char *name)
{
    size_t n = strlen(name);
    return name[0] == '.' || !strcmp(name, "config.json") || !strcmp(name, "graph.json") ||
           (n > 12 && !strcmp(name + n - 12, ".safetensors")) ||
           (n > 23 && !strcmp(name + n - 23, ".safetensors.index.json"));
}

/* A target directory a save may replace: absent, or a directory without
 * subdirectories (what cannot be carried over in one step). */
static int check_target(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? REGC_OK : regc_error(REGC_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return regc_error(REGC_ERR_IO, "%s: exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d)
        return regc_error(REGC_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    int rc = REGC_OK;
    struct dirent *e;
    while (rc == REGC_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || is_rewritten(e->d_name))
            continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            rc = regc_error(REGC_ERR_IO,
                            "%s: holds the subdirectory %s, which a save cannot carry over; "
                            "save to a new or empty directory",
                            dir, e->d_name);
    }
    closedir(d);
    return rc;
}

int regc_staged_dir_open(const char *dir, regc_staged_dir **out)
{
    *out = NULL;
    regc_staged_dir *s = calloc(1, sizeof *s);
    if (!s)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", dir);
    char base[256], host[256];
    int rc = split_path(dir, s->parent, sizeof s->parent, base, sizeof base);
    if (rc == REGC_OK)
        rc = regc_make_dirs(s->parent);
    if (rc == REGC_OK)
        rc = check_target(dir);
    if (rc) {
        free(s);
        return rc;
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    regc_staged_dir_remove_dead(s->parent, base);
    host_name(host, sizeof host);
    int n =
        snprintf(s->tmp, sizeof s->tmp, "%s/.%s.tmp-%s-%ld", s->parent, base, host, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof s->tmp) {
        free(s);
        return regc_error(REGC_ERR_ARG, "%s: path too long", dir);
    }
    if (mkdir(s->tmp, 0755) != 0) {
        rc = regc_error(REGC_ERR_IO, "%s: cannot create a directory beside it: %s", dir,
                        strerror(errno));
        free(s);
        return rc;
    }
    *out = s;
    return REGC_OK;
}

const char *regc_staged_dir_path(const regc_staged_dir *s) { return s->tmp; }

void regc_staged_dir_abandon(regc_staged_dir *s)
{
    if (!s)
        return;
    regc_remove_tree(s->tmp);
    free(s);
}

/* Hard-link into the sibling what the old directory holds and the writer
 * did not replace. */
static int carry_over(const regc_staged_dir *s)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return errno == ENOENT
                   ? REGC_OK
                   : regc_error(REGC_ERR_IO, "%s: cannot list: %s", s->dir, strerror(errno));
    int rc = REGC_OK;
    struct dirent *e;
    while (rc == REGC_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || is_rewritten(e->d_name))
            continue;
        char from[8192], to[8192];
        snprintf(from, sizeof from, "%s/%s", s->dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", s->tmp, e->d_name);
        if (access(to, F_OK) == 0)
            continue; /* written anew */
        if (link(from, to) != 0)
            rc = regc_error(REGC_ERR_IO, "%s: cannot carry over to the new save: %s", from,
                            strerror(errno));
    }
    closedir(d);
    return rc;
}

/* The sibling into dir's place, an existing dir replaced by `replace`
 * (exchange, or aside where the filesystem cannot), then the old or the
 * failed new one removed. */
static int staged_commit(regc_staged_dir *s, int (*replace)(regc_staged_dir *s))
{
    int rc = carry_over(s);
    if (rc == REGC_OK)
        rc = regc_fsync_dir(s->tmp);
    struct stat st;
    int replacing = rc == REGC_OK && lstat(s->dir, &st) == 0;
    if (rc == REGC_OK && !replacing && rename(s->tmp, s->dir) != 0)
        rc = regc_error(REGC_ERR_IO, "%s: cannot rename into place: %s", s->dir, strerror(errno));
    if (rc == REGC_OK && replacing)
        rc = replace(s);
    if (rc == REGC_OK)
        rc = regc_fsync_dir(s->parent);
    /* after a swap the sibling holds the old directory; else the failed new one */
    regc_staged_dir_abandon(s);
    return rc;
}

/* Where there is no exchange: the old one aside, then the new one in; a
 * kill between the two leaves the new directory whole under the hidden
 * name and none half-written under the real one. */
static int staged_replace_aside(regc_staged_dir *s)
{
    char aside[4200];
    snprintf(aside, sizeof aside, "%s.old", s->tmp);
    if (rename(s->dir, aside) != 0)
        return regc_error(REGC_ERR_IO, "%s: cannot replace: %s", s->dir, strerror(errno));
    if (rename(s->tmp, s->dir) != 0) {
        int rc = regc_error(REGC_ERR_IO, "%s: cannot replace: %s", s->dir, strerror(errno));
        rename(aside, s->dir); /* the old one back */
        return rc;
    }
    rename(aside, s->tmp); /* the old one, to be removed with the sibling */
    return REGC_OK;
}

/* The two swapped in one step; aside where the filesystem cannot. */
static int staged_replace_exchange(regc_staged_dir *s)
{
    if (renameat2(AT_FDCWD, s->tmp, AT_FDCWD, s->dir, RENAME_EXCHANGE) == 0)
        return REGC_OK;
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
        return regc_error(REGC_ERR_IO, "%s: cannot replace: %s", s->dir, strerror(errno));
    return staged_replace_aside(s);
}

int regc_staged_dir_commit(regc_staged_dir *s) { return staged_commit(s, staged_replace_exchange); }

int regc_staged_dir_commit_aside(regc_staged_dir *s)
{
    return staged_commit(s, staged_replace_aside);
}

int regc_staged_dir_probe(const char *dir)
{
    regc_staged_dir *s;
    int rc = regc_staged_dir_open(dir, &s);
    if (rc == REGC_OK)
        regc_staged_dir_abandon(s);
    return rc;
}
