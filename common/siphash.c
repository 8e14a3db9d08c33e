/* siphash.c — SipHash-2-4 with a 128-bit output (Aumasson and Bernstein),
 * the keyed hash that seals compile-cache entries.
 *
 * A checksum catches damage; it does not tell an entry this cache wrote
 * from one another program wrote with valid checksums. A keyed pseudo-
 * random function does: without the key, a tag for new bytes cannot be
 * made. SipHash is the standard small one (no dependency, a page of code,
 * a few GB/s: sealing a step entry costs microseconds next to its zlib).
 * Little-endian words, as the reference; the 64-bit output is kept for its
 * published test vectors. */
#include <string.h>

#include "regc_common.h"

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

typedef struct {
    uint64_t v0, v1, v2, v3;
} sip_state;

static void sip_round(sip_state *s)
{
    s->v0 += s->v1, s->v1 = ROTL(s->v1, 13), s->v1 ^= s->v0, s->v0 = ROTL(s->v0, 32);
    s->v2 += s->v3, s->v3 = ROTL(s->v3, 16), s->v3 ^= s->v2;
    s->v0 += s->v3, s->v3 = ROTL(s->v3, 21), s->v3 ^= s->v0;
    s->v2 += s->v1, s->v1 = ROTL(s->v1, 17), s->v1 ^= s->v2, s->v2 = ROTL(s->v2, 32);
}

static void sip_compress(sip_state *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s), sip_round(s);
    s->v0 ^= m;
}

/* out: 8 or 16 bytes. */
static void siphash(const uint8_t key[16], const void *data, size_t n, uint8_t *out, int out_len)
{
    const uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    sip_state s = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
                   k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
    if (out_len == 16)
        s.v1 ^= 0xee;
    const uint8_t *p = data;
    size_t whole = n - n % 8;
    for (size_t i = 0; i < whole; i += 8)
        sip_compress(&s, load_le64(p + i));
    uint8_t last[8] = {0};
    memcpy(last, p + whole, n % 8);
    last[7] = (uint8_t)n; /* the length modulo 256 in the last byte */
    sip_compress(&s, load_le64(last));
    s.v2 ^= out_len == 16 ? 0xee : 0xff;
    for (int r = 0; r < 4; r++)
        sip_round(&s);
    store_le64(out, s.v0 ^ s.v1 ^ s.v2 ^ s.v3);
    if (out_len == 16) {
        s.v1 ^= 0xdd;
        for (int r = 0; r < 4; r++)
            sip_round(&s);
        store_le64(out + 8, s.v0 ^ s.v1 ^ s.v2 ^ s.v3);
    }
}

uint64_t regc_siphash64(const uint8_t key[16], const void *data, size_t n)
{
    uint8_t out[8];
    siphash(key, data, n, out, 8);
    return load_le64(out);
}

void regc_siphash128(const uint8_t key[16], const void *data, size_t n, uint8_t out[16])
{
    siphash(key, data, n, out, 16);
}
