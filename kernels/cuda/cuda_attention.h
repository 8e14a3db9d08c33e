/* cuda_attention.h — private to the CUDA backend: what the attention
 * kernels' two files share (cuda_attention_fwd.cu, cuda_attention_bwd.cu):
 * the tiling, the tile sizes, the device pieces every kernel is built from,
 * and the host's shape checks and launch set-up.
 *
 * Softmax attention, forward and backward, in the manner of FlashAttention-2 in fp32 on the CUDA
 * cores, with the CPU backend's semantics (cpu_attention.c): grouped query heads, an optional
 * causal mask, sliding window and documents' starts, optional soft-capping of the scaled scores
 * (regc_softcap) and an optional additive score bias [n_head, tq, tk] shared by the batch (T5),
 * whose gradient is summed over the batch, and an optional dropout on the probabilities, each
 * element's factor drawn where it is used (regc_attn_keep: the CPU's draw), in the forward after
 * the row's sum and in every backward kernel again. Nothing of size T x T is stored per batch row;
 * the bias gradient is the one T x T output.
 *
 * Tiling. A block is 256 threads seen as a 16 x 16 grid (ty, tx). Tiles of
 * queries (BQ rows) and keys (BK rows) are staged in shared memory, each row
 * padded to DM + 1 floats (DM, the head_dim bound the kernel is built for:
 * 32, 64, 128 or 256) so that the strided reads below fall in distinct banks;
 * columns past head_dim and rows past the sequence are zero. A thread owns the
 * elements (ty + 16 r, tx + 16 c) of every tile it computes: scores [BQ, BK]
 * and outputs [rows, DM]. A row's 16 owners share a half-warp, so row maxima
 * and sums are butterflies of shuffles. Tile sizes per DM are in
 * cuda_attn_tiles; shared memory per block stays under 99 KB (sm_80 and later).
 * A head_dim over 256 is refused.
 *
 * Forward (one block per batch row, head and query tile): the query tile
 * stays resident while key/value tiles stream past; each tile's scores get
 * the scale, the bias and the mask, then the online softmax: a running row
 * maximum m, the running sum l (in double) and the output accumulator, both
 * rescaled by exp(m_old - m_new) when the maximum grows. At the end out =
 * acc / l and lse = m + log(l), the CPU's definition; a row that sees no key
 * (tk == 0) gets zeros and lse = -inf, as on the CPU. Causal blocks stop at
 * the diagonal tile.
 *
 * Backward: delta = rowsum(dout * out) per query row (cpu_dot's order), then
 * three kernels that each recompute P = exp(s - lse) and
 * dS = P (dP - delta), dP = dO V^T, from the saved lse:
 * - dK, dV: one block per (batch row, kv head, key tile), with K and V
 *   resident, looping over the group's query heads in order and, for each,
 *   over the query tiles in order: dV += P^T dO, dK += (scale dS)^T Q;
 * - dQ: one block per (batch row, head, query tile), looping over key tiles
 *   in order: dQ += (scale dS) K;
 * - dbias: one block per (head, query tile, key tile), looping over the batch
 *   in order 0..batch-1: dbias += dS.
 * Every output element has one owning thread, which forms it as one chain of
 * float adds in an order fixed by the shape alone: no atomics, no reduction
 * whose order depends on scheduling, so two runs give the same bits.
 *
 * Against the CPU: the scores are the CPU's chains over head_dim in order,
 * and the backward forms every sum in the CPU's order (delta as cpu_dot; dQ
 * one chain over the keys; dK and dV one chain over the queries per query
 * head, the heads' partials then added in order; dbias over the batch in
 * order), so from the same out and lse its gradients are the CPU's bits. The
 * forward's are not: the online softmax rescales partial sums the CPU never
 * forms and sums each row of probabilities in another order, so out and lse,
 * and the gradients computed from them, differ from the CPU's in the last
 * bits: tests compare within a tolerance, not bitwise. */
#ifndef REGC_CUDA_ATTENTION_H
#define REGC_CUDA_ATTENTION_H

#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "cuda_internal.h"
#include "kernel_checks.h"

#define ATTN_THREADS 256 /* a 16 x 16 grid of threads */
#define ATTN_SIDE 16     /* threads along each side of the grid */
#define ATTN_MAX_HEAD_DIM 256
/* The attention kernels' minimum blocks per SM, stated: without it ptxas
 * aims at a smaller register budget and spills a few bytes in some
 * instances; with it none does. */
#define ATTN_MIN_BLOCKS 1

/* Query and key tile rows per head_dim bound: the larger bounds take smaller
 * tiles so every kernel's shared memory stays under 99 KB (sm_86's limit;
 * the largest is the dK/dV kernel at DM 64, 97.5 KB) and its per-thread tiles
 * in registers. Every tile is a multiple of ATTN_SIDE. */
template <int DM> struct cuda_attn_tiles;
template <> struct cuda_attn_tiles<32> {
    static constexpr int FWD_BQ = 64, FWD_BK = 64, BWD_BQ = 64, BWD_BK = 64;
};
template <> struct cuda_attn_tiles<64> {
    static constexpr int FWD_BQ = 64, FWD_BK = 64, BWD_BQ = 64, BWD_BK = 64;
};
template <> struct cuda_attn_tiles<128> {
    static constexpr int FWD_BQ = 64, FWD_BK = 32, BWD_BQ = 32, BWD_BK = 32;
};
template <> struct cuda_attn_tiles<256> {
    static constexpr int FWD_BQ = 32, FWD_BK = 16, BWD_BQ = 16, BWD_BK = 16;
};

/* Shared memory of each kernel, in floats: tiles of DM + 1 columns for Q,
 * K, V and dO, of BK + 1 for P and dS. */
static constexpr size_t cuda_fwd_smem(int dm, int bq, int bk)
{
    return (size_t)(bq + 2 * bk) * (dm + 1) + (size_t)bq * (bk + 1);
}
static constexpr size_t cuda_dkdv_smem(int dm, int bq, int bk)
{
    return (size_t)(2 * bq + 2 * bk) * (dm + 1) + (size_t)2 * bq * (bk + 1);
}
static constexpr size_t cuda_dq_smem(int dm, int bq, int bk)
{
    return (size_t)(2 * bq + 2 * bk) * (dm + 1) + (size_t)bq * (bk + 1);
}
static constexpr size_t cuda_dbias_smem(int dm, int bq, int bk)
{
    return (size_t)(2 * bq + 2 * bk) * (dm + 1);
}

extern __shared__ float cuda_attn_smem[]; /* each kernel's tiles, carved below */

/* ---- the pieces every kernel is built from */

/* Head `head`'s rows of a [batch, t, heads * D] tensor in batch row b,
 * held in fp32, or in bf16 where bf16 (regc_attn_shape.bf16): element
 * (r, d) at x[off + r * ld + d]. */
struct cuda_head {
    const void *x;
    int64_t off, ld;
    int bf16;
};

static __device__ __forceinline__ cuda_head cuda_head_of(const float *x, int bf16, int64_t b,
                                                         int64_t t, int64_t ld, int head, int D)
{
    return cuda_head{x, b * t * ld + (int64_t)head * D, ld, bf16};
}

/* tile[r, d] = src(row0 + r, d) for row0 + r < n_rows and d < D, widened
 * exactly where src is bf16, zero elsewhere, so padded rows and columns
 * read as finite zeros (tile: [ROWS, DM + 1]; src: [n_rows, D]).
 * Consecutive threads take consecutive d: the global reads coalesce. */
template <int ROWS, int DM>
static __device__ __forceinline__ void cuda_load_tile(float *tile, const cuda_head &src,
                                                      int64_t row0, int64_t n_rows, int D)
{
#pragma unroll 4
    for (int e = threadIdx.x; e < ROWS * DM; e += ATTN_THREADS) {
        const int r = e / DM, d = e % DM;
        const int64_t row = row0 + r;
        /* the padded offset r * (DM + 1) + d is e + r */
        tile[e + r] = row < n_rows && d < D
                          ? regc_load_f32_or_bf16(src.x, src.bf16, src.off + row * src.ld + d)
                          : 0.0f;
    }
}

/* acc[r][c] = sum over d < n, in order, of a[ty + 16 r, d] * b[tx + 16 c, d]
 * (a: [.., ld], b: [.., ld]): the thread's scores, each one chain over d as
 * the CPU's cpu_attn_row_scores forms it. The ld of DM + 1 is odd, so the 16
 * rows of b a half-warp reads lie in 16 banks. */
template <int R, int C>
static __device__ __forceinline__ void cuda_dot_tile(float (&acc)[R][C], const float *a,
                                                     const float *b, int ld, int n)
{
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < C; c++)
            acc[r][c] = 0.0f;
    const float *ad = a + ty * ld, *bd = b + tx * ld; /* a[ty, d], b[tx, d] */
#pragma unroll 4
    for (int d = 0; d < n; d++, ad++, bd++) {
        float av[R], bv[C];
#pragma unroll
        for (int r = 0; r < R; r++)
            av[r] = ad[ATTN_SIDE * r * ld];
#pragma unroll
        for (int c = 0; c < C; c++)
            bv[c] = bd[ATTN_SIDE * c * ld];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < C; c++)
                acc[r][c] += av[r] * bv[c];
    }
}

/* acc[r][c] += sum over j < N, in order, of p[ty + 16 r, j] * x[j, tx + 16 c]
 * (p: [.., ldp], x: [N, ldx]): rows of P V and of dS K. */
template <int R, int C, int N>
static __device__ __forceinline__ void cuda_add_tile_pv(float (&acc)[R][C], const float *p, int ldp,
                                                        const float *x, int ldx)
{
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const float *pj = p + ty * ldp, *xj = x + tx; /* p[ty, j], x[j, tx] */
#pragma unroll 4
    for (int j = 0; j < N; j++, pj++, xj += ldx) {
        float pv[R], xv[C];
#pragma unroll
        for (int r = 0; r < R; r++)
            pv[r] = pj[ATTN_SIDE * r * ldp];
#pragma unroll
        for (int c = 0; c < C; c++)
            xv[c] = xj[ATTN_SIDE * c];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < C; c++)
                acc[r][c] += pv[r] * xv[c];
    }
}

/* acc[r][c] += sum over i < N, in order, of p[i, ty + 16 r] * x[i, tx + 16 c]
 * (p: [N, ldp], x: [N, ldx]): rows of P^T dO and of dS^T Q. */
template <int R, int C, int N>
static __device__ __forceinline__ void cuda_add_tile_ptx(float (&acc)[R][C], const float *p,
                                                         int ldp, const float *x, int ldx)
{
    const int ty = threadIdx.x / ATTN_SIDE, tx = threadIdx.x % ATTN_SIDE;
    const float *pi = p + ty, *xi = x + tx; /* p[i, ty], x[i, tx] */
#pragma unroll 4
    for (int i = 0; i < N; i++, pi += ldp, xi += ldx) {
        float pv[R], xv[C];
#pragma unroll
        for (int r = 0; r < R; r++)
            pv[r] = pi[ATTN_SIDE * r];
#pragma unroll
        for (int c = 0; c < C; c++)
            xv[c] = xi[ATTN_SIDE * c];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < C; c++)
                acc[r][c] += pv[r] * xv[c];
    }
}

/* The maximum and the sum over a row's 16 owners (one half-warp): a fixed
 * butterfly, and since a + b == b + a exactly, all 16 end with the same bits.
 * Every thread of the warp must call them. The maximum compares as the CPU
 * does (a NaN never wins). */
static __device__ __forceinline__ float cuda_max_row(float x)
{
#pragma unroll
    for (int off = ATTN_SIDE / 2; off > 0; off /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, x, off);
        x = y > x ? y : x;
    }
    return x;
}

static __device__ __forceinline__ double cuda_sum_row(double x)
{
#pragma unroll
    for (int off = ATTN_SIDE / 2; off > 0; off /= 2)
        x = x + __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* Does query i of batch row b see key j? Padded rows and columns see
 * nothing; under a sliding window, neither do keys before it, nor keys
 * before the query's document. */
static __device__ __forceinline__ bool cuda_sees_key(int64_t b, int64_t i, int64_t j,
                                                     const regc_attn_shape &s)
{
    return i < s.tq && j < s.tk && (!s.causal || j <= i) && j >= regc_attn_first_key(&s, b, i);
}

/* The thread's own element (ty, tx) of a tile with rows ld apart; its
 * others are ATTN_SIDE rows and columns on. */
static __device__ __forceinline__ float *cuda_own_element(float *tile, int ld)
{
    return tile + (int)threadIdx.x / ATTN_SIDE * ld + (int)threadIdx.x % ATTN_SIDE;
}

/* A query-tile kernel's block: its first query row, batch row, head and
 * key/value head. Query tiles run from the last, so a causal launch starts
 * its longest blocks first; then heads, then batch rows. Every factor of
 * the grid is at most INT_MAX (cuda_prepare_launch): 32-bit divisions, not
 * 64-bit subroutines. */
struct cuda_query_block {
    int64_t q0, b;
    int h, g;
};

template <int BQ>
static __device__ __forceinline__ cuda_query_block cuda_query_block_of(const regc_attn_shape &s)
{
    const int n_qt = (int)((s.tq + BQ - 1) / BQ), blk = (int)blockIdx.x;
    cuda_query_block x;
    x.q0 = (int64_t)(n_qt - 1 - blk % n_qt) * BQ;
    x.h = blk / n_qt % s.n_head;
    x.b = blk / n_qt / s.n_head;
    x.g = x.h / (s.n_head / s.n_kv_head);
    return x;
}

/* ---- host side */

/* The shape rules every backend checks (kernel_checks.h), plus this
 * file's head_dim limit. */
static inline int cuda_check_attention(regc_backend *be, const regc_attn_shape *s,
                                       const float *bias, const char *what)
{
    if (regc_attn_check(s, what) != REGC_OK || regc_attn_check_bias(s, bias, what) != REGC_OK) {
        cuda_note_failure(be, regc_error_message());
        return 0;
    }
    if (s->head_dim > ATTN_MAX_HEAD_DIM) {
        cuda_refuse(be, REGC_ERR_UNSUPPORTED,
                    "%s: head_dim %d is over the CUDA backend's limit of %d", what, s->head_dim,
                    ATTN_MAX_HEAD_DIM);
        return 0;
    }
    return 1;
}

/* Allow a kernel its dynamic shared memory (over 48 KB needs asking; the
 * setting belongs to the current device, so it is made at each launch) and
 * check its grid fits; 0 when the launch must not go ahead. */
template <typename Kernel>
static int cuda_prepare_launch(regc_backend *be, Kernel *kernel, size_t smem_floats, int64_t blocks,
                               const char *what)
{
    if (blocks > INT_MAX) {
        cuda_refuse(be, REGC_ERR_UNSUPPORTED, "%s: %lld blocks, more than one launch takes", what,
                    (long long)blocks);
        return 0;
    }
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem_floats * sizeof(float)));
    cuda_note(be, err, what);
    return err == cudaSuccess;
}

#endif
