/* regc_detect.h — repeated-block detection on a flat graph.
 *
 * Given only a graph (ops, attributes, shapes, dtypes and wiring; tensor
 * names are never read), find the repeated layers: region kinds, each with a
 * node template and formal inputs and outputs, and the instances of every
 * kind with their bindings. The rest of the graph is glue: the prologue
 * before the first run of instances, the epilogue after the last, and any
 * nodes that must run between two runs (T5's encoder output norm between
 * the encoder and the decoder stacks).
 *
 * Every instance is verified exactly isomorphic to its kind's template —
 * the same ops, attributes, shapes, dtypes and wiring, its external inputs
 * bound one to one — before it is accepted. A would-be instance whose wiring
 * matches but whose shapes or attributes do not (one layer of another width)
 * is reported as a near miss and left in the glue, never merged. */
#ifndef REGC_DETECT_H
#define REGC_DETECT_H

#include <stdint.h>

#include "regc_graph.h"

typedef enum {
    /* the output of the previous instance (the hidden state); instance 0
     * binds a tensor from before the run */
    REGC_FORMAL_CARRIED,
    /* one tensor for every instance: a mask, the rotary tables, T5's
     * position bias, the encoder output */
    REGC_FORMAL_SHARED,
    /* a different tensor per instance: the layer's parameters */
    REGC_FORMAL_PER_INSTANCE,
} regc_formal_class;

/* A formal input: read by template node `node` at input `port` (its first
 * use; the template may read it again). */
typedef struct {
    regc_formal_class cls;
    int node, port;
} regc_formal_input;

/* A formal output: output `slot` of template node `node`, read outside its
 * instance in at least one instance (by the next instance or the glue). */
typedef struct {
    int node, slot;
} regc_formal_output;

typedef struct {
    int n_nodes; /* template size */
    int n_inputs, n_outputs;
    const regc_formal_input *inputs;   /* [n_inputs] */
    const regc_formal_output *outputs; /* [n_outputs] */
    int n_instances;                   /* over all runs, in execution order */
    /* nodes[i * n_nodes + j]: graph node of template node j in instance i;
     * instance 0 is the template itself. Template order is a topological
     * order of the instance. */
    const int *nodes;
    const int *in_bind;          /* [n_instances * n_inputs] graph tensor ids */
    const int *out_bind;         /* [n_instances * n_outputs] graph tensor ids */
    int64_t params_per_instance; /* elements of the per-instance parameters */
} regc_region_kind;

/* The step as detected: glue and runs of consecutive instances, in an
 * order in which they can execute. */
typedef enum { REGC_SEGMENT_GLUE, REGC_SEGMENT_RUN } regc_segment_type;

typedef struct {
    regc_segment_type type;
    /* GLUE: n_nodes graph nodes in a valid execution order */
    int n_nodes;
    const int *nodes;
    /* RUN: instances first .. first + count - 1 of region kind `kind` */
    int kind, first, count;
} regc_segment;

/* An almost-instance: the wiring of region kind `kind` matched, but graph
 * node `node` (template node `template_node`) differs as `reason` says. */
typedef struct {
    int kind, template_node, node;
    char reason[320];
} regc_near_miss;

typedef struct regc_blocks regc_blocks;

/* Detect the block structure of g. A graph without repetition gives zero
 * region kinds (not an error). Fails only when out of memory. */
int regc_detect_blocks(const regc_graph *g, regc_blocks **out);
void regc_blocks_free(regc_blocks *b);

int regc_blocks_n_kinds(const regc_blocks *b);
const regc_region_kind *regc_blocks_kind(const regc_blocks *b, int k);
int regc_blocks_n_segments(const regc_blocks *b);
const regc_segment *regc_blocks_segment(const regc_blocks *b, int i);
int regc_blocks_n_near_misses(const regc_blocks *b);
const regc_near_miss *regc_blocks_near_miss(const regc_blocks *b, int i);
/* Fraction of the graph's nodes that lie inside instances. */
double regc_blocks_coverage(const regc_blocks *b);

#endif
