/* comm_staged.c — a host communicator over device buffers: each collective
 * copies its operands to host memory, runs there, and copies the result
 * back. It is how ranks that share one GPU communicate (NCCL refuses two
 * ranks on one device), and on the CPU backend, whose device memory is
 * host memory, the same code path with plain copies.
 *
 * The staging buffers grow to the largest collective and are reused; one
 * thread at a time calls a communicator (the program's queue, or the
 * trainer between steps), so they need no lock. */
#include <stdlib.h>
#include <string.h>

#include "regc_zero3.h"

typedef struct {
    regc_comm *host; /* borrowed */
    regc_backend *be;
    char *stage;
    size_t stage_bytes;
} staged_ctx;

/* Host memory for `bytes`, at least. */
static char *stage(regc_comm *c, size_t bytes)
{
    staged_ctx *x = c->ctx;
    if (bytes > x->stage_bytes) {
        char *s = realloc(x->stage, bytes);
        if (!s) {
            regc_error(REGC_ERR_MEMORY, "communicator %s: out of memory for %zu bytes of staging",
                       c->name, bytes);
            return NULL;
        }
        x->stage = s, x->stage_bytes = bytes;
    }
    return x->stage;
}

/* Device bytes into the stage, complete when it returns. */
static int from_device(staged_ctx *x, void *host, const void *dev, size_t bytes)
{
    x->be->copy_d2h(x->be, host, dev, bytes);
    return x->be->sync(x->be);
}

/* After the host collective (rc its status): the result back to the device. */
static int to_device(staged_ctx *x, void *dev, const void *host, size_t bytes, int rc)
{
    if (rc != REGC_OK)
        return rc;
    x->be->copy_h2d(x->be, dev, host, bytes);
    return x->be->sync(x->be);
}

static int staged_allgather(regc_comm *c, float *dst, const float *src, int64_t n)
{
    staged_ctx *x = c->ctx;
    const size_t part = (size_t)n * sizeof(float);
    float *h = (float *)stage(c, (size_t)c->size * part);
    if (!h)
        return REGC_ERR_MEMORY;
    float *mine = h + (size_t)c->rank * (size_t)n;
    int rc = from_device(x, mine, src, part);
    if (rc == REGC_OK)
        rc = x->host->allgather(x->host, h, mine, n);
    return to_device(x, dst, h, (size_t)c->size * part, rc);
}

static int staged_reduce_scatter(regc_comm *c, float *dst, const float *src, int64_t n,
                                 int accumulate)
{
    staged_ctx *x = c->ctx;
    const size_t part = (size_t)n * sizeof(float);
    /* [size x n] of sources, then [n] of the result */
    float *h = (float *)stage(c, ((size_t)c->size + 1) * part);
    if (!h)
        return REGC_ERR_MEMORY;
    float *out = h + (size_t)c->size * (size_t)n;
    if (accumulate)
        x->be->copy_d2h(x->be, out, dst, part); /* completed with the sources' copy */
    int rc = from_device(x, h, src, (size_t)c->size * part);
    if (rc == REGC_OK)
        rc = x->host->reduce_scatter(x->host, out, h, n, accumulate);
    return to_device(x, dst, out, part, rc);
}

static int staged_allreduce(regc_comm *c, void *buf, int64_t n, regc_comm_dtype t)
{
    staged_ctx *x = c->ctx;
    size_t bytes = (size_t)n * (t == REGC_COMM_F32 ? 4 : 8);
    char *h = stage(c, bytes);
    if (!h)
        return REGC_ERR_MEMORY;
    int rc = from_device(x, h, buf, bytes);
    if (rc == REGC_OK)
        rc = x->host->allreduce(x->host, h, n, t);
    return to_device(x, buf, h, bytes, rc);
}

static int staged_broadcast(regc_comm *c, void *buf, size_t bytes, int root)
{
    staged_ctx *x = c->ctx;
    char *h = stage(c, bytes);
    if (!h)
        return REGC_ERR_MEMORY;
    int rc = from_device(x, h, buf, bytes);
    if (rc == REGC_OK)
        rc = x->host->broadcast(x->host, h, bytes, root);
    return to_device(x, buf, h, bytes, rc);
}

static int staged_barrier(regc_comm *c)
{
    staged_ctx *x = c->ctx;
    return x->host->barrier(x->host);
}

static void staged_abort(regc_comm *c, int code)
{
    staged_ctx *x = c->ctx;
    x->host->abort(x->host, code);
}

static void staged_destroy(regc_comm *c)
{
    staged_ctx *x = c->ctx;
    if (x)
        free(x->stage);
    free(x);
    free(c);
}

regc_comm *regc_comm_staged_new(regc_comm *host, regc_backend *be)
{
    regc_comm *c = calloc(1, sizeof *c);
    staged_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c), free(x);
        regc_error(REGC_ERR_MEMORY, "communicator: out of memory");
        return NULL;
    }
    x->host = host, x->be = be;
    *c = (regc_comm){.name = "staged",
                     .rank = host->rank,
                     .size = host->size,
                     .local_size = host->local_size,
                     .local_rank = host->local_rank,
                     .ctx = x,
                     .allgather = staged_allgather,
                     .reduce_scatter = staged_reduce_scatter,
                     .allreduce = staged_allreduce,
                     .broadcast = staged_broadcast,
                     .barrier = staged_barrier,
                     .abort = staged_abort,
                     .destroy = staged_destroy};
    return c;
}
