"""The pieces of a CSM layer that both steppers share: projections, rotary embedding,
grouped-query attention without copying K and V, and the rest of a decoder layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated, once per table: for `rope_signed`."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope_signed(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`rope` bit for bit ((-a) * b is a * (-b) exactly) with the negation moved from every
    call into the table (`signed_sin`): one kernel fewer per call, two per layer."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin_signed


def project(attn: torch.nn.Module, x: torch.Tensor, heads_dim: int):
    """q, k, v as [batch, heads, tokens, head_dim] from the hidden states [batch, tokens, H]."""
    b, t, _ = x.shape
    q = attn.q_proj(x).view(b, t, -1, heads_dim).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, -1, heads_dim).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, -1, heads_dim).transpose(1, 2)
    return q, k, v


def finish_layer(layer: torch.nn.Module, hidden: torch.Tensor, attended: torch.Tensor):
    """The attention's output projection, the residual and the MLP block."""
    b, h, t, d = attended.shape
    out = layer.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, h * d))
    hidden = hidden + out
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def gqa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Grouped-query attention that reads K and V as they are (no per-head copies).

    q: [b, heads, t, d]; k, v: [b, kv_heads, n, d] (a strided view of a cache is fine);
    mask: bool [b, 1, t, n] (True: attend). The query heads sharing a key-value head are
    folded into the query axis, [b, kv_heads, group * t, d], so one attention per key-value
    head serves its whole group; the mask is repeated per group (a view when t == 1).
    """
    b, heads, t, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    folded = q.reshape(b, kv_heads, group * t, d)
    if t > 1:
        n = mask.shape[-1]
        mask = mask[:, :, None].expand(b, 1, group, t, n).reshape(b, 1, group * t, n)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, heads, t, d)
