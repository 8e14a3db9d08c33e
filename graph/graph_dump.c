/* graph_dump.c — the readable text form of a graph:
 *
 *   input  input_ids         i32 [4, 64]
 *   param  transformer.wte.weight f32 [50257, 768]
 *   %3 f32 [4, 64, 768] = embedding(input_ids, transformer.wte.weight)
 *   %9 f32 [4, 64, 2304] = matmul(%8, transformer.h.0.attn.c_attn.weight) trans_a=0 trans_b=0
 *   output %120
 */
#include <stdio.h>

#include "regc_graph.h"

static void print_shape(FILE *f, const regc_tensor *t)
{
    fprintf(f, "%s [", regc_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    fputc(']', f);
}

static void print_attrs(FILE *f, const regc_graph *g, const regc_node *n)
{
    const regc_attrs *a = &n->attrs;
    switch (n->op) {
    case REGC_OP_MATMUL: fprintf(f, " trans_a=%d trans_b=%d", a->trans_a, a->trans_b); break;
    case REGC_OP_LAYERNORM:
    case REGC_OP_RMSNORM: fprintf(f, " eps=%g", a->eps); break;
    case REGC_OP_ATTENTION:
    case REGC_OP_ATTENTION_BWD:
        fprintf(f, " n_head=%d n_kv_head=%d causal=%d scale=%g", a->n_head, a->n_kv_head, a->causal,
                a->scale);
        if (a->softcap != 0.0f)
            fprintf(f, " softcap=%g", a->softcap);
        if (a->window != 0)
            fprintf(f, " window=%lld", (long long)a->window);
        if (a->documents)
            fprintf(f, " documents=1");
        if (a->value != 0.0f)
            fprintf(f, " dropout=%g", a->value);
        break;
    case REGC_OP_ROPE: fprintf(f, " n_head=%d inverse=%d", a->n_head, a->inverse); break;
    case REGC_OP_TRANSPOSE:
        fprintf(f, " perm=");
        for (int i = 0; i < regc_graph_tensor(g, n->in[0])->ndim; i++)
            fprintf(f, "%s%d", i ? "," : "", a->perm[i]);
        break;
    case REGC_OP_FILL:
    case REGC_OP_SCALE:
    case REGC_OP_ADD_SCALAR: fprintf(f, " value=%g", a->value); break;
    case REGC_OP_POW: fprintf(f, " exponent=%g", a->value); break;
    case REGC_OP_MASKED_FILL: fprintf(f, " value=%g", a->value); break;
    case REGC_OP_EMBEDDING:
    case REGC_OP_EMBEDDING_BWD:
        if (a->padded)
            fprintf(f, " padding_idx=%lld", (long long)a->padding_idx);
        if (n->op == REGC_OP_EMBEDDING_BWD)
            fprintf(f, " vocab=%lld", (long long)a->vocab);
        break;
    case REGC_OP_SLICE:
    case REGC_OP_SLICE_BWD: fprintf(f, " axis=%d start=%lld", a->axis, (long long)a->start); break;
    default: break;
    }
}

void regc_graph_dump(const regc_graph *g, FILE *f)
{
    for (int id = 0; id < regc_graph_n_tensors(g); id++) {
        const regc_tensor *t = regc_graph_tensor(g, id);
        if (t->role == REGC_ROLE_ACT)
            continue;
        fprintf(f, "%-8s %s ", t->constant ? "constant" : regc_role_name(t->role), t->name);
        print_shape(f, t);
        fputc('\n', f);
    }
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int o = 0; o < n->n_out; o++) {
            const regc_tensor *t = regc_graph_tensor(g, n->out[o]);
            fprintf(f, "%s%s ", o ? ", " : "", t->name);
            print_shape(f, t);
        }
        fprintf(f, " = %s(", regc_op_name(n->op));
        for (int k = 0; k < n->n_in; k++)
            fprintf(f, "%s%s", k ? ", " : "", regc_graph_tensor(g, n->in[k])->name);
        fputc(')', f);
        print_attrs(f, g, n);
        fputc('\n', f);
    }
    for (int i = 0; i < regc_graph_n_outputs(g); i++)
        fprintf(f, "output %s\n", regc_graph_tensor(g, regc_graph_output(g, i))->name);
}

void regc_graph_dump_dot(const regc_graph *g, FILE *f)
{
    fprintf(f, "digraph regc {\n  node [shape=box, fontname=\"monospace\"];\n");
    for (int id = 0; id < regc_graph_n_tensors(g); id++) {
        const regc_tensor *t = regc_graph_tensor(g, id);
        if (t->producer < 0)
            fprintf(f, "  t%d [shape=ellipse, label=\"%s\"];\n", id, t->name);
    }
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        fprintf(f, "  n%d [label=\"%d %s\"];\n", i, i, regc_op_name(n->op));
        for (int k = 0; k < n->n_in; k++) {
            const regc_tensor *t = regc_graph_tensor(g, n->in[k]);
            if (t->producer < 0)
                fprintf(f, "  t%d -> n%d;\n", n->in[k], i);
            else
                fprintf(f, "  n%d -> n%d;\n", t->producer, i);
        }
    }
    fprintf(f, "}\n");
}
