/* cuda_attention_fwd.cu — attention's forward pass (the algorithm and the
 * tiling: cuda_attention.h): one block per batch row, head and query tile,
 * an online softmax over key tiles streamed through shared memory. */
#include "cuda_attention.h"

/* ---- forward */

/* One block per (batch row b, head h, query tile): out and lse of BQ query
 * rows. Query tiles run from the last so that a causal launch starts its
 * longest blocks first. */
template <int DM, int BQ, int BK>
static __global__ void __launch_bounds__(ATTN_THREADS, ATTN_MIN_BLOCKS)
    cuda_attention_fwd_kernel(float *out,        /* [batch, tq, n_head * D]; q, k, v and out
                                                    held in bf16 as s.bf16 names them */
                              float *lse,        /* [batch, n_head, tq] */
                              const float *q,    /* [batch, tq, n_head * D] */
                              const float *k,    /* [batch, tk, n_kv_head * D] */
                              const float *v,    /* [batch, tk, n_kv_head * D] */
                              const float *bias, /* [n_head, tq, tk] or NULL */
                              regc_attn_shape s)
{
    constexpr int LD = DM + 1, LDP = BK + 1;
    constexpr int RQ = BQ / ATTN_SIDE, CK = BK / ATTN_SIDE, CD = DM / ATTN_SIDE;
    float *qs = cuda_attn_smem; /* [BQ, LD] */
    float *ks = qs + BQ * LD;   /* [BK, LD] */
    float *vs = ks + BK * LD;   /* [BK, LD] */
    float *ps = vs + BK * LD;   /* [BQ, LDP] */
    float *p_own = cuda_own_element(ps, LDP);
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const int H = s.n_head, D = s.head_dim;
    const int q16 = (s.bf16 & REGC_ATTN_Q_BF16) != 0, k16 = (s.bf16 & REGC_ATTN_K_BF16) != 0;
    const int v16 = (s.bf16 & REGC_ATTN_V_BF16) != 0, o16 = (s.bf16 & REGC_ATTN_OUT_BF16) != 0;
    const int64_t tq = s.tq, tk = s.tk, q_ld = (int64_t)H * D, kv_ld = (int64_t)s.n_kv_head * D;
    const cuda_query_block blk = cuda_query_block_of<BQ>(s);
    const int64_t q0 = blk.q0, b = blk.b;
    const int h = blk.h;
    const cuda_head qh = cuda_head_of(q, q16, b, tq, q_ld, h, D);            /* [tq, D] */
    const cuda_head kh = cuda_head_of(k, k16, b, tk, kv_ld, blk.g, D);       /* [tk, D] */
    const cuda_head vh = cuda_head_of(v, v16, b, tk, kv_ld, blk.g, D);       /* [tk, D] */
    const float *bh = bias ? bias + (int64_t)h * tq * tk : (const float *)0; /* [tq, tk] */
    const bool drop = regc_attn_drops(&s);

    cuda_load_tile<BQ, DM>(qs, qh, q0, tq, D);
    float o[RQ][CD], m[RQ];
    double l[RQ]; /* the CPU sums each row in double */
#pragma unroll
    for (int r = 0; r < RQ; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0;
#pragma unroll
        for (int c = 0; c < CD; c++)
            o[r][c] = 0.0f;
    }
    /* a causal tile's last query sees no key past it */
    const int64_t k_end = s.causal ? (tk < q0 + BQ ? tk : q0 + BQ) : tk;
    for (int64_t k0 = 0; k0 < k_end; k0 += BK) {
        __syncthreads(); /* the previous tiles are read (and the Q tile stored) */
        cuda_load_tile<BK, DM>(ks, kh, k0, tk, D);
        cuda_load_tile<BK, DM>(vs, vh, k0, tk, D);
        __syncthreads();
        float sc[RQ][CK];
        cuda_dot_tile<RQ, CK>(sc, qs, ks, LD, D);
#pragma unroll
        for (int r = 0; r < RQ; r++) {
            const int64_t i = q0 + ty + ATTN_SIDE * r;
            /* the scaled, biased score, or -inf where the key is not seen */
            float mt = -INFINITY;
#pragma unroll
            for (int c = 0; c < CK; c++) {
                const int64_t j = k0 + tx + ATTN_SIDE * c;
                float x = -INFINITY;
                if (cuda_sees_key(b, i, j, s)) {
                    x = s.scale * sc[r][c];
                    if (s.softcap > 0.0f)
                        x = regc_softcap(x, s.softcap, NULL);
                    if (bh)
                        x = x + bh[i * tk + j];
                }
                sc[r][c] = x;
                mt = x > mt ? x : mt;
            }
            mt = cuda_max_row(mt);
            const float m_new = mt > m[r] ? mt : m[r];
            /* no key seen yet (m_new = -inf): nothing to add, nothing to
             * rescale; exp(-inf - -inf) would be NaN */
            float alpha = 1.0f;
            double part = 0.0;
            if (m_new != -INFINITY) {
                alpha = m[r] == -INFINITY ? 0.0f : regc_expf(m[r] - m_new);
#pragma unroll
                for (int c = 0; c < CK; c++) {
                    const float p = sc[r][c] == -INFINITY ? 0.0f : regc_expf(sc[r][c] - m_new);
                    sc[r][c] = p;
                    part += (double)p;
                }
            } else {
#pragma unroll
                for (int c = 0; c < CK; c++)
                    sc[r][c] = 0.0f;
            }
            part = cuda_sum_row(part);
            l[r] = l[r] * (double)alpha + part;
            m[r] = m_new;
#pragma unroll
            for (int c = 0; c < CD; c++)
                o[r][c] *= alpha;
            /* the sum is of every key's probability; P V reads the kept
             * ones, scaled (the CPU's order: p times its factor) */
            if (drop)
#pragma unroll
                for (int c = 0; c < CK; c++) {
                    const int64_t j = k0 + tx + ATTN_SIDE * c;
                    if (sc[r][c] != 0.0f)
                        sc[r][c] = sc[r][c] * regc_attn_keep(&s, b, h, i, j);
                }
#pragma unroll
            for (int c = 0; c < CK; c++)
                p_own[ATTN_SIDE * (r * LDP + c)] = sc[r][c];
        }
        __syncthreads(); /* P is whole */
        cuda_add_tile_pv<RQ, CD, BK>(o, ps, LDP, vs, LD);
    }
#pragma unroll
    for (int r = 0; r < RQ; r++) {
        const int64_t i = q0 + ty + ATTN_SIDE * r;
        if (i >= tq)
            continue;
        const int64_t oi = (b * tq + i) * q_ld + (int64_t)h * D; /* out's row: [D] */
        /* l is at least 1 once a key is seen (the maximum's own exp(0)) */
        const bool seen = l[r] > 0.0;
        const float inv = seen ? (float)(1.0 / l[r]) : 0.0f;
#pragma unroll
        for (int c = 0; c < CD; c++) {
            const int d = tx + ATTN_SIDE * c;
            if (d < D)
                regc_store_f32_or_bf16(out, o16, oi + d, seen ? o[r][c] * inv : 0.0f);
        }
        if (tx == 0)
            lse[(b * H + h) * tq + i] = seen ? m[r] + (float)regc_log(l[r]) : -INFINITY;
    }
}

template <int DM>
static void cuda_launch_attention_fwd(regc_backend *be, float *out, float *lse, const float *q,
                                      const float *k, const float *v, const float *bias,
                                      const regc_attn_shape *s)
{
    constexpr int BQ = cuda_attn_tiles<DM>::FWD_BQ, BK = cuda_attn_tiles<DM>::FWD_BK;
    constexpr size_t smem = cuda_fwd_smem(DM, BQ, BK);
    const int64_t blocks = s->batch * s->n_head * ((s->tq + BQ - 1) / BQ);
    if (!cuda_prepare_launch(be, cuda_attention_fwd_kernel<DM, BQ, BK>, smem, blocks,
                             "attention_fwd"))
        return;
    cuda_attention_fwd_kernel<DM, BQ, BK>
        <<<(unsigned)blocks, ATTN_THREADS, smem * sizeof(float), cuda_stream(be)>>>(out, lse, q, k,
                                                                                    v, bias, *s);
    cuda_note(be, cudaGetLastError(), "attention_fwd");
}

/* out: [batch, tq, n_head * D], lse: [batch, n_head, tq], q: [batch, tq,
 * n_head * D], k, v: [batch, tk, n_kv_head * D], bias: [n_head, tq, tk] or NULL */
static void cuda_attention_fwd(regc_backend *be, float *out, float *lse, const float *q,
                               const float *k, const float *v, const float *bias,
                               const regc_attn_shape *s)
{
    if (!cuda_check_attention(be, s, bias, "attention_fwd"))
        return;
    if (s->batch == 0 || s->tq == 0)
        return;
    const int D = s->head_dim;
    if (D <= 32)
        cuda_launch_attention_fwd<32>(be, out, lse, q, k, v, bias, s);
    else if (D <= 64)
        cuda_launch_attention_fwd<64>(be, out, lse, q, k, v, bias, s);
    else if (D <= 128)
        cuda_launch_attention_fwd<128>(be, out, lse, q, k, v, bias, s);
    else
        cuda_launch_attention_fwd<256>(be, out, lse, q, k, v, bias, s);
}

void regc_cuda_set_attention_fwd(regc_backend *be) { be->attention_fwd = cuda_attention_fwd; }
