/* test_gpt2_frontend.c — GPT-2 models: presets, random init, Hugging Face
 * directories (single file, sharded, prefix-less names, untied head),
 * save/load round trips, every config and checkpoint error, and the flat
 * forward graph, including a 70B-class shape that must cost no weights. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "regc_models.h"
#include "test_model.h"
#include "test_util.h"

/* f->path is dir/model, the HF directory most tests build. */
static int setup(void **state) { return regc_test_dir_setup(state, "gpt2", "model"); }

/* A small GPT-2 config.json in f->path. `extra` adds keys; a required key
 * it names replaces the default one (cJSON would read the first of two). */
static void write_config(regc_test_dir *f, const char *extra)
{
    static const char *const keys[][2] = {
        {"vocab_size", "64"}, {"n_positions", "16"}, {"n_embd", "16"},
        {"n_layer", "2"},     {"n_head", "2"},
    };
    regc_test_write_config(f->path, "\"model_type\": \"gpt2\", \"_name_or_path\": [1, 2]", keys,
                           sizeof keys / sizeof keys[0], extra, NULL);
}

/* config.json from write_config plus random weights saved next to it. */
static regc_model *make_small_model(regc_test_dir *f, const char *extra, uint64_t seed)
{
    write_config(f, extra);
    return regc_test_load_config(f->path, seed);
}

/* ------------------------------------------------------------- presets */

static void test_presets(void **state)
{
    (void)state;
    assert_string_equal(regc_model_preset_name(0), "gpt2-tiny");
    assert_string_equal(regc_model_preset_name(1),
                        "gpt2-124m"); /* other architectures' presets follow */
    assert_true(regc_model_is_preset("gpt2-tiny"));
    assert_false(regc_model_is_preset("gpt2"));

    regc_model *m;
    assert_int_equal(regc_model_load("gpt2-124m", &m), REGC_OK);
    assert_string_equal(regc_model_arch(m), "gpt2");
    assert_int_equal(regc_model_total_numel(m), 124439808);
    assert_int_equal(regc_model_n_params(m), 4 + 12 * 12);
    assert_int_equal(regc_model_vocab(m), 50257);
    assert_int_equal(regc_model_max_seq(m), 1024);
    assert_false(regc_model_has_weights(m));
    assert_null(regc_model_weights(m));
    int64_t shape[REGC_MAX_DIMS];
    assert_string_equal(regc_model_param_name(m, 0), "transformer.wte.weight");
    assert_int_equal(regc_model_param_shape(m, 0, shape), 2);
    assert_int_equal(shape[0], 50257);
    assert_int_equal(shape[1], 768);
    assert_string_equal(regc_model_param_name(m, 4), "transformer.h.0.attn.c_attn.weight");
    assert_int_equal(regc_model_param_shape(m, 4, shape), 2);
    assert_int_equal(shape[0], 768);
    assert_int_equal(shape[1], 3 * 768);
    assert_string_equal(regc_model_param_name(m, 147), "transformer.ln_f.bias");
    assert_null(regc_model_param_name(m, 148));
    int64_t off = 0;
    for (int i = 0; i < regc_model_n_params(m); i++) {
        assert_int_equal(regc_model_param_offset(m, i), off);
        off += regc_model_param_numel(m, i);
    }
    assert_int_equal(off, regc_model_total_numel(m));
    char d[512];
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "gpt2-124m"));
    assert_non_null(strstr(d, "124,439,808 parameters"));
    assert_non_null(strstr(d, "dropout resid 0.1"));
    regc_model_free(m);

    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_total_numel(m), 891648);
    assert_int_equal(regc_model_n_params(m), 52);
    regc_model_free(m);
}

static void test_init_random(void **state)
{
    (void)state;
    regc_model *a, *b;
    assert_int_equal(regc_model_load("gpt2-tiny", &a), REGC_OK);
    assert_int_equal(regc_model_load("gpt2-tiny", &b), REGC_OK);
    assert_int_equal(regc_model_init_random(a, 7), REGC_OK);
    assert_int_equal(regc_model_init_random(b, 7), REGC_OK);
    assert_true(regc_model_has_weights(a));
    regc_test_assert_same_weights(a, b);

    /* Parameter t is stream substream(seed, t) with GPT-2's per-kind scale. */
    const float *w = regc_model_weights(a);
    float first[4];
    regc_rng_fill_uniform(first, 4, regc_rng_substream(7, 0), 0.0f, (float)(0.02 * sqrt(3.0)));
    assert_memory_equal(w, first, sizeof first);
    const float proj_hw = (float)(0.02 / sqrt(8.0) * sqrt(3.0));
    for (int i = 0; i < regc_model_n_params(a); i++) {
        const char *name = regc_model_param_name(a, i);
        const float *p = w + regc_model_param_offset(a, i);
        int64_t n = regc_model_param_numel(a, i);
        double sum2 = 0;
        float maxabs = 0;
        for (int64_t j = 0; j < n; j++) {
            sum2 += (double)p[j] * p[j];
            maxabs = fmaxf(maxabs, fabsf(p[j]));
        }
        size_t len = strlen(name);
        if (strstr(name, "ln_") && strcmp(name + len - 7, ".weight") == 0) {
            for (int64_t j = 0; j < n; j++)
                assert_true(p[j] == 1.0f);
        } else if (strcmp(name + len - 5, ".bias") == 0) {
            for (int64_t j = 0; j < n; j++)
                assert_true(p[j] == 0.0f);
        } else if (strstr(name, "c_proj.weight")) {
            assert_true(maxabs <= proj_hw);
            assert_true(fabs(sqrt(sum2 / (double)n) - 0.02 / sqrt(8.0)) < 0.001);
        } else {
            assert_true(maxabs <= (float)(0.02 * sqrt(3.0)));
            assert_true(fabs(sqrt(sum2 / (double)n) - 0.02) < 0.002);
        }
    }
    assert_int_equal(regc_model_init_random(b, 8), REGC_OK);
    assert_memory_not_equal(regc_model_weights(a), regc_model_weights(b), 64);
    regc_model_free(a);
    regc_model_free(b);
}

/* ---------------------------------------------------- save / load files */

static void test_save_load_round_trip(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m, *back;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    char nested[1200];
    snprintf(nested, sizeof nested, "%s/runs/a/step1", f->dir);
    assert_int_equal(regc_model_save(m, nested), REGC_ERR_ARG); /* shape-only */
    regc_test_expect_error("no weights", NULL);
    assert_int_not_equal(access(nested, F_OK), 0);

    assert_int_equal(regc_model_init_random(m, 1234), REGC_OK);
    assert_int_equal(regc_model_save(m, nested), REGC_OK);
    assert_int_equal(regc_model_load(nested, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    assert_int_equal(regc_model_vocab(back), 512);
    assert_int_equal(regc_model_max_seq(back), 256);

    char path[1300];
    snprintf(path, sizeof path, "%s/config.json", nested);
    char *cfg = regc_test_read_file(path, NULL);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"GPT2LMHeadModel\""));
    assert_non_null(strstr(cfg, "\"model_type\":\t\"gpt2\""));
    free(cfg);
    regc_st_file *st;
    snprintf(path, sizeof path, "%s/model.safetensors", nested);
    assert_int_equal(regc_st_open(path, &st), REGC_OK);
    assert_int_equal(regc_st_count(st), 52);
    assert_int_equal(regc_st_find(st, "lm_head.weight"), -1);
    assert_int_equal(regc_st_find(st, "transformer.h.3.mlp.c_proj.bias"), 49);
    regc_st_close(st);

    /* Saving over an existing checkpoint replaces it; no temp files remain. */
    assert_int_equal(regc_model_save(back, nested), REGC_OK);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "ls '%s' | wc -l", nested);
    char *out = NULL;
    assert_int_equal(regc_test_run_capture(cmd, &out), 0);
    assert_int_equal(atoi(out), 2);
    free(out);
    regc_model_free(back);
    regc_model_free(m);
}

/* Checkpoint entries for m's parameters, names optionally stripped. */
static regc_st_entry *entries_of(regc_model *m, int strip_prefix)
{
    int n = regc_model_n_params(m);
    regc_st_entry *e = calloc((size_t)n, sizeof *e);
    assert_non_null(e);
    for (int i = 0; i < n; i++) {
        const char *name = regc_model_param_name(m, i);
        if (strip_prefix && strncmp(name, "transformer.", 12) == 0)
            name += 12;
        e[i].name = (char *)name;
        e[i].dtype = REGC_F32;
        e[i].ndim = regc_model_param_shape(m, i, e[i].shape);
        e[i].data = regc_model_weights(m) + regc_model_param_offset(m, i);
    }
    return e;
}

/* The n entries e as the two shards of a checkpoint in f's directory: the
 * first half of them, and the rest. */
static void write_two_shards(regc_test_dir *f, const regc_st_entry *e, int n)
{
    int half = n / 2;
    assert_int_equal(
        regc_st_write(regc_test_path_in(f, "model-00001-of-00002.safetensors"), e, half), REGC_OK);
    assert_int_equal(
        regc_st_write(regc_test_path_in(f, "model-00002-of-00002.safetensors"), e + half, n - half),
        REGC_OK);
}

/* Their index: each name mapped to its shard, but the names that contain
 * `skip` (NULL: none). Malloc'd. */
static char *shard_index(const regc_st_entry *e, int n, const char *skip)
{
    char *index = malloc(65536);
    assert_non_null(index);
    size_t len = (size_t)snprintf(index, 65536, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0, k = 0; i < n; i++)
        if (!skip || !strstr(e[i].name, skip))
            len += (size_t)snprintf(index + len, 65536 - len,
                                    "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                                    k++ ? ", " : "", e[i].name, i < n / 2 ? 1 : 2);
    snprintf(index + len, 65536 - len, "}}");
    return index;
}

static void test_sharded(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, NULL, 5), *back;
    int n = regc_model_n_params(m);
    regc_st_entry *e = entries_of(m, 0);
    write_two_shards(f, e, n);
    char *index = shard_index(e, n, NULL);
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", index), 0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    regc_model_free(back);

    /* A rank reads a range at a time: thirds of every parameter, across
     * both files, are its weights. */
    regc_weights *w;
    assert_int_equal(regc_weights_open(m, f->path, "", &w), REGC_OK);
    for (int i = 0; i < n; i++) {
        int64_t numel = regc_model_param_numel(m, i), third = numel / 3;
        float *part = malloc((size_t)numel * sizeof *part + 1);
        assert_non_null(part);
        assert_int_equal(regc_weights_read(w, i, third, numel - third, part + third), REGC_OK);
        assert_int_equal(regc_weights_read(w, i, 0, third, part), REGC_OK);
        assert_memory_equal(part, regc_model_weights(m) + regc_model_param_offset(m, i),
                            (size_t)numel * sizeof *part);
        free(part);
    }
    assert_int_equal(regc_weights_read(w, 0, 1, regc_model_param_numel(m, 0), NULL), REGC_ERR_ARG);
    regc_test_expect_error("transformer.wte.weight", "elements");
    regc_weights_close(w);

    /* An index that lacks a parameter names the index and the tensor. */
    char *cut = strstr(index, ", \"transformer.ln_f.bias\"");
    assert_non_null(cut);
    strcpy(cut, "}}");
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", index), 0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error(regc_test_path_in(f, "model.safetensors.index.json"),
                           "missing tensor transformer.ln_f.bias");

    /* A shard outside the directory is refused. */
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json",
                                          "{\"weight_map\": {\"transformer.wte.weight\": "
                                          "\"../x.safetensors\"}}"),
                     0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error("transformer.wte.weight", "inside the directory");
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", "{\"weight_"),
                     0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error(regc_test_path_in(f, "model.safetensors.index.json"), "malformed JSON");
    free(index);
    free(e);
    regc_model_free(m);
}

/* The seeded source draws what regc_model_init_random draws, a range at a
 * time; a model written in pieces, in any order, is the saved model byte
 * for byte; a prefix that no tensor has is refused at open by name. */
static void test_weights_seeded_and_writer(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_init_random(m, 99), REGC_OK);
    regc_weights *w;
    assert_int_equal(regc_weights_seeded(m, 99, &w), REGC_OK);
    int n = regc_model_n_params(m);
    float *buf = malloc((size_t)regc_model_total_numel(m) * sizeof *buf);
    assert_non_null(buf);
    for (int i = n - 1; i >= 0; i--) {
        int64_t numel = regc_model_param_numel(m, i), cut = numel * 2 / 5;
        float *p = buf + regc_model_param_offset(m, i);
        assert_int_equal(regc_weights_read(w, i, cut, numel - cut, p + cut), REGC_OK);
        assert_int_equal(regc_weights_read(w, i, 0, cut, p), REGC_OK);
    }
    regc_weights_close(w);
    assert_memory_equal(buf, regc_model_weights(m),
                        (size_t)regc_model_total_numel(m) * sizeof *buf);

    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/whole", f->dir);
    snprintf(b, sizeof b, "%s/pieces", f->dir);
    assert_int_equal(regc_model_save(m, a), REGC_OK);
    regc_model_writer *mw;
    assert_int_equal(regc_model_writer_open(m, b, &mw), REGC_OK);
    for (int i = n - 1; i >= 0; i--) {
        int64_t numel = regc_model_param_numel(m, i), cut = numel / 2;
        const float *p = buf + regc_model_param_offset(m, i);
        assert_int_equal(regc_model_writer_put(mw, i, cut, numel - cut, p + cut), REGC_OK);
        assert_int_equal(regc_model_writer_put(mw, i, 0, cut, p), REGC_OK);
    }
    assert_int_equal(regc_model_writer_finish(mw), REGC_OK);
    const char *files[] = {"model.safetensors", "config.json"};
    for (int k = 0; k < 2; k++) {
        char pa[1300], pb[1300];
        size_t na, nb;
        snprintf(pa, sizeof pa, "%s/%s", a, files[k]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[k]);
        char *xa = regc_test_read_file(pa, &na), *xb = regc_test_read_file(pb, &nb);
        assert_non_null(xa);
        assert_non_null(xb);
        assert_int_equal(na, nb);
        assert_memory_equal(xa, xb, na);
        free(xa), free(xb);
    }
    free(buf);

    char *file = regc_test_join(a, "model.safetensors");
    assert_int_equal(regc_weights_open(m, file, "exp_avg.", &w), REGC_ERR_FORMAT);
    regc_test_expect_error(file, "missing tensor exp_avg.transformer.wte.weight");
    free(file);
    assert_null(w);
    regc_model_free(m);
}

/* The original OpenAI files say "h.0.ln_1.weight" and carry attn.bias buffers. */
static void test_names_without_prefix(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, NULL, 9), *back;
    int n = regc_model_n_params(m);
    regc_st_entry *e = entries_of(m, 1);
    regc_st_entry *all = calloc((size_t)n + 2, sizeof *all);
    assert_non_null(all);
    static const float mask[16 * 16] = {0};
    all[0] = (regc_st_entry){.name = "h.0.attn.bias",
                             .dtype = REGC_F32,
                             .ndim = 4,
                             .shape = {1, 1, 16, 16},
                             .data = mask};
    memcpy(all + 1, e, (size_t)n * sizeof *e);
    all[n + 1] = (regc_st_entry){.name = "h.1.attn.bias",
                                 .dtype = REGC_BF16,
                                 .ndim = 4,
                                 .shape = {1, 1, 16, 16},
                                 .data = mask};
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), all, n + 2), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    assert_string_equal(regc_model_param_name(back, 0), "transformer.wte.weight");
    regc_model_free(back);
    free(all);
    free(e);
    regc_model_free(m);
}

static void test_untied_head(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, "\"tie_word_embeddings\": false", 3), *back;
    int n = regc_model_n_params(m);
    assert_int_equal(n, 4 + 12 * 2 + 1);
    assert_string_equal(regc_model_param_name(m, n - 1), "lm_head.weight");
    char out[1200];
    snprintf(out, sizeof out, "%s/saved", f->dir);
    assert_int_equal(regc_model_save(m, out), REGC_OK);
    assert_int_equal(regc_model_load(out, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    char d[512];
    regc_model_describe(back, d, sizeof d);
    assert_non_null(strstr(d, "untied"));

    /* The head is what the logits read. */
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(back, 1, 4, &g), REGC_OK);
    const regc_node *last = regc_graph_node(g, regc_graph_n_nodes(g) - 2);
    assert_int_equal(last->op, REGC_OP_MATMUL);
    assert_int_equal(last->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, last->in[1])->name, "lm_head.weight");
    regc_graph_free(g);
    regc_model_free(back);
    regc_model_free(m);

    /* A tied model ignores a stored lm_head.weight. */
    m = make_small_model(f, NULL, 4);
    int nt = regc_model_n_params(m);
    regc_st_entry *e = entries_of(m, 0), *all = calloc((size_t)nt + 1, sizeof *all);
    assert_non_null(all);
    memcpy(all, e, (size_t)nt * sizeof *e);
    all[nt] = all[0];
    all[nt].name = "lm_head.weight";
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), all, nt + 1),
                     REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_test_assert_same_weights(m, back);
    regc_model_free(back);
    free(all);
    free(e);
    regc_model_free(m);
}

/* -------------------------------------------------------------- errors */

static void expect_config_error(regc_test_dir *f, const char *extra, int status, const char *what)
{
    write_config(f, extra);
    regc_test_expect_config_error(f->path, status, what);
}

static void test_config_errors(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = (regc_model *)1;
    write_config(f, NULL);
    unlink(regc_test_path_in(f, "config.json"));
    assert_int_equal(regc_model_load(f->path, &m), REGC_ERR_IO);
    assert_null(m);
    regc_test_expect_error(regc_test_path_in(f, "config.json"), "cannot open");

    assert_int_equal(regc_test_write_text(f->path, "config.json", "{\"model_type\": \"gpt2\","), 0);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT, "malformed JSON");

    assert_int_equal(regc_test_write_text(f->path, "config.json", "{\"model_type\": \"mamba\"}"),
                     0);
    assert_int_equal(regc_model_load(f->path, &m), REGC_ERR_UNSUPPORTED);
    char want[4096];
    snprintf(want, sizeof want, "%s/config.json: unsupported model_type \"mamba\" (supported: gpt2",
             f->path);
    regc_test_expect_error(want, NULL);

    assert_int_equal(regc_test_write_text(f->path, "config.json", "{\"vocab_size\": 3}"), 0);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT, "missing required key \"model_type\"");

    assert_int_equal(regc_test_write_text(f->path, "config.json",
                                          "{\"model_type\": \"gpt2\", \"vocab_size\": 64, "
                                          "\"n_positions\": 16, \"n_embd\": 16, \"n_layer\": 2}"),
                     0);
    regc_test_expect_config_error(f->path, REGC_ERR_FORMAT, "missing required key \"n_head\"");

    expect_config_error(f, "\"activation_function\": \"relu\"", REGC_ERR_UNSUPPORTED,
                        "key \"activation_function\" is \"relu\"");
    expect_config_error(f, "\"activation_function\": 3", REGC_ERR_FORMAT,
                        "key \"activation_function\" must be a string");
    expect_config_error(f, "\"n_embd\": \"16\"", REGC_ERR_FORMAT,
                        "key \"n_embd\" must be an integer");
    expect_config_error(f, "\"n_layer\": 2.5", REGC_ERR_FORMAT,
                        "key \"n_layer\" must be an integer");
    expect_config_error(f, "\"vocab_size\": 0", REGC_ERR_FORMAT, "key \"vocab_size\" is 0");
    expect_config_error(f, "\"n_head\": 3", REGC_ERR_FORMAT,
                        "n_embd 16 is not divisible by n_head 3");
    expect_config_error(f, "\"scale_attn_weights\": false", REGC_ERR_UNSUPPORTED,
                        "key \"scale_attn_weights\" = false is not supported");
    expect_config_error(f, "\"scale_attn_by_inverse_layer_idx\": true", REGC_ERR_UNSUPPORTED,
                        "scale_attn_by_inverse_layer_idx");
    expect_config_error(f, "\"reorder_and_upcast_attn\": true", REGC_ERR_UNSUPPORTED,
                        "reorder_and_upcast_attn");
    expect_config_error(f, "\"tie_word_embeddings\": 1", REGC_ERR_FORMAT,
                        "key \"tie_word_embeddings\" must be true or false");
    expect_config_error(f, "\"attn_pdrop\": 1.5", REGC_ERR_FORMAT, "key \"attn_pdrop\" is 1.5");
    /* 1 is a probability, but no dropout kernel scales by 1 / (1 - p) */
    expect_config_error(f, "\"resid_pdrop\": 1", REGC_ERR_FORMAT,
                        "key \"resid_pdrop\" is 1, expected a dropout probability below 1");

    /* Optional keys: null means the default, the rest are reported. */
    write_config(f, "\"n_inner\": null, \"layer_norm_epsilon\": 1e-6, "
                    "\"activation_function\": \"gelu_pytorch_tanh\", \"resid_pdrop\": 0.0");
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    char d[512];
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "n_inner 64"));
    assert_non_null(strstr(d, "layer_norm_epsilon 1e-06"));
    assert_non_null(strstr(d, "gelu_pytorch_tanh"));
    assert_non_null(strstr(d, "dropout resid 0 embd 0.1 attn 0.1"));
    regc_model_free(m);

    char nowhere[1200];
    snprintf(nowhere, sizeof nowhere, "%s/nope", f->dir);
    assert_int_equal(regc_model_load(nowhere, &m), REGC_ERR_ARG);
    regc_test_expect_error(nowhere,
                           "not a model directory or a preset (presets: gpt2-tiny, gpt2-124m");
}

/* Sizes far beyond any model are refused before anything is allocated
 * (a billion layers would grow the parameter list until memory ran out),
 * naming the key, the value and the bound; the bounds leave room for every
 * published model. */
static void test_config_bounds(void **state)
{
    regc_test_dir *f = *state;
    expect_config_error(f, "\"n_layer\": 1000000000", REGC_ERR_FORMAT,
                        "key \"n_layer\" is 1000000000, above the bound of 4096");
    expect_config_error(f, "\"n_layer\": 5000", REGC_ERR_FORMAT,
                        "key \"n_layer\" is 5000, above the bound of 4096");
    expect_config_error(f, "\"n_embd\": 262144, \"n_head\": 1", REGC_ERR_FORMAT,
                        "key \"n_embd\" is 262144, above the bound of 131072");
    expect_config_error(f, "\"vocab_size\": 33554432", REGC_ERR_FORMAT,
                        "key \"vocab_size\" is 33554432, above the bound of 16777216");
    expect_config_error(f, "\"n_positions\": 1e300", REGC_ERR_FORMAT,
                        "key \"n_positions\" is 1.0000000000000001e+300, above the bound");
    expect_config_error(f, "\"n_inner\": 2097152", REGC_ERR_FORMAT,
                        "key \"n_inner\" is 2097152, above the bound of 1048576");
    /* at the bounds: shapes only, nothing allocated for the weights */
    write_config(f, "\"n_layer\": 4096, \"vocab_size\": 16777216, \"n_positions\": 16777216");
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    assert_int_equal(regc_model_n_params(m), 4 + 12 * 4096);
    assert_false(regc_model_has_weights(m));
    regc_model_free(m);
}

static void test_weight_errors(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, NULL, 11), *back = (regc_model *)1;
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_IO);
    assert_null(back);
    regc_test_expect_error(f->path, "no model.safetensors or model.safetensors.index.json");

    int n = regc_model_n_params(m);
    regc_st_entry *e = entries_of(m, 0);
    int skip = 0;
    while (strcmp(e[skip].name, "transformer.h.1.mlp.c_fc.weight") != 0)
        skip++;
    regc_st_entry *some = calloc((size_t)n, sizeof *some);
    assert_non_null(some);
    memcpy(some, e, (size_t)skip * sizeof *e);
    memcpy(some + skip, e + skip + 1, (size_t)(n - skip - 1) * sizeof *e);
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), some, n - 1),
                     REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    char want[4096];
    snprintf(want, sizeof want, "%s: missing tensor transformer.h.1.mlp.c_fc.weight",
             regc_test_path_in(f, "model.safetensors"));
    assert_string_equal(regc_error_message(), want);

    /* ln_1.weight stored as [2, 8] instead of [16] */
    regc_st_entry *bad = calloc((size_t)n, sizeof *bad);
    assert_non_null(bad);
    memcpy(bad, e, (size_t)n * sizeof *e);
    bad[2].ndim = 2;
    bad[2].shape[0] = 2;
    bad[2].shape[1] = 8;
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), bad, n), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_SHAPE);
    regc_test_expect_error(regc_test_path_in(f, "model.safetensors"),
                           "tensor transformer.h.0.ln_1.weight has shape [2, 8], expected [16]");

    /* A corrupt file is reported by the safetensors reader, with its name. */
    assert_int_equal(regc_test_write_file(regc_test_path_in(f, "model.safetensors"),
                                          "\xff\xff\0\0\0\0\0\0{}", 10),
                     0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error(regc_test_path_in(f, "model.safetensors"),
                           "header length 65535 exceeds file size 10");
    free(bad);
    free(some);
    free(e);
    regc_model_free(m);
}

/* A config.json with fewer layers than the weights hold would train a
 * model made of the first layers only: the weights' other tensors are
 * refused, by name, in a single file, in a sharded index and in its shards.
 * A checkpoint's optimizer file holds both moments under their own
 * prefixes: opened under one, the other's tensors are not unexpected. */
static void test_more_layers_than_config(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, NULL, 12), *back = (regc_model *)1;
    int n = regc_model_n_params(m);
    regc_st_entry *e = entries_of(m, 0);
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), e, n), REGC_OK);
    write_config(f, "\"n_layer\": 1");
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    assert_null(back);
    char want[4096];
    snprintf(want, sizeof want, "%s: unexpected tensor transformer.h.1.ln_1.weight",
             regc_test_path_in(f, "model.safetensors"));
    regc_test_expect_error(want, "has no such parameter");

    /* the same weights as two shards and an index */
    unlink(regc_test_path_in(f, "model.safetensors"));
    write_two_shards(f, e, n);
    char *index = shard_index(e, n, NULL);
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", index), 0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    snprintf(want, sizeof want, "%s: unexpected tensor transformer.h.1.",
             regc_test_path_in(f, "model.safetensors.index.json"));
    regc_test_expect_error(want, NULL);

    /* an index that lists only layer 0 still has shards holding layer 1 */
    free(index);
    index = shard_index(e, n, ".h.1.");
    assert_int_equal(regc_test_write_text(f->path, "model.safetensors.index.json", index), 0);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error("model-0000", "unexpected tensor transformer.h.1.");
    free(index);

    /* both moments in one file, each opened under its prefix */
    char *names = calloc((size_t)n * 2, 64);
    regc_st_entry *moments = calloc((size_t)n * 2, sizeof *moments);
    assert_non_null(names);
    assert_non_null(moments);
    for (int i = 0; i < 2 * n; i++) {
        moments[i] = e[i % n];
        moments[i].name = names + 64 * i;
        snprintf(moments[i].name, 64, "%s%s", i < n ? "exp_avg." : "exp_avg_sq.", e[i % n].name);
    }
    char *opt = regc_test_join(f->dir, "optimizer.safetensors");
    assert_int_equal(regc_st_write(opt, moments, 2 * n), REGC_OK);
    regc_weights *w = NULL;
    assert_int_equal(regc_weights_open(m, opt, "exp_avg.", &w), REGC_OK);
    regc_weights_close(w);
    assert_int_equal(regc_weights_open(m, opt, "exp_avg_sq.", &w), REGC_OK);
    regc_weights_close(w);
    free(opt), free(names), free(moments);
    free(e);
    regc_model_free(m);
}

/* The tensors a checkpoint may hold unread are the architecture's own: a
 * GPT-2 file with its old mask buffers loads, one with BERT's position-id
 * buffer does not. */
static void test_ignored_tensors_are_the_architectures(void **state)
{
    regc_test_dir *f = *state;
    regc_model *m = make_small_model(f, NULL, 12), *back = NULL;
    int n = regc_model_n_params(m);
    regc_st_entry *e = calloc((size_t)n + 2, sizeof *e);
    assert_non_null(e);
    regc_st_entry *own = entries_of(m, 0);
    memcpy(e, own, (size_t)n * sizeof *e);
    float one = 1.0f;
    const regc_st_entry extra = {.name = "", .dtype = REGC_F32, .ndim = 1, .data = &one};
    e[n] = e[n + 1] = extra;
    e[n].shape[0] = e[n + 1].shape[0] = 1;
    e[n].name = "transformer.h.0.attn.bias";
    e[n + 1].name = "transformer.h.0.attn.masked_bias";
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), e, n + 2), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_OK);
    regc_model_free(back);
    e[n + 1].name = "transformer.embeddings.position_ids"; /* BERT's buffer */
    assert_int_equal(regc_st_write(regc_test_path_in(f, "model.safetensors"), e, n + 2), REGC_OK);
    assert_int_equal(regc_model_load(f->path, &back), REGC_ERR_FORMAT);
    regc_test_expect_error("unexpected tensor transformer.embeddings.position_ids",
                           "has no such parameter");
    free(e), free(own);
    regc_model_free(m);
}

/* --------------------------------------------------------------- graph */

static void test_graph_tiny(void **state)
{
    (void)state;
    regc_model *m;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 2, 8, &g), REGC_OK);
    /* 3 embedding nodes, 15 per layer, 3 for the head and loss */
    assert_int_equal(regc_graph_n_nodes(g), 3 + 15 * 4 + 3);
    int inputs = 0, params = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role == REGC_ROLE_INPUT)
            inputs++;
        if (x->role == REGC_ROLE_PARAM) {
            assert_string_equal(x->name, regc_model_param_name(m, params));
            int64_t shape[REGC_MAX_DIMS];
            assert_int_equal(x->ndim, regc_model_param_shape(m, params, shape));
            assert_memory_equal(x->shape, shape, (size_t)x->ndim * sizeof *shape);
            params++;
        }
        if (x->role == REGC_ROLE_ACT)
            assert_int_equal(x->name[0], '%');
    }
    assert_int_equal(inputs, 3);
    assert_int_equal(params, 52);
    const regc_tensor *ids = regc_graph_tensor(g, regc_graph_find_tensor(g, "input_ids"));
    assert_int_equal(ids->dtype, REGC_I32);
    assert_int_equal(ids->ndim, 2);
    assert_int_equal(ids->shape[0], 2);
    assert_int_equal(ids->shape[1], 8);
    const regc_tensor *pos = regc_graph_tensor(g, regc_graph_find_tensor(g, "position_ids"));
    assert_int_equal(pos->ndim, 1);
    assert_int_equal(pos->shape[0], 8);
    assert_true(regc_graph_find_tensor(g, "targets") >= 0);
    assert_int_equal(regc_graph_n_outputs(g), 1);
    const regc_tensor *loss = regc_graph_tensor(g, regc_graph_output(g, 0));
    assert_int_equal(loss->ndim, 0);
    assert_int_equal(loss->dtype, REGC_F32);
    const regc_node *attn = regc_graph_node(g, 7);
    assert_int_equal(attn->op, REGC_OP_ATTENTION);
    assert_int_equal(attn->attrs.n_head, 4);
    assert_int_equal(attn->attrs.causal, 1);
    assert_true(fabsf(attn->attrs.scale - 1.0f / sqrtf(32.0f)) < 1e-7f);
    const regc_node *head = regc_graph_node(g, regc_graph_n_nodes(g) - 2);
    assert_int_equal(head->attrs.trans_b, 1);
    assert_string_equal(regc_graph_tensor(g, head->in[1])->name, "transformer.wte.weight");
    const regc_tensor *logits = regc_graph_tensor(g, head->out[0]);
    assert_int_equal(logits->ndim, 3);
    assert_int_equal(logits->shape[2], 512);
    regc_graph_free(g);

    assert_int_equal(regc_model_build_graph(m, 1, 256, &g), REGC_OK);
    regc_graph_free(g);
    g = (regc_graph *)1;
    assert_int_equal(regc_model_build_graph(m, 1, 257, &g), REGC_ERR_ARG);
    assert_null(g);
    assert_string_equal(regc_error_message(),
                        "sequence length 257 exceeds n_positions 256 of gpt2-tiny");
    assert_int_equal(regc_model_build_graph(m, 0, 8, &g), REGC_ERR_ARG);
    regc_test_expect_error("gpt2-tiny", "at least 1");
    assert_int_equal(regc_model_build_graph(m, 2, 0, &g), REGC_ERR_ARG);
    regc_model_free(m);
}

/* A 70B-class shape: the model and its graph cost shapes only. */
static void test_graph_huge_shape_only(void **state)
{
    regc_test_dir *f = *state;
    write_config(f, NULL);
    assert_int_equal(regc_test_write_text(f->path, "config.json",
                                          "{\"model_type\": \"gpt2\", \"vocab_size\": 50257, "
                                          "\"n_positions\": 4096, \"n_embd\": 8192, "
                                          "\"n_layer\": 96, \"n_head\": 64}"),
                     0);
    double t0 = regc_time_ms();
    regc_model *m;
    assert_int_equal(regc_model_load_config(f->path, &m), REGC_OK);
    assert_false(regc_model_has_weights(m));
    assert_true(regc_model_total_numel(m) > 77000000000LL);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, 8, 4096, &g), REGC_OK);
    assert_int_equal(regc_graph_n_nodes(g), 3 + 15 * 96 + 3);
    assert_false(regc_model_has_weights(m));
    double ms = regc_time_ms() - t0;
    assert_true(ms < 2000.0);
    regc_graph_free(g);
    regc_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_init_random),
        regc_test_in_dir(test_save_load_round_trip, setup),
        regc_test_in_dir(test_sharded, setup),
        regc_test_in_dir(test_weights_seeded_and_writer, setup),
        regc_test_in_dir(test_names_without_prefix, setup),
        regc_test_in_dir(test_untied_head, setup),
        regc_test_in_dir(test_config_errors, setup),
        regc_test_in_dir(test_weight_errors, setup),
        regc_test_in_dir(test_more_layers_than_config, setup),
        regc_test_in_dir(test_ignored_tensors_are_the_architectures, setup),
        regc_test_in_dir(test_config_bounds, setup),
        cmocka_unit_test(test_graph_tiny),
        regc_test_in_dir(test_graph_huge_shape_only, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
