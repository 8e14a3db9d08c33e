/* regc.c — the `regc` command: dispatch to one file per command
 * (tools/cmd_*.c) through one table. Everything that does work lives in the
 * library (its public headers, one per folder); the commands only turn
 * flags into options and reports into lines.
 *
 * Exit codes: 0 success, 1 the library reported an error, 2 a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "regc_backend.h"

#ifndef REGC_VERSION
#define REGC_VERSION "0.1.0"
#endif

/* How long an OpenMP thread spins at a barrier before it sleeps.
 * libgomp's default, 300,000 spins (milliseconds), is made for a machine
 * of one's own: where the cores are shared (MPI ranks on one host, any
 * other busy process), the spinning threads burn the time slice that the
 * thread they wait for needs, and a step of a small model went from 0.9 ms
 * to hundreds of milliseconds. A short spin, then sleep, keeps the idle
 * speed and degrades to a fair share under load (tools/bench_shared_cores.sh
 * measures both; README, Performance). libgomp reads the setting once, from
 * the environment, in its own initializer, before main and before any
 * code of regc can run; so regc, when neither OMP_WAIT_POLICY nor
 * GOMP_SPINCOUNT is set, sets GOMP_SPINCOUNT and executes itself again
 * (about a millisecond, once). A user's setting is left as it is. */
#define REGC_GOMP_SPINCOUNT "100000"

static void exec_with_short_spin(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return;
    if (setenv("GOMP_SPINCOUNT", REGC_GOMP_SPINCOUNT, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT"); /* no /proc: run on with libgomp's default */
}

static const struct {
    const char *name;
    int (*run)(int argc, char **argv); /* argv after the command's name */
    void (*usage)(FILE *f);
    const char *summary;
} commands[] = {
    {"train", cmd_train, print_train_usage, "train a model on token data and report each step"},
    {"dump-graph", cmd_dump_graph, print_dump_graph_usage,
     "write a model's flat forward graph as regc graph JSON (or text)"},
    {"detect", cmd_detect, print_detect_usage, "find the repeated layers of a model's flat graph"},
    {"coldstart", cmd_coldstart, print_coldstart_usage,
     "time compiling (full, regional, cached) and first steps at several depths"},
    {"cache", cmd_cache, print_cache_usage, "list, verify or clear the compile cache"},
    {"plan", cmd_plan, print_plan_usage,
     "per-rank device memory and communication of a run on N ranks, from shapes alone"},
    {"merge", cmd_merge, print_merge_usage,
     "merge a LoRA adapter into its base and save the merged model"},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void print_usage(FILE *f)
{
    fputs("usage: regc <command> [options]\n\ncommands:\n", f);
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fputs("  version     print the version\n"
          "  help        print this text, or `regc help <command>` for a command's flags\n"
          "\n"
          "Run `regc <command> --help` for the options of a command.\n",
          f);
}

/* "train, dump-graph, ..., version" for messages. */
static void command_list(char *buf, size_t cap)
{
    size_t n = 0;
    for (int i = 0; i < N_COMMANDS && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s, ", commands[i].name);
    if (n < cap)
        snprintf(buf + n, cap - n, "version");
}

static int find_command(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    exec_with_short_spin(argv);
    if (argc < 2) {
        print_usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    char list[256];
    command_list(list, sizeof list);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        int k = argc > 2 ? find_command(argv[2]) : -1;
        if (argc == 2 || !strcmp(argv[2], "version") || !strcmp(argv[2], "help")) {
            print_usage(stdout);
            return 0;
        }
        if (k >= 0) {
            commands[k].usage(stdout);
            return 0;
        }
        fprintf(stderr, "regc help: unknown command \"%s\" (commands: %s)\n", argv[2], list);
        return EXIT_USAGE;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        /* the GEMM regc train would run here: regc_backend.h names them */
        printf("regc %s\ncpu GEMM: %s (this CPU runs:", REGC_VERSION, regc_backend_cpu_gemm_name());
        for (int i = 0; regc_backend_cpu_gemm_at(i); i++)
            if (regc_backend_cpu_gemm_runs(regc_backend_cpu_gemm_at(i)))
                printf(" %s", regc_backend_cpu_gemm_at(i));
        printf(")\n");
        return fflush(stdout) == 0 ? 0 : EXIT_ERROR;
    }
    int k = find_command(cmd);
    if (k >= 0)
        return commands[k].run(argc - 2, argv + 2);
    fprintf(stderr, "regc: unknown command \"%s\" (commands: %s; see regc --help)\n", cmd, list);
    return EXIT_USAGE;
}
