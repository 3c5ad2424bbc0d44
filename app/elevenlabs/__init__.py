"""ElevenLabs' text-to-speech API, served by Playhead (docs/elevenlabs.md): the HTTP
routes (app/elevenlabs/http.py) and the sockets (app/elevenlabs/sockets.py), on the same
engine and admission as every other route.

`install(app)` adds the routes; `ERROR_SHAPE` is the 401 of app/security.py in ElevenLabs'
shape for its paths and its `xi-api-key` header. Include before app/routes.py's router:
GET /v1/models answers both APIs (app/elevenlabs/http.py says how).
"""

from __future__ import annotations

from fastapi import FastAPI

from app.elevenlabs import errors
from app.elevenlabs.http import router as http_router
from app.elevenlabs.sockets import router as socket_router
from app.security import ErrorShape

ERROR_SHAPE = ErrorShape(
    path_prefixes=("/v1/text-to-speech/", "/v1/voices", "/v2/voices"),
    key_header="xi-api-key",
    render=errors.error_response,
)


def install(app: FastAPI) -> None:
    app.include_router(http_router)
    app.include_router(socket_router)
