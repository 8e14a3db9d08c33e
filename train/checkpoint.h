/* checkpoint.h — private to train/: checkpoints a run can resume from. */
#ifndef REGC_CHECKPOINT_H
#define REGC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "regc_train.h"

/* Where a run stands and what it was started with: written into every
 * checkpoint's trainer_state.json, and compared on resume so that a run
 * continues only what it would have computed had it never stopped. */
typedef struct {
    int64_t global_step;   /* training steps done */
    int64_t skipped_steps; /* of them, those skipped for a non-finite loss or norm */
    int64_t next_batch; /* the next micro-batch of the data, in its order (llm.c's, or shuffled) */
    uint64_t structure; /* hash of the model's structure (regc_model_write_structure) */
    /* the settings that decide what the remaining steps compute (batch: the
     * global batch, over every rank) */
    int64_t steps, batch, seq, grad_accum, warmup, data_tokens;
    uint64_t data_hash; /* of the tokens and their loss mask */
    uint64_t seed;
    double lr, weight_decay, max_grad_norm, min_lr_rate;
    double beta1, beta2, eps; /* AdamW's (a checkpoint without them: torch's defaults) */
    int schedule;             /* regc_train_schedule */
    /* regc_decay_params where weight_decay is not 0 (else all: the same
     * step); a checkpoint without it: all */
    int decay_params;
    /* DeepSpeed's schedules' parameters as they apply (0 for the others) */
    double warmup_min_lr, warmup_min_ratio, cos_min_ratio;
    int64_t warmup_type, total_num_steps;
    /* train.eod_token_id (part of the structure too; -1: none, or before
     * it), reset_position_ids and eod_mask_loss (0 or 1; 0 before them) */
    int64_t eod, reset_positions, mask_eod;
    /* train.shuffle (0 or 1; 0 before it) and its data_seed (0 when off) */
    int64_t shuffle;
    uint64_t data_seed;
} regc_run_state;

/* The state a run with options o over model m and data is in after `step`
 * optimizer steps. */
int regc_run_state_of(const regc_train_options *o, const regc_model *m, const regc_tokens *data,
                      int64_t step, regc_run_state *st);

/* A checkpoint being written: output_dir/checkpoint-<step> is a staged
 * directory (regc_staged_dir), so it appears whole or not at all, and
 * replaces a checkpoint of the same step (a resumed run) in one rename. The
 * caller streams the model (a model directory) and AdamW's moments into
 * tmp between begin and commit. */
typedef struct {
    char output_dir[4096];
    regc_staged_dir *staged;
    const char *tmp; /* where it is written */
} regc_checkpoint_writer;

int regc_checkpoint_begin(const char *output_dir, int64_t step, regc_checkpoint_writer *ck);
/* tmp/optimizer.safetensors for m's moments, fp32 by parameter name:
 * tensor 2i is exp_avg.<name i>, 2i + 1 exp_avg_sq.<name i>. */
int regc_checkpoint_moments_open(const regc_checkpoint_writer *ck, const regc_model *m,
                                 regc_st_writer **out);
/* Write the state file, make everything durable, rename into place. */
int regc_checkpoint_commit(regc_checkpoint_writer *ck, const regc_run_state *st);
void regc_checkpoint_abandon(regc_checkpoint_writer *ck);

/* The checkpoint of output_dir with the most steps, into buf. */
int regc_checkpoint_latest(const char *output_dir, char *buf, size_t cap);

/* Do a and b describe runs that compute different things? 1 and the first
 * difference in buf ("train.batch is 2 <a_is>, 4 <b_is>"), else 0. With
 * any_length, the number of steps may differ where the schedule does not
 * depend on it. */
int regc_run_state_differ(const regc_run_state *a, const char *a_is, const regc_run_state *b,
                          const char *b_is, int any_length, char *buf, size_t cap);

/* Read a checkpoint's state, refusing one whose model or settings differ
 * from `now` with one line naming what differs. */
int regc_checkpoint_check(const char *dir, const regc_run_state *now, regc_run_state *saved);

/* A checked checkpoint's weights, exp_avg and exp_avg_sq as sources
 * (src[0..2]): a rank reads only its shards of them. */
int regc_checkpoint_open(const char *dir, const regc_model *m, regc_weights *src[3]);

/* Keep the `keep` checkpoints of output_dir with the most steps (0: all),
 * and remove what writers that died left behind. */
int regc_checkpoint_prune(const char *output_dir, int keep);

#endif
