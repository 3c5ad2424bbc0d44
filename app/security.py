"""Who may call what: the API key on every route but /health and /ready, and CORS.

The key may come in any header of `CREDENTIAL_HEADERS` (OpenAI's clients send
`Authorization: Bearer <key>`, ElevenLabs' `xi-api-key: <key>`, Cartesia's
`X-API-Key: <key>`); the first that carries a key is the one checked. A refusal (401) is
in the envelope of the protocol the request speaks: an `ErrorShape` (a protocol's paths and key
header, and its renderer) given to
`AccessMiddleware`, else OpenAI's.

`check_credentials` compares the key in constant time (both sides hashed first, so neither
the content nor the length of the key shows in the time taken). `AccessMiddleware` asks
for it on every HTTP request except /health, /ready and the routes the operator opened
with `server.public_routes` (metrics, openapi, page); an unknown path needs the key too,
so the API's surface is not probed without one. The WebSocket route checks the key itself
(a browser cannot set headers on a socket: it may come as ?api_key=).

CORS is off unless `server.cors_origins` lists origins (app/server.py adds Starlette's
CORSMiddleware then).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import ApiError, Unauthorized, error_response

ALWAYS_OPEN_PATHS = frozenset({"/health", "/ready"})


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _bearer_token(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


# header (lower case) -> the key in its value ("" when the value carries none)
CREDENTIAL_HEADERS: Mapping[str, Callable[[str], str]] = {
    "authorization": _bearer_token,
    "xi-api-key": str.strip,
    "x-api-key": str.strip,  # Cartesia's clients
}


def check_credentials(expected: str | None, headers: Mapping[str, str]) -> None:
    """Raises Unauthorized unless the first credential header that carries a key carries
    `expected` (or no key is set)."""
    if expected is None:
        return
    presented = next(
        (
            key
            for name, read in CREDENTIAL_HEADERS.items()
            if name in headers and (key := read(headers[name]))
        ),
        "",
    )
    if not presented:
        raise Unauthorized(
            "You didn't provide an API key. Provide it in an Authorization header using "
            "Bearer auth (Authorization: Bearer YOUR_KEY), or in an xi-api-key or X-API-Key "
            "header.",
            code="missing_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(_digest(presented), _digest(expected)):
        raise Unauthorized(
            "Incorrect API key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def check_api_key(expected: str | None, authorization: str | None) -> None:
    """Raises Unauthorized unless `authorization` is `Bearer <expected>` (or no key is set)."""
    check_credentials(expected, {} if authorization is None else {"authorization": authorization})


@dataclass(frozen=True)
class ErrorShape:
    """A client protocol's own 401: for its paths, or for a request whose key came in its
    clients' header."""

    path_prefixes: tuple[str, ...]
    key_header: str
    render: Callable[[ApiError], Response]

    def applies(self, path: str, headers: Headers) -> bool:
        return path.startswith(self.path_prefixes) or self.key_header in headers


def render_for(
    shapes: Sequence[ErrorShape], path: str, headers: Headers
) -> Callable[[ApiError], Response]:
    """How to answer an app-level error (the 401 here, the drain's 503) for this request:
    in the shape of the client protocol it belongs to, else OpenAI's envelope."""
    shape = next((s for s in shapes if s.applies(path, headers)), None)
    return error_response if shape is None else shape.render


def route_group(path: str) -> str | None:
    """The `server.public_routes` name a path belongs to, if any."""
    if path == "/metrics":
        return "metrics"
    if path == "/openapi.json":
        return "openapi"
    if path == "/" or path == "/static" or path.startswith("/static/"):
        return "page"
    return None


class AccessMiddleware:
    """401 with the envelope for an HTTP request without the key (see the module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        public_routes: tuple[str, ...],
        error_shapes: Sequence[ErrorShape] = (),
    ) -> None:
        self.app = app
        self._api_key = api_key
        self._public = frozenset(public_routes)
        self._shapes = tuple(error_shapes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._api_key is not None:
            path = scope["path"]
            if path not in ALWAYS_OPEN_PATHS and route_group(path) not in self._public:
                headers = Headers(scope=scope)
                try:
                    check_credentials(self._api_key, headers)
                except Unauthorized as exc:
                    render = render_for(self._shapes, path, headers)
                    await render(exc)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
