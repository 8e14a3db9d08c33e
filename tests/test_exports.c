/* test_exports.c — models exported from PyTorch by tools/export_torch.py
 * (tests/data/exports/<name>: graph.json and model.safetensors, written with
 * PyTorch's losses by tools/reference/export_cases.py) train with `regc
 * train` and no architecture code: each case's 5 losses agree with
 * PyTorch's within 1e-5 relative on the same token stream, and `regc
 * detect` finds one layer kind per stack (two for T5) repeated once per
 * layer. No PyTorch is needed here: the exports are committed. */
#define _XOPEN_SOURCE 700
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_common.h"
#include "regc_data.h"
#include "regc_models.h"
#include "test_reference.h"
#include "test_util.h"

#define EXPORTS REGC_SOURCE_DIR "/tests/data/exports"
#define TOKEN_STREAM 1000000 /* the tokens' substream index, as reference_common.py's */
#define RTOL 1e-5

static cJSON *g_ref;

static int setup(void **state) { return regc_test_dir_setup(state, "exports", NULL); }

/* The case's token stream (reference_common.make_tokens) in tmp/tokens.bin. */
static char *write_tokens(const regc_test_dir *d, const cJSON *c)
{
    const int64_t n = regc_test_json_int(c, "n_tokens"), vocab = regc_test_json_int(c, "vocab");
    const uint64_t stream =
        regc_rng_substream((uint64_t)regc_test_json_int(c, "seed"), TOKEN_STREAM);
    uint16_t *tokens = malloc((size_t)n * sizeof *tokens);
    assert_non_null(tokens);
    for (int64_t i = 0; i < n; i++)
        tokens[i] = (uint16_t)(regc_rng_at(stream, (uint64_t)i) % (uint64_t)vocab);
    char *path = regc_test_join(d->dir, "tokens.bin");
    assert_int_equal(regc_tokens_write(path, tokens, n), REGC_OK);
    free(tokens);
    return path;
}

static void check_case(const regc_test_dir *d, const cJSON *c)
{
    const char *name = regc_test_json_string(c, "name");
    char dir[2048], graph[2100], weights[2100], text[8][64];
    snprintf(dir, sizeof dir, "%s/%s", EXPORTS, name);
    snprintf(graph, sizeof graph, "%s/graph.json", dir);
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    const int64_t steps = regc_test_json_int(c, "steps");
    double *want = regc_test_json_doubles(c, "losses", (size_t)steps);
    snprintf(text[0], sizeof text[0], "%lld", (long long)regc_test_json_int(c, "batch"));
    snprintf(text[1], sizeof text[1], "%lld", (long long)regc_test_json_int(c, "seq"));
    snprintf(text[2], sizeof text[2], "%.17g", regc_test_json_number(c, "lr"));
    snprintf(text[3], sizeof text[3], "%.17g", regc_test_json_number(c, "weight_decay"));
    snprintf(text[4], sizeof text[4], "%lld", (long long)steps);
    char *tokens = write_tokens(d, c);

    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", graph, "--weights", weights,
                                        "--data", tokens, "--batch", text[0], "--seq", text[1],
                                        "--lr", text[2], "--weight-decay", text[3], "--steps",
                                        text[4], "--json", NULL),
                     0);
    double got[16];
    assert_int_equal(regc_test_json_losses(p.out, got, 16), (int)steps);
    regc_test_proc_free(&p);
    for (int64_t i = 0; i < steps; i++)
        if (!(fabs(got[i] - want[i]) <= RTOL * fabs(want[i])))
            fail_msg("%s step %lld: regc %.9g, PyTorch %.9g (relative %.2e)", name, (long long)i,
                     got[i], want[i], fabs(got[i] - want[i]) / fabs(want[i]));

    /* one layer kind per stack (an encoder-decoder has two), one instance
     * per layer */
    assert_int_equal(regc_test_run_regc(&p, "detect", "--model", graph, "--batch", text[0], "--seq",
                                        text[1], "--json", NULL),
                     0);
    cJSON *det = cJSON_Parse(p.out);
    assert_non_null(det);
    const cJSON *regions = regc_test_json_get(det, "regions"), *kind;
    const int64_t kinds = regc_test_json_int(c, "kinds"), layers = regc_test_json_int(c, "layers");
    int ok = cJSON_GetArraySize(regions) == kinds;
    cJSON_ArrayForEach (kind, regions)
        ok = ok && regc_test_json_int(kind, "instances") == layers;
    if (!ok)
        fail_msg("%s: regc detect found %s, not %lld kinds x %lld layers", name, p.out,
                 (long long)kinds, (long long)layers);
    cJSON_Delete(det);
    regc_test_proc_free(&p);
    free(want);
    free(tokens);
}

static void test_exports_train_like_pytorch(void **state)
{
    const regc_test_dir *d = *state;
    const cJSON *cases = regc_test_json_get(g_ref, "cases"), *c;
    int n = 0;
    cJSON_ArrayForEach (c, cases) {
        check_case(d, c);
        n++;
    }
    assert_true(n >= 7);
}

/* A graph with a constant missing from the weights file is refused, naming
 * the constant: the Llama export without its rotary tables. */
static void test_export_without_its_constants(void **state)
{
    const regc_test_dir *d = *state;
    char *weights = regc_test_join(d->dir, "params.safetensors");
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes(EXPORTS "/llama/graph.json", &m), REGC_OK);
    assert_true(regc_model_n_constants(m) >= 2);
    regc_st_file *st = NULL;
    assert_int_equal(regc_st_open(EXPORTS "/llama/model.safetensors", &st), REGC_OK);
    const int n = regc_model_n_params(m);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    for (int i = 0; i < n; i++) { /* the parameters alone, as they are */
        e[i].name = (char *)regc_model_param_name(m, i);
        e[i].dtype = REGC_F32;
        e[i].ndim = regc_model_param_shape(m, i, e[i].shape);
        const int64_t count = regc_model_param_numel(m, i);
        float *data = malloc((size_t)count * sizeof *data + 4);
        assert_int_equal(regc_st_read_range(st, regc_st_find(st, e[i].name), 0, count, data),
                         REGC_OK);
        e[i].data = data;
    }
    assert_int_equal(regc_st_write(weights, e, n), REGC_OK);
    for (int i = 0; i < n; i++)
        free((void *)e[i].data);
    free(e);
    regc_st_close(st);
    regc_model_free(m);
    regc_test_proc p;
    regc_test_run_regc(&p, "train", "--model", EXPORTS "/llama/graph.json", "--weights", weights,
                       "--batch", "2", "--seq", "12", "--steps", "1", NULL);
    if (p.status != 1 || !strstr(p.err, weights) || !strstr(p.err, "missing constant rope_cos"))
        fail_msg("expected exit 1 and an error naming %s and the constant rope_cos; got %d:\n%s",
                 weights, p.status, p.err);
    regc_test_proc_free(&p);
    free(weights);
}

int main(void)
{
    g_ref = regc_test_load_json(EXPORTS "/reference.json");
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_exports_train_like_pytorch, setup),
        regc_test_in_dir(test_export_without_its_constants, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cJSON_Delete(g_ref);
    return rc;
}
