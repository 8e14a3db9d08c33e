#!/usr/bin/python3
"""PyTorch reference losses for regc's end-to-end Llama training test.

For a few small Llama shapes with deliberately odd sizes, this script builds
the weights and the token stream with the SAME counter-based RNG as
common/rng.c, trains 5 steps of AdamW in plain PyTorch with Hugging Face
Llama semantics, and writes the per-step losses to
tests/data/llama_reference.json. tests/test_train_reference.c rebuilds the
identical model in C from the recorded config.json, trains it with
`regc train` and compares the losses (reference_common.py holds the parts
every architecture shares).

Run with Debian's python3 (torch + numpy):  /usr/bin/python3 tools/reference/llama_reference.py

Nothing here imports transformers: the forward pass is written out so that
every choice is visible; it matches HF's LlamaForCausalLM (eager attention,
dropout 0): LlamaRMSNorm in float32 as x * rsqrt(mean(x^2) + eps), then the
weight; rotary tables computed in float32 (inv_freq = 1 / theta^(2j/D),
rescaled as _compute_llama3_parameters does for a case with llama3
rope_parameters, angle = t * inv_freq) in the rotate_half convention; repeat_kv for grouped
query attention; the 1/sqrt(head_dim) scale; a causal softmax in float32;
the SwiGLU MLP down(silu(gate(x)) * up(x)); a tied or untied head.

The float64 runs (the noise floor) keep the norms in float64 instead of HF's
cast to float32 and use the same float32 rotary tables HF would, cast up.

Noise floor: the float64 runs differ from the float32 losses by at most
~3.4e-7 relative (recorded per case as fp32_vs_fp64_max_rel), while the C
test allows 1e-5. Semantic slips move the losses by more than that in every
case (measured when the cases were chosen): GPT-J's interleaved rotary pairs
instead of rotate_half 6e-4..3e-3, rope_theta x10 2e-4..1e-3, no rotary at
all 1e-3..6e-3, kv heads tiled (h % Hkv) instead of repeat_kv 4e-2 (the GQA
cases), a 10x epsilon 1e-4..3e-4, a centred (LayerNorm-like) norm 3e-3..1e-2,
GELU instead of SiLU 9e-4..8e-3, lr off by 1% 2e-5..4e-4; in the llama3_rope
case, plain RoPE instead of llama3's scaling 7.6e-6 at step 0 and up to
4.9e-4 over the five steps.
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F

from reference_common import default_out, get_batch, run_case, write_doc

# ---------------------------------------------------------------------------
# The cases: small, odd shapes. head_dim None means HF's default
# hidden_size / num_attention_heads (left out of config.json).
# ---------------------------------------------------------------------------
CASES = [
    # GQA 6 heads over 2 kv heads; 35 tokens with B*T = 10 gives batches
    # at 0, 10, 20, 0, 10: wraps.
    dict(name="gqa_wrap", seed=1001, vocab_size=300, hidden_size=48, intermediate_size=100,
         num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, head_dim=None,
         max_position_embeddings=16, rms_norm_eps=1e-6, rope_theta=10000.0,
         tie_word_embeddings=False, batch=2, seq=5, lr=3e-3, weight_decay=0.0, n_tokens=35,
         bf16=True),  # and the bf16 block (reference_common.bf16_record)
    # Plain multi-head attention, tied head, Llama 3's rope_theta, weight decay.
    dict(name="mha_tied_theta500k", seed=20240520, vocab_size=257, hidden_size=64,
         intermediate_size=150, num_hidden_layers=3, num_attention_heads=4,
         num_key_value_heads=4, head_dim=None, max_position_embeddings=40, rms_norm_eps=1e-5,
         rope_theta=500000.0, tie_word_embeddings=True, batch=3, seq=17, lr=2e-3,
         weight_decay=0.1, n_tokens=500),
    # head_dim given explicitly, heads * head_dim (56) != hidden_size (40),
    # one kv head (MQA), T equal to max_position_embeddings.
    dict(name="head_dim_mqa_full_context", seed=77, vocab_size=389, hidden_size=40,
         intermediate_size=90, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=1, head_dim=14, max_position_embeddings=24, rms_norm_eps=1e-5,
         rope_theta=10000.0, tie_word_embeddings=False, batch=2, seq=24, lr=1e-3,
         weight_decay=0.01, n_tokens=1000),
    # Deepest and widest, tied; 180 tokens with B*T = 58 gives 0, 58, 116, 0, 58: wraps.
    dict(name="deep_gqa_wrap", seed=31337, vocab_size=500, hidden_size=96,
         intermediate_size=257, num_hidden_layers=5, num_attention_heads=6,
         num_key_value_heads=3, head_dim=None, max_position_embeddings=64, rms_norm_eps=1e-6,
         rope_theta=500000.0, tie_word_embeddings=True, batch=2, seq=29, lr=1.5e-3,
         weight_decay=0.05, n_tokens=180),
    # The trainer's schedule, clipping and accumulation over 10 steps: a
    # cosine to a floor of 10% of lr after 2 warmup steps, norms clipped to
    # 0.3, two micro-batches per step.
    dict(name="cosine_min_lr_clip_accum2", seed=5151, vocab_size=271, hidden_size=48,
         intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, head_dim=None, max_position_embeddings=32, rms_norm_eps=1e-6,
         rope_theta=10000.0, tie_word_embeddings=False, batch=2, seq=9, lr=5e-3,
         weight_decay=0.01, n_tokens=500, steps=10, lr_scheduler_type="cosine_with_min_lr",
         warmup_steps=2, min_lr_rate=0.1, max_grad_norm=0.3, gradient_accumulation_steps=2),
    # Llama 3.1's RoPE scaling in Transformers 5's spelling (rope_parameters),
    # its original context shortened to 32 so that, at D = 16, frequency 0
    # keeps its value, 1 and 2 are smoothed and 3..7 divided by the factor;
    # T = 40 runs past the original context. The inverse frequencies are
    # Transformers' (rope_reference.py's case "e2e_llama3", checked below).
    dict(name="llama3_rope", seed=4242, vocab_size=263, hidden_size=48, intermediate_size=96,
         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, head_dim=None,
         max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
         rope_parameters=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=32),
         tie_word_embeddings=False, batch=2, seq=40, lr=2e-3, weight_decay=0.01, n_tokens=400),
    # A constant rate after 4 warmup steps, no clipping, no accumulation.
    dict(name="constant_warmup", seed=6262, vocab_size=257, hidden_size=32,
         intermediate_size=80, num_hidden_layers=2, num_attention_heads=2,
         num_key_value_heads=1, head_dim=None, max_position_embeddings=16, rms_norm_eps=1e-5,
         rope_theta=10000.0, tie_word_embeddings=True, batch=2, seq=8, lr=6e-3,
         weight_decay=0.0, n_tokens=300, steps=10, lr_scheduler_type="constant_with_warmup",
         warmup_steps=4),
]


def head_dim(case):
    return case["head_dim"] if case["head_dim"] is not None else \
        case["hidden_size"] // case["num_attention_heads"]


def param_specs(case):
    """(name, shape, center, halfwidth) in LlamaForCausalLM's state_dict
    order; the position in this list is the parameter's substream index t."""
    V, C, I = case["vocab_size"], case["hidden_size"], case["intermediate_size"]
    D = head_dim(case)
    QD, KD = case["num_attention_heads"] * D, case["num_key_value_heads"] * D
    norm, weight = (1.0, 0.2), (0.0, 0.1)
    specs = [("model.embed_tokens.weight", (V, C), *weight)]
    for l in range(case["num_hidden_layers"]):
        h = "model.layers.%d." % l
        specs += [  # nn.Linear: [out, in]
            (h + "self_attn.q_proj.weight", (QD, C), *weight),
            (h + "self_attn.k_proj.weight", (KD, C), *weight),
            (h + "self_attn.v_proj.weight", (KD, C), *weight),
            (h + "self_attn.o_proj.weight", (C, QD), *weight),
            (h + "mlp.gate_proj.weight", (I, C), *weight),
            (h + "mlp.up_proj.weight", (I, C), *weight),
            (h + "mlp.down_proj.weight", (C, I), *weight),
            (h + "input_layernorm.weight", (C,), *norm),
            (h + "post_attention_layernorm.weight", (C,), *norm),
        ]
    specs.append(("model.norm.weight", (C,), *norm))
    if not case["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (V, C), *weight))
    return specs


# ---------------------------------------------------------------------------
# Llama forward, Hugging Face semantics (LlamaForCausalLM, dropout 0)
# ---------------------------------------------------------------------------
def rms_norm(x, w, eps):
    """LlamaRMSNorm: float32 (or wider) statistics, then weight * x."""
    dt = x.dtype
    h = x.to(torch.promote_types(dt, torch.float32))
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(dt)


def llama3_inv_freq(inv_freq, rope):
    """Transformers' _compute_llama3_parameters, op for op in float32."""
    factor, ctx = rope["factor"], rope["original_max_position_embeddings"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    low_freq_wavelen, high_freq_wavelen = ctx / low, ctx / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (ctx / wavelen - low) / (high - low)
    smoothed_inv_freq = ((1 - smooth_factor) * inv_freq_llama / factor
                         + smooth_factor * inv_freq_llama)
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotary_tables(T, D, theta, rope=None):
    """LlamaRotaryEmbedding: cos and sin [T, D], in float32; rope_type
    "default", or "llama3" when `rope` (the case's rope_parameters) says so."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    if rope is not None:
        assert rope["rope_type"] == "llama3"
        inv_freq = llama3_inv_freq(inv_freq, rope)
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    """[B, Hkv, T, D] -> [B, Hkv * n_rep, T, D]: head h reads kv head h // n_rep."""
    B, Hkv, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, Hkv, n_rep, T, D).reshape(B, Hkv * n_rep, T, D)


def attention(x, p, h, case, cos, sin):
    B, T, _ = x.shape
    H, Hkv, D = case["num_attention_heads"], case["num_key_value_heads"], head_dim(case)
    q = F.linear(x, p[h + "self_attn.q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
    k = F.linear(x, p[h + "self_attn.k_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
    v = F.linear(x, p[h + "self_attn.v_proj.weight"]).view(B, T, Hkv, D).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin  # [B, H, T, D]
    k = k * cos + rotate_half(k) * sin  # [B, Hkv, T, D]
    k, v = repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv)
    w = torch.matmul(q, k.transpose(2, 3)) * (D ** -0.5)  # [B, H, T, T]
    mask = torch.full((T, T), torch.finfo(w.dtype).min, dtype=w.dtype).triu(1)
    w = w + mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    y = torch.matmul(w, v).transpose(1, 2).reshape(B, T, H * D)  # [B, T, H*D]
    return F.linear(y, p[h + "self_attn.o_proj.weight"])  # [B, T, C]


def mlp(x, p, h):
    g = F.silu(F.linear(x, p[h + "mlp.gate_proj.weight"]))  # [B, T, I]
    u = F.linear(x, p[h + "mlp.up_proj.weight"])  # [B, T, I]
    return F.linear(g * u, p[h + "mlp.down_proj.weight"])  # [B, T, C]


def forward_loss(p, k, case):
    idx, targets = get_batch(case["tokens"], k, case["batch"], case["seq"])
    B, T = idx.shape
    eps = case["rms_norm_eps"]
    x = p["model.embed_tokens.weight"][idx]  # [B, T, C]
    cos, sin = rotary_tables(T, head_dim(case), case["rope_theta"], case.get("rope_parameters"))
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    for l in range(case["num_hidden_layers"]):
        h = "model.layers.%d." % l
        x = x + attention(rms_norm(x, p[h + "input_layernorm.weight"], eps), p, h, case, cos, sin)
        x = x + mlp(rms_norm(x, p[h + "post_attention_layernorm.weight"], eps), p, h)
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if case["tie_word_embeddings"] else p["lm_head.weight"]
    logits = F.linear(x, head)  # [B, T, V]
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def hf_config(case):
    """The config.json the C test writes (the fields HF's LlamaConfig reads)."""
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": case["vocab_size"],
        "hidden_size": case["hidden_size"],
        "intermediate_size": case["intermediate_size"],
        "num_hidden_layers": case["num_hidden_layers"],
        "num_attention_heads": case["num_attention_heads"],
        "num_key_value_heads": case["num_key_value_heads"],
        "max_position_embeddings": case["max_position_embeddings"],
        "rms_norm_eps": case["rms_norm_eps"],
        "rope_theta": case["rope_theta"],
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": case["tie_word_embeddings"],
    }
    if case["head_dim"] is not None:
        cfg["head_dim"] = case["head_dim"]
    if "rope_parameters" in case:  # Transformers 5's spelling, theta inside
        del cfg["rope_theta"], cfg["rope_scaling"]
        cfg["rope_parameters"] = dict(case["rope_parameters"], rope_theta=case["rope_theta"])
    return cfg


def check_rope_reference(case):
    """The llama3 case's inverse frequencies equal Transformers' (recorded by
    rope_reference.py, which runs transformers 5 in another environment)."""
    path = default_out(__file__, "rope_reference.json")
    ref = [c for c in json.load(open(path))["cases"] if c["name"] == "e2e_llama3"][0]
    cfg = hf_config(case)
    for key in ("hidden_size", "num_attention_heads", "max_position_embeddings",
                "rope_parameters"):
        assert ref["config"][key] == cfg[key], key
    D = head_dim(case)
    inv = 1.0 / (case["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    inv = llama3_inv_freq(inv, case["rope_parameters"])
    assert inv.tolist() == ref["inv_freq"], (inv.tolist(), ref["inv_freq"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "llama_reference.json"))
    args = ap.parse_args()
    out_cases = []
    for case in CASES:
        assert case["num_attention_heads"] % case["num_key_value_heads"] == 0
        assert head_dim(case) % 2 == 0 and case["seq"] <= case["max_position_embeddings"]
        assert case["n_tokens"] >= case["batch"] * case["seq"] + 1
        if "rope_parameters" in case:
            check_rope_reference(case)
        out_cases.append(run_case(case, param_specs(case), hf_config(case), forward_loss))
    write_doc("tools/reference/llama_reference.py", out_cases, args.out)


if __name__ == "__main__":
    main()
