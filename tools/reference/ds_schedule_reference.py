#!/usr/bin/env python3
"""DeepSpeed's learning-rate schedulers, for tests/test_ds_config.c: for a
set of scheduler sections of a ds_config.json, the learning rate of each
optimizer step as a DeepSpeed engine runs it, which regc train (train/
schedule.c) must reproduce within 1e-7 of the rate.

The formulas are DeepSpeed's deepspeed/runtime/lr_schedules.py (WarmupLR,
WarmupDecayLR, WarmupCosineLR), written out here in plain Python so the
script needs neither DeepSpeed nor torch:

    python3 tools/reference/ds_schedule_reference.py

It writes tests/data/ds_schedule_reference.json. With --check-against
DeepSpeed's lr_schedules.py (a checkout's file), it also runs DeepSpeed's
own classes over a stand-in optimizer (torch and DeepSpeed's logger
replaced by stubs: the classes only read and write param_groups' "lr") and
stops unless every rate agrees exactly.

How the engine steps a scheduler: the constructor sets the rate for the
first optimizer step (last_batch_iteration -1: warmup_min_lr, or 0 for
WarmupCosineLR), and DeepSpeedEngine._take_model_step calls step() after
every applied optimizer step, so step s (from 0) runs at get_lr() with
last_batch_iteration s - 1.

Parameters a section leaves out take DeepSpeed's defaults: warmup_min_lr 0,
warmup_max_lr 0.001 for WarmupDecayLR and the optimizer's lr for WarmupLR,
warmup_num_steps 1000, warmup_type "log", warmup_min_ratio 0,
cos_min_ratio 0.0001. WarmupCosineLR's peak is the optimizer's lr. Each
case also records the rates as regc computes its rate: a float32 learning
rate (train.lr and optimizer.params.lr are floats in regc) times the same
double formula, which the test compares at 1e-7 relative.
"""

import argparse
import json
import math
import os
import struct
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "tests", "data", "ds_schedule_reference.json")


def f32(x):
    """x rounded to float32, as regc holds train.lr."""
    return struct.unpack("f", struct.pack("f", x))[0]


def gamma_warmup(it, w, warmup_type):
    """The warmup's fraction at iteration it < w (DeepSpeed keeps the inverse of log(w))."""
    if warmup_type == "linear":
        return it / w
    inverse_log_warm_up = 1.0 / math.log(w)
    return inverse_log_warm_up * math.log(it + 1)


def rate(sched, params, opt_lr, it):
    """get_lr() of DeepSpeed's scheduler `sched` at last_batch_iteration it."""
    warmup_type = params.get("warmup_type", "log")
    w = max(2, params.get("warmup_num_steps", 1000))
    if sched == "WarmupCosineLR":
        if it < 0:
            return 0.0
        total = params["total_num_steps"]
        wmr = params.get("warmup_min_ratio", 0.0)
        cmr = params.get("cos_min_ratio", 0.0001)
        if it < w:
            ratio = gamma_warmup(it, w, warmup_type)
            ratio_delta = 1.0 - wmr
            return opt_lr * (wmr + ratio * ratio_delta)
        real_last_step = it - w + 1
        real_total_steps = max(1, total - w)
        progress = min(1.0, real_last_step / real_total_steps)
        ratio_delta = 1.0 - cmr
        ratio = (1 + math.cos(math.pi * progress)) / 2
        return opt_lr * max(0.0, cmr + ratio_delta * ratio)
    min_lr = params.get("warmup_min_lr", 0.0)
    default_max = 0.001 if sched == "WarmupDecayLR" else opt_lr
    max_lr = params.get("warmup_max_lr", default_max)
    delta = max_lr - min_lr
    if it < 0:
        return min_lr
    if it < w:
        g = gamma_warmup(it, w, warmup_type)
    elif sched == "WarmupDecayLR":
        total = params["total_num_steps"]
        g = max(0.0, float(total - it) / float(max(1.0, total - w)))
    else:
        g = 1.0
    return min_lr + delta * g


def peak(sched, params, opt_lr):
    """The rate regc holds as train.lr for this section."""
    if sched == "WarmupCosineLR":
        return opt_lr
    return params.get("warmup_max_lr", 0.001 if sched == "WarmupDecayLR" else opt_lr)


def regc_rates(sched, params, opt_lr, steps):
    """The same formula with the peak rounded to float32, as regc's train.lr is."""
    lr32 = f32(peak(sched, params, opt_lr))
    p = dict(params)
    if sched == "WarmupCosineLR":
        return [rate(sched, p, lr32, s - 1) for s in range(steps)]
    p["warmup_max_lr"] = lr32
    return [rate(sched, p, opt_lr, s - 1) for s in range(steps)]


CASES = [
    # (name, scheduler, params, optimizer lr, steps)
    ("warmup_lr_log", "WarmupLR",
     {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 6}, 3e-4, 10),
    ("warmup_lr_linear", "WarmupLR",
     {"warmup_min_lr": 0, "warmup_max_lr": 2e-3, "warmup_num_steps": 5, "warmup_type": "linear"},
     2e-3, 9),
    ("warmup_lr_defaults", "WarmupLR", {"warmup_num_steps": 4}, 5e-4, 7),
    ("warmup_decay_log", "WarmupDecayLR",
     {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4, "total_num_steps": 12},
     1e-3, 14),
    ("warmup_decay_linear", "WarmupDecayLR",
     {"warmup_min_lr": 2e-5, "warmup_max_lr": 4e-4, "warmup_num_steps": 3,
      "total_num_steps": 10, "warmup_type": "linear"}, 4e-4, 12),
    ("warmup_decay_short_total", "WarmupDecayLR",
     {"warmup_max_lr": 1e-3, "warmup_num_steps": 8, "total_num_steps": 5}, 1e-3, 10),
    ("warmup_cosine_log", "WarmupCosineLR",
     {"warmup_num_steps": 4, "total_num_steps": 12}, 6e-4, 14),
    ("warmup_cosine_linear", "WarmupCosineLR",
     {"warmup_num_steps": 3, "total_num_steps": 10, "warmup_type": "linear",
      "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}, 1e-3, 12),
    ("warmup_cosine_one_warmup", "WarmupCosineLR",
     {"warmup_num_steps": 1, "total_num_steps": 6, "cos_min_ratio": 0.0}, 2e-4, 8),
]


def deepspeed_rates(path, sched, params, opt_lr, steps):
    """DeepSpeed's own class, stepped as its engine steps it."""

    class Optimizer:
        def __init__(self, lr):
            self.param_groups = [{"lr": lr}]

    torch = types.ModuleType("torch")
    torch.is_tensor = lambda x: False
    optim = types.ModuleType("torch.optim")
    optim.Optimizer = Optimizer
    torch.optim = optim
    ds = types.ModuleType("deepspeed")
    ds_utils = types.ModuleType("deepspeed.utils")
    ds_utils.logger = types.SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
    saved = {k: sys.modules.get(k) for k in ("torch", "torch.optim", "deepspeed", "deepspeed.utils")}
    sys.modules.update({"torch": torch, "torch.optim": optim, "deepspeed": ds,
                        "deepspeed.utils": ds_utils})
    try:
        module = types.ModuleType("lr_schedules")
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), module.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    opt = Optimizer(opt_lr)
    s = getattr(module, sched)(opt, **params)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])  # the rate this optimizer step runs at
        s.step()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check-against", metavar="LR_SCHEDULES_PY",
                    help="DeepSpeed's deepspeed/runtime/lr_schedules.py to compare with")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    cases = []
    for name, sched, params, opt_lr, steps in CASES:
        want = [rate(sched, params, opt_lr, s - 1) for s in range(steps)]
        if args.check_against:
            got = deepspeed_rates(args.check_against, sched, params, opt_lr, steps)
            if got != want:
                sys.exit(f"{name}: DeepSpeed gives {got}, the formulas here {want}")
        cases.append({
            "name": name,
            "scheduler": {"type": sched, "params": params},
            "optimizer_lr": opt_lr,
            "steps": steps,
            "lr": want,
            "lr_float32_peak": regc_rates(sched, params, opt_lr, steps),
        })
    with open(args.out, "w") as f:
        json.dump({"generator": "tools/reference/ds_schedule_reference.py",
                   "checked_against_deepspeed": bool(args.check_against),
                   "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
