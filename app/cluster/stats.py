"""A replica's routing stats: what it reports to Ray Serve's routers.

`routing_stats(engine, admission, ...)` is called on the replica's event loop every
`cluster.stats_period_s` (Ray's controller polls `record_routing_stats`, then passes the
dict to every router). It reports:

- `free_streams`: how many more streams this replica's admission would take now (its own
  Admission with the engine's measured capacity: floor(capacity x headroom) - playing;
  None stands for "no limit": admission disabled, or capacity not measured yet);
- `slack_min_s` / `slack_mean_s`: each live stream's playback slack, horizon - now, with
  the horizon = first audio + audio sent + stall time (the 1x player the engine assumes),
  or the first-chunk deadline - now before its first audio (negative: a player ran dry);
  None when it has no stream;
- `streams`, `capacity_audio_s_per_s`, `ready`, and `received`: the HTTP requests the
  replica had received when the report was taken (the router subtracts it from what it
  sent there to know what the report does not count yet).

The stream table is read through `live_streams`, the one place that knows where the
engine keeps its streams.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from scheduling import Admission
from scheduling.routing import ReplicaLoad

NO_VALUE = None  # "infinite" in a report


def live_streams(engine: Any) -> list[Any]:
    """The engine's streams not yet terminal (what its players are listening to)."""
    streams = getattr(engine, "streams", None)
    if callable(streams):
        return list(streams())
    table = getattr(engine, "_streams", {})
    return [s for s in table.values() if not s.state.terminal]


def playing_streams(engine: Any, now_s: float, streams: Iterable[Any]) -> int:
    """Streams admission counts: the engine's own count when it exposes one."""
    count = getattr(engine, "_playing_streams", None)
    if callable(count):
        return int(count(now_s))
    return sum(1 for _ in streams)


def stream_slack_s(stats: Any, now_s: float, first_chunk_s: float) -> float:
    """Playback slack of one stream: horizon - now (see the module doc)."""
    if stats.ttfa_s is None:
        return stats.submitted_at_s + first_chunk_s - now_s
    return stats.submitted_at_s + stats.ttfa_s + stats.audio_s + stats.stall_s - now_s


def free_streams(admission: Admission, playing: int, capacity_audio_s_per_s: float) -> float:
    """More streams `admission` would take (math.inf: no limit applies now)."""
    config = admission.config
    if not config.enabled:
        return math.inf
    limits = []
    if config.max_streams:
        limits.append(config.max_streams - playing)
    if capacity_audio_s_per_s > 0:
        limits.append(math.floor(capacity_audio_s_per_s * config.capacity_headroom) - playing)
    return float(max(0, min(limits))) if limits else math.inf


def routing_stats(
    engine: Any | None, admission: Admission, now_s: float, first_chunk_s: float, received: int
) -> dict[str, Any]:
    """The report of one replica (`engine` None: still loading, or stopped)."""
    if engine is None or not engine.ready:
        return {
            "ready": False,
            "received": received,
            "streams": 0,
            "free_streams": 0.0,
            "slack_min_s": NO_VALUE,
            "slack_mean_s": NO_VALUE,
            "capacity_audio_s_per_s": 0.0,
        }
    streams = live_streams(engine)
    slacks = [stream_slack_s(s.stats, now_s, first_chunk_s) for s in streams]
    capacity = engine.capacity(now_s)
    free = free_streams(admission, playing_streams(engine, now_s, streams), capacity)
    return {
        "ready": True,
        "received": received,
        "streams": len(streams),
        "free_streams": NO_VALUE if math.isinf(free) else free,
        "slack_min_s": min(slacks) if slacks else NO_VALUE,
        "slack_mean_s": sum(slacks) / len(slacks) if slacks else NO_VALUE,
        "capacity_audio_s_per_s": capacity,
    }


def load_from_stats(stats: dict[str, Any] | None, routed_since: int) -> ReplicaLoad:
    """A report as the router ranks it (no report yet: ready, unlimited, idle)."""
    if not stats:
        return ReplicaLoad(math.inf, math.inf, math.inf, 0, routed_since)

    def value(key: str) -> float:
        raw = stats.get(key)
        return math.inf if raw is None else float(raw)

    return ReplicaLoad(
        free_streams=value("free_streams"),
        slack_min_s=value("slack_min_s"),
        slack_mean_s=value("slack_mean_s"),
        streams=int(stats.get("streams", 0)),
        routed_since=routed_since,
        ready=bool(stats.get("ready", True)),
    )
