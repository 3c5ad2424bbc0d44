"""A discrete-event simulation of Playhead's engine, driving the real scheduling/ code.

`make sim` (python -m benchmarks.simulate) answers capacity-planning questions the machine
here cannot: 10^3..10^5 streams, closed-loop or Poisson arrivals, several replicas behind a
router. Time is virtual; costs are the sim backend's (../shared/BENCH.md):

- talker: one call at a time per replica, a segment of F frames yields pieces of
  `talker_piece_frames` at `talker_frames_per_s` (F / rate seconds in all); the next call
  goes to the stream whose audio runs out first, skipping streams more than
  `high_water_s` ahead (pipeline/talker.py's `pick_stream`, mirrored);
- vocoder: each turn, the streams whose next chunk is ready (the real ChunkPlanner) go to
  the real PlaybackScheduler.select; the chosen chunks cost `base + per_frame * frames`
  (frames with context; base once per batched call) and are emitted when the turn ends;
- admission: the real Admission, fed the engine's capacity estimate
  (pipeline/capacity.py, audio per busy second of each stage) and the active streams'
  finish times.

Each stream is played by the same 1x player as the load generator's
(benchmarks/player.py) at its emission times, and reported through the same `summarize`.
Segments and frame counts come from the engine's own text splitter and the sim backend's
`frames_for_text`.

Routers: `random`; `least-loaded` (fewest active streams, known to the router at once);
`slack` (each replica reports, every `report_interval_s`, its streams' minimum and mean
slack = horizon - now, or the first-chunk deadline - now before first audio; infinite
when idle. The router draws two replicas at random and takes the one with the higher
minimum slack (a stream sent there since the report counts with its first-chunk
deadline), then the higher mean, then fewer streams: with stale reports, always taking
the best replica would herd a whole interval's arrivals onto it). A router
offers a request to the replicas in its order until one admits it. A rejected closed-loop
client retries after Retry-After; a rejected Poisson arrival is lost. A closed-loop
listener sends its next request when its player has played the last sample (as the load
generator's default).

The bound uses C = the replicas' vocoder throughput with full turns of K steady chunks
(K = 0: of one chunk per concurrent stream), from the cost model.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.loadgen import load_corpus
from benchmarks.player import (
    Outcome,
    Player,
    StreamRecord,
    Summary,
    listening_in_window,
    stall_ratio_bound,
    summarize,
)
from pipeline.backends.sim import frames_for_text
from pipeline.capacity import CapacityEstimate, pipeline_capacity
from pipeline.config import TalkerConfig
from pipeline.text import split_text
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    ChunkPlanner,
    PlaybackScheduler,
    SchedulingConfig,
)

ROUTERS = ("random", "least-loaded", "slack")
RESULTS_DIR = Path(__file__).with_name("results")

_ARRIVE, _TALK_DONE, _VOCODE_DONE, _VOCODER_WAKE, _TALKER_WAKE, _REPORT = range(6)


@dataclass(frozen=True)
class CostModel:
    """The sim backend's set costs (pipeline/config.py SimConfig, same meanings)."""

    sample_rate_hz: int = 24000
    samples_per_frame: int = 1920  # 80 ms frames
    talker_frames_per_s: float = 2500.0
    talker_piece_frames: int = 4
    vocoder_base_ms: float = 4.0
    vocoder_per_frame_ms: float = 1.21875
    batched: bool = True

    @property
    def frame_s(self) -> float:
        return self.samples_per_frame / self.sample_rate_hz

    def vocode_s(self, decoded_frames: int, items: int) -> float:
        calls = 1 if self.batched else items
        return (self.vocoder_base_ms * calls + self.vocoder_per_frame_ms * decoded_frames) / 1e3

    def capacity_audio_s_per_s(self, batch: int, chunking: ChunkingConfig) -> float:
        """Audio seconds per second of back-to-back turns of `batch` steady chunks."""
        new = chunking.chunk_frames
        decoded = new + chunking.left_context_frames + chunking.right_context_frames
        batch = max(1, batch)
        return batch * new * self.frame_s / self.vocode_s(batch * decoded, batch)


# A replica: K = 16 chunks of 640 ms per batched call of 4 + 128 * 1.22 = 160 ms, so C = 64
# streams; the base cost is small, so that a window costs little throughput and policies
# compare at equal capacity (unbounded batches: 65.6). The first chunk (320 ms) covers a
# full turn.
DEFAULT_COST = CostModel()
DEFAULT_CHUNKING = ChunkingConfig(chunk_frames=8, ramp=(4,))
DEFAULT_WINDOW = 16


@dataclass(frozen=True)
class Scenario:
    label: str
    streams: int  # measured requests
    clients: int = 0  # closed loop: concurrent clients over all replicas (0: Poisson)
    rate_per_s: float = 0.0  # Poisson arrivals per second (with clients = 0)
    replicas: int = 1
    router: str = "least-loaded"
    scheduling: SchedulingConfig = field(
        default_factory=lambda: SchedulingConfig(policy="edf", active_stream_window=DEFAULT_WINDOW)
    )
    chunking: ChunkingConfig = DEFAULT_CHUNKING
    admission: AdmissionConfig = field(default_factory=lambda: AdmissionConfig(enabled=False))
    cost: CostModel = DEFAULT_COST
    talker: TalkerConfig = field(default_factory=TalkerConfig)
    capacity_window_s: float = 5.0  # the engine's capacity estimate window
    warmup_s: float = 20.0  # requests before this (virtual) time are not measured
    report_interval_s: float = 0.5  # slack router: how often replicas report
    give_up_after_s: float = 60.0  # a closed-loop client rejected this long takes a new text
    after_playback: bool = True  # closed loop: next request when played (else at last byte)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if (self.clients > 0) == (self.rate_per_s > 0):
            raise ValueError("give clients (closed loop) or rate_per_s (Poisson), not both")
        if self.streams < 1 or self.replicas < 1:
            raise ValueError("streams and replicas must be >= 1")


@dataclass(frozen=True)
class _Text:
    chars: int
    segments: tuple[int, ...]  # frames per talker segment
    audio_s: float


def prepare_texts(texts: Sequence[str], talker: TalkerConfig, frame_s: float) -> list[_Text]:
    out = []
    for text in texts:
        segments = split_text(
            text,
            first_fragment_words=talker.first_fragment_words,
            max_segment_chars=talker.max_segment_chars,
        )
        frames = tuple(frames_for_text(s) for s in segments)
        out.append(_Text(len(text), frames, sum(frames) * frame_s))
    return out


def mean_audio_s(texts: Sequence[_Text]) -> float:
    return sum(t.audio_s for t in texts) / len(texts)


class _Stream:
    __slots__ = (
        "chunk",
        "client",
        "cur",
        "dirty",
        "emitted",
        "id",
        "measured",
        "order",
        "player",
        "produced",
        "sent_at",
        "started_talk",
        "talked",
        "text",
        "waited",
    )

    def __init__(
        self, sid: str, order: int, text: _Text, client: int, sent_at: float, waited: float
    ) -> None:
        self.id = sid
        self.order = order
        self.text = text
        self.client = client  # closed-loop client index; -1 for a Poisson arrival
        self.sent_at = sent_at
        self.waited = waited
        self.measured = False
        self.player = Player()
        self.talked = 0  # segments fully talked
        self.started_talk = 0  # segments given to the talker
        self.cur = 0  # the vocoder's segment
        self.produced = 0  # frames of fully talked segments
        self.emitted = 0
        self.chunk = None
        self.dirty = True


class _Replica:
    def __init__(self, index: int, sc: Scenario) -> None:
        self.index = index
        self.scheduler = PlaybackScheduler(sc.scheduling)
        self.planner = ChunkPlanner(sc.chunking)
        self.admission = Admission(sc.admission)
        self.vocoder_rate = CapacityEstimate(sc.capacity_window_s)
        self.talker_rate = CapacityEstimate(sc.capacity_window_s)
        self.active: dict[str, _Stream] = {}  # arrival order
        # when the players of streams with all audio sent run dry (min-heap): admission
        # counts them until then, as the engine does
        self.playing_until: list[float] = []
        self.text_waiting: dict[str, _Stream] = {}  # untalked segments, no talker call
        self.talking: _Stream | None = None
        self.talk_t0 = 0.0
        self.talk_total = 0
        self.vocoder_busy = False
        self.batch: list[tuple[_Stream, object]] = []
        self.turn_start = 0.0
        self.wake_at = math.inf
        self.talker_wake_at = math.inf
        self.slack_sum = 0.0
        self.slack_min = math.inf
        self.reported_n = 0
        self.routed_since = 0

    def capacity(self, now: float) -> float:
        return pipeline_capacity(self.vocoder_rate.value(now), self.talker_rate.value(now))

    def playing(self, now: float) -> int:
        """Streams with vocoder work left plus those still playing their last audio."""
        while self.playing_until and self.playing_until[0] <= now:
            heapq.heappop(self.playing_until)
        return len(self.active) + len(self.playing_until)

    def finish_times(self, now: float, frame_s: float) -> Iterator[float]:
        horizon = self.scheduler.horizon_s
        for s in self.active.values():
            h = horizon(s.id)
            start = now if h is None else max(h, now)
            yield start + s.text.audio_s - s.emitted * frame_s
        yield from self.playing_until


@dataclass(frozen=True)
class SimResult:
    scenario: Scenario
    summary: Summary
    capacity_audio_s_per_s: float  # C over all replicas (cost model)
    load_streams: float  # N (closed loop) or offered audio s per s (Poisson)
    virtual_s: float
    wall_s: float
    events: int
    records: tuple[StreamRecord, ...] = ()

    def row(self) -> dict[str, object]:
        s = self.summary
        sc = self.scenario
        return {
            "label": sc.label,
            "policy": sc.scheduling.policy,
            "window": sc.scheduling.active_stream_window,
            "admission": sc.admission.enabled,
            "arrival": "closed" if sc.clients else "poisson",
            "replicas": sc.replicas,
            "router": sc.router,
            "streams": self.load_streams,
            "requests": sc.streams,
            "capacity_audio_s_per_s": self.capacity_audio_s_per_s,
            "streams_per_capacity": self.load_streams / self.capacity_audio_s_per_s,
            "stall_ratio": s.stall_ratio,
            "stall_ratio_bound": stall_ratio_bound(self.load_streams, self.capacity_audio_s_per_s),
            "stall_free_share": s.stall_free_share,
            "listening_mean": s.listening_mean,
            "stall_ratio_bound_listening": stall_ratio_bound(
                s.listening_mean, self.capacity_audio_s_per_s
            ),
            "interruptions": s.interruptions,
            "stalls_per_stream": s.stalls_per_stream,
            "ttfa_p50_ms": s.ttfa_p50_ms,
            "ttfa_p95_ms": s.ttfa_p95_ms,
            "ttfa_p99_ms": s.ttfa_p99_ms,
            "rejected": s.rejected,
            "streams_ok": s.streams_ok,
            "xrt": s.xrt,
            "goodput_streams_per_s": s.goodput_streams_per_s,
            "rtf_p50": s.rtf_p50,
            "virtual_s": self.virtual_s,
            "sim_wall_s": self.wall_s,
            "events": self.events,
        }


class _Simulation:
    def __init__(self, sc: Scenario, texts: Sequence[str]) -> None:
        self.sc = sc
        self.cost = sc.cost
        self.frame_s = sc.cost.frame_s
        self.texts = prepare_texts(texts, sc.talker, self.frame_s)
        self.rng = random.Random(sc.seed)
        self.replicas = [_Replica(i, sc) for i in range(sc.replicas)]
        self.heap: list[tuple[float, int, int, object, object]] = []
        self.seq = 0
        self.order = 0
        self.period_s = 1.0 / sc.cost.talker_frames_per_s
        self.piece = sc.cost.talker_piece_frames
        self.high_water_s = sc.talker.high_water_s
        self.first_chunk_s = sc.scheduling.first_chunk_ms / 1000.0
        self.safety_margin_s = sc.scheduling.safety_margin_ms / 1000.0
        self.records: list[StreamRecord] = []
        self.measured_issued = 0
        self.measured_open = 0
        self.first_measured_s: float | None = None
        self.last_finished_s = 0.0
        self.turn_audio: list[tuple[float, float]] = []  # (time, audio) once measuring
        self.playbacks: list[tuple[float, float]] = []  # every player's (start, end)

    # Events.

    def push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def run(self) -> tuple[float, int]:
        sc = self.sc
        if sc.clients:
            for client in range(sc.clients):
                self.push(0.0, _ARRIVE, client, None)
        else:
            self.push(self.rng.expovariate(sc.rate_per_s), _ARRIVE, -1, None)
        if sc.router == "slack":
            self.push(0.0, _REPORT)
        events = 0
        heap = self.heap
        pop = heapq.heappop
        t = 0.0
        while heap:
            t, _, kind, a, b = pop(heap)
            events += 1
            if kind == _VOCODE_DONE:
                self.vocode_done(t, a)  # type: ignore[arg-type]
            elif kind == _VOCODER_WAKE:
                r: _Replica = a  # type: ignore[assignment]
                if t == r.wake_at:
                    r.wake_at = math.inf
                    self.vocoder_turn(t, r)
            elif kind == _TALK_DONE:
                self.talk_done(t, a)  # type: ignore[arg-type]
            elif kind == _ARRIVE:
                self.arrive(t, a, b)  # type: ignore[arg-type]
            elif kind == _TALKER_WAKE:
                r = a  # type: ignore[assignment]
                if t == r.talker_wake_at:
                    r.talker_wake_at = math.inf
                    self.talker_pick(t, r)
            elif kind == _REPORT:
                self.report(t)
            if self.measured_issued >= sc.streams and self.measured_open == 0:
                break
        return t, events

    # Arrivals, routing, admission.

    def measuring(self, t: float) -> bool:
        return t >= self.sc.warmup_s and self.measured_issued < self.sc.streams

    def arrive(self, t: float, client: int, retry: tuple[_Text, float] | None) -> None:
        """One request (a retry is a request of its own, measured when sent in the window;
        a rejected one does not use up `streams`)."""
        sc = self.sc
        if retry is None:
            text = self.rng.choice(self.texts)
            first_sent = t
            if client < 0:  # Poisson: schedule the next arrival
                self.push(t + self.rng.expovariate(sc.rate_per_s), _ARRIVE, -1, None)
        else:
            text, first_sent = retry
        measured = self.measuring(t)
        if measured and self.first_measured_s is None:
            self.first_measured_s = t
        retry_after: int | None = None
        for r in self.route(t):
            decision = r.admission.decide(
                t, r.playing(t), r.capacity(t), r.finish_times(t, self.frame_s)
            )
            if decision.accept:
                if measured:
                    self.measured_issued += 1
                    self.measured_open += 1
                self.start_stream(t, r, text, client, first_sent, measured)
                return
            ra = decision.retry_after_s or 1
            retry_after = ra if retry_after is None else min(retry_after, ra)
        if measured:
            self.records.append(
                StreamRecord(
                    outcome=Outcome.REJECTED,
                    sent_at_s=t,
                    answered_at_s=t,
                    finished_at_s=t,
                    playback=Player().result(),
                    text_chars=text.chars,
                    retry_after_s=float(retry_after or 1),
                    http_status=429,
                )
            )
        if client >= 0:  # closed loop: retry after Retry-After, or give up for a new text
            again = (text, first_sent) if t - first_sent < sc.give_up_after_s else None
            self.push(t + (retry_after or 1), _ARRIVE, client, again)

    def route(self, t: float) -> list[_Replica]:
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas
        router = self.sc.router
        if router == "random":
            return self.rng.sample(replicas, len(replicas))
        if router == "least-loaded":
            rnd = self.rng.random
            return sorted(replicas, key=lambda r: (len(r.active), rnd()))

        first_chunk_s = self.first_chunk_s

        def key(r: _Replica) -> tuple[float, float, int]:
            # A stream sent since the report has its first-chunk deadline as its slack.
            low = min(r.slack_min, first_chunk_s) if r.routed_since else r.slack_min
            mean = r.slack_sum / r.reported_n if r.reported_n else math.inf
            return (-low, -mean, r.reported_n + r.routed_since)

        # Two random choices, the better by reported slack: reports are stale between
        # intervals, and sending every arrival to the one best replica would herd them.
        order = self.rng.sample(replicas, len(replicas))
        if key(order[1]) < key(order[0]):
            order[0], order[1] = order[1], order[0]
        order[0].routed_since += 1
        return order

    def report(self, t: float) -> None:
        """Each replica's slack: horizon - now per stream; before its first audio, its
        first-chunk deadline - now. Minimum and mean (inf for an idle replica)."""
        first_chunk_s = self.first_chunk_s
        for r in self.replicas:
            horizon = r.scheduler.horizon_s
            total = 0.0
            low = math.inf
            for s in r.active.values():
                h = horizon(s.id)
                slack = (s.sent_at + first_chunk_s if h is None else h) - t
                total += slack
                low = min(low, slack)
            r.slack_sum = total
            r.slack_min = low
            r.reported_n = len(r.active)
            r.routed_since = 0
        self.push(t + self.sc.report_interval_s, _REPORT)

    def start_stream(
        self, t: float, r: _Replica, text: _Text, client: int, first_sent: float, measured: bool
    ) -> None:
        self.order += 1
        s = _Stream(f"s{self.order}", self.order, text, client, t, t - first_sent)
        s.measured = measured
        r.active[s.id] = s
        r.scheduler.admit(s.id, t)  # its first-audio deadline counts from arrival, as in the engine
        r.text_waiting[s.id] = s
        if r.talking is None:
            self.talker_pick(t, r)

    # The talker (pipeline/talker.py `pick_stream` and `_talk`).

    def talker_pick(self, t: float, r: _Replica) -> None:
        if r.talking is not None:
            return
        best: _Stream | None = None
        best_key: tuple[int, float, int] | None = None
        retry_in: float | None = None
        horizon = r.scheduler.horizon_s
        frame_s = self.frame_s
        for s in r.text_waiting.values():
            queued = s.produced - s.emitted
            h = horizon(s.id)
            if h is None and queued == 0:
                first_seen = r.scheduler.first_seen_s(s.id)
                key = (1, (t if first_seen is None else first_seen) + self.first_chunk_s, s.order)
            else:
                run_out = max(t if h is None else h, t) + queued * frame_s
                ahead = run_out - t
                if ahead > self.high_water_s:
                    wait = ahead - self.high_water_s
                    retry_in = wait if retry_in is None else min(retry_in, wait)
                    continue
                protected = h is not None and ahead <= self.safety_margin_s
                key = (0 if protected else 1, run_out, s.order)
            if best_key is None or key < best_key:
                best, best_key = s, key
        if best is None:
            if retry_in is not None and t + retry_in < r.talker_wake_at:
                r.talker_wake_at = t + retry_in
                self.push(r.talker_wake_at, _TALKER_WAKE, r)
            return
        index = best.started_talk
        best.started_talk += 1
        del r.text_waiting[best.id]  # listed again when its call ends, if text remains
        r.talking = best
        r.talk_t0 = t
        r.talk_total = best.text.segments[index]
        best.dirty = True
        self.push(t + r.talk_total * self.period_s, _TALK_DONE, r)
        if not r.vocoder_busy:
            self.ensure_wake(t, r)

    def talk_done(self, t: float, r: _Replica) -> None:
        s = r.talking
        assert s is not None
        r.talking = None
        s.talked += 1
        s.produced += r.talk_total
        s.dirty = True
        r.talker_rate.record(r.talk_t0, t, r.talk_total * self.frame_s)
        if s.started_talk < len(s.text.segments) and s.id in r.active:
            r.text_waiting[s.id] = s
        self.talker_pick(t, r)
        if not r.vocoder_busy:
            self.vocoder_turn(t, r)

    def talk_available(self, t: float, r: _Replica) -> int:
        pieces = math.floor((t - r.talk_t0) / (self.period_s * self.piece) + 1e-9)
        return min(r.talk_total, pieces * self.piece)

    def ensure_wake(self, t: float, r: _Replica) -> None:
        """The idle vocoder looks again when the talker's next piece lands."""
        if r.talking is None:
            return
        step = self.period_s * self.piece
        n = math.floor((t - r.talk_t0) / step + 1e-9) + 1
        at = r.talk_t0 + n * step
        if at >= r.talk_t0 + r.talk_total * self.period_s:
            return  # the talk's end comes first, and it runs a turn
        if at < r.wake_at:
            r.wake_at = at
            self.push(at, _VOCODER_WAKE, r)

    # The vocoder (pipeline/vocoder.py `_vocoder_loop`).

    def plan(self, t: float, r: _Replica, s: _Stream):  # type: ignore[no-untyped-def]
        segments = s.text.segments
        if s.cur < s.talked:
            available, done = segments[s.cur], True
        elif r.talking is s and s.started_talk - 1 == s.cur:
            available, done = self.talk_available(t, r), False
        else:
            return None
        stream_done = done and s.talked == len(segments) and s.cur == len(segments) - 1
        return r.planner.next_chunk(s.id, available, done, stream_done)

    def vocoder_turn(self, t: float, r: _Replica) -> None:
        if r.vocoder_busy:
            return
        talking = r.talking
        while True:
            ready: list[str] = []
            empties: list[_Stream] = []
            for s in r.active.values():
                if s.dirty or s is talking:
                    s.chunk = self.plan(t, r, s)
                    s.dirty = False
                chunk = s.chunk
                if chunk is None:
                    continue
                if chunk.stop == chunk.start:
                    empties.append(s)
                else:
                    ready.append(s.id)
            if not empties:
                break
            for s in empties:
                self.commit(t, r, s, s.chunk)
        selected = r.scheduler.select(t, ready) if ready else []
        if not selected:
            self.ensure_wake(t, r)
            return
        active = r.active
        batch = []
        decoded = 0
        for sid in selected:
            s = active[sid]
            chunk = s.chunk
            batch.append((s, chunk))
            decoded += chunk.context_stop - chunk.context_start
        r.vocoder_busy = True
        r.batch = batch
        r.turn_start = t
        self.push(t + self.cost.vocode_s(decoded, len(batch)), _VOCODE_DONE, r)

    def vocode_done(self, t: float, r: _Replica) -> None:
        r.vocoder_busy = False
        spf = self.cost.samples_per_frame
        rate = self.cost.sample_rate_hz
        frame_s = self.frame_s
        record = r.scheduler.record_audio
        audio = 0.0
        for s, chunk in r.batch:
            n = chunk.stop - chunk.start
            record(s.id, n * spf, rate, t)
            s.player.feed(t, n * frame_s)
            audio += n * frame_s
            self.commit(t, r, s, chunk)
        r.batch = []
        r.vocoder_rate.record(r.turn_start, t, audio)
        if self.first_measured_s is not None:
            self.turn_audio.append((t, audio))
        self.vocoder_turn(t, r)

    def commit(self, t: float, r: _Replica, s: _Stream, chunk) -> None:  # type: ignore[no-untyped-def]
        r.planner.commit(s.id, chunk)
        s.chunk = None
        s.dirty = True
        s.emitted += chunk.stop - chunk.start
        if chunk.segment_end:
            s.cur += 1
        if chunk.final:
            self.finish(t, r, s)

    def finish(self, t: float, r: _Replica, s: _Stream) -> None:
        horizon_s = r.scheduler.horizon_s(s.id)
        if horizon_s is not None and horizon_s > t:
            heapq.heappush(r.playing_until, horizon_s)
        del r.active[s.id]
        r.text_waiting.pop(s.id, None)
        r.scheduler.forget(s.id)
        r.planner.forget(s.id)
        player = s.player
        if self.first_measured_s is not None and player.started_at_s is not None:
            self.playbacks.append((player.started_at_s, player.dry_at_s))
        if s.measured:
            self.records.append(
                StreamRecord(
                    outcome=Outcome.OK,
                    sent_at_s=s.sent_at,
                    answered_at_s=s.sent_at,
                    finished_at_s=t,
                    playback=s.player.result(),
                    text_chars=s.text.chars,
                    waited_s=s.waited,
                )
            )
            self.measured_open -= 1
            self.last_finished_s = max(self.last_finished_s, t)
        if s.client >= 0:  # the listener's next request, once it heard this one
            at = max(t, player.dry_at_s or t) if self.sc.after_playback else t
            self.push(at, _ARRIVE, s.client, None)
        if r.talking is None:
            self.talker_pick(t, r)

    # Results.

    def result(self, virtual_s: float, events: int, wall_s: float) -> SimResult:
        sc = self.sc
        start = self.first_measured_s if self.first_measured_s is not None else 0.0
        end = max(self.last_finished_s, start + 1e-9)
        received = sum(a for at, a in self.turn_audio if start <= at <= end)
        playing = [
            (s.player.started_at_s, end)  # still playing (or stalled) when the run ended
            for r in self.replicas
            for s in r.active.values()
            if s.player.started_at_s is not None
        ]
        listening = listening_in_window([*self.playbacks, *playing], start, end)
        summary = summarize(
            self.records, wall_s=end - start, audio_received_s=received, listening_s=listening
        )
        window = sc.scheduling.active_stream_window
        per_replica_clients = max(1, math.ceil(sc.clients / sc.replicas)) if sc.clients else 0
        batch = window if window > 0 else (per_replica_clients or 10**6)
        capacity = sc.replicas * sc.cost.capacity_audio_s_per_s(batch, sc.chunking)
        load = float(sc.clients) if sc.clients else sc.rate_per_s * mean_audio_s(self.texts)
        return SimResult(
            sc, summary, capacity, load, virtual_s, wall_s, events, tuple(self.records)
        )


def simulate(scenario: Scenario, texts: Sequence[str] | None = None) -> SimResult:
    """Run one scenario; `texts` defaults to benchmarks/corpus.txt."""
    sim = _Simulation(scenario, texts if texts is not None else load_corpus())
    started = time.perf_counter()
    virtual_s, events = sim.run()
    return sim.result(virtual_s, events, time.perf_counter() - started)


def replica_capacity(
    window: int = DEFAULT_WINDOW,
    chunking: ChunkingConfig = DEFAULT_CHUNKING,
    cost: CostModel = DEFAULT_COST,
) -> float:
    return cost.capacity_audio_s_per_s(window, chunking)


POLICIES: dict[str, tuple[str, int, bool]] = {
    # label -> (policy, window (None-like 0 = no window), admission)
    "fifo K=0": ("fifo", 0, False),
    "fifo K": ("fifo", DEFAULT_WINDOW, False),
    "edf K": ("edf", DEFAULT_WINDOW, False),
    "edf K + admission": ("edf", DEFAULT_WINDOW, True),
}


def policy_scenario(name: str, window: int, **kw: object) -> Scenario:
    policy, k, admission = POLICIES[name]
    k = window if k else 0
    label = f"{policy} K={k}" + (" + admission" if admission else "")
    return Scenario(
        label=label,
        scheduling=SchedulingConfig(policy=policy, active_stream_window=k),
        admission=AdmissionConfig(enabled=admission),
        **kw,  # type: ignore[arg-type]
    )


def _corpus_mean_audio_s() -> float:
    """Mean audio of a corpus text with the default talker and cost model."""
    return mean_audio_s(prepare_texts(load_corpus(), TalkerConfig(), DEFAULT_COST.frame_s))


def default_plan(quick: bool = False, window: int = DEFAULT_WINDOW) -> list[Scenario]:
    """`make sim`: policies on one replica over N; routers on four; one 10^5-stream run."""
    c = replica_capacity(window)
    plan: list[Scenario] = []
    per_point = 400 if quick else 2000
    for factor in (0.5, 0.9, 1.0, 1.5, 2.0):
        clients = max(1, round(factor * c))
        for name in POLICIES:
            plan.append(policy_scenario(name, window, streams=per_point, clients=clients))
    replicas = 4
    rate = 0.95 * replicas * c / _corpus_mean_audio_s()
    for router in ROUTERS:
        plan.append(
            Scenario(
                label=f"edf K={window}, {replicas} replicas, {router}, Poisson 0.95 C",
                streams=2000 if quick else 10_000,
                rate_per_s=rate,
                replicas=replicas,
                router=router,
                scheduling=SchedulingConfig(policy="edf", active_stream_window=window),
            )
        )
    plan.append(
        Scenario(
            label=f"edf K={window} + admission, {replicas} replicas, slack, Poisson 1.2 C",
            streams=5000 if quick else 100_000,
            rate_per_s=rate / 0.95 * 1.2,
            replicas=replicas,
            router="slack",
            scheduling=SchedulingConfig(policy="edf", active_stream_window=window),
            admission=AdmissionConfig(enabled=True),
        )
    )
    return plan


def format_table(results: Sequence[SimResult]) -> str:
    """Markdown table of simulation runs, with its notes."""
    lines = [
        "| scenario | requests | N or load | N/C | stall ratio | bound | bound (L) "
        "| stall-free | interruptions | TTFA p50/p95/p99 ms | rejected | xRT | sim s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        row = res.row()
        ttfa = " / ".join(
            "–" if row[k] is None else f"{row[k]:.0f}"
            for k in ("ttfa_p50_ms", "ttfa_p95_ms", "ttfa_p99_ms")
        )
        lines.append(
            f"| {row['label']} | {row['requests']} | {row['streams']:.1f} "
            f"| {row['streams_per_capacity']:.2f} | {row['stall_ratio']:.3f} "
            f"| {row['stall_ratio_bound']:.3f} | {row['stall_ratio_bound_listening']:.3f} "
            f"| {100 * row['stall_free_share']:.1f}% "
            f"| {row['interruptions']} | {ttfa} | {row['rejected']} | {row['xrt']:.1f} "
            f"| {row['sim_wall_s']:.1f} |"
        )
    lines += [
        "",
        "N or load: concurrent clients (closed loop) or offered audio seconds per second "
        "(Poisson). Bound: max(0, N/C - 1). Bound (L): max(0, L/C - 1) with L the "
        "time-averaged number of players between first audio and end of playback (in a "
        "closed loop, time waiting for first audio is no stall, so L < N when streams wait). "
        "Stall-free ignores stalls under 10 ms. Sim s: wall seconds the simulation took.",
    ]
    return "\n".join(lines) + "\n"


def _scenario_json(sc: Scenario) -> dict[str, object]:
    data = asdict(sc)
    data["chunking"]["ramp"] = list(sc.chunking.ramp)
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.simulate",
        description="Discrete-event simulation of Playhead's scheduling at scale.",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller default plan")
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help=f"K (default {DEFAULT_WINDOW})"
    )
    parser.add_argument("--policy", choices=list(POLICIES), help="run one scenario of this policy")
    parser.add_argument("--streams", type=int, default=10_000, help="measured requests (one run)")
    parser.add_argument("--clients", type=float, help="closed loop: N as a multiple of C")
    parser.add_argument("--rate", type=float, help="Poisson: offered load as a multiple of C")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--router", choices=ROUTERS, default="least-loaded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/)")
    args = parser.parse_args(argv)

    if args.policy:
        c = args.replicas * replica_capacity(args.window)
        kw: dict[str, object] = {
            "streams": args.streams,
            "replicas": args.replicas,
            "router": args.router,
            "seed": args.seed,
        }
        if args.rate is not None:
            kw["rate_per_s"] = args.rate * c / _corpus_mean_audio_s()
        else:
            kw["clients"] = max(1, round((args.clients or 1.0) * c))
        plan = [policy_scenario(args.policy, args.window, **kw)]
    else:
        plan = [replace(sc, seed=args.seed) for sc in default_plan(args.quick, args.window)]

    results = []
    rows = []
    for sc in plan:
        res = simulate(sc)
        results.append(res)
        row = res.row()
        rows.append(row)
        print(
            f"{row['label']}: {row['requests']} requests, N/C {row['streams_per_capacity']:.2f}, "
            f"stall ratio {row['stall_ratio']:.3f} (bound {row['stall_ratio_bound']:.3f}), "
            f"stall-free {100 * row['stall_free_share']:.1f}%, TTFA p99 "
            f"{row['ttfa_p99_ms'] or 0:.0f} ms, rejected {row['rejected']}, "
            f"{res.events} events in {res.wall_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    table = format_table(results)
    print(table)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS_DIR / f"sim-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "date": stamp,
        "kind": "simulation",
        "runs": [
            {**row, "scenario": _scenario_json(res.scenario)}
            for row, res in zip(rows, results, strict=True)
        ],
    }
    out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    if args.out is None and not args.policy:  # the default plan: the copy the README shows
        (RESULTS_DIR / "sim-latest.json").write_text(out.read_text(encoding="utf-8"))
        (RESULTS_DIR / "sim-latest.md").write_text(table, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
