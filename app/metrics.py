"""Prometheus metrics of one app, in the app's own registry (two apps in one process, as in
tests, never share a counter).

`Metrics` implements pipeline's EngineEvents: the engine calls it as things happen, from
its loops. Gauges of the engine's current state (active and parked streams, capacity) are
read from `engine.stats()` at scrape time, so /metrics shows the engine's truth.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
)
_REJECTION_BUCKETS_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
_TURN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_GC_PAUSE_BUCKETS_S = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)

if TYPE_CHECKING:
    from pipeline import EngineStats, StreamState, StreamStats, TurnTiming

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """EngineEvents -> prometheus-client, plus the scrape-time engine gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active_streams = Gauge(
            "playhead_active_streams", "Streams with talker or vocoder work left", registry=r
        )
        self.parked_streams = Gauge(
            "playhead_parked_streams",
            "Streams not scheduled because their client has not read its audio",
            registry=r,
        )
        self.draining_streams = Gauge(
            "playhead_draining_streams",
            "Streams whose audio is all produced while their client still reads it",
            registry=r,
        )
        self.ready = Gauge(
            "playhead_ready", "1 when the model is loaded and the loops run", registry=r
        )
        self.ttfa_s = Histogram(
            "playhead_ttfa_seconds",
            "Time from submit to the first vocoded audio of a stream",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.start_wait_s = Histogram(
            "playhead_start_wait_seconds",
            "Time a request waited in admission's queue (at most admission.queue_max_wait_s; "
            "0 when admitted at once): the client's first audio comes this long plus "
            "playhead_ttfa_seconds after its request",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.stalls = Counter(
            "playhead_stalls", "Server-estimated stalls (a player would have run dry)", registry=r
        )
        self.stall_s = Counter(
            "playhead_stall_seconds", "Server-estimated stall time, summed over streams", registry=r
        )
        self.vocoder_batch_size = Histogram(
            "playhead_vocoder_batch_size",
            "Streams decoded in one vocoder turn",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.vocoder_turn_s = Histogram(
            "playhead_vocoder_turn_seconds",
            "Wall time of one vocoder turn",
            buckets=_TURN_BUCKETS_S,
            registry=r,
        )
        self.talker_call_s = Histogram(
            "playhead_talker_call_seconds",
            "Wall time of one talker call",
            buckets=_TURN_BUCKETS_S,
            registry=r,
        )
        self.protocol_streams = Counter(
            "playhead_protocol_streams",
            "Speech requests of the client protocols besides OpenAI's, by protocol "
            "(elevenlabs...) and outcome (admitted, rejected)",
            ["protocol", "outcome"],
            registry=r,
        )
        self.admission_rejections = Counter(
            "playhead_admission_rejections",
            "Requests rejected by admission control (429)",
            ["reason"],
            registry=r,
        )
        self.rejection_s = Histogram(
            "playhead_rejection_seconds",
            "Time from admission's check to its 429 sent (app/admission_gate.py, else the route)",
            buckets=_REJECTION_BUCKETS_S,
            registry=r,
        )
        self.capacity_gauge = Gauge(
            "playhead_capacity_audio_seconds_per_second",
            "Estimated audio seconds the pipeline produces per wall second",
            registry=r,
        )
        self.stage_capacity_gauge = Gauge(
            "playhead_stage_capacity_audio_seconds_per_second",
            "Each stage's estimate (talker, vocoder); the pipeline's is the smaller",
            ["stage"],
            registry=r,
        )
        self.streams = Counter(
            "playhead_streams", "Finished streams by final state", ["state"], registry=r
        )
        self.audio_s = Counter(
            "playhead_audio_seconds", "Audio seconds emitted by finished streams", registry=r
        )
        self.started = Counter(
            "playhead_streams_started", "Streams submitted and admitted", registry=r
        )
        self.stage_timeouts = Counter(
            "playhead_stage_timeouts",
            "Model calls that hung past engine.call_timeout_s (their streams failed)",
            ["stage"],
            registry=r,
        )
        self.gc_pause_s = Histogram(
            "playhead_gc_pause_seconds",
            "Garbage collections while the app runs, by generation (2: full); the thread "
            "that triggers one, often the event loop's, waits for it",
            ["generation"],
            buckets=_GC_PAUSE_BUCKETS_S,
            registry=r,
        )
        # one child per generation, made here: the callback must not call `labels()`, which
        # holds the histogram's lock while it allocates, and a collection triggered in
        # there (or in a scrape, which holds it too) would run the callback into the same
        # lock on the same thread
        self._gc_pauses = tuple(self.gc_pause_s.labels(generation=str(g)) for g in range(3))
        self._gc_started_s: float | None = None

    # the garbage collector ------------------------------------------------------------

    def watch_gc(self) -> None:
        """Time every garbage collection from now on (until `unwatch_gc`)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # a collection runs with the GIL held, in whichever thread triggered it: start and
        # stop come in pairs, never interleaved
        if phase == "start":
            self._gc_started_s = time.perf_counter()
        elif self._gc_started_s is not None:
            pause_s = time.perf_counter() - self._gc_started_s
            self._gc_started_s = None
            self._gc_pauses[info["generation"]].observe(pause_s)

    # EngineEvents ---------------------------------------------------------------------

    def stream_started(self, stream_id: str) -> None:
        self.started.inc()

    def first_audio(self, stream_id: str, ttfa_s: float) -> None:
        self.ttfa_s.observe(ttfa_s)

    def stall(self, stream_id: str, stall_s: float) -> None:
        self.stalls.inc()
        self.stall_s.inc(max(0.0, stall_s))

    def vocoder_turn(self, batch_size: int, turn_s: float) -> None:
        self.vocoder_batch_size.observe(batch_size)
        self.vocoder_turn_s.observe(turn_s)

    def talker_call(self, seconds: float) -> None:
        self.talker_call_s.observe(seconds)

    def stage_timeout(self, stage: str) -> None:
        self.stage_timeouts.labels(stage=stage).inc()

    def talker_step(self, stream_ids: Sequence[str]) -> None:
        """A no-op: talker_call's histogram covers the steps; the ids are for traces."""

    def vocoder_selection(self, stream_ids: Sequence[str]) -> None:
        """A no-op: vocoder_turn's histograms cover the turns; the ids are for traces."""

    def rejected(self, reason: str) -> None:
        self.admission_rejections.labels(reason=reason or "unknown").inc()

    def start_waited(self, seconds: float) -> None:
        self.start_wait_s.observe(max(0.0, seconds))

    def stream_finished(self, stats: StreamStats, state: StreamState) -> None:
        self.streams.labels(state=state.value).inc()
        self.audio_s.inc(max(0.0, stats.audio_s))

    def capacity(self, audio_s_per_s: float) -> None:
        """A no-op: the capacity gauge is read from `engine.stats()` at scrape time (in
        `render`), not set on every vocoder turn."""

    # scrape ---------------------------------------------------------------------------

    def turn_timing(self, timing: TurnTiming) -> None:
        """Per-turn timings are for benchmarks; the histograms above cover operators."""

    def render(self, engine_stats: EngineStats | None) -> bytes:
        """The Prometheus text, after reading the engine's current gauges (None: not ready)."""
        if engine_stats is None:
            self.ready.set(0)
            self.active_streams.set(0)
            self.parked_streams.set(0)
            self.draining_streams.set(0)
        else:
            self.ready.set(1)
            self.active_streams.set(engine_stats.active_streams)
            self.parked_streams.set(engine_stats.parked_streams)
            self.draining_streams.set(engine_stats.draining_streams)
            self.capacity_gauge.set(engine_stats.capacity_audio_s_per_s)
            stage = self.stage_capacity_gauge
            stage.labels("talker").set(engine_stats.talker_capacity_audio_s_per_s)
            stage.labels("vocoder").set(engine_stats.vocoder_capacity_audio_s_per_s)
        return generate_latest(self.registry)
