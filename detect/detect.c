/* detect.c — finding the repeated layers of a flat graph.
 *
 * 1. detect_order.c gives every node a structural label and lays the nodes
 *    out in a canonical order in which a layer stack reads as a periodic
 *    sequence of labels.
 * 2. Candidate periods come from the gaps between equal labels (a label
 *    that occurs once per layer recurs at the layer's length; twice that
 *    catches layers that alternate). For each period, maximal periodic runs
 *    are cut into instances where the fewest tensors cross the cut (a layer
 *    boundary passes just the hidden state), and every instance is checked
 *    exactly against the first and for being chained to its predecessor.
 * 3. The best run (most nodes covered) is taken and extended at both ends by
 *    matching the template through the wiring, which finds a layer the
 *    canonical order laid out differently (T5's first decoder layer, whose
 *    cross-attention reads the encoder) and reports near misses.
 * 4. Repeat on what is left; runs whose templates match share a kind.
 * 5. The glue is split around the runs into prologue, interludes and
 *    epilogue, and every formal is classified as carried, shared or per
 *    instance.
 * Steps 2-4 are detect_runs.c; this file turns the runs into region kinds
 * and the program of glue and runs (step 5).
 * Each step is linear in the graph (times a small number of candidate
 * periods), so an 80-layer graph takes well under a millisecond per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detect_internal.h"

/* ---------------------------------------------------- the result */

struct regc_blocks {
    int n_kinds;
    regc_region_kind *kinds;
    int n_segments;
    regc_segment *segments;
    int n_near;
    regc_near_miss *near;
    double coverage;
};

static int first_pos(const detector *d, const run_t *r)
{
    int best = d->c.n_nodes;
    for (int j = 0; j < r->p; j++)
        if (d->c.pos[r->nodes[j]] < best)
            best = d->c.pos[r->nodes[j]];
    return best;
}

/* Runs in execution order: by where their first instance starts in the
 * canonical order (a run never reads a later one). */
static void rank_runs(detector *d, int *order)
{
    for (int i = 0; i < d->n_runs; i++)
        order[i] = i;
    for (int i = 1; i < d->n_runs; i++) {
        int x = order[i], k = i;
        while (k > 0 && first_pos(d, &d->runs[order[k - 1]]) > first_pos(d, &d->runs[x])) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = x;
    }
    for (int i = 0; i < d->n_runs; i++)
        d->runs[order[i]].rank = i;
}

/* Glue level of every glue node: the number of runs that must finish
 * before it. Returns the id of a run that reads glue of a later level (the
 * runs cannot be ordered as found), or -1 when the order is valid. */
static int glue_levels(detector *d, int *level)
{
    const detect_ctx *c = &d->c;
    for (int i = 0; i < c->n_nodes; i++) { /* graph order is topological */
        const regc_node *nd = regc_graph_node(c->g, i);
        int lvl = 0, own = c->owner[i];
        for (int q = 0; q < nd->n_in; q++) {
            int pr = regc_graph_tensor(c->g, nd->in[q])->producer;
            if (pr < 0)
                continue;
            int l = c->owner[pr] >= 0 ? d->runs[c->owner[pr]].rank + 1 : level[pr];
            if (own >= 0 && own != c->owner[pr] && l > d->runs[own].rank)
                return own;
            if (l > lvl)
                lvl = l;
        }
        level[i] = own >= 0 ? -1 : lvl;
    }
    return -1;
}

/* Kind k's arrays: its runs in rank order, their instances numbered in
 * execution order. */
static int build_kind(detector *d, int k, const int *order, regc_region_kind *out)
{
    const detect_ctx *c = &d->c;
    const run_t *first = NULL;
    int n_inst = 0;
    for (int i = 0; i < d->n_runs; i++) {
        const run_t *r = &d->runs[order[i]];
        if (r->kind != k)
            continue;
        if (!first)
            first = r;
        n_inst += r->n;
    }
    const int p = first->p, nf = first->nf;
    int *nodes = malloc((size_t)n_inst * (size_t)p * sizeof *nodes);
    int *in_bind = malloc(((size_t)n_inst * (size_t)nf + 1) * sizeof *in_bind);
    regc_formal_input *inputs = malloc(((size_t)nf + 1) * sizeof *inputs);
    /* at most every output of every template node */
    regc_formal_output *outputs = malloc(((size_t)p * REGC_MAX_IO + 1) * sizeof *outputs);
    int *out_bind = NULL;
    if (!nodes || !in_bind || !inputs || !outputs)
        goto oom;
    int at = 0;
    for (int i = 0; i < d->n_runs; i++) {
        const run_t *r = &d->runs[order[i]];
        if (r->kind != k)
            continue;
        memcpy(nodes + at * p, r->nodes, (size_t)r->n * (size_t)p * sizeof *nodes);
        memcpy(in_bind + at * nf, r->bind, (size_t)r->n * (size_t)nf * sizeof *in_bind);
        at += r->n;
    }
    detect_template_formals(&d->c, nodes, p, inputs);
    int64_t params = 0;
    for (int f = 0; f < nf; f++) {
        int shared = 1;
        for (int i = 1; i < n_inst; i++)
            shared &= in_bind[i * nf + f] == in_bind[f];
        const regc_tensor *t = regc_graph_tensor(c->g, in_bind[f]);
        inputs[f].cls = first->carried_j[f] >= 0 ? REGC_FORMAL_CARRIED
                        : shared                 ? REGC_FORMAL_SHARED
                                                 : REGC_FORMAL_PER_INSTANCE;
        if (inputs[f].cls == REGC_FORMAL_PER_INSTANCE && t->producer < 0 &&
            t->role == REGC_ROLE_PARAM)
            params += regc_tensor_numel(t);
    }
    /* outputs: read outside their instance (or a graph output) in some instance */
    char *used = calloc((size_t)p * REGC_MAX_IO + 1, 1);
    if (!used)
        goto oom;
    for (int i = 0; i < n_inst; i++) {
        for (int j = 0; j < p; j++)
            d->where[nodes[i * p + j]] = j;
        for (int j = 0; j < p; j++) {
            const regc_node *nd = regc_graph_node(c->g, nodes[i * p + j]);
            for (int s = 0; s < nd->n_out; s++) {
                int t = nd->out[s];
                used[j * REGC_MAX_IO + s] |= d->is_output[t];
                for (int e = c->cons_start[t]; e < c->cons_start[t + 1]; e++)
                    used[j * REGC_MAX_IO + s] |= d->where[c->cons_node[e]] < 0;
            }
        }
        for (int j = 0; j < p; j++)
            d->where[nodes[i * p + j]] = -1;
    }
    int n_out = 0;
    for (int j = 0; j < p; j++)
        for (int s = 0; s < REGC_MAX_IO; s++)
            if (used[j * REGC_MAX_IO + s])
                outputs[n_out++] = (regc_formal_output){j, s};
    free(used);
    out_bind = malloc(((size_t)n_inst * (size_t)n_out + 1) * sizeof *out_bind);
    if (!out_bind)
        goto oom;
    for (int i = 0; i < n_inst; i++)
        for (int o = 0; o < n_out; o++)
            out_bind[i * n_out + o] =
                regc_graph_node(c->g, nodes[i * p + outputs[o].node])->out[outputs[o].slot];
    *out = (regc_region_kind){.n_nodes = p,
                              .n_inputs = nf,
                              .n_outputs = n_out,
                              .inputs = inputs,
                              .outputs = outputs,
                              .n_instances = n_inst,
                              .nodes = nodes,
                              .in_bind = in_bind,
                              .out_bind = out_bind,
                              .params_per_instance = params};
    return REGC_OK;
oom:
    free(nodes), free(in_bind), free(inputs), free(outputs), free(out_bind);
    return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
}

/* Prologue, runs with the glue between them, epilogue. */
static int build_segments(detector *d, const int *order, const int *level, regc_blocks *b)
{
    const detect_ctx *c = &d->c;
    const int n_levels = d->n_runs + 1;
    b->segments = calloc((size_t)(2 * n_levels) + 1, sizeof *b->segments);
    int *glue = malloc(((size_t)c->n_nodes + 1) * sizeof *glue);
    if (!b->segments || !glue) {
        free(glue);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    int n_glue = 0, *first_inst = calloc((size_t)b->n_kinds + 1, sizeof *first_inst);
    if (!first_inst) {
        free(glue);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    for (int l = 0; l < n_levels; l++) {
        int start = n_glue;
        for (int k = 0; k < c->n_nodes; k++) /* canonical order: topological */
            if (c->owner[c->seq[k]] < 0 && level[c->seq[k]] == l)
                glue[n_glue++] = c->seq[k];
        if (n_glue > start || l == 0 || l == n_levels - 1)
            b->segments[b->n_segments++] = (regc_segment){
                .type = REGC_SEGMENT_GLUE, .n_nodes = n_glue - start, .nodes = glue + start};
        if (l < d->n_runs) {
            const run_t *r = &d->runs[order[l]];
            b->segments[b->n_segments++] = (regc_segment){.type = REGC_SEGMENT_RUN,
                                                          .kind = r->kind,
                                                          .first = first_inst[r->kind],
                                                          .count = r->n};
            first_inst[r->kind] += r->n;
        }
    }
    free(first_inst);
    /* the first segment owns the glue array */
    if (b->n_segments == 0 || b->segments[0].nodes != glue)
        free(glue);
    return REGC_OK;
}
void regc_blocks_free(regc_blocks *b)
{
    if (!b)
        return;
    for (int k = 0; k < b->n_kinds; k++) {
        regc_region_kind *r = &b->kinds[k];
        free((void *)r->inputs), free((void *)r->outputs), free((void *)r->nodes);
        free((void *)r->in_bind), free((void *)r->out_bind);
    }
    if (b->n_segments > 0)
        free((void *)b->segments[0].nodes);
    free(b->kinds), free(b->segments), free(b->near);
    free(b);
}
int regc_detect_blocks(const regc_graph *g, regc_blocks **out)
{
    *out = NULL;
    detector d;
    regc_blocks *b = calloc(1, sizeof *b);
    int rc = b ? detect_detector_init(&d, g) : regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    int *order = NULL, *level = NULL;
    if (rc == REGC_OK)
        rc = detect_find_runs(&d);
    if (rc == REGC_OK) {
        order = malloc(((size_t)d.n_runs + 1) * sizeof *order);
        level = malloc(((size_t)d.c.n_nodes + 1) * sizeof *level);
        if (!order || !level)
            rc = regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    /* A run that reads glue computed from a later run cannot be placed: give
     * it back to the glue and order the rest again. */
    int bad = -1;
    while (rc == REGC_OK) {
        rank_runs(&d, order);
        if ((bad = glue_levels(&d, level)) < 0)
            break;
        detect_drop_run(&d, bad);
    }
    if (rc == REGC_OK) {
        b->n_kinds = detect_assign_kinds(&d);
        b->kinds = calloc((size_t)b->n_kinds + 1, sizeof *b->kinds);
        if (!b->kinds)
            rc = regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    for (int k = 0; rc == REGC_OK && k < b->n_kinds; k++)
        rc = build_kind(&d, k, order, &b->kinds[k]);
    if (rc == REGC_OK)
        rc = build_segments(&d, order, level, b);
    if (rc == REGC_OK) {
        int covered = 0;
        for (int i = 0; i < d.c.n_nodes; i++)
            covered += d.c.owner[i] >= 0;
        b->coverage = d.c.n_nodes ? (double)covered / d.c.n_nodes : 0.0;
        /* near misses name kinds, not the runs they were found from */
        for (int i = 0; i < d.n_near; i++)
            if (d.near[i].kind >= 0)
                d.near[i].kind = d.runs[d.near[i].kind].kind;
        b->near = d.near, b->n_near = d.n_near;
        d.near = NULL;
    }
    free(order), free(level);
    if (b)
        detect_detector_free(&d);
    if (rc != REGC_OK) {
        regc_blocks_free(b);
        return rc;
    }
    *out = b;
    return REGC_OK;
}

int regc_blocks_n_kinds(const regc_blocks *b) { return b->n_kinds; }
const regc_region_kind *regc_blocks_kind(const regc_blocks *b, int k)
{
    return k >= 0 && k < b->n_kinds ? &b->kinds[k] : NULL;
}
int regc_blocks_n_segments(const regc_blocks *b) { return b->n_segments; }
const regc_segment *regc_blocks_segment(const regc_blocks *b, int i)
{
    return i >= 0 && i < b->n_segments ? &b->segments[i] : NULL;
}
int regc_blocks_n_near_misses(const regc_blocks *b) { return b->n_near; }
const regc_near_miss *regc_blocks_near_miss(const regc_blocks *b, int i)
{
    return i >= 0 && i < b->n_near ? &b->near[i] : NULL;
}
double regc_blocks_coverage(const regc_blocks *b) { return b->coverage; }
