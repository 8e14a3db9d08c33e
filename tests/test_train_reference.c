/* test_train_reference.c — end to end against PyTorch, for every
 * architecture: for each case of tests/data/<arch>_reference.json (written by
 * tools/reference/<arch>_reference.py) build the same model from its
 * config.json, fill it with the same counter-based random weights, save it
 * as a Hugging Face directory, write the same token file, train 5 steps with
 * the real `regc` binary and compare every step's loss with the one PyTorch
 * recorded.
 *
 * The reference's own float32-vs-float64 gap is ~1e-7 relative (it is in the
 * JSON as fp32_vs_fp64_max_rel), so 1e-5 leaves room for a different but
 * correct summation order while still catching any real semantic slip (a
 * wrong epsilon, activation variant, attention scale, batch order or AdamW). */
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

#include "regc_models.h"
#include "test_util.h"

/* One file per architecture, each written by tools/reference/<arch>_reference.py. */
static const char *const reference_files[] = {
    REGC_SOURCE_DIR "/tests/data/gpt2_reference.json",
    REGC_SOURCE_DIR "/tests/data/llama_reference.json",
    REGC_SOURCE_DIR "/tests/data/t5_reference.json",
    REGC_SOURCE_DIR "/tests/data/bert_reference.json",
};
#define N_FILES (sizeof reference_files / sizeof reference_files[0])
#define TOKEN_STREAM 1000000 /* the tokens' substream index, as in the script */
#define LOSS_RTOL 1e-5
#define SUM_RTOL 1e-9

static const char *current_file; /* the file the case comes from, for messages */

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
        print_error("%s: case is missing \"%s\"\n", current_file, key);
        fail();
    }
    return it;
}

static double get_number(const cJSON *obj, const char *key)
{
    const cJSON *it = get_item(obj, key);
    if (!cJSON_IsNumber(it)) {
        print_error("%s: \"%s\" is not a number\n", current_file, key);
        fail();
    }
    return it->valuedouble;
}

static const char *get_string(const cJSON *obj, const char *key)
{
    const cJSON *it = get_item(obj, key);
    if (!cJSON_IsString(it)) {
        print_error("%s: \"%s\" is not a string\n", current_file, key);
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
        print_error("%s: \"%s\" = %g is not a non-negative integer\n", current_file, key, v);
        fail();
    }
    return (int64_t)v;
}

/* ---- parameters as the script lists them ---------------------------------
 * The reference records every parameter as [name, shape, center, halfwidth]
 * in its checkpoint order; the position in that list is the parameter's
 * substream index. regc's own listing must hold exactly those names and
 * shapes, in any order: the test then checks the names and layouts against
 * Hugging Face's without knowing the architecture. */

typedef struct {
    int t; /* substream index */
    float center, halfwidth;
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
} expected_param;

static int expect_param(const cJSON *params, const char *name, expected_param *e)
{
    int t = 0;
    const cJSON *p;
    cJSON_ArrayForEach (p, params) {
        const cJSON *nm = cJSON_GetArrayItem(p, 0), *shape = cJSON_GetArrayItem(p, 1);
        if (!cJSON_IsString(nm) || !cJSON_IsArray(shape) ||
            cJSON_GetArraySize(shape) > REGC_MAX_DIMS) {
            print_error("%s: malformed \"params\" entry %d\n", current_file, t);
            fail();
        }
        if (strcmp(nm->valuestring, name) == 0) {
            memset(e, 0, sizeof *e);
            e->t = t;
            e->ndim = cJSON_GetArraySize(shape);
            for (int d = 0; d < e->ndim; d++)
                e->shape[d] = (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble;
            e->center = (float)cJSON_GetArrayItem(p, 2)->valuedouble;
            e->halfwidth = (float)cJSON_GetArrayItem(p, 3)->valuedouble;
            return 0;
        }
        t++;
    }
    return -1;
}

/* ---- the test ------------------------------------------------------------ */

static int case_setup(void **state)
{
    case_state *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->spec = *state;
    s->tmp = regc_test_make_temp_dir("trainref");
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

    const cJSON *params = get_item(spec, "params"), *extra = get_item(spec, "extra_args");
    assert_true(cJSON_IsArray(params) && cJSON_IsArray(extra));
    int64_t V = get_int(config, "vocab_size");

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
    int expected_n = cJSON_GetArraySize(params);
    if (n != expected_n) {
        print_error("case %s: regc lists %d parameters, the reference %d\n", name, n, expected_n);
        fail();
    }
    float *w = regc_model_weights(s->m);
    assert_non_null(w);
    char *seen = calloc((size_t)expected_n, 1);
    assert_non_null(seen);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const char *pname = regc_model_param_name(s->m, i);
        expected_param e = {0};
        if (expect_param(params, pname, &e) != 0 || seen[e.t]) {
            free(seen);
            print_error("case %s: unexpected or repeated parameter \"%s\"\n", name, pname);
            fail();
        }
        seen[e.t] = 1;
        int64_t shape[REGC_MAX_DIMS];
        int ndim = regc_model_param_shape(s->m, i, shape);
        int same = ndim == e.ndim;
        for (int d = 0; same && d < ndim; d++)
            same = shape[d] == e.shape[d];
        if (!same) {
            free(seen);
            print_error("case %s: %s has ndim %d, shape[0] %lld; HF's layout is %dD [%lld, ...]\n",
                        name, pname, ndim, ndim > 0 ? (long long)shape[0] : -1LL, e.ndim,
                        (long long)e.shape[0]);
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
    free(seen);
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
        if (memcmp(w + regc_model_param_offset(s->m, i),
                   w2 + regc_model_param_offset(s->reloaded, i),
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
    int len =
        snprintf(cmd, sizeof cmd,
                 "%s train --model %s --data %s --steps %lld --batch %lld --seq %lld "
                 "--lr %.17g --weight-decay %.17g --json",
                 qbin, qdir, qtok, (long long)steps, (long long)batch, (long long)seq, lr, wd);
    const cJSON *arg;
    cJSON_ArrayForEach (arg, extra) {
        assert_true(cJSON_IsString(arg));
        char *q = regc_test_shell_quote(arg->valuestring);
        assert_non_null(q);
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %s", q);
        free(q);
        assert_true(len < (int)sizeof cmd);
    }
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
    double got[64], got_norm[64];
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
            const cJSON *norm = cJSON_GetObjectItemCaseSensitive(obj, "grad_norm");
            if (ok) {
                got_norm[n_got] = cJSON_IsNumber(norm) ? norm->valuedouble : NAN;
                got[n_got++] = loss->valuedouble;
            }
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
        print_error("case %s: regc reported %d steps, expected %lld\n", name, n_got,
                    (long long)steps);
        fail();
    }
    int bad = 0;
    for (int k = 0; k < n_got; k++) {
        const cJSON *r = cJSON_GetArrayItem(losses, k);
        assert_true(cJSON_IsNumber(r));
        double ref = r->valuedouble;
        double rel = fabs(got[k] - ref) / fabs(ref);
        int ok = isfinite(got[k]) && rel <= LOSS_RTOL;
        print_message("case %s step %d: regc %.9f  pytorch %.9f  rel %.1e%s\n", name, k, got[k],
                      ref, rel, ok ? "" : "  <-- MISMATCH");
        bad += !ok;
    }
    if (bad) {
        print_error("case %s: %d of %d losses differ from PyTorch by more than %g relative\n", name,
                    bad, n_got, LOSS_RTOL);
        fail();
    }
    /* With clipping, the norm clip_grad_norm_ returned, every step. */
    const cJSON *norms = cJSON_GetObjectItemCaseSensitive(spec, "grad_norms");
    for (int k = 0; norms && k < n_got; k++) {
        const cJSON *r = cJSON_GetArrayItem(norms, k);
        assert_true(cJSON_IsNumber(r));
        double rel = fabs(got_norm[k] - r->valuedouble) / fabs(r->valuedouble);
        if (!(rel <= LOSS_RTOL)) {
            print_error("case %s step %d: grad_norm %.9g, PyTorch's %.9g (rel %.1e)\n", name, k,
                        got_norm[k], r->valuedouble, rel);
            fail();
        }
    }
}

/* Run every case of one reference file as a CMocka group named after it. */
static int run_file(const char *path)
{
    current_file = path;
    char *text = regc_test_read_file(path, NULL);
    if (!text) {
        fprintf(stderr, "%s: cannot read the reference (run the script in tools/reference)\n",
                path);
        return 1;
    }
    cJSON *reference = cJSON_Parse(text);
    free(text);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(reference, "cases");
    int n = cJSON_GetArraySize(cases);
    if (!cJSON_IsArray(cases) || n < 1) {
        fprintf(stderr, "%s: no \"cases\" array\n", path);
        cJSON_Delete(reference);
        return 1;
    }
    /* One CMocka test per case, named after it, so a failure says which. */
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests) {
        cJSON_Delete(reference);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c, "name");
        tests[i] = (struct CMUnitTest){cJSON_IsString(nm) ? nm->valuestring : "unnamed", test_case,
                                       case_setup, case_teardown, (void *)c};
    }
    const char *base = strrchr(path, '/');
    int failed = _cmocka_run_group_tests(base ? base + 1 : path, tests, (size_t)n, NULL, NULL);
    free(tests);
    cJSON_Delete(reference);
    return failed;
}

int main(void)
{
    int failed = 0;
    for (size_t i = 0; i < N_FILES; i++)
        failed += run_file(reference_files[i]);
    return failed;
}
