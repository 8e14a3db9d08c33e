/* tokens.c — token data in the llm.c format (stream.c reads the files:
 * one, or the shards a pattern names, as one sequence), loss masks beside
 * them file for file, and batches of rows from them.
 *
 * Shuffled rows: epoch e reads the data's rows in the order of a bijection
 * of [0, n) keyed by (seed, e), a four-round Feistel network on the
 * smallest even number of bits that holds n, applied again to its own
 * output until that falls inside [0, n) (the cycle through an index in
 * [0, n) comes back into it). So the order takes no memory, and batch k is
 * read without the batches before it, as a resumed run or a rank needs. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "corpus.h"
#include "regc_data.h"
#include "stream.h"

struct regc_tokens {
    data_stream tokens; /* uint16, little-endian */
    data_stream mask;   /* a byte per token; no parts: every target counts */
    int64_t vocab;      /* > 0: each token read is checked against it again */
    char *source;       /* the file or pattern, or "built-in corpus": batch errors name it */
    int shuffle;        /* rows in a permutation drawn per epoch from shuffle_seed */
    uint64_t shuffle_seed;
};

/* Token i of a body of elem-byte little-endian tokens. */
static uint32_t token_at(const unsigned char *body, size_t elem, int64_t i)
{
    const unsigned char *b = body + (size_t)i * elem;
    return elem == 2
               ? (uint32_t)b[0] | (uint32_t)b[1] << 8
               : (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static int check_tokens(const char *path, int64_t index, const unsigned char *body, int64_t n,
                        size_t elem, void *ctx)
{
    const int64_t vocab = *(const int64_t *)ctx;
    if (vocab <= 0) /* no model yet: the file inspected without a bound */
        return REGC_OK;
    /* the largest first, in a loop without exits the compiler vectorises;
     * the place of a token past the vocabulary only when there is one */
    uint32_t largest = 0;
    if (elem == 2)
        for (int64_t i = 0; i < n; i++) {
            const uint32_t tok = (uint32_t)body[2 * i] | (uint32_t)body[2 * i + 1] << 8;
            largest = tok > largest ? tok : largest;
        }
    else
        for (int64_t i = 0; i < n; i++) {
            const uint32_t tok = token_at(body, 4, i);
            largest = tok > largest ? tok : largest;
        }
    for (int64_t i = 0; largest >= vocab && i < n; i++) {
        const uint32_t tok = token_at(body, elem, i);
        if (tok >= vocab)
            return regc_error(REGC_ERR_FORMAT,
                              "%s: token %u at position %lld is >= vocab size %lld", path,
                              (unsigned)tok, (long long)(index + i), (long long)vocab);
    }
    return REGC_OK;
}

static int check_mask(const char *path, int64_t index, const unsigned char *body, int64_t n,
                      size_t elem, void *ctx)
{
    (void)ctx, (void)elem;
    for (int64_t i = 0; i < n; i++)
        if (body[i] > 1)
            return regc_error(REGC_ERR_FORMAT, "%s: byte %lld is %u (a mask holds 0 or 1)", path,
                              (long long)(index + i), (unsigned)body[i]);
    return REGC_OK;
}

/* A token object around an opened (or failed) stream. */
static int tokens_wrap(int rc, data_stream *s, const char *source, int64_t vocab, regc_tokens **out)
{
    *out = NULL;
    if (rc)
        return rc;
    regc_tokens *t = calloc(1, sizeof *t);
    char *copy = strdup(source);
    if (!t || !copy) {
        free(t);
        free(copy);
        data_stream_free(s);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", source);
    }
    t->tokens = *s;
    t->vocab = vocab;
    t->source = copy;
    *out = t;
    return REGC_OK;
}

int regc_tokens_parse(const char *source, const void *bytes, size_t size, int64_t vocab,
                      regc_tokens **out)
{
    data_stream s;
    int rc = data_stream_parse(source, bytes, size, DATA_TOKENS_MAGIC, check_tokens, &vocab, &s);
    return tokens_wrap(rc, &s, source, vocab, out);
}

int regc_tokens_open(const char *path, int64_t vocab, regc_tokens **out)
{
    data_stream s;
    int rc = data_stream_open(path, DATA_TOKENS_MAGIC, check_tokens, &vocab, &s);
    return tokens_wrap(rc, &s, path, vocab, out);
}

int regc_tokens_count_files(const char *path, int64_t *count)
{
    return data_stream_count(path, DATA_TOKENS_MAGIC, count);
}

int regc_tokens_builtin(regc_tokens **out)
{
    *out = NULL;
    size_t n = 0;
    for (const char *const *part = regc_corpus_parts; *part; part++)
        n += strlen(*part);
    /* the corpus as a token file's image: byte-level, every token < 256 */
    unsigned char *image = malloc(DATA_HEADER_BYTES + 2 * n);
    if (!image)
        return regc_error(REGC_ERR_MEMORY, "built-in corpus: out of memory for %zu tokens", n);
    data_header_put(image, DATA_TOKENS_MAGIC, (int32_t)n);
    unsigned char *body = image + DATA_HEADER_BYTES;
    for (const char *const *part = regc_corpus_parts; *part; part++)
        for (const unsigned char *c = (const unsigned char *)*part; *c; c++, body += 2)
            body[0] = *c, body[1] = 0;
    int rc = regc_tokens_parse("built-in corpus", image, DATA_HEADER_BYTES + 2 * n, 256, out);
    free(image);
    return rc;
}

/* A file of n elements of elem bytes after a header with magic. */
static int write_file(const char *path, int32_t magic, const unsigned char *body, int64_t n,
                      size_t elem)
{
    if (n < 0 || n > INT32_MAX)
        return regc_error(REGC_ERR_ARG,
                          "%s: cannot write %lld elements (the header holds an int32 count)", path,
                          (long long)n);
    size_t size = DATA_HEADER_BYTES + (size_t)n * elem;
    unsigned char *buf = malloc(size);
    if (!buf)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for %zu bytes", path, size);
    data_header_put(buf, magic, (int32_t)n);
    memcpy(buf + DATA_HEADER_BYTES, body, (size_t)n * elem);
    int rc = regc_file_write_atomic(path, buf, size);
    free(buf);
    return rc;
}

/* A token file of n tokens, from narrow (uint16, llm.c's GPT-2 format) or
 * wide (uint32, its Llama 3 format), little-endian whatever the host is. */
static int write_tokens(const char *path, const uint16_t *narrow, const uint32_t *wide, int64_t n)
{
    const size_t elem = wide ? 4 : 2;
    unsigned char *body = malloc(n > 0 ? elem * (size_t)n : 1);
    if (!body)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    for (int64_t i = 0; i < n; i++) {
        const uint32_t v = wide ? wide[i] : narrow[i];
        for (size_t b = 0; b < elem; b++)
            body[elem * (size_t)i + b] = (unsigned char)(v >> (8 * b));
    }
    int rc = write_file(path, wide ? DATA_TOKENS32_MAGIC : DATA_TOKENS_MAGIC, body, n, elem);
    free(body);
    return rc;
}

int regc_tokens_write(const char *path, const uint16_t *tokens, int64_t n)
{
    return write_tokens(path, tokens, NULL, n);
}

int regc_tokens_write32(const char *path, const uint32_t *tokens, int64_t n)
{
    return write_tokens(path, NULL, tokens, n);
}

int regc_tokens_write_mask(const char *path, const uint8_t *mask, int64_t n)
{
    return write_file(path, DATA_MASK_MAGIC, mask, n, 1);
}

/* A mask stream beside t's tokens: file for file, byte for token. */
static int mask_attach(regc_tokens *t, const char *source, int rc, data_stream *m)
{
    if (rc)
        return rc;
    if (m->n != t->tokens.n)
        rc = regc_error(REGC_ERR_SHAPE, "%s: %d mask files for the %d token files of %s", source,
                        m->n, t->tokens.n, t->source);
    for (int i = 0; rc == REGC_OK && i < m->n; i++)
        if (m->parts[i].count != t->tokens.parts[i].count)
            rc = regc_error(REGC_ERR_SHAPE, "%s: %lld mask bytes for the %lld tokens of %s",
                            m->parts[i].path, (long long)m->parts[i].count,
                            (long long)t->tokens.parts[i].count, t->tokens.parts[i].path);
    if (rc) {
        data_stream_free(m);
        return rc;
    }
    data_stream_free(&t->mask);
    t->mask = *m;
    return REGC_OK;
}

int regc_tokens_parse_mask(regc_tokens *t, const char *source, const void *bytes, size_t size)
{
    data_stream m;
    int rc = data_stream_parse(source, bytes, size, DATA_MASK_MAGIC, check_mask, NULL, &m);
    return mask_attach(t, source, rc, &m);
}

int regc_tokens_open_mask(regc_tokens *t, const char *path)
{
    data_stream m;
    int rc = data_stream_open(path, DATA_MASK_MAGIC, check_mask, NULL, &m);
    return mask_attach(t, path, rc, &m);
}

int64_t regc_tokens_count(const regc_tokens *t) { return t->tokens.count; }

int regc_tokens_n_files(const regc_tokens *t) { return t->tokens.n; }

int regc_tokens_masked(const regc_tokens *t) { return t->mask.n > 0; }

uint64_t regc_tokens_hash(const regc_tokens *t)
{
    uint64_t h = t->tokens.hash;
    if (t->mask.n)
        h = regc_rng_mix(h ^ t->mask.hash);
    return h;
}

void regc_tokens_set_shuffle(regc_tokens *t, int on, uint64_t seed)
{
    t->shuffle = on != 0;
    t->shuffle_seed = seed;
}

/* The order's streams apart from the others the same seed keys (BERT's
 * masks by step, the initialisations by parameter): "shuffle" in ASCII. */
#define SHUFFLE_STREAM 0x73687566666c65ull

/* Place i of epoch e's order of n rows (the header above). */
static int64_t shuffled_row(uint64_t seed, int64_t e, int64_t i, int64_t n)
{
    int bits = 2;
    while (bits < 62 && ((int64_t)1 << bits) < n)
        bits += 2;
    const int half = bits / 2;
    const uint64_t mask = ((uint64_t)1 << half) - 1,
                   key = regc_rng_substream(regc_rng_mix(seed ^ SHUFFLE_STREAM), (uint64_t)e);
    uint64_t x = (uint64_t)i;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            const uint64_t f = regc_rng_at(key, r << 2 | round) & mask;
            const uint64_t next = l ^ f;
            l = r, r = next;
        }
        x = l << half | r;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

/* Inputs [n] = tokens p .. p+n-1 and targets [n] = the tokens after each
 * (-1 where the mask says a target does not count): rows that lie one
 * after another in the data, read at once. raw: (elem + 1) (n + 1) bytes. */
static int rows_from(const regc_tokens *t, int64_t p, int64_t n, unsigned char *raw,
                     int32_t *inputs, int32_t *targets)
{
    const size_t elem = t->tokens.elem;
    unsigned char *counts = raw + elem * (size_t)(n + 1); /* [n]: does target i count */
    int rc = data_stream_read(&t->tokens, p, n + 1, raw);
    if (rc == REGC_OK && t->mask.n)
        rc = data_stream_read(&t->mask, p + 1, n, counts);
    const int64_t bound = t->vocab > 0 ? t->vocab : (int64_t)INT32_MAX + 1;
    for (int64_t i = 0; i <= n && rc == REGC_OK; i++) {
        const uint32_t tok = token_at(raw, elem, i);
        /* checked at open; a file rewritten since (and not told by its
         * size, inode and times) must not index past the embedding */
        if (tok >= bound) {
            const data_part *part = data_stream_part_at(&t->tokens, p + i);
            return t->vocab > 0
                       ? regc_error(REGC_ERR_FORMAT,
                                    "%s: token %u at position %lld is >= vocab size %lld: the "
                                    "file changed since it was opened",
                                    part->path, (unsigned)tok, (long long)(p + i - part->first),
                                    (long long)bound)
                       : regc_error(REGC_ERR_FORMAT,
                                    "%s: token %u at position %lld does not fit a model's int32 "
                                    "ids",
                                    part->path, (unsigned)tok, (long long)(p + i - part->first));
        }
        if (i < n)
            inputs[i] = (int32_t)tok;
        if (i > 0)
            targets[i - 1] = t->mask.n && !counts[i - 1] ? -1 : (int32_t)tok;
    }
    return rc;
}

int regc_tokens_rows(const regc_tokens *t, int64_t k, int64_t batch, int64_t row0, int64_t rows,
                     int64_t seq, int32_t *inputs, int32_t *targets)
{
    if (batch <= 0 || seq <= 0 || k < 0 || row0 < 0 || rows < 0 || row0 + rows > batch)
        return regc_error(
            REGC_ERR_ARG,
            "%s: batch %lld: batch size (%lld) and sequence length (%lld) must be > 0, "
            "the batch index >= 0 and rows %lld .. %lld within the batch",
            t->source, (long long)k, (long long)batch, (long long)seq, (long long)row0,
            (long long)(row0 + rows - 1));
    if (batch > (INT64_MAX - 1) / seq)
        return regc_error(REGC_ERR_ARG, "%s: batch size %lld x sequence length %lld overflows",
                          t->source, (long long)batch, (long long)seq);
    const int64_t bt = batch * seq, count = t->tokens.count;
    if (count < bt + 1)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: %lld tokens are too few for a batch of %lld x %lld, which needs at "
                          "least %lld (batch x sequence + 1 for the shifted targets)",
                          t->source, (long long)count, (long long)batch, (long long)seq,
                          (long long)(bt + 1));
    /* llm.c's loader visits p = 0, bt, 2 bt, ... while p + bt + 1 <= count,
     * then starts again at 0: a cycle of floor((count - 1) / bt) batches, so
     * batch k starts at (k mod cycle) * bt with no need to replay the past. */
    const int64_t cycle = (count - 1) / bt;
    /* llm.c's order reads the rows as one run of the data, shuffled rows
     * one run each */
    const int64_t run = t->shuffle ? seq : rows * seq;
    /* the run's tokens as the files' bytes, then its mask */
    unsigned char *raw = malloc((t->tokens.elem + 1) * (size_t)(run + 1));
    if (!raw)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for %lld tokens", t->source,
                          (long long)run);
    int rc = REGC_OK;
    if (!t->shuffle) /* llm.c's: the batch's rows one after another */
        rc = rows_from(t, (k % cycle) * bt + row0 * seq, rows * seq, raw, inputs, targets);
    for (int64_t r = 0; t->shuffle && r < rows && rc == REGC_OK; r++) {
        /* place (k mod cycle) * batch + row0 + r of the epoch's permutation */
        const int64_t row = shuffled_row(t->shuffle_seed, k / cycle, (k % cycle) * batch + row0 + r,
                                         (count - 1) / seq);
        rc = rows_from(t, row * seq, seq, raw, inputs + r * seq, targets + r * seq);
    }
    free(raw);
    return rc;
}

int regc_tokens_batch(const regc_tokens *t, int64_t k, int64_t batch, int64_t seq, int32_t *inputs,
                      int32_t *targets)
{
    return regc_tokens_rows(t, k, batch, 0, batch, seq, inputs, targets);
}

void regc_tokens_free(regc_tokens *t)
{
    if (!t)
        return;
    data_stream_free(&t->tokens);
    data_stream_free(&t->mask);
    free(t->source);
    free(t);
}
