/* stream.h — files of llm.c's format read as one sequence of elements
 * (private to data/): a path or a pattern naming several, each file's
 * header checked, every element checked and hashed once at open, and any
 * range read later from the files themselves, so no file is held in
 * memory however large the data. */
#ifndef REGC_DATA_STREAM_H
#define REGC_DATA_STREAM_H

#include <stddef.h>
#include <stdint.h>

#define DATA_TOKENS_MAGIC 20240520   /* llm.c's token files: uint16 tokens (version 1) */
#define DATA_TOKENS32_MAGIC 20240801 /* ... for Llama 3's vocabulary: uint32 (version 7) */
#define DATA_MASK_MAGIC 20240601     /* regc's loss masks: one byte per token (version 1) */
#define DATA_HEADER_BYTES (256 * 4)  /* 256 little-endian int32: magic, version, count, 0 ... */

/* One file of a stream. */
typedef struct {
    char *path;           /* the file, or the name of a memory image: errors name it */
    unsigned char *bytes; /* the body when held in memory; NULL: read from path */
    uint64_t file_size;   /* the size it was checked at: a read finding another is refused */
    uint64_t identity[3]; /* device, inode, modification time (ns): likewise */
    int64_t first, count; /* its elements' place in the stream */
} data_part;

typedef struct {
    data_part *parts; /* [n], in the order of their names */
    int n;
    int64_t count; /* the elements of every part */
    int32_t magic; /* the kind: DATA_TOKENS_MAGIC (either token format) or DATA_MASK_MAGIC */
    size_t elem;   /* bytes per element, the first file's: 2 or 4 a token, 1 a mask byte */
    uint64_t hash; /* of the parts' bodies one after another */
} data_stream;

/* Checks elements index .. index+n-1 of a part at open: REGC_OK, or an
 * error naming path and the element. */
typedef int (*data_check_fn)(const char *path, int64_t index, const unsigned char *body, int64_t n,
                             size_t elem, void *ctx);

/* The files `pattern` names: itself when it holds none of * ? [ or a
 * file has that very name, else every match in byte order of the names
 * (none is an error naming it). magic: the kind, DATA_TOKENS_MAGIC
 * reading either token format (all files the same). */
int data_stream_open(const char *pattern, int32_t magic, data_check_fn check, void *ctx,
                     data_stream *s);
/* A stream of one file image held in memory under the name `source`. */
int data_stream_parse(const char *source, const void *bytes, size_t size, int32_t magic,
                      data_check_fn check, void *ctx, data_stream *s);
/* Elements first .. first+n-1 as their bytes (n x elem) into out. A file
 * changed since open is an error naming it. */
int data_stream_read(const data_stream *s, int64_t first, int64_t n, unsigned char *out);
/* The part element i lies in (its place there: i - first). */
const data_part *data_stream_part_at(const data_stream *s, int64_t i);
/* The element count of the files `pattern` names, from their headers. */
int data_stream_count(const char *pattern, int32_t magic, int64_t *count);
void data_stream_free(data_stream *s);

/* The header of a file of `count` elements with `magic`. */
void data_header_put(unsigned char *header, int32_t magic, int32_t count);

#endif
