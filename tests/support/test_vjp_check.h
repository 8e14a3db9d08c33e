/* test_vjp_check.h — a backward rule against central finite differences.
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
#ifndef REGC_TEST_VJP_CHECK_H
#define REGC_TEST_VJP_CHECK_H

#include <stdint.h>

#include "regc_graph.h"

#define REGC_TEST_VJP_VOCAB 5 /* every int input holds ids < REGC_TEST_VJP_VOCAB */

/* A case: builds its op(s) on g and returns y, the tensor to check. */
typedef int (*regc_test_vjp_build)(regc_graph *g);

/* Operands: a float parameter (a "const_" name makes it a graph input),
 * and an int32 input of ids. Each returns the tensor's id. */
int regc_test_vjp_param(regc_graph *g, const char *name, int ndim, const int64_t *shape);
int regc_test_vjp_ids(regc_graph *g, const char *name, int ndim, const int64_t *shape);

/* f = sum(dy * y) on g for an input dy shaped as y, marked as g's output. */
int regc_test_vjp_objective(regc_graph *g, int y);

/* An input's values as every case draws them: ids (i * 3 + 1) % VOCAB, a
 * "targets" input with one ignored position, a "doc_start" [B, T] of
 * documents three long in each row, floats uniform in [0, 1). */
void regc_test_vjp_fill_input(const regc_tensor *t, void *data, uint64_t seed);

/* The whole check of one case, named `what` in failures: the gradients'
 * structure, then the values at O0 and at O1. */
void regc_test_vjp_check(regc_test_vjp_build build, const char *what);

/* test_<name>, a CMocka test of the builder b_<name>. */
#define REGC_TEST_VJP_CASE(name)                                                                   \
    static void test_##name(void **state)                                                          \
    {                                                                                              \
        (void)state;                                                                               \
        regc_test_vjp_check(b_##name, #name);                                                      \
    }

#endif
