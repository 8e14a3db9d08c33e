/* option_values.c — reading and writing one option of the table
 * (options.c): the settings' defaults, a row found by key, path or flag,
 * a value checked and stored from its text, and a row described for
 * messages. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

void regc_train_settings_default(regc_train_settings *s)
{
    memset(s, 0, sizeof *s);
    regc_train_options_default(&s->train);
    s->quant.double_quant = 1; /* QLoRA's; Transformers' default is off, refused */
    s->adam_w_mode = 1;        /* DeepSpeed's default */
    s->average_tokens = 1;     /* what regc's loss is */
    s->eod_token_id = -1;      /* a row is one document */
}

void *regc_option_field(const regc_option *o, regc_train_settings *s)
{
    return (char *)s + o->offset;
}

const regc_option *regc_option_by_key(const char *section, const char *key)
{
    for (int i = 0; i < regc_option_count; i++) {
        const regc_option *o = &regc_option_table[i];
        if (o->key && !strcmp(o->section, section) && !strcmp(o->key, key))
            return o;
    }
    return NULL;
}

/* Row o's own key path: "section.key", or "key" at the root. */
static void own_path(const regc_option *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s%s", o->section, o->section[0] ? "." : "", o->key);
}

/* Does `path` start with `prefix` followed by a dot? */
static int under(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    return !strncmp(path, prefix, n) && path[n] == '.';
}

const regc_option *regc_option_by_path(const char *path, int *alias)
{
    char own[256];
    const regc_option *any = NULL; /* a row "section.*" that takes every key of its section */
    *alias = -1;
    for (int i = 0; i < regc_option_count; i++) {
        const regc_option *o = &regc_option_table[i];
        if (!o->key)
            continue;
        own_path(o, own, sizeof own);
        if (!strcmp(own, path))
            return o;
        for (int k = 0; k < REGC_ALIAS_MAX && o->alias[k].path; k++)
            if (!strcmp(o->alias[k].path, path)) {
                *alias = k;
                return o;
            }
        if (!strcmp(o->key, "*") && under(path, o->section) &&
            !strchr(path + strlen(o->section) + 1, '.'))
            any = o;
    }
    return any;
}

int regc_option_section_known(const char *path)
{
    char own[256];
    for (int i = 0; i < regc_option_count; i++) {
        const regc_option *o = &regc_option_table[i];
        if (!o->key)
            continue;
        own_path(o, own, sizeof own);
        if (under(own, path))
            return 1;
        for (int k = 0; k < REGC_ALIAS_MAX && o->alias[k].path; k++)
            if (under(o->alias[k].path, path))
                return 1;
    }
    return 0;
}

const regc_option *regc_option_by_flag(const char *flag)
{
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].flag && !strcmp(regc_option_table[i].flag, flag))
            return &regc_option_table[i];
    return NULL;
}

int regc_option_takes_value(const regc_option *o) { return o->type != OPT_FLAG; }

/* Ranges up to INT32_MAX and beyond read as "no upper bound" to a person. */
static int unbounded(const regc_option *o) { return o->max >= (double)INT32_MAX; }

void regc_option_describe(const regc_option *o, int in_file, char *buf, size_t cap)
{
    switch (o->type) {
    case OPT_STRING:
        snprintf(buf, cap,
                 !in_file                   ? "a non-empty value"
                 : o->flags & OPT_BOOL_PATH ? "a non-empty string, true, false or null"
                                            : "a non-empty string or null");
        break;
    case OPT_INT:
        if (unbounded(o) && in_file)
            snprintf(buf, cap, "an integer >= %.0f", o->min);
        else if (unbounded(o))
            snprintf(buf, cap, o->min > 0 ? "a positive integer" : "a non-negative integer");
        else
            snprintf(buf, cap, "an integer from %.0f to %.0f", o->min, o->max);
        break;
    case OPT_SEED:
        snprintf(buf, cap,
                 in_file ? "an integer from 0 to 2^53 - 1 (9007199254740991)"
                         : "a non-negative integer below 2^64");
        break;
    case OPT_FLOAT:
        if (o->max > 0)
            snprintf(buf, cap, "a number from %g to %g", o->min, o->max);
        else if (in_file)
            snprintf(buf, cap, o->min > 0 ? "a finite number > 0" : "a finite number >= 0");
        else
            snprintf(buf, cap, o->min > 0 ? "a positive number" : "a non-negative number");
        break;
    case OPT_FLAG:
    case OPT_SWITCH: snprintf(buf, cap, in_file ? "true or false" : "on or off"); break;
    case OPT_CHOICE: {
        /* "O0, O1 or O2"; quoted in the file, where they are JSON strings */
        size_t n = 0;
        const char *q = in_file ? "\"" : "";
        buf[0] = '\0';
        for (int i = 0; o->choices[i] && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s%s%s",
                                  i == 0              ? ""
                                  : o->choices[i + 1] ? ", "
                                                      : " or ",
                                  q, o->choices[i], q);
        break;
    }
    case OPT_BACKEND:
        snprintf(buf, cap,
                 in_file ? "\"cpu\", \"cuda\", \"cuda:N\" or null" : "cpu, cuda or cuda:N");
        break;
    case OPT_PASSES:
        snprintf(buf, cap,
                 in_file ? "an array of pass names or [name, budget_mb] pairs"
                         : "pass names separated by commas, or none");
        break;
    case OPT_REPLANS:
        snprintf(buf, cap, in_file ? "an array of [step, [passes]] pairs" : "STEP:passes;...");
        break;
    case OPT_MODULES:
        snprintf(buf, cap,
                 in_file ? "an array of module names, a regular expression or \"all-linear\""
                         : "module names separated by commas, or all-linear");
        break;
    case OPT_BETAS: snprintf(buf, cap, "[beta1, beta2], each from 0 to below 1"); break;
    case OPT_INERT:
        snprintf(buf, cap, "%s%s", o->values ? "a value of kind " : "any value",
                 o->values ? o->values : "");
        break;
    case OPT_NEUTRAL: snprintf(buf, cap, "one of %s", o->values); break;
    }
}

void regc_option_store_int(const regc_option *o, regc_train_settings *s, int64_t v)
{
    v *= o->scale ? o->scale : 1;
    void *f = regc_option_field(o, s);
    if (o->size == sizeof(int64_t))
        memcpy(f, &v, sizeof v);
    else {
        int x = (int)v;
        memcpy(f, &x, sizeof x);
    }
}

/* "cpu", "cuda" or "cuda:N" (N a device number up to 1024). */
static int backend_name_ok(const char *s)
{
    int64_t device;
    return !strcmp(s, "cpu") || !strcmp(s, "cuda") ||
           (!strncmp(s, "cuda:", 5) && regc_text_to_i64(s + 5, 0, 1024, &device) == 0);
}

static int bad_value(const regc_option *o, const char *text)
{
    char what[160];
    regc_option_describe(o, 0, what, sizeof what);
    return regc_error(REGC_ERR_ARG, "%s: expected %s, got \"%s\"", o->flag, what, text);
}

int regc_option_set_text(const regc_option *o, regc_train_settings *s, const char *text)
{
    void *f = regc_option_field(o, s);
    if (o->type == OPT_FLAG) {
        if (text)
            return regc_error(REGC_ERR_ARG, "%s takes no value", o->flag);
        *(int *)f = 1;
        return REGC_OK;
    }
    if (!text)
        return regc_error(REGC_ERR_ARG, "%s: missing value", o->flag);
    switch (o->type) {
    case OPT_STRING:
        if (!text[0])
            return bad_value(o, text);
        *(const char **)f = text;
        return REGC_OK;
    case OPT_INT: {
        int64_t v;
        if (regc_text_to_i64(text, (int64_t)o->min, (int64_t)o->max, &v))
            return bad_value(o, text);
        regc_option_store_int(o, s, v);
        return REGC_OK;
    }
    case OPT_SEED: return regc_text_to_u64(text, (uint64_t *)f) ? bad_value(o, text) : REGC_OK;
    case OPT_FLOAT: {
        float v;
        int rc = regc_text_to_float(text, o->min > 0, &v);
        if (rc == -2)
            return regc_error(REGC_ERR_ARG, "%s: %s is too small for a float", o->flag, text);
        if (rc || (o->max > 0 && !(v <= o->max)))
            return bad_value(o, text);
        /* a double field keeps the decimal as written (a ratio times the
         * steps must round up as the user's arithmetic does) */
        if (o->size == sizeof(double))
            *(double *)f = strtod(text, NULL);
        else
            *(float *)f = v;
        return REGC_OK;
    }
    case OPT_SWITCH:
        if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0)
            return bad_value(o, text);
        *(int *)f = !strcmp(text, "on");
        return REGC_OK;
    case OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(text, o->choices[i])) {
                *(int *)f = i;
                return REGC_OK;
            }
        return bad_value(o, text);
    case OPT_BACKEND:
        if (!backend_name_ok(text))
            return bad_value(o, text);
        *(const char **)f = text;
        return REGC_OK;
    case OPT_PASSES:
    case OPT_REPLANS: {
        char why[160];
        if (o->type == OPT_PASSES ? regc_passes_from_text(text, f, why, sizeof why)
                                  : regc_replans_from_text(text, f, why, sizeof why))
            return regc_error(REGC_ERR_ARG, "%s: %s, got \"%s\"", o->flag, why, text);
        return REGC_OK;
    }
    case OPT_MODULES: {
        regc_lora_targets *t = f;
        if (!text[0] || strlen(text) >= sizeof t->text || strspn(text, ",") == strlen(text))
            return bad_value(o, text);
        snprintf(t->text, sizeof t->text, "%s", text);
        t->regex = 0;
        return REGC_OK;
    }
    case OPT_BETAS: /* file keys only: no row of these kinds has a flag */
    case OPT_INERT:
    case OPT_NEUTRAL: return regc_error(REGC_ERR_ARG, "%s: not a command-line option", o->flag);
    case OPT_FLAG: break;
    }
    return REGC_OK;
}
