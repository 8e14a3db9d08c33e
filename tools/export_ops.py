"""export_ops.py — the walk of a torch.export program for
tools/export_torch.py: each ATen op of the traced training forward mapped to
regc graph ops (export_graph.py), constants folded, views kept lazy; what is
recognised rather than mapped (norms, GELU, rotary, attention's layouts and
masks) is export_patterns.py's.
"""

import math
import operator
import re

import torch

import export_attention  # noqa: F401  (regc::attention, mapped below)
from export_graph import ExportError, Graph, Lazy, Tensor, numel
from export_patterns import (CAST_OPS, IDENTITY_OPS, causal_window, computed_bias, const_key,
                             heads_of, match_gelu_tanh, match_rms_norm, match_rope, unrepeat_kv)

aten = torch.ops.aten


IGNORED_OPS = {aten._assert_tensor_metadata.default}


class Exporter:
    def __init__(self, ep, batch, seq, buffers=None):
        self.ep, self.B, self.T = ep, batch, seq
        # a trace on the meta device has no buffer values: they are given
        # here, by their names in the traced module, on the host
        self.buffers = buffers or {}
        self.g = Graph()
        self.env = {}  # fx node -> ("const", tensor) | ("dyn", Lazy) | ("tuple", [...])
        self.consts = {}  # regc constant name -> numpy array
        self.params = {}  # regc parameter name -> torch tensor
        self.unmapped = []
        self.n_const = 0
        self.const_cache = {}  # (dtype, shape, bytes) -> its leaf
        self.memo_cache = {}  # const_key(what, a constant, ...) -> a fact about it

    def memo(self, key, compute):
        """A fact about a constant (a mask's window, a rotary table's
        halves; key: const_key), computed once: every layer reads the
        same constant."""
        if key not in self.memo_cache:
            self.memo_cache[key] = compute()
        return self.memo_cache[key]

    # ---- leaves
    def const_leaf(self, value, name=None):
        value = value.detach()
        if value.dtype == torch.bool:
            value = value.to(torch.float32)
        if value.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            if value.numel() and (value.min() < -2**31 or value.max() >= 2**31):
                raise ExportError("constant %s does not fit int32" % name)
            arr, dtype = value.to(torch.int32).numpy(), "i32"
        else:
            arr, dtype = value.to(torch.float32).numpy(), "f32"
        shape = arr.shape if arr.ndim else (1,)
        key = (dtype, shape, arr.tobytes())
        if name is None and key in self.const_cache:  # one leaf per distinct value
            return self.const_cache[key]
        if name is None:
            self.n_const += 1
            name = "const.%d" % self.n_const
        self.consts[name] = arr.reshape(shape)
        leaf = self.g.leaf(name, dtype, shape, "constant")
        self.const_cache.setdefault(key, leaf)
        return leaf

    def tensor(self, v, shape=None):
        """A regc tensor of value v, laid out (shape: reshaped to it)."""
        kind, x = v
        if kind == "deferred":
            raise ExportError(x)
        if kind == "const":
            t = self.const_leaf(x if shape is None else x.reshape(shape))
            return t
        t = self.materialize(x)
        return t if shape is None else self.g.reshape(t, shape)

    def materialize(self, lz):
        t = self.g.reshape(lz.base, lz.vshape)
        if not lz.plain():
            t = self.g.transpose(t, lz.perm)
            lz.base, lz.vshape, lz.perm = t, t.shape, list(range(len(t.shape)))
        return t

    def rope_table(self, name, value):
        """A rotary table as a constant, one leaf per distinct table."""
        key = (name, value.numpy().tobytes())
        cache = self.__dict__.setdefault("rope_cache", {})
        if key not in cache:
            cache[key] = self.const_leaf(value, name if name not in self.consts else None)
        return cache[key]

    # ---- the walk
    def run(self):
        sig = self.ep.graph_signature
        state = self.ep.state_dict
        consts = getattr(self.ep, "constants", {})
        params = {s.arg.name: s.target for s in sig.input_specs if s.kind.name == "PARAMETER"}
        buffers = {s.arg.name: s.target for s in sig.input_specs if s.kind.name == "BUFFER"}
        lifted = {s.arg.name: s.target for s in sig.input_specs
                  if s.kind.name in ("CONSTANT_TENSOR", "CUSTOM_OBJ")}
        user = [s.arg.name for s in sig.input_specs if s.kind.name == "USER_INPUT"]
        if len(user) not in (2, 3):
            raise ExportError("the traced forward takes %d inputs; expected input_ids, targets "
                              "and, for an encoder-decoder, decoder_input_ids" % len(user))
        data_names = dict(zip(user, ("input_ids", "targets", "decoder_input_ids")))
        out = None
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                if node.name in params:
                    name = strip_wrapper(params[node.name])
                    value = state[params[node.name]]
                    self.params[name] = value
                    leaf = self.g.leaf(name, "f32", tuple(value.shape), "param")
                    self.env[node] = ("dyn", Lazy(leaf))
                elif node.name in buffers or node.name in lifted:
                    target = buffers.get(node.name) or lifted[node.name]
                    value = self.buffers.get(target)
                    if value is None:
                        value = state[target] if target in state else consts[target]
                    if value.is_meta:
                        raise ExportError("buffer %s has no value (traced on the meta device "
                                          "and not given)" % target)
                    self.env[node] = ("const", value)
                else:
                    leaf = self.g.leaf(data_names[node.name], "i32", (self.B, self.T), "input")
                    self.env[node] = ("dyn", Lazy(leaf))
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                out = node.args[0][0] if isinstance(node.args[0], (list, tuple)) else node.args[0]
        if self.unmapped:
            raise ExportError("ops with no regc mapping:\n" + "\n".join(self.unmapped))
        loss = self.env[out]
        if loss[0] != "dyn":
            raise ExportError("the loss does not depend on the inputs")
        return self.materialize(loss[1])

    def val(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        return ("py", a)

    def concrete(self, a):
        """Python/torch value of an argument whose value is known."""
        if isinstance(a, torch.fx.Node):
            kind, x = self.env[a]
            if kind == "const":
                return x
            if kind == "tuple" and all(k == "const" for k, _ in x):
                return [v for _, v in x]
            raise KeyError
        if isinstance(a, (list, tuple)):
            return type(a)(self.concrete(x) for x in a)
        return a

    def call(self, node):
        target = node.target
        if target in IGNORED_OPS:
            return
        try:  # an op of constants alone is folded, on the host
            args = on_host(self.concrete(list(node.args)))
            kwargs = {k: on_host(self.concrete(v)) for k, v in node.kwargs.items()}
            value = target(*args, **kwargs)
            if isinstance(value, (list, tuple)):
                self.env[node] = ("tuple", [("const", v) for v in value])
            else:
                self.env[node] = ("const", value)
            return
        except KeyError:
            pass
        if target is operator.getitem:
            kind, items = self.env[node.args[0]]
            # (an unmapped op's stand-in is no tuple; the error lists it)
            self.env[node] = items[node.args[1]] if kind == "tuple" else (kind, items)
            return
        deferred = [self.env[a] for a in node.all_input_nodes if self.env[a][0] == "deferred"]
        if deferred and target not in (aten.scaled_dot_product_attention.default,
                                       torch.ops.regc.attention.default):
            self.env[node] = deferred[0]  # an error only if something needs it laid out
            return
        if target in (aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf):
            if self.env[node.args[0]][0] == "const":
                try:
                    self.env[node] = m_where(self, node)
                except ExportError as e:  # an error only if something other than
                    self.env[node] = ("deferred", str(e))  # attention's bias reads it
            else:  # a mask computed from the data: regc has no comparisons
                self.env[node] = ("deferred", "%s: a where whose condition depends on the "
                                  "data%s" % (node.name, source_of(node)))
            return
        if target is aten.expand.default:
            # repeat_kv's copies of the key and value heads, which attention
            # reads as they are (its n_kv_head)
            self.env[node] = ("deferred", "%s: an expand of a computed tensor regc does not "
                              "express (other than repeated key/value heads)%s" %
                              (node.name, source_of(node)))
            return
        fn = MAPPING.get(target)
        if fn is None:
            self.unmapped.append("  %s (%s)%s" % (target, node.name, source_of(node)))
            meta = node.meta.get("val")
            shape = tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else (1,)
            self.env[node] = ("dyn", Lazy(Tensor("?", "f32", shape)))
            return
        try:
            self.env[node] = fn(self, node)
        except ExportError:
            raise
        except Exception as e:  # a form of a mapped op the mapping does not read
            raise ExportError("%s (%s): a form of the op regc's mapping does not take (%s: %s)%s"
                              % (target, node.name, type(e).__name__, e, source_of(node)))

    def out_shape(self, node):
        return tuple(int(s) for s in node.meta["val"].shape)


def on_host(a):
    """An argument of a folded op with the meta device (a trace's) made the
    host's, so that the constant is computed."""
    if isinstance(a, torch.device) and a.type == "meta":
        return torch.device("cpu")
    if isinstance(a, (list, tuple)):
        return type(a)(on_host(x) for x in a)
    return a


def source_of(node):
    """' at FILE:LINE: code' of the Python line that made an FX node."""
    lines = node.meta.get("stack_trace", "").strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "(.*)", line (\d+), in', lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return " at %s:%s: %s" % (m.group(1), m.group(2), code)
    return ""


def strip_wrapper(name):
    """A parameter's name in the model: LossModule holds it as `model`."""
    return name[len("model."):] if name.startswith("model.") else name


# --------------------------------------------------------------------------- op mappings


def m_identity(ex, node):
    return ex.env[node.args[0]]


def m_cast(ex, node):
    """A cast to float32 (Gemma's norms: type_as(x)) changes nothing in a
    float32 graph; to any other type, regc has no such cast."""
    val, arg = node.meta.get("val"), node.args[0].meta.get("val")
    if val is None or val.dtype != torch.float32 or arg is None or arg.dtype != torch.float32:
        raise ExportError("%s: a cast from %s to %s; regc's graph models compute in float32%s" %
                          (node.name, getattr(arg, "dtype", "?"), getattr(val, "dtype", "?"),
                           source_of(node)))
    return ex.env[node.args[0]]


def m_view(ex, node):
    kind, x = ex.env[node.args[0]]
    shape = ex.out_shape(node)
    if x.shape == shape:
        return ("dyn", x)
    if x.plain():
        return ("dyn", Lazy(x.base, shape))
    return ("dyn", Lazy(ex.g.reshape(ex.materialize(x), shape)))


def m_transpose(ex, node):
    kind, x = ex.env[node.args[0]]
    nd = len(x.shape)
    if node.target == aten.permute.default:
        p = [d % nd for d in node.args[1]]
    elif node.target == aten.t.default:
        p = [1, 0]
    else:
        a, b = node.args[1] % nd, node.args[2] % nd
        p = list(range(nd))
        p[a], p[b] = p[b], p[a]
    return ("dyn", Lazy(x.base, x.vshape, [x.perm[i] for i in p]))


def m_embedding(ex, node):
    weight = ex.tensor(ex.val(node.args[0]))
    ids = ex.tensor(ex.val(node.args[1]))
    pad = node.args[2] if len(node.args) > 2 else node.kwargs.get("padding_idx", -1)
    if (len(node.args) > 3 and node.args[3]) or node.kwargs.get("scale_grad_by_freq"):
        raise ExportError("%s: an embedding with scale_grad_by_freq" % node.name)
    attrs = {"padding_idx": pad % weight.shape[0]} if pad is not None and pad != -1 else {}
    return ("dyn", Lazy(ex.g.one("embedding", [ids, weight], ids.shape + (weight.shape[1],),
                                 attrs)))


def m_layer_norm(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    w, b = ex.tensor(ex.val(node.args[2])), ex.tensor(ex.val(node.args[3]))
    eps = node.args[4] if len(node.args) > 4 else 1e-5
    y = ex.g.node("layernorm", [x, w, b], [x.shape, x.shape[:-1], x.shape[:-1]], {"eps": eps})[0]
    return ("dyn", Lazy(y))


def matmul(ex, a, b, trans_b):
    n = b.shape[0] if trans_b else b.shape[1]
    return ex.g.one("matmul", [a, b], a.shape[:-1] + (n,), {"trans_a": 0, "trans_b": trans_b})


def bias_add(ex, y, bias):
    return ex.g.one("bias_add", [y, bias], y.shape)


def m_linear(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    w = ex.tensor(ex.val(node.args[1]))
    y = matmul(ex, x, w, 1)
    if len(node.args) > 2 and node.args[2] is not None:
        y = bias_add(ex, y, ex.tensor(ex.val(node.args[2])))
    return ("dyn", Lazy(y))


def m_addmm(ex, node):
    bias = ex.tensor(ex.val(node.args[0]))
    x, w = ex.tensor(ex.val(node.args[1])), ex.tensor(ex.val(node.args[2]))
    return ("dyn", Lazy(bias_add(ex, matmul(ex, x, w, 0), bias)))


def m_mm(ex, node):
    x, w = ex.tensor(ex.val(node.args[0])), ex.tensor(ex.val(node.args[1]))
    return ("dyn", Lazy(matmul(ex, x, w, 0)))


def broadcast_operand(ex, v, full):
    """A regc tensor of operand v, shaped for a binary op against `full`: the
    same shape, its trailing dimensions, or a row's statistic [..., 1]."""
    kind, x = v
    shape = tuple(x.shape) if kind == "dyn" else tuple(x.shape)
    # drop leading ones, then see which broadcast it is
    while len(shape) > 1 and shape[0] == 1 and numel(shape) < numel(full):
        shape = shape[1:]
    nd = len(full)
    if shape == tuple(full) or (len(shape) <= nd and tuple(full[nd - len(shape):]) == shape):
        return ex.tensor(v, shape), "trailing" if shape != tuple(full) else "same"
    row = tuple(full[:-1]) + (1,)
    if numel(shape) == numel(row) and tuple(x.shape)[-1] == 1:
        return ex.tensor(v, row), "row"
    if kind == "const":  # a constant is expanded here, once
        return ex.tensor(("const", torch.broadcast_to(x, full).contiguous())), "same"
    raise ExportError("a broadcast of %s against %s regc cannot express" % (list(x.shape),
                                                                           list(full)))


def binary(ex, node, op, commutative):
    a, b = ex.val(node.args[0]), ex.val(node.args[1])
    shape = ex.out_shape(node)
    if b[0] == "py" or (b[0] == "const" and b[1].numel() == 1 and a[0] == "dyn"):
        s = float(b[1]) if b[0] == "py" else float(b[1].reshape(()))
        x = ex.tensor(a)
        if op == "add":
            return ("dyn", Lazy(ex.g.one("add_scalar", [x], x.shape, {"value": s})))
        if op == "sub":
            return ("dyn", Lazy(ex.g.one("add_scalar", [x], x.shape, {"value": -s})))
        if op == "mul":
            return ("dyn", Lazy(ex.g.one("scale", [x], x.shape, {"value": s})))
        if op == "div":
            return ("dyn", Lazy(ex.g.one("scale", [x], x.shape, {"value": 1.0 / s})))
    if a[0] == "py":
        s = float(a[1])
        x = ex.tensor(b)
        if op == "add":
            return ("dyn", Lazy(ex.g.one("add_scalar", [x], x.shape, {"value": s})))
        if op == "mul":
            return ("dyn", Lazy(ex.g.one("scale", [x], x.shape, {"value": s})))
        if op == "sub":  # s - x
            n = ex.g.one("neg", [x], x.shape)
            return ("dyn", Lazy(ex.g.one("add_scalar", [n], x.shape, {"value": s})))
        if op == "div":  # s / x
            r = ex.g.one("pow", [x], x.shape, {"value": -1.0})
            return ("dyn", Lazy(ex.g.one("scale", [r], x.shape, {"value": s})))
    a_full = tuple(a[1].shape) == shape
    if not a_full and commutative:
        a, b = b, a
    x = ex.tensor(a, shape if numel(a[1].shape) == numel(shape) else None)
    if tuple(x.shape) != shape:
        raise ExportError("%s: the first operand %s is broadcast" % (node.name, list(x.shape)))
    y, how = broadcast_operand(ex, b, shape)
    if op == "add":
        if how == "same":
            return ("dyn", Lazy(ex.g.one("add", [x, y], shape)))
        if how == "trailing":
            return ("dyn", Lazy(ex.g.one("bias_add", [x, y], shape)))
        neg = ex.g.one("neg", [y], y.shape)  # a row's statistic: x - (-y)
        return ("dyn", Lazy(ex.g.one("sub", [x, neg], shape)))
    return ("dyn", Lazy(ex.g.one(op, [x, y], shape)))


def m_add(ex, node):
    fused = match_rope(ex, node)
    if fused:
        return fused
    if len(node.args) > 2 or node.kwargs.get("alpha", 1) != 1:
        raise ExportError("%s: add with alpha" % node.name)
    return binary(ex, node, "add", True)


def m_sub(ex, node):
    return binary(ex, node, "sub", False)


def m_mul(ex, node):
    fused = match_rms_norm(ex, node) or match_gelu_tanh(ex, node)
    if fused:
        return fused
    return binary(ex, node, "mul", True)


def m_div(ex, node):
    return binary(ex, node, "div", False)


def unary(op, attrs=None):
    def fn(ex, node):
        x = ex.tensor(ex.val(node.args[0]))
        return ("dyn", Lazy(ex.g.one(op, [x], x.shape, attrs)))
    return fn


def m_rsub(ex, node):
    """other - x (alpha 1)"""
    if (len(node.args) > 2 and node.args[2] != 1) or node.kwargs.get("alpha", 1) != 1:
        raise ExportError("%s: rsub with alpha" % node.name)
    x = ex.tensor(ex.val(node.args[0]))
    n = ex.g.one("neg", [x], x.shape)
    return ("dyn", Lazy(ex.g.one("add_scalar", [n], x.shape, {"value": float(node.args[1])})))


def m_power(exponent):
    def fn(ex, node):  # reciprocal, sqrt: powers regc_powf computes exactly as 1/x, sqrtf
        x = ex.tensor(ex.val(node.args[0]))
        return ("dyn", Lazy(ex.g.one("pow", [x], x.shape, {"value": exponent})))
    return fn


def m_pow(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    return ("dyn", Lazy(ex.g.one("pow", [x], x.shape, {"value": float(node.args[1])})))


def m_gelu(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return ("dyn", Lazy(ex.g.one("gelu" if approx == "tanh" else "gelu_erf", [x], x.shape)))


def m_reduce(op):
    def fn(ex, node):
        x = ex.tensor(ex.val(node.args[0]))
        dims = node.args[1] if len(node.args) > 1 else None
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        if dims is None or list(dims) not in ([-1], [len(x.shape) - 1]):
            raise ExportError("%s: %s over %s; regc reduces the last axis" % (node.name, op, dims))
        y = ex.g.one(op, [x], x.shape[:-1] + (1,))
        return ("dyn", Lazy(y if keep else ex.g.reshape(y, x.shape[:-1])))
    return fn


def m_softmax(op):
    def fn(ex, node):
        x = ex.tensor(ex.val(node.args[0]))
        if node.args[1] not in (-1, len(x.shape) - 1):
            raise ExportError("%s: %s over axis %s; regc's is the last" % (node.name, op,
                                                                             node.args[1]))
        return ("dyn", Lazy(ex.g.node(op, [x], [x.shape, x.shape[:-1]])[0]))
    return fn


def m_split(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    size, dim = node.args[1], node.args[2] if len(node.args) > 2 else 0
    nd = len(x.shape)
    if node.target == aten.chunk.default:  # chunk(n): split in parts of ceil(size / n)
        size = -(-x.shape[dim % nd] // size)
    if dim % nd == nd - 1 and x.shape[-1] % size == 0:
        parts = x.shape[-1] // size
        outs = ex.g.node("split", [x], [x.shape[:-1] + (size,)] * parts)
        return ("tuple", [("dyn", Lazy(o)) for o in outs])
    outs = []
    for start in range(0, x.shape[dim % nd], size):
        outs.append(("dyn", Lazy(slice_tensor(ex, x, dim % nd, start, min(size, x.shape[dim % nd] -
                                                                          start)))))
    return ("tuple", outs)


def slice_tensor(ex, x, axis, start, length):
    if start == 0 and length == x.shape[axis]:
        return x
    shape = list(x.shape)
    shape[axis] = length
    return ex.g.one("slice", [x], tuple(shape), {"axis": axis, "start": start,
                                                 "shape": list(shape)})


def m_slice(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    nd = len(x.shape)
    dim = (node.args[1] if len(node.args) > 1 else 0) % nd
    start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
    end = node.args[3] if len(node.args) > 3 and node.args[3] is not None else x.shape[dim]
    step = node.args[4] if len(node.args) > 4 else 1
    if step != 1:
        raise ExportError("%s: a slice with step %d" % (node.name, step))
    n = x.shape[dim]
    start = max(0, min(n, start + n if start < 0 else start))
    end = max(start, min(n, end + n if end < 0 else end))
    return ("dyn", Lazy(slice_tensor(ex, x, dim, start, end - start)))


def m_cat(ex, node):
    vals = [ex.val(v) for v in node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else 0
    shape = ex.out_shape(node)
    # an empty part adds nothing (Phi-3's rotary: cat(rotated, pass) when
    # the whole head rotates)
    parts = [(v, n) for v, n in zip(vals, node.args[0])
             if not isinstance(n, torch.fx.Node) or n.meta["val"].shape[dim] != 0]
    if len(parts) == 1:
        return parts[0][0]
    if dim % len(shape) != len(shape) - 1:
        raise ExportError("%s: cat on axis %d; regc concatenates the last" % (node.name, dim))
    ts = [ex.tensor(v) for v, _ in parts]
    return ("dyn", Lazy(ex.g.one("concat", ts, shape)))


def m_masked_fill(ex, node):
    x = ex.tensor(ex.val(node.args[0]))
    mask, _ = broadcast_operand(ex, ex.val(node.args[1]), x.shape)
    # JSON has no infinity: -inf fills become the lowest float, which a
    # softmax turns into the same zero (the rows with nothing unmasked
    # aside, which give NaN in PyTorch and a uniform row here)
    value = max(min(float(node.args[2]), 3.4028234663852886e38), -3.4028234663852886e38)
    return ("dyn", Lazy(ex.g.one("masked_fill", [x, mask], x.shape, {"value": value})))


def m_where(ex, node):
    """where(c, a, b) under a constant condition, as masked fills: a where c
    holds, b elsewhere (a scalar side is the fill value; two tensor sides
    are each zeroed where the other is taken, and added)."""
    shape = ex.out_shape(node)
    cond = torch.broadcast_to(ex.env[node.args[0]][1].bool(), shape)
    a, b = ex.val(node.args[1]), ex.val(node.args[2])

    def side(v):
        """A tensor side of the output's shape: a constant broadcast here
        (once), a computed one only as it is."""
        if v[0] == "const":
            return ex.const_leaf(torch.broadcast_to(v[1], shape).contiguous())
        x = ex.tensor(v)
        if tuple(x.shape) != tuple(shape):
            x = ex.g.reshape(x, shape) if numel(x.shape) == numel(shape) else None
        if x is None:
            raise ExportError("%s: a where whose computed side is broadcast" % node.name)
        return x

    def filled(v, where_cond, value):
        mask = ex.const_leaf(where_cond.float().contiguous())
        return ex.g.one("masked_fill", [side(v), mask], shape, {"value": value})

    def scalar(s):  # JSON has no infinity: the largest floats stand in for it
        s = float(s)
        if math.isnan(s):
            raise ExportError("%s: a where that fills NaN" % node.name)
        return max(min(s, 3.4028234663852886e38), -3.4028234663852886e38)
    if a[0] == "py" or (a[0] == "const" and a[1].numel() == 1 and b[0] != "py"):
        return ("dyn", Lazy(filled(b, cond, scalar(a[1] if a[0] == "py" else a[1].item()))))
    if b[0] == "py" or (b[0] == "const" and b[1].numel() == 1):
        return ("dyn", Lazy(filled(a, ~cond, scalar(b[1] if b[0] == "py" else b[1].item()))))
    return ("dyn", Lazy(ex.g.one("add", [filled(a, ~cond, 0.0), filled(b, cond, 0.0)], shape)))


def m_cross_entropy(ex, node):
    logits_n, targets_n = node.args[0], node.args[1]
    ignore = node.args[4] if len(node.args) > 4 else node.kwargs.get("ignore_index", -100)
    reduction = node.args[3] if len(node.args) > 3 else node.kwargs.get("reduction", 1)
    smoothing = node.args[5] if len(node.args) > 5 else node.kwargs.get("label_smoothing", 0.0)
    if reduction != 1 or smoothing or (len(node.args) > 2 and node.args[2] is not None):
        raise ExportError("%s: cross-entropy with weights, smoothing or a reduction other than "
                          "the mean" % node.name)
    if ignore >= 0:
        raise ExportError("%s: ignore_index %d; regc ignores negative targets" % (node.name,
                                                                                 ignore))
    logits = ex.tensor(ex.val(logits_n))
    targets = ex.tensor(ex.val(targets_n))
    # undo the flattening of both: regc's loss reads [..., V] against [...]
    if logits.producer and logits.producer[0] == "reshape":
        logits = logits.producer[1][0]
    if targets.producer and targets.producer[0] == "reshape":
        targets = targets.producer[1][0]
    if logits.shape[:-1] != targets.shape:
        targets = ex.g.reshape(targets, logits.shape[:-1])
    loss = ex.g.node("cross_entropy", [logits, targets], [(), logits.shape[:-1]])[0]
    return ("dyn", Lazy(loss))


def m_sdpa(ex, node):
    a = list(node.args) + [None] * (8 - len(node.args))
    dropout = a[4] or node.kwargs.get("dropout_p", 0.0)
    is_causal = a[5] or node.kwargs.get("is_causal", False)
    scale = a[6] if a[6] is not None else node.kwargs.get("scale")
    if dropout:
        raise ExportError("%s: attention dropout %g (regc trains without dropout)" % (node.name,
                                                                                     dropout))
    mask_n = a[3] if a[3] is not None else node.kwargs.get("attn_mask")
    return attention(ex, node, a[:3], mask_n, scale, bool(is_causal), 0.0)


def m_regc_attention(ex, node):
    """export_attention's regc::attention: soft-capped scores."""
    q_n, k_n, v_n, mask_n, scale, softcap = node.args
    return attention(ex, node, [q_n, k_n, v_n], mask_n, scale, False, softcap)


def attention(ex, node, qkv, mask_n, scale, causal, softcap):
    """regc's attention of [B, H, T, D] q, k and v, under a constant mask
    (causal, causal with a window, empty, or an additive bias) or a bias
    computed from parameters; [B, T, H, D] out."""
    q_n, k_n, v_n = qkv[0], unrepeat_kv(ex, qkv[1]), unrepeat_kv(ex, qkv[2])
    q, H = heads_of(ex, ex.val(q_n))
    k, Hk = heads_of(ex, ex.val(k_n))
    v, Hv = heads_of(ex, ex.val(v_n))
    D = q.shape[-1] // H
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    inputs, window = [q, k, v], 0
    if mask_n is not None and ex.val(mask_n)[0] != "const":
        bias, causal = computed_bias(ex, node, mask_n, q.shape[1], k.shape[1], H)
        inputs.append(bias)
        mask_n = None
    if mask_n is not None:
        kind, mask = ex.val(mask_n)
        T = q.shape[1]
        w = ex.memo(const_key("window", mask, T), lambda: causal_window(mask, T)) \
            if T == k.shape[1] else 0
        if w:
            causal, window = True, (w if w < T else 0)
        elif ex.memo(const_key("empty", mask), lambda: bool(
                (mask if mask.dtype == torch.bool else mask == 0).all())):
            pass  # every key visible: no mask at all
        else:  # an additive bias [H, Tq, Tk], the same for every batch row
            bias = mask if mask.dtype != torch.bool else torch.where(
                mask, 0.0, float("-inf"))
            bias = torch.broadcast_to(bias, (q.shape[0], H, q.shape[1], k.shape[1]))
            if not bool((bias == bias[:1]).all()):
                raise ExportError("%s: an attention mask that differs between batch rows" %
                                  node.name)
            inputs.append(ex.const_leaf(bias[0].contiguous().float()))
    if softcap and len(inputs) > 3:
        raise ExportError("%s: soft-capped scores under a bias (regc's attention caps only "
                          "unbiased scores)%s" % (node.name, source_of(node)))
    attrs = {"n_head": H, "n_kv_head": Hk, "causal": int(causal), "scale": float(scale)}
    if softcap:
        attrs["softcap"] = float(softcap)
    if window:
        attrs["window"] = window
    out = ex.g.node("attention", inputs, [q.shape, (q.shape[0], H, q.shape[1])], attrs)[0]
    B, T, _ = q.shape
    return ("dyn", Lazy(out, (B, T, H, D), [0, 2, 1, 3]))


# ---- patterns fused into regc's own ops


MAPPING = {
    aten.view.default: m_view, aten.reshape.default: m_view, aten._unsafe_view.default: m_view,
    aten.unsqueeze.default: m_view, aten.squeeze.dim: m_view, aten.squeeze.default: m_view,
    aten.flatten.using_ints: m_view,
    aten.transpose.int: m_transpose, aten.permute.default: m_transpose, aten.t.default: m_transpose,
    aten.embedding.default: m_embedding,
    aten.layer_norm.default: m_layer_norm,
    aten.linear.default: m_linear, aten.addmm.default: m_addmm, aten.mm.default: m_mm,
    aten.matmul.default: m_mm,
    aten.add.Tensor: m_add, aten.sub.Tensor: m_sub, aten.mul.Tensor: m_mul,
    aten.div.Tensor: m_div,
    aten.neg.default: unary("neg"), aten.exp.default: unary("exp"),
    aten.tanh.default: unary("tanh"), aten.rsqrt.default: unary("rsqrt"),
    aten.silu.default: unary("silu"), aten.relu.default: unary("relu"),
    aten.gelu.default: m_gelu, aten.pow.Tensor_Scalar: m_pow, aten.rsub.Scalar: m_rsub,
    aten.reciprocal.default: m_power(-1.0), aten.sqrt.default: m_power(0.5),
    aten.mean.dim: m_reduce("mean_last"), aten.sum.dim_IntList: m_reduce("sum_last"),
    aten.softmax.int: m_softmax("softmax"), aten._softmax.default: m_softmax("softmax"),
    aten.log_softmax.int: m_softmax("log_softmax"),
    aten._log_softmax.default: m_softmax("log_softmax"),
    aten.split.Tensor: m_split, aten.chunk.default: m_split, aten.slice.Tensor: m_slice, aten.cat.default: m_cat,
    aten.masked_fill.Scalar: m_masked_fill,
    aten.scaled_dot_product_attention.default: m_sdpa,
    torch.ops.regc.attention.default: m_regc_attention,
    aten.cross_entropy_loss.default: m_cross_entropy,
}
for _op in IDENTITY_OPS:
    MAPPING[_op] = m_identity
for _op in CAST_OPS:
    MAPPING[_op] = m_cast
