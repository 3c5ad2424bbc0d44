"""Jobs: streams with a completion deadline (SPEC-scheduling section 5). Pure numbers.

A job is played by a virtual player at the rate it needs: with `A` audio seconds left and
`T = finish_by_s - now_s` seconds to go, `r = A / T` (audio s per s), recomputed as work
is done. Its horizon advances `d / r` for `d` seconds of audio emitted (a stream's `rate`
in scheduling/horizon.py), so EDF ranks a live listener at 1x ahead of a job at 0.2x, and
the job is still never starved past its deadline. Without `finish_by_s`, `r = 0`: its
horizon is at infinity, it takes only the turns nobody else is ready for (all of them on
an idle server). A job that someone listens to takes its listener's horizon, at 1x.

Admission counts `r` for a job with a deadline (a fraction of one stream) and nothing for
a best-effort one; a `finish_by_s` that the capacity left cannot meet is refused at once,
with the predicted finish time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# a job with less than this left to do, or past its deadline, needs the whole machine
_MIN_TIME_LEFT_S = 1e-3


def job_rate(audio_left_s: float, finish_by_s: float | None, now_s: float) -> float:
    """The rate a job needs (audio s per s): 0 without a deadline (best effort), inf when
    its deadline has passed with audio still owed."""
    _finite("now_s", now_s)
    if audio_left_s < 0 or math.isnan(audio_left_s):
        raise ValueError(f"audio_left_s must be >= 0, got {audio_left_s!r}")
    if finish_by_s is None or audio_left_s == 0:
        return 0.0
    time_left_s = finish_by_s - now_s
    if time_left_s < _MIN_TIME_LEFT_S:
        return math.inf
    return audio_left_s / time_left_s


# an overdue job's rate: as urgent as a stream can be
OVERDUE_RATE = 1e3


def segment_pace(rate: float, horizon_s: float, now_s: float) -> tuple[float, float]:
    """A job's next segment's virtual player, (rate, horizon_s) for Engine.submit_job, from
    the rate the job needs (`job_rate`): best effort (0) never comes due; overdue (inf)
    is due now at OVERDUE_RATE; otherwise the player goes on from `horizon_s` (from now
    when it fell behind, or was never set: inf)."""
    if rate == 0:
        return 0.0, math.inf
    if math.isinf(rate):
        return OVERDUE_RATE, now_s
    return rate, max(horizon_s, now_s) if math.isfinite(horizon_s) else now_s


def listener_horizon_s(listening_since_s: float, sent_from_s: float, made_s: float) -> float:
    """When a listener who started reading at `listening_since_s` from audio position
    `sent_from_s` runs dry, if it plays at 1x everything made so far (`made_s`): the job's
    horizon while someone listens."""
    return listening_since_s + max(0.0, made_s - sent_from_s)


@dataclass(frozen=True, slots=True)
class JobDemand:
    """A job admitted earlier, as the capacity check sees it."""

    audio_left_s: float
    finish_by_s: float | None


@dataclass(frozen=True, slots=True)
class FinishCheck:
    """Whether a new job's `finish_by_s` can be met, and when it would finish."""

    feasible: bool
    rate: float  # what it needs (audio s per s)
    spare_rate: float  # what the capacity leaves it (audio s per s)
    predicted_finish_s: float  # at the spare rate (inf: none left)


def promised_rate(jobs: Iterable[JobDemand], now_s: float) -> float:
    """The rate promised to the jobs with a deadline (best-effort ones count nothing)."""
    return sum(job_rate(j.audio_left_s, j.finish_by_s, now_s) for j in jobs)


def check_finish_by(
    *,
    audio_s: float,
    finish_by_s: float | None,
    now_s: float,
    capacity_audio_s_per_s: float,
    live_streams: float,
    promised_audio_s_per_s: float,
    headroom: float = 1.0,
) -> FinishCheck:
    """A new job of `audio_s` audio seconds: its finish time at what the capacity leaves
    (the machine's `capacity * headroom` less one per live stream with work left less
    the rate promised to jobs with a deadline), and whether that meets `finish_by_s`.
    Without a deadline it is always feasible (best effort waits its turn). Capacity not
    measured (<= 0 or NaN): feasible, the finish unknown (inf)."""
    _finite("now_s", now_s)
    if not audio_s > 0:
        raise ValueError(f"audio_s must be > 0, got {audio_s!r}")
    if not capacity_audio_s_per_s > 0:
        return FinishCheck(True, job_rate(audio_s, finish_by_s, now_s), math.inf, math.inf)
    spare = capacity_audio_s_per_s * headroom - live_streams - promised_audio_s_per_s
    spare = max(0.0, spare)
    predicted_s = now_s + audio_s / spare if spare > 0 else math.inf
    rate = job_rate(audio_s, finish_by_s, now_s)
    if finish_by_s is None:
        return FinishCheck(True, 0.0, spare, predicted_s)
    return FinishCheck(rate <= spare and predicted_s <= finish_by_s, rate, spare, predicted_s)


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite time, got {value!r}")


def job_key(
    listener_horizon_s: float | None, finish_by_s: float | None, created_s: float
) -> tuple[float, float, float]:
    """Which job the runner renders first (smallest key): one being listened to (by when
    its listener runs dry), then by deadline, then the oldest; best-effort jobs last."""
    if listener_horizon_s is not None:
        return (0.0, listener_horizon_s, created_s)
    if finish_by_s is not None:
        return (1.0, finish_by_s, created_s)
    return (2.0, math.inf, created_s)
