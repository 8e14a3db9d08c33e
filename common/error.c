/* error.c — the thread-local "last error" message behind regc_error().
 *
 * A message is one line: names in it often come from the input (a tensor
 * or key in a file), and a name holding a newline or a terminal escape
 * must not break the line or the terminal, so control bytes become '?'. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "regc_common.h"

static _Thread_local char error_message[1024];

static void error_one_line(void)
{
    for (char *c = error_message; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
}

int regc_error(int status, const char *fmt, ...)
{
    /* formatted apart first: an argument may be the message it replaces */
    char text[sizeof error_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(error_message, text, sizeof text);
    error_one_line();
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
    error_one_line();
}

const char *regc_error_message(void) { return error_message[0] ? error_message : "no error"; }

void regc_error_clear(void) { error_message[0] = '\0'; }
