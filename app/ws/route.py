"""WS /v1/audio/speech/stream: accepts the socket, checks the API key and the engine, and
hands the socket to a Session (app/ws/session.py). Also serves the page (app/static/) at /.

`install(app)` adds both to the app."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, FastAPI, WebSocket
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from app.errors import ApiError
from app.security import check_api_key
from app.ws.protocol import CLOSE_POLICY, CLOSE_SERVER_ERROR, error_event
from app.ws.session import Session

logger = logging.getLogger("playhead.ws")

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

ws_router = APIRouter()


def install(app: FastAPI) -> None:
    """The socket route, the page at / and its files under /static/."""
    app.include_router(ws_router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


@ws_router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@ws_router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket) -> None:
    state = websocket.app.state.playhead
    await websocket.accept()
    # Browsers cannot set headers on a WebSocket: the key may also come as ?api_key=.
    authorization = websocket.headers.get("authorization")
    query_key = websocket.query_params.get("api_key")
    if authorization is None and query_key is not None:
        authorization = f"Bearer {query_key}"
    try:
        check_api_key(state.settings.server.api_key, authorization)
    except ApiError as exc:
        await _refuse(websocket, exc, CLOSE_POLICY)
        return
    engine = state.ready_engine
    if engine is None:
        await _refuse(websocket, state.not_ready_error(), CLOSE_SERVER_ERROR)
        return
    await Session(websocket, engine, state.settings).run()


async def _refuse(websocket: WebSocket, exc: ApiError, close_code: int) -> None:
    event = error_event(exc.message, code=exc.code, param=exc.param, error_type=exc.error_type)
    await websocket.send_json(event)
    await websocket.close(close_code)
