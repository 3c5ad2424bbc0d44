"""A replica's routing stats: what it reports to Ray Serve's routers.

`routing_stats(engine, admission, ...)` is called on the replica's event loop every
`cluster.stats_period_s` (Ray's controller polls `record_routing_stats`, then passes the
dict to every router). It reports:

- `free_streams`: how many more streams this replica's admission would take now
  (`Admission.free_slots` of the engine's load view: the capacity model's reading, the
  work owed, the reservations granted; None stands for "no limit": admission disabled,
  or capacity not measured yet);
- `slack_min_s` / `slack_mean_s`: each live stream's playback slack, horizon - now, with
  the horizon = first audio + audio sent + stall time (the 1x player the engine assumes),
  or the first-chunk deadline - now before its first audio (negative: a player ran dry);
  None when it has no stream;
- `streams`, `capacity_audio_s_per_s`, `ready`, and `received`: the HTTP requests the
  replica had received when the report was taken (the router subtracts it from what it
  sent there to know what the report does not count yet).

The engine's stream book (`engine.book`: its streams, its scheduler's horizons) and its
admission's load view are read in `live_streams` and `routing_stats` only.
"""

from __future__ import annotations

import math
from typing import Any

from scheduling import Admission
from scheduling.routing import ReplicaLoad

NO_VALUE = None  # "infinite" in a report


def live_streams(engine: Any) -> list[Any]:
    """The engine's streams not yet terminal (what its players are listening to)."""
    book = engine.book
    streams = (book.stream(stream_id) for stream_id in book.stream_ids())
    return [s for s in streams if s is not None]


def stream_slack_s(
    stats: Any, now_s: float, first_chunk_s: float, horizon_s: float | None = None
) -> float:
    """Playback slack of one stream: horizon - now (see the module doc). `horizon_s` is
    the scheduler's own when it still tracks the stream; else it is estimated from the
    stream's stats."""
    if horizon_s is not None:
        return horizon_s - now_s
    if stats.ttfa_s is None:
        return stats.submitted_at_s + first_chunk_s - now_s
    return stats.submitted_at_s + stats.ttfa_s + stats.audio_s + stats.stall_s - now_s


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
    horizon = engine.book.scheduler.horizon_s  # None before first audio, or once untracked
    slacks = [stream_slack_s(s.stats, now_s, first_chunk_s, horizon(s.id)) for s in streams]
    capacity = engine.capacity(now_s)
    # the engine's own policy: its queue's waiters come first
    front = engine.admission
    free = front.policy.free_slots(front.view(now_s)) if admission.config.enabled else math.inf
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
