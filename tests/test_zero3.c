/* test_zero3.c — ZeRO-3 in one process: the shard layout, the placed
 * communication and stage 3 against stage 0.
 *
 * - The layout: every unit splits into equal aligned shards, taking every
 *   rank's shard and joining them gives the model back, padding is zero.
 * - Stage 3 at N = 1 gives stage 0's losses and weights bit for bit (the
 *   all-gathers and reduce-scatters are copies; AdamW runs per element),
 *   for GPT-2, Llama, BERT and T5; with accumulation and with clipping the
 *   sums run in another order: the weights after one step within 1e-6,
 *   the losses of four steps within 1e-5.
 * - Under stage 3, the lazy program (O0, and O1 without inline back) and
 *   the flat one agree bit for bit, as do regional and full compiles, a
 *   program read back from the compile cache, and units kept resident.
 * - In the flat program at 2 ranks: each unit is gathered once in forward
 *   and at most once in backward, started before any instruction reads it
 *   and read only after its wait; nothing else writes its arena bytes until
 *   its last reader (the plan releases it there, and reuses the bytes
 *   after); with prefetch each gather starts before the previous one is
 *   waited for, on demand where it is waited for; each unit's gradients
 *   are reduce-scattered once, after every instruction that writes them,
 *   and their bytes kept until the reduce-scatter is done.
 * - Under a memory budget the program fits it, more budget never buys less
 *   prefetch or fewer resident units, and too small a budget is refused.
 * - The blocks hold 1/N of the padded model.
 * - The communication queue keeps the order of starts and carries a
 *   failure's message to every later wait; the staged communicator gives
 *   the host communicator's results. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_backend.h"
#include "regc_train.h"
#include "test_model.h"
#include "test_util.h"

#define STEPS 4

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

/* ---- the layout -------------------------------------------------------- */

static void test_layout_takes_and_joins(void **state)
{
    (void)state;
    enum { P = 11 };
    int64_t numel[P], offset[P], at = 0;
    int unit[P];
    for (int i = 0; i < P; i++) {
        numel[i] = (int64_t)(regc_rng_at(5, (uint64_t)i) % 97) + (i == 4 ? 0 : 1);
        offset[i] = at, at += numel[i];
        unit[i] = i < 3 ? 0 : i < 4 ? 2 : 1 + (i % 2); /* units interleave */
    }
    float *model = malloc((size_t)at * sizeof *model), *back = malloc((size_t)at * sizeof *back);
    for (int64_t e = 0; e < at; e++)
        model[e] = (float)e + 0.5f;
    for (int ranks = 1; ranks <= 5; ranks++) {
        regc_shard_layout *l;
        assert_int_equal(regc_shard_layout_new(ranks, P, numel, offset, unit, 3, &l), REGC_OK);
        assert_int_equal(l->model_floats, at);
        int64_t padded = 0;
        for (int u = 0; u < l->n_units; u++) {
            assert_int_equal(l->unit_padded[u] % (ranks * REGC_SHARD_ALIGN), 0);
            assert_true(l->unit_padded[u] >= l->unit_floats[u]);
            assert_true(l->unit_padded[u] - l->unit_floats[u] < ranks * REGC_SHARD_ALIGN);
            padded += l->unit_padded[u];
        }
        assert_int_equal(l->shard_floats * ranks, padded);
        float *all = malloc((size_t)(ranks * l->shard_floats) * sizeof *all);
        double in_shards = 0.0, in_model = 0.0;
        for (int r = 0; r < ranks; r++)
            regc_shard_take(l, r, model, all + r * l->shard_floats);
        for (int64_t e = 0; e < ranks * l->shard_floats; e++)
            in_shards += all[e];
        for (int64_t e = 0; e < at; e++)
            in_model += model[e];
        assert_true(in_shards == in_model); /* each element once, padding zero */
        memset(back, 0, (size_t)at * sizeof *back);
        regc_shard_join(l, all, back);
        assert_memory_equal(back, model, (size_t)at * sizeof *back);
        free(all);
        regc_shard_layout_free(l);
    }
    regc_shard_layout *l;
    int bad[P] = {0};
    bad[3] = 7;
    assert_int_equal(regc_shard_layout_new(2, P, numel, offset, bad, 3, &l), REGC_ERR_ARG);
    assert_null(l);
    free(model), free(back);
}

/* ---- the queue and the staged communicator ------------------------------- */

static int failing_allgather(regc_comm *c, float *dst, const float *src, int64_t n)
{
    (void)c, (void)dst, (void)src;
    return regc_error(REGC_ERR_IO, "test: allgather of %lld floats failed", (long long)n);
}

/* Collectives finish in the order started, a staged communicator (device
 * buffers through host copies, here the CPU backend's) gives the host
 * one's results, and a failure reaches every later wait with its message. */
static void test_queue_and_staged(void **state)
{
    (void)state;
    enum { N = 257 };
    regc_backend *be = regc_backend_cpu_new(1);
    regc_comm *host = regc_comm_single_new(), *staged = regc_comm_staged_new(host, be);
    float *src = be->alloc(be, N * sizeof(float)), *dst = be->alloc(be, N * sizeof(float));
    for (int i = 0; i < N; i++)
        src[i] = (float)i - 100.5f, dst[i] = 1.0f;
    regc_comm_queue *q;
    assert_int_equal(regc_comm_queue_new(staged, &q), REGC_OK);
    int64_t t[3];
    regc_comm_op add = {
        .kind = REGC_COMM_OP_REDUCE_SCATTER, .dst = dst, .src = src, .n = N, .accumulate = 1};
    for (int k = 0; k < 3; k++)
        assert_int_equal(regc_comm_queue_start(q, &add, &t[k]), REGC_OK);
    assert_true(t[0] < t[1] && t[1] < t[2]);
    assert_int_equal(regc_comm_queue_wait(q, t[2]), REGC_OK);
    for (int i = 0; i < N; i++)
        assert_true(dst[i] == 1.0f + 3.0f * src[i]);
    regc_comm_queue_free(q);

    regc_comm broken = *host;
    broken.allgather = failing_allgather;
    assert_int_equal(regc_comm_queue_new(&broken, &q), REGC_OK);
    regc_comm_op gather = {.kind = REGC_COMM_OP_ALLGATHER, .dst = dst, .src = src, .n = N};
    assert_int_equal(regc_comm_queue_start(q, &gather, &t[0]), REGC_OK);
    assert_int_equal(regc_comm_queue_start(q, &add, &t[1]), REGC_OK);
    assert_int_equal(regc_comm_queue_wait(q, t[1]), REGC_ERR_IO);
    assert_non_null(strstr(regc_error_message(), "allgather of 257 floats failed"));
    assert_int_equal(regc_comm_queue_drain(q), REGC_ERR_IO);
    regc_comm_queue_free(q);
    be->free(be, src), be->free(be, dst);
    regc_comm_free(staged), regc_comm_free(host);
    regc_backend_free(be);
}

/* ---- stage 3 against stage 0, in one process ---------------------------- */

static regc_train_options options(int stage)
{
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 16, o.steps = STEPS, o.lr = 1e-3f, o.weight_decay = 0.01f, o.threads = 2;
    o.zero_stage = stage;
    return o;
}

static void expect_same(const char *what, const char *preset, const regc_test_losses *a,
                        regc_model *ma, const regc_test_losses *b, regc_model *mb)
{
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&a->loss[k], &b->loss[k], sizeof a->loss[k]) != 0)
            fail_msg("%s, %s step %d: %.9g vs %.9g", preset, what, k, a->loss[k], b->loss[k]);
    regc_test_assert_same_weights(ma, mb);
    regc_model_free(ma);
    regc_model_free(mb);
}

/* Accumulating, stage 3 sums each micro-batch's gradients apart and adds
 * them to the shard, where stage 0 adds into the block as it goes: the
 * same sums in another order. Weights after one step agree to rounding;
 * over several steps rounding may grow (AdamW divides by small second
 * moments), so the losses are held to 1e-5. */
static void expect_close(const char *what, const char *preset, const regc_test_losses *a,
                         const regc_test_losses *b, int steps)
{
    for (int k = 0; k < steps; k++)
        if (!(fabsf(a->loss[k] - b->loss[k]) <= 1e-5f * fabsf(a->loss[k])))
            fail_msg("%s, %s step %d: %.9g vs %.9g", preset, what, k, a->loss[k], b->loss[k]);
}

static void expect_close_weights(const char *what, const char *preset, regc_model *ma,
                                 regc_model *mb)
{
    const float *wa = regc_model_weights(ma), *wb = regc_model_weights(mb);
    for (int64_t e = 0; e < regc_model_total_numel(ma); e++)
        if (!(fabsf(wa[e] - wb[e]) <= 1e-6f))
            fail_msg("%s, %s: weight %lld is %.9g vs %.9g", preset, what, (long long)e, wa[e],
                     wb[e]);
    regc_model_free(ma);
    regc_model_free(mb);
}

static void test_stage3_equals_stage0(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_train_options z0 = options(0), z3 = options(3);
        regc_test_losses l0, l3;
        regc_model *m0 = regc_test_train(presets[i], &z0, &l0);
        regc_model *m3 = regc_test_train(presets[i], &z3, &l3);
        expect_same("stage 3 at one rank against stage 0", presets[i], &l0, m0, &l3, m3);
    }
}

static void test_stage3_accumulates_and_clips(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_train_options z0 = options(0), z3 = options(3);
        z0.grad_accum = z3.grad_accum = 2;
        z0.max_grad_norm = z3.max_grad_norm = 0.5;
        regc_test_losses l0, l3;
        regc_model_free(regc_test_train(presets[i], &z0, &l0));
        regc_model_free(regc_test_train(presets[i], &z3, &l3));
        expect_close("stage 3 accumulating and clipping", presets[i], &l0, &l3, STEPS);
        z0.steps = z3.steps = 1;
        regc_model *m0 = regc_test_train(presets[i], &z0, &l0);
        regc_model *m3 = regc_test_train(presets[i], &z3, &l3);
        expect_close_weights("stage 3 accumulating and clipping, one step", presets[i], m0, m3);
    }
}

/* Every way of compiling the stage 3 step gives the same bits. */
static void test_stage3_programs_agree(void **state)
{
    (void)state;
    char *cache = regc_test_make_temp_dir("zero3-cache");
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_train_options flat = options(3);
        regc_test_losses lf;
        regc_model *mf = regc_test_train(presets[i], &flat, &lf);
        struct {
            const char *what;
            regc_level level;
            int inline_back, regional;
            const char *cache;
            int64_t budget;
        } ways[] = {
            {"O0 (lazy)", REGC_LEVEL_O0, 0, 1, NULL, 0},
            {"O1 without inline back", REGC_LEVEL_O1, 0, 1, NULL, 0},
            {"the whole step as one region", REGC_LEVEL_O1, 1, 0, NULL, 0},
            {"a compile cache miss", REGC_LEVEL_O1, 1, 1, cache, 0},
            {"a compile cache hit", REGC_LEVEL_O1, 1, 1, cache, 0},
            /* every unit resident, gathers four units ahead */
            {"a budget with room for everything", REGC_LEVEL_O1, 1, 1, NULL, INT64_C(1) << 40},
            {"the lazy program, every unit resident", REGC_LEVEL_O0, 0, 1, NULL, INT64_C(1) << 40},
            /* every unit persistent: gathered once a step */
            {"every unit persistent", REGC_LEVEL_O1, 1, 1, NULL, -1},
            /* four units ahead, but at most one gathered at once */
            {"a live-parameter limit", REGC_LEVEL_O1, 1, 1, NULL, -2},
            /* every reduce-scatter waited for at the end */
            {"a reduce bucket holding every unit", REGC_LEVEL_O1, 1, 1, NULL, -3},
            /* AdamW's state and update on the host */
            {"the optimizer offloaded", REGC_LEVEL_O1, 1, 1, NULL, -4},
            {"the lazy program, the optimizer offloaded", REGC_LEVEL_O0, 0, 1, NULL, -4},
        };
        for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
            regc_train_options o = options(3);
            o.compile.level = ways[w].level, o.compile.inline_back = ways[w].inline_back;
            o.compile.regional = ways[w].regional;
            o.cache_dir = ways[w].cache;
            o.compile.budget_bytes = ways[w].budget > 0 ? ways[w].budget : 0;
            o.compile.persistence_floats = ways[w].budget == -1 ? INT64_C(1) << 40 : 0;
            if (ways[w].budget == -2)
                o.compile.prefetch_floats = -4, o.compile.max_live_floats = 1;
            if (ways[w].budget == -3)
                o.compile.reduce_bucket_floats = INT64_C(1) << 40;
            o.compile.offload_optimizer = ways[w].budget == -4;
            regc_test_losses l;
            regc_model *m = regc_test_train(presets[i], &o, &l);
            if (ways[w].cache)
                assert_int_equal(l.hits, !strcmp(ways[w].what, "a compile cache hit"));
            for (int k = 0; k < STEPS; k++)
                if (memcmp(&l.loss[k], &lf.loss[k], sizeof l.loss[k]) != 0)
                    fail_msg("%s, %s step %d: %.9g, flat %.9g", presets[i], ways[w].what, k,
                             l.loss[k], lf.loss[k]);
            regc_test_assert_same_weights(m, mf);
            regc_model_free(m);
        }
        regc_model_free(mf);
    }
    regc_test_remove_tree(cache);
    free(cache);
}

/* ---- the placed communication --------------------------------------------- */

/* The default options at stage 3 over `ranks` ranks. */
static regc_compile_options stage3_at(int ranks)
{
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.ranks = ranks, co.zero_stage = 3;
    return co;
}

/* preset's step at [2, 16] compiled with co: the test fails unless it
 * compiles (status NULL), or its status goes into *status. */
static regc_program *compile_step(const char *preset, const regc_compile_options *co,
                                  regc_compile_stats *st, int *status)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load(preset, &m), REGC_OK);
    regc_program *p = NULL;
    const int rc = regc_program_compile(m, 2, 16, co, &p, st);
    regc_model_free(m);
    if (status)
        *status = rc;
    else if (rc != REGC_OK)
        fail_msg("%s at %d ranks: %s", preset, co->ranks, regc_error_message());
    return p;
}

static regc_program *compile_at(const char *preset, int ranks, int64_t prefetch)
{
    regc_compile_options co = stage3_at(ranks);
    co.prefetch_floats = prefetch;
    regc_program *p = compile_step(preset, &co, NULL, NULL);
    return p;
}

static int overlaps(const regc_buf *a, const regc_buf *b)
{
    return a->kind == BUF_ARENA && b->kind == BUF_ARENA && a->bytes > 0 && b->bytes > 0 &&
           a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

static int reads(const regc_instr *in, int b)
{
    for (int k = in->n_out; k < in->n_refs; k++)
        if (in->refs[k].buf == b && !regc_instr_writes(in, k))
            return 1;
    return 0;
}

static int writes(const regc_instr *in, int b)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == b && regc_instr_writes(in, k))
            return 1;
    return 0;
}

/* The arena bytes of buffer b stay its own from instruction `from` to its
 * last reader; returns that reader. */
static int check_held(const regc_program *p, int b, int from, const char *what)
{
    int last = -1;
    for (int i = from + 1; i < p->n_instr; i++)
        if (reads(&p->instr[i], b))
            last = i;
    if (last < 0)
        fail_msg("%s buffer %d: nothing reads it", what, b);
    for (int i = from + 1; i < last; i++)
        for (int k = 0; k < p->instr[i].n_refs; k++) {
            int o = p->instr[i].refs[k].buf;
            if (o >= 0 && o != b && regc_instr_writes(&p->instr[i], k) &&
                overlaps(&p->bufs[o], &p->bufs[b]))
                fail_msg("%s buffer %d: instruction %d writes its bytes before its last reader "
                         "%d",
                         what, b, i, last);
        }
    return last;
}

/* The K_COMM_WAIT of collective `signal` after instruction i. */
static int wait_of(const regc_program *p, int i, int signal)
{
    int w = -1;
    for (int j = 0; j < p->n_instr; j++)
        if (p->instr[j].kernel == K_COMM_WAIT && p->instr[j].signal == signal) {
            if (w >= 0 || j < i)
                fail_msg("collective %d: a second wait, or a wait before its start", signal);
            w = j;
        }
    if (w < 0)
        fail_msg("collective %d is never waited for", signal);
    return w;
}

static int is_compute(const regc_instr *in)
{
    return in->kernel != K_ALLGATHER && in->kernel != K_REDUCE_SCATTER && in->kernel != K_COMM_WAIT;
}

/* prefetch: the compile option; every gather must start where it is
 * waited for (0), or some while compute runs (else). */
static void check_placement(const char *preset, int64_t prefetch)
{
    regc_program *p = compile_at(preset, 2, prefetch);
    const regc_shard_layout *l = p->layout;
    assert_non_null(l);
    int gathers = 0, scatters = 0, reused = 0, ahead = 0; /* gathers waited for */
    int *gathered = calloc((size_t)l->n_units, sizeof *gathered);
    int *scattered = calloc((size_t)l->n_units, sizeof *scattered);
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        if (in->kernel != K_ALLGATHER && in->kernel != K_REDUCE_SCATTER)
            continue;
        /* which unit: by the shard's offset */
        int u = 0;
        while (u < l->n_units && l->shard_offset[u] * (int64_t)sizeof(float) !=
                                     in->refs[in->kernel == K_ALLGATHER].off)
            u++;
        assert_true(u < l->n_units);
        assert_int_equal(in->d[0], l->unit_shard[u]);
        assert_true(in->signal > 0);
        int w = wait_of(p, i, in->signal), compute_between = 0;
        for (int j = i + 1; j < w; j++)
            compute_between += is_compute(&p->instr[j]);
        if (in->kernel == K_ALLGATHER) {
            int b = in->refs[0].buf;
            for (int j = 0; j < i; j++)
                if (reads(&p->instr[j], b) || writes(&p->instr[j], b))
                    fail_msg("%s unit %d: instruction %d uses it before its gather %d", preset, u,
                             j, i);
            for (int j = i + 1; j < w; j++)
                if (reads(&p->instr[j], b))
                    fail_msg("%s unit %d: instruction %d reads it before the gather's wait %d",
                             preset, u, j, w);
            int last = check_held(p, b, i, "gathered");
            /* released: the plan gives its bytes to a later buffer */
            for (int j = last + 1; j < p->n_instr && !reused; j++)
                for (int k = 0; k < p->instr[j].n_refs; k++) {
                    int o = p->instr[j].refs[k].buf;
                    if (o >= 0 && o != b && overlaps(&p->bufs[o], &p->bufs[b]))
                        reused = 1;
                }
            if (prefetch == 0 && compute_between)
                fail_msg("%s unit %d: gathered on demand, yet started %d instructions early",
                         preset, u, compute_between);
            gathered[u]++;
            gathers++;
        } else {
            int b = in->refs[1].buf;
            for (int j = i + 1; j < p->n_instr; j++)
                if (j != w && (reads(&p->instr[j], b) || writes(&p->instr[j], b)))
                    fail_msg("%s unit %d: instruction %d touches its gradients after their "
                             "reduce-scatter %d",
                             preset, u, j, i);
            /* the gradients stay in place until the reduce-scatter is done */
            for (int j = i + 1; j < w; j++)
                for (int k = 0; k < p->instr[j].n_refs; k++) {
                    int o = p->instr[j].refs[k].buf;
                    if (o >= 0 && o != b && regc_instr_writes(&p->instr[j], k) &&
                        overlaps(&p->bufs[o], &p->bufs[b]))
                        fail_msg("%s unit %d: instruction %d writes its gradients' bytes while "
                                 "they are reduce-scattered",
                                 preset, u, j);
                }
            scattered[u]++;
            scatters++;
        }
    }
    /* once in forward; once in backward unless the backward reads none of
     * it (an embedding's backward reads only the ids) */
    for (int u = 0; u < l->n_units; u++) {
        if (gathered[u] < 1 || gathered[u] > 2)
            fail_msg("%s unit %d: gathered %d times", preset, u, gathered[u]);
        assert_int_equal(scattered[u], 1);
    }
    assert_true(reused);
    assert_true(gathers > l->n_units);
    assert_int_equal(scatters, l->n_units);
    assert_int_equal(p->n_signals, gathers + scatters);
    /* prefetching, gather k starts before gather k - 1 is waited for, so
     * it arrives while unit k - 1 computes */
    int prev_wait = -1;
    for (int w = 0; w < p->n_instr && prefetch != 0; w++) {
        const regc_instr *in = &p->instr[w];
        if (in->kernel != K_COMM_WAIT || in->d[1] != K_ALLGATHER)
            continue;
        int start = -1;
        for (int j = 0; j < w; j++)
            if (p->instr[j].signal == in->signal && p->instr[j].kernel == K_ALLGATHER)
                start = j;
        if (prev_wait >= 0 && start > prev_wait)
            fail_msg("%s: gather %d starts at %d, after the previous gather's wait %d", preset,
                     in->signal, start, prev_wait);
        prev_wait = w;
        ahead++;
    }
    assert_int_equal(ahead, prefetch != 0 ? gathers : 0);
    free(gathered), free(scattered);
    regc_program_free(p);
}

static void test_gathers_before_use_and_released_after(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        check_placement(presets[i], -1);
        check_placement(presets[i], 0);
        check_placement(presets[i], 1 << 20);
    }
}

/* ---- reduce buckets ---------------------------------------------------------- */

/* The most reduce-scatters started and not yet waited for at once in
 * gpt2-tiny's stage 3 step at 2 ranks, with a reduce bucket; and whether
 * every wait comes after the last start (*all_at_end). */
static int scatters_in_flight(int64_t bucket, int *all_at_end)
{
    regc_compile_options co = stage3_at(2);
    co.reduce_bucket_floats = bucket;
    regc_program *p = compile_step("gpt2-tiny", &co, NULL, NULL);
    int flying = 0, most = 0, last_start = -1, first_wait = -1;
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        if (in->kernel == K_REDUCE_SCATTER)
            flying++, last_start = i;
        if (in->kernel == K_COMM_WAIT && in->d[1] == K_REDUCE_SCATTER) {
            flying--;
            if (first_wait < 0)
                first_wait = i;
        }
        most = flying > most ? flying : most;
    }
    assert_int_equal(flying, 0);
    *all_at_end = first_wait > last_start;
    regc_program_free(p);
    return most;
}

/* Stage 3: by default a reduce-scatter is waited for once the next one
 * starts; a bucket holding every unit leaves them all in flight. */
static void test_reduce_bucket_keeps_scatters_in_flight(void **state)
{
    (void)state;
    int at_end = 0;
    assert_int_equal(scatters_in_flight(0, &at_end), 2);
    assert_false(at_end);
    assert_true(scatters_in_flight(INT64_C(1) << 40, &at_end) > 2);
    assert_true(at_end);
}

/* ---- persistent units -------------------------------------------------------- */

/* The all-gathers of gpt2-tiny's stage 3 step at 4 ranks with a
 * persistence threshold, and the units it kept resident. */
static int gathers_with(int64_t persistence, int *resident, int *units)
{
    regc_compile_options co = stage3_at(4);
    co.persistence_floats = persistence;
    regc_compile_stats st;
    regc_program *p = compile_step("gpt2-tiny", &co, &st, NULL);
    int n = 0;
    for (int i = 0; i < p->n_instr; i++)
        n += p->instr[i].kernel == K_ALLGATHER;
    *resident = st.zero3_resident;
    *units = st.zero3_units;
    regc_program_free(p);
    return n;
}

/* stage3_param_persistence_threshold: a unit of at most that many
 * parameters is gathered once a step, not once in its forward and again in
 * its backward; a larger one is gathered twice; bits do not change (the
 * schedules' test above). */
static void test_persistent_units_gather_once(void **state)
{
    (void)state;
    int resident, units;
    const int none = gathers_with(0, &resident, &units);
    assert_int_equal(resident, 0);
    const int all = gathers_with(INT64_C(1) << 40, &resident, &units);
    assert_int_equal(resident, units);
    const int some = gathers_with(256, &resident, &units);
    print_message("units %d: %d all-gathers, %d with every unit persistent, %d with %d unit(s) of "
                  "at most 256 parameters persistent\n",
                  units, none, all, some, resident);
    assert_int_equal(none, 2 * units); /* in each unit's forward and again in its backward */
    assert_int_equal(all, units);
    /* gpt2-tiny's final layer norm is the one unit of 256 parameters */
    assert_int_equal(resident, 1);
    assert_int_equal(some, none - 1);
}

/* ---- live parameters --------------------------------------------------------- */

/* gpt2-tiny's stage 3 step at 4 ranks, four units ahead, under a limit
 * of max_live parameters gathered at once: the bytes gathered at once. */
static int64_t window_with(int64_t prefetch, int64_t max_live, int64_t *largest_unit)
{
    regc_compile_options co = stage3_at(4);
    co.prefetch_floats = prefetch, co.max_live_floats = max_live;
    regc_program *p = compile_step("gpt2-tiny", &co, NULL, NULL);
    regc_comm_plan c;
    regc_program_comm_plan(p, &c);
    *largest_unit = 0;
    for (int u = 0; u < p->layout->n_units; u++)
        if (p->layout->unit_padded[u] > *largest_unit)
            *largest_unit = p->layout->unit_padded[u];
    regc_program_free(p);
    return c.window_bytes;
}

/* stage3_max_live_parameters: with four units ahead allowed, a limit of
 * two units' parameters gathers less at once, and a limit below any unit
 * is on-demand gathering exactly (each unit where it is needed); the bits
 * do not change (the schedules' test above). The window also holds what
 * the fused step keeps of neighbouring units (a layer's last norm beside
 * the next one's first), so it is compared between schedules, not with
 * the limit itself. */
static void test_live_parameters_limit_the_window(void **state)
{
    (void)state;
    int64_t largest = 0;
    const int64_t ahead = window_with(-4, 0, &largest);
    const int64_t two = window_with(-4, 2 * largest, &largest);
    const int64_t one = window_with(-4, 1, &largest);
    const int64_t on_demand = window_with(0, 0, &largest);
    print_message("bytes gathered at once, four units ahead: %lld without a limit, %lld within "
                  "two units' parameters, %lld within one parameter; on demand %lld\n",
                  (long long)ahead, (long long)two, (long long)one, (long long)on_demand);
    assert_true(ahead > two && two > one);
    assert_int_equal(one, on_demand);
}

/* ---- a memory budget ------------------------------------------------------- */

static regc_program *compile_budget(const char *preset, int64_t budget, int *status)
{
    regc_compile_options co = stage3_at(4);
    co.budget_bytes = budget;
    co.recompute = REGC_RECOMPUTE_NONE; /* the schedule alone fits it (test_recompute: with) */
    return compile_step(preset, &co, NULL, status);
}

/* Every budget's program fits it; a larger budget never prefetches less or
 * keeps fewer units resident; one below what on-demand gathering needs is
 * refused, naming the key and the least it needs. */
static void test_budget_fits_and_grows(void **state)
{
    (void)state;
    int rc;
    regc_program *least = compile_budget("gpt2-tiny", INT64_C(1) << 40, &rc);
    assert_int_equal(rc, REGC_OK);
    /* the smallest need: on demand, nothing resident */
    regc_compile_options co = stage3_at(4);
    co.prefetch_floats = 0;
    regc_program *on_demand = compile_step("gpt2-tiny", &co, NULL, NULL);
    regc_device_memory need, most;
    regc_program_device_memory(on_demand, &need);
    regc_program_device_memory(least, &most);
    assert_true(most.total > need.total);
    int64_t prev_depth = 1, prev_resident = -1;
    for (int i = 0; i <= 8; i++) {
        int64_t budget = need.total + (most.total - need.total) * i / 8;
        regc_program *p = compile_budget("gpt2-tiny", budget, &rc);
        if (rc != REGC_OK)
            fail_msg("budget %lld: %s", (long long)budget, regc_error_message());
        regc_device_memory a;
        regc_program_device_memory(p, &a);
        if (a.total > budget)
            fail_msg("budget %lld: the program needs %lld", (long long)budget, (long long)a.total);
        /* depth: 0 on demand, -n n units ahead; deeper is more negative */
        int64_t depth = p->prefetch_floats;
        if (depth > prev_depth || (depth == prev_depth && p->n_resident < prev_resident))
            fail_msg("budget %lld: prefetch %lld, %d resident after %lld, %lld", (long long)budget,
                     (long long)depth, p->n_resident, (long long)prev_depth,
                     (long long)prev_resident);
        prev_depth = depth, prev_resident = p->n_resident;
        regc_program_free(p);
    }
    assert_int_equal(least->n_resident, least->layout->n_units);
    regc_program *none = compile_budget("gpt2-tiny", need.total - 1, &rc);
    assert_null(none);
    assert_int_equal(rc, REGC_ERR_BUDGET);
    assert_non_null(strstr(regc_error_message(), "compile.memory_budget_mb"));
    regc_program_free(least), regc_program_free(on_demand);
}

/* ---- the blocks ------------------------------------------------------------ */

static void test_blocks_are_a_share_of_the_model(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load(presets[i], &m), REGC_OK);
        int64_t total = regc_model_total_numel(m);
        regc_model_free(m);
        for (int ranks = 1; ranks <= 4; ranks *= 2) {
            regc_program *p = compile_at(presets[i], ranks, -1);
            const regc_shard_layout *l = regc_program_shard_layout(p);
            int64_t block = regc_program_block_floats(p);
            assert_int_equal(block, l->shard_floats);
            assert_int_equal(l->model_floats, total);
            /* 1/N of the model, plus at most one aligned row of padding per unit */
            assert_true(block * ranks >= total);
            assert_true(block * ranks < total + (int64_t)l->n_units * ranks * REGC_SHARD_ALIGN);
            regc_program_free(p);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_takes_and_joins),
        cmocka_unit_test(test_queue_and_staged),
        cmocka_unit_test(test_stage3_equals_stage0),
        cmocka_unit_test(test_stage3_accumulates_and_clips),
        cmocka_unit_test(test_stage3_programs_agree),
        cmocka_unit_test(test_gathers_before_use_and_released_after),
        cmocka_unit_test(test_budget_fits_and_grows),
        cmocka_unit_test(test_persistent_units_gather_once),
        cmocka_unit_test(test_live_parameters_limit_the_window),
        cmocka_unit_test(test_blocks_are_a_share_of_the_model),
        cmocka_unit_test(test_reduce_bucket_keeps_scatters_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
