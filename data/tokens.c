/* tokens.c — token data in the llm.c format: a 256 x int32 little-endian
 * header (magic 20240520, version 1, token count) followed by `count`
 * uint16 tokens, so that data prepared for llm.c works unchanged; and loss
 * masks beside them: the same header with magic 20240601, then one byte
 * per token, 1 when predicting that token counts toward the loss.
 *
 * Shuffled rows: epoch e reads the file's rows in the order of a bijection
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

#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1
#define TOKENS_HEADER_INTS 256
#define TOKENS_HEADER_BYTES (TOKENS_HEADER_INTS * 4)
#define MASK_MAGIC 20240601

struct regc_tokens {
    uint16_t *tokens; /* [count] */
    uint8_t *mask;    /* [count] or NULL: every target counts */
    int64_t count;
    char *source; /* the file, or "built-in corpus": batch errors name it */
    int shuffle;  /* rows in a permutation drawn per epoch from shuffle_seed */
    uint64_t shuffle_seed;
};

static char *copy_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c)
        memcpy(c, s, n);
    return c;
}

/* The format is little-endian whatever the host is, so decode bytewise. */
static int32_t read_le32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)v;
}

static void write_le32(unsigned char *p, int32_t value)
{
    uint32_t v = (uint32_t)value;
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* The whole file in one buffer: token files are at most a few hundred MB
 * and every byte is checked anyway, so streaming would buy nothing. */
static int read_file(const char *path, unsigned char **out, size_t *size)
{
    return regc_file_read_capped(path, REGC_TOKEN_FILE_MAX, (char **)out, size);
}

/* A file image in the token format with magic `magic`: its count of
 * `elem`-byte elements, which start at buf + TOKENS_HEADER_BYTES. */
static int parse_body(const char *path, const unsigned char *buf, size_t size, int32_t magic,
                      size_t elem, int32_t *count)
{
    const char *what = magic == MASK_MAGIC ? "a regc loss mask" : "an llm.c token file";
    const char *unit = magic == MASK_MAGIC ? "mask bytes" : "tokens";
    *count = 0;
    if (size < TOKENS_HEADER_BYTES)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: truncated header: file holds %zu bytes, the header needs %d", path,
                          size, TOKENS_HEADER_BYTES);
    int32_t m = read_le32(buf), version = read_le32(buf + 4), n = read_le32(buf + 8);
    if (m != magic)
        return regc_error(REGC_ERR_FORMAT, "%s: bad magic %d (expected %d): not %s", path, m, magic,
                          what);
    if (version != TOKENS_VERSION)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: unsupported version %d (regc reads version %d)", path, version,
                          TOKENS_VERSION);
    if (n < 0)
        return regc_error(REGC_ERR_FORMAT, "%s: negative count %d in the header", path, n);
    size_t body = size - TOKENS_HEADER_BYTES, need = (size_t)n * elem;
    if (body < need)
        return regc_error(REGC_ERR_FORMAT, "%s: truncated: header says %d %s, file holds %zu", path,
                          n, unit, body / elem);
    /* Extra bytes mean the header and the data disagree; guessing which is
     * right would silently train on the wrong data. */
    if (body > need)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: header says %d %s (%zu bytes) but %zu bytes follow the header", path,
                          n, unit, need, body);
    *count = n;
    return REGC_OK;
}

int regc_tokens_parse(const char *source, const void *bytes, size_t size, int64_t vocab,
                      regc_tokens **out)
{
    *out = NULL;
    const unsigned char *buf = bytes;
    int32_t count;
    int rc = parse_body(source, buf, size, TOKENS_MAGIC, 2, &count);
    if (rc)
        return rc;
    size_t need = (size_t)count * 2;
    uint16_t *tokens = malloc(need ? need : 1);
    regc_tokens *t = calloc(1, sizeof *t);
    char *copy = copy_string(source);
    if (!tokens || !t || !copy) {
        free(tokens);
        free(t);
        free(copy);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for %d tokens", source, count);
    }
    const unsigned char *p = buf + TOKENS_HEADER_BYTES;
    for (int64_t i = 0; i < count; i++) {
        uint16_t tok = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        /* vocab <= 0 means "no model yet": inspect the file without a bound. */
        if (vocab > 0 && tok >= vocab) {
            free(tokens);
            free(t);
            free(copy);
            return regc_error(REGC_ERR_FORMAT,
                              "%s: token %u at position %lld is >= vocab size %lld", source,
                              (unsigned)tok, (long long)i, (long long)vocab);
        }
        tokens[i] = tok;
    }
    t->tokens = tokens;
    t->count = count;
    t->source = copy;
    *out = t;
    return REGC_OK;
}

int regc_tokens_open(const char *path, int64_t vocab, regc_tokens **out)
{
    *out = NULL;
    unsigned char *buf;
    size_t size;
    int rc = read_file(path, &buf, &size);
    if (rc)
        return rc;
    rc = regc_tokens_parse(path, buf, size, vocab, out);
    free(buf);
    return rc;
}

int regc_tokens_builtin(regc_tokens **out)
{
    *out = NULL;
    size_t n = 0;
    for (const char *const *part = regc_corpus_parts; *part; part++)
        n += strlen(*part);
    regc_tokens *t = calloc(1, sizeof *t);
    uint16_t *tokens = malloc(n * sizeof *tokens);
    char *source = copy_string("built-in corpus");
    if (!t || !tokens || !source) {
        free(t);
        free(tokens);
        free(source);
        return regc_error(REGC_ERR_MEMORY, "built-in corpus: out of memory for %zu tokens", n);
    }
    size_t i = 0;
    for (const char *const *part = regc_corpus_parts; *part; part++)
        for (const unsigned char *c = (const unsigned char *)*part; *c; c++)
            tokens[i++] = *c; /* byte-level: every token id is < 256 */
    t->tokens = tokens;
    t->count = (int64_t)n;
    t->source = source;
    *out = t;
    return REGC_OK;
}

int regc_tokens_write(const char *path, const uint16_t *tokens, int64_t n)
{
    if (n < 0 || n > INT32_MAX)
        return regc_error(REGC_ERR_ARG,
                          "%s: cannot write %lld tokens (the header holds an int32 count)", path,
                          (long long)n);
    size_t size = TOKENS_HEADER_BYTES + (size_t)n * 2;
    unsigned char *buf = calloc(1, size);
    if (!buf)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for %zu bytes", path, size);
    write_le32(buf, TOKENS_MAGIC);
    write_le32(buf + 4, TOKENS_VERSION);
    write_le32(buf + 8, (int32_t)n);
    unsigned char *p = buf + TOKENS_HEADER_BYTES;
    for (int64_t i = 0; i < n; i++) {
        p[2 * i] = (unsigned char)(tokens[i] & 0xff);
        p[2 * i + 1] = (unsigned char)(tokens[i] >> 8);
    }
    int rc = regc_file_write_atomic(path, buf, size);
    free(buf);
    return rc;
}

int regc_tokens_parse_mask(regc_tokens *t, const char *source, const void *bytes, size_t size)
{
    int32_t count;
    int rc = parse_body(source, bytes, size, MASK_MAGIC, 1, &count);
    if (rc)
        return rc;
    if (count != t->count)
        return regc_error(REGC_ERR_SHAPE, "%s: %d mask bytes for the %lld tokens of %s", source,
                          count, (long long)t->count, t->source);
    const unsigned char *p = (const unsigned char *)bytes + TOKENS_HEADER_BYTES;
    for (int32_t i = 0; i < count; i++)
        if (p[i] > 1)
            return regc_error(REGC_ERR_FORMAT, "%s: byte %d is %u (a mask holds 0 or 1)", source, i,
                              (unsigned)p[i]);
    uint8_t *mask = malloc((size_t)count + 1);
    if (!mask)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", source);
    memcpy(mask, p, (size_t)count);
    free(t->mask);
    t->mask = mask;
    return REGC_OK;
}

int regc_tokens_open_mask(regc_tokens *t, const char *path)
{
    unsigned char *buf;
    size_t size;
    int rc = read_file(path, &buf, &size);
    if (rc)
        return rc;
    rc = regc_tokens_parse_mask(t, path, buf, size);
    free(buf);
    return rc;
}

int regc_tokens_write_mask(const char *path, const uint8_t *mask, int64_t n)
{
    if (n < 0 || n > INT32_MAX)
        return regc_error(REGC_ERR_ARG, "%s: cannot write %lld mask bytes", path, (long long)n);
    size_t size = TOKENS_HEADER_BYTES + (size_t)n;
    unsigned char *buf = calloc(1, size);
    if (!buf)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for %zu bytes", path, size);
    write_le32(buf, MASK_MAGIC);
    write_le32(buf + 4, TOKENS_VERSION);
    write_le32(buf + 8, (int32_t)n);
    memcpy(buf + TOKENS_HEADER_BYTES, mask, (size_t)n);
    int rc = regc_file_write_atomic(path, buf, size);
    free(buf);
    return rc;
}

int64_t regc_tokens_count(const regc_tokens *t) { return t->count; }

uint64_t regc_tokens_hash(const regc_tokens *t)
{
    uint64_t h = regc_hash64(t->tokens, (size_t)t->count * sizeof *t->tokens);
    if (t->mask)
        h = regc_rng_mix(h ^ regc_hash64(t->mask, (size_t)t->count));
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
    int64_t bt = batch * seq;
    if (t->count < bt + 1)
        return regc_error(REGC_ERR_SHAPE,
                          "%s: %lld tokens are too few for a batch of %lld x %lld, which needs at "
                          "least %lld (batch x sequence + 1 for the shifted targets)",
                          t->source, (long long)t->count, (long long)batch, (long long)seq,
                          (long long)(bt + 1));
    /* llm.c's loader visits p = 0, bt, 2 bt, ... while p + bt + 1 <= count,
     * then starts again at 0: a cycle of floor((count - 1) / bt) batches, so
     * batch k starts at (k mod cycle) * bt with no need to replay the past. */
    int64_t cycle = (t->count - 1) / bt;
    for (int64_t r = 0; r < rows; r++) {
        int64_t p;      /* the row's first token */
        if (t->shuffle) /* place (k mod cycle) * batch + row0 + r of the epoch's permutation */
            p = seq * shuffled_row(t->shuffle_seed, k / cycle, (k % cycle) * batch + row0 + r,
                                   (t->count - 1) / seq);
        else /* llm.c's: the batch's rows one after another */
            p = (k % cycle) * bt + (row0 + r) * seq;
        const uint16_t *src = t->tokens + p;
        const uint8_t *counts = t->mask ? t->mask + p + 1 : NULL;  /* of each target */
        int32_t *in = inputs + r * seq, *next = targets + r * seq; /* [seq] */
        for (int64_t i = 0; i < seq; i++) {
            in[i] = src[i];
            next[i] = counts && !counts[i] ? -1 : src[i + 1];
        }
    }
    return REGC_OK;
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
    free(t->tokens);
    free(t->mask);
    free(t->source);
    free(t);
}
