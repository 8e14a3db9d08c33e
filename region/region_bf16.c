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
 *   - every operand naming it may be bf16 (regc_instr_bf16_allowed: the
 *     GEMM's A or B, a non-accumulating GEMM's C, a norm's y, a fused
 *     chain's output, the cross-entropy's dlogits), at a byte offset that
 *     stays 4-aligned when halved.
 * Its bytes halve, and each operand naming it is marked bf16 with its
 * offset counted in bf16 values. A lone activation (GELU, SiLU, ReLU, a
 * scale: one unary kernel, as at O0 or where nothing fused it) writing
 * such a slot becomes a fused chain of that one step, which computes the
 * same float operations and can store bf16. The instructions that read a bf16
 * operand run no in place (regc_instr_inplace_input).
 *
 * Under ZeRO-3 the compiler also names the parameters it gathers in bf16
 * (compile.c: those only matrix products read, in_bf16): their formal
 * slots are held in bf16 the same way. Every operand naming one must be a
 * GEMM's A or B, or the compile fails: the gathered unit is bf16 for every
 * region that reads it. */
#include <stdlib.h>

#include "program.h"
#include "region_internal.h"

/* Every GEMM of the region multiplies bf16 operands. */
static void set_bf16_gemms(regc_compiled_region *r)
{
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        regc_instr *in = regc_region_instr(r, i);
        if (in->kernel == K_GEMM)
            in->bf16 = 1;
    }
}

/* The chain step a unary kernel's op is, or -1 for none. */
static int chain_step_of(const regc_instr *in)
{
    if (in->kernel != K_UNARY)
        return -1;
    switch ((regc_op)in->unary) {
    case REGC_OP_GELU: return REGC_EW_GELU;
    case REGC_OP_GELU_ERF: return REGC_EW_GELU_ERF;
    case REGC_OP_SILU: return REGC_EW_SILU;
    case REGC_OP_RELU: return REGC_EW_RELU;
    case REGC_OP_SCALE: return REGC_EW_SCALE;
    default: return -1;
    }
}

/* May operand k of `in` be bf16, as it is or once a chain? */
static int bf16_possible(const regc_instr *in, int k)
{
    return regc_instr_bf16_allowed(in, k) || (k == 0 && chain_step_of(in) >= 0);
}

/* A unary kernel (y, x; n) as the chain of its one step, which the
 * region's chain table (sized for a chain per node) takes. */
static void unary_to_chain(regc_compiled_region *r, regc_instr *in)
{
    regc_ew_program *p = &r->ew[r->n_ew++];
    *p = (regc_ew_program){.n_inputs = 1, .n_steps = 1, .n_outputs = 1};
    p->steps[0] = (regc_ew_step){.op = (uint8_t)chain_step_of(in), .a = 0, .value = in->f};
    p->out_reg[0] = 1;
    in->kernel = K_EW;
    in->unary = 0;
    in->f = 0.0f;
    in->ew = p;
}

/* ok[s] = 1 for the slots the header's rule lets be held in bf16 and
 * that some GEMM reads (an unread slot gains nothing). read: scratch. */
static void find_bf16_slots(const regc_compiled_region *r, char *ok, char *read)
{
    for (int s = 0; s < r->n_slots; s++) {
        const regc_slot *x = &r->slots[s];
        ok[s] = (x->kind == SLOT_SAVED || x->kind == SLOT_TEMP) && x->alias < 0 && x->bytes > 0 &&
                x->bytes % 4 == 0;
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

/* The formal inputs in_bf16 names: ok[] set for their slots, or an error
 * naming an operand that reads one in fp32. */
static int mark_bf16_params(const regc_compiled_region *r, const char *in_bf16, char *ok)
{
    for (int k = 0; k < r->n_in; k++) {
        const int s = r->in_slot[k];
        if (!in_bf16[k] || s < 0)
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

int regc_region_apply_precision(regc_compiled_region *r, regc_precision precision, int bf16_storage,
                                const char *in_bf16)
{
    if (precision != REGC_PRECISION_BF16)
        return REGC_OK;
    set_bf16_gemms(r);
    if (!bf16_storage)
        return REGC_OK;
    char *ok = malloc((size_t)r->n_slots + 1), *read = calloc((size_t)r->n_slots + 1, 1);
    if (!ok || !read) {
        free(ok), free(read);
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    }
    find_bf16_slots(r, ok, read);
    int rc = in_bf16 ? mark_bf16_params(r, in_bf16, ok) : REGC_OK;
    if (rc) {
        free(ok), free(read);
        return rc;
    }
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        regc_instr *in = regc_region_instr(r, i);
        if (chain_step_of(in) >= 0 && in->refs[0].buf >= 0 && ok[in->refs[0].buf])
            unary_to_chain(r, in);
        for (int k = 0; k < in->n_refs; k++)
            if (in->refs[k].buf >= 0 && ok[in->refs[k].buf]) {
                in->bf16_refs |= (uint16_t)(1u << k);
                in->refs[k].off /= 2;
            }
    }
    for (int s = 0; s < r->n_slots; s++)
        if (ok[s])
            r->slots[s].bytes /= 2, r->slots[s].bf16 = 1;
    free(ok), free(read);
    return REGC_OK;
}
