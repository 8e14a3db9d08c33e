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

#include "regc_backend.h"
#include "regc_common.h"

typedef enum { REGC_COMM_F32, REGC_COMM_F64, REGC_COMM_I64 } regc_comm_dtype;

typedef struct regc_comm regc_comm;

struct regc_comm {
    const char *name; /* "single", "mpi" */
    int rank, size;   /* this process and how many there are */
    int local_size;   /* processes on this host (they share its cores) */
    int local_rank;   /* this process among them (which GPU it takes) */
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
/* A communicator over device buffers of `be` that stages them through
 * host memory around `host`'s collectives (borrowed: it must outlive this
 * one): ranks that share a GPU, or any backend. */
regc_comm *regc_comm_staged_new(regc_comm *host, regc_backend *be);
/* NCCL between the GPUs of the ranks `host` connects (rank 0's unique id
 * is broadcast over it), on device buffers of the CUDA backend `be`; NULL
 * with a message when regc was built without NCCL or NCCL fails (two
 * ranks on one GPU, say). */
regc_comm *regc_comm_nccl_new(regc_comm *host, regc_backend *be);
/* Its implementation, inside libregc_cuda.so only (comm_nccl.c). */
void *regc_cuda_nccl_comm_open(void *host, regc_backend *be);
/* The communicator this process was started for: MPI when launched by
 * mpirun (or another MPI launcher), else one process. */
int regc_comm_open(regc_comm **out);
/* Was the process started by an MPI launcher? */
int regc_comm_launched(void);
void regc_comm_free(regc_comm *c);

/* ---------------------------------------------------------------- the queue
 * Collectives run asynchronously on a thread of their own, in the order
 * they were started (the same order on every rank): start returns a
 * ticket at once, wait blocks until that collective and every one before
 * it has finished. While collectives are queued, only the queue's thread
 * calls the communicator; drain before calling it yourself. */
typedef enum {
    REGC_COMM_OP_ALLGATHER,
    REGC_COMM_OP_REDUCE_SCATTER,
    REGC_COMM_OP_ALLREDUCE /* f32, in place in dst */
} regc_comm_op_kind;

typedef struct {
    regc_comm_op_kind kind;
    float *dst;
    const float *src;
    int64_t n; /* floats per rank, as the collective takes them */
    int accumulate;
    double *ms; /* NULL, or where the thread puts the collective's own time */
} regc_comm_op;

typedef struct regc_comm_queue regc_comm_queue;

int regc_comm_queue_new(regc_comm *c, regc_comm_queue **out);
int regc_comm_queue_start(regc_comm_queue *q, const regc_comm_op *op, int64_t *ticket);
/* The first failure of any collective so far, with its message. */
int regc_comm_queue_wait(regc_comm_queue *q, int64_t ticket);
int regc_comm_queue_drain(regc_comm_queue *q);
/* Milliseconds the thread has spent in collectives. */
double regc_comm_queue_busy_ms(regc_comm_queue *q);
/* Drains, then stops the thread. */
void regc_comm_queue_free(regc_comm_queue *q);

/* ---------------------------------------------------------------- shards
 * ZeRO-3's layout of model state. The parameters fall into gather units
 * (a region instance's, a piece of glue's), each laid out flat and padded
 * so that it splits into `ranks` equal shards whose sizes are multiples of
 * REGC_SHARD_ALIGN floats. Rank r holds shard r of every unit, one after
 * another: its block of parameters (and of gradients, and of AdamW's m
 * and v) is shard_floats long, 1/ranks of the padded model. Gathering unit
 * u (an all-gather of its shards) gives the unit whole, parameter i at
 * param_offset[i] within it. */
#define REGC_SHARD_ALIGN 16 /* floats: 64 bytes */

typedef struct {
    int ranks;
    int n_units;
    int64_t *unit_floats;  /* [n_units] its parameters' elements */
    int64_t *unit_padded;  /* [n_units] a multiple of ranks x REGC_SHARD_ALIGN */
    int64_t *unit_shard;   /* [n_units] each rank's part: unit_padded / ranks */
    int64_t *shard_offset; /* [n_units] where the unit's shard starts in a rank's block */
    int64_t shard_floats;  /* a rank's block */
    int n_params;
    int *param_unit;       /* [n_params], in the model's order */
    int64_t *param_offset; /* [n_params] floats into its unit */
    int64_t *param_numel;  /* [n_params] */
    int64_t *model_offset; /* [n_params] floats into the model's block (its order) */
    int64_t model_floats;  /* the model's block */
} regc_shard_layout;

/* Lay out n_params parameters (numel[i] elements at model_offset[i] of the
 * model's block, in unit unit_of[i], in that order within each unit) over
 * `ranks` ranks. */
int regc_shard_layout_new(int ranks, int n_params, const int64_t *numel,
                          const int64_t *model_offset, const int *unit_of, int n_units,
                          regc_shard_layout **out);
void regc_shard_layout_free(regc_shard_layout *l);
/* Do a and b (either may be NULL) lay the same parameters out alike? */
int regc_shard_layout_same(const regc_shard_layout *a, const regc_shard_layout *b);
/* Rank r's shard of the model's block into shard [shard_floats]; padding
 * is zero. */
void regc_shard_take(const regc_shard_layout *l, int rank, const float *model, float *shard);
/* The elements [*first, *first + *n) of parameter i that rank r holds, at
 * float *at of its block (*n = 0: none): what a rank reads of a checkpoint. */
void regc_shard_param_part(const regc_shard_layout *l, int i, int rank, int64_t *first, int64_t *n,
                           int64_t *at);
/* The model's block from every rank's shard, one after another
 * ([ranks x shard_floats], as an all-gather of the blocks gives them). */
void regc_shard_join(const regc_shard_layout *l, const float *all_shards, float *model);

#endif
