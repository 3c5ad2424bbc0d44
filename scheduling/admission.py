"""Admission control: accept a new stream, or reject it at once with a Retry-After.

Capacity is measured by the engine: audio seconds the whole pipeline produces per wall
second (a moving average). Every playing stream drains 1 audio second per second, so at
most `capacity * capacity_headroom` streams can play without stalling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.validation import (
    check_bool,
    check_fraction,
    check_int,
    check_non_negative,
    require_finite_time,
)


@dataclass(frozen=True)
class AdmissionConfig:
    # streams at once at most; 0 = the engine's calibrated capacity (no cap when the
    # engine does not calibrate)
    max_streams: int = 0
    # share of the measured capacity that may be committed (the measured default: the
    # estimate already includes the talker's share of the CPU, so no further margin)
    capacity_headroom: float = 1.0
    enabled: bool = True  # False: accept everything
    # Retry-After when no active stream has a finish estimate: a 429 costs the client one
    # round trip, and the next answer carries a real estimate, so retrying soon is cheap.
    fallback_retry_after_s: int = 1
    # Streams that may be in their start phase at once (0 = no limit). A stream's start
    # costs more than its steady state (its first sentence through the talker, the small
    # chunks of the ramp), so streams that all start together overrun the vocoder although
    # their steady state fits. A request admitted (by capacity) while the start phase is
    # full waits for a start slot, first come first served, holding its slot; it gets a
    # 429 "starting" with `start_retry_after_s` only after `start_queue_timeout_s`.
    # Applies only to an engine that calibrated its capacity (as the default max_streams
    # does).
    max_starting_streams: int = 3
    # a stream is in its start phase until it has sent this many chunks
    start_phase_chunks: int = 3
    start_retry_after_s: int = 1  # Retry-After of a 429 for "starting": a start ends soon
    # how long an admitted request waits for a start slot before its 429 "starting"
    # (0: no wait, the 429 at once)
    start_queue_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check_int("max_streams", self.max_streams, 0)
        check_fraction("capacity_headroom", self.capacity_headroom)
        check_bool("enabled", self.enabled)
        check_int("fallback_retry_after_s", self.fallback_retry_after_s, 1)
        check_int("max_starting_streams", self.max_starting_streams, 0)
        check_int("start_phase_chunks", self.start_phase_chunks, 1)
        check_int("start_retry_after_s", self.start_retry_after_s, 1)
        check_non_negative("start_queue_timeout_s", self.start_queue_timeout_s)


@dataclass(frozen=True, slots=True)
class Decision:
    accept: bool
    retry_after_s: int | None  # whole seconds >= 1 when rejected; None when accepted
    reason: str  # "ok", "disabled", "max_streams", "capacity" or "starting"


_ACCEPT = Decision(accept=True, retry_after_s=None, reason="ok")
_ACCEPT_DISABLED = Decision(accept=True, retry_after_s=None, reason="disabled")


class Admission:
    def __init__(self, config: AdmissionConfig) -> None:
        self._config = config

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    def decide(
        self,
        now_s: float,
        active_streams: int,
        capacity_audio_s_per_s: float,
        finish_times_s: Iterable[float] = (),
        default_max_streams: int = 0,
    ) -> Decision:
        """Accept or reject one new stream, given `active_streams` already playing.

        `capacity_audio_s_per_s` <= 0 (or NaN) means not measured yet: only max_streams
        applies. `finish_times_s` are the active streams' estimated finish times (monotonic
        s); non-finite ones are ignored. Reject when max_streams (when 0:
        `default_max_streams`, 0 = no cap) is reached, or when the streams that would be
        playing (active + this one) exceed capacity * headroom. The start phase is
        decided apart (`start_slot_free`, `starting`): a request the capacity admits
        waits for a start slot rather than being refused.
        """
        config = self._config
        if not config.enabled:
            return _ACCEPT_DISABLED
        require_finite_time("now_s", now_s)
        if active_streams < 0:
            raise ValueError(f"active_streams must be >= 0, got {active_streams!r}")
        max_streams = config.max_streams or default_max_streams
        if max_streams and active_streams >= max_streams:
            reason = "max_streams"
        elif (
            capacity_audio_s_per_s > 0
            and active_streams + 1 > capacity_audio_s_per_s * config.capacity_headroom
        ):
            reason = "capacity"
        else:
            return _ACCEPT
        return Decision(False, self._retry_after_s(now_s, finish_times_s), reason)

    def _retry_after_s(self, now_s: float, finish_times_s: Iterable[float]) -> int:
        nearest_s = min((t for t in finish_times_s if math.isfinite(t)), default=None)
        if nearest_s is None:
            return self._config.fallback_retry_after_s
        return max(1, math.ceil(nearest_s - now_s))

    def start_slot_free(self, starting_streams: int) -> bool:
        """Whether one more stream may start while `starting_streams` are in their start
        phase (or hold a start slot): always with `max_starting_streams` 0 or admission
        off."""
        if starting_streams < 0:
            raise ValueError(f"starting_streams must be >= 0, got {starting_streams!r}")
        config = self._config
        limit = config.max_starting_streams if config.enabled else 0
        return not limit or starting_streams < limit

    def starting(self) -> Decision:
        """The refusal of a request that found the start phase full (and, with
        `start_queue_timeout_s` > 0, waited that long for a start slot)."""
        return Decision(False, self._config.start_retry_after_s, "starting")
