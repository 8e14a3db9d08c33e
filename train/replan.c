/* replan.c — compile.schedule: a running job's step compiled again at the
 * listed steps. The few steps before each plan (never a run's first) are
 * measured, each instruction timed; the plan compiles the step with that
 * entry's passes and what was measured, every rank's average so that the
 * ranks decide alike: ZeRO-3's per-unit profile (the schedule passes), and
 * under recompute auto with a budget each kernel's time (what to
 * recompute). The new program is bound in place of the old one; a run
 * resumed past a listed step starts with that step's plan. */
#include <stdlib.h>

#include "trainer.h"

/* Steps measured before a compile.schedule plan (at most). */
#define REPLAN_MEASURED 3

/* The step program and, with validation, its forward-only twin, at co. */
static int compile_pair(trainer *t, const regc_train_options *o, const regc_compile_options *co,
                        regc_program **step, regc_program **val, regc_compile_stats *st)
{
    *step = *val = NULL;
    int rc = regc_program_compile(t->model, o->batch, o->seq, co, step, st);
    if (rc == REGC_OK && t->val_program) {
        regc_compile_options vo = *co;
        regc_compile_stats vst;
        vo.forward_only = 1;
        rc = regc_program_compile(t->model, o->batch, o->seq, &vo, val, &vst);
    }
    return rc;
}

/* Do the steps before a re-plan measure each kernel's cost? Under
 * compile.recompute auto with a budget: the re-plan ranks what to
 * recompute by what it took. */
static int measures_kernels(const regc_train_options *o)
{
    return o->compile.recompute == REGC_RECOMPUTE_AUTO && o->compile.budget_bytes > 0 &&
           o->compile.recompute_ratio < 0;
}

/* The measured kernels' costs, every rank's average (the ranks run one
 * program, so their rows are the same labels in the same order); none
 * (*n = 0) when nothing was measured, as on a resumed run's first plan.
 * The ranks first agree that each has the same number of rows (the sums
 * of n and n² are size·n and size·n² only when every n is the same), so
 * that one whose account failed never leaves the others in a collective
 * it skips. */
static int shared_kernel_costs(trainer *t, regc_kernel_cost **out, int *n_out)
{
    *out = NULL, *n_out = 0;
    regc_kernel_cost *kc = NULL;
    int n = 0, rc = regc_program_kernel_costs(t->program, &kc, &n);
    if (rc == REGC_ERR_ARG) /* nothing measured */
        regc_error_clear(), rc = REGC_OK, n = 0;
    int64_t agree[2] = {rc == REGC_OK ? n : -1, rc == REGC_OK ? (int64_t)n * n : 1};
    int crc = t->comm->allreduce(t->comm, agree, 2, REGC_COMM_I64);
    const int64_t size = t->comm->size;
    if (rc == REGC_OK && crc == REGC_OK && (agree[0] != size * n || agree[1] != size * n * n))
        crc = regc_error(REGC_ERR_RANK, "compile.schedule: the ranks measured different steps");
    if (rc == REGC_OK)
        rc = crc;
    double *v = rc == REGC_OK ? malloc(((size_t)2 * n + 1) * sizeof *v) : NULL; /* [n][ms, cost] */
    if (rc == REGC_OK && !v)
        rc = regc_error(REGC_ERR_MEMORY, "compile.schedule: out of memory");
    for (int i = 0; rc == REGC_OK && i < n; i++)
        v[2 * i] = kc[i].ms, v[2 * i + 1] = kc[i].cost;
    if (rc == REGC_OK && n > 0)
        rc = t->comm->allreduce(t->comm, v, 2 * (int64_t)n, REGC_COMM_F64);
    for (int i = 0; rc == REGC_OK && i < n; i++)
        kc[i].ms = v[2 * i] / t->comm->size, kc[i].cost = v[2 * i + 1] / t->comm->size;
    free(v);
    if (rc) {
        free(kc);
        return rc;
    }
    *out = kc, *n_out = n;
    return REGC_OK;
}

/* compile.schedule's entry k: the step compiled again with its passes and
 * the profile measured since the last plan (every rank's average, so the
 * ranks decide alike; none on a resumed run's first step): each ZeRO-3
 * unit's compute and gathers, and under recompute auto with a budget each
 * kernel's time; bound in place of the old one; the validation program is
 * compiled again beside it (it borrows the step's arena). */
static int replan(trainer *t, const regc_train_options *o, const regc_compile_options *base, int k,
                  void *user)
{
    regc_compile_options co = *base;
    co.passes = o->replans.at[k].passes;
    co.replan_step = o->replans.at[k].step;
    const regc_shard_layout *l = regc_program_shard_layout(t->program);
    regc_unit_profile *pr = l ? calloc((size_t)l->n_units + 1, sizeof *pr) : NULL;
    int rc = REGC_OK;
    if (pr && regc_program_unit_profile(t->program, pr) == REGC_OK) {
        const int64_t n = (int64_t)l->n_units * (int64_t)(sizeof *pr / sizeof(double));
        rc = t->comm->allreduce(t->comm, pr, n, REGC_COMM_F64);
        for (int64_t i = 0; i < n; i++)
            ((double *)pr)[i] /= t->comm->size;
        co.unit_profile = pr, co.n_unit_profile = l->n_units;
    }
    regc_kernel_cost *kc = NULL;
    if (rc == REGC_OK && measures_kernels(o))
        rc = shared_kernel_costs(t, &kc, &co.n_kernel_cost);
    co.kernel_cost = kc;
    regc_error_clear();
    regc_program *step = NULL, *val = NULL;
    regc_compile_stats st;
    if (rc == REGC_OK)
        rc = compile_pair(t, o, &co, &step, &val, &st);
    /* Every rank must run the same program. One that found an earlier
     * run's plan in its cache, beside one that planned from this profile,
     * would not: then all plan from the profile they share, uncached. */
    if (rc == REGC_OK && t->comm->size > 1) {
        uint64_t mine = regc_program_hash(step), first = mine;
        int64_t differ = 0;
        if ((rc = t->comm->broadcast(t->comm, &first, sizeof first, 0)) == REGC_OK) {
            differ = mine != first;
            rc = t->comm->allreduce(t->comm, &differ, 1, REGC_COMM_I64);
        }
        if (rc == REGC_OK && differ) {
            regc_program_free(step), regc_program_free(val);
            co.cache = NULL;
            rc = compile_pair(t, o, &co, &step, &val, &st);
        }
    }
    free(pr), free(kc);
    if (rc == REGC_OK && regc_program_block_floats(step) != t->block)
        rc = regc_error(REGC_ERR_ARG,
                        "compile.schedule: step %lld re-planned blocks of %lld floats "
                        "for %lld",
                        (long long)co.replan_step, (long long)regc_program_block_floats(step),
                        (long long)t->block);
    else if (rc == REGC_OK && regc_program_n_inputs(step) != t->n_inputs)
        rc = regc_error(REGC_ERR_ARG, "compile.schedule: step %lld re-planned %d inputs for %d",
                        (long long)co.replan_step, regc_program_n_inputs(step), t->n_inputs);
    else if (rc == REGC_OK)
        rc = regc_trainer_check_memory_fits(t, step);
    if (rc) {
        regc_program_free(step), regc_program_free(val);
        return rc;
    }
    regc_program_free(t->program), regc_program_free(t->val_program);
    t->program = step, t->val_program = val;
    t->shards = regc_program_shard_layout(step); /* the same layout, the new program's copy */
    t->frozen_shards = regc_program_frozen_layout(step);
    for (int i = 0; i < t->n_inputs; i++) /* the same inputs, in the new program's graph */
        t->inputs[i].tensor = regc_program_input(step, i);
    if ((rc = regc_trainer_bind_programs(t, o)))
        return rc;
    if (o->on_compiled)
        o->on_compiled(&st, user);
    return REGC_OK;
}

int regc_trainer_replan_resumed(trainer *t, const regc_train_options *o,
                                const regc_compile_options *co, int64_t start, int *next_plan,
                                void *user)
{
    *next_plan = 0;
    while (*next_plan < o->replans.n && o->replans.at[*next_plan].step <= start)
        (*next_plan)++;
    /* the cache keeps what the run that made the plan decided */
    return start > 0 && *next_plan > 0 ? replan(t, o, co, *next_plan - 1, user) : REGC_OK;
}

int regc_trainer_replan_at(trainer *t, const regc_train_options *o, const regc_compile_options *co,
                           int step, int64_t start, int *next_plan, void *user)
{
    if (*next_plan >= o->replans.n)
        return REGC_OK;
    int rc = REGC_OK;
    /* what there is to measure: ZeRO-3's units, and the kernels that auto's
     * recomputation ranks (timing each instruction slows the step) */
    if (regc_program_shard_layout(t->program) || measures_kernels(o)) {
        const int64_t plan = o->replans.at[*next_plan].step, from = plan - REPLAN_MEASURED;
        if (step == (from > start + 1 ? from : start + 1) && step < plan)
            rc = regc_program_measure(t->program, 1);
    }
    if (rc == REGC_OK && o->replans.at[*next_plan].step == step)
        rc = replan(t, o, co, (*next_plan)++, user);
    return rc;
}
