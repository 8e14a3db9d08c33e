/* region_bf16.c — compile.precision "bf16" on one compiled region, after
 * lowering and before its memory is planned.
 *
 * Every GEMM multiplies bf16 operands (the backend rounds A and B to bf16
 * as it reads them and sums in fp32, as torch.autocast does). Then the
 * storage: a tensor whose every reader is such a GEMM's A or B would be
 * rounded by each of them anyway, so its writer may round it once, on
 * store, and hold it in half the bytes; every GEMM then reads the very
 * values it would have rounded, and the step's bits do not change. In a
 * transformer these are the norms' outputs (the inputs of the Q/K/V and
 * MLP projections, kept for their weight gradients), the MLP's activation
 * (kept for the down projection's weight gradient), the gradients that
 * only the projections' two backward GEMMs read, and the head's logits
 * gradient.
 *
 * A slot qualifies when:
 *   - it lives inside the region (saved per instance, or temporary), so
 *     no other region reads it;
 *   - it is no view of another slot and none is a view of it;
 *   - every reader is a GEMM's A or B, and every writer can store bf16
 *     (bf16_possible: a non-accumulating GEMM's C, a norm's y, the output
 *     of a fused chain, attention or RoPE, the cross-entropy's dlogits),
 *     at a byte offset that stays 4-aligned when halved.
 * Its bytes halve, and each operand naming it is marked bf16 with its
 * offset counted in bf16 values. A lone activation (GELU, SiLU, ReLU, a
 * scale: one unary kernel, as at O0 or where nothing fused it) writing
 * such a slot becomes a fused chain of that one step, which computes the
 * same float operations and can store bf16. The instructions that read a bf16
 * operand run no in place (regc_instr_inplace_input).
 *
 * Before that, the activations autocast holds in bf16 (hold_activations):
 * a value autocast makes in bf16 is a bf16 GEMM's output (its C, its
 * epilogue's pre-activation), or what attention, RoPE, a copy, a
 * transpose or an elementwise op makes from such values alone (a bias or
 * a row's statistic beside them does not count; a residual stream's fp32
 * does: a sum with it is fp32, as torch's type promotion makes it). Such
 * a value that the backward reads (a saved slot) is rounded to bf16 once,
 * where it is made, and held so: its writer stores bf16 where its kernel
 * can (a GEMM's C, a chain's output, attention's output, RoPE's), else
 * writes an fp32 temporary that a chain of no steps then rounds into the
 * slot; its readers read bf16 where their kernel can (a bf16 GEMM's A or
 * B, a chain's input, attention's q, k, v and out), else a chain of no
 * steps widens it into an fp32 temporary first (a copy). Every reader then
 * sees the rounded value, forward and backward alike, and only one
 * instruction's widened copy is live at a time. A value read by what
 * autocast runs in fp32 (the norms, softmax, the loss) stays fp32, as
 * autocast's own upcast copy would be; so do temporaries (nothing keeps
 * them) and gradients. Unlike the storage above, this changes bits: the
 * model trains as under autocast; compile.fp32_storage turns both off.
 *
 * Under ZeRO-3 the compiler also names the parameters it gathers in bf16
 * (compile.c: those only matrix products read, in_held): their formal
 * slots are held in bf16 the same way. Every operand naming one must be a
 * GEMM's A or B, or the compile fails: the gathered unit is bf16 for every
 * region that reads it. So are a LoRA model's frozen weights held in bf16
 * (regc_tensor's REGC_FROZEN_BF16), in fp32 too: there the GEMMs that read
 * one, and they alone, multiply bf16 operands, as a bf16 base's layers do. */
#include <stdlib.h>
#include <string.h>

#include "program.h"
#include "region_internal.h"
#include "validate.h"

/* Every GEMM of the region multiplies bf16 operands. */
static void set_bf16_gemms(regc_compiled_region *r)
{
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        regc_instr *in = regc_region_instr(r, i);
        if (in->kernel == K_GEMM)
            in->bf16 = 1;
    }
}

/* The chain step an elementwise kernel is (K_UNARY, K_BINARY, K_ADD: the
 * same float operations as the step of the same name), or -1 for none. */
static int chain_step_of(const regc_instr *in)
{
    if (in->kernel == K_ADD)
        return REGC_EW_ADD;
    if (in->kernel != K_UNARY && in->kernel != K_BINARY)
        return -1;
    switch ((regc_op)in->unary) {
    case REGC_OP_GELU: return REGC_EW_GELU;
    case REGC_OP_GELU_ERF: return REGC_EW_GELU_ERF;
    case REGC_OP_SILU: return REGC_EW_SILU;
    case REGC_OP_RELU: return REGC_EW_RELU;
    case REGC_OP_SCALE: return REGC_EW_SCALE;
    case REGC_OP_MUL: return REGC_EW_MUL;
    case REGC_OP_GELU_BWD: return REGC_EW_GELU_BWD;
    case REGC_OP_SILU_BWD: return REGC_EW_SILU_BWD;
    case REGC_OP_GELU_ERF_BWD: return REGC_EW_GELU_ERF_BWD;
    case REGC_OP_RELU_BWD: return REGC_EW_RELU_BWD;
    default: return -1;
    }
}

/* May operand k of `in` be bf16 for the storage that keeps the bits: an
 * output its kernel (or its kernel as a chain) writes rounded, or an
 * operand of a bf16 GEMM, which rounds what it reads anyway? */
static int bf16_possible(const regc_instr *in, int k)
{
    if (!regc_instr_writes(in, k) && in->kernel != K_GEMM)
        return 0;
    return regc_instr_bf16_allowed(in, k) || (k == 0 && chain_step_of(in) >= 0);
}

/* Room for n more chains in the region's table: it grows, and the
 * instructions pointing into it follow (so take room before copying
 * instructions aside). */
static int reserve_chains(regc_compiled_region *r, int n)
{
    if (r->n_ew + n <= r->ew_cap)
        return REGC_OK;
    const int cap = 2 * r->ew_cap + n;
    regc_ew_program *grown = malloc((size_t)cap * sizeof *grown);
    if (!grown)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    memcpy(grown, r->ew, (size_t)r->n_ew * sizeof *grown);
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        regc_instr *in = regc_region_instr(r, i);
        if (in->ew)
            in->ew = grown + (in->ew - r->ew);
    }
    free(r->ew);
    r->ew = grown, r->ew_cap = cap;
    return REGC_OK;
}

/* A new chain in the region's table; NULL when out of memory (reported). */
static regc_ew_program *new_chain(regc_compiled_region *r)
{
    if (reserve_chains(r, 1))
        return NULL;
    regc_ew_program *p = &r->ew[r->n_ew++];
    memset(p, 0, sizeof *p);
    return p;
}

/* An elementwise kernel (out, x[, y]; n) as the chain of its one step. */
static int to_chain(regc_compiled_region *r, regc_instr *in)
{
    const int op = chain_step_of(in), n_in = in->n_refs - 1;
    regc_ew_program *p = new_chain(r);
    if (!p)
        return REGC_ERR_MEMORY;
    *p = (regc_ew_program){.n_inputs = n_in, .n_steps = 1, .n_outputs = 1};
    p->steps[0] =
        (regc_ew_step){.op = (uint8_t)op, .a = 0, .b = (uint8_t)(n_in > 1), .value = in->f};
    p->out_reg[0] = n_in;
    in->kernel = K_EW;
    in->unary = 0;
    in->f = 0.0f;
    in->ew = p;
    return REGC_OK;
}

/* ---------------------------------------------------------------- the activations autocast holds
 * in bf16 */

#define LOWP_UNWRITTEN 2

/* Is output k of forward instruction `in` a value autocast makes in bf16,
 * lowp[] saying so of what it reads (header)? */
static int makes_lowp(const regc_instr *in, int k, const char *lowp)
{
#define LOWP(j) (in->refs[j].buf >= 0 && lowp[in->refs[j].buf] == 1)
    switch (in->kernel) {
    case K_GEMM: return in->bf16 && (k == 0 || k == 4); /* C, the pre-activation */
    case K_ATTN_FWD: return k == 0 && LOWP(2) && LOWP(3) && LOWP(4);
    case K_ROPE:
    case K_COPY:
    case K_COPY_2D:
    case K_TRANSPOSE:
    case K_UNARY:
    case K_BIAS_ADD: return LOWP(1);
    case K_BINARY:
    case K_ADD: return LOWP(1) && LOWP(2);
    case K_EW: {
        int any = 0;
        for (int i = 0; i < in->ew->n_inputs; i++) {
            if (in->ew->period[i] > 0 || in->ew->inner[i] > 1)
                continue; /* a bias, a row's statistic */
            if (!LOWP(in->n_out + i))
                return 0;
            any = 1;
        }
        return any;
    }
    default: return 0;
    }
#undef LOWP
}

/* lowp[s] = 1 where the forward makes slot s's value in bf16 (every
 * writer does), else 0. */
static void find_lowp(const regc_compiled_region *r, char *lowp)
{
    memset(lowp, LOWP_UNWRITTEN, (size_t)r->n_slots);
    for (int i = 0; i < r->n_fwd; i++) {
        const regc_instr *in = &r->fwd[i];
        for (int k = 0; k < in->n_refs; k++) {
            const int s = in->refs[k].buf;
            if (s < 0 || !regc_instr_writes(in, k))
                continue;
            const int v = makes_lowp(in, k, lowp);
            lowp[s] = (char)(lowp[s] == LOWP_UNWRITTEN ? v : lowp[s] == 1 && v);
        }
    }
    for (int s = 0; s < r->n_slots; s++)
        lowp[s] = lowp[s] == 1;
}

/* Kernels autocast runs on bf16 values as they are: they may read one
 * held in bf16 (natively or widened). The rest (norms, softmax, the loss)
 * run in fp32 on an upcast copy of their own. */
static int runs_on_bf16(regc_kernel k)
{
    switch (k) {
    case K_GEMM:
    case K_EW:
    case K_UNARY:
    case K_BINARY:
    case K_ADD:
    case K_BIAS_ADD:
    case K_ROPE:
    case K_ATTN_FWD:
    case K_ATTN_BWD:
    case K_COPY:
    case K_COPY_2D:
    case K_TRANSPOSE: return 1;
    default: return 0;
    }
}

/* Does `in` read operand k held in bf16 itself? */
static int reads_bf16(const regc_instr *in, int k)
{
    return in->refs[k].off % 8 == 0 && !regc_instr_writes(in, k) && regc_instr_bf16_allowed(in, k);
}

/* Does `in` write operand k in bf16 itself? */
static int writes_bf16(const regc_instr *in, int k)
{
    return in->refs[k].off % 8 == 0 && regc_instr_writes(in, k) && regc_instr_bf16_allowed(in, k);
}

/* hold[s] = 1 for the saved slots to hold in bf16 (header): lowp, whole
 * (no views), made by one forward instruction that writes all of it and
 * reads none of it, then only read, by kernels that run on bf16 values. */
static int find_held(const regc_compiled_region *r, const char *lowp, char *hold)
{
    int *writer = malloc(((size_t)r->n_slots + 1) * sizeof *writer), any = 0;
    if (!writer)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    for (int s = 0; s < r->n_slots; s++) {
        const regc_slot *x = &r->slots[s];
        hold[s] = x->kind == SLOT_SAVED && lowp[s] && x->alias < 0 && !x->bf16 && x->bytes > 0 &&
                  x->bytes % 4 == 0;
        writer[s] = -1;
    }
    for (int s = 0; s < r->n_slots; s++)
        if (r->slots[s].alias >= 0)
            hold[r->slots[s].alias] = 0;
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        const regc_instr *in = regc_region_instr(r, i);
        regc_instr_extent e;
        const int sized = regc_instr_extent_of(in, 1, &e) == REGC_OK;
        for (int k = 0; k < in->n_refs; k++) {
            const int s = in->refs[k].buf;
            if (s < 0 || !hold[s])
                continue;
            if (regc_instr_writes(in, k)) {
                /* one writer, forward, of the whole slot, not accumulating */
                if (writer[s] >= 0 || i >= r->n_fwd || in->accumulate || in->refs[k].off != 0 ||
                    !sized || e.bytes[k] != r->slots[s].bytes)
                    hold[s] = 0;
                writer[s] = i;
            } else if (!runs_on_bf16((regc_kernel)in->kernel) || writer[s] < 0 || writer[s] == i) {
                hold[s] = 0; /* read in fp32, before it is made, or in place */
            }
        }
    }
    for (int s = 0; s < r->n_slots; s++)
        any |= hold[s] = (char)(hold[s] && writer[s] >= 0);
    free(writer);
    return any;
}

/* A forward GEMM that computes GELU in its epilogue from a held
 * pre-activation (its aux): the GEMM writes the pre-activation alone, held
 * in bf16, and a chain computes GELU from the held value, as op by op
 * (a GEMM, then GELU reading what it stored) and autocast do. out: the
 * GEMM, then the chain; returns how many (1: `in` is no such GEMM). */
static int split_gelu(regc_compiled_region *r, const regc_instr *in, const char *hold, int n_hold,
                      regc_instr *out)
{
    out[0] = *in;
    const int aux = in->refs[4].buf, epi = in->epilogue;
    if (in->kernel != K_GEMM || (epi != REGC_EPI_GELU_AUX && epi != REGC_EPI_BIAS_GELU_AUX) ||
        aux < 0 || aux >= n_hold || !hold[aux])
        return 1;
    regc_ew_program *g = &r->ew[r->n_ew++]; /* reserved */
    *g = (regc_ew_program){.n_inputs = 1, .n_steps = 1, .n_outputs = 1, .out_reg = {1}};
    g->steps[0] = (regc_ew_step){.op = REGC_EW_GELU, .a = 0};
    out[0].epilogue = epi == REGC_EPI_BIAS_GELU_AUX ? REGC_EPI_BIAS : REGC_EPI_NONE;
    out[0].refs[0] = in->refs[4];
    out[0].refs[4] = (regc_ref){REGC_REF_NONE, 0};
    out[1] = (regc_instr){.kernel = K_EW, .n_refs = 2, .n_out = 1, .ew = g, .node = in->node};
    out[1].refs[0] = in->refs[0];
    out[1].refs[1] = in->refs[4];
    out[1].d[0] = r->slots[aux].bytes / 4;
    return 2;
}

/* A chain that writes a held slot from a step's register that later steps
 * read too: they read it rounded, as op by op they would read it back from
 * the slot (a ROUND_BF16 step after that register's, the later reads and
 * the output moved to it). A chain with no room for the step is refused. */
static int round_inside(regc_compiled_region *r, const regc_instr *in, const char *hold, int n_hold)
{
    regc_ew_program *p = &r->ew[in->ew - r->ew];
    for (int k = 0; k < p->n_outputs; k++) {
        const int s = in->refs[k].buf, reg = p->out_reg[k], at = reg - p->n_inputs + 1;
        int later = 0;
        for (int j = at; j < p->n_steps; j++)
            later |=
                p->steps[j].a == reg || (regc_ew_binary(p->steps[j].op) && p->steps[j].b == reg);
        if (s < 0 || s >= n_hold || !hold[s] || reg < p->n_inputs || !later)
            continue;
        if (p->n_steps >= REGC_EW_MAX_STEPS)
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "region %s: a fused chain of %d steps has no room to round a value "
                              "held in bf16",
                              r->name, p->n_steps);
        const int rounded = p->n_inputs + at; /* the new step's register */
        for (int j = p->n_steps; j > at; j--)
            p->steps[j] = p->steps[j - 1];
        p->steps[at] = (regc_ew_step){.op = REGC_EW_ROUND_BF16, .a = (uint8_t)reg};
        p->n_steps++;
        for (int j = at + 1; j < p->n_steps; j++) { /* registers past it move up one */
            regc_ew_step *st = &p->steps[j];
            st->a = (uint8_t)(st->a == reg ? rounded : st->a >= rounded ? st->a + 1 : st->a);
            st->b = (uint8_t)(st->b == reg ? rounded : st->b >= rounded ? st->b + 1 : st->b);
        }
        for (int q = 0; q < p->n_outputs; q++)
            p->out_reg[q] = p->out_reg[q] == reg && q == k ? rounded
                            : p->out_reg[q] >= rounded     ? p->out_reg[q] + 1
                                                           : p->out_reg[q];
    }
    return REGC_OK;
}

/* The forward as split_gelu and round_inside leave it. */
static int prepare_forward(regc_compiled_region *r, const char *hold, int n_hold)
{
    int rc = reserve_chains(r, r->n_fwd);
    regc_instr *out = rc ? NULL : malloc(((size_t)2 * r->n_fwd + 1) * sizeof *out);
    if (!rc && !out)
        rc = regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    if (rc)
        return rc;
    int m = 0;
    for (int i = 0; i < r->n_fwd; i++)
        m += split_gelu(r, &r->fwd[i], hold, n_hold, out + m);
    free(r->fwd);
    r->fwd = out, r->n_fwd = m;
    for (int i = 0; i < r->n_fwd && rc == REGC_OK; i++)
        if (r->fwd[i].kernel == K_EW)
            rc = round_inside(r, &r->fwd[i], hold, n_hold);
    return rc;
}

/* The chain of no steps from `src` to `dst`, n floats: bit 0 (the
 * output) or bit 1 (the input) of bf16_refs says which is held in bf16. */
static regc_instr convert(const regc_ew_program *conv, int dst, int src, int64_t n, unsigned bf16,
                          int node)
{
    regc_instr c = {.kernel = K_EW, .n_refs = 2, .n_out = 1, .ew = conv, .node = node};
    c.refs[0] = (regc_ref){dst, 0};
    c.refs[1] = (regc_ref){src, 0};
    c.d[0] = n;
    c.bf16_refs = (uint16_t)bf16;
    return c;
}

/* One pass's instructions with the held slots in bf16 (header): each
 * instruction preceded by the widenings its fp32 reads need and followed by
 * the roundings its fp32 writes need. */
static int hold_in(regc_compiled_region *r, const char *hold, int n_hold,
                   const regc_ew_program *conv, regc_instr **list, int *n)
{
    const int n_old = *n;
    regc_instr *out = malloc(((size_t)n_old * (2 * REGC_INSTR_MAX_REFS + 1) + 1) * sizeof *out);
    if (!out)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    int m = 0, rc = REGC_OK;
    for (int i = 0; i < n_old && rc == REGC_OK; i++) {
        regc_instr x = (*list)[i];
        regc_instr after[REGC_INSTR_MAX_REFS];
        int n_after = 0, copy_of[REGC_INSTR_MAX_REFS][2], n_copies = 0; /* slot, its fp32 copy */
        for (int k = 0; k < x.n_refs && rc == REGC_OK; k++) {
            const int s = x.refs[k].buf;
            if (s < 0 || s >= n_hold || !hold[s])
                continue;
            const int64_t floats = r->slots[s].bytes / 4;
            const int w = regc_instr_writes(&x, k);
            if (w ? writes_bf16(&x, k) : reads_bf16(&x, k)) {
                x.bf16_refs |= (uint16_t)(1u << k);
                x.refs[k].off /= 2;
                continue;
            }
            int t = -1;
            for (int j = 0; j < n_copies && !w; j++)
                if (copy_of[j][0] == s)
                    t = copy_of[j][1];
            if (t < 0) {
                if ((t = regc_region_add_temp(r, s, r->slots[s].bytes)) < 0) {
                    rc = t;
                    break;
                }
                if (w) { /* written in fp32, then rounded into the slot */
                    after[n_after++] = convert(conv, s, t, floats, 1u, x.node);
                } else { /* widened before the read */
                    copy_of[n_copies][0] = s, copy_of[n_copies++][1] = t;
                    out[m++] = convert(conv, t, s, floats, 2u, x.node);
                }
            }
            x.refs[k].buf = t;
        }
        out[m++] = x;
        for (int j = 0; j < n_after; j++)
            out[m++] = after[j];
    }
    if (rc) {
        free(out);
        return rc;
    }
    free(*list);
    *list = out, *n = m;
    return REGC_OK;
}

/* The activations autocast holds in bf16, held so (header). */
static int hold_activations(regc_compiled_region *r)
{
    const int n_slots = r->n_slots;
    char *lowp = malloc((size_t)n_slots + 1), *hold = calloc((size_t)n_slots + 1, 1);
    int rc =
        lowp && hold ? REGC_OK : regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    if (rc == REGC_OK)
        find_lowp(r, lowp);
    const int any = rc == REGC_OK ? find_held(r, lowp, hold) : 0;
    if (any < 0)
        rc = any;
    if (rc == REGC_OK && any > 0) {
        /* an elementwise kernel touching one becomes a chain, which reads
         * and writes bf16 itself */
        for (int i = 0; i < r->n_fwd + r->n_bwd && rc == REGC_OK; i++) {
            regc_instr *in = regc_region_instr(r, i);
            int touches = 0;
            for (int k = 0; k < in->n_refs; k++)
                touches |= in->refs[k].buf >= 0 && hold[in->refs[k].buf];
            if (touches && chain_step_of(in) >= 0)
                rc = to_chain(r, in);
        }
        if (rc == REGC_OK)
            rc = prepare_forward(r, hold, n_slots);
        regc_ew_program *conv = rc == REGC_OK ? new_chain(r) : NULL; /* the last chain taken */
        if (rc == REGC_OK && !conv)
            rc = REGC_ERR_MEMORY;
        if (rc == REGC_OK) {
            *conv = (regc_ew_program){.n_inputs = 1, .n_outputs = 1, .out_reg = {0}};
            rc = hold_in(r, hold, n_slots, conv, &r->fwd, &r->n_fwd);
        }
        if (rc == REGC_OK)
            rc = hold_in(r, hold, n_slots, conv, &r->bwd, &r->n_bwd);
        for (int s = 0; s < n_slots && rc == REGC_OK; s++)
            if (hold[s])
                r->slots[s].bytes /= 2, r->slots[s].bf16 = 1;
    }
    free(lowp), free(hold);
    return rc;
}

/* ok[s] = 1 for the slots the header's rule lets be held in bf16 and
 * that some GEMM reads (an unread slot gains nothing). read: scratch. */
static void find_bf16_slots(const regc_compiled_region *r, char *ok, char *read)
{
    for (int s = 0; s < r->n_slots; s++) {
        const regc_slot *x = &r->slots[s];
        ok[s] = (x->kind == SLOT_SAVED || x->kind == SLOT_TEMP) && x->alias < 0 && !x->bf16 &&
                x->bytes > 0 && x->bytes % 4 == 0;
    }
    for (int s = 0; s < r->n_slots; s++)
        if (r->slots[s].alias >= 0)
            ok[r->slots[s].alias] = 0;
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        const regc_instr *in = regc_region_instr(r, i);
        for (int k = 0; k < in->n_refs; k++) {
            const regc_ref ref = in->refs[k];
            if (ref.buf >= 0 && (!bf16_possible(in, k) || ref.off % 8))
                ok[ref.buf] = 0;
            if (ref.buf >= 0 && !regc_instr_writes(in, k))
                read[ref.buf] = 1;
        }
    }
    for (int s = 0; s < r->n_slots; s++)
        ok[s] &= read[s];
}

/* The formal inputs in_held names: ok[] set for their slots, or an error
 * naming an operand that reads one in fp32. */
static int mark_bf16_params(const regc_compiled_region *r, const char *in_held, char *ok)
{
    for (int k = 0; k < r->n_in; k++) {
        const int s = r->in_slot[k];
        if (in_held[k] != REGC_HELD_BF16 || s < 0)
            continue;
        const char *name = regc_graph_tensor(r->graph, r->slots[s].tensor)->name;
        for (int v = 0; v < r->n_slots; v++)
            if (r->slots[v].alias == s)
                return regc_error(REGC_ERR_UNSUPPORTED,
                                  "region %s: parameter %s, gathered in bf16, has a view", r->name,
                                  name);
        for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
            const regc_instr *in = regc_region_instr(r, i);
            for (int j = 0; j < in->n_refs; j++)
                if (in->refs[j].buf == s && (!regc_instr_bf16_allowed(in, j) ||
                                             regc_instr_writes(in, j) || in->refs[j].off % 8))
                    return regc_error(REGC_ERR_UNSUPPORTED,
                                      "region %s: parameter %s, gathered in bf16, is read in fp32 "
                                      "by %s",
                                      r->name, name, regc_kernel_name(in->kernel));
        }
        ok[s] = 1;
    }
    return REGC_OK;
}

/* In fp32: the GEMMs that read a formal in_held names in bf16 (a frozen
 * weight held in bf16, or in NF4 multiplied in bf16) multiply bf16
 * operands, as they would under bf16; nothing else.
 * Whether any does, or -1 out of memory. */
static int set_bf16_gemms_of(regc_compiled_region *r, const char *in_held)
{
    if (!in_held)
        return 0;
    char *held = calloc((size_t)r->n_slots + 1, 1); /* [n_slots] */
    if (!held)
        return -1;
    for (int k = 0; k < r->n_in; k++)
        if ((in_held[k] == REGC_HELD_BF16 || in_held[k] == REGC_HELD_NF4_BF16) &&
            r->in_slot[k] >= 0)
            held[r->in_slot[k]] = 1;
    int any = 0;
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        regc_instr *in = regc_region_instr(r, i);
        for (int j = 0; j < in->n_refs && in->kernel == K_GEMM; j++)
            if (in->refs[j].buf >= 0 && held[in->refs[j].buf])
                in->bf16 = 1, any = 1;
    }
    free(held);
    return any;
}

/* The formal inputs held in NF4 (a QLoRA model's frozen weights): every
 * reader must be a GEMM reading the whole weight as its B, which then
 * dequantises it as it reads (b_nf4); the slot holds the blob's bytes. An
 * error names the parameter otherwise. */
static int mark_nf4_params(regc_compiled_region *r, const char *in_held)
{
    for (int k = 0; in_held && k < r->n_in; k++) {
        const int s = r->in_slot[k];
        if ((in_held[k] != REGC_HELD_NF4 && in_held[k] != REGC_HELD_NF4_BF16) || s < 0)
            continue;
        const regc_tensor *t = regc_graph_tensor(r->graph, r->slots[s].tensor);
        for (int v = 0; v < r->n_slots; v++)
            if (r->slots[v].alias == s)
                return regc_error(REGC_ERR_UNSUPPORTED,
                                  "region %s: frozen parameter %s, held in NF4, has a view",
                                  r->name, t->name);
        for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
            regc_instr *in = regc_region_instr(r, i);
            for (int j = 0; j < in->n_refs; j++) {
                if (in->refs[j].buf != s)
                    continue;
                /* the blob's layout is that of all of the tensor's values */
                if (in->kernel != K_GEMM || j != 2 || in->refs[j].off != 0 ||
                    in->d[1] * in->d[2] != regc_tensor_numel(t))
                    return regc_error(REGC_ERR_UNSUPPORTED,
                                      "region %s: frozen parameter %s, held in NF4, is read by %s "
                                      "(only as the whole B of a matrix product can it be)",
                                      r->name, t->name, regc_kernel_name(in->kernel));
                in->b_nf4 = 1;
            }
        }
        r->slots[s].bytes = regc_frozen_kind_bytes(REGC_FROZEN_NF4, regc_tensor_numel(t));
    }
    return REGC_OK;
}

int regc_region_apply_precision(regc_compiled_region *r, regc_precision precision, int bf16_storage,
                                const char *in_held)
{
    int nf4 = mark_nf4_params(r, in_held);
    if (nf4)
        return nf4;
    /* the whole precision, or in fp32 the products of weights held in bf16 */
    const int storage = precision == REGC_PRECISION_BF16 && bf16_storage;
    if (precision == REGC_PRECISION_BF16) {
        set_bf16_gemms(r);
    } else if (set_bf16_gemms_of(r, in_held) < 0) {
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    }
    int held = 0;
    for (int k = 0; in_held && k < r->n_in; k++)
        held |= in_held[k] == REGC_HELD_BF16;
    if (!storage && !held)
        return REGC_OK;
    int rc = storage ? hold_activations(r) : REGC_OK;
    if (rc)
        return rc;
    char *ok = calloc((size_t)r->n_slots + 1, 1), *read = calloc((size_t)r->n_slots + 1, 1);
    if (!ok || !read) {
        free(ok), free(read);
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    }
    if (storage)
        find_bf16_slots(r, ok, read);
    rc = in_held ? mark_bf16_params(r, in_held, ok) : REGC_OK;
    for (int i = 0; i < r->n_fwd + r->n_bwd && rc == REGC_OK; i++) {
        regc_instr *in = regc_region_instr(r, i);
        if (chain_step_of(in) >= 0 && in->refs[0].buf >= 0 && ok[in->refs[0].buf] &&
            (rc = to_chain(r, in)))
            break;
        for (int k = 0; k < in->n_refs; k++)
            if (in->refs[k].buf >= 0 && ok[in->refs[k].buf]) {
                in->bf16_refs |= (uint16_t)(1u << k);
                in->refs[k].off /= 2;
            }
    }
    for (int s = 0; s < r->n_slots && rc == REGC_OK; s++)
        if (ok[s])
            r->slots[s].bytes /= 2, r->slots[s].bf16 = 1;
    free(ok), free(read);
    return rc;
}
