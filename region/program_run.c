/* program_run.c — a step program bound to memory and run on a backend,
 * instruction by instruction (profiled when asked), and its text dump.
 *
 * A bound program resolves each (buffer, offset) reference to a device
 * pointer: the activation arena planned at compile time, the parameter and
 * gradient blocks, or an input. At O0 arena buffers are allocated before
 * the call that first uses them and freed after the last. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

int regc_program_n_inputs(const regc_program *p) { return p->n_inputs; }

const regc_tensor *regc_program_input(const regc_program *p, int i)
{
    return i >= 0 && i < p->n_inputs ? regc_graph_tensor(p->graph, p->inputs[i]) : NULL;
}

/* A block's place: base + offset, or NULL for a block not given. */
static char *at(void *base, int64_t offset) { return base ? (char *)base + offset : NULL; }

static int prepare_gemms(regc_program *p);

/* An offloaded update: AdamW runs on a CPU backend (the program's own
 * when be is a GPU's), over a host copy of the parameters that starts as
 * theirs, the copy K_COPY_H2D puts back after each update. */
static int bind_host_update(regc_program *p, regc_backend *host)
{
    p->host_be = host ? host : p->be;
    if (!host && strcmp(p->be->name, "cpu") != 0 &&
        !(p->host_be = p->own_host_be = regc_backend_new("cpu", 0)))
        return REGC_ERR_UNSUPPORTED;
    for (int i = 0; i < p->n_update; i++) {
        const regc_instr *in = &p->update[i];
        if (in->kernel == K_COPY_H2D)
            p->be->copy_d2h(p->be, p->ptr[in->refs[1].buf] + in->refs[1].off,
                            p->ptr[in->refs[0].buf] + in->refs[0].off, (size_t)in->d[0]);
    }
    return p->be->sync(p->be);
}

/* The ranges AdamW leaves undecayed, checked (ascending, disjoint, within
 * the block) and copied. */
static int bind_no_decay(regc_program *p, const int64_t *r, int n)
{
    const int64_t floats = p->block_bytes / (int64_t)sizeof(float);
    if (n < 0 || (n > 0 && !r))
        return regc_error(REGC_ERR_ARG, "step program: %d undecayed ranges and no table", n);
    for (int k = 0; k < n; k++)
        if (r[2 * k] < (k ? r[2 * k - 1] : 0) || r[2 * k + 1] < r[2 * k] || r[2 * k + 1] > floats)
            return regc_error(REGC_ERR_ARG,
                              "step program: range %d of the undecayed parameters, [%lld, %lld), "
                              "is not ascending within the %lld-float block",
                              k, (long long)r[2 * k], (long long)r[2 * k + 1], (long long)floats);
    free(p->no_decay);
    p->no_decay = malloc((size_t)n * 2 * sizeof *r + 1), p->n_no_decay = 0;
    if (!p->no_decay)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    if (n > 0) /* r may be NULL then */
        memcpy(p->no_decay, r, (size_t)n * 2 * sizeof *r);
    p->n_no_decay = n;
    return REGC_OK;
}

int regc_program_bind(regc_program *p, regc_backend *be, const regc_program_memory *mem)
{
    p->be = be;
    if (!mem->params || (!mem->grads && !p->forward_only))
        return regc_error(REGC_ERR_ARG, "step program: bind needs the parameter block%s",
                          p->forward_only ? "" : " and the gradient block");
    if (!(p->ptr = calloc((size_t)p->n_bufs + 1, sizeof *p->ptr)))
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    int dynamic = p->level == REGC_LEVEL_O0;
    char *arena = NULL;
    if (!dynamic && p->arena_bytes > 0 && mem->arena && mem->arena_bytes >= p->arena_bytes)
        arena = mem->arena; /* borrowed: another program's, never run at the same time */
    else if (!dynamic && p->arena_bytes > 0 &&
             !(arena = p->arena = be->alloc(be, (size_t)p->arena_bytes)))
        return regc_error(REGC_ERR_MEMORY,
                          "backend %s: out of memory for the %lld-byte activation arena", be->name,
                          (long long)p->arena_bytes);
    p->comm = mem->comm;
    if (!p->comm && p->ranks == 1 && !(p->comm = p->own_comm = regc_comm_single_new()))
        return REGC_ERR_MEMORY;
    if (p->ranks > 1 && (!mem->comm || mem->comm->size != p->ranks))
        return regc_error(REGC_ERR_ARG,
                          "step program: compiled for %d ranks, bound to a communicator of %d",
                          p->ranks, mem->comm ? mem->comm->size : 1);
    /* asynchronous collectives: a queue of their own between processes; in
     * one process each is a copy, made where it starts */
    if (!(p->tickets = calloc((size_t)p->n_signals + 1, sizeof *p->tickets)))
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    int rc = REGC_OK;
    if (p->n_signals > 0 && p->comm->size > 1 && (rc = regc_comm_queue_new(p->comm, &p->queue)))
        return rc;
    regc_step_scalars *scalars = mem->scalars;
    if (!scalars) { /* enough to run: the loss's seed is 1 */
        regc_step_scalars s = {.loss_scale = 1.0f, .clip_scale = 1.0f};
        if (!(scalars = p->own_scalars = be->alloc(be, sizeof s)))
            return regc_error(REGC_ERR_MEMORY, "backend %s: out of memory", be->name);
        be->copy_h2d(be, scalars, &s, sizeof s);
    }
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        switch (x->kind) {
        case BUF_ARENA: p->ptr[b] = dynamic ? NULL : arena + x->offset; break;
        case BUF_PARAMS: p->ptr[b] = at(mem->params, x->offset); break;
        case BUF_FROZEN: p->ptr[b] = at((void *)mem->frozen, x->offset); break; /* read only */
        case BUF_GRADS: p->ptr[b] = at(mem->grads, x->offset); break;
        case BUF_M: p->ptr[b] = at(mem->m, x->offset); break;
        case BUF_V: p->ptr[b] = at(mem->v, x->offset); break;
        case BUF_SCALARS: p->ptr[b] = at(scalars, x->offset); break;
        case BUF_INPUT: p->ptr[b] = mem->inputs[x->offset]; break;
        case BUF_HOST:
            if (!(p->ptr[b] = be->alloc_host(be, (size_t)x->bytes)))
                return REGC_ERR_MEMORY;
            break;
        }
    }
    if (p->offload && (rc = bind_host_update(p, mem->host)))
        return rc;
    if ((rc = bind_no_decay(p, mem->no_decay, mem->n_no_decay)))
        return rc;
    /* the backend's choices for the GEMMs: an earlier start's, or made now
     * and kept for the next */
    const int64_t queries = be->tuning_queries;
    regc_compile_tuning_load(mem->tuning_cache, p, be);
    if ((rc = prepare_gemms(p)))
        return rc;
    if (be->tuning_queries > queries && (rc = regc_compile_tuning_store(mem->tuning_cache, p, be)))
        return rc;
    return be->sync(be);
}

static void resolve(char *const *base, const regc_instr *in, void **ptr)
{
    for (int k = 0; k < in->n_refs; k++)
        ptr[k] = in->refs[k].buf < 0 ? NULL : base[in->refs[k].buf] + in->refs[k].off;
}

/* An all-gather in bf16 (a unit that only bf16 GEMMs read): this rank's
 * fp32 shard src [n] is rounded into its own place in dst (the downcast
 * fused with the gather: no other copy of it), and *send is that place;
 * the ranks' bf16 values then travel as n / 2 pairs, each pair one float's
 * bytes, in place. */
static int allgather_bf16_send(regc_program *p, void *dst, const float *src, int64_t n,
                               float **send)
{
    static const regc_ew_program copy = {.n_inputs = 1, .n_outputs = 1, .out_reg = {0}};
    uint16_t *mine = (uint16_t *)dst + (int64_t)p->comm->rank * n; /* [n] bf16 */
    float *outs[1] = {(float *)mine};
    const float *ins[1] = {src};
    p->be->elementwise(p->be, &copy, n, outs, ins, 1u, 0u);
    *send = (float *)mine;
    return p->be->sync(p->be);
}

/* A collective on the program's communicator, after the compute before it
 * has finished: at once, started on the queue (signal > 0), or waited for
 * (K_COMM_WAIT). */
static int run_comm(regc_program *p, const regc_instr *in, void *const *ptr)
{
    regc_comm *c = p->comm;
    int rc = p->be->sync(p->be);
    if (rc)
        return rc;
    const int bf16 = in->kernel == K_ALLGATHER && regc_instr_ref_bf16(in, 0);
    float *send = NULL;
    if (bf16 && (rc = allgather_bf16_send(p, ptr[0], (const float *)ptr[1], in->d[0], &send)))
        return rc;
    const int64_t n = bf16 ? in->d[0] / 2 : in->d[0]; /* floats, or bf16 pairs, per rank */
    if (in->kernel == K_COMM_WAIT) {
        if (!p->queue)
            return REGC_OK;
        double t0 = regc_time_ms();
        rc = regc_comm_queue_wait(p->queue, p->tickets[in->signal]);
        p->wait_ms += regc_time_ms() - t0;
        return rc;
    }
    if (in->signal && p->queue) {
        regc_comm_op op = {.kind = in->kernel == K_ALLGATHER   ? REGC_COMM_OP_ALLGATHER
                                   : in->kernel == K_ALLREDUCE ? REGC_COMM_OP_ALLREDUCE
                                                               : REGC_COMM_OP_REDUCE_SCATTER,
                           .dst = ptr[0],
                           .src = in->kernel == K_ALLREDUCE ? NULL
                                  : bf16                    ? send
                                                            : ptr[1],
                           .n = n,
                           .accumulate = in->accumulate,
                           .ms = p->op_ms ? &p->op_ms[in->signal] : NULL};
        return regc_comm_queue_start(p->queue, &op, &p->tickets[in->signal]);
    }
    switch (in->kernel) {
    case K_ALLREDUCE:
        return c->allreduce(c, ptr[0], in->d[0], in->d[1] ? REGC_COMM_F64 : REGC_COMM_F32);
    case K_ALLGATHER: return c->allgather(c, ptr[0], bf16 ? send : ptr[1], n);
    case K_REDUCE_SCATTER: return c->reduce_scatter(c, ptr[0], ptr[1], in->d[0], in->accumulate);
    default: return regc_error(REGC_ERR_ARG, "step program: %d is no collective", in->kernel);
    }
}

static int is_comm(const regc_instr *in)
{
    return in->kernel == K_ALLREDUCE || in->kernel == K_ALLGATHER ||
           in->kernel == K_REDUCE_SCATTER ||
           (in->kernel == K_COMM_WAIT && !regc_instr_is_queued_copy(in));
}

/* A copy on the backend's copy queue, or the compute's wait for it; where
 * the backend has no queue the copy is done at once and the wait is
 * nothing. */
static int run_queued_copy(regc_program *p, const regc_instr *in, void *const *ptr)
{
    regc_backend *be = p->be;
    if (in->kernel == K_COMM_WAIT) {
        if (be->copy_wait)
            be->copy_wait(be, p->tickets[in->signal]);
        return REGC_OK;
    }
    const int to_host = in->kernel == K_COPY_D2H;
    if (be->copy_start)
        p->tickets[in->signal] = be->copy_start(be, ptr[0], ptr[1], (size_t)in->d[0], to_host);
    else
        (to_host ? be->copy_d2h : be->copy_h2d)(be, ptr[0], ptr[1], (size_t)in->d[0]);
    return REGC_OK;
}

/* AdamW over the parameter block on `be`, a run at a time: the ranges
 * bind was given without weight decay, what lies between them with it.
 * Each element is updated once, by the same formula, so the split changes
 * no bits of what decays. */
static int run_adamw(const regc_program *p, regc_backend *be, const regc_instr *in,
                     void *const *ptr)
{
    if (!be->adamw)
        return regc_error(REGC_ERR_UNSUPPORTED, "backend %s: no adamw kernel", be->name);
    float *param = ptr[0], *m = ptr[1], *v = ptr[2]; /* [n] each */
    const float *g = ptr[3];                         /* [n] */
    const regc_step_scalars *s = ptr[4];
    const int64_t n = in->d[0]; /* the block, which bind checked the ranges against */
    int64_t at = 0;             /* where the next decayed run starts */
    for (int k = 0; k < p->n_no_decay; k++) {
        const int64_t lo = p->no_decay[2 * k], hi = p->no_decay[2 * k + 1];
        if (lo > at)
            be->adamw(be, param + at, g + at, m + at, v + at, lo - at, s, 1);
        if (hi > lo)
            be->adamw(be, param + lo, g + lo, m + lo, v + lo, hi - lo, s, 0);
        at = hi;
    }
    if (n > at)
        be->adamw(be, param + at, g + at, m + at, v + at, n - at, s, 1);
    return REGC_OK;
}

/* One instruction. */
static int run_one(regc_program *p, const regc_instr *in, void *const *ptr)
{
    if (in->kernel == K_ADAMW)
        return run_adamw(p, p->be, in, ptr);
    if (regc_instr_is_queued_copy(in))
        return run_queued_copy(p, in, ptr);
    return is_comm(in) ? run_comm(p, in, ptr) : regc_instr_run(p->be, in, ptr);
}

/* One instruction; when profiling, timed between two synchronisations. */
static int run_instr(regc_program *p, const regc_instr *in, void *const *ptr)
{
    if (!p->profile)
        return run_one(p, in, ptr);
    int rc = p->be->sync(p->be);
    double t0 = regc_time_ms();
    if (rc == REGC_OK)
        rc = run_one(p, in, ptr);
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

/* O0's offload (compile.offload_activation; offload.c chose which buffers
 * and between which lazy steps): O0 allocates each buffer as it runs, so
 * its copies are made as it runs too, synchronous as all of O0 is: the
 * same bytes, so the same bits, and the device holds neither copy in
 * between. At the first run the chosen buffers are listed (each step then
 * looks at those only) and their host copies made, kept for later runs.
 * Before lazy step `step` (!after) the buffers it brings back; after it,
 * those that leave. */
static int lazy_offload_step(regc_program *p, int step, int after)
{
    regc_backend *be = p->be;
    if (!p->host_copy) {
        if (!(p->offloaded = malloc(((size_t)p->n_bufs + 1) * sizeof *p->offloaded)) ||
            !(p->host_copy = calloc((size_t)p->n_bufs + 1, sizeof *p->host_copy))) {
            free(p->offloaded), p->offloaded = NULL;
            return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        }
        p->n_offloaded = 0;
        for (int b = 0; b < p->n_bufs; b++)
            if (p->bufs[b].away >= 0)
                p->offloaded[p->n_offloaded++] = b;
    }
    for (int o = 0; o < p->n_offloaded; o++) {
        const int b = p->offloaded[o];
        const size_t bytes = (size_t)p->bufs[b].bytes;
        if (after && p->bufs[b].away == step && p->ptr[b]) {
            if (!p->host_copy[b] && !(p->host_copy[b] = be->alloc_host(be, bytes)))
                return regc_error(REGC_ERR_MEMORY,
                                  "backend %s: out of host memory for an offloaded activation "
                                  "(%zu bytes)",
                                  be->name, bytes);
            be->copy_d2h(be, p->host_copy[b], p->ptr[b], bytes);
            int rc = be->sync(be); /* landed before its memory is freed */
            if (rc)
                return rc;
            be->free(be, p->ptr[b]);
            p->ptr[b] = NULL;
        } else if (!after && p->bufs[b].back == step && p->host_copy[b] && !p->ptr[b]) {
            if (!(p->ptr[b] = be->alloc(be, bytes)))
                return regc_error(REGC_ERR_MEMORY, "backend %s: out of memory (%zu bytes)",
                                  be->name, bytes);
            be->copy_h2d(be, p->ptr[b], p->host_copy[b], bytes);
        }
    }
    return REGC_OK;
}

/* A lazy step's call: its region's slots resolved through the step's
 * binding into *slot (grown to *cap), and the instructions of its pass. */
static int lazy_call(const regc_program *p, const lazy_step *s, char ***slot, int *cap,
                     const regc_instr **ins, int *n)
{
    const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
    if (r->n_slots > *cap) {
        char **x = realloc(*slot, (size_t)r->n_slots * sizeof *x);
        if (!x)
            return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        *slot = x, *cap = r->n_slots;
    }
    for (int k = 0; k < r->n_slots; k++)
        (*slot)[k] = s->bind[k].buf < 0 || !p->ptr[s->bind[k].buf]
                         ? NULL
                         : p->ptr[s->bind[k].buf] + s->bind[k].off;
    *ins = s->backward ? r->bwd : r->fwd;
    *n = s->backward ? r->n_bwd : r->n_fwd;
    return REGC_OK;
}

static int run_lazy(regc_program *p)
{
    int dynamic = p->level == REGC_LEVEL_O0, rc = REGC_OK;
    const int offload = dynamic && p->offload_activation && !p->forward_only;
    void *ptr[REGC_INSTR_MAX_REFS];
    char **slot = NULL;
    int cap = 0;
    for (int i = 0; i < p->n_steps && rc == REGC_OK; i++) {
        const lazy_step *s = &p->steps[i];
        if (dynamic && (rc = alloc_step(p, i, 0)))
            break;
        if (offload && (rc = lazy_offload_step(p, i, 0)))
            break;
        if (s->piece < 0) {
            resolve(p->ptr, &s->instr, ptr);
            rc = run_instr(p, &s->instr, ptr);
        } else {
            const regc_instr *ins;
            int n;
            rc = lazy_call(p, s, &slot, &cap, &ins, &n);
            for (int j = 0; j < n && rc == REGC_OK; j++) {
                resolve(slot, &ins[j], ptr);
                rc = run_instr(p, &ins[j], ptr);
            }
        }
        if (dynamic && rc == REGC_OK)
            rc = alloc_step(p, i, 1);
        if (offload && rc == REGC_OK)
            rc = lazy_offload_step(p, i, 1);
    }
    free(slot);
    return rc;
}

/* One GEMM prepared with the operands it will run on (at O0 an arena
 * operand is not allocated yet and counts as aligned, as every fresh
 * allocation is). */
static int prepare_gemm(regc_program *p, char *const *base, const regc_instr *in)
{
    if (in->kernel != K_GEMM)
        return REGC_OK;
    void *ptr[REGC_INSTR_MAX_REFS];
    regc_gemm g;
    resolve(base, in, ptr);
    regc_instr_gemm(in, ptr, &g);
    return p->be->gemm_prepare(p->be, &g);
}

/* Every GEMM of the program prepared by the backend before the first run
 * (gemm_prepare: on the GPU, cuBLASLt's descriptors and algorithm), so
 * that no choice is made while a step runs. */
static int prepare_gemms(regc_program *p)
{
    int rc = REGC_OK;
    if (!p->be->gemm_prepare)
        return REGC_OK;
    if (!p->lazy) {
        for (int i = 0; i < p->n_instr && rc == REGC_OK; i++)
            rc = prepare_gemm(p, p->ptr, &p->instr[i]);
        return rc;
    }
    char **slot = NULL;
    int cap = 0;
    for (int i = 0; i < p->n_steps && rc == REGC_OK; i++) {
        const lazy_step *s = &p->steps[i];
        const regc_instr *ins;
        int n;
        if (s->piece < 0) {
            rc = prepare_gemm(p, p->ptr, &s->instr);
            continue;
        }
        rc = lazy_call(p, s, &slot, &cap, &ins, &n);
        for (int j = 0; j < n && rc == REGC_OK; j++)
            rc = prepare_gemm(p, slot, &ins[j]);
    }
    free(slot);
    return rc;
}

int regc_program_measure(regc_program *p, int on)
{
    free(p->instr_ms), free(p->started_at), free(p->op_ms);
    p->instr_ms = NULL, p->started_at = NULL, p->op_ms = NULL;
    p->measured_runs = 0;
    if (!on || p->lazy)
        return REGC_OK;
    p->instr_ms = calloc((size_t)p->n_instr + 1, sizeof *p->instr_ms);
    p->started_at = calloc((size_t)p->n_signals + 1, sizeof *p->started_at);
    p->op_ms = calloc((size_t)p->n_signals + 1, sizeof *p->op_ms);
    if (!p->instr_ms || !p->started_at || !p->op_ms) {
        regc_program_measure(p, 0);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    return REGC_OK;
}

/* The flat program with every instruction timed between two
 * synchronisations; an asynchronous collective's own time (on the
 * communication thread) goes to the instruction that started it, once
 * its wait has returned. */
static int run_measured(regc_program *p)
{
    void *ptr[REGC_INSTR_MAX_REFS];
    int rc = p->be->sync(p->be);
    for (int i = 0; i < p->n_instr && rc == REGC_OK; i++) {
        const regc_instr *in = &p->instr[i];
        resolve(p->ptr, in, ptr);
        double t0 = regc_time_ms();
        rc = run_instr(p, in, ptr);
        if (rc == REGC_OK)
            rc = p->be->sync(p->be);
        p->instr_ms[i] += regc_time_ms() - t0;
        if (in->signal && in->kernel != K_COMM_WAIT)
            p->started_at[in->signal] = i;
        else if (in->signal)
            p->instr_ms[p->started_at[in->signal]] += p->op_ms[in->signal];
    }
    p->measured_runs += rc == REGC_OK;
    return rc;
}

/* ---------------------------------------------------------------- O2 */

enum { PHASE_RUN, PHASE_UPDATE };

/* Can a phase be captured whole? O2, flat, on a backend that captures, not
 * timed, and only device work: no collective (MPI runs on the host), no
 * offloaded update. */
static int capturable(const regc_program *p, const regc_instr *ins, int n)
{
    if (p->level != REGC_LEVEL_O2 || p->lazy || !p->be->capture_begin || p->profile || p->instr_ms)
        return 0;
    for (int i = 0; i < n; i++)
        if (is_comm(&ins[i]) || ins[i].kernel == K_COPY_D2H || ins[i].kernel == K_COPY_H2D ||
            (p->offload && ins[i].kernel == K_ADAMW))
            return 0;
    return 1;
}

/* A phase's instructions. At O2 on a backend that captures, its first run
 * is eager (it sizes every scratch allocation and warms what the backend
 * keeps), the second is captured into a graph and launched, later ones
 * launch the graph: the same kernels on the same memory, so the same
 * bits. */
static int run_phase(regc_program *p, int phase, const regc_instr *ins, int n)
{
    if (p->captured[phase] && !p->profile && !p->instr_ms) /* timed runs run each kernel */
        return p->be->graph_launch(p->be, p->captured[phase]);
    void *ptr[REGC_INSTR_MAX_REFS];
    const double t0 = regc_time_ms();
    int capture = capturable(p, ins, n) && !p->capture_failed[phase] && p->eager_runs[phase]++ > 0;
    if (capture && p->be->capture_begin(p->be) != REGC_OK) {
        regc_error_clear();
        p->capture_failed[phase] = 1, capture = 0;
    }
    if (capture) {
        int rc = REGC_OK;
        for (int i = 0; i < n && rc == REGC_OK; i++) {
            resolve(p->ptr, &ins[i], ptr);
            rc = run_one(p, &ins[i], ptr); /* AdamW's runs are captured as they are */
        }
        void *graph = NULL; /* a capture begun is ended, whatever failed */
        const int end = p->be->capture_end(p->be, &graph);
        if (rc == REGC_OK && end == REGC_OK) {
            p->captured[phase] = graph;
            p->capture_ms += regc_time_ms() - t0;
            return p->be->graph_launch(p->be, graph);
        }
        if (graph)
            p->be->graph_free(p->be, graph);
        /* nothing ran: the phase runs as at O1, now and from now on */
        regc_error_clear();
        p->capture_failed[phase] = 1;
    }
    int rc = REGC_OK;
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        resolve(p->ptr, &ins[i], ptr);
        rc = run_instr(p, &ins[i], ptr);
    }
    return rc;
}

double regc_program_capture_ms(const regc_program *p) { return p->capture_ms; }

int regc_program_run(regc_program *p)
{
    if (!p->ptr)
        return regc_error(REGC_ERR_ARG, "step program: run before bind");
    if (p->be->begin_run)
        p->be->begin_run(p->be);
    int rc = REGC_OK;
    if (p->lazy) {
        rc = run_lazy(p);
    } else if (p->instr_ms) {
        rc = run_measured(p);
    } else {
        rc = run_phase(p, PHASE_RUN, p->instr, p->n_instr);
    }
    /* every collective waited for (a failed run leaves none behind either:
     * the caller may call the communicator next) */
    int drained = p->queue ? regc_comm_queue_drain(p->queue) : REGC_OK;
    if (rc == REGC_OK)
        rc = drained;
    return rc ? rc : p->be->sync(p->be);
}

int64_t regc_program_block_floats(const regc_program *p)
{
    return p->block_bytes / (int64_t)sizeof(float);
}

const regc_shard_layout *regc_program_shard_layout(const regc_program *p) { return p->layout; }

const regc_shard_layout *regc_program_frozen_layout(const regc_program *p)
{
    return p->frozen_layout;
}

void regc_program_comm_times(const regc_program *p, double *busy_ms, double *wait_ms)
{
    *busy_ms = p->queue ? regc_comm_queue_busy_ms(p->queue) : 0.0;
    *wait_ms = p->wait_ms;
}

void regc_program_device_memory(const regc_program *p, regc_device_memory *a)
{
    memset(a, 0, sizeof *a);
    a->block_floats = regc_program_block_floats(p);
    a->model_floats = p->layout ? p->layout->model_floats : a->block_floats;
    a->params = a->grads = a->m = a->v = a->block_floats * (int64_t)sizeof(float);
    a->frozen = p->frozen_bytes;
    a->activations = regc_program_arena_bytes(p);
    for (int i = 0; i < p->n_inputs; i++)
        a->inputs += regc_tensor_bytes(regc_program_input(p, i));
    a->scalars = (int64_t)sizeof(regc_step_scalars);
    if (p->offload) {
        a->host = a->m + a->v;
        a->m = a->v = 0;
    }
    for (int b = 0; b < p->n_bufs; b++) /* the update's own, offloaded activations */
        a->host += p->bufs[b].kind == BUF_HOST ? p->bufs[b].bytes : 0;
    for (int b = 0; p->lazy && b < p->n_bufs; b++) /* O0's, copied as it runs */
        if (p->bufs[b].away >= 0)
            a->host += p->bufs[b].bytes, a->host_activations += p->bufs[b].bytes;
    for (int i = 0; i < p->n_instr; i++) /* an offloaded activation's place: a copy's dest */
        if (p->instr[i].kernel == K_COPY_D2H && regc_instr_is_queued_copy(&p->instr[i]))
            a->host_activations += p->bufs[p->instr[i].refs[0].buf].bytes;
    a->total =
        a->params + a->grads + a->m + a->v + a->frozen + a->activations + a->inputs + a->scalars;
}

int64_t regc_program_frozen_bytes(const regc_program *p) { return p->frozen_bytes; }

int64_t regc_program_arena_bytes(const regc_program *p)
{
    return p->level == REGC_LEVEL_O0 ? 0 : p->arena_bytes;
}

void *regc_program_arena(const regc_program *p, int64_t *bytes)
{
    *bytes = p->arena ? p->arena_bytes : 0;
    return p->arena;
}

int regc_program_update(regc_program *p)
{
    if (!p->ptr)
        return regc_error(REGC_ERR_ARG, "step program: update before bind");
    if (p->forward_only)
        return regc_error(REGC_ERR_ARG, "step program: a forward-only program has no update");
    for (int i = 0; i < p->n_update; i++)
        for (int k = 0; k < p->update[i].n_refs; k++)
            if (!p->ptr[p->update[i].refs[k].buf])
                return regc_error(REGC_ERR_ARG,
                                  "step program: the update needs the parameter, gradient, m and v "
                                  "blocks bound");
    if (capturable(p, p->update, p->n_update)) {
        const int rc = run_phase(p, PHASE_UPDATE, p->update, p->n_update);
        return rc ? rc : p->be->sync(p->be);
    }
    int rc = REGC_OK;
    void *ptr[REGC_INSTR_MAX_REFS];
    for (int i = 0; i < p->n_update && rc == REGC_OK; i++) {
        const regc_instr *in = &p->update[i];
        resolve(p->ptr, in, ptr);
        if (p->offload && in->kernel == K_ADAMW) { /* once its copies have landed */
            if (p->host_be != p->be && p->host_be->begin_run)
                p->host_be->begin_run(p->host_be);
            if ((rc = p->be->sync(p->be)) == REGC_OK)
                rc = run_adamw(p, p->host_be, in, ptr);
        } else {
            rc = run_instr(p, in, ptr);
        }
    }
    return rc ? rc : p->be->sync(p->be);
}

const float *regc_program_loss(const regc_program *p)
{
    return p->ptr && p->ptr[p->loss.buf] ? (const float *)(p->ptr[p->loss.buf] + p->loss.off)
                                         : NULL;
}

/* ---------------------------------------------------------------- dump */

void regc_program_dump(const regc_program *p, FILE *f)
{
    static const char *const kinds[] = {
        [BUF_ARENA] = "arena",     [BUF_PARAMS] = "params", [BUF_GRADS] = "grads",
        [BUF_INPUT] = "input",     [BUF_M] = "m",           [BUF_V] = "v",
        [BUF_SCALARS] = "scalars", [BUF_HOST] = "host",     [BUF_FROZEN] = "frozen"};
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
                fprintf(f, "%5d  call %s %s (piece %d):", i, r->name,
                        s->backward ? "backward" : "forward", s->piece);
                for (int k = 0; k < r->n_slots; k++)
                    if (r->slots[k].kind != SLOT_TEMP && r->slots[k].kind != SLOT_SAVED &&
                        s->bind[k].buf >= 0)
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
    if (p->n_update)
        fprintf(f, "# update\n");
    for (int i = 0; i < p->n_update; i++) {
        fprintf(f, "%5d  ", i);
        regc_instr_dump(&p->update[i], f);
    }
    fprintf(f, "# buffers\n");
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        if (x->first < 0 && x->kind == BUF_ARENA)
            continue;
        fprintf(f, "b%d %s bytes=%lld offset=%lld live=%d..%d\n", b,
                (unsigned)x->kind < sizeof kinds / sizeof *kinds ? kinds[x->kind] : "?",
                (long long)x->bytes, (long long)x->offset, x->first, x->last);
    }
}
