"""WS /tts/websocket: checks the version, the API key and the engine before the socket is
accepted (a refusal is an HTTP response with Cartesia's error body, which every client
surfaces as a failed connection), then hands it to a CartesiaSocket (app/cartesia/ws.py)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, WebSocket

from app.cartesia.http import error_json
from app.cartesia.schema import CartesiaError, check_version
from app.cartesia.speech import check_key
from app.cartesia.ws import CLOSE_POLICY, CartesiaSocket

ws_router = APIRouter()
_DENIAL = "websocket.http.response"


@ws_router.websocket("/tts/websocket")
async def tts_websocket(websocket: WebSocket) -> None:
    state = websocket.app.state.playhead
    try:
        check_version(
            websocket.headers.get("cartesia-version")
            or websocket.query_params.get("cartesia_version")
        )
        check_key(
            state.settings.server.api_key,
            websocket.headers,
            websocket.query_params.get("api_key"),
        )
        engine = state.ready_engine
        if engine is None:
            message = state.not_ready_error().message
            raise CartesiaError(message, error_code="not_ready", status_code=503)
    except CartesiaError as exc:
        await _refuse(websocket, exc)
        return
    await websocket.accept()
    await CartesiaSocket(websocket, engine, state.settings, state.metrics).run()


async def _refuse(websocket: WebSocket, error: CartesiaError) -> None:
    """An HTTP answer to the handshake where the server can send one, else an error
    message on the accepted socket and a close."""
    request_id = str(uuid.uuid4())
    if _DENIAL in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_json(error, request_id))
        return
    await websocket.accept()
    await websocket.send_json(error.event(request_id, None))
    await websocket.close(CLOSE_POLICY)
