/* regc.h — the pipeline: models (frontends), token data, the executor and
 * the training loop. Everything here sits on the graph IR (regc_graph.h)
 * and the backend interface (kernels/regc_backend.h). */
#ifndef REGC_H
#define REGC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "regc_common.h"
#include "regc_backend.h"
#include "regc_cache.h"
#include "regc_graph.h"

/* ======================================================================
 * Models: an architecture's configuration plus named parameters (shapes
 * always; host fp32 weights once loaded or initialised).
 * ====================================================================== */
typedef struct regc_model regc_model;

/* Load a model from a Hugging Face directory (config.json +
 * model.safetensors or model.safetensors.index.json), create a built-in
 * preset, or read a regc graph JSON file (a path ending in ".json" that is
 * not a directory: architecture "graph", see region/graph_model.c). Presets
 * and graph models are shape only until regc_model_init_random or
 * regc_model_read_safetensors. */
int regc_model_load(const char *spec, regc_model **out);
/* Load only config.json of a Hugging Face directory: shapes, no weights. */
int regc_model_load_config(const char *dir, regc_model **out);
/* A model's shapes without its weights, from any spec regc_model_load
 * takes (a preset, a Hugging Face directory, a graph JSON file). */
int regc_model_load_shapes(const char *spec, regc_model **out);
/* Read every parameter from one safetensors file, matched by name (a
 * missing tensor or a wrong shape is an error naming the file and tensor;
 * extra tensors are ignored). Allocates the weights if needed. */
int regc_model_read_safetensors(regc_model *m, const char *path);
int regc_model_is_preset(const char *spec);
/* The same architecture and widths with n_layer layers (every stack of an
 * encoder-decoder), shape only. Graph JSON models have a fixed depth. */
int regc_model_with_layers(const regc_model *m, int64_t n_layer, regc_model **out);
const char *const *regc_model_preset_names(void); /* NULL-terminated */
void regc_model_free(regc_model *m);

const char *regc_model_arch(const regc_model *m);     /* "gpt2", "graph" */
int64_t regc_model_vocab(const regc_model *m);
int64_t regc_model_max_seq(const regc_model *m);     /* n_positions */
int regc_model_has_weights(const regc_model *m);
/* Print the configuration (and the dropout probabilities, which training
 * does not apply yet) as one line. */
void regc_model_describe(const regc_model *m, char *buf, size_t cap);

/* Parameters in checkpoint order; their names are the checkpoint's names. */
int regc_model_n_params(const regc_model *m);
const char *regc_model_param_name(const regc_model *m, int i);
int regc_model_param_shape(const regc_model *m, int i, int64_t *shape); /* returns ndim */
int64_t regc_model_param_numel(const regc_model *m, int i);
int64_t regc_model_param_offset(const regc_model *m, int i); /* in floats, in weights() */
int64_t regc_model_total_numel(const regc_model *m);
float *regc_model_weights(regc_model *m); /* NULL while shape-only */

/* Deterministic random init (GPT-2's scheme with uniform draws): weights of
 * std 0.02 (residual projections 0.02 / sqrt(2 n_layer)), norms 1, biases 0. */
int regc_model_init_random(regc_model *m, uint64_t seed);
/* The flat forward graph for [batch, seq] token inputs, ending in the mean
 * cross-entropy loss (its first output); one parameter tensor per model
 * parameter. Its inputs are the architecture's: causal LMs take
 * "input_ids" [B, T], "position_ids" [T] and "targets" [B, T] (i32); see
 * regc_model_fill_inputs for what each architecture adds. */
int regc_model_build_graph(const regc_model *m, int64_t batch, int64_t seq, regc_graph **out);
/* Write config.json and model.safetensors (HF names and layouts) into dir,
 * creating it; each file is written atomically. Graph models write
 * graph.json instead of config.json. */
int regc_model_save(const regc_model *m, const char *dir);

/* ======================================================================
 * Safetensors files
 * ====================================================================== */
typedef struct {
    char *name;
    regc_dtype dtype;
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
    const float *data; /* fp32 host data to write */
} regc_st_entry;

typedef struct regc_st_file regc_st_file;
/* Open and validate a .safetensors file (header length, JSON, offsets
 * within the file). */
int regc_st_open(const char *path, regc_st_file **out);
void regc_st_close(regc_st_file *f);
int regc_st_count(const regc_st_file *f);
const char *regc_st_name(const regc_st_file *f, int i);
int regc_st_find(const regc_st_file *f, const char *name); /* index or -1 */
/* Read tensor i converted to fp32 (F32, BF16, F16 accepted), checking that
 * its shape is exactly `shape`. */
int regc_st_read_f32(const regc_st_file *f, int i, int ndim, const int64_t *shape, float *dst);
/* Write entries (fp32 data stored as F32) to path atomically. */
int regc_st_write(const char *path, const regc_st_entry *entries, int n);

/* ======================================================================
 * Token data (llm.c format: 256 int32 header — magic 20240520, version 1,
 * token count — then uint16 tokens)
 * ====================================================================== */
typedef struct regc_tokens regc_tokens;
/* Open a token file, checking the header, the length and that every token
 * is < vocab. */
int regc_tokens_open(const char *path, int64_t vocab, regc_tokens **out);
/* The built-in corpus: a small English text as byte-level tokens (< 256). */
int regc_tokens_builtin(regc_tokens **out);
/* Write a token file (for tests and tools). */
int regc_tokens_write(const char *path, const uint16_t *tokens, int64_t n);
int64_t regc_tokens_count(const regc_tokens *t);
/* Batch k: inputs [B, T] = tokens[p .. p+B*T-1], targets = the next tokens,
 * p advancing by B*T each batch and wrapping to 0 when fewer than B*T+1
 * tokens remain. Needs count >= B*T + 1. */
int regc_tokens_batch(const regc_tokens *t, int64_t k, int64_t batch, int64_t seq,
                      int32_t *inputs, int32_t *targets);
void regc_tokens_free(regc_tokens *t);

/* ======================================================================
 * Graph inputs of one training step
 * ====================================================================== */
typedef struct {
    int64_t step;  /* batch index, from 0 */
    int64_t batch, seq;
    uint64_t seed; /* of anything drawn per batch (masked positions) */
} regc_batch_spec;

/* One graph input and its host buffer (numel x dtype size bytes). */
typedef struct {
    const regc_tensor *tensor;
    void *host;
    int filled;
    /* set by the filler for an input that is the same for every batch
     * (positions, rotary tables, buckets): it stays filled, and is neither
     * recomputed nor copied to the device again */
    int constant;
} regc_input;

/* Fill every input of m's training graph for one batch: token ids and
 * targets from `data`, plus the architecture's own inputs (positions,
 * rotary tables, relative-position buckets, masked positions). Constant
 * inputs filled by an earlier call are kept. An input the architecture
 * does not know is an error naming it. */
int regc_model_fill_inputs(const regc_model *m, const regc_tokens *data,
                           const regc_batch_spec *b, int n, regc_input *in);

/* ======================================================================
 * Executor (level O0): runs a graph node by node on a backend, allocating
 * each activation when produced and freeing it after its last reader.
 * ====================================================================== */
typedef struct regc_exec regc_exec;
int regc_exec_new(const regc_graph *g, regc_backend *be, regc_exec **out);
void regc_exec_free(regc_exec *x);
/* Make tensor t live in caller-owned device memory (parameters,
 * gradients, inputs); such memory is never freed by the executor. */
int regc_exec_bind(regc_exec *x, int tensor, void *device_ptr);
/* Run every node; graph outputs and bound tensors stay readable after. */
int regc_exec_run(regc_exec *x);
/* Device pointer of a bound tensor or a graph output after run, else NULL. */
void *regc_exec_tensor(regc_exec *x, int tensor);

/* ======================================================================
 * Compilation: the training step (forward, backward) as one program
 * ====================================================================== */
typedef enum {
    REGC_LEVEL_O0, /* op by op, no fusion, allocation at run time */
    REGC_LEVEL_O1, /* fusion, static memory plan, inline back with cross-layer passes */
    REGC_LEVEL_O2, /* O1 plus whole-step capture; on the CPU the same as O1 */
} regc_level;

typedef struct {
    int regional;         /* compile.use_regional_compilation (default 1) */
    regc_level level;     /* compile.level (default O1) */
    /* compile.inline_back (default 1): stamp the compiled regions into one
     * flat step program; 0 runs the lazily-inlined program (prologue,
     * CALL(region, instance) ..., epilogue) directly, the reference for
     * inline back. O0 always runs lazily. */
    int inline_back;
    const char *dump_dir; /* compile.dump_graphs: NULL, or a directory */
    /* The compile cache (regc_cache_open), or NULL. With a cache, a step
     * compiled before loads whole, and a layer compiled before (for another
     * depth, say) loads instead of compiling. Dumps always compile. */
    regc_cache *cache;
    /* The target, part of every cache key: regc_backend's device ("cpu",
     * "cuda sm_90"); NULL is "cpu". */
    const char *device;
} regc_compile_options;

void regc_compile_options_default(regc_compile_options *o);
/* "O0", "O1", "O2" -> level, or -1 */
int regc_level_from_name(const char *name);
const char *regc_level_name(regc_level l);

/* What compiling a step cost and gave. */
typedef struct {
    double build_ms;    /* the flat forward graph */
    double detect_ms;   /* block detection (0 for full compilation) */
    double compile_ms;  /* regions: extract, differentiate, passes, lowering, local plans */
    double inline_ms;   /* lazy inline, inline back, cross-layer passes, global plan */
    int region_kinds;   /* distinct repeated layers found */
    int region_compiles; /* regions compiled: one per kind, or 1 for the whole graph */
    int glue_compiles;  /* prologue, epilogue and the glue between runs */
    int instances;      /* calls of compiled layers per pass */
    int add_norm_fusions; /* residual add + next norm pairs fused across layers */
    int64_t n_instructions; /* of the step program (forward + backward) */
    int64_t peak_bytes;     /* of the activation memory plan (0 at O0) */
    int64_t lower_bound_bytes; /* the most bytes live at any program point */
    int memory_aware_order; /* 1: the reordered program had the lower peak and was kept */
    int cache_hits;      /* compile-cache entries used: the step, or regions */
    int cache_misses;    /* looked up, not usable, compiled and stored */
    double cache_ms;     /* keying, reading and decoding cache entries */
} regc_compile_stats;

/* ======================================================================
 * Profile: where the time of a run goes, summed per row (a kernel and its
 * shape) and reported per run, largest first.
 * ====================================================================== */
#define REGC_PROFILE_LABEL 96 /* a row's label, terminator included */
typedef struct regc_profile regc_profile;
regc_profile *regc_profile_new(void); /* NULL when out of memory (error set) */
void regc_profile_free(regc_profile *pr);
/* Add one call of ms to the row named label; flop > 0 counts the row's
 * arithmetic (GEMMs), reported as GFLOP/s. */
int regc_profile_add(regc_profile *pr, const char *label, double ms, double flop);
void regc_profile_count_run(regc_profile *pr);
int regc_profile_runs(const regc_profile *pr);
/* Rows in the order they were first added; ms, flop and calls summed over
 * every run. */
int regc_profile_n_rows(const regc_profile *pr);
const char *regc_profile_row(const regc_profile *pr, int i, double *ms, double *flop, long *calls);
/* The table: ms per run, share, calls per run, GFLOP/s, label; then the total. */
int regc_profile_write(const regc_profile *pr, FILE *f);

/* A compiled training step: forward, backward, parameter gradients into
 * the gradient block. */
typedef struct regc_program regc_program;

/* Build m's graph for [batch, seq], then compile it as o says. Shapes only:
 * m needs no weights. */
int regc_program_compile(const regc_model *m, int64_t batch, int64_t seq,
                         const regc_compile_options *o, regc_program **out,
                         regc_compile_stats *stats);
void regc_program_free(regc_program *p);
/* The graph inputs the step reads, in tensor order (as regc_model_fill_inputs fills them). */
int regc_program_n_inputs(const regc_program *p);
const regc_tensor *regc_program_input(const regc_program *p, int i);
/* Bind device memory: the parameter and gradient blocks (model order) and
 * one buffer per input; allocates the activation arena on be. */
int regc_program_bind(regc_program *p, regc_backend *be, float *params, float *grads,
                      void *const *inputs);
/* Run forward and backward; gradients land in the gradient block (every
 * parameter's gradient is overwritten). */
int regc_program_run(regc_program *p);
/* Time every instruction of the runs that follow into pr (the backend
 * synchronises after each one), or stop timing (NULL). pr is borrowed. */
void regc_program_set_profile(regc_program *p, regc_profile *pr);
/* Device pointer of the loss after a run. */
const float *regc_program_loss(const regc_program *p);
/* Write the step program as text (instructions and buffers). */
void regc_program_dump(const regc_program *p, FILE *f);

/* ======================================================================
 * Training
 * ====================================================================== */
typedef struct {
    const char *data_path;   /* NULL: the built-in corpus */
    int64_t batch, seq;
    int steps;
    float lr, weight_decay;
    float beta1, beta2, eps; /* AdamW; 0.9, 0.999, 1e-8 by default */
    uint64_t seed;           /* random init of presets */
    const char *save_dir;    /* NULL: do not save */
    const char *backend;     /* "cpu" */
    int threads;             /* <= 0: OMP_NUM_THREADS or all cores */
    regc_compile_options compile;
    const char *cache_dir;   /* the compile cache's directory; NULL: none */
    int64_t cache_max_bytes; /* its size limit; <= 0: none */
    /* when set, every step after the first (the only one, if just one) is
     * timed per instruction, the optimizer and input copies included */
    regc_profile *profile;
    /* called once the step is compiled, with regc_train's user pointer */
    void (*on_compiled)(const regc_compile_stats *st, void *user);
} regc_train_options;

void regc_train_options_default(regc_train_options *o);

typedef struct {
    int step;          /* from 0 */
    float loss;        /* of this step's forward pass, before its update */
    double ms;         /* wall time of the whole step */
    double tokens_per_s;
} regc_step_report;

typedef void (*regc_step_fn)(const regc_step_report *r, void *user);

/* Train m in place for o->steps steps, calling on_step after each. Presets
 * without weights are initialised from o->seed first. */
int regc_train(regc_model *m, const regc_train_options *o, regc_step_fn on_step, void *user);

/* ======================================================================
 * Config file (JSON): {"compile": {...}, "train": {...}}. The train keys
 * mirror the `regc train` flags (model, weights, data, steps, batch, seq,
 * lr, weight_decay, seed, threads, save, json); the compile keys are
 * use_regional_compilation, level, backend, dump_graphs, inline_back.
 * Unknown keys and bad values are errors naming the file and the key.
 * ====================================================================== */
typedef struct regc_config regc_config;
int regc_config_load(const char *path, regc_config **out);
void regc_config_free(regc_config *c);
/* Set the fields of o that the file sets; strings stay owned by c. */
void regc_config_apply(const regc_config *c, regc_train_options *o);
const char *regc_config_model(const regc_config *c);   /* train.model or NULL */
const char *regc_config_weights(const regc_config *c); /* train.weights or NULL */
int regc_config_json(const regc_config *c);            /* train.json: 1, 0, or -1 when unset */

#endif
