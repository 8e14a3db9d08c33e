/* regc_data.h — token data: llm.c's token files and the built-in corpus.
 *
 * A token file is a 256-int32 header (magic 20240520, version 1, token
 * count) followed by uint16 tokens, so data prepared for llm.c works
 * unchanged. Batches are read in llm.c's order. */
#ifndef REGC_DATA_H
#define REGC_DATA_H

#include <stdint.h>

#include "regc_common.h"

typedef struct regc_tokens regc_tokens;
/* Open a token file, checking the header, the length and that every token
 * is < vocab. */
int regc_tokens_open(const char *path, int64_t vocab, regc_tokens **out);
/* The built-in corpus: a small English text as byte-level tokens (< 256). */
int regc_tokens_builtin(regc_tokens **out);
/* Write a token file (for tests and tools). */
int regc_tokens_write(const char *path, const uint16_t *tokens, int64_t n);
int64_t regc_tokens_count(const regc_tokens *t);
/* Batch k: inputs [B, T] = tokens[p .. p+B*T-1], targets = the next tokens,
 * p advancing by B*T each batch and wrapping to 0 when fewer than B*T+1
 * tokens remain. Needs count >= B*T + 1. */
int regc_tokens_batch(const regc_tokens *t, int64_t k, int64_t batch, int64_t seq, int32_t *inputs,
                      int32_t *targets);
void regc_tokens_free(regc_tokens *t);

#endif
