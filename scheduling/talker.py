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
  advance: its first audio is the event that changes it);
- with `max_queued_s` set, a stream with more than that much audio talked but not yet
  vocoded sits out too (no retry time: the vocoder's next chunk brings it back). The
  book plans with `config.paced()` while the vocoder is busy, which sets it to
  `busy_max_queued_s`.

Work-conserving (`run_ahead`, on by default): when no stream under the mark wants the
step, so that the talker would otherwise idle, the step goes to the streams above it
instead, by the same key, most urgent first (the engine's book plans with `paced()`,
which does not run ahead, while the vocoder is busy: on a CPU the two share the cores); only streams
with at most `high_water_s` of audio produced but not yet vocoded run ahead, which
bounds the frames waiting for the vocoder per stream (the unread audio behind the
vocoder is bounded by the audio channel's cap, which parks a stream). Under load a
stream under the mark always goes first, the vocoder has chunks waiting, and the mark
paces every stream as before; on an idle server a long text runs at the machine's speed,
not its playback's.

Pure: plain numbers in, a `TalkerPlan` out; the clock is passed in.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from scheduling.errors import ConfigError
from scheduling.sortedlist import SortedBlockList
from scheduling.validation import check_bool, check_int, check_non_negative, check_positive

# A timer set for the high-water mark may fire a hair early; within this it counts as under.
HIGH_WATER_SLACK_S = 0.001

# How far a stream's filed `horizon + queued` may be from the exact sum before it is
# re-filed. A chunk sent moves the horizon up and the queued audio down by the same
# amount: the sum stays the same but for rounding, and re-filing it for that would cost
# a sorted-list move per chunk. The walk allows for the difference (see TalkerQueue).
RUN_OUT_FILING_TOLERANCE_S = 1e-6


@dataclass(frozen=True)
class TalkerOrderConfig:
    batch: int = 1  # segments stepped together at most
    high_water_s: float = 8.0  # a stream this far ahead of its playback sits out
    first_chunk_s: float = 0.1  # first-audio deadline after the stream is first seen
    safety_margin_s: float = 0.05  # a playing stream this close to running dry is protected
    run_ahead: bool = True  # an otherwise idle step goes to streams above the mark
    # a stream with more than this much audio talked but not yet vocoded sits out (None:
    # no cap); the book's paced order sets it while the vocoder is busy (`paced`)
    max_queued_s: float | None = None
    busy_max_queued_s: float | None = None  # the cap of `paced()`; None: none

    def __post_init__(self) -> None:
        check_int("batch", self.batch, 1)
        check_bool("run_ahead", self.run_ahead)
        check_positive("high_water_s", self.high_water_s)
        check_positive("first_chunk_s", self.first_chunk_s)
        check_non_negative("safety_margin_s", self.safety_margin_s)
        if self.max_queued_s is not None:
            check_positive("max_queued_s", self.max_queued_s)
            if self.run_ahead:  # an order that runs ahead has no work to hold back
                raise ConfigError("max_queued_s: only for an order that does not run ahead")
        if self.busy_max_queued_s is not None:
            check_positive("busy_max_queued_s", self.busy_max_queued_s)

    def paced(self) -> TalkerOrderConfig:
        """The order while the vocoder is busy (a chunk waiting, or every worker decoding
        while other streams have work): no running ahead, and a stream with more than
        `busy_max_queued_s` of frames waiting for the vocoder sits out. The talker and
        the vocoder share the cores: frames the vocoder cannot use soon, made now, take
        CPU from the chunks it has waiting."""
        return replace(self, run_ahead=False, max_queued_s=self.busy_max_queued_s)


class TalkerCandidate(NamedTuple):
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
    if config.max_queued_s is not None and candidate.queued_audio_s > config.max_queued_s:
        return None  # enough frames wait for the vocoder
    protected = horizon_s is not None and ahead_s <= config.safety_margin_s
    return (0 if protected else 1, run_out_s, candidate.order)


def plan_talker_step(
    candidates: Iterable[TalkerCandidate], now_s: float, config: TalkerOrderConfig
) -> TalkerPlan:
    """The streams for the next talker step (see the module doc)."""
    candidates = list(candidates)
    keyed: list[tuple[tuple[int, float, int], str]] = []
    retry_in_s: float | None = None
    for candidate in candidates:
        key = talker_key(candidate, now_s, config)
        if key is not None:
            keyed.append((key, candidate.stream_id))
        elif candidate.horizon_s is not None:
            ahead_s = max(candidate.horizon_s, now_s) + candidate.queued_audio_s - now_s
            if ahead_s <= config.high_water_s + HIGH_WATER_SLACK_S:
                continue  # capped by its queued frames: the vocoder's emit brings it back
            wait_s = ahead_s - config.high_water_s
            retry_in_s = wait_s if retry_in_s is None else min(retry_in_s, wait_s)
    if not keyed and config.run_ahead:  # the talker would idle: run ahead
        keyed = [
            ((1, run_out_s, candidate.order), candidate.stream_id)
            for candidate in candidates
            if (run_out_s := _run_ahead_s(candidate, now_s, config)) is not None
        ]
    best = heapq.nsmallest(config.batch, keyed) if len(keyed) > config.batch else sorted(keyed)
    return TalkerPlan(tuple(stream_id for _, stream_id in best), retry_in_s)


def _run_ahead_s(
    candidate: TalkerCandidate, now_s: float, config: TalkerOrderConfig
) -> float | None:
    """The run-out time of a stream above the mark that may run ahead (at most
    `high_water_s` of its audio waits for the vocoder), else None."""
    if candidate.queued_audio_s > config.high_water_s:
        return None
    horizon_s = now_s if candidate.horizon_s is None else max(candidate.horizon_s, now_s)
    return horizon_s + candidate.queued_audio_s


_Index = SortedBlockList[tuple[float, int, str]]


def _never(stream_id: str) -> bool:
    return False


class TalkerQueue:
    """The talker's candidates, indexed so that a plan walks only the most urgent few.

    `plan` gives the same streams, in the same order, as `plan_talker_step` over the same
    candidates (a property test pins the two together), without keying every candidate
    at every step. Candidates are kept in sorted lists that change only when a candidate
    changes (`update`: its horizon or queued audio moved; `remove`):

    - fresh streams (no horizon, nothing queued) by first-audio deadline;
    - streams without a horizon but with frames queued by queued audio: they run out at
      now + queued;
    - streams with a horizon, twice: by `horizon + queued` and by `queued`. Their run-out
      time is max(horizon, now) + queued = max(horizon + queued, now + queued), the larger
      of their two list values, so walking both lists in step yields them in exact order
      once the walk's threshold (the larger of the two values last read) passes them.
      The `horizon + queued` filed for a stream is re-filed only when the exact sum
      moved by more than RUN_OUT_FILING_TOLERANCE_S (a chunk sent leaves it unchanged
      but for rounding); the walk lowers that list's values by the tolerance, so the
      order it yields stays exact.

    A stream that `skip(stream_id)` names (a parked stream) is passed over.
    """

    def __init__(self, first_chunk_s: float) -> None:
        self._first_chunk_s = first_chunk_s
        self._entries: dict[str, TalkerCandidate] = {}
        self._fresh: _Index = SortedBlockList()  # (deadline, order, id)
        self._queued: _Index = SortedBlockList()  # no horizon: (queued, order, id)
        self._by_run_out: _Index = SortedBlockList()  # (horizon + queued, order, id)
        self._by_queue: _Index = SortedBlockList()  # horizon known: (queued, order, id)
        # the key each stream with a horizon is filed under in _by_run_out: within the
        # tolerance of its exact horizon + queued
        self._run_out_filed: dict[str, tuple[float, int, str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._entries

    def update(self, candidate: TalkerCandidate) -> None:
        """Add a candidate, or replace what is known of it."""
        stream_id = candidate.stream_id
        entries = self._entries
        old = entries.get(stream_id)
        entries[stream_id] = candidate
        if old is None:
            self._index(candidate)
            return
        if old.horizon_s is not None and candidate.horizon_s is not None:
            # the usual case (a playing stream's horizon or queue moved): both keys live in
            # the two horizon lists; move those that changed
            order = candidate.order
            queued_s = candidate.queued_audio_s
            filed = self._run_out_filed[stream_id]
            run_out_s = candidate.horizon_s + queued_s
            if abs(run_out_s - filed[0]) > RUN_OUT_FILING_TOLERANCE_S or filed[1] != order:
                new_run_out = (run_out_s, order, stream_id)
                self._by_run_out.move(filed, new_run_out)
                self._run_out_filed[stream_id] = new_run_out
            if old.queued_audio_s != queued_s or old.order != order:
                self._by_queue.move(
                    (old.queued_audio_s, old.order, stream_id), (queued_s, order, stream_id)
                )
            return
        old_keys, new_keys = self._keys(old), self._keys(candidate)
        if len(old_keys) == len(new_keys):  # the same lists: move only the keys that changed
            for (index, old_key), (new_index, new_key) in zip(old_keys, new_keys, strict=True):
                if old_key != new_key or index is not new_index:
                    index.remove(old_key)
                    new_index.add(new_key)
            return
        self._unindex(old)
        self._index(candidate)

    def remove(self, stream_id: str) -> None:
        old = self._entries.pop(stream_id, None)
        if old is not None:
            self._unindex(old)

    def candidates(self) -> Iterator[TalkerCandidate]:
        return iter(self._entries.values())

    def plan(
        self, now_s: float, config: TalkerOrderConfig, skip: Callable[[str], bool] = _never
    ) -> TalkerPlan:
        """The next step's streams. `retry_in_s` is exact whenever the batch is not full
        (only then does the talker wait on it)."""
        limit_s = now_s + config.high_water_s + HIGH_WATER_SLACK_S
        retry: list[float] = []
        cap_s = config.max_queued_s
        entries = self._entries

        def under_mark() -> Iterator[tuple[float, int, str]]:
            for item in self._walk_with_horizon(now_s):
                if item[0] > limit_s:  # it and every later one sit out
                    if skip(item[2]):
                        continue
                    retry.append(item[0] - now_s - config.high_water_s)
                    return
                if cap_s is not None and entries[item[2]].queued_audio_s > cap_s:
                    continue  # enough frames wait for the vocoder
                yield item

        with_horizon = under_mark()
        # those with frames but no audio yet run out at now + queued
        no_audio_limit_s = limit_s if cap_s is None else min(limit_s, now_s + cap_s)
        no_audio = itertools.takewhile(
            lambda item: item[0] <= no_audio_limit_s, self._no_audio(now_s)
        )
        if cap_s is not None:  # exact: a sum can round up to the limit
            no_audio = (i for i in no_audio if entries[i[2]].queued_audio_s <= cap_s)
        chosen = self._choose(now_s, config, with_horizon, no_audio, skip)
        if len(chosen) == config.batch:
            return TalkerPlan(tuple(chosen), None)
        for _ in with_horizon:  # drain: the first stream above the mark sets the retry
            pass
        if not chosen and config.run_ahead:  # the talker would idle: run ahead
            chosen = self._run_ahead(now_s, config, limit_s, skip)
        return TalkerPlan(tuple(chosen), retry[0] if retry else None)

    def _run_ahead(
        self, now_s: float, config: TalkerOrderConfig, limit_s: float, skip: Callable[[str], bool]
    ) -> list[str]:
        """Up to `batch` streams above the mark, in run-out order, with at most
        `high_water_s` of audio waiting for the vocoder. Only streams with a horizon: one
        without is above the mark only by its queued audio, which then exceeds the cap."""
        chosen: list[str] = []
        entries = self._entries
        for run_out_s, _, stream_id in self._walk_with_horizon(now_s):
            if run_out_s <= limit_s or skip(stream_id):
                continue  # under the mark (passed over above) or busy
            if entries[stream_id].queued_audio_s > config.high_water_s:
                continue
            chosen.append(stream_id)
            if len(chosen) == config.batch:
                break
        return chosen

    def plan_urgent(
        self,
        now_s: float,
        config: TalkerOrderConfig,
        urgent_s: float,
        skip: Callable[[str], bool] = _never,
    ) -> tuple[str, ...]:
        """Up to `batch` urgent streams, in the order `plan` ranks them: those with no
        audio yet, and those playing whose audio runs out within `urgent_s` (what a second
        talker lane takes while the first is busy: a near-dry player does not wait behind
        another stream's long step)."""
        limit_s = now_s + config.high_water_s + HIGH_WATER_SLACK_S
        no_audio = itertools.takewhile(lambda item: item[0] <= limit_s, self._no_audio(now_s))
        urgent_limit_s = min(now_s + urgent_s, limit_s)
        playing = itertools.takewhile(
            lambda item: item[0] < urgent_limit_s, self._walk_with_horizon(now_s)
        )
        return tuple(self._choose(now_s, config, playing, no_audio, skip))

    def _choose(
        self,
        now_s: float,
        config: TalkerOrderConfig,
        with_horizon: Iterator[tuple[float, int, str]],
        no_audio: Iterator[tuple[float, int, str]],
        skip: Callable[[str], bool],
    ) -> list[str]:
        """Up to `batch` streams: 1. protected players (the earliest run-out times of
        `with_horizon`, within the safety margin); 2. everyone else by deadline: the rest
        of `with_horizon`, `no_audio` and the fresh streams (first-audio deadline, never
        held back). Each iterator yields (run-out or deadline, order, id) in order."""
        chosen: list[str] = []
        pending: tuple[float, int, str] | None = None
        for item in with_horizon:
            if item[0] - now_s > config.safety_margin_s:
                pending = item
                break
            if not skip(item[2]):
                chosen.append(item[2])
                if len(chosen) == config.batch:
                    return chosen
        rest = itertools.chain((pending,) if pending is not None else (), with_horizon)
        for _, _, stream_id in heapq.merge(rest, no_audio, self._fresh):
            if not skip(stream_id):
                chosen.append(stream_id)
                if len(chosen) == config.batch:
                    break
        return chosen

    # internals

    def _no_audio(self, now_s: float) -> Iterator[tuple[float, int, str]]:
        """(now + queued, order, id) of the streams with frames but no audio, in order:
        queued amounts that differ can round to the same run-out time, which then ties
        and goes by arrival order, as in plan_talker_step."""
        queued = self._queued
        pending = iter(queued)
        item = next(pending, None)
        while item is not None:
            queued_s = item[0]
            run_out_s = now_s + queued_s
            larger = next(queued.iter_from((queued_s, math.inf)), None)  # next larger amount
            if larger is None or now_s + larger[0] != run_out_s:
                # the usual case: this run of equal amounts is the whole tie, stored in
                # arrival order already, so it streams out without reading further
                while item is not None and item[0] == queued_s:
                    yield (run_out_s, item[1], item[2])
                    item = next(pending, None)
                continue
            group: list[tuple[float, int, str]] = []
            while item is not None and now_s + item[0] == run_out_s:
                group.append((run_out_s, item[1], item[2]))
                item = next(pending, None)
            yield from sorted(group)

    def _walk_with_horizon(self, now_s: float) -> Iterator[tuple[float, int, str]]:
        """(run-out time, order, id) of the streams with a horizon, in exact order."""
        by_run_out, by_queue = iter(self._by_run_out), iter(self._by_queue)
        entries = self._entries
        heappush, heappop = heapq.heappush, heapq.heappop
        seen: set[str] = set()
        found: list[tuple[float, int, str]] = []  # exact keys of streams read so far
        next_run_out, next_queue = next(by_run_out, None), next(by_queue, None)
        threshold_s = -math.inf
        while True:
            exhausted = next_run_out is None and next_queue is None
            while found and (found[0][0] < threshold_s or exhausted):
                yield heappop(found)
            if exhausted:
                return
            # read the next stream of each list (once per stream): its exact key goes to
            # `found`; the threshold is the larger of the two values last read
            if next_run_out is not None:
                s_value, _, stream_id = next_run_out
                next_run_out = next(by_run_out, None)
                if stream_id not in seen:
                    seen.add(stream_id)
                    c = entries[stream_id]
                    horizon_s = c.horizon_s
                    assert horizon_s is not None
                    start_s = horizon_s if horizon_s > now_s else now_s
                    heappush(found, (start_s + c.queued_audio_s, c.order, stream_id))
                s_value -= RUN_OUT_FILING_TOLERANCE_S  # filed within it of the exact sum
                if s_value > threshold_s:
                    threshold_s = s_value
            if next_queue is not None:
                q_value, _, stream_id = next_queue
                next_queue = next(by_queue, None)
                if stream_id not in seen:
                    seen.add(stream_id)
                    c = entries[stream_id]
                    horizon_s = c.horizon_s
                    assert horizon_s is not None
                    start_s = horizon_s if horizon_s > now_s else now_s
                    heappush(found, (start_s + c.queued_audio_s, c.order, stream_id))
                if now_s + q_value > threshold_s:
                    threshold_s = now_s + q_value

    def _index(self, c: TalkerCandidate) -> None:
        for index, key in self._keys(c):
            index.add(key)
            if index is self._by_run_out:
                self._run_out_filed[c.stream_id] = key

    def _unindex(self, c: TalkerCandidate) -> None:
        for index, key in self._keys(c):
            if index is self._by_run_out:
                key = self._run_out_filed.pop(c.stream_id)
            index.remove(key)  # ValueError: the talker queue's index lost an entry

    def _keys(self, c: TalkerCandidate) -> list[tuple[_Index, tuple[float, int, str]]]:
        if c.horizon_s is None:
            if c.queued_audio_s <= 0:
                deadline_s = c.first_seen_s + self._first_chunk_s
                return [(self._fresh, (deadline_s, c.order, c.stream_id))]
            return [(self._queued, (c.queued_audio_s, c.order, c.stream_id))]
        return [
            (self._by_run_out, (c.horizon_s + c.queued_audio_s, c.order, c.stream_id)),
            (self._by_queue, (c.queued_audio_s, c.order, c.stream_id)),
        ]
