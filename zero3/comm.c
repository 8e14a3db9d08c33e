/* comm.c — the communicator a process runs with, and the one-process
 * communicator: with a single rank every collective is a copy of the
 * process's own data (or nothing), so a program built for ranks runs
 * unchanged, and ZeRO-3 at one rank gives stage 0's bits. */
#include <stdlib.h>
#include <string.h>

#include "regc_zero3.h"

static int single_allgather(regc_comm *c, float *dst, const float *src, int64_t n)
{
    (void)c;
    if (dst != src)
        memmove(dst, src, (size_t)n * sizeof *dst);
    return REGC_OK;
}

static int single_reduce_scatter(regc_comm *c, float *dst, const float *src, int64_t n,
                                 int accumulate)
{
    (void)c;
    if (accumulate)
        for (int64_t i = 0; i < n; i++)
            dst[i] += src[i];
    else if (dst != src)
        memmove(dst, src, (size_t)n * sizeof *dst);
    return REGC_OK;
}

static int single_allreduce(regc_comm *c, void *buf, int64_t n, regc_comm_dtype t)
{
    (void)c, (void)buf, (void)n, (void)t;
    return REGC_OK;
}

static int single_broadcast(regc_comm *c, void *buf, size_t bytes, int root)
{
    (void)c, (void)buf, (void)bytes, (void)root;
    return REGC_OK;
}

static int single_barrier(regc_comm *c)
{
    (void)c;
    return REGC_OK;
}

static void single_abort(regc_comm *c, int code)
{
    (void)c;
    exit(code);
}

static void single_destroy(regc_comm *c) { free(c); }

/* NCCL lives in the CUDA module, loaded on first use (regc_backend.h). */
regc_comm *regc_comm_nccl_new(regc_comm *host, regc_backend *be)
{
    const regc_cuda_module *m = regc_cuda_module_get();
    if (m && !m->nccl_comm_new)
        regc_error(REGC_ERR_UNSUPPORTED,
                   "communicator nccl: regc was built without NCCL (it comes with the CUDA "
                   "toolkit; configure with the toolkit present)");
    return m && m->nccl_comm_new ? m->nccl_comm_new(host, be) : NULL;
}

regc_comm *regc_comm_single_new(void)
{
    regc_comm *c = calloc(1, sizeof *c);
    if (!c) {
        regc_error(REGC_ERR_MEMORY, "communicator: out of memory");
        return NULL;
    }
    *c = (regc_comm){.name = "single",
                     .rank = 0,
                     .size = 1,
                     .local_size = 1,
                     .allgather = single_allgather,
                     .reduce_scatter = single_reduce_scatter,
                     .allreduce = single_allreduce,
                     .broadcast = single_broadcast,
                     .barrier = single_barrier,
                     .abort = single_abort,
                     .destroy = single_destroy};
    return c;
}

int regc_comm_launched(void)
{
    /* Open MPI, MPICH and Slurm's PMI each leave one of these */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int regc_comm_open(regc_comm **out)
{
    *out = regc_comm_launched() ? regc_comm_mpi_new() : regc_comm_single_new();
    return *out ? REGC_OK : REGC_ERR_UNSUPPORTED;
}

void regc_comm_free(regc_comm *c)
{
    if (c && c->destroy)
        c->destroy(c);
}
