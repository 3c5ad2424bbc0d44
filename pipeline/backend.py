"""The Backend protocol: the one narrow interface between the engine and a voice model.

A backend has two halves, each called only from its own stage thread (see
pipeline/executor.py):

- the talker works in steps, like an autoregressive language model. `open_segment` takes
  one text segment of one stream and returns the backend's per-segment state (for a codec
  LM: a cache slot and a position; for Piper: the phoneme ids). `step` advances a batch
  of open segments by one model step: for each it returns the new frames (none, one or
  many) and whether the segment ended. `close_segment` frees a segment's state; the
  engine calls it exactly once per opened segment, after its last step, on cancel and on
  failure. Segments join and leave the batch between steps (continuous batching); a
  segment left out of a step keeps its state.
- the vocoder turns a batch of chunks (new frames plus left/right context) into PCM,
  with the context already trimmed away.

Frames are numpy arrays with frames on axis 0 (Piper: float32 [frames, 192]; sim:
int64 [frames, 2]; codec LM: int64 [frames, codebooks]). PCM is float32 mono in [-1, 1]
at the voice's sample rate.

A backend whose talker steps may run side by side in two threads (each step works on
its own segments, no state shared between them) says so with a class attribute
`concurrent_talker_steps = True`; the engine then gives the talker a second lane for
streams' first segments (see pipeline/talker.py). Without it, every talker call runs in
one thread. Likewise `concurrent_vocode_calls = True` says that `vocode` may run in
several threads at once; the engine then runs `vocoder.workers` vocoder turns side by
side (see pipeline/vocoder.py).

A backend may also offer `prepare_segment(request)`: the talker will open this segment
soon (the stream's next one), so the backend may start its costly part in the background,
on a helper thread of its own, and return at once (a concurrent.futures.Future done when
that work is, or None); `open_segment` for a request with the same text, voice and speed
then takes that work. Meanwhile the stream counts as talking (no chunk of it is decoded
ahead on a second vocoder worker: `vocoder.work_ahead_while_talking`). The engine calls
it from the talker thread, only while few streams have work
(`talker.prepare_ahead_streams`), and never relies on it: a backend without it, or a
prepared segment never opened, changes nothing but the time. With it goes
`drop_prepared()`, which the engine calls from the event loop (it must only set flags)
once more streams have work: the backend gives up the work not yet taken, so that no
talker waits on a background thread that the busy cores starve.

Timing: a backend that knows where each character of a segment is heard (Piper's
duration predictor gives every phoneme its frames) returns a `SegmentTiming` on the
segment's first step with frames (`TalkStep.timing`); the engine turns it into the
stream's alignment (pipeline/alignment.py) before any of those frames are vocoded. A
backend that cannot (the sim backend, a codec LM) returns None: the engine then spreads
the segment's characters evenly over its frames as they come (estimates).

Errors: an exception from `open_segment` fails that one stream; one from `step` fails
the streams of that step; one from `vocode` fails the streams of that turn. The engine's
loops survive all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Voice:
    """A voice a backend serves."""

    id: str
    name: str
    language: str
    sample_rate_hz: int
    samples_per_frame: int


@dataclass(frozen=True)
class TalkRequest:
    """One text segment for the talker."""

    text: str
    voice: str
    speed: float  # 1.0 = natural; 2.0 = twice as fast (shorter audio)
    stream_tag: int  # small integer naming the stream (the sim backend encodes it)
    segment_index: int  # 0, 1, 2 ... within the stream
    first_frame_index: int  # frames this stream's talker produced before this segment
    # the stream's player needs this segment's first frames soon: it has no audio yet, or
    # less than talker.urgent_slack_s of audio ahead (buffered plus talked). A backend may
    # make a segment that is not urgent in fewer, larger steps (Piper: its whole flow at
    # once), which costs less per frame but makes its first frames later
    urgent: bool = True


@dataclass(frozen=True)
class SegmentTiming:
    """Where each character of a segment's text (`TalkRequest.text`) is heard, in frames
    of the segment (frame 0: the segment's first frame; fractions allowed).

    One (start, end) pair per character, starts non-decreasing, `start <= end`. A
    character the voice does not speak on its own (a space) may have `start == end`.
    """

    start_frames: tuple[float, ...]
    end_frames: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.start_frames) != len(self.end_frames):
            raise ValueError("a segment timing needs as many starts as ends")


@dataclass(frozen=True)
class TalkStep:
    """One open segment's outcome of one talker step."""

    frames: np.ndarray  # new frames, frames on axis 0; may hold none
    done: bool  # the segment ended: no more frames will come; close it
    # where the segment's characters are heard, from a backend that knows (Piper: its
    # duration predictor), given once per segment, on a step no later than the one with
    # the segment's first frames; None: the engine spreads the characters evenly over
    # the segment's frames (an estimate)
    timing: SegmentTiming | None = None


class VocodeItem(NamedTuple):
    """One chunk to decode: `frames` spans [context_start, context_stop) of a segment."""

    voice: str
    frames: np.ndarray  # frames on axis 0, context included
    emit_offset_frames: int  # index in `frames` of the first new frame (= left context)
    emit_frames: int  # new frames to return audio for


class SegmentState(Protocol):
    """A backend's per-segment talker state (opaque to the engine)."""


@runtime_checkable
class Backend(Protocol):
    """A voice model split into a step-wise talker and a batched vocoder.

    `samples_per_frame` and `sample_rate_hz` describe the default voice; every Voice
    carries its own.
    """

    name: str
    samples_per_frame: int
    sample_rate_hz: int

    def voices(self) -> list[Voice]: ...

    def default_voice(self) -> str: ...

    def open_segment(self, request: TalkRequest) -> SegmentState:
        """Per-segment state for one text segment (talker thread)."""
        ...

    def step(self, segments: Sequence[SegmentState]) -> list[TalkStep]:
        """One model step for every segment given, in order (talker thread)."""
        ...

    def close_segment(self, segment: SegmentState) -> None:
        """Free a segment's state; idempotent (talker thread)."""
        ...

    def vocode(self, items: Sequence[VocodeItem]) -> list[np.ndarray]:
        """PCM per item, `emit_frames * samples_per_frame` samples each, context trimmed."""
        ...

    def close(self) -> None: ...
