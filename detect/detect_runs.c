/* detect_runs.c — runs of repeated instances: candidate periods from the
 * canonical order, periodic stretches cut where the fewest tensors cross,
 * exact checks of every instance, extension of a run at both ends through
 * the wiring, near misses, and the detector's own state.
 *
 * A run is consecutive instances of one template; the detector finds the
 * run covering the most nodes, takes it, and searches what is left again
 * (detect.c turns the runs it found into kinds and the program). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detect_internal.h"

#define MAX_SINGLE 8      /* the most frequent gaps to the next equal label tried */
#define MAX_DOUBLED 4     /* ... of which twice the first few too */
#define MAX_SPAN_LAYERS 8 /* the longest pattern of layers looked for */
/* candidate periods tried per round: one per span from 2 on */
#define MAX_PERIODS (MAX_SINGLE + MAX_DOUBLED + MAX_SPAN_LAYERS - 1)

static void detect_run_free(run_t *r)
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
        detect_run_free(r);
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
static int chained(const detect_ctx *c, const run_t *r, int t, const int *where, const char *in_run)
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

/* Is gap g among the n candidates? */
static int has_period(const int *periods, int n, int g)
{
    for (int k = 0; k < n; k++)
        if (periods[k] == g)
            return 1;
    return 0;
}

/* Add gap g to the candidates unless it is there already (or they are
 * full, which the limits above rule out). */
static void add_period(int *periods, int *n, int g)
{
    if (!has_period(periods, *n, g) && *n < MAX_PERIODS)
        periods[(*n)++] = g;
}

/* Candidate periods from the gaps between equal labels among unowned
 * nodes: the most frequent gaps to the next equal label (a layer's
 * length), twice the most frequent few (layers that alternate), and the
 * most frequent new gap to the k-th next equal label for k up to
 * MAX_SPAN_LAYERS: a pattern of k layers of different lengths (three with
 * RoPE, then one without) repeats at the sum of them, a gap no single step
 * shows. New, because a label a layer holds twice (two projections of one
 * shape) recurs at half that span, a gap an earlier span gave already. */
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
    for (int round = 0; round < MAX_SINGLE; round++) {
        int best = 0;
        for (int g = 2; g <= n / 2; g++)
            if (count[g] > count[best])
                best = g;
        if (count[best] == 0)
            break;
        periods[n_periods++] = best;
        count[best] = 0;
    }
    for (int k = 0, top = n_periods; k < top && k < MAX_DOUBLED; k++)
        if (2 * periods[k] <= n / 2)
            add_period(periods, &n_periods, 2 * periods[k]);
    for (int span = 2; span <= MAX_SPAN_LAYERS; span++) {
        memset(count, 0, ((size_t)n + 1) * sizeof *count);
        for (int k = span; k < m; k++)
            if (lp[k].label == lp[k - span].label && lp[k].pos - lp[k - span].pos <= n / 2)
                count[lp[k].pos - lp[k - span].pos]++;
        int best = 0;
        for (int g = 2; g <= n / 2; g++)
            if (count[g] > count[best] && !has_period(periods, n_periods, g))
                best = g;
        if (count[best] > 0)
            add_period(periods, &n_periods, best);
    }
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
        detect_run_free(r);
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
        detect_run_free(r);
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
            int len = j - i + p, count = 0,
                phi = len >= 2 * p ? best_phase(d, i, len, p, &count) : -1;
            if (phi >= 0 && count * p > best_cover) {
                run_t r;
                int got = build_run(d, &r, i + phi, p, count);
                if (got < 0)
                    return got;
                int cover = got * p;
                if (got > 0 && (cover > best_cover ||
                                (cover == best_cover &&
                                 (p < best->p || (p == best->p && i + phi < best_start))))) {
                    detect_run_free(best);
                    *best = r;
                    best_cover = cover;
                    best_start = i + phi;
                } else if (got > 0) {
                    detect_run_free(&r);
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
            const regc_node *last =
                regc_graph_node(c->g, r->nodes[(r->n - 1) * p + r->carried_j[f]]);
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
int detect_find_runs(detector *d)
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
            detect_run_free(&r);
            return rc;
        }
    }
}
void detect_drop_run(detector *d, int id)
{
    for (int i = 0; i < d->c.n_nodes; i++)
        if (d->c.owner[i] == id)
            d->c.owner[i] = -1;
        else if (d->c.owner[i] > id)
            d->c.owner[i]--;
    detect_run_free(&d->runs[id]);
    memmove(&d->runs[id], &d->runs[id + 1], (size_t)(d->n_runs - id - 1) * sizeof *d->runs);
    d->n_runs--;
    for (int i = 0; i < d->n_near; i++)
        if (d->near[i].kind == id)
            d->near[i].kind = -1;
        else if (d->near[i].kind > id)
            d->near[i].kind--;
}

void detect_detector_free(detector *d)
{
    for (int i = 0; i < d->n_runs; i++)
        detect_run_free(&d->runs[i]);
    free(d->runs), free(d->near), free(d->width), free(d->where), free(d->in_run);
    free(d->is_output), free(d->bind), free(d->cand), free(d->formals);
    detect_ctx_free(&d->c);
}

int detect_detector_init(detector *d, const regc_graph *g)
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

/* Give every run a kind: the first earlier run it matches, else a new one. */ int
detect_assign_kinds(detector *d)
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
