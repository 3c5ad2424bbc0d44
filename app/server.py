"""The composition root: `create_app(settings)` builds the FastAPI app.

It picks the backend factory, creates the AppState (app/state.py: settings, metrics, the
engine and the model's loading), installs the error handlers (app/errors.py), the
middleware (x-request-id, CORS when configured, the shutdown drain of app/shutdown.py, the
API key of app/security.py, the speech route's admission of app/admission_gate.py) and the
routes (app/routes.py; the WebSocket and the page at / in app/ws/; ElevenLabs' API in
app/elevenlabs/, Cartesia's in app/cartesia/), and the Wyoming server (app/wyoming/) when
`wyoming.enabled`. Nothing imports this module but the command line and tests.
"""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from app import __version__, cartesia, elevenlabs
from app.admission_gate import AdmissionGate
from app.errors import install_error_handlers
from app.jobs.install import install as install_jobs
from app.request_id import RequestIdMiddleware
from app.routes import open_router, v1_router
from app.security import AccessMiddleware
from app.settings import Settings
from app.shutdown import DrainMiddleware
from app.state import AppState, BackendFactory, attach_state
from app.ws.route import install as install_websocket
from app.wyoming.server import WyomingServer
from pipeline import build_backend

# The 401 and the drain's 503 in each client protocol's own shape under its paths
ERROR_SHAPES = (elevenlabs.ERROR_SHAPE, cartesia.ERROR_SHAPE)

__all__ = ["AppState", "BackendFactory", "create_app"]


def create_app(settings: Settings, *, backend_factory: BackendFactory | None = None) -> FastAPI:
    """The Playhead app. `backend_factory` replaces `pipeline.build_backend(settings...)`
    (tests use it to wrap or delay a backend); it runs in a worker thread."""
    factory = backend_factory or partial(
        build_backend,
        settings.backend,
        settings.backend_config(),
        talker=settings.talker,
        vocoder=settings.vocoder,
        sections=settings.backend_sections(),
    )
    state = AppState(settings, factory)
    if settings.wyoming.enabled:
        state.services.append(WyomingServer(state))
    server = settings.server
    app = FastAPI(
        title="Playhead",
        version=__version__,
        summary="Streaming text-to-speech, scheduled by playback deadline",
        lifespan=state.lifespan,
        # /docs and /redoc would load their scripts from a CDN: never served
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if server.openapi else None,
    )
    attach_state(app, state)
    install_error_handlers(app)
    # the last added runs first: request id, CORS, drain (503), the API key, then
    # admission for the speech route (app/admission_gate.py: 429 before FastAPI's work)
    app.add_middleware(AdmissionGate, state=state)
    app.add_middleware(
        AccessMiddleware,
        api_key=server.api_key,
        public_routes=server.public_routes,
        error_shapes=ERROR_SHAPES,
    )
    app.add_middleware(DrainMiddleware, state=state, error_shapes=ERROR_SHAPES)
    if server.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(server.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "xi-api-key",
                "X-API-Key",
                "Cartesia-Version",
            ],
            expose_headers=["x-request-id", "X-Playhead-Stream-Id", "Retry-After", "Server-Timing"],
        )
    app.add_middleware(RequestIdMiddleware)
    elevenlabs.install(app)  # first: GET /v1/models answers both APIs
    app.include_router(v1_router)
    app.include_router(open_router)
    install_websocket(app)
    cartesia.install(app)  # Cartesia's API (docs/cartesia.md)
    install_jobs(app, state)  # long texts as jobs (docs/jobs.md)
    return app
