"""Talker order: which streams' segments take the next talker step.

The talker is deadline-ordered like the vocoder. A stream's audio runs out at

    run_out_s = max(horizon_s, now_s) + queued_audio_s

(`now_s` standing in for the horizon before the first audio; `queued_audio_s` is the
audio of the frames the talker produced that the vocoder has not emitted yet). Ranking
key, smallest first:

    (0 if protected else 1, deadline_s, order)

- a stream with no audio and nothing queued has the first-audio deadline
  `first_seen_s + first_chunk_s`;
- every other stream's deadline is `run_out_s`; it is protected (a player about to run
  dry) when it has audio and `run_out_s - now_s <= safety_margin_s`;
- a stream more than `high_water_s` ahead (`run_out_s - now_s > high_water_s`) sits the
  step out: it keeps its open segment, and `retry_in_s` says when the first such stream
  with playback falls back under the mark (one without audio yet has no playback to
  advance: its first audio is the event that changes it).

Pure: plain numbers in, a `TalkerPlan` out; the clock is passed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.validation import check_int, check_non_negative, check_positive

# A timer set for the high-water mark may fire a hair early; within this it counts as under.
HIGH_WATER_SLACK_S = 0.001


@dataclass(frozen=True)
class TalkerOrderConfig:
    batch: int = 1  # segments stepped together at most
    high_water_s: float = 8.0  # a stream this far ahead of its playback sits out
    first_chunk_s: float = 0.1  # first-audio deadline after the stream is first seen
    safety_margin_s: float = 0.05  # a playing stream this close to running dry is protected

    def __post_init__(self) -> None:
        check_int("batch", self.batch, 1)
        check_positive("high_water_s", self.high_water_s)
        check_positive("first_chunk_s", self.first_chunk_s)
        check_non_negative("safety_margin_s", self.safety_margin_s)


@dataclass(frozen=True, slots=True)
class TalkerCandidate:
    """A stream that wants talker work (text waiting or a segment open)."""

    stream_id: str
    order: int  # arrival order: the last tie-break
    first_seen_s: float  # when the stream was admitted
    horizon_s: float | None  # when its player runs dry; None before its first audio
    queued_audio_s: float  # produced by the talker, not yet emitted by the vocoder


@dataclass(frozen=True, slots=True)
class TalkerPlan:
    step_ids: tuple[str, ...]  # at most `batch` streams, most urgent first
    retry_in_s: float | None  # when a stream held back by the high-water mark is due again


def talker_key(
    candidate: TalkerCandidate, now_s: float, config: TalkerOrderConfig
) -> tuple[int, float, int] | None:
    """The ranking key of one candidate, or None when it sits out (high-water mark)."""
    horizon_s = candidate.horizon_s
    if horizon_s is None and candidate.queued_audio_s <= 0:
        return (1, candidate.first_seen_s + config.first_chunk_s, candidate.order)
    run_out_s = max(now_s if horizon_s is None else horizon_s, now_s) + candidate.queued_audio_s
    ahead_s = run_out_s - now_s
    if ahead_s > config.high_water_s + HIGH_WATER_SLACK_S:
        return None
    protected = horizon_s is not None and ahead_s <= config.safety_margin_s
    return (0 if protected else 1, run_out_s, candidate.order)


def plan_talker_step(
    candidates: Iterable[TalkerCandidate], now_s: float, config: TalkerOrderConfig
) -> TalkerPlan:
    """The streams for the next talker step (see the module doc)."""
    keyed: list[tuple[tuple[int, float, int], str]] = []
    retry_in_s: float | None = None
    for candidate in candidates:
        key = talker_key(candidate, now_s, config)
        if key is not None:
            keyed.append((key, candidate.stream_id))
        elif candidate.horizon_s is not None:
            ahead_s = max(candidate.horizon_s, now_s) + candidate.queued_audio_s - now_s
            wait_s = ahead_s - config.high_water_s
            retry_in_s = wait_s if retry_in_s is None else min(retry_in_s, wait_s)
    best = heapq.nsmallest(config.batch, keyed) if len(keyed) > config.batch else sorted(keyed)
    return TalkerPlan(tuple(stream_id for _, stream_id in best), retry_in_s)
