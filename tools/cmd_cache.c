/* cmd_cache.c — `regc cache ls|verify|clear`: the compile cache's
 * directory for people.
 *
 * verify checks each entry as a lookup does: the cache layer its header,
 * checksums, compression and key; then, for entries of this build, the
 * compiler's decoder its payload (the cache layer sits below the compiler,
 * so the decoder comes in as a callback), which refuses anything that
 * would not run safely, as a compile would. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "regc_cache.h"
#include "regc_region.h"

void print_cache_usage(FILE *f)
{
    fputs("usage: regc cache <ls|verify|clear> [--dir DIR]\n"
          "\n"
          "The compile cache holds compiled layers and whole step programs, one file each,\n"
          "keyed on the structure they were compiled from (never on weights or parameter\n"
          "names), the level, the device and this build of regc.\n"
          "\n"
          "  ls      one line per entry: file, size, last use, what it holds; oldest first\n"
          "  verify  check every entry whole (header, checksums, decompression, key, and\n"
          "          the payload decoded and validated as a compile would use it);\n"
          "          exit status 1 when any is damaged (regc recompiles those by itself)\n"
          "  clear   remove every entry and leftover temporary file\n"
          "\n"
          "options:\n"
          "  --dir <DIR>   the cache directory (default $XDG_CACHE_HOME/regc, else\n"
          "                ~/.cache/regc)\n"
          "  -h, --help    print this text\n",
          f);
}

/* An entry's payload through the compiler's decoder; entries of another
 * build of regc (another version string) are that build's to read. */
static int check_entry(void *ctx, const char *version, const uint8_t *canon, size_t canon_len,
                       const uint8_t *payload, size_t payload_len)
{
    (void)ctx;
    if (strcmp(version, regc_cache_build_version()) != 0)
        return REGC_OK;
    return regc_compile_check_entry(canon, canon_len, payload, payload_len);
}

static int cache_list(const char *dir, int verify)
{
    regc_cache_entry *e;
    int n, bad = 0, temps = 0;
    int64_t total = 0;
    int rc = verify ? regc_cache_scan_checked(dir, check_entry, NULL, &e, &n)
                    : regc_cache_scan(dir, 0, &e, &n);
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    for (int i = 0; i < n; i++) {
        char when[32] = "?";
        struct tm tm;
        if (localtime_r(&e[i].used, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        total += e[i].bytes;
        if (e[i].temporary) {
            temps++;
            printf("%s  %9lld  %s  (temporary file of a writer)\n", e[i].file,
                   (long long)e[i].bytes, when);
        } else if (e[i].problem[0]) {
            bad++;
            printf("%s  %9lld  %s  DAMAGED: %s\n", e[i].file, (long long)e[i].bytes, when,
                   e[i].problem);
        } else if (!verify) {
            printf("%s  %9lld  %s  %s\n", e[i].file, (long long)e[i].bytes, when,
                   e[i].label ? e[i].label : "(unreadable header)");
        }
    }
    printf("%s: %d entr%s, %.1f MiB%s", dir, n - temps, n - temps == 1 ? "y" : "ies",
           (double)total / 1048576.0, temps ? "" : "\n");
    if (temps)
        printf(", %d temporary file%s\n", temps, temps == 1 ? "" : "s");
    if (verify)
        printf("%s\n", bad ? "damaged entries found" : "every entry is sound");
    regc_cache_entries_free(e, n);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    return bad ? EXIT_ERROR : 0;
}

int cmd_cache(int argc, char **argv)
{
    usage_cmd = "regc cache";
    const char *sub = NULL, *dir = NULL;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            print_cache_usage(stdout);
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (sub)
                return usage_error("unexpected argument \"%s\" (see regc cache --help)", arg);
            sub = arg;
            continue;
        }
        char flag[64];
        const char *value = split_flag(argc, argv, i, flag, sizeof flag);
        if (strcmp(flag, "--dir") != 0)
            return usage_error("unknown option %s (see regc cache --help)", flag);
        if (!value || !value[0])
            return usage_error("--dir: missing value");
        if (!strchr(arg, '='))
            i++;
        dir = value;
    }
    if (!sub || (strcmp(sub, "ls") && strcmp(sub, "verify") && strcmp(sub, "clear")))
        return usage_error("expected ls, verify or clear%s%s%s (see regc cache --help)",
                           sub ? ", got \"" : "", sub ? sub : "", sub ? "\"" : "");
    char def[4096];
    if (!dir) {
        if (regc_cache_default_dir(def, sizeof def) != REGC_OK) {
            fprintf(stderr, "regc: %s\n", regc_error_message());
            return EXIT_ERROR;
        }
        dir = def;
    }
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT) { /* nothing cached yet */
        printf("%s: no cache directory\n", dir);
        return 0;
    }
    if (!strcmp(sub, "clear")) {
        int removed;
        if (regc_cache_clear(dir, &removed) != REGC_OK) {
            fprintf(stderr, "regc: %s\n", regc_error_message());
            return EXIT_ERROR;
        }
        printf("%s: removed %d file%s\n", dir, removed, removed == 1 ? "" : "s");
        return 0;
    }
    return cache_list(dir, !strcmp(sub, "verify"));
}
