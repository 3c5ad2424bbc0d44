"""A stream's audio path in two halves, like a memory channel.

    sender, receiver = audio_channel(stream_id, sample_rate_hz, max_pending_audio_s, report)

The engine holds the `AudioSender`: it sends PCM chunks, closes the channel when the last
one is sent, fails it with an error, or cancels it (unread audio is dropped). The app
holds the `AudioReceiver` and reads with `async for pcm in receiver.chunks()`. Reading is
what tells the engine the client took the audio: what was sent and not read yet is the
pending audio, and a channel with `max_pending_audio_s` or more pending is parked (the
vocoder skips its stream until the reader drains it).

The receiver learns why a stream ended from how the iteration ends: it simply stops after
the last chunk of a finished stream; it raises StreamFailed (after the audio sent before
the failure) when the pipeline failed, and StreamCancelled when the stream was cancelled
(unread audio is dropped: a cancelled stream plays nothing more). A reader that leaves
early (break, an exception, its task cancelled) abandons the stream, which cancels it.

The reader's side reports three things, `report(stream_id, ReaderEvent)`: a parked
channel drained below the cap, the reader read everything of a closed channel, the reader
left early. The engine's stream table queues them and acts on them at its next step
boundary (pipeline/table.py): the reader never re-enters the engine's state.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from enum import Enum

import numpy as np

from pipeline.errors import StreamCancelled, StreamFailed


class ReaderEvent(Enum):
    """What a channel's reader reports."""

    UNPARKED = "unparked"  # a parked channel drained below the cap
    READ_ALL = "read_all"  # everything of a closed channel was read
    GONE = "gone"  # the reader left before the end


ReaderReport = Callable[[str, ReaderEvent], None]


class _Channel:
    __slots__ = (
        "cancelled",
        "closed",
        "error",
        "max_pending_samples",
        "pending_samples",
        "queue",
        "ready",
        "report",
        "sample_rate_hz",
        "stream_id",
    )

    def __init__(
        self,
        stream_id: str,
        sample_rate_hz: int,
        max_pending_samples: int,
        report: ReaderReport,
    ) -> None:
        self.stream_id = stream_id
        self.sample_rate_hz = sample_rate_hz
        self.max_pending_samples = max_pending_samples
        self.report = report
        self.queue: deque[np.ndarray] = deque()
        self.pending_samples = 0
        self.ready = asyncio.Event()
        self.closed = False  # no more chunks will be sent
        self.cancelled = False
        self.error: BaseException | None = None

    @property
    def parked(self) -> bool:
        return self.pending_samples >= self.max_pending_samples


class AudioSender:
    """The engine's half: send, close, fail, cancel."""

    __slots__ = ("_channel",)

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel

    @property
    def closed(self) -> bool:
        return self._channel.closed

    @property
    def parked(self) -> bool:
        """Too much unread audio: the vocoder skips this stream until the reader drains it."""
        return self._channel.parked

    @property
    def pending_audio_s(self) -> float:
        channel = self._channel
        return channel.pending_samples / channel.sample_rate_hz

    def send(self, pcm: np.ndarray) -> None:
        channel = self._channel
        if channel.closed:
            raise RuntimeError(f"stream {channel.stream_id}: audio sent after the channel closed")
        channel.queue.append(pcm)
        channel.pending_samples += len(pcm)
        channel.ready.set()

    def close(self) -> None:
        """The last chunk was sent; the reader ends after reading it."""
        self._channel.closed = True
        self._channel.ready.set()

    def fail(self, error: BaseException) -> None:
        """The pipeline failed: the reader raises StreamFailed after the audio already sent."""
        channel = self._channel
        if channel.closed:
            return
        channel.error = error
        self.close()

    def cancel(self) -> None:
        """Drop unread audio; the reader raises StreamCancelled at its next read."""
        channel = self._channel
        channel.cancelled = True
        channel.queue.clear()
        channel.pending_samples = 0
        self.close()


class AudioReceiver:
    """The app's half: one reader, `async for pcm in receiver.chunks()`."""

    __slots__ = ("_channel", "_taken")

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._taken = False

    @property
    def pending_audio_s(self) -> float:
        channel = self._channel
        return channel.pending_samples / channel.sample_rate_hz

    async def chunks(self) -> AsyncIterator[np.ndarray]:
        """float32 mono PCM, one item per vocoded chunk, in order (see the module doc)."""
        if self._taken:
            raise RuntimeError(f"stream {self._channel.stream_id} already has a reader")
        self._taken = True
        channel = self._channel
        finished = False
        try:
            while True:
                if channel.cancelled:
                    finished = True
                    raise StreamCancelled(channel.stream_id)
                if channel.queue:
                    pcm = channel.queue.popleft()
                    was_parked = channel.parked
                    channel.pending_samples -= len(pcm)
                    if was_parked and not channel.parked:
                        channel.report(channel.stream_id, ReaderEvent.UNPARKED)
                    yield pcm
                    continue
                if channel.closed:
                    finished = True
                    if channel.error is not None:
                        raise StreamFailed(channel.stream_id, channel.error) from channel.error
                    channel.report(channel.stream_id, ReaderEvent.READ_ALL)
                    return
                channel.ready.clear()
                await channel.ready.wait()
        finally:
            if not finished:
                channel.report(channel.stream_id, ReaderEvent.GONE)


def audio_channel(
    stream_id: str, sample_rate_hz: int, max_pending_audio_s: float, report: ReaderReport
) -> tuple[AudioSender, AudioReceiver]:
    """A new channel's two halves."""
    max_pending_samples = max(1, round(max_pending_audio_s * sample_rate_hz))
    channel = _Channel(stream_id, sample_rate_hz, max_pending_samples, report)
    return AudioSender(channel), AudioReceiver(channel)
