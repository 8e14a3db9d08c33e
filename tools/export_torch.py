#!/usr/bin/env python3
"""Export a PyTorch model's training forward (the forward pass and its loss)
to regc graph JSON, for `regc train` to train from the model's own weights.

    tools/export_torch.py MODEL OUT_DIR --batch B --seq T

MODEL is a Hugging Face model directory, or `module:function` (a Python
factory returning an nn.Module whose forward(input_ids) returns logits, or
an object with .logits). OUT_DIR gets:

    graph.json             regc graph JSON: inputs input_ids and targets
                           [B, T], the constants, the parameters (named as
                           the checkpoint names them), the ops, the loss
                           first; "constants" names the file beside it
    constants.safetensors  the folded constants (I32 for integers, F32
                           otherwise): rotary tables, positions, biases
    model.safetensors      module:function only: the module's parameters

A directory's weights are never loaded or copied: the model is built on the
meta device (shapes only; its buffers, such as rotary frequencies, keep
their values), traced there, and each of the graph's parameters is checked
against the directory's own checkpoint (one file or an index's shards, in
float32, bfloat16 or float16) by name, shape and dtype, a tied head under
the name the checkpoint gives it. regc reads that checkpoint in place, by
range:

    regc train --model OUT_DIR/graph.json --weights MODEL_DIR

so a model of any size exports in about the memory of PyTorch itself.

The loss is the mean cross-entropy of the logits [B, T, V] against targets
[B, T] (negative targets ignored), which is what regc's graph models train:
targets are the next tokens of the data.

How it works. torch.export traces the forward and its loss to ATen ops
(PyTorch 2.x, in the user's environment; nothing in regc's build or default
tests needs it). Every op whose inputs depend on neither the data nor the
parameters is evaluated here, on the host, and becomes a named constant
(position ids, rotary tables, masks). The rest maps to regc ops; views and
transposes stay lazy until an op needs the tensor laid out, so that
attention's [B, H, T, D] views of a projection reach regc's attention as the
[B, T, H*D] projection itself. Known patterns become regc's fused ops: a
decomposed RMSNorm (by w or 1 + w, over a projection or its heads), GPT-2's
tanh GELU, the rotary embedding (rotate_half), repeated key/value heads, a
causal mask with or without a sliding window. The model's attention is
export_attention's, which keeps soft-capped scores (Gemma 2) one op. An op
with no mapping is an error listing every such op with its source line,
never a silent skip; any other failure is one line too.

Needs torch >= 2.5 (training IR export) and, for a directory, transformers.
"""

import argparse
import contextlib
import importlib
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_attention  # noqa: E402
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


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside hold their parameters on the meta device: a
    parameter is made on the host uninitialised (its pages never touched)
    and replaced by its meta twin as it is registered, before any init
    writes it, so a model of any size is built in moments and no memory.
    Buffers keep their values (rotary frequencies): the constants the
    exporter folds are computed from them."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def load_model(spec):
    """The model to trace: a Hugging Face directory's, its parameters on the
    meta device (their values stay in the directory's checkpoint), or a
    module:function factory's, with its own weights."""
    if os.path.isdir(spec):
        import transformers
        export_attention.register()
        config = transformers.AutoConfig.from_pretrained(spec)
        for key in ("dropout", "attention_dropout", "hidden_dropout_prob",
                    "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                    "resid_dropout", "embd_dropout"):
            if hasattr(config, key):
                setattr(config, key, 0.0)
        # the class the directory was saved from (a masked LM stays one),
        # else a causal LM
        names = getattr(config, "architectures", None) or []
        cls = getattr(transformers, names[0], None) if names else None
        cls = cls or transformers.AutoModelForCausalLM
        with parameters_on_meta():
            if cls is transformers.AutoModelForCausalLM:
                model = cls.from_config(config, dtype=torch.float32, attn_implementation="regc")
            else:
                model = cls._from_config(config, dtype=torch.float32, attn_implementation="regc")
    elif ":" in spec:
        module, fn = spec.split(":", 1)
        sys.path.insert(0, os.getcwd())
        model = getattr(importlib.import_module(module), fn)().float()
    else:
        raise ExportError("neither a model directory nor module:function")
    model.train(False)  # no dropout: regc trains without it
    return model


READ_DTYPES = ("F32", "BF16", "F16")  # the float dtypes regc reads a checkpoint's weights in


def checkpoint_shapes(directory):
    """{name: (shape, dtype)} of every tensor in a Hugging Face directory's
    safetensors checkpoint (one file or an index's shards), from their
    headers alone; a file that cannot be read is an ExportError naming it."""
    from safetensors import safe_open
    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(single):
        files = [single]
    elif os.path.exists(index):
        try:
            with open(index) as f:
                files = sorted(set(os.path.join(directory, v)
                                   for v in json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
            raise ExportError("%s: not an index of safetensors shards (%s)" %
                              (index, one_line(e)))
    else:
        raise ExportError("no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    s = f.get_slice(name)
                    tensors[name] = (tuple(s.get_shape()), s.get_dtype())
        except Exception as e:  # missing or malformed: safetensors' own error
            raise ExportError("%s: %s" % (path, one_line(e)))
    return tensors


def one_line(e):
    """An exception as one line: its type and its message's first line."""
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0] if text else "")


def tied_names(model):
    """{name: every name of that parameter}, names in the model's order:
    a tied head and embedding are one parameter with two names."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {n: ns for ns in names.values() for n in ns}


def saved_names(model):
    """{name: the name Transformers saves that parameter under} for the
    parameters its save renames (GPT-NeoX's head, lm_head in memory, is
    saved as embed_out); {} where nothing is renamed or Transformers has no
    such mapping."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return {}
    params = dict(model.named_parameters())
    try:
        saved = revert_weight_conversion(model, dict(params))
    except Exception:  # a model Transformers' mappings do not describe: names as they are
        return {}
    by_id = {id(v): k for k, v in saved.items()}
    return {n: by_id[id(p)] for n, p in params.items() if by_id.get(id(p), n) != n}


def name_params(ex, model, held):
    """Each of the graph's parameters by the name the weights give it: of a
    tied parameter's names and the names Transformers saves them under, the
    first the checkpoint holds (held: checkpoint_shapes'), else the first in
    the model."""
    tied, renamed = tied_names(model), saved_names(model)
    for t in ex.g.leaves:
        if t.role != "param":
            continue
        names = tied.get(t.name, [t.name])
        names = names + [renamed[n] for n in names if n in renamed]
        name = next((n for n in names if n in held), names[0])
        if name != t.name:
            ex.params[name] = ex.params.pop(t.name)
            t.name = name


def check_checkpoint(tensors, params):
    """Every parameter of the graph is a tensor of the checkpoint, by name,
    shape and a dtype regc reads: regc reads it there (--weights DIR)."""
    for name, value in params.items():
        if name not in tensors:
            raise ExportError("the checkpoint has no tensor %s for the graph's parameter of "
                              "that name" % name)
        shape, dtype = tensors[name]
        if shape != tuple(value.shape):
            raise ExportError("the checkpoint's %s is %s; the graph's parameter is %s" %
                              (name, list(shape), list(value.shape)))
        if dtype not in READ_DTYPES:
            raise ExportError("the checkpoint's %s is %s; regc reads %s" %
                              (name, dtype, ", ".join(READ_DTYPES)))


def export(model, batch, seq, out_dir, checkpoint=None):
    """Trace model's loss at [batch, seq]; write into out_dir graph.json,
    constants.safetensors (the folded constants) and, for a model with its
    own weights, model.safetensors (its parameters). A model on the meta
    device writes no weights: they are checkpoint's, a Hugging Face
    directory the graph's parameters are checked against; such a model is
    left on the meta device, buffers too. Returns the graph JSON."""
    from safetensors.torch import save_file
    wrapper = LossModule(model)
    meta = any(p.is_meta for p in wrapper.parameters())
    if meta and checkpoint is None:
        raise ExportError("a model on the meta device needs the checkpoint its weights are "
                          "read from")
    held = checkpoint_shapes(checkpoint) if meta else {}  # before the trace: it fails fast
    buffers = {}
    if meta:  # every value on the meta device for the trace (the model's too); buffers' kept
        buffers = {n: b.detach().clone() for n, b in wrapper.named_buffers() if not b.is_meta}
        wrapper.to("meta")
    device = "meta" if meta else "cpu"
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    ids = torch.zeros(batch, seq, dtype=torch.long, device=device) if vocab is None else \
        torch.randint(0, vocab, (batch, seq), device=device)
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
        try:
            ep = torch.export.export(wrapper, args, strict=False)
        except ExportError:
            raise
        except Exception as e:  # the trace's own error, in one line
            raise ExportError("torch.export cannot trace the training forward (%s)" %
                              one_line(e))
    ex = Exporter(ep, batch, seq, buffers)
    loss = ex.run()
    name_params(ex, model, held)
    doc, leaves = ex.g.to_json([loss])
    params = {t.name: ex.params[t.name] for t in leaves if t.role == "param"}
    consts = {t.name: torch.from_numpy(np.ascontiguousarray(ex.consts[t.name]))
              for t in leaves if t.role == "constant"}
    if meta:
        check_checkpoint(held, params)
    if consts:
        doc["constants"] = "constants.safetensors"
    os.makedirs(out_dir, exist_ok=True)
    written = {"graph.json": lambda path: write_json(doc, path)}
    if consts:
        written["constants.safetensors"] = lambda path: save_file(consts, path,
                                                                  metadata={"format": "pt"})
    if not meta:
        weights = {n: v.detach().float().contiguous() for n, v in params.items()}
        written["model.safetensors"] = lambda path: save_file(weights, path,
                                                              metadata={"format": "pt"})
    # every file written aside first, then each put in place, the graph
    # last: a failure leaves what was there before, and no .tmp behind
    tmps = {name: os.path.join(out_dir, name + ".tmp") for name in written}
    try:
        for name, write in written.items():
            write(tmps[name])
            os.chmod(tmps[name], 0o644)
    except BaseException:
        for tmp in tmps.values():
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    for name in sorted(written, key=lambda n: n == "graph.json"):
        os.replace(tmps[name], os.path.join(out_dir, name))
    return doc


def write_json(doc, path):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory, or module:function")
    ap.add_argument("out_dir")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    args = ap.parse_args()
    try:
        try:
            model = load_model(args.model)
        except ExportError:
            raise
        except Exception as e:  # Transformers' or the factory's own error, in one line
            raise ExportError("cannot build the model (%s)" % one_line(e))
        checkpoint = args.model if os.path.isdir(args.model) else None
        doc = export(model, args.batch, args.seq, args.out_dir, checkpoint)
    except ExportError as e:
        print("export_torch: %s: %s" % (args.model, e), file=sys.stderr)
        return 1
    ops = {}
    for n in doc["nodes"]:
        ops[n["op"]] = ops.get(n["op"], 0) + 1
    print("%s: %d nodes (%s), %d tensors" % (
        os.path.join(args.out_dir, "graph.json"), len(doc["nodes"]),
        ", ".join("%s %d" % kv for kv in sorted(ops.items())), len(doc["tensors"])))
    weights = checkpoint or os.path.join(args.out_dir, "model.safetensors")
    print("train it: regc train --model %s --weights %s --batch %d --seq %d" % (
        os.path.join(args.out_dir, "graph.json"), weights, args.batch, args.seq))
    return 0


if __name__ == "__main__":
    sys.exit(main())
