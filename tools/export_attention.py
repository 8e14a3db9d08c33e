"""export_attention.py — the attention a Hugging Face model runs while
tools/export_torch.py traces it.

Transformers picks a model's attention by name (attn_implementation). The
exporter loads every model with its own, "regc": PyTorch's
scaled_dot_product_attention as Transformers' "sdpa" calls it, which the
exporter maps to regc's attention (the mask it is given, a constant, read
as causal, windowed or a bias). Soft-capped scores (Gemma 2's
attn_logit_softcapping), which scaled_dot_product_attention cannot
express, go through regc::attention instead: one op of its own, so the
trace keeps it whole and the exporter reads its cap as an attribute rather
than pattern-matching the eager attention's matmuls, tanh and softmax.
Its body is Transformers' eager attention, for a model run outside the
trace; the trace, on the meta device, needs only its shape.
"""

from typing import Optional

import torch

from export_graph import ExportError


@torch.library.custom_op("regc::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
              scale: float, softcap: float) -> torch.Tensor:
    """q [B, H, Tq, D], k and v [B, Hk, Tk, D], Hk dividing H; mask
    [B or 1, 1, Tq, Tk], bool (True: visible) or additive; the scores
    cap·tanh(q·kᵀ·scale / cap). Returns [B, H, Tq, D]."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(2, 3)) * scale
    s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


@attention.register_fake
def _(q, k, v, mask, scale, softcap):
    return q.new_empty(q.shape[:-1] + (v.shape[-1],))


def regc_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                           softcap=None, **kwargs):
    """Transformers' attention interface: [B, Tq, H, D] and no weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if kwargs.get("s_aux") is not None:  # sinks: a score regc's attention has not
        raise ExportError("attention sinks (s_aux): regc's attention has none")
    if not softcap:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    if dropout:
        raise ExportError("attention dropout %g (regc trains without dropout)" % dropout)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
        attention_mask = attention_mask[:, :, :, :key.shape[-2]]
    out = torch.ops.regc.attention(query, key, value, attention_mask, float(scale),
                                   float(softcap))
    return out.transpose(1, 2).contiguous(), None


def regc_mask(*args, **kwargs):
    """The mask as "sdpa" builds it, but always built: Transformers may
    leave a causal one out (None) for SDPA's is_causal, which
    regc::attention does not take."""
    from transformers.masking_utils import sdpa_mask
    return sdpa_mask(*args, **dict(kwargs, allow_is_causal_skip=False))


def register():
    """Make "regc" an attn_implementation Transformers accepts."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register("regc", regc_attention_forward)
    AttentionMaskInterface.register("regc", regc_mask)
