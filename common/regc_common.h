/* regc_common.h — what every layer of regc shares: status codes with a
 * message, the deterministic random stream, atomic file output, a clock, and
 * the byte encoding of canonical forms and cached payloads.
 *
 * Error convention: a function that can fail returns REGC_OK (0) or a
 * negative regc_status, and leaves a one-line message that names the file,
 * key or tensor involved; regc_error_message() reads it back. The message
 * lives in thread-local storage, so threads never see each other's errors. */
#ifndef REGC_COMMON_H
#define REGC_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA module's .cu files include it */
extern "C" {
#endif

typedef enum {
    REGC_OK = 0,
    REGC_ERR_IO = -1,          /* a file could not be opened, read or written */
    REGC_ERR_FORMAT = -2,      /* a file or string is malformed */
    REGC_ERR_SHAPE = -3,       /* shapes, dtypes or counts do not agree */
    REGC_ERR_UNSUPPORTED = -4, /* valid input that regc does not handle */
    REGC_ERR_MEMORY = -5,      /* an allocation failed */
    REGC_ERR_ARG = -6,         /* a bad argument or option value */
    REGC_ERR_RANK = -7,        /* another rank of the job failed and reported why */
    REGC_ERR_DIVERGED = -8,    /* training met a loss or gradient norm that is not finite */
    REGC_ERR_BUDGET = -9, /* the step does not fit the memory budget (the least it needs said) */
} regc_status;

/* Record a message (printf-style) and return `status`, so a failing
 * function can end with `return regc_error(REGC_ERR_IO, "...", ...);`. */
int regc_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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
/* Elements [first, first + n) of what regc_rng_fill_uniform would draw. */
void regc_rng_fill_uniform_range(float *out, size_t first, size_t n, uint64_t seed, float center,
                                 float halfwidth);
/* A seed for sub-stream `index` of `seed` (one stream per tensor). */
uint64_t regc_rng_substream(uint64_t seed, uint64_t index);

/* ---- files -------------------------------------------------------------- */
/* The one way regc opens a file to read: non-blocking (a FIFO cannot hang
 * it), checked with fstat before any read, refused unless a regular file
 * of at most max_bytes (0: no cap); the error names the path and why.
 * *fd is open for reading on success. */
int regc_file_open_regular(const char *path, uint64_t max_bytes, int *fd, uint64_t *size);
/* The same without a message, for readers to whom a refused file is no
 * error (a cache miss): 1 opened, 0 refused with the reason in why, -1 no
 * such file. */
int regc_file_try_open_regular(const char *path, uint64_t max_bytes, int *fd, uint64_t *size,
                               char *why, size_t cap);
/* The largest text file regc reads whole: configs, graph JSON, indexes. A
 * 70B-parameter graph JSON is a few MiB; this leaves room and still stops
 * /dev/zero or a mistyped multi-gigabyte path at once. */
#define REGC_TEXT_FILE_MAX ((uint64_t)256 << 20)
/* The largest token file regc reads whole: 8G tokens of uint16. */
#define REGC_TOKEN_FILE_MAX ((uint64_t)16 << 30)
/* Read a whole regular file of at most max_bytes into a new buffer
 * (NUL-terminated, size excludes it). The caller frees *out with free(). */
int regc_file_read_capped(const char *path, uint64_t max_bytes, char **out, size_t *size);
/* pread until `size` bytes from `offset` arrive: a file shorter than that
 * is an error naming path and `what` is read. */
int regc_file_pread_full(int fd, const char *path, void *buf, size_t size, uint64_t offset,
                         const char *what);
/* regc_file_read_capped with REGC_TEXT_FILE_MAX. */
int regc_file_read_all(const char *path, char **out, size_t *size);
/* Write `size` bytes to `path` atomically: a temporary file in the same
 * directory, fsync, rename. On failure nothing is left at `path` that was
 * not there before, and the temporary file is removed. */
int regc_file_write_atomic(const char *path, const void *data, size_t size);
/* The same, written in pieces at any offsets: open creates the temporary
 * file, commit makes it durable and renames it into place (freeing f
 * either way), abandon removes it. */
typedef struct regc_atomic_file regc_atomic_file;
int regc_atomic_open(const char *path, regc_atomic_file **out);
int regc_atomic_pwrite(regc_atomic_file *f, const void *data, size_t size, uint64_t offset);
int regc_atomic_commit(regc_atomic_file *f);
void regc_atomic_abandon(regc_atomic_file *f);
/* A directory written whole or not at all (stagedir.c): open makes a
 * hidden sibling of dir (its parents made as needed; a dir holding a
 * subdirectory refused) and removes the siblings of writers that died;
 * the caller writes its files into regc_staged_dir_path; commit carries
 * over the old directory's other files (not weights nor configs), makes
 * everything durable and puts the sibling in dir's place in one rename;
 * abandon removes it. Both free s. probe: open and abandon, so a path that
 * cannot be saved to fails before the work that would fill it. */
typedef struct regc_staged_dir regc_staged_dir;
int regc_staged_dir_open(const char *dir, regc_staged_dir **out);
const char *regc_staged_dir_path(const regc_staged_dir *s);
int regc_staged_dir_commit(regc_staged_dir *s);
/* commit as on a filesystem without renameat2's exchange (what commit falls
 * back to there): the old directory renamed aside, then the new one in */
int regc_staged_dir_commit_aside(regc_staged_dir *s);
void regc_staged_dir_abandon(regc_staged_dir *s);
int regc_staged_dir_probe(const char *dir);
/* Remove from parent the hidden siblings whose name starts with
 * name_prefix and whose writer, on this host, no longer runs. */
void regc_staged_dir_remove_dead(const char *parent, const char *name_prefix);
/* mkdir -p: create dir and its missing parents (checkpoints go to fresh
 * nested paths like runs/x/step100); an error names the path that failed. */
int regc_make_dirs(const char *dir);
/* fsync a directory, so that the renames and creations in it are durable. */
int regc_fsync_dir(const char *dir);
/* rm -r: a file, or a directory and everything below it (symbolic links
 * are removed, never followed); a path that does not exist is not an error. */
int regc_remove_tree(const char *path);
/* Join a directory and a file name into buf (always NUL-terminated). */
int regc_path_join(char *buf, size_t cap, const char *dir, const char *name);

/* ---- numbers from text (common/text.c) -----------------------------------
 * The whole text must be the number: plain decimal digits for integers (a
 * leading '-' only when min < 0), a finite decimal for floats. 0 on
 * success, a negative value (and *out untouched) otherwise. */
int regc_text_to_i64(const char *text, int64_t min, int64_t max, int64_t *out);
int regc_text_to_u64(const char *text, uint64_t *out); /* all of uint64 */
/* > 0 when positive, else >= 0, and at most 3e38; -2 when a positive value
 * is too small for a float (it would round to 0). */
int regc_text_to_float(const char *text, int positive, float *out);

/* ---- time --------------------------------------------------------------- */
double regc_time_ms(void); /* monotonic milliseconds */

/* qsort's comparison of two int64_t (or of records that begin with one). */
static inline int regc_cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}
/* SipHash-2-4 of data under a 128-bit key (siphash.c): the 64-bit output,
 * and the 128-bit one that seals compile-cache entries. */
uint64_t regc_siphash64(const uint8_t key[16], const void *data, size_t n);
void regc_siphash128(const uint8_t key[16], const void *data, size_t n, uint8_t out[16]);
/* The memory this process can have in all: the host's (MemTotal), or its
 * cgroup's limit where lower; 0 when unknown. */
int64_t regc_host_memory_bytes(void);

/* ---- bytes --------------------------------------------------------------
 * A growable byte buffer and a bounds-checked reader: the encoding of
 * canonical forms (what compile-cache keys hash) and of cached payloads.
 * Integers are LEB128 varints (signed ones zigzag-coded first), floats
 * their 4 IEEE bytes, strings a length and their bytes. Both sides keep a
 * sticky failure flag, so an encoder or decoder checks once at the end
 * instead of after every field. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
    int failed; /* an allocation failed: the contents are incomplete */
} regc_bytes;

/* A 64-bit hash of n bytes (XXH3): what a checkpoint records of a model's
 * structure, to recognise it again. */
uint64_t regc_hash64(const void *data, size_t n);
/* The same hash of bytes given in pieces: begin (NULL when out of memory),
 * update with each piece in order, end (which frees h) returns what
 * regc_hash64 returns for the pieces joined. */
typedef struct regc_hasher regc_hasher;
regc_hasher *regc_hasher_begin(void);
void regc_hasher_update(regc_hasher *h, const void *data, size_t n);
uint64_t regc_hasher_end(regc_hasher *h);

/* v as bfloat16's bits: rounded to nearest, ties to even; a NaN stays a
 * (quiet) NaN. The kernels' regc_bf16_bits, for the host's own files and
 * blocks. */
uint16_t regc_f32_to_bf16(float v);

/* A zeroed regc_bytes is empty and ready; free releases it. */
void regc_bytes_free(regc_bytes *b);
void regc_bytes_put(regc_bytes *b, const void *p, size_t n);
void regc_bytes_put_u64(regc_bytes *b, uint64_t v);
void regc_bytes_put_i64(regc_bytes *b, int64_t v);
void regc_bytes_put_f32(regc_bytes *b, float v);
/* NULL is written as the empty string. */
void regc_bytes_put_str(regc_bytes *b, const char *s);

typedef struct {
    const uint8_t *p, *end;
    int failed; /* ran past the end, or a value was out of its range */
} regc_reader;

regc_reader regc_reader_of(const void *data, size_t len);
float regc_reader_f32(regc_reader *r);
/* A malloc'd, NUL-terminated copy; NULL when failed. */
char *regc_reader_str(regc_reader *r);
/* n raw bytes into dst. */
void regc_reader_get(regc_reader *r, void *dst, size_t n);

/* The integer readers are inline: a cached step program is mostly
 * varints, and decoding it is on the path of every warm start. */
static inline uint64_t regc_reader_u64(regc_reader *r)
{
    uint64_t v = 0;
    for (int shift = 0; !r->failed; shift += 7) {
        if (r->p == r->end || shift > 63) {
            r->failed = 1;
            break;
        }
        uint8_t c = *r->p++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return v;
    }
    return 0;
}

static inline int64_t regc_reader_i64(regc_reader *r)
{
    uint64_t u = regc_reader_u64(r);
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

/* A signed integer that must lie in [lo, hi]; fails (and returns lo) otherwise. */
static inline int64_t regc_reader_int(regc_reader *r, int64_t lo, int64_t hi)
{
    int64_t v = regc_reader_i64(r);
    if (v < lo || v > hi) {
        r->failed = 1;
        return lo;
    }
    return v;
}

#ifdef __cplusplus
}
#endif

#endif
