/* regc_common.h — what every layer of regc shares: status codes with a
 * message, the deterministic random stream, atomic file output and a clock.
 *
 * Error convention: a function that can fail returns REGC_OK (0) or a
 * negative regc_status, and leaves a one-line message that names the file,
 * key or tensor involved; regc_error_message() reads it back. The message
 * lives in thread-local storage, so threads never see each other's errors. */
#ifndef REGC_COMMON_H
#define REGC_COMMON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    REGC_OK = 0,
    REGC_ERR_IO = -1,        /* a file could not be opened, read or written */
    REGC_ERR_FORMAT = -2,    /* a file or string is malformed */
    REGC_ERR_SHAPE = -3,     /* shapes, dtypes or counts do not agree */
    REGC_ERR_UNSUPPORTED = -4, /* valid input that regc does not handle */
    REGC_ERR_MEMORY = -5,    /* an allocation failed */
    REGC_ERR_ARG = -6,       /* a bad argument or option value */
} regc_status;

/* Record a message (printf-style) and return `status`, so a failing
 * function can end with `return regc_error(REGC_ERR_IO, "...", ...);`. */
int regc_error(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the current message with "<context>: " (used by callers that know
 * the file name when the callee only knew the key). */
void regc_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *regc_error_message(void);
void regc_error_clear(void);

/* ---- deterministic random numbers -------------------------------------
 * A counter-based stream: value i of stream `seed` is splitmix64's mixer
 * applied to seed + (i + 1) * 0x9E3779B97F4A7C15. Being counter-based it is
 * trivially reproduced elsewhere (tools/reference/gpt2_reference.py uses the
 * same definition to build identical weights and tokens). */
uint64_t regc_rng_mix(uint64_t z);
uint64_t regc_rng_at(uint64_t seed, uint64_t i);
/* out[i] = center + (k_i - 2^23) * f32(halfwidth / 2^23), k_i the top 24
 * bits of regc_rng_at(seed, i): uniform on [center - halfwidth, center +
 * halfwidth), computed in float32 with exactly two roundings. */
void regc_rng_fill_uniform(float *out, size_t n, uint64_t seed, float center, float halfwidth);
/* A seed for sub-stream `index` of `seed` (one stream per tensor). */
uint64_t regc_rng_substream(uint64_t seed, uint64_t index);

/* ---- files -------------------------------------------------------------- */
/* Read a whole file into a new buffer (NUL-terminated, size excludes it).
 * The caller frees *out with free(). */
int regc_file_read_all(const char *path, char **out, size_t *size);
/* Write `size` bytes to `path` atomically: a temporary file in the same
 * directory, fsync, rename. On failure nothing is left at `path` that was
 * not there before, and the temporary file is removed. */
int regc_file_write_atomic(const char *path, const void *data, size_t size);
/* mkdir -p: create dir and its missing parents (checkpoints go to fresh
 * nested paths like runs/x/step100); an error names the path that failed. */
int regc_make_dirs(const char *dir);
/* Join a directory and a file name into buf (always NUL-terminated). */
int regc_path_join(char *buf, size_t cap, const char *dir, const char *name);

/* ---- time --------------------------------------------------------------- */
double regc_time_ms(void); /* monotonic milliseconds */

#endif
