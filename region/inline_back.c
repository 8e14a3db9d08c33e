/* inline_back.c — the lazy program stamped out into one flat step, the
 * cross-layer passes over it, and the memory plan of the step's
 * activations.
 *
 * Stamping copies every call's instructions, rebinding each slot to the
 * instance's program buffer (no pass re-runs and nothing is re-tuned); a
 * temporary or saved slot gets a buffer of its own per call. Then the
 * cross-layer passes: the residual add that ends one layer fused with the
 * norm that starts the next, and an embedding backward that accumulates
 * into the gradient its add sums into. Last, one memory plan for every
 * activation of the step (lifetimes over the flat program, greedy by
 * size, in place where an elementwise kernel allows), and a memory-aware
 * order kept only when its plan has the lower peak. A program that stays
 * lazy is planned over lifetimes measured in whole calls. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "region_internal.h"

/* ---------------------------------------------------------------- liveness */

static void touch(regc_program *p, int b, int point)
{
    if (b < 0)
        return;
    regc_buf *x = &p->bufs[b];
    if (x->first < 0)
        x->first = point;
    x->last = point;
}

static void clear_liveness(regc_program *p)
{
    for (int b = 0; b < p->n_bufs; b++)
        p->bufs[b].first = p->bufs[b].last = -1, p->bufs[b].inplace_of = -1;
}

void regc_lazy_each_ref(regc_program *p, void (*fn)(regc_program *p, int buf, int step, void *user),
                        void *user)
{
    for (int i = 0; i < p->n_steps; i++) {
        const lazy_step *s = &p->steps[i];
        if (s->piece < 0) {
            for (int k = 0; k < s->instr.n_refs; k++)
                fn(p, s->instr.refs[k].buf, i, user);
            continue;
        }
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        const regc_instr *ins = s->backward ? r->bwd : r->fwd;
        int n = s->backward ? r->n_bwd : r->n_fwd;
        for (int j = 0; j < n; j++)
            for (int k = 0; k < ins[j].n_refs; k++)
                if (ins[j].refs[k].buf >= 0)
                    fn(p, s->bind[ins[j].refs[k].buf].buf, i, user);
    }
}

static void touch_at(regc_program *p, int b, int step, void *user)
{
    (void)user;
    touch(p, b, step);
}

/* Lifetimes at the granularity of lazy steps. */
static void lazy_liveness(regc_program *p)
{
    clear_liveness(p);
    regc_lazy_each_ref(p, touch_at, NULL);
    touch(p, p->loss.buf, p->n_steps);
}

/* Lifetimes over the flat program, with in-place hints. */
static void flat_liveness(regc_program *p, const regc_instr *ins, int n)
{
    clear_liveness(p);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < ins[i].n_refs; k++)
            touch(p, ins[i].refs[k].buf, i);
    touch(p, p->loss.buf, n);
    for (int i = 0; i < n; i++) {
        int k = regc_instr_inplace_input(&ins[i]);
        if (k < 0)
            continue;
        regc_ref o = ins[i].refs[0], x = ins[i].refs[k];
        if (o.buf < 0 || x.buf < 0 || o.off || x.off || o.buf == x.buf)
            continue;
        regc_buf *bo = &p->bufs[o.buf], *bx = &p->bufs[x.buf];
        if (bo->kind == BUF_ARENA && bx->kind == BUF_ARENA && bo->first == i && bx->last == i &&
            bo->bytes == bx->bytes)
            bo->inplace_of = x.buf;
    }
}

/* Plan the arena over the current lifetimes; peak and lower bound out. */
static int plan_arena(regc_program *p, int n_points, int apply, int64_t *peak, int64_t *lower)
{
    int n = 0, rc = REGC_OK;
    regc_plan_buffer *pb = calloc((size_t)p->n_bufs + 1, sizeof *pb);
    int *which = malloc(((size_t)p->n_bufs + 1) * sizeof *which);
    int *index = malloc(((size_t)p->n_bufs + 1) * sizeof *index);
    int64_t *off = malloc(((size_t)p->n_bufs + 1) * sizeof *off);
    if (!pb || !which || !index || !off) {
        rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        goto done;
    }
    for (int b = 0; b < p->n_bufs; b++) {
        index[b] = -1;
        if (p->bufs[b].kind != BUF_ARENA || p->bufs[b].first < 0)
            continue;
        index[b] = n;
        pb[n] = (regc_plan_buffer){.bytes = p->bufs[b].bytes,
                                   .first = p->bufs[b].first,
                                   .last = p->bufs[b].last,
                                   .inplace_of = -1};
        which[n++] = b;
    }
    for (int j = 0; j < n; j++) {
        int src = p->bufs[which[j]].inplace_of;
        pb[j].inplace_of = src >= 0 ? index[src] : -1;
    }
    regc_plan_result res;
    if ((rc = regc_plan_offsets(n, pb, REGC_PLAN_ALIGN, off, &res)))
        goto done;
    *peak = res.peak_bytes;
    *lower = regc_plan_lower_bound(n, pb, n_points + 1);
    if (apply)
        for (int j = 0; j < n; j++)
            p->bufs[which[j]].offset = off[j];
done:
    free(pb), free(which), free(index), free(off);
    return rc;
}

/* ---------------------------------------------------------------- inline back */

static int stamp(regc_program *p)
{
    int total = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const lazy_step *s = &p->steps[i];
        if (s->piece < 0) {
            total++;
            continue;
        }
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        total += s->backward ? r->n_bwd : r->n_fwd;
    }
    p->instr = malloc(((size_t)total + 1) * sizeof *p->instr);
    int max_slots = 0;
    for (int i = 0; i < p->n_regions; i++)
        max_slots = p->regions[i]->n_slots > max_slots ? p->regions[i]->n_slots : max_slots;
    int *temp = malloc(((size_t)max_slots + 1) * sizeof *temp);
    int **saved = calloc((size_t)p->n_pieces + 1, sizeof *saved);
    int rc = REGC_OK;
    if (!p->instr || !temp || !saved) {
        rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        goto done;
    }
    for (int i = 0; i < p->n_steps && rc == REGC_OK; i++) {
        const lazy_step *s = &p->steps[i];
        if (s->piece < 0) {
            p->instr[p->n_instr++] = s->instr;
            continue;
        }
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        if (!saved[s->piece] &&
            !(saved[s->piece] = malloc(((size_t)r->n_slots + 1) * sizeof(int)))) {
            rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
            break;
        }
        int *sv = saved[s->piece];
        for (int k = 0; k < r->n_slots; k++) {
            temp[k] = -1;
            if (!s->backward)
                sv[k] = -1;
        }
        const regc_instr *ins = s->backward ? r->bwd : r->fwd;
        int n = s->backward ? r->n_bwd : r->n_fwd;
        for (int j = 0; j < n && rc == REGC_OK; j++) {
            regc_instr x = ins[j];
            for (int k = 0; k < x.n_refs && rc == REGC_OK; k++) {
                int sl = x.refs[k].buf;
                if (sl < 0)
                    continue;
                const regc_slot *slot = &r->slots[sl];
                int *own = slot->kind == SLOT_TEMP    ? &temp[sl]
                           : slot->kind == SLOT_SAVED ? &sv[sl]
                                                      : NULL;
                if (own) {
                    if (*own < 0 && (*own = regc_program_new_buf(p, BUF_ARENA, slot->bytes, 0)) < 0)
                        rc = *own;
                    x.refs[k].buf = *own;
                } else {
                    x.refs[k].buf = s->bind[sl].buf;
                    x.refs[k].off += s->bind[sl].off;
                }
            }
            p->instr[p->n_instr++] = x;
        }
    }
done:
    for (int i = 0; saved && i < p->n_pieces; i++)
        free(saved[i]);
    free(saved), free(temp);
    return rc;
}

/* Buffer hazards of the flat program, for the memory-aware order. */
static int reorder(regc_program *p, int64_t *peak, int64_t *lower)
{
    int n = p->n_instr, rc = REGC_OK;
    int *rs = malloc(((size_t)n + 1) * sizeof *rs), *ws = malloc(((size_t)n + 1) * sizeof *ws);
    int *rd = malloc(((size_t)n * REGC_INSTR_MAX_REFS + 1) * sizeof *rd);
    int *wr = malloc(((size_t)n * REGC_INSTR_MAX_REFS + 1) * sizeof *wr);
    int64_t *bytes = malloc(((size_t)p->n_bufs + 1) * sizeof *bytes);
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    regc_instr *alt = malloc(((size_t)n + 1) * sizeof *alt);
    if (!rs || !ws || !rd || !wr || !bytes || !order || !alt) {
        rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        goto done;
    }
    int nr = 0, nw = 0;
    for (int i = 0; i < n; i++) {
        rs[i] = nr, ws[i] = nw;
        for (int k = 0; k < p->instr[i].n_refs; k++) {
            int b = p->instr[i].refs[k].buf;
            if (b < 0)
                continue;
            if (regc_instr_writes(&p->instr[i], k))
                wr[nw++] = b;
            else
                rd[nr++] = b;
        }
    }
    rs[n] = nr, ws[n] = nw;
    for (int b = 0; b < p->n_bufs; b++)
        bytes[b] = p->bufs[b].kind == BUF_ARENA ? p->bufs[b].bytes : 0;
    /* the loss is read after the program: a final reader keeps it */
    if ((rc = regc_plan_order(n, rs, rd, ws, wr, p->n_bufs, bytes, order)))
        goto done;
    for (int i = 0; i < n; i++)
        alt[i] = p->instr[order[i]];
    flat_liveness(p, alt, n);
    int64_t alt_peak, alt_lower;
    if ((rc = plan_arena(p, n, 0, &alt_peak, &alt_lower)))
        goto done;
    if (alt_peak < *peak) {
        memcpy(p->instr, alt, (size_t)n * sizeof *alt);
        *peak = alt_peak, *lower = alt_lower;
        p->reordered = 1;
    }
    flat_liveness(p, p->instr, n);
    rc = plan_arena(p, n, 1, peak, lower);
done:
    free(rs), free(ws), free(rd), free(wr), free(bytes), free(order), free(alt);
    return rc;
}

int regc_program_inline_back(regc_program *p)
{
    int rc = stamp(p);
    if (rc)
        return rc;
    p->fused_pairs = regc_fuse_add_norm(p->instr, &p->n_instr);
    regc_fuse_embed_bwd_add(p->instr, &p->n_instr, p->bufs);
    flat_liveness(p, p->instr, p->n_instr);
    int64_t peak, lower;
    if ((rc = plan_arena(p, p->n_instr, 1, &peak, &lower)))
        return rc;
    if ((rc = reorder(p, &peak, &lower)))
        return rc;
    /* ZeRO-3's schedule on the final order (the reorder must not undo
     * prefetch), then the plan again over the longer lifetimes it makes */
    if (p->layout && (p->prefetch_floats != 0 || p->overlap)) {
        if ((rc = regc_zero3_schedule(p, p->prefetch_floats, p->max_live_floats,
                                      p->reduce_bucket_floats, p->overlap)))
            return rc;
        flat_liveness(p, p->instr, p->n_instr);
        if ((rc = plan_arena(p, p->n_instr, 1, &peak, &lower)))
            return rc;
    }
    /* saved activations to the host and back, then the plan again over
     * the lifetimes that leaves */
    if (p->offload_activation) {
        if ((rc = regc_offload_activations(p)))
            return rc;
        flat_liveness(p, p->instr, p->n_instr);
        if ((rc = plan_arena(p, p->n_instr, 1, &peak, &lower)))
            return rc;
    }
    /* stage 0's all-reduces into the backward; each rank's gradients of
     * several micro-batches are summed before theirs, so not then */
    if (!p->layout && p->ranks > 1 && p->overlap && !p->accumulate_grads &&
        (rc = regc_allreduce_schedule(p)))
        return rc;
    if (p->offload && p->overlap && !p->accumulate_grads && (rc = regc_offload_schedule(p)))
        return rc;
    flat_liveness(p, p->instr, p->n_instr); /* the points moved; the arena's bytes did not */
    p->arena_bytes = peak, p->lower_bound = lower;
    return REGC_OK;
}

int regc_program_plan_lazy(regc_program *p)
{
    lazy_liveness(p);
    int64_t peak = 0, lower = 0;
    int rc = p->level == REGC_LEVEL_O0 ? regc_offload_lazy(p)
                                       : plan_arena(p, p->n_steps, 1, &peak, &lower);
    p->arena_bytes = peak, p->lower_bound = lower;
    return rc;
}
