/* bytes.c — varint encoding into a growable buffer and back; the XXH3
 * hash of bytes, whole or in pieces. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "regc_common.h"

void regc_bytes_free(regc_bytes *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static int reserve(regc_bytes *b, size_t n)
{
    if (b->failed)
        return 0;
    if (b->len + n <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return 0;
    }
    b->data = d, b->cap = cap;
    return 1;
}

void regc_bytes_put(regc_bytes *b, const void *p, size_t n)
{
    if (n && reserve(b, n)) {
        memcpy(b->data + b->len, p, n);
        b->len += n;
    }
}

void regc_bytes_put_u64(regc_bytes *b, uint64_t v)
{
    if (!reserve(b, 10))
        return;
    while (v >= 0x80) {
        b->data[b->len++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b->data[b->len++] = (uint8_t)v;
}

/* zigzag: small magnitudes of either sign take few bytes */
void regc_bytes_put_i64(regc_bytes *b, int64_t v)
{
    regc_bytes_put_u64(b, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

uint16_t regc_f32_to_bf16(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40u); /* keep NaN a NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);       /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

void regc_bytes_put_f32(regc_bytes *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t x[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    regc_bytes_put(b, x, 4);
}

void regc_bytes_put_str(regc_bytes *b, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    regc_bytes_put_u64(b, n);
    regc_bytes_put(b, s, n);
}

regc_reader regc_reader_of(const void *data, size_t len)
{
    const uint8_t *p = data;
    return (regc_reader){.p = p, .end = p + len};
}

void regc_reader_get(regc_reader *r, void *dst, size_t n)
{
    if (r->failed || (size_t)(r->end - r->p) < n) {
        r->failed = 1;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p, n);
    r->p += n;
}

float regc_reader_f32(regc_reader *r)
{
    uint8_t x[4];
    regc_reader_get(r, x, 4);
    uint32_t u = (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

char *regc_reader_str(regc_reader *r)
{
    uint64_t n = regc_reader_u64(r);
    if (r->failed || n > (uint64_t)(r->end - r->p)) {
        r->failed = 1;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        r->failed = 1;
        return NULL;
    }
    memcpy(s, r->p, (size_t)n);
    s[n] = 0;
    r->p += n;
    return s;
}

uint64_t regc_hash64(const void *data, size_t n) { return (uint64_t)XXH3_64bits(data, n); }

struct regc_hasher {
    XXH3_state_t *state;
};

regc_hasher *regc_hasher_begin(void)
{
    regc_hasher *h = malloc(sizeof *h);
    if (!h)
        return NULL;
    h->state = XXH3_createState();
    if (!h->state || XXH3_64bits_reset(h->state) != XXH_OK) {
        XXH3_freeState(h->state);
        free(h);
        return NULL;
    }
    return h;
}

void regc_hasher_update(regc_hasher *h, const void *data, size_t n)
{
    XXH3_64bits_update(h->state, data, n);
}

uint64_t regc_hasher_end(regc_hasher *h)
{
    uint64_t v = (uint64_t)XXH3_64bits_digest(h->state);
    XXH3_freeState(h->state);
    free(h);
    return v;
}
