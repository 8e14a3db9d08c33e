/* trainer_state.c — a run's weights and moments in and out of the device
 * blocks: each rank reads only its shards of the sources at start-up, a
 * chunk at a time, and checkpoints and --save stream the blocks one gather
 * unit at a time, rank 0 writing, so no rank holds the whole model. The
 * frozen parameters (a LoRA model's base) are read once into a block of
 * their own (under ZeRO-3 each rank's shard of it, in the bytes they are
 * held in) and never written back: saved, a LoRA model is its adapter. */
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "trainer.h"

void regc_trainer_param_part(const trainer *t, int i, int j, int64_t *first, int64_t *n,
                             int64_t *at)
{
    if (t->shards) {
        regc_shard_param_part(t->shards, j, t->comm->rank, first, n, at);
        return;
    }
    *first = 0;
    *n = regc_model_param_numel(t->model, i);
    *at = regc_model_param_offset(t->model, i);
}

/* Parts of a source pass through a host buffer of this many floats on
 * their way to the device: a rank never needs host memory for its whole
 * shard, and the reads land in memory already touched. */
#define LOAD_CHUNK (INT64_C(4) << 20)

/* A device block from a model-ordered host block (the model's weights) or
 * from a source, of which this rank reads only its parts, a chunk at a time
 * (*load_ms: the time reading and copying took, after the block was
 * zeroed: padding stays 0). */
static int block_to_device(trainer *t, regc_backend *be, float *dev, const float *model,
                           regc_weights *src, double *load_ms)
{
    if (!t->shards && !src) {
        be->copy_h2d(be, dev, model, (size_t)t->block * sizeof(float));
        return be->sync(be);
    }
    be->fill(be, dev, (size_t)t->block, 0.0f);
    int rc = be->sync(be);
    float *chunk = src ? malloc((size_t)LOAD_CHUNK * sizeof *chunk) : NULL;
    if (src && !chunk)
        return regc_error(REGC_ERR_MEMORY, "out of memory for a %lld-float buffer",
                          (long long)LOAD_CHUNK);
    double t0 = regc_time_ms();
    for (int i = 0, j = 0; i < regc_model_n_params(t->model) && rc == REGC_OK; i++) {
        if (regc_model_param_frozen(t->model, i))
            continue;
        int64_t first, n, at;
        regc_trainer_param_part(t, i, j++, &first, &n, &at);
        for (int64_t done = 0; done < n && rc == REGC_OK; done += LOAD_CHUNK) {
            int64_t k = n - done < LOAD_CHUNK ? n - done : LOAD_CHUNK;
            const float *from =
                src ? chunk : model + regc_model_param_offset(t->model, i) + first + done;
            if (src && (rc = regc_weights_read(src, i, first + done, k, chunk)))
                break;
            be->copy_h2d(be, dev + at + done, from, (size_t)k * sizeof(float));
            rc = src ? be->sync(be) : REGC_OK; /* before the buffer is reused */
        }
    }
    if (rc == REGC_OK)
        rc = be->sync(be);
    *load_ms += regc_time_ms() - t0;
    free(chunk);
    return rc;
}

/* Bytes [at, at + n) of frozen parameter i, the j-th frozen one (the
 * frozen layout's numbering), onto the device: into the frozen block, or
 * under ZeRO-3 the part of them this rank's shard holds. */
static void frozen_put(trainer *t, int i, int j, int64_t at, const void *bytes, int64_t n)
{
    regc_backend *be = t->be;
    const regc_shard_layout *l = t->frozen_shards;
    char *dev = t->frozen;
    if (!l) {
        be->copy_h2d(be, dev + regc_model_param_frozen_at(t->model, i) + at, bytes, (size_t)n);
        return;
    }
    const int64_t word = (int64_t)sizeof(float);
    int64_t first, words, where; /* in words: of the parameter, held at `where` of the shard */
    regc_shard_param_part(l, j, t->comm->rank, &first, &words, &where);
    const int64_t lo = at > first * word ? at : first * word;
    const int64_t hi = at + n < (first + words) * word ? at + n : (first + words) * word;
    if (lo < hi)
        be->copy_h2d(be, dev + where * word + (lo - first * word), (const char *)bytes + (lo - at),
                     (size_t)(hi - lo));
}

/* Frozen parameter i (the j-th frozen) quantised to NF4
 * (regc_nf4_quantize: bitsandbytes' bytes) onto the device: the whole
 * tensor at once, since the absmaxes' offset is their mean over all of it.
 * From `from` (the model's weights) or the source; a source that holds it
 * in NF4 already (a checkpoint saved in 4 bits) gives its bytes as they
 * are. */
static int nf4_to_device(trainer *t, int i, int j, const float *from, regc_weights *src)
{
    regc_backend *be = t->be;
    const int64_t n = regc_model_param_numel(t->model, i);
    const int64_t bytes = regc_frozen_kind_bytes(REGC_FROZEN_NF4, n);
    const int held = !from && regc_weights_is_nf4(src, i);
    /* a checkpoint saved in 4 bits that keeps this layer unquantised:
     * Transformers would train it so, regc would not */
    if (!from && !held && regc_model_checkpoint_nf4(t->model))
        return regc_error(REGC_ERR_FORMAT,
                          "%s: tensor %s is not in 4 bits in the checkpoint, but regc holds "
                          "every linear layer but the head in NF4",
                          regc_model_source(t->model), regc_model_param_name(t->model, i));
    float *values = from || held ? NULL : malloc((size_t)n * sizeof *values + 1);
    uint8_t *blob = malloc((size_t)bytes);
    int rc = REGC_OK;
    if (!blob || (!from && !held && !values))
        rc = regc_error(REGC_ERR_MEMORY, "%s: out of memory quantising it to NF4",
                        regc_model_param_name(t->model, i));
    if (rc == REGC_OK && held)
        rc = regc_weights_read_nf4(src, i, blob);
    else if (rc == REGC_OK && !from && (rc = regc_weights_read(src, i, 0, n, values)) == REGC_OK)
        from = values;
    if (rc == REGC_OK && !held && (rc = regc_nf4_quantize(from, n, blob)) != REGC_OK)
        regc_error_prefix("%s", regc_model_param_name(t->model, i));
    if (rc == REGC_OK) {
        frozen_put(t, i, j, 0, blob, bytes);
        rc = be->sync(be); /* before the blob is freed */
    }
    free(values), free(blob);
    return rc;
}

/* The frozen block from the model's weights or the source (under ZeRO-3,
 * this rank's shard of it), a chunk at a time, each parameter in the dtype
 * it is held in. */
static int frozen_to_device(trainer *t, const float *model, regc_weights *src, double *load_ms)
{
    regc_backend *be = t->be;
    const regc_model *m = t->model;
    float *chunk = malloc((size_t)LOAD_CHUNK * sizeof *chunk);
    uint16_t *half = malloc((size_t)LOAD_CHUNK * sizeof *half);
    if (!chunk || !half) {
        free(chunk), free(half);
        return regc_error(REGC_ERR_MEMORY, "out of memory for a %lld-float buffer",
                          (long long)LOAD_CHUNK);
    }
    double t0 = regc_time_ms();
    int rc = REGC_OK;
    if (t->frozen_shards) { /* the padding between parameters too: zero */
        be->fill(be, t->frozen, (size_t)(t->frozen_bytes / (int64_t)sizeof(float)), 0.0f);
        rc = be->sync(be);
    }
    for (int i = 0, j = 0; i < regc_model_n_params(m) && rc == REGC_OK; i++) {
        const int held = regc_model_param_frozen(m, i);
        if (!held)
            continue;
        const int64_t n = regc_model_param_numel(m, i), at = regc_model_param_offset(m, i);
        const int jf = j++; /* the layout's numbering */
        if (held == REGC_FROZEN_NF4 || held == REGC_FROZEN_NF4_BF16) {
            rc = nf4_to_device(t, i, jf, src ? NULL : model + at, src);
            continue;
        }
        if (src && regc_weights_is_nf4(src, i)) { /* the other way: quantised where regc is not */
            rc = regc_error(REGC_ERR_FORMAT,
                            "%s: tensor %s is in 4 bits in the checkpoint, but regc holds it "
                            "unquantised (only the linear layers but the head are NF4)",
                            regc_model_source(m), regc_model_param_name(m, i));
            break;
        }
        /* the elements this rank holds: all, or under ZeRO-3 its part's */
        int64_t e0 = 0, e1 = n;
        if (t->frozen_shards) {
            const int64_t size = held == REGC_FROZEN_BF16 ? 2 : 4; /* bytes of a value */
            int64_t first, words, where;
            regc_shard_param_part(t->frozen_shards, jf, t->comm->rank, &first, &words, &where);
            e0 = first * 4 / size, e1 = words ? ((first + words) * 4 + size - 1) / size : e0;
            e1 = e1 < n ? e1 : n;
        }
        for (int64_t done = e0; done < e1 && rc == REGC_OK; done += LOAD_CHUNK) {
            const int64_t k = e1 - done < LOAD_CHUNK ? e1 - done : LOAD_CHUNK;
            if (src && (rc = regc_weights_read(src, i, done, k, chunk)))
                break;
            const float *from = src ? chunk : model + at + done;
            if (held == REGC_FROZEN_BF16) {
                for (int64_t e = 0; e < k; e++)
                    half[e] = regc_f32_to_bf16(from[e]);
                frozen_put(t, i, jf, done * 2, half, k * (int64_t)sizeof *half);
            } else {
                frozen_put(t, i, jf, done * 4, from, k * (int64_t)sizeof *from);
            }
            rc = be->sync(be); /* before the buffers are reused */
        }
    }
    *load_ms += regc_time_ms() - t0;
    free(chunk), free(half);
    return rc;
}

/* n values of a frozen parameter held as `held` says, from its bytes on
 * the host, into fp32 (NF4: dequantised). */
static void frozen_decode(int held, int64_t n, const void *bytes, float *to)
{
    if (held == REGC_FROZEN_NF4 || held == REGC_FROZEN_NF4_BF16) {
        regc_nf4_dequantize(bytes, n, to);
    } else if (held == REGC_FROZEN_BF16) {
        const uint16_t *half = bytes;
        for (int64_t j = 0; j < n; j++) {
            const uint32_t bits = (uint32_t)half[j] << 16;
            memcpy(&to[j], &bits, sizeof bits);
        }
    } else {
        memcpy(to, bytes, (size_t)n * sizeof *to);
    }
}

/* Under ZeRO-3: every rank's shard of each frozen unit gathered in turn,
 * and its parameters decoded into the model's weights, on every rank. */
static int frozen_units_to_host(trainer *t, float *model)
{
    regc_backend *be = t->be;
    regc_comm *c = t->comm;
    const regc_model *m = t->model;
    const regc_shard_layout *l = t->frozen_shards;
    int64_t most = 0;
    for (int u = 0; u < l->n_units; u++)
        most = l->unit_padded[u] > most ? l->unit_padded[u] : most;
    float *buf = malloc((size_t)most * sizeof *buf + 1); /* the unit's bytes, as words */
    if (!buf)
        return regc_error(REGC_ERR_MEMORY, "out of memory for %lld words", (long long)most);
    int rc = REGC_OK;
    for (int u = 0; u < l->n_units && rc == REGC_OK; u++) {
        float *mine = buf + (int64_t)c->rank * l->unit_shard[u];
        be->copy_d2h(be, mine, (const float *)t->frozen + l->shard_offset[u],
                     (size_t)l->unit_shard[u] * sizeof *buf);
        if ((rc = be->sync(be)) || (rc = c->allgather(c, buf, mine, l->unit_shard[u])))
            break;
        for (int i = 0, j = 0; i < regc_model_n_params(m); i++) {
            const int held = regc_model_param_frozen(m, i);
            if (held && l->param_unit[j] == u)
                frozen_decode(held, regc_model_param_numel(m, i), buf + l->param_offset[j],
                              model + regc_model_param_offset(m, i));
            j += held != 0;
        }
    }
    free(buf);
    return rc;
}

int regc_trainer_frozen_to_host(trainer *t, float *model)
{
    if (t->frozen_shards)
        return frozen_units_to_host(t, model);
    regc_backend *be = t->be;
    const regc_model *m = t->model;
    int rc = REGC_OK;
    for (int i = 0; i < regc_model_n_params(m) && rc == REGC_OK; i++) {
        const int held = regc_model_param_frozen(m, i);
        if (!held)
            continue;
        const int64_t n = regc_model_param_numel(m, i);
        float *to = model + regc_model_param_offset(m, i);
        const char *dev = (const char *)t->frozen + regc_model_param_frozen_at(m, i);
        if (held == REGC_FROZEN_NF4 || held == REGC_FROZEN_NF4_BF16) { /* dequantised */
            const int64_t bytes = regc_frozen_kind_bytes(held, n);
            uint8_t *blob = malloc((size_t)bytes);
            if (!blob)
                return regc_error(REGC_ERR_MEMORY, "out of memory");
            be->copy_d2h(be, blob, dev, (size_t)bytes);
            if ((rc = be->sync(be)) == REGC_OK)
                regc_nf4_dequantize(blob, n, to);
            free(blob);
            continue;
        }
        be->copy_d2h(be, to, dev, (size_t)n * (held == REGC_FROZEN_BF16 ? 2 : 4));
        if ((rc = be->sync(be)) || held != REGC_FROZEN_BF16)
            continue;
        const uint16_t *half = (const uint16_t *)to; /* widened in place, from the end */
        for (int64_t j = n - 1; j >= 0; j--) {
            uint32_t bits = (uint32_t)half[j] << 16;
            memcpy(&to[j], &bits, sizeof bits);
        }
    }
    return rc;
}

/* A device block back into a model-ordered host block, on every rank:
 * whole, or every rank's shard gathered and joined. */
int regc_trainer_block_to_host(trainer *t, float *model, const float *dev)
{
    regc_backend *be = t->be;
    if (!t->shards) {
        be->copy_d2h(be, model, dev, (size_t)t->block * sizeof(float));
        return be->sync(be);
    }
    regc_comm *c = t->comm;
    float *all = malloc((size_t)c->size * (size_t)t->block * sizeof *all + 1);
    if (!all)
        return regc_error(REGC_ERR_MEMORY, "out of memory for %d ranks' shards", c->size);
    float *mine = all + (size_t)c->rank * (size_t)t->block;
    be->copy_d2h(be, mine, dev, (size_t)t->block * sizeof(float));
    int rc = be->sync(be);
    if (rc == REGC_OK && (rc = c->allgather(c, all, mine, t->block)) == REGC_OK)
        regc_shard_join(t->shards, all, model);
    free(all);
    return rc;
}

/* Where the tensors of a file go: rank 0's writer; parameter i is the
 * j-th of those trained (the moments' files hold those alone). */
typedef int (*put_fn)(void *w, int i, int j, int64_t first, int64_t n, const float *src);

static int put_weight(void *w, int i, int j, int64_t first, int64_t n, const float *src)
{
    (void)j;
    return regc_model_writer_put(w, i, first, n, src);
}

static int put_exp_avg(void *w, int i, int j, int64_t first, int64_t n, const float *src)
{
    (void)i;
    return regc_st_writer_put(w, 2 * j, first, n, src);
}

static int put_exp_avg_sq(void *w, int i, int j, int64_t first, int64_t n, const float *src)
{
    (void)i;
    return regc_st_writer_put(w, 2 * j + 1, first, n, src);
}

/* Stream a device block into rank 0's writer w, one gather unit at a time
 * (every rank's shard of it gathered), so that no rank ever holds more of
 * the model than one unit; unsharded, rank 0 copies one parameter at a
 * time. A failed write keeps its error in *wrc and ends the writing, not
 * the gathers: the other ranks are in them too. */
static int stream_block(trainer *t, regc_backend *be, const float *dev, put_fn put, void *w,
                        int *wrc)
{
    regc_comm *c = t->comm;
    const regc_shard_layout *l = t->shards;
    const regc_model *m = t->model;
    int n_params = regc_model_n_params(m), rc = REGC_OK;
    int64_t most = 0;
    for (int i = 0; !l && i < n_params; i++)
        if (regc_model_param_numel(m, i) > most)
            most = regc_model_param_numel(m, i);
    for (int u = 0; l && u < l->n_units; u++)
        if (l->unit_padded[u] > most)
            most = l->unit_padded[u];
    if (!l && c->rank != 0)
        return REGC_OK;
    float *buf = malloc((size_t)most * sizeof *buf + 1);
    if (!buf)
        return regc_error(REGC_ERR_MEMORY, "out of memory for %lld floats", (long long)most);
    for (int i = 0, j = 0; !l && i < n_params && rc == REGC_OK && *wrc == REGC_OK; i++) {
        if (regc_model_param_frozen(m, i)) /* never changes: not saved */
            continue;
        int64_t n = regc_model_param_numel(m, i);
        be->copy_d2h(be, buf, dev + regc_model_param_offset(m, i), (size_t)n * sizeof *buf);
        if ((rc = be->sync(be)) == REGC_OK)
            *wrc = put(w, i, j++, 0, n, buf);
    }
    for (int u = 0; l && u < l->n_units && rc == REGC_OK; u++) {
        float *mine = buf + (int64_t)c->rank * l->unit_shard[u];
        be->copy_d2h(be, mine, dev + l->shard_offset[u], (size_t)l->unit_shard[u] * sizeof *buf);
        if ((rc = be->sync(be)) || (rc = c->allgather(c, buf, mine, l->unit_shard[u])))
            break;
        for (int i = 0, j = 0; c->rank == 0 && i < n_params && *wrc == REGC_OK; i++) {
            if (regc_model_param_frozen(m, i)) /* the layout has the trained alone */
                continue;
            if (l->param_unit[j] == u)
                *wrc = put(w, i, j, 0, l->param_numel[j], buf + l->param_offset[j]);
            j++;
        }
    }
    free(buf);
    return rc;
}

int regc_trainer_rank0_status(trainer *t, int rc, int wrc)
{
    regc_comm *c = t->comm;
    int64_t status = wrc;
    if (rc || c->size == 1 || (rc = c->broadcast(c, &status, sizeof status, 0)))
        return rc ? rc : wrc;
    if (status != REGC_OK && c->rank != 0) {
        regc_error_clear();
        return REGC_ERR_RANK;
    }
    return (int)status;
}

/* The weights as a model directory (config.json or graph.json, and
 * model.safetensors in fp32), streamed from the device. */
static int write_model(trainer *t, const char *dir, int *wrc)
{
    regc_model_writer *w = NULL;
    if (t->comm->rank == 0 && *wrc == REGC_OK)
        *wrc = regc_model_writer_open(t->model, dir, &w);
    int rc = stream_block(t, t->be, t->params, put_weight, w, wrc);
    if (w && *wrc == REGC_OK && rc == REGC_OK)
        *wrc = regc_model_writer_finish(w);
    else
        regc_model_writer_abandon(w);
    return rc;
}

/* The model directory appears whole or not at all (a staged directory). */
int regc_trainer_save_model(trainer *t, const char *dir)
{
    regc_staged_dir *s = NULL;
    int wrc = t->comm->rank == 0 ? regc_staged_dir_open(dir, &s) : REGC_OK;
    int rc = write_model(t, s ? regc_staged_dir_path(s) : NULL, &wrc);
    if (s && rc == REGC_OK && wrc == REGC_OK)
        wrc = regc_staged_dir_commit(s);
    else
        regc_staged_dir_abandon(s);
    return regc_trainer_rank0_status(t, rc, wrc);
}

/* Write output_dir/checkpoint-<steps done>: the weights, AdamW's moments
 * and the run's state, streamed from every rank's shards; keep the newest
 * save_total_limit. */
int regc_trainer_save_checkpoint(trainer *t, const regc_train_options *o, int64_t done)
{
    regc_checkpoint_writer ck;
    regc_st_writer *moments = NULL;
    memset(&ck, 0, sizeof ck);
    int first = t->comm->rank == 0, wrc = REGC_OK, rc;
    char name[64];
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)done);
    if ((rc = regc_path_join(t->checkpoint, sizeof t->checkpoint, o->output_dir, name)))
        return rc;
    if (first && (wrc = regc_checkpoint_begin(o->output_dir, done, &ck)) == REGC_OK)
        wrc = regc_checkpoint_moments_open(&ck, t->model, &moments);
    rc = write_model(t, first ? ck.tmp : NULL, &wrc);
    if (rc == REGC_OK)
        rc = stream_block(t, t->state_be, t->m, put_exp_avg, moments, &wrc);
    if (rc == REGC_OK)
        rc = stream_block(t, t->state_be, t->v, put_exp_avg_sq, moments, &wrc);
    if (first) {
        regc_run_state st;
        if (moments && wrc == REGC_OK && rc == REGC_OK)
            wrc = regc_st_writer_finish(moments);
        else
            regc_st_writer_abandon(moments);
        if (wrc == REGC_OK && rc == REGC_OK)
            wrc = regc_run_state_of(o, t->model, t->tokens, done, &st);
        st.skipped_steps = t->skipped;
        if (wrc != REGC_OK || rc != REGC_OK)
            regc_checkpoint_abandon(&ck);
        else if ((wrc = regc_checkpoint_commit(&ck, &st)) == REGC_OK)
            wrc = regc_checkpoint_prune(o->output_dir, o->save_total_limit);
    }
    return regc_trainer_rank0_status(t, rc, wrc);
}

/* The weights and the moments onto the device: each rank reads its own
 * shards of the sources (a checkpoint's moments, else zeros), then the
 * ranks say together what they read and how long the slowest took to read
 * it and copy it to the device (its memory already allocated and zeroed). */
int regc_trainer_load_state(trainer *t, const regc_train_options *o, regc_load_report *r)
{
    regc_backend *be = t->state_be; /* m and v's */
    regc_comm *c = t->comm;
    double load_ms = 0.0;
    int rc =
        block_to_device(t, t->be, t->params, regc_model_weights(t->model), t->src[0], &load_ms);
    if (rc == REGC_OK && t->frozen)
        rc = frozen_to_device(t, regc_model_weights(t->model), t->src[0], &load_ms);
    if (rc == REGC_OK && t->src[1])
        rc = block_to_device(t, be, t->m, NULL, t->src[1], &load_ms);
    if (rc == REGC_OK && t->src[2])
        rc = block_to_device(t, be, t->v, NULL, t->src[2], &load_ms);
    if (!t->src[1])
        be->fill(be, t->m, (size_t)t->block, 0.0f);
    if (!t->src[2])
        be->fill(be, t->v, (size_t)t->block, 0.0f);
    if (rc)
        return rc;
    float ms = (float)load_ms;
    int64_t bytes = 0;
    for (int k = 0; k < 3; k++)
        bytes += regc_weights_bytes_read(t->src[k]);
    float *all = malloc((size_t)c->size * sizeof *all);
    if (!all)
        return regc_error(REGC_ERR_MEMORY, "out of memory");
    if ((rc = c->allreduce(c, &bytes, 1, REGC_COMM_I64)) == REGC_OK)
        rc = c->allgather(c, all, &ms, 1);
    *r = (regc_load_report){.from = o->resume_from ? t->checkpoint : o->weights, .bytes = bytes};
    for (int k = 0; rc == REGC_OK && k < c->size; k++)
        if (all[k] > r->ms)
            r->ms = all[k];
    free(all);
    return rc;
}
