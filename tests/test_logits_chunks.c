/* test_logits_chunks.c — compile.logits_chunk_rows: the head's GEMM and its
 * cross-entropy in chunks of rows, forward and backward.
 *  - The same training: GPT-2, Llama and T5, and on GPT-2 at O0, as one
 *    region, at stage 3, with gradient accumulation, in bf16: the
 *    first step's loss within 1e-6 relative of the whole logits', its
 *    gradient norm too (the head's weight gradient sums its rows chunk by
 *    chunk; in bf16 within 1e-3, below), the next four losses within 1e-4
 *    (1e-3).
 *  - Never whole: no buffer of the step holds the logits or their
 *    gradient, the chunks' rows cover the loss's once each, in order;
 *    Gemma 2's soft-capped logits (elementwise steps between the head and
 *    the loss, forward and backward) are chunked too, at O0 and O1 (in
 *    bf16 with held activations they stay whole); so are BERT's and Phi's
 *    heads with a bias (whose gradient sums every row, chunk by chunk),
 *    training alike; a frozen head (LoRA) keeps its input for the
 *    backward's chunks; every region valid; a chunk as large as the loss
 *    leaves the step as it was.
 *  - Less memory, as planned: the arena is smaller, and the run's device
 *    peak is the plan's total within 1%; the forward-only step (validation)
 *    is chunked too.
 *  - Under a budget that only chunks meet, recompute auto takes them (GPT-2's
 *    head and BERT's, with its bias); below what they reach, the refusal
 *    says so. */
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
#include "test_model.h"
#include "test_util.h"
#include "validate.h"

#define STEPS 5
#define CHUNK 5 /* rows: the loss's 2 x 16 rows in six chunks, the last of two */

static regc_train_options base_options(void) { return regc_test_train_options(2, 16, STEPS); }

static int setup(void **state) { return regc_test_dir_setup(state, "chunks", NULL); }

/* ---- the same training ---------------------------------------------------- */

static void test_chunks_train_alike(void **state)
{
    (void)state;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "t5-tiny"};
    static const struct {
        const char *what;
        regc_level level;
        int regional, stage, accumulate;
        regc_precision precision;
    } ways[] = {
        {"O1, regional", REGC_LEVEL_O1, 1, 0, 1, REGC_PRECISION_FP32},
        {"O0", REGC_LEVEL_O0, 1, 0, 1, REGC_PRECISION_FP32},
        {"the whole graph as one region", REGC_LEVEL_O1, 0, 0, 1, REGC_PRECISION_FP32},
        {"stage 3", REGC_LEVEL_O1, 1, 3, 1, REGC_PRECISION_FP32},
        {"two micro-batches a step", REGC_LEVEL_O1, 1, 0, 2, REGC_PRECISION_FP32},
        {"bf16", REGC_LEVEL_O1, 1, 0, 1, REGC_PRECISION_BF16},
    };
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
            if (i > 0 && w > 0) /* Llama and T5 regional at O1; every way on GPT-2 */
                continue;
            regc_train_options o = base_options();
            o.compile.level = ways[w].level, o.compile.regional = ways[w].regional;
            o.compile.zero_stage = ways[w].stage, o.grad_accum = ways[w].accumulate;
            o.compile.precision = ways[w].precision;
            o.max_grad_norm = 1e9; /* reports the gradient's norm, clips nothing */
            regc_test_losses whole, chunked;
            regc_model *mw = regc_test_train(presets[i], &o, &whole);
            o.compile.logits_chunk_rows = CHUNK;
            regc_model *mc = regc_test_train(presets[i], &o, &chunked);
            /* the first step's loss and gradient: the same step; after it,
             * AdamW's first update (each weight by lr times the sign of its
             * gradient) turns a gradient near 0 whose last bits differ into
             * a step the other way: the trajectories stay close, no more.
             * In bf16 a last-bit change of an fp32 sum (the head's input
             * gradient, its rows computed apart: OpenBLAS may sum them in
             * another order) moves a bf16 rounding, 2^-8, where it lands:
             * the gradient within 1e-3 then. */
            const int bf16 = ways[w].precision == REGC_PRECISION_BF16;
            const double tol[2] = {1e-6, bf16 ? 1e-3 : 1e-4};
            for (int k = 0; k < STEPS; k++) {
                const double rel = fabs((double)chunked.loss[k] - (double)whole.loss[k]) /
                                   fabs((double)whole.loss[k]);
                if (!(rel <= tol[k > 0]))
                    fail_msg("%s, %s, step %d: %.9g in chunks, %.9g whole (%.2e relative)",
                             presets[i], ways[w].what, k, chunked.loss[k], whole.loss[k], rel);
            }
            const double g = fabs((double)chunked.grad_norm[0] - (double)whole.grad_norm[0]) /
                             fabs((double)whole.grad_norm[0]);
            if (!(g <= (bf16 ? 1e-3 : 1e-6)))
                fail_msg("%s, %s: the first gradient's norm %.9g in chunks, %.9g whole", presets[i],
                         ways[w].what, chunked.grad_norm[0], whole.grad_norm[0]);
            regc_model_free(mw), regc_model_free(mc);
        }
}

/* ---- never whole --------------------------------------------------------- */

/* The flat program's chunks: rows covered once each, in order; no buffer
 * as large as the logits. */
static void check_never_whole(const regc_program *p, int64_t rows, int64_t vocab, int backward)
{
    int64_t next = 0, loss_at = -1;
    int chunks = 0, recomputed = 0;
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        if (in->kernel == K_CE_ROWS) {
            assert_int_equal(in->refs[0].off, next * (int64_t)sizeof(float));
            assert_true(in->d[0] <= CHUNK && in->d[1] == vocab);
            next += in->d[0], chunks++;
        }
        if (in->kernel == K_CE_LOSS)
            loss_at = i, assert_int_equal(in->d[0], rows);
        if (in->kernel == K_GEMM && in->replay && in->d[1] == vocab)
            recomputed++;
    }
    assert_int_equal(next, rows);
    assert_true(loss_at >= 0);
    assert_int_equal(chunks, (rows + CHUNK - 1) / CHUNK);
    assert_int_equal(recomputed, backward ? chunks : 0);
    /* what holds logits or their gradient: the loss kernels' logits and
     * dlogits (the head's GEMMs write the former) */
    for (int i = 0; i < p->n_instr; i++) {
        const regc_instr *in = &p->instr[i];
        int held[2] = {-1, -1};
        if (in->kernel == K_CE_ROWS)
            held[0] = in->refs[2].buf;
        if (in->kernel == K_CE_BWD)
            held[0] = in->refs[0].buf, held[1] = in->refs[2].buf;
        assert_true(in->kernel != K_CE_FWD);
        for (int k = 0; k < 2; k++)
            if (held[k] >= 0 && p->bufs[held[k]].bytes > CHUNK * vocab * (int64_t)sizeof(float))
                fail_msg("instruction %d (%s) holds logits in %lld bytes, more than a chunk", i,
                         regc_kernel_name(in->kernel), (long long)p->bufs[held[k]].bytes);
    }
}

/* Every region of p valid on its own: no pass reads what it did not write
 * (a backward chunk's logits computed again from a head input the forward
 * let go would be refused). */
static void check_regions(const regc_program *p)
{
    for (int k = 0; k < regc_program_n_regions(p); k++)
        if (regc_region_validate(regc_program_region(p, k)) != REGC_OK)
            fail_msg("region %d: %s", k, regc_error_message());
}

static void test_logits_never_whole(void **state)
{
    (void)state;
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.logits_chunk_rows = CHUNK;
    regc_program *p = regc_test_compile("gpt2-tiny", 2, 16, &co, NULL);
    check_never_whole(p, 32, 512, 1);
    assert_int_equal(regc_program_validate(p), REGC_OK);
    regc_program_free(p);
    /* validation's forward-only step */
    co.forward_only = 1;
    p = regc_test_compile("llama-tiny", 2, 16, &co, NULL);
    check_never_whole(p, 32, 512, 0);
    assert_int_equal(regc_program_validate(p), REGC_OK);
    regc_program_free(p);
    co.forward_only = 0;
    /* a chunk as large as the loss: as it was */
    static const struct {
        const char *preset;
        int64_t chunk;
    } same[] = {{"gpt2-tiny", 32}, {"gpt2-tiny", 1000}};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        regc_compile_options whole;
        regc_compile_options_default(&whole);
        co.logits_chunk_rows = same[i].chunk;
        regc_program *a = regc_test_compile(same[i].preset, 2, 16, &whole, NULL);
        regc_program *b = regc_test_compile(same[i].preset, 2, 16, &co, NULL);
        if (regc_program_hash(a) != regc_program_hash(b))
            fail_msg("%s with chunks of %lld rows: another program", same[i].preset,
                     (long long)same[i].chunk);
        regc_program_free(a), regc_program_free(b);
    }
}

/* The same training of two draws of one model, mw with the logits whole
 * and mc with o's chunks: the first loss and gradient norm within 1e-6,
 * the next losses within 1e-4 (see test_chunks_train_alike). */
static void check_trains_alike(const char *what, regc_model *mw, regc_model *mc,
                               const regc_train_options *o)
{
    regc_train_options ow = *o;
    ow.compile.logits_chunk_rows = 0;
    regc_test_losses whole, chunked;
    regc_test_train_model(mw, &ow, &whole);
    regc_test_train_model(mc, o, &chunked);
    for (int k = 0; k < STEPS; k++) {
        const double rel =
            fabs((double)chunked.loss[k] - (double)whole.loss[k]) / fabs((double)whole.loss[k]);
        if (!(rel <= (k ? 1e-4 : 1e-6)))
            fail_msg("%s, step %d: %.9g in chunks, %.9g whole (%.2e relative)", what, k,
                     chunked.loss[k], whole.loss[k], rel);
    }
    const double g = fabs((double)chunked.grad_norm[0] - (double)whole.grad_norm[0]) /
                     fabs((double)whole.grad_norm[0]);
    if (!(g <= 1e-6))
        fail_msg("%s: the first gradient's norm %.9g in chunks, %.9g whole", what,
                 chunked.grad_norm[0], whole.grad_norm[0]);
}

/* ---- steps between the head and the loss --------------------------------- */

/* Gemma 2's logits soft-capped (cap·tanh(L/cap)) between the head's GEMM
 * and the loss: the steps run a chunk at a time too, forward and backward
 * (unfused at O0, one fused chain at O1), none over the whole logits, and
 * the training is the same as with the logits whole. */
static void test_softcapped_logits_in_chunks(void **state)
{
    const regc_test_dir *d = *state;
    static const char *const keys[][2] = {
        {"vocab_size", "300"},
        {"hidden_size", "32"},
        {"intermediate_size", "48"},
        {"num_hidden_layers", "2"},
        {"num_attention_heads", "4"},
        {"num_key_value_heads", "2"},
        {"head_dim", "8"},
        {"max_position_embeddings", "32"},
        {"sliding_window", "32"},
        {"final_logit_softcapping", "2.0"},
        {"attn_logit_softcapping", "null"},
    };
    regc_test_write_config(d->dir, "\"model_type\": \"gemma2\"", keys, sizeof keys / sizeof keys[0],
                           NULL, NULL);
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_config(d->dir, &m), REGC_OK);
    static const regc_level levels[] = {REGC_LEVEL_O0, REGC_LEVEL_O1};
    for (size_t l = 0; l < 2; l++) {
        regc_compile_options co;
        regc_compile_options_default(&co);
        co.level = levels[l], co.logits_chunk_rows = CHUNK;
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile(m, 2, 16, &co, &p, NULL), REGC_OK);
        assert_int_equal(regc_program_validate(p), REGC_OK);
        check_regions(p);
        if (levels[l] == REGC_LEVEL_O1) { /* the flat program's instructions */
            check_never_whole(p, 32, 300, 1);
            for (int i = 0; i < p->n_instr; i++) {
                const regc_instr *in = &p->instr[i];
                if ((in->kernel == K_UNARY || in->kernel == K_BINARY || in->kernel == K_EW) &&
                    in->d[0] % 300 == 0 && in->d[0] > CHUNK * 300)
                    fail_msg("instruction %d (%s) over %lld elements, more than a chunk's", i,
                             regc_kernel_name(in->kernel), (long long)in->d[0]);
            }
        }
        /* O0 runs its regions as they are: the head's region has the
         * chunks' loss kernels and no whole-logits step */
        int rows_kernels = 0, whole_steps = 0;
        for (int k = 0; k < regc_program_n_regions(p); k++) {
            const regc_compiled_region *r = regc_program_region(p, k);
            for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
                const regc_instr *in = i < r->n_fwd ? &r->fwd[i] : &r->bwd[i - r->n_fwd];
                rows_kernels += in->kernel == K_CE_ROWS;
                whole_steps +=
                    (in->kernel == K_UNARY || in->kernel == K_BINARY || in->kernel == K_EW) &&
                    in->d[0] >= 32 * 300;
            }
        }
        if (rows_kernels != (32 + CHUNK - 1) / CHUNK || whole_steps)
            fail_msg("O%zu: %d chunks' loss kernels, %d steps over the whole logits", l,
                     rows_kernels, whole_steps);
        regc_program_free(p);

        regc_train_options o = base_options();
        o.compile.level = levels[l], o.compile.logits_chunk_rows = CHUNK;
        o.max_grad_norm = 1e9;
        regc_model *mw = NULL, *mc = NULL; /* each its own draw of the init */
        assert_int_equal(regc_model_load_config(d->dir, &mw), REGC_OK);
        assert_int_equal(regc_model_load_config(d->dir, &mc), REGC_OK);
        check_trains_alike(levels[l] == REGC_LEVEL_O0 ? "gemma2 at O0" : "gemma2 at O1", mw, mc,
                           &o);
        regc_model_free(mw), regc_model_free(mc);
    }
    /* in bf16, where the tanh the backward reads is held in bf16, the
     * steps stay whole (chunked, they would not be held): the same
     * program as without chunks; fp32 storage chunks them */
    regc_compile_options co, whole;
    regc_compile_options_default(&co), regc_compile_options_default(&whole);
    co.precision = whole.precision = REGC_PRECISION_BF16, co.logits_chunk_rows = CHUNK;
    regc_program *a = NULL, *b = NULL;
    assert_int_equal(regc_program_compile(m, 2, 16, &co, &a, NULL), REGC_OK);
    assert_int_equal(regc_program_compile(m, 2, 16, &whole, &b, NULL), REGC_OK);
    assert_true(regc_program_hash(a) == regc_program_hash(b));
    regc_program_free(a), regc_program_free(b);
    co.fp32_storage = 1;
    assert_int_equal(regc_program_compile(m, 2, 16, &co, &a, NULL), REGC_OK);
    check_never_whole(a, 32, 300, 1);
    regc_program_free(a);
    regc_model_free(m);
}

/* ---- a head with a bias ------------------------------------------------- */

/* BERT's and Phi's heads add a bias to the logits (the GEMM's epilogue at
 * O1, a step of its own at O0), whose gradient sums every row of the
 * logits' gradient: it is summed chunk by chunk, the first chunk's sum
 * written and each later one's added, no row sum over the whole logits;
 * the training is the one with the logits whole, at O0 and O1, at stage 3
 * and over two micro-batches a step. */
static void test_biased_head_in_chunks(void **state)
{
    const regc_test_dir *d = *state;
    static const char *const keys[][2] = {
        {"vocab_size", "300"},
        {"hidden_size", "32"},
        {"intermediate_size", "48"},
        {"num_hidden_layers", "2"},
        {"num_attention_heads", "4"},
        {"num_key_value_heads", "2"},
        {"max_position_embeddings", "32"},
        {"partial_rotary_factor", "0.5"},
    };
    regc_test_write_config(d->dir, "\"model_type\": \"phi\"", keys, sizeof keys / sizeof keys[0],
                           NULL, NULL);
    static const regc_level levels[] = {REGC_LEVEL_O0, REGC_LEVEL_O1};
    for (int phi = 0; phi < 2; phi++)
        for (size_t l = 0; l < 2; l++) {
            char what[64];
            snprintf(what, sizeof what, "%s at O%zu", phi ? "phi" : "bert-tiny", l);
            regc_model *m[2] = {NULL, NULL}; /* each its own draw of the init */
            for (int k = 0; k < 2; k++)
                assert_int_equal(phi ? regc_model_load_config(d->dir, &m[k])
                                     : regc_model_load("bert-tiny", &m[k]),
                                 REGC_OK);
            const int64_t vocab = regc_model_vocab(m[0]);
            regc_compile_options co;
            regc_compile_options_default(&co);
            co.level = levels[l], co.logits_chunk_rows = CHUNK;
            regc_program *p = NULL;
            assert_int_equal(regc_program_compile(m[0], 2, 16, &co, &p, NULL), REGC_OK);
            assert_int_equal(regc_program_validate(p), REGC_OK);
            check_regions(p);
            if (levels[l] == REGC_LEVEL_O1)
                check_never_whole(p, 32, vocab, 1);
            /* the bias's gradient: a row sum per chunk in the loss's region,
             * none over more rows (BERT's layers sum rows as wide, too) */
            int sums = 0;
            for (int k = 0; k < regc_program_n_regions(p); k++) {
                const regc_compiled_region *r = regc_program_region(p, k);
                int loss = 0;
                for (int i = 0; i < r->n_fwd; i++)
                    loss |= r->fwd[i].kernel == K_CE_ROWS;
                for (int i = 0; loss && i < r->n_bwd; i++) {
                    const regc_instr *in = &r->bwd[i];
                    if (in->kernel != K_SUM_ROWS || in->d[1] != vocab)
                        continue;
                    if (in->d[0] > CHUNK)
                        fail_msg("%s: a row sum of %lld rows of the logits' gradient", what,
                                 (long long)in->d[0]);
                    sums++;
                }
            }
            if (sums != (32 + CHUNK - 1) / CHUNK)
                fail_msg("%s: %d row sums of the logits' gradient", what, sums);
            regc_program_free(p);
            regc_train_options o = base_options();
            o.compile.level = levels[l], o.compile.logits_chunk_rows = CHUNK;
            o.max_grad_norm = 1e9;
            check_trains_alike(what, m[0], m[1], &o);
            regc_model_free(m[0]), regc_model_free(m[1]);
        }
    /* Phi's at stage 3 (the bias's gradient a gathered unit's) and over two
     * micro-batches a step (each chunk's sums after the first step's added
     * to the gradient block) */
    for (int way = 0; way < 2; way++) {
        regc_model *m[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++)
            assert_int_equal(regc_model_load_config(d->dir, &m[k]), REGC_OK);
        regc_train_options o = base_options();
        o.compile.logits_chunk_rows = CHUNK, o.max_grad_norm = 1e9;
        if (way == 0)
            o.compile.zero_stage = 3;
        else
            o.grad_accum = 2;
        check_trains_alike(way ? "phi, two micro-batches a step" : "phi at stage 3", m[0], m[1],
                           &o);
        regc_model_free(m[0]), regc_model_free(m[1]);
    }
}

/* ---- a frozen head ------------------------------------------------------ */

/* LoRA leaves the head frozen: no weight gradient reads the head's input,
 * which the backward's chunks read to compute their logits again; it is
 * kept for them, and the training is the one with the logits whole. */
static void test_frozen_head_in_chunks(void **state)
{
    (void)state;
    regc_test_losses whole, chunked;
    regc_train_options o = base_options();
    o.max_grad_norm = 1e9;
    for (int c = 0; c < 2; c++) {
        regc_model *m = NULL;
        assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
        regc_lora_config lc = {.r = 4, .alpha = 8.0, .target_modules = "q_proj,v_proj", .seed = 1};
        assert_int_equal(regc_model_add_lora(m, &lc), REGC_OK);
        o.compile.logits_chunk_rows = c ? CHUNK : 0;
        if (c) {
            regc_program *p = NULL;
            assert_int_equal(regc_program_compile(m, 2, 16, &o.compile, &p, NULL), REGC_OK);
            check_never_whole(p, 32, 512, 1);
            check_regions(p);
            regc_program_free(p);
        }
        regc_test_train_model(m, &o, c ? &chunked : &whole);
        regc_model_free(m);
    }
    for (int k = 0; k < STEPS; k++)
        if (!(fabs((double)chunked.loss[k] - (double)whole.loss[k]) <=
              (k ? 1e-4 : 1e-6) * fabs((double)whole.loss[k])))
            fail_msg("step %d: %.9g in chunks, %.9g whole", k, chunked.loss[k], whole.loss[k]);
    if (!(fabs((double)chunked.grad_norm[0] - (double)whole.grad_norm[0]) <=
          1e-6 * fabs((double)whole.grad_norm[0])))
        fail_msg("the first gradient's norm %.9g in chunks, %.9g whole", chunked.grad_norm[0],
                 whole.grad_norm[0]);
}

/* ---- less memory, as planned ------------------------------------------- */

static void test_memory_as_planned(void **state)
{
    (void)state;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "t5-tiny"};
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        int64_t act[2];
        for (int c = 0; c < 2; c++) {
            regc_train_options o = base_options();
            o.batch = 4, o.seq = 32;
            o.compile.logits_chunk_rows = c ? 8 : 0;
            regc_program *p = regc_test_compile(presets[i], o.batch, o.seq, &o.compile, NULL);
            regc_device_memory a;
            regc_program_device_memory(p, &a);
            act[c] = a.activations;
            regc_test_losses l;
            regc_model *m = regc_test_train(presets[i], &o, &l);
            if (!(fabs((double)(l.device_peak - a.total)) <= 0.01 * (double)a.total))
                fail_msg("%s, chunks of %lld rows: planned %lld bytes, held %lld", presets[i],
                         (long long)o.compile.logits_chunk_rows, (long long)a.total,
                         (long long)l.device_peak);
            regc_model_free(m);
            regc_program_free(p);
        }
        if (!(act[1] < act[0]))
            fail_msg("%s: activations %lld in chunks, %lld whole", presets[i], (long long)act[1],
                     (long long)act[0]);
    }
}

/* ---- auto under a budget ------------------------------------------------- */

/* The device bytes of preset's step at [1, 128] with everything that can
 * be recomputed, the logits in chunks of `chunk` rows (0: whole). */
static int64_t most_recomputed(const char *preset, int64_t chunk)
{
    regc_compile_options co;
    regc_compile_options_default(&co);
    co.recompute_ratio = 1e30, co.logits_chunk_rows = chunk;
    regc_program *p = regc_test_compile(preset, 1, 128, &co, NULL);
    regc_device_memory m;
    regc_program_device_memory(p, &m);
    regc_program_free(p);
    return m.total;
}

static void test_auto_takes_chunks(void **state)
{
    (void)state;
    /* GPT-2 124M's 50257-word vocabulary at one sequence of 128: the logits
     * are most of what the step's activations hold; BERT's 30522, its head
     * with a bias */
    static const char *const presets[] = {"gpt2-124m", "bert-base"};
    int64_t whole = 0, chunked = 0;
    regc_compile_options co;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        whole = most_recomputed(presets[i], 0), chunked = most_recomputed(presets[i], 16);
        assert_true(chunked < whole);
        /* between the two: only chunks fit */
        regc_compile_options_default(&co);
        co.budget_bytes = (whole + chunked) / 2;
        regc_program *p = regc_test_compile(presets[i], 1, 128, &co, NULL);
        regc_fit_plan r;
        regc_program_fit_plan(p, &r);
        if (!(r.logits_chunks > 1))
            fail_msg("%s: auto kept the logits whole under %lld bytes", presets[i],
                     (long long)co.budget_bytes);
        regc_device_memory c;
        regc_program_device_memory(p, &c);
        assert_true(c.total <= co.budget_bytes);
        regc_program_free(p);
    }
    const int64_t b_total = most_recomputed("gpt2-124m", 16);
    /* below what the chunks reach: refused, saying so */
    regc_compile_options_default(&co);
    co.budget_bytes = b_total / 2;
    int rc;
    assert_null(regc_test_compile("gpt2-124m", 1, 128, &co, &rc));
    assert_int_equal(rc, REGC_ERR_BUDGET);
    /* offloading is off: the message says what was tried */
    assert_non_null(strstr(regc_error_message(), "(recomputing and chunking what can be)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks_train_alike),
        cmocka_unit_test(test_logits_never_whole),
        regc_test_in_dir(test_softcapped_logits_in_chunks, setup),
        regc_test_in_dir(test_biased_head_in_chunks, setup),
        cmocka_unit_test(test_frozen_head_in_chunks),
        cmocka_unit_test(test_memory_as_planned),
        cmocka_unit_test(test_auto_takes_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
