/* cuda_elementwise.h — the work of one GPU thread of each memory-bound
 * kernel of cuda_elementwise.cu, as a "body" that C compiles too.
 *
 * Each body computes one element (or one pair, one column, one column of
 * one id's rows) of its kernel's output exactly as the GPU kernel does: the
 * kernel is a loop over its grid that calls the body, nothing more. The
 * same source compiled on the host is what tests/test_cuda_bodies.c (the
 * elementwise bodies) and tests/test_cuda_bodies_indexed.c (those that
 * index: rope, embeddings, column sums, transposes) run over every index
 * of the grid and compares bit for bit with the CPU
 * backend, so the GPU's indexing and the choice of formula are proven
 * without a GPU. What the host run cannot show, that the GPU rounds every
 * operation as the host does, rests on kernel_math.h's rules: only IEEE
 * operations, and --fmad=false so no a*b+c becomes an fma.
 *
 * Every formula is kernel_math.h's; a body only picks the elements. The
 * launchers check a call with kernel_checks.h, as the CPU does. */
#ifndef REGC_CUDA_ELEMENTWISE_H
#define REGC_CUDA_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernel_checks.h"
#include "kernel_math.h"
#include "regc_backend.h"

/* ---- the plain elementwise kernels: out[i] from the inputs' element i */

static inline REGC_HD void cuda_body_add(int64_t i, float *out, const float *a,
                                         const float *b) /* out, a, b: [n] */
{
    out[i] = regc_addf(a[i], b[i]);
}

/* out, x: [rows, cols], b: [cols] */
static inline REGC_HD void cuda_body_bias_add(int64_t i, float *out, const float *x, const float *b,
                                              int64_t cols)
{
    out[i] = regc_addf(x[i], b[i % cols]);
}

static inline REGC_HD void cuda_body_mul(int64_t i, float *out, const float *a,
                                         const float *b) /* out, a, b: [n] */
{
    out[i] = regc_mulf(a[i], b[i]);
}

static inline REGC_HD void cuda_body_scale(int64_t i, float *y, const float *x,
                                           float value) /* y, x: [n] */
{
    y[i] = regc_scalef(value, x[i]);
}

/* Elements 4q .. 4q + 3 (those below n) of dropout: one Philox call, the
 * CPU kernel's words and products. */
static inline REGC_HD void cuda_body_dropout(int64_t q, float *y, const float *x,
                                             const int32_t *site, const int32_t *draw, float p,
                                             float scale, int64_t n) /* y, x: [n] */
{
    uint32_t w[4];
    regc_dropout_words(draw, *site, q, w);
    for (int64_t i = 4 * q; i < 4 * q + 4 && i < n; i++)
        y[i] = draw[3] ? regc_dropout_apply(x[i], w[i - 4 * q], p, scale) : x[i];
}

static inline REGC_HD void cuda_body_gelu_fwd(int64_t i, float *y, const float *x) /* y, x: [n] */
{
    y[i] = regc_gelu(x[i]);
}

static inline REGC_HD void cuda_body_gelu_bwd(int64_t i, float *dx, const float *dy,
                                              const float *x) /* dx, dy, x: [n] */
{
    dx[i] = regc_gelu_dx(dy[i], x[i]);
}

static inline REGC_HD void cuda_body_gelu_erf_fwd(int64_t i, float *y,
                                                  const float *x) /* y, x: [n] */
{
    y[i] = regc_gelu_erf(x[i]);
}

static inline REGC_HD void cuda_body_gelu_erf_bwd(int64_t i, float *dx, const float *dy,
                                                  const float *x) /* dx, dy, x: [n] */
{
    dx[i] = regc_gelu_erf_dx(dy[i], x[i]);
}

static inline REGC_HD void cuda_body_silu_fwd(int64_t i, float *y, const float *x) /* y, x: [n] */
{
    y[i] = regc_silu(x[i]);
}

static inline REGC_HD void cuda_body_silu_bwd(int64_t i, float *dx, const float *dy,
                                              const float *x) /* dx, dy, x: [n] */
{
    dx[i] = regc_silu_dx(dy[i], x[i]);
}

static inline REGC_HD void cuda_body_relu_fwd(int64_t i, float *y, const float *x) /* y, x: [n] */
{
    y[i] = regc_relu(x[i]);
}

static inline REGC_HD void cuda_body_relu_bwd(int64_t i, float *dx, const float *dy,
                                              const float *x) /* dx, dy, x: [n] */
{
    dx[i] = regc_relu_dx(dy[i], x[i]);
}

/* ---- rotary embedding: thread i rotates one pair (x[j], x[j + half]) of
 * one head, or passes one value past rot_dim through: i = ((row * n_head)
 * + head) * (head_dim - half) + j, half = rot_dim / 2. Each thread reads
 * its values before writing them, so y may be x. sign is -1 for the
 * inverse and multiplies sin as the CPU does (exact: a sign flip). */
static inline REGC_HD void cuda_body_rope(int64_t i, float *y, const float *x, const float *cos,
                                          const float *sin, int64_t t, int n_head, int head_dim,
                                          int rot_dim, float sign, int y_bf16)
/* y, x: [batch, t, n_head * head_dim] (y in bf16 where y_bf16); cos, sin: [t, rot_dim / 2].
 * Item i of a head's head_dim - rot_dim / 2: a rotated pair below rot_dim / 2,
 * else one value past rot_dim passed through. */
{
    const int64_t half = rot_dim / 2, items = head_dim - half;
    const int64_t j = i % items, head_row = i / items; /* head_row = row * n_head + head */
    const int64_t row = head_row / n_head, pos = row % t;
    const int64_t base = head_row * head_dim; /* row * n_head * head_dim + head * head_dim */
    if (j >= half) {                          /* the part not rotated */
        const int64_t e = base + rot_dim + (j - half);
        regc_store_f32_or_bf16(y, y_bf16, e, x[e]);
        return;
    }
    const float c = cos[pos * half + j], s = sign * sin[pos * half + j];
    float y1, y2;
    regc_rope_pair(&y1, &y2, x[base + j], x[base + j + half], c, s);
    regc_store_f32_or_bf16(y, y_bf16, base + j, y1);
    regc_store_f32_or_bf16(y, y_bf16, base + j + half, y2);
}

/* ---- embedding */

/* out[r, c] = table[ids[r], c], i = r * cols + c; ids are the caller's
 * to check, as on the CPU. A table held in bf16 (table_bf16) is read
 * exactly, widened: the CPU's copy, value for value. */
static inline REGC_HD void cuda_body_embedding_fwd(int64_t i, float *out, const int32_t *ids,
                                                   const float *table, int64_t cols, int table_bf16)
/* out: [rows, cols]; ids: [rows]; table: [vocab, cols] (bf16 values where table_bf16) */
{
    const int64_t r = i / cols, c = i % cols;
    out[i] = regc_load_f32_or_bf16(table, table_bf16, (int64_t)ids[r] * cols + c);
}

/* The backward groups rows by id with a sort of (id << 32 | row): the rows
 * of one id become adjacent and in row order. The id is taken as unsigned,
 * so negative ids sort after every id in [0, 2^31), and so after every
 * valid one: the sorted keys hold a bad id exactly when the last one is. */
static inline REGC_HD void cuda_body_embedding_key(int64_t r, uint64_t *key,
                                                   const int32_t *ids) /* key, ids: [rows] */
{
    key[r] = (uint64_t)(uint32_t)ids[r] << 32 | (uint64_t)r;
}

/* Is every id of the sorted keys inside [0, vocab)? (rows > 0) */
static inline REGC_HD int cuda_embedding_keys_ok(const uint64_t *key, int64_t rows,
                                                 int64_t vocab) /* key: [rows], sorted */
{
    const int32_t id = (int32_t)(uint32_t)(key[rows - 1] >> 32);
    return id >= 0 && (int64_t)id < vocab;
}

/* Thread i = g * cols + c: when sorted key g is the first of its id, the
 * sum over that id's rows of dout[row, c], from 0 in row order, added once
 * to dtable[id, c] — the CPU's sum and the CPU's single add, so the bits
 * agree. Every other thread has nothing to do. */
static inline REGC_HD void cuda_body_embedding_bwd(int64_t i, float *dtable, const uint64_t *key,
                                                   const float *dout, int64_t rows, int64_t cols,
                                                   int64_t pad)
/* dtable: [vocab, cols]; key: [rows], sorted; dout: [rows, cols] */
{
    const int64_t g = i / cols, c = i % cols;
    const uint64_t id = key[g] >> 32;
    if ((g > 0 && key[g - 1] >> 32 == id) || (int64_t)id == pad)
        return; /* not the group's first, or the padding row (which takes nothing) */
    float acc = 0.0f;
    for (int64_t k = g; k < rows && key[k] >> 32 == id; k++)
        acc = regc_addf(acc, dout[(int64_t)(key[k] & UINT32_MAX) * cols + c]);
    float *dst = dtable + (int64_t)id * cols + c;
    *dst = regc_addf(*dst, acc);
}

/* ---- column sums: thread c walks column c down the rows in order, in
 * double, as regc_cpu_sum_columns does for every column */
static inline REGC_HD void cuda_body_sum_rows(int64_t c, float *out, const float *x, int64_t rows,
                                              int64_t cols) /* out: [cols]; x: [rows, cols] */
{
    double acc = 0.0;
    for (int64_t r = 0; r < rows; r++)
        acc += x[r * cols + c];
    out[c] = (float)acc;
}

/* ---- the fused elementwise chain: element e of every output. The
 * registers are a small array indexed at run time (the GPU keeps it in
 * local memory, which stays in L1); inputs are all read before any output
 * is written, so an output may be an input that is not broadcast. */
#define CUDA_EW_MAX_REGS (REGC_EW_MAX_INPUTS + REGC_EW_MAX_STEPS)

static inline REGC_HD void cuda_body_elementwise(int64_t e, const regc_ew_program *p,
                                                 float *const *out, const float *const *in,
                                                 unsigned out_bf16, unsigned in_bf16)
/* out[k]: [n], bf16 values where bit k of out_bf16 is set; in[i]: [n], or
 * fewer when broadcast (regc_ew_index), bf16 values where bit i of in_bf16
 * is set */
{
    float reg[CUDA_EW_MAX_REGS];
    for (int i = 0; i < p->n_inputs; i++)
        reg[i] = regc_load_f32_or_bf16(in[i], (int)(in_bf16 >> i & 1u), regc_ew_index(p, i, e));
    for (int s = 0; s < p->n_steps; s++) {
        const regc_ew_step *st = &p->steps[s];
        /* a one-operand op's b is unchecked: never index with it */
        const float b = regc_ew_binary(st->op) ? reg[st->b] : reg[st->a];
        reg[p->n_inputs + s] = regc_ew_eval(st, reg[st->a], b);
    }
    for (int k = 0; k < p->n_outputs; k++)
        regc_store_f32_or_bf16(out[k], (int)(out_bf16 >> k & 1u), e, reg[p->out_reg[k]]);
}

/* ---- transpose: output element o copies source element
 * cuda_transpose_source(o). The map drops size-1 axes and merges output
 * axes that are neighbours in the source too (as the CPU's plan does), so
 * a thread divides once per axis that is left: 64-bit divisions are the
 * costly part of this copy on a GPU. */
#define CUDA_TRANSPOSE_MAX_DIMS REGC_TRANSPOSE_MAX_DIMS

typedef struct {
    int nd;
    int64_t dim[CUDA_TRANSPOSE_MAX_DIMS]; /* output shape, merged */
    int64_t src[CUDA_TRANSPOSE_MAX_DIMS]; /* the source stride of each output axis */
    int64_t total;                        /* elements */
} cuda_transpose_map;

static inline REGC_HD int64_t cuda_transpose_source(int64_t o, const cuda_transpose_map *m)
{
    int64_t off = 0;
    for (int i = m->nd - 1; i >= 0; i--) {
        off += (o % m->dim[i]) * m->src[i];
        o /= m->dim[i];
    }
    return off;
}

/* out: [total] in the permuted shape; x: [total] in the source shape */
static inline REGC_HD void cuda_body_transpose(int64_t o, float *out, const float *x,
                                               const cuda_transpose_map *m)
{
    out[o] = x[cuda_transpose_source(o, m)];
}

/* The map of out = x with axes permuted (out.shape[i] = shape[perm[i]]),
 * for a permutation regc_transpose_check accepts. */
static inline void cuda_transpose_map_init(cuda_transpose_map *m, int ndim, const int64_t *shape,
                                           const int *perm)
{
    memset(m, 0, sizeof *m);                 /* unused axes compare equal */
    int64_t stride[CUDA_TRANSPOSE_MAX_DIMS]; /* the source's own strides */
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i];
    }
    m->total = s;
    m->nd = 0;
    for (int i = 0; i < ndim; i++) {
        const int64_t d = shape[perm[i]], st = stride[perm[i]];
        if (d == 1)
            continue;
        if (m->nd > 0 && m->src[m->nd - 1] == st * d) {
            m->dim[m->nd - 1] *= d;
            m->src[m->nd - 1] = st;
        } else {
            m->dim[m->nd] = d;
            m->src[m->nd] = st;
            m->nd++;
        }
    }
}

#endif
