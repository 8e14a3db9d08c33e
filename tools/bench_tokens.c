/* bench_tokens.c — what reading a batch of token data costs (a benchmark,
 * not a test): the time to open token files (every token checked against
 * the vocabulary and hashed), then the time per batch of B rows of T in
 * llm.c's order (one read of the data) and shuffled (a read per row, each
 * placed by the keyed permutation), from the page cache.
 *
 *   bench_tokens [--batch B] [--seq T] [--batches N] [--vocab V] FILE|PATTERN
 *
 * The best of three passes over N batches counts. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regc_data.h"

/* Batches 0 .. n-1 of t, ordered or shuffled: the best of three passes'
 * microseconds per batch. */
static double time_batches(regc_tokens *t, int shuffled, int64_t batch, int64_t seq, int64_t n,
                           int32_t *in, int32_t *tg)
{
    regc_tokens_set_shuffle(t, shuffled, 1337);
    double best = -1.0;
    for (int pass = 0; pass < 3; pass++) {
        const double t0 = regc_time_ms();
        for (int64_t k = 0; k < n; k++)
            if (regc_tokens_batch(t, k, batch, seq, in, tg) != REGC_OK) {
                fprintf(stderr, "bench_tokens: %s\n", regc_error_message());
                exit(1);
            }
        const double us = (regc_time_ms() - t0) * 1000.0 / (double)n;
        best = best < 0.0 || us < best ? us : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int64_t batch = 8, seq = 1024, batches = 200, vocab = 65536;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        int64_t *v = !strcmp(argv[i], "--batch")     ? &batch
                     : !strcmp(argv[i], "--seq")     ? &seq
                     : !strcmp(argv[i], "--batches") ? &batches
                     : !strcmp(argv[i], "--vocab")   ? &vocab
                                                     : NULL;
        if (v && i + 1 < argc && (*v = strtoll(argv[++i], NULL, 10)) > 0)
            continue;
        if (!v && argv[i][0] != '-' && !path) {
            path = argv[i];
            continue;
        }
        fprintf(stderr, "usage: bench_tokens [--batch B] [--seq T] [--batches N] [--vocab V] "
                        "FILE|PATTERN\n");
        return 2;
    }
    if (!path) {
        fprintf(stderr, "bench_tokens: no token file given\n");
        return 2;
    }
    regc_tokens *t = NULL;
    const double t0 = regc_time_ms();
    if (regc_tokens_open(path, vocab, &t) != REGC_OK) {
        fprintf(stderr, "bench_tokens: %s\n", regc_error_message());
        return 1;
    }
    const double open_ms = regc_time_ms() - t0;
    if (batch > INT32_MAX / seq) {
        fprintf(stderr, "bench_tokens: a batch of %lld x %lld is too large\n", (long long)batch,
                (long long)seq);
        return 2;
    }
    const int64_t count = regc_tokens_count(t);
    int32_t *in = malloc((size_t)(batch * seq) * sizeof *in),
            *tg = malloc((size_t)(batch * seq) * sizeof *tg);
    if (!in || !tg) {
        fprintf(stderr, "bench_tokens: out of memory\n");
        return 1;
    }
    printf("%s: %lld tokens opened (checked and hashed) in %.1f ms, %.0f M tokens/s\n", path,
           (long long)count, open_ms, (double)count / (open_ms * 1e3));
    printf("batch of %lld x %lld: llm.c's order %.1f us, shuffled %.1f us (best of 3 x %lld "
           "batches)\n",
           (long long)batch, (long long)seq, time_batches(t, 0, batch, seq, batches, in, tg),
           time_batches(t, 1, batch, seq, batches, in, tg), (long long)batches);
    free(in), free(tg);
    regc_tokens_free(t);
    return 0;
}
