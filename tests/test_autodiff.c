/* test_autodiff.c — every backward rule against central finite differences.
 *
 * Each case builds y = op(x...) and the scalar f = sum(dy * y) for a random
 * dy, compiles that graph into a training step with the real compiler
 * (regc_program_compile_graph) and runs it on the CPU backend: the step's
 * gradient of f with respect to each x is autodiff's vector-Jacobian
 * product with dy, checked against (f(x + e) - f(x - e)) / 2e at sampled
 * elements of every x, the values of f coming from the same program's
 * forward pass. Every case runs at O0 (one kernel per op) and at O1 (the
 * passes and fusions). The float operands x are the graph's parameters;
 * inputs named "const_..." (RoPE's cos and sin tables) stay graph inputs,
 * constants by definition, and autodiff must give them no gradient. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "program.h"
#include "regc_backend.h"
#include "regc_region.h"
#include "serial.h"
#include "validate.h"

#define VOCAB 5 /* every int input holds ids < VOCAB */

typedef int (*build_fn)(regc_graph *g);

/* A float operand: a parameter (it receives a gradient), except the
 * "const_" tables, which are graph inputs. */
static int input(regc_graph *g, const char *name, int ndim, const int64_t *shape)
{
    regc_role role = strncmp(name, "const_", 6) == 0 ? REGC_ROLE_INPUT : REGC_ROLE_PARAM;
    return regc_graph_add_tensor(g, name, REGC_F32, role, ndim, shape);
}

static int ids(regc_graph *g, const char *name, int ndim, const int64_t *shape)
{
    return regc_graph_add_tensor(g, name, REGC_I32, REGC_ROLE_INPUT, ndim, shape);
}

/* ---- the harness */

/* f = sum(dy * y) as graph ops: [1, n] x [n, 1], reshaped to a scalar. */
static int add_objective(regc_graph *g, int y)
{
    const regc_tensor *ty = regc_graph_tensor(g, y);
    int64_t n = regc_tensor_numel(ty), shape[REGC_MAX_DIMS];
    memcpy(shape, ty->shape, sizeof shape);
    int dy = regc_graph_add_tensor(g, "dy", REGC_F32, REGC_ROLE_INPUT, ty->ndim, shape);
    assert_true(dy >= 0);
    int row = regc_graph_reshape(g, y, 2, (int64_t[]){1, n});
    int col = regc_graph_reshape(g, dy, 2, (int64_t[]){n, 1});
    int f = regc_graph_reshape(g, regc_graph_matmul(g, row, col, 0, 0), 0, (int64_t[]){1});
    assert_true(f >= 0);
    assert_int_equal(regc_graph_mark_output(g, f), REGC_OK);
    return f;
}

/* The rule's own contract, on the graph: every parameter gets a gradient
 * (each reaches y in these cases), no "const_" input does. */
static void check_structure(build_fn build, const char *what)
{
    regc_graph *g = regc_graph_new();
    int y = build(g);
    assert_true(y >= 0);
    const regc_tensor *ty = regc_graph_tensor(g, y);
    int64_t shape[REGC_MAX_DIMS];
    memcpy(shape, ty->shape, sizeof shape);
    int dy = regc_graph_add_tensor(g, "dy", REGC_F32, REGC_ROLE_INPUT, ty->ndim, shape);
    int n_fwd = regc_graph_n_tensors(g);
    int *grad_of = malloc((size_t)n_fwd * sizeof *grad_of);
    assert_int_equal(regc_autodiff_vjp(g, y, dy, grad_of), REGC_OK);
    for (int t = 0; t < n_fwd; t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role == REGC_ROLE_PARAM && grad_of[t] < 0)
            fail_msg("%s: parameter %s received no gradient", what, x->name);
        if (strncmp(x->name, "const_", 6) == 0 && grad_of[t] >= 0)
            fail_msg("%s: constant %s received a gradient", what, x->name);
    }
    free(grad_of);
    regc_graph_free(g);
}

typedef struct {
    regc_program *p;
    regc_backend *be;
    float *params, *grads; /* the parameter blocks, in tensor order */
} fd_case;

static double objective(fd_case *c)
{
    assert_int_equal(regc_program_run(c->p), REGC_OK);
    return (double)*regc_program_loss(c->p);
}

static void fill_input(const regc_tensor *t, void *data, uint64_t seed)
{
    int64_t n = regc_tensor_numel(t);
    if (t->dtype == REGC_I32) {
        int32_t *v = data;
        for (int64_t i = 0; i < n; i++)
            v[i] = (int32_t)((i * 3 + 1) % VOCAB);
        if (strcmp(t->name, "targets") == 0 && n > 1)
            v[1] = -1; /* an ignored position */
    } else {
        regc_rng_fill_uniform(data, (size_t)n, seed, 0.0f, 1.0f);
    }
}

static void check_case_at(build_fn build, const char *what, regc_level level)
{
    regc_graph *g = regc_graph_new();
    int y = build(g);
    assert_true(y >= 0);
    add_objective(g, y);
    /* the parameters' places in the blocks, in tensor order, and their
     * values; the graph goes to the compiler */
    int n_t = regc_graph_n_tensors(g), n_param = 0;
    int64_t *offset = calloc((size_t)n_t, sizeof *offset), total = 0;
    int *param = malloc((size_t)n_t * sizeof *param);
    char **name = calloc((size_t)n_t, sizeof *name);
    for (int t = 0; t < n_t; t++) {
        const regc_tensor *x = regc_graph_tensor(g, t);
        if (x->role != REGC_ROLE_PARAM)
            continue;
        param[n_param++] = t;
        name[t] = strdup(x->name);
        offset[t] = total;
        total += regc_tensor_numel(x);
    }
    fd_case c = {0};
    c.params = malloc((size_t)total * sizeof(float));
    c.grads = malloc((size_t)total * sizeof(float));
    for (int i = 0; i < n_param; i++) {
        int t = param[i];
        regc_rng_fill_uniform(c.params + offset[t],
                              (size_t)regc_tensor_numel(regc_graph_tensor(g, t)),
                              regc_rng_substream(42, (uint64_t)t), 0.0f, 1.0f);
    }
    int64_t *numel = calloc((size_t)n_t, sizeof *numel);
    for (int t = 0; t < n_t; t++)
        numel[t] = regc_tensor_numel(regc_graph_tensor(g, t));

    regc_compile_options o;
    regc_compile_options_default(&o);
    o.regional = 0;
    o.level = level;
    regc_program *compiled = NULL;
    regc_compile_stats st;
    assert_int_equal(regc_program_compile_graph(g, &o, &compiled, &st), REGC_OK);
    /* the program runs as the compile cache gives it back: written, read,
     * and checked as every decoded program is */
    regc_bytes bytes = {0};
    regc_program_write(compiled, &st, &bytes);
    assert_false(bytes.failed);
    regc_compile_stats back = st;
    if (regc_program_read(bytes.data, bytes.len, &c.p, &back) != REGC_OK ||
        regc_program_validate(c.p) != REGC_OK)
        fail_msg("%s at %s: the program read back is refused: %s", what, regc_level_name(level),
                 regc_error_message());
    for (int r = 0; r < c.p->n_regions; r++)
        assert_int_equal(regc_region_validate(c.p->regions[r]), REGC_OK);
    regc_bytes_free(&bytes);
    regc_program_free(compiled);
    int n_in = regc_program_n_inputs(c.p);
    void **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
    for (int i = 0; i < n_in; i++) {
        const regc_tensor *t = regc_program_input(c.p, i);
        inputs[i] = malloc((size_t)regc_tensor_bytes(t));
        fill_input(t, inputs[i], regc_rng_substream(43, (uint64_t)i));
    }
    c.be = regc_backend_cpu_new(1);
    assert_non_null(c.be);
    regc_program_memory mem = {.params = c.params, .grads = c.grads, .inputs = inputs};
    assert_int_equal(regc_program_bind(c.p, c.be, &mem), REGC_OK);

    (void)objective(&c);
    float *grad = malloc((size_t)total * sizeof *grad);
    memcpy(grad, c.grads, (size_t)total * sizeof *grad);
    int checked = 0;
    for (int i = 0; i < n_param; i++) {
        int t = param[i];
        float *x = c.params + offset[t];
        const float *gx = grad + offset[t];
        int64_t n = numel[t], stride = n > 24 ? n / 24 : 1;
        for (int64_t j = 0; j < n; j += stride) {
            const float eps = 5e-3f;
            float saved = x[j];
            x[j] = saved + eps;
            double fp = objective(&c);
            x[j] = saved - eps;
            double fm = objective(&c);
            x[j] = saved;
            double numeric = (fp - fm) / (2.0 * eps);
            double err = fabs(numeric - gx[j]);
            if (err > 5e-3 + 2e-2 * fabs(numeric))
                fail_msg("%s at %s: d/d %s[%lld]: autodiff %.6g, finite difference %.6g", what,
                         regc_level_name(level), name[t], (long long)j, gx[j], numeric);
            checked++;
        }
    }
    assert_true(checked > 0);

    for (int i = 0; i < n_in; i++)
        free(inputs[i]);
    for (int t = 0; t < n_t; t++)
        free(name[t]);
    free(inputs), free(name), free(param), free(offset), free(numel), free(grad);
    free(c.params), free(c.grads);
    regc_program_free(c.p);
    regc_backend_free(c.be);
}

static void check_case(build_fn build, const char *what)
{
    check_structure(build, what);
    check_case_at(build, what, REGC_LEVEL_O0);
    check_case_at(build, what, REGC_LEVEL_O1);
}

/* ---- one builder per rule */

static int b_embedding(regc_graph *g)
{
    int i = ids(g, "ids", 2, (int64_t[]){2, 3});
    int table = input(g, "table", 2, (int64_t[]){VOCAB, 4});
    return regc_graph_embedding(g, i, table);
}

static int b_add(regc_graph *g)
{
    int a = input(g, "a", 2, (int64_t[]){3, 4}), b = input(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_add(g, a, b);
}

static int b_add_same_tensor_twice(regc_graph *g)
{
    /* x feeds two readers: its gradient is the sum of both contributions */
    int x = input(g, "x", 2, (int64_t[]){3, 4});
    return regc_graph_add(g, regc_graph_gelu(g, x), x);
}

static int b_bias_add(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 1, (int64_t[]){4});
    return regc_graph_bias_add(g, x, b);
}

static int b_bias_add_2d(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_bias_add(g, x, b);
}

static int b_layernorm(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 5});
    int w = input(g, "w", 1, (int64_t[]){5}), b = input(g, "b", 1, (int64_t[]){5});
    return regc_graph_layernorm(g, x, w, b, 1e-5f);
}

static int b_matmul_nn(regc_graph *g)
{
    int a = input(g, "a", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 2, (int64_t[]){4, 5});
    return regc_graph_matmul(g, a, b, 0, 0);
}

static int b_matmul_nt(regc_graph *g)
{
    int a = input(g, "a", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 2, (int64_t[]){5, 4});
    return regc_graph_matmul(g, a, b, 0, 1);
}

static int b_matmul_tn(regc_graph *g)
{
    /* a is [2, 3, 4]: as a matrix [6, 4], transposed [4, 6]; the weight
     * gradient of a linear layer has this form */
    int a = input(g, "a", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 3, (int64_t[]){2, 3, 5});
    return regc_graph_matmul(g, a, b, 1, 0);
}

static int b_matmul_tt(regc_graph *g)
{
    int a = input(g, "a", 2, (int64_t[]){6, 4}), b = input(g, "b", 2, (int64_t[]){5, 6});
    return regc_graph_matmul(g, a, b, 1, 1);
}

static int b_gelu(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){3, 7});
    return regc_graph_gelu(g, x);
}

static int b_split_concat(regc_graph *g)
{
    /* one part unused: its gradient is zeros */
    int x = input(g, "x", 2, (int64_t[]){2, 9});
    int parts[3];
    assert_int_equal(regc_graph_split(g, x, 3, parts), 0);
    return regc_graph_concat(g, 2, (int[]){parts[2], parts[0]});
}

static int b_concat(regc_graph *g)
{
    int a = input(g, "a", 2, (int64_t[]){3, 2}), b = input(g, "b", 2, (int64_t[]){3, 2});
    return regc_graph_concat(g, 2, (int[]){a, b});
}

static int b_attention_causal_gqa(regc_graph *g)
{
    /* 4 query heads share 2 key/value heads, head_dim 3 */
    int q = input(g, "q", 3, (int64_t[]){2, 4, 12});
    int k = input(g, "k", 3, (int64_t[]){2, 4, 6}), v = input(g, "v", 3, (int64_t[]){2, 4, 6});
    return regc_graph_attention(g, q, k, v, 4, 2, 1, 1.0f / sqrtf(3.0f));
}

static int b_attention_cross(regc_graph *g)
{
    /* bidirectional, fewer queries than keys */
    int q = input(g, "q", 3, (int64_t[]){1, 3, 4});
    int k = input(g, "k", 3, (int64_t[]){1, 5, 4}), v = input(g, "v", 3, (int64_t[]){1, 5, 4});
    return regc_graph_attention(g, q, k, v, 2, 2, 0, 0.5f);
}

static int b_attention_bias_causal_gqa(regc_graph *g)
{
    /* T5 decoder self-attention: scale 1, position bias [H, T, T] */
    int q = input(g, "q", 3, (int64_t[]){2, 4, 12});
    int k = input(g, "k", 3, (int64_t[]){2, 4, 6}), v = input(g, "v", 3, (int64_t[]){2, 4, 6});
    int bias = input(g, "bias", 3, (int64_t[]){4, 4, 4});
    return regc_graph_attention_bias(g, q, k, v, bias, 4, 2, 1, 1.0f);
}

static int b_attention_bias_cross(regc_graph *g)
{
    int q = input(g, "q", 3, (int64_t[]){2, 3, 4});
    int k = input(g, "k", 3, (int64_t[]){2, 5, 4}), v = input(g, "v", 3, (int64_t[]){2, 5, 4});
    int bias = input(g, "bias", 3, (int64_t[]){2, 3, 5});
    return regc_graph_attention_bias(g, q, k, v, bias, 2, 2, 0, 1.0f);
}

static int b_rmsnorm(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 5}), w = input(g, "w", 1, (int64_t[]){5});
    return regc_graph_rmsnorm(g, x, w, 1e-6f);
}

static int b_rope(regc_graph *g)
{
    /* 2 heads of head_dim 4; the tables are [T, head_dim / 2] */
    int x = input(g, "x", 3, (int64_t[]){2, 3, 8});
    int cs = input(g, "const_cos", 2, (int64_t[]){3, 2});
    int sn = input(g, "const_sin", 2, (int64_t[]){3, 2});
    return regc_graph_rope(g, x, cs, sn, 2);
}

static int b_silu(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){3, 7});
    return regc_graph_silu(g, x);
}

static int b_gelu_erf(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){3, 7});
    return regc_graph_gelu_erf(g, x);
}

static int b_relu(regc_graph *g)
{
    /* The inputs are drawn from [0, 1): the negated half covers the zeroed
     * side, and both halves stay clear of the kink at 0 for these draws. */
    int x = input(g, "x", 2, (int64_t[]){3, 7}), neg = input(g, "neg", 2, (int64_t[]){3, 7});
    int both = regc_graph_concat(g, 2, (int[]){x, regc_graph_scale(g, neg, -1.0f)}); /* [3, 14] */
    return regc_graph_relu(g, both);
}

static int b_scale(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 5});
    return regc_graph_scale(g, x, -0.37f);
}

static int b_t5_gated_gelu(regc_graph *g)
{
    /* T5's gated-gelu feed-forward: gelu(x wi_0^T) * (x wi_1^T) */
    int x = input(g, "x", 2, (int64_t[]){3, 4});
    int wi0 = input(g, "wi0", 2, (int64_t[]){5, 4}), wi1 = input(g, "wi1", 2, (int64_t[]){5, 4});
    return regc_graph_mul(g, regc_graph_gelu(g, regc_graph_matmul(g, x, wi0, 0, 1)),
                          regc_graph_matmul(g, x, wi1, 0, 1));
}

static int b_swiglu(regc_graph *g)
{
    /* Llama's MLP gate: silu(gate) * up */
    int gate = input(g, "gate", 2, (int64_t[]){3, 4}), up = input(g, "up", 2, (int64_t[]){3, 4});
    return regc_graph_mul(g, regc_graph_silu(g, gate), up);
}

static int b_mul_same_tensor_twice(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){3, 4});
    return regc_graph_mul(g, x, x);
}

static int b_reshape(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){2, 6});
    int w = input(g, "w", 2, (int64_t[]){4, 2});
    return regc_graph_matmul(g, regc_graph_reshape(g, x, 2, (int64_t[]){3, 4}), w, 0, 0);
}

static int b_transpose(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 4});
    return regc_graph_transpose(g, x, (int[]){2, 0, 1});
}

static int b_cross_entropy(regc_graph *g)
{
    int logits = input(g, "logits", 3, (int64_t[]){2, 3, VOCAB});
    int t = ids(g, "targets", 2, (int64_t[]){2, 3});
    return regc_graph_cross_entropy(g, logits, t);
}

/* The elementwise ops an exported model brings. Parameters are drawn from
 * [-1, 1); shifts and scales place them where each op is interesting. */
static int b_sub(regc_graph *g)
{
    int a = input(g, "a", 2, (int64_t[]){3, 4}), b = input(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_sub(g, a, b);
}

static int b_sub_broadcast(regc_graph *g)
{
    int a = input(g, "a", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 1, (int64_t[]){4});
    return regc_graph_sub(g, a, b);
}

static int b_sub_broadcast_batch1(regc_graph *g)
{
    /* GPT-2's positions at batch 1: b has as many elements as a, and a one
     * more (unit) dimension; b's gradient still comes back in b's shape,
     * which the embedding's backward below it checks */
    int tok = ids(g, "ids", 2, (int64_t[]){1, 3}), pos = ids(g, "pos", 1, (int64_t[]){3});
    int wte = input(g, "wte", 2, (int64_t[]){VOCAB, 4}),
        wpe = input(g, "wpe", 2, (int64_t[]){VOCAB, 4});
    int a = regc_graph_embedding(g, tok, wte), b = regc_graph_embedding(g, pos, wpe);
    return regc_graph_sub(g, regc_graph_bias_add(g, a, b), b);
}

static int b_div(regc_graph *g)
{
    int a = input(g, "a", 2, (int64_t[]){3, 4}), b = input(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_div(g, a, regc_graph_add_scalar(g, regc_graph_scale(g, b, 0.25f), 1.0f));
}

static int b_div_broadcast(regc_graph *g)
{
    int a = input(g, "a", 3, (int64_t[]){2, 3, 4}), b = input(g, "b", 2, (int64_t[]){3, 4});
    return regc_graph_div(g, a, regc_graph_add_scalar(g, regc_graph_scale(g, b, 0.25f), 1.0f));
}

static int b_neg_exp(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){3, 5});
    return regc_graph_exp(g, regc_graph_neg(g, regc_graph_scale(g, x, 3.0f)));
}

static int b_tanh(regc_graph *g)
{
    /* [-2.4, 2.6): both of regc_tanhf's forms */
    int x = input(g, "x", 2, (int64_t[]){4, 6});
    return regc_graph_tanh(g, regc_graph_add_scalar(g, regc_graph_scale(g, x, 2.5f), 0.1f));
}

static int b_rsqrt(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){3, 5});
    return regc_graph_rsqrt(g, regc_graph_add_scalar(g, regc_graph_scale(g, x, 0.4f), 1.0f));
}

static int b_pow(regc_graph *g)
{
    /* a whole exponent over signed values, a fractional and a negative one
     * over positive values */
    int x = input(g, "x", 2, (int64_t[]){3, 4});
    int s = regc_graph_scale(g, x, 1.0f);                                 /* [-1, 1) */
    int p = regc_graph_add_scalar(g, regc_graph_scale(g, x, 0.5f), 1.0f); /* [0.5, 1.5) */
    int cube = regc_graph_pow(g, s, 3.0f);
    int frac = regc_graph_pow(g, p, 2.5f), inv = regc_graph_pow(g, p, -1.5f);
    return regc_graph_concat(g, 3, (int[]){cube, frac, inv}); /* [3, 12] */
}

static int b_gelu_decomposed(regc_graph *g)
{
    /* GPT-2's gelu_new as torch.export spells it: 0.5 x (1 + tanh(sqrt(2/pi)
     * (x + 0.044715 x^3))) */
    int x = input(g, "x", 2, (int64_t[]){3, 6});
    int s = regc_graph_scale(g, x, 3.0f); /* [-3, 3) */
    int inner = regc_graph_add(g, s, regc_graph_scale(g, regc_graph_pow(g, s, 3.0f), 0.044715f));
    int t = regc_graph_tanh(g, regc_graph_scale(g, inner, 0.7978845608f));
    return regc_graph_mul(g, regc_graph_scale(g, s, 0.5f), regc_graph_add_scalar(g, t, 1.0f));
}

/* The row ops (softmax, log-softmax, sum, mean over the last axis) and the
 * row broadcasts of their statistics. */
static int b_softmax(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 7});
    return regc_graph_softmax(g, regc_graph_scale(g, x, 3.0f));
}

static int b_log_softmax(regc_graph *g)
{
    int x = input(g, "x", 2, (int64_t[]){4, 9});
    return regc_graph_log_softmax(g, regc_graph_scale(g, x, 3.0f));
}

static int b_sum_mean_last(regc_graph *g)
{
    int x = input(g, "x", 3, (int64_t[]){2, 3, 5});
    int s = regc_graph_sum_last(g, x), m = regc_graph_mean_last(g, regc_graph_mul(g, x, x));
    return regc_graph_concat(g, 2, (int[]){s, m}); /* [2, 3, 2] */
}

static int b_row_broadcast(regc_graph *g)
{
    /* a [..., 1] statistic against its rows, in each operand place */
    int x = input(g, "x", 3, (int64_t[]){2, 3, 4}), r = input(g, "r", 3, (int64_t[]){2, 3, 1});
    int d = regc_graph_add_scalar(g, regc_graph_scale(g, r, 0.25f), 1.0f); /* [0.75, 1.25) */
    int y = regc_graph_div(g, regc_graph_sub(g, regc_graph_mul(g, x, r), r), d);
    return regc_graph_add(g, y, regc_graph_expand(g, r, 4));
}

static int b_rmsnorm_decomposed(regc_graph *g)
{
    /* Llama's RMSNorm as torch.export spells it:
     * w * (x * rsqrt(mean(x^2, -1, keepdim) + eps)) */
    int x = input(g, "x", 3, (int64_t[]){2, 3, 8}), w = input(g, "w", 1, (int64_t[]){8});
    int ms = regc_graph_mean_last(g, regc_graph_pow(g, x, 2.0f));
    int n = regc_graph_mul(g, x, regc_graph_rsqrt(g, regc_graph_add_scalar(g, ms, 1e-5f)));
    return regc_graph_mul(g, n, w);
}

static int b_attention_decomposed(regc_graph *g)
{
    /* one head of attention with an explicit additive mask (a parameter
     * here, so that its gradient is checked too): softmax(q k^T / 2 + mask) v */
    int q = input(g, "q", 2, (int64_t[]){5, 4}), k = input(g, "k", 2, (int64_t[]){5, 4});
    int v = input(g, "v", 2, (int64_t[]){5, 3});
    int mask = input(g, "mask", 2, (int64_t[]){5, 5});
    int s = regc_graph_scale(g, regc_graph_matmul(g, q, k, 0, 1), 0.5f); /* [5, 5] */
    int p = regc_graph_softmax(g, regc_graph_add(g, s, mask));
    return regc_graph_matmul(g, p, v, 0, 0); /* [5, 3] */
}

static int b_chain_shared_broadcast(regc_graph *g)
{
    /* one operand broadcast two ways by two ops of one chain: t [2, 1] a
     * row's statistic of A [2, 3], trailing dimensions of B [3, 2, 1] */
    int A = input(g, "A", 2, (int64_t[]){2, 3}), B = input(g, "B", 3, (int64_t[]){3, 2, 1});
    int t = input(g, "t", 2, (int64_t[]){2, 1});
    int y1 = regc_graph_sub(g, A, t), y2 = regc_graph_mul(g, B, t); /* 6 elements each */
    return regc_graph_matmul(g, regc_graph_reshape(g, y1, 2, (int64_t[]){6, 1}),
                             regc_graph_reshape(g, y2, 2, (int64_t[]){1, 6}), 0, 0); /* [6, 6] */
}

static int b_chain_through_reshape(regc_graph *g)
{
    /* a chain across a view: the add reads the gelu's output reshaped */
    int x = input(g, "x", 2, (int64_t[]){2, 3}), w = input(g, "w", 2, (int64_t[]){3, 2});
    return regc_graph_add(g, regc_graph_reshape(g, regc_graph_gelu(g, x), 2, (int64_t[]){3, 2}), w);
}

static int b_concat_unequal(regc_graph *g)
{
    /* parts of widths 2, 5 and 1 on the last axis */
    int a = input(g, "a", 2, (int64_t[]){3, 2}), b = input(g, "b", 2, (int64_t[]){3, 5});
    int c = input(g, "c", 2, (int64_t[]){3, 1});
    return regc_graph_concat(g, 3, (int[]){a, regc_graph_tanh(g, b), c}); /* [3, 8] */
}

static int b_masked_fill(regc_graph *g)
{
    /* masks from constants: relu zeroes about half of each; one of x's
     * shape, one per row, one per column */
    int x = input(g, "x", 2, (int64_t[]){4, 5});
    int m = regc_graph_relu(g, input(g, "const_m", 2, (int64_t[]){4, 5}));
    int r = regc_graph_relu(g, input(g, "const_r", 2, (int64_t[]){4, 1}));
    int cm = regc_graph_relu(g, input(g, "const_c", 1, (int64_t[]){5}));
    int y = regc_graph_masked_fill(g, regc_graph_scale(g, x, 2.0f), m, -2.5f);
    y = regc_graph_masked_fill(g, y, r, 0.0f);
    return regc_graph_masked_fill(g, regc_graph_mul(g, y, x), cm, 7.0f);
}

static int b_slice(regc_graph *g)
{
    /* windows of each axis, overlapping, read back together */
    int x = input(g, "x", 3, (int64_t[]){2, 5, 6});
    int a = regc_graph_slice(g, x, 0, 1, 1);                               /* [1, 5, 6] */
    int b = regc_graph_slice(g, regc_graph_slice(g, x, 1, 1, 3), 0, 0, 1); /* [1, 3, 6] */
    int c = regc_graph_slice(g, a, 2, 2, 3);                               /* [1, 5, 3] */
    int ab = regc_graph_matmul(g, regc_graph_reshape(g, b, 2, (int64_t[]){3, 6}),
                               regc_graph_reshape(g, a, 2, (int64_t[]){5, 6}), 0, 1); /* [3, 5] */
    int cc = regc_graph_reshape(g, regc_graph_mul(g, c, c), 2, (int64_t[]){5, 3});
    return regc_graph_matmul(g, ab, cc, 0, 0); /* [3, 3] */
}

#define CASE(name)                                                                                 \
    static void test_##name(void **state)                                                          \
    {                                                                                              \
        (void)state;                                                                               \
        check_case(b_##name, #name);                                                               \
    }
CASE(embedding)
CASE(add)
CASE(add_same_tensor_twice)
CASE(bias_add)
CASE(bias_add_2d)
CASE(layernorm)
CASE(matmul_nn)
CASE(matmul_nt)
CASE(matmul_tn)
CASE(matmul_tt)
CASE(gelu)
CASE(split_concat)
CASE(concat)
CASE(attention_causal_gqa)
CASE(attention_cross)
CASE(attention_bias_causal_gqa)
CASE(attention_bias_cross)
CASE(rmsnorm)
CASE(rope)
CASE(silu)
CASE(gelu_erf)
CASE(relu)
CASE(scale)
CASE(t5_gated_gelu)
CASE(swiglu)
CASE(mul_same_tensor_twice)
CASE(reshape)
CASE(transpose)
CASE(cross_entropy)
CASE(sub)
CASE(sub_broadcast)
CASE(sub_broadcast_batch1)
CASE(div)
CASE(div_broadcast)
CASE(neg_exp)
CASE(tanh)
CASE(rsqrt)
CASE(pow)
CASE(gelu_decomposed)
CASE(softmax)
CASE(log_softmax)
CASE(sum_mean_last)
CASE(row_broadcast)
CASE(rmsnorm_decomposed)
CASE(attention_decomposed)
CASE(masked_fill)
CASE(concat_unequal)
CASE(chain_shared_broadcast)
CASE(chain_through_reshape)
CASE(slice)

/* A padding row (PyTorch's padding_idx) takes no gradient from the
 * embedding; every other row gets the bits it gets without one. */
static void test_embedding_padding_row(void **state)
{
    (void)state;
    float *grads[2];
    const int64_t vocab = VOCAB, cols = 4, pad = 1; /* fill_input's ids hold 1 */
    for (int padded = 0; padded < 2; padded++) {
        regc_graph *g = regc_graph_new();
        int i = ids(g, "ids", 2, (int64_t[]){2, 3});
        int table = input(g, "table", 2, (int64_t[]){vocab, cols});
        regc_attrs a = {.padded = padded, .padding_idx = padded ? pad : 0};
        int y = 0;
        assert_true(regc_graph_add_node(g, REGC_OP_EMBEDDING, &a, 2, (int[]){i, table}, 1, &y, 0,
                                        NULL) >= 0);
        add_objective(g, y);
        regc_compile_options o;
        regc_compile_options_default(&o);
        o.regional = 0;
        regc_program *p = NULL;
        assert_int_equal(regc_program_compile_graph(g, &o, &p, NULL), REGC_OK);
        int n_in = regc_program_n_inputs(p);
        void **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
        for (int k = 0; k < n_in; k++) {
            const regc_tensor *t = regc_program_input(p, k);
            inputs[k] = malloc((size_t)regc_tensor_bytes(t));
            fill_input(t, inputs[k], regc_rng_substream(43, (uint64_t)k));
        }
        float *params = malloc((size_t)(vocab * cols) * sizeof *params);
        grads[padded] = malloc((size_t)(vocab * cols) * sizeof(float));
        regc_rng_fill_uniform(params, (size_t)(vocab * cols), 42, 0.0f, 1.0f);
        regc_backend *be = regc_backend_cpu_new(1);
        regc_program_memory mem = {.params = params, .grads = grads[padded], .inputs = inputs};
        assert_int_equal(regc_program_bind(p, be, &mem), REGC_OK);
        assert_int_equal(regc_program_run(p), REGC_OK);
        for (int k = 0; k < n_in; k++)
            free(inputs[k]);
        free(inputs), free(params);
        regc_program_free(p); /* and the graph it took */
        regc_backend_free(be);
    }
    for (int64_t v = 0; v < vocab; v++)
        for (int64_t c = 0; c < cols; c++) {
            const float got = grads[1][v * cols + c], plain = grads[0][v * cols + c];
            if (v == pad ? got != 0.0f || plain == 0.0f : memcmp(&got, &plain, sizeof got) != 0)
                fail_msg("row %lld column %lld: %g with the padding row %lld, %g without",
                         (long long)v, (long long)c, got, (long long)pad, plain);
        }
    free(grads[0]), free(grads[1]);
}

/* ---- errors */

static void test_backward_op_has_no_rule(void **state)
{
    (void)state;
    regc_graph *g = regc_graph_new();
    int x = input(g, "x", 1, (int64_t[]){4}), dy = input(g, "dy", 1, (int64_t[]){4});
    int out;
    assert_true(
        regc_graph_add_node(g, REGC_OP_GELU_BWD, NULL, 2, (int[]){dy, x}, 1, &out, 0, NULL) >= 0);
    int d = input(g, "d", 1, (int64_t[]){4});
    int *grad_of = malloc((size_t)regc_graph_n_tensors(g) * sizeof *grad_of);
    assert_int_equal(regc_autodiff_vjp(g, out, d, grad_of), REGC_ERR_UNSUPPORTED);
    assert_non_null(strstr(regc_error_message(), "gelu_bwd"));
    free(grad_of);
    regc_graph_free(g);
}

static void test_loss_must_be_scalar(void **state)
{
    (void)state;
    regc_graph *g = regc_graph_new();
    int x = input(g, "x", 1, (int64_t[]){4});
    int y = regc_graph_gelu(g, x);
    int *grad_of = malloc((size_t)(regc_graph_n_tensors(g) + 1) * sizeof *grad_of);
    assert_int_equal(regc_autodiff_loss(g, y, grad_of), REGC_ERR_SHAPE);
    assert_non_null(strstr(regc_error_message(), "not a scalar"));
    free(grad_of);
    regc_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_add_same_tensor_twice),
        cmocka_unit_test(test_bias_add),
        cmocka_unit_test(test_bias_add_2d),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul_nn),
        cmocka_unit_test(test_matmul_nt),
        cmocka_unit_test(test_matmul_tn),
        cmocka_unit_test(test_matmul_tt),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_split_concat),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_attention_causal_gqa),
        cmocka_unit_test(test_attention_cross),
        cmocka_unit_test(test_attention_bias_causal_gqa),
        cmocka_unit_test(test_attention_bias_cross),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_scale),
        cmocka_unit_test(test_t5_gated_gelu),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_mul_same_tensor_twice),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_sub),
        cmocka_unit_test(test_sub_broadcast),
        cmocka_unit_test(test_sub_broadcast_batch1),
        cmocka_unit_test(test_div),
        cmocka_unit_test(test_div_broadcast),
        cmocka_unit_test(test_neg_exp),
        cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_rsqrt),
        cmocka_unit_test(test_pow),
        cmocka_unit_test(test_gelu_decomposed),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_sum_mean_last),
        cmocka_unit_test(test_row_broadcast),
        cmocka_unit_test(test_rmsnorm_decomposed),
        cmocka_unit_test(test_attention_decomposed),
        cmocka_unit_test(test_masked_fill),
        cmocka_unit_test(test_concat_unequal),
        cmocka_unit_test(test_chain_shared_broadcast),
        cmocka_unit_test(test_chain_through_reshape),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_embedding_padding_row),
        cmocka_unit_test(test_backward_op_has_no_rule),
        cmocka_unit_test(test_loss_must_be_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
