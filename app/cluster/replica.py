"""The Playhead replica: a Ray Serve deployment that is itself the HTTP ingress.

Each replica builds the same FastAPI app as `playhead serve` (app/server.py create_app):
its own backend (model), Engine and scheduler, loaded in the background by the app's
lifespan, which Ray Serve runs in the replica. Ray's HTTP proxy routes each request to one
replica through the deployment's request router (SlackRouter, app/cluster/router.py) and
streams the replica's ASGI messages back as they come: the audio goes out chunk by chunk,
one hop (proxy -> replica) between the client and the engine. A front deployment in
between would add a second hop for no gain, since the proxy already runs our router.

On top of the single-process app: `record_routing_stats` (what the routers rank by),
`check_health` (a replica whose model failed to load or whose engine stopped is replaced
by Ray), an `X-Playhead-Replica` header on every response, and /ready reporting the
replicas. Everything else (speech in every format and SSE, listings, /metrics of this
replica) is the app's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from starlette.types import Message, Receive, Scope, Send

from app.cluster.stats import routing_stats
from app.settings import Settings
from scheduling import Admission

logger = logging.getLogger("playhead.cluster")

APP_NAME = "playhead"
DEPLOYMENT_NAME = "Playhead"
REPLICA_HEADER = "X-Playhead-Replica"


def cluster_replicas() -> dict[str, Any]:
    """The deployment's replica counts from Ray Serve's controller (blocking: a thread)."""
    status = serve.status()
    app = status.applications.get(APP_NAME)
    if app is None:
        return {"running": 0, "states": {}, "app_status": "missing"}
    deployment = app.deployments.get(DEPLOYMENT_NAME)
    states = {str(k): v for k, v in (deployment.replica_states if deployment else {}).items()}
    return {"running": states.get("RUNNING", 0), "states": states, "app_status": str(app.status)}


@serve.deployment
@serve.ingress()
class PlayheadReplica:
    """One Playhead engine; see the module doc. Built by app/cluster/launch.py."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = Settings.model_validate(settings)
        self._admission = Admission(self._settings.admission)
        self._first_chunk_s = self._settings.scheduling.first_chunk_ms / 1000.0
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._app: FastAPI | None = None
        self._ingress: _NameReplica | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        from app.server import create_app

        app = create_app(self._settings)
        _replace_ready(app, self._replica_id, self._settings.cluster.replicas)
        self._app = app
        self._ingress = _NameReplica(app, self._replica_id)
        return self._ingress

    @property
    def _state(self) -> Any:
        return None if self._app is None else self._app.state.playhead

    def record_routing_stats(self) -> dict[str, Any]:
        state = self._state
        engine = None if state is None else state.ready_engine
        received = 0 if self._ingress is None else self._ingress.received
        return routing_stats(
            engine, self._admission, time.monotonic(), self._first_chunk_s, received
        )

    def check_health(self) -> None:
        state = self._state
        if state is None:
            return
        if state.load_error is not None:
            raise RuntimeError(f"the model failed to load: {state.load_error}")
        if state.engine is not None and not state.engine.ready:
            raise RuntimeError("the engine stopped")


class _NameReplica:
    """ASGI wrapper adding the replica header to every HTTP response (a plain ASGI layer:
    Starlette's BaseHTTPMiddleware would re-buffer streamed bodies through a queue), and
    counting the HTTP requests received: the router compares it with what it sent."""

    def __init__(self, app: FastAPI, replica_id: str) -> None:
        self.app = app
        self._header = (REPLICA_HEADER.lower().encode(), replica_id.encode())
        self.received = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.received += 1

        async def named_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self._header]}
            await send(message)

        await self.app(scope, receive, named_send)


def _replace_ready(app: FastAPI, replica_id: str, target: int) -> None:
    """/ready in a cluster: this replica's readiness and the deployment's replica counts."""

    @app.get("/ready", response_model=None)
    async def ready(request: Request) -> JSONResponse:
        state = request.app.state.playhead
        if not state.ready:
            raise state.not_ready_error()
        try:
            replicas = await asyncio.to_thread(cluster_replicas)
        except Exception as exc:  # the controller is unreachable: say so, do not fail
            logger.warning("serve.status() failed: %s", exc)
            replicas = {"running": None, "states": {}, "app_status": "unknown"}
        replicas["target"] = target
        return JSONResponse({"status": "ready", "replica": replica_id, "replicas": replicas})

    # Matched before the app's own /ready (routes are tried in order).
    app.router.routes.insert(0, app.router.routes.pop())
