/* detect_order.c — the structural view of a graph the detector works on:
 * one label per node (what the node is, not what it is called), consumers
 * of every tensor, and a canonical node order that depends on the graph's
 * structure only, never on names or on the order nodes were added in.
 *
 * The canonical order is a post-order walk from the graph's sinks that
 * visits a node's inputs deepest first (ties by input port), so a layer is
 * emitted right after the layer it depends on and, once the walk is inside
 * a stack, each layer's nodes come out contiguous and in the same order.
 * Nodes computed from graph inputs and parameters alone (embeddings, T5's
 * position bias, anything a layer stack only reads) are moved in front: in
 * the walk's order they would land inside the first layer that reads them
 * and make it look different from the others. */
#include <stdlib.h>
#include <string.h>

#include "detect_internal.h"

static uint64_t mix(uint64_t h, uint64_t v)
{
    return regc_rng_mix(h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2)));
}

static uint64_t mix_float(uint64_t h, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return mix(h, bits);
}

static uint64_t mix_tensor(uint64_t h, const regc_tensor *t)
{
    h = mix(h, (uint64_t)t->dtype);
    h = mix(h, (uint64_t)(t->producer < 0 ? t->role : REGC_ROLE_ACT));
    h = mix(h, (uint64_t)t->ndim);
    for (int d = 0; d < t->ndim; d++)
        h = mix(h, (uint64_t)t->shape[d]);
    return h;
}

static uint64_t node_label(const regc_graph *g, const regc_node *n)
{
    const regc_attrs *a = &n->attrs;
    uint64_t h = mix(0, (uint64_t)n->op);
    h = mix(h, (uint64_t)a->trans_a);
    h = mix(h, (uint64_t)a->trans_b);
    h = mix_float(h, a->eps);
    h = mix(h, (uint64_t)a->n_head);
    h = mix(h, (uint64_t)a->n_kv_head);
    h = mix(h, (uint64_t)a->inverse);
    h = mix(h, (uint64_t)a->causal);
    h = mix_float(h, a->scale);
    for (int d = 0; d < REGC_MAX_DIMS; d++)
        h = mix(h, (uint64_t)a->perm[d]);
    h = mix_float(h, a->value);
    h = mix(h, (uint64_t)a->vocab);
    h = mix(h, (uint64_t)n->n_in);
    for (int i = 0; i < n->n_in; i++)
        h = mix_tensor(h, regc_graph_tensor(g, n->in[i]));
    h = mix(h, (uint64_t)n->n_out);
    for (int i = 0; i < n->n_out; i++)
        h = mix_tensor(h, regc_graph_tensor(g, n->out[i]));
    return h;
}

/* Consumers of every tensor as a compressed list, in node order. */
static int build_consumers(detect_ctx *c)
{
    const regc_graph *g = c->g;
    int n_uses = 0;
    for (int i = 0; i < c->n_nodes; i++)
        n_uses += regc_graph_node(g, i)->n_in;
    c->cons_start = calloc((size_t)c->n_tensors + 1, sizeof *c->cons_start);
    c->cons_node = malloc(((size_t)n_uses + 1) * sizeof *c->cons_node);
    c->cons_port = malloc(((size_t)n_uses + 1) * sizeof *c->cons_port);
    int *fill = calloc((size_t)c->n_tensors + 1, sizeof *fill);
    if (!c->cons_start || !c->cons_node || !c->cons_port || !fill) {
        free(fill);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    for (int i = 0; i < c->n_nodes; i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int q = 0; q < n->n_in; q++)
            c->cons_start[n->in[q] + 1]++;
    }
    for (int t = 0; t < c->n_tensors; t++)
        c->cons_start[t + 1] += c->cons_start[t];
    for (int i = 0; i < c->n_nodes; i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int q = 0; q < n->n_in; q++) {
            int k = c->cons_start[n->in[q]] + fill[n->in[q]]++;
            c->cons_node[k] = i;
            c->cons_port[k] = q;
        }
    }
    free(fill);
    return REGC_OK;
}

/* The producer node of node i's input q, or -1 for a leaf. */
static int producer_of(const detect_ctx *c, int i, int q)
{
    return regc_graph_tensor(c->g, regc_graph_node(c->g, i)->in[q])->producer;
}

typedef struct {
    int depth;
    uint64_t label;
    int node;
} sink_key;

/* Sinks: deepest first, then by label; equal keys are interchangeable. */
static int cmp_sink(const void *pa, const void *pb)
{
    const sink_key *a = pa, *b = pb;
    if (a->depth != b->depth)
        return a->depth > b->depth ? -1 : 1;
    if (a->label != b->label)
        return a->label < b->label ? -1 : 1;
    return (a->node > b->node) - (a->node < b->node);
}

/* The inputs of node i as producer nodes, deepest first, ties by port. */
static int children(const detect_ctx *c, int i, int *kids)
{
    const regc_node *n = regc_graph_node(c->g, i);
    int k = 0;
    for (int q = 0; q < n->n_in; q++) {
        int p = producer_of(c, i, q);
        if (p < 0)
            continue;
        int j = k++;
        while (j > 0 && c->depth[kids[j - 1]] < c->depth[p]) {
            kids[j] = kids[j - 1];
            j--;
        }
        kids[j] = p;
    }
    return k;
}

/* Iterative post-order from the sinks; leaf-derived nodes first. */
static int build_sequence(detect_ctx *c)
{
    const int n = c->n_nodes;
    sink_key *sinks = malloc(((size_t)n + 1) * sizeof *sinks);
    int *stack = malloc(((size_t)n + 1) * sizeof *stack);
    int *next = calloc((size_t)n + 1, sizeof *next);    /* next child to visit */
    char *state = calloc((size_t)n + 1, 1);              /* 0 new, 1 open, 2 done */
    char *constant = calloc((size_t)n + 1, 1);           /* computed from leaves only */
    int *later = malloc(((size_t)n + 1) * sizeof *later);
    if (!sinks || !stack || !next || !state || !constant || !later) {
        free(sinks), free(stack), free(next), free(state), free(constant), free(later);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    int n_sinks = 0;
    for (int i = 0; i < n; i++) {
        const regc_node *nd = regc_graph_node(c->g, i);
        int used = 0, is_const = 1;
        for (int s = 0; s < nd->n_out; s++)
            used |= c->cons_start[nd->out[s] + 1] > c->cons_start[nd->out[s]];
        for (int q = 0; q < nd->n_in; q++) {
            int p = producer_of(c, i, q);
            is_const &= p < 0 || constant[p];
        }
        constant[i] = (char)is_const;
        if (!used)
            sinks[n_sinks++] = (sink_key){c->depth[i], c->label[i], i};
    }
    qsort(sinks, (size_t)n_sinks, sizeof *sinks, cmp_sink);

    int n_first = 0, n_later = 0, kids[REGC_MAX_IO];
    for (int s = 0; s < n_sinks; s++) {
        int top = 0;
        stack[top++] = sinks[s].node;
        state[sinks[s].node] = 1;
        while (top > 0) {
            int i = stack[top - 1];
            int k = children(c, i, kids), pushed = 0;
            while (next[i] < k && !pushed) {
                int ch = kids[next[i]++];
                if (state[ch] == 0) {
                    state[ch] = 1;
                    stack[top++] = ch;
                    pushed = 1;
                }
            }
            if (pushed)
                continue;
            top--;
            state[i] = 2;
            if (constant[i])
                c->seq[n_first++] = i;
            else
                later[n_later++] = i;
        }
    }
    memcpy(c->seq + n_first, later, (size_t)n_later * sizeof *later);
    for (int k = 0; k < n; k++)
        c->pos[c->seq[k]] = k;
    free(sinks), free(stack), free(next), free(state), free(constant), free(later);
    return REGC_OK;
}

static int *alloc_ints(size_t n, int fill)
{
    int *p = malloc((n + 1) * sizeof *p);
    if (p)
        for (size_t i = 0; i <= n; i++)
            p[i] = fill;
    return p;
}

int detect_ctx_init(detect_ctx *c, const regc_graph *g)
{
    memset(c, 0, sizeof *c);
    c->g = g;
    c->n_nodes = regc_graph_n_nodes(g);
    c->n_tensors = regc_graph_n_tensors(g);
    const size_t n = (size_t)c->n_nodes, nt = (size_t)c->n_tensors;
    c->label = malloc((n + 1) * sizeof *c->label);
    c->depth = alloc_ints(n, 0);
    c->seq = alloc_ints(n, -1);
    c->pos = alloc_ints(n, -1);
    c->out_slot = alloc_ints(nt, -1);
    c->owner = alloc_ints(n, -1);
    c->tslot = alloc_ints(n, -1);
    c->cslot = alloc_ints(n, -1);
    c->formal_of = alloc_ints(nt, -1);
    c->bound_to = alloc_ints(nt, -1);
    c->queue = alloc_ints(n, -1);
    if (!c->queue || !c->label || !c->depth || !c->seq || !c->pos || !c->out_slot || !c->owner || !c->tslot ||
        !c->cslot || !c->formal_of || !c->bound_to)
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    /* Nodes are stored in a topological order, so one pass gives depths. */
    for (int i = 0; i < c->n_nodes; i++) {
        const regc_node *nd = regc_graph_node(g, i);
        c->label[i] = node_label(g, nd);
        for (int q = 0; q < nd->n_in; q++) {
            int p = producer_of(c, i, q);
            if (p >= 0 && c->depth[p] + 1 > c->depth[i])
                c->depth[i] = c->depth[p] + 1;
        }
        for (int s = 0; s < nd->n_out; s++)
            c->out_slot[nd->out[s]] = s;
    }
    int rc = build_consumers(c);
    return rc < 0 ? rc : build_sequence(c);
}

void detect_ctx_free(detect_ctx *c)
{
    free(c->label), free(c->depth), free(c->seq), free(c->pos), free(c->out_slot);
    free(c->cons_start), free(c->cons_node), free(c->cons_port), free(c->owner);
    free(c->tslot), free(c->cslot), free(c->formal_of), free(c->bound_to);
    free(c->queue);
    memset(c, 0, sizeof *c);
}
