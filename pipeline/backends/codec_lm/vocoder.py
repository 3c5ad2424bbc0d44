"""Mimi as the vocoder: K chunks decoded in one batched call, each trimmed to its new frames.

Mimi's decoder is causal end to end (causal convolutions, transposed convolutions trimmed
on the right, a causal sliding-window transformer): a frame's samples depend on it and the
frames before it only. So chunks of different lengths are right-padded into one batch
without changing anything before the padding, a chunk needs no right context, and its
left context frames (decoded, then trimmed) stand in for the past the decoder would have
seen in a whole-segment decode.

transformers' streaming state for the decoder (its `decoder_cache`/`decoder_past_key_values`)
only carries the transformer's keys and values: the convolutions start each call from zero
padding, so decoding chunk by chunk with it does not reproduce a whole-segment decode
(tests/test_codec_lm.py measures it). Hence left context, not that state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class MimiVocoder:
    def __init__(self, codec: torch.nn.Module, *, num_codebooks: int, samples_per_frame: int):
        self.codec = codec
        self.num_codebooks = num_codebooks
        self.samples_per_frame = samples_per_frame
        self.device = next(codec.parameters()).device

    @torch.inference_mode()
    def decode_batch(self, chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Float32 PCM per chunk of int64 frames [frames, codebooks]: frames x samples_per_frame."""
        longest = max((len(c) for c in chunks), default=0)
        if longest == 0:
            return [np.zeros(0, dtype=np.float32) for _ in chunks]
        codes = np.zeros((len(chunks), self.num_codebooks, longest), dtype=np.int64)
        for i, chunk in enumerate(chunks):
            codes[i, :, : len(chunk)] = chunk.T
        audio = self.codec.decode(torch.from_numpy(codes).to(self.device))[0]  # [K, 1, samples]
        audio = audio[:, 0].float().clamp_(-1.0, 1.0).cpu().numpy()
        return [
            np.ascontiguousarray(audio[i, : len(chunk) * self.samples_per_frame])
            for i, chunk in enumerate(chunks)
        ]
