"""A discrete-event simulation of Playhead's engine at scale, in virtual time.

`make sim` (python -m benchmarks.simulate) answers capacity-planning questions the machine
here cannot: 10^3..10^5 streams, closed-loop or Poisson arrivals, several replicas behind a
router. Each replica (benchmarks/sim_replica.py) is the engine's own StreamBook and the
sim backend, with the engine's two stage loops as event handlers: every decision (talker
order, vocoder selection, chunk planning, admission, the ledger of players still playing)
is the engine's scheduling/ and pipeline/ code, and the costs are the sim backend's
(pipeline/config.py SimConfig, the only cost model):

- talker: each step runs up to `talker.batch` open segments chosen by the book's
  scheduling.TalkerQueue (the indexed plan_talker_step), as in the engine; each gets
  `talker_frames_per_step` frames; a step costs
  `talker_step_base_ms + talker_step_per_stream_ms * segments`;
- vocoder: each turn decodes the chunks PlaybackScheduler.select picks, for
  `vocoder_base_ms + vocoder_per_frame_ms * frames` (context included; base once per
  batched call), emitted when the turn ends; the two stages overlap;
- admission: scheduling.Admission, fed the engine's capacity estimate
  (pipeline/capacity.py) and the book's playing streams and finish times.

tests/test_engine_vs_simulator.py drives the real Engine (sim backend, virtual clock) and
a replica with the same arrivals and checks they make the same choices in the same order.

Each stream is played by the same 1x player as the load generator's (benchmarks/player.py)
at its emission times, and reported through the same `summarize`.

Routers: `random`; `least-loaded` (fewest streams with work left, known to the router at
once); `slack` (each replica reports, every `report_interval_s`, its streams' minimum and
mean slack = horizon - now, or the first-chunk deadline - now before first audio; infinite
when idle; the ranking is scheduling.rank_replicas, the Ray Serve router's own: two
replicas drawn at random, the one with the higher minimum slack first (a stream sent
there since the report counts with its first-chunk deadline), then the higher mean, then
fewer streams: with stale reports, always taking the best replica would herd a whole
interval's arrivals onto it). A router offers a
request to the replicas in its order until one admits it. A rejected closed-loop client
retries after Retry-After; a rejected Poisson arrival is lost. A closed-loop listener sends
its next request when its player has played the last sample (as the load generator's
default). Clients may hang up mid-stream (`hangup_share`): the replica cancels the stream,
which leaves the playing ledger at once.

The bound uses C = the replicas' vocoder throughput with full turns of K steady chunks
(K = 0: of one chunk per concurrent stream), from the sim backend's costs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
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
from benchmarks.sim_replica import EngineSetup, Replica, Trace
from pipeline.backends.sim import expected_frames, vocoder_cost_s
from pipeline.config import EngineConfig, SimConfig, TalkerConfig, TextConfig
from pipeline.stream import Stream
from scheduling import AdmissionConfig, ChunkingConfig, Decision, SchedulingConfig
from scheduling.routing import ReplicaLoad, rank_replicas

ROUTERS = ("random", "least-loaded", "slack")
# In virtual time the stages cost exactly what the capacity model reads: the whole reading
# may be committed (configs/sim.yaml does the same; the voice keeps a margin).
VIRTUAL_HEADROOM = 1.0
RESULTS_DIR = Path(__file__).with_name("results")

# A replica: K = 16 chunks of 640 ms per batched call of 4 + 128 * 1.22 = 160 ms, so C = 64
# streams; the base cost is small, so that a window costs little throughput and policies
# compare at equal capacity (unbounded batches: 65.6). The first chunk (320 ms) covers a
# full turn. The talker is configs/sim.yaml's: 16 segments a step, 8 frames each, for
# 1 + 0.2 ms per segment (never the bottleneck).
DEFAULT_SIM = SimConfig(
    talker_frames_per_step=8,
    talker_step_base_ms=1.0,
    talker_step_per_stream_ms=0.2,
    vocoder_base_ms=4.0,
    vocoder_per_frame_ms=1.21875,
)
# busy_max_queued_s 0: the simulated stages do not share cores, so no talker pacing
DEFAULT_TALKER = TalkerConfig(batch=16, busy_max_queued_s=0)
DEFAULT_TEXT = TextConfig(first_fragment_words=6, first_segment_chars=80)
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
    sim: SimConfig = DEFAULT_SIM
    talker: TalkerConfig = DEFAULT_TALKER
    text: TextConfig = DEFAULT_TEXT
    engine: EngineConfig = field(default_factory=EngineConfig)
    warmup_s: float = 20.0  # requests before this (virtual) time are not measured
    report_interval_s: float = 0.5  # slack router: how often replicas report
    give_up_after_s: float = 60.0  # a closed-loop client rejected this long takes a new text
    after_playback: bool = True  # closed loop: next request when played (else at last byte)
    hangup_share: float = 0.0  # share of accepted streams whose client leaves mid-stream
    seed: int = 0

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if (self.clients > 0) == (self.rate_per_s > 0):
            raise ValueError("give clients (closed loop) or rate_per_s (Poisson), not both")
        if self.streams < 1 or self.replicas < 1:
            raise ValueError("streams and replicas must be >= 1")
        if not 0.0 <= self.hangup_share <= 1.0:
            raise ValueError(f"hangup_share must be in [0, 1], got {self.hangup_share!r}")

    @property
    def setup(self) -> EngineSetup:
        return EngineSetup(
            scheduling=self.scheduling,
            chunking=self.chunking,
            admission=self.admission,
            talker=self.talker,
            sim=self.sim,
            engine=self.engine,
            text=self.text,
        )


@dataclass(frozen=True)
class _Text:
    text: str
    chars: int
    audio_s: float  # what the sim backend makes of it


def prepare_texts(texts: Sequence[str], options: TextConfig, sim: SimConfig) -> list[_Text]:
    frame_s = sim.samples_per_frame / sim.sample_rate_hz
    return [_Text(t, len(t), expected_frames(t, options=options) * frame_s) for t in texts]


def mean_audio_s(texts: Sequence[_Text]) -> float:
    return sum(t.audio_s for t in texts) / len(texts)


class _Listener:
    """One accepted request, as its client sees it."""

    __slots__ = ("client", "hangup_at_s", "measured", "player", "replica", "sent_at", "text")
    __slots__ += ("waited",)

    def __init__(
        self,
        replica: Replica,
        text: _Text,
        client: int,
        sent_at: float,
        waited: float,
        measured: bool,
    ) -> None:
        self.replica = replica
        self.text = text
        self.client = client  # closed-loop client index; -1 for a Poisson arrival
        self.sent_at = sent_at
        self.waited = waited
        self.measured = measured
        self.player = Player()
        self.hangup_at_s: float | None = None  # this far into playback the client leaves


class _ReplicaState:
    """What the slack router last heard from a replica."""

    __slots__ = ("reported_n", "routed_since", "slack_min", "slack_sum")

    def __init__(self) -> None:
        self.slack_sum = 0.0
        self.slack_min = math.inf
        self.reported_n = 0
        self.routed_since = 0


@dataclass(frozen=True)
class SimResult:
    scenario: Scenario
    summary: Summary
    capacity_audio_s_per_s: float  # C over all replicas (cost model)
    load_streams: float  # N (closed loop) or offered audio s per s (Poisson)
    virtual_s: float
    wall_s: float
    events: int
    hangups: int = 0  # measured streams whose client left mid-stream
    talker_steps: int = 0
    vocoder_turns: int = 0
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
            "hangups": self.hangups,
            "xrt": s.xrt,
            "goodput_streams_per_s": s.goodput_streams_per_s,
            "rtf_p50": s.rtf_p50,
            "virtual_s": self.virtual_s,
            "sim_wall_s": self.wall_s,
            "events": self.events,
            "talker_steps": self.talker_steps,
            "vocoder_turns": self.vocoder_turns,
        }


Handler = Callable[[float, object], None]


class _Simulation:
    def __init__(self, sc: Scenario, texts: Sequence[str]) -> None:
        self.sc = sc
        self.texts = prepare_texts(texts, sc.text, sc.sim)
        self.rng = random.Random(sc.seed)
        self.now = 0.0
        self.heap: list[tuple[float, int, Handler, object]] = []
        self.seq = 0
        self.replicas = [Replica(i, sc.setup, self, self) for i in range(sc.replicas)]
        self.reports = [_ReplicaState() for _ in self.replicas]
        self.first_chunk_s = sc.scheduling.first_chunk_ms / 1000.0
        self.listeners: dict[str, _Listener] = {}
        self.records: list[StreamRecord] = []
        self.measured_issued = 0
        self.measured_open = 0
        self.hangups = 0
        self.first_measured_s: float | None = None
        self.last_finished_s = 0.0
        self.received_s = 0.0  # audio emitted once measuring
        self.playbacks: list[tuple[float, float]] = []  # every player's (start, end)

    # The event queue (benchmarks/sim_replica.EventQueue).

    def push(self, at_s: float, handler: Handler, arg: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at_s, self.seq, handler, arg))

    def run(self) -> tuple[float, int]:
        sc = self.sc
        if sc.clients:
            for client in range(sc.clients):
                self.push(0.0, self.arrive, (client, None))
        else:
            self.push(self.rng.expovariate(sc.rate_per_s), self.arrive, (-1, None))
        if sc.router == "slack":
            self.push(0.0, self.report)
        events = 0
        heap = self.heap
        pop = heapq.heappop
        while heap:
            t, _, handler, arg = pop(heap)
            self.now = t
            handler(t, arg)
            events += 1
            if self.measured_issued >= sc.streams and self.measured_open == 0:
                break
        return self.now, events

    # The replicas' listener (benchmarks/sim_replica.Listener).

    def audio(self, stream_id: str, at_s: float, audio_s: float) -> None:
        listener = self.listeners[stream_id]
        player = listener.player
        first = player.started_at_s is None
        player.feed(at_s, audio_s)
        if self.first_measured_s is not None:
            self.received_s += audio_s
        if first and listener.hangup_at_s is not None:
            self.push(at_s + listener.hangup_at_s, self.hang_up, stream_id)

    def done(self, stream_id: str, at_s: float) -> None:
        listener = self.listeners.pop(stream_id)
        player = listener.player
        if self.first_measured_s is not None and player.started_at_s is not None:
            self.playbacks.append((player.started_at_s, player.dry_at_s or at_s))
        if listener.measured:
            self.records.append(
                StreamRecord(
                    outcome=Outcome.OK,
                    sent_at_s=listener.sent_at,
                    answered_at_s=listener.sent_at,
                    finished_at_s=at_s,
                    playback=player.result(),
                    text_chars=listener.text.chars,
                    waited_s=listener.waited,
                )
            )
            self.measured_open -= 1
            self.last_finished_s = max(self.last_finished_s, at_s)
        if listener.client >= 0:  # the listener's next request, once it heard this one
            dry = player.dry_at_s or at_s
            self.push(
                max(at_s, dry) if self.sc.after_playback else at_s,
                self.arrive,
                (listener.client, None),
            )

    def hang_up(self, t: float, arg: object) -> None:
        """The client leaves mid-stream (only while the body is still coming)."""
        stream_id: str = arg  # type: ignore[assignment]
        listener = self.listeners.pop(stream_id, None)
        if listener is None:
            return  # its audio was all sent: the server never hears of it
        listener.replica.cancel(stream_id)
        player = listener.player
        if self.first_measured_s is not None and player.started_at_s is not None:
            self.playbacks.append((player.started_at_s, min(t, player.dry_at_s or t)))
        if listener.measured:
            self.hangups += 1
            self.measured_open -= 1
            self.last_finished_s = max(self.last_finished_s, t)
        if listener.client >= 0:  # a voice agent's next request, at once
            self.push(t, self.arrive, (listener.client, None))

    # Arrivals, routing, admission.

    def measuring(self, t: float) -> bool:
        return t >= self.sc.warmup_s and self.measured_issued < self.sc.streams

    def arrive(self, t: float, arg: object) -> None:
        """One request (a retry is a request of its own, measured when sent in the window;
        a rejected one does not use up `streams`)."""
        client, retry = arg  # type: ignore[misc]
        sc = self.sc
        if retry is None:
            text = self.rng.choice(self.texts)
            first_sent = t
            if client < 0:  # Poisson: schedule the next arrival
                self.push(t + self.rng.expovariate(sc.rate_per_s), self.arrive, (-1, None))
        else:
            text, first_sent = retry
        measured = self.measuring(t)
        if measured and self.first_measured_s is None:
            self.first_measured_s = t
        retry_after: int | None = None
        for r in self.route(t):
            told = partial(self.decided, r, text, client, t, first_sent, measured)
            outcome = r.submit(t, text.text, told)
            if isinstance(outcome, Stream):
                self.admitted(outcome, r, text, client, t, first_sent, measured)
                return
            if outcome.queued:  # the replica tells `decided` later
                return
            ra = outcome.retry_after_s or 1
            retry_after = ra if retry_after is None else min(retry_after, ra)
        self.refused(t, t, text, client, first_sent, measured, retry_after or 1)

    def admitted(
        self,
        stream: Stream,
        r: Replica,
        text: _Text,
        client: int,
        sent_s: float,
        first_sent: float,
        measured: bool,
    ) -> None:
        if measured:
            self.measured_issued += 1
            self.measured_open += 1
        listener = _Listener(r, text, client, sent_s, sent_s - first_sent, measured)
        if self.sc.hangup_share and self.rng.random() < self.sc.hangup_share:
            listener.hangup_at_s = self.rng.uniform(0.0, text.audio_s)
        self.listeners[stream.id] = listener

    def decided(
        self,
        r: Replica,
        text: _Text,
        client: int,
        sent_s: float,
        first_sent: float,
        measured: bool,
        outcome: Stream | Decision,
    ) -> None:
        """A queued request granted (its wait counts in its TTFA) or refused."""
        if isinstance(outcome, Stream):
            self.admitted(outcome, r, text, client, sent_s, first_sent, measured)
        else:
            t = self.now
            self.refused(sent_s, t, text, client, first_sent, measured, outcome.retry_after_s or 1)

    def refused(
        self,
        sent_s: float,
        t: float,
        text: _Text,
        client: int,
        first_sent: float,
        measured: bool,
        retry_after: int,
    ) -> None:
        if measured:
            self.records.append(
                StreamRecord(
                    outcome=Outcome.REJECTED,
                    sent_at_s=sent_s,
                    answered_at_s=t,
                    finished_at_s=t,
                    playback=Player().result(),
                    text_chars=text.chars,
                    retry_after_s=float(retry_after),
                    http_status=429,
                )
            )
        if client >= 0:  # closed loop: retry after Retry-After, or give up for a new text
            again = (text, first_sent) if t - first_sent < self.sc.give_up_after_s else None
            self.push(t + retry_after, self.arrive, (client, again))

    def route(self, t: float) -> list[Replica]:
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas
        router = self.sc.router
        if router == "random":
            return self.rng.sample(replicas, len(replicas))
        if router == "least-loaded":
            rnd = self.rng.random
            return sorted(replicas, key=lambda r: (len(r.book), rnd()))
        # The slack router: scheduling.rank_replicas, the function the Ray Serve router
        # calls. The replicas' admission decides when offered (free streams unbounded here).
        loads = [
            ReplicaLoad(
                free_streams=math.inf,
                slack_min_s=rep.slack_min,
                slack_mean_s=rep.slack_sum / rep.reported_n if rep.reported_n else math.inf,
                streams=rep.reported_n,
                routed_since=rep.routed_since,
            )
            for rep in self.reports
        ]
        order = [replicas[i] for i in rank_replicas(loads, self.rng, self.first_chunk_s)]
        self.reports[order[0].index].routed_since += 1
        return order

    def report(self, t: float, _: object = None) -> None:
        """Each replica's slack: horizon - now per stream; before its first audio, its
        first-chunk deadline - now. Minimum and mean (inf for an idle replica)."""
        first_chunk_s = self.first_chunk_s
        for r, rep in zip(self.replicas, self.reports, strict=True):
            state = r.book.scheduler.state
            total = 0.0
            low = math.inf
            for stream_id in r.live:
                st = state(stream_id)
                if st is None:
                    continue
                h = st.horizon_s
                slack = (st.first_seen_s + first_chunk_s if h is None else h) - t
                total += slack
                low = min(low, slack)
            rep.slack_sum = total
            rep.slack_min = low
            rep.reported_n = len(r.live)
            rep.routed_since = 0
        self.push(t + self.sc.report_interval_s, self.report)

    # Results.

    def result(self, virtual_s: float, events: int, wall_s: float) -> SimResult:
        sc = self.sc
        start = self.first_measured_s if self.first_measured_s is not None else 0.0
        end = max(self.last_finished_s, start + 1e-9)
        playing = [
            (listener.player.started_at_s, end)  # still playing (or stalled) when the run ended
            for listener in self.listeners.values()
            if listener.player.started_at_s is not None
        ]
        listening = listening_in_window([*self.playbacks, *playing], start, end)
        summary = summarize(
            self.records,
            wall_s=end - start,
            audio_received_s=self.received_s,
            listening_s=listening,
        )
        window = sc.scheduling.active_stream_window
        per_replica_clients = max(1, math.ceil(sc.clients / sc.replicas)) if sc.clients else 0
        batch = window if window > 0 else (per_replica_clients or 10**6)
        capacity = sc.replicas * replica_capacity(batch, sc.chunking, sc.sim)
        load = float(sc.clients) if sc.clients else sc.rate_per_s * mean_audio_s(self.texts)
        return SimResult(
            sc,
            summary,
            capacity,
            load,
            virtual_s,
            wall_s,
            events,
            hangups=self.hangups,
            talker_steps=sum(r.talker_steps for r in self.replicas),
            vocoder_turns=sum(r.vocoder_turns for r in self.replicas),
            records=tuple(self.records),
        )


def simulate(scenario: Scenario, texts: Sequence[str] | None = None) -> SimResult:
    """Run one scenario; `texts` defaults to benchmarks/corpus.txt."""
    sim = _Simulation(scenario, texts if texts is not None else load_corpus())
    started = time.perf_counter()
    virtual_s, events = sim.run()
    return sim.result(virtual_s, events, time.perf_counter() - started)


@dataclass(frozen=True)
class Arrival:
    """A scripted request: its text arrives at `at_s`; its client leaves at `cancel_at_s`."""

    at_s: float
    text: str
    cancel_at_s: float | None = None


@dataclass
class ScriptRun:
    """One replica's decisions over a script, and which stream each arrival became."""

    trace: Trace
    stream_ids: list[str | None]  # per arrival; None when rejected
    virtual_s: float
    replica: Replica | None = None  # the replica, as the run left it


class _ScriptQueue:
    """A bare event queue for `run_script`: no routers, no players."""

    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list[tuple[float, int, Handler, object]] = []
        self.seq = 0

    def push(self, at_s: float, handler: Handler, arg: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at_s, self.seq, handler, arg))

    def audio(self, stream_id: str, at_s: float, audio_s: float) -> None:
        pass

    def done(self, stream_id: str, at_s: float) -> None:
        pass


def run_script(setup: EngineSetup, arrivals: Sequence[Arrival]) -> ScriptRun:
    """One replica, the given arrivals (and cancels), to the end of every stream."""
    queue = _ScriptQueue()
    trace = Trace()
    replica = Replica(0, setup, queue, queue, trace)
    run = ScriptRun(trace, [None] * len(arrivals), 0.0)

    def arrive(t: float, arg: object) -> None:
        index: int = arg  # type: ignore[assignment]
        outcome = replica.submit(t, arrivals[index].text)
        if isinstance(outcome, Stream):
            run.stream_ids[index] = outcome.id

    def cancel(t: float, arg: object) -> None:
        stream_id = run.stream_ids[arg]  # type: ignore[index]
        if stream_id is not None:
            replica.cancel(stream_id)

    for index, arrival in enumerate(arrivals):
        queue.push(arrival.at_s, arrive, index)
        if arrival.cancel_at_s is not None:
            queue.push(arrival.cancel_at_s, cancel, index)
    while queue.heap:
        t, _, handler, arg = heapq.heappop(queue.heap)
        queue.now = t
        handler(t, arg)
    run.virtual_s = queue.now
    run.replica = replica
    return run


def _simulate_quietly(scenario: Scenario) -> SimResult:
    """A worker's run: the per-stream records stay behind (the rows do not need them)."""
    return replace(simulate(scenario), records=())


def _progress(res: SimResult) -> None:
    row = res.row()
    print(
        f"{row['label']}: {row['requests']} requests, N/C {row['streams_per_capacity']:.2f}, "
        f"stall ratio {row['stall_ratio']:.3f} (bound {row['stall_ratio_bound']:.3f}), "
        f"stall-free {100 * row['stall_free_share']:.1f}%, TTFA p99 "
        f"{row['ttfa_p99_ms'] or 0:.0f} ms, rejected {row['rejected']}, "
        f"{res.events} events in {res.wall_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def run_plan(plan: Sequence[Scenario], jobs: int = 1) -> list[SimResult]:
    """Every scenario of `plan`, in its order; `jobs` > 1 runs them in worker processes
    (largest first). Each run is seeded: the figures do not depend on `jobs`."""
    if jobs <= 1 or len(plan) <= 1:
        results = []
        for sc in plan:
            results.append(simulate(sc))
            _progress(results[-1])
        return results
    done: dict[int, SimResult] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        largest_first = sorted(range(len(plan)), key=lambda i: -plan[i].streams)
        futures = {pool.submit(_simulate_quietly, plan[i]): i for i in largest_first}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            _progress(done[futures[future]])
    return [done[i] for i in range(len(plan))]


def replica_capacity(
    window: int = DEFAULT_WINDOW,
    chunking: ChunkingConfig = DEFAULT_CHUNKING,
    sim: SimConfig = DEFAULT_SIM,
) -> float:
    """Audio seconds per second of back-to-back vocoder turns of `window` steady chunks."""
    new = chunking.chunk_frames
    decoded = new + chunking.left_context_frames + chunking.right_context_frames
    batch = max(1, window)
    frame_s = sim.samples_per_frame / sim.sample_rate_hz
    return batch * new * frame_s / vocoder_cost_s(sim, batch * decoded, batch)


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
        admission=AdmissionConfig(enabled=admission, capacity_headroom=VIRTUAL_HEADROOM),
        **kw,  # type: ignore[arg-type]
    )


def _corpus_mean_audio_s() -> float:
    """Mean audio of a corpus text with the default text options and costs."""
    return mean_audio_s(prepare_texts(load_corpus(), DEFAULT_TEXT, DEFAULT_SIM))


def default_plan(quick: bool = False, window: int = DEFAULT_WINDOW) -> list[Scenario]:
    """`make sim`: policies on one replica over N; routers on four; one 10^5-stream run."""
    c = replica_capacity(window)
    plan: list[Scenario] = []
    per_point = 400 if quick else 2000
    for factor in (0.5, 0.9, 1.0, 1.5, 2.0):
        clients = max(1, round(factor * c))
        for name in POLICIES:
            plan.append(policy_scenario(name, window, streams=per_point, clients=clients))
    plan.append(
        replace(
            policy_scenario(
                "edf K + admission",
                window,
                streams=per_point,
                clients=round(1.5 * c),
                hangup_share=0.3,
            ),
            label=f"edf K={window} + admission, 30% hang up mid-stream",
        )
    )
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
            admission=AdmissionConfig(enabled=True, capacity_headroom=VIRTUAL_HEADROOM),
        )
    )
    return plan


def format_table(results: Sequence[SimResult]) -> str:
    """Markdown table of simulation runs, with its notes."""
    lines = [
        "| scenario | requests | N or load | N/C | stall ratio | bound | bound (L) "
        "| stall-free | interruptions | TTFA p50/p95/p99 ms | rejected | hung up | xRT | sim s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
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
            f"| {row['interruptions']} | {ttfa} | {row['rejected']} | {row['hangups']} "
            f"| {row['xrt']:.1f} "
            f"| {row['sim_wall_s']:.1f} |"
        )
    lines += [
        "",
        "N or load: concurrent clients (closed loop) or offered audio seconds per second "
        "(Poisson). Bound: max(0, N/C - 1). Bound (L): max(0, L/C - 1) with L the "
        "time-averaged number of players between first audio and end of playback (in a "
        "closed loop, time waiting for first audio is no stall, so L < N when streams wait). "
        "Stall-free ignores stalls under 10 ms. Hung up: measured streams whose client left "
        "mid-stream (not counted as served). Sim s: wall seconds the simulation took.",
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
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="scenarios run in parallel processes (results do not depend on it)",
    )
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

    results = run_plan(plan, args.jobs)
    rows = [res.row() for res in results]
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
