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


def rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """CSM's RMSNorm module as one call of torch's own: one fused kernel on CUDA where
    transformers' module launches eight (casts, pow, mean, add, rsqrt, two products);
    on a float32 CPU the same bits (the frame-for-frame tests). In bfloat16 the fused
    kernel rounds once where the module rounds before its weight's product."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def fuse_projections(layer: torch.nn.Module) -> None:
    """One weight for q, k and v, and one for the MLP's gate and up, so that a fixed step
    runs one matrix product where it ran three, and one where it ran two. The modules'
    own weights become views into the fused ones (no copy kept; their values unchanged).
    Done once per layer: a second step object on the same model (gpu_check's compiled step
    beside the eager one) keeps the fused weights that the first one's graphs read."""
    if hasattr(layer, "_qkv"):
        return
    attn, mlp = layer.self_attn, layer.mlp
    groups = {
        "_qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
        "_gate_up": (mlp.gate_proj, mlp.up_proj),
    }
    if any(m.bias is not None for mods in groups.values() for m in mods):
        raise ValueError("codec_lm: a CSM projection with a bias is not supported")
    for name, mods in groups.items():
        fused = torch.cat([m.weight.detach() for m in mods], dim=0)
        start = 0
        for m in mods:
            rows = m.weight.shape[0]
            m.weight = torch.nn.Parameter(fused[start : start + rows], requires_grad=False)
            start += rows
        setattr(layer, name, (fused, [m.weight.shape[0] for m in mods]))


def project_fused(
    layer: torch.nn.Module, x: torch.Tensor, heads_dim: int, cos: torch.Tensor, sin_signed
):
    """q and k with the rotary embedding applied, and v, as `project` then `rope_signed`
    give them, from the fused q, k, v weight (`fuse_projections`): one matrix product, and
    q's and k's heads turned in one go (adjacent in the product's output)."""
    b, t, _ = x.shape
    weight, sizes = layer._qkv
    heads = F.linear(x, weight).view(b, t, -1, heads_dim).transpose(1, 2)
    q_heads, k_heads = sizes[0] // heads_dim, sizes[1] // heads_dim
    qk = rope_signed(heads[:, : q_heads + k_heads], cos, sin_signed)
    return qk[:, :q_heads], qk[:, q_heads:], heads[:, q_heads + k_heads :]


def _attention_out(layer: torch.nn.Module, hidden: torch.Tensor, attended: torch.Tensor):
    """The attention's output projection added to the residual stream."""
    b, h, t, d = attended.shape
    return hidden + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, h * d))


def finish_layer_fused(layer: torch.nn.Module, hidden: torch.Tensor, attended: torch.Tensor):
    """`finish_layer` with the fused gate and up weight (`fuse_projections`)."""
    hidden = _attention_out(layer, hidden, attended)
    mlp = layer.mlp
    weight, sizes = layer._gate_up
    gate, up = F.linear(rms_norm(layer.post_attention_layernorm, hidden), weight).split(
        sizes, dim=-1
    )
    return hidden + mlp.down_proj(mlp.act_fn(gate) * up)


def finish_layer(layer: torch.nn.Module, hidden: torch.Tensor, attended: torch.Tensor):
    """The attention's output projection, the residual and the MLP block."""
    hidden = _attention_out(layer, hidden, attended)
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
