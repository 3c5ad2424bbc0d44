"""The engine's pure parts: segment frame queues, the capacity estimate, and the stream
book on a fake clock (a segment's urgency, solo chunks)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest

from pipeline.backends.sim import SimBackend
from pipeline.book import StreamBook, StreamRecord, Wakes
from pipeline.config import SimConfig, TextConfig
from pipeline.events import NullEvents
from pipeline.frames import Segment, StreamFrames
from pipeline.text import Segmenter, segment_options
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
    **options: Any,
) -> StreamBook:
    """A stream book on the clock `now[0]`, sentences uncut and no cap; no wakes but the
    vocoder's (`vocoder_wake`)."""
    return StreamBook(
        scheduler=PlaybackScheduler(SchedulingConfig()),
        planner=ChunkPlanner(chunking),
        segmenter=partial(Segmenter, **segment_options(TextConfig(first_fragment_words=0))),
        max_pending_audio_s=1e9,
        left_context_frames=0,
        first_chunk_s=0.1,
        clock=lambda: now[0],
        events=NullEvents(),
        wakes=Wakes(talker=lambda: None, vocoder=vocoder_wake),
        **options,
    )


def test_a_segment_is_urgent_until_its_stream_has_a_second_of_audio_ahead() -> None:
    """`TalkRequest.urgent` (talker.urgent_slack_s, 1 s): a stream's segment is opened
    urgent while the stream has no audio, or less than 1 s ahead of its player (in the
    player plus talked, not yet vocoded). Three streams in the same state: 20 frames of
    80 ms (1.6 s) sent at 100.0 and 5 more talked (0.4 s), so 2.0 s ahead at 100.0, 1.2 s
    at 100.8 (0.8 s of it in the player) and 0.8 s at 101.2."""
    now = [100.0]
    backend = SimBackend(SimConfig(talker_frames_per_step=1000))  # a segment per step
    voice = backend.voices()[0]
    frame_s = voice.samples_per_frame / voice.sample_rate_hz
    book = _fake_clock_book(now, ChunkingConfig(chunk_frames=20), urgent_slack_s=1.0)
    text = "One two three four five sixty. Six seven eight nine ten."  # 25 frames, then more
    records = []
    for _ in range(3):
        stream = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(stream.id, text, final=True)
        record = book.record(stream.id)
        assert record is not None
        opened = book.open_segment(record)
        assert opened.request.urgent  # no audio yet
        (step,) = backend.step([backend.open_segment(opened.request)])
        assert len(step.frames) == 25 and step.done
        book.talked(opened, step.frames, step.done)
        book.refresh()
        chunk = record.chunk
        assert chunk is not None and chunk.frames == 20
        book.start_vocoding(record)
        pcm = np.zeros(chunk.frames * voice.samples_per_frame, dtype=np.float32)
        book.emit(record, chunk, pcm, 100.0)
        assert book.scheduler.horizon_s(stream.id) == pytest.approx(100.0 + 20 * frame_s)
        records.append(record)
    assert not book.open_segment(records[0]).request.urgent  # 1.6 + 0.4 s ahead
    now[0] = 100.8
    assert not book.open_segment(records[1]).request.urgent  # 0.8 + 0.4 s ahead
    now[0] = 101.2
    assert book.open_segment(records[2]).request.urgent  # 0.4 + 0.4 s ahead


@pytest.mark.parametrize(
    ("first", "urgent"), [("One two three four five sixty.", False), ("Hi.", True)]
)
def test_before_its_first_audio_a_stream_is_urgent_by_the_audio_talked(
    first: str, urgent: bool
) -> None:
    """A stream whose first segment is talked but none of it vocoded yet: its next
    segment is urgent only if that audio is under urgent_slack_s (1 s): 25 frames of 80 ms
    (2 s) are not, 3 frames are."""
    backend = SimBackend(SimConfig(talker_frames_per_step=1000))  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book([100.0], ChunkingConfig(chunk_frames=20), urgent_slack_s=1.0)
    stream = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(stream.id, f"{first} Six seven eight.", final=True)
    record = book.record(stream.id)
    assert record is not None
    opened = book.open_segment(record)
    assert opened.request.urgent  # nothing talked yet
    (step,) = backend.step([backend.open_segment(opened.request)])
    book.talked(opened, step.frames, step.done)
    assert book.scheduler.slack_s(stream.id, 100.0) is None  # no audio sent
    assert book.open_segment(record).request.urgent == urgent


@pytest.mark.parametrize("others", [0, 1])
def test_a_stream_alone_is_urgent_only_closer_to_its_player(others: int) -> None:
    """talker.alone_urgent_slack_s (0.3 s here) replaces urgent_slack_s (1 s) while the
    stream is the only one with work left: at 0.8 s ahead (0.4 s in the player, 0.4 s
    talked) its next segment is not urgent alone, and is with another stream waiting."""
    now = [100.0]
    backend = SimBackend(SimConfig(talker_frames_per_step=1000))  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book(
        now, ChunkingConfig(chunk_frames=20), urgent_slack_s=1.0, alone_urgent_slack_s=0.3
    )
    stream = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(stream.id, "One two three four five sixty. Six seven eight.", final=True)
    record = book.record(stream.id)
    assert record is not None
    opened = book.open_segment(record)
    assert opened.request.urgent  # no audio yet: urgent alone too
    (step,) = backend.step([backend.open_segment(opened.request)])
    assert len(step.frames) == 25
    book.talked(opened, step.frames, step.done)
    book.refresh()
    chunk = record.chunk
    assert chunk is not None and chunk.frames == 20
    book.start_vocoding(record)
    book.emit(record, chunk, np.zeros(chunk.frames * voice.samples_per_frame, np.float32), 100.0)
    for _ in range(others):
        other = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(other.id, "Hello there.", final=True)
    now[0] = 101.2  # 0.4 s left in the player, 0.4 s talked
    assert book.open_segment(record).request.urgent == (others > 0)


@pytest.mark.parametrize("even_tail", [True, False])
def test_a_lone_stream_all_talked_is_cut_evenly_over_the_workers(even_tail: bool) -> None:
    """chunking.even_tail: a stream alone on two vocoder workers (work-ahead applies)
    whose text is all talked has its frames past the first chunk cut into an even number
    of chunks of near-equal size, not plain chunks of 6 and a short last one; with
    another stream waiting, or the option off, plain chunks."""
    backend = SimBackend(SimConfig(talker_frames_per_step=1000))  # a segment per step
    voice = backend.voices()[0]

    def chunk_sizes(others: int) -> list[int]:
        book = _fake_clock_book(
            [100.0],
            ChunkingConfig(chunk_frames=6, even_tail=even_tail),
            max_in_flight=2,
            work_ahead_streams=1,
            vocoder_workers=2,
        )
        stream = book.add_stream(voice, speed=1.0, now_s=100.0)
        book.add_text(stream.id, "one two three four five six seven eight nine", final=True)
        for _ in range(others):
            other = book.add_stream(voice, speed=1.0, now_s=100.0)
            book.add_text(other.id, "Hello there.", final=True)
        record = book.record(stream.id)
        assert record is not None
        opened = book.open_segment(record)
        (step,) = backend.step([backend.open_segment(opened.request)])
        assert len(step.frames) == 37 and step.done
        book.talked(opened, step.frames, step.done)
        book.refresh()
        sizes = []
        while (chunk := record.chunk) is not None:
            sizes.append(chunk.frames)
            book.start_vocoding(record)
            pcm = np.zeros(chunk.frames * voice.samples_per_frame, dtype=np.float32)
            book.emit(record, chunk, pcm, 100.0)
            book.refresh()
        return sizes

    plain = [6, 6, 6, 6, 6, 6, 1]  # the last frame would decode alone
    # the first chunk as planned (first audio), then 31 frames in 6 chunks
    assert chunk_sizes(0) == ([6, 6, 5, 5, 5, 5, 5] if even_tail else plain)
    assert chunk_sizes(1) == plain


def test_a_stream_alone_with_a_second_buffered_is_planned_solo_chunks() -> None:
    """chunking.solo_chunk_frames: a stream alone on the vocoder (work-ahead applies:
    two workers, work_ahead_streams 1) whose player has solo_slack_s (1 s) or more
    buffered is planned wider chunks; a second stream's arrival re-plans it plain, and
    its end lets the first have them again. 80 ms frames, plain chunks of 5 (0.4 s)."""
    now = [100.0]
    backend = SimBackend(SimConfig(talker_frames_per_step=1000))  # a segment per step
    voice = backend.voices()[0]
    book = _fake_clock_book(
        now,
        ChunkingConfig(chunk_frames=5, solo_chunk_frames=10),
        max_in_flight=2,
        work_ahead_streams=1,
        vocoder_workers=2,
    )

    def new_stream() -> StreamRecord:
        stream = book.add_stream(voice, speed=1.0, now_s=now[0])
        text = "one two three four five six seven eight nine ten " * 4
        book.add_text(stream.id, text, final=True)
        record = book.record(stream.id)
        assert record is not None
        opened = book.open_segment(record)
        (step,) = backend.step([backend.open_segment(opened.request)])
        assert len(step.frames) >= 60 and step.done
        book.talked(opened, step.frames, step.done)
        return record

    def planned(record: StreamRecord) -> int:
        book.refresh()
        assert record.chunk is not None
        return record.chunk.frames

    def send(record: StreamRecord) -> None:
        chunk = record.chunk
        assert chunk is not None
        book.start_vocoding(record)
        pcm = np.zeros(chunk.frames * voice.samples_per_frame, dtype=np.float32)
        book.emit(record, chunk, pcm, now[0])

    alone = new_stream()
    sizes = []
    for _ in range(3):  # 0.4, 0.8, 1.2 s buffered after each
        sizes.append(planned(alone))
        send(alone)
    assert sizes == [5, 5, 5]  # no audio yet, then under 1 s buffered
    assert planned(alone) == 10  # 1.2 s buffered
    book.ack_playback(alone.stream.id, 0.3, 100.0)  # the client played 0.3 s already
    assert planned(alone) == 5  # 0.9 s buffered
    book.ack_playback(alone.stream.id, 0.0, 100.0)
    assert planned(alone) == 10
    now[0] = 100.3  # time passes: 0.9 s buffered at the next plan
    send(alone)  # (the 10 frames planned at 100.0)
    assert planned(alone) == 10  # 1.2 - 0.3 + 0.8 = 1.7 s buffered
    other = new_stream()
    assert planned(alone) == 5  # not alone: re-planned plain at once
    assert planned(other) == 5
    book.cancel(other.stream.id)
    assert planned(alone) == 10  # alone again
    send(alone)
    assert alone.frames.emitted_frames == 35


def test_no_chunk_ahead_of_a_lone_stream_while_its_talker_step_runs() -> None:
    """A lone stream whose chunk is being decoded offers its next chunk (`ahead_ids`)
    only while no talker step of it runs; the end of the step wakes the vocoder, which
    may then take it."""
    vocoder_wakes: list[None] = []
    book = _fake_clock_book(
        [100.0],
        ChunkingConfig(chunk_frames=4),
        lambda: vocoder_wakes.append(None),
        max_in_flight=2,
        work_ahead_streams=1,
        vocoder_workers=2,
    )
    backend = SimBackend(SimConfig(talker_frames_per_step=12))
    voice = backend.voices()[0]
    stream = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(stream.id, "one two three four five six seven eight nine ten", final=True)
    record = book.record(stream.id)
    assert record is not None
    opened = book.open_segment(record)
    state = backend.open_segment(opened.request)

    def step() -> None:
        book.talk_steps_started([opened])
        (result,) = backend.step([state])
        book.talked(opened, result.frames, result.done)
        book.refresh()

    def send_first() -> None:  # the stream's first chunk leaves; its next is decoded
        chunk = record.chunk
        assert chunk is not None
        book.start_vocoding(record)
        book.emit(record, chunk, np.zeros(chunk.frames * voice.samples_per_frame), 100.0)
        book.refresh()
        book.start_vocoding(record)  # the worker takes the next chunk
        book.refresh()

    step()
    book.talk_steps_ended([opened])
    send_first()
    assert stream.id in book.ahead_ids  # its talker idles: a second worker may help
    step()  # the next step runs (its frames are booked, the lane not yet freed)
    assert stream.id not in book.ahead_ids
    vocoder_wakes.clear()
    book.talk_steps_ended([opened])
    assert stream.id in book.ahead_ids
    assert len(vocoder_wakes) == 1


def test_no_chunk_ahead_of_a_lone_stream_while_its_next_segment_is_prepared() -> None:
    """talker.prepare_ahead_streams: while the backend prepares a lone stream's next
    segment (its encoder on a helper thread), the stream counts as talking: no chunk of
    it is offered ahead, so the helper has the idle core; its end wakes the vocoder. The
    talker itself may still step the stream meanwhile (the preparation is not a step)."""
    vocoder_wakes: list[None] = []
    book = _fake_clock_book(
        [100.0],
        ChunkingConfig(chunk_frames=4),
        lambda: vocoder_wakes.append(None),
        max_in_flight=2,
        work_ahead_streams=1,
        vocoder_workers=2,
    )
    backend = SimBackend(SimConfig(talker_frames_per_step=12))
    voice = backend.voices()[0]
    stream = book.add_stream(voice, speed=1.0, now_s=100.0)
    book.add_text(stream.id, "One two three four five. Six seven eight nine ten.", final=True)
    record = book.record(stream.id)
    assert record is not None
    opened = book.open_segment(record)
    ahead = book.next_request(record)
    assert ahead is not None and ahead.text.startswith("Six") and ahead.segment_index == 1
    state = backend.open_segment(opened.request)
    book.talk_steps_started([opened])
    (result,) = backend.step([state])
    book.talked(opened, result.frames, result.done)
    book.talk_steps_ended([opened])
    book.refresh()
    chunk = record.chunk
    assert chunk is not None
    book.start_vocoding(record)
    book.emit(record, chunk, np.zeros(chunk.frames * voice.samples_per_frame), 100.0)
    book.refresh()
    book.start_vocoding(record)  # a worker takes the next chunk
    book.refresh()
    assert stream.id in book.ahead_ids
    book.prepare_started(record, ahead.segment_index)
    assert stream.id not in book.ahead_ids
    assert not book._busy(stream.id)  # the talker may step it
    vocoder_wakes.clear()
    book.prepare_ended(stream.id, ahead.segment_index)
    assert stream.id in book.ahead_ids
    assert len(vocoder_wakes) == 1
    book.prepare_ended(stream.id, ahead.segment_index)  # a second end is harmless
    assert record.preparing is None
    book.prepare_started(record, ahead.segment_index)
    book.open_segment(record)  # its segment opened: the talker lane holds the stream now
    assert record.preparing is None
    book.prepare_started(record, ahead.segment_index + 1)  # the one after it
    book.prepare_ended(stream.id, ahead.segment_index)  # the opened one's late end
    assert record.preparing == ahead.segment_index + 1  # holds the one being prepared
