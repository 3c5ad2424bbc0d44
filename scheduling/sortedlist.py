"""A sorted list of distinct items kept in blocks, for the deadline indexes.

A plain sorted Python list costs O(n) per insert and delete: at 10,000 streams each
update moves tens of kilobytes of pointers, several times per vocoder turn. Here the
items live in sorted blocks of at most `2 * load` items, with each block's largest item
kept in a sorted list of maxima: an update bisects the maxima, then edits one short
block. Iteration yields every item in ascending order.

Items must be distinct and totally ordered (the indexes store tuples that end in a
stream id or are distinct keys). Do not change the list while iterating over it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from itertools import chain, islice
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEFAULT_LOAD = 256


class SortedBlockList(Generic[T]):
    __slots__ = ("_blocks", "_load", "_maxes", "_size")

    def __init__(self, load: int = DEFAULT_LOAD) -> None:
        if load < 1:
            raise ValueError(f"load must be >= 1, got {load}")
        self._load = load
        self._blocks: list[list[Any]] = []  # each sorted, non-empty
        self._maxes: list[Any] = []  # self._maxes[i] == self._blocks[i][-1]
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self._blocks)

    def __repr__(self) -> str:
        return f"SortedBlockList({list(self)!r})"

    def add(self, item: T) -> None:
        """Insert `item` (not already present) in order."""
        blocks, maxes = self._blocks, self._maxes
        self._size += 1
        if not blocks:
            blocks.append([item])
            maxes.append(item)
            return
        index = bisect_left(maxes, item)
        if index == len(maxes):  # beyond every item: the last block grows
            index -= 1
            block = blocks[index]
            block.append(item)
            maxes[index] = item
        else:
            block = blocks[index]
            insort(block, item)
        if len(block) > 2 * self._load:  # split in two halves
            half = len(block) // 2
            blocks[index : index + 1] = [block[:half], block[half:]]
            maxes[index : index + 1] = [block[half - 1], block[-1]]

    def remove(self, item: T) -> None:
        """Remove `item`; ValueError when it is not in the list."""
        blocks, maxes = self._blocks, self._maxes
        index = bisect_left(maxes, item)
        if index < len(maxes):
            block = blocks[index]
            position = bisect_left(block, item)
            if position < len(block) and block[position] == item:
                del block[position]
                self._size -= 1
                if not block:
                    del blocks[index]
                    del maxes[index]
                elif position == len(block):
                    maxes[index] = block[-1]
                return
        raise ValueError(f"{item!r} is not in the list")

    def move(self, old: T, new: T) -> None:
        """Replace `old` (in the list; ValueError if not) with `new` (not in it): `remove`
        then `add`, edited in place when `new` sorts into the block `old` leaves (an
        index key that moves a little, the usual case)."""
        blocks, maxes = self._blocks, self._maxes
        index = bisect_left(maxes, old)
        if index < len(maxes):
            block = blocks[index]
            position = bisect_left(block, old)
            if position < len(block) and block[position] == old:
                if (index == 0 or maxes[index - 1] < new) and (
                    index == len(maxes) - 1 or new < blocks[index + 1][0]
                ):
                    del block[position]
                    insort(block, new)
                    maxes[index] = block[-1]
                    return
                del block[position]
                self._size -= 1
                if not block:
                    del blocks[index]
                    del maxes[index]
                elif position == len(block):
                    maxes[index] = block[-1]
                self.add(new)
                return
        raise ValueError(f"{old!r} is not in the list")

    def __contains__(self, item: object) -> bool:
        index = bisect_left(self._maxes, item)
        if index == len(self._maxes):
            return False
        block = self._blocks[index]
        position = bisect_left(block, item)
        return position < len(block) and block[position] == item

    def iter_from(self, item: Any) -> Iterator[T]:
        """The items >= `item` (which need not be in the list), ascending."""
        index = bisect_left(self._maxes, item)
        if index == len(self._maxes):
            return iter(())
        block = self._blocks[index]
        return chain(
            islice(block, bisect_left(block, item), None),
            chain.from_iterable(islice(self._blocks, index + 1, None)),
        )
