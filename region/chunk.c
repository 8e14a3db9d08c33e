/* chunk.c — compile.logits_chunk_rows on one lowered region, before
 * precision and recomputation: the language-model head and its
 * cross-entropy in chunks of rows, forward and backward, so that neither
 * the logits [rows, vocab] nor their gradient is ever held whole (Cut
 * Cross-Entropy's way: the backward computes each chunk's logits again).
 *
 * The pattern, as lowering leaves it:
 *   forward   L = H · W (+ b) (a GEMM with no accumulation, H not
 *             transposed, no epilogue but a bias); then elementwise steps
 *             over the whole [rows, vocab], if any (Gemma 2's soft-capping:
 *             S = cap·tanh(L/cap), unfused at O0, one fused chain at O1;
 *             a head's bias added as its own step at O0: Phi); loss, lse =
 *             cross_entropy(S, targets)
 *   backward  dS = cross_entropy_bwd(dloss, S, targets, lse); elementwise
 *             steps from dS and the forward's slots to dL, if any; then
 *             only GEMMs and row sums read dL: dH = dL · W (rows split),
 *             dW (+)= dLᵀ · H (the sum over rows split, each chunk after
 *             the first accumulating) and a head bias's db = Σ rows of dL
 *             (each chunk's sum after the first added to it)
 * and nothing else touches L, S, dS, dL or the steps' other slots. An
 * elementwise step does the same arithmetic on each element, so on a
 * chunk of rows it gives those rows' bits. It becomes:
 *   forward   per chunk: Lc = Hc · W and the steps on it; lse, picked =
 *             cross_entropy_rows(Sc); then loss = cross_entropy_loss(lse,
 *             picked) over every row
 *   backward  per chunk: Lc = Hc · W and the forward's steps again; dSc =
 *             cross_entropy_bwd of the chunk's rows (its factor counted
 *             over every row); the backward's steps; each GEMM that read
 *             dL on the chunk
 * with one chunk of each slot as temporaries. The
 * loss and lse keep their bits (the per-row log-sum-exp and the serial
 * mean are the same arithmetic); dW and db sum their rows chunk by chunk,
 * so they differ in the last bits. The chunks' GEMMs and steps of the backward's
 * forward are recomputation (regc_instr.replay), counted as such by plans.
 * The head's input H is read by the backward's chunks: it is kept for the
 * backward (saved) even where no weight gradient reads it (a frozen head).
 * Under held bf16 activations the elementwise steps stay whole (see
 * regc_region_chunk_logits' held). A region without the pattern is left
 * as it is. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

#define F32 ((int64_t)sizeof(float))
#define MAX_CHAIN 8                   /* elementwise steps on either side of the loss */
#define MAX_SLOTS (2 * MAX_CHAIN + 4) /* the pattern's [rows, vocab] slots */

typedef struct {
    regc_compiled_region *r;
    int gemm, ce;                    /* forward: the head's GEMM and the loss */
    int fchain[MAX_CHAIN], n_fchain; /* forward: the steps from L to the loss's input */
    int ce_bwd;                      /* backward: the loss's gradient */
    int bchain[MAX_CHAIN], n_bchain; /* backward: the steps from it to dL */
    int readers[8];                  /* backward: the GEMMs and row sums that read dL */
    int n_readers;
    int bias_sum;                 /* a row sum (a head bias's db) reads dL */
    int logits, ce_in;            /* slots: L, and what the loss reads (L, or the chain's last) */
    int dlogits, dfinal;          /* slots: the loss's gradient, and dL (what the GEMMs read) */
    int slot[MAX_SLOTS], n_slots; /* every [rows, vocab] slot of the pattern */
    char grad[MAX_SLOTS];         /* ... written in the backward */
    int64_t rows, vocab;
} head;

static int refs_slot(const regc_instr *in, int s, int writes)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == s && regc_instr_writes(in, k) == writes)
            return 1;
    return 0;
}

static int touches(const regc_instr *in, int s)
{
    return refs_slot(in, s, 0) || refs_slot(in, s, 1);
}

/* The pattern slot s's index, or -1. */
static int slot_index(const head *h, int s)
{
    for (int j = 0; j < h->n_slots; j++)
        if (h->slot[j] == s)
            return j;
    return -1;
}

static int add_slot(head *h, int s, int grad)
{
    if (slot_index(h, s) >= 0)
        return 1;
    if (h->n_slots == MAX_SLOTS)
        return 0;
    h->grad[h->n_slots] = (char)grad;
    h->slot[h->n_slots++] = s;
    return 1;
}

/* Does instruction `in` touch a slot of the pattern? */
static int touches_pattern(const head *h, const regc_instr *in)
{
    for (int k = 0; k < in->n_refs; k++)
        if (slot_index(h, in->refs[k].buf) >= 0)
            return 1;
    return 0;
}

static int in_list(const int *v, int n, int i)
{
    for (int k = 0; k < n; k++)
        if (v[k] == i)
            return 1;
    return 0;
}

/* Is instruction i of the forward (fwd) or backward one of the pattern's? */
static int of_pattern(const head *h, int fwd, int i)
{
    return fwd ? i == h->gemm || i == h->ce || in_list(h->fchain, h->n_fchain, i)
               : i == h->ce_bwd || in_list(h->bchain, h->n_bchain, i) ||
                     in_list(h->readers, h->n_readers, i);
}

/* Does any instruction of ins[lo, hi) outside the pattern write a slot
 * that `in` reads, or touch one `in` writes? (Then `in` cannot move
 * across them to where the chunks run.) */
static int crosses(const head *h, int fwd, const regc_instr *ins, int lo, int hi,
                   const regc_instr *in)
{
    for (int i = lo; i < hi; i++) {
        if (of_pattern(h, fwd, i))
            continue;
        for (int k = 0; k < in->n_refs; k++) {
            const int s = in->refs[k].buf;
            if (s >= 0 &&
                (regc_instr_writes(in, k) ? touches(&ins[i], s) : refs_slot(&ins[i], s, 1)))
                return 1;
        }
    }
    return 0;
}

/* An elementwise step over the whole [rows, vocab] (a unary, a binary or a
 * fused chain, every operand a whole slot): rows apart, it is the same
 * arithmetic on each element, so it runs a chunk at a time. */
static int rowwise(const head *h, const regc_instr *in)
{
    if ((in->kernel != K_UNARY && in->kernel != K_BINARY && in->kernel != K_EW) ||
        in->d[0] != h->rows * h->vocab)
        return 0;
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf < 0 || in->refs[k].off != 0)
            return 0;
    return 1;
}

/* The operands of a step that are the pattern's: all of them, but a head
 * bias's b (K_BIAS_ADD's third), which stays whole. */
static int step_refs(const regc_instr *in) { return in->kernel == K_BIAS_ADD ? 2 : in->n_refs; }

/* A head bias's own step (O0): out = x + b over the whole [rows, vocab],
 * b [vocab] no slot of the pattern. */
static int bias_step(const head *h, const regc_instr *in)
{
    return in->kernel == K_BIAS_ADD && in->d[0] == h->rows && in->d[1] == h->vocab &&
           in->refs[0].buf >= 0 && in->refs[0].off == 0 && in->refs[1].buf >= 0 &&
           in->refs[1].off == 0 && slot_index(h, in->refs[2].buf) < 0;
}

/* The forward's part: from the loss back through elementwise steps (Gemma
 * 2's soft-capping of the logits) to the head's GEMM; each step's inputs
 * join the pattern, and its outputs are the pattern's alone. */
static int find_forward(head *h)
{
    regc_compiled_region *r = h->r;
    if (!add_slot(h, h->ce_in, 0))
        return 0;
    for (int i = h->ce - 1; i >= 0; i--) {
        const regc_instr *in = &r->fwd[i];
        int writes = 0;
        for (int k = 0; k < in->n_out; k++)
            writes |= slot_index(h, in->refs[k].buf) >= 0;
        if (!writes)
            continue;
        if (in->kernel == K_GEMM) {
            if (h->gemm >= 0 || in->n_out != 1)
                return 0;
            h->gemm = i, h->logits = in->refs[0].buf;
            continue;
        }
        const int bias = bias_step(h, in);
        if ((!bias && !rowwise(h, in)) || h->n_fchain == MAX_CHAIN)
            return 0;
        for (int k = 0; k < step_refs(in); k++)
            if (!add_slot(h, in->refs[k].buf, 0))
                return 0;
        h->fchain[h->n_fchain++] = i;
    }
    if (h->gemm < 0)
        return 0;
    /* program order */
    for (int a = 0, b = h->n_fchain - 1; a < b; a++, b--) {
        const int t = h->fchain[a];
        h->fchain[a] = h->fchain[b], h->fchain[b] = t;
    }
    /* every slot is L or a step's output, written once; nothing else of
     * the forward touches one */
    for (int i = 0; i < r->n_fwd; i++) {
        const regc_instr *in = &r->fwd[i];
        if (!of_pattern(h, 1, i) && touches_pattern(h, in))
            return 0;
    }
    for (int j = 0; j < h->n_slots; j++) {
        int writers = 0;
        for (int i = 0; i < r->n_fwd; i++)
            writers += refs_slot(&r->fwd[i], h->slot[j], 1);
        if (writers != 1)
            return 0;
    }
    const regc_instr *g = &r->fwd[h->gemm];
    if ((g->epilogue != REGC_EPI_NONE && g->epilogue != REGC_EPI_BIAS) || g->accumulate ||
        g->trans_a || g->refs[0].off != 0 || slot_index(h, g->refs[3].buf) >= 0 ||
        g->d[0] != h->rows || g->d[1] != h->vocab || crosses(h, 1, r->fwd, h->gemm + 1, h->ce, g))
        return 0;
    for (int k = 0; k < h->n_fchain; k++)
        if (crosses(h, 1, r->fwd, h->fchain[k] + 1, h->ce, &r->fwd[h->fchain[k]]))
            return 0;
    return 1;
}

/* The backward's part: the loss's gradient, elementwise steps from it (and
 * from the forward's slots) to dL, and the GEMMs that read dL as their A;
 * nothing else touches a slot of the pattern. */
static int find_backward(head *h)
{
    regc_compiled_region *r = h->r;
    for (int i = 0; i < r->n_bwd; i++) {
        const regc_instr *in = &r->bwd[i];
        if (!touches_pattern(h, in))
            continue;
        if (in->kernel == K_CE_BWD && h->ce_bwd < 0 && in->refs[2].buf == h->ce_in &&
            in->refs[0].off == 0 && in->d[2] == 0 && in->d[3] == h->rows &&
            slot_index(h, in->refs[0].buf) < 0) {
            h->ce_bwd = i, h->dlogits = h->dfinal = in->refs[0].buf;
            if (!add_slot(h, h->dlogits, 1))
                return 0;
            continue;
        }
        if (h->ce_bwd < 0)
            return 0;
        if (in->kernel == K_SUM_ROWS) { /* db: dL's rows summed, whole */
            const int s = in->refs[1].buf, j = slot_index(h, s);
            if (j < 0 || !h->grad[j] || (h->n_readers > 0 && s != h->dfinal) ||
                in->refs[1].off != 0 || slot_index(h, in->refs[0].buf) >= 0 ||
                in->d[0] != h->rows || in->d[1] != h->vocab || h->bias_sum ||
                h->n_readers == (int)(sizeof h->readers / sizeof *h->readers))
                return 0;
            h->dfinal = s, h->bias_sum = 1;
            h->readers[h->n_readers++] = i;
            continue;
        }
        if (in->kernel == K_GEMM) {
            /* dL whole as A, rows split or summed over */
            const int s = in->refs[1].buf, j = slot_index(h, s);
            const int ok = j >= 0 && h->grad[j] && (h->n_readers == 0 || s == h->dfinal) &&
                           in->epilogue == REGC_EPI_NONE && in->refs[1].off == 0 &&
                           !refs_slot(in, s, 1) && slot_index(h, in->refs[2].buf) < 0 &&
                           slot_index(h, in->refs[0].buf) < 0 && !in->trans_b &&
                           (in->trans_a ? in->d[2] : in->d[0]) == h->rows &&
                           h->n_readers < (int)(sizeof h->readers / sizeof *h->readers);
            if (!ok)
                return 0;
            h->dfinal = s;
            h->readers[h->n_readers++] = i;
            continue;
        }
        /* a step toward dL: its inputs the pattern's, its outputs new */
        if (!rowwise(h, in) || h->n_bchain == MAX_CHAIN || h->n_readers > 0)
            return 0;
        for (int k = 0; k < in->n_refs; k++) {
            const int known = slot_index(h, in->refs[k].buf) >= 0;
            if (known == (k < in->n_out) || (k < in->n_out && !add_slot(h, in->refs[k].buf, 1)))
                return 0;
        }
        h->bchain[h->n_bchain++] = i;
    }
    if (h->ce_bwd < 0) /* no backward (forward only): the forward alone is chunked */
        return h->n_bchain == 0;
    for (int i = 0; i < r->n_fwd; i++)
        for (int j = 0; j < h->n_slots; j++)
            if (h->grad[j] && touches(&r->fwd[i], h->slot[j]))
                return 0;
    for (int k = 0; k < h->n_bchain; k++)
        if (crosses(h, 0, r->bwd, h->ce_bwd + 1, h->bchain[k], &r->bwd[h->bchain[k]]))
            return 0;
    for (int k = 0; k < h->n_readers; k++)
        if (crosses(h, 0, r->bwd, h->ce_bwd + 1, h->readers[k], &r->bwd[h->readers[k]]))
            return 0;
    return h->n_readers > 0;
}

/* The pattern in r, or 0. */
static int find_head(regc_compiled_region *r, head *h)
{
    memset(h, 0, sizeof *h);
    h->r = r, h->gemm = h->ce = h->ce_bwd = -1;
    for (int i = 0; i < r->n_fwd && h->ce < 0; i++)
        if (r->fwd[i].kernel == K_CE_FWD)
            h->ce = i;
    if (h->ce < 0 || r->fwd[h->ce].refs[2].off != 0)
        return 0;
    const regc_instr *ce = &r->fwd[h->ce];
    h->ce_in = ce->refs[2].buf, h->rows = ce->d[0], h->vocab = ce->d[1];
    if (!find_forward(h) || !find_backward(h))
        return 0;
    /* the slots become the chunks' temporaries: none may be a value the
     * region hands on (an output, a gradient of an input) */
    for (int j = 0; j < h->n_slots; j++)
        if (r->slots[h->slot[j]].kind != SLOT_TEMP && r->slots[h->slot[j]].kind != SLOT_SAVED)
            return 0;
    return 1;
}

/* An instruction list grown one at a time. */
typedef struct {
    regc_instr *v;
    int n, cap;
} list;

static int put(list *l, const regc_instr *in)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        regc_instr *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = *in;
    return REGC_OK;
}

/* The head's GEMM on rows [r0, r0 + n) into slot out. */
static regc_instr gemm_rows(const regc_instr *g, int out, int64_t r0, int64_t n)
{
    regc_instr x = *g;
    x.refs[0] = (regc_ref){out, 0};
    x.refs[1].off += r0 * g->d[3] * F32; /* lda: H's columns */
    x.d[0] = n;
    return x;
}

/* An elementwise step on a chunk of n rows: each pattern slot its chunk's
 * temporary (at[j] for slot j). */
static regc_instr step_rows(const head *h, const regc_instr *in, const int *at, int64_t n)
{
    regc_instr x = *in;
    for (int k = 0; k < step_refs(in); k++)
        x.refs[k] = (regc_ref){at[slot_index(h, in->refs[k].buf)], 0};
    x.d[0] = in->kernel == K_BIAS_ADD ? n : n * h->vocab; /* rows, or elements */
    return x;
}

/* The forward's chunk of rows [r0, r0 + n): the head's GEMM, then the
 * elementwise steps, each into its slot's temporary (at); replayed in the
 * backward (computed again). */
static int chunk_forward(const head *h, const int *at, int64_t r0, int64_t n, int replay, list *out)
{
    const regc_compiled_region *r = h->r;
    regc_instr x = gemm_rows(&r->fwd[h->gemm], at[slot_index(h, h->logits)], r0, n);
    x.replay = (uint8_t)replay;
    int rc = put(out, &x);
    for (int k = 0; k < h->n_fchain && rc == REGC_OK; k++) {
        x = step_rows(h, &r->fwd[h->fchain[k]], at, n);
        x.replay = (uint8_t)replay;
        rc = put(out, &x);
    }
    return rc;
}

static int emit_forward(const head *h, int64_t chunk, const int *at, int picked, list *out)
{
    const regc_compiled_region *r = h->r;
    const regc_instr *ce = &r->fwd[h->ce];
    int rc = REGC_OK;
    for (int i = 0; i < r->n_fwd && rc == REGC_OK; i++) {
        if (i == h->gemm || in_list(h->fchain, h->n_fchain, i))
            continue;
        if (i != h->ce) {
            rc = put(out, &r->fwd[i]);
            continue;
        }
        for (int64_t r0 = 0; r0 < h->rows && rc == REGC_OK; r0 += chunk) {
            const int64_t n = h->rows - r0 < chunk ? h->rows - r0 : chunk;
            if ((rc = chunk_forward(h, at, r0, n, 0, out)))
                break;
            regc_instr rows = *ce; /* lse, picked, logits, targets */
            rows.kernel = K_CE_ROWS, rows.n_out = 2, rows.n_refs = 4;
            rows.refs[0] = (regc_ref){ce->refs[1].buf, ce->refs[1].off + r0 * F32};
            rows.refs[1] = (regc_ref){picked, r0 * F32};
            rows.refs[2] = (regc_ref){at[slot_index(h, h->ce_in)], 0};
            rows.refs[3] = (regc_ref){ce->refs[3].buf, ce->refs[3].off + r0 * F32};
            rows.d[0] = n, rows.d[1] = h->vocab;
            rc = put(out, &rows);
        }
        regc_instr loss = *ce; /* loss, lse, picked, targets */
        loss.kernel = K_CE_LOSS, loss.n_out = 1, loss.n_refs = 4;
        loss.refs[1] = ce->refs[1];
        loss.refs[2] = (regc_ref){picked, 0};
        loss.refs[3] = ce->refs[3];
        loss.d[0] = h->rows, loss.d[1] = h->vocab;
        if (rc == REGC_OK)
            rc = put(out, &loss);
    }
    return rc;
}

/* db's part of the chunk of n rows from r0: the first chunk's row sum
 * straight into db (the reader m's output), each later one's into the
 * temporary part and then added to db. */
static int bias_rows(const regc_instr *m, int dl, int part, int64_t r0, int64_t n, list *out)
{
    regc_instr x = *m;
    x.refs[1] = (regc_ref){dl, 0};
    x.d[0] = n;
    if (r0 == 0)
        return put(out, &x);
    x.refs[0] = (regc_ref){part, 0};
    int rc = put(out, &x);
    regc_instr add = *m; /* db = db + part */
    add.kernel = K_ADD, add.n_out = 1, add.n_refs = 3;
    add.refs[1] = m->refs[0], add.refs[2] = (regc_ref){part, 0};
    add.d[0] = m->d[1], add.d[1] = 0;
    return rc ? rc : put(out, &add);
}

static int emit_backward(const head *h, int64_t chunk, const int *at, int part, list *out)
{
    const regc_compiled_region *r = h->r;
    const regc_instr *cb = &r->bwd[h->ce_bwd];
    int rc = REGC_OK;
    for (int i = 0; i < r->n_bwd && rc == REGC_OK; i++) {
        if (in_list(h->readers, h->n_readers, i) || in_list(h->bchain, h->n_bchain, i))
            continue;
        if (i != h->ce_bwd) {
            rc = put(out, &r->bwd[i]);
            continue;
        }
        for (int64_t r0 = 0; r0 < h->rows && rc == REGC_OK; r0 += chunk) {
            const int64_t n = h->rows - r0 < chunk ? h->rows - r0 : chunk;
            /* the chunk's logits computed again */
            if ((rc = chunk_forward(h, at, r0, n, 1, out)))
                break;
            regc_instr d = *cb; /* dlogits, dloss, logits, targets (all), lse */
            d.refs[0] = (regc_ref){at[slot_index(h, h->dlogits)], 0};
            d.refs[2] = (regc_ref){at[slot_index(h, h->ce_in)], 0};
            d.refs[4].off += r0 * F32;
            d.d[0] = n, d.d[2] = r0, d.d[3] = h->rows;
            if ((rc = put(out, &d)))
                break;
            for (int k = 0; k < h->n_bchain && rc == REGC_OK; k++) {
                regc_instr x = step_rows(h, &r->bwd[h->bchain[k]], at, n);
                rc = put(out, &x);
            }
            for (int k = 0; k < h->n_readers && rc == REGC_OK; k++) {
                regc_instr m = r->bwd[h->readers[k]];
                if (m.kernel == K_SUM_ROWS) {
                    rc = bias_rows(&m, at[slot_index(h, h->dfinal)], part, r0, n, out);
                    continue;
                }
                m.refs[1] = (regc_ref){at[slot_index(h, h->dfinal)], 0};
                if (!m.trans_a) { /* its rows: C's rows */
                    m.refs[0].off += r0 * m.d[1] * F32;
                    m.d[0] = n;
                } else { /* the sum over rows, chunk by chunk: B's rows */
                    m.refs[2].off += r0 * m.d[4] * F32;
                    m.d[2] = n;
                    m.accumulate = r0 > 0 ? 1 : m.accumulate;
                }
                rc = put(out, &m);
            }
        }
    }
    return rc;
}

int regc_region_chunk_logits(regc_compiled_region *r, int64_t chunk_rows, int held)
{
    head h;
    if (chunk_rows <= 0 || !find_head(r, &h) || chunk_rows >= h.rows ||
        (held && h.n_fchain + h.n_bchain > 0))
        return REGC_OK;
    /* each slot of the pattern a chunk's temporary, the forward's apart
     * from the backward's (whose are computed again) */
    const int64_t chunk_bytes = chunk_rows * h.vocab * F32;
    int fwd_at[MAX_SLOTS], bwd_at[MAX_SLOTS];
    for (int j = 0; j < h.n_slots; j++) {
        fwd_at[j] = bwd_at[j] = -1;
        if (!h.grad[j] && (fwd_at[j] = regc_region_add_temp(r, h.slot[j], chunk_bytes)) < 0)
            return fwd_at[j];
        if (h.ce_bwd >= 0 && (bwd_at[j] = regc_region_add_temp(r, h.slot[j], chunk_bytes)) < 0)
            return bwd_at[j];
    }
    const int picked = regc_region_add_temp(r, h.logits, h.rows * F32);
    if (picked < 0)
        return picked;
    const int part = h.bias_sum ? regc_region_add_temp(r, h.logits, h.vocab * F32) : -1;
    if (h.bias_sum && part < 0)
        return part;
    const int hin = r->fwd[h.gemm].refs[1].buf; /* H, the head's input */
    list f = {0}, b = {0};
    int rc = emit_forward(&h, chunk_rows, fwd_at, picked, &f);
    if (rc == REGC_OK && h.ce_bwd >= 0)
        rc = emit_backward(&h, chunk_rows, bwd_at, part, &b);
    if (rc == REGC_OK && h.ce_bwd < 0)
        for (int i = 0; i < r->n_bwd && rc == REGC_OK; i++)
            rc = put(&b, &r->bwd[i]);
    if (rc == REGC_OK && !b.v && !(b.v = malloc(sizeof *b.v))) /* an empty backward's list */
        rc = regc_error(REGC_ERR_MEMORY, "region compile: out of memory");
    if (rc) {
        free(f.v), free(b.v);
        return rc;
    }
    free(r->fwd), free(r->bwd);
    r->fwd = f.v, r->n_fwd = f.n;
    r->bwd = b.v, r->n_bwd = b.n;
    /* the whole logits, the steps' outputs and the gradients are no one's
     * now; the head's input H is read by the backward's chunks, so it is
     * kept for it (a frozen head has no weight gradient that would) */
    for (int j = 0; j < h.n_slots; j++)
        r->slots[h.slot[j]].kind = SLOT_TEMP;
    if (h.ce_bwd >= 0 && r->slots[hin].kind == SLOT_TEMP)
        r->slots[hin].kind = SLOT_SAVED;
    return REGC_OK;
}
