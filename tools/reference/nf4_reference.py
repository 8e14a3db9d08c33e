#!/tmp/venv/bin/python
"""NF4 references from bitsandbytes, for tests/test_nf4.c: what
quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
writes on the CPU and what dequantize_4bit reads back, which models/nf4.c
must equal byte for byte and bit for bit.

NOT part of the test suite and not run by it: it needs bitsandbytes 0.50.2
and torch 2.x, so run it by hand in a virtual environment that has them:

    /tmp/venv/bin/python tools/reference/nf4_reference.py

It writes tests/data/nf4_reference.json. No tensor is stored: a case is
(n, seed, kinds), and both sides build its n values from regc's counter
stream (common/rng.c, reference_common.rng_at): value e of block b = e / 64
comes from r = rng_at(seed, e) and the block's kind kinds[b % len(kinds)],
every value an integer times a power of two, so exact in fp32 on both sides:

    0  weights      (int24(r)) * 2^-29                 |v| < 2^-6
    1  wide         (int24(r)) * 2^(x - 23), x = (r >> 8) % 41 - 20
    2  zeros        0
    3  negative     -(r >> 40) * 2^-21                 in (-8, 0]
    4  ties         element 0: +-2^s, s = block % 16 - 8 (sign: r & 1);
                    element p > 0: NF4 midpoint p % 15 times 2^s, as it is,
                    one fp32 step up or one down ((p / 15) % 3)
    5  huge         (int24(r)) * 2^77                  up to 2^100
    6  subnormal    (int24(r)) * 2^-149, or in odd 8-block groups a 10-bit
                    integer * 2^-149 (below torch's 1e-38 clamp)
    7  sparse       (int24(r)) * 2^-23 when r % 8 == 0, else 0

where int24(r) = (r >> 40) - 2^23 and NF4 midpoint j is (l_j + l_j+1) / 2
in fp32. A "ties" block scales by a power of two, so its values land on
the midpoints exactly and show which way bitsandbytes breaks a tie. One
case, "div_vs_recip", lists its values instead (hex floats): blocks of
values that fall on different sides of a midpoint as x / absmax and as
x * (1 / absmax), which tell bitsandbytes' two ways of scaling apart.

Per case the JSON holds the blob in regc's layout (kernels/nf4_format.h:
offset, nested absmaxes, 8-bit codes, packed nibbles) in hex, or its CRC-32
for the big ones; the offset as a hex float; and dequantize_4bit's output
as the CRC-32 of its fp32 bytes (little-endian) plus a few values in hex.
"offsets" records the offset alone (torch's absmax.mean()) for many block
counts, some on two threads, where torch's summation order changes.

torch's sum is machine-dependent: its lanes follow the CPU kernels it
dispatches to (8 floats for AVX2 and the default build, 16 for AVX-512), and
from 32768 elements its order follows torch.get_num_threads(). The script
forces the AVX2 kernels and sets the thread count of each case.
"""

import os

os.environ["ATEN_CPU_CAPABILITY"] = "avx2"  # before torch loads: 8-lane sums

import argparse
import json
import re
import zlib

import numpy as np
import torch

import bitsandbytes
import bitsandbytes.functional as bnbf
from reference_common import default_out, rng_at

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "..", "..", "kernels", "nf4_format.h")

# (name, n, seed, kinds, threads, store the whole blob)
CASES = [
    ("three_blocks", 64 * 3, 11, [4, 2, 0], 1, True),
    # 15 whole blocks and a last one of 40 values, a ties block: it divides
    ("n1000", 1000, 12, [0, 1, 2, 3, 5, 6, 7, 4], 1, True),
    # odd: the last byte's low nibble is padding; the last block is zeros
    ("n999", 999, 13, [0, 3, 7, 4, 1, 6, 5, 2], 1, True),
    # 517 blocks: three nested blocks, the last of 5
    ("two_nested", 64 * 256 * 2 + 64 * 5, 14, [0, 3, 0, 7, 0, 4, 2, 0], 1, True),
    ("large", 200003, 15, [0, 0, 0, 3, 0, 7, 0, 4, 0, 2], 1, False),
    # 32813 blocks: torch sums the absmaxes in two chunks, one per thread
    ("two_threads", 2100000, 16, [0, 3, 0, 7, 4], 2, False),
    # all zeros: the short last block keeps absmax 1e-38, so the offset is not 0
    ("zeros_tail", 100, 17, [2], 1, True),
    ("short", 37, 18, [0], 1, True),
]

OFFSET_KINDS = [0, 3, 4, 7, 1]
OFFSET_BLOCKS = (list(range(1, 41)) + [63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513,
                                       1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096, 4097,
                                       8191, 8192, 8193, 16383, 16384, 16385, 32767])
OFFSET_BLOCKS_THREADS = [(32767, 2), (32768, 2), (32769, 2), (40000, 2), (65537, 3)]


def header_table(name):
    """A table of nf4_format.h as fp32, parsed from its hex literals."""
    body = open(HEADER).read().split("#define " + name)[1].split("}")[0]
    vals = re.findall(r"-?0x[0-9a-f.]+p[-+]\d+f|0\.0f", body)
    return np.array([float.fromhex(v[:-1]) for v in vals], dtype=np.float32)


LEVELS = header_table("REGC_NF4_LEVELS")
MID16 = ((LEVELS[:-1] + LEVELS[1:]) / np.float32(2)).astype(np.float32)


def make_input(n, seed, kinds):
    """The case's n values, exactly as tests/test_nf4.c builds them."""
    r = rng_at(seed, n)
    e = np.arange(n, dtype=np.int64)
    b = e // 64
    p = e % 64
    kind = np.array(kinds, dtype=np.int64)[b % len(kinds)]
    top = (r >> np.uint64(40)).astype(np.int64)
    int24 = (top - (1 << 23)).astype(np.float64)
    x = np.zeros(n, dtype=np.float64)
    k = kind == 0
    x[k] = np.ldexp(int24[k], -29)
    k = kind == 1
    ex = ((r >> np.uint64(8)) % np.uint64(41)).astype(np.int64) - 20
    x[k] = np.ldexp(int24[k], ex[k] - 23)
    k = kind == 3
    x[k] = -np.ldexp(top[k].astype(np.float64), -21)
    k = kind == 4
    s = (b % 16 - 8).astype(np.int64)
    sign = np.where((r & np.uint64(1)) == np.uint64(1), -1.0, 1.0)
    mid = MID16[p % 15]
    var = (p // 15) % 3
    mid = np.where(var == 1, np.nextafter(mid, np.float32(np.inf)),
                   np.where(var == 2, np.nextafter(mid, np.float32(-np.inf)), mid))
    tie = np.where(p == 0, sign, mid.astype(np.float64))
    x[k] = np.ldexp(tie[k], s[k])
    k = kind == 5
    x[k] = np.ldexp(int24[k], 77)
    k = kind == 6
    small = ((b // 8) % 2) == 1
    int10 = ((r >> np.uint64(54)).astype(np.int64) - (1 << 9)).astype(np.float64)
    x[k] = np.ldexp(np.where(small, int10, int24)[k], -149)
    k = kind == 7
    x[k] = np.where((r[k] % np.uint64(8)) == np.uint64(0), np.ldexp(int24[k], -23), 0.0)
    out = x.astype(np.float32)
    assert np.array_equal(out.astype(np.float64), x), "an input is not exact in fp32"
    return out


def quantize(x, threads):
    """bitsandbytes' quantisation: the blob in regc's layout, its offset, and
    dequantize_4bit's fp32 output."""
    torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    t = torch.from_numpy(x)
    q, st = bnbf.quantize_4bit(t, blocksize=64, compress_statistics=True, quant_type="nf4")
    assert st.absmax.dtype == torch.uint8 and st.state2.absmax.dtype == torch.float32
    assert torch.equal(st.code.view(torch.int32), torch.from_numpy(LEVELS).view(torch.int32))
    assert torch.equal(st.state2.code.view(torch.int32),
                       torch.from_numpy(header_table("REGC_NF4_DYNAMIC_MAP")).view(torch.int32))
    offset = np.float32(st.offset.item())
    blob = (offset.tobytes() + st.state2.absmax.numpy().astype("<f4").tobytes()
            + st.absmax.numpy().tobytes() + q.numpy().reshape(-1).tobytes())
    blocks = (x.size + 63) // 64
    assert len(blob) == 4 + 4 * ((blocks + 255) // 256) + blocks + (x.size + 1) // 2
    out = bnbf.dequantize_4bit(q, st).numpy().reshape(-1).astype("<f4")
    torch.set_num_threads(1)
    return blob, offset, out


def straddlers(count, sign, rng):
    """A block of count values: its largest magnitude a first (a drawn until
    it has some), then every value near an NF4 midpoint that lies on one
    side of it as x / a and on the other as x * (1 / a) (fp32), then zeros:
    it tells which of the two bitsandbytes computes."""
    while True:
        a = np.float32(rng.uniform(0.5, 1.0) * 2.0 ** int(rng.integers(-4, 4)))
        inv = np.float32(1) / a
        found = []
        for j in range(15):
            c = np.float32(MID16[j] * a)
            for x in (c.view(np.int32) + np.arange(-8, 9, dtype=np.int32)).view(np.float32):
                if nibble(x / a) != nibble(x * inv):
                    found.append(x)
        if len(found) >= 3:
            return [sign * a] + found[:count - 1] + [np.float32(0)] * (count - 1 - len(found))


def nibble(s):
    return int((MID16 < np.clip(s, np.float32(-1), np.float32(1))).sum())


def hexf(v):
    return float(np.float32(v)).hex()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "nf4_reference.json"))
    args = ap.parse_args()
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap in ("AVX2", "DEFAULT"), "torch runs %s kernels, not 8-lane ones" % cap
    cases = []
    for name, n, seed, kinds, threads, whole in CASES:
        x = make_input(n, seed, kinds)
        blob, offset, out = quantize(x, threads)
        rec = {"name": name, "n": n, "seed": seed, "kinds": kinds, "threads": threads,
               "offset": hexf(offset), "blob_crc32": zlib.crc32(blob),
               "dequant_crc32": zlib.crc32(out.tobytes())}
        if whole:
            rec["blob"] = blob.hex()
        picks = sorted({0, 1, n // 2, n - 1, int(np.argmax(np.abs(out))),
                        int(np.argmin(out)), int(np.argmax(out))})
        rec["dequant"] = [[i, hexf(out[i])] for i in picks]
        cases.append(rec)
        print("%-12s n %8d  offset %s  blob %d bytes" % (name, n, hexf(offset), len(blob)))
    # whole blocks (bitsandbytes multiplies by the reciprocal) and a short
    # last one (it divides), each of values where the two differ
    rng = np.random.default_rng(20)
    x = np.array(sum((straddlers(64, s, rng) for s in (1, -1, 1, -1)), [])
                 + straddlers(40, -1, rng), dtype=np.float32)
    blob, offset, out = quantize(x, 1)
    cases.append({"name": "div_vs_recip", "n": int(x.size), "values": [hexf(v) for v in x],
                  "threads": 1, "offset": hexf(offset), "blob_crc32": zlib.crc32(blob),
                  "dequant_crc32": zlib.crc32(out.tobytes()), "blob": blob.hex(),
                  "dequant": [[i, hexf(out[i])] for i in (0, 1, 64, 65, x.size - 1)]})
    offsets = []
    for blocks, threads in [(b, 1) for b in OFFSET_BLOCKS] + OFFSET_BLOCKS_THREADS:
        seed = 1000 + blocks
        _, offset, _ = quantize(make_input(64 * blocks, seed, OFFSET_KINDS), threads)
        offsets.append({"blocks": blocks, "seed": seed, "threads": threads,
                        "offset": hexf(offset)})
    doc = {"generator": "nf4_reference.py", "bitsandbytes": bitsandbytes.__version__,
           "torch": torch.__version__, "torch_cpu_capability": cap,
           "offset_kinds": OFFSET_KINDS, "cases": cases, "offsets": offsets}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)))


if __name__ == "__main__":
    main()
