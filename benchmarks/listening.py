"""What a listener hears of one stream, whatever carried it: the piece every client here shares.

A client reads a stream's bytes as they arrive (an HTTP body, socket messages). A
BodyReader turns each read into seconds of audio: `PcmReader` at once, `EncodedReader`
(mp3, opus, aac, flac, wav through PyAV) once the body is complete, each decoded packet
credited at the read that completed it, so the player hears it when a real decoder could.
A `StreamRecorder` plays those seconds through the 1x player (benchmarks/player.py), counts
them for the run (its `Tracker`: xRT and the listening count) and makes the stream's record.
benchmarks/loadgen.py (HTTP), benchmarks/mixed_protocols.py (the sockets) and
benchmarks/voice_peer.py (piper's server, through loadgen's `play_request`) record with it.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from benchmarks.player import Outcome, Player, StreamRecord

ENCODED_FORMATS = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}


@dataclass(frozen=True)
class Arrival:
    at_s: float
    duration_s: float


@dataclass(frozen=True)
class RequestResult:
    record: StreamRecord
    arrivals: tuple[Arrival, ...]  # audio as credited to the player


def decoded_durations(body: bytes, response_format: str) -> list[tuple[int, float]]:
    """(byte offset by which the packet has fully arrived, decoded seconds) per packet."""
    import av  # heavy; only encoded formats need it

    container = av.open(io.BytesIO(body), format=ENCODED_FORMATS[response_format])
    try:
        stream = container.streams.audio[0]
        packets: list[tuple[int | None, float]] = []
        for packet in container.demux(stream):
            samples = 0
            rate = 0
            for frame in packet.decode():
                samples += frame.samples
                rate = frame.sample_rate
            seconds = samples / rate if rate else 0.0
            pos = packet.pos if packet.pos is not None and packet.pos >= 0 else None
            packets.append((pos, seconds))
    finally:
        container.close()
    # A packet has arrived once the next distinct position has (an Ogg page holds several
    # packets with the page's position); the last ones need the whole body.
    out: list[tuple[int, float]] = []
    positions = sorted({p for p, _ in packets if p is not None})
    known_end = 0
    for pos, seconds in packets:
        if pos is not None:
            i = bisect.bisect_right(positions, pos)
            known_end = positions[i] if i < len(positions) else len(body)
        end = max(known_end, out[-1][0] if out else 0)
        if seconds > 0:
            out.append((min(end, len(body)), seconds))
    return out


def credit_encoded(
    reads: Sequence[tuple[float, int]], body: bytes, response_format: str
) -> list[Arrival]:
    """Map decoded packets to the read (time, cumulative bytes) that completed them."""
    if not body:
        return []
    cum = [c for _, c in reads]
    arrivals: list[Arrival] = []
    for end, seconds in decoded_durations(body, response_format):
        i = min(bisect.bisect_left(cum, end), len(reads) - 1)
        at_s = reads[i][0]
        if arrivals and arrivals[-1].at_s == at_s:
            arrivals[-1] = Arrival(at_s, arrivals[-1].duration_s + seconds)
        else:
            arrivals.append(Arrival(at_s, seconds))
    return arrivals


class Tracker:
    """What a run heard, requests cut off at its end included: every audio arrival (for
    xRT) and the players of the requests in flight (for the listening count)."""

    def __init__(self) -> None:
        self.arrivals: list[Arrival] = []
        self.players: set[Player] = set()


class BodyReader(Protocol):
    """Turns a response body, read by read, into seconds of audio."""

    def feed(self, at_s: float, data: bytes) -> float:
        """Seconds of audio this read makes playable now."""
        ...

    def flush(self) -> list[Arrival]:
        """Audio that could only be credited once the whole body had arrived."""
        ...


class PcmReader:
    """Raw PCM (s16le mono by default): whole sample frames, rate x frame_bytes a second."""

    def __init__(self, sample_rate_hz: int, frame_bytes: int = 2) -> None:
        self._frame_bytes = frame_bytes
        self._bytes_per_s = float(sample_rate_hz * frame_bytes)
        self._odd = 0  # bytes of a sample frame split across reads

    def feed(self, at_s: float, data: bytes) -> float:
        usable = (self._odd + len(data)) // self._frame_bytes * self._frame_bytes
        self._odd = self._odd + len(data) - usable
        return usable / self._bytes_per_s

    def flush(self) -> list[Arrival]:
        return []


class EncodedReader:
    """An encoded format: decoded once the body is complete (see credit_encoded)."""

    def __init__(self, response_format: str) -> None:
        self._format = response_format
        self._reads: list[tuple[float, int]] = []
        self._chunks: list[bytes] = []
        self._total = 0

    def feed(self, at_s: float, data: bytes) -> float:
        self._total += len(data)
        self._reads.append((at_s, self._total))
        self._chunks.append(data)
        return 0.0

    def flush(self) -> list[Arrival]:
        return credit_encoded(self._reads, b"".join(self._chunks), self._format)


class StreamRecorder:
    """One stream as its listener hears it. `hear` plays audio through a 1x Player as it
    arrives and counts it for the run's Tracker; `result` is the stream's record. Used as a
    context manager around the stream: inside it the player is one of the run's listeners.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        text: str,
        *,
        waited_s: float = 0.0,
        tracker: Tracker | None = None,
    ) -> None:
        self.player = Player()
        self.arrivals: list[Arrival] = []
        self._tracker = tracker if tracker is not None else Tracker()
        self._text_chars = len(text)
        self._waited_s = waited_s
        self.sent_at_s = clock()

    def __enter__(self) -> StreamRecorder:
        self._tracker.players.add(self.player)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._tracker.players.discard(self.player)

    def hear(self, at_s: float, seconds: float) -> None:
        """`seconds` of audio became playable at `at_s` (nothing for 0)."""
        if seconds <= 0:
            return
        arrival = Arrival(at_s, seconds)
        self.player.feed(at_s, seconds)
        self.arrivals.append(arrival)
        self._tracker.arrivals.append(arrival)

    def result(
        self,
        outcome: Outcome,
        *,
        answered_at_s: float,
        finished_at_s: float,
        retry_after_s: float | None = None,
        http_status: int | None = None,
        error: str | None = None,
        server_timing: Mapping[str, float] | None = None,
    ) -> RequestResult:
        """The stream's record and its arrivals, once it has ended."""
        timing = server_timing or {}
        record = StreamRecord(
            outcome=outcome,
            sent_at_s=self.sent_at_s,
            answered_at_s=answered_at_s,
            finished_at_s=finished_at_s,
            playback=self.player.result(),
            text_chars=self._text_chars,
            retry_after_s=retry_after_s,
            http_status=http_status,
            error=error,
            waited_s=self._waited_s,
            server_start_wait_s=timing.get("start-wait"),
            server_first_audio_s=timing.get("first-audio"),
        )
        return RequestResult(record, tuple(self.arrivals))
