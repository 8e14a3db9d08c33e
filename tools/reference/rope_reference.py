#!/tmp/venv/bin/python
"""Transformers' RoPE initialisers, for tests/test_rope_config.c: for a set
of Llama config.json files (each supported rope_type, in Transformers 5's
`rope_parameters` spelling and in the older `rope_theta` + `rope_scaling`
one, head dims 16, 64, 96 and 128), the inverse frequencies and the
attention scaling that LlamaRotaryEmbedding computes, which regc's Llama
frontend (models/rope.c) must reproduce: as initialised, or, for a case
with "seq", after a forward over that many positions (dynamic and longrope
compute them again there).

NOT part of the test suite and not run by it: it needs transformers 5.x and
torch 2.x, so run it by hand in a virtual environment that has them:

    /tmp/venv/bin/python tools/reference/rope_reference.py

It writes tests/data/rope_reference.json. Each case holds the config.json
it loaded (through AutoConfig.from_pretrained, as a user's directory is
loaded), inv_freq as float32 values written as exact decimals (each a
double equal to the float32), and attention_scaling (a Python float, which
Transformers multiplies into cos and sin in float32).

What is computed where: the initialisers run on the CPU in float32 torch
ops; torch's float32 pow is Sleef's powf in the vectorised body of the loop
and libm's in its tail, so the values depend a little on the CPU (the
capability is recorded); regc rounds the exact power once and the C test
allows one ulp of difference for it, reporting the largest.

partial_rotary_factor is left out: Transformers' Llama ignores it for the
default type and its other initialisers would return fewer frequencies
than the head rotates, so regc refuses it.

The case "e2e_llama3" is the config of tools/reference/llama_reference.py's
llama3 case: these values are what that script's own float32 formula must
give (it runs torch 1.13 without transformers), and the C test checks regc
against them.
"""

import argparse
import json
import os
import tempfile

import torch
import transformers
from transformers import AutoConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# name, head shape (hidden_size, num_attention_heads, head_dim or None),
# max_position_embeddings, and the RoPE keys of config.json.
CASES = [
    ("default_v5", (128, 2, None), 2048,
     {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("default_legacy_theta500k", (256, 2, None), 8192,
     {"rope_theta": 500000.0, "rope_scaling": None}),
    ("default_absent_head96", (192, 2, None), 2048, {}),
    ("linear_v5", (128, 2, None), 4096,
     {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    ("linear_legacy_type_head96", (96, 4, 96), 8192,
     {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}}),
    ("llama3_v5_llama31_8b", (256, 2, None), 131072, {"rope_parameters": dict(LLAMA31)}),
    ("llama3_legacy_llama32", (128, 2, None), 131072,
     {"rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    ("llama3_v5_head96_short_context", (192, 2, None), 512,
     {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                          "low_freq_factor": 1.5, "high_freq_factor": 6.0,
                          "original_max_position_embeddings": 128}}),
    ("llama3_v5_original_from_max_pos", (128, 2, None), 256,
     {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0}}),
    ("e2e_llama3", (48, 3, None), 64,
     {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32}}),
    ("yarn_v5_qwen", (256, 2, None), 131072,
     {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                          "original_max_position_embeddings": 32768}}),
    ("yarn_legacy_type_betas_untruncated", (128, 2, None), 16384,
     {"rope_theta": 10000.0,
      "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                       "beta_fast": 16, "beta_slow": 2.0, "truncate": False}}),
    ("yarn_v5_mscale_deepseek", (128, 2, None), 163840,
     {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                          "original_max_position_embeddings": 4096, "mscale": 0.707,
                          "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}}),
    ("yarn_v5_mscale_unequal_head96", (192, 2, None), 65536,
     {"rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 16.0,
                          "original_max_position_embeddings": 4096, "mscale": 1.0,
                          "mscale_all_dim": 0.5}}),
    ("yarn_v5_attention_factor_head96", (96, 1, None), 32768,
     {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                          "original_max_position_embeddings": 4096, "attention_factor": 1.25}}),
    ("yarn_v5_factor_null", (128, 2, None), 16384,
     {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": None,
                          "original_max_position_embeddings": 2048}}),
    ("yarn_legacy_head16", (32, 2, None), 256,
     {"rope_theta": 10000.0,
      "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                       "original_max_position_embeddings": 128}}),
    # dynamic: as initialised (the base unchanged), and after a forward over
    # more positions than max_position_embeddings (a larger base, computed
    # in float32 tensor arithmetic)
    ("dynamic_v5_init", (128, 2, None), 2048,
     {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}),
    ("dynamic_legacy_past_max", (128, 2, None), 512,
     {"rope_theta": 500000.0, "rope_scaling": {"type": "dynamic", "factor": 4.0}}, 3000),
    ("dynamic_v5_head96_past_max", (192, 2, None), 256,
     {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 1.5}}, 1000),
    # longrope: the short factors as initialised and within the original
    # length, the long ones past it; the attention factor derived or given
    ("longrope_v5_init", (128, 2, None), 131072,
     {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                          "original_max_position_embeddings": 4096,
                          "short_factor": [1.0 + 0.01 * i for i in range(32)],
                          "long_factor": [1.0 + 0.5 * i ** 1.5 for i in range(32)]}}),
    ("longrope_v5_past_original", (128, 2, None), 131072,
     {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                          "original_max_position_embeddings": 4096,
                          "short_factor": [1.0 + 0.01 * i for i in range(32)],
                          "long_factor": [1.0 + 0.5 * i ** 1.5 for i in range(32)]}}, 5000),
    ("longrope_legacy_head96_attention_factor", (192, 2, None), 32768,
     {"rope_theta": 250000.0,
      "rope_scaling": {"type": "longrope", "original_max_position_embeddings": 2048,
                       "attention_factor": 1.1, "factor": 8.0,
                       "short_factor": [1.0 + 0.02 * i for i in range(48)],
                       "long_factor": [1.0 + 0.3 * i for i in range(48)]}}, 2049),
]


def config_json(hidden, heads, head_dim, max_pos, rope):
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64,
           "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1,
           "num_attention_heads": heads, "num_key_value_heads": heads,
           "max_position_embeddings": max_pos, "rms_norm_eps": 1e-6}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(rope)
    return cfg


def hf_rope(cfg, seq):
    """LlamaRotaryEmbedding of the config loaded from a directory; after a
    forward over positions 0..seq-1 when seq is given (dynamic and longrope
    set their frequencies for the length there)."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        config = AutoConfig.from_pretrained(d)
    emb = LlamaRotaryEmbedding(config)  # on the CPU, as the initialisers run
    if seq:
        emb(torch.zeros(1, seq, 8), torch.arange(seq)[None])
    assert emb.inv_freq.dtype == torch.float32
    return [float(x) for x in emb.inv_freq.tolist()], float(emb.attention_scaling), \
        dict(config.rope_parameters)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(
        os.path.join(here, "..", "..", "tests", "data", "rope_reference.json")))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = []
    for name, (hidden, heads, head_dim), max_pos, rope, *seq in CASES:
        cfg = config_json(hidden, heads, head_dim, max_pos, rope)
        inv_freq, scaling, params = hf_rope(cfg, seq[0] if seq else 0)
        cases.append({"name": name, "config": cfg, "seq": seq[0] if seq else 0,
                      "rope_parameters_read": params, "inv_freq": inv_freq,
                      "attention_scaling": scaling})
    doc = {"generator": "tools/reference/rope_reference.py",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cases": cases}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote %s (%d cases)" % (args.out, len(cases)))


if __name__ == "__main__":
    main()
