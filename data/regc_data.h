/* regc_data.h — token data: llm.c's token files, loss masks beside them,
 * and the built-in corpus.
 *
 * A token file is a 256-int32 header (magic 20240520, version 1, token
 * count) followed by uint16 tokens, or (llm.c's format for Llama 3's
 * vocabulary) magic 20240801, version 7 and uint32 tokens, so data
 * prepared for llm.c works unchanged. A loss mask is the same header with magic 20240601 followed
 * by one byte per token: 1 when predicting that token counts toward the
 * loss (a response in supervised fine-tuning), 0 when it does not (the
 * prompt). Where a path is taken, a pattern (with * ? or [) names shards:
 * their tokens one after another in the byte order of the names, as one
 * file; masks then follow the shards file for file. Every token is checked
 * and hashed at open; batches read the files again, so nothing is held in
 * memory. Batches are read in llm.c's order, or shuffled: each epoch a
 * permutation of the data's rows. */
#ifndef REGC_DATA_H
#define REGC_DATA_H

#include <stdint.h>

#include "regc_common.h"

typedef struct regc_tokens regc_tokens;
/* Open a token file or the shards a pattern names, checking each header,
 * each length and that every token is < vocab (vocab <= 0: no bound). */
int regc_tokens_open(const char *path, int64_t vocab, regc_tokens **out);
/* The tokens of a file or of the shards a pattern names, from their
 * headers alone. */
int regc_tokens_count_files(const char *path, int64_t *count);
/* The same for a whole file image in memory; `source` names it in messages
 * (and in the batch errors of *out). */
int regc_tokens_parse(const char *source, const void *bytes, size_t size, int64_t vocab,
                      regc_tokens **out);
/* The built-in corpus: a small English text as byte-level tokens (< 256). */
int regc_tokens_builtin(regc_tokens **out);
/* Write a token file (for tests and tools): llm.c's GPT-2 format of
 * uint16 tokens, or (write32) its Llama 3 format of uint32 ones. */
int regc_tokens_write(const char *path, const uint16_t *tokens, int64_t n);
int regc_tokens_write32(const char *path, const uint32_t *tokens, int64_t n);
int64_t regc_tokens_count(const regc_tokens *t);
/* The files t was read from (1 for a memory image or the built-in corpus). */
int regc_tokens_n_files(const regc_tokens *t);
/* Whether a loss mask is attached. */
int regc_tokens_masked(const regc_tokens *t);
/* A hash of the tokens and their mask: what a checkpoint records of its data. */
uint64_t regc_tokens_hash(const regc_tokens *t);
/* Read a loss mask for t's tokens: one byte per token, 0 or 1; a pattern
 * for sharded tokens, a mask file per shard. A mask of another length is
 * an error naming the file and both counts. */
int regc_tokens_open_mask(regc_tokens *t, const char *path);
/* The same for a mask file image in memory. */
int regc_tokens_parse_mask(regc_tokens *t, const char *source, const void *bytes, size_t size);
int regc_tokens_write_mask(const char *path, const uint8_t *mask, int64_t n);
/* Read t's rows shuffled (on) or in llm.c's order (off, the default). */
void regc_tokens_set_shuffle(regc_tokens *t, int on, uint64_t seed);
/* Batch k: inputs [B, T] = tokens[p .. p+B*T-1], targets = the next tokens,
 * p advancing by B*T each batch and wrapping to 0 when fewer than B*T+1
 * tokens remain (a cycle of (count - 1) / (B*T) batches: an epoch). Needs
 * count >= B*T + 1. With a mask, a target whose token the mask marks 0 is
 * -1: ignored by the loss. Shuffled, the file is n = (count - 1) / T rows
 * (row j: tokens j*T .. j*T+T-1, targets the next ones), and epoch e of
 * as many batches reads the rows of a permutation of [0, n) drawn from
 * (seed, e), B at a time: every row at most once an epoch, the n mod B
 * rows left over a different few each epoch. */
int regc_tokens_batch(const regc_tokens *t, int64_t k, int64_t batch, int64_t seq, int32_t *inputs,
                      int32_t *targets);
/* Rows row0 .. row0+rows-1 of batch k of shape [batch, seq] (the rows a
 * data-parallel rank takes of the global batch), as regc_tokens_batch
 * would fill them. */
int regc_tokens_rows(const regc_tokens *t, int64_t k, int64_t batch, int64_t row0, int64_t rows,
                     int64_t seq, int32_t *inputs, int32_t *targets);
void regc_tokens_free(regc_tokens *t);

#endif
