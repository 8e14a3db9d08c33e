/* fuzz_util.h — what the libFuzzer harnesses share: the input as a
 * NUL-terminated string (the text parsers read C strings) and the checks
 * every parser's failure must pass. A failed check aborts, which libFuzzer
 * reports as a crash with the input that caused it. */
#ifndef REGC_FUZZ_UTIL_H
#define REGC_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regc_common.h"

/* A malloc'd copy of data with a NUL after it; aborts when out of memory
 * (the fuzzer's own limit, not the parser's fault). */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        abort();
    if (size)
        memcpy(text, data, size);
    text[size] = '\0';
    return text;
}

/* A failing parser returns a regc status and leaves one line naming what is
 * wrong; anything else (a positive code, an empty or multi-line message) is
 * a bug the fuzzer should report. */
static inline void fuzz_check_failure(int rc)
{
    if (rc >= 0 || rc < REGC_ERR_DIVERGED) {
        fprintf(stderr, "fuzz: status %d is not an error status\n", rc);
        abort();
    }
    const char *msg = regc_error_message();
    if (!msg || !msg[0] || strchr(msg, '\n')) {
        fprintf(stderr, "fuzz: status %d with the message \"%s\"\n", rc, msg ? msg : "(null)");
        abort();
    }
    regc_error_clear();
}

#endif
