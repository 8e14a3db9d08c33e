/* cuda_backend.cu — the CUDA backend's frame: one device, one stream, the
 * first failure remembered until sync() reports it, device memory
 * (stream-ordered allocations, counted), copies and fill, and the table
 * every kernel file fills its part of (cuda_internal.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

void cuda_note(regc_backend *be, cudaError_t err, const char *where)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (err != cudaSuccess && !c->failed) {
        c->failed = 1;
        snprintf(c->what, sizeof c->what, "cuda: %s: %s", where, cudaGetErrorString(err));
    }
}

void cuda_note_failure(regc_backend *be, const char *what)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (!c->failed) {
        c->failed = 1;
        snprintf(c->what, sizeof c->what, "%s", what);
    }
}

void cuda_refuse(regc_backend *be, int status, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    regc_error(status, "%s", msg);
    cuda_note_failure(be, msg);
}

void *cuda_scratch_alloc(regc_backend *be, size_t bytes, const char *what)
{
    void *p = NULL;
    cuda_note(be, cudaMallocAsync(&p, bytes ? bytes : 1, cuda_stream(be)), what);
    return p;
}

void cuda_scratch_free(regc_backend *be, void *ptr, const char *what)
{
    if (ptr)
        cuda_note(be, cudaFreeAsync(ptr, cuda_stream(be)), what);
}

/* ---- memory: every block's size is kept (a small open-addressed table of
 * pointer -> bytes), so mem_in_use and mem_peak count what the run holds,
 * as on the CPU */

typedef struct {
    void *ptr;
    size_t bytes;
} cuda_block;

typedef struct {
    cuda_block *slot;
    size_t cap, used; /* cap a power of two; used counts live and removed slots */
} cuda_blocks;

#define CUDA_REMOVED ((void *)1)

/* Fibonacci hashing: the product's high bits, which every bit of the
 * address reaches (allocations share their low bits) */
static size_t cuda_blocks_hash(const void *p, size_t cap)
{
    return (size_t)((((uint64_t)(uintptr_t)p >> 8) * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
}

static int cuda_blocks_put(cuda_blocks *t, void *p, size_t bytes)
{
    if ((t->used + 1) * 2 > t->cap) {
        /* rehash, removed slots dropped, at a size fitted to the live
         * blocks: allocation churn reuses slots instead of doubling */
        size_t live = 0, cap = 256;
        for (size_t i = 0; i < t->cap; i++)
            live += t->slot[i].ptr && t->slot[i].ptr != CUDA_REMOVED;
        while ((live + 1) * 4 > cap)
            cap *= 2;
        cuda_blocks grown = {(cuda_block *)calloc(cap, sizeof(cuda_block)), cap, 0};
        if (!grown.slot)
            return REGC_ERR_MEMORY;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slot[i].ptr && t->slot[i].ptr != CUDA_REMOVED)
                cuda_blocks_put(&grown, t->slot[i].ptr, t->slot[i].bytes);
        free(t->slot);
        *t = grown;
    }
    size_t i = cuda_blocks_hash(p, t->cap);
    while (t->slot[i].ptr && t->slot[i].ptr != CUDA_REMOVED)
        i = (i + 1) & (t->cap - 1);
    if (!t->slot[i].ptr)
        t->used++;
    t->slot[i] = (cuda_block){p, bytes};
    return REGC_OK;
}

/* the bytes of p, its slot removed; 0 when p was not allocated here */
static size_t cuda_blocks_take(cuda_blocks *t, const void *p)
{
    if (!t->cap)
        return 0;
    for (size_t i = cuda_blocks_hash(p, t->cap); t->slot[i].ptr; i = (i + 1) & (t->cap - 1))
        if (t->slot[i].ptr == p) {
            size_t bytes = t->slot[i].bytes;
            t->slot[i].ptr = CUDA_REMOVED;
            return bytes;
        }
    return 0;
}

static cuda_blocks *cuda_blocks_of(regc_backend *be);

static void *cuda_alloc(regc_backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, bytes ? bytes : 1, cuda_stream(be));
    if (err != cudaSuccess) {
        regc_error(REGC_ERR_MEMORY, "cuda: cannot allocate %zu bytes: %s", bytes,
                   cudaGetErrorString(err));
        return NULL;
    }
    if (cuda_blocks_put(cuda_blocks_of(be), p, bytes) != REGC_OK) {
        cudaFreeAsync(p, cuda_stream(be));
        regc_error(REGC_ERR_MEMORY, "cuda: out of host memory");
        return NULL;
    }
    be->mem_in_use += (int64_t)bytes;
    if (be->mem_in_use > be->mem_peak)
        be->mem_peak = be->mem_in_use;
    return p;
}

static void cuda_free(regc_backend *be, void *p)
{
    if (!p)
        return;
    be->mem_in_use -= (int64_t)cuda_blocks_take(cuda_blocks_of(be), p);
    cuda_note(be, cudaFreeAsync(p, cuda_stream(be)), "free");
}

static void *cuda_alloc_host(regc_backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        regc_error(REGC_ERR_MEMORY, "cuda: cannot allocate %zu bytes of pinned host memory: %s",
                   bytes, cudaGetErrorString(err));
        return NULL;
    }
    return p;
}

static void cuda_free_host(regc_backend *be, void *p)
{
    if (p)
        cuda_note(be, cudaFreeHost(p), "free host");
}

static void cuda_copy(regc_backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind k)
{
    if (bytes)
        cuda_note(be, cudaMemcpyAsync(dst, src, bytes, k, cuda_stream(be)), "copy");
}

static void cuda_copy_h2d(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_copy(be, d, s, n, cudaMemcpyHostToDevice);
}

static void cuda_copy_d2h(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_copy(be, d, s, n, cudaMemcpyDeviceToHost);
}

/* The side stream and its event, made on first use (both or neither). */
static int cuda_side(regc_backend *be)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (c->side || c->no_side)
        return c->side != NULL; /* made, or failed once (noted then) */
    cudaStream_t side = NULL;
    cudaEvent_t queued = NULL;
    cudaError_t err = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&queued, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        if (side)
            cudaStreamDestroy(side);
        cuda_note(be, err, "side stream");
        c->no_side = 1;
        return 0;
    }
    c->side = side, c->queued = queued;
    return 1;
}

/* The side stream waits for the work queued on the main one so far, then
 * copies; the main stream goes on without waiting for the copy. */
static void cuda_copy_d2h_side(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (!cuda_side(be)) {
        cuda_copy(be, d, s, n, cudaMemcpyDeviceToHost);
        return;
    }
    cuda_note(be, cudaEventRecord(c->queued, c->stream), "side copy");
    cuda_note(be, cudaStreamWaitEvent(c->side, c->queued, 0), "side copy");
    if (n)
        cuda_note(be, cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToHost, c->side), "side copy");
}

/* The copy queue: the side stream waits for the main one, copies, and
 * records the copy's end in the ticket's event, which copy_wait makes the
 * main stream wait for. Events are made on first use, as many as tickets
 * a program keeps in flight. */
static int64_t cuda_copy_start(regc_backend *be, void *d, const void *s, size_t n, int to_host)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (!c->done && !c->no_copy_queue) { /* tried once: a failure is noted, not retried */
        cudaEvent_t *done = (cudaEvent_t *)calloc(CUDA_COPY_EVENTS, sizeof *done);
        for (int i = 0; done && i < CUDA_COPY_EVENTS; i++)
            if (cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming) != cudaSuccess) {
                while (i-- > 0)
                    cudaEventDestroy(done[i]);
                free(done);
                done = NULL;
            }
        c->done = done;
        if (!done) {
            c->no_copy_queue = 1;
            cuda_note(be, cudaErrorMemoryAllocation, "copy queue");
        }
    }
    if (!c->done || !cuda_side(be)) { /* copied in order, then: nothing to wait for */
        cuda_copy(be, d, s, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice);
        return -1;
    }
    const int64_t t = c->next_ticket++;
    cuda_note(be, cudaEventRecord(c->queued, c->stream), "copy queue");
    cuda_note(be, cudaStreamWaitEvent(c->side, c->queued, 0), "copy queue");
    if (n)
        cuda_note(be,
                  cudaMemcpyAsync(
                      d, s, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, c->side),
                  "copy queue");
    cuda_note(be, cudaEventRecord(c->done[t % CUDA_COPY_EVENTS], c->side), "copy queue");
    return t;
}

static void cuda_copy_wait(regc_backend *be, int64_t ticket)
{
    cuda_ctx *c = cuda_ctx_of(be);
    if (ticket >= 0 && c->done)
        cuda_note(be, cudaStreamWaitEvent(c->stream, c->done[ticket % CUDA_COPY_EVENTS], 0),
                  "copy queue");
}

static void cuda_copy_d2d(regc_backend *be, void *d, const void *s, size_t n)
{
    cuda_copy(be, d, s, n, cudaMemcpyDeviceToDevice);
}

static void cuda_copy_2d(regc_backend *be, float *dst, int64_t ld_dst, const float *src,
                         int64_t ld_src, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0)
        return;
    cuda_note(be,
              cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src,
                                (size_t)ld_src * sizeof(float), (size_t)cols * sizeof(float),
                                (size_t)rows, cudaMemcpyDeviceToDevice, cuda_stream(be)),
              "copy_2d");
}

__global__ void cuda_fill_kernel(float *dst, int64_t n, float value) /* dst: [n] */
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = value;
}

static void cuda_fill(regc_backend *be, float *dst, size_t n, float value)
{
    if (n == 0)
        return;
    cuda_fill_kernel<<<cuda_blocks_for((int64_t)n), CUDA_THREADS, 0, cuda_stream(be)>>>(
        dst, (int64_t)n, value);
    cuda_note(be, cudaGetLastError(), "fill");
}

static int cuda_sync(regc_backend *be)
{
    cuda_ctx *c = cuda_ctx_of(be);
    cuda_note(be, cudaStreamSynchronize(c->stream), "synchronize");
    if (c->side)
        cuda_note(be, cudaStreamSynchronize(c->side), "synchronize");
    if (c->failed) {
        c->failed = 0;
        return regc_error(REGC_ERR_IO, "%s", c->what);
    }
    return REGC_OK;
}

/* ---- whole-step capture: a CUDA graph of the stream's work */

static int cuda_capture_begin(regc_backend *be)
{
    if (cuda_ctx_of(be)->failed) /* a failure not yet reported is not the capture's to lose */
        return regc_error(REGC_ERR_IO, "cuda: a failure is pending; not capturing");
    cudaError_t err = cudaStreamBeginCapture(cuda_stream(be), cudaStreamCaptureModeThreadLocal);
    return err == cudaSuccess ? REGC_OK
                              : regc_error(REGC_ERR_IO, "cuda: cannot capture the step: %s",
                                           cudaGetErrorString(err));
}

static int cuda_capture_end(regc_backend *be, void **graph)
{
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t err = cudaStreamEndCapture(cuda_stream(be), &g);
    if (err == cudaSuccess)
        err = cudaGraphInstantiate(&exec, g, 0);
    if (g)
        cudaGraphDestroy(g);
    cuda_ctx *c = cuda_ctx_of(be);
    if (err != cudaSuccess || c->failed) {
        /* what failed was recorded, not run: the caller runs it again
         * outside a capture, where a real failure shows again */
        cudaGetLastError();
        const char *why = err != cudaSuccess ? cudaGetErrorString(err) : c->what;
        regc_error(REGC_ERR_IO, "cuda: the step's capture failed: %s", why);
        c->failed = 0, c->what[0] = '\0';
        if (exec)
            cudaGraphExecDestroy(exec);
        return REGC_ERR_IO;
    }
    *graph = exec;
    return REGC_OK;
}

static int cuda_graph_launch(regc_backend *be, void *graph)
{
    cuda_note(be, cudaGraphLaunch((cudaGraphExec_t)graph, cuda_stream(be)), "graph launch");
    return REGC_OK;
}

static void cuda_graph_free(regc_backend *be, void *graph)
{
    if (graph)
        cuda_note(be, cudaGraphExecDestroy((cudaGraphExec_t)graph), "graph free");
}

void regc_cuda_set_memory(regc_backend *be)
{
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->alloc_host = cuda_alloc_host;
    be->free_host = cuda_free_host;
    be->copy_h2d = cuda_copy_h2d;
    be->copy_d2h = cuda_copy_d2h;
    be->copy_d2h_side = cuda_copy_d2h_side;
    be->copy_start = cuda_copy_start;
    be->copy_wait = cuda_copy_wait;
    be->copy_d2d = cuda_copy_d2d;
    be->copy_2d = cuda_copy_2d;
    be->fill = cuda_fill;
    be->sync = cuda_sync;
    be->capture_begin = cuda_capture_begin;
    be->capture_end = cuda_capture_end;
    be->graph_launch = cuda_graph_launch;
    be->graph_free = cuda_graph_free;
}

/* ---- the table and the backend */

typedef struct {
    cuda_ctx ctx;
    cuda_blocks blocks;
} cuda_state;

static cuda_blocks *cuda_blocks_of(regc_backend *be) { return &((cuda_state *)be->ctx)->blocks; }

/* Every entry the backend has, device or not: what the module's table
 * reports to the completeness test, and what a backend is given. */
extern "C" void regc_cuda_fill_table(regc_backend *be)
{
    be->name = "cuda";
    regc_cuda_set_memory(be);
    regc_cuda_set_gemm(be);
    regc_cuda_set_optimizer(be);
    regc_cuda_set_elementwise(be);
    regc_cuda_set_norm(be);
    regc_cuda_set_loss(be);
    regc_cuda_set_attention_fwd(be);
    regc_cuda_set_attention_bwd(be);
}

static void cuda_destroy(regc_backend *be)
{
    cuda_state *s = (cuda_state *)be->ctx;
    cuda_ctx *c = &s->ctx;
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    regc_cuda_gemm_plans_free(be);
    if (c->workspace)
        cudaFree(c->workspace);
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (c->side) {
        cudaStreamSynchronize(c->side);
        cudaStreamDestroy(c->side);
    }
    if (c->queued)
        cudaEventDestroy(c->queued);
    for (int i = 0; c->done && i < CUDA_COPY_EVENTS; i++)
        cudaEventDestroy(c->done[i]);
    free(c->done);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(s->blocks.slot);
    free(s);
    free(be);
}

extern "C" int regc_cuda_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* Why cudaGetDeviceCount found no device, in words a user can act on: the
 * runtime says "driver insufficient" both where there is no driver at all
 * and where it is too old, so the driver's version tells the two apart. */
static void cuda_no_device_error(cudaError_t err)
{
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver); /* 0 where no driver is installed */
    cudaRuntimeGetVersion(&runtime);
    if (err == cudaErrorNoDevice || err == cudaSuccess)
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: no CUDA device: the driver sees none");
    else if (err == cudaErrorInsufficientDriver && driver == 0)
        regc_error(REGC_ERR_UNSUPPORTED,
                   "cuda: no CUDA device: no NVIDIA driver on this machine (libcuda.so.1)");
    else if (err == cudaErrorInsufficientDriver)
        regc_error(
            REGC_ERR_UNSUPPORTED,
            "cuda: no CUDA device: the driver's CUDA %d.%d is older than the runtime's %d.%d",
            driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    else
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: no CUDA device: %s", cudaGetErrorString(err));
}

extern "C" regc_backend *regc_cuda_backend_open(int device)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cuda_no_device_error(err);
        return NULL;
    }
    if (device >= count) {
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: device %d asked for, %d present", device, count);
        return NULL;
    }
    if ((err = cudaSetDevice(device)) != cudaSuccess) {
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: device %d cannot be used: %s", device,
                   cudaGetErrorString(err));
        return NULL;
    }
    regc_backend *be = (regc_backend *)calloc(1, sizeof *be);
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        regc_error(REGC_ERR_MEMORY, "cuda: out of memory");
        return NULL;
    }
    cuda_ctx *c = &s->ctx;
    be->ctx = s;
    be->destroy = cuda_destroy;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
        be->mem_capacity = (int64_t)total_bytes;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
        snprintf(c->device, sizeof c->device, "cuda sm_%d%d", prop.major, prop.minor);
        be->has_tf32 = prop.major >= 8; /* Ampere's tensor cores and later */
    } else
        snprintf(c->device, sizeof c->device, "cuda");
    be->device = c->device;
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: cannot create a stream on device %d", device);
        cuda_destroy(be);
        return NULL;
    }
    /* keep freed device memory in the stream-ordered pool: per-call scratch
     * would otherwise go back to the driver at every synchronisation */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    if (regc_cuda_gemm_open(be) != REGC_OK) {
        cuda_destroy(be);
        return NULL;
    }
    regc_cuda_fill_table(be);
    return be;
}
