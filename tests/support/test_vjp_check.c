/* test_vjp_check.c — autodiff's vector-Jacobian products against central
 * finite differences, through the real compiler and the CPU backend (see
 * test_vjp_check.h). */
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
#include "test_vjp_check.h"
#include "validate.h"

/* A float operand: a parameter (it receives a gradient), except the
 * "const_" tables, which are graph inputs. */
int regc_test_vjp_param(regc_graph *g, const char *name, int ndim, const int64_t *shape)
{
    regc_role role = strncmp(name, "const_", 6) == 0 ? REGC_ROLE_INPUT : REGC_ROLE_PARAM;
    return regc_graph_add_tensor(g, name, REGC_F32, role, ndim, shape);
}

int regc_test_vjp_ids(regc_graph *g, const char *name, int ndim, const int64_t *shape)
{
    return regc_graph_add_tensor(g, name, REGC_I32, REGC_ROLE_INPUT, ndim, shape);
}

/* f = sum(dy * y) as graph ops: [1, n] x [n, 1], reshaped to a scalar. */
int regc_test_vjp_objective(regc_graph *g, int y)
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
static void check_structure(regc_test_vjp_build build, const char *what)
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

void regc_test_vjp_fill_input(const regc_tensor *t, void *data, uint64_t seed)
{
    int64_t n = regc_tensor_numel(t);
    if (t->dtype == REGC_I32) {
        int32_t *v = data;
        for (int64_t i = 0; i < n; i++)
            v[i] = (int32_t)((i * 3 + 1) % REGC_TEST_VJP_VOCAB);
        if (strcmp(t->name, "targets") == 0 && n > 1)
            v[1] = -1;                                         /* an ignored position */
        if (strcmp(t->name, "doc_start") == 0 && t->ndim == 2) /* documents of 3 in each row */
            for (int64_t i = 0; i < n; i++)
                v[i] = (int32_t)(i % t->shape[1] / 3 * 3);
    } else {
        regc_rng_fill_uniform(data, (size_t)n, seed, 0.0f, 1.0f);
    }
}

static void check_case_at(regc_test_vjp_build build, const char *what, regc_level level)
{
    regc_graph *g = regc_graph_new();
    int y = build(g);
    assert_true(y >= 0);
    regc_test_vjp_objective(g, y);
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
        regc_test_vjp_fill_input(t, inputs[i], regc_rng_substream(43, (uint64_t)i));
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

void regc_test_vjp_check(regc_test_vjp_build build, const char *what)
{
    check_structure(build, what);
    check_case_at(build, what, REGC_LEVEL_O0);
    check_case_at(build, what, REGC_LEVEL_O1);
}
