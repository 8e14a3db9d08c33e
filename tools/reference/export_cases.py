#!/usr/bin/env python3
"""Small Hugging Face models exported by tools/export_torch.py, with
PyTorch's losses over 5 training steps, for tests/test_exports.c.

For each case: a tiny model of the architecture, its weights drawn by
Hugging Face's own init under torch.manual_seed(case seed), saved into
tests/data/exports/<name>/ as Transformers saves a checkpoint (config.json,
model.safetensors, or an index and its bfloat16 shards); its export from
that directory at the case's batch and sequence (graph.json and
constants.safetensors beside the checkpoint, which regc trains from as it
is); and 5 steps of AdamW in PyTorch on the token stream of
reference_common (regc's counter-based stream, llm.c's batch order), the
loss before each update recorded in tests/data/exports/reference.json. The C
test trains the committed export with `regc train` on the same tokens and
compares, with no PyTorch present.

Needs PyTorch 2.x and transformers (the exporter's environment):

    python tools/reference/export_cases.py            # write tests/data/exports
    python tools/reference/export_cases.py --check    # regenerate into a
                                                      # temporary directory and
                                                      # require identical files
"""

import argparse
import filecmp
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import export_torch  # noqa: E402
from reference_common import get_batch, make_tokens, train  # noqa: E402

# Small widths with more than one head and kv group; two layers, so the
# detector sees a repeated layer (Gemma 2: four, two pairs of a sliding and
# a global layer).
DECODER = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
               bos_token_id=0, eos_token_id=0)
STEP = dict(batch=2, seq=12, lr=2e-3, weight_decay=0.05, n_tokens=300)
CASES = [
    dict(name="gpt2", arch="GPT2", seed=11,
         config=dict(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=0, eos_token_id=0)),
    dict(name="llama", arch="Llama", seed=12, config=DECODER),
    dict(name="qwen2", arch="Qwen2", seed=13, config=dict(DECODER, tie_word_embeddings=True)),
    dict(name="mistral", arch="Mistral", seed=14, config=dict(DECODER, sliding_window=None)),
    # an encoder: bidirectional attention, token types, the MLM head; trained
    # as a graph model is, on next-token targets
    dict(name="bert", arch="Bert", seed=15, masked=True,
         config=dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32)),
    # an encoder-decoder: relative position biases, cross-attention; the
    # decoder reads the targets shifted right behind id 0
    dict(name="t5", arch="T5", seed=16, seq2seq=True, kinds=2,
         config=dict(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                     decoder_start_token_id=0, pad_token_id=0)),
    # a module of the user's own, no layers to repeat
    dict(name="custom", arch="Custom", seed=17, kinds=0, config=dict(vocab_size=96)),
    # per-head q/k norms
    dict(name="qwen3", arch="Qwen3", seed=18, config=dict(DECODER, head_dim=8)),
    # norms after each block, q/k norms over the whole projection
    dict(name="olmo2", arch="Olmo2", seed=19, config=dict(DECODER, pad_token_id=1)),
    # fused qkv and gate-up projections, sliced
    dict(name="phi3", arch="Phi3", seed=20, config=dict(DECODER, pad_token_id=0)),
    # norms by 1 + w, scaled embeddings, tanh GeGLU, soft-capped attention
    # and logits, sliding windows alternating with global attention; the
    # reference runs Transformers' eager attention, which caps
    dict(name="gemma2", arch="Gemma2", seed=21, attn="eager", layers=2,
         config=dict(DECODER, head_dim=8, num_hidden_layers=4, sliding_window=5,
                     query_pre_attn_scalar=8, pad_token_id=0)),
    # per-head q/k norms by 1 + w, a local RoPE base for the sliding layers
    dict(name="gemma3", arch="Gemma3Text", seed=22,
         config=dict(DECODER, head_dim=8, sliding_window=5, pad_token_id=0)),
    # the user's own checkpoint as Hugging Face shards it, in bfloat16: the
    # export reads no weights, regc trains from the shards as they are
    dict(name="llama_sharded", arch="Llama", seed=23, dtype=torch.bfloat16, shard="16KB",
         config=DECODER),
    # Phi: attention and the MLP side by side from one LayerNorm, half of
    # each head rotated (sliced off and joined again in the exported graph)
    dict(name="phi", arch="Phi", seed=24, config=DECODER),
    # GPT-NeoX: each block from its own LayerNorm, q/k/v fused head by head,
    # a quarter of each head rotated
    dict(name="gpt_neox", arch="GPTNeoX", seed=25,
         config={k: v for k, v in DECODER.items() if k != "num_key_value_heads"}),
]
CASES = [dict(STEP, **c) for c in CASES]


class Custom(torch.nn.Module):
    """A user's own module (export_torch.py's module:function form), its
    ops the exporter maps one by one: a where under a constant mask, a
    normalisation written out, a softmax gate."""

    def __init__(self, vocab=96, width=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.lin = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.register_buffer("keep", torch.arange(width) % 3 != 0)

    def forward(self, input_ids):
        h = torch.tanh(self.lin(self.emb(input_ids)))
        h = torch.where(self.keep, h, h * -0.5)
        h = h - h.mean(-1, keepdim=True)
        h = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-5)
        h = torch.softmax(h, -1) * h + torch.exp(-h) / 4
        h = (1.0 - h) * torch.sqrt(h * h + 1.0) + 2.0 / (h * h + 4.0)
        return self.head(h)


def build(case):
    if case["arch"] == "Custom":
        torch.manual_seed(case["seed"])
        return Custom().float().train(False)
    import transformers
    config = getattr(transformers, case["arch"] + "Config")(**case["config"])
    torch.manual_seed(case["seed"])
    return auto_class(case).from_config(config).train(False)


def auto_class(case):
    import transformers
    return transformers.AutoModelForMaskedLM if case.get("masked") else \
        transformers.AutoModelForSeq2SeqLM if case.get("seq2seq") else \
        transformers.AutoModelForCausalLM


def write_case(case, out_dir):
    """The case's model and its export into out_dir: a Hugging Face model
    saved as the user's checkpoint is (config.json, model.safetensors or an
    index and its shards), exported from that directory (graph.json,
    constants.safetensors); the module of the user's own exported with its
    weights. Returns the model PyTorch trains: the checkpoint loaded back,
    in float32."""
    model = build(case)
    os.makedirs(out_dir, exist_ok=True)
    if case["arch"] == "Custom":
        export_torch.export(model, case["batch"], case["seq"], out_dir)
        return model
    model.to(case.get("dtype", torch.float32)).save_pretrained(
        out_dir, max_shard_size=case.get("shard", "5GB"))
    generation = os.path.join(out_dir, "generation_config.json")  # nothing regc reads
    if os.path.exists(generation):
        os.remove(generation)
    export_torch.export(export_torch.load_model(out_dir), case["batch"], case["seq"], out_dir,
                        checkpoint=out_dir)
    return auto_class(case).from_pretrained(out_dir, dtype=torch.float32,
                                            attn_implementation=case.get("attn", "sdpa")
                                            ).train(False)


def reference_losses(model, case):
    """PyTorch's losses over the steps: reference_common.train over the
    model's parameters (tied ones once), each step's batch from the token
    stream."""
    wrapper = export_torch.LossModule(model)
    names = [n for n, _ in wrapper.named_parameters()]
    init = {n: p.detach().numpy().copy() for n, p in wrapper.named_parameters()}
    tokens = make_tokens(case["seed"], case["n_tokens"], case["config"]["vocab_size"])
    case = dict(case, tokens=tokens)

    def forward_loss(p, k, c):
        ids, targets = get_batch(c["tokens"], k, c["batch"], c["seq"])
        args = (ids, targets)
        if export_torch.is_encoder_decoder(model):
            args += (export_torch.decoder_inputs(targets),)
        return torch.func.functional_call(wrapper, {n: p[n] for n in names}, args)

    torch.set_num_threads(1)
    losses, _ = train(case, init, forward_loss, torch.float32)
    return losses


def write_all(out_root):
    record = []
    for case in CASES:
        model = write_case(case, os.path.join(out_root, case["name"]))
        losses = reference_losses(model, case)
        print("%-8s losses %s" % (case["name"], " ".join("%.6f" % x for x in losses)))
        record.append({k: case[k] for k in ("name", "seed", "batch", "seq", "lr", "weight_decay",
                                            "n_tokens")}
                      | {"vocab": case["config"]["vocab_size"], "layers": case.get("layers", 2),
                         "kinds": case.get("kinds", 1), "steps": len(losses), "losses": losses})
    doc = {"generator": "tools/reference/export_cases.py", "torch": torch.__version__,
           "cases": record}
    with open(os.path.join(out_root, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


class Unsupported(torch.nn.Module):
    """A model with two ops regc has no mapping for (a cumulative sum, a
    sine of an activation), for the exporter's error."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, input_ids):
        x = self.emb(input_ids)
        return self.head(torch.sin(torch.cumsum(x, -1)))


def check_unsupported():
    """Every unmapped op is listed, one line each with where it is."""
    tmp = tempfile.mkdtemp(prefix="regc-unsupported-")
    try:
        export_torch.export(Unsupported(), 2, 4, tmp)
    except export_torch.ExportError as e:
        lines = str(e).splitlines()
        ops = [l for l in lines[1:] if "cumsum" in l or "sin" in l]
        if len(ops) != 2 or not all("export_cases.py" in l for l in ops) or \
                os.path.exists(os.path.join(tmp, "graph.json")):
            print("export_cases: the unsupported-op error is not one line per op with its "
                  "source, or a graph was written:\n%s" % e, file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp)
    print("export_cases: a model with unsupported ops exported", file=sys.stderr)
    return 1


class Attend(torch.nn.Module):
    """One attention over embeddings under a given constant mask."""

    def __init__(self, mask):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)
        self.register_buffer("mask", mask)

    def forward(self, input_ids):
        x = self.emb(input_ids).view(2, 4, 2, 4).transpose(1, 2)  # [B, H, T, D]
        y = F.scaled_dot_product_attention(x, x, x, attn_mask=self.mask)
        return self.head(y.transpose(1, 2).reshape(2, 4, 8))


def write_index(directory, weight_map):
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)


def check_checkpoint_errors():
    """A directory whose checkpoint does not hold the graph's parameters as
    regc reads them is refused in one line naming what is wrong, before
    anything is written: a tensor missing, one in a dtype regc does not
    read, an index naming a shard that is not there, no checkpoint."""
    from safetensors.torch import load_file, save_file
    case = next(c for c in CASES if c["name"] == "llama")
    tmp = tempfile.mkdtemp(prefix="regc-checkpoint-errors-")
    try:
        src = os.path.join(tmp, "src")
        write_case(case, src)
        state = load_file(os.path.join(src, "model.safetensors"))
        edits = [
            ("missing", lambda d: save_file({k: v for k, v in state.items()
                                             if k != "lm_head.weight"},
                                            os.path.join(d, "model.safetensors")),
             "has no tensor lm_head.weight"),
            ("float64", lambda d: save_file(dict(state, **{"lm_head.weight":
                                                           state["lm_head.weight"].double()}),
                                            os.path.join(d, "model.safetensors")),
             "lm_head.weight is F64"),
            ("no shard", lambda d: write_index(d, {"lm_head.weight": "gone.safetensors"}),
             "gone.safetensors"),
            ("nothing", lambda d: None, "no model.safetensors or model.safetensors.index.json"),
        ]
        for what, make, want in edits:
            d = os.path.join(tmp, what.replace(" ", "_"))
            os.makedirs(d)
            shutil.copy(os.path.join(src, "config.json"), d)
            make(d)
            out = os.path.join(tmp, "out_" + what.replace(" ", "_"))
            try:
                export_torch.export(export_torch.load_model(d), case["batch"], case["seq"], out,
                                    checkpoint=d)
            except export_torch.ExportError as e:
                if want not in str(e) or "\n" in str(e) or os.path.exists(out):
                    print("export_cases: a checkpoint with %s: %r (or output written)" % (what, e),
                          file=sys.stderr)
                    return 1
                continue
            print("export_cases: a checkpoint with %s exported" % what, file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp)


def check_masks():
    """A causal mask (bool, or additive with the lowest float) becomes the
    causal flag; a soft additive mask stays a bias, as PyTorch adds it."""
    tril = torch.ones(4, 4, dtype=torch.bool).tril()
    lowest = torch.finfo(torch.float32).min
    cases = [(tril, 1, 3), (torch.zeros(4, 4).masked_fill(~tril, lowest), 1, 3),
             (torch.triu(torch.full((4, 4), -1.0), 1), 0, 4)]
    for mask, causal, n_in in cases:
        tmp = tempfile.mkdtemp(prefix="regc-masks-")
        try:
            torch.manual_seed(0)
            doc = export_torch.export(Attend(mask), 2, 4, tmp)
        finally:
            shutil.rmtree(tmp)
        att = [n for n in doc["nodes"] if n["op"] == "attention"]
        if len(att) != 1 or att[0]["causal"] != causal or len(att[0]["in"]) != n_in:
            print("export_cases: a mask %s exported as %s" % (mask.tolist(), att),
                  file=sys.stderr)
            return 1
    return 0


def check_round_trip(regc):
    """The user's whole path: export, train with regc (5 steps, saved), load
    the saved weights back into the PyTorch model; its loss on the next
    batch is regc's loss of a sixth step, within 1e-5."""
    import struct
    import subprocess
    from safetensors.torch import load_file
    case = CASES[1]
    tmp = tempfile.mkdtemp(prefix="regc-round-trip-")
    try:
        model = write_case(case, os.path.join(tmp, "export"))
        tokens = make_tokens(case["seed"], case["n_tokens"], case["config"]["vocab_size"])
        with open(os.path.join(tmp, "tokens.bin"), "wb") as f:  # llm.c's token file
            f.write(struct.pack("<3i", 20240520, 1, len(tokens)) + bytes(256 * 4 - 12))
            f.write(tokens.astype("<u2").tobytes())
        args = [regc, "train", "--model", os.path.join(tmp, "export", "graph.json"),
                "--weights", os.path.join(tmp, "export"),
                "--data", os.path.join(tmp, "tokens.bin"), "--batch", str(case["batch"]),
                "--seq", str(case["seq"]), "--lr", repr(case["lr"]),
                "--weight-decay", repr(case["weight_decay"]), "--json"]
        six = subprocess.run(args + ["--steps", "6"], capture_output=True, text=True, check=True)
        want = [json.loads(l)["loss"] for l in six.stdout.splitlines() if '"loss"' in l][5]
        subprocess.run(args + ["--steps", "5", "--save", os.path.join(tmp, "saved")],
                       capture_output=True, check=True)
        state = load_file(os.path.join(tmp, "saved", "model.safetensors"))
        model.load_state_dict({k: v for k, v in state.items() if not k.startswith(("rope_",
                                                                                 "const."))},
                              strict=False)
        ids, targets = get_batch(tokens, 5, case["batch"], case["seq"])
        with torch.no_grad():
            got = export_torch.LossModule(model)(ids, targets).item()
        if abs(got - want) > 1e-5 * abs(want):
            print("export_cases: PyTorch's loss with regc's saved weights is %.9g, regc's %.9g"
                  % (got, want), file=sys.stderr)
            return 1
        print("export_cases: trained by regc, loaded back into PyTorch: loss %.6f == %.6f"
              % (got, want))
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "tests", "data", "exports"))
    ap.add_argument("--regc", help="with --check: the regc binary, to train an export and "
                    "load what it saves back into PyTorch")
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    if not args.check:
        write_all(out)
        return 0
    tmp = tempfile.mkdtemp(prefix="regc-exports-")
    try:
        write_all(tmp)
        bad = []
        for case in CASES:
            a_dir, b_dir = os.path.join(out, case["name"]), os.path.join(tmp, case["name"])
            names = set(os.listdir(b_dir)) | set(
                os.listdir(a_dir) if os.path.isdir(a_dir) else [])
            for f in sorted(names):
                a, b = os.path.join(a_dir, f), os.path.join(b_dir, f)
                if not (os.path.exists(a) and os.path.exists(b)) or \
                        not filecmp.cmp(a, b, shallow=False):
                    bad.append(os.path.join(case["name"], f))
        if bad:
            print("export_cases: regenerated exports differ from the committed ones: %s"
                  % ", ".join(bad), file=sys.stderr)
            return 1
        if check_unsupported() or check_masks() or check_checkpoint_errors():
            return 1
        if args.regc and check_round_trip(args.regc):
            return 1
        print("export_cases: %d exports regenerate identically" % len(CASES))
        return 0
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
