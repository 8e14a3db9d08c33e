/* regc_bytes.h — a growable byte buffer and a bounds-checked reader: the
 * encoding of cache keys' canonical forms and of cached payloads.
 *
 * Integers are LEB128 varints (signed ones zigzag-coded first), floats
 * their 4 IEEE bytes, strings a length and their bytes. Both sides keep a
 * sticky failure flag, so an encoder or decoder checks once at the end
 * instead of after every field. */
#ifndef REGC_BYTES_H
#define REGC_BYTES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *data;
    size_t len, cap;
    int failed; /* an allocation failed: the contents are incomplete */
} regc_bytes;

/* A zeroed regc_bytes is empty and ready; free releases it. */
void regc_bytes_free(regc_bytes *b);
void regc_bytes_put(regc_bytes *b, const void *p, size_t n);
void regc_bytes_put_u64(regc_bytes *b, uint64_t v);
void regc_bytes_put_i64(regc_bytes *b, int64_t v);
void regc_bytes_put_f32(regc_bytes *b, float v);
/* NULL is written as the empty string. */
void regc_bytes_put_str(regc_bytes *b, const char *s);

typedef struct {
    const uint8_t *p, *end;
    int failed; /* ran past the end, or a value was out of its range */
} regc_reader;

regc_reader regc_reader_of(const void *data, size_t len);
float regc_reader_f32(regc_reader *r);
/* A malloc'd, NUL-terminated copy; NULL when failed. */
char *regc_reader_str(regc_reader *r);
/* n raw bytes into dst. */
void regc_reader_get(regc_reader *r, void *dst, size_t n);

/* The integer readers are inline: a cached step program is mostly
 * varints, and decoding it is on the path of every warm start. */
static inline uint64_t regc_reader_u64(regc_reader *r)
{
    uint64_t v = 0;
    for (int shift = 0; !r->failed; shift += 7) {
        if (r->p == r->end || shift > 63) {
            r->failed = 1;
            break;
        }
        uint8_t c = *r->p++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return v;
    }
    return 0;
}

static inline int64_t regc_reader_i64(regc_reader *r)
{
    uint64_t u = regc_reader_u64(r);
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

/* A signed integer that must lie in [lo, hi]; fails (and returns lo) otherwise. */
static inline int64_t regc_reader_int(regc_reader *r, int64_t lo, int64_t hi)
{
    int64_t v = regc_reader_i64(r);
    if (v < lo || v > hi) {
        r->failed = 1;
        return lo;
    }
    return v;
}

#endif
