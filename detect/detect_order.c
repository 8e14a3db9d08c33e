/* detect_order.c — the structural view of a graph the detector works on:
 * one label per node (what the node is, not what it is called), consumers
 * of every tensor, and a canonical node order that depends on the graph's
 * structure only, never on names or on the order nodes were added in.
 *
 * The canonical order is a post-order walk from the graph's sinks that
 * visits a node's inputs deepest first (ties by input port), so a layer is
 * emitted right after the layer it depends on and, once the walk is inside
 * a stack, each layer's nodes come out contiguous and in the same order.
 * What a whole stack reads (T5's position bias, the encoder output) is
 * walked first: in the main walk it would land inside the first layer that
 * reads it and make that layer look different from the others. */
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
    h = mix_float(h, a->softcap);
    h = mix(h, (uint64_t)a->window);
    h = mix(h, (uint64_t)a->documents);
    for (int d = 0; d < REGC_MAX_DIMS; d++)
        h = mix(h, (uint64_t)a->perm[d]);
    h = mix_float(h, a->value);
    h = mix(h, (uint64_t)a->vocab);
    h = mix(h, (uint64_t)a->axis);
    h = mix(h, (uint64_t)a->start);
    h = mix(h, (uint64_t)a->padded);
    h = mix(h, (uint64_t)a->padding_idx);
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

/* A node sorted by a rank (a depth or a height), then its label. */
typedef struct {
    int rank;
    uint64_t label;
    int node;
} node_key;

/* Highest rank first, then by label; equal keys are interchangeable. */
static int cmp_sink(const void *pa, const void *pb)
{
    const node_key *a = pa, *b = pb;
    if (a->rank != b->rank)
        return a->rank > b->rank ? -1 : 1;
    if (a->label != b->label)
        return a->label < b->label ? -1 : 1;
    return (a->node > b->node) - (a->node < b->node);
}

/* By label, then rank: equal labels at different ranks end up adjacent. */
static int cmp_label_rank(const void *pa, const void *pb)
{
    const node_key *a = pa, *b = pb;
    if (a->label != b->label)
        return a->label < b->label ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

/* The inputs of node i as producer nodes, deepest first by `depth`, ties
 * by port. */
static int children(const detect_ctx *c, const int *depth, int i, int *kids)
{
    const regc_node *n = regc_graph_node(c->g, i);
    int k = 0;
    for (int q = 0; q < n->n_in; q++) {
        int p = producer_of(c, i, q);
        if (p < 0)
            continue;
        int j = k++;
        while (j > 0 && depth[kids[j - 1]] < depth[p]) {
            kids[j] = kids[j - 1];
            j--;
        }
        kids[j] = p;
    }
    return k;
}

/* Scratch of build_sequence. */
typedef struct {
    int *stack, *next; /* DFS stack; next child to visit per node */
    char *state;       /* 0 new, 1 on the stack, 2 emitted */
    int n_seq;
} walk;

/* Post-order from `root`, emitting every node not yet emitted. */
static void walk_from(detect_ctx *c, walk *w, const int *depth, int root)
{
    if (w->state[root])
        return;
    int top = 0, kids[REGC_MAX_IO];
    w->stack[top++] = root;
    w->state[root] = 1;
    while (top > 0) {
        int i = w->stack[top - 1];
        int k = children(c, depth, i, kids), pushed = 0;
        while (w->next[i] < k && !pushed) {
            int ch = kids[w->next[i]++];
            if (w->state[ch] == 0) {
                w->state[ch] = 1;
                w->stack[top++] = ch;
                pushed = 1;
            }
        }
        if (pushed)
            continue;
        top--;
        w->state[i] = 2;
        c->seq[w->n_seq++] = i;
    }
}

/* A tensor every layer of a stack reads (T5's position bias, the encoder
 * output): two of its consumers are the same kind of node at different
 * heights (distances to the end of the graph), so in different layers. The
 * q, k and v projections of one hidden state feed one attention, share a
 * height and do not count. */
static int is_shared(const detect_ctx *c, const int *height, int t, node_key *tmp)
{
    int n = 0;
    for (int k = c->cons_start[t]; k < c->cons_start[t + 1]; k++) {
        int v = c->cons_node[k];
        tmp[n++] = (node_key){height[v], c->label[v], v};
    }
    if (n < 2)
        return 0;
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_label_rank);
    for (int a = 1; a < n; a++)
        if (tmp[a].label == tmp[a - 1].label && tmp[a].rank != tmp[a - 1].rank)
            return 1;
    return 0;
}

/* The canonical order, in two walks. First the cones of shared tensors,
 * shallowest first: what a whole stack reads is computed before the stack,
 * never inside its first layer. Then everything else from the sinks, with
 * depths counted from the already-emitted nodes, so a layer that reads a
 * deep shared tensor (T5's first decoder layer reading the encoder) orders
 * its nodes like every other layer. */
static int build_sequence(detect_ctx *c)
{
    const int n = c->n_nodes;
    node_key *keys = malloc(((size_t)n + c->cons_start[c->n_tensors] + 1) * sizeof *keys);
    int *depth2 = malloc(((size_t)n + 1) * sizeof *depth2);
    walk w = {malloc(((size_t)n + 1) * sizeof(int)), calloc((size_t)n + 1, sizeof(int)),
              calloc((size_t)n + 1, 1), 0};
    if (!keys || !depth2 || !w.stack || !w.next || !w.state) {
        free(keys), free(depth2), free(w.stack), free(w.next), free(w.state);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    node_key *tmp = keys + n;
    int *height = depth2; /* first the longest path to a sink, then depth2 below */
    for (int i = n - 1; i >= 0; i--) {
        const regc_node *nd = regc_graph_node(c->g, i);
        height[i] = 0;
        for (int s = 0; s < nd->n_out; s++)
            for (int k = c->cons_start[nd->out[s]]; k < c->cons_start[nd->out[s] + 1]; k++)
                if (height[c->cons_node[k]] + 1 > height[i])
                    height[i] = height[c->cons_node[k]] + 1;
    }
    int n_roots = 0;
    for (int i = 0; i < n; i++) {
        const regc_node *nd = regc_graph_node(c->g, i);
        int shared = 0;
        for (int s = 0; s < nd->n_out && !shared; s++)
            shared = is_shared(c, height, nd->out[s], tmp);
        if (shared)
            keys[n_roots++] = (node_key){-c->depth[i], c->label[i], i}; /* shallowest first */
    }
    qsort(keys, (size_t)n_roots, sizeof *keys, cmp_sink);
    for (int r = 0; r < n_roots; r++)
        walk_from(c, &w, c->depth, keys[r].node);

    /* depths above the emitted part; sinks are nodes nothing reads */
    int n_sinks = 0;
    for (int i = 0; i < n; i++) {
        const regc_node *nd = regc_graph_node(c->g, i);
        depth2[i] = 0;
        for (int q = 0; q < nd->n_in && !w.state[i]; q++) {
            int p = producer_of(c, i, q);
            if (p >= 0 && !w.state[p] && depth2[p] + 1 > depth2[i])
                depth2[i] = depth2[p] + 1;
        }
        int used = 0;
        for (int s = 0; s < nd->n_out; s++)
            used |= c->cons_start[nd->out[s] + 1] > c->cons_start[nd->out[s]];
        if (!used && !w.state[i])
            keys[n_sinks++] = (node_key){depth2[i], c->label[i], i};
    }
    qsort(keys, (size_t)n_sinks, sizeof *keys, cmp_sink);
    for (int s = 0; s < n_sinks; s++)
        walk_from(c, &w, depth2, keys[s].node);
    for (int k = 0; k < n; k++)
        c->pos[c->seq[k]] = k;
    free(keys), free(depth2), free(w.stack), free(w.next), free(w.state);
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
    if (!c->queue || !c->label || !c->depth || !c->seq || !c->pos || !c->out_slot || !c->owner ||
        !c->tslot || !c->cslot || !c->formal_of || !c->bound_to)
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
