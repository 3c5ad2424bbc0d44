"""A stream: one request's audio output, from submit to done or cancel.

`Engine.submit` returns a Stream. Its audio is the receiving half of the stream's audio
channel (pipeline/channel.py): `async for pcm in stream.chunks()`. Its state and stats are
written by the stream book alone (pipeline/book.py); callers read them.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from pipeline.alignment import Alignment
from pipeline.backend import Voice
from pipeline.channel import AudioReceiver


class StreamState(enum.Enum):
    QUEUED = "queued"  # admitted; its text waits for the first talker step
    TALKING = "talking"  # the talker is turning its text into frames; audio may already flow
    VOCODING = "vocoding"  # all text talked; the vocoder emits the frames left
    DRAINING = "draining"  # all audio emitted, engine traces freed; the reader still reads
    DONE = "done"  # the reader read the final chunk
    CANCELLED = "cancelled"  # cancelled (caller, client gone, engine stop); every trace freed
    FAILED = "failed"  # a backend call failed for it; chunks() raises StreamFailed

    @property
    def terminal(self) -> bool:
        return self in (StreamState.DONE, StreamState.CANCELLED, StreamState.FAILED)


@dataclass(slots=True)
class StreamStats:
    """What happened to one stream (engine clock seconds; stalls are server-estimated)."""

    stream_id: str
    submitted_at_s: float
    ttfa_s: float | None = None  # submit -> first PCM chunk sent
    # waited in admission's queue before the submit (admission.queue_max_wait_s at most):
    # the client's first audio came start_wait_s + ttfa_s after its request
    start_wait_s: float = 0.0
    audio_s: float = 0.0  # audio emitted
    stalls: int = 0  # emissions after the estimated horizon (after the first audio)
    stall_s: float = 0.0  # total of (emission time - horizon) over those
    segments: int = 0  # talker segments finished
    frames: int = 0  # frames the talker produced
    chunks: int = 0  # PCM chunks sent
    finished_at_s: float | None = None  # when the stream reached a terminal state
    # a segment of a long-text job (app/jobs/), not a live listener's request: kept out of
    # the live figures (TTFA, stalls, streams, admission's first-audio window, the mean
    # stream); the job counts its own (app/jobs/metrics.py)
    job: bool = False


class Stream:
    """One request's audio; see the module doc."""

    __slots__ = ("alignment", "audio", "id", "sample_rate_hz", "speed", "state", "stats", "voice")

    def __init__(
        self,
        stream_id: str,
        voice: Voice,
        *,
        speed: float,
        submitted_at_s: float,
        audio: AudioReceiver,
    ) -> None:
        self.id = stream_id
        self.voice = voice
        self.sample_rate_hz = voice.sample_rate_hz
        self.speed = speed
        self.state = StreamState.QUEUED
        self.stats = StreamStats(stream_id=stream_id, submitted_at_s=submitted_at_s)
        self.audio = audio
        # when each character and word of its text is heard (pipeline/alignment.py)
        self.alignment = Alignment()

    def __repr__(self) -> str:
        return f"Stream({self.id!r}, {self.state.name}, pending={self.pending_audio_s:.2f}s)"

    @property
    def pending_audio_s(self) -> float:
        """Audio sent, not yet read."""
        return self.audio.pending_audio_s

    def chunks(self) -> AsyncIterator[np.ndarray]:
        """float32 mono PCM, one item per vocoded chunk, in order.

        Ends after the final chunk; raises StreamFailed (after the audio emitted before the
        failure) when the pipeline failed and StreamCancelled when the stream was
        cancelled. Leaving early (break, an exception, the reading task cancelled)
        cancels the stream: close the iterator promptly, e.g. with contextlib.aclosing.
        """
        return self.audio.chunks()
