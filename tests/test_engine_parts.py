"""The engine's pure parts: segment frame queues and the capacity estimate."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.capacity import CapacityEstimate, pipeline_capacity
from pipeline.frames import Segment, StreamFrames


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


def test_capacity_counts_busy_time_not_idle_time() -> None:
    estimate = CapacityEstimate(window_s=5.0)
    assert (estimate.value(0.0), estimate.measured) == (0.0, False)
    # two 0.1 s calls producing 1 s each, with idle time between: the vocoder can do 10x
    estimate.record(0.0, 0.1, 1.0)
    estimate.record(1.0, 1.1, 1.0)
    assert estimate.value(1.1) == pytest.approx(10.0)
    assert estimate.measured


def test_capacity_is_a_moving_window_that_holds_its_last_value_when_idle() -> None:
    estimate = CapacityEstimate(window_s=1.0, initial_audio_s_per_s=3.0)
    assert estimate.value(0.0) == 3.0
    estimate.record(0.0, 0.5, 1.0)  # 2x
    estimate.record(0.6, 0.8, 1.0)  # 5x
    assert estimate.value(0.8) == pytest.approx(2.0 / 0.7)
    assert estimate.value(1.7) == pytest.approx(5.0)  # the first call left the window
    assert estimate.value(60.0) == pytest.approx(5.0)  # idle: the last estimate holds
    estimate.record(60.0, 60.1, 0.1)
    assert estimate.value(60.1) == pytest.approx(1.0)


def test_pipeline_capacity_is_the_slowest_measured_stage() -> None:
    assert pipeline_capacity(12.0, 4.0) == 4.0
    assert pipeline_capacity(12.0, 0.0) == 12.0
    assert pipeline_capacity(0.0, 0.0) == 0.0
