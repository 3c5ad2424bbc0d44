"""What the routes share, and how the model gets loaded.

`AppState` holds the settings, the metrics and, once the backend is built, the engine. Its
`lifespan` starts loading the model in a worker thread and returns at once, so the server
answers /health (and 503 on everything that needs the model) while a voice loads; when the
backend is built, the Engine is created and started. At shutdown the engine is stopped and
the backend closed. Its `services` (the Wyoming server, app/wyoming/) are opened before
the model loads and closed before the engine stops.

Routes reach the state through `get_state` (a FastAPI dependency, or called with the
request), never through the module that builds the app (app/server.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Annotated, Protocol

from fastapi import Depends, FastAPI, Request

from app.errors import ServiceUnavailable, shutting_down_error
from app.metrics import Metrics
from app.settings import Settings
from app.streaming import EncoderThreads
from pipeline import Backend, Engine

logger = logging.getLogger("playhead.app")

BackendFactory = Callable[[], Backend]


class Service(Protocol):
    """Something served beside the HTTP routes over the same engine (the Wyoming server,
    app/wyoming/): `open` at startup, before the model loads (an error fails the
    startup), `close` at shutdown, before the engine stops. `bind` (the CLI, before the
    server starts) takes its port at once: OSError with a sentence if it cannot."""

    def bind(self) -> None: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...


# The attribute of `app.state` that holds the AppState.
STATE_ATTRIBUTE = "playhead"


class AppState:
    """Settings, metrics and, once loaded, the engine (and through it the backend)."""

    def __init__(self, settings: Settings, backend_factory: BackendFactory) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.created_s = int(time.time())
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self._backend_factory = backend_factory
        self._loaded: asyncio.Event | None = None
        self._froze_heap = False
        # the encoders' own threads (app/streaming.py)
        self.encoder_threads = EncoderThreads(settings.encoding.encoder_threads)
        # set by a graceful shutdown (app/shutdown.py): new requests get 503
        self._drain_deadline_s: float | None = None
        self._drain_now: asyncio.Event | None = None
        self.services: list[Service] = []  # opened and closed by the lifespan

    @property
    def backend(self) -> Backend | None:
        """The loaded backend (None while loading, after a failure, or after shutdown)."""
        return self.engine.backend if self.engine is not None else None

    @property
    def ready_engine(self) -> Engine | None:
        """The engine when it is loaded and its loops run, else None: the one readiness test."""
        engine = self.engine
        if self._drain_deadline_s is not None:
            return None
        return engine if engine is not None and engine.ready else None

    @property
    def ready(self) -> bool:
        return self.ready_engine is not None

    def not_ready_error(self) -> ServiceUnavailable:
        """Why there is no engine to serve with: loading, failed to load, shutting down, or
        stopped."""
        if self._drain_deadline_s is not None:
            return shutting_down_error(self.drain_left_s())
        if self.load_error is not None:
            return ServiceUnavailable(
                f"The model failed to load: {self.load_error}", code="model_load_failed"
            )
        if self.engine is None:
            return ServiceUnavailable(
                "The model is loading; retry shortly.",
                code="model_loading",
                headers={"Retry-After": "1"},
            )
        return ServiceUnavailable("The engine is not running.", code="engine_not_ready")

    def require_engine(self) -> Engine:
        """The engine, or ServiceUnavailable (503) while loading or when it stopped."""
        engine = self.ready_engine
        if engine is None:
            raise self.not_ready_error()
        return engine

    async def wait_loaded(self) -> None:
        """Returns once loading ended (ready, or failed: see load_error)."""
        if self._loaded is None:
            raise RuntimeError("the app's lifespan has not started")
        await self._loaded.wait()

    async def _build_backend(self) -> Backend:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self._backend_factory)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # A thread cannot be interrupted: close what it builds once it is done.
            future.add_done_callback(_close_built_backend)
            raise

    async def load(self) -> None:
        assert self._loaded is not None
        started_s = time.monotonic()
        backend: Backend | None = None
        try:
            backend = await self._build_backend()
            s = self.settings
            engine = Engine(
                backend,
                scheduling=s.scheduling,
                chunking=s.chunking,
                admission=s.admission,
                engine=s.engine,
                talker=s.talker,
                text=s.text,
                vocoder=s.vocoder,
                alone=s.alone,
                events=self.metrics,
            )
            await engine.start()
            self.engine = engine
            if s.server.freeze_heap_after_load:
                self._freeze_heap()
            self.metrics.watch_gc()
            logger.info(
                "ready: backend %s, %d voice(s), loaded in %.1f s",
                backend.name,
                len(backend.voices()),
                time.monotonic() - started_s,
            )
        except asyncio.CancelledError:
            if backend is not None and self.engine is None:
                backend.close()
            raise
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            logger.exception("loading the model failed")
            if backend is not None:
                backend.close()
        finally:
            self._loaded.set()

    @property
    def draining(self) -> bool:
        """Whether a graceful shutdown began: admission is closed."""
        return self._drain_deadline_s is not None

    def drain_left_s(self) -> float:
        """Seconds of the shutdown grace left (0 when not draining)."""
        if self._drain_deadline_s is None:
            return 0.0
        return max(0.0, self._drain_deadline_s - time.monotonic())

    def end_drain_now(self) -> None:
        """Skip what is left of the grace (a second SIGTERM)."""
        if self._drain_now is not None:
            self._drain_now.set()

    async def drain(self, grace_s: float) -> None:
        """Close admission, let the streams in flight end for up to `grace_s`, then cancel
        the rest (app/shutdown.py)."""
        self._drain_deadline_s = time.monotonic() + grace_s
        self._drain_now = asyncio.Event()
        engine = self.engine
        in_flight = engine.in_flight if engine is not None else 0
        logger.info(
            "shutting down: admission closed, %d stream(s) in flight, grace %.1f s",
            in_flight,
            grace_s,
        )
        if engine is None:
            return
        engine.close_admission()
        waited = asyncio.ensure_future(engine.wait_idle())
        now = asyncio.ensure_future(self._drain_now.wait())
        try:
            await asyncio.wait({waited, now}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waited.cancel()
            now.cancel()
        left = engine.in_flight
        if left:
            logger.info("shutdown grace over: cancelling %d stream(s)", left)
            engine.cancel_all()
            # their responses end (an SSE error event, a cut body) before uvicorn closes
            await asyncio.sleep(0.2)

    def _freeze_heap(self) -> None:
        """Leave the startup heap out of every later collection (see
        ServerConfig.freeze_heap_after_load); `shutdown` gives it back."""
        gc.collect()  # garbage is freed first, not kept for good
        before = gc.get_freeze_count()
        gc.freeze()
        self._froze_heap = True
        logger.info(
            "froze %d objects alive after loading: full collections skip them",
            gc.get_freeze_count() - before,
        )

    async def shutdown(self) -> None:
        self.metrics.unwatch_gc()
        if self._froze_heap:
            # what was frozen may be garbage now (the engine, the model): collectable again
            gc.unfreeze()
            self._froze_heap = False
        self.encoder_threads.close()
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                await engine.stop()
            finally:
                engine.backend.close()

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self._loaded = asyncio.Event()
        opened: list[Service] = []
        try:
            for service in self.services:
                await service.open()
                opened.append(service)
            load_task = asyncio.create_task(self.load(), name="playhead-load")
        except BaseException:
            for service in reversed(opened):
                await service.close()
            raise
        try:
            yield
        finally:
            load_task.cancel()
            with suppress(asyncio.CancelledError):
                await load_task
            for service in reversed(opened):
                await service.close()
            await self.shutdown()


def _close_built_backend(future: asyncio.Future[Backend]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def attach_state(app: FastAPI, state: AppState) -> None:
    setattr(app.state, STATE_ATTRIBUTE, state)


def find_app_state(app: object) -> AppState | None:
    """The AppState of an app built by app.server.create_app, else None."""
    state = getattr(getattr(app, "state", None), STATE_ATTRIBUTE, None)
    return state if isinstance(state, AppState) else None


def get_state(request: Request) -> AppState:
    """The app's AppState (a FastAPI dependency; also callable with any request)."""
    state = getattr(request.app.state, STATE_ATTRIBUTE, None)
    if not isinstance(state, AppState):
        raise RuntimeError("the app has no AppState: build it with app.server.create_app")
    return state


async def _state_dependency(request: Request) -> AppState:
    """`get_state` as a coroutine: FastAPI runs a plain-function dependency in a worker
    thread, a hop there and back on every request while the stages hold the cores."""
    return get_state(request)


# `state: StateDep` in a route's signature injects the AppState.
StateDep = Annotated[AppState, Depends(_state_dependency)]
