/* fuse_instr.c — fusions over a flat list of instructions, after inline
 * back has stamped every layer into one step (inline_back.c): what only
 * the whole step shows, across the boundaries of regions.
 *  - add + norm: an add followed at once by a norm of its sum is one kernel
 *    that writes the sum and normalises it (the residual stream entering
 *    the next layer, which a region alone never sees);
 *  - embedding backward + add: an embedding backward whose fresh table
 *    only feeds an add into the gradient it sums with accumulates into that
 *    gradient in place (a tied embedding's two contributions meet in the
 *    gradient block), and the add goes.
 * Like the passes of lower.c, each fused kernel computes the same float
 * operations as the pair it replaces: fusion never changes bits. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

/* ---------------------------------------------------------------- add + norm */

static int same_ref(regc_ref a, regc_ref b) { return a.buf == b.buf && a.off == b.off; }

int regc_fuse_add_norm(regc_instr *ins, int *n)
{
    int w = 0, fused = 0;
    for (int i = 0; i < *n; i++) {
        regc_instr *a = &ins[i];
        if (i + 1 < *n && a->kernel == K_ADD) {
            regc_instr *nm = &ins[i + 1];
            int is_ln = nm->kernel == K_LN_FWD, is_rms = nm->kernel == K_RMS_FWD;
            /* the norm reads the sum as x, and the sum is not also its weight */
            if ((is_ln || is_rms) && same_ref(nm->refs[is_ln ? 3 : 2], a->refs[0]) &&
                nm->d[0] * nm->d[1] == a->d[0]) {
                regc_instr f = *nm;
                f.kernel = is_ln ? K_ADD_LN_FWD : K_ADD_RMS_FWD;
                f.n_out = (uint8_t)(is_ln ? 4 : 3);
                /* sum, y, [mean,] rstd, a, b, w[, bias] */
                f.refs[0] = a->refs[0];
                int no = is_ln ? 3 : 2;
                for (int k = 0; k < no; k++)
                    f.refs[1 + k] = nm->refs[k];
                f.refs[1 + no] = a->refs[1], f.refs[2 + no] = a->refs[2];
                f.refs[3 + no] = nm->refs[no + 1];
                if (is_ln)
                    f.refs[4 + no] = nm->refs[no + 2];
                f.n_refs = (uint8_t)(is_ln ? 8 : 6);
                f.bf16_refs = (uint16_t)(regc_instr_ref_bf16(nm, 0) << 1); /* y: 0 -> 1 */
                ins[w++] = f;
                i++;
                fused++;
                continue;
            }
        }
        ins[w++] = *a;
    }
    *n = w;
    return fused;
}

/* ---------------------------------------------------------------- embedding backward + add */

static int refs_buffer(const regc_instr *in, int buf)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == buf)
            return 1;
    return 0;
}

static int writes_buffer(const regc_instr *in, int buf)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == buf && regc_instr_writes(in, k))
            return 1;
    return 0;
}

/* The add after embedding backward e that sums its table into the add's
 * own output (out = out + table): its index, or -1 when e cannot
 * accumulate there instead. The table must be an arena buffer of its own
 * that nothing else reads, and e's inputs must be unchanged up to the add,
 * where the accumulation moves: every other write of out stays on its side
 * of it. */
static int embed_bwd_add_at(const regc_instr *ins, int n, int e, const regc_buf *bufs)
{
    const regc_instr *eb = &ins[e];
    regc_ref table = eb->refs[0];
    if (eb->accumulate || table.buf < 0 || table.off || bufs[table.buf].kind != BUF_ARENA ||
        bufs[table.buf].bytes != eb->d[1] * eb->d[2] * (int64_t)sizeof(float))
        return -1;
    int j = e + 1;
    for (; j < n && !refs_buffer(&ins[j], table.buf); j++)
        if (writes_buffer(&ins[j], eb->refs[1].buf) || writes_buffer(&ins[j], eb->refs[2].buf))
            return -1;
    if (j == n)
        return -1;
    const regc_instr *a = &ins[j];
    if (a->kernel != K_ADD || a->d[0] != eb->d[1] * eb->d[2])
        return -1;
    int side = same_ref(a->refs[1], table) ? 1 : same_ref(a->refs[2], table) ? 2 : 0;
    if (!side || !same_ref(a->refs[3 - side], a->refs[0]) || a->refs[0].buf == table.buf)
        return -1;
    for (int k = j + 1; k < n; k++)
        if (refs_buffer(&ins[k], table.buf))
            return -1;
    return j;
}

int regc_fuse_embed_bwd_add(regc_instr *ins, int *n, const regc_buf *bufs)
{
    int fused = 0;
    for (int e = 0; e < *n; e++) {
        if (ins[e].kernel != K_EMBED_BWD)
            continue;
        int j = embed_bwd_add_at(ins, *n, e, bufs);
        if (j < 0)
            continue;
        /* the add's operands commute, so out + sum is the add's out + table */
        regc_instr f = ins[e];
        f.refs[0] = ins[j].refs[0];
        f.accumulate = 1;
        memmove(ins + e, ins + e + 1, (size_t)(j - e - 1) * sizeof *ins);
        ins[j - 1] = f;
        memmove(ins + j, ins + j + 1, (size_t)(*n - j - 1) * sizeof *ins);
        (*n)--;
        fused++;
        e--; /* ins[e] is a new instruction now */
    }
    return fused;
}
