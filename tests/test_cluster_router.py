"""SlackRouter (Ray Serve's RequestRouter API) and the replicas' routing stats, with
scripted reports: no Ray cluster needed, only the `cluster` extra installed."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
)

from app.cluster.router import SlackRouter
from app.cluster.stats import load_from_stats, routing_stats, stream_slack_s
from pipeline.stream import StreamStats
from scheduling import Admission, AdmissionConfig, LoadView, StreamLoad

DEPLOYMENT = DeploymentID(name="Playhead", app_name="playhead")


@dataclass
class ScriptedReplica:
    """What the router reads of a RunningReplica: its id and its last report."""

    replica_id: ReplicaID
    routing_stats: dict[str, Any] = field(default_factory=dict)


def replica(name: str, **report: Any) -> ScriptedReplica:
    stats = {"ready": True, "received": 0, "streams": 0, "free_streams": None}
    stats.update(report)
    return ScriptedReplica(ReplicaID(unique_id=name, deployment_id=DEPLOYMENT), stats)


def router(seed: int = 0) -> SlackRouter:
    slack = SlackRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    slack.initialize_state(first_chunk_s=0.1, seed=seed)
    return slack


async def choice(slack: SlackRouter, replicas: list[ScriptedReplica]) -> list[str]:
    ranks = await slack.choose_replicas(replicas)  # type: ignore[arg-type]
    assert all(len(rank) == 1 for rank in ranks)  # one replica per rank: the order is ours
    return [rank[0].replica_id.unique_id for rank in ranks]


@pytest.mark.parametrize("seed", range(8))
async def test_the_replica_with_more_slack_is_chosen(seed: int) -> None:
    replicas = [
        replica("tight", streams=4, free_streams=3.0, slack_min_s=0.2, slack_mean_s=2.0),
        replica("easy", streams=4, free_streams=3.0, slack_min_s=1.8, slack_mean_s=2.0),
    ]
    assert await choice(router(seed), replicas) == ["easy", "tight"]


@pytest.mark.parametrize("seed", range(8))
async def test_a_full_replica_is_skipped_however_much_slack_it_has(seed: int) -> None:
    replicas = [
        replica("full", streams=9, free_streams=0.0, slack_min_s=6.0, slack_mean_s=8.0),
        replica("room", streams=3, free_streams=2.0, slack_min_s=0.3, slack_mean_s=0.5),
    ]
    assert await choice(router(seed), replicas) == ["room", "full"]


async def test_requests_sent_since_the_report_fill_a_replica() -> None:
    """The report says 2 free streams and 5 requests received; the router sent 7: both
    free streams are spoken for, so the next request goes elsewhere."""
    slack = router()
    a = replica("a", received=5, streams=1, free_streams=2.0, slack_min_s=5.0, slack_mean_s=5.0)
    b = replica("b", received=0, streams=3, free_streams=4.0, slack_min_s=0.05, slack_mean_s=1.0)
    for _ in range(6):
        slack.on_request_routed(None, a.replica_id, None)  # type: ignore[arg-type]
    assert (await choice(slack, [a, b]))[0] == "a"  # one unreported request: 1 stream left
    slack.on_request_routed(None, a.replica_id, None)  # type: ignore[arg-type]
    assert await choice(slack, [a, b]) == ["b", "a"]
    a.routing_stats.update(received=7, free_streams=1.0)  # the next report counts them
    assert (await choice(slack, [a, b]))[0] == "a"


async def test_when_every_replica_refuses_one_is_still_chosen_and_it_answers_429() -> None:
    replicas = [
        replica("x", streams=5, free_streams=0.0, slack_min_s=1.0, slack_mean_s=1.0),
        replica("loading", ready=False),
    ]
    assert await choice(router(), replicas) == ["x", "loading"]


async def test_no_report_yet_counts_as_idle_and_unlimited() -> None:
    fresh = ScriptedReplica(ReplicaID(unique_id="new", deployment_id=DEPLOYMENT), {})
    busy = replica("busy", streams=6, free_streams=1.0, slack_min_s=0.4, slack_mean_s=0.9)
    assert (await choice(router(), [busy, fresh]))[0] == "new"


def test_report_values_none_mean_unlimited_and_idle() -> None:
    load = load_from_stats({"ready": True, "received": 3, "streams": 0}, routed_since=2)
    assert load.free_streams == math.inf and load.slack_min_s == math.inf
    assert load.routed_since == 2 and load.admits
    assert not load_from_stats({"ready": False}, 0).admits


def test_free_streams_follow_admission() -> None:
    """A replica reports `Admission.free_slots` of its engine's load view (whole new
    streams that fit now; tests/test_admission.py checks it agrees with the decision)."""
    view = LoadView(8.9, [StreamLoad(5.0)] * 3)
    capacity_only = Admission(AdmissionConfig(capacity_headroom=0.9, start_cost=0.0))
    assert capacity_only.free_slots(view) == 5  # floor(8.01 - 3)
    assert capacity_only.free_slots(LoadView(8.9, [StreamLoad(5.0)] * 9)) == 0
    assert capacity_only.free_slots(LoadView(0.0, [StreamLoad(5.0)] * 3)) == math.inf
    capped = Admission(AdmissionConfig(max_streams=4, start_cost=0.0, capacity_headroom=1.0))
    assert capped.free_slots(LoadView(20.0, [StreamLoad(5.0)])) == 3
    assert capped.free_slots(LoadView(2.0, [StreamLoad(5.0)])) == 1
    disabled = Admission(AdmissionConfig(max_streams=1, enabled=False))
    assert disabled.free_slots(LoadView(1.0, [StreamLoad(5.0)] * 5)) == math.inf


def test_slack_is_horizon_minus_now() -> None:
    waiting = StreamStats("s1", submitted_at_s=10.0)
    assert stream_slack_s(waiting, now_s=10.04, first_chunk_s=0.1) == pytest.approx(0.06)
    playing = StreamStats("s2", submitted_at_s=10.0, ttfa_s=0.2, audio_s=3.0, stall_s=0.5)
    # first audio at 10.2, 3 s sent, 0.5 s of stalls: the player runs dry at 13.7
    assert stream_slack_s(playing, now_s=12.0, first_chunk_s=0.1) == pytest.approx(1.7)
    # the scheduler's own horizon, when it has one, wins over the estimate
    assert stream_slack_s(playing, 12.0, 0.1, horizon_s=12.5) == pytest.approx(0.5)


async def test_a_replica_reports_its_engine(make_engine) -> None:
    """routing_stats on a running engine: its streams, their slack, its admission room."""
    admission = AdmissionConfig(max_streams=5)
    engine = await make_engine(admission=admission)
    streams = [engine.submit("Hello there. A stream to report.", voice="sim") for _ in range(2)]
    first = await anext(streams[0].chunks())  # one stream has audio, its player plays
    assert first.size
    now_s = time.monotonic()
    stats = routing_stats(engine, Admission(admission), now_s, first_chunk_s=0.1, received=7)
    assert stats["ready"] and stats["received"] == 7
    assert stats["streams"] == 2
    assert stats["free_streams"] == 3  # max_streams 5, 2 playing
    # a request admitted whose stream does not exist yet takes its slot in the report
    held = engine.reserve()
    reserved = routing_stats(engine, Admission(admission), now_s, first_chunk_s=0.1, received=8)
    assert reserved["free_streams"] == 2
    held.release()
    horizon_s = engine.book.scheduler.horizon_s(streams[0].id)
    assert horizon_s is not None
    assert stats["slack_min_s"] <= horizon_s - now_s
    assert math.isfinite(stats["slack_mean_s"])
    for stream in streams:
        engine.cancel(stream.id)
    idle = routing_stats(engine, Admission(admission), time.monotonic(), 0.1, received=7)
    assert idle["streams"] == 0 and idle["slack_min_s"] is None
    assert idle["free_streams"] == 5


def test_a_loading_replica_reports_not_ready() -> None:
    stats = routing_stats(None, Admission(AdmissionConfig()), 0.0, 0.1, received=0)
    assert not stats["ready"]
    assert not load_from_stats(stats, 0).admits
