"""Selection policies: which ready streams get the next vocoder turn.

A policy is a small class behind one interface, built by `create_policy` from the
configured name. Policies read the stream table and never change it; the scheduler admits
unseen streams before it asks. Only fifo keeps state of its own (its sticky slots).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Set
from enum import StrEnum
from itertools import chain, islice
from typing import Protocol

from scheduling.horizon import StreamTable


class PolicyName(StrEnum):
    FIFO = "fifo"  # K sticky slots in arrival order, held until the stream is forgotten
    EDF = "edf"  # earliest playback deadline first, re-ranked at every chunk boundary


class SelectionPolicy(Protocol):
    name: str

    def select(
        self, now_s: float, ready_ids: Collection[str], ready: Set[str], table: StreamTable
    ) -> list[str]:
        """At most K of `ready_ids` (distinct, in arrival order; `ready`: the same, as a set)."""
        ...

    def forget(self, stream_id: str) -> None: ...


class FifoPolicy:
    """K slots filled in arrival order and held until forgotten; K = 0 means everyone."""

    name = PolicyName.FIFO.value

    def __init__(self, window: int) -> None:
        self._window = window
        self._slots: dict[str, None] = {}  # holders in the order they took a slot

    def select(
        self, now_s: float, ready_ids: Collection[str], ready: Set[str], table: StreamTable
    ) -> list[str]:
        if self._window == 0:
            return list(ready_ids)
        free = self._window - len(self._slots)
        if free > 0:
            for stream_id in ready_ids:
                if stream_id not in self._slots:
                    self._slots[stream_id] = None
                    free -= 1
                    if free == 0:
                        break
        # A holder without a ready chunk keeps its slot: nobody else gets that turn.
        return [stream_id for stream_id in self._slots if stream_id in ready]

    def forget(self, stream_id: str) -> None:
        self._slots.pop(stream_id, None)


class EdfPolicy:
    """Rank by `(0 if protected else 1, deadline_s, first_seen_s, position)`, take K.

    A stream is protected when it has audio and `horizon_s - now_s <= safety margin`: a
    player about to run dry is never passed over for streams still waiting for their first
    audio. Rather than keying every ready stream, `select` walks the table's sorted keys
    (protected horizons first, then every other deadline) and stops after K ready streams:
    a turn costs one pass over `ready_ids` in C plus a short walk. Known streams that are
    not ready are skipped on the way; when more than `visits_per_ready * len(ready) +
    min_walk_visits` key groups have been visited, ranking the ready streams directly is
    cheaper, and gives the same answer.
    """

    name = PolicyName.EDF.value

    def __init__(
        self,
        window: int,
        safety_margin_s: float,
        *,
        visits_per_ready: int = 2,
        min_walk_visits: int = 64,
    ) -> None:
        if window <= 0:
            raise ValueError("edf needs a window > 0")
        self._window = window
        self._safety_margin_s = safety_margin_s
        self._visits_per_ready = visits_per_ready
        self._min_walk_visits = min_walk_visits

    def select(
        self, now_s: float, ready_ids: Collection[str], ready: Set[str], table: StreamTable
    ) -> list[str]:
        limit = min(self._window, len(ready))
        chosen: list[str] = []
        if limit == 0:
            return chosen
        visits_left = self._visits_per_ready * len(ready) + self._min_walk_visits
        for group in self._groups_by_urgency(now_s, table):
            if visits_left <= 0:
                return self._rank_ready(now_s, ready_ids, table, limit)
            visits_left -= 1
            _take(group, ready, ready_ids, limit - len(chosen), chosen)
            if len(chosen) == limit:
                break
        return chosen

    def _is_protected(self, horizon_s: float, now_s: float) -> bool:
        return horizon_s - now_s <= self._safety_margin_s

    def _groups_by_urgency(self, now_s: float, table: StreamTable) -> Iterator[Set[str]]:
        """Groups of streams with equal (deadline_s, first_seen_s), most urgent first."""
        margin_s = self._safety_margin_s
        audio, fresh = table.audio, table.fresh
        audio_keys = iter(audio.keys)
        # Protection is monotone in the horizon: the protected keys are a prefix.
        unprotected: tuple[tuple[float, float], ...] = ()
        for key in audio_keys:
            if key[0] - now_s > margin_s:
                unprotected = (key,)  # the first of the rest
                break
            yield audio.members(key)
        # Then every other stream by deadline: unprotected audio keys merged with the fresh
        # ones. A key in both indexes comes out twice in a row; its groups form one tie.
        merged = heapq.merge(chain(unprotected, audio_keys), fresh.keys)
        previous: tuple[float, float] | None = None
        for key in merged:
            if key == previous:
                continue
            previous = key
            group = fresh.members(key)
            if not self._is_protected(key[0], now_s):  # protected audio groups came first
                with_audio = audio.members(key)
                if with_audio:
                    group = group | with_audio if group else with_audio
            yield group

    def _rank_ready(
        self, now_s: float, ready_ids: Collection[str], table: StreamTable, limit: int
    ) -> list[str]:
        """The same ranking, keying every ready stream (docs/scheduling.md's formula, verbatim)."""

        def rank(item: tuple[int, str]) -> tuple[int, float, float, int]:
            position, stream_id = item
            state = table[stream_id]  # the scheduler admitted every ready stream
            deadline_s, first_seen_s = table.key(state)
            protected = state.horizon_s is not None and self._is_protected(state.horizon_s, now_s)
            return (0 if protected else 1, deadline_s, first_seen_s, position)

        best = heapq.nsmallest(limit, enumerate(ready_ids), key=rank)
        return [stream_id for _, stream_id in best]

    def forget(self, stream_id: str) -> None:
        """EDF keeps nothing per stream."""


def _take(
    group: Set[str], ready: Set[str], ready_ids: Collection[str], need: int, out: list[str]
) -> None:
    """Append up to `need` ready members of one key group, in `ready_ids` order."""
    if len(group) == 1:
        for stream_id in group:
            if stream_id in ready:
                out.append(stream_id)
        return
    hits = set(filter(ready.__contains__, group))
    if len(hits) <= 1:
        out.extend(hits)
    else:  # equal deadline and first_seen: the position in ready_ids decides
        out.extend(islice(filter(hits.__contains__, ready_ids), need))


def create_policy(name: str, window: int, safety_margin_s: float) -> SelectionPolicy:
    """The policy for a validated config (see SchedulingConfig)."""
    match PolicyName(name):
        case PolicyName.FIFO:
            return FifoPolicy(window)
        case PolicyName.EDF:
            return EdfPolicy(window, safety_margin_s)
