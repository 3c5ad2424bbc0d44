"""SlackRouter: Ray Serve's RequestRouter API, ranking by playback slack.

Ray Serve calls `choose_replicas` for each request (in the HTTP proxy, whose handle routes
to the Playhead deployment). The ranking is scheduling/routing.py's `rank_replicas` over
each replica's last routing report (`RunningReplica.routing_stats`, see
app/cluster/stats.py) plus the requests routed to it since that report. The answer is one
rank per replica, in order: Ray takes the first rank whose replica has room in its
queue (`max_ongoing_requests`, a backstop far above admission), so the order is ours.

Replicas whose admission would refuse come last: a request reaches one only when every
replica would refuse, and that replica answers 429 with Retry-After. Ray's own router
would instead back off and retry without end when it finds no replica, which is why
refusal is not expressed as "no candidate".
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    ReplicaResult,
    RequestRouter,
    RunningReplica,
)

from app.cluster.stats import load_from_stats
from scheduling.routing import rank_replicas


class SlackRouter(FIFOMixin, RequestRouter):
    """Best of two by playback slack; replicas that would refuse are skipped."""

    def initialize_state(self, first_chunk_s: float = 0.1, seed: int | None = None, **_: Any):
        self._first_chunk_s = first_chunk_s
        self._rng = random.Random(seed)
        self._routed_since: dict[ReplicaID, int] = {}
        self._report_seq: dict[ReplicaID, Any] = {}

    def _routed(self, replica: RunningReplica) -> int:
        """Requests sent to `replica` since its last report (reset when a new one arrives)."""
        seq = (replica.routing_stats or {}).get("seq")
        if self._report_seq.get(replica.replica_id) != seq:
            self._report_seq[replica.replica_id] = seq
            self._routed_since[replica.replica_id] = 0
        return self._routed_since.get(replica.replica_id, 0)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        loads = [load_from_stats(r.routing_stats, self._routed(r)) for r in candidate_replicas]
        order = rank_replicas(loads, self._rng, self._first_chunk_s)
        return [[candidate_replicas[i]] for i in order]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        self._routed_since[replica_id] = self._routed_since.get(replica_id, 0) + 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._routed_since.pop(replica_id, None)
        self._report_seq.pop(replica_id, None)
