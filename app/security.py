"""Who may call what: the API key on every route but /health and /ready, and CORS.

`check_api_key` compares the key in constant time (both sides hashed first, so neither
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
from collections.abc import Callable, Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import ApiError, Unauthorized, error_response

ALWAYS_OPEN_PATHS = frozenset({"/health", "/ready"})
# Headers that carry the key itself (no scheme), as some protocols' clients send it
# (Cartesia's: X-API-Key); `Authorization: Bearer` wins when both come.
KEY_HEADERS = ("x-api-key",)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def check_api_key(expected: str | None, authorization: str | None) -> None:
    """Raises Unauthorized unless `authorization` is `Bearer <expected>` (or no key is set)."""
    if expected is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if not authorization or scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "You didn't provide an API key. Provide it in an Authorization header using "
            "Bearer auth (Authorization: Bearer YOUR_KEY).",
            code="missing_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(_digest(token.strip()), _digest(expected)):
        raise Unauthorized(
            "Incorrect API key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def presented_authorization(headers: Headers) -> str | None:
    """The request's `Authorization`, else `Bearer <key>` from the first KEY_HEADERS."""
    authorization = headers.get("authorization")
    if authorization is None:
        key = next((headers[name] for name in KEY_HEADERS if name in headers), None)
        if key is not None:
            return f"Bearer {key}"
    return authorization


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
    """401 with the envelope for an HTTP request without the key (see the module doc);
    `error_renderers` answers it in a protocol's own shape under a path prefix."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        public_routes: tuple[str, ...],
        error_renderers: Mapping[str, Callable[[ApiError], ASGIApp]] | None = None,
    ) -> None:
        self.app = app
        self._api_key = api_key
        self._public = frozenset(public_routes)
        self._renderers = dict(error_renderers or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._api_key is not None:
            path = scope["path"]
            if path not in ALWAYS_OPEN_PATHS and route_group(path) not in self._public:
                try:
                    check_api_key(self._api_key, presented_authorization(Headers(scope=scope)))
                except Unauthorized as exc:
                    render = next(
                        (r for prefix, r in self._renderers.items() if path.startswith(prefix)),
                        error_response,
                    )
                    await render(exc)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
