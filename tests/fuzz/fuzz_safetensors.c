/* fuzz_safetensors.c — the safetensors reader (models/safetensors.c) on an
 * arbitrary file image: the header length, the JSON header, every entry's
 * dtype, shape and offsets, the layout of the data section; then, for a
 * file it accepts, every tensor looked up by name and read as fp32. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "regc_models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    regc_st_file *f = NULL;
    int rc = regc_st_parse("t.safetensors", data, size, &f);
    if (rc != REGC_OK) {
        fuzz_check_failure(rc);
        return 0;
    }
    float buf[64];
    for (int i = 0; i < regc_st_count(f); i++) {
        const char *name = regc_st_name(f, i);
        if (regc_st_find(f, name) != i)
            abort(); /* names are unique, so lookup finds this one */
        int64_t bytes = regc_st_bytes(f, i);
        if (bytes < 0 || (uint64_t)bytes > size)
            abort(); /* accepted offsets lie inside the image */
        /* the first elements, as a rank reads the start of its shard */
        for (int64_t n = 1; n <= 64; n *= 4) {
            rc = regc_st_read_range(f, i, 0, n, buf);
            if (rc != REGC_OK)
                fuzz_check_failure(rc);
        }
    }
    regc_st_close(f);
    return 0;
}
