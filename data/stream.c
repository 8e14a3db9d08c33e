/* stream.c — files of llm.c's format read as one sequence of elements.
 *
 * A file is a 256 x int32 little-endian header (magic, version, count)
 * followed by `count` elements: uint16 tokens (llm.c's GPT-2 files, magic
 * 20240520 version 1), uint32 tokens (its Llama 3 files, 20240801 version
 * 7) or mask bytes (regc's, 20240601 version 1). Data prepared for llm.c comes as one file
 * or as shards (fineweb_train_000001.bin, ...); a pattern names the shards
 * and the stream is their elements one after another, in the byte order of
 * their names, as if they were one file.
 *
 * Open reads every file once, in chunks: the header against the size, each
 * element through the caller's check (tokens against the vocabulary), and
 * all the bytes through one hash, which is what a checkpoint records of
 * its data. After that nothing is held: a read opens the files its range
 * lies in and preads it, so data of any size costs no memory, and a file
 * changed since open (another size, a short read) is an error naming it
 * rather than other data or a fault. A file is opened per read rather than
 * held open, as a dataset of a thousand shards would pass the limit of
 * open files. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "regc_common.h"
#include "stream.h"

#define CHUNK_BYTES ((size_t)1 << 20) /* a multiple of every element size */

static int32_t read_le32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return (int32_t)v;
}

static void write_le32(unsigned char *p, int32_t value)
{
    uint32_t v = (uint32_t)value;
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* The formats: llm.c's token files, GPT-2's of uint16 and Llama 3's of
 * uint32 (its vocabulary passes 65,536), and regc's loss masks. A stream
 * of tokens reads either, one format for all its files. */
typedef struct {
    int32_t magic, version;
    size_t elem;      /* bytes per element, little-endian */
    const char *name; /* for messages */
} data_format;

static const data_format formats[] = {
    {DATA_TOKENS_MAGIC, 1, 2, "llm.c's GPT-2 format (uint16 tokens)"},
    {DATA_TOKENS32_MAGIC, 7, 4, "llm.c's Llama 3 format (uint32 tokens)"},
    {DATA_MASK_MAGIC, 1, 1, "a regc loss mask"},
};

static const data_format *format_of(int32_t magic)
{
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (formats[i].magic == magic)
            return &formats[i];
    return NULL;
}

/* Whether a file of magic m may stand in a stream of `kind`. */
static int format_is_kind(int32_t m, int32_t kind)
{
    return kind == DATA_MASK_MAGIC ? m == DATA_MASK_MAGIC
                                   : m == DATA_TOKENS_MAGIC || m == DATA_TOKENS32_MAGIC;
}

void data_header_put(unsigned char *header, int32_t magic, int32_t count)
{
    memset(header, 0, DATA_HEADER_BYTES);
    write_le32(header, magic);
    write_le32(header + 4, format_of(magic)->version);
    write_le32(header + 8, count);
}

/* The count of a file of `size` bytes whose first min(size, header) bytes
 * are `header`, a file of `kind` (DATA_TOKENS_MAGIC: either token format),
 * checked against the size; *elem its element's bytes, or, when *elem is
 * set (the stream's first file said it), checked against it. */
static int header_check(const char *path, const unsigned char *header, uint64_t size, int32_t kind,
                        int64_t *count, size_t *elem)
{
    const char *what = kind == DATA_MASK_MAGIC ? "a regc loss mask (magic 20240601)"
                                               : "an llm.c token file (magic 20240520, or "
                                                 "20240801 for Llama 3's)";
    const char *unit = kind == DATA_MASK_MAGIC ? "mask bytes" : "tokens";
    *count = 0;
    if (size < DATA_HEADER_BYTES)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: truncated header: file holds %llu bytes, the header needs %d", path,
                          (unsigned long long)size, DATA_HEADER_BYTES);
    int32_t m = read_le32(header), version = read_le32(header + 4), n = read_le32(header + 8);
    const data_format *f = format_is_kind(m, kind) ? format_of(m) : NULL;
    if (!f)
        return regc_error(REGC_ERR_FORMAT, "%s: bad magic %d: not %s", path, m, what);
    if (version != f->version)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: unsupported version %d (regc reads version %d of magic %d)", path,
                          version, f->version, m);
    if (*elem && *elem != f->elem)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: %s, where the files before it are of %zu-byte tokens", path, f->name,
                          *elem);
    if (n < 0)
        return regc_error(REGC_ERR_FORMAT, "%s: negative count %d in the header", path, n);
    uint64_t body = size - DATA_HEADER_BYTES, need = (uint64_t)n * f->elem;
    if (body < need)
        return regc_error(REGC_ERR_FORMAT, "%s: truncated: header says %d %s, file holds %llu",
                          path, n, unit, (unsigned long long)(body / f->elem));
    /* Extra bytes mean the header and the data disagree; guessing which is
     * right would silently train on the wrong data. */
    if (body > need)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: header says %d %s (%llu bytes) but %llu bytes follow the header",
                          path, n, unit, (unsigned long long)need, (unsigned long long)body);
    *count = n, *elem = f->elem;
    return REGC_OK;
}

/* header_check on the file open at fd (of size bytes): magic, version and
 * count are all it reads. */
static int file_header(int fd, const char *path, uint64_t size, int32_t kind, int64_t *count,
                       size_t *elem)
{
    unsigned char header[12];
    int rc = size >= DATA_HEADER_BYTES
                 ? regc_file_pread_full(fd, path, header, sizeof header, 0, "the header")
                 : REGC_OK;
    return rc ? rc : header_check(path, header, size, kind, count, elem);
}

/* The files a pattern names. */
typedef struct {
    glob_t g;
    int globbed;       /* g holds the names */
    const char *whole; /* else the pattern is the one name */
    int n;
} file_list;

static const char *file_at(const file_list *f, int i)
{
    return f->globbed ? f->g.gl_pathv[i] : f->whole;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* glob's report of a directory it could not read: one that is not there
 * (a pattern naming no file) is no error, any other is. */
static int glob_error(const char *path, int error)
{
    (void)path;
    return error != ENOENT && error != ENOTDIR;
}

static int files_expand(const char *pattern, file_list *f)
{
    memset(f, 0, sizeof *f);
    /* a name that holds none of * ? [, or a file of that very name
     * ("run[1]/train.bin"), is itself: a pattern never stands in for a file
     * that exists */
    struct stat st;
    if (!strpbrk(pattern, "*?[") || stat(pattern, &st) == 0) {
        f->whole = pattern;
        f->n = 1;
        return REGC_OK;
    }
    /* a directory the pattern cannot read is an error, not fewer shards
     * (glob_error); sorted here by strcmp, the byte order of the names
     * (glob's own order follows the locale), which numbered shards' names
     * follow */
    int rc = glob(pattern, GLOB_NOSORT, glob_error, &f->g);
    if (rc != 0 || f->g.gl_pathc > INT32_MAX) {
        globfree(&f->g);
        return rc == GLOB_NOMATCH
                   ? regc_error(REGC_ERR_IO,
                                "%s: no file matches this pattern (a name holding * ? [ is a "
                                "pattern unless a file has it)",
                                pattern)
               : rc == GLOB_NOSPACE
                   ? regc_error(REGC_ERR_MEMORY, "%s: out of memory listing its files", pattern)
                   : regc_error(REGC_ERR_IO,
                                "%s: cannot list the files of this pattern (a directory it "
                                "reads is unreadable)",
                                pattern);
    }
    qsort(f->g.gl_pathv, f->g.gl_pathc, sizeof *f->g.gl_pathv, cmp_names);
    f->globbed = 1;
    f->n = (int)f->g.gl_pathc;
    return REGC_OK;
}

static void files_free(file_list *f)
{
    if (f->globbed)
        globfree(&f->g);
}

/* Elements of a part's body through the check and the hash. */
static int body_take(const data_part *p, int64_t index, const unsigned char *body, int64_t n,
                     data_check_fn check, void *ctx, regc_hasher *h, size_t elem)
{
    int rc = check ? check(p->path, index, body, n, elem, ctx) : REGC_OK;
    if (rc == REGC_OK)
        regc_hasher_update(h, body, (size_t)n * elem);
    return rc;
}

/* What tells a file from another of its size: its device and inode (a
 * file renamed over it) and its modification time (one rewritten in
 * place). Not the change time: a chmod or a backup's hard link moves it
 * with the data the same. */
static int file_identity(int fd, const char *path, uint64_t id[3])
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return regc_error(REGC_ERR_IO, "%s: cannot stat the file", path);
    id[0] = (uint64_t)st.st_dev, id[1] = (uint64_t)st.st_ino;
    id[2] = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
    return REGC_OK;
}

/* Part p from the file at path: its header, then its body in chunks. */
static int part_open(data_part *p, const char *path, data_stream *s, data_check_fn check, void *ctx,
                     regc_hasher *h, unsigned char *chunk)
{
    if (!(p->path = strdup(path)))
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    int fd;
    int rc = regc_file_open_regular(path, REGC_TOKEN_FILE_MAX, &fd, &p->file_size);
    if (rc)
        return rc;
    rc = file_identity(fd, path, p->identity);
    if (rc == REGC_OK)
        rc = file_header(fd, path, p->file_size, s->magic, &p->count, &s->elem);
    const size_t elem = s->elem;
    const int64_t per_chunk = (int64_t)(CHUNK_BYTES / (elem ? elem : 1));
    for (int64_t i = 0; rc == REGC_OK && i < p->count; i += per_chunk) {
        const int64_t n = p->count - i < per_chunk ? p->count - i : per_chunk;
        rc = regc_file_pread_full(fd, path, chunk, (size_t)n * elem,
                                  DATA_HEADER_BYTES + (uint64_t)i * elem, "the body");
        if (rc == REGC_OK)
            rc = body_take(p, i, chunk, n, check, ctx, h, elem);
    }
    close(fd);
    return rc;
}

static int stream_begin(data_stream *s, int n, int32_t magic, regc_hasher **h)
{
    memset(s, 0, sizeof *s);
    s->magic = magic; /* s->elem: the first file's */
    s->parts = calloc((size_t)n, sizeof *s->parts);
    *h = regc_hasher_begin();
    if (!s->parts || !*h) {
        free(s->parts);
        s->parts = NULL;
        if (*h)
            regc_hasher_end(*h);
        *h = NULL;
        return regc_error(REGC_ERR_MEMORY, "out of memory opening data");
    }
    return REGC_OK;
}

/* The parts' places in the stream once each is open; the hash taken. */
static void stream_end(data_stream *s, regc_hasher *h)
{
    s->count = 0;
    for (int i = 0; i < s->n; i++) {
        s->parts[i].first = s->count;
        s->count += s->parts[i].count;
    }
    s->hash = regc_hasher_end(h);
}

int data_stream_open(const char *pattern, int32_t magic, data_check_fn check, void *ctx,
                     data_stream *s)
{
    memset(s, 0, sizeof *s);
    file_list f;
    int rc = files_expand(pattern, &f);
    if (rc)
        return rc;
    regc_hasher *h = NULL;
    unsigned char *chunk = malloc(CHUNK_BYTES);
    rc = chunk ? stream_begin(s, f.n, magic, &h)
               : regc_error(REGC_ERR_MEMORY, "%s: out of memory", pattern);
    for (int i = 0; rc == REGC_OK && i < f.n; i++) {
        s->n = i + 1; /* so that free releases the part however far it got */
        rc = part_open(&s->parts[i], file_at(&f, i), s, check, ctx, h, chunk);
    }
    free(chunk);
    files_free(&f);
    if (h)
        stream_end(s, h);
    if (rc)
        data_stream_free(s);
    return rc;
}

int data_stream_parse(const char *source, const void *bytes, size_t size, int32_t magic,
                      data_check_fn check, void *ctx, data_stream *s)
{
    regc_hasher *h;
    int rc = stream_begin(s, 1, magic, &h);
    if (rc)
        return rc;
    s->n = 1;
    data_part *p = &s->parts[0];
    p->file_size = size;
    rc = (p->path = strdup(source)) ? header_check(source, bytes, size, magic, &p->count, &s->elem)
                                    : regc_error(REGC_ERR_MEMORY, "%s: out of memory", source);
    const size_t body = (size_t)p->count * s->elem;
    if (rc == REGC_OK && !(p->bytes = malloc(body ? body : 1)))
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory for %zu bytes", source, body);
    if (rc == REGC_OK) {
        memcpy(p->bytes, (const unsigned char *)bytes + DATA_HEADER_BYTES, body);
        rc = body_take(p, 0, p->bytes, p->count, check, ctx, h, s->elem);
    }
    stream_end(s, h);
    if (rc)
        data_stream_free(s);
    return rc;
}

/* Elements [first, first + n) of part p, all inside it. */
static int part_read(const data_part *p, size_t elem, int64_t first, int64_t n, unsigned char *out)
{
    const size_t bytes = (size_t)n * elem;
    if (p->bytes) {
        memcpy(out, p->bytes + (size_t)first * elem, bytes);
        return REGC_OK;
    }
    int fd;
    uint64_t size, identity[3];
    int rc = regc_file_open_regular(p->path, REGC_TOKEN_FILE_MAX, &fd, &size);
    if (rc)
        return rc;
    if ((rc = file_identity(fd, p->path, identity)) == REGC_OK &&
        (size != p->file_size || memcmp(identity, p->identity, sizeof identity) != 0))
        rc = size != p->file_size
                 ? regc_error(REGC_ERR_IO,
                              "%s: changed since it was opened (%llu bytes then, %llu now; the "
                              "run reads its data again each batch)",
                              p->path, (unsigned long long)p->file_size, (unsigned long long)size)
                 : regc_error(REGC_ERR_IO,
                              "%s: changed since it was opened (replaced or rewritten: another "
                              "inode or modification time; the run reads its data again each "
                              "batch)",
                              p->path);
    else if (rc == REGC_OK)
        rc = regc_file_pread_full(fd, p->path, out, bytes,
                                  DATA_HEADER_BYTES + (uint64_t)first * elem, "the data");
    close(fd);
    return rc;
}

/* The last part starting at or before element i, by bisection. */
static int part_index(const data_stream *s, int64_t i)
{
    int lo = 0, hi = s->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->parts[mid].first <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

const data_part *data_stream_part_at(const data_stream *s, int64_t i)
{
    int k = part_index(s, i);
    while (k + 1 < s->n && s->parts[k].count == 0) /* an empty part at the same place */
        k++;
    return &s->parts[k];
}

int data_stream_read(const data_stream *s, int64_t first, int64_t n, unsigned char *out)
{
    if (s->n == 0 || first < 0 || n < 0 ||
        first > s->count - n) /* the callers' ranges lie inside */
        return regc_error(REGC_ERR_ARG, "elements %lld .. %lld of a stream of %lld",
                          (long long)first, (long long)(first + n - 1), (long long)s->count);
    int rc = REGC_OK;
    for (int i = part_index(s, first); rc == REGC_OK && n > 0 && i < s->n; i++) {
        const data_part *p = &s->parts[i];
        const int64_t at = first - p->first, left = p->count - at;
        if (left <= 0)
            continue; /* an empty part */
        const int64_t take = n < left ? n : left;
        rc = part_read(p, s->elem, at, take, out);
        out += (size_t)take * s->elem;
        first += take;
        n -= take;
    }
    return rc;
}

int data_stream_count(const char *pattern, int32_t magic, int64_t *count)
{
    *count = 0;
    size_t elem = 0; /* the first file's: the others' must be the same */
    file_list f;
    int rc = files_expand(pattern, &f);
    for (int i = 0; rc == REGC_OK && i < f.n; i++) {
        const char *path = file_at(&f, i);
        int fd;
        uint64_t size;
        int64_t c = 0;
        if ((rc = regc_file_open_regular(path, REGC_TOKEN_FILE_MAX, &fd, &size)))
            break;
        rc = file_header(fd, path, size, magic, &c, &elem);
        close(fd);
        *count += c;
    }
    files_free(&f);
    if (rc)
        *count = 0;
    return rc;
}

void data_stream_free(data_stream *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->parts[i].path);
        free(s->parts[i].bytes);
    }
    free(s->parts);
    memset(s, 0, sizeof *s);
}
