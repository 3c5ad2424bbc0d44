"""Start Playhead on Ray Serve: `playhead serve --replicas N` (or `cluster.replicas: N`).

`build_application(settings)` binds N PlayheadReplica replicas with the chosen router;
`start(settings)` connects to Ray (a local one, or `cluster.ray_address`), starts Serve's
HTTP proxy on `server.host:server.port` and runs the application under the name
"playhead" at route prefix "/", waiting until every replica is running. `serve_forever`
is what the CLI runs: start, then wait for SIGINT/SIGTERM, then tear down.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from app.cluster.replica import APP_NAME, DEPLOYMENT_NAME, PlayheadReplica
from app.settings import Settings

logger = logging.getLogger("playhead.cluster")

ROOT = Path(__file__).resolve().parents[2]
SLACK_ROUTER = "app.cluster.router:SlackRouter"
# A replica that stops answering health checks is replaced; its streams end (the proxy
# cuts the body) and the router stops choosing it as soon as its actor is known dead.
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 10.0


def deployment_options(settings: Settings) -> dict[str, Any]:
    cluster = settings.cluster
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "num_replicas": cluster.replicas,
        "max_ongoing_requests": cluster.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": cluster.num_cpus_per_replica},
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        "graceful_shutdown_timeout_s": 5.0,
    }
    router: dict[str, Any] = {
        "request_routing_stats_period_s": cluster.stats_period_s,
        "request_routing_stats_timeout_s": max(1.0, 5 * cluster.stats_period_s),
    }
    if cluster.router == "slack":
        router["request_router_class"] = SLACK_ROUTER
        router["request_router_kwargs"] = {
            "first_chunk_s": settings.scheduling.first_chunk_ms / 1000.0
        }
    options["request_router_config"] = RequestRouterConfig(**router)
    return options


def build_application(settings: Settings) -> Any:
    """The Ray Serve application: `cluster.replicas` Playhead replicas."""
    if settings.cluster.replicas < 1:
        raise ValueError("cluster.replicas must be >= 1 to build a cluster application")
    deployment = PlayheadReplica.options(**deployment_options(settings))
    return deployment.bind(settings.model_dump(mode="json"))


def connect(settings: Settings) -> None:
    """Join `cluster.ray_address`, or start a local Ray whose workers import this checkout."""
    if ray.is_initialized():
        return
    address = settings.cluster.ray_address
    if address is not None:
        ray.init(address=address, logging_level=logging.WARNING)
        return
    ray.init(
        include_dashboard=False,
        logging_level=logging.WARNING,
        # Workers import app/, pipeline/, scheduling/ from this checkout.
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )


def start(settings: Settings) -> None:
    """Connect, start Serve's HTTP proxy, run the application; returns once it runs."""
    connect(settings)
    server = settings.server
    serve.start(http_options={"host": server.host, "port": server.port})
    serve.run(
        build_application(settings),
        name=APP_NAME,
        route_prefix="/",
        blocking=False,
    )
    logger.info(
        "playhead on Ray Serve: %d replica(s), router %s, http://%s:%d",
        settings.cluster.replicas,
        settings.cluster.router,
        server.host,
        server.port,
    )


def stop() -> None:
    """Delete the application and shut Serve down (and the Ray this process started)."""
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def serve_forever(settings: Settings) -> int:
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    start(settings)
    try:
        stopped.wait()
    finally:
        stop()
    return 0
