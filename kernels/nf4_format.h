/* nf4_format.h — NF4, the 4-bit format of QLoRA, exactly as bitsandbytes
 * stores it (quantize_4bit with quant_type "nf4", blocksize 64,
 * compress_statistics True), so a frozen base quantised by regc and one
 * read from a checkpoint Transformers saved hold the same bytes and
 * dequantise to the same floats.
 *
 * A tensor of n values (row-major, flattened) is cut into blocks of 64;
 * block b keeps absmax_b, its largest magnitude, and each value becomes
 * the index of the nearest of the 16 NF4 levels to value / absmax_b. Two
 * indices share a byte, the even element in the high nibble. The absmaxes
 * are quantised again ("double quantisation"): their mean is the offset,
 * and absmax_b - offset is stored as an 8-bit index into bitsandbytes'
 * signed dynamic map, in blocks of 256 with one fp32 absmax each. Reading
 * value e:
 *
 *   absmax = map[q8[e / 64]] * nested[e / 64 / 256] + offset   (fp32, two roundings)
 *   value  = NF4[nibble(e)] * absmax                            (fp32)
 *
 * One tensor's blob, every part from n alone (regc_nf4_layout):
 *
 *   offset  f32                                    at 0
 *   nested  f32[ceil(ceil(n / 64) / 256)]          at 4
 *   q8      u8[ceil(n / 64)]                       after nested
 *   packed  u8[ceil(n / 2)]                        after q8
 *
 * The tables are bitsandbytes' (get_4bit_type("nf4") and
 * create_dynamic_map(signed=True)), as fp32 bits. regc_backend.h includes
 * this header (it is private to kernels/), for the backends and the models'
 * quantiser alike; the macros
 * initialise each side's own copy of a table (host arrays, __constant__
 * memory). */
#ifndef REGC_NF4_H
#define REGC_NF4_H

#include <stdint.h>

#ifndef REGC_HD /* included by regc_backend.h, after it defines REGC_HD */
#error "include regc_backend.h, which includes nf4_format.h"
#endif

#define REGC_NF4_BLOCK 64         /* values per absmax */
#define REGC_NF4_NESTED_BLOCK 256 /* absmaxes per nested absmax */

/* The 16 NF4 levels, ascending; index 7 is 0. */
#define REGC_NF4_LEVELS                                                                            \
    {                                                                                              \
        -0x1.0000000000000p+0f, -0x1.6473620000000p-1f, -0x1.0cd6600000000p-1f,                    \
            -0x1.9465400000000p-2f, -0x1.23449a0000000p-2f, -0x1.7a6a7e0000000p-3f,                \
            -0x1.74f0e20000000p-4f, 0.0f, 0x1.45f5fe0000000p-4f, 0x1.4995c60000000p-3f,            \
            0x1.f809ba0000000p-3f, 0x1.5a06740000000p-2f, 0x1.c349700000000p-2f,                   \
            0x1.200f560000000p-1f, 0x1.7227660000000p-1f, 0x1.0000000000000p+0f,                   \
    }

/* bitsandbytes' signed dynamic 8-bit map (256 values, the nested absmax's codes). */
#define REGC_NF4_DYNAMIC_MAP                                                                       \
    {                                                                                              \
        -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f,                    \
            -0x1.e6cccc0000000p-1f, -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f,                \
            -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f, -0x1.c2cccc0000000p-1f,                \
            -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,                \
            -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f,                \
            -0x1.9066660000000p-1f, -0x1.8933340000000p-1f, -0x1.8200000000000p-1f,                \
            -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f, -0x1.6c66680000000p-1f,                \
            -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,                \
            -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f,                \
            -0x1.3a00000000000p-1f, -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f,                \
            -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f, -0x1.1600000000000p-1f,                \
            -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,                \
            -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f,                \
            -0x1.c733340000000p-2f, -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f,                \
            -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f, -0x1.7f33340000000p-2f,                \
            -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,                \
            -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f,                \
            -0x1.1a66680000000p-2f, -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f,                \
            -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f, -0x1.a4cccc0000000p-3f,                \
            -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,                \
            -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f,                \
            -0x1.b666680000000p-4f, -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f,                \
            -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f, -0x1.65c2900000000p-4f,                \
            -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,                \
            -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f,                \
            -0x1.151eba0000000p-4f, -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f,                \
            -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f, -0x1.b70a3e0000000p-5f,                \
            -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,                \
            -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f,                \
            -0x1.15c2900000000p-5f, -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f,                \
            -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f, -0x1.451eba0000000p-6f,                \
            -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,                \
            -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f,                \
            -0x1.072b020000000p-7f, -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f,                \
            -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f, -0x1.56041a0000000p-8f,                \
            -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,                \
            -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f,               \
            -0x1.4fdf3a0000000p-10f, -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f,             \
            -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f, -0x1.02de020000000p-11f,             \
            -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,             \
            -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f,             \
            -0x1.64840c0000000p-16f, -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f,             \
            -0x1.27476e0000000p-21f, 0.0f, 0x1.27476e0000000p-21f, 0x1.b435280000000p-19f,         \
            0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f, 0x1.6f00680000000p-15f,                \
            0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,                \
            0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f,                \
            0x1.3dd9820000000p-11f, 0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f,                \
            0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f, 0x1.e353f80000000p-10f,                \
            0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,                   \
            0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f,                   \
            0x1.7ae1480000000p-8f, 0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f,                   \
            0x1.e978d40000000p-8f, 0x1.072b020000000p-7f, 0x1.19999a0000000p-7f,                   \
            0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,                   \
            0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f,                   \
            0x1.7333340000000p-6f, 0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f,                   \
            0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f, 0x1.2cccce0000000p-5f,                   \
            0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,                   \
            0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f,                   \
            0x1.ce147a0000000p-5f, 0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f,                   \
            0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f, 0x1.20a3d60000000p-4f,                   \
            0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,                   \
            0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f,                   \
            0x1.7147ae0000000p-4f, 0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f,                   \
            0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f, 0x1.f000000000000p-4f,                   \
            0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,                   \
            0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f,                   \
            0x1.c1999a0000000p-3f, 0x1.de66660000000p-3f, 0x1.fb33320000000p-3f,                   \
            0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f, 0x1.28cccc0000000p-2f,                   \
            0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,                   \
            0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f,                   \
            0x1.8d99980000000p-2f, 0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f,                   \
            0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f, 0x1.d599980000000p-2f,                   \
            0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,                   \
            0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f,                   \
            0x1.1d33340000000p-1f, 0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f,                   \
            0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f, 0x1.4133340000000p-1f,                   \
            0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,                   \
            0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f,                   \
            0x1.73999a0000000p-1f, 0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f,                   \
            0x1.8933340000000p-1f, 0x1.9066660000000p-1f, 0x1.97999a0000000p-1f,                   \
            0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,                   \
            0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f,                   \
            0x1.ca00000000000p-1f, 0x1.d133340000000p-1f, 0x1.d866660000000p-1f,                   \
            0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f, 0x1.ee00000000000p-1f,                   \
            0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f,                   \
    }

typedef struct {
    int64_t n;                           /* values */
    int64_t blocks, nested_blocks;       /* ceil(n / 64), ceil(blocks / 256) */
    int64_t nested_at, q8_at, packed_at; /* byte offsets in the blob */
    int64_t bytes;                       /* the whole blob */
} regc_nf4_layout_t;

static inline REGC_HD regc_nf4_layout_t regc_nf4_layout(int64_t n)
{
    regc_nf4_layout_t l;
    l.n = n;
    l.blocks = (n + REGC_NF4_BLOCK - 1) / REGC_NF4_BLOCK;
    l.nested_blocks = (l.blocks + REGC_NF4_NESTED_BLOCK - 1) / REGC_NF4_NESTED_BLOCK;
    l.nested_at = 4;
    l.q8_at = l.nested_at + 4 * l.nested_blocks;
    l.packed_at = l.q8_at + l.blocks;
    l.bytes = l.packed_at + (n + 1) / 2;
    return l;
}

/* Block b's absmax, as bitsandbytes dequantises it: the code times the
 * nested absmax, rounded, then the offset added, rounded. */
static inline REGC_HD float regc_nf4_absmax(const uint8_t *blob, const regc_nf4_layout_t *l,
                                            const float *dynamic_map, int64_t b)
{
    const float *offset = (const float *)blob;                  /* [1] */
    const float *nested = (const float *)(blob + l->nested_at); /* [nested_blocks] */
    const float scaled = dynamic_map[blob[l->q8_at + b]] * nested[b / REGC_NF4_NESTED_BLOCK];
    return scaled + offset[0];
}

/* Value e's 4-bit index: the even element in the high nibble. */
static inline REGC_HD int regc_nf4_index(const uint8_t *blob, const regc_nf4_layout_t *l, int64_t e)
{
    const uint8_t byte = blob[l->packed_at + e / 2];
    return (e & 1) ? (byte & 15) : (byte >> 4);
}

/* Values e0 .. e0+len-1 of the blob, dequantised into d[0], d[stride],
 * ...: a block's run of values at a time, its absmax computed once, two
 * values a byte where the run allows. */
static inline REGC_HD void regc_nf4_read(const uint8_t *blob, const regc_nf4_layout_t *l,
                                         const float *levels, const float *dynamic_map, int64_t e0,
                                         int64_t len, float *d, int64_t stride)
{
    const uint8_t *packed = blob + l->packed_at;
    for (int64_t q = 0; q < len;) {
        const int64_t block = (e0 + q) / REGC_NF4_BLOCK;
        const int64_t end = (block + 1) * REGC_NF4_BLOCK - e0 < len
                                ? (block + 1) * REGC_NF4_BLOCK - e0
                                : len; /* the run ends with its block or the range */
        const float absmax = regc_nf4_absmax(blob, l, dynamic_map, block);
        if ((e0 + q) & 1) { /* a low nibble first */
            d[q * stride] = levels[packed[(e0 + q) / 2] & 15] * absmax;
            q++;
        }
        for (; q + 1 < end; q += 2) { /* whole bytes: the high nibble, then the low */
            const uint8_t byte = packed[(e0 + q) / 2];
            d[q * stride] = levels[byte >> 4] * absmax;
            d[(q + 1) * stride] = levels[byte & 15] * absmax;
        }
        if (q < end) { /* a high nibble last */
            d[q * stride] = levels[packed[(e0 + q) / 2] >> 4] * absmax;
            q++;
        }
    }
}

#endif
