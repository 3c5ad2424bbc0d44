"""Capacity estimate: audio seconds the pipeline can produce per wall second.

Admission compares the streams that would be playing with this figure, so it must say
what the pipeline produces when it is busy, not what clients happen to ask for: an idle
vocoder producing 1 s of audio per second under light load may well be able to produce
30. So a stage's rate is audio seconds per second of that stage's busy time (time inside
its model calls), summed over the calls that ended within the last `window_s` seconds.
The engine runs each stage in its own thread, in parallel, so the pipeline's capacity is
the slower stage's rate (`pipeline_capacity`).

Under light load a batched vocoder runs small batches, so the estimate is conservative
then and rises as load fills the batches.

The engine calibrates each stage at start-up (a short measured warm-up, Engine.calibrate)
and gives the result to `set_baseline`. From then on the baseline anchors the estimate:
when no call ended within the window (idle), the estimate is the baseline again, not
whatever the last busy period measured; while busy, it never falls below
`floor_fraction` x baseline, so a short slow patch (another process taking the CPU for a
few seconds) cannot make admission refuse most of the real capacity. Without a baseline,
an idle stage holds its last estimate; before any measurement the initial value
(0 = unknown) holds. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import deque

_MIN_BUSY_S = 1e-6  # a call that took no measurable time still counts as this long


class CapacityEstimate:
    """Audio seconds per busy second of one stage, over a moving window."""

    def __init__(self, window_s: float, initial_audio_s_per_s: float = 0.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._calls: deque[tuple[float, float, float]] = deque()  # (finished_s, busy_s, audio_s)
        self._busy_s = 0.0
        self._audio_s = 0.0
        self._last = initial_audio_s_per_s
        self._measured = False
        self._baseline = 0.0
        self._floor = 0.0

    @property
    def baseline(self) -> float:
        """The calibrated rate (0 until `set_baseline`)."""
        return self._baseline

    def reset(self) -> None:
        """Forget the calls in the window (the calibration's ramp-up)."""
        self._calls.clear()
        self._busy_s = self._audio_s = 0.0

    def set_baseline(self, audio_s_per_s: float, floor_fraction: float) -> None:
        """The calibrated rate: what an idle stage reports, and (times `floor_fraction`)
        the least a busy one does."""
        if not audio_s_per_s >= 0 or not 0 <= floor_fraction <= 1:
            raise ValueError(f"bad baseline {audio_s_per_s!r} or floor {floor_fraction!r}")
        self._baseline = audio_s_per_s
        self._floor = audio_s_per_s * floor_fraction

    @property
    def measured(self) -> bool:
        """Whether any call was recorded yet."""
        return self._measured

    def record(self, started_s: float, finished_s: float, audio_s: float) -> None:
        """One model call that ran from `started_s` to `finished_s` and produced `audio_s`."""
        busy_s = max(finished_s - started_s, _MIN_BUSY_S)
        self._calls.append((finished_s, busy_s, audio_s))
        self._busy_s += busy_s
        self._audio_s += audio_s
        self._last = self._audio_s / self._busy_s
        self._measured = True

    def value(self, now_s: float) -> float:
        """Audio seconds per busy second over the calls that ended in (now - window, now]."""
        horizon_s = now_s - self.window_s
        while self._calls and self._calls[0][0] <= horizon_s:
            _, busy_s, audio_s = self._calls.popleft()
            self._busy_s -= busy_s
            self._audio_s -= audio_s
        if not self._calls:
            self._busy_s = self._audio_s = 0.0  # no float residue carried into the next window
            if self._baseline > 0:
                self._last = self._baseline
            return self._last
        self._last = max(self._audio_s / self._busy_s, self._floor)
        return self._last


def pipeline_capacity(*stage_rates: float) -> float:
    """The pipeline's rate: the slowest measured stage (0 when none is measured)."""
    measured = [rate for rate in stage_rates if rate > 0]
    return min(measured) if measured else 0.0
