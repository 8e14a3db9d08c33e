/* settings.c — the settings after the files and the flags: where each
 * value came from, what follows from the rest (DeepSpeed's batch sizes,
 * epochs as steps), and `regc train --print-config`'s JSON.
 *
 * DeepSpeed's train_batch_size, train_micro_batch_size_per_gpu and
 * gradient_accumulation_steps are resolved as DeepSpeed's config does
 * (_set_batch_related_parameters): all three given are checked against
 * each other and the rank count, two given determine the third, and
 * train_batch_size alone takes one micro-batch per step. "Given" is a
 * file's or a flag's value; regc's defaults fill in what DeepSpeed would
 * refuse to guess. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

regc_origins *regc_origins_new(void) { return calloc(1, sizeof(regc_origins)); }

void regc_origins_free(regc_origins *o) { free(o); }

void regc_origins_flag(regc_origins *from, const regc_option *o, const char *flag)
{
    if (!from || !o->key || !o->size)
        return;
    const int k = (int)(o - regc_option_table);
    from->kind[k] = REGC_FROM_FLAG;
    from->key[k] = flag ? flag : o->flag;
    from->file[k] = NULL;
    from->ds_default[k] = 0;
}

static int row_of(const char *section, const char *key)
{
    return (int)(regc_option_by_key(section, key) - regc_option_table);
}

/* Did a file or a flag give row k? */
static int given(const regc_origins *from, int k)
{
    return from->kind[k] == REGC_FROM_FILE || from->kind[k] == REGC_FROM_FLAG;
}

/* How a message names row k: as its file spells it, its flag, or its key. */
static const char *named(const regc_origins *from, int k, char *buf, size_t cap)
{
    const regc_option *o = &regc_option_table[k];
    if (from->kind[k] == REGC_FROM_FILE)
        snprintf(buf, cap, "%s: %s", from->file[k], from->key[k]);
    else if (from->kind[k] == REGC_FROM_FLAG)
        snprintf(buf, cap, "%s", from->key[k]);
    else
        snprintf(buf, cap, "%s%s%s", o->section, o->section[0] ? "." : "", o->key);
    return buf;
}

static void derive(regc_origins *from, int k, const char *fmt, long long a, long long b,
                   long long c)
{
    from->kind[k] = REGC_FROM_DERIVED;
    snprintf(from->note[k], sizeof from->note[k], fmt, a, b, c);
}

/* DeepSpeed's rule for the global batch over `ranks` processes. */
static int resolve_batch(regc_train_settings *s, regc_origins *from, int ranks)
{
    const int kt = row_of("train", "train_batch_size"), km = row_of("train", "batch"),
              kg = row_of("train", "gradient_accumulation_steps");
    const int has_t = given(from, kt) && s->train_batch_size > 0, has_m = given(from, km),
              has_g = given(from, kg);
    const int64_t t = s->train_batch_size, m = s->train.batch, g = s->train.grad_accum, n = ranks;
    char a[320], b[320], c[320];
    if (!has_t) {
        s->train_batch_size = m * g * n;
        derive(from, kt, "train.batch %lld x gradient_accumulation_steps %lld x %lld ranks",
               (long long)m, (long long)g, (long long)n);
        return REGC_OK;
    }
    if (has_m && has_g) {
        if (t == m * g * n)
            return REGC_OK;
        return regc_error(REGC_ERR_ARG,
                          "%s: %lld is not %s %lld x %s %lld x %lld ranks (%lld), as DeepSpeed "
                          "requires",
                          named(from, kt, a, sizeof a), (long long)t, named(from, km, b, sizeof b),
                          (long long)m, named(from, kg, c, sizeof c), (long long)g, (long long)n,
                          (long long)(m * g * n));
    }
    /* the missing one (accumulation, else the micro-batch) from the other two */
    const int derive_g = has_m;
    const int64_t per = derive_g ? m * n : g * n;
    if (t % per != 0)
        return regc_error(REGC_ERR_ARG,
                          "%s: %lld is not a multiple of %s %lld x %lld ranks, so %s cannot be "
                          "derived from it",
                          named(from, kt, a, sizeof a), (long long)t,
                          named(from, derive_g ? km : kg, b, sizeof b),
                          (long long)(derive_g ? m : g), (long long)n,
                          derive_g ? "gradient_accumulation_steps" : "the micro-batch");
    if (derive_g) {
        if (t / per > (1 << 20))
            return regc_error(REGC_ERR_ARG, "%s: %lld needs %lld accumulation steps (at most %d)",
                              named(from, kt, a, sizeof a), (long long)t, (long long)(t / per),
                              1 << 20);
        s->train.grad_accum = (int)(t / per);
        derive(from, kg, "train_batch_size %lld / (train.batch %lld x %lld ranks)", (long long)t,
               (long long)m, (long long)n);
    } else {
        s->train.batch = t / per;
        derive(from, km, "train_batch_size %lld / (gradient_accumulation_steps %lld x %lld ranks)",
               (long long)t, (long long)g, (long long)n);
    }
    return REGC_OK;
}

int regc_settings_resolve(regc_train_settings *s, regc_origins *from, int ranks,
                          const regc_model *m)
{
    if (!from) { /* the rules read what was given: without a record, nothing was */
        regc_origins *none = regc_origins_new();
        int rc = none ? regc_settings_resolve(s, none, ranks, m)
                      : regc_error(REGC_ERR_MEMORY, "out of memory");
        regc_origins_free(none);
        return rc;
    }
    char a[320];
    int rc = resolve_batch(s, from, ranks > 0 ? ranks : 1);
    if (rc)
        return rc;
    const int kss = row_of("train", "save_strategy"), ks = row_of("train", "save_steps");
    if (s->save_strategy == 1 && s->train.save_steps > 0) { /* "no": no checkpoints */
        s->train.save_steps = 0;
        from->kind[ks] = REGC_FROM_DERIVED;
        snprintf(from->note[ks], sizeof from->note[ks], "0 by %.300s \"no\"",
                 named(from, kss, a, sizeof a));
    }
    const int kz = row_of("zero_optimization", "stage");
    if (s->train.zero_stage == 1 || s->train.zero_stage == 2)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: %d is not built (0 or 3; stage 3 shards all that stage %d does)",
                          named(from, kz, a, sizeof a), s->train.zero_stage, s->train.zero_stage);
    /* Transformers' Trainer makes its AdamW with biases and norm weights in
     * a group of weight_decay 0; with a DeepSpeed optimizer section,
     * DeepSpeed makes the optimizer from it, over every parameter */
    const int kwp = row_of("train", "weight_decay_params"), kwd = row_of("train", "weight_decay");
    if (!given(from, kwp) && from->kind[kwd] == REGC_FROM_FILE &&
        !strcmp(from->key[kwd], "weight_decay") && !given(from, row_of("optimizer", "type"))) {
        s->train.weight_decay_params = REGC_DECAY_NOT_BIAS_NORM;
        from->kind[kwp] = REGC_FROM_DERIVED;
        snprintf(from->note[kwp], sizeof from->note[kwp],
                 "%.300s is Transformers', whose Trainer decays neither biases nor norm weights",
                 named(from, kwd, a, sizeof a));
    }
    /* the order's seed: train.seed unless given; without shuffle there is
     * no order for it to draw */
    const int ksh = row_of("train", "shuffle"), kds = row_of("train", "data_seed");
    if (given(from, kds) && !s->train.shuffle)
        return regc_error(REGC_ERR_ARG,
                          "%s: seeds the order of train.shuffle, which is off (llm.c's order, the "
                          "same every run): give train.shuffle true, or leave it out",
                          named(from, kds, a, sizeof a));
    if (s->train.shuffle && !given(from, kds)) {
        s->train.data_seed = s->train.seed;
        from->kind[kds] = REGC_FROM_DERIVED;
        snprintf(from->note[kds], sizeof from->note[kds], "train.seed, as %.300s is on",
                 named(from, ksh, a, sizeof a));
    }
    /* DeepSpeed's Adam without adam_w_mode adds the decay to the gradient */
    const int kw = row_of("optimizer.params", "adam_w_mode");
    if (s->optimizer_type == 1 && !s->adam_w_mode && s->train.weight_decay > 0.0f)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: false makes Adam add weight_decay %g to the gradient (L2 "
                          "regularisation), which regc does not do: AdamW (true), or weight_decay "
                          "0, where the two agree",
                          named(from, kw, a, sizeof a), (double)s->train.weight_decay);
    const int ka = row_of("train", "average_tokens_across_devices");
    if (!s->average_tokens && ranks > 1 && s->train.loss_mask)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: false averages each rank's own targets, which differs from regc's "
                          "mean over the global batch's when a loss mask gives the ranks "
                          "different counts",
                          named(from, ka, a, sizeof a));
    /* epochs: Transformers' max_steps, given, overrides them */
    const int ke = row_of("train", "num_train_epochs"), kst = row_of("train", "steps");
    if (s->train.num_train_epochs > 0.0 && given(from, kst)) {
        s->train.num_train_epochs = 0.0;
        from->kind[ke] = REGC_FROM_DERIVED;
        snprintf(from->note[ke], sizeof from->note[ke],
                 "not applied: %.250s gives the steps (as max_steps overrides num_train_epochs)",
                 named(from, kst, a, sizeof a));
    } else if (s->train.num_train_epochs > 0.0) {
        if ((rc = regc_train_resolve_epochs(&s->train, m, ranks > 0 ? ranks : 1)))
            return rc;
        from->kind[kst] = REGC_FROM_DERIVED;
        snprintf(from->note[kst], sizeof from->note[kst],
                 "num_train_epochs %g over %.200s (%d ranks x batch %lld x accumulation %d)",
                 s->train.num_train_epochs,
                 s->train.data_path ? s->train.data_path : "the built-in corpus", ranks,
                 (long long)s->train.batch, s->train.grad_accum);
    }
    return REGC_OK;
}

/* ---------------------------------------------------------------- printing */

/* A list of passes as the file writes it: [name or [name, budget_mb]]. */
static cJSON *passes_json(const regc_pass_list *l)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < l->n; i++) {
        if (l->pass[i].budget_bytes > 0) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(l->pass[i].name));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)(l->pass[i].budget_bytes >> 20)));
            cJSON_AddItemToArray(arr, pair);
        } else {
            cJSON_AddItemToArray(arr, cJSON_CreateString(l->pass[i].name));
        }
    }
    return arr;
}

/* Row o's value in s as JSON. */
static cJSON *value_json(const regc_option *o, const regc_train_settings *s)
{
    const void *f = (const char *)s + o->offset;
    char text[1100];
    switch (o->type) {
    case OPT_INT:
    case OPT_FLOAT:
        /* below its range: the option's "unset" (regc decides, or the default
         * its help names) */
        regc_option_value_text(o, s, text, sizeof text);
        return strtod(text, NULL) < (o->type == OPT_INT ? o->min : 0.0) ? cJSON_CreateNull()
                                                                        : cJSON_CreateRaw(text);
    case OPT_SEED: { /* a JSON number carries up to 2^53 exactly; beyond, the digits */
        const uint64_t v = *(const uint64_t *)f;
        snprintf(text, sizeof text, v <= (UINT64_C(1) << 53) - 1 ? "%llu" : "\"%llu\"",
                 (unsigned long long)v);
        return cJSON_CreateRaw(text);
    }
    case OPT_FLAG:
    case OPT_SWITCH: return cJSON_CreateBool(*(const int *)f);
    case OPT_CHOICE: return cJSON_CreateString(o->choices[*(const int *)f]);
    case OPT_STRING:
    case OPT_BACKEND: {
        const char *v = *(const char *const *)f;
        return v ? cJSON_CreateString(v) : cJSON_CreateNull();
    }
    case OPT_BETAS: {
        float b[2];
        memcpy(b, f, sizeof b);
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; arr && i < 2; i++) {
            regc_option row = *o;
            row.type = OPT_FLOAT;
            row.offset = o->offset + (size_t)i * sizeof(float);
            row.size = sizeof(float);
            regc_option_value_text(&row, s, text, sizeof text);
            cJSON_AddItemToArray(arr, cJSON_CreateRaw(text));
        }
        return arr;
    }
    case OPT_PASSES: return passes_json(f);
    case OPT_REPLANS: {
        const regc_replan_list *l = f;
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; arr && i < l->n; i++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)l->at[i].step));
            cJSON_AddItemToArray(pair, passes_json(&l->at[i].passes));
            cJSON_AddItemToArray(arr, pair);
        }
        return arr;
    }
    case OPT_MODULES: {
        const regc_lora_targets *t = f;
        if (t->regex || !t->text[0] || !strcmp(t->text, "all-linear"))
            return t->text[0] ? cJSON_CreateString(t->text) : cJSON_CreateNull();
        cJSON *arr = cJSON_CreateArray();
        for (const char *p = t->text; arr && *p;) {
            size_t n = strcspn(p, ",");
            snprintf(text, sizeof text, "%.*s", (int)n, p);
            if (n)
                cJSON_AddItemToArray(arr, cJSON_CreateString(text));
            p += n + (p[n] == ',');
        }
        return arr;
    }
    case OPT_INERT:
    case OPT_NEUTRAL: break;
    }
    return cJSON_CreateNull();
}

/* The object at a section path ("zero_optimization.offload_optimizer"),
 * made as needed. */
static cJSON *section_of(cJSON *root, const char *section)
{
    cJSON *at = root;
    char name[128];
    for (const char *p = section; at && *p;) {
        size_t n = strcspn(p, ".");
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        cJSON *next = cJSON_GetObjectItemCaseSensitive(at, name);
        if (!next && !(next = cJSON_AddObjectToObject(at, name)))
            return NULL;
        at = next;
        p += n + (p[n] == '.');
    }
    return at;
}

/* The sections indented, one option a line: {"value": ..., "from": ...}. */
static int write_object(FILE *f, const cJSON *obj, int depth)
{
    int ok = fputs("{", f) != EOF;
    for (const cJSON *it = obj->child; ok && it; it = it->next) {
        cJSON *name = cJSON_CreateString(it->string);
        char *quoted = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        ok = quoted &&
             fprintf(f, "%s\n%*s%s: ", it == obj->child ? "" : ",", 2 * depth + 2, "", quoted) > 0;
        free(quoted);
        const cJSON *value = cJSON_GetObjectItemCaseSensitive(it, "value");
        if (ok && value) {
            char *v = cJSON_PrintUnformatted(value);
            char *w = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(it, "from"));
            ok = v && w && fprintf(f, "{\"value\": %s, \"from\": %s}", v, w) > 0;
            free(v), free(w);
        } else if (ok) {
            ok = write_object(f, it, depth + 1);
        }
    }
    return ok && fprintf(f, "\n%*s}", 2 * depth, "") > 0;
}

int regc_settings_print(FILE *f, const regc_train_settings *s, const regc_origins *from)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    for (int k = 0; ok && k < regc_option_count; k++) {
        const regc_option *o = &regc_option_table[k];
        if (!o->key || !o->size || o->type == OPT_INERT || o->type == OPT_NEUTRAL)
            continue;
        cJSON *sec = section_of(root, o->section), *item = cJSON_CreateObject();
        ok = sec && item && cJSON_AddItemToObject(sec, o->key, item);
        if (!ok) {
            cJSON_Delete(item);
            break;
        }
        cJSON *v = value_json(o, s);
        ok = v && cJSON_AddItemToObject(item, "value", v);
        char where[512];
        const int kind = from ? from->kind[k] : REGC_FROM_DEFAULT;
        if (kind == REGC_FROM_FILE)
            snprintf(where, sizeof where, "%s: %s%s", from->file[k], from->key[k],
                     from->ds_default[k] ? " (left out: DeepSpeed's default)" : "");
        else if (kind == REGC_FROM_AUTO)
            snprintf(where, sizeof where, "default (\"auto\" in %s: %s)", from->file[k],
                     from->key[k]);
        else if (kind == REGC_FROM_FLAG)
            snprintf(where, sizeof where, "flag %s", from->key[k]);
        else if (kind == REGC_FROM_DERIVED)
            snprintf(where, sizeof where, "%s", from->note[k]);
        else
            snprintf(where, sizeof where, "default");
        ok = ok && cJSON_AddStringToObject(item, "from", where);
    }
    ok = ok && write_object(f, root, 0) && fputc('\n', f) != EOF && fflush(f) == 0;
    cJSON_Delete(root);
    return ok ? REGC_OK : regc_error(REGC_ERR_IO, "writing the configuration failed");
}
