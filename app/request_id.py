"""`x-request-id` on every response, as OpenAI sends it (clients log it; the SDK exposes it
as `response.request_id`).

A route that has an id of its own sets the header itself: the speech route sends the
engine stream's id, the id in the engine's log line for that stream ("stream <id> done
..."). Every other response, errors included, gets a fresh id here.
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
_HEADER = REQUEST_ID_HEADER.encode()


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex


class RequestIdMiddleware:
    """Adds `x-request-id` to each HTTP response that does not carry one already."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == _HEADER for name, _ in headers):
                    headers.append((_HEADER, new_request_id().encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
