#!/usr/bin/env python3
"""Export a PyTorch model's training forward (the forward pass and its loss)
to regc graph JSON, with its weights, for `regc train`.

    tools/export_torch.py MODEL OUT_DIR --batch B --seq T

MODEL is a Hugging Face model directory, or `module:function` (a Python
factory returning an nn.Module whose forward(input_ids) returns logits, or
an object with .logits). OUT_DIR gets:

    graph.json          regc graph JSON: inputs input_ids and targets [B, T],
                        the constants, the parameters, the ops, the loss first
    model.safetensors   the parameters under their PyTorch names, and the
                        constants (I32 for integers, F32 otherwise)

    regc train --model OUT_DIR/graph.json --weights OUT_DIR/model.safetensors

The loss is the mean cross-entropy of the logits [B, T, V] against targets
[B, T] (negative targets ignored), which is what regc's graph models train:
targets are the next tokens of the data.

How it works. torch.export traces the forward and its loss to ATen ops
(PyTorch 2.x, in the user's environment; nothing in regc's build or default
tests needs it). Every op whose inputs depend on neither the data nor the
parameters is evaluated here and becomes a named constant (position ids,
rotary tables, causal masks). The rest maps to regc ops; views and
transposes stay lazy until an op needs the tensor laid out, so that
attention's [B, H, T, D] views of a projection reach regc's attention as the
[B, T, H*D] projection itself. Known patterns become regc's fused ops: a
decomposed RMSNorm, GPT-2's tanh GELU, the rotary embedding (rotate_half),
repeated key/value heads, a causal mask. An op with no mapping is an error
listing every such op with its source line, never a silent skip.

Needs torch >= 2.5 (training IR export) and, for a directory, transformers.
"""

import argparse
import importlib
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_ops import Exporter, ExportError  # noqa: E402


# --------------------------------------------------------------------------- models


class LossModule(torch.nn.Module):
    """forward(input_ids, targets[, decoder_input_ids]): the mean
    cross-entropy of the model's logits against the targets, negative
    targets ignored. An encoder-decoder also reads decoder_input_ids, which
    regc's graph models fill with the targets shifted right behind id 0
    (decoder_inputs here)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, targets, decoder_input_ids=None):
        if decoder_input_ids is not None:
            out = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
                             use_cache=False)
        elif is_hf(self.model):
            out = self.model(input_ids=input_ids, use_cache=False)
        else:
            out = self.model(input_ids)
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-100)


def is_encoder_decoder(model):
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def decoder_inputs(targets):
    """The decoder's inputs as regc's graph models fill them: the targets
    shifted right behind id 0, an ignored (negative) target as 0 (T5's
    _shift_right, whose start and pad ids are 0)."""
    d = torch.zeros_like(targets)
    d[:, 1:] = targets[:, :-1]
    return d.clamp(min=0)


def is_hf(model):
    return hasattr(model, "config") and hasattr(model, "can_generate")


def load_model(spec):
    if os.path.isdir(spec):
        import transformers
        config = transformers.AutoConfig.from_pretrained(spec)
        for key in ("dropout", "attention_dropout", "hidden_dropout_prob",
                    "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
            if hasattr(config, key):
                setattr(config, key, 0.0)
        # the class the directory was saved from (a masked LM stays one),
        # else a causal LM
        names = getattr(config, "architectures", None) or []
        cls = getattr(transformers, names[0], None) if names else None
        cls = cls or transformers.AutoModelForCausalLM
        model = cls.from_pretrained(spec, config=config, torch_dtype=torch.float32,
                                    attn_implementation="sdpa")
    elif ":" in spec:
        module, fn = spec.split(":", 1)
        sys.path.insert(0, os.getcwd())
        model = getattr(importlib.import_module(module), fn)()
    else:
        raise ExportError("neither a model directory nor module:function")
    model = model.float()
    model.train(False)  # no dropout: regc trains without it
    return model


def export(model, batch, seq, out_dir):
    """Trace model's loss at [batch, seq]; write graph.json and
    model.safetensors into out_dir. Returns the graph JSON."""
    from safetensors.torch import save_file
    wrapper = LossModule(model)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    ids = torch.zeros(batch, seq, dtype=torch.long) if vocab is None else \
        torch.randint(0, vocab, (batch, seq))
    args = (ids, ids.clone())
    if is_encoder_decoder(model):
        config = model.config
        if config.decoder_start_token_id != 0 or config.pad_token_id != 0:
            raise ExportError("an encoder-decoder whose decoder_start_token_id (%s) or "
                              "pad_token_id (%s) is not 0: regc's graph models start the "
                              "decoder's inputs with 0" % (config.decoder_start_token_id,
                                                           config.pad_token_id))
        args = args + (decoder_inputs(ids),)
    with torch.no_grad():
        ep = torch.export.export(wrapper, args, strict=False)
    ex = Exporter(ep, batch, seq)
    loss = ex.run()
    doc, leaves = ex.g.to_json([loss])
    tensors = {}
    for t in leaves:
        if t.role == "param":
            tensors[t.name] = ex.params[t.name].detach().float().contiguous()
        elif t.role == "constant":
            tensors[t.name] = torch.from_numpy(np.ascontiguousarray(ex.consts[t.name]))
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, "graph.json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    save_file(tensors, os.path.join(out_dir, "model.safetensors.tmp"), metadata={"format": "pt"})
    os.chmod(os.path.join(out_dir, "model.safetensors.tmp"), 0o644)
    os.replace(os.path.join(out_dir, "model.safetensors.tmp"),
               os.path.join(out_dir, "model.safetensors"))
    os.replace(tmp, os.path.join(out_dir, "graph.json"))
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory, or module:function")
    ap.add_argument("out_dir")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    args = ap.parse_args()
    try:
        model = load_model(args.model)
        doc = export(model, args.batch, args.seq, args.out_dir)
    except ExportError as e:
        print("export_torch: %s: %s" % (args.model, e), file=sys.stderr)
        return 1
    ops = {}
    for n in doc["nodes"]:
        ops[n["op"]] = ops.get(n["op"], 0) + 1
    print("%s: %d nodes (%s), %d tensors" % (
        os.path.join(args.out_dir, "graph.json"), len(doc["nodes"]),
        ", ".join("%s %d" % kv for kv in sorted(ops.items())), len(doc["tensors"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
