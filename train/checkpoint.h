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
    int64_t global_step; /* optimizer steps done */
    int64_t next_batch;  /* the next micro-batch of the data, in llm.c's order */
    uint64_t structure;  /* hash of the model's structure (regc_model_write_structure) */
    /* the settings that decide what the remaining steps compute (batch: the
     * global batch, over every rank) */
    int64_t steps, batch, seq, grad_accum, warmup, data_tokens;
    uint64_t data_hash; /* of the tokens and their loss mask */
    uint64_t seed;
    double lr, weight_decay, max_grad_norm, min_lr_rate;
    int schedule; /* regc_schedule */
} regc_run_state;

/* The state a run with options o over model m and data is in after `step`
 * optimizer steps. */
int regc_run_state_of(const regc_train_options *o, const regc_model *m, const regc_tokens *data,
                      int64_t step, regc_run_state *st);

/* Write output_dir/checkpoint-<global_step>: the model as a Hugging Face
 * directory (its weights as they are on the host), AdamW's moments m1 and
 * m2 ([total_numel] each, in parameter order) by parameter name, and the
 * state. The directory appears whole or not at all. *dir gets its path. */
int regc_checkpoint_save(const char *output_dir, const regc_run_state *st, const regc_model *m,
                         const float *m1, const float *m2, char *dir, size_t cap);

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

/* Load a checked checkpoint: the weights into m, the moments into m1, m2. */
int regc_checkpoint_load(const char *dir, regc_model *m, float *m1, float *m2);

/* Keep the `keep` checkpoints of output_dir with the most steps (0: all),
 * and remove what writers that died left behind. */
int regc_checkpoint_prune(const char *output_dir, int keep);

#endif
