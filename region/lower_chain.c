/* lower_chain.c — contiguous elementwise ops over the same elements become
 * one fused loop (a regc_ew_program: a chain of steps over registers), and
 * the pointwise ops with no kernel of their own become a chain of one step.
 * A chain reads an operand element by element, repeated over the leading
 * dimensions (a bias: its period) or held along a row (a row's statistic
 * [..., 1]: its inner count); every member must read a shared operand the
 * same way. An operand that an earlier member made, seen through reshapes
 * (aliases, which emit nothing), is that member's register: the chain
 * writes its outputs only at its end. Each step computes what the single
 * kernel of its op computes, so a chain gives the bits of its ops run one
 * by one. */
#include <stdlib.h>
#include <string.h>

#include "lower.h"

static int ew_op_of(regc_op op)
{
    switch (op) {
    case REGC_OP_ADD: return REGC_EW_ADD;
    case REGC_OP_BIAS_ADD: return REGC_EW_ADD;
    case REGC_OP_MUL: return REGC_EW_MUL;
    case REGC_OP_SCALE: return REGC_EW_SCALE;
    case REGC_OP_GELU: return REGC_EW_GELU;
    case REGC_OP_GELU_BWD: return REGC_EW_GELU_BWD;
    case REGC_OP_GELU_ERF: return REGC_EW_GELU_ERF;
    case REGC_OP_GELU_ERF_BWD: return REGC_EW_GELU_ERF_BWD;
    case REGC_OP_SILU: return REGC_EW_SILU;
    case REGC_OP_SILU_BWD: return REGC_EW_SILU_BWD;
    case REGC_OP_RELU: return REGC_EW_RELU;
    case REGC_OP_RELU_BWD: return REGC_EW_RELU_BWD;
    case REGC_OP_SUB: return REGC_EW_SUB;
    case REGC_OP_DIV: return REGC_EW_DIV;
    case REGC_OP_NEG: return REGC_EW_NEG;
    case REGC_OP_ADD_SCALAR: return REGC_EW_ADD_SCALAR;
    case REGC_OP_EXP: return REGC_EW_EXP;
    case REGC_OP_TANH: return REGC_EW_TANH;
    case REGC_OP_TANH_BWD: return REGC_EW_TANH_BWD;
    case REGC_OP_RSQRT: return REGC_EW_RSQRT;
    case REGC_OP_POW: return REGC_EW_POW;
    case REGC_OP_EXPAND: return REGC_EW_SCALE; /* by 1: a copy of the row's value */
    case REGC_OP_MASKED_FILL: return REGC_EW_MASKED_FILL;
    default: return -1;
    }
}

/* Ops with no single kernel of their own: each lowers as a chain, of one
 * step when nothing joins it (at O0, too). */
static int ew_only(regc_op op)
{
    return ew_op_of(op) >= 0 && op != REGC_OP_ADD && op != REGC_OP_BIAS_ADD && op != REGC_OP_MUL &&
           op != REGC_OP_SCALE && op != REGC_OP_GELU && op != REGC_OP_GELU_BWD &&
           op != REGC_OP_GELU_ERF && op != REGC_OP_GELU_ERF_BWD && op != REGC_OP_SILU &&
           op != REGC_OP_SILU_BWD && op != REGC_OP_RELU && op != REGC_OP_RELU_BWD;
}

/* May operand k of x be broadcast (read with a period or an inner count)
 * in a chain? */
static int ew_broadcast_ok(const regc_node *x, int k)
{
    return (k == 1 && (x->op == REGC_OP_BIAS_ADD || x->op == REGC_OP_SUB || x->op == REGC_OP_DIV ||
                       x->op == REGC_OP_MUL || x->op == REGC_OP_MASKED_FILL)) ||
           (k == 0 && x->op == REGC_OP_EXPAND);
}

/* Does node i read a broadcast operand? MUL's single kernel takes equal
 * shapes only; broadcast, it runs as a chain. */
static int ew_broadcasts(const lower_ctx *c, int i)
{
    const regc_node *x = regc_graph_node(c->g, i);
    if (ew_op_of(x->op) < 0 || x->op == REGC_OP_BIAS_ADD)
        return 0;
    for (int k = 0; k < x->n_in; k++)
        if (numel(c, x->in[k]) != numel(c, x->out[0]))
            return 1;
    return 0;
}

/* Can node i join a chain over n elements? */
static int ew_candidate(const lower_ctx *c, int i, int64_t n)
{
    const regc_node *x = regc_graph_node(c->g, i);
    if (c->skip[i] || ew_op_of(x->op) < 0 ||
        (x->op == REGC_OP_ADD && (c->fused_norm[i] >= 0 || c->embed_acc[i] >= 0)))
        return 0;
    if (T(c, x->out[0])->dtype != REGC_F32 || numel(c, x->out[0]) != n)
        return 0;
    for (int k = 0; k < x->n_in; k++)
        if (numel(c, x->in[k]) != n && !ew_broadcast_ok(x, k))
            return 0;
    return 1;
}

typedef struct {
    int n_members;
    int members[REGC_EW_MAX_STEPS];
    int inputs[REGC_EW_MAX_INPUTS], n_inputs;
    int outputs[REGC_EW_MAX_OUTPUTS], n_outputs;
} ew_group;

static int in_group(const ew_group *gr, int node)
{
    for (int i = 0; i < gr->n_members; i++)
        if (gr->members[i] == node)
            return 1;
    return 0;
}

/* The tensor whose memory t is: t, or what the reshapes it comes through
 * view (aliases, which emit nothing, so a chain may run across them). */
static int ew_alias_source(const lower_ctx *c, int t)
{
    for (;;) {
        const int p = T(c, t)->producer;
        if (p < 0 || !c->skip[p] || regc_graph_node(c->g, p)->op != REGC_OP_RESHAPE)
            return t;
        t = regc_graph_node(c->g, p)->in[0];
    }
}

/* The member of gr whose output operand t of a member is, through any
 * alias, or -1: such an operand is a register of the chain, never read
 * from memory (which the chain writes only at its end). */
static int ew_member_source(const lower_ctx *c, const ew_group *gr, int t)
{
    const int p = T(c, ew_alias_source(c, t))->producer;
    return p >= 0 && in_group(gr, p) ? ew_alias_source(c, t) : -1;
}

/* How member x reads operand t in a chain over n elements: element by
 * element (both 0), a row's statistic [..., 1] held along x's rows
 * (inner), or trailing dimensions repeated over x's leading ones
 * (period). */
static void ew_read_rule(const lower_ctx *c, const regc_node *x, int t, int64_t n, int64_t *inner,
                         int64_t *period)
{
    const regc_tensor *in = T(c, t), *full = T(c, x->out[0]);
    *inner = *period = 0;
    if (regc_tensor_numel(in) == n)
        return;
    if (in->ndim == full->ndim && in->ndim >= 1 && in->shape[in->ndim - 1] == 1 &&
        full->shape[full->ndim - 1] > 1)
        *inner = full->shape[full->ndim - 1];
    else
        *period = regc_tensor_numel(in);
}

/* Does every member that reads input t read it the same way? A chain
 * gives each input one rule; members of other shapes may need others. */
static int ew_reads_agree(const lower_ctx *c, const ew_group *gr, int t, int64_t n)
{
    int64_t inner0 = -1, period0 = -1;
    for (int m = 0; m < gr->n_members; m++) {
        const regc_node *x = regc_graph_node(c->g, gr->members[m]);
        for (int k = 0; k < x->n_in; k++) {
            if (x->in[k] != t)
                continue;
            int64_t inner, period;
            ew_read_rule(c, x, t, n, &inner, &period);
            if (inner0 >= 0 && (inner != inner0 || period != period0))
                return 0;
            inner0 = inner, period0 = period;
        }
    }
    return 1;
}

/* Would adding node i keep the group within the program limits? Fills the
 * group's inputs and outputs as they would be. */
static int ew_try(const lower_ctx *c, ew_group *gr, int i)
{
    ew_group t = *gr;
    t.members[t.n_members++] = i;
    t.n_inputs = 0, t.n_outputs = 0;
    const int64_t n = numel(c, regc_graph_node(c->g, t.members[0])->out[0]);
    for (int m = 0; m < t.n_members; m++) {
        const regc_node *x = regc_graph_node(c->g, t.members[m]);
        for (int k = 0; k < x->n_in; k++) {
            int seen = 0;
            if (ew_member_source(c, &t, x->in[k]) >= 0)
                continue;
            for (int j = 0; j < t.n_inputs; j++)
                seen |= t.inputs[j] == x->in[k];
            if (!seen) {
                if (t.n_inputs == REGC_EW_MAX_INPUTS || !ew_reads_agree(c, &t, x->in[k], n))
                    return 0;
                t.inputs[t.n_inputs++] = x->in[k];
            }
        }
    }
    for (int m = 0; m < t.n_members; m++) {
        int o = regc_graph_node(c->g, t.members[m])->out[0];
        int needed = c->r->slots[c->slot_of[o]].kind != SLOT_TEMP ||
                     c->r->slots[root_slot(c, c->slot_of[o])].kind != SLOT_TEMP;
        int inside = 0;
        for (int m2 = 0; m2 < t.n_members; m2++) {
            const regc_node *q = regc_graph_node(c->g, t.members[m2]);
            int reads = 0;
            for (int k = 0; k < q->n_in; k++)
                reads |= q->in[k] == o;
            inside += reads;
        }
        needed |= c->n_readers[o] > inside;
        if (needed) {
            if (t.n_outputs == REGC_EW_MAX_OUTPUTS)
                return 0;
            t.outputs[t.n_outputs++] = o;
        }
    }
    *gr = t;
    return 1;
}

static int emit_group(lower_ctx *c, const ew_group *gr, regc_ew_program *prog)
{
    memset(prog, 0, sizeof *prog);
    /* register r holds tensor tensor_of[r]: the inputs, then one per step */
    int tensor_of[REGC_EW_MAX_INPUTS + REGC_EW_MAX_STEPS];
    int n_regs = 0;
    int64_t n = numel(c, regc_graph_node(c->g, gr->members[0])->out[0]);
    for (int k = 0; k < gr->n_inputs; k++) {
        const regc_tensor *t = T(c, gr->inputs[k]);
        tensor_of[n_regs++] = gr->inputs[k];
        if (regc_tensor_numel(t) == n)
            continue; /* read element by element */
        /* broadcast: as its readers say (ew_try made them agree) */
        for (int m = 0; m < gr->n_members; m++) {
            const regc_node *x = regc_graph_node(c->g, gr->members[m]);
            for (int j = 0; j < x->n_in; j++)
                if (x->in[j] == gr->inputs[k])
                    ew_read_rule(c, x, gr->inputs[k], n, &prog->inner[k], &prog->period[k]);
        }
    }
    prog->n_inputs = gr->n_inputs;
    for (int m = 0; m < gr->n_members; m++) {
        const regc_node *x = regc_graph_node(c->g, gr->members[m]);
        regc_ew_step *s = &prog->steps[m];
        s->op = (uint8_t)ew_op_of(x->op);
        s->value = x->op == REGC_OP_EXPAND ? 1.0f : x->attrs.value;
        for (int k = 0; k < x->n_in && k < 2; k++) {
            const int src = ew_member_source(c, gr, x->in[k]); /* a register, through aliases */
            const int want = src >= 0 ? src : x->in[k];
            for (int r = 0; r < n_regs; r++)
                if (tensor_of[r] == want)
                    *(k == 0 ? &s->a : &s->b) = (uint8_t)r;
        }
        tensor_of[n_regs++] = x->out[0];
    }
    prog->n_steps = gr->n_members;
    prog->n_outputs = gr->n_outputs;
    int t[REGC_INSTR_MAX_REFS];
    for (int k = 0; k < gr->n_outputs; k++) {
        t[k] = gr->outputs[k];
        for (int r = 0; r < n_regs; r++)
            if (tensor_of[r] == gr->outputs[k])
                prog->out_reg[k] = (uint8_t)r;
    }
    for (int k = 0; k < gr->n_inputs; k++)
        t[gr->n_outputs + k] = gr->inputs[k];
    regc_instr *in = regc_lower_emit(c, K_EW, gr->members[gr->n_members - 1], gr->n_outputs,
                                     gr->n_outputs + gr->n_inputs, t);
    if (!in)
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    in->d[0] = n;
    in->ew = prog;
    return REGC_OK;
}

int regc_lower_chain(lower_ctx *c, int i, int hi, int fuse, int *n_ew, int *last)
{
    int64_t n = numel(c, regc_graph_node(c->g, i)->out[0]);
    *last = i;
    if (fuse && ew_candidate(c, i, n)) {
        ew_group gr = {0};
        ew_try(c, &gr, i);
        for (int j = i + 1; j < hi; j++) {
            if (c->skip[j] && regc_graph_node(c->g, j)->op == REGC_OP_RESHAPE)
                continue; /* an alias emits nothing */
            if (!ew_candidate(c, j, n) || gr.n_members == REGC_EW_MAX_STEPS || !ew_try(c, &gr, j))
                break;
            *last = j;
        }
        if (gr.n_members > 1) {
            int rc = emit_group(c, &gr, &c->r->ew[(*n_ew)++]);
            return rc < 0 ? rc : 1;
        }
        *last = i;
    }
    if (ew_only(regc_graph_node(c->g, i)->op) || ew_broadcasts(c, i)) {
        ew_group gr = {0};
        ew_try(c, &gr, i); /* one step always fits */
        int rc = emit_group(c, &gr, &c->r->ew[(*n_ew)++]);
        return rc < 0 ? rc : 1;
    }
    return 0;
}
