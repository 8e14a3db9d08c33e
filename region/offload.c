/* offload.c — compile.offload_activation on the flat step program, before
 * its memory is planned (and on O0's lazy steps, at the end): saved
 * activations moved to host memory after the forward's last use and
 * brought back before the backward's first, on the backend's copy queue
 * (a side stream on a GPU), so the device holds neither copy in between.
 *
 * Which instructions are the backward's: those that read what the loss's
 * seed made (the gradient flows from it), and the recomputations, with
 * everything they write; and, after the first of them, those whose
 * outputs only the backward reads, made from what they read (a value
 * held in bf16, widened for a backward kernel; not a fill, which the
 * forward may hold for the backward). Counting one of the forward's as the backward's only
 * keeps buffers on the device: the copies follow the uses either way. An activation the backward
 * reads (a saved slot's, or a value between layers that a layer's backward recomputes from)
 * qualifies when every forward use comes before every backward use, the
 * backward only reads it, it is no unit's gathered parameters, it holds at
 * least MIN_BYTES (a copy has a cost of its own), and something between
 * the two uses makes a buffer of at least MIN_BYTES (else the room it frees
 * serves nothing: the logits, read by the loss and then by its gradient
 * with only the seed between, stay). With p->offload_limit >= 0, only that
 * many of them, the largest first (ties: the earlier buffer); under
 * p->host_budget_bytes, the largest first that the host room left beside
 * what it already holds (the offloaded optimizer state) takes, a smaller
 * one where a larger does not fit.
 *
 * For each, with f its forward's last use and u its backward's first:
 *
 *     after f       start copy to host (signal a)
 *     at w          wait for a; the device copy dies here
 *     at s          start copy back into a new buffer (signal b)
 *     before u      wait for b; the backward reads the new buffer
 *
 * w is the first point after f with p->copy_flop_per_byte x bytes of
 * compute behind the copy, s the last before u with as much ahead of it,
 * so each copy hides behind compute where the backend runs it on its own
 * queue (compile.c's regc_copy_flop_per_byte); where the gap is too short to hide
 * both, w is f + 1 and s is u: the bytes still leave the device, the copies
 * show. Copies move bytes: the bits are the same. Where the backend has no
 * copy queue (the CPU) a copy is done where it starts and its wait is
 * nothing, so nothing is to be hidden: w = f + 1, s = u. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

/* Below this, a tensor stays: a copy's fixed cost outweighs its bytes. */
#define MIN_BYTES (INT64_C(64) << 10)

typedef struct {
    int pos;   /* insert before instruction pos (p->n_instr: at the end) */
    int phase; /* at one position: 0 out-start, 1 out-wait, 2 back-start, 3 back-wait */
    regc_instr in;
} insertion;

static int cmp_insertion(const void *a, const void *b)
{
    const insertion *x = a, *y = b;
    if (x->pos != y->pos)
        return (x->pos > y->pos) - (x->pos < y->pos);
    return (x->phase > y->phase) - (x->phase < y->phase);
}

/* Which instructions are the backward's (header). */
static char *backward_of(const regc_program *p)
{
    char *bwd = calloc((size_t)p->n_instr + 1, 1);
    char *tainted = calloc((size_t)p->n_bufs + 1, 1);
    if (!bwd || !tainted) {
        free(bwd), free(tainted);
        return NULL;
    }
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        int b = in->replay;
        for (int k = 0; k < in->n_refs && !b; k++) {
            const int x = in->refs[k].buf;
            b = x >= 0 && !regc_instr_writes(in, k) &&
                (tainted[x] ||
                 (p->bufs[x].kind == BUF_SCALARS && in->kernel == K_COPY &&
                  in->refs[k].off == (int64_t)offsetof(regc_step_scalars, loss_scale)));
        }
        if (!b)
            continue;
        bwd[i] = 1;
        for (int k = 0; k < in->n_refs; k++)
            if (in->refs[k].buf >= 0 && regc_instr_writes(in, k))
                tainted[in->refs[k].buf] = 1;
    }
    /* then, last to first, what runs inside the backward to serve it
     * alone: an instruction after the first backward one whose outputs
     * only the backward reads (a held bf16 value widened for a backward
     * kernel reads nothing the gradient made) */
    int first = 0;
    while (first < p->n_instr && !bwd[first])
        first++;
    char *read = tainted, *fwd_read = calloc((size_t)p->n_bufs + 1, 1);
    memset(read, 0, (size_t)p->n_bufs + 1);
    if (!fwd_read) {
        free(bwd), free(read);
        return NULL;
    }
    for (int i = p->n_instr - 1; i > first; i--) {
        const regc_instr *in = &p->instr[i];
        int serves = !bwd[i], writes = 0, reads = 0;
        for (int k = 0; k < in->n_refs && serves; k++) {
            const int x = in->refs[k].buf;
            if (x >= 0 && regc_instr_writes(in, k))
                writes = 1, serves = read[x] && !fwd_read[x];
            else if (x >= 0)
                reads = 1;
        }
        bwd[i] |= serves && writes && reads;
        for (int k = 0; k < in->n_refs; k++) {
            const int x = in->refs[k].buf;
            if (x >= 0 && !regc_instr_writes(in, k))
                read[x] = 1, fwd_read[x] |= !bwd[i];
        }
    }
    free(read), free(fwd_read);
    return bwd;
}

static regc_instr copy_instr(regc_kernel kernel, int dst, int src, int64_t bytes, int signal)
{
    regc_instr c = {.kernel = (uint8_t)kernel, .n_refs = 2, .n_out = 1, .node = -1};
    c.refs[0] = (regc_ref){dst, 0};
    c.refs[1] = (regc_ref){src, 0};
    c.d[0] = bytes;
    c.signal = signal;
    return c;
}

static regc_instr wait_instr(const regc_instr *start)
{
    regc_instr w = *start;
    w.kernel = K_COMM_WAIT;
    w.d[1] = start->kernel;
    return w;
}

/* Whether an instruction makes an arena buffer of at least MIN_BYTES
 * other than b: room that b's leaving could serve. */
static int makes_room_user(const regc_program *p, const regc_instr *in, int b)
{
    for (int k = 0; k < in->n_refs; k++) {
        const int x = in->refs[k].buf;
        if (x >= 0 && x != b && regc_instr_writes(in, k) && p->bufs[x].kind == BUF_ARENA &&
            p->bufs[x].bytes >= MIN_BYTES)
            return 1;
    }
    return 0;
}

/* One buffer's forward last use, backward first use, and whether it
 * qualifies (header). */
static int qualifies(const regc_program *p, const char *bwd, int b, int *f, int *u)
{
    *f = -1, *u = -1;
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        for (int k = 0; k < in->n_refs; k++) {
            if (in->refs[k].buf != b)
                continue;
            if (regc_instr_writes(in, k) &&
                (in->kernel == K_ALLGATHER || in->kernel == K_COMM_WAIT))
                return 0; /* a unit's gathered parameters: ZeRO-3's schedule decides */
            if (!bwd[i]) {
                if (*u >= 0)
                    return 0; /* a forward use after a backward one */
                *f = i;
            } else {
                if (regc_instr_writes(in, k))
                    return 0; /* the backward writes it: not only a saved value */
                if (*u < 0)
                    *u = i;
            }
        }
    }
    if (*f < 0 || *u <= *f)
        return 0;
    for (int i = *f + 1; i < *u; i++)
        if (makes_room_user(p, &p->instr[i], b))
            return 1;
    return 0;
}

/* Of the buffers order[n_order] that qualify, those offloaded: the largest
 * first (a stable sort: the earlier of equals first), as many as the host's
 * room beside what it holds already (the first n_bufs buffers' BUF_HOST,
 * the offloaded optimizer's moments) takes, a smaller one where a larger
 * does not fit, and no more than p->offload_limit; their number. */
static int keep_largest(const regc_program *p, int *order, int n_order, int n_bufs)
{
    for (int i = 1; i < n_order; i++)
        for (int j = i; j > 0 && p->bufs[order[j]].bytes > p->bufs[order[j - 1]].bytes; j--) {
            const int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    if (p->host_budget_bytes > 0) {
        int64_t room = p->host_budget_bytes - (p->offload ? 2 * p->block_bytes : 0);
        for (int b = 0; b < n_bufs; b++)
            room -= p->bufs[b].kind == BUF_HOST ? p->bufs[b].bytes : 0;
        int kept = 0;
        for (int o = 0; o < n_order; o++)
            if (p->bufs[order[o]].bytes <= room)
                room -= p->bufs[order[o]].bytes, order[kept++] = order[o];
        n_order = kept;
    }
    if (p->offload_limit >= 0 && n_order > p->offload_limit)
        n_order = p->offload_limit;
    return n_order;
}

int regc_offload_activations(regc_program *p)
{
    if (!p->offload_activation || p->forward_only)
        return REGC_OK;
    const int n = p->n_instr;
    char *bwd = backward_of(p);
    double *cum = malloc(((size_t)n + 2) * sizeof *cum); /* FLOPs before instruction i */
    insertion *ins = NULL;
    int *order = malloc(((size_t)p->n_bufs + 1) * sizeof *order), n_order = 0;
    int n_ins = 0, cap = 0, rc = REGC_OK;
    if (!bwd || !cum || !order) {
        rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
        goto done;
    }
    cum[0] = 0.0;
    for (int i = 0; i < n; i++)
        cum[i + 1] = cum[i] + regc_instr_cost(&p->instr[i]);
    const int n_bufs = p->n_bufs; /* the buffers before this pass adds any */
    for (int b = 0; b < n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        int f, u;
        if (x->kind == BUF_ARENA && x->bytes >= MIN_BYTES && qualifies(p, bwd, b, &f, &u))
            order[n_order++] = b;
    }
    n_order = keep_largest(p, order, n_order, n_bufs);
    for (int o = 0; o < n_order && rc == REGC_OK; o++) {
        const int b = order[o];
        const regc_buf *x = &p->bufs[b];
        int f, u;
        qualifies(p, bwd, b, &f, &u);
        const double hide = p->copy_flop_per_byte * (double)x->bytes;
        int w = f + 1, s = u;
        while (w < u && cum[w] - cum[f + 1] < hide)
            w++;
        while (s > w && cum[u] - cum[s] < hide)
            s--;
        if (w >= s) /* too close to hide: the bytes leave all the same */
            w = f + 1, s = u;
        const int64_t bytes = x->bytes;
        const int host = regc_program_new_buf(p, BUF_HOST, bytes, 0);
        const int back = host < 0 ? host : regc_program_new_buf(p, BUF_ARENA, bytes, 0);
        if (back < 0) {
            rc = back;
            break;
        }
        if (n_ins + 4 > cap) {
            cap = cap ? 2 * cap : 64;
            insertion *grown = realloc(ins, (size_t)cap * sizeof *grown);
            if (!grown) {
                rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
                break;
            }
            ins = grown;
        }
        const regc_instr out = copy_instr(K_COPY_D2H, host, b, bytes, ++p->n_signals);
        const regc_instr in = copy_instr(K_COPY_H2D, back, host, bytes, ++p->n_signals);
        ins[n_ins++] = (insertion){f + 1, 0, out};
        ins[n_ins++] = (insertion){w, 1, wait_instr(&out)};
        ins[n_ins++] = (insertion){s, 2, in};
        ins[n_ins++] = (insertion){u, 3, wait_instr(&in)};
        /* the backward reads the copy brought back */
        for (int i = u; i < n; i++)
            for (int k = 0; k < p->instr[i].n_refs; k++)
                if (p->instr[i].refs[k].buf == b)
                    p->instr[i].refs[k].buf = back;
    }
    if (rc == REGC_OK && n_ins > 0) {
        qsort(ins, (size_t)n_ins, sizeof *ins, cmp_insertion);
        regc_instr *merged = malloc(((size_t)n + n_ins + 1) * sizeof *merged);
        if (!merged) {
            rc = regc_error(REGC_ERR_MEMORY, "step program: out of memory");
            goto done;
        }
        int m = 0, e = 0;
        for (int i = 0; i <= n; i++) {
            for (; e < n_ins && ins[e].pos == i; e++)
                merged[m++] = ins[e].in;
            if (i < n)
                merged[m++] = p->instr[i];
        }
        free(p->instr);
        p->instr = merged, p->n_instr = m;
    }
done:
    free(bwd), free(cum), free(ins), free(order);
    return rc;
}

/* ---------------------------------------------------------------- O0 */

typedef struct {
    int backward; /* the first lazy step of the backward */
    int *fwd_last, *bwd_first;
} lazy_uses;

static void note_use(regc_program *p, int b, int step, void *user)
{
    lazy_uses *w = user;
    if (b < 0 || b >= p->n_bufs)
        return;
    if (step < w->backward)
        w->fwd_last[b] = step;
    else if (w->bwd_first[b] < 0)
        w->bwd_first[b] = step;
}

int regc_offload_lazy(regc_program *p)
{
    for (int b = 0; b < p->n_bufs; b++)
        p->bufs[b].away = p->bufs[b].back = -1;
    if (!p->offload_activation || p->forward_only || !p->lazy || p->level != REGC_LEVEL_O0)
        return REGC_OK;
    const int n_bufs = p->n_bufs;
    lazy_uses w = {.backward = p->n_steps};
    w.fwd_last = malloc(((size_t)n_bufs + 1) * sizeof *w.fwd_last);
    w.bwd_first = malloc(((size_t)n_bufs + 1) * sizeof *w.bwd_first);
    char *gathered = calloc((size_t)n_bufs + 1, 1);
    int *made =
        calloc((size_t)p->n_steps + 2, sizeof *made); /* [step + 1] MIN_BYTES buffers so far */
    int *order = malloc(((size_t)n_bufs + 1) * sizeof *order), n_order = 0;
    if (!w.fwd_last || !w.bwd_first || !gathered || !made || !order) {
        free(w.fwd_last), free(w.bwd_first), free(gathered), free(made), free(order);
        return regc_error(REGC_ERR_MEMORY, "step program: out of memory");
    }
    for (int i = 0; i < p->n_steps && w.backward == p->n_steps; i++)
        if (p->steps[i].piece >= 0 && p->steps[i].backward)
            w.backward = i;
    for (int b = 0; b < n_bufs; b++)
        w.fwd_last[b] = w.bwd_first[b] = -1;
    regc_lazy_each_ref(p, note_use, &w);
    /* a unit's gathered parameters are the schedule's, not activations */
    for (int i = 0; i < p->n_steps; i++)
        if (p->steps[i].piece < 0 && p->steps[i].instr.kernel == K_ALLGATHER &&
            p->steps[i].instr.refs[0].buf >= 0)
            gathered[p->steps[i].instr.refs[0].buf] = 1;
    /* buffers of MIN_BYTES and more allocated (first used) at each step,
     * summed: what a buffer's leaving can make room for */
    for (int b = 0; b < n_bufs; b++)
        if (p->bufs[b].kind == BUF_ARENA && p->bufs[b].bytes >= MIN_BYTES &&
            p->bufs[b].first >= 0 && p->bufs[b].first < p->n_steps)
            made[p->bufs[b].first + 1]++;
    for (int i = 0; i < p->n_steps; i++)
        made[i + 1] += made[i];
    for (int b = 0; b < n_bufs; b++) {
        const regc_buf *x = &p->bufs[b];
        const int f = w.fwd_last[b], u = w.bwd_first[b];
        if (x->kind == BUF_ARENA && b != p->loss.buf && !gathered[b] && x->bytes >= MIN_BYTES &&
            f >= 0 && u > f + 1 && made[u] - made[f + 1] > 0)
            order[n_order++] = b;
    }
    n_order = keep_largest(p, order, n_order, n_bufs);
    for (int o = 0; o < n_order; o++)
        p->bufs[order[o]].away = w.fwd_last[order[o]],
        p->bufs[order[o]].back = w.bwd_first[order[o]];
    free(w.fwd_last), free(w.bwd_first), free(gathered), free(made), free(order);
    return REGC_OK;
}
