"""The sim backend: set costs, a checkable signal.

Talker: a segment of `text` becomes exactly

    frames_for_text(text, speed) = max(2, ceil(len(text) / (1.2 * speed)))

frames (about one frame per 1.2 characters; `len` counts the segment's characters as the
talker gets them, i.e. after segmentation, see `expected_frames`). Each talker step gives
every segment in it `talker_frames_per_step` more frames (fewer at the segment's end) and
costs `talker_step_base_ms + talker_step_per_stream_ms * segments`, like one decoding
step of a batched codec language model. A frame is an int64 pair (stream_tag, frame index
within the stream).

Vocoder: costs `vocoder_base_ms + vocoder_per_frame_ms * frames` per call when batched
(base once, frames counted over every item, context included), or that sum per item when
not batched. Its PCM encodes every frame's pair: the frame's samples are cut in four
equal blocks holding, as constant levels, the high and low 12 bits of the tag, then of
the index (values mod 2**24). A level is (digit + 0.5) * 8 / 32768, so int16
quantisation (either scaling) moves it by far less than half a step.
`decode_sim_signal` reads them back.

Costs are spent with `sleep(seconds)` (time.sleep by default; a virtual clock can pass
its own), in the stage thread that calls the backend.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from pipeline.backend import (
    AbortHandle,
    Backend,
    BackendCapabilities,
    TalkRequest,
    TalkStep,
    VocodeItem,
    Voice,
)
from pipeline.config import SimConfig, TextConfig
from pipeline.text import segment_options, split_text
from scheduling.errors import ConfigError

CHARS_PER_FRAME = 1.2
MIN_SEGMENT_FRAMES = 2
VOICE_ID = "sim"
VOICE_NAME = "Sim"

_DIGIT_BITS = 12
_DIGIT_MASK = (1 << _DIGIT_BITS) - 1
_VALUE_MASK = (1 << (2 * _DIGIT_BITS)) - 1
_LEVEL_STEP = 8.0 / 32768.0
_BLOCKS = 4


def frames_for_text(text: str, speed: float = 1.0) -> int:
    """Frames the sim talker produces for one segment (see the module doc)."""
    # the tiny epsilon keeps float noise (12 / 1.2 = 10.000000000000002) from adding a frame
    return max(MIN_SEGMENT_FRAMES, math.ceil(len(text) / (CHARS_PER_FRAME * speed) - 1e-9))


def expected_frames(text: str, speed: float = 1.0, options: TextConfig | None = None) -> int:
    """Frames a whole submitted text becomes: the sum over the engine's segments (cut as
    the `text` section `options` says; None: its defaults)."""
    segments = split_text(text, **segment_options(options or TextConfig()))
    return sum(frames_for_text(segment, speed) for segment in segments)


def _digits(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = values & _VALUE_MASK
    return values >> _DIGIT_BITS, values & _DIGIT_MASK


def encode_sim_signal(frames: np.ndarray, samples_per_frame: int) -> np.ndarray:
    """float32 PCM for int64 frames [n, 2] of (tag, index)."""
    tag_hi, tag_lo = _digits(frames[:, 0].astype(np.int64))
    index_hi, index_lo = _digits(frames[:, 1].astype(np.int64))
    levels = (np.stack([tag_hi, tag_lo, index_hi, index_lo], axis=1) + 0.5) * _LEVEL_STEP
    edges = np.linspace(0, samples_per_frame, _BLOCKS + 1).astype(np.int64)
    widths = np.diff(edges)
    pcm = np.repeat(levels.astype(np.float32), widths, axis=1)
    return pcm.reshape(-1)


def decode_sim_signal(pcm: np.ndarray, samples_per_frame: int) -> list[tuple[int, int]]:
    """(stream_tag, frame_index) per frame of sim PCM (int16 or float32, native rate)."""
    samples = np.asarray(pcm)
    if samples.dtype == np.int16:
        samples = samples.astype(np.float64) / 32768.0
    samples = samples.astype(np.float64).reshape(-1)
    if samples.size % samples_per_frame:
        raise ValueError(
            f"{samples.size} samples are not a whole number of {samples_per_frame}-sample frames"
        )
    frames = samples.reshape(-1, samples_per_frame)
    edges = np.linspace(0, samples_per_frame, _BLOCKS + 1).astype(np.int64)
    digits = np.stack(
        [np.median(frames[:, a:b], axis=1) for a, b in itertools.pairwise(edges)],
        axis=1,
    )
    digits = np.clip(np.rint(digits / _LEVEL_STEP - 0.5), 0, _DIGIT_MASK).astype(np.int64)
    tags = (digits[:, 0] << _DIGIT_BITS) | digits[:, 1]
    indices = (digits[:, 2] << _DIGIT_BITS) | digits[:, 3]
    return [(int(t), int(i)) for t, i in zip(tags, indices, strict=True)]


def talker_step_cost_s(config: SimConfig, segments: int) -> float:
    """Seconds one talker step over `segments` open segments costs (0 for none)."""
    if segments <= 0:
        return 0.0
    return (config.talker_step_base_ms + config.talker_step_per_stream_ms * segments) / 1000.0


def vocoder_cost_s(config: SimConfig, decoded_frames: int, items: int) -> float:
    """Seconds one vocode call costs: `items` chunks, `decoded_frames` frames in all
    (context included); base once per call when batched, once per item otherwise."""
    if items <= 0:
        return 0.0
    calls = 1 if config.batched else items
    return (config.vocoder_base_ms * calls + config.vocoder_per_frame_ms * decoded_frames) / 1000.0


@dataclass(slots=True)
class SimSegment:
    """The sim talker's per-segment state."""

    tag: int
    next_index: int  # stream frame index of the next frame
    remaining: int  # frames still to produce
    closed: bool = False


class SimBackend(Backend):
    """A backend whose costs are set, not measured; see the module doc. Its capabilities
    are the config's: by default none beyond the required calls (one talker thread, one
    vocoder worker, nothing prepared, no abort); `sim.concurrent_vocode_calls` and
    `sim.prepares_segments` model Piper's (its vocode calls cost the same side by side:
    the sim models no shared cores)."""

    name = "sim"

    def __init__(
        self, config: SimConfig | None = None, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.config = config or SimConfig()
        self._sleep = sleep
        self.open_segments = 0  # opened and not closed yet
        if type(self).capabilities is SimBackend.capabilities:  # a subclass may declare its own
            self.capabilities = BackendCapabilities(
                concurrent_vocode_calls=self.config.concurrent_vocode_calls,
                prepares_segments=self.config.prepares_segments,
            )
        # the prepared segment's frame count, by (stream tag, segment index)
        self._prepared: dict[tuple[int, int], int] = {}
        self.prepared_opens = 0  # segments opened from a preparation
        if self.config.samples_per_frame < _BLOCKS:
            raise ConfigError(
                f"samples_per_frame must be >= {_BLOCKS} for the sim signal, "
                f"got {self.config.samples_per_frame}"
            )
        self.samples_per_frame = self.config.samples_per_frame
        self.sample_rate_hz = self.config.sample_rate_hz
        self._voice = Voice(
            id=VOICE_ID,
            name=VOICE_NAME,
            language="en",
            sample_rate_hz=self.sample_rate_hz,
            samples_per_frame=self.samples_per_frame,
        )

    frames_for_text = staticmethod(frames_for_text)
    expected_frames = staticmethod(expected_frames)

    def voices(self) -> list[Voice]:
        return [self._voice]

    def default_voice(self) -> str:
        return VOICE_ID

    def _check_voice(self, voice: str) -> None:
        if voice not in (VOICE_ID, VOICE_NAME):
            raise ValueError(f"unknown sim voice {voice!r}")

    def open_segment(self, request: TalkRequest) -> SimSegment:
        self._check_voice(request.voice)
        self.open_segments += 1
        remaining = self._prepared.pop((request.stream_tag, request.segment_index), None)
        if remaining is None:
            remaining = frames_for_text(request.text, request.speed)
        else:
            self.prepared_opens += 1
        return SimSegment(
            tag=request.stream_tag, next_index=request.first_frame_index, remaining=remaining
        )

    def prepare_segment(self, request: TalkRequest) -> Future[object] | None:
        """The segment's frame count, worked out now (done at once: the sim's preparation
        costs nothing); `open_segment` of that segment takes it."""
        if not self.config.prepares_segments:
            return None
        self._check_voice(request.voice)
        key = (request.stream_tag, request.segment_index)
        # one at a time, as Piper's helper thread: a newer preparation replaces the last
        self._prepared = {key: frames_for_text(request.text, request.speed)}
        done: Future[object] = Future()
        done.set_result(None)
        return done

    def drop_prepared(self) -> None:
        self._prepared.clear()

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        cfg = self.config
        if not segments:
            return []
        cost_s = talker_step_cost_s(cfg, len(segments))
        if cost_s > 0:
            self._sleep(cost_s)
        results = []
        for segment in segments:
            if segment.closed:
                raise ValueError("step on a closed sim segment")
            count = min(cfg.talker_frames_per_step, segment.remaining)
            frames = np.empty((count, 2), dtype=np.int64)
            frames[:, 0] = segment.tag
            frames[:, 1] = np.arange(segment.next_index, segment.next_index + count)
            segment.next_index += count
            segment.remaining -= count
            results.append(TalkStep(frames=frames, done=segment.remaining == 0))
        return results

    def close_segment(self, segment: SimSegment) -> None:
        if not segment.closed:
            segment.closed = True
            self.open_segments -= 1

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        for item in items:
            self._check_voice(item.voice)
            if item.frames.ndim != 2 or item.frames.shape[1] != 2:
                raise ValueError(f"sim frames must be [frames, 2], got {item.frames.shape}")
            emit_stop = item.emit_offset_frames + item.emit_frames
            if not 0 <= item.emit_offset_frames <= emit_stop <= len(item.frames):
                raise ValueError(
                    f"emit range {item.emit_offset_frames}+{item.emit_frames} "
                    f"outside {len(item.frames)} frames"
                )
        decoded = sum(len(item.frames) for item in items)
        cost_s = vocoder_cost_s(self.config, decoded, len(items))
        if cost_s > 0:
            self._sleep(cost_s)
        return [
            encode_sim_signal(
                item.frames[item.emit_offset_frames : item.emit_offset_frames + item.emit_frames],
                self.samples_per_frame,
            )
            for item in items
        ]

    def close(self) -> None:
        return None
