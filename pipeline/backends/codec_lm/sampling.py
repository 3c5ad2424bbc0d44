"""Choosing a frame's codes on the device: greedy, or sampled with counter-based noise.

Sampling draws Gumbel noise from an integer hash of (the segment's seed, the position the
frame is sampled at, the codebook, the code) computed with tensor ops, and picks
argmax(logits / temperature + noise) among the top-k codes: a draw from
softmax(logits / temperature) restricted to the top k (the Gumbel-max trick). The noise of
a row depends on that row's seed and position only, never on the batch or on a generator's
state, so a segment's frames under a fixed seed are the same alone or batched, and the
whole draw is plain kernels that a CUDA graph can hold (a torch.Generator cannot be per
row inside one graph). Greedy (temperature 0) is an argmax, untouched by the noise.

The hash works on values below 2**32 held in int64, with multipliers below 2**31, so no
product overflows a signed 64-bit integer (the same bits on every device).
"""

from __future__ import annotations

import torch

MASK_32 = 0xFFFFFFFF
_MUL_A = 0x7FEB352D
_MUL_B = 0x2C1B3C6D
_NOISE_BITS = 24  # a float32 holds 24-bit integers exactly


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply) on int64 tensors in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & MASK_32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & MASK_32
    return x ^ (x >> 16)


def segment_seed(base_seed: int, stream_tag: int, segment_index: int) -> int:
    """A segment's seed from the configured seed and the segment's identity (host side)."""
    x = torch.tensor([base_seed & MASK_32], dtype=torch.int64)
    for part in (stream_tag, segment_index):
        x = mix32(x ^ (part & MASK_32))
    return int(mix32(x)[0])


def _row_hash(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return mix32(mix32(seeds & MASK_32) ^ (positions & MASK_32))


def _gumbel(h: torch.Tensor, codes: int) -> torch.Tensor:
    """Gumbel noise [..., codes] (float32) from per-(row, codebook) hashes h [...]."""
    index = torch.arange(codes, device=h.device, dtype=torch.int64)
    h = mix32(mix32(h[..., None] ^ index))
    uniform = ((h >> (32 - _NOISE_BITS)).float() + 0.5) * (1.0 / (1 << _NOISE_BITS))
    return -torch.log(-torch.log(uniform))


def gumbel_noise(
    seeds: torch.Tensor, positions: torch.Tensor, codebook: int, codes: int
) -> torch.Tensor:
    """Gumbel noise [rows, codes] (float32) from each row's seed and sampling position."""
    return _gumbel(mix32(_row_hash(seeds, positions) ^ codebook), codes)


def frame_noise(
    seeds: torch.Tensor, positions: torch.Tensor, codebooks: int, codes: int
) -> torch.Tensor:
    """The noise of a whole frame at once, [rows, codebooks, codes]: `[:, c]` is
    `gumbel_noise(seeds, positions, c, codes)`, bit for bit, in a few kernels instead of a
    few dozen per codebook (on an H200 the per-codebook hash was about a fifth of a
    step's 9,479 kernels)."""
    books = torch.arange(codebooks, device=seeds.device, dtype=torch.int64)
    return _gumbel(mix32(_row_hash(seeds, positions)[:, None] ^ books), codes)


def choose_codes(
    logits: torch.Tensor,
    *,
    codes: int,
    temperature: float,
    top_k: int,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    codebook: int,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One code per row [rows] (int64) among the first `codes` logits of [rows, vocab];
    `noise` [rows, codes]: this codebook's slice of `frame_noise`, else drawn here."""
    logits = logits[..., :codes].float()
    if temperature <= 0:
        return logits.argmax(dim=-1)
    scores = logits / temperature
    if 0 < top_k < codes:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if noise is None:
        noise = gumbel_noise(seeds, positions, codebook, codes)
    return (scores + noise).argmax(dim=-1)
