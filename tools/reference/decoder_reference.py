#!/usr/bin/env python3
"""PyTorch reference losses for regc's end-to-end training of decoder-only
Hugging Face families: Mistral, Qwen2, Qwen3, OLMo 2, Phi-3 (with LongRoPE
too), Llama with biases and with dynamic RoPE, Gemma 2, Gemma 3 (text),
Granite, SmolLM3, Phi, GPT-NeoX and StableLM.

For small models with deliberately odd sizes, this script builds the weights
and the token stream with the SAME counter-based RNG as common/rng.c, trains
10 steps of AdamW and writes the per-step losses to
tests/data/decoder_reference.json in reference_common's format:
tests/test_train_reference.c rebuilds each case from its recorded config.json
and "params" list alone, trains it with `regc train` and compares the losses.

Unlike llama_reference.py, the forward pass is not written out: it is
Transformers' own <Family>ForCausalLM (from_config, eager attention, eval
mode, dropout 0) called with the trained tensors through
torch.func.functional_call (strict: every parameter and buffer named; a tied
head reads the embedding), then the mean cross-entropy over all B*T
next-token targets. "params" is named_parameters() order (the state_dict's
less a tied head), names and shapes checked against what save_pretrained
writes; config.json is what save_pretrained writes for the family, with
"architectures" set, and the model is built from it. Per case the script
checks that a fresh model given the initial weights by load_state_dict has
the same loss on batch 0 and that every parameter takes a gradient.
Every family's embedding has padding_idx = pad_token_id, whose row takes no
gradient from the lookup (a tied head still updates it): the olmo2,
phi3_fused and gemma cases have that id in their batches (ignoring it moves
the olmo2 and phi3_fused losses by up to 1.7e-3 and 3e-4, gemma2_softcap's,
tied, by up to 5.4e-3, not at step 0).

Norm weights are drawn around 1 (NORM), except Gemma's (GEMMA_NORM, around
0): its RMSNorms scale by 1 + w, and Transformers initialises w at 0. A
case's "effects" are config changes whose float32 losses the script prints
the distance to (the feature must move the losses far past the fp32 noise
for the C test to see it); they are not recorded. Gemma 2's soft-caps
(0.5 on the scores, 2.0 on the logits) move gemma2_softcap's losses by up to
5.5e-3 and 1.2e-2; a window of 5 instead of T moves gemma2_window's by
0.17; in gemma3_text one RoPE theta for both layer types moves the losses by
9.2e-2 (1e6) or 1.2e-2 (1e4), a window of T instead of 6 by 9.1e-2.

What Transformers 5 does for Gemma, beyond Llama: the embedding output is
multiplied by sqrt(hidden_size), held as a float32 buffer (so float32-rounded,
also in the float64 copy) and cast to the weight's dtype; every RMSNorm
(also Gemma 3's per-head q/k norms, over head_dim before RoPE) computes
normalize(x) * (1 + w) in float32; a layer is x + post_norm(attn(pre_norm(x)))
then the same around the MLP (gelu_pytorch_tanh gate); the scores are scaled
by query_pre_attn_scalar**-0.5, Gemma 2 soft-caps them (cap * tanh(s / cap))
before adding the mask (Gemma 3's attention never passes its
attn_logit_softcapping on), and both soft-cap the logits before the loss.
layer_types defaults to sliding every layer but each 2nd (Gemma 2) or 6th
(Gemma 3, the sliding_window_pattern argument); a sliding layer keeps key j
for query i where i - sliding_window < j <= i. Gemma 3's rope_parameters has
one entry per layer type. pad_token_id defaults to 0 for both, and the head
is tied by default. Gemma 3's config.json also carries "_sliding_window_pattern".

Granite is Llama's layer with four multipliers: the embeddings times
embedding_multiplier, each attention and MLP output times
residual_multiplier before its residual add, the scores times
attention_multiplier (its whole scale), and the logits divided by
logits_scaling (regc multiplies by its float32 reciprocal).

SmolLM3 is Llama's layer in which the layers no_rope_layers marks 0 (by
default each no_rope_layer_interval-th) attend without rotating q and k;
with use_sliding_window and a sliding_window, layer_types (derived, when
absent, as sliding for exactly those layers) says which layers slide. Its
head is tied by default.

Phi runs attention and a plain MLP side by side from one LayerNorm: x +
attn(h) + mlp(h), every projection and the head with a bias; RoPE turns the
first int(head_dim * partial_rotary_factor) dimensions of each head, the
rest passing through; qk_layernorm adds LayerNorms over each head of q and k
before RoPE.

GPT-NeoX (Pythia) runs attention and a plain MLP side by side from two
LayerNorms of x (use_parallel_residual; else one after the other), its
fused query_key_value holding each head's q, k and v in turn, RoPE on the
first rotary_pct of each head at rotary_emb_base (Transformers 5 reads those
into rope_parameters), the exact GELU. Transformers 5 calls its head lm_head
in memory and saves it as embed_out.weight: "params" holds the saved name
(SAVED_AS), the forward the other.

StableLM is Llama's layer with LayerNorms, part of each head rotated
(partial_rotary_factor, 0.25 by default) and, with use_parallel_residual,
attention and the MLP side by side from one LayerNorm, summed as
(x + attn) + mlp.

The float64 runs (the noise floor) use a float64 copy of the model, keeping
the float32 casts Transformers writes into its RMSNorms, softmax and rotary
tables; they differ from the float32 losses by at most ~1.7e-7 relative. The
floor depends on the draw: Adam's first steps amplify float32 noise in
near-zero gradients, and OLMo 2 seeds gave 8e-8..8e-6 (Gemma 3's 7e-8..5e-5);
the seeds here are calm.

Run in a virtual environment with torch 2.x, transformers 5 (recorded with
5.24.0) and safetensors:

    python tools/reference/decoder_reference.py
    python tools/reference/decoder_reference.py --check-regc build/regc

The second checks a built regc against the JSON, rewriting nothing: per case
it writes config.json, the initial weights (float32 model.safetensors) and
the token file to a temporary directory, runs `regc train` with the C test's
flags for the case's steps (losses against the JSON's) and again for
CHECK_STEP steps with --save, loads that directory with
AutoModelForCausalLM.from_pretrained and compares its loss on batch
CHECK_STEP with regc's loss of that step (a constant rate: the first run's);
1e-5 relative, exit 1 past it. It prints how the saved config.json differs.
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from reference_common import (default_out, get_batch, init_params, make_tokens, run_case,
                              train, write_doc)

STEPS = 10
CHECK_STEP = 3  # --check-regc: the step whose loss the saved directory must give
RTOL = 1e-5
NORM, WEIGHT = (1.0, 0.2), (0.0, 0.1)  # (center, halfwidth) of norm weights, of the rest
GEMMA_NORM = (0.0, 0.2)  # Gemma's norms scale by 1 + w (Transformers initialises w at 0)
# parameters a family saves under another name than its module's: {in memory: saved}
SAVED_AS = {"gpt_neox": {"lm_head.weight": "embed_out.weight"}}
IN_MEMORY = {saved: name for names in SAVED_AS.values() for name, saved in names.items()}

# ---------------------------------------------------------------------------
# The cases: "config" holds the family's config arguments (the rest are
# Transformers' defaults); the other keys are reference_common's.
# ---------------------------------------------------------------------------
CASES = [
    # GQA 6 heads over 2 kv heads with head_dim 10 (heads * head_dim = 60 !=
    # 48), untied; the sliding window (64) is longer than the sequence.
    # 200 tokens with B*T = 24: batches at 0, 24, ..., 168, then 0 again.
    dict(name="mistral_gqa_window", model_type="mistral", seed=2101,
         config=dict(vocab_size=300, hidden_size=48, intermediate_size=100,
                     num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                     head_dim=10, max_position_embeddings=64, sliding_window=64,
                     rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
         batch=2, seq=12, lr=3e-3, weight_decay=0.01, n_tokens=200),
    # Qwen2's q/k/v biases, tied head, GQA, 3 layers, Qwen2.5's rope_theta.
    dict(name="qwen2_bias_tied", model_type="qwen2", seed=2202,
         config=dict(vocab_size=257, hidden_size=64, intermediate_size=150,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=32, tie_word_embeddings=True,
                     rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
         batch=3, seq=17, lr=2e-3, weight_decay=0.1, n_tokens=500,
         bf16=True),  # and the bf16 block (reference_common.bf16_record)
    # Per-head q/k RMSNorm over head_dim 16 (heads * head_dim = 64 != 40), no biases.
    dict(name="qwen3_head_dim", model_type="qwen3", seed=2303,
         config=dict(vocab_size=389, hidden_size=40, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, max_position_embeddings=32, attention_bias=False,
                     rms_norm_eps=1e-6),
         batch=2, seq=24, lr=2e-3, weight_decay=0.01, n_tokens=300),
    # attention_bias: biases on q, k, v AND o_proj; one kv head; tied head.
    dict(name="qwen3_bias_tied_mqa", model_type="qwen3", seed=2404,
         config=dict(vocab_size=311, hidden_size=56, intermediate_size=120,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                     head_dim=8, max_position_embeddings=16, attention_bias=True,
                     tie_word_embeddings=True),
         batch=2, seq=9, lr=4e-3, weight_decay=0.05, n_tokens=150),
    # Norms after attention and MLP (no pre-norms), q/k norms over the whole
    # projection, GQA, untied. pad_token_id 1 is OLMo 2's default: the
    # embedding's padding_idx, whose row takes no gradient (token 1 is in the
    # batches); eos moved into the vocabulary (the default 50279 is not).
    dict(name="olmo2_post_norm", model_type="olmo2", seed=2674,
         config=dict(vocab_size=271, hidden_size=48, intermediate_size=112,
                     num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
                     max_position_embeddings=32, pad_token_id=1, eos_token_id=270,
                     rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
         batch=2, seq=16, lr=3e-3, weight_decay=0.1, n_tokens=400, pad_check=True),
    # Fused qkv_proj and gate_up_proj, GQA, no sliding window. Phi-3's
    # pad_token_id is its eos (32000 < vocab 32064): here 5, in the batches.
    dict(name="phi3_fused_gqa", model_type="phi3", seed=2608,
         config=dict(vocab_size=293, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                     max_position_embeddings=32, original_max_position_embeddings=32,
                     sliding_window=None, eos_token_id=5, pad_token_id=5,
                     resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
         batch=3, seq=11, lr=2e-3, weight_decay=0.0, n_tokens=300, pad_check=True),
    # Multi-head, a sliding window longer than the sequence, tied, no pad id.
    dict(name="phi3_window_tied", model_type="phi3", seed=2707,
         config=dict(vocab_size=263, hidden_size=48, intermediate_size=80,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=64, original_max_position_embeddings=64,
                     sliding_window=48, eos_token_id=2, pad_token_id=None,
                     tie_word_embeddings=True),
         batch=2, seq=20, lr=5e-3, weight_decay=0.01, n_tokens=250),
    # LongRoPE (Phi3Config: the top-level original_max_position_embeddings,
    # 16, is the pretraining length): trained on 20 positions, past it, so
    # Transformers' forward rotates with the long factors; the attention
    # factor is derived from max_position_embeddings / 16 = 4.
    dict(name="phi3_longrope", model_type="phi3", seed=2909,
         config=dict(vocab_size=241, hidden_size=48, intermediate_size=72,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=64, original_max_position_embeddings=16,
                     sliding_window=None, eos_token_id=2, pad_token_id=None,
                     rope_scaling=dict(type="longrope",
                                       short_factor=[1.0, 1.02, 1.1, 1.3, 1.9, 2.6],
                                       long_factor=[1.1, 1.6, 2.9, 5.0, 9.5, 14.0])),
         batch=2, seq=20, lr=3e-3, weight_decay=0.01, n_tokens=250,
         effects=[("long_factor = short_factor", dict(rope_scaling=dict(
             type="longrope", short_factor=[1.0, 1.02, 1.1, 1.3, 1.9, 2.6],
             long_factor=[1.0, 1.02, 1.1, 1.3, 1.9, 2.6])))]),
    # Phi-4-mini's shape of RoPE (a Phi3ForCausalLM): LongRoPE on the first
    # 0.75 of each head's 16 dimensions (six factors each), trained past the
    # original length; GQA, tied, no pad id.
    dict(name="phi3_partial_longrope", model_type="phi3", seed=3011,
         config=dict(vocab_size=229, hidden_size=64, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=64, original_max_position_embeddings=16,
                     sliding_window=None, eos_token_id=2, pad_token_id=None,
                     tie_word_embeddings=True, partial_rotary_factor=0.75,
                     rope_scaling=dict(type="longrope",
                                       short_factor=[1.0, 1.05, 1.2, 1.5, 2.2, 3.0],
                                       long_factor=[1.2, 1.9, 3.1, 5.5, 9.0, 15.0])),
         batch=2, seq=20, lr=3e-3, weight_decay=0.01, n_tokens=250,
         effects=[("partial_rotary_factor 1 (lists of eight)", dict(
             partial_rotary_factor=1.0,
             rope_scaling=dict(type="longrope",
                               short_factor=[1.0, 1.05, 1.2, 1.5, 2.2, 3.0, 3.5, 4.0],
                               long_factor=[1.2, 1.9, 3.1, 5.5, 9.0, 15.0, 18.0, 20.0])))]),
    # Dynamic NTK scaling trained past max_position_embeddings (16 < 24):
    # Transformers' forward computes a larger base for 24 positions, in
    # float32 tensor arithmetic.
    dict(name="llama_dynamic", model_type="llama", seed=3001,
         config=dict(vocab_size=211, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=16,
                     rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=3.0)),
         batch=2, seq=24, lr=3e-3, weight_decay=0.01, n_tokens=250, past_max_pos=True,
         effects=[("rope_type default", dict(rope_parameters=dict(rope_type="default",
                                                                  rope_theta=10000.0)))]),
    # Biases on q, k, v, o (attention_bias) and gate, up, down (mlp_bias); GQA.
    dict(name="llama_biases", model_type="llama", seed=2808,
         config=dict(vocab_size=263, hidden_size=40, intermediate_size=90,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=64, attention_bias=True, mlp_bias=True,
                     rms_norm_eps=1e-5),
         batch=2, seq=40, lr=1.5e-3, weight_decay=0.05, n_tokens=400),
    # Gemma 2: sqrt(hidden) on the embedding, RMSNorms x * (1 + w) before
    # and after attention and MLP, gelu_pytorch_tanh, scores scaled by
    # query_pre_attn_scalar**-0.5 (24, not head_dim 16) and soft-capped
    # (cap * tanh(s / cap)) before the mask, the logits soft-capped before
    # the loss; GQA; layer_types alternate sliding/full (the config's
    # default); the window (32) is longer than the sequence; tied (Gemma's
    # default). The caps are small enough to matter with these small
    # weights (the real models' 50 and 30 would not). pad_token_id 0 is
    # Gemma's default: the embedding's padding_idx, in the batches.
    dict(name="gemma2_softcap", model_type="gemma2", seed=3110,
         config=dict(vocab_size=113, hidden_size=44, intermediate_size=92,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, query_pre_attn_scalar=24, max_position_embeddings=32,
                     sliding_window=32, attn_logit_softcapping=0.5,
                     final_logit_softcapping=2.0),
         batch=2, seq=14, lr=3e-3, weight_decay=0.01, n_tokens=300, pad_check=True,
         norm_init=GEMMA_NORM,
         effects=[("attn_logit_softcapping null", dict(attn_logit_softcapping=None)),
                  ("final_logit_softcapping null", dict(final_logit_softcapping=None)),
                  ("pad_token_id null", dict(pad_token_id=None))]),
    # Gemma 2 with a window (5) shorter than the sequence (12): layers 0 and 2
    # of 3 see only the last 5 positions (Transformers' sliding mask keeps
    # key j for query i where i - 5 < j <= i); no soft-capping; multi-head,
    # query_pre_attn_scalar = head_dim (10; heads * head_dim = 30 != 42).
    dict(name="gemma2_window", model_type="gemma2", seed=3222,
         config=dict(vocab_size=167, hidden_size=42, intermediate_size=70,
                     num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3,
                     head_dim=10, query_pre_attn_scalar=10, max_position_embeddings=32,
                     sliding_window=5, attn_logit_softcapping=None,
                     final_logit_softcapping=None),
         batch=3, seq=12, lr=3e-3, weight_decay=0.05, n_tokens=300, windowed=True,
         pad_check=True,
         norm_init=GEMMA_NORM,
         effects=[("sliding_window 12 (= T)", dict(sliding_window=12))]),
    # Gemma 3 text (Gemma3ForCausalLM): Gemma 2's layer plus q/k RMSNorms
    # (1 + w) over head_dim 12 before RoPE, and RoPE theta per layer type
    # (rope_parameters' full_attention 1e6, sliding_attention 1e4);
    # query_pre_attn_scalar 16 (not head_dim); the default layer pattern of
    # 6 (five sliding layers, then a full one) with a window (6) shorter than
    # the sequence (16); no soft-capping (Gemma 3's defaults); GQA; tied.
    dict(name="gemma3_text", model_type="gemma3_text", seed=3304,
         config=dict(vocab_size=151, hidden_size=40, intermediate_size=84,
                     num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=12, query_pre_attn_scalar=16, max_position_embeddings=32,
                     sliding_window=6, use_bidirectional_attention=False,
                     rope_parameters=dict(
                         full_attention=dict(rope_type="default", rope_theta=1000000.0),
                         sliding_attention=dict(rope_type="default", rope_theta=10000.0))),
         batch=2, seq=16, lr=3e-3, weight_decay=0.01, n_tokens=300, windowed=True,
         pad_check=True,
         norm_init=GEMMA_NORM,
         effects=[("rope_theta 1e6 for both", dict(rope_parameters=dict(
                       full_attention=dict(rope_type="default", rope_theta=1000000.0),
                       sliding_attention=dict(rope_type="default", rope_theta=1000000.0)))),
                  ("rope_theta 1e4 for both", dict(rope_parameters=dict(
                       full_attention=dict(rope_type="default", rope_theta=10000.0),
                       sliding_attention=dict(rope_type="default", rope_theta=10000.0)))),
                  ("sliding_window 16 (= T)", dict(sliding_window=16))]),
    # Granite: Llama's layer with the embeddings times embedding_multiplier,
    # each block's output times residual_multiplier before its residual add,
    # the scores times attention_multiplier (not head_dim**-0.5 = 0.289) and
    # the logits divided by logits_scaling; values none of which is a power
    # of two; GQA, biases on q, k, v, o; untied.
    dict(name="granite_multipliers", model_type="granite", seed=3506,
         config=dict(vocab_size=173, hidden_size=48, intermediate_size=88,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=32, attention_bias=True,
                     embedding_multiplier=4.5, residual_multiplier=0.37,
                     attention_multiplier=0.21, logits_scaling=2.5,
                     rope_parameters=dict(rope_type="default", rope_theta=10000000.0)),
         batch=2, seq=14, lr=3e-3, weight_decay=0.01, n_tokens=300,
         effects=[("embedding_multiplier 1", dict(embedding_multiplier=1.0)),
                  ("residual_multiplier 1", dict(residual_multiplier=1.0)),
                  ("attention_multiplier 1/sqrt(head_dim)",
                   dict(attention_multiplier=12 ** -0.5)),
                  ("logits_scaling 1", dict(logits_scaling=1.0))]),
    # SmolLM3: Llama's layer with RoPE left out of every 2nd layer
    # (no_rope_layer_interval; the config derives no_rope_layers), those
    # layers sliding (use_sliding_window; layer_types derived too) by a
    # window (5) shorter than the sequence (12); GQA; tied (SmolLM3's
    # default); pad_token_id 11 (the default 128004 is past this
    # vocabulary), in the batches; SmolLM3's rope_theta.
    dict(name="smollm3_nope_window", model_type="smollm3", seed=3405,
         config=dict(vocab_size=149, hidden_size=48, intermediate_size=96,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=32, no_rope_layer_interval=2,
                     use_sliding_window=True, sliding_window=5, pad_token_id=11,
                     rope_parameters=dict(rope_type="default", rope_theta=2000000.0)),
         batch=2, seq=12, lr=3e-3, weight_decay=0.01, n_tokens=300, windowed=True,
         pad_check=True,
         effects=[("RoPE on every layer", dict(no_rope_layers=[1, 1, 1, 1],
                                               layer_types=["sliding_attention"] * 4)),
                  ("use_sliding_window false", dict(use_sliding_window=False))]),
    # Phi: attention and a plain gelu_new MLP side by side from one
    # LayerNorm (x + attn(h) + mlp(h)), biases on every projection and on
    # the untied head, RoPE on the first half of each head's 12 dimensions
    # (partial_rotary_factor's default 0.5); GQA.
    dict(name="phi_parallel_partial", model_type="phi", seed=3607,
         config=dict(vocab_size=181, hidden_size=48, intermediate_size=104,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=32, resid_pdrop=0.0, embd_pdrop=0.0,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                          partial_rotary_factor=0.5)),
         batch=2, seq=14, lr=3e-3, weight_decay=0.01, n_tokens=300,
         effects=[("partial_rotary_factor 1", dict(rope_parameters=dict(
             rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0)))]),
    # Phi with per-head q/k LayerNorms (qk_layernorm, biases too), RoPE on
    # 4 of each head's 10 dimensions (0.4, as Phi-2 rotates 32 of 80), a
    # tied head (its bias still its own), pad_token_id 46 in the batches.
    dict(name="phi_qk_layernorm_tied", model_type="phi", seed=3708,
         config=dict(vocab_size=157, hidden_size=40, intermediate_size=88,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=32, qk_layernorm=True, tie_word_embeddings=True,
                     pad_token_id=46, resid_pdrop=0.0, embd_pdrop=0.0,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                          partial_rotary_factor=0.4)),
         batch=2, seq=12, lr=3e-3, weight_decay=0.01, n_tokens=300, pad_check=True,
         effects=[("partial_rotary_factor 0.8", dict(rope_parameters=dict(
             rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.8)))]),
    # GPT-NeoX: attention and the exact-GELU MLP side by side from two
    # LayerNorms of x, q/k/v fused head by head, RoPE on the first quarter
    # of each head's 16 dimensions (the default rotary_pct); biases.
    dict(name="gpt_neox_parallel", model_type="gpt_neox", seed=3809,
         config=dict(vocab_size=199, hidden_size=64, intermediate_size=136,
                     num_hidden_layers=3, num_attention_heads=4,
                     max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0),
         batch=2, seq=13, lr=3e-3, weight_decay=0.01, n_tokens=300,
         effects=[("use_parallel_residual false", dict(use_parallel_residual=False))]),
    # One block after the other (use_parallel_residual false), the older
    # spelling of RoPE (rotary_pct 0.5, rotary_emb_base 1000), no attention
    # biases (the MLP's stay); pad_token_id 11 (its embedding has no
    # padding index: the id's row trains like any other).
    dict(name="gpt_neox_sequential", model_type="gpt_neox", seed=3910,
         config=dict(vocab_size=173, hidden_size=48, intermediate_size=104,
                     num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=32, use_parallel_residual=False,
                     attention_bias=False, rotary_pct=0.5, rotary_emb_base=1000.0,
                     pad_token_id=11, hidden_dropout=0.0, attention_dropout=0.0),
         batch=2, seq=12, lr=3e-3, weight_decay=0.01, n_tokens=300,
         effects=[("rotary_pct 1", dict(rotary_pct=1.0))]),
    # StableLM: Llama's gated MLP and grouped-query attention with
    # LayerNorms (biases too), q/k/v biases (use_qkv_bias), RoPE on the
    # first quarter of each head's 16 dimensions (the default), one block
    # after the other (the default).
    dict(name="stablelm_qkv_bias", model_type="stablelm", seed=4011,
         config=dict(vocab_size=211, hidden_size=64, intermediate_size=120,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=32, use_qkv_bias=True, hidden_dropout=0.0),
         batch=2, seq=13, lr=3e-3, weight_decay=0.01, n_tokens=300,
         effects=[("partial_rotary_factor 0.5", dict(partial_rotary_factor=0.5))]),
    # StableLM side by side from one LayerNorm (use_parallel_residual, as
    # StableLM 2 12B), summed (x + a) + m, half of each head's 12
    # dimensions rotated, tied, pad_token_id 46 in the batches.
    dict(name="stablelm_parallel_tied", model_type="stablelm", seed=4112,
         config=dict(vocab_size=163, hidden_size=48, intermediate_size=96,
                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=32, use_parallel_residual=True,
                     tie_word_embeddings=True, pad_token_id=46, partial_rotary_factor=0.5,
                     hidden_dropout=0.0),
         batch=2, seq=12, lr=3e-3, weight_decay=0.01, n_tokens=300, pad_check=True,
         effects=[("partial_rotary_factor 1", dict(partial_rotary_factor=1.0))]),
]
for _c in CASES:
    _c.setdefault("steps", STEPS)

# (case name, dtype) -> the case's model; config.json dicts by case name
MODELS, CONFIGS = {}, {}


# ---------------------------------------------------------------------------
# config.json, the model and its parameter list
# ---------------------------------------------------------------------------
def hf_config(case):
    """config.json as save_pretrained writes it for the case's family, with
    "architectures" set, read back from the file."""
    if case["name"] not in CONFIGS:
        cfg = AutoConfig.for_model(case["model_type"], **copy.deepcopy(case["config"]))
        cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[case["model_type"]]]
        with tempfile.TemporaryDirectory() as tmp:
            cfg.save_pretrained(tmp)
            with open(os.path.join(tmp, "config.json")) as f:
                CONFIGS[case["name"]] = json.load(f)
    return CONFIGS[case["name"]]


def config_dir(config, path):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return path


def build_model(config):
    """<Family>ForCausalLM from the config.json dict: eager attention, eval mode."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = AutoConfig.from_pretrained(config_dir(config, tmp))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    assert type(model).__name__ == config["architectures"][0]
    assert model.config._attn_implementation == "eager"
    return model.to(torch.float32).eval()


def model_for(case, dtype):
    """The case's model, built once; a float64 copy for float64 parameters.
    One forward over the case's positions first, as training's first step
    does: dynamic and longrope RoPE set their frequencies for the length
    there and keep them (the buffers functional_call is then given)."""
    key = (case["name"], dtype)
    if key not in MODELS:
        if dtype == torch.float32:
            MODELS[key] = build_model(hf_config(case))
            with torch.no_grad():
                MODELS[key](input_ids=torch.zeros(1, case["seq"], dtype=torch.long))
        else:
            MODELS[key] = copy.deepcopy(model_for(case, torch.float32)).to(dtype)
    return MODELS[key]


def param_specs(case):
    """(name, shape, center, halfwidth) in named_parameters() order; the
    position in this list is the parameter's substream index t. The names and
    shapes must be those save_pretrained writes to model.safetensors."""
    model = model_for(case, torch.float32)
    norm = case.get("norm_init", NORM)
    saved_as = SAVED_AS.get(case["model_type"], {})
    specs = [(saved_as.get(name, name), tuple(p.shape)) + (norm if "norm" in name else WEIGHT)
             for name, p in model.named_parameters()]
    state = [saved_as.get(k, k) for k in model.state_dict()
             if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    assert [s[0] for s in specs] == state
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        saved = safetensors.torch.load_file(os.path.join(tmp, "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in saved.items()} == {s[0]: s[1] for s in specs}
    return specs


# ---------------------------------------------------------------------------
# The loss: Transformers' forward with our tensors
# ---------------------------------------------------------------------------
def model_loss(model, p, idx, targets):
    """Mean next-token cross-entropy of `model` with parameters p (all of
    them, strictly; a tied head reads the embedding through the tie)."""
    tensors = dict({IN_MEMORY.get(n, n): t for n, t in p.items()},
                   **{n: b for n, b in model.named_buffers()})
    logits = torch.func.functional_call(model, tensors, (idx,), {"use_cache": False},
                                        strict=True).logits
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def forward_loss(p, k, case):
    idx, targets = get_batch(case["tokens"], k, case["batch"], case["seq"])
    dtype = next(iter(p.values())).dtype
    return model_loss(model_for(case, dtype), p, idx, targets)


def untied_grads(case, init, idx, targets):
    """Batch 0's gradients of a tied embedding split in two: through the
    lookup and through the head (functional_call with the tie undone)."""
    model = model_for(case, torch.float32)
    emb = torch.tensor(init["model.embed_tokens.weight"], requires_grad=True)
    head = torch.tensor(init["model.embed_tokens.weight"], requires_grad=True)
    tensors = {n: torch.tensor(a) for n, a in init.items()}
    tensors.update({"model.embed_tokens.weight": emb, "lm_head.weight": head},
                   **{n: b for n, b in model.named_buffers()})
    logits = torch.func.functional_call(model, tensors, (idx,), {"use_cache": False},
                                        tie_weights=False, strict=True).logits
    F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    return emb.grad, head.grad


def print_effects(case, specs, losses):
    """How far each of the case's "effects" (config changes) moves its float32
    losses from the same start: the feature is visible to the C test only
    if this is well above the fp32 noise. Printed, not recorded."""
    init = init_params(case["seed"], specs)
    for label, overrides in case.get("effects", []):
        variant = dict(case, name="%s/%s" % (case["name"], label),
                       config=dict(case["config"], **overrides))
        variant["tokens"] = make_tokens(case["seed"], case["n_tokens"],
                                        hf_config(variant)["vocab_size"])
        other, _ = train(variant, init, forward_loss, torch.float32)
        diff = [abs(a - b) for a, b in zip(other, losses)]
        print("%-24s %s: losses move by up to %.1e (%.1e relative; step 0 %.1e)"
              % ("", label, max(diff), max(d / abs(b) for d, b in zip(diff, losses)), diff[0]))


def check_case(case, specs, config):
    """Batch 0's loss through functional_call equals a fresh model's, given
    the initial weights by load_state_dict; every parameter takes a gradient;
    a padding_idx row (pad_token_id) is among the inputs where the case says so."""
    torch.set_num_threads(1)
    init = init_params(case["seed"], specs)
    tokens = make_tokens(case["seed"], case["n_tokens"], config["vocab_size"])
    idx, targets = get_batch(tokens, 0, case["batch"], case["seq"])
    fresh = build_model(config)
    tied = fresh.config.tie_word_embeddings
    state = {IN_MEMORY.get(n, n): torch.from_numpy(a) for n, a in init.items()}
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    assert not unexpected and missing == (["lm_head.weight"] if tied else []), missing
    assert (fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight) == tied
    with torch.no_grad():
        logits = fresh(input_ids=idx).logits
        want = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1)).item()
    p = {n: torch.tensor(a, requires_grad=True) for n, a in init.items()}
    loss = model_loss(model_for(case, torch.float32), p, idx, targets)
    loss.backward()
    rel = abs(loss.item() - want) / abs(want)
    assert rel <= 1e-7, (case["name"], loss.item(), want)
    assert all(t.grad is not None and t.grad.abs().max() > 0 for t in p.values())
    pad, note = config.get("pad_token_id"), ""
    # GPT-NeoX's embedding takes no padding index
    assert fresh.get_input_embeddings().padding_idx == (
        None if case["model_type"] == "gpt_neox" else pad)
    if case.get("pad_check"):  # batch 0 has the pad id; its embedding row takes nothing
        assert pad is not None and (idx == pad).any(), "the pad id is not in batch 0"
        if tied:  # ... from the lookup: the head's gradient still reaches it
            lookup, head = untied_grads(case, init, idx, targets)
            assert lookup[pad].abs().max() == 0 and head[pad].abs().max() > 0
            assert torch.allclose(lookup + head, p["model.embed_tokens.weight"].grad,
                                  rtol=1e-5, atol=1e-9)
        else:
            assert p["model.embed_tokens.weight"].grad[pad].abs().max() == 0
        n = sum(int((get_batch(tokens, k, case["batch"], case["seq"])[0] == pad).sum())
                for k in range(case["steps"]))
        note = "; padding_idx %d, %d times in the inputs" % (pad, n)
    print("%-24s %s, %d params; batch 0: functional_call %.9f, fresh model %.9f (rel %.1e)%s"
          % (case["name"], config["architectures"][0], sum(a.size for a in init.values()),
             loss.item(), want, rel, note))


# ---------------------------------------------------------------------------
# --check-regc: regc trains the case; Transformers loads what it saves
# ---------------------------------------------------------------------------
def token_file_bytes(tokens):
    """llm.c's token file: 256 int32 header (magic, version, count), uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, len(tokens)
    return header.tobytes() + tokens.astype("<u2").tobytes()


def regc_losses(regc, rec, model_dir, tok_path, steps, extra=()):
    """`regc train` as tests/support/test_train_case.c runs it; the step losses."""
    cmd = [regc, "train", "--model", model_dir, "--data", tok_path, "--steps", str(steps),
           "--batch", str(rec["batch"]), "--seq", str(rec["seq"]), "--lr", repr(rec["lr"]),
           "--weight-decay", repr(rec["weight_decay"]), "--json", *rec["extra_args"], *extra]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        return None, (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:]
    reports = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    return [r["loss"] for r in reports if "step" in r and "loss" in r], None


def saved_loss(saved, rec, tokens):
    """Transformers' loss on batch CHECK_STEP of the directory regc saved,
    and how its config.json differs from the case's (None where it loads not)."""
    with open(os.path.join(saved, "config.json")) as f:
        cfg = json.load(f)
    want = rec["config"]
    diff = (["-" + k for k in want if k not in cfg] + ["+" + k for k in cfg if k not in want] +
            ["%s: %r" % (k, cfg[k]) for k in want if k in cfg and cfg[k] != want[k]])
    try:
        model = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    except Exception as e:  # reported, not raised: the other cases still run
        return None, diff + ["from_pretrained: %s: %s" % (type(e).__name__, e)]
    idx, targets = get_batch(tokens, CHECK_STEP, rec["batch"], rec["seq"])
    with torch.no_grad():
        logits = model(input_ids=idx).logits
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1)).item()
    return loss, diff


def check_regc(regc, rec):
    """Train one recorded case with regc: its losses against the JSON's, and
    Transformers' loss on batch CHECK_STEP of the directory --save writes
    after CHECK_STEP steps against regc's loss of that step. True if both agree."""
    assert not rec["extra_args"], "a schedule would change with --steps"
    specs = [(n, tuple(s), c, h) for n, s, c, h in rec["params"]]
    tokens = make_tokens(rec["seed"], rec["n_tokens"], rec["config"]["vocab_size"])
    tmp = tempfile.mkdtemp(prefix="decoder_check_")
    name, saved = rec["name"], os.path.join(tmp, "saved")
    try:
        model_dir = config_dir(rec["config"], os.path.join(tmp, "model"))
        state = {n: torch.from_numpy(a) for n, a in init_params(rec["seed"], specs).items()}
        safetensors.torch.save_file(state, os.path.join(model_dir, "model.safetensors"),
                                    metadata={"format": "pt"})
        tok_path = os.path.join(tmp, "tokens.bin")
        with open(tok_path, "wb") as f:
            f.write(token_file_bytes(tokens))
        losses, err = regc_losses(regc, rec, model_dir, tok_path, rec["steps"])
        if err is None:
            _, err = regc_losses(regc, rec, model_dir, tok_path, CHECK_STEP, ["--save", saved])
        if err is not None:
            print("%-24s FAIL: regc refuses it: %s" % (name, " ".join(err)))
            return False
        assert len(losses) == rec["steps"], "regc reported %d steps" % len(losses)
        got, diff = saved_loss(saved, rec, tokens)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    curve = max(abs(a - b) / abs(b) for a, b in zip(losses, rec["losses"]))
    want = losses[CHECK_STEP]
    rel = abs(got - want) / abs(want) if got is not None else float("inf")
    ok, shown = curve <= RTOL and rel <= RTOL, "%.9f" % got if got is not None else "-"
    print("%-24s %s: %d losses vs json max rel %.1e; step %d: regc %.9f, transformers on "
          "--save %s (rel %.1e)" % (name, "pass" if ok else "FAIL", len(losses), curve,
                                    CHECK_STEP, want, shown, rel))
    if diff:
        print("%-24s --save's config.json: %s" % ("", "; ".join(diff)))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "decoder_reference.json"))
    ap.add_argument("--check-regc", metavar="REGC",
                    help="check this regc binary against --out instead of writing it")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.check_regc:
        torch.set_num_threads(1)
        regc = os.path.abspath(args.check_regc)
        with open(args.out) as f:
            doc = json.load(f)
        results = [check_regc(regc, rec) for rec in doc["cases"]]
        print("%d of %d cases pass" % (sum(results), len(results)))
        sys.exit(0 if all(results) else 1)
    out_cases = []
    for case in CASES:
        cfg = case["config"]
        assert (case["seq"] <= cfg["max_position_embeddings"]) != bool(case.get("past_max_pos"))
        assert case["n_tokens"] >= case["batch"] * case["seq"] + 1
        # a window shorter than the sequence only where the case says so
        assert (cfg.get("sliding_window") is None or cfg["sliding_window"] > case["seq"]) != \
            bool(case.get("windowed"))
        specs, config = param_specs(case), hf_config(case)
        check_case(case, specs, config)
        out_cases.append(run_case(case, specs, config, forward_loss))
        print_effects(case, specs, out_cases[-1]["losses"])
    write_doc("tools/reference/decoder_reference.py (transformers %s)" % transformers.__version__,
              out_cases, args.out)


if __name__ == "__main__":
    main()
