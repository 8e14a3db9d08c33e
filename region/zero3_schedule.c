/* zero3_schedule.c — the communication schedule over the flat step
 * program: ZeRO-3's prefetch and overlap, and stage 0's buckets.
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
 *    while the gradient buffers in flight stay within the bucket.
 * A start and its wait name the same buffers, so the memory plan, made
 * again after this pass, keeps a gathered buffer from its start to its last
 * reader and a gradient buffer until its reduce-scatter is done. The
 * collectives keep their order of starts, the same on every rank.
 *
 * Stage 0 over several ranks has no placement: the update all-reduces the
 * gradient block a bucket at a time. regc_allreduce_schedule moves each
 * bucket's all-reduce to just after the last instruction that writes a
 * gradient in it, asynchronous, and waits for them all at the program's
 * end, so the sums of the last layers' gradients overlap the backward of
 * the first. The buckets' sums are the update's, so the bits are too. */
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

/* ---------------------------------------------------------------- stage 0 */

/* The first bucket of `n` (starts ascending, bytes) that holds byte `at`. */
static int bucket_of(const int64_t *start, int n, int64_t at)
{
    int lo = 0, hi = n; /* start[lo] <= at < start[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (start[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int regc_allreduce_schedule(regc_program *p)
{
    int nb = 0, n = p->n_instr;
    for (int i = 0; i < p->n_update; i++)
        nb += p->update[i].kernel == K_ALLREDUCE && !p->update[i].d[1];
    if (nb == 0)
        return REGC_OK;
    regc_instr *bucket = malloc((size_t)nb * sizeof *bucket);
    int64_t *start = malloc((size_t)nb * sizeof *start);
    int *after = malloc((size_t)nb * sizeof *after); /* its last writer, -1 */
    regc_instr *out = malloc(((size_t)n + 2 * (size_t)nb) * sizeof *out);
    if (!bucket || !start || !after || !out) {
        free(bucket), free(start), free(after), free(out);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    /* the update's buckets, in the block's order, out of the update */
    int k = 0, kept = 0;
    for (int i = 0; i < p->n_update; i++) {
        const regc_instr *u = &p->update[i];
        if (u->kernel == K_ALLREDUCE && !u->d[1]) {
            after[k] = -1;
            start[k] = p->bufs[u->refs[0].buf].offset + u->refs[0].off;
            bucket[k++] = *u;
        } else {
            p->update[kept++] = *u;
        }
    }
    p->n_update = kept;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < p->instr[i].n_refs; r++) {
            const int b = p->instr[i].refs[r].buf;
            if (b < 0 || p->bufs[b].kind != BUF_GRADS || !regc_instr_writes(&p->instr[i], r))
                continue;
            const int64_t lo = p->bufs[b].offset, hi = lo + p->bufs[b].bytes;
            for (int j = bucket_of(start, nb, lo); j < nb && start[j] < hi; j++)
                after[j] = i;
        }
    /* starts after their last writer (before everything: never written),
     * in the block's order where several share one; then every wait */
    int n_out = 0, signal = p->n_signals;
    for (int i = -1; i < n; i++) {
        if (i >= 0)
            out[n_out++] = p->instr[i];
        for (int j = 0; j < nb; j++)
            if (after[j] == i) {
                out[n_out] = bucket[j];
                out[n_out++].signal = ++signal;
            }
    }
    /* in the order started (the queue waits for every earlier one too) */
    for (int i = 0, m = n_out; i < m; i++)
        if (out[i].kernel == K_ALLREDUCE && out[i].signal)
            out[n_out++] = wait_for(&out[i]);
    free(p->instr);
    p->instr = out, p->n_instr = n_out;
    p->n_signals = signal;
    free(bucket), free(start), free(after);
    return REGC_OK;
}

/* ---------------------------------------------------------------- its cost */

static void count_comm(const regc_program *p, const regc_instr *in, regc_comm_plan *c)
{
    const int64_t others = p->ranks - 1;
    switch (in->kernel) {
    case K_ALLGATHER:
        c->gathers++;
        c->gather_bytes += others * in->d[0] * (int64_t)sizeof(float);
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
