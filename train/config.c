/* config.c — the training config file: {"compile": {...}, "train": {...}}.
 *
 * The file is checked whole when loaded, so a typo fails before any work
 * starts rather than being silently ignored: every message names the file
 * and the full key path ("cfg.json: train.batch: ...") and says what was
 * expected. A loaded config remembers which keys the file set, so applying
 * it over defaults (or under command-line flags) changes only those. */
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "regc_train.h"
#include "regc_common.h"

struct regc_config {
    /* compile: -1 / NULL where the file leaves the key unset */
    int regional, inline_back, level;
    char *backend, *dump_dir;
    int has_cache_dir; /* cache_dir given: a directory, or null for no cache */
    char *cache_dir;
    int64_t cache_max_mb; /* -1: unset */
    /* train */
    char *model, *weights, *data, *save;
    int64_t steps, batch, seq, threads; /* -1: unset */
    int has_seed, has_lr, has_weight_decay;
    uint64_t seed;
    double lr, weight_decay;
    int json; /* -1: unset */
};

/* Seeds go through a double in cJSON: above 2^53 - 1 two different seeds
 * written in the file could read back as the same number. */
#define SEED_MAX ((double)((INT64_C(1) << 53) - 1))

typedef struct {
    const char *file;
    regc_config *c;
} load_ctx;

/* Text from the file (key names, string values) put into a message: one
 * line, bounded, so a hostile file cannot break the one-line contract. */
static void printable(char *buf, size_t cap, const char *s)
{
    size_t n = 0, max = cap > 4 ? cap - 4 : 0;
    for (; *s && n < max; s++)
        buf[n++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    if (*s && cap > 4)
        memcpy(buf + n, "...", 3), n += 3;
    buf[n] = '\0';
}

/* The shortest decimal that reads back as v, as the user likely wrote it. */
static void number_text(char *buf, size_t cap, double v)
{
    if (v == floor(v) && fabs(v) < 1e17) { /* a count: all its digits, no exponent */
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* What a JSON value is, for "got ...". */
static void value_text(char *buf, size_t cap, const cJSON *it)
{
    if (cJSON_IsString(it)) {
        char s[64];
        printable(s, sizeof s, it->valuestring);
        snprintf(buf, cap, "\"%s\"", s);
    } else if (cJSON_IsNumber(it)) {
        number_text(buf, cap, it->valuedouble);
    } else if (cJSON_IsBool(it)) {
        snprintf(buf, cap, "%s", cJSON_IsTrue(it) ? "true" : "false");
    } else if (cJSON_IsNull(it)) {
        snprintf(buf, cap, "null");
    } else if (cJSON_IsArray(it)) {
        snprintf(buf, cap, "an array");
    } else if (cJSON_IsObject(it)) {
        snprintf(buf, cap, "an object");
    } else {
        snprintf(buf, cap, "an invalid value");
    }
}

static int expected(const load_ctx *x, const char *key, const cJSON *it, const char *what)
{
    char got[96];
    value_text(got, sizeof got, it);
    return regc_error(REGC_ERR_FORMAT, "%s: %s: expected %s, got %s", x->file, key, what, got);
}

static int read_bool(const load_ctx *x, const char *key, const cJSON *it, int *out)
{
    if (!cJSON_IsBool(it))
        return expected(x, key, it, "true or false");
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return REGC_OK;
}

/* null means unset; an empty string is never a meaningful path or name. */
static int read_string(const load_ctx *x, const char *key, const cJSON *it, char **out)
{
    if (cJSON_IsNull(it)) {
        free(*out);
        *out = NULL;
        return REGC_OK;
    }
    if (!cJSON_IsString(it) || !it->valuestring[0])
        return expected(x, key, it, "a non-empty string or null");
    char *s = strdup(it->valuestring);
    if (!s)
        return regc_error(REGC_ERR_MEMORY, "%s: %s: out of memory", x->file, key);
    free(*out);
    *out = s;
    return REGC_OK;
}

/* A whole number in [lo, hi]; `what` describes the range for the message. */
static int read_int(const load_ctx *x, const char *key, const cJSON *it, int64_t lo, int64_t hi,
                    const char *what, int64_t *out)
{
    if (!cJSON_IsNumber(it))
        return expected(x, key, it, what);
    double d = it->valuedouble;
    /* The comparison against hi is done in double before converting, so a
     * huge value never reaches an out-of-range int64 conversion. */
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return expected(x, key, it, what);
    *out = (int64_t)d;
    return REGC_OK;
}

static int read_seed(const load_ctx *x, const char *key, const cJSON *it, uint64_t *out)
{
    const char *what = "an integer from 0 to 2^53 - 1 (9007199254740991)";
    if (!cJSON_IsNumber(it))
        return expected(x, key, it, what);
    double d = it->valuedouble;
    if (!(d >= 0.0 && d <= SEED_MAX) || d != floor(d))
        return expected(x, key, it, what);
    *out = (uint64_t)d;
    return REGC_OK;
}

/* Finite and representable as a float (the optimizer's precision): > 0
 * when `positive`, else >= 0. */
static int read_float(const load_ctx *x, const char *key, const cJSON *it, int positive,
                      double *out)
{
    const char *what = positive ? "a finite number > 0" : "a finite number >= 0";
    if (!cJSON_IsNumber(it))
        return expected(x, key, it, what);
    double d = it->valuedouble;
    if (!isfinite(d) || d > FLT_MAX || (positive ? !(d > 0.0) : !(d >= 0.0)))
        return expected(x, key, it, what);
    if (positive && (float)d == 0.0f)
        return expected(x, key, it, "a number > 0 that a float can hold (>= 1e-45)");
    *out = d;
    return REGC_OK;
}

/* Full key path "section.name", printable, for messages. */
static void key_path(char *buf, size_t cap, const char *section, const cJSON *it)
{
    char name[96];
    printable(name, sizeof name, it->string ? it->string : "");
    if (section)
        snprintf(buf, cap, "%s.%s", section, name);
    else
        snprintf(buf, cap, "%s", name);
}

/* cJSON keeps both copies of a repeated key; which one a reader sees is an
 * accident of lookup order, so a repeat is refused. */
static int check_duplicate(const load_ctx *x, const cJSON *obj, const cJSON *it, const char *key)
{
    for (const cJSON *p = obj->child; p && p != it; p = p->next)
        if (p->string && it->string && !strcmp(p->string, it->string))
            return regc_error(REGC_ERR_FORMAT, "%s: %s: duplicate key", x->file, key);
    return REGC_OK;
}

static int read_compile(const load_ctx *x, const cJSON *obj)
{
    regc_config *c = x->c;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        char key[128];
        key_path(key, sizeof key, "compile", it);
        int rc = check_duplicate(x, obj, it, key);
        const char *k = it->string ? it->string : "";
        if (rc)
            return rc;
        if (!strcmp(k, "use_regional_compilation")) {
            rc = read_bool(x, key, it, &c->regional);
        } else if (!strcmp(k, "inline_back")) {
            rc = read_bool(x, key, it, &c->inline_back);
        } else if (!strcmp(k, "level")) {
            int l = cJSON_IsString(it) ? regc_level_from_name(it->valuestring) : -1;
            if (l < 0 && !cJSON_IsNull(it)) /* null: unset, like every string key */
                return expected(x, key, it, "\"O0\", \"O1\" or \"O2\"");
            c->level = l;
        } else if (!strcmp(k, "backend")) {
            if (!cJSON_IsNull(it) && !(cJSON_IsString(it) && (!strcmp(it->valuestring, "cpu") ||
                                                              !strcmp(it->valuestring, "cuda"))))
                return expected(x, key, it, "\"cpu\", \"cuda\" or null");
            rc = read_string(x, key, it, &c->backend);
        } else if (!strcmp(k, "dump_graphs")) {
            rc = read_string(x, key, it, &c->dump_dir);
        } else if (!strcmp(k, "cache_dir")) {
            c->has_cache_dir = 1;
            rc = read_string(x, key, it, &c->cache_dir);
        } else if (!strcmp(k, "cache_max_mb")) {
            rc = read_int(x, key, it, 1, INT64_C(1) << 40, "an integer >= 1 (megabytes)",
                          &c->cache_max_mb);
        } else {
            return regc_error(REGC_ERR_FORMAT, "%s: %s: unknown key", x->file, key);
        }
        if (rc)
            return rc;
    }
    return REGC_OK;
}

static int read_train(const load_ctx *x, const cJSON *obj)
{
    regc_config *c = x->c;
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        char key[128];
        key_path(key, sizeof key, "train", it);
        int rc = check_duplicate(x, obj, it, key);
        const char *k = it->string ? it->string : "";
        if (rc)
            return rc;
        /* The same ranges as the `regc train` flags. */
        if (!strcmp(k, "model"))
            rc = read_string(x, key, it, &c->model);
        else if (!strcmp(k, "weights"))
            rc = read_string(x, key, it, &c->weights);
        else if (!strcmp(k, "data"))
            rc = read_string(x, key, it, &c->data);
        else if (!strcmp(k, "save"))
            rc = read_string(x, key, it, &c->save);
        else if (!strcmp(k, "steps"))
            rc = read_int(x, key, it, 1, INT_MAX, "an integer >= 1", &c->steps);
        else if (!strcmp(k, "batch"))
            rc = read_int(x, key, it, 1, INT32_MAX, "an integer >= 1", &c->batch);
        else if (!strcmp(k, "seq"))
            rc = read_int(x, key, it, 1, INT32_MAX, "an integer >= 1", &c->seq);
        else if (!strcmp(k, "threads"))
            rc = read_int(x, key, it, 0, 4096, "an integer from 0 to 4096", &c->threads);
        else if (!strcmp(k, "seed")) {
            rc = read_seed(x, key, it, &c->seed);
            c->has_seed = rc == REGC_OK;
        } else if (!strcmp(k, "lr")) {
            rc = read_float(x, key, it, 1, &c->lr);
            c->has_lr = rc == REGC_OK;
        } else if (!strcmp(k, "weight_decay")) {
            rc = read_float(x, key, it, 0, &c->weight_decay);
            c->has_weight_decay = rc == REGC_OK;
        } else if (!strcmp(k, "json")) {
            rc = read_bool(x, key, it, &c->json);
        } else {
            return regc_error(REGC_ERR_FORMAT, "%s: %s: unknown key", x->file, key);
        }
        if (rc)
            return rc;
    }
    return REGC_OK;
}

static int read_root(const load_ctx *x, const cJSON *root)
{
    if (!cJSON_IsObject(root)) {
        char got[96];
        value_text(got, sizeof got, root);
        return regc_error(REGC_ERR_FORMAT,
                          "%s: expected a JSON object {\"compile\": {...}, \"train\": {...}}, "
                          "got %s",
                          x->file, got);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        char key[128];
        key_path(key, sizeof key, NULL, it);
        int rc = check_duplicate(x, root, it, key);
        const char *k = it->string ? it->string : "";
        if (rc)
            return rc;
        int compile = !strcmp(k, "compile"), train = !strcmp(k, "train");
        if (compile || train) {
            if (!cJSON_IsObject(it))
                return expected(x, key, it, "an object");
            rc = compile ? read_compile(x, it) : read_train(x, it);
        } else if (!strcmp(k, "zero_optimization")) {
            /* Named in full where the file names a setting, so the user
             * sees which line to remove. */
            if (cJSON_IsObject(it) && it->child)
                key_path(key, sizeof key, "zero_optimization", it->child);
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: %s: not supported yet (ZeRO sharding is not implemented)",
                              x->file, key);
        } else {
            return regc_error(REGC_ERR_FORMAT,
                              "%s: %s: unknown key (expected \"compile\" or \"train\")", x->file,
                              key);
        }
        if (rc)
            return rc;
    }
    return REGC_OK;
}

/* Line and column (both from 1) of `at` in text. */
static void position_of(const char *text, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *p = text; at && *p && p < at; p++) {
        if (*p == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

int regc_config_load(const char *path, regc_config **out)
{
    *out = NULL;
    char *text = NULL;
    size_t size = 0;
    int rc = regc_file_read_all(path, &text, &size);
    if (rc)
        return rc;
    if (strlen(text) != size) {
        int line, col;
        position_of(text, text + strlen(text), &line, &col);
        free(text);
        return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON: a NUL byte at line %d, column %d",
                          path, line, col);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        int line, col;
        position_of(text, end, &line, &col);
        const char *blank = text + strspn(text, " \t\r\n");
        if (*blank)
            rc = regc_error(REGC_ERR_FORMAT, "%s: malformed JSON near line %d, column %d", path,
                            line, col);
        else
            rc = regc_error(REGC_ERR_FORMAT, "%s: malformed JSON: the file is empty", path);
        free(text);
        return rc;
    }
    free(text);

    regc_config *c = calloc(1, sizeof *c);
    if (!c) {
        cJSON_Delete(root);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    }
    c->regional = c->inline_back = c->level = c->json = -1;
    c->steps = c->batch = c->seq = c->threads = c->cache_max_mb = -1;
    load_ctx x = {.file = path, .c = c};
    rc = read_root(&x, root);
    cJSON_Delete(root);
    if (rc) {
        regc_config_free(c);
        return rc;
    }
    *out = c;
    return REGC_OK;
}

void regc_config_free(regc_config *c)
{
    if (!c)
        return;
    free(c->backend);
    free(c->dump_dir), free(c->cache_dir);
    free(c->model);
    free(c->weights);
    free(c->data);
    free(c->save);
    free(c);
}

void regc_config_apply(const regc_config *c, regc_train_options *o)
{
    if (!c)
        return;
    if (c->regional >= 0)
        o->compile.regional = c->regional;
    if (c->inline_back >= 0)
        o->compile.inline_back = c->inline_back;
    if (c->level >= 0)
        o->compile.level = (regc_level)c->level;
    if (c->dump_dir)
        o->compile.dump_dir = c->dump_dir;
    if (c->has_cache_dir)
        o->cache_dir = c->cache_dir;
    if (c->cache_max_mb > 0)
        o->cache_max_bytes = c->cache_max_mb << 20;
    if (c->backend)
        o->backend = c->backend;
    if (c->data)
        o->data_path = c->data;
    if (c->save)
        o->save_dir = c->save;
    if (c->steps >= 0)
        o->steps = (int)c->steps;
    if (c->batch >= 0)
        o->batch = c->batch;
    if (c->seq >= 0)
        o->seq = c->seq;
    if (c->threads >= 0)
        o->threads = (int)c->threads;
    if (c->has_seed)
        o->seed = c->seed;
    if (c->has_lr)
        o->lr = (float)c->lr;
    if (c->has_weight_decay)
        o->weight_decay = (float)c->weight_decay;
}

const char *regc_config_model(const regc_config *c)
{
    return c ? c->model : NULL;
}

const char *regc_config_weights(const regc_config *c)
{
    return c ? c->weights : NULL;
}

int regc_config_json(const regc_config *c)
{
    return c ? c->json : -1;
}
