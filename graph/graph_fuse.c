/* graph_fuse.c — decomposed ops recognised and replaced by regc's own, so a
 * graph written op by op (by an exporter, or by hand) runs the kernels the
 * frontends use:
 *
 *   w * (x * rsqrt(mean_last(pow(x, 2)) + eps))                 -> rmsnorm(x, w, eps)
 *   (d * rsqrt(mean_last(pow(d, 2)) + eps)) * w + b, d = x - mean_last(x)
 *                                            (or d / pow(.., 0.5)) -> layernorm(x, w, b, eps)
 *   (x * 0.5) * (tanh((x + pow(x, 3) * 0.044715) * sqrt(2/pi)) + 1) -> gelu(x)
 *
 * (either operand order of each product; scale and mul both spell "* c").
 * A match replaces its nodes only when nothing outside it reads their
 * outputs. The fused kernel rounds differently from the ops it replaces
 * (RMSNorm's statistic is summed in double), so the rewrite happens once,
 * when the graph is read, before anything compiles: every level and both
 * compile modes see the same graph.
 *
 * The rewrite replays the graph into a new one: leaves as they are, each
 * matched root as its fused node, the matched interior left out, every
 * other node copied. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "regc_common.h"
#include "regc_graph.h"

typedef struct {
    const regc_graph *g;
    int *readers; /* [n_tensors]: how many node inputs and graph outputs read it */
} fuse_ctx;

/* The node that produces tensor t, if it is `op`; else NULL. */
static const regc_node *made_by(const fuse_ctx *c, int t, regc_op op)
{
    const regc_tensor *x = regc_graph_tensor(c->g, t);
    const regc_node *n = x && x->producer >= 0 ? regc_graph_node(c->g, x->producer) : NULL;
    return n && n->op == op ? n : NULL;
}

/* x * value, as scale(x) or as nothing else: *x gets the operand. */
static int is_scaled(const fuse_ctx *c, int t, float value, int *x)
{
    const regc_node *n = made_by(c, t, REGC_OP_SCALE);
    if (!n || fabsf(n->attrs.value - value) > 1e-7f * fabsf(value))
        return 0;
    *x = n->in[0];
    return 1;
}

/* Match rmsnorm at root (a MUL); fills x, w, eps and the interior nodes. */
static int match_rmsnorm(const fuse_ctx *c, const regc_node *root, int *x, int *w, float *eps,
                         int *inner, int *n_inner)
{
    for (int wi = 0; wi < 2; wi++) {
        const int wt = root->in[wi], nt = root->in[1 - wi];
        const regc_tensor *wv = regc_graph_tensor(c->g, wt);
        const regc_node *prod = made_by(c, nt, REGC_OP_MUL);
        if (wv->ndim != 1 || !prod)
            continue;
        for (int xi = 0; xi < 2; xi++) {
            const int xt = prod->in[xi];
            const regc_node *rs = made_by(c, prod->in[1 - xi], REGC_OP_RSQRT);
            const regc_node *add = rs ? made_by(c, rs->in[0], REGC_OP_ADD_SCALAR) : NULL;
            const regc_node *mean = add ? made_by(c, add->in[0], REGC_OP_MEAN_LAST) : NULL;
            const regc_node *sq = mean ? made_by(c, mean->in[0], REGC_OP_POW) : NULL;
            const regc_tensor *xv = regc_graph_tensor(c->g, xt);
            if (!sq || sq->attrs.value != 2.0f || sq->in[0] != xt || xv->ndim < 1 ||
                xv->shape[xv->ndim - 1] != wv->shape[0] || !(add->attrs.value > 0.0f))
                continue;
            *x = xt, *w = wt, *eps = add->attrs.value;
            const regc_node *parts[] = {prod, rs, add, mean, sq};
            *n_inner = 0;
            for (int k = 0; k < 5; k++)
                inner[(*n_inner)++] = regc_graph_tensor(c->g, parts[k]->out[0])->producer;
            return 1;
        }
    }
    return 0;
}

/* x / sqrt(v) or x * rsqrt(v): *v gets v, *x the operand, inner the nodes. */
static int over_root(const fuse_ctx *c, const regc_node *n, int *x, int *v, int *inner, int *k)
{
    if (n->op == REGC_OP_DIV) {
        const regc_node *sq = made_by(c, n->in[1], REGC_OP_POW);
        if (!sq || sq->attrs.value != 0.5f)
            return 0;
        *x = n->in[0], *v = sq->in[0];
        inner[(*k)++] = regc_graph_tensor(c->g, n->in[1])->producer;
        return 1;
    }
    for (int xi = 0; n->op == REGC_OP_MUL && xi < 2; xi++) {
        const regc_node *rs = made_by(c, n->in[1 - xi], REGC_OP_RSQRT);
        if (!rs)
            continue;
        *x = n->in[xi], *v = rs->in[0];
        inner[(*k)++] = regc_graph_tensor(c->g, n->in[1 - xi])->producer;
        return 1;
    }
    return 0;
}

/* Match LayerNorm at root (a BIAS_ADD of b [C]): ((x - mean(x)) scaled by
 * 1 / sqrt(mean((x - mean(x))^2) + eps)) * w + b. */
static int match_layernorm(const fuse_ctx *c, const regc_node *root, int *x, int *w, int *b,
                           float *eps, int *inner, int *n_inner)
{
    const regc_node *mw = made_by(c, root->in[0], REGC_OP_MUL);
    const regc_tensor *bv = regc_graph_tensor(c->g, root->in[1]);
    for (int wi = 0; mw && bv->ndim == 1 && wi < 2; wi++) {
        const regc_tensor *wv = regc_graph_tensor(c->g, mw->in[wi]);
        const regc_node *norm =
            regc_graph_tensor(c->g, mw->in[1 - wi])->producer >= 0
                ? regc_graph_node(c->g, regc_graph_tensor(c->g, mw->in[1 - wi])->producer)
                : NULL;
        int k = 0, d, v;
        if (wv->ndim != 1 || wv->shape[0] != bv->shape[0] || !norm ||
            !over_root(c, norm, &d, &v, inner, &k))
            continue;
        const regc_node *add = made_by(c, v, REGC_OP_ADD_SCALAR);
        const regc_node *var = add ? made_by(c, add->in[0], REGC_OP_MEAN_LAST) : NULL;
        const regc_node *sq = var ? made_by(c, var->in[0], REGC_OP_POW) : NULL;
        const regc_node *sub = made_by(c, d, REGC_OP_SUB);
        const regc_node *mean = sub ? made_by(c, sub->in[1], REGC_OP_MEAN_LAST) : NULL;
        if (!sq || sq->attrs.value != 2.0f || sq->in[0] != d || !mean ||
            mean->in[0] != sub->in[0] || !(add->attrs.value > 0.0f))
            continue;
        const regc_tensor *xv = regc_graph_tensor(c->g, sub->in[0]);
        if (xv->ndim < 1 || xv->shape[xv->ndim - 1] != bv->shape[0])
            continue;
        *x = sub->in[0], *w = mw->in[wi], *b = root->in[1], *eps = add->attrs.value;
        const int outs[] = {root->in[0], mw->in[1 - wi], v, add->in[0], var->in[0], d, sub->in[1]};
        for (int j = 0; j < 7; j++)
            inner[k++] = regc_graph_tensor(c->g, outs[j])->producer;
        *n_inner = k;
        return 1;
    }
    return 0;
}

/* Match GPT-2's tanh GELU at root (a MUL). */
static int match_gelu(const fuse_ctx *c, const regc_node *root, int *x, int *inner, int *n_inner)
{
    for (int hi = 0; hi < 2; hi++) {
        int xt, s_in, c_in;
        const regc_node *one = made_by(c, root->in[1 - hi], REGC_OP_ADD_SCALAR);
        if (!is_scaled(c, root->in[hi], 0.5f, &xt) || !one || one->attrs.value != 1.0f)
            continue;
        const regc_node *th = made_by(c, one->in[0], REGC_OP_TANH);
        if (!th || !is_scaled(c, th->in[0], 0.7978845608f, &s_in))
            continue;
        const regc_node *sum = made_by(c, s_in, REGC_OP_ADD);
        if (!sum)
            continue;
        const int cube_side = sum->in[0] == xt ? 1 : sum->in[1] == xt ? 0 : -1;
        if (cube_side < 0 || !is_scaled(c, sum->in[cube_side], 0.044715f, &c_in))
            continue;
        const regc_node *cube = made_by(c, c_in, REGC_OP_POW);
        if (!cube || cube->attrs.value != 3.0f || cube->in[0] != xt)
            continue;
        *x = xt;
        const int outs[] = {root->in[hi], root->in[1 - hi],   one->in[0], th->in[0],
                            s_in,         sum->in[cube_side], c_in};
        *n_inner = 0;
        for (int k = 0; k < 7; k++)
            inner[(*n_inner)++] = regc_graph_tensor(c->g, outs[k])->producer;
        return 1;
    }
    return 0;
}

/* Does anything outside the match read the interior's outputs? Each
 * interior output must be read as often as the match itself reads it. */
static int interior_private(const fuse_ctx *c, const regc_node *root, const int *inner, int n)
{
    for (int k = 0; k < n; k++) {
        const int t = regc_graph_node(c->g, inner[k])->out[0];
        int inside = 0;
        for (int j = -1; j < n; j++) {
            const regc_node *q = j < 0 ? root : regc_graph_node(c->g, inner[j]);
            for (int i = 0; i < q->n_in; i++)
                inside += q->in[i] == t;
        }
        if (c->readers[t] != inside)
            return 0;
    }
    return 1;
}

int regc_graph_fuse_patterns(const regc_graph *g, regc_graph **out)
{
    *out = NULL;
    const int n_t = regc_graph_n_tensors(g), n_n = regc_graph_n_nodes(g);
    fuse_ctx c = {.g = g, .readers = calloc((size_t)n_t + 1, sizeof(int))};
    int *map = malloc(((size_t)n_t + 1) * sizeof *map);
    char *skip = calloc((size_t)n_n + 1, 1);
    /* fused[i]: what node i becomes: 0 itself, 1 rmsnorm, 2 gelu, 3 layernorm */
    char *fused = calloc((size_t)n_n + 1, 1);
    int *arg = malloc(((size_t)n_n + 1) * 3 * sizeof *arg); /* [n_nodes, 3] */
    float *eps = malloc(((size_t)n_n + 1) * sizeof *eps);
    regc_graph *h = regc_graph_new();
    int rc = REGC_OK;
    if (!c.readers || !map || !skip || !fused || !arg || !eps || !h)
        rc = regc_error(REGC_ERR_MEMORY, "graph: out of memory fusing patterns");
    for (int i = 0; rc == REGC_OK && i < n_n; i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int k = 0; k < n->n_in; k++)
            c.readers[n->in[k]]++;
    }
    for (int i = 0; rc == REGC_OK && i < regc_graph_n_outputs(g); i++)
        c.readers[regc_graph_output(g, i)]++;
    /* find the matches, last first, so that a match's interior is never
     * another's root */
    for (int i = n_n - 1; rc == REGC_OK && i >= 0; i--) {
        const regc_node *n = regc_graph_node(g, i);
        int inner[12], n_inner = 0, x, w, b;
        float e;
        if (skip[i] || (n->op != REGC_OP_MUL && n->op != REGC_OP_BIAS_ADD))
            continue;
        if (n->op == REGC_OP_BIAS_ADD) {
            if (!match_layernorm(&c, n, &x, &w, &b, &e, inner, &n_inner) ||
                !interior_private(&c, n, inner, n_inner))
                continue;
            fused[i] = 3, arg[3 * i] = x, arg[3 * i + 1] = w, arg[3 * i + 2] = b, eps[i] = e;
        } else if (match_rmsnorm(&c, n, &x, &w, &e, inner, &n_inner) &&
                   interior_private(&c, n, inner, n_inner)) {
            fused[i] = 1, arg[3 * i] = x, arg[3 * i + 1] = w, eps[i] = e;
        } else if (match_gelu(&c, n, &x, inner, &n_inner) &&
                   interior_private(&c, n, inner, n_inner)) {
            fused[i] = 2, arg[3 * i] = x;
        } else {
            continue;
        }
        for (int k = 0; k < n_inner; k++)
            skip[inner[k]] = 1;
    }
    /* the replay */
    if (rc == REGC_OK)
        rc = regc_graph_copy_leaves(g, h, map);
    for (int i = 0; rc == REGC_OK && i < n_n; i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (skip[i])
            continue;
        int in[REGC_MAX_IO], o[REGC_MAX_IO];
        if (fused[i] == 1) {
            regc_attrs a = {.eps = eps[i]};
            int outs[2];
            rc = regc_graph_add_node(h, REGC_OP_RMSNORM, &a, 2,
                                     (int[]){map[arg[3 * i]], map[arg[3 * i + 1]]}, 2, outs, 0,
                                     NULL);
            map[n->out[0]] = rc < 0 ? -1 : outs[0];
        } else if (fused[i] == 2) {
            rc = regc_graph_add_node(h, REGC_OP_GELU, NULL, 1, &map[arg[3 * i]], 1, o, 0, NULL);
            map[n->out[0]] = rc < 0 ? -1 : o[0];
        } else if (fused[i] == 3) {
            regc_attrs a = {.eps = eps[i]};
            rc = regc_graph_add_node(
                h, REGC_OP_LAYERNORM, &a, 3,
                (int[]){map[arg[3 * i]], map[arg[3 * i + 1]], map[arg[3 * i + 2]]}, 3, o, 0, NULL);
            map[n->out[0]] = rc < 0 ? -1 : o[0];
        } else {
            for (int k = 0; k < n->n_in; k++)
                in[k] = map[n->in[k]];
            const regc_tensor *y = regc_graph_tensor(g, n->out[0]);
            rc = regc_graph_add_node(h, n->op, &n->attrs, n->n_in, in, n->n_out, o, y->ndim,
                                     y->shape);
            for (int k = 0; rc >= 0 && k < n->n_out; k++)
                map[n->out[k]] = o[k];
        }
        rc = rc < 0 ? rc : REGC_OK;
    }
    for (int i = 0; rc == REGC_OK && i < regc_graph_n_outputs(g); i++)
        rc = regc_graph_mark_output(h, map[regc_graph_output(g, i)]);
    free(c.readers), free(map), free(skip), free(fused), free(arg), free(eps);
    if (rc) {
        regc_graph_free(h);
        return rc;
    }
    *out = h;
    return REGC_OK;
}
