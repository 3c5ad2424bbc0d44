"""Capacity model: audio seconds the pipeline sustains per wall second, at any load.

Admission (scheduling/admission.py) compares the work owed with this figure, so it must
say what the machine sustains when it is busy, read while it is not: an idle vocoder
producing 1 s of audio per second may well be able to produce 10.

Each stage's COST is measured per model call: the call's own wall time per audio second
it produced (never the union of the workers' busy intervals, which reads low when only
some workers are busy). The calls are binned by time (`window_s / BUCKETS` each); a
stage's cost is the MEDIAN of its buckets' costs over the window, so a short slow patch
(another process taking the CPU for a second or two) moves it little, while a lasting
change moves it within half a window. A stage of `workers` parallel calls then sustains
`workers / cost` audio s per s.

Calls that run alone cost less than calls that share the cores with the other stage and
the other workers, so the per-call figure reads high at light load. Two bounds keep it
at what the machine sustained:

- the SATURATED reading: the same `workers / cost`, over the buckets in which the stage
  was busy at least `SATURATED` of the time on every worker (so its calls paid the full
  contention), the median of the latest `BUCKETS` of them. It is kept fresh by new
  saturated buckets (a calibration, a busy period), and forgotten after `STALE_WINDOWS`
  windows without one; the start-up calibration (Engine.calibrate), which saturates both
  stages, seeds it (`set_baseline`);
- the CORES bound (`pipeline_capacity`): where the stages' calls are CPU-bound on the
  same cores, `cores / (talker cost + vocoder cost)`.

The start phase's extra cost is admission's `start_cost` (a starting stream counts more).
Pure: the clock is passed in.
"""

from __future__ import annotations

import statistics
from collections import deque

BUCKETS = 8  # bins per window
SATURATED = 0.9  # busy share per worker above which a bin counts as saturated
STALE_WINDOWS = 12  # a saturated reading older than this many windows is dropped
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
        # open bins: index -> [busy_s, audio_s]
        self._bins: dict[int, list[float]] = {}
        self._costs: deque[tuple[int, float]] = deque()  # closed bins: (index, cost)
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
        self._bins.clear()
        self._costs.clear()
        self._saturated.clear()

    def set_baseline(self, audio_s_per_s: float, floor_fraction: float = 0.0) -> None:
        """The calibrated rate: the saturated reading until the stage saturates again
        (`floor_fraction` is accepted for compatibility and ignored)."""
        if not audio_s_per_s >= 0:
            raise ValueError(f"bad baseline {audio_s_per_s!r}")
        self._baseline = audio_s_per_s

    def record(self, started_s: float, finished_s: float, audio_s: float) -> None:
        """One model call that ran from `started_s` to `finished_s` and produced `audio_s`
        (its busy time and audio are spread over the bins it spans)."""
        busy_s = max(finished_s - started_s, 0.0)
        self._measured = True
        size = self._bucket_s
        first, last = int(started_s // size), int(finished_s // size)
        if busy_s <= 0 or first == last:
            self._add(last, busy_s, audio_s)
            return
        for index in range(first, last + 1):
            overlap_s = min(finished_s, (index + 1) * size) - max(started_s, index * size)
            if overlap_s > 0:
                self._add(index, overlap_s, audio_s * overlap_s / busy_s)

    def _add(self, index: int, busy_s: float, audio_s: float) -> None:
        entry = self._bins.get(index)
        if entry is None:
            self._bins[index] = [busy_s, audio_s]
        else:
            entry[0] += busy_s
            entry[1] += audio_s

    def _close(self, now_s: float) -> int:
        """Close the bins before the last one (a call running now may still add to that
        one); drop what left the window."""
        current = int(now_s // self._bucket_s)
        for index in sorted(i for i in self._bins if i < current - 1):
            busy_s, audio_s = self._bins.pop(index)
            if audio_s > _MIN_AUDIO_S:
                cost = busy_s / audio_s
                self._costs.append((index, cost))
                if busy_s >= SATURATED * self.workers * self._bucket_s:
                    self._saturated.append((index, self.workers / cost))
        while self._costs and self._costs[0][0] < current - BUCKETS:
            self._costs.popleft()
        while self._saturated and self._saturated[0][0] < current - BUCKETS * STALE_WINDOWS:
            self._saturated.popleft()
        return current

    def cost_s_per_audio_s(self, now_s: float) -> float | None:
        """Median busy seconds per audio second of one call, over the window (None: no
        call in it)."""
        self._close(now_s)
        if not self._costs:
            return None
        return statistics.median(cost for _, cost in self._costs)

    def sustained(self, now_s: float) -> float:
        """The saturated reading (or the calibration's; 0: none)."""
        self._close(now_s)
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


def pipeline_capacity(
    talker: CapacityEstimate, vocoder: CapacityEstimate, now_s: float, cores: int = 0
) -> float:
    """The pipeline's rate: the slower stage's (0 when neither is measured), and with
    `cores` (> 0: the stages' calls are CPU-bound on that many cores) at most
    `cores / (talker cost + vocoder cost)`."""
    rates = [rate for rate in (talker.value(now_s), vocoder.value(now_s)) if rate > 0]
    capacity = min(rates) if rates else 0.0
    if cores > 0 and capacity > 0:
        costs = [talker.cost_s_per_audio_s(now_s), vocoder.cost_s_per_audio_s(now_s)]
        if all(cost is not None for cost in costs):
            capacity = min(capacity, cores / sum(costs))  # type: ignore[arg-type]
    return capacity
