/* text.c — numbers from text, strictly: the whole text must be the number,
 * in range, or the caller gets a failure to word for its user. Command
 * lines and the option table read values this way, so " 5", "+5", "5x",
 * "0x10", "inf" and "nan" are refused rather than half-read. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "regc_common.h"

static int all_digits(const char *p)
{
    if (!*p)
        return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

int regc_text_to_i64(const char *text, int64_t min, int64_t max, int64_t *out)
{
    const char *p = text;
    if (*p == '-' && min < 0)
        p++;
    if (!all_digits(p))
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = (int64_t)v;
    return 0;
}

int regc_text_to_u64(const char *text, uint64_t *out)
{
    if (!all_digits(text))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int regc_text_to_float(const char *text, int positive, float *out)
{
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    /* strtod skips leading blanks and reads "inf"/"nan"; neither is a
     * value someone meant to type */
    int ok = text[0] != '\0' && !isspace((unsigned char)text[0]) && end != text && *end == '\0' &&
             errno == 0 && isfinite(v) && v <= 3.0e38 && (positive ? v > 0.0 : v >= 0.0);
    if (!ok)
        return -1;
    *out = (float)v;
    return positive && *out == 0.0f ? -2 : 0; /* below float's range: would silently be 0 */
}
