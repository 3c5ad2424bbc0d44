"""The engine's record of one stream while it needs talker or vocoder work."""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from dataclasses import dataclass

from pipeline.frames import Segment, StreamFrames
from pipeline.stream import Stream
from pipeline.text import Segmenter
from scheduling import Chunk


class TalkJob:
    """One talker call in flight; `cancelled` is read in the talker thread."""

    __slots__ = ("cancelled", "segment", "work")

    def __init__(self, work: StreamWork, segment: Segment) -> None:
        self.work = work
        self.segment = segment
        self.cancelled = threading.Event()


@dataclass(slots=True, eq=False)
class StreamWork:
    """The engine's state of one stream while it needs talker or vocoder work."""

    stream: Stream
    tag: int  # the backend's stream_tag
    order: int  # submission order (ties, arrival order)
    segmenter: Segmenter
    text: deque[str]  # segments not yet given to the talker
    text_closed: bool  # no more text will be appended
    text_chars: int  # characters submitted so far
    frames: StreamFrames = dataclasses.field(default_factory=StreamFrames)
    next_segment: int = 0
    job: TalkJob | None = None  # the talker call in flight for this stream
    chunk: Chunk | None = None  # the planner's answer, valid while not dirty
    dirty: bool = True  # frames or segment state changed since `chunk` was planned

    @property
    def talked_all(self) -> bool:
        """No more talker work: the text is closed, no segment waits, no call in flight."""
        return self.text_closed and not self.text and self.job is None
