/* zero3_schedule.c — ZeRO-3's communication schedule over the flat step
 * program: prefetch and overlap.
 *
 * Placement (zero3_place.c) leaves each collective synchronous, right
 * where it is needed: every unit's all-gather just before its first
 * reader, every reduce-scatter just after its unit's last gradient write.
 * This transform, run on the program inlined back and already in its final
 * (memory-aware) order with the schedule the passes decided (passes.c),
 * makes them asynchronous on the communication queue:
 *  - all-gather k starts while an earlier unit j computes, and is waited
 *    for where it used to run. j is the earliest unit for which the
 *    parameters in flight ahead of the compute (units j+1 .. k) stay within
 *    the prefetch bucket, and at least one unit ahead (or j = k - n for a
 *    depth of n units); with no bucket (prefetch 0) each gather starts
 *    where it is waited for (on demand). A live limit (max_live_floats)
 *    can only start it later: units j .. k, the one computing and those
 *    gathered ahead, itself included, must stay within it;
 *  - with overlap, reduce-scatter m starts where it ran and is waited for once those
 *    started after it reach the reduce bucket (reduce_bucket_floats; 0:
 *    once m + 1 has started), so it overlaps the next units' backward
 *    while the gradient buffers in flight stay within the bucket and the
 *    oldest one.
 * A start and its wait name the same buffers, so the memory plan, made
 * again after this pass, keeps a gathered buffer from its start to its last
 * reader and a gradient buffer until its reduce-scatter is done. The
 * collectives keep their order of starts, the same on every rank. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

static regc_instr wait_for(const regc_instr *start)
{
    regc_instr w = *start;
    w.kernel = K_COMM_WAIT;
    w.d[1] = start->kernel;
    w.accumulate = 0;
    return w;
}

/* The unit whose parameters in flight ahead of gather k's wait may start
 * it: the earliest j with gathers j+1 .. k within `bucket` floats, and at
 * least one unit ahead (bucket -n: exactly n units; 0: none). */
static int start_unit(const int64_t *floats, int k, int64_t bucket)
{
    if (bucket == 0 || k == 0)
        return k;
    if (bucket < 0)
        return k + bucket > 0 ? (int)(k + bucket) : 0;
    int j = k - 1;
    int64_t ahead = floats[k];
    while (j > 0 && ahead + floats[j] <= bucket)
        ahead += floats[j--];
    return j;
}

/* The earliest unit j while which gather k may start with units j .. k
 * within `max_live` floats (0: no limit); k itself when even it alone
 * does not fit (gathered where it is needed). */
static int live_start_unit(const int64_t *floats, int k, int64_t max_live)
{
    if (max_live <= 0)
        return 0;
    int j = k;
    int64_t live = floats[k];
    while (j > 0 && live + floats[j - 1] <= max_live)
        live += floats[--j];
    return j;
}

int regc_zero3_schedule(regc_program *p, int64_t prefetch_floats, int64_t max_live_floats,
                        int64_t reduce_bucket_floats, int overlap)
{
    int n = p->n_instr, n_gather = 0, n_scatter = 0;
    for (int i = 0; i < n; i++) {
        n_gather += p->instr[i].kernel == K_ALLGATHER;
        n_scatter += p->instr[i].kernel == K_REDUCE_SCATTER && overlap;
    }
    int *gpos = malloc(((size_t)n_gather + 1) * sizeof *gpos);
    int *from = malloc(((size_t)n_gather + 1) * sizeof *from);
    int64_t *floats = malloc(((size_t)n_gather + 1) * sizeof *floats);
    regc_instr *out = malloc(((size_t)n + n_gather + 2 * (size_t)n_scatter + 1) * sizeof *out);
    if (!gpos || !from || !floats || !out) {
        free(gpos), free(from), free(floats), free(out);
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    }
    for (int i = 0, k = 0; i < n; i++)
        if (p->instr[i].kernel == K_ALLGATHER)
            gpos[k] = i, floats[k++] = p->instr[i].d[0] * p->ranks;
    for (int k = 0; k < n_gather; k++) {
        const int bucket = start_unit(floats, k, prefetch_floats);
        const int live = live_start_unit(floats, k, max_live_floats);
        from[k] = bucket > live ? bucket : live;
    }
    /* signals: gathers 1 .. n_gather, then the reduce-scatters */
    int n_out = 0, k = 0, next = 0, m = 0;
    /* the reduce-scatters started, not yet waited for: out[pend[head .. tail)] */
    int *pend = malloc(((size_t)n_scatter + 1) * sizeof *pend);
    if (!pend) {
        free(gpos), free(from), free(floats), free(out);
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    }
    int head = 0, tail = 0;
    int64_t after_head = 0; /* floats of those started after the oldest */
    for (int i = 0; i < n; i++) {
        const regc_instr *in = &p->instr[i];
        if (in->kernel == K_ALLGATHER) {
            /* start every gather due while unit k computes, then wait for k */
            for (; next < n_gather && from[next] <= k; next++) {
                out[n_out] = p->instr[gpos[next]];
                out[n_out++].signal = next + 1;
            }
            regc_instr self = *in;
            self.signal = k + 1;
            out[n_out++] = wait_for(&self);
            k++;
        } else if (in->kernel == K_REDUCE_SCATTER && overlap) {
            if (tail > head)
                after_head += in->d[0] * p->ranks;
            pend[tail++] = n_out;
            out[n_out] = *in;
            out[n_out++].signal = n_gather + ++m;
            while (tail - head > 1 && after_head >= reduce_bucket_floats) {
                out[n_out++] = wait_for(&out[pend[head++]]);
                after_head -= out[pend[head]].d[0] * p->ranks;
            }
        } else {
            out[n_out++] = *in;
        }
    }
    while (head < tail)
        out[n_out++] = wait_for(&out[pend[head++]]);
    free(pend);
    free(p->instr);
    p->instr = out, p->n_instr = n_out;
    p->n_signals = n_gather + n_scatter;
    free(gpos), free(from), free(floats);
    return REGC_OK;
}

/* ---------------------------------------------------------------- its cost */

static void count_comm(const regc_program *p, const regc_instr *in, regc_comm_plan *c)
{
    const int64_t others = p->ranks - 1;
    switch (in->kernel) {
    case K_ALLGATHER:
        c->gathers++;
        /* a unit gathered in bf16 sends 2 bytes a value */
        c->gather_bytes += others * in->d[0] * (regc_instr_ref_bf16(in, 0) ? 2 : 4);
        break;
    case K_REDUCE_SCATTER:
        c->scatters++;
        c->scatter_bytes += others * in->d[0] * (int64_t)sizeof(float);
        break;
    case K_ALLREDUCE: /* a ring sends 2 (N - 1) / N of the buffer */
        c->allreduce_bytes +=
            2 * others * in->d[0] * (in->d[1] ? 8 : (int64_t)sizeof(float)) / p->ranks;
        break;
    default: break;
    }
}

void regc_program_comm_plan(const regc_program *p, regc_comm_plan *c)
{
    memset(c, 0, sizeof *c);
    c->units = p->layout ? p->layout->n_units : 0;
    c->frozen_units = p->frozen_layout ? p->frozen_layout->n_units : 0;
    int n = p->lazy ? p->n_steps : p->n_instr;
    for (int i = 0; i < n; i++) {
        const regc_instr *in = p->lazy ? &p->steps[i].instr : &p->instr[i];
        if (!p->lazy || p->steps[i].piece < 0)
            count_comm(p, in, c);
    }
    for (int i = 0; i < p->n_update; i++)
        count_comm(p, &p->update[i], c);
    /* the window: gathered buffers live at once, over the program points
     * (each adds its bytes at its first point and takes them off after its
     * last) */
    int64_t *delta = calloc((size_t)n + 2, sizeof *delta);
    if (!delta) {
        c->window_bytes = -1; /* unknown */
        return;
    }
    for (int i = 0; i < n; i++) {
        const regc_instr *in = p->lazy ? &p->steps[i].instr : &p->instr[i];
        if ((p->lazy && p->steps[i].piece >= 0) || in->kernel != K_ALLGATHER)
            continue;
        const regc_buf *b = &p->bufs[in->refs[0].buf];
        if (b->first >= 0 && b->last >= b->first && b->last <= n) {
            delta[b->first] += b->bytes;
            delta[b->last + 1] -= b->bytes;
        }
    }
    int64_t live = 0;
    for (int t = 0; t <= n; t++) {
        live += delta[t];
        if (live > c->window_bytes)
            c->window_bytes = live;
    }
    free(delta);
}
