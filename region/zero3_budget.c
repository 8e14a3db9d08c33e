/* zero3_budget.c — ZeRO-3 under a device-memory budget: the fastest
 * schedule whose memory fits.
 *
 * Two choices trade memory for time: how far ahead gathers start (each
 * unit ahead holds one more unit's parameters) and which units stay
 * gathered from their forward to their backward instead of being gathered
 * again (DeepCompile's selective gather). A candidate is linked in full
 * (placement, inline back, schedule, memory plan) and measured by the
 * program's own account, regc_program_device_memory, the number the
 * runtime allocates and `regc plan` prints. The search:
 *  1. the deepest prefetch of 4, 2, 1, 0 units ahead that fits with no
 *     unit resident (none fitting: the budget is too small, and the error
 *     says how much on-demand gathering needs);
 *  2. at that depth, the most resident units that fit, by bisection over
 *     k, the k smallest units resident (a gather costs a latency plus its
 *     bytes: the smallest units cost the most per byte kept).
 * The persistent units (compile.persistence_floats: those of at most that
 * many parameters, the smallest) are resident in every candidate.
 * The program is left linked with the best candidate that fit. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

typedef struct {
    regc_program *p;
    const int64_t *param_offset;
    int inline_flat;
    const int *by_size;  /* units, smallest first */
    int64_t persistence; /* units of at most this many parameters are always resident */
} fitter;

/* Link with `prefetch` and the k smallest units resident; the device
 * memory it needs into *total. */
static int try_schedule(fitter *f, int64_t prefetch, int k, int64_t *total, regc_compile_stats *st)
{
    regc_program *p = f->p;
    regc_program_unlink(p);
    p->prefetch_floats = prefetch;
    memset(p->resident, 0, (size_t)p->layout->n_units);
    for (int i = 0; i < k; i++)
        p->resident[f->by_size[i]] = 1;
    p->n_resident = 0;
    for (int u = 0; u < p->layout->n_units; u++) {
        p->resident[u] |= p->layout->unit_floats[u] <= f->persistence;
        p->n_resident += p->resident[u];
    }
    int rc = regc_program_link(p, f->param_offset, f->inline_flat, st);
    regc_device_memory a;
    if (rc == REGC_OK) {
        regc_program_device_memory(p, &a);
        *total = a.total;
    }
    return rc;
}

/* The units smallest first (ties by number), into by_size. */
static void sort_units(const regc_shard_layout *l, int *by_size)
{
    for (int u = 0; u < l->n_units; u++) {
        int i = u;
        for (; i > 0 && l->unit_padded[by_size[i - 1]] > l->unit_padded[u]; i--)
            by_size[i] = by_size[i - 1];
        by_size[i] = u;
    }
}

int regc_zero3_persist(regc_program *p, int64_t persistence)
{
    const regc_shard_layout *l = p->layout;
    free(p->resident);
    if (!(p->resident = calloc((size_t)l->n_units + 1, 1)))
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    p->n_resident = 0;
    for (int u = 0; u < l->n_units; u++)
        if (l->unit_floats[u] <= persistence) {
            p->resident[u] = 1;
            p->n_resident++;
        }
    return REGC_OK;
}

int regc_zero3_fit(regc_program *p, const int64_t *param_offset, int inline_flat, int64_t budget,
                   int64_t persistence, regc_compile_stats *st)
{
    const regc_shard_layout *l = p->layout;
    int *by_size = malloc(((size_t)l->n_units + 1) * sizeof *by_size);
    free(p->resident);
    p->resident = calloc((size_t)l->n_units + 1, 1);
    if (!by_size || !p->resident) {
        free(by_size);
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    }
    sort_units(l, by_size);
    fitter f = {p, param_offset, inline_flat, by_size, persistence};
    static const int64_t depths[] = {-4, -2, -1, 0};
    int64_t total = 0, prefetch = 0;
    int rc = REGC_OK, fits = 0;
    for (size_t d = 0; d < sizeof depths / sizeof *depths && rc == REGC_OK && !fits; d++) {
        prefetch = depths[d];
        if ((rc = try_schedule(&f, prefetch, 0, &total, NULL)) == REGC_OK)
            fits = total <= budget;
    }
    if (rc == REGC_OK && !fits)
        rc = regc_error(REGC_ERR_ARG,
                        "compile.memory_budget_mb: the step needs %.1f MiB per rank at the "
                        "least (each unit gathered where it is needed, %s resident); the "
                        "budget is %.1f MiB",
                        (double)total / (1 << 20),
                        persistence > 0 ? "only the persistent ones" : "none",
                        (double)budget / (1 << 20));
    /* the most resident units that fit: k = lo fits, k = hi does not */
    int lo = 0, hi = l->n_units + 1;
    while (rc == REGC_OK && hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if ((rc = try_schedule(&f, prefetch, mid, &total, NULL)) == REGC_OK) {
            if (total <= budget)
                lo = mid;
            else
                hi = mid;
        }
    }
    if (rc == REGC_OK)
        rc = try_schedule(&f, prefetch, lo, &total, st);
    free(by_size);
    return rc;
}
