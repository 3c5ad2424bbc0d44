"""Several vocoder workers (`vocoder.workers`): turns run side by side, one stream's
chunks never do, and every frame still arrives once, in order.

The backend is the sim backend told that its vocode calls may overlap (as Piper's may);
it notes which streams each call decodes while the call runs.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from conftest import FAST_SIM, EngineFactory, read_all
from hypothesis import given
from hypothesis import strategies as st

from pipeline.backend import VocodeItem
from pipeline.backends.sim import SimBackend, decode_sim_signal, expected_frames
from pipeline.config import SimConfig, TalkerConfig, VocoderConfig
from pipeline.vocoder import _BusyTime

TEXTS = [
    f"Stream {i} says a few sentences. Each one is long enough for several chunks. "
    f"The last one ends here, number {i}."
    for i in range(8)
]


class OverlappingSim(SimBackend):
    """The sim backend whose vocode calls may overlap; it records the overlap."""

    concurrent_vocode_calls = True

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        self._in_flight: dict[int, int] = {}  # stream tag -> calls decoding it now
        self.calls_at_once = 0  # most vocode calls seen running together
        self._running = 0
        self.same_stream_twice = 0  # a stream decoded by two calls at once

    def vocode(self, items: Sequence[VocodeItem]) -> list[np.ndarray]:
        tags = {int(item.frames[0, 0]) for item in items if len(item.frames)}
        with self._lock:
            self._running += 1
            self.calls_at_once = max(self.calls_at_once, self._running)
            for tag in tags:
                self._in_flight[tag] = self._in_flight.get(tag, 0) + 1
                if self._in_flight[tag] > 1:
                    self.same_stream_twice += 1
        try:
            return super().vocode(items)
        finally:
            with self._lock:
                self._running -= 1
                for tag in tags:
                    self._in_flight[tag] -= 1


# vocoder calls cost far more than talker steps: the vocoder is the busy stage
SLOW_VOCODER = SimConfig(
    talker_frames_per_step=16,
    talker_step_base_ms=0.2,
    talker_step_per_stream_ms=0.05,
    vocoder_base_ms=4.0,
    vocoder_per_frame_ms=0.2,
)


def _check(pcm: np.ndarray, text: str) -> None:
    pairs = decode_sim_signal(pcm, FAST_SIM.samples_per_frame)
    assert [index for _, index in pairs] == list(range(expected_frames(text)))
    assert len({tag for tag, _ in pairs}) == 1


async def _run(make_engine: EngineFactory, workers: int) -> OverlappingSim:
    backend = OverlappingSim(SLOW_VOCODER)
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=workers),
        talker=TalkerConfig(high_water_s=3600.0, batch=8),
    )
    assert len(engine.extra_vocoder_stages) == workers - 1
    streams = [engine.submit(text, voice="sim") for text in TEXTS]
    pcms = await asyncio.gather(*(read_all(stream) for stream in streams))
    for pcm, text in zip(pcms, TEXTS, strict=True):
        _check(pcm, text)
    assert all(engine.traces(stream.id) == [] for stream in streams)
    return backend


async def test_two_workers_decode_side_by_side_never_one_stream_twice(
    make_engine: EngineFactory,
) -> None:
    backend = await _run(make_engine, workers=2)
    assert backend.calls_at_once == 2
    assert backend.same_stream_twice == 0


async def test_one_worker_runs_one_call_at_a_time(make_engine: EngineFactory) -> None:
    backend = await _run(make_engine, workers=1)
    assert backend.calls_at_once == 1


async def test_a_backend_without_overlapping_calls_gets_one_worker(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(SimBackend(FAST_SIM), vocoder=VocoderConfig(workers=4))
    assert engine.extra_vocoder_stages == []


def test_busy_time_counts_overlapping_calls_once() -> None:
    busy = _BusyTime()
    assert busy.add(0.0, 1.0) == 1.0
    assert busy.add(0.5, 1.5) == 0.5  # [0.5, 1.0] was counted
    assert busy.add(0.2, 0.8) == 0.0  # ended first, inside what was counted
    assert busy.add(2.0, 3.0) == 1.0
    assert busy.add(1.0, 2.5) == 0.5  # the gap [1.5, 2.0]


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 10)), max_size=20))
def test_busy_time_adds_up_to_the_union_of_the_calls(calls: list[tuple[float, float]]) -> None:
    busy = _BusyTime()
    total = sum(busy.add(start, start + length) for start, length in calls)
    union, reach = 0.0, -math.inf  # the union's length, the plain way
    for start, stop in sorted((s, s + n) for s, n in calls):
        if stop > reach:
            union += stop - max(start, reach)
            reach = stop
    assert total == pytest.approx(union, abs=1e-6)
