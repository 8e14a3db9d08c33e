/* serial.c — compiled regions and step programs as bytes for the compile
 * cache, and the canonical form of a region that keys it.
 *
 * The canonical form holds everything regc_region_compile reads: the
 * formals' dtypes, shapes, roles and gradient flags, and every node's op,
 * attributes and wiring in region-local tensor numbers; no tensor names,
 * so the same layer of a renamed checkpoint keys the same entry.
 *
 * A payload is input, whoever wrote it: decoding bounds every count and
 * index as it reads them, then region/validate.c checks the whole against
 * its own tables (every operand's extent inside the memory it names, the
 * step list, the plan, the shard layout) before anything may run it. A
 * payload that fails is an error, never a wild pointer or another loss. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serial.h"
#include "validate.h"

/* No count, size or offset of a sound payload comes near this. */
#define SIZE_BOUND ((int64_t)1 << 40)

/* Names from a payload go into one-line messages: printable text only. */
static int printable(const char *s)
{
    for (; s && *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return s != NULL;
}

/* A validation failure as a decoding error, its reason kept. */
static int refuse(const char *what)
{
    char why[480];
    snprintf(why, sizeof why, "%s", regc_error_message());
    return regc_error(REGC_ERR_FORMAT, "compile cache: %s: %s", what, why);
}

/* ---------------------------------------------------------------- canonical form */

static uint64_t double_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

int regc_region_canon(const regc_graph *g, const regc_region_spec *s, regc_level level,
                      regc_bytes *b)
{
    int n_t = regc_graph_n_tensors(g);
    int *local = malloc(((size_t)n_t + 1) * sizeof *local);
    if (!local)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", s->name);
    for (int t = 0; t < n_t; t++)
        local[t] = -1;
    int next = 0;
    regc_bytes_put_str(b, "region");
    regc_bytes_put_i64(b, level);
    regc_bytes_put_i64(b, s->n_in);
    for (int k = 0; k < s->n_in; k++) {
        const regc_tensor *t = regc_graph_tensor(g, s->in[k]);
        local[s->in[k]] = next++;
        regc_graph_canon_shape(b, t);
        regc_bytes_put_i64(b, t->role == REGC_ROLE_PARAM);
        regc_bytes_put_i64(b, s->in_needs_grad[k]);
        regc_bytes_put_i64(b, s->in_seeded[k]);
        regc_bytes_put_i64(b, s->in_held ? s->in_held[k] : 0);
    }
    regc_bytes_put_i64(b, s->n_nodes);
    for (int i = 0; i < s->n_nodes; i++) {
        const regc_node *n = regc_graph_node(g, s->nodes[i]);
        for (int k = 0; k < n->n_out; k++)
            local[n->out[k]] = next++;
        regc_graph_canon_node(b, g, n, local);
    }
    regc_bytes_put_i64(b, s->n_out);
    for (int k = 0; k < s->n_out; k++) {
        regc_bytes_put_i64(b, local[s->out[k]]);
        regc_bytes_put_i64(b, s->out_has_grad[k]);
    }
    regc_bytes_put_i64(b, s->logits_chunk_rows);
    /* what is recomputed, and which tensors never are */
    const regc_recompute_policy *pol = s->recompute;
    regc_bytes_put_i64(b, pol ? pol->mode : REGC_RECOMPUTE_NONE);
    if (pol && pol->mode != REGC_RECOMPUTE_NONE) {
        regc_bytes_put_i64(b, pol->layer);
        regc_bytes_put_u64(b, pol->mode == REGC_RECOMPUTE_AUTO ? double_bits(pol->ratio) : 0);
        /* the measured costs auto's ratio is counted in */
        regc_bytes_put_i64(b, pol->mode == REGC_RECOMPUTE_AUTO ? pol->n_costs : 0);
        for (int i = 0; pol->mode == REGC_RECOMPUTE_AUTO && i < pol->n_costs; i++) {
            regc_bytes_put_str(b, pol->costs[i].label);
            regc_bytes_put_u64(b, double_bits(pol->costs[i].ms));
            regc_bytes_put_u64(b, double_bits(pol->costs[i].cost));
        }
        for (int i = 0; i < s->n_nodes; i++) {
            const regc_node *n = regc_graph_node(g, s->nodes[i]);
            for (int k = 0; k < n->n_out; k++)
                regc_bytes_put_i64(b, s->keep ? s->keep[n->out[k]] : 0);
        }
    }
    free(local);
    return b->failed ? regc_error(REGC_ERR_MEMORY, "region %s: out of memory", s->name) : REGC_OK;
}

/* ---------------------------------------------------------------- instructions */

/* An instruction's scalar fields, most of them zero for any one kernel:
 * written as a mask of the non-zero ones and their values. ew and node
 * are stored plus one, so "none" is zero too. */
enum {
    F_D = 0,
    F_F = F_D + REGC_MAX_DIMS + 1,
    F_TRANS_A,
    F_TRANS_B,
    F_EPILOGUE,
    F_ACCUMULATE,
    F_BATCH,
    F_TQ,
    F_TK,
    F_N_HEAD,
    F_N_KV_HEAD,
    F_HEAD_DIM,
    F_CAUSAL,
    F_SCALE,
    F_SOFTCAP,
    F_WINDOW,
    F_PERM,
    F_EW_REGION = F_PERM + REGC_MAX_DIMS,
    F_EW_INDEX,
    F_NODE,
    F_SIGNAL,
    F_BF16,
    F_BF16_REFS,
    F_REPLAY,
    F_B_NF4,
    F_COUNT
};

static int64_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_float(int64_t v)
{
    uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ew_region: which region's fused chains `ew_index` counts in (programs
 * point into several; a region's own instructions use 0). */
static void put_instr(regc_bytes *b, const regc_instr *in, int ew_region, int ew_index)
{
    const regc_attn_shape *a = &in->attn;
    int64_t v[F_COUNT] = {0};
    for (int d = 0; d <= REGC_MAX_DIMS; d++)
        v[F_D + d] = in->d[d];
    v[F_F] = float_bits(in->f);
    v[F_TRANS_A] = in->trans_a, v[F_TRANS_B] = in->trans_b;
    v[F_EPILOGUE] = in->epilogue, v[F_ACCUMULATE] = in->accumulate;
    v[F_BATCH] = a->batch, v[F_TQ] = a->tq, v[F_TK] = a->tk;
    v[F_N_HEAD] = a->n_head, v[F_N_KV_HEAD] = a->n_kv_head, v[F_HEAD_DIM] = a->head_dim;
    v[F_CAUSAL] = a->causal, v[F_SCALE] = float_bits(a->scale);
    v[F_SOFTCAP] = float_bits(a->softcap), v[F_WINDOW] = a->window;
    for (int d = 0; d < REGC_MAX_DIMS; d++)
        v[F_PERM + d] = in->perm[d];
    v[F_EW_REGION] = in->ew ? ew_region + 1 : 0;
    v[F_EW_INDEX] = in->ew ? ew_index + 1 : 0;
    v[F_NODE] = in->node + 1;
    v[F_SIGNAL] = in->signal;
    v[F_BF16] = in->bf16;
    v[F_BF16_REFS] = in->bf16_refs;
    v[F_REPLAY] = in->replay;
    v[F_B_NF4] = in->b_nf4;
    uint64_t mask = 0;
    for (int k = 0; k < F_COUNT; k++)
        mask |= (uint64_t)(v[k] != 0) << k;
    regc_bytes_put_i64(b, in->kernel);
    regc_bytes_put_i64(b, in->n_refs);
    regc_bytes_put_i64(b, in->n_out);
    regc_bytes_put_i64(b, in->unary);
    for (int k = 0; k < in->n_refs; k++) {
        regc_bytes_put_i64(b, in->refs[k].buf);
        regc_bytes_put_i64(b, in->refs[k].off);
    }
    regc_bytes_put_u64(b, mask);
    for (int k = 0; k < F_COUNT; k++)
        if (v[k])
            regc_bytes_put_i64(b, v[k]);
}

/* The value of field k as read, checked against [lo, hi] (zero when
 * absent); out of range the reader fails and lo stands in, so arithmetic
 * on the result (a stored index minus one) never overflows. */
static int64_t field(regc_reader *r, const int64_t *v, int k, int64_t lo, int64_t hi)
{
    if (v[k] < lo || v[k] > hi) {
        r->failed = 1;
        return lo;
    }
    return v[k];
}

/* Operands must name one of n_bufs buffers (or none); the fused chain is
 * returned as (region, index) for the caller to resolve. */
static void get_instr(regc_reader *r, regc_instr *in, int n_bufs, int *ew_region, int *ew_index)
{
    memset(in, 0, sizeof *in);
    in->kernel = (uint8_t)regc_reader_int(r, 0, K_COUNT - 1);
    in->n_refs = (uint8_t)regc_reader_int(r, 0, REGC_INSTR_MAX_REFS);
    in->n_out = (uint8_t)regc_reader_int(r, 0, in->n_refs);
    in->unary = (uint8_t)regc_reader_int(r, 0, REGC_OP_COUNT - 1);
    for (int k = 0; k < in->n_refs; k++) {
        in->refs[k].buf = (int32_t)regc_reader_int(r, -1, n_bufs - 1);
        in->refs[k].off = regc_reader_int(r, 0, INT64_MAX);
    }
    uint64_t mask = regc_reader_u64(r);
    if (mask >> F_COUNT)
        r->failed = 1;
    int64_t v[F_COUNT] = {0};
    for (int k = 0; k < F_COUNT; k++)
        if (mask >> k & 1)
            v[k] = regc_reader_i64(r);
    for (int d = 0; d <= REGC_MAX_DIMS; d++)
        in->d[d] = v[F_D + d];
    in->f = bits_float(field(r, v, F_F, 0, UINT32_MAX));
    in->trans_a = (int)field(r, v, F_TRANS_A, 0, 1);
    in->trans_b = (int)field(r, v, F_TRANS_B, 0, 1);
    in->epilogue = (int)field(r, v, F_EPILOGUE, 0, 64);
    in->accumulate = (int)field(r, v, F_ACCUMULATE, 0, 1);
    in->bf16 = (int)field(r, v, F_BF16, 0, 1);
    in->bf16_refs = (uint16_t)field(r, v, F_BF16_REFS, 0, (1 << REGC_INSTR_MAX_REFS) - 1);
    in->replay = (uint8_t)field(r, v, F_REPLAY, 0, 1);
    in->b_nf4 = (uint8_t)field(r, v, F_B_NF4, 0, 1);
    regc_attn_shape *a = &in->attn;
    a->batch = v[F_BATCH], a->tq = v[F_TQ], a->tk = v[F_TK];
    a->n_head = (int)field(r, v, F_N_HEAD, 0, INT32_MAX);
    a->n_kv_head = (int)field(r, v, F_N_KV_HEAD, 0, INT32_MAX);
    a->head_dim = (int)field(r, v, F_HEAD_DIM, 0, INT32_MAX);
    a->causal = (int)field(r, v, F_CAUSAL, 0, 1);
    a->scale = bits_float(field(r, v, F_SCALE, 0, UINT32_MAX));
    a->softcap = bits_float(field(r, v, F_SOFTCAP, 0, UINT32_MAX));
    a->window = field(r, v, F_WINDOW, 0, INT64_C(1) << 40);
    for (int d = 0; d < REGC_MAX_DIMS; d++)
        in->perm[d] = (int)field(r, v, F_PERM + d, 0, REGC_MAX_DIMS - 1);
    *ew_region = (int)field(r, v, F_EW_REGION, 0, INT32_MAX) - 1;
    *ew_index = (int)field(r, v, F_EW_INDEX, 0, INT32_MAX) - 1;
    in->node = (int)field(r, v, F_NODE, 0, INT32_MAX) - 1;
    in->signal = (int)field(r, v, F_SIGNAL, 0, INT32_MAX);
}

static void put_ew(regc_bytes *b, const regc_ew_program *e)
{
    regc_bytes_put_i64(b, e->n_inputs);
    regc_bytes_put_i64(b, e->n_steps);
    regc_bytes_put_i64(b, e->n_outputs);
    for (int k = 0; k < e->n_inputs; k++) {
        regc_bytes_put_i64(b, e->period[k]);
        regc_bytes_put_i64(b, e->inner[k]);
    }
    for (int k = 0; k < e->n_steps; k++) {
        regc_bytes_put_i64(b, e->steps[k].op);
        regc_bytes_put_i64(b, e->steps[k].a);
        regc_bytes_put_i64(b, e->steps[k].b);
        regc_bytes_put_f32(b, e->steps[k].value);
    }
    for (int k = 0; k < e->n_outputs; k++)
        regc_bytes_put_i64(b, e->out_reg[k]);
}

static void get_ew(regc_reader *r, regc_ew_program *e)
{
    memset(e, 0, sizeof *e);
    e->n_inputs = (int)regc_reader_int(r, 0, REGC_EW_MAX_INPUTS);
    e->n_steps = (int)regc_reader_int(r, 0, REGC_EW_MAX_STEPS);
    e->n_outputs = (int)regc_reader_int(r, 0, REGC_EW_MAX_OUTPUTS);
    int regs = e->n_inputs + e->n_steps; /* register k < n_inputs is input k, then one per step */
    for (int k = 0; k < e->n_inputs && k < REGC_EW_MAX_INPUTS; k++) {
        e->period[k] = regc_reader_int(r, 0, INT64_MAX);
        e->inner[k] = regc_reader_int(r, 0, INT64_MAX);
    }
    for (int k = 0; k < e->n_steps && k < REGC_EW_MAX_STEPS; k++) {
        e->steps[k].op = (uint8_t)regc_reader_int(r, 0, REGC_EW_COUNT - 1);
        e->steps[k].a = (uint8_t)regc_reader_int(r, 0, e->n_inputs + k - 1);
        e->steps[k].b = (uint8_t)regc_reader_int(r, 0, e->n_inputs + k - 1);
        e->steps[k].value = regc_reader_f32(r);
    }
    for (int k = 0; k < e->n_outputs && k < REGC_EW_MAX_OUTPUTS; k++)
        e->out_reg[k] = (uint8_t)regc_reader_int(r, 0, regs - 1);
}

/* ---------------------------------------------------------------- compiled regions */

static void put_slot_map(regc_bytes *b, const int *map, int n)
{
    for (int k = 0; k < n; k++)
        regc_bytes_put_i64(b, map[k]);
}

void regc_region_write(const regc_compiled_region *r, regc_bytes *b)
{
    regc_bytes_put_str(b, r->name);
    regc_bytes_put_i64(b, r->n_fwd_nodes);
    regc_bytes_put_i64(b, r->n_in);
    regc_bytes_put_i64(b, r->n_out);
    regc_bytes_put_i64(b, r->n_slots);
    for (int s = 0; s < r->n_slots; s++) {
        const regc_slot *x = &r->slots[s];
        regc_bytes_put_i64(b, x->kind);
        regc_bytes_put_i64(b, x->index);
        regc_bytes_put_i64(b, x->bytes);
        regc_bytes_put_i64(b, x->alias);
        regc_bytes_put_i64(b, x->alias_off);
        regc_bytes_put_i64(b, x->offset);
        regc_bytes_put_i64(b, x->tensor);
        regc_bytes_put_i64(b, x->bf16);
    }
    put_slot_map(b, r->in_slot, r->n_in);
    put_slot_map(b, r->seed_slot, r->n_in);
    put_slot_map(b, r->din_slot, r->n_in);
    put_slot_map(b, r->out_slot, r->n_out);
    put_slot_map(b, r->dout_slot, r->n_out);
    regc_bytes_put_i64(b, r->n_ew);
    for (int k = 0; k < r->n_ew; k++)
        put_ew(b, &r->ew[k]);
    regc_bytes_put_i64(b, r->n_fwd);
    regc_bytes_put_i64(b, r->n_bwd);
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        const regc_instr *in = regc_region_instr(r, i);
        put_instr(b, in, 0, in->ew ? (int)(in->ew - r->ew) : -1);
    }
    regc_bytes_put_i64(b, r->saved_bytes);
    regc_bytes_put_i64(b, r->scratch_bytes);
}

/* Counts come from the payload: bounded by what is left of it (every
 * element takes at least a byte), so a damaged count cannot ask for a huge
 * allocation. */
static int get_count(regc_reader *r)
{
    return (int)regc_reader_int(r, 0, r->failed ? 0 : (int64_t)(r->end - r->p));
}

static int *get_slot_map(regc_reader *r, int n, int n_slots)
{
    int *m = malloc(((size_t)n + 1) * sizeof *m);
    if (!m) {
        r->failed = 1;
        return NULL;
    }
    for (int k = 0; k < n; k++)
        m[k] = (int)regc_reader_int(r, -1, n_slots - 1);
    return m;
}

/* A fused chain reference inside one region. */
static const regc_ew_program *resolve_ew(regc_reader *rd, const regc_compiled_region *r, int region,
                                         int index)
{
    if (index < 0)
        return NULL;
    if (region != 0 || index >= r->n_ew) {
        rd->failed = 1;
        return NULL;
    }
    return &r->ew[index];
}

int regc_region_read(regc_reader *rd, regc_compiled_region **out)
{
    *out = NULL;
    regc_compiled_region *r = calloc(1, sizeof *r);
    if (!r)
        return regc_error(REGC_ERR_MEMORY, "compile cache: out of memory");
    r->name = regc_reader_str(rd);
    if (!printable(r->name))
        rd->failed = 1;
    r->n_fwd_nodes = (int)regc_reader_int(rd, 0, INT32_MAX); /* not a count of what follows */
    r->n_in = get_count(rd);
    r->n_out = get_count(rd);
    r->n_slots = get_count(rd);
    if (!rd->failed && !(r->slots = calloc((size_t)r->n_slots + 1, sizeof *r->slots)))
        rd->failed = 1;
    for (int s = 0; s < r->n_slots && !rd->failed; s++) {
        regc_slot *x = &r->slots[s];
        x->kind = (regc_slot_kind)regc_reader_int(rd, SLOT_IN, SLOT_TEMP);
        x->index = (int)regc_reader_int(rd, -1, INT32_MAX);
        x->bytes = regc_reader_int(rd, 0, INT64_MAX);
        x->alias = (int)regc_reader_int(rd, -1, r->n_slots - 1);
        x->alias_off = regc_reader_int(rd, 0, INT64_MAX);
        x->offset = regc_reader_int(rd, 0, INT64_MAX);
        x->tensor = (int)regc_reader_int(rd, -1, INT32_MAX);
        x->bf16 = (int)regc_reader_int(rd, 0, 1);
    }
    if (!rd->failed) {
        r->in_slot = get_slot_map(rd, r->n_in, r->n_slots);
        r->seed_slot = get_slot_map(rd, r->n_in, r->n_slots);
        r->din_slot = get_slot_map(rd, r->n_in, r->n_slots);
        r->out_slot = get_slot_map(rd, r->n_out, r->n_slots);
        r->dout_slot = get_slot_map(rd, r->n_out, r->n_slots);
        r->n_ew = get_count(rd);
    }
    if (!rd->failed && !(r->ew = calloc((size_t)r->n_ew + 1, sizeof *r->ew)))
        rd->failed = 1;
    r->ew_cap = r->n_ew + 1;
    for (int k = 0; k < r->n_ew && !rd->failed; k++)
        get_ew(rd, &r->ew[k]);
    if (!rd->failed) {
        r->n_fwd = get_count(rd);
        r->n_bwd = get_count(rd);
        r->fwd = calloc((size_t)r->n_fwd + 1, sizeof *r->fwd);
        r->bwd = calloc((size_t)r->n_bwd + 1, sizeof *r->bwd);
        if (!r->fwd || !r->bwd)
            rd->failed = 1;
    }
    for (int i = 0; i < r->n_fwd + r->n_bwd && !rd->failed; i++) {
        regc_instr *in = regc_region_instr(r, i);
        int ew_region, ew_index;
        get_instr(rd, in, r->n_slots, &ew_region, &ew_index);
        in->ew = resolve_ew(rd, r, ew_region, ew_index);
        if (in->kernel == K_EW && !in->ew)
            rd->failed = 1;
    }
    r->saved_bytes = regc_reader_int(rd, 0, INT64_MAX);
    r->scratch_bytes = regc_reader_int(rd, 0, INT64_MAX);
    if (rd->failed) {
        regc_compiled_region_free(r);
        return regc_error(REGC_ERR_FORMAT, "compile cache: malformed compiled region");
    }
    if (regc_region_validate(r) != REGC_OK) {
        int rc = refuse("unsound compiled region");
        regc_compiled_region_free(r);
        return rc;
    }
    *out = r;
    return REGC_OK;
}

/* ---------------------------------------------------------------- step programs */

/* Which region's fused chains e points into: (region, index), or -1. */
static void find_ew(const regc_program *p, const regc_ew_program *e, int *region, int *index)
{
    *region = *index = -1;
    for (int i = 0; e && i < p->n_regions; i++) {
        const regc_compiled_region *r = p->regions[i];
        if (r->n_ew > 0 && e >= r->ew && e < r->ew + r->n_ew) {
            *region = i, *index = (int)(e - r->ew);
            return;
        }
    }
}

static void put_program_instr(regc_bytes *b, const regc_program *p, const regc_instr *in)
{
    int region, index;
    find_ew(p, in->ew, &region, &index);
    put_instr(b, in, region, index);
}

static int get_program_instr(regc_reader *rd, const regc_program *p, regc_instr *in)
{
    int region, index;
    get_instr(rd, in, p->n_bufs, &region, &index);
    if (index >= 0) {
        if (region < 0 || region >= p->n_regions || index >= p->regions[region]->n_ew)
            rd->failed = 1;
        else
            in->ew = &p->regions[region]->ew[index];
    }
    if (in->kernel == K_EW && !in->ew)
        rd->failed = 1;
    if (in->signal > p->n_signals || (in->kernel == K_COMM_WAIT && in->signal < 1))
        rd->failed = 1;
    return !rd->failed;
}

/* A lazy program's calls: each binds a region's slots to buffers. */
static void write_steps(const regc_program *p, regc_bytes *b)
{
    regc_bytes_put_i64(b, p->n_pieces);
    for (int i = 0; i < p->n_pieces; i++)
        regc_bytes_put_i64(b, p->pieces[i].region);
    regc_bytes_put_i64(b, p->n_steps);
    for (int i = 0; i < p->n_steps; i++) {
        const lazy_step *s = &p->steps[i];
        regc_bytes_put_i64(b, s->piece);
        if (s->piece < 0) {
            put_program_instr(b, p, &s->instr);
            continue;
        }
        regc_bytes_put_i64(b, s->backward);
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        for (int k = 0; k < r->n_slots; k++) {
            regc_bytes_put_i64(b, s->bind[k].buf);
            regc_bytes_put_i64(b, s->bind[k].off);
        }
    }
}

/* ZeRO-3's layout: enough to lay it out again. */
static void write_layout(const regc_shard_layout *l, regc_bytes *b)
{
    regc_bytes_put_i64(b, l != NULL);
    if (!l)
        return;
    regc_bytes_put_i64(b, l->n_units);
    regc_bytes_put_i64(b, l->n_params);
    for (int i = 0; i < l->n_params; i++) {
        regc_bytes_put_i64(b, l->param_numel[i]);
        regc_bytes_put_i64(b, l->model_offset[i]);
        regc_bytes_put_i64(b, l->param_unit[i]);
    }
}

static void read_layout(regc_reader *rd, regc_program *p, regc_shard_layout **out)
{
    if (!regc_reader_int(rd, 0, 1) || rd->failed)
        return;
    int n_units = get_count(rd), n_params = get_count(rd);
    int64_t *numel = calloc((size_t)n_params + 1, sizeof *numel);
    int64_t *offset = calloc((size_t)n_params + 1, sizeof *offset);
    int *unit = calloc((size_t)n_params + 1, sizeof *unit);
    if (rd->failed || !numel || !offset || !unit)
        rd->failed = 1;
    for (int i = 0; i < n_params && !rd->failed; i++) {
        numel[i] = regc_reader_int(rd, 0, SIZE_BOUND);
        offset[i] = regc_reader_int(rd, 0, SIZE_BOUND);
        unit[i] = (int)regc_reader_int(rd, 0, n_units - 1);
    }
    if (!rd->failed && regc_shard_layout_new(p->ranks, n_params, numel, offset, unit, n_units, out))
        rd->failed = 1;
    free(numel), free(offset), free(unit);
}

void regc_program_write(const regc_program *p, const regc_compile_stats *st, regc_bytes *b)
{
    regc_bytes_put_i64(b, p->level);
    regc_bytes_put_i64(b, p->lazy);
    regc_bytes_put_i64(b, p->forward_only);
    regc_bytes_put_i64(b, p->accumulate_grads);
    regc_bytes_put_i64(b, p->ranks);
    regc_bytes_put_i64(b, p->zero_stage);
    regc_bytes_put_i64(b, p->offload);
    regc_bytes_put_i64(b, p->offload_activation);
    regc_bytes_put_i64(b, p->n_signals);
    regc_bytes_put_i64(b, st->zero3_prefetch);
    regc_bytes_put_i64(b, p->n_resident);
    regc_bytes_put_i64(b, st->region_kinds);
    regc_bytes_put_i64(b, st->instances);
    regc_bytes_put_i64(b, st->n_instructions);
    /* inputs: what the trainer fills, by name */
    regc_bytes_put_i64(b, p->n_inputs);
    for (int i = 0; i < p->n_inputs; i++) {
        const regc_tensor *t = regc_graph_tensor(p->graph, p->inputs[i]);
        regc_bytes_put_str(b, t->name);
        regc_graph_canon_shape(b, t);
    }
    regc_bytes_put_i64(b, p->n_regions);
    for (int i = 0; i < p->n_regions; i++)
        regc_region_write(p->regions[i], b);
    /* lifetimes matter to a lazy program only (O0 allocates by them) */
    regc_bytes_put_i64(b, p->n_bufs);
    for (int i = 0; i < p->n_bufs; i++) {
        const regc_buf *x = &p->bufs[i];
        regc_bytes_put_i64(b, x->kind);
        regc_bytes_put_i64(b, x->bytes);
        regc_bytes_put_i64(b, x->offset);
        if (p->lazy) {
            regc_bytes_put_i64(b, x->first);
            regc_bytes_put_i64(b, x->last);
            regc_bytes_put_i64(b, x->away); /* O0's offload */
            regc_bytes_put_i64(b, x->back);
        }
    }
    if (p->lazy) {
        write_steps(p, b);
    } else { /* inlined back: the flat list is the whole program */
        regc_bytes_put_i64(b, p->n_instr);
        for (int i = 0; i < p->n_instr; i++)
            put_program_instr(b, p, &p->instr[i]);
    }
    regc_bytes_put_i64(b, p->n_update);
    for (int i = 0; i < p->n_update; i++)
        put_program_instr(b, p, &p->update[i]);
    write_layout(p->layout, b);
    write_layout(p->frozen_layout, b);
    regc_bytes_put_i64(b, p->block_bytes);
    regc_bytes_put_i64(b, p->frozen_bytes);
    regc_bytes_put_i64(b, p->loss.buf);
    regc_bytes_put_i64(b, p->loss.off);
    regc_bytes_put_i64(b, p->arena_bytes);
    regc_bytes_put_i64(b, p->lower_bound);
    regc_bytes_put_i64(b, p->fused_pairs);
    regc_bytes_put_i64(b, p->reordered);
}

uint64_t regc_program_hash(const regc_program *p)
{
    regc_compile_stats st = {0};
    regc_bytes b = {0};
    regc_program_write(p, &st, &b);
    uint64_t h = b.failed ? 0 : regc_hash64(b.data, b.len);
    regc_bytes_free(&b);
    return h;
}

/* The inputs as a graph of inputs only: what the trainer reads. */
static int read_inputs(regc_reader *rd, regc_program *p)
{
    int n = get_count(rd);
    if (rd->failed || !(p->graph = regc_graph_new()) ||
        !(p->inputs = malloc(((size_t)n + 1) * sizeof *p->inputs))) {
        rd->failed = 1;
        return 0;
    }
    p->n_inputs = n;
    for (int i = 0; i < n && !rd->failed; i++) {
        char *name = regc_reader_str(rd);
        if (!printable(name))
            rd->failed = 1;
        regc_dtype dtype = (regc_dtype)regc_reader_int(rd, 0, REGC_DTYPE_COUNT - 1);
        int ndim = (int)regc_reader_int(rd, 0, REGC_MAX_DIMS);
        int64_t shape[REGC_MAX_DIMS] = {0}, numel = 1;
        for (int d = 0; d < ndim; d++) { /* each bounded, and so is the product */
            shape[d] = regc_reader_int(rd, 1, SIZE_BOUND);
            numel = numel > SIZE_BOUND / shape[d] ? SIZE_BOUND + 1 : numel * shape[d];
        }
        if (numel > SIZE_BOUND)
            rd->failed = 1;
        int t = rd->failed
                    ? -1
                    : regc_graph_add_tensor(p->graph, name, dtype, REGC_ROLE_INPUT, ndim, shape);
        free(name);
        if (t < 0)
            rd->failed = 1;
        p->inputs[i] = t;
    }
    return !rd->failed;
}

static int read_steps(regc_reader *rd, regc_program *p)
{
    p->n_pieces = get_count(rd);
    if (rd->failed || !(p->pieces = calloc((size_t)p->n_pieces + 1, sizeof *p->pieces)))
        return rd->failed = 1, 0;
    for (int i = 0; i < p->n_pieces; i++)
        p->pieces[i].region = (int)regc_reader_int(rd, 0, p->n_regions - 1);
    int n = get_count(rd);
    if (rd->failed || !(p->steps = calloc((size_t)n + 1, sizeof *p->steps)))
        return rd->failed = 1, 0;
    for (int i = 0; i < n && !rd->failed; i++) {
        lazy_step *s = &p->steps[i];
        p->n_steps = i + 1;
        s->piece = (int)regc_reader_int(rd, -1, p->n_pieces - 1);
        if (s->piece < 0) {
            get_program_instr(rd, p, &s->instr);
            continue;
        }
        s->backward = (int)regc_reader_int(rd, 0, 1);
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        if (rd->failed || !(s->bind = malloc(((size_t)r->n_slots + 1) * sizeof *s->bind)))
            return rd->failed = 1, 0;
        for (int k = 0; k < r->n_slots; k++) {
            s->bind[k].buf = (int32_t)regc_reader_int(rd, -1, p->n_bufs - 1);
            s->bind[k].off = regc_reader_int(rd, 0, INT64_MAX);
        }
    }
    return !rd->failed;
}

int regc_program_read(const void *data, size_t len, regc_program **out, regc_compile_stats *into)
{
    *out = NULL;
    /* the stats reach the caller only with a sound program: a compile
     * after a refused entry counts its own from zero */
    regc_compile_stats local = *into, *st = &local;
    regc_reader rd = regc_reader_of(data, len);
    regc_program *p = calloc(1, sizeof *p);
    if (!p)
        return regc_error(REGC_ERR_MEMORY, "compile cache: out of memory");
    p->level = (regc_level)regc_reader_int(&rd, REGC_LEVEL_O0, REGC_LEVEL_O2);
    p->lazy = (int)regc_reader_int(&rd, 0, 1);
    p->forward_only = (int)regc_reader_int(&rd, 0, 1);
    p->accumulate_grads = (int)regc_reader_int(&rd, 0, 1);
    p->ranks = (int)regc_reader_int(&rd, 1, 1 << 20);
    p->zero_stage = (int)regc_reader_int(&rd, 0, 3);
    p->offload = (int)regc_reader_int(&rd, 0, 1);
    p->offload_activation = (int)regc_reader_int(&rd, 0, 1);
    p->n_signals = (int)regc_reader_int(&rd, 0, INT32_MAX);
    st->zero3_prefetch = regc_reader_int(&rd, INT64_MIN / 2, INT64_MAX);
    p->n_resident = (int)regc_reader_int(&rd, 0, INT32_MAX);
    st->region_kinds = (int)regc_reader_int(&rd, 0, INT32_MAX);
    st->instances = (int)regc_reader_int(&rd, 0, INT32_MAX);
    st->n_instructions = regc_reader_int(&rd, 0, INT64_MAX);
    int rc = REGC_OK;
    if (read_inputs(&rd, p)) {
        int n = get_count(&rd);
        if (rd.failed || !(p->regions = calloc((size_t)n + 1, sizeof *p->regions)))
            rd.failed = 1;
        for (int i = 0; i < n && !rd.failed && rc == REGC_OK; i++)
            if ((rc = regc_region_read(&rd, &p->regions[i])) == REGC_OK)
                p->n_regions = i + 1;
    }
    if (!rd.failed && rc == REGC_OK) {
        p->n_bufs = p->cap_bufs = get_count(&rd);
        if (rd.failed || !(p->bufs = calloc((size_t)p->n_bufs + 1, sizeof *p->bufs)))
            rd.failed = 1;
        for (int i = 0; i < p->n_bufs && !rd.failed; i++) {
            regc_buf *x = &p->bufs[i];
            x->kind = (regc_buf_kind)regc_reader_int(&rd, BUF_ARENA, BUF_FROZEN);
            x->bytes = regc_reader_int(&rd, 0, INT64_MAX);
            x->offset = regc_reader_int(&rd, 0, INT64_MAX);
            x->first = p->lazy ? (int)regc_reader_int(&rd, -1, INT32_MAX) : -1;
            x->last = p->lazy ? (int)regc_reader_int(&rd, -1, INT32_MAX) : -1;
            x->away = p->lazy ? (int)regc_reader_int(&rd, -1, INT32_MAX) : -1;
            x->back = p->lazy ? (int)regc_reader_int(&rd, -1, INT32_MAX) : -1;
            x->inplace_of = -1;
            if ((x->away < 0) != (x->back < 0) || (x->away >= 0 && x->back <= x->away))
                rd.failed = 1; /* a copy back before it left */
            if (x->kind == BUF_INPUT && x->offset >= p->n_inputs)
                rd.failed = 1;
            if (x->kind == BUF_SCALARS &&
                (x->offset != 0 || x->bytes != (int64_t)sizeof(regc_step_scalars)))
                rd.failed = 1;
        }
    }
    if (!rd.failed && rc == REGC_OK && p->lazy) {
        read_steps(&rd, p);
    } else if (!rd.failed && rc == REGC_OK) {
        int n = get_count(&rd);
        if (rd.failed || !(p->instr = calloc((size_t)n + 1, sizeof *p->instr)))
            rd.failed = 1;
        for (int i = 0; i < n && !rd.failed; i++)
            if (get_program_instr(&rd, p, &p->instr[i]))
                p->n_instr = i + 1;
    }
    if (!rd.failed && rc == REGC_OK) {
        int n = get_count(&rd);
        if (rd.failed || !(p->update = calloc((size_t)n + 1, sizeof *p->update)))
            rd.failed = 1;
        for (int i = 0; i < n && !rd.failed; i++)
            if (get_program_instr(&rd, p, &p->update[i]))
                p->n_update = i + 1;
    }
    if (!rd.failed && rc == REGC_OK)
        read_layout(&rd, p, &p->layout);
    if (!rd.failed && rc == REGC_OK)
        read_layout(&rd, p, &p->frozen_layout);
    if ((p->layout != NULL) != (p->zero_stage == 3) || (p->frozen_layout && !p->layout))
        rd.failed = 1;
    p->block_bytes = regc_reader_int(&rd, 0, INT64_MAX);
    p->frozen_bytes = regc_reader_int(&rd, 0, INT64_MAX);
    p->loss.buf = (int32_t)regc_reader_int(&rd, 0, p->n_bufs - 1);
    p->loss.off = regc_reader_int(&rd, 0, INT64_MAX);
    p->arena_bytes = regc_reader_int(&rd, 0, INT64_MAX);
    p->lower_bound = regc_reader_int(&rd, 0, INT64_MAX);
    p->fused_pairs = (int)regc_reader_int(&rd, 0, INT32_MAX);
    p->reordered = (int)regc_reader_int(&rd, 0, 1);
    if (rd.p != rd.end)
        rd.failed = 1;
    if (rd.failed && rc == REGC_OK)
        rc = regc_error(REGC_ERR_FORMAT, "compile cache: malformed step program");
    if (rc == REGC_OK && regc_program_validate(p) != REGC_OK)
        rc = refuse("unsound step program");
    if (rc) {
        regc_program_free(p);
        return rc;
    }
    st->add_norm_fusions = p->fused_pairs;
    st->peak_bytes = p->arena_bytes;
    st->lower_bound_bytes = p->lower_bound;
    st->memory_aware_order = p->reordered;
    st->zero3_units = regc_program_gather_units(p);
    st->zero3_resident = p->n_resident;
    *into = local;
    *out = p;
    return REGC_OK;
}
