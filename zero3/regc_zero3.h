/* regc_zero3.h — what ZeRO-3 needs below the compiler: the collective
 * interface a program's communication runs on, and the layout of sharded
 * model state.
 *
 * A communicator is a struct of function pointers, like a backend: one
 * process (every collective a copy), MPI between processes on host
 * buffers, or NCCL between GPUs on device buffers. Its collectives follow
 * the backend's contract: ordered, over buffers of the communicator's kind,
 * complete at return for the host communicators. Every reduction sums in an
 * order fixed by the rank count and the sizes, so two runs give the same
 * bits. */
#ifndef REGC_ZERO3_H
#define REGC_ZERO3_H

#include <stddef.h>
#include <stdint.h>

#include "regc_common.h"

typedef enum { REGC_COMM_F32, REGC_COMM_F64, REGC_COMM_I64 } regc_comm_dtype;

typedef struct regc_comm regc_comm;

struct regc_comm {
    const char *name; /* "single", "mpi" */
    int rank, size;   /* this process and how many there are */
    int local_size;   /* processes on this host (they share its cores) */
    void *ctx;
    /* dst [size * n] = every rank's src [n] in rank order; src may be
     * dst + rank * n */
    int (*allgather)(regc_comm *c, float *dst, const float *src, int64_t n);
    /* dst [n] = (dst +) the sum over ranks of their src [rank * n .. + n]
     * (src is [size * n]); accumulate adds into dst */
    int (*reduce_scatter)(regc_comm *c, float *dst, const float *src, int64_t n, int accumulate);
    /* buf [n] = the sum over ranks of their buf, in place */
    int (*allreduce)(regc_comm *c, void *buf, int64_t n, regc_comm_dtype type);
    /* buf = root's buf */
    int (*broadcast)(regc_comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(regc_comm *c);
    /* End every process of the job with `code` (a rank that failed must not
     * leave the others waiting in a collective). Does not return for MPI. */
    void (*abort)(regc_comm *c, int code);
    void (*destroy)(regc_comm *c);
};

/* One process: every collective a copy (or nothing). */
regc_comm *regc_comm_single_new(void);
/* MPI_COMM_WORLD, initialising MPI (threads serialised: one thread at a
 * time calls MPI); NULL with a message when regc was built without MPI. */
regc_comm *regc_comm_mpi_new(void);
/* The communicator this process was started for: MPI when launched by
 * mpirun (or another MPI launcher), else one process. */
int regc_comm_open(regc_comm **out);
/* Was the process started by an MPI launcher? */
int regc_comm_launched(void);
void regc_comm_free(regc_comm *c);

#endif
