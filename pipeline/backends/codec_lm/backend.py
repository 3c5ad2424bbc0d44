"""CodecLMBackend: CSM's backbone + depth decoder as the talker, Mimi as the vocoder.

The talker's state per segment is a SlotSegment (launches.py: a KV-cache slot, its seed,
how much of its prompt is in the cache, frames launched and handed back). A segment's
prompt is CSM's: bos + "[speaker]text" + eos. It ends at CSM's end condition (an all-zero
frame, not emitted) or after `max_frames` frames: min(max_frames_per_segment,
max(min_frames_per_segment, ceil(frames_per_char x chars / speed))); random-weight models
never end by themselves, so the bound is what ends them. CSM has no speed control: `speed`
only scales that bound. Sampling draws counter-based noise from the segment's seed, derived
from `codec_lm.seed`, the stream's tag and the segment's index (sampling.py): the same
frames alone or batched.

Frames are int64 [frames, codebooks]; PCM is float32 at 24 kHz, 1920 samples per frame.

A step runs on fixed shapes (fixed.py: persistent buffers, row and key buckets, chunked
prefill), on CUDA replayed from graphs captured here, before the backend serves
(`startup_s` says how long the capture took). With `overlap_steps` a step hands back the
frames of the previous one (launches.py): a segment's first step returns no frame, and
after its last frame is launched one more step returns that frame with `done`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import numpy as np

from pipeline.backend import AbortHandle, Backend, TalkRequest, TalkStep, VocodeItem, Voice
from pipeline.backends.codec_lm.fixed import FixedStep
from pipeline.backends.codec_lm.launches import Launch, Launcher, SlotSegment
from pipeline.backends.codec_lm.loading import LoadedModel, load_model
from pipeline.backends.codec_lm.sampling import segment_seed
from pipeline.backends.codec_lm.vocoder import MimiVocoder
from pipeline.backends.gpu_costs import load_cost_table, sustained_streams
from pipeline.config import CodecLMConfig

logger = logging.getLogger("playhead.codec_lm")

VOICE_PREFIX = "speaker-"


class CodecLMBackend(Backend):
    """A CSM checkpoint (or a random-weight one) served step by step; see the module doc.
    No capability beyond the required calls: its steps and decodes share the model's
    buffers (and, on CUDA, its captured graphs), so each stage runs one call at a time."""

    name = "codec_lm"

    def __init__(self, config: CodecLMConfig | None = None, loaded: LoadedModel | None = None):
        self.config = config or CodecLMConfig()
        self.loaded = loaded or load_model(self.config)
        model = self.loaded.model
        codec = model.codec_model
        codec_config = codec.config
        self.sample_rate_hz = int(codec_config.sampling_rate)
        frame_rate = float(codec_config.frame_rate)
        self.samples_per_frame = round(self.sample_rate_hz / frame_rate)
        self.num_codebooks = int(model.config.num_codebooks)
        # the GPU's measured costs, when given: read now, so a bad path fails at start-up
        self.cost_table = (
            load_cost_table(self.config.cost_table) if self.config.cost_table else None
        )
        tokenizer = self.loaded.tokenizer
        self._bos = tokenizer.bos_token_id
        self._eos = tokenizer.eos_token_id
        self._tokenizer = tokenizer
        cfg = self.config
        graphs = cfg.cuda_graphs and self.loaded.device.type == "cuda"
        self.stepper = FixedStep(
            model,
            max_tokens=cfg.max_prompt_tokens + cfg.max_frames_per_segment,
            slots=cfg.max_rows if graphs else cfg.initial_slots,
            grow=not graphs,
            row_multiple=cfg.row_multiple,
            key_bucket_tokens=cfg.key_bucket_tokens,
            prefill_chunk_tokens=cfg.prefill_chunk_tokens,
            prefill_rows=cfg.prefill_rows,
            codec_codebook_size=int(codec_config.codebook_size),
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            cuda_graphs=graphs,
            compile_step=cfg.compile_step,
        )
        self.launcher = Launcher(self.stepper, cfg.prefill_rows)
        self._in_flight: Launch | None = None
        self.vocoder = MimiVocoder(
            codec,
            num_codebooks=self.num_codebooks,
            samples_per_frame=self.samples_per_frame,
            cuda_graphs=graphs,
            max_batch=cfg.vocoder_max_batch,
            max_frames=cfg.vocoder_max_frames,
        )
        started = time.perf_counter()
        self.stepper.capture_all()
        self.vocoder.capture_all()
        self.startup_s = time.perf_counter() - started  # CUDA graph capture (0 on a CPU)
        self._voices = [
            Voice(
                id=f"{VOICE_PREFIX}{n}",
                name=f"CSM speaker {n}",
                language="en",
                sample_rate_hz=self.sample_rate_hz,
                samples_per_frame=self.samples_per_frame,
            )
            for n in range(self.config.speakers)
        ]
        logger.info(
            "codec_lm: %s on %s (%s), %d codebooks, %d Hz; %d talker and %d vocoder CUDA "
            "graphs captured in %.1f s",
            self.loaded.source,
            self.loaded.device,
            str(self.loaded.dtype).removeprefix("torch."),
            self.num_codebooks,
            self.sample_rate_hz,
            self.stepper.graphs.captured,
            self.vocoder.graphs.captured,
            self.startup_s,
        )

    # voices

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def default_voice(self) -> str:
        return self._voices[0].id

    def _speaker(self, voice: str) -> int:
        for n, v in enumerate(self._voices):
            if voice in (v.id, v.name):
                return n
        raise ValueError(f"unknown codec_lm voice {voice!r}")

    # talker

    @property
    def live_segments(self) -> int:
        """Segments holding a KV-cache slot (opened and not yet closed)."""
        return self.stepper.cache.live

    def max_frames(self, text: str, speed: float = 1.0) -> int:
        cfg = self.config
        wanted = math.ceil(cfg.frames_per_char * len(text) / max(speed, 1e-6) - 1e-9)
        return min(cfg.max_frames_per_segment, max(cfg.min_frames_per_segment, wanted))

    def prompt(self, text: str, speaker: int) -> list[int]:
        ids = self._tokenizer(f"[{speaker}]{text}", add_special_tokens=False)["input_ids"]
        ids = ([self._bos] if self._bos is not None else []) + list(ids)
        if self._eos is not None:
            ids.append(self._eos)
        if len(ids) > self.config.max_prompt_tokens:
            raise ValueError(
                f"segment is {len(ids)} tokens, more than max_prompt_tokens "
                f"({self.config.max_prompt_tokens})"
            )
        return ids

    def open_segment(self, request: TalkRequest) -> SlotSegment:
        prompt = self.prompt(request.text, self._speaker(request.voice))
        max_frames = self.max_frames(request.text, request.speed)
        if len(prompt) + max_frames > self.stepper.max_tokens:
            raise ValueError(
                f"{len(prompt)} prompt tokens + {max_frames} frames exceed the cache's "
                f"{self.stepper.max_tokens} tokens"
            )
        seed = segment_seed(self.config.seed, request.stream_tag, request.segment_index)
        slot = self.stepper.cache.allocate()
        self.stepper.ensure_capacity()
        self.stepper.seeds[slot : slot + 1].fill_(seed)  # a kernel, no host sync
        return SlotSegment(prompt=prompt, max_frames=max_frames, slot=slot, seed=seed)

    def step(self, segments: Sequence[SlotSegment]) -> list[TalkStep]:
        segments = list(segments)
        if not segments:
            return []
        for seg in segments:
            if seg.closed or seg.done:
                raise ValueError("step() got a closed or finished segment")
        launch = self.launcher.launch(segments)
        if self.config.overlap_steps:
            previous, self._in_flight = self._in_flight, launch
            self.launcher.collect(previous)
        else:
            self.launcher.collect(launch)
        return [self._outcome(seg) for seg in segments]

    def _outcome(self, seg: SlotSegment) -> TalkStep:
        frames, seg.pending = seg.pending, []
        kept = []
        for frame in frames:
            if self.config.stop_on_end_frame and not frame.any():
                seg.ended = True
                break
            kept.append(frame)
        seg.delivered += len(kept)
        seg.done = seg.ended or seg.delivered >= seg.max_frames
        emitted = np.stack(kept) if kept else np.empty((0, self.num_codebooks), np.int64)
        return TalkStep(frames=emitted, done=seg.done)

    def close_segment(self, segment: SlotSegment) -> None:
        if not segment.closed:
            segment.closed = True
            segment.pending = []
            self.stepper.cache.release(segment.slot)

    # vocoder

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        for item in items:
            self._speaker(item.voice)
            frames = item.frames
            if frames.ndim != 2 or frames.shape[1] != self.num_codebooks:
                raise ValueError(
                    f"codec_lm frames must be [frames, {self.num_codebooks}], got {frames.shape}"
                )
            stop = item.emit_offset_frames + item.emit_frames
            if not 0 <= item.emit_offset_frames <= stop <= len(frames):
                raise ValueError(
                    f"emit range {item.emit_offset_frames}+{item.emit_frames} "
                    f"outside {len(frames)} frames"
                )
        # only the frames up to the last emitted one: the decoder is causal
        chunks = [
            np.asarray(item.frames[: item.emit_offset_frames + item.emit_frames], dtype=np.int64)
            for item in items
        ]
        pcm = self.vocoder.decode_batch(chunks)
        spf = self.samples_per_frame
        return [
            audio[item.emit_offset_frames * spf :] for audio, item in zip(pcm, items, strict=True)
        ]

    def sustained_streams(self) -> float | None:
        """Streams at 1x the loop sustains, from the cost table its GPU measured
        (`codec_lm.cost_table`, gpu_costs.sustained_streams, the gpu_model's arithmetic);
        None without one (admission then measures the stages' calls)."""
        if self.cost_table is None:
            return None
        cfg = self.config
        return sustained_streams(
            self.cost_table,
            prefill_rows=cfg.prefill_rows,
            prefill_chunk_tokens=cfg.prefill_chunk_tokens,
            frame_ms=1000.0 * self.samples_per_frame / self.sample_rate_hz,
        )

    def close(self) -> None:
        self.launcher.collect(self._in_flight)
        self._in_flight = None
