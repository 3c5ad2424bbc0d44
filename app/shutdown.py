"""Graceful shutdown: SIGTERM drains the server instead of cutting it.

uvicorn, on SIGTERM, closes its listening socket at once (new clients are refused, not
answered), gives open connections `timeout_graceful_shutdown` seconds, cancels the rest
with a traceback each, and re-raises the signal so that the process ends by it.
`GracefulServer` changes the first SIGTERM into a drain:

1. admission stops: every new HTTP request but /health gets 503 `shutting_down` with
   Retry-After (`DrainMiddleware`; /ready too, so a load balancer stops routing here),
   and a new WebSocket is refused the same way;
2. streams in flight go on until they end or `server.shutdown_grace_s` passes;
3. the streams still running are cancelled (an SSE body ends with an error event, an
   audio body is cut, a WebSocket gets an error event), one log line each;
4. uvicorn then shuts down as usual (its connections are idle by now), the engine stops,
   and the process exits 0.

A second SIGTERM, or SIGINT (Ctrl-C), skips what is left of the grace.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import shutting_down_error
from app.security import ErrorShape, render_for

if TYPE_CHECKING:
    from app.state import AppState

logger = logging.getLogger("playhead.app")

DRAIN_POLL_S = 0.05


class DrainMiddleware:
    """While the app drains, every HTTP request but /health gets 503 with Retry-After, in
    the shape of the protocol it belongs to (`error_shapes`, as app/security.py's 401)."""

    def __init__(
        self, app: ASGIApp, *, state: AppState, error_shapes: Sequence[ErrorShape] = ()
    ) -> None:
        self.app = app
        self._state = state
        self._shapes = tuple(error_shapes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        if scope["type"] == "http" and state.draining and scope["path"] != "/health":
            render = render_for(self._shapes, scope["path"], Headers(scope=scope))
            await render(shutting_down_error(state.drain_left_s()))(scope, receive, send)
            return
        await self.app(scope, receive, send)


class GracefulServer(uvicorn.Server):
    """uvicorn's Server with a draining SIGTERM (see the module doc)."""

    def __init__(self, config: uvicorn.Config, state: AppState | None) -> None:
        """`state` None (an app not built by create_app): uvicorn's own SIGTERM."""
        super().__init__(config)
        self._state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._draining = False

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state, loop = self._state, self._loop
        if sig != signal.SIGTERM or state is None or loop is None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        # not recorded as a captured signal: uvicorn would raise it again at exit
        if self._draining:  # a second SIGTERM: stop waiting
            loop.call_soon_threadsafe(state.end_drain_now)
        else:
            self._draining = True
            loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        assert self._state is not None
        try:
            await self._state.drain(self._state.settings.server.shutdown_grace_s)
        except Exception:
            logger.exception("draining failed; shutting down")
        finally:
            self.should_exit = True
