/* safetensors_write.c — writing .safetensors files: the header of every
 * tensor first (its length padded so the data starts 8-byte aligned, the
 * file sized to its end), then each tensor's elements in any order and
 * pieces (a ZeRO-3 rank writes its shards), converted to the stored dtype
 * through a small bounce buffer; the file appears under its name only when
 * finished (an atomic rename), or not at all. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regc_models.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors_write.c writes little-endian data in place; add byte swapping for this host"
#endif

#define ST_WRITE_BOUNCE 65536 /* elements converted at a time */

/* Round to nearest even via float arithmetic (the FP16 library's method):
 * scaling up then down makes the FPU do the rounding, subnormals included. */
static uint16_t st_f32_to_f16(float v)
{
    float base = (v < 0 ? -v : v) * 0x1p+112f * 0x1p-110f;
    uint32_t w, b;
    memcpy(&w, &v, sizeof w);
    uint32_t shl1 = w + w, sign = w & 0x80000000u, bias = shl1 & 0xff000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    uint32_t bb = (bias >> 1) + 0x07800000u;
    float fb;
    memcpy(&fb, &bb, sizeof fb);
    base = fb + base;
    memcpy(&b, &base, sizeof b);
    uint32_t nonsign = ((b >> 13) & 0x7c00u) + (b & 0x0fffu);
    return (uint16_t)((sign >> 16) | (shl1 > 0xff000000u ? 0x7e00u : nonsign));
}

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} st_text;

static void st_put(st_text *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void st_put(st_text *s, const char *fmt, ...)
{
    if (s->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf + s->len, s->cap - s->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = 1;
            return;
        }
        if ((size_t)n < s->cap - s->len) {
            s->len += (size_t)n;
            return;
        }
        size_t cap = (s->cap + (size_t)n + 1) * 2;
        char *grown = realloc(s->buf, cap);
        if (!grown) {
            s->oom = 1;
            return;
        }
        s->buf = grown;
        s->cap = cap;
    }
}

static void st_put_json_string(st_text *s, const char *str)
{
    st_put(s, "\"");
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
        if (*p == '"' || *p == '\\')
            st_put(s, "\\%c", *p);
        else if (*p < 0x20)
            st_put(s, "\\u%04x", *p);
        else
            st_put(s, "%c", *p);
    }
    st_put(s, "\"");
}

static int st_check_entries(const char *path, const regc_st_entry *e, int n, int with_data,
                            int64_t *numel)
{
    for (int i = 0; i < n; i++) {
        const char *name = e[i].name;
        if (!name || !name[0] || strcmp(name, "__metadata__") == 0)
            return regc_error(REGC_ERR_ARG, "%s: tensor %d has an invalid name \"%s\"", path, i,
                              name ? name : "(null)");
        if (e[i].dtype != REGC_F32 && e[i].dtype != REGC_BF16 && e[i].dtype != REGC_F16 &&
            e[i].dtype != REGC_I32)
            return regc_error(REGC_ERR_ARG,
                              "%s: tensor %s: fp32 data can be stored as F32, BF16 or F16 "
                              "only, int32 data as I32",
                              path, name);
        if (e[i].ndim < 0 || e[i].ndim > REGC_MAX_DIMS)
            return regc_error(REGC_ERR_ARG, "%s: tensor %s: %d dimensions", path, name, e[i].ndim);
        int64_t k = 1;
        for (int d = 0; d < e[i].ndim; d++) {
            if (e[i].shape[d] < 0 || (e[i].shape[d] > 0 && k > INT64_MAX / 8 / e[i].shape[d]))
                return regc_error(REGC_ERR_ARG, "%s: tensor %s: invalid shape", path, name);
            k *= e[i].shape[d];
        }
        if (with_data && k > 0 && !e[i].data)
            return regc_error(REGC_ERR_ARG, "%s: tensor %s has no data", path, name);
        numel[i] = k;
        for (int j = 0; j < i; j++)
            if (strcmp(e[j].name, name) == 0)
                return regc_error(REGC_ERR_ARG, "%s: duplicate tensor name %s", path, name);
    }
    return REGC_OK;
}

struct regc_st_writer {
    char *path;
    regc_atomic_file *file;
    int n;
    regc_dtype *dtype;
    int64_t *numel;
    uint64_t *data_at; /* each tensor's first byte in the file */
    char **name;       /* for errors */
};

void regc_st_writer_abandon(regc_st_writer *w)
{
    if (!w)
        return;
    regc_atomic_abandon(w->file);
    for (int i = 0; w->name && i < w->n; i++)
        free(w->name[i]);
    free(w->name), free(w->path), free(w->dtype), free(w->numel), free(w->data_at), free(w);
}

int regc_st_writer_open(const char *path, const regc_st_entry *entries, int n, int with_data,
                        regc_st_writer **out)
{
    *out = NULL;
    if (n < 0 || (n > 0 && !entries))
        return regc_error(REGC_ERR_ARG, "%s: invalid tensor list", path);
    regc_st_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->path = strdup(path);
        w->dtype = calloc((size_t)n + 1, sizeof *w->dtype);
        w->numel = calloc((size_t)n + 1, sizeof *w->numel);
        w->data_at = calloc((size_t)n + 1, sizeof *w->data_at);
        w->name = calloc((size_t)n + 1, sizeof *w->name);
    }
    if (!w || !w->path || !w->dtype || !w->numel || !w->data_at || !w->name) {
        regc_st_writer_abandon(w);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    }
    w->n = n;
    st_text h = {0};
    int rc = st_check_entries(path, entries, n, with_data, w->numel);
    for (int i = 0; i < n && rc == REGC_OK; i++)
        if (!(w->name[i] = strdup(entries[i].name)))
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    uint64_t off = 0;
    st_put(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        const regc_st_entry *e = &entries[i];
        uint64_t bytes =
            (uint64_t)w->numel[i] * (e->dtype == REGC_F32 || e->dtype == REGC_I32 ? 4u : 2u);
        w->dtype[i] = e->dtype;
        w->data_at[i] = off;
        st_put(&h, ",");
        st_put_json_string(&h, e->name);
        st_put(&h, ":{\"dtype\":\"%s\",\"shape\":[",
               e->dtype == REGC_F32    ? "F32"
               : e->dtype == REGC_BF16 ? "BF16"
               : e->dtype == REGC_I32  ? "I32"
                                       : "F16");
        for (int d = 0; d < e->ndim; d++)
            st_put(&h, "%s%" PRId64, d ? "," : "", e->shape[d]);
        st_put(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + bytes);
        off += bytes;
    }
    st_put(&h, "}");
    /* Spaces pad the header so the data section starts 8-byte aligned. */
    while (!h.oom && h.len % 8 != 0)
        st_put(&h, " ");
    if (rc == REGC_OK && h.oom)
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory building the header", path);
    unsigned char len[8];
    for (int b = 0; b < 8; b++)
        len[b] = (unsigned char)(((uint64_t)h.len >> (8 * b)) & 0xffu);
    for (int i = 0; i < n; i++)
        w->data_at[i] += 8 + h.len;
    if (rc == REGC_OK && (rc = regc_atomic_open(path, &w->file)) == REGC_OK &&
        (rc = regc_atomic_pwrite(w->file, len, 8, 0)) == REGC_OK)
        rc = regc_atomic_pwrite(w->file, h.buf, h.len, 8);
    /* the file's full length now, so that a tensor never put reads as zeros */
    if (rc == REGC_OK && off > 0)
        rc = regc_atomic_pwrite(w->file, "", 1, 8 + h.len + off - 1);
    free(h.buf);
    if (rc) {
        regc_st_writer_abandon(w);
        return rc;
    }
    *out = w;
    return REGC_OK;
}

/* Elements [first, first + n) of tensor i exist, and it holds `integer`
 * data (I32) or not. */
static int st_writer_check(const regc_st_writer *w, int i, int64_t first, int64_t n, int integer)
{
    if (i < 0 || i >= w->n)
        return regc_error(REGC_ERR_ARG, "%s: no tensor with index %d", w->path, i);
    if (first < 0 || n < 0 || first > w->numel[i] || n > w->numel[i] - first)
        return regc_error(REGC_ERR_ARG,
                          "%s: tensor %s has %" PRId64 " elements, not [%" PRId64 ", %" PRId64 ")",
                          w->path, w->name[i], w->numel[i], first, first + n);
    if (integer != (w->dtype[i] == REGC_I32))
        return regc_error(REGC_ERR_ARG, "%s: tensor %s is %s, not %s data", w->path, w->name[i],
                          integer ? "floating-point" : "I32", integer ? "int32" : "fp32");
    return REGC_OK;
}

int regc_st_writer_put_i32(regc_st_writer *w, int i, int64_t first, int64_t n, const int32_t *src)
{
    int rc = st_writer_check(w, i, first, n, 1);
    return rc ? rc
              : regc_atomic_pwrite(w->file, src, (size_t)n * 4,
                                   w->data_at[i] + (uint64_t)first * 4);
}

int regc_st_writer_put(regc_st_writer *w, int i, int64_t first, int64_t n, const float *src)
{
    int rc = st_writer_check(w, i, first, n, 0);
    if (rc)
        return rc;
    if (w->dtype[i] == REGC_F32)
        return regc_atomic_pwrite(w->file, src, (size_t)n * 4, w->data_at[i] + (uint64_t)first * 4);
    uint16_t *bounce = malloc(ST_WRITE_BOUNCE * sizeof *bounce);
    if (!bounce)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", w->path);
    for (int64_t done = 0; done < n && rc == REGC_OK; done += ST_WRITE_BOUNCE) {
        int64_t chunk = n - done < ST_WRITE_BOUNCE ? n - done : ST_WRITE_BOUNCE;
        for (int64_t j = 0; j < chunk; j++)
            bounce[j] = w->dtype[i] == REGC_BF16 ? regc_f32_to_bf16(src[done + j])
                                                 : st_f32_to_f16(src[done + j]);
        rc = regc_atomic_pwrite(w->file, bounce, (size_t)chunk * 2,
                                w->data_at[i] + (uint64_t)(first + done) * 2);
    }
    free(bounce);
    return rc;
}

int regc_st_writer_finish(regc_st_writer *w)
{
    int rc = regc_atomic_commit(w->file);
    w->file = NULL;
    regc_st_writer_abandon(w);
    return rc;
}

int regc_st_write(const char *path, const regc_st_entry *entries, int n)
{
    regc_st_writer *w;
    int rc = regc_st_writer_open(path, entries, n, 1, &w);
    for (int i = 0; i < n && rc == REGC_OK; i++)
        if ((rc = entries[i].dtype == REGC_I32
                      ? regc_st_writer_put_i32(w, i, 0, w->numel[i],
                                               (const int32_t *)(const void *)entries[i].data)
                      : regc_st_writer_put(w, i, 0, w->numel[i], entries[i].data)) != REGC_OK)
            regc_st_writer_abandon(w);
    return rc == REGC_OK ? regc_st_writer_finish(w) : rc;
}
