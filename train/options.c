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

#define FIELD(f) offsetof(regc_train_settings, f), sizeof(((regc_train_settings *)0)->f)

static const char *const level_names[] = {"O0", "O1", "O2", NULL};
static const char *const base_dtype_names[] = {"fp32", "bf16", NULL}; /* regc_base_dtype */
static const char *const quant_type_names[] = {"nf4", NULL};
/* auto: a checkpoint saved in 4 bits says, else float32 */
static const char *const compute_dtype_names[] = {"auto", "float32", "bfloat16", NULL};
static const char *const precision_names[] = {"fp32", "bf16", NULL}; /* regc_precision's order */
/* regc_communicator's order */
static const char *const communicator_names[] = {"auto", "mpi", "staged", "nccl", NULL};
static const char *const offload_names[] = {"none", "cpu", NULL};
/* regc_recompute's order */
static const char *const recompute_names[] = {"none", "selective", "full", "auto", NULL};
/* regc_train_options.skip_nonfinite */
static const char *const nonfinite_names[] = {"stop", "skip", NULL};
/* regc_schedule's order */
static const char *const schedule_names[] = {"constant", "constant_with_warmup", "linear",
                                             "cosine",   "cosine_with_min_lr",   NULL};

const regc_option regc_option_table[] = {
    {"train", NULL, "--config", OPT_STRING, "<FILE>", 0, 0, 0, NULL, FIELD(config), 0,
     "JSON config file {\"compile\": {...}, \"train\": {...}} whose keys are these options' "
     "(train.steps, ..., compile.level, ...); unknown keys are errors. Every flag given on the "
     "command line overrides the file, wherever it appears; --model is not needed when the file "
     "sets train.model"},
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
     "apply the model's dropouts as Transformers trains: GPT-2's embedding and residual ones "
     "and lora.lora_dropout, each mask drawn by Philox4x32-10 from --seed, the micro-batch, the "
     "site and the element (the same on every thread, when recomputed and after a resume); a "
     "dropout regc does not apply yet (attention's, BERT's, T5's) is refused by its config key "
     "when above 0. Off: none is applied"},
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
     0, "token file in the llm.c format (default: the built-in corpus)"},
    {"train", "loss_mask", "--loss-mask", OPT_STRING, "<mask.bin>", 0, 0, 0, NULL,
     FIELD(train.loss_mask), 0,
     "which tokens of --data count toward the loss (a regc loss mask, one byte per token; see "
     "tools/prepare_data.py): supervised fine-tuning on responses only"},
    {"train", "val_loss_mask", "--val-loss-mask", OPT_STRING, "<mask.bin>", 0, 0, 0, NULL,
     FIELD(train.val_loss_mask), 0, "the loss mask of --val-data"},
    {"train", "steps", "--steps", OPT_INT, "<N>", 1, INT_MAX, 0, NULL, FIELD(train.steps),
     OPT_SHOW_DEFAULT, "optimizer steps, >= 1"},
    {"train", "batch", "--batch", OPT_INT, "<B>", 1, INT32_MAX, 0, NULL, FIELD(train.batch),
     OPT_SHOW_DEFAULT, "sequences per step, >= 1"},
    {"train", "seq", "--seq", OPT_INT, "<T>", 1, INT32_MAX, 0, NULL, FIELD(train.seq),
     OPT_SHOW_DEFAULT, "tokens per sequence, >= 1"},
    {"train", "lr", "--lr", OPT_FLOAT, "<LR>", 1, 0, 0, NULL, FIELD(train.lr), OPT_SHOW_DEFAULT,
     "AdamW learning rate, > 0"},
    {"train", "weight_decay", "--weight-decay", OPT_FLOAT, "<WD>", 0, 0, 0, NULL,
     FIELD(train.weight_decay), OPT_SHOW_DEFAULT, "AdamW decoupled weight decay, >= 0"},
    {"train", "lr_scheduler_type", "--lr-scheduler-type", OPT_CHOICE,
     "<constant|constant_with_warmup|linear|cosine|cosine_with_min_lr>", 0, 0, 0, schedule_names,
     FIELD(train.lr_scheduler), OPT_SHOW_DEFAULT,
     "how the learning rate moves from step to step, as Hugging Face's get_scheduler: warmup "
     "from 0 over warmup_steps, then constant, a linear decay to 0, or a half cosine to 0 (or to "
     "min_lr) at the last step"},
    {"train", "warmup_steps", "--warmup-steps", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.warmup_steps), OPT_SHOW_DEFAULT,
     "optimizer steps of linear warmup from 0 (the schedules *_with_warmup, linear and cosine)"},
    {"train", "warmup_ratio", "--warmup-ratio", OPT_FLOAT, "<R>", 0, 1, 0, NULL,
     FIELD(train.warmup_ratio), OPT_SHOW_DEFAULT,
     "warmup as a fraction of the steps (rounded up), when warmup_steps is 0"},
    {"train", "min_lr", "--min-lr", OPT_FLOAT, "<LR>", 0, 0, 0, NULL, FIELD(train.min_lr), 0,
     "cosine_with_min_lr: the learning rate the cosine ends at (or min_lr_rate)"},
    {"train", "min_lr_rate", "--min-lr-rate", OPT_FLOAT, "<R>", 0, 1, 0, NULL,
     FIELD(train.min_lr_rate), 0,
     "cosine_with_min_lr: the final learning rate as a fraction of lr"},
    {"train", "max_grad_norm", "--max-grad-norm", OPT_FLOAT, "<N>", 0, 0, 0, NULL,
     FIELD(train.max_grad_norm), OPT_SHOW_DEFAULT,
     "clip the gradients' global L2 norm to N before each update, as torch's clip_grad_norm_ "
     "(0: no clipping); the norm is reported per step"},
    {"train", "on_nonfinite", "--on-nonfinite", OPT_CHOICE, "<stop|skip>", 0, 0, 0, nonfinite_names,
     FIELD(train.skip_nonfinite), OPT_SHOW_DEFAULT,
     "a step whose loss or gradient norm is NaN or infinite is never applied; stop ends the run "
     "there with an error naming the step (checkpoints written before it are kept), skip goes on "
     "to the next batch and does not count the step in the schedule"},
    {"train", "gradient_accumulation_steps", "--gradient-accumulation-steps", OPT_INT, "<K>", 1,
     1 << 20, 0, NULL, FIELD(train.grad_accum), OPT_SHOW_DEFAULT,
     "micro-batches of --batch sequences per optimizer step, their gradients summed in place: "
     "the step is that of one batch of K x batch sequences"},
    {"train", "val_data", "--val-data", OPT_STRING, "<tokens.bin>", 0, 0, 0, NULL,
     FIELD(train.val_data_path), 0,
     "validation token file (llm.c format): the mean loss over its first val_batches batches, "
     "through a forward-only program that keeps no gradients"},
    {"train", "eval_steps", "--eval-steps", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.eval_steps), OPT_SHOW_DEFAULT,
     "validate after every N optimizer steps (0: once, after the last)"},
    {"train", "val_batches", "--val-batches", OPT_INT, "<K>", 1, INT32_MAX, 0, NULL,
     FIELD(train.val_batches), OPT_SHOW_DEFAULT, "batches of --batch sequences per validation"},
    {"train", "seed", "--seed", OPT_SEED, "<S>", 0, 0, 0, NULL, FIELD(train.seed), OPT_SHOW_DEFAULT,
     "seed of the random init of presets and of the masked positions of masked-LM (BERT) "
     "training"},
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
     "at all"},
    {"train", "save_steps", "--save-steps", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.save_steps), OPT_SHOW_DEFAULT,
     "write a checkpoint after every N optimizer steps (0: none; SIGINT and SIGTERM still write "
     "one before exiting)"},
    {"train", "save_total_limit", "--save-total-limit", OPT_INT, "<N>", 0, INT_MAX, 0, NULL,
     FIELD(train.save_total_limit), OPT_SHOW_DEFAULT,
     "keep only the newest N checkpoints (0: all)"},
    {"train", "resume_from_checkpoint", "--resume-from-checkpoint", OPT_STRING, "<DIR|latest>", 0,
     0, 0, NULL, FIELD(train.resume_from), 0,
     "continue from a checkpoint (latest: the newest in --output-dir) exactly as if the run had "
     "never stopped: same data position, schedule and optimizer state; one from another model or "
     "other settings is refused"},
    {"train", NULL, "--profile", OPT_FLAG, NULL, 0, 0, 0, NULL, FIELD(profile), 0,
     "time every instruction of the steps after the first and, after training, print on stderr "
     "where a step's time goes: per kernel and GEMM shape, ms per step and GFLOP/s"},
    {"compile", "backend", "--backend", OPT_BACKEND, "<name>", 0, 0, 0, NULL, FIELD(train.backend),
     OPT_SHOW_DEFAULT, "compute backend: cpu, or cuda (cuda:N for device N) where built"},
    {"compile", "level", "--level", OPT_CHOICE, "<O0|O1|O2>", 0, 0, 0, level_names,
     FIELD(train.compile.level), OPT_SHOW_DEFAULT,
     "O0 op by op; O1 fused with a static memory plan; O2 adds whole-step capture (on the CPU "
     "the same as O1)"},
    {"compile", "precision", "--precision", OPT_CHOICE, "<fp32|bf16>", 0, 0, 0, precision_names,
     FIELD(train.compile.precision), OPT_SHOW_DEFAULT,
     "fp32, or bf16 mixed precision as torch.autocast does it for matrix products: every GEMM "
     "multiplies bf16-rounded operands with fp32 sums (AVX-512 BF16 on the CPU where present), "
     "the saved activations autocast keeps in bf16 are rounded where made and held in bf16, and "
     "so is what only those GEMMs read; weights, gradients, optimizer state, norms, softmax and "
     "the loss stay fp32"},
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
     FIELD(train.compile.dump_dir), 0,
     "write the compiler's intermediate graphs to DIR (compiles afresh: the cache is not read)"},
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
     "AdamW's moments over the ranks, each unit gathered before its use"},
    {"zero_optimization", "communicator", "--communicator", OPT_CHOICE, "<auto|mpi|staged|nccl>", 0,
     0, 0, communicator_names, FIELD(train.communicator), OPT_SHOW_DEFAULT,
     "what the ranks' collectives run on: mpi over host buffers (the cpu backend), staged (MPI "
     "with device buffers copied through the host: ranks sharing a GPU), nccl (between GPUs); "
     "auto: mpi on the cpu, nccl on GPUs of their own, else staged"},
    {"zero_optimization", "stage3_prefetch_bucket_size", "--prefetch-bucket-size", OPT_INT,
     "<ELEMENTS>", 0, (double)(INT64_C(1) << 50), 0, NULL, FIELD(train.compile.prefetch_floats), 0,
     "stage 3: parameters gathered ahead of the compute, at least one unit (default: one unit "
     "ahead; 0 gathers each unit where it is needed)"},
    {"zero_optimization", "stage3_max_live_parameters", "--max-live-parameters", OPT_INT,
     "<ELEMENTS>", 0, (double)(INT64_C(1) << 50), 0, NULL, FIELD(train.compile.max_live_floats), 0,
     "stage 3: at most this many parameters gathered at once, the unit computing and those "
     "gathered ahead of it (default 0: no limit; resident units not counted)"},
    {"zero_optimization", "stage3_param_persistence_threshold", "--param-persistence-threshold",
     OPT_INT, "<ELEMENTS>", 0, (double)(INT64_C(1) << 50), 0, NULL,
     FIELD(train.compile.persistence_floats), 0,
     "stage 3: units (a layer's parameters, a piece of glue's) of at most this many parameters "
     "stay gathered from their forward to their backward, gathered once a step instead of "
     "twice (default 0: none)"},
    {"zero_optimization.offload_optimizer", "device", "--offload-optimizer", OPT_CHOICE,
     "<none|cpu>", 0, 0, 0, offload_names, FIELD(train.compile.offload_optimizer), OPT_SHOW_DEFAULT,
     "where AdamW's moments live and its update runs: cpu keeps them, and a copy of the "
     "parameters, in the host's pinned memory, the update on the host's cores (the gradients "
     "copied there during the backward, the parameters back after the update): a GPU holds 8 "
     "bytes a parameter instead of 16, for the same bits"},
    {"zero_optimization.offload_optimizer", "pin_memory", NULL, OPT_SWITCH, NULL, 0, 0, 0, NULL,
     FIELD(train.offload_pin_memory), 0,
     "the offloaded state in pinned host memory: always (DeepSpeed's key, accepted as true)"},
    {"zero_optimization", "reduce_bucket_size", "--reduce-bucket-size", OPT_INT, "<ELEMENTS>", 1,
     (double)(INT64_C(1) << 50), 0, NULL, FIELD(train.compile.reduce_bucket_floats), 0,
     "gradient elements reduced at a time: stage 0 all-reduces the gradients in buckets of "
     "whole parameters of at most this many, each as soon as the backward has written it "
     "(default 6553600: 25 MiB); stage 3 waits for a reduce-scatter once those started after "
     "it reach this many (default: once the next one starts)"},
    {"compile", "memory_budget_mb", "--memory-budget-mb", OPT_INT, "<MB>", 1,
     (double)(INT64_C(1) << 30), INT64_C(1) << 20, NULL, FIELD(train.compile.budget_bytes), 0,
     "device memory per rank in MiB; the compiler makes the step fit: with recompute auto, the "
     "least recomputation that does, and at stage 3 how far ahead to gather and which units to "
     "keep gathered from forward to backward"},
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
     recompute_names, FIELD(train.compile.recompute), OPT_SHOW_DEFAULT,
     "saved activations dropped after the forward and computed again in the backward, the same "
     "bits in less memory: selective keeps GEMM and attention outputs and recomputes norms, "
     "activations and elementwise chains; full keeps each layer's inputs only (Hugging Face's "
     "gradient checkpointing); auto recomputes the least that fits memory_budget_mb, the "
     "cheapest in FLOPs per byte freed first (nothing without a budget)"},
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
     "for each collective where it is placed"},
};

const int regc_option_count = (int)(sizeof regc_option_table / sizeof regc_option_table[0]);
_Static_assert(sizeof regc_option_table / sizeof regc_option_table[0] <= REGC_OPTION_MAX,
               "raise REGC_OPTION_MAX");

void regc_train_settings_default(regc_train_settings *s)
{
    memset(s, 0, sizeof *s);
    regc_train_options_default(&s->train);
    s->quant.double_quant = 1; /* QLoRA's; Transformers' default is off, refused */
}

void *regc_option_field(const regc_option *o, regc_train_settings *s)
{
    return (char *)s + o->offset;
}

const regc_option *regc_option_by_key(const char *section, const char *key)
{
    for (int i = 0; i < regc_option_count; i++) {
        const regc_option *o = &regc_option_table[i];
        if (o->key && !strcmp(o->section, section) && !strcmp(o->key, key))
            return o;
    }
    return NULL;
}

int regc_option_section_known(const char *section)
{
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].key && !strcmp(regc_option_table[i].section, section))
            return 1;
    return 0;
}

/* DeepSpeed's keys that regc knows by name but does not take yet: refused
 * as such rather than as typos. */
int regc_option_not_yet(const char *section, const char *key)
{
    static const char *const later[] = {"offload_param", NULL};
    for (int i = 0; !strcmp(section, "zero_optimization") && later[i]; i++)
        if (!strcmp(key, later[i]))
            return 1;
    return 0;
}

const regc_option *regc_option_by_flag(const char *flag)
{
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].flag && !strcmp(regc_option_table[i].flag, flag))
            return &regc_option_table[i];
    return NULL;
}

int regc_option_takes_value(const regc_option *o) { return o->type != OPT_FLAG; }

/* Ranges up to INT32_MAX and beyond read as "no upper bound" to a person. */
static int unbounded(const regc_option *o) { return o->max >= (double)INT32_MAX; }

void regc_option_describe(const regc_option *o, int in_file, char *buf, size_t cap)
{
    switch (o->type) {
    case OPT_STRING:
        snprintf(buf, cap, in_file ? "a non-empty string or null" : "a non-empty value");
        break;
    case OPT_INT:
        if (unbounded(o) && in_file)
            snprintf(buf, cap, "an integer >= %.0f", o->min);
        else if (unbounded(o))
            snprintf(buf, cap, o->min > 0 ? "a positive integer" : "a non-negative integer");
        else
            snprintf(buf, cap, "an integer from %.0f to %.0f", o->min, o->max);
        break;
    case OPT_SEED:
        snprintf(buf, cap,
                 in_file ? "an integer from 0 to 2^53 - 1 (9007199254740991)"
                         : "a non-negative integer below 2^64");
        break;
    case OPT_FLOAT:
        if (o->max > 0)
            snprintf(buf, cap, "a number from %g to %g", o->min, o->max);
        else if (in_file)
            snprintf(buf, cap, o->min > 0 ? "a finite number > 0" : "a finite number >= 0");
        else
            snprintf(buf, cap, o->min > 0 ? "a positive number" : "a non-negative number");
        break;
    case OPT_FLAG:
    case OPT_SWITCH: snprintf(buf, cap, in_file ? "true or false" : "on or off"); break;
    case OPT_CHOICE: {
        /* "O0, O1 or O2"; quoted in the file, where they are JSON strings */
        size_t n = 0;
        const char *q = in_file ? "\"" : "";
        buf[0] = '\0';
        for (int i = 0; o->choices[i] && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s%s%s",
                                  i == 0              ? ""
                                  : o->choices[i + 1] ? ", "
                                                      : " or ",
                                  q, o->choices[i], q);
        break;
    }
    case OPT_BACKEND:
        snprintf(buf, cap,
                 in_file ? "\"cpu\", \"cuda\", \"cuda:N\" or null" : "cpu, cuda or cuda:N");
        break;
    case OPT_PASSES:
        snprintf(buf, cap,
                 in_file ? "an array of pass names or [name, budget_mb] pairs"
                         : "pass names separated by commas, or none");
        break;
    case OPT_REPLANS:
        snprintf(buf, cap, in_file ? "an array of [step, [passes]] pairs" : "STEP:passes;...");
        break;
    case OPT_MODULES:
        snprintf(buf, cap,
                 in_file ? "an array of module names, a regular expression or \"all-linear\""
                         : "module names separated by commas, or all-linear");
        break;
    }
}

void regc_option_store_int(const regc_option *o, regc_train_settings *s, int64_t v)
{
    v *= o->scale ? o->scale : 1;
    void *f = regc_option_field(o, s);
    if (o->size == sizeof(int64_t))
        memcpy(f, &v, sizeof v);
    else {
        int x = (int)v;
        memcpy(f, &x, sizeof x);
    }
}

/* "cpu", "cuda" or "cuda:N" (N a device number up to 1024). */
static int backend_name_ok(const char *s)
{
    int64_t device;
    return !strcmp(s, "cpu") || !strcmp(s, "cuda") ||
           (!strncmp(s, "cuda:", 5) && regc_text_to_i64(s + 5, 0, 1024, &device) == 0);
}

static int bad_value(const regc_option *o, const char *text)
{
    char what[160];
    regc_option_describe(o, 0, what, sizeof what);
    return regc_error(REGC_ERR_ARG, "%s: expected %s, got \"%s\"", o->flag, what, text);
}

int regc_option_set_text(const regc_option *o, regc_train_settings *s, const char *text)
{
    void *f = regc_option_field(o, s);
    if (o->type == OPT_FLAG) {
        if (text)
            return regc_error(REGC_ERR_ARG, "%s takes no value", o->flag);
        *(int *)f = 1;
        return REGC_OK;
    }
    if (!text)
        return regc_error(REGC_ERR_ARG, "%s: missing value", o->flag);
    switch (o->type) {
    case OPT_STRING:
        if (!text[0])
            return bad_value(o, text);
        *(const char **)f = text;
        return REGC_OK;
    case OPT_INT: {
        int64_t v;
        if (regc_text_to_i64(text, (int64_t)o->min, (int64_t)o->max, &v))
            return bad_value(o, text);
        regc_option_store_int(o, s, v);
        return REGC_OK;
    }
    case OPT_SEED: return regc_text_to_u64(text, (uint64_t *)f) ? bad_value(o, text) : REGC_OK;
    case OPT_FLOAT: {
        float v;
        int rc = regc_text_to_float(text, o->min > 0, &v);
        if (rc == -2)
            return regc_error(REGC_ERR_ARG, "%s: %s is too small for a float", o->flag, text);
        if (rc || (o->max > 0 && !(v <= o->max)))
            return bad_value(o, text);
        /* a double field keeps the decimal as written (a ratio times the
         * steps must round up as the user's arithmetic does) */
        if (o->size == sizeof(double))
            *(double *)f = strtod(text, NULL);
        else
            *(float *)f = v;
        return REGC_OK;
    }
    case OPT_SWITCH:
        if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0)
            return bad_value(o, text);
        *(int *)f = !strcmp(text, "on");
        return REGC_OK;
    case OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (!strcmp(text, o->choices[i])) {
                *(int *)f = i;
                return REGC_OK;
            }
        return bad_value(o, text);
    case OPT_BACKEND:
        if (!backend_name_ok(text))
            return bad_value(o, text);
        *(const char **)f = text;
        return REGC_OK;
    case OPT_PASSES:
    case OPT_REPLANS: {
        char why[160];
        if (o->type == OPT_PASSES ? regc_passes_from_text(text, f, why, sizeof why)
                                  : regc_replans_from_text(text, f, why, sizeof why))
            return regc_error(REGC_ERR_ARG, "%s: %s, got \"%s\"", o->flag, why, text);
        return REGC_OK;
    }
    case OPT_MODULES: {
        regc_lora_targets *t = f;
        if (!text[0] || strlen(text) >= sizeof t->text || strspn(text, ",") == strlen(text))
            return bad_value(o, text);
        snprintf(t->text, sizeof t->text, "%s", text);
        t->regex = 0;
        return REGC_OK;
    }
    case OPT_FLAG: break;
    }
    return REGC_OK;
}

/* ---------------------------------------------------------------- usage */

#define USAGE_COL 25   /* where help text starts */
#define USAGE_WIDTH 92 /* and where it wraps */

/* Words of text from column `col` on, wrapping at USAGE_WIDTH. */
static void write_wrapped(FILE *f, const char *text, int col)
{
    while (*text) {
        size_t word = strcspn(text, " ");
        if (col > USAGE_COL && col + 1 + (int)word > USAGE_WIDTH) {
            fprintf(f, "\n%*s", USAGE_COL, "");
            col = USAGE_COL;
        } else if (col > USAGE_COL) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)word, text);
        col += (int)word;
        text += word;
        text += strspn(text, " ");
    }
}

static void default_text(const regc_option *o, const regc_train_settings *d, char *buf, size_t cap)
{
    const void *f = (const char *)d + o->offset;
    int64_t v;
    switch (o->type) {
    case OPT_INT:
        if (o->size == sizeof(int64_t))
            memcpy(&v, f, sizeof v);
        else
            v = *(const int *)f;
        snprintf(buf, cap, "%" PRId64, v / (o->scale ? o->scale : 1));
        break;
    case OPT_SEED: snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)f); break;
    case OPT_FLOAT:
        snprintf(buf, cap, "%g",
                 o->size == sizeof(double) ? *(const double *)f : (double)*(const float *)f);
        break;
    case OPT_SWITCH: snprintf(buf, cap, "%s", *(const int *)f ? "on" : "off"); break;
    case OPT_CHOICE: snprintf(buf, cap, "%s", o->choices[*(const int *)f]); break;
    case OPT_STRING:
    case OPT_BACKEND:
        snprintf(buf, cap, "%s", *(const char *const *)f ? *(const char *const *)f : "none");
        break;
    case OPT_FLAG: snprintf(buf, cap, "off"); break;
    case OPT_PASSES: regc_passes_to_text(f, buf, cap); break;
    case OPT_REPLANS: snprintf(buf, cap, "none"); break;
    case OPT_MODULES: snprintf(buf, cap, "%.48s", ((const regc_lora_targets *)f)->text); break;
    }
}

static void write_row(FILE *f, const regc_option *o, const regc_train_settings *d)
{
    char head[128], help[1024];
    snprintf(head, sizeof head, "  %s%s%s", o->flag, o->metavar ? " " : "",
             o->metavar ? o->metavar : "");
    fputs(head, f);
    int col = (int)strlen(head);
    if (col + 1 > USAGE_COL) {
        fprintf(f, "\n%*s", USAGE_COL, "");
        col = USAGE_COL;
    } else {
        fprintf(f, "%*s", USAGE_COL - col, "");
        col = USAGE_COL;
    }
    size_t n = (size_t)snprintf(help, sizeof help, "%s", o->help);
    if (o->flags & OPT_LIST_PRESETS)
        for (int i = 0; regc_model_preset_name(i) && n < sizeof help; i++)
            n += (size_t)snprintf(help + n, sizeof help - n, " %s", regc_model_preset_name(i));
    /* the file's key, where it is not the flag with underscores */
    char dashed[64];
    snprintf(dashed, sizeof dashed, "--%s", o->key ? o->key : "");
    for (char *c = dashed; *c; c++)
        *c = *c == '_' ? '-' : *c;
    if (o->key && strcmp(dashed, o->flag) != 0 && n < sizeof help)
        n += (size_t)snprintf(help + n, sizeof help - n, " (%s.%s)", o->section, o->key);
    if ((o->flags & OPT_SHOW_DEFAULT) && n < sizeof help) {
        char v[64];
        default_text(o, d, v, sizeof v);
        snprintf(help + n, sizeof help - n, " (default %s)", v);
    }
    write_wrapped(f, help, col);
    fputc('\n', f);
}

void regc_option_write_usage(FILE *f)
{
    regc_train_settings d;
    regc_train_settings_default(&d);
    fprintf(f, "options:\n");
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].flag && !strcmp(regc_option_table[i].section, "train"))
            write_row(f, &regc_option_table[i], &d);
    fprintf(f, "\nLoRA (PEFT's; the config file's \"lora\" keys):\n");
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].flag && !strcmp(regc_option_table[i].section, "lora"))
            write_row(f, &regc_option_table[i], &d);
    fprintf(f, "\nQLoRA (Transformers' BitsAndBytesConfig; the config file's \"quantization\" "
               "keys):\n");
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].flag && !strcmp(regc_option_table[i].section, "quantization"))
            write_row(f, &regc_option_table[i], &d);
    fprintf(f, "\ncompile options (the config file's \"compile\" keys):\n");
    for (int i = 0; i < regc_option_count; i++)
        if (regc_option_table[i].flag && !strcmp(regc_option_table[i].section, "compile"))
            write_row(f, &regc_option_table[i], &d);
    fprintf(f, "\nseveral processes (mpirun -np N regc train ...; the config file's "
               "\"zero_optimization\" keys):\n");
    for (int i = 0; i < regc_option_count; i++) /* zero_optimization and its sections */
        if (regc_option_table[i].flag &&
            !strncmp(regc_option_table[i].section, "zero_optimization", 17))
            write_row(f, &regc_option_table[i], &d);
}
