/* graph_canon.c — the canonical form of a graph, or of one node: the bytes
 * that compile-cache keys hash.
 *
 * It holds everything a compiler reads from a graph — roles, dtypes,
 * shapes, every node's op, attributes and wiring, the outputs — and never
 * a parameter's name, so a renamed checkpoint keys the same entries. Graph
 * inputs keep their names: the trainer fills inputs by name. */
#include "regc_common.h"
#include "regc_graph.h"

void regc_graph_canon_shape(regc_bytes *b, const regc_tensor *t)
{
    regc_bytes_put_i64(b, t->dtype);
    regc_bytes_put_i64(b, t->ndim);
    for (int d = 0; d < t->ndim; d++)
        regc_bytes_put_i64(b, t->shape[d]);
}

static void put_attrs(regc_bytes *b, const regc_attrs *a)
{
    regc_bytes_put_i64(b, a->trans_a);
    regc_bytes_put_i64(b, a->trans_b);
    regc_bytes_put_f32(b, a->eps);
    regc_bytes_put_i64(b, a->n_head);
    regc_bytes_put_i64(b, a->n_kv_head);
    regc_bytes_put_i64(b, a->inverse);
    regc_bytes_put_i64(b, a->causal);
    regc_bytes_put_f32(b, a->scale);
    regc_bytes_put_f32(b, a->softcap);
    regc_bytes_put_i64(b, a->window);
    regc_bytes_put_i64(b, a->documents);
    for (int d = 0; d < REGC_MAX_DIMS; d++)
        regc_bytes_put_i64(b, a->perm[d]);
    regc_bytes_put_f32(b, a->value);
    regc_bytes_put_i64(b, a->vocab);
    regc_bytes_put_i64(b, a->axis);
    regc_bytes_put_i64(b, a->start);
    regc_bytes_put_i64(b, a->padded);
    regc_bytes_put_i64(b, a->padding_idx);
}

void regc_graph_canon_node(regc_bytes *b, const regc_graph *g, const regc_node *n, const int *id)
{
    regc_bytes_put_i64(b, n->op);
    put_attrs(b, &n->attrs);
    regc_bytes_put_i64(b, n->n_in);
    for (int k = 0; k < n->n_in; k++)
        regc_bytes_put_i64(b, id ? id[n->in[k]] : n->in[k]);
    regc_bytes_put_i64(b, n->n_out);
    for (int k = 0; k < n->n_out; k++) {
        regc_bytes_put_i64(b, id ? id[n->out[k]] : n->out[k]);
        regc_graph_canon_shape(b, regc_graph_tensor(g, n->out[k]));
    }
}

int regc_graph_canon(const regc_graph *g, regc_bytes *b)
{
    int n_t = regc_graph_n_tensors(g);
    regc_bytes_put_str(b, "graph");
    regc_bytes_put_i64(b, n_t);
    for (int t = 0; t < n_t; t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->producer >= 0)
            continue; /* described by its node */
        regc_bytes_put_i64(b, t);
        regc_bytes_put_i64(b, x->role);
        regc_bytes_put_i64(b, x->constant);
        regc_bytes_put_i64(b, x->frozen);
        regc_graph_canon_shape(b, x);
        if (x->role == REGC_ROLE_INPUT)
            regc_bytes_put_str(b, x->name);
    }
    regc_bytes_put_i64(b, regc_graph_n_nodes(g));
    for (int i = 0; i < regc_graph_n_nodes(g); i++)
        regc_graph_canon_node(b, g, regc_graph_node(g, i), NULL);
    regc_bytes_put_i64(b, regc_graph_n_outputs(g));
    for (int i = 0; i < regc_graph_n_outputs(g); i++)
        regc_bytes_put_i64(b, regc_graph_output(g, i));
    return b->failed ? regc_error(REGC_ERR_MEMORY, "graph: out of memory") : REGC_OK;
}
