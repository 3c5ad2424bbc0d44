"""Noticing a client that left: one watcher of an ASGI receive channel.

An HTTP or WebSocket client that goes away is reported as a message on the connection's
receive channel (`http.disconnect`, `websocket.disconnect`), and only there: a server
that reads nothing while it waits does not notice. Wherever Playhead waits on something
else with a client attached (admission's queue, the first audio, the audio streaming),
a `ClientWatch` reads that channel meanwhile:

- `gone()` reads until the client leaves, and returns then (never otherwise: race it
  against the wait, as `pipeline.admission.wait_admitted` and `unless_gone` do). Every
  other message it reads (an HTTP request's body, a WebSocket client's next messages) is
  kept, in order, for `receive()`: the reader that comes after (the framework reading the
  body, the session's receive loop) loses nothing;
- `receive()` is the channel for that reader: the kept messages first, then the
  channel's. Once the client left it answers the disconnect again, as servers do.

One reader at a time: `gone()` reads only while nobody else does (admission waits before
the body is read, the first audio and the streaming after it; a WebSocket session reads
its next message after the wait). Cancelling `gone()` loses no message: a message is kept
in the step in which the channel hands it over. It reads ahead at most `max_kept_bytes`
of messages (then it stops reading until `receive()` takes them: a client sending a
large body while it waits is not buffered whole; its disconnect is then seen late).

`client_watch(scope, receive)` is the one watch of an HTTP request: installed in its
scope by the first caller (app/admission_gate.py for POST /v1/audio/speech), found there
by the route and the response.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive, Scope

WATCH_KEY = "playhead.client_watch"  # the scope key of an HTTP request's ClientWatch

T = TypeVar("T")


def _size_bytes(message: Message) -> int:
    body = message.get("body") or message.get("bytes") or b""
    text = message.get("text") or ""
    return len(body) + len(text)


class ClientWatch:
    """One connection's receive channel, read by one reader at a time (module doc)."""

    def __init__(
        self,
        receive: Receive,
        *,
        disconnect_type: str = "http.disconnect",
        max_kept_bytes: int | None = None,
    ) -> None:
        self._receive = receive
        self._disconnect_type = disconnect_type
        self._max_kept_bytes = max_kept_bytes
        self._kept: deque[Message] = deque()
        self._kept_bytes = 0
        self._left: Message | None = None  # the disconnect message, once read
        self._taken = asyncio.Event()  # receive() took kept messages: room to read ahead

    @property
    def left(self) -> bool:
        """The client's disconnect was read."""
        return self._left is not None

    async def receive(self) -> Message:
        """The next message: the kept ones first, then the channel's."""
        if self._kept:
            message = self._kept.popleft()
            self._kept_bytes -= _size_bytes(message)
            self._taken.set()
            return message
        if self._left is not None:
            return self._left
        return self._note(await self._receive())

    async def gone(self) -> None:
        """Return once the client leaves; keep every other message for `receive()`."""
        while self._left is None:
            limit = self._max_kept_bytes
            if limit is not None and self._kept_bytes >= limit:
                self._taken.clear()
                await self._taken.wait()  # read ahead enough: wait for the reader
                continue
            message = self._note(await self._receive())
            if self._left is None:
                self._kept.append(message)
                self._kept_bytes += _size_bytes(message)

    async def unless_gone(self, awaitable: Awaitable[T]) -> T:
        """`await awaitable` unless the client leaves first: then it is cancelled and
        ClientDisconnect raised (also when both ended at once). Its errors propagate as
        they are."""
        if self._left is not None:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise ClientDisconnect()
        task = asyncio.ensure_future(awaitable)
        watcher = asyncio.ensure_future(self.gone())
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, watcher, return_exceptions=True)
        if self._left is not None:
            raise ClientDisconnect()
        return task.result()

    def _note(self, message: Message) -> Message:
        if message["type"] == self._disconnect_type:
            self._left = message
        return message


def client_watch(scope: Scope, receive: Receive) -> ClientWatch:
    """The HTTP request's watch: the one in its scope, else a new one over `receive`."""
    watch = scope.get(WATCH_KEY)
    if watch is None:
        watch = scope[WATCH_KEY] = ClientWatch(receive)
    return watch
