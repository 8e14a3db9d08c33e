/* lora.c — LoRA as PEFT defines it, on any architecture's graph.
 *
 * A linear layer is a MATMUL whose second operand is a 2-D parameter named
 * "<module>.weight" (nn.Linear's [out, in] read transposed, GPT-2's Conv1D
 * [in, out] read as it is). The layers `target_modules` names (PEFT's rule:
 * a list matches a module whose name is an entry or ends in "." and an
 * entry; a string is a regular expression the whole name must match;
 * "all-linear" is every linear layer but the output head) get two
 * parameters each, "<module>.lora_A.weight" [r, in] and
 * "<module>.lora_B.weight" [out, r], and every other parameter is frozen.
 *
 * The graph the architecture builds is then rewritten once per build: after
 * each targeted product y = x W (either layout), the adapter's
 *
 *   y' = y + s * (x A^T) B^T,   s = alpha / r  (rsLoRA: alpha / sqrt r)
 *
 * and every later reader of y reads y'. A and B are parameters of the layer
 * like its weight, so the detector still finds one layer kind and one
 * compile serves every layer. A starts as PEFT's Kaiming-uniform (a = sqrt 5:
 * uniform on +-1/sqrt(in)) from the run's seed, B as zeros; or both come
 * from a PEFT adapter directory. The model's weights block holds the
 * adapters first, then the frozen parameters, so the trained block is a
 * prefix of it. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

void regc_lora_free(regc_lora *l)
{
    if (!l)
        return;
    free(l->targets), free(l->adapter), free(l->base_of), free(l->conv1d), free(l);
}

/* The module a weight parameter belongs to: its name without ".weight"
 * into buf, or 0 when the name does not end so. */
static int module_of(const char *param, char *buf, size_t cap)
{
    size_t n = strlen(param), k = strlen(".weight");
    if (n <= k || strcmp(param + n - k, ".weight") || n - k >= cap)
        return 0;
    memcpy(buf, param, n - k);
    buf[n - k] = '\0';
    return 1;
}

/* A module's last name: "q_proj" of "model.layers.0.self_attn.q_proj". */
static const char *leaf_of(const char *module)
{
    const char *dot = strrchr(module, '.');
    return dot ? dot + 1 : module;
}

/* The distinct last names of parameters params[0 .. n) (weights of
 * modules), in order, separated by sep, into buf: what the messages, the
 * description and adapter_config.json's target_modules list. */
static void leaf_names(const regc_model *m, const int *params, int n, const char *sep, char *buf,
                       size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < n && at + 1 < cap; k++) {
        char module[512], other[512];
        if (!module_of(m->params[params[k]].name, module, sizeof module))
            continue;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = module_of(m->params[params[j]].name, other, sizeof other) &&
                   !strcmp(leaf_of(other), leaf_of(module));
        if (!seen)
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? sep : "", leaf_of(module));
    }
}

/* PEFT's check_target_module_exists for a list: the name is an entry or
 * ends in "." + an entry. */
static int list_matches(const char *list, const char *module)
{
    size_t n = strlen(module);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len > 0 && len <= n && !strncmp(module + n - len, p, len) &&
            (len == n || module[n - len - 1] == '.'))
            return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* The graph's linear layers: for each parameter, whether it is the weight
 * of a linear layer (1), of the output head (2: a product that reaches the
 * loss through views and a bias alone, or a weight an embedding also reads)
 * or neither (0); lookup_mm[i]: matrix products alone read it, and embedding
 * lookups of its rows (what a bf16 base may hold in bf16); conv1d[i]: the
 * product reads it as it is ([in, out], GPT-2's Conv1D), not transposed
 * (nn.Linear's [out, in]). */
static int find_linear(const regc_model *m, const regc_graph *g, char *kind, char *lookup_mm,
                       char *conv1d)
{
    int n_t = regc_graph_n_tensors(g);
    int *param_of = malloc(((size_t)n_t + 1) * sizeof *param_of);
    if (!param_of)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    for (int t = 0; t < n_t; t++)
        param_of[t] = -1;
    for (int i = 0; i < m->n_params; i++) {
        int t = regc_graph_find_tensor(g, m->params[i].name);
        if (t >= 0)
            param_of[t] = i;
        kind[i] = conv1d[i] = 0;
        lookup_mm[i] = t >= 0;
    }
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        for (int k = 0; k < n->n_in; k++)
            if (param_of[n->in[k]] >= 0 && n->op != REGC_OP_MATMUL &&
                !(n->op == REGC_OP_EMBEDDING && k == 1))
                lookup_mm[param_of[n->in[k]]] = 0;
    }
    int head = -1; /* the tensor whose product feeds the loss */
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        if (n->op == REGC_OP_CROSS_ENTROPY)
            head = n->in[0];
    }
    while (head >= 0 && regc_graph_tensor(g, head)->producer >= 0) {
        const regc_node *n = regc_graph_node(g, regc_graph_tensor(g, head)->producer);
        if (n->op == REGC_OP_MATMUL)
            break;
        head = n->op == REGC_OP_RESHAPE || n->op == REGC_OP_BIAS_ADD ? n->in[0] : -1;
    }
    for (int i = 0; i < regc_graph_n_nodes(g); i++) {
        const regc_node *n = regc_graph_node(g, i);
        int p = n->n_in > 1 ? param_of[n->in[1]] : -1;
        if (n->op == REGC_OP_EMBEDDING && param_of[n->in[1]] >= 0)
            kind[param_of[n->in[1]]] = 2;
        if (n->op != REGC_OP_MATMUL || p < 0 || n->attrs.trans_a || m->params[p].ndim != 2)
            continue;
        char module[512];
        if (kind[p] != 2 && module_of(m->params[p].name, module, sizeof module))
            kind[p] = n->out[0] == head ? 2 : 1;
        conv1d[p] = !n->attrs.trans_b;
    }
    free(param_of);
    return REGC_OK;
}

/* Which parameters the configuration targets: chosen[i] = 1. */
static int choose_targets(const regc_model *m, const regc_lora_config *c, const char *kind,
                          char *chosen, int *n_chosen)
{
    regex_t re;
    int regex = c->target_regex && strcmp(c->target_modules, "all-linear") != 0;
    if (regex) {
        size_t len = strlen(c->target_modules) + 8;
        char *full = malloc(len);
        if (!full)
            return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
        snprintf(full, len, "^(%s)$", c->target_modules);
        int bad = regcomp(&re, full, REG_EXTENDED | REG_NOSUB);
        free(full);
        if (bad)
            return regc_error(REGC_ERR_ARG,
                              "lora.target_modules: \"%s\" is not a regular expression",
                              c->target_modules);
    }
    *n_chosen = 0;
    for (int i = 0; i < m->n_params; i++) {
        char module[512];
        chosen[i] = 0;
        if (!kind[i] || !module_of(m->params[i].name, module, sizeof module))
            continue;
        if (!strcmp(c->target_modules, "all-linear"))
            chosen[i] = kind[i] == 1;
        else if (regex)
            chosen[i] = regexec(&re, module, 0, NULL, 0) == 0;
        else
            chosen[i] = list_matches(c->target_modules, module);
        *n_chosen += chosen[i];
    }
    if (regex)
        regfree(&re);
    if (*n_chosen > 0)
        return REGC_OK;
    /* name what there is to match */
    char names[400] = "";
    int *linear = malloc((size_t)m->n_params * sizeof *linear + 1), n = 0;
    for (int i = 0; linear && i < m->n_params; i++)
        if (kind[i] == 1)
            linear[n++] = i;
    if (linear)
        leaf_names(m, linear, n, ", ", names, sizeof names);
    free(linear);
    return regc_error(REGC_ERR_ARG,
                      "lora.target_modules: \"%s\" matches no linear layer of %s (its linear "
                      "layers: %s)",
                      c->target_modules, m->source, names[0] ? names : "none");
}

/* Offsets again: the trained parameters first, then the frozen ones, each
 * in list order; the weights (if any) move with them. And the frozen block:
 * each frozen parameter in its own dtype, 64-byte aligned. */
static int relayout(regc_model *m)
{
    m->frozen_bytes = 0;
    for (int i = 0; i < m->n_params; i++) {
        regc_model_param *p = &m->params[i];
        p->frozen_at = p->frozen ? m->frozen_bytes : 0;
        if (p->frozen)
            m->frozen_bytes += (regc_frozen_kind_bytes(p->frozen, p->numel) + 63) & ~63;
    }
    float *moved = NULL;
    if (m->weights && !(moved = malloc((size_t)m->total_numel * sizeof *moved + 1)))
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    int64_t at = 0;
    for (int frozen = 0; frozen < 2; frozen++)
        for (int i = 0; i < m->n_params; i++) {
            regc_model_param *p = &m->params[i];
            if ((p->frozen != 0) != frozen)
                continue;
            if (moved)
                memcpy(moved + at, m->weights + p->offset, (size_t)p->numel * sizeof *moved);
            p->offset = at;
            at += p->numel;
        }
    if (moved) {
        free(m->weights);
        m->weights = moved;
    }
    return REGC_OK;
}

/* How base parameter i is held: kind 1 (a linear layer's weight, not the
 * head's) and lookup_mm (read by matrix products and embedding lookups
 * alone) as find_linear says.
 * In NF4 as bitsandbytes quantises a model: every linear layer's weight
 * but the head's, which Transformers keeps (llm_int8_skip_modules). */
static int base_kind(const regc_lora_config *c, int kind, int lookup_mm)
{
    if (c->load_in_4bit && lookup_mm && kind == 1) /* kind 1: never an embedding's */
        return c->compute_bf16 ? REGC_FROZEN_NF4_BF16 : REGC_FROZEN_NF4;
    if (c->base_dtype == REGC_BASE_BF16 && lookup_mm)
        return REGC_FROZEN_BF16;
    return 1;
}

static const char *base_dtype_note(const regc_lora_config *c)
{
    if (c->load_in_4bit)
        return c->base_dtype == REGC_BASE_BF16
                   ? (c->compute_bf16 ? "; the base's linear layers in NF4, multiplied in bf16, "
                                        "the head in bf16"
                                      : "; the base's linear layers in NF4, the head in bf16")
                   : (c->compute_bf16 ? "; the base's linear layers in NF4, multiplied in bf16"
                                      : "; the base's linear layers in NF4");
    return c->base_dtype == REGC_BASE_BF16 ? "; the base's linear weights held in bf16" : "";
}

int regc_model_add_lora(regc_model *m, const regc_lora_config *given)
{
    regc_lora_config d = *given; /* PEFT's defaults where unset */
    if (d.alpha == 0.0)
        d.alpha = 8.0;
    if (!d.target_modules)
        d.target_modules = m->arch->peft_targets;
    /* a checkpoint saved in 4 bits is NF4, as Transformers loads it, with
     * the compute dtype its config says */
    if (m->checkpoint_nf4) {
        const int saved_bf16 = m->checkpoint_nf4 == REGC_FROZEN_NF4_BF16;
        if (d.compute_given && d.compute_bf16 != saved_bf16)
            return regc_error(REGC_ERR_ARG,
                              "quantization.bnb_4bit_compute_dtype: %s, but %s's "
                              "quantization_config says %s",
                              d.compute_bf16 ? "bfloat16" : "float32", m->source,
                              saved_bf16 ? "bfloat16" : "float32");
        d.load_in_4bit = 1, d.compute_bf16 = saved_bf16;
    }
    const regc_lora_config *c = &d;
    if (m->lora)
        return regc_error(REGC_ERR_ARG, "%s: the model has LoRA adapters already", m->source);
    if (c->r < 1 || c->r > 65536)
        return regc_error(REGC_ERR_ARG, "lora.r: %lld (a rank of at least 1)", (long long)c->r);
    if (!(c->alpha > 0.0) || !isfinite(c->alpha))
        return regc_error(REGC_ERR_ARG, "lora.lora_alpha: %g (a positive number)", c->alpha);
    if (!(c->dropout >= 0.0 && c->dropout < 1.0))
        return regc_error(REGC_ERR_ARG, "lora.lora_dropout: %g (in [0, 1))", c->dropout);
    if (!c->target_modules || !c->target_modules[0])
        return regc_error(REGC_ERR_ARG,
                          "lora.target_modules: none given, and PEFT has no default for %s's "
                          "model_type \"%s\"",
                          m->source, m->arch->model_type);
    /* the linear layers, from a graph of the smallest shape (a graph
     * model's own: it has one) */
    int64_t batch = 1, seq = 1;
    if (m->arch == &regc_arch_graph)
        regc_graph_model_shape(m, &batch, &seq);
    regc_graph *g = NULL;
    int rc = m->arch->build_graph(m, batch, seq, &g);
    char *kind = malloc((size_t)m->n_params + 1), *chosen = malloc((size_t)m->n_params + 1);
    char *lookup_mm = malloc((size_t)m->n_params + 1), *conv1d = malloc((size_t)m->n_params + 1);
    regc_lora *l = calloc(1, sizeof *l);
    int n_chosen = 0;
    if (rc == REGC_OK && (!kind || !chosen || !lookup_mm || !conv1d || !l))
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    if (rc == REGC_OK)
        rc = find_linear(m, g, kind, lookup_mm, conv1d);
    if (rc == REGC_OK)
        rc = choose_targets(m, c, kind, chosen, &n_chosen);
    if (rc == REGC_OK) {
        l->cfg = *c;
        l->n_base = m->n_params;
        l->targets = strdup(c->target_modules);
        l->adapter = c->adapter ? strdup(c->adapter) : NULL;
        l->base_of = malloc((size_t)n_chosen * sizeof *l->base_of + 1);
        l->conv1d = malloc((size_t)n_chosen + 1);
        l->scale = (float)(c->use_rslora ? c->alpha / sqrt((double)c->r) : c->alpha / (double)c->r);
        if (!l->targets || (c->adapter && !l->adapter) || !l->base_of || !l->conv1d)
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
        l->cfg.target_modules = l->targets, l->cfg.adapter = l->adapter;
    }
    const int n_base = m->n_params;
    for (int i = 0; i < n_base && rc == REGC_OK; i++) {
        m->params[i].frozen = base_kind(c, kind[i], lookup_mm[i]);
        /* bitsandbytes quantises a Conv1D's weight transposed ([out, in],
         * Transformers' rule), which regc's NF4 weights are not */
        if (conv1d[i] && (m->params[i].frozen == REGC_FROZEN_NF4 ||
                          m->params[i].frozen == REGC_FROZEN_NF4_BF16)) {
            rc = regc_error(REGC_ERR_UNSUPPORTED,
                            "quantization.load_in_4bit: %s is a Conv1D weight ([in, out]), which "
                            "bitsandbytes quantises transposed; regc does not hold one in NF4 yet",
                            m->params[i].name);
            break;
        }
        if (!chosen[i])
            continue;
        const regc_model_param w = m->params[i]; /* a copy: adding moves the list */
        char module[512], name[600];
        module_of(w.name, module, sizeof module);
        const int64_t in = w.shape[conv1d[i] ? 0 : 1], out = w.shape[conv1d[i] ? 1 : 0];
        snprintf(name, sizeof name, "%s.lora_A.weight", module);
        rc = regc_model_add_2d(m, name, 2, c->r, in, 0.0f, (float)(1.0 / sqrt((double)in)));
        snprintf(name, sizeof name, "%s.lora_B.weight", module);
        if (rc == REGC_OK)
            rc = regc_model_add_2d(m, name, 2, out, c->r, 0.0f, 0.0f);
        l->conv1d[l->n_modules] = conv1d[i];
        l->base_of[l->n_modules++] = i;
    }
    regc_graph_free(g);
    free(kind), free(chosen), free(lookup_mm), free(conv1d);
    if (rc == REGC_OK && m->weights) { /* room for the adapters, drawn from the seed */
        float *grown = realloc(m->weights, (size_t)m->total_numel * sizeof *grown + 1);
        if (!grown)
            rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
        else
            m->weights = grown;
        for (int i = n_base; i < m->n_params && rc == REGC_OK; i++)
            regc_rng_fill_uniform(m->weights + m->params[i].offset, (size_t)m->params[i].numel,
                                  regc_rng_substream(c->seed, (uint64_t)i),
                                  m->params[i].init_center, m->params[i].init_halfwidth);
    }
    if (rc == REGC_OK)
        rc = relayout(m);
    if (rc) { /* the model as it was */
        for (int i = n_base; i < m->n_params; i++) {
            m->total_numel -= m->params[i].numel;
            free(m->params[i].name);
        }
        m->n_params = n_base;
        for (int i = 0; i < n_base; i++)
            m->params[i].frozen = 0;
        relayout(m);
        regc_lora_free(l);
        return rc;
    }
    m->lora = l;
    return REGC_OK;
}

int regc_model_has_lora(const regc_model *m) { return m->lora != NULL; }

int regc_model_param_frozen(const regc_model *m, int i)
{
    return i >= 0 && i < m->n_params ? m->params[i].frozen : 0;
}

int64_t regc_model_param_frozen_at(const regc_model *m, int i)
{
    return i >= 0 && i < m->n_params && m->params[i].frozen ? m->params[i].frozen_at : -1;
}

int64_t regc_model_frozen_bytes(const regc_model *m) { return m->frozen_bytes; }

int64_t regc_model_trainable_numel(const regc_model *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += m->params[i].frozen ? 0 : m->params[i].numel;
    return n;
}

int regc_lora_write_structure(const regc_model *m, regc_bytes *b)
{
    const regc_lora *l = m->lora;
    regc_bytes_put_str(b, "lora");
    regc_bytes_put_i64(b, l->cfg.r);
    regc_bytes_put_f32(b, l->scale);
    regc_bytes_put_f32(b, (float)l->cfg.dropout);
    regc_bytes_put_i64(b, l->n_modules);
    for (int k = 0; k < l->n_modules; k++)
        regc_bytes_put_i64(b, l->base_of[k]);
    for (int i = 0; i < m->n_params; i++) /* what is held in bf16 */
        regc_bytes_put_i64(b, m->params[i].frozen);
    return b->failed ? regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source) : REGC_OK;
}

/* The adapter of module k after product node n's output y:
 * y + s (dropout(x) A^T) B^T, the dropout's site A's own. */
static int add_adapter(const regc_model *m, regc_graph *h, int x, int y, int k, int *out)
{
    const regc_lora *l = m->lora;
    int a = regc_graph_find_tensor(h, m->params[l->n_base + 2 * k].name);
    int b = regc_graph_find_tensor(h, m->params[l->n_base + 2 * k + 1].name);
    if (a < 0 || b < 0)
        return regc_error(REGC_ERR_ARG, "%s: the graph lacks LoRA parameter %s", m->source,
                          m->params[l->n_base + 2 * k + (a >= 0)].name);
    int rc = regc_model_dropout(m, h, x, a, l->cfg.dropout, &x); /* [..., in] */
    if (rc)
        return rc;
    int t = regc_graph_matmul(h, x, a, 0, 1);                   /* [..., r] */
    int d = t < 0 ? t : regc_graph_matmul(h, t, b, 0, 1);       /* [..., out] */
    int s = d < 0 ? d : regc_graph_scale(h, d, m->lora->scale); /* [..., out] */
    *out = s < 0 ? s : regc_graph_add(h, y, s);                 /* [..., out] */
    return *out < 0 ? *out : REGC_OK;
}

int regc_lora_rewrite(const regc_model *m, regc_graph *g, regc_graph **out)
{
    *out = NULL;
    const regc_lora *l = m->lora;
    if (l->cfg.dropout > 0.0 && !m->dropout)
        return regc_error(REGC_ERR_UNSUPPORTED,
                          "lora.lora_dropout: %g is applied with train.dropout on (off, the run "
                          "would train without it); set lora_dropout 0 or train.dropout on",
                          l->cfg.dropout);
    int n_t = regc_graph_n_tensors(g), n_n = regc_graph_n_nodes(g);
    int *map = malloc(((size_t)n_t + 1) * sizeof *map);
    int *module = malloc(((size_t)n_t + 1) * sizeof *module); /* a targeted weight's module */
    regc_graph *h = regc_graph_new();
    int rc =
        map && module && h ? REGC_OK : regc_error(REGC_ERR_MEMORY, "%s: out of memory", m->source);
    for (int t = 0; t < n_t && rc == REGC_OK; t++)
        module[t] = -1;
    for (int k = 0; k < l->n_modules && rc == REGC_OK; k++) {
        int t = regc_graph_find_tensor(g, m->params[l->base_of[k]].name);
        if (t >= 0)
            module[t] = k;
    }
    if (rc == REGC_OK)
        rc = regc_graph_copy_leaves(g, h, map);
    /* a graph model's graph knows neither the adapters nor what is frozen:
     * the model says */
    for (int i = 0; rc == REGC_OK && i < m->n_params; i++) {
        const regc_model_param *q = &m->params[i];
        int t = regc_graph_find_tensor(h, q->name);
        if (t < 0 && (t = regc_graph_add_tensor(h, q->name, REGC_F32, REGC_ROLE_PARAM, q->ndim,
                                                q->shape)) < 0)
            rc = t;
        else
            rc = regc_graph_set_frozen(h, t, q->frozen);
    }
    for (int i = 0; rc == REGC_OK && i < n_n; i++) {
        const regc_node *n = regc_graph_node(g, i);
        int in[REGC_MAX_IO], o[REGC_MAX_IO];
        for (int k = 0; k < n->n_in; k++)
            in[k] = map[n->in[k]];
        const regc_tensor *y = regc_graph_tensor(g, n->out[0]);
        rc = regc_graph_add_node(h, n->op, &n->attrs, n->n_in, in, n->n_out, o, y->ndim, y->shape);
        for (int k = 0; rc >= 0 && k < n->n_out; k++)
            map[n->out[k]] = o[k];
        rc = rc < 0 ? rc : REGC_OK;
        if (rc == REGC_OK && n->op == REGC_OP_MATMUL && module[n->in[1]] >= 0)
            rc = add_adapter(m, h, in[0], o[0], module[n->in[1]], &map[n->out[0]]);
    }
    for (int i = 0; rc == REGC_OK && i < regc_graph_n_outputs(g); i++)
        rc = regc_graph_mark_output(h, map[regc_graph_output(g, i)]);
    free(map), free(module);
    if (rc) {
        regc_graph_free(h);
        return rc;
    }
    *out = h;
    return REGC_OK;
}

/* PEFT's task type for the architecture (what PeftModel wraps it as). */
static const char *task_type(const regc_model *m)
{
    const char *a = m->arch->model_type;
    return !strcmp(a, "t5") ? "SEQ_2_SEQ_LM" : !strcmp(a, "bert") ? NULL : "CAUSAL_LM";
}

int regc_lora_save_config(const regc_model *m, const char *dir)
{
    const regc_lora *l = m->lora;
    cJSON *o = cJSON_CreateObject(), *targets = NULL;
    int conv1d = 0; /* PEFT's fan_in_fan_out: the layers are Conv1D (GPT-2's) */
    for (int k = 0; k < l->n_modules; k++)
        conv1d |= l->conv1d[k];
    char names[1024];
    leaf_names(m, l->base_of, l->n_modules, ",", names, sizeof names);
    if (o && l->cfg.target_regex)
        targets = cJSON_CreateString(l->targets);
    else if (o && (targets = cJSON_CreateArray())) /* the layers' own names, once each */
        for (char *save = NULL, *p = strtok_r(names, ",", &save); p; p = strtok_r(NULL, ",", &save))
            cJSON_AddItemToArray(targets, cJSON_CreateString(p));
    if (o && targets) {
        cJSON_AddStringToObject(o, "peft_type", "LORA");
        const char *task = task_type(m);
        if (task)
            cJSON_AddStringToObject(o, "task_type", task);
        else
            cJSON_AddNullToObject(o, "task_type");
        cJSON_AddStringToObject(o, "base_model_name_or_path", m->source);
        cJSON_AddNumberToObject(o, "r", (double)l->cfg.r);
        cJSON_AddNumberToObject(o, "lora_alpha", l->cfg.alpha);
        cJSON_AddNumberToObject(o, "lora_dropout", l->cfg.dropout);
        cJSON_AddBoolToObject(o, "use_rslora", l->cfg.use_rslora);
        cJSON_AddItemToObject(o, "target_modules", targets);
        targets = NULL;
        cJSON_AddStringToObject(o, "bias", "none");
        cJSON_AddBoolToObject(o, "fan_in_fan_out", conv1d);
        cJSON_AddBoolToObject(o, "inference_mode", 1);
        cJSON_AddBoolToObject(o, "use_dora", 0);
    }
    cJSON_Delete(targets);
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory writing adapter_config.json", dir);
    char path[4096];
    size_t len = strlen(text);
    char *line = malloc(len + 2); /* a text file ends in a newline */
    int rc = line ? regc_path_join(path, sizeof path, dir, "adapter_config.json")
                  : regc_error(REGC_ERR_MEMORY, "%s: out of memory", dir);
    if (rc == REGC_OK) {
        memcpy(line, text, len);
        line[len] = '\n';
        rc = regc_file_write_atomic(path, line, len + 1);
    }
    free(line);
    cJSON_free(text);
    return rc;
}

int regc_lora_targets_from_json(const cJSON *it, char *buf, size_t cap, int *regex)
{
    buf[0] = '\0';
    *regex = 0;
    if (cJSON_IsString(it) && it->valuestring[0] && strlen(it->valuestring) < cap) {
        snprintf(buf, cap, "%s", it->valuestring);
        *regex = strcmp(it->valuestring, "all-linear") != 0;
        return 0;
    }
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) < 1)
        return -1;
    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach (e, it) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, ',') ||
            n + strlen(e->valuestring) + 2 >= cap)
            return -1;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "," : "", e->valuestring);
    }
    return 0;
}

/* A key of adapter_config.json that changes the math in ways regc does not
 * train: absent, null, empty ({} or []), false, or the string `plain`. */
static int key_plain(const cJSON *root, const char *path, const char *key, const char *plain)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!x || cJSON_IsNull(x) || cJSON_IsFalse(x) ||
        ((cJSON_IsObject(x) || cJSON_IsArray(x)) && !x->child) ||
        (plain && cJSON_IsString(x) && !strcmp(x->valuestring, plain)))
        return REGC_OK;
    return regc_error(REGC_ERR_UNSUPPORTED, "%s: %s: only %s is supported", path, key,
                      plain ? plain : "the default (null, false or empty)");
}

int regc_lora_read_config(const char *dir, regc_lora_config *c, char *targets, size_t cap)
{
    char path[4096];
    int rc = regc_path_join(path, sizeof path, dir, "adapter_config.json");
    char *text = NULL;
    size_t len = 0;
    if (rc || (rc = regc_file_read_all(path, &text, &len)) < 0)
        return rc < 0 ? rc : REGC_ERR_IO;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return regc_error(REGC_ERR_FORMAT, "%s: malformed JSON", path);
    }
    const char *type = NULL;
    int64_t r = 0;
    double alpha = 0.0, dropout = 0.0;
    int rslora = 0;
    rc = regc_cfg_string(root, path, "peft_type", 1, NULL, &type);
    if (rc == REGC_OK && strcmp(type, "LORA") != 0)
        rc = regc_error(REGC_ERR_UNSUPPORTED, "%s: peft_type: %s (only LORA)", path, type);
    if (rc == REGC_OK)
        rc = regc_cfg_int(root, path, "r", 1, 0, 1, 65536, &r);
    if (rc == REGC_OK)
        rc = regc_cfg_double(root, path, "lora_alpha", 1, 0.0, 1e-30, 1e30, &alpha);
    if (rc == REGC_OK)
        rc = regc_cfg_double(root, path, "lora_dropout", 0, 0.0, 0.0, 0.999, &dropout);
    if (rc == REGC_OK)
        rc = regc_cfg_bool(root, path, "use_rslora", 0, 0, &rslora);
    /* what would change the math and regc does not do */
    static const char *const plain[][2] = {{"bias", "none"},
                                           {"use_dora", NULL},
                                           {"layers_to_transform", NULL},
                                           {"modules_to_save", NULL},
                                           {"rank_pattern", NULL},
                                           {"alpha_pattern", NULL},
                                           {"lora_bias", NULL},
                                           {"use_qalora", NULL},
                                           {"exclude_modules", NULL},
                                           {"target_parameters", NULL},
                                           {"trainable_token_indices", NULL},
                                           {"layer_replication", NULL}};
    for (size_t i = 0; i < sizeof plain / sizeof *plain && rc == REGC_OK; i++)
        rc = key_plain(root, path, plain[i][0], plain[i][1]);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    if (rc == REGC_OK && regc_lora_targets_from_json(t, targets, cap, &c->target_regex))
        rc = regc_error(REGC_ERR_FORMAT,
                        "%s: target_modules: a list of module names or a regular expression", path);
    cJSON_Delete(root);
    if (rc)
        return rc;
    const int regex = c->target_regex;
    memset(c, 0, sizeof *c);
    c->r = r, c->alpha = alpha, c->dropout = dropout, c->use_rslora = rslora;
    c->target_regex = regex;
    c->target_modules = targets;
    c->adapter = dir;
    return REGC_OK;
}

void regc_lora_describe(const regc_model *m, char *buf, size_t cap)
{
    const regc_lora *l = m->lora;
    char names[300], trained[32], total[32];
    leaf_names(m, l->base_of, l->n_modules, ", ", names, sizeof names);
    regc_model_group_digits(trained, sizeof trained, regc_model_trainable_numel(m));
    regc_model_group_digits(total, sizeof total, m->total_numel);
    snprintf(
        buf, cap,
        "LoRA r=%lld, alpha %g%s (scale %g) on %d layers (%s)%s%s: %s of %s parameters trained%s",
        (long long)l->cfg.r, l->cfg.alpha, l->cfg.use_rslora ? ", rsLoRA" : "", (double)l->scale,
        l->n_modules, names, l->adapter ? ", from " : "", l->adapter ? l->adapter : "", trained,
        total, base_dtype_note(&l->cfg));
}

/* ---------------------------------------------------------------- merging */

int regc_model_merge_lora(regc_model *m)
{
    regc_lora *l = m->lora;
    if (!l || !m->weights)
        return regc_error(REGC_ERR_ARG, "%s: %s", m->source,
                          !l ? "no LoRA adapters to merge" : "no weights to merge into");
    for (int k = 0; k < l->n_modules; k++) {
        const regc_model_param *w = &m->params[l->base_of[k]];
        const regc_model_param *a = &m->params[l->n_base + 2 * k];     /* [r, in] */
        const regc_model_param *b = &m->params[l->n_base + 2 * k + 1]; /* [out, r] */
        const int64_t r = a->shape[0], in = a->shape[1], out = b->shape[0];
        const float *A = m->weights + a->offset, *B = m->weights + b->offset;
        float *W = m->weights + w->offset; /* [out, in], or Conv1D's [in, out] */
        for (int64_t o = 0; o < out; o++)
            for (int64_t i = 0; i < in; i++) {
                double d = 0.0; /* (B A)[o, i] */
                for (int64_t j = 0; j < r; j++)
                    d += (double)B[o * r + j] * (double)A[j * in + i];
                W[l->conv1d[k] ? i * out + o : o * in + i] += (float)(d * (double)l->scale);
            }
    }
    /* the base alone again, every parameter trained */
    for (int i = l->n_base; i < m->n_params; i++) {
        m->total_numel -= m->params[i].numel;
        free(m->params[i].name);
    }
    m->n_params = l->n_base;
    for (int i = 0; i < m->n_params; i++)
        m->params[i].frozen = 0;
    m->lora = NULL;
    regc_lora_free(l);
    return relayout(m);
}
