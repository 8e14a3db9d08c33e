/* instr.c — one instruction through a backend, which operands it writes,
 * and its readable form. */
#include <stdio.h>
#include <string.h>

#include "program.h"

static const char *const kernel_names[K_COUNT] = {
    [K_FILL] = "fill",
    [K_COPY] = "copy",
    [K_COPY_2D] = "copy_2d",
    [K_TRANSPOSE] = "transpose",
    [K_GEMM] = "gemm",
    [K_EMBED_FWD] = "embedding",
    [K_EMBED_BWD] = "embedding_bwd",
    [K_ADD] = "add",
    [K_BIAS_ADD] = "bias_add",
    [K_SUM_ROWS] = "sum_rows",
    [K_LN_FWD] = "layernorm",
    [K_LN_BWD] = "layernorm_bwd",
    [K_RMS_FWD] = "rmsnorm",
    [K_RMS_BWD] = "rmsnorm_bwd",
    [K_ROPE] = "rope",
    [K_UNARY] = "unary",
    [K_BINARY] = "binary",
    [K_ATTN_FWD] = "attention",
    [K_ATTN_BWD] = "attention_bwd",
    [K_CE_FWD] = "cross_entropy",
    [K_ROW_SUM] = "row_sum",
    [K_SOFTMAX] = "softmax",
    [K_CE_BWD] = "cross_entropy_bwd",
    [K_EW] = "fused_elementwise",
    [K_ADD_LN_FWD] = "add_layernorm",
    [K_ADD_RMS_FWD] = "add_rmsnorm",
    [K_LN_BWD_ADD] = "layernorm_bwd_add",
    [K_RMS_BWD_ADD] = "rmsnorm_bwd_add",
    [K_DROPOUT] = "dropout",
    [K_CE_ROWS] = "cross_entropy_rows",
    [K_CE_LOSS] = "cross_entropy_loss",
    [K_STEP_SCHEDULE] = "step_schedule",
    [K_GRAD_SUMSQ] = "grad_sumsq",
    [K_GRAD_CLIP] = "grad_clip",
    [K_ADAMW] = "adamw",
    [K_COPY_D2H] = "copy_d2h",
    [K_COPY_H2D] = "copy_h2d",
    [K_ALLREDUCE] = "allreduce",
    [K_ALLGATHER] = "allgather",
    [K_REDUCE_SCATTER] = "reduce_scatter",
    [K_COMM_WAIT] = "wait",
};

const char *regc_kernel_name(regc_kernel k)
{
    return (unsigned)k < K_COUNT ? kernel_names[k] : "?";
}

int regc_instr_writes(const regc_instr *in, int k)
{
    if (in->kernel == K_GEMM) {
        int e = in->epilogue;
        return k == 0 || (k == 4 && (e == REGC_EPI_GELU_AUX || e == REGC_EPI_BIAS_GELU_AUX)) ||
               (k == 5 && (e == REGC_EPI_DGELU_BGRAD || e == REGC_EPI_BGRAD));
    }
    return k < in->n_out;
}

int regc_instr_bf16_allowed(const regc_instr *in, int k)
{
    switch (in->kernel) {
    case K_GEMM: return in->bf16 && (k == 1 || k == 2 || (k == 0 && !in->accumulate));
    case K_LN_FWD:
    case K_RMS_FWD:
    case K_CE_BWD: return k == 0;
    case K_ADD_LN_FWD:
    case K_ADD_RMS_FWD: return k == 1;
    case K_EW: return k < in->n_refs;                     /* outputs and inputs */
    case K_ATTN_FWD: return k == 0 || (k >= 2 && k <= 4); /* out, q, k, v */
    case K_ROPE: return k == 0;                           /* y */
    case K_ATTN_BWD: return (k >= 5 && k <= 7) || k == 9; /* q, k, v, out */
    case K_EMBED_FWD: return k == 2; /* the table: a frozen embedding of a bf16 base */
    case K_ALLGATHER: return k == 0;
    case K_COMM_WAIT: return k == 0 && in->d[1] == K_ALLGATHER;
    default: return 0;
    }
}

int regc_instr_inplace_input(const regc_instr *in)
{
    if (in->bf16_refs) /* a bf16 output's elements lie elsewhere than its input's */
        return -1;
    switch (in->kernel) {
    case K_ADD:
    case K_BIAS_ADD:
    case K_UNARY:
    case K_BINARY:
    case K_DROPOUT: return 1;
    case K_EW: return in->ew->period[0] == 0 ? in->n_out : -1;
    case K_LN_BWD_ADD: return 3;
    case K_RMS_BWD_ADD: return 2;
    default: return -1;
    }
}

/* A missing kernel is an error that names it. */
#define NEED(fn)                                                                                   \
    do {                                                                                           \
        if (!be->fn)                                                                               \
            return regc_error(REGC_ERR_UNSUPPORTED, "backend %s has no kernel %s", be->name, #fn); \
    } while (0)

#define P(i) ((float *)p[i])
#define C(i) ((const float *)p[i])
#define I32(i) ((const int32_t *)p[i])

static int run_unary(regc_backend *be, const regc_instr *in, void *const *p)
{
    int64_t n = in->d[0];
    switch ((regc_op)in->unary) {
    case REGC_OP_GELU:
        NEED(gelu_fwd);
        be->gelu_fwd(be, P(0), C(1), n);
        break;
    case REGC_OP_SILU:
        NEED(silu_fwd);
        be->silu_fwd(be, P(0), C(1), n);
        break;
    case REGC_OP_GELU_ERF:
        NEED(gelu_erf_fwd);
        be->gelu_erf_fwd(be, P(0), C(1), n);
        break;
    case REGC_OP_RELU:
        NEED(relu_fwd);
        be->relu_fwd(be, P(0), C(1), n);
        break;
    case REGC_OP_SCALE:
        NEED(scale);
        be->scale(be, P(0), C(1), in->f, n);
        break;
    case REGC_OP_MUL:
        NEED(mul);
        be->mul(be, P(0), C(1), C(2), n);
        break;
    case REGC_OP_GELU_BWD:
        NEED(gelu_bwd);
        be->gelu_bwd(be, P(0), C(1), C(2), n);
        break;
    case REGC_OP_SILU_BWD:
        NEED(silu_bwd);
        be->silu_bwd(be, P(0), C(1), C(2), n);
        break;
    case REGC_OP_GELU_ERF_BWD:
        NEED(gelu_erf_bwd);
        be->gelu_erf_bwd(be, P(0), C(1), C(2), n);
        break;
    case REGC_OP_RELU_BWD:
        NEED(relu_bwd);
        be->relu_bwd(be, P(0), C(1), C(2), n);
        break;
    default:
        return regc_error(REGC_ERR_UNSUPPORTED, "instruction: no elementwise op %d", in->unary);
    }
    return REGC_OK;
}

void regc_instr_gemm(const regc_instr *in, void *const *p, regc_gemm *g)
{
    const int64_t *d = in->d;
    *g = (regc_gemm){.trans_a = in->trans_a,
                     .trans_b = in->trans_b,
                     .m = d[0],
                     .n = d[1],
                     .k = d[2],
                     .a = C(1),
                     .lda = d[3],
                     .b = C(2),
                     .ldb = d[4],
                     .c = P(0),
                     .ldc = d[1],
                     .alpha = 1.0f,
                     .accumulate = in->accumulate,
                     .epilogue = (regc_epilogue)in->epilogue,
                     .bias = C(3),
                     .aux = P(4),
                     .ldaux = d[1],
                     .bias_grad = P(5),
                     .bf16 = in->bf16,
                     .c_bf16 = regc_instr_ref_bf16(in, 0),
                     .a_bf16 = regc_instr_ref_bf16(in, 1),
                     .b_bf16 = regc_instr_ref_bf16(in, 2),
                     .b_nf4 = in->b_nf4};
}

/* An attention instruction's shape with its bf16 operands named: q, k and v
 * at refs q_ref .. q_ref + 2, out at ref out_ref. */
static regc_attn_shape attn_with_bf16(const regc_instr *in, int q_ref, int out_ref)
{
    regc_attn_shape s = in->attn;
    s.bf16 = (regc_instr_ref_bf16(in, q_ref) ? REGC_ATTN_Q_BF16 : 0u) |
             (regc_instr_ref_bf16(in, q_ref + 1) ? REGC_ATTN_K_BF16 : 0u) |
             (regc_instr_ref_bf16(in, q_ref + 2) ? REGC_ATTN_V_BF16 : 0u) |
             (regc_instr_ref_bf16(in, out_ref) ? REGC_ATTN_OUT_BF16 : 0u);
    return s;
}

int regc_instr_run(regc_backend *be, const regc_instr *in, void *const *p)
{
    const int64_t *d = in->d;
    switch ((regc_kernel)in->kernel) {
    case K_FILL: be->fill(be, P(0), (size_t)d[0], in->f); return REGC_OK;
    case K_COPY: be->copy_d2d(be, p[0], p[1], (size_t)d[0]); return REGC_OK;
    case K_COPY_D2H: /* on a side queue where there is one: compute goes on meanwhile */
        (be->copy_d2h_side ? be->copy_d2h_side : be->copy_d2h)(be, p[0], p[1], (size_t)d[0]);
        return REGC_OK;
    case K_COPY_H2D: be->copy_h2d(be, p[0], p[1], (size_t)d[0]); return REGC_OK;
    case K_COPY_2D:
        NEED(copy_2d);
        be->copy_2d(be, P(0), d[2], C(1), d[3], d[0], d[1]);
        return REGC_OK;
    case K_TRANSPOSE:
        NEED(transpose);
        be->transpose(be, P(0), C(1), (int)d[0], d + 1, in->perm);
        return REGC_OK;
    case K_GEMM: {
        NEED(gemm);
        regc_gemm g;
        regc_instr_gemm(in, p, &g);
        return be->gemm(be, &g);
    }
    case K_EMBED_FWD:
        NEED(embedding_fwd);
        be->embedding_fwd(be, P(0), I32(1), C(2), d[0], d[1], regc_instr_ref_bf16(in, 2));
        return REGC_OK;
    case K_EMBED_BWD:
        NEED(embedding_bwd);
        be->embedding_bwd(be, P(0), I32(1), C(2), d[0], d[1], d[2], in->accumulate, d[3] - 1);
        return REGC_OK;
    case K_ADD:
        NEED(add);
        be->add(be, P(0), C(1), C(2), d[0]);
        return REGC_OK;
    case K_BIAS_ADD:
        NEED(bias_add);
        be->bias_add(be, P(0), C(1), C(2), d[0], d[1]);
        return REGC_OK;
    case K_SUM_ROWS:
        NEED(sum_rows);
        be->sum_rows(be, P(0), C(1), d[0], d[1]);
        return REGC_OK;
    case K_ROW_SUM:
        NEED(row_sum);
        be->row_sum(be, P(0), C(1), d[0], d[1], (int)d[2]);
        return REGC_OK;
    case K_SOFTMAX:
        NEED(softmax_fwd);
        be->softmax_fwd(be, P(0), P(1), C(2), d[0], d[1], (int)d[2]);
        return REGC_OK;
    case K_LN_FWD:
        NEED(layernorm_fwd);
        be->layernorm_fwd(be, P(0), P(1), P(2), C(3), C(4), C(5), d[0], d[1], in->f,
                          regc_instr_ref_bf16(in, 0));
        return REGC_OK;
    case K_LN_BWD:
        NEED(layernorm_bwd);
        be->layernorm_bwd(be, P(0), P(1), P(2), C(3), C(4), C(5), C(6), C(7), d[0], d[1]);
        return REGC_OK;
    case K_RMS_FWD:
        NEED(rmsnorm_fwd);
        be->rmsnorm_fwd(be, P(0), P(1), C(2), C(3), d[0], d[1], in->f, regc_instr_ref_bf16(in, 0));
        return REGC_OK;
    case K_RMS_BWD:
        NEED(rmsnorm_bwd);
        be->rmsnorm_bwd(be, P(0), P(1), C(2), C(3), C(4), C(5), d[0], d[1]);
        return REGC_OK;
    case K_ROPE:
        NEED(rope);
        be->rope(be, P(0), C(1), C(2), C(3), d[0], d[1], (int)d[2], (int)d[3], (int)d[5], (int)d[4],
                 regc_instr_ref_bf16(in, 0));
        return REGC_OK;
    case K_UNARY:
    case K_BINARY: return run_unary(be, in, p);
    case K_DROPOUT:
        NEED(dropout);
        be->dropout(be, P(0), C(1), I32(2), I32(3), in->f, d[0]);
        return REGC_OK;
    case K_ATTN_FWD: {
        NEED(attention_fwd);
        regc_attn_shape s = attn_with_bf16(in, 2, 0);
        s.dropout = in->f, s.drop_site = I32(6), s.drop_draw = I32(7), s.doc_start = I32(8);
        be->attention_fwd(be, P(0), P(1), C(2), C(3), C(4), C(5), &s);
        return REGC_OK;
    }
    case K_ATTN_BWD: {
        NEED(attention_bwd);
        regc_attn_shape s = attn_with_bf16(in, 5, 9);
        s.dropout = in->f, s.drop_site = I32(11), s.drop_draw = I32(12), s.doc_start = I32(13);
        be->attention_bwd(be, P(0), P(1), P(2), P(3), C(4), C(5), C(6), C(7), C(8), C(9), C(10),
                          &s);
        return REGC_OK;
    }
    case K_CE_FWD:
        NEED(cross_entropy_fwd);
        be->cross_entropy_fwd(be, P(0), P(1), C(2), I32(3), d[0], d[1]);
        return REGC_OK;
    case K_CE_BWD:
        NEED(cross_entropy_bwd);
        be->cross_entropy_bwd(be, P(0), C(1), C(2), I32(3), C(4), d[0], d[1], d[2], d[3],
                              regc_instr_ref_bf16(in, 0));
        return REGC_OK;
    case K_CE_ROWS:
        NEED(cross_entropy_rows);
        be->cross_entropy_rows(be, P(0), P(1), C(2), I32(3), d[0], d[1]);
        return REGC_OK;
    case K_CE_LOSS:
        NEED(cross_entropy_loss);
        be->cross_entropy_loss(be, P(0), C(1), C(2), I32(3), d[0], d[1]);
        return REGC_OK;
    case K_EW: {
        NEED(elementwise);
        int no = in->ew->n_outputs;
        be->elementwise(be, in->ew, d[0], (float *const *)p, (const float *const *)(p + no),
                        in->bf16_refs & ((1u << no) - 1u), (unsigned)in->bf16_refs >> no);
        return REGC_OK;
    }
    case K_ADD_LN_FWD:
        NEED(add_layernorm_fwd);
        be->add_layernorm_fwd(be, P(0), P(1), P(2), P(3), C(4), C(5), C(6), C(7), d[0], d[1], in->f,
                              regc_instr_ref_bf16(in, 1));
        return REGC_OK;
    case K_ADD_RMS_FWD:
        NEED(add_rmsnorm_fwd);
        be->add_rmsnorm_fwd(be, P(0), P(1), P(2), C(3), C(4), C(5), d[0], d[1], in->f,
                            regc_instr_ref_bf16(in, 1));
        return REGC_OK;
    case K_LN_BWD_ADD:
        NEED(layernorm_bwd_add);
        be->layernorm_bwd_add(be, P(0), P(1), P(2), C(3), C(4), C(5), C(6), C(7), C(8), d[0], d[1]);
        return REGC_OK;
    case K_RMS_BWD_ADD:
        NEED(rmsnorm_bwd_add);
        be->rmsnorm_bwd_add(be, P(0), P(1), C(2), C(3), C(4), C(5), C(6), d[0], d[1]);
        return REGC_OK;
    case K_STEP_SCHEDULE:
        NEED(step_schedule);
        be->step_schedule(be, (regc_step_scalars *)p[0]);
        return REGC_OK;
    case K_GRAD_SUMSQ:
        NEED(grad_sumsq);
        be->grad_sumsq(be, C(1), d[0], (regc_step_scalars *)p[0]);
        return REGC_OK;
    case K_GRAD_CLIP:
        NEED(grad_clip);
        be->grad_clip(be, (regc_step_scalars *)p[0]);
        return REGC_OK;
    case K_ADAMW:     /* over the block's runs with and without decay (program_run.c) */
    case K_ALLREDUCE: /* collectives run on the communicator (program_run.c) */
    case K_ALLGATHER:
    case K_REDUCE_SCATTER:
    case K_COMM_WAIT:
    case K_COUNT: break;
    }
    return regc_error(REGC_ERR_UNSUPPORTED, "instruction: unknown kernel %d", in->kernel);
}

void regc_instr_label(const regc_instr *in, char *buf, size_t size)
{
    const char *name = in->kernel == K_UNARY || in->kernel == K_BINARY
                           ? regc_op_name((regc_op)in->unary)
                           : regc_kernel_name(in->kernel);
    int n = snprintf(buf, size, "%s", name);
    if (in->kernel == K_COMM_WAIT)
        snprintf(buf + n, size - (size_t)n, " %s", regc_kernel_name((regc_kernel)in->d[1]));
    else if (in->signal)
        snprintf(buf + n, size - (size_t)n, " start");
    if (in->kernel == K_GEMM)
        snprintf(buf + n, size - (size_t)n, "[%s m=%lld n=%lld k=%lld ta=%d tb=%d%s%s%s]",
                 regc_epilogue_name((regc_epilogue)in->epilogue), (long long)in->d[0],
                 (long long)in->d[1], (long long)in->d[2], in->trans_a, in->trans_b,
                 in->accumulate ? " acc" : "", in->bf16 ? " bf16" : "", in->b_nf4 ? " nf4" : "");
    if (in->kernel == K_EMBED_BWD && in->accumulate)
        snprintf(buf + n, size - (size_t)n, "[acc]");
    if (in->kernel == K_EW && in->ew->n_steps == 0 && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "[to %s]", in->bf16_refs & 1u ? "bf16" : "fp32");
    else if (in->kernel == K_EW) {
        for (int s = 0; s < in->ew->n_steps && n > 0 && (size_t)n + 1 < size; s++)
            n += snprintf(buf + n, size - (size_t)n, "%s%d", s ? " " : "[", in->ew->steps[s].op);
        if (n > 0 && (size_t)n + 1 < size)
            snprintf(buf + n, size - (size_t)n, "]");
    }
    /* a recomputation is a row of its own in profiles, and says so in dumps */
    const size_t len = strlen(buf);
    if (in->replay && len + 1 < size)
        snprintf(buf + len, size - len, " (recomputed)");
}

double regc_instr_flop(const regc_instr *in)
{
    return in->kernel == K_GEMM ? 2.0 * (double)in->d[0] * (double)in->d[1] * (double)in->d[2]
                                : 0.0;
}

void regc_instr_dump(const regc_instr *in, FILE *f)
{
    char label[REGC_PROFILE_LABEL];
    regc_instr_label(in, label, sizeof label);
    fprintf(f, "%s ", label);
    for (int k = 0; k < in->n_refs; k++) {
        if (k == in->n_out && in->kernel != K_GEMM)
            fprintf(f, " <-");
        if (in->refs[k].buf == REGC_REF_NONE)
            fprintf(f, " -");
        else if (in->refs[k].off)
            fprintf(f, " %s%d+%lld", regc_instr_writes(in, k) ? "w" : "r", in->refs[k].buf,
                    (long long)in->refs[k].off);
        else
            fprintf(f, " %s%d", regc_instr_writes(in, k) ? "w" : "r", in->refs[k].buf);
        if (regc_instr_ref_bf16(in, k))
            fprintf(f, ":bf16");
    }
    fputc('\n', f);
}
