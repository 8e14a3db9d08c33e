#!/tmp/venv/bin/python
"""LoRA training references from Hugging Face Transformers + PEFT, for a C
test that compares regc's LoRA training with them.

NOT part of the test suite and not run by it: it needs torch 2.x,
transformers, peft and safetensors (Debian's python3 has only torch 1.13),
so run it by hand in a virtual environment that has them:

    /tmp/venv/bin/python tools/reference/lora_reference.py

It writes tests/data/lora_reference.json and, per case, the PEFT adapter that
training starts from, exactly as PeftModel.save_pretrained writes it:
tests/data/lora/<case>/adapter_model.safetensors and adapter_config.json.

The base model of every case is the FIRST case of tests/data/llama_reference.json
(written by llama_reference.py): its config.json, its counter-based random
weights (reference_common.init_params), its token stream, batch, seq, lr,
weight decay and schedule. The JSON copies that record into each case's
"base", with every field tests/support/test_train_case.c reads, so the C test
rebuilds the base model exactly as test_train_reference.c does, loads the
adapter from "adapter_dir" and trains `steps` steps of it.

Here the base is Transformers' own LlamaForCausalLM (float32, eager
attention) rather than llama_reference.py's written-out forward; the script
prints the check that its loss on batch 0 matches that reference's first
loss. The LoRA weights are set to nonzero counter-based values (B too, so
the adapter changes the loss from step 0), saved, then trained with
torch.optim.AdamW over the LoRA parameters only (PEFT freezes the rest).

    /tmp/venv/bin/python tools/reference/lora_reference.py --check-regc build/regc

checks a built regc against the JSON instead, rewriting nothing: per case it
writes the base model (config.json, fp32 model.safetensors) and tokens.bin to
a temporary directory as tests/support/test_train_case.c does, runs `regc
train --adapter tests/data/lora/<case> ... --save <tmp>/saved`, loads the
saved adapter with PeftModel.from_pretrained and prints regc's losses and
PEFT's next-batch loss against the JSON's (exit 1 past 1e-5 relative), and
any warning PEFT gives on the saved adapter_config.json.

"qlora_cases": QLoRA, the LoRA cases' adapters (tests/data/lora/<adapter>)
trained on the same base loaded in 4 bits by Transformers with bitsandbytes
(BitsAndBytesConfig: NF4, double quantisation, compute in float32), as
PeftModel.from_pretrained(..., is_trainable=True) trains them; each records
its quantised layers' CRC-32s (in kernels/nf4_format.h's blob order), so the C
test checks regc's quantisation of the same weights byte for byte, and its
losses (regc within 1e-4). --check-regc runs them with --load-in-4bit on.

"graph_cases" (a list of its own, so the C test that reads "cases" is
unaffected): the same LoRA on a graph model, the tiny Qwen2 that
export_cases.py exported to tests/data/exports/qwen2/ (graph.json and
constants.safetensors beside the checkpoint Transformers saved,
model.safetensors), which regc trains as

    regc train --model tests/data/exports/qwen2/graph.json \
        --weights tests/data/exports/qwen2/model.safetensors \
        --data tests/data/lora/qwen2_tokens.bin --batch 2 --seq 12 --steps 10 \
        --lr <lr> --weight-decay <weight_decay> --json --adapter tests/data/lora/<case>

Here the base is Transformers' Qwen2ForCausalLM (float32, eager attention)
with export_cases.py's config, its weights loaded strictly from that
model.safetensors (the embedding tied to lm_head, as the export has it); the
script prints its loss on batch 0 against export_cases.py's PyTorch loss
(tests/data/exports/reference.json; its token stream starts as ours) and,
when a built regc is found (--regc, default build/regc), against `regc train
... --steps 1 --lr 1e-30 --json` without the adapter. The tokens are
reference_common.make_tokens(export seed, GRAPH["n_tokens"], vocab), written
as an llm.c token file, tests/data/lora/qwen2_tokens.bin; batch k is
llm.c's (regc_tokens_batch's). --check-regc checks these cases too.
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zlib

import bitsandbytes as bnb
import numpy as np
import peft
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from reference_common import default_out, get_batch, init_params, lr_lambda, make_tokens

STEPS = 10
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, bias="none", use_rslora=False)
CASES = [
    # seed: the LoRA weights' own counter-based stream (distinct from the base's)
    dict(name="llama_qv", target_modules=["q_proj", "v_proj"], lora_seed=4001),
    dict(name="llama_all", target_modules="all-linear", lora_seed=4002),
]
# uniform in [center - halfwidth, center + halfwidth), as reference_common
A_INIT, B_INIT = (0.0, 0.1), (0.0, 0.05)
# The graph cases: LoRA on export_cases.py's exported Qwen2 (its CASES entry
# GRAPH["export"], in tests/data/exports/<export>/), trained at the batch and
# sequence the graph was built for, constant learning rate, AdamW's defaults.
GRAPH = dict(export="qwen2", lr=3e-3, weight_decay=0.0, n_tokens=1000,
             tokens="tests/data/lora/qwen2_tokens.bin")
# QLoRA: the LoRA cases' adapters on the same base loaded in 4 bits
# (Transformers' BitsAndBytesConfig, these keys; compute in float32, the
# base's dtype)
QLORA = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
             bnb_4bit_compute_dtype="float32")
QLORA_CASES = [dict(name="qlora_qv", adapter="llama_qv"),
               dict(name="qlora_all", adapter="llama_all")]
GRAPH_CASES = [
    dict(name="qwen2_qv", target_modules=["q_proj", "v_proj"], lora_seed=4003),
    dict(name="qwen2_all", target_modules="all-linear", lora_seed=4004),
]
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# what the C harness needs to rebuild the base (test_train_case.c reads these)
BASE_KEYS = ("name", "seed", "config", "params", "batch", "seq", "lr", "weight_decay",
             "n_tokens", "extra_args", "param_sum")


def batch_loss(model, tokens, k, base):
    """Batch k's mean next-token loss. Not HF's labels= path, which shifts
    inside each row and drops its last position: the reference (and regc)
    take targets from the token stream one past the inputs."""
    idx, targets = get_batch(tokens, k, base["batch"], base["seq"])
    logits = model(input_ids=idx).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_base(base):
    """LlamaForCausalLM from the case's config.json, with the reference's weights.
    Its parameter names are already Transformers' (llama_reference.py lists
    them in LlamaForCausalLM's state_dict order), so no mapping is needed."""
    config = LlamaConfig(**base["config"], attn_implementation="eager")
    model = LlamaForCausalLM(config).to(torch.float32)
    assert model.config._attn_implementation == "eager"
    specs = [(n, tuple(s), c, h) for n, s, c, h in base["params"]]
    weights = init_params(base["seed"], specs)
    total = float(sum(np.sum(a, dtype=np.float64) for a in weights.values()))
    assert abs(total - base["param_sum"]) <= 1e-9 * abs(base["param_sum"]), "RNG drift"
    # strict: every parameter of the model comes from the list, and nothing else
    model.load_state_dict({n: torch.from_numpy(a) for n, a in weights.items()}, strict=True)
    return model.eval()  # dropout is 0 anyway; eval() only silences train-mode paths


def file_key(name):
    """PEFT's parameter name -> its key in adapter_model.safetensors: the
    adapter name ("default") is dropped, nothing else changes."""
    return name.replace(".default", "")


LORA_INIT_HOW = ("the adapter file is the source of truth; it was made as: tensor t of "
                 "\"tensors\" (PEFT's named_parameters order) = "
                 "regc_rng_fill_uniform(numel, regc_rng_substream(seed, t), center, "
                 "halfwidth) in row-major order of its shape, i.e. "
                 "reference_common.init_params(seed, tensors); lora_A [r, in] center 0 "
                 "halfwidth 0.1, lora_B [out, r] center 0 halfwidth 0.05")


def train_adapter(model, params, tokens, bs, lr, weight_decay, schedule):
    """STEPS AdamW steps exactly as reference_common.train: one group, HF's
    schedule factor set before each step, loss recorded before its update.
    The losses, and the loss on the batch after."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=weight_decay)
    sched = dict(schedule, lr=lr, steps=STEPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = batch_loss(model, tokens, step, bs)
        loss.backward()
        losses.append(loss.item())
        for group in opt.param_groups:
            group["lr"] = lr * lr_lambda(sched, step)
        opt.step()
    with torch.no_grad():
        next_loss = batch_loss(model, tokens, STEPS, bs).item()
    return losses, next_loss


def lora_train(model, case, tokens, bs, lr, weight_decay, schedule, out_dir):
    """Wrap model with the case's LoRA, set its weights, save the adapter to
    out_dir/<case>, train STEPS AdamW steps; bs holds "batch" and "seq".
    What the JSON records of it."""
    lora_cfg = peft.LoraConfig(target_modules=case["target_modules"], **LORA)
    model = peft.get_peft_model(model, lora_cfg)
    # Nonzero A and B, counter-based: tensor t of PEFT's named_parameters()
    # order draws from substream t of lora_seed (reference_common.init_params).
    lora = [(n, p) for n, p in model.named_parameters() if "lora_" in n]
    assert all(p.requires_grad for _, p in lora)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [n for n, _ in lora]
    specs = [(file_key(n), tuple(p.shape), *(A_INIT if ".lora_A." in n else B_INIT))
             for n, p in lora]
    init = init_params(case["lora_seed"], specs)
    with torch.no_grad():
        for (n, p), (key, *_) in zip(lora, specs):
            p.copy_(torch.from_numpy(init[key]))

    # The adapter training starts from, as PEFT writes it. PEFT also writes a
    # boilerplate model card (README.md); it holds nothing the test reads.
    adapter_dir = os.path.join(out_dir, case["name"])
    shutil.rmtree(adapter_dir, ignore_errors=True)
    model.save_pretrained(adapter_dir)
    if os.path.exists(os.path.join(adapter_dir, "README.md")):
        os.remove(os.path.join(adapter_dir, "README.md"))
    with safetensors.safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
        peft_keys = [[k, list(f.get_slice(k).get_shape())] for k in f.keys()]
    assert sorted(k for k, _ in peft_keys) == sorted(s[0] for s in specs)

    losses, next_loss = train_adapter(model, [p for _, p in lora], tokens, bs, lr, weight_decay,
                                      schedule)
    with torch.no_grad():
        # merge on a copy: merge_and_unload rewrites the base weights in place
        merged = copy.deepcopy(model).merge_and_unload()
        merged_next_loss = batch_loss(merged, tokens, STEPS, bs).item()
    print("%-10s %d tensors, losses %s\n%-10s next %.9f merged %.9f (rel %.1e)" %
          (case["name"], len(peft_keys), " ".join("%.6f" % x for x in losses), "", next_loss,
           merged_next_loss, abs(next_loss - merged_next_loss) / abs(next_loss)))
    return dict(specs=specs, peft_keys=peft_keys, losses=losses,
                next_loss=next_loss, merged_next_loss=merged_next_loss)


def lora_record(case):
    return {"r": LORA["r"], "lora_alpha": LORA["lora_alpha"],
            "target_modules": case["target_modules"], "use_rslora": LORA["use_rslora"],
            "lora_dropout": LORA["lora_dropout"], "bias": LORA["bias"]}


def check_base_loss(name, model, tokens, bs, want, source):
    """The base model's loss on batch 0 against the one `source` recorded: the
    same model before any adapter."""
    with torch.no_grad():
        base_loss = batch_loss(model, tokens, 0, bs).item()
    rel = abs(base_loss - want) / abs(want)
    print("%-10s base loss on batch 0: transformers %.9f, %s %.9f, rel %.1e" %
          (name, base_loss, source, want, rel))
    assert rel < 1e-5, "Transformers' model disagrees with %s" % source
    return base_loss


def run_case(case, base, tokens, out_dir):
    model = build_base(base)
    base_loss = check_base_loss(case["name"], model, tokens, base, base["reference_loss0"],
                                "llama_reference")

    t = lora_train(model, case, tokens, base, base["lr"], base["weight_decay"], base["schedule"],
                   out_dir)
    return {
        "name": case["name"],
        "base": {k: base[k] for k in BASE_KEYS},
        "base_source": "tests/data/llama_reference.json, cases[0]",
        "base_loss_batch0": base_loss,
        "adapter_dir": "tests/data/lora/" + case["name"],
        "lora": lora_record(case),
        "lora_init": {
            "how": LORA_INIT_HOW,
            "seed": case["lora_seed"],
            "tensors": [[k, list(s), c, h] for k, s, c, h in t["specs"]],
        },
        "steps": STEPS,
        "optimizer": "torch.optim.AdamW over the LoRA tensors only, betas (0.9, 0.999), "
                     "eps 1e-8, the base's lr, weight_decay and schedule; step k trains "
                     "on batch k",
        "losses": t["losses"],
        "next_loss": t["next_loss"],
        "merged_next_loss": t["merged_next_loss"],
        "peft_keys": t["peft_keys"],
    }


# ---------------------------------------------------------------------------
# The graph cases: LoRA on an exported model (export_cases.py's Qwen2)
# ---------------------------------------------------------------------------
def graph_setup():
    """Everything the graph cases share: export_cases.py's case of the export
    (its config, seed, batch and seq), the paths, the token stream."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import export_cases  # its CASES: the config the export was made with
    ex = next(c for c in export_cases.CASES if c["name"] == GRAPH["export"])
    assert ex["arch"] == "Qwen2"
    d = "tests/data/exports/" + GRAPH["export"]
    g = dict(GRAPH, export_case=ex, config=ex["config"], batch=ex["batch"], seq=ex["seq"],
             token_seed=ex["seed"], vocab=ex["config"]["vocab_size"],
             graph=d + "/graph.json", weights=d + "/model.safetensors")
    g["token_stream"] = make_tokens(g["token_seed"], g["n_tokens"], g["vocab"])
    g["token_bytes"] = token_file_bytes(g["token_stream"])
    # export_cases.py's PyTorch loss of the export on its batch 0: its stream
    # is make_tokens(seed, its n_tokens, vocab), which ours extends
    with open(os.path.join(REPO, "tests/data/exports/reference.json")) as f:
        ref = json.load(f)
    rec = next(c for c in ref["cases"] if c["name"] == GRAPH["export"])
    assert (rec["seed"], rec["batch"], rec["seq"], rec["vocab"]) == \
        (ex["seed"], ex["batch"], ex["seq"], g["vocab"])
    assert rec["n_tokens"] <= g["n_tokens"]
    g["export_loss0"] = rec["losses"][0]
    return g


def token_file_bytes(tokens):
    """llm.c's token file: 256 int32 header (magic, version, count), uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, len(tokens)
    return header.tobytes() + tokens.astype("<u2").tobytes()


def build_graph_base(g):
    """Qwen2ForCausalLM with the export's config and its weights, strictly:
    every parameter from model.safetensors, the checkpoint the export was
    made from, which holds the tied embedding once, as Transformers saves
    it (model.embed_tokens.weight, which the graph's embedding and head
    read); the graph's constants are beside it, not in it."""
    config = Qwen2Config(**g["config"], attn_implementation="eager")
    model = Qwen2ForCausalLM(config).to(torch.float32)
    assert model.config._attn_implementation == "eager"
    with open(os.path.join(REPO, g["graph"])) as f:
        graph = json.load(f)
    consts = {t["name"] for t in graph["tensors"] if t["role"] == "constant"}
    state = safetensors.torch.load_file(os.path.join(REPO, g["weights"]))
    assert not consts & set(state), "the checkpoint holds a constant of the graph"
    tied = config.tie_word_embeddings
    assert tied == ("lm_head.weight" not in state), "tied as the checkpoint is"
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


def regc_json(regc, args):
    run = subprocess.run([regc, "train", *args, "--json"], capture_output=True, text=True,
                         cwd=REPO)
    if run.returncode:
        sys.stderr.write(run.stderr)
        run.check_returncode()
    out = run.stdout
    reports = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [r["loss"] for r in reports if "step" in r and "loss" in r]


def regc_graph_args(g, tokens_path, steps, lr, weight_decay):
    return ["--model", g["graph"], "--weights", g["weights"], "--data", tokens_path,
            "--batch", str(g["batch"]), "--seq", str(g["seq"]), "--steps", str(steps),
            "--lr", repr(lr), "--weight-decay", repr(weight_decay)]


def run_graph_case(case, g, out_dir, regc):
    tokens = g["token_stream"]
    model = build_graph_base(g)
    base_loss = check_base_loss(case["name"], model, tokens, g, g["export_loss0"], "export_cases")
    if regc:
        # the graph model without LoRA, one step whose update is nil: its loss on batch 0
        got = regc_json(regc, regc_graph_args(g, g["tokens_path"], 1, 1e-30, 0.0))[0]
        rel = abs(got - base_loss) / abs(base_loss)
        print("%-10s base loss on batch 0: transformers %.9f, regc %.9f, rel %.1e" %
              (case["name"], base_loss, got, rel))
        assert rel < 1e-5, "regc's graph model disagrees with Transformers' Qwen2"

    t = lora_train(model, case, tokens, g, g["lr"], g["weight_decay"], {}, out_dir)
    targeted = sorted({k.rsplit(".lora_", 1)[0] for k, _ in t["peft_keys"]})
    print("%-10s LoRA on %s" % (case["name"], " ".join(targeted)))
    ex = g["export_case"]
    return {
        "name": case["name"],
        "graph": g["graph"],
        "weights": g["weights"],
        "tokens": g["tokens"],
        "batch": g["batch"],
        "seq": g["seq"],
        "lr": g["lr"],
        "weight_decay": g["weight_decay"],
        "steps": STEPS,
        "adapter_dir": "tests/data/lora/" + case["name"],
        "lora": lora_record(case),
        "losses": t["losses"],
        "next_loss": t["next_loss"],
        "merged_next_loss": t["merged_next_loss"],
        "base_source": "tools/reference/export_cases.py, case %r: Transformers' %sForCausalLM "
                       "with this config (float32, eager attention), tie_word_embeddings as "
                       "its config; the weights the export's model.safetensors"
                       % (ex["name"], ex["arch"]),
        "config": g["config"],
        "base_loss_batch0": base_loss,
        "token_stream": {
            "how": "reference_common.make_tokens(seed, n_tokens, vocab): token i = "
                   "regc_rng_at(regc_rng_substream(seed, 1000000), i) % vocab, the "
                   "stream test_exports.c trains the export on, longer; the tokens file "
                   "holds it as llm.c's token file; batch k is regc_tokens_batch's "
                   "(llm.c's order)",
            "seed": g["token_seed"], "n_tokens": g["n_tokens"], "vocab": g["vocab"],
        },
        "lora_init": {
            "how": LORA_INIT_HOW,
            "seed": case["lora_seed"],
            "tensors": [[k, list(s), c, h] for k, s, c, h in t["specs"]],
        },
        "schedule": "constant",
        "optimizer": "torch.optim.AdamW over the LoRA tensors only, betas (0.9, 0.999), "
                     "eps 1e-8, lr and weight_decay as recorded, constant; step k trains "
                     "on batch k",
        "peft_keys": t["peft_keys"],
    }


# ---------------------------------------------------------------------------
# The QLoRA cases: the same base in NF4 (bitsandbytes), the adapters of the
# LoRA cases trained on it
# ---------------------------------------------------------------------------
def write_base_dir(base, model_dir):
    """The base as a Hugging Face directory: config.json, fp32 model.safetensors."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(base["config"], f, indent="\t")
    state = {k: v.contiguous() for k, v in build_base(base).state_dict().items()}
    safetensors.torch.save_file(state, os.path.join(model_dir, "model.safetensors"),
                                metadata={"format": "pt"})


def build_qlora_base(base, model_dir):
    """LlamaForCausalLM loaded from the base's directory in 4 bits, as a QLoRA
    user loads it: BitsAndBytesConfig(QLORA), on the CPU, float32 elsewhere."""
    q = transformers.BitsAndBytesConfig(**dict(QLORA, bnb_4bit_compute_dtype=torch.float32))
    model = LlamaForCausalLM.from_pretrained(model_dir, quantization_config=q,
                                             dtype=torch.float32, device_map="cpu",
                                             attn_implementation="eager")
    return model.eval()


def nf4_crcs(model):
    """Per quantised layer, zlib's CRC-32 of its weight's NF4 bytes in regc's
    blob order (kernels/nf4_format.h: the offset, the nested absmaxes, the
    8-bit absmaxes, the packed values), and its layer name."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            st = mod.weight.quant_state
            assert st.nested and st.blocksize == 64 and st.state2.blocksize == 256
            blob = (np.float32(st.offset.item()).tobytes() +
                    st.state2.absmax.float().numpy().astype("<f4").tobytes() +
                    st.absmax.numpy().astype(np.uint8).tobytes() +
                    mod.weight.data.numpy().astype(np.uint8).tobytes())
            out.append([name.replace("base_model.model.", "") + ".weight",
                        zlib.crc32(blob) & 0xffffffff])
    return out


def run_qlora_case(case, base, tokens):
    tmp = tempfile.mkdtemp(prefix="qlora_")
    try:
        write_base_dir(base, tmp)
        qbase = build_qlora_base(base, tmp)
        crcs = nf4_crcs(qbase)
        adapter_dir = os.path.join(REPO, "tests/data/lora", case["adapter"])
        model = peft.PeftModel.from_pretrained(qbase, adapter_dir, is_trainable=True)
        params = [p for n, p in model.named_parameters() if p.requires_grad]
        assert params and all("lora_" in n for n, p in model.named_parameters()
                              if p.requires_grad)
        losses, next_loss = train_adapter(model, params, tokens, base, base["lr"],
                                          base["weight_decay"], base["schedule"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%-10s %d layers in NF4, losses %s, next %.9f" %
          (case["name"], len(crcs), " ".join("%.6f" % x for x in losses), next_loss))
    return {
        "name": case["name"],
        "base": {k: base[k] for k in BASE_KEYS},
        "base_source": "tests/data/llama_reference.json, cases[0]; loaded in 4 bits by "
                       "LlamaForCausalLM.from_pretrained from its fp32 model.safetensors",
        "adapter_dir": "tests/data/lora/" + case["adapter"],
        "quantization": QLORA,
        "nf4_crc32": crcs,
        "steps": STEPS,
        "optimizer": "torch.optim.AdamW over the LoRA tensors only, betas (0.9, 0.999), "
                     "eps 1e-8, the base's lr, weight_decay and schedule; step k trains "
                     "on batch k",
        "losses": losses,
        "next_loss": next_loss,
    }


def check_regc(regc, rec, tokens, repo):
    """Train rec's adapter with regc as test_lora.c does; the largest relative
    differences of its losses, and of PEFT's next loss with regc's adapter."""
    base, name = rec["base"], rec["name"]
    tmp = tempfile.mkdtemp(prefix="lora_check_")
    try:
        model_dir, saved = os.path.join(tmp, "model"), os.path.join(tmp, "saved")
        write_base_dir(base, model_dir)
        tok_path = os.path.join(tmp, "tokens.bin")
        with open(tok_path, "wb") as f:
            f.write(token_file_bytes(tokens))

        quant = ["--load-in-4bit", "on"] if "quantization" in rec else []
        cmd = [regc, "train", "--model", model_dir, "--data", tok_path,
               "--steps", str(rec["steps"]), "--batch", str(base["batch"]),
               "--seq", str(base["seq"]), "--lr", repr(base["lr"]),
               "--weight-decay", repr(base["weight_decay"]), "--json", *base["extra_args"],
               *quant, "--adapter", os.path.join(repo, rec["adapter_dir"]), "--save", saved]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True).stdout
        reports = [json.loads(line) for line in out.splitlines() if line.strip()]
        losses = [r["loss"] for r in reports if "step" in r and "loss" in r]
        assert len(losses) == rec["steps"], "regc reported %d steps" % len(losses)
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, rec["losses"]))

        build = (lambda: build_qlora_base(base, model_dir)) if quant else lambda: build_base(base)
        next_rel = check_saved(name, rec, losses, saved, build, tokens, base, repo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return max(loss_rel, next_rel)


def check_saved(name, rec, losses, saved, build, tokens, bs, repo):
    """Print regc's losses against the JSON's and PEFT's next-batch loss with
    the adapter regc saved in `saved` (on the base build() makes); the
    relative difference of that next loss."""
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, rec["losses"]))
    # PEFT warns of keys it does not know; those it misses it fills with defaults
    caught = {}
    with warnings.catch_warnings(record=True) as caught["LoraConfig.from_pretrained"]:
        warnings.simplefilter("always")
        peft.LoraConfig.from_pretrained(saved)
    with warnings.catch_warnings(record=True) as caught["PeftModel.from_pretrained"]:
        warnings.simplefilter("always")
        model = peft.PeftModel.from_pretrained(build(), saved)
    keys = [set(json.load(open(os.path.join(d, "adapter_config.json"))))
            for d in (os.path.join(repo, rec["adapter_dir"]), saved)]
    with torch.no_grad():
        next_loss = batch_loss(model.eval(), tokens, rec["steps"], bs).item()
    next_rel = abs(next_loss - rec["next_loss"]) / abs(rec["next_loss"])
    print("%-10s regc  %s\n%-10s json  %s\n%-10s losses max rel %.1e; next loss: peft+regc's "
          "adapter %.9f, json %.9f, rel %.1e" %
          (name, " ".join("%.6f" % x for x in losses), "",
           " ".join("%.6f" % x for x in rec["losses"]), "", loss_rel, next_loss,
           rec["next_loss"], next_rel))
    print("%-10s adapter_config.json: %d keys; PEFT's own has %d; defaulted: %s; extra: %s" %
          (name, len(keys[1]), len(keys[0]), " ".join(sorted(keys[0] - keys[1])) or "none",
           " ".join(sorted(keys[1] - keys[0])) or "none"))
    for call, ws in caught.items():
        for w in ws:
            print("%-10s %s warns (%s:%d): %s: %s" % (name, call, os.path.basename(w.filename),
                                                     w.lineno, w.category.__name__, w.message))
    return next_rel


def check_regc_graph(regc, rec, g):
    """Train a graph case's adapter with regc; as check_regc."""
    name = rec["name"]
    for k in ("graph", "weights", "batch", "seq", "tokens"):
        assert rec[k] == g[k], "%s: %s is not the script's" % (name, k)
    tok_path = os.path.join(REPO, rec["tokens"])
    with open(tok_path, "rb") as f:
        assert f.read() == g["token_bytes"], "%s differs from the token stream" % rec["tokens"]
    tmp = tempfile.mkdtemp(prefix="lora_check_")
    try:
        saved = os.path.join(tmp, "saved")
        losses = regc_json(regc, regc_graph_args(g, tok_path, rec["steps"], rec["lr"],
                                                 rec["weight_decay"]) +
                           ["--adapter", os.path.join(REPO, rec["adapter_dir"]), "--save", saved])
        assert len(losses) == rec["steps"], "regc reported %d steps" % len(losses)
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, rec["losses"]))
        next_rel = check_saved(name, rec, losses, saved, lambda: build_graph_base(g),
                               g["token_stream"], g, REPO)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return max(loss_rel, next_rel)


def main():
    # PEFT expands "all-linear" into a Python set of module paths and writes
    # it into adapter_config.json in set order, which string hashing
    # randomises per run: pin the hash seed so the file is reproducible.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv,
                  dict(os.environ, PYTHONHASHSEED="0"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=default_out(__file__, "lora_reference.json"))
    ap.add_argument("--llama", default=default_out(__file__, "llama_reference.json"))
    ap.add_argument("--check-regc", metavar="REGC",
                    help="check this regc binary against --out instead of writing it")
    ap.add_argument("--regc", default=os.path.join(REPO, "build", "regc"),
                    help="writing: the regc whose graph-model loss on batch 0 the graph "
                         "cases' base is checked against, if it exists (default build/regc)")
    args = ap.parse_args()
    torch.manual_seed(0)  # nothing draws from torch's RNG after the weights are set
    torch.set_num_threads(1)  # the same summation order on every machine
    if args.check_regc:
        repo = REPO
        worst = 0.0
        doc = json.load(open(args.out))
        for rec in doc["cases"]:
            b = rec["base"]
            tokens = make_tokens(b["seed"], b["n_tokens"], b["config"]["vocab_size"])
            worst = max(worst, check_regc(os.path.abspath(args.check_regc), rec, tokens, repo))
        g = graph_setup()
        for rec in doc.get("graph_cases", []):
            worst = max(worst, check_regc_graph(os.path.abspath(args.check_regc), rec, g))
        print("worst relative difference %.1e: %s" % (worst, "ok" if worst <= 1e-5 else "FAIL"))
        qworst = 0.0
        for rec in doc.get("qlora_cases", []):
            b = rec["base"]
            tokens = make_tokens(b["seed"], b["n_tokens"], b["config"]["vocab_size"])
            qworst = max(qworst, check_regc(os.path.abspath(args.check_regc), rec, tokens, repo))
        print("QLoRA: worst relative difference %.1e: %s" %
              (qworst, "ok" if qworst <= 1e-4 else "FAIL"))
        sys.exit(0 if worst <= 1e-5 and qworst <= 1e-4 else 1)
    ref = json.load(open(args.llama))["cases"][0]
    base = dict(ref, reference_loss0=ref["losses"][0],
                # the schedule keys reference_common.lr_lambda reads, if the case has any
                schedule={k: ref[k] for k in ("lr_scheduler_type", "warmup_steps",
                                              "warmup_ratio", "min_lr", "min_lr_rate")
                          if k in ref})
    # this script applies no clipping or accumulation; the base case must have none
    assert not any(k in ref for k in ("max_grad_norm", "gradient_accumulation_steps"))
    tokens = make_tokens(base["seed"], base["n_tokens"], base["config"]["vocab_size"])
    out_dir = os.path.join(os.path.dirname(args.out), "lora")
    cases = [run_case(c, base, tokens, out_dir) for c in CASES]
    g = graph_setup()
    g["tokens_path"] = os.path.join(out_dir, os.path.basename(g["tokens"]))
    with open(g["tokens_path"], "wb") as f:
        f.write(g["token_bytes"])
    regc = os.path.abspath(args.regc) if os.access(args.regc, os.X_OK) else None
    if not regc:
        print("no regc at %s: the graph cases' base is not checked against it" % args.regc)
    graph_cases = [run_graph_case(c, g, out_dir, regc) for c in GRAPH_CASES]
    qlora_cases = [run_qlora_case(c, base, tokens) for c in QLORA_CASES]
    doc = {"generator": "lora_reference.py", "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__,
           "bitsandbytes": bnb.__version__, "cases": cases, "graph_cases": graph_cases,
           "qlora_cases": qlora_cases}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)  # repr floats: full round-trip precision
        f.write("\n")
    print("wrote %s and %s/<case>/" % (args.out, out_dir))


if __name__ == "__main__":
    main()
