"""The `cluster:` settings section: Playhead replicas on Ray Serve (no Ray import here)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.validation import (
    check_choice,
    check_int,
    check_int_in,
    check_number_in,
    check_positive,
    check_text,
)

ROUTERS = ("slack", "default")


@dataclass(frozen=True)
class ClusterConfig:
    # Playhead replicas on Ray Serve, each one Engine with its own model and scheduler;
    # 0 serves from this process without Ray (`playhead serve --replicas N` sets it).
    replicas: int = 0
    # An existing Ray cluster to join ("auto", "ray://host:10001", "host:6379");
    # None starts a local Ray on this machine.
    ray_address: str | None = None
    # "slack": best of two by playback slack, skipping replicas whose admission would
    # refuse (scheduling/routing.py); "default": Ray Serve's own router (power of two
    # choices by queue length), for comparison.
    router: str = "slack"
    # Logical CPUs Ray reserves per replica: a sim replica mostly sleeps; a Piper replica
    # runs two model threads, so give it ~2 on a real cluster.
    num_cpus_per_replica: float = 0.25
    # How often each replica reports its routing stats to Ray's controller, which passes
    # them to every router; a smaller period means fresher slack and more control traffic.
    stats_period_s: float = 0.2
    # Ray's own cap on requests in flight per replica (its queue-length routing); Playhead's
    # admission refuses long before it, so it is only a backstop.
    max_ongoing_requests: int = 1000
    # Seconds `playhead serve --replicas N` waits for the application to be running.
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        check_int_in("replicas", self.replicas, (0, 1024))
        check_text("ray_address", self.ray_address, optional=True)
        check_choice("router", self.router, ROUTERS)
        check_positive("num_cpus_per_replica", self.num_cpus_per_replica)
        check_number_in("num_cpus_per_replica", self.num_cpus_per_replica, (0, 64))
        check_positive("stats_period_s", self.stats_period_s)
        check_number_in("stats_period_s", self.stats_period_s, (0, 60), "s")
        check_int("max_ongoing_requests", self.max_ongoing_requests, 1)
        check_positive("start_timeout_s", self.start_timeout_s)
