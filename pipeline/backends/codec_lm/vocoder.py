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

On CUDA, Mimi runs on a CUDA stream of its own (the vocoder thread never queues behind
the talker's steps) and each call is padded to a (K, frames) bucket, K = 1, 2, 4 ..
`max_batch` and frames = 4, 8 .. `max_frames`, replayed from a graph captured per bucket at
start-up (padding rows hold code 0 and are dropped; padding frames come after the chunk, so
the causal decoder leaves the chunk's samples unchanged). A call beyond the largest bucket
runs eagerly. Mimi runs in `codec_lm.mimi_dtype` (float32 unless bfloat16 is shown
inaudible: benchmarks/gpu_check.py measures the SNR).

transformers' Mimi reads values back from the device in every call, which no CUDA graph can
hold (on an H200, 2026-12-04, every Mimi capture failed: `cudaErrorStreamCaptureInvalidated`)
and which, run eagerly, makes the vocoder thread wait for the GPU tens of times a call: each
causal convolution keeps its padding as tensors and pads by their `.item()`. `host_free_mimi`
gives each convolution the same arithmetic on Python ints (the same samples, tested). The
decoder transformer's mask also asks `.all()` of its positions (packed sequences?), which
transformers from 5.1 skips while a graph is captured; before 5.1 Mimi's capture fails and
Mimi runs eagerly, said at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from pipeline.backends.codec_lm.fixed import buckets
from pipeline.backends.codec_lm.graphs import StepGraphs

MIN_FRAMES_BUCKET = 4


def _int_padding(kernel_size: int, stride: int, padding_total: int):
    def extra_padding(hidden_states: torch.Tensor) -> int:
        length = hidden_states.shape[-1]
        frames = math.ceil((length - kernel_size + padding_total) / stride + 1) - 1
        return frames * stride + kernel_size - padding_total - length

    return extra_padding


def host_free_mimi(codec: torch.nn.Module) -> None:
    """Mimi's decode without host reads (see the module's doc)."""
    for module in codec.modules():
        if hasattr(module, "_get_extra_padding_for_conv1d") and hasattr(module, "padding_total"):
            padding_total = int(module.padding_total)
            module._get_extra_padding_for_conv1d = _int_padding(
                int(module.kernel_size), int(module.stride), padding_total
            )
            if "padding_total" in module._buffers:  # a tensor buffer: F.pad would read it back
                del module._buffers["padding_total"]
                module.padding_total = padding_total


class MimiVocoder:
    def __init__(
        self,
        codec: torch.nn.Module,
        *,
        num_codebooks: int,
        samples_per_frame: int,
        cuda_graphs: bool = False,
        max_batch: int = 64,
        max_frames: int = 32,
        pad_to_buckets: bool | None = None,
    ):
        self.codec = codec
        host_free_mimi(codec)
        self.num_codebooks = num_codebooks
        self.samples_per_frame = samples_per_frame
        self.device = next(codec.parameters()).device
        cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        graphs = cuda_graphs and max_batch > 0  # max_batch 0: Mimi runs eagerly
        self.graphs = StepGraphs("codec_lm vocoder", self.device, graphs, self.stream)
        self.pad = self.graphs.enabled if pad_to_buckets is None else pad_to_buckets
        self.batch_buckets = buckets(1, max(1, max_batch))
        top = max(MIN_FRAMES_BUCKET, max_frames)
        self.frame_buckets = buckets(MIN_FRAMES_BUCKET, top)
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._pinned: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _bucket(self, count: int, sizes: list[int]) -> int | None:
        return next((b for b in sizes if b >= count), None)

    def _buffers_for(self, batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (batch, frames)
        if key not in self._buffers:
            codes = torch.zeros(
                (batch, self.num_codebooks, frames), dtype=torch.long, device=self.device
            )
            audio = torch.zeros(
                (batch, frames * self.samples_per_frame), dtype=torch.float32, device=self.device
            )
            self._buffers[key] = (codes, audio)
        return self._buffers[key]

    @torch.inference_mode()
    def _decode(self, batch: int, frames: int) -> None:
        """The step function of bucket (batch, frames): its codes buffer to its audio buffer."""
        codes, audio = self._buffers_for(batch, frames)
        out = self.codec.decode(codes)[0][:, 0]  # [batch, samples]
        audio.copy_(out[:, : audio.shape[1]].float().clamp(-1.0, 1.0))

    def capture_all(self) -> None:
        """A graph per (K, frames) bucket (CUDA with graphs on), before serving."""
        if not self.graphs.enabled:
            return
        with torch.cuda.stream(self.stream):
            for batch in self.batch_buckets:
                for frames in self.frame_buckets:
                    self._buffers_for(batch, frames)
                    self.graphs.capture(
                        (batch, frames), lambda b=batch, f=frames: self._decode(b, f)
                    )
        self.stream.synchronize()

    @torch.inference_mode()
    def decode_batch(self, chunks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Float32 PCM per chunk of int64 frames [frames, codebooks]: frames x samples_per_frame."""
        longest = max((len(c) for c in chunks), default=0)
        if longest == 0:
            return [np.zeros(0, dtype=np.float32) for _ in chunks]
        batch, frames = len(chunks), longest
        if self.pad:
            batch = self._bucket(batch, self.batch_buckets) or batch
            frames = self._bucket(frames, self.frame_buckets) or frames
        codes = np.zeros((batch, self.num_codebooks, frames), dtype=np.int64)
        for i, chunk in enumerate(chunks):
            codes[i, :, : len(chunk)] = chunk.T
        if self.stream is None:
            self._buffers_for(batch, frames)[0].copy_(torch.from_numpy(codes))
            self._decode(batch, frames)
            audio = self._buffers.pop((batch, frames))[1].numpy()
        else:
            audio = self._decode_cuda(codes, batch, frames)
        return [
            np.ascontiguousarray(audio[i, : len(chunk) * self.samples_per_frame])
            for i, chunk in enumerate(chunks)
        ]

    def _decode_cuda(self, codes: np.ndarray, batch: int, frames: int) -> np.ndarray:
        key = (batch, frames)
        bucketed = key in self._pinned or (
            batch in self.batch_buckets and frames in self.frame_buckets
        )
        if key not in self._pinned:
            samples = frames * self.samples_per_frame
            self._pinned[key] = (
                torch.empty(codes.shape, dtype=torch.long, pin_memory=True),
                torch.empty((batch, samples), dtype=torch.float32, pin_memory=True),
            )
        codes_host, audio_host = self._pinned[key]
        codes_host.copy_(torch.from_numpy(codes))
        with torch.cuda.stream(self.stream):
            dst, audio = self._buffers_for(batch, frames)
            dst.copy_(codes_host, non_blocking=True)
            self.graphs.run(key, lambda: self._decode(batch, frames))
            audio_host.copy_(audio, non_blocking=True)
        self.stream.synchronize()  # this stream only: the talker's steps go on meanwhile
        out = audio_host.numpy().copy()
        if not bucketed:  # an odd shape (beyond the buckets) is not kept
            self._buffers.pop(key, None)
            self._pinned.pop(key, None)
        return out
