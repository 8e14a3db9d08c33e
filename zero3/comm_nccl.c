/* comm_nccl.c — NCCL between GPUs, bootstrapped over a host communicator
 * as llm.c does: rank 0 makes the unique id, the host communicator
 * broadcasts it, every rank joins with its own device.
 *
 * The collectives run on a stream of their own and are complete at return
 * (the stream is synchronised), the contract of every communicator: the
 * communication queue's thread calls them, and the compute stream goes on
 * meanwhile. CUDA's current device is per thread, so every call sets it.
 * A reduce-scatter that accumulates reduces into a scratch buffer and adds
 * it with the backend's own add.
 *
 * Built into libregc_cuda.so (kernels/cuda_module.h), never into the
 * library: regc_comm_nccl_new (comm.c) loads it. */
#include <stdlib.h>
#include <string.h>

#include "regc_zero3.h"

#include <cuda_runtime.h>
#include <nccl.h>

typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;
    int device;
    /* device scratch of the accumulating reduce-scatter and the barrier:
     * cudaMalloc'd, not the backend's, whose stream-ordered pool and
     * bookkeeping belong to the compute thread (collectives run on the
     * queue's thread) */
    float *tmp;
    size_t tmp_n;
} nccl_ctx;

static int nccl_failed(const char *what, ncclResult_t r)
{
    return regc_error(REGC_ERR_IO, "nccl: %s: %s", what, ncclGetErrorString(r));
}

/* Wait for the stream; the first failure of the calls before it, if any. */
static int nccl_finish(nccl_ctx *x, const char *what, ncclResult_t r)
{
    if (r != ncclSuccess)
        return nccl_failed(what, r);
    cudaError_t e = cudaStreamSynchronize(x->stream);
    return e == cudaSuccess ? REGC_OK
                            : regc_error(REGC_ERR_IO, "nccl: %s: %s", what, cudaGetErrorString(e));
}

/* x->tmp holds at least n floats, zeros when new (the barrier sums what
 * is there). */
static int nccl_scratch(nccl_ctx *x, size_t n, const char *what)
{
    if (x->tmp_n >= n)
        return REGC_OK;
    cudaFree(x->tmp);
    x->tmp = NULL;
    x->tmp_n = 0;
    cudaError_t e = cudaMalloc((void **)&x->tmp, n * sizeof(float));
    /* zeroed on the collectives' stream, where every use of tmp runs: a
     * plain cudaMemset of device memory is asynchronous and goes on the
     * legacy stream, which x->stream (non-blocking) is not ordered after */
    if (e == cudaSuccess)
        e = cudaMemsetAsync(x->tmp, 0, n * sizeof(float), x->stream);
    if (e != cudaSuccess)
        return regc_error(REGC_ERR_MEMORY, "nccl: %s: %zu bytes of scratch: %s", what,
                          n * sizeof(float), cudaGetErrorString(e));
    x->tmp_n = n;
    return REGC_OK;
}

static int nccl_allgather(regc_comm *c, float *dst, const float *src, int64_t n)
{
    nccl_ctx *x = c->ctx;
    cudaSetDevice(x->device);
    return nccl_finish(x, "allgather",
                       ncclAllGather(src, dst, (size_t)n, ncclFloat32, x->nccl, x->stream));
}

static int nccl_reduce_scatter(regc_comm *c, float *dst, const float *src, int64_t n,
                               int accumulate)
{
    nccl_ctx *x = c->ctx;
    cudaSetDevice(x->device);
    float *out = dst;
    if (accumulate) {
        int rc = nccl_scratch(x, (size_t)n, "reduce_scatter");
        if (rc != REGC_OK)
            return rc;
        out = x->tmp;
    }
    int rc = nccl_finish(
        x, "reduce_scatter",
        ncclReduceScatter(src, out, (size_t)n, ncclFloat32, ncclSum, x->nccl, x->stream));
    if (rc == REGC_OK && accumulate) { /* on the collectives' stream, after them */
        cudaError_t e = (cudaError_t)regc_cuda_add_on_stream(x->stream, dst, dst, x->tmp, n);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(x->stream);
        if (e != cudaSuccess)
            rc = regc_error(REGC_ERR_IO, "nccl: reduce_scatter: the accumulating add: %s",
                            cudaGetErrorString(e));
    }
    return rc;
}

static int nccl_allreduce(regc_comm *c, void *buf, int64_t n, regc_comm_dtype t)
{
    nccl_ctx *x = c->ctx;
    cudaSetDevice(x->device);
    ncclDataType_t type = t == REGC_COMM_F32   ? ncclFloat32
                          : t == REGC_COMM_F64 ? ncclFloat64
                                               : ncclInt64;
    return nccl_finish(x, "allreduce",
                       ncclAllReduce(buf, buf, (size_t)n, type, ncclSum, x->nccl, x->stream));
}

static int nccl_broadcast(regc_comm *c, void *buf, size_t bytes, int root)
{
    nccl_ctx *x = c->ctx;
    cudaSetDevice(x->device);
    return nccl_finish(x, "broadcast",
                       ncclBroadcast(buf, buf, bytes, ncclChar, root, x->nccl, x->stream));
}

static int nccl_barrier(regc_comm *c)
{
    /* an all-reduce of one value, waited for, returns on no rank before
     * every rank has entered it (NCCL drops a collective of nothing
     * without ordering anything) */
    nccl_ctx *x = c->ctx;
    cudaSetDevice(x->device);
    int rc = nccl_scratch(x, 1, "barrier");
    if (rc != REGC_OK)
        return rc;
    return nccl_finish(x, "barrier",
                       ncclAllReduce(x->tmp, x->tmp, 1, ncclFloat32, ncclSum, x->nccl, x->stream));
}

static void nccl_abort(regc_comm *c, int code)
{
    nccl_ctx *x = c->ctx;
    ncclCommAbort(x->nccl);
    exit(code);
}

static void nccl_destroy(regc_comm *c)
{
    nccl_ctx *x = c->ctx;
    if (x) {
        cudaSetDevice(x->device);
        cudaFree(x->tmp);
        ncclCommDestroy(x->nccl);
        cudaStreamDestroy(x->stream);
    }
    free(x);
    free(c);
}

void *regc_cuda_nccl_comm_open(void *host_comm, regc_backend *be)
{
    regc_comm *host = host_comm;
    regc_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c), free(x);
        regc_error(REGC_ERR_MEMORY, "nccl: out of memory");
        return NULL;
    }
    (void)be; /* the current device is the backend's: it was opened last */
    ncclUniqueId id;
    ncclResult_t r = ncclSuccess;
    if (host->rank == 0)
        r = ncclGetUniqueId(&id);
    /* every rank takes part in the broadcast, so none is left waiting */
    int rc = host->broadcast(host, &id, sizeof id, 0);
    if (rc == REGC_OK && r != ncclSuccess)
        rc = nccl_failed("ncclGetUniqueId", r);
    if (rc == REGC_OK && cudaGetDevice(&x->device) != cudaSuccess)
        rc = regc_error(REGC_ERR_IO, "nccl: no current CUDA device");
    if (rc == REGC_OK &&
        cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking) != cudaSuccess)
        rc = regc_error(REGC_ERR_IO, "nccl: cannot create a stream on device %d", x->device);
    if (rc == REGC_OK &&
        (r = ncclCommInitRank(&x->nccl, host->size, id, host->rank)) != ncclSuccess) {
        cudaStreamDestroy(x->stream);
        rc =
            nccl_failed("ncclCommInitRank (ranks sharing one GPU need the staged communicator)", r);
    }
    if (rc != REGC_OK) {
        free(c), free(x);
        return NULL;
    }
    *c = (regc_comm){.name = "nccl",
                     .rank = host->rank,
                     .size = host->size,
                     .local_size = host->local_size,
                     .local_rank = host->local_rank,
                     .ctx = x,
                     .allgather = nccl_allgather,
                     .reduce_scatter = nccl_reduce_scatter,
                     .allreduce = nccl_allreduce,
                     .broadcast = nccl_broadcast,
                     .barrier = nccl_barrier,
                     .abort = nccl_abort,
                     .destroy = nccl_destroy};
    return c;
}
