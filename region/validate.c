/* validate.c — a compiled region or step program checked against its own
 * tables before it may run (validate.h).
 *
 * The rule of each kernel (regc_instr_extent_of, instr_extent.c) turns an
 * instruction's sizes into the bytes each operand's kernel call reads or
 * writes from its reference; every check here composes it with the memory
 * a reference resolves to: a slot of the region, a buffer of the program,
 * or, for a lazy call, the buffer a slot is bound to plus the binding's
 * offset. Sizes are bounded by REGC_VALIDATE_SIZE_LIMIT first, so sums and
 * products of two of them cannot overflow. */
#include <stdlib.h>
#include <string.h>

#include "validate.h"

#define SIZE_LIMIT REGC_VALIDATE_SIZE_LIMIT
#define F32 ((int64_t)sizeof(float))

/* ---------------------------------------------------------------- regions */

static int64_t add_sizes(int64_t a, int64_t b)
{
    int64_t v;
    return a < 0 || b < 0 || __builtin_add_overflow(a, b, &v) ? INT64_MAX : v;
}

/* Do `bytes` from `off` fit in `size`? */
static int fits(int64_t off, int64_t bytes, int64_t size)
{
    return off >= 0 && bytes >= 0 && add_sizes(off, bytes) <= size;
}

/* The slot a formal's map names is that formal's, of that kind. */
static int check_map(const regc_compiled_region *r, const int *map, int n, regc_slot_kind kind,
                     const char *what)
{
    for (int k = 0; k < n; k++) {
        int s = map[k];
        if (s < -1 || s >= r->n_slots ||
            (s >= 0 && (r->slots[s].kind != kind || r->slots[s].index != k)))
            return regc_error(REGC_ERR_FORMAT, "region %s: the %s slot of formal %d is slot %d",
                              r->name, what, k, s);
    }
    return REGC_OK;
}

static int check_slots(const regc_compiled_region *r)
{
    int rc;
    if ((rc = check_map(r, r->in_slot, r->n_in, SLOT_IN, "input")) ||
        (rc = check_map(r, r->seed_slot, r->n_in, SLOT_SEED, "seed")) ||
        (rc = check_map(r, r->din_slot, r->n_in, SLOT_DIN, "input gradient")) ||
        (rc = check_map(r, r->out_slot, r->n_out, SLOT_OUT, "output")) ||
        (rc = check_map(r, r->dout_slot, r->n_out, SLOT_DOUT, "output gradient")))
        return rc;
    if (r->saved_bytes < 0 || r->saved_bytes > SIZE_LIMIT || r->scratch_bytes < 0 ||
        r->scratch_bytes > SIZE_LIMIT)
        return regc_error(REGC_ERR_FORMAT, "region %s: saved or scratch bytes out of range",
                          r->name);
    for (int s = 0; s < r->n_slots; s++) {
        const regc_slot *x = &r->slots[s];
        const int *map = x->kind == SLOT_IN     ? r->in_slot
                         : x->kind == SLOT_SEED ? r->seed_slot
                         : x->kind == SLOT_DIN  ? r->din_slot
                         : x->kind == SLOT_OUT  ? r->out_slot
                         : x->kind == SLOT_DOUT ? r->dout_slot
                                                : NULL;
        int n = x->kind == SLOT_OUT || x->kind == SLOT_DOUT ? r->n_out : r->n_in;
        if ((unsigned)x->kind > SLOT_TEMP ||
            (map && (x->index < 0 || x->index >= n || map[x->index] != s)))
            return regc_error(REGC_ERR_FORMAT, "region %s: slot %d is no formal's it names",
                              r->name, s);
        if (x->bytes < 0 || x->bytes > SIZE_LIMIT || x->offset < 0 || x->offset > SIZE_LIMIT ||
            x->offset % 4 || x->alias_off % 4)
            return regc_error(REGC_ERR_FORMAT, "region %s: slot %d's sizes out of range", r->name,
                              s);
        /* a view lies inside what it views, and views end at a slot of its own */
        int a = s, hops = 0;
        while (a >= 0 && hops <= r->n_slots) {
            const regc_slot *v = &r->slots[a];
            if (v->alias >= r->n_slots || v->alias < -1 ||
                (v->alias >= 0 && !fits(v->alias_off, v->bytes, r->slots[v->alias].bytes)))
                return regc_error(REGC_ERR_FORMAT, "region %s: slot %d views outside slot %d",
                                  r->name, a, v->alias);
            a = v->alias, hops++;
        }
        if (a >= 0)
            return regc_error(REGC_ERR_FORMAT, "region %s: slot %d's views form a cycle", r->name,
                              s);
    }
    return REGC_OK;
}

/* One instruction of a region: its operands inside the slots they name. */
static int check_region_instr(const regc_compiled_region *r, const regc_instr *in, int backward,
                              int i, char *used)
{
    regc_instr_extent e;
    const char *pass = backward ? "backward" : "forward";
    if (regc_instr_extent_of(in, 1, &e))
        return regc_error(REGC_ERR_FORMAT, "region %s: %s instruction %d: %s", r->name, pass, i,
                          regc_error_message());
    if (in->kernel > K_REGION_LAST || in->signal)
        return regc_error(REGC_ERR_FORMAT, "region %s: %s instruction %d: %s inside a region",
                          r->name, pass, i, regc_kernel_name(in->kernel));
    if (in->kernel == K_EW && (in->ew < r->ew || in->ew >= r->ew + r->n_ew))
        return regc_error(REGC_ERR_FORMAT, "region %s: %s instruction %d: a foreign fused chain",
                          r->name, pass, i);
    for (int k = 0; k < in->n_refs; k++) {
        int s = in->refs[k].buf;
        if (s < 0) {
            if (s != REGC_REF_NONE || (e.required >> k & 1))
                return regc_error(REGC_ERR_FORMAT,
                                  "region %s: %s instruction %d (%s): operand %d is missing",
                                  r->name, pass, i, regc_kernel_name(in->kernel), k);
            continue;
        }
        const regc_slot *x = s < r->n_slots ? &r->slots[s] : NULL;
        /* a forward call binds no gradient; instructions name slots, not views */
        int grad = x && (x->kind == SLOT_DOUT || x->kind == SLOT_SEED || x->kind == SLOT_DIN);
        if (!x || x->alias >= 0 || (grad && !backward) ||
            ((e.ids >> k & 1) && x->kind != SLOT_IN) || in->refs[k].off % 4 ||
            !fits(in->refs[k].off, e.bytes[k], x->bytes))
            return regc_error(REGC_ERR_FORMAT,
                              "region %s: %s instruction %d (%s): operand %d, %lld bytes at "
                              "%lld, does not fit slot %d",
                              r->name, pass, i, regc_kernel_name(in->kernel), k,
                              (long long)e.bytes[k], (long long)in->refs[k].off, s);
        used[s] = 1;
    }
    return REGC_OK;
}

/* What a pass reads was written before it: a temporary earlier in the
 * same pass, a saved slot in the forward (the backward reads it), so a
 * recomputation that reads what it never made is refused. written[]:
 * [n_slots] state kept from the forward into the backward. */
static int check_reads_written(const regc_compiled_region *r, const regc_instr *ins, int n,
                               int backward, char *written)
{
    for (int s = 0; s < r->n_slots; s++)
        if (r->slots[s].kind == SLOT_TEMP)
            written[s] = 0; /* a temporary lives within one pass */
    for (int i = 0; i < n; i++) {
        const regc_instr *in = &ins[i];
        for (int k = 0; k < in->n_refs; k++) {
            const int s = in->refs[k].buf;
            if (s < 0 || regc_instr_writes(in, k) || written[s])
                continue;
            const regc_slot_kind kind = r->slots[s].kind;
            if (kind == SLOT_TEMP || kind == SLOT_SAVED || (kind == SLOT_OUT && backward) ||
                kind == SLOT_DIN)
                return regc_error(REGC_ERR_FORMAT,
                                  "region %s: %s instruction %d (%s) reads slot %d, which nothing "
                                  "wrote before it",
                                  r->name, backward ? "backward" : "forward", i,
                                  regc_kernel_name(in->kernel), s);
        }
        for (int k = 0; k < in->n_refs; k++)
            if (in->refs[k].buf >= 0 && regc_instr_writes(in, k))
                written[in->refs[k].buf] = 1;
    }
    return REGC_OK;
}

int regc_region_validate(const regc_compiled_region *r)
{
    int rc = check_slots(r);
    if (rc)
        return rc;
    char *used = calloc((size_t)r->n_slots + 1, 1);
    if (!used)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    for (int i = 0; i < r->n_fwd && rc == REGC_OK; i++)
        rc = check_region_instr(r, &r->fwd[i], 0, i, used);
    for (int i = 0; i < r->n_bwd && rc == REGC_OK; i++)
        rc = check_region_instr(r, &r->bwd[i], 1, i, used);
    char *written = rc == REGC_OK ? calloc((size_t)r->n_slots + 1, 1) : NULL;
    if (rc == REGC_OK && !written)
        rc = regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    if (rc == REGC_OK && (rc = check_reads_written(r, r->fwd, r->n_fwd, 0, written)) == REGC_OK)
        rc = check_reads_written(r, r->bwd, r->n_bwd, 1, written);
    free(written);
    /* what a call binds to the pass's scratch and the instance's saved block */
    for (int s = 0; s < r->n_slots && rc == REGC_OK; s++) {
        const regc_slot *x = &r->slots[s];
        if (used[s] && ((x->kind == SLOT_TEMP && !fits(x->offset, x->bytes, r->scratch_bytes)) ||
                        (x->kind == SLOT_SAVED && !fits(x->offset, x->bytes, r->saved_bytes))))
            rc = regc_error(REGC_ERR_FORMAT, "region %s: slot %d lies outside the %s block",
                            r->name, s, x->kind == SLOT_TEMP ? "scratch" : "saved");
    }
    free(used);
    return rc;
}

int regc_region_validate_spec(const regc_compiled_region *r, const regc_graph *g,
                              const regc_region_spec *s)
{
    if (r->n_in != s->n_in || r->n_out != s->n_out)
        return regc_error(REGC_ERR_FORMAT,
                          "region %s: %d inputs and %d outputs, compiled for %d and %d", s->name,
                          r->n_in, r->n_out, s->n_in, s->n_out);
    /* a formal's slots are bound to memory of the formal's size */
    for (int k = 0; k < r->n_in + r->n_out; k++) {
        int in = k < r->n_in, f = in ? k : k - r->n_in;
        const regc_tensor *t = regc_graph_tensor(g, in ? s->in[f] : s->out[f]);
        int slots[3] = {in ? r->in_slot[f] : r->out_slot[f], in ? r->seed_slot[f] : r->dout_slot[f],
                        in ? r->din_slot[f] : -1};
        /* a parameter held in bf16 (its input slot) holds half, one in NF4
         * its blob */
        const int held = in && s->in_held ? s->in_held[f] : 0;
        for (int j = 0; j < 3; j++) {
            if (slots[j] < 0)
                continue;
            const regc_slot *x = &r->slots[slots[j]];
            const int half = held == REGC_HELD_BF16 && j == 0;
            const int nf4 = (held == REGC_HELD_NF4 || held == REGC_HELD_NF4_BF16) && j == 0;
            const int64_t want = half ? regc_tensor_bytes(t) / 2
                                 : nf4
                                     ? regc_frozen_kind_bytes(REGC_FROZEN_NF4, regc_tensor_numel(t))
                                     : regc_tensor_bytes(t);
            if (x->bf16 != half || x->bytes != want)
                return regc_error(
                    REGC_ERR_FORMAT,
                    "region %s: slot %d of %s %d holds %lld bytes%s, the tensor %lld%s", s->name,
                    slots[j], in ? "input" : "output", f, (long long)x->bytes,
                    x->bf16 ? " in bf16" : "", (long long)regc_tensor_bytes(t),
                    half  ? " held in bf16"
                    : nf4 ? " held in NF4"
                          : "");
        }
    }
    /* ids are read from int32 formal inputs only */
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        const regc_instr *in = regc_region_instr(r, i);
        regc_instr_extent e;
        if (regc_instr_extent_of(in, 1, &e))
            return REGC_ERR_FORMAT;
        for (int k = 0; k < in->n_refs; k++)
            if ((e.ids >> k & 1) &&
                regc_graph_tensor(g, s->in[r->slots[in->refs[k].buf].index])->dtype != REGC_I32)
                return regc_error(REGC_ERR_FORMAT,
                                  "region %s: instruction %d reads ids from a formal that is not "
                                  "int32",
                                  s->name, i);
    }
    return REGC_OK;
}

/* ---------------------------------------------------------------- step programs */

typedef struct {
    const regc_program *p;
    char *used; /* [n_bufs] named by something that runs */
    const char *where;
    int index; /* instruction or step */
    int step;  /* lazy step (O0: buffers must be live there), or -1 */
} prog_ctx;

static int prog_fail(const prog_ctx *c, const regc_instr *in, int k, const char *why, int buf,
                     int64_t off, int64_t bytes)
{
    return regc_error(REGC_ERR_FORMAT,
                      "step program: %s %d (%s): operand %d %s (buffer %d, %lld bytes at %lld)",
                      c->where, c->index, regc_kernel_name(in->kernel), k, why, buf,
                      (long long)bytes, (long long)off);
}

/* Operand k of `in` resolved to (buf, off): inside the buffer, a token
 * input where ids are read, and at O0 allocated at this step. */
static int check_operand(prog_ctx *c, const regc_instr *in, const regc_instr_extent *e, int k,
                         int buf, int64_t off)
{
    const regc_program *p = c->p;
    if (buf < 0 || buf >= p->n_bufs)
        return (e->required >> k & 1) || buf != REGC_REF_NONE
                   ? prog_fail(c, in, k, "names no buffer", buf, off, e->bytes[k])
                   : REGC_OK;
    const regc_buf *x = &p->bufs[buf];
    if (!fits(off, e->bytes[k], x->bytes))
        return prog_fail(c, in, k, "does not fit its buffer", buf, off, e->bytes[k]);
    /* kernels read floats and ids, the f64 all-reduce doubles: aligned */
    int64_t at = add_sizes(x->kind == BUF_INPUT ? 0 : x->offset, off);
    int align = in->kernel == K_ALLREDUCE && in->d[1] ? 8 : regc_instr_ref_bf16(in, k) ? 2 : 4;
    if (at % align)
        return prog_fail(c, in, k, "is misaligned", buf, off, e->bytes[k]);
    if ((e->ids >> k & 1) && (x->kind != BUF_INPUT ||
                              regc_graph_tensor(p->graph, p->inputs[x->offset])->dtype != REGC_I32))
        return prog_fail(c, in, k, "reads ids from a buffer that is no int32 input", buf, off,
                         e->bytes[k]);
    if (p->level == REGC_LEVEL_O0 && x->kind == BUF_ARENA &&
        (c->step < 0 || x->first < 0 || x->first > c->step || x->last < c->step))
        return prog_fail(c, in, k, "is not allocated when it runs", buf, off, e->bytes[k]);
    c->used[buf] = 1;
    return REGC_OK;
}

/* A program-level instruction: its operands name buffers directly. */
static int check_instr(prog_ctx *c, const regc_instr *in)
{
    regc_instr_extent e;
    if (regc_instr_extent_of(in, c->p->ranks, &e))
        return regc_error(REGC_ERR_FORMAT, "step program: %s %d: %s", c->where, c->index,
                          regc_error_message());
    if (in->kernel == K_EW) { /* a fused chain of one of the program's regions */
        int found = 0;
        for (int i = 0; i < c->p->n_regions && !found; i++) {
            const regc_compiled_region *r = c->p->regions[i];
            found = in->ew >= r->ew && in->ew < r->ew + r->n_ew;
        }
        if (!found)
            return regc_error(REGC_ERR_FORMAT, "step program: %s %d: a foreign fused chain",
                              c->where, c->index);
    }
    int rc = REGC_OK;
    for (int k = 0; k < in->n_refs && rc == REGC_OK; k++)
        rc = check_operand(c, in, &e, k, in->refs[k].buf, in->refs[k].off);
    return rc;
}

/* A lazy call: the region's pass with its slots bound to buffers. */
static int check_call(prog_ctx *c, const lazy_step *s)
{
    const regc_program *p = c->p;
    const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
    const regc_instr *ins = s->backward ? r->bwd : r->fwd;
    int n = s->backward ? r->n_bwd : r->n_fwd, rc = REGC_OK;
    for (int j = 0; j < n && rc == REGC_OK; j++) {
        regc_instr_extent e;
        if (regc_instr_extent_of(&ins[j], p->ranks, &e))
            return REGC_ERR_FORMAT; /* the region's own check said why */
        for (int k = 0; k < ins[j].n_refs && rc == REGC_OK; k++) {
            int sl = ins[j].refs[k].buf;
            if (sl < 0)
                continue;
            regc_ref b = s->bind[sl];
            int64_t off = add_sizes(b.off, ins[j].refs[k].off);
            /* a slot an instruction names must be bound: absent is no memory */
            rc = check_operand(c, &ins[j], &e, k, b.buf < 0 ? INT32_MIN : b.buf, off);
        }
    }
    return rc;
}

/* Does wait w name the transfer `start` began: its kind and buffers? */
static int waits_for(const regc_instr *w, const regc_instr *start)
{
    if (w->d[1] != start->kernel || w->n_refs != start->n_refs)
        return 0;
    for (int k = 0; k < w->n_refs; k++)
        if (w->refs[k].buf != start->refs[k].buf || w->refs[k].off != start->refs[k].off)
            return 0;
    return 1;
}

/* Each asynchronous collective starts once, before the wait that names it. */
static int check_signals(const regc_program *p)
{
    if (p->n_signals < 0 || p->n_signals > p->n_instr)
        return regc_error(REGC_ERR_FORMAT, "step program: %d signals for %d instructions",
                          p->n_signals, p->n_instr);
    int *start = malloc(((size_t)p->n_signals + 1) * sizeof *start); /* -1, or where it started */
    unsigned char *state = calloc((size_t)p->n_signals + 1, 1);      /* 1 started, 2 waited */
    if (!start || !state) {
        free(start), free(state);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    int rc = REGC_OK;
    for (int i = 0; i < p->n_instr && rc == REGC_OK; i++) {
        const regc_instr *in = &p->instr[i];
        int k = in->signal;
        if (k < 0 || k > p->n_signals)
            rc = regc_error(REGC_ERR_FORMAT, "step program: instruction %d: signal %d of %d", i, k,
                            p->n_signals);
        else if (k && in->kernel != K_COMM_WAIT && state[k])
            rc = regc_error(REGC_ERR_FORMAT, "step program: signal %d started twice", k);
        else if (k && in->kernel == K_COMM_WAIT && state[k] != 1)
            rc =
                regc_error(REGC_ERR_FORMAT, "step program: a wait for signal %d, not in flight", k);
        else if (k && in->kernel == K_COMM_WAIT && !waits_for(in, &p->instr[start[k]]))
            /* the wait names what it waits for: the run and the memory plan
             * read its kind and buffers */
            rc = regc_error(REGC_ERR_FORMAT,
                            "step program: instruction %d waits for signal %d as another "
                            "transfer than instruction %d started",
                            i, k, start[k]);
        else if (k) {
            if (in->kernel != K_COMM_WAIT)
                start[k] = i;
            state[k]++;
        }
    }
    free(start), free(state);
    return rc;
}

/* Is ref k of `in` in host memory (an offloaded update's own, or the
 * moments that live there)? */
static int on_host(const regc_program *p, const regc_instr *in, int k)
{
    const regc_buf_kind kind = p->bufs[in->refs[k].buf].kind;
    return kind == BUF_HOST || (p->offload && (kind == BUF_M || kind == BUF_V));
}

/* Host memory is touched only where the host touches it: an offloaded
 * update's AdamW (every operand), the copies' host side; a device kernel
 * given a host pointer would fault on a GPU. Buffers are checked first. */
static int check_host(const regc_program *p)
{
    for (int i = 0; i < p->n_instr + p->n_update; i++) {
        const int update = i >= p->n_instr;
        const regc_instr *in = update ? &p->update[i - p->n_instr] : &p->instr[i];
        for (int k = 0; k < in->n_refs && k < REGC_INSTR_MAX_REFS; k++) {
            if (in->refs[k].buf < 0 || in->refs[k].buf >= p->n_bufs)
                continue; /* the operand checks say what is wrong with it */
            const int copy = in->kernel == K_COMM_WAIT ? (int)in->d[1] : in->kernel;
            const int want = copy == K_COPY_D2H      ? k == 0
                             : copy == K_COPY_H2D    ? k == 1
                             : in->kernel == K_ADAMW ? p->offload
                                                     : 0;
            if (on_host(p, in, k) != want)
                return regc_error(REGC_ERR_FORMAT,
                                  "step program: %s %d: operand %d is %s host memory",
                                  update ? "update" : "instruction", update ? i - p->n_instr : i, k,
                                  want ? "not in" : "in");
        }
    }
    return REGC_OK;
}

/* Buffers against the blocks, the inputs and the scalar block. */
static int check_buffers(const regc_program *p)
{
    for (int i = 0; i < p->n_inputs; i++) {
        const regc_tensor *t = regc_graph_tensor(p->graph, p->inputs[i]);
        int64_t n = (int64_t)regc_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim && n <= SIZE_LIMIT; d++)
            n = t->shape[d] < 0 || t->shape[d] > SIZE_LIMIT ? INT64_MAX : n * t->shape[d];
        if (n > SIZE_LIMIT)
            return regc_error(REGC_ERR_FORMAT, "step program: input %s is too large", t->name);
    }
    if (p->block_bytes < 0 || p->block_bytes > SIZE_LIMIT || p->block_bytes % F32)
        return regc_error(REGC_ERR_FORMAT, "step program: blocks of %lld bytes",
                          (long long)p->block_bytes);
    if (p->frozen_bytes < 0 || p->frozen_bytes > SIZE_LIMIT)
        return regc_error(REGC_ERR_FORMAT, "step program: a frozen block of %lld bytes",
                          (long long)p->frozen_bytes);
    if (p->layout && p->block_bytes != p->layout->shard_floats * F32)
        return regc_error(REGC_ERR_FORMAT,
                          "step program: blocks of %lld bytes for shards of %lld floats",
                          (long long)p->block_bytes, (long long)p->layout->shard_floats);
    int whole = 0;
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        int block =
            x->kind == BUF_PARAMS || x->kind == BUF_GRADS || x->kind == BUF_M || x->kind == BUF_V;
        int bad = x->bytes < 0 || x->bytes > SIZE_LIMIT || x->offset < 0 ||
                  x->offset > SIZE_LIMIT || (unsigned)x->kind > BUF_FROZEN ||
                  (x->kind == BUF_HOST && x->offset != 0);
        if (!bad && x->kind == BUF_HOST && !p->offload && !p->offload_activation)
            return regc_error(REGC_ERR_FORMAT,
                              "step program: buffer %d is host memory, but nothing is offloaded",
                              b);
        if (!bad && block && !p->forward_only)
            bad = !fits(x->offset, x->bytes, p->block_bytes);
        if (!bad && x->kind == BUF_FROZEN)
            bad = !fits(x->offset, x->bytes, p->frozen_bytes);
        if (!bad && x->kind == BUF_INPUT)
            bad = x->offset >= p->n_inputs ||
                  x->bytes != regc_tensor_bytes(regc_graph_tensor(p->graph, p->inputs[x->offset]));
        if (!bad && x->kind == BUF_SCALARS)
            bad = x->offset != 0 || x->bytes != (int64_t)sizeof(regc_step_scalars);
        if (bad)
            return regc_error(REGC_ERR_FORMAT,
                              "step program: buffer %d (%lld bytes at %lld) lies outside its block",
                              b, (long long)x->bytes, (long long)x->offset);
        whole |= x->kind == BUF_PARAMS && x->offset == 0 && x->bytes == p->block_bytes;
    }
    if (!p->forward_only && !whole)
        return regc_error(REGC_ERR_FORMAT, "step program: no buffer spans the %lld-byte blocks",
                          (long long)p->block_bytes);
    return REGC_OK;
}

/* The shard layout as the compiler lays it out: every parameter in a unit,
 * the model's block covered by them. */
static int check_layout(const regc_program *p)
{
    const regc_shard_layout *l = p->layout;
    if ((l != NULL) != (p->zero_stage == 3))
        return regc_error(REGC_ERR_FORMAT, "step program: ZeRO stage %d %s a shard layout",
                          p->zero_stage, l ? "with" : "without");
    if (!l)
        return p->frozen_layout ? regc_error(REGC_ERR_FORMAT,
                                             "step program: a frozen block's layout without ZeRO-3")
                                : REGC_OK;
    if (l->ranks != p->ranks || l->model_floats > SIZE_LIMIT || l->shard_floats > SIZE_LIMIT)
        return regc_error(REGC_ERR_FORMAT, "step program: a shard layout of %lld floats",
                          (long long)l->model_floats);
    /* the frozen block, when sharded, is this rank's shard of it */
    const regc_shard_layout *fl = p->frozen_layout;
    if (fl && (fl->ranks != p->ranks || fl->model_floats > SIZE_LIMIT ||
               fl->shard_floats > SIZE_LIMIT || p->frozen_bytes != fl->shard_floats * F32))
        return regc_error(REGC_ERR_FORMAT,
                          "step program: a frozen block of %lld bytes for a shard of %lld words",
                          (long long)p->frozen_bytes, (long long)fl->shard_floats);
    return REGC_OK;
}

/* The arena plan: every buffer that runs inside the arena, and the arena
 * no larger than its buffers laid end to end. */
static int check_arena(const regc_program *p, const char *used)
{
    if (p->level == REGC_LEVEL_O0)
        return REGC_OK; /* allocated buffer by buffer at run time */
    int64_t sum = 0;
    for (int b = 0; b < p->n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        if (x->kind != BUF_ARENA || !used[b])
            continue;
        if (!fits(x->offset, x->bytes, p->arena_bytes))
            return regc_error(REGC_ERR_FORMAT,
                              "step program: buffer %d (%lld bytes at %lld) lies outside the "
                              "%lld-byte arena",
                              b, (long long)x->bytes, (long long)x->offset,
                              (long long)p->arena_bytes);
        sum = add_sizes(sum, add_sizes(x->bytes, 4096)); /* alignment, generously */
    }
    if (p->arena_bytes < 0 || p->arena_bytes > sum || p->lower_bound < 0 ||
        p->lower_bound > SIZE_LIMIT)
        return regc_error(REGC_ERR_FORMAT,
                          "step program: an arena of %lld bytes for %lld bytes of buffers",
                          (long long)p->arena_bytes, (long long)sum);
    return REGC_OK;
}

/* The flat program reads no activation before something wrote it: a copy
 * on the copy queue writes its destination when it is waited for, so a
 * reload read before its wait is refused too. Nothing writes the frozen
 * block. */
static int check_arena_written(const regc_program *p)
{
    char *written = calloc((size_t)p->n_bufs + 1, 1);
    if (!written)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    int rc = REGC_OK;
    for (int i = 0; i < p->n_instr && rc == REGC_OK; i++) {
        const regc_instr *in = &p->instr[i];
        const int queued = regc_instr_is_queued_copy(in);
        for (int k = 0; k < in->n_refs && rc == REGC_OK; k++) {
            const int b = in->refs[k].buf;
            if (b >= 0 && !regc_instr_writes(in, k) && p->bufs[b].kind == BUF_ARENA &&
                !written[b] && !(queued && in->kernel == K_COMM_WAIT))
                rc = regc_error(REGC_ERR_FORMAT,
                                "step program: instruction %d (%s) reads buffer %d, which nothing "
                                "wrote before it",
                                i, regc_kernel_name(in->kernel), b);
        }
        for (int k = 0; k < in->n_refs; k++)
            if (in->refs[k].buf >= 0 && regc_instr_writes(in, k) &&
                (!queued || in->kernel == K_COMM_WAIT))
                written[in->refs[k].buf] = 1;
        for (int k = 0; k < in->n_refs && rc == REGC_OK; k++)
            if (in->refs[k].buf >= 0 && regc_instr_writes(in, k) &&
                p->bufs[in->refs[k].buf].kind == BUF_FROZEN)
                rc = regc_error(REGC_ERR_FORMAT,
                                "step program: instruction %d (%s) writes the frozen block", i,
                                regc_kernel_name(in->kernel));
    }
    free(written);
    return rc;
}

int regc_program_validate(const regc_program *p)
{
    int rc = REGC_OK;
    if (p->level == REGC_LEVEL_O0 && !p->lazy)
        return regc_error(REGC_ERR_FORMAT, "step program: O0 inlined back (O0 runs lazily)");
    if ((p->lazy && p->n_instr) || (p->forward_only && p->n_update) ||
        (!p->forward_only && !p->n_update))
        return regc_error(REGC_ERR_FORMAT, "step program: phases do not match its kind");
    if ((rc = check_buffers(p)) || (rc = check_layout(p)) || (rc = check_signals(p)) ||
        (rc = check_host(p)) || (rc = check_arena_written(p)))
        return rc;
    char *used = calloc((size_t)p->n_bufs + 1, 1);
    if (!used)
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    prog_ctx c = {.p = p, .used = used, .where = "instruction", .step = -1};
    for (int i = 0; i < p->n_instr && rc == REGC_OK; i++)
        c.index = i, rc = check_instr(&c, &p->instr[i]);
    c.where = "lazy step";
    for (int i = 0; p->lazy && i < p->n_steps && rc == REGC_OK; i++) {
        const lazy_step *s = &p->steps[i];
        c.index = c.step = i;
        if (s->piece < 0 && s->instr.signal)
            rc = regc_error(REGC_ERR_FORMAT, "step program: lazy step %d: a signal", i);
        else
            rc = s->piece < 0 ? check_instr(&c, &s->instr) : check_call(&c, s);
    }
    /* the update names whole blocks and the scalars, never the arena */
    c.where = "update", c.step = -1;
    for (int i = 0; i < p->n_update && rc == REGC_OK; i++) {
        const regc_instr *in = &p->update[i];
        c.index = i;
        for (int k = 0; k < in->n_refs && rc == REGC_OK; k++)
            if (in->refs[k].buf < 0 || in->refs[k].buf >= p->n_bufs ||
                p->bufs[in->refs[k].buf].kind == BUF_ARENA || in->signal)
                rc = regc_error(REGC_ERR_FORMAT, "step program: update %d names no block", i);
        if (rc == REGC_OK)
            rc = check_instr(&c, in);
    }
    /* the loss: an activation written by the program, read after it */
    const regc_buf *loss =
        p->loss.buf >= 0 && p->loss.buf < p->n_bufs ? &p->bufs[p->loss.buf] : NULL;
    if (rc == REGC_OK &&
        (!loss || loss->kind != BUF_ARENA || !fits(p->loss.off, F32, loss->bytes) ||
         (p->level == REGC_LEVEL_O0 && (loss->first < 0 || loss->first >= p->n_steps))))
        rc = regc_error(REGC_ERR_FORMAT, "step program: the loss is no written activation");
    if (rc == REGC_OK)
        used[p->loss.buf] = 1, rc = check_arena(p, used);
    free(used);
    return rc;
}
