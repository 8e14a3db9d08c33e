/* model_internal.h — what model.c (generic: parameters, weights, files)
 * shares with one file per architecture (gpt2.c, llama.c, ...).
 *
 * An architecture is a small vtable: it turns config.json (or a preset
 * name) into its own config struct, lists its parameters in checkpoint
 * order, builds the flat forward graph and writes config.json back.
 * Everything that does not depend on the architecture — the weights
 * block, saving, random init — lives in model.c, and reading and writing
 * weights by name in weights.c, so a new architecture is one new file plus one table entry. */
#ifndef REGC_MODEL_INTERNAL_H
#define REGC_MODEL_INTERNAL_H

#include <cjson/cJSON.h>

#include "regc_common.h"
#include "regc_models.h"

typedef struct {
    char *name; /* the checkpoint name, e.g. "transformer.h.0.ln_1.weight" */
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
    int64_t numel, offset; /* offset in floats into the weights block */
    /* regc_model_init_random draws uniform on [center - halfwidth, center + halfwidth) */
    float init_center, init_halfwidth;
    /* never trained (regc_tensor's `frozen`): a LoRA model's base, 1 held in
     * fp32, REGC_FROZEN_BF16 in bf16; at byte frozen_at of the frozen block */
    int frozen;
    int64_t frozen_at;
} regc_model_param;

/* A model's LoRA adapters (lora.c): parameters n_base, n_base + 1 are
 * module 0's A and B, and so on. */
typedef struct {
    regc_lora_config cfg; /* its strings are targets and adapter */
    char *targets, *adapter;
    int n_base;    /* the parameters before the adapters */
    int n_modules; /* the layers adapted */
    int *base_of;  /* [n_modules] the parameter index of each one's weight */
    char *conv1d;  /* [n_modules] its weight is [in, out] (GPT-2's Conv1D), else [out, in] */
    float scale;   /* alpha / r, or alpha / sqrt r */
} regc_lora;
void regc_lora_free(regc_lora *l);
/* What PEFT's adapter files put before a parameter's name. */
#define REGC_PEFT_PREFIX "base_model.model."
/* g with every targeted product's adapter added (lora.c's header). */
int regc_lora_rewrite(const regc_model *m, regc_graph *g, regc_graph **out);
/* adapter_config.json in dir, as PEFT writes it, atomically. */
int regc_lora_save_config(const regc_model *m, const char *dir);
/* The adapters' part of the model's structure key. */
int regc_lora_write_structure(const regc_model *m, regc_bytes *b);

/* A constant input of a graph model (regc_tensor's `constant`): read from
 * the weights file by name beside the parameters, never trained, written
 * back when the model is saved. Architectures compute theirs instead
 * (fill_inputs) and list none. */
typedef struct {
    char *name;
    regc_dtype dtype; /* REGC_F32 or REGC_I32 */
    int ndim;
    int64_t shape[REGC_MAX_DIMS];
    int64_t numel;
    void *data; /* numel values of dtype once read (regc_model_read_constants), else NULL */
} regc_model_const;

typedef struct regc_arch regc_arch;

struct regc_model {
    const regc_arch *arch;
    void *cfg;    /* the architecture's own config struct */
    char *source; /* the preset name or directory, for messages */
    int64_t vocab, max_seq;
    int n_params, cap_params;
    regc_model_param *params;
    int64_t total_numel;
    float *weights; /* total_numel floats, or NULL while shape-only */
    int n_consts;
    regc_model_const *consts;
    /* the file the constants are read from when it is not the weights'
     * (a graph exported beside the user's own checkpoint names one); NULL:
     * every source of the weights holds them too */
    char *consts_file;
    regc_lora *lora; /* NULL: every parameter is trained */
    int dropout;     /* the graph applies the model's dropouts (train.dropout) */
    /* train.eod_token_id: documents end after each token eod, and a causal
     * attention sees none before its own (the "doc_start" input); with
     * reset_positions the learned positions count from each document's
     * start ("position_ids" [B, T]), with mask_eod the target read at an
     * eod token does not count */
    int documents;
    int32_t eod;
    int reset_positions, mask_eod;
    int64_t frozen_bytes; /* the frozen block's bytes */
    /* config.json's quantization_config: the checkpoint holds the linear
     * layers in NF4 (nf4_checkpoint.c), as REGC_FROZEN_NF4 (_BF16: its
     * compute dtype bfloat16); 0 when it is not quantised */
    int checkpoint_nf4;
    /* config.json's inert keys (regc_config_key), written back on save
     * beside the architecture's own; NULL when none */
    cJSON *inert_keys;
};

struct regc_arch {
    const char *model_type; /* config.json's "model_type" */
    /* Optional: the description of the layer a shared builder reads
     * (decoder.h's decoder_family: the Llama lineage's, GPT-2's) */
    const void *family;
    /* The tables of config.json's keys beside the shared one
     * (regc_model_config_keys), NULL-terminated; NULL: not checked. */
    const regc_config_key *const *config_keys;
    /* PEFT's default LoRA target_modules, comma-separated; NULL: none */
    const char *peft_targets;
    /* Checkpoints may omit this prefix of the parameter names (the original
     * OpenAI GPT-2 files say "h.0.ln_1.weight"); NULL when none. */
    const char *optional_prefix;
    /* Optional: an older spelling of parameter `name` to look for when a
     * checkpoint lacks it (BERT's LayerNorm.gamma for LayerNorm.weight);
     * writes it to buf and returns 1, or returns 0 when there is none. */
    int (*legacy_name)(const char *name, char *buf, size_t cap);
    /* Optional: tensors a checkpoint of this architecture may hold that
     * regc never reads (Transformers ignores the same names when it loads
     * the model): an exact name, or "*" and a suffix; NULL-terminated. Any
     * other tensor no parameter claims is refused. */
    const char *const *ignored_tensors;
    /* Fill m->cfg, m->vocab and m->max_seq from a preset or from config.json
     * (`path` names the file in messages). */
    int (*preset_config)(regc_model *m, const char *preset);
    int (*parse_config)(regc_model *m, const cJSON *root, const char *path);
    void (*free_config)(void *cfg); /* NULL: free(cfg) */
    /* Call regc_model_add_param once per parameter, in checkpoint order. */
    int (*list_params)(regc_model *m);
    int (*build_graph)(const regc_model *m, int64_t batch, int64_t seq, regc_graph **out);
    /* A new config.json object (caller deletes), or NULL when out of memory. */
    cJSON *(*write_config)(const regc_model *m);
    void (*describe)(const regc_model *m, char *buf, size_t cap);
    /* Optional: what build_graph builds from, as canonical bytes for the
     * compile cache's keys (parameter names left out); when NULL, the
     * config written by write_config. */
    int (*write_structure)(const regc_model *m, regc_bytes *b);
    /* Optional: write the files that describe the model (other than
     * model.safetensors) into dir; when set, it replaces config.json. */
    int (*save_files)(const regc_model *m, const char *dir);
    /* Optional: fill the training graph's inputs for one batch; when NULL,
     * regc_model_fill_lm_inputs (a causal language model's inputs). */
    int (*fill_inputs)(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                       int n, regc_input *in);
    /* Set when fill_inputs draws the data inputs its own way (masked
     * positions, encoder-decoder pairs) rather than as a causal LM's: a
     * graph model, which fills them as a causal LM's, cannot stand in for
     * it (regc_model_as_graph refuses it). */
    int own_data;
    /* Optional: check the constants' values once read (a graph model's
     * indices within the tables they index). */
    int (*check_constants)(const regc_model *m);
    /* Optional: the rotary embedding's inverse frequencies and the factor
     * on cos and sin, as regc_model_compute_rope (n checked there). */
    int64_t (*compute_rope)(const regc_model *m, int64_t seq, float *inv_freq, int64_t n,
                            float *scaling);
};

extern const regc_arch regc_arch_gpt2;
extern const regc_arch regc_arch_llama;
extern const regc_arch regc_arch_mistral;
extern const regc_arch regc_arch_qwen2;
extern const regc_arch regc_arch_qwen3;
extern const regc_arch regc_arch_olmo2;
extern const regc_arch regc_arch_phi3;
extern const regc_arch regc_arch_gemma2;
extern const regc_arch regc_arch_gemma3;
extern const regc_arch regc_arch_smollm3;
extern const regc_arch regc_arch_phi;
extern const regc_arch regc_arch_gpt_neox;
extern const regc_arch regc_arch_stablelm;
extern const regc_arch regc_arch_granite;
extern const regc_arch regc_arch_t5;
extern const regc_arch regc_arch_bert;
/* Models read from a regc graph JSON file (graph_model.c); not in the
 * config.json dispatch: they have no config.json. */
extern const regc_arch regc_arch_graph;
/* Read the graph JSON at path into m (made with arch regc_arch_graph): sets
 * m->cfg, vocab, max_seq and the parameters. */
int regc_graph_model_read(regc_model *m, const char *path);
/* The same for the file's text (NUL-terminated); `path` names it in
 * messages. */
int regc_graph_model_parse(regc_model *m, const char *text, const char *path);
/* Whether a graph model may train with documents on (train.eod_token_id)
 * or off: a causal attention to keep within them, no decoder; a graph
 * whose attention reads doc_start already needs them on. */
int regc_graph_model_check_documents(const regc_model *m, int on);
/* The one batch and sequence a graph model's graph is built for. */
void regc_graph_model_shape(const regc_model *m, int64_t *batch, int64_t *seq);

/* A model from the text of a config.json (len bytes), shapes only: `path`
 * names the file in messages, `dir` the model (its source). */
int regc_model_config_parse(const char *text, size_t len, const char *path, const char *dir,
                            regc_model **out);

/* A new model of arch with no parameters yet; source names it in messages. */
int regc_model_new(const regc_arch *arch, const char *source, regc_model **out);
/* Write the files that describe m (config.json, or the architecture's
 * save_files) into dir, atomically: the part of a saved directory that is
 * not its weights. */
int regc_model_save_config(const regc_model *m, const char *dir);

/* Append a parameter: numel and offset are computed, overflow checked. */
int regc_model_add_param(regc_model *m, const char *name, int ndim, const int64_t *shape,
                         float init_center, float init_halfwidth);
/* Append a constant (f32 or i32) without values yet. */
int regc_model_add_const(regc_model *m, const char *name, regc_dtype dtype, int ndim,
                         const int64_t *shape);
/* The same for the 1-D ([d0]) and 2-D ([d0, d1]) parameters of frontends. */
int regc_model_add_2d(regc_model *m, const char *name, int ndim, int64_t d0, int64_t d1,
                      float init_center, float init_halfwidth);

/* Check the text (len bytes) of a model.safetensors.index.json against m:
 * files[i] (n_params entries, then one per constant without a prefix; each
 * malloc'd, NULL on failure) gets the
 * file the weight_map names for parameter i (under prefix); an entry that
 * names a file outside the directory, or a tensor m has no parameter for,
 * is an error naming `index` and the tensor. */
int regc_weights_parse_index(const regc_model *m, const char *text, size_t len, const char *index,
                             const char *prefix, char **files);

/* Does a file name stay inside the directory it is relative to (no
 * absolute path, no ".." segment)? An index's shards and a graph's
 * constants file must. */
int regc_model_inside_name(const char *name);

/* ---- a checkpoint saved from a model in 4 bits (nf4_checkpoint.c) */
/* m->checkpoint_nf4 from config.json's quantization_config: an error
 * naming `path` and the key for one regc cannot honour. */
int regc_nf4_read_quantization_config(regc_model *m, const cJSON *root, const char *path);
/* A quantised weight's tensors in its file: the packed values, then its
 * quant state's (absmax, nested_absmax, quant_map, nested_quant_map, the
 * JSON), and the offset the JSON gives. */
#define REGC_NF4_EXTRA 5
typedef struct {
    int weight;
    int extra[REGC_NF4_EXTRA];
    float offset;
} regc_nf4_tensors;
/* Tensor t of f (at path) is parameter p's weight in NF4: find and check
 * its quant state (each missing tensor, wrong table, block size or shape
 * an error naming the file and the tensor) into *q. compute_bf16: its
 * products are bf16 GEMMs (a bfloat16 state dtype is then allowed). */
int regc_nf4_bind(const regc_st_file *f, const char *path, int t, const regc_model_param *p,
                  int compute_bf16, regc_nf4_tensors *q);
/* The blob (regc_nf4_layout(n).bytes) of a bound weight of n values. */
int regc_nf4_read_blob(const regc_st_file *f, const regc_nf4_tensors *q, int64_t n, uint8_t *blob);
/* The length of `name` without a quant-state suffix (".absmax", ...), or 0
 * when it has none. */
size_t regc_nf4_state_base(const char *name);

/* 124439808 -> "124,439,808" in buf: parameter counts are read by people. */
void regc_model_group_digits(char *buf, size_t cap, int64_t v);

/* Add one f32 parameter tensor per model parameter to g, named and shaped
 * as the parameter; *ids (malloc'd, the caller frees it, also on failure)
 * gets their tensor ids in parameter order. */
int regc_model_add_param_tensors(const regc_model *m, regc_graph *g, int **ids);

/* ---- dropout (train.dropout): DROPOUT nodes keyed by site */
/* x dropped with probability p (out: the result), at the site named after
 * tensor `site` (a constant input "dropout.site.<site>" whose value is
 * site; every site of a graph is another tensor), drawn from the graph's
 * "dropout.draw" input; x itself when m trains without dropout or p is 0. */
int regc_model_dropout(const regc_model *m, regc_graph *g, int x, int site, double p, int *out);
/* *out = ATTENTION of a over q, k, v with a score bias (-1: none), its
 * probabilities dropped with p when m trains with dropout (the site is q's
 * id); a->value is ignored. */
int regc_model_attention(const regc_model *m, regc_graph *g, int q, int k, int v, int bias,
                         const regc_attrs *a, double p, int *out);
/* "(applied)" or "(not applied: train.dropout off)", for descriptions. */
const char *regc_model_dropout_note(const regc_model *m);

/* ---- graph inputs (regc_model_fill_inputs) */
/* A causal LM's inputs, each where the graph has it: "input_ids" and
 * "targets" [B, T] from regc_tokens_rows, "position_ids" [T] = 0..T-1
 * (under reset_position_ids, [B, T] from each document's start: the
 * documents' fill, in model.c). */
int regc_model_fill_lm_inputs(const regc_model *m, const regc_tokens *data,
                              const regc_batch_spec *b, int n, regc_input *in);

/* A new config.json object holding "architectures": [architecture] and
 * m's "model_type", for write_config to add its keys to; NULL when out of
 * memory. */
cJSON *regc_model_config_new(const regc_model *m, const char *architecture);

/* ---- rotary position embeddings as Transformers configures them (rope.c) */
enum {
    REGC_ROPE_DEFAULT,
    REGC_ROPE_LINEAR,
    REGC_ROPE_LLAMA3,
    REGC_ROPE_YARN,
    REGC_ROPE_DYNAMIC,
    REGC_ROPE_LONGROPE
};
#define REGC_ROPE_MAX_FACTORS 512 /* longrope's per-frequency factors: head_dim / 2 */
typedef struct {
    int type;        /* REGC_ROPE_* */
    double theta;    /* rope_theta */
    double factor;   /* linear, llama3, yarn, dynamic, longrope (yarn's, longrope's derived) */
    int64_t max_pos; /* max_position_embeddings */
    double low_freq_factor, high_freq_factor; /* llama3 */
    int64_t original_max_pos;                 /* llama3, yarn, longrope */
    double attention_factor;       /* yarn, longrope: 0 when derived from factor (and mscale) */
    double beta_fast, beta_slow;   /* yarn, defaults applied */
    double mscale, mscale_all_dim; /* yarn: 0 when absent */
    int truncate;                  /* yarn */
    int n_factors;                 /* longrope: the length of both lists */
    double partial;  /* partial_rotary_factor: the share of a head rotated (1, or 0: all) */
    int partial_key; /* the family reads partial_rotary_factor (its writer writes it back) */
    const char *partial_name; /* the key that gave the share, for messages; NULL: the default */
    const char *dict; /* the dictionary read ("rope_parameters", "rope_scaling"), for messages */
    double long_factor[REGC_ROPE_MAX_FACTORS], short_factor[REGC_ROPE_MAX_FACTORS];
} regc_rope;
/* Read rope_parameters, or rope_scaling and rope_theta, from config.json
 * (`path` in messages; max_pos is max_position_embeddings; theta the
 * architecture's rope_theta where the file gives none; partial its
 * partial_rotary_factor, or 0 where it rotates the whole head and refuses
 * the key): refuses by name every type and key regc does not apply. */
int regc_rope_parse(const cJSON *root, const char *path, int64_t max_pos, double theta,
                    double partial, regc_rope *r);
/* The dimensions of a head of head_dim that r rotates, as Transformers
 * takes them: int(head_dim * partial_rotary_factor). */
int64_t regc_rope_dim(const regc_rope *r, int64_t head_dim);
/* The same as Phi3Config reads it: "su" and "yarn" mean longrope, only
 * default and longrope are taken, and the top-level
 * original_max_position_embeddings (default 4096) is longrope's; partial
 * as regc_rope_parse's (Phi-4-mini rotates 0.75 of each head). */
int regc_rope_parse_phi3(const cJSON *root, const char *path, int64_t max_pos, double partial,
                         regc_rope *r);
/* REGC_OK when r rotates an even, nonzero part of a head of head_dim and
 * its per-frequency lists fit that part, else an error naming `path` and
 * the keys. */
int regc_rope_check_head(const regc_rope *r, int64_t head_dim, const char *path);
/* inv_freq[dim / 2] for the dim dimensions rotated (regc_rope_dim's)
 * and the factor on cos and sin, as Transformers' initialisers compute
 * them in float32, for a model trained on sequences of seq tokens (0: as
 * initialised; dynamic and longrope compute them again when positions
 * reach past max_position_embeddings or the original length, as
 * Transformers' forward does). */
void regc_rope_inv_freq(const regc_rope *r, int64_t dim, int64_t seq, float *inv_freq,
                        float *attention_scaling);
/* Add rope_theta and rope_scaling (null for the default type) to a
 * config.json object; 0 when out of memory. */
int regc_rope_write_config(const regc_rope *r, cJSON *o);
/* ", rope_type ..." for a scaled type, "" for the default. */
void regc_rope_describe(const regc_rope *r, char *buf, size_t cap);

/* ---- config.json readers for architectures. Each returns REGC_OK with
 * *out set (the default when the key is absent or null and required is 0),
 * or an error naming `path` and the key. Integers must be integral numbers
 * within [lo, hi]. */
int regc_cfg_int(const cJSON *root, const char *path, const char *key, int required, int64_t dflt,
                 int64_t lo, int64_t hi, int64_t *out);
int regc_cfg_double(const cJSON *root, const char *path, const char *key, int required, double dflt,
                    double lo, double hi, double *out);
/* A dropout probability: dflt when absent, else a number in [0, 1) (a
 * dropout of 1 would zero everything; no kernel scales by 1 / 0). */
int regc_cfg_dropout(const cJSON *root, const char *path, const char *key, double dflt,
                     double *out);
/* pad_token_id as Transformers makes it the embedding's padding_idx (the
 * row that takes no gradient from the lookup): dflt when absent (-1:
 * none), none when null, a negative id counted from the end as torch
 * counts it; *pad in [0, vocab), or -1 for none. */
int regc_cfg_pad_token(const cJSON *root, const char *path, int64_t dflt, int64_t vocab,
                       int64_t *pad);
int regc_cfg_bool(const cJSON *root, const char *path, const char *key, int required, int dflt,
                  int *out);
/* *out points into root (valid while root lives), or to dflt. */
int regc_cfg_string(const cJSON *root, const char *path, const char *key, int required,
                    const char *dflt, const char **out);

#endif
