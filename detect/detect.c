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
 * Each step is linear in the graph (times a small number of candidate
 * periods), so an 80-layer graph takes well under a millisecond per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detect_internal.h"

#define MAX_PERIODS 12 /* candidate periods tried per round */

/* ------------------------------------------------------------ runs */

/* Consecutive instances of one template: instance t is nodes[t*p .. t*p+p-1]
 * (template order), binding formal f to bind[t*nf + f]. */
typedef struct {
    int p, nf, n, cap;
    int *nodes, *bind;
    int *carried_j, *carried_s; /* [nf]: output (node, slot) of the previous instance, or -1 */
    int kind, rank;
} run_t;

static void run_free(run_t *r)
{
    free(r->nodes), free(r->bind), free(r->carried_j), free(r->carried_s);
    memset(r, 0, sizeof *r);
}

static int run_init(run_t *r, int p, int nf, int cap)
{
    memset(r, 0, sizeof *r);
    r->p = p, r->nf = nf, r->cap = cap < 2 ? 2 : cap, r->kind = -1;
    r->nodes = malloc((size_t)r->cap * (size_t)p * sizeof *r->nodes);
    r->bind = malloc((size_t)r->cap * ((size_t)nf + 1) * sizeof *r->bind);
    r->carried_j = malloc(((size_t)nf + 1) * sizeof *r->carried_j);
    r->carried_s = malloc(((size_t)nf + 1) * sizeof *r->carried_s);
    if (!r->nodes || !r->bind || !r->carried_j || !r->carried_s) {
        run_free(r);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    return REGC_OK;
}

/* Room for one more instance, at the front (front = 1) or the back. */
static int run_make_room(run_t *r, int front)
{
    if (r->n == r->cap) {
        int cap = 2 * r->cap;
        int *nodes = realloc(r->nodes, (size_t)cap * (size_t)r->p * sizeof *nodes);
        if (nodes)
            r->nodes = nodes;
        int *bind = realloc(r->bind, (size_t)cap * ((size_t)r->nf + 1) * sizeof *bind);
        if (bind)
            r->bind = bind;
        if (!nodes || !bind)
            return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
        r->cap = cap;
    }
    if (front) {
        memmove(r->nodes + r->p, r->nodes, (size_t)r->n * (size_t)r->p * sizeof *r->nodes);
        memmove(r->bind + r->nf, r->bind, (size_t)r->n * (size_t)r->nf * sizeof *r->bind);
    }
    return REGC_OK;
}

/* Where each node of a run sits: instance * p + template index, else -1.
 * Lives in the detector's scratch (all -1 between uses). */
static void mark_instance(int *where, const run_t *r, int t, int on)
{
    for (int j = 0; j < r->p; j++)
        where[r->nodes[t * r->p + j]] = on ? t * r->p + j : -1;
}

/* Is instance t's binding fed by instance t-1 exactly as the run's carried
 * formals say (and by nothing else of the run)? `where` marks instances
 * t-1 and t of the run; `in_run` is true for a node in any instance. */
static int chained(const detect_ctx *c, const run_t *r, int t, const int *where,
                   const char *in_run)
{
    for (int f = 0; f < r->nf; f++) {
        int b = r->bind[t * r->nf + f], pr = regc_graph_tensor(c->g, b)->producer;
        int w = pr >= 0 ? where[pr] : -1;
        int from_prev = w >= (t - 1) * r->p && w < t * r->p;
        if (r->carried_j[f] >= 0) {
            if (!from_prev || w - (t - 1) * r->p != r->carried_j[f] ||
                c->out_slot[b] != r->carried_s[f])
                return 0;
        } else if (pr >= 0 && in_run[pr]) {
            return 0;
        }
    }
    return 1;
}

/* From instances 0 and 1: which formals instance 1 reads from instance 0.
 * Returns the number carried; a stack needs at least one, and at least one
 * per-instance parameter (parallel branches or a parameter-free repeat are
 * not layers). */
static int find_carried(const detect_ctx *c, run_t *r, const int *where)
{
    int n_carried = 0, has_param = 0;
    for (int f = 0; f < r->nf; f++) {
        int b = r->bind[r->nf + f], pr = regc_graph_tensor(c->g, b)->producer;
        int w = pr >= 0 ? where[pr] : -1;
        r->carried_j[f] = r->carried_s[f] = -1;
        if (w >= 0 && w < r->p) {
            r->carried_j[f] = w;
            r->carried_s[f] = c->out_slot[b];
            n_carried++;
        }
        const regc_tensor *t0 = regc_graph_tensor(c->g, r->bind[f]);
        has_param |= t0->role == REGC_ROLE_PARAM && t0->producer < 0 && r->bind[f] != b;
    }
    return has_param ? n_carried : 0;
}

/* ---------------------------------------------------- the detector */

typedef struct {
    detect_ctx c;
    int *width;   /* [n+1] tensors crossing the cut before canonical position i */
    int *where;   /* [n] scratch for mark_instance */
    char *in_run; /* [n] scratch: node in the run being built */
    char *is_output; /* [n_tensors] graph outputs */
    int *bind;    /* [n * REGC_MAX_IO + 1] scratch binding */
    int *cand;    /* [n] scratch candidate */
    regc_formal_input *formals; /* [n * REGC_MAX_IO + 1] scratch */
    run_t *runs;
    int n_runs, cap_runs;
    regc_near_miss *near;
    int n_near, cap_near;
} detector;

/* width[i]: tensors produced before canonical position i and read at or
 * after it; a layer boundary is where only the hidden state (and what every
 * layer shares) crosses. */
static void compute_widths(detector *d)
{
    const detect_ctx *c = &d->c;
    const int n = c->n_nodes;
    memset(d->width, 0, ((size_t)n + 1) * sizeof *d->width);
    for (int i = 0; i < n; i++) {
        const regc_node *nd = regc_graph_node(c->g, i);
        for (int s = 0; s < nd->n_out; s++) {
            int t = nd->out[s], last = -1;
            for (int k = c->cons_start[t]; k < c->cons_start[t + 1]; k++)
                if (c->pos[c->cons_node[k]] > last)
                    last = c->pos[c->cons_node[k]];
            /* counts at cuts pos+1 .. last */
            if (last > c->pos[i]) {
                d->width[c->pos[i] + 1]++;
                d->width[last + 1]--;
            }
        }
    }
    for (int i = 1; i <= n; i++)
        d->width[i] += d->width[i - 1];
}

typedef struct {
    uint64_t label;
    int pos;
} label_pos;

static int cmp_label_pos(const void *pa, const void *pb)
{
    const label_pos *a = pa, *b = pb;
    if (a->label != b->label)
        return a->label < b->label ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

/* The most frequent gaps between equal labels among unowned nodes, plus
 * twice the most frequent few (alternating layers). */
static int candidate_periods(detector *d, int *periods)
{
    const detect_ctx *c = &d->c;
    const int n = c->n_nodes;
    label_pos *lp = malloc(((size_t)n + 1) * sizeof *lp);
    int *count = calloc((size_t)n + 1, sizeof *count);
    if (!lp || !count) {
        free(lp), free(count);
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c->owner[c->seq[i]] < 0)
            lp[m++] = (label_pos){c->label[c->seq[i]], i};
    qsort(lp, (size_t)m, sizeof *lp, cmp_label_pos);
    for (int k = 1; k < m; k++)
        if (lp[k].label == lp[k - 1].label)
            count[lp[k].pos - lp[k - 1].pos]++;
    int n_periods = 0;
    for (int round = 0; round < MAX_PERIODS - 4; round++) {
        int best = 0;
        for (int g = 2; g <= n / 2; g++)
            if (count[g] > count[best])
                best = g;
        if (count[best] == 0)
            break;
        periods[n_periods++] = best;
        count[best] = 0;
    }
    for (int k = 0, top = n_periods; k < top && k < 4; k++)
        if (2 * periods[k] <= n / 2)
            periods[n_periods++] = 2 * periods[k];
    free(lp), free(count);
    return n_periods;
}

static int same_label_at(const detect_ctx *c, int i, int j)
{
    int a = c->seq[i], b = c->seq[j];
    return c->owner[a] < 0 && c->owner[b] < 0 && c->label[a] == c->label[b];
}

/* Reads that cross the cut before canonical position `cut` from the p
 * nodes before it: how widely the tensors handed over fan out. */
static int crossing_reads(const detector *d, int cut, int p)
{
    const detect_ctx *c = &d->c;
    int reads = 0;
    for (int i = cut - p; i < cut; i++) {
        const regc_node *nd = regc_graph_node(c->g, c->seq[i]);
        for (int s = 0; s < nd->n_out; s++)
            for (int k = c->cons_start[nd->out[s]]; k < c->cons_start[nd->out[s] + 1]; k++)
                reads += c->pos[c->cons_node[k]] >= cut;
    }
    return reads;
}

/* The phase of a periodic stretch [s, s + len): the cut offset giving the
 * most instances, then the narrowest widest interior cut (a layer boundary
 * hands over the hidden state alone), then the cut where what is handed
 * over is read most (the residual stream branches where a layer starts:
 * BERT's post-norm output feeds q, k, v and the residual, the sum before
 * that norm only the norm). */
static int best_phase(const detector *d, int s, int len, int p, int *k_out)
{
    int best_phi = -1, best_k = 0, best_w = 0, best_r = 0;
    for (int phi = 0; phi < p; phi++) {
        int k = (len - phi) / p;
        if (k < 2)
            break;
        int w = 0;
        for (int t = 1; t < k; t++)
            if (d->width[s + phi + t * p] > w)
                w = d->width[s + phi + t * p];
        if (k < best_k || (k == best_k && w > best_w))
            continue;
        int r = crossing_reads(d, s + phi + p, p);
        if (k > best_k || w < best_w || r > best_r) {
            best_phi = phi, best_k = k, best_w = w, best_r = r;
        }
    }
    *k_out = best_k;
    return best_phi;
}

/* Build a run of up to k instances of period p from canonical position
 * `start`, keeping the verified, chained prefix. Returns instances kept. */
static int build_run(detector *d, run_t *r, int start, int p, int k)
{
    detect_ctx *c = &d->c;
    const int *tmpl = &c->seq[start];
    int nf = detect_template_formals(c, tmpl, p, d->formals);
    int rc = run_init(r, p, nf, k);
    if (rc < 0)
        return rc;
    detect_mismatch why;
    memcpy(r->nodes, tmpl, (size_t)p * sizeof *tmpl);
    if (!detect_match(c, tmpl, tmpl, p, r->bind, &why)) {
        run_free(r);
        return 0;
    }
    r->n = 1;
    for (int j = 0; j < p; j++)
        d->in_run[tmpl[j]] = 1;
    mark_instance(d->where, r, 0, 1);
    for (int t = 1; t < k; t++) {
        const int *cand = &c->seq[start + t * p];
        if (!detect_match(c, tmpl, cand, p, r->bind + t * nf, &why))
            break;
        memcpy(r->nodes + t * p, cand, (size_t)p * sizeof *cand);
        r->n = t + 1;
        mark_instance(d->where, r, t, 1);
        for (int j = 0; j < p; j++)
            d->in_run[cand[j]] = 1;
        int ok = t > 1 || find_carried(c, r, d->where) > 0;
        if (!ok || !chained(c, r, t, d->where, d->in_run)) {
            mark_instance(d->where, r, t, 0);
            for (int j = 0; j < p; j++)
                d->in_run[cand[j]] = 0;
            r->n = t;
            break;
        }
    }
    for (int t = 0; t < r->n; t++) {
        mark_instance(d->where, r, t, 0);
        for (int j = 0; j < p; j++)
            d->in_run[r->nodes[t * p + j]] = 0;
    }
    if (r->n < 2) {
        run_free(r);
        return 0;
    }
    return r->n;
}

/* The best verified run over all candidate periods, or 0 when none. */
static int find_best_run(detector *d, run_t *best)
{
    const detect_ctx *c = &d->c;
    const int n = c->n_nodes;
    int periods[MAX_PERIODS];
    int n_periods = candidate_periods(d, periods);
    if (n_periods < 0)
        return n_periods;
    int best_cover = 0, best_start = 0;
    memset(best, 0, sizeof *best);
    for (int k = 0; k < n_periods; k++) {
        const int p = periods[k];
        for (int i = 0; i + p < n;) {
            if (!same_label_at(c, i, i + p)) {
                i++;
                continue;
            }
            int j = i;
            while (j + p < n && same_label_at(c, j, j + p))
                j++;
            int len = j - i + p, count = 0, phi = len >= 2 * p ? best_phase(d, i, len, p, &count) : -1;
            if (phi >= 0 && count * p > best_cover) {
                run_t r;
                int got = build_run(d, &r, i + phi, p, count);
                if (got < 0)
                    return got;
                int cover = got * p;
                if (got > 0 && (cover > best_cover ||
                                (cover == best_cover && (p < best->p ||
                                                         (p == best->p && i + phi < best_start))))) {
                    run_free(best);
                    *best = r;
                    best_cover = cover;
                    best_start = i + phi;
                } else if (got > 0) {
                    run_free(&r);
                }
            }
            i = j + 1;
        }
    }
    return best_cover > 0;
}

static int add_near_miss(detector *d, int kind, int template_node, int node, const char *reason)
{
    for (int i = 0; i < d->n_near; i++)
        if (d->near[i].node == node)
            return REGC_OK;
    if (d->n_near == d->cap_near) {
        int cap = d->cap_near ? 2 * d->cap_near : 8;
        regc_near_miss *nm = realloc(d->near, (size_t)cap * sizeof *nm);
        if (!nm)
            return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
        d->near = nm, d->cap_near = cap;
    }
    regc_near_miss *m = &d->near[d->n_near++];
    m->kind = kind, m->template_node = template_node, m->node = node;
    snprintf(m->reason, sizeof m->reason, "%s", reason);
    return REGC_OK;
}

static void own_instance(detector *d, const run_t *r, int t, int id)
{
    for (int j = 0; j < r->p; j++)
        d->c.owner[r->nodes[t * r->p + j]] = id;
}

/* Check a guided candidate against the template; a complete wiring match
 * that differs only in types is a near miss. Returns 1 when it matches. */
static int try_candidate(detector *d, const run_t *r, int run_id, const int *cand, int *bind)
{
    detect_mismatch why;
    if (detect_match(&d->c, r->nodes, cand, r->p, bind, &why))
        return 1;
    if (why.types_only && why.node >= 0) {
        int rc = add_near_miss(d, run_id, why.node, cand[why.node], why.reason);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Grow a committed run by one instance before its first (front = 1) or
 * after its last, matching the template through the carried wiring.
 * Returns 1 when it grew, 0 when not, or a negative status. */
static int extend_run(detector *d, run_t *r, int run_id, int front)
{
    detect_ctx *c = &d->c;
    const int p = r->p, nf = r->nf;
    int seed_j = -1, seed_v = -1;
    for (int f = 0; f < nf && seed_j < 0; f++) {
        if (r->carried_j[f] < 0)
            continue;
        if (front) {
            int b = r->bind[f], pr = regc_graph_tensor(c->g, b)->producer;
            if (pr >= 0 && c->owner[pr] < 0 && c->out_slot[b] == r->carried_s[f])
                seed_j = r->carried_j[f], seed_v = pr;
        } else {
            const regc_node *last = regc_graph_node(c->g, r->nodes[(r->n - 1) * p + r->carried_j[f]]);
            const regc_node *use = regc_graph_node(c->g, r->nodes[d->formals[f].node]);
            int x = last->out[r->carried_s[f]], found = -1, many = 0;
            for (int k = c->cons_start[x]; k < c->cons_start[x + 1]; k++) {
                int v = c->cons_node[k];
                if (c->cons_port[k] == d->formals[f].port && c->owner[v] < 0 &&
                    regc_graph_node(c->g, v)->op == use->op) {
                    many |= found >= 0 && found != v;
                    found = v;
                }
            }
            if (found >= 0 && !many)
                seed_j = d->formals[f].node, seed_v = found;
        }
    }
    if (seed_j < 0 || !detect_guide(c, r->nodes, p, seed_j, seed_v, d->cand))
        return 0;
    int ok = try_candidate(d, r, run_id, d->cand, d->bind);
    if (ok <= 0)
        return ok;
    /* The chain: the new instance must feed (or be fed by) the run exactly
     * through the carried formals. */
    int rc = run_make_room(r, front);
    if (rc < 0)
        return rc;
    int t = front ? 0 : r->n;
    memcpy(r->nodes + t * p, d->cand, (size_t)p * sizeof *d->cand);
    memcpy(r->bind + t * nf, d->bind, (size_t)nf * sizeof *d->bind);
    r->n++;
    int lo = front ? 0 : r->n - 2; /* the pair to check: lo feeds lo + 1 */
    mark_instance(d->where, r, lo, 1);
    mark_instance(d->where, r, lo + 1, 1);
    for (int u = 0; u < r->n; u++)
        for (int j = 0; j < p; j++)
            d->in_run[r->nodes[u * p + j]] = 1;
    /* the new instance itself precedes (or follows) the whole run, so its
     * own bindings cannot come from the run without a cycle */
    ok = chained(c, r, lo + 1, d->where, d->in_run);
    mark_instance(d->where, r, lo, 0);
    mark_instance(d->where, r, lo + 1, 0);
    for (int u = 0; u < r->n; u++)
        for (int j = 0; j < p; j++)
            d->in_run[r->nodes[u * p + j]] = 0;
    if (!ok) {
        if (front) {
            memmove(r->nodes, r->nodes + p, (size_t)(r->n - 1) * (size_t)p * sizeof *r->nodes);
            memmove(r->bind, r->bind + nf, (size_t)(r->n - 1) * (size_t)nf * sizeof *r->bind);
        }
        r->n--;
        return 0;
    }
    own_instance(d, r, t, run_id);
    return 1;
}

/* Runs of the same kind: equal templates (so equal formal numbering) and
 * the same carried formals. */
static int same_kind(detector *d, const run_t *a, const run_t *b)
{
    if (a->p != b->p || a->nf != b->nf)
        return 0;
    for (int f = 0; f < a->nf; f++)
        if (a->carried_j[f] != b->carried_j[f] || a->carried_s[f] != b->carried_s[f])
            return 0;
    detect_mismatch why;
    return detect_match(&d->c, a->nodes, b->nodes, a->p, d->bind, &why);
}

static int add_run(detector *d, run_t *r)
{
    if (d->n_runs == d->cap_runs) {
        int cap = d->cap_runs ? 2 * d->cap_runs : 4;
        run_t *runs = realloc(d->runs, (size_t)cap * sizeof *runs);
        if (!runs)
            return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
        d->runs = runs, d->cap_runs = cap;
    }
    d->runs[d->n_runs++] = *r;
    memset(r, 0, sizeof *r);
    return REGC_OK;
}

/* Find, extend and commit runs until none is left. */
static int find_runs(detector *d)
{
    for (;;) {
        run_t r;
        int rc = find_best_run(d, &r);
        if (rc <= 0)
            return rc;
        const int id = d->n_runs;
        /* the template's formals (the run's numbering) for extend_run */
        detect_template_formals(&d->c, r.nodes, r.p, d->formals);
        for (int t = 0; t < r.n; t++)
            own_instance(d, &r, t, id);
        while ((rc = extend_run(d, &r, id, 1)) > 0)
            ;
        while (rc >= 0 && (rc = extend_run(d, &r, id, 0)) > 0)
            ;
        if (rc < 0 || (rc = add_run(d, &r)) < 0) {
            run_free(&r);
            return rc;
        }
    }
}

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

static void drop_run(detector *d, int id)
{
    for (int i = 0; i < d->c.n_nodes; i++)
        if (d->c.owner[i] == id)
            d->c.owner[i] = -1;
        else if (d->c.owner[i] > id)
            d->c.owner[i]--;
    run_free(&d->runs[id]);
    memmove(&d->runs[id], &d->runs[id + 1], (size_t)(d->n_runs - id - 1) * sizeof *d->runs);
    d->n_runs--;
    for (int i = 0; i < d->n_near; i++)
        if (d->near[i].kind == id)
            d->near[i].kind = -1;
        else if (d->near[i].kind > id)
            d->near[i].kind--;
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
    *out = (regc_region_kind){.n_nodes = p, .n_inputs = nf, .n_outputs = n_out, .inputs = inputs,
                              .outputs = outputs, .n_instances = n_inst, .nodes = nodes,
                              .in_bind = in_bind, .out_bind = out_bind,
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
            b->segments[b->n_segments++] = (regc_segment){.type = REGC_SEGMENT_GLUE,
                                                          .n_nodes = n_glue - start,
                                                          .nodes = glue + start};
        if (l < d->n_runs) {
            const run_t *r = &d->runs[order[l]];
            b->segments[b->n_segments++] = (regc_segment){
                .type = REGC_SEGMENT_RUN, .kind = r->kind, .first = first_inst[r->kind],
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

static void detector_free(detector *d)
{
    for (int i = 0; i < d->n_runs; i++)
        run_free(&d->runs[i]);
    free(d->runs), free(d->near), free(d->width), free(d->where), free(d->in_run);
    free(d->is_output), free(d->bind), free(d->cand), free(d->formals);
    detect_ctx_free(&d->c);
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

static int detector_init(detector *d, const regc_graph *g)
{
    memset(d, 0, sizeof *d);
    int rc = detect_ctx_init(&d->c, g);
    if (rc < 0)
        return rc;
    const size_t n = (size_t)d->c.n_nodes, nt = (size_t)d->c.n_tensors;
    d->width = calloc(n + 2, sizeof *d->width);
    d->where = malloc((n + 1) * sizeof *d->where);
    d->in_run = calloc(n + 1, 1);
    d->is_output = calloc(nt + 1, 1);
    d->bind = malloc((n * REGC_MAX_IO + 1) * sizeof *d->bind);
    d->cand = malloc((n + 1) * sizeof *d->cand);
    d->formals = malloc((n * REGC_MAX_IO + 1) * sizeof *d->formals);
    if (!d->width || !d->where || !d->in_run || !d->is_output || !d->bind || !d->cand ||
        !d->formals)
        return regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    for (size_t i = 0; i <= n; i++)
        d->where[i] = -1;
    for (int o = 0; o < regc_graph_n_outputs(g); o++)
        d->is_output[regc_graph_output(g, o)] = 1;
    compute_widths(d);
    return REGC_OK;
}

/* Give every run a kind: the first earlier run it matches, else a new one. */
static int assign_kinds(detector *d)
{
    int n_kinds = 0;
    for (int i = 0; i < d->n_runs; i++) {
        d->runs[i].kind = -1;
        for (int k = 0; k < i && d->runs[i].kind < 0; k++)
            if (same_kind(d, &d->runs[k], &d->runs[i]))
                d->runs[i].kind = d->runs[k].kind;
        if (d->runs[i].kind < 0)
            d->runs[i].kind = n_kinds++;
    }
    return n_kinds;
}

int regc_detect_blocks(const regc_graph *g, regc_blocks **out)
{
    *out = NULL;
    detector d;
    regc_blocks *b = calloc(1, sizeof *b);
    int rc = b ? detector_init(&d, g) : regc_error(REGC_ERR_MEMORY, "detect: out of memory");
    int *order = NULL, *level = NULL;
    if (rc == REGC_OK)
        rc = find_runs(&d);
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
        drop_run(&d, bad);
    }
    if (rc == REGC_OK) {
        b->n_kinds = assign_kinds(&d);
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
        detector_free(&d);
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
