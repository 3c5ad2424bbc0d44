"""Capacity model: audio seconds the pipeline sustains per wall second, at any load.

Admission (scheduling/admission.py) compares the work owed with this figure, so it must
say what the machine sustains when it is busy, read while it is not: an idle vocoder
producing 1 s of audio per second may well be able to produce 10.

Each stage's COST is measured per model call: the call's own wall time per audio second
it produced (never the union of the workers' busy intervals, which reads low when only
some workers are busy). A stage's cost is the MEDIAN over the calls that ended within
`window_s`, each weighted by its audio: a short slow patch (another process taking the
CPU for a second or two) moves it little, since a slow call yields little audio per
second of it, and one call that hung counts for the little it produced; a lasting change
moves it within the window. A stage of `workers` parallel calls sustains
`workers / cost` audio s per s.

Calls that run alone cost less than calls that share the cores with the other stage and
the other workers, so the per-call figure reads high at light load. The SATURATED
reading bounds it at what the machine sustained, the cores' contention included: the
audio produced per wall second over the time bins (`window_s / BUCKETS` each, a call
counted in the bin it ended in) in which the stage was busy at least `SATURATED` of the
time on every worker, with more calls than workers (so its calls paid the full
contention, and one call that hung is no reading), the median of the latest `BUCKETS`
such bins. It is kept fresh by new saturated bins (a busy period, a calibration), and
forgotten after `STALE_WINDOWS` windows without one; the start-up calibration
(Engine.calibrate), which saturates both stages, seeds it (`set_baseline`) and is the
reading once it is forgotten. Forgotten soon, because a low reading holds itself: admission
then keeps the stage under saturation, so no bin replaces it (on the voice a reading of
0.78 C held for 15 s of a 20 s point with 12 windows; docs/admission.md).

The pipeline's capacity is the slower stage's (`pipeline_capacity`). (A cores bound,
`cores / (talker cost + vocoder cost)`, was tried: the per-call costs are measured under
the contention already, so it counted it twice and read 0.8 C saturated on the voice.)

The start phase's extra cost is admission's `start_cost` (a starting stream counts more).
Pure: the clock is passed in.
"""

from __future__ import annotations

import statistics
from collections import deque

BUCKETS = 5  # saturation bins per window (1 s with the default 5 s window)
SATURATED = 0.9  # busy share per worker above which a bin counts as saturated
STALE_WINDOWS = 1  # a saturated reading older than this many windows is dropped
_MIN_AUDIO_S = 1e-9


class CapacityEstimate:
    """One stage's cost per audio second and the rate it sustains (see module doc)."""

    def __init__(
        self, window_s: float, initial_audio_s_per_s: float = 0.0, *, workers: int = 1
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        self.window_s = window_s
        self.workers = workers
        self._bucket_s = window_s / BUCKETS
        self._calls: deque[tuple[float, float, float]] = deque()  # (finished_s, cost, audio_s)
        self._bins: dict[int, list[float]] = {}  # open bins: index -> [busy_s, audio_s, calls]
        self._saturated: deque[tuple[int, float]] = deque(maxlen=BUCKETS)  # (index, rate)
        self._initial = initial_audio_s_per_s
        self._baseline = 0.0
        self._measured = False

    @property
    def baseline(self) -> float:
        """The calibrated rate (0 until `set_baseline`)."""
        return self._baseline

    @property
    def measured(self) -> bool:
        """Whether any call was recorded yet."""
        return self._measured

    def reset(self) -> None:
        """Forget every measurement (the calibration's ramp-up; a fresh calibration)."""
        self._calls.clear()
        self._bins.clear()
        self._saturated.clear()

    def set_baseline(self, audio_s_per_s: float) -> None:
        """The calibrated rate: the saturated reading until the stage saturates again."""
        if not audio_s_per_s >= 0:
            raise ValueError(f"bad baseline {audio_s_per_s!r}")
        self._baseline = audio_s_per_s

    def record(self, started_s: float, finished_s: float, audio_s: float) -> None:
        """One model call that ran from `started_s` to `finished_s` and produced `audio_s`."""
        self._measured = True
        busy_s = max(finished_s - started_s, 0.0)
        if audio_s > _MIN_AUDIO_S:
            self._calls.append((finished_s, busy_s / audio_s, audio_s))
        entry = self._bins.setdefault(int(finished_s // self._bucket_s), [0.0, 0.0, 0.0])
        entry[0] += busy_s
        entry[1] += audio_s
        entry[2] += 1

    def _expire(self, now_s: float) -> None:
        """Drop the calls that left the window; close the bins before the last one (a
        call running now may still end in that one) into saturated readings."""
        horizon_s = now_s - self.window_s
        calls = self._calls
        while calls and calls[0][0] <= horizon_s:
            calls.popleft()
        current = int(now_s // self._bucket_s)
        workers = self.workers
        for index in sorted(i for i in self._bins if i < current - 1):
            busy_s, audio_s, count = self._bins.pop(index)
            full = busy_s >= SATURATED * workers * self._bucket_s and count > workers
            if full and audio_s > _MIN_AUDIO_S:
                # what it produced per wall second: the gaps between its calls (the
                # engine's own work, a wait for the other stage) are lost capacity too
                self._saturated.append((index, audio_s / self._bucket_s))
        while self._saturated and self._saturated[0][0] < current - BUCKETS * STALE_WINDOWS:
            self._saturated.popleft()

    def cost_s_per_audio_s(self, now_s: float) -> float | None:
        """The audio-weighted median of the window's calls' busy seconds per audio second
        (None: no call in it)."""
        self._expire(now_s)
        if not self._calls:
            return None
        ranked = sorted((cost, audio_s) for _, cost, audio_s in self._calls)
        half_s = sum(audio_s for _, audio_s in ranked) / 2
        total_s = 0.0
        for cost, audio_s in ranked:
            total_s += audio_s
            if total_s >= half_s:
                return cost
        return ranked[-1][0]

    def sustained(self, now_s: float) -> float:
        """The saturated reading (or the calibration's; 0: none)."""
        self._expire(now_s)
        if self._saturated:
            return statistics.median(rate for _, rate in self._saturated)
        return self._baseline

    def value(self, now_s: float) -> float:
        """Audio seconds per wall second the stage sustains: `workers / cost`, at most
        the saturated reading; either alone when the other is unknown; the initial value
        (0 = unknown) before any."""
        cost = self.cost_s_per_audio_s(now_s)
        sustained = self.sustained(now_s)
        model = self.workers / cost if cost else 0.0
        if model > 0 and sustained > 0:
            return min(model, sustained)
        return model or sustained or self._initial


def pipeline_capacity(talker: CapacityEstimate, vocoder: CapacityEstimate, now_s: float) -> float:
    """The pipeline's rate: the slower stage's (0 when neither is measured)."""
    return slower_stage(talker.value(now_s), vocoder.value(now_s))


def slower_stage(*rates: float) -> float:
    """The pipeline's rate from its stages' readings: the smallest measured (0: none)."""
    return min((rate for rate in rates if rate > 0), default=0.0)
