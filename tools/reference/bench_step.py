#!/usr/bin/python3
"""Step time of one model in PyTorch eager and in `regc train`, side by side
(a benchmark: it prints figures and asserts nothing about speed).

Both run the same model (weights drawn with regc's counter-based RNG, written
once as a Hugging Face directory that regc loads), the same token file in
llm.c's format, the same batch, AdamW settings and thread count. They take
turns in rounds (the machine's speed drifts), and for each it reports the
median of the timed steps of every round; for regc also the achieved
GFLOP/s and its fraction of two GEMM rates measured by build/bench_sgemm at
the step's own GEMM shapes: OpenBLAS's cblas_sgemm and the CPU backend's own
GEMM (the ceiling regc's step can reach). tools/bench_vs_torch.sh runs
it; run it alone with Debian's python3:

  /usr/bin/python3 tools/reference/bench_step.py --model gpt2-124m --regc build/regc \\
      --sgemm build/bench_sgemm --workdir /tmp/regc-bench

Step FLOPs are counted from the shapes as in PaLM's MFU formula: 6 per weight
of every matmul per token (forward and backward, the LM head included) plus
12 * layers * heads * head_dim * T per token for the attention scores and
their use (the full T x T, as eager PyTorch computes it).
"""

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time

import numpy as np
import torch

import gpt2_reference
import llama_reference
from reference_common import init_params, make_tokens

SEED = 1234
LR = 3e-4
GPT2_124M = dict(name="gpt2-124m", seed=SEED, vocab_size=50257, n_positions=1024, n_embd=768,
                 n_layer=12, n_head=12, n_inner=None, layer_norm_epsilon=1e-5,
                 tie_word_embeddings=True)
# llama-tiny's shape (grouped-query attention with two query heads per kv
# head, SwiGLU, untied head) scaled to GPT-2 124M's width and depth.
LLAMA_127M = dict(name="llama-127m", seed=SEED, vocab_size=32000, hidden_size=768,
                  intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=6, head_dim=None, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
MODELS = {"gpt2-124m": (GPT2_124M, gpt2_reference), "llama-127m": (LLAMA_127M, llama_reference)}


def linears(case):
    """(in, out, weight stored [out, in]) of every matmul with a weight, LM head included"""
    if "n_embd" in case:
        C, V = case["n_embd"], case["vocab_size"]
        inner = gpt2_reference.inner_size(case)
        layer = [(C, 3 * C, False), (C, C, False), (C, inner, False), (inner, C, False)]
        return layer * case["n_layer"] + [(C, V, True)]
    C, V, inner = case["hidden_size"], case["vocab_size"], case["intermediate_size"]
    D = llama_reference.head_dim(case)
    QD, KD = case["num_attention_heads"] * D, case["num_key_value_heads"] * D
    layer = [(C, QD, True), (C, KD, True), (C, KD, True), (QD, C, True),
             (C, inner, True), (C, inner, True), (inner, C, True)]
    return layer * case["num_hidden_layers"] + [(C, V, True)]


def attention_dims(case):
    """(layers, heads * head_dim)"""
    if "n_embd" in case:
        return case["n_layer"], case["n_embd"]
    return case["num_hidden_layers"], case["num_attention_heads"] * llama_reference.head_dim(case)


def step_flop(case, B, T):
    tokens = B * T
    weights = sum(i * o for i, o, _ in linears(case))
    layers, width = attention_dims(case)
    return 6.0 * weights * tokens + 12.0 * layers * width * T * tokens


def gemm_shapes(case, B, T):
    """M,N,K,TA,TB,COUNT of the step's weight GEMMs: forward y = x W, then
    dx = dy W^T and dW = x^T dy (or dW = dy^T x for a weight stored [out, in])"""
    count = {}
    rows = B * T
    for i, o, out_major in linears(case):
        shapes = [(rows, o, i, 0, int(out_major)), (rows, i, o, 0, int(not out_major))]
        shapes.append((o, i, rows, 1, 0) if out_major else (i, o, rows, 1, 0))
        for s in shapes:
            count[s] = count.get(s, 0) + 1
    return ["%d,%d,%d,%d,%d,%d" % (s + (n,)) for s, n in count.items()]


def write_safetensors(path, arrays):
    """arrays: (name, float32 array) in order; the format is a little-endian
    u64 header length, the JSON header (padded to 8 bytes), then the data"""
    header, offset = {}, 0
    for name, a in arrays:
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, a in arrays:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def write_tokens(path, tokens):
    """llm.c's token file: 256 int32 of header (magic, version, count), uint16 tokens"""
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def prepare(case, module, workdir, n_tokens):
    """the model directory, the token file and the initial weights"""
    model_dir = os.path.join(workdir, case["name"])
    os.makedirs(model_dir, exist_ok=True)
    specs = module.param_specs(case)
    init = init_params(case["seed"], specs)
    write_safetensors(os.path.join(model_dir, "model.safetensors"),
                      [(name, init[name]) for name, *_ in specs])
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(module.hf_config(case), f, indent=1)
    tokens = make_tokens(case["seed"], n_tokens, case["vocab_size"])
    data = os.path.join(workdir, case["name"] + ".bin")
    write_tokens(data, tokens)
    return model_dir, data, init, tokens


class TorchTrainer:
    """eager PyTorch training of one model: forward, backward, AdamW; the
    steps continue from one call to the next"""

    def __init__(self, case, module, init, tokens, bf16):
        self.bf16 = bf16  # the forward under CPU autocast to bfloat16, as regc's precision bf16
        self.p = {name: torch.tensor(a, requires_grad=True) for name, a in init.items()}
        self.opt = torch.optim.AdamW(list(self.p.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                     weight_decay=0.0)
        self.case, self.module, self.k = dict(case, tokens=tokens), module, 0

    def run(self, steps):
        """per-step (seconds, loss) of the next `steps` steps"""
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.module.forward_loss(self.p, self.k, self.case)
            loss.backward()
            self.opt.step()
            out.append((time.perf_counter() - t0, loss.item()))
            self.k += 1
        return out


def run_regc(regc, model_dir, data, B, T, steps, threads, precision):
    """per-step (seconds, loss) from `regc train --json`"""
    cmd = [regc, "train", "--model", model_dir, "--data", data, "--batch", str(B), "--seq", str(T),
           "--steps", str(steps), "--threads", str(threads), "--lr", str(LR), "--json",
           "--precision", precision]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if res.returncode != 0:
        sys.exit("bench_step.py: %s failed (exit %d):\n%s" % (" ".join(cmd), res.returncode,
                                                             res.stderr))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return [(r["ms"] / 1e3, r["loss"]) for r in rows], cmd, res.stderr


def run_sgemm(sgemm, shapes, threads, kernel):
    """(GFLOP/s of the mix, the kernel's description of itself); kernel is
    "openblas" (cblas_sgemm) or "regc" (the CPU backend's GEMM)"""
    cmd = [sgemm, "--threads", str(threads), "--repeat", "5", "--kernel", kernel] + shapes
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, universal_newlines=True, check=True)
    lines = res.stdout.splitlines()
    mix = [line for line in lines if line.startswith("mix:")]
    return float(mix[0].split()[-2]) * 1e9, lines[0].split(", threads")[0]


def sgemm_rates(sgemm, shapes, threads, precision):
    """{kernel: (GFLOP/s, description)} for OpenBLAS and regc's GEMM (its
    bf16 one in bf16)"""
    own = "regc-bf16" if precision == "bf16" else "regc"
    return {"openblas": run_sgemm(sgemm, shapes, threads, "openblas"),
            "regc": run_sgemm(sgemm, shapes, threads, own)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4, help="timed steps of each per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds, each timing both, in alternating order")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed steps first: PyTorch's once, regc's in every round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: PyTorch under CPU autocast, regc with --precision bf16")
    ap.add_argument("--regc", required=True)
    ap.add_argument("--sgemm", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    if a.steps < 1 or a.rounds < 1 or a.warmup < 0:
        sys.exit("bench_step.py: --steps and --rounds must be at least 1, --warmup at least 0")
    case, module = MODELS[a.model]
    B, T = a.batch, a.seq
    case = dict(case, batch=B, seq=T)
    torch.set_num_threads(a.threads)

    t0 = time.perf_counter()
    regc_steps_per_run = a.warmup + a.steps
    n_tokens = max(a.warmup + a.rounds * a.steps, regc_steps_per_run) * B * T + 1
    model_dir, data, init, tokens = prepare(case, module, a.workdir, n_tokens)
    n_params = sum(x.size for x in init.values())
    print("model %s: %.1fM parameters, B=%d T=%d, %s, %d threads, %d rounds of %d timed steps "
          "each (%d warm-up); written in %.1f s" % (a.model, n_params / 1e6, B, T, a.precision,
                                                    a.threads, a.rounds, a.steps, a.warmup,
                                                    time.perf_counter() - t0), flush=True)

    # the sgemm rates are ceilings: the better of a run before and one after
    # the two trainings, so a burst of other load on the machine lowers them less
    rates = sgemm_rates(a.sgemm, gemm_shapes(case, B, T), a.threads, a.precision)
    blas = rates["openblas"][1]
    print(blas + (" (OPENBLAS_CORETYPE=%s)" % os.environ["OPENBLAS_CORETYPE"]
                  if "OPENBLAS_CORETYPE" in os.environ else ""), flush=True)
    print(rates["regc"][1], flush=True)

    # The machine's speed drifts over minutes, so the two take turns: each
    # round times both, the first of the pair alternating, and the medians
    # are over every round's timed steps.
    trainer = TorchTrainer(case, module, init, tokens, a.precision == "bf16")
    del init
    torch_first = trainer.run(a.warmup)
    torch_steps, regc_steps, regc_first = [], [], None
    for r in range(a.rounds):
        for which in ("torch", "regc") if r % 2 == 0 else ("regc", "torch"):
            if which == "torch":
                got = trainer.run(a.steps)
                torch_first = torch_first or got
                torch_steps += got
            else:
                got, cmd, err = run_regc(a.regc, model_dir, data, B, T, regc_steps_per_run,
                                         a.threads, a.precision)
                if regc_first is None:
                    print("regc:    OMP_NUM_THREADS=%d %s" % (a.threads, " ".join(cmd)))
                    print(err, end="", flush=True)
                    regc_first = got
                regc_steps += got[a.warmup:]
        print("round %d: pytorch %s s, regc %s s" % (
            r + 1, " ".join("%.3f" % t for t, _ in torch_steps[-a.steps:]),
            " ".join("%.3f" % t for t, _ in regc_steps[-a.steps:])), flush=True)
    after = sgemm_rates(a.sgemm, gemm_shapes(case, B, T), a.threads, a.precision)
    rate = max(rates["openblas"][0], after["openblas"][0])
    regc_rate = max(rates["regc"][0], after["regc"][0])

    flop = step_flop(case, B, T)
    t_torch = statistics.median(t for t, _ in torch_steps)
    t_regc = statistics.median(t for t, _ in regc_steps)
    loss_torch, loss_regc = torch_first[0][1], regc_first[0][1]
    print("step FLOPs %.1f G; at the step's GEMM shapes OpenBLAS sgemm %.1f GFLOP/s, "
          "regc's GEMM %.1f GFLOP/s" % (flop / 1e9, rate / 1e9, regc_rate / 1e9))
    print("first loss: torch %.6f  regc %.6f  (relative difference %.1e)" %
          (loss_torch, loss_regc, abs(loss_regc - loss_torch) / abs(loss_torch)))
    print("%-8s %14s %10s %18s %15s" % ("", "median step s", "GFLOP/s", "of OpenBLAS sgemm",
                                         "of regc's GEMM"))
    for name, t in (("pytorch", t_torch), ("regc", t_regc)):
        print("%-8s %14.3f %10.1f %17.0f%% %14.0f%%" % (name, t, flop / t / 1e9,
                                                      100 * flop / t / rate,
                                                      100 * flop / t / regc_rate))
    print("speed-up of regc over pytorch: %.2fx" % (t_torch / t_regc))
    print("RESULT %s" % json.dumps({
        "model": a.model, "precision": a.precision, "blas": blas, "batch": B, "seq": T, "threads": a.threads, "rounds": a.rounds, "params": int(n_params),
        "step_gflop": flop / 1e9, "torch_s": t_torch, "regc_s": t_regc,
        "speedup": t_torch / t_regc, "regc_gflops": flop / t_regc / 1e9,
        "sgemm_gflops": rate / 1e9, "fraction_of_sgemm": flop / t_regc / rate,
        "regc_gemm_gflops": regc_rate / 1e9, "fraction_of_regc_gemm": flop / t_regc / regc_rate,
        "torch_steps_s": [t for t, _ in torch_steps], "regc_steps_s": [t for t, _ in regc_steps]}))


if __name__ == "__main__":
    main()
