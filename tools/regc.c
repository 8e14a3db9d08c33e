/* regc.c — the `regc` command: dispatch to one file per command
 * (tools/cmd_*.c). Everything that does work lives in the library
 * (its public headers, one per folder); the commands only turn flags into options and reports
 * into lines.
 *
 * Exit codes: 0 success, 1 the library reported an error, 2 a usage error. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef REGC_VERSION
#define REGC_VERSION "0.1.0"
#endif

static void print_usage(FILE *f)
{
    fputs("usage: regc <command> [options]\n"
          "\n"
          "commands:\n"
          "  train       train a model on token data and report each step\n"
          "  dump-graph  write a model's flat forward graph as regc graph JSON (or text)\n"
          "  detect      find the repeated layers of a model's flat graph\n"
          "  coldstart   time compiling (full, regional, regional from the compile cache) and the\n"
          "              first steps at several depths\n"
          "  cache       list, verify or clear the compile cache\n"
          "  version     print the version\n"
          "  help        print this text, or `regc help <command>` for a command's flags\n"
          "\n"
          "Run `regc <command> --help` for the options of a command.\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        if (argc == 2) {
            print_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "train")) {
            print_train_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "dump-graph")) {
            print_dump_graph_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "detect")) {
            print_detect_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "coldstart")) {
            print_coldstart_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "cache")) {
            print_cache_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[2], "version") || !strcmp(argv[2], "help")) {
            print_usage(stdout);
            return 0;
        }
        fprintf(stderr,
                "regc help: unknown command \"%s\" (commands: train, dump-graph, detect, "
                "coldstart, cache, version)\n",
                argv[2]);
        return EXIT_USAGE;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("regc %s\n", REGC_VERSION);
        return fflush(stdout) == 0 ? 0 : EXIT_ERROR;
    }
    if (!strcmp(cmd, "train"))
        return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "dump-graph"))
        return cmd_dump_graph(argc - 2, argv + 2);
    if (!strcmp(cmd, "detect"))
        return cmd_detect(argc - 2, argv + 2);
    if (!strcmp(cmd, "coldstart"))
        return cmd_coldstart(argc - 2, argv + 2);
    if (!strcmp(cmd, "cache"))
        return cmd_cache(argc - 2, argv + 2);
    fprintf(stderr,
            "regc: unknown command \"%s\" (commands: train, dump-graph, detect, coldstart, cache, "
            "version; see regc "
            "--help)\n",
            cmd);
    return EXIT_USAGE;
}
