/* test_exports.c — models exported from PyTorch by tools/export_torch.py
 * (tests/data/exports/<name>: the checkpoint as Transformers saved it, one
 * file or bf16 shards, with the export's graph.json and
 * constants.safetensors beside it, written with PyTorch's losses by
 * tools/reference/export_cases.py) train with `regc train` from the
 * checkpoint as it is and no architecture code: each case's 5 losses agree with
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

#ifndef EXPORTS
#define EXPORTS REGC_SOURCE_DIR "/tests/data/exports"
#endif
#define TOKEN_STREAM 1000000 /* the tokens' substream index, as reference_common.py's */
#define RTOL 1e-5

static cJSON *g_ref;

static int setup(void **state) { return regc_test_dir_setup(state, "exports", NULL); }

/* The first n of the case's token stream (reference_common.make_tokens) in
 * tmp/tokens.bin; n 0: the case's n_tokens. */
static char *write_tokens_n(const regc_test_dir *d, const cJSON *c, int64_t n)
{
    const int64_t vocab = regc_test_json_int(c, "vocab");
    if (!n)
        n = regc_test_json_int(c, "n_tokens");
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

static char *write_tokens(const regc_test_dir *d, const cJSON *c)
{
    return write_tokens_n(d, c, 0);
}

static void check_case(const regc_test_dir *d, const cJSON *c)
{
    const char *name = regc_test_json_string(c, "name");
    char dir[2048], graph[2100], weights[2100], text[8][64];
    snprintf(dir, sizeof dir, "%s/%s", EXPORTS, name);
    snprintf(graph, sizeof graph, "%s/graph.json", dir);
    /* the checkpoint as Transformers saved it (the custom module's: as the
     * exporter wrote its weights), read in place */
    snprintf(weights, sizeof weights, "%s", dir);
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
    assert_true(n >= 13);
}

/* `regc train` of the Llama export with `weights`, expecting exit 1 and an
 * error naming `where` and saying `what`. */
static void expect_refused(const char *graph, const char *weights, const char *where,
                           const char *what)
{
    regc_test_proc p;
    regc_test_run_regc(&p, "train", "--model", graph, "--weights", weights, "--batch", "2", "--seq",
                       "12", "--steps", "1", NULL);
    if (p.status != 1 || !strstr(p.err, where) || !strstr(p.err, what))
        fail_msg("expected exit 1 and an error naming %s: %s; got %d:\n%s", where, what, p.status,
                 p.err);
    regc_test_proc_free(&p);
}

/* The Llama export's graph.json with its "constants" key set to `item`
 * (NULL: removed), written into the test's directory. */
static char *graph_with(const regc_test_dir *d, cJSON *item)
{
    cJSON *doc = regc_test_load_json(EXPORTS "/llama/graph.json");
    cJSON_DeleteItemFromObjectCaseSensitive(doc, "constants");
    if (item)
        cJSON_AddItemToObject(doc, "constants", item);
    char *text = cJSON_PrintUnformatted(doc), *path = regc_test_join(d->dir, "graph.json");
    assert_int_equal(regc_test_write_file(path, text, strlen(text)), 0);
    cJSON_free(text);
    cJSON_Delete(doc);
    return path;
}

static char *graph_naming(const regc_test_dir *d, const char *file)
{
    return graph_with(d, file ? cJSON_CreateString(file) : NULL);
}

/* A constant missing where the graph says its constants are is refused,
 * naming the file and the constant: from the graph's constants file, or,
 * when the graph names none, from the weights (the user's checkpoint holds
 * none). A constants file outside the graph's directory, or not named by a
 * string, is refused. */
static void test_export_without_its_constants(void **state)
{
    const regc_test_dir *d = *state;
    /* the rotary tables without rope_cos */
    regc_st_file *st = NULL;
    assert_int_equal(regc_st_open(EXPORTS "/llama/constants.safetensors", &st), REGC_OK);
    const int t = regc_st_find(st, "rope_sin");
    assert_true(t >= 0);
    /* [T, head_dim / 2]: the case's T = 12, head_dim = 8 */
    regc_st_entry e = {.name = "rope_sin", .dtype = REGC_F32, .ndim = 2, .shape = {12, 4}};
    float sin[48];
    assert_int_equal(regc_st_check_shape(st, t, e.ndim, e.shape), REGC_OK);
    assert_int_equal(regc_st_read_range(st, t, 0, 48, sin), REGC_OK);
    e.data = sin;
    regc_st_close(st);
    char *consts = regc_test_join(d->dir, "constants.safetensors");
    assert_int_equal(regc_st_write(consts, &e, 1), REGC_OK);

    char *graph = graph_naming(d, "constants.safetensors");
    expect_refused(graph, EXPORTS "/llama", consts, "missing constant rope_cos");
    free(graph);
    graph = graph_naming(d, NULL);
    expect_refused(graph, EXPORTS "/llama", EXPORTS "/llama/model.safetensors",
                   "missing constant rope_cos");
    free(graph);
    graph = graph_naming(d, "../llama/constants.safetensors");
    expect_refused(graph, EXPORTS "/llama", graph, "\"constants\" must name a file beside");
    free(graph);
    graph = graph_with(d, cJSON_CreateNumber(5));
    expect_refused(graph, EXPORTS "/llama", graph, "\"constants\" must be a file name");
    free(graph);
    free(consts);
}

/* `regc train` of the sharded export with extra arguments; its losses. */
static int train_sharded(const char *tokens, const char *const *extra, double *loss)
{
    const char *argv[40] = {REGC_BIN,  "train", "--model",   EXPORTS "/llama_sharded/graph.json",
                            "--data",  tokens,  "--weights", EXPORTS "/llama_sharded",
                            "--batch", "2",     "--seq",     "12",
                            "--lr",    "2e-3",  "--json",    "--no-cache"};
    int n = 16;
    while (*extra)
        argv[n++] = *extra++;
    argv[n] = NULL;
    regc_test_proc p;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("regc train %s: %s", argv[n - 1], p.err);
    const int got = regc_test_json_losses(p.out, loss, 16);
    regc_test_proc_free(&p);
    return got;
}

/* An export trained from the user's sharded bf16 checkpoint resumes from
 * its own checkpoint exactly (the constants from the export's file, the
 * checkpoint's copies of them left unread), and the directory --save
 * writes is a model of its own: its first loss is the straight run's next. */
static void test_export_resumes_and_saves(void **state)
{
    const regc_test_dir *d = *state;
    const cJSON *c = NULL;
    cJSON_ArrayForEach (c, regc_test_json_get(g_ref, "cases"))
        if (!strcmp(regc_test_json_string(c, "name"), "llama_sharded"))
            break;
    assert_non_null(c);
    /* 2·B·T + 1 tokens: batches 0 and 1 in turn, so that step 4 reads the
     * batch a fresh run's first step does */
    char *tokens = write_tokens_n(d, c, 2 * 2 * 12 + 1);
    char *a = regc_test_join(d->dir, "a"), *b = regc_test_join(d->dir, "b");
    char *saved = regc_test_join(d->dir, "saved"), *a2 = regc_test_join(a, "checkpoint-2");
    double straight[16], resumed[16], five[16], again[16];
    const char *run_a[] = {"--steps", "4",      "--save-steps", "2", "--output-dir",
                           a,         "--save", saved,          NULL};
    assert_int_equal(train_sharded(tokens, run_a, straight), 4);
    const char *run_b[] = {"--steps", "4", "--output-dir", b, "--resume-from-checkpoint", a2, NULL};
    assert_int_equal(train_sharded(tokens, run_b, resumed), 2);
    for (int k = 2; k < 4; k++)
        if (memcmp(&straight[k], &resumed[k - 2], sizeof(double)) != 0)
            fail_msg("step %d loss %.9g straight, %.9g resumed", k, straight[k], resumed[k - 2]);
    const char *run_c[] = {"--steps", "5", NULL};
    assert_int_equal(train_sharded(tokens, run_c, five), 5);
    char *graph = regc_test_join(saved, "graph.json");
    const char *argv[] = {REGC_BIN,  "train", "--model", graph,        "--weights", saved,
                          "--data",  tokens,  "--batch", "2",          "--seq",     "12",
                          "--steps", "1",     "--json",  "--no-cache", NULL};
    regc_test_proc p;
    if (regc_test_run_argv(argv, &p) != 0)
        fail_msg("regc train of the saved export: %s", p.err);
    assert_int_equal(regc_test_json_losses(p.out, again, 16), 1);
    regc_test_proc_free(&p);
    if (memcmp(&again[0], &five[4], sizeof(double)) != 0)
        fail_msg("the saved model's loss %.9g; the straight run's fifth %.9g", again[0], five[4]);
    free(graph), free(a), free(b), free(saved), free(a2), free(tokens);
}

int main(void)
{
    g_ref = regc_test_load_json(EXPORTS "/reference.json");
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_exports_train_like_pytorch, setup),
        regc_test_in_dir(test_export_without_its_constants, setup),
        regc_test_in_dir(test_export_resumes_and_saves, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cJSON_Delete(g_ref);
    return rc;
}
