/* cuda_attention_bwd.cu — attention's backward pass (the algorithm and the
 * tiling: cuda_attention.h): delta, then dK and dV, dQ and the bias
 * gradient in kernels of their own, each output element one thread's chain
 * of adds in an order fixed by the shape, so nothing is summed by atomics. */
#include "cuda_attention.h"

/* ---- backward */

/* cpu_dot's sum: eight partial chains, then a fixed tree (a: [n]; b: [n]
 * from b_off, held in bf16 where b_bf16) */
static __device__ float cuda_dot_row(const float *a, const float *b, int b_bf16, int64_t b_off,
                                     int n)
{
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int d = 0;
    for (; d + 8 <= n; d += 8)
#pragma unroll
        for (int u = 0; u < 8; u++)
            acc[u] += a[d + u] * regc_load_f32_or_bf16(b, b_bf16, b_off + d + u);
    for (; d < n; d++)
        acc[0] += a[d] * regc_load_f32_or_bf16(b, b_bf16, b_off + d);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* delta[b, h, i] = rowsum(dout * out) over head_dim, one thread per row
 * (rows = batch * tq * n_head, in the layout of q); out held in bf16 where
 * out_bf16, each value widened exactly. */
static __global__ void cuda_attention_delta_kernel(float *delta,      /* [batch, n_head, tq] */
                                                   const float *dout, /* [batch, tq, n_head * D] */
                                                   const float *out,  /* [batch, tq, n_head * D] */
                                                   int out_bf16, int64_t rows, int64_t tq, int H,
                                                   int D)
{
    const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* (b * tq + i) * H + h */
    if (row >= rows)
        return;
    const int h = (int)(row % H);
    const int64_t i = row / H % tq, b = row / H / tq;
    delta[(b * H + h) * tq + i] = cuda_dot_row(dout + row * D, out, out_bf16, row * D, D);
}

/* p = exp(s - lse) and ds = p (dp - delta) of the thread's tile of batch
 * row b and head h, s the scaled and biased score; zeros where the key is
 * not seen. With dropout, dp is first multiplied by the element's factor z
 * and p becomes p z, what dV reads (the CPU's operations in its order). */
template <int R, int C>
static __device__ __forceinline__ void cuda_form_ds(float (&sc)[R][C], float (&dp)[R][C],
                                                    int64_t q0, int64_t k0, int64_t b, int h,
                                                    const float *lse_h,   /* [tq] */
                                                    const float *delta_h, /* [tq] */
                                                    const float *bh,      /* [tq, tk] or NULL */
                                                    const regc_attn_shape &s)
{
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const bool drop = regc_attn_drops(&s);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t i = q0 + ty + ATTN_SIDE * r;
        const float li = i < s.tq ? lse_h[i] : 0.0f;
        const float di = i < s.tq ? delta_h[i] : 0.0f;
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int64_t j = k0 + tx + ATTN_SIDE * c;
            float p = 0.0f, ds = 0.0f;
            if (cuda_sees_key(b, i, j, s)) {
                float x = s.scale * sc[r][c], slope = 1.0f;
                if (s.softcap > 0.0f)
                    x = regc_softcap(x, s.softcap, &slope);
                if (bh)
                    x = x + bh[i * s.tk + j];
                p = regc_expf(x - li);
                const float z = drop ? regc_attn_keep(&s, b, h, i, j) : 1.0f;
                ds = p * ((drop ? dp[r][c] * z : dp[r][c]) - di);
                if (s.softcap > 0.0f) /* the CPU's order: (p (dp - delta)) slope */
                    ds = ds * slope;
                if (drop)
                    p = p * z;
            }
            sc[r][c] = p;
            dp[r][c] = ds;
        }
    }
}

/* One block per (batch row b, kv head g, key tile): dK and dV of BK key
 * rows. For each query head of the group in order, and each query tile in
 * order, P and scale * dS go through shared memory and are summed into the
 * head's partials; the partials are added to the totals after each head, as
 * the CPU adds each head's sum. */
template <int DM, int BQ, int BK>
static __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)
    cuda_attention_dkdv_kernel(float *dk,          /* [batch, tk, n_kv_head * D] */
                               float *dv,          /* [batch, tk, n_kv_head * D] */
                               const float *dout,  /* [batch, tq, n_head * D] */
                               const float *q,     /* [batch, tq, n_head * D] */
                               const float *k,     /* [batch, tk, n_kv_head * D] */
                               const float *v,     /* [batch, tk, n_kv_head * D] */
                               const float *bias,  /* [n_head, tq, tk] or NULL */
                               const float *lse,   /* [batch, n_head, tq] */
                               const float *delta, /* [batch, n_head, tq] */
                               regc_attn_shape s)
{
    constexpr int LD = DM + 1, LDP = BK + 1;
    constexpr int RQ = BQ / ATTN_SIDE, CK = BK / ATTN_SIDE;
    constexpr int RK = BK / ATTN_SIDE, CD = DM / ATTN_SIDE;
    float *ks = cuda_attn_smem; /* [BK, LD] */
    float *vs = ks + BK * LD;   /* [BK, LD] */
    float *qs = vs + BK * LD;   /* [BQ, LD] */
    float *dos = qs + BQ * LD;  /* [BQ, LD] */
    float *ps = dos + BQ * LD;  /* [BQ, LDP] */
    float *dss = ps + BQ * LDP; /* [BQ, LDP] */
    float *p_own = cuda_own_element(ps, LDP), *ds_own = cuda_own_element(dss, LDP);
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const int H = s.n_head, Hkv = s.n_kv_head, D = s.head_dim, rep = H / Hkv;
    const int q16 = (s.bf16 & REGC_ATTN_Q_BF16) != 0, k16 = (s.bf16 & REGC_ATTN_K_BF16) != 0;
    const int v16 = (s.bf16 & REGC_ATTN_V_BF16) != 0;
    const int64_t tq = s.tq, tk = s.tk, q_ld = (int64_t)H * D, kv_ld = (int64_t)Hkv * D;
    const int n_kt = (int)((tk + BK - 1) / BK), blk = (int)blockIdx.x; /* as in the forward */
    const int64_t k0 = (int64_t)(blk % n_kt) * BK;
    const int g = blk / n_kt % Hkv;
    const int64_t b = blk / n_kt / Hkv;
    const cuda_head kh = cuda_head_of(k, k16, b, tk, kv_ld, g, D); /* [tk, D] */
    const cuda_head vh = cuda_head_of(v, v16, b, tk, kv_ld, g, D); /* [tk, D] */

    cuda_load_tile<BK, DM>(ks, kh, k0, tk, D);
    cuda_load_tile<BK, DM>(vs, vh, k0, tk, D);
    float dk_sum[RK][CD], dv_sum[RK][CD];
#pragma unroll
    for (int r = 0; r < RK; r++)
#pragma unroll
        for (int c = 0; c < CD; c++)
            dk_sum[r][c] = dv_sum[r][c] = 0.0f;
    /* the first query tile holding a query that sees key k0 */
    const int64_t q_first = s.causal ? k0 / BQ * BQ : 0;
    for (int h = g * rep, h_end = h + rep; h < h_end; h++) {
        const cuda_head qh = cuda_head_of(q, q16, b, tq, q_ld, h, D);            /* [tq, D] */
        const cuda_head doh = cuda_head_of(dout, 0, b, tq, q_ld, h, D);          /* [tq, D] */
        const float *lse_h = lse + (b * H + h) * tq;                             /* [tq] */
        const float *delta_h = delta + (b * H + h) * tq;                         /* [tq] */
        const float *bh = bias ? bias + (int64_t)h * tq * tk : (const float *)0; /* [tq, tk] */
        float dk_head[RK][CD], dv_head[RK][CD];
#pragma unroll
        for (int r = 0; r < RK; r++)
#pragma unroll
            for (int c = 0; c < CD; c++)
                dk_head[r][c] = dv_head[r][c] = 0.0f;
        for (int64_t q0 = q_first; q0 < tq; q0 += BQ) {
            __syncthreads(); /* the previous tiles are read (and K, V stored) */
            cuda_load_tile<BQ, DM>(qs, qh, q0, tq, D);
            cuda_load_tile<BQ, DM>(dos, doh, q0, tq, D);
            __syncthreads();
            float sc[RQ][CK], dp[RQ][CK];
            cuda_dot_tile<RQ, CK>(sc, qs, ks, LD, D);
            cuda_dot_tile<RQ, CK>(dp, dos, vs, LD, D);
            cuda_form_ds<RQ, CK>(sc, dp, q0, k0, b, h, lse_h, delta_h, bh, s);
#pragma unroll
            for (int r = 0; r < RQ; r++)
#pragma unroll
                for (int c = 0; c < CK; c++) {
                    const int e = ATTN_SIDE * (r * LDP + c);
                    p_own[e] = sc[r][c];
                    ds_own[e] = s.scale * dp[r][c]; /* scaled before the sum, as on the CPU */
                }
            __syncthreads(); /* P and dS are whole */
            cuda_add_tile_ptx<RK, CD, BQ>(dv_head, ps, LDP, dos, LD);
            cuda_add_tile_ptx<RK, CD, BQ>(dk_head, dss, LDP, qs, LD);
        }
#pragma unroll
        for (int r = 0; r < RK; r++)
#pragma unroll
            for (int c = 0; c < CD; c++) {
                dk_sum[r][c] += dk_head[r][c];
                dv_sum[r][c] += dv_head[r][c];
            }
    }
#pragma unroll
    for (int r = 0; r < RK; r++) {
        const int64_t j = k0 + ty + ATTN_SIDE * r;
        if (j >= tk)
            continue;
        float *dkj = dk + (b * tk + j) * kv_ld + (int64_t)g * D; /* [D] */
        float *dvj = dv + (b * tk + j) * kv_ld + (int64_t)g * D; /* [D] */
#pragma unroll
        for (int c = 0; c < CD; c++) {
            const int d = tx + ATTN_SIDE * c;
            if (d < D) {
                dkj[d] = dk_sum[r][c];
                dvj[d] = dv_sum[r][c];
            }
        }
    }
}

/* One block per (batch row b, head h, query tile): dQ of BQ query rows, the
 * key tiles in order (the longest causal blocks first, as in the forward). */
template <int DM, int BQ, int BK>
static __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)
    cuda_attention_dq_kernel(float *dq,          /* [batch, tq, n_head * D] */
                             const float *dout,  /* [batch, tq, n_head * D] */
                             const float *q,     /* [batch, tq, n_head * D] */
                             const float *k,     /* [batch, tk, n_kv_head * D] */
                             const float *v,     /* [batch, tk, n_kv_head * D] */
                             const float *bias,  /* [n_head, tq, tk] or NULL */
                             const float *lse,   /* [batch, n_head, tq] */
                             const float *delta, /* [batch, n_head, tq] */
                             regc_attn_shape s)
{
    constexpr int LD = DM + 1, LDP = BK + 1;
    constexpr int RQ = BQ / ATTN_SIDE, CK = BK / ATTN_SIDE, CD = DM / ATTN_SIDE;
    float *qs = cuda_attn_smem; /* [BQ, LD] */
    float *dos = qs + BQ * LD;  /* [BQ, LD] */
    float *ks = dos + BQ * LD;  /* [BK, LD] */
    float *vs = ks + BK * LD;   /* [BK, LD] */
    float *dss = vs + BK * LD;  /* [BQ, LDP] */
    float *ds_own = cuda_own_element(dss, LDP);
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const int H = s.n_head, D = s.head_dim;
    const int q16 = (s.bf16 & REGC_ATTN_Q_BF16) != 0, k16 = (s.bf16 & REGC_ATTN_K_BF16) != 0;
    const int v16 = (s.bf16 & REGC_ATTN_V_BF16) != 0;
    const int64_t tq = s.tq, tk = s.tk, q_ld = (int64_t)H * D, kv_ld = (int64_t)s.n_kv_head * D;
    const cuda_query_block blk = cuda_query_block_of<BQ>(s);
    const int64_t q0 = blk.q0, b = blk.b;
    const int h = blk.h;
    const cuda_head qh = cuda_head_of(q, q16, b, tq, q_ld, h, D);            /* [tq, D] */
    const cuda_head doh = cuda_head_of(dout, 0, b, tq, q_ld, h, D);          /* [tq, D] */
    const cuda_head kh = cuda_head_of(k, k16, b, tk, kv_ld, blk.g, D);       /* [tk, D] */
    const cuda_head vh = cuda_head_of(v, v16, b, tk, kv_ld, blk.g, D);       /* [tk, D] */
    const float *lse_h = lse + (b * H + h) * tq;                             /* [tq] */
    const float *delta_h = delta + (b * H + h) * tq;                         /* [tq] */
    const float *bh = bias ? bias + (int64_t)h * tq * tk : (const float *)0; /* [tq, tk] */

    cuda_load_tile<BQ, DM>(qs, qh, q0, tq, D);
    cuda_load_tile<BQ, DM>(dos, doh, q0, tq, D);
    float acc[RQ][CD];
#pragma unroll
    for (int r = 0; r < RQ; r++)
#pragma unroll
        for (int c = 0; c < CD; c++)
            acc[r][c] = 0.0f;
    const int64_t k_end = s.causal ? (tk < q0 + BQ ? tk : q0 + BQ) : tk;
    for (int64_t k0 = 0; k0 < k_end; k0 += BK) {
        __syncthreads(); /* the previous tiles are read (and Q, dO stored) */
        cuda_load_tile<BK, DM>(ks, kh, k0, tk, D);
        cuda_load_tile<BK, DM>(vs, vh, k0, tk, D);
        __syncthreads();
        float sc[RQ][CK], dp[RQ][CK];
        cuda_dot_tile<RQ, CK>(sc, qs, ks, LD, D);
        cuda_dot_tile<RQ, CK>(dp, dos, vs, LD, D);
        cuda_form_ds<RQ, CK>(sc, dp, q0, k0, b, h, lse_h, delta_h, bh, s);
#pragma unroll
        for (int r = 0; r < RQ; r++)
#pragma unroll
            for (int c = 0; c < CK; c++)
                ds_own[ATTN_SIDE * (r * LDP + c)] = s.scale * dp[r][c];
        __syncthreads(); /* dS is whole */
        cuda_add_tile_pv<RQ, CD, BK>(acc, dss, LDP, ks, LD);
    }
#pragma unroll
    for (int r = 0; r < RQ; r++) {
        const int64_t i = q0 + ty + ATTN_SIDE * r;
        if (i >= tq)
            continue;
        float *dqi = dq + (b * tq + i) * q_ld + (int64_t)h * D; /* [D] */
#pragma unroll
        for (int c = 0; c < CD; c++) {
            const int d = tx + ATTN_SIDE * c;
            if (d < D)
                dqi[d] = acc[r][c];
        }
    }
}

/* One block per (head h, query tile, key tile): dbias[h] over that tile,
 * dS (unscaled: the bias is added after the scale) summed over the batch in
 * order 0..batch-1 by the one thread that owns each element. A causal tile
 * wholly above the diagonal is zero, as is everything when batch is 0. */
template <int DM, int BQ, int BK>
static __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)
    cuda_attention_dbias_kernel(float *dbias,       /* [n_head, tq, tk] */
                                const float *dout,  /* [batch, tq, n_head * D] */
                                const float *q,     /* [batch, tq, n_head * D] */
                                const float *k,     /* [batch, tk, n_kv_head * D] */
                                const float *v,     /* [batch, tk, n_kv_head * D] */
                                const float *bias,  /* [n_head, tq, tk] */
                                const float *lse,   /* [batch, n_head, tq] */
                                const float *delta, /* [batch, n_head, tq] */
                                regc_attn_shape s)
{
    constexpr int LD = DM + 1;
    constexpr int RQ = BQ / ATTN_SIDE, CK = BK / ATTN_SIDE;
    float *qs = cuda_attn_smem; /* [BQ, LD] */
    float *dos = qs + BQ * LD;  /* [BQ, LD] */
    float *ks = dos + BQ * LD;  /* [BK, LD] */
    float *vs = ks + BK * LD;   /* [BK, LD] */
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const int H = s.n_head, D = s.head_dim;
    const int q16 = (s.bf16 & REGC_ATTN_Q_BF16) != 0, k16 = (s.bf16 & REGC_ATTN_K_BF16) != 0;
    const int v16 = (s.bf16 & REGC_ATTN_V_BF16) != 0;
    const int64_t tq = s.tq, tk = s.tk, q_ld = (int64_t)H * D, kv_ld = (int64_t)s.n_kv_head * D;
    const int n_kt = (int)((tk + BK - 1) / BK), n_qt = (int)((tq + BQ - 1) / BQ);
    const int blk = (int)blockIdx.x; /* as in the forward */
    const int64_t k0 = (int64_t)(blk % n_kt) * BK;
    const int64_t q0 = (int64_t)(blk / n_kt % n_qt) * BQ;
    const int h = blk / n_kt / n_qt;
    const int g = h / (H / s.n_kv_head);
    const float *bh = bias + (int64_t)h * tq * tk; /* [tq, tk] */

    float acc[RQ][CK];
#pragma unroll
    for (int r = 0; r < RQ; r++)
#pragma unroll
        for (int c = 0; c < CK; c++)
            acc[r][c] = 0.0f;
    /* uniform over the block, so every thread takes the same barriers */
    const int64_t n_batch = s.causal && k0 > q0 + BQ - 1 ? 0 : s.batch;
    for (int64_t b = 0; b < n_batch; b++) {
        __syncthreads(); /* the previous batch row's tiles are read */
        cuda_load_tile<BQ, DM>(qs, cuda_head_of(q, q16, b, tq, q_ld, h, D), q0, tq, D);
        cuda_load_tile<BQ, DM>(dos, cuda_head_of(dout, 0, b, tq, q_ld, h, D), q0, tq, D);
        cuda_load_tile<BK, DM>(ks, cuda_head_of(k, k16, b, tk, kv_ld, g, D), k0, tk, D);
        cuda_load_tile<BK, DM>(vs, cuda_head_of(v, v16, b, tk, kv_ld, g, D), k0, tk, D);
        __syncthreads();
        float sc[RQ][CK], dp[RQ][CK];
        cuda_dot_tile<RQ, CK>(sc, qs, ks, LD, D);
        cuda_dot_tile<RQ, CK>(dp, dos, vs, LD, D);
        cuda_form_ds<RQ, CK>(sc, dp, q0, k0, b, h, lse + (b * H + h) * tq, delta + (b * H + h) * tq,
                             bh, s);
#pragma unroll
        for (int r = 0; r < RQ; r++)
#pragma unroll
            for (int c = 0; c < CK; c++)
                acc[r][c] += dp[r][c];
    }
#pragma unroll
    for (int r = 0; r < RQ; r++) {
        const int64_t i = q0 + ty + ATTN_SIDE * r;
        if (i >= tq)
            continue;
#pragma unroll
        for (int c = 0; c < CK; c++) {
            const int64_t j = k0 + tx + ATTN_SIDE * c;
            if (j < tk)
                dbias[((int64_t)h * tq + i) * tk + j] = acc[r][c];
        }
    }
}

/* The three gradient kernels, after delta is written. Each grid that would
 * be empty is skipped; a kernel whose loop has nothing to sum writes zeros
 * (dK, dV with tq = 0; dQ with tk = 0; dbias with batch = 0), as the CPU. */
template <int DM>
static void cuda_launch_attention_bwd(regc_backend *be, float *dq, float *dk, float *dv,
                                      float *dbias, const float *dout, const float *q,
                                      const float *k, const float *v, const float *bias,
                                      const float *lse, const float *delta,
                                      const regc_attn_shape *s)
{
    constexpr int BQ = cuda_attn_tiles<DM>::BWD_BQ, BK = cuda_attn_tiles<DM>::BWD_BK;
    const int64_t n_qt = (s->tq + BQ - 1) / BQ, n_kt = (s->tk + BK - 1) / BK;
    const cudaStream_t st = cuda_stream(be);

    const int64_t kv_blocks = s->batch * s->n_kv_head * n_kt;
    constexpr size_t kv_smem = cuda_dkdv_smem(DM, BQ, BK);
    if (kv_blocks > 0) {
        if (!cuda_prepare_launch(be, cuda_attention_dkdv_kernel<DM, BQ, BK>, kv_smem, kv_blocks,
                                 "attention_bwd dk dv"))
            return;
        cuda_attention_dkdv_kernel<DM, BQ, BK>
            <<<(unsigned)kv_blocks, ATTN_THREADS, kv_smem * sizeof(float), st>>>(
                dk, dv, dout, q, k, v, bias, lse, delta, *s);
        cuda_note(be, cudaGetLastError(), "attention_bwd dk dv");
    }

    const int64_t q_blocks = s->batch * s->n_head * n_qt;
    constexpr size_t q_smem = cuda_dq_smem(DM, BQ, BK);
    if (q_blocks > 0) {
        if (!cuda_prepare_launch(be, cuda_attention_dq_kernel<DM, BQ, BK>, q_smem, q_blocks,
                                 "attention_bwd dq"))
            return;
        cuda_attention_dq_kernel<DM, BQ, BK>
            <<<(unsigned)q_blocks, ATTN_THREADS, q_smem * sizeof(float), st>>>(
                dq, dout, q, k, v, bias, lse, delta, *s);
        cuda_note(be, cudaGetLastError(), "attention_bwd dq");
    }

    const int64_t bias_blocks = dbias ? (int64_t)s->n_head * n_qt * n_kt : 0;
    constexpr size_t bias_smem = cuda_dbias_smem(DM, BQ, BK);
    if (bias_blocks > 0) {
        if (!cuda_prepare_launch(be, cuda_attention_dbias_kernel<DM, BQ, BK>, bias_smem,
                                 bias_blocks, "attention_bwd dbias"))
            return;
        cuda_attention_dbias_kernel<DM, BQ, BK>
            <<<(unsigned)bias_blocks, ATTN_THREADS, bias_smem * sizeof(float), st>>>(
                dbias, dout, q, k, v, bias, lse, delta, *s);
        cuda_note(be, cudaGetLastError(), "attention_bwd dbias");
    }
}

/* dq: [batch, tq, n_head * D], dk, dv: [batch, tk, n_kv_head * D], dbias:
 * [n_head, tq, tk] or NULL, dout, q, out: [batch, tq, n_head * D], k, v:
 * [batch, tk, n_kv_head * D], bias: [n_head, tq, tk] or NULL, lse: [batch,
 * n_head, tq] */
static void cuda_attention_bwd(regc_backend *be, float *dq, float *dk, float *dv, float *dbias,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *bias, const float *out, const float *lse,
                               const regc_attn_shape *s)
{
    if (!cuda_check_attention(be, s, bias, "attention_bwd"))
        return;
    if (dbias && !bias) {
        cuda_refuse(be, REGC_ERR_ARG,
                    "attention_bwd: a bias gradient was asked for without the bias");
        return;
    }
    const int64_t rows = s->batch * s->tq * s->n_head;
    float *delta = NULL; /* [batch, n_head, tq]; read only when there are rows */
    if (rows > 0) {
        delta = (float *)cuda_scratch_alloc(be, (size_t)rows * sizeof(float), "attention_bwd");
        if (!delta)
            return;
        cuda_attention_delta_kernel<<<cuda_blocks_for(rows), CUDA_THREADS, 0, cuda_stream(be)>>>(
            delta, dout, out, (s->bf16 & REGC_ATTN_OUT_BF16) != 0, rows, s->tq, s->n_head,
            s->head_dim);
        cuda_note(be, cudaGetLastError(), "attention_bwd delta");
    }
    const int D = s->head_dim;
    if (D <= 32)
        cuda_launch_attention_bwd<32>(be, dq, dk, dv, dbias, dout, q, k, v, bias, lse, delta, s);
    else if (D <= 64)
        cuda_launch_attention_bwd<64>(be, dq, dk, dv, dbias, dout, q, k, v, bias, lse, delta, s);
    else if (D <= 128)
        cuda_launch_attention_bwd<128>(be, dq, dk, dv, dbias, dout, q, k, v, bias, lse, delta, s);
    else
        cuda_launch_attention_bwd<256>(be, dq, dk, dv, dbias, dout, q, k, v, bias, lse, delta, s);
    cuda_scratch_free(be, delta, "attention_bwd");
}

void regc_cuda_set_attention_bwd(regc_backend *be) { be->attention_bwd = cuda_attention_bwd; }
