"""Per-stream codec frame queues, organised in segments (one per talker call).

Frames of two talker calls are not continuous, so a chunk never spans segments; the
vocoder works on the oldest segment (`current`) while the talker may already fill the
next one. Frames are indexed from 0 within their segment; frames the vocoder no longer
needs (before the next chunk's left context) are freed, so memory stays bounded by what
is queued rather than by the stream's length.

Pieces are kept as the talker yielded them and never mutated: a slice handed to the
vocoder thread stays valid while the talker appends and the engine frees.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Segment:
    """The frames of one talker call."""

    __slots__ = ("_first_held", "_pieces", "available_frames", "done", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.available_frames = 0  # frames produced so far (freed ones included)
        self.done = False  # the talker call ended: no more frames will come
        self._pieces: deque[np.ndarray] = deque()
        self._first_held = 0  # segment index of the first frame of the first held piece

    @property
    def held_frames(self) -> int:
        return self.available_frames - self._first_held

    def append(self, piece: np.ndarray) -> None:
        if self.done:
            raise RuntimeError(f"segment {self.index} is done; no frames may be appended")
        if len(piece):
            self._pieces.append(piece)
            self.available_frames += len(piece)

    def frames(self, start: int, stop: int) -> np.ndarray:
        """Frames [start, stop) of the segment (a view when they lie in one piece)."""
        if not self._first_held <= start < stop <= self.available_frames:
            raise IndexError(
                f"frames [{start}, {stop}) outside the held "
                f"[{self._first_held}, {self.available_frames})"
            )
        pieces = self._pieces
        if len(pieces) == 1:  # the usual case: one piece (a view of it)
            offset = self._first_held
            return pieces[0][start - offset : stop - offset]
        parts: list[np.ndarray] = []
        offset = self._first_held
        for piece in self._pieces:
            end = offset + len(piece)
            if end > start:
                parts.append(piece[max(start - offset, 0) : min(stop - offset, len(piece))])
            if end >= stop:
                break
            offset = end
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def free_before(self, frame: int) -> None:
        """Drop every piece that ends at or before `frame`: nothing will read them again."""
        while self._pieces and self._first_held + len(self._pieces[0]) <= frame:
            self._first_held += len(self._pieces.popleft())


class StreamFrames:
    """One stream's queued frames: its segments, oldest (the vocoder's) first."""

    __slots__ = ("_segments", "emitted_frames", "produced_frames")

    def __init__(self) -> None:
        self._segments: deque[Segment] = deque()
        self.produced_frames = 0  # frames the talker yielded for this stream
        self.emitted_frames = 0  # frames the vocoder emitted audio for

    @property
    def current(self) -> Segment | None:
        """The segment the vocoder works on (the oldest not fully emitted)."""
        return self._segments[0] if self._segments else None

    def segment(self, index: int) -> Segment | None:
        """The held segment with this index (None when not opened yet or closed)."""
        segments = self._segments
        if not segments:
            return None
        position = index - segments[0].index
        if 0 <= position < len(segments) and segments[position].index == index:
            return segments[position]
        for segment in segments:  # indices may skip (never in the engine: belt and braces)
            if segment.index == index:
                return segment
        return None

    def is_last(self, segment: Segment) -> bool:
        """No later segment is open."""
        return bool(self._segments) and self._segments[-1] is segment

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def queued_frames(self) -> int:
        """Produced, not yet emitted."""
        return self.produced_frames - self.emitted_frames

    @property
    def held_frames(self) -> int:
        """Frames in memory (queued ones plus kept left context)."""
        return sum(segment.held_frames for segment in self._segments)

    def open_segment(self, index: int) -> Segment:
        if self._segments and self._segments[-1].index >= index:
            raise ValueError(f"segment {index} opened after {self._segments[-1].index}")
        segment = Segment(index)
        self._segments.append(segment)
        return segment

    def append(self, segment: Segment, piece: np.ndarray) -> None:
        segment.append(piece)
        self.produced_frames += len(piece)

    def emitted(self, frames: int, *, free_before: int) -> None:
        """The vocoder emitted `frames` of the current segment; free what is behind."""
        self.emitted_frames += frames
        current = self.current
        if current is not None:
            current.free_before(free_before)

    def close_current(self) -> None:
        """The current segment is fully emitted: drop it."""
        self._segments.popleft()

    def clear(self) -> None:
        self._segments.clear()
