"""How long a stream admitted now will take to its first audio, from the latest ones.

Admission with a first-audio bound (scheduling/admission.py) lets a request wait in the
queue only as long as the bound leaves once its own start is done. That start is not a
flat number: it is what the engine's stages take now for a stream's first chunk (its
first talker step, then its first vocoder turn), which grows with the load. The estimate
is a high quantile of the submit -> first audio times of the latest streams, so one slow
start among many moves it little and a slower machine moves it within a few streams.
"""

from __future__ import annotations

import math
from collections import deque

# the latest streams' first audios kept, and the share of them a prediction covers
WINDOW_STREAMS = 32
QUANTILE = 0.9


class FirstAudioWindow:
    """The latest `WINDOW_STREAMS` first-audio times (seconds from submit)."""

    def __init__(self, window_streams: int = WINDOW_STREAMS, quantile: float = QUANTILE) -> None:
        if window_streams < 1:
            raise ValueError("window_streams must be >= 1")
        if not 0.0 < quantile <= 1.0:
            raise ValueError("quantile must be in (0, 1]")
        self._times_s: deque[float] = deque(maxlen=window_streams)
        self._quantile = quantile

    def record(self, first_audio_s: float) -> None:
        """A stream's first audio left `first_audio_s` after its submit (ignored unless
        finite and >= 0)."""
        if math.isfinite(first_audio_s) and first_audio_s >= 0.0:
            self._times_s.append(first_audio_s)

    def clear(self) -> None:
        """Forget every time (the engine's calibration streams, started all at once, say
        nothing of a request's start)."""
        self._times_s.clear()

    def predict_s(self) -> float:
        """The quantile of the window (nearest rank; 0.0 before any stream)."""
        times = sorted(self._times_s)
        if not times:
            return 0.0
        rank = max(1, math.ceil(self._quantile * len(times)))
        return times[rank - 1]
