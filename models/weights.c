/* weights.c — a model's weights a range at a time: read from a Hugging
 * Face directory, a safetensors file or the seeded init, and written into a
 * model directory. Whole-model loading, random init and saving are the
 * special case of every range of every parameter; ZeRO-3's ranks read and
 * write only the ranges of their own shards, so no process needs room for
 * the whole model.
 *
 * Opening a source matches every parameter to a tensor by name — its own
 * name, the name without the architecture's optional prefix, and the
 * legacy spelling of each, all after an optional prefix of the file's
 * names ("exp_avg." in a checkpoint's optimizer file) — and checks its
 * shape, so a bad file fails at open, naming the file and the tensor,
 * before any rank has read a byte of data.
 *
 * A graph model's constants (rotary tables, positions, buckets) are
 * tensors of its own file too: a source without a prefix binds them after
 * the parameters, by name, and regc_model_read_constants reads them whole;
 * a checkpoint's moments (a prefixed source) hold parameters only. A graph
 * exported beside the user's own checkpoint keeps its constants in a file
 * of their own (consts_file): its sources bind the parameters alone, and
 * the constants a checkpoint saved beside them are left unread.
 *
 * A checkpoint saved from a model in 4 bits (config.json's
 * quantization_config) holds each quantised weight as bitsandbytes' packed
 * bytes and quant state (nf4_checkpoint.c): such a parameter binds those
 * tensors, checked at open, and reads as its NF4 blob, or dequantised.
 *
 * A LoRA model's adapters are not in its base's files: a source of the
 * base reads them from a source of their own, the PEFT adapter directory
 * the model names (adapter_model.safetensors, names after
 * "base_model.model.") or the seeded draw. Saved, a LoRA model is its
 * adapter alone, as PEFT writes it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "model_internal.h"

/* ---------------------------------------------------------------- names */

/* The names a parameter may have in a file, in the order tried: its own,
 * without the optional prefix, and the architecture's legacy spelling of
 * each; every one after the file's prefix. */
typedef struct {
    char name[4][600];
    int n;
} weight_names;

static void weight_names_of(const regc_model *m, const char *prefix, const char *name,
                            weight_names *out)
{
    const char *own[4];
    char legacy[2][512];
    int n = 0;
    own[n++] = name;
    const char *pre = m->arch->optional_prefix;
    size_t k = pre ? strlen(pre) : 0;
    if (k && strncmp(name, pre, k) == 0)
        own[n++] = name + k;
    for (int i = 0, base = n; m->arch->legacy_name && i < base; i++)
        if (m->arch->legacy_name(own[i], legacy[i], sizeof legacy[i]))
            own[n++] = legacy[i];
    for (int i = 0; i < n; i++)
        snprintf(out->name[i], sizeof out->name[i], "%s%s", prefix, own[i]);
    out->n = n;
}

/* The tensors a source with this prefix binds: every parameter, then
 * (no prefix: the model's own file) every constant, unless the constants
 * have a file of their own. */
static int bound_count(const regc_model *m, const char *prefix)
{
    return m->n_params + (prefix[0] || m->consts_file ? 0 : m->n_consts);
}

/* Is `name` one of the model's constants, which a source may hold beside
 * the parameters when they are read from their own file (a checkpoint
 * saves them)? Such a name is left unread in any source, prefixed (a
 * checkpoint's moments, which never name a constant) or not. */
static int is_unbound_constant(const regc_model *m, const char *name)
{
    for (int k = 0; m->consts_file && k < m->n_consts; k++)
        if (!strcmp(m->consts[k].name, name))
            return 1;
    return 0;
}

static const char *bound_name(const regc_model *m, int i)
{
    return i < m->n_params ? m->params[i].name : m->consts[i - m->n_params].name;
}

static const char *bound_kind(const regc_model *m, int i)
{
    return i < m->n_params ? "tensor" : "constant";
}

int regc_model_inside_name(const char *name)
{
    if (!name[0] || name[0] == '/')
        return 0;
    for (const char *p = name; *p;) {
        size_t seg = strcspn(p, "/");
        if (seg == 2 && p[0] == '.' && p[1] == '.')
            return 0;
        p += seg;
        if (*p == '/')
            p++;
    }
    return 1;
}

/* ---------------------------------------------------------------- reading */

/* What a source binds: every parameter, or of a LoRA model its base or its
 * adapters alone. */
typedef enum { PART_ALL, PART_BASE, PART_ADAPTER } weights_part;

static int is_adapter(const regc_model *m, int i)
{
    return m->lora && i >= m->lora->n_base && i < m->n_params;
}

struct regc_weights {
    const regc_model *m;
    weights_part part;
    regc_weights *adapter; /* PART_BASE: where the adapters come from */
    int seeded;
    uint64_t seed;
    int n_bound; /* bound_count: parameters, then constants */
    int n_files;
    regc_st_file **file; /* [n_bound]: at most one file per tensor */
    int *file_of;        /* [n_bound] */
    int *tensor_of;      /* [n_bound] the tensor's index in its file */
    /* [n_bound] for a checkpoint in 4 bits (else NULL): parameter i's NF4
     * tensors in its file, weight -1 where it is not quantised */
    regc_nf4_tensors *nf4;
    int64_t bytes_read;
};

void regc_weights_close(regc_weights *w)
{
    if (!w)
        return;
    for (int f = 0; f < w->n_files; f++)
        regc_st_close(w->file[f]);
    regc_weights_close(w->adapter);
    free(w->file), free(w->file_of), free(w->tensor_of), free(w->nf4), free(w);
}

static int weights_new(const regc_model *m, const char *prefix, regc_weights **out)
{
    *out = NULL;
    size_t n = (size_t)bound_count(m, prefix) + 1;
    regc_weights *w = calloc(1, sizeof *w);
    if (w) {
        w->m = m;
        w->n_bound = bound_count(m, prefix);
        w->file = calloc(n, sizeof *w->file);
        w->file_of = calloc(n, sizeof *w->file_of);
        w->tensor_of = calloc(n, sizeof *w->tensor_of);
        if (m->checkpoint_nf4 && !prefix[0] && (w->nf4 = calloc(n, sizeof *w->nf4)))
            for (size_t i = 0; i < n; i++)
                w->nf4[i].weight = -1;
    }
    if (!w || !w->file || !w->file_of || !w->tensor_of ||
        (m->checkpoint_nf4 && !prefix[0] && !w->nf4)) {
        regc_weights_close(w);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    }
    *out = w;
    return REGC_OK;
}

/* Open path as file number w->n_files (or find it open already). */
static int weights_file(regc_weights *w, const char *path, const char **paths, int *f)
{
    for (*f = 0; *f < w->n_files; (*f)++)
        if (!strcmp(paths[*f], path))
            return REGC_OK;
    int rc = regc_st_open(path, &w->file[*f]);
    if (rc == REGC_OK)
        paths[w->n_files++] = path;
    return rc;
}

/* Does w leave bound tensor i to another source? */
static int skips(const regc_weights *w, int i)
{
    return w->part != PART_ALL && i < w->m->n_params &&
           is_adapter(w->m, i) != (w->part == PART_ADAPTER);
}

/* Bound tensor i (a parameter, or a constant past them) is tensor `name`
 * of file f: check its shape. */
static int weights_bind(regc_weights *w, int i, int f, const char *path, const char *prefix)
{
    const regc_model *m = w->m;
    if (skips(w, i)) {
        w->file_of[i] = -1;
        return REGC_OK;
    }
    weight_names c;
    weight_names_of(m, prefix, bound_name(m, i), &c);
    int t = -1;
    for (int j = 0; j < c.n && t < 0; j++)
        t = regc_st_find(w->file[f], c.name[j]);
    if (t < 0)
        return regc_error(REGC_ERR_FORMAT, "%s: missing %s %s%s", path, bound_kind(m, i), prefix,
                          bound_name(m, i));
    w->file_of[i] = f, w->tensor_of[i] = t;
    /* a weight bitsandbytes quantised: its packed bytes and quant state */
    if (w->nf4 && i < m->n_params && !strcmp(regc_st_dtype(w->file[f], t), "U8")) {
        const int bf16 =
            m->lora ? m->lora->cfg.compute_bf16 : m->checkpoint_nf4 == REGC_FROZEN_NF4_BF16;
        return regc_nf4_bind(w->file[f], path, t, &m->params[i], bf16, &w->nf4[i]);
    }
    if (i >= m->n_params) {
        const regc_model_const *k = &m->consts[i - m->n_params];
        return regc_st_check_shape(w->file[f], t, k->ndim, k->shape);
    }
    return regc_st_check_shape(w->file[f], t, m->params[i].ndim, m->params[i].shape);
}

/* Is `name` one of the tensors the architecture says a checkpoint may
 * hold unread (regc_arch's ignored_tensors)? */
static int weights_ignored(const regc_arch *arch, const char *name)
{
    const size_t n = strlen(name);
    for (const char *const *p = arch->ignored_tensors; p && *p; p++) {
        const char *pattern = *p;
        if (pattern[0] != '*' && !strcmp(name, pattern))
            return 1;
        const size_t k = strlen(pattern + 1);
        if (pattern[0] == '*' && n >= k && !strcmp(name + n - k, pattern + 1))
            return 1;
    }
    return 0;
}

/* Every tensor of file f under the prefix is a parameter bound to it, or
 * one its architecture ignores. */
static int weights_check_unexpected(const regc_weights *w, int f, const char *path,
                                    const char *prefix)
{
    const regc_st_file *st = w->file[f];
    int n = regc_st_count(st);
    char *claimed = calloc((size_t)n + 1, 1);
    if (!claimed)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    for (int i = 0; i < w->n_bound; i++)
        if (w->file_of[i] == f) {
            claimed[w->tensor_of[i]] = 1;
            for (int k = 0; w->nf4 && w->nf4[i].weight >= 0 && k < REGC_NF4_EXTRA; k++)
                claimed[w->nf4[i].extra[k]] = 1;
        }
    size_t k = strlen(prefix);
    int rc = REGC_OK;
    for (int t = 0; t < n && rc == REGC_OK; t++) {
        const char *name = regc_st_name(st, t);
        if (!claimed[t] && !strncmp(name, prefix, k) && !weights_ignored(w->m->arch, name + k) &&
            !is_unbound_constant(w->m, name + k))
            rc = regc_error(REGC_ERR_FORMAT,
                            "%s: unexpected tensor %s: %s has no such parameter (does "
                            "config.json match the weights?)",
                            path, name, w->m->source);
    }
    free(claimed);
    return rc;
}

/* Every parameter from the one file at path. */
static int weights_one_file(regc_weights *w, const char *path, const char *prefix)
{
    const char *paths[1] = {NULL};
    int f, rc = weights_file(w, path, paths, &f);
    for (int i = 0; i < w->n_bound && rc == REGC_OK; i++)
        rc = weights_bind(w, i, f, path, prefix);
    if (rc == REGC_OK)
        rc = weights_check_unexpected(w, f, path, prefix);
    return rc;
}

int regc_weights_parse_index(const regc_model *m, const char *text, size_t len, const char *index,
                             const char *prefix, char **files)
{
    const int n = bound_count(m, prefix);
    for (int i = 0; i < n; i++)
        files[i] = NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root)
        return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON", index);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = REGC_OK;
    if (!cJSON_IsObject(map))
        rc = regc_error(REGC_ERR_FORMAT, "%s: missing or invalid \"weight_map\"", index);
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        if (is_adapter(m, i)) /* a base's index never names them */
            continue;
        weight_names c;
        weight_names_of(m, prefix, bound_name(m, i), &c);
        const cJSON *e = NULL;
        for (int j = 0; j < c.n && !e; j++)
            e = cJSON_GetObjectItemCaseSensitive(map, c.name[j]);
        if (!e)
            rc = regc_error(REGC_ERR_FORMAT, "%s: missing %s %s%s", index, bound_kind(m, i), prefix,
                            bound_name(m, i));
        else if (!cJSON_IsString(e) || !regc_model_inside_name(e->valuestring))
            rc = regc_error(REGC_ERR_FORMAT,
                            "%s: weight_map entry %s must name a file inside the directory", index,
                            e->string);
        else if (!(files[i] = strdup(e->valuestring)))
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", index);
    }
    /* an entry no parameter reads is refused as the files' tensors are, so
     * that the index alone already shows a mismatch */
    size_t k = strlen(prefix);
    const cJSON *e;
    if (rc == REGC_OK)
        cJSON_ArrayForEach (e, map) {
            if (strncmp(e->string, prefix, k) || weights_ignored(m->arch, e->string + k) ||
                is_unbound_constant(m, e->string + k))
                continue;
            int used = 0;
            /* a 4-bit weight's quant state goes with the weight */
            const size_t base =
                m->checkpoint_nf4 && !prefix[0] ? regc_nf4_state_base(e->string) : 0;
            for (int i = 0; i < n && !used; i++) {
                weight_names c;
                weight_names_of(m, prefix, bound_name(m, i), &c);
                for (int j = 0; j < c.n && !used; j++)
                    used = !strcmp(c.name[j], e->string) || (base && strlen(c.name[j]) == base &&
                                                             !strncmp(c.name[j], e->string, base));
            }
            if (!used) {
                rc = regc_error(REGC_ERR_FORMAT,
                                "%s: unexpected tensor %s: %s has no such parameter (does "
                                "config.json match the weights?)",
                                index, e->string, m->source);
                break;
            }
        }
    cJSON_Delete(root);
    if (rc)
        for (int i = 0; i < n; i++)
            free(files[i]), files[i] = NULL;
    return rc;
}

/* Every parameter from the file an index's weight_map names for it. */
static int weights_indexed(regc_weights *w, const char *dir, const char *index, const char *prefix)
{
    char *text = NULL;
    size_t len = 0;
    int rc = regc_file_read_all(index, &text, &len);
    if (rc < 0)
        return rc;
    const regc_model *m = w->m;
    const int n = w->n_bound;
    char **files = calloc((size_t)n + 1, sizeof *files);
    char(*path)[4096] = calloc((size_t)n + 1, sizeof *path);
    const char **paths = calloc((size_t)n + 1, sizeof *paths);
    if (!files || !path || !paths)
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", index);
    else
        rc = regc_weights_parse_index(m, text, len, index, prefix, files);
    free(text);
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        if (!files[i]) {
            w->file_of[i] = -1;
            continue;
        }
        if ((rc = regc_path_join(path[i], sizeof path[i], dir, files[i])) == REGC_OK) {
            int f;
            if ((rc = weights_file(w, path[i], paths, &f)) == REGC_OK)
                rc = weights_bind(w, i, f, path[i], prefix);
        }
    }
    for (int f = 0; f < w->n_files && rc == REGC_OK; f++)
        rc = weights_check_unexpected(w, f, paths[f], prefix);
    for (int i = 0; files && i < n; i++)
        free(files[i]);
    free(files), free(path), free(paths);
    return rc;
}

/* A LoRA model's adapters from its PEFT adapter directory. */
static int weights_adapter(const regc_model *m, const char *dir, regc_weights **out)
{
    char path[4096];
    int rc = regc_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    if (rc == REGC_OK && (rc = weights_new(m, REGC_PEFT_PREFIX, out)) == REGC_OK) {
        (*out)->part = PART_ADAPTER;
        if ((rc = weights_one_file(*out, path, REGC_PEFT_PREFIX))) {
            regc_weights_close(*out);
            *out = NULL;
        }
    }
    return rc;
}

int regc_weights_open(const regc_model *m, const char *path, const char *prefix, regc_weights **out)
{
    regc_weights *w = NULL;
    int rc = weights_new(m, prefix, &w);
    *out = NULL;
    if (rc)
        return rc;
    if (m->lora && prefix[0]) /* a checkpoint's moments: the adapters' alone */
        w->part = PART_ADAPTER;
    if (m->lora && !prefix[0]) { /* a base: the adapters from elsewhere */
        w->part = PART_BASE;
        if (m->lora->adapter)
            rc = weights_adapter(m, m->lora->adapter, &w->adapter);
        else if ((rc = weights_new(m, "", &w->adapter)) == REGC_OK)
            w->adapter->seeded = 1, w->adapter->seed = m->lora->cfg.seed;
        if (rc) {
            regc_weights_close(w);
            return rc;
        }
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* HF's loader prefers the single file when both exist; so do we, so
         * that a directory re-saved by regc never reads a stale index */
        char single[4096], index[4096];
        if ((rc = regc_path_join(single, sizeof single, path, "model.safetensors")) == REGC_OK &&
            (rc = regc_path_join(index, sizeof index, path, "model.safetensors.index.json")) ==
                REGC_OK) {
            if (stat(single, &sb) == 0)
                rc = weights_one_file(w, single, prefix);
            else if (stat(index, &sb) == 0)
                rc = weights_indexed(w, path, index, prefix);
            else
                rc = regc_error(REGC_ERR_IO,
                                "%s: no model.safetensors or model.safetensors.index.json", path);
        }
    } else {
        rc = weights_one_file(w, path, prefix);
    }
    if (rc) {
        regc_weights_close(w);
        return rc;
    }
    *out = w;
    return REGC_OK;
}

int regc_weights_seeded(const regc_model *m, uint64_t seed, regc_weights **out)
{
    int rc = weights_new(m, "", out);
    if (rc == REGC_OK)
        (*out)->seeded = 1, (*out)->seed = seed;
    if (rc == REGC_OK && m->lora) { /* a drawn base; the adapters given, or drawn too */
        (*out)->part = PART_BASE;
        if (m->lora->adapter)
            rc = weights_adapter(m, m->lora->adapter, &(*out)->adapter);
        else if ((rc = weights_new(m, "", &(*out)->adapter)) == REGC_OK)
            (*out)->adapter->seeded = 1, (*out)->adapter->seed = m->lora->cfg.seed;
        if (rc) {
            regc_weights_close(*out);
            *out = NULL;
        }
    }
    return rc;
}

regc_dtype regc_weights_dtype(const regc_weights *w, int i)
{
    if (w->adapter && is_adapter(w->m, i))
        return regc_weights_dtype(w->adapter, i);
    if (w->seeded || i < 0 || i >= w->n_bound || w->file_of[i] < 0)
        return REGC_F32;
    const int d = regc_st_float_dtype(w->file[w->file_of[i]], w->tensor_of[i]);
    return d < 0 ? REGC_F32 : (regc_dtype)d;
}

int regc_weights_use_adapter(regc_weights *w, const char *dir)
{
    if (w->part != PART_BASE)
        return regc_error(REGC_ERR_ARG, "%s: not the base of a LoRA model", w->m->source);
    regc_weights *a = NULL;
    int rc = weights_adapter(w->m, dir, &a);
    if (rc == REGC_OK) {
        regc_weights_close(w->adapter);
        w->adapter = a;
    }
    return rc;
}

int regc_weights_read(regc_weights *w, int i, int64_t first, int64_t n, float *dst)
{
    const regc_model *m = w->m;
    if (i < 0 || i >= m->n_params)
        return regc_error(REGC_ERR_ARG, "%s: no parameter %d", m->source, i);
    const regc_model_param *p = &m->params[i];
    if (first < 0 || n < 0 || first > p->numel || n > p->numel - first)
        return regc_error(REGC_ERR_ARG, "%s: parameter %s has %lld elements, not [%lld, %lld)",
                          m->source, p->name, (long long)p->numel, (long long)first,
                          (long long)(first + n));
    if (w->adapter && is_adapter(m, i))
        return regc_weights_read(w->adapter, i, first, n, dst);
    if (w->seeded) { /* each parameter its own stream, each element its own draw */
        regc_rng_fill_uniform_range(dst, (size_t)first, (size_t)n,
                                    regc_rng_substream(w->seed, (uint64_t)i), p->init_center,
                                    p->init_halfwidth);
        return REGC_OK;
    }
    if (regc_weights_is_nf4(
            w, i)) { /* the blob whole (its parts are tensors apart), the range dequantised */
        uint8_t *blob = malloc((size_t)regc_frozen_kind_bytes(REGC_FROZEN_NF4, p->numel));
        int rc = blob ? regc_weights_read_nf4(w, i, blob)
                      : regc_error(REGC_ERR_MEMORY, "%s: out of memory dequantising %s", m->source,
                                   p->name);
        if (rc == REGC_OK)
            regc_nf4_dequantize_range(blob, p->numel, first, n, dst);
        free(blob);
        return rc;
    }
    const regc_st_file *f = w->file[w->file_of[i]];
    int rc = regc_st_read_range(f, w->tensor_of[i], first, n, dst);
    if (rc == REGC_OK && p->numel > 0)
        w->bytes_read += n * (regc_st_bytes(f, w->tensor_of[i]) / p->numel);
    return rc;
}

int regc_weights_is_nf4(const regc_weights *w, int i)
{
    if (w->adapter && is_adapter(w->m, i))
        return 0;
    return w->nf4 && i >= 0 && i < w->m->n_params && w->file_of[i] >= 0 && w->nf4[i].weight >= 0;
}

int regc_weights_read_nf4(regc_weights *w, int i, uint8_t *blob)
{
    if (!regc_weights_is_nf4(w, i))
        return regc_error(REGC_ERR_ARG, "%s: parameter %d is not held in NF4 at its source",
                          w->m->source, i);
    const int64_t n = w->m->params[i].numel;
    int rc = regc_nf4_read_blob(w->file[w->file_of[i]], &w->nf4[i], n, blob);
    if (rc == REGC_OK)
        w->bytes_read += regc_frozen_kind_bytes(REGC_FROZEN_NF4, n);
    return rc;
}

int64_t regc_weights_bytes_read(const regc_weights *w)
{
    return w ? w->bytes_read + regc_weights_bytes_read(w->adapter) : 0;
}

int regc_model_read_weights(regc_model *m, regc_weights *w)
{
    int had = m->weights != NULL;
    int rc = regc_model_alloc_weights(m);
    for (int i = 0; i < m->n_params && rc == REGC_OK; i++)
        rc = regc_weights_read(w, i, 0, m->params[i].numel, m->weights + m->params[i].offset);
    if (rc && !had) {
        free(m->weights);
        m->weights = NULL;
    }
    return rc;
}

/* Constant c from tensor t of file f (its shape checked), into c->data;
 * `file` names f in messages. */
static int read_one_constant(regc_model_const *c, const regc_st_file *f, int t, const char *file)
{
    int rc = regc_st_check_shape(f, t, c->ndim, c->shape);
    void *data = rc ? NULL : malloc((size_t)c->numel * 4 + 1);
    if (rc == REGC_OK && !data)
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory for constant %s", file, c->name);
    if (rc == REGC_OK)
        rc = c->dtype == REGC_I32 ? regc_st_read_i32(f, t, c->numel, data)
                                  : regc_st_read_range(f, t, 0, c->numel, data);
    if (rc) {
        free(data);
        return rc;
    }
    free(c->data);
    c->data = data;
    return REGC_OK;
}

/* The constants from the model's constants file, each by name. */
static int read_constants_file(regc_model *m)
{
    regc_st_file *f = NULL;
    int rc = regc_st_open(m->consts_file, &f);
    for (int k = 0; k < m->n_consts && rc == REGC_OK; k++) {
        const int t = regc_st_find(f, m->consts[k].name);
        rc = t < 0 ? regc_error(REGC_ERR_FORMAT, "%s: missing constant %s", m->consts_file,
                                m->consts[k].name)
                   : read_one_constant(&m->consts[k], f, t, m->consts_file);
    }
    regc_st_close(f);
    return rc;
}

int regc_model_read_constants(regc_model *m, regc_weights *w)
{
    if (m->consts_file) {
        int rc = read_constants_file(m);
        return rc ? rc : m->arch->check_constants ? m->arch->check_constants(m) : REGC_OK;
    }
    for (int k = 0; k < m->n_consts; k++) {
        regc_model_const *c = &m->consts[k];
        const int i = m->n_params + k;
        if (w->m != m || w->seeded || i >= w->n_bound)
            return regc_error(REGC_ERR_ARG,
                              "%s: constant %s has no values: a graph with constants trains "
                              "from --weights, a file that holds them (dump-graph --save "
                              "writes one)",
                              m->source, c->name);
        int rc = read_one_constant(c, w->file[w->file_of[i]], w->tensor_of[i], m->source);
        if (rc)
            return rc;
    }
    return m->n_consts && m->arch->check_constants ? m->arch->check_constants(m) : REGC_OK;
}

/* ---------------------------------------------------------------- writing */

struct regc_model_writer {
    const regc_model *m;
    char *dir;
    regc_st_writer *st;
    int first; /* the first parameter written: a LoRA model's first adapter */
};

void regc_model_writer_abandon(regc_model_writer *w)
{
    if (!w)
        return;
    regc_st_writer_abandon(w->st);
    free(w->dir), free(w);
}

int regc_model_writer_open(const regc_model *m, const char *dir, regc_model_writer **out)
{
    return regc_model_writer_open_as(m, dir, NULL, out);
}

int regc_model_writer_open_as(const regc_model *m, const char *dir, const regc_dtype *dtype,
                              regc_model_writer **out)
{
    *out = NULL;
    int rc = regc_make_dirs(dir);
    if (rc < 0)
        return rc;
    regc_model_writer *w = calloc(1, sizeof *w);
    /* a LoRA model: the adapters alone (a graph model's constants stay in
     * its base's file) */
    const int first = m->lora ? m->lora->n_base : 0, n_consts = m->lora ? 0 : m->n_consts;
    const int n = m->n_params - first + n_consts;
    regc_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    char(*peft)[600] = m->lora ? calloc((size_t)n + 1, sizeof *peft) : NULL;
    char path[4096];
    if (!w || !e || (m->lora && !peft) || !(w->dir = strdup(dir))) {
        free(e), free(peft);
        regc_model_writer_abandon(w);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", dir);
    }
    w->m = m;
    w->first = first;
    for (int i = 0; i < m->n_params - first; i++) {
        const regc_model_param *p = &m->params[first + i];
        e[i].name = p->name;
        if (peft) { /* the adapter alone, as PEFT names it */
            snprintf(peft[i], sizeof peft[i], "%s%s", REGC_PEFT_PREFIX, p->name);
            e[i].name = peft[i];
        }
        e[i].dtype = dtype ? dtype[first + i] : REGC_F32;
        e[i].ndim = p->ndim;
        memcpy(e[i].shape, p->shape, sizeof p->shape);
    }
    /* the constants after the parameters, written now: they never change */
    for (int k = 0; k < n_consts; k++) {
        const regc_model_const *c = &m->consts[k];
        regc_st_entry *x = &e[m->n_params + k];
        x->name = c->name;
        x->dtype = c->dtype;
        x->ndim = c->ndim;
        memcpy(x->shape, c->shape, sizeof c->shape);
        if (!c->data && rc == REGC_OK)
            rc = regc_error(REGC_ERR_ARG, "%s: constant %s has no values to save", m->source,
                            c->name);
    }
    if (rc == REGC_OK && (rc = regc_path_join(path, sizeof path, dir,
                                              m->lora ? "adapter_model.safetensors"
                                                      : "model.safetensors")) == REGC_OK)
        rc = regc_st_writer_open(path, e, n, 0, &w->st);
    for (int k = 0; k < n_consts && rc == REGC_OK; k++) {
        const regc_model_const *c = &m->consts[k];
        const int i = m->n_params + k;
        rc = c->dtype == REGC_I32 ? regc_st_writer_put_i32(w->st, i, 0, c->numel, c->data)
                                  : regc_st_writer_put(w->st, i, 0, c->numel, c->data);
    }
    free(e), free(peft);
    if (rc) {
        regc_model_writer_abandon(w);
        return rc;
    }
    *out = w;
    return REGC_OK;
}

int regc_model_writer_put(regc_model_writer *w, int i, int64_t first, int64_t n, const float *src)
{
    if (i < w->first)
        return regc_error(REGC_ERR_ARG, "%s: parameter %s is frozen: the adapter is saved alone",
                          w->dir, w->m->params[i].name);
    return regc_st_writer_put(w->st, i - w->first, first, n, src);
}

int regc_model_writer_finish(regc_model_writer *w)
{
    /* Weights first: a config.json that names weights not yet written would
     * make the directory look complete after a crash. */
    int rc = regc_st_writer_finish(w->st);
    w->st = NULL;
    if (rc == REGC_OK)
        rc =
            w->m->lora ? regc_lora_save_config(w->m, w->dir) : regc_model_save_config(w->m, w->dir);
    regc_model_writer_abandon(w);
    return rc;
}
