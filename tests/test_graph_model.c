/* test_graph_model.c — models given as regc graph JSON (models/graph_model.c)
 * and `regc dump-graph`: the exported graph of a model trains bit for bit like
 * the model itself, and every bad input gets one line naming the file. */
#define _XOPEN_SOURCE 700
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
#include "test_model.h"
#include "test_util.h"

#define N_STEPS 3

static int setup(void **state) { return regc_test_dir_setup(state, "graph_model", NULL); }

/* Exit status `status`, nothing on stdout, and the error as the last stderr
 * line, naming a and b; regc train describes the model first, so at most one
 * description line may precede it. */
static void expect_cli_error(const regc_test_proc *p, int status, const char *a, const char *b)
{
    int lines = regc_test_count_lines(p->err);
    const char *last = p->err;
    if (lines == 2)
        last = strchr(p->err, '\n') + 1;
    int described = lines == 1 ||
                    (lines == 2 && (!strncmp(p->err, "graph ", 6) || !strncmp(p->err, "gpt2 ", 5)));
    if (p->status != status || p->out_len != 0 || !described || p->err[p->err_len - 1] != '\n' ||
        strncmp(last, "regc", 4) != 0 || !strstr(last, a) || (b && !strstr(last, b)))
        fail_msg("expected exit %d and one stderr error line naming \"%s\" and \"%s\"; got exit "
                 "%d:\n%s",
                 status, a, b ? b : "", p->status, p->err);
}

/* The losses of a --json run as floats: printed with %.9g, so exact. */
static int json_losses(const char *out, float *loss, int max)
{
    double d[16];
    int n = regc_test_json_losses(out, d, max < 16 ? max : 16);
    for (int i = 0; i < n; i++)
        loss[i] = (float)d[i];
    return n;
}

static int files_equal(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *ta = regc_test_read_file(a, &na), *tb = regc_test_read_file(b, &nb);
    assert_non_null(ta);
    assert_non_null(tb);
    int eq = na == nb && memcmp(ta, tb, na) == 0;
    free(ta);
    free(tb);
    return eq;
}

/* gpt2-tiny's graph at [2, 16], written through the library. */
static void write_tiny_graph(const char *path)
{
    char *json = regc_test_tiny_graph_json();
    assert_int_equal(regc_test_write_file(path, json, strlen(json)), 0);
    free(json);
}

/* ---- the exported graph is the model ----------------------------------- */

/* Every tensor of file a (or only tensor `only`) is in file b with the
 * same bytes (b may hold more: a graph model's constants). */
static void expect_tensors_within(const char *a, const char *b, const char *only)
{
    regc_st_file *fa = NULL, *fb = NULL;
    assert_int_equal(regc_st_open(a, &fa), REGC_OK);
    assert_int_equal(regc_st_open(b, &fb), REGC_OK);
    for (int i = 0; i < regc_st_count(fa); i++) {
        const char *name = regc_st_name(fa, i);
        if (only && strcmp(name, only) != 0)
            continue;
        int j = regc_st_find(fb, name);
        if (j < 0)
            fail_msg("%s: no tensor %s", b, name);
        int64_t n = regc_st_bytes(fa, i) / 4;
        assert_int_equal(regc_st_bytes(fb, j), n * 4);
        float *x = malloc((size_t)n * 4 + 4), *y = malloc((size_t)n * 4 + 4);
        if (regc_st_read_range(fa, i, 0, n, x) != REGC_OK) { /* an integer constant */
            assert_int_equal(regc_st_read_i32(fa, i, n, (int32_t *)(void *)x), REGC_OK);
            assert_int_equal(regc_st_read_i32(fb, j, n, (int32_t *)(void *)y), REGC_OK);
        } else {
            assert_int_equal(regc_st_read_range(fb, j, 0, n, y), REGC_OK);
        }
        if (memcmp(x, y, (size_t)n * 4) != 0)
            fail_msg("tensor %s differs between %s and %s", name, a, b);
        free(x), free(y);
    }
    regc_st_close(fa);
    regc_st_close(fb);
}

/* A model saved as a graph model (`regc dump-graph --save`: graph.json with
 * its constants marked, model.safetensors with the parameters and the
 * constants' values) trains bit for bit like the model, with no
 * architecture code; what it saves reloads. */
static void saved_graph_trains_like(const char *dir, const char *preset, const char *constant)
{
    char *hf = regc_test_join(dir, "hf"), *gdir = regc_test_join(dir, "g");
    char *graph = regc_test_join(gdir, "graph.json"), *again = regc_test_join(dir, "again.json");
    char *weights = regc_test_join(gdir, "model.safetensors");
    char *hf3 = regc_test_join(dir, "hf3"), *gs3 = regc_test_join(dir, "gs3");
    regc_test_proc p;

    /* Weights to start from: one step of the preset, saved as an HF dir. */
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", preset, "--steps", "1", "--batch",
                                        "2", "--seq", "16", "--json", "--save", hf, NULL),
                     0);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", hf, "--batch", "2", "--seq",
                                        "16", "--save", gdir, NULL),
                     0);
    assert_int_equal(p.out_len, 0);
    regc_test_proc_free(&p);
    /* The graph marks the constant, and the weights file holds it. */
    char *text = regc_test_read_file(graph, NULL);
    char want[160];
    snprintf(want, sizeof want, "\"name\":\t\"%s\"", constant);
    const char *at = strstr(text, want);
    assert_non_null(at);
    assert_non_null(strstr(at, "\"role\":\t\"constant\""));
    free(text);
    regc_st_file *st = NULL;
    assert_int_equal(regc_st_open(weights, &st), REGC_OK);
    assert_true(regc_st_find(st, constant) >= 0);
    regc_st_close(st);
    /* Dumping the graph model again gives the same graph. */
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", graph, "--batch", "2", "--seq",
                                        "16", "--out", again, NULL),
                     0);
    regc_test_proc_free(&p);
    assert_true(files_equal(graph, again));

    float a[N_STEPS + 1], b[N_STEPS + 1];
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", hf, "--steps", "3", "--batch", "2",
                                        "--seq", "16", "--json", "--save", hf3, NULL),
                     0);
    assert_int_equal(json_losses(p.out, a, N_STEPS + 1), N_STEPS);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", graph, "--weights", weights,
                                        "--steps", "3", "--batch", "2", "--seq", "16", "--json",
                                        "--save", gs3, NULL),
                     0);
    assert_int_equal(json_losses(p.out, b, N_STEPS + 1), N_STEPS);
    if (!strstr(p.err, "graph ") || !strstr(p.err, graph))
        fail_msg("the description names neither the architecture nor the file:\n%s", p.err);
    regc_test_proc_free(&p);
    for (int i = 0; i < N_STEPS; i++) {
        assert_true(isfinite(a[i]));
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            fail_msg("%s step %d: loss %.9g from the HF dir, %.9g from the graph model", preset, i,
                     (double)a[i], (double)b[i]);
    }

    /* The same trained parameters, and the graph saved beside them (not a
     * config.json), with the constants; the saved pair loads back. */
    char *w3 = regc_test_join(hf3, "model.safetensors"),
         *gw3 = regc_test_join(gs3, "model.safetensors");
    char *gg3 = regc_test_join(gs3, "graph.json"), *gc3 = regc_test_join(gs3, "config.json");
    expect_tensors_within(w3, gw3, NULL);
    expect_tensors_within(weights, gw3, constant); /* constants never change */
    assert_true(files_equal(gg3, graph));
    assert_false(regc_test_is_file(gc3));
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", gg3, "--weights", gw3, "--steps",
                                        "1", "--batch", "2", "--seq", "16", "--json", NULL),
                     0);
    regc_test_proc_free(&p);

    /* A run resumed from a checkpoint (which holds the constants too) goes
     * on as the run that never stopped. */
    char *out = regc_test_join(dir, "out");
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", graph, "--weights", weights,
                                        "--steps", "2", "--batch", "2", "--seq", "16",
                                        "--output-dir", out, "--save-steps", "2", NULL),
                     0);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", graph, "--weights", weights,
                                        "--steps", "3", "--batch", "2", "--seq", "16",
                                        "--output-dir", out, "--resume-from-checkpoint", "latest",
                                        "--json", NULL),
                     0);
    float c[N_STEPS + 1];
    assert_int_equal(json_losses(p.out, c, N_STEPS + 1), 1);
    assert_memory_equal(&c[0], &b[2], sizeof c[0]);
    regc_test_proc_free(&p);
    free(out);

    /* The architecture's weights lack the constant: refused, naming it. */
    char *hfw = regc_test_join(hf, "model.safetensors");
    regc_test_run_regc(&p, "train", "--model", graph, "--weights", hfw, "--batch", "2", "--seq",
                       "16", "--steps", "1", NULL);
    snprintf(want, sizeof want, "missing constant %s", constant);
    expect_cli_error(&p, 1, hfw, want);
    regc_test_proc_free(&p);
    /* No weights at all: the random init has no constants. */
    regc_test_run_regc(&p, "train", "--model", graph, "--batch", "2", "--seq", "16", "--steps", "1",
                       NULL);
    snprintf(want, sizeof want, "constant %s has no values", constant);
    expect_cli_error(&p, 1, graph, want);
    regc_test_proc_free(&p);

    free(w3), free(gw3), free(gg3), free(gc3), free(hfw);
    free(hf), free(gdir), free(graph), free(again), free(weights), free(hf3), free(gs3);
}

static void test_saved_graph_trains_like_gpt2(void **state)
{
    regc_test_dir *f = *state;
    saved_graph_trains_like(f->dir, "gpt2-tiny", "position_ids");
}

static void test_saved_graph_trains_like_llama(void **state)
{
    regc_test_dir *f = *state;
    saved_graph_trains_like(f->dir, "llama-tiny", "rope_cos");
}

/* A constant that indexes a table is checked against its rows when it is
 * read; models whose data inputs are their own are not saved as graphs. */
static void test_graph_constant_errors(void **state)
{
    regc_test_dir *f = *state;
    char *gdir = regc_test_join(f->dir, "g"), *graph = regc_test_join(gdir, "graph.json");
    char *weights = regc_test_join(gdir, "model.safetensors");
    char *bad = regc_test_join(f->dir, "bad.safetensors"), *bert = regc_test_join(f->dir, "bert");
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", "--batch", "2",
                                        "--seq", "16", "--save", gdir, NULL),
                     0);
    regc_test_proc_free(&p);

    /* The same file with position 3 past the position table's rows. */
    regc_st_file *st = NULL;
    assert_int_equal(regc_st_open(weights, &st), REGC_OK);
    const int n = regc_st_count(st);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    int64_t shape[REGC_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        e[i].name = (char *)regc_st_name(st, i);
        int64_t bytes = regc_st_bytes(st, i);
        void *data = malloc((size_t)bytes + 4);
        int is_pos = !strcmp(e[i].name, "position_ids");
        if (is_pos) {
            assert_int_equal(regc_st_read_i32(st, i, bytes / 4, data), REGC_OK);
            ((int32_t *)data)[3] = 4096;
        } else {
            assert_int_equal(regc_st_read_range(st, i, 0, bytes / 4, data), REGC_OK);
        }
        e[i].dtype = is_pos ? REGC_I32 : REGC_F32;
        e[i].ndim = 1; /* shapes are checked: take them from the graph model below */
        e[i].shape[0] = bytes / 4;
        e[i].data = data;
    }
    /* the real shapes, from the graph model */
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes(graph, &m), REGC_OK);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < regc_model_n_params(m); k++)
            if (!strcmp(regc_model_param_name(m, k), e[i].name))
                e[i].ndim = regc_model_param_shape(m, k, shape),
                memcpy(e[i].shape, shape, sizeof shape);
    }
    regc_model_free(m);
    assert_int_equal(regc_st_write(bad, e, n), REGC_OK);
    for (int i = 0; i < n; i++)
        free((void *)e[i].data);
    free(e);
    regc_st_close(st);
    regc_test_run_regc(&p, "train", "--model", graph, "--weights", bad, "--batch", "2", "--seq",
                       "16", "--steps", "1", NULL);
    expect_cli_error(&p, 1, "constant position_ids holds 4096 at element 3",
                     "transformer.wpe.weight");
    regc_test_proc_free(&p);

    /* a graph model is one already */
    regc_test_run_regc(&p, "dump-graph", "--model", graph, "--batch", "2", "--seq", "16", "--save",
                       bert, NULL);
    expect_cli_error(&p, 1, graph, "a graph model already");
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(bert));

    regc_test_run_regc(&p, "dump-graph", "--model", "bert-tiny", "--save", bert, NULL);
    expect_cli_error(&p, 1, "bert-tiny", "a bert model fills its data inputs its own way");
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(bert));

    free(gdir), free(graph), free(weights), free(bad), free(bert);
}

/* ---- decomposed ops are fused back ------------------------------------------ */

static int count_op(const regc_graph *g, regc_op op)
{
    int n = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++)
        n += regc_graph_node(g, i)->op == op;
    return n;
}

/* A graph written op by op is fused back into the very graph the
 * frontend builds (the same canonical bytes, so the same program and the
 * same bits); a pattern whose inside something else reads stays as it is. */
static void test_decomposed_ops_fuse_back(void **state)
{
    (void)state;
    const char *const presets[] = {"gpt2-tiny", "llama-tiny"};
    const regc_op fused[] = {REGC_OP_GELU, REGC_OP_RMSNORM};
    for (int p = 0; p < 2; p++) {
        regc_model *m = NULL;
        regc_graph *g = NULL, *f = NULL;
        assert_int_equal(regc_model_load_shapes(presets[p], &m), REGC_OK);
        assert_int_equal(regc_model_build_graph(m, 2, 16, &g), REGC_OK);
        regc_graph *d = regc_test_decompose(g);
        assert_int_equal(count_op(d, fused[p]), 0);
        assert_int_equal(count_op(d, REGC_OP_LAYERNORM), 0);
        assert_int_equal(regc_graph_fuse_patterns(d, &f), REGC_OK);
        assert_true(count_op(f, fused[p]) > 0);
        regc_bytes a = {0}, b = {0};
        assert_int_equal(regc_graph_canon(g, &a), REGC_OK);
        assert_int_equal(regc_graph_canon(f, &b), REGC_OK);
        if (a.len != b.len || memcmp(a.data, b.data, a.len) != 0)
            fail_msg("%s: the fused graph is not the frontend's", presets[p]);
        regc_bytes_free(&a), regc_bytes_free(&b);
        regc_graph_free(f);

        /* a mean square read elsewhere too (made a second output): that
         * pattern stays written out */
        int ms = -1;
        for (int i = 0; i < regc_graph_n_nodes(d) && ms < 0; i++)
            if (regc_graph_node(d, i)->op == REGC_OP_MEAN_LAST)
                ms = regc_graph_node(d, i)->out[0];
        if (p) {
            assert_int_equal(regc_graph_mark_output(d, ms), REGC_OK);
            assert_int_equal(regc_graph_fuse_patterns(d, &f), REGC_OK);
            assert_int_equal(count_op(f, REGC_OP_RMSNORM), count_op(g, REGC_OP_RMSNORM) - 1);
            regc_graph_free(f);
        }
        regc_graph_free(d);
        regc_graph_free(g);
        regc_model_free(m);
    }

    /* LayerNorm divided by the square root, as torch's sqrt exports */
    regc_graph *g = regc_graph_new(), *f = NULL;
    int x = regc_graph_add_tensor(g, "x", REGC_F32, REGC_ROLE_INPUT, 3, (int64_t[]){2, 3, 8});
    int w = regc_graph_add_tensor(g, "w", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){8});
    int b = regc_graph_add_tensor(g, "b", REGC_F32, REGC_ROLE_PARAM, 1, (int64_t[]){8});
    int d = regc_graph_sub(g, x, regc_graph_mean_last(g, x));
    int var = regc_graph_mean_last(g, regc_graph_pow(g, d, 2.0f));
    int sd = regc_graph_pow(g, regc_graph_add_scalar(g, var, 1e-5f), 0.5f);
    int y = regc_graph_bias_add(g, regc_graph_mul(g, regc_graph_div(g, d, sd), w), b);
    assert_int_equal(regc_graph_mark_output(g, y), REGC_OK);
    assert_int_equal(regc_graph_fuse_patterns(g, &f), REGC_OK);
    assert_int_equal(count_op(f, REGC_OP_LAYERNORM), 1);
    assert_int_equal(regc_graph_n_nodes(f), 1);
    assert_true(regc_graph_node(f, 0)->attrs.eps == 1e-5f);
    regc_graph_free(f);
    regc_graph_free(g);
}

/* ---- the library's view of a graph model -------------------------------- */

static void test_graph_model_shapes_and_init(void **state)
{
    regc_test_dir *f = *state;
    char *path = regc_test_join(f->dir, "g.json");
    write_tiny_graph(path);

    regc_model *ref = NULL, *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &ref), REGC_OK);
    assert_int_equal(regc_model_load(path, &m), REGC_OK);
    assert_string_equal(regc_model_arch(m), "graph");
    assert_int_equal(regc_model_vocab(m), 512);
    assert_int_equal(regc_model_max_seq(m), 16);
    assert_false(regc_model_has_weights(m));
    assert_int_equal(regc_model_n_params(m), regc_model_n_params(ref));
    assert_int_equal(regc_model_total_numel(m), regc_model_total_numel(ref));
    for (int i = 0; i < regc_model_n_params(m); i++)
        assert_string_equal(regc_model_param_name(m, i), regc_model_param_name(ref, i));
    char desc[512];
    regc_model_describe(m, desc, sizeof desc);
    assert_non_null(strstr(desc, "graph "));
    assert_non_null(strstr(desc, "(shape only)"));

    /* Fixed shapes: only [2, 16] builds. */
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 2, 16, &g), REGC_OK);
    regc_graph_free(g);
    assert_int_equal(regc_model_build_graph(m, 4, 16, &g), REGC_ERR_SHAPE);
    assert_null(g);
    regc_test_expect_error("g.json: the graph is built for batch 2 and sequence 16",
                           "got batch 4, sequence 16");

    /* The documented init: matrices uniform std 0.02, 1-D "...weight" 1, others 0. */
    assert_int_equal(regc_model_init_random(m, 7), REGC_OK);
    const float *w = regc_model_weights(m);
    const float hw = (float)(0.02 * sqrt(3.0));
    for (int i = 0; i < regc_model_n_params(m); i++) {
        int64_t shape[8];
        int nd = regc_model_param_shape(m, i, shape);
        const char *name = regc_model_param_name(m, i);
        const float *v = w + regc_model_param_offset(m, i);
        int64_t n = regc_model_param_numel(m, i);
        size_t len = strlen(name);
        int nonzero = 0;
        for (int64_t k = 0; k < n; k++) {
            if (nd >= 2) {
                assert_true(v[k] >= -hw && v[k] < hw);
                nonzero |= v[k] != 0.0f;
            } else {
                float want = strcmp(name + len - 6, "weight") == 0 ? 1.0f : 0.0f;
                assert_true(v[k] == want);
            }
        }
        if (nd >= 2)
            assert_true(nonzero);
    }
    regc_model_free(m);
    regc_model_free(ref);
    free(path);
}

/* ---- errors --------------------------------------------------------------- */

static void test_graph_model_errors(void **state)
{
    regc_test_dir *f = *state;
    char *graph = regc_test_join(f->dir, "g.json"), *bad = regc_test_join(f->dir, "bad.json");
    char *noloss = regc_test_join(f->dir, "noloss.json"),
         *missing = regc_test_join(f->dir, "nope.json");
    char *w1 = regc_test_join(f->dir, "one.safetensors"),
         *w2 = regc_test_join(f->dir, "shape.safetensors");
    char *out = regc_test_join(f->dir, "out.json");
    write_tiny_graph(graph);
    regc_test_proc p;

    /* The fixed shapes. */
    regc_test_run_regc(&p, "train", "--model", graph, "--batch", "3", "--seq", "16", "--steps", "1",
                       NULL);
    expect_cli_error(&p, 1, graph, "built for batch 2 and sequence 16; got batch 3, sequence 16");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", graph, "--batch", "2", "--seq", "32", "--steps", "1",
                       NULL);
    expect_cli_error(&p, 1, graph, "got batch 2, sequence 32");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "dump-graph", "--model", graph, "--out", out,
                       NULL); /* defaults 4 x 64 */
    expect_cli_error(&p, 1, graph, "got batch 4, sequence 64");
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(out));

    /* --weights: a missing tensor, a wrong shape, a missing file. */
    static float data[512 * 128];
    regc_st_entry e = {.name = "transformer.wte.weight",
                       .dtype = REGC_F32,
                       .ndim = 2,
                       .shape = {512, 128},
                       .data = data};
    assert_int_equal(regc_st_write(w1, &e, 1), REGC_OK);
    regc_test_run_regc(&p, "train", "--model", graph, "--weights", w1, "--batch", "2", "--seq",
                       "16", "--steps", "1", NULL);
    expect_cli_error(&p, 1, w1, "missing tensor transformer.wpe.weight");
    regc_test_proc_free(&p);
    e.shape[1] = 64;
    assert_int_equal(regc_st_write(w2, &e, 1), REGC_OK);
    regc_test_run_regc(&p, "train", "--model", graph, "--weights", w2, "--batch", "2", "--seq",
                       "16", "--steps", "1", NULL);
    expect_cli_error(&p, 1, w2, "transformer.wte.weight");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "train", "--model", graph, "--weights", missing, "--batch", "2", "--seq",
                       "16", "--steps", "1", NULL);
    expect_cli_error(&p, 1, missing, NULL);
    regc_test_proc_free(&p);

    /* --weights belongs to graph models only. */
    regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--weights", w1, "--steps", "1", NULL);
    expect_cli_error(&p, 2, "--weights", "graph JSON");
    regc_test_proc_free(&p);

    /* A malformed file, a graph without a loss, a file that is not there. */
    assert_int_equal(regc_test_write_text(f->dir, "bad.json", "{\"format\": \"regc-graph\", "), 0);
    regc_test_run_regc(&p, "train", "--model", bad, "--steps", "1", NULL);
    expect_cli_error(&p, 1, bad, NULL);
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "dump-graph", "--model", bad, "--out", out, NULL);
    expect_cli_error(&p, 1, bad, NULL);
    regc_test_proc_free(&p);

    char *text = regc_test_read_file(graph, NULL);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "outputs", cJSON_CreateArray());
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(regc_test_write_file(noloss, text, strlen(text)), 0);
    cJSON_free(text);
    regc_test_run_regc(&p, "train", "--model", noloss, "--batch", "2", "--seq", "16", "--steps",
                       "1", NULL);
    expect_cli_error(&p, 1, noloss, "no outputs");
    regc_test_proc_free(&p);

    /* an encoder-decoder's decoder inputs of another shape than input_ids */
    char *dec = regc_test_join(f->dir, "dec.json");
    text = regc_test_read_file(graph, NULL);
    root = cJSON_Parse(text);
    free(text);
    int next = 0; /* the next unused id: past every tensor and node output */
    const cJSON *item, *id;
    cJSON_ArrayForEach (item, cJSON_GetObjectItemCaseSensitive(root, "tensors"))
        next = (int)cJSON_GetObjectItemCaseSensitive(item, "id")->valuedouble + 1 > next
                   ? (int)cJSON_GetObjectItemCaseSensitive(item, "id")->valuedouble + 1
                   : next;
    cJSON_ArrayForEach (item, cJSON_GetObjectItemCaseSensitive(root, "nodes"))
        cJSON_ArrayForEach (id, cJSON_GetObjectItemCaseSensitive(item, "out"))
            next = (int)id->valuedouble + 1 > next ? (int)id->valuedouble + 1 : next;
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", next);
    cJSON_AddStringToObject(t, "name", "decoder_input_ids");
    cJSON_AddStringToObject(t, "dtype", "i32");
    cJSON_AddStringToObject(t, "role", "input");
    cJSON_AddItemToObject(t, "shape", cJSON_CreateIntArray((const int[]){2, 15}, 2));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(root, "tensors"), t);
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(regc_test_write_file(dec, text, strlen(text)), 0);
    cJSON_free(text);
    regc_test_run_regc(&p, "train", "--model", dec, "--batch", "2", "--seq", "16", "--steps", "1",
                       NULL);
    expect_cli_error(&p, 1, dec, "decoder_input_ids must be an i32 data input of shape [2, 16]");
    regc_test_proc_free(&p);
    free(dec);

    regc_test_run_regc(&p, "train", "--model", missing, "--steps", "1", NULL);
    expect_cli_error(&p, 1, missing, NULL);
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(out));

    free(graph), free(bad), free(noloss), free(missing), free(w1), free(w2), free(out);
}

/* A graph whose "wte" table has `rows` rows for a vocabulary of 16 (the
 * logits' width) and whose "wpe" table has `pos_rows` rows for a sequence of
 * 4; with `narrow`, a second cross_entropy reads the targets against logits
 * 8 wide. */
static char *short_table_graph(int rows, int pos_rows, int narrow)
{
    static const char *fmt =
        "{\"format\": \"regc-graph\", \"version\": 1, \"tensors\": ["
        "{\"id\": 0, \"name\": \"input_ids\", \"dtype\": \"i32\", \"role\": \"input\", "
        "\"shape\": [2, 4]},"
        "{\"id\": 1, \"name\": \"position_ids\", \"dtype\": \"i32\", \"role\": \"input\", "
        "\"shape\": [4]},"
        "{\"id\": 2, \"name\": \"targets\", \"dtype\": \"i32\", \"role\": \"input\", "
        "\"shape\": [2, 4]},"
        "{\"id\": 3, \"name\": \"wte\", \"dtype\": \"f32\", \"role\": \"param\", "
        "\"shape\": [%d, 8]},"
        "{\"id\": 4, \"name\": \"wpe\", \"dtype\": \"f32\", \"role\": \"param\", "
        "\"shape\": [%d, 8]},"
        "{\"id\": 5, \"name\": \"head\", \"dtype\": \"f32\", \"role\": \"param\", "
        "\"shape\": [16, 8]},"
        "{\"id\": 6, \"name\": \"small_head\", \"dtype\": \"f32\", \"role\": \"param\", "
        "\"shape\": [8, 8]}],"
        "\"nodes\": ["
        "{\"op\": \"embedding\", \"in\": [0, 3], \"out\": [7]},"
        "{\"op\": \"embedding\", \"in\": [1, 4], \"out\": [8]},"
        "{\"op\": \"bias_add\", \"in\": [7, 8], \"out\": [9]},"
        "{\"op\": \"matmul\", \"in\": [9, 5], \"out\": [10], \"trans_a\": 0, \"trans_b\": 1},"
        "{\"op\": \"cross_entropy\", \"in\": [10, 2], \"out\": [11, 12]},"
        "{\"op\": \"matmul\", \"in\": [9, %d], \"out\": [13], \"trans_a\": 0, \"trans_b\": 1},"
        "{\"op\": \"cross_entropy\", \"in\": [13, 2], \"out\": [14, 15]}],"
        "\"outputs\": [11, 14]}";
    char *text = malloc(strlen(fmt) + 64);
    assert_non_null(text);
    sprintf(text, fmt, rows, pos_rows, narrow ? 6 : 5);
    return text;
}

/* An embedding table with fewer rows than the ids that index it can hold
 * would be read past its end by the kernel: refused at load, naming the
 * table, its rows and the vocabulary (or sequence). */
static void test_graph_model_short_tables(void **state)
{
    regc_test_dir *f = *state;
    char *path = regc_test_join(f->dir, "g.json");
    const struct {
        int rows, pos_rows, narrow;
        const char *a, *b;
    } cases[] = {
        {16, 4, 0, NULL, NULL},
        {10, 4, 0, "embedding: tensor wte has 10 rows", "fewer than the vocabulary (16)"},
        {16, 3, 0, "embedding: tensor wpe has 3 rows", "fewer than the sequence (4)"},
        {16, 4, 1, "cross_entropy: tensor %13 has 8 rows", "vocabulary (16) whose ids targets"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = short_table_graph(cases[i].rows, cases[i].pos_rows, cases[i].narrow);
        assert_int_equal(regc_test_write_file(path, text, strlen(text)), 0);
        free(text);
        regc_model *m = NULL;
        int rc = regc_model_load_shapes(path, &m);
        if (!cases[i].a) {
            assert_int_equal(rc, REGC_OK);
            assert_int_equal(regc_model_vocab(m), 16);
            regc_model_free(m);
            continue;
        }
        assert_int_equal(rc, REGC_ERR_SHAPE);
        assert_null(m);
        regc_test_expect_error(path, cases[i].a);
        regc_test_expect_error(cases[i].b, NULL);
    }
    free(path);
}

/* ---- regc dump-graph -------------------------------------------------------- */

static void test_dump_graph_cli(void **state)
{
    regc_test_dir *f = *state;
    regc_test_proc p;
    static const char *const flags[] = {"--model", "--batch", "--seq", "--out", "--text", "--help"};
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--help", NULL), 0);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(p.out, flags[i]))
            fail_msg("regc dump-graph --help does not mention %s:\n%s", flags[i], p.out);
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "help", "dump-graph", NULL), 0);
    assert_non_null(strstr(p.out, "--text"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "--help", NULL), 0);
    assert_non_null(strstr(p.out, "dump-graph"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "train", "--help", NULL), 0);
    assert_non_null(strstr(p.out, "--weights"));
    regc_test_proc_free(&p);

    /* Usage errors. */
    char *out = regc_test_join(f->dir, "g.txt");
    regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", NULL);
    expect_cli_error(&p, 2, "regc dump-graph", "--out");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", "--out", out, "--batch", "0",
                       NULL);
    expect_cli_error(&p, 2, "regc dump-graph", "--batch");
    regc_test_proc_free(&p);
    regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", "--out", out, "--frob", "1", NULL);
    expect_cli_error(&p, 2, "regc dump-graph", "--frob");
    regc_test_proc_free(&p);
    /* An error of the model leaves no file. */
    regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", "--seq", "257", "--out", out,
                       NULL);
    expect_cli_error(&p, 1, "gpt2-tiny", "exceeds n_positions 256");
    regc_test_proc_free(&p);
    assert_false(regc_test_is_file(out));

    /* --text: the readable listing. */
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", "gpt2-tiny", "--batch", "2",
                                        "--seq", "16", "--text", "--out", out, NULL),
                     0);
    regc_test_proc_free(&p);
    char *text = regc_test_read_file(out, NULL);
    assert_non_null(text);
    assert_true(text[0] != '{');
    assert_non_null(strstr(text, "input_ids"));
    assert_non_null(strstr(text, "transformer.h.3.mlp.c_fc.weight"));
    free(text);

    /* Shapes only: a 64B-parameter config.json without any weights dumps. */
    char *big = regc_test_join(f->dir, "big"), *bigjson = regc_test_join(f->dir, "big.json");
    assert_int_equal(mkdir(big, 0755), 0);
    assert_int_equal(regc_test_write_text(big, "config.json",
                                          "{\"model_type\": \"gpt2\", \"vocab_size\": 50257, "
                                          "\"n_positions\": 4096, \"n_embd\": 8192, "
                                          "\"n_layer\": 80, \"n_head\": 64}"),
                     0);
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", big, "--batch", "1", "--seq",
                                        "8", "--out", bigjson, NULL),
                     0);
    regc_test_proc_free(&p);
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(bigjson, &m), REGC_OK);
    assert_int_equal(regc_model_n_params(m), 2 + 80 * 12 + 2);
    assert_true(regc_model_total_numel(m) > 60000000000LL);
    assert_false(regc_model_has_weights(m));
    assert_int_equal(regc_model_vocab(m), 50257);
    regc_model_free(m);
    free(big), free(bigjson), free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_saved_graph_trains_like_gpt2, setup),
        regc_test_in_dir(test_saved_graph_trains_like_llama, setup),
        regc_test_in_dir(test_graph_constant_errors, setup),
        cmocka_unit_test(test_decomposed_ops_fuse_back),
        regc_test_in_dir(test_graph_model_shapes_and_init, setup),
        regc_test_in_dir(test_graph_model_errors, setup),
        regc_test_in_dir(test_graph_model_short_tables, setup),
        regc_test_in_dir(test_dump_graph_cli, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
