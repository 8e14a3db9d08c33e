/* test_gpt2_reference.c — end to end against PyTorch: for each case of
 * tests/data/gpt2_reference.json (written by tools/reference/gpt2_reference.py)
 * build the same GPT-2 from config.json, fill it with the same counter-based
 * random weights, save it as a Hugging Face directory, write the same token
 * file, train 5 steps with the real `regc` binary and compare every step's
 * loss with the one PyTorch recorded.
 *
 * The reference's own float32-vs-float64 gap is ~1e-7 relative (it is in the
 * JSON as fp32_vs_fp64_max_rel), so 1e-5 leaves room for a different but
 * correct summation order while still catching any real semantic slip (a
 * wrong epsilon, GELU variant, attention scale, batch order or AdamW). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc.h"
#include "test_util.h"

#define REFERENCE_JSON REGC_SOURCE_DIR "/tests/data/gpt2_reference.json"
#define TOKEN_STREAM 1000000 /* the tokens' substream index, as in the script */
#define LOSS_RTOL 1e-5
#define SUM_RTOL 1e-9

static cJSON *reference; /* the parsed JSON, alive for the whole run */

/* One case's resources, released by teardown whatever the test did. */
typedef struct {
    const cJSON *spec;
    char *tmp;
    regc_model *m, *reloaded;
    char *output;
    uint16_t *tokens;
} case_state;

/* ---- reading the case ---------------------------------------------------- */

static const cJSON *get_item(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) {
        print_error("%s: case is missing \"%s\"\n", REFERENCE_JSON, key);
        fail();
    }
    return it;
}

static double get_number(const cJSON *obj, const char *key)
{
    const cJSON *it = get_item(obj, key);
    if (!cJSON_IsNumber(it)) {
        print_error("%s: \"%s\" is not a number\n", REFERENCE_JSON, key);
        fail();
    }
    return it->valuedouble;
}

static const char *get_string(const cJSON *obj, const char *key)
{
    const cJSON *it = get_item(obj, key);
    if (!cJSON_IsString(it)) {
        print_error("%s: \"%s\" is not a string\n", REFERENCE_JSON, key);
        fail();
    }
    return it->valuestring;
}

/* Integers through valuedouble: cJSON's valueint saturates at INT_MAX, and
 * every value here (seeds included) is below 2^53, so doubles are exact. */
static int64_t get_int(const cJSON *obj, const char *key)
{
    double v = get_number(obj, key);
    if (v != floor(v) || v < 0 || v > 9007199254740992.0) {
        print_error("%s: \"%s\" = %g is not a non-negative integer\n", REFERENCE_JSON, key, v);
        fail();
    }
    return (int64_t)v;
}

/* ---- GPT-2 parameters in the script's order -------------------------------
 * The substream index t of a parameter is its position in HF GPT-2 order, so
 * it is derived from the name here rather than from regc's own listing order:
 * the test then does not assume regc lists parameters in any given order. */

typedef struct {
    int t;               /* substream index */
    float center, halfwidth;
    int ndim;
    int64_t shape[2];
} expected_param;

static int expect_param(const char *name, int64_t V, int64_t P, int64_t C, int64_t I, int64_t L,
                        int tied, expected_param *e)
{
    static const struct {
        const char *suffix;
        int kind; /* 0 norm weight, 1 bias, 2 other weight */
        int ndim;
        int d0, d1; /* in units: 1 = C, 3 = 3C, 4 = I */
    } layer[12] = {
        {"ln_1.weight", 0, 1, 1, 0},        {"ln_1.bias", 1, 1, 1, 0},
        {"attn.c_attn.weight", 2, 2, 1, 3}, {"attn.c_attn.bias", 1, 1, 3, 0},
        {"attn.c_proj.weight", 2, 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 1, 0},
        {"ln_2.weight", 0, 1, 1, 0},        {"ln_2.bias", 1, 1, 1, 0},
        {"mlp.c_fc.weight", 2, 2, 1, 4},    {"mlp.c_fc.bias", 1, 1, 4, 0},
        {"mlp.c_proj.weight", 2, 2, 4, 1},  {"mlp.c_proj.bias", 1, 1, 1, 0},
    };
    static const float centers[3] = {1.0f, 0.0f, 0.0f}, halfwidths[3] = {0.2f, 0.05f, 0.1f};
    int kind;
    memset(e, 0, sizeof *e);
    if (strcmp(name, "transformer.wte.weight") == 0) {
        *e = (expected_param){0, 0, 0, 2, {V, C}};
        kind = 2;
    } else if (strcmp(name, "transformer.wpe.weight") == 0) {
        *e = (expected_param){1, 0, 0, 2, {P, C}};
        kind = 2;
    } else if (strcmp(name, "transformer.ln_f.weight") == 0) {
        *e = (expected_param){(int)(2 + 12 * L), 0, 0, 1, {C, 0}};
        kind = 0;
    } else if (strcmp(name, "transformer.ln_f.bias") == 0) {
        *e = (expected_param){(int)(3 + 12 * L), 0, 0, 1, {C, 0}};
        kind = 1;
    } else if (strcmp(name, "lm_head.weight") == 0 && !tied) {
        *e = (expected_param){(int)(4 + 12 * L), 0, 0, 2, {V, C}};
        kind = 2;
    } else {
        int l, used = 0;
        if (sscanf(name, "transformer.h.%d.%n", &l, &used) != 1 || used == 0 || l < 0 || l >= L)
            return -1;
        int j = 0;
        while (j < 12 && strcmp(name + used, layer[j].suffix) != 0)
            j++;
        if (j == 12)
            return -1;
        int64_t unit[5] = {0, C, 0, 3 * C, I};
        e->t = 2 + 12 * l + j;
        e->ndim = layer[j].ndim;
        e->shape[0] = unit[layer[j].d0];
        e->shape[1] = unit[layer[j].d1];
        kind = layer[j].kind;
    }
    e->center = centers[kind];
    e->halfwidth = halfwidths[kind];
    return 0;
}

/* ---- the test ------------------------------------------------------------ */

static int case_setup(void **state)
{
    case_state *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->spec = *state;
    s->tmp = regc_test_make_temp_dir("gpt2ref");
    if (!s->tmp) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int case_teardown(void **state)
{
    case_state *s = *state;
    regc_model_free(s->m);
    regc_model_free(s->reloaded);
    free(s->output);
    free(s->tokens);
    regc_test_remove_tree(s->tmp);
    free(s->tmp);
    free(s);
    return 0;
}

static void assert_regc_ok(int rc, const char *what)
{
    if (rc != REGC_OK) {
        print_error("%s failed (%d): %s\n", what, rc, regc_error_message());
        fail();
    }
}

static void test_case(void **state)
{
    case_state *s = *state;
    const cJSON *spec = s->spec, *config = get_item(spec, "config");
    const char *name = get_string(spec, "name");
    uint64_t seed = (uint64_t)get_int(spec, "seed");
    int64_t batch = get_int(spec, "batch"), seq = get_int(spec, "seq");
    int64_t steps = get_int(spec, "steps"), n_tokens = get_int(spec, "n_tokens");
    double lr = get_number(spec, "lr"), wd = get_number(spec, "weight_decay");
    double param_sum = get_number(spec, "param_sum");
    const cJSON *losses = get_item(spec, "losses");
    assert_true(cJSON_IsArray(losses));
    assert_int_equal(cJSON_GetArraySize(losses), steps);

    int64_t V = get_int(config, "vocab_size"), P = get_int(config, "n_positions");
    int64_t C = get_int(config, "n_embd"), L = get_int(config, "n_layer");
    const cJSON *inner = get_item(config, "n_inner");
    int64_t I = cJSON_IsNull(inner) ? 4 * C : get_int(config, "n_inner");
    int tied = cJSON_IsTrue(get_item(config, "tie_word_embeddings"));

    /* 1. config.json -> a shape-only model -> weights allocated. */
    char dir[1024], path[1100], tokens_path[1100];
    snprintf(dir, sizeof dir, "%s/model", s->tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_regc_ok(regc_path_join(path, sizeof path, dir, "config.json"), "path");
    char *text = cJSON_Print(config);
    assert_non_null(text);
    int wrote = regc_test_write_file(path, text, strlen(text));
    free(text);
    assert_int_equal(wrote, 0);
    assert_regc_ok(regc_model_load_config(dir, &s->m), "regc_model_load_config");
    assert_regc_ok(regc_model_init_random(s->m, 0), "regc_model_init_random");
    assert_int_equal(regc_model_vocab(s->m), V);

    /* 2. Overwrite every parameter with the reference's weights. */
    int n = regc_model_n_params(s->m);
    int expected_n = (int)(4 + 12 * L + (tied ? 0 : 1));
    if (n != expected_n) {
        print_error("case %s: regc lists %d parameters, GPT-2 has %d\n", name, n, expected_n);
        fail();
    }
    float *w = regc_model_weights(s->m);
    assert_non_null(w);
    char seen[512] = {0};
    assert_true(expected_n <= (int)sizeof seen);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const char *pname = regc_model_param_name(s->m, i);
        expected_param e;
        if (expect_param(pname, V, P, C, I, L, tied, &e) != 0 || seen[e.t]) {
            print_error("case %s: unexpected or repeated parameter \"%s\"\n", name, pname);
            fail();
        }
        seen[e.t] = 1;
        int64_t shape[REGC_MAX_DIMS];
        int ndim = regc_model_param_shape(s->m, i, shape);
        if (ndim != e.ndim || shape[0] != e.shape[0] || (ndim == 2 && shape[1] != e.shape[1])) {
            print_error("case %s: %s has ndim %d, shape[0] %lld; HF's layout is %dD [%lld, %lld]\n",
                        name, pname, ndim, ndim > 0 ? (long long)shape[0] : -1LL, e.ndim,
                        (long long)e.shape[0], (long long)e.shape[1]);
            fail();
        }
        int64_t numel = regc_model_param_numel(s->m, i), offset = regc_model_param_offset(s->m, i);
        assert_true(offset >= 0 && offset + numel <= regc_model_total_numel(s->m));
        float *p = w + offset;
        regc_rng_fill_uniform(p, (size_t)numel, regc_rng_substream(seed, (uint64_t)e.t), e.center,
                              e.halfwidth);
        for (int64_t j = 0; j < numel; j++)
            sum += p[j];
    }
    /* The sum pins the RNG: if common/rng.c and the script ever drift, this
     * fails here rather than as a mysterious loss mismatch later. */
    if (!(fabs(sum - param_sum) <= SUM_RTOL * fabs(param_sum))) {
        print_error("case %s: initial weights sum to %.17g, the reference's to %.17g\n", name, sum,
                    param_sum);
        fail();
    }

    /* 3. Save as a Hugging Face directory; it must load back bit for bit. */
    assert_regc_ok(regc_model_save(s->m, dir), "regc_model_save");
    assert_regc_ok(regc_model_load(dir, &s->reloaded), "regc_model_load of the saved directory");
    assert_int_equal(regc_model_n_params(s->reloaded), n);
    const float *w2 = regc_model_weights(s->reloaded);
    assert_non_null(w2);
    for (int i = 0; i < n; i++) {
        assert_string_equal(regc_model_param_name(s->reloaded, i), regc_model_param_name(s->m, i));
        int64_t numel = regc_model_param_numel(s->m, i);
        assert_int_equal(regc_model_param_numel(s->reloaded, i), numel);
        if (memcmp(w + regc_model_param_offset(s->m, i), w2 + regc_model_param_offset(s->reloaded, i),
                   (size_t)numel * sizeof(float)) != 0) {
            print_error("case %s: %s changed through save and load\n", name,
                        regc_model_param_name(s->m, i));
            fail();
        }
    }

    /* 4. The reference's token stream. */
    s->tokens = malloc((size_t)n_tokens * sizeof *s->tokens);
    assert_non_null(s->tokens);
    uint64_t token_seed = regc_rng_substream(seed, TOKEN_STREAM);
    for (int64_t i = 0; i < n_tokens; i++)
        s->tokens[i] = (uint16_t)(regc_rng_at(token_seed, (uint64_t)i) % (uint64_t)V);
    assert_regc_ok(regc_path_join(tokens_path, sizeof tokens_path, s->tmp, "tokens.bin"), "path");
    assert_regc_ok(regc_tokens_write(tokens_path, s->tokens, n_tokens), "regc_tokens_write");

    /* 5. Train with the real command line. */
    char *qbin = regc_test_shell_quote(REGC_BIN), *qdir = regc_test_shell_quote(dir);
    char *qtok = regc_test_shell_quote(tokens_path);
    assert_true(qbin && qdir && qtok);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s train --model %s --data %s --steps %lld --batch %lld --seq %lld --lr %.17g "
             "--weight-decay %.17g --json",
             qbin, qdir, qtok, (long long)steps, (long long)batch, (long long)seq, lr, wd);
    free(qbin);
    free(qdir);
    free(qtok);
    int status = regc_test_run_capture(cmd, &s->output);
    if (status != 0) {
        print_error("case %s: `%s` exited with %d; stdout:\n%s\n", name, cmd, status,
                    s->output ? s->output : "");
        fail();
    }

    /* 6. One JSON object per line; the step reports are those with a loss. */
    double got[64];
    int n_got = 0, last_step = -1;
    for (char *line = strtok(s->output, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *obj = cJSON_Parse(line);
        if (!obj) {
            print_error("case %s: stdout line is not JSON: %s\n", name, line);
            fail();
        }
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "loss");
        if (cJSON_IsNumber(step) && cJSON_IsNumber(loss)) {
            int k = (int)step->valuedouble, ok = n_got < 64 && k > last_step;
            if (ok)
                got[n_got++] = loss->valuedouble;
            last_step = k;
            if (!ok) {
                cJSON_Delete(obj);
                print_error("case %s: step reports out of order at step %d\n", name, k);
                fail();
            }
        }
        cJSON_Delete(obj);
    }
    if (n_got != steps) {
        print_error("case %s: regc reported %d steps, expected %lld\n", name, n_got, (long long)steps);
        fail();
    }
    int bad = 0;
    for (int k = 0; k < n_got; k++) {
        const cJSON *r = cJSON_GetArrayItem(losses, k);
        assert_true(cJSON_IsNumber(r));
        double ref = r->valuedouble;
        double rel = fabs(got[k] - ref) / fabs(ref);
        int ok = isfinite(got[k]) && rel <= LOSS_RTOL;
        print_message("case %s step %d: regc %.9f  pytorch %.9f  rel %.1e%s\n", name, k, got[k], ref,
                      rel, ok ? "" : "  <-- MISMATCH");
        bad += !ok;
    }
    if (bad) {
        print_error("case %s: %d of %d losses differ from PyTorch by more than %g relative\n", name,
                    bad, n_got, LOSS_RTOL);
        fail();
    }
}

int main(void)
{
    char *text = regc_test_read_file(REFERENCE_JSON, NULL);
    if (!text) {
        fprintf(stderr, "%s: cannot read the reference (run tools/reference/gpt2_reference.py)\n",
                REFERENCE_JSON);
        return 1;
    }
    reference = cJSON_Parse(text);
    free(text);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(reference, "cases");
    int n = cJSON_GetArraySize(cases);
    if (!cJSON_IsArray(cases) || n < 1) {
        fprintf(stderr, "%s: no \"cases\" array\n", REFERENCE_JSON);
        cJSON_Delete(reference);
        return 1;
    }
    /* One CMocka test per case, named after it, so a failure says which. */
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests)
        return 1;
    for (int i = 0; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c, "name");
        tests[i] = (struct CMUnitTest){cJSON_IsString(nm) ? nm->valuestring : "unnamed", test_case,
                                       case_setup, case_teardown, (void *)c};
    }
    int failed = _cmocka_run_group_tests("gpt2_reference", tests, (size_t)n, NULL, NULL);
    free(tests);
    cJSON_Delete(reference);
    return failed;
}
