"""The `cluster:` settings section: Playhead replicas on Ray Serve (no Ray import here)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

RouterName = Literal["slack", "default"]


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Playhead replicas on Ray Serve, each one Engine with its own model and scheduler;
    # 0 serves from this process without Ray (`playhead serve --replicas N` sets it).
    replicas: int = Field(0, ge=0, le=1024)
    # An existing Ray cluster to join ("auto", "ray://host:10001", "host:6379");
    # null starts a local Ray on this machine.
    ray_address: str | None = None
    # "slack": best of two by playback slack, skipping replicas whose admission would
    # refuse (scheduling/routing.py); "default": Ray Serve's own router (power of two
    # choices by queue length), for comparison.
    router: RouterName = "slack"
    # Logical CPUs Ray reserves per replica: a sim replica mostly sleeps; a Piper replica
    # runs two model threads, so give it ~2 on a real cluster.
    num_cpus_per_replica: float = Field(0.25, gt=0, le=64)
    # How often each replica reports its routing stats to Ray's controller, which passes
    # them to every router; a smaller period means fresher slack and more control traffic.
    stats_period_s: float = Field(0.2, gt=0, le=60)
    # Ray's own cap on requests in flight per replica (its queue-length routing); Playhead's
    # admission refuses long before it, so it is only a backstop.
    max_ongoing_requests: int = Field(1000, ge=1)
    # Seconds `playhead serve --replicas N` waits for the application to be running.
    start_timeout_s: float = Field(120.0, gt=0)

    @field_validator("ray_address")
    @classmethod
    def _address_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("ray_address must not be empty (use null for a local Ray)")
        return value
