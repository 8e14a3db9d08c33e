#!/usr/bin/python3
"""kernel_reference.py — expected outputs of the backend kernels, from PyTorch.

Writes tests/data/kernel_reference.json, which tests/test_kernels_cpu.c reads.
Inputs are not stored: every input tensor is named by (seed, stream, center,
halfwidth) and both sides draw it from regc's counter-based stream
(common/rng.c), re-implemented here in numpy bit for bit. The file also holds
raw draws of the stream so the C test proves the two implementations agree
before trusting anything else in it.

Expected values are computed in float64 from the float32 inputs (so they are
the exact answers the float32 kernels approximate), except AdamW, which runs
torch.optim.AdamW in float32 because matching PyTorch's arithmetic is the
point there.

Run with Debian's interpreter, which has torch and numpy:
    /usr/bin/python3 tools/reference/kernel_reference.py [output.json]
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# ---- regc's random stream (common/rng.c) -----------------------------------
U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)


def rng_mix(z):
    """splitmix64's finaliser on a uint64 array; uint64 arithmetic wraps."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def rng_at(seed, i):
    i = np.asarray(i, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return rng_mix(U64(seed) + (i + U64(1)) * GOLDEN)


def rng_substream(seed, index):
    with np.errstate(over="ignore"):
        return int(rng_mix(U64(seed) ^ rng_mix(U64(index) + GOLDEN)))


def rng_fill_uniform(n, seed, center, halfwidth):
    """float32 values, two float32 roundings exactly as regc_rng_fill_uniform."""
    center = np.float32(center)
    step = np.float32(float(np.float32(halfwidth)) / 8388608.0)
    k = (rng_at(seed, np.arange(n, dtype=np.uint64)) >> U64(40)).astype(np.int64) - 8388608
    t = k.astype(np.float32) * step  # exact conversion, one rounding
    return center + t  # the second rounding


# ---- inputs and outputs -------------------------------------------------------
class Case:
    """One kernel call: its inputs are stream numbers of `seed`."""

    def __init__(self, seed, **fields):
        self.seed = seed
        self.inputs = {}
        self.out = dict(fields)
        self.out["seed"] = seed
        self.out["inputs"] = self.inputs
        self.expected = self.out["expected"] = {}

    def input(self, name, shape, center=0.0, halfwidth=1.0):
        stream = len(self.inputs)
        self.inputs[name] = [stream, center, halfwidth]
        n = int(np.prod(shape)) if len(shape) else 1
        vals = rng_fill_uniform(n, rng_substream(self.seed, stream), center, halfwidth)
        return torch.from_numpy(vals.reshape(shape)).double()

    def expect(self, name, tensor):
        t = tensor.detach().double().reshape(-1).tolist() if torch.is_tensor(tensor) else [tensor]
        # 9 significant digits: exact enough for any float32 comparison
        self.expected[name] = [float("%.9g" % x) for x in t]


def gelu(x):
    return F.gelu(x, approximate="tanh")


# ---- GEMM and its epilogues --------------------------------------------------
EPILOGUES = ["NONE", "BIAS", "GELU", "GELU_AUX", "BIAS_GELU_AUX", "DGELU", "DGELU_BGRAD", "BGRAD"]


def gemm_case(seed, epilogue, trans_a, trans_b, accumulate, alpha, m=5, n=7, k=6):
    c = Case(seed, epilogue=epilogue, trans_a=trans_a, trans_b=trans_b, accumulate=accumulate,
             alpha=alpha, m=m, n=n, k=k)
    a = c.input("a", [k, m] if trans_a else [m, k])
    b = c.input("b", [n, k] if trans_b else [k, n])
    c0 = c.input("c", [m, n])  # C's prior contents: added when accumulating
    op_a = a.t() if trans_a else a
    op_b = b.t() if trans_b else b
    g = float(np.float32(alpha)) * (op_a @ op_b) + (c0 if accumulate else 0)
    if epilogue in ("BIAS", "BIAS_GELU_AUX"):
        bias = c.input("bias", [n], 0.1, 0.5)
    if epilogue in ("DGELU", "DGELU_BGRAD"):
        aux_in = c.input("aux", [m, n], 0.0, 3.0)
    if epilogue == "NONE" or epilogue == "BGRAD":
        out = g
    elif epilogue == "BIAS":
        out = g + bias
    elif epilogue == "GELU":
        out = gelu(g)
    elif epilogue == "GELU_AUX":
        c.expect("aux", g)
        out = gelu(g)
    elif epilogue == "BIAS_GELU_AUX":
        c.expect("aux", g + bias)
        out = gelu(g + bias)
    else:  # DGELU kinds: G * gelu'(aux), gelu' taken by autograd
        x = aux_in.clone().requires_grad_(True)
        (out,) = torch.autograd.grad(gelu(x), x, grad_outputs=g)
    c.expect("c", out)
    if epilogue == "DGELU_BGRAD":
        c.expect("bias_grad", out.sum(0))
    if epilogue == "BGRAD":
        c.expect("bias_grad", op_b.sum(0))
    return c.out


def gemm_cases():
    cases = []
    for i, epi in enumerate(EPILOGUES):
        # every epilogue once, cycling through the transposes; odd ones accumulate
        cases.append(gemm_case(100 + i, epi, trans_a=i & 1, trans_b=(i >> 1) & 1,
                               accumulate=int(i % 3 == 1), alpha=0.75 if i % 2 else 1.0))
    return cases


# ---- the other kernels --------------------------------------------------------
def layernorm_case():
    rows, cols, eps = 7, 13, 1e-5
    c = Case(200, rows=rows, cols=cols, eps=eps)
    x = c.input("x", [rows, cols], 0.3, 2.0).requires_grad_(True)
    w = c.input("w", [cols], 1.0, 0.5).requires_grad_(True)
    b = c.input("b", [cols], 0.0, 0.5).requires_grad_(True)
    dy = c.input("dy", [rows, cols])
    y = F.layer_norm(x, (cols,), w, b, float(np.float32(eps)))
    y.backward(dy)
    mean = x.detach().mean(-1)
    var = x.detach().var(-1, unbiased=False)  # biased, as layer_norm uses
    c.expect("y", y)
    c.expect("mean", mean)
    c.expect("rstd", 1.0 / torch.sqrt(var + float(np.float32(eps))))
    c.expect("dx", x.grad)
    c.expect("dw", w.grad)
    c.expect("db", b.grad)
    return c.out


def gelu_case():
    n = 29
    c = Case(300, n=n)
    x = c.input("x", [n], 0.0, 4.0).requires_grad_(True)
    dy = c.input("dy", [n])
    y = gelu(x)
    y.backward(dy)
    c.expect("y", y)
    c.expect("dx", x.grad)
    return c.out


def attention_case(seed, batch, tq, tk, n_head, n_kv_head, head_dim, causal, bias=False,
                   scale=None):
    """bias: T5's additive position bias [n_head, tq, tk], shared by the batch,
    added to the scaled scores before the mask; its gradient is expected too."""
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    c = Case(seed, batch=batch, tq=tq, tk=tk, n_head=n_head, n_kv_head=n_kv_head,
             head_dim=head_dim, causal=causal, scale=scale)
    q = c.input("q", [batch, tq, n_head * head_dim]).requires_grad_(True)
    k = c.input("k", [batch, tk, n_kv_head * head_dim]).requires_grad_(True)
    v = c.input("v", [batch, tk, n_kv_head * head_dim]).requires_grad_(True)
    dout = c.input("dout", [batch, tq, n_head * head_dim])
    pos_bias = c.input("bias", [n_head, tq, tk], 0.0, 2.0).requires_grad_(True) if bias else None
    rep = n_head // n_kv_head
    # [b, t, h*d] -> [b, h, t, d]; kv heads repeated for grouped queries
    qh = q.view(batch, tq, n_head, head_dim).transpose(1, 2)
    kh = k.view(batch, tk, n_kv_head, head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.view(batch, tk, n_kv_head, head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
    s = (qh @ kh.transpose(-1, -2)) * float(np.float32(scale))
    if bias:
        s = s + pos_bias  # broadcast over the batch
    if causal:
        mask = torch.ones(tq, tk, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [b, h, tq]
    out = (torch.softmax(s, dim=-1) @ vh).transpose(1, 2).reshape(batch, tq, n_head * head_dim)
    out.backward(dout)
    c.expect("out", out)
    c.expect("lse", lse)
    c.expect("dq", q.grad)
    c.expect("dk", k.grad)
    c.expect("dv", v.grad)
    if bias:
        c.expect("dbias", pos_bias.grad)
    return c.out


def rmsnorm_case():
    """LlamaRMSNorm / T5LayerNorm: x * rsqrt(mean(x^2) + eps) * w."""
    rows, cols, eps = 7, 13, 1e-6
    c = Case(210, rows=rows, cols=cols, eps=eps)
    x = c.input("x", [rows, cols], 0.3, 2.0).requires_grad_(True)
    w = c.input("w", [cols], 1.0, 0.5).requires_grad_(True)
    dy = c.input("dy", [rows, cols])
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(np.float32(eps)))
    y = x * rstd * w
    y.backward(dy)
    c.expect("y", y)
    c.expect("rstd", rstd)
    c.expect("dx", x.grad)
    c.expect("dw", w.grad)
    return c.out


def rotate_half(x):
    """transformers' LlamaRotaryEmbedding helper, verbatim."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_case():
    """HF Llama's apply_rotary_pos_emb on q laid out [b, t, h*d]; cos and sin
    are the [t, d/2] halves of HF's [t, d] tables (which repeat them)."""
    batch, t, n_head, head_dim, theta = 2, 5, 3, 8, 10000.0
    c = Case(220, batch=batch, t=t, n_head=n_head, head_dim=head_dim)
    x = c.input("x", [batch, t, n_head * head_dim]).requires_grad_(True)
    dy = c.input("dy", [batch, t, n_head * head_dim])
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)  # [t, d/2]
    # the kernel reads float32 tables: hand torch exactly those values
    cos_h = freqs.cos().float().double()
    sin_h = freqs.sin().float().double()
    c.out["cos"] = [float("%.9g" % v) for v in cos_h.reshape(-1).tolist()]
    c.out["sin"] = [float("%.9g" % v) for v in sin_h.reshape(-1).tolist()]
    cos = torch.cat((cos_h, cos_h), dim=-1)  # [t, d], as HF builds emb = cat(freqs, freqs)
    sin = torch.cat((sin_h, sin_h), dim=-1)
    xh = x.view(batch, t, n_head, head_dim).transpose(1, 2)  # [b, h, t, d]
    yh = xh * cos + rotate_half(xh) * sin
    y = yh.transpose(1, 2).reshape(batch, t, n_head * head_dim)
    y.backward(dy)
    c.expect("y", y)
    c.expect("dx", x.grad)
    return c.out


def activations_case():
    """SiLU, the exact (erf) GELU, the elementwise product, ReLU and scaling
    (by a float32 value, as the kernel takes it)."""
    n = 29
    c = Case(310, n=n, scale_value=float(np.float32(-0.37)))
    x = c.input("x", [n], 0.0, 6.0).requires_grad_(True)
    dy = c.input("dy", [n])
    b = c.input("b", [n])
    y = F.silu(x)
    (dx,) = torch.autograd.grad(y, x, grad_outputs=dy)
    c.expect("silu", y)
    c.expect("silu_dx", dx)
    y = F.gelu(x, approximate="none")
    (dx,) = torch.autograd.grad(y, x, grad_outputs=dy)
    c.expect("gelu_erf", y)
    c.expect("gelu_erf_dx", dx)
    c.expect("mul", x.detach() * b)
    y = F.relu(x)
    (dx,) = torch.autograd.grad(y, x, grad_outputs=dy)
    c.expect("relu", y)
    c.expect("relu_dx", dx)
    c.expect("scale", x.detach() * c.out["scale_value"])
    return c.out


def pointwise_case():
    """The elementwise ops an exported graph brings (each one step of the
    fused-chain kernel): x spans [-3, 3], p (for rsqrt and fractional powers)
    [0.25, 2.25], b (a divisor) [0.5, 1.5]; the backward of tanh reads the
    saved output."""
    n = 29
    c = Case(320, n=n, add_value=float(np.float32(0.625)), pow_int=3.0,
             pow_frac=float(np.float32(2.5)), pow_neg=float(np.float32(-1.5)),
             fill_value=float(np.float32(-7.25)))
    x = c.input("x", [n], 0.0, 3.0)
    p = c.input("p", [n], 1.25, 1.0)
    b = c.input("b", [n], 1.0, 0.5)
    dy = c.input("dy", [n])
    c.expect("sub", x - b)
    c.expect("div", x / b)
    c.expect("neg", -x)
    c.expect("add_scalar", x + c.out["add_value"])
    c.expect("exp", torch.exp(x))
    t = torch.tanh(x)
    c.expect("tanh", t)
    xg = x.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(torch.tanh(xg), xg, grad_outputs=dy)
    c.expect("tanh_dx", dx)
    c.expect("rsqrt", torch.rsqrt(p))
    c.expect("pow_int", torch.pow(x, c.out["pow_int"]))
    c.expect("pow_frac", torch.pow(p, c.out["pow_frac"]))
    c.expect("pow_neg", torch.pow(p, c.out["pow_neg"]))
    c.expect("masked_fill", x.masked_fill(b > 1.0, c.out["fill_value"]))
    return c.out


def row_ops_case():
    """Softmax and log-softmax over the last axis (and the log-sum-exp they
    write), and a row's sum and mean."""
    rows, cols = 6, 13
    c = Case(330, rows=rows, cols=cols)
    x = c.input("x", [rows, cols], 0.0, 4.0)
    c.expect("softmax", torch.softmax(x, -1))
    c.expect("log_softmax", torch.log_softmax(x, -1))
    c.expect("lse", torch.logsumexp(x, -1))
    c.expect("sum", x.sum(-1))
    c.expect("mean", x.mean(-1))
    return c.out


def cross_entropy_case():
    rows, vocab = 7, 11
    targets = [3, -1, 10, 0, 7, -1, 3]
    dloss = 0.7
    c = Case(400, rows=rows, cols=vocab, targets=targets, dloss=dloss)
    logits = c.input("logits", [rows, vocab], 0.0, 3.0).requires_grad_(True)
    t = torch.tensor(targets)
    loss = F.cross_entropy(logits, t, ignore_index=-1)
    loss.backward(torch.tensor(float(np.float32(dloss)), dtype=torch.float64))
    c.expect("loss", loss)
    c.expect("lse", torch.logsumexp(logits.detach(), dim=-1))
    c.expect("dlogits", logits.grad)
    return c.out


def embedding_case():
    vocab, cols = 11, 5
    ids = [3, 0, 10, 3, 7, 3, 1]
    c = Case(500, rows=len(ids), cols=cols, vocab=vocab, ids=ids)
    table = c.input("table", [vocab, cols]).requires_grad_(True)
    dout = c.input("dout", [len(ids), cols])
    out = F.embedding(torch.tensor(ids), table)
    out.backward(dout)
    c.expect("out", out)
    c.expect("dtable", table.grad)
    return c.out


def elementwise_case():
    rows, cols = 7, 5
    c = Case(600, rows=rows, cols=cols)
    a = c.input("a", [rows, cols])
    b = c.input("b", [rows, cols])
    bias = c.input("bias", [cols])
    c.expect("add", a + b)
    c.expect("bias_add", a + bias)
    c.expect("sum_rows", a.sum(0))
    return c.out


def transpose_case(seed, shape, perm):
    c = Case(seed, shape=shape, perm=perm)
    x = c.input("x", shape)
    c.expect("out", x.permute(*perm).contiguous())
    return c.out


def adamw_case():
    n, steps = 13, 3
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    # the kernel takes float32 hyperparameters: give torch exactly those
    h = {key: float(np.float32(val)) for key, val in hyper.items()}
    c = Case(700, n=n, steps=steps, **h)
    p = torch.nn.Parameter(c.input("param", [n]).float())
    opt = torch.optim.AdamW([p], lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                            weight_decay=h["weight_decay"])
    for step in range(steps):
        p.grad = c.input("grad%d" % step, [n], 0.0, 0.5 * (step + 1)).float()
        opt.step()
    state = opt.state[p]
    c.expect("param", p)
    c.expect("m", state["exp_avg"])
    c.expect("v", state["exp_avg_sq"])
    return c.out


def rng_record():
    seed, n, index = 20240520, 6, 7
    center, halfwidth = 0.25, 1.5
    vals = rng_fill_uniform(n, seed, center, halfwidth)
    return {
        "seed": seed,
        "at": ["0x%016x" % int(x) for x in rng_at(seed, np.arange(n, dtype=np.uint64))],
        "substream_index": index,
        "substream": "0x%016x" % rng_substream(seed, index),
        "center": center,
        "halfwidth": halfwidth,
        "uniform_bits": [int(x) for x in vals.view(np.uint32)],
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "data",
                                                               "kernel_reference.json")
    torch.set_default_dtype(torch.float64)
    doc = {
        "generator": "tools/reference/kernel_reference.py, torch " + torch.__version__,
        "rng": rng_record(),
        "gemm": gemm_cases(),
        "layernorm": layernorm_case(),
        "gelu": gelu_case(),
        "rmsnorm": rmsnorm_case(),
        "rope": rope_case(),
        "activations": activations_case(),
        "pointwise": pointwise_case(),
        "row_ops": row_ops_case(),
        "attention": [
            attention_case(800, 2, 5, 5, 4, 2, 3, causal=1),
            attention_case(801, 2, 5, 5, 4, 2, 3, causal=0),
            attention_case(802, 1, 2, 4, 2, 1, 4, causal=0),  # cross-attention, tq != tk
            # T5: scale 1, learned position bias; causal (decoder) and not, GQA and cross
            attention_case(803, 2, 5, 5, 4, 2, 3, causal=1, bias=True, scale=1.0),
            attention_case(804, 3, 3, 4, 2, 1, 4, causal=0, bias=True, scale=1.0),
        ],
        "cross_entropy": cross_entropy_case(),
        "embedding": embedding_case(),
        "elementwise": elementwise_case(),
        "transpose": [
            transpose_case(900, [2, 3, 1, 4], [3, 0, 2, 1]),
            transpose_case(901, [3, 4, 5], [2, 0, 1]),
        ],
        "adamw": adamw_case(),
    }
    # one top-level entry per line: diffs of a regenerated file stay readable
    body = ",\n".join("%s: %s" % (json.dumps(key), json.dumps(val, separators=(",", ":")))
                      for key, val in doc.items())
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("{\n" + body + "\n}\n")
    os.replace(tmp, path)
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
