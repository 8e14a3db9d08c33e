/* test_rope_config.c — RoPE as config.json configures it (models/rope.c):
 * for each config of tests/data/rope_reference.json (Transformers 5.24's
 * LlamaRotaryEmbedding, written by tools/reference/rope_reference.py:
 * default, linear, llama3 and yarn, in the `rope_parameters` and the
 * `rope_theta` + `rope_scaling` spellings, head dims 16 to 128) the Llama
 * frontend's inverse frequencies and attention scaling; the rotary tables
 * carrying yarn's scaling; a scaled config surviving write_config and
 * reading back; and the refusals (other rope types, keys a type does not
 * use, partial rotation, ambiguous spellings), each one line naming the key.
 *
 * Tolerance: regc repeats Transformers' float32 ops but for torch's pow,
 * whose vectorised Sleef powf is within 1 ulp of the exact power regc
 * rounds; every other entry is equal bit for bit. Measured against the
 * recorded values (AVX2): 5 of 672 frequencies differ, each by 1 ulp (at
 * most 1.12e-7 relative), the attention scalings are equal; the test
 * allows 1 ulp and at most 1.2e-7 relative, and prints what it found. */
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
#include "test_model.h"
#include "test_reference.h"
#include "test_util.h"

#define REFERENCE REGC_SOURCE_DIR "/tests/data/rope_reference.json"

static int setup(void **state) { return regc_test_dir_setup(state, "rope", "model"); }

/* dir/config.json: a small Llama (hidden 32, 2 heads of 16, 64 positions)
 * plus `rope`, the RoPE keys as JSON members ("" for none). */
static void write_llama(regc_test_dir *f, const char *rope)
{
    char text[8192];
    snprintf(text, sizeof text,
             "{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, "
             "\"intermediate_size\": 40, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
             "\"max_position_embeddings\": 64%s%s}",
             *rope ? ", " : "", rope);
    mkdir(f->path, 0755); /* once per test; EEXIST afterwards */
    assert_int_equal(regc_test_write_text(f->path, "config.json", text), 0);
}

static regc_model *load_ok(regc_test_dir *f)
{
    regc_model *m = NULL;
    if (regc_model_load_config(f->path, &m) != REGC_OK)
        fail_msg("%s", regc_error_message());
    return m;
}

/* The ulps between two finite floats of one sign. */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* --------------------------------------------------- against Transformers */

static void test_reference(void **state)
{
    regc_test_dir *f = *state;
    cJSON *doc = regc_test_load_json(REFERENCE);
    const cJSON *cases = regc_test_json_get(doc, "cases");
    int n_cases = 0, n_freq = 0, n_off = 0;
    double worst_rel = 0.0;
    for (const cJSON *c = cases->child; c; c = c->next, n_cases++) {
        const char *name = regc_test_json_string(c, "name");
        char *text = cJSON_Print(regc_test_json_get(c, "config"));
        assert_non_null(text);
        mkdir(f->path, 0755);
        assert_int_equal(regc_test_write_text(f->path, "config.json", text), 0);
        cJSON_free(text);
        regc_model *m = NULL;
        if (regc_model_load_config(f->path, &m) != REGC_OK)
            fail_msg("%s: %s", name, regc_error_message());
        const int64_t n = regc_model_compute_rope(m, 0, NULL, 0, NULL);
        const int size = cJSON_GetArraySize(regc_test_json_get(c, "inv_freq"));
        if (n != size)
            fail_msg("%s: %lld frequencies, Transformers has %d", name, (long long)n, size);
        double *want = regc_test_json_doubles(c, "inv_freq", (size_t)n);
        float *got = malloc((size_t)n * sizeof *got);
        float scaling = 0.0f;
        assert_non_null(got);
        assert_int_equal(regc_model_compute_rope(m, regc_test_json_int(c, "seq"), got, n, &scaling),
                         n);
        for (int64_t j = 0; j < n; j++, n_freq++) {
            const float w = (float)want[j];
            assert_true((double)w == want[j]); /* recorded as float32 values */
            if (got[j] == w)
                continue;
            const double rel = fabs((double)got[j] - want[j]) / want[j];
            if (ulps(got[j], w) > 1 || rel > 1.2e-7)
                fail_msg("%s: inv_freq[%lld] is %a, Transformers' %a (%lld ulp)", name,
                         (long long)j, (double)got[j], want[j], (long long)ulps(got[j], w));
            n_off++;
            worst_rel = rel > worst_rel ? rel : worst_rel;
        }
        const float want_scaling = (float)regc_test_json_number(c, "attention_scaling");
        if (scaling != want_scaling)
            fail_msg("%s: attention scaling %.9g, Transformers' %.9g", name, (double)scaling,
                     (double)want_scaling);
        free(got);
        free(want);
        regc_model_free(m);
    }
    assert_true(n_cases >= 17);
    print_message("rope: %d cases, %d of %d frequencies 1 ulp from Transformers' (max relative "
                  "%.3g), the rest equal\n",
                  n_cases, n_off, n_freq, worst_rel);
    cJSON_Delete(doc);
}

/* yarn's attention scaling reaches the rotary tables: cos and sin are
 * Transformers' float32 cos(t * inv_freq) * scaling. */
static void test_tables_scaled(void **state)
{
    regc_test_dir *f = *state;
    write_llama(f, "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, "
                   "\"factor\": 8.0, \"original_max_position_embeddings\": 16, "
                   "\"attention_factor\": 1.25}");
    regc_model *m = load_ok(f);
    const int64_t B = 1, T = 12, half = 8;
    float inv[8], scaling;
    assert_int_equal(regc_model_compute_rope(m, 0, inv, half, &scaling), half);
    assert_true(scaling == 1.25f);
    regc_graph *g;
    assert_int_equal(regc_model_build_graph(m, B, T, &g), REGC_OK);
    regc_input in[8];
    int n = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role != REGC_ROLE_INPUT)
            continue;
        assert_true(n < 8);
        in[n] = (regc_input){
            .tensor = x, .host = calloc((size_t)regc_tensor_numel(x), regc_dtype_size(x->dtype))};
        assert_non_null(in[n].host);
        n++;
    }
    regc_tokens *data;
    assert_int_equal(regc_tokens_builtin(&data), REGC_OK);
    regc_batch_spec b = {.step = 1, .batch = B, .seq = T, .seed = 0};
    assert_int_equal(regc_model_fill_inputs(m, data, &b, n, in), REGC_OK);
    const float *cs = NULL, *sn = NULL;
    for (int i = 0; i < n; i++) {
        if (!strcmp(in[i].tensor->name, "rope_cos"))
            cs = in[i].host;
        if (!strcmp(in[i].tensor->name, "rope_sin"))
            sn = in[i].host;
    }
    assert_true(cs && sn);
    assert_true(cs[0] == 1.25f && sn[0] == 0.0f);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < half; j++) {
            const float angle = (float)t * inv[j];
            assert_true(cs[t * half + j] == cosf(angle) * 1.25f);
            assert_true(sn[t * half + j] == sinf(angle) * 1.25f);
        }
    regc_tokens_free(data);
    for (int i = 0; i < n; i++)
        free(in[i].host);
    regc_graph_free(g);
    regc_model_free(m);
}

/* A scaled RoPE survives write_config (the older spelling, which
 * Transformers 4 and 5 both read) and parse_config: same frequencies. */
static void test_round_trip(void **state)
{
    regc_test_dir *f = *state;
    static const char *const ropes[] = {
        "\"rope_scaling\": {\"type\": \"longrope\", \"original_max_position_embeddings\": 16, "
        "\"short_factor\": [1.0, 1.01, 1.05, 1.1, 1.3, 1.7, 2.3, 3.1], "
        "\"long_factor\": [1.1, 1.2, 1.5, 2.0, 3.5, 6.0, 9.0, 11.0]}",
        "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
        "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
        "\"original_max_position_embeddings\": 32}",
        "\"rope_theta\": 20000.0, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 3.0, "
        "\"beta_fast\": 8, \"mscale\": 0.5, \"mscale_all_dim\": 1.0, \"truncate\": false}",
        "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": null, "
        "\"original_max_position_embeddings\": 16, \"attention_factor\": 0.9}",
        "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.5}",
        "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 123.0}",
        /* at initialisation dynamic is the default; past 64 positions it is not */
        "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4.0}",
    };
    for (size_t i = 0; i < sizeof ropes / sizeof ropes[0]; i++) {
        write_llama(f, ropes[i]);
        regc_model *m = load_ok(f), *back = NULL;
        assert_int_equal(regc_model_with_layers(m, 2, &back), REGC_OK);
        float a[8], b[8], sa, sb;
        assert_int_equal(regc_model_compute_rope(m, 0, a, 8, &sa), 8);
        assert_int_equal(regc_model_compute_rope(back, 0, b, 8, &sb), 8);
        assert_memory_equal(a, b, sizeof a);
        assert_true(sa == sb);
        /* a plain RoPE would have given other frequencies */
        if (i < 5) {
            write_llama(f, "");
            regc_model *plain = load_ok(f);
            assert_int_equal(regc_model_compute_rope(plain, 0, b, 8, &sb), 8);
            assert_memory_not_equal(a, b, sizeof a);
            regc_model_free(plain);
        }
        regc_model_free(back);
        regc_model_free(m);
    }
    /* the description names the scaling */
    write_llama(f, ropes[1]);
    regc_model *m = load_ok(f);
    char d[1024];
    regc_model_describe(m, d, sizeof d);
    assert_non_null(strstr(d, "rope_theta 500000, rope_type llama3 factor 8"));
    regc_model_free(m);
    /* a model without RoPE says so */
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    assert_true(regc_model_compute_rope(m, 0, NULL, 0, NULL) < 0);
    regc_test_expect_error("no rotary embedding", NULL);
    regc_model_free(m);
}

/* --------------------------------------------------------------- refusals */

static void expect_refused(regc_test_dir *f, const char *rope, int status, const char *what)
{
    write_llama(f, rope);
    regc_test_expect_config_error(f->path, status, what);
}

static void test_refusals(void **state)
{
    regc_test_dir *f = *state;
    const int U = REGC_ERR_UNSUPPORTED, F = REGC_ERR_FORMAT;
    /* dynamic's factor is required; longrope's lists are numbers, as long
     * as each other and as half the head */
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"dynamic\"}", F,
                   "missing required key \"rope_parameters.factor\"");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2.0, "
                   "\"original_max_position_embeddings\": 64}",
                   U,
                   "key \"rope_parameters.original_max_position_embeddings\" is not used by "
                   "rope_type \"dynamic\"");
    expect_refused(f,
                   "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1], "
                   "\"long_factor\": [1]}",
                   F,
                   "keys \"rope_scaling.long_factor\" and \"rope_scaling.short_factor\" have 1 "
                   "values; a head of 16 rotates 8 frequencies");
    expect_refused(f,
                   "\"rope_scaling\": {\"type\": \"longrope\", \"attention_factor\": 0, "
                   "\"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], "
                   "\"long_factor\": [1, 1, 1, 1, 1, 1, 1, 1]}",
                   F, "key \"rope_scaling.attention_factor\" is 0, must be a positive float32");
    /* more factors than any head regc builds */
    char many[4096];
    int at = snprintf(many, sizeof many,
                      "\"rope_scaling\": {\"type\": \"longrope\", "
                      "\"short_factor\": [1], \"long_factor\": [1");
    for (int i = 0; i < 512; i++)
        at += snprintf(many + at, sizeof many - (size_t)at, ", 1");
    snprintf(many + at, sizeof many - (size_t)at, "]}");
    expect_refused(f, many, U, "key \"rope_scaling.long_factor\" has more than 512 values");
    expect_refused(f,
                   "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 2], "
                   "\"long_factor\": [1]}",
                   F,
                   "keys \"rope_scaling.long_factor\" (1 values) and \"rope_scaling.short_factor\" "
                   "(2) differ in length");
    expect_refused(f,
                   "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, \"x\"], "
                   "\"long_factor\": [1, 1]}",
                   F, "key \"rope_scaling.short_factor\" must be a list of numbers");
    expect_refused(f, "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1]}", F,
                   "key \"rope_scaling.long_factor\" must be a list of numbers");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"proportional\"}", U,
                   "\"rope_parameters.rope_type\" is \"proportional\"");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"default\", \"factor\": 2.0}", U,
                   "key \"rope_parameters.factor\" is not used by rope_type \"default\"");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0, "
                   "\"frobnicate\": 1}",
                   U, "key \"rope_parameters.frobnicate\" is not used by rope_type \"linear\"");
    expect_refused(f,
                   "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0, "
                   "\"low_freq_factor\": 1.0}",
                   U, "key \"rope_scaling.low_freq_factor\" is not used by rope_type \"yarn\"");
    expect_refused(f, "\"partial_rotary_factor\": 0.5", U,
                   "key \"partial_rotary_factor\" is not 1");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"default\", "
                   "\"partial_rotary_factor\": 0.25}",
                   U, "key \"rope_parameters.partial_rotary_factor\" is not 1");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"default\"}, \"rope_scaling\": "
                   "{\"rope_type\": \"linear\", \"factor\": 2.0}",
                   U, "keys \"rope_parameters\" and \"rope_scaling\" are both given");
    expect_refused(f,
                   "\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_type\": \"default\", "
                   "\"rope_theta\": 500000.0}",
                   F, "keys \"rope_theta\" (10000) and \"rope_parameters.rope_theta\" (500000)");
    expect_refused(f, "\"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"yarn\"}", F,
                   "keys \"rope_scaling.rope_type\" (\"linear\") and \"rope_scaling.type\"");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"linear\"}", F,
                   "missing required key \"rope_parameters.factor\"");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                   "\"high_freq_factor\": 4.0}",
                   F, "missing required key \"rope_parameters.low_freq_factor\"");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                   "\"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0}",
                   F, "key \"rope_parameters.high_freq_factor\" is 4, must exceed");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 0}", F,
                   "key \"rope_parameters.factor\" is 0, must be a positive float32");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": \"2\"}", F,
                   "key \"rope_parameters.factor\" must be a finite number");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": 3}", F,
                   "key \"rope_parameters.rope_type\" must be a string");
    expect_refused(f, "\"rope_scaling\": [1]", F, "key \"rope_scaling\" must be an object");
    expect_refused(f,
                   "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 2.0, "
                   "\"truncate\": 1}",
                   F, "key \"rope_parameters.truncate\" must be true or false");
    expect_refused(f, "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 0}", F,
                   "key \"rope_parameters.rope_theta\" is 0");
    /* null keys change nothing in Transformers either */
    write_llama(f, "\"rope_parameters\": {\"rope_type\": \"default\", \"factor\": null}, "
                   "\"rope_scaling\": null, \"partial_rotary_factor\": 1.0");
    regc_model_free(load_ok(f));
}

/* The CLI: a refused RoPE is one line on stderr naming the key, and a
 * non-zero status. */
static void test_cli_refusal(void **state)
{
    regc_test_dir *f = *state;
    write_llama(f, "\"rope_parameters\": {\"rope_type\": \"proportional\", \"factor\": 2.0}");
    regc_test_proc p;
    snprintf(f->buf, sizeof f->buf, "%s/graph.json", f->dir);
    const int rc = regc_test_run_regc(&p, "dump-graph", "--model", f->path, "--out", f->buf, NULL);
    assert_true(rc != 0);
    if (!strstr(p.err, "key \"rope_parameters.rope_type\" is \"proportional\"") ||
        regc_test_count_lines(p.err) != 1)
        fail_msg("stderr: %s", p.err);
    regc_test_proc_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_reference, setup),   regc_test_in_dir(test_tables_scaled, setup),
        regc_test_in_dir(test_round_trip, setup),  regc_test_in_dir(test_refusals, setup),
        regc_test_in_dir(test_cli_refusal, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
