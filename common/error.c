/* error.c — the thread-local "last error" message behind regc_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "regc_common.h"

static _Thread_local char error_message[1024];

int regc_error(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return status;
}

void regc_error_prefix(const char *fmt, ...)
{
    char old[sizeof error_message];
    memcpy(old, error_message, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    /* append ": <old message>", cutting what does not fit */
    size_t used = n < 0                              ? 0
                  : (size_t)n < sizeof error_message ? (size_t)n
                                                     : sizeof error_message - 1;
    const char *parts[2] = {": ", old};
    for (int p = 0; p < 2; p++)
        for (const char *c = parts[p]; *c && used + 1 < sizeof error_message; c++)
            error_message[used++] = *c;
    error_message[used] = '\0';
}

const char *regc_error_message(void) { return error_message[0] ? error_message : "no error"; }

void regc_error_clear(void) { error_message[0] = '\0'; }
