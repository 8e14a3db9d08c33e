/* options_usage.c — `regc train --help`: the table (options.c) as usage
 * text, each row with its flag, key, other spellings, default and help,
 * then the keys that change nothing grouped by reason. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

/* ---------------------------------------------------------------- usage */

#define USAGE_COL 25   /* where help text starts */
#define USAGE_WIDTH 92 /* and where it wraps */

/* Words of text from column `col` on, wrapping at USAGE_WIDTH. */
static void write_wrapped(FILE *f, const char *text, int col, int indent)
{
    int start = col;
    while (*text) {
        size_t word = strcspn(text, " ");
        if (col > start && col + 1 + (int)word > USAGE_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = start = indent;
        } else if (col > start) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)word, text);
        col += (int)word;
        text += word;
        text += strspn(text, " ");
    }
}

/* The shortest decimal that reads back as v (a float field when is_float). */
static void shortest(char *buf, size_t cap, double v, int is_float)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_float ? (float)back == (float)v : back == v)
            return;
    }
}

void regc_option_value_text(const regc_option *o, const regc_train_settings *d, char *buf,
                            size_t cap)
{
    const void *f = (const char *)d + o->offset;
    int64_t v;
    buf[0] = '\0';
    switch (o->type) {
    case OPT_INT:
        if (o->size == sizeof(int64_t))
            memcpy(&v, f, sizeof v);
        else
            v = *(const int *)f;
        snprintf(buf, cap, "%" PRId64, v / (o->scale ? o->scale : 1));
        break;
    case OPT_SEED: snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)f); break;
    case OPT_FLOAT:
        if (o->size == sizeof(double))
            shortest(buf, cap, *(const double *)f, 0);
        else
            shortest(buf, cap, (double)*(const float *)f, 1);
        break;
    case OPT_BETAS: {
        char a[32], b[32];
        shortest(a, sizeof a, (double)((const float *)f)[0], 1);
        shortest(b, sizeof b, (double)((const float *)f)[1], 1);
        snprintf(buf, cap, "[%s, %s]", a, b);
        break;
    }
    case OPT_FLAG:
    case OPT_SWITCH: snprintf(buf, cap, "%s", *(const int *)f ? "on" : "off"); break;
    case OPT_CHOICE: snprintf(buf, cap, "%s", o->choices[*(const int *)f]); break;
    case OPT_STRING:
    case OPT_BACKEND:
        snprintf(buf, cap, "%s", *(const char *const *)f ? *(const char *const *)f : "none");
        break;
    case OPT_PASSES: regc_passes_to_text(f, buf, cap); break;
    case OPT_REPLANS: snprintf(buf, cap, "%d steps", ((const regc_replan_list *)f)->n); break;
    case OPT_MODULES: snprintf(buf, cap, "%.48s", ((const regc_lora_targets *)f)->text); break;
    case OPT_INERT:
    case OPT_NEUTRAL: break;
    }
}

/* Where the usage lists a row: 0 the training options, 1 LoRA, 2 QLoRA,
 * 3 compile, 4 several processes. */
static int usage_group(const regc_option *o)
{
    if (!strcmp(o->section, "lora"))
        return 1;
    if (!strcmp(o->section, "quantization"))
        return 2;
    if (!strcmp(o->section, "compile"))
        return 3;
    if (!strncmp(o->section, "zero_optimization", 17))
        return 4;
    return 0;
}

/* "(also: a, b)" after a row's help: its other spellings in a file. */
static size_t add_aliases(const regc_option *o, char *help, size_t n, size_t cap)
{
    for (int k = 0; k < REGC_ALIAS_MAX && o->alias[k].path && n < cap; k++)
        n += (size_t)snprintf(help + n, cap - n, "%s%s", k ? ", " : " (also: ", o->alias[k].path);
    if (o->alias[0].path && n < cap)
        n += (size_t)snprintf(help + n, cap - n, ")");
    return n;
}

static void write_row(FILE *f, const regc_option *o, const regc_train_settings *d)
{
    char head[192], help[1536];
    if (o->flag)
        snprintf(head, sizeof head, "  %s%s%s", o->flag, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
    else
        snprintf(head, sizeof head, "  %s%s%s", o->section, o->section[0] ? "." : "", o->key);
    fputs(head, f);
    int col = (int)strlen(head);
    if (col + 1 > USAGE_COL) {
        fprintf(f, "\n%*s", USAGE_COL, "");
        col = USAGE_COL;
    } else {
        fprintf(f, "%*s", USAGE_COL - col, "");
        col = USAGE_COL;
    }
    size_t n = (size_t)snprintf(help, sizeof help, "%s", o->help);
    if (o->flags & OPT_LIST_PRESETS)
        for (int i = 0; regc_model_preset_name(i) && n < sizeof help; i++)
            n += (size_t)snprintf(help + n, sizeof help - n, " %s", regc_model_preset_name(i));
    /* the file's key, where it is not the flag with underscores */
    char dashed[64];
    snprintf(dashed, sizeof dashed, "--%s", o->key ? o->key : "");
    for (char *c = dashed; *c; c++)
        *c = *c == '_' ? '-' : *c;
    if (o->flag && o->key && strcmp(dashed, o->flag) != 0 && n < sizeof help)
        n += (size_t)snprintf(help + n, sizeof help - n, " (%s.%s)", o->section, o->key);
    n = add_aliases(o, help, n, sizeof help);
    if ((o->flags & OPT_SHOW_DEFAULT) && n < sizeof help) {
        char v[64];
        regc_option_value_text(o, d, v, sizeof v);
        snprintf(help + n, sizeof help - n, " (default %s)", v);
    }
    write_wrapped(f, help, col, USAGE_COL);
    fputc('\n', f);
}

/* The keys that change nothing, grouped by their reason: "a, b, c: why". */
static void write_inert(FILE *f, opt_type type)
{
    char done[REGC_OPTION_MAX] = {0};
    for (int i = 0; i < regc_option_count; i++) {
        const regc_option *o = &regc_option_table[i];
        if (o->type != type || done[i])
            continue;
        char text[4096];
        size_t n = 0;
        for (int j = i; j < regc_option_count && n < sizeof text; j++) {
            const regc_option *p = &regc_option_table[j];
            if (p->type != type || done[j] || strcmp(p->help, o->help) != 0)
                continue;
            done[j] = 1;
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%s%s%s", n ? ", " : "", p->section,
                                  p->section[0] ? "." : "", p->key);
            if (type == OPT_NEUTRAL && n < sizeof text)
                n += (size_t)snprintf(text + n, sizeof text - n, " %s", p->values);
        }
        if (n < sizeof text)
            snprintf(text + n, sizeof text - n, ": %s", o->help);
        fputs("  ", f);
        write_wrapped(f, text, 2, 4);
        fputc('\n', f);
    }
}

void regc_option_write_usage(FILE *f)
{
    static const char *const groups[] = {
        "options:\n", "\nLoRA (PEFT's; the config file's \"lora\" keys):\n",
        "\nQLoRA (Transformers' BitsAndBytesConfig; the config file's \"quantization\" keys):\n",
        "\ncompile options (the config file's \"compile\" keys):\n",
        ("\nseveral processes (mpirun -np N regc train ...; the config file's "
         "\"zero_optimization\" keys):\n")};
    regc_train_settings d;
    regc_train_settings_default(&d);
    for (int g = 0; g < 5; g++) {
        fputs(groups[g], f);
        for (int i = 0; i < regc_option_count; i++)
            if (regc_option_table[i].flag && usage_group(&regc_option_table[i]) == g)
                write_row(f, &regc_option_table[i], &d);
    }
    fprintf(f, "\nconfig-file keys without a flag:\n");
    for (int i = 0; i < regc_option_count; i++) {
        const regc_option *o = &regc_option_table[i];
        if (!o->flag && o->key && o->type != OPT_INERT && o->type != OPT_NEUTRAL)
            write_row(f, o, &d);
    }
    fprintf(f, "\nDeepSpeed's and Transformers' keys that change nothing in regc, accepted:\n");
    write_inert(f, OPT_INERT);
    fprintf(f, "\nDeepSpeed's and Transformers' keys accepted at the values shown, any other "
               "refused:\n");
    write_inert(f, OPT_NEUTRAL);
}
