"""The engine's pure parts: segment frame queues, and the stream book on a fake clock,
driven as the engine's stage drivers drive it: the talker core's and the vocoder core's
`schedule` / `update` around real sim backend calls (a segment's urgency, the even tail,
chunks ahead of a lone stream)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np
import pytest

from pipeline.backend import TalkRequest, TalkStep, Voice
from pipeline.backends.sim import SimBackend, SimSegment
from pipeline.book import StreamBook, Wakes
from pipeline.config import SimConfig, TalkerConfig, TextConfig
from pipeline.events import NullEvents
from pipeline.frames import Segment, StreamFrames
from pipeline.load import UrgentSlack
from pipeline.records import OpenSegment, StreamRecord
from pipeline.stream import Stream
from pipeline.talker_core import TalkOutcome, TalkPlan, run_talk, talker_order
from pipeline.text import Segmenter, segment_options
from pipeline.vocoder_core import VocodePlan
from scheduling import ChunkingConfig, ChunkPlanner, PlaybackScheduler, SchedulingConfig


def _piece(first: int, count: int) -> np.ndarray:
    return np.arange(first, first + count, dtype=np.int64).reshape(-1, 1)


def test_segment_slices_across_pieces_and_frees_whole_pieces() -> None:
    segment = Segment(0)
    for first, count in [(0, 4), (4, 4), (8, 2)]:
        segment.append(_piece(first, count))
    assert segment.available_frames == 10
    assert segment.frames(2, 9).ravel().tolist() == list(range(2, 9))
    inside = segment.frames(4, 7)
    assert np.shares_memory(inside, segment.frames(4, 8))  # one piece: a view, no copy
    segment.free_before(5)  # the first piece ends at 4 <= 5; the second is still needed
    assert segment.held_frames == 6
    assert segment.frames(4, 10).ravel().tolist() == list(range(4, 10))
    with pytest.raises(IndexError):
        segment.frames(3, 6)
    segment.done = True
    with pytest.raises(RuntimeError):
        segment.append(_piece(10, 1))


def test_stream_frames_count_queued_and_drop_emitted_segments() -> None:
    frames = StreamFrames()
    first = frames.open_segment(0)
    frames.append(first, _piece(0, 6))
    second = frames.open_segment(1)
    frames.append(second, _piece(6, 3))
    assert (frames.queued_frames, frames.held_frames, frames.current) == (9, 9, first)
    frames.emitted(4, free_before=4)
    assert frames.queued_frames == 5
    frames.emitted(2, free_before=6)
    frames.close_current()
    assert frames.current is second and frames.held_frames == 3
    with pytest.raises(ValueError):
        frames.open_segment(1)
    frames.clear()
    assert frames.current is None and frames.held_frames == 0


def _fake_clock_book(
    now: list[float],
    chunking: ChunkingConfig,
    vocoder_wake: Callable[[], None] = lambda: None,
    *,
    batch: int = 1,
    start_wake: Callable[[], None] = lambda: None,
    **options: Any,
) -> StreamBook:
    """A stream book on the clock `now[0]`, sentences uncut and no cap, the talker order
    the engine builds (talker.batch `batch`); no wakes but the vocoder's (`vocoder_wake`)
    and a start slot's (`start_wake`)."""
    scheduling = SchedulingConfig()
    return StreamBook(
        scheduler=PlaybackScheduler(scheduling),
        planner=ChunkPlanner(chunking),
        order=talker_order(TalkerConfig(batch=batch), scheduling),
        segmenter=partial(Segmenter, **segment_options(TextConfig(first_fragment_words=0))),
        max_pending_audio_s=1e9,
        clock=lambda: now[0],
        events=NullEvents(),
        wakes=Wakes(talker=lambda: None, vocoder=vocoder_wake, start=start_wake),
        **options,
    )


def _sim(frames_per_step: int) -> SimBackend:
    """The sim backend at no cost (its calls return at once)."""
    return SimBackend(SimConfig(talker_frames_per_step=frames_per_step), sleep=lambda _s: None)


def _submitted(book: StreamBook, voice: Voice, text: str) -> tuple[Stream, StreamRecord]:
    """A stream of `text` (all of it, final) added at 100.0, and its record."""
    stream = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(stream.id, text, final=True)
    record = book.record(stream.id)
    assert record is not None
    return stream, record


def _prepared_nothing(stream_id: str, request: TalkRequest, done: Future[object] | None) -> None:
    assert done is None  # the sim backend prepares nothing


def _talk(
    book: StreamBook, backend: SimBackend, now_s: float, watch: Any = _prepared_nothing
) -> tuple[TalkPlan, TalkOutcome]:
    """One talker call as the engine's driver makes it: plan, run, apply."""
    plan = book.talker.schedule(now_s)
    assert plan is not None
    outcome = run_talk(backend, plan, watch)
    book.talker.update(plan, outcome, now_s)
    return plan, outcome


def _vocode(book: StreamBook, backend: SimBackend, plan: VocodePlan | None, now_s: float) -> None:
    """A vocoder worker's call for `plan` (from `book.vocoder.schedule`): decode, apply."""
    assert plan is not None
    book.vocoder.update(plan, backend.vocode(plan.items), now_s)


def _one(plan: VocodePlan | None, record: StreamRecord) -> int:
    """The frames of `record`'s chunk, the only one the plan takes."""
    assert plan is not None
    ((taken, chunk),) = plan.batch
    assert taken is record
    return chunk.frames


def _opened(plan: TalkPlan | None, record: StreamRecord) -> OpenSegment:
    """`record`'s segment in a talker plan."""
    assert plan is not None
    (opened,) = [o for o in plan.batch if o.record is record]
    return opened


def test_a_segment_is_urgent_until_its_stream_has_a_second_of_audio_ahead() -> None:
    """`TalkRequest.urgent` (talker.urgent_slack_s, 1 s): a stream's segment is opened
    urgent while the stream has no audio, or less than 1 s ahead of its player (in the
    player plus talked, not yet vocoded). Three streams in the same state: 20 frames of
    80 ms (1.6 s) sent at 100.0 and 5 more talked (0.4 s), so 2.0 s ahead at 100.0, 1.2 s
    at 100.8 (0.8 s of it in the player) and 0.8 s at 101.2. The talker takes one stream
    a call (talker.batch 1), and its calls at 100.8 and 101.2 run while the earlier ones
    still run (so each opens the next stream's segment: the same state, a later time)."""
    now = [100.0]
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    frame_s = voice.samples_per_frame / voice.sample_rate_hz
    book = _fake_clock_book(now, ChunkingConfig(chunk_frames=20), urgent=UrgentSlack(1.0))
    text = "One two three four five sixty. Six seven eight nine ten."  # 25 frames, then more
    records = []
    for _ in range(3):
        stream, record = _submitted(book, voice, text)
        # the newcomer (no audio) comes before the streams with 2 s ahead
        plan, outcome = _talk(book, backend, 100.0)
        assert plan.stream_ids == (stream.id,)
        assert _opened(plan, record).request.urgent  # no audio yet
        (step,) = outcome.results
        assert len(step.frames) == 25 and step.done
        # its first chunk before the others' last 5 frames (its first audio is due)
        plan = book.vocoder.schedule(100.0)
        assert _one(plan, record) == 20
        _vocode(book, backend, plan, 100.0)
        assert book.scheduler.horizon_s(stream.id) == pytest.approx(100.0 + 20 * frame_s)
        records.append(record)
    # 1.6 + 0.4 s ahead; the first in arrival order
    assert not _opened(book.talker.schedule(100.0), records[0]).request.urgent
    now[0] = 100.8
    assert not _opened(book.talker.schedule(100.8), records[1]).request.urgent  # 0.8 + 0.4 s
    now[0] = 101.2
    assert _opened(book.talker.schedule(101.2), records[2]).request.urgent  # 0.4 + 0.4 s


@pytest.mark.parametrize(("now_s", "urgent"), [(100.0, False), (102.0, True)])
def test_a_chunk_waits_for_its_lookahead_unless_its_player_is_close_to_running_dry(
    now_s: float, urgent: bool
) -> None:
    """Chunks of 8 frames with 2 of lookahead, talker steps of 10: after four steps and
    four chunks (32 frames, 2.56 s, sent at 100.0) the stream has 8 frames made, not
    their lookahead. At 100.0 (2.56 s ahead of its player) the chunk waits for the next
    step; at 102.0 (0.56 s ahead, under talker.urgent_slack_s) 6 frames go now, the last
    2 their lookahead, and the next chunk starts after them."""
    book = _fake_clock_book(
        [100.0], ChunkingConfig(chunk_frames=8, right_context_frames=2), urgent=UrgentSlack(1.0)
    )
    backend = _sim(10)
    voice = backend.voices()[0]
    stream, record = _submitted(
        book, voice, "one two three four five six seven eight nine ten eleven"
    )
    vocoder = book.vocoder
    for _ in range(4):
        _talk(book, backend, 100.0)
        plan = vocoder.schedule(100.0)
        assert _one(plan, record) == 8  # 10 frames more each step: a whole chunk each
        _vocode(book, backend, plan, 100.0)
    assert record.frames.current is not None and record.frames.current.available_frames == 40
    assert book.scheduler.slack_s(stream.id, 100.0) == pytest.approx(2.56)
    plan = vocoder.schedule(now_s)
    if not urgent:
        assert plan is None
    else:
        assert _one(plan, record) == 6
        assert plan is not None and plan.batch[0][1][:4] == (32, 38, 32, 40)
        _vocode(book, backend, plan, now_s)
    _talk(book, backend, now_s)  # its last step
    plan = vocoder.schedule(now_s)
    assert plan is not None and plan.batch[0][1][:2] == ((38, 46) if urgent else (32, 40))


@pytest.mark.parametrize(
    ("first", "urgent"), [("One two three four five sixty.", False), ("Hi.", True)]
)
def test_before_its_first_audio_a_stream_is_urgent_by_the_audio_talked(
    first: str, urgent: bool
) -> None:
    """A stream whose first segment is talked but none of it vocoded yet: its next
    segment is urgent only if that audio is under urgent_slack_s (1 s): 25 frames of 80 ms
    (2 s) are not, 3 frames are."""
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book([100.0], ChunkingConfig(chunk_frames=20), urgent=UrgentSlack(1.0))
    stream, record = _submitted(book, voice, f"{first} Six seven eight.")
    plan, outcome = _talk(book, backend, 100.0)
    assert _opened(plan, record).request.urgent  # nothing talked yet
    assert outcome.results[0].done
    assert book.scheduler.slack_s(stream.id, 100.0) is None  # no audio sent
    opened = _opened(book.talker.schedule(100.0), record)
    assert opened.request.segment_index == 1
    assert opened.request.urgent == urgent


@pytest.mark.parametrize("others", [0, 1])
def test_a_stream_alone_is_urgent_only_closer_to_its_player(others: int) -> None:
    """alone.urgent_slack_s (0.3 s here) replaces urgent_slack_s (1 s) while the
    stream is the only one with work left: at 0.8 s ahead (0.4 s in the player, 0.4 s
    talked) its next segment is not urgent alone, and is with another stream waiting
    (the call takes both: talker.batch 2)."""
    now = [100.0]
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book(
        now, ChunkingConfig(chunk_frames=20), batch=2, urgent=UrgentSlack(1.0, 0.3)
    )
    _, record = _submitted(book, voice, "One two three four five sixty. Six seven eight.")
    plan, outcome = _talk(book, backend, 100.0)
    assert _opened(plan, record).request.urgent  # no audio yet: urgent alone too
    assert len(outcome.results[0].frames) == 25
    plan = book.vocoder.schedule(100.0)
    assert _one(plan, record) == 20
    _vocode(book, backend, plan, 100.0)
    for _ in range(others):
        other = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(other.id, "Hello there.", final=True)
    now[0] = 101.2  # 0.4 s left in the player, 0.4 s talked
    plan = book.talker.schedule(101.2)
    assert plan is not None and len(plan.batch) == 1 + others
    assert _opened(plan, record).request.urgent == (others > 0)


@pytest.mark.parametrize("even_tail", [True, False])
def test_a_lone_stream_all_talked_is_cut_evenly_over_the_workers(even_tail: bool) -> None:
    """alone.even_tail: a stream alone on two vocoder workers (work-ahead applies)
    whose text is all talked has its frames past the first chunk cut into an even number
    of chunks of near-equal size, not plain chunks of 6 and a short last one; with
    another stream waiting, or the option off, plain chunks."""
    backend = _sim(1000)  # a segment per step

    def chunk_sizes(others: int) -> list[int]:
        voice = backend.voices()[0]
        book = _fake_clock_book(
            [100.0], ChunkingConfig(chunk_frames=6), vocoder_workers=2, even_tail=even_tail
        )
        stream = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(stream.id, "one two three four five six seven eight nine", final=True)
        for _ in range(others):
            other = book.add_stream(voice, speed=1.0, now_s=100.0)
            book.add_text(other.id, "Hello there.", final=True)
        record = book.record(stream.id)
        assert record is not None
        plan, outcome = _talk(book, backend, 100.0)  # the first in arrival order
        assert plan.stream_ids == (stream.id,)
        (step,) = outcome.results
        assert len(step.frames) == 37 and step.done
        sizes = []
        while (vocode := book.vocoder.schedule(100.0)) is not None:
            sizes.append(_one(vocode, record))
            _vocode(book, backend, vocode, 100.0)
        assert book.record(stream.id) is None  # all its audio was sent
        return sizes

    plain = [6, 6, 6, 6, 6, 6, 1]  # the last frame would decode alone
    # the first chunk as planned (first audio), then 31 frames in 6 chunks
    assert chunk_sizes(0) == ([6, 6, 5, 5, 5, 5, 5] if even_tail else plain)
    assert chunk_sizes(1) == plain


@pytest.mark.parametrize(("first_call_s", "others"), [(0.01, 0), (0.03, 0), (0.01, 1)])
def test_a_lone_stream_all_talked_is_cut_evenly_within_the_ramp_when_its_player_can_wait(
    first_call_s: float, others: int
) -> None:
    """alone.even_tail within the ramp: 37 frames of 80 ms all talked, ramp 2, 4, 8 and
    steady chunks of 20. The first chunk (2 frames, 160 ms of audio) decodes alone, in
    `first_call_s`; then the player holds 160 ms. At 10 ms a call (5 ms a frame) that
    covers chunks of 32 frames: the 35 left go at once as two near-equal chunks (18, 17)
    instead of the ramp's 4 and 8 and two more. At 30 ms (15 ms a frame: 10 frames) the
    player could run dry during an 18-frame decode: the ramp goes on, and the even cut
    comes past it (12, 11). With another stream waiting (not alone): plain chunks."""
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book(
        [100.0], ChunkingConfig(chunk_frames=20, ramp=(2, 4, 8)), vocoder_workers=2
    )
    stream, record = _submitted(book, voice, "one two three four five six seven eight nine")
    for _ in range(others):
        other = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(other.id, "Hello there.", final=True)
    _talk(book, backend, 100.0)
    now_s, sizes = 100.0, []
    while (plan := book.vocoder.schedule(now_s)) is not None:
        if plan.batch[0][0] is not record:
            _vocode(book, backend, plan, now_s)  # the other stream's
            continue
        sizes.append(_one(plan, record))
        now_s += first_call_s if len(sizes) == 1 else 0.0
        _vocode(book, backend, plan, now_s)
    assert book.record(stream.id) is None  # all its audio was sent
    if others:
        assert sizes == [2, 4, 8, 20, 3]
    else:
        assert sizes == ([2, 18, 17] if first_call_s == 0.01 else [2, 4, 8, 12, 11])


def test_a_best_effort_job_alone_is_cut_evenly_at_once() -> None:
    """A best-effort job's virtual player never comes due (horizon at infinity): alone and
    all talked, the frames past its first chunk go at once as two near-equal chunks, and
    the infinite slack is no chunk size (it raised OverflowError in the vocoder's loop, and
    the engine failed every stream)."""
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book(
        [100.0], ChunkingConfig(chunk_frames=20, ramp=(2, 4, 8)), vocoder_workers=2
    )
    stream = book.add_stream(voice, speed=1.0, now_s=100.0, job_pace=(math.inf, 0.0))
    book.add_text(stream.id, "one two three four five six seven eight nine", final=True)
    record = book.record(stream.id)
    assert record is not None
    _talk(book, backend, 100.0)
    now_s, sizes = 100.0, []
    while (plan := book.vocoder.schedule(now_s)) is not None:
        sizes.append(_one(plan, record))
        now_s += 0.01
        _vocode(book, backend, plan, now_s)
    assert book.record(stream.id) is None  # all its audio was sent
    assert sizes == [2, 18, 17]


@pytest.mark.parametrize("case", ["alone", "another", "vocoding", "vocoded", "prepares"])
def test_a_segment_gets_every_core_only_when_nothing_else_runs(case: str) -> None:
    """`TalkRequest.all_cores`: a segment opened for a stream alone, while no vocode call
    runs and nothing is prepared beside it, may use every core (its first segment, or its
    second once the first one's chunk was sent); not with another stream waiting, while
    a vocode call runs (the first segment's chunk), or with the stream's next sentence
    prepared on the helper thread at once."""
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book([100.0], ChunkingConfig(chunk_frames=50), prepares=case == "prepares")
    two = case in ("vocoding", "vocoded", "prepares")
    _, record = _submitted(book, voice, "One two three. Four five six." if two else "One two.")
    if case == "another":
        waiting = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(waiting.id, "Hello there.", final=True)
    if case in ("vocoding", "vocoded"):
        first, _ = _talk(book, backend, 100.0)  # the first sentence, all of it
        assert _opened(first, record).request.all_cores
        vocode = book.vocoder.schedule(100.0)
        assert _one(vocode, record) == 12  # its one chunk
        if case == "vocoded":
            _vocode(book, backend, vocode, 100.0)
    plan = book.talker.schedule(100.0)
    assert _opened(plan, record).request.all_cores == (case in ("alone", "vocoded"))


class _PausingSim(SimBackend):
    """The sim backend at no cost whose next `pauses` steps make no frames (a step may
    hold none: `TalkStep.frames`)."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config, sleep=lambda _s: None)
        self.pauses = 0

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        if self.pauses:
            self.pauses -= 1
            return [TalkStep(np.empty((0, 2), dtype=np.int64), False) for _ in segments]
        return super().step(segments)


def test_no_chunk_ahead_of_a_lone_stream_while_its_talker_step_runs() -> None:
    """A lone stream whose chunk is being decoded offers its next chunk (`ahead_ids`) to a
    second worker only while no talker call steps it; the call's end wakes the vocoder
    (once: this step made no frames, so nothing else does), whose free worker then takes
    it."""
    vocoder_wakes: list[None] = []
    book = _fake_clock_book(
        [100.0],
        ChunkingConfig(chunk_frames=4),
        lambda: vocoder_wakes.append(None),
        vocoder_workers=2,
    )
    backend = _PausingSim(SimConfig(talker_frames_per_step=12))
    voice = backend.voices()[0]
    stream, record = _submitted(book, voice, "one two three four five six seven eight nine ten")
    vocoder = book.vocoder
    _talk(book, backend, 100.0)  # 12 of its 40 frames
    first = vocoder.schedule(100.0)
    assert _one(first, record) == 4
    _vocode(book, backend, first, 100.0)  # its first chunk leaves (it decodes alone)
    second = vocoder.schedule(100.0)  # a worker takes the next chunk
    assert _one(second, record) == 4
    vocoder.refresh(book.load(), 100.0)
    assert stream.id in vocoder.ahead_ids(book.load())  # its talker idles: a worker may help
    talking = book.talker.schedule(100.0)  # a talker call steps it now
    assert talking is not None and talking.stream_ids == (stream.id,)
    assert stream.id not in vocoder.ahead_ids(book.load())
    assert vocoder.schedule(100.0) is None  # the free worker takes nothing
    backend.pauses = 1
    outcome = run_talk(backend, talking, _prepared_nothing)
    assert len(outcome.results[0].frames) == 0
    vocoder_wakes.clear()
    book.talker.update(talking, outcome, 100.0)
    assert len(vocoder_wakes) == 1  # the call's end woke the vocoder
    ahead = vocoder.schedule(100.0)
    assert _one(ahead, record) == 4  # the chunk after the one in flight: two in flight now
    assert second is not None and ahead is not None
    assert ahead.batch[0][1].start == second.batch[0][1].stop
    assert len(record.in_flight) == 2
    _vocode(book, backend, ahead, 100.0)  # decoded first: held until the one before it
    assert record.frames.emitted_frames == 4
    _vocode(book, backend, second, 100.0)
    assert record.frames.emitted_frames == 12 and not record.in_flight
    _talk(book, backend, 100.0)  # its steps make frames again
    assert record.frames.produced_frames == 24


class _PreparingSim(SimBackend):
    """The sim backend whose segment preparations run until the test ends them."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config, sleep=lambda _s: None)
        self.preparations: dict[int, Future[object]] = {}  # by segment index

    def prepare_segment(self, request: TalkRequest) -> Future[object]:
        done: Future[object] = Future()
        self.preparations[request.segment_index] = done
        return done


def test_no_chunk_ahead_of_a_lone_stream_while_its_next_segment_is_prepared() -> None:
    """The backend prepares a lone stream's next segment (its encoder on a helper thread;
    `prepares`: alone.prepare_next) from the talker call that opens the one
    before: meanwhile the stream counts as talking, no chunk of it is offered ahead, so the
    helper has the idle core; the preparation's end wakes the vocoder. The talker itself
    may still step the stream meanwhile (the preparation is not a step). A preparation
    that ends after its segment was opened changes nothing."""
    vocoder_wakes: list[None] = []
    book = _fake_clock_book(
        [100.0],
        ChunkingConfig(chunk_frames=4),
        lambda: vocoder_wakes.append(None),
        vocoder_workers=2,
        prepares=True,
    )
    backend = _PreparingSim(SimConfig(talker_frames_per_step=12))
    voice = backend.voices()[0]
    stream = book.add_stream(voice, speed=1.0, now_s=100.0)
    # 20, 21, 12 and 12 frames
    text = "One two three four five. Six seven eight nine ten. Eleven twelve. Thirteen fourteen."
    book.add_text(stream.id, text, final=True)
    record = book.record(stream.id)
    assert record is not None
    talker, vocoder = book.talker, book.vocoder

    def watch(stream_id: str, request: TalkRequest, done: Future[object] | None) -> None:
        """The talker driver's watch: the preparation's end is booked when it is done."""
        assert done is not None
        index = request.segment_index
        done.add_done_callback(lambda _: talker.prepare_ended(stream_id, index))

    plan, _ = _talk(book, backend, 100.0, watch)  # opens segment 0, prepares segment 1
    ((prepared_id, ahead),) = plan.prepare
    assert prepared_id == stream.id
    assert ahead.text.startswith("Six") and ahead.segment_index == 1
    assert record.preparing == 1 and set(backend.preparations) == {1}
    first = vocoder.schedule(100.0)
    assert _one(first, record) == 4
    _vocode(book, backend, first, 100.0)
    second = vocoder.schedule(100.0)  # a worker takes the next chunk
    assert _one(second, record) == 4
    assert vocoder.schedule(100.0) is None  # none ahead while it is prepared
    assert stream.id not in vocoder.ahead_ids(book.load())
    plan, _ = _talk(book, backend, 100.0, watch)  # the talker steps it meanwhile
    assert plan.stream_ids == (stream.id,) and plan.prepare == []
    assert record.talking is None  # segment 0 done (20 frames)
    vocoder.refresh(book.load(), 100.0)
    assert stream.id not in vocoder.ahead_ids(book.load())  # still prepared
    vocoder_wakes.clear()
    backend.preparations[1].set_result(None)
    assert record.preparing is None
    assert stream.id in vocoder.ahead_ids(book.load())
    assert len(vocoder_wakes) == 1
    talker.prepare_ended(stream.id, 1)  # a second end is harmless
    assert record.preparing is None and len(vocoder_wakes) == 1
    ahead_chunk = vocoder.schedule(100.0)  # the free worker takes the chunk ahead
    assert _one(ahead_chunk, record) == 4 and len(record.in_flight) == 2
    plan, _ = _talk(book, backend, 100.0, watch)  # opens segment 1, prepares segment 2
    assert plan.prepare[0][1].segment_index == 2 and record.preparing == 2
    _talk(book, backend, 100.0, watch)  # segment 1's last 9 frames
    assert record.talking is None
    plan, _ = _talk(book, backend, 100.0, watch)  # opens segment 2, prepares segment 3
    assert plan.prepare[0][1].segment_index == 3 and record.preparing == 3
    backend.preparations[2].set_result(None)  # the opened one's late end
    assert record.preparing == 3  # holds the one being prepared
    plan, _ = _talk(book, backend, 100.0, watch)  # opens segment 3, the last: none prepared
    assert plan.prepare == [] and record.preparing is None
    backend.preparations[3].set_result(None)
    assert record.preparing is None


def test_a_stream_offered_ahead_has_its_chunk_after_another_stream_came_and_went() -> None:
    """Three workers: a lone stream has two chunks in flight and its third planned ahead;
    another stream arrives (not alone: no chunk ahead), one of the first stream's chunks
    is sent, the other stream is cancelled (alone again). A stream offered ahead then has
    its chunk planned, and the stream's audio all leaves, in order."""
    book = _fake_clock_book([100.0], ChunkingConfig(chunk_frames=4), vocoder_workers=3)
    backend = _sim(40)
    voice = backend.voices()[0]
    stream, record = _submitted(book, voice, "one two three four five six seven eight nine ten")
    _talk(book, backend, 100.0)  # all 40 frames
    vocoder = book.vocoder
    first = vocoder.schedule(100.0)
    _vocode(book, backend, first, 100.0)  # its first audio, decoded alone
    turns = [vocoder.schedule(100.0), vocoder.schedule(100.0)]  # two workers, side by side
    assert [_one(turn, record) for turn in turns] == [4, 4]
    vocoder.refresh(book.load(), 100.0)
    assert stream.id in vocoder.ahead_ids(book.load())  # a third worker may take the next
    other = book.add_stream(voice, speed=1.0, now_s=100.0)
    assert not vocoder.ahead_ids(book.load())
    _vocode(book, backend, turns[0], 100.0)
    vocoder.refresh(book.load(), 100.0)
    book.cancel(other.id)
    vocoder.refresh(book.load(), 100.0)
    # offered ahead only with its chunk planned
    assert stream.id not in vocoder.ahead_ids(book.load()) or record.chunk is not None
    _vocode(book, backend, turns[1], 100.0)
    while (plan := vocoder.schedule(100.0)) is not None:
        _vocode(book, backend, plan, 100.0)
    assert book.record(stream.id) is None  # all sent
    assert stream.stats.audio_s == pytest.approx(
        40 * voice.samples_per_frame / voice.sample_rate_hz
    )


def test_a_live_text_stream_waiting_for_its_text_leaves_another_alone() -> None:
    """A live-text stream (a voice agent's socket) that sent all it had has no work until
    its next text: a request beside it is alone (work-ahead, preparation...); once the
    text comes, neither is."""
    book = _fake_clock_book([100.0], ChunkingConfig(chunk_frames=4), vocoder_workers=2)
    backend = _sim(1000)  # a segment per step
    voice = backend.voices()[0]
    live = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(live.id, "Hello there.", final=False, flush=True)
    _talk(book, backend, 100.0)
    while (plan := book.vocoder.schedule(100.0)) is not None:
        _vocode(book, backend, plan, 100.0)
    record = book.record(live.id)
    assert record is not None and record.waits_for_text  # all it had was sent
    other = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(other.id, "one two three four five six seven eight nine", final=True)
    assert book.load().alone  # the socket waits: the request has the machine
    book.add_text(live.id, "And more.", final=False, flush=True)
    assert not book.load().alone


def _start_phase_book(freed: list[int]) -> StreamBook:
    """A book whose streams start until their 2nd chunk (ramp 2 + 2 frames, steady
    chunks of 8): admission's start-phase tracking, `freed` counting the slots freed."""
    chunking = ChunkingConfig(chunk_frames=8, ramp=[2, 2])
    return _fake_clock_book(
        [100.0], chunking, start_wake=lambda: freed.append(1), start_phase_chunks=2
    )


def _starting(book: StreamBook) -> bool:
    """Whether the book's one stream counts as starting for admission."""
    (load,) = book.loads(1.0)
    return load.start_left_audio_s > 0


def _vocode_all(book: StreamBook, backend: SimBackend) -> None:
    while (plan := book.vocoder.schedule(100.0)) is not None:
        _vocode(book, backend, plan, 100.0)


def test_a_stream_starts_until_its_talker_made_its_first_steady_chunk() -> None:
    """Past its start-phase chunks a stream still counts as starting (admission charges
    its start cost) while the frames of its first steady chunk are not talked: that step
    is the work a start owes up front (a Piper voice's second flow step, queued behind
    the other starters'). The talker makes 4 frames a step: after the first, the ramp's
    two chunks are sent and none of the next 8 frames exist; after the third, they do."""
    freed: list[int] = []
    book = _start_phase_book(freed)
    backend = _sim(4)
    stream = book.add_stream(backend.voices()[0], speed=1.0, now_s=100.0)
    book.add_text(stream.id, "one two three four five six seven eight nine ten. " * 3, final=True)
    record = book.record(stream.id)
    assert record is not None
    assert _starting(book)
    _talk(book, backend, 100.0)
    _vocode_all(book, backend)
    assert stream.stats.chunks == 2 and record.frames.queued_frames == 0
    assert _starting(book) and not freed  # its start-phase chunks are sent, the talk is owed
    _talk(book, backend, 100.0)
    assert record.frames.queued_frames == 4
    assert _starting(book) and not freed
    _talk(book, backend, 100.0)
    assert record.frames.queued_frames == 8
    assert not _starting(book) and freed == [1]  # its first steady chunk's frames are made


def test_a_short_stream_talked_all_leaves_its_start_phase_with_its_chunks() -> None:
    """A stream whose text is all talked owes no talk: it stops starting at its start-phase
    chunks, though fewer frames than a steady chunk are left."""
    freed: list[int] = []
    book = _start_phase_book(freed)
    backend = _sim(1000)  # a segment per step
    stream = book.add_stream(backend.voices()[0], speed=1.0, now_s=100.0)
    book.add_text(stream.id, "One, two.", final=True)
    record = book.record(stream.id)
    assert record is not None
    _talk(book, backend, 100.0)
    assert record.talked_all
    assert _starting(book) and not freed
    _vocode(book, backend, book.vocoder.schedule(100.0), 100.0)
    assert stream.stats.chunks == 1
    assert _starting(book) and not freed
    _vocode(book, backend, book.vocoder.schedule(100.0), 100.0)
    assert stream.stats.chunks == 2 and 0 < record.frames.queued_frames < 8
    assert not _starting(book) and freed == [1]


def test_a_whole_segment_chunk_owes_no_more_than_its_text() -> None:
    """A chunking of whole segments (Kokoro's: 4096 frames, a 100 s chunk) makes a
    short stream owe its text's audio, not a chunk's: the start chunk is bounded by the
    text (owing >= 102 s each, a burst on Kokoro alone was refused with a 36 s
    Retry-After for streams that ended in 2 s). A chunk shorter than the text still
    floors what a stream owes."""
    book = _fake_clock_book([100.0], ChunkingConfig(chunk_frames=4096), start_phase_chunks=3)
    voice = _sim(4).voices()[0]
    chunk_s = 4096 * voice.samples_per_frame / voice.sample_rate_hz
    text = "Two short words."
    text_s = len(text) * 0.07  # the table's audio per character before any was talked
    _submitted(book, voice, text)
    (load,) = book.loads(chunk_s)
    assert chunk_s > 50 * text_s
    assert load.owed_audio_s == pytest.approx(text_s)
    assert 0 < load.start_left_audio_s <= 3 * text_s + 1e-9
    (small,) = book.loads(0.01)  # a chunk shorter than the text: the text's audio owed
    assert small.owed_audio_s == pytest.approx(text_s)
    assert small.start_left_audio_s == pytest.approx(0.03)
