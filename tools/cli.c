/* cli.c — strict parsing of flag values and usage errors, shared by the
 * `regc` commands. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "regc_common.h"

const char *usage_cmd = "regc";

/* One line on stderr, prefixed with the command, and the usage exit code. */
int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", usage_cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* Integers in [min, max]; the text must be plain decimal digits (an
 * optional leading '-' only when min < 0), so " 5", "+5", "5x" and "0x10"
 * are all refused rather than half-read. */
int parse_int(const char *flag, const char *text, long long min, long long max,
                     const char *what, long long *out)
{
    const char *p = text;
    if (*p == '-' && min < 0)
        p++;
    int ok = *p != '\0';
    for (; *p; p++)
        if (*p < '0' || *p > '9')
            ok = 0;
    if (ok) {
        errno = 0;
        char *end;
        long long v = strtoll(text, &end, 10);
        if (errno == 0 && *end == '\0' && v >= min && v <= max) {
            *out = v;
            return 0;
        }
    }
    usage_error("%s: expected %s, got \"%s\"", flag, what, text);
    return -1;
}

/* Seeds span all of uint64 (the library's streams are keyed by 64 bits). */
int parse_u64(const char *flag, const char *text, uint64_t *out)
{
    int ok = *text != '\0';
    for (const char *p = text; *p; p++)
        if (*p < '0' || *p > '9')
            ok = 0;
    if (ok) {
        errno = 0;
        char *end;
        unsigned long long v = strtoull(text, &end, 10);
        if (errno == 0 && *end == '\0') {
            *out = (uint64_t)v;
            return 0;
        }
    }
    usage_error("%s: expected a non-negative integer below 2^64, got \"%s\"", flag, text);
    return -1;
}

/* Finite floats, > 0 when `positive`, else >= 0. */
int parse_float(const char *flag, const char *text, int positive, float *out)
{
    const char *what = positive ? "a positive number" : "a non-negative number";
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    /* strtod skips leading blanks and reads "inf"/"nan"; neither is a
     * learning rate someone meant to type. */
    int ok = text[0] != '\0' && !isspace((unsigned char)text[0]) && end != text &&
             *end == '\0' && errno == 0 && isfinite(v) && v <= 3.0e38 &&
             (positive ? v > 0.0 : v >= 0.0);
    if (!ok) {
        usage_error("%s: expected %s, got \"%s\"", flag, what, text);
        return -1;
    }
    *out = (float)v;
    if (positive && *out == 0.0f) { /* below float's range: would silently become 0 */
        usage_error("%s: %s is too small for a float", flag, text);
        return -1;
    }
    return 0;
}

/* JSON has no NaN or Infinity; a diverged step must still be a valid line. */
void json_number(char *buf, size_t cap, const char *fmt, double v)
{
    if (isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "null");
}

/* The flag name of argv[i] into flag, and its value: the text after "=",
 * else the next argument unless that is itself a flag ("--model --json"
 * means the value was forgotten, not that the model is called "--json");
 * NULL when there is none. */
const char *split_flag(int argc, char **argv, int i, char *flag, size_t cap)
{
    const char *arg = argv[i], *eq = strchr(arg, '=');
    if (eq) {
        size_t len = (size_t)(eq - arg);
        if (len >= cap)
            len = cap - 1;
        memcpy(flag, arg, len);
        flag[len] = '\0';
        return eq + 1;
    }
    snprintf(flag, cap, "%s", arg);
    return i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 ? argv[i + 1] : NULL;
}

/* "on" / "off" for the compile switches. */
int parse_switch(const char *flag, const char *text, int *out)
{
    if (!strcmp(text, "on") || !strcmp(text, "off")) {
        *out = !strcmp(text, "on");
        return 0;
    }
    usage_error("%s: expected on or off, got \"%s\"", flag, text);
    return -1;
}


int exit_code(int rc)
{
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: %s\n", regc_error_message());
        return EXIT_ERROR;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "regc: writing to standard output failed\n");
        return EXIT_ERROR;
    }
    return 0;
}
