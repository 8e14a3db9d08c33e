"""What every end-to-end training reference shares: regc's counter-based
random stream (common/rng.c, bit for bit), the token stream and llm.c's batch
order, the AdamW loop, and the JSON the C test reads.

An architecture script supplies, per case: the parameter list
(name, shape, center, halfwidth) in its checkpoint order, the config.json
dict, and forward_loss(params, k, case) for batch k. tests/test_train_reference.c
rebuilds each case in C from the recorded "params" list and "config" alone,
so it needs no knowledge of the architecture. A case marked bf16=True also
records 20 steps in float32 and under bfloat16 autocast (bf16_record), which
tests/test_train_bf16.c compares `regc train --precision bf16` with.

Run the scripts with Debian's python3 (torch + numpy): /usr/bin/python3.
"""

import json
import math
import os
import re

import numpy as np
import torch

# ---------------------------------------------------------------------------
# The counter-based RNG of common/rng.c, vectorised. Everything is uint64 with
# wraparound, exactly like C's unsigned arithmetic.
# ---------------------------------------------------------------------------
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STEPS = 5
BF16_STEPS = 20  # the length of the bf16 comparison (a case's "bf16" block)
TOKEN_STREAM = 1000000  # substream index of the token data (far from any parameter's)


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
# Weights, tokens, batches
# ---------------------------------------------------------------------------
def init_params(seed, specs):
    """Name -> float32 numpy array; parameter t draws from substream t."""
    params = {}
    for t, (name, shape, center, halfwidth) in enumerate(specs):
        n = int(np.prod(shape))
        params[name] = rng_fill_uniform(n, rng_substream(seed, t), center, halfwidth).reshape(shape)
    return params


def make_tokens(seed, n_tokens, vocab):
    s = rng_substream(seed, TOKEN_STREAM)
    return (rng_at(s, n_tokens) % np.uint64(vocab)).astype(np.int64)


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
    """regc_tokens_batch: inputs [B, T] and next-token targets [B, T]."""
    p = batch_start(k, len(tokens), B * T)
    chunk = torch.from_numpy(tokens[p:p + B * T + 1])
    return chunk[:-1].view(B, T), chunk[1:].view(B, T)


# ---------------------------------------------------------------------------
# Training and the recorded case
# ---------------------------------------------------------------------------
def lr_lambda(case, step):
    """Hugging Face's schedules (transformers.optimization, get_scheduler),
    written out: the factor on the base learning rate at optimizer step
    `step` (from 0)."""
    kind = case.get("lr_scheduler_type", "constant")
    steps = case.get("steps", STEPS)
    warmup = case.get("warmup_steps", 0) or math.ceil(steps * case.get("warmup_ratio", 0.0))
    if kind == "constant":
        return 1.0
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if kind == "constant_with_warmup":
        return 1.0
    if kind == "linear":
        return max(0.0, float(steps - step) / float(max(1, steps - warmup)))
    progress = float(step - warmup) / float(max(1, steps - warmup))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(0.5) * 2.0 * progress))
    if kind == "cosine_with_min_lr":
        rate = case["min_lr"] / case["lr"] if "min_lr" in case else case["min_lr_rate"]
        factor = factor * (1 - rate) + rate
    return max(0.0, factor)


# Transformers' Trainer (get_decay_parameter_names) gives weight decay 0 to
# the parameters of its nn.LayerNorm modules and to those whose lower-cased
# names match these.
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def param_groups(case, p):
    """AdamW's parameter groups: one over everything (regc's default), or with
    weight_decay_params "not_bias_norm" Transformers' two, the case naming
    its family's nn.LayerNorm modules in layernorm_modules (a regex)."""
    wd = case["weight_decay"]
    if case.get("weight_decay_params", "all") == "all":
        return [{"params": list(p.values()), "weight_decay": wd}]
    layernorm = re.compile(case["layernorm_modules"])

    def decays(name):
        return not layernorm.search(name) and not any(
            re.search(pattern, name.lower()) for pattern in NO_DECAY_PATTERNS)

    return [{"params": [v for n, v in p.items() if decays(n)], "weight_decay": wd},
            {"params": [v for n, v in p.items() if not decays(n)], "weight_decay": 0.0}]


def schedule_args(case):
    """The `regc train` flags of a case's schedule, clipping, accumulation and
    weight-decay groups."""
    args = []
    for key in ("lr_scheduler_type", "warmup_steps", "warmup_ratio", "min_lr", "min_lr_rate",
                "max_grad_norm", "gradient_accumulation_steps", "weight_decay_params"):
        if key in case:
            args += ["--" + key.replace("_", "-"), repr(case[key])
                     if isinstance(case[key], float) else str(case[key])]
    return args


def train(case, init, forward_loss, dtype, autocast=False):
    """Losses (and, with clipping, gradient norms) of the case's AdamW steps,
    each loss recorded before its update. forward_loss(params, k, case)
    returns batch k's mean loss; with gradient accumulation K, step s runs
    batches s*K .. s*K+K-1 and each adds loss / K to the gradients (every
    batch of a causal LM has B*T targets, so that is the mean over the
    step's); the gradients are clipped with clip_grad_norm_ and the
    learning rate set by the schedule before opt.step(). With autocast the
    forward runs under torch.autocast("cpu", bfloat16) and the backward
    outside it, as PyTorch's AMP recipe has it; parameters, gradients and
    AdamW state stay `dtype`."""
    p = {name: torch.tensor(a, dtype=dtype, requires_grad=True) for name, a in init.items()}
    opt = torch.optim.AdamW(param_groups(case, p), lr=case["lr"], betas=(0.9, 0.999), eps=1e-8)
    k = case.get("gradient_accumulation_steps", 1)
    max_norm = case.get("max_grad_norm", 0.0)
    losses, norms = [], []
    for step in range(case.get("steps", STEPS)):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(k):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = forward_loss(p, step * k + j, case)
            (loss / k if k > 1 else loss).backward()
            total += loss.item() / k
        losses.append(total)
        if max_norm > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(list(p.values()), max_norm).item())
        for group in opt.param_groups:
            group["lr"] = case["lr"] * lr_lambda(case, step)
        opt.step()
    return losses, norms


def bf16_record(case, init, forward_loss):
    """The "bf16" block of a case: BF16_STEPS steps in float32 and the same
    steps with the forward under CPU autocast to bfloat16, and the largest
    relative gap between the two loss curves. tests/test_train_bf16.c
    derives its tolerance for `regc train --precision bf16` from that gap.

    What autocast does to these forwards (torch 1.13, checked op by op):
    linear, addmm, matmul, bmm and baddbmm multiply bfloat16 operands and
    return bfloat16; cross_entropy is on its float32 list; embedding,
    layer_norm of a float32 input and anything mixing a float32 tensor with
    a bfloat16 one (the residual adds, Llama's rotary products) stay
    float32; but the elementwise ops applied straight to a product (GELU,
    SiLU, ReLU, tanh, the GPT-2 and BERT softmax, the gated products) run
    in bfloat16. regc's bf16 rounds only the GEMM operands and keeps every
    product and elementwise op in float32, so autocast rounds more: its gap
    to float32 gives the scale of regc's, not a bound on it (the C test's
    header says how it makes a tolerance of it). layer_norm has no autocast
    rule in torch 1.13 and refuses a bfloat16 input with float32 weights;
    the one forward that feeds it a product (BERT's prediction head) casts
    the input to the weight's dtype, a no-op outside autocast."""
    case = dict(case, steps=BF16_STEPS)
    losses32, _ = train(case, init, forward_loss, torch.float32)
    losses16, _ = train(case, init, forward_loss, torch.float32, autocast=True)
    gap = max(abs(a - b) / abs(b) for a, b in zip(losses16, losses32))
    # float32 rounding alone over the longer run: the floor under the C
    # test's fp32 comparison, which small models amplify step by step
    losses64, _ = train(case, init, forward_loss, torch.float64)
    noise = max(abs(a - b) / abs(b) for a, b in zip(losses32, losses64))
    print("%-24s %d steps: bf16 autocast vs fp32 max rel %.1e, fp32 vs fp64 %.1e" %
          ("", BF16_STEPS, gap, noise))
    return {"steps": BF16_STEPS, "losses_fp32": losses32, "losses_autocast": losses16,
            "autocast_vs_fp32_max_rel": gap, "fp32_vs_fp64_max_rel": noise}


def run_case(case, specs, config, forward_loss, extra_args=()):
    """Train one case in float32 and float64 and return its JSON record.
    `case` needs name, seed, batch, seq, lr, weight_decay, n_tokens; the
    forward pass finds the tokens in case["tokens"]. extra_args are
    additional `regc train` flags the C test passes (e.g. --seed). A case
    with bf16=True also gets the "bf16" block of bf16_record."""
    torch.manual_seed(0)  # nothing here draws from torch's RNG; belt and braces
    torch.set_num_threads(1)  # the same summation order on every machine
    init = init_params(case["seed"], specs)
    case = dict(case, tokens=make_tokens(case["seed"], case["n_tokens"], config["vocab_size"]))
    param_sum = float(sum(np.sum(a, dtype=np.float64) for a in init.values()))
    losses, norms = train(case, init, forward_loss, torch.float32)
    # The same run in float64 from the same float32 start: how far float32
    # rounding alone moves the losses (a floor for any fp32 comparison).
    losses64, _ = train(case, init, forward_loss, torch.float64)
    noise = max(abs(a - b) / abs(b) for a, b in zip(losses, losses64))
    n_params = sum(a.size for a in init.values())
    print("%-24s params=%d B=%d T=%d losses %s  fp32 vs fp64 max rel %.1e" %
          (case["name"], n_params, case["batch"], case["seq"],
           " ".join("%.6f" % x for x in losses), noise))
    record = {
        "name": case["name"],
        "seed": case["seed"],
        "config": config,
        "params": [[name, list(shape), center, halfwidth]
                   for name, shape, center, halfwidth in specs],
        "batch": case["batch"],
        "seq": case["seq"],
        "steps": case.get("steps", STEPS),
        "lr": case["lr"],
        "weight_decay": case["weight_decay"],
        "n_tokens": case["n_tokens"],
        "extra_args": list(extra_args) + schedule_args(case),
        "param_sum": param_sum,
        "losses": losses,
        "losses_float64": losses64,
        "fp32_vs_fp64_max_rel": noise,
    }
    if norms:
        record["grad_norms"] = norms
    if case.get("bf16"):
        record["bf16"] = bf16_record(case, init, forward_loss)
    return record


def write_doc(generator, out_cases, out_path):
    doc = {"generator": generator, "torch": torch.__version__, "cases": out_cases}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)  # repr floats: full round-trip precision
        f.write("\n")
    print("wrote %s (%d cases)" % (out_path, len(out_cases)))


def default_out(script_file, name):
    here = os.path.dirname(os.path.abspath(script_file))
    return os.path.normpath(os.path.join(here, "..", "..", "tests", "data", name))
