/* cuda_elementwise.cu — the memory-bound kernels of the CUDA backend: add,
 * multiply, bias add, scale, the activations and their gradients, rotary
 * embedding, the fused elementwise chain, transpose, embedding lookup and
 * its gradient, and column sums.
 *
 * Every kernel is a grid-stride loop (64-bit indices) over the body of one
 * thread in cuda_elementwise.h, which the host test runs over the same grid
 * against the CPU backend; the per-element math is kernel_math.h's under
 * --fmad=false, so each kernel here gives the CPU's bits. The two
 * reductions keep that too, by keeping the CPU's order:
 * - sum_rows: one thread per column walks the rows in order, in double;
 * - embedding_bwd: a stable radix sort groups the rows of each id in row
 *   order, and one thread per (id, column) sums them from 0 and adds the
 *   sum once, with no atomics, so two runs and the two backends agree.
 * NaNs are the one exception: a GPU writes its canonical NaN where the CPU
 * propagates an input's payload, so a NaN result matches as a NaN, not in
 * its bits. */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_internal.h"
#include "kernel_checks.h"

#include "cuda_elementwise.h"

/* Blocks of CUDA_THREADS for n elements, at most gridDim.x's limit: beyond
 * it (2^39 elements) the grid-stride loops take the rest. */
static unsigned cuda_grid_for(int64_t n)
{
    const int64_t max_blocks = 2147483647; /* 2^31 - 1 */
    const int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    return b < 1 ? 1u : b > max_blocks ? (unsigned)max_blocks : (unsigned)b;
}

#define CUDA_GRID_LOOP(i, n)                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- the plain elementwise kernels */

__global__ void cuda_add_kernel(float *out, const float *a, const float *b,
                                int64_t n) /* out, a, b: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_add(i, out, a, b); }
}

__global__ void cuda_mul_kernel(float *out, const float *a, const float *b,
                                int64_t n) /* out, a, b: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_mul(i, out, a, b); }
}

__global__ void cuda_bias_add_kernel(float *out, const float *x, const float *b, int64_t cols,
                                     int64_t n) /* out, x: [rows, cols]; b: [cols] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_bias_add(i, out, x, b, cols); }
}

__global__ void cuda_dropout_kernel(float *y, const float *x, const int32_t *site,
                                    const int32_t *draw, float p, float scale,
                                    int64_t n) /* y, x: [n] */
{
    CUDA_GRID_LOOP(q, (n + 3) / 4) { cuda_body_dropout(q, y, x, site, draw, p, scale, n); }
}

__global__ void cuda_scale_kernel(float *y, const float *x, float value, int64_t n) /* y, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_scale(i, y, x, value); }
}

__global__ void cuda_gelu_fwd_kernel(float *y, const float *x, int64_t n) /* y, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_gelu_fwd(i, y, x); }
}

__global__ void cuda_gelu_bwd_kernel(float *dx, const float *dy, const float *x,
                                     int64_t n) /* dx, dy, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_gelu_bwd(i, dx, dy, x); }
}

__global__ void cuda_gelu_erf_fwd_kernel(float *y, const float *x, int64_t n) /* y, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_gelu_erf_fwd(i, y, x); }
}

__global__ void cuda_gelu_erf_bwd_kernel(float *dx, const float *dy, const float *x,
                                         int64_t n) /* dx, dy, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_gelu_erf_bwd(i, dx, dy, x); }
}

__global__ void cuda_silu_fwd_kernel(float *y, const float *x, int64_t n) /* y, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_silu_fwd(i, y, x); }
}

__global__ void cuda_silu_bwd_kernel(float *dx, const float *dy, const float *x,
                                     int64_t n) /* dx, dy, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_silu_bwd(i, dx, dy, x); }
}

__global__ void cuda_relu_fwd_kernel(float *y, const float *x, int64_t n) /* y, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_relu_fwd(i, y, x); }
}

__global__ void cuda_relu_bwd_kernel(float *dx, const float *dy, const float *x,
                                     int64_t n) /* dx, dy, x: [n] */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_relu_bwd(i, dx, dy, x); }
}

static void cuda_add_arrays(regc_backend *be, float *out, const float *a, const float *b, int64_t n)
{
    if (n <= 0)
        return;
    cuda_add_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(out, a, b, n);
    cuda_note(be, cudaGetLastError(), "add");
}

extern "C" int regc_cuda_add_on_stream(void *stream, float *out, const float *a, const float *b,
                                       int64_t n)
{
    if (n > 0)
        cuda_add_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, (cudaStream_t)stream>>>(out, a, b, n);
    return (int)cudaGetLastError();
}

static void cuda_mul_arrays(regc_backend *be, float *out, const float *a, const float *b, int64_t n)
{
    if (n <= 0)
        return;
    cuda_mul_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(out, a, b, n);
    cuda_note(be, cudaGetLastError(), "mul");
}

static void cuda_add_bias(regc_backend *be, float *out, const float *x, const float *b,
                          int64_t rows, int64_t cols)
{
    const int64_t n = rows * cols;
    if (rows <= 0 || cols <= 0)
        return;
    cuda_bias_add_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(out, x, b, cols,
                                                                                 n);
    cuda_note(be, cudaGetLastError(), "bias_add");
}

static void cuda_dropout(regc_backend *be, float *y, const float *x, const int32_t *site,
                         const int32_t *draw, float p, int64_t n)
{
    if (n <= 0)
        return;
    const int64_t groups = (n + 3) / 4;
    cuda_dropout_kernel<<<cuda_grid_for(groups), CUDA_THREADS, 0, cuda_stream(be)>>>(
        y, x, site, draw, p, 1.0f / (1.0f - p), n);
    cuda_note(be, cudaGetLastError(), "dropout");
}

static void cuda_scale(regc_backend *be, float *y, const float *x, float value, int64_t n)
{
    if (n <= 0)
        return;
    cuda_scale_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(y, x, value, n);
    cuda_note(be, cudaGetLastError(), "scale");
}

static void cuda_gelu_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_gelu_fwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(y, x, n);
    cuda_note(be, cudaGetLastError(), "gelu_fwd");
}

static void cuda_gelu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_gelu_bwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(dx, dy, x, n);
    cuda_note(be, cudaGetLastError(), "gelu_bwd");
}

static void cuda_gelu_erf_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_gelu_erf_fwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(y, x, n);
    cuda_note(be, cudaGetLastError(), "gelu_erf_fwd");
}

static void cuda_gelu_erf_bwd(regc_backend *be, float *dx, const float *dy, const float *x,
                              int64_t n)
{
    if (n <= 0)
        return;
    cuda_gelu_erf_bwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(dx, dy, x, n);
    cuda_note(be, cudaGetLastError(), "gelu_erf_bwd");
}

static void cuda_silu_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_silu_fwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(y, x, n);
    cuda_note(be, cudaGetLastError(), "silu_fwd");
}

static void cuda_silu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_silu_bwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(dx, dy, x, n);
    cuda_note(be, cudaGetLastError(), "silu_bwd");
}

static void cuda_relu_fwd(regc_backend *be, float *y, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_relu_fwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(y, x, n);
    cuda_note(be, cudaGetLastError(), "relu_fwd");
}

static void cuda_relu_bwd(regc_backend *be, float *dx, const float *dy, const float *x, int64_t n)
{
    if (n <= 0)
        return;
    cuda_relu_bwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(dx, dy, x, n);
    cuda_note(be, cudaGetLastError(), "relu_bwd");
}

/* ---- rotary embedding: one thread per rotated pair or value passed through */

__global__ void cuda_rope_kernel(float *y, const float *x, const float *cos, const float *sin,
                                 int64_t t, int n_head, int head_dim, int rot_dim, float sign,
                                 int y_bf16, int64_t items)
/* y, x: [batch, t, n_head * head_dim] (y in bf16 where y_bf16); cos, sin: [t, rot_dim / 2] */
{
    CUDA_GRID_LOOP(i, items)
    {
        cuda_body_rope(i, y, x, cos, sin, t, n_head, head_dim, rot_dim, sign, y_bf16);
    }
}

static void cuda_rope(regc_backend *be, float *y, const float *x, const float *cos,
                      const float *sin, int64_t batch, int64_t t, int n_head, int head_dim,
                      int rot_dim, int inverse, int y_bf16)
{
    if (regc_rope_check(batch, t, n_head, head_dim, rot_dim) != REGC_OK) {
        cuda_note_failure(be, regc_error_message());
        return;
    }
    const int64_t items = batch * t * n_head * (head_dim - rot_dim / 2);
    if (items == 0)
        return;
    const float sign = inverse ? -1.0f : 1.0f;
    cuda_rope_kernel<<<cuda_grid_for(items), CUDA_THREADS, 0, cuda_stream(be)>>>(
        y, x, cos, sin, t, n_head, head_dim, rot_dim, sign, y_bf16, items);
    cuda_note(be, cudaGetLastError(), "rope");
}

/* ---- the fused elementwise chain: the program and the array pointers go
 * to the kernel as one parameter (a few hundred bytes, far under the
 * parameter limit), read in place through __grid_constant__ instead of
 * being copied into every thread's local memory */

typedef struct {
    regc_ew_program program;
    float *out[REGC_EW_MAX_OUTPUTS];     /* out[k]: [n] */
    const float *in[REGC_EW_MAX_INPUTS]; /* in[i]: [n], or [period[i]] */
    unsigned out_bf16;                   /* bit k: out[k] holds bf16 values */
    unsigned in_bf16;                    /* bit i: in[i] holds bf16 values */
} cuda_ew_args;

__global__ void cuda_elementwise_kernel(const __grid_constant__ cuda_ew_args args, int64_t n)
{
    CUDA_GRID_LOOP(e, n)
    {
        cuda_body_elementwise(e, &args.program, args.out, args.in, args.out_bf16, args.in_bf16);
    }
}

static void cuda_elementwise(regc_backend *be, const regc_ew_program *p, int64_t n,
                             float *const *out, const float *const *in, unsigned out_bf16,
                             unsigned in_bf16)
{
    if (regc_ew_check(p, n, out, in, out_bf16, in_bf16) != REGC_OK) {
        cuda_note_failure(be, regc_error_message());
        return;
    }
    if (n == 0 || p->n_outputs == 0)
        return;
    cuda_ew_args args;
    memset(&args, 0, sizeof args);
    args.program = *p;
    args.out_bf16 = out_bf16, args.in_bf16 = in_bf16;
    for (int k = 0; k < p->n_outputs; k++)
        args.out[k] = out[k];
    for (int i = 0; i < p->n_inputs; i++)
        args.in[i] = in[i];
    cuda_elementwise_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(args, n);
    cuda_note(be, cudaGetLastError(), "elementwise");
}

/* ---- transpose: one thread per output element, the map a parameter */

__global__ void cuda_transpose_kernel(float *out, const float *x,
                                      const __grid_constant__ cuda_transpose_map map)
/* out: [total] permuted; x: [total] */
{
    CUDA_GRID_LOOP(o, map.total) { cuda_body_transpose(o, out, x, &map); }
}

static void cuda_transpose(regc_backend *be, float *out, const float *x, int ndim,
                           const int64_t *shape, const int *perm)
{
    if (regc_transpose_check(ndim, shape, perm) != REGC_OK) {
        cuda_note_failure(be, regc_error_message());
        return;
    }
    cuda_transpose_map map;
    cuda_transpose_map_init(&map, ndim, shape, perm);
    if (map.total == 0)
        return;
    if (map.nd == 0 || (map.nd == 1 && map.src[0] == 1)) { /* the identity: a copy */
        if (out != x)
            cuda_note(be,
                      cudaMemcpyAsync(out, x, (size_t)map.total * sizeof(float),
                                      cudaMemcpyDeviceToDevice, cuda_stream(be)),
                      "transpose");
        return;
    }
    cuda_transpose_kernel<<<cuda_grid_for(map.total), CUDA_THREADS, 0, cuda_stream(be)>>>(out, x,
                                                                                          map);
    cuda_note(be, cudaGetLastError(), "transpose");
}

/* ---- embedding lookup */

__global__ void cuda_embedding_fwd_kernel(float *out, const int32_t *ids, const float *table,
                                          int64_t cols, int table_bf16, int64_t n)
/* out: [rows, cols]; ids: [rows]; table: [vocab, cols] (bf16 values where table_bf16) */
{
    CUDA_GRID_LOOP(i, n) { cuda_body_embedding_fwd(i, out, ids, table, cols, table_bf16); }
}

static void cuda_embedding_fwd(regc_backend *be, float *out, const int32_t *ids, const float *table,
                               int64_t rows, int64_t cols, int table_bf16)
{
    const int64_t n = rows * cols;
    if (rows <= 0 || cols <= 0)
        return;
    cuda_embedding_fwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, cuda_stream(be)>>>(
        out, ids, table, cols, table_bf16, n);
    cuda_note(be, cudaGetLastError(), "embedding_fwd");
}

/* ---- embedding gradient: sort, then one thread per (id, column).
 *
 * Ids outside [0, vocab) are not reported here: finding them means reading
 * device memory, which the host can do only after a sync, in the middle of
 * an asynchronous step. Token ids are checked against the vocabulary on the
 * host when they are read (data/tokens.c), before they are uploaded; what
 * reaches this kernel is in range. A bad id that got here anyway is made
 * harmless the way the CPU leaves it: the sorted keys show it (the last
 * key's id is bad exactly when some id is), and then neither the zeroing
 * nor the sums write anything, so dtable is left as it was. */

__global__ void cuda_embedding_keys_kernel(uint64_t *key, const int32_t *ids,
                                           int64_t rows) /* key, ids: [rows] */
{
    CUDA_GRID_LOOP(r, rows) { cuda_body_embedding_key(r, key, ids); }
}

__global__ void cuda_embedding_zero_kernel(float *dtable, const uint64_t *key, int64_t rows,
                                           int64_t vocab, int64_t n)
/* dtable: [vocab, cols] (n elements); key: [rows], sorted */
{
    if (!cuda_embedding_keys_ok(key, rows, vocab))
        return;
    CUDA_GRID_LOOP(i, n) { dtable[i] = 0.0f; }
}

/* Threads whose sorted key is not the first of its id return at once; a
 * warp holds consecutive columns of one key (of two where cols is no
 * multiple of 32), so it mostly returns or works as a whole, its reads of
 * dout one row at a time coalesced. A frequent id's rows are walked by one
 * thread per column, serially: the price of the CPU's order, paid over a
 * batch's tokens, once per step. */
__global__ void cuda_embedding_bwd_kernel(float *dtable, const uint64_t *key, const float *dout,
                                          int64_t rows, int64_t cols, int64_t vocab, int64_t n,
                                          int64_t pad)
/* dtable: [vocab, cols]; key: [rows], sorted; dout: [rows, cols] (n elements) */
{
    if (!cuda_embedding_keys_ok(key, rows, vocab))
        return;
    CUDA_GRID_LOOP(i, n) { cuda_body_embedding_bwd(i, dtable, key, dout, rows, cols, pad); }
}

static void cuda_embedding_bwd(regc_backend *be, float *dtable, const int32_t *ids,
                               const float *dout, int64_t rows, int64_t cols, int64_t vocab,
                               int accumulate, int64_t pad)
{
    if (rows > (int64_t)UINT32_MAX) {
        cuda_refuse(be, REGC_ERR_ARG,
                    "embedding_bwd: %lld rows exceed the 2^32 the grouping indexes",
                    (long long)rows);
        return;
    }
    if (rows < 0 || cols <= 0 || vocab <= 0)
        return;
    cudaStream_t stream = cuda_stream(be);
    if (rows == 0) { /* no ids to check: a fresh gradient is all zeros */
        if (!accumulate)
            cuda_note(be,
                      cudaMemsetAsync(dtable, 0, (size_t)(vocab * cols) * sizeof(float), stream),
                      "embedding_bwd");
        return;
    }
    /* The key's low half is the row and the keys come in row order, so a
     * stable sort on the id half alone gives the full order in half the
     * passes. CUB's radix sort is stable and its order depends on the keys
     * only, so the grouping is the same on every run. */
    const int begin_bit = 32, end_bit = 64;
    size_t sort_bytes = 0;
    cudaError_t err =
        cub::DeviceRadixSort::SortKeys(NULL, sort_bytes, (const uint64_t *)NULL, (uint64_t *)NULL,
                                       rows, begin_bit, end_bit, stream);
    cuda_note(be, err, "embedding_bwd sort");
    if (err != cudaSuccess)
        return;
    /* one scratch block: keys in, keys sorted, the sort's own storage */
    const size_t key_bytes = ((size_t)rows * sizeof(uint64_t) + 255) & ~(size_t)255;
    char *scratch = (char *)cuda_scratch_alloc(be, 2 * key_bytes + sort_bytes, "embedding_bwd");
    if (!scratch)
        return;
    uint64_t *key = (uint64_t *)scratch;                  /* [rows] */
    uint64_t *sorted = (uint64_t *)(scratch + key_bytes); /* [rows] */
    void *sort_storage = scratch + 2 * key_bytes;         /* [sort_bytes] */
    cuda_embedding_keys_kernel<<<cuda_grid_for(rows), CUDA_THREADS, 0, stream>>>(key, ids, rows);
    cuda_note(be, cudaGetLastError(), "embedding_bwd keys");
    cuda_note(be,
              cub::DeviceRadixSort::SortKeys(sort_storage, sort_bytes, (const uint64_t *)key,
                                             sorted, rows, begin_bit, end_bit, stream),
              "embedding_bwd sort");
    if (!accumulate) {
        const int64_t n_table = vocab * cols;
        cuda_embedding_zero_kernel<<<cuda_grid_for(n_table), CUDA_THREADS, 0, stream>>>(
            dtable, sorted, rows, vocab, n_table);
        cuda_note(be, cudaGetLastError(), "embedding_bwd zero");
    }
    const int64_t n = rows * cols;
    cuda_embedding_bwd_kernel<<<cuda_grid_for(n), CUDA_THREADS, 0, stream>>>(
        dtable, sorted, dout, rows, cols, vocab, n, pad);
    cuda_note(be, cudaGetLastError(), "embedding_bwd");
    cuda_scratch_free(be, scratch, "embedding_bwd");
}

/* ---- column sums: one thread per column, down the rows in order.
 *
 * The CPU sums each column from row 0 to the last in double; any split of
 * the rows would change the rounding, so each column stays one thread's
 * serial walk. That leaves only `cols` threads (a bias gradient: a few
 * thousand) each doing `rows` dependent double adds: latency-bound, but
 * the loads of a warp are one coalesced row and do not wait on the adds,
 * and the pass reads the matrix once, as any order would. */
__global__ void cuda_sum_rows_kernel(float *out, const float *x, int64_t rows,
                                     int64_t cols) /* out: [cols]; x: [rows, cols] */
{
    CUDA_GRID_LOOP(c, cols) { cuda_body_sum_rows(c, out, x, rows, cols); }
}

static void cuda_sum_rows(regc_backend *be, float *out, const float *x, int64_t rows, int64_t cols)
{
    const int64_t n_rows = rows > 0 ? rows : 0; /* no rows: every sum is 0, as on the CPU */
    if (cols <= 0)
        return;
    cuda_sum_rows_kernel<<<cuda_grid_for(cols), CUDA_THREADS, 0, cuda_stream(be)>>>(out, x, n_rows,
                                                                                    cols);
    cuda_note(be, cudaGetLastError(), "sum_rows");
}

void regc_cuda_set_elementwise(regc_backend *be)
{
    be->transpose = cuda_transpose;
    be->embedding_fwd = cuda_embedding_fwd;
    be->embedding_bwd = cuda_embedding_bwd;
    be->add = cuda_add_arrays;
    be->bias_add = cuda_add_bias;
    be->sum_rows = cuda_sum_rows;
    be->gelu_fwd = cuda_gelu_fwd;
    be->gelu_bwd = cuda_gelu_bwd;
    be->rope = cuda_rope;
    be->silu_fwd = cuda_silu_fwd;
    be->silu_bwd = cuda_silu_bwd;
    be->mul = cuda_mul_arrays;
    be->gelu_erf_fwd = cuda_gelu_erf_fwd;
    be->gelu_erf_bwd = cuda_gelu_erf_bwd;
    be->relu_fwd = cuda_relu_fwd;
    be->relu_bwd = cuda_relu_bwd;
    be->scale = cuda_scale;
    be->dropout = cuda_dropout;
    be->elementwise = cuda_elementwise;
}
