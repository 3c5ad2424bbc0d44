"""Work-conserving pacing (`talker.run_ahead`), on the simulator, in virtual time.

The simulator's replica runs the engine's own StreamBook and talker order
(benchmarks/sim_replica.py; tests/test_engine_vs_simulator.py pins it to the engine), so
what holds here holds for the engine's decisions:

- an idle server's long text is done in a fraction of its audio's duration (the talker
  no longer waits for playback to catch up with the high-water mark);
- a stream above the mark runs ahead only when no stream under it could take the step
  and the vocoder has no chunk waiting: under overload nobody runs ahead;
- while the vocoder is busy, a stream with `talker.busy_max_queued_s` of frames waiting
  for it gets no step (broken on purpose, without the cap: the test fails); with the cap,
  every worker decoding counts as busy, and a worker that ends its turn with nothing to
  take wakes the talker (broken on purpose, either rule: the book-level test fails).

The replica's talker decisions are watched at the talker core's `plan` (what its
`schedule` calls), next to the book the replica built (`build_book`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest

import benchmarks.sim_replica as sim_replica
from benchmarks.loadgen import load_corpus
from benchmarks.sim_run import Arrival, run_script
from pipeline.backends.sim import SimBackend
from pipeline.book import StreamBook, Wakes
from pipeline.config import EngineConfig, SimConfig, TalkerConfig, TextConfig
from pipeline.events import NullEvents
from pipeline.load import Load
from pipeline.talker_core import TalkerCore, run_talk, talker_order
from pipeline.text import Segmenter, segment_options
from scheduling import (
    AdmissionConfig,
    ChunkingConfig,
    ChunkPlanner,
    PlaybackScheduler,
    SchedulingConfig,
    TalkerPlan,
    talker_key,
)

# configs/sim.yaml's costs: C ~ 8.9 streams at 1x, the talker ~150x real time per stream
SIM = SimConfig(
    talker_frames_per_step=8,
    talker_step_base_ms=1.0,
    talker_step_per_stream_ms=0.2,
    vocoder_base_ms=4.0,
    vocoder_per_frame_ms=9.0,
)
SETUP = sim_replica.EngineSetup(
    scheduling=SchedulingConfig(policy="edf", active_stream_window=4),
    chunking=ChunkingConfig(chunk_frames=8, ramp=(6,)),
    admission=AdmissionConfig(enabled=False),
    talker=TalkerConfig(batch=16, high_water_s=8.0),
    sim=SIM,
    engine=EngineConfig(),
)
FRAME_S = SIM.samples_per_frame / SIM.sample_rate_hz


def _long_text(chars: int = 4096) -> str:
    text = ""
    for line in load_corpus():
        if len(text) + len(line) + 1 > chars:
            break
        text = f"{text} {line}".strip()
    return text


# what a watched plan sees: the replica's book, the time, the load; its plan
Watch = Callable[[StreamBook, float, Load, Callable[[], TalkerPlan]], TalkerPlan]


def _watch_plans(monkeypatch: pytest.MonkeyPatch, watch: Watch) -> None:
    """Every talker plan of the replicas run next goes through `watch(book, now_s, load,
    plan)`, which calls `plan()` for the core's own decision and returns it."""
    books: list[StreamBook] = []
    build_book = sim_replica.build_book

    def built(**options: Any) -> StreamBook:
        book = build_book(**options)
        books.append(book)
        return book

    core_plan = TalkerCore.plan

    def watched(core: TalkerCore, now_s: float, load: Load) -> TalkerPlan:
        (book,) = [book for book in books if book.talker is core]
        return watch(book, now_s, load, lambda: core_plan(core, now_s, load))

    monkeypatch.setattr(sim_replica, "build_book", built)
    monkeypatch.setattr(TalkerCore, "plan", watched)


def _vocoder_idle(book: StreamBook, load: Load) -> bool:
    """The vocoder would leave a core idle, as the talker core asks it."""
    return book.vocoder.idle(load, book.talker.order.busy_max_queued_s is not None)


def _idle_run(run_ahead: bool) -> tuple[float, float]:
    """(virtual seconds to the stream's last vocoder turn, seconds of its audio)."""
    setup = replace(SETUP, talker=replace(SETUP.talker, run_ahead=run_ahead))
    run = run_script(setup, [Arrival(0.0, _long_text())])
    (stream_id,) = run.stream_ids
    assert stream_id is not None
    audio_s = sum(run.trace.chunks[stream_id]) * FRAME_S
    # its last chunk's turn (run.virtual_s also counts stale high-water timers)
    last_turn_s = max(t for t, ids in run.trace.vocoder_turns if stream_id in ids)
    return last_turn_s, audio_s


def test_an_idle_server_reads_a_long_text_far_faster_than_it_plays() -> None:
    wall_s, audio_s = _idle_run(run_ahead=True)
    assert audio_s > 200.0  # ~4,000 characters
    # the vocoder alone decodes at ~8.9x real time here: ~0.11 x the audio's duration
    assert wall_s <= 0.2 * audio_s, (wall_s, audio_s)


def test_without_run_ahead_the_mark_paces_an_idle_stream_at_real_time() -> None:
    wall_s, audio_s = _idle_run(run_ahead=False)
    assert wall_s >= audio_s - SETUP.talker.high_water_s - 1.0, (wall_s, audio_s)


def test_under_overload_streams_under_the_mark_always_step_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every talker plan of an overloaded, then draining, replica is checked against the
    book's own candidates: a stream above the mark steps only when none under it could and
    the vocoder had nothing waiting."""
    plans = {"run_ahead": 0, "paced": 0}

    def checked(
        book: StreamBook, now_s: float, load: Load, plan_talker: Callable[[], TalkerPlan]
    ) -> TalkerPlan:
        vocoder_idle = _vocoder_idle(book, load)
        plan = plan_talker()
        order = book.talker.order
        candidates = {c.stream_id: c for c in book.talker.candidates()}  # parked ones out
        records = book.table.records
        under = [
            sid
            for sid, c in candidates.items()
            if talker_key(c, now_s, order) is not None and not records[sid].stepping
        ]
        above = [sid for sid in plan.step_ids if talker_key(candidates[sid], now_s, order) is None]
        if above:
            assert not under, (now_s, plan.step_ids, under)
            assert vocoder_idle, (now_s, plan.step_ids)  # no chunk was waiting either
            plans["run_ahead"] += 1
        elif plan.step_ids:
            plans["paced"] += 1
        return plan

    _watch_plans(monkeypatch, checked)
    texts = load_corpus()
    # an overload (18 streams at once, ~2 x C), then one more every 1.5 s for a minute:
    # under the overload nobody runs ahead; as it drains, steps run ahead between arrivals
    arrivals = [Arrival(0.0, texts[i % len(texts)]) for i in range(18)]
    arrivals += [Arrival(1.5 * i, texts[(18 + i) % len(texts)]) for i in range(1, 40)]
    run = run_script(SETUP, arrivals)
    assert all(stream_id is not None for stream_id in run.stream_ids)
    assert plans["run_ahead"] > 0 and plans["paced"] > 0, plans


def _queued_when_stepped_busy(
    monkeypatch: pytest.MonkeyPatch, busy_max_queued_s: float
) -> tuple[float, float]:
    """An overload (18 streams at once): (the most audio waiting for the vocoder that a
    stream stepped while the vocoder was busy had, the most any stream had at any plan)."""
    seen = {"stepped_busy": 0.0, "any": 0.0}

    def checked(
        book: StreamBook, now_s: float, load: Load, plan_talker: Callable[[], TalkerPlan]
    ) -> TalkerPlan:
        busy = not _vocoder_idle(book, load)
        plan = plan_talker()
        queued = {c.stream_id: c.queued_audio_s for c in book.talker.candidates()}
        if queued:
            seen["any"] = max(seen["any"], *queued.values())
        if busy:
            for stream_id in plan.step_ids:
                seen["stepped_busy"] = max(seen["stepped_busy"], queued[stream_id])
        return plan

    _watch_plans(monkeypatch, checked)
    texts = load_corpus()
    setup = replace(SETUP, talker=replace(SETUP.talker, busy_max_queued_s=busy_max_queued_s))
    run_script(setup, [Arrival(0.0, texts[i % len(texts)]) for i in range(18)])
    return seen["stepped_busy"], seen["any"]


def test_a_busy_vocoder_holds_back_streams_with_frames_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`talker.busy_max_queued_s`: while the vocoder is busy no stream with more than the
    cap of frames waiting for it gets a step, so no stream gets far more than the cap plus
    one step's frames; without the cap streams fill up to the high-water mark (8 s)."""
    capped_stepped, capped_any = _queued_when_stepped_busy(monkeypatch, 2.0)
    assert capped_stepped <= 2.0
    step_s = SIM.talker_frames_per_step * FRAME_S  # one step's frames (0.64 s)
    assert capped_any <= 2.0 + step_s + 1e-9
    free_stepped, free_any = _queued_when_stepped_busy(monkeypatch, 0.0)
    assert free_stepped > 2.0 and free_any > 4.0, (free_stepped, free_any)


def test_every_vocoder_worker_decoding_counts_as_busy_only_with_the_cap() -> None:
    """Two workers, both decoding, no chunk waiting: with `busy_max_queued_s` the vocoder
    is busy, so streams with more frames waiting than the cap sit out (and nobody runs
    ahead); a worker whose turn ends and who finds no chunk to take frees a core and wakes
    the talker to run ahead. With the cap at 0 only a chunk waiting counts as busy (the
    old rule). One stream per vocoder turn (K 1: each worker decodes one); chunks past
    the first are 64 frames: after its first chunk a stream's 44 frames left make no chunk
    yet, so the turn's end leaves nothing waiting."""

    def run(busy_max_queued_s: float) -> list[tuple[str, ...]]:
        talker = TalkerConfig(batch=2, busy_max_queued_s=busy_max_queued_s)
        setup = replace(
            SETUP, talker=talker, scheduling=replace(SETUP.scheduling, active_stream_window=1)
        )
        talker_wakes: list[int] = []  # the vocoder turns running at each talker wake
        books: list[StreamBook] = []
        book = StreamBook(
            scheduler=PlaybackScheduler(setup.scheduling),
            planner=ChunkPlanner(ChunkingConfig(chunk_frames=64, ramp=(6,))),
            order=talker_order(talker, setup.scheduling),
            segmenter=partial(Segmenter, **segment_options(TextConfig())),
            max_pending_audio_s=1e9,
            clock=lambda: 100.0,
            events=NullEvents(),
            wakes=Wakes(
                talker=lambda: talker_wakes.append(books[0].vocoder.turns_running),
                vocoder=lambda: None,
            ),
            vocoder_workers=2,
        )
        books.append(book)
        backend = SimBackend(replace(SIM, talker_frames_per_step=50), sleep=lambda _s: None)
        voice = backend.voices()[0]
        for _ in range(2):  # two streams, each 4 s of frames made (50 x 80 ms), more text
            stream = book.add_stream(voice, speed=1.0, now_s=100.0)
            book.add_text(stream.id, "word " * 200 + ". " + "more " * 200, final=True)
        talk = book.talker.schedule(100.0)
        assert talk is not None and len(talk.stream_ids) == 2
        outcome = run_talk(backend, talk, lambda *_: None)
        book.talker.update(talk, outcome, 100.0)
        assert [len(step.frames) for step in outcome.results] == [50, 50]
        vocoder = book.vocoder
        # both workers take a chunk: none is left waiting
        turns = [vocoder.schedule(100.0), vocoder.schedule(100.0)]
        assert [len(turn.batch) for turn in turns if turn is not None] == [1, 1]
        assert vocoder.turns_running == 2 and not vocoder.ready_ids
        plans = [book.talker.plan(100.0, book.load()).step_ids]
        woken = len(talker_wakes)
        turn = turns[0]
        assert turn is not None
        vocoder.update(turn, backend.vocode(turn.items), 100.0)  # one worker's turn ends
        assert vocoder.schedule(100.0) is None  # ... and it finds nothing to take
        plans.append(book.talker.plan(100.0, book.load()).step_ids)
        # the freed core woke the talker
        assert busy_max_queued_s == 0 or any(t < 2 for t in talker_wakes[woken:])
        return plans

    busy, freed = run(2.0)
    assert busy == ()  # both streams have 4 s waiting for the vocoder, over the 2 s cap
    assert len(freed) == 2  # a free worker: the talker runs ahead for both
    # no cap: two workers decoding is not "busy", the talker runs ahead for both
    assert [len(plan) for plan in run(0.0)] == [2, 2]
