"""The simulation itself (benchmarks/simulate.py says what it models): clients, routers and
replicas (benchmarks/sim_replica.py) as handlers of one event queue in virtual time,
`simulate(scenario)`; and `run_script`, one replica on scripted arrivals and cancels, whose
decisions tests/test_engine_vs_simulator.py compares with the engine's."""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from benchmarks.loadgen import load_corpus
from benchmarks.player import (
    Outcome,
    Player,
    StreamRecord,
    listening_in_window,
    summarize,
)
from benchmarks.sim_replica import EngineSetup, Replica, Trace
from benchmarks.sim_scenario import (
    Scenario,
    SimResult,
    SimText,
    mean_audio_s,
    prepare_texts,
    replica_capacity,
)
from pipeline.stream import Stream
from scheduling import Decision
from scheduling.routing import ReplicaLoad, rank_replicas


class _Listener:
    """One accepted request, as its client sees it."""

    __slots__ = ("client", "hangup_at_s", "measured", "player", "replica", "sent_at", "text")
    __slots__ += ("waited",)

    def __init__(
        self,
        replica: Replica,
        text: SimText,
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
        text: SimText,
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
        text: SimText,
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
        text: SimText,
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
