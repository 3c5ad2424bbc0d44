"""The composition root: `create_app(settings)` builds the FastAPI app.

It picks the backend factory, creates the AppState (app/state.py: settings, metrics, the
engine and the model's loading), installs the error handlers (app/errors.py) and the routes
(app/routes.py; the WebSocket and the page at / in app/ws/). Nothing imports this module
but the command line and tests.
"""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI

from app import __version__
from app.errors import install_error_handlers
from app.request_id import RequestIdMiddleware
from app.routes import open_router, v1_router
from app.settings import Settings
from app.state import AppState, BackendFactory, attach_state
from app.ws.route import install as install_websocket
from pipeline import build_backend

__all__ = ["AppState", "BackendFactory", "create_app"]


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
        codec_lm=settings.codec_lm,
    )
    state = AppState(settings, factory)
    app = FastAPI(
        title="Playhead",
        version=__version__,
        summary="Streaming text-to-speech, scheduled by playback deadline",
        lifespan=state.lifespan,
    )
    attach_state(app, state)
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    app.include_router(v1_router)
    app.include_router(open_router)
    install_websocket(app)
    return app
