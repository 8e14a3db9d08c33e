/* test_grad_schedule.c — the gradient block's transfers moved into the
 * backward (region/grad_schedule.c), checked on the programs compiled for
 * GPT-2, Llama, BERT and T5.
 *
 * - Stage 0 at 2 ranks: the update's all-reduces tile the gradient block
 *   in buckets of whole parameters, at most reduce_bucket_size elements
 *   unless one parameter is larger; scheduled, the same buckets leave the
 *   update for the flat program, each waited for after all compute.
 * - An offloaded update (stage 0 in one process, stage 3 at 2 ranks): its
 *   copy of the gradients to the host leaves the update for one copy per
 *   range of the block, the ranges tiling it.
 * - Either way each piece starts right after the last instruction that
 *   writes a byte of it (the wait for a reduce-scatter included), nothing
 *   writes those bytes after it, and some start while the backward still
 *   computes. That they compute the update's bits is held by the runs in
 *   tests/test_zero3.c and tests/test_ranks.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_train.h"
#include "validate.h"

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

static regc_program *compile_step(const char *preset, const regc_compile_options *co)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    regc_program *p = NULL;
    if (regc_program_compile(m, 2, 16, co, &p, NULL) != REGC_OK)
        fail_msg("%s: %s", preset, regc_error_message());
    regc_model_free(m);
    return p;
}

/* Does `in` write gradient bytes in [lo, hi) (the bytes each operand
 * touches: a reduce-scatter names the whole block at an offset)? A moved
 * piece (an all-reduce of the block, its wait, a copy to the host) is not
 * one of its writers. */
static int writes_grads(const regc_program *p, const regc_instr *in, int64_t lo, int64_t hi)
{
    if (in->kernel == K_ALLREDUCE || (in->kernel == K_COMM_WAIT && in->d[1] == K_ALLREDUCE) ||
        in->kernel == K_COPY_D2H)
        return 0;
    regc_instr_extent e;
    assert_int_equal(regc_instr_extent_of(in, p->ranks, &e), REGC_OK);
    for (int k = 0; k < in->n_refs; k++) {
        const int b = in->refs[k].buf;
        const int64_t at = b >= 0 ? p->bufs[b].offset + in->refs[k].off : 0;
        if (b >= 0 && p->bufs[b].kind == BUF_GRADS && regc_instr_writes(in, k) && at < hi &&
            lo < at + e.bytes[k])
            return 1;
    }
    return 0;
}

static int is_piece(const regc_instr *in, int kernel)
{
    return in->kernel == kernel && (kernel != K_ALLREDUCE || in->d[1] == 0);
}

/* The pieces of `kernel` in q's flat program (their gradient bytes at
 * ref `ref`, d0 elements of `elem` bytes): they tile the block; each starts
 * right after its last writer and nothing writes its bytes after it; how
 * many start before the last compute instruction. */
static int check_pieces(const char *preset, const regc_program *q, int kernel, int ref,
                        int64_t elem)
{
    int last_compute = -1, n = 0, early = 0;
    for (int i = 0; i < q->n_instr; i++)
        if (q->instr[i].kernel != K_COMM_WAIT && !is_piece(&q->instr[i], kernel))
            last_compute = i;
    int64_t covered = 0;
    for (int i = 0; i < q->n_instr; i++) {
        const regc_instr *in = &q->instr[i];
        if (!is_piece(in, kernel))
            continue;
        const int64_t lo = q->bufs[in->refs[ref].buf].offset + in->refs[ref].off,
                      hi = lo + in->d[0] * elem;
        covered += hi - lo;
        for (int j = i + 1; j < q->n_instr; j++)
            if (writes_grads(q, &q->instr[j], lo, hi))
                fail_msg("%s: instruction %d writes gradients [%lld, %lld) moved out at %d", preset,
                         j, (long long)lo, (long long)hi, i);
        int j = i - 1; /* right after its last writer */
        while (j >= 0 && is_piece(&q->instr[j], kernel))
            j--;
        int ever = 0;
        for (int k = 0; k <= j && !ever; k++)
            ever = writes_grads(q, &q->instr[k], lo, hi);
        if (ever && !writes_grads(q, &q->instr[j], lo, hi))
            fail_msg("%s: [%lld, %lld) moves out at %d, not right after its last writer", preset,
                     (long long)lo, (long long)hi, i);
        n++;
        early += i < last_compute;
    }
    assert_true(covered == q->block_bytes);
    if (early < 2)
        fail_msg("%s: only %d of %d pieces start before the backward ends", preset, early, n);
    return n;
}

/* ---- stage 0's buckets ---------------------------------------------------------- */

static void check_buckets(const char *preset, int64_t bucket)
{
    regc_program *p[2]; /* scheduled, in the update */
    for (int s = 0; s < 2; s++) {
        regc_compile_options co;
        regc_compile_options_default(&co);
        co.ranks = 2, co.reduce_bucket_floats = bucket, co.deepcompile = s == 0;
        p[s] = compile_step(preset, &co);
    }
    /* in the update: the block tiled, buckets of whole parameters */
    int64_t at = 0;
    int n = 0;
    for (int i = 0; i < p[1]->n_update; i++) {
        const regc_instr *u = &p[1]->update[i];
        if (!is_piece(u, K_ALLREDUCE))
            continue;
        const int64_t lo = u->refs[0].off, hi = lo + u->d[0] * (int64_t)sizeof(float);
        if (lo != at)
            fail_msg("%s: bucket %d starts at byte %lld, the previous ended at %lld", preset, n,
                     (long long)lo, (long long)at);
        int params = 0; /* parameters starting in it */
        for (int b = 0; b < p[1]->n_bufs; b++)
            params += p[1]->bufs[b].kind == BUF_GRADS && p[1]->bufs[b].bytes < p[1]->block_bytes &&
                      p[1]->bufs[b].offset >= lo && p[1]->bufs[b].offset < hi;
        if (u->d[0] > bucket && params > 1)
            fail_msg("%s: bucket %d holds %d parameters in %lld floats, over %lld", preset, n,
                     params, (long long)u->d[0], (long long)bucket);
        at = hi, n++;
    }
    assert_int_equal(at, p[1]->block_bytes);
    assert_true(n > 2);
    /* scheduled: the same buckets, out of the update, into the backward */
    const regc_program *q = p[0];
    for (int i = 0; i < q->n_update; i++)
        assert_false(is_piece(&q->update[i], K_ALLREDUCE));
    for (int i = 0; i < q->n_instr; i++) {
        const regc_instr *in = &q->instr[i];
        if (!is_piece(in, K_ALLREDUCE))
            continue;
        int found = 0, waited = 0;
        for (int j = 0; j < p[1]->n_update && !found; j++)
            found = is_piece(&p[1]->update[j], K_ALLREDUCE) &&
                    p[1]->update[j].refs[0].off == in->refs[0].off &&
                    p[1]->update[j].d[0] == in->d[0];
        for (int j = i + 1; j < q->n_instr; j++)
            waited += q->instr[j].kernel == K_COMM_WAIT && q->instr[j].signal == in->signal;
        assert_true(found);
        assert_int_equal(waited, 1);
    }
    assert_int_equal(check_pieces(preset, q, K_ALLREDUCE, 0, (int64_t)sizeof(float)), n);
    assert_int_equal(q->n_signals, n);
    regc_program_free(p[0]), regc_program_free(p[1]);
}

static void test_stage0_buckets_overlap_the_backward(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        check_buckets(presets[i], 1000);
        check_buckets(presets[i], 20000);
    }
}

/* ---- an offloaded update's copies ---------------------------------------------- */

static void check_copies(const char *preset, int ranks, int stage)
{
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.ranks = ranks, co.zero_stage = stage, co.offload_optimizer = 1;
    regc_program *q = compile_step(preset, &co);
    for (int i = 0; i < q->n_update; i++)
        if (q->update[i].kernel == K_COPY_D2H)
            assert_true(q->bufs[q->update[i].refs[1].buf].kind != BUF_GRADS);
    const int n = check_pieces(preset, q, K_COPY_D2H, 1, 1);
    assert_true(n > 2);
    regc_program_free(q);
}

static void test_offloaded_copies_overlap_the_backward(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        check_copies(presets[i], 1, 0);
        check_copies(presets[i], 2, 3);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage0_buckets_overlap_the_backward),
        cmocka_unit_test(test_offloaded_copies_overlap_the_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
