/* chunk.c — compile.logits_chunk_rows on one lowered region, before
 * precision and recomputation: the language-model head and its
 * cross-entropy in chunks of rows, forward and backward, so that neither
 * the logits [rows, vocab] nor their gradient is ever held whole (Cut
 * Cross-Entropy's way: the backward computes each chunk's logits again).
 *
 * The pattern, as lowering leaves it:
 *   forward   L = H · W (a plain GEMM: no bias, no accumulation, H not
 *             transposed); loss, lse = cross_entropy(L, targets)
 *   backward  dL = cross_entropy_bwd(dloss, L, targets, lse); then only
 *             GEMMs read dL as their A: dH = dL · W (rows split) and
 *             dW (+)= dLᵀ · H (the sum over rows split, each chunk after
 *             the first accumulating)
 * and nothing else reads L or dL. It becomes:
 *   forward   per chunk: Lc = Hc · W; lse, picked = cross_entropy_rows(Lc);
 *             then loss = cross_entropy_loss(lse, picked) over every row
 *   backward  per chunk: Lc = Hc · W again; dLc = cross_entropy_bwd of the
 *             chunk's rows (its factor counted over every row); each GEMM
 *             that read dL on the chunk
 * with one chunk's logits and one chunk's gradient as temporaries. The
 * loss and lse keep their bits (the per-row log-sum-exp and the serial
 * mean are the same arithmetic); dW sums its rows chunk by chunk, so it
 * differs in the last bits. The chunks' GEMMs of the backward are
 * recomputation (regc_instr.replay), counted as such by plans. A region
 * without the pattern is left as it is. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

#define F32 ((int64_t)sizeof(float))

typedef struct {
    regc_compiled_region *r;
    int gemm, ce;   /* forward: the head's GEMM and the loss */
    int ce_bwd;     /* backward: the loss's gradient */
    int readers[8]; /* backward: the GEMMs that read dL */
    int n_readers;
    int logits, dlogits; /* slots */
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

/* Does any instruction of ins[lo, hi) write a slot that `in` reads, or
 * touch one `in` writes? (Then `in` cannot move across them.) */
static int crosses(const regc_instr *ins, int lo, int hi, const regc_instr *in)
{
    for (int i = lo; i < hi; i++)
        for (int k = 0; k < in->n_refs; k++) {
            const int s = in->refs[k].buf;
            if (s >= 0 &&
                (regc_instr_writes(in, k) ? touches(&ins[i], s) : refs_slot(&ins[i], s, 1)))
                return 1;
        }
    return 0;
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
    h->logits = ce->refs[2].buf, h->rows = ce->d[0], h->vocab = ce->d[1];
    /* the logits: one writer, a plain GEMM before the loss; read by the
     * loss and its gradient only */
    for (int i = 0; i < r->n_fwd; i++) {
        const regc_instr *in = &r->fwd[i];
        if (refs_slot(in, h->logits, 1)) {
            if (h->gemm >= 0 || i > h->ce)
                return 0;
            h->gemm = i;
        } else if (i != h->ce && refs_slot(in, h->logits, 0)) {
            return 0;
        }
    }
    if (h->gemm < 0)
        return 0;
    const regc_instr *g = &r->fwd[h->gemm];
    if (g->kernel != K_GEMM || g->epilogue != REGC_EPI_NONE || g->accumulate || g->trans_a ||
        g->refs[0].off != 0 || g->d[0] != h->rows || g->d[1] != h->vocab ||
        crosses(r->fwd, h->gemm + 1, h->ce, g))
        return 0;
    for (int i = 0; i < r->n_bwd; i++) {
        const regc_instr *in = &r->bwd[i];
        if (!touches(in, h->logits))
            continue;
        if (in->kernel != K_CE_BWD || h->ce_bwd >= 0 || in->refs[2].buf != h->logits ||
            refs_slot(in, h->logits, 1))
            return 0;
        h->ce_bwd = i;
    }
    if (h->ce_bwd < 0) /* no backward (forward only): the forward alone is chunked */
        return 1;
    const regc_instr *cb = &r->bwd[h->ce_bwd];
    h->dlogits = cb->refs[0].buf;
    if (cb->refs[0].off != 0 || cb->d[2] != 0 || cb->d[3] != h->rows)
        return 0;
    for (int i = 0; i < r->n_fwd; i++)
        if (touches(&r->fwd[i], h->dlogits))
            return 0;
    for (int i = 0; i < r->n_bwd; i++) {
        const regc_instr *in = &r->bwd[i];
        if (i == h->ce_bwd || !touches(in, h->dlogits))
            continue;
        /* a GEMM reading dL whole as A, rows split or summed over */
        const int ok = in->kernel == K_GEMM && i > h->ce_bwd && in->epilogue == REGC_EPI_NONE &&
                       in->refs[1].buf == h->dlogits && in->refs[1].off == 0 &&
                       !refs_slot(in, h->dlogits, 1) && in->refs[2].buf != h->dlogits &&
                       !in->trans_b && (in->trans_a ? in->d[2] : in->d[0]) == h->rows &&
                       h->n_readers < (int)(sizeof h->readers / sizeof *h->readers) &&
                       !crosses(r->bwd, h->ce_bwd + 1, i, in);
        if (!ok)
            return 0;
        h->readers[h->n_readers++] = i;
    }
    return h->n_readers > 0;
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

static int emit_forward(const head *h, int64_t chunk, int lc, int picked, list *out)
{
    const regc_compiled_region *r = h->r;
    const regc_instr *g = &r->fwd[h->gemm], *ce = &r->fwd[h->ce];
    int rc = REGC_OK;
    for (int i = 0; i < r->n_fwd && rc == REGC_OK; i++) {
        if (i == h->gemm)
            continue;
        if (i != h->ce) {
            rc = put(out, &r->fwd[i]);
            continue;
        }
        for (int64_t r0 = 0; r0 < h->rows && rc == REGC_OK; r0 += chunk) {
            const int64_t n = h->rows - r0 < chunk ? h->rows - r0 : chunk;
            regc_instr x = gemm_rows(g, lc, r0, n);
            if ((rc = put(out, &x)))
                break;
            regc_instr rows = *ce; /* lse, picked, logits, targets */
            rows.kernel = K_CE_ROWS, rows.n_out = 2, rows.n_refs = 4;
            rows.refs[0] = (regc_ref){ce->refs[1].buf, ce->refs[1].off + r0 * F32};
            rows.refs[1] = (regc_ref){picked, r0 * F32};
            rows.refs[2] = (regc_ref){lc, 0};
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

static int emit_backward(const head *h, int64_t chunk, int lc, int dlc, list *out)
{
    const regc_compiled_region *r = h->r;
    const regc_instr *g = &r->fwd[h->gemm], *cb = &r->bwd[h->ce_bwd];
    int rc = REGC_OK;
    for (int i = 0; i < r->n_bwd && rc == REGC_OK; i++) {
        int moved = 0;
        for (int k = 0; k < h->n_readers; k++)
            moved |= h->readers[k] == i;
        if (moved)
            continue;
        if (i != h->ce_bwd) {
            rc = put(out, &r->bwd[i]);
            continue;
        }
        for (int64_t r0 = 0; r0 < h->rows && rc == REGC_OK; r0 += chunk) {
            const int64_t n = h->rows - r0 < chunk ? h->rows - r0 : chunk;
            regc_instr x = gemm_rows(g, lc, r0, n);
            x.replay = 1; /* the chunk's logits computed again */
            if ((rc = put(out, &x)))
                break;
            regc_instr d = *cb; /* dlogits, dloss, logits, targets (all), lse */
            d.refs[0] = (regc_ref){dlc, 0};
            d.refs[2] = (regc_ref){lc, 0};
            d.refs[4].off += r0 * F32;
            d.d[0] = n, d.d[2] = r0, d.d[3] = h->rows;
            if ((rc = put(out, &d)))
                break;
            for (int k = 0; k < h->n_readers && rc == REGC_OK; k++) {
                regc_instr m = r->bwd[h->readers[k]];
                m.refs[1] = (regc_ref){dlc, 0};
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

int regc_region_chunk_logits(regc_compiled_region *r, int64_t chunk_rows)
{
    head h;
    if (chunk_rows <= 0 || !find_head(r, &h) || chunk_rows >= h.rows)
        return REGC_OK;
    const int64_t chunk_bytes = chunk_rows * h.vocab * F32;
    int lc = regc_region_add_temp(r, h.logits, chunk_bytes);
    int lcb = lc >= 0 ? regc_region_add_temp(r, h.logits, chunk_bytes) : lc;
    int picked = lcb >= 0 ? regc_region_add_temp(r, h.logits, h.rows * F32) : lcb;
    int dlc =
        picked >= 0 && h.ce_bwd >= 0 ? regc_region_add_temp(r, h.dlogits, chunk_bytes) : picked;
    if (dlc < 0)
        return dlc;
    list f = {0}, b = {0};
    int rc = emit_forward(&h, chunk_rows, lc, picked, &f);
    if (rc == REGC_OK && h.ce_bwd >= 0)
        rc = emit_backward(&h, chunk_rows, lcb, dlc, &b);
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
    /* the whole logits and their gradient are no one's now */
    r->slots[h.logits].kind = SLOT_TEMP;
    if (h.ce_bwd >= 0)
        r->slots[h.dlogits].kind = SLOT_TEMP;
    return REGC_OK;
}
