/* decoder.h — private to models/: what the decoder families' files
 * share. decoder.c describes each family of Llama's lineage (its layer, its
 * config keys) and lists any family's parameters; decoder_config.c reads
 * those families' config.json into a decoder_config, writes it back and
 * describes it; decoder_graph.c builds the flat forward graph from that
 * description and fills its rotary tables. gpt2.c describes GPT-2's layer
 * in the same terms and reads its own config.json. */
#ifndef REGC_DECODER_H
#define REGC_DECODER_H

#include "model_internal.h"

/* One layer's parameter slots; a family lists the ones it may have in its
 * checkpoint order, and the config decides which optional ones exist. */
enum {
    S_Q,
    S_Q_BIAS,
    S_K,
    S_K_BIAS,
    S_V,
    S_V_BIAS,
    S_QKV, /* Phi-3, GPT-2: [q; k; v] in one projection; GPT-NeoX: head by head */
    S_QKV_BIAS,
    S_O,
    S_O_BIAS,
    S_Q_NORM,
    S_Q_NORM_BIAS, /* a LayerNorm's (Phi's qk_layernorm) */
    S_K_NORM,
    S_K_NORM_BIAS,
    S_GATE,
    S_GATE_BIAS,
    S_UP,
    S_UP_BIAS,
    S_GATE_UP, /* Phi-3: [gate; up] in one projection */
    S_DOWN,
    S_DOWN_BIAS,
    S_INPUT_NORM,
    S_INPUT_NORM_BIAS, /* a LayerNorm's (GPT-2) */
    S_POST_ATTN_NORM,
    S_POST_ATTN_NORM_BIAS,
    S_PRE_FF_NORM,
    S_POST_FF_NORM,
    N_SLOTS
};

typedef enum { QK_NORM_NONE, QK_NORM_HEAD, QK_NORM_WHOLE } qk_norm_kind;

/* Where a layer's norms stand. */
typedef enum {
    NORMS_BEFORE, /* before attention and the MLP (Llama): input, post_attention */
    NORMS_AFTER,  /* after them, on their outputs (OLMo 2): post_attention, post_feedforward */
    NORMS_BOTH,   /* before and after each (Gemma): input, post_attention, pre_ and post_feedforward
                   */
} norm_place;

/* Attention and the MLP one after the other, or side by side from the
 * layer's input: x + attn(norm(x)) + mlp(norm'(x)). */
typedef enum {
    PARALLEL_NONE,
    PARALLEL_ONE_NORM,  /* both blocks read one norm (Phi) */
    PARALLEL_TWO_NORMS, /* each its own: input_ and post_attention_layernorm (GPT-NeoX) */
} parallel_kind;

/* How a family reads its sliding windows. */
typedef enum {
    WINDOW_NONE,   /* no window (Llama, OLMo 2) */
    WINDOW_ALL,    /* sliding_window, when set, on every layer (Mistral, Phi-3) */
    WINDOW_LAYERS, /* layer_types, or use_sliding_window and max_window_layers (Qwen) */
    WINDOW_GEMMA,  /* layer_types, or every `pattern`-th layer full (Gemma) */
    WINDOW_NOPE,   /* use_sliding_window gates; layer_types, or the layers without RoPE (SmolLM3) */
} window_kind;

/* A layer's variations (decoder_config's layer[]): a window to slide by,
 * and attention without RoPE (SmolLM3's NoPE layers). */
enum { LAYER_SLIDING = 1, LAYER_NOPE = 2 };

/* The activations the MLP's gate may take: hidden_act's values. */
typedef enum { ACT_SILU, ACT_GELU_TANH, ACT_GELU, ACT_RELU } act_kind;

/* A family's checkpoint names, where they are not Llama's. */
typedef struct {
    const char *embed;              /* the token embedding */
    const char *positions;          /* the learned position embedding (learned_positions) */
    const char *layer;              /* a layer's prefix: a printf format of its index (int64_t) */
    const char *norm;               /* the final norm's weight, */
    const char *norm_bias;          /* and its bias (layernorm) */
    const char *head;               /* the LM head's weight; NULL: lm_head.weight */
    const char *head_bias;          /* its bias (head_bias) */
    const char *const *slot_suffix; /* [N_SLOTS] each slot's name after the layer's prefix */
} decoder_names;

typedef struct {
    const char *architecture;   /* config.json's "architectures" */
    const int *slots;           /* its layer's possible slots, checkpoint order, -1 ends */
    const decoder_names *names; /* NULL: Llama's */
    int layernorm;              /* LayerNorms with biases (GPT-2), else RMSNorms */
    int learned_positions;      /* a position embedding added to the tokens' (GPT-2), else RoPE */
    int plain_mlp;              /* down(act(up(h))) (GPT-2), else the gated MLP */
    parallel_kind parallel;     /* the blocks side by side (as parallel_key chooses, if any) */
    const char *parallel_key;   /* a boolean key choosing parallel or not (GPT-NeoX's) */
    int parallel_default;       /* parallel_key's default */
    int residual_first;         /* side by side, summed (x + a) + m (StableLM); else x + (a + m) */
    int head_bias;              /* the LM head has a bias (Phi) */
    int qkv_per_head;           /* the fused projection's rows q, k, v head by head (GPT-NeoX) */
    int no_head_dim; /* no head_dim key: heads hidden_size / num_attention_heads wide (GPT-NeoX,
                        StableLM) */
    int no_kv_heads; /* no num_key_value_heads key: k and v as many heads as q (GPT-NeoX) */
    int conv1d;      /* weights stored [in, out] (GPT-2's Conv1D), else nn.Linear's */
    int scaled_init; /* o and down drawn with std / sqrt(2 n_layer), as GPT-2 initialises */
    qk_norm_kind qk_norm;
    norm_place norms;
    int norm_offset;          /* Gemma: a norm multiplies by 1 + w */
    int embed_scale;          /* Gemma: the embeddings times sqrt(hidden_size) */
    int fused;                /* qkv_proj, and gate_up_proj in a gated MLP */
    int qkv_bias;             /* q, k and v always have biases (Qwen 2) */
    const char *qkv_bias_key; /* a boolean key giving q, k and v biases (StableLM's use_qkv_bias) */
    int bias_key;             /* attention_bias adds biases to q, k, v and o */
    int mlp_bias_key;
    int bias_default;     /* attention_bias's default, or the biases without the key (Phi) */
    int mlp_bias_default; /* likewise the MLP's (Phi, GPT-NeoX: always) */
    /* the dropouts' keys (NULL: none): after attention and the MLP
     * (Phi-3's and Phi's resid_pdrop, GPT-NeoX's hidden_dropout), and on
     * the embeddings (Phi's embd_pdrop, GPT-NeoX's hidden_dropout again) */
    const char *resid_dropout_key;
    const char *embed_dropout_key;
    int mlp_dropout_only; /* resid_dropout_key's dropout after the MLP alone (StableLM) */
    /* RoPE's own keys (GPT-NeoX's rotary_emb_base and rotary_pct), read
     * as rope_theta and partial_rotary_factor are; NULL: those */
    const char *theta_key, *partial_key;
    int gemma;               /* query_pre_attn_scalar and the soft-capping keys */
    int local_rope;          /* sliding layers rotate with their own base (Gemma 3) */
    int phi3_rope;           /* RoPE read as Phi3Config reads it (regc_rope_parse_phi3) */
    int nope;                /* no_rope_layers: some layers attend without RoPE (SmolLM3) */
    int granite;             /* Granite's embedding, residual and attention multipliers and
                                logits_scaling */
    const char *qk_norm_key; /* a boolean key choosing qk_norm (Phi's qk_layernorm); NULL: fixed */
    double partial_default;  /* partial_rotary_factor when absent; 0: the whole head, the key
                                refused (rope.c) */
    const char *eps_key;     /* the norms' epsilon; NULL: rms_norm_eps */
    const char *act_key;     /* "hidden_act", or Gemma's "hidden_activation" */
    const char *n_pos_key;   /* the longest sequence's key; NULL: max_position_embeddings */
    act_kind act_default;    /* when act_key is absent */
    window_kind window;
    int64_t window_pattern;   /* WINDOW_GEMMA without layer_types: every n-th layer is full */
    int64_t pad_default;      /* pad_token_id when config.json has none; -1: none */
    int64_t kv_heads_default; /* num_key_value_heads when absent (StableLM's 32); 0: q's */
    int pad_unused;           /* pad_token_id is no padding index (GPT-NeoX's embedding has none) */
    int64_t n_pos_default;    /* max_position_embeddings when absent (Transformers'); 0: 2048 */
    double theta_default;     /* rope_theta when absent; 0: 10000 */
    int tied_default;         /* tie_word_embeddings when config.json has none (Gemma's true) */
} decoder_family;

typedef struct {
    const decoder_family *family;
    int64_t vocab, hidden, inter, n_layer, n_head, n_kv_head, head_dim, n_pos;
    double eps, attn_dropout, resid_dropout, embed_dropout;
    regc_rope rope;       /* rope_theta and its scaling (rope.c); a sliding layer's... */
    regc_rope rope_local; /* ... when the family's local_rope is set */
    act_kind act;
    qk_norm_kind qk_norm;   /* the family's, or as its qk_norm_key chooses */
    parallel_kind parallel; /* the family's, or as its parallel_key chooses */
    char act_name[24];      /* the activation as config.json spells it, where a family keeps that */
    int tied;
    int64_t pad;             /* pad_token_id: the embedding row that takes no gradient; -1: none */
    int attn_bias, mlp_bias; /* attention_bias (q, k, v, o), mlp_bias (gate, up, down) */
    int qkv_bias;            /* q, k and v biases without o's (the family's, or its key's) */
    double query_scalar;     /* Gemma's query_pre_attn_scalar: scores scaled by its -1/2 power */
    double attn_softcap, final_softcap; /* Gemma 2's soft-capping; 0: none */
    /* Granite's: the embeddings times embedding_mult, each block's output
     * times resid_mult before the residual add, the scores times
     * attn_mult (in place of head_dim^-1/2), the logits over logits_scaling */
    double embed_mult, resid_mult, attn_mult, logits_scaling;
    int use_sliding_window; /* Qwen's and SmolLM3's switch, written back as read */
    int64_t max_window_layers;
    int64_t window_pattern; /* Gemma's sliding_window_pattern, written back as read */
    int64_t window;         /* sliding_window; 0: none */
    int64_t nope_interval;  /* SmolLM3's no_rope_layer_interval, written back as read */
    int n_slots;            /* the layer's parameters */
    int slot_at[N_SLOTS];   /* a slot's index among them, or -1 */
    /* [n_layer] LAYER_SLIDING (the layer's window is `window`), LAYER_NOPE */
    unsigned char layer[];
} decoder_config;

/* decoder_config.c: c into m's config (a copy, with the layers'
 * variations from layer, or every layer sliding when NULL and c has a
 * window), the regc_arch entry that reads config.json, and the norms'
 * epsilon's key (rms_norm_eps, or the family's eps_key) */
int decoder_set_config(regc_model *m, const decoder_config *c, const unsigned char *layer);
int decoder_parse_config(regc_model *m, const cJSON *root, const char *path);
const char *decoder_eps_key(const decoder_family *f);

/* decoder_write.c: the regc_arch entries that write config.json back and
 * describe the model */
cJSON *decoder_write_config(const regc_model *m);
void decoder_describe(const regc_model *m, char *buf, size_t cap);

/* decoder.c: the parameters in checkpoint order (regc_arch's list_params) */
int decoder_list_params(regc_model *m);

/* decoder_graph.c */
int decoder_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out);
int decoder_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                        int n, regc_input *in);
int64_t decoder_compute_rope(const regc_model *m, int64_t seq, float *inv_freq, int64_t n,
                             float *scaling);

#endif
