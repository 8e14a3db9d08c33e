/* safetensors.c — reading .safetensors files (writing them:
 * safetensors_write.c).
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data section; offsets are relative to its start (byte 8 + N).
 *
 * Reading uses pread straight into the caller's buffer (F32) or through a
 * small bounce buffer (BF16/F16), so a 500 MB checkpoint is copied once from
 * the page cache and never held twice; mmap would add SIGBUS on a file that
 * shrinks under us for no gain. Everything the header claims is checked at
 * open, so a read can only fail on a dtype regc cannot convert, a shape the
 * caller did not expect, or a file changed after open. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "regc_models.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads little-endian data in place; add byte swapping for this host"
#endif

/* The reference implementation refuses headers over 100 MB; a length past
 * that is corruption, not a model. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: integers JSON numbers hold exactly */
#define ST_BOUNCE_ELEMS 65536

typedef struct {
    char *name;
    char dtype[16];
    int esize; /* bytes per element; 0 for a dtype this file cannot size */
    int ndim;
    int64_t *shape;
    uint64_t begin, end;
} st_tensor;

typedef struct {
    const char *name;
    int index;
} st_sorted;

struct regc_st_file {
    char *path;
    int fd;                   /* -1 for a file image in memory */
    const unsigned char *mem; /* the image (regc_st_parse), else NULL */
    uint64_t mem_size;
    uint64_t data_start;
    int n;
    st_tensor *t;      /* in header order */
    st_sorted *sorted; /* by name, for regc_st_find */
};

/* Every dtype of the format, so that offsets are checked for tensors regc
 * will never read (an I64 buffer in the file is still part of its layout). */
static int st_dtype_size(const char *dtype)
{
    static const struct {
        const char *name;
        int size;
    } table[] = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
        {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
        {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(dtype, table[i].name) == 0)
            return table[i].size;
    return 0;
}

static void st_format_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

static int st_cmp_sorted(const void *a, const void *b)
{
    return strcmp(((const st_sorted *)a)->name, ((const st_sorted *)b)->name);
}

/* A JSON number that is a non-negative integer representable exactly. */
static int st_json_uint(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return 0;
    double d = item->valuedouble;
    if (!(d >= 0.0 && d <= ST_MAX_EXACT) || d != (double)(uint64_t)d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

void regc_st_close(regc_st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n; i++) {
        free(f->t[i].name);
        free(f->t[i].shape);
    }
    free(f->t);
    free(f->sorted);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    free(f);
}

/* pread until `size` bytes arrive; a short file is reported as truncation. */
static int st_pread_full(const regc_st_file *f, void *buf, size_t size, uint64_t offset,
                         const char *what)
{
    if (f->mem) {
        if (offset > f->mem_size || size > f->mem_size - offset)
            return regc_error(REGC_ERR_FORMAT, "%s: truncated while reading %s", f->path, what);
        memcpy(buf, f->mem + offset, size);
        return REGC_OK;
    }
    return regc_file_pread_full(f->fd, f->path, buf, size, offset, what);
}

static int st_parse_entry(regc_st_file *f, const cJSON *item, uint64_t data_size, st_tensor *t)
{
    const char *path = f->path, *name = item->string;
    if (!cJSON_IsObject(item))
        return regc_error(REGC_ERR_FORMAT, "%s: tensor %s: header entry is not an object", path,
                          name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(dtype) || strlen(dtype->valuestring) >= sizeof t->dtype)
        return regc_error(REGC_ERR_FORMAT, "%s: tensor %s: missing or invalid \"dtype\"", path,
                          name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype->valuestring);
    t->esize = st_dtype_size(t->dtype);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    if (!cJSON_IsArray(shape))
        return regc_error(REGC_ERR_FORMAT, "%s: tensor %s: missing or invalid \"shape\"", path,
                          name);
    t->ndim = cJSON_GetArraySize(shape);
    t->shape = calloc((size_t)t->ndim + 1, sizeof *t->shape);
    if (!t->shape)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    /* numel saturates instead of overflowing: any such tensor fails the
     * byte-count check below, which is the error worth reporting. */
    uint64_t numel = 1;
    int d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach (dim, shape) {
        uint64_t v;
        if (!st_json_uint(dim, &v))
            return regc_error(REGC_ERR_FORMAT,
                              "%s: tensor %s: \"shape\" must hold non-negative integers", path,
                              name);
        t->shape[d++] = (int64_t)v;
        numel = (v != 0 && numel > UINT64_MAX / v) ? UINT64_MAX : numel * v;
    }

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !st_json_uint(cJSON_GetArrayItem(offs, 0), &t->begin) ||
        !st_json_uint(cJSON_GetArrayItem(offs, 1), &t->end) || t->begin > t->end)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: tensor %s: \"data_offsets\" must be [begin, end] with "
                          "0 <= begin <= end",
                          path, name);
    if (t->esize > 0) {
        uint64_t need =
            numel > UINT64_MAX / (uint64_t)t->esize ? UINT64_MAX : numel * (uint64_t)t->esize;
        if (t->end - t->begin != need) {
            char s[160];
            st_format_shape(s, sizeof s, t->ndim, t->shape);
            return regc_error(REGC_ERR_FORMAT,
                              "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                              " bytes but shape %s of %s needs %" PRIu64,
                              path, name, t->begin, t->end, t->end - t->begin, s, t->dtype, need);
        }
    }
    if (t->end > data_size)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: truncated or corrupt: tensor %s ends at byte %" PRIu64
                          " of the data section, which has %" PRIu64 " bytes",
                          path, name, t->end, data_size);
    return REGC_OK;
}

typedef struct {
    uint64_t begin, end;
    int index;
} st_span;

static int st_cmp_spans(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* The format's rule for the data section: the tensors, in offset order,
 * tile it exactly: no byte shared by two tensors, none left between them or
 * after the last (the reference reader refuses such files too: a hole or a
 * shared range is how one file would read as two different models). */
static int st_check_layout(const regc_st_file *f, uint64_t data_size)
{
    st_span *order = malloc(((size_t)f->n + 1) * sizeof *order);
    if (!order)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++)
        order[i] = (st_span){f->t[i].begin, f->t[i].end, i};
    qsort(order, (size_t)f->n, sizeof *order, st_cmp_spans);
    uint64_t at = 0;
    const st_tensor *prev = NULL;
    int rc = REGC_OK;
    for (int k = 0; k < f->n && rc == REGC_OK; k++) {
        const st_tensor *t = &f->t[order[k].index];
        if (t->begin < at)
            rc = regc_error(REGC_ERR_FORMAT,
                            "%s: tensors %s [%" PRIu64 ", %" PRIu64 ") and %s [%" PRIu64
                            ", %" PRIu64 ") overlap (each byte of the data belongs to one tensor)",
                            f->path, prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
        else if (t->begin > at)
            rc = regc_error(REGC_ERR_FORMAT,
                            "%s: bytes [%" PRIu64 ", %" PRIu64 ") of the data belong to no tensor "
                            "(a hole %s%s before tensor %s; the data must be contiguous)",
                            f->path, at, t->begin, prev ? "after tensor " : "at the start",
                            prev ? prev->name : "", t->name);
        at = t->end;
        prev = t;
    }
    if (rc == REGC_OK && at != data_size)
        rc = regc_error(REGC_ERR_FORMAT,
                        "%s: %" PRIu64 " bytes of data after %s%s (the data must end with the "
                        "last tensor)",
                        f->path, data_size - at, prev ? "the last tensor " : "the header",
                        prev ? prev->name : "");
    free(order);
    return rc;
}

static int st_parse_header(regc_st_file *f, const char *text, size_t len, uint64_t data_size)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root)
        return regc_error(REGC_ERR_FORMAT, "%s: malformed header JSON near byte %zu", f->path,
                          (size_t)(end ? end - text : 0) + 8);
    int rc = REGC_OK;
    /* The format pads the header with spaces; anything else after the JSON
     * means the length or the text is wrong. */
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            rc = regc_error(REGC_ERR_FORMAT, "%s: malformed header JSON: trailing data at byte %zu",
                            f->path, (size_t)(p - text) + 8);
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        rc = regc_error(REGC_ERR_FORMAT, "%s: malformed header: not a JSON object", f->path);
        goto done;
    }
    int count = 0;
    const cJSON *item;
    cJSON_ArrayForEach (item, root)
        if (strcmp(item->string, "__metadata__") != 0)
            count++;
    f->t = calloc((size_t)count + 1, sizeof *f->t);
    f->sorted = calloc((size_t)count + 1, sizeof *f->sorted);
    if (!f->t || !f->sorted) {
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", f->path);
        goto done;
    }
    cJSON_ArrayForEach (item, root) {
        if (strcmp(item->string, "__metadata__") == 0)
            continue;
        st_tensor *t = &f->t[f->n];
        t->name = strdup(item->string);
        if (!t->name) {
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", f->path);
            goto done;
        }
        f->n++;
        if ((rc = st_parse_entry(f, item, data_size, t)) < 0)
            goto done;
    }
    for (int i = 0; i < f->n; i++)
        f->sorted[i] = (st_sorted){f->t[i].name, i};
    qsort(f->sorted, (size_t)f->n, sizeof *f->sorted, st_cmp_sorted);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->sorted[i - 1].name, f->sorted[i].name) == 0) {
            rc = regc_error(REGC_ERR_FORMAT, "%s: duplicate tensor %s in the header", f->path,
                            f->sorted[i].name);
            goto done;
        }
    rc = st_check_layout(f, data_size);
done:
    cJSON_Delete(root);
    return rc;
}

/* The header length, the header and every entry of a file of fsize bytes,
 * read through st_pread_full (from f->fd, or from f->mem). */
static int st_load(regc_st_file *f, uint64_t fsize)
{
    const char *path = f->path;
    if (fsize < 8)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: file is %" PRIu64 " bytes, too short for a safetensors header", path,
                          fsize);
    unsigned char lenbuf[8];
    int rc = st_pread_full(f, lenbuf, 8, 0, "the header length");
    if (rc < 0)
        return rc;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | lenbuf[i];
    if (hlen > fsize - 8)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: header length %" PRIu64 " exceeds file size %" PRIu64, path, hlen,
                          fsize);
    if (hlen > ST_MAX_HEADER || hlen < 2)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: header length %" PRIu64 " is implausible (2 to %u bytes expected)",
                          path, hlen, ST_MAX_HEADER);
    char *header = malloc((size_t)hlen + 1);
    if (!header)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for a %" PRIu64 "-byte header", path,
                          hlen);
    if ((rc = st_pread_full(f, header, (size_t)hlen, 8, "the header")) == REGC_OK) {
        header[hlen] = '\0';
        f->data_start = 8 + hlen;
        rc = st_parse_header(f, header, (size_t)hlen, fsize - f->data_start);
    }
    free(header);
    return rc;
}

static regc_st_file *st_new(const char *path)
{
    regc_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
        return NULL;
    }
    f->fd = -1;
    return f;
}

int regc_st_open(const char *path, regc_st_file **out)
{
    *out = NULL;
    regc_st_file *f = st_new(path);
    if (!f)
        return REGC_ERR_MEMORY;
    /* No size cap: a shard is read by ranges, never whole. */
    uint64_t fsize;
    int rc = regc_file_open_regular(path, 0, &f->fd, &fsize);
    if (rc == REGC_OK)
        rc = st_load(f, fsize);
    if (rc < 0) {
        regc_st_close(f);
        return rc;
    }
    *out = f;
    return REGC_OK;
}

int regc_st_parse(const char *name, const void *bytes, size_t size, regc_st_file **out)
{
    *out = NULL;
    regc_st_file *f = st_new(name);
    if (!f)
        return REGC_ERR_MEMORY;
    /* a non-NULL image even when empty, so reads never reach a descriptor */
    static const unsigned char empty[1];
    f->mem = size ? bytes : empty;
    f->mem_size = size;
    int rc = st_load(f, size);
    if (rc < 0) {
        regc_st_close(f);
        return rc;
    }
    *out = f;
    return REGC_OK;
}

int regc_st_count(const regc_st_file *f) { return f->n; }

const char *regc_st_name(const regc_st_file *f, int i)
{
    return (i >= 0 && i < f->n) ? f->t[i].name : NULL;
}

int regc_st_float_dtype(const regc_st_file *f, int i)
{
    if (i < 0 || i >= f->n)
        return -1;
    const char *d = f->t[i].dtype;
    return !strcmp(d, "F32")    ? REGC_F32
           : !strcmp(d, "BF16") ? REGC_BF16
           : !strcmp(d, "F16")  ? REGC_F16
                                : -1;
}

int regc_st_find(const regc_st_file *f, const char *name)
{
    st_sorted key = {name, -1};
    const st_sorted *hit = bsearch(&key, f->sorted, (size_t)f->n, sizeof key, st_cmp_sorted);
    return hit ? hit->index : -1;
}

static float st_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    float v;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in float32 */
        v = (float)mant * 0x1p-24f;
        memcpy(&bits, &v, sizeof bits);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf, or NaN keeping its payload */
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    memcpy(&v, &bits, sizeof v);
    return v;
}

int64_t regc_st_bytes(const regc_st_file *f, int i)
{
    return i >= 0 && i < f->n ? (int64_t)(f->t[i].end - f->t[i].begin) : -1;
}

int regc_st_read_range(const regc_st_file *f, int i, int64_t first, int64_t n, float *dst)
{
    if (i < 0 || i >= f->n)
        return regc_error(REGC_ERR_ARG, "%s: no tensor with index %d", f->path, i);
    const st_tensor *t = &f->t[i];
    int is_f32 = strcmp(t->dtype, "F32") == 0, is_bf16 = strcmp(t->dtype, "BF16") == 0,
        is_f16 = strcmp(t->dtype, "F16") == 0;
    if (!is_f32 && !is_bf16 && !is_f16)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: tensor %s has dtype %s, which regc cannot read (F32, BF16, F16)",
                          f->path, t->name, t->dtype);
    const uint64_t esize = is_f32 ? 4 : 2, numel = (t->end - t->begin) / esize;
    if (first < 0 || n < 0 || (uint64_t)first > numel || (uint64_t)n > numel - (uint64_t)first)
        return regc_error(REGC_ERR_ARG,
                          "%s: tensor %s has %" PRIu64 " elements, not [%" PRId64 ", %" PRId64 ")",
                          f->path, t->name, numel, first, first + n);
    uint64_t off = f->data_start + t->begin + (uint64_t)first * esize;
    if (is_f32)
        return st_pread_full(f, dst, (size_t)n * 4, off, t->name);

    uint16_t *bounce = malloc(ST_BOUNCE_ELEMS * sizeof *bounce);
    if (!bounce)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory reading %s", f->path, t->name);
    uint64_t done = 0;
    int rc = REGC_OK;
    while (done < (uint64_t)n) {
        size_t chunk =
            (uint64_t)n - done < ST_BOUNCE_ELEMS ? (size_t)((uint64_t)n - done) : ST_BOUNCE_ELEMS;
        if ((rc = st_pread_full(f, bounce, chunk * 2, off + done * 2, t->name)) < 0)
            break;
        float *o = dst + done;
        if (is_bf16)
            for (size_t k = 0; k < chunk; k++)
                o[k] = st_bf16_to_f32(bounce[k]);
        else
            for (size_t k = 0; k < chunk; k++)
                o[k] = st_f16_to_f32(bounce[k]);
        done += chunk;
    }
    free(bounce);
    return rc;
}

int regc_st_read_i32(const regc_st_file *f, int i, int64_t n, int32_t *dst)
{
    if (i < 0 || i >= f->n)
        return regc_error(REGC_ERR_ARG, "%s: no tensor with index %d", f->path, i);
    const st_tensor *t = &f->t[i];
    const int is_i32 = strcmp(t->dtype, "I32") == 0, is_i64 = strcmp(t->dtype, "I64") == 0;
    if (!is_i32 && !is_i64)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: tensor %s has dtype %s; an integer tensor must be I32 or I64",
                          f->path, t->name, t->dtype);
    const uint64_t esize = is_i32 ? 4 : 8;
    if (n < 0 || (uint64_t)n != (t->end - t->begin) / esize)
        return regc_error(REGC_ERR_ARG, "%s: tensor %s has %" PRIu64 " elements, not %" PRId64,
                          f->path, t->name, (t->end - t->begin) / esize, n);
    const uint64_t off = f->data_start + t->begin;
    if (is_i32)
        return st_pread_full(f, dst, (size_t)n * 4, off, t->name);
    int64_t *bounce = malloc(ST_BOUNCE_ELEMS * sizeof *bounce);
    if (!bounce)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory reading %s", f->path, t->name);
    int rc = REGC_OK;
    for (int64_t done = 0; done < n && rc == REGC_OK; done += ST_BOUNCE_ELEMS) {
        int64_t chunk = n - done < ST_BOUNCE_ELEMS ? n - done : ST_BOUNCE_ELEMS;
        if ((rc = st_pread_full(f, bounce, (size_t)chunk * 8, off + (uint64_t)done * 8, t->name)) <
            0)
            break;
        for (int64_t k = 0; k < chunk && rc == REGC_OK; k++) {
            if (bounce[k] < INT32_MIN || bounce[k] > INT32_MAX)
                rc = regc_error(REGC_ERR_FORMAT,
                                "%s: tensor %s: element %" PRId64 " is %" PRId64
                                ", outside the 32-bit range regc indexes with",
                                f->path, t->name, done + k, bounce[k]);
            dst[done + k] = (int32_t)bounce[k];
        }
    }
    free(bounce);
    return rc;
}

const char *regc_st_dtype(const regc_st_file *f, int i)
{
    return i >= 0 && i < f->n ? f->t[i].dtype : NULL;
}

/* The bytes as stored, for tensors regc does not convert to fp32: a
 * bitsandbytes checkpoint's packed NF4 values and quant state (U8) are
 * assembled into regc's blob as they are. */
int regc_st_read_raw(const regc_st_file *f, int i, const char *dtype, int64_t n, void *dst)
{
    if (i < 0 || i >= f->n)
        return regc_error(REGC_ERR_ARG, "%s: no tensor with index %d", f->path, i);
    const st_tensor *t = &f->t[i];
    if (strcmp(t->dtype, dtype) != 0)
        return regc_error(REGC_ERR_FORMAT, "%s: tensor %s has dtype %s, expected %s", f->path,
                          t->name, t->dtype, dtype);
    const uint64_t esize = (uint64_t)t->esize;
    if (n < 0 || esize == 0 || (uint64_t)n != (t->end - t->begin) / esize)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: tensor %s has %" PRIu64 " elements, expected %" PRId64, f->path,
                          t->name, esize ? (t->end - t->begin) / esize : 0, n);
    return st_pread_full(f, dst, (size_t)(t->end - t->begin), f->data_start + t->begin, t->name);
}

int regc_st_check_shape(const regc_st_file *f, int i, int ndim, const int64_t *shape)
{
    if (i < 0 || i >= f->n)
        return regc_error(REGC_ERR_ARG, "%s: no tensor with index %d", f->path, i);
    const st_tensor *t = &f->t[i];
    int same = ndim == t->ndim;
    for (int d = 0; same && d < ndim; d++)
        same = shape[d] == t->shape[d];
    if (same)
        return REGC_OK;
    char want[160], have[160];
    st_format_shape(want, sizeof want, ndim, shape);
    st_format_shape(have, sizeof have, t->ndim, t->shape);
    return regc_error(REGC_ERR_SHAPE, "%s: tensor %s has shape %s, expected %s", f->path, t->name,
                      have, want);
}

int regc_st_read_f32(const regc_st_file *f, int i, int ndim, const int64_t *shape, float *dst)
{
    int rc = regc_st_check_shape(f, i, ndim, shape);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= shape[d];
    return rc ? rc : regc_st_read_range(f, i, 0, numel, dst);
}
