/* cpu_attention.c — softmax attention, forward and backward, with grouped
 * query heads, an optional causal mask (optionally a sliding window of it:
 * keys before the window take no weight; and documents packed in a row:
 * keys before a query's document take none), optional soft-capping of the
 * scaled scores (Gemma 2's cap tanh(x / cap), whose slope 1 - tanh^2 the
 * backward applies to the score gradients), an optional additive score
 * bias (T5's position bias, [n_head, tq, tk] shared by the batch) and an
 * optional dropout on the probabilities (GPT-2's attn_pdrop). Nothing of
 * size T x T is ever stored per batch: the forward keeps one row of scores
 * per thread and saves each row's log-sum-exp; the backward recomputes the
 * probabilities from it, one head at a time per thread, keeping that head's
 * probabilities and score gradients (transposed) for dK and dV. Every
 * product runs as a row times a matrix, a block of columns at a time, with
 * sums in a fixed order. The bias gradient is the one T x T output.
 *
 * q, k, v and out may be held in bf16 (regc_attn_shape.bf16): a head's keys
 * and values are widened, exactly, as they are transposed or into the
 * thread's scratch, a query or output row likewise, so every product reads
 * the fp32 values it would have read from an fp32 copy, and the bits are
 * that copy's; a bf16 out is stored rounded.
 *
 * Dropout (out = (P * Z) V, Z the mask scaled by 1 / (1 - p)): the row's
 * sum and the saved log-sum-exp are of the undropped probabilities, and the
 * mask is drawn again in the backward rather than stored, so dV = (P Z)^T dO
 * and dS = P (Z dP - delta); delta = rowsum(dO * O) still equals
 * rowsum(P Z dP), as in FlashAttention. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"
#include "kernel_checks.h"
#include "regc_common.h"

/* Eight independent partial sums: vectorisable without reassociation (the
 * build forbids fast-math), and the order is fixed, so results are too. */
static inline float cpu_dot(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int u = 0; u < 8; u++)
            acc[u] += a[d + u] * b[d + u];
    for (; d < n; d++)
        acc[0] += a[d] * b[d];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static int cpu_check_attention(regc_backend *be, const regc_attn_shape *s, const float *bias,
                               const char *what)
{
    int status = regc_attn_check(s, what);
    if (status == REGC_OK)
        status = regc_attn_check_bias(s, bias, what);
    if (status != REGC_OK)
        regc_cpu_set_failure(be, status);
    return status == REGC_OK;
}

/* Per-thread scratch stride in floats, padded to a cache line so threads
 * never share one. */
static size_t cpu_thread_stride(int64_t floats) { return (size_t)((floats + 15) / 16 * 16); }

/* Columns (keys, or elements of head_dim) per block of a row-times-matrix
 * product: one block's partial sums stay in registers (eight AVX2 vectors)
 * while the loop runs down the rows, eight independent chains of adds. */
#define CPU_ATTN_BLOCK 64

/* Row stride of a transposed head, a whole number of key blocks. */
static int64_t cpu_attn_ld(int64_t tk)
{
    return (tk + CPU_ATTN_BLOCK - 1) / CPU_ATTN_BLOCK * CPU_ATTN_BLOCK;
}

/* xt[d, j] = x[off + j * ld_x + d] for one head (x held in bf16 when bf16;
 * xt: [D, ld], the padding columns zero so a block past the last key reads
 * finite values). */
static void cpu_attn_transpose_head(float *restrict xt, const float *x, int bf16, int64_t off,
                                    int64_t ld_x, int64_t tk, int D, int64_t ld)
{
    for (int d = 0; d < D; d++) {
        float *row = xt + (int64_t)d * ld; /* [ld] */
        for (int64_t j = 0; j < tk; j++)
            row[j] = regc_load_f32_or_bf16(x, bf16, off + j * ld_x + d);
        for (int64_t j = tk; j < ld; j++)
            row[j] = 0.0f;
    }
}

/* rows x[off + r * ld_x .. + D) for r < n_rows as fp32: where they are, or,
 * x held in bf16, widened into buf ([n_rows, D]); *ld: their stride. */
static const float *cpu_attn_rows(const float *x, int bf16, int64_t off, int64_t ld_x,
                                  int64_t n_rows, int D, float *buf, int64_t *ld)
{
    if (!bf16) {
        *ld = ld_x;
        return x + off;
    }
    for (int64_t r = 0; r < n_rows; r++)
        for (int d = 0; d < D; d++)
            buf[r * D + d] = regc_bf16_value(((const uint16_t *)x)[off + r * ld_x + d]);
    *ld = D;
    return buf;
}

/* z[j] = attention dropout's factor for keys first .. n_keys - 1 of query
 * i of head h in batch row b (regc_attn_keep's), drawn four elements per
 * Philox call as the dropout kernel draws them. */
static void cpu_attn_keep_row(float *restrict z, const regc_attn_shape *s, int64_t b, int h,
                              int64_t i, int64_t first, int64_t n_keys)
{
    const int64_t e0 = ((b * s->n_head + h) * s->tq + i) * s->tk;
    const float scale = 1.0f / (1.0f - s->dropout);
    const int32_t site = *s->drop_site;
    uint32_t w[4];
    int64_t q = -1; /* the group of four whose words w holds */
    for (int64_t j = first; j < n_keys; j++) {
        const int64_t e = e0 + j;
        if (e >> 2 != q)
            regc_dropout_words(s->drop_draw, site, q = e >> 2, w);
        z[j] = regc_dropout_apply(1.0f, w[e & 3], s->dropout, scale);
    }
}

/* s[j] = scale * (a . x_j) for j < n_keys, with xt the head transposed
 * ([D, ld]): the sum runs down d in order for every key, a block of keys at
 * a time, so it vectorises across keys and its bits never depend on the
 * thread count. s has room for n_keys rounded up to a block. */
REGC_CPU_WIDE_VECTORS static void cpu_attn_row_scores(float *restrict s, const float *restrict a,
                                                      const float *restrict xt, int64_t ld, int D,
                                                      int64_t n_keys, float scale)
{
    for (int64_t j0 = 0; j0 < n_keys; j0 += CPU_ATTN_BLOCK) {
        float acc[CPU_ATTN_BLOCK] = {0};
        for (int d = 0; d < D; d++) {
            const float ad = a[d];
            const float *row = xt + (int64_t)d * ld + j0; /* [block] */
            for (int u = 0; u < CPU_ATTN_BLOCK; u++)
                acc[u] += ad * row[u];
        }
        for (int u = 0; u < CPU_ATTN_BLOCK; u++)
            s[j0 + u] = scale * acc[u];
    }
}

/* y[d] += sum over r < n_rows of a[r] * x[r, d] for d < D (x: rows ld_x
 * apart), summed in row order a block of d at a time: one row of P V, dS K,
 * dS^T Q or P^T dO. */
REGC_CPU_WIDE_VECTORS static void cpu_attn_row_combine(float *restrict y, const float *restrict a,
                                                       int64_t n_rows, const float *restrict x,
                                                       int64_t ld_x, int D)
{
    int d0 = 0;
    for (; d0 + CPU_ATTN_BLOCK <= D; d0 += CPU_ATTN_BLOCK) {
        float acc[CPU_ATTN_BLOCK] = {0};
        for (int64_t r = 0; r < n_rows; r++) {
            const float ar = a[r];
            const float *row = x + r * ld_x + d0; /* [block] */
            for (int u = 0; u < CPU_ATTN_BLOCK; u++)
                acc[u] += ar * row[u];
        }
        for (int u = 0; u < CPU_ATTN_BLOCK; u++)
            y[d0 + u] += acc[u];
    }
    if (d0 == D)
        return;
    const int w = D - d0; /* the last, partial block: the same sums, fewer lanes */
    float acc[CPU_ATTN_BLOCK] = {0};
    for (int64_t r = 0; r < n_rows; r++) {
        const float ar = a[r];
        const float *row = x + r * ld_x + d0; /* [w] */
        for (int u = 0; u < w; u++)
            acc[u] += ar * row[u];
    }
    for (int u = 0; u < w; u++)
        y[d0 + u] += acc[u];
}

/* One past the last query that sees key j of batch row b (causal or not):
 * the window's end, or its document's, whichever comes first. A document
 * ends where a later query's starts past j (doc_start rises along a row). */
static int64_t cpu_attn_last_query(const regc_attn_shape *s, int64_t b, int64_t j)
{
    int64_t end = s->window > 0 && j + s->window < s->tq ? j + s->window : s->tq;
    if (s->doc_start) {
        const int32_t *start = s->doc_start + b * s->tq; /* [tq] */
        for (int64_t i = j + 1; i < end; i++)
            if (start[i] > j) {
                end = i;
                break;
            }
    }
    return end;
}

void regc_cpu_attention_fwd(regc_backend *be, float *out, float *lse, const float *q,
                            const float *k, const float *v, const float *bias,
                            const regc_attn_shape *s)
{
    if (!cpu_check_attention(be, s, bias, "attention_fwd"))
        return;
    const int threads = regc_cpu_threads(be);
    const int H = s->n_head, D = s->head_dim, rep = s->n_head / s->n_kv_head;
    const int64_t tq = s->tq, tk = s->tk, ld = cpu_attn_ld(tk);
    const int64_t q_ld = (int64_t)H * D, kv_ld = (int64_t)s->n_kv_head * D;
    const int q16 = (s->bf16 & REGC_ATTN_Q_BF16) != 0, k16 = (s->bf16 & REGC_ATTN_K_BF16) != 0;
    const int v16 = (s->bf16 & REGC_ATTN_V_BF16) != 0, o16 = (s->bf16 & REGC_ATTN_OUT_BF16) != 0;
    const int drop = regc_attn_drops(s);
    const size_t stride = cpu_thread_stride((int64_t)D * ld + ld + D + (v16 ? tk * D : 0) +
                                            (q16 ? D : 0) + (drop ? ld : 0));
    float *scratch = regc_cpu_get_scratch(be, (size_t)threads * stride * sizeof(float));
    if (!scratch)
        return;
    const int64_t n_tasks = s->batch * H;

#pragma omp parallel num_threads(threads) if (n_tasks * tq * tk * D >= regc_cpu_par_min(be))
    {
        float *kt = scratch + (size_t)omp_get_thread_num() * stride; /* [D, ld] */
        float *p = kt + (int64_t)D * ld;                             /* [ld] */
        float *acc = p + ld;                                         /* [D] */
        float *v_wide = acc + D;                                     /* [tk, D] when v16 */
        float *q_wide = v_wide + (v16 ? tk * D : 0);                 /* [D] when q16 */
        float *z = q_wide + (q16 ? D : 0);                           /* [ld] when drop */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < n_tasks; task++) {
            const int64_t b = task / H;
            const int h = (int)(task % H), g = h / rep;
            /* this head's keys and values: [tk, D] rows, kv_ld apart */
            const int64_t kv_off = b * tk * kv_ld + (int64_t)g * D;
            int64_t v_ld, q_row_ld;
            cpu_attn_transpose_head(kt, k, k16, kv_off, kv_ld, tk, D, ld);
            const float *vb = cpu_attn_rows(v, v16, kv_off, kv_ld, tk, D, v_wide, &v_ld);
            for (int64_t i = 0; i < tq; i++) {
                const int64_t row = (b * tq + i) * q_ld + (int64_t)h * D;
                const float *qi = cpu_attn_rows(q, q16, row, q_ld, 1, D, q_wide, &q_row_ld);
                float *lse_i = lse + (b * H + h) * tq + i;
                const int64_t n_keys = s->causal ? i + 1 : tk;
                if (n_keys == 0) { /* no key to attend to: define the output as zero */
                    for (int d = 0; d < D; d++)
                        regc_store_f32_or_bf16(out, o16, row + d, 0.0f);
                    *lse_i = -INFINITY;
                    continue;
                }
                float mx = -INFINITY;
                /* keys before the window are never scored: the row runs from
                 * the block holding the first key seen (a key's score does
                 * not depend on where its block starts) */
                const int64_t first = regc_attn_first_key(s, b, i);
                const int64_t base = first / CPU_ATTN_BLOCK * CPU_ATTN_BLOCK;
                cpu_attn_row_scores(p + base, qi, kt + base, ld, D, n_keys - base, s->scale);
                if (s->softcap > 0.0f)
                    for (int64_t j = first; j < n_keys; j++)
                        p[j] = regc_softcap(p[j], s->softcap, NULL);
                if (bias) {
                    const float *bi = bias + ((int64_t)h * tq + i) * tk; /* [tk] */
                    for (int64_t j = first; j < n_keys; j++)
                        p[j] += bi[j];
                }
                for (int64_t j = first; j < n_keys; j++)
                    mx = p[j] > mx ? p[j] : mx;
                for (int64_t j = first; j < n_keys; j++)
                    p[j] = regc_expf(p[j] - mx);
                double sum = 0.0;
                for (int64_t j = first; j < n_keys; j++)
                    sum += p[j];
                if (drop) { /* after the sum: the softmax is of every key */
                    cpu_attn_keep_row(z, s, b, h, i, first, n_keys);
                    for (int64_t j = first; j < n_keys; j++)
                        p[j] *= z[j];
                }
                memset(acc, 0, (size_t)D * sizeof(float));
                cpu_attn_row_combine(acc, p + first, n_keys - first, vb + first * v_ld, v_ld, D);
                const float inv = (float)(1.0 / sum);
                for (int d = 0; d < D; d++)
                    regc_store_f32_or_bf16(out, o16, row + d, acc[d] * inv);
                *lse_i = mx + (float)regc_log(sum);
            }
        }
    }
}

/* dbias[h, i, j] = sum over b of dS[b, h, i, j], dS = P (dP - delta) taken
 * before the scale (the bias is added after it). One task per (head, query
 * row) owns that row of dbias and sums the batch in order, so no two threads
 * write one element and the bits do not depend on the thread count. The
 * probabilities are recomputed once more rather than kept: storing dS for
 * the whole batch would be the T x T per batch row this file avoids.
 * kt, vt: every (batch, kv head)'s keys and values transposed, [batch *
 * n_kv_head, D, ld]; per thread, rows of row_stride floats: p, dp, z [ld]
 * each, and from `wide` a query row [D] where q is bf16, then an output
 * row [D] where out is. */
static void cpu_attention_dbias(regc_backend *be, float *dbias, const float *dout, const float *q,
                                const float *out, const float *bias, const float *lse,
                                const float *kt, const float *vt, float *rows, size_t row_stride,
                                size_t wide, const regc_attn_shape *s)
{
    const int q16 = (s->bf16 & REGC_ATTN_Q_BF16) != 0, o16 = (s->bf16 & REGC_ATTN_OUT_BF16) != 0;
    const int H = s->n_head, D = s->head_dim, rep = H / s->n_kv_head;
    const int64_t tq = s->tq, tk = s->tk, ld = cpu_attn_ld(tk);
    const int64_t q_ld = (int64_t)H * D, head_size = (int64_t)D * ld;
    const int64_t n_tasks = (int64_t)H * tq;

#pragma omp parallel num_threads(regc_cpu_threads(be)) if (s->batch * n_tasks * tk * D >=          \
                                                           regc_cpu_par_min(be))
    {
        float *p = rows + (size_t)omp_get_thread_num() * row_stride; /* [ld] */
        float *dp = p + ld;                                          /* [ld] */
        float *z = dp + ld;                                          /* [ld] */
        float *q_wide = p + wide, *o_wide = q_wide + (q16 ? D : 0);  /* [D] each, as needed */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < n_tasks; task++) {
            const int h = (int)(task / tq), g = h / rep;
            const int64_t i = task % tq;
            const float *bi = bias + task * tk; /* [tk] of head h, query i */
            float *dbi = dbias + task * tk;     /* [tk] */
            memset(dbi, 0, (size_t)tk * sizeof(float));
            const int64_t n_keys = s->causal ? i + 1 : tk;
            for (int64_t b = 0; b < s->batch; b++) {
                const int64_t row = (b * tq + i) * q_ld + (int64_t)h * D;
                int64_t unused;
                const float *qi = cpu_attn_rows(q, q16, row, q_ld, 1, D, q_wide, &unused);
                const float *oi = cpu_attn_rows(out, o16, row, q_ld, 1, D, o_wide, &unused);
                const float *doi = dout + row;                              /* [D] */
                const float *kth = kt + (b * s->n_kv_head + g) * head_size; /* [D, ld] */
                const float *vth = vt + (b * s->n_kv_head + g) * head_size; /* [D, ld] */
                const float lse_i = lse[(b * H + h) * tq + i];
                const float delta = cpu_dot(doi, oi, D);
                cpu_attn_row_scores(p, qi, kth, ld, D, n_keys, s->scale);
                cpu_attn_row_scores(dp, doi, vth, ld, D, n_keys, 1.0f);
                const int64_t first = regc_attn_first_key(s, b, i);
                if (regc_attn_drops(s)) { /* the mask's gradient: Z dP */
                    cpu_attn_keep_row(z, s, b, h, i, first, n_keys);
                    for (int64_t j = first; j < n_keys; j++)
                        dp[j] *= z[j];
                }
                for (int64_t j = first; j < n_keys; j++)
                    dbi[j] += regc_expf(p[j] + bi[j] - lse_i) * (dp[j] - delta);
            }
        }
    }
}

void regc_cpu_attention_bwd(regc_backend *be, float *dq, float *dk, float *dv, float *dbias,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *bias, const float *out, const float *lse,
                            const regc_attn_shape *s)
{
    if (!cpu_check_attention(be, s, bias, "attention_bwd"))
        return;
    if (dbias && !bias) {
        regc_cpu_set_failure(
            be, regc_error(REGC_ERR_ARG,
                           "attention_bwd: a bias gradient was asked for without the bias"));
        return;
    }
    const int threads = regc_cpu_threads(be);
    const int H = s->n_head, Hkv = s->n_kv_head, D = s->head_dim, rep = H / Hkv;
    const int64_t tq = s->tq, tk = s->tk, ld = cpu_attn_ld(tk);
    const int64_t q_ld = (int64_t)H * D, kv_ld = (int64_t)Hkv * D;
    const float scale = s->scale;
    /* One task per (batch, kv head): it alone writes that head's dk and dv,
     * summing over the query heads that share it, and the dq of those query
     * heads, so no two threads ever touch the same output. */
    const int64_t n_tasks = s->batch * Hkv, head_size = (int64_t)D * ld;
    const int q16 = (s->bf16 & REGC_ATTN_Q_BF16) != 0, k16 = (s->bf16 & REGC_ATTN_K_BF16) != 0;
    const int v16 = (s->bf16 & REGC_ATTN_V_BF16) != 0, o16 = (s->bf16 & REGC_ATTN_OUT_BF16) != 0;
    const int drop = regc_attn_drops(s);
    /* per thread: rows p, dp, z [ld]; for one query head, P^T and dS^T [tk, tq]
     * (T x T of one head, never of the batch); then what is widened from
     * bf16: the kv head's keys [tk, D], the query head's rows [tq, D] (at
     * least [D], the dbias pass's query row) and an output row [D] */
    const size_t wide = (size_t)(3 * ld + 2 * tk * tq);
    const size_t row_stride = cpu_thread_stride((int64_t)wide + (k16 ? tk * D : 0) +
                                                (q16 ? (tq > 1 ? tq : 1) * D : 0) + (o16 ? D : 0));
    const size_t heads = (size_t)(n_tasks * head_size);
    /* one float more: a shape without keys still gets a buffer, and with it
     * the zeros it owes dq */
    float *kt = regc_cpu_get_scratch(be, (2 * heads + (size_t)threads * row_stride + 1) *
                                             sizeof(float)); /* [n_tasks, D, ld] */
    if (!kt)
        return;
    float *vt = kt + heads;   /* [n_tasks, D, ld] */
    float *rows = vt + heads; /* [threads, row_stride] */

#pragma omp parallel num_threads(threads) if (n_tasks * tq * tk * D >= regc_cpu_par_min(be))
    {
        float *p = rows + (size_t)omp_get_thread_num() * row_stride; /* [ld] */
        float *dp = p + ld;                                          /* [ld] */
        float *z = dp + ld;                                          /* [ld] */
        float *pt = z + ld;                                          /* [tk, tq] */
        float *dst = pt + tk * tq;                                   /* [tk, tq] */
        float *k_wide = p + wide;                                    /* [tk, D] when k16 */
        float *q_wide = k_wide + (k16 ? tk * D : 0);                 /* [tq, D] when q16 */
        float *o_wide = q_wide + (q16 ? (tq > 1 ? tq : 1) * D : 0);  /* [D] when o16 */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < n_tasks; task++) {
            const int64_t b = task / Hkv;
            const int g = (int)(task % Hkv);
            /* this kv head's rows, [tk, D] each, kv_ld apart (k's as fp32 in
             * kb, k_ld apart) */
            const int64_t kv_off = b * tk * kv_ld + (int64_t)g * D;
            int64_t k_ld, q_head_ld, o_ld;
            const float *kb = cpu_attn_rows(k, k16, kv_off, kv_ld, tk, D, k_wide, &k_ld);
            float *dkb = dk + kv_off;
            float *dvb = dv + kv_off;
            float *kth = kt + task * head_size, *vth = vt + task * head_size; /* [D, ld] */
            cpu_attn_transpose_head(kth, k, k16, kv_off, kv_ld, tk, D, ld);
            cpu_attn_transpose_head(vth, v, v16, kv_off, kv_ld, tk, D, ld);
            for (int64_t j = 0; j < tk; j++) {
                memset(dkb + j * kv_ld, 0, (size_t)D * sizeof(float));
                memset(dvb + j * kv_ld, 0, (size_t)D * sizeof(float));
            }
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                /* this query head's rows, [tq, D] each, q_ld apart (q's as
                 * fp32 in qh, q_head_ld apart) */
                const int64_t head_off = b * tq * q_ld + (int64_t)h * D;
                const float *qh = cpu_attn_rows(q, q16, head_off, q_ld, tq, D, q_wide, &q_head_ld);
                const float *doh = dout + head_off;
                for (int64_t i = 0; i < tq; i++) {
                    const float *qi = qh + i * q_head_ld, *doi = doh + i * q_ld; /* [D] each */
                    const float *oi =
                        cpu_attn_rows(out, o16, head_off + i * q_ld, q_ld, 1, D, o_wide, &o_ld);
                    float *dqi = dq + head_off + i * q_ld; /* [D] */
                    const int64_t n_keys = s->causal ? i + 1 : tk;
                    const float lse_i = lse[(b * H + h) * tq + i];
                    const float delta = cpu_dot(doi, oi, D); /* rowsum(dO * O) */
                    const float *bi = bias ? bias + ((int64_t)h * tq + i) * tk : NULL; /* [tk] */
                    /* as in the forward: the keys from the first one seen */
                    const int64_t first = regc_attn_first_key(s, b, i);
                    const int64_t base = first / CPU_ATTN_BLOCK * CPU_ATTN_BLOCK;
                    cpu_attn_row_scores(p + base, qi, kth + base, ld, D, n_keys - base, scale);
                    cpu_attn_row_scores(dp + base, doi, vth + base, ld, D, n_keys - base, 1.0f);
                    /* a separate loop: inside the one below, the choice
                     * compiles to a masked load from bias, which, NULL,
                     * costs a fault-suppression assist per vector */
                    if (bi)
                        for (int64_t j = first; j < n_keys; j++)
                            p[j] += bi[j];
                    if (drop) { /* the mask's gradient: Z dP */
                        cpu_attn_keep_row(z, s, b, h, i, first, n_keys);
                        for (int64_t j = first; j < n_keys; j++)
                            dp[j] *= z[j];
                    }
                    /* p becomes the probabilities, dp the score gradients;
                     * both are kept transposed for dK and dV below */
                    if (s->softcap > 0.0f) {
                        for (int64_t j = first; j < n_keys; j++) {
                            float slope;
                            p[j] = regc_expf(regc_softcap(p[j], s->softcap, &slope) - lse_i);
                            dp[j] = scale * (p[j] * (dp[j] - delta) * slope);
                            pt[j * tq + i] = p[j];
                            dst[j * tq + i] = dp[j];
                        }
                    } else {
                        for (int64_t j = first; j < n_keys; j++) {
                            p[j] = regc_expf(p[j] - lse_i);
                            dp[j] = scale * (p[j] * (dp[j] - delta));
                            pt[j * tq + i] = p[j];
                            dst[j * tq + i] = dp[j];
                        }
                    }
                    if (drop) /* dV reads the probabilities as dropped: P Z */
                        for (int64_t j = first; j < n_keys; j++)
                            pt[j * tq + i] *= z[j];
                    memset(dqi, 0, (size_t)D * sizeof(float));
                    cpu_attn_row_combine(dqi, dp + first, n_keys - first, kb + first * k_ld, k_ld,
                                         D); /* dS K */
                }
                /* dK += dS^T Q and dV += P^T dO over the queries that see key
                 * j: from j (causal) to the last whose window holds it and
                 * whose document it is in */
                for (int64_t j = 0; j < tk; j++) {
                    const int64_t i0 = s->causal ? j : 0;
                    const int64_t i1 = cpu_attn_last_query(s, b, j);
                    cpu_attn_row_combine(dkb + j * kv_ld, dst + j * tq + i0, i1 - i0,
                                         qh + i0 * q_head_ld, q_head_ld, D);
                    cpu_attn_row_combine(dvb + j * kv_ld, pt + j * tq + i0, i1 - i0,
                                         doh + i0 * q_ld, q_ld, D);
                }
            }
        }
    }
    if (dbias)
        cpu_attention_dbias(be, dbias, dout, q, out, bias, lse, kt, vt, rows, row_stride, wide, s);
}
