#!/usr/bin/python3
"""PyTorch reference losses for regc's end-to-end GPT-2 training test.

For a few small GPT-2 shapes with deliberately odd sizes, this script builds
the weights and the token stream with the SAME counter-based RNG as
common/rng.c, trains 5 steps of AdamW in plain PyTorch with Hugging Face GPT-2
semantics, and writes the per-step losses to tests/data/gpt2_reference.json.
tests/test_gpt2_reference.c rebuilds the identical model in C, trains it with
`regc train` and compares the losses.

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
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# The counter-based RNG of common/rng.c, vectorised. Everything is uint64 with
# wraparound, exactly like C's unsigned arithmetic.
# ---------------------------------------------------------------------------
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix_int(z):
    """regc_rng_mix on a Python int (used for the scalar substream seeds)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix_np(z):
    """regc_rng_mix on a uint64 array (numpy wraps uint64 products mod 2^64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def rng_substream(seed, index):
    return mix_int(seed ^ mix_int(index + GOLDEN))


def rng_at(seed, n):
    """regc_rng_at(seed, i) for i = 0 .. n-1, as a uint64 array."""
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (i + np.uint64(1)) * np.uint64(GOLDEN)
    return mix_np(z)


def rng_fill_uniform(n, seed, center, halfwidth):
    """regc_rng_fill_uniform, bit for bit: every operation rounds to float32
    exactly where the C code does (the step is computed in double from the
    float32 halfwidth, then rounded once)."""
    k = (rng_at(seed, n) >> np.uint64(40)).astype(np.int32) - np.int32(8388608)
    step = np.float32(np.float64(np.float32(halfwidth)) / 8388608.0)
    t = k.astype(np.float32) * step  # float32 * float32 -> float32
    return np.float32(center) + t    # float32 + float32 -> float32


# ---------------------------------------------------------------------------
# The cases: small, odd shapes. n_inner None means HF's default 4 * n_embd
# (written to config.json as null, as real GPT-2 configs do).
# ---------------------------------------------------------------------------
CASES = [
    # Tiny; 35 tokens with B*T = 10 gives batches at 0, 10, 20, 0, 10: wraps.
    dict(name="tiny_wrap", seed=1001, vocab_size=257, n_positions=16, n_embd=48, n_layer=2,
         n_head=2, n_inner=None, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
         batch=2, seq=5, lr=3e-3, weight_decay=0.0, n_tokens=35),
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
]
STEPS = 5
TOKEN_STREAM = 1000000  # substream index of the token data (far from any parameter's)


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


def init_params(case):
    """Name -> float32 numpy array, filled exactly as the C test fills them."""
    params = {}
    for t, (name, shape, center, halfwidth) in enumerate(param_specs(case)):
        n = int(np.prod(shape))
        values = rng_fill_uniform(n, rng_substream(case["seed"], t), center, halfwidth)
        params[name] = values.reshape(shape)
    return params


def make_tokens(case):
    seed = rng_substream(case["seed"], TOKEN_STREAM)
    return (rng_at(seed, case["n_tokens"]) % np.uint64(case["vocab_size"])).astype(np.int64)


def batch_start(k, n_tokens, bt):
    """llm.c's DataLoader order, replayed literally: advance by B*T and go
    back to 0 when the next batch (plus its shifted target) would not fit."""
    p = 0
    for _ in range(k):
        p += bt
        if p + bt + 1 > n_tokens:
            p = 0
    return p


def get_batch(tokens, k, B, T):
    p = batch_start(k, len(tokens), B * T)
    chunk = torch.from_numpy(tokens[p:p + B * T + 1])
    return chunk[:-1].view(B, T), chunk[1:].view(B, T)


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


def forward_loss(p, idx, targets, case):
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


def train(case, init, tokens, dtype):
    """Losses of STEPS AdamW steps, each recorded before its update."""
    p = {name: torch.tensor(a, dtype=dtype, requires_grad=True) for name, a in init.items()}
    # One parameter group over everything: decay applies to norms and biases
    # too, which is what regc's optimizer does.
    opt = torch.optim.AdamW(list(p.values()), lr=case["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=case["weight_decay"])
    losses = []
    for k in range(STEPS):
        idx, targets = get_batch(tokens, k, case["batch"], case["seq"])
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(p, idx, targets, case)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses


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
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "..", "tests", "data", "gpt2_reference.json")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.normpath(default_out))
    args = ap.parse_args()

    torch.manual_seed(0)  # nothing here draws from torch's RNG; belt and braces
    torch.set_num_threads(1)  # the same summation order on every machine
    out_cases = []
    for case in CASES:
        assert case["n_embd"] % case["n_head"] == 0 and case["seq"] <= case["n_positions"]
        assert case["n_tokens"] >= case["batch"] * case["seq"] + 1
        init = init_params(case)
        tokens = make_tokens(case)
        param_sum = float(sum(np.sum(a, dtype=np.float64) for a in init.values()))
        losses = train(case, init, tokens, torch.float32)
        # The same run in float64 from the same float32 start: how far float32
        # rounding alone moves the losses (a floor for any fp32 comparison).
        losses64 = train(case, init, tokens, torch.float64)
        noise = max(abs(a - b) / abs(b) for a, b in zip(losses, losses64))
        starts = [batch_start(k, case["n_tokens"], case["batch"] * case["seq"]) for k in range(STEPS)]
        n_params = sum(a.size for a in init.values())
        print("%-22s V=%d L=%d C=%d H=%d I=%d B=%d T=%d params=%d batches at %s" %
              (case["name"], case["vocab_size"], case["n_layer"], case["n_embd"], case["n_head"],
               inner_size(case), case["batch"], case["seq"], n_params, starts))
        print("%-22s losses %s  fp32 vs fp64 max rel %.1e" %
              ("", " ".join("%.6f" % x for x in losses), noise))
        out_cases.append({
            "name": case["name"],
            "seed": case["seed"],
            "config": hf_config(case),
            "batch": case["batch"],
            "seq": case["seq"],
            "steps": STEPS,
            "lr": case["lr"],
            "weight_decay": case["weight_decay"],
            "n_tokens": case["n_tokens"],
            "param_sum": param_sum,
            "losses": losses,
            "losses_float64": losses64,
            "fp32_vs_fp64_max_rel": noise,
        })
    doc = {
        "generator": "tools/reference/gpt2_reference.py",
        "torch": torch.__version__,
        "cases": out_cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)  # repr floats: full round-trip precision
        f.write("\n")
    print("wrote %s (%d cases)" % (args.out, len(out_cases)))


if __name__ == "__main__":
    main()
