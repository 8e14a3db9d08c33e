/* plan.c — static memory planning (see plan.h).
 *
 * Offsets: greedy by size with best fit. The expensive question, "which
 * memory is taken, at some point of [first, last], by buffers already
 * placed?", is answered by a segment tree over program points whose nodes
 * hold merged runs of occupied memory rather than buffers: a whole-step
 * program keeps thousands of saved activations alive at once, but once
 * packed they form a handful of runs, so a query costs O(log points) sets
 * of a few runs instead of a scan over every placed buffer.
 *
 * Order: list scheduling over the buffer hazards with a lazy max-heap. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "regc_common.h"

/* ---- sets of occupied memory runs ---------------------------------------- */

typedef struct {
    int64_t lo, hi; /* [lo, hi) */
} span;

typedef struct {
    span *v;
    int n, cap;
} span_set;

/* Add [lo, hi), merging with every run it overlaps or touches, so the set
 * stays sorted, disjoint and as short as the occupancy allows. */
static int span_set_add(span_set *s, int64_t lo, int64_t hi)
{
    int a = 0, b = s->n;
    while (a < b) { /* first run that ends at or after lo */
        int m = (a + b) / 2;
        if (s->v[m].hi < lo)
            a = m + 1;
        else
            b = m;
    }
    int end = a; /* runs [a, end) merge with the new one */
    while (end < s->n && s->v[end].lo <= hi)
        end++;
    if (end > a) {
        if (s->v[a].lo < lo)
            lo = s->v[a].lo;
        if (s->v[end - 1].hi > hi)
            hi = s->v[end - 1].hi;
        s->v[a] = (span){lo, hi};
        memmove(s->v + a + 1, s->v + end, (size_t)(s->n - end) * sizeof(span));
        s->n -= end - a - 1;
        return REGC_OK;
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        span *v = realloc(s->v, (size_t)cap * sizeof(span));
        if (!v)
            return regc_error(REGC_ERR_MEMORY, "memory plan: out of memory for %d occupied runs",
                              cap);
        s->v = v;
        s->cap = cap;
    }
    memmove(s->v + a + 1, s->v + a, (size_t)(s->n - a) * sizeof(span));
    s->v[a] = (span){lo, hi};
    s->n++;
    return REGC_OK;
}

/* ---- the segment tree over program points --------------------------------
 * A buffer living over [a, b] is stored (`full`) at the canonical nodes that
 * tile [a, b]; `sub` of a node is the union of `full` over its subtree. A
 * buffer meets [f, l] exactly when it sits in `sub` of a canonical node of
 * [f, l] or in `full` of one of their ancestors. */

typedef struct {
    int size;       /* leaves, a power of two */
    span_set *full; /* [2 * size] */
    span_set *sub;  /* [2 * size] */
    span *scratch;  /* runs gathered by one query */
    span *merged;   /* [cap_scratch]: where sorted runs are merged */
    int n_scratch, cap_scratch;
    int *run; /* starts of the sorted runs in scratch, then n_scratch */
    int n_run, cap_run;
} occ_tree;

static int tree_add(occ_tree *t, int node, int nl, int nr, int f, int l, int64_t lo, int64_t hi)
{
    int rc = span_set_add(&t->sub[node], lo, hi);
    if (rc < 0)
        return rc;
    if (f <= nl && nr <= l)
        return span_set_add(&t->full[node], lo, hi);
    int mid = (nl + nr) / 2;
    if (f <= mid && (rc = tree_add(t, 2 * node, nl, mid, f, l, lo, hi)) < 0)
        return rc;
    if (l > mid && (rc = tree_add(t, 2 * node + 1, mid + 1, nr, f, l, lo, hi)) < 0)
        return rc;
    return REGC_OK;
}

static int gather(occ_tree *t, const span_set *s)
{
    if (s->n == 0)
        return REGC_OK;
    if (t->n_scratch + s->n > t->cap_scratch) {
        int cap = t->cap_scratch ? t->cap_scratch : 64;
        while (cap < t->n_scratch + s->n)
            cap *= 2;
        span *v = realloc(t->scratch, (size_t)cap * sizeof(span));
        if (v)
            t->scratch = v;
        span *m = v ? realloc(t->merged, (size_t)cap * sizeof(span)) : NULL;
        if (!m)
            return regc_error(REGC_ERR_MEMORY, "memory plan: out of memory for %d occupied runs",
                              cap);
        t->merged = m;
        t->cap_scratch = cap;
    }
    if (t->n_run + 2 > t->cap_run) {
        int cap = t->cap_run ? 2 * t->cap_run : 64;
        int *v = realloc(t->run, (size_t)cap * sizeof(int));
        if (!v)
            return regc_error(REGC_ERR_MEMORY, "memory plan: out of memory for %d occupied runs",
                              cap);
        t->run = v;
        t->cap_run = cap;
    }
    t->run[t->n_run++] = t->n_scratch;
    memcpy(t->scratch + t->n_scratch, s->v, (size_t)s->n * sizeof(span));
    t->n_scratch += s->n;
    return REGC_OK;
}

static int tree_query(occ_tree *t, int node, int nl, int nr, int f, int l)
{
    if (f <= nl && nr <= l)
        return gather(t, &t->sub[node]);
    int rc = gather(t, &t->full[node]);
    if (rc < 0)
        return rc;
    int mid = (nl + nr) / 2;
    if (f <= mid && (rc = tree_query(t, 2 * node, nl, mid, f, l)) < 0)
        return rc;
    if (l > mid && (rc = tree_query(t, 2 * node + 1, mid + 1, nr, f, l)) < 0)
        return rc;
    return REGC_OK;
}

/* Gather the runs taken at some point of [f, l] into scratch, sorted by
 * start (they may overlap: runs from different nodes are not merged with
 * each other). Each node's set is already sorted, so its runs are merged
 * pairwise, a few rounds for the O(log points) sets of a query. */
static int occupied(occ_tree *t, int f, int l)
{
    t->n_scratch = 0;
    t->n_run = 0;
    int rc = tree_query(t, 1, 0, t->size - 1, f, l);
    if (rc < 0 || t->n_run == 0)
        return rc;
    t->run[t->n_run] = t->n_scratch;
    while (t->n_run > 1) {
        int n_out = 0;
        for (int r = 0; r < t->n_run; r += 2) {
            int a = t->run[r], ae = t->run[r + 1], o = a;
            t->run[n_out++] = a;
            if (r + 1 == t->n_run) {
                memcpy(t->merged + a, t->scratch + a, (size_t)(ae - a) * sizeof(span));
                continue;
            }
            int b = ae, be = t->run[r + 2];
            while (a < ae && b < be)
                t->merged[o++] =
                    t->scratch[a].lo <= t->scratch[b].lo ? t->scratch[a++] : t->scratch[b++];
            while (a < ae)
                t->merged[o++] = t->scratch[a++];
            while (b < be)
                t->merged[o++] = t->scratch[b++];
        }
        t->run[n_out] = t->n_scratch;
        t->n_run = n_out;
        span *swap = t->scratch;
        t->scratch = t->merged;
        t->merged = swap;
    }
    return REGC_OK;
}

/* Best fit: the smallest free gap between taken runs that holds `need`
 * (lowest offset among equals), else the top of what is taken. Every run
 * starts and ends on a multiple of the alignment, so gaps do too. */
static int64_t best_fit(const occ_tree *t, int64_t need)
{
    int64_t best = -1, best_gap = 0, reach = 0;
    for (int i = 0; i < t->n_scratch; i++) {
        const span *s = &t->scratch[i];
        if (s->lo > reach) {
            int64_t gap = s->lo - reach;
            if (gap >= need && (best < 0 || gap < best_gap)) {
                best = reach;
                best_gap = gap;
            }
        }
        if (s->hi > reach)
            reach = s->hi;
    }
    return best >= 0 ? best : reach;
}

static int overlaps_any(const occ_tree *t, int64_t lo, int64_t hi)
{
    for (int i = 0; i < t->n_scratch && t->scratch[i].lo < hi; i++)
        if (t->scratch[i].hi > lo)
            return 1;
    return 0;
}

static void tree_free(occ_tree *t)
{
    if (t->full)
        for (int i = 0; i < 2 * t->size; i++) {
            free(t->full[i].v);
            free(t->sub[i].v);
        }
    free(t->full);
    free(t->sub);
    free(t->scratch);
    free(t->merged);
    free(t->run);
}

/* ---- validation ---------------------------------------------------------- */

static int check_buffers(int n, const regc_plan_buffer *bufs, int *max_last)
{
    if (n < 0 || (n > 0 && !bufs))
        return regc_error(REGC_ERR_ARG, "memory plan: %d buffers%s", n,
                          n > 0 ? " but no buffer array" : "");
    *max_last = -1;
    for (int i = 0; i < n; i++) {
        const regc_plan_buffer *b = &bufs[i];
        if (b->bytes < 0)
            return regc_error(REGC_ERR_ARG, "memory plan: buffer %d has negative size %lld", i,
                              (long long)b->bytes);
        if (b->first < 0 || b->last < b->first)
            return regc_error(REGC_ERR_ARG, "memory plan: buffer %d has lifetime [%d, %d]", i,
                              b->first, b->last);
        if (b->inplace_of < -1 || b->inplace_of >= n || b->inplace_of == i)
            return regc_error(REGC_ERR_ARG,
                              "memory plan: buffer %d is in place of buffer %d (of %d)", i,
                              b->inplace_of, n);
        if (b->last > *max_last)
            *max_last = b->last;
    }
    return REGC_OK;
}

/* The pair B in place of A is one the planner and the lower bound honour
 * only when A dies exactly where B is born; anything else is planned as two
 * ordinary buffers. */
static int inplace_pair(const regc_plan_buffer *bufs, int b)
{
    int a = bufs[b].inplace_of;
    return a >= 0 && bufs[a].last == bufs[b].first;
}

/* ---- lower bound --------------------------------------------------------- */

int64_t regc_plan_lower_bound(int n, const regc_plan_buffer *bufs, int n_points)
{
    int max_last;
    int rc = check_buffers(n, bufs, &max_last);
    if (rc < 0)
        return rc;
    if (max_last >= n_points)
        return regc_error(REGC_ERR_ARG, "memory plan: a buffer lives until point %d of %d",
                          max_last, n_points);
    if (n_points <= 0)
        return 0;
    int64_t *diff = calloc((size_t)n_points + 1, sizeof(int64_t));
    if (!diff)
        return regc_error(REGC_ERR_MEMORY, "memory plan: out of memory for %d program points",
                          n_points);
    for (int i = 0; i < n; i++) {
        diff[bufs[i].first] += bufs[i].bytes;
        diff[bufs[i].last + 1] -= bufs[i].bytes;
        if (inplace_pair(bufs, i)) {
            /* the two share memory at that one point; a plan can reuse no
             * more than the smaller of them */
            int64_t a = bufs[bufs[i].inplace_of].bytes, s = a < bufs[i].bytes ? a : bufs[i].bytes;
            diff[bufs[i].first] -= s;
            diff[bufs[i].first + 1] += s;
        }
    }
    int64_t live = 0, best = 0;
    for (int p = 0; p < n_points; p++) {
        live += diff[p];
        if (live > best)
            best = live;
    }
    free(diff);
    return best;
}

/* ---- offsets ------------------------------------------------------------- */

typedef struct {
    int64_t bytes;
    int first, index;
} size_key;

/* Larger first; among equals the earlier-born, then the lower index, so the
 * plan does not depend on the sort's stability. */
static int cmp_size(const void *pa, const void *pb)
{
    const size_key *x = pa, *y = pb;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

int regc_plan_offsets(int n, const regc_plan_buffer *bufs, int64_t align, int64_t *offset,
                      regc_plan_result *res)
{
    int max_last;
    int rc = check_buffers(n, bufs, &max_last);
    if (rc < 0)
        return rc;
    if (align <= 0 || (align & (align - 1)))
        return regc_error(REGC_ERR_ARG, "memory plan: alignment %lld is not a power of two",
                          (long long)align);
    if (n > 0 && !offset)
        return regc_error(REGC_ERR_ARG, "memory plan: no offset array for %d buffers", n);
    for (int i = 0; i < n; i++)
        if (bufs[i].bytes > INT64_MAX / 2 - align)
            return regc_error(REGC_ERR_ARG, "memory plan: buffer %d of %lld bytes is too large", i,
                              (long long)bufs[i].bytes);
    regc_plan_result r = {0, 0, 0};
    int n_points = max_last + 1;
    r.lower_bound_bytes = regc_plan_lower_bound(n, bufs, n_points);
    if (r.lower_bound_bytes < 0)
        return (int)r.lower_bound_bytes;

    occ_tree t = {0};
    size_key *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof(size_key));
    /* lent[a]: a buffer already took a's memory in place; host[b]: b sits
     * in the memory of that buffer (-1: its own) */
    int *lent = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    int *host = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    char *placed = calloc((size_t)(n > 0 ? n : 1), 1);
    t.size = 1;
    while (t.size < n_points)
        t.size *= 2;
    t.full = calloc((size_t)(2 * t.size), sizeof(span_set));
    t.sub = calloc((size_t)(2 * t.size), sizeof(span_set));
    if (!idx || !lent || !host || !placed || !t.full || !t.sub) {
        rc = regc_error(REGC_ERR_MEMORY, "memory plan: out of memory for %d buffers", n);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        idx[i] = (size_key){bufs[i].bytes, bufs[i].first, i};
        host[i] = -1;
    }
    qsort(idx, (size_t)n, sizeof(size_key), cmp_size);

    for (int k = 0; k < n; k++) {
        int i = idx[k].index;
        const regc_plan_buffer *b = &bufs[i];
        int64_t need = (b->bytes + align - 1) & ~(align - 1);
        if (need == 0) {
            offset[i] = 0;
            placed[i] = 1;
            continue;
        }
        int64_t off = -1;
        int a = b->inplace_of;
        if (inplace_pair(bufs, i) && placed[a] && !lent[a] && bufs[a].bytes > 0 &&
            need <= ((bufs[a].bytes + align - 1) & ~(align - 1)) &&
            !(host[a] >= 0 && bufs[host[a]].last >= b->first)) {
            /* At b's first point the only buffers that may overlap a's
             * memory are those sharing it in place with a; none does (the
             * test above), so only the later points need a query. */
            int free_later = 1;
            if (b->last > b->first) {
                if ((rc = occupied(&t, b->first + 1, b->last)) < 0)
                    goto done;
                free_later = !overlaps_any(&t, offset[a], offset[a] + need);
            }
            if (free_later) {
                off = offset[a];
                lent[a] = 1;
                host[i] = a;
                r.n_inplace++;
            }
        }
        if (off < 0) {
            if ((rc = occupied(&t, b->first, b->last)) < 0)
                goto done;
            off = best_fit(&t, need);
        }
        if ((rc = tree_add(&t, 1, 0, t.size - 1, b->first, b->last, off, off + need)) < 0)
            goto done;
        offset[i] = off;
        placed[i] = 1;
        if (off + need > r.peak_bytes)
            r.peak_bytes = off + need;
    }
    if (res)
        *res = r;
    rc = REGC_OK;
done:
    tree_free(&t);
    free(idx);
    free(lent);
    free(host);
    free(placed);
    return rc;
}

/* ---- execution order ----------------------------------------------------- */

typedef struct {
    int64_t score;
    int instr;
} heap_item;

/* a before b: higher score, then lower program index */
static int heap_before(heap_item a, heap_item b)
{
    return a.score != b.score ? a.score > b.score : a.instr < b.instr;
}

static void heap_push(heap_item *h, int *n, heap_item x)
{
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!heap_before(x, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, int *n)
{
    heap_item top = h[0], x = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_before(h[c + 1], h[c]))
            c++;
        if (!heap_before(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = x;
    return top;
}

static int check_program(int n_instr, const int *read_start, const int *reads,
                         const int *write_start, const int *writes, int n_buffers,
                         const int64_t *bytes, const int *order)
{
    if (n_instr < 0 || n_buffers < 0)
        return regc_error(REGC_ERR_ARG, "memory order: %d instructions, %d buffers", n_instr,
                          n_buffers);
    if (!read_start || !write_start || (n_instr > 0 && !order) || (n_buffers > 0 && !bytes))
        return regc_error(REGC_ERR_ARG, "memory order: a required array is missing");
    if (read_start[0] != 0 || write_start[0] != 0)
        return regc_error(REGC_ERR_ARG, "memory order: read_start[0] and write_start[0] must be 0");
    for (int i = 0; i < n_instr; i++) {
        if (read_start[i + 1] < read_start[i] || write_start[i + 1] < write_start[i])
            return regc_error(REGC_ERR_ARG,
                              "memory order: instruction %d has a negative operand count", i);
    }
    if ((read_start[n_instr] > 0 && !reads) || (write_start[n_instr] > 0 && !writes))
        return regc_error(REGC_ERR_ARG, "memory order: a required array is missing");
    for (int i = 0; i < n_instr; i++) {
        for (int k = read_start[i]; k < read_start[i + 1]; k++)
            if (reads[k] < 0 || reads[k] >= n_buffers)
                return regc_error(REGC_ERR_ARG,
                                  "memory order: instruction %d reads buffer %d (of %d)", i,
                                  reads[k], n_buffers);
        for (int k = write_start[i]; k < write_start[i + 1]; k++)
            if (writes[k] < 0 || writes[k] >= n_buffers)
                return regc_error(REGC_ERR_ARG,
                                  "memory order: instruction %d writes buffer %d (of %d)", i,
                                  writes[k], n_buffers);
    }
    for (int b = 0; b < n_buffers; b++)
        if (bytes[b] < 0)
            return regc_error(REGC_ERR_ARG, "memory order: buffer %d has negative size %lld", b,
                              (long long)bytes[b]);
    return REGC_OK;
}

int regc_plan_order(int n_instr, const int *read_start, const int *reads, const int *write_start,
                    const int *writes, int n_buffers, const int64_t *bytes, int *order)
{
    int rc =
        check_program(n_instr, read_start, reads, write_start, writes, n_buffers, bytes, order);
    if (rc < 0)
        return rc;
    if (n_instr == 0)
        return REGC_OK;
    int n_rd = read_start[n_instr], n_wr = write_start[n_instr];
    size_t nb = (size_t)n_buffers + 1, ni = (size_t)n_instr + 1, nacc = (size_t)(n_rd + n_wr) + 1;

    /* Per buffer, in program order: its last writer and the readers since
     * then. Each access adds at most one edge per earlier access it must
     * follow, so the readers list is cleared at every write. */
    int *last_writer = malloc(nb * sizeof(int));
    int *rd_head = malloc(nb * sizeof(int));   /* readers since the last write: a linked list */
    int *rd_next = malloc(nacc * sizeof(int)); /* over read slots */
    int *rd_instr = malloc(nacc * sizeof(int));
    int *seen = malloc(nb * sizeof(int)); /* last instruction that touched the buffer */
    int *first_access_write =
        malloc(nb * sizeof(int)); /* -1 unknown, 1 write first, 0 read first */
    int *edge_from, *edge_to;
    int *out_start = calloc(ni, sizeof(int)), *out = NULL, *indeg = calloc(ni, sizeof(int));
    int *tch_start = malloc(ni * sizeof(int)), *tch = malloc(nacc * sizeof(int));
    int *rem = calloc(nb, sizeof(int));
    int64_t *rem_sum = calloc(nb, sizeof(int64_t)); /* sum of the unscheduled touchers' indices */
    int64_t *score = calloc(ni, sizeof(int64_t));
    char *scheduled = calloc(ni, 1);
    heap_item *heap = NULL;
    int *cursor = NULL;
    /* RAW and WAR edges come one per read slot (a read slot is cleared by
     * the next write), WAW edges one per write: 2 * accesses bound them */
    int n_edges = 0;
    edge_from = malloc(2 * nacc * sizeof(int));
    edge_to = malloc(2 * nacc * sizeof(int));
    if (!last_writer || !rd_head || !rd_next || !rd_instr || !seen || !first_access_write ||
        !out_start || !indeg || !tch_start || !tch || !rem || !rem_sum || !score || !scheduled ||
        !edge_from || !edge_to) {
        rc =
            regc_error(REGC_ERR_MEMORY, "memory order: out of memory for %d instructions", n_instr);
        goto done;
    }
    for (int b = 0; b < n_buffers; b++) {
        last_writer[b] = -1;
        rd_head[b] = -1;
        seen[b] = -1;
        first_access_write[b] = -1;
    }

    int n_tch = 0, n_rd_slots = 0;
    for (int i = 0; i < n_instr; i++) {
        tch_start[i] = n_tch;
        /* reads first: an instruction that reads and writes a buffer reads
         * the value before its own write */
        for (int k = read_start[i]; k < read_start[i + 1]; k++) {
            int b = reads[k];
            if (seen[b] == i)
                continue;
            seen[b] = i;
            tch[n_tch++] = b;
            if (first_access_write[b] < 0)
                first_access_write[b] = 0;
            if (last_writer[b] >= 0) {
                edge_from[n_edges] = last_writer[b];
                edge_to[n_edges++] = i;
            }
            rd_instr[n_rd_slots] = i;
            rd_next[n_rd_slots] = rd_head[b];
            rd_head[b] = n_rd_slots++;
        }
        for (int k = write_start[i]; k < write_start[i + 1]; k++) {
            int b = writes[k];
            if (seen[b] == i && last_writer[b] == i)
                continue; /* written twice by the same instruction */
            if (seen[b] != i) {
                seen[b] = i;
                tch[n_tch++] = b;
            }
            if (first_access_write[b] < 0) {
                first_access_write[b] = 1;
                score[i] -= bytes[b]; /* i allocates it */
            }
            if (last_writer[b] >= 0) {
                edge_from[n_edges] = last_writer[b];
                edge_to[n_edges++] = i;
            }
            for (int s = rd_head[b]; s >= 0; s = rd_next[s])
                if (rd_instr[s] != i) {
                    edge_from[n_edges] = rd_instr[s];
                    edge_to[n_edges++] = i;
                }
            rd_head[b] = -1;
            last_writer[b] = i;
        }
    }
    tch_start[n_instr] = n_tch;

    /* adjacency of the dependencies (duplicates are harmless: in-degrees
     * count them the same way they are released) */
    out = malloc((size_t)(n_edges > 0 ? n_edges : 1) * sizeof(int));
    heap = malloc((size_t)(n_instr + n_tch + 1) * sizeof(heap_item));
    cursor = malloc(ni * sizeof(int));
    if (!out || !heap || !cursor) {
        rc =
            regc_error(REGC_ERR_MEMORY, "memory order: out of memory for %d dependencies", n_edges);
        goto done;
    }
    for (int e = 0; e < n_edges; e++) {
        out_start[edge_from[e] + 1]++;
        indeg[edge_to[e]]++;
    }
    for (int i = 0; i < n_instr; i++)
        out_start[i + 1] += out_start[i];
    for (int i = 0; i < n_instr; i++)
        cursor[i] = out_start[i];
    for (int e = 0; e < n_edges; e++)
        out[cursor[edge_from[e]]++] = edge_to[e];

    /* Buffers read before any write (inputs, accumulators) hold memory the
     * whole time, so they are neither allocated nor freed by the schedule. */
    for (int i = 0; i < n_instr; i++)
        for (int k = tch_start[i]; k < tch_start[i + 1]; k++) {
            int b = tch[k];
            if (first_access_write[b] == 1) {
                rem[b]++;
                rem_sum[b] += i;
            }
        }
    for (int b = 0; b < n_buffers; b++)
        if (first_access_write[b] == 1 && rem[b] == 1)
            score[rem_sum[b]] += bytes[b]; /* its only toucher frees it too */

    int n_heap = 0, n_done = 0;
    for (int i = 0; i < n_instr; i++)
        if (indeg[i] == 0)
            heap_push(heap, &n_heap, (heap_item){score[i], i});
    while (n_heap > 0) {
        heap_item it = heap_pop(heap, &n_heap);
        int i = it.instr;
        if (scheduled[i] || it.score != score[i])
            continue; /* a stale entry: i was pushed again with a new score */
        scheduled[i] = 1;
        order[n_done++] = i;
        for (int k = tch_start[i]; k < tch_start[i + 1]; k++) {
            int b = tch[k];
            if (first_access_write[b] != 1)
                continue;
            rem[b]--;
            rem_sum[b] -= i;
            if (rem[b] == 1) {
                /* the one toucher left will free it */
                int j = (int)rem_sum[b];
                score[j] += bytes[b];
                if (indeg[j] == 0 && !scheduled[j])
                    heap_push(heap, &n_heap, (heap_item){score[j], j});
            }
        }
        for (int e = out_start[i]; e < out_start[i + 1]; e++)
            if (--indeg[out[e]] == 0)
                heap_push(heap, &n_heap, (heap_item){score[out[e]], out[e]});
    }
    if (n_done != n_instr) /* cannot happen: every dependency points forward */
        rc = regc_error(REGC_ERR_ARG, "memory order: only %d of %d instructions could be ordered",
                        n_done, n_instr);
    else
        rc = REGC_OK;
done:
    free(last_writer);
    free(rd_head);
    free(rd_next);
    free(rd_instr);
    free(seen);
    free(first_access_write);
    free(edge_from);
    free(edge_to);
    free(out_start);
    free(out);
    free(indeg);
    free(tch_start);
    free(tch);
    free(rem);
    free(rem_sum);
    free(score);
    free(scheduled);
    free(heap);
    free(cursor);
    return rc;
}
