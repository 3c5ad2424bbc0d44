"""The GPU model backend: the codec-LM backend's shape, a GPU cost table's times.

`backend.kind: gpu_model` serves what `codec_lm` serves on a GPU, step by step and turn
by turn, with each call's time read from a cost table (pipeline/backends/gpu_costs.py)
instead of computed: the engine, its scheduling and its drivers run as served, on a
machine without a GPU, in real time or on a virtual clock.

Talker: a segment's prompt is CSM's (bos + "[speaker]text" + eos) counted in tokens,
`prompt_chars_per_token` UTF-8 bytes of text a token (1: the random model's byte
tokenizer, 305 tokens for 300 characters; 4: about CSM's own). As in
codec_lm/launches.py, a step prefills the next `prefill_chunk_tokens` of at most
`prefill_rows` prompts among the segments given (in their order), then decodes one frame
for each segment past its prompt (a prompt ending in this step's prefill makes its first
frame in the same step: in the decode, or with the table's `prefill_makes_frames` in the
prefill pass itself). A segment holds the lowest free KV slot; the decode runs the row
bucket holding the highest slot in the step. Its GPU time is the table's decode(rows,
keys) + prefill(tokens). It ends after min(max_frames, max(min_frames,
ceil(frames_per_char x characters / speed))) frames. With `overlap_steps` a call launches
step n and waits for step n-1 (the GPU runs them back to back, from when the host has
launched them), so frames come one call late, as codec_lm's. The host's own time per
call (the table's host cost) comes first.

Vocoder: one Mimi turn of K chunks costs the table's mimi(K, longest chunk's frames).

`sustained_streams` says the streams its loop holds at 1x, from the table: admission's
capacity (pipeline/backend.py).

Frames and PCM are the sim backend's checkable signal: frame (stream tag, index), PCM
that encodes both (pipeline/backends/sim.py), readable with `decode_sim_signal`. Costs
are spent with `sleep`, and `clock` says when a call starts (the engine's clock:
time.monotonic, or a virtual loop's time with benchmarks/virtual_time.py).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.backend import AbortHandle, Backend, TalkRequest, TalkStep, VocodeItem, Voice
from pipeline.backends.gpu_costs import (
    GpuCostTable,
    bucket_of,
    load_cost_table,
    sustained_streams,
)
from pipeline.backends.sim import encode_sim_signal
from pipeline.config import GpuModelConfig

VOICE_PREFIX = "speaker-"
# CSM's prompt around the text: bos, "[", the speaker digit, "]", eos
PROMPT_EXTRA_TOKENS = 5


@dataclass(eq=False)
class ModelSegment:
    """One open segment: its prompt, its KV slot and its frames."""

    tag: int
    first_index: int  # the stream's index of this segment's first frame
    prompt_tokens: int
    max_frames: int
    slot: int
    prefilled: int = 0
    launched: int = 0
    delivered: int = 0
    pending: int = 0  # frames collected, not yet handed back
    done: bool = False
    closed: bool = False

    @property
    def in_prompt(self) -> bool:
        return self.prefilled < self.prompt_tokens


@dataclass
class _Launch:
    entries: list[ModelSegment]
    ends_at_s: float  # when the GPU finishes it
    prefill_rows: int = 0
    prompts_ended: int = 0  # prompts whose prefill ended in it (their first frame)


@dataclass
class _Slots:
    """KV slots, the lowest free first (as codec_lm's KVSlots)."""

    free: list[int] = field(default_factory=list)
    top: int = 0

    def allocate(self) -> int:
        if self.free:
            return heapq.heappop(self.free)
        self.top += 1
        return self.top - 1

    def release(self, slot: int) -> None:
        heapq.heappush(self.free, slot)


class GpuModelBackend(Backend):
    """The codec-LM backend's steps and turns at a cost table's times (module doc)."""

    name = "gpu_model"

    def __init__(
        self,
        config: GpuModelConfig | None = None,
        table: GpuCostTable | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or GpuModelConfig()
        self.table = table or load_cost_table(self.config.cost_table)
        self._sleep, self._clock = sleep, clock
        self.sample_rate_hz = self.config.sample_rate_hz
        self.samples_per_frame = self.config.samples_per_frame
        self._slots = _Slots()
        self._in_flight: _Launch | None = None
        self._gpu_free_at_s = -math.inf
        self.open_segments = 0
        # what each call was given and cost (gpu_model benchmarks read them)
        # seconds, segments, prefill rows, prompts ended, when it began (the clock's)
        self.step_calls: list[tuple[float, int, int, int, float]] = []
        self.vocode_calls: list[tuple[float, int]] = []  # seconds, chunks
        self._voices = [
            Voice(
                id=f"{VOICE_PREFIX}{n}",
                name=f"CSM speaker {n} (GPU model)",
                language="en",
                sample_rate_hz=self.sample_rate_hz,
                samples_per_frame=self.samples_per_frame,
            )
            for n in range(self.config.speakers)
        ]

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def default_voice(self) -> str:
        return self._voices[0].id

    def _check_voice(self, voice: str) -> None:
        if not any(voice in (v.id, v.name) for v in self._voices):
            raise ValueError(f"unknown gpu_model voice {voice!r}")

    def prompt_tokens(self, text: str) -> int:
        """Tokens of the segment's prompt (the module doc)."""
        utf8_bytes = len(text.encode())
        return math.ceil(utf8_bytes / self.config.prompt_chars_per_token) + PROMPT_EXTRA_TOKENS

    def max_frames(self, text: str, speed: float = 1.0) -> int:
        cfg = self.config
        wanted = math.ceil(cfg.frames_per_char * len(text) / max(speed, 1e-6) - 1e-9)
        return min(cfg.max_frames_per_segment, max(cfg.min_frames_per_segment, wanted))

    def open_segment(self, request: TalkRequest) -> ModelSegment:
        self._check_voice(request.voice)
        tokens = self.prompt_tokens(request.text)
        if tokens > self.config.max_prompt_tokens:
            raise ValueError(
                f"segment is {tokens} tokens, more than max_prompt_tokens "
                f"({self.config.max_prompt_tokens})"
            )
        if self._slots.top >= self.table.max_rows and not self._slots.free:
            raise ValueError(f"no KV slot free: all {self.table.max_rows} are held")
        self.open_segments += 1
        return ModelSegment(
            tag=request.stream_tag,
            first_index=request.first_frame_index,
            prompt_tokens=tokens,
            max_frames=self.max_frames(request.text, request.speed),
            slot=self._slots.allocate(),
        )

    def _launch(self, segments: list[ModelSegment], start_s: float) -> _Launch | None:
        cfg, table = self.config, self.table
        decode = [s for s in segments if not s.in_prompt and s.launched < s.max_frames]
        prefill = [s for s in segments if s.in_prompt][: cfg.prefill_rows]
        if not decode and not prefill:
            return None
        tokens, finals = 0, []
        for s in prefill:
            piece = min(cfg.prefill_chunk_tokens, s.prompt_tokens - s.prefilled)
            s.prefilled += piece
            tokens += piece
            if not s.in_prompt:
                finals.append(s)
        gpu_ms = table.prefill(tokens)
        # the rows the decode runs (with prefill_makes_frames the prefill pass made the
        # first frames of the prompts it ended)
        rows_of = decode if table.prefill_makes_frames else [*decode, *finals]
        if rows_of:
            rows = max(s.slot for s in rows_of) + 1
            keys = max(s.prompt_tokens + s.launched for s in rows_of) + 1
            gpu_ms += table.decode(rows, bucket_of(keys, table.key_buckets))
        entries = [*decode, *finals]
        for s in entries:
            s.launched += 1
        begins_s = max(start_s, self._gpu_free_at_s)
        self._gpu_free_at_s = begins_s + gpu_ms / 1000.0
        return _Launch(entries, self._gpu_free_at_s, len(prefill), len(finals))

    @staticmethod
    def _collect(launch: _Launch | None) -> float:
        if launch is None:
            return -math.inf
        for s in launch.entries:
            if not s.closed:
                s.pending += 1
        return launch.ends_at_s

    def step(self, segments: Sequence[ModelSegment]) -> list[TalkStep]:
        segments = list(segments)
        if not segments:
            return []
        for s in segments:
            if s.closed or s.done:
                raise ValueError("step() got a closed or finished segment")
        now_s = self._clock()
        launched_s = now_s + self.table.host(len(segments)) / 1000.0
        launch = self._launch(segments, launched_s)
        if self.config.overlap_steps:
            previous, self._in_flight = self._in_flight, launch
            ready_s = self._collect(previous)
        else:
            ready_s = self._collect(launch)
        cost_s = max(launched_s, ready_s) - now_s
        self._sleep(cost_s)
        counts = (launch.prefill_rows, launch.prompts_ended) if launch else (0, 0)
        self.step_calls.append((cost_s, len(segments), *counts, now_s))
        return [self._outcome(s) for s in segments]

    def _outcome(self, s: ModelSegment) -> TalkStep:
        count, s.pending = s.pending, 0
        frames = np.empty((count, 2), dtype=np.int64)
        frames[:, 0] = s.tag
        frames[:, 1] = np.arange(s.first_index + s.delivered, s.first_index + s.delivered + count)
        s.delivered += count
        s.done = s.delivered >= s.max_frames
        return TalkStep(frames=frames, done=s.done)

    def close_segment(self, segment: ModelSegment) -> None:
        if not segment.closed:
            segment.closed = True
            segment.pending = 0
            self.open_segments -= 1
            self._slots.release(segment.slot)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        for item in items:
            self._check_voice(item.voice)
            if item.frames.ndim != 2 or item.frames.shape[1] != 2:
                raise ValueError(f"gpu_model frames must be [frames, 2], got {item.frames.shape}")
            stop = item.emit_offset_frames + item.emit_frames
            if not 0 <= item.emit_offset_frames <= stop <= len(item.frames):
                raise ValueError(
                    f"emit range {item.emit_offset_frames}+{item.emit_frames} "
                    f"outside {len(item.frames)} frames"
                )
        if items:
            longest = max(item.emit_offset_frames + item.emit_frames for item in items)
            cost_s = self.table.mimi(len(items), longest) / 1000.0
            self._sleep(cost_s)
            self.vocode_calls.append((cost_s, len(items)))
        return [
            encode_sim_signal(
                item.frames[item.emit_offset_frames : item.emit_offset_frames + item.emit_frames],
                self.samples_per_frame,
            )
            for item in items
        ]

    def sustained_streams(self) -> float | None:
        """Streams at 1x the table's loop sustains (gpu_costs.sustained_streams)."""
        cfg = self.config
        return sustained_streams(
            self.table,
            prefill_rows=cfg.prefill_rows,
            prefill_chunk_tokens=cfg.prefill_chunk_tokens,
            frame_ms=1000.0 * self.samples_per_frame / self.sample_rate_hz,
        )

    def close(self) -> None:
        self._collect(self._in_flight)
        self._in_flight = None
