/* test_bf16_activations.c — under compile.precision "bf16", the saved
 * activations autocast holds in bf16 (a bf16 GEMM's output and what
 * attention, RoPE, copies and elementwise ops make from such values alone)
 * are rounded where they are made and held in bf16 (region_bf16.c).
 *  - Which: in GPT-2, Llama, BERT and T5 every such saved value of a layer
 *    is held in bf16, what the norms or the loss read stays fp32, and the
 *    layer keeps fewer saved bytes than with compile.fp32_storage; every
 *    read of a held value reads bf16 or a copy widened from it, and
 *    attention reads its q, k, v and out, and writes its out, in bf16,
 *    as RoPE writes its rotated q and k.
 *  - The same rounding however the step is compiled: op by op (O0) and
 *    fused (O1) give the same loss and gradients bit for bit, on GPT-2
 *    and on GPT-2 written out op by op (GELU as tanh and products, whose
 *    fused chains keep intermediate values the backward reads: the chain
 *    rounds them before reading them again).
 *  - The programs pass the validator after a trip through their serial
 *    form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_common.h"
#include "regc_models.h"
#include "serial.h"
#include "test_model.h"
#include "test_util.h"
#include "validate.h"

static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "bert-tiny", "t5-tiny"};

static regc_compile_options bf16_options(regc_level level, int fp32_storage)
{
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.precision = REGC_PRECISION_BF16, o.fp32_storage = fp32_storage, o.level = level;
    return o;
}

/* The region's saved bytes per instance, over its layer regions. */
static int64_t layer_saved_bytes(const regc_program *p)
{
    int64_t n = 0;
    for (int i = 0; i < p->n_regions; i++)
        if (strncmp(p->regions[i]->name, "layer", 5) == 0)
            n += p->regions[i]->saved_bytes;
    return n;
}

/* Is slot s of r read, anywhere, by a kernel autocast runs in fp32? */
static int read_in_fp32_math(const regc_compiled_region *r, int s)
{
    for (int i = 0; i < r->n_fwd + r->n_bwd; i++) {
        const regc_instr *in = regc_region_instr(r, i);
        for (int k = 0; k < in->n_refs; k++)
            if (in->refs[k].buf == s && !regc_instr_writes(in, k) &&
                (in->kernel == K_LN_FWD || in->kernel == K_RMS_FWD || in->kernel == K_LN_BWD ||
                 in->kernel == K_RMS_BWD || in->kernel == K_LN_BWD_ADD ||
                 in->kernel == K_RMS_BWD_ADD || in->kernel == K_CE_FWD || in->kernel == K_CE_BWD ||
                 in->kernel == K_SOFTMAX))
                return 1;
    }
    return 0;
}

static void test_saved_values_held_in_bf16(void **state)
{
    (void)state;
    for (size_t m = 0; m < sizeof presets / sizeof *presets; m++) {
        regc_compile_options o = bf16_options(REGC_LEVEL_O1, 0);
        regc_program *p = regc_test_compile(presets[m], 2, 16, &o, NULL);
        o.fp32_storage = 1;
        regc_program *wide = regc_test_compile(presets[m], 2, 16, &o, NULL);
        const int64_t held = layer_saved_bytes(p), all = layer_saved_bytes(wide);
        printf("%s: a layer saves %lld bytes, %lld with every tensor in fp32\n", presets[m],
               (long long)held, (long long)all);
        if (!(held < all * 3 / 4))
            fail_msg("%s: %lld saved bytes, against %lld in fp32", presets[m], (long long)held,
                     (long long)all);
        for (int i = 0; i < p->n_regions; i++) {
            const regc_compiled_region *r = p->regions[i];
            if (strncmp(r->name, "layer", 5) != 0)
                continue;
            for (int j = 0; j < r->n_fwd; j++) {
                const regc_instr *in = &r->fwd[j];
                /* a GEMM's C, attention's output: what the backward keeps
                 * of them is held in bf16, unless a norm or the loss reads
                 * it (as its own fp32 copy under autocast) */
                const int made = in->kernel == K_GEMM || in->kernel == K_ATTN_FWD ? 0 : -1;
                int s = made < 0 ? -1 : in->refs[made].buf;
                for (int q = j + 1; s >= 0 && q < r->n_fwd; q++) /* through its rounding */
                    if (r->fwd[q].kernel == K_EW && r->fwd[q].ew->n_steps == 0 &&
                        r->fwd[q].refs[1].buf == s)
                        s = r->fwd[q].refs[0].buf;
                if (s < 0 || r->slots[s].kind != SLOT_SAVED || read_in_fp32_math(r, s))
                    continue;
                if (!r->slots[s].bf16)
                    fail_msg("%s, %s: the saved output of forward instruction %d (%s) is fp32",
                             presets[m], r->name, j, regc_kernel_name(in->kernel));
            }
            /* attention reads q, k and v held in bf16 itself and writes
             * its out so, RoPE writes its rotated q and k so; attention's
             * backward reads the four as they are held */
            for (int j = 0; j < r->n_fwd + r->n_bwd; j++) {
                const regc_instr *in = regc_region_instr(r, j);
                const unsigned want = in->kernel == K_ATTN_FWD   ? 0x1du  /* out, q, k, v */
                                      : in->kernel == K_ATTN_BWD ? 0x2e0u /* q, k, v, out */
                                      : in->kernel == K_ROPE && j < r->n_fwd ? 0x1u /* y */
                                                                             : 0u;
                if (want && (in->bf16_refs & want) != want)
                    fail_msg("%s, %s: %s holds operands 0x%x in bf16, not 0x%x", presets[m],
                             r->name, regc_kernel_name(in->kernel), (unsigned)in->bf16_refs, want);
            }
            /* every read of a held slot reads bf16 (or is the widening) */
            for (int j = 0; j < r->n_fwd + r->n_bwd; j++) {
                const regc_instr *in = regc_region_instr(r, j);
                for (int k = 0; k < in->n_refs; k++) {
                    const int s = in->refs[k].buf;
                    if (s >= 0 && r->slots[s].bf16 && !regc_instr_ref_bf16(in, k))
                        fail_msg("%s, %s: instruction %d (%s) names slot %d, held in bf16, as "
                                 "fp32",
                                 presets[m], r->name, j, regc_kernel_name(in->kernel), s);
                }
            }
        }
        /* the serial form reads back and passes the validator */
        regc_bytes bytes = {0};
        regc_compile_stats st = {0};
        regc_program_write(p, &st, &bytes);
        regc_program *back = NULL;
        if (bytes.failed || regc_program_read(bytes.data, bytes.len, &back, &st) != REGC_OK ||
            regc_program_validate(back) != REGC_OK)
            fail_msg("%s: the program read back is refused: %s", presets[m], regc_error_message());
        regc_bytes_free(&bytes);
        regc_program_free(back), regc_program_free(p), regc_program_free(wide);
    }
}

/* ---- O0 and O1 round alike ------------------------------------------------ */

typedef struct {
    float loss;
    float *grads; /* [params] */
} step_result;

/* One forward and backward of graph g (taken) compiled at `level`, from
 * parameters and inputs every call fills alike. *rounds_inside: whether a
 * fused chain rounds a value it reads again. */
static void run_graph(regc_graph *g, regc_level level, int64_t n_params, step_result *out,
                      int *rounds_inside)
{
    regc_compile_options o = bf16_options(level, 0);
    regc_program *p = NULL;
    if (regc_program_compile_graph(g, &o, &p, NULL) != REGC_OK)
        fail_msg("%s: %s", regc_level_name(level), regc_error_message());
    *rounds_inside = 0;
    for (int i = 0; i < p->n_regions; i++)
        for (int j = 0; j < p->regions[i]->n_ew; j++)
            for (int s = 0; s < p->regions[i]->ew[j].n_steps; s++)
                *rounds_inside |= p->regions[i]->ew[j].steps[s].op == REGC_EW_ROUND_BF16;
    float *params = malloc((size_t)n_params * sizeof *params);
    out->grads = malloc((size_t)n_params * sizeof *out->grads);
    assert_non_null(params), assert_non_null(out->grads);
    regc_rng_fill_uniform(params, (size_t)n_params, 7, 0.0f, 0.5f);
    const int n_in = regc_program_n_inputs(p);
    void **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
    for (int i = 0; i < n_in; i++) {
        const regc_tensor *t = regc_program_input(p, i);
        const int64_t n = regc_tensor_numel(t);
        inputs[i] = malloc((size_t)regc_tensor_bytes(t));
        for (int64_t e = 0; e < n; e++)
            if (t->dtype == REGC_I32)
                ((int32_t *)inputs[i])[e] = strcmp(t->name, "position_ids") == 0
                                                ? (int32_t)(e % 16)
                                                : (int32_t)((e * 37 + 11) % 500);
            else
                ((float *)inputs[i])[e] = 0.0f;
    }
    regc_backend *be = regc_backend_cpu_new(1);
    regc_program_memory mem = {.params = params, .grads = out->grads, .inputs = inputs};
    assert_int_equal(regc_program_bind(p, be, &mem), REGC_OK);
    assert_int_equal(regc_program_run(p), REGC_OK);
    out->loss = *regc_program_loss(p);
    for (int i = 0; i < n_in; i++)
        free(inputs[i]);
    free(inputs), free(params);
    regc_program_free(p);
    regc_backend_free(be);
}

static void test_o0_and_o1_round_alike(void **state)
{
    (void)state;
    regc_model *m = NULL;
    regc_graph *g = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_build_graph(m, 2, 16, &g), REGC_OK);
    const int64_t n_params = regc_model_total_numel(m);
    for (int written_out = 0; written_out < 2; written_out++) {
        const char *what = written_out ? "GPT-2 written out op by op" : "GPT-2";
        step_result r[2];
        int rounds[2];
        for (int level = 0; level < 2; level++)
            run_graph(written_out ? regc_test_decompose(g) : regc_graph_dup(g),
                      level ? REGC_LEVEL_O1 : REGC_LEVEL_O0, n_params, &r[level], &rounds[level]);
        printf("%s: loss %.9g at O0, %.9g at O1\n", what, (double)r[0].loss, (double)r[1].loss);
        if (memcmp(&r[0].loss, &r[1].loss, sizeof r[0].loss) != 0)
            fail_msg("%s: loss %.9g at O0, %.9g at O1", what, (double)r[0].loss, (double)r[1].loss);
        for (int64_t i = 0; i < n_params; i++)
            if (memcmp(&r[0].grads[i], &r[1].grads[i], sizeof(float)) != 0)
                fail_msg("%s: gradient %lld is %.9g at O0, %.9g at O1", what, (long long)i,
                         (double)r[0].grads[i], (double)r[1].grads[i]);
        /* the written-out GELU's chains keep values they read again */
        assert_int_equal(rounds[1], written_out);
        free(r[0].grads), free(r[1].grads);
    }
    regc_graph_free(g);
    regc_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_saved_values_held_in_bf16),
        cmocka_unit_test(test_o0_and_o1_round_alike),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
