"""scheduling/routing.py: the slack ranking of replicas, with numbers."""

from __future__ import annotations

import math
import random

import pytest

from scheduling.routing import ReplicaLoad, rank_replicas, slack_key

INF = math.inf
FIRST_CHUNK_S = 0.1


def load(
    slack_min_s: float = INF,
    slack_mean_s: float | None = None,
    *,
    free: float = INF,
    streams: int = 0,
    routed: int = 0,
    ready: bool = True,
) -> ReplicaLoad:
    mean = slack_min_s if slack_mean_s is None else slack_mean_s
    return ReplicaLoad(free, slack_min_s, mean, streams, routed, ready)


def rank(loads: list[ReplicaLoad], seed: int = 0) -> list[int]:
    return rank_replicas(loads, random.Random(seed), FIRST_CHUNK_S)


@pytest.mark.parametrize("seed", range(20))
def test_of_two_the_higher_minimum_slack_goes_first_whatever_the_draw(seed: int) -> None:
    loads = [load(0.4, 3.0, streams=5), load(2.5, 2.6, streams=7)]
    assert rank(loads, seed) == [1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_only_the_two_drawn_replicas_compete(seed: int) -> None:
    loads = [load(0.2), load(1.0), load(3.0), load(5.0)]
    drawn = random.Random(seed).sample(range(4), 4)  # the same draw rank_replicas makes
    order = rank(loads, seed)
    first_two = sorted(drawn[:2], key=lambda i: -loads[i].slack_min_s)
    assert order[:2] == first_two
    assert order[2:] == drawn[2:]
    assert sorted(order) == [0, 1, 2, 3]


def test_ties_fall_to_the_mean_then_to_fewer_streams() -> None:
    by_mean = [load(1.0, 1.5, streams=2), load(1.0, 4.0, streams=9)]
    by_streams = [load(1.0, 2.0, streams=6), load(1.0, 2.0, streams=3)]
    for seed in range(10):
        assert rank(by_mean, seed)[0] == 1
        assert rank(by_streams, seed)[0] == 1


@pytest.mark.parametrize("seed", range(10))
def test_a_replica_whose_admission_would_refuse_is_skipped(seed: int) -> None:
    loads = [load(9.0, free=0), load(0.3, free=2), load(0.5, free=1)]
    order = rank(loads, seed)
    assert order[2] == 0  # the best slack, but full: last
    assert sorted(order[:2]) == [1, 2]
    assert order[0] == 2  # of the two that admit, the higher slack


def test_requests_routed_since_the_report_use_up_its_free_streams() -> None:
    loads = [load(5.0, free=2, routed=2), load(0.5, free=3, routed=2)]
    assert not loads[0].admits
    assert loads[1].admits
    assert rank(loads)[0] == 1


def test_a_newcomer_counts_with_its_first_chunk_deadline_as_slack() -> None:
    idle_but_just_sent_one = load(INF, free=5, routed=1)
    comfortable = load(2.0, streams=4, free=5)
    assert slack_key(idle_but_just_sent_one, FIRST_CHUNK_S)[0] == -FIRST_CHUNK_S
    for seed in range(10):
        assert rank([idle_but_just_sent_one, comfortable], seed)[0] == 1
    # Without that request, the idle replica is the better one.
    assert rank([load(INF, free=5), comfortable])[0] == 0


def test_the_newcomer_enters_the_mean_as_one_more_stream() -> None:
    key = slack_key(load(1.0, 3.0, streams=3, routed=1), FIRST_CHUNK_S)
    assert key == (-FIRST_CHUNK_S, -(3 * 3.0 + FIRST_CHUNK_S) / 4, 4)


def test_when_every_replica_refuses_the_nearest_to_admitting_comes_first() -> None:
    loads = [
        load(3.0, free=0),
        load(0.1, free=0.5),  # a fraction of a stream left: still refuses
        load(9.0, free=5, ready=False),  # loading: answers 503, not a choice
    ]
    assert [item.admits for item in loads] == [False, False, False]
    assert rank(loads) == [1, 0, 2]


def test_not_ready_replicas_are_skipped() -> None:
    loads = [load(9.0, ready=False), load(0.2)]
    for seed in range(10):
        assert rank(loads, seed) == [1, 0]


def test_one_or_no_replica() -> None:
    assert rank([load(0.5)]) == [0]
    assert rank([]) == []


def test_randomness_comes_only_from_the_rng() -> None:
    loads = [load(float(i % 3), streams=i) for i in range(8)]
    assert rank(loads, 7) == rank(loads, 7)
    assert len({tuple(rank(loads, seed)) for seed in range(30)}) > 1


def test_invalid_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="slack_min_s"):
        load(math.nan)
    with pytest.raises(ValueError, match="streams"):
        load(1.0, streams=-1)
    with pytest.raises(ValueError, match="first_chunk_s"):
        rank_replicas([load(1.0)], random.Random(0), math.nan)
