/* detect_match.c — is a set of nodes an exact copy of a template?
 *
 * detect_match compares node by node (labels are hashes; this compares the
 * fields themselves, so a hash collision can never merge two layers) and
 * checks the wiring: an input the template computes inside itself must be
 * computed by the corresponding candidate node, an input from outside must
 * come from outside, and the template's external inputs (its formals) must
 * be bound one to one. detect_guide finds a candidate for detect_match to
 * check when the canonical order did not place it contiguously. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "detect_internal.h"

static const regc_node *node_at(const detect_ctx *c, int i) { return regc_graph_node(c->g, i); }

static const regc_tensor *tensor_at(const detect_ctx *c, int t)
{
    return regc_graph_tensor(c->g, t);
}

static int attrs_equal(const regc_attrs *a, const regc_attrs *b)
{
    if (a->trans_a != b->trans_a || a->trans_b != b->trans_b || a->eps != b->eps ||
        a->n_head != b->n_head || a->n_kv_head != b->n_kv_head || a->inverse != b->inverse ||
        a->causal != b->causal || a->scale != b->scale || a->softcap != b->softcap ||
        a->window != b->window || a->documents != b->documents || a->value != b->value ||
        a->vocab != b->vocab || a->axis != b->axis || a->start != b->start ||
        a->padded != b->padded || a->padding_idx != b->padding_idx)
        return 0;
    for (int d = 0; d < REGC_MAX_DIMS; d++)
        if (a->perm[d] != b->perm[d])
            return 0;
    return 1;
}

/* Graph inputs and parameters keep their role; every produced tensor is an
 * activation whatever the graph says. */
static regc_role role_of(const regc_tensor *t) { return t->producer < 0 ? t->role : REGC_ROLE_ACT; }

static void format_shape(char *buf, size_t cap, const regc_tensor *t)
{
    int k = snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && k > 0 && (size_t)k < cap; d++)
        k += snprintf(buf + k, cap - (size_t)k, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (k > 0 && (size_t)k < cap)
        snprintf(buf + k, cap - (size_t)k, "]");
}

/* Same dtype, role and shape; otherwise a reason naming `what`. */
static int tensor_types_equal(const detect_ctx *c, int ta, int tb, const char *what,
                              detect_mismatch *why)
{
    const regc_tensor *a = tensor_at(c, ta), *b = tensor_at(c, tb);
    int same = a->dtype == b->dtype && role_of(a) == role_of(b) && a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (!same) {
        char sa[64], sb[64];
        format_shape(sa, sizeof sa, a);
        format_shape(sb, sizeof sb, b);
        snprintf(why->reason, sizeof why->reason, "%s is %s %s %s, the template's %s %s %s", what,
                 regc_role_name(role_of(b)), regc_dtype_name(b->dtype), sb,
                 regc_role_name(role_of(a)), regc_dtype_name(a->dtype), sa);
    }
    return same;
}

int detect_template_formals(detect_ctx *c, const int *tmpl, int p, regc_formal_input *formals)
{
    int n = 0;
    for (int j = 0; j < p; j++)
        c->tslot[tmpl[j]] = j;
    for (int j = 0; j < p; j++) {
        const regc_node *nd = node_at(c, tmpl[j]);
        for (int q = 0; q < nd->n_in; q++) {
            int t = nd->in[q], pr = tensor_at(c, t)->producer;
            if ((pr >= 0 && c->tslot[pr] >= 0) || c->formal_of[t] >= 0)
                continue;
            c->formal_of[t] = n;
            formals[n++] = (regc_formal_input){REGC_FORMAL_PER_INSTANCE, j, q};
        }
    }
    for (int j = 0; j < p; j++) {
        const regc_node *nd = node_at(c, tmpl[j]);
        for (int q = 0; q < nd->n_in; q++)
            c->formal_of[nd->in[q]] = -1;
        c->tslot[tmpl[j]] = -1;
    }
    return n;
}

/* Undo what detect_match marked in the scratch arrays. */
static void match_reset(detect_ctx *c, const int *tmpl, const int *cand, int p)
{
    for (int j = 0; j < p; j++) {
        c->tslot[tmpl[j]] = -1;
        c->cslot[cand[j]] = -1;
        const regc_node *a = node_at(c, tmpl[j]), *b = node_at(c, cand[j]);
        for (int q = 0; q < a->n_in; q++)
            c->formal_of[a->in[q]] = -1;
        for (int q = 0; q < b->n_in; q++)
            c->bound_to[b->in[q]] = -1;
    }
}

/* One node pair: op, attributes, arity and output types. */
static int node_types_equal(const detect_ctx *c, int a, int b, detect_mismatch *why)
{
    const regc_node *x = node_at(c, a), *y = node_at(c, b);
    if (x->op != y->op || x->n_in != y->n_in || x->n_out != y->n_out) {
        snprintf(why->reason, sizeof why->reason,
                 "node is %s with %d inputs, the template's %s "
                 "with %d",
                 regc_op_name(y->op), y->n_in, regc_op_name(x->op), x->n_in);
        return 0;
    }
    why->types_only = 1;
    if (!attrs_equal(&x->attrs, &y->attrs)) {
        snprintf(why->reason, sizeof why->reason, "%s attributes differ from the template's",
                 regc_op_name(y->op));
        return 0;
    }
    char what[64];
    for (int s = 0; s < x->n_out; s++) {
        snprintf(what, sizeof what, "%s output %d", regc_op_name(y->op), s);
        if (!tensor_types_equal(c, x->out[s], y->out[s], what, why))
            return 0;
    }
    for (int q = 0; q < x->n_in; q++) {
        snprintf(what, sizeof what, "%s input %d", regc_op_name(y->op), q);
        if (!tensor_types_equal(c, x->in[q], y->in[q], what, why))
            return 0;
    }
    why->types_only = 0;
    return 1;
}

/* Input q of template node j against the candidate's: internal inputs must
 * correspond, external ones bind the formal (one to one). */
static int input_wired(detect_ctx *c, int ta, int tb, int *bind, detect_mismatch *why, int q)
{
    const regc_tensor *a = tensor_at(c, ta), *b = tensor_at(c, tb);
    int pa = a->producer, pb = b->producer;
    int a_inside = pa >= 0 && c->tslot[pa] >= 0, b_inside = pb >= 0 && c->cslot[pb] >= 0;
    if (a_inside) {
        if (!b_inside || c->cslot[pb] != c->tslot[pa] || c->out_slot[tb] != c->out_slot[ta]) {
            snprintf(why->reason, sizeof why->reason,
                     "input %d does not come from the node the "
                     "template's does",
                     q);
            return 0;
        }
        return 1;
    }
    if (b_inside) {
        snprintf(why->reason, sizeof why->reason,
                 "input %d comes from inside the instance, the "
                 "template's from outside",
                 q);
        return 0;
    }
    int f = c->formal_of[ta];
    if (f < 0) {
        snprintf(why->reason, sizeof why->reason, "input %d has no formal (internal error)", q);
        return 0;
    }
    if (bind[f] < 0 && c->bound_to[tb] < 0) {
        bind[f] = tb;
        c->bound_to[tb] = f;
        return 1;
    }
    if (bind[f] == tb && c->bound_to[tb] == f)
        return 1;
    snprintf(why->reason, sizeof why->reason,
             "input %d binds a tensor the template's wiring does "
             "not",
             q);
    return 0;
}

int detect_match(detect_ctx *c, const int *tmpl, const int *cand, int p, int *bind,
                 detect_mismatch *why)
{
    why->node = -1;
    why->types_only = 0;
    why->reason[0] = '\0';
    int n_formals = 0, ok = 1;
    for (int j = 0; j < p && ok; j++) {
        if (c->tslot[tmpl[j]] >= 0 || c->cslot[cand[j]] >= 0) {
            /* a node listed twice: mark what we can and fail */
            why->node = j;
            snprintf(why->reason, sizeof why->reason, "node listed twice");
            ok = 0;
        }
        c->tslot[tmpl[j]] = j;
        c->cslot[cand[j]] = j;
    }
    for (int j = 0; j < p && ok; j++) {
        const regc_node *a = node_at(c, tmpl[j]);
        for (int q = 0; q < a->n_in; q++) {
            int t = a->in[q], pr = tensor_at(c, t)->producer;
            if ((pr < 0 || c->tslot[pr] < 0) && c->formal_of[t] < 0) {
                c->formal_of[t] = n_formals;
                bind[n_formals++] = -1;
            }
        }
    }
    for (int j = 0; j < p && ok; j++) {
        if (!node_types_equal(c, tmpl[j], cand[j], why)) {
            why->node = j;
            ok = 0;
            break;
        }
        const regc_node *a = node_at(c, tmpl[j]), *b = node_at(c, cand[j]);
        for (int q = 0; q < a->n_in && ok; q++)
            if (!input_wired(c, a->in[q], b->in[q], bind, why, q)) {
                why->node = j;
                ok = 0;
            }
    }
    match_reset(c, tmpl, cand, p);
    return ok;
}

/* The unique consumer of tensor t at `port` with op `op` not yet used or
 * owned, or -1 when there is none or more than one. */
static int unique_consumer(const detect_ctx *c, int t, int port, regc_op op)
{
    int found = -1;
    for (int k = c->cons_start[t]; k < c->cons_start[t + 1]; k++) {
        int v = c->cons_node[k];
        if (c->cons_port[k] != port || node_at(c, v)->op != op || c->cslot[v] >= 0 ||
            c->owner[v] >= 0)
            continue;
        if (found >= 0 && found != v)
            return -1;
        found = v;
    }
    return found;
}

int detect_guide(detect_ctx *c, const int *tmpl, int p, int j0, int v0, int *cand)
{
    for (int j = 0; j < p; j++) {
        cand[j] = -1;
        c->tslot[tmpl[j]] = j;
    }
    int ok = c->owner[v0] < 0, n_mapped = 0;
    int *work = c->queue; /* BFS queue of template indices */
    int head = 0, tail = 0;
    if (ok) {
        cand[j0] = v0;
        c->cslot[v0] = j0;
        work[tail++] = j0;
        n_mapped = 1;
    }
    while (ok && head < tail) {
        int j = work[head++], v = cand[j];
        const regc_node *a = node_at(c, tmpl[j]), *b = node_at(c, v);
        if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out) {
            ok = 0;
            break;
        }
        for (int q = 0; q < a->n_in && ok; q++) {
            int pa = tensor_at(c, a->in[q])->producer;
            if (pa < 0 || c->tslot[pa] < 0)
                continue;
            int jj = c->tslot[pa], pb = tensor_at(c, b->in[q])->producer;
            if (pb < 0 || c->out_slot[b->in[q]] != c->out_slot[a->in[q]]) {
                ok = 0;
            } else if (cand[jj] < 0) {
                if (c->cslot[pb] >= 0 || c->owner[pb] >= 0) {
                    ok = 0;
                } else {
                    cand[jj] = pb;
                    c->cslot[pb] = jj;
                    work[tail++] = jj;
                    n_mapped++;
                }
            } else if (cand[jj] != pb) {
                ok = 0;
            }
        }
        for (int s = 0; s < a->n_out && ok; s++) {
            int ta = a->out[s];
            for (int k = c->cons_start[ta]; k < c->cons_start[ta + 1]; k++) {
                int jj = c->tslot[c->cons_node[k]];
                if (jj < 0 || cand[jj] >= 0)
                    continue;
                int w = unique_consumer(c, b->out[s], c->cons_port[k], node_at(c, tmpl[jj])->op);
                if (w < 0)
                    continue; /* ambiguous or absent: another path may reach it */
                cand[jj] = w;
                c->cslot[w] = jj;
                work[tail++] = jj;
                n_mapped++;
            }
        }
    }
    for (int j = 0; j < p; j++) {
        c->tslot[tmpl[j]] = -1;
        if (cand[j] >= 0)
            c->cslot[cand[j]] = -1;
    }
    return ok && n_mapped == p;
}
