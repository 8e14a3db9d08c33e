/* queue.c — the communication queue: a thread of its own runs a
 * communicator's collectives in the order they were started, so the
 * thread that computes goes on while a unit's parameters arrive.
 *
 * Starting a collective appends it and returns a ticket (its number, from
 * 1); waiting on a ticket blocks until every collective up to it has
 * finished. Tickets finish in order, so one counter says which are done.
 * A failed collective makes every later wait fail with its message (the
 * job then ends: the ranks can no longer agree on what was sent).
 *
 * The thread is the only caller of the communicator while collectives are
 * queued; the owner drains the queue before it calls the communicator
 * itself (MPI_THREAD_SERIALIZED asks no more). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regc_zero3.h"

struct regc_comm_queue {
    regc_comm *comm;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t more, done_cv; /* work appended; a collective finished */
    regc_comm_op *ops;            /* ring of cap: ticket t at (t - 1) % cap */
    int64_t cap;
    int64_t started, done; /* tickets handed out; finished */
    int stop;
    int failed; /* the first failure's status, sticky */
    char message[512];
    double busy_ms; /* in collectives */
};

static int run_op(regc_comm *c, const regc_comm_op *op)
{
    switch (op->kind) {
    case REGC_COMM_OP_ALLGATHER: return c->allgather(c, op->dst, op->src, op->n);
    case REGC_COMM_OP_REDUCE_SCATTER:
        return c->reduce_scatter(c, op->dst, op->src, op->n, op->accumulate);
    case REGC_COMM_OP_ALLREDUCE: return c->allreduce(c, op->dst, op->n, REGC_COMM_F32);
    }
    return regc_error(REGC_ERR_ARG, "communication queue: no collective %d", (int)op->kind);
}

static void *queue_thread(void *arg)
{
    regc_comm_queue *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->stop && q->done == q->started)
            pthread_cond_wait(&q->more, &q->lock);
        if (q->done == q->started) /* stopping, and nothing left */
            break;
        regc_comm_op op = q->ops[q->done % q->cap];
        int failed = q->failed;
        pthread_mutex_unlock(&q->lock);
        double t0 = regc_time_ms();
        int rc = failed ? failed : run_op(q->comm, &op);
        double ms = regc_time_ms() - t0;
        pthread_mutex_lock(&q->lock);
        q->busy_ms += ms;
        if (op.ms)
            *op.ms = ms;
        if (rc && !q->failed) {
            q->failed = rc;
            snprintf(q->message, sizeof q->message, "%s", regc_error_message());
        }
        q->done++;
        pthread_cond_broadcast(&q->done_cv);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

int regc_comm_queue_new(regc_comm *c, regc_comm_queue **out)
{
    *out = NULL;
    regc_comm_queue *q = calloc(1, sizeof *q);
    if (!q || !(q->ops = calloc(64, sizeof *q->ops))) {
        free(q);
        return regc_error(REGC_ERR_MEMORY, "communication queue: out of memory");
    }
    q->comm = c, q->cap = 64;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->more, NULL);
    pthread_cond_init(&q->done_cv, NULL);
    if (pthread_create(&q->thread, NULL, queue_thread, q) != 0) {
        pthread_mutex_destroy(&q->lock);
        pthread_cond_destroy(&q->more), pthread_cond_destroy(&q->done_cv);
        free(q->ops), free(q);
        return regc_error(REGC_ERR_UNSUPPORTED, "communication queue: cannot start its thread");
    }
    *out = q;
    return REGC_OK;
}

/* Room for one more: the ring doubles, keeping each pending ticket's slot
 * (t - 1) % cap, so the thread never sees a half-moved ring. */
static int grow(regc_comm_queue *q)
{
    int64_t cap = 2 * q->cap;
    regc_comm_op *ops = malloc((size_t)cap * sizeof *ops);
    if (!ops)
        return regc_error(REGC_ERR_MEMORY, "communication queue: out of memory");
    for (int64_t t = q->done; t < q->started; t++)
        ops[t % cap] = q->ops[t % q->cap];
    free(q->ops);
    q->ops = ops, q->cap = cap;
    return REGC_OK;
}

int regc_comm_queue_start(regc_comm_queue *q, const regc_comm_op *op, int64_t *ticket)
{
    pthread_mutex_lock(&q->lock);
    int rc = q->started - q->done == q->cap ? grow(q) : REGC_OK;
    if (rc == REGC_OK) {
        q->ops[q->started % q->cap] = *op;
        *ticket = ++q->started;
        pthread_cond_signal(&q->more);
    }
    pthread_mutex_unlock(&q->lock);
    return rc;
}

int regc_comm_queue_wait(regc_comm_queue *q, int64_t ticket)
{
    pthread_mutex_lock(&q->lock);
    while (q->done < ticket && q->done < q->started)
        pthread_cond_wait(&q->done_cv, &q->lock);
    int rc = q->failed;
    pthread_mutex_unlock(&q->lock);
    return rc ? regc_error(rc, "%s", q->message) : REGC_OK;
}

int regc_comm_queue_drain(regc_comm_queue *q)
{
    pthread_mutex_lock(&q->lock);
    int64_t last = q->started;
    pthread_mutex_unlock(&q->lock);
    return regc_comm_queue_wait(q, last);
}

double regc_comm_queue_busy_ms(regc_comm_queue *q)
{
    pthread_mutex_lock(&q->lock);
    double ms = q->busy_ms;
    pthread_mutex_unlock(&q->lock);
    return ms;
}

void regc_comm_queue_free(regc_comm_queue *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    q->stop = 1;
    pthread_cond_signal(&q->more);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->thread, NULL);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->more), pthread_cond_destroy(&q->done_cv);
    free(q->ops), free(q);
}
