/* train.c — the training loop: data, the compiled step (forward +
 * backward), AdamW, reports, and saving.
 *
 * Device memory is one block per kind (llm.c's layout): parameters,
 * gradients, AdamW's m and v, each [total_numel] in the model's parameter
 * order, so parameter i lives at the same offset in all four. Under
 * ZeRO-3 each block is this rank's shard of every gather unit (the
 * program's shard layout): the model's weights and moments are cut into
 * shards on the way to the device and joined from every rank's shards on
 * the way back. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "options.h"
#include "trainer.h"

void regc_train_options_default(regc_train_options *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 4;
    o->seq = 64;
    o->steps = 10;
    o->lr = 3e-4f;
    o->weight_decay = 0.0f;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
    o->seed = 1337;
    o->backend = "cpu";
    o->cache_max_bytes = INT64_C(1024) << 20;
    o->lr_scheduler = REGC_SCHEDULE_CONSTANT;
    o->offload_pin_memory = 1;
    o->min_lr = o->min_lr_rate = -1.0;             /* unset */
    o->warmup_min_ratio = o->cos_min_ratio = -1.0; /* DeepSpeed's defaults */
    o->grad_accum = 1;
    o->val_batches = 8;
    o->return_weights = 1;
    regc_compile_options_default(&o->compile);
}

/* A GPU's batches come from pinned host memory: copied without staging
 * (ahead of a captured step's graph, O2). The CPU reads them where they
 * are. */
static int pinned_inputs(const trainer *t) { return t->be && strcmp(t->be->name, "cpu") != 0; }

static void trainer_free(trainer *t)
{
    regc_backend *be = t->be;
    if (be) {
        void *blocks[] = {t->params, t->grads, t->scalars, t->frozen};
        for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
            if (blocks[i])
                be->free(be, blocks[i]);
        void (*free_state)(regc_backend *, void *) =
            t->state_be != be ? be->free_host : be->free; /* offloaded: host memory */
        if (t->m)
            free_state(be, t->m);
        if (t->v)
            free_state(be, t->v);
        for (int i = 0; t->d_inputs && i < t->n_inputs; i++)
            if (t->d_inputs[i])
                be->free(be, t->d_inputs[i]);
    }
    for (int i = 0; t->inputs && i < t->n_inputs; i++)
        if (t->inputs[i].host)
            pinned_inputs(t) ? be->free_host(be, t->inputs[i].host) : free(t->inputs[i].host);
    free(t->inputs);
    free(t->d_inputs);
    free(t->counts);
    free(t->losses);
    free(t->no_decay);
    for (int k = 0; k < 3; k++)
        regc_weights_close(t->src[k]);
    regc_program_free(t->val_program);
    regc_program_free(t->program);
    regc_tokens_free(t->val_tokens);
    regc_tokens_free(t->tokens);
    regc_cache_close(t->cache);
    regc_comm_free(t->own_step_comm);
    regc_comm_free(t->own_comm);
    regc_backend_free(t->own_state_be);
    regc_backend_free(be);
}

/* Masks decide which targets count; BERT and T5 choose their own targets. */
static int open_mask(trainer *t, regc_tokens *data, const char *mask, const char *key)
{
    if (!mask)
        return REGC_OK;
    if (regc_model_chooses_targets(t->model))
        return regc_error(REGC_ERR_ARG,
                          "train.%s: loss masks apply to causal language models (gpt2, llama, "
                          "graph models); %s chooses its own targets",
                          key, regc_model_arch(t->model));
    return regc_tokens_open_mask(data, mask);
}

static int open_data(trainer *t, const regc_train_options *o)
{
    int64_t vocab = regc_model_vocab(t->model);
    int rc;
    if (o->data_path)
        rc = regc_tokens_open(o->data_path, vocab, &t->tokens);
    else if (o->loss_mask)
        return regc_error(REGC_ERR_ARG, "train.loss_mask: needs train.data, the tokens it masks");
    else if (vocab < 256)
        return regc_error(REGC_ERR_ARG,
                          "the built-in corpus is byte-level and needs vocab_size >= 256 (model "
                          "has %lld); pass --data",
                          (long long)vocab);
    else
        rc = regc_tokens_builtin(&t->tokens);
    if (rc == REGC_OK) /* the training rows only: validation reads its file in order */
        regc_tokens_set_shuffle(t->tokens, o->shuffle, o->data_seed);
    return rc ? rc : open_mask(t, t->tokens, o->loss_mask, "loss_mask");
}

static void *device_alloc(trainer *t, size_t bytes, int *rc)
{
    void *p = t->be->alloc(t->be, bytes);
    if (!p && *rc == REGC_OK)
        *rc = regc_error(REGC_ERR_MEMORY, "backend %s: out of memory for %zu bytes", t->be->name,
                         bytes);
    return p;
}

/* A host and a device buffer for every input the step program reads: the
 * architecture fills them per batch (regc_model_fill_inputs). */
static int alloc_inputs(trainer *t)
{
    int n = regc_program_n_inputs(t->program), rc = REGC_OK;
    t->inputs = calloc((size_t)n + 1, sizeof *t->inputs);
    t->d_inputs = calloc((size_t)n + 1, sizeof *t->d_inputs);
    if (!t->inputs || !t->d_inputs)
        return regc_error(REGC_ERR_MEMORY, "out of memory");
    for (int i = 0; i < n && rc == REGC_OK; i++) {
        const regc_tensor *x = regc_program_input(t->program, i);
        regc_input *in = &t->inputs[t->n_inputs];
        in->tensor = x;
        const size_t bytes = (size_t)regc_tensor_bytes(x) + 1;
        in->host = pinned_inputs(t) ? t->be->alloc_host(t->be, bytes) : malloc(bytes);
        t->d_inputs[t->n_inputs++] = device_alloc(t, (size_t)regc_tensor_bytes(x), &rc);
        if (rc == REGC_OK && !in->host)
            rc = regc_error(REGC_ERR_MEMORY, "out of memory");
    }
    return rc;
}

int64_t regc_train_warmup_steps(const regc_train_options *o)
{
    return o->warmup_steps > 0 ? o->warmup_steps : (int64_t)ceil(o->warmup_ratio * o->steps);
}

/* The scalar block's constants from the options; the state at step 0. */
static void init_scalars(regc_step_scalars *s, const regc_train_options *o)
{
    memset(s, 0, sizeof *s);
    /* the float options as doubles: torch's Python floats would be the
     * decimals, regc's are the floats the options hold */
    s->base_lr = (double)o->lr;
    s->weight_decay = (double)o->weight_decay;
    s->beta1 = (double)o->beta1, s->beta2 = (double)o->beta2, s->eps = (double)o->eps;
    s->schedule = (int32_t)o->lr_scheduler;
    /* DeepSpeed's schedules: the trainer hands each step its rate
     * (regc_trainer_step), which the constant schedule applies as it is */
    if (regc_train_schedule_is_deepspeed(o->lr_scheduler))
        s->schedule = REGC_SCHEDULE_CONSTANT;
    s->warmup_steps = (double)regc_train_warmup_steps(o);
    s->total_steps = (double)o->steps;
    s->num_cycles = 0.5;
    s->min_lr_rate = o->min_lr >= 0.0 ? o->min_lr / (double)o->lr : o->min_lr_rate;
    s->max_grad_norm = o->max_grad_norm;
    s->loss_scale = 1.0f;
    s->clip_scale = 1.0f;
}

/* From the compiled step's account alone, before a byte is allocated: a
 * run whose memory cannot fit the device is refused with the figures, not
 * found out by an allocation failing (or by the host swapping) later.
 * Ranks on one host share its memory. */
int regc_trainer_check_memory_fits(trainer *t, const regc_program *p)
{
    const regc_model *m = t->model;
    regc_device_memory a;
    regc_program_device_memory(p, &a);
    int cpu = !strcmp(t->be->name, "cpu");
    int sharing = cpu && t->comm->local_size > 1 ? t->comm->local_size : 1;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (cpu) /* an offloaded update's host memory is the device's too */
        a.total += a.host;
    if (t->be->mem_capacity <= 0 || (double)a.total * sharing <= (double)t->be->mem_capacity)
        return REGC_OK;
    char ranks[64] = "";
    if (sharing > 1)
        snprintf(ranks, sizeof ranks, " times %d ranks on this host", sharing);
    return regc_error(REGC_ERR_MEMORY,
                      "%s: a step needs %.1f GiB per rank (weights, gradients and AdamW's moments "
                      "%.1f GiB, activations %.1f GiB)%s, more than the %s's %.1f GiB; "
                      "zero_optimization.stage 3 over more ranks, or a smaller train.batch or "
                      "train.seq, needs less",
                      regc_model_source(m), (double)a.total / gib,
                      (double)(a.params + a.grads + a.m + a.v) / gib, (double)a.activations / gib,
                      ranks, cpu ? "host" : "device", (double)t->be->mem_capacity / gib);
}

/* Allocate the four parameter-shaped blocks and the scalar block, and bind
 * them and the inputs into the step program. */
static int bind_memory(trainer *t, const regc_train_options *o, int64_t start,
                       regc_load_report *loaded)
{
    regc_backend *be = t->be;
    t->shards = regc_program_shard_layout(t->program);
    t->frozen_shards = regc_program_frozen_layout(t->program);
    t->block = regc_program_block_floats(t->program);
    const int64_t trained = regc_model_trainable_numel(t->model);
    const int64_t frozen = regc_model_frozen_bytes(t->model);
    t->frozen_bytes =
        t->frozen_shards ? t->frozen_shards->shard_floats * (int64_t)sizeof(float) : frozen;
    if (!t->shards && t->block != trained)
        return regc_error(REGC_ERR_ARG, "step program: blocks of %lld floats for a model of %lld",
                          (long long)t->block, (long long)trained);
    if (regc_program_frozen_bytes(t->program) > t->frozen_bytes ||
        (t->frozen_shards && t->frozen_shards->model_floats * (int64_t)sizeof(float) != frozen))
        return regc_error(REGC_ERR_ARG,
                          "step program: a frozen block of %lld bytes for a model of %lld",
                          (long long)regc_program_frozen_bytes(t->program), (long long)frozen);
    int n_trained = 0;
    for (int i = 0; i < regc_model_n_params(t->model); i++)
        n_trained += !regc_model_param_frozen(t->model, i);
    const int n_frozen = regc_model_n_params(t->model) - n_trained;
    if ((t->shards && t->shards->n_params != n_trained) ||
        (t->frozen_shards && t->frozen_shards->n_params != n_frozen))
        return regc_error(REGC_ERR_ARG,
                          "step program: a shard layout of %d parameters for %d (%d frozen)",
                          t->shards->n_params + (t->frozen_shards ? t->frozen_shards->n_params : 0),
                          n_trained + n_frozen, n_frozen);
    /* each frozen parameter where the model holds it, as long as it is */
    for (int i = 0, j = 0; t->frozen_shards && i < regc_model_n_params(t->model); i++) {
        const int held = regc_model_param_frozen(t->model, i);
        if (!held)
            continue;
        const int64_t bytes = regc_frozen_kind_bytes(held, regc_model_param_numel(t->model, i));
        const regc_shard_layout *l = t->frozen_shards;
        if (l->model_offset[j] * 4 != regc_model_param_frozen_at(t->model, i) ||
            l->param_numel[j] * 4 != ((bytes + 63) & ~INT64_C(63)))
            return regc_error(REGC_ERR_ARG,
                              "step program: frozen parameter %s laid out at %lld (%lld bytes), "
                              "the model holds it at %lld (%lld bytes)",
                              regc_model_param_name(t->model, i), (long long)l->model_offset[j] * 4,
                              (long long)l->param_numel[j] * 4,
                              (long long)regc_model_param_frozen_at(t->model, i), (long long)bytes);
        j++;
    }
    size_t bytes = (size_t)t->block * sizeof(float);
    int rc = REGC_OK;
    t->params = device_alloc(t, bytes, &rc);
    t->grads = device_alloc(t, bytes, &rc);
    /* AdamW's moments: the device's, or offloaded, host memory that a CPU
     * backend works on (the device's own backend on the CPU) */
    t->state_be = be;
    if (o->compile.offload_optimizer && strcmp(be->name, "cpu") != 0 &&
        !(t->state_be = t->own_state_be =
              regc_backend_new("cpu", regc_trainer_threads(o, t->comm))))
        return REGC_ERR_UNSUPPORTED;
    if (o->compile.offload_optimizer && t->state_be != be) {
        if (!(t->m = be->alloc_host(be, bytes)) || !(t->v = be->alloc_host(be, bytes)))
            return REGC_ERR_MEMORY;
    } else {
        t->m = device_alloc(t, bytes, &rc);
        t->v = device_alloc(t, bytes, &rc);
    }
    t->scalars = device_alloc(t, sizeof *t->scalars, &rc);
    if (t->frozen_bytes > 0)
        t->frozen = device_alloc(t, (size_t)t->frozen_bytes, &rc);
    if (rc || (rc = regc_trainer_load_state(t, o, loaded)))
        return rc;
    be->fill(be, t->grads, (size_t)t->block, 0.0f);
    init_scalars(&t->host, o);
    t->host.step = (double)(start - t->skipped); /* skipped steps did not count */
    be->copy_h2d(be, t->scalars, &t->host, sizeof t->host);
    if ((rc = alloc_inputs(t)) || (rc = regc_trainer_no_decay(t, o)))
        return rc;
    return regc_trainer_bind_programs(t, o);
}

int regc_trainer_bind_programs(trainer *t, const regc_train_options *o)
{
    regc_backend *be = t->be;
    int rc;
    regc_program_memory mem = {.params = t->params,
                               .frozen = t->frozen,
                               .grads = t->grads,
                               .m = t->m,
                               .v = t->v,
                               .scalars = t->scalars,
                               .inputs = t->d_inputs,
                               .comm = t->step_comm,
                               .tuning_cache = t->cache ? t->cache : o->compile.cache,
                               .host = t->state_be,
                               .no_decay = t->no_decay,
                               .n_no_decay = t->n_no_decay};
    /* every program reads the frozen block as the trainer laid it out */
    for (int k = 0; k < 2; k++) {
        const regc_program *p = k ? t->val_program : t->program;
        if (p && (regc_program_frozen_bytes(p) > t->frozen_bytes ||
                  !regc_shard_layout_same(regc_program_frozen_layout(p), t->frozen_shards)))
            return regc_error(REGC_ERR_ARG,
                              "%s program: its frozen block's layout is not the run's (%lld bytes "
                              "for %lld)",
                              k ? "validation" : "step", (long long)regc_program_frozen_bytes(p),
                              (long long)t->frozen_bytes);
    }
    if ((rc = regc_program_bind(t->program, be, &mem)) || !t->val_program)
        return rc;
    /* validation runs between steps: it borrows the step's arena */
    regc_program_memory val = {.params = t->params,
                               .frozen = t->frozen,
                               .scalars = t->scalars,
                               .inputs = t->d_inputs,
                               .comm = t->step_comm,
                               .tuning_cache = t->cache ? t->cache : o->compile.cache,
                               .host = t->state_be};
    val.arena = regc_program_arena(t->program, &val.arena_bytes);
    return regc_program_bind(t->val_program, be, &val);
}

/* Can --save and the checkpoints be written? Asked before any work, not
 * found out after training (rank 0 writes them). */
static int check_outputs(trainer *t, const regc_train_options *o)
{
    int wrc = REGC_OK;
    if (t->comm->rank == 0 && o->save_dir)
        wrc = regc_staged_dir_probe(o->save_dir);
    if (t->comm->rank == 0 && o->output_dir && wrc == REGC_OK) {
        char dir[4096];
        if ((wrc = regc_path_join(dir, sizeof dir, o->output_dir, "checkpoint-0")) == REGC_OK)
            wrc = regc_staged_dir_probe(dir);
    }
    return regc_trainer_rank0_status(t, REGC_OK, wrc);
}

/* A graph model's constants, whole on every rank, from where the weights
 * come (the checkpoint's model file on a resumed run). */
static int read_constants(trainer *t)
{
    if (regc_model_n_constants(t->model) == 0)
        return REGC_OK;
    if (!t->src[0])
        return regc_error(REGC_ERR_ARG,
                          "%s: the model's constants have no values: give --weights a file "
                          "that holds them",
                          regc_model_source(t->model));
    return regc_model_read_constants(t->model, t->src[0]);
}

/* Where the weights come from (before compiling, so that a missing
 * tensor or a wrong shape fails at once): o->weights, else the model's own,
 * else the seeded init. A resumed run takes its checkpoint's instead. */
static int open_weights(trainer *t, const regc_train_options *o)
{
    int rc = REGC_OK;
    /* its weights are frozen NF4 bytes: only adapters beside them train */
    if ((rc = regc_model_check_nf4_trainable(t->model, regc_model_has_lora(t->model))))
        return rc;
    if (o->weights)
        rc = regc_weights_open(t->model, o->weights, "", &t->src[0]);
    else if (!regc_model_has_weights(t->model))
        rc = regc_weights_seeded(t->model, o->seed, &t->src[0]);
    return rc ? rc : read_constants(t);
}

/* Continue from a checkpoint: check that it is of this model and these
 * settings, take its weights and moments; *start is the step it stands at. */
static int resume_run(trainer *t, const regc_train_options *o, int64_t *start)
{
    char dir[4096];
    int rc = REGC_OK;
    if (!strcmp(o->resume_from, "latest")) {
        if (!o->output_dir)
            return regc_error(REGC_ERR_ARG, "train.resume_from_checkpoint: latest needs "
                                            "train.output_dir (the checkpoints' directory)");
        rc = regc_checkpoint_latest(o->output_dir, dir, sizeof dir);
    } else {
        snprintf(dir, sizeof dir, "%s", o->resume_from);
    }
    regc_run_state now, saved;
    /* the checkpoint's, instead; a LoRA model's base stays, its adapter is
     * the checkpoint's */
    regc_weights *base = regc_model_has_lora(t->model) ? t->src[0] : NULL;
    if (base)
        t->src[0] = NULL;
    else if (regc_model_has_lora(t->model))
        return regc_error(REGC_ERR_ARG, "%s: resuming a LoRA model needs its base from a file",
                          regc_model_source(t->model));
    for (int k = 0; k < 3; k++)
        regc_weights_close(t->src[k]), t->src[k] = NULL;
    if (rc || (rc = regc_run_state_of(o, t->model, t->tokens, 0, &now)) ||
        (rc = regc_checkpoint_check(dir, &now, &saved)) ||
        (rc = regc_checkpoint_open(dir, t->model, t->src)) ||
        (base && (rc = regc_weights_use_adapter(base, dir)))) {
        regc_weights_close(base);
        return rc;
    }
    if (base)
        t->src[0] = base;
    if ((rc = read_constants(t)))
        return rc;
    snprintf(t->checkpoint, sizeof t->checkpoint, "%s", dir);
    *start = saved.global_step;
    t->skipped = saved.skipped_steps;
    return REGC_OK;
}

int regc_train_check_options(const regc_train_options *o)
{
    if (o->batch < 1)
        return regc_error(REGC_ERR_ARG, "batch size must be at least 1 (got %lld)",
                          (long long)o->batch);
    if (o->seq < 1)
        return regc_error(REGC_ERR_ARG, "sequence length must be at least 1 (got %lld)",
                          (long long)o->seq);
    if (o->steps < 1)
        return regc_error(REGC_ERR_ARG, "steps must be at least 1 (got %d)", o->steps);
    if (!(o->lr >= 0.0f) || !(o->weight_decay >= 0.0f))
        return regc_error(REGC_ERR_ARG, "learning rate and weight decay must be non-negative");
    if (o->grad_accum < 1)
        return regc_error(REGC_ERR_ARG, "train.gradient_accumulation_steps: %d (at least 1)",
                          o->grad_accum);
    if ((unsigned)o->lr_scheduler >= REGC_TRAIN_SCHEDULE_COUNT)
        return regc_error(REGC_ERR_ARG, "train.lr_scheduler_type: no schedule %d",
                          (int)o->lr_scheduler);
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f) || !(o->beta2 >= 0.0f && o->beta2 < 1.0f))
        return regc_error(REGC_ERR_ARG, "train.adam_beta%d: %g (from 0 to below 1)",
                          o->beta1 >= 0.0f && o->beta1 < 1.0f ? 2 : 1,
                          (double)(o->beta1 >= 0.0f && o->beta1 < 1.0f ? o->beta2 : o->beta1));
    if (!(o->eps > 0.0f))
        return regc_error(REGC_ERR_ARG, "train.adam_epsilon: %g (> 0)", (double)o->eps);
    if (o->num_train_epochs < 0.0)
        return regc_error(REGC_ERR_ARG, "train.num_train_epochs: %g (> 0)", o->num_train_epochs);
    if (o->val_loss_mask && !o->val_data_path)
        return regc_error(REGC_ERR_ARG, "train.val_loss_mask: needs train.val_data");
    if (o->tf32 && o->compile.precision == REGC_PRECISION_FP32 &&
        (!o->backend || strncmp(o->backend, "cuda", 4) != 0))
        return regc_error(REGC_ERR_ARG,
                          "compile.tf32: the %s backend has no TF32 products (a cuda backend of "
                          "compute capability 8.0 or later has); under compile.precision bf16 "
                          "it changes nothing",
                          o->backend ? o->backend : "cpu");
    if (o->compile.offload_optimizer && !o->offload_pin_memory)
        return regc_error(REGC_ERR_ARG,
                          "zero_optimization.offload_optimizer.pin_memory: false is not "
                          "supported (the offloaded state is always in pinned memory)");
    /* A thread beyond a few per core only waits for the others (4096 on two
     * cores made a run crawl): asking for more is a mistake, not a wish. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && o->threads > 4 * cores)
        return regc_error(REGC_ERR_ARG,
                          "train.threads: %d threads on a host of %ld cores (at most %ld, 4 per "
                          "core)",
                          o->threads, cores, 4 * cores);
    if (o->zero_stage != 0 && o->zero_stage != 3)
        return regc_error(REGC_ERR_UNSUPPORTED, "zero_optimization.stage: %d is not built (0 or 3)",
                          o->zero_stage);
    int cpu = !o->backend || !strcmp(o->backend, "cpu");
    if ((o->communicator == REGC_COMMUNICATOR_NCCL && cpu) ||
        (o->communicator == REGC_COMMUNICATOR_MPI && !cpu))
        return regc_error(REGC_ERR_ARG, "zero_optimization.communicator: %s",
                          cpu ? "nccl needs the cuda backend"
                              : "mpi passes host buffers; a GPU's need staged or nccl");
    if ((unsigned)o->communicator > REGC_COMMUNICATOR_NCCL)
        return regc_error(REGC_ERR_ARG, "zero_optimization.communicator: no communicator %d",
                          (int)o->communicator);
    if (o->save_steps < 0 || o->save_total_limit < 0)
        return regc_error(REGC_ERR_ARG, "train.%s: negative",
                          o->save_steps < 0 ? "save_steps" : "save_total_limit");
    if (o->save_steps > 0 && !o->output_dir)
        return regc_error(REGC_ERR_ARG, "train.save_steps: checkpoints need train.output_dir");
    if (o->eval_steps < 0 || o->val_batches < 1)
        return regc_error(REGC_ERR_ARG, "train.%s: %d",
                          o->eval_steps < 0 ? "eval_steps" : "val_batches",
                          o->eval_steps < 0 ? o->eval_steps : o->val_batches);
    if (!(o->max_grad_norm >= 0.0))
        return regc_error(REGC_ERR_ARG, "train.max_grad_norm: %g (0 turns clipping off)",
                          o->max_grad_norm);
    int64_t warmup = regc_train_warmup_steps(o);
    const char *warmup_key = o->warmup_steps > 0 ? "warmup_steps" : "warmup_ratio";
    if (warmup < 0 || !(o->warmup_ratio >= 0.0 && o->warmup_ratio <= 1.0))
        return regc_error(REGC_ERR_ARG, "train.%s: a negative warmup", warmup_key);
    /* DeepSpeed's warmup may outlast a run (it stops part way up) */
    const int ds = regc_train_schedule_is_deepspeed(o->lr_scheduler);
    if (warmup > o->steps && !ds)
        return regc_error(REGC_ERR_ARG,
                          "train.%s: %lld warmup steps are more than the run's %d steps",
                          warmup_key, (long long)warmup, o->steps);
    if (warmup > 0 && o->lr_scheduler == REGC_SCHEDULE_CONSTANT)
        return regc_error(REGC_ERR_ARG,
                          "train.%s: the constant schedule has no warmup (use "
                          "constant_with_warmup)",
                          warmup_key);
    int min_lr = o->min_lr >= 0.0, min_rate = o->min_lr_rate >= 0.0;
    if (o->lr_scheduler == REGC_SCHEDULE_COSINE_WITH_MIN_LR && min_lr == min_rate)
        return regc_error(REGC_ERR_ARG, "train.lr_scheduler_type: cosine_with_min_lr needs one of "
                                        "min_lr and min_lr_rate");
    if (o->lr_scheduler != REGC_SCHEDULE_COSINE_WITH_MIN_LR && (min_lr || min_rate))
        return regc_error(REGC_ERR_ARG,
                          "train.%s: applies to lr_scheduler_type cosine_with_min_lr only",
                          min_lr ? "min_lr" : "min_lr_rate");
    /* DeepSpeed's parameters only where its scheduler takes them, as its
     * constructors refuse an argument they do not have */
    const int warmup_lr = o->lr_scheduler == REGC_SCHEDULE_WARMUP_LR ||
                          o->lr_scheduler == REGC_SCHEDULE_WARMUP_DECAY_LR,
              decays = o->lr_scheduler == REGC_SCHEDULE_WARMUP_DECAY_LR ||
                       o->lr_scheduler == REGC_SCHEDULE_WARMUP_COSINE_LR,
              cosine = o->lr_scheduler == REGC_SCHEDULE_WARMUP_COSINE_LR;
    if (!(o->warmup_min_lr >= 0.0))
        return regc_error(REGC_ERR_ARG, "scheduler.params.warmup_min_lr: %g (>= 0)",
                          o->warmup_min_lr);
    const char *not_taken = o->warmup_min_lr > 0.0 && !warmup_lr    ? "warmup_min_lr"
                            : o->total_num_steps > 0 && !decays     ? "total_num_steps"
                            : o->warmup_min_ratio >= 0.0 && !cosine ? "warmup_min_ratio"
                            : o->cos_min_ratio >= 0.0 && !cosine    ? "cos_min_ratio"
                            : o->warmup_type != 0 && !ds            ? "warmup_type"
                                                                    : NULL;
    if (not_taken)
        return regc_error(REGC_ERR_ARG,
                          "scheduler.params.%s: lr_scheduler_type %s does not take it", not_taken,
                          regc_train_schedule_name(o->lr_scheduler));
    if (o->total_num_steps < 0 || (unsigned)o->warmup_type > 1)
        return regc_error(REGC_ERR_ARG, "scheduler.params.%s: %lld",
                          o->total_num_steps < 0 ? "total_num_steps" : "warmup_type",
                          o->total_num_steps < 0 ? (long long)o->total_num_steps
                                                 : (long long)o->warmup_type);
    return REGC_OK;
}

int regc_train(regc_model *m, const regc_train_options *o, regc_step_fn on_step, void *user,
               int *stopped_at)
{
    /* epochs decide the steps once the data's length is known */
    regc_train_options by_epochs;
    int rc;
    if (o->num_train_epochs > 0.0) {
        by_epochs = *o;
        if ((rc = regc_train_resolve_epochs(&by_epochs, m, o->comm ? o->comm->size : 1)))
            return rc;
        o = &by_epochs;
    }
    if ((rc = regc_train_check_options(o)))
        return rc;
    trainer t;
    memset(&t, 0, sizeof t);
    t.model = m;
    if (!(t.comm = o->comm) && !(t.comm = t.own_comm = regc_comm_single_new()))
        return REGC_ERR_MEMORY;
    /* The backend first: compiled code is keyed on its device. Ranks that
     * share a host share its cores, unless told otherwise. */
    char backend[32];
    t.be = regc_backend_new(regc_trainer_rank_backend(o, t.comm, backend, sizeof backend),
                            regc_trainer_threads(o, t.comm));
    if (!t.be) {
        trainer_free(&t);
        return REGC_ERR_UNSUPPORTED;
    }
    if (o->tf32 && o->compile.precision == REGC_PRECISION_FP32 && !t.be->has_tf32) {
        rc = regc_error(REGC_ERR_UNSUPPORTED,
                        "compile.tf32: %s has no TF32 products (compute capability 8.0 or later)",
                        t.be->device);
        trainer_free(&t);
        return rc;
    }
    t.be->tf32 = o->tf32;
    if ((rc = regc_trainer_open_step_comm(&t, o)) || (rc = check_outputs(&t, o)) ||
        (rc = open_weights(&t, o))) {
        trainer_free(&t);
        return rc;
    }
    /* Then the step: it needs shapes only, and the architecture's own
     * build_graph says best why a batch or sequence does not fit (n_positions
     * of gpt2, the fixed shapes of a graph JSON) before any weights exist. */
    regc_compile_options co = o->compile;
    regc_compile_stats st;
    co.device = t.be->device;
    co.accumulate_grads = o->grad_accum > 1;
    co.ranks = t.comm->size;
    co.zero_stage = o->zero_stage;
    if (o->cache_dir && !co.cache &&
        (rc = regc_cache_open(o->cache_dir, o->cache_max_bytes, NULL, &t.cache))) {
        trainer_free(&t);
        return rc;
    }
    if (t.cache)
        co.cache = t.cache;
    if ((rc = regc_program_compile(m, o->batch, o->seq, &co, &t.program, &st))) {
        trainer_free(&t);
        return rc;
    }
    /* validation: the same regions, forward only (the cache shares them) */
    if (o->val_data_path) {
        regc_compile_options vo = co;
        regc_compile_stats vst;
        vo.forward_only = 1;
        if ((rc = regc_program_compile(m, o->batch, o->seq, &vo, &t.val_program, &vst)) ||
            (rc = regc_tokens_open(o->val_data_path, regc_model_vocab(m), &t.val_tokens)) ||
            (rc = open_mask(&t, t.val_tokens, o->val_loss_mask, "val_loss_mask"))) {
            trainer_free(&t);
            return rc;
        }
        st.cache_hits += vst.cache_hits, st.cache_misses += vst.cache_misses;
        st.cache_ms += vst.cache_ms;
    }
    if (o->on_compiled)
        o->on_compiled(&st, user);
    t.counts = calloc((size_t)o->grad_accum, sizeof *t.counts);
    t.losses = calloc((size_t)o->grad_accum, sizeof *t.losses);
    if (!t.counts || !t.losses)
        rc = regc_error(REGC_ERR_MEMORY, "out of memory");
    int64_t start = 0;
    const double data_t0 = regc_time_ms();
    if (rc == REGC_OK)
        rc = open_data(&t, o);
    if (rc == REGC_OK && o->on_data) {
        const regc_data_report d = {o->data_path, regc_tokens_n_files(t.tokens),
                                    regc_tokens_count(t.tokens), regc_tokens_masked(t.tokens),
                                    regc_time_ms() - data_t0};
        o->on_data(&d, user);
    }
    if (rc == REGC_OK)
        rc = regc_trainer_check_ranks_agree(&t, o);
    if (rc == REGC_OK && o->resume_from)
        rc = resume_run(&t, o, &start);
    regc_load_report loaded;
    if (rc == REGC_OK)
        rc = regc_trainer_check_memory_fits(&t, t.program);
    const double setup_t0 = regc_time_ms();
    if (rc == REGC_OK)
        rc = bind_memory(&t, o, start, &loaded);
    const double setup_ms = regc_time_ms() - setup_t0;
    if (rc == REGC_OK && o->on_memory) {
        regc_device_memory a;
        regc_program_device_memory(t.program, &a);
        o->on_memory(&a, user);
    }
    if (rc == REGC_OK && o->on_loaded)
        o->on_loaded(&loaded, user);
    if (stopped_at)
        *stopped_at = -1;
    int stopped = 0, next_plan = 0;
    if (rc == REGC_OK)
        rc = regc_trainer_replan_resumed(&t, o, &co, start, &next_plan, user);
    for (int step = (int)start; rc == REGC_OK && step < o->steps && !stopped; step++) {
        if ((rc = regc_trainer_replan_at(&t, o, &co, step, start, &next_plan, user)))
            break;
        double t0 = regc_time_ms();
        /* the first of several steps warms caches and pages: not profiled */
        regc_profile *pr = step > 0 || o->steps == 1 ? o->profile : NULL;
        regc_step_report r = {.step = step, .setup_ms = step == start ? setup_ms : 0.0};
        const double captured = regc_program_capture_ms(t.program);
        if ((rc = regc_trainer_step(&t, o, step, pr, &r)))
            break;
        r.capture_ms = regc_program_capture_ms(t.program) - captured;
        if (r.nonfinite && !o->skip_nonfinite) {
            rc = regc_error(REGC_ERR_DIVERGED,
                            "step %d: the %s is not finite; stopped before its update%s%s "
                            "(train.on_nonfinite: skip goes on past such steps)",
                            step, r.nonfinite, t.checkpoint[0] ? ", the last checkpoint is " : "",
                            t.checkpoint);
            break;
        }
        t.skipped += r.nonfinite != NULL;
        r.ms = regc_time_ms() - t0;
        r.device_peak = t.be->mem_peak;
        /* the job's rate: every rank's tokens */
        r.tokens_per_s = (double)(o->batch * o->seq * o->grad_accum * t.comm->size) / (r.ms / 1e3);
        r.val_loss = NAN;
        int eval = t.val_program &&
                   (o->eval_steps > 0 ? (step + 1) % o->eval_steps == 0 : step == o->steps - 1);
        if (eval && (rc = regc_trainer_evaluate(&t, o, &r.val_loss)))
            break;
        /* a signal may reach the ranks at different steps: they stop together */
        int64_t stop = o->stop && *o->stop;
        if ((rc = t.comm->allreduce(t.comm, &stop, 1, REGC_COMM_I64)))
            break;
        stopped = stop > 0;
        int due = o->save_steps > 0 && (step + 1) % o->save_steps == 0;
        if ((due || stopped) && o->output_dir) {
            if ((rc = regc_trainer_save_checkpoint(&t, o, step + 1)))
                break;
            r.checkpoint = t.checkpoint;
        }
        r.resumed = step == start && start > 0;
        if (on_step)
            on_step(&r, user);
        if (stopped && stopped_at)
            *stopped_at = step + 1;
    }
    if (rc == REGC_OK && o->save_dir && !stopped)
        rc = regc_trainer_save_model(&t, o->save_dir);
    /* the trained weights return to the model */
    if (rc == REGC_OK && o->return_weights && (rc = regc_model_alloc_weights(m)) == REGC_OK)
        rc = regc_trainer_block_to_host(&t, regc_model_weights(m), t.params);
    if (rc == REGC_OK && o->return_weights && t.frozen)
        rc = regc_trainer_frozen_to_host(&t, regc_model_weights(m));
    trainer_free(&t);
    return rc;
}
