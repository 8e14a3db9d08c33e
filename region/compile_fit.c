/* compile_fit.c — compile.memory_budget_mb under recompute auto: the step
 * compiled as many times as the search needs to find the cheapest choice
 * that fits the budget. Offloading alone is tried first (the fewest
 * activations offloaded, largest first, no more than compile.host_memory_mb
 * takes, which offload.c keeps to); then the least recomputation, by
 * the FLOP-per-byte ratio below which a saved value is recomputed (a
 * bisection over the ratios the graph's candidates have); then the same
 * with the head and its loss in chunks of rows, kept where it recomputes
 * fewer FLOPs (FLOPs even where measured times rank the recomputation,
 * since the chunks change the head's gradient in its last bits). A budget
 * nothing reaches is refused naming the least any probe held. Each probe
 * is a compile of a copy of the graph, counted in the stats' fit_probes
 * and fit_ms. Every probe keeps ZeRO-3's least schedule: whether a choice
 * fits does not depend on which units the room left keeps gathered, which
 * only the compile kept decides. Asked only whether something fits
 * (fit_check), the ends of the search's ranges answer (nothing or
 * everything recomputed, the logits whole or in chunks), never the
 * bisections between, and the least they hold goes to the stats'
 * fit_least, by which a search over sizes (`regc plan --fit`) steers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

/* One compile of the budget's search: a copy of g as o says, its time and
 * count into st's fit_ms and fit_probes, its own statistics dropped. */
static int compile_probe(const regc_graph *g, const int64_t *param_offset,
                         const regc_compile_options *o, regc_program **p, regc_compile_stats *st)
{
    const double t0 = regc_time_ms();
    regc_compile_stats scratch = {0};
    regc_graph *h = regc_graph_dup(g);
    const int rc = h ? regc_compile_graph_taken(h, param_offset, o, p, &scratch)
                     : regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    st->fit_probes++, st->fit_ms += regc_time_ms() - t0;
    return rc;
}

/* What a probe's step holds: device bytes per rank (-1 when a schedule
 * pass found no fit), host bytes, the recomputation's FLOPs per step and
 * the activations offloaded. */
typedef struct {
    int64_t total, host;
    double flop;
    int offloaded;
} probed;

/* Compile a copy of g as o says, with ZeRO-3's least schedule (fit_check:
 * whether a choice fits does not depend on what the room left then keeps
 * gathered, which the compile kept chooses), and weigh it against the
 * budgets: 1 fits, 0 does not (the message kept), or an error; *r what it
 * holds. */
static int probe(const regc_graph *g, const int64_t *param_offset, const regc_compile_options *o,
                 regc_compile_stats *st, probed *r)
{
    *r = (probed){.total = -1};
    regc_program *p = NULL;
    regc_compile_options least = *o;
    least.fit_check = 1;
    int rc = compile_probe(g, param_offset, &least, &p, st);
    if (rc == REGC_OK) {
        regc_device_memory a;
        regc_fit_plan f;
        regc_program_device_memory(p, &a);
        regc_program_fit_plan(p, &f);
        *r = (probed){a.total, a.host, f.replay_flop, f.offloaded};
        rc = a.total <= regc_compile_least_budget(o) &&
             (o->host_budget_bytes <= 0 || a.host <= o->host_budget_bytes);
    } else if (rc == REGC_ERR_BUDGET) {
        rc = 0;
    }
    regc_program_free(p);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Every candidate's FLOPs per byte, from a copy of g compiled as o says
 * without the budget (a ratio of 0 drops nothing: every candidate costs
 * something), sorted, each once. */
static int candidate_ratios(const regc_graph *g, const int64_t *param_offset,
                            const regc_compile_options *o, regc_compile_stats *st, double **out,
                            int *n_out)
{
    regc_compile_options c = *o;
    c.budget_bytes = 0, c.recompute_ratio = 0.0;
    c.fit_check = 1; /* no pass's own budget either: the ratios are all it is for */
    regc_program *p = NULL;
    int rc = compile_probe(g, param_offset, &c, &p, st);
    int n = 0;
    for (int i = 0; rc == REGC_OK && i < p->n_regions; i++)
        n += p->regions[i]->n_recompute_ratios;
    double *v = rc == REGC_OK ? malloc(((size_t)n + 1) * sizeof *v) : NULL;
    if (rc == REGC_OK && !v)
        rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    n = 0;
    for (int i = 0; rc == REGC_OK && i < p->n_regions; i++)
        for (int j = 0; j < p->regions[i]->n_recompute_ratios; j++)
            v[n++] = p->regions[i]->recompute_ratios[j];
    regc_program_free(p);
    if (rc)
        return rc;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[i] != v[m - 1])
            v[m++] = v[i];
    *out = v, *n_out = m;
    return REGC_OK;
}

/* The least ratio that fits with o's chunking: *ratio (-1: nothing
 * recomputed) and *flop; 1 when one fits, 0 when none does (*least: what
 * the most recomputation holds, -1 when a schedule pass said), or an
 * error. Dropping every candidate whose ratio is at most r frees more as
 * r grows, so a search over the candidates' own ratios finds the least. */
static int least_ratio(const regc_graph *g, const int64_t *param_offset,
                       const regc_compile_options *o, regc_compile_stats *st, double *ratio,
                       double *flop, int64_t *least)
{
    regc_compile_options a = *o;
    a.recompute_ratio = -1.0;
    probed r;
    int fit = probe(g, param_offset, &a, st, &r);
    *flop = r.flop;
    if (fit != 0) {
        *ratio = -1.0;
        return fit;
    }
    double *v = NULL;
    int n = 0, rc = candidate_ratios(g, param_offset, &a, st, &v, &n);
    if (rc)
        return rc;
    /* everything first: the least it can need; then lo does not fit, hi does */
    int lo = -1, hi = n - 1;
    a.recompute_ratio = n > 0 ? v[hi] : -1.0;
    fit = probe(g, param_offset, &a, st, &r);
    *least = r.total, *flop = r.flop;
    while (fit > 0 && hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        a.recompute_ratio = v[mid];
        const int ok = probe(g, param_offset, &a, st, &r);
        if (ok < 0)
            fit = ok;
        else if (ok)
            hi = mid, *flop = r.flop;
        else
            lo = mid;
    }
    if (fit > 0)
        *ratio = n > 0 ? v[hi] : -1.0;
    free(v);
    return fit;
}

/* The rows of the loss's chunks under a budget: as many as keep the
 * backward's chunk (its logits and their gradient) within a 64th of the
 * budget, a power of two; 0 when the graph has no loss over logits. */
static int64_t budget_chunk_rows(const regc_graph *g, int64_t budget)
{
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op != REGC_OP_CROSS_ENTROPY)
            continue;
        const regc_tensor *x = regc_graph_tensor(g, n->in[0]);
        const int64_t cols = x->ndim ? x->shape[x->ndim - 1] : 1;
        const int64_t rows = regc_tensor_numel(x) / (cols ? cols : 1);
        int64_t c = 1;
        while (c * 2 < rows && c * 2 * cols * 2 * (int64_t)sizeof(float) <= budget / 64)
            c *= 2;
        return c;
    }
    return 0;
}

/* compile.recompute auto under compile.memory_budget_mb: with offload on,
 * first the fewest activations offloaded that fit; else (every one
 * offloaded, with offload on) the least recomputation that fits, the
 * logits whole or in chunks (when nothing else set the chunks), whichever
 * recomputes fewer FLOPs; a step that fits as it is recomputes nothing. The
 * probes use no cache and write no dumps; the step is then compiled once
 * more with the choice, as a compile without a budget would be. */
/* Under a host budget: the step with nothing offloaded and nothing
 * recomputed must fit it (what stays on the host then is the offloaded
 * optimizer state, which nothing the search chooses shrinks), else an
 * error naming both; offload.c offloads no more than the rest of it. */
static int host_floor(const regc_graph *g, const int64_t *param_offset,
                      const regc_compile_options *o, regc_compile_stats *st)
{
    if (o->host_budget_bytes <= 0 || !o->offload_activation)
        return REGC_OK; /* without offloading, the compile's own check refuses it */
    regc_compile_options a = *o;
    a.offload_activation = 0, a.recompute_ratio = -1.0;
    probed r;
    const int rc = probe(g, param_offset, &a, st, &r);
    if (rc < 0 || r.host <= o->host_budget_bytes)
        return rc < 0 ? rc : REGC_OK;
    return regc_error(REGC_ERR_BUDGET,
                      "compile.host_memory_mb: the step holds %.1f MiB per rank on the host "
                      "with no activation offloaded (the offloaded optimizer state); the limit "
                      "is %.1f MiB",
                      (double)r.host / (1 << 20), (double)o->host_budget_bytes / (1 << 20));
}

/* With offload on: the fewest activations offloaded (the largest first,
 * as many as the host budget takes) with which the step fits recomputing
 * nothing, into a->offload_limit; 1 when some number fits, 0 when even all
 * do not (a->offload_limit then -1: all, for recomputation to take it from
 * there; *least: what all hold, or -1), or an error. */
static int least_offload(const regc_graph *g, const int64_t *param_offset, regc_compile_options *a,
                         regc_compile_stats *st, int64_t *least)
{
    probed r;
    a->recompute_ratio = -1.0, a->offload_limit = -1;
    int fit = probe(g, param_offset, a, st, &r);
    *least = r.total;
    int n = r.offloaded;
    if (fit <= 0)
        return fit;
    int lo = -1, hi = n; /* lo does not fit (-1: untried), hi does */
    while (hi - lo > 1) {
        const int mid = lo < 0 ? 0 : (lo + hi) / 2;
        a->offload_limit = mid;
        const int ok = probe(g, param_offset, a, st, &r);
        if (ok < 0)
            return ok;
        if (ok)
            hi = mid;
        else
            lo = mid;
    }
    a->offload_limit = hi;
    return 1;
}

/* The refusal of a budget below the least any choice held (least bytes),
 * naming what the search could do to reach it. */
static int refuse_budget(const regc_compile_options *o, int64_t least, int chunked)
{
    return regc_error(REGC_ERR_BUDGET,
                      "compile.memory_budget_mb: the step needs %.1f MiB per rank at the least "
                      "(recomputing%s%s what can be); the budget is %.1f MiB",
                      (double)least / (1 << 20),
                      o->offload_activation ? (chunked ? ", offloading" : " and offloading") : "",
                      chunked ? " and chunking" : "",
                      (double)regc_compile_least_budget(o) / (1 << 20));
}

/* fit_check's answer: whether any choice of the search fits, from the
 * ends of its ranges only, each with ZeRO-3's least schedule
 * (zero3_budget.c): every candidate recomputed or none, the logits whole
 * or in the budget's chunks (unless the options chunk them), and with
 * offload on every activation that qualifies offloaded. Each choice
 * between the ends holds at least what one end holds; the ends do not
 * order among themselves (an offloaded activation costs the device
 * nothing, its recomputation a layer's replay), so each is tried, the
 * likeliest to fit first, until one fits. The least any held goes to
 * st->fit_least; REGC_OK when one fits, else REGC_ERR_BUDGET naming the
 * least (or another error). */
static int least_choice(const regc_graph *g, const int64_t *param_offset,
                        const regc_compile_options *o, regc_compile_stats *st)
{
    const int64_t chunk =
        o->logits_chunk_rows > 0 ? o->logits_chunk_rows : budget_chunk_rows(g, o->budget_bytes);
    /* chunked first; with offload on, nothing recomputed first */
    const double ratio[2] = {o->offload_activation ? -1.0 : HUGE_VAL,
                             o->offload_activation ? HUGE_VAL : -1.0};
    const int64_t rows[2] = {chunk, o->logits_chunk_rows};
    int64_t least = -1, host = -1;
    int fit = 0;
    for (int c = 0; c < 2 && fit == 0; c++)
        for (int k = 0; k < 2 && fit == 0 && (c == 0 || rows[1] != rows[0]); k++) {
            regc_compile_options a = *o;
            a.offload_limit = -1, a.recompute_ratio = ratio[k], a.logits_chunk_rows = rows[c];
            probed r;
            fit = probe(g, param_offset, &a, st, &r);
            if (r.total >= 0 && (least < 0 || r.total < least))
                least = r.total, host = r.host;
        }
    st->fit_least = least;
    if (fit > 0) {
        regc_error_clear();
        return REGC_OK;
    }
    if (fit < 0 || least < 0) /* an error, or a schedule pass's own message */
        return fit < 0 ? fit : REGC_ERR_BUDGET;
    if (least > regc_compile_least_budget(o))
        return refuse_budget(o, least, chunk > 0);
    return regc_error(REGC_ERR_BUDGET,
                      "compile.host_memory_mb: the step holds %.1f MiB per rank on the host at "
                      "its least device memory; the limit is %.1f MiB",
                      (double)host / (1 << 20), (double)o->host_budget_bytes / (1 << 20));
}

int regc_compile_fitting(regc_graph *g, const int64_t *param_offset, const regc_compile_options *o,
                         regc_program **out, regc_compile_stats *st)
{
    regc_compile_options a = *o;
    a.cache = NULL, a.dump_dir = NULL;
    double ratio = -1.0, flop = 0.0;
    int64_t least = -1, offloaded = -1; /* the least any probe held; offloading alone */
    int fit = host_floor(g, param_offset, &a, st);
    if (fit == REGC_OK && o->fit_check) {
        fit = least_choice(g, param_offset, &a, st);
        regc_graph_free(g);
        return fit;
    }
    if (fit == REGC_OK && o->offload_activation)
        fit = least_offload(g, param_offset, &a, st, &offloaded);
    if (fit > 0) { /* offloading fits it: nothing recomputed */
        regc_error_clear();
        a.cache = o->cache, a.dump_dir = o->dump_dir;
        return regc_compile_graph_taken(g, param_offset, &a, out, st);
    }
    if (fit == 0)
        fit = least_ratio(g, param_offset, &a, st, &ratio, &flop, &least);
    const int64_t chunk = budget_chunk_rows(g, o->budget_bytes);
    if (fit >= 0 && (fit == 0 || ratio >= 0.0) && o->logits_chunk_rows == 0 && chunk > 0) {
        /* Whether to chunk is weighed in FLOPs, whatever ranks the
         * recomputation: the chunks change the head weight's gradient in
         * its last bits, so measured times, which vary from run to run,
         * must not decide them. With measured costs, the FLOPs of what the
         * whole logits would recompute are those of the FLOP-ranked choice. */
        regc_compile_options c = a;
        c.logits_chunk_rows = chunk, c.kernel_cost = NULL, c.n_kernel_cost = 0;
        double r2 = -1.0, f2 = 0.0, whole_flop = flop;
        int64_t least2 = -1;
        int fit2 = 0;
        if (fit > 0 && o->kernel_cost) {
            regc_compile_options w = c;
            w.logits_chunk_rows = 0;
            double rw = -1.0;
            int64_t lw = -1;
            fit2 = least_ratio(g, param_offset, &w, st, &rw, &whole_flop, &lw);
        }
        if (fit2 >= 0)
            fit2 = least_ratio(g, param_offset, &c, st, &r2, &f2, &least2);
        if (fit2 < 0) {
            fit = fit2;
        } else if (fit2 && (!fit || f2 < whole_flop)) {
            a.logits_chunk_rows = chunk;
            if (o->kernel_cost) /* the chunks chosen, the measured ranking within them */
                fit = least_ratio(g, param_offset, &a, st, &ratio, &flop, &least);
            else
                fit = 1, ratio = r2, flop = f2;
        } else if (!fit && least2 >= 0 && (least < 0 || least2 < least)) {
            least = least2;
        }
    }
    int rc = fit < 0 ? fit : REGC_OK;
    if (offloaded >= 0 && (least < 0 || offloaded < least))
        least = offloaded;
    if (fit == 0 && least >= 0)
        rc = refuse_budget(o, least, o->logits_chunk_rows > 0 || chunk > 0);
    else if (fit == 0)
        rc = REGC_ERR_BUDGET; /* the schedule pass's message says what it needs */
    if (rc == REGC_OK) {
        regc_error_clear(); /* a probe that did not fit left its message */
        a.cache = o->cache, a.dump_dir = o->dump_dir;
        a.recompute_ratio = ratio;
        rc = regc_compile_graph_taken(g, param_offset, &a, out, st);
        g = NULL;
    }
    regc_graph_free(g);
    return rc;
}
