/* test_passes.c — the schedule passes: the registry, the built-in passes
 * on a profile, and compile.schedule re-planning a run.
 *
 * - A pass registered by the library's user runs when compile.passes names
 *   it, sees its budget, and the step is linked with what it decides; a
 *   failing pass fails the compile with its message; an unknown name is
 *   refused naming it.
 * - selective_gather keeps first the units a profile says cost the most
 *   per element to gather (the smallest without one).
 * - The prefetch pass on a profile: when every unit's all-gather costs more
 *   than the compute of the units before it, gathers start further ahead
 *   than when they cost less; an explicit prefetch wins over the profile.
 * - A measured stage 3 program gives each unit its all-gathers per step
 *   (two, or one for a unit its backward does not read) and some compute.
 * - Re-planned at a step of compile.schedule, a run gives the bits of one
 *   never re-planned (every schedule computes the same sums); the re-plan
 *   took its passes (the resident units it chose), and a second run finds
 *   the re-planned step in the compile cache; a run resumed past a listed
 *   step starts with that step's plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_train.h"
#include "test_model.h"
#include "test_util.h"

#define STEPS 6

static regc_program *compile_with(const regc_compile_options *co)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    regc_program *p = NULL;
    int rc = regc_program_compile(m, 2, 16, co, &p, NULL);
    regc_model_free(m);
    return rc == REGC_OK ? p : NULL;
}

static regc_compile_options stage3(int ranks)
{
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.ranks = ranks, co.zero_stage = 3;
    return co;
}

/* ---- the registry ----------------------------------------------------------- */

static int64_t seen_budget;

/* Every unit resident, gathers two units ahead. */
static int keep_everything(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    seen_budget = in->budget_bytes;
    s->prefetch_floats = -2;
    for (int u = 0; u < in->layout->n_units; u++)
        s->resident[u] = 1;
    (void)user;
    return REGC_OK;
}

static int refuse(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    (void)in, (void)s;
    return regc_error(REGC_ERR_ARG, "%s: no schedule suits this step", (const char *)user);
}

static void test_registered_pass_decides(void **state)
{
    (void)state;
    assert_int_equal(regc_pass_register("keep_everything", keep_everything, NULL), REGC_OK);
    assert_int_equal(regc_pass_register("refuse", refuse, "refuse"), REGC_OK);
    assert_true(regc_pass_register("", keep_everything, NULL) != REGC_OK);
    assert_true(regc_pass_known("keep_everything") && !regc_pass_known("nothing"));
    regc_compile_options co = stage3(2);
    co.passes.n = 1;
    snprintf(co.passes.pass[0].name, REGC_PASS_NAME, "keep_everything");
    co.passes.pass[0].budget_bytes = INT64_C(7) << 30; /* seen by the pass, and room for all */
    regc_program *p = compile_with(&co);
    assert_non_null(p);
    assert_int_equal(seen_budget, INT64_C(7) << 30);
    assert_int_equal(p->prefetch_floats, -2);
    assert_int_equal(p->n_resident, p->layout->n_units);
    int gathers = 0;
    for (int i = 0; i < p->n_instr; i++)
        gathers += p->instr[i].kernel == K_ALLGATHER;
    assert_int_equal(gathers, p->layout->n_units); /* once each: all resident */
    regc_program_free(p);

    snprintf(co.passes.pass[0].name, REGC_PASS_NAME, "refuse");
    assert_null(compile_with(&co));
    assert_string_equal(regc_error_message(), "refuse: no schedule suits this step");
    snprintf(co.passes.pass[0].name, REGC_PASS_NAME, "nothing");
    assert_null(compile_with(&co));
    assert_string_equal(regc_error_message(), "compile.passes: no pass named \"nothing\"");
}

/* A budget holds for the step the passes leave: selective_gather fitting
 * it, then a pass keeping every unit resident, is refused by key; prefetch
 * then selective_gather fits. (keep_everything is registered above.) */
static void test_budget_holds_after_every_pass(void **state)
{
    (void)state;
    regc_compile_options co = stage3(2);
    co.passes.n = 0; /* on demand, nothing resident: the least a step needs */
    regc_program *p = compile_with(&co);
    regc_device_memory need;
    regc_program_device_memory(p, &need);
    regc_program_free(p);
    const char *order[2][2] = {{"selective_gather", "keep_everything"},
                               {"prefetch", "selective_gather"}};
    for (int k = 0; k < 2; k++) {
        co.passes.n = 2;
        for (int i = 0; i < 2; i++) {
            snprintf(co.passes.pass[i].name, REGC_PASS_NAME, "%s", order[k][i]);
            co.passes.pass[i].budget_bytes =
                !strcmp(order[k][i], "selective_gather") ? need.total : 0;
        }
        p = compile_with(&co);
        if (k == 0) {
            assert_null(p);
            assert_non_null(strstr(regc_error_message(), "compile.passes: the step needs"));
        } else {
            assert_non_null(p);
            regc_device_memory a;
            regc_program_device_memory(p, &a);
            assert_true(a.total <= need.total);
            regc_program_free(p);
        }
    }
}

/* ---- the built-in passes on a profile ------------------------------------------ */

static int keep_unit; /* the one unit keep_one keeps resident */
static int keep_one(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    (void)in, (void)user;
    s->prefetch_floats = 0;
    s->resident[keep_unit] = 1;
    return REGC_OK;
}

/* The step's device memory with only unit u kept resident, nothing ahead. */
static int64_t memory_keeping(regc_compile_options co, int u)
{
    keep_unit = u;
    co.passes.n = 1;
    snprintf(co.passes.pass[0].name, REGC_PASS_NAME, "keep_one");
    regc_program *p = compile_with(&co);
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    regc_program_free(p);
    return a.total;
}

/* selective_gather keeps first the units that cost the most to gather per
 * element: without a profile the smallest; with one where a large layer
 * costs the most, that layer, under a budget with room for it alone. (The
 * tied embedding's unit is live through the whole step anyway: keeping it
 * costs nothing, so it is not the one looked at.) */
static void test_selective_gather_follows_the_profile(void **state)
{
    (void)state;
    assert_int_equal(regc_pass_register("keep_one", keep_one, NULL), REGC_OK);
    regc_compile_options co = stage3(2);
    co.passes.n = 0;
    regc_program *p = compile_with(&co);
    const int n = p->layout->n_units;
    int64_t *size = malloc((size_t)n * sizeof *size);
    for (int u = 0; u < n; u++)
        size[u] = p->layout->unit_padded[u];
    regc_device_memory none;
    regc_program_device_memory(p, &none);
    regc_program_free(p);
    /* the largest unit whose keeping costs memory, the last of equals:
     * without a profile, ties go to the lower numbers first */
    int big = -1;
    int64_t room = 0;
    for (int u = 0; u < n; u++) {
        const int64_t m = memory_keeping(co, u);
        if (m > none.total && (big < 0 || size[u] >= size[big]))
            big = u, room = m;
    }
    assert_true(big >= 0);
    co.passes.n = 1;
    snprintf(co.passes.pass[0].name, REGC_PASS_NAME, "selective_gather");
    co.passes.pass[0].budget_bytes = room;
    p = compile_with(&co);
    assert_non_null(p);
    assert_false(p->resident[big]); /* the smallest went first */
    assert_true(p->n_resident > 0);
    regc_program_free(p);
    regc_unit_profile *pr = calloc((size_t)n, sizeof *pr);
    for (int u = 0; u < n; u++)
        pr[u] = (regc_unit_profile){
            .compute_ms = 1.0, .gather_ms = u == big ? 1000.0 : 0.001, .gathers = 2};
    co.unit_profile = pr, co.n_unit_profile = n;
    p = compile_with(&co);
    assert_non_null(p);
    assert_true(p->resident[big]);
    regc_program_free(p);
    free(pr), free(size);
}

static int64_t prefetch_for(double gather_over_compute, int64_t asked)
{
    regc_compile_options co = stage3(2);
    co.prefetch_floats = asked;
    regc_program *p = compile_with(&co);
    const int n = p->layout->n_units;
    regc_program_free(p);
    regc_unit_profile *pr = calloc((size_t)n, sizeof *pr);
    for (int u = 0; u < n; u++)
        pr[u] = (regc_unit_profile){
            .compute_ms = 2.0, .gather_ms = gather_over_compute * 1.0, .gathers = 2};
    co.unit_profile = pr, co.n_unit_profile = n;
    p = compile_with(&co);
    assert_non_null(p);
    int64_t got = p->prefetch_floats;
    regc_program_free(p);
    free(pr);
    return got;
}

static void test_prefetch_follows_the_profile(void **state)
{
    (void)state;
    /* per gather a unit computes 1 ms: a 0.5 ms gather needs one unit
     * ahead, a 2.5 ms gather three */
    assert_int_equal(prefetch_for(0.5, -1), -1);
    assert_int_equal(prefetch_for(2.5, -1), -3);
    assert_int_equal(prefetch_for(2.5, 0), 0); /* asked for on demand */
}

/* ---- the profile of a measured program ------------------------------------------ */

static void test_measured_units(void **state)
{
    (void)state;
    regc_compile_options co = stage3(1);
    regc_program *p = compile_with(&co);
    regc_backend *be = regc_backend_new("cpu", 2);
    const int64_t block = regc_program_block_floats(p);
    float *params = be->alloc(be, (size_t)block * sizeof(float));
    float *grads = be->alloc(be, (size_t)block * sizeof(float));
    be->fill(be, params, (size_t)block, 0.01f);
    void *inputs[8] = {0};
    for (int i = 0; i < regc_program_n_inputs(p); i++) {
        const int64_t bytes = regc_tensor_bytes(regc_program_input(p, i));
        inputs[i] = be->alloc(be, (size_t)bytes);
        memset(inputs[i], 0, (size_t)bytes); /* token 0 everywhere */
    }
    regc_program_memory mem = {.params = params, .grads = grads, .inputs = inputs};
    assert_int_equal(regc_program_bind(p, be, &mem), REGC_OK);
    regc_unit_profile pr[16];
    assert_true(regc_program_unit_profile(p, pr) != REGC_OK); /* nothing measured */
    assert_int_equal(regc_program_measure(p, 1), REGC_OK);
    for (int k = 0; k < 3; k++)
        assert_int_equal(regc_program_run(p), REGC_OK);
    assert_true(p->layout->n_units <= 16);
    assert_int_equal(regc_program_unit_profile(p, pr), REGC_OK);
    double compute = 0.0;
    for (int u = 0; u < p->layout->n_units; u++) {
        if (pr[u].gathers != 1.0 && pr[u].gathers != 2.0)
            fail_msg("unit %d: %g gathers per step", u, pr[u].gathers);
        compute += pr[u].compute_ms;
    }
    assert_true(compute > 0.0);
    for (int i = 0; i < regc_program_n_inputs(p); i++)
        be->free(be, inputs[i]);
    regc_program_free(p);
    be->free(be, params), be->free(be, grads);
    regc_backend_free(be);
}

/* ---- compile.schedule ------------------------------------------------------------ */

static int64_t last_resident;
static void count_resident(const regc_compile_stats *st, void *user)
{
    (void)user;
    last_resident = st->zero3_resident;
}

static void test_replanned_run_keeps_its_bits(void **state)
{
    (void)state;
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = STEPS, o.lr = 1e-3f, o.threads = 2, o.zero_stage = 3;
    regc_test_losses plain, planned, again;
    regc_model *m0 = regc_test_train("gpt2-tiny", &o, &plain);
    char *cache = regc_test_make_temp_dir("passes-cache");
    o.cache_dir = cache;
    o.replans.n = 1;
    o.replans.at[0].step = 3;
    regc_pass_list *l = &o.replans.at[0].passes;
    l->n = 2;
    snprintf(l->pass[0].name, REGC_PASS_NAME, "prefetch");
    snprintf(l->pass[1].name, REGC_PASS_NAME, "selective_gather");
    l->pass[1].budget_bytes = INT64_C(1) << 40; /* room for every unit */
    regc_model *m1 = regc_test_train("gpt2-tiny", &o, &planned);
    assert_int_equal(planned.misses > 0, 1);
    regc_model *m2 = regc_test_train("gpt2-tiny", &o, &again);
    assert_int_equal(again.hits, 1); /* the re-planned step, from the cache */
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&plain.loss[k], &planned.loss[k], sizeof plain.loss[k]) != 0 ||
            memcmp(&plain.loss[k], &again.loss[k], sizeof plain.loss[k]) != 0)
            fail_msg("step %d: %.9g, re-planned %.9g and %.9g", k, plain.loss[k], planned.loss[k],
                     again.loss[k]);
    regc_test_assert_same_weights(m0, m1);
    regc_test_assert_same_weights(m0, m2);
    /* the re-plan's choice: every unit kept */
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
    o.cache_dir = NULL;
    o.on_compiled = count_resident;
    assert_int_equal(regc_train(m, &o, NULL, NULL, NULL), REGC_OK);
    assert_true(last_resident > 0);
    regc_model_free(m), regc_model_free(m0), regc_model_free(m1), regc_model_free(m2);
    regc_test_remove_tree(cache);
    free(cache);
}

/* A run resumed past a listed step starts with that step's plan. */
static int64_t replans_seen[8];
static int n_replans_seen;
static void note_replan(const regc_compile_stats *st, void *user)
{
    (void)user;
    if (n_replans_seen < 8)
        replans_seen[n_replans_seen++] = st->replan_step;
}

static void test_resumed_run_starts_with_its_plan(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("passes-resume");
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = 4, o.threads = 2, o.zero_stage = 3;
    o.output_dir = dir, o.save_steps = 3;
    o.replans.n = 1;
    o.replans.at[0].step = 2;
    o.replans.at[0].passes.n = 1;
    snprintf(o.replans.at[0].passes.pass[0].name, REGC_PASS_NAME, "prefetch");
    o.on_compiled = note_replan;
    for (int run = 0; run < 2; run++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load("gpt2-tiny", &m), REGC_OK);
        n_replans_seen = 0;
        char *ck = regc_test_join(dir, "checkpoint-3");
        o.resume_from = run ? ck : NULL;
        if (regc_train(m, &o, NULL, NULL, NULL) != REGC_OK)
            fail_msg("run %d: %s", run, regc_error_message());
        /* the first compile, then the plan: at step 2, or as the resumed run starts */
        assert_int_equal(n_replans_seen, 2);
        assert_true(replans_seen[0] == 0 && replans_seen[1] == 2);
        regc_model_free(m);
        free(ck);
    }
    regc_test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registered_pass_decides),
        cmocka_unit_test(test_budget_holds_after_every_pass),
        cmocka_unit_test(test_prefetch_follows_the_profile),
        cmocka_unit_test(test_selective_gather_follows_the_profile),
        cmocka_unit_test(test_measured_units),
        cmocka_unit_test(test_replanned_run_keeps_its_bits),
        cmocka_unit_test(test_resumed_run_starts_with_its_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
