"""The ledger of players still playing after their stream's audio was all sent.

Admission counts a stream until its player runs dry, not only while the server has work
for it: a stream whose last chunk left at 10 s with a horizon of 25 s still has a
listener until 25 s. The engine (and the simulator) enter a stream here when its audio is
all emitted, with its horizon, and count the entries whose horizon is still ahead. A
stream cancelled meanwhile (its client is gone) leaves at once.

Pure: the clock is passed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from scheduling.validation import require_finite_time


class PlayingLedger:
    """Streams whose audio is all sent, until their players run dry."""

    def __init__(self) -> None:
        self._until_s: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []  # may hold entries already removed

    def __len__(self) -> int:
        return len(self._until_s)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._until_s

    def enter(self, stream_id: str, until_s: float, now_s: float) -> None:
        """All of `stream_id`'s audio is sent; its player runs dry at `until_s`.
        Nothing is entered when that moment has already passed."""
        require_finite_time("until_s", until_s)
        if until_s <= now_s:
            return
        self._until_s[stream_id] = until_s
        heapq.heappush(self._heap, (until_s, stream_id))

    def leave(self, stream_id: str) -> None:
        """The stream's listener is gone (cancelled); unknown ids are fine."""
        self._until_s.pop(stream_id, None)
        if not self._until_s:
            self._heap.clear()

    def count(self, now_s: float) -> int:
        """Players still playing at `now_s`; drops those that ran dry."""
        self._expire(now_s)
        return len(self._until_s)

    def until_times_s(self, now_s: float) -> Iterator[float]:
        """When each player still playing runs dry (for Retry-After estimates)."""
        self._expire(now_s)
        return iter(self._until_s.values())

    def _expire(self, now_s: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now_s:
            until_s, stream_id = heapq.heappop(heap)
            if self._until_s.get(stream_id) == until_s:
                del self._until_s[stream_id]
