/* rope.c — rotary position embeddings as Hugging Face Transformers (5.x,
 * modeling_rope_utils.py) configures and initialises them: reading either
 * spelling of the RoPE options from config.json, refusing what regc does
 * not apply, and computing the inverse frequencies and the factor on
 * cos/sin.
 *
 * Spellings. Transformers 5 writes "rope_parameters": {"rope_type", "rope_theta", ...};
 * older configs give a top-level "rope_theta" and "rope_scaling": {"rope_type" or
 * "type", ...}. Transformers reads rope_scaling when it is given, takes
 * rope_theta from the dictionary before the top level (default the
 * architecture's: 10000 for most, SmolLM3's 2,000,000) and
 * original_max_position_embeddings from the dictionary (default
 * max_position_embeddings). regc reads the same, refusing the ambiguous
 * cases Transformers resolves silently (both dictionaries, two different
 * thetas, "type" and "rope_type" that disagree).
 *
 * Types applied: default, linear, llama3, yarn (yarn's attention factor
 * multiplies cos and sin), dynamic and longrope. Those two depend on the
 * length trained: Transformers' forward computes dynamic's frequencies
 * again (a larger base) once positions reach past max_position_embeddings,
 * and switches longrope from its short factors to its long ones past the
 * original length; a training step sees positions 0..T-1, so regc computes
 * them for T (regc_rope_inv_freq's seq), as that forward would. Refused by
 * name: every other rope_type (proportional, ...), partial_rotary_factor
 * other than 1 where the family rotates the whole head (Llama's lineage),
 * and any key of the dictionary the type does not use.
 *
 * Partial rotation (Phi): the first int(head_dim * partial_rotary_factor)
 * dimensions of a head rotate, the rest pass through; every type's
 * frequencies are those of a head of that many dimensions. The factor is
 * the dictionary's, else the top level's, else the family's default.
 *
 * Arithmetic. Transformers computes inv_freq on the CPU in float32 torch
 * ops, Python scalars (theta, factor, ...) rounded to float32 where they
 * meet a tensor, and `a / t` as reciprocal(t) * a; regc repeats every such
 * op in float32 in the same order (rope_f32 below rounds each step), and
 * the Python-side scalars (yarn's correction range, its attention factor)
 * in double as Python does. The one op regc cannot repeat bit for bit is
 * torch's float32 pow: its vectorised body is Sleef's powf (within 1 ulp)
 * and its tail libm's, so torch's own results depend on the CPU and on the
 * position in the vector. regc rounds the exact power once (computed in
 * double), which is torch's result in about 98.5% of entries and 1 ulp
 * from it otherwise (tests/test_rope_config.c measures it against
 * tests/data/rope_reference.json). On a GPU torch divides by a scalar as a
 * multiplication by its reciprocal; the initialisers run on the CPU, but
 * dynamic's and longrope's computing again in the forward runs on the
 * model's device, where dynamic's division by max_position_embeddings may
 * then be 1 ulp from the CPU's (regc computes as the CPU does). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_internal.h"

#define ROPE_PI 3.141592653589793 /* Python's math.pi */

static const char *const rope_type_names[] = {
    [REGC_ROPE_DEFAULT] = "default", [REGC_ROPE_LINEAR] = "linear",
    [REGC_ROPE_LLAMA3] = "llama3",   [REGC_ROPE_YARN] = "yarn",
    [REGC_ROPE_DYNAMIC] = "dynamic", [REGC_ROPE_LONGROPE] = "longrope",
};
#define N_ROPE_TYPES (int)(sizeof rope_type_names / sizeof rope_type_names[0])

/* The keys each type reads from the dictionary, beyond the common ones. */
static const char *const rope_keys_common[] = {"rope_type", "type", "rope_theta",
                                               "partial_rotary_factor", NULL};
static const char *const rope_keys_type[][9] = {
    [REGC_ROPE_DEFAULT] = {NULL},
    [REGC_ROPE_LINEAR] = {"factor", NULL},
    [REGC_ROPE_LLAMA3] = {"factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings", NULL},
    [REGC_ROPE_YARN] = {"factor", "original_max_position_embeddings", "attention_factor",
                        "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", NULL},
    [REGC_ROPE_DYNAMIC] = {"factor", NULL},
    [REGC_ROPE_LONGROPE] = {"factor", "original_max_position_embeddings", "attention_factor",
                            "long_factor", "short_factor", NULL},
};

static int rope_key_known(const char *const *keys, const char *key)
{
    for (int i = 0; keys[i]; i++)
        if (strcmp(keys[i], key) == 0)
            return 1;
    return 0;
}

/* dict[key] as a number: *out, or *present = 0 when absent or null. */
static int rope_number(const cJSON *dict, const char *path, const char *dname, const char *key,
                       int required, double *out, int *present)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(dict, key);
    *present = it && !cJSON_IsNull(it);
    if (!*present) {
        if (required)
            return regc_error(REGC_ERR_FORMAT, "%s: missing required key \"%s.%s\"", path, dname,
                              key);
        return REGC_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s.%s\" must be a finite number", path, dname,
                          key);
    *out = it->valuedouble;
    return REGC_OK;
}

static int rope_positive(const char *path, const char *dname, const char *key, double v)
{
    if (!((float)v > 0.0f) || isinf((float)v))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s.%s\" is %g, must be a positive float32",
                          path, dname, key, v);
    return REGC_OK;
}

/* dict[key]: a list of finite numbers, at most REGC_ROPE_MAX_FACTORS. */
static int rope_list(const cJSON *d, const char *path, const char *dn, const char *key, double *out,
                     int *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, key);
    if (!cJSON_IsArray(a))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s.%s\" must be a list of numbers", path, dn,
                          key);
    *n = 0;
    for (const cJSON *x = a->child; x; x = x->next) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
            return regc_error(REGC_ERR_FORMAT, "%s: key \"%s.%s\" must be a list of numbers", path,
                              dn, key);
        if (*n == REGC_ROPE_MAX_FACTORS)
            return regc_error(REGC_ERR_UNSUPPORTED, "%s: key \"%s.%s\" has more than %d values",
                              path, dn, key, REGC_ROPE_MAX_FACTORS);
        out[(*n)++] = x->valuedouble;
    }
    return REGC_OK;
}

/* longrope's keys beyond factor and the original length: the two lists,
 * one factor per frequency, and the attention factor. */
static int rope_parse_longrope(const cJSON *d, const char *path, const char *dn, regc_rope *r)
{
    int n_long = 0, n_short = 0, has, rc;
    if ((rc = rope_positive(path, dn, "factor", r->factor)) < 0 ||
        (rc = rope_list(d, path, dn, "long_factor", r->long_factor, &n_long)) < 0 ||
        (rc = rope_list(d, path, dn, "short_factor", r->short_factor, &n_short)) < 0 ||
        (rc = rope_number(d, path, dn, "attention_factor", 0, &r->attention_factor, &has)) < 0)
        return rc;
    if (has && (rc = rope_positive(path, dn, "attention_factor", r->attention_factor)) < 0)
        return rc;
    if (!has)
        r->attention_factor = 0.0; /* derived from factor and the original length */
    if (n_long != n_short)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: keys \"%s.long_factor\" (%d values) and \"%s.short_factor\" (%d) "
                          "differ in length",
                          path, dn, n_long, dn, n_short);
    r->n_factors = n_long;
    return REGC_OK;
}

/* The type's own keys, checked and stored in r. */
static int rope_parse_type(const cJSON *d, const char *path, const char *dn, int64_t max_pos,
                           regc_rope *r)
{
    int has, has_factor, rc;
    double v = 0.0;
    if (r->type == REGC_ROPE_DEFAULT)
        return REGC_OK;
    /* yarn and longrope derive a missing factor (max_position_embeddings
     * over the original length); the others need it */
    const int derived = r->type == REGC_ROPE_YARN || r->type == REGC_ROPE_LONGROPE;
    if ((rc = rope_number(d, path, dn, "factor", !derived, &r->factor, &has_factor)) < 0)
        return rc;
    if (r->type == REGC_ROPE_LINEAR || r->type == REGC_ROPE_DYNAMIC)
        return rope_positive(path, dn, "factor", r->factor);
    if ((rc = rope_number(d, path, dn, "original_max_position_embeddings", 0, &v, &has)) < 0)
        return rc;
    r->original_max_pos = has ? (int64_t)v : max_pos;
    if (has && !(v >= 1.0 && v <= 2147483647.0 && v == (double)(int64_t)v))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: key \"%s.original_max_position_embeddings\" is %g, must be a "
                          "positive integer",
                          path, dn, v);
    if (r->type == REGC_ROPE_LLAMA3) {
        if ((rc = rope_positive(path, dn, "factor", r->factor)) < 0 ||
            (rc = rope_number(d, path, dn, "low_freq_factor", 1, &r->low_freq_factor, &has)) < 0 ||
            (rc = rope_number(d, path, dn, "high_freq_factor", 1, &r->high_freq_factor, &has)) <
                0 ||
            (rc = rope_positive(path, dn, "low_freq_factor", r->low_freq_factor)) < 0)
            return rc;
        /* the smoothing divides by their difference */
        if (!((float)(r->high_freq_factor - r->low_freq_factor) > 0.0f))
            return regc_error(REGC_ERR_FORMAT,
                              "%s: key \"%s.high_freq_factor\" is %g, must exceed "
                              "low_freq_factor %g",
                              path, dn, r->high_freq_factor, r->low_freq_factor);
        return REGC_OK;
    }
    if (!has_factor)
        r->factor = (double)max_pos / (double)r->original_max_pos;
    if (r->type == REGC_ROPE_LONGROPE)
        return rope_parse_longrope(d, path, dn, r);
    /* yarn */
    if ((rc = rope_positive(path, dn, "factor", r->factor)) < 0 ||
        (rc = rope_number(d, path, dn, "attention_factor", 0, &r->attention_factor, &has)) < 0)
        return rc;
    if (has && (rc = rope_positive(path, dn, "attention_factor", r->attention_factor)) < 0)
        return rc;
    if (!has)
        r->attention_factor = 0.0; /* derived from factor and mscale */
    /* Transformers takes `value or default`: a 0 means the default too */
    r->beta_fast = 32.0, r->beta_slow = 1.0;
    if ((rc = rope_number(d, path, dn, "beta_fast", 0, &v, &has)) < 0)
        return rc;
    if (has && v != 0.0)
        r->beta_fast = v;
    if ((rc = rope_number(d, path, dn, "beta_slow", 0, &v, &has)) < 0)
        return rc;
    if (has && v != 0.0)
        r->beta_slow = v;
    if (!(r->beta_fast > 0.0) || !(r->beta_slow > 0.0))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: keys \"%s.beta_fast\" and \"%s.beta_slow\" must "
                          "be positive",
                          path, dn, dn);
    r->mscale = r->mscale_all_dim = 0.0;
    if ((rc = rope_number(d, path, dn, "mscale", 0, &v, &has)) < 0)
        return rc;
    r->mscale = has ? v : 0.0;
    if ((rc = rope_number(d, path, dn, "mscale_all_dim", 0, &v, &has)) < 0)
        return rc;
    r->mscale_all_dim = has ? v : 0.0;
    /* .get("truncate", True): absent truncates, null does not */
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(d, "truncate");
    if (t && !cJSON_IsNull(t) && !cJSON_IsBool(t))
        return regc_error(REGC_ERR_FORMAT, "%s: key \"%s.truncate\" must be true or false", path,
                          dn);
    r->truncate = !t || cJSON_IsTrue(t);
    return REGC_OK;
}

/* partial_rotary_factor at the top level and in the dictionary d (dn):
 * refused unless 1 where the family rotates whole heads (partial 0), else
 * a share in (0, 1], the dictionary's before the top level's (two that
 * differ refused), the family's default when neither is given. */
static int rope_parse_partial(const cJSON *root, const cJSON *d, const char *path, const char *dn,
                              double partial, regc_rope *r)
{
    static const char *const key = "partial_rotary_factor";
    static const char *const in_dict[2] = {"rope_parameters.partial_rotary_factor",
                                           "rope_scaling.partial_rotary_factor"};
    r->partial = partial > 0.0 ? partial : 1.0;
    r->partial_key = partial > 0.0;
    r->partial_name = NULL;
    int given = 0;
    for (int i = 0; i < 2; i++) {
        const cJSON *where = i ? d : root;
        const cJSON *p = where ? cJSON_GetObjectItemCaseSensitive(where, key) : NULL;
        const char *dot = i ? "." : "", *in = i ? dn : "";
        if (p && cJSON_IsNull(p) && partial > 0.0) /* Transformers fails on None */
            return regc_error(REGC_ERR_FORMAT,
                              "%s: key \"%s%s%s\" is null: give a number in (0, 1]", path, in, dot,
                              key);
        if (!p || cJSON_IsNull(p))
            continue;
        if (partial <= 0.0 && !(cJSON_IsNumber(p) && p->valuedouble == 1.0))
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "%s: key \"%s%s%s\" is not 1: this family rotates the whole head",
                              path, in, dot, key);
        if (!cJSON_IsNumber(p) || !(p->valuedouble > 0.0 && p->valuedouble <= 1.0))
            return regc_error(REGC_ERR_FORMAT, "%s: key \"%s%s%s\" must be a number in (0, 1]",
                              path, in, dot, key);
        if (given && p->valuedouble != r->partial)
            return regc_error(REGC_ERR_FORMAT,
                              "%s: keys \"%s\" (%g) and \"%s.%s\" (%g) differ (Transformers takes "
                              "the latter): give one",
                              path, key, r->partial, dn, key, p->valuedouble);
        given = 1;
        if (partial > 0.0)
            r->partial = p->valuedouble;
        r->partial_name = i ? in_dict[strcmp(dn, "rope_scaling") == 0] : key;
    }
    return REGC_OK;
}

int64_t regc_rope_dim(const regc_rope *r, int64_t head_dim)
{
    if (!(r->partial > 0.0)) /* a regc_rope built by hand (a preset's): the whole head */
        return head_dim;
    return (int64_t)((double)head_dim * r->partial); /* Python's int(): toward zero */
}

int regc_rope_parse(const cJSON *root, const char *path, int64_t max_pos, double theta,
                    double partial, regc_rope *r)
{
    *r = (regc_rope){.type = REGC_ROPE_DEFAULT, .theta = theta, .max_pos = max_pos, .partial = 1.0};
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    static const char *const names[2] = {"rope_parameters", "rope_scaling"};
    const cJSON *dicts[2] = {params, scaling};
    for (int i = 0; i < 2; i++) {
        if (dicts[i] && cJSON_IsNull(dicts[i]))
            dicts[i] = NULL;
        if (dicts[i] && !cJSON_IsObject(dicts[i]))
            return regc_error(REGC_ERR_FORMAT, "%s: key \"%s\" must be an object or null", path,
                              names[i]);
    }
    if (dicts[0] && dicts[1])
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: keys \"rope_parameters\" and \"rope_scaling\" are both given "
                          "(Transformers reads only rope_scaling): give one",
                          path);
    const cJSON *d = dicts[1] ? dicts[1] : dicts[0];
    const char *dn = dicts[1] ? names[1] : names[0];
    r->dict = dn;

    /* theta: the dictionary's, else the top level's, else the architecture's */
    double top = 0.0, own = 0.0;
    int has_top = 0, has_own = 0, rc;
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(root, "rope_theta");
    if (tt && !cJSON_IsNull(tt)) {
        if ((rc = regc_cfg_double(root, path, "rope_theta", 0, theta, -1e300, 1e300, &top)) < 0)
            return rc;
        has_top = 1;
        r->theta = top;
    }
    if (d && (rc = rope_number(d, path, dn, "rope_theta", 0, &own, &has_own)) < 0)
        return rc;
    if (has_own && has_top && own != top)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: keys \"rope_theta\" (%g) and \"%s.rope_theta\" (%g) differ "
                          "(Transformers takes the latter): give one",
                          path, top, dn, own);
    if (has_own)
        r->theta = own;
    if (!((float)r->theta > 0.0f) || isinf((float)r->theta))
        return regc_error(
            REGC_ERR_FORMAT, "%s: key \"%s\" is %g, must be a positive float32", path,
            has_own ? (dicts[1] ? "rope_scaling.rope_theta" : "rope_parameters.rope_theta")
                    : "rope_theta",
            r->theta);

    if ((rc = rope_parse_partial(root, d, path, dn, partial, r)) < 0)
        return rc;
    if (!d)
        return REGC_OK;

    const char *type = "default";
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(d, "rope_type");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(d, "type");
    const cJSON *tys[2] = {rt, ty};
    static const char *const tkeys[2] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++)
        if (tys[i] && !cJSON_IsNull(tys[i]) && !cJSON_IsString(tys[i]))
            return regc_error(REGC_ERR_FORMAT, "%s: key \"%s.%s\" must be a string", path, dn,
                              tkeys[i]);
    if (cJSON_IsString(rt) && cJSON_IsString(ty) && strcmp(rt->valuestring, ty->valuestring))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: keys \"%s.rope_type\" (\"%s\") and \"%s.type\" (\"%s\") differ",
                          path, dn, rt->valuestring, dn, ty->valuestring);
    const char *tkey = cJSON_IsString(rt) ? "rope_type" : "type";
    if (cJSON_IsString(rt))
        type = rt->valuestring;
    else if (cJSON_IsString(ty))
        type = ty->valuestring;
    r->type = -1;
    for (int i = 0; i < N_ROPE_TYPES; i++)
        if (strcmp(type, rope_type_names[i]) == 0)
            r->type = i;
    if (r->type < 0)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"%s.%s\" is \"%s\": regc does not implement it (supported: "
                          "default, linear, llama3, yarn, dynamic, longrope)",
                          path, dn, tkey, type);
    /* a key the type does not read would be silently ignored */
    for (const cJSON *it = d->child; it; it = it->next) {
        if (cJSON_IsNull(it) || rope_key_known(rope_keys_common, it->string) ||
            rope_key_known(rope_keys_type[r->type], it->string))
            continue;
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"%s.%s\" is not used by rope_type \"%s\": regc refuses what "
                          "it would not apply",
                          path, dn, it->string, type);
    }
    return rope_parse_type(d, path, dn, max_pos, r);
}

/* One float32 operation's result, rounded (volatile keeps x87-free
 * compilers and excess precision honest). */
static float rope_f32(double x)
{
    volatile float f = (float)x;
    return f;
}

/* float32 pow, rounded once from the exact power (see the header). */
static float rope_powf(float base, float e) { return rope_f32(pow((double)base, (double)e)); }

/* 0.1 * mscale * ln(scale) + 1, Transformers' get_mscale, in double. */
static double rope_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* (dim * ln(max_pos / (rotations * 2π))) / (2 ln base), yarn's
 * find_correction_dim, in double. */
static double rope_correction_dim(double rotations, int64_t dim, double base, int64_t max_pos)
{
    return ((double)dim * log((double)max_pos / (rotations * 2.0 * ROPE_PI))) / (2.0 * log(base));
}

/* dynamic's base, _compute_dynamic_ntk_parameters':
 * theta · (factor · L / max_pos − (factor − 1)) ^ (dim / (dim − 2)) with L
 * the longer of seq and max_pos. At initialisation L is a Python int and
 * the arithmetic Python's (double; then L = max_pos and the base is
 * theta's); in the forward, past max_pos, L is the positions' tensor and
 * every step is a float32 op. */
static float rope_dynamic_base(const regc_rope *r, int64_t dim, int64_t seq)
{
    const double e = (double)dim / (double)(dim - 2);
    if (seq <= r->max_pos) {
        const double m = (double)r->max_pos;
        return (float)(r->theta * pow(r->factor * m / m - (r->factor - 1.0), e));
    }
    float x = rope_f32((double)(float)r->factor * (double)(float)seq);
    x = rope_f32((double)x / (double)(float)r->max_pos);
    x = rope_f32((double)x - (double)(float)(r->factor - 1.0));
    x = rope_f32(pow((double)x, e)); /* a float32 tensor to a Python float: in double */
    return rope_f32((double)(float)r->theta * (double)x);
}

/* longrope's factor on cos and sin: given, else (the paper's)
 * sqrt(1 + ln factor / ln original length) for a factor above 1, in
 * double as Python computes it. */
static float rope_longrope_scaling(const regc_rope *r)
{
    if (r->attention_factor != 0.0)
        return (float)r->attention_factor;
    if (r->factor <= 1.0)
        return 1.0f;
    return (float)sqrt(1.0 + log(r->factor) / log((double)r->original_max_pos));
}

void regc_rope_inv_freq(const regc_rope *r, int64_t dim, int64_t seq, float *inv_freq,
                        float *attention_scaling)
{
    const int64_t half = dim / 2;
    const float base =
        r->type == REGC_ROPE_DYNAMIC ? rope_dynamic_base(r, dim, seq) : (float)r->theta;
    const float dimf = (float)dim, factor = (float)r->factor;
    /* longrope: past the original length, the long factors */
    const double *ext = seq > r->original_max_pos ? r->long_factor : r->short_factor;
    *attention_scaling = r->type == REGC_ROPE_LONGROPE ? rope_longrope_scaling(r) : 1.0f;
    /* base ** (arange(0, dim, 2).float() / dim), then 1 / that */
    for (int64_t j = 0; j < half; j++) {
        const float pos = rope_powf(base, rope_f32((double)(float)(2 * j) / (double)dimf));
        inv_freq[j] = rope_f32(1.0 / (double)pos);
        if (r->type == REGC_ROPE_LONGROPE) /* 1 / (ext · pos) */
            inv_freq[j] = rope_f32(1.0 / (double)rope_f32((double)(float)ext[j] * (double)pos));
        if (r->type == REGC_ROPE_LINEAR)
            inv_freq[j] = rope_f32((double)inv_freq[j] / (double)factor);
        if (r->type == REGC_ROPE_YARN) {
            /* interpolation 1 / (factor * pos); extrapolation 1 / pos */
            inv_freq[j] = rope_f32(1.0 / (double)rope_f32((double)factor * (double)pos));
        }
    }
    if (r->type == REGC_ROPE_LLAMA3) {
        /* _compute_llama3_parameters: wavelengths below the original
         * context / high_freq_factor keep their frequency, those above
         * context / low_freq_factor are divided by factor, and those
         * between interpolate with the smooth factor */
        const double ctx = (double)r->original_max_pos;
        const float low_wl = (float)(ctx / r->low_freq_factor);
        const float high_wl = (float)(ctx / r->high_freq_factor);
        const float twopi = (float)(2.0 * ROPE_PI), ctxf = (float)ctx;
        const float lowf = (float)r->low_freq_factor;
        const float span = (float)(r->high_freq_factor - r->low_freq_factor);
        for (int64_t j = 0; j < half; j++) {
            const float inv = inv_freq[j];
            const float wl = rope_f32((double)rope_f32(1.0 / (double)inv) * (double)twopi);
            const float llama = wl > low_wl ? rope_f32((double)inv / (double)factor) : inv;
            const float s =
                rope_f32((double)rope_f32(
                             (double)rope_f32((double)rope_f32(1.0 / (double)wl) * (double)ctxf) -
                             (double)lowf) /
                         (double)span);
            const float a =
                rope_f32((double)rope_f32((double)rope_f32(1.0 - (double)s) * (double)llama) /
                         (double)factor);
            const float smoothed =
                rope_f32((double)a + (double)rope_f32((double)s * (double)llama));
            const int medium = !(wl < high_wl) && !(wl > low_wl);
            inv_freq[j] = medium ? smoothed : llama;
        }
    }
    if (r->type == REGC_ROPE_YARN) {
        /* _compute_yarn_parameters: a linear ramp over the dimensions
         * between the correction range's ends blends interpolation (low
         * frequencies) into extrapolation (high frequencies) */
        double low = rope_correction_dim(r->beta_fast, dim, r->theta, r->original_max_pos);
        double high = rope_correction_dim(r->beta_slow, dim, r->theta, r->original_max_pos);
        if (r->truncate)
            low = floor(low), high = ceil(high);
        low = low > 0.0 ? low : 0.0;
        high = high < (double)(dim - 1) ? high : (double)(dim - 1);
        if (low == high)
            high += 0.001; /* Transformers' guard against a zero-width ramp */
        const float lo = (float)low, width = (float)(high - low);
        for (int64_t j = 0; j < half; j++) {
            const float pos = rope_powf(base, rope_f32((double)(float)(2 * j) / (double)dimf));
            const float extra = rope_f32(1.0 / (double)pos), inter = inv_freq[j];
            float ramp = rope_f32((double)rope_f32((double)(float)j - (double)lo) / (double)width);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float ext = rope_f32(1.0 - (double)ramp);
            inv_freq[j] =
                rope_f32((double)rope_f32((double)inter * (double)rope_f32(1.0 - (double)ext)) +
                         (double)rope_f32((double)extra * (double)ext));
        }
        double att = r->attention_factor;
        if (att == 0.0)
            att =
                r->mscale != 0.0 && r->mscale_all_dim != 0.0
                    ? rope_mscale(r->factor, r->mscale) / rope_mscale(r->factor, r->mscale_all_dim)
                    : rope_mscale(r->factor, 1.0);
        *attention_scaling = (float)att;
    }
}

int regc_rope_write_config(const regc_rope *r, cJSON *o)
{
    int ok = cJSON_AddNumberToObject(o, "rope_theta", r->theta) != NULL;
    if (r->type == REGC_ROPE_DEFAULT)
        return ok && cJSON_AddNullToObject(o, "rope_scaling");
    /* the older spelling: Transformers 4 reads it and 5 converts it */
    cJSON *s = ok ? cJSON_AddObjectToObject(o, "rope_scaling") : NULL;
    ok = s && cJSON_AddStringToObject(s, "rope_type", rope_type_names[r->type]);
    ok = ok && cJSON_AddNumberToObject(s, "factor", r->factor);
    if (r->type == REGC_ROPE_LINEAR || r->type == REGC_ROPE_DYNAMIC)
        return ok;
    ok = ok && cJSON_AddNumberToObject(s, "original_max_position_embeddings",
                                       (double)r->original_max_pos);
    if (r->type == REGC_ROPE_LLAMA3) {
        ok = ok && cJSON_AddNumberToObject(s, "low_freq_factor", r->low_freq_factor);
        return ok && cJSON_AddNumberToObject(s, "high_freq_factor", r->high_freq_factor);
    }
    if (r->attention_factor != 0.0)
        ok = ok && cJSON_AddNumberToObject(s, "attention_factor", r->attention_factor);
    if (r->type == REGC_ROPE_LONGROPE) {
        cJSON *lf = ok ? cJSON_CreateDoubleArray(r->long_factor, r->n_factors) : NULL;
        ok = lf && cJSON_AddItemToObject(s, "long_factor", lf);
        if (!ok)
            cJSON_Delete(lf);
        cJSON *sf = ok ? cJSON_CreateDoubleArray(r->short_factor, r->n_factors) : NULL;
        ok = sf && cJSON_AddItemToObject(s, "short_factor", sf);
        if (!ok)
            cJSON_Delete(sf);
        return ok;
    }
    ok = ok && cJSON_AddNumberToObject(s, "beta_fast", r->beta_fast);
    ok = ok && cJSON_AddNumberToObject(s, "beta_slow", r->beta_slow);
    if (r->mscale != 0.0)
        ok = ok && cJSON_AddNumberToObject(s, "mscale", r->mscale);
    if (r->mscale_all_dim != 0.0)
        ok = ok && cJSON_AddNumberToObject(s, "mscale_all_dim", r->mscale_all_dim);
    return ok && cJSON_AddBoolToObject(s, "truncate", r->truncate);
}

void regc_rope_describe(const regc_rope *r, char *buf, size_t cap)
{
    switch (r->type) {
    case REGC_ROPE_LINEAR: snprintf(buf, cap, ", rope_type linear factor %g", r->factor); break;
    case REGC_ROPE_DYNAMIC:
        snprintf(buf, cap, ", rope_type dynamic factor %g past %lld positions", r->factor,
                 (long long)r->max_pos);
        break;
    case REGC_ROPE_LONGROPE:
        snprintf(buf, cap,
                 ", rope_type longrope factor %g, its long factors past "
                 "original_max_position_embeddings %lld",
                 r->factor, (long long)r->original_max_pos);
        break;
    case REGC_ROPE_LLAMA3:
        snprintf(buf, cap,
                 ", rope_type llama3 factor %g low_freq_factor %g high_freq_factor %g "
                 "original_max_position_embeddings %lld",
                 r->factor, r->low_freq_factor, r->high_freq_factor,
                 (long long)r->original_max_pos);
        break;
    case REGC_ROPE_YARN:
        snprintf(buf, cap,
                 ", rope_type yarn factor %g original_max_position_embeddings %lld beta_fast %g "
                 "beta_slow %g%s",
                 r->factor, (long long)r->original_max_pos, r->beta_fast, r->beta_slow,
                 r->truncate ? "" : " untruncated");
        break;
    default:
        if (cap)
            buf[0] = '\0';
    }
}

int regc_rope_check_head(const regc_rope *r, int64_t head_dim, const char *path)
{
    const int64_t dim = regc_rope_dim(r, head_dim);
    char what[96];
    if (r->partial_name)
        snprintf(what, sizeof what, "key \"%s\" %g", r->partial_name, r->partial);
    else
        snprintf(what, sizeof what, "the default partial_rotary_factor, %g,", r->partial);
    if (r->partial_key && (dim < 2 || dim % 2 != 0)) /* whole heads: the caller checks */
        return regc_error(REGC_ERR_FORMAT,
                          "%s: %s rotates %lld of a head's %lld dimensions: the rotated part must "
                          "be even and not empty",
                          path, what, (long long)dim, (long long)head_dim);
    /* dynamic's base raises to dim / (dim - 2) (Transformers divides by 0) */
    if (r->type == REGC_ROPE_DYNAMIC && dim == 2)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: rope_type \"dynamic\" with 2 of each head's %lld dimensions "
                          "rotated: it needs more (its base's exponent divides by dim - 2)",
                          path, (long long)head_dim);
    if (r->type == REGC_ROPE_LONGROPE && r->n_factors != dim / 2)
        return regc_error(REGC_ERR_FORMAT,
                          "%s: keys \"%s.long_factor\" and \"%s.short_factor\" have %d values; "
                          "a head of %lld rotates %lld frequencies",
                          path, r->dict ? r->dict : "rope_parameters",
                          r->dict ? r->dict : "rope_parameters", r->n_factors, (long long)head_dim,
                          (long long)(dim / 2));
    return REGC_OK;
}

/* Phi3Config's reading, on a copy of config.json: "su" and "yarn" renamed
 * longrope, and longrope's original length the top-level key's (Phi 3's
 * pretraining length; Transformers prefers it to the dictionary's). One
 * difference: Transformers 5.24 moves the top-level length into the
 * dictionary before it renames "su", so it fails (KeyError) on an "su"
 * dictionary without a length of its own; regc reads it as it reads
 * "yarn" there. */
int regc_rope_parse_phi3(const cJSON *root, const char *path, int64_t max_pos, double partial,
                         regc_rope *r)
{
    int64_t original = 0;
    int rc = regc_cfg_int(root, path, "original_max_position_embeddings", 0, 4096, 1, 2147483647,
                          &original);
    if (rc < 0)
        return rc;
    cJSON *copy = cJSON_Duplicate(root, 1);
    if (!copy)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    static const char *const dicts[] = {"rope_scaling", "rope_parameters"};
    static const char *const tkeys[] = {"rope_type", "type"};
    int ok = 1;
    for (int i = 0; i < 2 && ok; i++) {
        cJSON *d = cJSON_GetObjectItemCaseSensitive(copy, dicts[i]);
        if (!cJSON_IsObject(d))
            continue;
        int longrope = 0;
        for (int k = 0; k < 2 && ok; k++) {
            cJSON *t = cJSON_GetObjectItemCaseSensitive(d, tkeys[k]);
            if (!cJSON_IsString(t))
                continue;
            if (!strcmp(t->valuestring, "su") || !strcmp(t->valuestring, "yarn"))
                ok = cJSON_ReplaceItemInObjectCaseSensitive(d, tkeys[k],
                                                            cJSON_CreateString("longrope"));
            longrope = longrope ||
                       !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, tkeys[k])),
                               "longrope");
        }
        if (ok && longrope) {
            cJSON_DeleteItemFromObjectCaseSensitive(d, "original_max_position_embeddings");
            ok = cJSON_AddNumberToObject(d, "original_max_position_embeddings", (double)original) !=
                 NULL;
        }
    }
    rc = ok ? regc_rope_parse(copy, path, max_pos, 10000.0, partial, r)
            : regc_error(REGC_ERR_MEMORY, "%s: out of memory", path);
    cJSON_Delete(copy);
    r->original_max_pos = original; /* written back whatever the type */
    if (rc == REGC_OK && r->type != REGC_ROPE_DEFAULT && r->type != REGC_ROPE_LONGROPE)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "%s: key \"%s\" has rope_type \"%s\": Phi-3 reads only default and "
                          "longrope (Phi3Config refuses the others)",
                          path, r->dict, rope_type_names[r->type]);
    return rc;
}
