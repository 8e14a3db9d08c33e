/* cli.c — strict parsing of flag values and usage errors, shared by the
 * `regc` commands. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "regc_common.h"

const char *usage_cmd = "regc";
int usage_quiet;

/* One line on stderr, prefixed with the command, and the usage exit code. */
int usage_error(const char *fmt, ...)
{
    va_list ap;
    if (usage_quiet)
        return EXIT_USAGE;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", usage_cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* Integers in [min, max], read strictly (regc_text_to_i64). */
int parse_int(const char *flag, const char *text, long long min, long long max, const char *what,
              long long *out)
{
    int64_t v;
    if (regc_text_to_i64(text, min, max, &v) == 0) {
        *out = v;
        return 0;
    }
    return usage_error("%s: expected %s, got \"%s\"", flag, what, text);
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

char *json_quote(const char *s)
{
    size_t n = strlen(s), k = 0;
    char *q = malloc(6 * n + 3);
    if (!q)
        return NULL;
    q[k++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            k += (size_t)sprintf(q + k, "\\%c", *p);
        else if (*p < 0x20)
            k += (size_t)sprintf(q + k, "\\u%04x", *p);
        else
            q[k++] = (char)*p;
    }
    q[k++] = '"';
    q[k] = '\0';
    return q;
}

void size_text(char *buf, size_t cap, int64_t bytes)
{
    const double b = (double)bytes;
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        snprintf(buf, cap, "%.1f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0)
        snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else
        snprintf(buf, cap, "%lld bytes", (long long)bytes);
}

void print_device_memory(FILE *f, const regc_device_memory *a, int ranks)
{
    char state[32], act[32], in[32], total[32];
    size_text(state, sizeof state, a->params + a->grads + a->m + a->v);
    size_text(act, sizeof act, a->activations);
    size_text(in, sizeof in, a->inputs + a->scalars);
    size_text(total, sizeof total, a->total);
    /* the padding: what the shards hold beyond an even split of the model */
    double even = (double)a->model_floats / ranks;
    fprintf(f, "device memory per rank: model state %s (%s x %lld", state,
            a->m ? "parameters, gradients, AdamW m and v: 16 bytes"
                 : "parameters and gradients: 8 bytes",
            (long long)a->block_floats);
    if (a->block_floats != a->model_floats)
        fprintf(f, " = 1/%d of %lld parameters + %.2f%% padding", ranks, (long long)a->model_floats,
                100.0 * ((double)a->block_floats - even) / even);
    fputc(')', f);
    if (a->frozen > 0) {
        char frozen[32];
        size_text(frozen, sizeof frozen, a->frozen);
        fprintf(f, ", frozen parameters %s", frozen);
    }
    fprintf(f, ", activations %s, inputs %s: %s", act, in, total);
    if (a->host > 0) {
        char host[32], opt[32], act_host[32];
        size_text(host, sizeof host, a->host);
        size_text(opt, sizeof opt, a->host - a->host_activations);
        size_text(act_host, sizeof act_host, a->host_activations);
        if (a->host_activations == 0)
            fprintf(f,
                    "; host memory %s (the optimizer's, offloaded: AdamW m and v and its copies "
                    "of the parameters and gradients)",
                    host);
        else if (a->host_activations == a->host)
            fprintf(f, "; host memory %s (offloaded activations)", host);
        else
            fprintf(f,
                    "; host memory %s (the optimizer's, offloaded, %s; offloaded activations %s)",
                    host, opt, act_host);
    }
    fputc('\n', f);
}

void print_zero3_schedule(FILE *f, const regc_compile_stats *st)
{
    fprintf(f, "ZeRO-3: %d gather units, ", st->zero3_units);
    if (st->zero3_prefetch == 0)
        fprintf(f, "each gathered where it is needed");
    else if (st->zero3_prefetch < 0)
        fprintf(f, "gathers start %lld unit%s ahead", (long long)-st->zero3_prefetch,
                st->zero3_prefetch == -1 ? "" : "s");
    else
        fprintf(f, "gathers start up to %lld parameters ahead", (long long)st->zero3_prefetch);
    fprintf(f, ", %d kept gathered from forward to backward\n", st->zero3_resident);
}
