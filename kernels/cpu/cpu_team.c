/* cpu_team.c — when the CPU backend's loops go parallel, fitted to the
 * cores other processes leave free.
 *
 * Every parallel region ends at a barrier that waits for each thread of
 * the team, and a thread that has no core of its own waits for a time
 * slice first. On a machine whose cores are shared (another training run,
 * a build, ranks started beside each other), a step of a small model, made
 * of hundreds of short regions, went from 1.6 ms to 460 ms with two
 * threads beside two busy processes on two cores; at one thread it took
 * 3.3 ms. A large region (a GEMM of GPT-2 124M) still gains from the whole
 * team: its work outweighs the wait. So before each program run (at most
 * every TEAM_CHECK_MS) the backend looks whether other processes keep any
 * of its cores running, and while they do only loops REGC_CPU_CONTENDED_SCALE
 * times above the idle thresholds go parallel; on an idle machine the
 * thresholds are the idle ones again.
 *
 * Other processes' running threads: the kernel's count of runnable tasks
 * (/proc/loadavg), less this process's own (/proc/self/task/<tid>/stat in
 * state R: OpenMP workers still spinning at a barrier count as ours). A
 * sample is of one instant; a short-lived task costs at most one interval
 * of the contended thresholds. Results do not depend on which loops run in
 * parallel (every reduction is ordered by data,
 * tests/test_kernels_cpu_threads.c): only the speed changes. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "regc_common.h"

#define TEAM_CHECK_MS 20.0

/* The whole of a small /proc file into buf (NUL-terminated); its length
 * or -1. */
static ssize_t read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

/* Runnable tasks on the machine now, or -1. */
static int machine_running(void)
{
    char buf[128];
    int running, total;
    if (read_small("/proc/loadavg", buf, sizeof buf) <= 0 ||
        sscanf(buf, "%*s %*s %*s %d/%d", &running, &total) != 2)
        return -1;
    return running;
}

/* This process's threads in state R, or -1. */
static int own_running(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    char path[64], buf[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%.20s/stat", e->d_name);
        /* "tid (comm) S ...": the state follows the last ')' */
        if (read_small(path, buf, sizeof buf) <= 0)
            continue;
        char *close_paren = strrchr(buf, ')');
        n += close_paren && close_paren[1] == ' ' && close_paren[2] == 'R';
    }
    closedir(d);
    return n;
}

/* The cores this process may run on. */
static int usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int regc_cpu_cores_contended(int cores, int running, int own_running, int threads)
{
    int others = running > own_running ? running - own_running : 0;
    return cores - others < threads;
}

void regc_cpu_fit_team(regc_backend *be)
{
    regc_cpu_ctx *ctx = be->ctx;
    if (ctx->threads <= 1 || !ctx->fit_team)
        return;
    double now = regc_time_ms();
    if (ctx->team_checked_ms > 0.0 && now - ctx->team_checked_ms < TEAM_CHECK_MS)
        return;
    ctx->team_checked_ms = now;
    int all = machine_running(), own = own_running();
    if (all < 0 || own < 0)
        return;
    int contended = regc_cpu_cores_contended(usable_cores(), all, own, ctx->threads);
    ctx->par_scale = contended ? REGC_CPU_CONTENDED_SCALE : 1;
}
