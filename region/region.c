/* region.c — compile one region: extract its graph with its formals,
 * differentiate it, give every tensor a slot (program value, saved per
 * instance, or temporary), lower the nodes to instructions (lower.c) and
 * plan the temporaries' memory.
 *
 * The backward region takes the incoming gradient of each output (DOUT)
 * and, for an input that later code also reads, the gradient those readers
 * already accumulated (SEED): autodiff adds this region's contributions to
 * it in the order one whole-graph pass would, so a step compiled region by
 * region gives the same bits as the whole graph compiled at once. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "program.h"
#include "region_internal.h"

void regc_compiled_region_free(regc_compiled_region *r)
{
    if (!r)
        return;
    free(r->name);
    regc_graph_free(r->graph);
    free(r->slots);
    free(r->in_slot), free(r->out_slot), free(r->dout_slot), free(r->seed_slot), free(r->din_slot);
    free(r->fwd), free(r->bwd), free(r->ew), free(r->recompute_ratios);
    free(r);
}

/* The region graph: formals as inputs (parameters stay parameters, so
 * dumps read naturally), then the nodes in the given order. map[] takes
 * graph tensor ids to region ids for the formals and node outputs. */
static int extract(const regc_graph *g, const regc_region_spec *s, regc_graph *rg, int *map_in,
                   int *map_out, char **keep)
{
    int n_t = regc_graph_n_tensors(g);
    int *map = malloc(((size_t)n_t + 1) * sizeof *map);
    if (!map)
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    for (int t = 0; t < n_t; t++)
        map[t] = -1;
    int rc = REGC_OK;
    for (int k = 0; k < s->n_in && rc == REGC_OK; k++) {
        const regc_tensor *t = regc_graph_tensor(g, s->in[k]);
        char name[300];
        snprintf(name, sizeof name, "in%d(%s)", k, t->name);
        int id = regc_graph_add_tensor(
            rg, name, t->dtype, t->role == REGC_ROLE_PARAM ? REGC_ROLE_PARAM : REGC_ROLE_INPUT,
            t->ndim, t->shape);
        if (id < 0)
            rc = id;
        map[s->in[k]] = map_in[k] = id;
    }
    for (int i = 0; i < s->n_nodes && rc == REGC_OK; i++) {
        const regc_node *n = regc_graph_node(g, s->nodes[i]);
        int in[REGC_MAX_IO], out[REGC_MAX_IO];
        for (int k = 0; k < n->n_in && rc == REGC_OK; k++)
            if ((in[k] = map[n->in[k]]) < 0)
                rc = regc_error(REGC_ERR_ARG,
                                "region %s: node %d reads %s, which is neither a "
                                "formal nor produced inside",
                                s->name, s->nodes[i], regc_graph_tensor(g, n->in[k])->name);
        if (rc)
            break;
        const regc_tensor *o0 = regc_graph_tensor(g, n->out[0]);
        int r = regc_graph_add_node(rg, n->op, &n->attrs, n->n_in, in, n->n_out, out, o0->ndim,
                                    o0->shape);
        if (r < 0)
            rc = r;
        for (int k = 0; k < n->n_out && rc == REGC_OK; k++)
            map[n->out[k]] = out[k];
    }
    for (int k = 0; k < s->n_out && rc == REGC_OK; k++)
        if ((map_out[k] = map[s->out[k]]) < 0)
            rc = regc_error(REGC_ERR_ARG, "region %s: output %s is not produced inside", s->name,
                            regc_graph_tensor(g, s->out[k])->name);
    /* the tensors never recomputed, in region numbers */
    if (rc == REGC_OK && s->keep && !(*keep = calloc((size_t)regc_graph_n_tensors(rg) + 1, 1)))
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    for (int t = 0; t < n_t && rc == REGC_OK && s->keep; t++)
        if (map[t] >= 0 && s->keep[t])
            (*keep)[map[t]] = s->keep[t];
    free(map);
    return rc;
}

/* A new region input shaped like tensor t, named prefix<k>: its id, or a
 * negative status. */
static int input_like(regc_graph *rg, int t, const char *prefix, int k)
{
    const regc_tensor x = *regc_graph_tensor(rg, t); /* a copy: adding moves the array */
    char name[64];
    snprintf(name, sizeof name, "%s%d", prefix, k);
    return regc_graph_add_tensor(rg, name, x.dtype, REGC_ROLE_INPUT, x.ndim, x.shape);
}

/* Seed every output that has an incoming gradient and every input whose
 * gradient later readers began; differentiate. dout_t/seed_t: the seed
 * tensors, -1 where none. */
static int differentiate(regc_compiled_region *r, const regc_region_spec *s, const int *in_t,
                         const int *out_t, int *dout_t, int *seed_t, int *din_t)
{
    regc_graph *rg = r->graph;
    int n_t = regc_graph_n_tensors(rg), n_nodes = regc_graph_n_nodes(rg);
    int n_seeds = 0, rc = REGC_OK;
    int *ys = malloc(((size_t)(s->n_in + s->n_out) + 1) * sizeof *ys);
    int *dys = malloc(((size_t)(s->n_in + s->n_out) + 1) * sizeof *dys);
    int *grad_of = malloc(((size_t)n_t + 1) * sizeof *grad_of);
    char *leaf = calloc((size_t)n_t + 1, 1);
    if (!ys || !dys || !grad_of || !leaf)
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    for (int k = 0; k < s->n_in && rc == REGC_OK; k++)
        leaf[in_t[k]] = s->in_needs_grad[k];
    for (int k = 0; k < s->n_out && rc == REGC_OK; k++) {
        int id = s->out_has_grad[k] ? input_like(rg, out_t[k], "dout", k) : -1;
        if (s->out_has_grad[k] && id < 0)
            rc = id;
        dout_t[k] = id < 0 ? -1 : id;
        if (id >= 0)
            ys[n_seeds] = out_t[k], dys[n_seeds++] = id;
    }
    for (int k = 0; k < s->n_in && rc == REGC_OK; k++) {
        int want = s->in_seeded[k] && s->in_needs_grad[k];
        int id = want ? input_like(rg, in_t[k], "seed", k) : -1;
        if (want && id < 0)
            rc = id;
        seed_t[k] = id < 0 ? -1 : id;
        if (id >= 0)
            ys[n_seeds] = in_t[k], dys[n_seeds++] = id;
    }
    if (rc == REGC_OK && n_seeds > 0)
        rc = regc_autodiff_seeded(rg, n_t, n_nodes, n_seeds, ys, dys, leaf, grad_of);
    for (int k = 0; k < s->n_in; k++) {
        din_t[k] = -1;
        /* an input whose gradient is exactly its seed passes through */
        if (rc == REGC_OK && n_seeds > 0 && s->in_needs_grad[k] && grad_of[in_t[k]] >= 0 &&
            grad_of[in_t[k]] != seed_t[k])
            din_t[k] = grad_of[in_t[k]];
    }
    free(ys), free(dys), free(grad_of), free(leaf);
    return rc;
}

/* ---------------------------------------------------------------- slots */

int regc_region_add_temp(regc_compiled_region *r, int like, int64_t bytes)
{
    regc_slot *grown = realloc(r->slots, ((size_t)r->n_slots + 1) * sizeof *grown);
    if (!grown)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    r->slots = grown;
    r->slots[r->n_slots] = (regc_slot){.kind = SLOT_TEMP,
                                       .index = -1,
                                       .bytes = bytes,
                                       .alias = -1,
                                       .tensor = r->slots[like].tensor,
                                       .bf16 = r->slots[like].bf16};
    return r->n_slots++;
}

static int new_slot(regc_compiled_region *r, regc_slot_kind kind, int index, int tensor)
{
    regc_slot *sl = &r->slots[r->n_slots];
    *sl = (regc_slot){.kind = kind,
                      .index = index,
                      .alias = -1,
                      .tensor = tensor,
                      .bytes = regc_tensor_bytes(regc_graph_tensor(r->graph, tensor))};
    return r->n_slots++;
}

/* Give every region tensor a slot. slot_of[t] for each tensor; the caller
 * has added the copy nodes a passthrough gradient needs. */
static int assign_slots(regc_compiled_region *r, const int *in_t, const int *out_t,
                        const int *dout_t, const int *seed_t, const int *din_t, int *slot_of)
{
    regc_graph *rg = r->graph;
    int n_t = regc_graph_n_tensors(rg), n_nodes = regc_graph_n_nodes(rg);
    r->slots = calloc((size_t)n_t + 1, sizeof *r->slots);
    int *k_out = malloc(((size_t)n_t + 1) * sizeof *k_out),
        *k_din = malloc(((size_t)n_t + 1) * sizeof *k_din);
    char *read_bwd = calloc((size_t)n_t + 1, 1);
    if (!r->slots || !k_out || !k_din || !read_bwd) {
        free(k_out), free(k_din), free(read_bwd);
        return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    }
    for (int t = 0; t < n_t; t++)
        slot_of[t] = -1, k_out[t] = -1, k_din[t] = -1;
    for (int k = 0; k < r->n_out; k++)
        k_out[out_t[k]] = k;
    for (int k = 0; k < r->n_in; k++)
        if (din_t[k] >= 0)
            k_din[din_t[k]] = k;
    for (int i = r->n_fwd_nodes; i < n_nodes; i++) {
        const regc_node *n = regc_graph_node(rg, i);
        for (int k = 0; k < n->n_in; k++)
            read_bwd[n->in[k]] = 1;
    }
    for (int k = 0; k < r->n_in; k++) {
        r->in_slot[k] = slot_of[in_t[k]] = new_slot(r, SLOT_IN, k, in_t[k]);
        if (seed_t[k] >= 0)
            r->seed_slot[k] = slot_of[seed_t[k]] = new_slot(r, SLOT_SEED, k, seed_t[k]);
    }
    for (int k = 0; k < r->n_out; k++)
        if (dout_t[k] >= 0)
            r->dout_slot[k] = slot_of[dout_t[k]] = new_slot(r, SLOT_DOUT, k, dout_t[k]);
    for (int i = 0; i < n_nodes; i++) {
        const regc_node *n = regc_graph_node(rg, i);
        for (int k = 0; k < n->n_out; k++) {
            int t = n->out[k];
            if (k_out[t] >= 0 && i < r->n_fwd_nodes)
                r->out_slot[k_out[t]] = slot_of[t] = new_slot(r, SLOT_OUT, k_out[t], t);
            else if (k_din[t] >= 0 && i >= r->n_fwd_nodes)
                r->din_slot[k_din[t]] = slot_of[t] = new_slot(r, SLOT_DIN, k_din[t], t);
            else
                slot_of[t] =
                    new_slot(r, i < r->n_fwd_nodes && read_bwd[t] ? SLOT_SAVED : SLOT_TEMP, -1, t);
        }
    }
    free(k_out), free(k_din), free(read_bwd);
    return REGC_OK;
}

/* A region tensor whose gradient must land in a DIN slot but that is not
 * produced by a backward node (an output's incoming gradient passed
 * straight through, as a residual add does) gets a copy node; so does a
 * gradient that is already another formal's (add(a, b) of two formals:
 * both gradients are the same tensor, and each DIN slot needs its own). */
static int add_passthrough_copies(regc_compiled_region *r, int *din_t)
{
    regc_graph *rg = r->graph;
    for (int k = 0; k < r->n_in; k++) {
        if (din_t[k] < 0)
            continue;
        int producer = regc_graph_tensor(rg, din_t[k])->producer, shared = 0;
        for (int j = 0; j < k; j++)
            shared |= din_t[j] == din_t[k];
        if (producer >= r->n_fwd_nodes && !shared)
            continue;
        const regc_tensor *t = regc_graph_tensor(rg, din_t[k]);
        int64_t shape[REGC_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        int c = regc_graph_reshape(rg, din_t[k], t->ndim, shape); /* a copy of the same shape */
        if (c < 0)
            return c;
        din_t[k] = c;
    }
    return REGC_OK;
}

/* ---------------------------------------------------------------- memory */

/* Temporaries of one pass: lifetimes over its instruction list, planned. */
static int plan_pass(regc_compiled_region *r, const regc_instr *ins, int n, int64_t *bytes)
{
    int *first = malloc(((size_t)r->n_slots + 1) * sizeof *first);
    int *last = malloc(((size_t)r->n_slots + 1) * sizeof *last);
    regc_plan_buffer *pb = calloc((size_t)r->n_slots + 1, sizeof *pb);
    int64_t *off = malloc(((size_t)r->n_slots + 1) * sizeof *off);
    int *which = malloc(((size_t)r->n_slots + 1) * sizeof *which);
    int rc = REGC_OK;
    if (!first || !last || !pb || !off || !which) {
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        goto done;
    }
    for (int s = 0; s < r->n_slots; s++)
        first[s] = -1, last[s] = -1;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < ins[i].n_refs; k++) {
            int s = ins[i].refs[k].buf;
            if (s < 0 || r->slots[s].kind != SLOT_TEMP)
                continue;
            if (first[s] < 0)
                first[s] = i;
            last[s] = i;
        }
    int m = 0;
    for (int s = 0; s < r->n_slots; s++)
        if (first[s] >= 0) {
            pb[m] = (regc_plan_buffer){
                .bytes = r->slots[s].bytes, .first = first[s], .last = last[s], .inplace_of = -1};
            which[m++] = s;
        }
    regc_plan_result res;
    if ((rc = regc_plan_offsets(m, pb, REGC_PLAN_ALIGN, off, &res)))
        goto done;
    for (int j = 0; j < m; j++)
        r->slots[which[j]].offset = off[j];
    *bytes = res.peak_bytes;
done:
    free(first), free(last), free(pb), free(off), free(which);
    return rc;
}

static int plan_memory(regc_compiled_region *r)
{
    int64_t saved = 0;
    for (int s = 0; s < r->n_slots; s++)
        if (r->slots[s].kind == SLOT_SAVED && r->slots[s].alias < 0) {
            r->slots[s].offset = saved;
            saved += (r->slots[s].bytes + REGC_PLAN_ALIGN - 1) / REGC_PLAN_ALIGN * REGC_PLAN_ALIGN;
        }
    r->saved_bytes = saved;
    int64_t fwd = 0, bwd = 0;
    int rc = plan_pass(r, r->fwd, r->n_fwd, &fwd);
    if (rc == REGC_OK)
        rc = plan_pass(r, r->bwd, r->n_bwd, &bwd);
    r->scratch_bytes = fwd > bwd ? fwd : bwd;
    return rc;
}

/* ---------------------------------------------------------------- driver */

int regc_region_compile(const regc_graph *g, const regc_region_spec *s, regc_level level,
                        regc_precision precision, int bf16_storage, regc_compiled_region **out)
{
    *out = NULL;
    regc_compiled_region *r = calloc(1, sizeof *r);
    size_t nf = (size_t)(s->n_in + s->n_out) + 1;
    int *in_t = malloc(nf * sizeof *in_t), *out_t = malloc(nf * sizeof *out_t);
    int *dout_t = malloc(nf * sizeof *dout_t), *seed_t = malloc(nf * sizeof *seed_t);
    int *din_t = malloc(nf * sizeof *din_t);
    int *slot_of = NULL;
    char *keep = NULL; /* [region tensors] never recomputed, or NULL */
    int rc = REGC_OK;
    if (!r || !in_t || !out_t || !dout_t || !seed_t || !din_t || !(r->name = strdup(s->name)) ||
        !(r->graph = regc_graph_new())) {
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        goto done;
    }
    r->n_in = s->n_in, r->n_out = s->n_out;
    r->in_slot = malloc(nf * sizeof(int)), r->out_slot = malloc(nf * sizeof(int));
    r->dout_slot = malloc(nf * sizeof(int)), r->seed_slot = malloc(nf * sizeof(int));
    r->din_slot = malloc(nf * sizeof(int));
    if (!r->in_slot || !r->out_slot || !r->dout_slot || !r->seed_slot || !r->din_slot) {
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        goto done;
    }
    for (size_t k = 0; k < nf; k++)
        r->in_slot[k] = r->out_slot[k] = r->dout_slot[k] = r->seed_slot[k] = r->din_slot[k] = -1;
    if ((rc = extract(g, s, r->graph, in_t, out_t, &keep)))
        goto done;
    const int n_extracted = regc_graph_n_tensors(r->graph);
    r->n_fwd_nodes = regc_graph_n_nodes(r->graph);
    if ((rc = differentiate(r, s, in_t, out_t, dout_t, seed_t, din_t)) ||
        (rc = add_passthrough_copies(r, din_t)))
        goto done;
    slot_of = malloc(((size_t)regc_graph_n_tensors(r->graph) + 1) * sizeof *slot_of);
    if (!slot_of) {
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        goto done;
    }
    if (keep) { /* autodiff's tensors are gradients: never kept */
        char *grown = realloc(keep, (size_t)regc_graph_n_tensors(r->graph) + 1);
        if (!grown) {
            rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
            goto done;
        }
        keep = grown;
        memset(keep + n_extracted, 0, (size_t)(regc_graph_n_tensors(r->graph) - n_extracted) + 1);
    }
    if ((rc = assign_slots(r, in_t, out_t, dout_t, seed_t, din_t, slot_of)) ||
        (rc = regc_region_lower(r, slot_of, level)) ||
        (rc = regc_region_chunk_logits(r, s->logits_chunk_rows,
                                       precision == REGC_PRECISION_BF16 && bf16_storage)) ||
        (rc = regc_region_apply_precision(r, precision, bf16_storage, s->in_held)) ||
        (rc = regc_region_recompute(r, s->recompute, keep)) || (rc = plan_memory(r)))
        goto done;
    *out = r;
    r = NULL;
done:
    regc_compiled_region_free(r);
    free(in_t), free(out_t), free(dout_t), free(seed_t), free(din_t), free(slot_of), free(keep);
    return rc;
}

void regc_compiled_region_dump(const regc_compiled_region *r, FILE *f)
{
    static const char *const kinds[] = {"in", "out", "dout", "seed", "din", "saved", "temp"};
    fprintf(f,
            "# compiled region %s: %d formal inputs, %d outputs, %d forward and %d backward "
            "instructions, %lld saved bytes per instance, %lld scratch bytes\n",
            r->name, r->n_in, r->n_out, r->n_fwd, r->n_bwd, (long long)r->saved_bytes,
            (long long)r->scratch_bytes);
    for (int s = 0; s < r->n_slots; s++) {
        const regc_slot *sl = &r->slots[s];
        fprintf(f, "slot %d %s", s, kinds[sl->kind]);
        if (sl->index >= 0)
            fprintf(f, "%d", sl->index);
        fprintf(f, " %s bytes=%lld%s", regc_graph_tensor(r->graph, sl->tensor)->name,
                (long long)sl->bytes, sl->bf16 ? " bf16" : "");
        if (sl->alias >= 0)
            fprintf(f, " view of slot %d+%lld", sl->alias, (long long)sl->alias_off);
        else if (sl->kind == SLOT_SAVED || sl->kind == SLOT_TEMP)
            fprintf(f, " offset=%lld", (long long)sl->offset);
        fputc('\n', f);
    }
    fprintf(f, "# forward\n");
    for (int i = 0; i < r->n_fwd; i++)
        regc_instr_dump(&r->fwd[i], f);
    fprintf(f, "# backward\n");
    for (int i = 0; i < r->n_bwd; i++)
        regc_instr_dump(&r->bwd[i], f);
}
