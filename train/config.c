/* config.c — the training config file: {"compile": {...}, "train": {...}},
 * a DeepSpeed ds_config.json or Transformers' TrainingArguments as JSON.
 *
 * The keys, their types and ranges are the option table's (options.c).
 * The file is checked whole when loaded, so a typo fails before any work
 * starts rather than being silently ignored: every message names the file
 * and the full key path ("cfg.json: train.batch: ...") and says what was
 * expected. A loaded config remembers which keys the file set, so applying
 * it over defaults (or under command-line flags) changes only those.
 *
 * A row's other spellings (its aliases: DeepSpeed's and Transformers'
 * names) are read by the same walk over the file's key paths: a value
 * given twice in one file must agree, "auto" leaves a key to regc where
 * Hugging Face's integration would fill it in, null leaves another
 * program's key unset, and a DeepSpeed scheduler named by the file takes
 * DeepSpeed's defaults for what the file leaves out. Keys that change
 * nothing in regc are accepted (OPT_INERT), and those that would change
 * the math are refused by name unless at a value that does not. */
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "options.h"
#include "regc_common.h"

struct regc_config {
    regc_train_settings s;     /* the file's values; its strings are owned here */
    char set[REGC_OPTION_MAX]; /* set[k]: the file gives regc_option_table[k] */
    /* the key as the file spells it ("optimizer.params.lr"), where it gives
     * row k or "auto" for it */
    char *spelled[REGC_OPTION_MAX];
    signed char alias[REGC_OPTION_MAX];  /* the spelling's alias index, -1 the row's own */
    unsigned char used[REGC_OPTION_MAX]; /* the spellings of row k the file used: bit a + 1 */
    char is_auto[REGC_OPTION_MAX];       /* the file says "auto" for row k */
    char ds_default[REGC_OPTION_MAX];    /* row k is a DeepSpeed scheduler's default */
    char *path;                          /* the file, for messages and origins */
};

/* Seeds go through a double in cJSON: above 2^53 - 1 two different seeds
 * written in the file could read back as the same number. */
#define SEED_MAX ((double)((INT64_C(1) << 53) - 1))

typedef struct {
    const char *file;
    regc_config *c;
    regc_train_settings *scratch; /* one value read, before it joins c->s */
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

/* "a.b" from a parent path ("" at the root) and a key, printable. */
static void join_path(char *buf, size_t cap, const char *parent, const char *key)
{
    char name[96];
    printable(name, sizeof name, key);
    snprintf(buf, cap, "%s%s%s", parent, parent[0] ? "." : "", name);
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

static int row_index(const regc_option *o) { return (int)(o - regc_option_table); }

/* One value for row o into s; null unsets a string (or, where the row
 * says so, sets it to NULL). Returns 1 when it sets the row, 0 when it
 * leaves it unset, or an error. */
static int read_value(const load_ctx *x, const regc_option *o, const char *key, const cJSON *it,
                      regc_train_settings *s)
{
    void *f = regc_option_field(o, s);
    char what[160];
    regc_option_describe(o, 1, what, sizeof what);
    double d = cJSON_IsNumber(it) ? it->valuedouble : 0.0;
    switch (o->type) {
    case OPT_STRING:
    case OPT_BACKEND: {
        char **str = f;
        free(*str);
        *str = NULL;
        if (cJSON_IsNull(it) || ((o->flags & OPT_BOOL_PATH) && cJSON_IsFalse(it)))
            return (o->flags & OPT_NULL_SETS) ? 1 : 0;
        /* true: the row's own directory (DeepCompile's dump_graphs) */
        const char *v = (o->flags & OPT_BOOL_PATH) && cJSON_IsTrue(it) ? o->values
                        : cJSON_IsString(it)                           ? it->valuestring
                                                                       : NULL;
        if (!v || !v[0])
            return expected(x, key, it, what);
        int64_t dev;
        if (o->type == OPT_BACKEND && strcmp(v, "cpu") && strcmp(v, "cuda") &&
            (strncmp(v, "cuda:", 5) || regc_text_to_i64(v + 5, 0, 1024, &dev)))
            return expected(x, key, it, what);
        if (!(*str = strdup(v)))
            return regc_error(REGC_ERR_MEMORY, "%s: %s: out of memory", x->file, key);
        return 1;
    }
    case OPT_INT:
        /* compared in double first, so a huge value never reaches an
         * out-of-range int64 conversion */
        if (!cJSON_IsNumber(it) || !(d >= o->min && d <= o->max) || d != floor(d))
            return expected(x, key, it, what);
        regc_option_store_int(o, s, (int64_t)d);
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
    case OPT_BETAS: { /* [beta1, beta2] into two adjacent floats */
        const cJSON *a = cJSON_IsArray(it) ? it->child : NULL, *b = a ? a->next : NULL;
        if (!a || !b || b->next || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
            !(a->valuedouble >= 0.0 && a->valuedouble < 1.0) ||
            !(b->valuedouble >= 0.0 && b->valuedouble < 1.0))
            return expected(x, key, it, what);
        ((float *)f)[0] = (float)a->valuedouble;
        ((float *)f)[1] = (float)b->valuedouble;
        return 1;
    }
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
            if ((o->flags & OPT_NOCASE) ? !strcasecmp(it->valuestring, o->choices[k])
                                        : !strcmp(it->valuestring, o->choices[k])) {
                *(int *)f = k;
                return 1;
            }
        return expected(x, key, it, what);
    case OPT_INERT: { /* nothing to set; of the kind the row says, if it says */
        static const struct {
            const char *name;
            int type;
        } kinds[] = {
            {"bool", cJSON_True | cJSON_False}, {"number", cJSON_Number}, {"string", cJSON_String},
            {"object", cJSON_Object},           {"array", cJSON_Array},   {"null", cJSON_NULL}};
        int ok = !o->values;
        for (size_t k = 0; !ok && k < sizeof kinds / sizeof kinds[0]; k++)
            ok = strstr(o->values, kinds[k].name) && (it->type & 0xff & kinds[k].type);
        if (!ok) {
            char kind[64];
            snprintf(kind, sizeof kind, "%s", o->values);
            for (char *c = kind; *c; c++)
                *c = *c == '|' ? '/' : *c;
            return expected(x, key, it, kind);
        }
        return 0;
    }
    case OPT_NEUTRAL: { /* one of the values that change nothing, or refused by name */
        cJSON *ok = cJSON_Parse(o->values);
        int same = 0;
        for (const cJSON *v = ok ? ok->child : NULL; v && !same; v = v->next)
            same = cJSON_Compare(v, it, 1);
        cJSON_Delete(ok);
        if (same)
            return 0;
        char got[96];
        value_text(got, sizeof got, it);
        return regc_error(REGC_ERR_UNSUPPORTED, "%s: %s: %s is not supported: %s (accepted: %s)",
                          x->file, key, got, o->help, o->values);
    }
    }
    return 0;
}

/* Are the fields of row o in a and b the same value? */
static int same_value(const regc_option *o, const regc_train_settings *a,
                      const regc_train_settings *b)
{
    const void *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;
    if (o->type == OPT_STRING || o->type == OPT_BACKEND) {
        const char *sa = *(const char *const *)fa, *sb = *(const char *const *)fb;
        return sa == sb || (sa && sb && !strcmp(sa, sb));
    }
    return memcmp(fa, fb, o->size) == 0;
}

/* The value read into x->scratch joins the file's as row o, spelled `key`:
 * a second spelling of the same option in one file must agree with the
 * first. */
static int keep_value(const load_ctx *x, const regc_option *o, int alias, const char *key)
{
    regc_config *c = x->c;
    const int k = row_index(o);
    void *to = regc_option_field(o, &c->s), *from = regc_option_field(o, x->scratch);
    int rc = REGC_OK;
    if (c->set[k] && !same_value(o, &c->s, x->scratch)) {
        char was[96], now[96];
        regc_option_value_text(o, &c->s, was, sizeof was);
        regc_option_value_text(o, x->scratch, now, sizeof now);
        rc = regc_error(REGC_ERR_FORMAT, "%s: %s: %s contradicts %s: %s", x->file, key, now,
                        c->spelled[k], was);
    } else if (!c->set[k]) {
        if (o->type == OPT_STRING || o->type == OPT_BACKEND)
            free(*(char **)to);
        memcpy(to, from, o->size);
        if (o->type == OPT_STRING || o->type == OPT_BACKEND)
            *(char **)from = NULL; /* moved */
        free(c->spelled[k]);
        if (!(c->spelled[k] = strdup(key)))
            rc = regc_error(REGC_ERR_MEMORY, "%s: %s: out of memory", x->file, key);
        c->set[k] = 1;
        c->alias[k] = (signed char)alias;
    }
    if (o->type == OPT_STRING || o->type == OPT_BACKEND) {
        free(*(char **)from);
        *(char **)from = NULL;
    }
    return rc;
}

/* Does this spelling take "auto" (Hugging Face fills it in from its
 * arguments; regc takes its own value)? */
static int takes_auto(const regc_option *o, int alias)
{
    return alias >= 0 ? (o->alias[alias].flags & OPT_AUTO) != 0 : (o->flags & OPT_AUTO) != 0;
}

/* The value `it` at `key` for row o, spelled by its alias `alias` (-1: the
 * row's own key). */
static int read_leaf(const load_ctx *x, const regc_option *o, int alias, const char *key,
                     const cJSON *it)
{
    regc_config *c = x->c;
    const int k = row_index(o);
    const regc_alias *a = alias >= 0 ? &o->alias[alias] : NULL;
    c->used[k] |= (unsigned char)(1u << (alias + 1));
    if (cJSON_IsString(it) && !strcmp(it->valuestring, "auto") && takes_auto(o, alias)) {
        c->is_auto[k] = 1;
        if (!c->spelled[k] && !(c->spelled[k] = strdup(key)))
            return regc_error(REGC_ERR_MEMORY, "%s: %s: out of memory", x->file, key);
        return REGC_OK;
    }
    /* another program's spelling: null, or the value it means "unset" by */
    if (a && (cJSON_IsNull(it) ||
              (a->unset && cJSON_IsNumber(it) && it->valuedouble == strtod(a->unset, NULL))))
        return REGC_OK;
    if (a && (a->flags & OPT_FRACTION) && cJSON_IsNumber(it) && it->valuedouble > 0.0 &&
        it->valuedouble < 1.0) /* Transformers 5's warmup_steps: a fraction of the steps */
        return read_leaf(x, regc_option_by_key("train", "warmup_ratio"), -1, key, it);
    int rc;
    if (a && (a->flags & OPT_BOOL) && cJSON_IsBool(it)) {
        int choice = cJSON_IsTrue(it) ? o->bool_true : o->bool_false;
        if (choice < 0)
            return REGC_OK;
        *(int *)regc_option_field(o, x->scratch) = choice;
        rc = 1;
    } else {
        rc = read_value(x, o, key, it, x->scratch);
    }
    if (rc < 0)
        return rc;
    if (rc == 0) { /* unset: a null string, or a key that changes nothing */
        if (o->type == OPT_STRING || o->type == OPT_BACKEND) {
            free(*(char **)regc_option_field(o, x->scratch));
            *(char **)regc_option_field(o, x->scratch) = NULL;
        }
        return REGC_OK;
    }
    return keep_value(x, o, alias, key);
}

/* The keys of one object: `path` is where it sits for the table ("" the
 * root, "zero_optimization"), `shown` as the file spells it (Transformers'
 * inline "deepspeed" object adds its name). */
static int read_object(const load_ctx *x, const char *path, const char *shown, const cJSON *obj)
{
    const cJSON *it;
    cJSON_ArrayForEach (it, obj) {
        char full[256], key[256];
        const char *name = it->string ? it->string : "";
        join_path(full, sizeof full, path, name);
        join_path(key, sizeof key, shown, name);
        int rc = check_duplicate(x, obj, it, key);
        if (rc)
            return rc;
        int alias;
        const regc_option *o = regc_option_by_path(full, &alias);
        /* Transformers' "deepspeed": a DeepSpeed config inline, read in place
         * (once: a DeepSpeed config names no other) */
        if (o && o == regc_option_by_key("train", "deepspeed") && cJSON_IsObject(it)) {
            if (!path[0] && shown[0])
                return regc_error(REGC_ERR_FORMAT, "%s: %s: a DeepSpeed config inside another",
                                  x->file, key);
            if ((rc = read_object(x, "", key, it)))
                return rc;
            continue;
        }
        if (regc_option_section_known(full) && (cJSON_IsObject(it) || (!o && cJSON_IsNull(it)))) {
            /* a section; null is an empty one, as DeepSpeed reads it */
            if (cJSON_IsObject(it) && (rc = read_object(x, full, key, it)))
                return rc;
            continue;
        }
        if (!o && regc_option_section_known(full))
            return expected(x, key, it, "an object");
        if (!o && !path[0])
            return regc_error(REGC_ERR_FORMAT,
                              "%s: %s: unknown key (expected \"compile\", \"train\" or another "
                              "section of regc's, or a key of DeepSpeed's or of Transformers' "
                              "TrainingArguments that regc train --help lists)",
                              x->file, key);
        if (!o)
            return regc_error(REGC_ERR_FORMAT, "%s: %s: unknown key", x->file, key);
        if ((rc = read_leaf(x, o, alias, key, it)))
            return rc;
    }
    return REGC_OK;
}

/* The index of spelling `path` among row o's aliases, or -1. */
static int alias_of(const regc_option *o, const char *path)
{
    for (int a = 0; a < REGC_ALIAS_MAX && o->alias[a].path; a++)
        if (!strcmp(o->alias[a].path, path))
            return a;
    return -1;
}

/* DeepSpeed's defaults for the parameters of the scheduler its file names
 * (scheduler.type) and leaves out: every scheduler warms up over 1000
 * steps, and WarmupDecayLR peaks at 0.001 (WarmupLR and WarmupCosineLR at
 * the optimizer's lr). The same option given in the file in another
 * spelling, which DeepSpeed would not use, is refused unless it agrees. */
static int ds_defaults(const load_ctx *x)
{
    regc_config *c = x->c;
    const regc_option *sched = regc_option_by_key("train", "lr_scheduler_type");
    const int ks = row_index(sched);
    if (!c->set[ks] || c->alias[ks] != alias_of(sched, "scheduler.type") ||
        !regc_train_schedule_is_deepspeed(c->s.train.lr_scheduler))
        return REGC_OK;
    const int type = c->s.train.lr_scheduler;
    const struct {
        const char *row, *ds_key, *also; /* also: another row that sets the same thing */
        double value;
    } d[] = {
        {"warmup_steps", "scheduler.params.warmup_num_steps", "warmup_ratio", 1000.0},
        {"lr", "scheduler.params.warmup_max_lr", NULL, 0.001},
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        if (!strcmp(d[i].row, "lr") && type != REGC_SCHEDULE_WARMUP_DECAY_LR)
            continue;
        const regc_option *o = regc_option_by_key("train", d[i].row);
        const int k = row_index(o), a = alias_of(o, d[i].ds_key);
        if (c->used[k] & (1u << (a + 1)))
            continue; /* given, or "auto" */
        char v[64], was[96];
        snprintf(v, sizeof v, "%g", d[i].value);
        const regc_option *also = d[i].also ? regc_option_by_key("train", d[i].also) : NULL;
        const regc_option *given = c->set[k] ? o : also && c->set[row_index(also)] ? also : NULL;
        if (given) {
            const double now = o->type == OPT_FLOAT
                                   ? (double)*(const float *)regc_option_field(o, &c->s)
                                   : (double)*(const int64_t *)regc_option_field(o, &c->s);
            if (given == o &&
                now == (o->type == OPT_FLOAT ? (double)(float)d[i].value : d[i].value))
                continue;
            regc_option_value_text(given, &c->s, was, sizeof was);
            return regc_error(REGC_ERR_FORMAT,
                              "%s: %s: left out, so DeepSpeed's %s would take its default %s, not "
                              "%s's %s; give it (or \"auto\" for regc's value)",
                              x->file, d[i].ds_key, sched->choices[type], v,
                              c->spelled[row_index(given)], was);
        }
        if (o->type == OPT_FLOAT)
            *(float *)regc_option_field(o, &c->s) = (float)d[i].value;
        else
            regc_option_store_int(o, &c->s, (int64_t)d[i].value);
        free(c->spelled[k]);
        if (!(c->spelled[k] = strdup(d[i].ds_key)))
            return regc_error(REGC_ERR_MEMORY, "%s: out of memory", x->file);
        c->set[k] = 1;
        c->ds_default[k] = 1;
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
    int rc = read_object(x, "", "", root);
    return rc ? rc : ds_defaults(x);
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
    regc_train_settings *scratch = calloc(1, sizeof *scratch);
    if (!c || !scratch || !(c->path = strdup(path))) {
        cJSON_Delete(root);
        free(scratch);
        regc_config_free(c);
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    }
    load_ctx x = {.file = path, .c = c, .scratch = scratch};
    int rc = read_root(&x, root);
    free(scratch); /* every string read into it has moved to c or been freed */
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
        free(c->spelled[k]);
    }
    free(c->path);
    free(c);
}

/* Do the fields of rows a and b share bytes (two spellings, or betas and
 * adam_beta1)? */
static int overlap(const regc_option *a, const regc_option *b)
{
    return a->size && b->size && a->offset < b->offset + b->size && b->offset < a->offset + a->size;
}

int regc_config_apply_from(const regc_config *c, regc_train_settings *s, regc_origins *from)
{
    if (!c)
        return REGC_OK;
    /* first every conflict with what another file set, then the values */
    for (int k = 0; from && k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        const int overrides =
            c->set[k] && c->alias[k] >= 0 && (o->alias[c->alias[k]].flags & OPT_OVERRIDES);
        for (int j = 0; c->set[k] && !overrides && j < regc_option_count; j++) {
            const regc_option *p = &regc_option_table[j];
            if (from->kind[j] != REGC_FROM_FILE || !overlap(o, p))
                continue;
            /* the bytes they share: the same option, or betas and one beta */
            const size_t lo = o->offset > p->offset ? o->offset : p->offset;
            const size_t hi = o->offset + o->size < p->offset + p->size ? o->offset + o->size
                                                                        : p->offset + p->size;
            int differ = o == p ? !same_value(o, &c->s, s)
                                : memcmp((const char *)&c->s + lo, (const char *)s + lo, hi - lo);
            if (!differ)
                continue;
            char now[96], was[96];
            regc_option_value_text(o, &c->s, now, sizeof now);
            regc_option_value_text(p, s, was, sizeof was);
            return regc_error(REGC_ERR_FORMAT, "%s: %s: %s contradicts %s: %s: %s", c->path,
                              c->spelled[k], now, from->file[j], from->key[j], was);
        }
    }
    for (int k = 0; k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        if (c->set[k])
            memcpy(regc_option_field(o, s), (const char *)&c->s + o->offset, o->size);
        if (!from)
            continue;
        if (c->set[k]) {
            from->kind[k] = REGC_FROM_FILE;
            from->ds_default[k] = (unsigned char)c->ds_default[k];
        } else if (c->is_auto[k] && from->kind[k] == REGC_FROM_DEFAULT) {
            from->kind[k] = REGC_FROM_AUTO;
        } else {
            continue;
        }
        from->file[k] = c->path;
        from->key[k] = c->spelled[k];
    }
    return REGC_OK;
}

void regc_config_apply(const regc_config *c, regc_train_settings *s)
{
    regc_config_apply_from(c, s, NULL);
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

const char *regc_config_deepspeed(const regc_config *c)
{
    const char *const *v = file_value(c, "train", "deepspeed");
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
