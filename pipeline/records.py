"""A live stream's engine state: its record, its open talker segment, its chunks in flight.

Plain data shared by the stream table (pipeline/table.py) and the two stage cores
(pipeline/talker_core.py, pipeline/vocoder_core.py). The table creates and ends records;
each core changes only the fields of its own stage: the talker core `text`, `talking`,
`next_segment`, `preparing`; the vocoder core `chunk` and `in_flight`; both append to or
free `frames` (the talker appends, the vocoder frees what it emitted).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from pipeline.aligner import StreamAligner
from pipeline.backend import AbortHandle, SegmentState, TalkRequest
from pipeline.channel import AudioSender
from pipeline.frames import Segment, StreamFrames
from pipeline.stream import Stream
from pipeline.text import Segmenter
from scheduling import Chunk


@dataclass(slots=True, eq=False)
class InFlight:
    """A chunk a vocoder worker took, and its PCM once decoded (held until the chunks
    taken before it are emitted)."""

    chunk: Chunk
    pcm: np.ndarray | None = None
    emitted_at_s: float = 0.0
    # ends the vocode call decoding it (a call of this stream alone), where the backend can
    abort: AbortHandle | None = None
    taken_at_s: float = 0.0  # when the worker took it


class OpenSegment:
    """One stream's talker segment from its opening to its close.

    `state` is the backend's: set by the talker call that opens the segment and freed by
    the one that closes it (pipeline/talker_core.py `run_talk`), both in the talker's
    thread. The event loop only reads it between calls; `in_flight` marks the segments a
    talker call holds now.
    """

    __slots__ = ("closed", "ended", "in_flight", "record", "request", "segment", "state")

    def __init__(self, record: StreamRecord, segment: Segment, request: TalkRequest) -> None:
        self.record = record
        self.segment = segment
        self.request = request
        self.state: SegmentState | None = None
        self.ended = False  # its stream ended: close it, step it no more
        self.closed = False  # the backend's state was freed (or never made)
        self.in_flight = False  # a talker call holds it


@dataclass(slots=True, eq=False)
class StreamRecord:
    """One stream's state while it needs talker or vocoder work."""

    stream: Stream
    sender: AudioSender
    tag: int  # the backend's stream_tag
    order: int  # submission order (the last tie-break)
    segmenter: Segmenter
    aligner: StreamAligner  # its talker segments' timings -> stream.alignment
    text: deque[str] = field(default_factory=deque)  # segments not yet given to the talker
    text_closed: bool = False  # no more text will be appended
    text_chars: int = 0  # characters submitted so far
    frames: StreamFrames = field(default_factory=StreamFrames)
    next_segment: int = 0
    talking: OpenSegment | None = None  # the talker segment open for this stream
    chunk: Chunk | None = None  # the planner's answer, valid while the record is clean
    in_flight: deque[InFlight] = field(default_factory=deque)  # taken chunks, in order
    # the index of its next segment while the backend prepares it (prepare_segment)
    preparing: int | None = None
    # a job's stream: the rate its virtual player plays at (scheduling/jobs.py); None: live
    job_rate: float | None = None

    @property
    def talked_all(self) -> bool:
        """No more talker work: the text is closed, no segment waits, none is open."""
        return self.text_closed and not self.text and self.talking is None

    @property
    def queued_audio_s(self) -> float:
        """Audio the talker made for the stream that the vocoder has not emitted yet."""
        frames = self.frames
        voice = self.stream.voice
        return (
            (frames.produced_frames - frames.emitted_frames)
            * voice.samples_per_frame
            / voice.sample_rate_hz
        )

    @property
    def stepping(self) -> bool:
        """A talker call holds the stream's open segment now."""
        return self.talking is not None and self.talking.in_flight

    @property
    def talking_now(self) -> bool:
        """A talker call steps the stream's open segment, or the backend prepares its
        next one (the stream's talker work runs on a core now)."""
        return self.preparing is not None or self.stepping

    @property
    def waits_for_text(self) -> bool:
        """Nothing to talk or vocode until the client sends more text."""
        return (
            not self.text_closed
            and not self.text
            and self.talking is None
            and self.frames.queued_frames == 0
        )

    def talk_request(
        self, text: str, index: int, *, urgent: bool, all_cores: bool = False
    ) -> TalkRequest:
        """The talker's request for the stream's segment `index` of `text`."""
        stream = self.stream
        return TalkRequest(
            text=text,
            voice=stream.voice.id,
            speed=stream.speed,
            stream_tag=self.tag,
            segment_index=index,
            first_frame_index=self.frames.produced_frames,
            urgent=urgent,
            all_cores=all_cores,
        )
