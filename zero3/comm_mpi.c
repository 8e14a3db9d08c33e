/* comm_mpi.c — the MPI communicator: MPI_COMM_WORLD over host buffers.
 *
 * regc calls MPI from one thread at a time (the program's communication
 * queue or the trainer), so MPI_THREAD_SERIALIZED is all it asks for. An
 * error in one rank must not leave the others blocked in a collective:
 * the caller aborts the job (MPI_Abort), which ends every rank.
 *
 * Each collective is started non-blocking and then tested until done,
 * yielding the core between tests: a blocking collective would spin on it,
 * and the queue's thread shares its cores with the threads that compute. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "regc_zero3.h"

#ifdef REGC_HAVE_MPI
#include <mpi.h>

typedef struct {
    int initialised_here; /* finalise on destroy */
    float *tmp;           /* reduce_scatter with accumulate */
    size_t tmp_n;
} mpi_ctx;

static int mpi_failed(const char *what, int err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    return regc_error(REGC_ERR_IO, "mpi: %s: %.*s", what, len, msg);
}

/* Wait for r, letting the compute threads run meanwhile: a few tests with
 * the core yielded between them, then short sleeps (a transfer's progress
 * is made inside MPI_Test, so the sleeps stay short). */
static int mpi_finish(MPI_Request *r, const char *what)
{
    for (int tries = 0;; tries++) {
        int done = 0;
        int err = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS)
            return mpi_failed(what, err);
        if (done)
            return REGC_OK;
        if (tries < 64) {
            sched_yield();
        } else {
            struct timespec pause = {0, 20000}; /* 20 us */
            nanosleep(&pause, NULL);
        }
    }
}

/* MPI counts are int: a large buffer goes in chunks of at most 2^30. */
#define MPI_CHUNK ((int64_t)1 << 30)

static int mpi_allgather(regc_comm *c, float *dst, const float *src, int64_t n)
{
    if (n > MPI_CHUNK)
        return regc_error(REGC_ERR_UNSUPPORTED, "mpi: allgather of %lld floats per rank",
                          (long long)n);
    const void *in = src == dst + (int64_t)c->rank * n ? MPI_IN_PLACE : src;
    MPI_Request r;
    int err = MPI_Iallgather(in, (int)n, MPI_FLOAT, dst, (int)n, MPI_FLOAT, MPI_COMM_WORLD, &r);
    return err == MPI_SUCCESS ? mpi_finish(&r, "allgather") : mpi_failed("allgather", err);
}

static int mpi_reduce_scatter(regc_comm *c, float *dst, const float *src, int64_t n, int accumulate)
{
    mpi_ctx *x = c->ctx;
    if (n > MPI_CHUNK)
        return regc_error(REGC_ERR_UNSUPPORTED, "mpi: reduce_scatter of %lld floats per rank",
                          (long long)n);
    float *out = dst;
    if (accumulate) {
        if (x->tmp_n < (size_t)n) {
            float *t = realloc(x->tmp, (size_t)n * sizeof *t);
            if (!t)
                return regc_error(REGC_ERR_MEMORY, "mpi: out of memory");
            x->tmp = t, x->tmp_n = (size_t)n;
        }
        out = x->tmp;
    }
    MPI_Request r;
    int err = MPI_Ireduce_scatter_block(src, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    if (err != MPI_SUCCESS)
        return mpi_failed("reduce_scatter", err);
    int rc = mpi_finish(&r, "reduce_scatter");
    if (rc)
        return rc;
    if (accumulate)
        for (int64_t i = 0; i < n; i++)
            dst[i] += out[i];
    return REGC_OK;
}

static int mpi_allreduce(regc_comm *c, void *buf, int64_t n, regc_comm_dtype t)
{
    (void)c;
    MPI_Datatype type = t == REGC_COMM_F32   ? MPI_FLOAT
                        : t == REGC_COMM_F64 ? MPI_DOUBLE
                                             : MPI_INT64_T;
    size_t elem = t == REGC_COMM_F32 ? 4 : 8;
    for (int64_t at = 0; at < n; at += MPI_CHUNK) {
        int64_t k = n - at < MPI_CHUNK ? n - at : MPI_CHUNK;
        MPI_Request r;
        int err = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * elem, (int)k, type,
                                 MPI_SUM, MPI_COMM_WORLD, &r);
        int rc = err == MPI_SUCCESS ? mpi_finish(&r, "allreduce") : mpi_failed("allreduce", err);
        if (rc)
            return rc;
    }
    return REGC_OK;
}

static int mpi_broadcast(regc_comm *c, void *buf, size_t bytes, int root)
{
    (void)c;
    for (size_t at = 0; at < bytes; at += (size_t)MPI_CHUNK) {
        size_t k = bytes - at < (size_t)MPI_CHUNK ? bytes - at : (size_t)MPI_CHUNK;
        int err = MPI_Bcast((char *)buf + at, (int)k, MPI_BYTE, root, MPI_COMM_WORLD);
        if (err != MPI_SUCCESS)
            return mpi_failed("broadcast", err);
    }
    return REGC_OK;
}

static int mpi_barrier(regc_comm *c)
{
    (void)c;
    int err = MPI_Barrier(MPI_COMM_WORLD);
    return err == MPI_SUCCESS ? REGC_OK : mpi_failed("barrier", err);
}

static void mpi_abort(regc_comm *c, int code)
{
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static void mpi_destroy(regc_comm *c)
{
    mpi_ctx *x = c->ctx;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (x && x->initialised_here && !finalized)
        MPI_Finalize();
    if (x)
        free(x->tmp);
    free(x);
    free(c);
}

regc_comm *regc_comm_mpi_new(void)
{
    regc_comm *c = calloc(1, sizeof *c);
    mpi_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c), free(x);
        regc_error(REGC_ERR_MEMORY, "mpi: out of memory");
        return NULL;
    }
    int initialised = 0, provided = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            free(c), free(x);
            regc_error(REGC_ERR_UNSUPPORTED, "mpi: MPI_Init_thread failed");
            return NULL;
        }
        x->initialised_here = 1;
        if (provided < MPI_THREAD_SERIALIZED) {
            MPI_Finalize();
            free(c), free(x);
            regc_error(REGC_ERR_UNSUPPORTED,
                       "mpi: the MPI library offers no MPI_THREAD_SERIALIZED (got level %d)",
                       provided);
            return NULL;
        }
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    /* the processes that share this host, so they share its cores */
    MPI_Comm local;
    c->local_size = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local) ==
        MPI_SUCCESS) {
        MPI_Comm_size(local, &c->local_size);
        MPI_Comm_rank(local, &c->local_rank);
        MPI_Comm_free(&local);
    }
    c->name = "mpi";
    c->ctx = x;
    c->allgather = mpi_allgather;
    c->reduce_scatter = mpi_reduce_scatter;
    c->allreduce = mpi_allreduce;
    c->broadcast = mpi_broadcast;
    c->barrier = mpi_barrier;
    c->abort = mpi_abort;
    c->destroy = mpi_destroy;
    return c;
}

#else

regc_comm *regc_comm_mpi_new(void)
{
    regc_error(REGC_ERR_UNSUPPORTED,
               "launched by an MPI launcher, but regc was built without MPI (install "
               "libopenmpi-dev and configure with -DREGC_MPI=ON)");
    return NULL;
}

#endif
