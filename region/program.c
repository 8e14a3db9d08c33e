/* program.c — the step program and lazy inline.
 *
 * Lazy inline: the step is prologue · CALL(kind, instance) … · epilogue and
 * the reverse for backward; a call binds one instance's program values
 * (its inputs, outputs, gradients, parameters) to the compiled region's
 * slots, so a kind is compiled once however many instances it has.
 * Linking builds this lazy program and then either plans its memory as it
 * is (O0 allocates at run time; inline_back off) or inlines it back into
 * one flat program (inline_back.c). Running it is program_run.c. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

int regc_program_new_buf(regc_program *p, regc_buf_kind kind, int64_t bytes, int64_t offset)
{
    if (p->n_bufs == p->cap_bufs) {
        int cap = p->cap_bufs ? 2 * p->cap_bufs : 256;
        regc_buf *b = realloc(p->bufs, (size_t)cap * sizeof *b);
        if (!b)
            return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        p->bufs = b, p->cap_bufs = cap;
    }
    p->bufs[p->n_bufs] = regc_buf_unplanned(kind, bytes, offset);
    return p->n_bufs++;
}

void regc_program_free(regc_program *p)
{
    if (!p)
        return;
    for (int k = 0; k < 2; k++)
        if (p->captured[k])
            p->be->graph_free(p->be, p->captured[k]);
    if (p->be && p->arena)
        p->be->free(p->be, p->arena);
    if (p->be && p->own_scalars)
        p->be->free(p->be, p->own_scalars);
    regc_comm_queue_free(p->queue);
    free(p->tickets);
    regc_comm_free(p->own_comm);
    regc_shard_layout_free(p->layout);
    regc_shard_layout_free(p->frozen_layout);
    if (p->be && p->lazy && p->level == REGC_LEVEL_O0 && p->ptr)
        for (int b = 0; b < p->n_bufs; b++)
            if (p->bufs[b].kind == BUF_ARENA && p->ptr[b])
                p->be->free(p->be, p->ptr[b]);
    for (int b = 0; p->be && p->ptr && b < p->n_bufs; b++)
        if (p->bufs[b].kind == BUF_HOST && p->ptr[b])
            p->be->free_host(p->be, p->ptr[b]);
    for (int b = 0; p->be && p->host_copy && b < p->n_bufs; b++)
        if (p->host_copy[b])
            p->be->free_host(p->be, p->host_copy[b]);
    free(p->host_copy), free(p->offloaded), free(p->no_decay);
    regc_backend_free(p->own_host_be);
    for (int i = 0; i < p->n_regions; i++)
        regc_compiled_region_free(p->regions[i]);
    free(p->regions);
    for (int i = 0; i < p->n_pieces; i++)
        free(p->pieces[i].in), free(p->pieces[i].out);
    free(p->pieces);
    regc_program_unlink(p);
    free(p->resident), free(p->frozen_resident), free(p->inputs), free(p->ptr);
    regc_bytes_free(&p->step_key);
    regc_graph_free(p->graph);
    free(p);
}

void regc_program_unlink(regc_program *p)
{
    for (int i = 0; i < p->n_steps; i++)
        free(p->steps[i].bind);
    free(p->steps), free(p->instr), free(p->update), free(p->bufs);
    p->steps = NULL, p->instr = NULL, p->update = NULL, p->bufs = NULL;
    regc_program_measure(p, 0);
    p->n_steps = p->n_instr = p->n_update = p->n_bufs = p->cap_bufs = p->n_signals = 0;
    p->arena_bytes = p->lower_bound = p->block_bytes = p->frozen_bytes = 0;
    p->fused_pairs = p->reordered = 0;
}

/* ---------------------------------------------------------------- lazy program */

typedef struct {
    regc_program *p;
    const regc_graph *g;
    int scalars;     /* the scalar block's buffer */
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

/* The loss's gradient seed: the scalar block's loss_scale (1, or this
 * micro-batch's share of an accumulated batch), copied into buffer b. */
static int add_seed(lazy_ctx *c, int b)
{
    lazy_step *s = add_step(c);
    if (!s)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    s->instr = (regc_instr){.kernel = K_COPY, .n_refs = 2, .n_out = 1, .node = -1};
    s->instr.refs[0] = (regc_ref){b, 0};
    s->instr.refs[1] = (regc_ref){c->scalars, (int64_t)offsetof(regc_step_scalars, loss_scale)};
    s->instr.d[0] = sizeof(float);
    return REGC_OK;
}

static int grad_buf_for(lazy_ctx *c, int t, int *rc)
{
    if (c->param_grad[t] >= 0)
        return c->param_grad[t];
    const regc_tensor *x = regc_graph_tensor(c->g, t);
    int b = regc_program_new_buf(c->p, BUF_ARENA, regc_tensor_bytes(x), 0);
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
    int scratch = regc_program_new_buf(p, BUF_ARENA, r->scratch_bytes, 0);
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
                /* accumulating, a parameter's gradient starts as what the
                 * block holds (zeroed by the caller before the first run) */
                int accumulated = p->accumulate_grads && c->param_grad[pc->in[k]] >= 0;
                if (rc == REGC_OK && !accumulated)
                    rc = add_fill(c, c->grad[pc->in[k]], 0.0f);
            }
            din_buf[k] =
                r->din_slot[k] >= 0 && rc == REGC_OK ? grad_buf_for(c, pc->in[k], &rc) : -1;
        }
    }
    for (int s = 0; s < r->n_slots && rc == REGC_OK; s++) {
        const regc_slot *sl = &r->slots[s];
        regc_ref ref = {REGC_REF_NONE, 0};
        switch (sl->kind) {
        case SLOT_IN: ref.buf = c->val[pc->in[sl->index]]; break;
        case SLOT_OUT: ref.buf = c->val[pc->out[sl->index]]; break;
        case SLOT_DOUT:
            if (backward)
                ref.buf = c->grad[pc->out[sl->index]];
            break;
        case SLOT_SEED:
            if (backward)
                ref.buf = c->grad[pc->in[sl->index]];
            break;
        case SLOT_DIN:
            if (backward)
                ref.buf = din_buf[sl->index];
            break;
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
            c->val[t] = regc_program_new_buf(p, BUF_INPUT, bytes, k++);
        } else if (x->role == REGC_ROLE_PARAM && x->frozen) { /* held in its own dtype */
            c->val[t] = regc_program_new_buf(p, BUF_FROZEN, regc_frozen_bytes(x), param_offset[t]);
        } else if (x->role == REGC_ROLE_PARAM) {
            c->val[t] = regc_program_new_buf(p, BUF_PARAMS, bytes, param_offset[t]);
            c->param_grad[t] = regc_program_new_buf(p, BUF_GRADS, bytes, param_offset[t]);
        }
        if (c->val[t] < 0 && x->role != REGC_ROLE_ACT)
            return c->val[t];
    }
    if ((c->scalars = regc_program_new_buf(p, BUF_SCALARS, sizeof(regc_step_scalars), 0)) < 0)
        return c->scalars;
    for (int i = 0; i < p->n_pieces; i++) {
        piece *pc = &p->pieces[i];
        const regc_compiled_region *r = p->regions[pc->region];
        for (int k = 0; k < r->n_out; k++) {
            const regc_tensor *x = regc_graph_tensor(g, pc->out[k]);
            if ((c->val[pc->out[k]] = regc_program_new_buf(p, BUF_ARENA, regc_tensor_bytes(x), 0)) <
                0)
                return c->val[pc->out[k]];
        }
        if ((pc->saved_buf = regc_program_new_buf(p, BUF_ARENA, r->saved_bytes, 0)) < 0)
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
    if (rc == REGC_OK)
        p->loss = (regc_ref){c.val[loss], 0};
    if (rc == REGC_OK && !p->forward_only) {
        c.grad[loss] = grad_buf_for(&c, loss, &rc);
        if (rc == REGC_OK)
            rc = add_seed(&c, c.grad[loss]);
    }
    for (int i = p->n_pieces - 1; i >= 0 && rc == REGC_OK && !p->forward_only; i--)
        rc = add_call(&c, i, 1);
    free(c.val), free(c.grad), free(c.param_grad);
    return rc;
}

/* ---------------------------------------------------------------- building */

/* Stage 0 over several ranks: the gradient block cut into buckets of whole
 * parameters, each at most `bucket` floats unless one parameter alone is
 * larger; the buckets' starts (bytes, ascending, the first 0) into `start`
 * ([n_bufs + 1]), their number returned (at least 1). */
static int grad_buckets(const regc_program *p, int64_t bucket, int64_t *start)
{
    int n = 0;
    for (int b = 0; b < p->n_bufs; b++)
        if (p->bufs[b].kind == BUF_GRADS)
            start[n++] = p->bufs[b].offset;
    qsort(start, (size_t)n, sizeof *start, regc_cmp_i64);
    const int64_t cap = bucket * (int64_t)sizeof(float);
    int k = 1;
    start[0] = 0; /* the block's own buffer (build_update made it) starts there anyway */
    for (int i = 0; i < n; i++) /* a parameter after which the bucket would be too large */
        if (start[i] > start[k - 1]) {
            int64_t end = i + 1 < n ? start[i + 1] : p->block_bytes;
            if (end - start[k - 1] > cap)
                start[k++] = start[i];
        }
    return k;
}

/* An instruction of the update: `kernel` over refs[0 .. n_refs), the first
 * n_out written, d0 its size. */
static regc_instr update_op(regc_kernel kernel, int n_refs, int n_out, const regc_ref *refs,
                            int64_t d0)
{
    regc_instr in = {.kernel = kernel, .n_refs = n_refs, .n_out = n_out, .node = -1, .d = {d0}};
    memcpy(in.refs, refs, (size_t)n_refs * sizeof *refs);
    return in;
}

/* The update phase: the optimizer step over whole blocks (every
 * parameter at once, in the blocks' order; under ZeRO-3 this rank's shard
 * of every unit), reading and advancing the scalar block. */
static int build_update(regc_program *p)
{
    int scalars = -1;
    for (int b = 0; b < p->n_bufs; b++)
        if (p->bufs[b].kind == BUF_SCALARS)
            scalars = b;
    const int64_t n = p->block_bytes / (int64_t)sizeof(float);
    int params = regc_program_new_buf(p, BUF_PARAMS, p->block_bytes, 0);
    int grads = regc_program_new_buf(p, BUF_GRADS, p->block_bytes, 0);
    int m = regc_program_new_buf(p, BUF_M, p->block_bytes, 0);
    int v = regc_program_new_buf(p, BUF_V, p->block_bytes, 0);
    if (params < 0 || grads < 0 || m < 0 || v < 0 || scalars < 0)
        return params < 0 ? params : grads < 0 ? grads : m < 0 ? m : v < 0 ? v : REGC_ERR_ARG;
    /* stage 0 over several ranks: every rank's gradients summed first (each
     * rank's loss was seeded with its share of the global batch), a bucket
     * at a time; inline back may move them into the backward */
    int64_t *start = malloc(((size_t)p->n_bufs + 1) * sizeof *start);
    int n_buckets = 0;
    if (start && p->ranks > 1 && p->zero_stage == 0)
        n_buckets = grad_buckets(
            p, p->reduce_bucket_floats > 0 ? p->reduce_bucket_floats : REGC_REDUCE_BUCKET_DEFAULT,
            start);
    /* offloaded: the update's own host blocks, the parameters' copy first */
    int master = -1, host_grads = -1, host_scalars = -1;
    if (p->offload &&
        ((master = regc_program_new_buf(p, BUF_HOST, p->block_bytes, 0)) < 0 ||
         (host_grads = regc_program_new_buf(p, BUF_HOST, p->block_bytes, 0)) < 0 ||
         (host_scalars = regc_program_new_buf(p, BUF_HOST, sizeof(regc_step_scalars), 0)) < 0)) {
        free(start);
        return REGC_ERR_MEMORY;
    }
    if (!start || !(p->update = calloc((size_t)n_buckets + 12, sizeof *p->update))) {
        free(start);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    regc_instr *u = p->update;
    int k = 0;
    for (int i = 0; i < n_buckets; i++) {
        const int64_t end = i + 1 < n_buckets ? start[i + 1] : p->block_bytes;
        u[k++] = update_op(K_ALLREDUCE, 1, 1, (regc_ref[]){{grads, start[i]}},
                           (end - start[i]) / (int64_t)sizeof(float));
    }
    free(start);
    u[k++] = update_op(K_STEP_SCHEDULE, 1, 1, (regc_ref[]){{scalars, 0}}, 0);
    /* The gradients' global norm every step, clipping or not: the step is
     * skipped (AdamW a no-op) when it is not finite, and it is reported. */
    u[k++] = update_op(K_GRAD_SUMSQ, 2, 1, (regc_ref[]){{scalars, 0}, {grads, 0}}, n);
    /* ZeRO-3: each rank summed its shard's squares; the norm is of all */
    if (p->ranks > 1 && p->zero_stage == 3) {
        u[k] =
            update_op(K_ALLREDUCE, 1, 1,
                      (regc_ref[]){{scalars, (int64_t)offsetof(regc_step_scalars, grad_sumsq)}}, 1);
        u[k++].d[1] = 1; /* f64 */
    }
    u[k++] = update_op(K_GRAD_CLIP, 1, 1, (regc_ref[]){{scalars, 0}}, 0);
    if (!p->offload) {
        u[k++] = update_op(K_ADAMW, 5, 3,
                           (regc_ref[]){{params, 0}, {m, 0}, {v, 0}, {grads, 0}, {scalars, 0}}, n);
    } else { /* the gradients and scalars to the host, AdamW there, the parameters back */
        const int64_t bytes = p->block_bytes;
        u[k++] = update_op(K_COPY_D2H, 2, 1, (regc_ref[]){{host_grads, 0}, {grads, 0}}, bytes);
        u[k++] = update_op(K_COPY_D2H, 2, 1, (regc_ref[]){{host_scalars, 0}, {scalars, 0}},
                           (int64_t)sizeof(regc_step_scalars));
        u[k++] = update_op(
            K_ADAMW, 5, 3,
            (regc_ref[]){{master, 0}, {m, 0}, {v, 0}, {host_grads, 0}, {host_scalars, 0}}, n);
        u[k++] = update_op(K_COPY_H2D, 2, 1, (regc_ref[]){{params, 0}, {master, 0}}, bytes);
    }
    p->n_update = k;
    return REGC_OK;
}

/* Fill the program's pieces from regions already compiled. */
int regc_program_link(regc_program *p, const int64_t *param_offset, int inline_flat,
                      regc_compile_stats *st)
{
    p->lazy = !inline_flat;
    int rc = build_lazy(p, param_offset);
    if (rc == REGC_OK && p->layout)
        rc = regc_zero3_place(p);
    /* the blocks: as far as the parameters reach (under ZeRO-3, the shard) */
    p->block_bytes = p->frozen_bytes = 0;
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        if (x->kind == BUF_PARAMS && x->offset + x->bytes > p->block_bytes)
            p->block_bytes = x->offset + x->bytes;
        if (x->kind == BUF_FROZEN && x->offset + x->bytes > p->frozen_bytes)
            p->frozen_bytes = x->offset + x->bytes;
    }
    if (rc == REGC_OK && !p->forward_only)
        rc = build_update(p);
    if (rc)
        return rc;
    if ((rc = inline_flat ? regc_program_inline_back(p) : regc_program_plan_lazy(p)))
        return rc;
    if (st) {
        st->add_norm_fusions = p->fused_pairs;
        st->peak_bytes = p->arena_bytes;
        st->lower_bound_bytes = p->lower_bound;
        st->memory_aware_order = p->reordered;
        st->zero3_units = regc_program_gather_units(p);
        st->zero3_prefetch = p->layout ? p->prefetch_floats : 0;
        st->zero3_resident = p->n_resident;
        int64_t n = 0;
        if (inline_flat)
            n = p->n_instr;
        else
            for (int i = 0; i < p->n_steps; i++) {
                const lazy_step *s = &p->steps[i];
                const regc_compiled_region *r =
                    s->piece < 0 ? NULL : p->regions[p->pieces[s->piece].region];
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
const regc_compiled_region *regc_program_region(const regc_program *p, int i)
{
    return p->regions[i];
}
