"""SortedBlockList against a plain sorted list, with blocks small enough to split often."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling.sortedlist import SortedBlockList

ops = st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=300)


@given(ops=ops, load=st.integers(1, 4))
def test_it_matches_a_sorted_list(ops: list[tuple[bool, int]], load: int) -> None:
    blocks: SortedBlockList[int] = SortedBlockList(load)
    model: set[int] = set()
    for add, value in ops:
        if add and value not in model:
            blocks.add(value)
            model.add(value)
        elif not add and value in model:
            blocks.remove(value)
            model.discard(value)
        assert list(blocks) == sorted(model)
        assert len(blocks) == len(model)
        assert (value in blocks) == (value in model)
        assert list(blocks.iter_from(value)) == sorted(v for v in model if v >= value)
        assert list(blocks.iter_from(value + 0.5)) == sorted(v for v in model if v > value)
        assert all(len(block) <= 2 * load for block in blocks._blocks)
        assert blocks._maxes == [block[-1] for block in blocks._blocks]


def test_removing_a_missing_item_raises() -> None:
    blocks: SortedBlockList[tuple[float, str]] = SortedBlockList()
    blocks.add((1.0, "a"))
    with pytest.raises(ValueError, match="not in the list"):
        blocks.remove((1.0, "b"))
    with pytest.raises(ValueError, match="not in the list"):
        blocks.remove((2.0, "a"))
    blocks.remove((1.0, "a"))
    assert not blocks and list(blocks) == []


def test_a_load_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="load must be >= 1"):
        SortedBlockList(0)


moves = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=200)


@given(start=st.sets(st.integers(0, 40), max_size=40), moves=moves, load=st.integers(1, 4))
def test_move_matches_remove_then_add(
    start: set[int], moves: list[tuple[int, int]], load: int
) -> None:
    blocks: SortedBlockList[int] = SortedBlockList(load)
    for value in sorted(start, key=lambda v: (v * 7919) % 41):  # not in order: splits
        blocks.add(value)
    model = set(start)
    for old, new in moves:
        if old not in model or (new in model and new != old):
            continue
        blocks.move(old, new)
        model.discard(old)
        model.add(new)
        assert list(blocks) == sorted(model)
        assert len(blocks) == len(model)
        assert all(0 < len(block) <= 2 * load for block in blocks._blocks)
        assert blocks._maxes == [block[-1] for block in blocks._blocks]


def test_moving_a_missing_item_raises() -> None:
    blocks: SortedBlockList[int] = SortedBlockList()
    blocks.add(1)
    with pytest.raises(ValueError, match="not in the list"):
        blocks.move(2, 3)
    assert list(blocks) == [1]
