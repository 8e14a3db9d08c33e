"""export_patterns.py — what tools/export_torch.py recognises in a traced
program rather than mapping op by op: identity ops skipped while matching,
attention's [B, H, T, D] views of [B, T, H*D] projections, repeated key and
value heads, causal, windowed and empty masks, a score bias computed from parameters,
and the decomposed ops fused into regc's own (RMSNorm, GPT-2's tanh GELU,
the rotary embedding).
"""

import math

import torch

from export_graph import ExportError, Lazy

aten = torch.ops.aten

IDENTITY_OPS = {aten.dropout.default, aten.alias.default, aten.clone.default,
                aten.contiguous.default, aten.detach.default, aten.lift_fresh_copy.default}
CAST_OPS = {aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default,
            aten.type_as.default}


def const_key(what, t, *more):
    """A memo key for a fact about constant tensor t: its storage, offset,
    shape and strides, so that views alike (each layer's unsqueeze of one
    rotary table, its slice of one mask) share the fact."""
    return (what, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            t.stride(), t.dtype) + more


def src(ex, node):
    """Skip identity ops (dropout, casts to float32, aliases) when matching."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and (
            node.target in IDENTITY_OPS or is_noop_cast(node)):
        node = node.args[0]
    return node


def is_noop_cast(node):
    if node.target not in CAST_OPS:
        return False
    val = node.meta.get("val")
    arg = node.args[0]
    return (val is not None and isinstance(arg, torch.fx.Node) and "val" in arg.meta
            and val.dtype == arg.meta["val"].dtype)


def heads_of(ex, v):
    """[B, T, H*D] regc tensor of a [B, H, T, D] value, and H."""
    kind, x = v
    if kind == "dyn" and len(x.vshape) == 4 and x.perm == [0, 2, 1, 3]:
        B, T, H, D = x.vshape
        return ex.g.reshape(x.base, (B, T, H * D)), H
    t = ex.tensor(v)
    B, H, T, D = t.shape
    return ex.g.reshape(ex.g.transpose(t, [0, 2, 1, 3]), (B, T, H * D)), H


def unrepeat_kv(ex, node):
    """repeat_kv's reshape(expand(unsqueeze(x, 2), [B, Hkv, rep, T, D])) -> x."""
    n = src(ex, node)
    if (isinstance(n, torch.fx.Node) and n.target in (aten.reshape.default, aten.view.default,
                                                      aten._unsafe_view.default)):
        e = src(ex, n.args[0])
        if isinstance(e, torch.fx.Node) and e.target == aten.expand.default:
            u = src(ex, e.args[0])
            if isinstance(u, torch.fx.Node) and u.target == aten.unsqueeze.default and \
                    u.args[1] == 2:
                return u.args[0]
    return node


LOWEST = -1e30  # an additive mask's value that hides a key (finfo.min, -inf)


def visible(mask):
    """A bool mask, or an additive float one whose entries are 0 or hide
    their key; None for a float mask with any other (softer) value."""
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask <= LOWEST)).all()):
        return None
    return mask == 0


def causal_mask(mask, T):
    """Is mask ([..., T, T]) causal: query i sees keys 0..i, in every row?"""
    return causal_window(mask, T) == T


def causal_window(mask, T):
    """W where mask ([..., T, T]) is causal with a sliding window of W keys
    (query i sees keys i-W+1..i, in every row; W = T: plainly causal, as
    regc's attention leaves a window no shorter than T out), else 0."""
    m = visible(mask)
    if m is None or tuple(m.shape[-2:]) != (T, T):
        return 0
    w = int(m.reshape(-1, T, T)[0, T - 1].sum())
    i = torch.arange(T)
    want = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < w)
    return w if w > 0 and bool((m == want).all()) else 0


def computed_bias(ex, node, mask_n, tq, tk, heads):
    """A score bias computed from parameters (T5's relative positions) and
    the causal flag, from where(mask, bias, lowest) with a constant mask
    that lets every key through or is causal: [H, Tq, Tk]."""
    m = src(ex, mask_n)
    causal = False
    if is_op(m, aten.where.ScalarOther) and isinstance(m.args[2], (int, float)):
        kind, cond = ex.val(m.args[0])
        if kind != "const":
            raise ExportError("%s: an attention mask that depends on the data" % node.name)
        if bool(cond.all()):
            pass  # every key visible: the bias alone
        elif float(m.args[2]) <= LOWEST and causal_mask(cond, tq):
            causal = True  # hidden keys are the future ones
        else:
            raise ExportError("%s: a computed attention bias under a mask that is neither "
                              "causal nor empty" % node.name)
        bias_n = m.args[1]
    else:
        bias_n = mask_n
    b = ex.tensor(ex.val(bias_n))
    shape = list(b.shape)
    while len(shape) > 3 and shape[0] == 1:
        shape = shape[1:]
    if shape != [heads, tq, tk]:
        raise ExportError("%s: an attention bias of shape %s, not one [%d, %d, %d] for every "
                          "batch row" % (node.name, list(b.shape), heads, tq, tk))
    return ex.g.reshape(b, (heads, tq, tk)), causal


def is_op(n, *targets):
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in targets


def scalar_arg(n, i):
    v = n.args[i] if len(n.args) > i else None
    return float(v) if isinstance(v, (int, float)) else None


def match_rms_norm(ex, node):
    """w * (x * rsqrt(mean(x^2, -1, keepdim) + eps)) -> rmsnorm(x, w, eps)"""
    for wi in (0, 1):
        w_n, y_n = node.args[wi], src(ex, node.args[1 - wi])
        if not (isinstance(w_n, torch.fx.Node) and ex.env[w_n][0] == "dyn" and
                len(ex.env[w_n][1].shape) == 1 and is_op(y_n, aten.mul.Tensor)):
            continue
        for xi in (0, 1):
            x_n, r_n = src(ex, y_n.args[xi]), src(ex, y_n.args[1 - xi])
            if not is_op(r_n, aten.rsqrt.default):
                continue
            add_n = src(ex, r_n.args[0])
            if not is_op(add_n, aten.add.Tensor) or scalar_arg(add_n, 1) is None:
                continue
            mean_n = src(ex, add_n.args[0])
            if not is_op(mean_n, aten.mean.dim) or list(mean_n.args[1]) != [-1]:
                continue
            pow_n = src(ex, mean_n.args[0])
            if not is_op(pow_n, aten.pow.Tensor_Scalar) or scalar_arg(pow_n, 1) != 2.0 or \
                    src(ex, pow_n.args[0]) is not x_n:
                continue
            # over the last axis of a view that keeps it last (Gemma 3's
            # q/k norms of [B, H, T, D] heads): the norm of the view's rows
            # as they lie, the view kept lazy (the view as it was, where
            # the pattern's own ops laid it out)
            kind, lz = ex.val(x_n)
            p = lz.base.producer if kind == "dyn" and lz.plain() else None
            if p and p[0] == "transpose" and lz.vshape == lz.base.shape:
                lz = Lazy(p[1][0], p[1][0].shape, p[2]["perm"])
            keep = kind == "dyn" and lz.perm[-1] == len(lz.perm) - 1
            x = ex.g.reshape(lz.base, lz.vshape) if keep else ex.tensor((kind, lz))
            w = ex.tensor(ex.val(w_n))
            y = ex.g.node("rmsnorm", [x, w], [x.shape, x.shape[:-1]],
                          {"eps": scalar_arg(add_n, 1)})[0]
            return ("dyn", Lazy(y, lz.vshape, lz.perm) if keep else Lazy(y))
    return None


def match_gelu_tanh(ex, node):
    """(x * 0.5) * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> gelu(x)"""
    for hi in (0, 1):
        half, rest = src(ex, node.args[hi]), src(ex, node.args[1 - hi])
        if not (is_op(half, aten.mul.Tensor) and scalar_arg(half, 1) == 0.5 and
                is_op(rest, aten.add.Tensor) and scalar_arg(rest, 1) == 1.0):
            continue
        x_n = src(ex, half.args[0])
        t = src(ex, rest.args[0])
        if not is_op(t, aten.tanh.default):
            continue
        inner = src(ex, t.args[0])
        if not (is_op(inner, aten.mul.Tensor) and
                abs((scalar_arg(inner, 1) or 0) - math.sqrt(2 / math.pi)) < 1e-7):
            continue
        s = src(ex, inner.args[0])
        if not (is_op(s, aten.add.Tensor) and src(ex, s.args[0]) is x_n):
            continue
        c = src(ex, s.args[1])
        if not (is_op(c, aten.mul.Tensor) and scalar_arg(c, 1) == 0.044715):
            continue
        p = src(ex, c.args[0])
        if not (is_op(p, aten.pow.Tensor_Scalar) and scalar_arg(p, 1) == 3.0 and
                src(ex, p.args[0]) is x_n):
            continue
        x = ex.tensor(ex.val(x_n))
        return ("dyn", Lazy(ex.g.one("gelu", [x], x.shape)))
    return None


def rope_half(tab, B, H, T, D):
    """A rotary table [T, D/2] of one broadcast to [B, H, T, D] whose rows
    are the same for every batch row and head and whose halves repeat
    (HF's cat(freqs, freqs)); None for any other."""
    t = torch.broadcast_to(tab, (B, H, T, D)).reshape(-1, T, D)
    if not bool((t == t[:1]).all()) or not bool((t[0, :, :D // 2] == t[0, :, D // 2:]).all()):
        return None
    return t[0, :, :D // 2].contiguous()


def match_rope(ex, node):
    """q * cos + cat(-q[..., D/2:], q[..., :D/2]) * sin -> rope(q, cos, sin),
    q a [B, H, T, D] view of a [B, T, H*D] projection, cos and sin
    constants whose halves repeat (HF's cat(freqs, freqs))."""
    for ai in (0, 1):
        m1, m2 = src(ex, node.args[ai]), src(ex, node.args[1 - ai])
        if not (is_op(m1, aten.mul.Tensor) and is_op(m2, aten.mul.Tensor)):
            continue
        q_n, cos_n = m1.args
        cat_n, sin_n = m2.args
        if not is_op(src(ex, cat_n), aten.cat.default):
            cat_n, sin_n = sin_n, cat_n
        cat_n = src(ex, cat_n)
        if not is_op(cat_n, aten.cat.default) or len(cat_n.args[0]) != 2:
            continue
        neg_n, lo_n = src(ex, cat_n.args[0][0]), src(ex, cat_n.args[0][1])
        if not (is_op(neg_n, aten.neg.default) and is_op(lo_n, aten.slice.Tensor)):
            continue
        hi_n = src(ex, neg_n.args[0])
        if not (is_op(hi_n, aten.slice.Tensor) and src(ex, hi_n.args[0]) is src(ex, q_n) and
                src(ex, lo_n.args[0]) is src(ex, q_n)):
            continue
        qv, cv, sv = ex.val(q_n), ex.val(cos_n), ex.val(sin_n)
        if qv[0] != "dyn" or cv[0] != "const" or sv[0] != "const" or len(qv[1].shape) != 4:
            continue
        B, H, T, D = qv[1].shape
        tabs = [ex.memo(const_key("rope half", tab, B, H, T, D),
                        lambda: rope_half(tab, B, H, T, D)) for tab in (cv[1], sv[1])]
        if any(t is None for t in tabs):
            continue
        x, h = heads_of(ex, qv)
        cos = ex.rope_table("rope_cos", tabs[0])
        sin = ex.rope_table("rope_sin", tabs[1])
        y = ex.g.one("rope", [x, cos, sin], x.shape, {"n_head": h, "inverse": 0})
        return ("dyn", Lazy(y, (B, T, H, D), [0, 2, 1, 3]))
    return None
