/* test_model.c — see test_model.h. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "test_model.h"
#include "test_util.h"

void regc_test_write_config(const char *dir, const char *head, const char *const (*keys)[2],
                            size_t n_keys, const char *extra, const char *omit)
{
    char text[4096], quoted[96];
    size_t len = (size_t)snprintf(text, sizeof text, "{%s", head);
    for (size_t i = 0; i < n_keys; i++) {
        snprintf(quoted, sizeof quoted, "\"%s\"", keys[i][0]);
        if ((!extra || !strstr(extra, quoted)) && (!omit || strcmp(omit, keys[i][0]) != 0))
            len += (size_t)snprintf(text + len, sizeof text - len, ", %s: %s", quoted, keys[i][1]);
    }
    snprintf(text + len, sizeof text - len, "%s%s}", extra ? ", " : "", extra ? extra : "");
    if (mkdir(dir, 0755) != 0)
        assert_int_equal(errno, EEXIST);
    assert_int_equal(regc_test_write_text(dir, "config.json", text), 0);
}

void regc_test_assert_same_weights(regc_model *a, regc_model *b)
{
    assert_int_equal(regc_model_n_params(a), regc_model_n_params(b));
    assert_int_equal(regc_model_total_numel(a), regc_model_total_numel(b));
    for (int i = 0; i < regc_model_n_params(a); i++)
        assert_string_equal(regc_model_param_name(a, i), regc_model_param_name(b, i));
    assert_memory_equal(regc_model_weights(a), regc_model_weights(b),
                        (size_t)regc_model_total_numel(a) * sizeof(float));
}

int regc_test_param_index(const regc_model *m, const char *name)
{
    for (int i = 0; i < regc_model_n_params(m); i++)
        if (strcmp(regc_model_param_name(m, i), name) == 0)
            return i;
    return -1;
}

void regc_test_assert_param_shape(const regc_model *m, const char *name, int ndim, int64_t d0,
                                  int64_t d1)
{
    const int i = regc_test_param_index(m, name);
    if (i < 0)
        fail_msg("no parameter %s", name);
    int64_t shape[REGC_MAX_DIMS];
    assert_int_equal(regc_model_param_shape(m, i, shape), ndim);
    assert_int_equal(shape[0], d0);
    if (ndim == 2)
        assert_int_equal(shape[1], d1);
}

void regc_test_write_decoder_config(const char *dir, const char *model_type, const char *extra,
                                    const char *omit)
{
    static const char *const keys[][2] = {
        {"vocab_size", "64"},
        {"hidden_size", "24"},
        {"intermediate_size", "40"},
        {"num_hidden_layers", "3"},
        {"num_attention_heads", "6"},
        {"num_key_value_heads", "2"},
        {"max_position_embeddings", "16"},
        {"pad_token_id", "null"},
    };
    char head[96];
    snprintf(head, sizeof head, "\"model_type\": \"%s\"", model_type);
    regc_test_write_config(dir, head, keys, sizeof keys / sizeof keys[0], extra, omit);
}

int regc_test_count_ops(const regc_graph *g, regc_op op)
{
    int n = 0;
    for (int i = 0; i < regc_graph_n_nodes(g); i++)
        n += regc_graph_node(g, i)->op == op;
    return n;
}

regc_model *regc_test_load_config(const char *dir, uint64_t seed)
{
    regc_model *m;
    if (regc_model_load_config(dir, &m) != REGC_OK)
        fail_msg("%s", regc_error_message());
    assert_false(regc_model_has_weights(m));
    if (seed)
        assert_int_equal(regc_model_init_random(m, seed), REGC_OK);
    return m;
}

void regc_test_expect_config_error(const char *dir, int status, const char *what)
{
    regc_model *m = (regc_model *)1;
    assert_int_equal(regc_model_load_config(dir, &m), status);
    assert_null(m);
    char *path = regc_test_join(dir, "config.json");
    regc_test_expect_error(path, what);
    free(path);
}

char *regc_test_tiny_graph_json(void)
{
    regc_model *m = NULL;
    regc_graph *g = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    assert_int_equal(regc_model_build_graph(m, 2, 16, &g), REGC_OK);
    char *json = regc_graph_to_json(g);
    assert_non_null(json);
    regc_graph_free(g);
    regc_model_free(m);
    /* position_ids as data, not a constant: "input" is shorter than
     * "constant", so the text is rewritten in place */
    char *role = strstr(json, "\"constant\"");
    assert_non_null(role);
    assert_null(strstr(role + 1, "\"constant\""));
    const size_t tail = strlen(role + strlen("\"constant\""));
    memcpy(role, "\"input\"", strlen("\"input\""));
    memmove(role + strlen("\"input\""), role + strlen("\"constant\""), tail + 1);
    return json;
}

static void test_collect_loss(const regc_step_report *r, void *user)
{
    regc_test_losses *l = user;
    if (l->n < REGC_TEST_MAX_STEPS)
        l->grad_norm[l->n] = r->grad_norm, l->loss[l->n++] = r->loss;
    l->device_peak = r->device_peak;
}

static void test_collect_compile(const regc_compile_stats *st, void *user)
{
    regc_test_losses *l = user;
    l->hits = st->cache_hits, l->misses = st->cache_misses;
    if (st->measured_kernels > 0)
        l->measured_at = st->replan_step;
}

regc_train_options regc_test_train_options(int64_t batch, int64_t seq, int steps)
{
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = batch, o.seq = seq, o.steps = steps, o.lr = 3e-3f, o.cache_dir = NULL;
    o.threads = 2;
    return o;
}

void regc_test_train_model(regc_model *m, const regc_train_options *o, regc_test_losses *l)
{
    assert_true(o->steps <= REGC_TEST_MAX_STEPS);
    regc_train_options with_stats = *o;
    with_stats.on_compiled = test_collect_compile;
    memset(l, 0, sizeof *l);
    if (regc_train(m, &with_stats, test_collect_loss, l, NULL) != REGC_OK)
        fail_msg("train %s: %s", regc_model_source(m), regc_error_message());
    assert_int_equal(l->n, o->steps);
}

regc_model *regc_test_train(const char *preset, const regc_train_options *o, regc_test_losses *l)
{
    regc_model *m = NULL;
    if (regc_model_load(preset, &m) != REGC_OK)
        fail_msg("load %s: %s", preset, regc_error_message());
    regc_test_train_model(m, o, l);
    return m;
}

regc_program *regc_test_compile(const char *preset, int64_t batch, int64_t seq,
                                const regc_compile_options *co, int *status)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes(preset, &m), REGC_OK);
    regc_program *p = NULL;
    const int rc = regc_program_compile(m, batch, seq, co, &p, NULL);
    regc_model_free(m);
    if (status)
        *status = rc;
    else if (rc)
        fail_msg("%s: %s", preset, regc_error_message());
    return p;
}

void regc_test_state_alloc(regc_backend *be, const regc_model *m, float param, regc_test_state *s)
{
    const size_t n = (size_t)regc_model_total_numel(m);
    *s = (regc_test_state){0};
    for (int k = 0; k < 4; k++) {
        s->block[k] = be->alloc(be, n * sizeof(float));
        assert_non_null(s->block[k]);
        be->fill(be, s->block[k], n, k == 0 ? param : 0.0f);
    }
}

void regc_test_state_free(regc_backend *be, regc_test_state *s)
{
    for (int i = 0; i < 8; i++)
        if (s->inputs[i])
            be->free(be, s->inputs[i]);
    for (int k = 0; k < 4; k++)
        be->free(be, s->block[k]);
    *s = (regc_test_state){0};
}

char *regc_test_program_dump(const regc_program *p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    regc_program_dump(p, f);
    assert_int_equal(fclose(f), 0);
    return text;
}

regc_graph *regc_test_decompose(const regc_graph *g)
{
    regc_graph *h = regc_graph_new();
    const int n_t = regc_graph_n_tensors(g);
    int *map = malloc((size_t)n_t * sizeof *map);
    assert_non_null(map);
    assert_int_equal(regc_graph_copy_leaves(g, h, map), REGC_OK);
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        int in[REGC_MAX_IO], o[REGC_MAX_IO];
        for (int k = 0; k < n->n_in; k++)
            in[k] = map[n->in[k]];
        if (n->op == REGC_OP_RMSNORM) { /* (x * rsqrt(mean(x^2) + eps)) * w */
            int ms = regc_graph_mean_last(h, regc_graph_pow(h, in[0], 2.0f));
            int r = regc_graph_rsqrt(h, regc_graph_add_scalar(h, ms, n->attrs.eps));
            map[n->out[0]] = regc_graph_mul(h, regc_graph_mul(h, in[0], r), in[1]);
            assert_true(map[n->out[0]] >= 0);
            continue;
        }
        if (n->op == REGC_OP_LAYERNORM) { /* (d * rsqrt(mean(d^2) + eps)) * w + b */
            int d = regc_graph_sub(h, in[0], regc_graph_mean_last(h, in[0]));
            int var = regc_graph_mean_last(h, regc_graph_pow(h, d, 2.0f));
            int r = regc_graph_rsqrt(h, regc_graph_add_scalar(h, var, n->attrs.eps));
            map[n->out[0]] =
                regc_graph_bias_add(h, regc_graph_mul(h, regc_graph_mul(h, d, r), in[1]), in[2]);
            if (map[n->out[0]] < 0)
                fail_msg("%s", regc_error_message());
            continue;
        }
        if (n->op == REGC_OP_GELU) { /* (x/2) (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
            int inner = regc_graph_add(
                h, in[0], regc_graph_scale(h, regc_graph_pow(h, in[0], 3.0f), 0.044715f));
            int th = regc_graph_tanh(h, regc_graph_scale(h, inner, 0.7978845608f));
            map[n->out[0]] = regc_graph_mul(h, regc_graph_scale(h, in[0], 0.5f),
                                            regc_graph_add_scalar(h, th, 1.0f));
            if (map[n->out[0]] < 0)
                fail_msg("%s", regc_error_message());
            continue;
        }
        const regc_tensor *y = regc_graph_tensor(g, n->out[0]);
        assert_true(regc_graph_add_node(h, n->op, &n->attrs, n->n_in, in, n->n_out, o, y->ndim,
                                        y->shape) >= 0);
        for (int k = 0; k < n->n_out; k++)
            map[n->out[k]] = o[k];
    }
    for (int i = 0; i < regc_graph_n_outputs(g); i++)
        assert_int_equal(regc_graph_mark_output(h, map[regc_graph_output(g, i)]), REGC_OK);
    free(map);
    return h;
}

int64_t regc_test_embedding_padding(regc_model *m)
{
    regc_graph *g = NULL;
    assert_int_equal(regc_model_build_graph(m, 1, 4, &g), REGC_OK);
    const regc_node *n = regc_graph_node(g, 0);
    assert_int_equal(n->op, REGC_OP_EMBEDDING);
    const int64_t pad = n->attrs.padded ? n->attrs.padding_idx : -1;
    regc_graph_free(g);
    regc_model_free(m);
    return pad;
}

void regc_test_expect_regional_equals_full(regc_test_dir *f, regc_test_loader load,
                                           const char *extra, const char *what)
{
    regc_model *m = load(f, extra);
    regc_train_options o = regc_test_train_options(2, 16, 5);
    regc_program *p = NULL;
    regc_compile_stats st;
    assert_int_equal(regc_program_compile(m, o.batch, o.seq, &o.compile, &p, &st), REGC_OK);
    if (st.region_compiles != 1)
        fail_msg("%s: %d regions compiled", what, st.region_compiles);
    regc_program_free(p);
    regc_model_free(m);
    for (int level = 0; level < 2; level++) {
        regc_test_losses l[2];
        regc_model *trained[2];
        for (int regional = 0; regional < 2; regional++) {
            trained[regional] = load(f, extra);
            o.compile.regional = regional;
            o.compile.level = level ? REGC_LEVEL_O1 : REGC_LEVEL_O0;
            regc_test_train_model(trained[regional], &o, &l[regional]);
        }
        if (memcmp(l[0].loss, l[1].loss, sizeof l[0].loss) != 0)
            fail_msg("%s at O%d: regional %.9g, whole %.9g at step 0", what, level, l[1].loss[0],
                     l[0].loss[0]);
        regc_test_assert_same_weights(trained[0], trained[1]);
        regc_model_free(trained[0]);
        regc_model_free(trained[1]);
    }
}
