#!/usr/bin/python3
"""PyTorch reference losses for regc's end-to-end BERT (masked LM) training test.

For a few small BERT shapes with deliberately odd sizes, this script builds the
weights and the token stream with the SAME counter-based RNG as common/rng.c,
masks each batch with regc's rule (below), trains 5 steps of AdamW in plain
PyTorch with Hugging Face BertForMaskedLM semantics, and writes the per-step
losses to tests/data/bert_reference.json. tests/test_train_reference.c rebuilds
the identical model in C, trains it with `regc train --seed <mask seed>` and
compares the losses (reference_common.py holds the parts every architecture
shares).

Run with Debian's python3 (torch + numpy):  /usr/bin/python3 tools/reference/bert_reference.py

Nothing here imports transformers: the forward pass is written out (post-LN
encoder layers, exact erf GELU, bidirectional attention scaled by 1/sqrt(D),
the prediction head's dense + GELU + LayerNorm, the decoder tied to the word
embeddings or not, its bias cls.predictions.bias); it matches HF's
BertForMaskedLM trained with dropout 0, all-ones attention mask, token type 0,
HF's word embedding has padding_idx = pad_token_id (0 here), which gives the
[PAD] row no gradient from the lookup, and so does regc's: the recorded
losses model it, and the script prints what leaving it out would change
("padding_idx effect").

The masking rule (models/bert.c): batch k takes its B x T input tokens in
llm.c's order; position i = b*T + t is masked when
    regc_rng_at(regc_rng_substream(mask_seed, k), i) >> 40  <  2516583
(the integers below 0.15 * 2^24). A masked input becomes [MASK] and its target
the original token; the others' targets are -1 (ignored). A batch with no
masked position masks position 0. [MASK] is config's mask_token_id, else 103
when vocab_size > 103, else vocab_size - 1.

Noise floor: the same runs in float64 differ from the float32 losses by at
most ~1.3e-7 relative (recorded per case as fp32_vs_fp64_max_rel), while the C
test allows 1e-5. Semantic slips move the losses by more than that in at least
one case (measured in float64 when the cases were chosen): the tanh GELU
instead of erf 4e-6..5e-5, a 10x epsilon up to 8e-5 (untied_eps1e-5), lr off by
1% 9e-5..9e-4, another mask seed 6e-2..4e-1. HF's padding_idx moves them by at
most 9e-6, below the tolerance: the losses cannot see that difference, so
tests/test_bert_frontend.c checks the graph's padding_idx itself.
"""

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F

from reference_common import (default_out, get_batch, init_params, make_tokens, rng_at,
                              rng_substream, run_case, train, write_doc)

MASK_BELOW = 2516583  # the integers below 0.15 * 2^24 = 2516582.4

# ---------------------------------------------------------------------------
# The cases: small, odd shapes. mask_token_id None means the default rule.
# ---------------------------------------------------------------------------
CASES = [
    # Tiny; 35 tokens with B*T = 10 gives batches at 0, 10, 20, 0, 10: wraps.
    # Ten positions a batch: some batches mask nothing and fall back to (0, 0).
    dict(name="tiny_wrap", seed=1001, mask_seed=5, vocab_size=257, hidden_size=48,
         num_hidden_layers=2, num_attention_heads=2, intermediate_size=100,
         max_position_embeddings=16, type_vocab_size=2, layer_norm_eps=1e-12,
         tie_word_embeddings=True, mask_token_id=None,
         batch=2, seq=5, lr=3e-3, weight_decay=0.0, n_tokens=35,
         bf16=True),  # and the bf16 block (reference_common.bf16_record)
    # Untied decoder, explicit [MASK] id, three token types, eps 1e-5, weight decay.
    dict(name="untied_eps1e-5", seed=20240520, mask_seed=1337, vocab_size=383, hidden_size=72,
         num_hidden_layers=3, num_attention_heads=6, intermediate_size=200,
         max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-5,
         tie_word_embeddings=False, mask_token_id=7,
         batch=3, seq=17, lr=2e-3, weight_decay=0.1, n_tokens=500),
    # A vocabulary below 103 ([MASK] = vocab - 1), T equal to the positions.
    dict(name="small_vocab_full_context", seed=77, mask_seed=42, vocab_size=90, hidden_size=36,
         num_hidden_layers=2, num_attention_heads=3, intermediate_size=61,
         max_position_embeddings=20, type_vocab_size=1, layer_norm_eps=1e-7,
         tie_word_embeddings=True, mask_token_id=None,
         batch=4, seq=20, lr=1e-3, weight_decay=0.01, n_tokens=1000),
    # Deepest; 180 tokens with B*T = 58 gives 0, 58, 116, 0, 58: wraps.
    dict(name="deep_wrap", seed=31337, mask_seed=9, vocab_size=500, hidden_size=64,
         num_hidden_layers=5, num_attention_heads=4, intermediate_size=257,
         max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12,
         tie_word_embeddings=True, mask_token_id=None,
         batch=2, seq=29, lr=1.5e-3, weight_decay=0.05, n_tokens=180),
]

PAD_ID = 0  # BertConfig's pad_token_id: the word embedding's padding_idx


def mask_id(case):
    if case["mask_token_id"] is not None:
        return case["mask_token_id"]
    return 103 if case["vocab_size"] > 103 else case["vocab_size"] - 1


def param_specs(case):
    """(name, shape, center, halfwidth) in BertForMaskedLM's state_dict order;
    the position in this list is the parameter's substream index t."""
    V, P, C = case["vocab_size"], case["max_position_embeddings"], case["hidden_size"]
    I, TV = case["intermediate_size"], case["type_vocab_size"]
    norm, bias, weight = (1.0, 0.2), (0.0, 0.05), (0.0, 0.1)
    e = "bert.embeddings."
    specs = [(e + "word_embeddings.weight", (V, C), *weight),
             (e + "position_embeddings.weight", (P, C), *weight),
             (e + "token_type_embeddings.weight", (TV, C), *weight),
             (e + "LayerNorm.weight", (C,), *norm),
             (e + "LayerNorm.bias", (C,), *bias)]
    for l in range(case["num_hidden_layers"]):
        h = "bert.encoder.layer.%d." % l
        for proj in ("query", "key", "value"):
            specs += [(h + "attention.self.%s.weight" % proj, (C, C), *weight),  # [out, in]
                      (h + "attention.self.%s.bias" % proj, (C,), *bias)]
        specs += [
            (h + "attention.output.dense.weight", (C, C), *weight),
            (h + "attention.output.dense.bias", (C,), *bias),
            (h + "attention.output.LayerNorm.weight", (C,), *norm),
            (h + "attention.output.LayerNorm.bias", (C,), *bias),
            (h + "intermediate.dense.weight", (I, C), *weight),
            (h + "intermediate.dense.bias", (I,), *bias),
            (h + "output.dense.weight", (C, I), *weight),
            (h + "output.dense.bias", (C,), *bias),
            (h + "output.LayerNorm.weight", (C,), *norm),
            (h + "output.LayerNorm.bias", (C,), *bias),
        ]
    # BertLMPredictionHead registers its own bias before its submodules.
    specs += [("cls.predictions.bias", (V,), *bias),
              ("cls.predictions.transform.dense.weight", (C, C), *weight),
              ("cls.predictions.transform.dense.bias", (C,), *bias),
              ("cls.predictions.transform.LayerNorm.weight", (C,), *norm),
              ("cls.predictions.transform.LayerNorm.bias", (C,), *bias)]
    if not case["tie_word_embeddings"]:
        specs.append(("cls.predictions.decoder.weight", (V, C), *weight))
    return specs


# ---------------------------------------------------------------------------
# Masking, exactly as models/bert.c's fill_inputs
# ---------------------------------------------------------------------------
def masked_batch(case, k):
    """Batch k's (input_ids, labels), both [B, T] int64."""
    B, T = case["batch"], case["seq"]
    idx, _ = get_batch(case["tokens"], k, B, T)  # the inputs, not the shifted targets
    u = rng_at(rng_substream(case["mask_seed"], k), B * T)
    masked = torch.from_numpy((u >> np.uint64(40)) < np.uint64(MASK_BELOW)).view(B, T)
    if not masked.any():
        masked[0, 0] = True
    labels = torch.where(masked, idx, torch.full_like(idx, -1))
    inputs = torch.where(masked, torch.full_like(idx, mask_id(case)), idx)
    return inputs, labels


# ---------------------------------------------------------------------------
# BERT forward, Hugging Face semantics (BertForMaskedLM, dropout 0)
# ---------------------------------------------------------------------------
def self_attention(x, p, h, case):
    B, T, C = x.shape
    H = case["num_attention_heads"]
    D = C // H

    def heads(name):
        y = F.linear(x, p[h + "attention.self.%s.weight" % name], p[h + "attention.self.%s.bias" % name])
        return y.view(B, T, H, D).permute(0, 2, 1, 3)  # [B, H, T, D]

    q, k, v = heads("query"), heads("key"), heads("value")
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)  # [B, H, T, T]
    probs = torch.softmax(scores, dim=-1)  # no mask: every position sees every other
    y = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(B, T, C)
    return y


def forward_loss(p, k, case):
    idx, labels = masked_batch(case, k)
    B, T = idx.shape
    C, eps = case["hidden_size"], case["layer_norm_eps"]
    e = "bert.embeddings."
    word = F.embedding(idx, p[e + "word_embeddings.weight"],
                       padding_idx=case.get("padding_idx", PAD_ID))
    types = torch.zeros(B, T, dtype=torch.long)
    x = word + F.embedding(types, p[e + "token_type_embeddings.weight"])
    x = x + F.embedding(torch.arange(T), p[e + "position_embeddings.weight"])  # [B, T, C]
    x = F.layer_norm(x, (C,), p[e + "LayerNorm.weight"], p[e + "LayerNorm.bias"], eps)
    for l in range(case["num_hidden_layers"]):
        h = "bert.encoder.layer.%d." % l
        a = self_attention(x, p, h, case)
        a = F.linear(a, p[h + "attention.output.dense.weight"], p[h + "attention.output.dense.bias"])
        x = F.layer_norm(a + x, (C,), p[h + "attention.output.LayerNorm.weight"],
                         p[h + "attention.output.LayerNorm.bias"], eps)
        m = F.gelu(F.linear(x, p[h + "intermediate.dense.weight"], p[h + "intermediate.dense.bias"]))
        m = F.linear(m, p[h + "output.dense.weight"], p[h + "output.dense.bias"])
        x = F.layer_norm(m + x, (C,), p[h + "output.LayerNorm.weight"],
                         p[h + "output.LayerNorm.bias"], eps)
    t = "cls.predictions.transform."
    x = F.gelu(F.linear(x, p[t + "dense.weight"], p[t + "dense.bias"]))
    # Under autocast x is bfloat16 here, which torch 1.13's layer_norm refuses
    # next to float32 weights; the norm runs in the weights' dtype (a no-op
    # without autocast), as regc's norms stay float32.
    x = x.to(p[t + "LayerNorm.weight"].dtype)
    x = F.layer_norm(x, (C,), p[t + "LayerNorm.weight"], p[t + "LayerNorm.bias"], eps)
    decoder = (p[e + "word_embeddings.weight"] if case["tie_word_embeddings"]
               else p["cls.predictions.decoder.weight"])
    logits = F.linear(x, decoder, p["cls.predictions.bias"])  # [B, T, V]
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1)


def hf_config(case):
    """The config.json the C test writes (the fields HF's BertConfig reads).
    Dropouts are 0 because regc does not apply dropout in training."""
    cfg = {
        "model_type": "bert",
        "architectures": ["BertForMaskedLM"],
        "vocab_size": case["vocab_size"],
        "hidden_size": case["hidden_size"],
        "num_hidden_layers": case["num_hidden_layers"],
        "num_attention_heads": case["num_attention_heads"],
        "intermediate_size": case["intermediate_size"],
        "max_position_embeddings": case["max_position_embeddings"],
        "type_vocab_size": case["type_vocab_size"],
        "layer_norm_eps": case["layer_norm_eps"],
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "tie_word_embeddings": case["tie_word_embeddings"],
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "pad_token_id": PAD_ID,
    }
    if case["mask_token_id"] is not None:
        cfg["mask_token_id"] = case["mask_token_id"]
    return cfg


def padding_idx_effect(case, specs):
    """Max relative loss change from HF's padding_idx on the [PAD] row."""
    init = init_params(case["seed"], specs)
    c = dict(case, tokens=make_tokens(case["seed"], case["n_tokens"], case["vocab_size"]))
    torch.set_num_threads(1)
    plain, _ = train(dict(c, padding_idx=None), init, forward_loss, torch.float64)
    hf, _ = train(c, init, forward_loss, torch.float64)
    return max(abs(a - b) / abs(b) for a, b in zip(plain, hf))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "bert_reference.json"))
    args = ap.parse_args()
    out_cases = []
    for case in CASES:
        assert case["hidden_size"] % case["num_attention_heads"] == 0
        assert case["seq"] <= case["max_position_embeddings"]
        assert case["n_tokens"] >= case["batch"] * case["seq"] + 1
        specs = param_specs(case)
        out_cases.append(run_case(case, specs, hf_config(case), forward_loss,
                                  extra_args=("--seed", str(case["mask_seed"]))))
        print("%-24s [MASK] %d, padding_idx effect %.1e" %
              ("", mask_id(case), padding_idx_effect(case, specs)))
    write_doc("tools/reference/bert_reference.py", out_cases, args.out)


if __name__ == "__main__":
    main()
