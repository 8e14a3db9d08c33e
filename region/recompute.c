/* recompute.c — compile.recompute on one compiled region, after lowering
 * and precision and before its memory is planned: saved activations
 * dropped after the forward and computed again in the backward.
 *
 * A saved slot (written by the forward, read by the backward, kept per
 * instance in between) is dropped by making it a temporary of the forward
 * and replaying, in the backward, the forward instructions that wrote it:
 * the same kernels on the same inputs, so the same bits. A replay reads
 * what the backward has anyway (the region's formal inputs and the saved
 * slots that stay), and whatever else it reads (a forward temporary, a
 * dropped slot) is replayed too: the replay set is the closure. Every slot
 * a replay writes is a fresh backward temporary, never the forward's own
 * memory (a formal output or a kept saved slot stays as the forward left
 * it), and the backward's reads of a dropped slot read that temporary.
 *
 * Each replay runs right before the first backward instruction that
 * reads what it writes (directly or through later replays), in forward
 * order: the backward of a layer first needs what the end of its forward
 * made, so recomputed tensors are made late and die early, and since a
 * region is one layer, at most one layer's recomputation is live at once.
 *
 * Which slots are dropped (regc_recompute_policy):
 *   - none;
 *   - selective: those whose replay is cheap: no GEMM, no attention, and
 *     at most CHEAP_RATIO FLOPs per byte it frees (norms, activations,
 *     elementwise chains over kept GEMM outputs; not a loss's log-sum-exp,
 *     which costs a pass over the logits for a float a row);
 *   - full: every one that can be, so a layer keeps its inputs only (its
 *     formal inputs are the previous layer's output and its parameters);
 *   - ratio: those whose replay costs at most `ratio` FLOPs per byte it
 *     frees (compile.recompute auto's choice, compile.c).
 * A slot can be dropped when every instruction of its replay set can run
 * again: none accumulates into or reads its own output, and it is its
 * slot's only writer in the forward (a slot several instructions write in
 * turn would be replayed from a later state). In a whole-graph region,
 * `keep` (regc_keep) names the layers' boundaries, never dropped, and the
 * glue's tensors, which full drops as selective does.
 *
 * Costs are FLOPs: 2mnk for a GEMM, 4·b·h·tq·tk·d for attention (half
 * when causal), and one per element touched for everything else. With a
 * measured profile (compile.schedule's re-plans: regc_kernel_cost), auto
 * counts what each kernel took instead, in FLOPs at the measured step's
 * average rate: a kernel's cost times its measured time per cost over the
 * step's, so a memory-bound norm that runs fifty times slower per FLOP
 * than the GEMMs costs fifty times its FLOPs, and the ranking by cost per
 * byte freed follows time rather than arithmetic. A kernel the profile
 * does not hold (another shape of chunk) counts its FLOPs. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"
#include "validate.h"

/* selective's bound on a cheap replay: an elementwise kernel touches a few
 * floats per float it makes, well under one FLOP per byte */
#define CHEAP_RATIO 16.0

double regc_instr_cost(const regc_instr *in)
{
    if (in->kernel == K_GEMM)
        return regc_instr_flop(in);
    if (in->kernel == K_ATTN_FWD || in->kernel == K_ATTN_BWD) {
        const regc_attn_shape *a = &in->attn;
        double f = 4.0 * (double)a->batch * a->n_head * (double)a->tq * (double)a->tk * a->head_dim;
        f *= in->kernel == K_ATTN_BWD ? 2.5 : 1.0; /* recomputed scores, three products */
        return a->causal ? f / 2.0 : f;
    }
    regc_instr_extent e;
    double elems = 0.0;
    if (regc_instr_extent_of(in, 1, &e) == REGC_OK)
        for (int k = 0; k < in->n_refs; k++)
            elems += (double)e.bytes[k] / (regc_instr_ref_bf16(in, k) ? 2.0 : 4.0);
    return elems;
}

/* The measured time per cost of the row labelled `label`, or 0. */
static double measured_rate(const regc_recompute_policy *pol, const char *label)
{
    for (int i = 0; i < pol->n_costs; i++) {
        const regc_kernel_cost *k = &pol->costs[i];
        if (k->cost > 0.0 && k->ms > 0.0 && !strcmp(k->label, label))
            return k->ms / k->cost;
    }
    return 0.0;
}

/* A norm's kernel with and without the residual add before it: inlined
 * back, the step fuses a layer's last add with the next layer's first norm,
 * so a norm a region runs alone may run only fused in the measured step
 * (and the other way round); one's time per cost stands for the other's. */
static regc_kernel norm_sibling(regc_kernel k)
{
    return k == K_LN_FWD        ? K_ADD_LN_FWD
           : k == K_ADD_LN_FWD  ? K_LN_FWD
           : k == K_RMS_FWD     ? K_ADD_RMS_FWD
           : k == K_ADD_RMS_FWD ? K_RMS_FWD
                                : K_COUNT;
}

/* The label a measured profile counts `in` under: its own, a
 * recomputation's as its kernel's. */
static void cost_label(const regc_instr *in, char *label)
{
    regc_instr x = *in;
    x.replay = 0;
    regc_instr_label(&x, label, REGC_PROFILE_LABEL);
}

/* What `in` cost as pol counts it: measured when pol holds its kernel (or
 * its norm sibling), else FLOPs (regc_instr_cost). */
static double policy_cost(const regc_recompute_policy *pol, const regc_instr *in)
{
    const double f = regc_instr_cost(in);
    if (!pol || pol->n_costs == 0 || !(pol->rate > 0.0))
        return f;
    char label[REGC_PROFILE_LABEL];
    cost_label(in, label);
    double r = measured_rate(pol, label);
    if (r == 0.0 && norm_sibling(in->kernel) != K_COUNT)
        r = measured_rate(pol, regc_kernel_name(norm_sibling(in->kernel)));
    return r > 0.0 ? f * r * pol->rate : f;
}

/* The measured step's average rate, in cost per millisecond: what turns
 * a kernel's time back into FLOPs; 0 when nothing was measured. */
double regc_kernel_cost_rate(const regc_kernel_cost *k, int n)
{
    double ms = 0.0, cost = 0.0;
    for (int i = 0; i < n; i++)
        if (k[i].cost > 0.0 && k[i].ms > 0.0)
            ms += k[i].ms, cost += k[i].cost;
    return ms > 0.0 ? cost / ms : 0.0;
}

typedef struct {
    regc_compiled_region *r;
    int *writer_at,
        *writers;     /* slot s's forward writers: writers[writer_at[s] .. writer_at[s+1]) */
    char *can_replay; /* [n_fwd] */
    char *in_set;     /* [n_fwd] scratch: the closure */
    int *stack;       /* [n_fwd] scratch */
} rc_ctx;

/* Does `in` write slot s? */
static int writes_slot(const regc_instr *in, int s)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == s && regc_instr_writes(in, k))
            return 1;
    return 0;
}

static int reads_own_output(const regc_instr *in)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf >= 0 && !regc_instr_writes(in, k) && writes_slot(in, in->refs[k].buf))
            return 1;
    return 0;
}

/* Each slot's forward writers, once per instruction, in order. */
static int ctx_init(rc_ctx *c, regc_compiled_region *r)
{
    const size_t ns = (size_t)r->n_slots + 2, nf = (size_t)r->n_fwd + 1;
    *c = (rc_ctx){.r = r};
    c->writer_at = calloc(ns, sizeof(int));
    c->writers = malloc(nf * REGC_INSTR_MAX_REFS * sizeof(int));
    c->can_replay = malloc(nf), c->in_set = calloc(nf, 1), c->stack = malloc(nf * sizeof(int));
    if (!c->writer_at || !c->writers || !c->can_replay || !c->in_set || !c->stack)
        return regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < r->n_fwd; i++) {
            const regc_instr *in = &r->fwd[i];
            c->can_replay[i] = !in->accumulate && !reads_own_output(in);
            for (int k = 0; k < in->n_refs; k++) {
                const int s = in->refs[k].buf;
                int seen = 0; /* an instruction writing s twice is one writer */
                for (int q = 0; q < k; q++)
                    seen |= in->refs[q].buf == s && regc_instr_writes(in, q);
                if (s < 0 || !regc_instr_writes(in, k) || seen)
                    continue;
                if (pass == 0)
                    c->writer_at[s + 1]++;
                else
                    c->writers[c->writer_at[s]++] = i;
            }
        }
        /* counts to starts; after the second pass, each start has moved to
         * its slot's end, which is the next slot's start: shift back */
        if (pass == 0)
            for (int s = 0; s < r->n_slots; s++)
                c->writer_at[s + 1] += c->writer_at[s];
        else
            for (int s = r->n_slots; s > 0; s--)
                c->writer_at[s] = c->writer_at[s - 1];
    }
    c->writer_at[0] = 0;
    /* a slot written in turn by several instructions holds, between them,
     * states a replay in the backward would not remake in order */
    for (int s = 0; s < r->n_slots; s++)
        if (c->writer_at[s + 1] - c->writer_at[s] > 1)
            for (int w = c->writer_at[s]; w < c->writer_at[s + 1]; w++)
                c->can_replay[c->writers[w]] = 0;
    return REGC_OK;
}

static void ctx_free(rc_ctx *c)
{
    free(c->writer_at), free(c->writers), free(c->can_replay), free(c->in_set), free(c->stack);
}

/* The writers of slot s onto the stack; 0 when the forward writes no s. */
static int push_writers(rc_ctx *c, int s, int *top)
{
    for (int w = c->writer_at[s]; w < c->writer_at[s + 1]; w++) {
        const int i = c->writers[w];
        if (!c->in_set[i])
            c->stack[(*top)++] = i, c->in_set[i] = 1;
    }
    return c->writer_at[s + 1] > c->writer_at[s];
}

/* Is slot s available to a replay without replaying its writers? */
static int available(const rc_ctx *c, const char *drop, int s)
{
    const regc_slot_kind k = c->r->slots[s].kind;
    return k == SLOT_IN || k == SLOT_OUT || (k == SLOT_SAVED && !drop[s]);
}

/* A residual add fused with the norm of its sum (K_ADD_LN_FWD,
 * K_ADD_RMS_FWD) whose sum is kept replays as the norm alone, reading the
 * sum: the fused kernel computes the norm's own float operations, and the
 * add's inputs (the branch, the residual before it) need not be made
 * again. Its instruction is the norm's, else -1 (not such an add). */
static int norm_of_kept_sum(const rc_ctx *c, const char *drop, const regc_instr *in,
                            regc_instr *norm)
{
    const int ln = in->kernel == K_ADD_LN_FWD;
    if ((!ln && in->kernel != K_ADD_RMS_FWD) || in->refs[0].buf < 0 ||
        !available(c, drop, in->refs[0].buf))
        return -1;
    if (norm) {
        *norm = *in;
        norm->kernel = ln ? K_LN_FWD : K_RMS_FWD;
        const int n_out = ln ? 3 : 2; /* y, [mean,] rstd */
        for (int k = 0; k < n_out; k++)
            norm->refs[k] = in->refs[1 + k];
        norm->refs[n_out] = in->refs[0];             /* x: the sum */
        norm->refs[n_out + 1] = in->refs[n_out + 3]; /* w */
        if (ln)
            norm->refs[n_out + 2] = in->refs[n_out + 4]; /* bias */
        norm->n_out = (uint8_t)n_out;
        norm->n_refs = (uint8_t)(ln ? 6 : 4);
        norm->bf16_refs = (uint16_t)(regc_instr_ref_bf16(in, 1)); /* y: 1 -> 0 */
    }
    return 1;
}

/* The closure of dropping drop[]: c->in_set marks the forward
 * instructions to replay; 0 when some cannot be replayed. */
static int closure(rc_ctx *c, const char *drop)
{
    const regc_compiled_region *r = c->r;
    memset(c->in_set, 0, (size_t)r->n_fwd);
    int top = 0;
    for (int s = 0; s < r->n_slots; s++)
        if (drop[s] && !push_writers(c, s, &top))
            return 0;
    while (top > 0) {
        const int j = c->stack[--top];
        if (!c->can_replay[j])
            return 0;
        regc_instr norm;
        const regc_instr *in =
            norm_of_kept_sum(c, drop, &r->fwd[j], &norm) > 0 ? &norm : &r->fwd[j];
        for (int k = 0; k < in->n_refs; k++) {
            const int s = in->refs[k].buf;
            if (s < 0 || regc_instr_writes(in, k) || available(c, drop, s))
                continue;
            if (!push_writers(c, s, &top))
                return 0; /* read, never written in the forward: not ours to make */
        }
    }
    return 1;
}

static int is_candidate(const regc_compiled_region *r, const char *keep, int s)
{
    const regc_slot *x = &r->slots[s];
    return x->kind == SLOT_SAVED && x->alias < 0 && x->bytes > 0 &&
           !(keep && keep[x->tensor] == REGC_KEEP_ALWAYS);
}

/* keep: [region tensors] or NULL; pol: whose costs count (NULL: FLOPs).
 * The candidates (malloc'd) of region r. */
static int regc_region_recompute_candidates(regc_compiled_region *r,
                                            const regc_recompute_policy *pol, const char *keep,
                                            regc_recompute_candidate **out, int *n_out)
{
    *out = NULL, *n_out = 0;
    rc_ctx c;
    char *drop = calloc((size_t)r->n_slots + 1, 1);
    regc_recompute_candidate *list = calloc((size_t)r->n_slots + 1, sizeof *list);
    double *cost = malloc(((size_t)r->n_fwd + 1) * sizeof *cost); /* [n_fwd] */
    int rc = ctx_init(&c, r), n = 0;
    if (rc == REGC_OK && (!drop || !list || !cost))
        rc = regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    for (int j = 0; rc == REGC_OK && j < r->n_fwd; j++)
        cost[j] = policy_cost(pol, &r->fwd[j]);
    for (int s = 0; s < r->n_slots && rc == REGC_OK; s++) {
        if (!is_candidate(r, keep, s))
            continue;
        drop[s] = 1;
        if (closure(&c, drop)) {
            regc_recompute_candidate *x = &list[n++];
            *x = (regc_recompute_candidate){.slot = s,
                                            .bytes = r->slots[s].bytes,
                                            .glue =
                                                keep && keep[r->slots[s].tensor] == REGC_KEEP_GLUE};
            double flop = 0.0;
            for (int j = 0; j < r->n_fwd; j++)
                if (c.in_set[j]) {
                    flop += regc_instr_cost(&r->fwd[j]);
                    x->cost += cost[j];
                    x->heavy |= r->fwd[j].kernel == K_GEMM || r->fwd[j].kernel == K_ATTN_FWD;
                }
            x->heavy |= flop > CHEAP_RATIO * (double)x->bytes;
        }
        drop[s] = 0;
    }
    ctx_free(&c);
    free(drop), free(cost);
    if (rc) {
        free(list);
        return rc;
    }
    *out = list, *n_out = n;
    return REGC_OK;
}

/* ---------------------------------------------------------------- the rewrite */

/* Drop drop[] (its closure c->in_set, computed): replays into the
 * backward, each before its first reader there. */
static int rewrite(rc_ctx *c, const char *drop)
{
    regc_compiled_region *r = c->r;
    const int n_old = r->n_slots, n_fwd = r->n_fwd, n_bwd = r->n_bwd;
    int n_rep = 0, rc = REGC_OK;
    for (int j = 0; j < n_fwd; j++)
        n_rep += c->in_set[j];
    int *fresh = malloc(((size_t)n_old + 1) * sizeof *fresh);
    int *deadline = malloc(((size_t)n_fwd + 1) * sizeof *deadline);
    regc_instr *rep = malloc(((size_t)n_rep + 1) * sizeof *rep);
    regc_instr *bwd = malloc(((size_t)n_bwd + n_rep + 1) * sizeof *bwd);
    if (!fresh || !deadline || !rep || !bwd) {
        rc = regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
        goto done;
    }
    for (int s = 0; s < n_old; s++)
        fresh[s] = -1;
    /* the replays, their outputs into fresh temporaries */
    int m = 0;
    for (int j = 0; j < n_fwd && rc == REGC_OK; j++) {
        if (!c->in_set[j])
            continue;
        regc_instr x = r->fwd[j];
        norm_of_kept_sum(c, drop, &r->fwd[j], &x);
        for (int k = 0; k < x.n_refs && rc == REGC_OK; k++) {
            const int s = x.refs[k].buf;
            if (s < 0)
                continue;
            /* a replay reads what stays as the forward left it, and the
             * recomputed copy of the rest */
            const int out = regc_instr_writes(&x, k);
            if (out && fresh[s] < 0 &&
                (fresh[s] = regc_region_add_temp(r, s, r->slots[s].bytes)) < 0)
                rc = fresh[s];
            else if (fresh[s] >= 0 && (out || !available(c, drop, s)))
                x.refs[k].buf = fresh[s];
        }
        x.replay = 1;
        rep[m++] = x;
    }
    /* the backward reads the recomputed copies of what was dropped */
    for (int i = 0; i < n_bwd && rc == REGC_OK; i++)
        for (int k = 0; k < r->bwd[i].n_refs; k++) {
            const int s = r->bwd[i].refs[k].buf;
            if (s >= 0 && s < n_old && drop[s])
                r->bwd[i].refs[k].buf = fresh[s];
        }
    /* deadlines, last replay first: the first backward reader of anything
     * it writes, or the deadline of a later replay reading it */
    for (int a = m - 1; a >= 0 && rc == REGC_OK; a--) {
        int d = n_bwd;
        for (int k = 0; k < rep[a].n_refs; k++) {
            const int s = rep[a].refs[k].buf;
            if (s < n_old || !regc_instr_writes(&rep[a], k))
                continue;
            for (int i = 0; i < n_bwd && i < d; i++)
                for (int q = 0; q < r->bwd[i].n_refs; q++)
                    if (r->bwd[i].refs[q].buf == s)
                        d = i < d ? i : d;
            for (int b = a + 1; b < m; b++)
                for (int q = 0; q < rep[b].n_refs; q++)
                    if (rep[b].refs[q].buf == s && !regc_instr_writes(&rep[b], q) &&
                        deadline[b] < d)
                        d = deadline[b];
        }
        deadline[a] = d;
    }
    /* merged: each replay before its deadline, replays in forward order */
    int w = 0;
    for (int i = 0; i <= n_bwd && rc == REGC_OK; i++) {
        for (int a = 0; a < m; a++)
            if (deadline[a] == i)
                bwd[w++] = rep[a];
        if (i < n_bwd)
            bwd[w++] = r->bwd[i];
    }
    if (rc == REGC_OK) {
        free(r->bwd);
        r->bwd = bwd, r->n_bwd = w;
        bwd = NULL;
        /* what was dropped lives in the forward only now, views included */
        for (int s = 0; s < n_old; s++) {
            int root = s;
            while (r->slots[root].alias >= 0)
                root = r->slots[root].alias;
            if (drop[root])
                r->slots[s].kind = SLOT_TEMP;
        }
    }
done:
    free(fresh), free(deadline), free(rep), free(bwd);
    return rc;
}

int regc_region_recompute(regc_compiled_region *r, const regc_recompute_policy *pol,
                          const char *keep)
{
    if (!pol || pol->mode == REGC_RECOMPUTE_NONE || r->n_bwd == 0)
        return REGC_OK;
    regc_recompute_candidate *cand = NULL;
    int n = 0, rc = regc_region_recompute_candidates(r, pol, keep, &cand, &n);
    char *drop = calloc((size_t)r->n_slots + 1, 1);
    if (rc == REGC_OK && !drop)
        rc = regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
    if (rc == REGC_OK && pol->mode == REGC_RECOMPUTE_AUTO) { /* for the compile's search */
        free(r->recompute_ratios);
        r->n_recompute_ratios = 0;
        if (!(r->recompute_ratios = malloc(((size_t)n + 1) * sizeof *r->recompute_ratios)))
            rc = regc_error(REGC_ERR_MEMORY, "region %s: out of memory", r->name);
        for (int i = 0; i < n && rc == REGC_OK; i++)
            r->recompute_ratios[r->n_recompute_ratios++] = cand[i].cost / (double)cand[i].bytes;
    }
    int any = 0;
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        const regc_recompute_candidate *x = &cand[i];
        /* the same expression as the ratios stored above, so that auto's
         * search, choosing one of them, drops exactly the slots at or below it */
        int d = pol->mode == REGC_RECOMPUTE_FULL        ? (pol->layer && !x->glue) || !x->heavy
                : pol->mode == REGC_RECOMPUTE_SELECTIVE ? !x->heavy
                                                        : x->cost / (double)x->bytes <= pol->ratio;
        drop[x->slot] = (char)d;
        any |= d;
    }
    rc_ctx c = {0};
    if (rc == REGC_OK && any && (rc = ctx_init(&c, r)) == REGC_OK) {
        if (!closure(&c, drop))
            rc = regc_error(REGC_ERR_UNSUPPORTED, "region %s: the chosen recomputation cannot run",
                            r->name);
        else
            rc = rewrite(&c, drop);
    }
    ctx_free(&c);
    free(drop), free(cand);
    return rc;
}

/* ---------------------------------------------------------------- the program's account */

static void count(regc_fit_plan *out, int *per_kernel, const regc_instr *in)
{
    if (in->kernel == K_COPY_D2H && regc_instr_is_queued_copy(in))
        out->offloaded++, out->offload_bytes += in->d[0];
    if (in->kernel == K_CE_ROWS) {
        out->logits_chunks++;
        if (in->d[0] > out->logits_chunk_rows)
            out->logits_chunk_rows = in->d[0];
    }
    const double f = regc_instr_cost(in);
    out->step_flop += f;
    if (in->replay) {
        out->replays++, out->replay_flop += f;
        per_kernel[in->kernel]++;
    }
}

void regc_program_fit_plan(const regc_program *p, regc_fit_plan *out)
{
    memset(out, 0, sizeof *out);
    int per_kernel[K_COUNT] = {0};
    if (!p->lazy)
        for (int i = 0; i < p->n_instr; i++)
            count(out, per_kernel, &p->instr[i]);
    for (int b = 0; p->lazy && b < p->n_bufs; b++) /* O0's copies, made as it runs */
        if (p->bufs[b].away >= 0)
            out->offloaded++, out->offload_bytes += p->bufs[b].bytes;
    for (int i = 0; p->lazy && i < p->n_steps; i++) {
        const lazy_step *s = &p->steps[i];
        if (s->piece < 0) {
            count(out, per_kernel, &s->instr);
            continue;
        }
        const regc_compiled_region *r = p->regions[p->pieces[s->piece].region];
        const int n = s->backward ? r->n_bwd : r->n_fwd;
        for (int j = 0; j < n; j++)
            count(out, per_kernel, s->backward ? &r->bwd[j] : &r->fwd[j]);
    }
    size_t at = 0;
    for (int shown = 0; shown < K_COUNT; shown++) {
        int best = -1;
        for (int k = 0; k < K_COUNT; k++)
            if (per_kernel[k] > 0 && (best < 0 || per_kernel[k] > per_kernel[best]))
                best = k;
        if (best < 0 || at >= sizeof out->kernels)
            break;
        at += (size_t)snprintf(out->kernels + at, sizeof out->kernels - at, "%s%s %d",
                               shown ? ", " : "", regc_kernel_name((regc_kernel)best),
                               per_kernel[best]);
        per_kernel[best] = 0;
    }
}

/* ---------------------------------------------------------------- measured costs */

int regc_kernel_cost_row(regc_kernel_cost *rows, int *n, const regc_instr *in)
{
    char label[REGC_PROFILE_LABEL];
    cost_label(in, label);
    int j = 0;
    while (j < *n && strcmp(rows[j].label, label) != 0)
        j++;
    if (j == *n) {
        memset(&rows[j], 0, sizeof rows[j]);
        memcpy(rows[(*n)++].label, label, sizeof label);
    }
    return j;
}

/* Collectives, their waits and the copies of offloading: time spent
 * moving bytes, which no recomputation changes. */
static int moves_bytes(const regc_instr *in)
{
    return in->kernel == K_ALLREDUCE || in->kernel == K_ALLGATHER ||
           in->kernel == K_REDUCE_SCATTER || in->kernel == K_COMM_WAIT ||
           in->kernel == K_COPY_D2H || in->kernel == K_COPY_H2D;
}

int regc_program_kernel_costs(const regc_program *p, regc_kernel_cost **out, int *n_out)
{
    *out = NULL, *n_out = 0;
    if (p->lazy || !p->instr_ms || p->measured_runs < 1)
        return regc_error(REGC_ERR_ARG, "kernel costs: no measured flat program");
    regc_kernel_cost *rows = calloc((size_t)p->n_instr + 1, sizeof *rows);
    if (!rows)
        return regc_error(REGC_ERR_MEMORY, "kernel costs: out of memory");
    int n = 0;
    for (int i = 0; i < p->n_instr; i++) {
        if (moves_bytes(&p->instr[i]))
            continue;
        regc_kernel_cost *row = &rows[regc_kernel_cost_row(rows, &n, &p->instr[i])];
        row->ms += p->instr_ms[i] / p->measured_runs;
        row->cost += regc_instr_cost(&p->instr[i]);
    }
    *out = rows, *n_out = n;
    return REGC_OK;
}
