/* cuda_internal.h — private to the CUDA backend: its state, the helpers its
 * files share, and the function each file provides to fill its part of the
 * backend's table (cuda_backend.cu calls them all, with or without a
 * device: the table is what the completeness test compares with the CPU's).
 *
 * Conventions of every kernel file here:
 * - every launch goes on the backend's one stream, and is followed by
 *   cuda_note(be, cudaGetLastError(), "<kernel>"), so the first failure is
 *   reported by sync();
 * - no float atomics and no reduction whose order depends on scheduling:
 *   two runs give the same bits;
 * - the per-element formulas are kernel_math.h's, compiled with
 *   --fmad=false, so a per-element kernel gives the CPU's bits; a kernel
 *   whose order of summation differs from the CPU's says so at its top. */
#ifndef REGC_CUDA_INTERNAL_H
#define REGC_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel_math.h"
#include "regc_backend.h"
#include "regc_common.h"

typedef struct cuda_gemm_plans cuda_gemm_plans; /* cuda_gemm.cu */

/* copy_start's tickets in flight at once: ticket t records into event
 * t % CUDA_COPY_EVENTS (a program waits for each copy within as many more) */
#define CUDA_COPY_EVENTS 4096

typedef struct {
    cudaStream_t stream;
    cudaStream_t side;  /* copy_d2h_side's and copy_start's copies, made on first use */
    cudaEvent_t queued; /* where the stream was when a side copy was asked for */
    cudaEvent_t *done;  /* [CUDA_COPY_EVENTS] each copy's end on the side stream, or NULL */
    int no_side;        /* making side failed: side copies are made in order */
    int no_copy_queue;  /* making done failed: copies are made in order */
    int64_t next_ticket;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    cuda_gemm_plans *plans; /* cuBLASLt set up once per distinct GEMM */
    int failed;             /* first failure since the last sync */
    char what[256];
    char device[32]; /* "cuda sm_90" */
} cuda_ctx;

static inline cuda_ctx *cuda_ctx_of(regc_backend *be) { return (cuda_ctx *)be->ctx; }

static inline cudaStream_t cuda_stream(regc_backend *be) { return cuda_ctx_of(be)->stream; }

/* Remember the first failure (a launch error, an asynchronous fault
 * surfacing, a refused shape); sync() reports it. */
void cuda_note(regc_backend *be, cudaError_t err, const char *where);
/* Remember a failure that is no CUDA error: a shape a kernel refuses. The
 * message is regc_error's, set by the caller. */
void cuda_note_failure(regc_backend *be, const char *what);
/* A call a kernel refuses (a shape it cannot run): the one-line message
 * set for regc_error_message(), and the failure sync() reports. */
void cuda_refuse(regc_backend *be, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Threads per block of the one-thread-per-element kernels. */
#define CUDA_THREADS 256

/* Blocks of CUDA_THREADS covering n elements (at least 1). */
static inline unsigned cuda_blocks_for(int64_t n)
{
    const int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    return b > 0 ? (unsigned)b : 1u;
}

/* Device scratch of at least `bytes`, stream-ordered: allocated and freed
 * on the backend's stream, valid for the kernels launched between. */
void *cuda_scratch_alloc(regc_backend *be, size_t bytes, const char *what);
void cuda_scratch_free(regc_backend *be, void *ptr, const char *what);

/* Each file's part of the table (without a device every entry is still
 * set: the table is data, the device is needed only to call it). */
void regc_cuda_set_memory(regc_backend *be);        /* cuda_backend.cu */
void regc_cuda_set_gemm(regc_backend *be);          /* cuda_gemm.cu */
void regc_cuda_set_optimizer(regc_backend *be);     /* cuda_optimizer.cu */
void regc_cuda_set_elementwise(regc_backend *be);   /* cuda_elementwise.cu */
void regc_cuda_set_norm(regc_backend *be);          /* cuda_norm.cu */
void regc_cuda_set_loss(regc_backend *be);          /* cuda_loss.cu */
void regc_cuda_set_attention_fwd(regc_backend *be); /* cuda_attention_fwd.cu */
void regc_cuda_set_attention_bwd(regc_backend *be); /* cuda_attention_bwd.cu */

/* cuda_gemm.cu: the cuBLASLt handle and workspace, and the plans' end */
int regc_cuda_gemm_open(regc_backend *be);
void regc_cuda_gemm_plans_free(regc_backend *be);

#endif
