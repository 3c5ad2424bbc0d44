"""The Backend protocol: the one narrow interface between the engine and a voice model.

A backend has two halves, each called only from its own stage thread (see
pipeline/executor.py):

- the talker turns one text segment into codec frames, yielded in one or more pieces;
- the vocoder turns a batch of chunks (new frames plus left/right context) into PCM,
  with the context already trimmed away.

Frames are numpy arrays with frames on axis 0 (Piper: float32 [frames, 192]; sim:
int64 [frames, 2]). PCM is float32 mono in [-1, 1] at the voice's sample rate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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


@dataclass(frozen=True)
class VocodeItem:
    """One chunk to decode: `frames` spans [context_start, context_stop) of a segment."""

    voice: str
    frames: np.ndarray  # frames on axis 0, context included
    emit_offset_frames: int  # index in `frames` of the first new frame (= left context)
    emit_frames: int  # new frames to return audio for


@runtime_checkable
class Backend(Protocol):
    """A voice model split into talker and vocoder.

    `samples_per_frame` and `sample_rate_hz` describe the default voice; every Voice
    carries its own.
    """

    name: str
    samples_per_frame: int
    sample_rate_hz: int

    def voices(self) -> list[Voice]: ...

    def default_voice(self) -> str: ...

    def talk(self, request: TalkRequest) -> Iterator[np.ndarray]:
        """Frames for one segment, in pieces; runs (and is iterated) in the talker thread."""
        ...

    def vocode(self, items: Sequence[VocodeItem]) -> list[np.ndarray]:
        """PCM per item, `emit_frames * samples_per_frame` samples each, context trimmed."""
        ...

    def close(self) -> None: ...
