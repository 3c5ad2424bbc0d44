"""The simulated 1x player and the listener-side metrics (see docs/benchmarking.md).

Pure code: no I/O, no clocks. The load generator and the simulator feed it arrival times
and durations; both report through `summarize`, so a figure means the same thing in both.

The player (per stream): playback starts when the first audio arrives (t0). `dry_at_s` (h)
is when the player runs out of audio. For each chunk arriving at `a` with duration `d`:
if a > h, that is a stall of a - h and h = a (reset-on-stall, like a jitter buffer); then
h += d. A stream's MARGIN is the least h - a over its chunks after the first (negative:
its worst stall): how close it came to running dry, which says more than a stall count
when stalls are rare (a change that takes 20 ms off every stream's tightest moment shows
in the margins of a few runs; in the stalls only over dozens).

Conventions used in every report:
- stall ratio counts every stall, however short (it is a ratio of physical times);
- stall counts and the stall-free share ignore stalls under `STALL_TOLERANCE_S` (10 ms);
- an interruption is a stall >= `INTERRUPTION_S` (150 ms, WebRTC NetEq's threshold);
- RTF = end-to-end time (request sent -> last audio) / audio duration: lower is better,
  and below 1 the stream arrived faster than it plays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

STALL_TOLERANCE_S = 0.010
INTERRUPTION_S = 0.150
DEFAULT_SLO_S = 1.0


class Player:
    """One stream's player. Feed chunks in arrival order; `result()` at the end."""

    __slots__ = (
        "audio_s",
        "chunks",
        "dry_at_s",
        "margin_at_s",
        "margin_s",
        "stalls_at_s",
        "stalls_s",
        "started_at_s",
    )

    def __init__(self) -> None:
        self.started_at_s: float | None = None
        self.dry_at_s: float | None = None
        self.audio_s = 0.0
        self.chunks = 0
        self.stalls_s: list[float] = []
        self.stalls_at_s: list[float] = []  # where in the audio each stall fell
        self.margin_s: float | None = None  # the least audio left as a chunk arrived
        self.margin_at_s: float | None = None  # ... and the audio played before it

    def feed(self, arrived_at_s: float, duration_s: float) -> float:
        """Play a chunk; returns the stall it caused (0.0 if none). Empty chunks are ignored."""
        if duration_s <= 0.0:
            return 0.0
        stall_s = 0.0
        if self.dry_at_s is None:
            self.started_at_s = arrived_at_s
            self.dry_at_s = arrived_at_s
        else:
            margin_s = self.dry_at_s - arrived_at_s
            if self.margin_s is None or margin_s < self.margin_s:
                self.margin_s, self.margin_at_s = margin_s, self.audio_s
            if margin_s < 0.0:
                stall_s = -margin_s
                self.stalls_s.append(stall_s)
                self.stalls_at_s.append(self.audio_s)
                self.dry_at_s = arrived_at_s
        self.dry_at_s += duration_s
        self.audio_s += duration_s
        self.chunks += 1
        return stall_s

    def result(self) -> Playback:
        return Playback(
            started_at_s=self.started_at_s,
            ended_at_s=self.dry_at_s,
            audio_s=self.audio_s,
            chunks=self.chunks,
            stalls_s=tuple(self.stalls_s),
            stalls_at_s=tuple(self.stalls_at_s),
            margin_s=self.margin_s,
            margin_at_s=self.margin_at_s,
        )


@dataclass(frozen=True)
class Playback:
    """What one listener heard."""

    started_at_s: float | None  # first audio (None: no audio at all)
    ended_at_s: float | None  # when the last sample finished playing
    audio_s: float
    chunks: int
    stalls_s: tuple[float, ...]  # every stall, in order, however short
    stalls_at_s: tuple[float, ...] = ()  # each stall's place: the audio played before it
    margin_s: float | None = None  # the least audio left as a chunk arrived (None: 1 chunk)
    margin_at_s: float | None = None  # where: the audio played before that chunk

    @property
    def stall_s(self) -> float:
        return sum(self.stalls_s)

    def stall_count(self, tolerance_s: float = STALL_TOLERANCE_S) -> int:
        return sum(1 for s in self.stalls_s if s >= tolerance_s)

    def interruptions(self, threshold_s: float = INTERRUPTION_S) -> int:
        return sum(1 for s in self.stalls_s if s >= threshold_s)

    def stall_free(self, tolerance_s: float = STALL_TOLERANCE_S) -> bool:
        return self.stall_count(tolerance_s) == 0


class Outcome(Enum):
    OK = "ok"  # the stream played to its end
    REJECTED = "rejected"  # 429 before the first byte (admission)
    FAILED = "failed"  # any other error (HTTP status, broken stream, timeout)


@dataclass(frozen=True)
class StreamRecord:
    """One request as the client saw it. Times are seconds on the client's clock."""

    outcome: Outcome
    sent_at_s: float
    answered_at_s: float  # response headers (429 latency for rejects)
    finished_at_s: float  # last byte (or the error)
    playback: Playback
    text_chars: int = 0
    retry_after_s: float | None = None  # Retry-After of a 429
    http_status: int | None = None
    error: str | None = None
    waited_s: float = 0.0  # 429s and Retry-After waits before this (accepted) attempt
    # what the server says of the request in its Server-Timing header (Playhead: the wait
    # for a start slot, then its submit -> first audio); None when it does not say
    server_start_wait_s: float | None = None
    server_first_audio_s: float | None = None

    @property
    def ttfa_s(self) -> float | None:
        if self.playback.started_at_s is None:
            return None
        return self.playback.started_at_s - self.sent_at_s

    @property
    def rtf(self) -> float | None:
        if self.playback.audio_s <= 0.0:
            return None
        return (self.finished_at_s - self.sent_at_s) / self.playback.audio_s


def parse_server_timing(value: str | None) -> dict[str, float]:
    """A `Server-Timing` header's metrics with a duration, in seconds by name (`dur` is
    in ms); metrics without one, and malformed entries, are left out."""
    timings: dict[str, float] = {}
    for entry in (value or "").split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, raw = param.partition("=")
            if name and key.strip().lower() == "dur":
                try:
                    ms = float(raw.strip().strip('"'))
                except ValueError:
                    continue
                if math.isfinite(ms) and ms >= 0:
                    timings[name] = ms / 1000.0
    return timings


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def stall_ratio_bound(streams: float, capacity_audio_s_per_s: float) -> float:
    """No schedule beats max(0, N/C - 1) in the long run (N players at 1x, capacity C)."""
    if capacity_audio_s_per_s <= 0.0:
        return math.inf
    return max(0.0, streams / capacity_audio_s_per_s - 1.0)


@dataclass(frozen=True)
class Summary:
    """Every metric of docs/benchmarking.md over one run. Latency in ms; None when undefined."""

    streams_ok: int
    streams_failed: int
    rejected: int  # 429 answers (a retried stream can add several)
    audio_s: float  # audio of the finished streams
    wall_s: float
    ttfa_p50_ms: float | None
    ttfa_p95_ms: float | None
    ttfa_p99_ms: float | None
    ttfa_max_ms: float | None
    stall_ratio: float  # total stall / total audio, every stall counted
    stalls_per_stream: float  # stalls >= tolerance, mean over streams
    stalls_max: int
    interruptions: int  # stalls >= 150 ms, all streams
    interrupted_share: float  # streams with at least one interruption
    stall_free_share: float  # streams with no stall >= tolerance
    goodput_streams_per_s: float  # TTFA <= SLO and no interruption, per wall second
    xrt: float  # audio seconds received per wall second
    rtf_p50: float | None
    rtf_p95: float | None
    retry_after_s: tuple[float, ...] = field(default=())  # every Retry-After value seen
    reject_latency_p50_ms: float | None = None
    reject_latency_p99_ms: float | None = None
    reject_latency_max_ms: float | None = None
    wait_p50_ms: float | None = None  # admission waits of the finished streams
    wait_p99_ms: float | None = None
    # the server's own split of the finished streams' first audio (Server-Timing; None
    # when the server does not send it): the wait for a start slot, then submit -> audio
    server_start_wait_p99_ms: float | None = None
    server_first_audio_p99_ms: float | None = None
    # the finished streams' margins (the least audio left as a chunk arrived; negative: a
    # stall): the 1st and 5th percentile, ms
    margin_p1_ms: float | None = None
    margin_p5_ms: float | None = None
    in_flight_mean: float = 0.0  # measured requests open (sent -> last byte), time-averaged
    # players between first audio and the end of playback (stalls included), time-averaged:
    # with production xRT, stall_ratio = listening_mean / xRT - 1 when the server is saturated
    listening_mean: float = 0.0
    stall_tolerance_ms: float = STALL_TOLERANCE_S * 1000.0
    interruption_ms: float = INTERRUPTION_S * 1000.0
    slo_ms: float = DEFAULT_SLO_S * 1000.0

    def as_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["retry_after_s"] = list(self.retry_after_s)
        return out


def _listening_s(playback: Playback) -> float:
    if playback.started_at_s is None or playback.ended_at_s is None:
        return 0.0
    return playback.ended_at_s - playback.started_at_s


def listening_in_window(
    intervals: Iterable[tuple[float, float]], start_s: float, end_s: float
) -> float:
    """Total time of (started, ended) playback intervals that falls inside [start_s, end_s]."""
    return sum(max(0.0, min(b, end_s) - max(a, start_s)) for a, b in intervals)


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def summarize(
    records: Iterable[StreamRecord],
    *,
    wall_s: float,
    audio_received_s: float | None = None,
    listening_s: float | None = None,
    slo_s: float = DEFAULT_SLO_S,
    tolerance_s: float = STALL_TOLERANCE_S,
    interruption_s: float = INTERRUPTION_S,
) -> Summary:
    """Aggregate stream records. `audio_received_s` (for xRT) defaults to the finished
    streams' audio; pass the audio received inside the wall window when they differ.
    `listening_s` (player time between first audio and the end of playback, stalls
    included) likewise defaults to the records' own; pass every player's time inside the
    window when unmeasured streams played there too."""
    records = list(records)
    ok = [r for r in records if r.outcome is Outcome.OK]
    rejects = [r for r in records if r.outcome is Outcome.REJECTED]
    failed = sum(1 for r in records if r.outcome is Outcome.FAILED)
    audio_s = sum(r.playback.audio_s for r in ok)
    stall_s = sum(r.playback.stall_s for r in ok)
    ttfas = [t for r in ok if (t := r.ttfa_s) is not None]
    rtfs = [x for r in ok if (x := r.rtf) is not None]
    margins = [m for r in ok if (m := r.playback.margin_s) is not None]
    counts = [r.playback.stall_count(tolerance_s) for r in ok]
    interrupts = [r.playback.interruptions(interruption_s) for r in ok]
    good = sum(
        1
        for r, n in zip(ok, interrupts, strict=True)
        if n == 0 and r.ttfa_s is not None and r.ttfa_s <= slo_s
    )
    n_ok = len(ok)
    reject_lat = [r.answered_at_s - r.sent_at_s for r in rejects]
    received = audio_s if audio_received_s is None else audio_received_s
    return Summary(
        streams_ok=n_ok,
        streams_failed=failed,
        rejected=len(rejects),
        audio_s=audio_s,
        wall_s=wall_s,
        ttfa_p50_ms=_ms(percentile(ttfas, 50)),
        ttfa_p95_ms=_ms(percentile(ttfas, 95)),
        ttfa_p99_ms=_ms(percentile(ttfas, 99)),
        ttfa_max_ms=_ms(max(ttfas)) if ttfas else None,
        stall_ratio=stall_s / audio_s if audio_s > 0 else 0.0,
        stalls_per_stream=sum(counts) / n_ok if n_ok else 0.0,
        stalls_max=max(counts) if counts else 0,
        interruptions=sum(interrupts),
        interrupted_share=sum(1 for n in interrupts if n) / n_ok if n_ok else 0.0,
        stall_free_share=sum(1 for n in counts if n == 0) / n_ok if n_ok else 0.0,
        goodput_streams_per_s=good / wall_s if wall_s > 0 else 0.0,
        xrt=received / wall_s if wall_s > 0 else 0.0,
        rtf_p50=percentile(rtfs, 50),
        rtf_p95=percentile(rtfs, 95),
        retry_after_s=tuple(r.retry_after_s for r in rejects if r.retry_after_s is not None),
        reject_latency_p50_ms=_ms(percentile(reject_lat, 50)),
        reject_latency_p99_ms=_ms(percentile(reject_lat, 99)),
        reject_latency_max_ms=_ms(max(reject_lat)) if reject_lat else None,
        wait_p50_ms=_ms(percentile([r.waited_s for r in ok], 50)),
        wait_p99_ms=_ms(percentile([r.waited_s for r in ok], 99)),
        server_start_wait_p99_ms=_ms(
            percentile([w for r in ok if (w := r.server_start_wait_s) is not None], 99)
        ),
        server_first_audio_p99_ms=_ms(
            percentile([t for r in ok if (t := r.server_first_audio_s) is not None], 99)
        ),
        margin_p1_ms=_ms(percentile(margins, 1)),
        margin_p5_ms=_ms(percentile(margins, 5)),
        in_flight_mean=sum(r.finished_at_s - r.sent_at_s for r in ok) / wall_s
        if wall_s > 0
        else 0.0,
        listening_mean=(
            (listening_s if listening_s is not None else sum(_listening_s(r.playback) for r in ok))
            / wall_s
            if wall_s > 0
            else 0.0
        ),
        stall_tolerance_ms=tolerance_s * 1000.0,
        interruption_ms=interruption_s * 1000.0,
        slo_ms=slo_s * 1000.0,
    )
