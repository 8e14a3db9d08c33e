/* test_compile_cache.c — the compile cache from the pipeline's side: what
 * hits and what misses, that a warm start trains bit for bit like a cold
 * one, that damaged entries are recompiled, and that concurrent processes
 * share one directory safely. */
#include <fcntl.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "regc_train.h"
#include "region_internal.h"
#include "serial.h"
#include "test_model.h"
#include "test_util.h"

#define STEPS 3

static int setup(void **state) { return regc_test_dir_setup(state, "compile_cache", "cache"); }

/* ---------------------------------------------------------------- in process */

/* Compile m through a cache handle opened for this compile alone (as a
 * restarted process would); returns the stats. */
static regc_compile_stats compile_via(const char *dir, const char *version, const regc_model *m,
                                      int64_t batch, int64_t seq, regc_level level, int regional,
                                      const char *device)
{
    regc_cache *c = NULL;
    assert_int_equal(regc_cache_open(dir, 0, version, &c), REGC_OK);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.level = level;
    o.regional = regional;
    o.device = device;
    o.cache = c;
    regc_program *p = NULL;
    regc_compile_stats st;
    if (regc_program_compile(m, batch, seq, &o, &p, &st) != REGC_OK)
        fail_msg("compile: %s", regc_error_message());
    regc_program_free(p);
    regc_cache_close(c);
    return st;
}

static regc_compile_stats compile_at(const char *dir, const regc_model *m, int64_t seq,
                                     regc_level level)
{
    return compile_via(dir, NULL, m, 2, seq, level, 1, NULL);
}

/* A miss compiles and stores; the same compile again loads the whole step. */
static void expect_miss_then_hit(regc_compile_stats miss, regc_compile_stats hit)
{
    assert_int_equal(miss.cache_hits + miss.region_compiles + miss.glue_compiles > 0, 1);
    assert_true(miss.cache_misses >= 1);
    assert_int_equal(hit.cache_hits, 1);
    assert_int_equal(hit.cache_misses, 0);
    assert_int_equal(hit.region_compiles, 0);
    assert_int_equal(hit.glue_compiles, 0);
    /* the loaded step is the stored one */
    assert_true(hit.n_instructions == miss.n_instructions);
    assert_true(hit.peak_bytes == miss.peak_bytes);
    assert_true(hit.lower_bound_bytes == miss.lower_bound_bytes);
    assert_int_equal(hit.add_norm_fusions, miss.add_norm_fusions);
    assert_int_equal(hit.region_kinds, miss.region_kinds);
    assert_int_equal(hit.instances, miss.instances);
}

static void test_key_relevant_changes_miss(void **state)
{
    regc_test_dir *t = *state;
    const char *dir = t->path;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);

    regc_compile_stats cold = compile_at(dir, m, 16, REGC_LEVEL_O1);
    assert_int_equal(cold.cache_hits, 0);
    assert_int_equal(cold.region_compiles, 1);
    /* the step and every region it compiled were stored */
    assert_int_equal(cold.cache_misses, 1 + cold.region_compiles + cold.glue_compiles);
    expect_miss_then_hit(cold, compile_at(dir, m, 16, REGC_LEVEL_O1));

    /* each of these changes what is compiled: a miss that compiles the layer
     * again, then a hit of its own */
    regc_compile_stats s = compile_at(dir, m, 32, REGC_LEVEL_O1); /* shape */
    assert_int_equal(s.cache_hits, 0);
    assert_int_equal(s.region_compiles, 1);
    expect_miss_then_hit(s, compile_at(dir, m, 32, REGC_LEVEL_O1));

    s = compile_at(dir, m, 16, REGC_LEVEL_O0); /* level */
    assert_int_equal(s.cache_hits, 0);
    assert_int_equal(s.region_compiles, 1);
    expect_miss_then_hit(s, compile_at(dir, m, 16, REGC_LEVEL_O0));

    s = compile_via(dir, NULL, m, 2, 16, REGC_LEVEL_O1, 1, "cuda sm_90"); /* backend/device */
    assert_int_equal(s.cache_hits, 0);
    assert_int_equal(s.region_compiles, 1);
    expect_miss_then_hit(s, compile_via(dir, NULL, m, 2, 16, REGC_LEVEL_O1, 1, "cuda sm_90"));

    s = compile_via(dir, "another regc", m, 2, 16, REGC_LEVEL_O1, 1, NULL); /* version */
    assert_int_equal(s.cache_hits, 0);
    assert_int_equal(s.region_compiles, 1);
    expect_miss_then_hit(s, compile_via(dir, "another regc", m, 2, 16, REGC_LEVEL_O1, 1, NULL));

    s = compile_via(dir, NULL, m, 3, 16, REGC_LEVEL_O1, 0, NULL); /* full, other batch */
    assert_int_equal(s.cache_hits, 0);
    assert_int_equal(s.region_compiles, 1);
    expect_miss_then_hit(s, compile_via(dir, NULL, m, 3, 16, REGC_LEVEL_O1, 0, NULL));

    /* another depth is another step, but the same layer: it loads */
    regc_model *deeper = NULL;
    assert_int_equal(regc_model_with_layers(m, 5, &deeper), REGC_OK);
    s = compile_at(dir, deeper, 16, REGC_LEVEL_O1);
    assert_int_equal(s.region_compiles, 0);
    assert_true(s.cache_hits >= 1);
    assert_true(s.cache_misses >= 1); /* the step itself */
    regc_model_free(deeper);
    regc_model_free(m);
}

/* A step compiled at `precision` through the cache in dir: its stats, and
 * whether its dump shows bf16 GEMMs and fp32 ones. */
static regc_compile_stats compile_precision(const char *dir, const regc_model *m,
                                            regc_precision precision, int *bf16_gemms,
                                            int *fp32_gemms)
{
    regc_cache *c = NULL;
    assert_int_equal(regc_cache_open(dir, 0, NULL, &c), REGC_OK);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.precision = precision;
    o.cache = c;
    regc_program *p = NULL;
    regc_compile_stats st;
    if (regc_program_compile(m, 2, 16, &o, &p, &st) != REGC_OK)
        fail_msg("compile: %s", regc_error_message());
    char *text = regc_test_program_dump(p);
    *bf16_gemms = *fp32_gemms = 0;
    for (const char *g = strstr(text, "gemm["); g; g = strstr(g + 1, "gemm[")) {
        const char *end = strchr(g, ']');
        const char *flag = strstr(g, " bf16]");
        if (flag && flag < end + 1)
            ++*bf16_gemms;
        else
            ++*fp32_gemms;
    }
    free(text);
    regc_program_free(p);
    regc_cache_close(c);
    return st;
}

/* The precision is in every key: a bf16 step and its layer are misses of
 * their own (never an fp32 compile's entries: under bf16 a layer holds some
 * tensors in bf16), and every GEMM of the program it makes, or loads, is
 * bf16. */
static void test_precision_is_the_steps(void **state)
{
    regc_test_dir *t = *state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    int bf16 = 0, fp32 = 0;
    regc_compile_stats s = compile_precision(t->path, m, REGC_PRECISION_FP32, &bf16, &fp32);
    assert_int_equal(s.region_compiles, 1);
    assert_int_equal(bf16, 0);
    assert_true(fp32 > 0);
    s = compile_precision(t->path, m, REGC_PRECISION_BF16, &bf16, &fp32);
    assert_int_equal(s.region_compiles, 1); /* the layer, compiled for bf16 */
    assert_true(s.cache_misses >= 2);       /* the layer and the step */
    assert_true(bf16 > 0);
    assert_int_equal(fp32, 0);
    expect_miss_then_hit(s, compile_precision(t->path, m, REGC_PRECISION_BF16, &bf16, &fp32));
    assert_true(bf16 > 0);
    assert_int_equal(fp32, 0);
    s = compile_precision(t->path, m, REGC_PRECISION_FP32, &bf16, &fp32);
    assert_int_equal(s.cache_hits, 1); /* the fp32 step, still its own */
    assert_int_equal(bf16, 0);
    regc_model_free(m);
}

/* A graph JSON model whose parameters are all renamed keys the same entry:
 * names never enter the key. */
static void test_renamed_parameters_hit(void **state)
{
    regc_test_dir *t = *state;
    char *json = regc_test_tiny_graph_json();
    /* "transformer.h.0.attn.c_attn.weight" -> "renamed_ckpt.h.0.attn.c_attn.weight" */
    size_t n = strlen(json);
    char *renamed = malloc(2 * n + 1), *w = renamed;
    assert_non_null(renamed);
    int count = 0;
    for (const char *r = json; *r;) {
        if (!strncmp(r, "\"transformer.", 13)) {
            w += sprintf(w, "\"renamed_ckpt.");
            r += 13;
            count++;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
    assert_true(count >= 10);
    snprintf(t->buf, sizeof t->buf, "%s.a.json", t->path);
    char *a = strdup(t->buf);
    snprintf(t->buf, sizeof t->buf, "%s.b.json", t->path);
    char *b = strdup(t->buf);
    assert_int_equal(regc_test_write_file(a, json, n), 0);
    assert_int_equal(regc_test_write_file(b, renamed, strlen(renamed)), 0);

    regc_model *ma = NULL, *mb = NULL;
    assert_int_equal(regc_model_load_shapes(a, &ma), REGC_OK);
    assert_int_equal(regc_model_load_shapes(b, &mb), REGC_OK);
    regc_compile_stats cold = compile_at(t->path, ma, 16, REGC_LEVEL_O1);
    assert_int_equal(cold.cache_hits, 0);
    expect_miss_then_hit(cold, compile_at(t->path, mb, 16, REGC_LEVEL_O1));

    regc_model_free(ma), regc_model_free(mb);
    free(json), free(renamed), free(a), free(b);
}

/* ---------------------------------------------------------------- the step key */

/* The model's canonical graph and its structure bytes (what a step is
 * keyed on), as two strings of bytes to compare. */
static void canon_pair(const regc_model *m, regc_bytes *graph, regc_bytes *structure)
{
    regc_graph *g = NULL;
    memset(graph, 0, sizeof *graph);
    memset(structure, 0, sizeof *structure);
    assert_int_equal(regc_model_build_graph(m, 2, 16, &g), REGC_OK);
    assert_int_equal(regc_graph_canon(g, graph), REGC_OK);
    assert_int_equal(regc_model_write_structure(m, structure), REGC_OK);
    regc_graph_free(g);
}

static int same_bytes(const regc_bytes *a, const regc_bytes *b)
{
    return a->len == b->len && !memcmp(a->data, b->data, a->len);
}

/* Every option a schedule pass may read, and what is recomputed, changes
 * the step's key, in one process at stage 0 too (a pass a program registers may read any; the
 * built-in ones decide an offloaded update's copies there). */
static void test_step_key_sees_every_schedule_option(void **state)
{
    (void)state;
    regc_compile_options base;
    regc_compile_options_default(&base);
    regc_bytes k0 = {0};
    regc_compile_step_key(&base, &k0);
    for (int change = 0; change < 13; change++) {
        regc_compile_options o = base;
        switch (change) {
        case 0: o.deepcompile = 0; break;
        case 1: o.reduce_bucket_floats = 1000; break;
        case 2: o.prefetch_floats = 0; break;
        case 3: o.max_live_floats = 1000; break;
        case 4: o.budget_bytes = INT64_C(1) << 30; break;
        case 5: o.persistence_floats = 100; break;
        case 6: o.offload_optimizer = 1; break;
        case 7: o.passes.n = 1; break;
        case 8: o.passes.pass[0].budget_bytes = 1 << 20; break;
        case 9: o.replan_step = 5; break;
        case 10: o.recompute = REGC_RECOMPUTE_FULL; break;
        case 11: o.recompute = REGC_RECOMPUTE_SELECTIVE; break;
        case 12: o.recompute_ratio = 8.0; break; /* auto's choice */
        }
        regc_bytes k = {0};
        regc_compile_step_key(&o, &k);
        if (k.len == k0.len && !memcmp(k.data, k0.data, k.len))
            fail_msg("schedule option change %d leaves the step's key as it was", change);
        regc_bytes_free(&k);
    }
    regc_bytes_free(&k0);
}

/* A step is keyed on the model's structural config rather than on its
 * graph, so every config.json change that changes the graph must change
 * the key: each numeric and boolean key of each architecture's config,
 * changed alone. */
static void test_step_key_sees_every_config_change(void **state)
{
    regc_test_dir *t = *state;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load(presets[i], &m), REGC_OK);
        assert_int_equal(regc_model_init_random(m, 1), REGC_OK);
        char *dir = regc_test_join(t->dir, presets[i]),
             *cfg_path = regc_test_join(dir, "config.json");
        assert_int_equal(regc_model_save(m, dir), REGC_OK);
        regc_model_free(m);
        char *text = regc_test_read_file(cfg_path, NULL);
        cJSON *root = cJSON_Parse(text);
        assert_non_null(root);
        regc_model *base = NULL;
        assert_int_equal(regc_model_load_config(dir, &base), REGC_OK);
        regc_bytes g0, s0;
        canon_pair(base, &g0, &s0);
        int graph_changes = 0;
        for (cJSON *it = root->child; it; it = it->next) {
            for (int variant = 0; variant < 2; variant++) {
                cJSON *copy = cJSON_Duplicate(root, 1);
                cJSON *x = cJSON_GetObjectItemCaseSensitive(copy, it->string);
                if (cJSON_IsBool(x) && variant == 0)
                    cJSON_ReplaceItemInObjectCaseSensitive(copy, it->string,
                                                           cJSON_CreateBool(!cJSON_IsTrue(x)));
                else if (cJSON_IsNumber(x))
                    cJSON_SetNumberValue(x, variant ? x->valuedouble * 2 : x->valuedouble + 1);
                else {
                    cJSON_Delete(copy);
                    continue;
                }
                char *changed = cJSON_Print(copy);
                cJSON_Delete(copy);
                assert_int_equal(regc_test_write_file(cfg_path, changed, strlen(changed)), 0);
                free(changed);
                regc_model *m2 = NULL;
                regc_graph *g = NULL;
                /* a change the frontend refuses, or that cannot be built at
                 * [2, 16], keys nothing */
                if (regc_model_load_config(dir, &m2) == REGC_OK &&
                    regc_model_build_graph(m2, 2, 16, &g) == REGC_OK) {
                    regc_graph_free(g);
                    regc_bytes g1, s1;
                    canon_pair(m2, &g1, &s1);
                    if (!same_bytes(&g0, &g1)) {
                        graph_changes++;
                        if (same_bytes(&s0, &s1))
                            fail_msg("%s: changing %s changes the graph but not the step key",
                                     presets[i], it->string);
                    }
                    regc_bytes_free(&g1), regc_bytes_free(&s1);
                }
                regc_model_free(m2);
            }
        }
        assert_true(graph_changes >= 3); /* the test did change graphs */
        regc_bytes_free(&g0), regc_bytes_free(&s0);
        regc_model_free(base);
        cJSON_Delete(root);
        free(text), free(dir), free(cfg_path);
    }
}

/* Dumps show the compiler's work: they neither read nor write the cache. */
static void test_dumps_bypass_the_cache(void **state)
{
    regc_test_dir *t = *state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    regc_cache *c = NULL;
    assert_int_equal(regc_cache_open(t->path, 0, NULL, &c), REGC_OK);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.cache = c;
    char *dumps = regc_test_join(t->dir, "dumps");
    o.dump_dir = dumps;
    regc_program *p = NULL;
    regc_compile_stats st;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, &st), REGC_OK);
        regc_program_free(p);
        assert_int_equal(st.cache_hits, 0);
        assert_int_equal(st.cache_misses, 0);
        assert_int_equal(st.region_compiles, 1);
    }
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 0, &e, &n), REGC_OK);
    assert_int_equal(n, 0);
    regc_cache_entries_free(e, n);
    regc_cache_close(c);
    free(dumps);
    regc_model_free(m);
}

/* ---------------------------------------------------------------- in-process training */

static regc_model *train(const char *preset, const char *cache_dir, regc_level level,
                         int inline_back, int regional, regc_test_losses *l)
{
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = STEPS, o.threads = 1;
    o.compile.level = level;
    o.compile.inline_back = inline_back;
    o.compile.regional = regional;
    o.cache_dir = cache_dir;
    return regc_test_train(preset, &o, l);
}

/* Warm starts of every program form train bit for bit like a cold compile
 * without any cache. */
static void test_warm_trains_like_cold(void **state)
{
    regc_test_dir *t = *state;
    static const struct {
        const char *preset;
        regc_level level;
        int inline_back, regional;
    } cases[] = {
        {"gpt2-tiny", REGC_LEVEL_O1, 1, 1},  {"gpt2-tiny", REGC_LEVEL_O0, 1, 1},
        {"gpt2-tiny", REGC_LEVEL_O1, 0, 1},  {"gpt2-tiny", REGC_LEVEL_O1, 1, 0},
        {"llama-tiny", REGC_LEVEL_O1, 1, 1}, {"bert-tiny", REGC_LEVEL_O2, 1, 1},
        {"t5-tiny", REGC_LEVEL_O1, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regc_test_losses ref, cold, warm;
        char name[32];
        snprintf(name, sizeof name, "case%zu", i);
        char *dir = regc_test_join(t->dir, name); /* cold: nothing shared with other cases */
        regc_model *a = train(cases[i].preset, NULL, cases[i].level, cases[i].inline_back,
                              cases[i].regional, &ref);
        regc_model *b = train(cases[i].preset, dir, cases[i].level, cases[i].inline_back,
                              cases[i].regional, &cold);
        regc_model *c = train(cases[i].preset, dir, cases[i].level, cases[i].inline_back,
                              cases[i].regional, &warm);
        free(dir);
        for (int s = 0; s < STEPS; s++)
            if (memcmp(&ref.loss[s], &cold.loss[s], sizeof(float)) ||
                memcmp(&ref.loss[s], &warm.loss[s], sizeof(float)))
                fail_msg("case %zu (%s) step %d: losses %.9g (no cache), %.9g (cold), %.9g (warm)",
                         i, cases[i].preset, s, (double)ref.loss[s], (double)cold.loss[s],
                         (double)warm.loss[s]);
        assert_true(ref.hits == 0 && ref.misses == 0);
        assert_true(cold.hits == 0 && cold.misses >= 2);
        assert_true(warm.hits == 1 && warm.misses == 0);
        regc_test_assert_same_weights(a, b);
        regc_test_assert_same_weights(a, c);
        regc_model_free(a), regc_model_free(b), regc_model_free(c);
    }
}

/* ---------------------------------------------------------------- the payload */

/* A step program written, read back and written again gives the same
 * bytes; every truncation of it and every flipped byte is refused or
 * decoded without a stray read (the sanitizers watch), never crashes. */
static void test_step_payload_round_trip(void **state)
{
    (void)state;
    static const struct {
        const char *preset;
        regc_level level;
        int inline_back;
    } cases[] = {{"gpt2-tiny", REGC_LEVEL_O1, 1},
                 {"gpt2-tiny", REGC_LEVEL_O0, 1},
                 {"llama-tiny", REGC_LEVEL_O1, 0},
                 {"t5-tiny", REGC_LEVEL_O1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load_shapes(cases[i].preset, &m), REGC_OK);
        regc_compile_options o;
        regc_compile_options_default(&o);
        o.level = cases[i].level;
        o.inline_back = cases[i].inline_back;
        regc_program *p = NULL, *q = NULL;
        regc_compile_stats st, st2;
        assert_int_equal(regc_program_compile(m, 2, 16, &o, &p, &st), REGC_OK);
        regc_bytes first = {0}, second = {0};
        regc_program_write(p, &st, &first);
        assert_false(first.failed);
        memset(&st2, 0, sizeof st2);
        assert_int_equal(regc_program_read(first.data, first.len, &q, &st2), REGC_OK);
        regc_program_write(q, &st2, &second);
        assert_true(first.len == second.len && !memcmp(first.data, second.data, first.len));
        assert_true(st2.n_instructions == st.n_instructions && st2.peak_bytes == st.peak_bytes);
        regc_program_free(q);

        size_t step = first.len / 97 + 1;
        for (size_t len = 0; len < first.len; len += step) {
            q = NULL;
            assert_int_equal(regc_program_read(first.data, len, &q, &st2), REGC_ERR_FORMAT);
            assert_null(q);
        }
        for (size_t at = 0; at < first.len; at += step) {
            first.data[at] ^= 0x5a;
            q = NULL;
            int rc = regc_program_read(first.data, first.len, &q, &st2);
            assert_true(rc == REGC_OK || rc == REGC_ERR_FORMAT);
            assert_true((rc == REGC_OK) == (q != NULL));
            regc_program_free(q);
            first.data[at] ^= 0x5a;
        }
        regc_bytes_free(&first), regc_bytes_free(&second);
        regc_program_free(p);
        regc_model_free(m);
    }
}

/* ---------------------------------------------------------------- processes */

/* "compile cache DIR: H hit(s), M miss(es)" from regc train's stderr. */
static void cache_counts(const char *err, int *hits, int *misses)
{
    const char *line = strstr(err, "compile cache ");
    if (!line)
        fail_msg("no compile cache line in:\n%s", err);
    const char *colon = strstr(line, ": ");
    assert_non_null(colon);
    if (sscanf(colon + 2, "%d hit%*[s], %d miss", hits, misses) != 2 &&
        sscanf(colon + 2, "%d hit, %d miss", hits, misses) != 2)
        fail_msg("cannot read the counts in: %s", line);
}

/* The losses of regc train --json's lines, as text (bit-exact: %.9g). */
static char *loss_text(const char *out)
{
    char *s = calloc(strlen(out) + 1, 1);
    assert_non_null(s);
    for (const char *p = strstr(out, "\"loss\": "); p; p = strstr(p + 1, "\"loss\": ")) {
        const char *end = strchr(p, ',');
        assert_non_null(end);
        strncat(s, p + 8, (size_t)(end - p - 8));
        strcat(s, " ");
    }
    return s;
}

static void run_train(regc_test_proc *p, const char *cache_dir, int *hits, int *misses)
{
    int rc = regc_test_run_regc(p, "train", "--model", "gpt2-tiny", "--steps", "3", "--batch", "2",
                                "--seq", "16", "--threads", "1", "--json", "--cache-dir", cache_dir,
                                NULL);
    if (rc != 0)
        fail_msg("regc train failed (%d):\n%s", rc, p->err);
    cache_counts(p->err, hits, misses);
}

/* The step's entry: the file whose label says "step:". */
static void step_entry(const char *dir, char *path, size_t cap)
{
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(dir, 0, &e, &n), REGC_OK);
    int found = 0;
    for (int i = 0; i < n; i++)
        if (e[i].label && !strncmp(e[i].label, "step:", 5)) {
            snprintf(path, cap, "%s/%s", dir, e[i].file);
            found++;
        }
    regc_cache_entries_free(e, n);
    assert_int_equal(found, 1);
}

/* A region's entry (to take its header). */
static void region_entry(const char *dir, char *path, size_t cap)
{
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(dir, 0, &e, &n), REGC_OK);
    path[0] = 0;
    for (int i = 0; i < n && !path[0]; i++)
        if (e[i].label && !strncmp(e[i].label, "region:", 7))
            snprintf(path, cap, "%s/%s", dir, e[i].file);
    regc_cache_entries_free(e, n);
    assert_true(path[0] != 0);
}

static void test_restart_hits_in_a_new_process(void **state)
{
    regc_test_dir *t = *state;
    regc_test_proc cold, warm;
    int hits, misses;
    run_train(&cold, t->path, &hits, &misses);
    assert_int_equal(hits, 0);
    assert_true(misses >= 2); /* the step and its regions */
    run_train(&warm, t->path, &hits, &misses);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 0);
    char *a = loss_text(cold.out), *b = loss_text(warm.out);
    assert_true(strlen(a) > 0);
    assert_string_equal(a, b);
    free(a), free(b);
    regc_test_proc_free(&cold), regc_test_proc_free(&warm);

    /* --no-cache neither reads nor creates the directory */
    char *off = regc_test_join(t->dir, "never");
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "1",
                                        "--cache-dir", off, "--no-cache", NULL),
                     0);
    struct stat st;
    assert_int_not_equal(stat(off, &st), 0);
    assert_null(strstr(p.err, "compile cache"));
    regc_test_proc_free(&p);
    free(off);
}

enum { FLIP, TRUNCATE, FOREIGN_HEADER, DAMAGE_COUNT };

static void damage(const char *path, int how, const char *other)
{
    size_t n;
    char *data = regc_test_read_file(path, &n);
    assert_non_null(data);
    switch (how) {
    case FLIP: data[n / 2] ^= 0x10; break;
    case TRUNCATE: n /= 2; break;
    case FOREIGN_HEADER: {
        size_t m;
        char *o = regc_test_read_file(other, &m);
        assert_non_null(o);
        memcpy(data, o, 64); /* another entry's header, checksum and all */
        free(o);
        break;
    }
    }
    assert_int_equal(regc_test_write_file(path, data, n), 0);
    free(data);
}

/* Each kind of damage: one line naming the entry, a recompile with the
 * same losses, and the entry repaired for the next run. */
static void test_damaged_entries_recompile(void **state)
{
    regc_test_dir *t = *state;
    regc_test_proc ref;
    int hits, misses;
    char *refdir = regc_test_join(t->dir, "ref");
    run_train(&ref, refdir, &hits, &misses);
    char *want = loss_text(ref.out);
    regc_test_proc_free(&ref);
    for (int how = 0; how < DAMAGE_COUNT; how++) {
        char name[32], entry[2048], other[2048];
        snprintf(name, sizeof name, "damaged%d", how);
        char *dir = regc_test_join(t->dir, name);
        regc_test_proc p;
        run_train(&p, dir, &hits, &misses);
        regc_test_proc_free(&p);
        step_entry(dir, entry, sizeof entry);
        region_entry(dir, other, sizeof other);
        damage(entry, how, other);

        run_train(&p, dir, &hits, &misses);
        const char *slash = strrchr(entry, '/');
        if (!strstr(p.err, "regc: cache: ") || !strstr(p.err, slash + 1) ||
            !strstr(p.err, "compiling afresh"))
            fail_msg("damage %d: no line naming %s in:\n%s", how, slash + 1, p.err);
        assert_true(misses >= 1); /* the step, compiled again from its cached regions */
        char *got = loss_text(p.out);
        assert_string_equal(got, want);
        free(got);
        regc_test_proc_free(&p);

        run_train(&p, dir, &hits, &misses); /* repaired */
        assert_int_equal(hits, 1);
        assert_int_equal(misses, 0);
        assert_null(strstr(p.err, "regc: cache: "));
        regc_test_proc_free(&p);
        free(dir);
    }
    free(want), free(refdir);
}

#define N_PROCS 8

/* Eight processes compiling the same model into one empty directory at
 * once: all succeed with the same losses, and the cache is sound after. */
static void test_concurrent_writers(void **state)
{
    regc_test_dir *t = *state;
    pid_t pid[N_PROCS];
    char out[N_PROCS][2048];
    for (int i = 0; i < N_PROCS; i++) {
        snprintf(out[i], sizeof out[i], "%s/out%d.txt", t->dir, i);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        char *const argv[] = {REGC_BIN,  "train",       "--model", "gpt2-tiny", "--steps",   "2",
                              "--batch", "2",           "--seq",   "16",        "--threads", "1",
                              "--json",  "--cache-dir", t->path,   NULL};
        extern char **environ;
        assert_int_equal(posix_spawn(&pid[i], REGC_BIN, &fa, NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
    }
    char *first = NULL;
    for (int i = 0; i < N_PROCS; i++) {
        int status;
        assert_int_equal(waitpid(pid[i], &status, 0), pid[i]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        char *text = regc_test_read_file(out[i], NULL);
        assert_non_null(text);
        char *l = loss_text(text);
        free(text);
        assert_true(strlen(l) > 0);
        if (!first)
            first = l;
        else {
            assert_string_equal(l, first);
            free(l);
        }
    }
    free(first);
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "cache", "verify", "--dir", t->path, NULL), 0);
    assert_non_null(strstr(p.out, "every entry is sound"));
    regc_test_proc_free(&p);
    regc_cache_entry *e;
    int n;
    assert_int_equal(regc_cache_scan(t->path, 1, &e, &n), REGC_OK);
    assert_true(n >= 2);
    for (int i = 0; i < n; i++) {
        assert_int_equal(e[i].temporary, 0);
        assert_string_equal(e[i].problem, "");
    }
    regc_cache_entries_free(e, n);
}

/* A cache directory that cannot be made is an error naming it. */
static void test_unusable_directory(void **state)
{
    regc_test_dir *t = *state;
    assert_int_equal(regc_test_write_text(t->dir, "cache", "not a directory\n"), 0);
    char *inside = regc_test_join(t->path, "sub");
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "train", "--model", "gpt2-tiny", "--steps", "1",
                                        "--cache-dir", inside, NULL),
                     1);
    assert_int_equal(regc_test_count_lines(p.err) >= 1, 1);
    assert_non_null(strstr(p.err, t->path));
    assert_int_equal(p.out_len, 0);
    regc_test_proc_free(&p);
    free(inside);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        regc_test_in_dir(test_key_relevant_changes_miss, setup),
        regc_test_in_dir(test_renamed_parameters_hit, setup),
        regc_test_in_dir(test_step_key_sees_every_config_change, setup),
        cmocka_unit_test(test_step_key_sees_every_schedule_option),
        regc_test_in_dir(test_dumps_bypass_the_cache, setup),
        regc_test_in_dir(test_warm_trains_like_cold, setup),
        regc_test_in_dir(test_step_payload_round_trip, setup),
        regc_test_in_dir(test_precision_is_the_steps, setup),
        regc_test_in_dir(test_restart_hits_in_a_new_process, setup),
        regc_test_in_dir(test_damaged_entries_recompile, setup),
        regc_test_in_dir(test_concurrent_writers, setup),
        regc_test_in_dir(test_unusable_directory, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
