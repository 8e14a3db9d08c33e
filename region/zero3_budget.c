/* zero3_budget.c — the selective_gather pass: ZeRO-3 under a device-memory
 * budget, the fastest schedule whose memory fits.
 *
 * Two choices trade memory for time: how far ahead gathers start (each
 * unit ahead holds one more unit's parameters) and which units stay
 * gathered from their forward to their backward instead of being gathered
 * again (DeepCompile's selective gather). A candidate is linked in full
 * (placement, inline back, schedule, memory plan) and measured by the
 * program's own account, regc_program_device_memory, the number the
 * runtime allocates and `regc plan` prints. The search:
 *  1. the deepest prefetch of 4, 2, 1, 0 units ahead that fits with no
 *     more units resident than the schedule has (only 0 when no pass
 *     before this one prefetches); none fitting: the budget is too small,
 *     and the error says how much on-demand gathering needs;
 *  2. at that depth, the most resident units that fit, by bisection over
 *     k, the first k units by gather cost per byte: measured (an
 *     all-gather's time over its bytes), or without a profile the smallest
 *     units first (a gather costs a latency plus its bytes: the smallest
 *     cost the most per byte kept);
 *  3. with those, the most frozen units (a LoRA model's base) that fit,
 *     smallest first, by the same bisection: no profile times their
 *     gathers, and the trained units' come first as their gradients'
 *     reduce-scatters already load the backward's communication.
 * Units the schedule already keeps (the persistent ones) stay resident in
 * every candidate. Without a budget the pass changes nothing. Asked only
 * whether the budget can be met (compile.fit_check), it links the least
 * schedule once (on demand, nothing more resident) and leaves the
 * comparison with the budget to the caller, who also reads what it holds:
 * every deeper or more resident schedule holds at least as much. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

typedef struct {
    const regc_pass_input *in;
    regc_comm_schedule *s;
    const unsigned char *kept;        /* resident before the pass */
    const int *order;                 /* units, highest gather cost per byte first */
    const unsigned char *frozen_kept; /* the frozen units resident before the pass */
    const int *frozen_order;          /* frozen units, smallest first */
} fitter;

/* The schedule with `prefetch`, the first k units of the order and the
 * first k_frozen of the frozen order resident; the device memory it needs
 * into *total. */
static int try_schedule(fitter *f, int64_t prefetch, int k, int k_frozen, int64_t *total)
{
    const regc_shard_layout *l = f->in->layout, *fl = f->in->frozen_layout;
    f->s->prefetch_floats = prefetch;
    memcpy(f->s->resident, f->kept, (size_t)l->n_units);
    for (int i = 0; i < k; i++)
        f->s->resident[f->order[i]] = 1;
    if (fl && f->s->frozen_resident)
        memcpy(f->s->frozen_resident, f->frozen_kept, (size_t)fl->n_units);
    for (int i = 0; i < k_frozen; i++)
        f->s->frozen_resident[f->frozen_order[i]] = 1;
    regc_device_memory a;
    int rc = regc_pass_try(f->in, f->s, &a);
    if (rc == REGC_OK)
        *total = a.total;
    return rc;
}

/* The units by gather cost per element, highest first (ties by number);
 * pr NULL: the smallest first. */
static int sort_units(const regc_shard_layout *l, const regc_unit_profile *pr, int *order)
{
    double *cost = malloc(((size_t)l->n_units + 1) * sizeof *cost);
    if (!cost)
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    for (int u = 0; u < l->n_units; u++) {
        const double floats = (double)l->unit_padded[u];
        cost[u] = pr ? pr[u].gather_ms / floats : 1.0 / floats;
    }
    for (int u = 0; u < l->n_units; u++) {
        int i = u;
        for (; i > 0 && cost[order[i - 1]] < cost[u]; i--)
            order[i] = order[i - 1];
        order[i] = u;
    }
    free(cost);
    return REGC_OK;
}

/* The most of `count` units kept resident that fit: *k fits, *k + 1 does
 * not (bisection). k_trained < 0: of the order's units, no frozen one;
 * else of the frozen order's, with the order's first k_trained. */
static int most_that_fit(fitter *f, int64_t prefetch, int count, int k_trained, int *k)
{
    int lo = 0, hi = count + 1, rc = REGC_OK;
    int64_t total = 0;
    while (rc == REGC_OK && hi - lo > 1) {
        int mid = (lo + hi) / 2;
        rc = k_trained < 0 ? try_schedule(f, prefetch, mid, 0, &total)
                           : try_schedule(f, prefetch, k_trained, mid, &total);
        if (rc == REGC_OK) {
            if (total <= f->in->budget_bytes)
                lo = mid;
            else
                hi = mid;
        }
    }
    *k = lo;
    return rc;
}

int regc_pass_selective_gather(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    (void)user;
    const regc_shard_layout *l = in->layout, *fl = in->frozen_layout;
    if (!l || l->n_units <= 0 || in->budget_bytes <= 0)
        return REGC_OK;
    /* a schedule without frozen_resident (a registered pass's) keeps none */
    const size_t n = (size_t)l->n_units, nf = fl && s->frozen_resident ? (size_t)fl->n_units : 0;
    int *order = malloc((n + 1) * sizeof *order), *frozen_order = malloc((nf + 1) * sizeof(int));
    unsigned char *kept = malloc(n + 1), *frozen_kept = malloc(nf + 1);
    int rc = order && kept && frozen_order && frozen_kept
                 ? REGC_OK
                 : regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    if (rc == REGC_OK) {
        memcpy(kept, s->resident, n);
        if (nf)
            memcpy(frozen_kept, s->frozen_resident, nf);
        rc = sort_units(l, in->profile, order);
    }
    if (rc == REGC_OK && nf)
        rc = sort_units(fl, NULL, frozen_order);
    fitter f = {in, s, kept, order, frozen_kept, frozen_order};
    static const int64_t depths[] = {-4, -2, -1, 0};
    const int least_only = in->options && in->options->fit_check;
    const int first = s->prefetch_floats != 0 && !least_only ? 0 : 3;
    const int64_t budget = in->budget_bytes;
    int64_t total = 0, prefetch = 0;
    int fits = 0;
    for (int d = first; d < 4 && rc == REGC_OK && !fits; d++) {
        prefetch = depths[d];
        if ((rc = try_schedule(&f, prefetch, 0, 0, &total)) == REGC_OK)
            fits = total <= budget;
    }
    int n_kept = 0;
    for (size_t u = 0; rc == REGC_OK && u < n; u++)
        n_kept += kept[u] != 0;
    for (size_t u = 0; rc == REGC_OK && u < nf; u++)
        n_kept += frozen_kept[u] != 0;
    if (rc == REGC_OK && !fits && !least_only)
        rc = regc_error(REGC_ERR_BUDGET,
                        "compile.memory_budget_mb: the step needs %.1f MiB per rank at the "
                        "least (each unit gathered where it is needed, %s resident); the "
                        "budget is %.1f MiB",
                        (double)total / (1 << 20), n_kept ? "only the persistent ones" : "none",
                        (double)budget / (1 << 20));
    /* the most resident units that fit, then the most frozen ones with them */
    int k = 0, k_frozen = 0; /* least_only: the least schedule, whatever it holds */
    if (rc == REGC_OK && !least_only)
        rc = most_that_fit(&f, prefetch, l->n_units, -1, &k);
    if (rc == REGC_OK && nf && !least_only)
        rc = most_that_fit(&f, prefetch, (int)nf, k, &k_frozen);
    if (rc == REGC_OK) { /* the schedule decided; the driver links it */
        s->prefetch_floats = prefetch;
        memcpy(s->resident, kept, n);
        for (int i = 0; i < k; i++)
            s->resident[order[i]] = 1;
        if (nf)
            memcpy(s->frozen_resident, frozen_kept, nf);
        for (int i = 0; i < k_frozen; i++)
            s->frozen_resident[frozen_order[i]] = 1;
    }
    free(order), free(kept), free(frozen_order), free(frozen_kept);
    return rc;
}
