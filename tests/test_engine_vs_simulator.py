"""The engine and the simulator make the same choices in the same order.

The real Engine (sim backend) runs on an asyncio event loop whose clock is virtual: when
nothing is ready the loop jumps to its next timer. Its two stage executors run the
backend's call inline and then sleep, in virtual time, the cost the sim backend asked
for (its injectable `sleep`), so a talker step and a vocoder turn overlap as they do in
their threads. The simulator's replica (benchmarks/sim_replica.py) gets the same configs
and the same scripted arrivals. Compared, in order: admission decisions, talker step
batches, vocoder selections (with their virtual times) and every stream's chunk sizes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

import benchmarks.sim_replica as sim_replica
from benchmarks.loadgen import load_corpus
from benchmarks.sim_run import Arrival, run_script
from benchmarks.virtual_time import SpentTime, VirtualStage, VirtualTimeLoop, virtual_stages
from pipeline.backends.sim import SimBackend, decode_sim_signal
from pipeline.config import AloneConfig, EngineConfig, SimConfig, TalkerConfig, VocoderConfig
from pipeline.engine import Engine
from pipeline.errors import Rejected, StreamCancelled
from pipeline.events import NullEvents
from pipeline.executor import Timed
from pipeline.load import Load
from pipeline.talker_core import TalkerCore
from scheduling import (
    AdmissionConfig,
    ChunkingConfig,
    SchedulingConfig,
    TalkerCandidate,
    TalkerPlan,
)

# A small replica: C ~ 4 streams, a talker batch of 3 and a high-water mark of 1.5 s, so
# that the talker batches, idles on its high-water timer, and admission rejects.
SETUP = sim_replica.EngineSetup(
    scheduling=SchedulingConfig(policy="edf", active_stream_window=2),
    chunking=ChunkingConfig(
        chunk_frames=6, ramp=(3, 4), left_context_frames=1, right_context_frames=1
    ),
    admission=AdmissionConfig(enabled=True, capacity_headroom=1.0),
    talker=TalkerConfig(batch=3, high_water_s=1.5, busy_max_queued_s=0.5),
    sim=SimConfig(
        talker_frames_per_step=5,
        talker_step_base_ms=3.1,
        talker_step_per_stream_ms=1.7,
        vocoder_base_ms=7.3,
        vocoder_per_frame_ms=6.1,
    ),
    engine=EngineConfig(capacity_window_s=2.0, calibration_calls=0),
)


def script(seed: int, count: int = 40) -> list[Arrival]:
    """`count` corpus texts over ~12 s, in bursts of up to four a few ms apart (so that a
    talker step batches them), a few clients leaving mid-stream."""
    rng = random.Random(seed)
    texts = load_corpus()
    arrivals = []
    at_s = 0.0
    for index in range(count):
        at_s += rng.uniform(0.001, 0.004) if index % 4 else rng.expovariate(count / 4 / 12.0)
        cancel_at_s = at_s + rng.uniform(0.3, 3.0) if index % 7 == 3 else None
        arrivals.append(Arrival(at_s, rng.choice(texts), cancel_at_s))
    return arrivals


# The engine on a virtual clock.


class _Recorder(NullEvents):
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.talker_steps: list[tuple[float, tuple[str, ...]]] = []
        self.vocoder_turns: list[tuple[float, tuple[str, ...]]] = []

    def talker_step(self, stream_ids: Sequence[str]) -> None:
        self.talker_steps.append((self._clock(), tuple(stream_ids)))

    def vocoder_selection(self, stream_ids: Sequence[str]) -> None:
        self.vocoder_turns.append((self._clock(), tuple(stream_ids)))


@dataclass
class Decisions:
    """One run's decisions, streams named by their arrival's index."""

    admissions: list[tuple[float, bool, str]]
    talker_steps: list[tuple[float, tuple[int, ...]]]
    vocoder_turns: list[tuple[float, tuple[int, ...]]]
    chunks: dict[int, list[int]] = field(default_factory=dict)
    ahead_turns: int = 0  # vocode calls of a chunk beside one in flight (work-ahead)
    yields: int = 0  # worker plans held back for a first audio
    prepared_opens: int = 0  # segments opened from a preparation


def _named(
    entries: list[tuple[float, tuple[str, ...]]], index: dict[str, int]
) -> list[tuple[float, tuple[int, ...]]]:
    return [(t, tuple(index[s] for s in ids)) for t, ids in entries]


def run_engine(setup: sim_replica.EngineSetup, arrivals: Sequence[Arrival]) -> Decisions:
    loop = VirtualTimeLoop()
    spent = SpentTime()
    try:
        with virtual_stages(spent):
            return loop.run_until_complete(_drive(loop, spent, setup, arrivals))
    finally:
        loop.close()


async def _drive(
    loop: VirtualTimeLoop,
    spent: SpentTime,
    setup: sim_replica.EngineSetup,
    arrivals: Sequence[Arrival],
) -> Decisions:
    backend = SimBackend(setup.sim, sleep=spent)
    events = _Recorder(loop.time)
    engine = Engine(
        backend,
        scheduling=setup.scheduling,
        chunking=setup.chunking,
        admission=setup.admission,
        engine=setup.engine,
        talker=setup.talker,
        text=setup.text,
        vocoder=setup.vocoder,
        alone=setup.alone,
        clock=loop.time,
        events=events,
    )
    await engine.start()
    admissions: list[tuple[float, bool, str]] = []
    stream_ids: list[str | None] = [None] * len(arrivals)
    frames: dict[int, list[list[tuple[int, int]]]] = {}
    readers: list[asyncio.Task[None]] = []

    async def read(index: int, chunks: object) -> None:
        got = frames.setdefault(index, [])
        try:
            async for pcm in chunks:  # type: ignore[attr-defined]
                got.append(decode_sim_signal(pcm, backend.samples_per_frame))
        except StreamCancelled:
            pass

    def arrive(index: int) -> None:
        try:
            stream = engine.submit(arrivals[index].text, voice="sim")
        except Rejected as rejected:
            admissions.append((loop.time(), False, rejected.decision.reason))
            return
        admissions.append((loop.time(), True, "ok"))
        stream_ids[index] = stream.id
        readers.append(loop.create_task(read(index, stream.chunks())))

    def cancel(index: int) -> None:
        stream_id = stream_ids[index]
        if stream_id is not None:
            engine.cancel(stream_id)

    last_s = 0.0
    for index, arrival in enumerate(arrivals):
        loop.call_at(arrival.at_s, arrive, index)
        last_s = max(last_s, arrival.at_s)
        if arrival.cancel_at_s is not None:
            loop.call_at(arrival.cancel_at_s, cancel, index)
            last_s = max(last_s, arrival.cancel_at_s)
    await asyncio.sleep(last_s + 1.0 - loop.time())
    await asyncio.gather(*readers)
    await engine.stop()
    assert backend.open_segments == 0  # every opened segment was closed

    index = {stream_id: i for i, stream_id in enumerate(stream_ids) if stream_id is not None}
    chunks: dict[int, list[int]] = {}
    for i, got in frames.items():
        flat = [pair for chunk in got for pair in chunk]
        # every frame of the stream once, in order (a cancelled stream: a prefix)
        assert [frame for _, frame in flat] == list(range(len(flat)))
        chunks[i] = [len(chunk) for chunk in got]
    return Decisions(
        admissions,
        _named(events.talker_steps, index),
        _named(events.vocoder_turns, index),
        chunks,
        ahead_turns=engine.book.vocoder.ahead_turns,
        yields=engine.book.vocoder.yields,
        prepared_opens=backend.prepared_opens,
    )


def run_simulator(setup: sim_replica.EngineSetup, arrivals: Sequence[Arrival]) -> Decisions:
    run = run_script(setup, arrivals)
    index = {stream_id: i for i, stream_id in enumerate(run.stream_ids) if stream_id is not None}
    trace, replica = run.trace, run.replica
    assert replica is not None
    return Decisions(
        [(t, ok, why if not ok else "ok") for t, ok, why in trace.admissions],
        _named(trace.talker_steps, index),
        _named(trace.vocoder_turns, index),
        {index[s]: sizes for s, sizes in trace.chunks.items()},
        ahead_turns=replica.book.vocoder.ahead_turns,
        yields=replica.book.vocoder.yields,
        prepared_opens=replica.backend.prepared_opens,
    )


def assert_same(engine: Decisions, simulator: Decisions) -> None:
    def first_difference(a: list[object], b: list[object]) -> str:
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"at {i}: engine {x} != simulator {y}"
        return f"lengths {len(a)} != {len(b)}"

    def timed(entries: list[tuple[float, tuple[int, ...]]]) -> list[object]:
        return [(round(t, 9), ids) for t, ids in entries]

    for name in ("admissions", "talker_steps", "vocoder_turns"):
        a, b = getattr(engine, name), getattr(simulator, name)
        if name == "admissions":
            a = [(round(t, 9), ok, why) for t, ok, why in a]
            b = [(round(t, 9), ok, why) for t, ok, why in b]
        else:
            a, b = timed(a), timed(b)
        assert a == b, f"{name} differ, {first_difference(a, b)}"
    # a stream without chunks has no entry on the simulator's side
    assert {i: c for i, c in engine.chunks.items() if c} == simulator.chunks


@pytest.mark.parametrize("seed", [1, 2])
def test_engine_and_simulator_decide_alike(seed: int) -> None:
    arrivals = script(seed)
    engine = run_engine(SETUP, arrivals)
    simulator = run_simulator(SETUP, arrivals)
    assert_same(engine, simulator)
    # The script exercises what it is for: batched steps, full vocoder windows,
    # rejections after the capacity is measured, cut-short streams.
    assert max(len(ids) for _, ids in engine.talker_steps) == SETUP.talker.batch
    assert max(len(ids) for _, ids in engine.vocoder_turns) == 2
    assert any(not ok for _, ok, _ in engine.admissions)
    assert sum(ok for _, ok, _ in engine.admissions) >= 10
    cancelled = [i for i, a in enumerate(arrivals) if a.cancel_at_s is not None]
    assert any(i in engine.chunks for i in cancelled)


def test_engine_and_simulator_decide_alike_under_fifo() -> None:
    setup = replace(
        SETUP,
        scheduling=SchedulingConfig(policy="fifo", active_stream_window=3),
        admission=AdmissionConfig(enabled=False),
        talker=TalkerConfig(batch=2, high_water_s=3.0),
    )
    arrivals = script(5, count=25)
    assert_same(run_engine(setup, arrivals), run_simulator(setup, arrivals))


def _newest_first(core: TalkerCore, now_s: float, load: Load) -> TalkerPlan:
    listed: list[TalkerCandidate] = sorted(core.candidates(), key=lambda c: -c.order)
    return TalkerPlan(tuple(c.stream_id for c in listed[: core.order.batch]), None)


def test_a_simulator_with_another_talker_order_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both run the one talker core: one that decides otherwise in the simulator alone
    (newest first) is caught."""
    arrivals = script(1)
    engine = run_engine(SETUP, arrivals)
    monkeypatch.setattr(TalkerCore, "plan", _newest_first)
    # the talker order decides whose audio comes first: depending on the texts' segments
    # the first record to part is the talker steps or an admission that follows from them
    with pytest.raises(AssertionError, match=r"(talker_steps|admissions) differ"):
        assert_same(engine, run_simulator(SETUP, arrivals))


# A lone request on a Piper-like sim backend: two vocoder workers (work-ahead, the even
# tail, yielding to a first audio) and its next segment prepared.
LONE = replace(
    SETUP,
    chunking=ChunkingConfig(
        chunk_frames=6,
        ramp=(3, 4),
        left_context_frames=1,
        right_context_frames=1,
    ),
    admission=AdmissionConfig(enabled=False),
    talker=TalkerConfig(batch=2, high_water_s=3.0, urgent_slack_s=1.0),
    alone=AloneConfig(urgent_slack_s=0.3),
    vocoder=VocoderConfig(workers=2, yield_slack_s=0.5),
    sim=replace(SETUP.sim, concurrent_vocode_calls=True, prepares_segments=True),
)


def lone_script(seed: int) -> list[Arrival]:
    """Requests mostly alone (seconds apart), now and then a second one beside a playing
    stream, and a client that leaves mid-stream."""
    rng = random.Random(seed)
    texts = [t for t in load_corpus() if len(t) > 120]
    arrivals = []
    at_s = 0.0
    for index in range(8):
        at_s += rng.uniform(0.2, 0.6) if index % 3 == 2 else rng.uniform(4.0, 8.0)
        cancel_at_s = at_s + rng.uniform(0.4, 1.5) if index == 4 else None
        arrivals.append(Arrival(at_s, rng.choice(texts), cancel_at_s))
    return arrivals


@pytest.mark.parametrize("seed", [3, 4])
def test_a_lone_request_is_decided_alike(seed: int) -> None:
    """Work-ahead over two workers, the even tail, the next segment
    prepared, a yield to a newcomer's first audio, a cancel: the same decisions."""
    arrivals = lone_script(seed)
    engine = run_engine(LONE, arrivals)
    simulator = run_simulator(LONE, arrivals)
    assert_same(engine, simulator)
    # the workload exercises what it is for: two chunks of one stream decoded at once
    # (work-ahead), a worker yielding, a segment prepared
    assert engine.ahead_turns > 0, "no chunk was decoded beside another of its stream"
    assert engine.yields > 0, "no worker yielded to a first audio"
    assert (engine.ahead_turns, engine.yields, engine.prepared_opens) == (
        simulator.ahead_turns,
        simulator.yields,
        simulator.prepared_opens,
    )
    assert engine.prepared_opens > 0


def test_virtual_stages_overlap() -> None:
    """The virtual executor lets the other stage run while one is busy."""
    loop = VirtualTimeLoop()
    spent = SpentTime()
    talker = VirtualStage("talker", clock=loop.time, spent=spent)
    vocoder = VirtualStage("vocoder", clock=loop.time, spent=spent)

    async def both() -> tuple[Timed[object], Timed[object]]:
        return await asyncio.gather(talker.run_timed(spent, 0.5), vocoder.run_timed(spent, 0.25))  # type: ignore[return-value]

    try:
        slow, fast = loop.run_until_complete(both())
    finally:
        loop.close()
    assert (slow.started_s, slow.finished_s) == (0.0, 0.5)
    assert (fast.started_s, fast.finished_s) == (0.0, 0.25)
    assert np.isclose(loop.virtual_s, 0.5)
