/* regc_models.h — models: an architecture's configuration plus named
 * parameters (shapes always; host fp32 weights once loaded or initialised),
 * the Hugging Face frontends, graph JSON models, safetensors files, and
 * the graph inputs of one training step.
 *
 * A model builds its flat forward graph from shapes alone; it neither
 * compiles nor runs anything. */
#ifndef REGC_MODELS_H
#define REGC_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "regc_common.h"
#include "regc_data.h"
#include "regc_graph.h"

typedef struct regc_model regc_model;

/* Load a model from a Hugging Face directory (config.json +
 * model.safetensors or model.safetensors.index.json), create a built-in
 * preset, or read a regc graph JSON file (a path ending in ".json" that is
 * not a directory: architecture "graph", see models/graph_model.c). Presets
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
/* Preset i's name (gpt2-tiny, ...), or NULL past the last. */
const char *regc_model_preset_name(int i);

/* What regc does with a key of an architecture's config.json. A key no
 * table of its architecture names is refused when the model loads, and so
 * is a REFUSED key whose value is not its neutral one. */
typedef enum {
    REGC_KEY_APPLIED, /* read, and the model built as it says (or refused by value) */
    REGC_KEY_INERT,   /* changes nothing in training, whatever its value */
    REGC_KEY_REFUSED, /* changes the model in a way regc does not build */
} regc_key_use;
typedef struct {
    const char *key;
    regc_key_use use;
    const char *neutral; /* REFUSED: the value (JSON text) that changes nothing; NULL: none */
    const char *why;     /* INERT: why it changes nothing; REFUSED: what regc does not build */
} regc_config_key;
/* config.json's model_type i ("gpt2", "llama", ...), or NULL past the last. */
const char *regc_model_type_name(int i);
/* The tables of model_type's keys, NULL-terminated (the last is the one
 * every architecture shares; each table ends with a NULL key); NULL for a
 * model_type regc does not load. Writes at most cap tables. */
int regc_model_config_keys(const char *model_type, const regc_config_key **tables, int cap);
void regc_model_free(regc_model *m);

const char *regc_model_arch(const regc_model *m);   /* "gpt2", "graph" */
const char *regc_model_source(const regc_model *m); /* the directory, file or preset */
/* 1 when m draws its own targets from a row (BERT's masked positions, T5's
 * split pairs) rather than predicting each next token, as a causal LM does. */
int regc_model_chooses_targets(const regc_model *m);
int64_t regc_model_vocab(const regc_model *m);
int64_t regc_model_max_seq(const regc_model *m); /* n_positions */
int regc_model_has_weights(const regc_model *m);
/* Give a shape-only model its weights block (total_numel floats, zero);
 * nothing when it has one. */
int regc_model_alloc_weights(regc_model *m);
/* Print the configuration (and the dropout probabilities, which training
 * does not apply yet) as one line. */
void regc_model_describe(const regc_model *m, char *buf, size_t cap);
/* The rotary embedding's inverse frequencies, n = head_dim / 2 of them
 * (inv_freq may be NULL to ask for n: returns it), and the factor on cos
 * and sin (yarn's and longrope's attention factor, else 1), as
 * Transformers' RoPE initialisers compute them, and as its forward
 * computes them again for seq positions (dynamic, longrope; seq 0: as
 * initialised). Returns n, or an error for an architecture without RoPE or
 * a wrong n. */
int64_t regc_model_compute_rope(const regc_model *m, int64_t seq, float *inv_freq, int64_t n,
                                float *scaling);

/* LoRA as PEFT defines it (models/lora.c): rank-r adapters on the linear
 * layers target_modules names, every other parameter frozen. */
typedef struct {
    int64_t r;
    double alpha;   /* lora_alpha: the update is scaled by alpha / r (0: PEFT's 8) */
    double dropout; /* lora_dropout, applied with train.dropout on */
    int use_rslora; /* scale by alpha / sqrt r */
    /* module names separated by commas (a layer whose name is one, or ends
     * in "." and one), "all-linear" (every linear layer but the output
     * head), or with target_regex a regular expression the whole name
     * matches; NULL: PEFT's default for the architecture (q_proj,v_proj for
     * llama, c_attn for gpt2, query,value for bert, q,v for t5) */
    const char *target_modules;
    int target_regex;
    const char *adapter; /* a PEFT adapter directory the adapters start from, or NULL */
    uint64_t seed;       /* of A's initial draw when there is no adapter */
    /* how the frozen base's weights are held (regc_base_dtype) */
    int base_dtype;
    /* QLoRA: every linear layer's weight but the output head's held in NF4
     * as bitsandbytes quantises it (kernels/nf4_format.h), whatever
     * base_dtype holds the rest in */
    int load_in_4bit;
    /* load_in_4bit: the NF4 weights multiplied as bf16 GEMMs do
     * (bnb_4bit_compute_dtype bfloat16); else in fp32 */
    int compute_bf16;
    /* compute_bf16 was given (not defaulted): a checkpoint saved in 4 bits
     * that says otherwise is refused, naming the key */
    int compute_given;
} regc_lora_config;

/* A LoRA model's frozen base. REGC_BASE_BF16: the weights that matrix
 * products alone read, in bf16 and multiplied as bf16 GEMMs do (a base in
 * bf16, as PEFT trains one). */
typedef enum { REGC_BASE_FP32, REGC_BASE_BF16 } regc_base_dtype;
/* Add the adapters to m (shape-only or with weights: A drawn, B zero) and
 * freeze the rest: an error naming the key when the configuration is bad or
 * matches no linear layer. */
int regc_model_add_lora(regc_model *m, const regc_lora_config *c);
/* What a checkpoint saved from a model in 4 bits holds (config.json's
 * quantization_config, bitsandbytes' NF4): its linear layers' frozen kind,
 * REGC_FROZEN_NF4 or REGC_FROZEN_NF4_BF16 (bnb_4bit_compute_dtype
 * bfloat16); 0 when it is not quantised. Such a base trains only with
 * LoRA, whose load_in_4bit it implies, and its NF4 weights go to the
 * frozen block as the checkpoint's bytes (regc_weights_read_nf4). */
int regc_model_checkpoint_nf4(const regc_model *m);
/* An error naming the model's quantization_config when its base is saved
 * in 4 bits and `lora` (LoRA is, or will be, on) is 0; else REGC_OK. */
int regc_model_check_nf4_trainable(const regc_model *m, int lora);
int regc_model_has_lora(const regc_model *m);
/* "LoRA r=8, alpha 16 (scale 2) on 8 layers (q_proj, v_proj): 65,536 of
 * 1,000,000 parameters trained" into buf. */
void regc_lora_describe(const regc_model *m, char *buf, size_t cap);
/* W += scale * B A into every adapted weight (PEFT's merge_and_unload):
 * m becomes its base again, with the merged weights. */
int regc_model_merge_lora(regc_model *m);
/* PEFT's target_modules as JSON into buf (cap bytes): a list of module
 * names, joined by commas; or a string, a regular expression (*regex = 1)
 * but for "all-linear". 0, or -1 when it is neither or does not fit. */
struct cJSON;
int regc_lora_targets_from_json(const struct cJSON *it, char *buf, size_t cap, int *regex);
/* c from a PEFT adapter directory's adapter_config.json (its
 * target_modules written into targets, cap bytes; c->adapter = dir): an
 * error naming the file and the key for anything regc does not do (bias,
 * DoRA, per-layer ranks, modules_to_save, ...). */
int regc_lora_read_config(const char *dir, regc_lora_config *c, char *targets, size_t cap);
/* 0: trained; 1: frozen, held in fp32; else its REGC_FROZEN_* kind. */
int regc_model_param_frozen(const regc_model *m, int i);
/* A frozen parameter's byte offset in the frozen block, and that block's
 * bytes: the frozen parameters in the model's order, each 64-byte aligned. */
int64_t regc_model_param_frozen_at(const regc_model *m, int i);
int64_t regc_model_frozen_bytes(const regc_model *m);
/* The floats of the parameters that are trained: the weights block's
 * prefix (frozen parameters follow them). */
int64_t regc_model_trainable_numel(const regc_model *m);

/* Apply the model's dropouts in training (train.dropout; before building
 * a graph): its architecture's own (GPT-2's embedding and residual ones)
 * and lora_dropout. Off by default: the graph has none. */
void regc_model_set_dropout(regc_model *m, int on);

/* Documents packed in one token stream, and Megatron's switches for them. */
typedef struct {
    /* documents end after each such token (< 0: a row is one document, the
     * default): every causal attention of the graph then reads a
     * "doc_start" input, [B, T] i32, filled from the batch's input ids, and
     * no query sees a key before its document's first position (Megatron's
     * reset_attention_mask) */
    int64_t eod_token_id;
    /* learned positions count from 0 in each document ("position_ids"
     * becomes [B, T], filled beside doc_start); otherwise they go on counting
     * across documents, as Megatron's do by default. Rotary positions are
     * relative and refuse it. */
    int reset_position_ids;
    /* the target read at an eod token (the next document's first token)
     * does not count (Megatron's eod_mask_loss) */
    int eod_mask_loss;
} regc_documents;

/* Set how m's graphs treat packed documents; before building a graph.
 * Causal language models whose graphs regc builds: an error names the key
 * and the model otherwise (BERT, T5, a graph JSON model), an id past its
 * vocabulary, a switch without eod_token_id, and reset_position_ids on
 * rotary positions. */
int regc_model_set_documents(regc_model *m, const regc_documents *d);
/* m's documents as set (eod_token_id -1 and both switches off when none):
 * what a checkpoint records of them. */
void regc_model_documents(const regc_model *m, regc_documents *out);

/* Parameters in checkpoint order; their names are the checkpoint's names. */
int regc_model_n_params(const regc_model *m);
const char *regc_model_param_name(const regc_model *m, int i);
int regc_model_param_shape(const regc_model *m, int i, int64_t *shape); /* returns ndim */
int64_t regc_model_param_numel(const regc_model *m, int i);
int64_t regc_model_param_offset(const regc_model *m, int i); /* in floats, in weights() */
int64_t regc_model_total_numel(const regc_model *m);
/* A graph model's constant inputs (rotary tables, positions, buckets):
 * values read from its weights file, never trained. 0 for architectures,
 * which compute theirs. */
int regc_model_n_constants(const regc_model *m);
float *regc_model_weights(regc_model *m); /* NULL while shape-only */

/* Deterministic random init (GPT-2's scheme with uniform draws): weights of
 * std 0.02 (residual projections 0.02 / sqrt(2 n_layer)), norms 1, biases 0. */
int regc_model_init_random(regc_model *m, uint64_t seed);
/* The flat forward graph for [batch, seq] token inputs, ending in the mean
 * cross-entropy loss (its first output); one parameter tensor per model
 * parameter. Its inputs are the architecture's: causal LMs take
 * "input_ids" [B, T], "position_ids" [T] ([B, T] under reset_position_ids)
 * and "targets" [B, T] (i32); see regc_model_fill_inputs for what each
 * architecture adds. */
int regc_model_build_graph(const regc_model *m, int64_t batch, int64_t seq, regc_graph **out);
/* Write config.json and model.safetensors (HF names and layouts) into dir,
 * creating it; each file is written atomically. Graph models write
 * graph.json instead of config.json. */
int regc_model_save(const regc_model *m, const char *dir);
/* The same with parameter i stored as dtype[i] (NULL: all fp32). */
int regc_model_save_as(const regc_model *m, const char *dir, const regc_dtype *dtype);
/* m as a graph model of its flat graph at [batch, seq]: the same
 * parameters (and weights, when m has them) and its constant inputs'
 * values as m's architecture fills them. Saved, it trains with no
 * architecture code as m does. */
int regc_model_as_graph(const regc_model *m, int64_t batch, int64_t seq, regc_model **out);

/* ======================================================================
 * Safetensors files
 * ====================================================================== */
typedef struct {
    char *name;
    regc_dtype dtype;
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
    const float *data; /* fp32 host data to write (int32 for an I32 entry) */
} regc_st_entry;

typedef struct regc_st_file regc_st_file;
/* Open and validate a .safetensors file (header length, JSON, offsets
 * within the file, the tensors tiling the data section exactly). */
int regc_st_open(const char *path, regc_st_file **out);
/* The same for a whole file image in memory (bytes must outlive *out);
 * `name` names it in messages. Reads copy from the image. */
int regc_st_parse(const char *name, const void *bytes, size_t size, regc_st_file **out);
void regc_st_close(regc_st_file *f);
int regc_st_count(const regc_st_file *f);
const char *regc_st_name(const regc_st_file *f, int i);
/* Tensor i's dtype when it is a float one (REGC_F32, REGC_BF16, REGC_F16),
 * else -1. */
int regc_st_float_dtype(const regc_st_file *f, int i);
int regc_st_find(const regc_st_file *f, const char *name); /* index or -1 */
/* Read tensor i converted to fp32 (F32, BF16, F16 accepted), checking that
 * its shape is exactly `shape`. */
int regc_st_read_f32(const regc_st_file *f, int i, int ndim, const int64_t *shape, float *dst);
/* Tensor i whole as int32 (I32 or I64 accepted, each value within int32),
 * checking that it has exactly n elements. */
int regc_st_read_i32(const regc_st_file *f, int i, int64_t n, int32_t *dst);
/* Tensor i's dtype as the file spells it ("F32", "U8", ...), NULL past the last. */
const char *regc_st_dtype(const regc_st_file *f, int i);
/* Tensor i whole, its bytes as stored, checking that its dtype is `dtype`
 * and that it holds exactly n elements (a bitsandbytes checkpoint's U8
 * and F32 tensors, copied as they are). */
int regc_st_read_raw(const regc_st_file *f, int i, const char *dtype, int64_t n, void *dst);
/* The bytes of tensor i's data in the file (-1: no tensor i). */
int64_t regc_st_bytes(const regc_st_file *f, int i);
/* REGC_OK when tensor i has exactly `shape`, else an error naming both. */
int regc_st_check_shape(const regc_st_file *f, int i, int ndim, const int64_t *shape);
/* Elements [first, first + n) of tensor i (in row-major order) converted
 * to fp32: a rank reads only the bytes of its shards. */
int regc_st_read_range(const regc_st_file *f, int i, int64_t first, int64_t n, float *dst);
/* Write entries (fp32 data stored as each one's dtype) to path atomically. */
int regc_st_write(const char *path, const regc_st_entry *entries, int n);
/* The same in pieces: open writes the header of entries (their data
 * unused unless with_data checks it is there), put writes elements [first,
 * first + n) of tensor i in any order, finish makes the file durable and
 * renames it into place (freeing w either way); abandon removes it. */
typedef struct regc_st_writer regc_st_writer;
int regc_st_writer_open(const char *path, const regc_st_entry *entries, int n, int with_data,
                        regc_st_writer **out);
int regc_st_writer_put(regc_st_writer *w, int i, int64_t first, int64_t n, const float *src);
/* The same for an I32 tensor (put refuses one: its data is not fp32). */
int regc_st_writer_put_i32(regc_st_writer *w, int i, int64_t first, int64_t n, const int32_t *src);
int regc_st_writer_finish(regc_st_writer *w);
void regc_st_writer_abandon(regc_st_writer *w);
/* ======================================================================
 * Weights a range at a time (models/weights.c): ZeRO-3's ranks read and
 * write only their shards, so no process needs room for the whole model.
 * ====================================================================== */
typedef struct regc_weights regc_weights;
/* m's weights in a Hugging Face directory (model.safetensors, else the
 * files of model.safetensors.index.json) or one safetensors file, each
 * parameter matched by name after `prefix` ("" for a model's files) and its
 * shape checked now: a missing tensor or a wrong shape is an error naming
 * the file and the tensor. m must outlive the source. */
int regc_weights_open(const regc_model *m, const char *path, const char *prefix,
                      regc_weights **out);
/* The weights regc_model_init_random(m, seed) draws. */
int regc_weights_seeded(const regc_model *m, uint64_t seed, regc_weights **out);
/* A LoRA model's base source w reads its adapters from the PEFT adapter
 * directory dir from now on (a checkpoint's). */
int regc_weights_use_adapter(regc_weights *w, const char *dir);
/* The dtype parameter i is stored in at its source (REGC_F32 when drawn). */
regc_dtype regc_weights_dtype(const regc_weights *w, int i);
/* Elements [first, first + n) of parameter i (row-major) as fp32 (a
 * weight held in NF4 at its source: dequantised, bitsandbytes' floats). */
int regc_weights_read(regc_weights *w, int i, int64_t first, int64_t n, float *dst);
/* 1 when parameter i is held in NF4 at its source (a checkpoint saved in
 * 4 bits), else 0. */
int regc_weights_is_nf4(const regc_weights *w, int i);
/* Such a parameter's NF4 blob (kernels/regc_nf4.h, regc_nf4_layout(numel)
 * bytes) assembled from its tensors as they are. */
int regc_weights_read_nf4(regc_weights *w, int i, uint8_t *blob);
/* The bytes of files read so far (0 for the seeded init). */
int64_t regc_weights_bytes_read(const regc_weights *w);
void regc_weights_close(regc_weights *w);
/* Every parameter of m from w (allocating m's weights). */
int regc_model_read_weights(regc_model *m, regc_weights *w);
/* Read every constant of m whole from w (opened without a prefix), each
 * checked for its shape; a seeded source has none, which is an error
 * naming the first constant. Nothing to do for a model without constants. */
int regc_model_read_constants(regc_model *m, regc_weights *w);

/* A model directory (model.safetensors in fp32, then config.json or the
 * graph model's files) written a range at a time: open creates the weights
 * file's temporary, put writes elements [first, first + n) of parameter i,
 * finish puts every file in place (freeing w either way); abandon leaves
 * nothing behind. */
typedef struct regc_model_writer regc_model_writer;
int regc_model_writer_open(const regc_model *m, const char *dir, regc_model_writer **out);
/* The same with parameter i stored as dtype[i] (REGC_F32, REGC_BF16 or
 * REGC_F16; NULL: all fp32). */
int regc_model_writer_open_as(const regc_model *m, const char *dir, const regc_dtype *dtype,
                              regc_model_writer **out);
int regc_model_writer_put(regc_model_writer *w, int i, int64_t first, int64_t n, const float *src);
int regc_model_writer_finish(regc_model_writer *w);
void regc_model_writer_abandon(regc_model_writer *w);

/* What a model's graph is built from, as canonical bytes for the compile
 * cache's keys: its architecture and structural config, or its graph's
 * canonical form (parameter names left out). */
int regc_model_write_structure(const regc_model *m, regc_bytes *b);

/* ======================================================================
 * Graph inputs of one training step
 * ====================================================================== */
typedef struct {
    int64_t step; /* batch index, from 0 */
    int64_t batch, seq;
    uint64_t seed; /* of anything drawn per batch (masked positions) */
    /* data parallelism: these `batch` rows are rows row0 .. of a global
     * batch of global_rows (0: the batch is the whole batch) */
    int64_t row0, global_rows;
    int eval; /* a validation batch: no dropout */
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

/* The entry for the input called `name`, or NULL when the graph lacks it. */
regc_input *regc_input_find(int n, regc_input *in, const char *name);
/* Fill every input of m's training graph for one batch: token ids and
 * targets from `data`, plus the architecture's own inputs (positions,
 * rotary tables, relative-position buckets, masked positions). Constant
 * inputs filled by an earlier call are kept. An input the architecture
 * does not know is an error naming it. */
int regc_model_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                           int n, regc_input *in);

/* ======================================================================
 * NF4 (models/nf4.c): QLoRA's 4-bit frozen weights in kernels/nf4_format.h's
 * blob, byte for byte as bitsandbytes 0.50.2 quantises on the CPU, so a
 * base regc quantises holds the bytes a bitsandbytes checkpoint would.
 * ====================================================================== */
/* n values (row-major, flattened) into blob (regc_nf4_layout(n).bytes
 * bytes): quantize_4bit(x, blocksize=64, compress_statistics=True,
 * quant_type="nf4") with torch on one thread. A NaN or infinite value is an
 * error naming its index. */
int regc_nf4_quantize(const float *x, int64_t n, uint8_t *blob);
/* The same with torch's mean of the absmaxes (the blob's offset) taken as
 * on `threads` intra-op threads (torch.get_num_threads()): its summation
 * order depends on them past 32768 blocks (2,097,152 values). */
int regc_nf4_quantize_threads(const float *x, int64_t n, int threads, uint8_t *blob);
/* The n values a blob holds, in fp32: dequantize_4bit's bits. */
void regc_nf4_dequantize(const uint8_t *blob, int64_t n, float *out);
/* Values [first, first + count) of the blob's n, into out[0 .. count). */
void regc_nf4_dequantize_range(const uint8_t *blob, int64_t n, int64_t first, int64_t count,
                               float *out);
/* 0 when a checkpoint's quant_map (16 floats) and nested_quant_map (256)
 * are regc's NF4 and dynamic tables bit for bit, else an error naming the
 * first entry that differs (the blob means nothing under other tables). */
int regc_nf4_check_tables(const float *quant_map16, const float *nested_map256);

#endif
