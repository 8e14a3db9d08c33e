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
    char prefix[512], old[sizeof error_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_message, sizeof old);
    /* a message too long for the buffer is cut, never overrun */
    int n = snprintf(error_message, sizeof error_message, "%s: %s", prefix, old);
    (void)n;
}

const char *regc_error_message(void)
{
    return error_message[0] ? error_message : "no error";
}

void regc_error_clear(void)
{
    error_message[0] = '\0';
}
