/* grad_schedule.c — what leaves the gradient block moved into the backward
 * of the flat step program, each piece as soon as its gradients are final.
 *
 * The update reads the gradient block whole: stage 0 over several ranks
 * first all-reduces it a bucket at a time, and an offloaded update copies
 * it to the host. Both can start on a piece of the block once the last
 * instruction that writes a byte of it has run (its backward, or under
 * ZeRO-3 the wait for its reduce-scatter), and overlap the rest of the
 * backward:
 *  - regc_allreduce_schedule moves each bucket's all-reduce there,
 *    asynchronous on the communication queue, and waits for them all at
 *    the program's end;
 *  - regc_offload_schedule splits the copy to the host into one copy per
 *    range of the block between gradient buffers' bounds and puts each
 *    there (on a GPU on a side stream: compute does not wait for it).
 * Ranges that no instruction writes move to the program's start. The sums
 * and copies are the update's, over the same bytes, so the bits are too.
 * With gradient accumulation the block is final only after the last
 * micro-batch: both stay in the update then (inline_back.c decides). */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"
#include "validate.h"

/* The range of n (starts ascending, bytes; the last ends at the block's
 * end) that holds byte `at`. */
static int range_of(const int64_t *start, int n, int64_t at)
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

/* Calls fn(ctx, i, lo, hi) for every operand of the flat program's
 * instruction i that writes gradient bytes [lo, hi) (by the bytes the
 * operand touches: an all-reduce or reduce-scatter names the whole block
 * at an offset). */
static void each_gradient_write(const regc_program *p, void (*fn)(void *, int, int64_t, int64_t),
                                void *ctx)
{
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        regc_instr_extent e;
        if (regc_instr_extent_of(in, p->ranks, &e) != REGC_OK)
            continue; /* the compiler's own program: cannot happen */
        for (int k = 0; k < in->n_refs; k++) {
            const int b = in->refs[k].buf;
            if (b >= 0 && p->bufs[b].kind == BUF_GRADS && regc_instr_writes(in, k) && e.bytes[k])
                fn(ctx, i, p->bufs[b].offset + in->refs[k].off,
                   p->bufs[b].offset + in->refs[k].off + e.bytes[k]);
        }
    }
}

typedef struct {
    const int64_t *start;
    int n;
    int *last;
} last_writer_ctx;

static void note_writer(void *ctx, int i, int64_t lo, int64_t hi)
{
    last_writer_ctx *c = ctx;
    for (int j = range_of(c->start, c->n, lo); j < c->n && c->start[j] < hi; j++)
        c->last[j] = i;
}

/* For each range, the last instruction of the flat program that writes a
 * byte of it, or -1, into last[]. */
static void last_writers(const regc_program *p, const int64_t *start, int n, int *last)
{
    for (int j = 0; j < n; j++)
        last[j] = -1;
    last_writer_ctx c = {start, n, last};
    each_gradient_write(p, note_writer, &c);
}

typedef struct {
    int64_t *bound;
    int n, cap;
    int64_t block;
} bounds_ctx;

static void note_bounds(void *ctx, int i, int64_t lo, int64_t hi)
{
    (void)i;
    bounds_ctx *c = ctx;
    if (c->cap < 0)
        return;
    if (c->n + 2 > c->cap) {
        int64_t *b = realloc(c->bound, (size_t)(c->cap = 2 * c->cap + 64) * sizeof *b);
        if (!b) {
            c->cap = -1; /* out of memory: said by the caller */
            return;
        }
        c->bound = b;
    }
    if (lo > 0 && lo < c->block)
        c->bound[c->n++] = lo;
    if (hi > 0 && hi < c->block)
        c->bound[c->n++] = hi;
}

/* The flat program with moved[j] after instruction last[j] (before the
 * first where -1), in range order where several share one, signals
 * numbered from p->n_signals + 1 in the order they start when `signals`;
 * then, with signals, a wait for each in that order. Takes over p->instr. */
static int insert_after(regc_program *p, regc_instr *moved, const int *last, int n, int signals)
{
    regc_instr *out = malloc(((size_t)p->n_instr + 2 * (size_t)n + 1) * sizeof *out);
    if (!out)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    int n_out = 0, signal = p->n_signals;
    for (int i = -1; i < p->n_instr; i++) {
        if (i >= 0)
            out[n_out++] = p->instr[i];
        for (int j = 0; j < n; j++)
            if (last[j] == i) {
                out[n_out] = moved[j];
                out[n_out++].signal = signals ? ++signal : 0;
            }
    }
    /* the queue waits for every collective started before one too */
    for (int i = 0, m = n_out; signals && i < m; i++)
        if (out[i].signal > p->n_signals && out[i].kernel != K_COMM_WAIT) {
            regc_instr w = out[i];
            w.kernel = K_COMM_WAIT, w.d[1] = out[i].kernel, w.accumulate = 0;
            out[n_out++] = w;
        }
    free(p->instr);
    p->instr = out, p->n_instr = n_out, p->n_signals = signal;
    return REGC_OK;
}

int regc_allreduce_schedule(regc_program *p)
{
    int nb = 0;
    for (int i = 0; i < p->n_update; i++)
        nb += p->update[i].kernel == K_ALLREDUCE && !p->update[i].d[1];
    if (nb == 0)
        return REGC_OK;
    regc_instr *bucket = malloc((size_t)nb * sizeof *bucket);
    int64_t *start = malloc((size_t)nb * sizeof *start);
    int *last = malloc((size_t)nb * sizeof *last);
    if (!bucket || !start || !last) {
        free(bucket), free(start), free(last);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    /* the update's buckets, in the block's order, out of the update */
    int k = 0, kept = 0;
    for (int i = 0; i < p->n_update; i++) {
        const regc_instr *u = &p->update[i];
        if (u->kernel == K_ALLREDUCE && !u->d[1]) {
            start[k] = p->bufs[u->refs[0].buf].offset + u->refs[0].off;
            bucket[k++] = *u;
        } else {
            p->update[kept++] = *u;
        }
    }
    p->n_update = kept;
    last_writers(p, start, nb, last);
    int rc = insert_after(p, bucket, last, nb, 1);
    free(bucket), free(start), free(last);
    return rc;
}

int regc_offload_schedule(regc_program *p)
{
    int c = -1; /* the update's copy of the gradients to the host */
    for (int i = 0; i < p->n_update && c < 0; i++)
        if (p->update[i].kernel == K_COPY_D2H &&
            p->bufs[p->update[i].refs[1].buf].kind == BUF_GRADS)
            c = i;
    if (c < 0)
        return REGC_OK;
    const regc_instr whole = p->update[c];
    const int64_t block = whole.d[0];
    /* the ranges: between the bounds of every write of gradients */
    bounds_ctx bc = {.block = block};
    each_gradient_write(p, note_bounds, &bc);
    int64_t *start = bc.cap >= 0 ? realloc(bc.bound, ((size_t)bc.n + 1) * sizeof *start) : NULL;
    if (!start) {
        free(bc.bound);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    int n = bc.n;
    start[n++] = 0;
    qsort(start, (size_t)n, sizeof *start, regc_cmp_i64);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || start[i] != start[m - 1])
            start[m++] = start[i];
    regc_instr *copy = malloc((size_t)m * sizeof *copy);
    int *last = malloc((size_t)m * sizeof *last);
    int rc = REGC_OK;
    if (!copy || !last) {
        rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    } else {
        for (int j = 0; j < m; j++) {
            const int64_t lo = start[j], hi = j + 1 < m ? start[j + 1] : block;
            copy[j] = whole;
            copy[j].refs[0].off += lo, copy[j].refs[1].off += lo;
            copy[j].d[0] = hi - lo;
        }
        last_writers(p, start, m, last);
        if ((rc = insert_after(p, copy, last, m, 0)) == REGC_OK) {
            memmove(&p->update[c], &p->update[c + 1],
                    (size_t)(p->n_update - c - 1) * sizeof *p->update);
            p->n_update--;
        }
    }
    free(start), free(copy), free(last);
    return rc;
}
