/* test_recompute.c — compile.recompute: saved activations dropped after the
 * forward and computed again in the backward by the same kernels.
 *  - The same bits: GPT-2, Llama, BERT and T5 at O0 and O1, and the first
 *    two also as one whole-graph region, at stage 3 and with gradient
 *    accumulation: selective, full, and auto under a budget that makes it
 *    recompute give the losses and weights of none over five steps.
 *  - Less memory: full's activation plan is smaller than selective's, and
 *    selective's than none's; the run's device peak is the plan's total
 *    within 1% with each.
 *  - One whole-graph region recomputes what layer and glue regions do
 *    under full: the layers' inputs kept, the glue as selective.
 *  - Auto: the program fits its budget; more budget never recomputes
 *    more; a budget the step fits recomputes nothing; below the least any
 *    recomputation reaches is refused, naming the key and that least.
 *  - Measured costs: kernels measured at one rate choose what FLOPs
 *    choose; norms measured far slower than their FLOPs are recomputed no
 *    more where something else frees the bytes; a re-plan of
 *    compile.schedule under a budget ranks by the kernels it measured and
 *    keeps the bits.
 *  - The program: replays only in the backward, each run of them right
 *    before an instruction that reads what they made, into memory of their
 *    own; a replay moved after its reader is refused by the validator
 *    (region and flat program alike).
 *  - The cache keys the choice: full and none never share an entry, and
 *    a warm start gives a cold one's bits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_train.h"
#include "region_internal.h"
#include "test_model.h"
#include "test_util.h"
#include "validate.h"

#define STEPS 5

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

static regc_train_options base_options(void) { return regc_test_train_options(2, 16, STEPS); }

/* The step of `preset` as o would train it, compiled alone. */
static regc_program *compile_as(const char *preset, const regc_train_options *o, int *status)
{
    return regc_test_compile(preset, o->batch, o->seq, &o->compile, status);
}

static int64_t total_of(const regc_program *p)
{
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    return a.total;
}

static int replays_of(const regc_program *p)
{
    int n = 0;
    for (int i = 0; i < p->n_regions; i++)
        for (int j = 0; j < p->regions[i]->n_fwd + p->regions[i]->n_bwd; j++)
            n += regc_region_instr(p->regions[i], j)->replay;
    return n;
}

static void expect_same(const char *preset, const char *what, const regc_test_losses *a,
                        regc_model *ma, const regc_test_losses *b, regc_model *mb)
{
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&a->loss[k], &b->loss[k], sizeof a->loss[k]) != 0)
            fail_msg("%s, %s, step %d: %.9g, without recomputation %.9g", preset, what, k,
                     a->loss[k], b->loss[k]);
    regc_test_assert_same_weights(ma, mb);
}

/* ---- the same bits --------------------------------------------------------- */

static void test_recompute_keeps_the_bits(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        regc_level level;
        int regional, stage, accumulate;
    } ways[] = {
        {"O1, regional", REGC_LEVEL_O1, 1, 0, 1},
        {"O0", REGC_LEVEL_O0, 1, 0, 1},
        {"the whole graph as one region", REGC_LEVEL_O1, 0, 0, 1},
        {"stage 3", REGC_LEVEL_O1, 1, 3, 1},
        {"stage 3, O0", REGC_LEVEL_O0, 1, 3, 1},
        {"two micro-batches a step", REGC_LEVEL_O1, 1, 0, 2},
    };
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
            if (i > 1 && w > 1) /* BERT and T5 at O1 and O0; every way on GPT-2 and Llama */
                continue;
            regc_train_options o = base_options();
            o.compile.level = ways[w].level, o.compile.regional = ways[w].regional;
            o.compile.zero_stage = ways[w].stage, o.grad_accum = ways[w].accumulate;
            o.compile.recompute = REGC_RECOMPUTE_NONE;
            regc_test_losses ln;
            regc_model *mn = regc_test_train(presets[i], &o, &ln);
            int64_t peak[2];
            for (int r = 0; r < 3; r++) {
                regc_train_options x = o;
                char what[160];
                if (r < 2) {
                    x.compile.recompute = r ? REGC_RECOMPUTE_FULL : REGC_RECOMPUTE_SELECTIVE;
                } else { /* halfway between none's and full's peaks: some recomputed */
                    x.compile.recompute = REGC_RECOMPUTE_AUTO;
                    x.compile.budget_bytes = (ln.device_peak + peak[1]) / 2;
                    /* the logits whole, in one chunk as long as the loss: auto
                     * would otherwise chunk BERT's, which moves its head's
                     * gradient in the last bits (test_logits_chunks.c's) */
                    x.compile.logits_chunk_rows = x.batch * x.seq;
                }
                snprintf(what, sizeof what, "%s, recompute %s", ways[w].what,
                         regc_recompute_name(x.compile.recompute));
                regc_test_losses l;
                regc_model *m = regc_test_train(presets[i], &x, &l);
                expect_same(presets[i], what, &l, m, &ln, mn);
                if (r < 2)
                    peak[r] = l.device_peak;
                if (r == 1 && !(peak[1] < ln.device_peak))
                    fail_msg("%s, %s: full recomputation held %lld bytes, none %lld", presets[i],
                             ways[w].what, (long long)peak[1], (long long)ln.device_peak);
                /* (O0 plans no arena: it allocates at run time) */
                if (r == 2 && ways[w].level != REGC_LEVEL_O0 &&
                    l.device_peak > x.compile.budget_bytes)
                    fail_msg("%s, %s: auto held %lld bytes over a budget of %lld", presets[i],
                             ways[w].what, (long long)l.device_peak,
                             (long long)x.compile.budget_bytes);
                regc_model_free(m);
            }
            regc_model_free(mn);
        }
}

/* ---- less memory, as planned --------------------------------------------- */

static void test_memory_falls_as_planned(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        int64_t act[3];
        for (int r = 0; r < 3; r++) {
            regc_train_options o = base_options();
            o.compile.recompute = (regc_recompute)r; /* none, selective, full */
            regc_program *p = compile_as(presets[i], &o, NULL);
            regc_device_memory a;
            regc_program_device_memory(p, &a);
            act[r] = a.activations;
            regc_test_losses l;
            regc_model *m = regc_test_train(presets[i], &o, &l);
            if (!(fabs((double)(l.device_peak - a.total)) <= 0.01 * (double)a.total))
                fail_msg("%s, recompute %s: planned %lld bytes, held %lld", presets[i],
                         regc_recompute_name(o.compile.recompute), (long long)a.total,
                         (long long)l.device_peak);
            printf("%s recompute %-9s activations %8lld bytes, %4d replays\n", presets[i],
                   regc_recompute_name(o.compile.recompute), (long long)act[r], replays_of(p));
            regc_model_free(m);
            regc_program_free(p);
        }
        if (!(act[2] < act[1] && act[1] < act[0]))
            fail_msg("%s: activations none %lld, selective %lld, full %lld", presets[i],
                     (long long)act[0], (long long)act[1], (long long)act[2]);
    }
}

/* ---- one whole-graph region recomputes what the regions do --------------- */

/* full keeps each layer's inputs and recomputes the glue (embedding, final
 * norm, head, loss) as selective does, whether the layers are regions of
 * their own or parts of one whole-graph region: the same replays, the same
 * FLOPs, never the head's GEMM. */
static void test_whole_graph_recomputes_as_regions_do(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2; i++) { /* GPT-2 and Llama */
        regc_fit_plan f[2];
        for (int regional = 0; regional < 2; regional++) {
            regc_train_options o = base_options();
            o.compile.recompute = REGC_RECOMPUTE_FULL, o.compile.regional = regional;
            regc_program *p = compile_as(presets[i], &o, NULL);
            regc_program_fit_plan(p, &f[regional]);
            regc_program_free(p);
        }
        if (f[0].replays != f[1].replays || f[0].replay_flop != f[1].replay_flop ||
            strcmp(f[0].kernels, f[1].kernels) != 0)
            fail_msg("%s: whole graph replays %d (%.6g FLOPs: %s), regions %d (%.6g: %s)",
                     presets[i], f[0].replays, f[0].replay_flop, f[0].kernels, f[1].replays,
                     f[1].replay_flop, f[1].kernels);
    }
}

/* ---- auto under a budget ------------------------------------------------- */

/* The bytes of o's step with nothing recomputed (*hi) and with the most
 * auto can recompute, every candidate, the logits in chunks of chunk_rows
 * (0: as the compiler chooses) (*lo). */
static void budget_bracket(regc_train_options o, int chunk_rows, int64_t *hi, int64_t *lo)
{
    o.compile.recompute = REGC_RECOMPUTE_NONE;
    regc_program *none = compile_as("gpt2-tiny", &o, NULL);
    o.compile.recompute = REGC_RECOMPUTE_AUTO, o.compile.recompute_ratio = 1e30;
    o.compile.logits_chunk_rows = chunk_rows;
    regc_program *most = compile_as("gpt2-tiny", &o, NULL);
    *hi = total_of(none), *lo = total_of(most);
    assert_true(*lo < *hi);
    regc_program_free(none), regc_program_free(most);
}

static void test_auto_fits_the_budget(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    int64_t hi, lo;
    budget_bracket(o, 0, &hi, &lo);
    o.compile.recompute = REGC_RECOMPUTE_AUTO, o.compile.recompute_ratio = -1.0;
    int prev = INT32_MAX;
    for (int i = 0; i <= 6; i++) {
        o.compile.budget_bytes = lo + (hi - lo) * i / 6;
        regc_program *p = compile_as("gpt2-tiny", &o, NULL);
        const int n = replays_of(p);
        if (total_of(p) > o.compile.budget_bytes || n > prev)
            fail_msg("budget %lld: %lld bytes, %d replays (%d at the budget before)",
                     (long long)o.compile.budget_bytes, (long long)total_of(p), n, prev);
        if (i == 6 && n != 0)
            fail_msg("a budget the step fits recomputed %d instructions", n);
        prev = n;
        regc_program_free(p);
    }
    /* the search's compiles are counted apart: the statistics of the
     * compile kept are a plain compile's */
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    regc_compile_stats st[2];
    for (int k = 0; k < 2; k++) {
        regc_compile_options c = o.compile;
        c.budget_bytes = k ? (lo + hi) / 2 : 0;
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile(m, o.batch, o.seq, &c, &p, &st[k]), REGC_OK);
        regc_program_free(p);
    }
    regc_model_free(m);
    if (st[0].fit_probes != 0 || st[1].fit_probes < 2 || !(st[1].fit_ms > 0.0) ||
        st[1].region_compiles != st[0].region_compiles ||
        st[1].glue_compiles != st[0].glue_compiles)
        fail_msg("with a budget: %d compiles tried, %d + %d kept; without: %d tried, %d + %d kept",
                 st[1].fit_probes, st[1].region_compiles, st[1].glue_compiles, st[0].fit_probes,
                 st[0].region_compiles, st[0].glue_compiles);
    o.compile.budget_bytes = lo - 1;
    int rc;
    assert_null(compile_as("gpt2-tiny", &o, &rc));
    assert_int_equal(rc, REGC_ERR_BUDGET);
    char want[160];
    snprintf(want, sizeof want, "needs %.1f MiB per rank at the least", (double)lo / (1 << 20));
    if (!strstr(regc_error_message(), "compile.memory_budget_mb") ||
        !strstr(regc_error_message(), want))
        fail_msg("expected the key and \"%s\", got: %s", want, regc_error_message());
}

/* fit_check answers as the whole search does, at budgets from below the
 * least to above what nothing recomputed holds, offloading or not, one
 * process and ZeRO-3 over 2 ranks (where the search's compiles keep the
 * least schedule and the one kept fills the budget's room), in fewer
 * compiles where the search has ratios to bisect; what it says the least
 * choice holds is within the budget exactly when it fits. */
static void test_fit_check_answers_as_the_search(void **state)
{
    (void)state;
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    int fewer = 0, fits = 0, refused = 0;
    for (int stage = 0; stage <= 3; stage += 3) {
        regc_train_options o = base_options();
        o.compile.zero_stage = stage, o.compile.ranks = stage ? 2 : 1;
        int64_t hi, lo;
        budget_bracket(o, 1, &hi, &lo);
        o.compile.recompute = REGC_RECOMPUTE_AUTO;
        for (int offload = 0; offload < 2; offload++) {
            /* the least any choice holds, as fit_check finds it: the
             * search reaches it and nothing less */
            regc_compile_options c = o.compile;
            c.recompute_ratio = -1.0, c.logits_chunk_rows = 0, c.offload_activation = offload;
            c.budget_bytes = 1, c.fit_check = 1;
            regc_compile_stats st;
            regc_program *none = NULL;
            assert_int_equal(regc_program_compile(m, o.batch, o.seq, &c, &none, &st),
                             REGC_ERR_BUDGET);
            const int64_t least = st.fit_least;
            assert_true(least > 0 && least <= lo);
            for (int i = -3; i <= 4; i++) { /* below, at, then from lo to hi in quarters */
                c.budget_bytes = i == -3   ? least / 2
                                 : i == -2 ? least - 1
                                 : i == -1 ? least
                                           : lo + (hi - lo) * i / 4;
                c.fit_check = 0;
                regc_compile_stats whole, check;
                regc_program *p = NULL, *q = NULL;
                const int rc = regc_program_compile(m, o.batch, o.seq, &c, &p, &whole);
                c.fit_check = 1;
                const int rc_check = regc_program_compile(m, o.batch, o.seq, &c, &q, &check);
                if ((rc == REGC_OK) != (rc_check == REGC_OK) || q ||
                    (rc != REGC_OK && rc != REGC_ERR_BUDGET) ||
                    (rc_check != REGC_OK && rc_check != REGC_ERR_BUDGET) || check.fit_least < 0 ||
                    (check.fit_least <= c.budget_bytes) != (rc_check == REGC_OK))
                    fail_msg("stage %d, offload %d, budget %lld: the search %d, fit_check %d "
                             "(program %p, the least %lld)",
                             stage, offload, (long long)c.budget_bytes, rc, rc_check, (void *)q,
                             (long long)check.fit_least);
                if (p && total_of(p) > c.budget_bytes)
                    fail_msg("stage %d, offload %d: %lld bytes over the budget of %lld", stage,
                             offload, (long long)total_of(p), (long long)c.budget_bytes);
                fewer |= check.fit_probes < whole.fit_probes;
                fits += rc == REGC_OK, refused += rc != REGC_OK;
                if ((i < -1 && rc == REGC_OK) || (i >= -1 && rc != REGC_OK))
                    fail_msg("stage %d, offload %d: a budget of %lld against the least %lld: %d",
                             stage, offload, (long long)c.budget_bytes, (long long)least, rc);
                regc_program_free(p);
            }
        }
    }
    if (!fewer || !fits || !refused)
        fail_msg("fit_check: fewer compiles %d, budgets that fit %d, that did not %d", fewer, fits,
                 refused);
    regc_model_free(m);
}

/* ---- measured costs ------------------------------------------------------ */

/* Replays of a LayerNorm (alone, or fused with the residual add before it). */
static int norm_replays_of(const regc_program *p)
{
    int n = 0;
    for (int i = 0; i < p->n_instr; i++)
        n += p->instr[i].replay &&
             (p->instr[i].kernel == K_LN_FWD || p->instr[i].kernel == K_ADD_LN_FWD);
    return n;
}

/* p's kernels as a measured profile would give them (one row a label, a
 * recomputation counted as its kernel), each taking `ms_per_cost` times
 * its cost, the norms `norm_ms_per_cost`. */
static regc_kernel_cost *costs_of(const regc_program *p, double ms_per_cost,
                                  double norm_ms_per_cost, int *n_out)
{
    regc_kernel_cost *rows = calloc((size_t)p->n_instr + 1, sizeof *rows);
    int n = 0;
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        regc_kernel_cost *row = &rows[regc_kernel_cost_row(rows, &n, in)];
        const double c = regc_instr_cost(in);
        const int norm = in->kernel == K_LN_FWD || in->kernel == K_ADD_LN_FWD;
        row->cost += c;
        row->ms += c * (norm ? norm_ms_per_cost : ms_per_cost);
    }
    *n_out = n;
    return rows;
}

/* With a measured profile auto ranks by time: kernels measured at one rate
 * choose as FLOPs do, and norms measured far slower than their FLOPs say
 * are recomputed no more where something else frees the bytes; whether
 * the logits go in chunks stays FLOPs' choice. */
static void test_measured_costs_rank_what_is_recomputed(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    o.compile.recompute = REGC_RECOMPUTE_NONE;
    regc_program *none = compile_as("gpt2-tiny", &o, NULL);
    o.compile.recompute = REGC_RECOMPUTE_AUTO;
    /* the largest budget below none's at which FLOPs choose norms */
    regc_program *by_flop = NULL;
    for (int i = 1; i < 64 && !by_flop; i++) {
        o.compile.budget_bytes = total_of(none) - total_of(none) / 256 * i;
        regc_program *p = compile_as("gpt2-tiny", &o, NULL);
        if (p && norm_replays_of(p) > 0)
            by_flop = p;
        else
            regc_program_free(p);
    }
    assert_non_null(by_flop);
    int n = 0;
    regc_kernel_cost *even = costs_of(none, 1.0, 1.0, &n);
    o.compile.kernel_cost = even, o.compile.n_kernel_cost = n;
    regc_program *same = compile_as("gpt2-tiny", &o, NULL);
    assert_non_null(same);
    if (regc_program_hash(same) != regc_program_hash(by_flop))
        fail_msg("kernels measured at one rate chose %d replays, FLOPs %d", replays_of(same),
                 replays_of(by_flop));
    regc_kernel_cost *slow = costs_of(none, 1.0, 1e4, &n);
    o.compile.kernel_cost = slow, o.compile.n_kernel_cost = n;
    regc_program *timed = compile_as("gpt2-tiny", &o, NULL);
    assert_non_null(timed);
    if (norm_replays_of(timed) != 0 || replays_of(timed) == 0 ||
        total_of(timed) > o.compile.budget_bytes)
        fail_msg("slow norms: %d of %d replays are norms, %lld bytes for a budget of %lld",
                 norm_replays_of(timed), replays_of(timed), (long long)total_of(timed),
                 (long long)o.compile.budget_bytes);
    /* the logits' chunks change bits: FLOPs decide them, never times */
    regc_fit_plan f_flop, f_timed;
    regc_program_fit_plan(by_flop, &f_flop), regc_program_fit_plan(timed, &f_timed);
    assert_int_equal(f_timed.logits_chunk_rows, f_flop.logits_chunk_rows);
    /* a program never measured has no costs to give */
    regc_kernel_cost *none_rows = NULL;
    assert_int_equal(regc_program_kernel_costs(none, &none_rows, &n), REGC_ERR_ARG);
    assert_null(none_rows);
    free(even), free(slow);
    regc_program_free(none), regc_program_free(by_flop), regc_program_free(same);
    regc_program_free(timed);
}

/* compile.schedule's re-plan measures the kernels under auto and a budget
 * and compiles the step again ranked by them: the bits stay. */
static void test_replan_by_measured_costs_keeps_the_bits(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    o.compile.recompute = REGC_RECOMPUTE_NONE;
    regc_test_losses ln, lf, lm;
    regc_model *mn = regc_test_train("gpt2-tiny", &o, &ln);
    regc_train_options x = o;
    x.compile.recompute = REGC_RECOMPUTE_FULL;
    regc_model_free(regc_test_train("gpt2-tiny", &x, &lf));
    x.compile.recompute = REGC_RECOMPUTE_AUTO; /* halfway: some recomputed */
    x.compile.budget_bytes = (ln.device_peak + lf.device_peak) / 2;
    x.replans.n = 1;
    x.replans.at[0].step = 3; /* passes: none */
    regc_model *mm = regc_test_train("gpt2-tiny", &x, &lm);
    if (lm.measured_at != 3)
        fail_msg("measured kernels ranked the recomputation at step %lld, not 3",
                 (long long)lm.measured_at);
    expect_same("gpt2-tiny", "re-planned by measured costs", &lm, mm, &ln, mn);
    regc_model_free(mn), regc_model_free(mm);
}

/* ---- the program ------------------------------------------------------------ */

static int reads_slot(const regc_instr *in, int s)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == s && !regc_instr_writes(in, k))
            return 1;
    return 0;
}

static void test_replays_run_late_into_their_own_memory(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    o.compile.recompute = REGC_RECOMPUTE_FULL;
    regc_program *p = compile_as("llama-tiny", &o, NULL);
    int checked = 0;
    for (int ri = 0; ri < p->n_regions; ri++) {
        regc_compiled_region *r = p->regions[ri];
        char *fwd_slot = calloc((size_t)r->n_slots + 1, 1);
        for (int i = 0; i < r->n_fwd; i++) {
            assert_false(r->fwd[i].replay);
            for (int k = 0; k < r->fwd[i].n_refs; k++)
                if (r->fwd[i].refs[k].buf >= 0)
                    fwd_slot[r->fwd[i].refs[k].buf] = 1;
        }
        for (int i = 0; i < r->n_bwd;) {
            if (!r->bwd[i].replay) {
                i++;
                continue;
            }
            /* a run of replays, then the instruction they are for */
            int j = i, used = 0;
            while (j < r->n_bwd && r->bwd[j].replay)
                j++;
            assert_true(j < r->n_bwd);
            for (int a = i; a < j; a++)
                for (int k = 0; k < r->bwd[a].n_refs; k++) {
                    const int s = r->bwd[a].refs[k].buf;
                    if (s >= 0 && regc_instr_writes(&r->bwd[a], k)) {
                        if (fwd_slot[s] || r->slots[s].kind != SLOT_TEMP)
                            fail_msg("%s: a replay writes slot %d, which is not its own", r->name,
                                     s);
                        used |= reads_slot(&r->bwd[j], s);
                    }
                }
            if (!used)
                fail_msg("%s: the replays at %d..%d run before instruction %d, which reads none "
                         "of what they make",
                         r->name, i, j - 1, j);
            checked++;
            i = j;
        }
        free(fwd_slot);
    }
    assert_true(checked > 0);
    /* moved after its reader, a replay is refused */
    regc_compiled_region *r = p->regions[0];
    int first = 0;
    while (first < r->n_bwd && !r->bwd[first].replay)
        first++;
    assert_true(first < r->n_bwd);
    assert_int_equal(regc_region_validate(r), REGC_OK);
    regc_instr moved = r->bwd[first];
    memmove(&r->bwd[first], &r->bwd[first + 1], (size_t)(r->n_bwd - first - 1) * sizeof moved);
    r->bwd[r->n_bwd - 1] = moved;
    assert_int_equal(regc_region_validate(r), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "which nothing wrote before it"));
    /* in the flat program likewise */
    assert_int_equal(regc_program_validate(p), REGC_OK);
    int f = 0;
    while (f < p->n_instr && !p->instr[f].replay)
        f++;
    assert_true(f < p->n_instr);
    moved = p->instr[f];
    memmove(&p->instr[f], &p->instr[f + 1], (size_t)(p->n_instr - f - 1) * sizeof moved);
    p->instr[p->n_instr - 1] = moved;
    assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "which nothing wrote before it"));
    regc_program_free(p);
}

/* ---- the cache ------------------------------------------------------------ */

static void test_cache_keys_the_choice(void **state)
{
    (void)state;
    char *dir = regc_test_make_temp_dir("recompute-cache");
    regc_train_options o = base_options();
    o.cache_dir = dir;
    o.compile.recompute = REGC_RECOMPUTE_NONE;
    regc_test_losses ln, cold, warm;
    regc_model *mn = regc_test_train("gpt2-tiny", &o, &ln);
    o.compile.recompute = REGC_RECOMPUTE_FULL;
    regc_model *mc = regc_test_train("gpt2-tiny", &o, &cold);
    assert_int_equal(cold.hits, 0);
    regc_model *mw = regc_test_train("gpt2-tiny", &o, &warm);
    assert_int_equal(warm.hits, 1);
    expect_same("gpt2-tiny", "full from the cache", &warm, mw, &ln, mn);
    expect_same("gpt2-tiny", "full compiled", &cold, mc, &ln, mn);
    regc_model_free(mn), regc_model_free(mc), regc_model_free(mw);
    regc_test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_keeps_the_bits),
        cmocka_unit_test(test_memory_falls_as_planned),
        cmocka_unit_test(test_whole_graph_recomputes_as_regions_do),
        cmocka_unit_test(test_auto_fits_the_budget),
        cmocka_unit_test(test_fit_check_answers_as_the_search),
        cmocka_unit_test(test_measured_costs_rank_what_is_recomputed),
        cmocka_unit_test(test_replan_by_measured_costs_keeps_the_bits),
        cmocka_unit_test(test_replays_run_late_into_their_own_memory),
        cmocka_unit_test(test_cache_keys_the_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
