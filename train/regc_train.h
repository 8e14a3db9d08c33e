/* regc_train.h — the training loop and its config file. */
#ifndef REGC_TRAIN_H
#define REGC_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "regc_common.h"
#include "regc_models.h"
#include "regc_region.h"

/* ======================================================================
 * Training
 * ====================================================================== */
/* What the step's collectives run on (the trainer's own messages always
 * go over the ranks' host communicator). */
typedef enum {
    REGC_COMMUNICATOR_AUTO,   /* mpi on the cpu; nccl on GPUs of their own; else staged */
    REGC_COMMUNICATOR_MPI,    /* the host communicator on the buffers as they are (cpu) */
    REGC_COMMUNICATOR_STAGED, /* device buffers copied through host memory around it */
    REGC_COMMUNICATOR_NCCL,   /* NCCL between the ranks' GPUs */
} regc_communicator;

/* The start-up read of the weights (and a resumed checkpoint's moments)
 * into the ranks' shards. */
typedef struct {
    const char *from; /* the directory or file, or NULL: seeded, or the model's own */
    int64_t bytes;    /* of the files, read by all ranks together */
    double ms;        /* the slowest rank's time reading them onto the device */
} regc_load_report;

/* The training data as opened: every token checked against the
 * vocabulary and hashed. */
typedef struct {
    const char *from; /* the file or pattern; NULL: the built-in corpus */
    int files;        /* the files it names */
    int64_t tokens;   /* in them all */
    int masked;       /* a loss mask beside them */
    double ms;        /* the open's time */
} regc_data_report;

/* compile.schedule: the steps at which a run compiles its step again, each
 * with its own schedule passes, given the profile measured since the last
 * plan (regc_region.h's "Schedule passes"). */
#define REGC_MAX_REPLANS 8
typedef struct {
    int n;
    struct {
        int64_t step; /* > 0, ascending */
        regc_pass_list passes;
    } at[REGC_MAX_REPLANS];
} regc_replan_list;

typedef struct {
    const char *data_path; /* NULL: the built-in corpus */
    /* loss masks beside data_path and val_data_path (regc_data.h): only the
     * targets they mark count toward the loss; causal language models only */
    const char *loss_mask, *val_loss_mask;
    /* train.shuffle: each epoch reads data_path's rows in a permutation
     * drawn from data_seed (regc_tokens_set_shuffle); 0: llm.c's order */
    int shuffle;
    uint64_t data_seed;
    int64_t batch, seq;
    int steps;
    /* train.num_train_epochs: > 0 makes `steps` the optimizer steps that
     * read the token file this many times (regc_train_resolve_epochs) */
    double num_train_epochs;
    float lr, weight_decay;
    int weight_decay_params; /* regc_decay_params: the parameters weight_decay applies to */
    /* AdamW; 0.9, 0.999, 1e-8 by default (beta1 and beta2 side by side:
     * DeepSpeed's betas set both) */
    float beta1, beta2, eps;
    int lr_scheduler;     /* train.lr_scheduler_type: regc_train_schedule (default constant) */
    int64_t warmup_steps; /* optimizer steps of warmup */
    double warmup_ratio;  /* or this fraction of steps (rounded up), when warmup_steps is 0 */
    double min_lr, min_lr_rate; /* cosine_with_min_lr's floor: absolute, or as a fraction of lr */
    /* DeepSpeed's schedulers' parameters (scheduler.params): the rate
     * warmup starts from (WarmupLR, WarmupDecayLR); the warmup's curve
     * (0 log, 1 linear); the schedule's length (0: steps); where
     * WarmupCosineLR's warmup starts and its cosine ends, as fractions of
     * lr (negative: DeepSpeed's defaults, 0 and 0.0001) */
    double warmup_min_lr;
    int warmup_type;
    int64_t total_num_steps;
    double warmup_min_ratio, cos_min_ratio;
    double max_grad_norm; /* > 0: clip the gradients' global L2 norm to it */
    /* A step whose loss or gradient norm is not finite changes nothing; then
     * 0 stops the run with REGC_ERR_DIVERGED, 1 goes on to the next step. */
    int skip_nonfinite;
    int grad_accum; /* micro-batches per optimizer step (>= 1) */
    /* validation: the mean loss over the first val_batches batches of
     * val_data_path (a token file), through a forward-only program, after
     * every eval_steps steps (0: once, after the last) */
    const char *val_data_path;
    int eval_steps, val_batches;
    /* checkpoints: output_dir/checkpoint-N after every save_steps steps
     * (0: none), the last save_total_limit of them kept (0: all) */
    const char *output_dir;
    int save_steps, save_total_limit;
    /* a checkpoint directory to continue from, or "latest" (the newest in
     * output_dir); the run then goes on exactly as if it had never stopped */
    const char *resume_from;
    /* when set and it becomes non-zero (a signal handler's flag), the run
     * finishes the step under way, writes a checkpoint into output_dir and
     * returns REGC_OK with stopped_at set, skipping save_dir */
    volatile const sig_atomic_t *stop;
    /* data parallelism: the ranks' communicator (NULL: one process). Rank r
     * reads rows r x batch .. of each global batch of ranks x batch rows. */
    regc_comm *comm;
    int zero_stage;                 /* zero_optimization.stage: 0 or 3 */
    regc_communicator communicator; /* zero_optimization.communicator */
    uint64_t seed;                  /* random init of presets */
    /* where a shape-only model's weights are read from: a Hugging Face
     * directory or a safetensors file; each rank reads only the byte ranges
     * of its own shards (NULL: the seeded init) */
    const char *weights;
    /* 1 (the default): the trained weights go back into the model at the
     * end (a shape-only model gets them, and every rank holds the whole
     * model for a moment); 0: the model is left as it was, the run's
     * weights being in save_dir and the checkpoints */
    int return_weights;
    const char *save_dir; /* NULL: do not save */
    const char *backend;  /* "cpu" */
    /* compile.tf32: the backend's fp32 GEMMs may multiply TF32 operands
     * (regc_backend.tf32); refused under fp32 on a backend without them */
    int tf32;
    int threads; /* <= 0: OMP_NUM_THREADS or all cores */
    regc_compile_options compile;
    regc_replan_list replans; /* compile.schedule */
    /* zero_optimization.offload_optimizer.pin_memory (default 1): the
     * offloaded state is always in pinned memory; 0 is refused */
    int offload_pin_memory;
    const char *cache_dir;   /* the compile cache's directory; NULL: none */
    int64_t cache_max_bytes; /* its size limit; <= 0: none */
    /* when set, every step after the first (the only one, if just one) is
     * timed per instruction, the optimizer and input copies included */
    regc_profile *profile;
    /* called once the step is compiled, with regc_train's user pointer */
    void (*on_compiled)(const regc_compile_stats *st, void *user);
    /* called once the run's device memory is allocated: its account */
    void (*on_memory)(const regc_device_memory *a, void *user);
    /* called once the weights (and a checkpoint's moments) are on the
     * device: what every rank read, together */
    void (*on_loaded)(const regc_load_report *r, void *user);
    /* called once the training data is open: what it holds */
    void (*on_data)(const regc_data_report *r, void *user);
} regc_train_options;

void regc_train_options_default(regc_train_options *o);

/* train.lr_scheduler_type: Hugging Face's schedules (regc_schedule), which
 * the step's update computes from the step count, then DeepSpeed's
 * (deepspeed/runtime/lr_schedules.py), whose rate the trainer computes on
 * the host before each step (regc_train_ds_lr) and gives the update as its
 * base rate under the constant schedule. */
enum {
    REGC_SCHEDULE_WARMUP_LR = REGC_SCHEDULE_COUNT, /* warmup, then constant */
    REGC_SCHEDULE_WARMUP_DECAY_LR,                 /* warmup, then linear to 0 */
    REGC_SCHEDULE_WARMUP_COSINE_LR,                /* warmup, then a half cosine */
    REGC_TRAIN_SCHEDULE_COUNT
};

/* train.weight_decay_params: which trained parameters AdamW decays
 * (train/decay.c). */
typedef enum {
    REGC_DECAY_ALL,           /* every one: DeepSpeed's optimizer, torch's AdamW */
    REGC_DECAY_NOT_BIAS_NORM, /* all but biases and norm weights: Transformers' Trainer */
} regc_decay_params;
/* Their names, in that order, NULL-terminated: "all", "not_bias_norm". */
extern const char *const regc_decay_params_names[];
/* Does Transformers' Trainer decay a parameter of this name, the
 * checkpoint's (its name patterns: not "bias", "layernorm", "rmsnorm", a
 * "norm" or "..._norm" component)? */
int regc_train_name_decays(const char *name);
/* decays[i] (regc_model_n_params entries): whether AdamW decays parameter
 * i under `params_kind` (regc_decay_params); under not_bias_norm, a
 * LayerNorm's scale and shift in m's graph at [batch, seq] do not decay,
 * nor do names regc_train_name_decays refuses. */
int regc_train_decayed_params(const regc_model *m, int params_kind, int64_t batch, int64_t seq,
                              unsigned char *decays);

/* The name of schedule s ("linear", "WarmupDecayLR"), or NULL. */
const char *regc_train_schedule_name(int s);
/* Is schedule s one of DeepSpeed's? */
int regc_train_schedule_is_deepspeed(int s);

/* DeepSpeed's learning rate for optimizer step s (from 0) under o's
 * DeepSpeed schedule: what its scheduler's get_lr() gives after s calls
 * of step() (the engine steps it after each applied optimizer step, so the
 * first step runs at the rate the constructor set), with warmup_num_steps
 * regc_train_warmup_steps(o), total_num_steps o->total_num_steps (else
 * o->steps) and the peak o->lr. */
double regc_train_ds_lr(const regc_train_options *o, int64_t s);

/* With o->num_train_epochs > 0: o->steps = the optimizer steps that take
 * ceil(epochs x B) micro-batches, B the batches of ranks x batch rows the
 * token file (o->data_path, else the built-in corpus) holds before
 * llm.c's order starts again at its beginning (rows of 2 x seq tokens for
 * T5, which m names; m may be NULL). One line naming the file when it
 * cannot be read or is too short for one batch. */
int regc_train_resolve_epochs(regc_train_options *o, const regc_model *m, int ranks);

/* compile.passes and compile.schedule as text ("prefetch,selective_gather@512",
 * "5:prefetch;20:none"; names must be registered passes): 0, or -1 with
 * why the text is wrong in why. */
int regc_passes_from_text(const char *text, regc_pass_list *l, char *why, size_t cap);
int regc_replans_from_text(const char *text, regc_replan_list *l, char *why, size_t cap);
/* The text form of a list of passes ("none" for none). */
void regc_passes_to_text(const regc_pass_list *l, char *buf, size_t cap);

typedef struct {
    int step;   /* from 0 */
    float loss; /* of this step's forward pass, before its update (over all its micro-batches) */
    double lr;  /* the learning rate of its update */
    float grad_norm; /* the gradients' global L2 norm before clipping; NaN without clipping */
    /* "loss" or "gradient norm" when that was not finite: the step was
     * skipped, its update not applied; NULL otherwise */
    const char *nonfinite;
    float val_loss;         /* the validation loss after this step's update; NaN when none ran */
    const char *checkpoint; /* the checkpoint written after this step, or NULL */
    int resumed;            /* the first step of a run resumed from a checkpoint */
    double ms;              /* wall time of the whole step */
    /* the first step of a run only (0 on the others): the set-up before it
     * — device memory, the weights in, and binding the step, where the
     * backend prepares every GEMM (cuBLASLt's descriptors and algorithms
     * on a GPU) */
    double setup_ms;
    /* O2 on a GPU: capturing the step (its run and update) into graphs in
     * this step (the second), 0 on the others */
    double capture_ms;
    double tokens_per_s; /* of the whole job: every rank's tokens */
    /* ZeRO-3 over several ranks: this step's collectives on the
     * communication queue, and how long the step waited for them (the part
     * not hidden behind compute); 0 otherwise */
    double comm_ms, comm_wait_ms;
    int64_t device_peak; /* the device's high-water mark so far (backends that count) */
} regc_step_report;

typedef void (*regc_step_fn)(const regc_step_report *r, void *user);

/* Warmup in optimizer steps: warmup_steps, else the ratio of the run
 * rounded up (Hugging Face's get_warmup_steps). */
int64_t regc_train_warmup_steps(const regc_train_options *o);

/* Check o without running anything: an option out of range, or options
 * that contradict each other (warmup longer than the run, min_lr without
 * cosine_with_min_lr, ...), is an error naming the config key. */
int regc_train_check_options(const regc_train_options *o);

/* Train m in place for o->steps steps, calling on_step after each. Presets
 * without weights are initialised from o->seed first (a resumed run takes
 * the checkpoint's). *stopped_at (may be NULL) is -1, or the steps done
 * when o->stop ended the run early. */
int regc_train(regc_model *m, const regc_train_options *o, regc_step_fn on_step, void *user,
               int *stopped_at);

/* ======================================================================
 * The options of a run. One table (train/options.c) lists every option
 * with its config-file key, its flag, type, range, default and help; it
 * drives `regc train`'s flags, the config file's keys and the usage text.
 * ====================================================================== */
/* lora.target_modules: module names separated by commas (a JSON list, or
 * the flag's text), or a regular expression (a JSON string, PEFT's rule),
 * or "all-linear". */
typedef struct {
    char text[1024];
    int regex;
} regc_lora_targets;

/* Everything a training run is configured with: the library's options,
 * and what the command adds (the model to load, the output form). */
typedef struct {
    regc_train_options train;
    const char *model;   /* train.model, --model */
    const char *weights; /* train.weights, --weights: a graph JSON model's weights */
    /* the lora section (0 / empty: unset; LoRA is on with lora.r or --adapter) */
    struct {
        int64_t r;
        double alpha, dropout;
        int use_rslora;
        regc_lora_targets targets;
        int base_dtype; /* lora.base_dtype: regc_base_dtype */
    } lora;
    /* the quantization section (Transformers' BitsAndBytesConfig names) */
    struct {
        int load_in_4bit;  /* the base in NF4: lora.base_dtype nf4 */
        int quant_type;    /* bnb_4bit_quant_type: 0 nf4 (the one regc has) */
        int double_quant;  /* bnb_4bit_use_double_quant */
        int compute_dtype; /* bnb_4bit_compute_dtype: 0 auto, 1 float32, 2 bfloat16 */
    } quant;
    const char *adapter;    /* train.adapter, --adapter: a PEFT adapter directory to start from */
    int dropout;            /* train.dropout, --dropout: the model's dropouts applied */
    int64_t eod_token_id;   /* train.eod_token_id: documents end after it; -1 none */
    int reset_position_ids; /* train.reset_position_ids: positions from each document's start */
    int eod_mask_loss;      /* train.eod_mask_loss: the target read at an eod does not count */
    int json;               /* train.json, --json: one JSON object per step */
    const char *config;     /* --config: the config file */
    int profile;            /* --profile */
    int no_cache;           /* --no-cache */
    /* A DeepSpeed config (train.deepspeed, --deepspeed, Transformers'
     * "deepspeed"): read after the --config file, over the same table */
    const char *deepspeed;
    int print_config; /* --print-config: print the resolved settings, do not train */
    /* DeepSpeed's train_batch_size: micro-batch x accumulation x ranks (0:
     * unset; regc_settings_resolve derives or checks it) */
    int64_t train_batch_size;
    /* optimizer.type (0 AdamW, 1 Adam) and optimizer.params.adam_w_mode:
     * DeepSpeed's Adam is AdamW unless adam_w_mode is false */
    int optimizer_type, adam_w_mode;
    int save_strategy;  /* Transformers' save_strategy: 0 steps, 1 no (no checkpoints) */
    int average_tokens; /* Transformers' average_tokens_across_devices */
} regc_train_settings;

void regc_train_settings_default(regc_train_settings *s);

/* Where each option's value came from: its default, a file (and the key
 * as the file spells it), a flag, or another option it follows from. */
typedef struct regc_origins regc_origins;
regc_origins *regc_origins_new(void);
void regc_origins_free(regc_origins *o);

typedef struct regc_option regc_option;
/* The option of a flag ("--batch"), or NULL for an unknown flag. */
const regc_option *regc_option_by_flag(const char *flag);
/* 0 for a flag that takes no value (--json). */
int regc_option_takes_value(const regc_option *o);
/* Set option o in s from command-line text (NULL: no value given), checked
 * against its type and range; a string is stored as the pointer given.
 * REGC_ERR_ARG with a message naming the flag when the value is wrong. */
int regc_option_set_text(const regc_option *o, regc_train_settings *s, const char *text);
/* Every flag with its value, help, config key and default, wrapped for a
 * terminal: the options part of `regc train --help`. */
void regc_option_write_usage(FILE *f);
/* Record that option o was set by its flag (flag NULL) or by another that
 * implies it (a string that outlives `from`: "--no-cache"); NULL origins:
 * nothing. */
void regc_origins_flag(regc_origins *from, const regc_option *o, const char *flag);

/* ======================================================================
 * Config file (JSON): {"compile": {...}, "train": {...}} with the option
 * table's keys. Unknown keys and bad values are errors naming the file
 * and the key.
 * ====================================================================== */
typedef struct regc_config regc_config;
int regc_config_load(const char *path, regc_config **out);
/* The same for the file's text: size bytes followed by a NUL (a NUL within
 * them is an error); `path` names it in messages. */
int regc_config_parse(const char *text, size_t size, const char *path, regc_config **out);
void regc_config_free(regc_config *c);
/* Set the fields of s that the file sets; strings stay owned by c. */
void regc_config_apply(const regc_config *c, regc_train_settings *s);
/* The same, recording in `from` where each value came from (may be NULL).
 * A value that an earlier file applied to `from` set otherwise is refused
 * naming both files and keys, as Transformers refuses a DeepSpeed value
 * that differs from its own: REGC_ERR_FORMAT. */
int regc_config_apply_from(const regc_config *c, regc_train_settings *s, regc_origins *from);

/* The settings the files and flags gave, made whole for `ranks` processes
 * (m: the model, may be NULL): DeepSpeed's train_batch_size checked
 * against micro-batch x accumulation x ranks or the missing one of the
 * three derived, num_train_epochs turned into steps, Transformers'
 * save_strategy, and the options that only apply together checked. One
 * line naming the keys as the file spelled them. */
int regc_settings_resolve(regc_train_settings *s, regc_origins *from, int ranks,
                          const regc_model *m);
/* The whole resolved configuration as regc's own JSON: every option under
 * its section and key, {"value": ..., "from": "default" | "flag --x" |
 * "FILE: key" | ...}. */
int regc_settings_print(FILE *f, const regc_train_settings *s, const regc_origins *from);
const char *regc_config_model(const regc_config *c);   /* train.model or NULL */
const char *regc_config_weights(const regc_config *c); /* train.weights or NULL */
/* train.deepspeed (Transformers' "deepspeed") as a path, or NULL */
const char *regc_config_deepspeed(const regc_config *c);
int regc_config_json(const regc_config *c); /* train.json: 1, 0, or -1 when unset */

#endif
