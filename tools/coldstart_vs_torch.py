#!/usr/bin/env python3
"""Cold start of a training step: torch.compile (full and regional) and eager
PyTorch next to regc, at several depths of one Hugging Face model.

    tools/coldstart_vs_torch.py MODEL_DIR --layers 2,4,8 --batch 4 --seq 64 \\
        --regc build/regc --out coldstart
    tools/coldstart_vs_torch.py MODEL_DIR --device cuda --precision bf16 \\
        --layers 12 --batch 16 --seq 1024 --modes eager,regional,regc

For every depth, the model's config.json with that many layers (random
weights: compile time does not depend on them) is trained --steps steps of
AdamW in a fresh process per mode, with a fresh, empty inductor cache:

    eager      PyTorch without compilation
    full       torch.compile(model)
    regional   Accelerate's compile_regions(model): each repeated block
               compiled once and reused (torch's nested_compile_region)
    regc       `regc coldstart` on the same config.json: compile (regional,
               O1, no cache), set-up, and its own training steps

and reports the time to the end of the first step (compilation included)
and the median step after it. --device cuda runs every mode on the GPU
(regc with --backend cuda), timed after the device has finished; --precision
bf16 runs PyTorch under torch.autocast in bf16 and regc with --precision
bf16; --modes keeps some of the four. OUT/coldstart.md gets the table, OUT/coldstart.svg
a chart of the time to the first step against depth, OUT/coldstart.json the
figures. Needs PyTorch 2.x, transformers and accelerate.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ["eager", "full", "regional", "regc"]
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def child(args):
    """One mode's training in this (fresh) process; prints one JSON line."""
    import torch
    import torch.nn.functional as F
    import transformers
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = transformers.AutoConfig.from_pretrained(args.config_dir)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.to(device)
    model.train(False)  # no dropout, as regc
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if args.child == "full":
        model = torch.compile(model)
    elif args.child == "regional":
        from accelerate.utils import compile_regions
        model = compile_regions(model)
    vocab = config.vocab_size
    bf16 = args.precision == "bf16"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.steps):
        ids = torch.randint(0, vocab, (args.batch, args.seq), device=device)
        targets = torch.randint(0, vocab, (args.batch, args.seq), device=device)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1000.0)
    print(json.dumps({"first_ms": times[0], "step_ms": statistics.median(times[1:])}))
    return 0


def depth_dir(model_dir, layers, root):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    keys = [k for k in LAYER_KEYS if k in config]
    if not keys:
        raise SystemExit("coldstart_vs_torch: %s/config.json names no layer count" % model_dir)
    for k in keys:
        config[k] = layers
    out = os.path.join(root, "layers%d" % layers)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return out


def run_torch(mode, config_dir, args):
    with tempfile.TemporaryDirectory(prefix="regc-inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                   TORCHINDUCTOR_AUTOGRAD_CACHE="0", OMP_NUM_THREADS=str(args.threads))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--config-dir",
               config_dir, "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
               str(args.steps), "--threads", str(args.threads), "--device", args.device,
               "--precision", args.precision]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = (time.perf_counter() - t0) * 1000.0
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["?"]
        raise SystemExit("coldstart_vs_torch: %s at %s: %s" % (mode, config_dir, tail[0]))
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    rec["process_ms"] = wall
    return rec


def run_regc(config_dir, layers, args):
    cmd = [args.regc, "coldstart", "--model", config_dir, "--layers", str(layers), "--repeat",
           "1", "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
           "--threads", str(args.threads), "--precision", args.precision, "--json"]
    if args.device == "cuda":
        cmd += ["--backend", "cuda"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("coldstart_vs_torch: %s: %s" % (" ".join(cmd), out.stderr.strip()))
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        if rec["mode"] == "regional":
            first = rec["total_ms"] + (rec["setup_ms"] or 0.0) + rec["first_step_ms"]
            return {"first_ms": first, "step_ms": rec["step_ms"], "compile_ms": rec["total_ms"]}
    raise SystemExit("coldstart_vs_torch: regc coldstart reported no regional mode")


def svg_chart(rows, depths, args_modes, path):
    """Time to the first step against depth, one polyline per mode, log y."""
    import math
    w, h, left, bottom, top, right = 640, 380, 70, 50, 30, 130
    vals = [r[m]["first_ms"] for r in rows for m in args_modes]
    lo, hi = math.log10(min(vals)) - 0.2, math.log10(max(vals)) + 0.2
    x = {d: left + (w - left - right) * (i / max(1, len(depths) - 1)) for i, d in
         enumerate(depths)}

    def y(v):
        return top + (h - top - bottom) * (1 - (math.log10(v) - lo) / (hi - lo))
    colours = {"eager": "#777777", "full": "#d62728", "regional": "#ff7f0e", "regc": "#1f77b4"}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (w, h),
           '<text x="%d" y="18">time to the end of the first training step (ms, log)</text>'
           % left]
    for e in range(int(math.floor(lo)), int(math.ceil(hi)) + 1):
        if lo <= e <= hi:
            out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>'
                       '<text x="%d" y="%.1f" text-anchor="end">%g</text>'
                       % (left, w - right, y(10 ** e), y(10 ** e), left - 6, y(10 ** e) + 4,
                          10 ** e))
    for d in depths:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x[d], h - bottom + 18,
                                                                           d))
    out.append('<text x="%d" y="%d" text-anchor="middle">layers</text>'
               % ((left + w - right) // 2, h - 10))
    for i, m in enumerate(args_modes):
        pts = " ".join("%.1f,%.1f" % (x[r["layers"]], y(r[m]["first_ms"])) for r in rows)
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (colours[m], pts))
        out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (w - right + 10, top + 20 * i + 10,
                                                                colours[m], m))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--layers", default="2,4,8")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of " + ",".join(MODES))
    ap.add_argument("--regc", default="build/regc")
    ap.add_argument("--out", default="coldstart")
    ap.add_argument("--child", choices=["eager", "full", "regional"], help=argparse.SUPPRESS)
    ap.add_argument("--config-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not args.model_dir or args.steps < 2:
        ap.error("MODEL_DIR is required, and --steps must be at least 2")
    depths = [int(v) for v in args.layers.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error("--modes: a comma-separated list of " + ",".join(MODES))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="regc-depths-") as root:
        for layers in depths:
            cfg = depth_dir(args.model_dir, layers, root)
            row = {"layers": layers}
            for mode in modes:
                row[mode] = run_regc(cfg, layers, args) if mode == "regc" else \
                    run_torch(mode, cfg, args)
            rows.append(row)
            print("%3d layers: " % layers + ", ".join(
                "%s first %.0f ms, step %.0f ms" % (m, row[m]["first_ms"], row[m]["step_ms"])
                for m in modes), flush=True)
    table = ["| layers | " + " | ".join("%s: first step / steady step (ms)" % m for m in modes)
             + " |", "|---|" + "---|" * len(modes)]
    for r in rows:
        table.append("| %d | " % r["layers"] + " | ".join(
            "%.1f / %.1f" % (r[m]["first_ms"], r[m]["step_ms"]) for m in modes) + " |")
    with open(os.path.join(args.out, "coldstart.md"), "w") as f:
        f.write("%s, B=%d, T=%d, %s, %s, %d threads, %d steps\n\n" % (
            args.model_dir, args.batch, args.seq, args.device, args.precision, args.threads,
            args.steps))
        f.write("\n".join(table) + "\n")
    with open(os.path.join(args.out, "coldstart.json"), "w") as f:
        json.dump({"model": args.model_dir, "batch": args.batch, "seq": args.seq,
                   "device": args.device, "precision": args.precision,
                   "threads": args.threads, "rows": rows}, f, indent=1)
    svg_chart(rows, depths, modes, os.path.join(args.out, "coldstart.svg"))
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
