"""Cartesia's API, as its clients call it (docs/cartesia.md): POST /tts/bytes, POST
/tts/sse, WS /tts/websocket and GET /voices, on the same engine as Playhead's own API.

`install(app)` adds the routes; `ERROR_SHAPE` gives app/security.py's 401 Cartesia's
shape under these paths (and for a request whose key came as X-API-Key).
"""

from __future__ import annotations

from app.cartesia.http import cartesia_router, render_api_error
from app.cartesia.route import ws_router
from app.security import ErrorShape

ERROR_SHAPE = ErrorShape(("/tts/", "/voices"), "x-api-key", render_api_error)


def install(app: object) -> None:
    app.include_router(cartesia_router)  # type: ignore[attr-defined]
    app.include_router(ws_router)  # type: ignore[attr-defined]


__all__ = ["ERROR_SHAPE", "install"]
