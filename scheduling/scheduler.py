"""The playback scheduler: per-stream horizons in, the next K streams out.

Pure: every call takes the time it needs (monotonic seconds); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import KeysView, Sequence, Set
from dataclasses import dataclass

from scheduling.errors import ConfigError
from scheduling.horizon import StreamState, StreamTable
from scheduling.policies import PolicyName, SelectionPolicy, create_policy
from scheduling.validation import (
    check_choice,
    check_int,
    check_non_negative,
    check_positive,
    require_finite_time,
)


@dataclass(frozen=True)
class SchedulingConfig:
    policy: str = "edf"  # fifo | edf
    # K: streams per vocoder turn; 0 = no window (fifo only). 1 is the measured default: on a
    # CPU a batch of K chunks is K decodes in a row whose audio leaves together.
    active_stream_window: int = 1
    first_chunk_ms: float = 100.0  # a stream's first audio is due this long after it is seen
    safety_margin_ms: float = 50.0  # a player with this little buffer left is protected (edf)

    def __post_init__(self) -> None:
        check_choice("policy", self.policy, tuple(PolicyName))
        check_int("active_stream_window", self.active_stream_window, 0)
        if self.policy == PolicyName.EDF and self.active_stream_window <= 0:
            raise ConfigError("edf requires active_stream_window > 0")
        check_positive("first_chunk_ms", self.first_chunk_ms)
        check_non_negative("safety_margin_ms", self.safety_margin_ms)


class PlaybackScheduler:
    """Tracks each stream's playback horizon and picks the streams for the next turn.

    Not thread-safe: one owner (the engine's event loop, or a simulator) calls it.
    """

    def __init__(self, config: SchedulingConfig, policy: SelectionPolicy | None = None) -> None:
        """`policy` replaces the one `config.policy` names (tests, custom policies)."""
        self._config = config
        self._table = StreamTable(first_chunk_s=config.first_chunk_ms / 1000)
        if policy is None:
            policy = create_policy(
                config.policy, config.active_stream_window, config.safety_margin_ms / 1000
            )
        self._policy = policy

    @property
    def config(self) -> SchedulingConfig:
        return self._config

    @property
    def policy_name(self) -> str:
        return self._policy.name

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._table

    def __len__(self) -> int:
        return len(self._table)

    def admit(
        self, stream_id: str, at_s: float, *, horizon_s: float | None = None, rate: float = 1.0
    ) -> None:
        """Start tracking a stream at `at_s` (its request arrived); no-op when known.

        Its first-chunk deadline then counts from `at_s`; otherwise a stream is admitted
        when first seen by select, record_audio or ack_playback. A job's stream comes with
        its virtual player (`horizon_s`, may be inf; `rate` >= 0: SPEC section 5).
        """
        require_finite_time("at_s", at_s)
        _check_pace(horizon_s, rate)
        self._table.admit(stream_id, at_s, horizon_s, rate)

    def pace(self, stream_id: str, horizon_s: float, rate: float, at_s: float) -> None:
        """A job's stream gets a new virtual player (horizon, rate), from `at_s`."""
        require_finite_time("at_s", at_s)
        _check_pace(horizon_s, rate)
        self._table.pace(stream_id, horizon_s, rate, at_s)

    def record_audio(
        self, stream_id: str, frames: int, sample_rate_hz: float, emitted_at_s: float
    ) -> None:
        """One PCM chunk of `frames` samples left the server at `emitted_at_s`.

        Ignored when frames <= 0 or sample_rate_hz <= 0. A stream not seen before is
        admitted at `emitted_at_s`.
        """
        require_finite_time("emitted_at_s", emitted_at_s)
        if frames <= 0 or sample_rate_hz <= 0:
            return
        self._table.record_audio(stream_id, frames / sample_rate_hz, emitted_at_s)

    def ack_playback(self, stream_id: str, played_s: float, at_s: float) -> None:
        """The client has played `played_s` seconds of this stream by `at_s`.

        Client truth replaces the estimate: horizon_s = at_s + (emitted_audio_s - played_s),
        as sent, not clamped. An unknown stream is admitted at `at_s` first (with nothing
        emitted, its horizon becomes at_s - played_s).
        """
        require_finite_time("at_s", at_s)
        if not (math.isfinite(played_s) and played_s >= 0):
            raise ValueError(f"played_s must be a finite number >= 0, got {played_s!r}")
        self._table.ack_playback(stream_id, played_s, at_s)

    def forget(self, stream_id: str) -> None:
        """Drop every trace of the stream; unknown ids are fine."""
        self._table.forget(stream_id)
        self._policy.forget(stream_id)

    def select(
        self, now_s: float, ready_ids: Sequence[str] | KeysView[str], *, all_admitted: bool = False
    ) -> list[str]:
        """The streams that get the next vocoder turn, in order, at most K.

        `ready_ids` are the distinct streams with a chunk ready, in arrival order: a list,
        or the keys of an insertion-ordered dict (which saves copying them into a set,
        worth it at 10^5 streams). A stream seen here for the first time is admitted at
        `now_s`; apart from that (and fifo's sticky slots) selecting changes nothing.
        `all_admitted`: the caller admitted every ready stream itself (the engine does at
        submit), which saves the pass that looks for unseen ones.
        """
        require_finite_time("now_s", now_s)
        if isinstance(ready_ids, KeysView):
            ready: Set[str] = ready_ids
        else:
            ready = set(ready_ids)
            if len(ready) != len(ready_ids):
                raise ValueError("ready_ids must not repeat a stream")
        if not all_admitted:
            self._table.admit_unseen(ready_ids, now_s)
        return self._policy.select(now_s, ready_ids, ready, self._table)

    def state(self, stream_id: str) -> StreamState | None:
        return self._table.get(stream_id)

    def horizon_s(self, stream_id: str) -> float | None:
        """When the stream's player runs dry; None when unknown or before its first audio."""
        state = self._table.get(stream_id)
        return None if state is None else state.horizon_s

    def emitted_audio_s(self, stream_id: str) -> float:
        """Audio seconds emitted for the stream; 0.0 when unknown."""
        state = self._table.get(stream_id)
        return 0.0 if state is None else state.emitted_audio_s

    def first_seen_s(self, stream_id: str) -> float | None:
        state = self._table.get(stream_id)
        return None if state is None else state.first_seen_s

    def slack_s(self, stream_id: str, now_s: float) -> float | None:
        """horizon_s - now_s; None when the stream has no audio yet (or is unknown)."""
        horizon_s = self.horizon_s(stream_id)
        return None if horizon_s is None else horizon_s - now_s

    def check_invariants(self) -> None:
        """Raise AssertionError when the internal indexes disagree (for tests)."""
        self._table.check_invariants()


def _check_pace(horizon_s: float | None, rate: float) -> None:
    if horizon_s is not None and math.isnan(horizon_s):
        raise ValueError("horizon_s must be a time or inf, got nan")
    if not (rate >= 0 and not math.isinf(rate)):
        raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
