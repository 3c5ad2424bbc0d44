"""The FastAPI app: `create_app(settings)`.

The lifespan starts loading the model in a worker thread and returns at once, so the
server answers /health (and 503 on everything that needs the model) while a voice loads;
when the backend is built, the Engine is created and started. At shutdown the engine is
stopped and the backend closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from functools import partial

from fastapi import FastAPI

from app import __version__
from app.errors import ServiceUnavailable, install_error_handlers
from app.metrics import Metrics
from app.request_id import RequestIdMiddleware
from app.routes import open_router, v1_router
from app.settings import Settings
from pipeline import Backend, Engine, build_backend

logger = logging.getLogger("playhead.app")

BackendFactory = Callable[[], Backend]


class AppState:
    """What the routes share: settings, metrics and, once loaded, the engine."""

    def __init__(self, settings: Settings, backend_factory: BackendFactory) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.created_s = int(time.time())
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self._backend_factory = backend_factory
        self._loaded: asyncio.Event | None = None

    @property
    def ready_engine(self) -> Engine | None:
        """The engine when it is loaded and its loops run, else None: the one readiness test."""
        engine = self.engine
        return engine if engine is not None and engine.ready else None

    @property
    def ready(self) -> bool:
        return self.ready_engine is not None

    def not_ready_error(self) -> ServiceUnavailable:
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
                events=self.metrics,
            )
            await engine.start()
            self.engine = engine
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

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            try:
                await engine.stop()
            finally:
                engine.backend.close()

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self._loaded = asyncio.Event()
        load_task = asyncio.create_task(self.load(), name="playhead-load")
        try:
            yield
        finally:
            load_task.cancel()
            with suppress(asyncio.CancelledError):
                await load_task
            await self.shutdown()


def _close_built_backend(future: asyncio.Future[Backend]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def create_app(settings: Settings, *, backend_factory: BackendFactory | None = None) -> FastAPI:
    """The Playhead app. `backend_factory` replaces `pipeline.build_backend(settings...)`
    (tests use it to wrap or delay a backend); it runs in a worker thread."""
    factory = backend_factory or partial(
        build_backend,
        settings.backend,
        sim=settings.sim,
        piper=settings.piper,
        talker=settings.talker,
        vocoder=settings.vocoder,
    )
    state = AppState(settings, factory)
    app = FastAPI(
        title="Playhead",
        version=__version__,
        summary="Streaming text-to-speech, scheduled by playback deadline",
        lifespan=state.lifespan,
    )
    app.state.playhead = state
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(v1_router)
    app.include_router(open_router)
    return app
