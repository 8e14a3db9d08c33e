/* detect_internal.h — what the files of detect/ share: the analysed graph
 * (labels, depths, consumers, the canonical node order) and instance
 * matching. */
#ifndef REGC_DETECT_INTERNAL_H
#define REGC_DETECT_INTERNAL_H

#include <stdint.h>

#include "regc_common.h"
#include "regc_detect.h"

typedef struct {
    const regc_graph *g;
    int n_nodes, n_tensors;
    uint64_t *label; /* [n_nodes] hash of op, attributes, input and output types */
    int *depth;      /* [n_nodes] longest path from a graph input or parameter */
    int *seq;        /* [n_nodes] the canonical order (detect_order.c) */
    int *pos;        /* [n_nodes] position of each node in seq */
    int *out_slot;   /* [n_tensors] which output of its producer a tensor is; -1 for leaves */
    int *cons_start; /* [n_tensors + 1] consumers of tensor t: cons_start[t] .. [t+1] - 1 */
    int *cons_node;  /* [n_uses] consuming node */
    int *cons_port;  /* [n_uses] input port it reads the tensor at */
    int *owner;      /* [n_nodes] instance that holds the node, -1 while in the glue */
    /* scratch of the matcher, all -1 between calls */
    int *tslot;     /* [n_nodes] template index of a template node */
    int *cslot;     /* [n_nodes] template index a candidate node is matched to */
    int *formal_of; /* [n_tensors] formal index of a template's external input */
    int *bound_to;  /* [n_tensors] formal a candidate tensor is bound to */
    int *queue;     /* [n_nodes] work list of detect_guide */
} detect_ctx;

/* Analyse g: labels, depths, consumers and the canonical order. */
int detect_ctx_init(detect_ctx *c, const regc_graph *g);
void detect_ctx_free(detect_ctx *c);

/* Why a candidate is not an instance of a template. */
typedef struct {
    int node;       /* template index where matching failed, -1 if none */
    int types_only; /* 1: wiring agrees, a shape, dtype or attribute does not */
    char reason[320];
} detect_mismatch;

/* The formal inputs of a template (p nodes in template order): external
 * input tensors numbered by first use in (node, port) order. Writes at most
 * p * REGC_MAX_IO entries; returns how many. */
int detect_template_formals(detect_ctx *c, const int *tmpl, int p, regc_formal_input *formals);

/* Is cand (p nodes) an exact image of tmpl: node j of cand matches node j of
 * tmpl in op, attributes, input and output types, internal wiring, and its
 * external inputs are bound one to one to the template's formals? On
 * success bind[f] is the tensor cand binds to formal f and 1 is returned;
 * on failure 0, with *why filled. Neither list may hold a node twice. */
int detect_match(detect_ctx *c, const int *tmpl, const int *cand, int p, int *bind,
                 detect_mismatch *why);

/* Map tmpl onto the graph starting from tmpl[j0] <-> node v0, following
 * wiring and ops only (shapes are left to detect_match): producers through
 * inputs, and consumers where one candidate is unique. Nodes already owned
 * by an instance are not taken. Fills cand[p]; returns 1 when every
 * template node found a distinct image, else 0. */
int detect_guide(detect_ctx *c, const int *tmpl, int p, int j0, int v0, int *cand);

/* ---------------------------------------------------------------- runs
 * (detect_runs.c) */

/* Consecutive instances of one template: instance t is nodes[t*p .. t*p+p-1]
 * (template order), binding formal f to bind[t*nf + f]. */
typedef struct {
    int p, nf, n, cap;
    int *nodes, *bind;
    int *carried_j, *carried_s; /* [nf]: output (node, slot) of the previous instance, or -1 */
    int kind, rank;
} run_t;

typedef struct {
    detect_ctx c;
    int *width;                 /* [n+1] tensors crossing the cut before canonical position i */
    int *where;                 /* [n] scratch for mark_instance */
    char *in_run;               /* [n] scratch: node in the run being built */
    char *is_output;            /* [n_tensors] graph outputs */
    int *bind;                  /* [n * REGC_MAX_IO + 1] scratch binding */
    int *cand;                  /* [n] scratch candidate */
    regc_formal_input *formals; /* [n * REGC_MAX_IO + 1] scratch */
    run_t *runs;
    int n_runs, cap_runs;
    regc_near_miss *near;
    int n_near, cap_near;
} detector;

/* Analyse g and set up the scratch of a detector; free with
 * detect_detector_free (also after a failed init). */
int detect_detector_init(detector *d, const regc_graph *g);
void detect_detector_free(detector *d);
/* Find runs until no period gives one: d->runs, each node owned by at most
 * one instance (d->c.owner), and near misses in d->near. */
int detect_find_runs(detector *d);
/* Give run id back to the glue. */
void detect_drop_run(detector *d, int id);
/* Give every run a kind (the first earlier run whose template matches, else
 * a new one); returns the number of kinds. */
int detect_assign_kinds(detector *d);

#endif
