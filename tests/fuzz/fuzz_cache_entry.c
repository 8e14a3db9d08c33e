/* fuzz_cache_entry.c — the compile cache's payload decoder (region/serial.c
 * and region/validate.c) on arbitrary bytes: what runs after an entry's
 * checksums pass, so a writer with valid checksums is the attacker. The
 * bytes are decoded as a step program and as a compiled region; a refusal
 * must be a one-line error, and anything accepted must be whole: written
 * back it decodes again (and a region then writes the same bytes), and its
 * dump (every label and name table it indexes) reads only what is there.
 *
 * Seeds (tests/fuzz/corpus/cache_entry/) are real payloads: the step and
 * region entries of `regc train --model gpt2-tiny --steps 1 --cache-dir D`
 * at O1, at O0 and with --no-inline-back, taken out of their entry files
 * (64-byte header, label, zlib of version NUL canonical form and payload):
 *   python3 -c 'import sys,zlib,struct; f=open(sys.argv[1],"rb").read();
 *     l,s,k=struct.unpack("<I",f[12:16])[0],*struct.unpack("<QQ",f[32:48]);
 *     sys.stdout.buffer.write(zlib.decompress(f[64+l:64+l+s])[k:])' ENTRY > SEED */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "serial.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *sink(void)
{
    static FILE *f;
    if (!f && !(f = fopen("/dev/null", "w")))
        abort();
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    regc_program *p = NULL;
    regc_compile_stats st = {0};
    int rc = regc_program_read(data, size, &p, &st);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        if (p)
            abort();
    } else {
        regc_program_dump(p, sink());
        regc_program *q = NULL;
        regc_compile_stats st2 = {0};
        regc_bytes b = {0};
        regc_program_write(p, &st, &b);
        if (regc_program_read(b.data, b.len, &q, &st2) != REGC_OK)
            abort(); /* what the decoder accepted, written back, is accepted */
        regc_program_free(q);
        regc_bytes_free(&b);
        regc_program_free(p);
    }

    regc_reader rd = regc_reader_of(data, size);
    regc_compiled_region *r = NULL;
    rc = regc_region_read(&rd, &r);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        if (r)
            abort();
        return 0;
    }
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) /* a decoded region has no graph to dump */
        regc_instr_dump(i < r->n_fwd ? &r->fwd[i] : &r->bwd[i - r->n_fwd], sink());
    /* written back, read again, written again: the same bytes */
    regc_bytes b = {0}, b2 = {0};
    regc_region_write(r, &b);
    regc_reader again = regc_reader_of(b.data, b.len);
    regc_compiled_region *r2 = NULL;
    if (b.failed || regc_region_read(&again, &r2) != REGC_OK || again.p != again.end)
        abort();
    regc_region_write(r2, &b2);
    if (b2.failed || b2.len != b.len || memcmp(b2.data, b.data, b.len))
        abort();
    regc_bytes_free(&b), regc_bytes_free(&b2);
    regc_compiled_region_free(r2);
    regc_compiled_region_free(r);
    return 0;
}
