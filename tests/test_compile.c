/* test_compile.c — the region compiler end to end: regional and full
 * compilation give the same bits, every level and the lazily-inlined
 * program agree, so does every thread count, one compile per region kind
 * at every depth, the memory plan and the dumps. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_train.h"
#include "test_device.h"
#include "test_model.h"
#include "test_util.h"

#define STEPS 5

/* Train a fresh preset for STEPS steps; returns the model (trained
 * weights) and its losses. */
static regc_model *train(const char *preset, int regional, regc_level level, int inline_back,
                         regc_test_losses *l)
{
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = STEPS, o.lr = 1e-3f, o.weight_decay = 0.01f, o.threads = 2;
    o.compile.regional = regional, o.compile.level = level, o.compile.inline_back = inline_back;
    return regc_test_train(preset, &o, l);
}

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

/* Regional == full, bit for bit: every loss and every weight after 5 steps. */
static void check_regional_equals_full(regc_level level, int inline_back)
{
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_test_losses lr, lf;
        regc_model *r = train(presets[i], 1, level, inline_back, &lr);
        regc_model *f = train(presets[i], 0, level, inline_back, &lf);
        if (memcmp(lr.loss, lf.loss, sizeof lr.loss) != 0)
            fail_msg("%s at %s: regional and full losses differ (%.9g vs %.9g at step 0)",
                     presets[i], regc_level_name(level), lr.loss[0], lf.loss[0]);
        regc_test_assert_same_weights(r, f);
        regc_model_free(r);
        regc_model_free(f);
    }
}

static void test_regional_equals_full_o1(void **state)
{
    (void)state;
    check_regional_equals_full(REGC_LEVEL_O1, 1);
}

static void test_regional_equals_full_o0(void **state)
{
    (void)state;
    check_regional_equals_full(REGC_LEVEL_O0, 0);
}

static void test_regional_equals_full_lazy(void **state)
{
    (void)state;
    check_regional_equals_full(REGC_LEVEL_O1, 0);
}

/* Fusion changes speed, never bits: O0 (one kernel per op) and O1 (fused,
 * planned, inlined back) and the lazily-inlined O1 program agree exactly,
 * and O2 is O1 on the CPU. */
static void test_levels_agree(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_test_losses l0, l1, ll, l2;
        regc_model *m0 = train(presets[i], 1, REGC_LEVEL_O0, 1, &l0);
        regc_model *m1 = train(presets[i], 1, REGC_LEVEL_O1, 1, &l1);
        regc_model *ml = train(presets[i], 1, REGC_LEVEL_O1, 0, &ll);
        regc_model *m2 = train(presets[i], 1, REGC_LEVEL_O2, 1, &l2);
        for (int s = 0; s < STEPS; s++) {
            assert_true(isfinite(l0.loss[s]));
            if (l0.loss[s] != l1.loss[s] || l1.loss[s] != ll.loss[s] || l1.loss[s] != l2.loss[s])
                fail_msg("%s step %d: O0 %.9g, O1 %.9g, lazy O1 %.9g, O2 %.9g", presets[i], s,
                         l0.loss[s], l1.loss[s], ll.loss[s], l2.loss[s]);
        }
        regc_test_assert_same_weights(m0, m1);
        regc_test_assert_same_weights(m1, ml);
        regc_test_assert_same_weights(m1, m2);
        regc_model_free(m0), regc_model_free(m1), regc_model_free(ml), regc_model_free(m2);
    }
}

/* Every CPU kernel splits its work so that no sum depends on how many
 * threads share it: training at 1, 2 and 3 threads gives the same bits. */
static void test_threads_change_nothing(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_test_losses l[3];
        regc_model *m[3];
        for (int t = 0; t < 3; t++) {
            regc_train_options o;
            regc_train_options_default(&o);
            o.batch = 2, o.seq = 16, o.steps = STEPS, o.lr = 1e-3f, o.weight_decay = 0.01f;
            o.threads = t + 1;
            m[t] = regc_test_train(presets[i], &o, &l[t]);
        }
        for (int t = 1; t < 3; t++) {
            if (memcmp(l[0].loss, l[t].loss, sizeof l[0].loss) != 0)
                fail_msg("%s: losses at 1 and %d threads differ (%.9g vs %.9g at the last step)",
                         presets[i], t + 1, l[0].loss[STEPS - 1], l[t].loss[STEPS - 1]);
            regc_test_assert_same_weights(m[0], m[t]);
        }
        for (int t = 0; t < 3; t++)
            regc_model_free(m[t]);
    }
}

/* One compile per region kind, whatever the depth; a full compile is one
 * region. */
static void test_one_compile_per_kind(void **state)
{
    (void)state;
    static const int depths[] = {1, 2, 3, 8};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_model *base = NULL;
        assert_int_equal(regc_model_load_shapes(presets[i], &base), 0);
        for (size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
            regc_model *m = NULL;
            assert_int_equal(regc_model_with_layers(base, depths[d], &m), 0);
            regc_compile_options o;
            regc_compile_options_default(&o);
            regc_program *p = NULL;
            regc_compile_stats st;
            assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, &st), 0);
            assert_int_equal(st.region_compiles, st.region_kinds);
            /* encoder-decoders have two kinds, decoders and encoders one,
             * once there is a repeat to find */
            int want = depths[d] < 2 ? 0 : strcmp(presets[i], "t5-tiny") == 0 ? 2 : 1;
            assert_int_equal(st.region_kinds, want);
            if (want)
                assert_int_equal(st.instances, depths[d] * want);
            regc_program_free(p);
            o.regional = 0;
            assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, &st), 0);
            assert_int_equal(st.region_compiles, 1);
            assert_int_equal(st.region_kinds, 0);
            regc_program_free(p);
            regc_model_free(m);
        }
        regc_model_free(base);
    }
}

/* The global plan never beats the lower bound and stays within 5% of it;
 * every layer boundary of a pre-norm stack fuses its residual add with
 * the next norm. */
static void test_memory_plan(void **state)
{
    (void)state;
    static const char *const names[] = {"gpt2-tiny", "llama-tiny"};
    for (size_t i = 0; i < 2; i++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load_shapes(names[i], &m), 0);
        regc_compile_options o;
        regc_compile_options_default(&o);
        regc_program *p = NULL;
        regc_compile_stats st;
        assert_int_equal(regc_program_compile(m, 4, 64, &o, &p, &st), 0);
        assert_true(st.lower_bound_bytes > 0);
        assert_true(st.peak_bytes >= st.lower_bound_bytes);
        if ((double)st.peak_bytes > 1.05 * (double)st.lower_bound_bytes)
            fail_msg("%s: peak %lld > 1.05 x lower bound %lld", names[i], (long long)st.peak_bytes,
                     (long long)st.lower_bound_bytes);
        assert_int_equal(st.add_norm_fusions, 4); /* 4 layers: 4 adds meet the next norm */
        regc_program_free(p);
        regc_model_free(m);
    }
}

/* Under bf16 the plan counts the bytes of what is held in bf16: for every
 * architecture the activation arena is smaller than with every tensor in
 * fp32, and it stays at its lower bound (within 5%); at ZeRO-3 on 2 ranks
 * the weights are gathered in bf16: the all-gathers move fewer bytes, and
 * at least half of what they move in fp32. */
static void test_bf16_memory_plan(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load_shapes(presets[i], &m), 0);
        int64_t peak[2], arena[2], gathered[2];
        for (int wide = 0; wide < 2; wide++) {
            regc_compile_options o;
            regc_compile_options_default(&o);
            o.precision = REGC_PRECISION_BF16, o.fp32_storage = wide;
            regc_compile_options z3 = o;
            z3.ranks = 2, z3.zero_stage = 3;
            regc_program *z = NULL;
            regc_compile_stats zst;
            assert_int_equal(regc_program_compile(m, 4, 64, &z3, &z, &zst), 0);
            regc_comm_plan cp;
            regc_program_comm_plan(z, &cp);
            gathered[wide] = cp.gather_bytes;
            regc_program_free(z);
            regc_program *p = NULL;
            regc_compile_stats st;
            assert_int_equal(regc_program_compile(m, 4, 64, &o, &p, &st), 0);
            if (st.peak_bytes < st.lower_bound_bytes ||
                (double)st.peak_bytes > 1.05 * (double)st.lower_bound_bytes)
                fail_msg("%s bf16%s: peak %lld, lower bound %lld", presets[i],
                         wide ? " (fp32 storage)" : "", (long long)st.peak_bytes,
                         (long long)st.lower_bound_bytes);
            regc_device_memory dm;
            regc_program_device_memory(p, &dm);
            peak[wide] = st.peak_bytes, arena[wide] = dm.activations;
            regc_program_free(p);
        }
        print_message("%s bf16: activation plan %lld bytes, %lld with every tensor in fp32\n",
                      presets[i], (long long)peak[0], (long long)peak[1]);
        if (!(peak[0] < peak[1] && arena[0] < arena[1]))
            fail_msg("%s: the bf16 storage saves nothing (%lld vs %lld bytes)", presets[i],
                     (long long)peak[0], (long long)peak[1]);
        print_message("%s bf16, ZeRO-3 on 2 ranks: %lld bytes gathered a step, %lld in fp32\n",
                      presets[i], (long long)gathered[0], (long long)gathered[1]);
        if (!(gathered[0] < gathered[1] && 2 * gathered[0] >= gathered[1]))
            fail_msg("%s: ZeRO-3 gathers %lld bytes in bf16, %lld in fp32", presets[i],
                     (long long)gathered[0], (long long)gathered[1]);
        regc_model_free(m);
    }
}

/* The dump names every buffer: an offloaded update's host memory too. */
static void test_dump_names_host_buffers(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), 0);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.offload_optimizer = 1;
    regc_program *p = NULL;
    regc_compile_stats st;
    assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, &st), 0);
    char *text = regc_test_program_dump(p);
    if (!strstr(text, " host bytes="))
        fail_msg("an offloaded program's dump names no host buffer:\n%s", text);
    free(text);
    regc_program_free(p);
    regc_model_free(m);
}

/* The tied embedding's backward accumulates into the head's gradient in
 * the step program dumped at path: no add sums the two after it. */
static void assert_embedding_bwd_accumulates(const char *path)
{
    char *text = regc_test_read_file(path, NULL);
    assert_non_null(text);
    const char *emb = strstr(text, "embedding_bwd"), *end = strstr(text, "# buffers");
    assert_non_null(strstr(text, "embedding_bwd[acc]"));
    assert_true(emb && end && emb < end);
    const char *add = strstr(emb, "  add  ");
    if (add && add < end)
        fail_msg("%s: an add follows the embedding backward: %.60s", path, add);
    free(text);
}

/* dump_graphs writes every stage as text and the graphs as DOT. */
static void test_dump_graphs(void **state)
{
    regc_test_dir *d = *state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), 0);
    regc_compile_options o;
    regc_compile_options_default(&o);
    snprintf(d->path, sizeof d->path, "%s/dump", d->dir);
    o.dump_dir = d->path;
    regc_program *p = NULL;
    regc_compile_stats st;
    assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, &st), 0);
    static const char *const files[] = {
        "flat.txt", "flat.dot", "region0.txt", "region0.dot", "region0.compiled.txt", "step.txt"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(d->buf, sizeof d->buf, "%s/%s", d->path, files[i]);
        char *text = regc_test_read_file(d->buf, NULL);
        if (!text)
            fail_msg("missing %s", d->buf);
        if (strstr(files[i], ".dot"))
            assert_non_null(strstr(text, "digraph"));
        free(text);
    }
    /* the layer's compiled form carries the fused GEMM epilogues */
    snprintf(d->buf, sizeof d->buf, "%s/region0.compiled.txt", d->path);
    char *text = regc_test_read_file(d->buf, NULL);
    assert_non_null(strstr(text, "BIAS_GELU_AUX"));
    assert_non_null(strstr(text, "DGELU_BGRAD"));
    free(text);
    snprintf(d->buf, sizeof d->buf, "%s/step.txt", d->path);
    text = regc_test_read_file(d->buf, NULL);
    assert_non_null(strstr(text, "add_layernorm"));
    free(text);
    assert_embedding_bwd_accumulates(d->buf);
    regc_program_free(p);
    /* a full compile fuses it in the region: the head's GEMM writes the
     * gradient the embedding backward then accumulates into */
    snprintf(d->path, sizeof d->path, "%s/dump_full", d->dir);
    o.regional = 0;
    assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, &st), 0);
    snprintf(d->buf, sizeof d->buf, "%s/step.txt", d->path);
    assert_embedding_bwd_accumulates(d->buf);
    regc_program_free(p);
    o.regional = 1;
    /* a dump directory that cannot be made is an error naming it */
    snprintf(d->buf, sizeof d->buf, "%s/flat.txt/sub", d->path);
    o.dump_dir = d->buf;
    assert_true(regc_program_compile(m, 2, 8, &o, &p, &st) < 0);
    assert_null(p);
    assert_non_null(strstr(regc_error_message(), "flat.txt/sub"));
    regc_model_free(m);
}

static void test_with_layers_errors(void **state)
{
    (void)state;
    regc_model *m = NULL, *x = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), 0);
    assert_true(regc_model_with_layers(m, 0, &x) < 0);
    assert_null(x);
    assert_non_null(strstr(regc_error_message(), "at least 1"));
    assert_int_equal(regc_model_with_layers(m, 7, &x), 0);
    regc_model *y = NULL;
    assert_int_equal(regc_model_with_layers(x, 4, &y), 0);
    /* back to the original depth: the same parameters in the same order */
    assert_int_equal(regc_model_n_params(y), regc_model_n_params(m));
    for (int i = 0; i < regc_model_n_params(m); i++)
        assert_string_equal(regc_model_param_name(y, i), regc_model_param_name(m, i));
    regc_model_free(x), regc_model_free(y), regc_model_free(m);
}

/* A backend without a kernel the program needs: the run stops with an
 * error naming the kernel, before reading anything it did not write. */
static void test_missing_kernel(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), 0);
    regc_compile_options o;
    regc_compile_options_default(&o);
    regc_program *p = NULL;
    assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, NULL), 0);
    regc_backend *be = regc_backend_new("cpu", 1);
    assert_non_null(be);
    be->add_layernorm_fwd = NULL;
    size_t bytes = (size_t)regc_model_total_numel(m) * sizeof(float);
    float *params = be->alloc(be, bytes), *grads = be->alloc(be, bytes);
    void *inputs[8] = {0};
    assert_true(regc_program_n_inputs(p) <= 8);
    for (int i = 0; i < regc_program_n_inputs(p); i++) {
        size_t b = (size_t)regc_tensor_bytes(regc_program_input(p, i));
        inputs[i] = be->alloc(be, b);
        be->fill(be, inputs[i], b / sizeof(float), 0.0f); /* token 0 everywhere */
    }
    be->fill(be, params, bytes / sizeof(float), 0.0f);
    regc_program_memory mem = {.params = params, .grads = grads, .inputs = inputs};
    assert_int_equal(regc_program_bind(p, be, &mem), 0);
    assert_true(regc_program_run(p) < 0);
    assert_non_null(strstr(regc_error_message(), "add_layernorm_fwd"));
    regc_program_free(p);
    for (int i = 0; i < 8; i++)
        if (inputs[i])
            be->free(be, inputs[i]);
    be->free(be, params), be->free(be, grads);
    regc_backend_free(be);
    regc_model_free(m);
}

/* ---- O2 where capture fails -------------------------------------------------- */

static int capture_tries;
static int refuse_capture(regc_backend *be)
{
    (void)be;
    capture_tries++;
    return regc_error(REGC_ERR_IO, "this backend cannot capture");
}

/* Three steps (run, then update) of gpt2-tiny at `level` on the CPU, the
 * backend refusing to capture when `refusing`: the losses. */
static void three_steps(regc_level level, int refusing, float *loss)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), 0);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.level = level;
    regc_program *p = NULL;
    assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, NULL), 0);
    regc_backend *be = regc_backend_new("cpu", 1);
    if (refusing) { /* the entries of a backend that captures; beginning fails */
        be->capture_begin = refuse_capture;
        be->capture_end = NULL, be->graph_launch = NULL, be->graph_free = NULL;
    }
    regc_test_state st;
    regc_test_state_alloc(be, m, 0.02f, &st);
    assert_true(regc_program_n_inputs(p) <= 8);
    for (int i = 0; i < regc_program_n_inputs(p); i++) {
        size_t b = (size_t)regc_tensor_bytes(regc_program_input(p, i));
        st.inputs[i] = be->alloc(be, b);
        memset(st.inputs[i], 0, b);
        ((int32_t *)st.inputs[i])[0] = 7; /* one other token */
    }
    regc_program_memory mem = {.params = st.block[0],
                               .grads = st.block[1],
                               .m = st.block[2],
                               .v = st.block[3],
                               .inputs = st.inputs};
    assert_int_equal(regc_program_bind(p, be, &mem), 0);
    for (int s = 0; s < 3; s++) {
        assert_int_equal(regc_program_run(p), 0);
        loss[s] = *regc_program_loss(p);
        assert_int_equal(regc_program_update(p), 0);
    }
    assert_true(regc_program_capture_ms(p) == 0.0);
    regc_program_free(p);
    regc_test_state_free(be, &st);
    regc_backend_free(be);
    regc_model_free(m);
}

/* O2 on a backend that cannot capture runs as O1: each phase tries once
 * (its second run), then runs eagerly, with O1's bits and no error left. */
static void test_o2_without_capture_is_o1(void **state)
{
    (void)state;
    float o1[3], o2[3];
    three_steps(REGC_LEVEL_O1, 0, o1);
    capture_tries = 0;
    three_steps(REGC_LEVEL_O2, 1, o2);
    assert_int_equal(capture_tries, 2); /* the run's and the update's */
    assert_memory_equal(o1, o2, sizeof o1);
    assert_true(o1[2] != o1[0]); /* the updates changed something */
}

static int dir_setup(void **state) { return regc_test_dir_setup(state, "compile", NULL); }

int main(void)
{
    regc_test_gemm_or_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regional_equals_full_o1),
        cmocka_unit_test(test_regional_equals_full_o0),
        cmocka_unit_test(test_regional_equals_full_lazy),
        cmocka_unit_test(test_levels_agree),
        cmocka_unit_test(test_threads_change_nothing),
        cmocka_unit_test(test_one_compile_per_kind),
        cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_bf16_memory_plan),
        cmocka_unit_test(test_dump_names_host_buffers),
        regc_test_in_dir(test_dump_graphs, dir_setup),
        cmocka_unit_test(test_with_layers_errors),
        cmocka_unit_test(test_missing_kernel),
        cmocka_unit_test(test_o2_without_capture_is_o1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
