"""ChunkPlanner (docs/scheduling.md section 3): sizes, context, segments, exactly-once."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import Chunk, ChunkingConfig, ChunkPlanner


def planner(chunk_frames=4, ramp=(), left=0, right=0) -> ChunkPlanner:
    return ChunkPlanner(ChunkingConfig(chunk_frames, ramp, left, right))


def drain(p: ChunkPlanner, sid: str, available: int, segment_done: bool, stream_done: bool):
    """Plan and commit chunks until the planner says wait (or the segment closes)."""
    chunks = []
    while (chunk := p.next_chunk(sid, available, segment_done, stream_done)) is not None:
        p.commit(sid, chunk)
        chunks.append(chunk)
        if chunk.segment_end:
            break
    return chunks


def spans(chunks):
    return [(c.start, c.stop) for c in chunks]


def test_targets_follow_ramp_then_steady():
    config = ChunkingConfig(chunk_frames=10, ramp=[2, 4])
    assert config.ramp == (2, 4)
    assert [config.target_frames(i) for i in range(4)] == [2, 4, 10, 10]
    assert config.first_chunk_frames == 2
    assert ChunkingConfig(chunk_frames=10).first_chunk_frames == 10


def test_waits_for_target_plus_lookahead():
    p = planner(chunk_frames=4, right=2)
    assert p.next_chunk("s", 5, False, False) is None  # 4 + 2 lookahead not there yet
    chunk = p.next_chunk("s", 6, False, False)
    assert chunk == Chunk(0, 4, 0, 6, 0, False, False)


def test_an_urgent_stream_waits_for_no_lookahead():
    """urgent (its player close to running dry): a chunk whose frames are there but not
    its lookahead is cut short by it, keeping its lookahead, if half of it is left; the
    next chunk starts where it stopped. Not urgent, it waits (the test above)."""
    p = planner(chunk_frames=64, left=8, right=8)
    p.commit("s", p.next_chunk("s", 64, True, False))  # its first segment: one whole chunk
    # a later segment's first talker step made 64 frames: 56 of them go now
    chunk = p.next_chunk("s", 64, False, False, urgent=True)
    assert chunk == Chunk(0, 56, 0, 64, 1, False, False)
    p.commit("s", chunk)
    assert p.next_chunk("s", 64, False, False, urgent=True) is None  # 8 left: under half
    following = p.next_chunk("s", 320, False, False, urgent=True)  # the next step's frames
    assert following == Chunk(56, 120, 48, 128, 1, False, False)  # a whole chunk again
    # under half a chunk left after the lookahead: it waits, urgent or not
    p = planner(chunk_frames=64, right=8)
    p.commit("s", p.next_chunk("s", 10, True, False))  # a short first segment
    assert p.next_chunk("s", 39, False, False, urgent=True) is None
    assert p.next_chunk("s", 40, False, False, urgent=False) is None
    assert p.next_chunk("s", 40, False, False, urgent=True) is None  # its 64 are not there
    assert p.next_chunk("s", 70, False, False, urgent=True) == Chunk(0, 62, 0, 70, 1, False, False)
    # without a lookahead the chunk waits for its own frames as ever
    p = planner(chunk_frames=8)
    assert p.next_chunk("s", 7, False, False, urgent=True) is None
    # the first chunk and the ramp's are never cut: their sizes cover the next decode
    p = planner(chunk_frames=8, ramp=(4, 8), right=2)
    assert p.next_chunk("s", 5, False, False, urgent=True) is None
    p.commit("s", p.next_chunk("s", 6, False, False, urgent=True))
    assert p.next_chunk("s", 12, False, False, urgent=True) is None  # 8 of its 8 + 2
    p.commit("s", p.next_chunk("s", 14, False, False, urgent=True))
    assert p.next_chunk("s", 20, False, False, urgent=True) == Chunk(
        12, 18, 12, 20, 0, False, False
    )


def test_context_is_clipped_at_segment_start_and_to_what_is_available():
    p = planner(chunk_frames=4, left=3, right=2)
    chunks = drain(p, "s", 10, False, False)
    assert [(c.context_start, c.start, c.stop, c.context_stop) for c in chunks] == [
        (0, 0, 4, 6),
        (1, 4, 8, 10),
    ]
    # the segment ends with 11 frames: the short last piece has one frame of lookahead
    last = drain(p, "s", 11, True, True)
    assert [(c.context_start, c.start, c.stop, c.context_stop) for c in last] == [(5, 8, 11, 11)]
    assert last[0].segment_end and last[0].final


def test_whole_segment_at_once_is_still_cut_into_target_sized_chunks():
    p = planner(chunk_frames=5, ramp=(1,), right=1)
    chunks = drain(p, "s", 20, True, True)
    assert spans(chunks) == [(0, 1), (1, 6), (6, 11), (11, 16), (16, 20)]
    assert [c.segment_end for c in chunks] == [False, False, False, False, True]
    assert [c.final for c in chunks] == [False, False, False, False, True]
    assert chunks[0].context_stop == 2 and chunks[-1].context_stop == 20


def test_exact_boundary_then_end_yields_an_empty_terminal():
    p = planner(chunk_frames=4, left=2, right=1)
    assert spans(drain(p, "s", 9, False, False)) == [(0, 4), (4, 8)]
    # Only 8 frames came after all: the segment is done with nothing unsent.
    (terminal,) = drain(p, "s", 8, True, True)
    assert terminal == Chunk(8, 8, 8, 8, 0, True, True)
    assert terminal.empty and terminal.frames == 0
    assert p.finished("s")
    assert p.next_chunk("s", 8, True, True) is None


def test_chunk_that_ends_exactly_at_a_known_end_closes_the_segment_itself():
    p = planner(chunk_frames=4)
    chunks = drain(p, "s", 8, True, True)
    assert spans(chunks) == [(0, 4), (4, 8)]
    assert chunks[-1].segment_end and chunks[-1].final


def test_segments_restart_frame_numbers_and_never_share_a_chunk():
    p = planner(chunk_frames=4, left=2, right=2)
    first = drain(p, "s", 6, True, False)
    assert spans(first) == [(0, 4), (4, 6)]
    assert first[-1].segment_end and not first[-1].final
    assert first[-1].context_stop == 6  # no lookahead into the next segment
    assert p.segment_index("s") == 1 and p.sent_frames("s") == 0
    second = drain(p, "s", 3, True, True)
    assert second == [Chunk(0, 3, 0, 3, 1, True, True)]  # no left context from segment 0


def test_ramp_counts_chunks_across_segments_not_per_segment():
    p = planner(chunk_frames=8, ramp=(2, 3, 4))
    assert spans(drain(p, "s", 3, True, False)) == [(0, 2), (2, 3)]  # chunks 0 and 1
    assert p.target_frames("s") == 4
    assert spans(drain(p, "s", 12, True, True)) == [(0, 4), (4, 12)]  # chunks 2 and 3


def test_a_split_cuts_the_last_segment_evenly_over_the_workers():
    """next_chunk(split=2), once the stream's last segment is done and past the ramp: as
    many chunks as plain ones would be, rounded down to a multiple of 2, of near-equal
    size (plain: 4, 4, 4, 4, 2 for 18 frames; one short chunk would decode alone)."""
    config = ChunkingConfig(chunk_frames=4, ramp=(2,), right_context_frames=1)
    p = ChunkPlanner(config)
    first = p.next_chunk("s", 20, True, True, split=2)
    assert first == Chunk(0, 2, 0, 3, 0, False, False)  # the ramp is untouched
    p.take("s", first)
    cut = []
    while (chunk := p.next_chunk("s", 20, True, True, split=2)) is not None:
        assert p.next_chunk("s", 20, True, True, split=2) == chunk  # asked again: the same
        p.take("s", chunk)
        cut.append(chunk)
        if chunk.final:
            break
    assert spans(cut) == [(2, 7), (7, 12), (12, 16), (16, 20)]
    assert [c.context_stop for c in cut] == [8, 13, 17, 20]
    assert cut[-1].final and not any(c.final for c in cut[:-1])

    def cut_sizes(available, split, segment_done=True, stream_done=True, chunks=1):
        planner = ChunkPlanner(config)
        first = planner.next_chunk("s", available, segment_done, stream_done, split=split)
        planner.take("s", first)
        sizes = []
        while len(sizes) < chunks and (
            chunk := planner.next_chunk("s", available, segment_done, stream_done, split=split)
        ):
            planner.take("s", chunk)
            sizes.append(chunk.frames)
        return sizes

    assert cut_sizes(20, 3, chunks=9) == [6, 6, 6]  # 5 plain chunks -> 3
    assert cut_sizes(12, 2, chunks=9) == [5, 5]  # 3 plain chunks -> 2
    assert cut_sizes(6, 2, chunks=9) == [4]  # within one target: one chunk, as plain
    assert cut_sizes(20, 1, chunks=9) == [4, 4, 4, 4, 2]  # split 1: plain
    # not the stream's last segment, or not all talked: plain
    assert cut_sizes(20, 2, stream_done=False, chunks=5) == [4, 4, 4, 4, 2]
    assert cut_sizes(20, 2, segment_done=False, chunks=4) == [4, 4, 4, 4]


def test_an_early_tail_cuts_the_last_segment_within_the_ramp_when_its_chunks_fit():
    """next_chunk(split=2, early_tail_frames=n): within the ramp (never the first chunk)
    the even cut is made at once when its chunks have at most n frames; larger, the ramp
    goes on. 20 frames, ramp 2, 4, 8, steady 8: 18 left after the first chunk are 3
    steady chunks, cut as 2 of 9."""
    config = ChunkingConfig(chunk_frames=8, ramp=(2, 4, 8), right_context_frames=1)

    def sizes(early: int, busy: int = 0) -> list[int]:
        p = ChunkPlanner(config)
        out = []
        while (chunk := p.next_chunk("s", 20, True, True, 2, False, early, busy)) is not None:
            p.take("s", chunk)
            out.append(chunk.frames)
            if chunk.final:
                break
        return out

    assert sizes(9) == [2, 9, 9]
    assert sizes(100) == [2, 9, 9]  # never more chunks than steady ones would be
    assert sizes(8) == [2, 4, 7, 7]  # 9 > 8: the ramp goes on; 14 left fit as 2 of 7
    assert sizes(0) == [2, 4, 8, 6]
    # the other worker still holds 4 frames' work: the free one's chunk takes 4 more
    assert sizes(12, busy=4) == [2, 11, 7]
    assert sizes(9, busy=4) == [2, 9, 9]  # no larger than the player's audio covers
    assert sizes(100, busy=40) == [2, 17, 1]  # at least a frame left for the other


def test_empty_segment_terminal_does_not_advance_the_ramp():
    p = planner(chunk_frames=8, ramp=(2,))
    (empty,) = drain(p, "s", 0, True, False)
    assert empty.empty and empty.segment_end and not empty.final
    assert p.target_frames("s") == 2
    assert spans(drain(p, "s", 5, True, True)) == [(0, 2), (2, 5)]


def test_stream_done_known_early_marks_only_the_segment_end_final():
    p = planner(chunk_frames=4)
    chunks = drain(p, "s", 4, False, True)
    assert chunks == [Chunk(0, 4, 0, 4, 0, False, False)]
    (terminal,) = drain(p, "s", 4, True, True)
    assert terminal.final and terminal.empty


def test_next_chunk_is_a_query_until_commit():
    p = planner(chunk_frames=4)
    a = p.next_chunk("s", 10, False, False)
    assert p.next_chunk("s", 10, False, False) == a
    assert p.sent_frames("s") == 0
    p.commit("s", a)
    assert p.sent_frames("s") == 4


def test_commit_of_an_unplanned_chunk_is_refused():
    p = planner(chunk_frames=4)
    with pytest.raises(ValueError, match="not planned"):
        p.commit("s", Chunk(0, 4, 0, 4, 0, False, False))
    planned = p.next_chunk("s", 10, False, False)
    with pytest.raises(ValueError, match="not planned"):
        p.commit("s", Chunk(0, 3, 0, 3, 0, False, False))
    p.commit("s", planned)
    with pytest.raises(ValueError, match="not planned"):
        p.commit("s", planned)  # twice
    assert p.next_chunk("s", 5, False, False) is None  # waiting clears the plan
    with pytest.raises(ValueError, match="not planned"):
        p.commit("s", Chunk(4, 8, 4, 8, 0, False, False))


def test_frames_cannot_go_backwards():
    p = planner(chunk_frames=4)
    p.commit("s", p.next_chunk("s", 8, False, False))
    with pytest.raises(ValueError, match="available_frames"):
        p.next_chunk("s", 3, False, False)
    with pytest.raises(ValueError, match="available_frames"):
        planner().next_chunk("t", -1, True, True)


def test_forget_drops_the_stream():
    p = planner(chunk_frames=4)
    drain(p, "s", 6, True, False)
    assert "s" in p
    p.forget("s")
    p.forget("s")
    assert "s" not in p
    assert p.segment_index("s") == 0 and p.sent_frames("s") == 0
    assert p.next_chunk("s", 4, True, True) == Chunk(0, 4, 0, 4, 0, True, True)


def test_streams_are_independent():
    p = planner(chunk_frames=2, ramp=(1,))
    a = p.next_chunk("a", 5, False, False)
    b = p.next_chunk("b", 5, False, False)
    p.commit("a", a)
    p.commit("b", b)
    assert p.next_chunk("a", 5, False, False) == Chunk(1, 3, 1, 3, 0, False, False)
    assert p.sent_frames("b") == 1


# --- the invariant, over random arrivals, sizes, ramps, contexts and segments -------------

configs = st.builds(
    ChunkingConfig,
    chunk_frames=st.integers(1, 8),
    ramp=st.lists(st.integers(1, 6), max_size=3),
    left_context_frames=st.integers(0, 4),
    right_context_frames=st.integers(0, 4),
)


@st.composite
def segment_arrivals(draw):
    """A segment's frames as a list of arrival increments (possibly none at all)."""
    length = draw(st.integers(0, 30))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, length - 1)), max_size=6)))
    points = [0, *[c for c in cuts if c < length], length]
    return [b - a for a, b in pairwise(points) if b > a]


@settings(max_examples=300, deadline=None)
@given(
    config=configs,
    segments=st.lists(segment_arrivals(), min_size=1, max_size=4),
    end_known=st.sampled_from(["last_segment_start", "last_segment_done", "after_last"]),
    split=st.sampled_from([1, 2, 3]),
    data=st.data(),
)
def test_every_frame_exactly_once_in_order_and_one_final(config, segments, end_known, split, data):
    lookahead = config.right_context_frames
    p = ChunkPlanner(config)
    if end_known == "after_last":  # the stream's end comes after its last segment closed
        segments = [*segments, []]
    emitted: list[tuple[int, int, int]] = []  # (segment, start, stop)
    finals = 0
    chunk_index = 0  # non-empty chunks so far: the ramp index
    for seg, increments in enumerate(segments):
        length = sum(increments)
        last = seg == len(segments) - 1
        pending = list(increments)
        available, done = 0, False
        ended_by_data_chunk = False
        empties = 0
        while True:
            stream_done = last and (end_known != "last_segment_done" or done)
            urgent = data.draw(st.booleans())
            chunk = p.next_chunk("s", available, done, stream_done, split=split, urgent=urgent)
            sent = p.sent_frames("s")
            target = config.target_frames(chunk_index)
            unsent = available - sent
            # an urgent stream's chunk whose frames are there goes without its lookahead
            short = (
                urgent
                and chunk_index >= max(len(config.ramp), 1)
                and unsent >= target
                and unsent - lookahead >= -(-target // 2)
            )
            if chunk is None:
                # Waiting is right only while the segment is open and the chunk's frames
                # plus lookahead are not all there.
                assert not done
                assert unsent < target + lookahead and not short
            elif pending and data.draw(st.booleans()):
                chunk = None  # the vocoder is busy: more frames arrive before the next plan
            if chunk is None:
                if pending:
                    available += pending.pop(0)
                else:
                    done = True
                continue
            assert chunk.segment == seg
            assert chunk.start == sent
            assert 0 <= chunk.context_start <= chunk.start <= chunk.stop <= chunk.context_stop
            assert chunk.context_stop <= available <= length
            assert chunk.segment_end == (done and chunk.stop == available)
            assert chunk.final == (chunk.segment_end and stream_done)
            if chunk.empty:
                # only as the terminal of a done segment, carrying and repeating nothing
                assert done and unsent == 0 and chunk.segment_end
                assert chunk.context_start == chunk.context_stop == chunk.start
                empties += 1
            else:
                assert chunk.context_start == max(0, chunk.start - config.left_context_frames)
                context_stop = min(available, chunk.stop + config.right_context_frames)
                assert chunk.context_stop == context_stop
                # ramps and targets are followed: only a segment's last piece is short
                if split > 1 and done and stream_done and chunk_index >= len(config.ramp):
                    assert chunk.frames <= max(unsent, 1)  # a last segment cut evenly
                elif done or unsent >= target + lookahead:
                    assert chunk.frames == min(target, unsent)
                if not done and unsent < target + lookahead:
                    assert short and chunk.frames == unsent - lookahead
                    assert chunk.context_stop == available
                elif not done:
                    assert chunk.frames == target
                chunk_index += 1
                emitted.append((seg, chunk.start, chunk.stop))
                ended_by_data_chunk = chunk.segment_end
            p.commit("s", chunk)
            finals += chunk.final
            if chunk.segment_end:
                break
        # the segment's frames, each exactly once, in order
        spans_ = [(a, b) for s, a, b in emitted if s == seg]
        assert [f for a, b in spans_ for f in range(a, b)] == list(range(length))
        # an empty terminal exactly when no chunk with frames could close the segment
        assert empties == (0 if ended_by_data_chunk else 1)
    assert finals == 1
    assert p.finished("s")
    assert p.next_chunk("s", 0, True, True) is None


def test_take_plans_the_next_chunk_while_the_taken_one_is_decoded() -> None:
    """Planning runs from "planned up to": after `take`, the next chunk (here in the next
    segment) is planned before the taken one is committed; commits come in take order."""
    planner = ChunkPlanner(ChunkingConfig(chunk_frames=4, right_context_frames=1))
    first = planner.next_chunk("s", 8, segment_done=False, stream_done=False)
    assert first == Chunk(0, 4, 0, 5, 0, False, False)
    planner.take("s", first)
    second = planner.next_chunk("s", 6, segment_done=True, stream_done=False)
    assert second == Chunk(4, 6, 4, 6, 0, True, False)
    planner.take("s", second)
    assert planner.in_flight("s") == 2 and planner.planning_segment("s") == 1
    third = planner.next_chunk("s", 5, segment_done=False, stream_done=False)
    assert third == Chunk(0, 4, 0, 5, 1, False, False)
    with pytest.raises(ValueError, match="out of order"):
        planner.commit("s", second)
    planner.commit("s", first)
    assert planner.sent_frames("s") == 4 and planner.segment_index("s") == 0
    planner.commit("s", second)
    assert planner.segment_index("s") == 1 and planner.in_flight("s") == 0
    planner.take("s", third)  # still the planned one: commits did not re-plan
