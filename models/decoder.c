/* decoder.c — the decoder-only families of Hugging Face Transformers that
 * share Llama's layer (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, Olmo2ForCausalLM, Phi3ForCausalLM,
 * Gemma2ForCausalLM, Gemma3ForCausalLM, GraniteForCausalLM,
 * SmolLM3ForCausalLM) or vary it (PhiForCausalLM: attention and a plain
 * MLP in parallel from one LayerNorm, RoPE on part of each head, a head
 * with a bias; GPTNeoXForCausalLM: the same side by side from two
 * LayerNorms, q, k and v fused head by head; StableLmForCausalLM: Llama's
 * layer with LayerNorms and part of each head rotated, side by side or
 * not): one description of the layer (decoder.h's
 * decoder_family) whose variations a family fixes or
 * config.json chooses, the table of each family's config.json keys, its
 * parameters in checkpoint order (any family's, GPT-2's included, by its
 * names), and the presets. decoder_config.c reads and writes config.json,
 * decoder_graph.c builds the graph.
 *
 * Sliding windows. Transformers masks key j from query i when
 * i - j >= sliding_window on a sliding layer; regc's attention takes the
 * same window per layer, so every family's windows train as written. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

static const char *const llama_slot_suffix[N_SLOTS] = {
    [S_Q] = "self_attn.q_proj.weight",
    [S_Q_BIAS] = "self_attn.q_proj.bias",
    [S_K] = "self_attn.k_proj.weight",
    [S_K_BIAS] = "self_attn.k_proj.bias",
    [S_V] = "self_attn.v_proj.weight",
    [S_V_BIAS] = "self_attn.v_proj.bias",
    [S_QKV] = "self_attn.qkv_proj.weight",
    [S_O] = "self_attn.o_proj.weight",
    [S_O_BIAS] = "self_attn.o_proj.bias",
    [S_Q_NORM] = "self_attn.q_norm.weight",
    [S_K_NORM] = "self_attn.k_norm.weight",
    [S_GATE] = "mlp.gate_proj.weight",
    [S_GATE_BIAS] = "mlp.gate_proj.bias",
    [S_UP] = "mlp.up_proj.weight",
    [S_UP_BIAS] = "mlp.up_proj.bias",
    [S_GATE_UP] = "mlp.gate_up_proj.weight",
    [S_DOWN] = "mlp.down_proj.weight",
    [S_DOWN_BIAS] = "mlp.down_proj.bias",
    [S_INPUT_NORM] = "input_layernorm.weight",
    [S_INPUT_NORM_BIAS] = "input_layernorm.bias", /* StableLM's LayerNorms */
    [S_POST_ATTN_NORM] = "post_attention_layernorm.weight",
    [S_POST_ATTN_NORM_BIAS] = "post_attention_layernorm.bias",
    [S_PRE_FF_NORM] = "pre_feedforward_layernorm.weight",
    [S_POST_FF_NORM] = "post_feedforward_layernorm.weight",
};

static const decoder_names llama_names = {.embed = "model.embed_tokens.weight",
                                          .layer = "model.layers.%" PRId64 ".",
                                          .norm = "model.norm.weight",
                                          .slot_suffix = llama_slot_suffix};

/* Phi's names (PhiForCausalLM; Phi-1, Phi-1.5, Phi-2) */
static const char *const phi_slot_suffix[N_SLOTS] = {
    [S_Q] = "self_attn.q_proj.weight",
    [S_Q_BIAS] = "self_attn.q_proj.bias",
    [S_K] = "self_attn.k_proj.weight",
    [S_K_BIAS] = "self_attn.k_proj.bias",
    [S_V] = "self_attn.v_proj.weight",
    [S_V_BIAS] = "self_attn.v_proj.bias",
    [S_O] = "self_attn.dense.weight",
    [S_O_BIAS] = "self_attn.dense.bias",
    [S_Q_NORM] = "self_attn.q_layernorm.weight",
    [S_Q_NORM_BIAS] = "self_attn.q_layernorm.bias",
    [S_K_NORM] = "self_attn.k_layernorm.weight",
    [S_K_NORM_BIAS] = "self_attn.k_layernorm.bias",
    [S_UP] = "mlp.fc1.weight",
    [S_UP_BIAS] = "mlp.fc1.bias",
    [S_DOWN] = "mlp.fc2.weight",
    [S_DOWN_BIAS] = "mlp.fc2.bias",
    [S_INPUT_NORM] = "input_layernorm.weight",
    [S_INPUT_NORM_BIAS] = "input_layernorm.bias",
};

static const decoder_names phi_names = {.embed = "model.embed_tokens.weight",
                                        .layer = "model.layers.%" PRId64 ".",
                                        .norm = "model.final_layernorm.weight",
                                        .norm_bias = "model.final_layernorm.bias",
                                        .head_bias = "lm_head.bias",
                                        .slot_suffix = phi_slot_suffix};

/* StableLM's: Llama's, its final LayerNorm's bias too */
static const decoder_names stablelm_names = {.embed = "model.embed_tokens.weight",
                                             .layer = "model.layers.%" PRId64 ".",
                                             .norm = "model.norm.weight",
                                             .norm_bias = "model.norm.bias",
                                             .slot_suffix = llama_slot_suffix};

/* GPT-NeoX's names (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B); its head is
 * saved as embed_out, the name Transformers 5 gives it in memory
 * (lm_head) read too (gpt_neox_legacy_name) */
static const char *const gpt_neox_slot_suffix[N_SLOTS] = {
    [S_INPUT_NORM] = "input_layernorm.weight",
    [S_INPUT_NORM_BIAS] = "input_layernorm.bias",
    [S_POST_ATTN_NORM] = "post_attention_layernorm.weight",
    [S_POST_ATTN_NORM_BIAS] = "post_attention_layernorm.bias",
    [S_QKV] = "attention.query_key_value.weight",
    [S_QKV_BIAS] = "attention.query_key_value.bias",
    [S_O] = "attention.dense.weight",
    [S_O_BIAS] = "attention.dense.bias",
    [S_UP] = "mlp.dense_h_to_4h.weight",
    [S_UP_BIAS] = "mlp.dense_h_to_4h.bias",
    [S_DOWN] = "mlp.dense_4h_to_h.weight",
    [S_DOWN_BIAS] = "mlp.dense_4h_to_h.bias",
};

static const decoder_names gpt_neox_names = {.embed = "gpt_neox.embed_in.weight",
                                             .layer = "gpt_neox.layers.%" PRId64 ".",
                                             .norm = "gpt_neox.final_layer_norm.weight",
                                             .norm_bias = "gpt_neox.final_layer_norm.bias",
                                             .head = "embed_out.weight",
                                             .slot_suffix = gpt_neox_slot_suffix};

/* The families' layers, each a list of slots in its checkpoint order. */
#define SLOTS_ATTENTION S_Q, S_Q_BIAS, S_K, S_K_BIAS, S_V, S_V_BIAS, S_O, S_O_BIAS
#define SLOTS_MLP S_GATE, S_GATE_BIAS, S_UP, S_UP_BIAS, S_DOWN, S_DOWN_BIAS
static const int slots_llama[] = {SLOTS_ATTENTION, S_Q_NORM,         S_K_NORM, SLOTS_MLP,
                                  S_INPUT_NORM,    S_POST_ATTN_NORM, -1};
static const int slots_olmo2[] = {SLOTS_ATTENTION,  S_Q_NORM,       S_K_NORM, SLOTS_MLP,
                                  S_POST_ATTN_NORM, S_POST_FF_NORM, -1};
static const int slots_gemma[] = {SLOTS_ATTENTION, S_Q_NORM,       S_K_NORM,
                                  SLOTS_MLP,       S_INPUT_NORM,   S_POST_ATTN_NORM,
                                  S_PRE_FF_NORM,   S_POST_FF_NORM, -1};
static const int slots_phi[] = {SLOTS_ATTENTION, S_Q_NORM,     S_Q_NORM_BIAS,     S_K_NORM,
                                S_K_NORM_BIAS,   S_UP,         S_UP_BIAS,         S_DOWN,
                                S_DOWN_BIAS,     S_INPUT_NORM, S_INPUT_NORM_BIAS, -1};
static const int slots_gpt_neox[] = {S_INPUT_NORM,
                                     S_INPUT_NORM_BIAS,
                                     S_POST_ATTN_NORM,
                                     S_POST_ATTN_NORM_BIAS,
                                     S_QKV,
                                     S_QKV_BIAS,
                                     S_O,
                                     S_O_BIAS,
                                     S_UP,
                                     S_UP_BIAS,
                                     S_DOWN,
                                     S_DOWN_BIAS,
                                     -1};
static const int slots_stablelm[] = {S_Q,
                                     S_Q_BIAS,
                                     S_K,
                                     S_K_BIAS,
                                     S_V,
                                     S_V_BIAS,
                                     S_O,
                                     S_GATE,
                                     S_UP,
                                     S_DOWN,
                                     S_INPUT_NORM,
                                     S_INPUT_NORM_BIAS,
                                     S_POST_ATTN_NORM,
                                     S_POST_ATTN_NORM_BIAS,
                                     -1};
/* Phi3Attention defines o_proj before qkv_proj */
static const int slots_phi3[] = {S_O, S_QKV, S_GATE_UP, S_DOWN, S_INPUT_NORM, S_POST_ATTN_NORM, -1};

static const decoder_family family_llama = {.architecture = "LlamaForCausalLM",
                                            .slots = slots_llama,
                                            .bias_key = 1,
                                            .mlp_bias_key = 1,
                                            .act_key = "hidden_act",
                                            .pad_default = -1};
static const decoder_family family_mistral = {.architecture = "MistralForCausalLM",
                                              .slots = slots_llama,
                                              .act_key = "hidden_act",
                                              .window = WINDOW_ALL,
                                              .pad_default = -1,
                                              .n_pos_default = 131072};
static const decoder_family family_qwen2 = {.architecture = "Qwen2ForCausalLM",
                                            .slots = slots_llama,
                                            .qkv_bias = 1,
                                            .act_key = "hidden_act",
                                            .window = WINDOW_LAYERS,
                                            .pad_default = -1,
                                            .n_pos_default = 32768};
static const decoder_family family_qwen3 = {.architecture = "Qwen3ForCausalLM",
                                            .slots = slots_llama,
                                            .qk_norm = QK_NORM_HEAD,
                                            .bias_key = 1,
                                            .act_key = "hidden_act",
                                            .window = WINDOW_LAYERS,
                                            .pad_default = -1,
                                            .n_pos_default = 32768};
static const decoder_family family_olmo2 = {.architecture = "Olmo2ForCausalLM",
                                            .slots = slots_olmo2,
                                            .qk_norm = QK_NORM_WHOLE,
                                            .norms = NORMS_AFTER,
                                            .bias_key = 1,
                                            .act_key = "hidden_act",
                                            .pad_default = 1};
static const decoder_family family_phi3 = {.architecture = "Phi3ForCausalLM",
                                           .slots = slots_phi3,
                                           .fused = 1,
                                           .resid_dropout_key = "resid_pdrop",
                                           .phi3_rope = 1,
                                           .partial_default = 1.0, /* Phi-4-mini's 0.75 */
                                           .act_key = "hidden_act",
                                           .window = WINDOW_ALL,
                                           .pad_default = 32000,
                                           .n_pos_default = 4096};
static const decoder_family family_gemma2 = {.architecture = "Gemma2ForCausalLM",
                                             .slots = slots_gemma,
                                             .norms = NORMS_BOTH,
                                             .norm_offset = 1,
                                             .embed_scale = 1,
                                             .bias_key = 1,
                                             .gemma = 2,
                                             .act_key = "hidden_activation",
                                             .act_default = ACT_GELU_TANH,
                                             .window = WINDOW_GEMMA,
                                             .window_pattern = 2,
                                             .pad_default = 0,
                                             .n_pos_default = 8192,
                                             .tied_default = 1};
static const decoder_family family_gemma3 = {.architecture = "Gemma3ForCausalLM",
                                             .slots = slots_gemma,
                                             .qk_norm = QK_NORM_HEAD,
                                             .norms = NORMS_BOTH,
                                             .norm_offset = 1,
                                             .embed_scale = 1,
                                             .bias_key = 1,
                                             .gemma = 3,
                                             .local_rope = 1,
                                             .act_key = "hidden_activation",
                                             .act_default = ACT_GELU_TANH,
                                             .window = WINDOW_GEMMA,
                                             .window_pattern = 6,
                                             .pad_default = 0,
                                             .n_pos_default = 131072,
                                             .tied_default = 1};

/* Llama's layer, scaled at four places by config.json's multipliers */
static const decoder_family family_granite = {.architecture = "GraniteForCausalLM",
                                              .slots = slots_llama,
                                              .bias_key = 1,
                                              .mlp_bias_key = 1,
                                              .granite = 1,
                                              .act_key = "hidden_act",
                                              .pad_default = -1};

/* Llama's layer, with RoPE left out of every no_rope_layer_interval-th
 * layer (those may slide); by default a tied head, pad id 128004, 32768
 * positions and RoPE at 2,000,000 */
static const decoder_family family_smollm3 = {.architecture = "SmolLM3ForCausalLM",
                                              .slots = slots_llama,
                                              .bias_key = 1,
                                              .mlp_bias_key = 1,
                                              .nope = 1,
                                              .act_key = "hidden_act",
                                              .window = WINDOW_NOPE,
                                              .pad_default = 128004,
                                              .n_pos_default = 32768,
                                              .theta_default = 2000000.0,
                                              .tied_default = 1};

/* Attention and a plain MLP side by side from one LayerNorm, every
 * projection and the head with a bias, RoPE on the first
 * partial_rotary_factor (0.5) of each head, optional per-head q/k
 * LayerNorms; gelu_new, an untied head and 2048 positions by default */
static const decoder_family family_phi = {.architecture = "PhiForCausalLM",
                                          .slots = slots_phi,
                                          .names = &phi_names,
                                          .layernorm = 1,
                                          .plain_mlp = 1,
                                          .parallel = PARALLEL_ONE_NORM,
                                          .head_bias = 1,
                                          .bias_default = 1,
                                          .mlp_bias_default = 1,
                                          .resid_dropout_key = "resid_pdrop",
                                          .embed_dropout_key = "embd_pdrop",
                                          .qk_norm_key = "qk_layernorm",
                                          .partial_default = 0.5,
                                          .eps_key = "layer_norm_eps",
                                          .act_key = "hidden_act",
                                          .act_default = ACT_GELU_TANH,
                                          .pad_default = -1};

/* Attention and a plain MLP side by side, each from its own LayerNorm
 * (use_parallel_residual, by default; else one after the other), q, k
 * and v in one projection head by head, biases (attention_bias, by
 * default) and the MLP's always, RoPE on the first rotary_pct (0.25) of
 * each head at rotary_emb_base, hidden_dropout on the embeddings and both
 * blocks; the exact GELU, an untied head and 2048 positions by default;
 * no padding index */
static const decoder_family family_gpt_neox = {.architecture = "GPTNeoXForCausalLM",
                                               .slots = slots_gpt_neox,
                                               .names = &gpt_neox_names,
                                               .layernorm = 1,
                                               .plain_mlp = 1,
                                               .fused = 1,
                                               .qkv_per_head = 1,
                                               .no_head_dim = 1,
                                               .no_kv_heads = 1,
                                               .parallel = PARALLEL_TWO_NORMS,
                                               .parallel_key = "use_parallel_residual",
                                               .parallel_default = 1,
                                               .bias_key = 1,
                                               .bias_default = 1,
                                               .mlp_bias_default = 1,
                                               .resid_dropout_key = "hidden_dropout",
                                               .embed_dropout_key = "hidden_dropout",
                                               .theta_key = "rotary_emb_base",
                                               .partial_key = "rotary_pct",
                                               .partial_default = 0.25,
                                               .eps_key = "layer_norm_eps",
                                               .act_key = "hidden_act",
                                               .act_default = ACT_GELU,
                                               .pad_unused = 1,
                                               .pad_default = -1};

/* Llama's layer with LayerNorms (biases too), q/k/v biases as
 * use_qkv_bias says, RoPE on the first partial_rotary_factor (0.25) of
 * each head, hidden_dropout after the MLP alone; side by side from one
 * LayerNorm, summed (x + a) + m, as use_parallel_residual says (not by
 * default); 4096 positions by default */
static const decoder_family family_stablelm = {.architecture = "StableLmForCausalLM",
                                               .slots = slots_stablelm,
                                               .names = &stablelm_names,
                                               .layernorm = 1,
                                               .parallel = PARALLEL_ONE_NORM,
                                               .parallel_key = "use_parallel_residual",
                                               .residual_first = 1,
                                               .no_head_dim = 1,
                                               .qkv_bias_key = "use_qkv_bias",
                                               .resid_dropout_key = "hidden_dropout",
                                               .mlp_dropout_only = 1,
                                               .partial_default = 0.25,
                                               .eps_key = "layer_norm_eps",
                                               .act_key = "hidden_act",
                                               .pad_default = -1,
                                               .kv_heads_default = 32, /* Transformers' */
                                               .n_pos_default = 4096};

/* ---- config.json's keys (model_load.c checks every key against these
 * tables and those every architecture shares before parse_config) */
static const regc_config_key keys_decoder[] = {
    {"vocab_size", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_size", REGC_KEY_APPLIED, NULL, NULL},
    {"intermediate_size", REGC_KEY_APPLIED, NULL, NULL},
    {"num_hidden_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"num_attention_heads", REGC_KEY_APPLIED, NULL, NULL},
    {"num_key_value_heads", REGC_KEY_APPLIED, NULL, NULL},
    {"head_dim", REGC_KEY_APPLIED, NULL, NULL},
    {"max_position_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"rms_norm_eps", REGC_KEY_APPLIED, NULL, NULL},
    {"rope_parameters", REGC_KEY_APPLIED, NULL, NULL},
    {"rope_theta", REGC_KEY_APPLIED, NULL, NULL},
    {"rope_scaling", REGC_KEY_APPLIED, NULL, NULL},
    {"partial_rotary_factor", REGC_KEY_APPLIED, NULL, NULL}, /* rope.c: 1 or refused */
    {"tie_word_embeddings", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_act", REGC_KEY_APPLIED, NULL, NULL},
    {"attention_dropout", REGC_KEY_APPLIED, NULL, NULL},
    {"pad_token_id", REGC_KEY_APPLIED, NULL, NULL}, /* the embedding's padding_idx */
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_attention_bias[] = {
    {"attention_bias", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_llama[] = {
    {"mlp_bias", REGC_KEY_APPLIED, NULL, NULL},
    {"pretraining_tp", REGC_KEY_INERT, NULL,
     "Transformers 5's LlamaForCausalLM does not read it (it only split the projections' "
     "products in pre-training)"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_window[] = {
    {"sliding_window", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
/* Qwen's: sliding_window (keys_window) gated, and placed by layer */
static const regc_config_key keys_qwen_windows[] = {
    {"use_sliding_window", REGC_KEY_APPLIED, NULL, NULL},
    {"max_window_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_types", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
/* Gemma's: its activation's own key, the scores' scale, windows by layer
 * type; listed before keys_decoder, whose hidden_act they override */
static const regc_config_key keys_gemma[] = {
    {"hidden_activation", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_act", REGC_KEY_INERT, NULL, "Gemma's MLP reads hidden_activation"},
    {"query_pre_attn_scalar", REGC_KEY_APPLIED, NULL, NULL},
    {"final_logit_softcapping", REGC_KEY_APPLIED, NULL, NULL},
    {"sliding_window", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_types", REGC_KEY_APPLIED, NULL, NULL},
    {"cache_implementation", REGC_KEY_INERT, NULL, "generation's key/value cache"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_gemma2[] = {
    {"attn_logit_softcapping", REGC_KEY_APPLIED, NULL, NULL},
    {"use_bidirectional_attention", REGC_KEY_INERT, NULL,
     "Transformers' Gemma 2 masks never read it"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_gemma3[] = {
    {"attn_logit_softcapping", REGC_KEY_INERT, NULL,
     "Transformers' Gemma 3 attention never applies it"},
    {"use_bidirectional_attention", REGC_KEY_APPLIED, NULL, NULL}, /* true refused */
    {"rope_local_base_freq", REGC_KEY_APPLIED, NULL, NULL},
    {"partial_rotary_factor", REGC_KEY_REFUSED, "1.0",
     "regc rotates the whole head (Gemma 3 reads rotation options per layer type in "
     "rope_parameters)"},
    {"sliding_window_pattern", REGC_KEY_APPLIED, NULL, NULL},
    {"_sliding_window_pattern", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_smollm3[] = {
    {"mlp_bias", REGC_KEY_APPLIED, NULL, NULL},
    {"use_sliding_window", REGC_KEY_APPLIED, NULL, NULL},
    {"layer_types", REGC_KEY_APPLIED, NULL, NULL},
    {"no_rope_layers", REGC_KEY_APPLIED, NULL, NULL},
    {"no_rope_layer_interval", REGC_KEY_APPLIED, NULL, NULL},
    {"max_window_layers", REGC_KEY_INERT, NULL,
     "Transformers 5's SmolLM3 never reads it (its windows follow layer_types)"},
    {"pretraining_tp", REGC_KEY_INERT, NULL, "Transformers 5's SmolLM3 never reads it"},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_granite[] = {
    {"mlp_bias", REGC_KEY_APPLIED, NULL, NULL},
    {"embedding_multiplier", REGC_KEY_APPLIED, NULL, NULL},
    {"residual_multiplier", REGC_KEY_APPLIED, NULL, NULL},
    {"attention_multiplier", REGC_KEY_APPLIED, NULL, NULL},
    {"logits_scaling", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};
static const regc_config_key keys_phi3[] = {
    {"resid_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {"embd_pdrop", REGC_KEY_INERT, NULL, "Transformers 5's Phi3Model never applies it"},
    {"original_max_position_embeddings", REGC_KEY_APPLIED, NULL, NULL}, /* longrope's */
    /* Phi-4-mini's config.json carries its remote code's keys at values
     * that change nothing; Transformers' Phi-3 reads none of them */
    {"attention_bias", REGC_KEY_REFUSED, "false",
     "Transformers' Phi-3 builds its projections without biases"},
    {"mlp_bias", REGC_KEY_REFUSED, "false", "Transformers' Phi-3 builds its MLP without biases"},
    {"lm_head_bias", REGC_KEY_REFUSED, "false",
     "Transformers' Phi-3 builds its head without a bias"},
    {"full_attn_mod", REGC_KEY_REFUSED, "1",
     "Transformers' Phi-3 attends as sliding_window says on every layer"},
    {"interpolate_factor", REGC_KEY_REFUSED, "1",
     "Transformers' Phi-3 interpolates no positions beyond its RoPE type"},
    {NULL, 0, NULL, NULL},
};

/* The families with LayerNorms (Phi, GPT-NeoX, StableLM), listed before
 * keys_decoder: their epsilon's key, the RMSNorm's not theirs */
static const regc_config_key keys_layernorm[] = {
    {"layer_norm_eps", REGC_KEY_APPLIED, NULL, NULL},
    {"rms_norm_eps", REGC_KEY_INERT, NULL, "this family's norms are LayerNorms (layer_norm_eps)"},
    {NULL, 0, NULL, NULL},
};
/* The families whose heads are hidden_size / num_attention_heads wide
 * whatever config.json says (GPT-NeoX, StableLM; decoder_family's
 * no_head_dim), listed before keys_decoder */
static const regc_config_key keys_no_head_dim[] = {
    {"head_dim", REGC_KEY_REFUSED, NULL,
     "Transformers makes this family's heads hidden_size / num_attention_heads wide"},
    {NULL, 0, NULL, NULL},
};

/* Phi's own: its q/k norms and dropouts */
static const regc_config_key keys_phi[] = {
    {"qk_layernorm", REGC_KEY_APPLIED, NULL, NULL},
    {"resid_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {"embd_pdrop", REGC_KEY_APPLIED, NULL, NULL},
    {NULL, 0, NULL, NULL},
};

/* StableLM's own, listed before keys_decoder */
static const regc_config_key keys_stablelm[] = {
    {"use_qkv_bias", REGC_KEY_APPLIED, NULL, NULL},
    {"use_parallel_residual", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_dropout", REGC_KEY_APPLIED, NULL, NULL},
    {"qk_layernorm", REGC_KEY_REFUSED, "false",
     "StableLM normalises each head of q and k with a LayerNorm of its own; regc's q/k norms "
     "share one across the heads"},
    {NULL, 0, NULL, NULL},
};

/* GPT-NeoX's own, listed before keys_decoder: RoPE by its own names, its
 * one dropout and the parallel switch; keys_decoder's heads refused, its
 * RMSNorm's epsilon, pad id and RoPE spellings inert to it */
static const regc_config_key keys_gpt_neox[] = {
    {"rotary_emb_base", REGC_KEY_APPLIED, NULL, NULL},
    {"rotary_pct", REGC_KEY_APPLIED, NULL, NULL},
    {"hidden_dropout", REGC_KEY_APPLIED, NULL, NULL},
    {"attention_bias", REGC_KEY_APPLIED, NULL, NULL},
    {"use_parallel_residual", REGC_KEY_APPLIED, NULL, NULL},
    {"num_key_value_heads", REGC_KEY_REFUSED, NULL,
     "Transformers' GPT-NeoX gives k and v as many heads as q"},
    {"pad_token_id", REGC_KEY_INERT, NULL,
     "padding's: Transformers' GPT-NeoX gives its embedding no padding index"},
    {"rope_theta", REGC_KEY_INERT, NULL,
     "Transformers' GPT-NeoX reads rotary_emb_base (or rope_parameters) instead"},
    {"partial_rotary_factor", REGC_KEY_INERT, NULL,
     "Transformers' GPT-NeoX reads rotary_pct (or rope_parameters) instead"},
    {"classifier_dropout", REGC_KEY_INERT, NULL,
     "the sequence- and token-classification heads', which a causal LM has not"},
    {"is_decoder", REGC_KEY_INERT, NULL,
     "Transformers' GPT-NeoX never reads it: its causal LM attends causally"},
    {"attention_probs_dropout_prob", REGC_KEY_INERT, NULL,
     "an older name Transformers' GPT-NeoX no longer reads (attention_dropout is read)"},
    {"hidden_dropout_prob", REGC_KEY_INERT, NULL,
     "an older name Transformers' GPT-NeoX no longer reads (hidden_dropout is read)"},
    {NULL, 0, NULL, NULL},
};

static int llama_preset_config(regc_model *m, const char *preset)
{
    decoder_config c = {.family = &family_llama,
                        .pad = -1,
                        .eps = 1e-5,
                        .rope.theta = 500000.0,
                        .n_pos = 8192,
                        .vocab = 128256,
                        .n_kv_head = 8};
    if (strcmp(preset, "llama-tiny") == 0) {
        c.vocab = 512, c.hidden = 128, c.inter = 344, c.n_layer = 4, c.n_head = 4;
        c.n_kv_head = 2, c.n_pos = 256, c.eps = 1e-6, c.rope.theta = 10000.0;
    } else if (strcmp(preset, "llama-127m") == 0) {
        /* llama-tiny's shape (grouped-query attention, two query heads per
         * key/value head; SwiGLU; an untied head) at GPT-2 124M's width
         * and depth: the benchmarks' Llama beside gpt2-124m */
        c.vocab = 32000, c.hidden = 768, c.inter = 2048, c.n_layer = 12, c.n_head = 12;
        c.n_kv_head = 6, c.n_pos = 1024, c.eps = 1e-6, c.rope.theta = 10000.0;
    } else if (strcmp(preset, "llama-8b") == 0) {
        /* Llama 3.1 8B's published shape and context (its RoPE plain, at
         * θ 500000: the presets are for shapes) */
        c.hidden = 4096, c.inter = 14336, c.n_layer = 32, c.n_head = 32, c.n_pos = 131072;
    } else if (strcmp(preset, "llama-70b") == 0) {
        /* Llama 3.1 70B's, likewise */
        c.hidden = 8192, c.inter = 28672, c.n_layer = 80, c.n_head = 64, c.n_pos = 131072;
    } else {
        return regc_error(REGC_ERR_ARG, "%s: not a llama preset", preset);
    }
    c.head_dim = c.hidden / c.n_head;
    return decoder_set_config(m, &c, NULL);
}

/* A slot's shape and random init (HF's: normal with std
 * initializer_range = 0.02 for every weight, as uniform draws of the same
 * std, GPT-2's projections into the residual 0.02 / sqrt(2 n_layer);
 * biases zero; norms the identity). */
static void slot_shape(const decoder_config *c, int s, int *ndim, int64_t *d, float *center,
                       float *halfwidth)
{
    const int64_t C = c->hidden, F = c->inter;
    const int64_t QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim;
    const int head_norm = c->qk_norm == QK_NORM_HEAD;
    const int64_t out[N_SLOTS] = {
        [S_Q] = QD,
        [S_Q_BIAS] = QD,
        [S_K] = KD,
        [S_K_BIAS] = KD,
        [S_V] = KD,
        [S_V_BIAS] = KD,
        [S_QKV] = QD + 2 * KD,
        [S_QKV_BIAS] = QD + 2 * KD,
        [S_O] = C,
        [S_O_BIAS] = C,
        [S_Q_NORM] = head_norm ? c->head_dim : QD,
        [S_Q_NORM_BIAS] = c->head_dim,
        [S_K_NORM] = head_norm ? c->head_dim : KD,
        [S_K_NORM_BIAS] = c->head_dim,
        [S_GATE] = F,
        [S_GATE_BIAS] = F,
        [S_UP] = F,
        [S_UP_BIAS] = F,
        [S_GATE_UP] = 2 * F,
        [S_DOWN] = C,
        [S_DOWN_BIAS] = C,
        [S_INPUT_NORM] = C,
        [S_INPUT_NORM_BIAS] = C,
        [S_POST_ATTN_NORM] = C,
        [S_POST_ATTN_NORM_BIAS] = C,
        [S_PRE_FF_NORM] = C,
        [S_POST_FF_NORM] = C,
    };
    const int is_weight = s == S_Q || s == S_K || s == S_V || s == S_QKV || s == S_O ||
                          s == S_GATE || s == S_UP || s == S_GATE_UP || s == S_DOWN;
    const int is_norm = s == S_Q_NORM || s == S_K_NORM || s == S_INPUT_NORM ||
                        s == S_POST_ATTN_NORM || s == S_PRE_FF_NORM || s == S_POST_FF_NORM;
    const int64_t in = !is_weight ? 0 : s == S_O ? QD : s == S_DOWN ? F : C;
    /* nn.Linear weights are stored [out, in], Conv1D's [in, out] */
    d[0] = c->family->conv1d && is_weight ? in : out[s];
    d[1] = c->family->conv1d && is_weight ? out[s] : in;
    *ndim = is_weight ? 2 : 1;
    /* a norm's scale one: its weight 1, or Gemma's 0 (it multiplies by 1 + w) */
    *center = is_norm && !c->family->norm_offset ? 1.0f : 0.0f;
    if (!is_weight)
        *halfwidth = 0.0f;
    else if (c->family->scaled_init && (s == S_O || s == S_DOWN))
        *halfwidth = (float)(0.02 / sqrt(2.0 * (double)c->n_layer) * sqrt(3.0));
    else
        *halfwidth = (float)(0.02 * sqrt(3.0));
}

/* The checkpoint order of the family's state dict. */
int decoder_list_params(regc_model *m)
{
    const decoder_config *c = m->cfg;
    const decoder_names *names = c->family->names ? c->family->names : &llama_names;
    const int64_t C = c->hidden, V = c->vocab;
    const float w = (float)(0.02 * sqrt(3.0));
    char n[160], prefix[80];
    int rc;
    if ((rc = regc_model_add_2d(m, names->embed, 2, V, C, 0.0f, w)) < 0)
        return rc;
    if (c->family->learned_positions &&
        (rc = regc_model_add_2d(m, names->positions, 2, c->n_pos, C, 0.0f, w)) < 0)
        return rc;
    for (int64_t l = 0; l < c->n_layer; l++) {
        snprintf(prefix, sizeof prefix, names->layer, l);
        for (const int *s = c->family->slots; *s >= 0; s++) {
            if (c->slot_at[*s] < 0)
                continue;
            int ndim;
            int64_t d[2];
            float center, hw;
            slot_shape(c, *s, &ndim, d, &center, &hw);
            snprintf(n, sizeof n, "%s%s", prefix, names->slot_suffix[*s]);
            if ((rc = regc_model_add_2d(m, n, ndim, d[0], d[1], center, hw)) < 0)
                return rc;
        }
    }
    if ((rc = regc_model_add_2d(m, names->norm, 1, C, 0, c->family->norm_offset ? 0.0f : 1.0f,
                                0.0f)) < 0)
        return rc;
    if (c->family->layernorm &&
        (rc = regc_model_add_2d(m, names->norm_bias, 1, C, 0, 0.0f, 0.0f)) < 0)
        return rc;
    if (!c->tied && (rc = regc_model_add_2d(m, names->head ? names->head : "lm_head.weight", 2, V,
                                            C, 0.0f, w)) < 0)
        return rc;
    if (c->family->head_bias &&
        (rc = regc_model_add_2d(m, names->head_bias, 1, V, 0, 0.0f, 0.0f)) < 0)
        return rc;
    return REGC_OK;
}

/* the head of a tied model, and the rotary buffer older checkpoints saved */
static const char *const decoder_ignored[] = {"lm_head.weight", "*.rotary_emb.inv_freq", NULL};

#define DECODER_ARCH(type_, family_, keys_, peft_, preset_)                                        \
    {                                                                                              \
        .model_type = type_, .family = &family_, .config_keys = keys_, .peft_targets = peft_,      \
        .ignored_tensors = decoder_ignored, .preset_config = preset_,                              \
        .parse_config = decoder_parse_config, .list_params = decoder_list_params,                  \
        .build_graph = decoder_build_graph, .write_config = decoder_write_config,                  \
        .describe = decoder_describe, .fill_inputs = decoder_fill_inputs,                          \
        .compute_rope = decoder_compute_rope,                                                      \
    }

static const regc_config_key *const tables_llama[] = {keys_decoder, keys_attention_bias, keys_llama,
                                                      NULL};
static const regc_config_key *const tables_mistral[] = {keys_decoder, keys_window, NULL};
static const regc_config_key *const tables_qwen2[] = {keys_decoder, keys_window, keys_qwen_windows,
                                                      NULL};
static const regc_config_key *const tables_qwen3[] = {keys_decoder, keys_attention_bias,
                                                      keys_window, keys_qwen_windows, NULL};
static const regc_config_key *const tables_olmo2[] = {keys_decoder, keys_attention_bias, NULL};
static const regc_config_key *const tables_phi3[] = {keys_decoder, keys_window, keys_phi3, NULL};
static const regc_config_key *const tables_gemma2[] = {keys_gemma, keys_gemma2, keys_decoder,
                                                       keys_attention_bias, NULL};
static const regc_config_key *const tables_gemma3[] = {keys_gemma, keys_gemma3, keys_decoder,
                                                       keys_attention_bias, NULL};
static const regc_config_key *const tables_granite[] = {keys_decoder, keys_attention_bias,
                                                        keys_granite, NULL};
static const regc_config_key *const tables_smollm3[] = {keys_decoder, keys_attention_bias,
                                                        keys_window, keys_smollm3, NULL};
static const regc_config_key *const tables_phi[] = {keys_phi, keys_layernorm, keys_decoder, NULL};
static const regc_config_key *const tables_gpt_neox[] = {keys_gpt_neox, keys_layernorm,
                                                         keys_no_head_dim, keys_decoder, NULL};
static const regc_config_key *const tables_stablelm[] = {keys_stablelm, keys_layernorm,
                                                         keys_no_head_dim, keys_decoder, NULL};

/* The head under the name Transformers 5 gives it in memory. */
static int gpt_neox_legacy_name(const char *name, char *buf, size_t cap)
{
    if (strcmp(name, "embed_out.weight") != 0)
        return 0;
    snprintf(buf, cap, "lm_head.weight");
    return 1;
}

/* a tied head under either name, and the buffers older checkpoints saved
 * (the causal mask, its fill value, the rotary frequencies) */
static const char *const gpt_neox_ignored[] = {"embed_out.weight",      "lm_head.weight",
                                               "*.attention.bias",      "*.attention.masked_bias",
                                               "*.rotary_emb.inv_freq", NULL};

/* PEFT's default target_modules (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING;
 * it has none for OLMo 2, Phi-3, Granite and SmolLM3) */
const regc_arch regc_arch_phi =
    DECODER_ARCH("phi", family_phi, tables_phi, "q_proj,v_proj,fc1,fc2", NULL);
const regc_arch regc_arch_stablelm =
    DECODER_ARCH("stablelm", family_stablelm, tables_stablelm, "q_proj,v_proj", NULL);
const regc_arch regc_arch_gpt_neox = {
    .model_type = "gpt_neox",
    .family = &family_gpt_neox,
    .config_keys = tables_gpt_neox,
    .peft_targets = "query_key_value",
    .legacy_name = gpt_neox_legacy_name,
    .ignored_tensors = gpt_neox_ignored,
    .parse_config = decoder_parse_config,
    .list_params = decoder_list_params,
    .build_graph = decoder_build_graph,
    .write_config = decoder_write_config,
    .describe = decoder_describe,
    .fill_inputs = decoder_fill_inputs,
    .compute_rope = decoder_compute_rope,
};
const regc_arch regc_arch_llama =
    DECODER_ARCH("llama", family_llama, tables_llama, "q_proj,v_proj", llama_preset_config);
const regc_arch regc_arch_mistral =
    DECODER_ARCH("mistral", family_mistral, tables_mistral, "q_proj,v_proj", NULL);
const regc_arch regc_arch_qwen2 =
    DECODER_ARCH("qwen2", family_qwen2, tables_qwen2, "q_proj,v_proj", NULL);
const regc_arch regc_arch_qwen3 =
    DECODER_ARCH("qwen3", family_qwen3, tables_qwen3, "q_proj,v_proj", NULL);
const regc_arch regc_arch_olmo2 = DECODER_ARCH("olmo2", family_olmo2, tables_olmo2, NULL, NULL);
const regc_arch regc_arch_phi3 = DECODER_ARCH("phi3", family_phi3, tables_phi3, NULL, NULL);
const regc_arch regc_arch_gemma2 =
    DECODER_ARCH("gemma2", family_gemma2, tables_gemma2, "q_proj,v_proj", NULL);
const regc_arch regc_arch_gemma3 =
    DECODER_ARCH("gemma3_text", family_gemma3, tables_gemma3, "q_proj,v_proj", NULL);
const regc_arch regc_arch_granite =
    DECODER_ARCH("granite", family_granite, tables_granite, NULL, NULL);
const regc_arch regc_arch_smollm3 =
    DECODER_ARCH("smollm3", family_smollm3, tables_smollm3, NULL, NULL);
