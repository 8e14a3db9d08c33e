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
 *     cost the most per byte kept).
 * Units the schedule already keeps (the persistent ones) stay resident in
 * every candidate. Without a budget the pass changes nothing. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

typedef struct {
    const regc_pass_input *in;
    regc_comm_schedule *s;
    const unsigned char *kept; /* resident before the pass */
    const int *order;          /* units, highest gather cost per byte first */
} fitter;

/* The schedule with `prefetch` and the first k units of the order
 * resident; the device memory it needs into *total. */
static int try_schedule(fitter *f, int64_t prefetch, int k, int64_t *total)
{
    const regc_shard_layout *l = f->in->layout;
    f->s->prefetch_floats = prefetch;
    memcpy(f->s->resident, f->kept, (size_t)l->n_units);
    for (int i = 0; i < k; i++)
        f->s->resident[f->order[i]] = 1;
    regc_device_memory a;
    int rc = regc_pass_try(f->in, f->s, &a);
    if (rc == REGC_OK)
        *total = a.total;
    return rc;
}

/* The units by gather cost per element, highest first (ties by number). */
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

int regc_pass_selective_gather(const regc_pass_input *in, regc_comm_schedule *s, void *user)
{
    (void)user;
    const regc_shard_layout *l = in->layout;
    if (!l || l->n_units <= 0 || in->budget_bytes <= 0)
        return REGC_OK;
    const size_t n = (size_t)l->n_units;
    int *order = malloc((n + 1) * sizeof *order);
    unsigned char *kept = malloc(n + 1);
    if (!order || !kept) {
        free(order), free(kept);
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    }
    memcpy(kept, s->resident, n);
    if (sort_units(l, in->profile, order)) {
        free(order), free(kept);
        return REGC_ERR_MEMORY;
    }
    fitter f = {in, s, kept, order};
    static const int64_t depths[] = {-4, -2, -1, 0};
    const int first = s->prefetch_floats != 0 ? 0 : 3;
    const int64_t budget = in->budget_bytes;
    int64_t total = 0, prefetch = 0;
    int rc = REGC_OK, fits = 0;
    for (int d = first; d < 4 && rc == REGC_OK && !fits; d++) {
        prefetch = depths[d];
        if ((rc = try_schedule(&f, prefetch, 0, &total)) == REGC_OK)
            fits = total <= budget;
    }
    int n_kept = 0;
    for (int u = 0; u < l->n_units; u++)
        n_kept += kept[u] != 0;
    if (rc == REGC_OK && !fits)
        rc = regc_error(REGC_ERR_BUDGET,
                        "compile.memory_budget_mb: the step needs %.1f MiB per rank at the "
                        "least (each unit gathered where it is needed, %s resident); the "
                        "budget is %.1f MiB",
                        (double)total / (1 << 20), n_kept ? "only the persistent ones" : "none",
                        (double)budget / (1 << 20));
    /* the most resident units that fit: k = lo fits, k = hi does not */
    int lo = 0, hi = l->n_units + 1;
    while (rc == REGC_OK && hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if ((rc = try_schedule(&f, prefetch, mid, &total)) == REGC_OK) {
            if (total <= budget)
                lo = mid;
            else
                hi = mid;
        }
    }
    if (rc == REGC_OK) { /* the schedule decided; the driver links it */
        s->prefetch_floats = prefetch;
        memcpy(s->resident, kept, n);
        for (int i = 0; i < lo; i++)
            s->resident[order[i]] = 1;
    }
    free(order), free(kept);
    return rc;
}
