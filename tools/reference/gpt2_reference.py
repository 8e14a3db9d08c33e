#!/usr/bin/python3
"""PyTorch reference losses for regc's end-to-end GPT-2 training test.

For a few small GPT-2 shapes with deliberately odd sizes, this script builds
the weights and the token stream with the SAME counter-based RNG as
common/rng.c, trains 5 steps of AdamW in plain PyTorch with Hugging Face GPT-2
semantics, and writes the per-step losses to tests/data/gpt2_reference.json.
tests/test_train_reference.c rebuilds the identical model in C, trains it with
`regc train` and compares the losses (reference_common.py holds the parts
every architecture shares).

Run with Debian's python3 (torch + numpy):  /usr/bin/python3 tools/reference/gpt2_reference.py

Nothing here imports transformers: the forward pass is written out so that
every choice (Conv1D layout, gelu_new, the attention scale, the causal mask,
tied head) is visible; it matches HF's GPT2LMHeadModel trained with dropout 0.

Noise floor: the same runs in float64 differ from the float32 losses by at
most ~1.5e-7 relative (recorded per case as fp32_vs_fp64_max_rel), while the
C test allows 1e-5. Semantic slips move the losses by more than that in at
least one case (measured when the cases were chosen): ignoring the weight
decay 7e-5..9e-5, the exact erf GELU instead of gelu_new 2e-5..5e-5, a 10x
epsilon 1e-5..6e-4, lr off by 1% 4e-5..8e-4, another batch order 4e-2..1e-1.
"""

import argparse
import math

import torch
import torch.nn.functional as F

from reference_common import default_out, get_batch, run_case, write_doc

# ---------------------------------------------------------------------------
# The cases: small, odd shapes. n_inner None means HF's default 4 * n_embd
# (written to config.json as null, as real GPT-2 configs do).
# ---------------------------------------------------------------------------
CASES = [
    # Tiny; 35 tokens with B*T = 10 gives batches at 0, 10, 20, 0, 10: wraps.
    dict(name="tiny_wrap", seed=1001, vocab_size=257, n_positions=16, n_embd=48, n_layer=2,
         n_head=2, n_inner=None, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
         batch=2, seq=5, lr=3e-3, weight_decay=0.0, n_tokens=35,
         bf16=True),  # and the bf16 block (reference_common.bf16_record)
    # Untied head, n_inner unrelated to 4*C, nonzero weight decay.
    dict(name="untied_odd_inner", seed=20240520, vocab_size=383, n_positions=40, n_embd=72,
         n_layer=3, n_head=6, n_inner=200, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
         batch=3, seq=17, lr=2e-3, weight_decay=0.1, n_tokens=500),
    # Epsilon 1e-6, T equal to n_positions, eight heads.
    dict(name="eps1e-6_full_context", seed=77, vocab_size=599, n_positions=33, n_embd=96,
         n_layer=4, n_head=8, n_inner=311, layer_norm_epsilon=1e-6, tie_word_embeddings=True,
         batch=4, seq=33, lr=1e-3, weight_decay=0.01, n_tokens=1000),
    # Deepest and widest; 180 tokens with B*T = 58 gives 0, 58, 116, 0, 58: wraps.
    dict(name="deep_wrap", seed=31337, vocab_size=500, n_positions=64, n_embd=128, n_layer=6,
         n_head=4, n_inner=512, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
         batch=2, seq=29, lr=1.5e-3, weight_decay=0.05, n_tokens=180),
    # The trainer's schedule, clipping and accumulation over 10 steps: a
    # cosine with 3 warmup steps, norms clipped to 0.5 (every step clips),
    # two micro-batches per step.
    dict(name="cosine_clip_accum2", seed=4242, vocab_size=311, n_positions=32, n_embd=64,
         n_layer=2, n_head=4, n_inner=None, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
         batch=2, seq=11, lr=4e-3, weight_decay=0.02, n_tokens=600, steps=10,
         lr_scheduler_type="cosine", warmup_steps=3, max_grad_norm=0.5,
         gradient_accumulation_steps=2),
    # A linear decay whose warmup comes from a ratio (ceil(0.25 * 10) = 3),
    # clipping at a norm some steps stay under, three micro-batches that wrap.
    dict(name="linear_ratio_accum3", seed=9090, vocab_size=263, n_positions=24, n_embd=48,
         n_layer=3, n_head=3, n_inner=130, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
         batch=3, seq=7, lr=3e-3, weight_decay=0.0, n_tokens=400, steps=10,
         lr_scheduler_type="linear", warmup_ratio=0.25, max_grad_norm=2.0,
         gradient_accumulation_steps=3),
    # Transformers' weight-decay groups: biases and the LayerNorms undecayed,
    # a decay large enough that decaying them too moves the losses by ~1e-3.
    dict(name="decay_groups", seed=5150, vocab_size=301, n_positions=24, n_embd=64, n_layer=2,
         n_head=4, n_inner=None, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
         batch=2, seq=13, lr=1e-2, weight_decay=0.5, n_tokens=300, steps=8,
         weight_decay_params="not_bias_norm", layernorm_modules=r"(^|\.)ln_(1|2|f)\."),
]
def inner_size(case):
    return case["n_inner"] if case["n_inner"] is not None else 4 * case["n_embd"]


def param_specs(case):
    """(name, shape, center, halfwidth) in GPT-2 order; the position in this
    list is the parameter's substream index t."""
    V, P, C, I = case["vocab_size"], case["n_positions"], case["n_embd"], inner_size(case)
    norm, bias, weight = (1.0, 0.2), (0.0, 0.05), (0.0, 0.1)
    specs = [("transformer.wte.weight", (V, C), *weight),
             ("transformer.wpe.weight", (P, C), *weight)]
    for l in range(case["n_layer"]):
        h = "transformer.h.%d." % l
        specs += [
            (h + "ln_1.weight", (C,), *norm),
            (h + "ln_1.bias", (C,), *bias),
            (h + "attn.c_attn.weight", (C, 3 * C), *weight),  # Conv1D: [in, out]
            (h + "attn.c_attn.bias", (3 * C,), *bias),
            (h + "attn.c_proj.weight", (C, C), *weight),
            (h + "attn.c_proj.bias", (C,), *bias),
            (h + "ln_2.weight", (C,), *norm),
            (h + "ln_2.bias", (C,), *bias),
            (h + "mlp.c_fc.weight", (C, I), *weight),
            (h + "mlp.c_fc.bias", (I,), *bias),
            (h + "mlp.c_proj.weight", (I, C), *weight),
            (h + "mlp.c_proj.bias", (C,), *bias),
        ]
    specs += [("transformer.ln_f.weight", (C,), *norm),
              ("transformer.ln_f.bias", (C,), *bias)]
    if not case["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (V, C), *weight))  # nn.Linear: [out, in]
    return specs


# ---------------------------------------------------------------------------
# GPT-2 forward, Hugging Face semantics (GPT2LMHeadModel, dropout 0)
# ---------------------------------------------------------------------------
def conv1d(x, w, b):
    """HF Conv1D: y = x @ W + b with W stored [in, out] (addmm as HF does)."""
    shape = x.shape[:-1] + (w.shape[1],)
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(shape)


def gelu_new(x):
    """HF's "gelu_new": the tanh approximation used by GPT-2."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def attention(x, p, h, case):
    B, T, C = x.shape
    H = case["n_head"]
    D = C // H
    qkv = conv1d(x, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])  # [B, T, 3C]
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
    k = k.view(B, T, H, D).transpose(1, 2)
    v = v.view(B, T, H, D).transpose(1, 2)
    w = torch.matmul(q, k.transpose(-1, -2))  # [B, H, T, T]
    w = w / torch.full([], D ** 0.5, dtype=w.dtype)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
    w = torch.softmax(w, dim=-1)
    y = torch.matmul(w, v)  # [B, H, T, D]
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return conv1d(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])  # [B, T, C]


def forward_loss(p, k, case):
    idx, targets = get_batch(case["tokens"], k, case["batch"], case["seq"])
    B, T = idx.shape
    C, eps = case["n_embd"], case["layer_norm_epsilon"]
    pos = torch.arange(T)
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][pos]  # [B, T, C]
    for l in range(case["n_layer"]):
        h = "transformer.h.%d." % l
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        x = x + attention(a, p, h, case)
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = gelu_new(conv1d(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]))  # [B, T, I]
        x = x + conv1d(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])  # [B, T, C]
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if case["tie_word_embeddings"] else p["lm_head.weight"]
    logits = F.linear(x, head)  # [B, T, V]
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def hf_config(case):
    """The config.json the C test writes (the fields HF's GPT2Config reads).
    Dropouts are 0 because regc does not apply dropout in training."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": case["vocab_size"],
        "n_positions": case["n_positions"],
        "n_embd": case["n_embd"],
        "n_layer": case["n_layer"],
        "n_head": case["n_head"],
        "n_inner": case["n_inner"],
        "layer_norm_epsilon": case["layer_norm_epsilon"],
        "activation_function": "gelu_new",
        "tie_word_embeddings": case["tie_word_embeddings"],
        "attn_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "resid_pdrop": 0.0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "gpt2_reference.json"))
    args = ap.parse_args()
    out_cases = []
    for case in CASES:
        assert case["n_embd"] % case["n_head"] == 0 and case["seq"] <= case["n_positions"]
        assert case["n_tokens"] >= case["batch"] * case["seq"] + 1
        out_cases.append(run_case(case, param_specs(case), hf_config(case), forward_loss))
    write_doc("tools/reference/gpt2_reference.py", out_cases, args.out)


if __name__ == "__main__":
    main()
