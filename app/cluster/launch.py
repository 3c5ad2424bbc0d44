"""Start Playhead on Ray Serve: `playhead serve --replicas N` (or `cluster.replicas: N`).

`build_application(settings)` binds N PlayheadReplica replicas with the chosen router;
`start(settings)` connects to Ray (a local one, or `cluster.ray_address`), starts Serve's
HTTP proxy on `server.host:server.port` and runs the application under the name
"playhead" at route prefix "/", waiting until every replica is running. `serve_forever`
is what the CLI runs: start, then wait for SIGINT/SIGTERM, then `stop`.

`stop` undoes only what `start` did. The application is deleted: each replica stops
taking requests and its streams in flight get `server.shutdown_grace_s` to end (the
deployment's graceful shutdown), as a single server's drain gives them. Serve is shut down
only if `start` started it; Ray, only if `start` started a local one (joined to
`cluster.ray_address`, the driver just disconnects). A local Ray's shutdown kills its
raylet, whose agents (DashboardAgent, RuntimeEnvAgent) could outlive it as orphans that
ignore SIGTERM: every process this one started, down the tree, is listed before and
killed after if still there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.context import _get_global_client

from app.cluster.replica import APP_NAME, DEPLOYMENT_NAME, PlayheadReplica
from app.settings import Settings

logger = logging.getLogger("playhead.cluster")

ROOT = Path(__file__).resolve().parents[2]
SLACK_ROUTER = "app.cluster.router:SlackRouter"
# A replica that stops answering health checks is replaced; its streams end (the proxy
# cuts the body) and the router stops choosing it as soon as its actor is known dead.
HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 10.0
# a Ray process still there after ray.shutdown(): SIGTERM, then SIGKILL after this long
LEFTOVER_TERM_WAIT_S = 3.0


@dataclass(frozen=True)
class Started:
    """What `start` started (`stop` stops only that)."""

    connected: bool  # the connection to Ray (none was open before)
    local_ray: bool  # a local Ray (not joined to cluster.ray_address, not running before)
    serve: bool  # Serve's controller and proxy (none was running before)


_started: Started | None = None


def deployment_options(settings: Settings) -> dict[str, Any]:
    cluster = settings.cluster
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "num_replicas": cluster.replicas,
        "max_ongoing_requests": cluster.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": cluster.num_cpus_per_replica},
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        # on stop (SIGTERM), streams in flight get the single server's drain grace
        "graceful_shutdown_timeout_s": max(1.0, settings.server.shutdown_grace_s),
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
    global _started
    connected = not ray.is_initialized()
    local_ray = connected and settings.cluster.ray_address is None
    connect(settings)
    serve_running = _get_global_client(raise_if_no_controller_running=False) is not None
    _started = Started(connected=connected, local_ray=local_ray, serve=not serve_running)
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
    """Undo what `start` did, and only that (the module doc)."""
    global _started
    started, _started = _started, None
    if started is None:
        return
    # listed now: after ray.shutdown() the raylet's children are orphans, no longer ours
    ours = _descendants() if started.local_ray else []
    try:
        # the application first, while the proxy still carries the streams in flight:
        # each replica waits for its own to end (graceful_shutdown_timeout_s)
        serve.delete(APP_NAME)
        if started.serve:
            serve.shutdown()  # ours: the controller and the proxy too
    finally:
        if started.connected:
            ray.shutdown()  # a local Ray: stopped; a joined cluster: disconnected
        if ours:
            _end_leftovers(ours)


def _descendants() -> list[psutil.Process]:
    """This process's descendants that are Ray's (raylet, gcs_server, ray::... workers)."""
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if _is_ray(p)]


def _is_ray(process: psutil.Process) -> bool:
    try:
        return any("ray" in part for part in process.cmdline()[:2])
    except psutil.Error:
        return False


def _end_leftovers(processes: list[psutil.Process]) -> None:
    """End those of `processes` still running after ray.shutdown() (one log line)."""
    alive = [p for p in processes if _running(p)]
    if not alive:
        return
    names = sorted({_name(p) for p in alive})
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(alive, timeout=LEFTOVER_TERM_WAIT_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=LEFTOVER_TERM_WAIT_S)
    logger.warning(
        "ended %d Ray process(es) left after its shutdown (%s; %d needed SIGKILL)",
        len(names),
        ", ".join(names),
        len(alive),
    )


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()[:1]) or process.name()
    except psutil.Error:
        return str(process.pid)


def serve_forever(settings: Settings) -> int:
    stopped = threading.Event()
    # a signal before Ray is up stops at once; after ray.init the handlers are set again,
    # since Ray's own (a log line and abort, exit -6) replaced them
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        start(settings)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopped.set())
        stopped.wait()
    finally:
        stop()
    return 0
