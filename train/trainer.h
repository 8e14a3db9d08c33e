/* trainer.h — private to train/: a run's state, shared by the loop
 * (train.c) and the step (step.c). */
#ifndef REGC_TRAINER_H
#define REGC_TRAINER_H

#include "regc_train.h"

typedef struct {
    regc_model *model;
    regc_backend *be;
    regc_tokens *tokens;
    regc_program *program;
    regc_tokens *val_tokens;       /* validation data, or NULL */
    regc_program *val_program;     /* forward only, over the same parameters and inputs */
    regc_cache *cache;             /* opened from cache_dir, or NULL */
    float *params, *grads, *m, *v; /* device, [block] each (m and v: host when offloaded) */
    void *frozen;                  /* device, frozen_bytes: the parameters never trained */
    int64_t frozen_bytes;          /* the model's frozen block, or under ZeRO-3 this rank's shard */
    const regc_shard_layout *frozen_shards; /* the program's, under ZeRO-3; else NULL */
    /* where m and v live: be, or under offload_optimizer on a GPU a CPU
     * backend over the host memory be->alloc_host gave */
    regc_backend *state_be;
    regc_backend *own_state_be;
    int64_t block; /* the trained parameters' floats, or under ZeRO-3 this rank's shard */
    const regc_shard_layout *shards; /* the program's, under ZeRO-3; else NULL */
    regc_step_scalars *scalars;      /* device: the optimizer's state and constants */
    regc_step_scalars host;          /* what the trainer set, and the last step's readback */
    int n_inputs;
    regc_input *inputs; /* [n_inputs] the graph's inputs with host buffers */
    void **d_inputs;    /* [n_inputs] their device copies */
    int constants_sent; /* the constant inputs are on the device */
    int64_t *counts;    /* [grad_accum] targets that count, per micro-batch */
    float *losses;      /* [grad_accum] each micro-batch's loss */
    /* where the weights, AdamW's m and v come from (NULL: the model's
     * weights, zeros): each rank reads only its shards */
    regc_weights *src[3];
    char checkpoint[4096]; /* the last checkpoint written (or resumed from) */
    int64_t skipped;       /* steps skipped so far for a non-finite loss or norm */
    /* [2 n_no_decay] the ranges of this rank's block that AdamW does not
     * decay (decay.c), or NULL: every parameter decays */
    int64_t *no_decay;
    int n_no_decay;
    regc_comm *comm;          /* the ranks (one process: a single communicator) */
    regc_comm *own_comm;      /* that communicator, when the caller gave none */
    regc_comm *step_comm;     /* the step's collectives: comm, or own_step_comm */
    regc_comm *own_step_comm; /* staged or NCCL over device buffers */
} trainer;

/* One optimizer step over grad_accum micro-batches on every rank: its
 * report's loss (of the global batch), rate and norm. pr (NULL: none) times
 * the parts. */
int regc_trainer_step(trainer *t, const regc_train_options *o, int step, regc_profile *pr,
                      regc_step_report *r);

/* Is a step program's memory within the device's (train.c)? Else an
 * error with the figures. */
int regc_trainer_check_memory_fits(trainer *t, const regc_program *p);
/* The step program (and the validation one) onto the trainer's memory. */
int regc_trainer_bind_programs(trainer *t, const regc_train_options *o);

/* The part of trained parameter i, the j-th of those trained (the shard
 * layout's numbering), this rank's block holds: elements [first, first +
 * n) of it, at float `at` of the block (trainer_state.c). */
void regc_trainer_param_part(const trainer *t, int i, int j, int64_t *first, int64_t *n,
                             int64_t *at);
/* t->no_decay from o->weight_decay_params, for this rank's block (decay.c). */
int regc_trainer_no_decay(trainer *t, const regc_train_options *o);

/* ---- compile.schedule (replan.c) */
/* *next_plan: the first listed step after `start`; a run resumed past a
 * listed step compiles that step's plan now. */
int regc_trainer_replan_resumed(trainer *t, const regc_train_options *o,
                                const regc_compile_options *co, int64_t start, int *next_plan,
                                void *user);
/* Before step `step`: measuring starts a few steps ahead of the next
 * listed one, and at it the step is compiled again (*next_plan advances). */
int regc_trainer_replan_at(trainer *t, const regc_train_options *o, const regc_compile_options *co,
                           int step, int64_t start, int *next_plan, void *user);

/* The validation loss over the first val_batches global batches. */
int regc_trainer_evaluate(trainer *t, const regc_train_options *o, float *val_loss);

/* The weights (the model's, or t->src[0]) and the moments (t->src[1..2],
 * else zeros) onto the allocated device blocks; *r: what every rank read. */
int regc_trainer_load_state(trainer *t, const regc_train_options *o, regc_load_report *r);
/* The frozen block back into the model's weights (fp32), on every rank. */
int regc_trainer_frozen_to_host(trainer *t, float *model);
/* A device block into a model-ordered host block on every rank (joined
 * from every rank's shards under ZeRO-3). */
int regc_trainer_block_to_host(trainer *t, float *model, const float *dev);
/* After rank 0 wrote files (wrc: how that went; rc: this rank's own
 * status): rank 0's status on every rank, the others failing with
 * REGC_ERR_RANK when it failed (it says why). */
int regc_trainer_rank0_status(trainer *t, int rc, int wrc);
/* The weights as a model directory, streamed from the device. */
int regc_trainer_save_model(trainer *t, const char *dir);
/* output_dir/checkpoint-<done>, streamed; the newest save_total_limit kept. */
int regc_trainer_save_checkpoint(trainer *t, const regc_train_options *o, int64_t done);

/* ---- several ranks (ranks.c) */
/* Threads of this rank: as asked, else OMP_NUM_THREADS, else its share of
 * the host's cores. */
int regc_trainer_threads(const regc_train_options *o, const regc_comm *c);
/* The backend this rank trains on ("cuda" becomes its GPU among the
 * host's), into buf. */
const char *regc_trainer_rank_backend(const regc_train_options *o, const regc_comm *c, char *buf,
                                      size_t cap);
/* t->step_comm: the communicator of the step's collectives. */
int regc_trainer_open_step_comm(trainer *t, const regc_train_options *o);
/* Every rank runs what rank 0 runs, or the job fails with one line saying
 * what differs (on rank 0; REGC_ERR_RANK on the others). */
int regc_trainer_check_ranks_agree(trainer *t, const regc_train_options *o);

#endif
