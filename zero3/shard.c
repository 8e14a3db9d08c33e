/* shard.c — ZeRO-3's layout of model state (regc_zero3.h): units padded to
 * an even split, each rank's shard of every unit one after another, and
 * the copies between a model-ordered block and the shards. */
#include <stdlib.h>
#include <string.h>

#include "regc_zero3.h"

void regc_shard_layout_free(regc_shard_layout *l)
{
    if (!l)
        return;
    free(l->unit_floats), free(l->unit_padded), free(l->unit_shard), free(l->shard_offset);
    free(l->param_unit), free(l->param_offset), free(l->param_numel), free(l->model_offset);
    free(l);
}

int regc_shard_layout_same(const regc_shard_layout *a, const regc_shard_layout *b)
{
    if (!a || !b)
        return a == b;
    if (a->ranks != b->ranks || a->n_units != b->n_units || a->n_params != b->n_params ||
        a->shard_floats != b->shard_floats || a->model_floats != b->model_floats)
        return 0;
    const size_t nu = (size_t)a->n_units * sizeof(int64_t), np = (size_t)a->n_params;
    return !memcmp(a->unit_padded, b->unit_padded, nu) &&
           !memcmp(a->shard_offset, b->shard_offset, nu) &&
           !memcmp(a->param_unit, b->param_unit, np * sizeof(int)) &&
           !memcmp(a->param_offset, b->param_offset, np * sizeof(int64_t)) &&
           !memcmp(a->param_numel, b->param_numel, np * sizeof(int64_t)) &&
           !memcmp(a->model_offset, b->model_offset, np * sizeof(int64_t));
}

int regc_shard_layout_new(int ranks, int n_params, const int64_t *numel,
                          const int64_t *model_offset, const int *unit_of, int n_units,
                          regc_shard_layout **out)
{
    *out = NULL;
    if (ranks < 1 || n_params < 0 || n_units < 0)
        return regc_error(REGC_ERR_ARG, "shard layout: %d ranks, %d parameters, %d units", ranks,
                          n_params, n_units);
    regc_shard_layout *l = calloc(1, sizeof *l);
    size_t nu = (size_t)n_units + 1, np = (size_t)n_params + 1;
    if (l) {
        l->unit_floats = calloc(nu, sizeof *l->unit_floats);
        l->unit_padded = calloc(nu, sizeof *l->unit_padded);
        l->unit_shard = calloc(nu, sizeof *l->unit_shard);
        l->shard_offset = calloc(nu, sizeof *l->shard_offset);
        l->param_unit = calloc(np, sizeof *l->param_unit);
        l->param_offset = calloc(np, sizeof *l->param_offset);
        l->param_numel = calloc(np, sizeof *l->param_numel);
        l->model_offset = calloc(np, sizeof *l->model_offset);
    }
    if (!l || !l->unit_floats || !l->unit_padded || !l->unit_shard || !l->shard_offset ||
        !l->param_unit || !l->param_offset || !l->param_numel || !l->model_offset) {
        regc_shard_layout_free(l);
        return regc_error(REGC_ERR_MEMORY, "shard layout: out of memory");
    }
    l->ranks = ranks, l->n_units = n_units, l->n_params = n_params;
    for (int i = 0; i < n_params; i++) {
        int u = unit_of[i];
        if (u < 0 || u >= n_units || numel[i] < 0 || model_offset[i] < 0) {
            regc_shard_layout_free(l);
            return regc_error(REGC_ERR_ARG, "shard layout: parameter %d in no unit", i);
        }
        l->param_unit[i] = u;
        l->param_numel[i] = numel[i];
        l->model_offset[i] = model_offset[i];
        if (model_offset[i] + numel[i] > l->model_floats)
            l->model_floats = model_offset[i] + numel[i];
        l->param_offset[i] = l->unit_floats[u];
        l->unit_floats[u] += numel[i];
    }
    const int64_t step = (int64_t)ranks * REGC_SHARD_ALIGN;
    for (int u = 0; u < n_units; u++) {
        int64_t f = l->unit_floats[u];
        l->unit_padded[u] = (f + step - 1) / step * step;
        l->unit_shard[u] = l->unit_padded[u] / ranks;
        l->shard_offset[u] = l->shard_floats;
        l->shard_floats += l->unit_shard[u];
    }
    *out = l;
    return REGC_OK;
}

void regc_shard_param_part(const regc_shard_layout *l, int i, int rank, int64_t *first, int64_t *n,
                           int64_t *at)
{
    int u = l->param_unit[i];
    int64_t lo = (int64_t)rank * l->unit_shard[u], hi = lo + l->unit_shard[u];
    int64_t a = l->param_offset[i], b = a + l->param_numel[i];
    int64_t from = a > lo ? a : lo, to = b < hi ? b : hi;
    *n = from < to ? to - from : 0;
    *first = from < to ? from - a : 0;
    *at = l->shard_offset[u] + (from < to ? from - lo : 0);
}

void regc_shard_take(const regc_shard_layout *l, int rank, const float *model, float *shard)
{
    memset(shard, 0, (size_t)l->shard_floats * sizeof *shard);
    for (int i = 0; i < l->n_params; i++) {
        int64_t first, n, at;
        regc_shard_param_part(l, i, rank, &first, &n, &at);
        if (n > 0)
            memcpy(shard + at, model + l->model_offset[i] + first, (size_t)n * sizeof *shard);
    }
}

void regc_shard_join(const regc_shard_layout *l, const float *all_shards, float *model)
{
    for (int r = 0; r < l->ranks; r++)
        for (int i = 0; i < l->n_params; i++) {
            int64_t first, n, at;
            regc_shard_param_part(l, i, r, &first, &n, &at);
            if (n > 0)
                memcpy(model + l->model_offset[i] + first, all_shards + r * l->shard_floats + at,
                       (size_t)n * sizeof *model);
        }
}
