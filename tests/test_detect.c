/* test_detect.c — the block detector: the presets of every architecture,
 * synthetic stacks (alternating layers, patterns of unequal layers, odd
 * first layers, a near miss, no repetition, a tensor every layer shares),
 * invariance under scrambled parameter names and under another valid
 * topological order, and the program it returns (every node exactly once,
 * in an order that can run).
 * `regc detect` is checked through the real binary, bad graph files
 * included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_detect.h"
#include "regc_models.h"
#include "test_util.h"

#define OK(expr) assert_int_equal((expr), REGC_OK)
/* every graph helper returns a tensor id or a negative status */
#define T(expr) assert_true_id(expr)

static int assert_true_id(int id)
{
    if (id < 0)
        fail_msg("graph building failed: %s", regc_error_message());
    return id;
}

/* ---- synthetic stacks ---------------------------------------------------- */

enum { MLP_GELU, MLP_GATED };

typedef struct {
    int64_t inner; /* MLP width */
    int mlp;       /* MLP_GELU or MLP_GATED */
    int scaled_q;  /* q scaled before attention: one op more than a layer without */
} layer_spec;

#define B 2
#define S 8
#define C 16
#define V 32

static int param(regc_graph *g, int *k, int ndim, int64_t d0, int64_t d1)
{
    char name[32];
    snprintf(name, sizeof name, "w%d", (*k)++);
    const int64_t shape[2] = {d0, d1};
    return T(regc_graph_add_tensor(g, name, REGC_F32, REGC_ROLE_PARAM, ndim, shape));
}

/* A pre-norm decoder stack: embedding, n layers as specified, final norm,
 * head and loss. With `shared_bias`, every attention adds one position-bias
 * input (a tensor all layers share). */
static regc_graph *build_stack(int n, const layer_spec *layers, int shared_bias)
{
    regc_graph *g = regc_graph_new();
    assert_non_null(g);
    int k = 0;
    const int64_t bt[] = {B, S}, hss[] = {2, S, S};
    int ids = T(regc_graph_add_tensor(g, "ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    int targets = T(regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    int bias =
        shared_bias ? T(regc_graph_add_tensor(g, "bias", REGC_F32, REGC_ROLE_INPUT, 3, hss)) : -1;
    int wte = param(g, &k, 2, V, C);
    int x = T(regc_graph_embedding(g, ids, wte)); /* [B, S, C] */
    for (int l = 0; l < n; l++) {
        int qkv[3];
        int h = T(regc_graph_rmsnorm(g, x, param(g, &k, 1, C, 0), 1e-5f)); /* [B, S, C] */
        h = T(regc_graph_matmul(g, h, param(g, &k, 2, C, 3 * C), 0, 0));   /* [B, S, 3C] */
        T(regc_graph_split(g, h, 3, qkv));                                 /* 3 x [B, S, C] */
        if (layers[l].scaled_q)
            qkv[0] = T(regc_graph_scale(g, qkv[0], 0.5f)); /* [B, S, C] */
        h = bias >= 0 ? T(regc_graph_attention_bias(g, qkv[0], qkv[1], qkv[2], bias, 2, 2, 1, 0.5f))
                      : T(regc_graph_attention(g, qkv[0], qkv[1], qkv[2], 2, 2, 1, 0.5f));
        h = T(regc_graph_matmul(g, h, param(g, &k, 2, C, C), 0, 0));   /* [B, S, C] */
        x = T(regc_graph_add(g, x, h));                                /* [B, S, C] */
        h = T(regc_graph_rmsnorm(g, x, param(g, &k, 1, C, 0), 1e-5f)); /* [B, S, C] */
        const int64_t F = layers[l].inner;
        int u = T(regc_graph_matmul(g, h, param(g, &k, 2, C, F), 0, 0)); /* [B, S, F] */
        if (layers[l].mlp == MLP_GATED) {
            int gate = T(regc_graph_matmul(g, h, param(g, &k, 2, C, F), 0, 0)); /* [B, S, F] */
            u = T(regc_graph_mul(g, T(regc_graph_silu(g, gate)), u));           /* [B, S, F] */
        } else {
            u = T(regc_graph_gelu(g, u)); /* [B, S, F] */
        }
        h = T(regc_graph_matmul(g, u, param(g, &k, 2, F, C), 0, 0)); /* [B, S, C] */
        x = T(regc_graph_add(g, x, h));                              /* [B, S, C] */
    }
    x = T(regc_graph_rmsnorm(g, x, param(g, &k, 1, C, 0), 1e-5f)); /* [B, S, C] */
    int logits = T(regc_graph_matmul(g, x, wte, 0, 1));            /* [B, S, V] */
    int loss = T(regc_graph_cross_entropy(g, logits, targets));    /* [] */
    OK(regc_graph_mark_output(g, loss));
    return g;
}

static regc_graph *build_uniform(int n, int64_t inner, int mlp, int shared_bias)
{
    layer_spec *l = calloc((size_t)n + 1, sizeof *l);
    assert_non_null(l);
    for (int i = 0; i < n; i++)
        l[i] = (layer_spec){inner, mlp, 0};
    regc_graph *g = build_stack(n, l, shared_bias);
    free(l);
    return g;
}

static regc_blocks *detect(const regc_graph *g)
{
    regc_blocks *b = NULL;
    int rc = regc_detect_blocks(g, &b);
    if (rc != REGC_OK)
        fail_msg("regc_detect_blocks: %s", regc_error_message());
    return b;
}

/* ---- properties every result must have ----------------------------------- */

/* Every node exactly once, in glue or in one instance; in program order
 * every input is produced before it is read; and instances are exact
 * copies (same ops in template order). */
static void check_program(const regc_graph *g, const regc_blocks *b)
{
    const int n = regc_graph_n_nodes(g);
    int *seen = calloc((size_t)n + 1, sizeof *seen);
    char *done = calloc((size_t)regc_graph_n_tensors(g) + 1, 1);
    assert_true(seen && done);
    for (int t = 0; t < regc_graph_n_tensors(g); t++)
        done[t] = regc_graph_tensor(g, t)->producer < 0;
    int covered = 0;
    for (int i = 0; i < regc_blocks_n_segments(b); i++) {
        const regc_segment *s = regc_blocks_segment(b, i);
        const regc_region_kind *k =
            s->type == REGC_SEGMENT_RUN ? regc_blocks_kind(b, s->kind) : NULL;
        int count = s->type == REGC_SEGMENT_RUN ? s->count : 1;
        for (int inst = 0; inst < count; inst++) {
            int m = k ? k->n_nodes : s->n_nodes;
            const int *nodes =
                k ? k->nodes + (size_t)(s->first + inst) * (size_t)k->n_nodes : s->nodes;
            for (int j = 0; j < m; j++) {
                const regc_node *nd = regc_graph_node(g, nodes[j]);
                seen[nodes[j]]++;
                for (int q = 0; q < nd->n_in; q++)
                    if (!done[nd->in[q]])
                        fail_msg("node %d reads tensor %d before it is produced", nodes[j],
                                 nd->in[q]);
                for (int o = 0; o < nd->n_out; o++)
                    done[nd->out[o]] = 1;
                if (k)
                    assert_int_equal(nd->op, regc_graph_node(g, k->nodes[j])->op);
            }
            covered += k ? m : 0;
        }
    }
    for (int i = 0; i < n; i++)
        if (seen[i] != 1)
            fail_msg("node %d appears %d times in the program", i, seen[i]);
    assert_true(regc_blocks_coverage(b) * n > covered - 0.5 &&
                regc_blocks_coverage(b) * n < covered + 0.5);
    free(seen);
    free(done);
}

static int count_class(const regc_region_kind *k, regc_formal_class cls)
{
    int n = 0;
    for (int f = 0; f < k->n_inputs; f++)
        n += k->inputs[f].cls == cls;
    return n;
}

/* ---- re-building a graph in another order or with other names ---------- */

/* A copy of g with its inputs, parameters and nodes added in a random valid
 * topological order (seeded), parameter names replaced by meaningless ones
 * when `scramble`. map[old node] = new node. */
static regc_graph *rebuild(const regc_graph *g, uint64_t seed, int scramble, int *map)
{
    const int nt = regc_graph_n_tensors(g), n = regc_graph_n_nodes(g);
    int *tmap = malloc((size_t)nt * sizeof *tmap), *leaves = malloc((size_t)nt * sizeof *leaves);
    char *placed = calloc((size_t)n, 1);
    int *ready = malloc((size_t)n * sizeof *ready);
    regc_graph *h = regc_graph_new();
    assert_true(tmap && leaves && placed && ready && h);
    int n_leaves = 0;
    for (int t = 0; t < nt; t++) {
        tmap[t] = -1;
        if (regc_graph_tensor(g, t)->producer < 0)
            leaves[n_leaves++] = t;
    }
    uint64_t r = 0;
    for (int i = n_leaves - 1; i > 0; i--) { /* shuffle the leaves too */
        int j = (int)(regc_rng_at(seed, r++) % (uint64_t)(i + 1)), x = leaves[i];
        leaves[i] = leaves[j], leaves[j] = x;
    }
    for (int i = 0; i < n_leaves; i++) {
        const regc_tensor *t = regc_graph_tensor(g, leaves[i]);
        char name[48];
        if (scramble && t->role == REGC_ROLE_PARAM)
            snprintf(name, sizeof name, "q%016llx", (unsigned long long)regc_rng_at(seed ^ 7, r++));
        else
            snprintf(name, sizeof name, "%s", t->name);
        tmap[leaves[i]] = T(regc_graph_add_tensor(h, name, t->dtype, t->role, t->ndim, t->shape));
    }
    for (int done = 0; done < n; done++) {
        int n_ready = 0;
        for (int i = 0; i < n; i++) {
            const regc_node *nd = regc_graph_node(g, i);
            int ok = !placed[i];
            for (int q = 0; ok && q < nd->n_in; q++)
                ok = tmap[nd->in[q]] >= 0;
            if (ok)
                ready[n_ready++] = i;
        }
        assert_true(n_ready > 0);
        int i = ready[regc_rng_at(seed, r++) % (uint64_t)n_ready];
        const regc_node *nd = regc_graph_node(g, i);
        int in[REGC_MAX_IO], out[REGC_MAX_IO];
        for (int q = 0; q < nd->n_in; q++)
            in[q] = tmap[nd->in[q]];
        const regc_tensor *o0 = regc_graph_tensor(g, nd->out[0]);
        map[i] = T(regc_graph_add_node(h, nd->op, &nd->attrs, nd->n_in, in, nd->n_out, out,
                                       o0->ndim, o0->shape));
        for (int s = 0; s < nd->n_out; s++)
            tmap[nd->out[s]] = out[s];
        placed[i] = 1;
    }
    for (int o = 0; o < regc_graph_n_outputs(g); o++)
        OK(regc_graph_mark_output(h, tmap[regc_graph_output(g, o)]));
    free(tmap), free(leaves), free(placed), free(ready);
    return h;
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* The same structure: kinds, instances and each instance's node set (after
 * mapping a's nodes through map, or identity when map is NULL). */
static void assert_same_blocks(const regc_blocks *a, const regc_blocks *b, const int *map)
{
    assert_int_equal(regc_blocks_n_kinds(a), regc_blocks_n_kinds(b));
    assert_true(regc_blocks_coverage(a) == regc_blocks_coverage(b));
    for (int k = 0; k < regc_blocks_n_kinds(a); k++) {
        const regc_region_kind *x = regc_blocks_kind(a, k), *y = regc_blocks_kind(b, k);
        assert_int_equal(x->n_instances, y->n_instances);
        assert_int_equal(x->n_nodes, y->n_nodes);
        assert_int_equal(x->n_inputs, y->n_inputs);
        assert_true(x->params_per_instance == y->params_per_instance);
        int p = x->n_nodes, *u = malloc((size_t)p * sizeof *u), *v = malloc((size_t)p * sizeof *v);
        assert_true(u && v);
        for (int i = 0; i < x->n_instances; i++) {
            for (int j = 0; j < p; j++) {
                int node = x->nodes[i * p + j];
                u[j] = map ? map[node] : node;
                v[j] = y->nodes[i * p + j];
            }
            qsort(u, (size_t)p, sizeof *u, cmp_int);
            qsort(v, (size_t)p, sizeof *v, cmp_int);
            assert_memory_equal(u, v, (size_t)p * sizeof *u);
        }
        free(u), free(v);
    }
}

/* ---- tests: synthetic stacks --------------------------------------------- */

static void test_uniform_stack(void **state)
{
    (void)state;
    regc_graph *g = build_uniform(6, 40, MLP_GELU, 0);
    regc_blocks *b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 1);
    const regc_region_kind *k = regc_blocks_kind(b, 0);
    assert_int_equal(k->n_instances, 6);
    assert_int_equal(k->n_nodes, 11);
    /* rmsnorm, matmul, split, attention, matmul, add, rmsnorm, matmul,
     * gelu, matmul, add: the layer starts at its norm and ends at the add */
    assert_int_equal(regc_graph_node(g, k->nodes[0])->op, REGC_OP_RMSNORM);
    assert_int_equal(regc_graph_node(g, k->nodes[10])->op, REGC_OP_ADD);
    assert_int_equal(count_class(k, REGC_FORMAL_CARRIED), 1);
    assert_int_equal(count_class(k, REGC_FORMAL_SHARED), 0);
    assert_int_equal(count_class(k, REGC_FORMAL_PER_INSTANCE), 6);
    assert_true(k->params_per_instance == C + 3 * C * C + C * C + C + 2 * C * 40);
    /* instance i is exactly layer i: graph nodes 1 + 11 i .. 11 + 11 i */
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 11; j++) {
            int node = k->nodes[i * 11 + j];
            assert_true(node >= 1 + 11 * i && node < 12 + 11 * i);
        }
    /* prologue (embedding), the run, epilogue (norm, head, loss) */
    assert_int_equal(regc_blocks_n_segments(b), 3);
    assert_int_equal(regc_blocks_segment(b, 0)->n_nodes, 1);
    assert_int_equal(regc_blocks_segment(b, 1)->type, REGC_SEGMENT_RUN);
    assert_int_equal(regc_blocks_segment(b, 2)->n_nodes, 3);
    /* the carried output of instance i is the input of instance i + 1 */
    int carried = -1;
    for (int f = 0; f < k->n_inputs; f++)
        if (k->inputs[f].cls == REGC_FORMAL_CARRIED)
            carried = f;
    assert_int_equal(k->n_outputs, 1);
    for (int i = 1; i < 6; i++)
        assert_int_equal(k->in_bind[i * k->n_inputs + carried],
                         k->out_bind[(i - 1) * k->n_outputs]);
    assert_int_equal(regc_blocks_n_near_misses(b), 0);
    regc_blocks_free(b);
    regc_graph_free(g);
}

static void test_shared_input(void **state)
{
    (void)state;
    regc_graph *g = build_uniform(5, 24, MLP_GATED, 1);
    regc_blocks *b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 1);
    const regc_region_kind *k = regc_blocks_kind(b, 0);
    assert_int_equal(k->n_instances, 5);
    assert_int_equal(count_class(k, REGC_FORMAL_SHARED), 1);
    int bias = regc_graph_find_tensor(g, "bias");
    for (int f = 0; f < k->n_inputs; f++)
        if (k->inputs[f].cls == REGC_FORMAL_SHARED)
            for (int i = 0; i < 5; i++)
                assert_int_equal(k->in_bind[i * k->n_inputs + f], bias);
    regc_blocks_free(b);
    regc_graph_free(g);
}

static void test_alternating_layers(void **state)
{
    (void)state;
    /* even layers one MLP width, odd layers another: a two-layer super-block */
    layer_spec l[8];
    for (int i = 0; i < 8; i++)
        l[i] = (layer_spec){i % 2 ? 24 : 40, MLP_GELU, 0};
    regc_graph *g = build_stack(8, l, 0);
    regc_blocks *b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 1);
    const regc_region_kind *k = regc_blocks_kind(b, 0);
    assert_int_equal(k->n_instances, 4);
    assert_int_equal(k->n_nodes, 22);
    assert_true(k->params_per_instance == 2 * (C + 3 * C * C + C * C + C) + 2 * C * (40 + 24));
    assert_int_equal(regc_blocks_n_near_misses(b), 0);
    regc_blocks_free(b);
    regc_graph_free(g);

    /* alternating MLP kinds (gated and not): also one super-block */
    for (int i = 0; i < 8; i++)
        l[i] = (layer_spec){32, i % 2 ? MLP_GATED : MLP_GELU, 0};
    g = build_stack(8, l, 0);
    b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 1);
    assert_int_equal(regc_blocks_kind(b, 0)->n_instances, 4);
    assert_int_equal(regc_blocks_kind(b, 0)->n_nodes, 11 + 13);
    regc_blocks_free(b);
    regc_graph_free(g);
}

/* A pattern of layers of different lengths, repeated: three layers then
 * one with an op fewer and none of its own (SmolLM3's three RoPE layers
 * and a NoPE one), or five then one (as Gemma 3 repeats its layers): no
 * single layer's length, nor twice it, is the period; the pattern is one
 * super-block per repeat, and what the last repeat lacks (26 layers: four
 * patterns of six, then two) a kind of its own. */
static void test_layer_patterns(void **state)
{
    (void)state;
    static const struct {
        int n_layers, every, kinds, instances, layers_per_instance;
    } cases[] = {{12, 4, 1, 3, 4}, {16, 4, 1, 4, 4}, {18, 6, 1, 3, 6}, {26, 6, 2, 4, 6}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        layer_spec l[32];
        for (int i = 0; i < cases[c].n_layers; i++)
            l[i] = (layer_spec){32, MLP_GATED, (i + 1) % cases[c].every != 0};
        regc_graph *g = build_stack(cases[c].n_layers, l, 0);
        regc_blocks *b = detect(g);
        check_program(g, b);
        const regc_region_kind *k = regc_blocks_n_kinds(b) > 0 ? regc_blocks_kind(b, 0) : NULL;
        /* 14 nodes a layer scaling q, 13 one that does not */
        const int want_nodes = 14 * (cases[c].layers_per_instance - 1) + 13;
        if (regc_blocks_n_kinds(b) != cases[c].kinds || !k ||
            k->n_instances != cases[c].instances || k->n_nodes != want_nodes)
            fail_msg("%d layers, one without the scale in %d: %d kinds, the first %d x %d nodes "
                     "(want %d x "
                     "%d)",
                     cases[c].n_layers, cases[c].every, regc_blocks_n_kinds(b),
                     k ? k->n_instances : 0, k ? k->n_nodes : 0, cases[c].instances, want_nodes);
        regc_blocks_free(b);
        regc_graph_free(g);
    }
}

static void test_odd_first_layers(void **state)
{
    (void)state;
    /* the first 3 layers dense-GELU, the other 5 gated: two kinds in order */
    layer_spec l[8];
    for (int i = 0; i < 8; i++)
        l[i] = (layer_spec){32, i < 3 ? MLP_GELU : MLP_GATED, 0};
    regc_graph *g = build_stack(8, l, 0);
    regc_blocks *b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 2);
    int seen_runs = 0, counts[2] = {0, 0};
    for (int i = 0; i < regc_blocks_n_segments(b); i++) {
        const regc_segment *s = regc_blocks_segment(b, i);
        if (s->type != REGC_SEGMENT_RUN)
            continue;
        counts[seen_runs++] = s->count;
        /* the dense kind first, then the gated one */
        assert_int_equal(regc_blocks_kind(b, s->kind)->n_nodes, seen_runs == 1 ? 11 : 13);
    }
    assert_int_equal(seen_runs, 2);
    assert_int_equal(counts[0], 3);
    assert_int_equal(counts[1], 5);
    regc_blocks_free(b);
    regc_graph_free(g);

    /* one odd first layer: it stays in the prologue */
    for (int i = 0; i < 8; i++)
        l[i] = (layer_spec){i == 0 ? 48 : 32, MLP_GELU, 0};
    g = build_stack(8, l, 0);
    b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 1);
    assert_int_equal(regc_blocks_kind(b, 0)->n_instances, 7);
    assert_int_equal(regc_blocks_segment(b, 0)->n_nodes, 1 + 11);
    regc_blocks_free(b);
    regc_graph_free(g);
}

static void test_near_miss(void **state)
{
    (void)state;
    /* layer 3 of 7 has another MLP width: reported, never merged */
    layer_spec l[7];
    for (int i = 0; i < 7; i++)
        l[i] = (layer_spec){i == 3 ? 48 : 32, MLP_GELU, 0};
    regc_graph *g = build_stack(7, l, 0);
    regc_blocks *b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 1);
    const regc_region_kind *k = regc_blocks_kind(b, 0);
    assert_int_equal(k->n_instances, 6);
    for (int i = 0; i < 6 * 11; i++) /* no node of layer 3 in any instance */
        assert_false(k->nodes[i] >= 1 + 33 && k->nodes[i] < 12 + 33);
    assert_true(regc_blocks_n_near_misses(b) >= 1);
    const regc_near_miss *m = regc_blocks_near_miss(b, 0);
    assert_int_equal(m->kind, 0);
    assert_true(m->node >= 1 + 33 && m->node < 12 + 33);
    assert_non_null(strstr(m->reason, "48"));
    regc_blocks_free(b);
    regc_graph_free(g);
}

static void test_no_repetition(void **state)
{
    (void)state;
    regc_graph *g = build_uniform(1, 32, MLP_GELU, 0);
    regc_blocks *b = detect(g);
    check_program(g, b);
    assert_int_equal(regc_blocks_n_kinds(b), 0);
    assert_true(regc_blocks_coverage(b) == 0.0);
    assert_int_equal(regc_blocks_n_segments(b), 1);
    assert_int_equal(regc_blocks_segment(b, 0)->n_nodes, regc_graph_n_nodes(g));
    regc_blocks_free(b);
    regc_graph_free(g);

    /* the empty graph too */
    g = regc_graph_new();
    b = detect(g);
    assert_int_equal(regc_blocks_n_kinds(b), 0);
    regc_blocks_free(b);
    regc_graph_free(g);
}

static void test_invariance(void **state)
{
    (void)state;
    layer_spec l[9];
    for (int i = 0; i < 9; i++)
        l[i] = (layer_spec){i < 2 ? 24 : 32, i < 2 ? MLP_GELU : MLP_GATED, 0};
    regc_graph *g = build_stack(9, l, 1);
    regc_blocks *b = detect(g);
    int *map = malloc((size_t)regc_graph_n_nodes(g) * sizeof *map);
    assert_non_null(map);
    for (uint64_t seed = 1; seed <= 6; seed++) {
        regc_graph *h = rebuild(g, seed, seed % 2, map);
        regc_blocks *c = detect(h);
        check_program(h, c);
        assert_same_blocks(b, c, map);
        regc_blocks_free(c);
        regc_graph_free(h);
    }
    free(map);
    regc_blocks_free(b);
    regc_graph_free(g);
}

/* ---- tests: the architectures --------------------------------------------- */

typedef struct {
    const char *preset;
    int runs;
    int instances[2];      /* per run, in execution order */
    const char *prefix[2]; /* per run: the checkpoint prefix of layer i's parameters */
} preset_case;

static const preset_case presets[] = {
    {"gpt2-tiny", 1, {4}, {"transformer.h.%d."}},
    {"gpt2-124m", 1, {12}, {"transformer.h.%d."}},
    {"llama-tiny", 1, {4}, {"model.layers.%d."}},
    {"llama-8b", 1, {32}, {"model.layers.%d."}},
    {"llama-70b", 1, {80}, {"model.layers.%d."}},
    {"bert-tiny", 1, {4}, {"bert.encoder.layer.%d."}},
    {"bert-base", 1, {12}, {"bert.encoder.layer.%d."}},
    {"t5-tiny", 2, {2, 2}, {"encoder.block.%d.", "decoder.block.%d."}},
    {"t5-small", 2, {6, 6}, {"encoder.block.%d.", "decoder.block.%d."}},
};

/* Instance i of run r binds exactly the parameters of layer i: the
 * detector never reads names, so they check its boundaries independently. */
static void check_layer_params(const preset_case *pc, const regc_graph *g, const regc_blocks *b)
{
    int run = 0;
    for (int i = 0; i < regc_blocks_n_segments(b); i++) {
        const regc_segment *s = regc_blocks_segment(b, i);
        if (s->type != REGC_SEGMENT_RUN)
            continue;
        if (run >= pc->runs || s->count != pc->instances[run])
            fail_msg("%s: run %d has %d instances", pc->preset, run, s->count);
        const regc_region_kind *k = regc_blocks_kind(b, s->kind);
        for (int l = 0; l < s->count; l++) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, pc->prefix[run], l);
            int n_params = 0;
            for (int f = 0; f < k->n_inputs; f++) {
                const regc_tensor *t =
                    regc_graph_tensor(g, k->in_bind[(s->first + l) * k->n_inputs + f]);
                if (k->inputs[f].cls != REGC_FORMAL_PER_INSTANCE)
                    continue;
                n_params++;
                if (strncmp(t->name, prefix, strlen(prefix)) != 0)
                    fail_msg("%s: layer %d of run %d binds %s", pc->preset, l, run, t->name);
            }
            assert_true(n_params > 0);
        }
        run++;
    }
    if (run != pc->runs)
        fail_msg("%s: %d runs, expected %d", pc->preset, run, pc->runs);
}

static void test_presets(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        const preset_case *pc = &presets[i];
        regc_model *m = NULL;
        regc_graph *g = NULL;
        OK(regc_model_load_shapes(pc->preset, &m));
        OK(regc_model_build_graph(m, 1, 16, &g));
        regc_blocks *b = detect(g);
        check_program(g, b);
        if (regc_blocks_n_kinds(b) != pc->runs) /* each run its own kind here */
            fail_msg("%s: %d kinds, expected %d", pc->preset, regc_blocks_n_kinds(b), pc->runs);
        check_layer_params(pc, g, b);
        assert_int_equal(regc_blocks_n_near_misses(b), 0);
        /* scrambled names and another order change nothing */
        int *map = malloc((size_t)regc_graph_n_nodes(g) * sizeof *map);
        assert_non_null(map);
        regc_graph *h = rebuild(g, 99 + i, 1, map);
        regc_blocks *c = detect(h);
        assert_same_blocks(b, c, map);
        free(map);
        regc_blocks_free(c);
        regc_graph_free(h);
        regc_blocks_free(b);
        regc_graph_free(g);
        regc_model_free(m);
    }
}

/* T5: the first layer of each stack carries the relative position bias
 * the others reuse; the bias is computed once in the glue and every layer
 * reads it as a shared input (the decoder also shares the encoder output). */
static void test_t5_shared_inputs(void **state)
{
    (void)state;
    regc_model *m = NULL;
    regc_graph *g = NULL;
    OK(regc_model_load_shapes("t5-tiny", &m));
    OK(regc_model_build_graph(m, 2, 8, &g));
    regc_blocks *b = detect(g);
    int seen = 0;
    for (int i = 0; i < regc_blocks_n_segments(b); i++) {
        const regc_segment *s = regc_blocks_segment(b, i);
        if (s->type != REGC_SEGMENT_RUN)
            continue;
        const regc_region_kind *k = regc_blocks_kind(b, s->kind);
        assert_int_equal(count_class(k, REGC_FORMAL_SHARED), seen == 0 ? 1 : 2);
        for (int f = 0; f < k->n_inputs; f++) {
            if (k->inputs[f].cls != REGC_FORMAL_SHARED)
                continue;
            const regc_tensor *t = regc_graph_tensor(g, k->in_bind[s->first * k->n_inputs + f]);
            const regc_node *p = regc_graph_node(g, t->producer);
            /* the bias [H, T, T] comes from a transpose of the block-0 table lookup */
            if (t->ndim == 3 && t->shape[1] == 8 && t->shape[2] == 8)
                assert_int_equal(p->op, REGC_OP_TRANSPOSE);
            else
                assert_int_equal(p->op, REGC_OP_RMSNORM); /* the encoder output */
        }
        seen++;
    }
    assert_int_equal(seen, 2);
    regc_blocks_free(b);
    regc_graph_free(g);
    regc_model_free(m);
}

/* ---- tests: the command line ---------------------------------------------- */

static void test_cli_json(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "detect", "--model", "gpt2-tiny", "--json", NULL), 0);
    assert_int_equal(regc_test_count_lines(p.out), 1);
    cJSON *o = cJSON_Parse(p.out);
    assert_non_null(o);
    const cJSON *regions = cJSON_GetObjectItemCaseSensitive(o, "regions");
    assert_int_equal(cJSON_GetArraySize(regions), 1);
    const cJSON *r = cJSON_GetArrayItem(regions, 0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(r, "kind")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(r, "instances")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(r, "nodes")->valueint, 15);
    /* transformer.h.<i>.*: 2 norms of 128 x 2, 128 x 384 + 384, 128 x 128 + 128,
     * 128 x 512 + 512, 512 x 128 + 128 */
    assert_true(cJSON_GetObjectItemCaseSensitive(r, "params_per_instance")->valuedouble ==
                198272.0);
    double cov = cJSON_GetObjectItemCaseSensitive(o, "coverage")->valuedouble;
    assert_true(cov > 0.9 && cov < 1.0);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "ms")));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "near_misses")), 0);
    cJSON_Delete(o);
    regc_test_proc_free(&p);

    /* the table names the same figures */
    assert_int_equal(regc_test_run_regc(&p, "detect", "--model", "gpt2-tiny", NULL), 0);
    assert_non_null(strstr(p.out, "1 region kind"));
    assert_non_null(strstr(p.out, "coverage"));
    regc_test_proc_free(&p);
}

/* A graph file with one defect; `regc detect` must exit 1 with a one-line
 * message that names the file and `where`, and print nothing. */
static void expect_bad_graph(regc_test_dir *d, const char *name, const char *text,
                             const char *where)
{
    assert_int_equal(regc_test_write_text(d->dir, name, text), 0);
    char *path = regc_test_join(d->dir, name);
    regc_test_proc p;
    int status = regc_test_run_regc(&p, "detect", "--model", path, NULL);
    if (status != 1 || !strstr(p.err, name) || !strstr(p.err, where) ||
        regc_test_count_lines(p.err) != 1 || p.out_len != 0)
        fail_msg("%s: exit %d, stderr: %s", name, status, p.err);
    regc_test_proc_free(&p);
    free(path);
}

#define HEAD "{\"format\": \"regc-graph\", \"version\": 1, "
#define INPUTS                                                                                     \
    "\"tensors\": [{\"id\": 0, \"name\": \"x\", \"dtype\": \"f32\", \"role\": \"input\", "         \
    "\"shape\": [2, 4]}, {\"id\": 1, \"name\": \"w\", \"dtype\": \"f32\", \"role\": \"param\", "   \
    "\"shape\": [4, 4]}], "

#define MM "\"trans_a\": 0, \"trans_b\": 0"

static void test_cli_bad_graphs(void **state)
{
    regc_test_dir *d = *state;
    /* valid: detect reads a graph file as it is (no input_ids needed) */
    assert_int_equal(
        regc_test_write_text(
            d->dir, "ok.json",
            HEAD INPUTS
            "\"nodes\": [{\"op\": \"matmul\", \"in\": "
            "[0, 1], \"out\": [2], \"trans_a\": 0, \"trans_b\": 0}], \"outputs\": [2]}"),
        0);
    char *path = regc_test_join(d->dir, "ok.json");
    regc_test_proc p;
    int status = regc_test_run_regc(&p, "detect", "--model", path, "--json", NULL);
    if (status != 0 || !strstr(p.out, "\"regions\":[]"))
        fail_msg("valid graph: exit %d, stdout: %s, stderr: %s", status, p.out, p.err);
    regc_test_proc_free(&p);
    free(path);

    expect_bad_graph(d, "malformed.json", HEAD "\"tensors\": [", "malformed.json");
    expect_bad_graph(d, "dangling.json",
                     HEAD INPUTS
                     "\"nodes\": [{\"op\": \"matmul\", \"in\": [0, 7], \"out\": [2], " MM "}], "
                     "\"outputs\": [2]}",
                     "nodes[0]");
    expect_bad_graph(d, "cyclic.json",
                     HEAD INPUTS
                     "\"nodes\": [{\"op\": \"matmul\", \"in\": [0, 3], \"out\": [2], " MM "}, "
                     "{\"op\": \"matmul\", \"in\": [2, 1], \"out\": [3], " MM
                     "}], \"outputs\": [3]}",
                     "nodes[0]");
    expect_bad_graph(d, "shapes.json",
                     HEAD INPUTS "\"nodes\": [{\"op\": \"add\", \"in\": [0, 1], \"out\": [2]}], "
                                 "\"outputs\": [2]}",
                     "nodes[0]");
}

/* regions and coverage of `regc detect ... --json`, printed back as text */
static char *detect_summary(const char *model)
{
    regc_test_proc p;
    assert_int_equal(
        regc_test_run_regc(&p, "detect", "--model", model, "--seq", "16", "--json", NULL), 0);
    cJSON *o = cJSON_Parse(p.out);
    assert_non_null(o);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "ms");
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    regc_test_proc_free(&p);
    return text;
}

/* A graph exported by dump-graph detects exactly like the model it came from. */
static void test_cli_dumped_graph(void **state)
{
    regc_test_dir *d = *state;
    char *path = regc_test_join(d->dir, "t5.json");
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "dump-graph", "--model", "t5-tiny", "--batch", "1",
                                        "--seq", "16", "--out", path, NULL),
                     0);
    regc_test_proc_free(&p);
    char *a = detect_summary("t5-tiny"), *b = detect_summary(path);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\"instances\":2"));
    free(a), free(b), free(path);
}

static void test_cli_usage(void **state)
{
    (void)state;
    regc_test_proc p;
    assert_int_equal(regc_test_run_regc(&p, "detect", NULL), 2);
    assert_non_null(strstr(p.err, "--model is required"));
    regc_test_proc_free(&p);
    assert_int_equal(
        regc_test_run_regc(&p, "detect", "--model", "gpt2-tiny", "--frobnicate", "1", NULL), 2);
    assert_non_null(strstr(p.err, "--frobnicate"));
    regc_test_proc_free(&p);
    assert_int_equal(regc_test_run_regc(&p, "detect", "--model", "no-such-preset", NULL), 1);
    assert_non_null(strstr(p.err, "no-such-preset"));
    regc_test_proc_free(&p);
}

static int setup(void **state) { return regc_test_dir_setup(state, "detect", NULL); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_stack),
        cmocka_unit_test(test_shared_input),
        cmocka_unit_test(test_alternating_layers),
        cmocka_unit_test(test_layer_patterns),
        cmocka_unit_test(test_odd_first_layers),
        cmocka_unit_test(test_near_miss),
        cmocka_unit_test(test_no_repetition),
        cmocka_unit_test(test_invariance),
        cmocka_unit_test(test_presets),
        cmocka_unit_test(test_t5_shared_inputs),
        cmocka_unit_test(test_cli_json),
        regc_test_in_dir(test_cli_bad_graphs, setup),
        regc_test_in_dir(test_cli_dumped_graph, setup),
        cmocka_unit_test(test_cli_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
