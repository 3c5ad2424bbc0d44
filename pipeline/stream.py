"""A stream: one request's audio output, from submit to done or cancel.

The engine pushes PCM chunks into the stream; the consumer pulls them with `chunks()`.
Pulling a chunk is "the client read it": the audio pushed but not pulled yet is the
stream's pending audio, and a stream with `max_pending_audio_s` or more pending is
parked (the vocoder skips it) until its consumer drains it.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.backend import Voice
from pipeline.errors import StreamFailed


class StreamState(enum.Enum):
    QUEUED = "queued"  # admitted; its text waits for the first talker call
    TALKING = "talking"  # the talker is turning its text into frames; audio may already flow
    VOCODING = "vocoding"  # all text talked; the vocoder emits the frames left
    DRAINING = "draining"  # all audio emitted, engine traces freed; the consumer still reads
    DONE = "done"  # the consumer read the final chunk
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
    ttfa_s: float | None = None  # submit -> first PCM chunk pushed
    audio_s: float = 0.0  # audio emitted
    stalls: int = 0  # emissions after the estimated horizon (after the first audio)
    stall_s: float = 0.0  # total of (emission time - horizon) over those
    segments: int = 0  # talker calls finished
    frames: int = 0  # frames the talker produced
    chunks: int = 0  # PCM chunks pushed
    finished_at_s: float | None = None  # when the stream reached a terminal state


class StreamOwner(Protocol):
    """What a stream tells its engine about its consumer."""

    def _stream_unparked(self, stream: Stream) -> None: ...

    def _stream_read_all(self, stream: Stream) -> None: ...

    def _stream_abandoned(self, stream: Stream) -> None: ...


class Stream:
    """One request's audio; see the module doc. Made by `Engine.submit`."""

    def __init__(
        self,
        stream_id: str,
        voice: Voice,
        *,
        speed: float,
        submitted_at_s: float,
        max_pending_audio_s: float,
        owner: StreamOwner,
    ) -> None:
        self.id = stream_id
        self.voice = voice
        self.sample_rate_hz = voice.sample_rate_hz
        self.speed = speed
        self.state = StreamState.QUEUED
        self.stats = StreamStats(stream_id=stream_id, submitted_at_s=submitted_at_s)
        self._owner = owner
        self._max_pending_samples = max(1, round(max_pending_audio_s * voice.sample_rate_hz))
        self._queue: deque[np.ndarray] = deque()
        self._pending_samples = 0
        self._ready = asyncio.Event()
        self._closed = False  # no more chunks will be pushed
        self._error: BaseException | None = None
        self._consumed = False

    def __repr__(self) -> str:
        return f"Stream({self.id!r}, {self.state.name}, pending={self.pending_audio_s:.2f}s)"

    @property
    def pending_audio_s(self) -> float:
        """Audio pushed, not yet pulled by the consumer."""
        return self._pending_samples / self.sample_rate_hz

    @property
    def parked(self) -> bool:
        """Too much unread audio: the vocoder skips this stream until it drains."""
        return self._pending_samples >= self._max_pending_samples

    @property
    def error(self) -> BaseException | None:
        return self._error

    async def chunks(self) -> AsyncIterator[np.ndarray]:
        """float32 mono PCM, one item per vocoded chunk, in order.

        Ends after the final chunk (or at once when the stream is cancelled); raises
        StreamFailed, after the audio emitted before the failure, when the pipeline
        failed. Leaving early (break, an exception, the consuming task cancelled)
        cancels the stream: close the iterator promptly, e.g. with contextlib.aclosing.
        """
        if self._consumed:
            raise RuntimeError(f"stream {self.id} already has a consumer")
        self._consumed = True
        finished = False
        try:
            while True:
                if self._queue:
                    pcm = self._queue.popleft()
                    was_parked = self.parked
                    self._pending_samples -= len(pcm)
                    if was_parked and not self.parked:
                        self._owner._stream_unparked(self)
                    yield pcm
                    continue
                if self._closed:
                    finished = True
                    if self._error is not None:
                        raise StreamFailed(self.id, self._error) from self._error
                    self._owner._stream_read_all(self)
                    return
                self._ready.clear()
                await self._ready.wait()
        finally:
            if not finished:
                self._owner._stream_abandoned(self)

    # The engine's side.

    def _push(self, pcm: np.ndarray) -> None:
        if self._closed:
            raise RuntimeError(f"stream {self.id} is closed")
        self._queue.append(pcm)
        self._pending_samples += len(pcm)
        self._ready.set()

    def _close(self, error: BaseException | None = None, *, discard: bool = False) -> None:
        """No more chunks; `discard` drops the unread ones (cancel)."""
        self._closed = True
        if error is not None:
            self._error = error
        if discard:
            self._queue.clear()
            self._pending_samples = 0
        self._ready.set()
