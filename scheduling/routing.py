"""Routing by playback slack: which replica takes a new stream.

Each replica reports, every few hundred ms, a `ReplicaLoad`: how many more streams its
admission would take, and the slack of its streams (playback horizon - now: how long its
players can play on what they hold; before a stream's first audio, its first-chunk
deadline - now). A replica with a small minimum slack has a player close to running dry,
so a newcomer there would take vocoder turns from it.

`rank_replicas` orders the replicas for one request, best first:

1. replicas whose admission would take one more stream (`free_streams` less the requests
   routed there since the report), the first two in a random draw ranked by slack: the
   higher minimum slack first, then the higher mean, then fewer streams ("best of two":
   reports are stale between intervals, and sending every arrival to the one best replica
   would herd a whole interval's arrivals onto it); the rest of the draw follows;
2. then the replicas that would refuse, those nearest to taking one first: a request is
   sent to one of them only when every replica refuses, and it answers 429.

A request routed since the report counts with the first-chunk deadline as its slack, so a
replica that just took a newcomer stops looking idle. Pure: plain numbers in, indices out,
randomness from the caller's `random.Random` (the Ray Serve router and the simulator
share this function).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's last routing report, plus what the router sent it since."""

    free_streams: float  # streams its admission would still take (math.inf: no limit)
    slack_min_s: float  # lowest slack of its streams (math.inf when it has none)
    slack_mean_s: float  # mean slack of its streams (math.inf when it has none)
    streams: int  # streams it counted (playing or waiting for first audio)
    routed_since: int = 0  # requests the router sent it since this report
    ready: bool = True  # False: loading or stopped, it would answer 503

    def __post_init__(self) -> None:
        for name in ("free_streams", "slack_min_s", "slack_mean_s"):
            if math.isnan(getattr(self, name)):
                raise ValueError(f"{name} must not be NaN")
        if self.streams < 0 or self.routed_since < 0:
            raise ValueError("streams and routed_since must be >= 0")

    @property
    def admits(self) -> bool:
        """Whether its admission would take one more stream, as far as the router knows."""
        return self.ready and self.free_streams - self.routed_since >= 1


def slack_key(load: ReplicaLoad, first_chunk_s: float) -> tuple[float, float, int]:
    """Sort key, lower is better: (-minimum slack, -mean slack, streams)."""
    low = load.slack_min_s
    mean = load.slack_mean_s
    if load.routed_since:
        # Streams sent since the report have their first-chunk deadline as slack.
        low = min(low, first_chunk_s)
        n = load.streams + load.routed_since
        if math.isinf(mean):
            mean = first_chunk_s
        else:
            mean = (mean * load.streams + first_chunk_s * load.routed_since) / n
    return (-low, -mean, load.streams + load.routed_since)


def _refusing_key(
    load: ReplicaLoad, first_chunk_s: float
) -> tuple[bool, float, tuple[float, float, int]]:
    """Of the replicas that would refuse: ready ones first, the most free streams first."""
    free = load.free_streams - load.routed_since
    return (not load.ready, -free, slack_key(load, first_chunk_s))


def rank_replicas(
    loads: Sequence[ReplicaLoad], rng: random.Random, first_chunk_s: float
) -> list[int]:
    """Indices into `loads`, best first (see the module doc). Every index appears once."""
    if not math.isfinite(first_chunk_s) or first_chunk_s < 0:
        raise ValueError(f"first_chunk_s must be finite and >= 0, got {first_chunk_s!r}")
    admitting = [i for i, load in enumerate(loads) if load.admits]
    refusing = [i for i, load in enumerate(loads) if not load.admits]
    order = rng.sample(admitting, len(admitting))
    if len(order) >= 2 and slack_key(loads[order[1]], first_chunk_s) < slack_key(
        loads[order[0]], first_chunk_s
    ):
        order[0], order[1] = order[1], order[0]
    refusing.sort(key=lambda i: _refusing_key(loads[i], first_chunk_s))
    return order + refusing
