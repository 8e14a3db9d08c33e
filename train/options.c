/* options.c — the options of a training run, as one table.
 *
 * Each row is one option: its config-file key, its flag (the key with
 * dashes where the two coexist), its type and range, the field of
 * regc_train_settings it sets, and its help. The flag parser of `regc
 * train`, the config file's reader (config.c) and the usage text all walk
 * this table, so an option is added, renamed or re-ranged in one place.
 * Values are checked here, strictly, with one wording per type and
 * medium: a flag's message names the flag, the file's names the key. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

/* Rows give the fields they need and leave the rest (aliases, values) zero:
 * the table would be unreadable with every field of every row spelled out. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#define FIELD(f) offsetof(regc_train_settings, f), sizeof(((regc_train_settings *)0)->f)

static const char *const base_dtype_names[] = {"fp32", "bf16", NULL}; /* regc_base_dtype */
static const char *const quant_type_names[] = {"nf4", NULL};
/* auto: a checkpoint saved in 4 bits says, else float32 */
static const char *const compute_dtype_names[] = {"auto", "float32", "bfloat16", NULL};
/* regc_communicator's order */
static const char *const communicator_names[] = {"auto", "mpi", "staged", "nccl", NULL};
static const char *const offload_names[] = {"none", "cpu", NULL};
/* regc_train_options.skip_nonfinite */
static const char *const nonfinite_names[] = {"stop", "skip", NULL};
/* regc_train_schedule's order: Hugging Face's, then DeepSpeed's */
static const char *const schedule_names[] = {"constant",      "constant_with_warmup", "linear",
                                             "cosine",        "cosine_with_min_lr",   "WarmupLR",
                                             "WarmupDecayLR", "WarmupCosineLR",       NULL};
static const char *const warmup_type_names[] = {"log", "linear", NULL};
static const char *const optimizer_names[] = {"AdamW", "Adam", NULL};
static const char *const save_strategy_names[] = {"steps", "no", NULL};
#include "option_reasons.h"

/* A row of a key that changes nothing (kind: the JSON kinds it takes,
 * "bool|null", or NULL for any), and of one that changes nothing at the
 * values listed and is refused at any other. */
#define INERT(section, key, kind, why)                                                             \
    {                                                                                              \
        section, key, NULL, OPT_INERT, NULL, 0, 0, 0, NULL, 0, 0, 0, why, .values = kind           \
    }
#define NEUTRAL(section, key, values_, why)                                                        \
    {                                                                                              \
        section, key, NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, 0, why, .values = values_      \
    }
#define NEUTRAL_AUTO(section, key, values_, why)                                                   \
    {                                                                                              \
        section, key, NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, OPT_AUTO, why,                 \
            .values = values_                                                                      \
    }

const regc_option regc_option_table[] = {
    {"train", NULL, "--config", OPT_STRING, "<FILE>", 0, 0, 0, NULL, FIELD(config), 0,
     "JSON config file {\"compile\": {...}, \"train\": {...}} whose keys are these options' "
     "(train.steps, ..., compile.level, ...), or their DeepSpeed (a ds_config.json) or "
     "Transformers TrainingArguments spellings, listed as \"also\"; unknown keys are errors. "
     "Every flag given on the command line overrides the file, wherever it appears; --model is "
     "not needed when the file sets train.model"},
    {"train", "deepspeed", "--deepspeed", OPT_STRING, "<FILE>", 0, 0, 0, NULL, FIELD(deepspeed), 0,
     "a DeepSpeed config (ds_config.json) read after the --config file: its keys as DeepSpeed "
     "spells them, \"auto\" where Transformers fills one in taking regc's own value; a value "
     "both files give must agree (Transformers' inline dict form is read in place)",
     .alias = {{"deepspeed"}}},
    {"train", NULL, "--print-config", OPT_FLAG, NULL, 0, 0, 0, NULL, FIELD(print_config), 0,
     "print the whole resolved configuration as regc's JSON, every key with its value and where "
     "it came from (default, file and key, flag, or the options it follows from), and exit "
     "without training"},
    {"train", "model", "--model", OPT_STRING, "<dir|file|preset>", 0, 0, 0, NULL, FIELD(model),
     OPT_LIST_PRESETS,
     "Hugging Face model directory (config.json + safetensors), a regc graph JSON file (see regc "
     "dump-graph; it trains only at the batch and sequence it was built for, initialised at "
     "random from --seed unless --weights is given, which a graph with constants needs: "
     "dump-graph --save writes both), or a built-in preset, initialised at random from --seed:"},
    {"train", "weights", "--weights", OPT_STRING, "<FILE>", 0, 0, 0, NULL, FIELD(weights), 0,
     "safetensors file with the weights of a graph JSON model, matched by the graph's parameter "
     "and constant names (graph models only)"},
    {"train", "adapter", "--adapter", OPT_STRING, "<DIR>", 0, 0, 0, NULL, FIELD(adapter), 0,
     "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) to train "
     "further: its configuration is the lora section's, the base is --model"},
    {"train", "dropout", "--dropout", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL, FIELD(dropout),
     OPT_SHOW_DEFAULT,
     "apply the model's dropouts as Transformers trains (GPT-2's embedding, residual and "
     "attention ones, BERT's, the Llama family's, T5's dropout_rate) and lora.lora_dropout, each "
     "mask drawn by Philox4x32-10 from --seed, the micro-batch, the site and the element (the "
     "same on every thread, when recomputed and after a resume; the attention probabilities' "
     "inside the attention kernel, never stored). Off: none is applied"},
    {"train", "eod_token_id", "--eod-token-id", OPT_INT, "<ID>", -1, INT32_MAX, 0, NULL,
     FIELD(eod_token_id), OPT_SHOW_DEFAULT,
     "documents packed in the token file end after each token ID (its end-of-text), and "
     "attention never looks back past one: each example of a packed file is trained as if alone, "
     "as Megatron's reset_attention_mask and Transformers' padding-free packing train them "
     "(positions keep counting across documents unless reset_position_ids); causal language "
     "models; -1: a row is one document"},
    {"train", "reset_position_ids", "--reset-position-ids", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(reset_position_ids), OPT_SHOW_DEFAULT,
     "with eod_token_id, learned positions (gpt2's) count from 0 in each document, as Megatron's "
     "reset_position_ids and Transformers' padding-free packing give them; rotary positions are "
     "relative and need none (refused). Off: positions count across the row"},
    {"train", "eod_mask_loss", "--eod-mask-loss", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(eod_mask_loss), OPT_SHOW_DEFAULT,
     "with eod_token_id, the target read at each eod token (the next document's first token) "
     "does not count, as Megatron's eod_mask_loss and Transformers' padding-free packing drop it"},
    {"lora", "r", "--lora-r", OPT_INT, "<R>", 1, 65536, 0, NULL, FIELD(lora.r), 0,
     "train LoRA adapters of this rank on the layers lora.target_modules names, as PEFT does, "
     "with every other parameter frozen (no gradient, no optimizer state); --save writes the "
     "adapter as PEFT does"},
    {"lora", "lora_alpha", "--lora-alpha", OPT_FLOAT, "<ALPHA>", 1e-30, 0, 0, NULL,
     FIELD(lora.alpha), 0, "the adapters' update is scaled by alpha / r (default 8, PEFT's)"},
    {"lora", "target_modules", "--lora-target-modules", OPT_MODULES, "<NAME,...>", 0, 0, 0, NULL,
     FIELD(lora.targets), 0,
     "the linear layers adapted: names (q_proj,v_proj; a layer whose name ends in one), "
     "all-linear (every linear layer but the output head), or in the file a string, a regular "
     "expression the whole name matches (PEFT's rule); default q_proj,v_proj for llama, c_attn "
     "for gpt2, query,value for bert, q,v for t5"},
    {"lora", "lora_dropout", "--lora-dropout", OPT_FLOAT, "<P>", 0, 0.999, 0, NULL,
     FIELD(lora.dropout), 0, "dropout on each adapter's input (with --dropout on)"},
    {"lora", "use_rslora", "--use-rslora", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(lora.use_rslora), 0, "scale by alpha / sqrt(r) (rank-stabilised LoRA)"},
    {"lora", "base_dtype", "--base-dtype", OPT_CHOICE, "<fp32|bf16>", 0, 0, 0, base_dtype_names,
     FIELD(lora.base_dtype), OPT_SHOW_DEFAULT,
     "the frozen base's weights that matrix products read held in bf16 (half the bytes, no fp32 "
     "copy) and multiplied as bf16 GEMMs do (bf16 operands, fp32 sums), as a bf16 base trains "
     "under PEFT; with --load-in-4bit, those left out of NF4 (the head); norms, biases and "
     "embeddings stay fp32"},
    {"quantization", "load_in_4bit", "--load-in-4bit", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(quant.load_in_4bit), 0,
     "QLoRA: every linear layer's weight but the output head's held in NF4 exactly as "
     "bitsandbytes quantises it (blocks of 64, the absmaxes quantised again), quantised as the "
     "model loads (a checkpoint Transformers saved in 4 bits is read as its bytes, and implies "
     "this); dequantised as the GEMMs read it; the rest of the base as --base-dtype says. Needs "
     "LoRA"},
    {"quantization", "bnb_4bit_quant_type", "--bnb-4bit-quant-type", OPT_CHOICE, "<nf4>", 0, 0, 0,
     quant_type_names, FIELD(quant.quant_type), OPT_SHOW_DEFAULT,
     "the 4-bit format: nf4 (fp4 is not one regc has)"},
    {"quantization", "bnb_4bit_use_double_quant", "--bnb-4bit-use-double-quant", OPT_SWITCH,
     "<on|off>", 0, 0, 0, NULL, FIELD(quant.double_quant), OPT_SHOW_DEFAULT,
     "the absmaxes quantised again to 8 bits, as QLoRA does (regc stores NF4 so; off is "
     "refused)"},
    {"quantization", "bnb_4bit_compute_dtype", "--bnb-4bit-compute-dtype", OPT_CHOICE,
     "<auto|float32|bfloat16>", 0, 0, 0, compute_dtype_names, FIELD(quant.compute_dtype),
     OPT_SHOW_DEFAULT,
     "the NF4 layers' products: of the dequantised fp32 weights, or as bf16 GEMMs do; auto: as "
     "a checkpoint saved in 4 bits says (a choice it contradicts is refused), else float32"},
    {"train", "data", "--data", OPT_STRING, "<tokens.bin>", 0, 0, 0, NULL, FIELD(train.data_path),
     0, "llm.c token file, or a quoted pattern of its shards (default: the built-in corpus)"},
    {"train", "loss_mask", "--loss-mask", OPT_STRING, "<mask.bin>", 0, 0, 0, NULL,
     FIELD(train.loss_mask), 0,
     "which tokens of --data count toward the loss (a regc loss mask, one byte per token; see "
     "tools/prepare_data.py): supervised fine-tuning on responses only"},
    {"train", "val_loss_mask", "--val-loss-mask", OPT_STRING, "<mask.bin>", 0, 0, 0, NULL,
     FIELD(train.val_loss_mask), 0, "the loss mask of --val-data"},
    {"train", "steps", "--steps", OPT_INT, "<N>", 1, INT_MAX, 0, NULL, FIELD(train.steps),
     OPT_SHOW_DEFAULT, "optimizer steps, >= 1 (-1 in max_steps: num_train_epochs decides)",
     .alias = {{"max_steps", 0, "-1"}}},
    {"train", "num_train_epochs", "--num-train-epochs", OPT_FLOAT, "<E>", 1e-30, 0, 0, NULL,
     FIELD(train.num_train_epochs), 0,
     "instead of steps: read the token file E times (fractions too), the steps being "
     "ceil(E x its batches of ranks x batch rows / gradient_accumulation_steps); steps given "
     "too win, as max_steps does in Transformers",
     .alias = {{"num_train_epochs"}}},
    {"train", "batch", "--batch", OPT_INT, "<B>", 1, INT32_MAX, 0, NULL, FIELD(train.batch),
     OPT_SHOW_DEFAULT, "sequences per step on each rank (the micro-batch), >= 1",
     .alias = {{"train_micro_batch_size_per_gpu", OPT_AUTO}, {"per_device_train_batch_size"}}},
    {"train", "train_batch_size", "--train-batch-size", OPT_INT, "<N>", 1, INT32_MAX, 0, NULL,
     FIELD(train_batch_size), OPT_AUTO,
     "DeepSpeed's global batch: batch x gradient_accumulation_steps x ranks, checked when all "
     "three are given, else the one missing is derived from it (accumulation first)",
     .alias = {{"train_batch_size", OPT_AUTO}}},
    {"train", "seq", "--seq", OPT_INT, "<T>", 1, INT32_MAX, 0, NULL, FIELD(train.seq),
     OPT_SHOW_DEFAULT, "tokens per sequence, >= 1"},
    {"train", "lr", "--lr", OPT_FLOAT, "<LR>", 1, 0, 0, NULL, FIELD(train.lr), OPT_SHOW_DEFAULT,
     "AdamW learning rate, > 0: the peak of any schedule",
     .alias = {{"learning_rate"},
               {"optimizer.params.lr", OPT_AUTO},
               {"scheduler.params.warmup_max_lr", OPT_AUTO}}},
    {"train", "weight_decay", "--weight-decay", OPT_FLOAT, "<WD>", 0, 0, 0, NULL,
     FIELD(train.weight_decay), OPT_SHOW_DEFAULT, "AdamW decoupled weight decay, >= 0",
     .alias = {{"weight_decay"}, {"optimizer.params.weight_decay", OPT_AUTO}}},
    {"train", "weight_decay_params", "--weight-decay-params", OPT_CHOICE, "<all|not_bias_norm>", 0,
     0, 0, regc_decay_params_names, FIELD(train.weight_decay_params), OPT_SHOW_DEFAULT,
     "the parameters weight_decay applies to: all (DeepSpeed's optimizer, torch's AdamW), or "
     "not_bias_norm (Transformers' Trainer: neither biases nor the weights of norms). When not "
     "given: not_bias_norm where weight_decay is Transformers' (a TrainingArguments file's) and "
     "no DeepSpeed optimizer section is given, else all"},
    {"train", "adam_beta1", "--adam-beta1", OPT_FLOAT, "<B1>", 0, 0.9999999, 0, NULL,
     FIELD(train.beta1), OPT_SHOW_DEFAULT, "AdamW's first moment decay, below 1",
     .alias = {{"adam_beta1"}}},
    {"train", "adam_beta2", "--adam-beta2", OPT_FLOAT, "<B2>", 0, 0.9999999, 0, NULL,
     FIELD(train.beta2), OPT_SHOW_DEFAULT, "AdamW's second moment decay, below 1",
     .alias = {{"adam_beta2"}}},
    {"optimizer.params", "betas", NULL, OPT_BETAS, NULL, 0, 0, 0, NULL,
     offsetof(regc_train_settings, train.beta1), 2 * sizeof(float), OPT_AUTO,
     "DeepSpeed's [beta1, beta2]: train.adam_beta1 and adam_beta2"},
    {"train", "adam_epsilon", "--adam-epsilon", OPT_FLOAT, "<EPS>", 1e-30, 0, 0, NULL,
     FIELD(train.eps), OPT_SHOW_DEFAULT, "AdamW's epsilon, > 0",
     .alias = {{"adam_epsilon"}, {"optimizer.params.eps", OPT_AUTO}}},
    {"optimizer", "type", NULL, OPT_CHOICE, NULL, 0, 0, 0, optimizer_names, FIELD(optimizer_type),
     OPT_NOCASE,
     "DeepSpeed's optimizer: AdamW, or Adam, which DeepSpeed runs as AdamW unless "
     "optimizer.params.adam_w_mode is false; regc's update is torch.optim.AdamW's"},
    {"optimizer.params", "adam_w_mode", NULL, OPT_SWITCH, NULL, 0, 0, 0, NULL, FIELD(adam_w_mode),
     0,
     "false makes DeepSpeed's Adam add the weight decay to the gradient (L2), which regc does "
     "not do: refused unless weight_decay is 0, where the two agree"},
    {"optimizer.params", "torch_adam", NULL, OPT_INERT, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "torch's AdamW or DeepSpeed's fused one: the same update", .values = "bool"},
    {"optimizer.params", "bias_correction", NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "AdamW's bias correction, which regc always applies", .values = "[true]"},
    {"optimizer.params", "amsgrad", NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "AMSGrad, which regc does not do", .values = "[false]"},
    {"optimizer.params", "fp32_optimizer_states", NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "AdamW's moments in fp32, which regc's always are", .values = "[true]"},
    {"optimizer.params", "set_grad_none", NULL, OPT_INERT, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "how the gradients are cleared: regc writes them, adding only while accumulating",
     .values = "bool"},
    {"train", "lr_scheduler_type", "--lr-scheduler-type", OPT_CHOICE,
     "<constant|constant_with_warmup|linear|cosine|cosine_with_min_lr|WarmupLR|WarmupDecayLR|"
     "WarmupCosineLR>",
     0, 0, 0, schedule_names, FIELD(train.lr_scheduler), OPT_SHOW_DEFAULT,
     "how the learning rate moves from step to step, as Hugging Face's get_scheduler: warmup "
     "from 0 over warmup_steps, then constant, a linear decay to 0, or a half cosine to 0 (or to "
     "min_lr) at the last step; or as DeepSpeed's schedulers (scheduler.type): warmup from "
     "warmup_min_lr (log or linear: warmup_type) then constant (WarmupLR) or a linear decay to 0 "
     "at total_num_steps (WarmupDecayLR), or from warmup_min_ratio x lr to a half cosine ending "
     "at cos_min_ratio x lr (WarmupCosineLR); a DeepSpeed scheduler's parameters left out of "
     "its file take DeepSpeed's defaults, and its scheduler replaces a Transformers file's "
     "lr_scheduler_type, as the Trainer then makes none",
     .alias = {{"lr_scheduler_type"}, {"scheduler.type", OPT_OVERRIDES}}},
    {"train", "warmup_steps", "--warmup-steps", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.warmup_steps), OPT_SHOW_DEFAULT,
     "optimizer steps of warmup (the schedules *_with_warmup, linear, cosine and DeepSpeed's, "
     "which warm up over at least 2); in Transformers' warmup_steps a fraction below 1 is "
     "warmup_ratio",
     .alias = {{"warmup_steps", OPT_FRACTION}, {"scheduler.params.warmup_num_steps", OPT_AUTO}}},
    {"train", "warmup_ratio", "--warmup-ratio", OPT_FLOAT, "<R>", 0, 1, 0, NULL,
     FIELD(train.warmup_ratio), OPT_SHOW_DEFAULT,
     "warmup as a fraction of the steps (rounded up), when warmup_steps is 0",
     .alias = {{"warmup_ratio"}}},
    {"train", "min_lr", "--min-lr", OPT_FLOAT, "<LR>", 0, 0, 0, NULL, FIELD(train.min_lr), 0,
     "cosine_with_min_lr: the learning rate the cosine ends at (or min_lr_rate)",
     .alias = {{"lr_scheduler_kwargs.min_lr"}}},
    {"train", "min_lr_rate", "--min-lr-rate", OPT_FLOAT, "<R>", 0, 1, 0, NULL,
     FIELD(train.min_lr_rate), 0, "cosine_with_min_lr: the final learning rate as a fraction of lr",
     .alias = {{"lr_scheduler_kwargs.min_lr_rate"}}},
    {"lr_scheduler_kwargs", "num_cycles", NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "cosine's half cycle, the one regc's cosine schedules take", .values = "[0.5]"},
    {"scheduler.params", "warmup_min_lr", "--warmup-min-lr", OPT_FLOAT, "<LR>", 0, 0, 0, NULL,
     FIELD(train.warmup_min_lr), OPT_AUTO,
     "WarmupLR and WarmupDecayLR: the rate the warmup starts from (default 0)"},
    {"scheduler.params", "warmup_type", "--warmup-type", OPT_CHOICE, "<log|linear>", 0, 0, 0,
     warmup_type_names, FIELD(train.warmup_type), 0,
     "DeepSpeed's schedulers: the warmup's curve from its start to the peak, log(s + 1) / "
     "log(W) or s / W at step s of W (default log)"},
    {"scheduler.params", "total_num_steps", "--total-num-steps", OPT_INT, "<N>", 1, INT_MAX, 0,
     NULL, FIELD(train.total_num_steps), OPT_AUTO,
     "WarmupDecayLR and WarmupCosineLR: the step the decay ends at (default: the run's steps)"},
    {"scheduler.params", "warmup_min_ratio", "--warmup-min-ratio", OPT_FLOAT, "<R>", 0, 1, 0, NULL,
     FIELD(train.warmup_min_ratio), 0,
     "WarmupCosineLR: the warmup's start as a fraction of lr (default 0)"},
    {"scheduler.params", "cos_min_ratio", "--cos-min-ratio", OPT_FLOAT, "<R>", 0, 1, 0, NULL,
     FIELD(train.cos_min_ratio), 0,
     "WarmupCosineLR: the cosine's end as a fraction of lr (default 0.0001)"},
    {"scheduler.params", "last_batch_iteration", NULL, OPT_NEUTRAL, NULL, 0, 0, 0, NULL, 0, 0, 0,
     "a scheduler started part way: regc resumes one from a checkpoint "
     "(resume_from_checkpoint)",
     .values = "[-1]"},
    {"train", "max_grad_norm", "--max-grad-norm", OPT_FLOAT, "<N>", 0, 0, 0, NULL,
     FIELD(train.max_grad_norm), OPT_SHOW_DEFAULT,
     "clip the gradients' global L2 norm to N before each update, as torch's clip_grad_norm_ "
     "(0: no clipping); the norm is reported per step",
     .alias = {{"max_grad_norm"}, {"gradient_clipping", OPT_AUTO}}},
    {"train", "on_nonfinite", "--on-nonfinite", OPT_CHOICE, "<stop|skip>", 0, 0, 0, nonfinite_names,
     FIELD(train.skip_nonfinite), OPT_SHOW_DEFAULT,
     "a step whose loss or gradient norm is NaN or infinite is never applied; stop ends the run "
     "there with an error naming the step (checkpoints written before it are kept), skip goes on "
     "to the next batch and does not count the step in the schedule"},
    {"train", "gradient_accumulation_steps", "--gradient-accumulation-steps", OPT_INT, "<K>", 1,
     1 << 20, 0, NULL, FIELD(train.grad_accum), OPT_SHOW_DEFAULT,
     "micro-batches of --batch sequences per optimizer step, their gradients summed in place: "
     "the step is that of one batch of K x batch sequences",
     .alias = {{"gradient_accumulation_steps", OPT_AUTO}}},
    {"train", "val_data", "--val-data", OPT_STRING, "<tokens.bin>", 0, 0, 0, NULL,
     FIELD(train.val_data_path), 0,
     "validation tokens (llm.c file or pattern): the mean loss of its first val_batches batches, "
     "through a forward-only program that keeps no gradients"},
    {"train", "eval_steps", "--eval-steps", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.eval_steps), OPT_SHOW_DEFAULT,
     "validate after every N optimizer steps (0: once, after the last)", .alias = {{"eval_steps"}}},
    {"train", "val_batches", "--val-batches", OPT_INT, "<K>", 1, INT32_MAX, 0, NULL,
     FIELD(train.val_batches), OPT_SHOW_DEFAULT, "batches of --batch sequences per validation"},
    {"train", "shuffle", "--shuffle", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL, FIELD(train.shuffle),
     OPT_SHOW_DEFAULT,
     "read the token file as rows (of --seq tokens; T5's of twice that) in a new order each "
     "epoch, drawn from data_seed, every row at most once (torchtune's shuffle; Transformers' "
     "Trainer always shuffles). Off: llm.c's order, the same every epoch"},
    {"train", "data_seed", "--data-seed", OPT_SEED, "<S>", 0, 0, 0, NULL, FIELD(train.data_seed), 0,
     "seed of train.shuffle's order (Transformers' data_seed); train.seed when not given; "
     "refused without train.shuffle",
     .alias = {{"data_seed"}}},
    {"train", "seed", "--seed", OPT_SEED, "<S>", 0, 0, 0, NULL, FIELD(train.seed), OPT_SHOW_DEFAULT,
     "seed of the random init of presets and of the masked positions of masked-LM (BERT) "
     "training",
     .alias = {{"seed"}}},
    {"train", "threads", "--threads", OPT_INT, "<N>", 0, 4096, 0, NULL, FIELD(train.threads),
     OPT_SHOW_DEFAULT, "CPU threads; 0 uses OMP_NUM_THREADS or all cores"},
    {"train", "json", "--json", OPT_FLAG, NULL, 0, 0, 0, NULL, FIELD(json), 0,
     "print one JSON object per step instead of a table: {\"step\": k, \"loss\": L, \"ms\": t, "
     "\"tokens_per_s\": r}"},
    {"train", "save", "--save", OPT_STRING, "<DIR>", 0, 0, 0, NULL, FIELD(train.save_dir), 0,
     "after training, write config.json and model.safetensors to DIR (graph models: graph.json "
     "and model.safetensors)"},
    {"train", "output_dir", "--output-dir", OPT_STRING, "<DIR>", 0, 0, 0, NULL,
     FIELD(train.output_dir), 0,
     "where checkpoints go: DIR/checkpoint-N (Hugging Face's layout: config.json, "
     "model.safetensors, optimizer.safetensors, trainer_state.json), each appearing whole or not "
     "at all",
     .alias = {{"output_dir"}}},
    {"train", "save_steps", "--save-steps", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.save_steps), OPT_SHOW_DEFAULT,
     "write a checkpoint after every N optimizer steps (0: none; SIGINT and SIGTERM still write "
     "one before exiting)",
     .alias = {{"save_steps"}}},
    {"train", "save_strategy", NULL, OPT_CHOICE, NULL, 0, 0, 0, save_strategy_names,
     FIELD(save_strategy), 0,
     "Transformers' save_strategy: steps (every save_steps), or no: no checkpoints",
     .alias = {{"save_strategy"}}},
    {"train", "save_total_limit", "--save-total-limit", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.save_total_limit), OPT_SHOW_DEFAULT, "keep only the newest N checkpoints (0: all)",
     .alias = {{"save_total_limit"}}},
    {"train", "resume_from_checkpoint", "--resume-from-checkpoint", OPT_STRING, "<DIR|latest>", 0,
     0, 0, NULL, FIELD(train.resume_from), 0,
     "continue from a checkpoint (latest: the newest in --output-dir) exactly as if the run had "
     "never stopped: same data position, schedule and optimizer state; one from another model or "
     "other settings is refused",
     .alias = {{"resume_from_checkpoint"}}},
    {"train", NULL, "--profile", OPT_FLAG, NULL, 0, 0, 0, NULL, FIELD(profile), 0,
     "time every instruction of the steps after the first and, after training, print on stderr "
     "where a step's time goes: per kernel and GEMM shape, ms per step and GFLOP/s"},
    {"compile", "backend", "--backend", OPT_BACKEND, "<name>", 0, 0, 0, NULL, FIELD(train.backend),
     OPT_SHOW_DEFAULT, "compute backend: cpu, or cuda (cuda:N for device N) where built"},
    {"compile", "level", "--level", OPT_CHOICE, "<O0|O1|O2>", 0, 0, 0, regc_level_names,
     FIELD(train.compile.level), OPT_SHOW_DEFAULT,
     "O0 op by op; O1 fused with a static memory plan; O2 adds whole-step capture (on the CPU "
     "the same as O1)"},
    {"compile", "precision", "--precision", OPT_CHOICE, "<fp32|bf16>", 0, 0, 0,
     regc_precision_names, FIELD(train.compile.precision), OPT_SHOW_DEFAULT | OPT_BOOL,
     "fp32, or bf16 mixed precision as torch.autocast does it for matrix products: every GEMM "
     "multiplies bf16-rounded operands with fp32 sums (AVX-512 BF16 on the CPU where present), "
     "the saved activations autocast keeps in bf16 are rounded where made and held in bf16, and "
     "so is what only those GEMMs read; weights, gradients, optimizer state, norms, softmax and "
     "the loss stay fp32 (DeepSpeed's bf16.enabled and Transformers' bf16: true is bf16, false "
     "fp32)",
     .alias = {{"bf16.enabled", OPT_AUTO | OPT_BOOL}, {"bf16", OPT_BOOL}}, .bool_true = 1,
     .bool_false = 0},
    {"compile", "tf32", "--tf32", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL, FIELD(train.tf32),
     OPT_SHOW_DEFAULT,
     "let fp32 GEMMs multiply operands rounded to TF32 (10 mantissa bits, fp32 sums) on a GPU's "
     "matrix units, as torch.backends.cuda.matmul.allow_tf32 (Transformers' tf32): a cuda "
     "backend of compute capability 8.0 or later; refused under fp32 on the cpu backend, which "
     "has no TF32 (as Transformers refuses it without such a GPU); under bf16 every GEMM is bf16 "
     "and it changes nothing",
     .alias = {{"tf32"}}},
    {"compile", "fp32_storage", "--fp32-storage", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(train.compile.fp32_storage), OPT_SHOW_DEFAULT,
     "under bf16, hold every tensor in fp32 (bf16 only in the GEMMs' operands, in more memory); "
     "off holds in bf16 the saved activations autocast keeps in bf16 (the projections' outputs, "
     "attention's, the MLP's) and each tensor that only bf16 GEMMs read (the norms' outputs, the "
     "logits' gradient)"},
    {"compile", "use_regional_compilation", "--regional", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(train.compile.regional), OPT_SHOW_DEFAULT,
     "compile each distinct layer once and reuse it for every repeat"},
    {"compile", "inline_back", "--inline-back", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(train.compile.inline_back), OPT_SHOW_DEFAULT,
     "stamp the compiled regions into one flat step program; off runs them as calls, the "
     "reference"},
    {"compile", "dump_graphs", "--dump-graphs", OPT_STRING, "<DIR>", 0, 0, 0, NULL,
     FIELD(train.compile.dump_dir), OPT_BOOL_PATH,
     "write the compiler's intermediate graphs to DIR (compiles afresh: the cache is not read); "
     "in the file true is the directory regc-graphs, false none",
     .values = "regc-graphs"},
    {"compile", "cache_dir", "--cache-dir", OPT_STRING, "<DIR>", 0, 0, 0, NULL,
     FIELD(train.cache_dir), OPT_NULL_SETS,
     "compile cache directory (default $XDG_CACHE_HOME/regc, else ~/.cache/regc; null in the "
     "file: no cache); a step compiled before loads in milliseconds, and layers compiled before "
     "load instead of compiling"},
    {"compile", "cache_max_mb", "--cache-max-mb", OPT_INT, "<MB>", 1, (double)(INT64_C(1) << 40),
     INT64_C(1) << 20, NULL, FIELD(train.cache_max_bytes), OPT_SHOW_DEFAULT,
     "the compile cache's size limit in megabytes, least recently used entries going first"},
    {"compile", NULL, "--no-cache", OPT_FLAG, NULL, 0, 0, 0, NULL, FIELD(no_cache), 0,
     "neither read nor write the compile cache"},
    {"zero_optimization", "stage", "--zero-stage", OPT_INT, "<0|3>", 0, 3, 0, NULL,
     FIELD(train.zero_stage), OPT_SHOW_DEFAULT,
     "DeepSpeed's ZeRO stage under mpirun: 0 replicates the model on every rank and sums the "
     "gradients before each update (data parallelism); 3 shards the parameters, gradients and "
     "AdamW's moments over the ranks, each unit gathered before its use (1 and 2 are refused)"},
    {"zero_optimization", "communicator", "--communicator", OPT_CHOICE, "<auto|mpi|staged|nccl>", 0,
     0, 0, communicator_names, FIELD(train.communicator), OPT_SHOW_DEFAULT,
     "what the ranks' collectives run on: mpi over host buffers (the cpu backend), staged (MPI "
     "with device buffers copied through the host: ranks sharing a GPU), nccl (between GPUs); "
     "auto: mpi on the cpu, nccl on GPUs of their own, else staged"},
    {"zero_optimization", "stage3_prefetch_bucket_size", "--prefetch-bucket-size", OPT_INT,
     "<ELEMENTS>", 0, (double)(INT64_C(1) << 50), 0, NULL, FIELD(train.compile.prefetch_floats),
     OPT_AUTO,
     "stage 3: parameters gathered ahead of the compute, at least one unit (default: one unit "
     "ahead; 0 gathers each unit where it is needed)"},
    {"zero_optimization", "stage3_max_live_parameters", "--max-live-parameters", OPT_INT,
     "<ELEMENTS>", 0, (double)(INT64_C(1) << 50), 0, NULL, FIELD(train.compile.max_live_floats), 0,
     "stage 3: at most this many parameters gathered at once, the unit computing and those "
     "gathered ahead of it (default 0: no limit; resident units not counted)"},
    {"zero_optimization", "stage3_param_persistence_threshold", "--param-persistence-threshold",
     OPT_INT, "<ELEMENTS>", 0, (double)(INT64_C(1) << 50), 0, NULL,
     FIELD(train.compile.persistence_floats), OPT_AUTO,
     "stage 3: units (a layer's parameters, a piece of glue's) of at most this many parameters "
     "stay gathered from their forward to their backward, gathered once a step instead of "
     "twice (default 0: none)"},
    {"zero_optimization.offload_optimizer", "device", "--offload-optimizer", OPT_CHOICE,
     "<none|cpu>", 0, 0, 0, offload_names, FIELD(train.compile.offload_optimizer),
     OPT_SHOW_DEFAULT | OPT_BOOL,
     "where AdamW's moments live and its update runs: cpu keeps them, and a copy of the "
     "parameters, in the host's pinned memory, the update on the host's cores (the gradients "
     "copied there during the backward, the parameters back after the update): a GPU holds 8 "
     "bytes a parameter instead of 16, for the same bits (DeepCompile's offload_opt_states and "
     "DeepSpeed's older cpu_offload: true is cpu)",
     .alias = {{"compile.offload_opt_states", OPT_BOOL},
               {"zero_optimization.cpu_offload", OPT_BOOL}},
     .bool_true = 1, .bool_false = 0},
    {"zero_optimization.offload_optimizer", "pin_memory", NULL, OPT_SWITCH, NULL, 0, 0, 0, NULL,
     FIELD(train.offload_pin_memory), 0,
     "the offloaded state in pinned host memory: always (DeepSpeed's key, accepted as true)"},
    {"zero_optimization", "reduce_bucket_size", "--reduce-bucket-size", OPT_INT, "<ELEMENTS>", 1,
     (double)(INT64_C(1) << 50), 0, NULL, FIELD(train.compile.reduce_bucket_floats), OPT_AUTO,
     "gradient elements reduced at a time: stage 0 all-reduces the gradients in buckets of "
     "whole parameters of at most this many, each as soon as the backward has written it "
     "(default 6553600: 25 MiB); stage 3 waits for a reduce-scatter once those started after "
     "it reach this many (default: once the next one starts)"},
    {"compile", "memory_budget_mb", "--memory-budget-mb", OPT_INT, "<MB>", 1,
     (double)(INT64_C(1) << 30), INT64_C(1) << 20, NULL, FIELD(train.compile.budget_bytes), 0,
     "device memory per rank in MiB; the compiler makes the step fit: with recompute auto, the "
     "least recomputation that does, and at stage 3 how far ahead to gather and which units to "
     "keep gathered from forward to backward"},
    {"compile", "host_memory_mb", "--host-memory-mb", OPT_INT, "<MB>", 1,
     (double)(INT64_C(1) << 30), INT64_C(1) << 20, NULL, FIELD(train.compile.host_budget_bytes), 0,
     "host memory per rank in MiB that the offloaded optimizer state and activations may take: "
     "offloading takes the largest activations that fit (under memory_budget_mb, auto "
     "recomputes what the device still cannot hold), and an optimizer state over it is "
     "refused"},
    {"compile", "offload_activation", "--offload-activation", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(train.compile.offload_activation), OPT_SHOW_DEFAULT,
     "saved activations (of at least 64 KiB) copied to host memory after the forward's last use "
     "and back before the backward's first, on the backend's copy queue: the same bits in less "
     "device memory (inlined back: O1 and O2)"},
    {"compile", "logits_chunk_rows", "--logits-chunk-rows", OPT_INT, "<ROWS>", 0,
     (double)(INT64_C(1) << 40), 0, NULL, FIELD(train.compile.logits_chunk_rows), OPT_SHOW_DEFAULT,
     "the language-model head and its cross-entropy in chunks of this many rows, forward and "
     "backward, so that neither the logits [batch x seq, vocab] nor their gradient is ever "
     "whole (the backward computes each chunk's logits again); 0: whole (auto chooses chunks "
     "under memory_budget_mb)"},
    {"compile", "recompute", "--recompute", OPT_CHOICE, "<none|selective|full|auto>", 0, 0, 0,
     regc_recompute_names, FIELD(train.compile.recompute), OPT_SHOW_DEFAULT | OPT_BOOL,
     "saved activations dropped after the forward and computed again in the backward, the same "
     "bits in less memory: selective keeps GEMM and attention outputs and recomputes norms, "
     "activations and elementwise chains; full keeps each layer's inputs only (Hugging Face's "
     "gradient checkpointing); auto recomputes the least that fits memory_budget_mb, the "
     "cheapest in FLOPs per byte freed first (nothing without a budget); Transformers' "
     "gradient_checkpointing true is full",
     .alias = {{"gradient_checkpointing", OPT_BOOL}}, .bool_true = 2, .bool_false = -1},
    {"compile", "passes", "--passes", OPT_PASSES, "<PASS[@MB],...>", 0, 0, 0, NULL,
     FIELD(train.compile.passes), OPT_SHOW_DEFAULT,
     "the schedule passes that decide when the collectives run, in order, each with its own "
     "memory budget in MiB if given (built in: prefetch, overlap_reduce, selective_gather; "
     "none: every collective waited for where it is placed)"},
    {"compile", "schedule", "--schedule", OPT_REPLANS, "<STEP:PASSES;...>", 0, 0, 0, NULL,
     FIELD(train.replans), 0,
     "compile the step again at these steps with these passes, given the profile measured "
     "since the last plan (in the file [[step, [pass or [pass, budget_mb], ...]], ...])"},
    {"compile", "deepcompile", "--deepcompile", OPT_SWITCH, "<on|off>", 0, 0, 0, NULL,
     FIELD(train.compile.deepcompile), OPT_SHOW_DEFAULT,
     "the compiler's communication schedule (stage 3: gathers started ahead, reduce-scatters "
     "overlapping the backward; stage 0: the buckets' all-reduces overlapping it); off waits "
     "for each collective where it is placed (DeepCompile's key; on is what regc always does)"},
    /* ---- DeepSpeed's keys (ds_config.json) that regc takes as they are:
     * every key DeepSpeed documents under zero_optimization and compile
     * has a row, applied above or here with the reason it changes
     * nothing, or refused at the values that would change the math */
    INERT("", "steps_per_print", "number|null",
          "how often DeepSpeed logs: regc reports every step"),
    INERT("", "wall_clock_breakdown", "bool", "timings: regc's --profile times every instruction"),
    INERT("", "dump_state", "bool", WHY_MONITOR),
    INERT("", "memory_breakdown", "bool",
          "memory reports: regc prints its account of device memory before the first step"),
    INERT("", "prescale_gradients", "bool", WHY_PREDIVIDE),
    INERT("", "gradient_predivide_factor", "number", WHY_PREDIVIDE),
    NEUTRAL("", "sparse_gradients", "[false]",
            "sparse embedding gradients, which regc does not make"),
    NEUTRAL("", "communication_data_type", "[null, \"fp32\", \"float32\"]",
            "the gradients reduced in another type: regc reduces them in fp32"),
    INERT("", "zero_allow_untested_optimizer", "bool", WHY_OPT_CHECK),
    INERT("", "zero_force_ds_cpu_optimizer", "bool", WHY_OPT_CHECK),
    NEUTRAL_AUTO("fp16", "enabled", "[false]", WHY_FP16),
    INERT("fp16", "auto_cast", "bool", WHY_FP16_OFF),
    INERT("fp16", "loss_scale", "number", WHY_FP16_OFF),
    INERT("fp16", "initial_scale_power", "number", WHY_FP16_OFF),
    INERT("fp16", "loss_scale_window", "number", WHY_FP16_OFF),
    INERT("fp16", "hysteresis", "number", WHY_FP16_OFF),
    INERT("fp16", "consecutive_hysteresis", "bool", WHY_FP16_OFF),
    INERT("fp16", "min_loss_scale", "number", WHY_FP16_OFF),
    INERT("fp16", "fp16_master_weights_and_grads", "bool", WHY_FP16_OFF),
    INERT("bf16", "immediate_grad_update", "bool",
          "when DeepSpeed's bf16 optimizer moves gradients to fp32: regc's are fp32 throughout"),
    INERT("bf16", "check_grad_overflow", "bool",
          "regc checks every step's gradient norm (train.on_nonfinite)"),
    NEUTRAL("bf16", "bf16_master_weights_and_grads", "[false]",
            "weights and gradients held in bf16: regc keeps them in fp32"),
    NEUTRAL("bf16", "bf16_optimizer_states", "[false]",
            "AdamW's moments held in bf16: regc keeps them in fp32"),
    NEUTRAL_AUTO("amp", "enabled", "[false]",
                 "apex's amp, fp16 with loss scaling, which regc does not have"),
    INERT("amp", "*", NULL, "apex's settings, which apply only with amp.enabled true, refused"),
    NEUTRAL(
        "torch_autocast", "enabled", "[false]",
        "DeepSpeed's torch.autocast: regc's mixed precision is compile.precision (bf16.enabled)"),
    INERT("torch_autocast", "*", NULL,
          "torch.autocast's settings, which apply only with torch_autocast.enabled true, refused"),
    INERT("activation_checkpointing", "*", NULL, WHY_ACT_CKPT),
    INERT("", "flops_profiler", "object", WHY_MONITOR),
    INERT("", "tensorboard", "object", WHY_MONITOR),
    INERT("", "wandb", "object", WHY_MONITOR),
    INERT("", "comet", "object", WHY_MONITOR),
    INERT("", "csv_monitor", "object", WHY_MONITOR),
    INERT("", "comms_logger", "object", WHY_MONITOR),
    INERT("", "autotuning", "object", "DeepSpeed's autotuner, which launches its own runs"),
    INERT("", "checkpoint", "object", WHY_CKPT_DS),
    INERT("", "aio", "object", WHY_NVME),
    NEUTRAL("data_types", "grad_accum_dtype", "[null, \"fp32\"]",
            "gradients accumulated in another type: regc accumulates them in fp32"),
    NEUTRAL("elasticity", "enabled", "[false]",
            "elastic training, which chooses the batch sizes: regc's are the config's"),
    INERT("elasticity", "*", NULL,
          "elastic training's settings, which apply only with elasticity.enabled true, refused"),
    /* zero_optimization */
    INERT("zero_optimization", "contiguous_gradients", "bool",
          "regc's gradients are one contiguous block always"),
    INERT("zero_optimization", "reduce_scatter", "bool", WHY_ZERO_COMM),
    INERT("zero_optimization", "use_multi_rank_bucket_allreduce", "bool", WHY_ZERO_COMM),
    INERT("zero_optimization", "allgather_partitions", "bool", WHY_STAGE12),
    INERT("zero_optimization", "allgather_bucket_size", "number", WHY_STAGE12),
    INERT("zero_optimization", "overlap_comm", "bool|null",
          "the reductions overlapping the backward, which regc's do always under "
          "compile.deepcompile (the default)"),
    INERT("zero_optimization", "load_from_fp32_weights", "bool",
          "regc's weights and checkpoints are fp32 always"),
    INERT("zero_optimization", "elastic_checkpoint", "bool", WHY_CKPT_DS),
    NEUTRAL("zero_optimization.offload_param", "device", "[\"none\", null]", WHY_OFFLOAD_PARAM),
    INERT("zero_optimization.offload_param", "nvme_path", NULL, WHY_OFFLOAD_PARAM_OFF),
    INERT("zero_optimization.offload_param", "pin_memory", "bool", WHY_OFFLOAD_PARAM_OFF),
    INERT("zero_optimization.offload_param", "buffer_count", "number", WHY_OFFLOAD_PARAM_OFF),
    INERT("zero_optimization.offload_param", "buffer_size", "number", WHY_OFFLOAD_PARAM_OFF),
    INERT("zero_optimization.offload_param", "max_in_cpu", "number", WHY_OFFLOAD_PARAM_OFF),
    INERT("zero_optimization.offload_optimizer", "nvme_path", NULL, WHY_NVME),
    INERT("zero_optimization.offload_optimizer", "buffer_count", "number", WHY_NVME),
    INERT("zero_optimization.offload_optimizer", "pipeline_read", "bool", WHY_NVME),
    INERT("zero_optimization.offload_optimizer", "pipeline_write", "bool", WHY_NVME),
    INERT("zero_optimization.offload_optimizer", "fast_init", "bool", WHY_NVME),
    NEUTRAL("zero_optimization.offload_optimizer", "ratio", "[1]",
            "part of AdamW's state offloaded: regc offloads all of it or none"),
    NEUTRAL("zero_optimization.offload_optimizer", "super_offload", "[false]",
            "SuperOffload's update on Superchips, which regc does not build"),
    INERT("zero_optimization.offload_optimizer", "cpuadam_cores_perc", "number",
          "the host's cores AdamW takes: regc's offloaded update runs on the rank's threads "
          "(train.threads)"),
    NEUTRAL("zero_optimization", "zenflow", "[null]",
            "ZenFlow's updates from stale gradients, which change the math and regc does not make"),
    INERT("zero_optimization", "sub_group_size", "number",
          "the host AdamW's working set: regc's offloaded update runs over the rank's whole shard, "
          "already in pinned host memory (no NVMe swap to bound), and AdamW is elementwise, so "
          "updating it a sub-group at a time would give the same bits"),
    NEUTRAL("zero_optimization", "cpu_offload_param", "[null, false]", WHY_OFFLOAD_PARAM),
    INERT("zero_optimization", "cpu_offload_use_pin_memory", "bool|null",
          "regc's offloaded state is in pinned memory always"),
    INERT("zero_optimization", "stage3_model_persistence_threshold", "number",
          "a cap on the parameters kept gathered, memory only: regc keeps those "
          "stage3_param_persistence_threshold and compile.memory_budget_mb choose"),
    INERT("zero_optimization", "stage3_max_reuse_distance", "number",
          "when a gathered parameter is released, memory only: regc's plan releases each gathered "
          "unit after its last reader, or keeps it to its backward "
          "(stage3_param_persistence_threshold)"),
    INERT("zero_optimization", "stage3_gather_16bit_weights_on_model_save", "bool",
          WHY_SAVE_GATHER),
    INERT("zero_optimization", "stage3_gather_fp16_weights_on_model_save", "bool", WHY_SAVE_GATHER),
    INERT("zero_optimization", "stage3_module_granularity_threshold", "number",
          "regc gathers by units (a layer's parameters, a piece of glue's), not by module"),
    INERT("zero_optimization", "stage3_use_all_reduce_for_fetch_params", "bool", WHY_ZERO_COMM),
    INERT("zero_optimization", "stage3_allgather_sequential", "bool", WHY_ZERO_COMM),
    INERT("zero_optimization", "ignore_unused_parameters", "bool",
          "unused parameters (stage 2's check): regc's graph holds what the loss reads"),
    INERT("zero_optimization", "legacy_stage1", "bool", WHY_STAGE12),
    INERT("zero_optimization", "round_robin_gradients", "bool", WHY_STAGE12),
    INERT("zero_optimization", "grad_hooks", "bool", WHY_STAGE12),
    INERT("zero_optimization", "zero_hpz_partition_size", "number", WHY_ZERO_COMM),
    NEUTRAL("zero_optimization", "zero_quantized_weights", "[false]", WHY_QUANT_COMM),
    NEUTRAL("zero_optimization", "zero_quantized_nontrainable_weights", "[false]",
            "frozen weights held quantised by ZeRO++: regc's frozen base is fp32, bf16 "
            "(lora.base_dtype) or NF4 (quantization.load_in_4bit)"),
    NEUTRAL("zero_optimization", "zero_quantized_gradients", "[false]", WHY_QUANT_COMM),
    INERT("zero_optimization", "zeropp_loco_param", NULL,
          "LoCo's settings, which apply only with zero_quantized_gradients true, refused"),
    INERT("zero_optimization", "mics_shard_size", "number", WHY_ZERO_COMM),
    INERT("zero_optimization", "mics_hierarchical_params_gather", "bool", WHY_ZERO_COMM),
    INERT("zero_optimization", "memory_efficient_linear", "bool",
          "a linear layer that frees its input: regc's memory plan frees every activation after "
          "its last use"),
    INERT("zero_optimization", "pipeline_loading_checkpoint", "bool", WHY_CKPT_DS),
    INERT("zero_optimization", "override_module_apply", "bool",
          "a hook on torch's nn.Module.apply: regc has no modules to hook"),
    INERT("zero_optimization", "log_trace_cache_warnings", "bool", WHY_MONITOR),
    INERT("zero_optimization", "enable_sanity_checks", "bool",
          "DeepSpeed's own checks: regc checks every program before it runs"),
    INERT("zero_optimization", "save_muon_momentum_buffer_in_memory", "bool",
          "Muon's buffer (optimizer.type Muon is refused)"),
    INERT("zero_optimization", "leaf_module", NULL,
          "ZeRO-3's leaf modules: regc gathers by units (a layer's parameters)"),
    /* compile: DeepCompile's keys */
    INERT("compile", "free_activation", "bool",
          "regc's static memory plan frees every activation after its last use, always"),
    INERT("compile", "free_activation_threshold", "number",
          "regc's static memory plan frees every activation after its last use, always"),
    NEUTRAL("compile", "offload_activation_pin_memory", "[true]",
            "regc's offloaded activations are in pinned host memory always"),
    INERT("compile", "double_buffer", "bool",
          "double-buffered reduce buckets: regc's reduce-scatters each write a buffer of their "
          "own, reused only after their wait, as many in flight as "
          "zero_optimization.reduce_bucket_size holds"),
    NEUTRAL("compile", "symmetric_memory", "[false]",
            "NCCL's symmetric memory for the collectives, which regc's NCCL communicator does not "
            "register"),
    INERT(
        "compile", "debug_log", "bool",
        "DeepCompile's log: regc prints what it compiled (compile.dump_graphs writes the graphs)"),
    NEUTRAL("compile", "offload_parameters", "[false]", WHY_OFFLOAD_PARAM),
    INERT("compile", "sync_before_reduce", "bool", WHY_DC_SYNC),
    INERT("compile", "sync_after_reduce", "bool", WHY_DC_SYNC),
    INERT("compile", "sync_before_allgather", "bool", WHY_DC_SYNC),
    INERT("compile", "sync_after_allgather", "bool", WHY_DC_SYNC),
    INERT("compile", "keep_int_input_tensors", "bool",
          "inputs DeepCompile keeps for its profiling: regc compiles from shapes and profiles the "
          "real steps (compile.schedule)"),
    INERT("compile", "keep_all_input_tensors", "bool",
          "inputs DeepCompile keeps for its profiling: regc compiles from shapes and profiles the "
          "real steps (compile.schedule)"),
    /* ---- Transformers' TrainingArguments (a JSON file of them): those not
     * applied above */
    {"train", "average_tokens_across_devices", NULL, OPT_SWITCH, NULL, 0, 0, 0, NULL,
     FIELD(average_tokens), 0,
     "Transformers' loss over every target of the global batch, which regc's always is; false "
     "(each rank's mean) is refused where the ranks can count different targets (a loss mask)",
     .alias = {{"average_tokens_across_devices"}}},
    NEUTRAL("", "fp16", "[false]", WHY_FP16),
    NEUTRAL("", "bf16_full_eval", "[false]",
            "validation in pure bf16: regc validates as it trains"),
    NEUTRAL("", "fp16_full_eval", "[false]",
            "validation in pure fp16: regc validates as it trains"),
    NEUTRAL("", "label_smoothing_factor", "[0]",
            "label smoothing, which regc's cross-entropy does not do"),
    NEUTRAL("", "neftune_noise_alpha", "[null]",
            "NEFTune's embedding noise, which regc does not add"),
    NEUTRAL("", "optim", "[\"adamw_torch\", \"adamw_torch_fused\", \"adamw_hf\"]",
            "the optimizer: regc's is torch.optim.AdamW"),
    NEUTRAL("", "optim_args", "[null, \"\"]", "the optimizer's own arguments: regc's is AdamW"),
    NEUTRAL("", "optim_target_modules", "[null]", "GaLore and APOLLO, which regc does not do"),
    NEUTRAL("", "adafactor", "[false]", "the optimizer: regc's is torch.optim.AdamW"),
    NEUTRAL("", "auto_find_batch_size", "[false]",
            "a search for a batch that fits: regc fits the step to compile.memory_budget_mb by "
            "recomputing and gathering instead"),
    NEUTRAL("", "group_by_length", "[false]", "batches of alike lengths: a token file has none"),
    NEUTRAL("", "train_sampling_strategy", "[\"random\", \"sequential\"]",
            "batches of alike lengths: a token file has none (regc reads its rows in llm.c's "
            "order)"),
    NEUTRAL("", "past_index", "[-1]", "a model's past state fed back in, which regc's do not have"),
    NEUTRAL("", "ignore_data_skip", "[false]",
            "a resumed run restarting its data: regc's goes on where it stood"),
    NEUTRAL("", "load_best_model_at_end", "[false]",
            "the best checkpoint loaded at the end: regc's --save holds the last step's weights"),
    NEUTRAL("", "fsdp", "[null, \"\", [], false]",
            "PyTorch FSDP: regc shards with zero_optimization.stage 3"),
    NEUTRAL("", "parallelism_config", "[null]",
            "Accelerate's parallelism: regc's is data parallel under ZeRO"),
    NEUTRAL("", "per_gpu_train_batch_size", "[null]",
            "the old name of per_device_train_batch_size, which regc reads instead"),
    INERT("", "report_to", NULL, WHY_REPORT),
    INERT("", "run_name", NULL, WHY_REPORT),
    INERT("", "logging_dir", NULL, WHY_REPORT),
    INERT("", "logging_strategy", NULL, WHY_REPORT),
    INERT("", "logging_steps", NULL, WHY_REPORT),
    INERT("", "logging_first_step", NULL, WHY_REPORT),
    INERT("", "logging_nan_inf_filter", NULL, WHY_REPORT),
    INERT("", "log_level", NULL, WHY_REPORT),
    INERT("", "log_level_replica", NULL, WHY_REPORT),
    INERT("", "log_on_each_node", NULL, WHY_REPORT),
    INERT("", "disable_tqdm", NULL, WHY_REPORT),
    INERT("", "project", NULL, WHY_REPORT),
    INERT("", "trackio_space_id", NULL, WHY_REPORT),
    INERT("", "push_to_hub", NULL, WHY_REPORT),
    INERT("", "hub_token", NULL, WHY_REPORT),
    INERT("", "hub_private_repo", NULL, WHY_REPORT),
    INERT("", "hub_model_id", NULL, WHY_REPORT),
    INERT("", "hub_strategy", NULL, WHY_REPORT),
    INERT("", "hub_always_push", NULL, WHY_REPORT),
    INERT("", "hub_revision", NULL, WHY_REPORT),
    INERT("", "push_to_hub_model_id", NULL, WHY_REPORT),
    INERT("", "push_to_hub_organization", NULL, WHY_REPORT),
    INERT("", "push_to_hub_token", NULL, WHY_REPORT),
    INERT("", "include_tokens_per_second", NULL, WHY_REPORT),
    INERT("", "include_num_input_tokens_seen", NULL, WHY_REPORT),
    INERT("", "skip_memory_metrics", NULL, WHY_REPORT),
    INERT("", "ray_scope", NULL, WHY_REPORT),
    INERT("", "debug", NULL, WHY_REPORT),
    INERT("", "eval_strategy", NULL, WHY_EVAL),
    INERT("", "evaluation_strategy", NULL, WHY_EVAL),
    INERT("", "eval_delay", NULL, WHY_EVAL),
    INERT("", "per_device_eval_batch_size", NULL, WHY_EVAL),
    INERT("", "per_gpu_eval_batch_size", NULL, WHY_EVAL),
    INERT("", "prediction_loss_only", NULL, WHY_EVAL),
    INERT("", "eval_on_start", NULL, WHY_EVAL),
    INERT("", "eval_do_concat_batches", NULL, WHY_EVAL),
    INERT("", "eval_use_gather_object", NULL, WHY_EVAL),
    INERT("", "eval_accumulation_steps", NULL, WHY_EVAL),
    INERT("", "include_for_metrics", NULL, WHY_EVAL),
    INERT("", "include_inputs_for_metrics", NULL, WHY_EVAL),
    INERT("", "batch_eval_metrics", NULL, WHY_EVAL),
    INERT("", "metric_for_best_model", NULL, WHY_EVAL),
    INERT("", "greater_is_better", NULL, WHY_EVAL),
    INERT("", "use_legacy_prediction_loop", NULL, WHY_EVAL),
    INERT("", "do_train", NULL, "a script's switch: regc train trains"),
    INERT("", "do_eval", NULL, WHY_EVAL),
    INERT("", "do_predict", NULL, WHY_EVAL),
    INERT("", "dataloader_drop_last", NULL, WHY_LOADER),
    INERT("", "dataloader_num_workers", NULL, WHY_LOADER),
    INERT("", "dataloader_pin_memory", NULL, WHY_LOADER),
    INERT("", "dataloader_persistent_workers", NULL, WHY_LOADER),
    INERT("", "dataloader_prefetch_factor", NULL, WHY_LOADER),
    INERT("", "remove_unused_columns", NULL, WHY_LOADER),
    INERT("", "label_names", NULL, WHY_LOADER),
    INERT("", "length_column_name", NULL, WHY_LOADER),
    INERT("", "dispatch_batches", NULL, WHY_LOADER),
    INERT("", "split_batches", NULL, WHY_LOADER),
    INERT("", "use_cpu", NULL, WHY_DEVICE),
    INERT("", "no_cuda", NULL, WHY_DEVICE),
    INERT("", "use_mps_device", NULL, WHY_DEVICE),
    INERT("", "local_rank", NULL, WHY_DEVICE),
    INERT("", "tpu_num_cores", NULL, WHY_DEVICE),
    INERT("", "tpu_metrics_debug", NULL, WHY_DEVICE),
    INERT("", "ddp_backend", NULL, WHY_DIST),
    INERT("", "ddp_timeout", NULL, WHY_DIST),
    INERT("", "ddp_find_unused_parameters", NULL, WHY_DIST),
    INERT("", "ddp_bucket_cap_mb", NULL, WHY_DIST),
    INERT("", "ddp_broadcast_buffers", NULL, WHY_DIST),
    INERT("", "accelerator_config", NULL, WHY_DIST),
    INERT("", "mp_parameters", NULL, WHY_DIST),
    INERT("", "sharded_ddp", NULL, WHY_DIST),
    INERT("", "fsdp_config", NULL, "FSDP's settings, which apply only with fsdp, refused"),
    INERT("", "fsdp_min_num_params", NULL, "FSDP's settings, which apply only with fsdp, refused"),
    INERT("", "fsdp_transformer_layer_cls_to_wrap", NULL,
          "FSDP's settings, which apply only with fsdp, refused"),
    INERT("", "half_precision_backend", NULL, WHY_DEVICE),
    INERT("", "fp16_backend", NULL, WHY_FP16_OFF),
    INERT("", "fp16_opt_level", NULL, WHY_FP16_OFF),
    INERT("", "jit_mode_eval", NULL, WHY_EVAL),
    INERT("", "use_ipex", NULL, WHY_DEVICE),
    INERT("", "torch_empty_cache_steps", NULL, WHY_DEVICE),
    INERT("", "use_cache", NULL, "the model's key-value cache, which training does not use"),
    INERT("", "full_determinism", NULL, "regc's runs are deterministic always"),
    INERT("", "overwrite_output_dir", NULL, WHY_SAVE),
    INERT("", "save_on_each_node", NULL, WHY_SAVE),
    INERT("", "save_safetensors", NULL, WHY_SAVE),
    INERT("", "save_only_model", NULL, WHY_SAVE),
    INERT("", "enable_jit_checkpoint", NULL,
          "a checkpoint on SIGTERM, which regc writes always (with output_dir)"),
    INERT("", "restore_callback_states_from_checkpoint", NULL, WHY_SAVE),
    INERT("", "torch_compile", NULL, WHY_COMPILE),
    INERT("", "torch_compile_backend", NULL, WHY_COMPILE),
    INERT("", "torch_compile_mode", NULL, WHY_COMPILE),
    INERT("", "torchdynamo", NULL, WHY_COMPILE),
    INERT("", "gradient_checkpointing_kwargs", NULL,
          "how gradient checkpointing runs: regc's recomputation gives the same bits whatever it "
          "recomputes"),
    INERT("", "use_liger_kernel", NULL, "Liger's fused kernels: regc fuses its own"),
    INERT("", "liger_kernel_config", NULL, "Liger's fused kernels: regc fuses its own"),
};

const int regc_option_count = (int)(sizeof regc_option_table / sizeof regc_option_table[0]);
_Static_assert(sizeof regc_option_table / sizeof regc_option_table[0] <= REGC_OPTION_MAX,
               "raise REGC_OPTION_MAX");
