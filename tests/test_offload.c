/* test_offload.c — compile.offload_activation: saved activations copied to
 * host memory after their forward's last use and back before their
 * backward's first, on the backend's copy queue.
 *  - The same bits: GPT-2, Llama, BERT and T5, and on the first two as one
 *    region, at stage 3, with gradient accumulation, with selective
 *    recomputation beside it, and on GPT-2 in bf16: the losses and weights
 *    of no offload over five steps.
 *  - Less device memory, as planned: the activation plan shrinks, the host
 *    holds what left, and the run's device peak is the plan's total within
 *    1% (the CPU's host memory is not the device's to count).
 *  - The program: each copy out starts after its buffer's last forward use
 *    and is waited for before anything reuses the memory; each copy back
 *    is waited for before the backward's first read, which reads the copy;
 *    while a buffer is away something else takes the room (the logits,
 *    whose gradient follows their last read, stay); a read of the copy
 *    before its wait, or a wait naming another transfer than its signal's,
 *    is refused by the validator.
 *  - Under a budget, the fewest offloaded that fit (the largest first):
 *    none where the step fits, some halfway; below the least anything
 *    reaches, refused naming that least. Under a host budget too, no more
 *    offloaded than fit it, recomputation making up the rest; a host
 *    budget the offloaded optimizer state alone is over, refused naming
 *    both.
 *  - O0 (the lazy program, which allocates as it runs) chooses when it
 *    compiles and copies as it runs: no copy in the program, the chosen
 *    bytes in its account and within a host budget, the choice serialised
 *    (one that comes back before it leaves refused when read), the bits of
 *    none, a lower device peak, the same from the cache; and the cache
 *    keys the choice.
 *  - Under bf16, the saved values held in bf16 leave too: each widening
 *    of one for a backward kernel reads the copy brought back. */
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
#include "regc_train.h"
#include "serial.h"
#include "test_model.h"
#include "test_util.h"
#include "validate.h"

#define STEPS 5

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

/* B=2, T=64: the tiny presets' activations reach the 64 KiB a copy needs */
static regc_train_options base_options(void) { return regc_test_train_options(2, 64, STEPS); }

static regc_program *compile_as(const char *preset, const regc_train_options *o)
{
    return regc_test_compile(preset, o->batch, o->seq, &o->compile, NULL);
}

static void expect_same(const char *preset, const char *what, const regc_test_losses *a,
                        regc_model *ma, const regc_test_losses *b, regc_model *mb)
{
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&a->loss[k], &b->loss[k], sizeof a->loss[k]) != 0)
            fail_msg("%s, %s, step %d: %.9g offloaded, %.9g not", preset, what, k, a->loss[k],
                     b->loss[k]);
    regc_test_assert_same_weights(ma, mb);
}

/* ---- the same bits --------------------------------------------------------- */

static void test_offload_keeps_the_bits(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        int regional, stage, accumulate;
        regc_precision precision;
        regc_recompute recompute;
    } ways[] = {
        {"regional", 1, 0, 1, REGC_PRECISION_FP32, REGC_RECOMPUTE_NONE},
        {"the whole graph as one region", 0, 0, 1, REGC_PRECISION_FP32, REGC_RECOMPUTE_NONE},
        {"stage 3", 1, 3, 1, REGC_PRECISION_FP32, REGC_RECOMPUTE_NONE},
        {"two micro-batches a step", 1, 0, 2, REGC_PRECISION_FP32, REGC_RECOMPUTE_NONE},
        {"bf16", 1, 0, 1, REGC_PRECISION_BF16, REGC_RECOMPUTE_NONE},
        {"selective recomputation beside it", 1, 0, 1, REGC_PRECISION_FP32,
         REGC_RECOMPUTE_SELECTIVE},
    };
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
            /* BERT and T5: as regional; every way on GPT-2, and on Llama but bf16 */
            if ((i > 1 && w > 0) || (i == 1 && ways[w].precision == REGC_PRECISION_BF16))
                continue;
            regc_train_options o = base_options();
            o.compile.regional = ways[w].regional, o.compile.zero_stage = ways[w].stage;
            o.grad_accum = ways[w].accumulate, o.compile.precision = ways[w].precision;
            o.compile.recompute = ways[w].recompute;
            regc_test_losses kept, moved;
            regc_model *mk = regc_test_train(presets[i], &o, &kept);
            o.compile.offload_activation = 1;
            regc_model *mm = regc_test_train(presets[i], &o, &moved);
            expect_same(presets[i], ways[w].what, &moved, mm, &kept, mk);
            if (!(moved.device_peak < kept.device_peak))
                fail_msg("%s, %s: %lld bytes held offloaded, %lld not", presets[i], ways[w].what,
                         (long long)moved.device_peak, (long long)kept.device_peak);
            regc_model_free(mk), regc_model_free(mm);
        }
}

/* ---- less device memory, as planned -------------------------------------- */

static void test_memory_as_planned(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_device_memory a[2];
        for (int on = 0; on < 2; on++) {
            regc_train_options o = base_options();
            o.compile.offload_activation = on;
            regc_program *p = compile_as(presets[i], &o);
            regc_program_device_memory(p, &a[on]);
            regc_fit_plan f;
            regc_program_fit_plan(p, &f);
            assert_int_equal(f.offloaded > 0, on);
            assert_int_equal(a[on].host, f.offload_bytes);
            regc_test_losses l;
            regc_model *m = regc_test_train(presets[i], &o, &l);
            if (!(fabs((double)(l.device_peak - a[on].total)) <= 0.01 * (double)a[on].total))
                fail_msg("%s, offload %d: planned %lld bytes, held %lld", presets[i], on,
                         (long long)a[on].total, (long long)l.device_peak);
            regc_model_free(m);
            regc_program_free(p);
        }
        if (!(a[1].activations < a[0].activations))
            fail_msg("%s: activations %lld offloaded, %lld not", presets[i],
                     (long long)a[1].activations, (long long)a[0].activations);
    }
}

/* ---- the program ----------------------------------------------------------- */

static int names(const regc_instr *in, int b)
{
    for (int k = 0; k < in->n_refs; k++)
        if (in->refs[k].buf == b)
            return 1;
    return 0;
}

static void test_copies_in_their_places(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    o.compile.offload_activation = 1;
    regc_program *p = compile_as("llama-tiny", &o);
    int pairs = 0;
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *out = &p->instr[i];
        if (out->kernel != K_COPY_D2H || !regc_instr_is_queued_copy(out))
            continue;
        const int dev = out->refs[1].buf, host = out->refs[0].buf;
        assert_int_equal(p->bufs[host].kind, BUF_HOST);
        int out_wait = -1, back = -1, back_wait = -1, back_buf = -1;
        for (int j = i + 1; j < p->n_instr; j++) {
            const regc_instr *x = &p->instr[j];
            if (x->kernel == K_COMM_WAIT && x->signal == out->signal)
                out_wait = j;
            else if (x->kernel == K_COPY_H2D && x->refs[1].buf == host)
                back = j, back_buf = x->refs[0].buf;
            else if (back >= 0 && x->kernel == K_COMM_WAIT && x->signal == p->instr[back].signal)
                back_wait = j;
        }
        assert_true(out_wait > i && back > out_wait && back_wait > back);
        /* the room it leaves serves something: a buffer of a copy's least
         * (64 KiB) made while it is away (not the logits, with only the
         * loss's seed between their last read and their gradient's first) */
        int room = 0;
        for (int j = i + 1; j < back && !room; j++)
            for (int k = 0; k < p->instr[j].n_refs; k++) {
                const int x = p->instr[j].refs[k].buf;
                room |= x >= 0 && regc_instr_writes(&p->instr[j], k) &&
                        p->bufs[x].kind == BUF_ARENA && p->bufs[x].bytes >= (64 << 10);
            }
        if (!room)
            fail_msg("buffer %d (%lld bytes) offloaded with nothing made while it is away", dev,
                     (long long)p->bufs[dev].bytes);
        /* nothing touches the buffer between its copy out and its wait, nor
         * after it; nothing touches the copy back until its wait, and the
         * first instruction after the wait that names either reads the copy */
        for (int j = i + 1; j < p->n_instr; j++)
            if (j != out_wait && names(&p->instr[j], dev))
                fail_msg("instruction %d names buffer %d after its copy out at %d", j, dev, i);
        int read = 0;
        for (int j = back + 1; j < p->n_instr; j++) {
            if (j < back_wait && j != back_wait && names(&p->instr[j], back_buf))
                fail_msg("instruction %d reads buffer %d before its copy's wait", j, back_buf);
            read |= j > back_wait && names(&p->instr[j], back_buf);
        }
        assert_true(read);
        pairs++;
    }
    assert_true(pairs > 0);
    assert_int_equal(regc_program_validate(p), REGC_OK);
    /* a wait that names another kind of transfer, or other buffers, than
     * the one its signal started is refused */
    for (int i = 0; i < p->n_instr; i++)
        if (p->instr[i].kernel == K_COMM_WAIT && p->instr[i].d[1] == K_COPY_D2H) {
            const regc_instr kept = p->instr[i];
            p->instr[i].d[1] = K_COPY_H2D;
            assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
            assert_non_null(strstr(regc_error_message(), "as another transfer than instruction"));
            p->instr[i] = kept;
            p->instr[i].refs[1].buf = p->instr[i].refs[0].buf;
            assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
            p->instr[i] = kept;
            break;
        }
    assert_int_equal(regc_program_validate(p), REGC_OK);
    /* a read of a copy back before its wait is refused */
    for (int i = 0; i < p->n_instr; i++)
        if (p->instr[i].kernel == K_COMM_WAIT && p->instr[i].d[1] == K_COPY_H2D &&
            i + 1 < p->n_instr) {
            regc_instr wait = p->instr[i];
            p->instr[i] = p->instr[i + 1], p->instr[i + 1] = wait;
            break;
        }
    assert_int_equal(regc_program_validate(p), REGC_ERR_FORMAT);
    assert_non_null(strstr(regc_error_message(), "which nothing wrote before it"));
    regc_program_free(p);
}

/* ---- under a budget: only what must go ---------------------------------- */

/* gpt2-tiny's step as o says keeping every activation (*k) and offloading
 * all that qualify (*a, *fa); o is left offloading. */
static void kept_and_offloaded(regc_train_options *o, regc_device_memory *k, regc_device_memory *a,
                               regc_fit_plan *fa)
{
    regc_program *kept = compile_as("gpt2-tiny", o);
    o->compile.offload_activation = 1;
    regc_program *all = compile_as("gpt2-tiny", o);
    regc_program_device_memory(kept, k), regc_program_device_memory(all, a);
    regc_program_fit_plan(all, fa);
    regc_program_free(kept), regc_program_free(all);
}

static void test_budget_offloads_what_must_go(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    regc_device_memory k, a;
    regc_fit_plan fa;
    kept_and_offloaded(&o, &k, &a, &fa);
    assert_true(a.total < k.total && fa.offloaded > 1);
    for (int i = 0; i < 2; i++) { /* a budget the step fits: none; halfway: some */
        o.compile.budget_bytes = i == 0 ? k.total : (k.total + a.total) / 2;
        regc_program *p = compile_as("gpt2-tiny", &o);
        regc_device_memory m;
        regc_fit_plan f;
        regc_program_device_memory(p, &m), regc_program_fit_plan(p, &f);
        if (m.total > o.compile.budget_bytes || f.replays != 0 ||
            (i == 0 ? f.offloaded != 0 : !(f.offloaded > 0 && f.offloaded < fa.offloaded)))
            fail_msg("budget %lld: %lld bytes, %d of %d offloaded, %d replays",
                     (long long)o.compile.budget_bytes, (long long)m.total, f.offloaded,
                     fa.offloaded, f.replays);
        regc_program_free(p);
    }
    /* below what offloading everything reaches, where recomputing holds
     * more than offloading does: refused, offloading's own need the least */
    o.compile.budget_bytes = a.total - 1;
    int rc;
    assert_null(regc_test_compile("gpt2-tiny", o.batch, o.seq, &o.compile, &rc));
    assert_int_equal(rc, REGC_ERR_BUDGET);
    char want[80];
    snprintf(want, sizeof want, "needs %.1f MiB per rank at the least",
             (double)a.total / (1 << 20));
    if (!strstr(regc_error_message(), want) ||
        !strstr(regc_error_message(), "(recomputing, offloading and chunking what can be)"))
        fail_msg("expected \"%s\" and what was tried, got: %s", want, regc_error_message());
}

/* compile.host_memory_mb: the budget halfway offloads some activations;
 * given half their host bytes, the step still fits the device, holds no
 * more on the host than allowed, and recomputes what stays; without a
 * device budget, half of what offloading all holds takes some of them, not
 * all; a host budget
 * below the offloaded optimizer state is refused, with or without a
 * device budget, naming what the host would hold. */
static void test_host_budget(void **state)
{
    (void)state;
    regc_train_options o = base_options();
    regc_device_memory k, a, m;
    regc_fit_plan f, fa;
    kept_and_offloaded(&o, &k, &a, &fa);
    o.compile.budget_bytes = (k.total + a.total) / 2;
    regc_program *p = compile_as("gpt2-tiny", &o);
    regc_program_device_memory(p, &m), regc_program_fit_plan(p, &f);
    const int64_t host = m.host;
    assert_true(f.offloaded > 0 && host > 0 && f.replays == 0);
    regc_program_free(p);
    o.compile.host_budget_bytes = host / 2;
    p = compile_as("gpt2-tiny", &o);
    regc_program_device_memory(p, &m), regc_program_fit_plan(p, &f);
    if (m.total > o.compile.budget_bytes || m.host > o.compile.host_budget_bytes || f.replays == 0)
        fail_msg("host budget %lld: %lld device bytes (budget %lld), %lld on the host, %d "
                 "offloaded, %d replays",
                 (long long)o.compile.host_budget_bytes, (long long)m.total,
                 (long long)o.compile.budget_bytes, (long long)m.host, f.offloaded, f.replays);
    regc_program_free(p);
    /* no device budget: as many as fit half of what offloading all takes */
    o.compile.budget_bytes = 0, o.compile.host_budget_bytes = a.host / 2;
    p = compile_as("gpt2-tiny", &o);
    regc_program_device_memory(p, &m), regc_program_fit_plan(p, &f);
    if (m.host > a.host / 2 || f.offloaded < 1 || f.offloaded >= fa.offloaded)
        fail_msg("host budget %lld: %lld on the host, %d of %d offloaded", (long long)(a.host / 2),
                 (long long)m.host, f.offloaded, fa.offloaded);
    regc_program_free(p);
    /* AdamW's moments offloaded: 8 bytes a parameter on the host */
    o.compile.offload_optimizer = 1;
    o.compile.host_budget_bytes = 1 << 20;
    for (int budget = 0; budget < 2; budget++) {
        o.compile.budget_bytes = budget ? k.total : 0;
        int rc;
        assert_null(regc_test_compile("gpt2-tiny", o.batch, o.seq, &o.compile, &rc));
        assert_int_equal(rc, REGC_ERR_BUDGET);
        if (!strstr(regc_error_message(), "compile.host_memory_mb: the step holds") ||
            !strstr(regc_error_message(), "the limit is 1.0 MiB"))
            fail_msg("expected the host's need and limit, got: %s", regc_error_message());
    }
}

/* ---- O0 and the cache ------------------------------------------------------ */

static void test_lazy_program_and_cache(void **state)
{
    (void)state;
    /* O0 (its [256, 128] activations are 128 KiB at this size) chooses at
     * compile time and copies as it runs: no copy in the program, the
     * chosen buffers in its account and on the host */
    regc_train_options o = base_options();
    o.batch = 4, o.seq = 64;
    o.compile.level = REGC_LEVEL_O0;
    o.compile.offload_activation = 1;
    regc_program *p = compile_as("gpt2-tiny", &o);
    regc_fit_plan f;
    regc_program_fit_plan(p, &f);
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    assert_int_equal(p->n_instr, 0); /* lazy: its steps call the regions */
    if (f.offloaded == 0 || a.host_activations != f.offload_bytes)
        fail_msg("O0: %d offloaded, %lld bytes; the host holds %lld", f.offloaded,
                 (long long)f.offload_bytes, (long long)a.host_activations);
    /* the choice is serialised; one that would come back before it left
     * is refused when read */
    int away = 0;
    while (away < p->n_bufs && p->bufs[away].away < 0)
        away++;
    assert_true(away < p->n_bufs);
    regc_compile_stats st = {0};
    regc_bytes sound = {0}, bad = {0};
    regc_program_write(p, &st, &sound);
    regc_program *r = NULL;
    assert_int_equal(regc_program_read(sound.data, sound.len, &r, &st), REGC_OK);
    assert_int_equal(r->bufs[away].away, p->bufs[away].away);
    assert_int_equal(r->bufs[away].back, p->bufs[away].back);
    regc_program_free(r), r = NULL;
    p->bufs[away].back = p->bufs[away].away;
    regc_program_write(p, &st, &bad);
    assert_int_not_equal(regc_program_read(bad.data, bad.len, &r, &st), REGC_OK);
    assert_null(r);
    regc_bytes_free(&sound), regc_bytes_free(&bad);
    /* a host budget takes the largest that fit it */
    o.compile.host_budget_bytes = f.offload_bytes / 2;
    regc_program *q = compile_as("gpt2-tiny", &o);
    regc_device_memory b;
    regc_program_device_memory(q, &b);
    if (!(b.host_activations > 0 && b.host_activations <= o.compile.host_budget_bytes))
        fail_msg("O0 under a host budget of %lld bytes: %lld offloaded",
                 (long long)o.compile.host_budget_bytes, (long long)b.host_activations);
    regc_program_free(p), regc_program_free(q);
    o.compile.host_budget_bytes = 0;
    /* the bits of none, in less device memory; from the cache alike */
    char *dir = regc_test_make_temp_dir("offload-cache");
    o.cache_dir = dir;
    o.compile.offload_activation = 0;
    regc_test_losses lazy_kept, lazy_moved, lazy_warm;
    regc_model *lk = regc_test_train("gpt2-tiny", &o, &lazy_kept);
    o.compile.offload_activation = 1;
    regc_model *lm = regc_test_train("gpt2-tiny", &o, &lazy_moved);
    regc_model *lw = regc_test_train("gpt2-tiny", &o, &lazy_warm);
    assert_int_equal(lazy_warm.hits, 1);
    expect_same("gpt2-tiny", "O0, offloaded as it runs", &lazy_moved, lm, &lazy_kept, lk);
    expect_same("gpt2-tiny", "O0, offloaded, from the cache", &lazy_warm, lw, &lazy_kept, lk);
    if (!(lazy_moved.device_peak < lazy_kept.device_peak) ||
        lazy_warm.device_peak != lazy_moved.device_peak)
        fail_msg("O0: offloaded %lld bytes at the peak (%lld from the cache), kept %lld",
                 (long long)lazy_moved.device_peak, (long long)lazy_warm.device_peak,
                 (long long)lazy_kept.device_peak);
    regc_model_free(lk), regc_model_free(lm), regc_model_free(lw);

    o = base_options();
    o.cache_dir = dir;
    regc_test_losses kept, cold, warm;
    regc_model *mk = regc_test_train("gpt2-tiny", &o, &kept);
    o.compile.offload_activation = 1;
    regc_model *mc = regc_test_train("gpt2-tiny", &o, &cold);
    assert_int_equal(cold.misses, 1); /* its regions are the ones kept: the step is new */
    regc_model *mw = regc_test_train("gpt2-tiny", &o, &warm);
    assert_int_equal(warm.hits, 1);
    expect_same("gpt2-tiny", "from the cache", &warm, mw, &kept, mk);
    assert_int_equal(warm.device_peak, cold.device_peak);
    regc_model_free(mk), regc_model_free(mc), regc_model_free(mw);
    regc_test_remove_tree(dir);
    free(dir);
}

/* ---- bf16: the values held in bf16 leave too ------------------------------- */

/* Under bf16 a saved activation held in bf16 is read in the backward as it
 * is (a GEMM, attention, a fused chain) or through a widening into an fp32
 * temporary (RoPE, a copy): a widening reads nothing the gradient made,
 * and is the backward's all the same. Every backward read of a held value
 * the forward made, of a size a copy may move (64 KiB), reads the copy
 * brought back. */
static void test_bf16_values_leave(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        regc_train_options o = base_options();
        o.batch = 4, o.seq = 128; /* every held value reaches 64 KiB */
        o.compile.precision = REGC_PRECISION_BF16, o.compile.offload_activation = 1;
        regc_program *p = compile_as(presets[i], &o);
        /* the backward starts with the loss's gradient; the copies back
         * come after it */
        int first_back = -1, loss_grad = -1, reads = 0;
        for (int j = 0; j < p->n_instr && first_back < 0; j++) {
            if (p->instr[j].kernel == K_CE_BWD && loss_grad < 0)
                loss_grad = j;
            if (p->instr[j].kernel == K_COPY_H2D)
                first_back = j;
        }
        assert_true(loss_grad > 0 && first_back > loss_grad);
        for (int j = first_back; j < p->n_instr; j++) {
            const regc_instr *in = &p->instr[j];
            for (int k = 0; k < in->n_refs; k++) {
                const int b = in->refs[k].buf;
                if (b < 0 || !regc_instr_ref_bf16(in, k) || regc_instr_writes(in, k) ||
                    p->bufs[b].kind != BUF_ARENA || p->bufs[b].bytes < (64 << 10))
                    continue;
                int writer = -1;
                for (int w = 0; w < j; w++)
                    for (int r = 0; r < p->instr[w].n_refs; r++)
                        if (p->instr[w].refs[r].buf == b && regc_instr_writes(&p->instr[w], r) &&
                            p->instr[w].kernel != K_COMM_WAIT)
                            writer = w;
                if (writer < 0 || (writer >= loss_grad && p->instr[writer].kernel != K_COPY_H2D))
                    continue; /* made in the backward */
                if (p->instr[writer].kernel != K_COPY_H2D)
                    fail_msg("%s: instruction %d (%s) reads buffer %d (%lld bytes) in bf16, "
                             "written by %s in the forward, not brought back",
                             presets[i], j, regc_kernel_name(in->kernel), b,
                             (long long)p->bufs[b].bytes,
                             regc_kernel_name(p->instr[writer].kernel));
                reads++;
            }
        }
        if (reads == 0)
            fail_msg("%s: no value held in bf16 is read in the backward", presets[i]);
        regc_program_free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_keeps_the_bits),
        cmocka_unit_test(test_memory_as_planned),
        cmocka_unit_test(test_copies_in_their_places),
        cmocka_unit_test(test_budget_offloads_what_must_go),
        cmocka_unit_test(test_host_budget),
        cmocka_unit_test(test_lazy_program_and_cache),
        cmocka_unit_test(test_bf16_values_leave),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
