/* cache.c — compile-cache entries on disk: keys, the entry format,
 * atomic writes, corruption checks and least-recently-used eviction.
 *
 * Every file in the directory is untrusted: it is opened without blocking
 * (a FIFO answers at once), checked with fstat before a byte is read (only
 * a regular file within the size limit is read), and its contents pass
 * the header, both checksums, decompression and the key before the payload
 * goes to its decoder, which checks it again (the compiler's, above). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zlib.h>

#include "regc_cache.h"
#include "regc_common.h"
#include "regc_source_id.h"

#define MAGIC "REGCACHE"
#define HEADER_BYTES 64
#define TAG_BYTES 16   /* SipHash-2-4-128 of everything before it */
#define KEY_FILE "key" /* the directory's sealing key: 16 random bytes, mode 0600 */
#define SUFFIX ".regc"
/* Entries are a compiled region or step: far below this, so a length
 * beyond it is corruption, not a reason to allocate (nor a file to read:
 * a cache limit below it lowers it). */
#define MAX_ENTRY_BYTES ((uint64_t)1 << 30)

struct regc_cache {
    char *dir;
    char *version;
    int64_t max_bytes;
    uint8_t key[16]; /* seals every entry this cache writes */
};

const char *regc_cache_build_version(void)
{
    return "regc " REGC_VERSION_STRING " format 2 source " REGC_SOURCE_ID;
}

int regc_cache_default_dir(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    /* The XDG spec ignores a relative XDG_CACHE_HOME. */
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, cap, "%s/regc", xdg);
    else if (home && home[0])
        n = snprintf(buf, cap, "%s/.cache/regc", home);
    else
        return regc_error(REGC_ERR_ARG, "compile cache: neither XDG_CACHE_HOME nor HOME is set "
                                        "(set compile.cache_dir, or --no-cache)");
    if (n < 0 || (size_t)n >= cap)
        return regc_error(REGC_ERR_ARG, "compile cache: the default directory's path is too long");
    return REGC_OK;
}

/* ---------------------------------------------------------------- the sealing key */

/* Checksums catch damage, not an entry another program wrote with valid
 * checksums and a changed payload: one that decodes and runs, but computes
 * something else (another epsilon, another shape that still fits). So the
 * cache seals each entry with a keyed hash under a secret of its own
 * directory, readable by its owner only: an entry whose seal does not
 * verify was not written by a regc that holds the key, and is a miss.
 * Whoever may read the key file may write entries; sharing a cache between
 * users means sharing it (make it group-readable). */
/* 1 when path holds a key: a regular file of 16 bytes, else 0; sets no
 * message, so a listing that finds no key leaves the caller's message as
 * it was. */
static int key_file(const char *path, uint8_t key[16])
{
    char why[160];
    int fd;
    uint64_t size;
    if (regc_file_try_open_regular(path, 16, &fd, &size, why, sizeof why) <= 0)
        return 0;
    int ok = size == 16 && read(fd, key, 16) == 16;
    close(fd);
    return ok;
}

static int read_key(const char *path, uint8_t key[16])
{
    return key_file(path, key) ? REGC_OK
                               : regc_error(REGC_ERR_IO,
                                            "%s: not a readable cache key (a regular file of 16 "
                                            "bytes, readable by this user)",
                                            path);
}

/* The directory's key, made on first use: random bytes written to a
 * private temporary file and linked into place, so that of two processes
 * making it at once both end with the one that got there first. */
static int load_key(const char *dir, uint8_t key[16])
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/" KEY_FILE, dir);
    if (access(path, F_OK) == 0)
        return read_key(path, key);
    uint8_t fresh[16];
    if (getrandom(fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh)
        return regc_error(REGC_ERR_IO, "%s: no random bytes for a cache key: %s", path,
                          strerror(errno));
    snprintf(tmp, sizeof tmp, "%s/.key.tmp-%ld", dir, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, fresh, sizeof fresh) == (ssize_t)sizeof fresh && fsync(fd) == 0;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    int linked = ok && (link(tmp, path) == 0 || errno == EEXIST);
    int e = errno;
    unlink(tmp);
    if (!linked)
        return regc_error(REGC_ERR_IO, "%s: cannot create the cache key: %s", path, strerror(e));
    return read_key(path, key);
}

static void seal(const uint8_t key[16], const uint8_t *file, size_t len, uint8_t tag[TAG_BYTES])
{
    regc_siphash128(key, file, len, tag);
}

/* Compared in time independent of where they differ. */
static int tags_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < TAG_BYTES; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

int regc_cache_open(const char *dir, int64_t max_bytes, const char *version, regc_cache **out)
{
    *out = NULL;
    if (!dir || !dir[0])
        return regc_error(REGC_ERR_ARG, "compile cache: empty directory name");
    int rc = regc_make_dirs(dir);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", regc_error_message());
        return regc_error(rc, "compile cache: %s (set compile.cache_dir, or --no-cache)", why);
    }
    regc_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir)) ||
        !(c->version = strdup(version ? version : regc_cache_build_version()))) {
        regc_cache_close(c);
        return regc_error(REGC_ERR_MEMORY, "compile cache: out of memory");
    }
    c->max_bytes = max_bytes;
    if ((rc = load_key(dir, c->key))) {
        char why[512];
        snprintf(why, sizeof why, "%s", regc_error_message());
        regc_cache_close(c);
        return regc_error(rc, "compile cache: %s (set compile.cache_dir, or --no-cache)", why);
    }
    *out = c;
    return REGC_OK;
}

void regc_cache_close(regc_cache *c)
{
    if (!c)
        return;
    free(c->dir), free(c->version), free(c);
}

const char *regc_cache_dir(const regc_cache *c) { return c->dir; }

/* ---------------------------------------------------------------- keys and headers */

typedef struct {
    uint64_t lo, hi;
} cache_key;

/* The bytes a key is the hash of: the version, a NUL, the canonical form. */
static int keyed_bytes(const regc_cache *c, const regc_bytes *canon, regc_bytes *out)
{
    regc_bytes_put(out, c->version, strlen(c->version) + 1);
    regc_bytes_put(out, canon->data, canon->len);
    return out->failed ? regc_error(REGC_ERR_MEMORY, "compile cache: out of memory") : REGC_OK;
}

static cache_key key_of(const void *p, size_t n)
{
    XXH128_hash_t h = XXH3_128bits(p, n);
    return (cache_key){h.low64, h.high64};
}

static void entry_path(const regc_cache *c, cache_key k, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%016llx%016llx" SUFFIX, c->dir, (unsigned long long)k.hi,
             (unsigned long long)k.lo);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint32_t crc_of(const void *p, size_t n)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    const Bytef *b = p;
    while (n > 0) { /* crc32 takes a uInt length */
        uInt step = n > 0x40000000u ? 0x40000000u : (uInt)n;
        crc = crc32(crc, b, step);
        b += step, n -= step;
    }
    return (uint32_t)crc;
}

typedef struct {
    uint32_t version, label_len;
    cache_key key;
    uint64_t stored_len, keyed_len, payload_len;
    uint32_t body_crc;
} entry_header;

/* ---------------------------------------------------------------- reading an entry */

/* An entry as read: its header, label, keyed bytes and payload. */
typedef struct {
    entry_header h;
    char *label;
    uint8_t *plain; /* keyed bytes then payload */
} entry_contents;

/* The largest file a cache with limit max_bytes reads: an entry beyond
 * the limit would be evicted by the next store anyway. */
static uint64_t read_limit(int64_t max_bytes)
{
    return max_bytes > 0 && (uint64_t)max_bytes < MAX_ENTRY_BYTES ? (uint64_t)max_bytes
                                                                  : MAX_ENTRY_BYTES;
}

/* Open path for reading when it is a regular file of at most limit bytes
 * (regc_file_try_open_regular: without blocking, fstat first): the
 * descriptor and its size, or -1 with the reason (-2 when there is no
 * file, the ordinary miss). */
static int open_regular(const char *path, uint64_t limit, size_t *size, char *why, size_t cap)
{
    int fd;
    uint64_t n;
    int r = regc_file_try_open_regular(path, 0, &fd, &n, why, cap);
    if (r <= 0)
        return r < 0 ? -2 : -1;
    if (n > limit) {
        snprintf(why, cap, "%llu bytes, beyond the cache's limit of %llu", (unsigned long long)n,
                 (unsigned long long)limit);
        close(fd);
        return -1;
    }
    *size = (size_t)n;
    return fd;
}

/* The whole file: 1, or 0 with the reason, or -1 when there is none (the
 * ordinary miss, which says nothing). Not regc_file_read_all: that one
 * leaves a message for every failure, cannot tell "no file" from
 * "unreadable", and would read a stray file of any size or kind. */
static int read_file(const char *path, uint64_t limit, uint8_t **data, size_t *len, char *why,
                     size_t cap)
{
    *data = NULL;
    size_t n = 0, got = 0;
    int fd = open_regular(path, limit, &n, why, cap);
    if (fd < 0)
        return fd == -2 ? -1 : 0;
    uint8_t *buf = malloc(n + 1);
    while (buf && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf || got != n) {
        snprintf(why, cap, buf ? "read failed" : "out of memory");
        free(buf);
        return 0;
    }
    *data = buf, *len = n;
    return 1;
}

static int parse_header(const uint8_t *b, size_t len, entry_header *h, char *why, size_t cap)
{
    if (len < HEADER_BYTES) {
        snprintf(why, cap, "truncated header (%zu bytes)", len);
        return 0;
    }
    if (memcmp(b, MAGIC, 8) != 0) {
        snprintf(why, cap, "not a regc cache entry (bad magic)");
        return 0;
    }
    h->version = (uint32_t)get_le(b + 8, 4);
    if (h->version != REGC_CACHE_FORMAT) {
        snprintf(why, cap, "format version %u, expected %d", h->version, REGC_CACHE_FORMAT);
        return 0;
    }
    if ((uint32_t)get_le(b + 60, 4) != crc_of(b, 60)) {
        snprintf(why, cap, "header checksum mismatch");
        return 0;
    }
    h->label_len = (uint32_t)get_le(b + 12, 4);
    h->key = (cache_key){get_le(b + 16, 8), get_le(b + 24, 8)};
    h->stored_len = get_le(b + 32, 8);
    h->keyed_len = get_le(b + 40, 8);
    h->payload_len = get_le(b + 48, 8);
    h->body_crc = (uint32_t)get_le(b + 56, 4);
    if (h->stored_len > MAX_ENTRY_BYTES || h->keyed_len > MAX_ENTRY_BYTES ||
        h->payload_len > MAX_ENTRY_BYTES) {
        snprintf(why, cap, "lengths out of range");
        return 0;
    }
    uint64_t want = HEADER_BYTES + (uint64_t)h->label_len + h->stored_len + TAG_BYTES;
    if ((uint64_t)len != want) {
        snprintf(why, cap, "%s (%zu bytes, header says %llu)",
                 len < want ? "truncated" : "trailing bytes", len, (unsigned long long)want);
        return 0;
    }
    return 1;
}

/* A whole entry file checked: 1 with its keyed bytes and payload (the
 * caller frees both), 0 with the reason in why, -1 when there is no file.
 * Out of memory is a reason too: a lookup that cannot be afforded is a
 * miss. */
static int read_entry(const char *path, uint64_t limit, const uint8_t *key, entry_contents *e,
                      char *why, size_t cap)
{
    memset(e, 0, sizeof *e);
    uint8_t *file;
    size_t len;
    int ok = read_file(path, limit, &file, &len, why, cap);
    if (ok <= 0)
        return ok;
    ok = parse_header(file, len, &e->h, why, cap);
    const uint8_t *body = file + HEADER_BYTES;
    if (ok && e->h.body_crc != crc_of(body, len - HEADER_BYTES - TAG_BYTES)) {
        snprintf(why, cap, "checksum mismatch");
        ok = 0;
    }
    if (ok) {
        uint8_t tag[TAG_BYTES];
        if (key)
            seal(key, file, len - TAG_BYTES, tag);
        if (!key || !tags_equal(tag, file + len - TAG_BYTES)) {
            snprintf(why, cap, "%s",
                     key ? "not sealed with this cache's key (written by another program, or "
                           "another cache)"
                         : "the cache has no key to check its seal with");
            ok = 0;
        }
    }
    if (ok) {
        uLongf plain_len = (uLongf)(e->h.keyed_len + e->h.payload_len);
        e->label = malloc(e->h.label_len + 1);
        e->plain = malloc((size_t)plain_len + 1);
        if (!e->label || !e->plain) {
            snprintf(why, cap, "out of memory");
            ok = 0;
        } else {
            memcpy(e->label, body, e->h.label_len);
            e->label[e->h.label_len] = 0;
            uLongf got = plain_len;
            int z = uncompress(e->plain, &got, body + e->h.label_len, (uLong)e->h.stored_len);
            if (z != Z_OK || got != plain_len) {
                snprintf(why, cap, "decompression failed (%s)",
                         z == Z_OK ? "short data" : zError(z));
                ok = 0;
            }
        }
    }
    if (ok) {
        cache_key k = key_of(e->plain, (size_t)e->h.keyed_len);
        if (k.lo != e->h.key.lo || k.hi != e->h.key.hi) {
            snprintf(why, cap, "stored canonical form does not hash to the entry's key");
            ok = 0;
        }
    }
    free(file);
    if (!ok) {
        free(e->label), free(e->plain);
        e->label = NULL, e->plain = NULL;
    }
    return ok;
}

int regc_cache_get(regc_cache *c, const regc_bytes *canon, regc_bytes *payload)
{
    memset(payload, 0, sizeof *payload);
    regc_bytes keyed = {0};
    int rc = keyed_bytes(c, canon, &keyed);
    if (rc) {
        regc_bytes_free(&keyed);
        return rc;
    }
    cache_key k = key_of(keyed.data, keyed.len);
    char path[4200], why[200];
    entry_path(c, k, path, sizeof path);
    entry_contents e;
    int ok = read_entry(path, read_limit(c->max_bytes), c->key, &e, why, sizeof why);
    if (ok > 0 && (e.h.key.lo != k.lo || e.h.key.hi != k.hi)) {
        snprintf(why, sizeof why, "header of another entry (key does not match the file name)");
        ok = 0;
    } else if (ok > 0 &&
               (e.h.keyed_len != keyed.len || memcmp(e.plain, keyed.data, keyed.len) != 0)) {
        snprintf(why, sizeof why, "key collision: the stored canonical form differs");
        ok = 0;
    }
    regc_bytes_free(&keyed);
    if (ok < 0) /* no entry: the ordinary miss */
        return 0;
    if (ok == 0) {
        fprintf(stderr, "regc: cache: %s: %s; compiling afresh\n", path, why);
        free(e.label), free(e.plain);
        return 0;
    }
    /* A hit is a use: the eviction order follows it. Only a hit: listing
     * and verifying (regc cache ls | verify) read entries without using
     * them, and must leave that order as the lookups made it. */
    utimensat(AT_FDCWD, path, NULL, 0);
    /* the payload moves to the front of the block the caller now owns */
    memmove(e.plain, e.plain + e.h.keyed_len, (size_t)e.h.payload_len);
    payload->data = e.plain;
    payload->len = payload->cap = (size_t)e.h.payload_len;
    free(e.label);
    return 1;
}

void regc_cache_entry_path(const regc_cache *c, const regc_bytes *canon, char *buf, size_t cap)
{
    regc_bytes keyed = {0};
    if (keyed_bytes(c, canon, &keyed) == REGC_OK)
        entry_path(c, key_of(keyed.data, keyed.len), buf, cap);
    else
        snprintf(buf, cap, "%s", c->dir);
    regc_bytes_free(&keyed);
}

/* ---------------------------------------------------------------- writing an entry */

static void evict(regc_cache *c);

int regc_cache_put(regc_cache *c, const regc_bytes *canon, const char *label,
                   const regc_bytes *payload)
{
    regc_bytes plain = {0}, file = {0};
    int rc = keyed_bytes(c, canon, &plain);
    size_t keyed_len = plain.len;
    regc_bytes_put(&plain, payload->data, payload->len);
    size_t label_len = label ? strlen(label) : 0;
    uLongf bound = compressBound((uLong)plain.len);
    uint8_t header[HEADER_BYTES] = {0};
    if (rc == REGC_OK && !plain.failed) {
        regc_bytes_put(&file, header, HEADER_BYTES);
        regc_bytes_put(&file, label, label_len);
        if (!file.failed && file.len + bound > file.cap) {
            uint8_t *d = realloc(file.data, file.len + bound);
            if (d)
                file.data = d, file.cap = file.len + bound;
            else
                file.failed = 1;
        }
    }
    if (rc || plain.failed || file.failed) {
        regc_bytes_free(&plain), regc_bytes_free(&file);
        return regc_error(REGC_ERR_MEMORY, "compile cache: out of memory");
    }
    /* level 1: a miss pays for compression, and compiled code compresses well anyway */
    uLongf stored = bound;
    if (compress2(file.data + file.len, &stored, plain.data, (uLong)plain.len, 1) != Z_OK) {
        regc_bytes_free(&plain), regc_bytes_free(&file);
        return regc_error(REGC_ERR_MEMORY, "compile cache: compression failed");
    }
    file.len += stored;
    cache_key k = key_of(plain.data, keyed_len);
    memcpy(header, MAGIC, 8);
    put_le(header + 8, REGC_CACHE_FORMAT, 4);
    put_le(header + 12, label_len, 4);
    put_le(header + 16, k.lo, 8);
    put_le(header + 24, k.hi, 8);
    put_le(header + 32, stored, 8);
    put_le(header + 40, keyed_len, 8);
    put_le(header + 48, plain.len - keyed_len, 8);
    put_le(header + 56, crc_of(file.data + HEADER_BYTES, file.len - HEADER_BYTES), 4);
    put_le(header + 60, crc_of(header, 60), 4);
    memcpy(file.data, header, HEADER_BYTES);
    uint8_t tag[TAG_BYTES];
    seal(c->key, file.data, file.len, tag);
    regc_bytes_put(&file, tag, TAG_BYTES);
    if (file.failed) {
        regc_bytes_free(&plain), regc_bytes_free(&file);
        return regc_error(REGC_ERR_MEMORY, "compile cache: out of memory");
    }
    char path[4200];
    entry_path(c, k, path, sizeof path);
    if (regc_file_write_atomic(path, file.data, file.len) != REGC_OK)
        fprintf(stderr, "regc: cache: %s; continuing without storing it\n", regc_error_message());
    regc_bytes_free(&plain), regc_bytes_free(&file);
    evict(c);
    return REGC_OK;
}

/* ---------------------------------------------------------------- the directory */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* <32 lowercase hex digits>.regc */
static int is_entry_name(const char *s)
{
    if (strlen(s) != 32 + strlen(SUFFIX) || !ends_with(s, SUFFIX))
        return 0;
    for (int i = 0; i < 32; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* <entry name>.tmp.XXXXXX, as regc_file_write_atomic names its temporaries */
static int is_temp_name(const char *s)
{
    size_t entry = 32 + strlen(SUFFIX);
    char name[64];
    if (strlen(s) != entry + strlen(".tmp.XXXXXX") || strncmp(s + entry, ".tmp.", 5) != 0)
        return 0;
    memcpy(name, s, entry);
    name[entry] = 0;
    return is_entry_name(name);
}

static int cmp_used(const void *a, const void *b)
{
    const regc_cache_entry *x = a, *y = b;
    if (x->used != y->used)
        return x->used < y->used ? -1 : 1;
    if (x->used_nsec != y->used_nsec)
        return x->used_nsec < y->used_nsec ? -1 : 1;
    return strcmp(x->file, y->file);
}

void regc_cache_entries_free(regc_cache_entry *e, int n)
{
    for (int i = 0; e && i < n; i++)
        free(e[i].label);
    free(e);
}

/* The label, from the header alone (ls); only of a regular file. */
static char *read_label(const char *path)
{
    char why[160];
    size_t size;
    int fd = open_regular(path, MAX_ENTRY_BYTES, &size, why, sizeof why);
    if (fd < 0)
        return NULL;
    uint8_t h[HEADER_BYTES];
    char *label = NULL;
    if (read(fd, h, HEADER_BYTES) == HEADER_BYTES && !memcmp(h, MAGIC, 8)) {
        uint32_t n = (uint32_t)get_le(h + 12, 4);
        if (n < 4096 && (label = calloc(n + 1, 1)) && read(fd, label, n) != (ssize_t)n) {
            free(label);
            label = NULL;
        }
    }
    close(fd);
    return label;
}

/* How much scan_dir reads of each entry: eviction and clearing need only
 * names, sizes and times; listing adds the label, verifying everything. */
typedef enum { SCAN_NAMES, SCAN_LABELS, SCAN_VERIFY } scan_depth;

/* An entry whose checksums hold, through the caller's decoder. */
static void check_payload(const entry_contents *c, regc_cache_check_fn check, void *ctx,
                          char *problem, size_t cap)
{
    const uint8_t *nul = memchr(c->plain, 0, (size_t)c->h.keyed_len);
    if (!nul) { /* the keyed bytes always start with the version and a NUL */
        snprintf(problem, cap, "no version in the stored canonical form");
        return;
    }
    size_t v = (size_t)(nul - c->plain) + 1;
    if (check(ctx, (const char *)c->plain, c->plain + v, (size_t)c->h.keyed_len - v,
              c->plain + c->h.keyed_len, (size_t)c->h.payload_len) != REGC_OK)
        snprintf(problem, cap, "payload refused: %s", regc_error_message());
}

static int scan_dir(const char *dir, scan_depth depth, regc_cache_check_fn check, void *ctx,
                    regc_cache_entry **out, int *n_out)
{
    *out = NULL, *n_out = 0;
    DIR *d = opendir(dir);
    if (!d)
        return regc_error(REGC_ERR_IO, "%s: cannot open the cache directory: %s", dir,
                          strerror(errno));
    /* the seal is checked with the directory's key; without one (never
     * made, or not ours to read) no entry can be shown sound */
    uint8_t key_bytes[16];
    const uint8_t *key = NULL;
    char key_path[4200];
    snprintf(key_path, sizeof key_path, "%s/" KEY_FILE, dir);
    if (depth == SCAN_VERIFY && key_file(key_path, key_bytes))
        key = key_bytes;
    regc_cache_entry *e = NULL;
    int n = 0, cap = 0, rc = REGC_OK;
    struct dirent *de;
    while ((de = readdir(d)) && rc == REGC_OK) {
        /* only names regc makes (at most 48 characters): anything else in
         * the directory is not the cache's to list or remove */
        int temp = is_temp_name(de->d_name);
        if (!temp && !is_entry_name(de->d_name))
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0) /* removed meanwhile by another process */
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            regc_cache_entry *x = realloc(e, (size_t)cap * sizeof *x);
            if (!x) {
                rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory listing the cache", dir);
                break;
            }
            e = x;
        }
        regc_cache_entry *x = &e[n++];
        memset(x, 0, sizeof *x);
        memcpy(x->file, de->d_name, strlen(de->d_name) + 1); /* at most 48 characters */
        x->bytes = st.st_size, x->temporary = temp;
        x->used = st.st_mtim.tv_sec, x->used_nsec = st.st_mtim.tv_nsec;
        if (temp || depth == SCAN_NAMES)
            continue;
        if (depth == SCAN_LABELS) {
            x->label = read_label(path);
            continue;
        }
        entry_contents c;
        char why[160];
        int ok = read_entry(path, MAX_ENTRY_BYTES, key, &c, why, sizeof why);
        if (ok > 0) {
            char name[40];
            snprintf(name, sizeof name, "%016llx%016llx" SUFFIX, (unsigned long long)c.h.key.hi,
                     (unsigned long long)c.h.key.lo);
            if (strcmp(name, x->file) != 0)
                snprintf(x->problem, sizeof x->problem, "key does not match the file name");
            else if (check)
                check_payload(&c, check, ctx, x->problem, sizeof x->problem);
            x->label = c.label;
            free(c.plain);
        } else {
            snprintf(x->problem, sizeof x->problem, "%s", ok < 0 ? "vanished while reading" : why);
            x->label = read_label(path);
        }
    }
    closedir(d);
    if (rc) {
        regc_cache_entries_free(e, n);
        return rc;
    }
    if (n > 1)
        qsort(e, (size_t)n, sizeof *e, cmp_used);
    *out = e, *n_out = n;
    return REGC_OK;
}

int regc_cache_scan(const char *dir, int verify, regc_cache_entry **out, int *n_out)
{
    return scan_dir(dir, verify ? SCAN_VERIFY : SCAN_LABELS, NULL, NULL, out, n_out);
}

int regc_cache_scan_checked(const char *dir, regc_cache_check_fn check, void *ctx,
                            regc_cache_entry **out, int *n_out)
{
    return scan_dir(dir, SCAN_VERIFY, check, ctx, out, n_out);
}

/* After a store: remove the temporary files of writers that died, then
 * the least recently used entries while the total exceeds the limit. */
static void evict(regc_cache *c)
{
    regc_cache_entry *e;
    int n;
    if (scan_dir(c->dir, SCAN_NAMES, NULL, NULL, &e, &n) != REGC_OK)
        return;
    time_t now = time(NULL);
    int64_t total = 0;
    char path[4200];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", c->dir, e[i].file);
        if (e[i].temporary && now - e[i].used > REGC_CACHE_STALE_TEMP_S)
            unlink(path);
        else if (!e[i].temporary)
            total += e[i].bytes;
    }
    for (int i = 0; i < n && c->max_bytes > 0 && total > c->max_bytes; i++) {
        if (e[i].temporary)
            continue;
        snprintf(path, sizeof path, "%s/%s", c->dir, e[i].file);
        if (unlink(path) == 0)
            total -= e[i].bytes;
    }
    regc_cache_entries_free(e, n);
}

int regc_cache_clear(const char *dir, int *removed)
{
    *removed = 0;
    regc_cache_entry *e;
    int n, rc = scan_dir(dir, SCAN_NAMES, NULL, NULL, &e, &n);
    if (rc)
        return rc;
    char path[4200];
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, e[i].file);
        if (unlink(path) == 0)
            ++*removed;
        else if (errno != ENOENT)
            rc = regc_error(REGC_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    }
    regc_cache_entries_free(e, n);
    return rc;
}
