/* decay.c — which trained parameters AdamW's weight decay applies to.
 *
 * train.weight_decay_params chooses between two groupings:
 *
 *   all            every trained parameter: regc's default, DeepSpeed's
 *                  optimizer, torch's AdamW over model.parameters()
 *   not_bias_norm  Transformers' Trainer (get_decay_parameter_names):
 *                  biases and norm weights form a group of weight_decay 0
 *
 * Transformers leaves out a parameter of an nn.LayerNorm module, and one
 * whose lower-cased name matches "bias", "layernorm", "rmsnorm",
 * "(^|\.)norm($|\.)" or "_norm($|\.)". regc knows the parameters of an
 * nn.LayerNorm from the graph, as the scale and shift of a LayerNorm op
 * (GPT-2's ln_1, whose name says nothing of a norm); the names, as the
 * checkpoint spells them, catch the RMSNorms of the decoder families and
 * T5's layer_norm.
 *
 * The step program's update is one AdamW over the parameter block; the
 * trainer hands it the ranges of the block that do not decay. Under ZeRO-3
 * a rank's block holds its shard of every unit, and where a parameter
 * falls in it differs from rank to rank while every rank runs one program,
 * so each rank lists the parts it holds. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "trainer.h"

const char *const regc_decay_params_names[] = {"all", "not_bias_norm", NULL};

/* The first place at or after `from` where `word` stands, whatever its
 * case; NULL when nowhere. */
static const char *find_nocase(const char *from, const char *word)
{
    const size_t len = strlen(word);
    for (; *from; from++)
        if (!strncasecmp(from, word, len))
            return from;
    return NULL;
}

int regc_train_name_decays(const char *name)
{
    if (find_nocase(name, "bias") || find_nocase(name, "layernorm") || find_nocase(name, "rmsnorm"))
        return 0;
    for (const char *at = find_nocase(name, "norm"); at; at = find_nocase(at + 1, "norm")) {
        const int ends = at[4] == '\0' || at[4] == '.';             /* the component ends with it */
        if (ends && (at == name || at[-1] == '.' || at[-1] == '_')) /* "norm", "..._norm" */
            return 0;
    }
    return 1;
}

int regc_train_decayed_params(const regc_model *m, int params_kind, int64_t batch, int64_t seq,
                              unsigned char *decays)
{
    const int n = regc_model_n_params(m);
    for (int i = 0; i < n; i++)
        decays[i] = 1;
    if (params_kind == REGC_DECAY_ALL)
        return REGC_OK;
    regc_graph *g = NULL;
    int rc = regc_model_build_graph(m, batch, seq, &g);
    if (rc)
        return rc;
    unsigned char *layernorm = calloc((size_t)regc_graph_n_tensors(g) + 1, 1);
    if (!layernorm) {
        regc_graph_free(g);
        return regc_error(REGC_ERR_MEMORY, "out of memory");
    }
    for (int k = 0; k < regc_graph_n_nodes(g); k++) {
        const regc_node *nd = regc_graph_node(g, k);
        for (int j = 1; nd->op == REGC_OP_LAYERNORM && j < nd->n_in; j++) /* scale, shift */
            if (nd->in[j] >= 0)
                layernorm[nd->in[j]] = 1;
    }
    for (int i = 0; i < n; i++) {
        const char *name = regc_model_param_name(m, i);
        const int t = regc_graph_find_tensor(g, name);
        decays[i] = (unsigned char)(regc_train_name_decays(name) && !(t >= 0 && layernorm[t]));
    }
    free(layernorm);
    regc_graph_free(g);
    return REGC_OK;
}

int regc_trainer_no_decay(trainer *t, const regc_train_options *o)
{
    free(t->no_decay);
    t->no_decay = NULL, t->n_no_decay = 0;
    if (o->weight_decay_params == REGC_DECAY_ALL || o->weight_decay == 0.0f)
        return REGC_OK; /* nothing decays differently */
    const regc_model *m = t->model;
    const int n = regc_model_n_params(m);
    unsigned char *decays = malloc((size_t)n + 1);
    int64_t *r = malloc(((size_t)n + 1) * 2 * sizeof *r); /* [n][2] at most */
    int rc = decays && r
                 ? regc_train_decayed_params(m, o->weight_decay_params, o->batch, o->seq, decays)
                 : regc_error(REGC_ERR_MEMORY, "out of memory");
    int k = 0;
    for (int i = 0, j = 0; rc == REGC_OK && i < n; i++) {
        if (regc_model_param_frozen(m, i))
            continue;
        int64_t first, len, at;
        regc_trainer_param_part(t, i, j++, &first, &len, &at);
        if (!decays[i] && len > 0)
            r[2 * k] = at, r[2 * k + 1] = at + len, k++;
    }
    free(decays);
    if (rc) {
        free(r);
        return rc;
    }
    /* in the block's order, neighbours joined: one AdamW call per run */
    qsort(r, (size_t)k, 2 * sizeof *r, regc_cmp_i64); /* by their starts */
    int runs = 0;
    for (int i = 0; i < k; i++) {
        if (runs > 0 && r[2 * i] <= r[2 * runs - 1]) {
            if (r[2 * i + 1] > r[2 * runs - 1])
                r[2 * runs - 1] = r[2 * i + 1];
            continue;
        }
        r[2 * runs] = r[2 * i], r[2 * runs + 1] = r[2 * i + 1], runs++;
    }
    t->no_decay = r, t->n_no_decay = runs;
    return REGC_OK;
}
