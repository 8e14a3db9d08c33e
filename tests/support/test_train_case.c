/* test_train_case.c — see test_train_case.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "regc_models.h"
#include "test_reference.h"
#include "test_train_case.h"
#include "test_util.h"

const char *const regc_test_reference_files[] = {
    REGC_SOURCE_DIR "/tests/data/gpt2_reference.json",
    REGC_SOURCE_DIR "/tests/data/llama_reference.json",
    REGC_SOURCE_DIR "/tests/data/t5_reference.json",
    REGC_SOURCE_DIR "/tests/data/bert_reference.json",
    REGC_SOURCE_DIR "/tests/data/decoder_reference.json",
    NULL,
};

#define TOKEN_STREAM 1000000 /* the tokens' substream index, as in the scripts */
#define SUM_RTOL 1e-9

/* ---- parameters as the script lists them --------------------------------- */

typedef struct {
    int t; /* substream index */
    float center, halfwidth;
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
} expected_param;

static int expect_param(const regc_test_train_case *c, const cJSON *params, const char *name,
                        expected_param *e)
{
    int t = 0;
    const cJSON *p;
    cJSON_ArrayForEach (p, params) {
        const cJSON *nm = cJSON_GetArrayItem(p, 0), *shape = cJSON_GetArrayItem(p, 1);
        if (!cJSON_IsString(nm) || !cJSON_IsArray(shape) ||
            cJSON_GetArraySize(shape) > REGC_MAX_DIMS) {
            print_error("case %s: malformed \"params\" entry %d\n", c->name, t);
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

/* ---- the fixture ---------------------------------------------------------- */

int regc_test_train_case_setup(void **state)
{
    regc_test_train_case *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->spec = *state;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c->spec, "name");
    c->name = cJSON_IsString(nm) ? nm->valuestring : "unnamed";
    c->tmp = regc_test_make_temp_dir("trainref");
    if (!c->tmp) {
        free(c);
        return -1;
    }
    *state = c;
    return 0;
}

int regc_test_train_case_teardown(void **state)
{
    regc_test_train_case *c = *state;
    regc_model_free(c->m);
    regc_model_free(c->reloaded);
    free(c->output);
    free(c->tokens);
    regc_test_remove_tree(c->tmp);
    free(c->tmp);
    free(c);
    return 0;
}

static void assert_regc_ok(int rc, const char *what)
{
    if (rc != REGC_OK) {
        print_error("%s failed (%d): %s\n", what, rc, regc_error_message());
        fail();
    }
}

/* ---- building the case ---------------------------------------------------- */

/* Every parameter gets the reference's weights; returns their sum. */
static double fill_params(regc_test_train_case *c, const cJSON *params, uint64_t seed)
{
    int n = regc_model_n_params(c->m);
    int expected_n = cJSON_GetArraySize(params);
    if (n != expected_n) {
        print_error("case %s: regc lists %d parameters, the reference %d\n", c->name, n,
                    expected_n);
        fail();
    }
    float *w = regc_model_weights(c->m);
    assert_non_null(w);
    char *seen = calloc((size_t)expected_n, 1);
    assert_non_null(seen);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        const char *pname = regc_model_param_name(c->m, i);
        expected_param e = {0};
        if (expect_param(c, params, pname, &e) != 0 || seen[e.t]) {
            free(seen);
            print_error("case %s: unexpected or repeated parameter \"%s\"\n", c->name, pname);
            fail();
        }
        seen[e.t] = 1;
        int64_t shape[REGC_MAX_DIMS];
        int ndim = regc_model_param_shape(c->m, i, shape);
        int same = ndim == e.ndim;
        for (int d = 0; same && d < ndim; d++)
            same = shape[d] == e.shape[d];
        if (!same) {
            free(seen);
            print_error("case %s: %s has ndim %d, shape[0] %lld; HF's layout is %dD [%lld, ...]\n",
                        c->name, pname, ndim, ndim > 0 ? (long long)shape[0] : -1LL, e.ndim,
                        (long long)e.shape[0]);
            fail();
        }
        int64_t numel = regc_model_param_numel(c->m, i), offset = regc_model_param_offset(c->m, i);
        assert_true(offset >= 0 && offset + numel <= regc_model_total_numel(c->m));
        float *p = w + offset;
        regc_rng_fill_uniform(p, (size_t)numel, regc_rng_substream(seed, (uint64_t)e.t), e.center,
                              e.halfwidth);
        for (int64_t j = 0; j < numel; j++)
            sum += p[j];
    }
    free(seen);
    return sum;
}

/* The saved directory must load back with the same names and bits. */
static void check_reload(regc_test_train_case *c)
{
    assert_regc_ok(regc_model_load(c->model_dir, &c->reloaded),
                   "regc_model_load of the saved directory");
    int n = regc_model_n_params(c->m);
    assert_int_equal(regc_model_n_params(c->reloaded), n);
    const float *w = regc_model_weights(c->m), *w2 = regc_model_weights(c->reloaded);
    assert_non_null(w2);
    for (int i = 0; i < n; i++) {
        assert_string_equal(regc_model_param_name(c->reloaded, i), regc_model_param_name(c->m, i));
        int64_t numel = regc_model_param_numel(c->m, i);
        assert_int_equal(regc_model_param_numel(c->reloaded, i), numel);
        if (memcmp(w + regc_model_param_offset(c->m, i),
                   w2 + regc_model_param_offset(c->reloaded, i),
                   (size_t)numel * sizeof(float)) != 0) {
            print_error("case %s: %s changed through save and load\n", c->name,
                        regc_model_param_name(c->m, i));
            fail();
        }
    }
}

void regc_test_train_case_build(regc_test_train_case *c)
{
    const cJSON *spec = c->spec, *config = regc_test_json_get(spec, "config");
    const cJSON *params = regc_test_json_get(spec, "params");
    uint64_t seed = (uint64_t)regc_test_json_int(spec, "seed");
    int64_t n_tokens = regc_test_json_int(spec, "n_tokens");
    double param_sum = regc_test_json_number(spec, "param_sum");
    int64_t V = regc_test_json_int(config, "vocab_size");
    assert_true(cJSON_IsArray(params) && cJSON_IsArray(regc_test_json_get(spec, "extra_args")));

    /* 1. config.json -> a shape-only model -> weights allocated. */
    char path[1200];
    snprintf(c->model_dir, sizeof c->model_dir, "%s/model", c->tmp);
    assert_int_equal(mkdir(c->model_dir, 0755), 0);
    assert_regc_ok(regc_path_join(path, sizeof path, c->model_dir, "config.json"), "path");
    char *text = cJSON_Print(config);
    assert_non_null(text);
    int wrote = regc_test_write_file(path, text, strlen(text));
    free(text);
    assert_int_equal(wrote, 0);
    assert_regc_ok(regc_model_load_config(c->model_dir, &c->m), "regc_model_load_config");
    assert_regc_ok(regc_model_init_random(c->m, 0), "regc_model_init_random");
    assert_int_equal(regc_model_vocab(c->m), V);

    /* 2. Overwrite every parameter with the reference's weights. The sum
     * pins the RNG: if common/rng.c and the script ever drift, this fails
     * here rather than as a mysterious loss mismatch later. */
    double sum = fill_params(c, params, seed);
    if (!(fabs(sum - param_sum) <= SUM_RTOL * fabs(param_sum))) {
        print_error("case %s: initial weights sum to %.17g, the reference's to %.17g\n", c->name,
                    sum, param_sum);
        fail();
    }

    /* 3. Save as a Hugging Face directory; it must load back bit for bit. */
    assert_regc_ok(regc_model_save(c->m, c->model_dir), "regc_model_save");
    check_reload(c);

    /* 4. The reference's token stream. */
    c->tokens = malloc((size_t)n_tokens * sizeof *c->tokens);
    assert_non_null(c->tokens);
    uint64_t token_seed = regc_rng_substream(seed, TOKEN_STREAM);
    for (int64_t i = 0; i < n_tokens; i++)
        c->tokens[i] = (uint16_t)(regc_rng_at(token_seed, (uint64_t)i) % (uint64_t)V);
    assert_regc_ok(regc_path_join(c->tokens_path, sizeof c->tokens_path, c->tmp, "tokens.bin"),
                   "path");
    assert_regc_ok(regc_tokens_write(c->tokens_path, c->tokens, n_tokens), "regc_tokens_write");
}

/* ---- training ------------------------------------------------------------- */

/* Append " 'arg'" to cmd (of capacity cap, holding *len characters). */
static void append_arg(char *cmd, size_t cap, int *len, const char *arg)
{
    char *q = regc_test_shell_quote(arg);
    assert_non_null(q);
    *len += snprintf(cmd + *len, cap - (size_t)*len, " %s", q);
    free(q);
    assert_true(*len < (int)cap);
}

void regc_test_train_case_run(regc_test_train_case *c, int64_t steps, const char *const *flags,
                              regc_test_train_result *out)
{
    const cJSON *spec = c->spec, *extra = regc_test_json_get(spec, "extra_args");
    int64_t batch = regc_test_json_int(spec, "batch"), seq = regc_test_json_int(spec, "seq");
    double lr = regc_test_json_number(spec, "lr"), wd = regc_test_json_number(spec, "weight_decay");
    assert_true(steps > 0 && steps <= REGC_TEST_TRAIN_MAX_STEPS);

    char *qbin = regc_test_shell_quote(REGC_BIN), *qdir = regc_test_shell_quote(c->model_dir);
    char *qtok = regc_test_shell_quote(c->tokens_path);
    assert_true(qbin && qdir && qtok);
    char cmd[4096];
    int len =
        snprintf(cmd, sizeof cmd,
                 "%s train --model %s --data %s --steps %lld --batch %lld --seq %lld "
                 "--lr %.17g --weight-decay %.17g --json",
                 qbin, qdir, qtok, (long long)steps, (long long)batch, (long long)seq, lr, wd);
    free(qbin);
    free(qdir);
    free(qtok);
    const cJSON *arg;
    cJSON_ArrayForEach (arg, extra) {
        assert_true(cJSON_IsString(arg));
        append_arg(cmd, sizeof cmd, &len, arg->valuestring);
    }
    for (int i = 0; flags && flags[i]; i++)
        append_arg(cmd, sizeof cmd, &len, flags[i]);
    free(c->output);
    c->output = NULL;
    int status = regc_test_run_capture(cmd, &c->output);
    if (status != 0) {
        print_error("case %s: `%s` exited with %d; stdout:\n%s\n", c->name, cmd, status,
                    c->output ? c->output : "");
        fail();
    }

    /* One JSON object per line; the step reports are those with a loss. */
    int last_step = -1;
    out->steps = 0;
    for (char *line = strtok(c->output, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *obj = cJSON_Parse(line);
        if (!obj) {
            print_error("case %s: stdout line is not JSON: %s\n", c->name, line);
            fail();
        }
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "loss");
        if (cJSON_IsNumber(step) && cJSON_IsNumber(loss)) {
            int k = (int)step->valuedouble;
            int ok = out->steps < REGC_TEST_TRAIN_MAX_STEPS && k > last_step;
            const cJSON *norm = cJSON_GetObjectItemCaseSensitive(obj, "grad_norm");
            if (ok) {
                out->grad_norm[out->steps] = cJSON_IsNumber(norm) ? norm->valuedouble : NAN;
                out->loss[out->steps++] = loss->valuedouble;
            }
            last_step = k;
            if (!ok) {
                cJSON_Delete(obj);
                print_error("case %s: step reports out of order at step %d\n", c->name, k);
                fail();
            }
        }
        cJSON_Delete(obj);
    }
    if (out->steps != steps) {
        print_error("case %s: regc reported %d steps, expected %lld\n", c->name, out->steps,
                    (long long)steps);
        fail();
    }
}

/* ---- one CMocka test per case --------------------------------------------- */

int regc_test_train_cases_run(const char *path, const char *key, void (*test)(void **state))
{
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
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests) {
        cJSON_Delete(reference);
        return 1;
    }
    size_t n_tests = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        if (key && !cJSON_GetObjectItemCaseSensitive(c, key))
            continue;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(c, "name");
        tests[n_tests++] = (struct CMUnitTest){cJSON_IsString(nm) ? nm->valuestring : "unnamed",
                                               test, regc_test_train_case_setup,
                                               regc_test_train_case_teardown, (void *)c};
    }
    int failed = 1;
    if (n_tests == 0) {
        fprintf(stderr, "%s: no case has \"%s\" (run the script in tools/reference)\n", path,
                key ? key : "");
    } else {
        const char *base = strrchr(path, '/');
        failed = _cmocka_run_group_tests(base ? base + 1 : path, tests, n_tests, NULL, NULL);
    }
    free(tests);
    cJSON_Delete(reference);
    return failed;
}
