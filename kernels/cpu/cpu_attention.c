/* cpu_attention.c — softmax attention, forward and backward, with grouped
 * query heads, an optional causal mask and an optional additive score bias
 * (T5's position bias, [n_head, tq, tk] shared by the batch). Nothing of
 * size T x T is ever stored per batch: the forward keeps one row of scores
 * per thread and saves each row's log-sum-exp; the backward recomputes the
 * probabilities from it. The bias gradient is the one T x T output. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"
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

/* y += a * x over head_dim; restrict lets these vectorise (the outputs of
 * one (query, key) step are distinct rows of distinct tensors) */
static inline void cpu_axpy(float *restrict y, float a, const float *restrict x, int n)
{
    for (int d = 0; d < n; d++)
        y[d] += a * x[d];
}

static int cpu_check_attention(regc_backend *be, const regc_attn_shape *s, const char *what)
{
    if (s->batch < 0 || s->tq < 0 || s->tk < 0 || s->n_head <= 0 || s->n_kv_head <= 0 ||
        s->head_dim <= 0 || s->n_head % s->n_kv_head != 0 || (s->causal && s->tq != s->tk)) {
        regc_cpu_set_failure(be, regc_error(REGC_ERR_SHAPE,
            "%s: bad shape batch=%lld tq=%lld tk=%lld heads=%d kv_heads=%d head_dim=%d causal=%d",
            what, (long long)s->batch, (long long)s->tq, (long long)s->tk, s->n_head,
            s->n_kv_head, s->head_dim, s->causal));
        return 0;
    }
    return 1;
}

/* Per-thread scratch stride in floats, padded to a cache line so threads
 * never share one. */
static size_t cpu_thread_stride(int64_t floats)
{
    return (size_t)((floats + 15) / 16 * 16);
}

void regc_cpu_attention_fwd(regc_backend *be, float *out, float *lse, const float *q,
                            const float *k, const float *v, const float *bias,
                            const regc_attn_shape *s)
{
    if (!cpu_check_attention(be, s, "attention_fwd"))
        return;
    const int threads = regc_cpu_threads(be);
    const int H = s->n_head, D = s->head_dim, rep = s->n_head / s->n_kv_head;
    const int64_t tq = s->tq, tk = s->tk;
    const int64_t q_ld = (int64_t)H * D, kv_ld = (int64_t)s->n_kv_head * D;
    const size_t stride = cpu_thread_stride(tk + D);
    float *scratch = regc_cpu_get_scratch(be, (size_t)threads * stride * sizeof(float));
    if (!scratch)
        return;
    const int64_t n_tasks = s->batch * H;

#pragma omp parallel num_threads(threads) if (n_tasks * tq * tk * D >= REGC_CPU_PAR_MIN)
    {
        float *p = scratch + (size_t)omp_get_thread_num() * stride; /* [tk] */
        float *acc = p + tk;                                         /* [D] */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < n_tasks; task++) {
            const int64_t b = task / H;
            const int h = (int)(task % H), g = h / rep;
            /* this head's keys and values: [tk, D] rows, kv_ld apart */
            const float *kb = k + b * tk * kv_ld + (int64_t)g * D;
            const float *vb = v + b * tk * kv_ld + (int64_t)g * D;
            for (int64_t i = 0; i < tq; i++) {
                const float *qi = q + (b * tq + i) * q_ld + (int64_t)h * D; /* [D] */
                float *oi = out + (b * tq + i) * q_ld + (int64_t)h * D;     /* [D] */
                float *lse_i = lse + (b * H + h) * tq + i;
                const int64_t n_keys = s->causal ? i + 1 : tk;
                if (n_keys == 0) { /* no key to attend to: define the output as zero */
                    memset(oi, 0, (size_t)D * sizeof(float));
                    *lse_i = -INFINITY;
                    continue;
                }
                float mx = -INFINITY;
                for (int64_t j = 0; j < n_keys; j++)
                    p[j] = s->scale * cpu_dot(qi, kb + j * kv_ld, D);
                if (bias) {
                    const float *bi = bias + ((int64_t)h * tq + i) * tk; /* [tk] */
                    for (int64_t j = 0; j < n_keys; j++)
                        p[j] += bi[j];
                }
                for (int64_t j = 0; j < n_keys; j++)
                    mx = p[j] > mx ? p[j] : mx;
                for (int64_t j = 0; j < n_keys; j++)
                    p[j] = regc_cpu_expf(p[j] - mx);
                double sum = 0.0;
                for (int64_t j = 0; j < n_keys; j++)
                    sum += p[j];
                memset(acc, 0, (size_t)D * sizeof(float));
                for (int64_t j = 0; j < n_keys; j++)
                    cpu_axpy(acc, p[j], vb + j * kv_ld, D);
                const float inv = (float)(1.0 / sum);
                for (int d = 0; d < D; d++)
                    oi[d] = acc[d] * inv;
                *lse_i = mx + (float)log(sum);
            }
        }
    }
}

/* dbias[h, i, j] = sum over b of dS[b, h, i, j], dS = P (dP - delta) taken
 * before the scale (the bias is added after it). One task per (head, query
 * row) owns that row of dbias and sums the batch in order, so no two threads
 * write one element and the bits do not depend on the thread count. The
 * probabilities are recomputed once more rather than kept: storing dS for
 * the whole batch would be the T x T per batch row this file avoids. */
static void cpu_attention_dbias(regc_backend *be, float *dbias, const float *dout,
                                const float *q, const float *k, const float *v,
                                const float *bias, const float *out, const float *lse,
                                const regc_attn_shape *s)
{
    const int H = s->n_head, D = s->head_dim, rep = H / s->n_kv_head;
    const int64_t tq = s->tq, tk = s->tk;
    const int64_t q_ld = (int64_t)H * D, kv_ld = (int64_t)s->n_kv_head * D;
    const int64_t n_tasks = (int64_t)H * tq;

#pragma omp parallel for num_threads(regc_cpu_threads(be)) \
    if (s->batch * n_tasks * tk * D >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t task = 0; task < n_tasks; task++) {
        const int h = (int)(task / tq), g = h / rep;
        const int64_t i = task % tq;
        const float *bi = bias + task * tk; /* [tk] of head h, query i */
        float *dbi = dbias + task * tk;     /* [tk] */
        memset(dbi, 0, (size_t)tk * sizeof(float));
        const int64_t n_keys = s->causal ? i + 1 : tk;
        for (int64_t b = 0; b < s->batch; b++) {
            const int64_t row = (b * tq + i) * q_ld + (int64_t)h * D;
            const float *qi = q + row, *oi = out + row, *doi = dout + row; /* [D] each */
            const float *kb = k + b * tk * kv_ld + (int64_t)g * D;
            const float *vb = v + b * tk * kv_ld + (int64_t)g * D;
            const float lse_i = lse[(b * H + h) * tq + i];
            const float delta = cpu_dot(doi, oi, D);
            for (int64_t j = 0; j < n_keys; j++) {
                const float pj =
                    regc_cpu_expf(s->scale * cpu_dot(qi, kb + j * kv_ld, D) + bi[j] - lse_i);
                dbi[j] += pj * (cpu_dot(doi, vb + j * kv_ld, D) - delta);
            }
        }
    }
}

void regc_cpu_attention_bwd(regc_backend *be, float *dq, float *dk, float *dv, float *dbias,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *bias, const float *out, const float *lse,
                            const regc_attn_shape *s)
{
    if (!cpu_check_attention(be, s, "attention_bwd"))
        return;
    if (dbias && !bias) {
        regc_cpu_set_failure(be, regc_error(REGC_ERR_ARG,
            "attention_bwd: a bias gradient was asked for without the bias"));
        return;
    }
    const int threads = regc_cpu_threads(be);
    const int H = s->n_head, Hkv = s->n_kv_head, D = s->head_dim, rep = H / Hkv;
    const int64_t tq = s->tq, tk = s->tk;
    const int64_t q_ld = (int64_t)H * D, kv_ld = (int64_t)Hkv * D;
    const float scale = s->scale;
    /* One task per (batch, kv head): it alone writes that head's dk and dv,
     * summing over the query heads that share it, and the dq of those query
     * heads, so no two threads ever touch the same output. */
    const int64_t n_tasks = s->batch * Hkv;

#pragma omp parallel for num_threads(threads) \
    if (n_tasks * tq * tk * D >= REGC_CPU_PAR_MIN) schedule(static)
    for (int64_t task = 0; task < n_tasks; task++) {
        const int64_t b = task / Hkv;
        const int g = (int)(task % Hkv);
        /* this kv head's rows, [tk, D] each, kv_ld apart */
        const float *kb = k + b * tk * kv_ld + (int64_t)g * D;
        const float *vb = v + b * tk * kv_ld + (int64_t)g * D;
        float *dkb = dk + b * tk * kv_ld + (int64_t)g * D;
        float *dvb = dv + b * tk * kv_ld + (int64_t)g * D;
        for (int64_t j = 0; j < tk; j++) {
            memset(dkb + j * kv_ld, 0, (size_t)D * sizeof(float));
            memset(dvb + j * kv_ld, 0, (size_t)D * sizeof(float));
        }
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            for (int64_t i = 0; i < tq; i++) {
                const int64_t row = (b * tq + i) * q_ld + (int64_t)h * D;
                const float *qi = q + row, *oi = out + row, *doi = dout + row; /* [D] each */
                float *dqi = dq + row;                                          /* [D] */
                memset(dqi, 0, (size_t)D * sizeof(float));
                const int64_t n_keys = s->causal ? i + 1 : tk;
                const float lse_i = lse[(b * H + h) * tq + i];
                const float delta = cpu_dot(doi, oi, D); /* rowsum(dO * O) */
                const float *bi = bias ? bias + ((int64_t)h * tq + i) * tk : NULL; /* [tk] */
                for (int64_t j = 0; j < n_keys; j++) {
                    const float *kj = kb + j * kv_ld, *vj = vb + j * kv_ld; /* [D] */
                    float *dkj = dkb + j * kv_ld, *dvj = dvb + j * kv_ld;   /* [D] */
                    const float sj = scale * cpu_dot(qi, kj, D);
                    const float pj = regc_cpu_expf((bi ? sj + bi[j] : sj) - lse_i);
                    const float dpj = cpu_dot(doi, vj, D);
                    const float dsj = scale * (pj * (dpj - delta));
                    cpu_axpy(dqi, dsj, kj, D);
                    cpu_axpy(dkj, dsj, qi, D);
                    cpu_axpy(dvj, pj, doi, D);
                }
            }
        }
    }
    if (dbias)
        cpu_attention_dbias(be, dbias, dout, q, k, v, bias, out, lse, s);
}
