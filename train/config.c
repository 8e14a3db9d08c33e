/* config.c — the training config file: {"compile": {...}, "train": {...}}.
 *
 * The keys, their types and ranges are the option table's (options.c).
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

#include "options.h"
#include "regc_common.h"

struct regc_config {
    regc_train_settings s;     /* the file's values; its strings are owned here */
    char set[REGC_OPTION_MAX]; /* set[k]: the file gives regc_option_table[k] */
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

/* One value for row o, into c->s; null unsets a string (or, where the row
 * says so, sets it to NULL). */
static int read_value(const load_ctx *x, const regc_option *o, const char *key, const cJSON *it)
{
    regc_config *c = x->c;
    void *f = regc_option_field(o, &c->s);
    char what[160];
    regc_option_describe(o, 1, what, sizeof what);
    double d = cJSON_IsNumber(it) ? it->valuedouble : 0.0;
    switch (o->type) {
    case OPT_STRING:
    case OPT_BACKEND: {
        char **str = f;
        free(*str);
        *str = NULL;
        if (cJSON_IsNull(it))
            return (o->flags & OPT_NULL_SETS) ? 1 : 0;
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return expected(x, key, it, what);
        if (o->type == OPT_BACKEND) {
            const char *v = it->valuestring;
            int64_t dev;
            if (strcmp(v, "cpu") && strcmp(v, "cuda") &&
                (strncmp(v, "cuda:", 5) || regc_text_to_i64(v + 5, 0, 1024, &dev)))
                return expected(x, key, it, what);
        }
        if (!(*str = strdup(it->valuestring)))
            return regc_error(REGC_ERR_MEMORY, "%s: %s: out of memory", x->file, key);
        return 1;
    }
    case OPT_INT:
        /* compared in double first, so a huge value never reaches an
         * out-of-range int64 conversion */
        if (!cJSON_IsNumber(it) || !(d >= o->min && d <= o->max) || d != floor(d))
            return expected(x, key, it, what);
        regc_option_store_int(o, &c->s, (int64_t)d);
        return 1;
    case OPT_SEED:
        if (!cJSON_IsNumber(it) || !(d >= 0.0 && d <= SEED_MAX) || d != floor(d))
            return expected(x, key, it, what);
        *(uint64_t *)f = (uint64_t)d;
        return 1;
    case OPT_FLOAT:
        /* finite and representable as a float (the optimizer's precision) */
        if (!cJSON_IsNumber(it) || !isfinite(d) || d > FLT_MAX ||
            (o->min > 0 ? !(d > 0.0) : !(d >= 0.0)) || (o->max > 0 && !(d <= o->max)))
            return expected(x, key, it, what);
        if (o->min > 0 && (float)d == 0.0f)
            return expected(x, key, it, "a number > 0 that a float can hold (>= 1e-45)");
        if (o->size == sizeof(double))
            *(double *)f = d;
        else
            *(float *)f = (float)d;
        return 1;
    case OPT_FLAG:
    case OPT_SWITCH:
        if (!cJSON_IsBool(it))
            return expected(x, key, it, what);
        *(int *)f = cJSON_IsTrue(it) ? 1 : 0;
        return 1;
    case OPT_PASSES:
    case OPT_REPLANS: {
        char why[160];
        if (o->type == OPT_PASSES ? regc_passes_from_json(it, f, why, sizeof why)
                                  : regc_replans_from_json(it, f, why, sizeof why))
            return regc_error(REGC_ERR_FORMAT, "%s: %s: %s", x->file, key, why);
        return 1;
    }
    case OPT_MODULES: { /* PEFT's form: a list, or a string that is a regular expression */
        regc_lora_targets *t = f;
        return regc_lora_targets_from_json(it, t->text, sizeof t->text, &t->regex)
                   ? expected(x, key, it, what)
                   : 1;
    }
    case OPT_CHOICE:
        if (cJSON_IsNull(it)) /* null: unset, like every string key */
            return 0;
        for (int k = 0; cJSON_IsString(it) && o->choices[k]; k++)
            if (!strcmp(it->valuestring, o->choices[k])) {
                *(int *)f = k;
                return 1;
            }
        return expected(x, key, it, what);
    }
    return 0;
}

/* The keys of one section ("compile" or "train"). */
static int read_section(const load_ctx *x, const char *section, const cJSON *obj)
{
    const cJSON *it;
    cJSON_ArrayForEach (it, obj) {
        char key[128];
        key_path(key, sizeof key, section, it);
        int rc = check_duplicate(x, obj, it, key);
        if (rc)
            return rc;
        const regc_option *o = regc_option_by_key(section, it->string ? it->string : "");
        char inner[128]; /* a section inside this one: zero_optimization.offload_optimizer */
        snprintf(inner, sizeof inner, "%s.%s", section, it->string ? it->string : "");
        if (!o && regc_option_section_known(inner)) {
            if (!cJSON_IsObject(it))
                return expected(x, key, it, "an object");
            if ((rc = read_section(x, inner, it)))
                return rc;
            continue;
        }
        if (!o && regc_option_not_yet(section, it->string ? it->string : ""))
            return regc_error(REGC_ERR_UNSUPPORTED, "%s: %s: not supported yet", x->file, key);
        if (!o)
            return regc_error(REGC_ERR_FORMAT, "%s: %s: unknown key", x->file, key);
        if ((rc = read_value(x, o, key, it)) < 0)
            return rc;
        x->c->set[o - regc_option_table] = (char)rc;
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
    cJSON_ArrayForEach (it, root) {
        char key[128];
        key_path(key, sizeof key, NULL, it);
        int rc = check_duplicate(x, root, it, key);
        const char *k = it->string ? it->string : "";
        if (rc)
            return rc;
        if (regc_option_section_known(k) && !strchr(k, '.')) {
            if (!cJSON_IsObject(it))
                return expected(x, key, it, "an object");
            rc = read_section(x, k, it);
        } else {
            return regc_error(REGC_ERR_FORMAT,
                              "%s: %s: unknown key (expected \"compile\", \"train\" or "
                              "\"zero_optimization\")",
                              x->file, key);
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

int regc_config_parse(const char *text, size_t size, const char *path, regc_config **out)
{
    *out = NULL;
    /* cJSON reads to the first NUL: a NUL inside the text would hide the
     * rest of the file, so it is refused */
    size_t len = strlen(text);
    if (len != size) {
        int line, col;
        position_of(text, text + len, &line, &col);
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
            return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON near line %d, column %d", path,
                              line, col);
        return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON: the file is empty", path);
    }
    regc_config *c = calloc(1, sizeof *c);
    if (!c) {
        cJSON_Delete(root);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    }
    load_ctx x = {.file = path, .c = c};
    int rc = read_root(&x, root);
    cJSON_Delete(root);
    if (rc) {
        regc_config_free(c);
        return rc;
    }
    *out = c;
    return REGC_OK;
}

int regc_config_load(const char *path, regc_config **out)
{
    *out = NULL;
    char *text = NULL;
    size_t size = 0;
    int rc = regc_file_read_all(path, &text, &size);
    if (rc)
        return rc;
    rc = regc_config_parse(text, size, path, out);
    free(text);
    return rc;
}

void regc_config_free(regc_config *c)
{
    if (!c)
        return;
    for (int k = 0; k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        if (o->type == OPT_STRING || o->type == OPT_BACKEND)
            free(*(char **)regc_option_field(o, &c->s));
    }
    free(c);
}

void regc_config_apply(const regc_config *c, regc_train_settings *s)
{
    for (int k = 0; c && k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        if (c->set[k])
            memcpy(regc_option_field(o, s), (const char *)&c->s + o->offset, o->size);
    }
}

/* What the file gives for section.key, or NULL when it leaves it unset. */
static const void *file_value(const regc_config *c, const char *section, const char *key)
{
    const regc_option *o = regc_option_by_key(section, key);
    return c && o && c->set[o - regc_option_table] ? (const char *)&c->s + o->offset : NULL;
}

const char *regc_config_model(const regc_config *c)
{
    const char *const *v = file_value(c, "train", "model");
    return v ? *v : NULL;
}

const char *regc_config_weights(const regc_config *c)
{
    const char *const *v = file_value(c, "train", "weights");
    return v ? *v : NULL;
}

int regc_config_json(const regc_config *c)
{
    const int *v = file_value(c, "train", "json");
    return v ? *v : -1;
}
