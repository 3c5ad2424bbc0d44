"""Per-stream playback horizon, and the deadline indexes the selection policies read.

A stream's player runs dry at its horizon. Until its first audio a stream has a first-chunk
deadline instead (`first_seen_s + first_chunk_s`). The table keeps every known stream in
one of two indexes, ordered by the exact key the EDF policy ranks on:

- `audio`: streams with audio, key `(horizon_s, first_seen_s)`;
- `fresh`: streams without audio yet, key `(first_seen_s + first_chunk_s, first_seen_s)`.

The indexes are updated when a horizon changes (a few streams per vocoder turn), so that
selecting K streams out of thousands walks only the most urgent keys instead of ranking
every ready stream at every turn.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Set
from typing import NamedTuple

from scheduling.sortedlist import SortedBlockList

Key = tuple[float, float]  # (deadline_s, first_seen_s)

_NO_MEMBERS: frozenset[str] = frozenset()


class StreamState(NamedTuple):
    first_seen_s: float  # when the stream was admitted or first seen (monotonic s)
    horizon_s: float | None = None  # when its player runs dry; None until the first audio
    emitted_audio_s: float = 0.0  # audio seconds that left the server for this stream
    # its player's rate (audio s per s): 1 for a listener; a job's virtual player plays at
    # the rate it needs, 0 (never runs dry) for a best-effort job (scheduling/jobs.py)
    rate: float = 1.0


class KeyIndex:
    """Stream ids grouped by an exact sort key, with the distinct keys kept sorted.

    Ids that share a key (streams first seen in the same call, say) form one group; the
    policy orders a group by position in `ready_ids`. Callers must not mutate what
    `keys` and `members` return.
    """

    __slots__ = ("_groups", "_keys", "_size")

    def __init__(self) -> None:
        self._keys: SortedBlockList[Key] = SortedBlockList()  # distinct keys, ascending
        self._groups: dict[Key, set[str]] = {}
        self._size = 0

    @property
    def keys(self) -> SortedBlockList[Key]:
        return self._keys

    def members(self, key: Key) -> Set[str]:
        return self._groups.get(key, _NO_MEMBERS)

    def __len__(self) -> int:
        return self._size

    def add(self, key: Key, stream_id: str) -> None:
        groups = self._groups
        group = groups.get(key)
        if group is None:
            groups[key] = {stream_id}
            self._keys.add(key)
        else:
            group.add(stream_id)
        self._size += 1

    def remove(self, key: Key, stream_id: str) -> None:
        groups = self._groups
        group = groups[key]
        group.remove(stream_id)
        self._size -= 1
        if not group:
            del groups[key]
            self._keys.remove(key)

    def move(self, old: Key, new: Key, stream_id: str) -> None:
        """`remove(old, stream_id)` then `add(new, stream_id)`: one key edit when the
        stream had its key to itself and the new key is free (the usual case)."""
        groups = self._groups
        group = groups[old]
        if len(group) == 1 and new not in groups and stream_id in group:
            del groups[old]
            groups[new] = group
            self._keys.move(old, new)
            return
        self.remove(old, stream_id)
        self.add(new, stream_id)

    def items(self) -> Iterable[tuple[Key, Set[str]]]:
        return ((key, self._groups[key]) for key in self._keys)


class StreamTable:
    """Every known stream's state, plus the two deadline indexes (see the module doc)."""

    def __init__(self, first_chunk_s: float) -> None:
        self._first_chunk_s = first_chunk_s
        self._states: dict[str, StreamState] = {}
        self._known: set[str] = set()  # the keys of _states, as a set: the fastest superset test
        self.audio = KeyIndex()
        self.fresh = KeyIndex()

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, stream_id: str) -> StreamState:
        return self._states[stream_id]

    def get(self, stream_id: str) -> StreamState | None:
        return self._states.get(stream_id)

    def key(self, state: StreamState) -> Key:
        """The EDF key of a stream: `(deadline_s, first_seen_s)`."""
        if state.horizon_s is None:
            return (state.first_seen_s + self._first_chunk_s, state.first_seen_s)
        return (state.horizon_s, state.first_seen_s)

    def admit(
        self, stream_id: str, at_s: float, horizon_s: float | None = None, rate: float = 1.0
    ) -> StreamState:
        """The stream's state, admitting it at `at_s` when it is not known yet. A job's
        stream comes with its virtual player's horizon and rate (scheduling/jobs.py)."""
        state = self._states.get(stream_id)
        if state is None:
            state = StreamState(first_seen_s=at_s, horizon_s=horizon_s, rate=rate)
            self._states[stream_id] = state
            self._known.add(stream_id)
            self._index(state).add(self.key(state), stream_id)
        return state

    def admit_unseen(self, stream_ids: Collection[str], at_s: float) -> None:
        """Admit at `at_s` every one of `stream_ids` not known yet (one C pass when none)."""
        if not self._known.issuperset(stream_ids):
            for stream_id in stream_ids:
                self.admit(stream_id, at_s)

    def record_audio(self, stream_id: str, duration_s: float, emitted_at_s: float) -> None:
        states = self._states
        state = states.get(stream_id)
        if state is None:
            state = self.admit(stream_id, emitted_at_s)
        # A late chunk restarts a starved player at its emission time; an early one extends
        # the buffer.
        horizon_s = state.horizon_s
        first_seen_s = state.first_seen_s
        rate = state.rate
        # d seconds of audio last d / rate at its player's rate (1 but for a job's)
        played_s = duration_s if rate == 1.0 else (duration_s / rate if rate > 0 else math.inf)
        if horizon_s is None:
            self.fresh.remove(self.key(state), stream_id)
            new_horizon_s = emitted_at_s + played_s
            self.audio.add((new_horizon_s, first_seen_s), stream_id)
        else:
            start_s = horizon_s if horizon_s > emitted_at_s else emitted_at_s
            new_horizon_s = start_s + played_s
            if new_horizon_s != horizon_s:
                self.audio.move((horizon_s, first_seen_s), (new_horizon_s, first_seen_s), stream_id)
        states[stream_id] = StreamState(
            first_seen_s, new_horizon_s, state.emitted_audio_s + duration_s, rate
        )

    def ack_playback(self, stream_id: str, played_s: float, at_s: float) -> None:
        state = self.admit(stream_id, at_s)
        horizon_s = at_s + (state.emitted_audio_s - played_s)
        self._replace(
            stream_id,
            state,
            StreamState(state.first_seen_s, horizon_s, state.emitted_audio_s),  # a listener: 1x
        )

    def pace(self, stream_id: str, horizon_s: float, rate: float, at_s: float) -> None:
        """A job's stream gets a new virtual player: its horizon and rate (someone started
        or stopped listening, or the rate it needs changed)."""
        state = self.admit(stream_id, at_s)
        self._replace(
            stream_id,
            state,
            StreamState(state.first_seen_s, horizon_s, state.emitted_audio_s, rate),
        )

    def forget(self, stream_id: str) -> None:
        state = self._states.pop(stream_id, None)
        if state is not None:
            self._known.discard(stream_id)
            self._index(state).remove(self.key(state), stream_id)

    def _index(self, state: StreamState) -> KeyIndex:
        return self.fresh if state.horizon_s is None else self.audio

    def _replace(self, stream_id: str, old: StreamState, new: StreamState) -> None:
        self._index(old).remove(self.key(old), stream_id)
        self._index(new).add(self.key(new), stream_id)
        self._states[stream_id] = new

    def check_invariants(self) -> None:
        """Raise AssertionError when the indexes disagree with the states (for tests)."""
        seen: set[str] = set()
        for index, with_audio in ((self.audio, True), (self.fresh, False)):
            keys = list(index.keys)
            if keys != sorted(set(keys)):
                raise AssertionError("index keys are not sorted and distinct")
            for key, group in index.items():
                if not group:
                    raise AssertionError(f"empty group for key {key}")
                for stream_id in group:
                    state = self._states.get(stream_id)
                    if state is None or (state.horizon_s is not None) != with_audio:
                        raise AssertionError(f"{stream_id!r} is in the wrong index")
                    if self.key(state) != key:
                        raise AssertionError(f"{stream_id!r} is filed under a stale key")
                    if stream_id in seen:
                        raise AssertionError(f"{stream_id!r} is indexed twice")
                    seen.add(stream_id)
            if len(index) != sum(len(group) for _, group in index.items()):
                raise AssertionError("index size is off")
        if seen != self._states.keys() or self._known != self._states.keys():
            raise AssertionError("indexed ids differ from the known streams")
