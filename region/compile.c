/* compile.c — the compile pipeline's driver: build the graph, detect the
 * layers, compile one region per layer kind (and one per piece of glue) or
 * the whole graph as one region, then link the step program. */
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"

/* ---------------------------------------------------------------- the pipeline */

/* Which tensors depend on a float input or a parameter that is not frozen:
 * the same rule as autodiff's, over the whole graph, so every region agrees
 * on it. A frozen parameter so takes no gradient, and nothing computes one
 * for what depends on frozen parameters alone. */
static char *flat_needs(const regc_graph *g)
{
    int n_t = regc_graph_n_tensors(g);
    char *needs = calloc((size_t)n_t + 1, 1), *leaf = malloc((size_t)n_t + 1);
    if (needs && leaf) {
        for (int t = 0; t < n_t; t++)
            leaf[t] = !regc_graph_tensor(g, t)->frozen;
        regc_autodiff_needs(g, n_t, regc_graph_n_nodes(g), leaf, needs);
    }
    free(leaf);
    if (!leaf) {
        free(needs);
        return NULL;
    }
    return needs;
}

/* A tensor that receives a gradient: a differentiable output that depends
 * on something trainable (not a saved statistic such as a norm's rstd). */
static int has_grad(const regc_graph *g, const char *needs, int t)
{
    const regc_tensor *x = regc_graph_tensor(g, t);
    if (!needs[t] || x->producer < 0)
        return needs[t];
    const regc_node *n = regc_graph_node(g, x->producer);
    return n->op == REGC_OP_SPLIT || n->out[0] == t;
}

/* ZeRO-3 under bf16 gathers in bf16 the parameters that only matrix
 * products read: their GEMMs round them to bf16 anyway (forward and the
 * input gradient's backward), so the gathered copy holds exactly those
 * values in half the bytes, and the step's bits stay those of stage 0.
 * NULL where nothing is (another precision or stage, or fp32 storage). */
static int bf16_params_wanted(const regc_compile_options *o)
{
    return o->precision == REGC_PRECISION_BF16 && !o->fp32_storage && o->zero_stage == 3;
}

/* How frozen parameter t is held, where not in fp32 (regc_held; 0: fp32
 * or not frozen): a LoRA model's base in bf16, a QLoRA model's in NF4. */
static int frozen_held(const regc_graph *g, int t)
{
    switch (regc_graph_tensor(g, t)->frozen) {
    case REGC_FROZEN_BF16: return REGC_HELD_BF16;
    case REGC_FROZEN_NF4: return REGC_HELD_NF4;
    case REGC_FROZEN_NF4_BF16: return REGC_HELD_NF4_BF16;
    default: return 0;
    }
}

/* Does the graph hold any frozen parameter in bf16 or NF4? */
static int holds_frozen(const regc_graph *g)
{
    for (int t = 0; t < regc_graph_n_tensors(g); t++)
        if (frozen_held(g, t))
            return 1;
    return 0;
}

/* [n_tensors]: how each parameter is held (regc_held), or NULL (every one
 * in fp32; or out of memory when bf16_params_wanted or holds_frozen):
 * those gathered in bf16 (above), and the frozen ones held in bf16 or NF4,
 * whose every reader must be a matrix product, or for a bf16 table an
 * embedding lookup (the compile fails
 * otherwise). */
static char *held_params(const regc_graph *g, const regc_compile_options *o)
{
    if (!bf16_params_wanted(o) && !holds_frozen(g))
        return NULL;
    int n_t = regc_graph_n_tensors(g);
    char *only_matmul = calloc((size_t)n_t + 1, 1);
    if (!only_matmul)
        return NULL;
    for (int t = 0; t < n_t; t++)
        only_matmul[t] = frozen_held(g, t)
                             ? (char)frozen_held(g, t)
                             : (char)(bf16_params_wanted(o) &&
                                      regc_graph_tensor(g, t)->role == REGC_ROLE_PARAM &&
                                      !regc_graph_tensor(g, t)->frozen);
    /* a frozen table held in bf16 may also be looked up: its rows are
     * bf16 values, copied exactly */
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int k = 0; k < n->n_in; k++)
            if (n->op != REGC_OP_MATMUL && !(n->op == REGC_OP_EMBEDDING && k == 1 &&
                                             frozen_held(g, n->in[k]) == REGC_HELD_BF16))
                only_matmul[n->in[k]] = 0;
    }
    return only_matmul;
}

/* One piece as the pipeline sees it before compiling. */
typedef struct {
    int region; /* index into the step's regions */
    int n_in, n_out;
    int *in, *out; /* bound graph tensors */
} piece_plan;

typedef struct {
    const regc_graph *g;
    const regc_compile_options *o;
    regc_compile_stats *st;
    const char *needs;
    int n_pieces, cap;
    piece_plan *pieces;
    int *last_reader; /* [n_tensors] the last piece reading each tensor, -1 */
    char *held_param; /* [n_tensors] a parameter gathered in bf16, or NULL: none are */
    char *keep;       /* [n_tensors] never recomputed (a whole graph's layer boundaries), or NULL */
    int *mark;        /* [n_tensors] scratch, all -1 between uses */
    char *in_glue;    /* [n_nodes] scratch */
} pipeline;

static int add_piece_plan(pipeline *pl, int region, int n_in, const int *in, int n_out,
                          const int *out)
{
    if (pl->n_pieces == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 32;
        piece_plan *x = realloc(pl->pieces, (size_t)cap * sizeof *x);
        if (!x)
            return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
        pl->pieces = x, pl->cap = cap;
    }
    piece_plan *pp = &pl->pieces[pl->n_pieces];
    *pp = (piece_plan){.region = region, .n_in = n_in, .n_out = n_out};
    pp->in = malloc(((size_t)n_in + 1) * sizeof(int));
    pp->out = malloc(((size_t)n_out + 1) * sizeof(int));
    if (!pp->in || !pp->out) {
        free(pp->in), free(pp->out);
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    }
    memcpy(pp->in, in, (size_t)n_in * sizeof(int));
    memcpy(pp->out, out, (size_t)n_out * sizeof(int));
    for (int k = 0; k < n_in; k++)
        pl->last_reader[in[k]] = pl->n_pieces;
    pl->n_pieces++;
    return REGC_OK;
}

/* A region's formal input is gathered in bf16 only if every instance's
 * parameter there is: where instances disagree (a weight that one layer
 * shares with something else that reads it in fp32), none of them is, and
 * a parameter so cleared is cleared for every region that reads it; until
 * nothing changes. Then every slot a gathered unit is bound to agrees. A
 * frozen parameter held in bf16 cannot be so cleared: its bytes are bf16,
 * and whatever would read them in fp32 fails the compile, named. */
static int settle_bf16_params(pipeline *pl)
{
    if (!pl->held_param)
        return REGC_OK;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < pl->n_pieces; i++) {
            const piece_plan *a = &pl->pieces[i];
            for (int k = 0; k < a->n_in; k++) {
                int all = 1;
                for (int j = 0; j < pl->n_pieces && all; j++)
                    if (pl->pieces[j].region == a->region)
                        all = pl->held_param[pl->pieces[j].in[k]];
                for (int j = 0; j < pl->n_pieces && !all; j++)
                    if (pl->pieces[j].region == a->region && pl->held_param[pl->pieces[j].in[k]])
                        pl->held_param[pl->pieces[j].in[k]] = 0, changed = 1;
            }
        }
    }
    for (int t = 0; t < regc_graph_n_tensors(pl->g); t++)
        if (frozen_held(pl->g, t) && !pl->held_param[t])
            return regc_error(REGC_ERR_UNSUPPORTED,
                              "compile: frozen parameter %s is held in %s, but something other "
                              "than a matrix product (or a lookup, in bf16) reads it",
                              regc_graph_tensor(pl->g, t)->name,
                              frozen_held(pl->g, t) == REGC_HELD_BF16 ? "bf16" : "NF4");
    return REGC_OK;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Glue (or the whole graph): its formals are the tensors it reads from
 * outside, its outputs those read outside or marked as graph outputs.
 * nodes is sorted into graph order. */
static int plan_glue(pipeline *pl, int region, int *nodes, int n)
{
    const regc_graph *g = pl->g;
    qsort(nodes, (size_t)n, sizeof *nodes, cmp_int);
    int n_t = regc_graph_n_tensors(g);
    int *in = malloc(((size_t)n_t + 1) * sizeof *in),
        *out = malloc(((size_t)n_t + 1) * sizeof *out);
    if (!in || !out) {
        free(in), free(out);
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    }
    int n_in = 0, n_out = 0;
    for (int i = 0; i < n; i++)
        pl->in_glue[nodes[i]] = 1;
    for (int i = 0; i < n; i++) {
        const regc_node *x = regc_graph_node(g, nodes[i]);
        for (int k = 0; k < x->n_in; k++) {
            int t = x->in[k], p = regc_graph_tensor(g, t)->producer;
            if ((p < 0 || !pl->in_glue[p]) && pl->mark[t] < 0)
                pl->mark[t] = 1, in[n_in++] = t;
        }
    }
    for (int k = 0; k < n_in; k++)
        pl->mark[in[k]] = -1;
    /* outputs, in tensor order */
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        if (pl->in_glue[i])
            continue;
        const regc_node *x = regc_graph_node(g, i);
        for (int k = 0; k < x->n_in; k++) {
            int p = regc_graph_tensor(g, x->in[k])->producer;
            if (p >= 0 && pl->in_glue[p] && pl->mark[x->in[k]] < 0)
                pl->mark[x->in[k]] = 1, out[n_out++] = x->in[k];
        }
    }
    for (int i = 0; i < regc_graph_n_outputs(g); i++) {
        int t = regc_graph_output(g, i), p = regc_graph_tensor(g, t)->producer;
        if (p >= 0 && pl->in_glue[p] && pl->mark[t] < 0)
            pl->mark[t] = 1, out[n_out++] = t;
    }
    for (int k = 0; k < n_out; k++)
        pl->mark[out[k]] = -1;
    qsort(out, (size_t)n_out, sizeof *out, cmp_int);
    for (int i = 0; i < n; i++)
        pl->in_glue[nodes[i]] = 0;
    int rc = add_piece_plan(pl, region, n_in, in, n_out, out);
    free(in), free(out);
    return rc;
}

/* ---------------------------------------------------------------- regions */

/* Compile region `region` from the pieces that instantiate it; the first
 * one gives the nodes. */
static int compile_region(pipeline *pl, regc_program *prog, int region, const int *nodes,
                          int n_nodes, const char *name, regc_level level, int layer, int *compiles)
{
    const piece_plan *first = NULL;
    int n_in = 0, n_out = 0;
    for (int i = 0; i < pl->n_pieces && !first; i++)
        if (pl->pieces[i].region == region)
            first = &pl->pieces[i];
    n_in = first->n_in, n_out = first->n_out;
    char *in_needs = calloc((size_t)n_in + 1, 1), *seeded = calloc((size_t)n_in + 1, 1);
    char *out_grad = calloc((size_t)n_out + 1, 1), *in_held = calloc((size_t)n_in + 1, 1);
    int rc = REGC_OK;
    if (!in_needs || !seeded || !out_grad || !in_held) {
        rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
        goto done;
    }
    /* the same in every instance (settle_bf16_params) */
    for (int k = 0; k < n_in && pl->held_param; k++)
        in_held[k] = pl->held_param[first->in[k]];
    for (int i = 0; i < pl->n_pieces; i++) {
        const piece_plan *pp = &pl->pieces[i];
        if (pp->region != region)
            continue;
        for (int k = 0; k < n_in; k++) {
            in_needs[k] |= pl->needs[pp->in[k]];
            seeded[k] |= pl->last_reader[pp->in[k]] > i;
            /* accumulating, every parameter's gradient adds to what the
             * block already holds: the block is its seed */
            seeded[k] |= pl->o->accumulate_grads &&
                         regc_graph_tensor(pl->g, pp->in[k])->role == REGC_ROLE_PARAM;
        }
        for (int k = 0; k < n_out; k++)
            out_grad[k] |= has_grad(pl->g, pl->needs, pp->out[k]);
    }
    /* auto without a budget (or a ratio chosen) has nothing to fit:
     * nothing is recomputed */
    const regc_compile_options *o = pl->o;
    regc_recompute_policy pol = {.mode = o->recompute, .layer = layer, .ratio = o->recompute_ratio};
    if (pol.mode == REGC_RECOMPUTE_AUTO && o->budget_bytes <= 0 && o->recompute_ratio < 0)
        pol.mode = REGC_RECOMPUTE_NONE;
    if (pol.mode == REGC_RECOMPUTE_AUTO && o->kernel_cost) { /* a measured profile */
        pol.costs = o->kernel_cost, pol.n_costs = o->n_kernel_cost;
        pol.rate = regc_kernel_cost_rate(o->kernel_cost, o->n_kernel_cost);
    }
    regc_region_spec spec = {.n_nodes = n_nodes,
                             .nodes = nodes,
                             .n_in = n_in,
                             .n_out = n_out,
                             .in = first->in,
                             .out = first->out,
                             .in_needs_grad = in_needs,
                             .in_seeded = seeded,
                             .out_has_grad = out_grad,
                             .in_held = in_held,
                             .name = name,
                             .recompute = pol.mode != REGC_RECOMPUTE_NONE ? &pol : NULL,
                             .keep = pl->keep,
                             .logits_chunk_rows = o->logits_chunk_rows};
    regc_compiled_region *r;
    if ((rc = regc_compile_cached_region(pl->g, &spec, level, pl->o, pl->st, compiles, &r)))
        goto done;
    if ((rc = regc_program_add_region(prog, r)) >= 0)
        rc = REGC_OK;
done:
    free(in_needs), free(seeded), free(out_grad), free(in_held);
    return rc;
}

/* Regional: glue segments and one region per kind, compiled once each. */
static int compile_regional(pipeline *pl, regc_program *prog, const regc_blocks *b,
                            regc_level level, regc_compile_stats *st)
{
    int n_kinds = regc_blocks_n_kinds(b), n_seg = regc_blocks_n_segments(b), rc = REGC_OK;
    /* regions: kinds first, then one per glue segment */
    int n_glue = 0;
    int **glue_nodes = calloc((size_t)n_seg + 1, sizeof *glue_nodes);
    int *sorted = NULL;
    if (!glue_nodes)
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    for (int s = 0; s < n_seg && rc == REGC_OK; s++) {
        const regc_segment *seg = regc_blocks_segment(b, s);
        if (seg->type == REGC_SEGMENT_GLUE) {
            if (seg->n_nodes == 0)
                continue;
            if (!(glue_nodes[s] = malloc((size_t)seg->n_nodes * sizeof(int)))) {
                rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
                break;
            }
            memcpy(glue_nodes[s], seg->nodes, (size_t)seg->n_nodes * sizeof(int));
            rc = plan_glue(pl, n_kinds + n_glue++, glue_nodes[s], seg->n_nodes);
            continue;
        }
        const regc_region_kind *k = regc_blocks_kind(b, seg->kind);
        for (int i = seg->first; i < seg->first + seg->count && rc == REGC_OK; i++)
            rc = add_piece_plan(pl, seg->kind, k->n_inputs, k->in_bind + (size_t)i * k->n_inputs,
                                k->n_outputs, k->out_bind + (size_t)i * k->n_outputs);
    }
    if (rc == REGC_OK)
        rc = settle_bf16_params(pl);
    for (int k = 0; k < n_kinds && rc == REGC_OK; k++) {
        const regc_region_kind *kind = regc_blocks_kind(b, k);
        if (!(sorted = malloc(((size_t)kind->n_nodes + 1) * sizeof *sorted))) {
            rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
            break;
        }
        memcpy(sorted, kind->nodes, (size_t)kind->n_nodes * sizeof *sorted);
        qsort(sorted, (size_t)kind->n_nodes, sizeof *sorted, cmp_int);
        char name[64];
        snprintf(name, sizeof name, "layer kind %d", k);
        rc = compile_region(pl, prog, k, sorted, kind->n_nodes, name, level, 1,
                            &st->region_compiles);
        free(sorted);
        sorted = NULL;
    }
    for (int s = 0, gi = 0; s < n_seg && rc == REGC_OK; s++) {
        const regc_segment *seg = regc_blocks_segment(b, s);
        if (!glue_nodes[s])
            continue;
        char name[64];
        snprintf(name, sizeof name, "glue %d", gi);
        rc = compile_region(pl, prog, n_kinds + gi++, glue_nodes[s], seg->n_nodes, name, level, 0,
                            &st->glue_compiles);
    }
    for (int s = 0; s < n_seg; s++)
        free(glue_nodes[s]);
    free(glue_nodes);
    st->region_kinds = n_kinds;
    for (int k = 0; k < n_kinds; k++)
        st->instances += regc_blocks_kind(b, k)->n_instances;
    return rc;
}

static int compile_full(pipeline *pl, regc_program *prog, regc_level level, regc_compile_stats *st)
{
    int n = regc_graph_n_nodes(pl->g);
    int *nodes = malloc(((size_t)n + 1) * sizeof *nodes);
    if (!nodes)
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    for (int i = 0; i < n; i++)
        nodes[i] = i;
    int rc = plan_glue(pl, 0, nodes, n);
    if (rc == REGC_OK)
        rc = settle_bf16_params(pl);
    if (rc == REGC_OK)
        rc = compile_region(pl, prog, 0, nodes, n, "whole step", level, 1, &st->region_compiles);
    free(nodes);
    return rc;
}

/* The compute (FLOPs) that hides a byte's copy on the target's copy queue:
 * 0 where copies are done where they start (the CPU). */
static double regc_copy_flop_per_byte(const char *device)
{
    /* a GPU's bf16 rate over its host link's bandwidth is of this order
     * (about 800 TFLOP/s over 50 GB/s is 16000; half that allows for the
     * rate reached); the CPU copies where a copy starts */
    return device && strncmp(device, "cuda", 4) == 0 ? 8192.0 : 0.0;
}

/* Does the compile recompute anything? */
static int recomputes(const regc_compile_options *o)
{
    return o->recompute == REGC_RECOMPUTE_SELECTIVE || o->recompute == REGC_RECOMPUTE_FULL ||
           (o->recompute == REGC_RECOMPUTE_AUTO &&
            (o->budget_bytes > 0 || o->recompute_ratio >= 0));
}

/* What a whole-graph region recomputes of its tensors (recompute.c's
 * keep): the layers' boundaries (every instance's formal inputs and
 * outputs: the residual stream between layers) never, as a layer region
 * keeps its inputs (recomputing one would replay every layer before it);
 * what the glue makes (embedding, final norm, head, loss) as a glue region
 * would, selectively. */
static char *layer_boundaries(const regc_graph *g, const regc_blocks *b)
{
    const int n_nodes = regc_graph_n_nodes(g);
    char *keep = calloc((size_t)regc_graph_n_tensors(g) + 1, 1);
    char *in_layer = calloc((size_t)n_nodes + 1, 1);
    for (int k = 0; keep && in_layer && k < regc_blocks_n_kinds(b); k++) {
        const regc_region_kind *kind = regc_blocks_kind(b, k);
        for (int i = 0; i < kind->n_instances * kind->n_nodes; i++)
            in_layer[kind->nodes[i]] = 1;
    }
    for (int i = 0; keep && in_layer && i < n_nodes; i++) {
        const regc_node *x = regc_graph_node(g, i);
        for (int k = 0; !in_layer[i] && k < x->n_out; k++)
            keep[x->out[k]] = REGC_KEEP_GLUE;
    }
    for (int k = 0; keep && in_layer && k < regc_blocks_n_kinds(b); k++) {
        const regc_region_kind *kind = regc_blocks_kind(b, k);
        for (int i = 0; i < kind->n_instances * kind->n_inputs; i++)
            keep[kind->in_bind[i]] = REGC_KEEP_ALWAYS;
        for (int i = 0; i < kind->n_instances * kind->n_outputs; i++)
            keep[kind->out_bind[i]] = REGC_KEEP_ALWAYS;
    }
    if (!in_layer)
        free(keep), keep = NULL;
    free(in_layer);
    return keep;
}

static void pipeline_free(pipeline *pl)
{
    for (int i = 0; i < pl->n_pieces; i++)
        free(pl->pieces[i].in), free(pl->pieces[i].out);
    free(pl->pieces), free(pl->last_reader), free(pl->mark), free(pl->in_glue),
        free(pl->held_param), free(pl->keep);
    free((void *)pl->needs);
}

static int dump_all(const regc_program *p, const char *dir);

/* (declared in region_internal.h) */
int regc_compile_graph_taken(regc_graph *g, const int64_t *param_offset,
                             const regc_compile_options *o, regc_program **out,
                             regc_compile_stats *st)
{
    if (regc_graph_n_outputs(g) < 1) {
        regc_graph_free(g);
        return regc_error(REGC_ERR_ARG, "model graph has no loss output");
    }
    regc_program *prog = regc_program_new(g, o->level);
    if (!prog) {
        regc_graph_free(g);
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    }
    prog->forward_only = o->forward_only != 0;
    prog->accumulate_grads = o->accumulate_grads != 0 && !o->forward_only;
    prog->ranks = o->ranks > 1 ? o->ranks : 1;
    prog->zero_stage = o->zero_stage;
    prog->prefetch_floats = o->prefetch_floats;
    prog->offload = o->offload_optimizer && !o->forward_only;
    prog->offload_activation = o->offload_activation && !o->forward_only;
    prog->copy_flop_per_byte = regc_copy_flop_per_byte(o->device);
    prog->offload_limit = o->offload_limit;
    prog->host_budget_bytes = o->host_budget_bytes;
    int n_t = regc_graph_n_tensors(g), rc = REGC_OK;
    pipeline pl = {.g = g, .o = o, .st = st};
    pl.last_reader = malloc(((size_t)n_t + 1) * sizeof(int));
    pl.mark = malloc(((size_t)n_t + 1) * sizeof(int));
    pl.in_glue = calloc((size_t)regc_graph_n_nodes(g) + 1, 1);
    pl.needs = flat_needs(g);
    pl.held_param = held_params(g, o);
    regc_blocks *blocks = NULL;
    if (!pl.last_reader || !pl.mark || !pl.in_glue || !pl.needs ||
        (!pl.held_param && (bf16_params_wanted(o) || holds_frozen(g)))) {
        rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
        goto done;
    }
    for (int t = 0; t < n_t; t++)
        pl.last_reader[t] = -1, pl.mark[t] = -1;
    if (o->regional) {
        double d0 = regc_time_ms();
        if ((rc = regc_detect_blocks(g, &blocks)))
            goto done;
        double d1 = regc_time_ms();
        st->detect_ms = d1 - d0;
        rc = compile_regional(&pl, prog, blocks, o->level, st);
        st->compile_ms = regc_time_ms() - d1;
    } else {
        double c0 = regc_time_ms();
        if (recomputes(o)) { /* the layers, only to know where they meet */
            if ((rc = regc_detect_blocks(g, &blocks)))
                goto done;
            if (!(pl.keep = layer_boundaries(g, blocks))) {
                rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
                goto done;
            }
        }
        rc = compile_full(&pl, prog, o->level, st);
        st->compile_ms = regc_time_ms() - c0;
    }
    for (int i = 0; i < pl.n_pieces && rc == REGC_OK; i++)
        rc = regc_program_add_piece(prog, pl.pieces[i].region, pl.pieces[i].in, pl.pieces[i].out);
    if (rc == REGC_OK && prog->zero_stage == 3)
        rc = regc_zero3_layout(prog, param_offset, pl.held_param);
    if (rc)
        goto done;
    double l0 = regc_time_ms();
    int inline_flat = o->inline_back && o->level != REGC_LEVEL_O0;
    if ((rc = regc_passes_run(prog, param_offset, inline_flat, o, st)))
        goto done;
    st->inline_ms = regc_time_ms() - l0;
    if (o->dump_dir && (rc = dump_all(prog, o->dump_dir)))
        goto done;
    *out = prog;
    prog = NULL;
done:
    regc_program_free(prog);
    regc_blocks_free(blocks);
    pipeline_free(&pl);
    return rc;
}

/* What a step is compiled from: a model at a batch and sequence (its graph
 * built after a cache miss), or a graph given whole. */
typedef struct {
    const regc_model *m;
    int64_t batch, seq;
    regc_graph *g; /* taken: owned until regc_compile_graph_taken takes it */
} step_source;

/* The step's key after its options: what the graph is built from. */
static int source_key(const step_source *s, regc_bytes *b)
{
    if (!s->m)
        return regc_graph_canon(s->g, b);
    regc_bytes_put_i64(b, s->batch);
    regc_bytes_put_i64(b, s->seq);
    return regc_model_write_structure(s->m, b);
}

/* The flat graph (s->g is taken) and where each parameter tensor lies in
 * the blocks: a model's order, or a bare graph's tensor order; a frozen
 * parameter in the frozen block, which follows the trainable ones. */
static int source_graph(step_source *s, regc_graph **g, int64_t **param_offset,
                        regc_compile_stats *st)
{
    double t0 = regc_time_ms();
    int rc = REGC_OK;
    if (s->m)
        rc = regc_model_build_graph(s->m, s->batch, s->seq, &s->g);
    st->build_ms = regc_time_ms() - t0;
    if (rc)
        return rc;
    *g = s->g;
    s->g = NULL;
    int n_t = regc_graph_n_tensors(*g);
    int64_t *off = *param_offset = calloc((size_t)n_t + 1, sizeof *off);
    if (!off)
        return regc_error(REGC_ERR_MEMORY, "compile: out of memory");
    if (!s->m) { /* each parameter after the previous one, in its block (as a model's) */
        int64_t at = 0, frozen_at = 0;
        for (int t = 0; t < n_t; t++) {
            const regc_tensor *x = regc_graph_tensor(*g, t);
            if (x->role == REGC_ROLE_PARAM && !x->frozen)
                off[t] = at, at += regc_tensor_bytes(x);
            if (x->role == REGC_ROLE_PARAM && x->frozen) {
                off[t] = frozen_at;
                frozen_at += (regc_frozen_bytes(x) + 63) & ~INT64_C(63);
            }
        }
        return REGC_OK;
    }
    for (int i = 0; i < regc_model_n_params(s->m); i++) {
        int t = regc_graph_find_tensor(*g, regc_model_param_name(s->m, i));
        if (t < 0)
            return regc_error(REGC_ERR_ARG, "model graph has no parameter %s",
                              regc_model_param_name(s->m, i));
        if (regc_graph_tensor(*g, t)->frozen != regc_model_param_frozen(s->m, i))
            return regc_error(REGC_ERR_ARG, "model graph: parameter %s is %s in the model",
                              regc_model_param_name(s->m, i),
                              regc_model_param_frozen(s->m, i) ? "frozen" : "trained");
        off[t] = regc_model_param_frozen(s->m, i)
                     ? regc_model_param_frozen_at(s->m, i)
                     : regc_model_param_offset(s->m, i) * (int64_t)sizeof(float);
    }
    return REGC_OK;
}

/* compile.host_memory_mb against what the step holds on the host: the
 * offloaded optimizer state and activations. */
static int check_host(const regc_compile_options *o, const regc_program *p)
{
    if (o->host_budget_bytes <= 0)
        return REGC_OK;
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    if (a.host <= o->host_budget_bytes)
        return REGC_OK;
    const double mib = 1 << 20;
    return regc_error(REGC_ERR_BUDGET,
                      "compile.host_memory_mb: the step holds %.1f MiB per rank on the host "
                      "(offloaded: %.1f MiB of optimizer state, %.1f MiB of activations); the "
                      "limit is %.1f MiB",
                      (double)a.host / mib, (double)(a.host - a.host_activations) / mib,
                      (double)a.host_activations / mib, (double)o->host_budget_bytes / mib);
}

/* The whole step: from the cache when its key is there, else compiled
 * (and stored). */
static int compile_step(step_source *s, const regc_compile_options *o, regc_program **out,
                        regc_compile_stats *st)
{
    *out = NULL;
    regc_compile_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    st->fit_least = -1;
    regc_bytes canon = {0};
    regc_graph *g = NULL;
    int64_t *param_offset = NULL;
    int rc = REGC_OK, cached = regc_compile_uses_cache(o);
    if (cached) {
        double c0 = regc_time_ms();
        regc_compile_step_key(o, &canon);
        if ((rc = source_key(s, &canon)) == REGC_OK)
            rc = regc_compile_load_step(o, &canon, out, st);
        st->cache_ms = regc_time_ms() - c0;
        if (rc > 0)
            st->cache_hits = 1;
        if (rc != 0)
            goto done; /* a hit, or an error */
    }
    if ((rc = source_graph(s, &g, &param_offset, st)))
        goto done;
    if (o->recompute == REGC_RECOMPUTE_AUTO && o->budget_bytes > 0 && o->recompute_ratio < 0)
        rc = regc_compile_fitting(g, param_offset, o, out, st);
    else
        rc = regc_compile_graph_taken(g, param_offset, o, out, st);
    g = NULL;                                                  /* taken */
    if (rc == REGC_OK && *out && (rc = check_host(o, *out))) { /* NULL: fit_check's answer */
        regc_program_free(*out);
        *out = NULL;
    }
    if (rc == REGC_OK && cached && *out) {
        char what[200] = "graph";
        if (s->m)
            snprintf(what, sizeof what, "%s, %lld parameters, batch %lld, seq %lld",
                     regc_model_arch(s->m), (long long)regc_model_total_numel(s->m),
                     (long long)s->batch, (long long)s->seq);
        if ((rc = regc_compile_store_step(o, &canon, what, *out, st))) {
            regc_program_free(*out);
            *out = NULL;
        }
    }
done:
    st->replan_step = o->replan_step;
    /* a step from the cache was chosen by whatever its compile measured */
    st->measured_kernels = o->recompute == REGC_RECOMPUTE_AUTO && o->budget_bytes > 0 &&
                                   o->kernel_cost && !st->cache_hits
                               ? o->n_kernel_cost
                               : 0;
    if (rc >= 0 && cached && *out) /* the key the backend's tuning is kept under */
        regc_bytes_put(&(*out)->step_key, canon.data, canon.len);
    regc_graph_free(g);
    regc_graph_free(s->g);
    free(param_offset);
    regc_bytes_free(&canon);
    return rc > 0 ? REGC_OK : rc;
}

int regc_program_compile(const regc_model *m, int64_t batch, int64_t seq,
                         const regc_compile_options *o, regc_program **out, regc_compile_stats *st)
{
    step_source s = {.m = m, .batch = batch, .seq = seq};
    return compile_step(&s, o, out, st);
}

int regc_program_compile_graph(regc_graph *g, const regc_compile_options *o, regc_program **out,
                               regc_compile_stats *st)
{
    step_source s = {.g = g};
    return compile_step(&s, o, out, st);
}

/* ---------------------------------------------------------------- dump_graphs */

static int dump_file(const char *dir, const char *name, void (*write)(const void *, FILE *),
                     const void *what)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return regc_error(REGC_ERR_IO, "%s: cannot write", path);
    write(what, f);
    if (fclose(f) != 0)
        return regc_error(REGC_ERR_IO, "%s: write failed", path);
    return REGC_OK;
}

static void write_graph(const void *g, FILE *f) { regc_graph_dump(g, f); }
static void write_dot(const void *g, FILE *f) { regc_graph_dump_dot(g, f); }
static void write_compiled(const void *r, FILE *f) { regc_compiled_region_dump(r, f); }
static void write_program(const void *p, FILE *f) { regc_program_dump(p, f); }

/* The flat graph, every region (graph and compiled form) and the step
 * program, as text, and the graphs as DOT. */
static int dump_all(const regc_program *p, const char *dir)
{
    int rc = regc_make_dirs(dir);
    if (rc == REGC_OK)
        rc = dump_file(dir, "flat.txt", write_graph, regc_program_graph(p));
    if (rc == REGC_OK)
        rc = dump_file(dir, "flat.dot", write_dot, regc_program_graph(p));
    for (int i = 0; i < regc_program_n_regions(p) && rc == REGC_OK; i++) {
        const regc_compiled_region *r = regc_program_region(p, i);
        char name[64];
        snprintf(name, sizeof name, "region%d.txt", i);
        rc = dump_file(dir, name, write_graph, r->graph);
        snprintf(name, sizeof name, "region%d.dot", i);
        if (rc == REGC_OK)
            rc = dump_file(dir, name, write_dot, r->graph);
        snprintf(name, sizeof name, "region%d.compiled.txt", i);
        if (rc == REGC_OK)
            rc = dump_file(dir, name, write_compiled, r);
    }
    if (rc == REGC_OK)
        rc = dump_file(dir, "step.txt", write_program, p);
    return rc;
}
