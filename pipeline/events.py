"""What the engine reports: metrics hooks, its stats, and per-turn timings."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.stream import StreamState, StreamStats

log = logging.getLogger("playhead.engine")


class EngineEvents(Protocol):
    """Metrics hooks (app/metrics.py implements them); called on the event loop."""

    def stream_started(self, stream_id: str) -> None: ...

    def first_audio(self, stream_id: str, ttfa_s: float) -> None: ...

    def stall(self, stream_id: str, stall_s: float) -> None: ...

    def vocoder_turn(self, batch_size: int, turn_s: float) -> None: ...

    def talker_call(self, seconds: float) -> None: ...

    def talker_step(self, stream_ids: Sequence[str]) -> None:
        """The streams one talker step runs, in plan order (decision traces, tests)."""
        ...

    def vocoder_selection(self, stream_ids: Sequence[str]) -> None:
        """The streams one vocoder turn decodes, in selection order (decision traces)."""
        ...

    def rejected(self, reason: str) -> None: ...

    def start_waited(self, seconds: float) -> None:
        """A reservation got its start slot after waiting this long in the start queue
        (0.0: one was free at once); a wait refused at the queue's timeout is a
        `rejected("starting")` instead."""
        ...

    def stream_finished(self, stats: StreamStats, state: StreamState) -> None: ...

    def capacity(self, audio_s_per_s: float) -> None: ...

    def turn_timing(self, timing: TurnTiming) -> None: ...

    def stage_timeout(self, stage: str) -> None:
        """A model call of this stage hung past engine.call_timeout_s."""
        ...


class GuardedEvents:
    """An EngineEvents whose hooks never raise into the engine: a failing hook is logged.
    The Engine wraps its events in one, so the stages call hooks directly. While `muted`
    (the engine's calibration) no hook is called."""

    def __init__(self, events: EngineEvents) -> None:
        self._events = events
        # True while the engine calibrates: its internal streams are not reported
        self.muted = False

    def __getattr__(self, name: str) -> Callable[..., None]:
        events = self._events

        def guarded(*args: object) -> None:
            if self.muted:
                return
            # looked up at each call: a hook replaced on the events object after the
            # engine started is the one called; one the object lacks does nothing
            hook = getattr(events, name, None) or _no_hook
            try:
                hook(*args)
            except Exception:
                log.exception("events.%s failed", name)

        setattr(self, name, guarded)  # built once per hook
        return guarded


def _no_hook(*args: object) -> None:
    return None


class NullEvents:
    """EngineEvents that record nothing."""

    def stream_started(self, stream_id: str) -> None:
        pass

    def first_audio(self, stream_id: str, ttfa_s: float) -> None:
        pass

    def stall(self, stream_id: str, stall_s: float) -> None:
        pass

    def vocoder_turn(self, batch_size: int, turn_s: float) -> None:
        pass

    def talker_call(self, seconds: float) -> None:
        pass

    def talker_step(self, stream_ids: Sequence[str]) -> None:
        pass

    def vocoder_selection(self, stream_ids: Sequence[str]) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def start_waited(self, seconds: float) -> None:
        pass

    def stream_finished(self, stats: StreamStats, state: StreamState) -> None:
        pass

    def capacity(self, audio_s_per_s: float) -> None:
        pass

    def turn_timing(self, timing: TurnTiming) -> None:
        pass

    def stage_timeout(self, stage: str) -> None:
        pass


@dataclass(frozen=True)
class EngineStats:
    active_streams: int  # streams with talker or vocoder work left (what admission counts)
    parked_streams: int  # of those, skipped because their consumer is not reading
    capacity_audio_s_per_s: float  # the pipeline's measured rate (0 = not measured yet)
    policy: str  # the scheduler's policy
    draining_streams: int = 0  # all audio emitted, consumer still reading
    queued_frames: int = 0  # talker frames not yet vocoded, over all streams
    # each stage's reading (pipeline/capacity.py): the pipeline's is the smaller
    talker_capacity_audio_s_per_s: float = 0.0
    vocoder_capacity_audio_s_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TurnTiming:
    """One decoding vocoder turn, in perf-counter seconds (the `turn_timing` event)."""

    batch_size: int
    wall_s: float  # from the turn's scan to the end of its bookkeeping
    model_s: float  # inside backend.vocode (engine clock, read in the vocoder thread)
    engine_s: float  # the engine's own synchronous work: scan, select, build, bookkeeping
    engine_cpu_s: float = 0.0  # the same work in the event loop thread's CPU time
