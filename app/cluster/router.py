"""SlackRouter: Ray Serve's RequestRouter API, ranking by playback slack.

Ray Serve calls `choose_replicas` for each request (in the HTTP proxy, whose handle routes
to the Playhead deployment). The ranking is scheduling/routing.py's `rank_replicas` over
each replica's last routing report (`RunningReplica.routing_stats`, see
app/cluster/stats.py) plus the requests this router sent it that the report does not
count yet: the report carries how many HTTP requests the replica had received when it was
taken, the router counts what it sent, and the difference is in flight or too new for
the report (a report reaches the router some 100 ms after it is taken, so resetting a
counter when a report arrives would forget requests sent in between). With several
proxies (one router each) a replica's count includes the others' requests, so this
under-counts; the replica's own admission stays the last word. The answer is one
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
        self._sent: dict[ReplicaID, int] = {}  # requests this router sent each replica

    def _unreported(self, replica: RunningReplica) -> int:
        """Requests sent to `replica` that its last report does not count."""
        received = (replica.routing_stats or {}).get("received", 0)
        return max(0, self._sent.get(replica.replica_id, 0) - int(received))

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        loads = [load_from_stats(r.routing_stats, self._unreported(r)) for r in candidate_replicas]
        order = rank_replicas(loads, self._rng, self._first_chunk_s)
        return [[candidate_replicas[i]] for i in order]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        self._sent[replica_id] = self._sent.get(replica_id, 0) + 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._sent.pop(replica_id, None)
