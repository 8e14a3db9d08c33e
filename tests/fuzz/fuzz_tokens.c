/* fuzz_tokens.c — token files and loss masks in llm.c's format
 * (data/tokens.c) on arbitrary bytes: the header, the count against the
 * length, every token against the vocabulary; an accepted file is read as
 * a batch, in llm.c's order and shuffled; the same bytes again under the
 * header of llm.c's Llama 3 files (uint32 tokens). The same bytes are then read as
 * a loss mask for a token file of the count the header claims. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "regc_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define VOCAB 300 /* a byte-level vocabulary and a few more */

/* The bytes as a token file, read in llm.c's order and shuffled: every
 * token the batches hold is in the vocabulary. */
static void read_tokens(const uint8_t *data, size_t size)
{
    regc_tokens *t = NULL;
    int rc = regc_tokens_parse("t.bin", data, size, VOCAB, &t);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
    } else {
        int32_t in[8], tg[8];
        /* in llm.c's order, then shuffled a batch many epochs on: the rows
         * either picks lie in the file, whatever its count */
        for (int shuffled = 0; shuffled < 2; shuffled++) {
            regc_tokens_set_shuffle(t, shuffled, size);
            rc = regc_tokens_batch(t, shuffled ? 1000003 : 3, 2, 4, in, tg);
            if (rc != REGC_OK) {
                fuzz_check_failure(rc);
                break;
            }
            for (int i = 0; i < 8; i++)
                if (in[i] < 0 || in[i] >= VOCAB || tg[i] < 0 || tg[i] >= VOCAB)
                    abort(); /* checked at open: every token is in the vocabulary */
        }
        regc_tokens_free(t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    read_tokens(data, size);
    /* the same bytes under the header of llm.c's Llama 3 files (magic
     * 20240801, version 7: uint32 tokens), so that every input reaches
     * the 4-byte reader too */
    if (size >= 8) {
        uint8_t *wide = malloc(size);
        if (!wide)
            abort();
        memcpy(wide, data, size);
        const int32_t head[2] = {20240801, 7};
        memcpy(wide, head, sizeof head);
        read_tokens(wide, size);
        free(wide);
    }

    /* as a mask: tokens of the count the header says, when it is small */
    regc_tokens *t = NULL;
    int rc;
    int32_t count = 0;
    if (size >= 12)
        memcpy(&count, data + 8, 4);
    if (count < 0 || count > 4096)
        return 0;
    size_t tsize = 1024 + 2 * (size_t)count;
    uint8_t *tokens = calloc(1, tsize);
    if (!tokens)
        abort();
    const int32_t header[3] = {20240520, 1, count};
    memcpy(tokens, header, sizeof header);
    if (regc_tokens_parse("t.bin", tokens, tsize, 0, &t) != REGC_OK)
        abort();
    rc = regc_tokens_parse_mask(t, "t.mask", data, size);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
    } else if (count > 8) {
        int32_t in[8], tg[8];
        if (regc_tokens_batch(t, 0, 1, 8, in, tg) != REGC_OK)
            abort();
        for (int i = 0; i < 8; i++)
            if (tg[i] != 0 && tg[i] != -1)
                abort(); /* zero tokens: a target is 0, or -1 where masked */
    }
    regc_tokens_free(t);
    free(tokens);
    return 0;
}
