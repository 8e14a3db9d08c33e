/* decoder_graph.c — the decoder families' flat forward graph (decoder.h's
 * description of the layer, as decoder.c or gpt2.c read it from
 * config.json) and the rotary tables it reads.
 *
 * The embeddings: x = embed(ids) (times sqrt(C): Gemma; times
 * embedding_multiplier: Granite), plus a learned
 * position embedding (GPT-2), then dropout (GPT-2's embd_pdrop). The
 * layer, x [B, T, C] in and out (norms as the family places them):
 *     h = norm(x)                    (NORMS_BEFORE, NORMS_BOTH; else h = x)
 *     q, k, v = h Wq + bq, h Wk + bk, h Wv + bv   (fused: one qkv_proj,
 *                                     split in three equal parts or sliced;
 *                                     GPT-NeoX's head by head)
 *     q, k = qk_norm(q), qk_norm(k)  (per head: Qwen 3, Gemma 3, Phi's
 *                                     LayerNorms; whole: OLMo 2)
 *     q, k = rope(q), rope(k)        (a sliding layer's own tables: Gemma 3;
 *                                     none with learned positions, nor on
 *                                     SmolLM3's NoPE layers; on the first
 *                                     dimensions of each head only, as wide
 *                                     as the tables: Phi, GPT-NeoX)
 *     a = attention(q, k, v) Wo + bo (scale, soft-capping, sliding window)
 *     x = x + a                      (NORMS_AFTER, NORMS_BOTH: x + norm(a);
 *                                     Granite: x + a * residual_multiplier)
 *     m = down(act(gate(h')) * up(h'))    (fused: one gate_up_proj, halved;
 *                                     plain: down(act(up(h'))), GPT-2)
 *     x = x + m                      (likewise)
 * with h' = norm(x) before the MLP under NORMS_BEFORE and NORMS_BOTH. A
 * parallel layer reads x for both blocks: x = x + (a + m), m = mlp(h)
 * from the attention's norm (Phi, StableLM) or mlp(h') from its own norm
 * of x (GPT-NeoX), summed as Transformers sums them ((x + a) + m:
 * StableLM). Then the final norm,
 * the head (tied or not; Phi's with a bias), Gemma 2's soft-capping of the
 * logits (Granite's division by logits_scaling), and the cross-entropy. A
 * norm is an RMSNorm, or a LayerNorm with a bias (GPT-2); a Gemma norm
 * multiplies by 1 + w, made as its own op on the weight so the norm kernel
 * stays Llama's. A weight is nn.Linear's [out, in] or Conv1D's [in, out]
 * (GPT-2), read as stored. The graph is flat: layer structure is left for
 * detect/ to discover from the ops alone. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoder.h"

/* Tensor ids below are checked once per call through this macro: every
 * helper returns an id or a negative status with its own message. */
#define G(expr)                                                                                    \
    do {                                                                                           \
        if ((rc = (expr)) < 0)                                                                     \
            goto fail;                                                                             \
    } while (0)

/* x W^T (+ b) for nn.Linear's W [out, in], x W (+ b) for Conv1D's
 * [in, out]; the bias a parameter id or -1. */
static int decoder_linear(regc_graph *g, const decoder_config *c, int x, int w, int b)
{
    int y = regc_graph_matmul(g, x, w, 0, !c->family->conv1d);
    return y < 0 || b < 0 ? y : regc_graph_bias_add(g, y, b);
}

/* The norm of x's last axis: a LayerNorm by weight w and bias b, or an
 * RMSNorm by w, or by 1 + w (Gemma's, formed in float32 as Transformers
 * forms it). */
static int decoder_norm(regc_graph *g, const decoder_config *c, int x, int w, int b)
{
    if (c->family->layernorm)
        return regc_graph_layernorm(g, x, w, b, (float)c->eps);
    if (c->family->norm_offset && (w = regc_graph_add_scalar(g, w, 1.0f)) < 0)
        return w;
    return regc_graph_rmsnorm(g, x, w, (float)c->eps);
}

/* A q/k norm over each head's D values, weight [D] (Qwen 3, Gemma 3; a
 * LayerNorm with its bias b [D]: Phi). */
static int decoder_head_norm(regc_graph *g, const decoder_config *c, int x, int w, int b, int64_t B,
                             int64_t T, int64_t heads)
{
    const int64_t D = c->head_dim, split[] = {B, T, heads, D}, whole[] = {B, T, heads * D};
    int rc, y;
    if ((rc = y = regc_graph_reshape(g, x, 4, split)) < 0 || /* [B, T, heads, D] */
        (rc = y = decoder_norm(g, c, y, w, b)) < 0)          /* [B, T, heads, D] */
        return rc;
    return regc_graph_reshape(g, y, 3, whole); /* [B, T, heads*D] */
}

/* The MLP's activation (of its gate, in a gated MLP). */
static int decoder_act(regc_graph *g, act_kind act, int x)
{
    switch (act) {
    case ACT_GELU_TANH: return regc_graph_gelu(g, x);
    case ACT_GELU: return regc_graph_gelu_erf(g, x);
    case ACT_RELU: return regc_graph_relu(g, x);
    case ACT_SILU: break;
    }
    return regc_graph_silu(g, x);
}

/* The MLP's hidden activations [B, T, F] from its input h [B, T, C], the
 * layer's parameters w by slot: act(up(h)) in a plain MLP, else
 * act(gate(h)) * up(h), gate and up from one projection when fused. */
static int decoder_mlp_hidden(regc_graph *g, const decoder_config *c, int h, const int *w)
{
    const int64_t F = c->inter;
    int rc, gate, up;
    if (c->family->plain_mlp) {
        if ((rc = up = decoder_linear(g, c, h, w[S_UP], w[S_UP_BIAS])) < 0) /* [B, T, F] */
            return rc;
        return decoder_act(g, c->act, up); /* [B, T, F] */
    }
    if (c->family->fused) {
        if ((rc = h = decoder_linear(g, c, h, w[S_GATE_UP], -1)) < 0 || /* [B, T, 2F] */
            (rc = gate = regc_graph_slice(g, h, 2, 0, F)) < 0 ||        /* [B, T, F] */
            (rc = gate = decoder_act(g, c->act, gate)) < 0 ||           /* [B, T, F] */
            (rc = up = regc_graph_slice(g, h, 2, F, F)) < 0)            /* [B, T, F] */
            return rc;
    } else if ((rc = gate = decoder_linear(g, c, h, w[S_GATE], w[S_GATE_BIAS])) <
                   0 ||                                                        /* [B, T, F] */
               (rc = gate = decoder_act(g, c->act, gate)) < 0 ||               /* [B, T, F] */
               (rc = up = decoder_linear(g, c, h, w[S_UP], w[S_UP_BIAS])) < 0) /* [B, T, F] */
        return rc;
    return regc_graph_mul(g, gate, up); /* [B, T, F] */
}

/* cap tanh(x / cap), as Gemma 2's head applies it to the logits (the
 * division as a product by the reciprocal: within an ulp of it). */
static int decoder_softcap(regc_graph *g, int x, double cap)
{
    int rc;
    if ((rc = x = regc_graph_scale(g, x, (float)(1.0 / cap))) < 0 ||
        (rc = x = regc_graph_tanh(g, x)) < 0)
        return rc;
    return regc_graph_scale(g, x, (float)cap);
}

int decoder_build_graph(const regc_model *m, int64_t B, int64_t T, regc_graph **out)
{
    const decoder_config *c = m->cfg;
    const decoder_family *f = c->family;
    /* dynamic RoPE scales its base for longer sequences: that is what it
     * is for (Transformers trains past max_position_embeddings either way,
     * the other types out of the range they were made for) */
    if (T > c->n_pos && c->rope.type != REGC_ROPE_DYNAMIC)
        return regc_error(REGC_ERR_ARG, "sequence length %" PRId64 " exceeds %s %" PRId64 " of %s",
                          T, f->n_pos_key ? f->n_pos_key : "max_position_embeddings", c->n_pos,
                          m->source);
    regc_graph *g = regc_graph_new();
    int *p = NULL; /* [n_params] the parameters' tensor ids */
    if (!g)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory building the graph", m->source);
    const int H = (int)c->n_head, Hkv = (int)c->n_kv_head;
    const int64_t D = c->head_dim, QD = H * D, KD = Hkv * D;
    int rc, ids, pos = -1, targets, cos = -1, sin = -1, cos_local = -1, sin_local = -1, x, h, q, k,
                 v, u, n = 0;
    const int64_t bt[] = {B, T}, tt[] = {T}, rot[] = {T, regc_rope_dim(&c->rope, D) / 2};
    G(ids = regc_graph_add_tensor(g, "input_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    /* learned positions: 0 .. T-1 (regc_model_fill_lm_inputs), or per row,
     * from each document's start (train.reset_position_ids) */
    if (f->learned_positions && m->reset_positions)
        G(pos = regc_graph_add_tensor(g, "position_ids", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    else if (f->learned_positions)
        G(pos = regc_graph_add_constant(g, "position_ids", REGC_I32, 1, tt));
    G(targets = regc_graph_add_tensor(g, "targets", REGC_I32, REGC_ROLE_INPUT, 2, bt));
    int any_sliding = 0, any_rope = 0;
    for (int64_t l = 0; l < c->n_layer; l++)
        any_sliding |= c->layer[l] & LAYER_SLIDING, any_rope |= !(c->layer[l] & LAYER_NOPE);
    /* One rotary table for every layer that rotates (a second for the
     * sliding ones when they rotate with their own base), filled per batch
     * (decoder_fill_inputs). */
    if (!f->learned_positions && any_rope) {
        G(cos = regc_graph_add_constant(g, "rope_cos", REGC_F32, 2, rot));
        G(sin = regc_graph_add_constant(g, "rope_sin", REGC_F32, 2, rot));
    }
    if (!f->learned_positions && f->local_rope && any_sliding) {
        G(cos_local = regc_graph_add_constant(g, "rope_local_cos", REGC_F32, 2, rot));
        G(sin_local = regc_graph_add_constant(g, "rope_local_sin", REGC_F32, 2, rot));
    }
    G(regc_model_add_param_tensors(m, g, &p));
    const int embed = p[n++];
    const int positions = f->learned_positions ? p[n++] : -1;
    /* the scores' scale: head_dim^-1/2, or Gemma's query_pre_attn_scalar^-1/2
     * (a Python power, then float32, as Transformers takes it) */
    regc_attrs attn = {.n_head = H,
                       .n_kv_head = Hkv,
                       .causal = 1,
                       .scale = f->granite
                                    ? (float)c->attn_mult
                                    : (float)pow(f->gemma ? c->query_scalar : (double)D, -0.5),
                       .softcap = (float)c->attn_softcap};
    if (c->pad >= 0)
        G(x = regc_graph_embedding_padded(g, ids, embed, c->pad)); /* [B, T, C] */
    else
        G(x = regc_graph_embedding(g, ids, embed)); /* [B, T, C] */
    if (f->embed_scale) /* sqrt(hidden_size) as a float32 tensor, as Transformers holds it */
        G(x = regc_graph_scale(g, x, (float)sqrt((double)c->hidden))); /* [B, T, C] */
    if (f->granite && c->embed_mult != 1.0)
        G(x = regc_graph_scale(g, x, (float)c->embed_mult)); /* [B, T, C] */
    if (f->learned_positions && m->reset_positions) {
        G(h = regc_graph_embedding(g, pos, positions)); /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                 /* [B, T, C] */
    } else if (f->learned_positions) {
        G(h = regc_graph_embedding(g, pos, positions)); /* [T, C] */
        G(x = regc_graph_bias_add(g, x, h));            /* [B, T, C] */
    }
    G(regc_model_dropout(m, g, x, x, c->embed_dropout, &x)); /* [B, T, C] */
    for (int64_t l = 0; l < c->n_layer; l++) {
        int w[N_SLOTS]; /* this layer's parameters by slot, -1 where absent */
        for (int s = 0; s < N_SLOTS; s++)
            w[s] = c->slot_at[s] < 0 ? -1 : p[n + c->slot_at[s]];
        n += c->n_slots;
        const int sliding = (c->layer[l] & LAYER_SLIDING) != 0;
        const int local = cos_local >= 0 && sliding;
        /* a window as long as the sequence masks nothing: left out, so the
         * layer is the full ones' twin and detect/ sees one kind */
        attn.window = sliding && c->window < T ? c->window : 0;
        /* attention */
        if (f->norms == NORMS_AFTER)
            h = x;
        else
            G(h = decoder_norm(g, c, x, w[S_INPUT_NORM], w[S_INPUT_NORM_BIAS])); /* [B, T, C] */
        const int n_in = h; /* [B, T, C] what Phi's parallel MLP reads too */
        if (f->fused && f->qkv_per_head) {
            /* each head's q, k and v in turn (GPT-NeoX): regrouped as
             * [q; k; v] and split, so that q, k and v are each a tensor of
             * their own (as a fused projection's split gives them), not a
             * view, which the compiler would not hold in bf16 */
            const int64_t heads3[] = {B, T, H, 3, D}, whole[] = {B, T, 3 * QD};
            const int perm[] = {0, 1, 3, 2, 4};
            int qkv[3];
            G(u = decoder_linear(g, c, h, w[S_QKV], w[S_QKV_BIAS])); /* [B, T, 3 QD] */
            G(u = regc_graph_reshape(g, u, 5, heads3));              /* [B, T, H, 3, D] */
            G(u = regc_graph_transpose(g, u, perm));                 /* [B, T, 3, H, D] */
            G(u = regc_graph_reshape(g, u, 3, whole));               /* [B, T, 3 QD] */
            G(regc_graph_split(g, u, 3, qkv));                       /* 3 x [B, T, QD] */
            q = qkv[0], k = qkv[1], v = qkv[2];
        } else if (f->fused) {
            G(u = decoder_linear(g, c, h, w[S_QKV], w[S_QKV_BIAS])); /* [B, T, QD + 2 KD] */
            if (QD == KD) { /* three equal parts: one split */
                int qkv[3];
                G(regc_graph_split(g, u, 3, qkv)); /* 3 x [B, T, QD] */
                q = qkv[0], k = qkv[1], v = qkv[2];
            } else {
                G(q = regc_graph_slice(g, u, 2, 0, QD));       /* [B, T, QD] */
                G(k = regc_graph_slice(g, u, 2, QD, KD));      /* [B, T, KD] */
                G(v = regc_graph_slice(g, u, 2, QD + KD, KD)); /* [B, T, KD] */
            }
        } else {
            G(q = decoder_linear(g, c, h, w[S_Q], w[S_Q_BIAS])); /* [B, T, QD] */
            G(k = decoder_linear(g, c, h, w[S_K], w[S_K_BIAS])); /* [B, T, KD] */
            G(v = decoder_linear(g, c, h, w[S_V], w[S_V_BIAS])); /* [B, T, KD] */
        }
        if (c->qk_norm == QK_NORM_WHOLE) {
            G(q = decoder_norm(g, c, q, w[S_Q_NORM], -1)); /* [B, T, QD] */
            G(k = decoder_norm(g, c, k, w[S_K_NORM], -1)); /* [B, T, KD] */
        } else if (c->qk_norm == QK_NORM_HEAD) {
            G(q = decoder_head_norm(g, c, q, w[S_Q_NORM], w[S_Q_NORM_BIAS], B, T, H)); /* QD */
            G(k = decoder_head_norm(g, c, k, w[S_K_NORM], w[S_K_NORM_BIAS], B, T, Hkv));
        }
        if (!f->learned_positions && !(c->layer[l] & LAYER_NOPE)) {
            const int lc = local ? cos_local : cos, ls = local ? sin_local : sin;
            /* the tables' width says how much of each head rotates */
            G(q = regc_graph_rope(g, q, lc, ls, H));   /* [B, T, QD] */
            G(k = regc_graph_rope(g, k, lc, ls, Hkv)); /* [B, T, KD] */
        }
        G(regc_model_attention(m, g, q, k, v, -1, &attn, c->attn_dropout, &h)); /* [B, T, QD] */
        G(h = decoder_linear(g, c, h, w[S_O], w[S_O_BIAS]));                    /* [B, T, C] */
        if (f->norms != NORMS_BEFORE)
            G(h = decoder_norm(g, c, h, w[S_POST_ATTN_NORM], w[S_POST_ATTN_NORM_BIAS]));
        if (!f->mlp_dropout_only)
            G(regc_model_dropout(m, g, h, h, c->resid_dropout, &h)); /* [B, T, C] */
        if (c->parallel != PARALLEL_NONE) {                          /* x + a + mlp(norm(x)) */
            if (c->parallel == PARALLEL_TWO_NORMS) /* the MLP's own norm of x (GPT-NeoX) */
                G(u = decoder_norm(g, c, x, w[S_POST_ATTN_NORM], w[S_POST_ATTN_NORM_BIAS]));
            else                                                       /* the attention's (Phi) */
                u = n_in;                                              /* [B, T, C] */
            G(u = decoder_mlp_hidden(g, c, u, w));                     /* [B, T, F] */
            G(u = decoder_linear(g, c, u, w[S_DOWN], w[S_DOWN_BIAS])); /* [B, T, C] */
            G(regc_model_dropout(m, g, u, u, c->resid_dropout, &u));   /* [B, T, C] */
            if (f->residual_first) {                                   /* (x + a) + m */
                G(x = regc_graph_add(g, x, h));                        /* [B, T, C] */
                G(x = regc_graph_add(g, x, u));                        /* [B, T, C] */
            } else {                                                   /* x + (a + m) */
                G(h = regc_graph_add(g, h, u));                        /* [B, T, C] */
                G(x = regc_graph_add(g, h, x));                        /* [B, T, C] */
            }
            continue;
        }
        if (f->granite && c->resid_mult != 1.0)
            G(h = regc_graph_scale(g, h, (float)c->resid_mult)); /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                          /* [B, T, C] */
        /* the MLP */
        if (f->norms == NORMS_AFTER)
            h = x;
        else if (f->norms == NORMS_BOTH)
            G(h = decoder_norm(g, c, x, w[S_PRE_FF_NORM], -1)); /* [B, T, C] */
        else                                                    /* [B, T, C] */
            G(h = decoder_norm(g, c, x, w[S_POST_ATTN_NORM], w[S_POST_ATTN_NORM_BIAS]));
        G(h = decoder_mlp_hidden(g, c, h, w));                     /* [B, T, F] */
        G(h = decoder_linear(g, c, h, w[S_DOWN], w[S_DOWN_BIAS])); /* [B, T, C] */
        if (f->norms != NORMS_BEFORE)
            G(h = decoder_norm(g, c, h, w[S_POST_FF_NORM], -1)); /* [B, T, C] */
        G(regc_model_dropout(m, g, h, h, c->resid_dropout, &h)); /* [B, T, C] */
        if (f->granite && c->resid_mult != 1.0)
            G(h = regc_graph_scale(g, h, (float)c->resid_mult)); /* [B, T, C] */
        G(x = regc_graph_add(g, x, h));                          /* [B, T, C] */
    }
    const int norm = p[n++];
    const int norm_bias = f->layernorm ? p[n++] : -1;
    const int head = c->tied ? embed : p[n++];
    const int head_bias = f->head_bias ? p[n++] : -1;
    int logits, loss;
    G(x = decoder_norm(g, c, x, norm, norm_bias));   /* [B, T, C] */
    G(logits = regc_graph_matmul(g, x, head, 0, 1)); /* [B, T, V] */
    if (head_bias >= 0)
        G(logits = regc_graph_bias_add(g, logits, head_bias)); /* [B, T, V] */
    if (c->final_softcap > 0.0)
        G(logits = decoder_softcap(g, logits, c->final_softcap)); /* [B, T, V] */
    if (f->granite && c->logits_scaling != 1.0) /* HF divides: one rounding of 1/s apart */
        G(logits = regc_graph_scale(g, logits, (float)(1.0 / c->logits_scaling))); /* [B, T, V] */
    G(loss = regc_graph_cross_entropy(g, logits, targets));                        /* [] */
    G(regc_graph_mark_output(g, loss));
    free(p);
    *out = g;
    return REGC_OK;
fail:
    regc_error_prefix("%s: building the %s graph", m->source, m->arch->model_type);
    free(p);
    regc_graph_free(g);
    return rc;
}
#undef G

int64_t decoder_compute_rope(const regc_model *m, int64_t seq, float *inv_freq, int64_t n,
                             float *scaling)
{
    const decoder_config *c = m->cfg;
    const int64_t dim = regc_rope_dim(&c->rope, c->head_dim);
    if (inv_freq)
        regc_rope_inv_freq(&c->rope, dim, seq, inv_freq, scaling);
    (void)n;
    return dim / 2;
}

/* One pair of rotary tables [T, R/2] (R: the dimensions rotated of a
 * head; either table may be absent), rounded
 * exactly as HF's rotary embeddings round them: inv_freq as Transformers'
 * initialiser for the rope_type computes it (rope.c) for positions
 * 0..T-1 (dynamic's and longrope's depend on T), the angle t *
 * inv_freq in float32 (HF computes them in float32 whatever the model's
 * dtype), so long positions see the same angle error as the checkpoint was
 * trained with; then cos and sin times the attention scaling (yarn's; 1
 * otherwise), in float32. */
static int decoder_fill_rope(const regc_model *m, const regc_rope *rope, regc_input *cos,
                             regc_input *sin, int64_t T)
{
    const decoder_config *c = m->cfg;
    if ((!cos || cos->filled) && (!sin || sin->filled))
        return REGC_OK; /* absent, or filled for an earlier batch */
    const int64_t dim = regc_rope_dim(rope, c->head_dim), half = dim / 2, numel = T * half;
    const regc_input *tabs[2] = {cos, sin};
    for (int i = 0; i < 2; i++)
        if (tabs[i] &&
            (tabs[i]->tensor->dtype != REGC_F32 || regc_tensor_numel(tabs[i]->tensor) != numel))
            return regc_error(REGC_ERR_SHAPE,
                              "%s: graph input %s must be f32 [%" PRId64 ", %" PRId64 "]",
                              m->source, tabs[i]->tensor->name, T, half);
    float *inv_freq = malloc((size_t)half * sizeof *inv_freq + 1);
    if (!inv_freq)
        return regc_error(REGC_ERR_MEMORY, "%s: out of memory for the rotary tables", m->source);
    float scaling;
    regc_rope_inv_freq(rope, dim, T, inv_freq, &scaling);
    float *cs = cos ? cos->host : NULL, *sn = sin ? sin->host : NULL;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < half; j++) {
            const float angle = (float)t * inv_freq[j];
            if (cs)
                cs[t * half + j] = cosf(angle) * scaling;
            if (sn)
                sn[t * half + j] = sinf(angle) * scaling;
        }
    }
    free(inv_freq);
    if (cos)
        cos->filled = cos->constant = 1;
    if (sin)
        sin->filled = sin->constant = 1;
    return REGC_OK;
}

int decoder_fill_inputs(const regc_model *m, const regc_tokens *data, const regc_batch_spec *b,
                        int n, regc_input *in)
{
    const decoder_config *c = m->cfg;
    int rc = regc_model_fill_lm_inputs(m, data, b, n, in);
    if (rc < 0 || (rc = decoder_fill_rope(m, &c->rope, regc_input_find(n, in, "rope_cos"),
                                          regc_input_find(n, in, "rope_sin"), b->seq)) < 0)
        return rc;
    return decoder_fill_rope(m, &c->rope_local, regc_input_find(n, in, "rope_local_cos"),
                             regc_input_find(n, in, "rope_local_sin"), b->seq);
}
