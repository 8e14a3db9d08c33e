/* program.c — the step program: lazy inline, inline back, the global
 * memory plan, and running it.
 *
 * Lazy inline: the step is prologue · CALL(kind, instance) … · epilogue and
 * the reverse for backward; a call binds one instance's program values
 * (its inputs, outputs, gradients, parameters) to the compiled region's
 * slots, so a kind is compiled once however many instances it has.
 * Inline back stamps every call out into one flat instruction list by
 * rebinding (no pass re-runs), then runs the cross-layer passes: the
 * residual add that ends one layer fused with the norm that starts the
 * next, one memory plan for every activation of the step, and a
 * memory-aware order kept when it lowers the peak. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "region_internal.h"

#define ARENA_ALIGN 64

static int new_buf(regc_program *p, regc_buf_kind kind, int64_t bytes, int64_t offset)
{
    if (p->n_bufs == p->cap_bufs) {
        int cap = p->cap_bufs ? 2 * p->cap_bufs : 256;
        regc_buf *b = realloc(p->bufs, (size_t)cap * sizeof *b);
        if (!b)
            return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        p->bufs = b, p->cap_bufs = cap;
    }
    p->bufs[p->n_bufs] = (regc_buf){.kind = kind, .bytes = bytes, .offset = offset,
                                    .first = -1, .last = -1, .inplace_of = -1};
    return p->n_bufs++;
}

void regc_program_free(regc_program *p)
{
    if (!p)
        return;
    if (p->be && p->arena)
        p->be->free(p->be, p->arena);
    if (p->be && p->lazy && p->level == REGC_LEVEL_O0 && p->ptr)
        for (int b = 0; b < p->n_bufs; b++)
            if (p->bufs[b].kind == BUF_ARENA && p->ptr[b])
                p->be->free(p->be, p->ptr[b]);
    for (int i = 0; i < p->n_regions; i++)
        regc_compiled_region_free(p->regions[i]);
    free(p->regions);
    for (int i = 0; i < p->n_pieces; i++)
        free(p->pieces[i].in), free(p->pieces[i].out);
    free(p->pieces);
    for (int i = 0; i < p->n_steps; i++)
        free(p->steps[i].bind);
    free(p->steps), free(p->instr), free(p->bufs), free(p->inputs), free(p->ptr);
    regc_graph_free(p->graph);
    free(p);
}

/* ---------------------------------------------------------------- lazy program */

typedef struct {
    regc_program *p;
    const regc_graph *g;
    int *val;        /* [n_tensors] buffer of each graph tensor's value, -1 none */
    int *grad;       /* [n_tensors] buffer of its gradient so far, -1 none */
    int *param_grad; /* [n_tensors] the parameter's gradient buffer, -1 not a parameter */
    int cap_steps;
} lazy_ctx;

static lazy_step *add_step(lazy_ctx *c)
{
    regc_program *p = c->p;
    if (p->n_steps == c->cap_steps) {
        int cap = c->cap_steps ? 2 * c->cap_steps : 64;
        lazy_step *s = realloc(p->steps, (size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        p->steps = s, c->cap_steps = cap;
    }
    lazy_step *s = &p->steps[p->n_steps++];
    memset(s, 0, sizeof *s);
    s->piece = -1;
    return s;
}

/* A program-level fill of buffer b (a missing gradient starts at zero; the
 * loss's gradient is one). */
static int add_fill(lazy_ctx *c, int b, float value)
{
    lazy_step *s = add_step(c);
    if (!s)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    s->instr = (regc_instr){.kernel = K_FILL, .n_refs = 1, .n_out = 1, .f = value, .node = -1};
    s->instr.refs[0] = (regc_ref){b, 0};
    s->instr.d[0] = c->p->bufs[b].bytes / 4;
    return REGC_OK;
}

static int grad_buf_for(lazy_ctx *c, int t, int *rc)
{
    if (c->param_grad[t] >= 0)
        return c->param_grad[t];
    const regc_tensor *x = regc_graph_tensor(c->g, t);
    int b = new_buf(c->p, BUF_ARENA, regc_tensor_bytes(x), 0);
    if (b < 0)
        *rc = b;
    return b;
}

static int add_call(lazy_ctx *c, int pi, int backward)
{
    regc_program *p = c->p;
    piece *pc = &p->pieces[pi];
    regc_compiled_region *r = p->regions[pc->region];
    int rc = REGC_OK;
    regc_ref *bind = malloc(((size_t)r->n_slots + 1) * sizeof *bind);
    if (!bind)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    int scratch = new_buf(p, BUF_ARENA, r->scratch_bytes, 0);
    if (scratch < 0) {
        free(bind);
        return scratch;
    }
    /* gradients first: a missing one is filled before the call */
    int *din_buf = NULL;
    if (backward) {
        din_buf = malloc(((size_t)r->n_in + 1) * sizeof *din_buf);
        if (!din_buf) {
            free(bind);
            return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        }
        for (int k = 0; k < r->n_out && rc == REGC_OK; k++)
            if (r->dout_slot[k] >= 0 && c->grad[pc->out[k]] < 0) {
                c->grad[pc->out[k]] = grad_buf_for(c, pc->out[k], &rc);
                if (rc == REGC_OK)
                    rc = add_fill(c, c->grad[pc->out[k]], 0.0f);
            }
        for (int k = 0; k < r->n_in && rc == REGC_OK; k++) {
            if (r->seed_slot[k] >= 0 && c->grad[pc->in[k]] < 0) {
                c->grad[pc->in[k]] = grad_buf_for(c, pc->in[k], &rc);
                if (rc == REGC_OK)
                    rc = add_fill(c, c->grad[pc->in[k]], 0.0f);
            }
            din_buf[k] = r->din_slot[k] >= 0 && rc == REGC_OK ? grad_buf_for(c, pc->in[k], &rc) : -1;
        }
    }
    for (int s = 0; s < r->n_slots && rc == REGC_OK; s++) {
        const regc_slot *sl = &r->slots[s];
        regc_ref ref = {REGC_REF_NONE, 0};
        switch (sl->kind) {
        case SLOT_IN: ref.buf = c->val[pc->in[sl->index]]; break;
        case SLOT_OUT: ref.buf = c->val[pc->out[sl->index]]; break;
        case SLOT_DOUT: if (backward) ref.buf = c->grad[pc->out[sl->index]]; break;
        case SLOT_SEED: if (backward) ref.buf = c->grad[pc->in[sl->index]]; break;
        case SLOT_DIN: if (backward) ref.buf = din_buf[sl->index]; break;
        case SLOT_SAVED: ref = (regc_ref){pc->saved_buf, sl->offset}; break;
        case SLOT_TEMP: ref = (regc_ref){scratch, sl->offset}; break;
        }
        bind[s] = ref;
    }
    if (backward)
        for (int k = 0; k < r->n_in; k++)
            if (din_buf[k] >= 0)
                c->grad[pc->in[k]] = din_buf[k];
    free(din_buf);
    lazy_step *st = rc == REGC_OK ? add_step(c) : NULL;
    if (!st) {
        free(bind);
        return rc ? rc : regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    st->piece = pi, st->backward = backward, st->bind = bind;
    return REGC_OK;
}

/* Values of graph tensors: inputs, parameters (at their offsets in the
 * blocks), and one buffer per activation that crosses pieces. */
static int make_values(lazy_ctx *c, const int64_t *param_offset)
{
    regc_program *p = c->p;
    const regc_graph *g = c->g;
    int n_t = regc_graph_n_tensors(g);
    for (int t = 0; t < n_t; t++)
        c->val[t] = c->grad[t] = c->param_grad[t] = -1;
    for (int t = 0, k = 0; t < n_t; t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        int64_t bytes = regc_tensor_bytes(x);
        if (x->role == REGC_ROLE_INPUT) {
            p->inputs[k] = t;
            c->val[t] = new_buf(p, BUF_INPUT, bytes, k++);
        } else if (x->role == REGC_ROLE_PARAM) {
            c->val[t] = new_buf(p, BUF_PARAMS, bytes, param_offset[t]);
            c->param_grad[t] = new_buf(p, BUF_GRADS, bytes, param_offset[t]);
        }
        if (c->val[t] < 0 && x->role != REGC_ROLE_ACT)
            return c->val[t];
    }
    for (int i = 0; i < p->n_pieces; i++) {
        piece *pc = &p->pieces[i];
        const regc_compiled_region *r = p->regions[pc->region];
        for (int k = 0; k < r->n_out; k++) {
            const regc_tensor *x = regc_graph_tensor(g, pc->out[k]);
            if ((c->val[pc->out[k]] = new_buf(p, BUF_ARENA, regc_tensor_bytes(x), 0)) < 0)
                return c->val[pc->out[k]];
        }
        if ((pc->saved_buf = new_buf(p, BUF_ARENA, r->saved_bytes, 0)) < 0)
            return pc->saved_buf;
    }
    return REGC_OK;
}

static int build_lazy(regc_program *p, const int64_t *param_offset)
{
    int n_t = regc_graph_n_tensors(p->graph);
    lazy_ctx c = {.p = p, .g = p->graph};
    c.val = malloc(((size_t)n_t + 1) * sizeof(int));
    c.grad = malloc(((size_t)n_t + 1) * sizeof(int));
    c.param_grad = malloc(((size_t)n_t + 1) * sizeof(int));
    int rc = REGC_OK;
    if (!c.val || !c.grad || !c.param_grad)
        rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    if (rc == REGC_OK)
        rc = make_values(&c, param_offset);
    for (int i = 0; i < p->n_pieces && rc == REGC_OK; i++)
        rc = add_call(&c, i, 0);
    int loss = regc_graph_output(p->graph, 0);
    if (rc == REGC_OK) {
        p->loss = (regc_ref){c.val[loss], 0};
        c.grad[loss] = grad_buf_for(&c, loss, &rc);
        if (rc == REGC_OK)
            rc = add_fill(&c, c.grad[loss], 1.0f);
    }
    for (int i = p->n_pieces - 1; i >= 0 && rc == REGC_OK; i--)
        rc = add_call(&c, i, 1);
    free(c.val), free(c.grad), free(c.param_grad);
    return rc;
}

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

/* Lifetimes at the granularity of lazy steps. */
static void lazy_liveness(regc_program *p)
{
    clear_liveness(p);
    for (int i = 0; i < p->n_steps; i++) {
        const lazy_step *s = &p->steps[i];
        if (s->piece < 0) {
            touch(p, s->instr.refs[0].buf, i);
            continue;
        }
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        const regc_instr *ins = s->backward ? r->bwd : r->fwd;
        int n = s->backward ? r->n_bwd : r->n_fwd;
        for (int j = 0; j < n; j++)
            for (int k = 0; k < ins[j].n_refs; k++)
                if (ins[j].refs[k].buf >= 0)
                    touch(p, s->bind[ins[j].refs[k].buf].buf, i);
    }
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
        pb[n] = (regc_plan_buffer){.bytes = p->bufs[b].bytes, .first = p->bufs[b].first,
                                   .last = p->bufs[b].last, .inplace_of = -1};
        which[n++] = b;
    }
    for (int j = 0; j < n; j++) {
        int src = p->bufs[which[j]].inplace_of;
        pb[j].inplace_of = src >= 0 ? index[src] : -1;
    }
    regc_plan_result res;
    if ((rc = regc_plan_offsets(n, pb, ARENA_ALIGN, off, &res)))
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
        if (!saved[s->piece] && !(saved[s->piece] = malloc(((size_t)r->n_slots + 1) * sizeof(int)))) {
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
                int *own = slot->kind == SLOT_TEMP ? &temp[sl] : slot->kind == SLOT_SAVED ? &sv[sl] : NULL;
                if (own) {
                    if (*own < 0 && (*own = new_buf(p, BUF_ARENA, slot->bytes, 0)) < 0)
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

static int inline_back(regc_program *p)
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
    p->arena_bytes = peak, p->lower_bound = lower;
    return REGC_OK;
}

/* ---------------------------------------------------------------- building */

/* Fill the program's pieces from regions already compiled. */
int regc_program_link(regc_program *p, const int64_t *param_offset, int inline_flat,
                      regc_compile_stats *st)
{
    p->lazy = !inline_flat;
    int rc = build_lazy(p, param_offset);
    if (rc)
        return rc;
    if (inline_flat) {
        if ((rc = inline_back(p)))
            return rc;
    } else {
        lazy_liveness(p);
        int64_t peak = 0, lower = 0;
        if (p->level != REGC_LEVEL_O0 && (rc = plan_arena(p, p->n_steps, 1, &peak, &lower)))
            return rc;
        p->arena_bytes = peak, p->lower_bound = lower;
    }
    if (st) {
        st->add_norm_fusions = p->fused_pairs;
        st->peak_bytes = p->arena_bytes;
        st->lower_bound_bytes = p->lower_bound;
        st->memory_aware_order = p->reordered;
        int64_t n = 0;
        if (inline_flat)
            n = p->n_instr;
        else
            for (int i = 0; i < p->n_steps; i++) {
                const lazy_step *s = &p->steps[i];
                const regc_compiled_region *r = s->piece < 0 ? NULL : p->regions[p->pieces[s->piece].region];
                n += !r ? 1 : s->backward ? r->n_bwd : r->n_fwd;
            }
        st->n_instructions = n;
    }
    return REGC_OK;
}

regc_program *regc_program_new(regc_graph *g, regc_level level)
{
    regc_program *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->graph = g;
    p->level = level;
    int n = 0;
    for (int t = 0; t < regc_graph_n_tensors(g); t++)
        n += regc_graph_tensor(g, t)->role == REGC_ROLE_INPUT;
    p->n_inputs = n;
    if (!(p->inputs = malloc(((size_t)n + 1) * sizeof *p->inputs))) {
        free(p);
        return NULL;
    }
    return p;
}

int regc_program_add_region(regc_program *p, regc_compiled_region *r)
{
    regc_compiled_region **x = realloc(p->regions, ((size_t)p->n_regions + 1) * sizeof *x);
    if (!x) {
        regc_compiled_region_free(r);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    p->regions = x;
    p->regions[p->n_regions++] = r;
    return p->n_regions - 1;
}

/* An instance of region `region`, its formals bound to graph tensors. */
int regc_program_add_piece(regc_program *p, int region, const int *in, const int *out)
{
    const regc_compiled_region *r = p->regions[region];
    piece *x = realloc(p->pieces, ((size_t)p->n_pieces + 1) * sizeof *x);
    if (!x)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    p->pieces = x;
    piece *pc = &p->pieces[p->n_pieces];
    pc->region = region;
    pc->in = malloc(((size_t)r->n_in + 1) * sizeof(int));
    pc->out = malloc(((size_t)r->n_out + 1) * sizeof(int));
    if (!pc->in || !pc->out) {
        free(pc->in), free(pc->out);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    memcpy(pc->in, in, (size_t)r->n_in * sizeof(int));
    memcpy(pc->out, out, (size_t)r->n_out * sizeof(int));
    p->n_pieces++;
    return REGC_OK;
}

int regc_program_n_regions(const regc_program *p) { return p->n_regions; }
const regc_graph *regc_program_graph(const regc_program *p) { return p->graph; }
const regc_compiled_region *regc_program_region(const regc_program *p, int i) { return p->regions[i]; }

/* ---------------------------------------------------------------- running */

int regc_program_n_inputs(const regc_program *p) { return p->n_inputs; }

const regc_tensor *regc_program_input(const regc_program *p, int i)
{
    return i >= 0 && i < p->n_inputs ? regc_graph_tensor(p->graph, p->inputs[i]) : NULL;
}

int regc_program_bind(regc_program *p, regc_backend *be, float *params, float *grads,
                      void *const *inputs)
{
    p->be = be;
    if (!(p->ptr = calloc((size_t)p->n_bufs + 1, sizeof *p->ptr)))
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    int dynamic = p->level == REGC_LEVEL_O0;
    if (!dynamic && p->arena_bytes > 0 && !(p->arena = be->alloc(be, (size_t)p->arena_bytes)))
        return regc_error(REGC_ERR_MEMORY, "backend %s: out of memory for the %lld-byte activation arena",
                          be->name, (long long)p->arena_bytes);
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        switch (x->kind) {
        case BUF_ARENA: p->ptr[b] = dynamic ? NULL : (char *)p->arena + x->offset; break;
        case BUF_PARAMS: p->ptr[b] = (char *)params + x->offset; break;
        case BUF_GRADS: p->ptr[b] = (char *)grads + x->offset; break;
        case BUF_INPUT: p->ptr[b] = inputs[x->offset]; break;
        }
    }
    return REGC_OK;
}

static void resolve(char *const *base, const regc_instr *in, void **ptr)
{
    for (int k = 0; k < in->n_refs; k++)
        ptr[k] = in->refs[k].buf < 0 ? NULL : base[in->refs[k].buf] + in->refs[k].off;
}

/* One instruction; when profiling, timed between two synchronisations. */
static int run_instr(regc_program *p, const regc_instr *in, void *const *ptr)
{
    if (!p->profile)
        return regc_instr_run(p->be, in, ptr);
    int rc = p->be->sync(p->be);
    double t0 = regc_time_ms();
    if (rc == REGC_OK)
        rc = regc_instr_run(p->be, in, ptr);
    if (rc == REGC_OK)
        rc = p->be->sync(p->be);
    double ms = regc_time_ms() - t0;
    char label[REGC_PROFILE_LABEL];
    regc_instr_label(in, label, sizeof label);
    return rc ? rc : regc_profile_add(p->profile, label, ms, regc_instr_flop(in));
}

void regc_program_set_profile(regc_program *p, regc_profile *pr) { p->profile = pr; }

/* O0: each buffer is allocated before the step that first uses it and
 * freed after the last. */
static int alloc_step(regc_program *p, int step, int release)
{
    for (int b = 0; b < p->n_bufs; b++) {
        regc_buf *x = &p->bufs[b];
        if (x->kind != BUF_ARENA || x->first < 0)
            continue;
        if (!release && x->first == step && !p->ptr[b] &&
            !(p->ptr[b] = p->be->alloc(p->be, (size_t)(x->bytes ? x->bytes : 1))))
            return regc_error(REGC_ERR_MEMORY, "backend %s: out of memory (%lld bytes)",
                              p->be->name, (long long)x->bytes);
        if (release && x->last == step && p->ptr[b] && b != p->loss.buf) {
            p->be->free(p->be, p->ptr[b]);
            p->ptr[b] = NULL;
        }
    }
    return REGC_OK;
}

static int run_lazy(regc_program *p)
{
    int dynamic = p->level == REGC_LEVEL_O0, rc = REGC_OK;
    void *ptr[REGC_INSTR_MAX_REFS];
    char **slot = NULL;
    int cap = 0;
    for (int i = 0; i < p->n_steps && rc == REGC_OK; i++) {
        const lazy_step *s = &p->steps[i];
        if (dynamic && (rc = alloc_step(p, i, 0)))
            break;
        if (s->piece < 0) {
            resolve(p->ptr, &s->instr, ptr);
            rc = run_instr(p, &s->instr, ptr);
        } else {
            const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
            if (r->n_slots > cap) {
                char **x = realloc(slot, (size_t)r->n_slots * sizeof *x);
                if (!x) {
                    rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
                    break;
                }
                slot = x, cap = r->n_slots;
            }
            for (int k = 0; k < r->n_slots; k++)
                slot[k] = s->bind[k].buf < 0 || !p->ptr[s->bind[k].buf]
                              ? NULL
                              : p->ptr[s->bind[k].buf] + s->bind[k].off;
            const regc_instr *ins = s->backward ? r->bwd : r->fwd;
            int n = s->backward ? r->n_bwd : r->n_fwd;
            for (int j = 0; j < n && rc == REGC_OK; j++) {
                resolve(slot, &ins[j], ptr);
                rc = run_instr(p, &ins[j], ptr);
            }
        }
        if (dynamic && rc == REGC_OK)
            rc = alloc_step(p, i, 1);
    }
    free(slot);
    return rc;
}

int regc_program_run(regc_program *p)
{
    if (!p->ptr)
        return regc_error(REGC_ERR_ARG, "step program: run before bind");
    int rc = REGC_OK;
    if (p->lazy) {
        rc = run_lazy(p);
    } else {
        void *ptr[REGC_INSTR_MAX_REFS];
        for (int i = 0; i < p->n_instr && rc == REGC_OK; i++) {
            resolve(p->ptr, &p->instr[i], ptr);
            rc = run_instr(p, &p->instr[i], ptr);
        }
    }
    return rc ? rc : p->be->sync(p->be);
}

const float *regc_program_loss(const regc_program *p)
{
    return p->ptr && p->ptr[p->loss.buf] ? (const float *)(p->ptr[p->loss.buf] + p->loss.off) : NULL;
}

/* ---------------------------------------------------------------- dump */

void regc_program_dump(const regc_program *p, FILE *f)
{
    static const char *const kinds[] = {"arena", "params", "grads", "input"};
    fprintf(f, "# step program: level %s, %s, %d regions\n", regc_level_name(p->level),
            p->lazy ? "lazily inlined" : "inlined back", p->n_regions);
    fprintf(f, "# arena %lld bytes, lower bound %lld, add+norm fusions %d, %s order\n",
            (long long)p->arena_bytes, (long long)p->lower_bound, p->fused_pairs,
            p->reordered ? "memory-aware" : "program");
    if (p->lazy) {
        for (int i = 0; i < p->n_steps; i++) {
            const lazy_step *s = &p->steps[i];
            if (s->piece < 0) {
                fprintf(f, "%5d  ", i);
                regc_instr_dump(&s->instr, f);
            } else {
                const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
                fprintf(f, "%5d  call %s %s (piece %d):", i, r->name, s->backward ? "backward" : "forward",
                        s->piece);
                for (int k = 0; k < r->n_slots; k++)
                    if (r->slots[k].kind != SLOT_TEMP && r->slots[k].kind != SLOT_SAVED && s->bind[k].buf >= 0)
                        fprintf(f, " s%d=b%d", k, s->bind[k].buf);
                fputc('\n', f);
            }
        }
    } else {
        for (int i = 0; i < p->n_instr; i++) {
            fprintf(f, "%5d  ", i);
            regc_instr_dump(&p->instr[i], f);
        }
    }
    fprintf(f, "# buffers\n");
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        if (x->first < 0 && x->kind == BUF_ARENA)
            continue;
        fprintf(f, "b%d %s bytes=%lld offset=%lld live=%d..%d\n", b, kinds[x->kind],
                (long long)x->bytes, (long long)x->offset, x->first, x->last);
    }
}
