"""The step-wise talker: continuous batching on the sim backend.

Streams join and leave the talker's batch between steps; every frame of every stream
still arrives exactly once and in order (checked through the PCM's signal), a cancelled
stream's talker state is freed, and a stream above the high-water mark sits steps out
without losing its open segment.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from contextlib import aclosing

import numpy as np
import pytest
from conftest import TEST_CHUNKING, EngineFactory, read_all, until

from pipeline import Engine, StreamCancelled, StreamState
from pipeline.backend import BackendCapabilities, TalkRequest, TalkStep
from pipeline.backends.sim import SimBackend, SimSegment, decode_sim_signal, expected_frames
from pipeline.config import EngineConfig, SimConfig, TalkerConfig, TextConfig
from scheduling import AdmissionConfig, SchedulingConfig

# A batched codec LM's shape: two frames per segment per step, one long segment per stream.
STEPPED = SimConfig(
    talker_frames_per_step=2,
    talker_step_base_ms=1.0,
    talker_step_per_stream_ms=0.2,
    vocoder_base_ms=0.5,
    vocoder_per_frame_ms=0.05,
)
LONG = (
    "A single long sentence that keeps going with commas, semicolons and colons, "
    "so that its one segment takes many talker steps to finish"
)
NO_FRAGMENT = TextConfig(first_fragment_words=0)  # whole sentences: frames are predictable
TEXTS = [LONG, "Short one, but not too short.", LONG + " again", "Another sentence, middling."]


class _BatchRecordingSim(SimBackend):
    """The sim backend, recording which streams (tags) each step advanced."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.batches: list[tuple[int, ...]] = []
        self.opened: list[int] = []

    def open_segment(self, request: TalkRequest) -> SimSegment:
        self.opened.append(request.stream_tag)
        return super().open_segment(request)

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        self.batches.append(tuple(s.tag for s in segments))
        return super().step(segments)


def _frame_indices(pcm: np.ndarray) -> tuple[set[int], list[int]]:
    pairs = decode_sim_signal(pcm, STEPPED.samples_per_frame)
    return {tag for tag, _ in pairs}, [index for _, index in pairs]


async def test_joins_leaves_and_a_cancel_keep_every_other_frame_once_in_order(
    make_engine: EngineFactory,
) -> None:
    backend = _BatchRecordingSim(STEPPED)
    engine = await make_engine(
        backend,
        window=2,
        talker=TalkerConfig(batch=4, high_water_s=3600.0),
        text=NO_FRAGMENT,
    )
    early = [engine.submit(text, voice="sim") for text in TEXTS[:2]]
    victim = engine.submit(LONG + " to be cut short", voice="sim")
    readers = [asyncio.ensure_future(read_all(s)) for s in early]
    # the victim plays a little, then its client is gone
    with pytest.raises(StreamCancelled):
        async with aclosing(victim.chunks()) as chunks:
            async for _ in chunks:
                engine.cancel(victim.id)
    # late joiners arrive while the early streams' segments are still being stepped
    assert any(not r.done() for r in readers)
    late = [engine.submit(text, voice="sim") for text in TEXTS[2:]]
    readers += [asyncio.ensure_future(read_all(s)) for s in late]
    pcms = await asyncio.gather(*readers)

    streams = [*early, *late]
    texts = [*TEXTS[:2], *TEXTS[2:]]
    tags = set()
    for stream, text, pcm in zip(streams, texts, pcms, strict=True):
        stream_tags, indices = _frame_indices(pcm)
        assert indices == list(range(expected_frames(text, options=NO_FRAGMENT)))
        assert len(stream_tags) == 1 and stream.state is StreamState.DONE
        tags |= stream_tags
    assert len(tags) == 4
    # it was continuous batching: several streams per step, and the batch changed
    assert max(len(b) for b in backend.batches) >= 3
    assert len({b for b in backend.batches}) >= 3
    # the victim's tag (3) left the batch for good once cancelled
    last_victim_step = max(i for i, b in enumerate(backend.batches) if 3 in b)
    assert last_victim_step < len(backend.batches) - 1
    assert victim.stats.frames < expected_frames(LONG + " to be cut short")
    # every segment opened was closed, the cancelled one included
    await asyncio.wait_for(_closed(backend), 5.0)
    assert all(engine.traces(s.id) == [] for s in [*streams, victim])


async def _closed(backend: SimBackend) -> None:
    while backend.open_segments:
        await asyncio.sleep(0.005)


async def test_the_batch_is_capped_and_urgent_streams_step_first(
    make_engine: EngineFactory,
) -> None:
    backend = _BatchRecordingSim(STEPPED)
    engine = await make_engine(
        backend,
        window=4,
        talker=TalkerConfig(batch=2, high_water_s=3600.0),
        text=NO_FRAGMENT,
    )
    streams = [engine.submit(LONG, voice="sim") for _ in range(5)]
    await asyncio.gather(*(read_all(s) for s in streams))
    assert max(len(b) for b in backend.batches) == 2
    # first-audio deadlines rank by arrival: the first two stream before the last three
    # get a step, so the first batch holds the first two tags
    assert set(backend.batches[0]) == {1, 2}


async def test_a_stream_above_the_high_water_mark_sits_out_and_keeps_its_segment() -> None:
    """20 ms frames, a 0.3 s mark, a clock that stands still: playback does not advance,
    so the talker stops stepping the stream's one long segment once 0.3 s of audio is
    ahead, and keeps its backend state open. When the clock runs again, the same segment
    goes on and the stream plays whole."""
    sim = SimConfig(
        samples_per_frame=480,  # 20 ms
        talker_frames_per_step=5,  # 100 ms per step
        talker_step_base_ms=0.2,
        talker_step_per_stream_ms=0.0,
        vocoder_base_ms=0.2,
        vocoder_per_frame_ms=0.0,
    )
    backend = _BatchRecordingSim(sim)
    clock = _Clock(frozen_at_s=1000.0)
    engine = Engine(
        backend,
        engine=EngineConfig(calibration_calls=0),  # no start-up calibration here
        scheduling=SchedulingConfig(policy="edf", active_stream_window=2),
        chunking=TEST_CHUNKING,
        admission=AdmissionConfig(enabled=False),
        talker=TalkerConfig(batch=4, high_water_s=0.3, run_ahead=False),
        text=NO_FRAGMENT,
        clock=clock,
    )
    await engine.start()
    try:
        stream = engine.submit(LONG, voice="sim")  # ~110 frames: 2.2 s of audio
        total = expected_frames(LONG, options=NO_FRAGMENT)
        chunks = aiter(stream.chunks())
        parts = [await anext(chunks)]
        # the talker holds back: what is vocoded and queued stays within mark + one step
        await until(lambda: engine.talker.idle_waits >= 3)  # it re-planned, stepped nothing
        produced_s = stream.stats.frames * 0.02
        assert 0.3 <= produced_s <= 0.3 + 0.1 + 1e-9
        assert backend.open_segments == 1 and backend.opened == [1]
        record = engine.book.record(stream.id)
        assert record is not None and record.talking is not None  # its state kept
        steps_held = len(backend.batches)
        clock.run()  # playback moves on; the talker's timer re-plans
        async for pcm in chunks:
            parts.append(pcm)
        pairs = decode_sim_signal(np.concatenate(parts), 480)
        assert [i for _, i in pairs] == list(range(total))
        assert len(backend.batches) > steps_held  # the same segment was stepped on
        assert backend.opened == [1] and backend.open_segments == 0
    finally:
        await engine.stop()


class _Clock:
    """A clock that stands still until `run`, then runs at wall-clock rate."""

    def __init__(self, frozen_at_s: float) -> None:
        self._offset_s = frozen_at_s
        self._running = False

    def run(self) -> None:
        self._offset_s -= time.monotonic()
        self._running = True

    def __call__(self) -> float:
        return self._offset_s + (time.monotonic() if self._running else 0.0)


class _GatedConcurrentSim(SimBackend):
    """A sim whose talker steps may run side by side (like Piper's), and whose steps for
    stream tag 1 wait for `gate`: a long talker call in flight for another stream."""

    capabilities = BackendCapabilities(concurrent_talker_steps=True)

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.gate = threading.Event()
        self.gated = threading.Event()  # a step of tag 1 is waiting at the gate

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        if any(s.tag == 1 for s in segments) and not self.gate.is_set():
            self.gated.set()
            self.gate.wait(30)
        return super().step(segments)


@pytest.mark.parametrize("urgent_lane", [True, False])
async def test_a_newcomer_does_not_wait_behind_a_talker_call_for_another_stream(
    make_engine: EngineFactory, urgent_lane: bool
) -> None:
    """Nor, once playing, while its player has less than the urgent slack ahead: its
    whole answer (14 frames, 2 a step, 1.1 s of audio) is talked on the second lane."""
    backend = _GatedConcurrentSim(STEPPED)
    engine = await make_engine(
        backend,
        talker=TalkerConfig(high_water_s=3600.0, urgent_lane=urgent_lane, urgent_slack_s=1.0),
    )
    busy = engine.submit(LONG, voice="sim")
    await asyncio.to_thread(backend.gated.wait, 5)  # its step is in flight, held
    newcomer = engine.submit("Sorry, go ahead.", voice="sim")
    chunks = aiter(newcomer.chunks())
    first = asyncio.ensure_future(anext(chunks))
    done, _ = await asyncio.wait({first}, timeout=2.0)
    rest: list[np.ndarray] = []
    if urgent_lane:  # the second lane talked it while the first was held
        assert first in done and not backend.gate.is_set()
        async with asyncio.timeout(5.0):  # the player's 1x pace: about 0.2 s
            rest = [pcm async for pcm in chunks]
        assert not backend.gate.is_set()
        assert engine.talker.urgent_steps >= 7
    else:  # one lane: it waits for the held call
        assert not done
    backend.gate.set()
    await first
    rest += [pcm async for pcm in chunks]
    _, indices = _frame_indices(np.concatenate([first.result(), *rest]))
    assert indices == list(range(expected_frames("Sorry, go ahead.")))
    await read_all(busy)


def test_a_shared_cache_backend_gets_one_talker_lane() -> None:
    """The sim (one batched model, like a codec LM) declares no concurrent steps."""
    engine = Engine(
        SimBackend(STEPPED),
        engine=EngineConfig(calibration_calls=0),  # no start-up calibration here
        scheduling=SchedulingConfig(policy="edf", active_stream_window=2),
        chunking=TEST_CHUNKING,
        admission=AdmissionConfig(enabled=False),
        talker=TalkerConfig(urgent_lane=True),
    )
    assert engine.urgent_stage is None
