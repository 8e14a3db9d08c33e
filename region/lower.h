/* lower.h — private to region/: what lower.c (a region graph's nodes
 * become instructions) shares with lower_chain.c (the fused elementwise
 * chains): the lowering's state, its small helpers, emitting an
 * instruction. */
#ifndef REGC_LOWER_H
#define REGC_LOWER_H

#include "region_internal.h"

typedef struct {
    regc_compiled_region *r;
    const regc_graph *g;
    const int *slot_of;
    int n_nodes;
    int *n_readers;     /* [n_tensors] over all nodes */
    int *n_fwd_readers; /* [n_tensors] over forward nodes */
    int *reader;        /* [n_tensors] the last reader (meaningful when there is one) */
    char *skip;         /* [n_nodes] absorbed by a fusion or an alias */
    int *gemm_epi;      /* [n_nodes] matmul: epilogue decided, -1 none */
    int *gemm_bias, *gemm_aux, *gemm_bgrad, *gemm_c; /* [n_nodes] tensors, -1 none */
    int *fused_norm; /* [n_nodes] ADD: the norm backward it absorbs, -1 none */
    /* [n_nodes] ADD: the embedding backward accumulating into its output, -1 none */
    int *embed_acc;
    regc_instr *ins;
    int n_ins, cap;
} lower_ctx;

static inline const regc_tensor *T(const lower_ctx *c, int t) { return regc_graph_tensor(c->g, t); }
static inline int64_t numel(const lower_ctx *c, int t) { return regc_tensor_numel(T(c, t)); }
static inline int64_t last_dim(const lower_ctx *c, int t)
{
    const regc_tensor *x = T(c, t);
    return x->ndim ? x->shape[x->ndim - 1] : 1;
}

static inline int root_slot(const lower_ctx *c, int s)
{
    while (c->r->slots[s].alias >= 0)
        s = c->r->slots[s].alias;
    return s;
}

/* Append an instruction of kernel k for node `node`, its operands the
 * references of `tensors` (the first n_out written); NULL when out of
 * memory. */
regc_instr *regc_lower_emit(lower_ctx *c, regc_kernel k, int node, int n_out, int n_refs,
                            const int *tensors);

/* Lower node i as an elementwise chain when it is one: with fuse (O1, O2),
 * together with the chainable nodes after it before hi, and a pointwise op
 * with no kernel of its own at every level. Returns 1 with *last the last
 * node it took, 0 when node i is not a chain (lower it as itself), or a
 * negative status. *n_ew counts the region's programs. */
int regc_lower_chain(lower_ctx *c, int i, int hi, int fuse, int *n_ew, int *last);

#endif
