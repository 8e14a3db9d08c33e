/* test_comm_gpu.c — the communicators over device buffers (ctest label
 * "gpu"): NCCL and the staged host communicator, in one process (one rank:
 * each collective must give its input back, the reduce-scatter that
 * accumulates adding it), through the communication queue as the step
 * program drives them. Without a usable GPU this test fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_backend.h"
#include "regc_zero3.h"

enum { N = 1000 };

static void check_comm(regc_backend *gpu, regc_comm *c)
{
    float host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)i * 0.25f - 7.0f;
    float *src = gpu->alloc(gpu, sizeof host), *dst = gpu->alloc(gpu, sizeof host);
    assert_non_null(src);
    assert_non_null(dst);
    gpu->copy_h2d(gpu, src, host, sizeof host);
    gpu->fill(gpu, dst, N, 0.0f);
    assert_int_equal(gpu->sync(gpu), REGC_OK);

    regc_comm_queue *q;
    assert_int_equal(regc_comm_queue_new(c, &q), REGC_OK);
    int64_t t1, t2;
    regc_comm_op gather = {.kind = REGC_COMM_OP_ALLGATHER, .dst = dst, .src = src, .n = N};
    regc_comm_op add = {
        .kind = REGC_COMM_OP_REDUCE_SCATTER, .dst = dst, .src = src, .n = N, .accumulate = 1};
    assert_int_equal(regc_comm_queue_start(q, &gather, &t1), REGC_OK);
    assert_int_equal(regc_comm_queue_start(q, &add, &t2), REGC_OK);
    assert_int_equal(regc_comm_queue_wait(q, t2), REGC_OK);
    regc_comm_queue_free(q);

    gpu->copy_d2h(gpu, back, dst, sizeof back);
    assert_int_equal(gpu->sync(gpu), REGC_OK);
    for (int i = 0; i < N; i++)
        if (back[i] != 2.0f * host[i])
            fail_msg("%s: element %d is %g, expected %g", c->name, i, back[i], 2.0f * host[i]);
    gpu->free(gpu, src);
    gpu->free(gpu, dst);
    /* a barrier of one rank returns; NCCL's is a collective of one value */
    if (c->barrier(c) != REGC_OK)
        fail_msg("%s: barrier: %s", c->name, regc_error_message());
}

static void test_staged_and_nccl(void **state)
{
    (void)state;
    regc_backend *gpu = regc_backend_new("cuda", 0);
    if (!gpu)
        fail_msg("no CUDA backend: %s", regc_error_message());
    regc_comm *host = regc_comm_single_new();
    regc_comm *staged = regc_comm_staged_new(host, gpu);
    assert_non_null(staged);
    check_comm(gpu, staged);
    regc_comm *nccl = regc_comm_nccl_new(host, gpu);
    if (!nccl)
        fail_msg("no NCCL: %s", regc_error_message());
    check_comm(gpu, nccl);
    regc_comm_free(nccl);
    regc_comm_free(staged);
    regc_comm_free(host);
    regc_backend_free(gpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staged_and_nccl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
