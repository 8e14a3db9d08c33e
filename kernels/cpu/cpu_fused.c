/* cpu_fused.c — the fused elementwise chain: one pass over memory for a
 * straight-line program of elementwise steps (bias add + GELU, SiLU * up,
 * GELU backward + scale, ...) instead of one pass per kernel. Elements are
 * evaluated in blocks: every register of a block lives in a small array on
 * the stack, so each step is a loop that vectorises and the intermediate
 * values never leave L1. Each step calls the same per-element function as
 * its single kernel (kernel_math.h), so the chain is bit-identical to the
 * kernels run one by one. An input or output may be held in bf16: read
 * widened, written rounded, each element alone. */
#include "cpu_kernels.h"
#include "kernel_checks.h"
#include "regc_common.h"

/* 24 registers of 256 floats: 24 KiB, within L1 beside the streams */
#define CPU_EW_BLOCK 256
#define CPU_EW_MAX_REGS (REGC_EW_MAX_INPUTS + REGC_EW_MAX_STEPS)

/* the ops whose single kernels go parallel at an eighth of regc_cpu_par_min */
static int ew_op_costly(int op)
{
    switch (op) {
#define EW_COSTLY(id, name, arity, costly, f)                                                      \
    case REGC_EW_##id: return costly;
        REGC_EW_OPS(EW_COSTLY)
#undef EW_COSTLY
    default: return 0;
    }
}

/* d[j] = step(a[j], b[j]) for j < len; d is a scratch register distinct
 * from both sources (a and b may be the same register). One loop per op,
 * the switch outside it, so each loop vectorises: in the widest vectors
 * the CPU has, as the exp of GELU and SiLU is bound by their arithmetic
 * (in a build for no particular CPU, built for the baseline alone, a bf16
 * step's GELU chain took 13 times as long). */
REGC_CPU_WIDE_VECTORS static void ew_apply(const regc_ew_step *st, float *restrict d,
                                           const float *restrict a_reg, const float *restrict b_reg,
                                           int64_t len)
{
    const float v = st->value;
    (void)v;
    switch (st->op) {
#define EW_LOOP(id, name, arity, costly, f)                                                        \
    case REGC_EW_##id:                                                                             \
        for (int64_t j = 0; j < len; j++) {                                                        \
            const float a = a_reg[j], b = b_reg[j];                                                \
            (void)b;                                                                               \
            d[j] = f;                                                                              \
        }                                                                                          \
        break;
        REGC_EW_OPS(EW_LOOP)
#undef EW_LOOP
    default: break; /* refused by regc_ew_check */
    }
}

void regc_cpu_elementwise(regc_backend *be, const regc_ew_program *p, int64_t n, float *const *out,
                          const float *const *in, unsigned out_bf16, unsigned in_bf16)
{
    int status = regc_ew_check(p, n, out, in, out_bf16, in_bf16);
    if (status != REGC_OK) {
        regc_cpu_set_failure(be, status);
        return;
    }
    if (n == 0 || p->n_outputs == 0)
        return;
    const int n_in = p->n_inputs, n_steps = p->n_steps, n_out = p->n_outputs;

    /* An input is read through a pointer into its array where it can be.
     * One that is also an output is copied first: outputs are written after
     * every step of the block, and an output may overwrite an input (in
     * place), so the pass-through must hold the values from before. */
    int is_output[REGC_EW_MAX_INPUTS] = {0};
    for (int k = 0; k < n_out; k++)
        if (p->out_reg[k] < n_in)
            is_output[p->out_reg[k]] = 1;
    int costly = 0;
    for (int s = 0; s < n_steps; s++)
        costly |= ew_op_costly(p->steps[s].op);
    const int64_t par_min = costly ? regc_cpu_par_min(be) / 8 : regc_cpu_par_min(be);

    const int64_t n_blocks = (n + CPU_EW_BLOCK - 1) / CPU_EW_BLOCK;
#pragma omp parallel for num_threads(regc_cpu_threads(be)) if (n >= par_min) schedule(static)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        _Alignas(64) float buf[CPU_EW_MAX_REGS][CPU_EW_BLOCK]; /* [regs, block] */
        const float *reg[CPU_EW_MAX_REGS];
        const int64_t e0 = blk * CPU_EW_BLOCK;
        const int64_t len = n - e0 < CPU_EW_BLOCK ? n - e0 : CPU_EW_BLOCK;
        for (int i = 0; i < n_in; i++) {
            const int64_t period = p->period[i];
            const int64_t start = period > 0 ? e0 % period : e0;
            if (p->inner[i] > 1 || (in_bf16 >> i & 1u)) {
                /* a row's statistic (each value over inner elements), or
                 * bf16 values widened */
                const int bf16 = (int)(in_bf16 >> i & 1u);
                for (int64_t j = 0; j < len; j++)
                    buf[i][j] = regc_load_f32_or_bf16(in[i], bf16, regc_ew_index(p, i, e0 + j));
                reg[i] = buf[i];
                continue;
            }
            /* a broadcast block inside one period is a plain slice of its
             * input too (never overwritten: regc_ew_check refuses that) */
            if (!is_output[i] && (period == 0 || start + len <= period)) {
                reg[i] = in[i] + start;
                continue;
            }
            if (period == 0) {
                memcpy(buf[i], in[i] + e0, (size_t)len * sizeof(float));
            } else {
                /* whole runs of the period, wrapping to its start */
                for (int64_t j = 0, idx = start; j < len; idx = 0) {
                    const int64_t run = period - idx < len - j ? period - idx : len - j;
                    memcpy(buf[i] + j, in[i] + idx, (size_t)run * sizeof(float));
                    j += run;
                }
            }
            reg[i] = buf[i];
        }
        for (int s = 0; s < n_steps; s++) {
            const regc_ew_step *st = &p->steps[s];
            float *d = buf[n_in + s]; /* [len] */
            ew_apply(st, d, reg[st->a], regc_ew_binary(st->op) ? reg[st->b] : reg[st->a], len);
            reg[n_in + s] = d;
        }
        /* every source here is a scratch register, never an output array */
        for (int k = 0; k < n_out; k++) {
            if (out_bf16 >> k & 1u) {
                uint16_t *o = (uint16_t *)out[k] + e0; /* [len] bf16 */
                const float *v = reg[p->out_reg[k]];
                for (int64_t j = 0; j < len; j++)
                    o[j] = regc_bf16_bits(v[j]);
            } else {
                memcpy(out[k] + e0, reg[p->out_reg[k]], (size_t)len * sizeof(float));
            }
        }
    }
}
