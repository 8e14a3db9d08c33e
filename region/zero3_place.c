/* zero3_place.c — ZeRO-3 in the step program: where each unit's parameters
 * are gathered from the ranks' shards and where its gradients go back.
 *
 * The pass rewrites the lazy program (prologue · CALL … · epilogue and the
 * reverse), which inline back then stamps into the flat step:
 *  - before a step that reads a unit's parameters, unless the unit is
 *    already gathered in this pass (forward or backward), an all-gather of
 *    its shards into a fresh arena buffer; the step reads the parameters
 *    there. A gathered buffer is an ordinary arena buffer: its lifetime
 *    ends at its last reader, and the memory plan reuses it (release);
 *  - the first step that touches a unit's gradients gets a zeroed arena
 *    buffer for the whole unit (padding included), and after the last step
 *    that writes them, a reduce-scatter sums every rank's buffer into this
 *    rank's gradient shard (adding into it when micro-batches accumulate).
 * A unit kept resident (p->resident, p->frozen_resident: persistent, or a
 * memory budget's choice) keeps its forward buffer through the backward
 * instead of being gathered again.
 * The frozen parameters (a LoRA model's base) are sharded too, in a layout
 * of their own (p->frozen_layout) counted in 4-byte words of the bytes they
 * are held in (fp32, bf16 or NF4): each unit gathered as bytes before its
 * readers, forward and backward, and nothing ever reduce-scattered.
 * Gathering right before each use is the reference that a scheduled
 * program (prefetch, resident units) must reproduce bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

typedef struct {
    regc_program *p;
    const regc_shard_layout *l;
    const regc_shard_layout *fl; /* the frozen parameters' (NULL: none) */
    int *param_of;  /* [n_bufs] the parameter a per-parameter buffer holds (values or grads), -1 */
    int *frozen_of; /* [n_bufs] the frozen parameter a frozen buffer holds, -1 */
    int *fgathered; /* [fl's n_units] this pass's gathered frozen unit, -1 */
    int shard_frozen;
    int *gathered;   /* [n_units] this pass's gathered buffer, -1 */
    char *unit_bf16; /* [n_units] gathered in bf16 (its readers' slots are) */
    int *grads;      /* [n_units] the unit's gradient buffer, -1 */
    int *last_grad;  /* [n_units] the last step touching its gradients */
    int shard_params, shard_grads;
    lazy_step *out;
    int n_out, cap_out;
} placer;

static lazy_step *emit(placer *z)
{
    if (z->n_out == z->cap_out) {
        int cap = z->cap_out ? 2 * z->cap_out : 256;
        lazy_step *s = realloc(z->out, (size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        z->out = s, z->cap_out = cap;
    }
    lazy_step *s = &z->out[z->n_out++];
    memset(s, 0, sizeof *s);
    s->piece = -1;
    return s;
}

static int emit_instr(placer *z, regc_instr in)
{
    lazy_step *s = emit(z);
    if (!s)
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    in.node = -1;
    s->instr = in;
    return REGC_OK;
}

/* The parameter of layout l at byte `offset` of its block, or -1: model
 * order is offset order, so a binary search finds it. */
static int param_at(const regc_shard_layout *l, int64_t offset)
{
    int lo = 0, hi = l->n_params - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->model_offset[mid] * (int64_t)sizeof(float) <= offset)
            lo = mid;
        else
            hi = mid - 1;
    }
    return l->n_params > 0 && l->model_offset[lo] * (int64_t)sizeof(float) == offset ? lo : -1;
}

/* The parameter buffers of the lazy program, by the offsets they were
 * given in the model's block (the frozen ones in the frozen block). */
static int map_buffers(placer *z)
{
    regc_program *p = z->p;
    for (int b = 0; b < p->n_bufs; b++) {
        regc_buf *x = &p->bufs[b];
        z->param_of[b] = z->frozen_of[b] = -1;
        int *of = x->kind == BUF_PARAMS || x->kind == BUF_GRADS ? &z->param_of[b]
                  : x->kind == BUF_FROZEN && z->fl              ? &z->frozen_of[b]
                                                                : NULL;
        if (of && (*of = param_at(of == &z->param_of[b] ? z->l : z->fl, x->offset)) < 0)
            return regc_error(REGC_ERR_ARG, "zero3: buffer %d at byte %lld is no parameter", b,
                              (long long)x->offset);
    }
    return REGC_OK;
}

/* The refs of step s, in place: `visit` sees each that the step's
 * instructions name and may rewrite it. A call's slot that its pass never
 * names (an embedding table in the backward, which reads only the ids) is
 * unbound instead: nothing is gathered for it. */
static int visit_refs(placer *z, lazy_step *s, int step,
                      int (*visit)(placer *z, regc_ref *ref, int step, int bf16))
{
    int rc = REGC_OK;
    if (s->piece < 0) {
        for (int k = 0; k < s->instr.n_refs && rc == REGC_OK; k++)
            if (s->instr.refs[k].buf >= 0)
                rc = visit(z, &s->instr.refs[k], step, regc_instr_ref_bf16(&s->instr, k));
        return rc;
    }
    const regc_compiled_region *r = z->p->regions[z->p->pieces[s->piece].region];
    const regc_instr *ins = s->backward ? r->bwd : r->fwd;
    int n = s->backward ? r->n_bwd : r->n_fwd;
    char *named = calloc((size_t)r->n_slots + 1, 1);
    if (!named)
        return regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    for (int j = 0; j < n; j++)
        for (int k = 0; k < ins[j].n_refs; k++)
            if (ins[j].refs[k].buf >= 0)
                named[ins[j].refs[k].buf] = 1;
    /* a view's slot names the slot it views */
    for (int k = 0; k < r->n_slots; k++)
        for (int a = k; named[k] && r->slots[a].alias >= 0; a = r->slots[a].alias)
            named[r->slots[a].alias] = 1;
    for (int k = 0; k < r->n_slots && rc == REGC_OK; k++) {
        if (s->bind[k].buf < 0)
            continue;
        if (named[k])
            rc = visit(z, &s->bind[k], step, r->slots[k].bf16);
        else if (z->param_of[s->bind[k].buf] >= 0 || z->frozen_of[s->bind[k].buf] >= 0)
            s->bind[k] = (regc_ref){REGC_REF_NONE, 0};
    }
    free(named);
    return rc;
}

/* A frozen parameter's ref moves into its unit's gathered buffer, emitting
 * the all-gather of the unit's bytes (as 4-byte words, converted nowhere:
 * a bf16 or NF4 parameter arrives as it is held). */
static int place_frozen(placer *z, regc_ref *ref)
{
    const regc_shard_layout *l = z->fl;
    const int i = z->frozen_of[ref->buf], u = l->param_unit[i];
    const int64_t word = (int64_t)sizeof(float);
    int *own = &z->fgathered[u];
    if (*own < 0) {
        if ((*own = regc_program_new_buf(z->p, BUF_ARENA, l->unit_padded[u] * word, 0)) < 0)
            return *own;
        int rc = emit_instr(
            z, (regc_instr){.kernel = K_ALLGATHER,
                            .n_refs = 2,
                            .n_out = 1,
                            .refs = {{*own, 0}, {z->shard_frozen, l->shard_offset[u] * word}},
                            .d = {l->unit_shard[u]}});
        if (rc)
            return rc;
    }
    ref->buf = *own;
    ref->off += l->param_offset[i] * word;
    return REGC_OK;
}

static int note_grads(placer *z, regc_ref *ref, int step, int bf16)
{
    (void)bf16;
    int i = z->param_of[ref->buf];
    if (i >= 0 && z->p->bufs[ref->buf].kind == BUF_GRADS)
        z->last_grad[z->l->param_unit[i]] = step;
    return REGC_OK;
}

/* A parameter or gradient ref moves into its unit's gathered or gradient
 * buffer, emitting the all-gather or the zero fill that makes it. bf16:
 * the ref is to a slot held in bf16, a parameter gathered in bf16 (its
 * all-gather rounds this rank's shard to bf16 as it sends it). */
static int place_ref(placer *z, regc_ref *ref, int step, int bf16)
{
    (void)step;
    regc_program *p = z->p;
    const regc_shard_layout *l = z->l;
    if (z->frozen_of[ref->buf] >= 0)
        return place_frozen(z, ref);
    int i = z->param_of[ref->buf];
    if (i < 0)
        return REGC_OK;
    int u = l->param_unit[i], grads = p->bufs[ref->buf].kind == BUF_GRADS;
    const int64_t elem = bf16 ? 2 : (int64_t)sizeof(float); /* bytes of a gathered value */
    int64_t bytes = l->unit_padded[u] * elem;
    int *own = grads ? &z->grads[u] : &z->gathered[u];
    if (*own >= 0 && !grads && z->unit_bf16[u] != bf16)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "zero3: unit %d is read in bf16 and in fp32 (parameter %d)", u, i);
    if (*own < 0) {
        if (!grads)
            z->unit_bf16[u] = (char)bf16;
        if ((*own = regc_program_new_buf(p, BUF_ARENA, bytes, 0)) < 0)
            return *own;
        int rc;
        if (grads)
            rc = emit_instr(z, (regc_instr){.kernel = K_FILL,
                                            .n_refs = 1,
                                            .n_out = 1,
                                            .refs = {{*own, 0}},
                                            .d = {l->unit_padded[u]}});
        else
            rc = emit_instr(z, (regc_instr){.kernel = K_ALLGATHER,
                                            .n_refs = 2,
                                            .n_out = 1,
                                            .bf16_refs = (uint16_t)(bf16 ? 1 : 0),
                                            .refs = {{*own, 0},
                                                     {z->shard_params,
                                                      l->shard_offset[u] * (int64_t)sizeof(float)}},
                                            .d = {l->unit_shard[u]}});
        if (rc)
            return rc;
    }
    ref->buf = *own;
    ref->off = (bf16 ? ref->off / 2 : ref->off) + l->param_offset[i] * elem;
    return REGC_OK;
}

/* ---------------------------------------------------------------- units */

typedef struct {
    int64_t offset; /* bytes into the model's block */
    int tensor;
} param_at_offset;

static int cmp_param_at(const void *a, const void *b)
{
    const param_at_offset *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Units in execution order: a piece's unit is the parameters it reads that
 * no earlier piece read, so a parameter two pieces share (GPT-2's tied
 * embedding) is gathered with the first. Under bf16 (held_param, else
 * NULL) the piece's parameters gathered in bf16 are a unit of their own,
 * after the rest: a unit is gathered in one precision. The trained
 * parameters (frozen 0) are laid out in floats; the frozen ones (frozen 1)
 * in 4-byte words of their bytes in the frozen block, each padded to 64
 * bytes as the block pads them. *out: NULL when there is no such
 * parameter (frozen 1). */
static int layout_of(const regc_program *p, const int64_t *param_offset, const char *held_param,
                     int frozen, regc_shard_layout **out)
{
    const regc_graph *g = p->graph;
    int n_t = regc_graph_n_tensors(g), n_params = 0;
    int *unit = malloc(((size_t)n_t + 1) * sizeof *unit);
    param_at_offset *order = malloc(((size_t)n_t + 1) * sizeof *order);
    int64_t *numel = malloc(((size_t)n_t + 1) * sizeof *numel);
    int64_t *model_offset = malloc(((size_t)n_t + 1) * sizeof *model_offset);
    int *unit_of = malloc(((size_t)n_t + 1) * sizeof *unit_of);
    int rc = REGC_OK;
    *out = NULL;
    if (!unit || !order || !numel || !model_offset || !unit_of) {
        rc = regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
        goto done;
    }
    for (int t = 0; t < n_t; t++)
        unit[t] = -1;
    int n_units = 0;
    for (int i = 0; i < p->n_pieces; i++) {
        const piece *pc = &p->pieces[i];
        for (int half = 0; half < 2; half++) { /* fp32, then bf16 */
            int fresh = 0;
            for (int k = 0; k < p->regions[pc->region]->n_in; k++) {
                int t = pc->in[k];
                const regc_tensor *x = regc_graph_tensor(g, t);
                if (x->role == REGC_ROLE_PARAM && !x->frozen == !frozen && unit[t] < 0 &&
                    (!frozen && held_param && held_param[t]) == half)
                    unit[t] = n_units, fresh = 1;
            }
            n_units += fresh;
        }
    }
    /* parameters nothing reads: a unit of their own, never gathered */
    int unread = 0;
    for (int t = 0; t < n_t; t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role != REGC_ROLE_PARAM || !x->frozen != !frozen)
            continue;
        if (unit[t] < 0)
            unit[t] = n_units, unread = 1;
        order[n_params++] = (param_at_offset){param_offset[t], t};
    }
    n_units += unread;
    /* the model's order is its block's */
    qsort(order, (size_t)n_params, sizeof *order, cmp_param_at);
    for (int i = 0; i < n_params; i++) {
        const regc_tensor *x = regc_graph_tensor(g, order[i].tensor);
        numel[i] = frozen ? ((regc_frozen_bytes(x) + 63) & ~INT64_C(63)) / (int64_t)sizeof(float)
                          : regc_tensor_numel(x);
        model_offset[i] = order[i].offset / (int64_t)sizeof(float);
        unit_of[i] = unit[order[i].tensor];
    }
    if (!frozen || n_params > 0)
        rc = regc_shard_layout_new(p->ranks, n_params, numel, model_offset, unit_of, n_units, out);
done:
    free(unit), free(order), free(numel), free(model_offset), free(unit_of);
    return rc;
}

int regc_zero3_layout(regc_program *p, const int64_t *param_offset, const char *held_param)
{
    int rc = layout_of(p, param_offset, held_param, 0, &p->layout);
    return rc ? rc : layout_of(p, param_offset, held_param, 1, &p->frozen_layout);
}

/* ---------------------------------------------------------------- placement */

int regc_zero3_place(regc_program *p)
{
    const regc_shard_layout *l = p->layout, *fl = p->frozen_layout;
    placer z = {.p = p, .l = l, .fl = fl};
    const int n_bufs = p->n_bufs; /* before the pass adds its own */
    const int n_frozen_units = fl ? fl->n_units : 0;
    z.param_of = malloc(((size_t)p->n_bufs + 1) * sizeof *z.param_of);
    z.frozen_of = malloc(((size_t)p->n_bufs + 1) * sizeof *z.frozen_of);
    z.fgathered = malloc(((size_t)n_frozen_units + 1) * sizeof(int));
    z.gathered = malloc(((size_t)l->n_units + 1) * sizeof(int));
    z.unit_bf16 = calloc((size_t)l->n_units + 1, 1);
    z.grads = malloc(((size_t)l->n_units + 1) * sizeof(int));
    z.last_grad = malloc(((size_t)l->n_units + 1) * sizeof(int));
    int rc = REGC_OK;
    if (!z.param_of || !z.frozen_of || !z.fgathered || !z.gathered || !z.unit_bf16 || !z.grads ||
        !z.last_grad)
        rc = regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
    for (int u = 0; rc == REGC_OK && u < l->n_units; u++)
        z.gathered[u] = z.grads[u] = z.last_grad[u] = -1;
    for (int u = 0; rc == REGC_OK && u < n_frozen_units; u++)
        z.fgathered[u] = -1;
    if (rc == REGC_OK)
        rc = map_buffers(&z);
    /* this rank's shard of the frozen block */
    if (rc == REGC_OK && fl &&
        (z.shard_frozen =
             regc_program_new_buf(p, BUF_FROZEN, fl->shard_floats * (int64_t)sizeof(float), 0)) < 0)
        rc = z.shard_frozen;
    /* this rank's shard blocks, as the collectives address them */
    int64_t shard_bytes = l->shard_floats * (int64_t)sizeof(float);
    if (rc == REGC_OK && (z.shard_params = regc_program_new_buf(p, BUF_PARAMS, shard_bytes, 0)) < 0)
        rc = z.shard_params;
    if (rc == REGC_OK && (z.shard_grads = regc_program_new_buf(p, BUF_GRADS, shard_bytes, 0)) < 0)
        rc = z.shard_grads;
    for (int i = 0; i < p->n_steps && rc == REGC_OK; i++)
        rc = visit_refs(&z, &p->steps[i], i, note_grads);
    int in_backward = 0;
    for (int i = 0; i < p->n_steps && rc == REGC_OK; i++) {
        lazy_step *s = &p->steps[i];
        if (!in_backward && s->piece >= 0 && s->backward) {
            /* backward gathers afresh: the forward's buffers are released,
             * but for the units kept resident */
            in_backward = 1;
            for (int u = 0; u < l->n_units; u++)
                if (!p->resident || !p->resident[u])
                    z.gathered[u] = -1;
            for (int u = 0; u < n_frozen_units; u++)
                if (!p->frozen_resident || !p->frozen_resident[u])
                    z.fgathered[u] = -1;
        }
        if ((rc = visit_refs(&z, s, i, place_ref)))
            break;
        lazy_step *o = emit(&z);
        if (!o) {
            rc = regc_error(REGC_ERR_MEMORY, "zero3: out of memory");
            break;
        }
        *o = *s;
        for (int u = 0; u < l->n_units && rc == REGC_OK; u++)
            if (z.last_grad[u] == i)
                rc = emit_instr(
                    &z, (regc_instr){
                            .kernel = K_REDUCE_SCATTER,
                            .n_refs = 2,
                            .n_out = 1,
                            .accumulate = p->accumulate_grads,
                            .refs = {{z.shard_grads, l->shard_offset[u] * (int64_t)sizeof(float)},
                                     {z.grads[u], 0}},
                            .d = {l->unit_shard[u]}});
    }
    if (rc == REGC_OK) {
        free(p->steps); /* the binds moved into z.out */
        p->steps = z.out, p->n_steps = z.n_out;
        z.out = NULL;
        /* the per-parameter buffers no step names any more */
        for (int b = 0; b < n_bufs; b++)
            if (z.param_of[b] >= 0 || z.frozen_of[b] >= 0)
                p->bufs[b] = regc_buf_unplanned(BUF_ARENA, 0, 0);
    } else {
        for (int i = 0; i < z.n_out; i++)
            if (z.out[i].piece >= 0)
                z.out[i].bind = NULL; /* still owned by p->steps */
        free(z.out);
    }
    free(z.param_of), free(z.frozen_of), free(z.fgathered), free(z.gathered), free(z.unit_bf16);
    free(z.grads), free(z.last_grad);
    return rc;
}
