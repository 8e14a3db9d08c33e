/* graph_internal.h — private to graph/: what graph.c (tensors, nodes,
 * storage) shares with graph_shapes.c (each op's shape rule). */
#ifndef REGC_GRAPH_INTERNAL_H
#define REGC_GRAPH_INTERNAL_H

#include <stddef.h>

#include "regc_common.h"
#include "regc_graph.h"

/* The shape and dtype of one output, filled in by the shape rules. */
typedef struct {
    regc_dtype dtype;
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
} out_spec;

/* The inputs and outputs op takes (-1: one to REGC_MAX_IO). */
void regc_op_arity(regc_op op, int *n_in, int *n_out);

/* Check op's inputs and fill its outputs' shapes and dtypes (out_ndim and
 * out_shape: the shape RESHAPE, FILL, EXPAND, SLICE and SUM_ROWS are given);
 * an error names the op and the tensor. */
int regc_graph_infer_outputs(regc_op op, const regc_attrs *a, int n_in, const regc_tensor *const *x,
                             int n_out, out_spec *o, int out_ndim, const int64_t *out_shape);

/* "[2, 3, 4]" into buf, for messages */
const char *regc_shape_str(const regc_tensor *t, char *buf, size_t cap);

#endif
